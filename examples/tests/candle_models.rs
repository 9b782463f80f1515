//! The Candle models of `examples::candle_models` (what `train_candle_models` trains), on
//! Candle's CPU device, where this crate's ops run their float64 reference implementations:
//!
//! - the full-size ResNet-50 and GPT-2 small ask their `VarBuilder` for exactly the
//!   parameters of torchvision's and GPT-2's counts (and Burn's, running statistics
//!   included), in both variants, without allocating them;
//! - each tiny model's forward gives the same logits through this crate's layers and through
//!   candle-nn's (`stock`) on one `VarMap`, and GPT-2's logits are causal (changing a token
//!   changes no logits of the positions before it, and does change its own position's);
//! - the training loop of the example (`candle_models::train`) lowers each tiny model's loss
//!   on one repeated batch, in both variants.
#![cfg(feature = "candle")]

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use examples::candle_models::gpt::{Gpt, GptConfig};
use examples::candle_models::resnet::{ResNet, ResNetConfig};
use examples::candle_models::{parameter_counts, train, CandleModel, ParameterCounts, TrainOptions};

#[test]
fn resnet50_has_torchvisions_parameter_count() {
    for stock in [false, true] {
        let counts = parameter_counts(|vb| ResNet::new(&ResNetConfig::resnet50(), stock, vb)).unwrap();
        // torchvision.models.resnet50(): 25,557,032 parameters; the VarMap (and Burn's count)
        // also holds each batch norm's running mean and variance (2 x 26,560 channels over the
        // 53 batch norms).
        let want = ParameterCounts {
            trainable: 25_557_032,
            all: 25_557_032 + 2 * 26_560,
        };
        assert_eq!(counts, want, "stock={stock}");
    }
}

#[test]
fn gpt2_small_has_its_parameter_count() {
    let (layers, d, ff, vocab, positions) = (12, 768, 3072, 50_257, 1024);
    // Per layer: query, key, value and output projections (d x d and a bias each), two layer
    // norms, the MLP (d x ff + ff, ff x d + d). The token embedding is also the output
    // projection (tied), counted once; the final layer norm.
    let layer = 4 * (d * d + d) + 2 * 2 * d + (d * ff + ff) + (ff * d + d);
    let formula = vocab * d + positions * d + layers * layer + 2 * d;
    // GPT-2 small's published count (Hugging Face's `gpt2`, nanoGPT): 124,439,808.
    assert_eq!(formula, 124_439_808);
    for stock in [false, true] {
        let counts = parameter_counts(|vb| Gpt::new(&GptConfig::gpt2(), stock, vb)).unwrap();
        let want = ParameterCounts {
            trainable: formula,
            all: formula,
        };
        assert_eq!(counts, want, "stock={stock}");
    }
}

/// The largest absolute difference between two tensors of one shape, and the largest
/// absolute value of `want`.
fn max_diff(got: &Tensor, want: &Tensor) -> (f32, f32) {
    assert_eq!(got.dims(), want.dims());
    let diff = (got - want)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap();
    let scale = want.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
    (diff.to_scalar().unwrap(), scale.to_scalar().unwrap())
}

#[test]
fn tiny_resnet_gives_the_same_logits_through_our_layers_and_candle_nns() {
    let (dev, config) = (Device::Cpu, ResNetConfig::tiny());
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let ours = ResNet::new(&config, false, vb.clone()).unwrap();
    let stock = ResNet::new(&config, true, vb).unwrap();
    let batch = ResNet::synthetic_batch(&config, 4, DType::F32, &dev).unwrap();
    // Training mode (batch statistics, fused batch norm with its ReLU and residual tails) and
    // inference mode (running statistics, after the two training forwards updated them alike).
    for train in [true, false] {
        let got = ours.forward(&batch.inputs, train).unwrap();
        let want = stock.forward(&batch.inputs, train).unwrap();
        assert_eq!(got.dims(), [4, config.classes]);
        let (diff, scale) = max_diff(&got, &want);
        assert!(scale > 1e-3, "train={train}: logits all but zero ({scale})");
        assert!(
            diff <= 1e-4 * scale.max(1.0),
            "train={train}: logits differ by {diff} (scale {scale})"
        );
    }
}

#[test]
fn tiny_gpt_gives_the_same_causal_logits_through_our_layers_and_candle_nns() {
    let (dev, config) = (Device::Cpu, GptConfig::tiny());
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let ours = Gpt::new(&config, false, vb.clone()).unwrap();
    let stock = Gpt::new(&config, true, vb).unwrap();
    let tokens = Gpt::synthetic_batch(&config, 2, DType::F32, &dev).unwrap().inputs;
    let s = config.seq;
    // The same tokens but for position k of the first sequence.
    let k = s / 2;
    let mut edited = tokens.to_vec2::<u32>().unwrap();
    edited[0][k] = (edited[0][k] + 1) % config.vocab as u32;
    let edited = Tensor::new(edited, &dev).unwrap();
    for (name, model) in [("ours", &ours), ("stock", &stock)] {
        let a = model.forward(&tokens).unwrap();
        let b = model.forward(&edited).unwrap();
        assert_eq!(a.dims(), [2, s, config.vocab]);
        let before = max_diff(&a.narrow(1, 0, k).unwrap(), &b.narrow(1, 0, k).unwrap()).0;
        assert!(before <= 1e-6, "{name}: positions before {k} see token {k} ({before})");
        let at = max_diff(&a.narrow(1, k, 1).unwrap(), &b.narrow(1, k, 1).unwrap()).0;
        assert!(at > 1e-3, "{name}: position {k} does not see its own token ({at})");
        let other = max_diff(&a.narrow(0, 1, 1).unwrap(), &b.narrow(0, 1, 1).unwrap()).0;
        assert!(other <= 1e-6, "{name}: the second sequence sees the first ({other})");
    }
    let (diff, scale) = max_diff(&ours.forward(&tokens).unwrap(), &stock.forward(&tokens).unwrap());
    assert!(scale > 1e-3, "logits all but zero ({scale})");
    assert!(diff <= 1e-4 * scale.max(1.0), "logits differ by {diff} (scale {scale})");
}

/// A few epochs of one repeated batch through the example's training loop.
fn tiny_options(batch: usize, lr: f64, stock: bool) -> TrainOptions {
    TrainOptions {
        batch,
        steps: 4,
        epochs: 3,
        data: 1,
        lr,
        dtype: DType::F32,
        stock,
        profile_steps: 0,
    }
}

/// The report's losses are finite and the last epoch's mean is below `ratio` of the first
/// step's loss.
fn assert_learns(name: &str, loss_first: f64, loss_last: f64, ratio: f64) {
    assert!(
        loss_first.is_finite() && loss_last.is_finite(),
        "{name}: {loss_first} -> {loss_last}"
    );
    assert!(
        loss_last < ratio * loss_first,
        "{name}: the loss fell from {loss_first:.4} to {loss_last:.4} only (wanted below {ratio} of it)"
    );
}

#[test]
fn tiny_resnet_learns_a_repeated_batch() {
    let config = ResNetConfig::tiny();
    let want_params = parameter_counts(|vb| ResNet::new(&config, false, vb)).unwrap().all;
    for stock in [false, true] {
        let r = train::<ResNet>(&config, &tiny_options(8, 1e-2, stock), &Device::Cpu, Instant::now()).unwrap();
        assert_eq!((r.unit, r.params), ("images", want_params));
        assert!(r.rate > 0.0 && r.ms_per_step > 0.0);
        assert_learns(&format!("resnet stock={stock}"), r.loss_first, r.loss_last, 0.25);
    }
}

#[test]
fn tiny_gpt_learns_a_repeated_batch() {
    let config = GptConfig::tiny();
    let want_params = parameter_counts(|vb| Gpt::new(&config, false, vb)).unwrap().all;
    for stock in [false, true] {
        let r = train::<Gpt>(&config, &tiny_options(2, 1e-2, stock), &Device::Cpu, Instant::now()).unwrap();
        assert_eq!((r.unit, r.params), ("tokens", want_params));
        // The first loss is about ln(96) = 4.56 (uniform predictions at initialization).
        assert!(
            (r.loss_first - (config.vocab as f64).ln()).abs() < 0.5,
            "{}",
            r.loss_first
        );
        assert_learns(&format!("gpt stock={stock}"), r.loss_first, r.loss_last, 0.7);
    }
}
