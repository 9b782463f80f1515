//! GPT-2 small (124M), written with stock `burn::nn` as a Burn user writes it: learned token
//! and position embeddings, pre-norm decoder layers with causal self-attention (Burn's
//! `generate_autoregressive_mask` through `MhaInput::mask_attn`), a final layer norm, and the
//! logits from the token embedding itself (tied input and output embeddings: `h · Eᵀ`).
//!
//! Dropout is 0, as in GPT-2-style pretraining benchmarks (nanoGPT's and PyTorch's). GELU is
//! the exact (erf) one on both sides; the residual projections keep the plain 0.02
//! initialization (no `1/√(2·layers)` scaling), as `bench/train_models_torch.py` does too.

use burn::module::Module;
use burn::nn::Embedding;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};

use super::transformer::{embedding, AttentionMask, Layer, LayerConfig, Norm};
use super::{cross_entropy, TrainModel};

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
    /// Burn's own `LayerNorm`, `MultiHeadAttention` and `CrossEntropyLoss` (`true`) or this
    /// crate's drop-ins.
    pub stock: bool,
}

impl GptConfig {
    /// GPT-2 small: 12 layers, width 768, 12 heads, MLP 3072, vocabulary 50,257, 1024 positions.
    pub fn gpt2(stock: bool) -> Self {
        Self {
            layers: 12,
            d_model: 768,
            heads: 12,
            d_ff: 3072,
            vocab: 50_257,
            seq: 1024,
            stock,
        }
    }

    /// A small decoder of the same structure (2 layers, width 32, 4 heads, vocabulary 96,
    /// 32 positions), for tests.
    pub fn tiny(stock: bool) -> Self {
        Self {
            layers: 2,
            d_model: 32,
            heads: 4,
            d_ff: 128,
            vocab: 96,
            seq: 32,
            stock,
        }
    }

    /// The configuration of each layer: pre-norm, no dropout, GPT-2's epsilon 1e-5.
    pub fn layer(&self) -> LayerConfig {
        LayerConfig {
            d_model: self.d_model,
            heads: self.heads,
            d_ff: self.d_ff,
            dropout: 0.0,
            epsilon: 1e-5,
            pre_norm: true,
            stock: self.stock,
        }
    }

    /// The decoder with GPT-2's initialization (normal 0.02, zero biases, layer norms 1/0).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt<B> {
        let layer = self.layer();
        Gpt {
            tokens: embedding(self.vocab, self.d_model, device),
            positions: embedding(self.seq, self.d_model, device),
            layers: (0..self.layers).map(|_| layer.init(device)).collect(),
            norm: Norm::new(self.d_model, layer.epsilon, self.stock, device),
        }
    }
}

/// A GPT-2-style decoder (see the module docs).
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    layers: Vec<Layer<B>>,
    norm: Norm<B>,
}

impl<B: Backend> Gpt<B> {
    /// Next-token logits `[N, S, vocab]` of tokens `[N, S]` (S at most the positions).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [n, s] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..s as i64, &device).reshape([1, s]);
        let mut x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let mask = AttentionMask::causal(n, s, &device);
        for layer in &self.layers {
            x = layer.forward(x, &mask);
        }
        let h = self.norm.forward(x);
        let d = h.dims()[2];
        // Tied embeddings: the output projection is the token embedding, transposed.
        let table = self.tokens.weight.val();
        let vocab = table.dims()[0];
        h.reshape([n * s, d]).matmul(table.transpose()).reshape([n, s, vocab])
    }
}

/// Token sequences for next-token prediction.
#[derive(Clone, Debug)]
pub struct TokenBatch<B: Backend> {
    /// Input tokens `[N, S]`.
    pub inputs: Tensor<B, 2, Int>,
    /// The next token of every input position, flattened `[N·S]`.
    pub targets: Tensor<B, 1, Int>,
}

impl<B: Backend> TrainModel<B> for Gpt<B> {
    type Config = GptConfig;
    type Batch = TokenBatch<B>;
    const UNIT: &'static str = "tokens";

    fn init(config: &Self::Config, device: &B::Device) -> Self {
        config.init(device)
    }

    /// `n` sequences of `seq + 1` tokens uniform over the vocabulary: the first `seq` are the
    /// inputs, the last `seq` the targets.
    fn synthetic_batch(config: &Self::Config, n: usize, device: &B::Device) -> Self::Batch {
        let s = config.seq;
        let tokens = Tensor::<B, 2, Int>::random([n, s + 1], Distribution::Uniform(0.0, config.vocab as f64), device);
        TokenBatch {
            inputs: tokens.clone().slice([0..n, 0..s]),
            targets: tokens.slice([0..n, 1..s + 1]).reshape([n * s]),
        }
    }

    fn units_per_sample(config: &Self::Config) -> usize {
        config.seq
    }

    /// Mean next-token cross-entropy over every position.
    fn loss(&self, batch: &Self::Batch) -> Tensor<B, 1> {
        let logits = self.forward(batch.inputs.clone());
        let [n, s, vocab] = logits.dims();
        cross_entropy(
            logits.reshape([n * s, vocab]),
            batch.targets.clone(),
            self.norm.is_stock(),
        )
    }

    fn batch_to_data(batch: &Self::Batch) -> Vec<TensorData> {
        vec![batch.inputs.to_data(), batch.targets.to_data()]
    }

    fn batch_from_data(data: Vec<TensorData>, device: &B::Device) -> Self::Batch {
        let [inputs, targets] = <[TensorData; 2]>::try_from(data).expect("a token batch holds two tensors");
        TokenBatch {
            inputs: Tensor::from_data(inputs, device),
            targets: Tensor::from_data(targets, device),
        }
    }
}
