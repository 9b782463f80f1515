//! The blocks the transformer models (GPT-2, ViT-B/16, BERT-base) share, written with stock
//! `burn::nn` modules as a Burn user writes them. Like ResNet's `Norm`, each block holds
//! either Burn's module (`stock`) or this crate's drop-in of the same config and record
//! (`cudnn_backend::burn::nn::{LayerNorm, MultiHeadAttention}`), so one model definition
//! serves both variants.
//!
//! Initialization follows GPT-2, ViT and BERT: every linear, convolution and embedding weight
//! normal with standard deviation [`INIT_STD`] (0.02), biases zero, layer norms scale 1 and
//! shift 0 (`bench/train_models_torch.py` does the same).

use burn::module::{Initializer, Module};
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::{Dropout, DropoutConfig, Embedding, EmbeddingConfig, Gelu, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// Standard deviation of the normal initialization of every weight matrix and embedding
/// (GPT-2's, ViT's and BERT's `initializer_range`).
pub const INIT_STD: f64 = 0.02;

/// The normal(0, [`INIT_STD`]) initializer.
pub fn normal_init() -> Initializer {
    Initializer::Normal {
        mean: 0.0,
        std: INIT_STD,
    }
}

/// A linear layer `d_in → d_out`: weight normal(0, 0.02), bias zero (Burn's `Linear` draws its
/// bias from the weight's initializer, so the bias is replaced).
pub fn linear<B: Backend>(d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
    let mut layer = LinearConfig::new(d_in, d_out)
        .with_initializer(normal_init())
        .init(device);
    zero_bias(&mut layer, device);
    layer
}

/// An embedding table `[n, d]`, normal(0, 0.02).
pub fn embedding<B: Backend>(n: usize, d: usize, device: &B::Device) -> Embedding<B> {
    EmbeddingConfig::new(n, d).with_initializer(normal_init()).init(device)
}

/// Sets a linear layer's bias to zeros (it keeps having one). Reads the weight's shape
/// without drawing its values (parameters stay lazily initialized).
fn zero_bias<B: Backend>(layer: &mut Linear<B>, device: &B::Device) {
    let d_out = layer.weight.lazy_shape().dims::<2>()[1];
    layer.bias = Some(Initializer::Zeros.init([d_out], device));
}

/// Layer norm over the last dim: Burn's `LayerNorm` (`stock`) or this crate's drop-in, which
/// runs one fused kernel forward and one backward on the cuDNN backends.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    stock: Option<burn::nn::LayerNorm<B>>,
    fused: Option<cudnn_backend::burn::nn::LayerNorm<B>>,
}

impl<B: Backend> Norm<B> {
    /// A layer norm of width `d_model` with `epsilon` (scale 1, shift 0).
    pub fn new(d_model: usize, epsilon: f64, stock: bool, device: &B::Device) -> Self {
        Self {
            stock: stock.then(|| {
                burn::nn::LayerNormConfig::new(d_model)
                    .with_epsilon(epsilon)
                    .init(device)
            }),
            fused: (!stock).then(|| {
                cudnn_backend::burn::nn::LayerNormConfig::new(d_model)
                    .with_epsilon(epsilon)
                    .init(device)
            }),
        }
    }

    /// Whether this is Burn's `LayerNorm` (the model's stock variant).
    pub fn is_stock(&self) -> bool {
        self.stock.is_some()
    }

    /// `x` normalized over its last dim.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match (&self.stock, &self.fused) {
            (_, Some(n)) => n.forward(x),
            (Some(n), None) => n.forward(x),
            (None, None) => unreachable!("a Norm holds one of its two modules"),
        }
    }
}

/// The masks of a self-attention call (true = masked), in the form of `MhaInput`.
#[derive(Clone, Debug)]
pub struct AttentionMask<B: Backend> {
    /// Padded keys `[batch, seq]` (BERT).
    pub pad: Option<Tensor<B, 2, Bool>>,
    /// Masked query-key pairs `[batch, seq, seq]` (GPT-2's causal mask).
    pub attn: Option<Tensor<B, 3, Bool>>,
    /// `attn` is the causal mask: the drop-in attention takes it as its causal flag
    /// (`MhaInput::mask_causal`, cuDNN's causal mode) instead of a mask tensor.
    pub causal: bool,
}

impl<B: Backend> AttentionMask<B> {
    /// No mask (ViT).
    pub fn none() -> Self {
        Self {
            pad: None,
            attn: None,
            causal: false,
        }
    }

    /// The causal mask of `seq` positions, from Burn's `generate_autoregressive_mask`.
    pub fn causal(batch: usize, seq: usize, device: &B::Device) -> Self {
        Self {
            pad: None,
            attn: Some(generate_autoregressive_mask(batch, seq, device)),
            causal: true,
        }
    }

    /// A key padding mask `[batch, seq]`.
    pub fn padding(pad: Tensor<B, 2, Bool>) -> Self {
        Self {
            pad: Some(pad),
            attn: None,
            causal: false,
        }
    }
}

/// Multi-head self-attention: Burn's `MultiHeadAttention` (`stock`) or this crate's drop-in
/// (cuDNN's fused flash attention when there is no mask and no active dropout; Burn's
/// composition otherwise).
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    stock: Option<burn::nn::attention::MultiHeadAttention<B>>,
    fused: Option<cudnn_backend::burn::nn::MultiHeadAttention<B>>,
}

impl<B: Backend> Attention<B> {
    /// Attention of width `d_model` over `heads` heads, `dropout` on the attention scores
    /// (Burn's placement: before the mask and the softmax); projections normal(0, 0.02) with
    /// zero biases.
    pub fn new(d_model: usize, heads: usize, dropout: f64, stock: bool, device: &B::Device) -> Self {
        let mut attention = Self {
            stock: stock.then(|| {
                burn::nn::attention::MultiHeadAttentionConfig::new(d_model, heads)
                    .with_dropout(dropout)
                    .with_initializer(normal_init())
                    .init(device)
            }),
            fused: (!stock).then(|| {
                cudnn_backend::burn::nn::MultiHeadAttentionConfig::new(d_model, heads)
                    .with_dropout(dropout)
                    .with_initializer(normal_init())
                    .init(device)
            }),
        };
        if let Some(m) = &mut attention.stock {
            for l in [&mut m.query, &mut m.key, &mut m.value, &mut m.output] {
                zero_bias(l, device);
            }
        }
        if let Some(m) = &mut attention.fused {
            for l in [&mut m.query, &mut m.key, &mut m.value, &mut m.output] {
                zero_bias(l, device);
            }
        }
        attention
    }

    /// Self-attention of `x` (`[batch, seq, d_model]`) under `mask`, output projection included.
    pub fn forward(&self, x: Tensor<B, 3>, mask: &AttentionMask<B>) -> Tensor<B, 3> {
        match (&self.stock, &self.fused) {
            (_, Some(m)) => {
                let mut input = cudnn_backend::burn::nn::MhaInput::self_attn(x);
                if let Some(pad) = &mask.pad {
                    input = input.mask_pad(pad.clone());
                }
                if mask.causal {
                    input = input.mask_causal();
                } else if let Some(attn) = &mask.attn {
                    input = input.mask_attn(attn.clone());
                }
                m.forward(input).context
            }
            (Some(m), None) => {
                let mut input = burn::nn::attention::MhaInput::self_attn(x);
                if let Some(pad) = &mask.pad {
                    input = input.mask_pad(pad.clone());
                }
                if let Some(attn) = &mask.attn {
                    input = input.mask_attn(attn.clone());
                }
                m.forward(input).context
            }
            (None, None) => unreachable!("an Attention holds one of its two modules"),
        }
    }
}

/// The position-wise MLP: `d_model → d_ff`, GELU (exact, erf), `d_ff → d_model`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    gelu: Gelu,
    fc2: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// The MLP of widths `d_model` and `d_ff`.
    pub fn new(d_model: usize, d_ff: usize, device: &B::Device) -> Self {
        Self {
            fc1: linear(d_model, d_ff, device),
            gelu: Gelu::new(),
            fc2: linear(d_ff, d_model, device),
        }
    }

    /// `fc2(gelu(fc1(x)))`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.fc2.forward(self.gelu.forward(self.fc1.forward(x)))
    }
}

/// The shape of one transformer layer.
#[derive(Clone, Debug)]
pub struct LayerConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Dropout on the attention scores and on both residual branches (BERT: 0.1).
    pub dropout: f64,
    /// The layer norms' epsilon.
    pub epsilon: f64,
    /// Pre-norm (GPT-2, ViT: `x + f(norm(x))`) or post-norm (BERT: `norm(x + f(x))`).
    pub pre_norm: bool,
    /// Burn's own `LayerNorm` and `MultiHeadAttention` (`true`) or this crate's drop-ins.
    pub stock: bool,
}

impl LayerConfig {
    /// A layer with the initialization of [`INIT_STD`].
    pub fn init<B: Backend>(&self, device: &B::Device) -> Layer<B> {
        Layer {
            attention: Attention::new(self.d_model, self.heads, self.dropout, self.stock, device),
            norm1: Norm::new(self.d_model, self.epsilon, self.stock, device),
            mlp: Mlp::new(self.d_model, self.d_ff, device),
            norm2: Norm::new(self.d_model, self.epsilon, self.stock, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            pre_norm: self.pre_norm,
        }
    }
}

/// One transformer layer: self-attention and MLP, each a residual branch with dropout, layer
/// norms before (pre-norm) or after (post-norm) each residual add.
#[derive(Module, Debug)]
pub struct Layer<B: Backend> {
    attention: Attention<B>,
    norm1: Norm<B>,
    mlp: Mlp<B>,
    norm2: Norm<B>,
    dropout: Dropout,
    pre_norm: bool,
}

impl<B: Backend> Layer<B> {
    /// The layer on `x` (`[batch, seq, d_model]`) under `mask`.
    pub fn forward(&self, x: Tensor<B, 3>, mask: &AttentionMask<B>) -> Tensor<B, 3> {
        if self.pre_norm {
            let x = x.clone()
                + self
                    .dropout
                    .forward(self.attention.forward(self.norm1.forward(x), mask));
            x.clone() + self.dropout.forward(self.mlp.forward(self.norm2.forward(x)))
        } else {
            let x = self
                .norm1
                .forward(x.clone() + self.dropout.forward(self.attention.forward(x, mask)));
            self.norm2
                .forward(x.clone() + self.dropout.forward(self.mlp.forward(x)))
        }
    }
}
