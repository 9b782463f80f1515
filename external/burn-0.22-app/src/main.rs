//! Trains a small convolutional network written with stock `burn::nn` on Burn 0.22's CUDA
//! backend (`Device::cuda(0)`, fusion and autodiff) on synthetic data, and prints the loss
//! and the milliseconds per step: the Burn 0.22 program of the "today's Burn" work.
//!
//! ```sh
//! scripts/burn-0.22-offline.sh        # builds this program without an LLVM download
//! target/burn-0.22/release/burn-022-app --steps 50 --batch-size 128
//! ```

use std::time::Instant;

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;

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
                .with_bias(false)
                .init(device),
            bn: BatchNormConfig::new(cout).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        Relu::new().forward(self.bn.forward(self.conv.forward(x)))
    }
}

/// Three conv blocks, global average pooling, a linear classifier.
#[derive(Module, Debug)]
struct Net {
    blocks: Vec<ConvBn>,
    gap: AdaptiveAvgPool2d,
    head: Linear,
}

impl Net {
    fn new(device: &Device) -> Self {
        Self {
            blocks: vec![
                ConvBn::new(3, 32, device),
                ConvBn::new(32, 64, device),
                ConvBn::new(64, 128, device),
            ],
            gap: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(128, 10).init(device),
        }
    }

    fn forward(&self, mut x: Tensor<4>) -> Tensor<2> {
        for b in &self.blocks {
            x = b.forward(x);
        }
        self.head.forward(self.gap.forward(x).flatten(1, 3))
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{name} {v}: {e}")))
        .unwrap_or(default)
}

fn main() {
    let (steps, batch) = (arg("--steps", 30), arg("--batch-size", 128));
    let started = Instant::now();
    let device = Device::cuda(0).autodiff();
    let mut model = Net::new(&device);
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<4>::random(
        [batch, 3, 32, 32],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &device,
    );
    let y = Tensor::<1, Int>::random([batch], burn::tensor::Distribution::Uniform(0.0, 10.0), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut timed = None;
    for step in 0..steps {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        if step == 0 || step + 1 == steps {
            let value: f32 = loss.into_scalar();
            println!(
                "step {step}: loss {value:.4} ({:.2} s after start)",
                started.elapsed().as_secs_f64()
            );
            // The steps after the first (compiles, autotuning) are the timed ones.
            if step == 0 {
                timed = Some(Instant::now());
            }
        }
    }
    if let (Some(t0), true) = (timed, steps > 1) {
        let ms = t0.elapsed().as_secs_f64() * 1e3 / (steps - 1) as f64;
        println!("burn-022-app batch={batch}: {ms:.2} ms/step over {} steps", steps - 1);
    }
}
