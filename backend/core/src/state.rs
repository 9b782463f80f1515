//! The engine's state in one object: every cache, table, pool and counter the crate keeps
//! between calls (configuration, cuDNN plans and engine choices, the handle pool, loaded and
//! generated kernels, workspaces, build traces, launch counters, fault-injection counters,
//! one-time warnings).
//!
//! Each layer keeps the layout of its part private (the fields are the layer's own types);
//! [`Engine`] composes them, and the crate root holds the process's one instance
//! ([`crate::engine`]), through which each layer reaches its part. State that is per device
//! (plans, handles, loaded kernels, workspaces) is keyed by device ordinal inside its part.
//! Nothing else holds state across calls except the loaded libraries and devices, which
//! follow the CUDA driver's process model, and per-thread caches (`thread_local!`), each
//! listed with its reason by the statics test.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};

/// Every cache, table, pool and counter of the crate (see the module docs).
pub struct Engine {
    /// The configuration ([`crate::config::config`]), read or installed once.
    pub(crate) config: OnceLock<crate::config::Config>,
    pub(crate) plans: crate::plan::PlanState,
    pub(crate) kernels: crate::kernels::KernelState,
    pub(crate) workspaces: crate::runtime::workspace::Workspaces,
    pub(crate) build_trace: crate::runtime::build_trace::BuildTrace,
    pub(crate) faults: crate::runtime::fault::Faults,
    pub(crate) counters: crate::ffi::counters::Totals,
    pub(crate) next_pool_id: AtomicU64,
    pub(crate) conv_verdicts: OnceLock<Mutex<crate::ops::conv_fallback::Verdicts>>,
    pub(crate) watchdog: crate::collective::watchdog::Watchdog,
    temp_files: AtomicU64,
    warned: Mutex<BTreeSet<&'static str>>,
}

impl Engine {
    pub(crate) const fn new() -> Self {
        Engine {
            config: OnceLock::new(),
            plans: crate::plan::PlanState::new(),
            kernels: crate::kernels::KernelState::new(),
            workspaces: crate::runtime::workspace::Workspaces::new(),
            build_trace: crate::runtime::build_trace::BuildTrace::new(),
            faults: crate::runtime::fault::Faults::new(),
            counters: crate::ffi::counters::zero_totals(),
            next_pool_id: AtomicU64::new(1),
            conv_verdicts: OnceLock::new(),
            watchdog: crate::collective::watchdog::Watchdog::new(),
            temp_files: AtomicU64::new(0),
            warned: Mutex::new(BTreeSet::new()),
        }
    }

    /// A number no other temporary file of this process has (files written then renamed into
    /// place: cache entries, tuning files).
    pub(crate) fn temp_file_number(&self) -> u64 {
        self.temp_files.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// True the first time it is called with `what` in this process: a warning that is to be
    /// given once (a fallback taken, a setting ignored) checks it before logging.
    #[doc(hidden)]
    pub fn first_warning(&self, what: &'static str) -> bool {
        self.warned.lock().unwrap_or_else(|e| e.into_inner()).insert(what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_first_once() {
        let e = Engine::new();
        assert!(e.first_warning("x"));
        assert!(!e.first_warning("x"));
        assert!(e.first_warning("y"));
    }
}
