//! Trains a small ResNet-style CNN on the procedurally drawn "shapes" set (examples/shapes.rs)
//! with Burn on `Autodiff<Cudnn>` (or Burn's ndarray CPU backend), then reports test accuracy
//! and training throughput, and writes a checkpoint and a PNG of the loss/accuracy curves.
//!
//! ```sh
//! cargo run --release --example train_burn -- --epochs 5 --batch-size 128 --dtype f32
//! ```
//! Flags: `--device gpu|cpu` (default: the GPU when one is usable), `--epochs N`,
//! `--batch-size N`, `--dtype f32|f16|bf16`, `--benchmark` (cuDNN autotuning, like
//! `torch.backends.cudnn.benchmark`), `--train N` / `--test N` (set sizes), `--out DIR`,
//! `--stock` (Burn's own `BatchNorm` and `Adam` instead of this crate's fused drop-ins),
//! `--fusion` (run on `Autodiff<CudnnFusion>`: burn-fusion's lazy queue with our fusers),
//! `--host-profile FILE` (examples built with `--features host-profile`: where the host time
//! of the last epoch's steps goes), `--backend ours|burn-cuda` (default `ours`; `burn-cuda`:
//! the same `--stock` network on `Autodiff<burn::backend::Cuda>`, Burn's own CUDA backend with
//! burn-fusion and autotuning, for comparison; examples built with `--features burn-cuda`;
//! `--benchmark` changes nothing there, as burn-cuda autotunes its kernels itself),
//! `--devices N` (examples built with `--features distributed`: data-parallel training on
//! GPUs 0..N through NCCL, `--batch-size` images per GPU; each epoch line also gives each
//! GPU thread's host milliseconds per step in forward, `backward()` and the optimizer step),
//! `--no-gradient-sync` (with `--devices`: a diagnostic where the replicas train without
//! reducing their gradients, the scaling ceiling of one process driving N GPUs).
//!
//! By default the network uses `cudnn_backend::burn::nn::BatchNorm` (batch norm, residual
//! add and ReLU in one fused pass, forward and backward) and `FusedAdamConfig` (one launch
//! per optimizer step); with `--stock` it is the same network on `burn::nn::BatchNorm` and
//! `burn::optim::Adam`. The last line reports kernel launches per training step (this
//! crate's launches: `n/a` on burn-cuda, whose kernels it does not count).

#[path = "shapes.rs"]
mod shapes;

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::Autodiff;
#[cfg(not(feature = "distributed"))]
use burn::backend::NdArray;
use burn::module::{AutodiffModule, Module};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{CompactRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, FloatDType, Int, Tensor, TensorData};
use cudnn_backend::burn::optim::FusedAdamConfig;
use cudnn_backend::burn::{Cudnn, CudnnDevice, CudnnFusion};
use examples::cli::BackendChoice;
use examples::curves::{plot, History};
use examples::models::resnet::Norm;

/// conv → batch norm (→ relu).
#[derive(Module, Debug)]
struct ConvBn<B: Backend> {
    conv: Conv2d<B>,
    bn: Norm<B>,
}

impl<B: Backend> ConvBn<B> {
    fn new(cin: usize, cout: usize, kernel: usize, stock: bool, device: &B::Device) -> Self {
        let pad = kernel / 2;
        Self {
            conv: Conv2dConfig::new([cin, cout], [kernel, kernel])
                .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
                .with_bias(false)
                .init(device),
            bn: Norm::new(cout, stock, device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>, skip: Option<Tensor<B, 4>>, relu: bool) -> Tensor<B, 4> {
        self.bn.forward(self.conv.forward(x), skip, relu)
    }
}

/// A residual block: relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)).
#[derive(Module, Debug)]
struct Residual<B: Backend> {
    a: ConvBn<B>,
    b: ConvBn<B>,
    shortcut: Option<ConvBn<B>>,
}

impl<B: Backend> Residual<B> {
    fn new(cin: usize, cout: usize, stock: bool, device: &B::Device) -> Self {
        Self {
            a: ConvBn::new(cin, cout, 3, stock, device),
            b: ConvBn::new(cout, cout, 3, stock, device),
            shortcut: (cin != cout).then(|| ConvBn::new(cin, cout, 1, stock, device)),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let skip = match &self.shortcut {
            Some(s) => s.forward(x.clone(), None, false),
            None => x.clone(),
        };
        self.b.forward(self.a.forward(x, None, true), Some(skip), true)
    }
}

/// stem → block(32) → maxpool → block(64) → maxpool → block(128) → global avg pool → linear.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    stem: ConvBn<B>,
    block1: Residual<B>,
    block2: Residual<B>,
    block3: Residual<B>,
    pool: MaxPool2d,
    gap: AdaptiveAvgPool2d,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(stock: bool, device: &B::Device) -> Self {
        Self {
            stem: ConvBn::new(3, 32, 3, stock, device),
            block1: Residual::new(32, 32, stock, device),
            block2: Residual::new(32, 64, stock, device),
            block3: Residual::new(64, 128, stock, device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            gap: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(128, shapes::CLASSES).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.stem.forward(x, None, true);
        let x = self.pool.forward(self.block1.forward(x));
        let x = self.pool.forward(self.block2.forward(x));
        let x = self.gap.forward(self.block3.forward(x));
        self.head.forward(x.flatten(1, 3))
    }
}

struct Args {
    gpu: Option<bool>,
    epochs: usize,
    batch: usize,
    dtype: FloatDType,
    benchmark: bool,
    stock: bool,
    fusion: bool,
    host_profile: Option<PathBuf>,
    backend: BackendChoice,
    train: usize,
    test: usize,
    out: PathBuf,
    devices: usize,
    threads: bool,
    rank_process: bool,
    no_gradient_sync: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        gpu: None,
        epochs: 5,
        batch: 128,
        dtype: FloatDType::F32,
        benchmark: false,
        stock: false,
        fusion: false,
        host_profile: None,
        backend: BackendChoice::Ours,
        train: 10_000,
        test: 2_000,
        out: PathBuf::from("out/train_burn"),
        devices: 1,
        threads: false,
        rank_process: false,
        no_gradient_sync: false,
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
            "--fusion" => a.fusion = true,
            "--host-profile" => a.host_profile = Some(PathBuf::from(value()?)),
            "--backend" => a.backend = examples::cli::parse_backend(&value()?)?,
            "--dtype" => a.dtype = examples::cli::parse_dtype(&value()?)?,
            "--devices" => a.devices = number(value()?)?,
            "--no-gradient-sync" => a.no_gradient_sync = true,
            "--threads" => a.threads = true,
            "--rank-process" => a.rank_process = true,
            "--help" | "-h" => {
                return Err(
                    "flags: --device gpu|cpu --epochs N --batch-size N --dtype f32|f16|bf16 --benchmark \
                            --stock --fusion --backend ours|burn-cuda --host-profile FILE --train N --test N --out DIR \
                            --devices N --threads --no-gradient-sync --rank-process"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.batch == 0 || a.epochs == 0 || a.devices == 0 {
        return Err("--batch-size, --epochs and --devices must be positive".into());
    }
    let parallel = a.devices > 1 || a.rank_process;
    if parallel && (a.backend != BackendChoice::Ours || a.gpu == Some(false)) {
        return Err(
            "--devices N (N > 1) trains on this crate's backend on N GPUs; it takes neither --backend \
                    burn-cuda nor --device cpu"
                .into(),
        );
    }
    if a.devices > 1 && a.threads && a.host_profile.is_some() {
        return Err("--host-profile samples one process: use it without --threads".into());
    }
    if (a.no_gradient_sync || a.threads) && !parallel {
        return Err("--threads and --no-gradient-sync go with --devices N (N > 1)".into());
    }
    if ((a.devices > 1 && !a.threads) || a.rank_process) && a.fusion {
        return Err("one process per GPU runs on `Autodiff<Cudnn>`: --fusion needs --threads".into());
    }
    if a.rank_process && a.threads {
        return Err("--rank-process is one process of a job: it takes no --threads".into());
    }
    Ok(a)
}

fn images<B: Backend>(data: &[f32], n: usize, device: &B::Device) -> Tensor<B, 4> {
    Tensor::from_data(
        TensorData::new(data.to_vec(), [n, 3, shapes::SIDE, shapes::SIDE]),
        device,
    )
}

fn labels<B: Backend>(data: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(data.to_vec(), [data.len()]), device)
}

/// Test accuracy in [0, 1] (forward passes on the inner, non-autodiff backend).
fn evaluate<B: Backend>(model: &Net<B>, test: &shapes::Split, batch: usize, device: &B::Device) -> f64 {
    let mut correct = Tensor::<B, 1, Int>::zeros([1], device);
    let mut start = 0;
    while start < test.labels.len() {
        let n = batch.min(test.labels.len() - start);
        let (x, y) = test.batch(start, n);
        let pred = model.forward(images(x, n, device)).argmax(1).squeeze_dim::<1>(1);
        correct = correct + pred.equal(labels(y, device)).int().sum();
        start += n;
    }
    correct.into_scalar().elem::<f64>() / test.labels.len() as f64
}

/// Data-parallel training (`--devices N`): one thread and one model replica per GPU.
#[cfg(feature = "distributed")]
mod data_parallel {
    use std::sync::Barrier;
    use std::time::Instant;

    use burn::module::AutodiffModule;
    use burn::nn::loss::CrossEntropyLossConfig;
    use burn::optim::{GradientsParams, Optimizer};
    use burn::tensor::backend::distributed::{DistributedBackend, DistributedConfig, ReduceOperation};
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{ElementConversion, Tensor};
    use cudnn_backend::burn::distributed::replicas;
    use cudnn_backend::burn::CudnnDevice;

    use super::{evaluate, images, labels, shapes, Args, Net};

    /// A replica's trained model and its epochs.
    type Replica<B> = Result<(Net<B>, Vec<Epoch>), String>;

    /// Ends the process when replica `rank` failed: the other replicas would wait for it
    /// forever (at the epoch barrier, in the gradient reductions).
    fn stop_others(rank: usize, error: &str) -> ! {
        eprintln!("train_burn: replica {rank} failed ({error}); stopping the other replicas");
        std::process::exit(1)
    }

    /// One replica's epoch: mean loss, seconds, and where its thread's host time went.
    struct Epoch {
        loss: f64,
        seconds: f64,
        /// Host milliseconds per step: forward + loss, `backward()` (which ends waiting for
        /// the gradient reductions to be enqueued), optimizer step.
        host: [f64; 3],
    }

    /// Accumulated host seconds of the three phases of a step.
    #[derive(Default)]
    struct HostTime([f64; 3]);

    impl HostTime {
        fn add(&mut self, start: Instant, forward: Instant, backward: Instant, step: Instant) {
            self.0[0] += (forward - start).as_secs_f64();
            self.0[1] += (backward - forward).as_secs_f64();
            self.0[2] += (step - backward).as_secs_f64();
        }

        fn per_step(&self, steps: usize) -> [f64; 3] {
            self.0.map(|s| s * 1e3 / steps as f64)
        }
    }

    /// Trains one replica per device on its shard of each global batch (`--batch-size`
    /// images per GPU), gradients averaged across the GPUs; reports the test accuracy of
    /// replica 0 and the images/s of all GPUs together in the last epoch, and checks that the
    /// replicas ended bit-identical.
    pub(super) fn train<B, O>(
        devices: &[CudnnDevice],
        args: &Args,
        label: &str,
        make_optim: impl Fn() -> O + Sync,
    ) -> Result<(f64, f64), String>
    where
        B: AutodiffBackend<Device = CudnnDevice> + DistributedBackend,
        O: Optimizer<Net<B>, B>,
    {
        let n = devices.len();
        let train = shapes::generate(args.train, 1);
        let test = shapes::generate(args.test, 2);
        let steps = train.labels.len() / (args.batch * n);
        if steps == 0 {
            return Err(format!(
                "--batch-size {} on {n} GPUs is larger than the training set",
                args.batch
            ));
        }
        B::seed(&devices[0], 2024);
        // One initialization, forked to every GPU with its parameters marked for the
        // gradient all-reduce.
        let models = replicas(Net::<B>::new(args.stock, &devices[0]), devices);
        // `--no-gradient-sync`: without the communication server the marked gradients are
        // never reduced, so the replicas train independently (the in-process scaling ceiling).
        if !args.no_gradient_sync {
            B::start_communication_server(
                devices,
                DistributedConfig {
                    all_reduce_op: ReduceOperation::Mean,
                },
            );
        }
        let barrier = Barrier::new(n);
        let results: Vec<Replica<B>> = std::thread::scope(|s| {
            let handles: Vec<_> = models
                .into_iter()
                .zip(devices)
                .enumerate()
                .map(|(rank, (mut model, device))| {
                    let (train, barrier, make_optim) = (&train, &barrier, &make_optim);
                    s.spawn(move || -> Replica<B> {
                        // A replica that fails leaves the others waiting for it (at the
                        // barrier, in the gradient reductions): end the process instead.
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || -> Replica<B> {
                            let mut optim = make_optim();
                            let loss_fn = CrossEntropyLossConfig::new().init(device);
                            let train_x = images::<B>(&train.images, train.labels.len(), device);
                            let train_y = labels::<B>(&train.labels, device);
                            let mut epochs = Vec::new();
                            for _ in 0..args.epochs {
                                B::sync(device).map_err(|e| e.to_string())?;
                                barrier.wait();
                                let started = Instant::now();
                                let mut loss_sum = Tensor::<B, 1>::zeros([1], device);
                                let mut host = HostTime::default();
                                for step in 0..steps {
                                    let first = (step * n + rank) * args.batch;
                                    let rows = first..first + args.batch;
                                    let t0 = Instant::now();
                                    let logits = model.forward(train_x.clone().slice([rows.clone()]));
                                    let loss = loss_fn.forward(logits, train_y.clone().slice([rows]));
                                    loss_sum = loss_sum + loss.clone().detach();
                                    let t1 = Instant::now();
                                    let grads = GradientsParams::from_grads(loss.backward(), &model);
                                    let t2 = Instant::now();
                                    model = optim.step(1e-3, model, grads);
                                    host.add(t0, t1, t2, Instant::now());
                                }
                                let mean_loss = loss_sum.into_scalar().elem::<f64>() / steps as f64;
                                B::sync(device).map_err(|e| e.to_string())?;
                                barrier.wait();
                                let seconds = started.elapsed().as_secs_f64();
                                epochs.push(Epoch {
                                    loss: mean_loss,
                                    seconds,
                                    host: host.per_step(steps),
                                });
                            }
                            Ok((model, epochs))
                        }))
                        .unwrap_or_else(|_| Err("its thread panicked".into()));
                        if let Err(e) = &result {
                            stop_others(rank, e);
                        }
                        result
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a training thread panicked".into())))
                .collect()
        });
        if !args.no_gradient_sync {
            B::close_communication_server(&devices[0]);
        }
        let mut trained = Vec::new();
        let mut timings = Vec::new();
        for r in results {
            let (model, epochs) = r?;
            trained.push(model);
            timings.push(epochs);
        }
        // Trainable parameters only: each replica's batch norms track their own shard's
        // statistics (as PyTorch's DDP without buffer broadcasts).
        let digests = trained
            .iter()
            .map(examples::digest::trainable_parameters)
            .collect::<Result<Vec<_>, _>>()?;
        let identical = digests.iter().all(|d| *d == digests[0]);
        let mut rate = 0.0;
        for (epoch, first) in timings[0].iter().enumerate() {
            let seconds = timings.iter().map(|t| t[epoch].seconds).fold(0.0, f64::max);
            rate = (steps * args.batch * n) as f64 / seconds;
            let host = timings
                .iter()
                .enumerate()
                .map(|(rank, t)| {
                    let [f, b, o] = t[epoch].host;
                    format!("GPU {rank} {f:.2}/{b:.2}/{o:.2}")
                })
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "epoch {}/{}: loss {:.4} (GPU 0's shards), {rate:.0} images/s on {n} GPUs; host ms/step \
                 forward/backward/optimizer: {host}",
                epoch + 1,
                args.epochs,
                first.loss
            );
        }
        let model = trained.swap_remove(0);
        let accuracy = evaluate(&model.valid(), &test, args.batch, &devices[0]);
        println!(
            "trainable parameter digest: {} (replicas identical: {identical})",
            digests[0]
        );
        println!(
            "train_burn {label} dtype={:?} batch={} per GPU: test accuracy {:.2}% (chance 10%), {rate:.0} images/s",
            args.dtype,
            args.batch,
            accuracy * 100.0
        );
        if !identical && !args.no_gradient_sync {
            return Err(format!("the replicas diverged: parameter digests {digests:?}"));
        }
        Ok((accuracy, rate))
    }
}

/// When `main` started (for the time to the first training step).
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Trains with this crate's fused batch norm and Adam, or with Burn's (`--stock`).
fn run<B: AutodiffBackend>(
    device: &B::Device,
    args: &Args,
    label: &str,
    parallel: Option<&Parallel<'_, B>>,
) -> Result<(f64, f64), String> {
    if args.stock {
        let label = format!("{label}, burn::nn modules");
        train::<B, _>(device, args, &label, AdamConfig::new().init(), parallel)
    } else {
        let label = format!("{label}, fused modules");
        train::<B, _>(device, args, &label, FusedAdamConfig::new().init(), parallel)
    }
}

/// Averages one rank's gradients of a model over the ranks.
type AverageGradients<'a, B> = &'a dyn Fn(&Net<B>, GradientsParams) -> Result<GradientsParams, String>;

/// How one replica of a multi-process data-parallel job (`--devices N`) joins the others.
struct Parallel<'a, B: AutodiffBackend> {
    rank: usize,
    world: usize,
    /// The model with rank 0's initial parameters.
    broadcast: &'a dyn Fn(Net<B>) -> Result<Net<B>, String>,
    /// The gradients averaged over the ranks.
    average: AverageGradients<'a, B>,
    /// Returns once every rank got there with its GPU idle (around the timed epochs).
    barrier: &'a dyn Fn() -> Result<(), String>,
}

/// One process of a `--devices N` job (`--rank-process`, started by [`launch_ranks`] or by
/// any launcher that sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and the NCCL id): trains its
/// replica on `Autodiff<Cudnn>` on GPU `LOCAL_RANK`, gradients averaged through NCCL.
fn run_rank(args: &Args) -> Result<(f64, f64), String> {
    use cudnn_backend::burn::process_group::ProcessGroup;
    type B = Autodiff<Cudnn>;
    let group = ProcessGroup::from_env().map_err(|e| format!("joining the job: {e}"))?;
    let err = |e: cudnn_backend::Error| e.to_string();
    let broadcast = |model: Net<B>| group.broadcast_parameters::<B, _>(model).map_err(err);
    let average = |model: &Net<B>, grads: GradientsParams| {
        if args.no_gradient_sync {
            Ok(grads)
        } else {
            group.all_reduce_gradients::<B, _>(model, grads).map_err(err)
        }
    };
    let barrier = || group.barrier().map_err(err);
    let parallel = Parallel {
        rank: group.rank(),
        world: group.world_size(),
        broadcast: &broadcast,
        average: &average,
        barrier: &barrier,
    };
    let label = format!("{} GPUs (cudnn, one process per GPU)", group.world_size());
    run::<B>(&group.device(), args, &label, Some(&parallel))
}

/// `--devices N`: starts this program once per GPU with `--rank-process` (rank, world size
/// and a fresh NCCL id in the environment), prints rank 0's output and the others' lines
/// prefixed with their rank, and checks that the replicas ended with the same trained
/// parameters.
fn launch_ranks(args: &Args) -> Result<(), String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let id = cudnn_backend::collective::UniqueId::new().map_err(|e| format!("--devices {}: {e}", args.devices))?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut children = Vec::new();
    for rank in 0..args.devices {
        let child = Command::new(&exe)
            .args(&argv)
            .arg("--rank-process")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", args.devices.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env(cudnn_backend::collective::NCCL_ID_ENV, id.to_hex())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        children.push(child);
    }
    let outputs: Vec<_> = children.iter_mut().map(|c| c.stdout.take()).collect();
    let (digests, failed) = std::thread::scope(|s| {
        let readers: Vec<_> = outputs
            .into_iter()
            .enumerate()
            .map(|(rank, out)| {
                s.spawn(move || {
                    let mut digest = None;
                    for line in out.into_iter().flat_map(|o| std::io::BufReader::new(o).lines()) {
                        let Ok(line) = line else { break };
                        if let Some(d) = line.strip_prefix("trainable parameter digest: ") {
                            digest = Some(d.to_owned());
                        }
                        if rank == 0 {
                            println!("{line}");
                        } else {
                            println!("[rank {rank}] {line}");
                        }
                    }
                    digest
                })
            })
            .collect();
        let failed = watch_ranks(&mut children);
        let digests: Vec<Option<String>> = readers.into_iter().map(|r| r.join().unwrap_or(None)).collect();
        (digests, failed)
    });
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    let identical = digests.iter().all(|d| d.is_some() && *d == digests[0]);
    println!("replicas identical: {identical}");
    if !identical && !args.no_gradient_sync {
        return Err(format!(
            "the replicas diverged: trainable parameter digests {digests:?}"
        ));
    }
    Ok(())
}

/// Waits for every rank; once one fails, stops the others (they would wait in their next
/// collective until the NCCL timeout) and says so. Returns the failures.
fn watch_ranks(children: &mut [std::process::Child]) -> Vec<String> {
    let mut failed = Vec::new();
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    done[rank] = true;
                    if !status.success() {
                        failed.push(format!("rank {rank} exited with {status}"));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[rank] = true;
                    failed.push(format!("rank {rank}: {e}"));
                }
            }
        }
        if !failed.is_empty() {
            for (rank, child) in children.iter_mut().enumerate() {
                if !done[rank] && child.kill().is_ok() {
                    let _ = child.wait();
                    failed.push(format!("rank {rank} stopped"));
                }
                done[rank] = true;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    failed
}

/// Trains and reports; returns (test accuracy, images/s of the last epoch).
fn train<B, O>(
    device: &B::Device,
    args: &Args,
    label: &str,
    mut optim: O,
    parallel: Option<&Parallel<'_, B>>,
) -> Result<(f64, f64), String>
where
    B: AutodiffBackend,
    O: Optimizer<Net<B>, B>,
{
    B::seed(device, 2024);
    let (rank, world) = parallel.map_or((0, 1), |p| (p.rank, p.world));
    let train = shapes::generate(args.train, 1);
    let test = shapes::generate(args.test, 2);
    let mut model = Net::<B>::new(args.stock, device);
    if let Some(p) = parallel {
        model = (p.broadcast)(model)?;
    }
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut history = History::default();
    let steps = train.labels.len() / (args.batch * world);
    if steps == 0 {
        return Err(format!(
            "--batch-size {} on {world} GPU(s) is larger than the training set",
            args.batch
        ));
    }
    // The whole training set lives on the device; batches are views (no copies).
    let train_x = images::<B>(&train.images, train.labels.len(), device);
    let train_y = labels::<B>(&train.labels, device);
    let mut last_rate = 0.0;
    let mut launches_per_step = 0.0;
    for epoch in 1..=args.epochs {
        let bar = examples::curves::epoch_bar(steps, epoch, args.epochs)?;
        if rank > 0 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        if let Some(p) = parallel {
            (p.barrier)()?;
        }
        let started = Instant::now();
        let launches_before = cudnn_backend::runtime::launch_counts();
        let replays_before = examples::startup::graph_replays();
        let threads_before = examples::host_profile::thread_times();
        // `--host-profile`: the last epoch's steps are sampled.
        let profile = match &args.host_profile {
            Some(path) if epoch == args.epochs => Some(examples::host_profile::Session::start(path)?),
            _ => None,
        };
        let mut loss_sum = Tensor::<B, 1>::zeros([1], device);
        for step in 0..steps {
            // With N processes, rank r trains on the r-th batch of each group of N.
            let first = (step * world + rank) * args.batch;
            let rows = first..first + args.batch;
            let x = train_x.clone().slice([rows.clone()]);
            let y = train_y.clone().slice([rows]);
            let logits = model.forward(x);
            let loss = loss_fn.forward(logits, y);
            loss_sum = loss_sum + loss.clone().detach();
            let mut grads = GradientsParams::from_grads(loss.backward(), &model);
            if let Some(p) = parallel {
                grads = (p.average)(&model, grads)?;
            }
            model = optim.step(1e-3, model, grads);
            if epoch == 1 && step == 0 {
                // Time to the end of the first step (kernel compiles, cuDNN plans included).
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
        if let Some(p) = parallel {
            (p.barrier)()?;
        }
        if let Some(profile) = profile {
            profile.finish()?;
        }
        let launches = cudnn_backend::runtime::launch_counts().since(&launches_before);
        launches_per_step = launches.total() as f64 / steps as f64;
        if epoch == args.epochs && args.backend.counts_launches() && rank == 0 {
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
        let seconds = started.elapsed().as_secs_f64();
        last_rate = (steps * args.batch * world) as f64 / seconds;
        let accuracy = evaluate(&model.valid(), &test, args.batch, device);
        examples::curves::finish_epoch(
            &bar,
            format!(
                "{epoch}/{}: loss {mean_loss:.4}, test accuracy {:.2}%, {last_rate:.0} images/s",
                args.epochs,
                accuracy * 100.0
            ),
        );
        history.loss.push(mean_loss);
        history.accuracy.push(accuracy);
    }
    // Two runs in deterministic mode must print the same digest.
    println!("parameter digest: {}", examples::digest::parameters(&model)?);
    if parallel.is_some() {
        // Each replica's batch norms keep their own shard's running statistics.
        println!(
            "trainable parameter digest: {}",
            examples::digest::trainable_parameters(&model)?
        );
    }
    if rank > 0 {
        return Ok((*history.accuracy.last().unwrap_or(&0.0), last_rate));
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let checkpoint = args.out.join("model");
    CompactRecorder::new()
        .record(model.into_record(), checkpoint.clone())
        .map_err(|e| format!("saving {}: {e}", checkpoint.display()))?;
    let png = args.out.join("curves.png");
    plot(&history, &png)?;
    let accuracy = *history.accuracy.last().unwrap_or(&0.0);
    println!("checkpoint: {}.mpk, curves: {}", checkpoint.display(), png.display());
    // Our launch counters do not see another backend's kernels.
    let launches = if args.backend.counts_launches() {
        format!("{launches_per_step:.0}")
    } else {
        "n/a".to_owned()
    };
    let per_gpu = if world > 1 { " per GPU" } else { "" };
    println!(
        "train_burn {label} dtype={:?} batch={}{per_gpu}: test accuracy {:.2}% (chance 10%), {last_rate:.0} images/s, \
         {launches} launches/step",
        args.dtype,
        args.batch,
        accuracy * 100.0
    );
    Ok((accuracy, last_rate))
}

/// `--backend burn-cuda`: the `--stock` network on Burn's own CUDA backend (fused, autotuned).
#[cfg(feature = "burn-cuda")]
fn run_burn_cuda(args: &Args) -> Result<(f64, f64), String> {
    let device = examples::cli::burn_cuda_device("train_burn", args.dtype);
    run::<Autodiff<examples::cli::BurnCuda>>(&device, args, "gpu (burn-cuda, fusion, autotune)", None)
}

/// `--backend burn-cuda` in a build without the `burn-cuda` feature: exits with status 2.
#[cfg(not(feature = "burn-cuda"))]
fn run_burn_cuda(_args: &Args) -> Result<(f64, f64), String> {
    examples::cli::burn_cuda_missing("train_burn")
}

/// No GPU: Burn's ndarray CPU backend.
#[cfg(not(feature = "distributed"))]
fn run_on_cpu(args: &Args) -> Result<(f64, f64), String> {
    run::<Autodiff<NdArray>>(&Default::default(), args, "cpu (ndarray)", None)
}

/// No GPU in a `distributed` build, where `Autodiff` needs backends that implement Burn's
/// `DistributedBackend` (burn-ndarray 0.21 does not).
#[cfg(feature = "distributed")]
fn run_on_cpu(_args: &Args) -> Result<(f64, f64), String> {
    Err("this build has the `distributed` feature, which leaves out the CPU backend; use a GPU".into())
}

/// `--devices N`: data-parallel training on GPUs 0..N through NCCL (Burn's
/// `DistributedBackend`: gradients all-reduced during the backward pass).
#[cfg(feature = "distributed")]
fn run_devices(args: &Args) -> Result<(f64, f64), String> {
    let devices: Vec<CudnnDevice> = (0..args.devices).map(CudnnDevice::new).collect();
    for d in &devices {
        d.try_open()
            .map_err(|e| format!("--devices {}: GPU {}: {e}", args.devices, d.index))?;
    }
    let fusion = if args.fusion { ", lazy fusion" } else { "" };
    let label = format!("{} GPUs (cudnn{fusion}, data parallel)", args.devices);
    match (args.fusion, args.stock) {
        (false, true) => {
            data_parallel::train::<Autodiff<Cudnn>, _>(&devices, args, &label, || AdamConfig::new().init())
        }
        (false, false) => {
            data_parallel::train::<Autodiff<Cudnn>, _>(&devices, args, &label, || FusedAdamConfig::new().init())
        }
        (true, true) => {
            data_parallel::train::<Autodiff<CudnnFusion>, _>(&devices, args, &label, || AdamConfig::new().init())
        }
        (true, false) => {
            data_parallel::train::<Autodiff<CudnnFusion>, _>(&devices, args, &label, || FusedAdamConfig::new().init())
        }
    }
}

/// `--devices N` in a build without the `distributed` feature: exits with status 2.
#[cfg(not(feature = "distributed"))]
fn run_devices(_args: &Args) -> Result<(f64, f64), String> {
    eprintln!("train_burn: --devices N needs the example built with `--features distributed` (NCCL data parallelism)");
    std::process::exit(2)
}

fn main() {
    STARTED.get_or_init(Instant::now);
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_burn: {e}");
            std::process::exit(2);
        }
    };
    if args.backend == BackendChoice::BurnCuda {
        if let Some(conflict) = examples::cli::burn_cuda_flag_conflict(args.gpu, args.stock, args.fusion) {
            eprintln!("train_burn: {conflict}");
            std::process::exit(2);
        }
        if let Err(e) = run_burn_cuda(&args) {
            eprintln!("train_burn: {e}");
            std::process::exit(1);
        }
        return;
    }
    // cuDNN autotuning for every run on this crate's backend (one process, threads or ranks).
    if args.benchmark {
        let mut policy = cudnn_backend::plan::policy();
        policy.benchmark = true;
        cudnn_backend::plan::set_policy(policy);
    }
    if args.devices > 1 || args.rank_process {
        let result = if args.rank_process {
            run_rank(&args).map(|_| ())
        } else if args.threads {
            run_devices(&args).map(|_| ())
        } else {
            launch_ranks(&args)
        };
        if let Err(e) = result {
            eprintln!("train_burn: {e}");
            std::process::exit(1);
        }
        return;
    }
    let device = CudnnDevice::default();
    let gpu = examples::cli::use_gpu("train_burn", args.gpu, &device, args.dtype);
    let result = if gpu {
        if args.fusion {
            run::<Autodiff<CudnnFusion>>(&device, &args, "gpu (cudnn, lazy fusion)", None)
        } else {
            run::<Autodiff<Cudnn>>(&device, &args, "gpu (cudnn)", None)
        }
    } else {
        run_on_cpu(&args)
    };
    if let Err(e) = result {
        eprintln!("train_burn: {e}");
        std::process::exit(1);
    }
}
