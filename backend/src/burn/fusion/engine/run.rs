//! The bookkeeping every fused run shares: its inputs, views and scalars as the fusers
//! record them, the IR lookups and handle moves of an execution, and the walk order over
//! channels-last operands.

use burn_backend::DType;
use burn_fusion::stream::{Context, ScalarId};
use burn_ir::{ScalarIr, TensorId, TensorIr, TensorStatus};
use smallvec::SmallVec;

use crate::burn::fusion::CudnnFusionHandle;
use crate::burn::tensor::CudnnTensor;
use crate::burn::{layout, Cudnn};
use crate::error::Result;
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
pub(crate) fn warn_unbuildable(kind: &'static str, e: &crate::Error) -> bool {
    if crate::engine().first_warning(kind) {
        tracing::warn!(reason = %e, "cudnn-backend: a {kind} kernel could not be built; running its operations one by one (warned once)");
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
