//! Trains `train_models`' ResNet-50 or GPT-2 small written with Candle (`examples::candle_models`:
//! candle-nn's `VarMap`/`VarBuilder` and this crate's Candle layers, attention, pooling and
//! `FusedAdamW`) on synthetic data made on the device, and reports training throughput in
//! `train_models`' result format, beside `bench/train_models_torch.py` (the same architectures,
//! initialization, optimizer, batch and data scheme in PyTorch).
//!
//! ```sh
//! cargo run --release -p examples --features candle-cuda --example train_candle_models -- --model resnet50 --dtype bf16 --benchmark
//! cargo run --release -p examples --features candle-cuda --example train_candle_models -- --model gpt2 --dtype bf16
//! cargo run -p examples --features candle --example train_candle_models -- --device cpu --model gpt2 --layers 2 --width 32 --heads 4 --seq 32 --vocab 96 --batch-size 2 --steps 5
//! ```
//! Models: `resnet50` (torchvision's v1.5; Adam, lr 1e-3, batch 64 of 224×224 images) and
//! `gpt2` (GPT-2 small, 124M: 1024 tokens, tied embeddings, dropout 0; AdamW, lr 1e-4, weight
//! decay 0.01; batch 8). Adam's epsilon is PyTorch's 1e-8 for both.
//!
//! Flags: `--model resnet50|gpt2`, `--dtype f32|f16|bf16` (the variables, the optimizer state
//! and the computation, as PyTorch's `model.to(dtype)`), `--batch-size N` (default: the
//! model's), `--steps N` (steps per epoch, default 30), `--epochs N` (default 3; the rate is
//! the last epoch's), `--data N` (distinct synthetic batches cycled through, default 4),
//! `--lr X`, `--stock` (candle-nn's layers and `AdamW`, Candle's own ops: see the model
//! modules), `--device gpu|cpu` (default: the GPU when one is usable, else Candle's CPU
//! device), `--benchmark` (cuDNN autotuning, like `torch.backends.cudnn.benchmark`),
//! `--variant NAME` (the name the result lines give the run; default `candle-fused` or
//! `candle-stock`). Smaller models, for checks on the CPU: `--layers N` (GPT-2's decoder
//! layers; ResNet's bottlenecks in every stage), `--width N` (GPT-2's model width, MLP 4·N;
//! ResNet's first-stage width), `--heads N`, `--seq N`, `--vocab N` (GPT-2), `--image N`,
//! `--classes N` (ResNet). `--profile-steps N`: an attached Nsight Compute (started with
//! `--profile-from-start off`) collects the last N steps of the last epoch.
//!
//! The last lines are `train_candle_models MODEL VARIANT …: N images/s …` (tokens/s for GPT-2)
//! and the same figures as one JSON object with `train_models`' keys (`{"model": …}`, `unit`,
//! `images_per_s` or `tokens_per_s`, `launches_per_step`: this crate's kernel launches and
//! cuDNN executions, not Candle's own kernels; `params`: every variable of the `VarMap`,
//! batch norms' running statistics included, as Burn's count), which `scripts/models-bench.sh`
//! reads.
//!
//! On the CPU our ops run their float64 reference implementations: correct but slow, meant for
//! checking a program without a GPU (use a small model).

use std::time::Instant;

use candle_core::{DType, Device};
use examples::candle_models::gpt::{Gpt, GptConfig};
use examples::candle_models::resnet::{ResNet, ResNetConfig};
use examples::candle_models::{open_gpu, train, CandleModel, Report, TrainOptions};

/// The models `--model` names.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    Resnet50,
    Gpt2,
}

/// Command-line arguments.
struct Args {
    model_name: String,
    model: Model,
    dtype: DType,
    batch: Option<usize>,
    steps: usize,
    epochs: usize,
    data: usize,
    lr: Option<f64>,
    stock: bool,
    gpu: Option<bool>,
    benchmark: bool,
    variant: Option<String>,
    layers: Option<usize>,
    width: Option<usize>,
    heads: Option<usize>,
    seq: Option<usize>,
    vocab: Option<usize>,
    image: Option<usize>,
    classes: Option<usize>,
    profile_steps: usize,
}

const HELP: &str = "flags: --model resnet50|gpt2 --dtype f32|f16|bf16 --batch-size N --steps N --epochs N --data N \
                    --lr X --stock --device gpu|cpu --benchmark --variant NAME --layers N --width N --heads N --seq N \
                    --vocab N --image N --classes N --profile-steps N";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model_name: "resnet50".into(),
        model: Model::Resnet50,
        dtype: DType::F32,
        batch: None,
        steps: 30,
        epochs: 3,
        data: 4,
        lr: None,
        stock: false,
        gpu: None,
        benchmark: false,
        variant: None,
        layers: None,
        width: None,
        heads: None,
        seq: None,
        vocab: None,
        image: None,
        classes: None,
        profile_steps: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--model" => a.model_name = value()?,
            "--dtype" => a.dtype = examples::cli::parse_candle_dtype(&value()?)?,
            "--batch-size" => a.batch = Some(number(value()?)?),
            "--steps" => a.steps = number(value()?)?,
            "--epochs" => a.epochs = number(value()?)?,
            "--data" => a.data = number(value()?)?,
            "--lr" => a.lr = Some(value()?.parse().map_err(|e| format!("--lr: {e}"))?),
            "--stock" => a.stock = true,
            "--device" => a.gpu = Some(examples::cli::parse_device(&value()?)?),
            "--benchmark" => a.benchmark = true,
            "--variant" => a.variant = Some(value()?),
            "--layers" => a.layers = Some(number(value()?)?),
            "--width" => a.width = Some(number(value()?)?),
            "--heads" => a.heads = Some(number(value()?)?),
            "--seq" => a.seq = Some(number(value()?)?),
            "--vocab" => a.vocab = Some(number(value()?)?),
            "--image" => a.image = Some(number(value()?)?),
            "--classes" => a.classes = Some(number(value()?)?),
            "--profile-steps" => a.profile_steps = number(value()?)?,
            "--help" | "-h" => return Err(HELP.into()),
            other => return Err(format!("unknown flag {other} (--help lists them)")),
        }
    }
    a.model = match a.model_name.as_str() {
        "resnet50" => Model::Resnet50,
        "gpt2" => Model::Gpt2,
        other => return Err(format!("--model {other}: use resnet50 or gpt2")),
    };
    let sizes = [a.layers, a.width, a.heads, a.seq, a.vocab, a.image, a.classes];
    if a.batch == Some(0) || a.steps == 0 || a.epochs == 0 || a.data == 0 || sizes.contains(&Some(0)) {
        return Err("--batch-size, --steps, --epochs, --data and the model sizes must be positive".into());
    }
    let foreign = match a.model {
        Model::Resnet50 => vec![("--heads", a.heads), ("--seq", a.seq), ("--vocab", a.vocab)],
        Model::Gpt2 => vec![("--image", a.image), ("--classes", a.classes)],
    };
    if let Some((flag, _)) = foreign.iter().find(|(_, v)| v.is_some()) {
        return Err(format!("{flag} does not apply to --model {}", a.model_name));
    }
    Ok(a)
}

/// ResNet-50 with the sizes the flags change.
fn resnet_config(a: &Args) -> ResNetConfig {
    let full = ResNetConfig::resnet50();
    ResNetConfig {
        blocks: a.layers.map_or(full.blocks, |n| [n; 4]),
        width: a.width.unwrap_or(full.width),
        classes: a.classes.unwrap_or(full.classes),
        image: a.image.unwrap_or(full.image),
    }
}

/// GPT-2 small with the sizes the flags change (`--width N`: an MLP of 4·N).
fn gpt_config(a: &Args) -> GptConfig {
    let full = GptConfig::gpt2();
    GptConfig {
        layers: a.layers.unwrap_or(full.layers),
        d_model: a.width.unwrap_or(full.d_model),
        heads: a.heads.unwrap_or(full.heads),
        d_ff: a.width.map_or(full.d_ff, |w| 4 * w),
        vocab: a.vocab.unwrap_or(full.vocab),
        seq: a.seq.unwrap_or(full.seq),
    }
}

/// Trains model `M` of `config` as `a` says on `device`; returns the report and the batch.
fn run<M: CandleModel>(
    a: &Args,
    config: &M::Config,
    device: &Device,
    started: Instant,
) -> Result<(Report, usize), String> {
    let options = TrainOptions {
        batch: a.batch.unwrap_or(M::BATCH),
        steps: a.steps,
        epochs: a.epochs,
        data: a.data,
        lr: a.lr.unwrap_or(M::LR),
        dtype: a.dtype,
        stock: a.stock,
        profile_steps: a.profile_steps,
    };
    Ok((train::<M>(config, &options, device, started)?, options.batch))
}

fn main() {
    let started = Instant::now();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_candle_models: {e}");
            std::process::exit(2);
        }
    };
    let device = match args.gpu {
        Some(false) => Device::Cpu,
        wanted => match open_gpu() {
            Ok(d) => d,
            Err(e) if wanted == Some(true) => {
                eprintln!("train_candle_models: --device gpu, but {e}");
                std::process::exit(2);
            }
            Err(e) => {
                println!("note: no usable GPU ({e}); training on Candle's CPU device (float64 reference ops: slow)");
                Device::Cpu
            }
        },
    };
    if args.benchmark {
        let mut policy = cudnn_backend::plan::policy();
        policy.benchmark = true;
        cudnn_backend::plan::set_policy(policy);
    }
    let result = match args.model {
        Model::Resnet50 => run::<ResNet>(&args, &resnet_config(&args), &device, started),
        Model::Gpt2 => run::<Gpt>(&args, &gpt_config(&args), &device, started),
    };
    let (r, batch) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("train_candle_models: {e}");
            std::process::exit(1);
        }
    };
    let variant = args
        .variant
        .as_deref()
        .unwrap_or(if args.stock { "candle-stock" } else { "candle-fused" });
    let dtype = format!("{:?}", args.dtype).to_lowercase();
    r.print("train_candle_models", &args.model_name, variant, &dtype, batch);
}
