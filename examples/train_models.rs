//! Trains a standard model, written with stock `burn::nn`, on synthetic data made on the
//! device, and reports training throughput: the rows of BENCHMARKS.md's model table, beside
//! `bench/train_models_torch.py` (the same architectures in PyTorch).
//!
//! ```sh
//! cargo run --release --example train_models -- --model resnet50 --dtype bf16 --batch-size 64 --fusion --stock
//! cargo run --release --example train_models -- --model gpt2 --dtype bf16 --fusion
//! ```
//! Models (`examples::models`): `resnet50` (torchvision's v1.5; Adam, lr 1e-3, batch 64),
//! `gpt2` (GPT-2 small, 124M: 1024 tokens, tied embeddings, dropout 0; batch 8), `vit_b16`
//! (ViT-B/16, 86M: 224×224 images, dropout 0; batch 64) and `bert_base` (BERT-base masked LM,
//! 110M: 512 tokens, padded to synthetic lengths 384 to 512, dropout 0.1, loss on the 15 %
//! masked positions; batch 16). The transformers train with AdamW (lr 1e-4, weight decay 0.01,
//! epsilon 1e-8, as PyTorch's `AdamW` on the other side).
//!
//! Flags: `--model resnet50|gpt2|vit_b16|bert_base`, `--dtype f32|f16|bf16`, `--batch-size N`
//! (default: the model's, above), `--steps N` (steps per epoch, default 30), `--epochs N`
//! (default 3; the rate is the last epoch's), `--data N` (distinct synthetic batches cycled
//! through, default 4: the model learns them, so the loss falls), `--stock` (Burn's
//! `BatchNorm`, `LayerNorm`, `MultiHeadAttention`, `Adam` and `AdamW`; default: this crate's
//! drop-ins and `FusedAdam`/`FusedAdamW`), `--fusion` (`Autodiff<CudnnFusion>`: lazy fusion;
//! default `Autodiff<Cudnn>`), `--benchmark` (cuDNN autotuning, like
//! `torch.backends.cudnn.benchmark`), `--checkpointing balanced` (burn-autodiff's
//! `BalancedCheckpointing`: memory-bound results, such as a composed batch norm's
//! intermediates, are recomputed in the backward pass, where the fusers join them to the
//! operations that read them, instead of kept; default `none`), `--lr X` (default: the
//! model's, above), `--profile-steps K` (an attached Nsight Compute run with
//! `--profile-from-start off` profiles the last K steps only), `--kernel-log FILE` (the
//! engine's kernel launch events, with markers where the profiled steps begin and end),
//! `--variant NAME` (the name the result lines give the run; default from
//! `--stock`/`--fusion`).
//!
//! The last lines are `train_models MODEL …: N images/s …` (tokens/s for the language models,
//! counting every position of the padded sequences) and the same figures as one JSON object
//! (`{"model": …}`, with `unit`, `images_per_s` or `tokens_per_s`, and `params`, Burn's
//! parameter count, which includes batch norms' running statistics), which
//! `scripts/models-bench.sh` reads.

use std::time::Instant;

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, FloatDType, Tensor};
use cudnn_backend::burn::optim::{FusedAdamConfig, FusedAdamWConfig};
use cudnn_backend::burn::{Cudnn, CudnnDevice, CudnnFusion};
use cudnn_backend::kernels::LAUNCH_LOG_TARGET;
use examples::models::bert::{Bert, BertConfig};
use examples::models::gpt::{Gpt, GptConfig};
use examples::models::resnet::{ResNet, ResNetConfig};
use examples::models::vit::{Vit, VitConfig};
use examples::models::{Report, TrainModel};

/// The models `--model` names.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    Resnet50,
    Gpt2,
    VitB16,
    BertBase,
}

impl Model {
    fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "resnet50" => Self::Resnet50,
            "gpt2" => Self::Gpt2,
            "vit_b16" => Self::VitB16,
            "bert_base" => Self::BertBase,
            other => return Err(format!("--model {other}: use resnet50, gpt2, vit_b16 or bert_base")),
        })
    }

    /// The batch the benchmark trains with by default.
    fn default_batch(self) -> usize {
        match self {
            Self::Resnet50 | Self::VitB16 => 64,
            Self::Gpt2 => 8,
            Self::BertBase => 16,
        }
    }

    /// The default learning rate: Adam's 1e-3 for ResNet, AdamW at 1e-4 for the transformers.
    fn default_lr(self) -> f64 {
        match self {
            Self::Resnet50 => 1e-3,
            _ => 1e-4,
        }
    }
}

/// Command-line arguments.
struct Args {
    model_name: String,
    model: Model,
    dtype: FloatDType,
    batch: usize,
    steps: usize,
    epochs: usize,
    data: usize,
    stock: bool,
    fusion: bool,
    benchmark: bool,
    /// `--checkpointing balanced`: burn-autodiff's `BalancedCheckpointing` (memory-bound
    /// results are recomputed in the backward pass instead of kept).
    balanced: bool,
    lr: f64,
    profile_steps: usize,
    variant: Option<String>,
    /// `--kernel-log FILE`: the engine's kernel launch events, with markers around the
    /// profiled steps.
    kernel_log: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let (mut model_name, mut dtype, mut batch, mut lr) = ("resnet50".to_string(), FloatDType::F32, None, None);
    let (mut steps, mut epochs, mut data, mut profile_steps) = (30, 3, 4, 0);
    let (mut stock, mut fusion, mut benchmark, mut variant) = (false, false, false, None);
    let mut balanced = false;
    let mut kernel_log = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--model" => model_name = value()?,
            "--dtype" => dtype = examples::cli::parse_dtype(&value()?)?,
            "--batch-size" => batch = Some(number(value()?)?),
            "--steps" => steps = number(value()?)?,
            "--epochs" => epochs = number(value()?)?,
            "--data" => data = number(value()?)?,
            "--profile-steps" => profile_steps = number(value()?)?,
            "--variant" => variant = Some(value()?),
            "--kernel-log" => kernel_log = Some(value()?),
            "--lr" => lr = Some(value()?.parse().map_err(|e| format!("--lr: {e}"))?),
            "--stock" => stock = true,
            "--fusion" => fusion = true,
            "--benchmark" => benchmark = true,
            "--checkpointing" => {
                balanced = match value()?.as_str() {
                    "balanced" => true,
                    "none" => false,
                    other => return Err(format!("--checkpointing {other}: use none or balanced")),
                }
            }
            "--help" | "-h" => {
                return Err(
                    "flags: --model resnet50|gpt2|vit_b16|bert_base --dtype f32|f16|bf16 --batch-size N --steps N \
                     --epochs N --data N --stock --fusion --benchmark --checkpointing none|balanced --lr X \
                     --profile-steps K --variant NAME --kernel-log FILE"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other} (--help lists them)")),
        }
    }
    let model = Model::parse(&model_name)?;
    let a = Args {
        model_name,
        model,
        dtype,
        batch: batch.unwrap_or(model.default_batch()),
        steps,
        epochs,
        data,
        stock,
        fusion,
        benchmark,
        balanced,
        lr: lr.unwrap_or(model.default_lr()),
        profile_steps,
        variant,
        kernel_log,
    };
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

/// Trains model `M` of `config` for `args.epochs` epochs of `args.steps` steps on `args.data`
/// synthetic batches made on the device ([`TrainModel::synthetic_batch`]).
fn train<B, M, O>(
    device: &B::Device,
    args: &Args,
    config: &M::Config,
    mut optim: O,
    started: Instant,
) -> Result<Report, String>
where
    B: AutodiffBackend,
    M: TrainModel<B> + AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    B::seed(device, 2024);
    let mut model = M::init(config, device);
    let params = model.num_params();
    let n = args.batch;
    let batches: Vec<M::Batch> = (0..args.data).map(|_| M::synthetic_batch(config, n, device)).collect();
    let units_per_step = n * M::units_per_sample(config);
    let (mut first_step_s, mut loss_first, mut loss_last) = (0.0, 0.0, 0.0);
    let (mut rate, mut ms_per_step, mut launches_per_step) = (0.0, 0.0, 0.0);
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
                tracing::debug!(target: LAUNCH_LOG_TARGET, marker = "profiled steps begin");
            }
            let i = ((epoch - 1) * args.steps + step) % args.data;
            let loss = model.loss(&batches[i]);
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
            tracing::debug!(target: LAUNCH_LOG_TARGET, marker = "profiled steps end");
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
        rate = (args.steps * units_per_step) as f64 / seconds;
        ms_per_step = 1e3 * seconds / args.steps as f64;
        examples::curves::finish_epoch(
            &bar,
            format!(
                "{epoch}/{}: loss {mean_loss:.4}, {rate:.1} {}/s, {ms_per_step:.2} ms/step",
                args.epochs,
                M::UNIT
            ),
        );
    }
    // The model is used once more (a forward, no step) so its last update is not dead code to
    // the lazy queue, and its parameters are checked for NaN.
    let check = model.loss(&batches[0]).into_scalar().elem::<f64>();
    if !check.is_finite() {
        return Err(format!("the trained model's loss is {check}"));
    }
    Ok(Report {
        params,
        unit: M::UNIT,
        first_step_s,
        loss_first,
        loss_last,
        rate,
        ms_per_step,
        launches_per_step,
    })
}

/// Starts or stops an attached profiler's collection on GPU 0.
fn profile_collect(on: bool) -> Result<(), String> {
    let device = CudnnDevice::default().try_open().map_err(|e| e.to_string())?;
    cudnn_backend::runtime::profiler_collect(&device, on).map_err(|e| e.to_string())
}

/// [`train`] with Adam: Burn's (`--stock`) or this crate's fused one (ResNet).
fn with_adam<B, M>(device: &B::Device, args: &Args, config: &M::Config, started: Instant) -> Result<Report, String>
where
    B: AutodiffBackend,
    M: TrainModel<B> + AutodiffModule<B>,
{
    if args.stock {
        train::<B, M, _>(device, args, config, AdamConfig::new().init(), started)
    } else {
        train::<B, M, _>(device, args, config, FusedAdamConfig::new().init(), started)
    }
}

/// [`train`] with AdamW, weight decay 0.01 and epsilon 1e-8 (PyTorch's `AdamW` defaults but
/// the decay): Burn's (`--stock`) or this crate's fused one (the transformers).
fn with_adamw<B, M>(device: &B::Device, args: &Args, config: &M::Config, started: Instant) -> Result<Report, String>
where
    B: AutodiffBackend,
    M: TrainModel<B> + AutodiffModule<B>,
{
    let (decay, epsilon) = (0.01, 1e-8);
    if args.stock {
        let optim = AdamWConfig::new().with_weight_decay(decay).with_epsilon(epsilon).init();
        train::<B, M, _>(device, args, config, optim, started)
    } else {
        let optim = FusedAdamWConfig::new()
            .with_weight_decay(decay)
            .with_epsilon(epsilon)
            .init();
        train::<B, M, _>(device, args, config, optim, started)
    }
}

fn run<B: AutodiffBackend<Device = CudnnDevice>>(args: &Args, started: Instant) -> Result<Report, String> {
    let device = CudnnDevice::default();
    let stock = args.stock;
    match args.model {
        Model::Resnet50 => with_adam::<B, ResNet<B>>(&device, args, &ResNetConfig::resnet50(stock), started),
        Model::Gpt2 => with_adamw::<B, Gpt<B>>(&device, args, &GptConfig::gpt2(stock), started),
        Model::VitB16 => with_adamw::<B, Vit<B>>(&device, args, &VitConfig::vit_b16(stock), started),
        Model::BertBase => with_adamw::<B, Bert<B>>(&device, args, &BertConfig::bert_base(stock), started),
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
    if let Some(path) = &args.kernel_log {
        if let Err(e) = examples::cli::kernel_log(path) {
            eprintln!("train_models: {e}");
            std::process::exit(2);
        }
    }
    let device = CudnnDevice::default();
    examples::cli::use_gpu("train_models", Some(true), &device, args.dtype);
    if args.benchmark {
        let mut policy = cudnn_backend::plan::policy();
        policy.benchmark = true;
        cudnn_backend::plan::set_policy(policy);
    }
    let result = match (args.fusion, args.balanced) {
        (true, false) => run::<Autodiff<CudnnFusion>>(&args, started),
        (true, true) => run::<Autodiff<CudnnFusion, BalancedCheckpointing>>(&args, started),
        (false, false) => run::<Autodiff<Cudnn>>(&args, started),
        (false, true) => run::<Autodiff<Cudnn, BalancedCheckpointing>>(&args, started),
    };
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("train_models: {e}");
            std::process::exit(1);
        }
    };
    let default_variant = match (args.stock, args.fusion) {
        (true, true) => "stock-fusion",
        (false, true) => "fused-fusion",
        (true, false) => "stock",
        (false, false) => "fused",
    };
    let default_variant = if args.balanced {
        format!("{default_variant}-balanced")
    } else {
        default_variant.to_string()
    };
    let variant = args.variant.as_deref().unwrap_or(&default_variant);
    let dtype = format!("{:?}", args.dtype).to_lowercase();
    r.print("train_models", &args.model_name, variant, &dtype, args.batch);
}
