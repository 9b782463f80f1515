//! cuDNN plans built off the calling thread. On a fresh machine a runtime-compiled engine (a
//! fused matmul epilogue, fused attention) takes 0.3 to 0.8 s of host time to build, and a
//! training step meets several of them one after the other. Two ways to take that off the
//! thread that runs the program:
//! - an op with an unfused way to run asks for its fused plan "when built"
//!   ([`super::execute_keyed_when_built`]): the first call starts the build here and runs
//!   unfused; later calls run the plan once it is there;
//! - an op starts the build of a plan it will need soon ([`super::prefetch_keyed`]), e.g.
//!   attention's backward at forward time, so the build overlaps the work in between.
//!
//! A finished build hands its plan over in cuDNN's serialized form, which the caller's handle
//! restores in milliseconds; for engines cuDNN does not serialize (its precompiled ones, which
//! build quickly) only the engine choice is kept, in the shared choice cache. A failed build
//! leaves nothing behind: the caller's own build then reports the error as before.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use cudarc::driver::CudaStream;

use super::cache::{EngineChoice, Signature};
use super::engine::BuiltPlan;
use super::handles::cudnn_pool;
use super::policy::EnginePolicy;
use crate::ffi::CudnnHandle;
use crate::graph::Graph;
use crate::runtime::{record_build, BuildKind, Device};

/// How a plan is selected and built on a handle (the executor's selection: choice cache,
/// tuning file, heuristics); handed in by the caller, so this module does not depend on the
/// executor that calls it.
pub(crate) type PlanBuilder =
    fn(&CudnnHandle, &Graph, &Signature, &EnginePolicy, &Arc<CudaStream>, &Device, usize) -> crate::Result<BuiltPlan>;

/// Signatures tracked at most; when full, plans are built on the calling thread.
const MAX_ENTRIES: usize = 256;

/// Host memory the serialized plans may take together; a plan beyond it is not kept (the
/// callers restore it from the persistent cache or build it themselves).
const MAX_BYTES: usize = 64 << 20;

enum State {
    Building,
    Built {
        json: Arc<Vec<u8>>,
        choice: EngineChoice,
    },
    /// Done with nothing to hand over (failed, or the engine does not serialize): never
    /// started again; callers build on their own thread.
    Settled,
}

#[derive(Default)]
pub(super) struct Table {
    states: Mutex<HashMap<Signature, State>>,
    done: Condvar,
}

/// Bytes of the serialized plans in the table.
fn kept_bytes(states: &HashMap<Signature, State>) -> usize {
    states
        .values()
        .map(|s| match s {
            State::Built { json, .. } => json.len(),
            _ => 0,
        })
        .sum()
}

fn table() -> &'static Table {
    super::state().background.get_or_init(Table::default)
}

/// Where the background build of a signature stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// No build was started here.
    Absent,
    /// A thread is building it.
    Building,
    /// Built: [`take_built`] hands it over.
    Built,
    /// Finished with nothing to hand over: build on the calling thread.
    Settled,
}

/// Where the background build of `sig` stands.
pub(crate) fn progress(sig: &Signature) -> Progress {
    let states = table().states.lock().unwrap_or_else(|e| e.into_inner());
    match states.get(sig) {
        None => Progress::Absent,
        Some(State::Building) => Progress::Building,
        Some(State::Built { .. }) => Progress::Built,
        Some(State::Settled) => Progress::Settled,
    }
}

/// Starts building the plan of `sig` for `graph` with `plan` on a new thread; false when it
/// did not (a build of `sig` was started before, the table is full, or no thread could start).
pub(crate) fn start(
    dev: &Arc<Device>,
    sig: Signature,
    graph: Graph,
    policy: EnginePolicy,
    cudnn: usize,
    plan: PlanBuilder,
) -> bool {
    {
        let mut states = table().states.lock().unwrap_or_else(|e| e.into_inner());
        if states.contains_key(&sig) || states.len() >= MAX_ENTRIES {
            return false;
        }
        states.insert(sig.clone(), State::Building);
    }
    let dev = dev.clone();
    let key = sig.clone();
    let spawned = std::thread::Builder::new()
        .name("cudnn-backend-plan".into())
        .spawn(move || {
            let built = build(&dev, &key, &graph, &policy, cudnn, plan);
            finish(&key, built);
        });
    if spawned.is_err() {
        finish(&sig, None);
        return false;
    }
    true
}

/// Builds the plan on this thread's pooled handle (the same selection as a build on the
/// calling thread: choice cache, tuning file, heuristics), stores it in the persistent cache
/// and returns its serialized form (empty when the engine does not serialize).
fn build(
    dev: &Arc<Device>,
    sig: &Signature,
    graph: &Graph,
    policy: &EnginePolicy,
    cudnn: usize,
    plan_built: PlanBuilder,
) -> Option<(Vec<u8>, EngineChoice)> {
    let attempt = || -> crate::Result<(Vec<u8>, EngineChoice)> {
        // Counted like a kernel compile, so a process exiting meanwhile waits for it
        // (libcudnn and libnvrtc torn down under a build would crash it).
        let _in_flight = crate::ffi::nvrtc::CompileSlot::enter("a background cuDNN plan build")?;
        dev.context().bind_to_thread()?;
        let stream = dev.stream().clone();
        cudnn_pool().with_handle(dev.ordinal(), stream.cu_stream() as usize, |h| {
            let plan = plan_built(&h.handle, graph, sig, policy, &stream, dev, cudnn)?;
            // The build may have loaded cuDNN's runtime-compiled engines, NVRTC or the PTX
            // JIT: the exit hook must be newer than their teardown before serializing.
            crate::ffi::nvrtc::register_exit_hook();
            super::serialized::store(&plan, sig, dev, cudnn);
            let json = super::engine::serialize(&plan).unwrap_or_default();
            Ok((json, plan.choice.clone()))
        })?
    };
    match attempt() {
        Ok(built) => Some(built),
        Err(e) => {
            tracing::debug!(graph = %graph.describe(), reason = %e, "background plan build failed");
            None
        }
    }
}

/// Publishes the outcome of a build and wakes its waiters: a serialized plan stays in the
/// table (within [`MAX_BYTES`]); anything else (failure, unserializable engine) settles it,
/// so callers restore it from the persistent cache, build it, or report the error themselves.
fn finish(sig: &Signature, built: Option<(Vec<u8>, EngineChoice)>) {
    let t = table();
    let mut states = t.states.lock().unwrap_or_else(|e| e.into_inner());
    match built {
        Some((json, choice)) if !json.is_empty() && kept_bytes(&states) + json.len() <= MAX_BYTES => {
            states.insert(
                sig.clone(),
                State::Built {
                    json: Arc::new(json),
                    choice,
                },
            );
        }
        _ => {
            states.insert(sig.clone(), State::Settled);
        }
    }
    drop(states);
    t.done.notify_all();
}

/// The serialized plan of `sig` and its engine choice, waiting for a build in progress;
/// `None` when no background build of `sig` exists or it left nothing to restore. A wait
/// is recorded in the start-up timeline with `label()`.
pub(crate) fn take_built(sig: &Signature, label: &dyn Fn() -> String) -> Option<(Arc<Vec<u8>>, EngineChoice)> {
    let t = table();
    let mut states = t.states.lock().unwrap_or_else(|e| e.into_inner());
    let mut waited = None;
    let found = loop {
        match states.get(sig) {
            None | Some(State::Settled) => break None,
            Some(State::Built { json, choice }) => break Some((json.clone(), choice.clone())),
            Some(State::Building) => {
                waited.get_or_insert_with(Instant::now);
                states = t.done.wait(states).unwrap_or_else(|e| e.into_inner());
            }
        }
    };
    drop(states);
    if let Some(start) = waited {
        record_build(BuildKind::PlanWait, label(), start);
    }
    found
}

/// Drops a serialized plan cuDNN refused to restore, so callers build it themselves.
pub(crate) fn settle(sig: &Signature) {
    let mut states = table().states.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(state) = states.get_mut(sig) {
        *state = State::Settled;
    }
}

/// Blocks until no plan is being built in the background (see `execute_keyed_when_built`).
pub fn wait_for_background_builds() {
    let t = table();
    let mut states = t.states.lock().unwrap_or_else(|e| e.into_inner());
    while states.values().any(|s| matches!(s, State::Building)) {
        states = t.done.wait(states).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(id: i64) -> EngineChoice {
        EngineChoice {
            engine_id: id,
            knobs: vec![(1, 2)],
            workspace_bytes: 0,
            measured_ms: None,
        }
    }

    fn mark_building(sig: &Signature) {
        table().states.lock().unwrap().insert(sig.clone(), State::Building);
    }

    #[test]
    fn a_waiter_gets_the_serialized_plan_once_the_build_finishes() {
        let sig = Signature::from_bytes(b"background-test-built");
        assert_eq!(progress(&sig), Progress::Absent);
        assert!(take_built(&sig, &|| unreachable!()).is_none());
        mark_building(&sig);
        assert_eq!(progress(&sig), Progress::Building);
        let key = sig.clone();
        let builder = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            finish(&key, Some((b"{plan}".to_vec(), choice(7))));
        });
        let (json, c) = take_built(&sig, &|| "test graph".into()).expect("built");
        builder.join().unwrap();
        assert_eq!((json.as_slice(), c.engine_id), (&b"{plan}"[..], 7));
        assert_eq!(progress(&sig), Progress::Built);
        let waits = crate::runtime::build_events();
        assert!(waits
            .iter()
            .any(|e| e.kind == BuildKind::PlanWait && e.label == "test graph" && e.ms >= 10.0));
        // A started or finished build is never started again.
        settle(&sig);
        assert_eq!(progress(&sig), Progress::Settled);
        assert!(take_built(&sig, &|| unreachable!()).is_none());
    }

    #[test]
    fn failed_or_unserializable_builds_settle_and_release_waiters() {
        for (name, outcome) in [
            (&b"background-test-failed"[..], None),
            (&b"background-test-precompiled"[..], Some((Vec::new(), choice(3)))),
        ] {
            let sig = Signature::from_bytes(name);
            mark_building(&sig);
            let key = sig.clone();
            let builder = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                finish(&key, outcome);
            });
            wait_for_background_builds_of(&sig);
            builder.join().unwrap();
            assert_eq!(progress(&sig), Progress::Settled);
            assert!(take_built(&sig, &|| String::new()).is_none());
        }
    }

    /// `wait_for_background_builds` restricted to one signature (other tests of the crate may
    /// build at the same time).
    fn wait_for_background_builds_of(sig: &Signature) {
        let t = table();
        let mut states = t.states.lock().unwrap();
        while matches!(states.get(sig), Some(State::Building)) {
            states = t.done.wait(states).unwrap();
        }
    }
}
