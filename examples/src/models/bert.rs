//! BERT-base (110M) for masked-language-model pretraining, written with stock `burn::nn` as a
//! Burn user writes it: token and learned position embeddings with a layer norm and dropout
//! (no segment embeddings: one-segment inputs), post-norm encoder layers (a layer norm after
//! each residual add, as BERT) with dropout 0.1 (Burn's default) on the attention scores and
//! on both residual branches, padding masks through `MhaInput::mask_pad`, and the MLM head:
//! dense 768→768, GELU, layer norm, then the token embedding itself as the decoder (tied)
//! plus a bias.
//!
//! The loss is the cross-entropy at the masked positions only: their hidden states are
//! gathered before the MLM head (as the original BERT's `gather_indexes`), so the head runs on
//! those alone. Layer norms take BERT's epsilon 1e-12; GELU is the exact (erf) one.

use burn::module::{Initializer, Module, Param};
use burn::nn::{Dropout, DropoutConfig, Embedding, Gelu, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Distribution, Int, Tensor, TensorData};

use super::transformer::{embedding, linear, AttentionMask, Layer, LayerConfig, Norm};
use super::{cross_entropy, TrainModel};

/// The padding token of the synthetic batches.
pub const PAD: i64 = 0;
/// The token that replaces every masked position of the synthetic batches.
pub const MASK: i64 = 1;
/// The first ordinary token: synthetic tokens are uniform over `FIRST_TOKEN..vocab`.
pub const FIRST_TOKEN: i64 = 2;
/// The share of non-pad positions masked (and predicted) in each synthetic batch.
pub const MASK_RATE: f64 = 0.15;

/// The shape of a BERT masked language model.
#[derive(Clone, Debug)]
pub struct BertConfig {
    /// Encoder layers.
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
    /// The shortest synthetic sequence before padding (lengths are uniform over
    /// `min_len..=seq`).
    pub min_len: usize,
    /// Dropout of the embeddings, the attention scores and the residual branches.
    pub dropout: f64,
    /// Burn's own `LayerNorm`, `MultiHeadAttention` and `CrossEntropyLoss` (`true`) or this
    /// crate's drop-ins.
    pub stock: bool,
}

impl BertConfig {
    /// BERT-base: 12 layers, width 768, 12 heads, MLP 3072, vocabulary 30,522, 512 positions,
    /// dropout 0.1; synthetic lengths 384 to 512.
    pub fn bert_base(stock: bool) -> Self {
        Self {
            layers: 12,
            d_model: 768,
            heads: 12,
            d_ff: 3072,
            vocab: 30_522,
            seq: 512,
            min_len: 384,
            dropout: 0.1,
            stock,
        }
    }

    /// A small model of the same structure (2 layers, width 32, 4 heads, vocabulary 128,
    /// 32 positions, lengths 24 to 32, dropout 0.1), for tests.
    pub fn tiny(stock: bool) -> Self {
        Self {
            layers: 2,
            d_model: 32,
            heads: 4,
            d_ff: 128,
            vocab: 128,
            seq: 32,
            min_len: 24,
            dropout: 0.1,
            stock,
        }
    }

    /// The configuration of each layer: post-norm, epsilon 1e-12.
    pub fn layer(&self) -> LayerConfig {
        LayerConfig {
            d_model: self.d_model,
            heads: self.heads,
            d_ff: self.d_ff,
            dropout: self.dropout,
            epsilon: 1e-12,
            pre_norm: false,
            stock: self.stock,
        }
    }

    /// The model with BERT's initialization (normal 0.02, zero biases, layer norms 1/0).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Bert<B> {
        let layer = self.layer();
        let norm = || Norm::new(self.d_model, layer.epsilon, self.stock, device);
        Bert {
            tokens: embedding(self.vocab, self.d_model, device),
            positions: embedding(self.seq, self.d_model, device),
            embedding_norm: norm(),
            dropout: DropoutConfig::new(self.dropout).init(),
            layers: (0..self.layers).map(|_| layer.init(device)).collect(),
            head_dense: linear(self.d_model, self.d_model, device),
            head_gelu: Gelu::new(),
            head_norm: norm(),
            decoder_bias: Initializer::Zeros.init([self.vocab], device),
        }
    }
}

/// A BERT masked language model (see the module docs).
#[derive(Module, Debug)]
pub struct Bert<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    embedding_norm: Norm<B>,
    dropout: Dropout,
    layers: Vec<Layer<B>>,
    head_dense: Linear<B>,
    head_gelu: Gelu,
    head_norm: Norm<B>,
    decoder_bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> Bert<B> {
    /// The encoder's output `[N, S, d_model]` for tokens `[N, S]` with padded positions `pad`
    /// (`[N, S]`, true = padding: masked as keys).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, pad: Tensor<B, 2, Bool>) -> Tensor<B, 3> {
        let s = tokens.dims()[1];
        let positions = Tensor::<B, 1, Int>::arange(0..s as i64, &tokens.device()).reshape([1, s]);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let mut x = self.dropout.forward(self.embedding_norm.forward(x));
        let mask = AttentionMask::padding(pad);
        for layer in &self.layers {
            x = layer.forward(x, &mask);
        }
        x
    }

    /// The MLM head on hidden states `[M, d_model]`: logits `[M, vocab]`.
    pub fn mlm_logits(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = self
            .head_norm
            .forward(self.head_gelu.forward(self.head_dense.forward(hidden)));
        // Tied decoder: the token embedding, transposed, plus its own bias.
        h.matmul(self.tokens.weight.val().transpose()) + self.decoder_bias.val().unsqueeze()
    }
}

/// A masked-language-model batch.
#[derive(Clone, Debug)]
pub struct MlmBatch<B: Backend> {
    /// Input tokens `[N, S]`: padding is [`PAD`], masked positions are [`MASK`].
    pub inputs: Tensor<B, 2, Int>,
    /// Padded positions `[N, S]` (true = padding).
    pub pad: Tensor<B, 2, Bool>,
    /// The masked positions as flat indices into `N·S`, `[M]`.
    pub positions: Tensor<B, 1, Int>,
    /// The original tokens at those positions, `[M]`.
    pub targets: Tensor<B, 1, Int>,
}

impl<B: Backend> TrainModel<B> for Bert<B> {
    type Config = BertConfig;
    type Batch = MlmBatch<B>;
    const UNIT: &'static str = "tokens";

    fn init(config: &Self::Config, device: &B::Device) -> Self {
        config.init(device)
    }

    /// `n` sequences of tokens uniform over `FIRST_TOKEN..vocab`, each of a length uniform over
    /// `min_len..=seq` and padded to `seq`; [`MASK_RATE`] of the non-pad positions (each drawn
    /// independently) are replaced by [`MASK`] and predicted. Drawn on the device; the masked
    /// positions are listed with one read back (`argwhere`), once per batch.
    fn synthetic_batch(config: &Self::Config, n: usize, device: &B::Device) -> Self::Batch {
        let s = config.seq;
        let tokens = Tensor::<B, 2, Int>::random(
            [n, s],
            Distribution::Uniform(FIRST_TOKEN as f64, config.vocab as f64),
            device,
        );
        let lengths = Tensor::<B, 1, Int>::random(
            [n],
            Distribution::Uniform(config.min_len as f64, (s + 1) as f64),
            device,
        );
        let index = Tensor::<B, 1, Int>::arange(0..s as i64, device)
            .reshape([1, s])
            .expand([n, s]);
        let pad = index.greater_equal(lengths.reshape([n, 1]).expand([n, s]));
        let chosen = Tensor::<B, 2>::random([n, s], Distribution::Uniform(0.0, 1.0), device)
            .lower_elem(MASK_RATE)
            .bool_and(pad.clone().bool_not());
        let positions = chosen.clone().reshape([n * s]).argwhere();
        let m = positions.dims()[0];
        assert!(m > 0, "a synthetic MLM batch of {n}×{s} tokens drew no masked position");
        let positions = positions.reshape([m]);
        MlmBatch {
            targets: tokens.clone().reshape([n * s]).select(0, positions.clone()),
            inputs: tokens.mask_fill(pad.clone(), PAD).mask_fill(chosen, MASK),
            pad,
            positions,
        }
    }

    /// Every position of the padded sequence.
    fn units_per_sample(config: &Self::Config) -> usize {
        config.seq
    }

    /// Mean cross-entropy over the masked positions.
    fn loss(&self, batch: &Self::Batch) -> Tensor<B, 1> {
        let h = self.forward(batch.inputs.clone(), batch.pad.clone());
        let [n, s, d] = h.dims();
        let selected = h.reshape([n * s, d]).select(0, batch.positions.clone());
        let logits = self.mlm_logits(selected);
        cross_entropy(logits, batch.targets.clone(), self.head_norm.is_stock())
    }

    fn batch_to_data(batch: &Self::Batch) -> Vec<TensorData> {
        vec![
            batch.inputs.to_data(),
            batch.pad.to_data(),
            batch.positions.to_data(),
            batch.targets.to_data(),
        ]
    }

    fn batch_from_data(data: Vec<TensorData>, device: &B::Device) -> Self::Batch {
        let [inputs, pad, positions, targets] =
            <[TensorData; 4]>::try_from(data).expect("an MLM batch holds four tensors");
        MlmBatch {
            inputs: Tensor::from_data(inputs, device),
            pad: Tensor::from_data(pad, device),
            positions: Tensor::from_data(positions, device),
            targets: Tensor::from_data(targets, device),
        }
    }
}
