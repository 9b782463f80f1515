//! Concurrency: 32 threads × 500 mixed ops (conv fwd/bwd, matmul, pooling; varied shapes;
//! each thread on its own stream) in deterministic mode give results bitwise equal to the
//! single-thread run. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, ConvParams, PoolMode, PoolParams, TensorRef};
use cudnn_backend::plan::{policy, set_policy, EnginePolicy};
use cudnn_backend::reference::SplitMix64;
use cudnn_backend::Device;
use integration_tests::{random, strides, DevTensor, Layout};

const THREADS: usize = 32;
const OPS_PER_THREAD: usize = 500;

/// Runs one op with the given inputs into the given output view.
type RunFn = Box<dyn Fn(&Arc<CudaStream>, &[DevTensor], &TensorRef) -> cudnn_backend::Result<()> + Send + Sync>;

/// One op with fixed inputs; `run` writes into the output view it is given.
struct Job {
    name: String,
    inputs: Vec<DevTensor>,
    out: TensorRef,
    run: RunFn,
}

fn bytes_of(t: &TensorRef) -> usize {
    (t.extent_elements() as usize) * t.dtype.size()
}

fn jobs(s: &Arc<CudaStream>) -> Vec<Job> {
    let mut rng = SplitMix64::new(77);
    let mut jobs = Vec::new();
    for (i, &(n, c, h, k, r, stride, dtype, layout)) in [
        (2, 16, 15, 8, 3, 1, DataType::F32, Layout::Nchw),
        (1, 8, 9, 16, 1, 1, DataType::F16, Layout::Nhwc),
        (3, 12, 11, 12, 5, 2, DataType::BF16, Layout::Nhwc),
        (2, 4, 17, 8, 3, 2, DataType::F32, Layout::Nhwc),
    ]
    .iter()
    .enumerate()
    {
        let p = ConvParams::new(&[r / 2, r / 2], &[stride, stride], &[1, 1], 1);
        let (xd, wd) = (vec![n, c, h, h], vec![k, c, r, r]);
        let yd = p.output_dims(&xd, &wd).unwrap();
        let x = random(s, &mut rng, &xd, &strides(&xd, layout), dtype);
        let dy = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
        let yv = TensorRef::new(&yd, &strides(&yd, layout), dtype, 0);
        let (p1, p2, p3) = (p.clone(), p.clone(), p.clone());
        jobs.push(Job {
            name: format!("conv_fwd#{i}"),
            inputs: vec![
                random(s, &mut rng, &xd, &strides(&xd, layout), dtype),
                random(s, &mut rng, &wd, &strides(&wd, layout), dtype),
            ],
            out: yv.clone(),
            run: Box::new(move |s, i, o| ops::conv_forward(s, &i[0].t, &i[1].t, o, &p1)),
        });
        jobs.push(Job {
            name: format!("conv_dgrad#{i}"),
            inputs: vec![
                random(s, &mut rng, &yd, &strides(&yd, layout), dtype),
                random(s, &mut rng, &wd, &strides(&wd, layout), dtype),
            ],
            out: TensorRef::new(&xd, &strides(&xd, layout), dtype, 0),
            run: Box::new(move |s, i, o| ops::conv_backward_data(s, &i[0].t, &i[1].t, o, &p2)),
        });
        jobs.push(Job {
            name: format!("conv_wgrad#{i}"),
            inputs: vec![x, dy],
            out: TensorRef::new(&wd, &strides(&wd, layout), dtype, 0),
            run: Box::new(move |s, i, o| ops::conv_backward_filter(s, &i[0].t, &i[1].t, o, &p3)),
        });
    }
    for (i, &(b, m, kk, nn, dtype)) in [
        (1, 64, 32, 48, DataType::F16),
        (4, 33, 17, 9, DataType::BF16),
        (2, 128, 64, 64, DataType::F32),
    ]
    .iter()
    .enumerate()
    {
        let (ad, bd, cd) = (vec![b, m, kk], vec![b, kk, nn], vec![b, m, nn]);
        jobs.push(Job {
            name: format!("matmul#{i}"),
            inputs: vec![
                random(s, &mut rng, &ad, &strides(&ad, Layout::Nchw), dtype),
                random(s, &mut rng, &bd, &strides(&bd, Layout::Nchw), dtype),
            ],
            out: TensorRef::new(&cd, &strides(&cd, Layout::Nchw), dtype, 0),
            run: Box::new(|s, i, o| ops::matmul(s, &i[0].t, &i[1].t, o)),
        });
    }
    for (i, &(mode, dtype, layout)) in [
        (PoolMode::Max, DataType::F16, Layout::Nhwc),
        (PoolMode::AvgExcludePadding, DataType::F32, Layout::Nchw),
        (PoolMode::Max, DataType::F32, Layout::Nchw),
    ]
    .iter()
    .enumerate()
    {
        let p = PoolParams::new(mode, &[3, 3], &[2, 2], &[1, 1]);
        let xd = vec![2, 8, 13, 13];
        let yd = p.output_dims(&xd).unwrap();
        let x = random(s, &mut rng, &xd, &strides(&xd, layout), dtype);
        let pf = p.clone();
        jobs.push(Job {
            name: format!("pool_fwd#{i}"),
            inputs: vec![random(s, &mut rng, &xd, &strides(&xd, layout), dtype)],
            out: TensorRef::new(&yd, &strides(&yd, layout), dtype, 0),
            run: Box::new(move |s, i, o| ops::pool_forward(s, &i[0].t, o, &pf)),
        });
        // Backward needs the forward's y: compute it once into an input buffer.
        let y = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
        ops::pool_forward(s, &x.t, &y.t, &p).unwrap();
        let dy = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
        jobs.push(Job {
            name: format!("pool_bwd#{i}"),
            inputs: vec![x, y, dy],
            out: TensorRef::new(&xd, &strides(&xd, layout), dtype, 0),
            run: Box::new(move |s, i, o| ops::pool_backward(s, Some(&i[0].t), Some(&i[1].t), &i[2].t, o, &p)),
        });
    }
    s.synchronize().unwrap();
    jobs
}

/// Runs `job` into a fresh (poisoned) buffer on `s` and returns the output bytes.
fn run_once(s: &Arc<CudaStream>, job: &Job) -> Vec<u8> {
    let buf: CudaSlice<u8> = s.clone_htod(&vec![0xFFu8; bytes_of(&job.out)]).unwrap();
    let out = TensorRef {
        ptr: buf.device_ptr(s).0,
        ..job.out.clone()
    };
    (job.run)(s, &job.inputs, &out).unwrap_or_else(|e| panic!("{}: {e}", job.name));
    s.clone_dtoh(&buf).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mixed_ops_from_32_threads_match_single_thread_bitwise() {
    set_policy(EnginePolicy {
        deterministic: true,
        ..policy()
    });
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let s = dev.stream().clone();
    let jobs = Arc::new(jobs(&s));
    let expected: Arc<Vec<Vec<u8>>> = Arc::new(jobs.iter().map(|j| run_once(&s, j)).collect());
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (jobs, expected, dev) = (jobs.clone(), expected.clone(), dev.clone());
            std::thread::spawn(move || {
                let stream = dev.context().new_stream().unwrap();
                let mut rng = SplitMix64::new(1000 + t as u64);
                let mut mismatches = Vec::new();
                for op in 0..OPS_PER_THREAD {
                    let j = rng.below(jobs.len() as u64) as usize;
                    if run_once(&stream, &jobs[j]) != expected[j] {
                        mismatches.push(format!("thread {t} op {op}: {} differs", jobs[j].name));
                    }
                }
                mismatches
            })
        })
        .collect();
    let mismatches: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread panicked"))
        .collect();
    let stats = cudnn_backend::plan::stats();
    let pool = cudnn_backend::handle::cudnn_pool().stats();
    println!(
        "stress: {THREADS} threads x {OPS_PER_THREAD} ops over {} jobs in {:.1} s; {} mismatches; handles created {}; plan hits {} misses {}",
        jobs.len(),
        start.elapsed().as_secs_f64(),
        mismatches.len(),
        pool.created,
        stats.plan_hits,
        stats.plan_misses
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(
        pool.created <= THREADS + 1,
        "handles created {} > threads + 1",
        pool.created
    );
}
