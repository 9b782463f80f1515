//! Fault injection for tests: make the calling thread's next plan builds or workspace
//! allocations fail as cuDNN or the allocator would, to exercise the recovery paths. The
//! arming functions exist with the crate feature `unstable` only (the test suites turn it on);
//! the checks the engine runs cost one relaxed atomic load when nothing is armed.
//!
//! Faults are armed per thread (ops run their plan builds and workspace allocations on the
//! calling thread), so tests running in parallel do not see each other's faults. When no
//! thread has a fault armed, a check costs one relaxed atomic load. Fused-kernel build
//! faults are the exception: those builds run on background threads, so they are armed for
//! the whole process.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{CudnnStatus, Error};

/// Fault injection's part of the [`Engine`](crate::Engine).
pub(crate) struct Faults {
    /// Threads that currently have at least one fault armed (the fast-path gate).
    armed_threads: AtomicUsize,
    /// Fused-kernel builds still to fail, whichever thread runs them.
    fused_build_faults: AtomicUsize,
    /// Fused-kernel build failures injected so far in this process.
    fused_builds_failed: AtomicUsize,
}

impl Faults {
    pub(crate) const fn new() -> Self {
        Faults {
            armed_threads: AtomicUsize::new(0),
            fused_build_faults: AtomicUsize::new(0),
            fused_builds_failed: AtomicUsize::new(0),
        }
    }
}

fn state() -> &'static Faults {
    &crate::engine().faults
}

/// The status an injected plan-build failure reports: an internal device-allocation
/// failure, i.e. a transient failure rather than "not supported".
pub const INJECTED_BUILD_STATUS: CudnnStatus = CudnnStatus(4004);

#[derive(Default)]
struct Armed {
    plan_builds: Cell<usize>,
    workspace_allocs: Cell<usize>,
    injected_builds: Cell<usize>,
    injected_allocs: Cell<usize>,
}

impl Armed {
    fn any(&self) -> bool {
        self.plan_builds.get() > 0 || self.workspace_allocs.get() > 0
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if self.any() {
            state().armed_threads.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static ARMED: Armed = Armed::default();
}

fn arm(set: impl FnOnce(&Armed)) {
    let _ = ARMED.try_with(|a| {
        let before = a.any();
        set(a);
        match (before, a.any()) {
            (false, true) => {
                state().armed_threads.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                state().armed_threads.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    });
}

/// Makes this thread's next `n` execution-plan finalizations fail with
/// [`INJECTED_BUILD_STATUS`] (replacing any count armed before; 0 disarms).
#[cfg(any(test, feature = "unstable"))]
#[doc(hidden)]
pub fn fail_next_plan_builds(n: usize) {
    arm(|a| a.plan_builds.set(n));
}

/// Makes this thread's next `n` workspace allocations fail with [`Error::OutOfMemory`]
/// (replacing any count armed before; 0 disarms).
#[cfg(any(test, feature = "unstable"))]
#[doc(hidden)]
pub fn fail_next_workspace_allocs(n: usize) {
    arm(|a| a.workspace_allocs.set(n));
}

/// Disarms every fault of this thread.
#[cfg(any(test, feature = "unstable"))]
#[doc(hidden)]
pub fn disarm() {
    arm(|a| {
        a.plan_builds.set(0);
        a.workspace_allocs.set(0);
    });
}

/// Plan-build and workspace-allocation faults injected on this thread so far.
#[cfg(any(test, feature = "unstable"))]
#[doc(hidden)]
pub fn injected() -> (usize, usize) {
    ARMED
        .try_with(|a| (a.injected_builds.get(), a.injected_allocs.get()))
        .unwrap_or((0, 0))
}

/// Takes one armed fault from `pick`, counting it in `count`; false when none is armed.
fn take(pick: impl Fn(&Armed) -> (&Cell<usize>, &Cell<usize>)) -> bool {
    if state().armed_threads.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let mut hit = false;
    arm(|a| {
        let (left, count) = pick(a);
        if left.get() > 0 {
            left.set(left.get() - 1);
            count.set(count.get() + 1);
            hit = true;
        }
    });
    hit
}

/// The error an armed plan-build fault injects, if one is armed on this thread.
pub(crate) fn plan_build_fault() -> Option<Error> {
    take(|a| (&a.plan_builds, &a.injected_builds)).then(|| Error::Cudnn {
        call: "cudnnBackendFinalize",
        status: INJECTED_BUILD_STATUS,
        message: "injected fault".into(),
        context: " [execution plan]".into(),
    })
}

/// Makes the process's next `n` builds of generated (lazy-fusion) kernels fail as an NVRTC
/// compile error would (replacing any count armed before; 0 disarms). Process-wide, unlike
/// the other faults, as those builds run on background threads: a test arming it must keep
/// other fusion work out of the process meanwhile.
#[cfg(any(test, feature = "unstable"))]
#[doc(hidden)]
pub fn fail_next_fused_kernel_builds(n: usize) {
    state().fused_build_faults.store(n, Ordering::SeqCst);
}

/// Fused-kernel build failures injected so far in this process.
#[cfg(any(test, feature = "unstable"))]
#[doc(hidden)]
pub fn injected_fused_build_failures() -> usize {
    state().fused_builds_failed.load(Ordering::SeqCst)
}

/// The error an armed fused-kernel build fault injects for `kernel`, if one is armed.
pub(crate) fn fused_build_fault(kernel: &'static str) -> Option<Error> {
    state()
        .fused_build_faults
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .ok()
        .map(|_| {
            state().fused_builds_failed.fetch_add(1, Ordering::SeqCst);
            Error::Nvrtc {
                kernel,
                log: "injected fault".into(),
            }
        })
}

/// The error an armed workspace-allocation fault injects for `bytes`, if one is armed.
pub(crate) fn workspace_alloc_fault(bytes: usize) -> Option<Error> {
    take(|a| (&a.workspace_allocs, &a.injected_allocs)).then(|| Error::OutOfMemory {
        op: "cuDNN workspace",
        bytes,
        message: "injected fault".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_once_each_and_only_on_the_arming_thread() {
        assert!(plan_build_fault().is_none());
        fail_next_plan_builds(2);
        fail_next_workspace_allocs(1);
        let other = std::thread::spawn(|| (plan_build_fault().is_some(), workspace_alloc_fault(1).is_some()));
        assert_eq!(other.join().unwrap(), (false, false));
        assert!(matches!(plan_build_fault(), Some(Error::Cudnn { status, .. }) if status == INJECTED_BUILD_STATUS));
        assert!(matches!(
            workspace_alloc_fault(8),
            Some(Error::OutOfMemory { bytes: 8, .. })
        ));
        assert!(workspace_alloc_fault(8).is_none());
        assert!(plan_build_fault().is_some());
        assert!(plan_build_fault().is_none());
        assert_eq!(injected(), (2, 1));
        fail_next_plan_builds(5);
        disarm();
        assert!(plan_build_fault().is_none());
    }

    #[test]
    fn fused_build_faults_fire_once_each_on_any_thread() {
        fail_next_fused_kernel_builds(2);
        let other = std::thread::spawn(|| fused_build_fault("fused_a.cu").is_some());
        assert!(other.join().unwrap());
        assert!(matches!(
            fused_build_fault("fused_b.cu"),
            Some(Error::Nvrtc {
                kernel: "fused_b.cu",
                ..
            })
        ));
        assert!(fused_build_fault("fused_c.cu").is_none());
        assert_eq!(injected_fused_build_failures(), 2);
        fail_next_fused_kernel_builds(3);
        fail_next_fused_kernel_builds(0);
        assert!(fused_build_fault("fused_d.cu").is_none());
    }
}
