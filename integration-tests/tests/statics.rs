//! The crate's process-wide state (CPU only, read from the sources): every `static` item of
//! `cudnn-backend` outside `#[cfg(test)]` modules, `thread_local!` ones included, is listed
//! here with why it exists. A new one fails this test until it is listed; one removed must be
//! taken off the list. `Library` items follow the CUDA driver's own model (a loaded library,
//! one primary context per device) and stay process-wide; `Engine` items are state a per-device
//! engine object is to own (caches, pools, counters, configuration).

use std::collections::BTreeSet;

use integration_tests::sources::{backend_src, rust_files};

/// Why a process-wide item exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    /// Required by the driver's model: loaded libraries and per-device primary contexts.
    Library,
    /// Engine state held process-wide for now.
    Engine,
}
use Reason::{Engine, Library};

/// Every allowed item: (file under `backend/src`, name, reason).
const ALLOWED: &[(&str, &str, Reason)] = &[
    ("burn/buffer_cache.rs", "CACHES", Engine),
    ("burn/distributed.rs", "ARRIVED", Engine),
    ("burn/distributed.rs", "BUCKETS", Engine),
    ("burn/distributed.rs", "COMMUNICATORS", Engine),
    ("burn/distributed.rs", "PENDING", Engine),
    ("burn/fusion/elementwise.rs", "WARNED", Engine),
    ("burn/fusion/flusher.rs", "STARTED", Engine),
    ("burn/fusion/reduce.rs", "WARNED", Engine),
    ("burn/math.rs", "WARNED", Engine),
    ("burn/memory.rs", "PREPARED", Engine),
    ("burn/memory.rs", "RELEASER", Engine),
    ("burn/random.rs", "GENERATOR", Engine),
    ("collective/mod.rs", "GROUP", Engine),
    ("collective/watchdog.rs", "LIST", Engine),
    ("collective/watchdog.rs", "THREAD", Engine),
    ("config.rs", "CONFIG", Engine),
    ("ffi/api.rs", "API", Library),
    ("ffi/counters.rs", "THREAD", Engine),
    ("ffi/counters.rs", "TOTALS", Engine),
    ("ffi/memory.rs", "VISIBLE", Library),
    ("ffi/nccl.rs", "API", Library),
    ("ffi/nvrtc.rs", "API", Library),
    ("ffi/nvrtc.rs", "COMPILES", Engine),
    ("ffi/nvrtc.rs", "COMPILE_DONE", Engine),
    ("ffi/nvrtc.rs", "EXIT_STARTED", Engine),
    ("ffi/nvrtc.rs", "GAVE_UP", Engine),
    ("ffi/nvrtc.rs", "MAIN_THREAD_EXIT_WAIT", Engine),
    ("ffi/nvrtc.rs", "NAMED", Engine),
    ("ffi/nvrtc.rs", "PRIMED", Engine),
    ("ffi/probe.rs", "CACHE", Library),
    ("handle/pool.rs", "NEXT_POOL_ID", Engine),
    ("handle/pool.rs", "WINDOW", Engine),
    ("kernels/compile.rs", "INFO", Engine),
    ("kernels/fused.rs", "B", Engine),
    ("kernels/fused.rs", "SOURCES", Engine),
    ("kernels/fused_reduce.rs", "SOURCES", Engine),
    ("kernels/load.rs", "BUILDS", Engine),
    ("kernels/load.rs", "CACHE", Engine),
    ("kernels/load.rs", "COMPILED", Engine),
    ("kernels/load.rs", "COMPILE_US", Engine),
    ("kernels/load.rs", "DISK_HITS", Engine),
    ("kernels/load.rs", "DISK_MISSES", Engine),
    ("kernels/load.rs", "HASHES", Engine),
    ("kernels/load.rs", "JOBS", Engine),
    ("kernels/load.rs", "LOADED", Engine),
    ("kernels/load.rs", "LOAD_US", Engine),
    ("kernels/load.rs", "N", Engine),
    ("kernels/load.rs", "PERMITS", Engine),
    ("kernels/load.rs", "PREFETCHED", Engine),
    ("kernels/load.rs", "PTX_FALLBACKS", Engine),
    ("kernels/load.rs", "WARNED", Engine),
    ("ops/conv_fallback.rs", "V", Engine),
    ("ops/conv_fallback.rs", "WARNED", Engine),
    ("ops/pool_kernels.rs", "LEGACY_MISSING", Engine),
    ("plan/background.rs", "TABLE", Engine),
    ("plan/executor.rs", "UNSUPPORTED", Engine),
    ("plan/executor.rs", "WARNED", Engine),
    ("plan/handles.rs", "POOL", Engine),
    ("plan/kernel_cache.rs", "R", Engine),
    ("plan/kernel_cache.rs", "S", Engine),
    ("plan/mod.rs", "CHOICES", Engine),
    ("plan/mod.rs", "STATS", Engine),
    ("plan/persist.rs", "COUNTER", Engine),
    ("plan/policy.rs", "POLICY", Engine),
    ("plan/serialized.rs", "KNOWN", Engine),
    ("plan/serialized.rs", "RESTORED", Engine),
    ("plan/serialized.rs", "STORED", Engine),
    ("runtime/build_trace.rs", "EPOCH", Engine),
    ("runtime/build_trace.rs", "TRACE", Engine),
    ("runtime/device.rs", "DEVICES", Library),
    ("runtime/device.rs", "OPEN_LOCK", Library),
    ("runtime/disk_cache.rs", "COUNTER", Engine),
    ("runtime/fault.rs", "ARMED", Engine),
    ("runtime/fault.rs", "ARMED_THREADS", Engine),
    ("runtime/fault.rs", "FUSED_BUILDS_FAILED", Engine),
    ("runtime/fault.rs", "FUSED_BUILD_FAULTS", Engine),
    ("runtime/workspace.rs", "CACHE_RELEASERS", Engine),
    ("runtime/workspace.rs", "PER_THREAD", Engine),
    ("runtime/workspace.rs", "WORKSPACES", Engine),
];

/// The name of the `static` item `line` declares, unless it is a constant string or table
/// (a `&` type, which holds no state).
fn static_item(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
    let t = t.strip_prefix("static ")?;
    let t = t.strip_prefix("mut ").unwrap_or(t);
    let (name, ty) = t.split_once(':')?;
    let name = name.trim();
    let is_name = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    (is_name && !ty.trim_start().starts_with('&')).then_some(name)
}

/// The static items of `src` before its `#[cfg(test)] mod tests`.
fn statics_of(src: &str) -> Vec<&str> {
    let lines: Vec<&str> = src.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    lines[..end].iter().filter_map(|l| static_item(l)).collect()
}

#[test]
fn every_process_wide_item_is_listed_with_its_reason() {
    let root = backend_src();
    let files = rust_files(&root);
    assert!(files.len() > 50, "found the crate's sources ({})", files.len());
    let mut found = BTreeSet::new();
    for f in &files {
        let name = f.strip_prefix(&root).unwrap().display().to_string();
        for item in statics_of(&std::fs::read_to_string(f).unwrap()) {
            found.insert((name.clone(), item.to_string()));
        }
    }
    let allowed: BTreeSet<(String, String)> = ALLOWED
        .iter()
        .map(|&(f, n, _)| (f.to_string(), n.to_string()))
        .collect();
    let unlisted: Vec<_> = found.difference(&allowed).collect();
    let gone: Vec<_> = allowed.difference(&found).collect();
    let library = ALLOWED.iter().filter(|a| a.2 == Library).count();
    println!(
        "process-wide items: {} ({library} for the driver's model, {} engine state)",
        found.len(),
        ALLOWED.len() - library
    );
    assert!(
        unlisted.is_empty(),
        "process-wide items not listed here (add them with a reason, or keep the state in an object): {unlisted:?}"
    );
    assert!(
        gone.is_empty(),
        "listed items that no longer exist (take them off the list): {gone:?}"
    );
}

#[test]
fn the_scan_finds_statics_and_skips_constants_and_tests() {
    let src = "static A: AtomicU64 = AtomicU64::new(0);\n\
               pub(crate) static B: OnceLock<X> = OnceLock::new();\n\
               static NAME: &str = \"x\";\n\
               thread_local! {\n    static C: Cell<u8> = const { Cell::new(0) };\n}\n\
               let static_x = 1;\n\
               #[cfg(test)]\nmod tests {\n    static D: AtomicBool = AtomicBool::new(false);\n}\n";
    assert_eq!(statics_of(src), ["A", "B", "C"]);
}
