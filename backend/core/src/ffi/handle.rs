//! A cuDNN handle (`cudnnHandle_t`).

use std::ffi::c_void;

use super::api::api;
use crate::error::Result;

/// A raw cuDNN handle. Deliberately never destroyed: handles live in the process-wide pool
/// and are leaked at exit, because cuDNN must not be called during process termination.
#[derive(Debug)]
pub(crate) struct CudnnHandle {
    raw: *mut c_void,
}

// SAFETY: a cuDNN handle may be used from any thread, one thread at a time; the pool hands
// each handle to exactly one thread at a time.
unsafe impl Send for CudnnHandle {}

impl CudnnHandle {
    /// Creates a handle on the CUDA context current on this thread.
    pub(crate) fn create() -> Result<Self> {
        let api = api()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer is valid; the caller made the device's context current.
        let status = unsafe { (api.create)(&mut raw) };
        api.check(status, "cudnnCreate")?;
        Ok(Self { raw })
    }

    /// Binds `stream` (a `CUstream`) to the handle. (`&self`: the handle is `!Sync`, so only
    /// its one owner can call this.)
    pub(crate) fn set_stream(&self, stream: *mut c_void) -> Result<()> {
        let api = api()?;
        // SAFETY: the handle is live; the stream belongs to the handle's device context.
        let status = unsafe { (api.set_stream)(self.raw, stream) };
        api.check(status, "cudnnSetStream")
    }

    /// The raw handle.
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }
}
