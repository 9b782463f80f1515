//! A drop-in for `burn::nn::attention::MultiHeadAttention`: same config, fields and record;
//! on our backends the attention itself is cuDNN's fused flash attention, forward and
//! backward.

use burn_core as burn;
use burn_core::config::Config;
use burn_core::module::{Initializer, Module};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{Bool, Distribution, Int, Tensor, TensorPrimitive};
use burn_nn::{Dropout, DropoutConfig, Gelu, Linear, LinearConfig};

use crate::burn::route::{cast, cast_int, on_our_backend};
use crate::burn::tensor::storage_type;
use crate::burn::training::TrainingOps;
use crate::ops;

/// Configuration of [`MultiHeadAttention`] (the fields and defaults of
/// `burn::nn::attention::MultiHeadAttentionConfig`).
#[derive(Config, Debug)]
pub struct MultiHeadAttentionConfig {
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// Dropout on the attention scores (training). Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// The value masked scores take. Default: -1.0e4.
    #[config(default = -1.0e4)]
    pub min_float: f64,
    /// Use "quiet softmax" instead of the softmax. Default: false.
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// Initializer of the linear layers (Burn's default: Kaiming uniform, gain 1/√3).
    #[config(default = "Initializer::KaimingUniform{gain: 0.577_350_269_189_625_8, fan_out_only: false}")]
    pub initializer: Initializer,
}

/// Multi-head attention, a drop-in for `burn::nn::attention::MultiHeadAttention` (same
/// fields, so records load both ways).
///
/// On `Cudnn` and `Autodiff<Cudnn>` (and their fusion forms), without quiet softmax, the
/// attention runs as cuDNN's fused flash attention (f16/bf16 with head sizes cuDNN takes)
/// with a fused backward, dropout included: the mask is drawn by cuDNN's Philox generator
/// from a seed the backend's generator draws (so `B::seed` fixes it), and it drops weights
/// after the softmax (scaling the kept ones by `1 / (1 - p)`), as PyTorch does, where Burn's
/// module zeroes scores before the softmax. Other dtypes run the engine's math path without
/// dropout and Burn's composition with it. [`MhaOutput::weights`] is `None` on the fused path
/// (the weights are never materialized, like PyTorch's `need_weights=False`). Padding and
/// attention masks enter that graph as an additive bias of `min_float` on the masked scores
/// (Burn replaces those scores by `min_float`: the weights agree wherever a row keeps one
/// key; a row whose keys are all masked then weighs its raw scores instead of all keys
/// alike). Quiet softmax and any other backend compute exactly what Burn's module computes,
/// weights included.
#[derive(Module, Debug)]
pub struct MultiHeadAttention<B: Backend> {
    /// Projection of the queries.
    pub query: Linear<B>,
    /// Projection of the keys.
    pub key: Linear<B>,
    /// Projection of the values.
    pub value: Linear<B>,
    /// Projection of the context back to `d_model`.
    pub output: Linear<B>,
    /// Dropout on the attention scores.
    pub dropout: Dropout,
    /// Activation (kept for record compatibility; Burn's module does not apply it).
    pub activation: Gelu,
    /// The model size.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// The size of each head.
    pub d_k: usize,
    /// The value masked scores take.
    pub min_float: f64,
    /// Use "quiet softmax".
    pub quiet_softmax: bool,
}

/// Inputs of [`MultiHeadAttention::forward`] (as Burn's `MhaInput`).
#[derive(Debug, Clone)]
pub struct MhaInput<B: Backend> {
    query: Tensor<B, 3>,
    key: Tensor<B, 3>,
    value: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
    mask_attn: Option<Tensor<B, 3, Bool>>,
    causal: bool,
}

impl<B: Backend> MhaInput<B> {
    /// Self-attention: `tensor` (`[batch, seq, d_model]`) as queries, keys and values.
    pub fn self_attn(tensor: Tensor<B, 3>) -> Self {
        Self::new(tensor.clone(), tensor.clone(), tensor)
    }

    /// Queries `[batch, seq_1, d_model]`, keys and values `[batch, seq_2, d_model]`.
    pub fn new(query: Tensor<B, 3>, key: Tensor<B, 3>, value: Tensor<B, 3>) -> Self {
        Self {
            query,
            key,
            value,
            mask_pad: None,
            mask_attn: None,
            causal: false,
        }
    }

    /// A padding mask `[batch, seq_2]` (true = masked).
    pub fn mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// An attention mask `[batch, seq_1, seq_2]` (true = masked).
    pub fn mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }

    /// Causal masking: query `i` attends to keys `0..=i` (PyTorch's `is_causal`; for square
    /// scores the mask of Burn's `generate_autoregressive_mask`), combined with any other
    /// mask. Burn's `MhaInput` has no such flag, only the mask tensor, which the fused path
    /// must treat as an arbitrary bias; this flag instead runs cuDNN's causal mode (no mask
    /// tensor, the masked tiles skipped). Paths that run Burn's module pass it the mask.
    pub fn mask_causal(mut self) -> Self {
        self.causal = true;
        self
    }
}

/// Outputs of [`MultiHeadAttention::forward`].
#[derive(Debug, Clone)]
pub struct MhaOutput<B: Backend> {
    /// The attention weights `[batch, heads, seq_1, seq_2]`; `None` on the fused path.
    pub weights: Option<Tensor<B, 4>>,
    /// The context `[batch, seq_1, d_model]`.
    pub context: Tensor<B, 3>,
}

impl MultiHeadAttentionConfig {
    /// A new [`MultiHeadAttention`] (the initialization of Burn's).
    pub fn init<B: Backend>(&self, device: &B::Device) -> MultiHeadAttention<B> {
        let linear = || {
            LinearConfig::new(self.d_model, self.d_model)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        MultiHeadAttention {
            query: linear(),
            key: linear(),
            value: linear(),
            output: linear(),
            dropout: DropoutConfig::new(self.dropout).init(),
            activation: Gelu::new(),
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_k: self.d_model / self.n_heads,
            min_float: self.min_float,
            quiet_softmax: self.quiet_softmax,
        }
    }
}

impl<B: Backend> MultiHeadAttention<B> {
    /// Attention of the queries over the keys and values, then the output projection.
    pub fn forward(&self, input: MhaInput<B>) -> MhaOutput<B> {
        let dropout_active = self.dropout.prob > 0.0 && B::ad_enabled(&input.query.device());
        let s2 = input.key.dims()[1] as i64;
        let fusable = || {
            let d_k = self.d_k as i64;
            storage_type(input.query.dtype()).is_some_and(|dt| ops::sdpa_fusable(dt, d_k, d_k, s2))
        };
        // With dropout only the fused graphs take the attention (they draw and regenerate the
        // mask); Burn's module composes every other case.
        if self.quiet_softmax || (dropout_active && !fusable()) {
            return self.burns(input);
        }
        let dropout = dropout_active.then_some(self.dropout.prob);
        on_our_backend!(B, T => match self.fused::<T>(input.clone(), dropout) {
            Some(context) => MhaOutput { weights: None, context },
            None => self.burns(input),
        }, else self.burns(input))
    }

    /// Projections, fused attention on backend `T` (which is `B`), output projection; with
    /// `dropout` (its probability) `None` when the fused graphs decline it.
    fn fused<T: TrainingOps>(&self, input: MhaInput<B>, dropout: Option<f64>) -> Option<Tensor<B, 3>> {
        let [b, s1, d] = input.query.dims();
        let heads = |x: Tensor<B, 3>,
                     linear: &Linear<B>|
         -> <T as burn_core::tensor::backend::BackendTypes>::FloatTensorPrimitive {
            let s = x.dims()[1];
            let t = linear
                .forward(x)
                .reshape([b, s, self.n_heads, self.d_k])
                .swap_dims(1, 2);
            cast::<B, T, 4>(t).into_primitive().tensor()
        };
        let s2 = input.key.dims()[1];
        let device = input.query.device();
        // cuDNN's causal mode covers square scores; rectangular ones take the mask as a bias.
        let causal = input.causal && s1 == s2;
        let mask_attn = if input.causal && !causal {
            Some(or_causal(input.mask_attn, [b, s1, s2], &device))
        } else {
            input.mask_attn
        };
        let bias = self.mask_bias(input.mask_pad, mask_attn, &input.query, [b, s1, s2]);
        let bias = bias.map(|t| cast::<B, T, 4>(t).into_primitive().tensor());
        let q = heads(input.query, &self.query);
        let k = heads(input.key, &self.key);
        let v = heads(input.value, &self.value);
        let scale = 1.0 / (self.d_k as f64).sqrt();
        let o = match dropout {
            Some(p) => {
                // A fresh Philox seed and offset per call, from the backend's generator (so
                // `B::seed` makes the masks reproducible).
                let rng = Tensor::<B, 1, Int>::random([2], Distribution::Uniform(0.0, 2f64.powi(31)), &device);
                let rng = cast_int::<B, T, 1>(rng).into_primitive();
                T::sdpa_dropout(q, k, v, bias, causal, scale, p, rng)?
            }
            None => T::sdpa(q, k, v, bias, causal, scale),
        };
        let o: Tensor<B, 4> = cast::<T, B, 4>(Tensor::from_primitive(TensorPrimitive::Float(o)));
        // The fused output is stored [batch, seq, heads, d_k]: merging the heads is a view.
        Some(self.output.forward(o.swap_dims(1, 2).reshape([b, s1, d])))
    }

    /// The masks as one additive bias `[batch, 1, seq_1, seq_2]` of `like`'s dtype:
    /// `min_float` where either mask is set, zero elsewhere (`None` without masks).
    fn mask_bias(
        &self,
        mask_pad: Option<Tensor<B, 2, Bool>>,
        mask_attn: Option<Tensor<B, 3, Bool>>,
        like: &Tensor<B, 3>,
        [b, s1, s2]: [usize; 3],
    ) -> Option<Tensor<B, 4>> {
        let pad = mask_pad.map(|m| m.reshape([b, 1, s2]).expand([b, s1, s2]));
        let mask = match (pad, mask_attn) {
            (Some(p), Some(a)) => p.bool_or(a),
            (p, a) => p.or(a)?,
        };
        let zeros = Tensor::<B, 3>::zeros([b, s1, s2], &like.device()).cast(like.dtype());
        Some(zeros.mask_fill(mask, self.min_float).reshape([b, 1, s1, s2]))
    }

    /// Burn's module on the same parameters.
    pub fn to_burn(&self) -> burn_nn::attention::MultiHeadAttention<B> {
        burn_nn::attention::MultiHeadAttention {
            query: initialized_linear(&self.query),
            key: initialized_linear(&self.key),
            value: initialized_linear(&self.value),
            output: initialized_linear(&self.output),
            dropout: self.dropout.clone(),
            activation: self.activation.clone(),
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_k: self.d_k,
            min_float: self.min_float,
            quiet_softmax: self.quiet_softmax,
        }
    }

    /// Burn's own module on the same parameters.
    fn burns(&self, input: MhaInput<B>) -> MhaOutput<B> {
        let module = self.to_burn();
        let [b, s1, _] = input.query.dims();
        let s2 = input.key.dims()[1];
        let mask_attn = if input.causal {
            Some(or_causal(input.mask_attn, [b, s1, s2], &input.query.device()))
        } else {
            input.mask_attn
        };
        let mut burn_input = burn_nn::attention::MhaInput::new(input.query, input.key, input.value);
        if let Some(m) = input.mask_pad {
            burn_input = burn_input.mask_pad(m);
        }
        if let Some(m) = mask_attn {
            burn_input = burn_input.mask_attn(m);
        }
        let out = module.forward(burn_input);
        MhaOutput {
            weights: Some(out.weights),
            context: out.context,
        }
    }
}

/// `mask` (if any) or the causal mask `[batch, seq_1, seq_2]`: key `j` masked for query `i`
/// when `j > i`.
fn or_causal<B: Backend>(
    mask: Option<Tensor<B, 3, Bool>>,
    [b, s1, s2]: [usize; 3],
    device: &B::Device,
) -> Tensor<B, 3, Bool> {
    let query = Tensor::<B, 1, Int>::arange(0..s1 as i64, device)
        .reshape([1, s1, 1])
        .expand([b, s1, s2]);
    let key = Tensor::<B, 1, Int>::arange(0..s2 as i64, device)
        .reshape([1, 1, s2])
        .expand([b, s1, s2]);
    let causal = key.greater(query);
    match mask {
        Some(m) => m.bool_or(causal),
        None => causal,
    }
}

/// A clone of `linear` that shares its parameters' values: a lazily initialized parameter
/// is initialized first (a clone of an uninitialized one would draw its own values).
pub(crate) fn initialized_linear<B: Backend>(linear: &Linear<B>) -> Linear<B> {
    let _ = linear.weight.val();
    if let Some(b) = &linear.bias {
        let _ = b.val();
    }
    linear.clone()
}
