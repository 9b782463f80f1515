//! Fault injection for tests: make the calling thread's next plan builds or workspace
//! allocations fail as cuDNN or the allocator would, to exercise the recovery paths.
//!
//! Faults are armed per thread (ops run their plan builds and workspace allocations on the
//! calling thread), so tests running in parallel do not see each other's faults. When no
//! thread has a fault armed, a check costs one relaxed atomic load.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{CudnnStatus, Error};

/// Threads that currently have at least one fault armed (the fast-path gate).
static ARMED_THREADS: AtomicUsize = AtomicUsize::new(0);

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
            ARMED_THREADS.fetch_sub(1, Ordering::Relaxed);
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
                ARMED_THREADS.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                ARMED_THREADS.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    });
}

/// Makes this thread's next `n` execution-plan finalizations fail with
/// [`INJECTED_BUILD_STATUS`] (replacing any count armed before; 0 disarms).
#[doc(hidden)]
pub fn fail_next_plan_builds(n: usize) {
    arm(|a| a.plan_builds.set(n));
}

/// Makes this thread's next `n` workspace allocations fail with [`Error::OutOfMemory`]
/// (replacing any count armed before; 0 disarms).
#[doc(hidden)]
pub fn fail_next_workspace_allocs(n: usize) {
    arm(|a| a.workspace_allocs.set(n));
}

/// Disarms every fault of this thread.
#[doc(hidden)]
pub fn disarm() {
    arm(|a| {
        a.plan_builds.set(0);
        a.workspace_allocs.set(0);
    });
}

/// Plan-build and workspace-allocation faults injected on this thread so far.
#[doc(hidden)]
pub fn injected() -> (usize, usize) {
    ARMED
        .try_with(|a| (a.injected_builds.get(), a.injected_allocs.get()))
        .unwrap_or((0, 0))
}

/// Takes one armed fault from `pick`, counting it in `count`; false when none is armed.
fn take(pick: impl Fn(&Armed) -> (&Cell<usize>, &Cell<usize>)) -> bool {
    if ARMED_THREADS.load(Ordering::Relaxed) == 0 {
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
}
