//! The FFI layer: the only place in the crate with `unsafe` code.
//!
//! cuDNN is loaded at run time through [`libloading`] (never linked), with our own
//! function table so that a missing library or symbol is an [`Error`](crate::Error)
//! instead of a panic, and so that status codes newer than our bindings are read as
//! plain integers. NVRTC and NCCL get the same treatment ([`nvrtc`], [`nccl`]). The CUDA driver is reached through
//! `cudarc`, after [`check_driver`] has checked that it can be loaded ([`probe`]).

mod api;
#[doc(hidden)]
pub mod counters;
mod descriptor;
pub(crate) mod driver;
mod handle;
#[doc(hidden)]
pub mod launch;
pub(crate) mod launch_attention;
pub(crate) mod launch_batch_norm;
pub(crate) mod launch_conv;
pub(crate) mod launch_cross_entropy;
pub(crate) mod launch_ctc;
pub(crate) mod launch_elementwise;
pub(crate) mod launch_fused;
pub(crate) mod launch_index;
pub(crate) mod launch_linalg;
pub(crate) mod launch_norm;
#[doc(hidden)]
pub mod launch_optim;
pub(crate) mod launch_pool;
pub(crate) mod launch_random;
pub(crate) mod launch_reduce;
pub(crate) mod launch_resize;
pub(crate) mod launch_sort;
pub(crate) mod legacy;
#[doc(hidden)]
pub mod memory;
pub(crate) mod nccl;
pub(crate) mod nvrtc;
mod probe;
pub(crate) mod replay;
#[doc(hidden)]
pub mod uninit;

pub(crate) use api::{api, can_load, cudnn_version};
pub use api::{CUDNN_LIB_ENV, CUDNN_LIB_NAMES};
pub(crate) use descriptor::Descriptor;
pub(crate) use handle::CudnnHandle;
pub use nccl::{NCCL_LIB_ENV, NCCL_LIB_NAMES};
pub use probe::{check_driver, check_nvrtc};

/// The first of `names` the dynamic loader opens, with the name that worked. Used for
/// libraries whose initialisers have no preconditions (cuDNN, NCCL).
pub(crate) fn open_first(names: &[String]) -> Option<(libloading::Library, String)> {
    names.iter().find_map(|name| {
        // SAFETY: loading cuDNN or NCCL runs their initialisers, which have no preconditions.
        unsafe { libloading::Library::new(name) }
            .ok()
            .map(|lib| (lib, name.clone()))
    })
}

/// cuDNN enums re-exported from `cudarc`'s bindings (values only: every call goes through
/// our own loader).
pub(crate) use cudarc::cudnn::sys as cudnn_sys;
