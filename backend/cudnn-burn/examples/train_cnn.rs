//! Trains a small CNN written with stock `burn::nn` (conv, batch norm, relu, max and average
//! pooling, linear) with Burn 0.22's Adam on synthetic data on `Device::cuda(0)`, with or
//! without `cudnn_burn::register()` (`--register`): the same model code either way.
//!
//! Shows a progress bar, then the loss curve and one JSON line (`common::Run::finish`;
//! `ms_per_step` over the steps after the first, which compiles kernels and builds plans).
//!
//! ```sh
//! BURN_022_PROFILE=release bash scripts/burn-0.22-offline.sh backend/cudnn-burn/Cargo.toml --lib --tests --examples
//! target/burn-0.22/release/examples/train_cnn --register [--steps 30] [--batch-size 64] [--dtype bf16]
//! ```

mod common;

use std::process::ExitCode;

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Distribution;

/// conv 3x3 -> batch norm -> relu.
#[derive(Module, Debug)]
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm,
}

impl ConvBn {
    fn new(cin: usize, cout: usize, device: &Device) -> Self {
        Self {
            conv: Conv2dConfig::new([cin, cout], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            bn: BatchNormConfig::new(cout).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        Relu::new().forward(self.bn.forward(self.conv.forward(x)))
    }
}

/// Three conv blocks (max pooling after the first two), 8x8 average pooling, a linear head:
/// 32x32 inputs, 10 classes.
#[derive(Module, Debug)]
struct Net {
    blocks: Vec<ConvBn>,
    max_pool: MaxPool2d,
    avg_pool: AvgPool2d,
    head: Linear,
}

impl Net {
    fn new(device: &Device) -> Self {
        Self {
            blocks: vec![
                ConvBn::new(3, 16, device),
                ConvBn::new(16, 32, device),
                ConvBn::new(32, 64, device),
            ],
            max_pool: MaxPool2dConfig::new([2, 2]).init(),
            avg_pool: AvgPool2dConfig::new([8, 8]).init(),
            head: LinearConfig::new(64, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.max_pool.forward(self.blocks[0].forward(x));
        let x = self.max_pool.forward(self.blocks[1].forward(x));
        let x = self.avg_pool.forward(self.blocks[2].forward(x));
        self.head.forward(x.flatten(1, 3))
    }
}

fn main() -> ExitCode {
    let args = match common::parse_args(64) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "train_cnn: {e}\nusage: train_cnn [--register] [--steps N] [--batch-size N] [--dtype f32|f16|bf16] [--trace-step FILE]"
            );
            return ExitCode::from(2);
        }
    };
    let device = match common::training_device(&args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("train_cnn: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut model = Net::new(&device);
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<4>::random([args.batch, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    let y = Tensor::<1, Int>::random([args.batch], Distribution::Uniform(0.0, 10.0), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut run = common::Run::new(args.steps, args.trace_step.clone());
    for _ in 0..args.steps {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        run.step(loss.into_scalar());
    }
    run.finish("cnn", &args);
    ExitCode::SUCCESS
}
