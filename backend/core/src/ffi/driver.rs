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

/// Starts (`true`) or stops (`false`) the collection of a profiler attached to the process
/// (`cuProfilerStart`/`cuProfilerStop`): Nsight Compute started with
/// `--profile-from-start off` profiles only the kernels launched in between. Without a
/// profiler the driver does nothing.
pub(crate) fn profiler_collect(on: bool) -> Result<()> {
    super::check_driver()?;
    // SAFETY: libcuda is loadable (checked above); both calls take no arguments and act on
    // the calling thread's current context, which cudarc makes current for its devices.
    let status = unsafe {
        if on {
            cudarc::driver::sys::cuProfilerStart()
        } else {
            cudarc::driver::sys::cuProfilerStop()
        }
    };
    status.result().map_err(|e| Error::Cuda {
        op: if on { "cuProfilerStart" } else { "cuProfilerStop" },
        message: e.to_string(),
    })
}
