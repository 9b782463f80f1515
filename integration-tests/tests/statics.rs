//! The crates' process-wide state (CPU only, read from the sources): every `static` item of
//! `cudnn-backend` and `cudnn-backend-core` outside `#[cfg(test)]` modules, `thread_local!`
//! ones included, is listed here with why it exists. A new one fails this test until it is
//! listed; one removed must be taken off the list. `Library` items follow the CUDA driver's
//! own model (a loaded library, one primary context per device) and stay process-wide;
//! `Engine` items are state a per-device engine object is to own (caches, pools, counters,
//! configuration).

use std::collections::BTreeSet;

use integration_tests::sources::{backend_dir, rust_files, BACKEND_SRCS};

/// Why a process-wide item exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    /// Required by the driver's model: loaded libraries and per-device primary contexts.
    Library,
    /// Engine state held process-wide for now.
    Engine,
}
use Reason::{Engine, Library};

/// Every allowed item: (file under `backend/`: `src/` for `cudnn-backend`, `core/src/` for
/// `cudnn-backend-core`; name; reason).
const ALLOWED: &[(&str, &str, Reason)] = &[
    ("src/burn/buffer_cache.rs", "CACHES", Engine),
    ("src/burn/distributed.rs", "ARRIVED", Engine),
    ("src/burn/distributed.rs", "BUCKETS", Engine),
    ("src/burn/distributed.rs", "COMMUNICATORS", Engine),
    ("src/burn/distributed.rs", "PENDING", Engine),
    ("src/burn/fusion/elementwise.rs", "WARNED", Engine),
    ("src/burn/fusion/flusher.rs", "STARTED", Engine),
    ("src/burn/fusion/reduce.rs", "WARNED", Engine),
    ("src/burn/math.rs", "WARNED", Engine),
    ("src/burn/memory.rs", "PREPARED", Engine),
    ("src/burn/memory.rs", "RELEASER", Engine),
    ("src/burn/random.rs", "GENERATOR", Engine),
    ("core/src/collective/mod.rs", "GROUP", Engine),
    ("core/src/collective/watchdog.rs", "LIST", Engine),
    ("core/src/collective/watchdog.rs", "THREAD", Engine),
    ("core/src/config.rs", "CONFIG", Engine),
    ("core/src/ffi/api.rs", "API", Library),
    ("core/src/ffi/counters.rs", "THREAD", Engine),
    ("core/src/ffi/counters.rs", "TOTALS", Engine),
    ("core/src/ffi/memory.rs", "VISIBLE", Library),
    ("core/src/ffi/nccl.rs", "API", Library),
    ("core/src/ffi/nvrtc.rs", "API", Library),
    ("core/src/ffi/nvrtc.rs", "COMPILES", Engine),
    ("core/src/ffi/nvrtc.rs", "COMPILE_DONE", Engine),
    ("core/src/ffi/nvrtc.rs", "EXIT_STARTED", Engine),
    ("core/src/ffi/nvrtc.rs", "GAVE_UP", Engine),
    ("core/src/ffi/nvrtc.rs", "MAIN_THREAD_EXIT_WAIT", Engine),
    ("core/src/ffi/nvrtc.rs", "NAMED", Engine),
    ("core/src/ffi/nvrtc.rs", "PRIMED", Engine),
    ("core/src/ffi/probe.rs", "CACHE", Library),
    ("core/src/handle/pool.rs", "NEXT_POOL_ID", Engine),
    ("core/src/handle/pool.rs", "WINDOW", Engine),
    ("core/src/kernels/compile.rs", "INFO", Engine),
    ("core/src/kernels/fused.rs", "B", Engine),
    ("core/src/kernels/fused.rs", "SOURCES", Engine),
    ("core/src/kernels/fused_reduce.rs", "SOURCES", Engine),
    ("core/src/kernels/load.rs", "BUILDS", Engine),
    ("core/src/kernels/load.rs", "CACHE", Engine),
    ("core/src/kernels/load.rs", "COMPILED", Engine),
    ("core/src/kernels/load.rs", "COMPILE_US", Engine),
    ("core/src/kernels/load.rs", "DISK_HITS", Engine),
    ("core/src/kernels/load.rs", "DISK_MISSES", Engine),
    ("core/src/kernels/load.rs", "HASHES", Engine),
    ("core/src/kernels/load.rs", "JOBS", Engine),
    ("core/src/kernels/load.rs", "LOADED", Engine),
    ("core/src/kernels/load.rs", "LOAD_US", Engine),
    ("core/src/kernels/load.rs", "N", Engine),
    ("core/src/kernels/load.rs", "PERMITS", Engine),
    ("core/src/kernels/load.rs", "PREFETCHED", Engine),
    ("core/src/kernels/load.rs", "PTX_FALLBACKS", Engine),
    ("core/src/kernels/load.rs", "WARNED", Engine),
    ("core/src/ops/conv_fallback.rs", "V", Engine),
    ("core/src/ops/conv_fallback.rs", "WARNED", Engine),
    ("core/src/ops/pool_kernels.rs", "LEGACY_MISSING", Engine),
    ("core/src/plan/background.rs", "TABLE", Engine),
    ("core/src/plan/dynamic_shapes.rs", "R", Engine),
    ("core/src/plan/dynamic_shapes.rs", "S", Engine),
    ("core/src/plan/executor.rs", "UNSUPPORTED", Engine),
    ("core/src/plan/executor.rs", "WARNED", Engine),
    ("core/src/plan/handles.rs", "POOL", Engine),
    ("core/src/plan/mod.rs", "CHOICES", Engine),
    ("core/src/plan/mod.rs", "STATS", Engine),
    ("core/src/plan/persist.rs", "COUNTER", Engine),
    ("core/src/plan/policy.rs", "POLICY", Engine),
    ("core/src/plan/serialized.rs", "KNOWN", Engine),
    ("core/src/plan/serialized.rs", "RESTORED", Engine),
    ("core/src/plan/serialized.rs", "STORED", Engine),
    ("core/src/runtime/build_trace.rs", "EPOCH", Engine),
    ("core/src/runtime/build_trace.rs", "TRACE", Engine),
    ("core/src/runtime/device.rs", "DEVICES", Library),
    ("core/src/runtime/device.rs", "OPEN_LOCK", Library),
    ("core/src/runtime/disk_cache.rs", "COUNTER", Engine),
    ("core/src/runtime/fault.rs", "ARMED", Engine),
    ("core/src/runtime/fault.rs", "ARMED_THREADS", Engine),
    ("core/src/runtime/fault.rs", "FUSED_BUILDS_FAILED", Engine),
    ("core/src/runtime/fault.rs", "FUSED_BUILD_FAULTS", Engine),
    ("core/src/runtime/workspace.rs", "CACHE_RELEASERS", Engine),
    ("core/src/runtime/workspace.rs", "PER_THREAD", Engine),
    ("core/src/runtime/workspace.rs", "WORKSPACES", Engine),
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
    let root = backend_dir();
    let files: Vec<_> = BACKEND_SRCS
        .iter()
        .flat_map(|src| rust_files(&root.join(src)))
        .collect();
    assert!(files.len() > 50, "found the crates' sources ({})", files.len());
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
