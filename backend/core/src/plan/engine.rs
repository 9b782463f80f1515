//! Heuristics, engine filtering, plan building and execution on cuDNN backend descriptors.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::cache::EngineChoice;
use super::cache_stats;
use super::policy::{EnginePolicy, HeuristicMode};
use crate::error::{Error, Result};
use crate::ffi::cudnn_sys::{
    cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T, cudnnBackendDescriptorType_t as K,
};
use crate::ffi::replay::Replay;
use crate::ffi::{CudnnHandle, Descriptor};
use crate::graph::lower::LoweredGraph;

const NOTE_TENSOR_CORE: u32 = 0;
const NOTE_DOWN_CONVERT_INPUTS: u32 = 1;
const NOTE_NONDETERMINISTIC: u32 = 4;
/// `CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION`.
const NOTE_RUNTIME_COMPILATION: u32 = 0;
const MAX_NOTES: usize = 16;
/// Why a TF32 engine was passed over for f32 data.
const TF32_REJECTION: &str = "TF32 tensor cores on f32 data";
const MAX_KNOBS: usize = 32;

/// One engine configuration offered by heuristics, with what we read off it.
pub(crate) struct Candidate {
    pub(crate) cfg: Descriptor,
    pub(crate) engine_id: i64,
    pub(crate) knobs: Vec<(i64, i64)>,
    pub(crate) numerical_notes: Vec<u32>,
    /// cuDNN compiles this engine's kernel when the plan is built (milliseconds per shape).
    pub(crate) runtime_compiled: bool,
}

/// A built execution plan and what it needs at run time.
pub(crate) struct BuiltPlan {
    pub(crate) plan: Descriptor,
    pub(crate) workspace: usize,
    pub(crate) choice: EngineChoice,
    /// The variant packs of the latest distinct pointer sets, most recent first (at most
    /// [`MAX_PACKS`]): layers of one shape share the plan, each with its own buffers.
    packs: Vec<CachedPack>,
    /// The engine config and lowered graph the plan was built from (none for a plan
    /// deserialized from the persistent cache).
    _config: Option<Descriptor>,
    _graph: Option<Arc<LoweredGraph>>,
}

struct CachedPack {
    ptrs: Vec<u64>,
    workspace: u64,
    desc: Descriptor,
    /// Calls that reused this pack.
    repeats: u32,
    replay: Option<Replay>,
    capture_failed: bool,
}

/// Repeats of one pointer set after which an execution is captured into a CUDA graph.
pub(crate) const REPLAY_AFTER: u32 = 2;

/// Pointer sets a plan keeps a variant pack (and a captured graph) for. Layers of one shape
/// share a plan: a 12-layer transformer's query, key, value and output projections are 48
/// executions of one plan per step, for the forward and for each gradient. The packs are
/// kept most recent first, so a step that cycles through more pointer sets than the plan
/// keeps would miss on every execution (a new pack, never a replay): the bound leaves room
/// for 24-layer models with their four projections sharing a shape, and more.
const MAX_PACKS: usize = 256;

/// The SM-count target to pass cuDNN for `graph` under `policy`: the policy's carveout, for
/// the graphs cuDNN honours it on (convolutions and their fusions).
fn sm_target(graph: &LoweredGraph, policy: &EnginePolicy) -> Option<i32> {
    policy
        .sm_count_target
        .filter(|_| graph.convolution)
        .map(|n| n.min(i32::MAX as u32) as i32)
}

/// The finalized heuristics query of `graph` in `mode` (for engine configs that use at most
/// `sm_target` SMs when given) and how many configs it offers.
fn heuristic_query(graph: &LoweredGraph, mode: u32, sm_target: Option<i32>) -> Result<(Descriptor, usize)> {
    let mut h = Descriptor::new(K::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    h.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &graph.op_graph)?;
    h.set_enum(A::CUDNN_ATTR_ENGINEHEUR_MODE, T::CUDNN_TYPE_HEUR_MODE, mode)?;
    if let Some(n) = sm_target {
        h.set_i32(A::CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET, n)?;
    }
    h.finalize()?;
    let n = h.count(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, T::CUDNN_TYPE_BACKEND_DESCRIPTOR)?;
    Ok((h, n))
}

/// The first `count` engine configs of a finalized heuristics query, best first.
fn heuristic_configs(query: &Descriptor, count: usize) -> Result<Vec<Descriptor>> {
    query.get_descs(
        A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
        K::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
        count,
    )
}

fn read_candidate(cfg: Descriptor) -> Result<Candidate> {
    let engine = cfg
        .get_descs(A::CUDNN_ATTR_ENGINECFG_ENGINE, K::CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1)?
        .pop()
        .ok_or_else(|| Error::Unsupported {
            graph: "engine config".into(),
            reason: "config without engine".into(),
        })?;
    let engine_id = engine.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    let numerical_notes = engine.get_enums(
        A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
        T::CUDNN_TYPE_NUMERICAL_NOTE,
        MAX_NOTES,
    )?;
    // Older cuDNN versions may not report behavior notes: then nothing is known compiled.
    let runtime_compiled = engine
        .get_enums(
            A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
            T::CUDNN_TYPE_BEHAVIOR_NOTE,
            MAX_NOTES,
        )
        .is_ok_and(|notes| notes.contains(&NOTE_RUNTIME_COMPILATION));
    let knob_count = cfg
        .count(A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, T::CUDNN_TYPE_BACKEND_DESCRIPTOR)?
        .min(MAX_KNOBS);
    let knob_descs = cfg.get_descs(
        A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
        K::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
        knob_count,
    )?;
    let mut knobs = Vec::with_capacity(knob_descs.len());
    for k in &knob_descs {
        let ty = k.get_enums(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, T::CUDNN_TYPE_KNOB_TYPE, 1)?;
        let value = k.get_i64(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?;
        if let Some(&ty) = ty.first() {
            knobs.push((ty as i64, value));
        }
    }
    Ok(Candidate {
        cfg,
        engine_id,
        knobs,
        numerical_notes,
        runtime_compiled,
    })
}

/// Configs read from a heuristics query before the rest are asked for: a plan usually
/// builds from the first, and cuDNN checks each config it returns for support (for matmuls
/// that check dominates a new shape's host time), so the first is asked for alone.
const FIRST_CONFIGS: usize = 1;

/// With [`Candidates::prefer_precompiled`], how many configs are read looking for a
/// precompiled engine before the runtime-compiled ones passed over are offered.
const PRECOMPILED_SEARCH: usize = 8;

/// Engine configs for `graph`, best first, read lazily: the policy's heuristic, then (only
/// when those run out) the fallback list, deduplicated and filtered by the policy's
/// numerical-note rules. `exclude_tf32` drops engines noted as using tensor cores on f32
/// data (meaningful for convolutions; cuDNN's matmul engines expose no non-TF32 f32 path
/// through notes).
pub(crate) struct Candidates<'a> {
    graph: &'a LoweredGraph,
    policy: &'a EnginePolicy,
    exclude_tf32: bool,
    /// Heuristic modes still to query.
    modes: std::vec::IntoIter<u32>,
    /// The current mode's query, its config count, and how many configs were fetched.
    query: Option<(Descriptor, usize, usize)>,
    pending: std::collections::VecDeque<Descriptor>,
    seen: Vec<(i64, Vec<(i64, i64)>)>,
    /// Offer precompiled engines before runtime-compiled ones among the first
    /// [`PRECOMPILED_SEARCH`] configs.
    prefer_precompiled: bool,
    /// Runtime-compiled candidates held back by `prefer_precompiled`.
    deferred: std::collections::VecDeque<Candidate>,
    /// Configs read so far.
    examined: usize,
    /// Why configs were passed over.
    pub(crate) rejected: Vec<String>,
    /// Some config was passed over only for using TF32 on f32 data.
    pub(crate) tf32_rejected: bool,
    /// The last heuristics query that failed.
    pub(crate) query_error: Option<Error>,
}

impl<'a> Candidates<'a> {
    /// Candidates of `graph` under `policy` (nothing is queried until the first `next`).
    pub(crate) fn new(graph: &'a LoweredGraph, policy: &'a EnginePolicy, exclude_tf32: bool) -> Self {
        let first = match policy.heuristic {
            HeuristicMode::A => 3,
            HeuristicMode::B => 1,
        };
        Self {
            graph,
            policy,
            exclude_tf32,
            modes: vec![first, 2 /* fallback */].into_iter(),
            query: None,
            pending: Default::default(),
            seen: Vec::new(),
            prefer_precompiled: false,
            deferred: Default::default(),
            examined: 0,
            rejected: Vec::new(),
            tf32_rejected: false,
            query_error: None,
        }
    }

    /// Offers engines that need no runtime compilation first when one is among the first
    /// few configs: a new shape then costs no kernel compile (for plain matmuls, where
    /// cuDNN's precompiled engines are as fast).
    pub(crate) fn prefer_precompiled(mut self, yes: bool) -> Self {
        self.prefer_precompiled = yes;
        self
    }

    /// The next unread engine config, querying and fetching as needed.
    fn next_config(&mut self) -> Option<Descriptor> {
        loop {
            if let Some(cfg) = self.pending.pop_front() {
                return Some(cfg);
            }
            if let Some((query, total, fetched)) = &mut self.query {
                if *fetched < *total {
                    // One config, then a few, then all: each one fetched costs a support check.
                    let want = match *fetched {
                        0 => FIRST_CONFIGS,
                        f if f < PRECOMPILED_SEARCH => PRECOMPILED_SEARCH,
                        _ => *total,
                    }
                    .min(*total);
                    match heuristic_configs(query, want) {
                        Ok(cfgs) => {
                            self.pending.extend(cfgs.into_iter().skip(*fetched));
                            *fetched = want;
                            continue;
                        }
                        Err(e) => self.query_error = Some(e),
                    }
                }
                self.query = None;
            }
            let mode = self.modes.next()?;
            match heuristic_query(self.graph, mode, sm_target(self.graph, self.policy)) {
                Ok((query, total)) => self.query = Some((query, total, 0)),
                Err(e) => self.query_error = Some(e),
            }
        }
    }
}

impl Iterator for Candidates<'_> {
    type Item = Candidate;

    fn next(&mut self) -> Option<Candidate> {
        loop {
            if self.examined >= PRECOMPILED_SEARCH {
                if let Some(c) = self.deferred.pop_front() {
                    return Some(c);
                }
            }
            let Some(cfg) = self.next_config() else {
                return self.deferred.pop_front();
            };
            self.examined += 1;
            let c = match read_candidate(cfg) {
                Ok(c) => c,
                Err(e) => {
                    self.rejected.push(format!("unreadable config: {e}"));
                    continue;
                }
            };
            if self
                .seen
                .iter()
                .any(|(id, knobs)| *id == c.engine_id && *knobs == c.knobs)
            {
                continue;
            }
            self.seen.push((c.engine_id, c.knobs.clone()));
            let has = |n: u32| c.numerical_notes.contains(&n);
            let reason = if self.policy.deterministic && has(NOTE_NONDETERMINISTIC) {
                Some("nondeterministic")
            } else if self.policy.forbid_down_convert && has(NOTE_DOWN_CONVERT_INPUTS) {
                Some("down-converts inputs")
            } else if self.exclude_tf32 && has(NOTE_TENSOR_CORE) {
                Some(TF32_REJECTION)
            } else {
                None
            };
            match reason {
                Some(r) => {
                    self.tf32_rejected |= r == TF32_REJECTION;
                    self.rejected.push(format!("engine {}: {r}", c.engine_id))
                }
                None if self.prefer_precompiled && c.runtime_compiled && self.examined <= PRECOMPILED_SEARCH => {
                    self.deferred.push_back(c)
                }
                None => return Some(c),
            }
        }
    }
}

/// Builds (finalizes) an execution plan for one engine config.
pub(crate) fn build(
    handle: &CudnnHandle,
    graph: Arc<LoweredGraph>,
    cfg: Descriptor,
    choice: EngineChoice,
) -> Result<BuiltPlan> {
    let mut plan = Descriptor::new(K::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle.raw())?;
    plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &cfg)?;
    if let Some(injected) = super::fault::plan_build_fault() {
        return Err(injected);
    }
    match &graph.kernel_cache {
        Some(cache) => {
            let cache = cache.lock();
            plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE, &cache)?;
            plan.finalize()?;
        }
        None => plan.finalize()?,
    }
    let workspace = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize;
    let choice = EngineChoice {
        workspace_bytes: workspace as u64,
        ..choice
    };
    Ok(BuiltPlan {
        plan,
        workspace,
        choice,
        packs: Vec::new(),
        _config: Some(cfg),
        _graph: Some(graph),
    })
}

/// The JSON representation of a built plan (runtime-compiled kernels included), or an error
/// for engines cuDNN cannot serialize (it serializes runtime-compiled engines only).
pub(crate) fn serialize(plan: &BuiltPlan) -> Result<Vec<u8>> {
    plan.plan.get_chars(A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION)
}

/// A plan restored from [`serialize`]'s bytes on `handle` (no heuristics, no compilation).
pub(crate) fn deserialize(handle: &CudnnHandle, json: &[u8], choice: EngineChoice) -> Result<BuiltPlan> {
    let mut plan = Descriptor::new(K::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle.raw())?;
    plan.set_chars(A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, json)?;
    plan.finalize()?;
    let workspace = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize;
    Ok(BuiltPlan {
        plan,
        workspace,
        choice: EngineChoice {
            workspace_bytes: workspace as u64,
            ..choice
        },
        packs: Vec::new(),
        _config: None,
        _graph: None,
    })
}

/// Recreates the engine config a stored [`EngineChoice`] names (engine + knobs), with the
/// policy's SM carveout (the choice was made under the same policy: it is in the key).
pub(crate) fn config_from_choice(
    graph: &LoweredGraph,
    choice: &EngineChoice,
    policy: &EnginePolicy,
) -> Result<Descriptor> {
    let mut engine = Descriptor::new(K::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    engine.set_desc(A::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &graph.op_graph)?;
    engine.set_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, choice.engine_id)?;
    if let Some(n) = sm_target(graph, policy) {
        engine.set_i32(A::CUDNN_ATTR_ENGINE_SM_COUNT_TARGET, n)?;
    }
    engine.finalize()?;
    let mut knobs = Vec::with_capacity(choice.knobs.len());
    for &(ty, value) in &choice.knobs {
        let mut k = Descriptor::new(K::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)?;
        k.set_enum(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, T::CUDNN_TYPE_KNOB_TYPE, ty as u32)?;
        k.set_i64(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, value)?;
        k.finalize()?;
        knobs.push(k);
    }
    let mut cfg = Descriptor::new(K::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
    cfg.set_desc(A::CUDNN_ATTR_ENGINECFG_ENGINE, &engine)?;
    if !knobs.is_empty() {
        let refs: Vec<&Descriptor> = knobs.iter().collect();
        cfg.set_descs(A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, &refs)?;
    }
    cfg.finalize()?;
    Ok(cfg)
}

/// Enqueues `plan` on `stream` (the handle's bound stream) with the given (uid, pointer)
/// pairs. A variant pack is built once per pointer set and workspace (the plan keeps the
/// latest [`MAX_PACKS`]). With `capture_on` (a stream private to the handle), a pointer set
/// repeated [`REPLAY_AFTER`] times is captured into a CUDA graph and later repeats launch the
/// graph. A failed capture is remembered and that pointer set runs normally.
pub(crate) fn execute(
    handle: &CudnnHandle,
    plan: &mut BuiltPlan,
    uids: &[i64],
    ptrs: &[*mut c_void],
    workspace: u64,
    stream: &CudaStream,
    capture_on: Option<&Arc<CudaStream>>,
) -> Result<()> {
    use crate::ffi::counters::{add, Count, HostTimer};
    add(Count::CudnnExecutions, 1);
    let _timer = HostTimer::start(Count::CudnnNs);
    let same = |p: &CachedPack| {
        p.workspace == workspace && p.ptrs.len() == ptrs.len() && p.ptrs.iter().zip(ptrs).all(|(&a, &b)| a == b as u64)
    };
    match plan.packs.iter().position(same) {
        Some(i) => {
            plan.packs[..=i].rotate_right(1);
            plan.packs[0].repeats = plan.packs[0].repeats.saturating_add(1);
        }
        None => {
            let mut vp = Descriptor::new(K::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
            vp.set_i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
            vp.set_void_ptrs(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, ptrs)?;
            vp.set_void_ptrs(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &[workspace as *mut c_void])?;
            vp.finalize()?;
            plan.packs.truncate(MAX_PACKS - 1);
            plan.packs.insert(
                0,
                CachedPack {
                    ptrs: ptrs.iter().map(|&p| p as u64).collect(),
                    workspace,
                    desc: vp,
                    repeats: 0,
                    replay: None,
                    capture_failed: false,
                },
            );
        }
    }
    let pack = &mut plan.packs[0];
    let Some(private) = capture_on else {
        // Replay is off for this call: drop any graph so the plan runs as cuDNN launches it.
        pack.replay = None;
        return plan.plan.execute(handle, &pack.desc);
    };
    if let Some(graph) = &pack.replay {
        bump(&cache_stats().replay_launches);
        return graph.launch(stream);
    }
    if !pack.capture_failed && pack.repeats >= REPLAY_AFTER {
        match Replay::capture(private, stream, handle, &plan.plan, &pack.desc) {
            Ok(graph) => {
                bump(&cache_stats().replay_captures);
                graph.launch(stream)?;
                pack.replay = Some(graph);
                return Ok(());
            }
            Err(e) => {
                tracing::debug!("engine {}: not replayed as a CUDA graph: {e}", plan.choice.engine_id);
                pack.capture_failed = true;
                bump(&cache_stats().replay_failures);
            }
        }
    }
    plan.plan.execute(handle, &pack.desc)
}

fn bump(counter: &std::sync::atomic::AtomicU64) {
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}
