//! Counts of the work the crate enqueues: kernel launches and cuDNN plan executions (each
//! of which may run several kernels inside cuDNN). For profiles such as "launches per
//! training step": read [`launch_counts`] before and after.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One counted quantity: an index into [`totals`] and each thread's share.
#[derive(Clone, Copy)]
#[doc(hidden)]
pub enum Count {
    /// Kernel launches.
    Kernels,
    /// cuDNN plan executions.
    CudnnExecutions,
    /// Fused runs that ran their operations one by one.
    FusedFallbacks,
    /// Host nanoseconds executing fused runs.
    FusedNs,
    /// Host nanoseconds enqueueing cuDNN executions.
    CudnnNs,
    /// Host nanoseconds in the driver's kernel launches.
    LaunchNs,
    /// Host nanoseconds allocating and freeing device buffers.
    MemoryNs,
    /// Graphs that left their engine for lack of workspace memory.
    EngineSwitches,
}

/// How many [`Count`]s there are.
const COUNTS: usize = Count::EngineSwitches as usize + 1;

/// The process's totals, one per [`Count`] (in the [`Engine`](crate::Engine)).
pub(crate) type Totals = [AtomicU64; COUNTS];

/// Zeroed totals.
pub(crate) const fn zero_totals() -> Totals {
    [const { AtomicU64::new(0) }; COUNTS]
}

fn totals() -> &'static Totals {
    &crate::engine().counters
}

thread_local! {
    /// This thread's share of [`totals`].
    static THREAD: Cell<[u64; COUNTS]> = const { Cell::new([0; COUNTS]) };
}

/// Adds `n` to `what`, in the process's totals and the calling thread's share.
#[doc(hidden)]
pub fn add(what: Count, n: u64) {
    totals()[what as usize].fetch_add(n, Ordering::Relaxed);
    THREAD.with(|c| {
        let mut v = c.get();
        v[what as usize] += n;
        c.set(v);
    });
}

/// Measures host time from its creation until it is dropped, then adds it to a `…Ns` count.
#[doc(hidden)]
pub struct HostTimer {
    what: Count,
    started: Instant,
}

impl HostTimer {
    /// Starts timing for `what` (one of the `…Ns` counts).
    #[doc(hidden)]
    pub fn start(what: Count) -> Self {
        Self {
            what,
            started: Instant::now(),
        }
    }
}

impl Drop for HostTimer {
    fn drop(&mut self) {
        add(self.what, self.started.elapsed().as_nanos() as u64);
    }
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
    /// cuDNN graphs whose workspace could not be allocated even after the cached memory was
    /// released, and that moved to an engine needing less (whose results may differ in
    /// rounding); deterministic mode reports the allocation failure instead.
    pub engine_switches: u64,
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
            engine_switches: self.engine_switches - earlier.engine_switches,
        }
    }

    /// The counts from their values indexed by [`Count`].
    fn from_values(v: [u64; COUNTS]) -> Self {
        Self {
            kernels: v[Count::Kernels as usize],
            cudnn_executions: v[Count::CudnnExecutions as usize],
            fused_fallbacks: v[Count::FusedFallbacks as usize],
            fused_ns: v[Count::FusedNs as usize],
            cudnn_ns: v[Count::CudnnNs as usize],
            launch_ns: v[Count::LaunchNs as usize],
            memory_ns: v[Count::MemoryNs as usize],
            engine_switches: v[Count::EngineSwitches as usize],
        }
    }
}

/// The counts so far (all threads and devices).
pub fn launch_counts() -> LaunchCounts {
    LaunchCounts::from_values(std::array::from_fn(|i| totals()[i].load(Ordering::Relaxed)))
}

/// The work enqueued by the calling thread so far: unlike [`launch_counts`], launches made
/// meanwhile on other threads (another test, a background build) are not in it.
pub fn thread_launch_counts() -> LaunchCounts {
    LaunchCounts::from_values(THREAD.with(Cell::get))
}
