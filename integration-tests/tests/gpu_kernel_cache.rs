//! The kernel loader across processes: the first process compiles kernels with NVRTC (CUBIN)
//! and fills the disk cache, a second one loads them without compiling, a corrupt cache is
//! rebuilt, and `CUDNN_BACKEND_KERNEL_CACHE=off` writes nothing. Each child runs this binary's
//! `child_kernels` with `CUDA_CACHE_DISABLE=1` (the driver's own cache off, as on a fresh
//! machine); first-op times are printed, not asserted. Needs a CUDA GPU.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use cudnn_backend::kernels::elementwise::{self as ew, BinaryOp};
use cudnn_backend::types::{TensorMut, TensorRef};
use cudnn_backend::Device;

/// Fills two f32 vectors and adds them (kernels `fill_b4` and `binary_f32`), checks the sum,
/// and prints the loader's counters.
#[test]
#[ignore = "needs a CUDA GPU (run by kernels_compile_once_then_load_from_the_disk_cache)"]
fn child_kernels() {
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let s = dev.stream();
    let n = 1000usize;
    let mut bufs: Vec<_> = (0..3).map(|_| s.alloc_zeros::<f32>(n).expect("alloc")).collect();
    let dims = [n as i64];
    let start = Instant::now();
    {
        let [a, b, sum] = &mut bufs[..] else {
            unreachable!("three buffers")
        };
        let (a, b, sum) = (
            TensorMut::packed(a, s, &dims).expect("view"),
            TensorMut::packed(b, s, &dims).expect("view"),
            TensorMut::packed(sum, s, &dims).expect("view"),
        );
        ew::fill(s, &a, 1.5).expect("fill");
        ew::fill(s, &b, 2.25).expect("fill");
        ew::binary(s, BinaryOp::Add, &a, &b, &sum).expect("add");
    }
    s.synchronize().unwrap();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let sum = s.clone_dtoh(&bufs[2]).expect("download");
    assert!(sum.iter().all(|&v| v == 3.75), "{:?}", &sum[..4]);
    // The warm-up and the siblings of these kernels compile on background threads: the
    // counters must include them, as the cache directory will after exit.
    cudnn_backend::kernels::wait_for_background_compiles();
    let k = cudnn_backend::kernels::compile_stats();
    println!("FIRST_OPS_MS={ms:.1}");
    println!("COMPILED={}", k.compiled);
    println!("DISK_HITS={}", k.disk_hits);
    println!("PREFETCHED={}", k.prefetched);
    println!("PTX_FALLBACKS={}", k.ptx_fallbacks);
    println!("COMPILE_MS={:.1}", k.compile_ms);
}

struct Child {
    ms: f64,
    compiled: u64,
    disk_hits: u64,
    prefetched: u64,
    ptx: u64,
}

fn child(cache: &str) -> Child {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--include-ignored", "--exact", "child_kernels", "--nocapture"])
        .env("CUDNN_BACKEND_KERNEL_CACHE", cache)
        .env("CUDA_CACHE_DISABLE", "1")
        .output()
        .expect("spawn child");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |k: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    Child {
        ms: field("FIRST_OPS_MS="),
        compiled: field("COMPILED=") as u64,
        disk_hits: field("DISK_HITS=") as u64,
        prefetched: field("PREFETCHED=") as u64,
        ptx: field("PTX_FALLBACKS=") as u64,
    }
}

/// The kernel entries of a cache directory (serialized cuDNN plans, `plan-*`, left out).
fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("plan-")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_compile_once_then_load_from_the_disk_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kernels");
    let cache_str = cache.to_str().unwrap();

    let fresh = child(cache_str);
    let files = entries(&cache);
    assert!(
        fresh.compiled >= 2 && fresh.disk_hits == 0,
        "fresh: {} compiled",
        fresh.compiled
    );
    assert_eq!(
        fresh.ptx, 0,
        "this GPU should get CUBINs (PTX means NVRTC is older than the GPU)"
    );
    assert_eq!(
        files.len() as u64,
        fresh.compiled,
        "one entry per compiled kernel: {files:?}"
    );

    let warm = child(cache_str);
    assert_eq!(warm.compiled, 0, "a warm cache compiles nothing");
    assert!(warm.disk_hits >= 2);

    // Truncate every entry: the next process ignores them (warning), compiles and rewrites.
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        std::fs::write(f, &bytes[..bytes.len() / 2]).unwrap();
    }
    let rebuilt = child(cache_str);
    assert!(rebuilt.compiled >= 2 && rebuilt.disk_hits == 0);
    let again = child(cache_str);
    assert_eq!(again.compiled, 0, "the rebuilt entries load");

    let before = entries(&cache).len();
    let off = child("off");
    assert!(off.compiled >= 2 && off.disk_hits == 0, "off: every process compiles");
    assert_eq!(entries(&cache).len(), before);
    println!(
        "kernel cache: fresh {:.0} ms ({} compiled, {} alongside), warm {:.0} ms ({} from disk), \
         rebuilt {:.0} ms, cache off {:.0} ms",
        fresh.ms, fresh.compiled, fresh.prefetched, warm.ms, warm.disk_hits, rebuilt.ms, off.ms
    );
}

/// Runs one bf16 fused attention (a runtime-compiled cuDNN engine) with statistics and prints
/// the serialized-plan counters and a checksum of the output bits.
#[test]
#[ignore = "needs a CUDA GPU (run by cudnn_plans_restore_from_the_disk_cache)"]
fn child_attention() {
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let s = dev.stream();
    let dims = [1i64, 2, 64, 64];
    let n = 2 * 64 * 64;
    let vals: Vec<half::bf16> = (0..n)
        .map(|i| half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0))
        .collect();
    let q = s.clone_htod(&vals).expect("upload");
    let mut o = s.alloc_zeros::<half::bf16>(n).expect("alloc");
    let mut st = s.alloc_zeros::<f32>(2 * 64).expect("alloc");
    let start = Instant::now();
    {
        let qt = TensorRef::packed(&q, s, &dims).expect("view");
        let ot = TensorMut::packed(&mut o, s, &dims).expect("view");
        let stats = TensorMut::packed(&mut st, s, &[1, 2, 64, 1]).expect("view");
        cudnn_backend::ops::sdpa_forward(s, &qt, &qt, &qt, None, false, &ot, 0.125, Some(&stats)).expect("sdpa");
    }
    s.synchronize().unwrap();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let out = s.clone_dtoh(&o).expect("download");
    let checksum = out
        .iter()
        .fold(0u64, |h, v| h.wrapping_mul(31).wrapping_add(v.to_bits() as u64));
    let p = cudnn_backend::plan::serialized_plan_counts();
    println!("FIRST_OPS_MS={ms:.1}");
    println!("PLANS_STORED={}", p.stored);
    println!("PLANS_RESTORED={}", p.restored);
    println!("CHECKSUM={checksum}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cudnn_plans_restore_from_the_disk_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let run = || {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--include-ignored", "--exact", "child_attention", "--nocapture"])
            .env("CUDNN_BACKEND_KERNEL_CACHE", &cache)
            .env("CUDA_CACHE_DISABLE", "1")
            .output()
            .expect("spawn child");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "child failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |k: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in:\n{text}"))
                .trim()
                .parse()
                .unwrap()
        };
        (
            field("FIRST_OPS_MS="),
            field("PLANS_STORED=") as u64,
            field("PLANS_RESTORED=") as u64,
            field("CHECKSUM="),
        )
    };
    let (ms1, stored1, restored1, sum1) = run();
    let (ms2, stored2, restored2, sum2) = run();
    println!(
        "serialized plans: first process {ms1:.0} ms ({stored1} stored), second {ms2:.0} ms ({restored2} restored)"
    );
    assert!(
        stored1 >= 1 && restored1 == 0,
        "first process: {stored1} stored, {restored1} restored"
    );
    assert!(
        restored2 >= 1 && stored2 == 0,
        "second process: {stored2} stored, {restored2} restored"
    );
    assert_eq!(sum1, sum2, "a restored plan computes the same output");
}
