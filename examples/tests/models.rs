//! The standard models of `examples::models`:
//!
//! - CPU (always): ResNet-50 has torchvision's parameter count and output shape (burn-ndarray).
//! - GPU (`--include-ignored`): one training step of a small ResNet (stock modules and the
//!   fused drop-ins) on `Autodiff<CudnnFusion>` gives the loss and every parameter gradient of
//!   the same network on burn-ndarray in f64, within relative L2 bounds (`models_bf16` trains
//!   in bf16, in its own process: the default float dtype is set once per device).

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, ElementConversion, Int, Tensor, TensorData};
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

/// A small ResNet's loss and gradients on the GPU against burn-ndarray in f64.
fn small_resnet_matches_f64(stock: bool) {
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
