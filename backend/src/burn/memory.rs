//! Device buffers behind Burn tensors: allocation, host transfers, per-device set-up.

use std::sync::Arc;

use super::buffer_cache;
use crate::error::{Error, Result};
use crate::ffi::memory::{empty_view, retain_pool_memory, trim_pool, DeviceBuffer};
use crate::runtime;
use crate::types::{DataType, TensorMut, TensorRef};

/// One-time per-device set-up for Burn: keep freed memory in the stream-ordered pool, and
/// start the kernel and cuDNN warm-ups in the background.
pub(crate) fn prepare_device(dev: &Arc<runtime::Device>) -> Result<()> {
    let slot = &super::state().prepared[dev.ordinal()];
    if slot.get().is_none() {
        retain_pool_memory(dev.stream())?;
        // A cuDNN workspace that cannot be allocated may find its memory among our cached
        // tensor buffers (rather than its plan switching to an engine that needs less).
        super::state()
            .releaser
            .call_once(|| runtime::release_cached_memory_on_shortage(buffer_cache::release));
        if slot.set(()).is_ok() && crate::config::config().warm_up {
            crate::ops::warm_up_in_background(dev.clone());
            if let Err(e) = crate::ops::warm_up_cudnn(dev.stream()) {
                tracing::debug!(reason = %e, "cuDNN warm-up not started");
            }
        }
    }
    Ok(())
}

/// Releases the unused memory the device's pool keeps, after freeing the cached tensor
/// buffers and the workspaces of streams that are gone.
pub(crate) fn release_cached_memory(dev: &Arc<runtime::Device>) -> Result<()> {
    buffer_cache::release(dev.ordinal());
    runtime::release_unused_workspaces(dev.ordinal());
    // The dead streams' frees complete in their own order: wait for the whole device.
    dev.context().synchronize()?;
    trim_pool(dev.stream())
}

/// A device allocation shared by every view of one tensor. Freed (stream-ordered, on the
/// device's stream) when the last view drops.
pub(crate) struct Storage {
    buf: Option<DeviceBuffer>,
    bytes: usize,
    device: Arc<runtime::Device>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({} bytes on GPU {})", self.bytes, self.device.ordinal())
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            buffer_cache::give_back(&self.device, buf);
        }
    }
}

impl Storage {
    /// `bytes` of uninitialised memory (no allocation for 0 bytes).
    pub(crate) fn alloc(device: &Arc<runtime::Device>, bytes: usize, op: &'static str) -> Result<Arc<Storage>> {
        if bytes == 0 {
            return Ok(Arc::new(Storage {
                buf: None,
                bytes,
                device: device.clone(),
            }));
        }
        let class = buffer_cache::size_class(bytes);
        let buf = match buffer_cache::take(device, class) {
            Some(buf) => buf,
            None => DeviceBuffer::alloc(device.stream(), class, op).or_else(|e| match e {
                // The cached buffers of other sizes may be what the pool lacks.
                Error::OutOfMemory { .. } => {
                    buffer_cache::release(device.ordinal());
                    DeviceBuffer::alloc(device.stream(), class, op)
                }
                e => Err(e),
            })?,
        };
        Ok(Arc::new(Storage {
            buf: Some(buf),
            bytes,
            device: device.clone(),
        }))
    }

    /// A copy of host bytes.
    pub(crate) fn from_host(device: &Arc<runtime::Device>, data: &[u8], op: &'static str) -> Result<Arc<Storage>> {
        let storage = Self::alloc(device, data.len(), op)?;
        if let Some(buf) = &storage.buf {
            buf.write(data)?;
        }
        Ok(storage)
    }

    /// Copies `len` bytes starting `start` bytes into the buffer to the host (waits for
    /// the stream).
    pub(crate) fn read(&self, start: usize, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        if len == 0 {
            return Ok(out);
        }
        let buf = self
            .buf
            .as_ref()
            .ok_or_else(|| Error::invalid_arg("into_data", "tensor", "empty buffer"))?;
        buf.read(start, &mut out)?;
        Ok(out)
    }

    /// The elements of `dtype` at element `offset` with `dims` and (possibly negative)
    /// element `strides`, checked to lie in the buffer.
    pub(crate) fn view(&self, offset: i64, dims: &[i64], strides: &[i64], dtype: DataType) -> Result<TensorRef<'_>> {
        match &self.buf {
            Some(buf) => buf.view(offset, dims, strides, dtype),
            None => empty_view(dims, strides, dtype).map(|v| TensorRef::clone(&v)),
        }
    }

    /// [`view`](Self::view), writable: for results written into a buffer the op allocated or
    /// owns alone.
    pub(crate) fn view_mut(
        &self,
        offset: i64,
        dims: &[i64],
        strides: &[i64],
        dtype: DataType,
    ) -> Result<TensorMut<'_>> {
        match &self.buf {
            Some(buf) => buf.view_mut(offset, dims, strides, dtype),
            None => empty_view(dims, strides, dtype),
        }
    }

    /// Size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device the memory lives on.
    pub(crate) fn device(&self) -> &Arc<runtime::Device> {
        &self.device
    }
}
