//! The crates' process-wide state (CPU only, read from the sources): every `static` item of
//! `cudnn-backend` and `cudnn-backend-core` outside `#[cfg(test)]` modules, `thread_local!`
//! ones included, is listed here with why it exists. A new one fails this test until it is
//! listed; one removed must be taken off the list. Caches, pools, tables and counters live in
//! the core's one `Engine` object (and the Burn adapter's state beside it); what remains
//! follows the CUDA driver's own model (loaded libraries, their process-exit handling, one
//! primary context per device) or is per thread by design.

use std::collections::BTreeSet;

use integration_tests::sources::{backend_dir, rust_files, BACKEND_SRCS};

/// Why a process-wide item exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    /// The one object holding the engine's state (or the adapter's).
    Engine,
    /// Required by the driver's model: loaded libraries, what they are known to offer, their
    /// teardown at process exit, and per-device primary contexts.
    Library,
    /// Per thread by design: a thread's share of counters, its armed test faults, its
    /// per-thread-stream workspaces, handle window and NCCL group.
    Thread,
}
use Reason::{Engine, Library, Thread};

/// Every allowed item: (file under `backend/`: `src/` for `cudnn-backend`, `core/src/` for
/// `cudnn-backend-core`; name; reason).
const ALLOWED: &[(&str, &str, Reason)] = &[
    ("src/burn/mod.rs", "STATE", Engine),
    ("core/src/lib.rs", "ENGINE", Engine),
    ("core/src/collective/mod.rs", "GROUP", Thread),
    ("core/src/ffi/api.rs", "API", Library),
    ("core/src/ffi/counters.rs", "THREAD", Thread),
    ("core/src/ffi/memory.rs", "VISIBLE", Library),
    ("core/src/ffi/nccl.rs", "API", Library),
    ("core/src/ffi/nvrtc.rs", "API", Library),
    ("core/src/ffi/nvrtc.rs", "COMPILES", Library),
    ("core/src/ffi/nvrtc.rs", "COMPILE_DONE", Library),
    ("core/src/ffi/nvrtc.rs", "EXIT_STARTED", Library),
    ("core/src/ffi/nvrtc.rs", "GAVE_UP", Library),
    ("core/src/ffi/nvrtc.rs", "MAIN_THREAD_EXIT_WAIT", Thread),
    ("core/src/ffi/nvrtc.rs", "NAMED", Library),
    ("core/src/ffi/nvrtc.rs", "PRIMED", Library),
    ("core/src/ffi/probe.rs", "CACHE", Library),
    ("core/src/handle/pool.rs", "WINDOW", Thread),
    ("core/src/kernels/compile.rs", "INFO", Library),
    ("core/src/ops/pool_kernels.rs", "LEGACY_MISSING", Library),
    ("core/src/runtime/device.rs", "DEVICES", Library),
    ("core/src/runtime/device.rs", "OPEN_LOCK", Library),
    ("core/src/runtime/fault.rs", "ARMED", Thread),
    ("core/src/runtime/workspace.rs", "PER_THREAD", Thread),
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
    let count = |r: Reason| ALLOWED.iter().filter(|a| a.2 == r).count();
    println!(
        "process-wide items: {} ({} engine state, {} for the driver's model, {} per thread)",
        found.len(),
        count(Engine),
        count(Library),
        count(Thread)
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
