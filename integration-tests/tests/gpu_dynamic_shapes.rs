//! `EnginePolicy::dynamic_shapes` on the GPU: fused attention (a runtime-compiled cuDNN
//! engine) over a series of new sequence lengths gives the float64 reference's results, and
//! the first call of each new length is timed and printed. The policy comes from the
//! environment, so the two sides are two processes: `CUDNN_BACKEND_DYNAMIC_SHAPES=1` (graphs
//! built as dynamic-shape graphs sharing one kernel cache per topology) and unset.

use std::sync::Arc;
use std::time::Instant;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::ops;
use cudnn_backend::plan::{dynamic_shape_kernel_caches, policy};
use cudnn_backend::Device;
use cudnn_backend_reference::{self as cpu, SplitMix64};
use integration_tests::{bound, download, poisoned, random, strides, Layout};

const LENGTHS: [i64; 6] = [128, 160, 192, 256, 320, 384];

/// Runs attention for every length of [`LENGTHS`] (f16, batch 2, 4 heads, head dim 64),
/// checks each against float64 and returns the first-call milliseconds per length.
fn series(s: &Arc<CudaStream>) -> Vec<f64> {
    let mut rng = SplitMix64::new(77);
    let mut times = Vec::new();
    for sq in LENGTHS {
        let dims = [2i64, 4, sq, 64];
        let layout = strides(&dims, Layout::Nchw);
        let (q, k, v) = (
            random(s, &mut rng, &dims, &layout, DataType::F16),
            random(s, &mut rng, &dims, &layout, DataType::F16),
            random(s, &mut rng, &dims, &layout, DataType::F16),
        );
        let o = poisoned(s, &dims, &layout, DataType::F16);
        s.synchronize().unwrap();
        let start = Instant::now();
        ops::sdpa_forward(s, &q.t, &k.t, &v.t, None, false, &o.m, 0.125, None).expect("fused attention");
        s.synchronize().unwrap();
        times.push(start.elapsed().as_secs_f64() * 1e3);
        let (want, _) = cpu::attention(
            &q.values,
            &k.values,
            &v.values,
            [8, sq as usize, sq as usize, 64, 64],
            0.125,
            None,
        );
        let err = cpu::rel_l2_error(&download(s, &o), &want);
        assert!(err <= bound(DataType::F16), "sq {sq}: rel L2 {err:e}");
    }
    times
}

fn report(label: &str, times: &[f64]) {
    let cells: Vec<String> = LENGTHS
        .iter()
        .zip(times)
        .map(|(l, t)| format!("{l}: {t:.1} ms"))
        .collect();
    println!(
        "dynamic shapes {label}: first call per new length: {}",
        cells.join(", ")
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_over_new_lengths() {
    let dynamic = policy().dynamic_shapes;
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let times = series(dev.stream());
    report(if dynamic { "on" } else { "off" }, &times);
    let caches = dynamic_shape_kernel_caches();
    println!("dynamic shapes: {caches} kernel cache(s) for {} lengths", LENGTHS.len());
    if !dynamic {
        assert_eq!(caches, 0, "kernel caches made with the policy off");
    } else if cudnn_backend::runtime::cudnn_version().unwrap_or(0) >= 90500 {
        assert!(caches >= 1, "no kernel cache was made for the dynamic-shape graphs");
    }
}
