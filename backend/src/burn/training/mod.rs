//! Fused training ops for Burn: the backend-extension trait [`TrainingOps`], implemented
//! for [`Cudnn`] (the engine's fused kernels), for `Fusion<Cudnn>` (the same kernels as
//! recorded custom operations), and for `Autodiff` over either (the same forward plus our
//! own backward nodes, so training reaches the fused backward too).
//!
//! The drop-in modules of [`crate::burn::nn`] call these on our backends and compose the
//! same math from Burn's ops on any other backend.

use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::Autodiff;
use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;

mod attention;
mod autodiff;
mod batch_norm;
mod fusion;
mod kernels;
mod norm;

use super::tensor::{expect, CudnnTensor};
use super::{Cudnn, CudnnFusion};
use crate::graph::NormMode;
use crate::ops::BatchNormOptions;

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
    /// forward and backward where they apply (f16/bf16); in f32 without a bias under
    /// `Autodiff`, the engine's math path (cuDNN matmuls around one softmax kernel, the
    /// probabilities kept for the backward); composed otherwise. A tracked (learned)
    /// `bias` gets its gradient from the fused backward too. The output is laid out
    /// `[batch, seq, heads, head_dim]` in memory, so merging the heads is free.
    fn sdpa(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        causal: bool,
        scale: f64,
    ) -> FloatTensor<Self>;
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
        let (output, [running_mean, running_var], _) = expect(
            "batch_norm_train",
            batch_norm::forward(x, scale, bias, residual, [running_mean, running_var], &options),
        );
        BatchNormOutput {
            output,
            running_mean,
            running_var,
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
        expect(
            "batch_norm_inference",
            batch_norm::inference(x, scale, bias, residual, running_mean, running_var, epsilon, relu),
        )
    }

    fn norm(
        x: CudnnTensor,
        scale: CudnnTensor,
        bias: Option<CudnnTensor>,
        epsilon: f64,
        mode: NormMode,
    ) -> CudnnTensor {
        expect("norm", norm::forward(x, scale, bias, epsilon, mode)).0
    }

    fn sdpa(
        q: CudnnTensor,
        k: CudnnTensor,
        v: CudnnTensor,
        bias: Option<CudnnTensor>,
        causal: bool,
        scale: f64,
    ) -> CudnnTensor {
        expect("sdpa", attention::cudnn(q, k, v, bias, causal, scale))
    }
}

/// `TrainingOps` for `Autodiff<$inner, C>` through the generic autodiff nodes.
macro_rules! autodiff_training_ops {
    ($inner:ty) => {
        impl<C: CheckpointStrategy> TrainingOps for Autodiff<$inner, C> {
            fn batch_norm_train(
                x: FloatTensor<Self>,
                scale: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                residual: Option<FloatTensor<Self>>,
                running_mean: FloatTensor<Self>,
                running_var: FloatTensor<Self>,
                options: BatchNormOptions,
            ) -> BatchNormOutput<Self> {
                autodiff::batch_norm_train::<$inner, C>(x, scale, bias, residual, running_mean, running_var, options)
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
                autodiff::batch_norm_inference::<$inner, C>(
                    x,
                    scale,
                    bias,
                    residual,
                    running_mean,
                    running_var,
                    epsilon,
                    relu,
                )
            }

            fn norm(
                x: FloatTensor<Self>,
                scale: FloatTensor<Self>,
                bias: Option<FloatTensor<Self>>,
                epsilon: f64,
                mode: NormMode,
            ) -> FloatTensor<Self> {
                autodiff::norm::<$inner, C>(x, scale, bias, epsilon, mode)
            }

            fn sdpa(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                bias: Option<FloatTensor<Self>>,
                causal: bool,
                scale: f64,
            ) -> FloatTensor<Self> {
                autodiff::sdpa::<$inner, C>(q, k, v, bias, causal, scale)
            }
        }
    };
}

autodiff_training_ops!(Cudnn);
autodiff_training_ops!(CudnnFusion);
