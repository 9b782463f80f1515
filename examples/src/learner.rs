//! A small CNN classifier trained with burn-train's supervised `Learner` (metrics, checkpoints,
//! a metrics renderer) on any Burn autodiff backend: what `train_learner` runs, and what the
//! examples' tests run on burn-ndarray.
//!
//! - [`PatternDataset`]: a learnable synthetic image set (burn-dataset's `Dataset`): each class
//!   is a stripe orientation or a checkerboard at a random phase and contrast, plus noise, drawn
//!   from `(seed, index)` on the host, so every run sees the same items.
//! - [`PatternBatcher`] (burn's `Batcher`), [`Cnn`] with `TrainStep` and `InferenceStep` (0.21's
//!   name for the validation step), `LossMetric` and `AccuracyMetric`, checkpoints through
//!   `CompactRecorder` under `<artifact dir>/checkpoint`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::optim::AdamConfig;
use burn::record::{CompactRecorder, Recorder};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_train::metric::{AccuracyMetric, LossMetric};
use burn_train::renderer::{
    EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation, MetricsRendererTraining, ProgressType,
    TrainingProgress,
};
use burn_train::{
    ClassificationOutput, ExecutionStrategy, InferenceStep, Learner, LearnerSummary, MultiDeviceOptim,
    SupervisedTraining, TrainOutput, TrainStep,
};
use cudnn_backend_reference::SplitMix64;

/// Number of classes of [`PatternDataset`].
pub const CLASSES: usize = 4;

/// One image (1×side×side, row-major) and its class.
#[derive(Clone, Debug)]
pub struct PatternItem {
    /// Pixel values.
    pub pixels: Vec<f32>,
    /// Class, `0..CLASSES`.
    pub label: usize,
}

/// `len` images of `side`×`side` pixels: class 0 horizontal stripes, 1 vertical stripes,
/// 2 diagonal stripes, 3 a checkerboard, each of period 4 at a random phase and contrast, over
/// uniform noise. Item `i` depends only on `(seed, i)`.
#[derive(Clone, Debug)]
pub struct PatternDataset {
    /// Number of items.
    pub len: usize,
    /// Image side in pixels.
    pub side: usize,
    /// Seed of the generator.
    pub seed: u64,
}

impl Dataset<PatternItem> for PatternDataset {
    fn get(&self, index: usize) -> Option<PatternItem> {
        if index >= self.len {
            return None;
        }
        let mut rng = SplitMix64::new(self.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let label = rng.below(CLASSES as u64) as usize;
        let (px, py) = (rng.below(4) as usize, rng.below(4) as usize);
        let contrast = 0.5 + 0.5 * rng.next_f64();
        let mut pixels = Vec::with_capacity(self.side * self.side);
        for y in 0..self.side {
            for x in 0..self.side {
                let (x, y) = (x + px, y + py);
                let on = match label {
                    0 => y % 4 < 2,
                    1 => x % 4 < 2,
                    2 => (x + y) % 4 < 2,
                    _ => (x / 2 + y / 2) % 2 == 0,
                };
                let signal = if on { contrast } else { -contrast };
                pixels.push((0.5 * signal + 0.6 * (rng.next_f64() - 0.5)) as f32);
            }
        }
        Some(PatternItem { pixels, label })
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// A batch: images N×1×side×side and their classes.
#[derive(Clone, Debug)]
pub struct PatternBatch<B: Backend> {
    /// Images, NCHW.
    pub images: Tensor<B, 4>,
    /// Classes.
    pub targets: Tensor<B, 1, Int>,
}

/// Stacks [`PatternItem`]s into a [`PatternBatch`] on the loader's device.
#[derive(Clone, Debug)]
pub struct PatternBatcher {
    /// Image side in pixels.
    pub side: usize,
}

impl<B: Backend> Batcher<B, PatternItem, PatternBatch<B>> for PatternBatcher {
    fn batch(&self, items: Vec<PatternItem>, device: &B::Device) -> PatternBatch<B> {
        let n = items.len();
        let mut pixels = Vec::with_capacity(n * self.side * self.side);
        let mut labels = Vec::with_capacity(n);
        for item in items {
            pixels.extend_from_slice(&item.pixels);
            labels.push(item.label as i64);
        }
        PatternBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, 1, self.side, self.side]), device),
            targets: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

/// conv 3×3 (1→width) → ReLU → conv 3×3 stride 2 (width→2·width) → ReLU → average pool to
/// 4×4 → linear to [`CLASSES`] logits.
#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: AdaptiveAvgPool2d,
    head: Linear<B>,
}

impl<B: Backend> Cnn<B> {
    /// A model `width` channels wide, initialized on `device`.
    pub fn new(width: usize, device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([1, width], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            conv2: Conv2dConfig::new([width, 2 * width], [3, 3])
                .with_stride([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            pool: AdaptiveAvgPool2dConfig::new([4, 4]).init(),
            head: LinearConfig::new(2 * width * 16, CLASSES).init(device),
        }
    }

    /// Logits, N×[`CLASSES`].
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = relu(self.conv1.forward(images));
        let x = self.pool.forward(relu(self.conv2.forward(x)));
        self.head.forward(x.flatten(1, 3))
    }

    /// The logits, the mean cross-entropy loss and the targets, as burn-train's metrics read them.
    pub fn forward_classification(&self, batch: PatternBatch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Cnn<B> {
    type Input = PatternBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: PatternBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.forward_classification(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Cnn<B> {
    type Input = PatternBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: PatternBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}

/// A training run's settings.
#[derive(Clone, Debug)]
pub struct LearnerConfig {
    /// Where burn-train writes its checkpoints (`checkpoint/`), metric logs and `experiment.log`.
    pub artifact_dir: PathBuf,
    /// Epochs.
    pub epochs: usize,
    /// Images per batch (per device with several devices: burn-train splits the loader).
    pub batch_size: usize,
    /// Training images; validation uses a quarter as many (other indices of the generator).
    pub train_items: usize,
    /// Image side in pixels (a multiple of 8 keeps the pooling exact).
    pub side: usize,
    /// Channels of the first convolution.
    pub width: usize,
    /// Adam's learning rate.
    pub learning_rate: f64,
    /// Seed of the data and of the backend's generator.
    pub seed: u64,
    /// Data-loader worker threads (0: batches are made on the training thread).
    pub workers: usize,
    /// Print one line per epoch.
    pub verbose: bool,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        Self {
            artifact_dir: std::env::temp_dir().join("cudnn-backend-train-learner"),
            epochs: 3,
            batch_size: 64,
            train_items: 4096,
            side: 16,
            width: 16,
            learning_rate: 2e-3,
            seed: 2024,
            workers: 2,
            verbose: true,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct LearnerRun {
    /// Mean training loss of each epoch.
    pub train_loss: Vec<f64>,
    /// Mean validation loss of each epoch.
    pub valid_loss: Vec<f64>,
    /// Training accuracy (percent) of each epoch.
    pub train_accuracy: Vec<f64>,
    /// Validation accuracy (percent) of each epoch.
    pub valid_accuracy: Vec<f64>,
    /// Training images per second over the last epoch (from its second batch to its last; all
    /// devices together).
    pub items_per_s: f64,
    /// Milliseconds per training step over the same span.
    pub ms_per_step: f64,
    /// Seconds from `started` to the first training batch's metrics.
    pub first_step_s: f64,
    /// Seconds the whole `launch` took (training, validation, checkpoints).
    pub wall_s: f64,
    /// Parameter elements of the model.
    pub params: usize,
}

/// Per-epoch training timestamps the renderer records: (first batch time, items then, last
/// batch time, items then, batches).
#[derive(Default)]
struct Timing {
    first_step: Option<Instant>,
    epochs: Vec<(Instant, usize, Instant, usize, usize)>,
}

/// burn-train's renderer for this example: no per-batch output (burn-train's plain CLI renderer
/// prints a line per batch), one line per epoch when verbose, and the training batches'
/// timestamps for the throughput figure.
struct EpochRenderer {
    timing: Arc<Mutex<Timing>>,
    verbose: bool,
    epochs: usize,
}

impl MetricsRendererTraining for EpochRenderer {
    fn update_train(&mut self, _state: MetricState) {}

    fn update_valid(&mut self, _state: MetricState) {}

    fn render_train(&mut self, item: TrainingProgress, _indicators: Vec<ProgressType>) {
        let now = Instant::now();
        let epoch = item.global_progress.items_processed;
        let items = item.progress.map_or(0, |p| p.items_processed);
        let mut t = self.timing.lock().unwrap_or_else(|e| e.into_inner());
        t.first_step.get_or_insert(now);
        if t.epochs.len() < epoch {
            if self.verbose {
                println!("epoch {epoch}/{}: training", self.epochs);
            }
            t.epochs.push((now, items, now, items, 1));
        } else if let Some(e) = t.epochs.last_mut() {
            e.2 = now;
            e.3 = items;
            e.4 += 1;
        }
    }

    fn render_valid(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}
}

impl MetricsRendererEvaluation for EpochRenderer {
    fn update_test(&mut self, _name: burn_train::renderer::EvaluationName, _state: MetricState) {}

    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
}

impl MetricsRenderer for EpochRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, _definition: burn_train::metric::MetricDefinition) {}
}

/// The model record of epoch `epoch` that the learner's `CompactRecorder` checkpointer wrote.
pub fn model_checkpoint(artifact_dir: &Path, epoch: usize) -> PathBuf {
    artifact_dir.join("checkpoint").join(format!("model-{epoch}"))
}

/// Loads the model checkpoint of `epoch` into a fresh [`Cnn`] on `device`.
pub fn load_checkpoint<B: Backend>(
    artifact_dir: &Path,
    epoch: usize,
    width: usize,
    device: &B::Device,
) -> Result<Cnn<B>, String> {
    let path = model_checkpoint(artifact_dir, epoch);
    let record = CompactRecorder::new()
        .load(path.clone(), device)
        .map_err(|e| format!("loading {}: {e}", path.display()))?;
    Ok(Cnn::new(width, device).load_record(record))
}

/// Trains a [`Cnn`] on [`PatternDataset`] with burn-train's `Learner` on `devices` (one: the
/// single-device strategy; several: burn-train's `MultiDevice` strategy, gradients summed on
/// the first device, where Adam steps) and returns the trained model (the inner backend's)
/// with the run's figures. `started` is the program's start, for the first-step time.
pub fn train<B: AutodiffBackend>(
    config: &LearnerConfig,
    devices: &[B::Device],
    started: Instant,
) -> Result<(Cnn<B::InnerBackend>, LearnerRun), String> {
    let device = devices.first().ok_or("no device")?.clone();
    B::seed(&device, config.seed);
    std::fs::create_dir_all(&config.artifact_dir).map_err(|e| format!("{}: {e}", config.artifact_dir.display()))?;
    let batcher = PatternBatcher { side: config.side };
    let train_set = PatternDataset {
        len: config.train_items,
        side: config.side,
        seed: config.seed,
    };
    let valid_set = PatternDataset {
        len: (config.train_items / 4).max(1),
        side: config.side,
        seed: config.seed ^ 0x005e_ed0f_7e57,
    };
    let loader_train = DataLoaderBuilder::<B, _, _>::new(batcher.clone())
        .batch_size(config.batch_size)
        .shuffle(config.seed)
        .num_workers(config.workers)
        .set_device(device.clone())
        .build(train_set);
    let loader_valid = DataLoaderBuilder::<B::InnerBackend, _, _>::new(batcher)
        .batch_size(config.batch_size)
        .num_workers(config.workers)
        .set_device(device.clone())
        .build(valid_set);

    let model = Cnn::<B>::new(config.width, &device);
    let params = model.num_params();
    let timing = Arc::new(Mutex::new(Timing::default()));
    let renderer = EpochRenderer {
        timing: timing.clone(),
        verbose: config.verbose,
        epochs: config.epochs,
    };
    let strategy = if devices.len() > 1 {
        ExecutionStrategy::MultiDevice(devices.to_vec(), MultiDeviceOptim::OptimMainDevice)
    } else {
        ExecutionStrategy::SingleDevice(device)
    };
    let training = SupervisedTraining::new(&config.artifact_dir, loader_train, loader_valid)
        .metrics((LossMetric::new(), AccuracyMetric::new()))
        .with_file_checkpointer(CompactRecorder::new())
        .with_training_strategy(strategy.into())
        .renderer(renderer)
        .num_epochs(config.epochs);
    let learner = Learner::new(model, AdamConfig::new().init(), config.learning_rate);
    let launch = Instant::now();
    let result = training.launch(learner);
    let wall_s = launch.elapsed().as_secs_f64();
    drop(result.renderer);

    let summary = LearnerSummary::new(&config.artifact_dir, &["Loss", "Accuracy"])?;
    let series = |split: &[burn_train::MetricSummary], name: &str| -> Vec<f64> {
        split
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.entries.iter().map(|e| e.value).collect())
            .unwrap_or_default()
    };
    let t = timing.lock().unwrap_or_else(|e| e.into_inner());
    let (items_per_s, ms_per_step) = match t.epochs.last() {
        Some(&(t0, i0, t1, i1, steps)) if steps > 1 && t1 > t0 => {
            let s = (t1 - t0).as_secs_f64();
            // With several devices every step renders one batch per device.
            let step_count = (steps - 1) as f64 / devices.len() as f64;
            (i1.saturating_sub(i0) as f64 / s, s * 1e3 / step_count)
        }
        _ => (0.0, 0.0),
    };
    let run = LearnerRun {
        train_loss: series(&summary.metrics.train, "Loss"),
        valid_loss: series(&summary.metrics.valid, "Loss"),
        train_accuracy: series(&summary.metrics.train, "Accuracy"),
        valid_accuracy: series(&summary.metrics.valid, "Accuracy"),
        items_per_s,
        ms_per_step,
        first_step_s: t.first_step.map_or(0.0, |f| (f - started).as_secs_f64()),
        wall_s,
        params,
    };
    Ok((result.model, run))
}
