//! Device memory for framework tensors: uninitialised stream-ordered allocations and the
//! CUDA memory-pool settings that make them cheap to repeat.

use std::sync::Arc;

use cudarc::driver::{sys, CudaStream};

use super::counters::{Count, HostTimer};
use crate::error::{Error, Result};
use crate::types::{check_part, DataType, TensorMut, TensorRef};

/// A raw stream-ordered device allocation for framework tensors.
///
/// Unlike `cudarc::driver::CudaSlice` it records no CUDA events: every use of the buffer is
/// ordered on the one stream it was allocated on (the device stream that all framework ops
/// use), so allocation and release are one driver call each (`cuMemAllocAsync` /
/// `cuMemFreeAsync`), which matters for frameworks that create thousands of tensors a step.
#[doc(hidden)]
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    stream: Arc<CudaStream>,
}

impl DeviceBuffer {
    /// `bytes` (> 0) of uninitialised memory, ordered on `stream`. `op` names the caller.
    #[doc(hidden)]
    pub fn alloc(stream: &Arc<CudaStream>, bytes: usize, op: &'static str) -> Result<Self> {
        let _timer = HostTimer::start(Count::MemoryNs);
        let ctx = stream.context();
        ctx.bind_to_thread()?;
        let oom = |e: cudarc::driver::DriverError| Error::OutOfMemory {
            op,
            bytes,
            message: e.to_string(),
        };
        let ptr = if ctx.has_async_alloc() {
            // SAFETY: the context is current on this thread and `cu_stream()` is a live stream
            // of it; the returned memory is plain bytes, only reached through this buffer, and
            // (like `torch.empty`) unspecified until a kernel writes it.
            unsafe { cudarc::driver::result::malloc_async(stream.cu_stream(), bytes.max(1)) }.map_err(oom)?
        } else {
            // SAFETY: as above, with a synchronous allocation.
            unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }.map_err(oom)?
        };
        Ok(Self {
            ptr,
            bytes,
            stream: stream.clone(),
        })
    }

    /// Copies `data` to the start of the buffer, ordered on its stream.
    #[doc(hidden)]
    pub fn write(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.bytes {
            return Err(Error::invalid_arg(
                "write",
                "data",
                format!("{} bytes exceed the {}-byte buffer", data.len(), self.bytes),
            ));
        }
        self.stream.context().bind_to_thread()?;
        // SAFETY: the buffer holds at least `data.len()` bytes (checked above); the copy is
        // ordered on the buffer's stream, and a copy from pageable host memory returns only
        // once `data` has been consumed, so `data` may be dropped afterwards.
        unsafe { cudarc::driver::result::memcpy_htod_async(self.ptr, data, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Size in bytes.
    #[doc(hidden)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies `out.len()` bytes starting `start` bytes into the buffer to the host, after
    /// all work queued on the stream, and waits for them.
    #[doc(hidden)]
    pub fn read(&self, start: usize, out: &mut [u8]) -> Result<()> {
        if start + out.len() > self.bytes {
            return Err(Error::invalid_arg(
                "read",
                "range",
                format!("{start}+{} exceeds the {}-byte buffer", out.len(), self.bytes),
            ));
        }
        self.stream.context().bind_to_thread()?;
        // SAFETY: the source range lies inside this allocation (checked above) and `out` is
        // a writable host slice of exactly the copied length; the stream is synchronised
        // before `out` is used.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(out, self.ptr + start as u64, self.stream.cu_stream()) }?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// Device address of the first byte.
    #[doc(hidden)]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The buffer's address as a launcher argument.
    pub(crate) fn address(&self) -> crate::types::DeviceAddress {
        crate::types::DeviceAddress::of_allocation(self.ptr)
    }

    /// Elements of `dtype` at element `offset` from the start of the buffer with `dims` and
    /// (possibly negative) element `strides`: a view checked to stay inside the buffer.
    #[doc(hidden)]
    pub fn view(&self, offset: i64, dims: &[i64], strides: &[i64], dtype: DataType) -> Result<TensorRef<'_>> {
        let ptr = self.part(offset, dims, strides, dtype)?;
        // SAFETY: every element of the part lies in the buffer (checked by `part`), which owns
        // its bytes until it drops and then frees them ordered on its stream, after the work
        // queued there.
        Ok(unsafe { TensorRef::from_raw(dims, strides, dtype, ptr) })
    }

    /// [`view`](Self::view), writable. The buffer's owner decides who writes it: framework
    /// tensors write only buffers they allocated for the result or own alone.
    #[doc(hidden)]
    pub fn view_mut(&self, offset: i64, dims: &[i64], strides: &[i64], dtype: DataType) -> Result<TensorMut<'_>> {
        let ptr = self.part(offset, dims, strides, dtype)?;
        // SAFETY: as in `view`; the memory is the device's, written only by work on its stream.
        Ok(unsafe { TensorMut::from_raw(dims, strides, dtype, ptr) })
    }

    /// The address of element `(0, …, 0)` of a part of the buffer, after checking that every
    /// element of the part lies in it (whole elements from the start, which is aligned to at
    /// least 256 bytes).
    fn part(&self, offset: i64, dims: &[i64], strides: &[i64], dtype: DataType) -> Result<u64> {
        let n = (self.bytes / dtype.size()) as i64;
        check_part((n > 0).then_some((0, n - 1)), offset, dims, strides, dtype)
            .map_err(|reason| Error::invalid_arg("view", "dims", reason + &format!("a buffer of {n} elements")))?;
        Ok((self.ptr as i64).wrapping_add(offset.wrapping_mul(dtype.size() as i64)) as u64)
    }
}

/// A view with no elements (of a tensor that has no buffer): an error unless some dim is 0.
#[doc(hidden)]
pub fn empty_view(dims: &[i64], strides: &[i64], dtype: DataType) -> Result<TensorMut<'static>> {
    if !dims.contains(&0) {
        return Err(Error::invalid_arg(
            "view",
            "dims",
            format!("{dims:?} has elements but the buffer is empty"),
        ));
    }
    // SAFETY: a view with no elements reaches no memory.
    let view = unsafe { TensorMut::from_raw(dims, strides, dtype, 0) };
    Ok(view)
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _timer = HostTimer::start(Count::MemoryNs);
        let ctx = self.stream.context();
        if ctx.bind_to_thread().is_err() {
            return;
        }
        if ctx.has_async_alloc() {
            // SAFETY: `ptr` came from `malloc_async` and is freed once; the free is ordered
            // after every kernel queued on the stream that may still read or write it.
            let _ = unsafe { cudarc::driver::result::free_async(self.ptr, self.stream.cu_stream()) };
        } else {
            let _ = self.stream.synchronize();
            // SAFETY: `ptr` came from `malloc_sync`, is freed once, and no queued work uses it.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
    }
}

/// Keeps freed blocks in the device's default memory pool instead of returning them to
/// the driver at every synchronisation, so a training step's allocations are reused.
#[doc(hidden)]
pub fn retain_pool_memory(stream: &Arc<CudaStream>) -> Result<()> {
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
#[doc(hidden)]
pub fn trim_pool(stream: &Arc<CudaStream>) -> Result<()> {
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

/// The GPU other than `here` whose device memory `ptr` points into, if any. With one GPU
/// visible no pointer can be on another, and the driver query (about a microsecond per
/// operand of every op) is skipped.
pub(crate) fn on_another_gpu(ptr: u64, here: usize) -> Option<usize> {
    // The driver's count (the FFI layer sits below `runtime`, whose `device_count` wraps it).
    static VISIBLE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    if *VISIBLE.get_or_init(|| cudarc::driver::CudaContext::device_count().unwrap_or(0)) <= 1 {
        return None;
    }
    device_memory_ordinal(ptr).filter(|&there| there != here)
}

/// The GPU whose device memory `ptr` points into; `None` for host, managed or unknown
/// addresses (memory every GPU may reach, or that the driver does not know).
pub(crate) fn device_memory_ordinal(ptr: u64) -> Option<usize> {
    let mut memory_type: u32 = 0;
    let mut ordinal: i32 = -1;
    let mut managed: u32 = 0;
    let mut attributes = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    ];
    let mut data = [
        (&mut memory_type as *mut u32).cast::<std::ffi::c_void>(),
        (&mut ordinal as *mut i32).cast::<std::ffi::c_void>(),
        (&mut managed as *mut u32).cast::<std::ffi::c_void>(),
    ];
    // SAFETY: `attributes` and `data` have 3 entries each; every data slot is a live 4-byte
    // local of the width the driver writes for its attribute (a bool in a zeroed u32 is
    // read correctly); for an address the driver does not know it writes defaults and
    // returns success instead of reading anything.
    let status = unsafe { sys::cuPointerGetAttributes(3, attributes.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    (status == sys::CUresult::CUDA_SUCCESS && memory_type == device && managed == 0 && ordinal >= 0)
        .then_some(ordinal as usize)
}
