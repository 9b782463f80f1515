//! Drop-ins for `burn::nn::{LayerNorm, RmsNorm}`: same configs, fields and records; on our
//! backends one kernel pass forward and one fused backward (instead of Burn's composed
//! mean/variance graph under autodiff).

use burn_core as burn;
use burn_core::config::Config;
use burn_core::module::{Initializer, Module, Param};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{DType, Tensor, TensorPrimitive};

use crate::burn::route::{cast, on_our_backend};
use crate::burn::training::TrainingOps;
use crate::graph::NormMode;

/// Configuration of [`LayerNorm`] (the fields and defaults of `burn::nn::LayerNormConfig`).
#[derive(Config, Debug)]
pub struct LayerNormConfig {
    /// The size of the normalized (last) dim.
    pub d_model: usize,
    /// Added to the variance for numerical stability. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f64,
    /// Whether a learnable shift (beta) is applied. Default: true.
    #[config(default = true)]
    pub bias: bool,
}

/// Layer normalization over the last dim, a drop-in for `burn::nn::LayerNorm` (same fields,
/// so records load both ways). Fused forward and backward on `Cudnn` and
/// `Autodiff<Cudnn>`; Burn's `layer_norm` on any other backend.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// The learnable scale.
    pub gamma: Param<Tensor<B, 1>>,
    /// The learnable shift (optional).
    pub beta: Option<Param<Tensor<B, 1>>>,
    /// Added to the variance for numerical stability.
    pub epsilon: f64,
}

impl LayerNormConfig {
    /// A new [`LayerNorm`]: scale 1, shift 0.
    pub fn init<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        LayerNorm {
            gamma: Initializer::Ones.init([self.d_model], device),
            beta: self.bias.then(|| Initializer::Zeros.init([self.d_model], device)),
            epsilon: self.epsilon,
        }
    }
}

/// `norm` of `x` on backend `T` (which is `B`).
fn fused<B: Backend, T: TrainingOps, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
    mode: NormMode,
) -> Tensor<B, D> {
    let prim = |t: Tensor<T, 1>| t.into_primitive().tensor();
    let y = T::norm(
        cast::<B, T, D>(x).into_primitive().tensor(),
        prim(cast(gamma)),
        beta.map(|b| prim(cast(b))),
        epsilon,
        mode,
    );
    cast::<T, B, D>(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// The inputs handed back when `B` is not one of our backends.
type NotOurs<B, const D: usize> = (Tensor<B, D>, Tensor<B, 1>, Option<Tensor<B, 1>>);

/// Runs the fused norm when `B` is one of our backends; gives the inputs back otherwise.
fn on_ours<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
    mode: NormMode,
) -> Result<Tensor<B, D>, NotOurs<B, D>> {
    on_our_backend!(B, T => Ok(fused::<B, T, D>(x, gamma, beta, epsilon, mode)), else Err((x, gamma, beta)))
}

impl<B: Backend> LayerNorm<B> {
    /// Normalizes `input` (`[..., d_model]`) over its last dim.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let gamma = self.gamma.val();
        let beta = self.beta.as_ref().map(|b| b.val());
        match on_ours(input, gamma, beta, self.epsilon, NormMode::LayerNorm) {
            Ok(y) => y,
            Err((x, gamma, beta)) => Tensor::from_primitive(TensorPrimitive::Float(B::layer_norm(
                x.into_primitive().tensor(),
                gamma.into_primitive().tensor(),
                beta.map(|b| b.into_primitive().tensor()),
                self.epsilon,
            ))),
        }
    }

    /// Burn's `LayerNorm` on the same parameters.
    pub fn to_burn(&self) -> burn_nn::LayerNorm<B> {
        let gamma = self.gamma.val();
        // Burn's epsilon is private: its config sets it, then the parameters are ours.
        let mut norm = burn_nn::LayerNormConfig::new(gamma.dims()[0])
            .with_epsilon(self.epsilon)
            .with_bias(self.beta.is_some())
            .init(&gamma.device());
        // Initialized first: a clone of a lazy parameter would draw its own values.
        norm.gamma = Param::initialized(self.gamma.id, gamma);
        norm.beta = self.beta.as_ref().map(|b| Param::initialized(b.id, b.val()));
        norm
    }
}

/// Configuration of [`RmsNorm`] (the fields and defaults of `burn::nn::RmsNormConfig`).
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// The size of the normalized (last) dim.
    pub d_model: usize,
    /// Added to the mean square for numerical stability. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f64,
}

/// RMS normalization over the last dim, a drop-in for `burn::nn::RmsNorm` (same fields).
/// Fused forward and backward on our backends; Burn's composition on any other backend.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// The learnable scale.
    pub gamma: Param<Tensor<B, 1>>,
    /// Added to the mean square for numerical stability.
    pub epsilon: f64,
}

impl RmsNormConfig {
    /// A new [`RmsNorm`] with scale 1. Panics unless `epsilon > 0` (as Burn's does).
    pub fn init<B: Backend>(&self, device: &B::Device) -> RmsNorm<B> {
        assert!(self.epsilon > 0.0, "epsilon must be positive.");
        RmsNorm {
            gamma: Initializer::Ones.init([self.d_model], device),
            epsilon: self.epsilon,
        }
    }
}

impl<B: Backend> RmsNorm<B> {
    /// `x / sqrt(mean(x²) + epsilon) · gamma` over the last dim.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match on_ours(x, self.gamma.val(), None, self.epsilon, NormMode::RmsNorm) {
            Ok(y) => y,
            Err((x, gamma, _)) => {
                let dtype = x.dtype();
                let rms = (x.clone().cast(DType::F32).square().mean_dim(D - 1) + self.epsilon).sqrt();
                (x / rms.cast(dtype)) * gamma.unsqueeze()
            }
        }
    }
}
