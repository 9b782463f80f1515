//! GPT-2 small (124M) written with Candle, as [`crate::models::gpt`] is with Burn: learned
//! token and position embeddings, pre-norm decoder layers with causal self-attention (separate
//! query, key, value and output projections, as `burn::nn`'s attention), an MLP with exact
//! (erf) GELU, a final layer norm, and the logits from the token embedding itself (tied input
//! and output embeddings: `h · Eᵀ`). Dropout 0; weights and embeddings normal(0, 0.02), biases
//! zero, layer norms 1/0 (epsilon 1e-5), as `bench/train_models_torch.py`.
//!
//! The default variant runs this crate's Candle layers and ops: `nn::Embedding` (its gradient
//! one scatter-add on CUDA), `nn::LayerNorm` (fused forward and backward kernels), `nn::Linear`
//! (bias, and GELU in the MLP's first layer, fused into the matmul graph), causal attention as
//! `ops::sdpa_heads` on the projections as they come (cuDNN's fused flash attention forward and
//! backward for f16/bf16, the mask computed inside the kernel; for f32 the engine's math path)
//! the tied output projection on `ops::matmul` (the table read transposed through its
//! strides), and the loss as `ops::cross_entropy` on the logits in the model's dtype.
//! `stock` runs candle-nn's `Embedding` and `Linear`, its composed layer norm
//! (`ops::layer_norm_slow`: candle-nn's fused one has no backward pass), attention from
//! Candle's matmul, an additive causal mask and candle-nn's softmax, and candle-nn's
//! `loss::cross_entropy` on f32 logits.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};
use cudnn_backend::candle::nn as ours;
use cudnn_backend::candle::Activation;

use super::layers::{Dense, Norm};
use super::{uniform_labels, Batch, CandleModel};

/// Standard deviation of the normal initialization of every weight matrix and embedding.
pub const INIT_STD: f64 = 0.02;

/// Layer norm epsilon (GPT-2's).
const LN_EPS: f64 = 1e-5;

/// The shape of a GPT-2-style decoder.
#[derive(Clone, Debug)]
pub struct GptConfig {
    /// Decoder layers.
    pub layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Sequence length (and number of learned positions).
    pub seq: usize,
}

impl GptConfig {
    /// GPT-2 small: 12 layers, width 768, 12 heads, MLP 3072, vocabulary 50,257, 1024 positions.
    pub fn gpt2() -> Self {
        Self {
            layers: 12,
            d_model: 768,
            heads: 12,
            d_ff: 3072,
            vocab: 50_257,
            seq: 1024,
        }
    }

    /// A small decoder of the same structure (2 layers, width 32, 4 heads, vocabulary 96, 32
    /// positions), for tests: [`crate::models::gpt::GptConfig::tiny`].
    pub fn tiny() -> Self {
        Self {
            layers: 2,
            d_model: 32,
            heads: 4,
            d_ff: 128,
            vocab: 96,
            seq: 32,
        }
    }
}

/// The normal(0, [`INIT_STD`]) initializer.
fn normal() -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: INIT_STD,
    }
}

/// A linear layer of GPT-2's initialization (weight normal(0, 0.02), bias zero).
fn dense(d_in: usize, d_out: usize, act: Activation, stock: bool, vb: VarBuilder) -> Result<Dense> {
    Ok(Dense {
        weight: vb.get_with_hints((d_out, d_in), "weight", normal())?,
        bias: vb.get_with_hints(d_out, "bias", Init::Const(0.0))?,
        act,
        stock,
    })
}

/// Layer norm over the model width (scale 1, shift 0).
fn norm(d: usize, stock: bool, vb: VarBuilder) -> Result<Norm> {
    Ok(Norm {
        weight: vb.get_with_hints(d, "weight", Init::Const(1.0))?,
        bias: vb.get_with_hints(d, "bias", Init::Const(0.0))?,
        eps: LN_EPS,
        stock,
    })
}

/// One pre-norm decoder layer: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`.
#[derive(Clone, Debug)]
struct Layer {
    norm1: Norm,
    query: Dense,
    key: Dense,
    value: Dense,
    output: Dense,
    norm2: Norm,
    fc1: Dense,
    fc2: Dense,
    heads: usize,
}

impl Layer {
    fn new(config: &GptConfig, stock: bool, vb: VarBuilder) -> Result<Self> {
        let d = config.d_model;
        let dense = |d_in, d_out, act, name: &str| dense(d_in, d_out, act, stock, vb.pp(name));
        Ok(Self {
            norm1: norm(d, stock, vb.pp("norm1"))?,
            query: dense(d, d, Activation::Identity, "attn.query")?,
            key: dense(d, d, Activation::Identity, "attn.key")?,
            value: dense(d, d, Activation::Identity, "attn.value")?,
            output: dense(d, d, Activation::Identity, "attn.output")?,
            norm2: norm(d, stock, vb.pp("norm2"))?,
            fc1: dense(d, config.d_ff, Activation::Gelu, "mlp.fc1")?,
            fc2: dense(config.d_ff, d, Activation::Identity, "mlp.fc2")?,
            heads: config.heads,
        })
    }

    /// Causal multi-head self-attention of `x` `(batch, seq, d_model)`, output projection
    /// included; `mask` is the stock variant's additive causal mask `(seq, seq)`.
    fn attention(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, s, d) = x.dims3()?;
        let (h, dh) = (self.heads, d / self.heads);
        let scale = 1.0 / (dh as f64).sqrt();
        let (q, k, v) = (self.query.forward(x)?, self.key.forward(x)?, self.value.forward(x)?);
        let o = match mask {
            Some(mask) => {
                // (batch, seq, d_model) → (batch, heads, seq, head dim) and back.
                let split = |t: Tensor| t.reshape((b, s, h, dh))?.transpose(1, 2)?.contiguous();
                let (q, k, v) = (split(q)?, split(k)?, split(v)?);
                let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
                let o = candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v)?;
                o.transpose(1, 2)?.reshape((b, s, d))?
            }
            // The heads stay side by side in the projections' last dim, in both passes.
            None => cudnn_backend::candle::ops::sdpa_heads(&q, &k, &v, h, scale, true)?,
        };
        self.output.forward(&o)
    }

    fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let x = (x + self.attention(&self.norm1.forward(x)?, mask)?)?;
        let mlp = self.fc2.forward(&self.fc1.forward(&self.norm2.forward(&x)?)?)?;
        x + mlp
    }
}

/// A GPT-2-style decoder (see the module docs).
#[derive(Clone, Debug)]
pub struct Gpt {
    tokens: Tensor,
    positions: Tensor,
    layers: Vec<Layer>,
    norm: Norm,
    /// The stock variant's additive causal mask `(seq, seq)`: 0 on and below the diagonal,
    /// -inf above, in the variables' dtype.
    mask: Option<Tensor>,
    stock: bool,
}

impl Gpt {
    /// The decoder of `config` with GPT-2's initialization, its variables from `vb`; `stock`
    /// as the module docs say.
    pub fn new(config: &GptConfig, stock: bool, vb: VarBuilder) -> Result<Self> {
        let (d, s) = (config.d_model, config.seq);
        if config.heads == 0 || !d.is_multiple_of(config.heads) {
            let msg = format!("width {d} is not a multiple of {} heads", config.heads);
            return Err(candle_core::Error::Msg(msg));
        }
        let mask = if stock {
            let bias: Vec<f32> = (0..s * s)
                .map(|e| if e % s > e / s { f32::NEG_INFINITY } else { 0.0 })
                .collect();
            Some(Tensor::from_vec(bias, (s, s), vb.device())?.to_dtype(vb.dtype())?)
        } else {
            None
        };
        Ok(Self {
            tokens: vb.get_with_hints((config.vocab, d), "tokens.weight", normal())?,
            positions: vb.get_with_hints((s, d), "positions.weight", normal())?,
            layers: (0..config.layers)
                .map(|i| Layer::new(config, stock, vb.pp(format!("layers.{i}"))))
                .collect::<Result<_>>()?,
            norm: norm(d, stock, vb.pp("norm"))?,
            mask,
            stock,
        })
    }

    /// Next-token logits `(N, S, vocab)` in f32 of tokens `(N, S)` (u32; S at most the
    /// positions).
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let (n, s) = tokens.dims2()?;
        let logits = self.logits(tokens)?;
        let vocab = logits.dim(1)?;
        logits.reshape((n, s, vocab))?.to_dtype(DType::F32)
    }

    /// Next-token logits `(N * S, vocab)` in the model's dtype.
    fn logits(&self, tokens: &Tensor) -> Result<Tensor> {
        let (n, s) = tokens.dims2()?;
        let (_, d) = self.tokens.dims2()?;
        let x = if self.stock {
            candle_nn::Embedding::new(self.tokens.clone(), d).forward(tokens)?
        } else {
            ours::Embedding::new(self.tokens.clone(), d).forward(tokens)?
        };
        let mut x = x.broadcast_add(&self.positions.narrow(0, 0, s)?.unsqueeze(0)?)?;
        let mask = match &self.mask {
            Some(m) => Some(m.narrow(0, 0, s)?.narrow(1, 0, s)?),
            None => None,
        };
        for layer in &self.layers {
            x = layer.forward(&x, mask.as_ref())?;
        }
        let h = self.norm.forward(&x)?.reshape((n * s, d))?;
        // Tied embeddings: the output projection is the token embedding, transposed.
        let table = self.tokens.t()?;
        if self.stock {
            h.matmul(&table)
        } else {
            cudnn_backend::candle::ops::matmul(&h, &table)
        }
    }
}

impl CandleModel for Gpt {
    type Config = GptConfig;
    const UNIT: &'static str = "tokens";
    const BATCH: usize = 8;
    const LR: f64 = 1e-4;
    const WEIGHT_DECAY: f64 = 0.01;

    fn new(config: &Self::Config, stock: bool, vb: VarBuilder) -> Result<Self> {
        Gpt::new(config, stock, vb)
    }

    /// `n` sequences of `seq + 1` tokens uniform over the vocabulary: the first `seq` are the
    /// inputs, the last `seq` (flattened) the targets.
    fn synthetic_batch(config: &Self::Config, n: usize, _: DType, device: &Device) -> Result<Batch> {
        let s = config.seq;
        let tokens = uniform_labels(&[n, s + 1], config.vocab, device)?;
        Ok(Batch {
            inputs: tokens.narrow(1, 0, s)?.contiguous()?,
            targets: tokens.narrow(1, 1, s)?.contiguous()?.flatten_all()?,
        })
    }

    fn units_per_sample(config: &Self::Config) -> usize {
        config.seq
    }

    /// Mean next-token cross-entropy over every position: candle-nn's (log-softmax, gather,
    /// mean) on f32 logits for `stock`, else this crate's fused loss on the logits as they
    /// are (f32 accumulation inside), as PyTorch's `F.cross_entropy` on bf16 logits.
    fn loss(&self, batch: &Batch) -> Result<Tensor> {
        let logits = self.logits(&batch.inputs)?;
        if self.stock {
            candle_nn::loss::cross_entropy(&logits.to_dtype(DType::F32)?, &batch.targets)
        } else {
            cudnn_backend::candle::ops::cross_entropy(&logits, &batch.targets)?.to_dtype(DType::F32)
        }
    }
}
