//! The crate's own sources, for the tests that read them (module graph, process-wide state).

use std::path::{Path, PathBuf};

/// `backend/src`: the sources of `cudnn-backend`.
pub fn backend_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../backend/src")
}

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
