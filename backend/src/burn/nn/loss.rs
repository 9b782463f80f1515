//! A drop-in for `burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig}`: same config,
//! fields and record; on our backends the loss of logits with class targets (optionally with
//! pad tokens) is one kernel pass over the logits forward and one backward, where Burn's
//! module composes a log-softmax, a gather and a mean (several passes over a tensor that is
//! the largest of a language model's step).

use burn_core as burn;
use burn_core::config::Config;
use burn_core::module::Module;
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{DType, Int, Tensor, TensorPrimitive};

use crate::burn::route::{cast, cast_int, on_our_backend};
use crate::burn::training::TrainingOps;
use crate::ops::{CrossEntropyMean, CROSS_ENTROPY_MAX_IGNORE};

/// Configuration of [`CrossEntropyLoss`] (the fields and defaults of
/// `burn::nn::loss::CrossEntropyLossConfig`).
#[derive(Config, Debug)]
pub struct CrossEntropyLossConfig {
    /// Target values whose rows are left out of the loss (they count 0 in the mean, which
    /// still divides by every row, as Burn's does).
    pub pad_tokens: Option<Vec<usize>>,
    /// Per-class weights of a weighted cross-entropy (all positive).
    pub weights: Option<Vec<f32>>,
    /// Label smoothing `alpha` in `[0, 1]`: the targets become `y (1 - alpha) + alpha / classes`.
    pub smoothing: Option<f32>,
    /// Whether the inputs are logits (`true`) or probabilities. Default: true.
    #[config(default = true)]
    pub logits: bool,
}

impl CrossEntropyLossConfig {
    /// A new [`CrossEntropyLoss`]. Panics where Burn's does: a smoothing outside `[0, 1]` or
    /// a weight that is not positive.
    pub fn init<B: Backend>(&self, device: &B::Device) -> CrossEntropyLoss<B> {
        if let Some(alpha) = self.smoothing {
            assert!(
                (0.0..=1.0).contains(&alpha),
                "cross-entropy label smoothing must lie in [0, 1], got {alpha}"
            );
        }
        if let Some(w) = &self.weights {
            assert!(w.iter().all(|&v| v > 0.0), "cross-entropy weights must be positive");
        }
        CrossEntropyLoss {
            pad_tokens: self.pad_tokens.clone(),
            weights: self.weights.as_ref().map(|w| Tensor::from_floats(w.as_slice(), device)),
            smoothing: self.smoothing,
            logits: self.logits,
        }
    }
}

/// Cross-entropy loss, a drop-in for `burn::nn::loss::CrossEntropyLoss` (same fields, so
/// records load both ways; it has no parameters).
///
/// With logits, no weights and no smoothing (the default config, `pad_tokens` allowed: up to
/// [`CROSS_ENTROPY_MAX_IGNORE`] of them) on `Cudnn`, `CudnnFusion` and their `Autodiff` forms,
/// for F32, F16 and BF16 logits, the loss is [`TrainingOps::cross_entropy`]: one pass over the
/// logits forward (accumulated in f32) and one for their gradient. A target outside
/// `[0, classes)` that is not a pad token is not checked (that would read the targets back
/// every step): the loss and the logits' gradient come out NaN. Every other case, and any
/// other backend, runs Burn's module.
#[derive(Module, Debug)]
pub struct CrossEntropyLoss<B: Backend> {
    /// Target values whose rows are left out of the loss.
    pub pad_tokens: Option<Vec<usize>>,
    /// Per-class weights.
    pub weights: Option<Tensor<B, 1>>,
    /// Label smoothing factor.
    pub smoothing: Option<f32>,
    /// Whether the inputs are logits.
    pub logits: bool,
}

impl<B: Backend> CrossEntropyLoss<B> {
    /// The loss with an optional pad token (as Burn's `CrossEntropyLoss::new`).
    pub fn new(pad_index: Option<usize>, device: &B::Device) -> Self {
        CrossEntropyLossConfig::new()
            .with_pad_tokens(pad_index.map(|p| vec![p]))
            .init(device)
    }

    /// The mean loss (`[1]`) of `logits` `[batch, classes]` against the class indices
    /// `targets` `[batch]`. Panics when the batch sizes differ.
    pub fn forward(&self, logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let ([rows, classes], [n]) = (logits.dims(), targets.dims());
        assert!(
            rows == n,
            "cross-entropy: {n} targets for {rows} rows of logits (the batch sizes must match)"
        );
        let Some(ignore) = self.fusable(rows, classes, logits.dtype()) else {
            return self.to_burn().forward(logits, targets);
        };
        on_our_backend!(B, T => fused::<B, T>(logits, targets, &ignore), else self.to_burn().forward(logits, targets))
    }

    /// The ignored targets when the fused loss computes this module's loss for `rows` rows of
    /// `classes` logits of `dtype`; `None` when Burn's module must.
    fn fusable(&self, rows: usize, classes: usize, dtype: DType) -> Option<Vec<i64>> {
        let plain = self.logits && self.weights.is_none() && self.smoothing.is_none();
        let supported = matches!(dtype, DType::F32 | DType::Flex32 | DType::F16 | DType::BF16);
        // Burn compares the targets with each pad token cast to i64 (and indexes the first).
        let ignore: Vec<i64> = self.pad_tokens.iter().flatten().map(|&p| p as i64).collect();
        let pads_ok = self
            .pad_tokens
            .as_ref()
            .is_none_or(|p| !p.is_empty() && p.len() <= CROSS_ENTROPY_MAX_IGNORE);
        (plain && supported && pads_ok && rows > 0 && classes > 0).then_some(ignore)
    }

    /// Burn's `CrossEntropyLoss` with the same fields.
    pub fn to_burn(&self) -> burn_nn::loss::CrossEntropyLoss<B> {
        burn_nn::loss::CrossEntropyLoss {
            pad_tokens: self.pad_tokens.clone(),
            weights: self.weights.clone(),
            smoothing: self.smoothing,
            logits: self.logits,
        }
    }
}

/// The fused loss on backend `T` (which is `B`).
fn fused<B: Backend, T: TrainingOps>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>, ignore: &[i64]) -> Tensor<B, 1> {
    let x = cast::<B, T, 2>(logits).into_primitive().tensor();
    let t = cast_int::<B, T, 1>(targets).into_primitive();
    let loss = T::cross_entropy(x, t, ignore, CrossEntropyMean::AllRows);
    cast::<T, B, 1>(Tensor::from_primitive(TensorPrimitive::Float(loss)))
}
