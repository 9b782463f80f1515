//! Trains the transformer encoder classifier of `train_transformer` (token and position
//! embeddings, post-norm encoder layers of d_model 512, 8 heads, d_ff 2048, GELU, mean pooling,
//! linear head; sequences of 256 tokens) on the same procedural marker task
//! (examples/markers.rs) with Candle: candle-nn's `VarMap`/`VarBuilder` and `Embedding`, this
//! crate's layers and optimizer, in a plain training loop. Reports test accuracy (chance 10%),
//! training throughput and this crate's launches per step, and writes a safetensors
//! checkpoint and a PNG of the loss/accuracy curves.
//!
//! By default the linear layers are `cudnn_backend::candle::nn::Linear` (one cuDNN matmul graph
//! with the bias, and GELU in the first feed-forward layer, fused), layer norm is
//! `cudnn_backend::candle::nn::LayerNorm` (fused forward and backward kernels), attention is
//! `cudnn_backend::candle::ops::sdpa_heads` on the projections as they come, heads side by
//! side (cuDNN's fused flash attention forward and backward for f16/bf16; for f32 the
//! engine's math path: cuDNN matmuls around one softmax kernel), the token embedding is
//! `cudnn_backend::candle::nn::Embedding` (its gradient one scatter-add) and the optimizer is
//! `cudnn_backend::candle::optim::FusedAdamW`. With `--stock` the same network uses
//! candle-nn's `Linear` and `Embedding`, candle-nn's composed layer norm (`ops::layer_norm_slow`: candle-nn's
//! fused layer norm has no backward pass), attention from Candle matmuls and softmax, and
//! candle-nn's `AdamW`. Weight decay is 0 in both (Adam, as `train_transformer` and PyTorch's
//! `bench/train_torch.py --model transformer`).
//!
//! ```sh
//! cargo run --release -p examples --features candle-cuda --example train_candle_transformer -- --dtype bf16
//! cargo run -p examples --features candle --example train_candle_transformer -- --device cpu --layers 1 --seq 32 --train 64 --test 32 --epochs 1
//! ```
//! Flags: `--device gpu|cpu` (default: the GPU when one is usable), `--epochs N`,
//! `--batch-size N`, `--dtype f32|f16|bf16` (the variables, optimizer state and compute
//! dtype, as `model.to(dtype)` in PyTorch and the backend's float dtype in Burn),
//! `--f32-weights` (with f16/bf16: f32 variables and optimizer state instead, cast to the
//! compute dtype once per step), `--layers N`, `--seq N`, `--train N` / `--test N`
//! (sequences), `--lr X`, `--out DIR`, `--stock`.
//!
//! On the CPU our ops run their float64 reference implementations: correct but slow, meant for
//! checking a program without a GPU (use a small model and set).

#[path = "markers.rs"]
mod markers;

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{AdamW, Embedding, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use cudnn_backend::candle::nn::LayerNormConfig;
use cudnn_backend::candle::optim::FusedAdamW;
use cudnn_backend::candle::Activation;
use examples::candle_models::layers::{Dense, Norm};
use examples::curves::{epoch_bar, finish_epoch, save_run, History};
use markers::{generate, Set, CLASSES, VOCAB};

const D_MODEL: usize = 512;
const HEADS: usize = 8;
const D_FF: usize = 2048;
const LN_EPS: f64 = 1e-5;

/// A linear layer of candle-nn's initialization ([`Dense`]: this crate's fused layer or
/// candle-nn's).
fn dense(d_in: usize, d_out: usize, act: Activation, stock: bool, vb: VarBuilder) -> Result<Dense> {
    let l = cudnn_backend::candle::nn::linear(d_in, d_out, vb)?;
    let bias = l
        .bias()
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg("linear without bias".into()))?;
    Ok(Dense {
        weight: l.weight().clone(),
        bias,
        act,
        stock,
    })
}

/// Layer norm over d_model ([`Norm`]: this crate's fused layer or candle-nn's composed one).
fn norm(stock: bool, vb: VarBuilder) -> Result<Norm> {
    let n = cudnn_backend::candle::nn::layer_norm(D_MODEL, LayerNormConfig::default(), vb)?;
    let bias = n
        .bias()
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg("layer norm without bias".into()))?;
    Ok(Norm {
        weight: n.weight().clone(),
        bias,
        eps: LN_EPS,
        stock,
    })
}

/// One post-norm encoder layer: `x = norm1(x + attn(x)); x = norm2(x + ff2(gelu(ff1(x))))`,
/// with separate query, key, value and output projections (as `burn::nn`'s attention).
#[derive(Clone)]
struct EncoderLayer {
    query: Dense,
    key: Dense,
    value: Dense,
    output: Dense,
    norm1: Norm,
    ff1: Dense,
    ff2: Dense,
    norm2: Norm,
    stock: bool,
}

impl EncoderLayer {
    fn new(stock: bool, vb: VarBuilder) -> Result<Self> {
        let dense = |d_in, d_out, act, name: &str| dense(d_in, d_out, act, stock, vb.pp(name));
        Ok(Self {
            query: dense(D_MODEL, D_MODEL, Activation::Identity, "query")?,
            key: dense(D_MODEL, D_MODEL, Activation::Identity, "key")?,
            value: dense(D_MODEL, D_MODEL, Activation::Identity, "value")?,
            output: dense(D_MODEL, D_MODEL, Activation::Identity, "output")?,
            norm1: norm(stock, vb.pp("norm1"))?,
            ff1: dense(D_MODEL, D_FF, Activation::Gelu, "ff1")?,
            ff2: dense(D_FF, D_MODEL, Activation::Identity, "ff2")?,
            norm2: norm(stock, vb.pp("norm2"))?,
            stock,
        })
    }

    fn cast(&self, dt: DType) -> Result<Self> {
        Ok(Self {
            query: self.query.cast(dt)?,
            key: self.key.cast(dt)?,
            value: self.value.cast(dt)?,
            output: self.output.cast(dt)?,
            norm1: self.norm1.cast(dt)?,
            ff1: self.ff1.cast(dt)?,
            ff2: self.ff2.cast(dt)?,
            norm2: self.norm2.cast(dt)?,
            stock: self.stock,
        })
    }

    /// Multi-head self-attention of `x` (batch, seq, d_model).
    fn attention(&self, x: &Tensor) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let dh = D_MODEL / HEADS;
        let scale = 1.0 / (dh as f64).sqrt();
        let (q, k, v) = (self.query.forward(x)?, self.key.forward(x)?, self.value.forward(x)?);
        let o = if self.stock {
            // (batch, seq, d_model) → (batch, heads, seq, head dim) and back.
            let heads = |t: Tensor| t.reshape((b, s, HEADS, dh))?.transpose(1, 2)?.contiguous();
            let (q, k, v) = (heads(q)?, heads(k)?, heads(v)?);
            let scores = (q.matmul(&k.t()?)? * scale)?;
            let o = candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v)?;
            o.transpose(1, 2)?.reshape((b, s, D_MODEL))?
        } else {
            // The heads stay side by side in the projections' last dim, in both passes.
            cudnn_backend::candle::ops::sdpa_heads(&q, &k, &v, HEADS, scale, false)?
        };
        self.output.forward(&o)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.norm1.forward(&(x + self.attention(x)?)?)?;
        let ff = self.ff2.forward(&self.ff1.forward(&x)?)?;
        self.norm2.forward(&(x + ff)?)
    }
}

/// Token and position embeddings → encoder layers → mean over the sequence → linear.
#[derive(Clone)]
struct Net {
    tokens: Tensor,
    positions: Tensor,
    /// candle-nn's embedding lookup (`--stock`) instead of ours.
    stock: bool,
    layers: Vec<EncoderLayer>,
    head: Dense,
}

impl Net {
    fn new(layers: usize, seq: usize, stock: bool, vb: VarBuilder) -> Result<Self> {
        let tokens = candle_nn::embedding(VOCAB, D_MODEL, vb.pp("tokens"))?
            .embeddings()
            .clone();
        let positions = candle_nn::embedding(seq, D_MODEL, vb.pp("positions"))?
            .embeddings()
            .clone();
        Ok(Self {
            tokens,
            positions,
            stock,
            layers: (0..layers)
                .map(|i| EncoderLayer::new(stock, vb.pp(format!("layers.{i}"))))
                .collect::<Result<_>>()?,
            head: dense(D_MODEL, CLASSES, Activation::Identity, stock, vb.pp("head"))?,
        })
    }

    /// The network computing in `dt` (a no-op when the variables are `dt`): called once per
    /// step, so with `--f32-weights` the optimizer updates the f32 variables and every step
    /// casts them afresh.
    fn cast(&self, dt: DType) -> Result<Self> {
        if self.tokens.dtype() == dt {
            return Ok(self.clone());
        }
        Ok(Self {
            tokens: self.tokens.to_dtype(dt)?,
            positions: self.positions.to_dtype(dt)?,
            stock: self.stock,
            layers: self.layers.iter().map(|l| l.cast(dt)).collect::<Result<_>>()?,
            head: self.head.cast(dt)?,
        })
    }

    /// Logits (batch, classes) in f32 for tokens (batch, seq) (u32).
    fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let (_, seq) = tokens.dims2()?;
        let x = if self.stock {
            Embedding::new(self.tokens.clone(), D_MODEL).forward(tokens)?
        } else {
            cudnn_backend::candle::nn::Embedding::new(self.tokens.clone(), D_MODEL).forward(tokens)?
        };
        let mut x = x.broadcast_add(&self.positions.narrow(0, 0, seq)?.unsqueeze(0)?)?;
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        self.head.forward(&x.mean(1)?)?.to_dtype(DType::F32)
    }
}

/// The optimizer of the run (Adam: weight decay 0).
enum Trainer {
    Fused(FusedAdamW),
    Stock(AdamW),
}

impl Trainer {
    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()> {
        match self {
            Trainer::Fused(o) => o.step(grads),
            Trainer::Stock(o) => o.step(grads),
        }
    }
}

struct Args {
    gpu: Option<bool>,
    epochs: usize,
    batch: usize,
    dtype: DType,
    layers: usize,
    seq: usize,
    train: usize,
    test: usize,
    lr: f64,
    out: PathBuf,
    stock: bool,
    f32_weights: bool,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a = Args {
        gpu: None,
        epochs: 3,
        batch: 32,
        dtype: DType::F32,
        layers: 4,
        seq: 256,
        train: 2048,
        test: 512,
        lr: 3e-4,
        out: PathBuf::from("out/train_candle_transformer"),
        stock: false,
        f32_weights: false,
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
            "--f32-weights" => a.f32_weights = true,
            // Accepted for train-bench.sh, which passes it to every CNN and Candle program:
            // this network has no convolutions to autotune.
            "--benchmark" => {}
            "--dtype" => a.dtype = examples::cli::parse_candle_dtype(&value()?)?,
            "--help" | "-h" => {
                return Err(
                    "flags: --device gpu|cpu --epochs N --batch-size N --dtype f32|f16|bf16 --layers N \
                            --seq N --train N --test N --lr X --out DIR --stock --f32-weights"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.batch == 0 || a.epochs == 0 || a.test == 0 || a.seq < 20 {
        return Err("--batch-size, --epochs and --test must be positive and --seq at least 20".into());
    }
    Ok(a)
}

/// The tokens (n, seq) (u32) and labels (n) (u32) of a set on `dev`.
fn to_device(set: &Set, seq: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
    let n = set.labels.len();
    let tokens: Vec<u32> = set.tokens.iter().map(|&t| t as u32).collect();
    let labels: Vec<u32> = set.labels.iter().map(|&l| l as u32).collect();
    Ok((
        Tensor::from_vec(tokens, (n, seq), dev)?,
        Tensor::from_vec(labels, n, dev)?,
    ))
}

/// Test accuracy in [0, 1].
fn evaluate(net: &Net, x: &Tensor, y: &Tensor, batch: usize) -> Result<f64> {
    let n = y.dim(0)?;
    let mut correct = Tensor::zeros((), DType::F32, x.device())?;
    let mut start = 0;
    while start < n {
        let m = batch.min(n - start);
        let hits = net
            .forward(&x.narrow(0, start, m)?)?
            .argmax(1)?
            .eq(&y.narrow(0, start, m)?)?
            .to_dtype(DType::F32)?
            .sum_all()?;
        correct = (correct + hits)?;
        start += m;
    }
    Ok(correct.to_scalar::<f32>()? as f64 / n as f64)
}

/// Trains and reports.
fn run(dev: &Device, args: &Args, label: &str) -> std::result::Result<(), String> {
    let err = |e: candle_core::Error| e.to_string();
    if dev.is_cuda() {
        dev.set_seed(7).map_err(err)?;
    }
    let train = generate(args.train, args.seq, 1);
    let test = generate(args.test, args.seq, 2);
    let steps = args.train / args.batch;
    if steps == 0 {
        return Err(format!("--batch-size {} is larger than the training set", args.batch));
    }
    let varmap = VarMap::new();
    let weights = if args.f32_weights { DType::F32 } else { args.dtype };
    let net = Net::new(
        args.layers,
        args.seq,
        args.stock,
        VarBuilder::from_varmap(&varmap, weights, dev),
    )
    .map_err(err)?;
    let params = ParamsAdamW {
        lr: args.lr,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut optim = if args.stock {
        Trainer::Stock(AdamW::new(varmap.all_vars(), params).map_err(err)?)
    } else {
        Trainer::Fused(FusedAdamW::new(varmap.all_vars(), params).map_err(err)?)
    };
    let (train_x, train_y) = to_device(&train, args.seq, dev).map_err(err)?;
    let (test_x, test_y) = to_device(&test, args.seq, dev).map_err(err)?;
    let mut history = History::default();
    let (mut rate, mut launches_per_step) = (0.0, 0.0);
    for epoch in 1..=args.epochs {
        let bar = epoch_bar(steps, epoch, args.epochs)?;
        let started = Instant::now();
        let before = cudnn_backend::runtime::launch_counts();
        let mut loss_sum = Tensor::zeros((), DType::F32, dev).map_err(err)?;
        for step in 0..steps {
            let step_loss = (|| -> Result<Tensor> {
                let x = train_x.narrow(0, step * args.batch, args.batch)?;
                let y = train_y.narrow(0, step * args.batch, args.batch)?;
                let loss = candle_nn::loss::cross_entropy(&net.cast(args.dtype)?.forward(&x)?, &y)?;
                optim.step(&loss.backward()?)?;
                Ok(loss.detach())
            })();
            loss_sum = (loss_sum + step_loss.map_err(err)?).map_err(err)?;
            bar.inc(1);
        }
        let mean_loss = loss_sum.to_scalar::<f32>().map_err(err)? as f64 / steps as f64;
        dev.synchronize().map_err(err)?;
        rate = (steps * args.batch) as f64 / started.elapsed().as_secs_f64();
        launches_per_step = cudnn_backend::runtime::launch_counts().since(&before).total() as f64 / steps as f64;
        let accuracy = evaluate(&net.cast(args.dtype).map_err(err)?, &test_x, &test_y, args.batch).map_err(err)?;
        let summary = format!(
            "{epoch}/{}: loss {mean_loss:.4}, test accuracy {:.2}%, {rate:.1} sequences/s",
            args.epochs,
            accuracy * 100.0
        );
        finish_epoch(&bar, summary);
        history.push_epoch(epoch, mean_loss, accuracy)?;
    }
    save_run(&args.out, "model.safetensors", &history, |path| {
        varmap.save(path).map_err(err)
    })?;
    // Two runs in deterministic mode (`CUDNN_BACKEND_MODE=deterministic`) must print the same
    // digest.
    println!("parameter digest: {}", examples::digest::candle_variables(&varmap)?);
    println!(
        "train_candle_transformer {label} dtype={:?} batch={}: test accuracy {:.2}% (chance 10%), {rate:.1} \
         sequences/s, {launches_per_step:.0} launches/step",
        args.dtype,
        args.batch,
        history.accuracy.last().copied().unwrap_or(0.0) * 100.0
    );
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_candle_transformer: {e}");
            std::process::exit(2);
        }
    };
    let gpu = match args.gpu {
        Some(false) => None,
        wanted => match Device::new_cuda(0) {
            Ok(d) => Some(d),
            Err(e) if wanted == Some(true) => {
                eprintln!("train_candle_transformer: --device gpu, but {e}");
                std::process::exit(2);
            }
            Err(e) => {
                println!("note: no usable GPU ({e}); training on Candle's CPU device (float64 reference ops: slow)");
                None
            }
        },
    };
    let variant = if args.stock { "stock" } else { "fused" };
    let result = match &gpu {
        Some(dev) => run(dev, &args, &format!("gpu (cudnn, {variant})")),
        None => run(&Device::Cpu, &args, &format!("cpu (candle, {variant})")),
    };
    if let Err(e) = result {
        eprintln!("train_candle_transformer: {e}");
        std::process::exit(1);
    }
}
