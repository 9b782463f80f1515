//! Layer and RMS norm over the last dim: the training forward (row statistics kept) and
//! its autodiff node, whose backward runs [`crate::ops::norm_backward`].

use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_backend::tensor::FloatTensor;
use burn_backend::DType;

use super::super::exec;
use super::super::tensor::{expect, CudnnTensor};
use super::super::Cudnn;
use crate::graph::NormMode;
use crate::ops::{self, NormBackward};

/// What the backward pass needs.
#[derive(Clone, Debug)]
pub(super) struct NormSaved {
    /// The input as packed `[rows, features]`.
    x: CudnnTensor,
    /// The input's dims (the gradient gets them back).
    dims: Vec<i64>,
    scale: CudnnTensor,
    /// The dtype of the scale and bias as passed.
    param_dtype: DType,
    mean: Option<CudnnTensor>,
    inv_std: CudnnTensor,
    mode: NormMode,
}

/// Forward over the last dim; returns `y` (x's dims) and what the backward needs.
pub(super) fn forward(
    x: CudnnTensor,
    scale: CudnnTensor,
    bias: Option<CudnnTensor>,
    epsilon: f64,
    mode: NormMode,
) -> (CudnnTensor, NormSaved) {
    const OP: &str = "norm_train_forward";
    let dims = x.dims().to_vec();
    let features = dims.last().copied().unwrap_or(1);
    let rows = if features == 0 { 0 } else { x.numel() / features };
    let x2 = x.contiguous().reshape(&[rows, features]);
    let param_dtype = scale.dtype;
    let pdt = if scale.dtype == x2.dtype { x2.dtype } else { DType::F32 };
    let scale = exec::cast(scale, pdt, OP).contiguous();
    let bias = bias.map(|b| exec::cast(b, pdt, OP).contiguous());
    let y = x2.empty_like(x2.dtype, OP);
    let stat = || CudnnTensor::empty(x2.device(), &[rows], DType::F32, OP);
    let mean = (mode == NormMode::LayerNorm).then(stat);
    let inv_std = stat();
    let (tx, ty, ts, ti) = (x2.tref(), y.tref(), scale.tref(), inv_std.tref());
    let (tb, tm) = (bias.as_ref().map(|b| b.tref()), mean.as_ref().map(|m| m.tref()));
    expect(
        OP,
        ops::norm_train_forward(
            y.stream(),
            mode,
            &tx,
            Some(&ts),
            tb.as_ref(),
            &ty,
            epsilon,
            tm.as_ref(),
            &ti,
        ),
    );
    let saved = NormSaved {
        x: x2,
        dims: dims.clone(),
        scale,
        param_dtype,
        mean,
        inv_std,
        mode,
    };
    (y.reshape(&dims), saved)
}

/// `[dx, dscale, dbias]`, each when `want` asks.
fn backward(s: &NormSaved, dy: CudnnTensor, want: [bool; 3]) -> [Option<CudnnTensor>; 3] {
    const OP: &str = "norm_backward";
    let (rows, features) = (s.x.dims()[0], s.x.dims()[1]);
    let dy = exec::cast(dy, s.x.dtype, OP).contiguous().reshape(&[rows, features]);
    let dx = want[0].then(|| s.x.empty_like(s.x.dtype, OP));
    let [ds, db] =
        [want[1], want[2]].map(|w| w.then(|| CudnnTensor::empty(s.x.device(), &[features], s.scale.dtype, OP)));
    let r = |t: &Option<CudnnTensor>| t.as_ref().map(|t| t.tref());
    let (tx, tdy, tscale, ti) = (s.x.tref(), dy.tref(), s.scale.tref(), s.inv_std.tref());
    let (tm, tdx, tds, tdb) = (r(&s.mean), r(&dx), r(&ds), r(&db));
    let args = NormBackward {
        x: &tx,
        dy: &tdy,
        scale: Some(&tscale),
        mean: tm.as_ref(),
        inv_std: &ti,
        dx: tdx.as_ref(),
        d_scale: tds.as_ref(),
        d_bias: tdb.as_ref(),
    };
    expect(OP, ops::norm_backward(dy.stream(), s.mode, &args));
    let back = |t: Option<CudnnTensor>| t.map(|t| exec::cast(t, s.param_dtype, OP));
    [dx.map(|t| t.reshape(&s.dims)), back(ds), back(db)]
}

/// The node of a norm with a bias (parents x, scale, bias).
#[derive(Debug)]
struct NormBiasNode;

/// The node of a norm without a bias (parents x, scale).
#[derive(Debug)]
struct NormNode;

/// The norm's gradients in parent order (x, scale[, bias]).
fn register<const N: usize>(ops: Ops<NormSaved, N>, grads: &mut Gradients) {
    super::register_parent_grads(ops, grads, |s, dy, t: [bool; N]| {
        let at = |i: usize| i < N && t[i];
        let mut all = backward(s, dy, [at(0), at(1), at(2)]).into_iter();
        std::array::from_fn(|_| all.next().flatten())
    });
}

impl Backward<Cudnn, 3> for NormBiasNode {
    type State = NormSaved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        register(ops, grads);
    }
}

impl Backward<Cudnn, 2> for NormNode {
    type State = NormSaved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        register(ops, grads);
    }
}

/// The norm on `Cudnn` (no gradients): the training kernels, whose statistics are dropped.
pub(super) fn cudnn(
    x: CudnnTensor,
    scale: CudnnTensor,
    bias: Option<CudnnTensor>,
    epsilon: f64,
    mode: NormMode,
) -> CudnnTensor {
    forward(x, scale, bias, epsilon, mode).0
}

/// The norm on `Autodiff<Cudnn, C>` with its backward node.
pub(super) fn autodiff<C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<Cudnn, C>>,
    scale: FloatTensor<Autodiff<Cudnn, C>>,
    bias: Option<FloatTensor<Autodiff<Cudnn, C>>>,
    epsilon: f64,
    mode: NormMode,
) -> FloatTensor<Autodiff<Cudnn, C>> {
    let (y, saved) = forward(
        x.primitive.clone(),
        scale.primitive.clone(),
        bias.as_ref().map(|b| b.primitive.clone()),
        epsilon,
        mode,
    );
    match bias {
        Some(b) => match NormBiasNode
            .prepare::<C>([x.node.clone(), scale.node.clone(), b.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(saved, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
        None => match NormNode
            .prepare::<C>([x.node.clone(), scale.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(saved, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    }
}
