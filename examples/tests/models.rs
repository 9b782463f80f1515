//! The standard models of `examples::models`:
//!
//! - CPU (always): ResNet-50, GPT-2 small, ViT-B/16 and BERT-base have the parameter counts
//!   their architectures give (formulas below, checked against torchvision's, GPT-2's, timm's
//!   and Hugging Face's published counts); the tiny models give their output shapes, and each
//!   tiny transformer's training loss falls over 30 AdamW steps on burn-ndarray (stock modules
//!   and this crate's drop-ins, which compose Burn's ops off our backends).
//! - GPU (`--include-ignored`): one training step of each tiny model (stock modules and the
//!   fused drop-ins) on `Autodiff<CudnnFusion>` gives the loss and every parameter gradient of
//!   the same network on burn-ndarray in f64, within relative L2 bounds (`models_bf16` trains
//!   in bf16, in its own process: the default float dtype is set once per device).

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, Int, Tensor, TensorData};
use examples::models::bert::{Bert, BertConfig};
use examples::models::gpt::{Gpt, GptConfig};
use examples::models::resnet::ResNetConfig;
use examples::models::vit::{Vit, VitConfig};
use examples::models::{ImageBatch, TrainModel};

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

/// The number of parameters of `model` (what `Module::num_params` counts) from their shapes,
/// without initializing them: a full-size model's values are never drawn.
fn lazy_num_params<B: Backend, M: Module<B>>(model: &M) -> usize {
    struct Count(usize);
    impl<B: Backend> ModuleVisitor<B> for Count {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0 += p.lazy_shape().num_elements();
        }
    }
    let mut c = Count(0);
    model.visit(&mut c);
    c.0
}

/// Parameters of one transformer layer of width `d` and MLP width `ff`: the query, key, value
/// and output projections (`d×d` and a bias each), two layer norms (scale and shift), and
/// the MLP (`d×ff` + `ff`, `ff×d` + `d`).
fn layer_params(d: usize, ff: usize) -> usize {
    4 * (d * d + d) + 2 * 2 * d + (d * ff + ff) + (ff * d + d)
}

#[test]
fn gpt2_small_has_its_parameter_count() {
    let (layers, d, ff, vocab, positions) = (12, 768, 3072, 50_257, 1024);
    // Token and position embeddings (the token embedding is also the output projection:
    // tied), the layers, the final layer norm.
    let formula = vocab * d + positions * d + layers * layer_params(d, ff) + 2 * d;
    // GPT-2 small's published count (Hugging Face's `gpt2`, nanoGPT): 124,439,808.
    assert_eq!(formula, 124_439_808);
    for stock in [true, false] {
        let model = GptConfig::gpt2(stock).init::<NdArray>(&Default::default());
        assert_eq!(lazy_num_params(&model), formula, "stock={stock}");
    }
}

#[test]
fn vit_b16_has_its_parameter_count() {
    let (layers, d, ff, patch, tokens, classes) = (12, 768, 3072, 16, 14 * 14 + 1, 1000);
    // Patch embedding (a 3→d convolution of kernel 16, with bias), class token, positions,
    // the layers, the final layer norm, the head.
    let formula =
        (3 * patch * patch * d + d) + d + tokens * d + layers * layer_params(d, ff) + 2 * d + (d * classes + classes);
    // timm's `vit_base_patch16_224` (and torchvision's `vit_b_16`): 86,567,656.
    assert_eq!(formula, 86_567_656);
    for stock in [true, false] {
        let model = VitConfig::vit_b16(stock).init::<NdArray>(&Default::default());
        assert_eq!(lazy_num_params(&model), formula, "stock={stock}");
    }
}

#[test]
fn bert_base_mlm_has_its_parameter_count() {
    let (layers, d, ff, vocab, positions) = (12, 768, 3072, 30_522, 512);
    // Token and position embeddings, their layer norm, the layers, the MLM head (dense d→d,
    // layer norm, the tied decoder's own bias over the vocabulary).
    let formula = vocab * d + positions * d + 2 * d + layers * layer_params(d, ff) + (d * d + d) + 2 * d + vocab;
    // Hugging Face's `BertForMaskedLM` of bert-base-uncased has 109,514,298 parameters,
    // segment (token-type) embeddings `2 × 768` included, which this model leaves out.
    assert_eq!(formula, 109_514_298 - 2 * d);
    for stock in [true, false] {
        let model = BertConfig::bert_base(stock).init::<NdArray>(&Default::default());
        assert_eq!(lazy_num_params(&model), formula, "stock={stock}");
    }
}

#[test]
fn tiny_transformers_give_their_output_shapes() {
    type B = NdArray;
    let device = Default::default();
    let gpt = GptConfig::tiny(true);
    let tokens = Tensor::<B, 2, Int>::random([3, gpt.seq], Distribution::Uniform(0.0, gpt.vocab as f64), &device);
    assert_eq!(gpt.init::<B>(&device).forward(tokens).dims(), [3, gpt.seq, gpt.vocab]);
    let vit = VitConfig::tiny(false);
    let images = ImageBatch::<B>::synthetic(3, vit.image, vit.classes, &device).images;
    assert_eq!(vit.init::<B>(&device).forward(images).dims(), [3, vit.classes]);
    let bert = BertConfig::tiny(true);
    let batch = Bert::<B>::synthetic_batch(&bert, 3, &device);
    let model = bert.init::<B>(&device);
    assert_eq!(
        model.forward(batch.inputs.clone(), batch.pad.clone()).dims(),
        [3, bert.seq, bert.d_model]
    );
    // Every masked position is a non-pad position holding the mask token, with an ordinary
    // token as its target.
    let m = batch.positions.dims()[0];
    assert!(m > 0 && m == batch.targets.dims()[0]);
    let flat = |t: Tensor<B, 2, Int>| t.reshape([3 * bert.seq]).select(0, batch.positions.clone());
    let at = flat(batch.inputs.clone())
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    assert!(at.iter().all(|&t| t == examples::models::bert::MASK));
    let pad = batch
        .pad
        .clone()
        .int()
        .reshape([3 * bert.seq])
        .select(0, batch.positions.clone());
    assert_eq!(pad.sum().into_scalar().elem::<i64>(), 0);
    let targets = batch
        .targets
        .clone()
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    assert!(targets
        .iter()
        .all(|&t| (examples::models::bert::FIRST_TOKEN..bert.vocab as i64).contains(&t)));
    // Lengths are at least `min_len`: no pad before it.
    let pads = batch
        .pad
        .int()
        .sum_dim(1)
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    assert!(pads.iter().all(|&p| p <= (bert.seq - bert.min_len) as i64), "{pads:?}");
}

/// Mean losses of the first and the last five of 30 AdamW steps (lr 3e-3, weight decay 0.01)
/// of the tiny model `M` on two fixed batches of 8, on burn-ndarray in f32.
fn loss_falls<M>(config: &M::Config) -> (f64, f64)
where
    M: TrainModel<Autodiff<NdArray>> + AutodiffModule<Autodiff<NdArray>>,
{
    type B = Autodiff<NdArray>;
    let device = Default::default();
    B::seed(&device, 7);
    let mut model = M::init(config, &device);
    let batches: Vec<M::Batch> = (0..2).map(|_| M::synthetic_batch(config, 8, &device)).collect();
    let mut optim = AdamWConfig::new()
        .with_weight_decay(0.01)
        .with_epsilon(1e-8)
        .init::<B, M>();
    let mut losses = Vec::new();
    for s in 0..30 {
        let loss = model.loss(&batches[s % 2]);
        losses.push(loss.clone().into_scalar().elem::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    let head = losses[..5].iter().sum::<f64>() / 5.0;
    let tail = losses[25..].iter().sum::<f64>() / 5.0;
    (head, tail)
}

/// Asserts a clear fall of the loss over the 30 steps of [`loss_falls`].
fn assert_falls(name: &str, (head, tail): (f64, f64)) {
    eprintln!("{name}: loss {head:.4} -> {tail:.4}");
    assert!(
        tail.is_finite() && tail < 0.8 * head,
        "{name}: loss {head:.4} -> {tail:.4}"
    );
}

#[test]
fn tiny_gpt_learns_on_cpu() {
    for stock in [true, false] {
        assert_falls(
            &format!("gpt stock={stock}"),
            loss_falls::<Gpt<_>>(&GptConfig::tiny(stock)),
        );
    }
}

#[test]
fn tiny_vit_learns_on_cpu() {
    for stock in [true, false] {
        assert_falls(
            &format!("vit stock={stock}"),
            loss_falls::<Vit<_>>(&VitConfig::tiny(stock)),
        );
    }
}

#[test]
fn tiny_bert_learns_on_cpu() {
    for stock in [true, false] {
        assert_falls(
            &format!("bert stock={stock}"),
            loss_falls::<Bert<_>>(&BertConfig::tiny(stock)),
        );
    }
}

/// Every float parameter's value (visit order), or its gradient in `grads`.
fn floats<B: AutodiffBackend, M: Module<B>>(model: &M, grads: Option<&B::Gradients>) -> Vec<Vec<f64>> {
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

/// ‖a − b‖ and ‖b‖.
fn l2_diff(a: &[f64], b: &[f64]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num.sqrt(), den.sqrt())
}

/// Loss and every parameter gradient of one step of `model` on `batch`.
fn step<B: AutodiffBackend, M: TrainModel<B>>(model: &M, batch: &M::Batch) -> (f64, Vec<Vec<f64>>) {
    let loss = model.loss(batch);
    let grads = loss.backward();
    let value = loss.into_scalar().elem::<f64>();
    (value, floats(model, Some(&grads)))
}

/// `data` in a dtype every backend loads: floats as f32, integers as i64.
fn portable(data: TensorData) -> TensorData {
    if data.dtype.is_float() {
        data.convert::<f32>()
    } else if data.dtype.is_int() {
        data.convert::<i64>()
    } else {
        data
    }
}

/// One step of model `G` on `Autodiff<CudnnFusion>` against the same weights (`R`, the same
/// model) on burn-ndarray in f64, on one synthetic batch of `n` drawn on the GPU: the loss
/// and each parameter's gradient within relative error 2e-3 (f32 with TF32 matmuls, as this
/// crate runs f32 matmuls; numerics.md). A parameter whose reference gradient is zero up to
/// round-off (below 1e-6 of the largest: the attention key biases, which the softmax's shift
/// invariance cancels) is held to 2e-3 of the largest gradient norm instead.
fn matches_f64<G, R>(name: &str, config: &G::Config, n: usize)
where
    G: TrainModel<Autodiff<cudnn_backend::burn::CudnnFusion>>,
    R: TrainModel<Autodiff<Cpu64>, Config = G::Config>,
{
    let gpu = cudnn_backend::burn::CudnnDevice::default();
    gpu.try_open().expect("a CUDA GPU");
    let cpu = Default::default();
    Autodiff::<cudnn_backend::burn::CudnnFusion>::seed(&gpu, 11);
    // One initialization, moved to both backends through a record.
    let ours = G::init(config, &gpu);
    // Initialized before the clone: a clone of a lazy parameter would draw its own values.
    floats::<Gpu, _>(&ours, None);
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(ours.clone().into_record(), ()).expect("record");
    let reference = R::init(config, &cpu).load_record(recorder.load(bytes, &cpu).expect("load"));
    let batch = G::synthetic_batch(config, n, &gpu);
    let data = G::batch_to_data(&batch).into_iter().map(portable).collect();
    let reference_batch = R::batch_from_data(data, &cpu);
    let (loss, grads) = step(&ours, &batch);
    let (want_loss, want_grads) = step(&reference, &reference_batch);
    assert_eq!(grads.len(), want_grads.len(), "{name}: gradient count");
    let loss_err = (loss - want_loss).abs() / want_loss.abs();
    assert!(
        loss_err < 2e-3,
        "{name}: loss {loss} against {want_loss} (relative error {loss_err:.2e})"
    );
    let norms: Vec<(f64, f64)> = grads.iter().zip(&want_grads).map(|(g, w)| l2_diff(g, w)).collect();
    let largest = norms.iter().map(|n| n.1).fold(0.0, f64::max);
    let errors: Vec<f64> = norms
        .iter()
        .map(|&(diff, norm)| diff / if norm < 1e-6 * largest { largest } else { norm })
        .collect();
    let worst = errors.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "{name}: loss {loss:.6} against {want_loss:.6}, {} gradients, worst relative L2 {worst:.2e}",
        grads.len()
    );
    for (i, e) in errors.iter().enumerate() {
        assert!(
            e.is_finite() && *e < 2e-3,
            "{name}: gradient {i}: relative L2 error {e:.2e}"
        );
    }
}

type Gpu = Autodiff<cudnn_backend::burn::CudnnFusion>;
type Reference = Autodiff<Cpu64>;

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

/// A small ResNet's loss and gradients on the GPU against burn-ndarray in f64, on six
/// 64×64 images.
fn small_resnet_matches_f64(stock: bool) {
    let gpu = cudnn_backend::burn::CudnnDevice::default();
    gpu.try_open().expect("a CUDA GPU");
    let cpu = Default::default();
    let config = ResNetConfig::tiny(stock);
    // One initialization, moved to both backends through a record.
    let ours = config.init::<Gpu>(&gpu);
    // Initialized before the clone: a clone of a lazy parameter would draw its own values.
    floats::<Gpu, _>(&ours, None);
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(ours.clone().into_record(), ()).expect("record");
    let reference = config
        .init::<Reference>(&cpu)
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
    let data = || {
        vec![
            TensorData::new(x.clone(), [n, 3, 64, 64]),
            TensorData::new(y.clone(), [n]),
        ]
    };
    let (loss, grads) = step(&ours, &ImageBatch::<Gpu>::from_data(data(), &gpu));
    let (want_loss, want_grads) = step(&reference, &ImageBatch::<Reference>::from_data(data(), &cpu));
    assert_eq!(grads.len(), want_grads.len(), "gradient count");
    let loss_err = (loss - want_loss).abs() / want_loss.abs();
    // f32 convolutions and batch norms, TF32 for the classifier's matmul (METHOD.md: near
    // 3e-4), gradients through batch norms over few elements: 2e-3.
    assert!(
        loss_err < 2e-3,
        "loss {loss} against {want_loss} (relative error {loss_err:.2e})"
    );
    let errors: Vec<f64> = grads
        .iter()
        .zip(&want_grads)
        .map(|(g, w)| {
            let (diff, norm) = l2_diff(g, w);
            diff / norm.max(f64::MIN_POSITIVE)
        })
        .collect();
    let worst = errors.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "stock={stock}: loss {loss:.6} against {want_loss:.6}, {} gradients, worst relative L2 {worst:.2e}",
        grads.len()
    );
    for (i, e) in errors.iter().enumerate() {
        assert!(e.is_finite() && *e < 2e-3, "gradient {i}: relative L2 error {e:.2e}");
    }
}

/// Tiny GPT-2 (causal mask, tied embeddings), 4 sequences of 32 tokens.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_gpt_step_on_cudnn_fusion_matches_f64() {
    for stock in [true, false] {
        matches_f64::<Gpt<Gpu>, Gpt<Reference>>(&format!("gpt stock={stock}"), &GptConfig::tiny(stock), 4);
    }
}

/// Tiny ViT (32×32 images, 8×8 patches), 6 images.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_vit_step_on_cudnn_fusion_matches_f64() {
    for stock in [true, false] {
        matches_f64::<Vit<Gpu>, Vit<Reference>>(&format!("vit stock={stock}"), &VitConfig::tiny(stock), 6);
    }
}

/// Tiny BERT (padding masks, loss on the masked positions), 4 sequences of 32 tokens, with
/// dropout 0: dropout draws different masks on the two backends, so the comparison turns it
/// off (the CPU test above trains with BERT's 0.1).
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_bert_step_on_cudnn_fusion_matches_f64() {
    for stock in [true, false] {
        let config = BertConfig {
            dropout: 0.0,
            ..BertConfig::tiny(stock)
        };
        matches_f64::<Bert<Gpu>, Bert<Reference>>(&format!("bert stock={stock}"), &config, 4);
    }
}
