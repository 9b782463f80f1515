//! Thread-pooled, per-device handle manager.
//!
//! Stateful GPU libraries such as cuDNN keep their state in *handles* that are tied to one device
//! and must not be used by two host threads at once. Creating a handle is expensive (tens of
//! milliseconds cold), so creating one per call is out of the question, and creating one per
//! thread wastes handles when programs spawn short-lived threads.
//!
//! [`DeviceThreadHandlePool`] hands out handles on demand:
//!
//! * Per device the pool keeps a `created` count and an `available` stack, all devices behind a
//!   single mutex.
//! * Per thread, a thread-local *window* caches the handle this thread uses for each
//!   (pool, device), so the hot path ([`DeviceThreadHandlePool::with_handle`] on a thread that
//!   already owns a handle) takes no lock at all.
//! * When a thread exits, its window gives its handles back to their pools' `available` stacks,
//!   where the next thread picks them up. The number of handles per device is therefore bounded
//!   by the high-water mark of concurrently active threads using that device.
//! * There is deliberately **no cap** on the number of handles: a cap can deadlock threads that
//!   synchronize with each other while each holds a handle.
//! * The very first handle of each device is created while no other creation for that device
//!   runs (library one-time initialization must not be raced); later creations run outside the
//!   pool mutex, in parallel.
//! * The stream last bound to each handle travels with the handle; `bind_stream` is called only
//!   when the caller's stream differs from it.
//!
//! # Handles are never destroyed
//!
//! [`HandleKind`] has no destroy function on purpose. Handles live until the process ends and are
//! then leaked: the library must not be called during process termination, when the driver may
//! already be shutting down. Concretely, the pool never drops a `K::Handle`: when a pool is
//! dropped, the handles in its `available` stacks are leaked with [`std::mem::forget`], and when
//! a thread exits after its pool is gone, the handles in its window are leaked the same way.
//! Handle types should therefore not rely on `Drop` to release resources.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

/// A kind of per-device handle the pool manages (for example cuDNN handles).
///
/// Implementations must be cheap to share between threads; `create` and `bind_stream` may be
/// called concurrently from several threads (except for the first `create` of each device, which
/// runs alone).
pub trait HandleKind: Send + Sync + 'static {
    /// Per-handle state (for cuDNN: the `cudnnHandle_t` plus the plans built on it).
    type Handle: Send + 'static;
    /// The stream type bound to a handle (for cuDNN: a raw `CUstream` as `usize`). Compared with
    /// the stream last bound to a handle to skip re-binding.
    type Stream: Copy + PartialEq + Send + 'static;
    /// Error returned by `create` and `bind_stream`; propagated unchanged by the pool.
    type Error: Send + 'static;
    /// Creates a new handle on `device`. Called with no pool lock held; must not call back into
    /// the pool for the same device (the first creation of a device would wait on itself).
    fn create(&self, device: usize) -> Result<Self::Handle, Self::Error>;
    /// Binds `stream` to `handle` (for cuDNN: `cudnnSetStream`).
    fn bind_stream(&self, handle: &mut Self::Handle, stream: Self::Stream) -> Result<(), Self::Error>;
}

/// Per-device counters returned by [`DeviceThreadHandlePool::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicePoolStats {
    /// Device ordinal.
    pub device: usize,
    /// Handles created on this device so far (including one being created right now).
    pub created: usize,
    /// Handles currently sitting in the pool's `available` stack (not owned by any thread).
    pub available: usize,
    /// Number of slow-path acquisitions (taken from `available` or newly created) on this device.
    pub checkouts: u64,
}

/// Snapshot of a pool's counters, returned by [`DeviceThreadHandlePool::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Total handles created over all devices.
    pub created: usize,
    /// Total handles in `available` stacks over all devices.
    pub available: usize,
    /// Per-device counters, sorted by device ordinal.
    pub devices: Vec<DevicePoolStats>,
}

/// A handle plus the stream last bound to it; this is what the pool and the windows store.
struct Slot<K: HandleKind> {
    handle: K::Handle,
    /// `None` before the first bind or after a failed bind (state unknown: rebind next time).
    last_stream: Option<K::Stream>,
}

/// State of the one-time first creation on a device.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum FirstCreate {
    /// No handle has been created successfully on this device yet, and none is being created.
    #[default]
    NotStarted,
    /// The first creation is running; other threads wanting this device wait.
    InProgress,
    /// At least one handle exists: further creations run in parallel.
    Done,
}

struct DeviceSlot<K: HandleKind> {
    created: usize,
    available: Vec<Box<Slot<K>>>,
    first: FirstCreate,
    checkouts: u64,
}

impl<K: HandleKind> Default for DeviceSlot<K> {
    fn default() -> Self {
        Self {
            created: 0,
            available: Vec::new(),
            first: FirstCreate::NotStarted,
            checkouts: 0,
        }
    }
}

/// State shared by a pool and (weakly) by every thread window holding its handles.
struct Shared<K: HandleKind> {
    id: u64,
    kind: K,
    devices: Mutex<HashMap<usize, DeviceSlot<K>>>,
    /// Signalled when a device's first creation finishes (successfully or not).
    first_done: Condvar,
}

/// Type-erased view of a pool, used by thread windows (`thread_local!` cannot be generic).
trait ErasedPool: Send + Sync {
    /// Gives a handle (a `Box<Slot<K>>` erased to `Any`) back to the `available` stack.
    fn give_back_erased(&self, device: usize, slot: Box<dyn Any + Send>);
}

impl<K: HandleKind> ErasedPool for Shared<K> {
    fn give_back_erased(&self, device: usize, slot: Box<dyn Any + Send>) {
        match slot.downcast::<Slot<K>>() {
            Ok(slot) => self.give_back(device, slot),
            // Cannot happen (entries are keyed by pool id); never drop a handle regardless.
            Err(other) => std::mem::forget(other),
        }
    }
}

impl<K: HandleKind> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, DeviceSlot<K>>> {
        self.devices.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, device: usize, slot: Box<Slot<K>>) {
        self.lock().entry(device).or_default().available.push(slot);
    }

    /// Takes a handle from `available`, or creates one. Never holds the lock while creating,
    /// except that the first creation on a device makes other callers for that device wait.
    fn checkout(&self, device: usize) -> Result<Box<Slot<K>>, K::Error> {
        let mut devices = self.lock();
        loop {
            let slot = devices.entry(device).or_default();
            if let Some(handle) = slot.available.pop() {
                slot.checkouts += 1;
                return Ok(handle);
            }
            match slot.first {
                FirstCreate::InProgress => {
                    devices = self.first_done.wait(devices).unwrap_or_else(|e| e.into_inner());
                }
                first => {
                    let is_first = first == FirstCreate::NotStarted;
                    if is_first {
                        slot.first = FirstCreate::InProgress;
                    }
                    slot.created += 1;
                    slot.checkouts += 1;
                    drop(devices);
                    let mut reservation = CreateReservation {
                        shared: self,
                        device,
                        is_first,
                        succeeded: false,
                    };
                    let handle = self.kind.create(device)?;
                    reservation.succeeded = true;
                    return Ok(Box::new(Slot {
                        handle,
                        last_stream: None,
                    }));
                }
            }
        }
    }
}

/// Finishes a creation started by `checkout`: on failure (error or panic) it takes back the
/// `created` reservation; for a first creation it records the outcome and wakes waiters.
struct CreateReservation<'a, K: HandleKind> {
    shared: &'a Shared<K>,
    device: usize,
    is_first: bool,
    succeeded: bool,
}

impl<K: HandleKind> Drop for CreateReservation<'_, K> {
    fn drop(&mut self) {
        let mut devices = self.shared.lock();
        let slot = devices.entry(self.device).or_default();
        if !self.succeeded {
            slot.created = slot.created.saturating_sub(1);
        }
        if self.is_first {
            slot.first = if self.succeeded {
                FirstCreate::Done
            } else {
                FirstCreate::NotStarted
            };
            drop(devices);
            self.shared.first_done.notify_all();
        }
    }
}

impl<K: HandleKind> Drop for Shared<K> {
    fn drop(&mut self) {
        // Never destroy handles: leak whatever is still pooled (see module docs).
        let devices = self.devices.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, slot) in devices.drain() {
            for handle in slot.available {
                std::mem::forget(handle);
            }
        }
    }
}

/// One cached handle of the current thread.
struct WindowEntry {
    pool_id: u64,
    device: usize,
    /// `None` while the handle is lent out to a running `with_handle` call on this thread.
    slot: Option<Box<dyn Any + Send>>,
    pool: Weak<dyn ErasedPool>,
}

/// The per-thread cache of handles; its destructor returns them to their pools.
struct Window {
    entries: RefCell<Vec<WindowEntry>>,
}

impl Drop for Window {
    fn drop(&mut self) {
        for entry in self.entries.get_mut().drain(..) {
            if let Some(slot) = entry.slot {
                match entry.pool.upgrade() {
                    Some(pool) => pool.give_back_erased(entry.device, slot),
                    // Pool gone (process teardown): leak, never destroy.
                    None => std::mem::forget(slot),
                }
            }
        }
    }
}

thread_local! {
    static WINDOW: Window = const {
        Window {
            entries: RefCell::new(Vec::new()),
        }
    };
}

/// Where a lent handle goes when the call that borrowed it ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Home {
    /// Back into this thread's window entry (the normal case).
    Window,
    /// Back into the pool's `available` stack (nested use, or no thread-local storage).
    Pool,
}

/// Owns a handle for the duration of one `with_handle` call and puts it back on drop, including
/// when the closure panics, so a handle is never lost nor owned twice.
struct Lease<'a, K: HandleKind> {
    shared: &'a Arc<Shared<K>>,
    device: usize,
    slot: Option<Box<Slot<K>>>,
    home: Home,
}

impl<K: HandleKind> Drop for Lease<'_, K> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let slot = if self.home == Home::Window {
            match put_back_in_window(self.shared.id, self.device, slot) {
                Ok(()) => return,
                Err(slot) => slot,
            }
        } else {
            slot
        };
        self.shared.give_back(self.device, slot);
    }
}

/// Puts `slot` back into this thread's (empty) window entry for (pool, device). Hands the slot
/// back if that is impossible (thread-local storage destroyed, entry missing or occupied).
fn put_back_in_window<S: Any + Send>(pool_id: u64, device: usize, slot: Box<S>) -> Result<(), Box<S>> {
    let mut slot = Some(slot);
    let _ = WINDOW.try_with(|window| {
        if let Ok(mut entries) = window.entries.try_borrow_mut() {
            if let Some(entry) = entries
                .iter_mut()
                .find(|e| e.pool_id == pool_id && e.device == device && e.slot.is_none())
            {
                if let Some(s) = slot.take() {
                    entry.slot = Some(s);
                }
            }
        }
    });
    match slot {
        None => Ok(()),
        Some(s) => Err(s),
    }
}

/// Result of looking up this thread's window.
enum WindowLookup<K: HandleKind> {
    /// The thread's cached handle, now lent to the caller.
    Owned(Box<Slot<K>>),
    /// The thread has an entry but its handle is in use (nested call).
    Busy,
    /// No entry for this (pool, device) yet.
    Missing,
    /// Thread-local storage unavailable (thread teardown) or window busy.
    Unavailable,
}

/// A pool of per-device handles shared by all threads of the process.
///
/// Typically stored once per process, e.g. in a `static OnceLock<DeviceThreadHandlePool<K>>`.
/// See the [module documentation](self) for the design; handles are never destroyed.
pub struct DeviceThreadHandlePool<K: HandleKind> {
    shared: Arc<Shared<K>>,
}

impl<K: HandleKind> DeviceThreadHandlePool<K> {
    /// Creates an empty pool that creates handles with `kind`.
    pub fn new(kind: K) -> Self {
        Self {
            shared: Arc::new(Shared {
                id: crate::engine().next_pool_id.fetch_add(1, Ordering::Relaxed),
                kind,
                devices: Mutex::new(HashMap::new()),
                first_done: Condvar::new(),
            }),
        }
    }

    /// The handle kind this pool creates handles with.
    pub fn kind(&self) -> &K {
        &self.shared.kind
    }

    /// Runs `f` with a handle for `device` bound to `stream`, exclusively owned by this call.
    ///
    /// The hot path (this thread already owns a handle for `device`) takes no lock. Otherwise a
    /// handle is taken from the pool or created; it then stays cached in this thread until the
    /// thread exits. `bind_stream` runs only when `stream` differs from the stream last bound to
    /// the handle. Nested calls on the same device (from inside `f`) get a second handle, taken
    /// from the pool and returned to it afterwards. If `f` panics, the handle is returned before
    /// the panic propagates. Errors from `create` and `bind_stream` are returned unchanged; the
    /// pool stays consistent.
    pub fn with_handle<R>(
        &self,
        device: usize,
        stream: K::Stream,
        f: impl FnOnce(&mut K::Handle) -> R,
    ) -> Result<R, K::Error> {
        let shared = &self.shared;
        let (slot, home) = match self.lookup_window(device) {
            WindowLookup::Owned(slot) => (slot, Home::Window),
            WindowLookup::Busy | WindowLookup::Unavailable => (shared.checkout(device)?, Home::Pool),
            WindowLookup::Missing => {
                let slot = shared.checkout(device)?;
                (slot, self.register_in_window(device))
            }
        };
        let mut lease = Lease {
            shared,
            device,
            slot: None,
            home,
        };
        let slot = lease.slot.insert(slot);
        if slot.last_stream != Some(stream) {
            slot.last_stream = None;
            shared.kind.bind_stream(&mut slot.handle, stream)?;
            slot.last_stream = Some(stream);
        }
        Ok(f(&mut slot.handle))
    }

    /// Handles created so far on `device` (by all threads; never decreases except after a failed
    /// creation).
    pub fn created(&self, device: usize) -> usize {
        self.shared.lock().get(&device).map_or(0, |s| s.created)
    }

    /// Handles of `device` currently in the pool's `available` stack (not owned by a thread).
    pub fn available(&self, device: usize) -> usize {
        self.shared.lock().get(&device).map_or(0, |s| s.available.len())
    }

    /// Snapshot of all counters.
    pub fn stats(&self) -> PoolStats {
        let devices = self.shared.lock();
        let mut per_device: Vec<DevicePoolStats> = devices
            .iter()
            .map(|(&device, s)| DevicePoolStats {
                device,
                created: s.created,
                available: s.available.len(),
                checkouts: s.checkouts,
            })
            .collect();
        drop(devices);
        per_device.sort_by_key(|d| d.device);
        PoolStats {
            created: per_device.iter().map(|d| d.created).sum(),
            available: per_device.iter().map(|d| d.available).sum(),
            devices: per_device,
        }
    }

    /// Looks up this thread's cached handle for (this pool, `device`), taking it out if free.
    fn lookup_window(&self, device: usize) -> WindowLookup<K> {
        let id = self.shared.id;
        WINDOW
            .try_with(|window| {
                let Ok(mut entries) = window.entries.try_borrow_mut() else {
                    return WindowLookup::Unavailable;
                };
                let Some(entry) = entries.iter_mut().find(|e| e.pool_id == id && e.device == device) else {
                    return WindowLookup::Missing;
                };
                match entry.slot.take() {
                    None => WindowLookup::Busy,
                    Some(any) => match any.downcast::<Slot<K>>() {
                        Ok(slot) => WindowLookup::Owned(slot),
                        Err(other) => {
                            // Cannot happen (ids are unique per pool); keep the entry intact.
                            entry.slot = Some(other);
                            WindowLookup::Unavailable
                        }
                    },
                }
            })
            .unwrap_or(WindowLookup::Unavailable)
    }

    /// Adds an (empty, in-use) entry for (this pool, `device`) to this thread's window and says
    /// where the lent handle must go afterwards. Also drops entries of pools that no longer exist
    /// (leaking their handles).
    fn register_in_window(&self, device: usize) -> Home {
        let id = self.shared.id;
        let weak: Weak<dyn ErasedPool> = {
            let w: Weak<Shared<K>> = Arc::downgrade(&self.shared);
            w
        };
        WINDOW
            .try_with(|window| {
                let Ok(mut entries) = window.entries.try_borrow_mut() else {
                    return Home::Pool;
                };
                if entries.iter().any(|e| e.pool_id == id && e.device == device) {
                    // Created meanwhile by a re-entrant call from `create`: do not replace it.
                    return Home::Pool;
                }
                entries.retain_mut(|e| {
                    if e.pool.strong_count() > 0 {
                        return true;
                    }
                    if let Some(slot) = e.slot.take() {
                        std::mem::forget(slot);
                    }
                    false
                });
                entries.push(WindowEntry {
                    pool_id: id,
                    device,
                    slot: None,
                    pool: weak,
                });
                Home::Window
            })
            .unwrap_or(Home::Pool)
    }
}

impl<K: HandleKind + std::fmt::Debug> std::fmt::Debug for DeviceThreadHandlePool<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceThreadHandlePool")
            .field("kind", &self.shared.kind)
            .field("stats", &self.stats())
            .finish()
    }
}
