//! Trains a standard model, written with stock `burn::nn`, on synthetic data made on the
//! device, and reports training throughput: the rows of BENCHMARKS.md's model table, beside
//! `bench/train_models_torch.py` (the same architecture in PyTorch).
//!
//! ```sh
//! cargo run --release --example train_models -- --model resnet50 --dtype bf16 --batch-size 64 --fusion --stock
//! ```
//! Flags: `--model resnet50`, `--dtype f32|f16|bf16`, `--batch-size N`, `--steps N` (steps per
//! epoch, default 30), `--epochs N` (default 3; the rate is the last epoch's), `--data N`
//! (distinct synthetic batches cycled through, default 4: the model learns them, so the loss
//! falls), `--stock` (Burn's `BatchNorm` and `Adam`; default: this crate's fused drop-ins and
//! `FusedAdam`), `--fusion` (`Autodiff<CudnnFusion>`: lazy fusion; default `Autodiff<Cudnn>`),
//! `--benchmark` (cuDNN autotuning, like `torch.backends.cudnn.benchmark`), `--lr X`,
//! `--profile-steps K` (an attached Nsight Compute run with `--profile-from-start off`
//! profiles the last K steps only), `--variant NAME` (the name the result lines give the run;
//! default from `--stock`/`--fusion`).
//!
//! The last lines are `train_models MODEL …: N images/s …` and the same figures as one JSON
//! object (`{"model": …}`), which `scripts/models-bench.sh` reads.

use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, ElementConversion, FloatDType, Int, Tensor};
use cudnn_backend::burn::optim::FusedAdamConfig;
use cudnn_backend::burn::{Cudnn, CudnnDevice, CudnnFusion};
use examples::models::resnet::{ResNet, ResNetConfig};

/// Command-line arguments.
struct Args {
    model: String,
    dtype: FloatDType,
    batch: usize,
    steps: usize,
    epochs: usize,
    data: usize,
    stock: bool,
    fusion: bool,
    benchmark: bool,
    lr: f64,
    profile_steps: usize,
    variant: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: "resnet50".into(),
        dtype: FloatDType::F32,
        batch: 64,
        steps: 30,
        epochs: 3,
        data: 4,
        stock: false,
        fusion: false,
        benchmark: false,
        lr: 1e-3,
        profile_steps: 0,
        variant: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--model" => a.model = value()?,
            "--dtype" => a.dtype = examples::cli::parse_dtype(&value()?)?,
            "--batch-size" => a.batch = number(value()?)?,
            "--steps" => a.steps = number(value()?)?,
            "--epochs" => a.epochs = number(value()?)?,
            "--data" => a.data = number(value()?)?,
            "--profile-steps" => a.profile_steps = number(value()?)?,
            "--variant" => a.variant = Some(value()?),
            "--lr" => a.lr = value()?.parse().map_err(|e| format!("--lr: {e}"))?,
            "--stock" => a.stock = true,
            "--fusion" => a.fusion = true,
            "--benchmark" => a.benchmark = true,
            "--help" | "-h" => {
                return Err(
                    "flags: --model resnet50 --dtype f32|f16|bf16 --batch-size N --steps N --epochs N \
                            --data N --stock --fusion --benchmark --lr X --profile-steps K --variant NAME"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other} (--help lists them)")),
        }
    }
    if a.model != "resnet50" {
        return Err(format!("--model {}: this program trains resnet50", a.model));
    }
    if a.batch == 0 || a.steps == 0 || a.epochs == 0 || a.data == 0 {
        return Err("--batch-size, --steps, --epochs and --data must be positive".into());
    }
    if a.profile_steps > a.steps {
        return Err(format!(
            "--profile-steps {} is more than --steps {}",
            a.profile_steps, a.steps
        ));
    }
    Ok(a)
}

/// What one run measured.
struct Report {
    first_step_s: f64,
    loss_first: f64,
    loss_last: f64,
    rate: f64,
    launches_per_step: f64,
}

/// Trains `args.model` for `args.epochs` epochs of `args.steps` steps on `args.data` synthetic
/// batches made on the device (normal images, uniform labels).
fn train<B, O>(device: &B::Device, args: &Args, mut optim: O, started: Instant) -> Result<Report, String>
where
    B: AutodiffBackend,
    O: Optimizer<ResNet<B>, B>,
{
    B::seed(device, 2024);
    let config = ResNetConfig::resnet50(args.stock);
    let mut model = config.init::<B>(device);
    let (n, side) = (args.batch, 224);
    let images: Vec<Tensor<B, 4>> = (0..args.data)
        .map(|_| Tensor::random([n, 3, side, side], Distribution::Normal(0.0, 1.0), device))
        .collect();
    let labels: Vec<Tensor<B, 1, Int>> = (0..args.data)
        .map(|_| Tensor::<B, 1, Int>::random([n], Distribution::Uniform(0.0, config.classes as f64), device))
        .collect();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut first_step_s, mut loss_first, mut loss_last, mut rate, mut launches_per_step) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for epoch in 1..=args.epochs {
        let bar = examples::curves::epoch_bar(args.steps, epoch, args.epochs)?;
        B::sync(device).map_err(|e| e.to_string())?;
        let epoch_started = Instant::now();
        let launches_before = cudnn_backend::runtime::launch_counts();
        let replays_before = examples::startup::graph_replays();
        let mut loss_sum = Tensor::<B, 1>::zeros([1], device);
        let profiled = epoch == args.epochs && args.profile_steps > 0;
        for step in 0..args.steps {
            if profiled && step == args.steps - args.profile_steps {
                B::sync(device).map_err(|e| e.to_string())?;
                profile_collect(true)?;
            }
            let i = ((epoch - 1) * args.steps + step) % args.data;
            let logits = model.forward(images[i].clone());
            let loss = loss_fn.forward(logits, labels[i].clone());
            loss_sum = loss_sum + loss.clone().detach();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(args.lr, model, grads);
            if epoch == 1 && step == 0 {
                B::sync(device).map_err(|e| e.to_string())?;
                first_step_s = started.elapsed().as_secs_f64();
                eprintln!("{}", examples::startup::report(started));
                loss_first = loss.into_scalar().elem::<f64>();
                // Lazy fusion builds new fused kernels in the background and runs the ops
                // unfused meanwhile; the measured steps run fused.
                cudnn_backend::ops::wait_for_builds();
            }
            bar.inc(1);
        }
        let mean_loss = loss_sum.into_scalar().elem::<f64>() / args.steps as f64;
        B::sync(device).map_err(|e| e.to_string())?;
        if profiled {
            profile_collect(false)?;
        }
        let seconds = epoch_started.elapsed().as_secs_f64();
        let launches = cudnn_backend::runtime::launch_counts().since(&launches_before);
        launches_per_step = launches.total() as f64 / args.steps as f64;
        if epoch == args.epochs {
            eprintln!(
                "{}",
                examples::startup::launches_per_step(
                    &launches,
                    examples::startup::graph_replays() - replays_before,
                    args.steps
                )
            );
        }
        if !mean_loss.is_finite() {
            return Err(format!("epoch {epoch}: the training loss is {mean_loss}"));
        }
        loss_last = mean_loss;
        rate = (args.steps * n) as f64 / seconds;
        examples::curves::finish_epoch(
            &bar,
            format!(
                "{epoch}/{}: loss {mean_loss:.4}, {rate:.1} images/s, {:.2} ms/step",
                args.epochs,
                1e3 * seconds / args.steps as f64
            ),
        );
    }
    // The model is used once more (inference mode) so its last update is not dead code to
    // the lazy queue, and its parameters are checked for NaN.
    let check = model
        .valid()
        .forward(images[0].clone().inner())
        .sum()
        .into_scalar()
        .elem::<f64>();
    if !check.is_finite() {
        return Err(format!("the trained model's logits sum to {check}"));
    }
    Ok(Report {
        first_step_s,
        loss_first,
        loss_last,
        rate,
        launches_per_step,
    })
}

/// Starts or stops an attached profiler's collection on GPU 0.
fn profile_collect(on: bool) -> Result<(), String> {
    let device = CudnnDevice::default().try_open().map_err(|e| e.to_string())?;
    cudnn_backend::runtime::profiler_collect(&device, on).map_err(|e| e.to_string())
}

fn run<B: AutodiffBackend<Device = CudnnDevice>>(args: &Args, started: Instant) -> Result<Report, String> {
    let device = CudnnDevice::default();
    if args.stock {
        train::<B, _>(&device, args, AdamConfig::new().init(), started)
    } else {
        train::<B, _>(&device, args, FusedAdamConfig::new().init(), started)
    }
}

fn main() {
    let started = Instant::now();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_models: {e}");
            std::process::exit(2);
        }
    };
    let device = CudnnDevice::default();
    examples::cli::use_gpu("train_models", Some(true), &device, args.dtype);
    if args.benchmark {
        let mut policy = cudnn_backend::plan::policy();
        policy.benchmark = true;
        cudnn_backend::plan::set_policy(policy);
    }
    let result = if args.fusion {
        run::<Autodiff<CudnnFusion>>(&args, started)
    } else {
        run::<Autodiff<Cudnn>>(&args, started)
    };
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("train_models: {e}");
            std::process::exit(1);
        }
    };
    let variant = args.variant.as_deref().unwrap_or(match (args.stock, args.fusion) {
        (true, true) => "stock-fusion",
        (false, true) => "fused-fusion",
        (true, false) => "stock",
        (false, false) => "fused",
    });
    let dtype = format!("{:?}", args.dtype).to_lowercase();
    println!(
        "train_models {} {variant} dtype={dtype} batch={}: loss {:.4} -> {:.4}, {:.1} images/s, {:.2} ms/step, \
         {:.0} launches/step, first step {:.2} s",
        args.model,
        args.batch,
        r.loss_first,
        r.loss_last,
        r.rate,
        1e3 * args.batch as f64 / r.rate,
        r.launches_per_step,
        r.first_step_s
    );
    println!(
        "{{\"model\": \"{}\", \"variant\": \"{variant}\", \"dtype\": \"{dtype}\", \"batch\": {}, \"images_per_s\": {:.2}, \
         \"ms_per_step\": {:.3}, \"launches_per_step\": {:.0}, \"first_step_s\": {:.3}, \"loss_first\": {:.5}, \
         \"loss_last\": {:.5}}}",
        args.model,
        args.batch,
        r.rate,
        1e3 * args.batch as f64 / r.rate,
        r.launches_per_step,
        r.first_step_s,
        r.loss_first,
        r.loss_last
    );
}
