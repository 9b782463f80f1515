//! A drop-in for `burn::nn::BatchNorm`: same config, fields and record; fused on our
//! backends.

use burn_core as burn;
use burn_core::config::Config;
use burn_core::module::{Initializer, Module, Param, RunningState};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{Tensor, TensorPrimitive};

use crate::burn::route::{cast, on_our_backend};
use crate::burn::training::TrainingOps;
use crate::ops::BatchNormOptions;

/// Configuration of [`BatchNorm`] (the fields and defaults of `burn::nn::BatchNormConfig`).
#[derive(Config, Debug)]
pub struct BatchNormConfig {
    /// The number of features (channels).
    pub num_features: usize,
    /// Added to the variance for numerical stability. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f64,
    /// Weight of the batch statistics in the running statistics. Default: 0.1.
    #[config(default = 0.1)]
    pub momentum: f64,
}

/// Batch normalization over `[batch, channels, ...]` tensors, a drop-in for
/// `burn::nn::BatchNorm` with the same fields, so records (checkpoints) load both ways.
///
/// On `Cudnn` and `Autodiff<Cudnn>` one fused kernel pass computes the statistics and the
/// output (training: batch statistics and a running update; inference: the running
/// statistics) and the backward pass is fused too; on any other backend it computes what
/// `burn::nn::BatchNorm` computes, from Burn's ops. As in Burn, training mode is chosen
/// when the backend tracks gradients, and the running variance takes the biased batch
/// variance.
#[derive(Module, Debug)]
pub struct BatchNorm<B: Backend> {
    /// The learnable scale (gamma).
    pub gamma: Param<Tensor<B, 1>>,
    /// The learnable shift (beta).
    pub beta: Param<Tensor<B, 1>>,
    /// The running mean.
    pub running_mean: RunningState<Tensor<B, 1>>,
    /// The running variance.
    pub running_var: RunningState<Tensor<B, 1>>,
    /// Weight of the batch statistics in the running update.
    pub momentum: f64,
    /// Added to the variance for numerical stability.
    pub epsilon: f64,
}

impl BatchNormConfig {
    /// A new [`BatchNorm`]: scale 1, shift 0, running mean 0 and variance 1.
    pub fn init<B: Backend>(&self, device: &B::Device) -> BatchNorm<B> {
        let n = self.num_features;
        BatchNorm {
            gamma: Initializer::Ones.init([n], device),
            beta: Initializer::Zeros.init([n], device),
            running_mean: RunningState::new(Tensor::zeros([n], device)),
            running_var: RunningState::new(Tensor::ones([n], device)),
            momentum: self.momentum,
            epsilon: self.epsilon,
        }
    }
}

impl<B: Backend> BatchNorm<B> {
    /// Normalizes `input` (`[batch, channels, ...]`, rank >= 2).
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_fused(input, None, false)
    }

    /// `relu(forward(input))`, fused into the normalization on our backends.
    pub fn forward_relu<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_fused(input, None, true)
    }

    /// `relu(forward(input) + residual)` (a ResNet block's tail), fused on our backends.
    pub fn forward_add_relu<const D: usize>(&self, input: Tensor<B, D>, residual: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_fused(input, Some(residual), true)
    }

    fn forward_fused<const D: usize>(
        &self,
        input: Tensor<B, D>,
        residual: Option<Tensor<B, D>>,
        relu: bool,
    ) -> Tensor<B, D> {
        if D < 2 {
            panic!(
                "BatchNorm can only be applied on tensors of rank >= 2 with the shape [batch_size, channels, ...], \
                 received a {D}-D tensor"
            );
        }
        on_our_backend!(B, T => self.fused::<T, D>(input, residual, relu), else self.composed(input, residual, relu))
    }

    /// The fused path on backend `T` (which is `B`).
    fn fused<T: TrainingOps, const D: usize>(
        &self,
        input: Tensor<B, D>,
        residual: Option<Tensor<B, D>>,
        relu: bool,
    ) -> Tensor<B, D> {
        let x: Tensor<T, D> = cast(input);
        let device = x.device();
        let prim = |t: Tensor<T, 1>| t.into_primitive().tensor();
        let gamma = prim(cast(self.gamma.val()));
        let beta = prim(cast(self.beta.val()));
        let residual = residual.map(|z| cast::<B, T, D>(z).into_primitive().tensor());
        let wrap = |p| cast::<T, B, D>(Tensor::from_primitive(TensorPrimitive::Float(p)));
        if T::ad_enabled(&device) {
            let rm = prim(cast(self.running_mean.value_sync()).to_device(&device));
            let rv = prim(cast(self.running_var.value_sync()).to_device(&device));
            let options = BatchNormOptions {
                epsilon: self.epsilon,
                momentum: self.momentum,
                unbiased_running_var: false,
                relu,
            };
            let out = T::batch_norm_train(x.into_primitive().tensor(), gamma, beta, residual, rm, rv, options);
            let running = |p| cast::<T, B, 1>(Tensor::from_primitive(TensorPrimitive::Float(p)));
            self.running_mean.update(running(out.running_mean));
            self.running_var.update(running(out.running_var));
            wrap(out.output)
        } else {
            let rm = prim(cast(self.running_mean.value()).to_device(&device));
            let rv = prim(cast(self.running_var.value()).to_device(&device));
            let y = T::batch_norm_inference(
                x.into_primitive().tensor(),
                gamma,
                beta,
                residual,
                rm,
                rv,
                self.epsilon,
                relu,
            );
            wrap(y)
        }
    }

    /// What `burn::nn::BatchNorm` computes, from Burn's ops (any backend), then the
    /// residual and ReLU.
    fn composed<const D: usize>(&self, x: Tensor<B, D>, residual: Option<Tensor<B, D>>, relu: bool) -> Tensor<B, D> {
        let device = x.device();
        let dims = x.dims();
        let channels = dims[1];
        let mut per_channel = [1usize; D];
        per_channel[1] = channels;
        let (mean, var) = if B::ad_enabled(&device) {
            // Batch statistics over every dim but the channel one.
            let rows = dims.iter().product::<usize>() / channels;
            let by_channel = |t: Tensor<B, D>| {
                t.swap_dims(0, 1)
                    .reshape([channels, rows])
                    .mean_dim(1)
                    .reshape(per_channel)
            };
            let mean = by_channel(x.clone());
            let var = by_channel(x.clone().sub(mean.clone()).square());
            let blend = |running: Tensor<B, 1>, batch: Tensor<B, D>| {
                running
                    .mul_scalar(1.0 - self.momentum)
                    .add(batch.detach().mul_scalar(self.momentum).reshape([channels]))
                    .detach()
            };
            let running_mean = self.running_mean.value_sync().to_device(&device);
            let running_var = self.running_var.value_sync().to_device(&device);
            self.running_mean.update(blend(running_mean, mean.clone()));
            self.running_var.update(blend(running_var, var.clone()));
            (mean, var)
        } else {
            let mean = self.running_mean.value().to_device(&device).reshape(per_channel);
            let var = self.running_var.value().to_device(&device).reshape(per_channel);
            (mean, var)
        };
        let std = var.add_scalar(self.epsilon).sqrt();
        let y = x
            .sub(mean)
            .div(std)
            .mul(self.gamma.val().reshape(per_channel))
            .add(self.beta.val().reshape(per_channel));
        let y = match residual {
            Some(z) => y + z,
            None => y,
        };
        if relu {
            burn_core::tensor::activation::relu(y)
        } else {
            y
        }
    }
}
