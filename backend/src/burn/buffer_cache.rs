//! Freed tensor buffers kept for reuse, per device and size class, so a training step's
//! allocations and frees (hundreds per step) cost a lock and a vector push or pop instead of
//! a driver call each, as PyTorch's caching allocator does.
//!
//! Safe because every Burn tensor of a device is read and written only by work ordered on
//! that device's one stream: a buffer handed out again is written after everything queued
//! before its release, exactly as the stream-ordered pool would reuse it. The cache holds at
//! most [`limit_bytes`]; above it, and on [`release`] (Burn's `memory_cleanup`) and before an
//! allocation that failed is retried, buffers go back to the pool.
//!
//! A request gets the free buffer of its class at the lowest address, so which buffer a
//! tensor gets depends on the set of buffers freed before it, not on the order they were
//! freed in (burn-autodiff drops a step's graph in hash-map order): a training step then
//! sees the same addresses at every step, and cuDNN executions with a repeated pointer set
//! run from captured CUDA graphs (`plan::engine::execute`).

use std::collections::HashMap;

use crate::ffi::memory::DeviceBuffer;
use crate::runtime;

/// Free buffers of one device by size class (each list in descending address order), and
/// their total size.
#[derive(Default)]
pub(super) struct Cache {
    free: HashMap<usize, Vec<DeviceBuffer>>,
    bytes: usize,
}

/// The allocation size of a request: whole 512-byte units below 1 MiB, whole 64 KiB units
/// above, so tensors of nearby sizes share buffers while at most 1/16 of a buffer is unused.
/// Always a multiple of 16 bytes (kernels may touch the aligned word around a narrow element
/// and vectorized paths read 16 bytes at a time).
pub(crate) fn size_class(bytes: usize) -> usize {
    if bytes < 1 << 20 {
        bytes.max(1).next_multiple_of(512)
    } else {
        bytes.next_multiple_of(64 << 10)
    }
}

/// The per-device cap in bytes: `CUDNN_BACKEND_BUFFER_CACHE_MIB` MiB (`0` turns the cache
/// off; [`Config::buffer_cache_mib`](crate::config::Config::buffer_cache_mib)), by default a
/// quarter of the device's memory.
fn limit_bytes(dev: &runtime::Device) -> usize {
    match crate::config::config().buffer_cache_mib {
        Some(mib) => mib << 20,
        None => dev.info().total_memory / 4,
    }
}

/// A cached buffer of exactly `class` bytes for `dev`'s stream, if one is free: the one at
/// the lowest address.
pub(crate) fn take(dev: &runtime::Device, class: usize) -> Option<DeviceBuffer> {
    let mut guard = super::state().buffer_caches[dev.ordinal()]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let cache = guard.as_mut()?;
    let buf = cache.free.get_mut(&class)?.pop()?;
    cache.bytes -= class;
    Some(buf)
}

/// Keeps `buf` (allocated by [`take`]'s caller with [`size_class`]) for reuse, or frees it
/// when the cache is full.
pub(crate) fn give_back(dev: &runtime::Device, buf: DeviceBuffer) {
    let class = buf.bytes();
    let limit = limit_bytes(dev);
    let mut guard = super::state().buffer_caches[dev.ordinal()]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let cache = guard.get_or_insert_with(Cache::default);
    if cache.bytes + class > limit {
        drop(guard);
        drop(buf);
        return;
    }
    cache.bytes += class;
    let list = cache.free.entry(class).or_default();
    let at = list.partition_point(|b| b.ptr() > buf.ptr());
    list.insert(at, buf);
}

/// Frees every cached buffer of device `ordinal` (stream-ordered; the pool keeps the memory
/// until it is trimmed).
pub(crate) fn release(ordinal: usize) {
    let freed = super::state().buffer_caches[ordinal]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    drop(freed);
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_round_up_to_whole_units() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class((1 << 20) - 1), 1 << 20);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (64 << 10));
        for bytes in [3, 100, 4097, 3 << 20, (7 << 20) + 5] {
            let class = size_class(bytes);
            assert!(class >= bytes && class.is_multiple_of(16));
            assert!(class - bytes < (64 << 10).max(bytes / 16 + 512));
        }
    }
}
