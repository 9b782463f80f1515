//! Lazy fusion on our backend (`CudnnFusion` = `Fusion<Cudnn>`), on the GPU:
//!
//! - a chain of elementwise operations with broadcasting, comparisons, masks, casts and
//!   Burn's composed activations gives, fused, what a float64 reference gives (within the
//!   unfused path's bounds, f32/f16/bf16), in a handful of launches instead of one per op;
//! - a small MLP trained for a few steps with Burn's own Adam under `Autodiff<CudnnFusion>`
//!   ends as close to the float64 training (burn-ndarray) as the same training under
//!   `Autodiff<Cudnn>`, in fewer launches;
//! - Burn's composed linear weight and bias gradients (which burn-fusion does not forward to
//!   the backend) are matched and run as one GEMM and one reduction, with the unfused
//!   backend's gradients, and its linear forward (matmul, then the bias add) as one matmul
//!   graph adding the bias in its epilogue;
//! - Burn's composed dynamic quantization is matched and run as the unfused backend's
//!   `quantize_dynamic` (scales in f32), with its quantized values;
//! - Burn's own `BatchNorm` in training (statistics through the channel view, broadcast
//!   gradients summed dim by dim) runs its reductions as fused reductions: output and
//!   gradients match float64 as closely as the unfused backend's, in fewer launches;
//! - Burn's softmax runs its row max, with the scaling before it, as a fused max reduction;
//! - Burn's own `LayerNorm` and softmax in training over many short rows (a warp per row in
//!   the fused reductions, row values computed inside their prologues) match float64 as
//!   closely as the unfused backend;
//! - convolutions each followed by Burn's `BatchNorm` (the statistics after the second
//!   convolution are recorded while the first batch norm's block is still explored, so
//!   burn-fusion puts them in the convolution's block, which runs as the convolution and then
//!   a fused run) match float64 as closely as the unfused backend, with no fused run falling
//!   back to single operations.
//! - with every fused-kernel build failing (a fault injected into each), the fused runs
//!   execute their operations one by one, never an error, as close to float64 as the unfused
//!   backend, with one warning per kind of fused kernel.
//!
//! The conformance suite also runs on `CudnnFusion`:
//! `cargo test -p integration-tests --features fusion --test burn_conformance -- --ignored`.

use burn::backend::Autodiff;
use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, BatchNormConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{activation, DType, Int, Tensor, TensorData};
use cudnn_backend::burn::{Cudnn, CudnnDevice, CudnnFusion};
use cudnn_backend::runtime::{launch_counts, LaunchCounts};
use integration_tests::burn_ref::{compare, Rng, Tol};

/// The float64 reference.
type F64 = burn_ndarray::NdArray<f64>;

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| lo + (hi - lo) * rng.unit()).collect()
}

/// `values` rounded to `dtype` (the inputs both sides see).
fn rounded(values: &[f64], dtype: DType) -> Vec<f64> {
    values
        .iter()
        .map(|&v| match dtype {
            DType::F16 => half::f16::from_f64(v).to_f64(),
            DType::BF16 => half::bf16::from_f64(v).to_f64(),
            _ => v as f32 as f64,
        })
        .collect()
}

fn tensor<B: Backend>(values: &[f64], dims: [usize; 2], dtype: DType, device: &B::Device) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values.to_vec(), dims), (device, dtype))
}

/// The chain under test: broadcasting (`b` is one row), scalar ops, Burn's composed relu,
/// gelu and sigmoid, a comparison to bools and back, mask_where/mask_fill, a cast to the
/// compute dtype, and several outputs (some of them also read again inside the chain).
fn chain<B: Backend>(a: Tensor<B, 2>, b: Tensor<B, 2>, c: Tensor<B, 2>, dtype: DType) -> Vec<Tensor<B, 2>> {
    let x = (a.clone() + b.clone()) * 0.5 - 0.25;
    let y = activation::relu(x.clone() - c.clone());
    let z = activation::gelu(y.clone()).exp().clamp(0.5, 3.0);
    let s = activation::sigmoid(z.clone()) / (c.clone().abs() + 1.0);
    // Masks from inputs (a computed threshold could flip between precisions).
    let m = a.clone().greater_elem(0.3);
    let w = s.clone().mask_where(m.clone(), a.clone());
    let f = w.mask_fill(c.clone().lower_elem(0.0), 2.0) + m.float().cast(dtype);
    let g = (f.clone().powf_scalar(2.0) + 1.0).sqrt().log().tanh() * b;
    vec![x, z, f, g]
}

fn gpu() -> CudnnDevice {
    CudnnDevice::default()
}

/// Launch counts are process-wide: every test of this file runs one at a time, so that one
/// test's launches never count in another's.
fn counting_launches() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_fused_elementwise_chain_matches_float64_in_few_launches() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0xf05e);
    let dims = [64, 257];
    let n = dims[0] * dims[1];
    let (va, vb, vc) = (
        uniform(&mut rng, n, -2.0, 2.0),
        uniform(&mut rng, dims[1], -1.0, 1.0),
        uniform(&mut rng, n, -1.5, 1.5),
    );
    let mut report = Vec::new();
    for (dtype, tol) in [
        (DType::F32, Tol::Rel(2e-6)),
        (DType::F16, Tol::Rel(1e-2)),
        (DType::BF16, Tol::Rel(3e-2)),
    ] {
        let (ra, rb, rc) = (rounded(&va, dtype), rounded(&vb, dtype), rounded(&vc, dtype));
        let cpu = Default::default();
        let want: Vec<TensorData> = chain::<F64>(
            tensor(&ra, dims, DType::F64, &cpu),
            tensor(&rb, [1, dims[1]], DType::F64, &cpu),
            tensor(&rc, dims, DType::F64, &cpu),
            DType::F64,
        )
        .into_iter()
        .map(|t| t.into_data())
        .collect();

        let run = |fused: bool| -> (Vec<TensorData>, u64) {
            let device = gpu();
            macro_rules! go {
                ($B:ty) => {{
                    let (a, b, c) = (
                        tensor::<$B>(&ra, dims, dtype, &device),
                        tensor::<$B>(&rb, [1, dims[1]], dtype, &device),
                        tensor::<$B>(&rc, dims, dtype, &device),
                    );
                    <$B as Backend>::sync(&device).unwrap();
                    let before = launch_counts();
                    let out = chain(a, b, c, dtype);
                    let data: Vec<TensorData> = out.into_iter().map(|t| t.into_data()).collect();
                    (data, launch_counts().since(&before).total())
                }};
            }
            if fused {
                go!(CudnnFusion)
            } else {
                go!(Cudnn)
            }
        };
        // The first fused run queues the program's build and runs unfused; once built, the
        // same chain runs as one kernel.
        let (plain, plain_launches) = run(false);
        let (first, _) = run(true);
        cudnn_backend::ops::wait_for_builds();
        let (fused, fused_launches) = run(true);
        for (i, ((p, f), w)) in plain.iter().zip(&fused).zip(&want).enumerate() {
            let w = w.clone().convert_dtype(dtype);
            compare(p, &w, dtype, tol).unwrap_or_else(|e| panic!("{dtype:?} output {i}, unfused: {e}"));
            compare(f, &w, dtype, tol).unwrap_or_else(|e| panic!("{dtype:?} output {i}, fused: {e}"));
            compare(&first[i], &w, dtype, tol).unwrap_or_else(|e| panic!("{dtype:?} output {i}, first run: {e}"));
        }
        report.push(format!(
            "{dtype:?}: {plain_launches} launches unfused, {fused_launches} fused"
        ));
        assert!(
            fused_launches * 4 <= plain_launches,
            "{dtype:?}: fused {fused_launches} launches vs {plain_launches} unfused"
        );
    }
    println!("fused elementwise chain: {}", report.join("; "));
}

/// linear → gelu → linear → cross entropy.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

fn mlp<B: Backend>(rng: &mut Rng, device: &B::Device) -> Mlp<B> {
    let mut m = Mlp {
        a: LinearConfig::new(32, 64).init(device),
        b: LinearConfig::new(64, 10).init(device),
    };
    let mut set = |p: &mut Param<Tensor<B, 2>>, dims: [usize; 2]| {
        let v = uniform(rng, dims[0] * dims[1], -0.2, 0.2);
        *p = Param::from_data(TensorData::new(v, dims).convert_dtype(DType::F32), device);
    };
    set(&mut m.a.weight, [32, 64]);
    set(&mut m.b.weight, [64, 10]);
    // Biases too: both backends must start from the same parameters (Burn draws them).
    let mut bias = |n: usize| {
        let v = uniform(rng, n, -0.1, 0.1);
        Some(Param::from_data(
            TensorData::new(v, [n]).convert_dtype(DType::F32),
            device,
        ))
    };
    m.a.bias = bias(64);
    m.b.bias = bias(10);
    m
}

/// Parameters after `steps` Adam steps, and the launches of the last step.
fn train<B: AutodiffBackend>(steps: usize) -> (Vec<TensorData>, u64) {
    let device: B::Device = Default::default();
    let mut rng = Rng::new(0xada);
    let mut model = mlp::<B>(&mut rng, &device);
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(uniform(&mut rng, 128 * 32, -1.0, 1.0), [128, 32]).convert_dtype(DType::F32),
        &device,
    );
    let y = Tensor::<B, 1, Int>::from_data(
        TensorData::new((0..128).map(|i| (i * 7 % 10) as i64).collect::<Vec<_>>(), [128]),
        &device,
    );
    let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut last = 0;
    for _ in 0..steps {
        // Fused kernels of chains seen so far are built (Adam's first steps differ from later
        // ones, so new chains appear over the first steps); unfused meanwhile.
        cudnn_backend::ops::wait_for_builds();
        B::sync(&device).unwrap();
        let before = launch_counts();
        let logits = model.b.forward(activation::gelu(model.a.forward(x.clone())));
        let loss = loss_fn.forward(logits, y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
        B::sync(&device).unwrap();
        last = launch_counts().since(&before).total();
    }
    let params = vec![
        model.a.weight.val().into_data(),
        model.a.bias.as_ref().unwrap().val().into_data(),
        model.b.weight.val().into_data(),
        model.b.bias.as_ref().unwrap().val().into_data(),
    ];
    (params, last)
}

/// Relative L2 distance of `got` from `want`.
fn rel_l2(got: &TensorData, want: &TensorData) -> f64 {
    let (g, w) = (
        got.iter::<f64>().collect::<Vec<_>>(),
        want.iter::<f64>().collect::<Vec<_>>(),
    );
    assert_eq!(g.len(), w.len());
    let num: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = w.iter().map(|b| b * b).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Prints how far `label`'s fused and unfused results are from the float64 ones and asserts
/// the fused result within twice the unfused one's distance (or `floor`).
fn assert_fused_near_float64(label: &str, fused: &TensorData, plain: &TensorData, want: &TensorData, floor: f64) {
    let (ef, ep) = (rel_l2(fused, want), rel_l2(plain, want));
    println!("{label}: rel L2 vs float64: fused {ef:.2e}, unfused {ep:.2e}");
    assert!(
        ef <= (2.0 * ep).max(floor),
        "{label}: fused {ef:.2e} vs unfused {ep:.2e}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn burn_adam_training_under_fusion_matches_the_unfused_backend() {
    let _serial = counting_launches();
    let (want, _) = train::<Autodiff<F64>>(5);
    let (plain, plain_launches) = train::<Autodiff<Cudnn>>(5);
    let (fused, fused_launches) = train::<Autodiff<CudnnFusion>>(5);
    for (i, ((f, p), w)) in fused.iter().zip(&plain).zip(&want).enumerate() {
        let (ef, ep) = (rel_l2(f, w), rel_l2(p, w));
        println!("parameter {i}: rel L2 vs float64: fused {ef:.2e}, unfused {ep:.2e}");
        // Adam divides by the root of tiny second moments, so rounding differences grow over
        // steps: the fused path must stay within the unfused path's distance (×2) or 1e-3.
        assert!(
            ef <= (2.0 * ep).max(1e-3),
            "parameter {i}: fused {ef:.2e} vs unfused {ep:.2e}"
        );
    }
    println!("MLP + Adam step: {plain_launches} launches unfused, {fused_launches} fused");
    assert!(
        fused_launches * 2 <= plain_launches,
        "fused {fused_launches} vs unfused {plain_launches} launches per step"
    );
}

/// Gradients of `sum(linear(x) * w)` for a `[4, 24, 32]` input on backend `B`: weight, bias
/// and input.
fn linear_grads<B: AutodiffBackend>() -> Vec<TensorData> {
    let device: B::Device = Default::default();
    let mut rng = Rng::new(0x11ea);
    let mut lin = LinearConfig::new(32, 48).init::<B>(&device);
    let v = uniform(&mut rng, 32 * 48, -0.3, 0.3);
    lin.weight = Param::from_data(TensorData::new(v, [32, 48]).convert_dtype(DType::F32), &device);
    let data = |rng: &mut Rng, dims: [usize; 3]| {
        let n = dims.iter().product();
        TensorData::new(uniform(rng, n, -1.0, 1.0), dims).convert_dtype(DType::F32)
    };
    let x = Tensor::<B, 3>::from_data(data(&mut rng, [4, 24, 32]), &device).require_grad();
    let w = Tensor::<B, 3>::from_data(data(&mut rng, [4, 24, 48]), &device);
    let grads = (lin.forward(x.clone()) * w).sum().backward();
    layer_grads(&lin, &x, &grads)
}

/// The weight, bias and input gradients of a biased linear layer.
fn layer_grads<B: AutodiffBackend>(
    lin: &Linear<B>,
    x: &Tensor<B, 3>,
    grads: &<B as AutodiffBackend>::Gradients,
) -> Vec<TensorData> {
    vec![
        lin.weight.grad(grads).expect("weight grad").into_data(),
        lin.bias
            .as_ref()
            .expect("bias")
            .grad(grads)
            .expect("bias grad")
            .into_data(),
        x.grad(grads).expect("input grad").into_data(),
    ]
}

/// Fusion's linear gradients `got` against the unfused backend's `want`: weight and bias to
/// 1e-5; the input gradient is composed differently (a broadcast batched matmul against one
/// folded matmul: one of them may take TF32 tensor cores, the other the exact small-GEMM
/// kernel), so it gets TF32's bound.
fn assert_linear_grads_match(got: &[TensorData], want: &[TensorData]) {
    for ((name, tol), (g, w)) in [("weight", 1e-5), ("bias", 1e-5), ("input", 2e-3)]
        .iter()
        .zip(got.iter().zip(want))
    {
        let d = rel_l2(g, w);
        assert!(
            d < *tol,
            "{name} gradient under fusion: relative L2 {d:e} from the unfused backend"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Burn's composed linear weight gradient (swap, batched matmul, batch sum, reshape) is
/// matched under fusion and run as one GEMM (the matcher has CPU tests); the gradients match
/// the unfused backend's.
fn the_composed_linear_weight_gradient_under_fusion_matches_the_unfused_backend() {
    let _serial = counting_launches();
    let want = linear_grads::<Autodiff<Cudnn>>();
    let _ = linear_grads::<Autodiff<CudnnFusion>>();
    cudnn_backend::ops::wait_for_builds();
    let got = linear_grads::<Autodiff<CudnnFusion>>();
    // The weight gradient is now the same GEMM on both backends and the bias the same sums.
    assert_linear_grads_match(&got, &want);
}

/// Gradients of `sum(linear(x) * w)` for a `[4, 33, 48]` input and a biased `48 → 40` layer
/// on backend `B` (weight, bias and input), and `w`: the output gradient, whose sum over the
/// leading dims is the bias gradient.
fn biased_linear_grads<B: AutodiffBackend>() -> (Vec<TensorData>, Vec<f64>) {
    let device: B::Device = Default::default();
    let mut rng = Rng::new(0xb1a5);
    let mut lin = LinearConfig::new(48, 40).init::<B>(&device);
    let param = |rng: &mut Rng, dims: Vec<usize>| {
        let n = dims.iter().product();
        TensorData::new(uniform(rng, n, -0.3, 0.3), dims).convert_dtype(DType::F32)
    };
    lin.weight = Param::from_data(param(&mut rng, vec![48, 40]), &device);
    lin.bias = Some(Param::from_data(param(&mut rng, vec![40]), &device));
    let (xs, ws) = (
        uniform(&mut rng, 4 * 33 * 48, -1.0, 1.0),
        uniform(&mut rng, 4 * 33 * 40, -1.0, 1.0),
    );
    let data = |v: &[f64], dims: [usize; 3]| TensorData::new(v.to_vec(), dims).convert_dtype(DType::F32);
    let x = Tensor::<B, 3>::from_data(data(&xs, [4, 33, 48]), &device).require_grad();
    let w = Tensor::<B, 3>::from_data(data(&ws, [4, 33, 40]), &device);
    let grads = (lin.forward(x.clone()) * w).sum().backward();
    (layer_grads(&lin, &x, &grads), rounded(&ws, DType::F32))
}

/// What `work` returns and the work counts it took on backend `B`'s `device` (synced before
/// and after it).
fn counted_work<B: Backend, T>(device: &B::Device, work: impl FnOnce() -> T) -> (T, LaunchCounts) {
    B::sync(device).unwrap();
    let before = launch_counts();
    let out = work();
    B::sync(device).unwrap();
    (out, launch_counts().since(&before))
}

/// What `work` returns and the launches it took (see [`counted_work`]).
fn counted<B: Backend, T>(device: &B::Device, work: impl FnOnce() -> T) -> (T, u64) {
    let (out, counts) = counted_work::<B, T>(device, work);
    (out, counts.total())
}

/// The gradient whose leading dims [`leading_sums`] sums: small enough that the folded
/// `[32, 1024]` reduction is one launch (the chain of two sums takes two).
const SUMMED: [usize; 3] = [4, 8, 1024];

/// `dy` of [`SUMMED`] dims summed over dims 0 and 1 as Burn's composed bias gradient does, on
/// backend `B`: the result and the launches it took.
fn leading_sums<B: Backend>(dy: &[f64]) -> (TensorData, u64) {
    let device: B::Device = Default::default();
    let dy = Tensor::<B, 3>::from_data(TensorData::new(dy.to_vec(), SUMMED).convert_dtype(DType::F32), &device);
    let (db, launches) = counted::<B, _>(&device, || dy.sum_dim(0).sum_dim(1).reshape::<1, _>([SUMMED[2]]));
    (db.into_data(), launches)
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Burn's composed linear bias gradient (a sum over each leading dim, then a reshape) is
/// matched under fusion and run as one reduction over the folded leading dims (the matcher
/// has CPU tests): the gradients match the unfused backend's, and the sums alone take the
/// launches of one reduction instead of one per dim.
fn the_composed_linear_bias_gradient_under_fusion_matches_the_unfused_backend() {
    let _serial = counting_launches();
    let (want, dy) = biased_linear_grads::<Autodiff<Cudnn>>();
    let _ = biased_linear_grads::<Autodiff<CudnnFusion>>();
    cudnn_backend::ops::wait_for_builds();
    let (got, _) = biased_linear_grads::<Autodiff<CudnnFusion>>();
    // The bias gradient is the output gradient `w` summed over the 4 × 33 rows.
    let host: Vec<f64> = (0..40).map(|j| (0..4 * 33).map(|r| dy[r * 40 + j]).sum()).collect();
    let host = TensorData::new(host, [40]);
    for (name, g) in [("unfused", &want[1]), ("fused", &got[1])] {
        let d = rel_l2(g, &host);
        assert!(d < 1e-5, "{name} bias gradient: relative L2 {d:e} from the float64 sum");
    }
    assert_linear_grads_match(&got, &want);

    let mut rng = Rng::new(0x5a5);
    let dy = uniform(&mut rng, SUMMED.iter().product(), -1.0, 1.0);
    let (plain, plain_launches) = leading_sums::<Cudnn>(&dy);
    let _ = leading_sums::<CudnnFusion>(&dy);
    let (fused, fused_launches) = leading_sums::<CudnnFusion>(&dy);
    let d = rel_l2(&fused, &plain);
    assert!(
        d < 1e-5,
        "fused leading sums: relative L2 {d:e} from the unfused backend"
    );
    // One reduction of the folded `[32, 1024]` view, as the fused run computes it.
    let (_, folded_launches) = {
        let device = gpu();
        let t = Tensor::<Cudnn, 3>::from_data(TensorData::new(dy.clone(), SUMMED).convert_dtype(DType::F32), &device);
        counted::<Cudnn, _>(&device, || t.reshape([32, 1024]).sum_dim(0).reshape::<1, _>([1024]))
    };
    println!("sums over dims 0 and 1 of {SUMMED:?}: {plain_launches} launches unfused, {fused_launches} fused");
    assert!(
        fused_launches == folded_launches && fused_launches < plain_launches,
        "fused {fused_launches} launches vs {folded_launches} for one folded reduction and {plain_launches} unfused"
    );
}

/// Dims of the input of [`biased_linear_forward`] and the layer's output width: a product of
/// 12.6M multiply-adds, above what the exact small-GEMM kernel takes, so it runs on cuDNN.
const LINEAR_X: [usize; 3] = [4, 64, 256];
const LINEAR_N: usize = 192;

/// An activation after [`biased_linear_forward`]'s or [`biased_conv_forward`]'s layer
/// (Burn's, as a model calls it).
#[derive(Clone, Copy, Debug)]
enum After {
    Nothing,
    Relu,
    Gelu,
}

impl After {
    /// `y` through this activation.
    fn apply<B: Backend, const D: usize>(self, y: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            After::Nothing => y,
            After::Relu => activation::relu(y),
            After::Gelu => activation::gelu(y),
        }
    }
}

/// `burn::nn::Linear`'s forward (with a bias) on backend `B` from the given input, weight
/// and bias values, then `after`: the output and the launches it took.
fn biased_linear_forward<B: Backend>(x: &[f64], w: &[f64], b: &[f64], after: After) -> (TensorData, u64) {
    let device: B::Device = Default::default();
    let k = LINEAR_X[2];
    let mut lin = LinearConfig::new(k, LINEAR_N).init::<B>(&device);
    lin.weight = Param::from_data(
        TensorData::new(w.to_vec(), [k, LINEAR_N]).convert_dtype(DType::F32),
        &device,
    );
    lin.bias = Some(Param::from_data(
        TensorData::new(b.to_vec(), [LINEAR_N]).convert_dtype(DType::F32),
        &device,
    ));
    let x = Tensor::<B, 3>::from_data(TensorData::new(x.to_vec(), LINEAR_X).convert_dtype(DType::F32), &device);
    let (y, launches) = counted::<B, _>(&device, || after.apply(lin.forward(x)));
    (y.into_data(), launches)
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// `burn::nn::Linear`'s forward as burn-fusion records it (the weight reshaped, a matmul,
/// the bias reshaped, an add) is matched under fusion and run as one cuDNN matmul graph
/// that adds the bias in its epilogue, and Burn's relu or gelu after it (their composed
/// operations, the sum dropped after them) joins that epilogue (the matchers have CPU tests):
/// the output is as close to float64 as the unfused backend's (both TF32 products), in one
/// launch.
fn burns_linear_forward_under_fusion_adds_its_bias_and_activation_in_the_matmul() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0x1b1a);
    let (k, n) = (LINEAR_X[2], LINEAR_N);
    let x = uniform(&mut rng, LINEAR_X.iter().product(), -1.0, 1.0);
    let w = uniform(&mut rng, k * n, -0.1, 0.1);
    let b = uniform(&mut rng, n, -1.0, 1.0);
    for after in [After::Nothing, After::Relu, After::Gelu] {
        let (want, _) = biased_linear_forward::<F64>(&x, &w, &b, after);
        let (plain, plain_launches) = biased_linear_forward::<Cudnn>(&x, &w, &b, after);
        // The first fused run starts the fused graph's plan build and runs the pair meanwhile.
        let (first, _) = biased_linear_forward::<CudnnFusion>(&x, &w, &b, after);
        cudnn_backend::ops::wait_for_builds();
        let (fused, fused_launches) = biased_linear_forward::<CudnnFusion>(&x, &w, &b, after);
        let label = format!("linear forward then {after:?}");
        assert_fused_near_float64(&label, &fused, &plain, &want, 1e-5);
        assert_fused_near_float64(&format!("{label}, first fused run"), &first, &plain, &want, 1e-5);
        println!("{label}: {plain_launches} launches unfused, {fused_launches} fused");
        assert_eq!(fused_launches, 1, "{label}: unfused {plain_launches} launches");
    }
}

/// Input dims of [`biased_conv_forward`] and its output channels.
const CONV_ACT_X: [usize; 4] = [8, 16, 24, 24];
const CONV_ACT_K: usize = 32;

/// `burn::nn::conv::Conv2d` (3x3, padding 1, with a bias) on backend `B`, then `after`: the
/// output and the launches it took.
fn biased_conv_forward<B: Backend>(x: &[f64], w: &[f64], b: &[f64], after: After) -> (TensorData, u64) {
    let device: B::Device = Default::default();
    let (c, k) = (CONV_ACT_X[1], CONV_ACT_K);
    let mut conv: Conv2d<B> = Conv2dConfig::new([c, k], [3, 3])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init(&device);
    conv.weight = Param::from_data(
        TensorData::new(w.to_vec(), [k, c, 3, 3]).convert_dtype(DType::F32),
        &device,
    );
    conv.bias = Some(Param::from_data(
        TensorData::new(b.to_vec(), [k]).convert_dtype(DType::F32),
        &device,
    ));
    let x = Tensor::<B, 4>::from_data(
        TensorData::new(x.to_vec(), CONV_ACT_X).convert_dtype(DType::F32),
        &device,
    );
    let (y, launches) = counted::<B, _>(&device, || after.apply(conv.forward(x)));
    (y.into_data(), launches)
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// A biased `Conv2d` and Burn's relu after it (its composed operations, the convolution's
/// output dropped after them) run under fusion as one conv → bias → relu graph (the matcher
/// has CPU tests): as close to float64 as the unfused backend, in one launch. Burn's gelu
/// after it is left to the elementwise fuser (cuDNN offered no engine for the f32 conv →
/// bias → GELU graph): as close, in no more launches.
fn a_biased_convolution_and_its_relu_under_fusion_run_as_one_graph() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0xc0a7);
    let (c, k) = (CONV_ACT_X[1], CONV_ACT_K);
    let x = uniform(&mut rng, CONV_ACT_X.iter().product(), -1.0, 1.0);
    let w = uniform(&mut rng, k * c * 9, -0.2, 0.2);
    let b = uniform(&mut rng, k, -0.5, 0.5);
    for after in [After::Relu, After::Gelu] {
        let (want, _) = biased_conv_forward::<F64>(&x, &w, &b, after);
        let (plain, plain_launches) = biased_conv_forward::<Cudnn>(&x, &w, &b, after);
        let _ = biased_conv_forward::<CudnnFusion>(&x, &w, &b, after);
        cudnn_backend::ops::wait_for_builds();
        let (fused, fused_launches) = biased_conv_forward::<CudnnFusion>(&x, &w, &b, after);
        let label = format!("conv2d then {after:?}");
        assert_fused_near_float64(&label, &fused, &plain, &want, 1e-5);
        println!("{label}: {plain_launches} launches unfused, {fused_launches} fused");
        match after {
            After::Relu => assert_eq!(fused_launches, 1, "{label}: unfused {plain_launches} launches"),
            _ => assert!(
                fused_launches <= plain_launches,
                "{label}: fused {fused_launches} vs unfused {plain_launches}"
            ),
        }
    }
}

/// `values` as a `[rows, 64]` tensor of `dtype` quantized dynamically with `scheme` on
/// backend `B`: the quantized tensor's data (i8 values and scales).
fn quantized<B: Backend>(values: &[f64], dtype: DType, scheme: burn::tensor::quantization::QuantScheme) -> TensorData {
    let device: B::Device = Default::default();
    let x = tensor::<B>(values, [values.len() / 64, 64], dtype, &device);
    x.quantize_dynamic(&scheme).into_data()
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Burn's composed dynamic quantization (burn-fusion 0.21 records no `quantize_dynamic`, so
/// the range and scales become tensor ops in the input's dtype) is matched under fusion
/// and run as `Cudnn`'s, which computes the scales in f32: per tensor and per block, f16 and
/// bf16 inputs quantize to the same values and scales on both backends (the matcher has CPU
/// tests).
fn burns_composed_dynamic_quantization_under_fusion_matches_the_unfused_backend() {
    use burn::tensor::quantization::{BlockSize, QuantLevel, QuantScheme};
    // Its launches would count in a concurrent test's launch count.
    let _serial = counting_launches();
    let mut rng = Rng::new(0xd1a);
    let base = QuantScheme::default(); // Burn's default: symmetric int8 packed in u32 words
    let schemes = [base, base.with_level(QuantLevel::Block(BlockSize::new([32])))];
    for dtype in [DType::F16, DType::BF16] {
        for scheme in schemes {
            // Values whose range makes many quotients land near a rounding boundary.
            let values = rounded(&uniform(&mut rng, 16 * 64, -3.7, 3.1), dtype);
            let want = quantized::<Cudnn>(&values, dtype, scheme);
            let _ = quantized::<CudnnFusion>(&values, dtype, scheme);
            cudnn_backend::ops::wait_for_builds();
            let got = quantized::<CudnnFusion>(&values, dtype, scheme);
            assert_eq!(got.dtype, want.dtype, "{dtype:?} {:?}", scheme.level);
            assert_eq!(
                got.bytes, want.bytes,
                "{dtype:?} {:?}: quantized values or scales differ",
                scheme.level
            );
        }
    }
}

/// Dims of the batch-norm inputs: 8 × 16 channels × 12 × 12, and one whose sums span many
/// chunks (combined by the launch's last block of each column).
const BN_DIMS: [[usize; 4]; 2] = [[8, 16, 12, 12], [32, 16, 32, 32]];

/// `sum(batch_norm(x) * w)` through Burn's own `BatchNorm` in training on backend `B`:
/// the output, the gradients of the input, scale and bias, and the launches of the step.
/// With `channels_last`, `x` holds the input's values in `[N, H, W, C]` order and the batch
/// norm reads its channels-last view (a permutation), as a channels-last network's
/// activations are.
fn stock_batch_norm<B: AutodiffBackend>(
    dims: [usize; 4],
    channels_last: bool,
    x: &[f64],
    w: &[f64],
    params: &[f64],
) -> (Vec<TensorData>, u64) {
    let device: B::Device = Default::default();
    let c = dims[1];
    let mut bn: BatchNorm<B> = BatchNormConfig::new(c).init(&device);
    let vector = |v: &[f64]| TensorData::new(v.to_vec(), [c]).convert_dtype(DType::F32);
    bn.gamma = Param::from_data(vector(&params[..c]), &device);
    bn.beta = Param::from_data(vector(&params[c..]), &device);
    let data = |v: &[f64]| TensorData::new(v.to_vec(), dims).convert_dtype(DType::F32);
    let [n, c, h, wd] = dims;
    let x = match channels_last {
        false => Tensor::<B, 4>::from_data(data(x), &device),
        true => Tensor::<B, 4>::from_data(
            TensorData::new(x.to_vec(), [n, h, wd, c]).convert_dtype(DType::F32),
            &device,
        ),
    }
    .require_grad();
    let w = Tensor::<B, 4>::from_data(data(w), &device);
    B::sync(&device).unwrap();
    let before = launch_counts();
    let input = match channels_last {
        false => x.clone(),
        true => x.clone().permute([0, 3, 1, 2]),
    };
    let y = bn.forward(input);
    let grads = (y.clone() * w).sum().backward();
    let out = vec![
        y.into_data(),
        x.grad(&grads).unwrap().into_data(),
        bn.gamma.grad(&grads).unwrap().into_data(),
        bn.beta.grad(&grads).unwrap().into_data(),
    ];
    B::sync(&device).unwrap();
    (out, launch_counts().since(&before).total())
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Burn's own batch norm in training under `Autodiff<CudnnFusion>`: its statistics (a channel
/// view and a mean) and its broadcast gradients (a product summed over dims 0, 2 and 3) are
/// matched by the reduction fuser (it has CPU tests) and run as fused reductions. Output and
/// gradients match float64 within twice the unfused backend's distance (or 1e-5), and the
/// fused step takes at most a quarter of the unfused launches.
fn burns_batch_norm_under_fusion_runs_fused_reductions_and_matches_float64() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0xb17c);
    for (dims, cl) in BN_DIMS.into_iter().flat_map(|d| [(d, false), (d, true)]) {
        let n: usize = dims.iter().product();
        let (x, w) = (uniform(&mut rng, n, -2.0, 3.0), uniform(&mut rng, n, -1.0, 1.0));
        let params = uniform(&mut rng, 2 * dims[1], 0.5, 1.5);
        let (want, _) = stock_batch_norm::<Autodiff<F64>>(dims, cl, &x, &w, &params);
        let (plain, plain_launches) = stock_batch_norm::<Autodiff<Cudnn>>(dims, cl, &x, &w, &params);
        // The first fused run queues the kernels' builds and runs unfused meanwhile.
        let (first, _) = stock_batch_norm::<Autodiff<CudnnFusion>>(dims, cl, &x, &w, &params);
        cudnn_backend::ops::wait_for_builds();
        let (fused, fused_launches) = stock_batch_norm::<Autodiff<CudnnFusion>>(dims, cl, &x, &w, &params);
        for (i, name) in ["output", "input gradient", "scale gradient", "bias gradient"]
            .iter()
            .enumerate()
        {
            let (ef, ep, e1) = (
                rel_l2(&fused[i], &want[i]),
                rel_l2(&plain[i], &want[i]),
                rel_l2(&first[i], &want[i]),
            );
            println!(
                "batch norm {dims:?} (channels-last {cl}) {name}: rel L2 vs float64: fused {ef:.2e}, unfused {ep:.2e}, first fused run {e1:.2e}"
            );
            assert!(ef <= (2.0 * ep).max(1e-5), "{name}: fused {ef:.2e} vs unfused {ep:.2e}");
            assert!(
                e1 <= (2.0 * ep).max(1e-5),
                "{name}: first fused run {e1:.2e} vs unfused {ep:.2e}"
            );
        }
        println!(
            "stock batch norm step {dims:?} (channels-last {cl}): {plain_launches} launches unfused, {fused_launches} fused"
        );
        // Measured on an H200: 67 and 69 launches unfused, 13 fused (14 before sums of one
        // pass shared a kernel: each product and its three sums one launch, with the
        // `[1, C, 1, 1]` values computed beside it stored by the same kernel; no channel-view
        // copies, the affine with its reshaped parameters one run, the `[C]` statistics flat
        // runs, `mean_dim`'s backward one run).
        assert!(
            fused_launches * 4 <= plain_launches,
            "fused {fused_launches} vs unfused {plain_launches} launches"
        );
    }
}

/// Dims of the softmax input (batch, heads, queries, keys).
const SOFTMAX_DIMS: [usize; 4] = [2, 4, 16, 32];

/// Burn's softmax over scaled scores, `softmax(x / 3, 3)`, on backend `B`, with its launches.
fn scaled_softmax<B: Backend>(x: &[f64]) -> (TensorData, u64) {
    let device = B::Device::default();
    let t = Tensor::<B, 4>::from_data(TensorData::new(x.to_vec(), SOFTMAX_DIMS), (&device, DType::F32));
    counted::<B, _>(&device, || activation::softmax(t / 3.0, 3).into_data())
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Burn's softmax under `CudnnFusion`: the scaling and the row max run as one fused max
/// reduction (the scaled scores stored for the rest), the shift, exponential and row sum as
/// one fused sum: the result matches float64 within twice the unfused backend's distance (or
/// 1e-6), in fewer launches.
fn burns_softmax_under_fusion_runs_its_max_as_a_fused_reduction() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0x50f7);
    let n: usize = SOFTMAX_DIMS.iter().product();
    let x = rounded(&uniform(&mut rng, n, -6.0, 6.0), DType::F32);
    let (want, _) = scaled_softmax::<F64>(&x);
    let (plain, plain_launches) = scaled_softmax::<Cudnn>(&x);
    // The first fused run queues the kernels' builds and runs unfused meanwhile.
    let _ = scaled_softmax::<CudnnFusion>(&x);
    cudnn_backend::ops::wait_for_builds();
    let (fused, fused_launches) = scaled_softmax::<CudnnFusion>(&x);
    let (ef, ep) = (rel_l2(&fused, &want), rel_l2(&plain, &want));
    println!("softmax: rel L2 vs float64: fused {ef:.2e}, unfused {ep:.2e}; launches {plain_launches} unfused, {fused_launches} fused");
    assert!(ef <= (2.0 * ep).max(1e-6), "fused {ef:.2e} vs unfused {ep:.2e}");
    assert!(
        fused_launches < plain_launches,
        "fused {fused_launches} vs unfused {plain_launches} launches"
    );
}

/// Dims of the layer-norm input: 1200 rows of 100 features (rows of a length that is not a
/// multiple of 32, enough of them for a warp per row).
const LN_DIMS: [usize; 3] = [4, 300, 100];

/// Burn's own `LayerNorm` then a softmax over the features, in training on backend `B`:
/// `sum(softmax(layer_norm(x) * 2, 2) * w)`; the output, the gradients of the input, scale
/// and bias, and the launches of the step.
fn layer_norm_softmax<B: AutodiffBackend>(x: &[f64], w: &[f64], params: &[f64]) -> (Vec<TensorData>, u64) {
    let device: B::Device = Default::default();
    let d = LN_DIMS[2];
    let mut ln: LayerNorm<B> = LayerNormConfig::new(d).init(&device);
    let vector = |v: &[f64]| TensorData::new(v.to_vec(), [d]).convert_dtype(DType::F32);
    ln.gamma = Param::from_data(vector(&params[..d]), &device);
    ln.beta = Some(Param::from_data(vector(&params[d..]), &device));
    let data = |v: &[f64]| TensorData::new(v.to_vec(), LN_DIMS).convert_dtype(DType::F32);
    let x = Tensor::<B, 3>::from_data(data(x), &device).require_grad();
    let w = Tensor::<B, 3>::from_data(data(w), &device);
    B::sync(&device).unwrap();
    let before = launch_counts();
    let y = activation::softmax(ln.forward(x.clone()) * 2.0, 2);
    let grads = (y.clone() * w).sum().backward();
    let out = vec![
        y.into_data(),
        x.grad(&grads).unwrap().into_data(),
        ln.gamma.grad(&grads).unwrap().into_data(),
        ln.beta.as_ref().unwrap().grad(&grads).unwrap().into_data(),
    ];
    B::sync(&device).unwrap();
    (out, launch_counts().since(&before).total())
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Burn's own layer norm and softmax in training under `Autodiff<CudnnFusion>`, over 1200
/// rows of 100: the row statistics and sums run as fused reductions with one warp per row
/// (`fused_reduce`'s warp rows, CPU-tested split), the gradient's row values computed inside
/// the reductions' prologues. Output and gradients match float64 within twice the unfused
/// backend's distance (or 1e-5), in fewer launches.
fn burns_layer_norm_and_softmax_over_short_rows_match_float64_under_fusion() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0x1a7e);
    let n: usize = LN_DIMS.iter().product();
    let (x, w) = (uniform(&mut rng, n, -2.0, 3.0), uniform(&mut rng, n, -1.0, 1.0));
    let params = uniform(&mut rng, 2 * LN_DIMS[2], 0.5, 1.5);
    let (want, _) = layer_norm_softmax::<Autodiff<F64>>(&x, &w, &params);
    let (plain, plain_launches) = layer_norm_softmax::<Autodiff<Cudnn>>(&x, &w, &params);
    // The first fused run queues the kernels' builds and runs unfused meanwhile.
    let _ = layer_norm_softmax::<Autodiff<CudnnFusion>>(&x, &w, &params);
    cudnn_backend::ops::wait_for_builds();
    let (fused, fused_launches) = layer_norm_softmax::<Autodiff<CudnnFusion>>(&x, &w, &params);
    for (i, name) in ["output", "input gradient", "scale gradient", "bias gradient"]
        .iter()
        .enumerate()
    {
        assert_fused_near_float64(
            &format!("layer norm + softmax {name}"),
            &fused[i],
            &plain[i],
            &want[i],
            1e-5,
        );
    }
    println!("layer norm + softmax step: {plain_launches} launches unfused, {fused_launches} fused");
    assert!(
        fused_launches < plain_launches,
        "fused {fused_launches} vs unfused {plain_launches} launches"
    );
}

/// Input dims of the convolution stack (batch, channels, height, width).
const CONV_DIMS: [usize; 4] = [8, 3, 12, 12];

/// conv(3 → 8) → batch norm → relu → conv(8 → 8) → batch norm, and `sum(y * w)`'s gradients,
/// on backend `B`: output, input gradient, both kernels' gradients; the launches and fused
/// runs that fell back to single operations of the last of `steps` repeats.
fn conv_batch_norms<B: AutodiffBackend>(
    x: &[f64],
    w: &[f64],
    kernels: &[f64],
    steps: usize,
) -> (Vec<TensorData>, cudnn_backend::runtime::LaunchCounts) {
    let device: B::Device = Default::default();
    let conv = |cin: usize, k: &[f64]| {
        let mut c: Conv2d<B> = Conv2dConfig::new([cin, 8], [3, 3])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .with_bias(false)
            .init(&device);
        c.weight = Param::from_data(
            TensorData::new(k.to_vec(), [8, cin, 3, 3]).convert_dtype(DType::F32),
            &device,
        );
        c
    };
    let (c1, c2) = (conv(3, &kernels[..8 * 27]), conv(8, &kernels[8 * 27..]));
    let (bn1, bn2): (BatchNorm<B>, BatchNorm<B>) = (
        BatchNormConfig::new(8).init(&device),
        BatchNormConfig::new(8).init(&device),
    );
    let x = Tensor::<B, 4>::from_data(
        TensorData::new(x.to_vec(), CONV_DIMS).convert_dtype(DType::F32),
        &device,
    )
    .require_grad();
    let w = Tensor::<B, 4>::from_data(
        TensorData::new(w.to_vec(), [8, 8, 12, 12]).convert_dtype(DType::F32),
        &device,
    );
    let mut out = Vec::new();
    let mut counts = launch_counts().since(&launch_counts());
    for _ in 0..steps {
        cudnn_backend::ops::wait_for_builds();
        B::sync(&device).unwrap();
        let before = launch_counts();
        let h = activation::relu(bn1.forward(c1.forward(x.clone())));
        let y = bn2.forward(c2.forward(h));
        let grads = (y.clone() * w.clone()).sum().backward();
        out = vec![
            y.into_data(),
            x.grad(&grads).unwrap().into_data(),
            c1.weight.grad(&grads).unwrap().into_data(),
            c2.weight.grad(&grads).unwrap().into_data(),
        ];
        B::sync(&device).unwrap();
        counts = launch_counts().since(&before);
    }
    (out, counts)
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Convolutions followed by Burn's own batch norm under `Autodiff<CudnnFusion>` (a block led by
/// a convolution runs as it and a fused run after it): output and gradients match float64
/// within twice the unfused backend's distance (or 1e-5); in the last of three repeats every
/// fused run runs fused, in fewer launches than unfused.
fn convolution_led_batch_norms_under_fusion_match_float64() {
    let _serial = counting_launches();
    let mut rng = Rng::new(0xc0b2);
    let n: usize = CONV_DIMS.iter().product();
    let x = uniform(&mut rng, n, -1.0, 1.0);
    let w = uniform(&mut rng, 8 * 8 * 12 * 12, -1.0, 1.0);
    let kernels = uniform(&mut rng, 8 * 27 + 8 * 72, -0.3, 0.3);
    let (want, _) = conv_batch_norms::<Autodiff<F64>>(&x, &w, &kernels, 1);
    let (plain, plain_counts) = conv_batch_norms::<Autodiff<Cudnn>>(&x, &w, &kernels, 1);
    let (fused, fused_counts) = conv_batch_norms::<Autodiff<CudnnFusion>>(&x, &w, &kernels, 3);
    for (i, name) in [
        "output",
        "input gradient",
        "first kernel gradient",
        "second kernel gradient",
    ]
    .iter()
    .enumerate()
    {
        assert_fused_near_float64(
            &format!("conv + batch norm {name}"),
            &fused[i],
            &plain[i],
            &want[i],
            1e-5,
        );
    }
    println!(
        "conv + batch norm step: {} launches unfused, {} fused ({} fused runs unfused)",
        plain_counts.total(),
        fused_counts.total(),
        fused_counts.fused_fallbacks
    );
    assert_eq!(
        fused_counts.fused_fallbacks, 0,
        "fused runs fell back to single operations"
    );
    assert!(
        fused_counts.total() * 2 <= plain_counts.total(),
        "fused {} vs unfused {} launches",
        fused_counts.total(),
        plain_counts.total()
    );
}

/// The messages of every warning logged in this process from the first call on: the fusion
/// warnings come from burn-fusion's server thread, so the capture is the process's global
/// tracing subscriber (this test binary sets no other).
fn captured_warnings() -> &'static std::sync::Mutex<Vec<String>> {
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata};

    static WARNINGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    static INSTALLED: std::sync::Once = std::sync::Once::new();

    struct Capture;
    impl tracing::Subscriber for Capture {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= Level::WARN
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            struct Message(String);
            impl Visit for Message {
                fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            WARNINGS.lock().unwrap_or_else(|e| e.into_inner()).push(message.0);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(Capture).expect("no other global tracing subscriber in this binary");
    });
    &WARNINGS
}

/// Dims of the inputs of [`unbuildable_runs`].
const UNBUILDABLE_DIMS: [usize; 2] = [48, 96];

/// An elementwise chain and a sum with an elementwise prologue that no other test of this
/// file records (so their fused kernels are new to the process), on backend `B`: the two
/// results and the work counts of the run.
fn unbuildable_runs<B: Backend>(a: &[f64], c: &[f64]) -> (Vec<TensorData>, LaunchCounts) {
    let device = B::Device::default();
    let t = |v: &[f64]| Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), UNBUILDABLE_DIMS), (&device, DType::F32));
    let (a, c) = (t(a), t(c));
    counted_work::<B, _>(&device, || {
        // Read back before the sum is recorded: otherwise the reduction fuser takes the chain
        // into its prologue and no elementwise kernel is built.
        let chain = (((a.clone() * c.clone()).sin() + c.clone().cos() * 0.25).clamp(-0.7, 0.9)
            - a.clone() / (c.abs() + 1.5))
            .into_data();
        let sum = (a.clone().exp() * 0.5 + a).sum_dim(1);
        vec![chain, sum.into_data()]
    })
}

/// Disarms the fused-kernel build faults when dropped, whether the test passes or panics.
struct DisarmFusedBuildFaults;

impl Drop for DisarmFusedBuildFaults {
    fn drop(&mut self) {
        cudnn_backend::runtime::fault::fail_next_fused_kernel_builds(0);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
/// Every fused-kernel build fails (an NVRTC failure injected into each): the fused runs
/// execute their operations one by one, never an error, with results as close to float64 as
/// the unfused backend's, and the crate warns once per kind of fused kernel, however many
/// runs fall back.
fn fused_kernels_that_fail_to_build_run_their_operations_one_by_one_with_one_warning() {
    let _serial = counting_launches();
    let warnings = captured_warnings();
    let mut rng = Rng::new(0xbad5);
    let n: usize = UNBUILDABLE_DIMS.iter().product();
    let a = rounded(&uniform(&mut rng, n, -2.0, 2.0), DType::F32);
    let c = rounded(&uniform(&mut rng, n, -1.5, 1.5), DType::F32);
    let (want, _) = unbuildable_runs::<F64>(&a, &c);
    let (plain, plain_counts) = unbuildable_runs::<Cudnn>(&a, &c);

    let fault = cudnn_backend::runtime::fault::fail_next_fused_kernel_builds;
    let injected = cudnn_backend::runtime::fault::injected_fused_build_failures;
    let _disarm = DisarmFusedBuildFaults;
    fault(usize::MAX);
    let (injected_before, warned_before) = (injected(), warnings.lock().unwrap().len());
    // The first run queues the builds (they fail) and runs unfused meanwhile; the later runs
    // find the failures.
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(unbuildable_runs::<CudnnFusion>(&a, &c));
        cudnn_backend::ops::wait_for_builds();
    }
    let failed_builds = injected() - injected_before;
    let logged: Vec<String> = warnings.lock().unwrap()[warned_before..].to_vec();
    println!("{failed_builds} fused builds failed; warnings: {logged:?}");
    for (r, (out, counts)) in runs.iter().enumerate() {
        println!(
            "run {r}: {} launches ({} unfused), {} fused runs one by one",
            counts.total(),
            plain_counts.total(),
            counts.fused_fallbacks
        );
        for (i, name) in ["elementwise chain", "sum with a prologue"].iter().enumerate() {
            assert_fused_near_float64(&format!("run {r}, {name}"), &out[i], &plain[i], &want[i], 1e-6);
        }
    }
    assert!(failed_builds >= 1, "no fused build was attempted");
    assert!(
        runs[2].1.fused_fallbacks >= 2,
        "the last run's elementwise chain and sum did not both fall back: {} fused runs one by one",
        runs[2].1.fused_fallbacks
    );
    let count = |kind: &str| {
        logged
            .iter()
            .filter(|m| m.contains(&format!("a fused {kind} kernel could not be built")))
            .count()
    };
    assert_eq!(count("elementwise"), 1, "elementwise warnings: {logged:?}");
    assert_eq!(count("reduction"), 1, "reduction warnings: {logged:?}");
}
