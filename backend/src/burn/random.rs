//! The backend's seeded counter-based (Philox) generator, shared by all devices.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::ops::random::Philox;

/// Restarts the generator at `seed` (`Backend::seed`).
pub(crate) fn seed(seed: u64) {
    *super::state().generator.lock().unwrap_or_else(|e| e.into_inner()) = Some(Philox::new(seed));
}

/// Runs `f` with the generator (seeded from the clock when `seed` was never called), so
/// draws advance it and later calls get fresh numbers.
pub(crate) fn with_generator<R>(f: impl FnOnce(&mut Philox) -> R) -> R {
    let mut guard = super::state().generator.lock().unwrap_or_else(|e| e.into_inner());
    let gen = guard.get_or_insert_with(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Philox::new(nanos)
    });
    f(gen)
}
