//! Trains a transformer encoder classifier (d_model 512, 8 heads, d_ff 2048, 4 post-norm
//! layers, GELU, sequences of 256 tokens) with Burn on `Autodiff<Cudnn>` (or Burn's ndarray
//! CPU backend) on a procedural task (examples/markers.rs): each sequence of background tokens
//! hides one marker token more often than the others, and the class is that marker. Reports
//! test accuracy (chance 10%), training throughput and kernel launches per step, and writes a
//! checkpoint and a PNG of the loss/accuracy curves.
//!
//! ```sh
//! cargo run --release --example train_transformer -- --epochs 3 --batch-size 32 --dtype bf16
//! ```
//! Flags: `--device gpu|cpu`, `--epochs N`, `--batch-size N`, `--dtype f32|f16|bf16`,
//! `--layers N`, `--seq N`, `--train N` / `--test N` (sequences), `--out DIR`, `--fusion`
//! (run on `Autodiff<CudnnFusion>`: burn-fusion's lazy queue with our fusers), `--stock`
//! (Burn's own `LayerNorm`, `MultiHeadAttention` and `Adam` instead of this crate's
//! drop-ins), `--host-profile FILE` (examples built with `--features host-profile`: where the
//! host time of the last epoch's steps goes), `--backend ours|burn-cuda` (default `ours`;
//! `burn-cuda`: the same `--stock` model on `Autodiff<burn::backend::Cuda>`, Burn's own CUDA
//! backend with burn-fusion and autotuning, for comparison; examples built with `--features
//! burn-cuda`; launches per step read `n/a` there, as this crate counts only its own). Dropout
//! is 0, as in the PyTorch reference of `bench/train_torch.py`.

#[path = "markers.rs"]
mod markers;

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Gelu, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{CompactRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, FloatDType, Int, Tensor, TensorData};
use cudnn_backend::burn::optim::FusedAdamConfig;
use cudnn_backend::burn::{Cudnn, CudnnDevice, CudnnFusion};
use examples::cli::BackendChoice;
use examples::curves::{plot, History};
use markers::{generate, Set, CLASSES, VOCAB};

const D_MODEL: usize = 512;
const HEADS: usize = 8;
const D_FF: usize = 2048;

/// Layer norm: Burn's (`--stock`) or this crate's drop-in.
#[derive(Module, Debug)]
struct Norm<B: Backend> {
    stock: Option<burn::nn::LayerNorm<B>>,
    fused: Option<cudnn_backend::burn::nn::LayerNorm<B>>,
}

impl<B: Backend> Norm<B> {
    fn new(stock: bool, device: &B::Device) -> Self {
        Self {
            stock: stock.then(|| burn::nn::LayerNormConfig::new(D_MODEL).init(device)),
            fused: (!stock).then(|| cudnn_backend::burn::nn::LayerNormConfig::new(D_MODEL).init(device)),
        }
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match (&self.stock, &self.fused) {
            (_, Some(n)) => n.forward(x),
            (Some(n), None) => n.forward(x),
            (None, None) => unreachable!("a Norm holds one of the two modules"),
        }
    }
}

/// Self-attention: Burn's (`--stock`) or this crate's drop-in.
#[derive(Module, Debug)]
struct Attention<B: Backend> {
    stock: Option<burn::nn::attention::MultiHeadAttention<B>>,
    fused: Option<cudnn_backend::burn::nn::MultiHeadAttention<B>>,
}

impl<B: Backend> Attention<B> {
    fn new(stock: bool, device: &B::Device) -> Self {
        Self {
            stock: stock.then(|| {
                burn::nn::attention::MultiHeadAttentionConfig::new(D_MODEL, HEADS)
                    .with_dropout(0.0)
                    .init(device)
            }),
            fused: (!stock).then(|| {
                cudnn_backend::burn::nn::MultiHeadAttentionConfig::new(D_MODEL, HEADS)
                    .with_dropout(0.0)
                    .init(device)
            }),
        }
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match (&self.stock, &self.fused) {
            (_, Some(m)) => m.forward(cudnn_backend::burn::nn::MhaInput::self_attn(x)).context,
            (Some(m), None) => m.forward(burn::nn::attention::MhaInput::self_attn(x)).context,
            (None, None) => unreachable!("an Attention holds one of the two modules"),
        }
    }
}

/// One post-norm encoder layer: `x = norm1(x + attn(x)); x = norm2(x + ff2(gelu(ff1(x))))`.
#[derive(Module, Debug)]
struct EncoderLayer<B: Backend> {
    attn: Attention<B>,
    norm1: Norm<B>,
    ff1: Linear<B>,
    ff2: Linear<B>,
    norm2: Norm<B>,
    gelu: Gelu,
}

impl<B: Backend> EncoderLayer<B> {
    fn new(stock: bool, device: &B::Device) -> Self {
        Self {
            attn: Attention::new(stock, device),
            norm1: Norm::new(stock, device),
            ff1: LinearConfig::new(D_MODEL, D_FF).init(device),
            ff2: LinearConfig::new(D_FF, D_MODEL).init(device),
            norm2: Norm::new(stock, device),
            gelu: Gelu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = self.norm1.forward(x.clone() + self.attn.forward(x));
        let ff = self.ff2.forward(self.gelu.forward(self.ff1.forward(x.clone())));
        self.norm2.forward(x + ff)
    }
}

/// Token and position embeddings → encoder layers → mean over the sequence → linear.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    layers: Vec<EncoderLayer<B>>,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(layers: usize, seq: usize, stock: bool, device: &B::Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, D_MODEL).init(device),
            positions: EmbeddingConfig::new(seq, D_MODEL).init(device),
            layers: (0..layers).map(|_| EncoderLayer::new(stock, device)).collect(),
            head: LinearConfig::new(D_MODEL, CLASSES).init(device),
        }
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let mut x = self.tokens.forward(tokens) + self.positions.forward(positions);
        for layer in &self.layers {
            x = layer.forward(x);
        }
        self.head.forward(x.mean_dim(1).reshape([batch, D_MODEL]))
    }
}

struct Args {
    gpu: Option<bool>,
    epochs: usize,
    batch: usize,
    dtype: FloatDType,
    layers: usize,
    seq: usize,
    stock: bool,
    fusion: bool,
    host_profile: Option<PathBuf>,
    backend: BackendChoice,
    train: usize,
    test: usize,
    lr: f64,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        gpu: None,
        epochs: 3,
        batch: 32,
        dtype: FloatDType::F32,
        layers: 4,
        seq: 256,
        stock: false,
        fusion: false,
        host_profile: None,
        backend: BackendChoice::Ours,
        train: 2048,
        test: 512,
        lr: 3e-4,
        out: PathBuf::from("out/train_transformer"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--device" => a.gpu = Some(examples::cli::parse_device(&value()?)?),
            "--epochs" => a.epochs = number(value()?)?,
            "--batch-size" => a.batch = number(value()?)?,
            "--layers" => a.layers = number(value()?)?,
            "--seq" => a.seq = number(value()?)?,
            "--train" => a.train = number(value()?)?,
            "--test" => a.test = number(value()?)?,
            "--lr" => a.lr = value()?.parse().map_err(|e| format!("--lr: {e}"))?,
            "--out" => a.out = PathBuf::from(value()?),
            "--stock" => a.stock = true,
            "--fusion" => a.fusion = true,
            "--host-profile" => a.host_profile = Some(PathBuf::from(value()?)),
            "--backend" => a.backend = examples::cli::parse_backend(&value()?)?,
            "--dtype" => a.dtype = examples::cli::parse_dtype(&value()?)?,
            "--help" | "-h" => {
                return Err(
                    "flags: --device gpu|cpu --epochs N --batch-size N --dtype f32|f16|bf16 --layers N \
                            --seq N --train N --test N --lr X --stock --fusion --backend ours|burn-cuda --host-profile FILE \
                            --out DIR"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.batch == 0 || a.epochs == 0 || a.seq < 20 {
        return Err("--batch-size and --epochs must be positive and --seq at least 20".into());
    }
    Ok(a)
}

fn token_tensor<B: Backend>(set: &Set, n: usize, seq: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::from_data(TensorData::new(set.tokens[..n * seq].to_vec(), [n, seq]), device)
}

fn label_tensor<B: Backend>(labels: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(labels.to_vec(), [labels.len()]), device)
}

/// Test accuracy in [0, 1].
fn evaluate<B: Backend>(model: &Net<B>, test: &Set, args: &Args, device: &B::Device) -> f64 {
    let n = test.labels.len();
    let tokens = token_tensor::<B>(test, n, args.seq, device);
    let labels = label_tensor::<B>(&test.labels, device);
    let mut correct = Tensor::<B, 1, Int>::zeros([1], device);
    let mut start = 0;
    while start < n {
        let m = args.batch.min(n - start);
        let rows = start..start + m;
        let x = tokens.clone().slice([rows.clone()]);
        let y = labels.clone().slice([rows]);
        let pred = model.forward(x).argmax(1).squeeze_dim::<1>(1);
        correct = correct + pred.equal(y).int().sum();
        start += m;
    }
    correct.into_scalar().elem::<f64>() / n as f64
}

fn run<B: AutodiffBackend>(device: &B::Device, args: &Args, label: &str) -> Result<(), String> {
    if args.stock {
        train::<B, _>(
            device,
            args,
            &format!("{label}, burn::nn modules"),
            AdamConfig::new().init(),
        )
    } else {
        train::<B, _>(
            device,
            args,
            &format!("{label}, fused modules"),
            FusedAdamConfig::new().init(),
        )
    }
}

fn train<B: AutodiffBackend, O: Optimizer<Net<B>, B>>(
    device: &B::Device,
    args: &Args,
    label: &str,
    mut optim: O,
) -> Result<(), String> {
    B::seed(device, 7);
    let train_set = generate(args.train, args.seq, 1);
    let test_set = generate(args.test, args.seq, 2);
    let steps = args.train / args.batch;
    if steps == 0 {
        return Err(format!("--batch-size {} is larger than the training set", args.batch));
    }
    let mut model = Net::<B>::new(args.layers, args.seq, args.stock, device);
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let tokens = token_tensor::<B>(&train_set, args.train, args.seq, device);
    let labels = label_tensor::<B>(&train_set.labels, device);
    let mut history = History::default();
    let (mut rate, mut launches_per_step) = (0.0, 0.0);
    for epoch in 1..=args.epochs {
        let bar = examples::curves::epoch_bar(steps, epoch, args.epochs)?;
        let t0 = Instant::now();
        let before = cudnn_backend::runtime::launch_counts();
        let replays_before = examples::startup::graph_replays();
        let threads_before = examples::host_profile::thread_times();
        // `--host-profile`: the last epoch's steps are sampled.
        let profile = match &args.host_profile {
            Some(path) if epoch == args.epochs => Some(examples::host_profile::Session::start(path)?),
            _ => None,
        };
        let mut loss_sum = Tensor::<B, 1>::zeros([1], device);
        for step in 0..steps {
            let rows = step * args.batch..(step + 1) * args.batch;
            let x = tokens.clone().slice([rows.clone()]);
            let y = labels.clone().slice([rows]);
            let loss = loss_fn.forward(model.forward(x), y);
            loss_sum = loss_sum + loss.clone().detach();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(args.lr, model, grads);
            if epoch == 1 && step == 0 {
                B::sync(device).map_err(|e| e.to_string())?;
                let started = *STARTED.get_or_init(Instant::now);
                if args.backend.counts_launches() {
                    eprintln!("{}", examples::startup::report(started));
                } else {
                    eprintln!("{}", examples::startup::first_step(started));
                }
                // Lazy fusion builds each new fused kernel in the background and runs the ops
                // unfused meanwhile; the first step saw every program of the network, so waiting
                // here makes the later steps (the measured ones) run fused.
                cudnn_backend::ops::wait_for_builds();
            }
            bar.inc(1);
        }
        let mean_loss = loss_sum.into_scalar().elem::<f64>() / steps as f64;
        B::sync(device).map_err(|e| e.to_string())?;
        if let Some(profile) = profile {
            profile.finish()?;
        }
        rate = (steps * args.batch) as f64 / t0.elapsed().as_secs_f64();
        let launches = cudnn_backend::runtime::launch_counts().since(&before);
        launches_per_step = launches.total() as f64 / steps as f64;
        if epoch == args.epochs && args.backend.counts_launches() {
            eprintln!(
                "{}",
                examples::startup::epoch_host_report(
                    &launches,
                    examples::startup::graph_replays() - replays_before,
                    &threads_before,
                    steps
                )
            );
        }
        let accuracy = evaluate(&model.valid(), &test_set, args, device);
        examples::curves::finish_epoch(
            &bar,
            format!(
                "{epoch}/{}: loss {mean_loss:.4}, test accuracy {:.2}%, {rate:.0} sequences/s",
                args.epochs,
                accuracy * 100.0
            ),
        );
        history.loss.push(mean_loss);
        history.accuracy.push(accuracy);
    }
    // Two runs in deterministic mode must print the same digest.
    println!("parameter digest: {}", examples::digest::parameters(&model)?);
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let checkpoint = args.out.join("model");
    CompactRecorder::new()
        .record(model.into_record(), checkpoint.clone())
        .map_err(|e| format!("saving {}: {e}", checkpoint.display()))?;
    let png = args.out.join("curves.png");
    plot(&history, &png)?;
    let accuracy = history.accuracy.last().copied().unwrap_or(0.0);
    println!("checkpoint: {}.mpk, curves: {}", checkpoint.display(), png.display());
    // Our launch counters do not see another backend's kernels.
    let launches = if args.backend.counts_launches() {
        format!("{launches_per_step:.0}")
    } else {
        "n/a".to_owned()
    };
    println!(
        "train_transformer {label} dtype={:?} batch={}: test accuracy {:.2}% (chance 10%), {rate:.1} sequences/s, \
         {launches} launches/step",
        args.dtype,
        args.batch,
        accuracy * 100.0
    );
    Ok(())
}

/// When `main` started (for the time to the first training step).
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// `--backend burn-cuda`: the `--stock` model on Burn's own CUDA backend (fused, autotuned).
#[cfg(feature = "burn-cuda")]
fn run_burn_cuda(args: &Args) -> Result<(), String> {
    let device = examples::cli::burn_cuda_device("train_transformer", args.dtype);
    run::<Autodiff<examples::cli::BurnCuda>>(&device, args, "gpu (burn-cuda, fusion, autotune)")
}

/// `--backend burn-cuda` in a build without the `burn-cuda` feature: exits with status 2.
#[cfg(not(feature = "burn-cuda"))]
fn run_burn_cuda(_args: &Args) -> Result<(), String> {
    examples::cli::burn_cuda_missing("train_transformer")
}

fn main() {
    STARTED.get_or_init(Instant::now);
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_transformer: {e}");
            std::process::exit(2);
        }
    };
    if args.backend == BackendChoice::BurnCuda {
        if let Some(conflict) = examples::cli::burn_cuda_flag_conflict(args.gpu, args.stock, args.fusion) {
            eprintln!("train_transformer: {conflict}");
            std::process::exit(2);
        }
        if let Err(e) = run_burn_cuda(&args) {
            eprintln!("train_transformer: {e}");
            std::process::exit(1);
        }
        return;
    }
    let device = CudnnDevice::default();
    let gpu = examples::cli::use_gpu("train_transformer", args.gpu, &device, args.dtype);
    let result = if gpu {
        if args.fusion {
            run::<Autodiff<CudnnFusion>>(&device, &args, "gpu (cudnn, lazy fusion)")
        } else {
            run::<Autodiff<Cudnn>>(&device, &args, "gpu (cudnn)")
        }
    } else {
        run::<Autodiff<NdArray>>(&Default::default(), &args, "cpu (ndarray)")
    };
    if let Err(e) = result {
        eprintln!("train_transformer: {e}");
        std::process::exit(1);
    }
}
