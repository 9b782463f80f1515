//! Gradients of a small CNN (conv → relu → max-pool → conv → adaptive avg-pool → linear,
//! cross-entropy) under `Autodiff<Cudnn>` against `Autodiff<NdArray>`: identical parameters and
//! batch, the loss and every parameter gradient (and the input gradient) must agree within a
//! relative L2 error of 1e-3; then 20 SGD and 20 Adam steps on `Autodiff<Cudnn>` must lower the
//! loss.
//!
//! ```sh
//! cargo test -p integration-tests --test burn_autodiff -- --ignored
//! # CPU self-check (ndarray against itself)
//! cargo test -p integration-tests --features burn-selfcheck --test burn_autodiff
//! ```

use burn::backend::Autodiff;
use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use integration_tests::burn_ref::{compare, Nd, Rng, Tol};

/// The backend under test.
#[cfg(not(feature = "burn-selfcheck"))]
type Tested = cudnn_backend::burn::Cudnn;
/// Self-check: the reference against itself.
#[cfg(feature = "burn-selfcheck")]
type Tested = Nd;

const BATCH: usize = 8;
const CLASSES: usize = 5;
const HW: usize = 12;

/// conv(3→8, 3×3, pad 1) → relu → max-pool 2×2 → conv(8→16, 3×3, pad 1) → global avg-pool →
/// linear(16→5).
#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    relu: Relu,
    pool: MaxPool2d,
    conv2: Conv2d<B>,
    gap: AdaptiveAvgPool2d,
    head: Linear<B>,
}

/// Uniform values in `[-bound, bound)` from a fixed seed.
fn uniform(rng: &mut Rng, n: usize, bound: f64) -> Vec<f32> {
    (0..n).map(|_| ((rng.unit() * 2.0 - 1.0) * bound) as f32).collect()
}

fn param<B: Backend, const D: usize>(
    rng: &mut Rng,
    dims: [usize; D],
    fan_in: usize,
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    let n = dims.iter().product();
    Param::from_data(
        TensorData::new(uniform(rng, n, 1.0 / (fan_in as f64).sqrt()), dims),
        device,
    )
}

impl<B: Backend> Cnn<B> {
    /// The same parameters on every backend (drawn from a fixed seed, not from the backend's RNG).
    fn new(device: &B::Device) -> Self {
        let mut rng = Rng::new(2024);
        let mut conv1 = Conv2dConfig::new([3, 8], [3, 3])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init(device);
        conv1.weight = param(&mut rng, [8, 3, 3, 3], 27, device);
        conv1.bias = Some(param(&mut rng, [8], 27, device));
        let mut conv2 = Conv2dConfig::new([8, 16], [3, 3])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init(device);
        conv2.weight = param(&mut rng, [16, 8, 3, 3], 72, device);
        conv2.bias = Some(param(&mut rng, [16], 72, device));
        let mut head = LinearConfig::new(16, CLASSES).init(device);
        head.weight = param(&mut rng, [16, CLASSES], 16, device);
        head.bias = Some(param(&mut rng, [CLASSES], 16, device));
        Self {
            conv1,
            relu: Relu::new(),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            conv2,
            gap: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head,
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.relu.forward(self.conv1.forward(x));
        let x = self.pool.forward(x);
        let x = self.gap.forward(self.conv2.forward(x));
        self.head.forward(x.flatten(1, 3))
    }
}

/// The fixed batch: images in [-1, 1) and labels in 0..CLASSES.
fn batch<B: Backend>(device: &B::Device) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
    let mut rng = Rng::new(77);
    let x = TensorData::new(uniform(&mut rng, BATCH * 3 * HW * HW, 1.0), [BATCH, 3, HW, HW]);
    let y: Vec<i64> = (0..BATCH).map(|i| ((i * 3 + 1) % CLASSES) as i64).collect();
    (
        Tensor::from_data(x, device),
        Tensor::from_data(TensorData::new(y, [BATCH]), device),
    )
}

/// Loss, then `(name, gradient)` of the input and of every parameter.
fn loss_and_grads<B: AutodiffBackend>(device: &B::Device) -> (TensorData, Vec<(&'static str, TensorData)>) {
    let model = Cnn::<B>::new(device);
    let (x, y) = batch::<B>(device);
    let x = x.require_grad();
    let loss = CrossEntropyLossConfig::new()
        .init(device)
        .forward(model.forward(x.clone()), y);
    let grads = loss.backward();
    let g = |name: &'static str, t: Option<TensorData>| (name, t.unwrap_or_else(|| panic!("no gradient for {name}")));
    let bias = |p: &Option<Param<Tensor<B, 1>>>| p.as_ref().and_then(|b| b.grad(&grads)).map(|t| t.into_data());
    let out = vec![
        g("input", x.grad(&grads).map(|t| t.into_data())),
        g("conv1.weight", model.conv1.weight.grad(&grads).map(|t| t.into_data())),
        g("conv1.bias", bias(&model.conv1.bias)),
        g("conv2.weight", model.conv2.weight.grad(&grads).map(|t| t.into_data())),
        g("conv2.bias", bias(&model.conv2.bias)),
        g("head.weight", model.head.weight.grad(&grads).map(|t| t.into_data())),
        g("head.bias", bias(&model.head.bias)),
    ];
    (loss.into_data(), out)
}

#[test]
#[cfg_attr(not(feature = "burn-selfcheck"), ignore = "needs a CUDA GPU")]
fn cnn_gradients_match_ndarray() {
    let (want_loss, want) = loss_and_grads::<Autodiff<Nd>>(&Default::default());
    let (got_loss, got) = loss_and_grads::<Autodiff<Tested>>(&Default::default());
    let tol = Tol::Rel(1e-3);
    let mut failures = Vec::new();
    if let Err(e) = compare(&got_loss, &want_loss, want_loss.dtype, tol) {
        failures.push(format!("loss: {e}"));
    }
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        if let Err(e) = compare(g, w, w.dtype, tol) {
            failures.push(format!("gradient of {name}: {e}"));
        }
    }
    eprintln!(
        "burn autodiff cnn: loss {:?} vs ndarray {:?}; {} gradients compared, {} failed",
        got_loss.iter::<f64>().next(),
        want_loss.iter::<f64>().next(),
        got.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "Autodiff<Cudnn> differs from Autodiff<NdArray>:\n{}",
        failures.join("\n")
    );
}

/// Runs `steps` optimizer steps on the fixed batch; returns the loss before each step and after
/// the last one.
fn train<B: AutodiffBackend, O: Optimizer<Cnn<B>, B>>(mut optim: O, lr: f64, steps: usize) -> Vec<f64> {
    let device = Default::default();
    let mut model = Cnn::<B>::new(&device);
    let (x, y) = batch::<B>(&device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut losses = Vec::new();
    for _ in 0..steps {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        losses.push(loss.clone().into_scalar().elem::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
    }
    losses.push(loss_fn.forward(model.forward(x), y).into_scalar().elem::<f64>());
    losses
}

/// The loss after the last step must be below `factor` times the initial loss.
fn assert_decreases(name: &str, losses: &[f64], factor: f64) {
    let (first, last) = (losses[0], *losses.last().unwrap());
    eprintln!(
        "burn autodiff {name}: loss {first:.4} -> {last:.4} over {} steps",
        losses.len() - 1
    );
    assert!(
        losses.iter().all(|l| l.is_finite()),
        "{name}: non-finite loss {losses:?}"
    );
    assert!(
        last < factor * first,
        "{name}: loss did not fall below {factor} x its initial value: {losses:?}"
    );
}

#[test]
#[cfg_attr(not(feature = "burn-selfcheck"), ignore = "needs a CUDA GPU")]
fn cnn_sgd_lowers_the_loss() {
    type B = Autodiff<Tested>;
    let losses = train::<B, _>(SgdConfig::new().init(), 0.5, 20);
    assert_decreases("sgd", &losses, 0.95);
}

#[test]
#[cfg_attr(not(feature = "burn-selfcheck"), ignore = "needs a CUDA GPU")]
fn cnn_adam_lowers_the_loss() {
    type B = Autodiff<Tested>;
    let losses = train::<B, _>(AdamConfig::new().init(), 1e-2, 20);
    assert_decreases("adam", &losses, 0.8);
}
