//! `execute_graph`: signature → per-handle plan LRU → (miss) shared choice cache with
//! single flight → (miss) heuristics or autotune → build → execute.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::CudaStream;

use super::background;
use super::cache::{EngineChoice, Signature};
use super::engine::{self, BuiltPlan, Candidate};
use super::handles::cudnn_pool;
use super::persist::{dir_from_env, TuningFile, TuningKey};
use super::policy::EnginePolicy;
use super::{choice_cache, policy};
use crate::error::{Error, Result};
use crate::ffi::memory::on_another_gpu;
use crate::ffi::CudnnHandle;
use crate::graph::{DataType, Graph, Op, Scalar, SignatureContext, TensorId};
use crate::runtime::{with_workspace, Device};
use crate::types::{TensorMut, TensorRef};

/// The memory of one non-virtual tensor of a graph: a view (checked against the tensor the
/// graph declares when the graph runs) or, `unsafe`, a raw device address.
#[derive(Clone, Debug)]
pub struct Binding<'a> {
    tensor: TensorId,
    ptr: u64,
    view: Option<(TensorRef<'a>, bool)>,
}

impl<'a> Binding<'a> {
    /// Binds an input tensor of the graph to `view`, which must have the dims, strides and
    /// dtype the graph declares for it.
    pub fn input(tensor: TensorId, view: &TensorRef<'a>) -> Self {
        Self {
            tensor,
            ptr: view.ptr,
            view: Some((view.clone(), false)),
        }
    }

    /// Binds a tensor the graph writes (or reads) to the writable `view`, which must have the
    /// dims, strides and dtype the graph declares for it.
    pub fn output(tensor: TensorId, view: &TensorMut<'a>) -> Self {
        Self {
            tensor,
            ptr: view.ptr,
            view: Some((TensorRef::clone(view), true)),
        }
    }

    /// Binds `tensor` to the raw device address `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` holds the tensor as the graph declares it (dims, strides, dtype): the memory
    /// from its lowest to its highest element lies in one allocation of the stream's GPU,
    /// readable, and writable where the graph writes the tensor, and stays so, untouched by
    /// other work, until the work the execution enqueues is done.
    pub unsafe fn from_raw(tensor: TensorId, ptr: u64) -> Self {
        Self {
            tensor,
            ptr,
            view: None,
        }
    }

    /// The bound tensor.
    pub fn tensor(&self) -> TensorId {
        self.tensor
    }

    /// The bound device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Checks a view binding against the tensor `t` the graph declares (`written` when a node
    /// of the graph writes it) and the stream it runs on.
    fn check(&self, t: &crate::graph::Tensor, written: bool, stream: &CudaStream) -> Result<()> {
        const OP: &str = "execute_graph";
        let Some((view, writable)) = &self.view else {
            return Ok(());
        };
        view.check_stream(stream, OP, "bindings")?;
        if written && !writable {
            return Err(Error::invalid_arg(
                OP,
                "bindings",
                format!("`{}` is written by the graph: bind it with Binding::output", t.name),
            ));
        }
        if view.dims[..] != t.dims[..] || view.strides[..] != t.strides[..] || Some(view.dtype) != t.dtype {
            return Err(Error::invalid_arg(
                OP,
                "bindings",
                format!(
                    "the view bound to `{}` is {:?} / {:?} {:?}, the graph declares {:?} / {:?} {:?}",
                    t.name, view.dims, view.strides, view.dtype, t.dims, t.strides, t.dtype
                ),
            ));
        }
        Ok(())
    }
}

/// Executes a validated graph on `device`'s default stream.
pub fn execute_graph(device: &Device, graph: &Graph, bindings: &[Binding]) -> Result<()> {
    execute_graph_on(device.stream(), graph, bindings)
}

fn io_dtype(graph: &Graph) -> DataType {
    graph
        .tensors()
        .iter()
        .find(|t| !t.is_virtual && t.by_value.is_none())
        .and_then(|t| t.dtype)
        .unwrap_or(DataType::F32)
}

fn crate_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

fn tuning_key(dev: &Device, cudnn: usize) -> TuningKey {
    TuningKey {
        gpu_name: dev.info().name.clone(),
        compute_capability: dev.info().compute_capability,
        cudnn_version: cudnn as u64,
        crate_version: crate_version(),
    }
}

fn load_tuning(dev: &Device, cudnn: usize) {
    dev.tuning_loaded.get_or_init(|| {
        if let Some(dir) = dir_from_env() {
            let key = tuning_key(dev, cudnn);
            let entries = TuningFile::load(&TuningFile::path_for(&dir, &key), &key);
            tracing::debug!("loaded {} engine choices from {}", entries.len(), dir.display());
            choice_cache().extend(entries);
        }
    });
}

fn save_tuning(dev: &Device, cudnn: usize) {
    if let Some(dir) = dir_from_env() {
        let key = tuning_key(dev, cudnn);
        if let Err(e) = TuningFile::save(&TuningFile::path_for(&dir, &key), &key, &choice_cache().snapshot()) {
            tracing::warn!("could not write the tuning file in {}: {e}", dir.display());
        }
    }
}

/// Executes a validated graph on `stream` (any stream of the device, e.g. a framework's).
///
/// Every non-virtual, non-scalar tensor needs a [`Binding`] whose pointer is non-null and
/// aligned to the tensor's declared alignment. Work is enqueued; nothing synchronizes.
pub fn execute_graph_on(stream: &Arc<CudaStream>, graph: &Graph, bindings: &[Binding]) -> Result<()> {
    if !graph.is_validated() {
        return Err(Error::InvalidGraph(
            "execute needs a validated graph: call validate() first".into(),
        ));
    }
    if graph.nodes().iter().any(|n| matches!(n.op, Op::ResampleBwd { .. })) {
        // cuDNN 9.14's heuristics crash (SIGSEGV in the runtime-compiled engines' support
        // check) on resample-backward graphs; ops::pool_backward uses cuDNN's pooling API.
        return Err(Error::Unsupported {
            graph: graph.describe(),
            reason: "resample-backward graphs are not executed (cuDNN 9.x crashes on them); use ops::pool_backward"
                .into(),
        });
    }
    let mut scalars: Vec<[u8; 8]> = Vec::new();
    stream.context().bind_to_thread()?;
    let (uids, ptrs) = variant_pointers(graph, bindings, stream, &mut scalars)?;
    // A captured graph would freeze by-value scalars, so graphs with scalars never replay.
    let replayable = graph.tensors().iter().all(|t| t.by_value.is_none());
    execute_keyed(
        stream,
        |ctx| graph.signature_bytes(ctx),
        &uids,
        &ptrs,
        replayable,
        &|| Ok(Cow::Borrowed(graph)),
    )
}

/// The execution core shared by [`execute_graph_on`] and the `ops`: `key(ctx)` gives the
/// signature bytes; `graph()` is called only on a plan-cache miss, so the hot path (hash,
/// per-handle LRU hit, execute) never builds or validates a graph. `uids`/`ptrs` are the
/// variant pack, in the graph's non-virtual uid order. `replayable`: the execution may be
/// captured as a CUDA graph when it repeats (false when the graph has by-value scalars).
pub(crate) fn execute_keyed<'g>(
    stream: &Arc<CudaStream>,
    key: impl FnOnce(&SignatureContext) -> Vec<u8>,
    uids: &[i64],
    ptrs: &[*mut c_void],
    replayable: bool,
    graph: &dyn Fn() -> Result<Cow<'g, Graph>>,
) -> Result<()> {
    execute_core(stream, key, uids, ptrs, replayable, graph, false).map(|_| ())
}

/// [`execute_keyed`] for an op that has an unfused way to run: when the plan is new and no
/// serialized form of it is at hand, its build starts on a background thread and `Ok(false)`
/// says that nothing ran (the caller runs its unfused path); once built, the plan runs as
/// usual (`Ok(true)`). With a benchmark or deterministic policy the plan is built here and
/// always runs, so results never depend on how fast a build finished.
pub(crate) fn execute_keyed_when_built<'g>(
    stream: &Arc<CudaStream>,
    key: impl FnOnce(&SignatureContext) -> Vec<u8>,
    uids: &[i64],
    ptrs: &[*mut c_void],
    replayable: bool,
    graph: &dyn Fn() -> Result<Cow<'g, Graph>>,
) -> Result<bool> {
    execute_core(stream, key, uids, ptrs, replayable, graph, true)
}

/// Starts building the plan of a graph the caller will execute soon (same key, same graph),
/// on a background thread, so the build overlaps the work in between; does nothing when the
/// plan is known, stored in the persistent cache, or the policy autotunes (an autotuned
/// build needs the real buffers). `graph()` is called only when a build starts.
pub(crate) fn prefetch_keyed<'g>(
    stream: &Arc<CudaStream>,
    key: impl FnOnce(&SignatureContext) -> Vec<u8>,
    graph: &dyn Fn() -> Result<Cow<'g, Graph>>,
) -> Result<()> {
    let policy = policy();
    if policy.benchmark {
        return Ok(());
    }
    let (dev, cudnn, sig) = signature_for(stream, key, &policy)?;
    if background::progress(&sig) != background::Progress::Absent
        || known_unsupported(&sig).is_some()
        || choice_cache().contains(&sig)
        || super::serialized::stored(&sig, &dev, cudnn)
    {
        return Ok(());
    }
    load_tuning(&dev, cudnn);
    background::start(&dev, sig, graph()?.into_owned(), policy, cudnn, built_without_operands);
    Ok(())
}

/// The device, cuDNN version and plan signature of a call on `stream`.
fn signature_for(
    stream: &Arc<CudaStream>,
    key: impl FnOnce(&SignatureContext) -> Vec<u8>,
    policy: &EnginePolicy,
) -> Result<(Arc<Device>, usize, Signature)> {
    let dev = Device::new(stream.context().ordinal())?;
    dev.context().bind_to_thread()?;
    let cudnn = crate::ffi::cudnn_version()?;
    let ctx = SignatureContext {
        compute_capability: dev.info().compute_capability,
        cudnn_version: cudnn as u64,
        policy: policy.signature_bits() ^ super::policy::lib_config_bits(),
    };
    Ok((dev, cudnn, Signature::new(key(&ctx))))
}

/// [`execute_keyed`] and, with `when_built`, [`execute_keyed_when_built`].
#[allow(clippy::too_many_arguments)]
fn execute_core<'g>(
    stream: &Arc<CudaStream>,
    key: impl FnOnce(&SignatureContext) -> Vec<u8>,
    uids: &[i64],
    ptrs: &[*mut c_void],
    replayable: bool,
    graph: &dyn Fn() -> Result<Cow<'g, Graph>>,
    when_built: bool,
) -> Result<bool> {
    let policy = policy();
    let (dev, cudnn, sig) = signature_for(stream, key, &policy)?;
    let when_built = when_built && !policy.benchmark && !policy.deterministic;
    let run = |h: &mut super::handles::PooledCudnn| -> Result<bool> {
        let super::handles::PooledCudnn {
            handle,
            plans,
            capture_stream,
        } = h;
        let handle = &*handle;
        if when_built && !plans.contains(&sig) && known_unsupported(&sig).is_none() {
            match background::progress(&sig) {
                background::Progress::Building => return Ok(false),
                background::Progress::Built | background::Progress::Settled => {}
                background::Progress::Absent => {
                    if !choice_cache().contains(&sig) && !super::serialized::stored(&sig, &dev, cudnn) {
                        let g = graph()?;
                        check_uids(&g, uids)?;
                        load_tuning(&dev, cudnn);
                        if background::start(&dev, sig.clone(), g.into_owned(), policy, cudnn, built_without_operands) {
                            return Ok(false);
                        }
                    }
                }
            }
        }
        let mut fresh = None;
        let plan = plans.get_or_try_insert_with(&sig, || {
            if let Some(err) = known_unsupported(&sig) {
                return Err(err);
            }
            let g = graph()?;
            check_uids(&g, uids)?;
            load_tuning(&dev, cudnn);
            let plan = plan_for(handle, &g, &sig, &policy, stream, uids, ptrs, &dev, cudnn)?;
            fresh = Some(g);
            Ok(plan)
        })?;
        let replay = replayable && policy.graph_replay;
        if replay && capture_stream.is_none() {
            *capture_stream = Some(dev.context().new_stream()?);
        }
        let capture_on = if replay { capture_stream.as_ref() } else { None };
        match with_workspace(stream, plan.workspace, |ws| {
            engine::execute(handle, plan, uids, ptrs, ws.get(), stream, capture_on)
        }) {
            // Deterministic mode keeps every graph on its engine: another engine rounds
            // differently, so the allocation failure is the caller's.
            Err(Error::OutOfMemory { op, bytes, message }) if plan.workspace > 0 && policy.deterministic => {
                Err(Error::OutOfMemory {
                    op,
                    bytes,
                    message: format!(
                        "{message} (deterministic mode keeps each graph's engine rather than switch to one \
                         needing less workspace: free memory or use smaller batches)"
                    ),
                })
            }
            Err(oom @ Error::OutOfMemory { .. }) if plan.workspace > 0 => {
                // Retry with the best plan that needs less workspace.
                let smaller = EnginePolicy {
                    max_workspace: Some(plan.workspace as u64 - 1),
                    ..policy
                };
                let g = match fresh {
                    Some(g) => g,
                    None => graph()?,
                };
                // No plan fits: the caller gets the allocation failure, not "unsupported".
                let mut smaller_plan = match select_plan(handle, &g, &smaller, stream, uids, ptrs) {
                    Ok(p) => p,
                    Err(e) if e.is_not_supported() => return Err(oom),
                    Err(e) => return Err(e),
                };
                warn_engine_switch(&g, plan.workspace, &oom);
                crate::ffi::counters::add(crate::ffi::counters::Count::EngineSwitches, 1);
                with_workspace(stream, smaller_plan.workspace, |ws| {
                    engine::execute(handle, &mut smaller_plan, uids, ptrs, ws.get(), stream, None)
                })?;
                plans.insert(sig.clone(), smaller_plan);
                Ok(())
            }
            other => other,
        }
        .map(|()| true)
    };
    cudnn_pool().with_handle(dev.ordinal(), stream.cu_stream() as usize, run)?
}

/// The first graph that leaves its engine for lack of workspace memory is a warning (its
/// results may then differ in rounding from earlier runs); later ones are debug messages.
fn warn_engine_switch(graph: &Graph, workspace: usize, e: &Error) {
    if crate::engine().first_warning("workspace engine switch") {
        tracing::warn!(
            graph = %graph.describe(),
            reason = %e,
            "its {workspace}-byte cuDNN workspace could not be allocated, even after releasing cached memory: \
             it runs on the best engine needing less from now on, whose results may differ in rounding \
             (warned once; deterministic mode reports the allocation failure instead)"
        );
    } else {
        tracing::debug!(graph = %graph.describe(), "workspace of {workspace} bytes unavailable; smaller engine");
    }
}

/// The caller's variant-pack uids must be exactly the graph's non-virtual tensors.
fn check_uids(g: &Graph, uids: &[i64]) -> Result<()> {
    let expect: Vec<i64> = g.tensors().iter().filter(|t| !t.is_virtual).map(|t| t.uid).collect();
    if expect != uids {
        return Err(Error::InvalidGraph(format!(
            "variant pack uids {uids:?} do not match the graph's non-virtual tensors {expect:?} ({})",
            g.describe()
        )));
    }
    Ok(())
}

/// The variant pack of `graph`: by-value scalars point into `scalars`; every binding must be
/// non-null, aligned as declared and not in another GPU's memory than `ordinal`'s.
fn variant_pointers(
    graph: &Graph,
    bindings: &[Binding],
    stream: &CudaStream,
    scalars: &mut Vec<[u8; 8]>,
) -> Result<(Vec<i64>, Vec<*mut c_void>)> {
    let ordinal = stream.context().ordinal();
    let written: Vec<TensorId> = graph.nodes().iter().flat_map(|n| n.op.outputs()).collect();
    let io: Vec<(usize, &crate::graph::Tensor)> = graph
        .tensors()
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_virtual)
        .collect();
    scalars.reserve(io.len());
    let mut uids = Vec::with_capacity(io.len());
    let mut ptrs = Vec::with_capacity(io.len());
    for (i, t) in io {
        if let Some(s) = t.by_value {
            scalars.push(match s {
                Scalar::F32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
                Scalar::F64(v) => v.to_ne_bytes(),
                Scalar::I64(v) => v.to_ne_bytes(),
                Scalar::I32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
            });
            uids.push(t.uid);
            let last = scalars.len() - 1;
            ptrs.push(scalars[last].as_mut_ptr().cast());
            continue;
        }
        let b = bindings.iter().find(|b| b.tensor.index() == i).ok_or_else(|| {
            Error::invalid_arg(
                "execute_graph",
                "bindings",
                format!("no device pointer bound to tensor `{}`", t.name),
            )
        })?;
        if b.ptr == 0 {
            return Err(Error::invalid_arg(
                "execute_graph",
                "bindings",
                format!("null pointer bound to `{}`", t.name),
            ));
        }
        b.check(t, written.contains(&b.tensor), stream)?;
        if b.ptr % t.alignment as u64 != 0 {
            return Err(Error::invalid_arg(
                "execute_graph",
                "bindings",
                format!(
                    "pointer {:#x} of `{}` is not aligned to the declared {} bytes",
                    b.ptr, t.name, t.alignment
                ),
            ));
        }
        if let Some(other) = on_another_gpu(b.ptr, ordinal) {
            return Err(Error::invalid_arg(
                "execute_graph",
                "bindings",
                format!(
                    "`{}` points into GPU {other}'s memory but the stream runs on GPU {ordinal}",
                    t.name
                ),
            ));
        }
        uids.push(t.uid);
        ptrs.push(b.ptr as *mut c_void);
    }
    Ok((uids, ptrs))
}

/// Gets a plan for `sig`: from the shared choice (single flight), else by selecting one.
#[allow(clippy::too_many_arguments)]
fn plan_for(
    handle: &CudnnHandle,
    graph: &Graph,
    sig: &Signature,
    policy: &EnginePolicy,
    stream: &Arc<CudaStream>,
    uids: &[i64],
    ptrs: &[*mut c_void],
    dev: &Device,
    cudnn: usize,
) -> Result<BuiltPlan> {
    let start = Instant::now();
    if let Some((json, choice)) = background::take_built(sig, &|| graph.describe()) {
        match engine::deserialize(handle, &json, choice) {
            Ok(plan) => {
                crate::runtime::record_build(crate::runtime::BuildKind::PlanRestore, graph.describe(), start);
                return Ok(plan);
            }
            Err(e) => {
                tracing::warn!(reason = %e, "a plan built in the background did not restore; building it again");
                background::settle(sig);
            }
        }
    }
    let start = Instant::now();
    if let Some(plan) = super::serialized::restore(handle, sig, dev, cudnn) {
        crate::runtime::record_build(crate::runtime::BuildKind::PlanRestore, graph.describe(), start);
        return Ok(plan);
    }
    let plan = plan_built(handle, graph, sig, policy, stream, uids, ptrs, dev, cudnn)?;
    super::serialized::store(&plan, sig, dev, cudnn);
    Ok(plan)
}

/// [`plan_built`] with no operand addresses: the builder a background build runs (see
/// [`background::PlanBuilder`]).
fn built_without_operands(
    handle: &CudnnHandle,
    graph: &Graph,
    sig: &Signature,
    policy: &EnginePolicy,
    stream: &Arc<CudaStream>,
    dev: &Device,
    cudnn: usize,
) -> Result<BuiltPlan> {
    plan_built(handle, graph, sig, policy, stream, &[], &[], dev, cudnn)
}

/// [`plan_for`] when no serialized plan exists: heuristics (or the shared choice) and a build.
#[allow(clippy::too_many_arguments)]
fn plan_built(
    handle: &CudnnHandle,
    graph: &Graph,
    sig: &Signature,
    policy: &EnginePolicy,
    stream: &Arc<CudaStream>,
    uids: &[i64],
    ptrs: &[*mut c_void],
    dev: &Device,
    cudnn: usize,
) -> Result<BuiltPlan> {
    let mut built = None;
    let (choice, _) = choice_cache().get_or_build(sig, || {
        let start = Instant::now();
        let plan = select_plan(handle, graph, policy, stream, uids, ptrs).inspect_err(|e| {
            if let Error::Unsupported { graph, reason } = e {
                remember_unsupported(sig, graph, reason);
            }
        })?;
        // (`build_time_ns` is counted by the choice cache around this builder.)
        let label = format!("{} -> engine {}", graph.describe(), plan.choice.engine_id);
        crate::runtime::record_build(crate::runtime::BuildKind::PlanBuild, label, start);
        let choice = plan.choice.clone();
        built = Some(plan);
        Ok::<_, Error>(choice)
    })?;
    if let Some(plan) = built {
        save_tuning(dev, cudnn);
        return Ok(plan);
    }
    let lowered = Arc::new(super::dynamic_shapes::lower_for_plan(
        graph,
        handle,
        policy,
        dev.ordinal(),
    )?);
    // A choice made on the whole GPU because no engine honoured the carveout (see
    // `select_plan`) is rebuilt without it.
    let build = |policy: &EnginePolicy| {
        engine::config_from_choice(&lowered, &choice, policy)
            .and_then(|cfg| engine::build(handle, lowered.clone(), cfg, choice.clone()))
    };
    let restored = match build(policy) {
        Err(_) if policy.sm_count_target.is_some() => build(&whole_gpu(policy)),
        other => other,
    };
    match restored {
        Ok(plan) => Ok(plan),
        Err(e) => {
            tracing::warn!(
                "cached engine choice {} no longer builds ({e}); selecting again",
                choice.engine_id
            );
            let plan = select_plan(handle, graph, policy, stream, uids, ptrs)?;
            choice_cache().insert(sig.clone(), plan.choice.clone());
            Ok(plan)
        }
    }
}

/// Chooses and builds a plan under `policy`: the first candidate that builds within the
/// workspace cap, or in benchmark mode the fastest of the first `autotune_top_k`.
pub(crate) fn select_plan(
    handle: &CudnnHandle,
    graph: &Graph,
    policy: &EnginePolicy,
    stream: &Arc<CudaStream>,
    uids: &[i64],
    ptrs: &[*mut c_void],
) -> Result<BuiltPlan> {
    let lowered = Arc::new(super::dynamic_shapes::lower_for_plan(
        graph,
        handle,
        policy,
        stream.context().ordinal(),
    )?);
    let has_conv = graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::ConvFprop { .. } | Op::ConvDgrad { .. } | Op::ConvWgrad { .. }));
    let exclude_tf32 = !policy.allow_tf32 && io_dtype(graph) == DataType::F32 && has_conv;
    let mut tf32_rejected = false;
    let select = |exclude_tf32, tf32_rejected: &mut bool| {
        select_among(
            handle,
            graph,
            &lowered,
            policy,
            exclude_tf32,
            tf32_rejected,
            stream,
            uids,
            ptrs,
        )
    };
    match select(exclude_tf32, &mut tf32_rejected) {
        // cuDNN may offer no engine for a graph it accepted as dynamic-shape: that topology is
        // built for its shape from now on.
        Err(e) if lowered.dynamic && matches!(e.root(), Error::Unsupported { .. }) => {
            tracing::debug!(graph = %graph.describe(), reason = %e, "no engine as a dynamic-shape graph; built for its shape");
            super::dynamic_shapes::mark_static_only(graph, stream.context().ordinal());
            select_plan(handle, graph, policy, stream, uids, ptrs)
        }
        // No engine honours the SM carveout (under `GRAPH_JIT_ONLY` the runtime-compiled
        // engines offer none): the graph runs on the whole GPU rather than on the backend's
        // far slower direct kernels.
        Err(e) if policy.sm_count_target.is_some() && has_conv && matches!(e.root(), Error::Unsupported { .. }) => {
            warn_carveout_ignored(graph, policy, &e);
            select_plan(handle, graph, &whole_gpu(policy), stream, uids, ptrs)
        }
        other => other.map_err(|e| name_lib_config(e, tf32_rejected)),
    }
}

/// `policy` without its SM carveout.
fn whole_gpu(policy: &EnginePolicy) -> EnginePolicy {
    EnginePolicy {
        sm_count_target: None,
        ..*policy
    }
}

/// The first graph that no engine runs under the SM carveout is a warning; later ones are
/// debug messages.
fn warn_carveout_ignored(graph: &Graph, policy: &EnginePolicy, e: &Error) {
    let target = policy.sm_count_target.unwrap_or(0);
    if crate::engine().first_warning("SM carveout ignored") {
        tracing::warn!(
            graph = %graph.describe(),
            reason = %e,
            "no cuDNN engine runs this graph on at most {target} SMs ({}); it runs on the whole GPU (warned once)",
            super::policy::SM_COUNT_TARGET_ENV
        );
    } else {
        tracing::debug!(graph = %graph.describe(), "no engine under the SM carveout of {target}; whole GPU");
    }
}

/// An `Unsupported` error under `GRAPH_JIT_ONLY` says which configuration declined, whether
/// engines were passed over only for using TF32, and what to change. (The convolution ops
/// then run the backend's exact direct-convolution kernels instead: see `ops::conv`.)
fn name_lib_config(e: Error, tf32_rejected: bool) -> Error {
    match e {
        Error::Unsupported { graph, reason } if super::policy::graph_jit_only() => {
            let tf32 = if tf32_rejected {
                format!(
                    "; its engines for this f32 graph use TF32 tensor cores (about 1e-3 relative error), \
                     allowed with {}=1",
                    super::policy::TF32_ENV
                )
            } else {
                String::new()
            };
            Error::Unsupported {
                graph,
                reason: format!(
                    "{reason} (cuDNN runs as {}=GRAPH_JIT_ONLY, without its precompiled engines{tf32}: unset it to \
                     use the full library)",
                    super::policy::LIB_CONFIG_ENV
                ),
            }
        }
        other => other,
    }
}

/// [`select_plan`] over the candidates of one pass (`exclude_tf32`: without TF32 engines);
/// `tf32_rejected` is set when an engine was passed over only for using TF32.
#[allow(clippy::too_many_arguments)]
fn select_among(
    handle: &CudnnHandle,
    graph: &Graph,
    lowered: &Arc<crate::graph::lower::LoweredGraph>,
    policy: &EnginePolicy,
    exclude_tf32: bool,
    tf32_rejected: &mut bool,
    stream: &Arc<CudaStream>,
    uids: &[i64],
    ptrs: &[*mut c_void],
) -> Result<BuiltPlan> {
    // A plain matmul takes a precompiled engine when heuristics offer one early, so a new
    // shape costs no runtime kernel compile (autotuning still measures them all).
    let plain_matmul = graph.nodes().len() == 1 && matches!(graph.nodes()[0].op, Op::Matmul { .. });
    let mut cands =
        engine::Candidates::new(lowered, policy, exclude_tf32).prefer_precompiled(plain_matmul && !policy.benchmark);
    let want = if policy.benchmark {
        policy.autotune_top_k.max(1) as usize
    } else {
        1
    };
    let mut built: Vec<BuiltPlan> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut offered = false;
    // A build that failed for lack of memory may succeed later: such a failure is returned
    // as is (never remembered as "unsupported").
    let mut transient: Option<Error> = None;
    for Candidate {
        cfg, engine_id, knobs, ..
    } in cands.by_ref()
    {
        offered = true;
        let choice = EngineChoice {
            engine_id,
            knobs,
            workspace_bytes: 0,
            measured_ms: None,
        };
        match engine::build(handle, lowered.clone(), cfg, choice) {
            Ok(p) if policy.max_workspace.is_some_and(|cap| p.workspace as u64 > cap) => {
                notes.push(format!("engine {engine_id}: workspace {} over cap", p.workspace));
            }
            Ok(p) => {
                built.push(p);
                if built.len() >= want {
                    break;
                }
            }
            Err(e) => {
                notes.push(format!("engine {engine_id}: {e}"));
                if transient.is_none() && matches!(&e, Error::Cudnn { status, .. } if status.is_alloc_failure()) {
                    transient = Some(e);
                }
            }
        }
    }
    *tf32_rejected = cands.tf32_rejected;
    if !offered && cands.rejected.is_empty() {
        if let Some(e) = cands.query_error.take() {
            return Err(Error::Unsupported {
                graph: graph.describe(),
                reason: format!("heuristics failed: {e}"),
            });
        }
    }
    notes.append(&mut cands.rejected);
    if built.is_empty() {
        notes.truncate(12);
        if let Some(e) = transient {
            return Err(e.with_context(format!(
                "no engine built for {}: {}",
                graph.describe(),
                notes.join("; ")
            )));
        }
        return Err(Error::Unsupported {
            graph: graph.describe(),
            reason: if notes.is_empty() {
                "cuDNN offered no engine".into()
            } else {
                notes.join("; ")
            },
        });
    }
    if built.len() == 1 {
        return Ok(built.remove(0));
    }
    autotune(handle, built, stream, uids, ptrs)
}

fn autotune(
    handle: &CudnnHandle,
    plans: Vec<BuiltPlan>,
    stream: &Arc<CudaStream>,
    uids: &[i64],
    ptrs: &[*mut c_void],
) -> Result<BuiltPlan> {
    use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    const RUNS: usize = 3;
    let mut best: Option<(f32, BuiltPlan)> = None;
    for mut plan in plans {
        let timed = with_workspace(stream, plan.workspace, |ws| {
            engine::execute(handle, &mut plan, uids, ptrs, ws.get(), stream, None)?;
            let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
            for _ in 0..RUNS {
                engine::execute(handle, &mut plan, uids, ptrs, ws.get(), stream, None)?;
            }
            let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            Ok(start.elapsed_ms(&end)? / RUNS as f32)
        });
        match timed {
            Ok(ms) => {
                plan.choice.measured_ms = Some(ms);
                if best.as_ref().is_none_or(|(b, _)| ms < *b) {
                    best = Some((ms, plan));
                }
            }
            Err(e) => tracing::debug!("autotune: engine {} failed: {e}", plan.choice.engine_id),
        }
    }
    best.map(|(_, p)| p).ok_or_else(|| Error::Unsupported {
        graph: "autotune".into(),
        reason: "every candidate failed to run".into(),
    })
}

pub(super) type UnsupportedMap = Mutex<HashMap<Signature, (String, String)>>;

fn unsupported() -> &'static UnsupportedMap {
    super::state().unsupported.get_or_init(Default::default)
}

/// Signatures no engine supports, so repeated calls fail fast (and fallbacks run at once).
fn known_unsupported(sig: &Signature) -> Option<Error> {
    let map = unsupported().lock().unwrap_or_else(|e| e.into_inner());
    map.get(sig).map(|(graph, reason)| Error::Unsupported {
        graph: graph.clone(),
        reason: reason.clone(),
    })
}

fn remember_unsupported(sig: &Signature, graph: &str, reason: &str) {
    let mut map = unsupported().lock().unwrap_or_else(|e| e.into_inner());
    if map.len() < 4096 {
        map.insert(sig.clone(), (graph.to_string(), reason.to_string()));
    }
}

/// Runs `f` with this thread's pooled cuDNN handle for `stream`'s device, bound to `stream`
/// (for cuDNN's non-graph entry points, used as fallbacks).
pub(crate) fn with_cudnn_handle<R>(stream: &Arc<CudaStream>, f: impl FnOnce(&CudnnHandle) -> Result<R>) -> Result<R> {
    let dev = Device::new(stream.context().ordinal())?;
    dev.context().bind_to_thread()?;
    cudnn_pool().with_handle(dev.ordinal(), stream.cu_stream() as usize, |h| f(&h.handle))?
}
