//! Trains a small CNN classifier with burn-train's supervised `Learner` (loss and accuracy
//! metrics, `CompactRecorder` checkpoints, metric logs) on this crate's backend, on a synthetic
//! learnable image set (`examples::learner`).
//!
//! ```sh
//! cargo run --release --example train_learner -- --epochs 3 --batch-size 64
//! cargo run --release --example train_learner -- --backend ndarray --epochs 2   # CPU
//! cargo run --release --example train_learner -- --devices 2                     # GPUs 0 and 1
//! ```
//!
//! Flags: `--backend cudnn-fusion|cudnn|ndarray` (`Autodiff<CudnnFusion>`, the default;
//! `Autodiff<Cudnn>`; burn-ndarray on the CPU), `--epochs N` (3), `--batch-size N` (64, per
//! device), `--devices N` (1; several GPUs train with burn-train's `MultiDevice` strategy:
//! one worker thread per GPU, gradients summed on GPU 0, where Adam steps), `--artifact-dir DIR`
//! (default: a folder under the temp dir; checkpoints go to `DIR/checkpoint`), `--train-items N`
//! (4096; validation uses a quarter as many), `--width N` (16 channels), `--side N` (16 pixels),
//! `--lr X` (2e-3), `--seed N`, `--workers N` (data-loader threads, 2).
//!
//! The last lines are a summary and the same figures as one JSON object (the fields of
//! `train_models`' line: `images_per_s` and `ms_per_step` over the last epoch's training
//! batches, `loss_first` and `loss_last` the first and last epochs' mean training loss,
//! `launches_per_step` this crate's launches over the whole run, validation included, per
//! training step).

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::Autodiff;
#[cfg(not(feature = "distributed"))]
use burn::backend::NdArray;
use burn::tensor::backend::AutodiffBackend;
use cudnn_backend::burn::{Cudnn, CudnnDevice, CudnnFusion};
use examples::learner::{LearnerConfig, LearnerRun};
use examples::models::Report;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BackendArg {
    CudnnFusion,
    Cudnn,
    Ndarray,
}

struct Args {
    backend: BackendArg,
    devices: usize,
    config: LearnerConfig,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        backend: BackendArg::CudnnFusion,
        devices: 1,
        config: LearnerConfig::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse().map_err(|_| format!("{flag} {v}: not a number"))
        }
        let c = &mut args.config;
        match flag.as_str() {
            "--backend" => {
                args.backend = match value()?.as_str() {
                    "cudnn-fusion" => BackendArg::CudnnFusion,
                    "cudnn" => BackendArg::Cudnn,
                    "ndarray" => BackendArg::Ndarray,
                    other => return Err(format!("--backend {other}: use cudnn-fusion, cudnn or ndarray")),
                }
            }
            "--devices" => args.devices = num(&flag, value()?)?,
            "--epochs" => c.epochs = num(&flag, value()?)?,
            "--batch-size" => c.batch_size = num(&flag, value()?)?,
            "--artifact-dir" => c.artifact_dir = PathBuf::from(value()?),
            "--train-items" => c.train_items = num(&flag, value()?)?,
            "--width" => c.width = num(&flag, value()?)?,
            "--side" => c.side = num(&flag, value()?)?,
            "--lr" => c.learning_rate = num(&flag, value()?)?,
            "--seed" => c.seed = num(&flag, value()?)?,
            "--workers" => c.workers = num(&flag, value()?)?,
            "-h" | "--help" => {
                println!(
                    "train_learner [--backend cudnn-fusion|cudnn|ndarray] [--epochs N] [--batch-size N] \
                     [--devices N] [--artifact-dir DIR] [--train-items N] [--width N] [--side N] [--lr X] \
                     [--seed N] [--workers N]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other} (see --help)")),
        }
    }
    let c = &args.config;
    if args.devices == 0 || c.epochs == 0 || c.batch_size == 0 || c.width == 0 {
        return Err("--devices, --epochs, --batch-size and --width must be at least 1".into());
    }
    if c.side < 8 || !c.side.is_multiple_of(8) {
        return Err(format!("--side {}: use a multiple of 8", c.side));
    }
    if c.train_items < c.batch_size * args.devices {
        return Err("--train-items must hold at least one batch per device".into());
    }
    Ok(args)
}

/// GPUs `0..n`, each opened first so a missing driver or ordinal is an error, not a panic.
fn gpus(n: usize) -> Result<Vec<CudnnDevice>, String> {
    let count = cudnn_backend::runtime::device_count().map_err(|e| format!("no usable GPU: {e}"))?;
    if n > count {
        return Err(format!("--devices {n}, but this machine has {count} GPU(s)"));
    }
    (0..n)
        .map(|i| {
            let d = CudnnDevice::new(i);
            d.try_open().map(|_| d).map_err(|e| format!("GPU {i}: {e}"))
        })
        .collect()
}

fn train<B: AutodiffBackend>(
    config: &LearnerConfig,
    devices: &[B::Device],
    started: Instant,
) -> Result<LearnerRun, String> {
    examples::learner::train::<B>(config, devices, started).map(|(_, run)| run)
}

#[cfg(not(feature = "distributed"))]
fn train_on_cpu(args: &Args, started: Instant) -> Result<LearnerRun, String> {
    if args.devices > 1 {
        return Err(format!(
            "--devices {} with --backend ndarray: burn-ndarray has one device (the CPU); use a GPU backend",
            args.devices
        ));
    }
    train::<Autodiff<NdArray>>(&args.config, &[Default::default()], started)
}

/// A `distributed` build leaves burn-ndarray out: Burn's distributed autodiff needs every
/// backend it wraps to implement `DistributedBackend`, which burn-ndarray 0.21 does not.
#[cfg(feature = "distributed")]
fn train_on_cpu(_args: &Args, _started: Instant) -> Result<LearnerRun, String> {
    Err("this build has the `distributed` feature, which leaves out burn-ndarray; use a GPU backend".into())
}

fn main() {
    let started = Instant::now();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_learner: {e}");
            std::process::exit(2);
        }
    };
    let (variant, gpu) = match args.backend {
        BackendArg::CudnnFusion => ("cudnn-fusion", true),
        BackendArg::Cudnn => ("cudnn", true),
        BackendArg::Ndarray => ("ndarray", false),
    };
    let launches_before = cudnn_backend::runtime::launch_counts();
    let run = if gpu {
        gpus(args.devices).and_then(|devices| match args.backend {
            BackendArg::Cudnn => train::<Autodiff<Cudnn>>(&args.config, &devices, started),
            _ => train::<Autodiff<CudnnFusion>>(&args.config, &devices, started),
        })
    } else {
        train_on_cpu(&args, started)
    };
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            eprintln!("train_learner: {e}");
            std::process::exit(1);
        }
    };
    let c = &args.config;
    for (i, loss) in run.train_loss.iter().enumerate() {
        let at = |v: &[f64]| v.get(i).copied().unwrap_or(f64::NAN);
        println!(
            "epoch {}: train loss {loss:.4}, accuracy {:.1} %; valid loss {:.4}, accuracy {:.1} %",
            i + 1,
            at(&run.train_accuracy),
            at(&run.valid_loss),
            at(&run.valid_accuracy)
        );
    }
    println!(
        "checkpoints: {}, run took {:.2} s",
        c.artifact_dir.join("checkpoint").display(),
        run.wall_s
    );
    let steps_per_epoch = c.train_items.div_ceil(c.batch_size * args.devices);
    let launches = if gpu {
        cudnn_backend::runtime::launch_counts().since(&launches_before).total() as f64
            / (steps_per_epoch * c.epochs) as f64
    } else {
        0.0
    };
    let report = Report {
        params: run.params,
        unit: "images",
        first_step_s: run.first_step_s,
        loss_first: run.train_loss.first().copied().unwrap_or(f64::NAN),
        loss_last: run.train_loss.last().copied().unwrap_or(f64::NAN),
        rate: run.items_per_s,
        ms_per_step: run.ms_per_step,
        launches_per_step: launches,
    };
    let variant = if args.devices > 1 {
        format!("{variant}-x{}", args.devices)
    } else {
        variant.to_string()
    };
    report.print("train_learner", "learner_cnn", &variant, "f32", c.batch_size);
}
