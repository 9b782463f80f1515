//! candle-nn-compatible layers running on our cuDNN ops.
//!
//! Each constructor loads the same `VarBuilder` names, shapes and initialisers as its
//! candle-nn namesake (`weight`, `bias`, `running_mean`, `running_var`; `gamma`/`beta`
//! aliases for norms), so a candle-nn model switches by changing its imports:
//!
//! ```ignore
//! // use candle_nn::{conv2d, linear, batch_norm, Conv2dConfig};
//! use cudnn_backend::candle::nn::{conv2d, linear, batch_norm, Conv2dConfig};
//! ```
//!
//! Convolutions and linear layers run our cuDNN graphs (bias and an optional activation fused
//! into the same graph). Layer and RMS norm run cuDNN's norm graph, or the engine's norm
//! kernels when a gradient can be needed (fused backward); [`BatchNorm`] trains on the fused
//! batch-norm op ([`ops::batch_norm_train`]) and infers with Candle ops.

use candle_core::{DType, Module, ModuleT, Result, Tensor, Var};
use candle_nn::Init;
pub use candle_nn::{BatchNormConfig, Conv1dConfig, Conv2dConfig, ConvTranspose2dConfig, LayerNormConfig, VarBuilder};

use super::ext::CudnnExt;
use super::ops;
use crate::ops::{Activation, ConvParams};

fn conv_params(spatial: usize, padding: usize, stride: usize, dilation: usize, groups: usize) -> ConvParams {
    let v = |x: usize| vec![x as i64; spatial];
    ConvParams::new(&v(padding), &v(stride), &v(dilation), groups as i64)
}

fn bias_init(fan_in: usize) -> Init {
    let bound = 1. / (fan_in as f64).sqrt();
    Init::Uniform { lo: -bound, up: bound }
}

/// A convolution layer of any rank with an optional bias and an optional fused activation.
#[derive(Clone, Debug)]
struct ConvCore {
    weight: Tensor,
    bias: Option<Tensor>,
    params: ConvParams,
    act: Activation,
}

impl ConvCore {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match (&self.bias, self.act) {
            (None, Activation::Identity) => ops::conv(x, &self.weight, &self.params),
            (Some(b), act) => ops::conv_bias_act(x, &self.weight, b, &self.params, act),
            (None, act) => {
                let k = self.weight.dims()[0];
                let zero = Tensor::zeros(k, self.weight.dtype(), self.weight.device())?;
                ops::conv_bias_act(x, &self.weight, &zero, &self.params, act)
            }
        }
    }
}

/// 2-D convolution, a drop-in for `candle_nn::Conv2d` (bias + activation fused).
#[derive(Clone, Debug)]
pub struct Conv2d {
    core: ConvCore,
    config: Conv2dConfig,
}

impl Conv2d {
    /// Loads `weight` (out, in/groups, k, k) and `bias` (out) from `vb`, as
    /// `candle_nn::conv2d(in_channels, out_channels, kernel_size, config, vb)` does.
    pub fn new(
        vb: VarBuilder,
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        config: Conv2dConfig,
    ) -> Result<Self> {
        conv2d(in_channels, out_channels, kernel_size, config, vb)
    }

    /// A layer from tensors: weight (out, in/groups, kh, kw), optional bias (out).
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>, config: Conv2dConfig) -> Self {
        let params = conv_params(2, config.padding, config.stride, config.dilation, config.groups);
        Self {
            core: ConvCore {
                weight,
                bias,
                params,
                act: Activation::Identity,
            },
            config,
        }
    }

    /// Fuses `act` after the bias (one cuDNN graph: conv → bias → activation).
    pub fn with_activation(mut self, act: Activation) -> Self {
        self.core.act = act;
        self
    }

    /// The filter.
    pub fn weight(&self) -> &Tensor {
        &self.core.weight
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.core.bias.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &Conv2dConfig {
        &self.config
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.core.forward(x)
    }
}

/// `candle_nn::conv2d` with our layer: loads `weight` and `bias`.
pub fn conv2d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv2dConfig,
    vb: VarBuilder,
) -> Result<Conv2d> {
    let ws = vb.get_with_hints(
        (out_channels, in_channels / cfg.groups, kernel_size, kernel_size),
        "weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    let bs = vb.get_with_hints(out_channels, "bias", bias_init(in_channels))?;
    Ok(Conv2d::from_weights(ws, Some(bs), cfg))
}

/// `candle_nn::conv2d_no_bias` with our layer: loads `weight`.
pub fn conv2d_no_bias(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv2dConfig,
    vb: VarBuilder,
) -> Result<Conv2d> {
    let ws = vb.get_with_hints(
        (out_channels, in_channels / cfg.groups, kernel_size, kernel_size),
        "weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    Ok(Conv2d::from_weights(ws, None, cfg))
}

/// 1-D convolution, a drop-in for `candle_nn::Conv1d`.
#[derive(Clone, Debug)]
pub struct Conv1d {
    core: ConvCore,
    config: Conv1dConfig,
}

impl Conv1d {
    /// A layer from tensors: weight (out, in/groups, k), optional bias (out).
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>, config: Conv1dConfig) -> Self {
        let params = conv_params(1, config.padding, config.stride, config.dilation, config.groups);
        Self {
            core: ConvCore {
                weight,
                bias,
                params,
                act: Activation::Identity,
            },
            config,
        }
    }

    /// Fuses `act` after the bias.
    pub fn with_activation(mut self, act: Activation) -> Self {
        self.core.act = act;
        self
    }

    /// The filter.
    pub fn weight(&self) -> &Tensor {
        &self.core.weight
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.core.bias.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &Conv1dConfig {
        &self.config
    }
}

impl Module for Conv1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.core.forward(x)
    }
}

/// `candle_nn::conv1d` with our layer: loads `weight` and `bias`.
pub fn conv1d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv1dConfig,
    vb: VarBuilder,
) -> Result<Conv1d> {
    let ws = vb.get_with_hints(
        (out_channels, in_channels / cfg.groups, kernel_size),
        "weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    let bs = vb.get_with_hints(out_channels, "bias", bias_init(in_channels))?;
    Ok(Conv1d::from_weights(ws, Some(bs), cfg))
}

/// `candle_nn::conv1d_no_bias` with our layer: loads `weight`.
pub fn conv1d_no_bias(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv1dConfig,
    vb: VarBuilder,
) -> Result<Conv1d> {
    let ws = vb.get_with_hints(
        (out_channels, in_channels / cfg.groups, kernel_size),
        "weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    Ok(Conv1d::from_weights(ws, None, cfg))
}

/// 2-D transposed convolution, a drop-in for `candle_nn::ConvTranspose2d`.
#[derive(Clone, Debug)]
pub struct ConvTranspose2d {
    weight: Tensor,
    bias: Option<Tensor>,
    config: ConvTranspose2dConfig,
}

impl ConvTranspose2d {
    /// A layer from tensors: weight (in, out, kh, kw), optional bias (out).
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>, config: ConvTranspose2dConfig) -> Self {
        Self { weight, bias, config }
    }

    /// The filter.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &ConvTranspose2dConfig {
        &self.config
    }
}

impl Module for ConvTranspose2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let p = conv_params(2, c.padding, c.stride, c.dilation, 1);
        let y = ops::conv_transpose(x, &self.weight, &p, &[c.output_padding; 2])?;
        match &self.bias {
            None => Ok(y),
            Some(b) => y.broadcast_add(&b.reshape((1, b.elem_count(), 1, 1))?),
        }
    }
}

/// `candle_nn::conv_transpose2d` with our layer: loads `weight` (in, out, k, k) and `bias`.
pub fn conv_transpose2d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: ConvTranspose2dConfig,
    vb: VarBuilder,
) -> Result<ConvTranspose2d> {
    let bound = 1. / (out_channels as f64 * kernel_size as f64).sqrt();
    let init = Init::Uniform { lo: -bound, up: bound };
    let ws = vb.get_with_hints((in_channels, out_channels, kernel_size, kernel_size), "weight", init)?;
    let bs = vb.get_with_hints(out_channels, "bias", init)?;
    Ok(ConvTranspose2d::from_weights(ws, Some(bs), cfg))
}

/// Fully connected layer, a drop-in for `candle_nn::Linear`: `y = x·wᵀ + b` as one fused
/// cuDNN matmul graph (w is read transposed through its strides, no copy).
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    act: Activation,
}

impl Linear {
    /// A layer from tensors: weight (out, in), optional bias (out).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self {
            weight,
            bias,
            act: Activation::Identity,
        }
    }

    /// Fuses `act` after the bias.
    pub fn with_activation(mut self, act: Activation) -> Self {
        self.act = act;
        self
    }

    /// The weight (out, in).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let (k, out) = (self.weight.dims()[1], self.weight.dims()[0]);
        let x2 = if dims.len() == 2 {
            x.clone()
        } else {
            x.reshape(((), k))?
        };
        let wt = self.weight.t()?;
        let y = match (&self.bias, self.act) {
            (None, Activation::Identity) => ops::matmul(&x2, &wt)?,
            (Some(b), act) => ops::matmul_bias_act(&x2, &wt, b, act)?,
            (None, act) => {
                let zero = Tensor::zeros(out, self.weight.dtype(), self.weight.device())?;
                ops::matmul_bias_act(&x2, &wt, &zero, act)?
            }
        };
        if dims.len() == 2 {
            return Ok(y);
        }
        // x's leading dims with the features replaced by `out` (x.reshape above proved rank >= 1).
        let mut shape = dims;
        shape.pop();
        shape.push(out);
        y.reshape(shape)
    }
}

/// `candle_nn::linear` with our layer: loads `weight` (out, in) and `bias` (out).
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let ws = vb.get_with_hints((out_dim, in_dim), "weight", candle_nn::init::DEFAULT_KAIMING_NORMAL)?;
    let bs = vb.get_with_hints(out_dim, "bias", bias_init(in_dim))?;
    Ok(Linear::new(ws, Some(bs)))
}

/// `candle_nn::linear_no_bias` with our layer: loads `weight`.
pub fn linear_no_bias(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let ws = vb.get_with_hints((out_dim, in_dim), "weight", candle_nn::init::DEFAULT_KAIMING_NORMAL)?;
    Ok(Linear::new(ws, None))
}

/// Embedding table, a drop-in for `candle_nn::Embedding`: rows looked up by id; on CUDA its
/// backward pass is the engine's scatter-add ([`ops::embedding_lookup`]) instead of Candle's
/// `index_add`, which walks all ids on a few threads.
#[derive(Clone, Debug)]
pub struct Embedding {
    embeddings: Tensor,
    hidden_size: usize,
}

impl Embedding {
    /// A layer from its table `(vocabulary, hidden_size)`.
    pub fn new(embeddings: Tensor, hidden_size: usize) -> Self {
        Self {
            embeddings,
            hidden_size,
        }
    }

    /// The table `(vocabulary, hidden_size)`.
    pub fn embeddings(&self) -> &Tensor {
        &self.embeddings
    }

    /// The width of one embedding.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }
}

impl Module for Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        ops::embedding_lookup(&self.embeddings, ids)
    }
}

/// `candle_nn::embedding` with our layer: loads `weight` `(in_size, out_size)` drawn from
/// N(0, 1), as candle-nn does.
pub fn embedding(in_size: usize, out_size: usize, vb: VarBuilder) -> Result<Embedding> {
    let embeddings = vb.get_with_hints((in_size, out_size), "weight", Init::Randn { mean: 0., stdev: 1. })?;
    Ok(Embedding::new(embeddings, out_size))
}

/// Layer norm over the last dim (`remove_mean`) or RMS norm, a drop-in for
/// `candle_nn::LayerNorm`: [`CudnnExt::cudnn_layer_norm`] / `cudnn_rms_norm` (on CUDA a cuDNN
/// norm graph, or the engine's norm kernels with their fused backward when a gradient can be
/// needed; Candle ops with f32 statistics elsewhere).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Option<Tensor>,
    remove_mean: bool,
    eps: f64,
}

impl LayerNorm {
    /// Layer norm with weight and bias.
    pub fn new(weight: Tensor, bias: Tensor, eps: f64) -> Self {
        Self {
            weight,
            bias: Some(bias),
            remove_mean: true,
            eps,
        }
    }

    /// RMS norm (no mean removal, no bias).
    pub fn rms_norm(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            bias: None,
            remove_mean: false,
            eps,
        }
    }

    /// The scale.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The shift, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.remove_mean {
            x.cudnn_layer_norm(&self.weight, self.bias.as_ref(), self.eps)
        } else {
            let y = x.cudnn_rms_norm(&self.weight, self.eps)?;
            match &self.bias {
                Some(b) => y.broadcast_add(b),
                None => Ok(y),
            }
        }
    }
}

fn first_present(vb: &VarBuilder, names: [&'static str; 2]) -> &'static str {
    names.into_iter().find(|n| vb.contains_tensor(n)).unwrap_or(names[0])
}

/// `candle_nn::layer_norm` with our layer: loads `weight` (or `gamma`) and, when affine,
/// `bias` (or `beta`).
pub fn layer_norm<C: Into<LayerNormConfig>>(size: usize, config: C, vb: VarBuilder) -> Result<LayerNorm> {
    let config = config.into();
    let weight = vb.get_with_hints(size, first_present(&vb, ["weight", "gamma"]), Init::Const(1.))?;
    let bias = if config.affine {
        Some(vb.get_with_hints(size, first_present(&vb, ["bias", "beta"]), Init::Const(0.))?)
    } else {
        None
    };
    Ok(LayerNorm {
        weight,
        bias,
        remove_mean: config.remove_mean,
        eps: config.eps,
    })
}

/// RMS norm, a drop-in for `candle_nn::RmsNorm`.
#[derive(Clone, Debug)]
pub struct RmsNorm(LayerNorm);

impl RmsNorm {
    /// RMS norm with a scale.
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self(LayerNorm::rms_norm(weight, eps))
    }

    /// As a [`LayerNorm`].
    pub fn into_inner(self) -> LayerNorm {
        self.0
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// `candle_nn::rms_norm` with our layer: loads `weight` (or `gamma`).
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<RmsNorm> {
    let config = LayerNormConfig {
        eps,
        remove_mean: false,
        affine: false,
    };
    Ok(RmsNorm(layer_norm(size, config, vb)?))
}

/// Batch norm over channel dim 1, a drop-in for `candle_nn::BatchNorm` (`ModuleT`: training
/// uses batch statistics and updates the running ones, as candle-nn does).
///
/// Training (`forward_t(x, true)`) runs the fused op [`ops::batch_norm_train`]: on CUDA the
/// engine's batch-norm kernels (statistics, running update and output in three launches, the
/// backward pass's dx, dweight and dbias in three more), NCHW or channels-last, f32/f16/bf16
/// data with parameters and statistics of f32 or the data's dtype; on the CPU the float64
/// reference. The running statistics follow candle-nn 0.11: `running = (1 - momentum) ·
/// running + momentum · batch`, the running variance taking the *unbiased* batch variance
/// (`/ (M - 1)` over the M values of a channel), the output normalized with the biased one. They
/// are updated in place in the variables loaded from the `VarBuilder` (`running_mean`,
/// `running_var`), so a `VarMap` saves them. Each channel needs more than one value per batch
/// (an error otherwise, as in PyTorch).
///
/// Composed of Candle ops with f32 statistics instead (the same results): without mean removal
/// (`remove_mean: false`, which the fused op does not do), for parameters of mixed dtypes, on
/// other devices, and after [`BatchNorm::with_fused_training`]`(false)`. Inference uses the
/// running statistics (composed of Candle ops).
#[derive(Clone, Debug)]
pub struct BatchNorm {
    running_mean: Var,
    running_var: Var,
    weight_and_bias: Option<(Tensor, Tensor)>,
    remove_mean: bool,
    eps: f64,
    momentum: f64,
    fused: bool,
}

impl BatchNorm {
    /// The running mean.
    pub fn running_mean(&self) -> &Tensor {
        self.running_mean.as_tensor()
    }

    /// The running variance.
    pub fn running_var(&self) -> &Tensor {
        self.running_var.as_tensor()
    }

    /// Scale and shift, when affine.
    pub fn weight_and_bias(&self) -> Option<(&Tensor, &Tensor)> {
        self.weight_and_bias.as_ref().map(|(w, b)| (w, b))
    }

    /// The layer training on the fused op (`true`, the default) or on the composition of
    /// Candle ops (`false`: what it did before the fused op; for comparisons).
    pub fn with_fused_training(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    /// `relu(forward_t(x, train))`; in training on the fused op, the ReLU runs inside it
    /// (forward and backward).
    pub fn forward_relu_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if train && self.fused_applies(x) {
            self.check_channels(x)?;
            return self.forward_fused(x, true);
        }
        self.forward_t(x, train)?.relu()
    }

    /// `relu(forward_t(x, train) + residual)`, a residual block's tail; in training on the
    /// fused op, the add and the ReLU run inside it (forward and backward), so they are no
    /// Candle graph nodes of their own. The residual has x's dims and dtype.
    pub fn forward_add_relu_t(&self, x: &Tensor, residual: &Tensor, train: bool) -> Result<Tensor> {
        if train && self.fused_applies(x) && residual.dtype() == x.dtype() {
            self.check_channels(x)?;
            let options = self.fused_options(true);
            let wb = self.weight_and_bias.as_ref().map(|(w, b)| (w, b));
            return ops::batch_norm_add_train(x, residual, wb, Some((&self.running_mean, &self.running_var)), &options);
        }
        (self.forward_t(x, train)? + residual)?.relu()
    }

    /// Whether training can run on the fused op: mean removal, a float input on the CPU or
    /// CUDA, and all per-channel tensors of one dtype that is f32 or x's.
    fn fused_applies(&self, x: &Tensor) -> bool {
        let dt = x.dtype();
        let float = match x.device() {
            candle_core::Device::Cpu => matches!(dt, DType::F32 | DType::F16 | DType::BF16 | DType::F64),
            candle_core::Device::Cuda(_) => matches!(dt, DType::F32 | DType::F16 | DType::BF16),
            _ => false,
        };
        let pdt = self.running_mean.dtype();
        let params_ok = (pdt == DType::F32 || pdt == dt)
            && self.running_var.dtype() == pdt
            && self
                .weight_and_bias
                .as_ref()
                .is_none_or(|(w, b)| w.dtype() == pdt && b.dtype() == pdt);
        self.fused && self.remove_mean && float && params_ok
    }

    /// The fused op's options: this layer's epsilon and momentum, PyTorch's unbiased running
    /// variance.
    fn fused_options(&self, relu: bool) -> crate::ops::BatchNormOptions {
        crate::ops::BatchNormOptions {
            epsilon: self.eps,
            momentum: self.momentum,
            unbiased_running_var: true,
            relu,
        }
    }

    fn forward_fused(&self, x: &Tensor, relu: bool) -> Result<Tensor> {
        let options = self.fused_options(relu);
        let wb = self.weight_and_bias.as_ref().map(|(w, b)| (w, b));
        ops::batch_norm_train(x, wb, Some((&self.running_mean, &self.running_var)), &options)
    }

    fn check_channels(&self, x: &Tensor) -> Result<()> {
        let c = self.running_mean.as_tensor().dim(0)?;
        if x.rank() < 2 || x.dim(1)? != c {
            return Err(super::arg_err(
                "batch_norm",
                "x",
                format!("needs rank >= 2 and {c} channels in dim 1, got {:?}", x.dims()),
            ));
        }
        Ok(())
    }

    /// Training on Candle ops with f32 (f64) statistics.
    fn forward_composed(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let sd = if dt == DType::F64 { DType::F64 } else { DType::F32 };
        // (C, everything else)
        let xt = x.to_dtype(sd)?.transpose(0, 1)?.flatten_from(1)?;
        let count = xt.dim(1)? as f64;
        let mean = if self.remove_mean {
            xt.mean_keepdim(1)?
        } else {
            xt.zeros_like()?.narrow(1, 0, 1)?
        };
        let xc = xt.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(1)?;
        let m = self.momentum;
        let rm = self.running_mean.as_tensor();
        let rv = self.running_var.as_tensor();
        if self.remove_mean {
            let new_mean = ((rm.to_dtype(sd)? * (1.0 - m))? + (mean.flatten_all()? * m)?)?;
            self.running_mean.set(&new_mean.to_dtype(rm.dtype())?.detach())?;
        }
        let unbiased = (var.flatten_all()? * (count / (count - 1.0).max(1.0)))?;
        let new_var = ((rv.to_dtype(sd)? * (1.0 - m))? + (unbiased * m)?)?;
        self.running_var.set(&new_var.to_dtype(rv.dtype())?.detach())?;
        let shape: Vec<usize> = x
            .dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if i == 1 { d } else { 1 })
            .collect();
        let y = x
            .to_dtype(sd)?
            .broadcast_sub(&mean.reshape(shape.as_slice())?)?
            .broadcast_div(&(var + self.eps)?.sqrt()?.reshape(shape.as_slice())?)?;
        let y = match &self.weight_and_bias {
            Some((w, b)) => y
                .broadcast_mul(&w.to_dtype(sd)?.reshape(shape.as_slice())?)?
                .broadcast_add(&b.to_dtype(sd)?.reshape(shape.as_slice())?)?,
            None => y,
        };
        y.to_dtype(dt)
    }
}

impl ModuleT for BatchNorm {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if train {
            self.check_channels(x)?;
            if self.fused_applies(x) {
                return self.forward_fused(x, false);
            }
            return self.forward_composed(x);
        }
        let (w, b) = match &self.weight_and_bias {
            Some((w, b)) => (Some(w), Some(b)),
            None => (None, None),
        };
        let mean = self.running_mean.as_detached_tensor();
        let var = self.running_var.as_detached_tensor();
        x.cudnn_batch_norm(&mean, &var, w, b, self.eps)
    }
}

/// `candle_nn::batch_norm` with our layer: loads `running_mean`, `running_var` and, when
/// affine, `weight` and `bias`.
pub fn batch_norm<C: Into<BatchNormConfig>>(num_features: usize, config: C, vb: VarBuilder) -> Result<BatchNorm> {
    let config = config.into();
    if config.eps < 0. {
        return Err(super::arg_err(
            "batch_norm",
            "eps",
            format!("{} is negative", config.eps),
        ));
    }
    let running_mean = vb.get_with_hints(num_features, "running_mean", Init::Const(0.))?;
    let running_var = vb.get_with_hints(num_features, "running_var", Init::Const(1.))?;
    let weight_and_bias = if config.affine {
        let w = vb.get_with_hints(num_features, "weight", Init::Const(1.))?;
        let b = vb.get_with_hints(num_features, "bias", Init::Const(0.))?;
        Some((w, b))
    } else {
        None
    };
    Ok(BatchNorm {
        running_mean: Var::from_tensor(&running_mean)?,
        running_var: Var::from_tensor(&running_var)?,
        weight_and_bias,
        remove_mean: config.remove_mean,
        eps: config.eps,
        momentum: config.momentum,
        fused: true,
    })
}
