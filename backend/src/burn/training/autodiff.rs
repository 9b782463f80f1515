//! The fused training ops under `Autodiff<B>` for `B` = [`Cudnn`] or `Fusion<Cudnn>`: the
//! forward through [`TrainingKernels`] plus our own backward nodes, so training reaches the
//! fused backward passes too.

use std::marker::PhantomData;

use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_backend::ops::{ActivationOps, FloatTensorOps};
use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{AutodiffBackend, Scalar, Shape, TensorMetadata};

use super::kernels::TrainingKernels;
use super::{attention, BatchNormOutput};
use crate::graph::NormMode;
use crate::ops::{BatchNormOptions, CrossEntropyMean};

/// Runs a backward node: `backward(state, dy, tracked)` gets the output's gradient and which
/// of the `N` parents are tracked, and returns their gradients in parent order; each tracked
/// parent's is registered.
fn register_parent_grads<B: TrainingKernels, S, const N: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    backward: impl FnOnce(&S, FloatTensor<B>, [bool; N]) -> [Option<FloatTensor<B>>; N],
) {
    let dy = grads.consume::<B>(&ops.node);
    let tracked = ops.parents.each_ref().map(|p| p.is_some());
    let gs = backward(&ops.state, dy, tracked);
    for (parent, g) in ops.parents.iter().zip(gs) {
        if let (Some(node), Some(g)) = (parent, g) {
            grads.register::<B>(node.id, g);
        }
    }
}

/// The backward node of a batch norm: parents x, scale, bias (`N = 3`) and the residual
/// (`N = 4`).
#[derive(Debug)]
struct BatchNormNode<B>(PhantomData<fn() -> B>);

impl<B: TrainingKernels, const N: usize> Backward<B, N> for BatchNormNode<B> {
    type State = B::BnSaved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_parent_grads::<B, _, N>(ops, grads, |s, dy, t| {
            let at = |i: usize| i < N && t[i];
            let [dx, dz, ds, db] = B::bn_backward(s, dy, [at(0), at(3), at(1), at(2)]);
            let mut all = [dx, ds, db, dz].into_iter();
            std::array::from_fn(|_| all.next().flatten())
        });
    }
}

/// The backward node of a layer or RMS norm: parents x, scale (`N = 2`) and the bias
/// (`N = 3`).
#[derive(Debug)]
struct NormNode<B>(PhantomData<fn() -> B>);

impl<B: TrainingKernels, const N: usize> Backward<B, N> for NormNode<B> {
    type State = B::NormSaved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_parent_grads::<B, _, N>(ops, grads, |s, dy, t| {
            let at = |i: usize| i < N && t[i];
            let mut all = B::norm_backward(s, dy, [at(0), at(1), at(2)]).into_iter();
            std::array::from_fn(|_| all.next().flatten())
        });
    }
}

/// The backward node of an attention: parents q, k, v (`N = 3`; an untracked bias or none)
/// and a tracked bias (`N = 4`), whose gradient the fused backward computes too.
#[derive(Debug)]
struct AttentionNode<B>(PhantomData<fn() -> B>);

impl<B: TrainingKernels, const N: usize> Backward<B, N> for AttentionNode<B> {
    type State = B::AttentionSaved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_parent_grads::<B, _, N>(ops, grads, |s, d_o, t| {
            let want_bias = N == 4 && t[N - 1];
            let ([dq, dk, dv], d_bias) = B::attention_backward(s, d_o, want_bias);
            let mut all = [Some(dq), Some(dk), Some(dv), d_bias].into_iter();
            std::array::from_fn(|_| all.next().flatten())
        });
    }
}

/// The backward node of a cross-entropy: one parent, the logits (the targets are integers).
#[derive(Debug)]
struct CrossEntropyNode<B>(PhantomData<fn() -> B>);

impl<B: TrainingKernels> Backward<B, 1> for CrossEntropyNode<B> {
    type State = B::XentSaved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        register_parent_grads::<B, _, 1>(ops, grads, |s, grad, [tracked]| {
            [tracked.then(|| B::xent_backward(s, grad))]
        });
    }
}

/// Finishes node `$node` of checkpoint strategy `$C` over `$parents` with output `$y`,
/// keeping `$saved` only when some parent is tracked.
macro_rules! finish {
    ($C:ty, $node:expr, $parents:expr, $saved:expr, $y:expr) => {
        match $node.prepare::<$C>($parents).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish($saved, $y),
            OpsKind::UnTracked(prep) => prep.finish($y),
        }
    };
}

/// Batch norm training on `Autodiff<B, C>`.
pub(super) fn batch_norm_train<B: TrainingKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    scale: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    residual: Option<FloatTensor<Autodiff<B, C>>>,
    running_mean: FloatTensor<Autodiff<B, C>>,
    running_var: FloatTensor<Autodiff<B, C>>,
    options: BatchNormOptions,
) -> BatchNormOutput<Autodiff<B, C>> {
    let running = [running_mean.primitive, running_var.primitive];
    let (y, [rm, rv], saved) = B::bn_forward(
        x.primitive.clone(),
        scale.primitive.clone(),
        bias.primitive.clone(),
        residual.as_ref().map(|z| z.primitive.clone()),
        running,
        &options,
    );
    let node = BatchNormNode::<B>(PhantomData);
    let output = match residual {
        None => finish!(C, node, [x.node, scale.node, bias.node], saved, y),
        Some(z) => finish!(C, node, [x.node, scale.node, bias.node, z.node], saved, y),
    };
    BatchNormOutput {
        output,
        running_mean: <Autodiff<B, C>>::from_inner(rm),
        running_var: <Autodiff<B, C>>::from_inner(rv),
    }
}

/// Batch norm inference on `Autodiff<B, C>`: the fused kernel when nothing is tracked, the
/// same math from differentiable ops otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn batch_norm_inference<B: TrainingKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    scale: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    residual: Option<FloatTensor<Autodiff<B, C>>>,
    running_mean: FloatTensor<Autodiff<B, C>>,
    running_var: FloatTensor<Autodiff<B, C>>,
    epsilon: f64,
    relu: bool,
) -> FloatTensor<Autodiff<B, C>> {
    type A<B, C> = Autodiff<B, C>;
    if [&x, &scale, &bias, &running_mean, &running_var]
        .iter()
        .all(|t| t.node.requirement.is_none())
        && residual.as_ref().is_none_or(|z| z.node.requirement.is_none())
    {
        let y = B::batch_norm_inference(
            x.primitive,
            scale.primitive,
            bias.primitive,
            residual.map(|z| z.primitive),
            running_mean.primitive,
            running_var.primitive,
            epsilon,
            relu,
        );
        return A::<B, C>::from_inner(y);
    }
    // Some input is tracked: compose the same math from differentiable ops.
    let rank = x.primitive.rank();
    let c = scale.primitive.shape()[0];
    let mut dims = vec![1usize; rank];
    dims[1] = c;
    let per_channel = |t| A::<B, C>::float_reshape(t, Shape::from(dims.clone()));
    let inv = A::<B, C>::float_recip(A::<B, C>::float_sqrt(A::<B, C>::float_add_scalar(
        running_var,
        Scalar::Float(epsilon),
    )));
    let coef = A::<B, C>::float_mul(scale, inv);
    let shift = A::<B, C>::float_sub(bias, A::<B, C>::float_mul(running_mean, coef.clone()));
    let mut y = A::<B, C>::float_add(A::<B, C>::float_mul(x, per_channel(coef)), per_channel(shift));
    if let Some(z) = residual {
        y = A::<B, C>::float_add(y, z);
    }
    if relu {
        y = <A<B, C> as ActivationOps<A<B, C>>>::relu(y);
    }
    y
}

/// Layer or RMS norm on `Autodiff<B, C>` with its backward node.
pub(super) fn norm<B: TrainingKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    scale: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    epsilon: f64,
    mode: NormMode,
) -> FloatTensor<Autodiff<B, C>> {
    let (y, saved) = B::norm_forward(
        x.primitive.clone(),
        scale.primitive.clone(),
        bias.as_ref().map(|b| b.primitive.clone()),
        epsilon,
        mode,
    );
    let node = NormNode::<B>(PhantomData);
    match bias {
        Some(b) => finish!(C, node, [x.node, scale.node, b.node], saved, y),
        None => finish!(C, node, [x.node, scale.node], saved, y),
    }
}

/// Attention on `Autodiff<B, C>`: the fused forward and backward node when fusable (a
/// tracked bias is the node's fourth parent and gets its gradient from the fused backward);
/// otherwise Burn's composed attention on the autodiff backend.
pub(super) fn sdpa<B: TrainingKernels, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    causal: bool,
    scale: f64,
) -> FloatTensor<Autodiff<B, C>> {
    if let Some(o) = fused_sdpa::<B, C>([&q, &k, &v], bias.as_ref(), causal, scale, None) {
        return o;
    }
    burn_backend::ops::attention::attention_fallback::<Autodiff<B, C>>(
        q,
        k,
        v,
        None,
        bias,
        attention::options(causal, scale),
    )
}

/// Attention with dropout `probability` on the probabilities on `Autodiff<B, C>`: the fused
/// forward and backward node, the mask drawn from the Philox seed and offset in `rng` (two
/// `I64`); `None` when the fused graphs do not take the case (the caller composes it).
#[allow(clippy::too_many_arguments)]
pub(super) fn sdpa_dropout<B: TrainingKernels, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    causal: bool,
    scale: f64,
    probability: f64,
    rng: IntTensor<B>,
) -> Option<FloatTensor<Autodiff<B, C>>> {
    fused_sdpa::<B, C>([&q, &k, &v], bias.as_ref(), causal, scale, Some((probability, rng)))
}

/// The fused attention node over q, k, v and a tracked bias (its fourth parent), with the
/// optional dropout; `None` when the fused graphs do not take the case.
fn fused_sdpa<B: TrainingKernels, C: CheckpointStrategy>(
    [q, k, v]: [&FloatTensor<Autodiff<B, C>>; 3],
    bias: Option<&FloatTensor<Autodiff<B, C>>>,
    causal: bool,
    scale: f64,
    dropout: Option<(f64, IntTensor<B>)>,
) -> Option<FloatTensor<Autodiff<B, C>>> {
    let bias_tracked = bias.is_some_and(|b| !b.node.requirement.is_none());
    let bias_p = bias.map(|b| &b.primitive);
    if !B::attention_fusable(
        &q.primitive,
        &k.primitive,
        &v.primitive,
        bias_p,
        causal,
        dropout.is_some(),
    ) {
        return None;
    }
    let (o, saved) = B::attention_forward(
        q.primitive.clone(),
        k.primitive.clone(),
        v.primitive.clone(),
        bias_p.cloned(),
        causal,
        scale,
        bias_tracked,
        dropout,
    )?;
    let node = AttentionNode::<B>(PhantomData);
    let [qn, kn, vn] = [q, k, v].map(|t| t.node.clone());
    Some(match bias {
        Some(b) if bias_tracked => finish!(C, node, [qn, kn, vn, b.node.clone()], saved, o),
        _ => finish!(C, node, [qn, kn, vn], saved, o),
    })
}

/// Cross-entropy on `Autodiff<B, C>` with its backward node (the logits' gradient only).
pub(super) fn cross_entropy<B: TrainingKernels, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    targets: IntTensor<B>,
    ignore: &[i64],
    mean_over: CrossEntropyMean,
) -> FloatTensor<Autodiff<B, C>> {
    let (loss, saved) = B::xent_forward(logits.primitive.clone(), targets, ignore, mean_over);
    finish!(C, CrossEntropyNode::<B>(PhantomData), [logits.node], saved, loss)
}
