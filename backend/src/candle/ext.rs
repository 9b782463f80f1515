//! [`CudnnExt`]: the extension trait on `candle_core::Tensor`.

use candle_core::{DType, Result, Tensor, D};

use super::ops;
use crate::graph::NormMode;
use crate::ops::{Activation, ConvParams, PoolMode, PoolParams};

fn i(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// 1-D convolution parameters (symmetric padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dParams {
    /// Zero padding on both sides.
    pub padding: usize,
    /// Stride.
    pub stride: usize,
    /// Dilation.
    pub dilation: usize,
    /// Groups.
    pub groups: usize,
}

impl Default for Conv1dParams {
    fn default() -> Self {
        Self {
            padding: 0,
            stride: 1,
            dilation: 1,
            groups: 1,
        }
    }
}

impl From<Conv1dParams> for ConvParams {
    fn from(p: Conv1dParams) -> Self {
        ConvParams::new(&i(&[p.padding]), &i(&[p.stride]), &i(&[p.dilation]), p.groups as i64)
    }
}

/// 2-D convolution parameters (symmetric padding per spatial dim; for asymmetric padding
/// use [`ConvParams::with_post_padding`] and [`CudnnExt::cudnn_conv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Zero padding (height, width) on both sides.
    pub padding: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Self {
            padding: [0; 2],
            stride: [1; 2],
            dilation: [1; 2],
            groups: 1,
        }
    }
}

impl From<Conv2dParams> for ConvParams {
    fn from(p: Conv2dParams) -> Self {
        ConvParams::new(&i(&p.padding), &i(&p.stride), &i(&p.dilation), p.groups as i64)
    }
}

/// 3-D convolution parameters (symmetric padding per spatial dim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv3dParams {
    /// Zero padding (depth, height, width) on both sides.
    pub padding: [usize; 3],
    /// Stride.
    pub stride: [usize; 3],
    /// Dilation.
    pub dilation: [usize; 3],
    /// Groups.
    pub groups: usize,
}

impl Default for Conv3dParams {
    fn default() -> Self {
        Self {
            padding: [0; 3],
            stride: [1; 3],
            dilation: [1; 3],
            groups: 1,
        }
    }
}

impl From<Conv3dParams> for ConvParams {
    fn from(p: Conv3dParams) -> Self {
        ConvParams::new(&i(&p.padding), &i(&p.stride), &i(&p.dilation), p.groups as i64)
    }
}

/// 2-D transposed convolution parameters (PyTorch's `conv_transpose2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dParams {
    /// Padding removed from both sides of the output.
    pub padding: [usize; 2],
    /// Extra size added to one side of the output (smaller than stride or dilation).
    pub output_padding: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Dilation.
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
}

impl Default for ConvTranspose2dParams {
    fn default() -> Self {
        Self {
            padding: [0; 2],
            output_padding: [0; 2],
            stride: [1; 2],
            dilation: [1; 2],
            groups: 1,
        }
    }
}

/// cuDNN ops on Candle tensors. Every method works on `Device::Cpu` (a float64 reference)
/// and, with the `candle-cuda` feature, on `Device::Cuda` tensors through cuDNN on Candle's
/// stream; every method supports Candle's autograd.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use cudnn_backend::candle::{Conv2dParams, CudnnExt};
///
/// let x = Tensor::randn(0f32, 1.0, (2, 3, 8, 8), &Device::Cpu)?;
/// let w = Tensor::randn(0f32, 1.0, (4, 3, 3, 3), &Device::Cpu)?;
/// let params = Conv2dParams { padding: [1, 1], ..Default::default() };
/// let y = x.cudnn_conv2d(&w, params)?;
/// assert_eq!(y.dims(), &[2, 4, 8, 8]);
/// assert_eq!(y.dtype(), DType::F32);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub trait CudnnExt {
    /// N-d convolution: self (N, C, spatial...) by `w` (K, C/groups, window...), any padding
    /// (also asymmetric), stride, dilation and groups (one grouped graph).
    fn cudnn_conv(&self, w: &Tensor, params: &ConvParams) -> Result<Tensor>;
    /// 1-D convolution: self (N, C, L), `w` (K, C/groups, k).
    fn cudnn_conv1d(&self, w: &Tensor, params: Conv1dParams) -> Result<Tensor>;
    /// 2-D convolution: self (N, C, H, W), `w` (K, C/groups, kh, kw).
    fn cudnn_conv2d(&self, w: &Tensor, params: Conv2dParams) -> Result<Tensor>;
    /// 3-D convolution: self (N, C, D, H, W), `w` (K, C/groups, kd, kh, kw).
    fn cudnn_conv3d(&self, w: &Tensor, params: Conv3dParams) -> Result<Tensor>;
    /// 2-D transposed convolution: self (N, Cin, H, W), `w` (Cin, Cout/groups, kh, kw).
    fn cudnn_conv_transpose2d(&self, w: &Tensor, params: ConvTranspose2dParams) -> Result<Tensor>;
    /// `act(conv(self, w) + b)` as one fused cuDNN graph (N-d); `b` has K elements.
    fn cudnn_conv_bias_act(&self, w: &Tensor, b: &Tensor, params: &ConvParams, act: Activation) -> Result<Tensor>;
    /// `act(conv2d(self, w) + b)` as one fused cuDNN graph.
    fn cudnn_conv2d_bias_act(&self, w: &Tensor, b: &Tensor, params: Conv2dParams, act: Activation) -> Result<Tensor>;
    /// `self · b` (ranks >= 2, batch dims broadcast; transposed operands through strides).
    fn cudnn_matmul(&self, b: &Tensor) -> Result<Tensor>;
    /// `act(self · b + bias)` as one fused cuDNN graph; `bias` has N elements.
    fn cudnn_matmul_bias_act(&self, b: &Tensor, bias: &Tensor, act: Activation) -> Result<Tensor>;
    /// Pooling with explicit parameters (any number of spatial dims, symmetric padding).
    fn cudnn_pool(&self, params: &PoolParams) -> Result<Tensor>;
    /// 2-D max pooling: `kernel`, `stride` and `padding` as (height, width).
    fn cudnn_max_pool2d(&self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<Tensor>;
    /// 2-D average pooling; `count_include_pad` divides by the whole window (else by the
    /// in-bounds elements).
    fn cudnn_avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
    ) -> Result<Tensor>;
    /// Layer norm over the last dim, with optional bias. On CUDA (f32, f16, bf16; parameters of
    /// x's dtype) one cuDNN norm graph, or, when a gradient can be needed, the engine's norm
    /// kernel saving the row statistics, and the backward pass (dx, dweight, dbias) is one
    /// engine call from them ([`ops::norm`]). Candle ops with f32 statistics otherwise.
    fn cudnn_layer_norm(&self, weight: &Tensor, bias: Option<&Tensor>, eps: f64) -> Result<Tensor>;
    /// RMS norm over the last dim: on CUDA (f32, f16, bf16) as
    /// [`cudnn_layer_norm`](CudnnExt::cudnn_layer_norm) (forward and fused backward), Candle
    /// ops with f32 statistics otherwise.
    fn cudnn_rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor>;
    /// Batch norm with given statistics over channel dim 1 (inference form):
    /// `(x - mean) / sqrt(var + eps) · weight + bias`. Composed of Candle ops; training with
    /// batch statistics is [`ops::batch_norm_train`] (what
    /// [`nn::BatchNorm`](super::nn::BatchNorm) runs in training).
    fn cudnn_batch_norm(
        &self,
        mean: &Tensor,
        var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor>;
    /// Scaled dot-product attention `softmax(q·kᵀ·scale + mask)·v` with q = self
    /// (.., Lq, D), k (.., Lk, D), v (.., Lk, Dv). `mask` broadcasts to (.., Lq, Lk): a U8
    /// mask keeps positions where it is non-zero, any float mask is added to the scores.
    /// Without a mask, rank-4 inputs on CUDA run as the [`ops::Sdpa`] op: f16/bf16 with head
    /// dims that are multiples of 8 (≤ 256) as one fused cuDNN attention graph, whose backward
    /// pass is cuDNN's fused attention backward from the forward's softmax statistics; f32 as
    /// the engine's math path (cuDNN matmuls around one softmax kernel, forward and backward).
    /// Other cases run both products on our cuDNN matmul and the softmax in Candle (f32). For
    /// (B, L, H·D) tensors straight from linear layers see [`ops::sdpa_heads`].
    fn cudnn_sdpa(&self, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: f64) -> Result<Tensor>;
    /// [`cudnn_sdpa`](CudnnExt::cudnn_sdpa) with a causal mask: query `i` of Lq sees keys
    /// `j <= i + Lk - Lq` (aligned to the bottom right, as with a KV cache; Lq <= Lk). Where
    /// the fused graph applies, the mask is computed inside the kernel, which skips the
    /// masked blocks; otherwise it is added to the scores as a bias.
    fn cudnn_causal_sdpa(&self, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor>;
}

/// True when the cuDNN norm graph takes `x` (on CUDA, f32/f16/bf16, parameters of x's dtype
/// and the last dim's size).
fn cudnn_norm_ok(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> bool {
    let d = x.dims().last().copied().unwrap_or(0);
    x.device().is_cuda()
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && d > 0
        && x.elem_count() > 0
        && std::iter::once(w)
            .chain(b)
            .all(|p| p.dtype() == x.dtype() && p.elem_count() == d)
}

/// Statistics dtype for half inputs.
fn stat_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

impl CudnnExt for Tensor {
    fn cudnn_conv(&self, w: &Tensor, params: &ConvParams) -> Result<Tensor> {
        ops::conv(self, w, params)
    }

    fn cudnn_conv1d(&self, w: &Tensor, params: Conv1dParams) -> Result<Tensor> {
        ops::conv(self, w, &params.into())
    }

    fn cudnn_conv2d(&self, w: &Tensor, params: Conv2dParams) -> Result<Tensor> {
        ops::conv(self, w, &params.into())
    }

    fn cudnn_conv3d(&self, w: &Tensor, params: Conv3dParams) -> Result<Tensor> {
        ops::conv(self, w, &params.into())
    }

    fn cudnn_conv_transpose2d(&self, w: &Tensor, p: ConvTranspose2dParams) -> Result<Tensor> {
        let cp = ConvParams::new(&i(&p.padding), &i(&p.stride), &i(&p.dilation), p.groups as i64);
        ops::conv_transpose(self, w, &cp, &p.output_padding)
    }

    fn cudnn_conv_bias_act(&self, w: &Tensor, b: &Tensor, params: &ConvParams, act: Activation) -> Result<Tensor> {
        ops::conv_bias_act(self, w, b, params, act)
    }

    fn cudnn_conv2d_bias_act(&self, w: &Tensor, b: &Tensor, params: Conv2dParams, act: Activation) -> Result<Tensor> {
        ops::conv_bias_act(self, w, b, &params.into(), act)
    }

    fn cudnn_matmul(&self, b: &Tensor) -> Result<Tensor> {
        ops::matmul(self, b)
    }

    fn cudnn_matmul_bias_act(&self, b: &Tensor, bias: &Tensor, act: Activation) -> Result<Tensor> {
        ops::matmul_bias_act(self, b, bias, act)
    }

    fn cudnn_pool(&self, params: &PoolParams) -> Result<Tensor> {
        ops::pool(self, params)
    }

    fn cudnn_max_pool2d(&self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<Tensor> {
        let p = PoolParams::new(PoolMode::Max, &i(&kernel), &i(&stride), &i(&padding));
        ops::pool(self, &p)
    }

    fn cudnn_avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let mode = if count_include_pad {
            PoolMode::AvgIncludePadding
        } else {
            PoolMode::AvgExcludePadding
        };
        ops::pool(self, &PoolParams::new(mode, &i(&kernel), &i(&stride), &i(&padding)))
    }

    fn cudnn_layer_norm(&self, weight: &Tensor, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        if cudnn_norm_ok(self, weight, bias) {
            return ops::norm(self, weight, bias, NormMode::LayerNorm, eps);
        }
        let dt = self.dtype();
        let x = self.to_dtype(stat_dtype(dt))?;
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let y = xc.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dt)?;
        let y = y.broadcast_mul(weight)?;
        match bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    fn cudnn_rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        if cudnn_norm_ok(self, weight, None) {
            return ops::norm(self, weight, None, NormMode::RmsNorm, eps);
        }
        let dt = self.dtype();
        let x = self.to_dtype(stat_dtype(dt))?;
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(ms + eps)?.sqrt()?)?
            .to_dtype(dt)?
            .broadcast_mul(weight)
    }

    fn cudnn_batch_norm(
        &self,
        mean: &Tensor,
        var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let shape: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if i == 1 { d } else { 1 })
            .collect();
        let dt = self.dtype();
        let sd = stat_dtype(dt);
        let x = self.to_dtype(sd)?;
        let m = mean.to_dtype(sd)?.reshape(shape.as_slice())?;
        let v = var.to_dtype(sd)?.reshape(shape.as_slice())?;
        let mut y = x.broadcast_sub(&m)?.broadcast_div(&(v + eps)?.sqrt()?)?;
        if let Some(w) = weight {
            y = y.broadcast_mul(&w.to_dtype(sd)?.reshape(shape.as_slice())?)?;
        }
        if let Some(b) = bias {
            y = y.broadcast_add(&b.to_dtype(sd)?.reshape(shape.as_slice())?)?;
        }
        y.to_dtype(dt)
    }

    fn cudnn_sdpa(&self, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: f64) -> Result<Tensor> {
        if mask.is_none() && ops::sdpa_supported(self, k, v, None) {
            return ops::sdpa(self, k, v, scale, false);
        }
        composed_sdpa(self, k, v, mask, scale)
    }

    fn cudnn_causal_sdpa(&self, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
        let (lq, lk) = (self.dim(D::Minus2)?, k.dim(D::Minus2)?);
        ops::check_causal(lq, lk)?;
        if ops::sdpa_supported(self, k, v, None) {
            return ops::sdpa(self, k, v, scale, true);
        }
        let mask = ops::causal_bias(lq, lk, DType::F32, self.device())?;
        composed_sdpa(self, k, v, Some(&mask), scale)
    }
}

/// Attention from our cuDNN matmuls and a Candle softmax in f32 (f64 for f64 inputs), with
/// an optional U8 (keep where non-zero) or additive float mask.
fn composed_sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: f64) -> Result<Tensor> {
    let sd = if q.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let scores = (ops::matmul(q, &k.t()?)? * scale)?.to_dtype(sd)?;
    let scores = match mask {
        Some(m) if m.dtype() == DType::U8 => {
            let neg = Tensor::new(f32::NEG_INFINITY, scores.device())?
                .to_dtype(sd)?
                .broadcast_as(scores.shape())?;
            m.broadcast_as(scores.shape())?.where_cond(&scores, &neg)?
        }
        Some(m) => scores.broadcast_add(&m.to_dtype(sd)?)?,
        None => scores,
    };
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    ops::matmul(&p.to_dtype(v.dtype())?, v)
}
