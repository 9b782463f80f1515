//! NCCL collectives on the GPU: all-reduce (sum, mean, max; in and out of place), broadcast
//! and all-gather of random data in every float dtype and i32/i64, over every visible GPU
//! (one GPU makes a one-rank communicator), driven by one thread (`init_all` + `group`) and
//! by one thread per rank (`init_rank`); results against a float64 host reduction. Fault
//! cases: a rank that never joins makes `init_rank` fail after the timeout; on two GPUs a
//! rank that stops issuing collectives makes its peer's all-reduce fail with the watchdog's
//! message instead of hanging (tests named `two_gpus_*` need two GPUs and fail saying so).
//! NCCL comes from `CUDNN_BACKEND_NCCL_LIB` or the loader's path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudnn_backend::collective::{group, Communicator, ReduceOp, UniqueId};
use cudnn_backend::graph::DataType;
use cudnn_backend::{runtime, Device, Error};
use cudnn_backend_reference::SplitMix64;
use integration_tests::{download, poisoned, random, round_to, strides, DevTensor, Layout};

fn devices() -> Vec<Arc<Device>> {
    let n = runtime::device_count().expect("needs a CUDA GPU");
    assert!(n >= 1, "needs a CUDA GPU");
    (0..n).map(|i| Device::new(i).expect("device")).collect()
}

/// Relative L2 distance of `got` from `want`.
fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().max(1e-30);
    (num / den).sqrt()
}

/// Tolerance of a reduction over `ranks` values computed in `dtype`.
fn tolerance(dtype: DataType, ranks: usize) -> f64 {
    let eps = match dtype {
        DataType::F16 => 1e-3,
        DataType::BF16 => 8e-3,
        DataType::F32 => 1e-6,
        _ => 1e-12,
    };
    eps * (ranks as f64).max(1.0) * 2.0
}

fn host_reduce(inputs: &[Vec<f64>], op: ReduceOp) -> Vec<f64> {
    (0..inputs[0].len())
        .map(|i| {
            let vals = inputs.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Mean => vals.sum::<f64>() / inputs.len() as f64,
                ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                ReduceOp::Prod => vals.product(),
            }
        })
        .collect()
}

/// Random values on each rank's device (integers for integer dtypes).
fn rank_inputs(devs: &[Arc<Device>], rng: &mut SplitMix64, dims: &[i64], dtype: DataType) -> Vec<DevTensor> {
    rank_inputs_in(devs, rng, dims, Layout::Nchw, dtype)
}

/// One random tensor per rank in `layout`; integer dtypes get whole numbers in [-1000, 1000).
fn rank_inputs_in(
    devs: &[Arc<Device>],
    rng: &mut SplitMix64,
    dims: &[i64],
    layout: Layout,
    dtype: DataType,
) -> Vec<DevTensor> {
    let st = strides(dims, layout);
    devs.iter()
        .map(|d| {
            let t = random(d.stream(), rng, dims, &st, dtype);
            if matches!(dtype, DataType::I32 | DataType::I64) {
                let ints: Vec<f64> = t.values.iter().map(|v| (v * 1000.0).round()).collect();
                integration_tests::upload(d.stream(), &ints, dims, &st, dtype)
            } else {
                t
            }
        })
        .collect()
}

#[test]
#[ignore = "needs libnccl"]
fn the_library_reports_its_version_and_makes_distinct_ids() {
    let (version, path) = cudnn_backend::collective::nccl_version().expect("NCCL loads");
    assert!(version >= 21700, "NCCL {version} from {path}");
    let (a, b) = (UniqueId::new().unwrap(), UniqueId::new().unwrap());
    assert_ne!(a, b, "two ids must differ");
    assert_eq!(UniqueId::from_hex(&a.to_hex()).unwrap(), a);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_reduce_broadcast_all_gather_from_one_thread() {
    let devs = devices();
    let comms = Communicator::init_all(&devs).expect("init_all");
    let n = devs.len();
    let mut rng = SplitMix64::new(0x5eed_2001);
    let dims = [3i64, 5, 7, 11];
    for dtype in [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::F64,
        DataType::I32,
        DataType::I64,
    ] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            if matches!(dtype, DataType::I32 | DataType::I64) && op == ReduceOp::Mean {
                continue; // NCCL's integer average truncates; not a reference we model.
            }
            let inputs = rank_inputs(&devs, &mut rng, &dims, dtype);
            let outputs: Vec<DevTensor> = devs
                .iter()
                .map(|d| poisoned(d.stream(), &dims, &strides(&dims, Layout::Nchw), dtype))
                .collect();
            group(|| {
                for ((c, i), o) in comms.iter().zip(&inputs).zip(&outputs) {
                    c.all_reduce(c.device().stream(), &i.t, &o.m, op)?;
                }
                Ok(())
            })
            .expect("all_reduce");
            let want: Vec<f64> = host_reduce(&inputs.iter().map(|t| t.values.clone()).collect::<Vec<_>>(), op)
                .into_iter()
                .map(|v| round_to(dtype, v))
                .collect();
            for (rank, (d, o)) in devs.iter().zip(&outputs).enumerate() {
                let got = download(d.stream(), o);
                let err = rel_l2(&got, &want);
                assert!(
                    err <= tolerance(dtype, n),
                    "{dtype:?} {op:?} rank {rank}: rel L2 {err:e}"
                );
            }
        }
        // In place, channels-last layout on every rank.
        let bufs = rank_inputs_in(&devs, &mut rng, &dims, Layout::Nhwc, dtype);
        let want = host_reduce(
            &bufs.iter().map(|t| t.values.clone()).collect::<Vec<_>>(),
            ReduceOp::Sum,
        );
        group(|| {
            for (c, b) in comms.iter().zip(&bufs) {
                c.all_reduce(c.device().stream(), &b.t, &b.m, ReduceOp::Sum)?;
            }
            Ok(())
        })
        .expect("in-place all_reduce");
        for (d, b) in devs.iter().zip(&bufs) {
            let got = download(d.stream(), b);
            let want: Vec<f64> = want.iter().map(|&v| round_to(dtype, v)).collect();
            assert!(rel_l2(&got, &want) <= tolerance(dtype, n), "{dtype:?} in place");
        }
        // Broadcast from the last rank: every rank ends with its values exactly.
        let bufs = rank_inputs(&devs, &mut rng, &dims, dtype);
        let root = n - 1;
        group(|| {
            for (c, b) in comms.iter().zip(&bufs) {
                c.broadcast(c.device().stream(), &b.m, root)?;
            }
            Ok(())
        })
        .expect("broadcast");
        for (d, b) in devs.iter().zip(&bufs) {
            assert_eq!(download(d.stream(), b), bufs[root].values, "{dtype:?} broadcast");
        }
        // All-gather: rank r's block holds rank r's values exactly.
        let inputs = rank_inputs(&devs, &mut rng, &dims, dtype);
        let gdims = [dims[0] * n as i64, dims[1], dims[2], dims[3]];
        let outputs: Vec<DevTensor> = devs
            .iter()
            .map(|d| poisoned(d.stream(), &gdims, &strides(&gdims, Layout::Nchw), dtype))
            .collect();
        group(|| {
            for ((c, i), o) in comms.iter().zip(&inputs).zip(&outputs) {
                c.all_gather(c.device().stream(), &i.t, &o.m)?;
            }
            Ok(())
        })
        .expect("all_gather");
        let want: Vec<f64> = inputs.iter().flat_map(|t| t.values.clone()).collect();
        for (d, o) in devs.iter().zip(&outputs) {
            assert_eq!(download(d.stream(), o), want, "{dtype:?} all_gather");
        }
    }
    for c in &comms {
        c.synchronize().expect("no collective failed");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_thread_per_rank_with_a_shared_unique_id() {
    let devs = devices();
    let n = devs.len();
    let id = UniqueId::new().expect("unique id");
    let dims = [4096i64];
    let results: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(rank, d)| {
                s.spawn(move || {
                    let comm = Communicator::init_rank(d, rank, n, &id, Duration::from_secs(60)).expect("init_rank");
                    assert_eq!((comm.rank(), comm.world_size()), (rank, n));
                    let mut rng = SplitMix64::new(100 + rank as u64);
                    let x = random(d.stream(), &mut rng, &dims, &[1], DataType::F32);
                    comm.all_reduce(d.stream(), &x.t, &x.m, ReduceOp::Sum)
                        .expect("all_reduce");
                    comm.synchronize().expect("synchronize");
                    (x.values.clone(), download(d.stream(), &x))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let want = host_reduce(&results.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), ReduceOp::Sum);
    for (rank, (_, got)) in results.iter().enumerate() {
        assert!(rel_l2(got, &want) <= tolerance(DataType::F32, n), "rank {rank}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_arguments_are_refused_before_nccl_runs() {
    let devs = devices();
    let comms = Communicator::init_all(&devs[..1]).expect("init_all");
    let d = &devs[0];
    let x = random(d.stream(), &mut SplitMix64::new(7), &[8, 8], &[16, 1], DataType::F32);
    let err = comms[0]
        .all_reduce(d.stream(), &x.t, &x.m, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be packed"), "{err}");
    let b = random(d.stream(), &mut SplitMix64::new(8), &[8], &[1], DataType::Bool);
    let err = comms[0]
        .all_reduce(d.stream(), &b.t, &b.m, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not defined on bool"), "{err}");
    let err = comms[0].broadcast(d.stream(), &b.m, 1).unwrap_err().to_string();
    assert!(err.contains("not below the world size 1"), "{err}");
    let err = Communicator::init_all(&[d.clone(), d.clone()]).unwrap_err().to_string();
    assert!(err.contains("distinct GPUs"), "{err}");
    comms[0].synchronize().expect("the communicator is still usable");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_rank_that_never_joins_fails_init_after_the_timeout() {
    let devs = devices();
    let id = UniqueId::new().expect("unique id");
    let start = Instant::now();
    let err = Communicator::init_rank(&devs[0], 0, 2, &id, Duration::from_secs(3)).expect_err("rank 1 never joins");
    let waited = start.elapsed();
    assert!(matches!(err, Error::Collective { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("rank 0 of 2") && text.contains("did not finish setting up within 3 s"),
        "{text}"
    );
    assert!(waited < Duration::from_secs(30), "took {waited:?}");
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_a_peer_that_stops_makes_the_collective_fail_not_hang() {
    let devs = devices();
    assert!(
        devs.len() >= 2,
        "this test needs two CUDA GPUs; the machine has {}",
        devs.len()
    );
    let id = UniqueId::new().expect("unique id");
    // Long enough for a real two-GPU initialisation; also how long the stalled collective waits.
    let timeout = Duration::from_secs(20);
    let (r0, r1) = std::thread::scope(|s| {
        let a = s.spawn(|| Communicator::init_rank(&devs[0], 0, 2, &id, timeout).expect("rank 0"));
        let b = s.spawn(|| Communicator::init_rank(&devs[1], 1, 2, &id, timeout).expect("rank 1"));
        (a.join().unwrap(), b.join().unwrap())
    });
    let x = random(
        devs[0].stream(),
        &mut SplitMix64::new(3),
        &[1 << 16],
        &[1],
        DataType::F32,
    );
    // One collective on both ranks first: NCCL connects the ranks at their first collective
    // (and a non-blocking communicator reports that enqueue as still in progress until the
    // peer joins), so the stall below is a stall of an established communicator.
    let y = random(
        devs[1].stream(),
        &mut SplitMix64::new(4),
        &[1 << 16],
        &[1],
        DataType::F32,
    );
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            r0.all_reduce(devs[0].stream(), &x.t, &x.m, ReduceOp::Sum)
                .and_then(|()| r0.synchronize())
        });
        let b = s.spawn(|| {
            r1.all_reduce(devs[1].stream(), &y.t, &y.m, ReduceOp::Sum)
                .and_then(|()| r1.synchronize())
        });
        a.join().unwrap().expect("rank 0's first all_reduce");
        b.join().unwrap().expect("rank 1's first all_reduce");
    });
    r0.all_reduce(devs[0].stream(), &x.t, &x.m, ReduceOp::Sum)
        .expect("enqueued");
    // Rank 1 issues nothing: rank 0's all-reduce can never complete.
    let start = Instant::now();
    let err = r0.synchronize().expect_err("the watchdog aborts");
    assert!(start.elapsed() < Duration::from_secs(120), "took {:?}", start.elapsed());
    let text = err.to_string();
    assert!(
        text.contains("all_reduce did not complete within 20 s") && text.contains("rank 0 of 2"),
        "{text}"
    );
    // Every later call fails with the same reason; the stream is usable again once aborted.
    let again = r0
        .all_reduce(devs[0].stream(), &x.t, &x.m, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(again.contains("did not complete within"), "{again}");
    devs[0].stream().synchronize().expect("the aborted kernel returned");
    r1.abort("test over");
}

/// The environment variable that makes [`two_gpus_two_processes_join_through_the_environment`]
/// play one rank (set by the test for the processes it starts).
const CHILD_RANK: &str = "GPU_NCCL_TEST_CHILD_RANK";

#[test]
#[ignore = "needs two CUDA GPUs"]
/// Two processes, one per GPU, join one communicator the way multi-process jobs start:
/// `RANK`, `WORLD_SIZE` and `LOCAL_RANK` in the environment and the unique id exchanged
/// through the file `CUDNN_BACKEND_NCCL_ID_FILE` names (`Communicator::from_env`). Each
/// all-reduces a vector of its rank's values and checks the sum. The test starts itself
/// twice as those processes.
fn two_gpus_two_processes_join_through_the_environment() {
    if let Ok(rank) = std::env::var(CHILD_RANK) {
        let rank: usize = rank.parse().expect("child rank");
        let dev = Device::new(rank).expect("this rank's GPU");
        let comm = Communicator::from_env(&dev).expect("join the communicator");
        assert_eq!((comm.rank(), comm.world_size()), (rank, 2));
        let values: Vec<f64> = (0..1000).map(|i| (i as f64) * 0.5 + rank as f64 * 1000.0).collect();
        let x = integration_tests::upload(dev.stream(), &values, &[1000], &[1], DataType::F32);
        comm.all_reduce(dev.stream(), &x.t, &x.m, ReduceOp::Sum)
            .expect("all_reduce");
        comm.synchronize().expect("synchronize");
        let want: Vec<f64> = (0..1000).map(|i| (i as f64) + 1000.0).collect();
        assert_eq!(download(dev.stream(), &x), want, "rank {rank}");
        return;
    }
    let n = runtime::device_count().expect("needs CUDA GPUs");
    assert!(n >= 2, "this test needs two CUDA GPUs; the machine has {n}");
    let dir = std::env::temp_dir().join(format!("gpu-nccl-two-processes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let id_file = dir.join("nccl.id");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "two_gpus_two_processes_join_through_the_environment",
                    "--include-ignored",
                    "--nocapture",
                ])
                .env(CHILD_RANK, rank.to_string())
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", rank.to_string())
                .env("CUDNN_BACKEND_NCCL_ID_FILE", &id_file)
                .env("CUDNN_BACKEND_NCCL_TIMEOUT_S", "60")
                .spawn()
                .expect("start a rank process")
        })
        .collect();
    let statuses: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("rank process"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    for (rank, s) in statuses.iter().enumerate() {
        assert!(s.status.success(), "rank {rank} failed: {:?}", s.status);
    }
}

/// Burn data parallelism with one rank per GPU (`cudnn_backend::burn::process_group`), one
/// thread per rank here (one process per rank in `train_burn --devices`): after
/// `broadcast_parameters` every replica holds rank 0's initial weights, and
/// `all_reduce_gradients` turns each rank's gradients of a linear layer on its own random
/// batch into the mean over the ranks, for the weight and the bias, against the ranks' local
/// gradients averaged on the host. Every visible GPU is a rank (one GPU: a one-rank group).
#[test]
#[ignore = "needs a CUDA GPU and NCCL"]
fn process_group_broadcasts_parameters_and_averages_gradients() {
    use burn::backend::Autodiff;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};
    use cudnn_backend::burn::process_group::ProcessGroup;
    use cudnn_backend::burn::{Cudnn, CudnnDevice};
    type B = Autodiff<Cudnn>;

    let devs = devices();
    let n = devs.len();
    let id = UniqueId::new().expect("NCCL unique id");
    let host = |t: Tensor<Cudnn, 2>| -> Vec<f64> { t.into_data().convert::<f64>().to_vec().unwrap() };
    let host1 = |t: Tensor<Cudnn, 1>| -> Vec<f64> { t.into_data().convert::<f64>().to_vec().unwrap() };
    // Per rank: initial weight before the broadcast, after it, local gradients (weight,
    // bias) and the averaged ones.
    type Seen = (Vec<f64>, Vec<f64>, [Vec<f64>; 2], [Vec<f64>; 2]);
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let handles: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(rank, dev)| {
                let (id, host, host1) = (&id, &host, &host1);
                s.spawn(move || -> Seen {
                    let comm = Communicator::init_rank(dev, rank, n, id, Duration::from_secs(60)).expect("init_rank");
                    let group = ProcessGroup::new(comm);
                    let device = CudnnDevice::new(dev.ordinal());
                    assert_eq!(group.device(), device);
                    B::seed(&device, 7 + rank as u64);
                    let model: Linear<B> = LinearConfig::new(48, 40).init(&device);
                    let before = host(model.weight.val().inner());
                    let model = group.broadcast_parameters::<B, _>(model).expect("broadcast_parameters");
                    let after = host(model.weight.val().inner());
                    let mut rng = SplitMix64::new(300 + rank as u64);
                    let x: Vec<f32> = (0..32 * 48).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect();
                    let x = Tensor::<B, 2>::from_data(TensorData::new(x, [32, 48]), &device);
                    let loss = model.forward(x).powi_scalar(2).sum();
                    let grads = GradientsParams::from_grads(loss.backward(), &model);
                    let (w, b) = (model.weight.id, model.bias.as_ref().expect("bias").id);
                    let local = [
                        host(grads.get::<Cudnn, 2>(w).expect("weight gradient")),
                        host1(grads.get::<Cudnn, 1>(b).expect("bias gradient")),
                    ];
                    let grads = group
                        .all_reduce_gradients::<B, _>(&model, grads)
                        .expect("all_reduce_gradients");
                    let mean = [
                        host(grads.get::<Cudnn, 2>(w).expect("reduced weight gradient")),
                        host1(grads.get::<Cudnn, 1>(b).expect("reduced bias gradient")),
                    ];
                    group.barrier().expect("barrier");
                    (before, after, local, mean)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let rank0_initial = &seen[0].0;
    for (rank, (before, after, _, mean)) in seen.iter().enumerate() {
        assert_eq!(
            after, rank0_initial,
            "rank {rank}: weights after the broadcast differ from rank 0's"
        );
        if rank > 0 {
            assert_ne!(
                before, rank0_initial,
                "rank {rank} drew the same initial weights as rank 0 (weak test)"
            );
        }
        for (k, name) in ["weight", "bias"].iter().enumerate() {
            let want: Vec<f64> = (0..mean[k].len())
                .map(|i| seen.iter().map(|r| r.2[k][i]).sum::<f64>() / n as f64)
                .collect();
            let e = rel_l2(&mean[k], &want);
            assert!(
                e < 1e-6,
                "rank {rank}: averaged {name} gradient off by relative L2 {e:.2e}"
            );
        }
    }
    println!("process group over {n} GPU(s): broadcast parameters equal, averaged gradients match the host mean");
}
