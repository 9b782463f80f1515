//! Loading NCCL: a library the user names that cannot be loaded is an error listing what was
//! searched and how to fix it (never a panic, never another library in its place). With
//! `CUDNN_BACKEND_NCCL_LIB` pointing at a real libnccl (a GPU is not needed), the ignored
//! test checks the version and makes a unique id. One test per process: the library is
//! loaded once per process, so each case sets the variable before anything loads NCCL.

use cudnn_backend::collective::{nccl_version, UniqueId};
use cudnn_backend::{Error, NCCL_LIB_ENV};

#[test]
fn a_named_library_that_is_missing_is_an_error_that_says_what_to_do() {
    if std::env::var_os(NCCL_LIB_ENV).is_some() {
        // The ignored test below runs with the variable set; this case sets its own.
        return;
    }
    std::env::set_var(NCCL_LIB_ENV, "/nonexistent/libnccl.so.2");
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

#[test]
#[ignore = "needs libnccl (CUDNN_BACKEND_NCCL_LIB set to its path)"]
fn a_loaded_library_reports_its_version_and_makes_ids() {
    let (version, path) = nccl_version().expect("NCCL loads");
    assert!(version >= 21700, "NCCL {version} from {path}");
    let (a, b) = (UniqueId::new().unwrap(), UniqueId::new().unwrap());
    assert_ne!(a, b, "two ids must differ");
    assert_eq!(UniqueId::from_hex(&a.to_hex()).unwrap(), a);
}
