//! burn-train's `Learner` on the examples' small CNN (`examples::learner`, what the
//! train_learner example runs): two short epochs on burn-ndarray (and, with
//! `--include-ignored`, on `Autodiff<CudnnFusion>`) lower the training loss and raise the
//! accuracy, the `CompactRecorder` checkpointer writes each epoch's model, optimizer and
//! scheduler records, and the last model record loads back into a fresh model that gives the
//! trained model's logits.

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::AutodiffBackend;
use examples::learner::{load_checkpoint, model_checkpoint, LearnerConfig, PatternBatcher, PatternDataset};

/// A fresh artifact folder for test `name`.
fn artifact_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cudnn-backend-learner-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn learner_trains_and_checkpoints<B: AutodiffBackend>(name: &str, device: B::Device) {
    let config = LearnerConfig {
        artifact_dir: artifact_dir(name),
        epochs: 2,
        batch_size: 16,
        train_items: 512,
        side: 8,
        width: 4,
        learning_rate: 1e-2,
        seed: 7,
        workers: 0,
        verbose: false,
    };
    let (model, run) = examples::learner::train::<B>(&config, std::slice::from_ref(&device), Instant::now())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!("{name}: {run:?}");

    assert_eq!(run.train_loss.len(), 2, "{name}: per-epoch training losses {run:?}");
    assert_eq!(
        run.valid_accuracy.len(),
        2,
        "{name}: per-epoch validation accuracies {run:?}"
    );
    assert!(run.train_loss.iter().all(|l| l.is_finite()), "{name}: {run:?}");
    assert!(
        run.train_loss[1] < run.train_loss[0],
        "{name}: the training loss does not fall: {run:?}"
    );
    assert!(
        run.valid_loss[1] < run.valid_loss[0],
        "{name}: the validation loss does not fall: {run:?}"
    );
    assert!(
        run.train_accuracy[1] > run.train_accuracy[0],
        "{name}: the training accuracy does not rise: {run:?}"
    );
    assert!(run.items_per_s > 0.0, "{name}: no throughput measured: {run:?}");

    let checkpoints = config.artifact_dir.join("checkpoint");
    for epoch in 1..=2 {
        for record in ["model", "optim", "scheduler"] {
            let file = checkpoints.join(format!("{record}-{epoch}.mpk"));
            assert!(file.is_file(), "{name}: {} is missing", file.display());
        }
    }
    assert!(model_checkpoint(&config.artifact_dir, 2)
        .with_extension("mpk")
        .is_file());

    // The last epoch's record loads into a fresh model: the same logits as the trained one.
    let inner_device = device.clone();
    let loaded = load_checkpoint::<B::InnerBackend>(&config.artifact_dir, 2, config.width, &inner_device)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let data = PatternDataset {
        len: 8,
        side: config.side,
        seed: 99,
    };
    let items = (0..data.len()).filter_map(|i| data.get(i)).collect();
    let batch = <PatternBatcher as Batcher<B::InnerBackend, _, _>>::batch(
        &PatternBatcher { side: config.side },
        items,
        &inner_device,
    );
    let want = model.forward(batch.images.clone()).into_data().convert::<f32>();
    let got = loaded.forward(batch.images).into_data().convert::<f32>();
    let (want, got) = (want.to_vec::<f32>().unwrap(), got.to_vec::<f32>().unwrap());
    assert_eq!(want.len(), got.len());
    for (a, b) in want.iter().zip(&got) {
        // CompactRecorder stores half precision: the weights round to f16.
        assert!(
            (a - b).abs() <= 2e-2 * (1.0 + a.abs()),
            "{name}: the loaded checkpoint's logits differ: {want:?} vs {got:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&config.artifact_dir);
}

#[test]
fn learner_trains_and_checkpoints_on_ndarray() {
    learner_trains_and_checkpoints::<Autodiff<NdArray>>("ndarray", Default::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn learner_trains_and_checkpoints_on_cudnn_fusion() {
    use cudnn_backend::burn::{CudnnDevice, CudnnFusion};
    let device = CudnnDevice::default();
    device.try_open().expect("GPU 0");
    learner_trains_and_checkpoints::<Autodiff<CudnnFusion>>("cudnn-fusion", device);
}

/// The data set is a pure function of (seed, index).
#[test]
fn pattern_dataset_is_deterministic() {
    let a = PatternDataset {
        len: 4,
        side: 8,
        seed: 1,
    };
    let b = a.clone();
    for i in 0..4 {
        let (x, y) = (a.get(i).unwrap(), b.get(i).unwrap());
        assert_eq!(x.label, y.label);
        assert_eq!(x.pixels, y.pixels);
    }
    assert!(a.get(4).is_none());
}
