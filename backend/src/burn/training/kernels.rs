//! [`TrainingKernels`]: the forward-with-saved-state and backward primitives the autodiff
//! nodes of [`super::autodiff`] run, implemented for [`Cudnn`] (eagerly) and for
//! `Fusion<Cudnn>` (as recorded custom operations, [`super::fusion`]).

use std::fmt::Debug;

use burn_backend::tensor::{FloatTensor, IntTensor};

use super::super::tensor::{expect, CudnnTensor};
use super::super::Cudnn;
use super::attention::AttentionGrads;
use super::{attention, batch_norm, cross_entropy, norm, TrainingOps};
use crate::graph::NormMode;
use crate::ops::{BatchNormOptions, CrossEntropyMean};

/// The primitives behind the fused training ops' forward and backward passes.
pub(crate) trait TrainingKernels: TrainingOps + crate::burn::AutodiffInner {
    /// What a batch norm's backward needs.
    type BnSaved: Clone + Send + Debug + 'static;
    /// What a layer or RMS norm's backward needs.
    type NormSaved: Clone + Send + Debug + 'static;
    /// What an attention's backward needs.
    type AttentionSaved: Clone + Send + Debug + 'static;
    /// What a cross-entropy's backward needs.
    type XentSaved: Clone + Send + Debug + 'static;

    /// Batch-norm training forward: `(y, [running mean, running var] updated, saved)`.
    fn bn_forward(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        running: [FloatTensor<Self>; 2],
        options: &BatchNormOptions,
    ) -> (FloatTensor<Self>, [FloatTensor<Self>; 2], Self::BnSaved);

    /// `[dx, d_residual, d_scale, d_bias]`, each when `want` asks.
    fn bn_backward(saved: &Self::BnSaved, dy: FloatTensor<Self>, want: [bool; 4]) -> [Option<FloatTensor<Self>>; 4];

    /// Norm training forward over the last dim: `(y, saved)`.
    fn norm_forward(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        epsilon: f64,
        mode: NormMode,
    ) -> (FloatTensor<Self>, Self::NormSaved);

    /// `[dx, d_scale, d_bias]`, each when `want` asks.
    fn norm_backward(saved: &Self::NormSaved, dy: FloatTensor<Self>, want: [bool; 3])
        -> [Option<FloatTensor<Self>>; 3];

    /// Whether the fused attention graphs (f16/bf16) or the f32 math path take these tensors
    /// (dims and dtypes only): `attention::trainable`; with `dropout`, the fused graphs only
    /// (`attention::dropout_fusable_shapes`).
    fn attention_fusable(
        q: &FloatTensor<Self>,
        k: &FloatTensor<Self>,
        v: &FloatTensor<Self>,
        bias: Option<&FloatTensor<Self>>,
        causal: bool,
        dropout: bool,
    ) -> bool;

    /// Fused attention forward keeping the softmax statistics: `(o, saved)`, or `None`
    /// when cuDNN declines the case. `bias_grad`: the backward will want the bias's gradient.
    /// `dropout`: the probability of dropping and the Philox seed and offset (two `I64`).
    #[allow(clippy::too_many_arguments)]
    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        causal: bool,
        scale: f64,
        bias_grad: bool,
        dropout: Option<(f64, IntTensor<Self>)>,
    ) -> Option<(FloatTensor<Self>, Self::AttentionSaved)>;

    /// `([dq, dk, dv], d_bias)`: the bias's gradient (its dims and dtype) only with
    /// `want_bias` and a bias in the forward.
    fn attention_backward(
        saved: &Self::AttentionSaved,
        d_o: FloatTensor<Self>,
        want_bias: bool,
    ) -> AttentionGrads<FloatTensor<Self>>;

    /// Cross-entropy forward: `(mean loss [1], saved)`.
    fn xent_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        ignore: &[i64],
        mean_over: CrossEntropyMean,
    ) -> (FloatTensor<Self>, Self::XentSaved);

    /// The logits' gradient for the gradient of the mean loss.
    fn xent_backward(saved: &Self::XentSaved, grad: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl TrainingKernels for Cudnn {
    type BnSaved = batch_norm::BnSaved;
    type NormSaved = norm::NormSaved;
    type AttentionSaved = attention::AttentionSaved;
    type XentSaved = cross_entropy::XentSaved;

    fn bn_forward(
        x: CudnnTensor,
        scale: CudnnTensor,
        bias: CudnnTensor,
        residual: Option<CudnnTensor>,
        running: [CudnnTensor; 2],
        options: &BatchNormOptions,
    ) -> (CudnnTensor, [CudnnTensor; 2], Self::BnSaved) {
        expect(
            "batch_norm_train",
            batch_norm::forward(x, scale, bias, residual, running, options),
        )
    }

    fn bn_backward(saved: &Self::BnSaved, dy: CudnnTensor, want: [bool; 4]) -> [Option<CudnnTensor>; 4] {
        expect("batch_norm_backward", batch_norm::backward(saved, dy, want))
    }

    fn norm_forward(
        x: CudnnTensor,
        scale: CudnnTensor,
        bias: Option<CudnnTensor>,
        epsilon: f64,
        mode: NormMode,
    ) -> (CudnnTensor, Self::NormSaved) {
        expect("norm_train_forward", norm::forward(x, scale, bias, epsilon, mode))
    }

    fn norm_backward(saved: &Self::NormSaved, dy: CudnnTensor, want: [bool; 3]) -> [Option<CudnnTensor>; 3] {
        expect("norm_backward", norm::backward(saved, dy, want))
    }

    fn attention_fusable(
        q: &CudnnTensor,
        k: &CudnnTensor,
        v: &CudnnTensor,
        bias: Option<&CudnnTensor>,
        causal: bool,
        dropout: bool,
    ) -> bool {
        if dropout {
            attention::dropout_fusable(q, k, v, bias, causal)
        } else {
            attention::trainable(q, k, v, bias, causal)
        }
    }

    fn attention_forward(
        q: CudnnTensor,
        k: CudnnTensor,
        v: CudnnTensor,
        bias: Option<CudnnTensor>,
        causal: bool,
        scale: f64,
        bias_grad: bool,
        dropout: Option<(f64, CudnnTensor)>,
    ) -> Option<(CudnnTensor, Self::AttentionSaved)> {
        let dropout = dropout.map(|(probability, rng)| attention::Dropout { probability, rng });
        expect(
            "attention",
            attention::forward(q, k, v, bias, causal, scale, bias_grad, dropout),
        )
    }

    fn attention_backward(
        saved: &Self::AttentionSaved,
        d_o: CudnnTensor,
        want_bias: bool,
    ) -> AttentionGrads<CudnnTensor> {
        expect("attention_backward", attention::backward(saved, d_o, want_bias))
    }

    fn xent_forward(
        logits: CudnnTensor,
        targets: CudnnTensor,
        ignore: &[i64],
        mean_over: CrossEntropyMean,
    ) -> (CudnnTensor, Self::XentSaved) {
        expect(
            "cross_entropy",
            cross_entropy::forward(logits, targets, ignore, mean_over),
        )
    }

    fn xent_backward(saved: &Self::XentSaved, grad: CudnnTensor) -> CudnnTensor {
        expect("cross_entropy_backward", cross_entropy::backward(saved, grad))
    }
}
