//! CUDA driver queries that `cudarc`'s safe API does not offer.

use crate::error::{Error, Result};

/// The installed driver's CUDA version (e.g. `13000` for 13.0), from `cuDriverGetVersion`.
pub(crate) fn driver_version() -> Result<i32> {
    super::check_driver()?;
    let mut v: std::ffi::c_int = 0;
    // SAFETY: libcuda is loadable (checked above); `v` is valid for one `int` write and the
    // call needs no context or prior cuInit.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    status.result().map_err(|e| Error::Cuda {
        op: "cuDriverGetVersion",
        message: e.to_string(),
    })?;
    Ok(v)
}
