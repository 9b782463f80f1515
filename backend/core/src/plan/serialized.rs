//! Built execution plans kept across processes: when cuDNN builds a plan with a
//! runtime-compiled engine (fused attention, fused pointwise patterns), its JSON
//! representation, compiled kernels included, is written to the persistent cache (the
//! kernel cache's directory and rules: [`crate::runtime::disk_cache`]); a later process with the
//! same signature, GPU, cuDNN, driver and crate version restores the plan from it and skips
//! heuristics and the compilation. Engines cuDNN cannot serialize (its precompiled ones) are
//! simply not stored; a missing, corrupt or refused entry is a miss, and the plan is built.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::cache::{EngineChoice, Signature};
use super::engine::{self, BuiltPlan};
use crate::ffi::CudnnHandle;
use crate::runtime::disk_cache::{CacheKey, CachedImage, DiskCache, ImageKind};
use crate::runtime::Device;

/// Plan entries of the persistent cache: counts and the entries known intact.
pub(super) struct Serialized {
    restored: AtomicU64,
    stored: AtomicU64,
    /// By device ordinal and signature: [`stored`] answers them without reading the file
    /// again (a restored attention plan is asked about at every training step, by the
    /// backward's prefetch).
    known_intact: OnceLock<Mutex<HashSet<(usize, Signature)>>>,
}

impl Serialized {
    pub(super) const fn new() -> Self {
        Serialized {
            restored: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            known_intact: OnceLock::new(),
        }
    }
}

fn state() -> &'static Serialized {
    &super::state().serialized
}

/// Plans restored from and written to the persistent cache by this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SerializedPlanCounts {
    /// Plans restored (no heuristics, no compilation).
    pub restored: u64,
    /// Plans written after a build.
    pub stored: u64,
}

/// The counts so far.
pub fn serialized_plan_counts() -> SerializedPlanCounts {
    SerializedPlanCounts {
        restored: state().restored.load(Ordering::Relaxed),
        stored: state().stored.load(Ordering::Relaxed),
    }
}

fn key(sig: &Signature, dev: &Device, cudnn: usize) -> CacheKey {
    let info = dev.info();
    let driver = crate::ffi::driver::driver_version().unwrap_or(0);
    CacheKey::of_fields(
        "cudnn-plan",
        &[
            sig.as_bytes(),
            info.name.as_bytes(),
            &info.compute_capability.0.to_le_bytes(),
            &info.compute_capability.1.to_le_bytes(),
            &(cudnn as u64).to_le_bytes(),
            &driver.to_le_bytes(),
            env!("CARGO_PKG_VERSION").as_bytes(),
        ],
    )
}

/// `engine_id;type=value,...` (the entry's symbol field).
fn encode_choice(c: &EngineChoice) -> String {
    let knobs: Vec<String> = c.knobs.iter().map(|(t, v)| format!("{t}={v}")).collect();
    format!("{};{}", c.engine_id, knobs.join(","))
}

fn decode_choice(s: &str) -> Option<EngineChoice> {
    let (id, knobs) = s.split_once(';')?;
    let knobs = knobs
        .split(',')
        .filter(|k| !k.is_empty())
        .map(|k| {
            let (t, v) = k.split_once('=')?;
            Some((t.parse().ok()?, v.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(EngineChoice {
        engine_id: id.parse().ok()?,
        knobs,
        workspace_bytes: 0,
        measured_ms: None,
    })
}

/// Plan entries this process found intact or restored.
fn known_intact() -> &'static Mutex<HashSet<(usize, Signature)>> {
    state().known_intact.get_or_init(Default::default)
}

fn remember_intact(sig: &Signature, dev: &Device) {
    known_intact()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((dev.ordinal(), sig.clone()));
}

/// Whether the persistent cache holds an intact plan entry for `sig`. The entry is read and
/// checked the first time, not only found: a damaged one (removed by the load) must send a
/// new graph to the background build, not to a build on the caller's thread.
pub(crate) fn stored(sig: &Signature, dev: &Device, cudnn: usize) -> bool {
    let id = (dev.ordinal(), sig.clone());
    if known_intact().lock().unwrap_or_else(|e| e.into_inner()).contains(&id) {
        return true;
    }
    let intact = DiskCache::from_env().is_some_and(|cache| {
        cache
            .load(key(sig, dev, cudnn), "plan")
            .is_some_and(|e| e.kind == ImageKind::CudnnPlan)
    });
    if intact {
        remember_intact(sig, dev);
    }
    intact
}

/// The plan of `sig` restored from the persistent cache, if an entry exists and cuDNN
/// accepts it.
pub(crate) fn restore(handle: &CudnnHandle, sig: &Signature, dev: &Device, cudnn: usize) -> Option<BuiltPlan> {
    let cache = DiskCache::from_env()?;
    let entry = cache.load(key(sig, dev, cudnn), "plan")?;
    if entry.kind != ImageKind::CudnnPlan {
        return None;
    }
    let choice = decode_choice(&entry.symbol)?;
    match engine::deserialize(handle, &entry.image, choice) {
        Ok(plan) => {
            state().restored.fetch_add(1, Ordering::Relaxed);
            remember_intact(sig, dev);
            Some(plan)
        }
        Err(e) => {
            tracing::warn!(reason = %e, "ignoring a serialized cuDNN plan (it will be rebuilt)");
            None
        }
    }
}

/// Writes `plan` to the persistent cache when cuDNN can serialize it (runtime-compiled
/// engines); silently does nothing otherwise.
pub(crate) fn store(plan: &BuiltPlan, sig: &Signature, dev: &Device, cudnn: usize) {
    let Some(cache) = DiskCache::from_env() else {
        return;
    };
    let Ok(json) = engine::serialize(plan) else {
        return;
    };
    if json.is_empty() {
        return;
    }
    let entry = CachedImage {
        kind: ImageKind::CudnnPlan,
        symbol: encode_choice(&plan.choice),
        image: json,
    };
    match cache.store(key(sig, dev, cudnn), "plan", &entry) {
        Ok(()) => {
            state().stored.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => tracing::warn!(reason = %e, "could not write a serialized cuDNN plan"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_round_trip_through_the_symbol_field() {
        let c = EngineChoice {
            engine_id: 7,
            knobs: vec![(3, 1), (17, -2)],
            workspace_bytes: 99,
            measured_ms: Some(1.0),
        };
        let back = decode_choice(&encode_choice(&c)).unwrap();
        assert_eq!((back.engine_id, back.knobs.clone()), (7, c.knobs.clone()));
        let none = EngineChoice { knobs: vec![], ..c };
        assert_eq!(decode_choice(&encode_choice(&none)).unwrap().knobs, vec![]);
        assert!(decode_choice("x;1=2").is_none() && decode_choice("4;1").is_none() && decode_choice("4").is_none());
    }
}
