//! Device memory for framework tensors: uninitialised stream-ordered allocations and the
//! CUDA memory-pool settings that make them cheap to repeat.

use std::sync::Arc;

use cudarc::driver::{sys, CudaSlice, CudaStream};

use crate::error::{Error, Result};

/// Allocates `bytes` of uninitialised device memory, ordered on `stream`
/// (`cuMemAllocAsync` when the device supports it). `op` names the caller in the error.
pub(crate) fn alloc_uninit(stream: &Arc<CudaStream>, bytes: usize, op: &'static str) -> Result<CudaSlice<u8>> {
    // SAFETY: the buffer holds plain bytes (every bit pattern is a valid `u8`) and is only
    // reached through the tensor that owns it; like `torch.empty`, its contents are
    // unspecified until a kernel writes them, and no host code reads it before that.
    unsafe { stream.alloc::<u8>(bytes.max(1)) }.map_err(|e| Error::OutOfMemory {
        op,
        bytes,
        message: e.to_string(),
    })
}

/// Keeps freed blocks in the device's default memory pool instead of returning them to
/// the driver at every synchronisation, so a training step's allocations are reused.
pub(crate) fn retain_pool_memory(stream: &Arc<CudaStream>) -> Result<()> {
    let ctx = stream.context();
    ctx.bind_to_thread()?;
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `cu_device()` is the context's device.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release-threshold attribute takes a pointer to a `u64`, which
    // `threshold` is; `pool` was just returned by the driver.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()?;
    Ok(())
}

/// Returns the unused memory of the device's default pool to the driver.
pub(crate) fn trim_pool(stream: &Arc<CudaStream>) -> Result<()> {
    let ctx = stream.context();
    ctx.bind_to_thread()?;
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    stream.synchronize()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: as in `retain_pool_memory`.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
    // SAFETY: `pool` is the device's default pool; trimming to 0 keeps memory that is
    // still in use and releases only free blocks.
    unsafe { sys::cuMemPoolTrimTo(pool, 0) }.result()?;
    Ok(())
}
