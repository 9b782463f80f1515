//! A small CNN (Conv2d, MaxPool2d, Linear) trained for a few Adam steps on
//! `Autodiff<Cudnn>`: the way a user's crate selects the cuDNN backend.

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};
use cudnn_backend::burn::{Cudnn, CudnnDevice};

type B = Autodiff<Cudnn>;

#[derive(Module, Debug)]
struct Net<B: Backend> {
    conv: Conv2d<B>,
    pool: MaxPool2d,
    relu: Relu,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([3, 16], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            relu: Relu::new(),
            head: LinearConfig::new(16 * 8 * 8, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.pool.forward(self.relu.forward(self.conv.forward(x)));
        self.head.forward(x.flatten(1, 3))
    }
}

fn train<B: AutodiffBackend>(device: &B::Device) -> (f32, f32) {
    B::seed(device, 7);
    let mut model = Net::<B>::new(device);
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<B, 4>::random([32, 3, 16, 16], Distribution::Normal(0.0, 1.0), device);
    let labels = Tensor::<B, 1, Int>::from_ints((0..32).map(|i| i % 10).collect::<Vec<i64>>().as_slice(), device);
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut first = f32::NAN;
    let mut last = f32::NAN;
    for step in 0..30 {
        let loss = loss_fn.forward(model.forward(x.clone()), labels.clone());
        let value = loss.clone().into_scalar().to_string().parse::<f32>().unwrap_or(f32::NAN);
        if step == 0 {
            first = value;
        }
        last = value;
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    (first, last)
}

fn main() {
    let device = CudnnDevice::default();
    if let Err(e) = device.try_open() {
        eprintln!("no usable CUDA GPU: {e}");
        std::process::exit(2);
    }
    let (first, last) = train::<B>(&device);
    println!("Autodiff<Cudnn>: loss {first:.4} -> {last:.4} after 30 Adam steps");
    if last.is_finite() && last < first * 0.5 {
        println!("OK");
    } else {
        println!("FAILED: the loss did not fall");
        std::process::exit(1);
    }
}
