//! The crates' own sources, for the tests that read them (module graph, process-wide state).

use std::path::{Path, PathBuf};

/// `backend/`: the folder of `cudnn-backend`, with `cudnn-backend-core` in `backend/core`.
pub fn backend_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../backend")
}

/// The source folders of both crates, relative to [`backend_dir`]: `src` (`cudnn-backend`:
/// the Burn and Candle adapters, and the engine's modules re-exported at its root) and
/// `core/src` (`cudnn-backend-core`: the engine).
pub const BACKEND_SRCS: [&str; 2] = ["src", "core/src"];

/// Every `.rs` file under `dir`, at any depth, in path order.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}
