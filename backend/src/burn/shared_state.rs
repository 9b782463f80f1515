//! The Burn adapter's state in one object, beside the core's
//! [`Engine`](crate::Engine) (which knows no framework): cached tensor buffers, the
//! per-device set-up and lazy-fusion flushers, the random generator and, with the
//! `distributed` feature, the gradient all-reduce groups. Per-device parts are arrays indexed
//! by device ordinal. `burn/mod.rs` holds the one instance ([`super::state`]).

use std::sync::{Mutex, Once, OnceLock};

use crate::ops::random::Philox;
use crate::runtime::MAX_DEVICES;

/// Everything the Burn adapter keeps between calls (see the module docs).
pub(crate) struct BurnState {
    /// Freed tensor buffers per device ([`super::buffer_cache`]).
    pub(super) buffer_caches: [Mutex<Option<super::buffer_cache::Cache>>; MAX_DEVICES],
    /// Devices whose one-time set-up ran ([`super::memory::prepare_device`]).
    pub(super) prepared: [OnceLock<()>; MAX_DEVICES],
    /// The buffer cache's release hook, registered with the core once.
    pub(super) releaser: Once,
    /// Devices whose lazy-fusion queue flusher was started.
    pub(super) flushers: [OnceLock<()>; MAX_DEVICES],
    /// `Backend::seed`'s generator.
    pub(super) generator: Mutex<Option<Philox>>,
    /// Data-parallel groups ([`super::distributed`]).
    #[cfg(feature = "distributed")]
    pub(super) groups: super::distributed::Groups,
}

impl BurnState {
    pub(super) const fn new() -> Self {
        BurnState {
            buffer_caches: [const { Mutex::new(None) }; MAX_DEVICES],
            prepared: [const { OnceLock::new() }; MAX_DEVICES],
            releaser: Once::new(),
            flushers: [const { OnceLock::new() }; MAX_DEVICES],
            generator: Mutex::new(None),
            #[cfg(feature = "distributed")]
            groups: super::distributed::Groups::new(),
        }
    }
}
