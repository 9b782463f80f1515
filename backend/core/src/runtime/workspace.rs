//! Per-(device, stream) growable scratch memory for cuDNN plans, reused across calls.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::{Error, Result};
use crate::types::DeviceAddress;

/// The buffer and its device address (read once, so calls never touch cudarc's event tracking).
type Slot = Arc<Mutex<Option<(CudaSlice<u8>, u64)>>>;

/// The workspaces' part of the [`Engine`](crate::Engine).
pub(crate) struct Workspaces {
    /// By (device ordinal, stream handle).
    slots: OnceLock<Mutex<HashMap<(usize, usize), Slot>>>,
    /// Functions that free device memory a framework keeps cached (Burn's tensor buffers),
    /// called with a device ordinal when a workspace cannot be allocated there.
    cache_releasers: Mutex<Vec<fn(usize)>>,
}

impl Workspaces {
    pub(crate) const fn new() -> Self {
        Workspaces {
            slots: OnceLock::new(),
            cache_releasers: Mutex::new(Vec::new()),
        }
    }
}

fn state() -> &'static Workspaces {
    &crate::engine().workspaces
}

/// Registers `release` (call it once): when a workspace allocation fails on a device, the
/// released memory is offered to it before the allocation is tried again, so a plan keeps its
/// engine (and its results) as long as the memory can be found.
#[doc(hidden)]
pub fn release_cached_memory_on_shortage(release: fn(usize)) {
    state()
        .cache_releasers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(release);
}

/// Frees what the registered caches and the workspaces of gone streams hold on `stream`'s
/// device, and waits for the device so those stream-ordered frees are back in the pool.
fn relieve_shortage(stream: &Arc<CudaStream>) -> Result<()> {
    let ordinal = stream.context().ordinal();
    let releasers = state()
        .cache_releasers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for release in releasers {
        release(ordinal);
    }
    release_unused_workspaces(ordinal);
    stream.context().synchronize()?;
    Ok(())
}

/// `bytes` of zeroed workspace on `stream` (an armed fault injects the failure).
fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<(CudaSlice<u8>, u64)> {
    if let Some(injected) = super::fault::workspace_alloc_fault(bytes) {
        return Err(injected);
    }
    let buf = stream.alloc_zeros::<u8>(bytes).map_err(|e| Error::OutOfMemory {
        op: "cuDNN workspace",
        bytes,
        message: e.to_string(),
    })?;
    let ptr = buf.device_ptr(stream).0;
    Ok((buf, ptr))
}

/// `CU_STREAM_PER_THREAD`: one handle value that names a different stream in every thread
/// (Candle's `Device::new_cuda` uses it). Its buffers are kept per thread: shared, two threads'
/// kernels would use one buffer at once on their two streams.
const PER_THREAD_STREAM: usize = 0x2;

thread_local! {
    /// This thread's per-thread-stream slots by device ordinal. Dropped when the thread exits,
    /// which frees the buffers on that thread's own stream, after its queued work.
    static PER_THREAD: RefCell<HashMap<usize, Slot>> = RefCell::new(HashMap::new());
}

fn slot(stream: &Arc<CudaStream>) -> Slot {
    let ordinal = stream.context().ordinal();
    if stream.cu_stream() as usize == PER_THREAD_STREAM {
        // `try_with` fails only while this thread's locals are being destroyed.
        if let Ok(s) = PER_THREAD.try_with(|m| m.borrow_mut().entry(ordinal).or_default().clone()) {
            return s;
        }
    }
    let key = (ordinal, stream.cu_stream() as usize);
    let mut map = state()
        .slots
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = map.get(&key) {
        return s.clone();
    }
    // A stream seen for the first time: drop the slots of streams no one else holds any
    // more, so programs that create and drop streams do not accumulate workspaces.
    map.retain(|_, s| !orphaned(s));
    map.entry(key).or_default().clone()
}

/// True when only the map holds `slot` and its buffer (if any) holds the last reference to
/// its stream. A buffer keeps its stream alive, so a key with a buffer is never reused by a
/// new stream; an empty slot is cheap to recreate.
fn orphaned(slot: &Slot) -> bool {
    Arc::strong_count(slot) == 1
        && slot
            .try_lock()
            .is_ok_and(|g| g.as_ref().is_none_or(|(b, _)| Arc::strong_count(b.stream()) == 1))
}

/// Runs `f` with the address of at least `bytes` of scratch memory owned by `stream`
/// ([`DeviceAddress::NULL`] when `bytes` is 0). The buffer grows when needed (freed stream-ordered, so work
/// already queued on the stream keeps its old buffer); calls on one stream share it,
/// which is safe because the stream orders their kernels. An allocation that fails is tried
/// once more after the cached memory of the device is released.
pub(crate) fn with_workspace<R>(
    stream: &Arc<CudaStream>,
    bytes: usize,
    f: impl FnOnce(DeviceAddress) -> Result<R>,
) -> Result<R> {
    if bytes == 0 {
        return f(DeviceAddress::NULL);
    }
    let slot = slot(stream);
    let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
    if guard.as_ref().is_none_or(|(b, _)| b.len() < bytes) {
        *guard = None;
        let rounded = bytes.div_ceil(1 << 20) << 20;
        let fresh = match alloc(stream, rounded) {
            Err(Error::OutOfMemory { .. }) => {
                relieve_shortage(stream)?;
                alloc(stream, rounded)?
            }
            other => other?,
        };
        *guard = Some(fresh);
    }
    let ptr = guard.as_ref().map_or(0, |(_, p)| *p);
    f(DeviceAddress::of_allocation(ptr))
}

/// Frees the workspaces of streams that no one else holds any more (threads that exited,
/// streams that were dropped) on device `ordinal`. Slots are otherwise dropped lazily, when a
/// new stream first asks for one; call this before measuring free memory or trimming pools.
/// Returns the bytes released (freed stream-ordered, so they return to the memory pool once
/// the dead streams' last work completes).
pub fn release_unused_workspaces(ordinal: usize) -> usize {
    let Some(map) = state().slots.get() else {
        return 0;
    };
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    let mut released = 0;
    map.retain(|&(dev, _), s| {
        let drop_it = dev == ordinal && orphaned(s);
        if drop_it {
            released += s
                .try_lock()
                .ok()
                .and_then(|g| g.as_ref().map(|(b, _)| b.len()))
                .unwrap_or(0);
        }
        !drop_it
    });
    released
}

/// Bytes of workspace currently held for `stream`.
pub fn workspace_bytes(stream: &Arc<CudaStream>) -> usize {
    slot(stream)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |(b, _)| b.len())
}
