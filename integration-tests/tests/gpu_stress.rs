//! Concurrency: 32 threads × 500 mixed ops (conv fwd/bwd, matmul, pooling; varied shapes;
//! each thread on its own stream) in deterministic mode give results bitwise equal to the
//! single-thread run. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::PoolMode;
use cudnn_backend::plan::{policy, set_policy, EnginePolicy};
use cudnn_backend::Device;
use cudnn_backend_reference::SplitMix64;
use integration_tests::jobs::{engine_jobs, run_once, Job};
use integration_tests::Layout;

const THREADS: usize = 32;
const OPS_PER_THREAD: usize = 500;

fn jobs(s: &Arc<CudaStream>) -> Vec<Job> {
    use DataType::{BF16, F16, F32};
    engine_jobs(
        s,
        77,
        &[
            (2, 16, 15, 8, 3, 1, F32, Layout::Nchw),
            (1, 8, 9, 16, 1, 1, F16, Layout::Nhwc),
            (3, 12, 11, 12, 5, 2, BF16, Layout::Nhwc),
            (2, 4, 17, 8, 3, 2, F32, Layout::Nhwc),
        ],
        &[(1, 64, 32, 48, F16), (4, 33, 17, 9, BF16), (2, 128, 64, 64, F32)],
        &[
            (PoolMode::Max, F16, Layout::Nhwc),
            (PoolMode::AvgExcludePadding, F32, Layout::Nchw),
            (PoolMode::Max, F32, Layout::Nchw),
        ],
    )
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
    let pool = cudnn_backend::plan::cudnn_pool().stats();
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
