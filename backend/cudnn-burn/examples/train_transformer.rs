//! Trains a transformer encoder classifier written with stock `burn::nn` (token and position
//! embeddings, `TransformerEncoder`: d_model 512, 8 heads, d_ff 2048, 4 post-norm layers,
//! GELU, dropout 0; mean-pooled linear head) with Burn 0.22's AdamW on synthetic sequences of
//! 256 tokens on `Device::cuda(0)`, with or without `cudnn_burn::register()` (`--register`):
//! the same model code either way, as this repository's Burn 0.21 `train_transformer`.
//!
//! Shows a progress bar, then the loss curve and one JSON line (`common::Run::finish`). The
//! batch is fixed, so the loss falls as the model learns its labels.
//!
//! ```sh
//! BURN_022_PROFILE=release bash scripts/burn-0.22-offline.sh backend/cudnn-burn/Cargo.toml --lib --tests --examples
//! target/burn-0.22/release/examples/train_transformer --register [--steps 30] [--batch-size 32] [--dtype bf16]
//! ```

mod common;

use std::process::ExitCode;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Distribution;

const VOCAB: usize = 1000;
const CLASSES: usize = 10;
const SEQ: usize = 256;
const D_MODEL: usize = 512;
const HEADS: usize = 8;
const D_FF: usize = 2048;
const LAYERS: usize = 4;

/// Embeddings, the encoder, and a linear head on the mean over positions.
#[derive(Module, Debug)]
struct Net {
    tokens: Embedding,
    positions: Embedding,
    encoder: TransformerEncoder,
    head: Linear,
}

impl Net {
    fn new(device: &Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, D_MODEL).init(device),
            positions: EmbeddingConfig::new(SEQ, D_MODEL).init(device),
            encoder: TransformerEncoderConfig::new(D_MODEL, D_FF, HEADS, LAYERS)
                .with_dropout(0.0)
                .init(device),
            head: LinearConfig::new(D_MODEL, CLASSES).init(device),
        }
    }

    fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<2> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let x = self.encoder.forward(TransformerEncoderInput::new(x));
        self.head.forward(x.mean_dim(1).reshape([batch, D_MODEL]))
    }
}

fn main() -> ExitCode {
    let args = match common::parse_args(32) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "train_transformer: {e}\nusage: train_transformer [--register] [--steps N] [--batch-size N] [--dtype f32|f16|bf16] [--trace-step FILE]"
            );
            return ExitCode::from(2);
        }
    };
    let device = match common::training_device(&args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("train_transformer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut model = Net::new(&device);
    let mut optim = AdamWConfig::new().with_weight_decay(0.01).init();
    let tokens = Tensor::<2, Int>::random([args.batch, SEQ], Distribution::Uniform(0.0, VOCAB as f64), &device);
    let labels = Tensor::<1, Int>::random([args.batch], Distribution::Uniform(0.0, CLASSES as f64), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut run = common::Run::new(args.steps, args.trace_step.clone());
    for _ in 0..args.steps {
        let loss = loss_fn.forward(model.forward(tokens.clone()), labels.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-4, model, grads);
        run.step(loss.into_scalar());
    }
    run.finish("transformer", &args);
    ExitCode::SUCCESS
}
