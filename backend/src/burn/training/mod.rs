//! Fused training ops for Burn: the backend-extension trait [`TrainingOps`], implemented
//! for [`Cudnn`] (the engine's fused kernels) and for `Autodiff<Cudnn, C>` (the same
//! forward plus our own backward nodes, so training reaches the fused backward too).
//!
//! The drop-in modules of [`crate::burn::nn`] call these on our backends and compose the
//! same math from Burn's ops on any other backend.

use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_backend::tensor::FloatTensor;
use burn_backend::{AutodiffBackend, Backend, DType};

mod attention;
mod norm;

use super::exec;
use super::tensor::{expect, CudnnTensor};
use super::Cudnn;
use crate::graph::NormMode;
use crate::ops::{self, BatchNormBackward, BatchNormForward, BatchNormInference, BatchNormOptions, RunningStats};

/// What a batch-norm training step returns: the output and the updated running statistics
/// (not tracked by autodiff).
#[derive(Debug)]
pub struct BatchNormOutput<B: Backend> {
    /// `relu?(normalize(x) * scale + bias + residual)`.
    pub output: FloatTensor<B>,
    /// The running mean after the update.
    pub running_mean: FloatTensor<B>,
    /// The running variance after the update.
    pub running_var: FloatTensor<B>,
}

/// Training ops this crate runs fused: a backend-extension trait in the manner of Burn's
/// custom-kernel examples. Shapes: `x` and `residual` are `[N, C, spatial...]`, the
/// per-channel tensors `[C]`.
pub trait TrainingOps: Backend {
    /// Batch normalization with batch statistics (training mode): normalizes `x`, applies
    /// `scale` and `bias`, adds `residual` and applies ReLU when asked, and returns the
    /// running statistics updated with `options.momentum`.
    fn batch_norm_train(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        options: BatchNormOptions,
    ) -> BatchNormOutput<Self>;

    /// Batch normalization with the running statistics (inference mode), with the same
    /// optional residual add and ReLU.
    #[allow(clippy::too_many_arguments)]
    fn batch_norm_inference(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        epsilon: f64,
        relu: bool,
    ) -> FloatTensor<Self>;

    /// Layer norm (`mode` [`NormMode::LayerNorm`], with the optional `bias`) or RMS norm over
    /// the last dim of `x`, with `scale` and `bias` of that dim's size.
    fn norm(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        epsilon: f64,
        mode: NormMode,
    ) -> FloatTensor<Self>;

    /// Scaled dot-product attention `softmax(q·kᵀ·scale + bias [causal]) · v` on
    /// `[batch, heads, seq, head_dim]` tensors, through cuDNN's fused flash-attention graphs
    /// forward and backward where they apply (f16/bf16), composed otherwise. The output is
    /// laid out `[batch, seq, heads, head_dim]` in memory, so merging the heads is free.
    fn sdpa(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        causal: bool,
        scale: f64,
    ) -> FloatTensor<Self>;
}

/// The forward results the backward pass needs.
#[derive(Clone, Debug)]
struct BnSaved {
    x: CudnnTensor,
    /// The output, kept when the forward applied ReLU (its sign masks the gradient).
    y: Option<CudnnTensor>,
    scale: CudnnTensor,
    /// The dtype of the scale and bias parameters as passed (their gradients get it back).
    param_dtype: DType,
    mean: CudnnTensor,
    inv_std: CudnnTensor,
}

/// A new packed tensor with `like`'s dims and dim order (`like` is packed).
fn empty_as(like: &CudnnTensor, op: &str) -> CudnnTensor {
    let mut out = CudnnTensor::empty(like.device(), like.dims(), like.dtype, op);
    out.layout.strides = like.layout.strides.clone();
    out
}

/// The per-channel tensors in one dtype the kernels accept: the data dtype or f32.
fn param_dtype(data: DType, scale: &CudnnTensor) -> DType {
    if scale.dtype == data {
        data
    } else {
        DType::F32
    }
}

fn bn_forward_train(
    x: CudnnTensor,
    scale: CudnnTensor,
    bias: CudnnTensor,
    residual: Option<CudnnTensor>,
    running: [CudnnTensor; 2],
    o: &BatchNormOptions,
) -> (CudnnTensor, [CudnnTensor; 2], BnSaved) {
    const OP: &str = "batch_norm_train";
    let x = x.cudnn_ready();
    let residual = residual.map(|r| {
        exec::check_same_device(OP, &x, &r);
        r.cudnn_ready()
    });
    let param_dtype_in = scale.dtype;
    let pdt = param_dtype(x.dtype, &scale);
    let [scale, bias] = [scale, bias].map(|t| exec::cast(t, pdt, OP).contiguous());
    let [rm, rv] = running.map(|t| exec::cast(t, pdt, OP).contiguous());
    let c = x.dims().get(1).copied().unwrap_or(0);
    let y = empty_as(&x, OP);
    let [rm_out, rv_out] = [(); 2].map(|_| CudnnTensor::empty(x.device(), &[c], pdt, OP));
    let [mean, inv_std] = [(); 2].map(|_| CudnnTensor::empty(x.device(), &[c], DType::F32, OP));
    let (tx, tz, ty) = (x.tref(), residual.as_ref().map(|r| r.tref()), y.tref());
    let (ts, tb) = (scale.tref(), bias.tref());
    let (trm, trv, trmo, trvo) = (rm.tref(), rv.tref(), rm_out.tref(), rv_out.tref());
    let (tm, ti) = (mean.tref(), inv_std.tref());
    let args = BatchNormForward {
        x: &tx,
        residual: tz.as_ref(),
        y: &ty,
        scale: Some(&ts),
        bias: Some(&tb),
        running: Some(RunningStats {
            mean: &trm,
            var: &trv,
            mean_out: &trmo,
            var_out: &trvo,
        }),
        saved_mean: &tm,
        saved_inv_std: &ti,
    };
    expect(OP, ops::batch_norm_train_forward(x.stream(), &args, o));
    let saved = BnSaved {
        x,
        y: o.relu.then(|| y.clone()),
        scale,
        param_dtype: param_dtype_in,
        mean,
        inv_std,
    };
    (y, [rm_out, rv_out], saved)
}

/// Gradients of one batch-norm node: `[dx, d_residual, d_scale, d_bias]`, each computed
/// only when `want` asks for it.
fn bn_backward(s: &BnSaved, dy: CudnnTensor, want: [bool; 4]) -> [Option<CudnnTensor>; 4] {
    const OP: &str = "batch_norm_backward";
    // Gradients arrive in any layout (broadcasts from a mean, say): packed for the kernels.
    let dy = exec::cast(dy, s.x.dtype, OP).cudnn_ready();
    let [dx, dz] = [want[0], want[1]].map(|w| w.then(|| empty_as(&s.x, OP)));
    let c = s.scale.numel();
    let [ds, db] = [want[2], want[3]].map(|w| w.then(|| CudnnTensor::empty(s.x.device(), &[c], s.scale.dtype, OP)));
    let r = |t: &Option<CudnnTensor>| t.as_ref().map(|t| t.tref());
    let (tx, ty, tdy) = (s.x.tref(), r(&s.y), dy.tref());
    let (tdx, tdz, tds, tdb) = (r(&dx), r(&dz), r(&ds), r(&db));
    let (tscale, tm, ti) = (s.scale.tref(), s.mean.tref(), s.inv_std.tref());
    let args = BatchNormBackward {
        x: &tx,
        y: ty.as_ref(),
        dy: &tdy,
        dx: tdx.as_ref(),
        d_residual: tdz.as_ref(),
        scale: Some(&tscale),
        saved_mean: &tm,
        saved_inv_std: &ti,
        d_scale: tds.as_ref(),
        d_bias: tdb.as_ref(),
    };
    expect(OP, ops::batch_norm_backward(dy.stream(), &args));
    let back = |t: Option<CudnnTensor>| t.map(|t| exec::cast(t, s.param_dtype, OP));
    [dx, dz, back(ds), back(db)]
}

impl TrainingOps for Cudnn {
    fn batch_norm_train(
        x: CudnnTensor,
        scale: CudnnTensor,
        bias: CudnnTensor,
        residual: Option<CudnnTensor>,
        running_mean: CudnnTensor,
        running_var: CudnnTensor,
        options: BatchNormOptions,
    ) -> BatchNormOutput<Self> {
        let dtype = running_mean.dtype;
        let (y, [rm, rv], _) = bn_forward_train(x, scale, bias, residual, [running_mean, running_var], &options);
        BatchNormOutput {
            output: y,
            running_mean: exec::cast(rm, dtype, "batch_norm_train"),
            running_var: exec::cast(rv, dtype, "batch_norm_train"),
        }
    }

    fn batch_norm_inference(
        x: CudnnTensor,
        scale: CudnnTensor,
        bias: CudnnTensor,
        residual: Option<CudnnTensor>,
        running_mean: CudnnTensor,
        running_var: CudnnTensor,
        epsilon: f64,
        relu: bool,
    ) -> CudnnTensor {
        const OP: &str = "batch_norm_inference";
        let x = x.cudnn_ready();
        let residual = residual.map(|r| {
            exec::check_same_device(OP, &x, &r);
            r.cudnn_ready()
        });
        let pdt = param_dtype(x.dtype, &scale);
        let [scale, bias, rm, rv] =
            [scale, bias, running_mean, running_var].map(|t| exec::cast(t, pdt, OP).contiguous());
        let y = empty_as(&x, OP);
        let (tx, tz, ty) = (x.tref(), residual.as_ref().map(|r| r.tref()), y.tref());
        let (ts, tb, tm, tv) = (scale.tref(), bias.tref(), rm.tref(), rv.tref());
        let args = BatchNormInference {
            x: &tx,
            residual: tz.as_ref(),
            y: &ty,
            scale: Some(&ts),
            bias: Some(&tb),
            mean: &tm,
            var: &tv,
        };
        expect(OP, ops::batch_norm_inference(x.stream(), &args, epsilon, relu));
        y
    }

    fn norm(
        x: CudnnTensor,
        scale: CudnnTensor,
        bias: Option<CudnnTensor>,
        epsilon: f64,
        mode: NormMode,
    ) -> CudnnTensor {
        norm::cudnn(x, scale, bias, epsilon, mode)
    }

    fn sdpa(
        q: CudnnTensor,
        k: CudnnTensor,
        v: CudnnTensor,
        bias: Option<CudnnTensor>,
        causal: bool,
        scale: f64,
    ) -> CudnnTensor {
        attention::cudnn(q, k, v, bias, causal, scale)
    }
}

/// The backward node of a batch norm without a residual: parents x, scale, bias.
#[derive(Debug)]
struct BatchNormNode;

/// The backward node of a batch norm with a residual: parents x, scale, bias, residual.
#[derive(Debug)]
struct BatchNormResidualNode;

/// Computes the gradients the tracked `parents` need and registers them.
/// Runs a backward node: `backward(state, dy, tracked)` gets the output's gradient and which
/// of the `N` parents are tracked, and returns their gradients in parent order; each tracked
/// parent's is registered.
fn register_parent_grads<S, const N: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    backward: impl FnOnce(&S, CudnnTensor, [bool; N]) -> [Option<CudnnTensor>; N],
) {
    let dy = grads.consume::<Cudnn>(&ops.node);
    let tracked = ops.parents.each_ref().map(|p| p.is_some());
    let gs = backward(&ops.state, dy, tracked);
    for (parent, g) in ops.parents.iter().zip(gs) {
        if let (Some(node), Some(g)) = (parent, g) {
            grads.register::<Cudnn>(node.id, g);
        }
    }
}

/// Batch norm's gradients in parent order (x, scale, bias[, residual]).
fn register_bn_grads<const N: usize>(ops: Ops<BnSaved, N>, grads: &mut Gradients) {
    register_parent_grads(ops, grads, |s, dy, t: [bool; N]| {
        let at = |i: usize| i < N && t[i];
        let [dx, dz, ds, db] = bn_backward(s, dy, [at(0), at(3), at(1), at(2)]);
        let mut all = [dx, ds, db, dz].into_iter();
        std::array::from_fn(|_| all.next().flatten())
    });
}

impl Backward<Cudnn, 3> for BatchNormNode {
    type State = BnSaved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_bn_grads(ops, grads);
    }
}

impl Backward<Cudnn, 4> for BatchNormResidualNode {
    type State = BnSaved;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_bn_grads(ops, grads);
    }
}

impl<C: CheckpointStrategy> TrainingOps for Autodiff<Cudnn, C> {
    fn batch_norm_train(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        options: BatchNormOptions,
    ) -> BatchNormOutput<Self> {
        let dtype = running_mean.primitive.dtype;
        let running = [running_mean.primitive, running_var.primitive];
        let inner =
            |x: &FloatTensor<Self>, s: &FloatTensor<Self>, b: &FloatTensor<Self>, z: Option<&FloatTensor<Self>>| {
                bn_forward_train(
                    x.primitive.clone(),
                    s.primitive.clone(),
                    b.primitive.clone(),
                    z.map(|z| z.primitive.clone()),
                    running,
                    &options,
                )
            };
        let (output, [rm, rv]) = match residual {
            None => {
                let (y, stats, saved) = inner(&x, &scale, &bias, None);
                let nodes = [x.node.clone(), scale.node.clone(), bias.node.clone()];
                let out = match BatchNormNode.prepare::<C>(nodes).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => prep.finish(saved, y),
                    OpsKind::UnTracked(prep) => prep.finish(y),
                };
                (out, stats)
            }
            Some(z) => {
                let (y, stats, saved) = inner(&x, &scale, &bias, Some(&z));
                let nodes = [x.node.clone(), scale.node.clone(), bias.node.clone(), z.node.clone()];
                let out = match BatchNormResidualNode.prepare::<C>(nodes).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => prep.finish(saved, y),
                    OpsKind::UnTracked(prep) => prep.finish(y),
                };
                (out, stats)
            }
        };
        let untracked = |t: CudnnTensor| Self::from_inner(exec::cast(t, dtype, "batch_norm_train"));
        BatchNormOutput {
            output,
            running_mean: untracked(rm),
            running_var: untracked(rv),
        }
    }

    fn batch_norm_inference(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        epsilon: f64,
        relu: bool,
    ) -> FloatTensor<Self> {
        use burn_backend::ops::FloatTensorOps;
        use burn_backend::{Scalar, Shape, TensorMetadata};
        if [&x, &scale, &bias, &running_mean, &running_var]
            .iter()
            .all(|t| t.node.requirement.is_none())
            && residual.as_ref().is_none_or(|z| z.node.requirement.is_none())
        {
            let y = Cudnn::batch_norm_inference(
                x.primitive,
                scale.primitive,
                bias.primitive,
                residual.map(|z| z.primitive),
                running_mean.primitive,
                running_var.primitive,
                epsilon,
                relu,
            );
            return Self::from_inner(y);
        }
        // Some input is tracked: compose the same math from differentiable ops.
        let rank = x.primitive.rank();
        let c = scale.primitive.shape()[0];
        let mut dims = vec![1usize; rank];
        dims[1] = c;
        let per_channel = |t: FloatTensor<Self>| Self::float_reshape(t, Shape::from(dims.clone()));
        let inv = Self::float_recip(Self::float_sqrt(Self::float_add_scalar(
            running_var,
            Scalar::Float(epsilon),
        )));
        let coef = Self::float_mul(scale, inv);
        let shift = Self::float_sub(bias, Self::float_mul(running_mean, coef.clone()));
        let mut y = Self::float_add(Self::float_mul(x, per_channel(coef)), per_channel(shift));
        if let Some(z) = residual {
            y = Self::float_add(y, z);
        }
        if relu {
            y = <Self as burn_backend::ops::ActivationOps<Self>>::relu(y);
        }
        y
    }

    fn norm(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        epsilon: f64,
        mode: NormMode,
    ) -> FloatTensor<Self> {
        norm::autodiff::<C>(x, scale, bias, epsilon, mode)
    }

    fn sdpa(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        causal: bool,
        scale: f64,
    ) -> FloatTensor<Self> {
        attention::autodiff::<C>(q, k, v, bias, causal, scale)
    }
}
