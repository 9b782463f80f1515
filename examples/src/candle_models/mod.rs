//! The standard models of [`crate::models`] written with Candle (the `train_candle_models`
//! example and its tests): ResNet-50 and GPT-2 small on candle-nn's `VarMap`/`VarBuilder`,
//! built from this crate's Candle layers (`cudnn_backend::candle::nn`, its attention and
//! pooling ops) or, with `stock`, from candle-nn's layers and Candle's own ops; one training
//! loop ([`train`]) on synthetic batches made on the device, with this crate's `FusedAdamW`
//! or candle-nn's `AdamW`.

pub mod gpt;
pub mod layers;
pub mod resnet;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{AdamW, Init, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use cudnn_backend::candle::optim::FusedAdamW;

pub use crate::models::Report;

/// Inputs and targets of one training batch, on the device.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Images `(N, 3, H, W)` in the model's dtype, or tokens `(N, S)` (u32).
    pub inputs: Tensor,
    /// Class labels `(N)` or next tokens `(N·S)` (u32).
    pub targets: Tensor,
}

/// A model as [`train`] drives it: built from a config on a `VarBuilder`, fed synthetic
/// batches made on the device, trained on a scalar f32 loss.
pub trait CandleModel: Sized {
    /// The model's shape (full size or tiny).
    type Config: Clone + std::fmt::Debug;
    /// What throughput counts: `"images"` or `"tokens"`.
    const UNIT: &'static str;
    /// The batch the benchmark trains with by default (as `train_models`).
    const BATCH: usize;
    /// The default learning rate (as `train_models`).
    const LR: f64;
    /// The optimizer's weight decay: 0 for Adam (ResNet), 0.01 for AdamW (GPT-2).
    const WEIGHT_DECAY: f64;

    /// The model with its architecture's initialization, its variables loaded from `vb`;
    /// `stock` picks candle-nn's layers and Candle's ops over this crate's.
    fn new(config: &Self::Config, stock: bool, vb: VarBuilder) -> Result<Self>;

    /// `n` random samples drawn on `device` (inputs in `dtype` where they are floats): a few
    /// such batches cycled are learnable by memorization, so the loss falls.
    fn synthetic_batch(config: &Self::Config, n: usize, dtype: DType, device: &Device) -> Result<Batch>;

    /// Units of [`Self::UNIT`] in one sample: 1 image, or the sequence length in tokens.
    fn units_per_sample(config: &Self::Config) -> usize;

    /// The training-mode loss on `batch`: a scalar in f32.
    fn loss(&self, batch: &Batch) -> Result<Tensor>;
}

/// `Tensor::rand` over `[0, classes)` floored to u32 labels of `dims` on `device` (clamped:
/// a device generator may return the upper bound).
pub fn uniform_labels(dims: &[usize], classes: usize, device: &Device) -> Result<Tensor> {
    if classes == 0 {
        return Err(candle_core::Error::Msg("labels need at least one class".into()));
    }
    Tensor::rand(0f32, classes as f32, dims, device)?
        .floor()?
        .clamp(0f32, (classes - 1) as f32)?
        .to_dtype(DType::U32)
}

/// How [`train`] runs.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// Samples per step.
    pub batch: usize,
    /// Steps per epoch.
    pub steps: usize,
    /// Epochs; the reported rate is the last one's.
    pub epochs: usize,
    /// Distinct synthetic batches, cycled.
    pub data: usize,
    /// Learning rate.
    pub lr: f64,
    /// The dtype of the variables, the optimizer state and the computation (as PyTorch's
    /// `model.to(dtype)`).
    pub dtype: DType,
    /// candle-nn's layers and `AdamW` instead of this crate's.
    pub stock: bool,
    /// The last epoch's last steps an attached profiler collects (Nsight Compute with
    /// `--profile-from-start off`); 0 for none. On Candle's CUDA device only.
    pub profile_steps: usize,
}

/// Starts or stops an attached profiler's collection on the CUDA device `ordinal`.
fn profile_collect(ordinal: usize, on: bool) -> std::result::Result<(), String> {
    let device = cudnn_backend::Device::new(ordinal).map_err(|e| e.to_string())?;
    cudnn_backend::runtime::profiler_collect(&device, on).map_err(|e| e.to_string())
}

/// The optimizer of a run: this crate's `FusedAdamW` or candle-nn's `AdamW`.
enum Adam {
    Fused(FusedAdamW),
    Stock(AdamW),
}

impl Adam {
    /// Applies one update from `grads`.
    fn step(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            Adam::Fused(o) => o.step(grads),
            Adam::Stock(o) => o.step(grads),
        }
    }
}

/// Trains model `M` of `config` on `device` for `options.epochs` epochs of `options.steps`
/// steps over `options.data` synthetic batches, with a progress bar per epoch; `started` is
/// when the program started (for the first step's time).
pub fn train<M: CandleModel>(
    config: &M::Config,
    options: &TrainOptions,
    device: &Device,
    started: Instant,
) -> std::result::Result<Report, String> {
    let err = |e: candle_core::Error| e.to_string();
    if [options.batch, options.steps, options.epochs, options.data].contains(&0) {
        return Err("the batch, steps, epochs and data must be positive".into());
    }
    if options.profile_steps > options.steps {
        return Err(format!(
            "--profile-steps {} is more than the {} steps of an epoch",
            options.profile_steps, options.steps
        ));
    }
    let cuda_ordinal = match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => Some(gpu_id),
        _ => None,
    };
    if device.is_cuda() {
        device.set_seed(2024).map_err(err)?; // Candle's CPU device draws from an unseeded generator
    }
    let varmap = VarMap::new();
    let model = M::new(
        config,
        options.stock,
        VarBuilder::from_varmap(&varmap, options.dtype, device),
    )
    .map_err(err)?;
    let params = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    // Adam with PyTorch's defaults (betas 0.9/0.999, epsilon 1e-8) and the model's decay.
    let adam = ParamsAdamW {
        lr: options.lr,
        weight_decay: M::WEIGHT_DECAY,
        ..Default::default()
    };
    let mut optim = if options.stock {
        Adam::Stock(AdamW::new(varmap.all_vars(), adam).map_err(err)?)
    } else {
        Adam::Fused(FusedAdamW::new(varmap.all_vars(), adam).map_err(err)?)
    };
    let batches = (0..options.data)
        .map(|_| M::synthetic_batch(config, options.batch, options.dtype, device))
        .collect::<Result<Vec<_>>>()
        .map_err(err)?;
    let units_per_step = options.batch * M::units_per_sample(config);
    let (mut first_step_s, mut loss_first, mut loss_last) = (0.0, 0.0, 0.0);
    let (mut rate, mut ms_per_step, mut launches_per_step) = (0.0, 0.0, 0.0);
    for epoch in 1..=options.epochs {
        let bar = crate::curves::epoch_bar(options.steps, epoch, options.epochs)?;
        device.synchronize().map_err(err)?;
        let epoch_started = Instant::now();
        let launches_before = cudnn_backend::runtime::launch_counts();
        let replays_before = crate::startup::graph_replays();
        let mut loss_sum = Tensor::zeros((), DType::F32, device).map_err(err)?;
        let profiled = epoch == options.epochs && options.profile_steps > 0;
        for step in 0..options.steps {
            if profiled && step == options.steps - options.profile_steps {
                device.synchronize().map_err(err)?;
                if let Some(ordinal) = cuda_ordinal {
                    profile_collect(ordinal, true)?;
                }
            }
            let i = ((epoch - 1) * options.steps + step) % options.data;
            let loss = (|| -> Result<Tensor> {
                let loss = model.loss(&batches[i])?;
                optim.step(&loss.backward()?)?;
                Ok(loss.detach())
            })()
            .map_err(err)?;
            loss_sum = (loss_sum + &loss).map_err(err)?;
            if epoch == 1 && step == 0 {
                device.synchronize().map_err(err)?;
                first_step_s = started.elapsed().as_secs_f64();
                eprintln!("{}", crate::startup::report(started));
                loss_first = loss.to_scalar::<f32>().map_err(err)? as f64;
            }
            bar.inc(1);
        }
        let mean_loss = loss_sum.to_scalar::<f32>().map_err(err)? as f64 / options.steps as f64;
        device.synchronize().map_err(err)?;
        if let (true, Some(ordinal)) = (profiled, cuda_ordinal) {
            profile_collect(ordinal, false)?;
        }
        let seconds = epoch_started.elapsed().as_secs_f64();
        let launches = cudnn_backend::runtime::launch_counts().since(&launches_before);
        launches_per_step = launches.total() as f64 / options.steps as f64;
        if epoch == options.epochs {
            let replays = crate::startup::graph_replays() - replays_before;
            eprintln!(
                "{}",
                crate::startup::launches_per_step(&launches, replays, options.steps)
            );
        }
        if !mean_loss.is_finite() {
            return Err(format!("epoch {epoch}: the training loss is {mean_loss}"));
        }
        loss_last = mean_loss;
        rate = (options.steps * units_per_step) as f64 / seconds;
        ms_per_step = 1e3 * seconds / options.steps as f64;
        crate::curves::finish_epoch(
            &bar,
            format!(
                "{epoch}/{}: loss {mean_loss:.4}, {rate:.1} {}/s, {ms_per_step:.2} ms/step",
                options.epochs,
                M::UNIT
            ),
        );
    }
    // One more forward (no step): the trained parameters are checked for NaN.
    let check = model
        .loss(&batches[0])
        .and_then(|l| l.to_scalar::<f32>())
        .map_err(err)?;
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

/// Candle's CUDA device 0 when it opens and this crate's cuDNN ops run on it (one tiny
/// convolution).
pub fn open_gpu() -> std::result::Result<Device, String> {
    use cudnn_backend::candle::{Conv2dParams, CudnnExt};
    let dev = Device::new_cuda(0).map_err(|e| e.to_string())?;
    let x = Tensor::ones((1, 1, 3, 3), DType::F32, &dev).map_err(|e| e.to_string())?;
    x.cudnn_conv2d(&x, Conv2dParams::default())
        .and_then(|y| y.flatten_all()?.to_vec1::<f32>())
        .map_err(|e| format!("cuDNN: {e}"))?;
    Ok(dev)
}

/// Parameter counts of a model from the shapes it asks its `VarBuilder` for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParameterCounts {
    /// Elements of the variables that train (PyTorch's `sum(p.numel() for p in
    /// model.parameters())`).
    pub trainable: usize,
    /// The same plus batch norms' running statistics (Burn's `num_params`, and what a
    /// `VarMap` holds).
    pub all: usize,
}

/// The names and element counts a model asked for, each name once (a tied weight loaded
/// twice counts once, as in a `VarMap`).
type Requests = Arc<Mutex<BTreeMap<String, usize>>>;

/// A `VarBuilder` backend that records each requested name's shape and hands out one zero
/// broadcast to it: a full-size model is built without allocating its weights.
struct ShapeRecorder(Requests);

impl SimpleBackend for ShapeRecorder {
    fn get(&self, s: Shape, name: &str, _: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut seen = self
            .0
            .lock()
            .map_err(|_| candle_core::Error::Msg("the shape recorder's lock is poisoned".into()))?;
        let n = s.elem_count();
        if let Some(&before) = seen.get(name) {
            if before != n {
                let msg = format!("{name} asked for with {before} and with {n} elements");
                return Err(candle_core::Error::Msg(msg));
            }
        }
        seen.insert(name.to_string(), n);
        Tensor::zeros((), dtype, dev)?.broadcast_as(s)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        Err(candle_core::Error::Msg(format!(
            "{name}: the shape recorder needs a shape"
        )))
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.lock().map(|seen| seen.contains_key(name)).unwrap_or(false)
    }
}

/// The parameter counts of the model `build` makes from a `VarBuilder` (f32, CPU) that
/// records shapes instead of allocating them. Running statistics are the variables named
/// `running_mean` and `running_var`.
pub fn parameter_counts<T>(build: impl FnOnce(VarBuilder) -> Result<T>) -> Result<ParameterCounts> {
    let requests = Requests::default();
    let vb = VarBuilder::from_backend(Box::new(ShapeRecorder(requests.clone())), DType::F32, Device::Cpu);
    build(vb)?;
    let seen = requests
        .lock()
        .map_err(|_| candle_core::Error::Msg("the shape recorder's lock is poisoned".into()))?;
    let all = seen.values().sum();
    let running = seen
        .iter()
        .filter(|(name, _)| name.ends_with("running_mean") || name.ends_with("running_var"))
        .map(|(_, n)| n)
        .sum::<usize>();
    Ok(ParameterCounts {
        trainable: all - running,
        all,
    })
}
