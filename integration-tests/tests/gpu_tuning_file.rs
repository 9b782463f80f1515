//! The persistent tuning cache across processes: a second process finds the first one's
//! engine choices in the tuning file and skips autotuning (asserted through the build
//! counter; both first-call times are printed — timings are reported, not asserted, since
//! a loaded machine could invert them). Needs a CUDA GPU. The parent test runs this binary
//! twice as child processes.

use std::process::Command;
use std::time::Instant;

use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, ConvParams};
use cudnn_backend::plan::{policy, set_policy, EnginePolicy};
use cudnn_backend::Device;
use cudnn_backend_reference::SplitMix64;
use integration_tests::{poisoned, random, strides, Layout};

/// Runs one autotuned conv of a shape no other test uses and prints its first-call time.
#[test]
#[ignore = "needs a CUDA GPU (run by first_call_is_faster_in_a_second_process)"]
fn child_first_call() {
    set_policy(EnginePolicy {
        benchmark: true,
        ..policy()
    });
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let s = dev.stream();
    let mut rng = SplitMix64::new(9);
    let (xd, wd) = ([16i64, 96, 27, 27], [80i64, 96, 3, 3]);
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    let yd = p.output_dims(&xd, &wd).unwrap();
    let x = random(s, &mut rng, &xd, &strides(&xd, Layout::Nhwc), DataType::F16);
    let w = random(s, &mut rng, &wd, &strides(&wd, Layout::Nhwc), DataType::F16);
    let y = poisoned(s, &yd, &strides(&yd, Layout::Nhwc), DataType::F16);
    s.synchronize().unwrap();
    let t = Instant::now();
    ops::conv_forward(s, &x.t, &w.t, &y.m, &p).expect("conv");
    s.synchronize().unwrap();
    println!("FIRST_CALL_MS={:.3}", t.elapsed().as_secs_f64() * 1e3);
    println!("CHOICE_BUILDS={}", cudnn_backend::plan::stats().choice_builds);
}

/// Runs the child test with tuning files in `dir` and the persistent kernel and plan cache in
/// `kernels` (the parent's own: a cache an earlier run filled would restore the plan, and no
/// engine would be selected or tuned).
fn child(dir: &std::path::Path, kernels: &std::path::Path) -> (f64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--include-ignored", "--exact", "child_first_call", "--nocapture"])
        .env("CUDNN_BACKEND_TUNING_DIR", dir)
        .env(cudnn_backend::runtime::disk_cache::KERNEL_CACHE_ENV, kernels)
        .output()
        .expect("spawn child");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in:\n{text}"))
            .trim()
            .to_string()
    };
    (
        field("FIRST_CALL_MS=").parse().unwrap(),
        field("CHOICE_BUILDS=").parse().unwrap(),
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn first_call_is_faster_in_a_second_process() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = tempfile::tempdir().unwrap();
    let (first_ms, first_builds) = child(dir.path(), kernels.path());
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let (second_ms, second_builds) = child(dir.path(), kernels.path());
    println!("tuning file: process 1 first call {first_ms:.1} ms ({first_builds} builds), process 2 first call {second_ms:.1} ms ({second_builds} builds); files {files:?}");
    assert_eq!(files.len(), 1, "one tuning file written");
    assert_eq!(first_builds, 1, "process 1 selected an engine");
    assert_eq!(second_builds, 0, "process 2 reused the saved choice");
}
