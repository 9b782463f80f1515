//! Keeps burn-fusion's operation queue moving while a model runs.
//!
//! burn-fusion hands each recorded operation to a per-device server thread through a channel
//! of 32-task batches: the server takes a batch only when it is full (or flushed). A model
//! that records a few operations and then does host work leaves them waiting in a partial
//! batch, and the GPU idles meanwhile.
//!
//! The flusher is a background thread per device that watches the launch counter and calls
//! the public `GlobalFusionClient::flush_queue` once when launches stop for a moment after
//! running (the server has drained what it had, so a partial batch may be waiting), and every
//! millisecond once nothing has been launched for a while. It does not flush while kernels are
//! being launched: a flush pads the current batch with no-ops and the recording thread then
//! waits until the server takes it, and during a step the server thread is busy anyway, so
//! there is nothing to wake. `CUDNN_BACKEND_FUSION_FLUSH_US` sets the quiet time in
//! microseconds (`0` turns the flusher off).

use std::time::{Duration, Instant};

use burn_fusion::client::GlobalFusionClient;

use crate::burn::fusion::CudnnFusionRuntime;
use crate::burn::CudnnDevice;
use crate::runtime;

/// Period between flushes once nothing has been launched for [`IDLE_AFTER`].
const IDLE_PERIOD: Duration = Duration::from_millis(1);
/// Launch inactivity after which the flusher slows to [`IDLE_PERIOD`].
const IDLE_AFTER: Duration = Duration::from_millis(20);

/// Time without a launch, after launches, before a flush (200 µs unless
/// `CUDNN_BACKEND_FUSION_FLUSH_US` sets another), or `None` when that variable is `0`
/// ([`Config::fusion_flush`](crate::config::Config::fusion_flush)).
fn quiet_time() -> Option<Duration> {
    crate::config::config().fusion_flush
}

/// Starts the flusher of `device` once (later calls do nothing). Called from the fusion
/// server's thread while it creates a stream, so the flusher's own client is made on the
/// new thread: creating it here could wait on the server's own initialisation.
pub(crate) fn ensure_started(device: &CudnnDevice) {
    let Some(quiet) = quiet_time() else { return };
    let Some(slot) = crate::burn::state().flushers.get(device.index as usize) else {
        return;
    };
    slot.get_or_init(|| {
        let device = *device;
        let spawned = std::thread::Builder::new()
            .name("cudnn-fusion-flush".into())
            .spawn(move || run(device, quiet));
        if let Err(e) = spawned {
            tracing::warn!("lazy fusion: no queue flusher thread ({e}); recorded operations wait for full batches");
        }
    });
}

fn run(device: CudnnDevice, quiet: Duration) {
    let client = GlobalFusionClient::<CudnnFusionRuntime>::load(&device);
    let mut watch = StallWatch::new(runtime::launch_counts().total(), Instant::now());
    loop {
        std::thread::sleep(quiet);
        if watch.observe(runtime::launch_counts().total(), Instant::now()) {
            client.flush_queue();
        }
    }
}

/// When to flush, from the launch counter seen at each wake-up: once when launches stopped
/// since the last wake-up (the first quiet period after activity), then every
/// [`IDLE_PERIOD`] once nothing has been launched for [`IDLE_AFTER`]; never while launches
/// keep coming.
struct StallWatch {
    launches: u64,
    last_launch: Instant,
    flushed_since_launch: bool,
    last_flush: Instant,
}

impl StallWatch {
    fn new(launches: u64, now: Instant) -> Self {
        Self {
            launches,
            last_launch: now,
            flushed_since_launch: false,
            last_flush: now,
        }
    }

    /// Records the counter at `now`; true when the flusher should flush.
    fn observe(&mut self, launches: u64, now: Instant) -> bool {
        if launches != self.launches {
            self.launches = launches;
            self.last_launch = now;
            self.flushed_since_launch = false;
            return false;
        }
        let flush = !self.flushed_since_launch
            || (now.duration_since(self.last_launch) >= IDLE_AFTER
                && now.duration_since(self.last_flush) >= IDLE_PERIOD);
        if flush {
            self.flushed_since_launch = true;
            self.last_flush = now;
        }
        flush
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_once_per_stall_and_slowly_when_idle() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut w = StallWatch::new(0, t0);
        // Quiet from the start: one flush, then none until idle.
        assert!(w.observe(0, at(200)));
        assert!(!w.observe(0, at(400)));
        // Launches flowing: no flush.
        assert!(!w.observe(5, at(600)));
        assert!(!w.observe(9, at(800)));
        // They stop: one flush, then quiet periods do not flush again.
        assert!(w.observe(9, at(1_000)));
        assert!(!w.observe(9, at(1_200)));
        assert!(!w.observe(9, at(10_000)));
        // Idle for longer than IDLE_AFTER: a flush every IDLE_PERIOD.
        assert!(w.observe(9, at(21_000)));
        assert!(!w.observe(9, at(21_500)));
        assert!(w.observe(9, at(22_000)));
        // Launches resume: no flush until they stop again.
        assert!(!w.observe(10, at(22_200)));
        assert!(w.observe(10, at(22_400)));
    }
}
