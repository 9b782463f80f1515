//! The reduction fuser: an elementwise run that ends in sums or means over some dims of one of
//! its values, as one generated kernel ([`crate::ops::fused_reduce`]).
//!
//! Burn composes the statistics and gradients of its own batch norm (and every broadcast
//! gradient under `Autodiff`) from such runs:
//!
//! - **broadcast gradients**: burn-autodiff sums the gradient of a broadcast operand over each
//!   broadcast dim in turn (`sum_dim(0)`, `sum_dim(2)`, `sum_dim(3)` for a `[1, C, 1, 1]`
//!   operand), usually of a product made just before (`grad * x_hat`);
//! - **batch statistics**: `x.swap_dims(0, 1).reshape([C, M]).mean_dim(1)`, a packed copy of
//!   the whole activation just to reduce its rows, and the same of `(x - mean)^2`.
//!
//! [`ReduceFuser`] takes: elementwise operations (any the elementwise fuser takes, none
//! needed), then either a chain of sums/means over distinct dims of one value, each reading
//! the previous result at its last use, or the channel view (a swap of dims 0 and 1, then a
//! reshape to `[dims[1], rest]` at the swap's last use) and one sum/mean over its dim 1 (a
//! swap that no such reshape follows is read as a permuted view, as the elementwise fuser's);
//! then optionally a reshape of the result at its last use. The value summed may be a value of
//! the run or a tensor made before it; it is never stored unless read later, and the copy of
//! the channel view is never made. Values of a smaller shape computed in the run (burn-autodiff's
//! `1 / std` beside the product it sums) are stored only when they have the kept elements'
//! shape, once per kept element. At least two operations must be absorbed (a lone sum stays on
//! the backend's reduction).
//!
//! After a chain of sums (and its reshape), more elementwise operations and another chain of
//! sums over the same dims of a value of the same shape may follow, up to
//! [`fused_reduce::MAX_TARGETS`] chains, as long as nothing reads a chain's result inside the
//! run: the kernel sums each chain's value into its own result in one pass. burn-autodiff's
//! batch-norm backward sums the incoming gradient (the shift's gradient), its product with
//! `x_hat` (the scale's) and a product of the scaled gradient (the `std` path's) one chain
//! after the other; they are one kernel. Reductions over trailing dims (softmax, layer norm)
//! take an epilogue instead, and maxes and the channel view stay single.

use burn_backend::DType;
use burn_fusion::stream::Context;
use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::{BaseOperationIr, NumericOperationIr, OperationIr, TensorId, TensorIr};
use cudarc::driver::CudaFunction;
use smallvec::SmallVec;

use crate::burn::fusion::elementwise::fuser::{output_shape, size_one, ElementwiseFuser};
use crate::burn::fusion::engine::launch_cache::LaunchCache;
use crate::burn::fusion::engine::run::{
    global_ir, inverse, is_float, last_use, memory_walk, permuted, release_consumed, run_inputs, scalar_value,
    status_of, warn_unbuildable, FusedInput, FusedScalar, FusedView,
};
use crate::burn::fusion::CudnnFusionHandle;
use crate::burn::fusion::CudnnOptimization;
use crate::burn::tensor::{to_dims, CudnnTensor};
use crate::burn::Cudnn;
use crate::error::Result;
use crate::graph::DataType;
use crate::ops::fused::Value;
use crate::ops::fused_reduce::{self, needs_wide, Epilogue, PackedReduce, ReduceLaunch, ReduceOperands, ReduceProgram};
use crate::types::row_major_strides;

/// Where the fuser is in its pattern.
#[derive(Clone, Debug, PartialEq)]
enum Stage {
    /// Taking elementwise operations; a reduction or the channel view may follow.
    Prologue,
    /// The channel view's swap is taken: its reshape must follow.
    Swapped { source: TensorIr, swapped: TensorIr },
    /// The channel view's reshape is taken: its sum or mean over dim 1 must follow.
    Viewed { source: TensorIr, viewed: TensorIr },
    /// At least one reduction is taken; `chained`: more sums over other dims may follow.
    Reduced { chained: bool },
}

/// Arrival counters made at least this many at a time (one per column of blocks).
const MIN_ARRIVALS: i64 = 1024;

/// The matched run, in relative ids.
#[derive(Clone, Debug)]
pub struct ReduceOptimization {
    /// The program and the reduction (its rank and dtypes are the ones this run was matched
    /// with; `wide` is set per execution).
    reduction: ReduceProgram,
    inputs: Vec<FusedInput>,
    /// Stored values of the run, packed with the iteration shape.
    outputs: Vec<(TensorId, DType)>,
    /// Tensors made before the run and dropped inside it.
    dropped: Vec<TensorId>,
    /// Views the prologue absorbed.
    views: Vec<FusedView>,
    scalars: Vec<FusedScalar>,
    /// A tensor whose shape is the iteration shape (the value summed).
    full: TensorId,
    /// Each target's result (its chain's last reduction's, or the absorbed reshape's) and
    /// the dims whose reduction is a mean for it (their sizes divide its sums).
    results: Vec<(TensorId, u8)>,
    /// The operations, for the serialized state and the unfused fallback.
    pub(crate) operations: Vec<OperationIr>,
    /// The kernel failed to build: every execution runs the operations one by one.
    unbuildable: bool,
    /// Zeroed arrival counters of the chunked launches (each launch leaves them zeroed), so
    /// chunked sums combine in the same launch; made at the first chunked execution.
    arrivals: Option<CudnnTensor>,
    /// Recent executions by launch key (`kernels::fused::launch_key` of the inputs over the
    /// iteration shape): what an execution with a key seen before reuses.
    launches: LaunchCache<ReduceEntry>,
    /// A buffer for each execution's operand signature (see `ReduceLaunch::from_packed`).
    signature: Vec<i64>,
}

/// What executions over inputs of one launch key share: the merged reduction, the sizes of
/// its buffers, its kernel once built and, once launched, the checked launch without its
/// addresses.
#[derive(Clone, Debug)]
struct ReduceEntry {
    coalesced: fused_reduce::Coalesced,
    scratch_len: usize,
    arrivals_len: usize,
    function: Option<CudaFunction>,
    packed: Option<PackedReduce>,
}

/// Whether the `reduced` dims of a rank-`rank` iteration shape are its trailing dims (a
/// softmax's or layer norm's rows): each kept element's reduced elements are then one
/// contiguous run, which an epilogue's second pass reads again from cache. A reduction over
/// other dims (batch-norm statistics over `N`, `H`, `W`) takes no epilogue: its second pass
/// would be a third launch re-reading the whole tensor, and its readers fuse as well
/// elsewhere.
fn reduces_rows(reduced: u8, rank: usize) -> bool {
    let all = ((1u16 << rank) - 1) as u8;
    let kept = !reduced & all;
    // Kept dims, if any, are all leading: `kept + 1` is a power of two.
    reduced != 0 && (kept & kept.wrapping_add(1)) == 0
}

/// Matches an elementwise run ending in reductions (see the module).
#[derive(Clone, Debug)]
pub(crate) struct ReduceFuser {
    elementwise: ElementwiseFuser,
    stage: Stage,
    /// The value summed (the iteration shape's tensor).
    target: Option<(TensorIr, Value)>,
    /// Bit `d`: dim `d` of the iteration shape is reduced / is a mean.
    reduced: u8,
    means: u8,
    /// The latest result (the last reduction's, or the reshape's).
    result: Option<TensorIr>,
    /// Every absorbed operation, drops included.
    ops: Vec<OperationIr>,
    /// Absorbed operations that are not drops.
    counted: usize,
    /// The run reduces through the channel view.
    viewed: bool,
    /// The reductions are maxes (else sums and means).
    max: bool,
    /// Operations of the elementwise run before its epilogue (the operations after the
    /// reduction, which may read its result), once one is taken.
    epilogue_from: Option<usize>,
    /// The run as it was before its latest epilogue operation, when that state was complete:
    /// what the fuser offers while the run is not (an epilogue value of the kept elements'
    /// shape that a later operation may still consume, say).
    last_ready: Option<Box<ReduceFuser>>,
    /// The run as it was before its epilogue: a reduction after the epilogue returns to it,
    /// so the epilogue's operations become the next reduction's prologue (a layer norm's
    /// `(x - mean)^2` before the variance's mean).
    pre_epilogue: Option<Box<ReduceFuser>>,
    /// Chains of sums over the same dims completed before the current one: their values are
    /// summed by the same kernel, each into its own result (burn-autodiff's batch-norm
    /// gradients sum `grad`, `grad * x_hat` and another product of one pass, one chain
    /// after the other).
    done: Vec<Chain>,
    closed: bool,
}

/// A completed chain of sums or means of a [`ReduceFuser`] that more chains followed.
#[derive(Clone, Debug)]
struct Chain {
    /// The value summed, and its tensor (of the iteration shape).
    target: (TensorIr, Value),
    /// The chain's result (the last sum's, or the reshape's after it).
    result: TensorIr,
    /// Reduced and mean dims (bits).
    reduced: u8,
    means: u8,
    /// Elementwise operations of the run before the next chain's prologue.
    ops_before: usize,
}

impl Default for ReduceFuser {
    fn default() -> Self {
        Self {
            elementwise: ElementwiseFuser::without_flat_runs(),
            stage: Stage::Prologue,
            target: None,
            reduced: 0,
            means: 0,
            result: None,
            ops: Vec::new(),
            counted: 0,
            viewed: false,
            max: false,
            epilogue_from: None,
            last_ready: None,
            pre_epilogue: None,
            done: Vec::new(),
            closed: false,
        }
    }
}

/// How a reduction combines the elements of a dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    Sum,
    Mean,
    Max,
}

/// A float sum, mean or max over one dim: `(input, out, axis, how)`. Not over a dim of size 1
/// (relative dim id 0): that one is the identity (which the elementwise fuser takes for sums
/// and means).
fn reduction(op: &OperationIr) -> Option<(&TensorIr, &TensorIr, usize, Combine)> {
    let (r, how) = match op {
        OperationIr::NumericFloat(dtype, NumericOperationIr::SumDim(r)) if is_float(*dtype) => (r, Combine::Sum),
        OperationIr::NumericFloat(dtype, NumericOperationIr::MeanDim(r)) if is_float(*dtype) => (r, Combine::Mean),
        OperationIr::NumericFloat(dtype, NumericOperationIr::MaxDim(r)) if is_float(*dtype) => (r, Combine::Max),
        _ => return None,
    };
    (!size_one(&r.input, r.axis)).then_some((&r.input, &r.out, r.axis, how))
}

fn storage(dtype: DType) -> Option<DataType> {
    match dtype {
        DType::F32 => Some(DataType::F32),
        DType::F16 => Some(DataType::F16),
        DType::BF16 => Some(DataType::BF16),
        _ => None,
    }
}

impl ReduceFuser {
    /// The optimization of `ops` (a saved state), if they are one complete run.
    pub(crate) fn from_operations(ops: &[OperationIr]) -> Option<ReduceOptimization> {
        let mut f = Self::default();
        for op in ops {
            f.fuse(op);
        }
        let best = f.best();
        (best.ready() && best.ops.len() == ops.len()).then(|| best.build())
    }

    /// The run to offer: this one when complete, else the last complete state of its
    /// epilogue (a prefix of its operations), else this one.
    fn best(&self) -> &ReduceFuser {
        match &self.last_ready {
            Some(r) if !self.ready() => r,
            _ => self,
        }
    }

    /// The run is complete: a reduction taken, two operations or more, an input read, and
    /// every stored value of a mixed prologue's small shape [kept-shaped](Self::small_values_fit).
    fn ready(&self) -> bool {
        matches!(self.stage, Stage::Reduced { .. })
            && self.counted >= 2
            && self.elementwise.has_inputs()
            && self.small_values_fit()
            && self.done.iter().all(|c| c.reduced == self.reduced)
    }

    /// Whether a new chain of sums may follow the current one in the same kernel: sums (or
    /// means) over the innermost dim and a leading one (a batch norm's `N`, `H`, `W`; sums
    /// over trailing dims take an epilogue instead, and sums over leading dims only are the
    /// leading-dims fuser's), not through the channel view, and room for one more target.
    fn takes_siblings(&self) -> bool {
        let rank = self.target.as_ref().map_or(0, |(full, _)| full.shape.len());
        rank > 0
            && self.reduced >> (rank - 1) & 1 == 1
            && !self.viewed
            && !self.max
            && self.epilogue_from.is_none()
            && self.pre_epilogue.is_none()
            && !reduces_rows(self.reduced, rank)
            && self.done.len() + 1 < fused_reduce::MAX_TARGETS
    }

    /// Whether `op` may join the prologue of a later chain: it reads a value the run already
    /// reads or computes, and the prologue stays short. While it waits for its next chain the
    /// fuser keeps burn-fusion's search open, and a long wait makes the search cut other
    /// runs short.
    fn joins_sibling_prologue(&self, op: &OperationIr) -> bool {
        const MOST_PROLOGUE_OPS: usize = 8;
        let since = self.done.last().map_or(0, |c| c.ops_before);
        self.elementwise.operation_count() < since + MOST_PROLOGUE_OPS && self.reads_run_value(op)
    }

    /// Whether `op` reads a value the run already reads or computes.
    fn reads_run_value(&self, op: &OperationIr) -> bool {
        op.inputs().any(|t| self.elementwise.knows(t.id))
    }

    /// Whether `op` reads the result of a chain of the run (which the kernel writes only at
    /// its end).
    fn reads_result(&self, op: &OperationIr) -> bool {
        self.reads_done_result(op) || op.inputs().any(|t| self.result.as_ref().is_some_and(|r| r.id == t.id))
    }

    /// Whether `op` reads the result of a completed chain (see [`ReduceFuser::reads_result`]).
    fn reads_done_result(&self, op: &OperationIr) -> bool {
        op.inputs().any(|t| self.done.iter().any(|c| c.result.id == t.id))
    }

    /// After a complete chain: `op`, an elementwise operation that reads no result, starts
    /// the prologue of another chain over the same dims (offering this run meanwhile).
    fn start_sibling(&mut self, op: &OperationIr) -> bool {
        if !self.ready() || self.reads_result(op) || !self.reads_run_value(op) {
            return false;
        }
        let (Some(target), Some(result)) = (self.target.clone(), self.result.clone()) else {
            return false;
        };
        let snapshot = Box::new(ReduceFuser {
            last_ready: None,
            ..self.clone()
        });
        if !self.elementwise.try_add(op) {
            return false;
        }
        self.done.push(Chain {
            target,
            result,
            reduced: self.reduced,
            means: self.means,
            ops_before: self.elementwise.operation_count() - 1,
        });
        (self.target, self.result, self.reduced, self.means) = (None, None, 0, 0);
        self.stage = Stage::Prologue;
        self.last_ready = Some(snapshot);
        true
    }

    /// Whether the values of a mixed prologue's small shape that are read after the run can
    /// be stored: none are, or the small shape is the kept elements' (size 1 along the
    /// reduced dims, the iteration shape's size along the others), which the kernel stores
    /// once per kept element, as it stores the result (Burn's batch-norm gradients keep
    /// `1 / std` and such `[1, C, 1, 1]` values beside their sums). Small values read only
    /// inside the run are computed by every thread and never stored.
    fn small_values_fit(&self) -> bool {
        let Some(small) = self.elementwise.stored_small_shape() else {
            return true;
        };
        let Some((full, _)) = &self.target else {
            return false;
        };
        !self.viewed
            && small.len() == full.shape.len()
            && small.iter().zip(full.shape.iter()).enumerate().all(|(d, (&s, &f))| {
                if self.reduced >> d & 1 == 1 {
                    s == 0
                } else {
                    s == f
                }
            })
    }

    /// Takes `source` (a value of the run or a tensor made before it) as the value summed;
    /// false when it cannot be.
    fn set_target(&mut self, source: &TensorIr) -> bool {
        if storage(source.dtype).is_none() {
            return false;
        }
        // A value of another shape than the run's cannot be its iteration shape.
        if let Some(shape) = self.elementwise.run_shape() {
            if source.shape.iter().copied().collect::<Vec<_>>() != shape {
                return false;
            }
        }
        if !self.elementwise.knows(source.id) && !self.elementwise.has_input_room() {
            return false;
        }
        // The reduced dims are a `u8` mask, within the kernels' rank limit of 8.
        let rank = source.shape.len();
        if rank == 0 || rank > crate::ffi::launch::MAX_KERNEL_RANK.min(8) {
            return false;
        }
        let value = self.elementwise.operand(source);
        self.target = Some((source.clone(), value));
        true
    }

    /// Whether `op` continues the run (and takes it).
    fn take(&mut self, op: &OperationIr) -> bool {
        if let OperationIr::Drop(t) = op {
            // A drop cannot start a run.
            if self.ops.is_empty() {
                return false;
            }
            self.elementwise.drop_tensor(t);
            return true;
        }
        if self.reads_done_result(op) {
            return false;
        }
        match self.stage.clone() {
            Stage::Prologue => {
                if let Some((input, out, axis, how)) = reduction(op) {
                    // A later chain sums a value of the first one's shape into a result of its
                    // dtype.
                    let sibling_fits = self.done.first().is_none_or(|first| {
                        how != Combine::Max && out.dtype == first.result.dtype && input.shape == first.target.0.shape
                    });
                    if !sibling_fits || out.dtype != input.dtype || !self.set_target(input) {
                        return false;
                    }
                    self.reduced = 1 << axis;
                    self.means = if how == Combine::Mean { 1 << axis } else { 0 };
                    self.max = how == Combine::Max;
                    self.result = Some(out.clone());
                    self.stage = Stage::Reduced { chained: true };
                    return true;
                }
                if !self.done.is_empty() && !self.joins_sibling_prologue(op) {
                    return false;
                }
                if let OperationIr::BaseFloat(BaseOperationIr::SwapDims(s)) = op {
                    let channel_swap =
                        self.done.is_empty() && ((s.dim1, s.dim2) == (0, 1) || (s.dim1, s.dim2) == (1, 0));
                    if channel_swap && s.input.shape.len() >= 2 && storage(s.input.dtype).is_some() {
                        self.stage = Stage::Swapped {
                            source: s.input.clone(),
                            swapped: s.out.clone(),
                        };
                        return true;
                    }
                    // Another swap: a permuted view in the prologue.
                    return self.elementwise.try_add(op);
                }
                self.elementwise.try_add(op)
            }
            Stage::Swapped { source, swapped } => match op {
                OperationIr::BaseFloat(BaseOperationIr::Reshape(r))
                    if r.input.id == swapped.id
                        && last_use(&r.input)
                        && r.out.shape.len() == 2
                        && r.out.shape[0] == swapped.shape[0] =>
                {
                    self.stage = Stage::Viewed {
                        source,
                        viewed: r.out.clone(),
                    };
                    true
                }
                _ => self.swap_as_view(&source, &swapped, op),
            },
            Stage::Viewed { source, viewed } => match reduction(op) {
                Some((input, out, 1, how))
                    if how != Combine::Max && input.id == viewed.id && last_use(input) && out.dtype == input.dtype =>
                {
                    let mean = how == Combine::Mean;
                    if !self.set_target(&source) {
                        return false;
                    }
                    let rank = source.shape.len();
                    self.reduced = (((1u32 << rank) - 1) & !0b10) as u8;
                    self.means = if mean { self.reduced } else { 0 };
                    self.result = Some(out.clone());
                    self.stage = Stage::Reduced { chained: false };
                    self.viewed = true;
                    true
                }
                _ => false,
            },
            Stage::Reduced { chained } => {
                let Some(result) = self.result.clone() else {
                    return false;
                };
                if let Some((input, out, axis, how)) = reduction(op) {
                    if let Some(before) = self.pre_epilogue.take() {
                        // The epilogue feeds another reduction: give its operations back.
                        *self = *before;
                        return false;
                    }
                    // A max chains with maxes, a sum or mean with sums and means.
                    let fits = chained
                        && self.epilogue_from.is_none()
                        && (how == Combine::Max) == self.max
                        && input.id == result.id
                        && last_use(input)
                        && out.dtype == input.dtype
                        && axis < input.shape.len()
                        && self.reduced >> axis & 1 == 0;
                    if fits {
                        self.reduced |= 1 << axis;
                        if how == Combine::Mean {
                            self.means |= 1 << axis;
                        }
                        self.result = Some(out.clone());
                    }
                    return fits;
                }
                match op {
                    OperationIr::BaseFloat(BaseOperationIr::Reshape(r))
                        if self.epilogue_from.is_none()
                            && r.input.id == result.id
                            && last_use(&r.input)
                            && r.out.dtype == r.input.dtype =>
                    {
                        self.result = Some(r.out.clone());
                        // Nothing but drops, or another chain's prologue, follows the reshape.
                        self.stage = Stage::Reduced { chained: false };
                        self.closed = !self.takes_siblings();
                        true
                    }
                    _ if self.takes_siblings() => self.start_sibling(op),
                    _ => self.take_epilogue(op),
                }
            }
        }
    }

    /// After a swap of dims 0 and 1 that no channel view follows (burn-autodiff's gradient of
    /// one: `reshape`, `swap_dims`, then elementwise operations): the swap joins the prologue
    /// as a permuted view of its input (made before the run), then `op` is offered to it.
    /// False, and the run ends before the swap, when either does not fit.
    fn swap_as_view(&mut self, source: &TensorIr, swapped: &TensorIr, op: &OperationIr) -> bool {
        let swap = OperationIr::BaseFloat(BaseOperationIr::SwapDims(burn_ir::SwapDimsOpIr {
            input: source.clone(),
            out: swapped.clone(),
            dim1: 0,
            dim2: 1,
        }));
        let before = self.elementwise.clone();
        if self.elementwise.try_add(&swap) && self.elementwise.try_add(op) {
            self.stage = Stage::Prologue;
            return true;
        }
        self.elementwise = before;
        false
    }

    /// Takes `op` into the epilogue: an elementwise operation over the iteration shape (or
    /// over its kept elements) after the reduction, which may read its result. Not after the
    /// channel view (whose result is not of the iteration shape's rank).
    fn take_epilogue(&mut self, op: &OperationIr) -> bool {
        let Some((full, _)) = &self.target else {
            return false;
        };
        let full: Vec<usize> = full.shape.iter().copied().collect();
        if self.viewed || !reduces_rows(self.reduced, full.len()) || !self.elementwise.fits_epilogue(op, &full) {
            return false;
        }
        // The kernel iterates over the summed value's shape: the run must have it before a
        // value of the kept elements' shape joins (as a small value of a mixed run).
        let run_is_full = match self.elementwise.run_shape() {
            Some(run) => run == full.as_slice(),
            None => output_shape(op).is_some_and(|out| out == full),
        };
        if !run_is_full {
            return false;
        }
        let plain = || {
            Box::new(ReduceFuser {
                last_ready: None,
                pre_epilogue: None,
                ..self.clone()
            })
        };
        let snapshot = self.ready().then(plain);
        let before = self.epilogue_from.is_none().then(plain);
        let from = self.epilogue_from.unwrap_or_else(|| self.elementwise.operation_count());
        if !self.elementwise.try_add(op) {
            return false;
        }
        if snapshot.is_some() {
            self.last_ready = snapshot;
        }
        if before.is_some() {
            self.pre_epilogue = before;
        }
        self.epilogue_from = Some(from);
        self.stage = Stage::Reduced { chained: false };
        true
    }

    /// The optimization of the run so far (only once it is [ready](Self::ready)).
    fn build(&self) -> ReduceOptimization {
        let (Some((current, target)), Some(out)) = (&self.target, &self.result) else {
            panic!("cudnn-backend: internal error: an incomplete fused reduction was finished")
        };
        // The chains in order: the iteration shape is the first one's value's.
        let chains: Vec<(Value, &TensorIr, u8)> = self
            .done
            .iter()
            .map(|c| (c.target.1, &c.result, c.means))
            .chain(std::iter::once((*target, out, self.means)))
            .collect();
        let full = self.done.first().map_or(current, |c| &c.target.0);
        let e = self.elementwise.build();
        let out_storage = storage(chains[0].1.dtype).unwrap_or(DataType::F32);
        let epilogue = self.epilogue_from.map(|p| Epilogue {
            prologue_ops: p as u16,
            result_input: e.inputs.iter().position(|i| i.id == out.id).map(|k| k as u8),
        });
        ReduceOptimization {
            reduction: ReduceProgram {
                program: e.program,
                target: chains[0].0,
                siblings: chains[1..].iter().map(|c| c.0).collect(),
                rank: full.shape.len() as u8,
                reduced: self.reduced,
                max: self.max,
                out: out_storage,
                wide: false,
                vec: 1,
                epilogue,
            },
            inputs: e.inputs,
            outputs: e.outputs,
            dropped: e.dropped,
            views: e.views,
            scalars: e.scalars,
            full: full.id,
            results: chains.iter().map(|&(_, r, means)| (r.id, means)).collect(),
            operations: self.ops.clone(),
            unbuildable: false,
            arrivals: None,
            launches: LaunchCache::default(),
            signature: Vec::new(),
        }
    }
}

impl OperationFuser<CudnnOptimization> for ReduceFuser {
    fn fuse(&mut self, op: &OperationIr) {
        if self.closed {
            // Drops after a closing reshape still belong to the run.
            if matches!(op, OperationIr::Drop(_)) && self.ready() && self.take(op) {
                self.ops.push(op.clone());
            }
            return;
        }
        if self.take(op) {
            if !matches!(op, OperationIr::Drop(_)) {
                self.counted += 1;
            }
            self.ops.push(op.clone());
        } else {
            self.closed = true;
        }
    }

    fn finish(&mut self) -> CudnnOptimization {
        CudnnOptimization::Reduce(Box::new(self.best().build()))
    }

    fn reset(&mut self) {
        *self = Self::default();
    }

    fn status(&self) -> FuserStatus {
        status_of(self.closed)
    }

    fn properties(&self) -> FuserProperties {
        let best = self.best();
        if !std::ptr::eq(best, self) {
            return best.properties();
        }
        let ready = self.ready();
        // With a prologue or the channel view: one more than the elementwise fuser's score
        // for the same prologue (the reduction is absorbed too). A bare chain of sums: one
        // less than the leading-dims fuser's, which folds a leading chain into the backend's
        // own reduction.
        let bare = self.elementwise.operation_count() == 0 && !self.viewed;
        let score = if !ready {
            0
        } else if bare {
            self.counted as u64 - 1
        } else {
            self.counted as u64 + 1
        };
        FuserProperties { score, ready }
    }

    fn len(&self) -> usize {
        self.best().ops.len()
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CudnnOptimization>> {
        Box::new(self.clone())
    }
}

impl ReduceOptimization {
    /// Marks the kernel as unbuildable for good, warning once; false (run unfused).
    fn unbuildable_after(&mut self, e: crate::Error) -> bool {
        self.unbuildable = true;
        warn_unbuildable("fused reduction", &e)
    }

    /// Runs the reduction; false (nothing consumed) when its kernel is still being built or
    /// cannot be built, so the caller runs the operations one by one instead.
    pub(crate) fn execute(&mut self, context: &mut Context<CudnnFusionHandle>) -> Result<bool> {
        const OP: &str = "fused reduction";
        if self.unbuildable {
            return Ok(false);
        }
        let full = to_dims(&global_ir(context, &self.full, OP).shape);
        let results_ir: SmallVec<[TensorIr; 4]> =
            self.results.iter().map(|(id, _)| global_ir(context, id, OP)).collect();
        // An epilogue reads the result as one of the program's inputs: the others are made
        // before the run.
        let result_slot = self.reduction.epilogue.and_then(|e| e.result_input).map(usize::from);
        let made_before: std::borrow::Cow<[FusedInput]> = match result_slot {
            Some(slot) => self
                .inputs
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != slot)
                .map(|(_, i)| i.clone())
                .collect(),
            None => self.inputs.as_slice().into(),
        };
        let mut run = run_inputs(context, &made_before, &self.views, OP)?;
        // Over an input packed in another order than row-major (a channels-last activation or
        // its channel view) the kernel walks in its memory order: every operand's dims are
        // permuted alike and values of the iteration shape are stored in that order (so a
        // gradient stays channels-last), where the results' order cannot change: no epilogue
        // reads them back, and at most one kept dim has more than one element.
        let order = match result_slot {
            Some(_) => None,
            None => memory_walk(&full, &run.tensors).filter(|o| {
                let kept = |d: usize| self.reduction.reduced >> d & 1 == 0 && full[d] > 1;
                o.iter().filter(|&&d| kept(d)).count() <= 1
            }),
        };
        let (full, walk) = match &order {
            Some(order) => {
                run.tensors = std::mem::take(&mut run.tensors)
                    .into_iter()
                    .map(|t| permuted(t, order))
                    .collect::<Result<_>>()?;
                let reduced = order
                    .iter()
                    .enumerate()
                    .fold(0u8, |m, (i, &d)| m | ((self.reduction.reduced >> d & 1) << i));
                let walk = ReduceProgram {
                    reduced,
                    ..self.reduction.clone()
                };
                (order.iter().map(|&d| full[d]).collect(), Some(walk))
            }
            None => (full, None),
        };
        let inputs = &run.tensors;
        let outputs_ir: Vec<_> = self.outputs.iter().map(|(id, _)| global_ir(context, id, OP)).collect();
        let Some(first) = inputs.first() else {
            return Ok(self.unbuildable_after(crate::Error::invalid_arg(OP, "inputs", "no inputs")));
        };
        let (stream, device) = (first.stream().clone(), first.device().clone());
        self.reduction.wide = needs_wide(&full);
        let results = results_ir
            .iter()
            .map(|ir| CudnnTensor::empty(&device, &to_dims(&ir.shape), ir.dtype, OP))
            .collect::<Result<SmallVec<[_; 4]>>>()?;
        let mut in_refs: SmallVec<[_; 8]> = inputs.iter().map(|t| t.tref()).collect();
        if let Some(k) = result_slot {
            in_refs.insert(k, results[0].tref());
        }
        // The kernel runs over the merged dims (see `fused_reduce::coalesce`), the same as
        // before for inputs of the same dims, strides and alignment.
        crate::ops::fused::launch_key(self.launches.key_mut(), &in_refs, &full, None);
        let mut entry = match self.launches.take() {
            Some(entry) => entry,
            None => match fused_reduce::Coalesced::of(walk.as_ref().unwrap_or(&self.reduction), &full, &in_refs) {
                Ok(coalesced) => self.launches.entry(ReduceEntry {
                    scratch_len: ReduceLaunch::scratch_len(&coalesced.program, &coalesced.dims),
                    arrivals_len: ReduceLaunch::arrivals_len(&coalesced.program, &coalesced.dims),
                    coalesced,
                    function: None,
                    packed: None,
                }),
                Err(e) => return Ok(self.unbuildable_after(e)),
            },
        };
        let cached = &mut entry.1;
        let (merged, dims) = (&cached.coalesced.program, cached.coalesced.dims.as_slice());
        let in_views = match cached.coalesced.views(&in_refs) {
            Ok(v) => v,
            Err(e) => return Ok(self.unbuildable_after(e)),
        };
        // The kernel of this key's merged program, once built (else the builder's: a map
        // lookup under a lock, hashing the whole program).
        let function = match &cached.function {
            Some(f) => f.clone(),
            None => match fused_reduce::ready_or_queue(&stream, merged) {
                Ok(Some(f)) => cached.function.insert(f).clone(),
                Ok(None) => {
                    // Building in the background: unfused this time, the entry kept.
                    self.launches.put(entry);
                    return Ok(false);
                }
                Err(e) => return Ok(self.unbuildable_after(e)),
            },
        };
        let scales: SmallVec<[f32; 4]> = self
            .results
            .iter()
            .map(|&(_, means)| {
                // `means` names logical dims; `full` may be walked in another order.
                let logical = |i: usize| order.as_ref().map_or(i, |o| o[i]);
                full.iter()
                    .enumerate()
                    .filter(|&(i, _)| means >> logical(i) & 1 == 1)
                    .fold(1.0f64, |acc, (_, &n)| acc / n as f64) as f32
            })
            .collect();
        // Kept-shaped values of a mixed prologue are stored packed in their own dims (one
        // element per kept element), the others packed in the iteration shape's.
        let small_outputs = self.reduction.program.small_outputs;
        let small = |j: usize| small_outputs >> j & 1 == 1;
        let outputs = self
            .outputs
            .iter()
            .zip(&outputs_ir)
            .enumerate()
            .map(|(j, (&(_, dtype), ir))| {
                let dims = if small(j) { to_dims(&ir.shape) } else { full.clone() };
                CudnnTensor::empty(&device, &dims, dtype, OP)
            })
            .collect::<Result<SmallVec<[_; 4]>>>()?;
        let scratch = match cached.scratch_len {
            0 => None,
            n => Some(CudnnTensor::empty(&device, &[n as i64], DType::F32, OP)?),
        };
        let arrivals_len = cached.arrivals_len as i64;
        if arrivals_len > 0 && self.arrivals.as_ref().is_none_or(|t| t.dims()[0] < arrivals_len) {
            let counters = CudnnTensor::empty(&device, &[arrivals_len.max(MIN_ARRIVALS)], DType::I32, OP)?;
            crate::ops::elementwise::fill(&stream, &counters.tmut(), 0.0)?;
            self.arrivals = Some(counters);
        }
        let arrivals = self.arrivals.clone().filter(|_| arrivals_len > 0);
        let scalars: SmallVec<[f32; 16]> = self.scalars.iter().map(|s| scalar_value(context, s)).collect();
        {
            let packed = row_major_strides(dims);
            let out_refs: SmallVec<[_; 4]> = match outputs
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    if small(j) {
                        Ok(t.tmut())
                    } else {
                        t.tmut().reshaped_mut(dims, &packed)
                    }
                })
                .collect()
            {
                Ok(r) => r,
                Err(e) => return Ok(self.unbuildable_after(e)),
            };
            let result_refs: SmallVec<[_; 4]> = results.iter().map(|t| t.tmut()).collect();
            let scratch_ref = scratch.as_ref().map(|t| t.tmut());
            let arrivals_ref = arrivals.as_ref().map(|t| t.tmut());
            let operands = ReduceOperands {
                inputs: &in_views,
                outputs: &out_refs,
                results: &result_refs,
                scratch: scratch_ref.as_ref(),
                arrivals: arrivals_ref.as_ref(),
            };
            // Checked and packed once per key and operand signature; later launches only
            // set the addresses.
            let reused = cached
                .packed
                .as_ref()
                .and_then(|p| ReduceLaunch::from_packed(p, &operands, &scalars, &scales, &mut self.signature));
            let launch = match reused {
                Some(l) => l,
                None => match ReduceLaunch::new(merged, dims, &operands, &scalars, &scales) {
                    Ok(l) => {
                        cached.packed = Some(l.packed(&operands));
                        l
                    }
                    Err(e) => return Ok(self.unbuildable_after(e)),
                },
            };
            launch.launch(&stream, &function)?;
        }
        drop((in_views, in_refs));
        self.launches.put(entry);
        release_consumed(context, &run, &made_before, &self.views, &self.dropped, OP);
        drop(run);
        for (j, (ir, t)) in outputs_ir.iter().zip(outputs).enumerate() {
            // Values of the iteration shape were stored in the walk's order.
            let t = match &order {
                Some(order) if !small(j) => t.with_layout(t.layout.permute(&inverse(order))?),
                _ => t,
            };
            context.handles.register_float_tensor::<Cudnn>(&ir.id, t);
        }
        // A result whose last reader is the epilogue, or dropped in the run, is not registered.
        for (t, ((id, _), (ir, result))) in self.results.iter().zip(results_ir.iter().zip(results)).enumerate() {
            let consumed =
                (t == 0 && result_slot.is_some_and(|k| self.inputs[k].last_use)) || self.dropped.contains(id);
            if !consumed {
                context.handles.register_float_tensor::<Cudnn>(&ir.id, result);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use burn_ir::{BinaryOpIr, ReduceDimOpIr, ScalarOpIr, ShapeOpIr, SwapDimsOpIr, TensorStatus};

    use super::*;
    use crate::burn::fusion::test_ir::t;
    use crate::ops::elementwise::BinaryOp;
    use crate::ops::fused::FusedOp;

    use TensorStatus::{NotInit, ReadOnly, ReadWrite};

    const F: DType = DType::F32;

    fn sum(input: u64, dims: &[usize], status: TensorStatus, axis: usize, out: u64) -> OperationIr {
        let mut o = dims.to_vec();
        o[axis] = 0; // relative dim id 0: size 1
        OperationIr::NumericFloat(
            F,
            NumericOperationIr::SumDim(ReduceDimOpIr {
                input: t(input, dims, status, F),
                out: t(out, &o, NotInit, F),
                axis,
                accumulator_len: 1,
            }),
        )
    }

    fn mean(input: u64, dims: &[usize], status: TensorStatus, axis: usize, out: u64) -> OperationIr {
        match sum(input, dims, status, axis, out) {
            OperationIr::NumericFloat(d, NumericOperationIr::SumDim(r)) => {
                OperationIr::NumericFloat(d, NumericOperationIr::MeanDim(r))
            }
            _ => unreachable!(),
        }
    }

    fn mul(a: u64, a_status: TensorStatus, b: u64, dims: &[usize], out: u64) -> OperationIr {
        OperationIr::NumericFloat(
            F,
            NumericOperationIr::Mul(BinaryOpIr {
                lhs: t(a, dims, a_status, F),
                rhs: t(b, dims, ReadOnly, F),
                out: t(out, dims, NotInit, F),
            }),
        )
    }

    /// A sum of `input` (as given) over `axis` into tensor `out`.
    fn sum_of(input: TensorIr, axis: usize, out: u64) -> OperationIr {
        let mut o: Vec<usize> = input.shape.iter().copied().collect();
        o[axis] = 0;
        OperationIr::NumericFloat(
            F,
            NumericOperationIr::SumDim(ReduceDimOpIr {
                out: t(out, &o, NotInit, F),
                input,
                axis,
                accumulator_len: 1,
            }),
        )
    }

    fn fused(ops: &[OperationIr]) -> ReduceFuser {
        let mut f = ReduceFuser::default();
        for op in ops {
            f.fuse(op);
        }
        f
    }

    /// The gradient of a `[1, C, 1, 1]` scale as burn-autodiff composes it: `grad * x_hat`,
    /// then sums over dims 0, 2 and 3 (dims `[N, C, H, W]` are relative ids 1..=4).
    fn scale_gradient() -> Vec<OperationIr> {
        vec![
            mul(10, ReadOnly, 11, &[1, 2, 3, 4], 12),
            sum(12, &[1, 2, 3, 4], ReadWrite, 0, 13),
            sum(13, &[0, 2, 3, 4], ReadWrite, 2, 14),
            sum(14, &[0, 2, 0, 4], ReadWrite, 3, 15),
        ]
    }

    #[test]
    fn a_product_and_its_broadcast_sums_become_one_reduction() {
        let f = fused(&scale_gradient());
        assert_eq!(f.status(), FuserStatus::Open);
        assert!(f.properties().ready);
        assert_eq!(f.properties().score, 5);
        // The sums alone: a bare chain, scored below the leading-dims fuser.
        assert_eq!(fused(&scale_gradient()[1..]).properties().score, 2);
        let o = f.build();
        o.reduction.validate().unwrap();
        assert_eq!(o.reduction.reduced, 0b1101);
        assert_eq!(o.results[0].1, 0);
        assert_eq!(o.reduction.target, Value::Reg(0));
        assert_eq!(
            o.reduction.program.ops,
            vec![FusedOp::Binary(BinaryOp::Mul, Value::Input(0), Value::Input(1))]
        );
        // The product dies in the run: nothing else is stored.
        assert!(o.outputs.is_empty());
        assert_eq!((o.full, o.results[0].0), (TensorId::new(12), TensorId::new(15)));
        let again = ReduceFuser::from_operations(&o.operations).unwrap();
        assert_eq!(again.reduction, o.reduction);
    }

    #[test]
    fn the_channel_view_of_a_mean_is_a_reduction_over_every_other_dim() {
        // mean = x.swap_dims(0, 1).reshape([C, M]).mean_dim(1).reshape([1, C, 1, 1])
        let ops = vec![
            OperationIr::BaseFloat(BaseOperationIr::SwapDims(SwapDimsOpIr {
                input: t(1, &[1, 2, 3, 4], ReadOnly, F),
                out: t(2, &[2, 1, 3, 4], NotInit, F),
                dim1: 0,
                dim2: 1,
            })),
            OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
                input: t(2, &[2, 1, 3, 4], ReadWrite, F),
                out: t(3, &[2, 5], NotInit, F),
            })),
            mean(3, &[2, 5], ReadWrite, 1, 4),
            OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
                input: t(4, &[2, 0], ReadWrite, F),
                out: t(5, &[0, 2, 0, 0], NotInit, F),
            })),
        ];
        let f = fused(&ops);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.len() == 4);
        let o = f.build();
        assert_eq!((o.reduction.reduced, o.results[0].1), (0b1101, 0b1101));
        assert_eq!(o.reduction.target, Value::Input(0));
        assert!(o.reduction.program.ops.is_empty());
        assert!(!o.inputs[0].last_use);
        assert_eq!((o.full, o.results[0].0), (TensorId::new(1), TensorId::new(5)));
    }

    #[test]
    fn a_swap_that_no_channel_reshape_follows_is_a_permuted_view_of_the_prologue() {
        // burn-autodiff's gradient through the channel view: the [C, M] gradient reshaped to
        // [C, N, H, W], swapped back to [N, C, H, W], multiplied, then summed over N, H, W.
        let ops = vec![
            OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
                input: t(1, &[2, 5], ReadWrite, F),
                out: t(2, &[2, 1, 3, 4], NotInit, F),
            })),
            OperationIr::BaseFloat(BaseOperationIr::SwapDims(SwapDimsOpIr {
                input: t(2, &[2, 1, 3, 4], ReadWrite, F),
                out: t(3, &[1, 2, 3, 4], NotInit, F),
                dim1: 0,
                dim2: 1,
            })),
            mul(3, ReadWrite, 6, &[1, 2, 3, 4], 7),
            sum(7, &[1, 2, 3, 4], ReadWrite, 0, 8),
            sum(8, &[0, 2, 3, 4], ReadWrite, 2, 9),
            sum(9, &[0, 2, 0, 4], ReadWrite, 3, 10),
        ];
        let f = fused(&ops);
        assert_eq!(f.status(), FuserStatus::Open);
        assert!(f.properties().ready && f.len() == 6);
        let o = f.build();
        o.reduction.validate().unwrap();
        assert_eq!(o.reduction.reduced, 0b1101);
        assert_eq!(o.views.len(), 2);
        assert_eq!(o.views[0].axes, None);
        assert_eq!(o.views[1].axes.as_deref(), Some(&[1, 0, 2, 3][..]));
        // Both views are consumed by the product; the product's inputs are the swapped view
        // and the other factor.
        assert!(o.views.iter().all(|v| !v.keep));
        assert_eq!(
            o.inputs.iter().map(|i| i.id).collect::<Vec<_>>(),
            vec![TensorId::new(3), TensorId::new(6)]
        );
        // A swap of a value of the run (it would need storing first) ends the run before it.
        let mut made = vec![mul(11, ReadOnly, 12, &[2, 1, 3, 4], 13)];
        made.push(OperationIr::BaseFloat(BaseOperationIr::SwapDims(SwapDimsOpIr {
            input: t(13, &[2, 1, 3, 4], ReadWrite, F),
            out: t(14, &[1, 2, 3, 4], NotInit, F),
            dim1: 0,
            dim2: 1,
        })));
        made.push(mul(14, ReadWrite, 6, &[1, 2, 3, 4], 15));
        let f = fused(&made);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(!f.properties().ready);
    }

    #[test]
    fn softmax_scores_and_their_max_become_one_max_reduction() {
        // Burn's softmax over attention scores: (scores / s).max_dim(3), the scaled scores
        // read again afterwards.
        let scaled = t(2, &[1, 2, 3, 3], NotInit, F);
        let mut max_out = t(3, &[1, 2, 3, 0], NotInit, F);
        let ops = vec![
            OperationIr::NumericFloat(
                F,
                NumericOperationIr::DivScalar(ScalarOpIr {
                    lhs: t(1, &[1, 2, 3, 3], ReadWrite, F),
                    rhs: burn_ir::ScalarIr::UInt(0),
                    out: scaled.clone(),
                }),
            ),
            OperationIr::NumericFloat(
                F,
                NumericOperationIr::MaxDim(ReduceDimOpIr {
                    input: TensorIr {
                        status: ReadOnly,
                        ..scaled
                    },
                    out: max_out.clone(),
                    axis: 3,
                    accumulator_len: 1,
                }),
            ),
        ];
        let f = fused(&ops);
        assert!(f.ready());
        let r = f.build();
        r.reduction.validate().unwrap();
        assert!(r.reduction.max);
        assert_eq!((r.reduction.reduced, r.results[0].1), (0b1000, 0));
        // The scaled scores are stored for their later readers.
        assert_eq!(r.outputs.len(), 1);
        // A sum does not chain onto a max.
        max_out.status = ReadWrite;
        let mut f = fused(&ops);
        f.fuse(&sum_of(max_out, 2, 4));
        assert_eq!(f.ops.len(), 2);
    }

    /// The float unary operation `op` of `input`.
    fn unary(op: fn(burn_ir::UnaryOpIr) -> burn_ir::FloatOperationIr, input: TensorIr, out: TensorIr) -> OperationIr {
        OperationIr::Float(F, op(burn_ir::UnaryOpIr { input, out }))
    }

    /// `lhs op rhs` of the given tensors (shapes may differ by broadcasting).
    fn binary(op: fn(BinaryOpIr) -> NumericOperationIr, lhs: TensorIr, rhs: TensorIr, out: TensorIr) -> OperationIr {
        OperationIr::NumericFloat(F, op(BinaryOpIr { lhs, rhs, out }))
    }

    #[test]
    fn a_prologue_computing_row_values_stores_them_only_when_kept_shaped() {
        // Burn's layer-norm gradient: `(g * y) / (s * s)` summed over the last dim, with `s`
        // of the row shape `[.., 1]` (relative dims [1, 2, 3] and [1, 2, 0]).
        let (full, row) = (&[1, 2, 3][..], &[1, 2, 0][..]);
        let ops = |square_read_later: bool| {
            let square_status = if square_read_later { ReadOnly } else { ReadWrite };
            vec![
                binary(
                    NumericOperationIr::Mul,
                    t(10, full, ReadOnly, F),
                    t(11, full, ReadOnly, F),
                    t(12, full, NotInit, F),
                ),
                binary(
                    NumericOperationIr::Mul,
                    t(13, row, ReadOnly, F),
                    t(13, row, ReadOnly, F),
                    t(14, row, NotInit, F),
                ),
                binary(
                    NumericOperationIr::Div,
                    t(12, full, ReadWrite, F),
                    t(14, row, square_status, F),
                    t(15, full, NotInit, F),
                ),
                sum(15, full, ReadWrite, 2, 16),
            ]
        };
        let f = fused(&ops(false));
        assert!(f.ready(), "the row value dies in the run");
        let o = f.build();
        o.reduction.validate().unwrap();
        assert_eq!(o.reduction.program.small_outputs, 0);
        assert!(o.outputs.is_empty());
        assert_eq!(
            (o.full, o.results[0].0, o.reduction.reduced),
            (TensorId::new(15), TensorId::new(16), 0b100)
        );
        // The square is read after the run: the row shape is the kept elements' (the sum is
        // over the last dim), so the kernel stores it once per row, as a small output.
        let f = fused(&ops(true));
        assert!(f.ready());
        let o = f.build();
        o.reduction.validate().unwrap();
        assert_eq!(o.reduction.program.small_outputs, 0b1);
        assert_eq!(o.outputs, vec![(TensorId::new(14), F)]);
        // Summed over dim 1 instead, the row value is not of the kept elements' shape: no
        // kernel could store it once per element, so the run is not offered.
        let mut other = ops(true);
        other[3] = sum(15, full, ReadWrite, 1, 16);
        assert!(!fused(&other).ready());
    }

    #[test]
    fn burns_batch_norm_gradient_keeps_its_channel_values_as_small_outputs() {
        // burn-autodiff's batch-norm backward: `r = 1 / s` of the channel shape `[1, C, 1, 1]`
        // (read again by a later run), `g * m` kept, and `g * x` summed over dims 0, 2 and 3.
        let (full, channel) = (&[1, 2, 3, 4][..], &[0, 2, 0, 0][..]);
        let ops = vec![
            unary(
                burn_ir::FloatOperationIr::Recip,
                t(1, channel, ReadOnly, F),
                t(2, channel, NotInit, F),
            ),
            binary(
                NumericOperationIr::Mul,
                t(3, full, ReadOnly, F),
                t(4, channel, ReadOnly, F),
                t(5, full, NotInit, F),
            ),
            binary(
                NumericOperationIr::Mul,
                t(3, full, ReadOnly, F),
                t(6, full, ReadOnly, F),
                t(7, full, NotInit, F),
            ),
            sum(7, full, ReadWrite, 0, 8),
            sum(8, &[0, 2, 3, 4], ReadWrite, 2, 9),
            sum(9, &[0, 2, 0, 4], ReadWrite, 3, 10),
        ];
        let f = fused(&ops);
        assert!(f.ready(), "the channel value is of the kept elements' shape");
        assert_eq!(f.len(), ops.len());
        let o = f.build();
        o.reduction.validate().unwrap();
        assert_eq!((o.reduction.reduced, o.results[0].0), (0b1101, TensorId::new(10)));
        // `1 / s` (small) and `g * m` (full) are stored; the summed product is not.
        assert_eq!(o.outputs, vec![(TensorId::new(2), F), (TensorId::new(5), F)]);
        assert_eq!(o.reduction.program.small_outputs, 0b01);
        // Until the last sum the channel value is not kept-shaped: no complete run is offered
        // before it.
        assert!(!fused(&ops[..5]).ready());
    }

    #[test]
    fn a_softmax_division_by_its_row_sum_is_the_reductions_epilogue() {
        // exp(x - max) summed over the last dim, then the exponential divided by the sum
        // (relative dims [1, 2, 3], rows [1, 2, 0]).
        let (full, row) = (&[1, 2, 3][..], &[1, 2, 0][..]);
        let exp = unary(
            burn_ir::FloatOperationIr::Exp,
            t(12, full, ReadWrite, F),
            t(13, full, NotInit, F),
        );
        let ops = vec![
            binary(
                NumericOperationIr::Sub,
                t(10, full, ReadOnly, F),
                t(11, row, ReadWrite, F),
                t(12, full, NotInit, F),
            ),
            exp,
            sum_of(t(13, full, ReadOnly, F), 2, 14),
            binary(
                NumericOperationIr::Div,
                t(13, full, ReadWrite, F),
                t(14, row, ReadWrite, F),
                t(15, full, NotInit, F),
            ),
        ];
        let f = fused(&ops);
        assert!(f.ready() && f.len() == 4);
        assert_eq!(f.properties().score, 5);
        let o = f.build();
        o.reduction.validate().unwrap();
        let e = o.reduction.epilogue.expect("an epilogue");
        assert_eq!(e.prologue_ops, 2);
        // Input 2 is the result; only the quotient is stored (the exponential dies in the run).
        assert_eq!(e.result_input, Some(2));
        assert_eq!(o.inputs[2].id, TensorId::new(14));
        assert!(o.inputs[2].last_use);
        assert_eq!(
            o.outputs.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![TensorId::new(15)]
        );
        let src = o.reduction.source();
        assert!(src.contains("if (a.phase != 2)") && src.contains("__syncwarp()"));
        let again = ReduceFuser::from_operations(&o.operations).unwrap();
        assert_eq!(again.reduction, o.reduction);

        // A reduction after the epilogue takes its operations back (they become that
        // reduction's prologue); no view of the result is taken (it is not a tensor before the
        // run ends).
        let mut f = fused(&ops);
        f.fuse(&sum_of(t(15, full, ReadOnly, F), 1, 16));
        assert_eq!(f.len(), 3);
        assert!(f.ready() && f.build().reduction.epilogue.is_none());
        let mut f = fused(&ops[..3]);
        f.fuse(&OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
            input: t(14, row, ReadOnly, F),
            out: t(17, &[1, 2], NotInit, F),
        })));
        assert_eq!(f.len(), 3, "a view of the result read later is refused");
    }

    #[test]
    fn an_epilogue_stores_a_value_of_the_kept_elements_shape_as_a_small_output() {
        let (full, row) = (&[1, 2, 3][..], &[1, 2, 0][..]);
        let scaled_result = |status| {
            OperationIr::NumericFloat(
                F,
                NumericOperationIr::MulScalar(ScalarOpIr {
                    lhs: t(14, row, status, F),
                    rhs: burn_ir::ScalarIr::Float(0.5),
                    out: t(15, row, NotInit, F),
                }),
            )
        };
        // A bare sum, then arithmetic on its result alone: not an epilogue (the kernel would
        // iterate over the result's shape), so the sum stays a lone sum.
        let mut f = fused(&[sum(10, full, ReadOnly, 2, 14)]);
        f.fuse(&scaled_result(ReadWrite));
        assert_eq!(f.len(), 1);
        assert!(!f.properties().ready);

        // A product summed, then the scaled result read after the run: the epilogue stores
        // that value of the kept elements' shape once per row (a small output).
        let ops = vec![
            mul(10, ReadOnly, 11, full, 12),
            sum(12, full, ReadWrite, 2, 14),
            binary(
                NumericOperationIr::Sub,
                t(10, full, ReadOnly, F),
                t(14, row, ReadOnly, F),
                t(16, full, NotInit, F),
            ),
            scaled_result(ReadWrite),
        ];
        let f = fused(&ops);
        assert!(f.properties().ready);
        assert_eq!((f.len(), f.properties().score), (4, 5));
        let o = f.best().build();
        assert_eq!(o.operations.len(), 4);
        assert_eq!(o.reduction.epilogue.map(|e| e.prologue_ops), Some(1));
        assert_eq!(o.outputs, vec![(TensorId::new(16), F), (TensorId::new(15), F)]);
        assert_eq!(o.reduction.program.small_outputs, 0b10);
        assert_eq!(
            ReduceFuser::from_operations(&o.operations).unwrap().reduction,
            o.reduction
        );
    }

    #[test]
    fn a_reduction_after_an_epilogue_takes_its_operations_back() {
        // Burn's layer norm: the mean of x over the rows, then (x - mean)^2 and its mean (the
        // variance): the squared deviation is the variance's prologue, not the mean's
        // epilogue.
        let (full, row) = (&[1, 2, 3][..], &[1, 2, 0][..]);
        let ops = vec![
            mean(10, full, ReadOnly, 2, 11),
            binary(
                NumericOperationIr::Sub,
                t(10, full, ReadOnly, F),
                t(11, row, ReadOnly, F),
                t(12, full, NotInit, F),
            ),
            mul(12, ReadWrite, 12, full, 13),
            mean(13, full, ReadWrite, 2, 14),
        ];
        let f = fused(&ops[..3]);
        assert!(f.ready() && f.len() == 3, "the mean with its epilogue");
        let f = fused(&ops);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert_eq!(f.len(), 1);
        assert!(!f.properties().ready, "a lone mean stays on the backend's reduction");
        // The next block: the squared deviation and its mean, one fused reduction.
        let f = fused(&ops[1..]);
        assert!(f.ready() && f.len() == 3);
        assert!(f.build().reduction.epilogue.is_none());
    }

    #[test]
    fn only_reductions_over_trailing_dims_take_an_epilogue() {
        assert!(reduces_rows(0b1000, 4) && reduces_rows(0b1100, 4) && reduces_rows(0b1111, 4));
        assert!(!reduces_rows(0b1101, 4) && !reduces_rows(0b0100, 4) && !reduces_rows(0, 4));
        assert!(reduces_rows(0b1, 1));
        // A batch-norm gradient: a product summed over dims 0, 2 and 3, then an operation
        // reading the sum: not an epilogue.
        let mut ops = scale_gradient();
        ops.push(binary(
            NumericOperationIr::Mul,
            t(10, &[1, 2, 3, 4], ReadOnly, F),
            t(15, &[0, 2, 0, 0], ReadOnly, F),
            t(16, &[1, 2, 3, 4], NotInit, F),
        ));
        let f = fused(&ops);
        assert_eq!(f.len(), 4);
        assert!(f.build().reduction.epilogue.is_none());
    }

    /// Sums of `input` over dims 0, 2 and 3 of `[N, C, H, W]` (relative ids 1..=4) into
    /// `out`, `out + 1` and `out + 2`.
    fn channel_sums(input: u64, status: TensorStatus, out: u64) -> Vec<OperationIr> {
        vec![
            sum(input, &[1, 2, 3, 4], status, 0, out),
            sum(out, &[0, 2, 3, 4], ReadWrite, 2, out + 1),
            sum(out + 1, &[0, 2, 0, 4], ReadWrite, 3, out + 2),
        ]
    }

    /// A reshape of channel sums `input` (`[1, C, 1, 1]`) to `[C]`, at their last use.
    fn to_channels(input: u64, out: u64) -> OperationIr {
        OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
            input: t(input, &[0, 2, 0, 0], ReadWrite, F),
            out: t(out, &[2], NotInit, F),
        }))
    }

    #[test]
    fn burns_batch_norm_gradient_sums_of_one_pass_share_one_kernel() {
        // burn-autodiff's batch-norm backward: the shift's gradient (sums of the incoming
        // gradient 10), the scale's (sums of 10 * x_hat), then sums of a product of the
        // scaled gradient (29, read later) before a value reads the last sums.
        let full = [1, 2, 3, 4];
        let mut ops = channel_sums(10, ReadOnly, 20);
        ops.push(to_channels(22, 23));
        ops.push(mul(10, ReadOnly, 11, &full, 24));
        ops.extend(channel_sums(24, ReadWrite, 25));
        ops.push(to_channels(27, 28));
        ops.push(mul(10, ReadOnly, 12, &full, 29));
        ops.push(mul(29, ReadOnly, 13, &full, 30));
        ops.extend(channel_sums(30, ReadWrite, 31));
        let reads_sums = mul(33, ReadOnly, 14, &[0, 2, 0, 0], 40);
        let f = fused(&[ops.clone(), vec![reads_sums.clone()]].concat());
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready);
        assert_eq!(f.len(), ops.len(), "the reader of the last sums is not taken");
        let o = f.build();
        o.reduction.validate().unwrap();
        assert_eq!((o.reduction.target, o.reduction.siblings.len()), (Value::Input(0), 2));
        assert_eq!(o.reduction.reduced, 0b1101);
        let results: Vec<_> = o.results.iter().map(|&(id, means)| (id.value(), means)).collect();
        assert_eq!(results, vec![(23, 0), (28, 0), (33, 0)]);
        assert_eq!(o.full, TensorId::new(10));
        // The scaled gradient is stored, as it is read after the run; the products summed
        // are not.
        assert_eq!(o.outputs.iter().map(|(id, _)| id.value()).collect::<Vec<_>>(), vec![29]);
        let again = ReduceFuser::from_operations(&o.operations).unwrap();
        assert_eq!(again.reduction, o.reduction);
        // A prologue that reads an earlier chain's result ends the run after that chain.
        let mut early = channel_sums(10, ReadOnly, 20);
        early.push(to_channels(22, 23));
        let f = fused(&[early.clone(), vec![mul(23, ReadOnly, 14, &[2], 41)]].concat());
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, early.len()));
        assert!(f.build().reduction.siblings.is_empty());
        // A second chain over other dims is not a sibling: the run offers the first one.
        let mut other = early.clone();
        other.push(mul(10, ReadOnly, 11, &full, 24));
        other.push(sum(24, &full, ReadWrite, 1, 25));
        let f = fused(&[other, vec![sum(25, &[1, 0, 3, 4], ReadWrite, 0, 26), reads_sums]].concat());
        assert!(f.properties().ready);
        assert_eq!(f.len(), early.len());
        // A prologue operation that reads nothing the run reads or computes, or a prologue
        // longer than eight operations, ends the run after the complete chains.
        let f = fused(&[early.clone(), vec![mul(50, ReadOnly, 51, &full, 52)]].concat());
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, early.len()));
        let mut long = early.clone();
        long.push(mul(10, ReadOnly, 11, &full, 60));
        for k in 0..8 {
            long.push(mul(60 + k, ReadWrite, 11, &full, 61 + k));
        }
        let f = fused(&long);
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, early.len()));
        // Sums over the leading dims only (the innermost dim kept) take no sibling.
        let lead = [
            sum(10, &[1, 2, 3], ReadOnly, 0, 20),
            sum(20, &[0, 2, 3], ReadWrite, 1, 21),
            mul(10, ReadOnly, 11, &[1, 2, 3], 22),
        ];
        let f = fused(&lead);
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 2));
    }

    #[test]
    fn a_lone_sum_a_reused_partial_or_a_repeated_dim_is_not_taken_further() {
        // One sum alone: not worth a kernel of its own.
        let f = fused(&[sum(1, &[1, 2], ReadOnly, 0, 2)]);
        assert!(!f.properties().ready);
        // The first sum is read later: the chain stops after it (the product and one sum).
        let mut ops = scale_gradient();
        ops[2] = sum(13, &[0, 2, 3, 4], ReadOnly, 2, 14);
        let f = fused(&ops);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert_eq!(f.len(), 2);
        assert!(f.properties().ready);
        // A second sum over a dim already reduced ends the run.
        let mut ops = scale_gradient();
        ops[2] = sum(13, &[0, 2, 3, 4], ReadWrite, 0, 14);
        assert_eq!(fused(&ops).len(), 2);
    }
}
