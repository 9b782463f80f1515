//! The transformer layers the Candle trainers share (`train_candle_models`' GPT-2,
//! `train_candle_transformer`'s encoder), each run as this crate's fused layer or as
//! candle-nn's (`stock`), on variables the caller made with its own initialization.

use candle_core::{DType, Module, Result, Tensor};
use cudnn_backend::candle::nn as ours;
use cudnn_backend::candle::Activation;

/// A linear layer with an activation: this crate's `Linear` (bias and activation fused into
/// the matmul) or candle-nn's followed by the activation.
#[derive(Clone, Debug)]
pub struct Dense {
    /// `(d_out, d_in)`.
    pub weight: Tensor,
    /// `(d_out)`.
    pub bias: Tensor,
    /// Applied after the bias (`Identity` or `Gelu`).
    pub act: Activation,
    /// candle-nn's layer instead of this crate's.
    pub stock: bool,
}

impl Dense {
    /// The layer with its variables cast to `dt`.
    pub fn cast(&self, dt: DType) -> Result<Self> {
        Ok(Self {
            weight: self.weight.to_dtype(dt)?,
            bias: self.bias.to_dtype(dt)?,
            ..*self
        })
    }

    /// `act(x · weightᵀ + bias)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (self.weight.clone(), Some(self.bias.clone()));
        if self.stock {
            let y = candle_nn::Linear::new(w, b).forward(x)?;
            match self.act {
                Activation::Gelu => y.gelu_erf(),
                _ => Ok(y),
            }
        } else {
            ours::Linear::new(w, b).with_activation(self.act).forward(x)
        }
    }
}

/// Layer norm over the last dim: this crate's fused layer or candle-nn's composed one.
#[derive(Clone, Debug)]
pub struct Norm {
    /// The scale.
    pub weight: Tensor,
    /// The shift.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
    /// candle-nn's composed layer norm instead of this crate's.
    pub stock: bool,
}

impl Norm {
    /// The layer with its variables cast to `dt`.
    pub fn cast(&self, dt: DType) -> Result<Self> {
        Ok(Self {
            weight: self.weight.to_dtype(dt)?,
            bias: self.bias.to_dtype(dt)?,
            ..*self
        })
    }

    /// The normalized `x`, scaled and shifted.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.stock {
            candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, self.eps as f32)
        } else {
            ours::LayerNorm::new(self.weight.clone(), self.bias.clone(), self.eps).forward(x)
        }
    }
}
