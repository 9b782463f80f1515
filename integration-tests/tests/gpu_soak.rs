//! Soak: 32 worker slots share GPU 0 (and GPU 1 when present, a quarter of the slots) for
//! `SOAK_SECS` seconds (default 60). Workers are short-lived: each runs 5–50 random ops and
//! exits, and a new thread takes its slot, until the time is up. Ops mix the engine's
//! `ops` (conv forward / data grad / filter grad, matmul, pooling forward and backward, on
//! a fresh stream per worker or on the device stream) with Burn `Cudnn` tensor ops (conv2d,
//! matmul, sum, exp). Engine results must equal, bitwise, the single-thread results computed
//! beforehand (deterministic policy); Burn results must match theirs within 1e-4 relative.
//!
//! The run has two phases. The first warms up: it creates the cuDNN handles (one per live
//! thread and device), builds the plans, compiles the kernels and grows the memory pool.
//! Around the second, after synchronizing, trimming the pool and forgetting engine choices,
//! the test checks for leaks: free device memory may drop by at most [`MEMORY_SLACK_MIB`],
//! and the handles created after both phases stay within the first phase's peak of live
//! threads (+ [`HANDLE_SLACK`]). Needs a CUDA GPU, to itself: free memory is a device-wide
//! figure, so another process allocating on the same GPU during the run shows as a leak.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorData};
use burn_backend::Backend;
use cudnn_backend::burn::{Cudnn, CudnnDevice};
use cudnn_backend::cudarc::driver::{result as cu, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::PoolMode;
use cudnn_backend::plan::cudnn_pool;
use cudnn_backend::plan::{clear_choices, policy, set_policy, EnginePolicy};
use cudnn_backend::Device;
use cudnn_backend_reference::{rel_l2_error, SplitMix64};
use integration_tests::jobs::{engine_jobs, run_once, Job};
use integration_tests::{panic_message, Layout};

/// Worker slots (live threads at most).
const THREADS: usize = 32;
/// Ops per worker: uniform in `MIN_OPS..=MAX_OPS`.
const MIN_OPS: u64 = 5;
const MAX_OPS: u64 = 50;
/// Relative L2 tolerance of the Burn results (kernels may reduce in another order).
const BURN_TOL: f64 = 1e-4;
/// Handles a device may have beyond its peak of live worker threads: the main thread's own
/// handle (it computed the expected results) and one nested lease.
const HANDLE_SLACK: usize = 2;
/// Free device memory the measured phase may consume, per device. Covers state that is
/// legitimately created once and kept: kernel modules of plans a handle builds for the first
/// time in the second phase, CUDA graphs captured for repeated calls, and the driver's
/// rounding of the stream-ordered memory pool after trimming. A leak per thread or per op
/// (thousands of threads, hundreds of thousands of ops) exceeds it many times over.
const MEMORY_SLACK_MIB: f64 = 64.0;

/// One Burn op on fixed input tensors, returning its result as f32 values.
struct BurnJob {
    name: &'static str,
    run: Box<dyn Fn() -> Vec<f32> + Send + Sync>,
}

/// Everything the workers of one device share: its jobs and their expected results.
struct DeviceJobs {
    dev: Arc<Device>,
    jobs: Vec<Job>,
    expected: Vec<Vec<u8>>,
    burn: Vec<BurnJob>,
    burn_expected: Vec<Vec<f32>>,
}

fn soak_engine_jobs(s: &Arc<CudaStream>, seed: u64) -> Vec<Job> {
    use DataType::{BF16, F16, F32};
    engine_jobs(
        s,
        seed,
        &[
            (2, 16, 15, 8, 3, 1, F32, Layout::Nchw),
            (1, 8, 9, 16, 1, 1, F16, Layout::Nhwc),
            (3, 12, 11, 12, 5, 2, BF16, Layout::Nhwc),
        ],
        &[(1, 64, 32, 48, F16), (2, 33, 17, 9, F32)],
        &[
            (PoolMode::Max, F16, Layout::Nhwc),
            (PoolMode::AvgExcludePadding, F32, Layout::Nchw),
        ],
    )
}

fn burn_tensor(rng: &mut SplitMix64, shape: [usize; 4], device: &CudnnDevice) -> Tensor<Cudnn, 4> {
    let n = shape.iter().product();
    let v: Vec<f32> = rng.fill(n).into_iter().map(|x| x as f32).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

fn values<const D: usize>(t: Tensor<Cudnn, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 data")
}

fn burn_jobs(device: CudnnDevice, seed: u64) -> Vec<BurnJob> {
    let mut rng = SplitMix64::new(seed);
    let x = burn_tensor(&mut rng, [2, 4, 9, 9], &device);
    let w = burn_tensor(&mut rng, [6, 4, 3, 3], &device);
    let bias: Tensor<Cudnn, 1> = burn_tensor(&mut rng, [1, 1, 1, 6], &device).reshape([6]);
    let a = burn_tensor(&mut rng, [1, 2, 16, 24], &device);
    let b = burn_tensor(&mut rng, [1, 2, 24, 8], &device);
    let (x1, x2, x3) = (x.clone(), x.clone(), x.clone());
    vec![
        BurnJob {
            name: "burn conv2d",
            run: Box::new(move || {
                let o = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
                values(conv2d(x1.clone(), w.clone(), Some(bias.clone()), o))
            }),
        },
        BurnJob {
            name: "burn matmul",
            run: Box::new(move || values(a.clone().matmul(b.clone()))),
        },
        BurnJob {
            name: "burn sum",
            run: Box::new(move || values(x2.clone().sum())),
        },
        BurnJob {
            name: "burn exp+sum_dim",
            run: Box::new(move || values(x3.clone().exp().sum_dim(3))),
        },
    ]
}

fn as_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// One worker's life: `MIN_OPS..=MAX_OPS` random ops, each checked; returns the mismatches.
fn worker(set: &DeviceJobs, seed: u64, ops_done: &AtomicU64) -> Vec<String> {
    let mut rng = SplitMix64::new(seed);
    // Mostly a stream of its own (created and dropped with the worker), sometimes the
    // device stream that Burn and other workers also use.
    let stream = if rng.below(4) == 0 {
        set.dev.stream().clone()
    } else {
        set.dev.context().new_stream().expect("new stream")
    };
    let n = MIN_OPS + rng.below(MAX_OPS - MIN_OPS + 1);
    let total = (set.jobs.len() + set.burn.len()) as u64;
    let mut bad = Vec::new();
    for _ in 0..n {
        let j = rng.below(total) as usize;
        if let Some(job) = set.jobs.get(j) {
            if run_once(&stream, job) != set.expected[j] {
                bad.push(format!("GPU {}: {} differs bitwise", set.dev.ordinal(), job.name));
            }
        } else {
            let k = j - set.jobs.len();
            let got = (set.burn[k].run)();
            let want = &set.burn_expected[k];
            let err = if got.len() == want.len() {
                rel_l2_error(&as_f64(&got), &as_f64(want))
            } else {
                f64::INFINITY
            };
            if err.is_nan() || err > BURN_TOL {
                bad.push(format!(
                    "GPU {}: {} off by {err:.2e}",
                    set.dev.ordinal(),
                    set.burn[k].name
                ));
            }
        }
        ops_done.fetch_add(1, Ordering::Relaxed);
    }
    bad
}

/// Sends the slot number when dropped, so the supervisor hears of panicking workers too.
struct Done(usize, mpsc::Sender<usize>);

impl Drop for Done {
    fn drop(&mut self) {
        let _ = self.1.send(self.0);
    }
}

/// Totals over the phases.
#[derive(Default)]
struct Tally {
    spawned: u64,
    failures: Vec<String>,
}

/// The device set of worker slot `slot` (a quarter of the slots on GPU 1 when present).
fn set_of(sets: &[Arc<DeviceJobs>], slot: usize) -> &Arc<DeviceJobs> {
    if sets.len() > 1 && slot % 4 == 3 {
        &sets[1]
    } else {
        &sets[0]
    }
}

/// Keeps all slots busy with fresh worker threads for `secs`; returns the peak number of
/// live worker threads per device. A slot's next thread starts only after the previous one
/// has been joined (its thread-locals, and so its pooled handles, released).
fn phase(sets: &[Arc<DeviceJobs>], secs: f64, seed: u64, ops_done: &Arc<AtomicU64>, tally: &mut Tally) -> Vec<usize> {
    let (tx, rx) = mpsc::channel::<usize>();
    let mut live = vec![0usize; sets.len()];
    let mut peak = vec![0usize; sets.len()];
    let mut spawn = |slot: usize, live: &mut Vec<usize>| -> JoinHandle<Vec<String>> {
        let set = set_of(sets, slot).clone();
        let d = if Arc::ptr_eq(&set, &sets[0]) { 0 } else { 1 };
        live[d] += 1;
        peak[d] = peak[d].max(live[d]);
        tally.spawned += 1;
        let (done, ops_done) = (Done(slot, tx.clone()), ops_done.clone());
        let seed = seed ^ (tally.spawned << 20) ^ slot as u64;
        std::thread::spawn(move || {
            let _done = done;
            worker(&set, seed, &ops_done)
        })
    };
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut threads: Vec<Option<JoinHandle<Vec<String>>>> = (0..THREADS).map(|s| Some(spawn(s, &mut live))).collect();
    let mut running = THREADS;
    while running > 0 {
        let slot = rx.recv().expect("a worker reports when it ends");
        let Some(t) = threads[slot].take() else {
            continue;
        };
        match t.join() {
            Ok(bad) => tally.failures.extend(bad),
            Err(p) => tally
                .failures
                .push(format!("worker in slot {slot} panicked: {}", panic_message(&*p))),
        }
        let d = if Arc::ptr_eq(set_of(sets, slot), &sets[0]) {
            0
        } else {
            1
        };
        live[d] -= 1;
        running -= 1;
        if Instant::now() < deadline {
            threads[slot] = Some(spawn(slot, &mut live));
            running += 1;
        }
    }
    peak
}

/// Waits for all work, returns pooled memory to the driver, forgets engine choices, and
/// reads each device's free memory (bytes).
fn settle_and_measure(sets: &[Arc<DeviceJobs>]) -> Vec<usize> {
    clear_choices();
    sets.iter()
        .map(|set| {
            let ctx = set.dev.context();
            ctx.synchronize().expect("synchronize");
            let device = CudnnDevice::new(set.dev.ordinal());
            Cudnn::sync(&device).expect("Burn sync");
            Cudnn::memory_cleanup(&device);
            ctx.bind_to_thread().expect("bind context");
            cu::mem_get_info().expect("cuMemGetInfo").0
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mixed_ops_from_churning_threads_leak_no_memory_or_handles() {
    set_policy(EnginePolicy {
        deterministic: true,
        ..policy()
    });
    let secs: f64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    let count = cudnn_backend::runtime::device_count().expect("needs a CUDA GPU");
    assert!(count > 0, "needs a CUDA GPU");
    let start = Instant::now();

    // Expected results, computed once, single-threaded, on each device used.
    let sets: Vec<Arc<DeviceJobs>> = (0..count.min(2))
        .map(|ordinal| {
            let dev = Device::new(ordinal).expect("open device");
            let s = dev.stream().clone();
            let jobs = soak_engine_jobs(&s, 77);
            let expected = jobs.iter().map(|j| run_once(&s, j)).collect();
            let burn = burn_jobs(CudnnDevice::new(ordinal), 91);
            let burn_expected = burn.iter().map(|j| (j.run)()).collect();
            Arc::new(DeviceJobs {
                dev,
                jobs,
                expected,
                burn,
                burn_expected,
            })
        })
        .collect();

    let ops_done = Arc::new(AtomicU64::new(0));
    let mut tally = Tally::default();
    // Phase 1 (warm-up): handles, plans, kernels and pool reach their steady state.
    let peak1 = phase(&sets, secs / 2.0, 1, &ops_done, &mut tally);
    let free_before = settle_and_measure(&sets);
    let created1: Vec<usize> = sets.iter().map(|s| cudnn_pool().created(s.dev.ordinal())).collect();
    // Phase 2 (measured).
    let peak2 = phase(&sets, secs / 2.0, 2, &ops_done, &mut tally);
    let free_after = settle_and_measure(&sets);
    let created2: Vec<usize> = sets.iter().map(|s| cudnn_pool().created(s.dev.ordinal())).collect();

    let mib = |b: i64| b as f64 / (1u64 << 20) as f64;
    let deltas: Vec<f64> = free_before
        .iter()
        .zip(&free_after)
        .map(|(&b, &a)| mib(b as i64 - a as i64))
        .collect();
    let worst = deltas.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "soak: {} threads spawned, {} ops, {} devices, {:.1} s, free-memory delta {worst:.1} MiB, handles created {}",
        tally.spawned,
        ops_done.load(Ordering::Relaxed),
        sets.len(),
        start.elapsed().as_secs_f64(),
        created2.iter().sum::<usize>()
    );
    for (d, set) in sets.iter().enumerate() {
        println!(
            "soak: GPU {}: peak live threads {} / {}, handles created {} after phase 1, {} after phase 2, \
             free memory {:.1} -> {:.1} MiB",
            set.dev.ordinal(),
            peak1[d],
            peak2[d],
            created1[d],
            created2[d],
            mib(free_before[d] as i64),
            mib(free_after[d] as i64)
        );
    }
    tally.failures.truncate(50);
    assert!(tally.failures.is_empty(), "{}", tally.failures.join("\n"));
    for (d, set) in sets.iter().enumerate() {
        let g = set.dev.ordinal();
        assert!(
            created1[d] <= peak1[d] + HANDLE_SLACK,
            "GPU {g}: {} handles created in phase 1 for a peak of {} live threads",
            created1[d],
            peak1[d]
        );
        assert!(
            created2[d] <= peak1[d] + HANDLE_SLACK,
            "GPU {g}: handles grew to {} in phase 2 (phase 1 peak {} live threads)",
            created2[d],
            peak1[d]
        );
        assert!(
            deltas[d] <= MEMORY_SLACK_MIB,
            "GPU {g}: free memory dropped by {:.1} MiB over the measured phase (slack {MEMORY_SLACK_MIB} MiB)",
            deltas[d]
        );
    }
}
