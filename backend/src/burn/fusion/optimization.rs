//! What the fusers make and how it runs: [`CudnnOptimization`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use burn_backend::DType;
use burn_fusion::stream::{Context, OrderedExecution, ScalarId};
use burn_fusion::{NumOperations, Optimization};
use burn_ir::{OperationIr, ScalarIr, TensorId, TensorIr, TensorStatus};
use cudarc::driver::CudaFunction;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::launch_cache::LaunchCache;
use super::{CudnnFusionHandle, CudnnFusionRuntime};
use crate::burn::tensor::{expect, to_dims, CudnnTensor};
use crate::burn::{exec, layout, Cudnn, CudnnDevice};
use crate::error::Result;
use crate::kernels::fused::{self, FusedLaunch, Program, Variant};
use crate::view::ViewLayout;

/// An input of a fused program: the (relative) tensor and whether the program holds its last
/// use (then its handle is released after the launch, or its buffer reused for an output).
#[derive(Clone, Debug)]
pub(crate) struct FusedInput {
    pub id: TensorId,
    pub last_use: bool,
}

/// The axes of a permutation: dim `i` of the result is dim `axes[i]` of its input.
pub(crate) type Axes = smallvec::SmallVec<[usize; 8]>;

/// A reshape (or a sum or mean over a dim of size 1), or a permutation of the dims, absorbed
/// into a fused run: `out` is a view of `source`, a tensor made before the run or an earlier
/// view (relative ids).
#[derive(Clone, Debug)]
pub(crate) struct FusedView {
    pub out: TensorId,
    pub source: TensorId,
    /// The view holds `source`'s last use: its handle is released when the run executes.
    pub source_last_use: bool,
    /// `out` is read after the run: its handle is registered when the run executes.
    pub keep: bool,
    /// The permutation; `None`: a reshape.
    pub axes: Option<Axes>,
}

/// A scalar operand: its (relative) value and the float dtype it is rounded to first, as the
/// unfused op would round it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedScalar {
    pub value: ScalarIr,
    pub round_to: DType,
}

/// A run of elementwise operations as one generated kernel.
#[derive(Clone, Debug)]
pub struct ElementwiseOptimization {
    pub(crate) program: Program,
    pub(crate) inputs: Vec<FusedInput>,
    /// Stored tensors (relative ids) and their dtypes, in the program's output order.
    pub(crate) outputs: Vec<(TensorId, DType)>,
    /// Tensors made outside the run and dropped inside it.
    pub(crate) dropped: Vec<TensorId>,
    /// Views the run absorbed (an input may be one).
    pub(crate) views: Vec<FusedView>,
    pub(crate) scalars: Vec<FusedScalar>,
    /// Values of the run differ in rank (their non-unit dims agree): inputs are read as views
    /// of the first output's shape (copied where no view exists), and each output is stored
    /// with its own.
    pub(crate) flat: bool,
    /// A mixed run (relative ids of a tensor of the run's shape and one of its small shape):
    /// inputs of a lower rank are read as views of the small shape, and the small outputs
    /// are stored with it (then viewed with their own dims).
    pub(crate) mixed: Option<(TensorId, TensorId)>,
    /// Where a run that reads no tensor launches.
    pub(crate) device: Option<CudnnDevice>,
    /// The operations, for the serialized state and the unfused fallback.
    pub(crate) operations: Vec<OperationIr>,
    /// The program's kernel once built, with the launch variant it was built for (an
    /// optimization lives on one device).
    pub(crate) function: Option<(Variant, CudaFunction)>,
    /// The kernel failed to build: every execution runs the operations one by one, without
    /// asking the builder again.
    pub(crate) unbuildable: bool,
    /// The pointer-free parts of recent launches by key: an execution with a key seen
    /// before (the same shapes, strides, dtypes and alignment) skips the checks and the
    /// packing.
    pub(crate) packed: LaunchCache<Box<fused::PackedLaunch>>,
}

/// Every optimization of the backend's fusers.
#[derive(Debug)]
pub enum CudnnOptimization {
    /// Elementwise operations in one kernel.
    Elementwise(ElementwiseOptimization),
    /// Burn's composed linear weight gradient as one matmul.
    LinearGrad(super::linear::LinearGradOptimization),
    /// Burn's composed linear forward (matmul, then the bias add, then relu or gelu where the
    /// sum is dropped) as one matmul graph.
    MatmulBias(super::bias::MatmulBiasOptimization),
    /// A biased conv2d and Burn's relu after it (its output dropped) as one graph.
    ConvAct(super::conv_act::ConvActOptimization),
    /// Burn's chain of sums over the leading dims (the linear bias gradient) as one reduction.
    LeadingSum(super::leading_sum::LeadingSumOptimization),
    /// Burn's composed dynamic quantization as `Cudnn`'s (scales in f32).
    QuantizeDynamic(super::quantize::QuantizeDynamicOptimization),
    /// An elementwise run ending in sums or means over some dims, as one generated kernel.
    Reduce(Box<super::reduce::ReduceOptimization>),
    /// Operations no fuser starts with (a convolution, a pooling, a slice of a tensor before
    /// one) run as they are, then a fused run of the operations after them.
    Lead(super::lead::LeadOptimization),
}

/// The serializable form of a [`CudnnOptimization`]: its operations (the fuser rebuilds the
/// rest).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum CudnnOptimizationState {
    /// The operations of an elementwise run.
    Elementwise(Vec<OperationIr>),
    /// The operations of a composed linear weight gradient.
    LinearGrad(Vec<OperationIr>),
    /// The operations of a composed linear forward with a bias.
    MatmulBias(Vec<OperationIr>),
    /// The operations of a biased conv2d and its relu.
    ConvAct(Vec<OperationIr>),
    /// The operations of a chain of sums over the leading dims.
    LeadingSum(Vec<OperationIr>),
    /// The operations of a composed dynamic quantization.
    QuantizeDynamic(Vec<OperationIr>),
    /// The operations of an elementwise run ending in reductions.
    Reduce(Vec<OperationIr>),
    /// The leading operations and the state of the fused run after them.
    Lead(Vec<OperationIr>, Box<CudnnOptimizationState>),
}

impl NumOperations for CudnnOptimization {
    fn len(&self) -> usize {
        match self {
            CudnnOptimization::Elementwise(e) => e.operations.len(),
            CudnnOptimization::LinearGrad(l) => l.operations.len(),
            CudnnOptimization::MatmulBias(m) => m.operations.len(),
            CudnnOptimization::ConvAct(c) => c.operations.len(),
            CudnnOptimization::LeadingSum(s) => s.operations.len(),
            CudnnOptimization::QuantizeDynamic(q) => q.operations.len(),
            CudnnOptimization::Reduce(r) => r.operations.len(),
            CudnnOptimization::Lead(l) => l.leads.len() + l.inner.len(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            CudnnOptimization::Elementwise(_) => "cudnn elementwise",
            CudnnOptimization::LinearGrad(_) => "cudnn linear weight gradient",
            CudnnOptimization::MatmulBias(_) => "cudnn matmul + bias",
            CudnnOptimization::ConvAct(_) => "cudnn conv2d + relu",
            CudnnOptimization::LeadingSum(_) => "cudnn leading-dims sum",
            CudnnOptimization::QuantizeDynamic(_) => "cudnn dynamic quantization",
            CudnnOptimization::Reduce(_) => "cudnn fused reduction",
            CudnnOptimization::Lead(l) => l.inner.name(),
        }
    }
}

impl CudnnOptimization {
    /// Runs the optimization whose operations start at index `first` of `execution`'s
    /// (`first` > 0 for the fused run after a leading operation).
    fn run(
        &mut self,
        context: &mut Context<CudnnFusionHandle>,
        execution: &OrderedExecution<CudnnFusionRuntime>,
        first: usize,
    ) {
        // The trait boundary: an engine error panics here, naming the fused run.
        let fused = match self {
            CudnnOptimization::Elementwise(e) => expect("fused elementwise", e.execute(context)),
            CudnnOptimization::LinearGrad(l) => {
                expect("fused linear weight gradient", l.execute(context));
                true
            }
            CudnnOptimization::MatmulBias(m) => expect("fused matmul + bias", m.execute(context)),
            CudnnOptimization::ConvAct(c) => expect("fused conv2d + relu", c.execute(context)),
            CudnnOptimization::LeadingSum(s) => {
                expect("fused leading-dims sum", s.execute(context));
                true
            }
            CudnnOptimization::QuantizeDynamic(q) => expect("fused quantize_dynamic", q.execute(context)),
            CudnnOptimization::Reduce(r) => expect("fused reduction", r.execute(context)),
            CudnnOptimization::Lead(l) => {
                for i in first..first + l.leads.len() {
                    execution.operation_within_optimization(i).execute(&mut context.handles);
                }
                l.inner.run(context, execution, first + l.leads.len());
                true
            }
        };
        if !fused {
            // Kernel still building, or unbuildable: the operations one by one.
            crate::ffi::counters::add(crate::ffi::counters::Count::FusedFallbacks, 1);
            for i in first..first + self.len() {
                execution.operation_within_optimization(i).execute(&mut context.handles);
            }
        }
    }
}

impl Optimization<CudnnFusionRuntime> for CudnnOptimization {
    fn execute(&mut self, context: &mut Context<CudnnFusionHandle>, execution: &OrderedExecution<CudnnFusionRuntime>) {
        let _timer = crate::ffi::counters::HostTimer::start(crate::ffi::counters::Count::FusedNs);
        self.run(context, execution, 0);
    }

    fn to_state(&self) -> CudnnOptimizationState {
        match self {
            CudnnOptimization::Elementwise(e) => CudnnOptimizationState::Elementwise(e.operations.clone()),
            CudnnOptimization::LinearGrad(l) => CudnnOptimizationState::LinearGrad(l.operations.clone()),
            CudnnOptimization::MatmulBias(m) => CudnnOptimizationState::MatmulBias(m.operations.clone()),
            CudnnOptimization::ConvAct(c) => CudnnOptimizationState::ConvAct(c.operations.clone()),
            CudnnOptimization::LeadingSum(s) => CudnnOptimizationState::LeadingSum(s.operations.clone()),
            CudnnOptimization::QuantizeDynamic(q) => CudnnOptimizationState::QuantizeDynamic(q.operations.clone()),
            CudnnOptimization::Reduce(r) => CudnnOptimizationState::Reduce(r.operations.clone()),
            CudnnOptimization::Lead(l) => CudnnOptimizationState::Lead(l.leads.clone(), Box::new(l.inner.to_state())),
        }
    }

    fn from_state(device: &CudnnDevice, state: CudnnOptimizationState) -> Self {
        match state {
            CudnnOptimizationState::Elementwise(ops) => {
                match super::fuser::ElementwiseFuser::from_operations(&ops, Some(*device)) {
                    Some(e) => CudnnOptimization::Elementwise(e),
                    None => panic!("cudnn-backend: a saved fusion state does not describe an elementwise run"),
                }
            }
            CudnnOptimizationState::LinearGrad(ops) => match super::linear::LinearGradFuser::matched(&ops) {
                Some(l) => CudnnOptimization::LinearGrad(l),
                None => panic!("cudnn-backend: a saved fusion state does not describe a linear weight gradient"),
            },
            CudnnOptimizationState::MatmulBias(ops) => match super::bias::MatmulBiasFuser::matched(&ops) {
                Some(m) => CudnnOptimization::MatmulBias(m),
                None => panic!("cudnn-backend: a saved fusion state does not describe a linear forward with a bias"),
            },
            CudnnOptimizationState::ConvAct(ops) => match super::conv_act::ConvActFuser::matched(&ops) {
                Some(c) => CudnnOptimization::ConvAct(c),
                None => {
                    panic!("cudnn-backend: a saved fusion state does not describe a convolution and its relu")
                }
            },
            CudnnOptimizationState::LeadingSum(ops) => {
                match super::leading_sum::LeadingSumFuser::from_operations(&ops) {
                    Some(s) => CudnnOptimization::LeadingSum(s),
                    None => panic!("cudnn-backend: a saved fusion state does not describe a sum over leading dims"),
                }
            }
            CudnnOptimizationState::QuantizeDynamic(ops) => {
                match super::quantize::QuantizeDynamicFuser::matched(&ops) {
                    Some(q) => CudnnOptimization::QuantizeDynamic(q),
                    None => panic!("cudnn-backend: a saved fusion state does not describe a dynamic quantization"),
                }
            }
            CudnnOptimizationState::Reduce(ops) => match super::reduce::ReduceFuser::from_operations(&ops) {
                Some(r) => CudnnOptimization::Reduce(Box::new(r)),
                None => panic!("cudnn-backend: a saved fusion state does not describe a fused reduction"),
            },
            CudnnOptimizationState::Lead(leads, inner) => CudnnOptimization::Lead(super::lead::LeadOptimization {
                leads,
                inner: Box::new(Self::from_state(device, *inner)),
            }),
        }
    }
}

/// Whether the operation reading `t` holds its last use (the fusers' pattern checks).
pub(crate) fn last_use(t: &TensorIr) -> bool {
    t.status == TensorStatus::ReadWrite
}

/// The status of a pattern fuser that stops at its first mismatch (`closed`).
pub(crate) fn status_of(closed: bool) -> burn_fusion::FuserStatus {
    if closed {
        burn_fusion::FuserStatus::Closed
    } else {
        burn_fusion::FuserStatus::Open
    }
}

/// Whether `dtype` is a float dtype the pattern fusers take (f32, f16, bf16).
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// The tensor that relative id `id` of an optimization stands for in this execution.
pub(crate) fn global_ir(context: &Context<CudnnFusionHandle>, id: &TensorId, op: &str) -> TensorIr {
    global_ref(context, id, op).clone()
}

/// The global id of relative id `id` (see [`global_ir`]), without copying its shape.
pub(crate) fn global_id(context: &Context<CudnnFusionHandle>, id: &TensorId, op: &str) -> TensorId {
    global_ref(context, id, op).id
}

/// The context's entry for relative id `id` (see [`global_ir`]).
fn global_ref<'c>(context: &'c Context<CudnnFusionHandle>, id: &TensorId, op: &str) -> &'c TensorIr {
    context
        .tensors
        .get(id)
        .unwrap_or_else(|| panic!("cudnn-backend: {op}: tensor {id:?} is not in the fusion context"))
}

/// The tensor behind handle `id` (a global id), left in place.
pub(crate) fn handle_tensor(context: &Context<CudnnFusionHandle>, id: &TensorId, op: &str) -> CudnnTensor {
    match context.handles.get_handle_ref(id) {
        Some(CudnnFusionHandle::Tensor(t)) => t.clone(),
        _ => panic!("cudnn-backend: {op}: no tensor handle for input {id:?}"),
    }
}

/// The tensors a pattern's run reads, `inputs` (relative ids, each with whether the run holds
/// its last use); the handles of those at their last use are released once all are read.
pub(crate) fn take_inputs<const N: usize>(
    context: &mut Context<CudnnFusionHandle>,
    inputs: [(TensorId, bool); N],
    op: &str,
) -> [CudnnTensor; N] {
    let ids = inputs.map(|(id, last)| (global_id(context, &id, op), last));
    let tensors = ids.each_ref().map(|(id, _)| handle_tensor(context, id, op));
    for (id, last) in ids {
        if last {
            context.handles.remove_handle(id);
        }
    }
    tensors
}

/// The value of scalar `s` in this execution (relative scalars are looked up);
/// `None` for a bool.
pub(crate) fn scalar_f64(context: &Context<CudnnFusionHandle>, s: ScalarIr) -> Option<f64> {
    let s = match s {
        ScalarIr::UInt(id) => *context.scalars.get(&ScalarId { value: id })?,
        other => other,
    };
    Some(match s {
        ScalarIr::Float(f) => f,
        ScalarIr::Int(i) => i as f64,
        ScalarIr::UInt(u) => u as f64,
        ScalarIr::Bool(_) => return None,
    })
}

/// The f32 value of scalar `s` of the context, rounded to `round_to` first.
pub(crate) fn scalar_value(context: &Context<CudnnFusionHandle>, s: &FusedScalar) -> f32 {
    let ir = match s.value {
        ScalarIr::UInt(id) => match context.scalars.get(&ScalarId { value: id }) {
            Some(v) => *v,
            None => panic!("cudnn-backend: fused elementwise: scalar {id} is not in the fusion context"),
        },
        other => other,
    };
    let v = match ir {
        ScalarIr::Float(f) => f,
        ScalarIr::Int(i) => i as f64,
        ScalarIr::UInt(u) => u as f64,
        ScalarIr::Bool(b) => f64::from(u8::from(b)),
    };
    match s.round_to {
        DType::F16 => half::f16::from_f64(v).to_f32(),
        DType::BF16 => half::bf16::from_f64(v).to_f32(),
        _ => v as f32,
    }
}

/// The first time `warned` is unset: warns that a generated `kind` kernel could not be built
/// (its operations then run one by one). False, for the executions that fall back.
pub(crate) fn warn_unbuildable(warned: &AtomicBool, kind: &str, e: &crate::Error) -> bool {
    if !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(reason = %e, "cudnn-backend: a fused {kind} kernel could not be built; running its operations one by one (warned once)");
    }
    false
}

/// The tensors a fused run reads, found in the fusion context (nothing is changed there until
/// [`release_consumed`]).
pub(crate) struct RunInputs {
    /// The global id of each input.
    pub ids: Vec<TensorId>,
    /// The tensor behind each input.
    pub tensors: Vec<CudnnTensor>,
    /// The global id and tensor of each absorbed view.
    views: Vec<(TensorId, CudnnTensor)>,
}

/// The inputs and views of a fused run: a view is its source's tensor reshaped (no copy when
/// the source is packed) or permuted (never a copy).
pub(crate) fn run_inputs(
    context: &Context<CudnnFusionHandle>,
    inputs: &[FusedInput],
    views: &[FusedView],
    op: &str,
) -> Result<RunInputs> {
    let mut made: Vec<(TensorId, TensorId, CudnnTensor)> = Vec::with_capacity(views.len());
    for v in views {
        let out = global_ref(context, &v.out, op);
        let source = match made.iter().find(|(rel, _, _)| *rel == v.source) {
            Some((_, _, t)) => t.clone(),
            None => handle_tensor(context, &global_id(context, &v.source, op), op),
        };
        let view = match &v.axes {
            Some(axes) => crate::burn::structure::permute(source, axes, op)?,
            None => crate::burn::structure::reshape(source, &out.shape)?,
        };
        made.push((v.out, out.id, view));
    }
    let ids: Vec<_> = inputs.iter().map(|i| global_id(context, &i.id, op)).collect();
    let tensors = ids
        .iter()
        .zip(inputs)
        .map(|(id, slot)| match made.iter().find(|(rel, _, _)| *rel == slot.id) {
            Some((_, _, view)) => view.clone(),
            None => handle_tensor(context, id, op),
        })
        .collect();
    let views = made.into_iter().map(|(_, id, t)| (id, t)).collect();
    Ok(RunInputs { ids, tensors, views })
}

/// Updates the fusion context for a fused run that executes: releases the handles it consumes
/// (its inputs at their last use, the sources of views at theirs, the tensors dropped inside
/// it) and registers the views read after it.
pub(crate) fn release_consumed(
    context: &mut Context<CudnnFusionHandle>,
    run: &RunInputs,
    inputs: &[FusedInput],
    views: &[FusedView],
    dropped: &[TensorId],
    op: &str,
) {
    let is_view = |id: TensorId| views.iter().any(|v| v.out == id);
    for (&id, slot) in run.ids.iter().zip(inputs) {
        if slot.last_use && !is_view(slot.id) {
            context.handles.remove_handle(id);
        }
    }
    for (v, (id, t)) in views.iter().zip(&run.views) {
        if v.keep {
            context.handles.register_float_tensor::<Cudnn>(id, t.clone());
        }
    }
    for v in views {
        if v.source_last_use && !is_view(v.source) {
            let id = global_id(context, &v.source, op);
            context.handles.remove_handle(id);
        }
    }
    for id in dropped {
        let id = global_id(context, id, op);
        context.handles.remove_handle(id);
    }
}

/// The walk order (outermost dim first) of an elementwise run over `full` whose inputs
/// include a channels-last tensor of those dims; `None` for a row-major walk.
pub(crate) fn channels_last_walk(full: &[i64], inputs: &[CudnnTensor]) -> Option<Vec<usize>> {
    let cl = inputs
        .iter()
        .any(|t| t.dims() == full && layout::is_channels_last(&t.layout));
    cl.then(|| crate::types::channels_last_order(full.len()))
}

/// The walk order (outermost dim first) of a run over `full` that follows the memory order of
/// its first input of those dims when that input is packed in another order than row-major
/// (a channels-last activation, or its `[C, N * H * W]` channel view); `None` for a row-major
/// walk. Size-1 dims keep their places.
pub(crate) fn memory_walk(full: &[i64], inputs: &[CudnnTensor]) -> Option<Vec<usize>> {
    let layouts: SmallVec<[&ViewLayout; 8]> = inputs.iter().map(|t| &t.layout).collect();
    memory_walk_of(full, &layouts)
}

/// [`memory_walk`] over the inputs' layouts: the first packed input of `full`'s dims decides
/// (broadcast or gapped ones are passed over). Only a walk whose innermost dim would not be
/// the input's unit-stride one changes: a channels-first activation's channel view, already
/// read along its contiguous rows, keeps the row-major walk.
fn memory_walk_of(full: &[i64], inputs: &[&ViewLayout]) -> Option<Vec<usize>> {
    let order = inputs
        .iter()
        .filter(|l| l.dims[..] == *full)
        .find_map(|l| l.packed_order())?;
    let innermost = |dims: &mut dyn Iterator<Item = usize>| dims.filter(|&d| full[d] != 1).last();
    let logical = innermost(&mut (0..full.len()));
    let in_memory = innermost(&mut order.iter().copied());
    (logical != in_memory).then_some(order)
}

/// `t` with leading size-1 dims up to `order`'s rank (numpy broadcasting aligns ranks to the
/// right), then its dims permuted by `order` (a view).
pub(crate) fn permuted(t: CudnnTensor, order: &[usize]) -> Result<CudnnTensor> {
    let mut layout = t.layout.clone();
    while layout.dims.len() < order.len() {
        layout = layout.unsqueeze(0)?;
    }
    Ok(t.with_layout(layout.permute(order)?))
}

/// The permutation that undoes `order`.
pub(crate) fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (i, &d) in order.iter().enumerate() {
        inv[d] = i;
    }
    inv
}

impl ElementwiseOptimization {
    /// Marks the program as unbuildable for good (its operations run one by one from now
    /// on, with a one-time warning); false, for [`ElementwiseOptimization::execute`].
    fn unbuildable_after(&mut self, e: crate::Error) -> bool {
        self.unbuildable = true;
        static WARNED: AtomicBool = AtomicBool::new(false);
        warn_unbuildable(&WARNED, "elementwise", &e)
    }

    /// Runs the program; false (nothing consumed) when its kernel is still being built or
    /// cannot be built, so the caller runs the operations one by one instead.
    fn execute(&mut self, context: &mut Context<CudnnFusionHandle>) -> Result<bool> {
        const OP: &str = "fused elementwise";
        if self.unbuildable {
            return Ok(false);
        }
        let mut run = run_inputs(context, &self.inputs, &self.views, OP)?;
        let outputs_ir: Vec<_> = self.outputs.iter().map(|(id, _)| global_ir(context, id, OP)).collect();
        // A mixed run covers the dims of its run-shaped reference; its small outputs have
        // those of the small one.
        let (full, mixed_small) = match self.mixed {
            Some((full_ref, small_ref)) => (
                to_dims(&global_ir(context, &full_ref, OP).shape),
                Some(to_dims(&global_ir(context, &small_ref, OP).shape)),
            ),
            None => (to_dims(&outputs_ir[0].shape), None),
        };
        // Inputs read in another shape than their own: every input of a flat run as the
        // first output's, the lower-rank inputs of a mixed run as the small shape.
        let read_as = |t: CudnnTensor| match &mixed_small {
            _ if self.flat => t.reshape(&full),
            Some(small) if t.rank() != small.len() => t.reshape(small),
            _ => Ok(t),
        };
        if self.flat || mixed_small.is_some() {
            run.tensors = std::mem::take(&mut run.tensors)
                .into_iter()
                .map(read_as)
                .collect::<Result<_>>()?;
        }
        // A run over channels-last tensors walks and stores in their memory order: every
        // operand's dims are permuted alike (a mixed run's small shape, of the run's rank,
        // too), the outputs are packed in that order and handed out as channels-last views
        // (see `crate::burn::layout`).
        let order = match self.flat {
            true => None,
            false => channels_last_walk(&full, &run.tensors),
        };
        let mixed_small = match (&order, mixed_small) {
            (Some(order), Some(small)) => Some(order.iter().map(|&d| small[d]).collect::<Vec<i64>>()),
            (_, small) => small,
        };
        // Dims along which no input varies (all of them for a run that reads no tensor, such
        // as `ones(..) * s`): the run computes one element per such dim and its outputs are
        // broadcast views of full size (flat and mixed runs keep their shapes instead).
        let small = match (self.flat || self.mixed.is_some(), run.tensors.is_empty()) {
            (true, _) => None,
            (false, true) => Some(vec![1; full.len()]).filter(|s| *s != full),
            (false, false) => exec::constant_dims(&full, &run.tensors.iter().collect::<SmallVec<[_; 16]>>()),
        };
        if let Some(small) = &small {
            run.tensors = run.tensors.iter().map(|t| exec::narrowed(t, small)).collect();
        }
        if let Some(order) = &order {
            run.tensors = std::mem::take(&mut run.tensors)
                .into_iter()
                .map(|t| permuted(t, order))
                .collect::<Result<_>>()?;
        }
        let inputs = &run.tensors;
        let device = match (inputs.first(), self.device) {
            (Some(first), _) => first.device().clone(),
            (None, Some(device)) => device.open()?,
            (None, None) => {
                return Ok(self.unbuildable_after(crate::Error::invalid_arg(OP, "inputs", "no inputs and no device")))
            }
        };
        let stream = device.stream().clone();
        let dims = small.clone().unwrap_or_else(|| full.clone());
        let dims: Vec<i64> = match &order {
            Some(order) => order.iter().map(|&d| dims[d]).collect(),
            None => dims,
        };
        // Declared before the launch, which ends up borrowing them, so they outlive it.
        let mut outputs: SmallVec<[CudnnTensor; 4]> = SmallVec::with_capacity(self.outputs.len());
        let in_refs: SmallVec<[_; 8]> = inputs.iter().map(|t| t.tref()).collect();
        fused::launch_key(self.packed.key_mut(), &in_refs, &dims, mixed_small.as_deref());
        let mut launch = match self.packed.get() {
            Some(packed) => FusedLaunch::from_packed(packed, &in_refs),
            None => match FusedLaunch::for_packed_outputs(&self.program, &in_refs, &dims, mixed_small.as_deref()) {
                Ok(l) => {
                    self.packed.insert(Box::new(l.packed()));
                    l
                }
                Err(e) => return Ok(self.unbuildable_after(e)),
            },
        };
        let variant = launch.variant();
        let ready = match &self.function {
            Some((v, f)) if *v == variant => Ok(Some((variant, f.clone()))),
            _ => fused::ready_or_queue(&stream, &self.program, variant).map(|f| f.map(|f| (variant, f))),
        };
        let (variant, function) = match ready {
            Ok(Some(built)) => self.function.insert(built).clone(),
            // Building in the background: unfused this time.
            Ok(None) => return Ok(false),
            Err(e) => return Ok(self.unbuildable_after(e)),
        };
        release_consumed(context, &run, &self.inputs, &self.views, &self.dropped, OP);
        // An input at its last use that nothing else references, packed and of the outputs'
        // dims, lends its buffer to an output of its dtype (each thread reads its element
        // before writing it).
        let mut lent: SmallVec<[bool; 16]> = smallvec::smallvec![false; inputs.len()];
        for (j, &(_, dtype)) in self.outputs.iter().enumerate() {
            if let (Some(small), true) = (&mixed_small, self.program.is_small(j)) {
                outputs.push(CudnnTensor::empty(&device, small, dtype, OP)?);
                continue;
            }
            let lender = inputs.iter().zip(&self.inputs).enumerate().position(|(k, (t, slot))| {
                !lent[k]
                    && slot.last_use
                    && t.dtype == dtype
                    && t.dims() == dims.as_slice()
                    && t.is_contiguous()
                    && t.layout.offset == 0
                    && Arc::strong_count(&t.storage) == 1
            });
            outputs.push(match lender {
                Some(k) => {
                    lent[k] = true;
                    inputs[k].with_layout(ViewLayout::contiguous(&dims))
                }
                None => CudnnTensor::empty(&device, &dims, dtype, OP)?,
            });
        }
        let scalars: SmallVec<[f32; 16]> = self.scalars.iter().map(|s| scalar_value(context, s)).collect();
        let out_refs: SmallVec<[_; 4]> = outputs.iter().map(|t| t.tmut()).collect();
        launch
            .bind(&self.program, &out_refs, &scalars)
            .and_then(|()| launch.launch(&stream, &self.program, &function, variant))?;
        drop((launch, out_refs, in_refs));
        drop(run);
        for (ir, t) in outputs_ir.iter().zip(outputs) {
            let t = match &order {
                Some(order) => t.with_layout(t.layout.permute(&inverse(order))?),
                None => t,
            };
            let t = if self.flat || (self.mixed.is_some() && t.dims() != to_dims(&ir.shape).as_slice()) {
                crate::burn::structure::reshape(t, &ir.shape)?
            } else if small.is_some() {
                exec::expand(t, &full, OP)?
            } else {
                t
            };
            context.handles.register_float_tensor::<Cudnn>(&ir.id, t);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::memory_walk_of;
    use crate::view::ViewLayout;

    fn layout(dims: &[i64], strides: &[i64]) -> ViewLayout {
        ViewLayout::strided(dims, strides)
    }

    #[test]
    fn runs_walk_their_first_full_input_in_memory_order() {
        // The channel view [C, N*H*W] of a channels-last activation: channels innermost.
        let view = layout(&[8, 600], &[1, 8]);
        assert_eq!(memory_walk_of(&[8, 600], &[&view]), Some(vec![1, 0]));
        // A channels-last image; a broadcast [1, C, 1, 1] operand first does not decide.
        let bias = layout(&[1, 8, 1, 1], &[8, 1, 1, 1]);
        let img = layout(&[2, 8, 5, 6], &[240, 1, 48, 8]);
        assert_eq!(memory_walk_of(&[2, 8, 5, 6], &[&bias, &img]), Some(vec![0, 2, 3, 1]));
        // Row-major, gapped or broadcast inputs keep the row-major walk.
        assert_eq!(
            memory_walk_of(&[2, 8, 5, 6], &[&layout(&[2, 8, 5, 6], &[240, 30, 6, 1])]),
            None
        );
        assert_eq!(memory_walk_of(&[8, 600], &[&layout(&[8, 600], &[1, 9])]), None);
        assert_eq!(memory_walk_of(&[8, 600], &[&layout(&[8, 600], &[1, 0])]), None);
        // A broadcast input of full dims is passed over for the next packed one.
        let expanded = layout(&[8, 600], &[1, 0]);
        assert_eq!(memory_walk_of(&[8, 600], &[&expanded, &view]), Some(vec![1, 0]));
        // A channels-first activation's channel view [C, N, H, W] is read along its unit-stride
        // width already: the row-major walk stays.
        let nchw_view = layout(&[8, 2, 5, 6], &[30, 240, 6, 1]);
        assert_eq!(memory_walk_of(&[8, 2, 5, 6], &[&nchw_view]), None);
        // Size-1 dims keep their places.
        let one = layout(&[4, 1, 3], &[1, 99, 4]);
        assert_eq!(memory_walk_of(&[4, 1, 3], &[&one]), Some(vec![2, 1, 0]));
    }
}
