//! Drop-ins for `burn::nn::transformer::{TransformerEncoder, TransformerDecoder}`: the same
//! configs, fields and records, built from this crate's [`MultiHeadAttention`] and
//! [`LayerNorm`] (fused attention with masks and dropout, fused layer norms) and Burn's
//! position-wise feed-forward. Autoregressive inference runs Burn's own modules on the same
//! parameters, with Burn's caches.

use burn_core as burn;
use burn_core::config::Config;
use burn_core::module::{Initializer, Module};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{Bool, Tensor};
use burn_nn::activation::ActivationConfig;
use burn_nn::transformer::{
    PositionWiseFeedForward, PositionWiseFeedForwardConfig, TransformerDecoderAutoregressiveCache,
    TransformerEncoderAutoregressiveCache,
};
use burn_nn::{Dropout, DropoutConfig};

use super::attention::{initialized_linear, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use super::norm::{LayerNorm, LayerNormConfig};

/// Configuration of [`TransformerEncoder`] (the fields and defaults of
/// `burn::nn::transformer::TransformerEncoderConfig`).
#[derive(Config, Debug)]
pub struct TransformerEncoderConfig {
    /// The model size.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// Dropout on the attention scores and the residual branches. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Layer norm before each sub-layer (pre-norm) instead of after. Default: false.
    #[config(default = false)]
    pub norm_first: bool,
    /// "Quiet softmax" in the attention. Default: false.
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// Initializer of the linear layers (Burn's default: Kaiming uniform, gain 1/√3).
    #[config(default = "Initializer::KaimingUniform{gain: 0.577_350_269_189_625_8, fan_out_only: false}")]
    pub initializer: Initializer,
    /// The feed-forward activation. Default: GELU.
    #[config(default = "ActivationConfig::Gelu")]
    pub activation: ActivationConfig,
    /// The layer norms' epsilon. Default: 1e-5.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
}

/// Configuration of [`TransformerDecoder`] (the fields and defaults of
/// `burn::nn::transformer::TransformerDecoderConfig`).
#[derive(Config, Debug)]
pub struct TransformerDecoderConfig {
    /// The model size.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// Dropout on the attention scores and the residual branches. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Layer norm before each sub-layer (pre-norm) instead of after. Default: false.
    #[config(default = false)]
    pub norm_first: bool,
    /// "Quiet softmax" in the attention. Default: false.
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// Initializer of the linear layers (Burn's default: Kaiming uniform, gain 1/√3).
    #[config(default = "Initializer::KaimingUniform{gain: 0.577_350_269_189_625_8, fan_out_only: false}")]
    pub initializer: Initializer,
    /// The feed-forward activation. Default: GELU.
    #[config(default = "ActivationConfig::Gelu")]
    pub activation: ActivationConfig,
    /// The layer norms' epsilon. Default: 1e-5.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
}

/// The sub-modules every layer builds the same way, from either config's fields.
struct LayerParts<'a> {
    d_model: usize,
    d_ff: usize,
    n_heads: usize,
    dropout: f64,
    quiet_softmax: bool,
    initializer: &'a Initializer,
    activation: &'a ActivationConfig,
    layer_norm_eps: f64,
}

impl LayerParts<'_> {
    fn mha<B: Backend>(&self, device: &B::Device) -> MultiHeadAttention<B> {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_initializer(self.initializer.clone())
            .with_dropout(self.dropout)
            .with_quiet_softmax(self.quiet_softmax)
            .init(device)
    }

    fn norm<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        LayerNormConfig::new(self.d_model)
            .with_epsilon(self.layer_norm_eps)
            .init(device)
    }

    fn pwff<B: Backend>(&self, device: &B::Device) -> PositionWiseFeedForward<B> {
        PositionWiseFeedForwardConfig::new(self.d_model, self.d_ff)
            .with_initializer(self.initializer.clone())
            .with_dropout(self.dropout)
            .with_activation(self.activation.clone())
            .init(device)
    }
}

/// A transformer encoder, a drop-in for `burn::nn::transformer::TransformerEncoder` (same
/// fields, so records load both ways).
#[derive(Module, Debug)]
pub struct TransformerEncoder<B: Backend> {
    /// The layers.
    pub layers: Vec<TransformerEncoderLayer<B>>,
    /// The model size.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// The dropout rate.
    pub dropout: f64,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
    /// "Quiet softmax" in the attention.
    pub quiet_softmax: bool,
}

/// One encoder layer (the fields of `burn::nn::transformer::TransformerEncoderLayer`).
#[derive(Module, Debug)]
pub struct TransformerEncoderLayer<B: Backend> {
    /// Self-attention.
    pub mha: MultiHeadAttention<B>,
    /// Position-wise feed-forward network.
    pub pwff: PositionWiseFeedForward<B>,
    /// The norm around the feed-forward branch.
    pub norm_1: LayerNorm<B>,
    /// The norm around the attention branch.
    pub norm_2: LayerNorm<B>,
    /// Dropout on the residual branches.
    pub dropout: Dropout,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
}

/// Input of [`TransformerEncoder::forward`] (as Burn's `TransformerEncoderInput`).
#[derive(Debug, Clone)]
pub struct TransformerEncoderInput<B: Backend> {
    tensor: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
    mask_attn: Option<Tensor<B, 3, Bool>>,
}

impl<B: Backend> TransformerEncoderInput<B> {
    /// The sequence `[batch, seq, d_model]`.
    pub fn new(tensor: Tensor<B, 3>) -> Self {
        Self {
            tensor,
            mask_pad: None,
            mask_attn: None,
        }
    }

    /// A padding mask `[batch, seq]` (true = masked).
    pub fn mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// An attention mask `[batch, seq, seq]` (true = masked).
    pub fn mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }

    fn to_burn(&self) -> burn_nn::transformer::TransformerEncoderInput<B> {
        let mut input = burn_nn::transformer::TransformerEncoderInput::new(self.tensor.clone());
        if let Some(m) = &self.mask_pad {
            input = input.mask_pad(m.clone());
        }
        if let Some(m) = &self.mask_attn {
            input = input.mask_attn(m.clone());
        }
        input
    }
}

impl TransformerEncoderConfig {
    fn parts(&self) -> LayerParts<'_> {
        LayerParts {
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            dropout: self.dropout,
            quiet_softmax: self.quiet_softmax,
            initializer: &self.initializer,
            activation: &self.activation,
            layer_norm_eps: self.layer_norm_eps,
        }
    }

    /// A new [`TransformerEncoder`] (the initialization of Burn's).
    pub fn init<B: Backend>(&self, device: &B::Device) -> TransformerEncoder<B> {
        let parts = self.parts();
        let layers = (0..self.n_layers)
            .map(|_| TransformerEncoderLayer {
                mha: parts.mha(device),
                pwff: parts.pwff(device),
                norm_1: parts.norm(device),
                norm_2: parts.norm(device),
                dropout: DropoutConfig::new(self.dropout).init(),
                norm_first: self.norm_first,
            })
            .collect();
        TransformerEncoder {
            layers,
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            n_layers: self.n_layers,
            dropout: self.dropout,
            norm_first: self.norm_first,
            quiet_softmax: self.quiet_softmax,
        }
    }
}

/// `x + dropout(branch)`.
fn residual<B: Backend>(x: Tensor<B, 3>, branch: Tensor<B, 3>, dropout: &Dropout) -> Tensor<B, 3> {
    x + dropout.forward(branch)
}

/// Self-attention input of `x` with the masks, if any.
fn attention_input<B: Backend>(
    query: Tensor<B, 3>,
    memory: Option<&Tensor<B, 3>>,
    mask_pad: Option<&Tensor<B, 2, Bool>>,
    mask_attn: Option<&Tensor<B, 3, Bool>>,
) -> MhaInput<B> {
    let mut input = match memory {
        Some(m) => MhaInput::new(query, m.clone(), m.clone()),
        None => MhaInput::self_attn(query),
    };
    if let Some(m) = mask_pad {
        input = input.mask_pad(m.clone());
    }
    if let Some(m) = mask_attn {
        input = input.mask_attn(m.clone());
    }
    input
}

impl<B: Backend> TransformerEncoderLayer<B> {
    /// One layer: attention and feed-forward branches, each with its norm and dropout.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
        mask_attn: Option<Tensor<B, 3, Bool>>,
    ) -> Tensor<B, 3> {
        let branch_in = if self.norm_first {
            self.norm_2.forward(x.clone())
        } else {
            x.clone()
        };
        let input = attention_input(branch_in, None, mask_pad.as_ref(), mask_attn.as_ref());
        let mut x = residual(x, self.mha.forward(input).context, &self.dropout);
        let branch_in = if self.norm_first {
            self.norm_1.forward(x.clone())
        } else {
            x = self.norm_1.forward(x);
            x.clone()
        };
        let x = residual(x, self.pwff.forward(branch_in), &self.dropout);
        if self.norm_first {
            x
        } else {
            self.norm_2.forward(x)
        }
    }

    fn to_burn(&self) -> burn_nn::transformer::TransformerEncoderLayer<B> {
        burn_nn::transformer::TransformerEncoderLayer {
            mha: self.mha.to_burn(),
            pwff: initialized_pwff(&self.pwff),
            norm_1: self.norm_1.to_burn(),
            norm_2: self.norm_2.to_burn(),
            dropout: self.dropout.clone(),
            norm_first: self.norm_first,
        }
    }
}

impl<B: Backend> TransformerEncoder<B> {
    /// The encoder over `[batch, seq, d_model]`.
    pub fn forward(&self, input: TransformerEncoderInput<B>) -> Tensor<B, 3> {
        self.layers.iter().fold(input.tensor, |x, layer| {
            layer.forward(x, input.mask_pad.clone(), input.mask_attn.clone())
        })
    }

    /// Autoregressive inference with Burn's cache: Burn's module on the same parameters.
    pub fn forward_autoregressive_inference(
        &self,
        input: TransformerEncoderInput<B>,
        cache: &mut TransformerEncoderAutoregressiveCache<B>,
    ) -> Tensor<B, 3> {
        self.to_burn().forward_autoregressive_inference(input.to_burn(), cache)
    }

    /// An empty autoregressive cache (Burn's).
    pub fn new_autoregressive_cache(&self) -> TransformerEncoderAutoregressiveCache<B> {
        self.to_burn().new_autoregressive_cache()
    }

    /// Burn's module on the same parameters.
    pub fn to_burn(&self) -> burn_nn::transformer::TransformerEncoder<B> {
        burn_nn::transformer::TransformerEncoder {
            layers: self.layers.iter().map(TransformerEncoderLayer::to_burn).collect(),
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            n_layers: self.n_layers,
            dropout: self.dropout,
            norm_first: self.norm_first,
            quiet_softmax: self.quiet_softmax,
        }
    }
}

/// A transformer decoder, a drop-in for `burn::nn::transformer::TransformerDecoder` (same
/// fields, so records load both ways).
#[derive(Module, Debug)]
pub struct TransformerDecoder<B: Backend> {
    /// The layers.
    pub layers: Vec<TransformerDecoderLayer<B>>,
    /// The model size.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// The dropout rate.
    pub dropout: f64,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
    /// "Quiet softmax" in the attention.
    pub quiet_softmax: bool,
}

/// One decoder layer (the fields of `burn::nn::transformer::TransformerDecoderLayer`).
#[derive(Module, Debug)]
pub struct TransformerDecoderLayer<B: Backend> {
    /// Attention over the encoder's output.
    pub cross_attn: MultiHeadAttention<B>,
    /// Self-attention.
    pub self_attn: MultiHeadAttention<B>,
    /// Position-wise feed-forward network.
    pub pwff: PositionWiseFeedForward<B>,
    /// The norm around the cross-attention branch.
    pub norm_1: LayerNorm<B>,
    /// The norm around the feed-forward branch.
    pub norm_2: LayerNorm<B>,
    /// The norm around the self-attention branch.
    pub norm_3: LayerNorm<B>,
    /// Dropout on the residual branches.
    pub dropout: Dropout,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
}

/// Input of [`TransformerDecoder::forward`] (as Burn's `TransformerDecoderInput`).
#[derive(Debug, Clone)]
pub struct TransformerDecoderInput<B: Backend> {
    target: Tensor<B, 3>,
    target_mask_pad: Option<Tensor<B, 2, Bool>>,
    target_mask_attn: Option<Tensor<B, 3, Bool>>,
    memory: Tensor<B, 3>,
    memory_mask_pad: Option<Tensor<B, 2, Bool>>,
    memory_mask_attn: Option<Tensor<B, 3, Bool>>,
}

impl<B: Backend> TransformerDecoderInput<B> {
    /// The target sequence and the encoder's output, `[batch, seq, d_model]` each.
    pub fn new(target: Tensor<B, 3>, memory: Tensor<B, 3>) -> Self {
        Self {
            target,
            target_mask_pad: None,
            target_mask_attn: None,
            memory,
            memory_mask_pad: None,
            memory_mask_attn: None,
        }
    }

    /// A padding mask of the memory `[batch, seq_memory]` (true = masked).
    pub fn memory_mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.memory_mask_pad = Some(mask_pad);
        self
    }

    /// An attention mask over the memory `[batch, seq, seq_memory]` (true = masked).
    pub fn memory_mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.memory_mask_attn = Some(mask_attn);
        self
    }

    /// A padding mask of the target `[batch, seq]` (true = masked).
    pub fn target_mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.target_mask_pad = Some(mask_pad);
        self
    }

    /// An attention mask over the target `[batch, seq, seq]` (true = masked).
    pub fn target_mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.target_mask_attn = Some(mask_attn);
        self
    }

    fn to_burn(&self) -> burn_nn::transformer::TransformerDecoderInput<B> {
        let mut input = burn_nn::transformer::TransformerDecoderInput::new(self.target.clone(), self.memory.clone());
        if let Some(m) = &self.target_mask_pad {
            input = input.target_mask_pad(m.clone());
        }
        if let Some(m) = &self.target_mask_attn {
            input = input.target_mask_attn(m.clone());
        }
        if let Some(m) = &self.memory_mask_pad {
            input = input.memory_mask_pad(m.clone());
        }
        if let Some(m) = &self.memory_mask_attn {
            input = input.memory_mask_attn(m.clone());
        }
        input
    }
}

impl TransformerDecoderConfig {
    fn parts(&self) -> LayerParts<'_> {
        LayerParts {
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            dropout: self.dropout,
            quiet_softmax: self.quiet_softmax,
            initializer: &self.initializer,
            activation: &self.activation,
            layer_norm_eps: self.layer_norm_eps,
        }
    }

    /// A new [`TransformerDecoder`] (the initialization of Burn's).
    pub fn init<B: Backend>(&self, device: &B::Device) -> TransformerDecoder<B> {
        let parts = self.parts();
        let layers = (0..self.n_layers)
            .map(|_| {
                // Burn's order: self-attention, cross-attention, norms, feed-forward.
                let self_attn = parts.mha(device);
                let cross_attn = parts.mha(device);
                let (norm_1, norm_2, norm_3) = (parts.norm(device), parts.norm(device), parts.norm(device));
                TransformerDecoderLayer {
                    cross_attn,
                    self_attn,
                    pwff: parts.pwff(device),
                    norm_1,
                    norm_2,
                    norm_3,
                    dropout: DropoutConfig::new(self.dropout).init(),
                    norm_first: self.norm_first,
                }
            })
            .collect();
        TransformerDecoder {
            layers,
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            n_layers: self.n_layers,
            dropout: self.dropout,
            norm_first: self.norm_first,
            quiet_softmax: self.quiet_softmax,
        }
    }
}

impl<B: Backend> TransformerDecoderLayer<B> {
    /// One layer: self-attention, cross-attention and feed-forward branches, each with its
    /// norm and dropout; returns the input with the new target.
    pub fn forward(&self, mut input: TransformerDecoderInput<B>) -> TransformerDecoderInput<B> {
        let x = input.target.clone();
        let branch_in = if self.norm_first {
            self.norm_3.forward(x.clone())
        } else {
            x.clone()
        };
        let attn = attention_input(
            branch_in,
            None,
            input.target_mask_pad.as_ref(),
            input.target_mask_attn.as_ref(),
        );
        let mut x = residual(x, self.self_attn.forward(attn).context, &self.dropout);
        let branch_in = if self.norm_first {
            self.norm_1.forward(x.clone())
        } else {
            x = self.norm_1.forward(x);
            x.clone()
        };
        let attn = attention_input(
            branch_in,
            Some(&input.memory),
            input.memory_mask_pad.as_ref(),
            input.memory_mask_attn.as_ref(),
        );
        let mut x = residual(x, self.cross_attn.forward(attn).context, &self.dropout);
        let branch_in = if self.norm_first {
            self.norm_2.forward(x.clone())
        } else {
            x = self.norm_2.forward(x);
            x.clone()
        };
        let x = residual(x, self.pwff.forward(branch_in), &self.dropout);
        input.target = if self.norm_first { x } else { self.norm_3.forward(x) };
        input
    }

    fn to_burn(&self) -> burn_nn::transformer::TransformerDecoderLayer<B> {
        burn_nn::transformer::TransformerDecoderLayer {
            cross_attn: self.cross_attn.to_burn(),
            self_attn: self.self_attn.to_burn(),
            pwff: initialized_pwff(&self.pwff),
            norm_1: self.norm_1.to_burn(),
            norm_2: self.norm_2.to_burn(),
            norm_3: self.norm_3.to_burn(),
            dropout: self.dropout.clone(),
            norm_first: self.norm_first,
        }
    }
}

impl<B: Backend> TransformerDecoder<B> {
    /// The decoder: the target `[batch, seq, d_model]` attending to itself and the memory.
    pub fn forward(&self, input: TransformerDecoderInput<B>) -> Tensor<B, 3> {
        self.layers
            .iter()
            .fold(input, |input, layer| layer.forward(input))
            .target
    }

    /// Autoregressive inference with Burn's cache: Burn's module on the same parameters.
    pub fn forward_autoregressive_inference(
        &self,
        input: TransformerDecoderInput<B>,
        cache: &mut TransformerDecoderAutoregressiveCache<B>,
    ) -> Tensor<B, 3> {
        self.to_burn().forward_autoregressive_inference(input.to_burn(), cache)
    }

    /// An empty autoregressive cache (Burn's).
    pub fn new_autoregressive_cache(&self) -> TransformerDecoderAutoregressiveCache<B> {
        self.to_burn().new_autoregressive_cache()
    }

    /// Burn's module on the same parameters.
    pub fn to_burn(&self) -> burn_nn::transformer::TransformerDecoder<B> {
        burn_nn::transformer::TransformerDecoder {
            layers: self.layers.iter().map(TransformerDecoderLayer::to_burn).collect(),
            d_model: self.d_model,
            d_ff: self.d_ff,
            n_heads: self.n_heads,
            n_layers: self.n_layers,
            dropout: self.dropout,
            norm_first: self.norm_first,
            quiet_softmax: self.quiet_softmax,
        }
    }
}

/// A clone of `pwff` sharing its parameters' values (see [`initialized_linear`]).
fn initialized_pwff<B: Backend>(pwff: &PositionWiseFeedForward<B>) -> PositionWiseFeedForward<B> {
    PositionWiseFeedForward {
        linear_inner: initialized_linear(&pwff.linear_inner),
        linear_outer: initialized_linear(&pwff.linear_outer),
        ..pwff.clone()
    }
}
