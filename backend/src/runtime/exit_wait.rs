//! Waiting for the crate's background threads when the process exits.
//!
//! Plan builds, fused-kernel builds and kernel prefetches run on background threads inside
//! cuDNN, NVRTC and the CUDA driver. When `main` returns while one of them is still running,
//! the libraries' static destructors run under that thread: short training runs crashed that
//! way after printing their last line (a segmentation fault at exit, with builds for the
//! evaluation's new shapes still under way). The first background thread of each kind
//! registers [`wait_at_exit`], which runs before those destructors and waits for the
//! background work in flight, up to [`EXIT_WAIT`].

use std::sync::{Condvar, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

/// The longest wait at exit.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Registers [`wait_at_exit`] once per `site` (a kind of background thread): the last
/// registration runs first, after every library loaded before it.
pub(crate) fn ensure_wait_at_exit(site: &'static Once) {
    site.call_once(|| {
        if !crate::ffi::exit::at_exit(wait_at_exit) {
            tracing::debug!("no exit handler for the background builds");
        }
    });
}

/// Waits until no background compile, fused-kernel build or plan build runs, or
/// [`EXIT_WAIT`] has passed.
extern "C" fn wait_at_exit() {
    // No panic may unwind into the C library.
    let _ = std::panic::catch_unwind(|| {
        let deadline = Some(Instant::now() + EXIT_WAIT);
        loop {
            // Each kind may start another (a fused build loads kernels): idle only when all
            // three are in one pass.
            let idle = crate::kernels::load::wait_for_background_compiles_until(deadline)
                & crate::kernels::fused::wait_for_builds_until(deadline)
                & crate::plan::wait_for_background_builds_until(deadline);
            if idle || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
    });
}

/// Waits on `signal` until `busy` is false for what `lock` guards, or `deadline` passes;
/// whether it became idle. With a deadline, a lock held elsewhere is waited for only until
/// then (exit may come from a thread that holds it).
pub(crate) fn wait_while<T>(
    lock: &Mutex<T>,
    signal: &Condvar,
    deadline: Option<Instant>,
    busy: impl Fn(&T) -> bool,
) -> bool {
    let Some(mut guard) = lock_until(lock, deadline) else {
        return false;
    };
    while busy(&guard) {
        guard = match deadline {
            None => signal.wait(guard).unwrap_or_else(|e| e.into_inner()),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                signal.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0
            }
        };
    }
    true
}

/// `lock` locked, waiting for it until `deadline` (forever without one).
fn lock_until<T>(lock: &Mutex<T>, deadline: Option<Instant>) -> Option<MutexGuard<'_, T>> {
    let Some(d) = deadline else {
        return Some(lock.lock().unwrap_or_else(|e| e.into_inner()));
    };
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < d => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_until_idle_or_the_deadline() {
        let state = Arc::new((Mutex::new(1usize), Condvar::new()));
        // Busy past the deadline.
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert!(!wait_while(&state.0, &state.1, soon, |n| *n > 0));
        // Idle once another thread finishes its work.
        let worker = {
            let state = state.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                *state.0.lock().unwrap() = 0;
                state.1.notify_all();
            })
        };
        let later = Some(Instant::now() + Duration::from_secs(10));
        assert!(wait_while(&state.0, &state.1, later, |n| *n > 0));
        worker.join().unwrap();
        assert!(wait_while(&state.0, &state.1, None, |n| *n > 0));
        // A lock held past the deadline.
        let held = state.0.lock().unwrap();
        let other = {
            let state = state.clone();
            std::thread::spawn(move || wait_while(&state.0, &state.1, soon_from_now(), |_| false))
        };
        assert!(!other.join().unwrap());
        drop(held);
    }

    fn soon_from_now() -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(20))
    }
}
