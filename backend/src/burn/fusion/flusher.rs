//! Keeps burn-fusion's operation queue moving while a model runs.
//!
//! burn-fusion hands each recorded operation to a per-device server thread through a channel
//! of 32-task batches: the server takes a batch only when it is full, and after a short spin
//! it sleeps 150 µs at a time between checks. A training step's host thread records an
//! operation every few microseconds, so the server falls asleep between batches and the
//! recording thread then waits on the full channel: in the profile of the stock CNN step on
//! the lazy queue, the recording thread spent most of the step spinning in the channel's
//! submit while the server thread was mostly off the CPU.
//!
//! The flusher is a background thread per device that calls the public
//! `GlobalFusionClient::flush_queue` every few tens of microseconds while work flows (it pads
//! the current batch with no-ops, so the server takes what has been recorded so far and
//! stays awake), and every millisecond otherwise. `CUDNN_BACKEND_FUSION_FLUSH_US` sets the
//! active period in microseconds (`0` turns the flusher off).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use burn_fusion::client::GlobalFusionClient;

use super::CudnnFusionRuntime;
use crate::burn::CudnnDevice;
use crate::runtime::{self, MAX_DEVICES};

/// Period between flushes while kernels are being launched, unless the env var sets another.
const DEFAULT_ACTIVE_PERIOD_US: u64 = 20;
/// Period between flushes once nothing has been launched for [`IDLE_AFTER`].
const IDLE_PERIOD: Duration = Duration::from_millis(1);
/// Launch inactivity after which the flusher slows to [`IDLE_PERIOD`].
const IDLE_AFTER: Duration = Duration::from_millis(20);

/// The active flush period, or `None` when `CUDNN_BACKEND_FUSION_FLUSH_US=0`.
fn active_period() -> Option<Duration> {
    static PERIOD: OnceLock<Option<Duration>> = OnceLock::new();
    *PERIOD.get_or_init(|| {
        let us = std::env::var("CUDNN_BACKEND_FUSION_FLUSH_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_ACTIVE_PERIOD_US);
        (us > 0).then(|| Duration::from_micros(us))
    })
}

/// Starts the flusher of `device` once (later calls do nothing). Called from the fusion
/// server's thread while it creates a stream, so the flusher's own client is made on the
/// new thread: creating it here could wait on the server's own initialisation.
pub(super) fn ensure_started(device: &CudnnDevice) {
    static STARTED: [OnceLock<()>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
    let Some(period) = active_period() else { return };
    let Some(slot) = STARTED.get(device.index as usize) else {
        return;
    };
    slot.get_or_init(|| {
        let device = *device;
        let spawned = std::thread::Builder::new()
            .name("cudnn-fusion-flush".into())
            .spawn(move || run(device, period));
        if let Err(e) = spawned {
            tracing::warn!("lazy fusion: no queue flusher thread ({e}); recorded operations wait for full batches");
        }
    });
}

fn run(device: CudnnDevice, period: Duration) {
    let client = GlobalFusionClient::<CudnnFusionRuntime>::load(&device);
    let mut last_launches = runtime::launch_counts().total();
    let mut last_activity = Instant::now();
    loop {
        let launches = runtime::launch_counts().total();
        if launches != last_launches {
            last_launches = launches;
            last_activity = Instant::now();
        }
        client.flush_queue();
        std::thread::sleep(if last_activity.elapsed() < IDLE_AFTER {
            period
        } else {
            IDLE_PERIOD
        });
    }
}
