//! The standard models of `examples::models`:
//!
//! - CPU (always): ResNet-50 has torchvision's parameter count and output shape (burn-ndarray).
//! - GPU (`--include-ignored`): one training step of a small ResNet (stock modules and the
//!   fused drop-ins) on `Autodiff<CudnnFusion>` gives the loss and every parameter gradient of
//!   the same network on burn-ndarray in f64, within relative L2 bounds; a bf16 small ResNet's
//!   loss falls over 200 steps on fixed batches.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, FloatDType, Int, Tensor, TensorData};
use examples::models::resnet::{ResNet, ResNetConfig};

type Cpu64 = NdArray<f64>;

#[test]
fn resnet50_has_torchvisions_parameter_count_and_output_shape() {
    let device = Default::default();
    let model = ResNetConfig::resnet50(true).init::<NdArray>(&device);
    // torchvision.models.resnet50(): sum(p.numel() for p in model.parameters()) is 25,557,032;
    // Burn also counts each batch norm's running mean and variance (2 x 26,560 channels over
    // the 53 batch norms).
    assert_eq!(model.num_params(), 25_557_032 + 2 * 26_560);
    let tiny = ResNetConfig::tiny(true).init::<NdArray>(&device);
    let x = Tensor::<NdArray, 4>::random([2, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    assert_eq!(tiny.forward(x).dims(), [2, 10]);
}

/// Every float parameter's value (visit order), or its gradient in `grads`.
fn floats<B: AutodiffBackend>(model: &ResNet<B>, grads: Option<&B::Gradients>) -> Vec<Vec<f64>> {
    struct Collect<'a, B: AutodiffBackend>(Vec<Vec<f64>>, Option<&'a B::Gradients>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let data = match self.1 {
                Some(g) => match p.val().grad(g) {
                    Some(t) => t.into_data(),
                    None => return,
                },
                None => p.val().into_data(),
            };
            self.0.push(data.convert::<f64>().to_vec::<f64>().expect("f64 values"));
        }
    }
    let mut c = Collect::<B>(Vec::new(), grads);
    model.visit(&mut c);
    c.0
}

/// ‖a − b‖ / ‖b‖.
fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Loss and every parameter gradient of one step of `model` on a fixed batch.
fn step<B: AutodiffBackend>(model: &ResNet<B>, x: Vec<f32>, y: Vec<i64>, device: &B::Device) -> (f64, Vec<Vec<f64>>) {
    let n = y.len();
    let x = Tensor::<B, 4>::from_data(TensorData::new(x, [n, 3, 64, 64]), device);
    let y = Tensor::<B, 1, Int>::from_data(TensorData::new(y, [n]), device);
    let loss = CrossEntropyLossConfig::new().init(device).forward(model.forward(x), y);
    let grads = loss.backward();
    let value = loss.into_scalar().elem::<f64>();
    (value, floats(model, Some(&grads)))
}

/// GPU tests of this file run one at a time: the bf16 test changes the device's default
/// float dtype, which the guard puts back to f32 when dropped.
struct Serial(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Serial {
    fn lock() -> Self {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        Self(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Serial {
    fn drop(&mut self) {
        let device = cudnn_backend::burn::CudnnDevice::default();
        let _ = burn::tensor::backend::set_default_float_dtype::<cudnn_backend::burn::Cudnn>(&device, FloatDType::F32);
    }
}

/// A small ResNet's loss and gradients on the GPU against burn-ndarray in f64.
fn small_resnet_matches_f64(stock: bool) {
    let _serial = Serial::lock();
    use cudnn_backend::burn::CudnnFusion;
    type Gpu = Autodiff<CudnnFusion>;
    let gpu = cudnn_backend::burn::CudnnDevice::default();
    gpu.try_open().expect("a CUDA GPU");
    let cpu = Default::default();
    let config = ResNetConfig::tiny(stock);
    // One initialization, moved to both backends through a record.
    let ours = config.init::<Gpu>(&gpu);
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(ours.clone().into_record(), ()).expect("record");
    let reference = config
        .init::<Autodiff<Cpu64>>(&cpu)
        .load_record(recorder.load(bytes, &cpu).expect("load"));
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let n = 6;
    let x: Vec<f32> = (0..n * 3 * 64 * 64).map(|_| (next() * 4.0 - 2.0) as f32).collect();
    let y: Vec<i64> = (0..n).map(|i| (i * 7 % 10) as i64).collect();
    let (loss, grads) = step(&ours, x.clone(), y.clone(), &gpu);
    let (want_loss, want_grads) = step(&reference, x, y, &cpu);
    assert_eq!(grads.len(), want_grads.len(), "gradient count");
    let loss_err = (loss - want_loss).abs() / want_loss.abs();
    // f32 convolutions and batch norms, TF32 for the classifier's matmul (METHOD.md: near
    // 3e-4), gradients through batch norms over few elements: 2e-3.
    assert!(
        loss_err < 2e-3,
        "loss {loss} against {want_loss} (relative error {loss_err:.2e})"
    );
    let errors: Vec<f64> = grads.iter().zip(&want_grads).map(|(g, w)| rel_l2(g, w)).collect();
    let worst = errors.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "stock={stock}: loss {loss:.6} against {want_loss:.6}, {} gradients, worst relative L2 {worst:.2e}",
        grads.len()
    );
    for (i, e) in errors.iter().enumerate() {
        assert!(e.is_finite() && *e < 2e-3, "gradient {i}: relative L2 error {e:.2e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_resnet_step_on_cudnn_fusion_matches_f64_stock_modules() {
    small_resnet_matches_f64(true);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_resnet_step_on_cudnn_fusion_matches_f64_fused_modules() {
    small_resnet_matches_f64(false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_resnet_learns_in_bf16() {
    use cudnn_backend::burn::{Cudnn, CudnnFusion};
    type B = Autodiff<CudnnFusion>;
    let _serial = Serial::lock();
    let device = cudnn_backend::burn::CudnnDevice::default();
    device.try_open().expect("a CUDA GPU");
    burn::tensor::backend::set_default_float_dtype::<Cudnn>(&device, FloatDType::BF16).expect("bf16");
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
