//! Trains a small CNN written with stock `burn::nn` (conv, batch norm, relu, max and average
//! pooling, linear) with Burn 0.22's Adam on synthetic data on `Device::cuda(0)`, with or
//! without `cudnn_burn::register()` (`--register`): the same model code either way.
//!
//! Prints the loss of every step, then one JSON line:
//! `{"variant":"burn"|"cudnn-burn","ms_per_step":..,"loss_first":..,"loss_last":..}`
//! (`ms_per_step` over the steps after the first, which compiles kernels and builds plans).
//!
//! ```sh
//! BURN_022_PROFILE=release bash scripts/burn-0.22-offline.sh backend/cudnn-burn/Cargo.toml --lib --tests --examples
//! target/burn-0.22/release/examples/train_cnn --register [--steps 30] [--batch-size 64]
//! ```

use std::process::ExitCode;
use std::time::Instant;

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

struct Args {
    register: bool,
    steps: usize,
    batch: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        register: false,
        steps: 30,
        batch: 64,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut number = || -> Result<usize, String> {
            let v = it.next().ok_or(format!("{flag} needs a value"))?;
            v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"))
        };
        match flag.as_str() {
            "--register" => a.register = true,
            "--steps" => a.steps = number()?.max(2),
            "--batch-size" => a.batch = number()?.max(1),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_cnn: {e}\nusage: train_cnn [--register] [--steps N] [--batch-size N]");
            return ExitCode::from(2);
        }
    };
    if args.register {
        // Before the first tensor operation: Burn's fusion registry is sealed once it runs.
        if let Err(e) = cudnn_burn::register() {
            eprintln!("train_cnn: {e}");
            return ExitCode::FAILURE;
        }
    }
    let device = Device::cuda(0).autodiff();
    let mut model = Net::new(&device);
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<4>::random([args.batch, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    let y = Tensor::<1, Int>::random([args.batch], Distribution::Uniform(0.0, 10.0), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (mut loss_first, mut loss_last) = (f32::NAN, f32::NAN);
    let mut timed = None;
    for step in 0..args.steps {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        let value: f32 = loss.into_scalar();
        println!("step {step}: loss {value:.4}");
        if step == 0 {
            loss_first = value;
            timed = Some(Instant::now());
        }
        loss_last = value;
    }
    let ms_per_step = timed.map_or(f64::NAN, |t0| {
        t0.elapsed().as_secs_f64() * 1e3 / (args.steps - 1) as f64
    });
    if let Some(s) = cudnn_burn::stats() {
        println!("cudnn-burn: {s:?}");
    }
    let variant = if args.register { "cudnn-burn" } else { "burn" };
    println!(
        "{{\"variant\":\"{variant}\",\"ms_per_step\":{ms_per_step:.3},\"loss_first\":{loss_first:.5},\"loss_last\":{loss_last:.5}}}"
    );
    ExitCode::SUCCESS
}
