//! The NCCL watchdog: a background thread that follows every collective a communicator
//! enqueued and ends a job that cannot finish instead of letting it hang. A collective that
//! has not completed within the communicator's timeout, or an asynchronous NCCL error (a
//! peer that died, a network failure), aborts the communicator: its kernels stop waiting,
//! the failure is logged, and every later call on it returns that failure.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::{Error, Result};
use crate::ffi::nccl::{Comm, IN_PROGRESS};

pub use crate::config::NCCL_TIMEOUT_ENV;
/// How long a collective may take by default (PyTorch's NCCL default, 10 minutes).
pub const DEFAULT_TIMEOUT: Duration = crate::config::DEFAULT_NCCL_TIMEOUT;
/// How often the watchdog looks at the communicators.
const POLL: Duration = Duration::from_millis(50);

/// How long a collective may take: [`NCCL_TIMEOUT_ENV`] (seconds) when set to a positive
/// number, else [`DEFAULT_TIMEOUT`] ([`Config::nccl_timeout`](crate::config::Config::nccl_timeout)).
pub fn timeout_from_env() -> Duration {
    crate::config::config().nccl_timeout
}

/// One enqueued collective: an event recorded after it on its stream.
struct Pending {
    event: CudaEvent,
    since: Instant,
    op: &'static str,
}

/// A communicator as the watchdog and the collective calls share it.
pub(crate) struct Watched {
    pub(crate) comm: Comm,
    /// `"rank r of n on GPU d"`, for messages.
    pub(crate) label: String,
    pub(crate) timeout: Duration,
    pending: Mutex<Vec<Pending>>,
    failure: Mutex<Option<String>>,
}

impl Watched {
    /// Starts watching `comm` (the watchdog thread starts with the first communicator).
    pub(crate) fn register(comm: Comm, label: String, timeout: Duration) -> Arc<Self> {
        let watched = Arc::new(Self {
            comm,
            label,
            timeout,
            pending: Mutex::new(Vec::new()),
            failure: Mutex::new(None),
        });
        let mut all = watch_list().lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&watched));
        watched
    }

    /// The failure that aborted the communicator, as an error for `op`.
    pub(crate) fn check_alive(&self, op: &'static str) -> Result<()> {
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some(reason) => Err(Error::Collective {
                op,
                reason: reason.clone(),
            }),
        }
    }

    /// Records that `op` was enqueued on `stream` (an event after it, for the watchdog).
    pub(crate) fn enqueued(&self, op: &'static str, stream: &CudaStream) -> Result<()> {
        let event = stream.record_event(None).map_err(|e| Error::Cuda {
            op: "recording a collective's completion event",
            message: e.to_string(),
        })?;
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Pending {
            event,
            since: Instant::now(),
            op,
        });
        Ok(())
    }

    /// Waits until a non-blocking call on the communicator has finished enqueueing (NCCL's
    /// `ncclInProgress`), within the timeout.
    pub(crate) fn settle(&self, op: &'static str) -> Result<()> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        loop {
            self.check_alive(op)?;
            match self.comm.state() {
                // A launch usually settles within tens of microseconds: poll without sleeping
                // for the first millisecond (a fixed sleep per launch made the per-parameter
                // gradient all-reduces of data-parallel training host-bound), then back off.
                Ok(IN_PROGRESS) if Instant::now() < deadline => {
                    let waited = start.elapsed();
                    if waited < Duration::from_millis(1) {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(waited.min(Duration::from_millis(8)) / 8);
                    }
                }
                Ok(IN_PROGRESS) => {
                    return Err(self.fail(
                        format!(
                            "{op} did not finish setting up within {:.0} s; a peer rank may not have started or may \
                         have died (set {NCCL_TIMEOUT_ENV} to wait longer)",
                            self.timeout.as_secs_f64()
                        ),
                        op,
                    ))
                }
                Ok(_) => return Ok(()),
                Err(e) => return Err(self.fail(e.to_string(), op)),
            }
        }
    }

    /// Waits until every collective enqueued so far has completed; the failure if the
    /// watchdog aborted the communicator meanwhile.
    pub(crate) fn wait_all(&self, op: &'static str) -> Result<()> {
        loop {
            self.check_alive(op)?;
            self.poll();
            if self.pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                return self.check_alive(op);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Aborts the communicator with `reason` (once; later reasons are dropped) and returns
    /// the error every caller now gets.
    pub(crate) fn fail(&self, reason: String, op: &'static str) -> Error {
        let reason = {
            let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            if failure.is_none() {
                let message = format!("NCCL communicator ({}) aborted: {reason}", self.label);
                tracing::error!("{message}");
                eprintln!("cudnn-backend: {message}");
                *failure = Some(message);
                self.comm.abort();
            }
            failure.clone().unwrap_or_default()
        };
        Error::Collective { op, reason }
    }

    /// One look: drops completed work, aborts on an asynchronous error or a timeout.
    fn poll(&self) {
        if self.failure.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return;
        }
        let overdue = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let mut error = None;
            pending.retain(|p| match p.event.try_is_complete() {
                Ok(done) => !done,
                Err(e) => {
                    error = Some(format!("{} failed on the GPU: {e}", p.op));
                    false
                }
            });
            error.or_else(|| {
                pending.iter().find(|p| p.since.elapsed() > self.timeout).map(|p| {
                    format!(
                        "{} did not complete within {:.0} s; a peer rank may have died or hung, or the ranks may \
                         have issued different collectives (set {NCCL_TIMEOUT_ENV} to wait longer)",
                        p.op,
                        self.timeout.as_secs_f64()
                    )
                })
            })
        };
        if let Some(reason) = overdue {
            self.fail(reason, "watchdog");
        } else if let Err(e) = self.comm.state() {
            self.fail(e.to_string(), "watchdog");
        }
    }
}

impl Drop for Watched {
    /// A communicator with collectives still running is aborted rather than destroyed:
    /// `ncclCommDestroy` must not run under pending work (it may wait for a peer forever).
    fn drop(&mut self) {
        let pending = self.pending.get_mut().unwrap_or_else(|e| e.into_inner());
        pending.retain(|p| !p.event.try_is_complete().unwrap_or(true));
        if !pending.is_empty() {
            tracing::warn!(
                "NCCL communicator ({}) dropped with {} collective(s) still running; aborting it",
                self.label,
                pending.len()
            );
            self.comm.abort();
        }
    }
}

/// The watchdog's part of the [`Engine`](crate::Engine): the communicators being
/// watched, and the thread that polls them (started with the first).
pub(crate) struct Watchdog {
    list: Mutex<Vec<Weak<Watched>>>,
    thread: OnceLock<()>,
}

impl Watchdog {
    pub(crate) const fn new() -> Self {
        Watchdog {
            list: Mutex::new(Vec::new()),
            thread: OnceLock::new(),
        }
    }
}

/// The communicators being watched.
fn watch_list() -> &'static Mutex<Vec<Weak<Watched>>> {
    let state = &crate::engine().watchdog;
    let list = &state.list;
    state.thread.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("cudnn-backend-nccl-watchdog".into())
            .spawn(|| loop {
                std::thread::sleep(POLL);
                let live: Vec<Arc<Watched>> = {
                    let mut all = watch_list().lock().unwrap_or_else(|e| e.into_inner());
                    all.retain(|w| w.strong_count() > 0);
                    all.iter().filter_map(Weak::upgrade).collect()
                };
                for watched in live {
                    watched.poll();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("could not start the NCCL watchdog thread ({e}); a dead peer may hang the job");
        }
    });
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_defaults_to_ten_minutes() {
        assert_eq!(DEFAULT_TIMEOUT, Duration::from_secs(600));
        assert_eq!(crate::config::Config::default().nccl_timeout, DEFAULT_TIMEOUT);
        let set = crate::config::Config::from_vars(|k| (k == NCCL_TIMEOUT_ENV).then_some("30"));
        assert_eq!(set.nccl_timeout, Duration::from_secs(30));
    }
}
