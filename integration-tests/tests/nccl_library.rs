//! Loading NCCL: a library the user names that cannot be loaded is an error listing what was
//! searched and how to fix it (never a panic, never another library in its place). The
//! library is loaded once per process, so this binary holds this one test, which points
//! `CUDNN_BACKEND_NCCL_LIB` (through the crate's configuration) at a missing file before
//! anything loads NCCL. (A working library is exercised by `gpu_nccl`.)

use cudnn_backend::collective::{nccl_version, UniqueId};
use cudnn_backend::config::{self, Config};
use cudnn_backend::{Error, NCCL_LIB_ENV};

#[test]
fn a_named_library_that_is_missing_is_an_error_that_says_what_to_do() {
    assert!(config::init(Config {
        nccl_lib: Some("/nonexistent/libnccl.so.2".into()),
        ..Config::from_env()
    }));
    let err = UniqueId::new().expect_err("no NCCL at that path");
    match &err {
        Error::LibraryNotFound { searched, .. } => assert_eq!(searched, &["/nonexistent/libnccl.so.2"]),
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("libnccl (NCCL 2)") && text.contains(NCCL_LIB_ENV),
        "{text}"
    );
    // The failure is remembered, not retried into a panic.
    assert!(nccl_version().is_err());
}
