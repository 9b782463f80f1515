//! A small ResNet (stock `burn::nn`) learns in bf16 on `Autodiff<CudnnFusion>`: its loss
//! falls over 200 steps on two fixed batches. Its own test binary, as the default float dtype
//! of a device is set once per process. Needs a CUDA GPU (`--include-ignored`).

use burn::backend::Autodiff;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{set_default_float_dtype, Backend};
use burn::tensor::{Distribution, ElementConversion, FloatDType, Int, Tensor};
use examples::models::resnet::ResNetConfig;

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_resnet_learns_in_bf16() {
    use cudnn_backend::burn::{Cudnn, CudnnFusion};
    type B = Autodiff<CudnnFusion>;
    let device = cudnn_backend::burn::CudnnDevice::default();
    device.try_open().expect("a CUDA GPU");
    set_default_float_dtype::<Cudnn>(&device, FloatDType::BF16).expect("bf16");
    B::seed(&device, 7);
    let mut model = ResNetConfig::tiny(true).init::<B>(&device);
    let mut optim = AdamConfig::new().init();
    let xs: Vec<Tensor<B, 4>> = (0..2)
        .map(|_| Tensor::random([16, 3, 64, 64], Distribution::Normal(0.0, 1.0), &device))
        .collect();
    let ys: Vec<Tensor<B, 1, Int>> = (0..2)
        .map(|_| Tensor::random([16], Distribution::Uniform(0.0, 10.0), &device))
        .collect();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut losses = Vec::new();
    for s in 0..200 {
        let loss = loss_fn.forward(model.forward(xs[s % 2].clone()), ys[s % 2].clone());
        losses.push(loss.clone().into_scalar().elem::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    let head: f64 = losses[..10].iter().sum::<f64>() / 10.0;
    let tail: f64 = losses[190..].iter().sum::<f64>() / 10.0;
    eprintln!("bf16 loss: first ten steps {head:.4}, last ten {tail:.4}");
    assert!(tail.is_finite() && tail < 0.5 * head, "loss {head:.4} -> {tail:.4}");
}
