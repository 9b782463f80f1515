//! Probing the shared libraries before any `cudarc` call (which would panic on a missing
//! library), so a machine without a GPU, a driver or NVRTC gets a clear [`Error`].

use std::sync::OnceLock;

use crate::error::{Error, Result};

fn first_loadable(names: &[String]) -> Option<String> {
    names.iter().find(|n| super::can_load(n)).cloned()
}

/// The file names cudarc's loader tries for `lib` (the same list as
/// `cudarc::get_lib_name_candidates`, which exists only when cudarc loads libraries at run
/// time: with the `candle-cuda` feature, Candle makes cudarc link them instead).
fn lib_name_candidates(lib: &str) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX as P, DLL_SUFFIX as S};
    let w = usize::BITS;
    let (major, minor) = (13, 0); // the workspace's `cuda-13000` feature
    vec![
        format!("{P}{lib}{S}"),
        format!("{P}{lib}{w}{S}"),
        format!("{P}{lib}{w}_{major}{S}"),
        format!("{P}{lib}{w}_{major}{minor}{S}"),
        format!("{P}{lib}{w}_{major}{minor}_0{S}"),
        format!("{P}{lib}{w}_{major}0_{minor}{S}"),
        format!("{P}{lib}{w}_10{S}"),
        format!("{P}{lib}{w}_11{S}"),
        format!("{P}{lib}{w}_12{S}"),
        format!("{P}{lib}{w}_{major}0_0{S}"),
        format!("{P}{lib}{w}_9{S}"),
        format!("{P}{lib}{S}.{major}"),
        format!("{P}{lib}{S}.12"),
        format!("{P}{lib}{S}.11"),
        format!("{P}{lib}{S}.10"),
        format!("{P}{lib}{S}.9"),
        format!("{P}{lib}{S}.1"),
    ]
}

fn probe(
    lib: &'static str,
    cache: &'static OnceLock<std::result::Result<String, Vec<String>>>,
) -> std::result::Result<String, Vec<String>> {
    cache
        .get_or_init(|| {
            let mut names = lib_name_candidates(lib);
            let mut seen = std::collections::HashSet::new();
            names.retain(|n| seen.insert(n.clone()));
            first_loadable(&names).ok_or(names)
        })
        .clone()
}

/// Checks that the NVIDIA driver library (libcuda) can be loaded; returns the name that loaded.
pub fn check_driver() -> Result<String> {
    static CACHE: OnceLock<std::result::Result<String, Vec<String>>> = OnceLock::new();
    probe("cuda", &CACHE).map_err(|searched| Error::LibraryNotFound {
        library: "libcuda (NVIDIA driver)",
        searched,
        hint: "this machine has no NVIDIA driver: install the NVIDIA driver (CUDA 12+ capable) \
               or run on a machine with an NVIDIA GPU; CPU-only code paths keep working",
    })
}

/// Checks that NVRTC (libnvrtc) can be loaded; returns the name that loaded.
pub fn check_nvrtc() -> Result<String> {
    static CACHE: OnceLock<std::result::Result<String, Vec<String>>> = OnceLock::new();
    probe("nvrtc", &CACHE).map_err(|searched| Error::LibraryNotFound {
        library: "libnvrtc (CUDA runtime compiler)",
        searched,
        hint: "install the CUDA toolkit's NVRTC (e.g. the PyPI wheel nvidia-cuda-nvrtc) and add \
               its lib directory to LD_LIBRARY_PATH",
    })
}
