//! Counts of the work the crate enqueues: kernel launches and cuDNN plan executions (each
//! of which may run several kernels inside cuDNN). For profiles such as "launches per
//! training step": read [`launch_counts`] before and after.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static KERNELS: AtomicU64 = AtomicU64::new(0);
static CUDNN: AtomicU64 = AtomicU64::new(0);
static FUSED_FALLBACKS: AtomicU64 = AtomicU64::new(0);
static FUSED_NS: AtomicU64 = AtomicU64::new(0);
static CUDNN_NS: AtomicU64 = AtomicU64::new(0);
static LAUNCH_NS: AtomicU64 = AtomicU64::new(0);
static MEMORY_NS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's share of [`KERNELS`] and [`CUDNN`].
    static THREAD: Cell<LaunchCounts> = const {
        Cell::new(LaunchCounts {
            kernels: 0,
            cudnn_executions: 0,
            fused_fallbacks: 0,
            fused_ns: 0,
            cudnn_ns: 0,
            launch_ns: 0,
            memory_ns: 0,
        })
    };
}

/// Work enqueued by this process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchCounts {
    /// Launches of the crate's own (NVRTC) kernels, memsets included.
    pub kernels: u64,
    /// cuDNN plan executions (graph replays included).
    pub cudnn_executions: u64,
    /// Fused runs of lazy fusion that ran their operations one by one instead (their kernel
    /// still building in the background, or unbuildable); not in [`LaunchCounts::total`].
    pub fused_fallbacks: u64,
    /// Host (wall) nanoseconds spent executing lazy fusion's fused runs (their launches and
    /// leading operations included): where burn-fusion's server thread runs our code.
    pub fused_ns: u64,
    /// Host (wall) nanoseconds spent enqueueing cuDNN plan executions.
    pub cudnn_ns: u64,
    /// Host (wall) nanoseconds spent in the driver's launches of the crate's kernels.
    pub launch_ns: u64,
    /// Host (wall) nanoseconds spent allocating and freeing device buffers.
    pub memory_ns: u64,
}

impl LaunchCounts {
    /// Both counts together.
    pub fn total(&self) -> u64 {
        self.kernels + self.cudnn_executions
    }

    /// The work enqueued between `earlier` and `self`.
    pub fn since(&self, earlier: &LaunchCounts) -> LaunchCounts {
        LaunchCounts {
            kernels: self.kernels - earlier.kernels,
            cudnn_executions: self.cudnn_executions - earlier.cudnn_executions,
            fused_fallbacks: self.fused_fallbacks - earlier.fused_fallbacks,
            fused_ns: self.fused_ns - earlier.fused_ns,
            cudnn_ns: self.cudnn_ns - earlier.cudnn_ns,
            launch_ns: self.launch_ns - earlier.launch_ns,
            memory_ns: self.memory_ns - earlier.memory_ns,
        }
    }
}

/// The counts so far (all threads and devices).
pub fn launch_counts() -> LaunchCounts {
    LaunchCounts {
        kernels: KERNELS.load(Ordering::Relaxed),
        cudnn_executions: CUDNN.load(Ordering::Relaxed),
        fused_fallbacks: FUSED_FALLBACKS.load(Ordering::Relaxed),
        fused_ns: FUSED_NS.load(Ordering::Relaxed),
        cudnn_ns: CUDNN_NS.load(Ordering::Relaxed),
        launch_ns: LAUNCH_NS.load(Ordering::Relaxed),
        memory_ns: MEMORY_NS.load(Ordering::Relaxed),
    }
}

/// The work enqueued by the calling thread so far: unlike [`launch_counts`], launches made
/// meanwhile on other threads (another test, a background build) are not in it.
pub fn thread_launch_counts() -> LaunchCounts {
    THREAD.with(Cell::get)
}

pub(crate) fn count_kernel() {
    KERNELS.fetch_add(1, Ordering::Relaxed);
    THREAD.with(|c| {
        let mut n = c.get();
        n.kernels += 1;
        c.set(n);
    });
}

pub(crate) fn count_cudnn_execution() {
    CUDNN.fetch_add(1, Ordering::Relaxed);
    THREAD.with(|c| {
        let mut n = c.get();
        n.cudnn_executions += 1;
        c.set(n);
    });
}

pub(crate) fn count_fused_fallback() {
    FUSED_FALLBACKS.fetch_add(1, Ordering::Relaxed);
    THREAD.with(|c| {
        let mut n = c.get();
        n.fused_fallbacks += 1;
        c.set(n);
    });
}

/// What a span of host time is added to.
#[derive(Clone, Copy)]
pub(crate) enum HostTime {
    /// Executing a fused run.
    Fused,
    /// Enqueueing a cuDNN plan execution.
    Cudnn,
    /// The driver's launch of one of the crate's kernels.
    Launch,
    /// Allocating or freeing a device buffer.
    Memory,
}

/// Adds the host time since `started` to `what`'s count.
pub(crate) fn add_host_time(what: HostTime, started: std::time::Instant) {
    let ns = started.elapsed().as_nanos() as u64;
    let total = match what {
        HostTime::Fused => &FUSED_NS,
        HostTime::Cudnn => &CUDNN_NS,
        HostTime::Launch => &LAUNCH_NS,
        HostTime::Memory => &MEMORY_NS,
    };
    total.fetch_add(ns, Ordering::Relaxed);
    THREAD.with(|c| {
        let mut n = c.get();
        match what {
            HostTime::Fused => n.fused_ns += ns,
            HostTime::Cudnn => n.cudnn_ns += ns,
            HostTime::Launch => n.launch_ns += ns,
            HostTime::Memory => n.memory_ns += ns,
        }
        c.set(n);
    });
}
