//! Trains the small ResNet-style CNN of `train_burn` on the same procedurally drawn "shapes"
//! set (examples/shapes.rs) with Candle: candle-nn's `VarMap`/`VarBuilder`, our layers
//! (`cudnn_backend::candle::nn` Conv2d, BatchNorm, Linear), our pooling (`CudnnExt`) and our
//! `FusedAdamW`, in a plain training loop. Reports test accuracy and training throughput, and
//! writes a safetensors checkpoint and a PNG of the loss/accuracy curves.
//!
//! By default batch norm trains on the fused op (batch statistics, running update, ReLU, each
//! residual block's `+ skip` and the backward pass in the engine's kernels) and the optimizer is
//! `cudnn_backend::candle::optim::FusedAdamW` (one launch per 32 variables per step); with
//! `--stock` it is the same network with batch norm composed of Candle ops and candle-nn's
//! `AdamW`. The last line reports this crate's kernel launches and cuDNN executions per
//! training step (Candle's own kernels are not counted).
//!
//! ```sh
//! cargo run --release -p examples --features candle-cuda --example train_candle -- --epochs 5
//! cargo run -p examples --features candle --example train_candle -- --device cpu --epochs 1 --train 256 --test 128
//! ```
//! Flags: `--device gpu|cpu` (default: the GPU when one is usable, else Candle's CPU device),
//! `--epochs N`, `--batch-size N`, `--dtype f32|f16|bf16` (compute dtype; the weights and the
//! optimizer state stay f32), `--benchmark` (cuDNN autotuning, like
//! `torch.backends.cudnn.benchmark`), `--optimizer adamw|sgd`, `--lr X`, `--train N` /
//! `--test N` (set sizes), `--out DIR`, `--stock` (composed batch norm and candle-nn's AdamW
//! instead of the fused ones), `--devices N` (data-parallel training on GPUs 0..N through
//! NCCL: `--batch-size` images per GPU, gradients averaged in one all-reduce per step).
//!
//! On the CPU our ops run their float64 reference implementations: correct but slow, meant for
//! checking a program without a GPU (use small `--train`/`--test`).

#[path = "shapes.rs"]
#[allow(dead_code)] // Split::batch: this example slices device tensors instead
mod shapes;

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Module, ModuleT, Result, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap, SGD};
use cudnn_backend::candle::nn::{
    batch_norm, conv2d_no_bias, linear, BatchNorm, BatchNormConfig, Conv2d, Conv2dConfig, Linear,
};
use cudnn_backend::candle::optim::FusedAdamW;
use cudnn_backend::candle::CudnnExt;
use examples::candle_models::open_gpu;
use examples::curves::{epoch_bar, finish_epoch, save_run, History};

/// conv (no bias) → batch norm (fused in training unless `stock`).
#[derive(Clone)]
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm,
}

impl ConvBn {
    fn new(cin: usize, cout: usize, kernel: usize, stock: bool, vb: VarBuilder) -> Result<Self> {
        let cfg = Conv2dConfig {
            padding: kernel / 2,
            ..Default::default()
        };
        Ok(Self {
            conv: conv2d_no_bias(cin, cout, kernel, cfg, vb.pp("conv"))?,
            bn: batch_norm(cout, BatchNormConfig::default(), vb.pp("bn"))?.with_fused_training(!stock),
        })
    }

    /// The same layer computing in `dt`: the filter cast (autograd flows back to the f32
    /// variable); batch norm keeps f32 parameters and statistics for any input dtype.
    fn cast(&self, dt: DType) -> Result<Self> {
        Ok(Self {
            conv: Conv2d::from_weights(self.conv.weight().to_dtype(dt)?, None, *self.conv.config()),
            bn: self.bn.clone(),
        })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.bn.forward_t(&self.conv.forward(x)?, train)
    }

    /// `relu(forward(x))`: the ReLU runs inside the fused batch norm in training.
    fn forward_relu(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.bn.forward_relu_t(&self.conv.forward(x)?, train)
    }

    /// `relu(forward(x) + residual)`: the add and the ReLU run inside the fused batch norm in
    /// training.
    fn forward_add_relu(&self, x: &Tensor, residual: &Tensor, train: bool) -> Result<Tensor> {
        self.bn.forward_add_relu_t(&self.conv.forward(x)?, residual, train)
    }
}

/// A residual block: relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)).
#[derive(Clone)]
struct Residual {
    a: ConvBn,
    b: ConvBn,
    shortcut: Option<ConvBn>,
}

impl Residual {
    fn new(cin: usize, cout: usize, stock: bool, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            a: ConvBn::new(cin, cout, 3, stock, vb.pp("a"))?,
            b: ConvBn::new(cout, cout, 3, stock, vb.pp("b"))?,
            shortcut: if cin != cout {
                Some(ConvBn::new(cin, cout, 1, stock, vb.pp("shortcut"))?)
            } else {
                None
            },
        })
    }

    fn cast(&self, dt: DType) -> Result<Self> {
        Ok(Self {
            a: self.a.cast(dt)?,
            b: self.b.cast(dt)?,
            shortcut: self.shortcut.as_ref().map(|s| s.cast(dt)).transpose()?,
        })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let skip = match &self.shortcut {
            Some(s) => s.forward(x, train)?,
            None => x.clone(),
        };
        self.b.forward_add_relu(&self.a.forward_relu(x, train)?, &skip, train)
    }
}

/// stem → block(32) → maxpool → block(64) → maxpool → block(128) → global avg pool → linear.
#[derive(Clone)]
struct Net {
    stem: ConvBn,
    block1: Residual,
    block2: Residual,
    block3: Residual,
    head: Linear,
}

impl Net {
    fn new(stock: bool, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            stem: ConvBn::new(3, 32, 3, stock, vb.pp("stem"))?,
            block1: Residual::new(32, 32, stock, vb.pp("block1"))?,
            block2: Residual::new(32, 64, stock, vb.pp("block2"))?,
            block3: Residual::new(64, 128, stock, vb.pp("block3"))?,
            head: linear(128, shapes::CLASSES, vb.pp("head"))?,
        })
    }

    /// The network computing in `dt` (a no-op for f32): called once per step, so the
    /// optimizer updates the f32 variables and every step casts them afresh.
    fn cast(&self, dt: DType) -> Result<Self> {
        if dt == DType::F32 {
            return Ok(self.clone());
        }
        let b = self.head.bias().map(|b| b.to_dtype(dt)).transpose()?;
        Ok(Self {
            stem: self.stem.cast(dt)?,
            block1: self.block1.cast(dt)?,
            block2: self.block2.cast(dt)?,
            block3: self.block3.cast(dt)?,
            head: Linear::new(self.head.weight().to_dtype(dt)?, b),
        })
    }

    /// Logits (N, classes) in f32 for images (N, 3, 32, 32) in the compute dtype.
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let max_pool = |x: Tensor| x.cudnn_max_pool2d([2, 2], [2, 2], [0, 0]);
        let x = self.stem.forward_relu(x, train)?;
        let x = max_pool(self.block1.forward(&x, train)?)?;
        let x = max_pool(self.block2.forward(&x, train)?)?;
        let x = self.block3.forward(&x, train)?;
        let (_, _, h, w) = x.dims4()?;
        let x = x.cudnn_avg_pool2d([h, w], [h, w], [0, 0], true)?.flatten_from(1)?;
        self.head.forward(&x)?.to_dtype(DType::F32)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Optim {
    AdamW,
    Sgd,
}

/// The optimizer of the run, over every variable of the `VarMap` (the batch norms' running
/// statistics get no gradient, so the optimizers leave them alone).
enum Trainer {
    FusedAdamW(FusedAdamW),
    AdamW(AdamW),
    Sgd(SGD),
}

impl Trainer {
    /// The optimizer `args` ask for over every variable of `varmap`.
    fn new(args: &Args, varmap: &VarMap) -> Result<Self> {
        Ok(match args.optimizer {
            Optim::AdamW => {
                let params = ParamsAdamW {
                    lr: args.lr.unwrap_or(1e-3),
                    weight_decay: 0.0,
                    ..Default::default()
                };
                if args.stock {
                    Trainer::AdamW(AdamW::new(varmap.all_vars(), params)?)
                } else {
                    Trainer::FusedAdamW(FusedAdamW::new(varmap.all_vars(), params)?)
                }
            }
            Optim::Sgd => Trainer::Sgd(SGD::new(varmap.all_vars(), args.lr.unwrap_or(0.05))?),
        })
    }

    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> Result<()> {
        match self {
            Trainer::FusedAdamW(o) => o.step(grads),
            Trainer::AdamW(o) => o.step(grads),
            Trainer::Sgd(o) => o.step(grads),
        }
    }
}

struct Args {
    gpu: Option<bool>,
    epochs: usize,
    batch: usize,
    dtype: DType,
    benchmark: bool,
    optimizer: Optim,
    lr: Option<f64>,
    train: usize,
    test: usize,
    out: PathBuf,
    stock: bool,
    devices: usize,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a = Args {
        gpu: None,
        epochs: 5,
        batch: 128,
        dtype: DType::F32,
        benchmark: false,
        optimizer: Optim::AdamW,
        lr: None,
        train: 10_000,
        test: 2_000,
        out: PathBuf::from("out/train_candle"),
        stock: false,
        devices: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--device" => a.gpu = Some(examples::cli::parse_device(&value()?)?),
            "--epochs" => a.epochs = number(value()?)?,
            "--batch-size" => a.batch = number(value()?)?,
            "--train" => a.train = number(value()?)?,
            "--test" => a.test = number(value()?)?,
            "--out" => a.out = PathBuf::from(value()?),
            "--benchmark" => a.benchmark = true,
            "--stock" => a.stock = true,
            "--devices" => a.devices = number(value()?)?,
            "--lr" => a.lr = Some(value()?.parse::<f64>().map_err(|e| format!("--lr: {e}"))?),
            "--optimizer" => {
                a.optimizer = match value()?.as_str() {
                    "adamw" | "adam" => Optim::AdamW,
                    "sgd" => Optim::Sgd,
                    other => return Err(format!("--optimizer {other}: use adamw or sgd")),
                }
            }
            "--dtype" => a.dtype = examples::cli::parse_candle_dtype(&value()?)?,
            "--help" | "-h" => {
                return Err(
                    "flags: --device gpu|cpu --epochs N --batch-size N --dtype f32|f16|bf16 --benchmark \
                            --optimizer adamw|sgd --lr X --train N --test N --out DIR --stock --devices N"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.batch == 0 || a.epochs == 0 || a.test == 0 || a.devices == 0 {
        return Err("--batch-size, --epochs, --test and --devices must be positive".into());
    }
    if a.devices > 1 && a.gpu == Some(false) {
        return Err("--devices N (N > 1) trains on N GPUs; it does not take --device cpu".into());
    }
    Ok(a)
}

/// The images (N, 3, 32, 32) and labels (N, u32) of a split on `dev`.
fn to_device(split: &shapes::Split, dev: &Device) -> Result<(Tensor, Tensor)> {
    let n = split.labels.len();
    let x = Tensor::from_slice(&split.images, (n, 3, shapes::SIDE, shapes::SIDE), dev)?;
    let labels: Vec<u32> = split.labels.iter().map(|&l| l as u32).collect();
    Ok((x, Tensor::from_vec(labels, n, dev)?))
}

/// Test accuracy in [0, 1] (inference mode: batch norm uses its running statistics).
fn evaluate(net: &Net, x: &Tensor, y: &Tensor, batch: usize, dt: DType) -> Result<f64> {
    let n = y.dim(0)?;
    let mut correct = Tensor::zeros((), DType::F32, x.device())?;
    let mut start = 0;
    while start < n {
        let m = batch.min(n - start);
        let logits = net.forward(&x.narrow(0, start, m)?.to_dtype(dt)?, false)?;
        let hits = logits
            .argmax(1)?
            .eq(&y.narrow(0, start, m)?)?
            .to_dtype(DType::F32)?
            .sum_all()?;
        correct = (correct + hits)?;
        start += m;
    }
    Ok(correct.to_scalar::<f32>()? as f64 / n as f64)
}

/// Trains and reports; returns (test accuracy, images/s of the last epoch).
fn run(dev: &Device, args: &Args, label: &str) -> std::result::Result<(f64, f64), String> {
    let err = |e: candle_core::Error| e.to_string();
    if dev.is_cuda() {
        dev.set_seed(2024).map_err(err)?; // Candle's CPU device draws from an unseeded generator
    }
    let train = shapes::generate(args.train, 1);
    let test = shapes::generate(args.test, 2);
    let steps = train.labels.len() / args.batch;
    if steps == 0 {
        return Err(format!("--batch-size {} is larger than the training set", args.batch));
    }
    let varmap = VarMap::new();
    let net = Net::new(args.stock, VarBuilder::from_varmap(&varmap, DType::F32, dev)).map_err(err)?;
    let mut optim = Trainer::new(args, &varmap).map_err(err)?;
    // Both sets live on the device; batches are views (no copies).
    let (train_x, train_y) = to_device(&train, dev).map_err(err)?;
    let (test_x, test_y) = to_device(&test, dev).map_err(err)?;
    let mut history = History::default();
    let mut last_rate = 0.0;
    let mut launches_per_step = 0.0;
    for epoch in 1..=args.epochs {
        let bar = epoch_bar(steps, epoch, args.epochs)?;
        let started = Instant::now();
        let launches_before = cudnn_backend::runtime::launch_counts();
        let mut loss_sum = Tensor::zeros((), DType::F32, dev).map_err(err)?;
        for step in 0..steps {
            let step_result = (|| -> Result<Tensor> {
                let x = train_x.narrow(0, step * args.batch, args.batch)?.to_dtype(args.dtype)?;
                let y = train_y.narrow(0, step * args.batch, args.batch)?;
                let logits = net.cast(args.dtype)?.forward(&x, true)?;
                let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
                optim.step(&loss.backward()?)?;
                loss.detach().to_dtype(DType::F32)
            })();
            loss_sum = (loss_sum + step_result.map_err(err)?).map_err(err)?;
            bar.inc(1);
        }
        let mean_loss = loss_sum.to_scalar::<f32>().map_err(err)? as f64 / steps as f64;
        dev.synchronize().map_err(err)?;
        let launches = cudnn_backend::runtime::launch_counts().since(&launches_before);
        launches_per_step = launches.total() as f64 / steps as f64;
        let seconds = started.elapsed().as_secs_f64();
        last_rate = (steps * args.batch) as f64 / seconds;
        let accuracy = evaluate(
            &net.cast(args.dtype).map_err(err)?,
            &test_x,
            &test_y,
            args.batch,
            args.dtype,
        )
        .map_err(err)?;
        let summary = format!(
            "{epoch}/{}: loss {mean_loss:.4}, test accuracy {:.2}%, {} images/s",
            args.epochs,
            accuracy * 100.0,
            rate(last_rate)
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
    let accuracy = *history.accuracy.last().unwrap_or(&0.0);
    println!(
        "train_candle {label} dtype={:?} batch={}: test accuracy {:.2}% (chance 10%), {} images/s, \
         {launches_per_step:.0} launches/step",
        args.dtype,
        args.batch,
        accuracy * 100.0,
        rate(last_rate)
    );
    Ok((accuracy, last_rate))
}

/// `--devices N`: data-parallel training on GPUs 0..N, one thread, model replica and NCCL
/// rank per GPU. The replicas start from rank 0's weights (broadcast); each step, every rank
/// runs `--batch-size` images of the global batch, and the gradients are averaged in one
/// all-reduce of all of them flattened into one buffer (one bucket) before each optimizer
/// step. Reports replica 0's test accuracy and the images/s of all GPUs, and checks that the
/// replicas ended bit-identical.
fn run_devices(args: &Args) -> std::result::Result<(f64, f64), String> {
    use cudnn_backend::candle::collective::{all_reduce, broadcast};
    use cudnn_backend::collective::{timeout_from_env, Communicator, ReduceOp, UniqueId};

    let n = args.devices;
    let err = |e: candle_core::Error| e.to_string();
    let train = shapes::generate(args.train, 1);
    let test = shapes::generate(args.test, 2);
    let steps = train.labels.len() / (args.batch * n);
    if steps == 0 {
        return Err(format!(
            "--batch-size {} on {n} GPUs is larger than the training set",
            args.batch
        ));
    }
    let id = UniqueId::new().map_err(|e| e.to_string())?;
    let barrier = std::sync::Barrier::new(n);
    type Replica = std::result::Result<(Vec<f32>, Vec<(f64, f64)>, f64), String>;
    let results: Vec<Replica> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (train, test, barrier) = (&train, &test, &barrier);
                s.spawn(move || -> Replica {
                    let dev = Device::new_cuda(rank).map_err(err)?;
                    dev.set_seed(2024 + rank as u64).map_err(err)?;
                    let ours = cudnn_backend::Device::new(rank).map_err(|e| e.to_string())?;
                    let comm =
                        Communicator::init_rank(&ours, rank, n, &id, timeout_from_env()).map_err(|e| e.to_string())?;
                    let varmap = VarMap::new();
                    let net = Net::new(args.stock, VarBuilder::from_varmap(&varmap, DType::F32, &dev)).map_err(err)?;
                    // Every rank walks the variables in the same (name) order: the broadcasts
                    // and the flattened gradient bucket must line up across ranks, and a
                    // VarMap's own order is its hash map's, different in every instance.
                    let mut named: Vec<(String, candle_core::Var)> = varmap
                        .data()
                        .lock()
                        .map_err(|_| "the VarMap's lock is poisoned".to_string())?
                        .iter()
                        .map(|(name, v)| (name.clone(), v.clone()))
                        .collect();
                    named.sort_by(|a, b| a.0.cmp(&b.0));
                    let vars: Vec<candle_core::Var> = named.iter().map(|(_, v)| v.clone()).collect();
                    for v in &vars {
                        v.set(&broadcast(v.as_tensor(), &comm, 0).map_err(err)?).map_err(err)?;
                    }
                    let mut optim = Trainer::new(args, &varmap).map_err(err)?;
                    let (train_x, train_y) = to_device(train, &dev).map_err(err)?;
                    let mut epochs = Vec::new();
                    for _ in 0..args.epochs {
                        dev.synchronize().map_err(err)?;
                        barrier.wait();
                        let started = Instant::now();
                        let mut loss_sum = Tensor::zeros((), DType::F32, &dev).map_err(err)?;
                        for step in 0..steps {
                            let step_result = (|| -> Result<Tensor> {
                                let first = (step * n + rank) * args.batch;
                                let x = train_x.narrow(0, first, args.batch)?.to_dtype(args.dtype)?;
                                let y = train_y.narrow(0, first, args.batch)?;
                                let logits = net.cast(args.dtype)?.forward(&x, true)?;
                                let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
                                let mut grads = loss.backward()?;
                                let with_grad: Vec<&candle_core::Var> =
                                    vars.iter().filter(|v| grads.get(v.as_tensor()).is_some()).collect();
                                let flat: Vec<Tensor> = with_grad
                                    .iter()
                                    .filter_map(|v| grads.get(v.as_tensor()))
                                    .map(|g| g.flatten_all())
                                    .collect::<Result<_>>()?;
                                let mean = all_reduce(&Tensor::cat(&flat, 0)?, &comm, ReduceOp::Mean)?;
                                let mut offset = 0;
                                for v in with_grad {
                                    let len = v.as_tensor().elem_count();
                                    let g = mean.narrow(0, offset, len)?.reshape(v.as_tensor().shape())?;
                                    grads.insert(v.as_tensor(), g);
                                    offset += len;
                                }
                                optim.step(&grads)?;
                                loss.detach().to_dtype(DType::F32)
                            })();
                            loss_sum = (loss_sum + step_result.map_err(err)?).map_err(err)?;
                        }
                        let mean_loss = loss_sum.to_scalar::<f32>().map_err(err)? as f64 / steps as f64;
                        dev.synchronize().map_err(err)?;
                        barrier.wait();
                        epochs.push((mean_loss, started.elapsed().as_secs_f64()));
                    }
                    comm.synchronize().map_err(|e| e.to_string())?;
                    // The trained variables only: each replica's batch norms track the
                    // running statistics of their own shard.
                    let flat: Vec<Tensor> = named
                        .iter()
                        .filter(|(name, _)| !name.contains("running_"))
                        .map(|(_, v)| v.as_tensor().flatten_all())
                        .collect::<Result<_>>()
                        .map_err(err)?;
                    let weights = Tensor::cat(&flat, 0).and_then(|t| t.to_vec1::<f32>()).map_err(err)?;
                    let accuracy = if rank == 0 {
                        let (test_x, test_y) = to_device(test, &dev).map_err(err)?;
                        evaluate(
                            &net.cast(args.dtype).map_err(err)?,
                            &test_x,
                            &test_y,
                            args.batch,
                            args.dtype,
                        )
                        .map_err(err)?
                    } else {
                        0.0
                    };
                    Ok((weights, epochs, accuracy))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a training thread panicked".into())))
            .collect()
    });
    let results = results.into_iter().collect::<std::result::Result<Vec<_>, _>>()?;
    let identical = results.iter().all(|r| r.0 == results[0].0);
    let mut last_rate = 0.0;
    for (epoch, (loss, _)) in results[0].1.iter().enumerate() {
        let seconds = results.iter().map(|r| r.1[epoch].1).fold(0.0, f64::max);
        last_rate = (steps * args.batch * n) as f64 / seconds;
        println!(
            "epoch {}/{}: loss {loss:.4} (GPU 0's shards), {} images/s on {n} GPUs",
            epoch + 1,
            args.epochs,
            rate(last_rate)
        );
    }
    let accuracy = results[0].2;
    let variant = if args.stock { "stock" } else { "fused" };
    println!(
        "train_candle {n} GPUs (cudnn, {variant}, data parallel) dtype={:?} batch={} per GPU: test accuracy {:.2}% \
         (chance 10%), {} images/s, replicas identical: {identical}",
        args.dtype,
        args.batch,
        accuracy * 100.0,
        rate(last_rate)
    );
    if !identical {
        return Err("the replicas' weights diverged".into());
    }
    Ok((accuracy, last_rate))
}

/// Images per second: whole numbers, with decimals below 10 (the CPU reference ops).
fn rate(r: f64) -> String {
    if r < 10.0 {
        format!("{r:.2}")
    } else {
        format!("{r:.0}")
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_candle: {e}");
            std::process::exit(2);
        }
    };
    if args.devices > 1 {
        if args.benchmark {
            let mut policy = cudnn_backend::plan::policy();
            policy.benchmark = true;
            cudnn_backend::plan::set_policy(policy);
        }
        if let Err(e) = run_devices(&args) {
            eprintln!("train_candle: {e}");
            std::process::exit(1);
        }
        return;
    }
    let gpu = match args.gpu {
        Some(false) => None,
        Some(true) => match open_gpu() {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("train_candle: --device gpu, but {e}");
                std::process::exit(2);
            }
        },
        None => match open_gpu() {
            Ok(d) => Some(d),
            Err(e) => {
                println!("note: no usable GPU ({e}); training on Candle's CPU device (float64 reference ops: slow)");
                None
            }
        },
    };
    if args.benchmark {
        let mut policy = cudnn_backend::plan::policy();
        policy.benchmark = true;
        cudnn_backend::plan::set_policy(policy);
    }
    let variant = if args.stock { "stock" } else { "fused" };
    let result = match &gpu {
        Some(dev) => run(dev, &args, &format!("gpu (cudnn, {variant})")),
        None => run(&Device::Cpu, &args, &format!("cpu (candle, {variant})")),
    };
    if let Err(e) = result {
        eprintln!("train_candle: {e}");
        std::process::exit(1);
    }
}
