//! Standard models written with stock `burn::nn` (the `train_models` example and its tests):
//! ResNet-50, GPT-2 small, ViT-B/16 and BERT-base, each with its full-size config and a tiny
//! one for tests, and [`TrainModel`]: what the trainer needs of each (initialization,
//! synthetic data made on the device, the training loss).

pub mod bert;
pub mod gpt;
pub mod resnet;
pub mod transformer;
pub mod vit;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};

/// What one training run measured: the fields of the trainers' result lines.
#[derive(Clone, Debug)]
pub struct Report {
    /// Parameter elements, batch norms' running statistics included (Burn's `num_params`).
    pub params: usize,
    /// What `rate` counts: "images" or "tokens".
    pub unit: &'static str,
    /// Seconds from `started` to the end of the first step.
    pub first_step_s: f64,
    /// The first step's loss.
    pub loss_first: f64,
    /// The last epoch's mean loss.
    pub loss_last: f64,
    /// Units per second over the last epoch.
    pub rate: f64,
    /// Milliseconds per step over the last epoch.
    pub ms_per_step: f64,
    /// This crate's kernel launches and cuDNN executions per step of the last epoch (a
    /// framework's own kernels are not counted).
    pub launches_per_step: f64,
}

impl Report {
    /// Prints the run's two result lines: a summary for people, then the same figures as one
    /// JSON object (the line `scripts/models-bench.sh` reads). `program` names the trainer.
    pub fn print(&self, program: &str, model: &str, variant: &str, dtype: &str, batch: usize) {
        println!(
            "{program} {model} {variant} dtype={dtype} batch={batch}: loss {:.4} -> {:.4}, {:.1} {}/s, \
             {:.2} ms/step, {:.0} launches/step, first step {:.2} s, {} parameters",
            self.loss_first,
            self.loss_last,
            self.rate,
            self.unit,
            self.ms_per_step,
            self.launches_per_step,
            self.first_step_s,
            self.params
        );
        println!(
            "{{\"model\": \"{model}\", \"variant\": \"{variant}\", \"dtype\": \"{dtype}\", \"batch\": {batch}, \
             \"unit\": \"{}\", \"{}_per_s\": {:.2}, \"ms_per_step\": {:.3}, \"launches_per_step\": {:.0}, \
             \"first_step_s\": {:.3}, \"loss_first\": {:.5}, \"loss_last\": {:.5}, \"params\": {}}}",
            self.unit,
            self.unit,
            self.rate,
            self.ms_per_step,
            self.launches_per_step,
            self.first_step_s,
            self.loss_first,
            self.loss_last,
            self.params
        );
    }
}

/// A model as the trainer and the tests drive it: built from a config, fed synthetic batches
/// made on the device, trained on a scalar loss. One trait, so one training loop serves
/// every model.
pub trait TrainModel<B: Backend>: Module<B> + Sized {
    /// The model's shape (full size or tiny, stock or fused modules).
    type Config: Clone + std::fmt::Debug;
    /// One batch of inputs and targets, on the device.
    type Batch: Clone;
    /// What throughput counts: `"images"` or `"tokens"`.
    const UNIT: &'static str;

    /// The model with its architecture's initialization.
    fn init(config: &Self::Config, device: &B::Device) -> Self;

    /// A synthetic batch of `n` samples drawn on the device (random inputs and targets: a
    /// few such batches cycled are learnable by memorization, so the loss falls).
    fn synthetic_batch(config: &Self::Config, n: usize, device: &B::Device) -> Self::Batch;

    /// Units of [`Self::UNIT`] in one sample: 1 (an image) unless a model says otherwise
    /// (the sequence length in tokens).
    fn units_per_sample(_config: &Self::Config) -> usize {
        1
    }

    /// The training loss on `batch` (shape `[1]`).
    fn loss(&self, batch: &Self::Batch) -> Tensor<B, 1>;

    /// The batch's tensors as host data (to move a batch to another backend).
    fn batch_to_data(batch: &Self::Batch) -> Vec<TensorData>;

    /// A batch from [`TrainModel::batch_to_data`]'s data, on `device`.
    fn batch_from_data(data: Vec<TensorData>, device: &B::Device) -> Self::Batch;
}

/// Mean cross-entropy of `logits` (`[M, classes]`) against `targets` (`[M]`): the loss of
/// every model here, through Burn's `CrossEntropyLoss` (`stock`) or this crate's drop-in (one
/// kernel pass over the logits forward and one backward on the cuDNN backends).
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>, stock: bool) -> Tensor<B, 1> {
    let device = logits.device();
    if stock {
        CrossEntropyLossConfig::new().init(&device).forward(logits, targets)
    } else {
        cudnn_backend::burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets)
    }
}

/// Images and class labels: the batches of ResNet-50 and ViT-B/16.
#[derive(Clone, Debug)]
pub struct ImageBatch<B: Backend> {
    /// Images `[N, 3, H, W]`.
    pub images: Tensor<B, 4>,
    /// Class labels `[N]`.
    pub labels: Tensor<B, 1, Int>,
}

impl<B: Backend> ImageBatch<B> {
    /// `n` standard-normal images of `side`×`side` pixels with labels uniform over `classes`.
    pub fn synthetic(n: usize, side: usize, classes: usize, device: &B::Device) -> Self {
        Self {
            images: Tensor::random([n, 3, side, side], Distribution::Normal(0.0, 1.0), device),
            labels: Tensor::random([n], Distribution::Uniform(0.0, classes as f64), device),
        }
    }

    /// The images and the labels as host data.
    pub fn to_data(&self) -> Vec<TensorData> {
        vec![self.images.to_data(), self.labels.to_data()]
    }

    /// The batch of [`ImageBatch::to_data`]'s data on `device`.
    pub fn from_data(data: Vec<TensorData>, device: &B::Device) -> Self {
        let [images, labels] = <[TensorData; 2]>::try_from(data).expect("an image batch holds two tensors");
        Self {
            images: Tensor::from_data(images, device),
            labels: Tensor::from_data(labels, device),
        }
    }

    /// Mean cross-entropy of `logits` (`[N, classes]`) against the labels (Burn's loss when
    /// `stock`, else this crate's drop-in).
    pub fn loss(&self, logits: Tensor<B, 2>, stock: bool) -> Tensor<B, 1> {
        cross_entropy(logits, self.labels.clone(), stock)
    }
}

impl<B: Backend> TrainModel<B> for resnet::ResNet<B> {
    type Config = resnet::ResNetConfig;
    type Batch = ImageBatch<B>;
    const UNIT: &'static str = "images";

    fn init(config: &Self::Config, device: &B::Device) -> Self {
        config.init(device)
    }

    /// ImageNet-sized (224×224) images.
    fn synthetic_batch(config: &Self::Config, n: usize, device: &B::Device) -> Self::Batch {
        ImageBatch::synthetic(n, 224, config.classes, device)
    }

    fn loss(&self, batch: &Self::Batch) -> Tensor<B, 1> {
        batch.loss(self.forward(batch.images.clone()), self.is_stock())
    }

    fn batch_to_data(batch: &Self::Batch) -> Vec<TensorData> {
        batch.to_data()
    }

    fn batch_from_data(data: Vec<TensorData>, device: &B::Device) -> Self::Batch {
        ImageBatch::from_data(data, device)
    }
}
