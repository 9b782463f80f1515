//! Layer normalization and scaled dot-product attention through cuDNN graphs, with the
//! composed path for the cases cuDNN has no engine for.

use burn_backend::ops::AttentionModuleOptions;
use burn_backend::tensor::{BoolTensor, FloatTensor};
use burn_backend::{BoolStore, DType, Scalar};

use super::super::tensor::{storage_type, CudnnTensor};
use super::super::{math, structure, Cudnn};
use super::exec;
use crate::error::Result;
use crate::graph::NormMode;
use crate::ops;
use crate::ops::elementwise::{BinaryOp, CompareOp, UnaryOp};

/// Burn's layer norm over the last dim: one cuDNN norm graph for f32/f16/bf16 rows, the
/// composed mean/variance path otherwise (f64, or a case cuDNN rejects).
pub(crate) fn layer_norm(
    x: CudnnTensor,
    gamma: CudnnTensor,
    beta: Option<CudnnTensor>,
    epsilon: f64,
) -> Result<CudnnTensor> {
    const OP: &str = "layer_norm";
    let dims = x.dims().to_vec();
    let d = dims.last().copied().unwrap_or(1);
    let cudnn_dtype = matches!(x.dtype, DType::F32 | DType::Flex32 | DType::F16 | DType::BF16);
    if !cudnn_dtype || x.numel() == 0 || gamma.dtype != x.dtype || beta.as_ref().is_some_and(|b| b.dtype != x.dtype) {
        return layer_norm_composed(x, gamma, beta, epsilon);
    }
    let rows = x.numel() / d;
    let x2 = x.clone().contiguous()?.reshape(&[rows, d])?;
    let y = x2.empty_on(&[rows, d], x2.dtype, OP)?;
    let g = gamma.clone().contiguous()?;
    let b = beta.clone().map(CudnnTensor::contiguous).transpose()?;
    let r = ops::norm_forward(
        y.stream(),
        NormMode::LayerNorm,
        &x2.tref(),
        &g.tref(),
        b.as_ref().map(|b| b.tref()).as_ref(),
        &y.tmut(),
        epsilon,
        None,
    );
    match r {
        Ok(()) => y.reshape(&dims),
        Err(e) if e.is_not_supported() => {
            tracing::debug!("{OP}: no cuDNN engine ({e}); composing it");
            layer_norm_composed(x, gamma, beta, epsilon)
        }
        Err(e) => Err(e),
    }
}

/// `(x - mean) / sqrt(var + eps) · gamma + beta` over the last dim from elementwise and
/// reduction kernels (biased variance, as Burn defines it).
fn layer_norm_composed(
    x: CudnnTensor,
    gamma: CudnnTensor,
    beta: Option<CudnnTensor>,
    epsilon: f64,
) -> Result<CudnnTensor> {
    const OP: &str = "layer_norm";
    let last = x.rank().saturating_sub(1);
    let mean = math::mean_dim(x.clone(), last, OP)?;
    let centered = exec::binary(x, mean, BinaryOp::Sub, OP)?;
    let sq = exec::binary(centered.clone(), centered.clone(), BinaryOp::Mul, OP)?;
    let var = math::mean_dim(sq, last, OP)?;
    let std = exec::unary(math::add_scalar(var, Scalar::Float(epsilon), OP)?, UnaryOp::Sqrt, OP)?;
    let inv = exec::unary(std, UnaryOp::Recip, OP)?;
    let scaled = exec::binary(
        exec::binary(centered, inv, BinaryOp::Mul, OP)?,
        gamma,
        BinaryOp::Mul,
        OP,
    )?;
    match beta {
        Some(b) => exec::binary(scaled, b, BinaryOp::Add, OP),
        None => Ok(scaled),
    }
}

/// True when the last dim is unit-stride and every stride is positive: the layouts the
/// attention graph reads in place ([B, H, S, D] and the [B, S, H, D] of a head split).
fn rows_unit_stride(t: &CudnnTensor) -> bool {
    let s = &t.layout.strides;
    s.last() == Some(&1) && s.iter().all(|&v| v > 0)
}

/// Burn's attention: the fused cuDNN graph for f16/bf16 with head dims that are multiples
/// of 8 (≤ 256), no boolean mask and no softcap; a causal mask is computed in the fused
/// kernel (or, with a bias and fewer queries than keys, added to the bias).
/// Every other case, or one cuDNN rejects, runs Burn's composed attention on our kernels.
pub(crate) fn attention(
    q: FloatTensor<Cudnn>,
    k: FloatTensor<Cudnn>,
    v: FloatTensor<Cudnn>,
    mask: Option<BoolTensor<Cudnn>>,
    bias: Option<FloatTensor<Cudnn>>,
    options: AttentionModuleOptions,
) -> Result<FloatTensor<Cudnn>> {
    const OP: &str = "attention";
    let fallback =
        |q, k, v, mask, bias| burn_backend::ops::attention::attention_fallback::<Cudnn>(q, k, v, mask, bias, options);
    let (qd, kd, vd) = (q.dims().to_vec(), k.dims().to_vec(), v.dims().to_vec());
    let fusable = mask.is_none()
        && options.softcap.is_none()
        && qd.len() == 4
        && kd.len() == 4
        && vd.len() == 4
        && k.dtype == q.dtype
        && v.dtype == q.dtype
        && bias.as_ref().is_none_or(|b| b.dtype == q.dtype)
        && storage_type(q.dtype).is_some_and(|dt| ops::sdpa_fusable(dt, qd[3], vd[3], kd[2]))
        // A causal mask with more queries than keys leaves whole rows masked, which the
        // composed path defines (zeros) and the fused softmax does not.
        && !(options.is_causal && qd[2] > kd[2]);
    if !fusable {
        return Ok(fallback(q, k, v, mask, bias));
    }
    let (b, h, sq, skv, dv) = (qd[0], qd[1], qd[2], kd[2], vd[3]);
    let ready = |t: &CudnnTensor| {
        if rows_unit_stride(t) {
            Ok(t.clone())
        } else {
            t.clone().contiguous()
        }
    };
    let (qr, kr, vr) = (ready(&q)?, ready(&k)?, ready(&v)?);
    // The causal mask runs inside the fused kernel; cuDNN combines it with a bias only for
    // square scores, so a bias with a bottom-right shifted mask is added to a built mask.
    let in_graph_mask = options.is_causal && (bias.is_none() || sq == skv);
    let bias_full = match (bias.as_ref(), options.is_causal && !in_graph_mask) {
        (None, false) => None,
        (Some(b), false) => Some(ready(b)?),
        (b, true) => {
            let causal = causal_bias(&q, sq, skv)?;
            Some(match b {
                Some(b) => exec::binary(b.clone(), causal, BinaryOp::Add, OP)?.contiguous()?,
                None => causal,
            })
        }
    };
    let o = qr.empty_on(&[b, h, sq, dv], q.dtype, OP)?;
    let scale = options.scale.unwrap_or(1.0 / (qd[3] as f64).sqrt()) as f32;
    let r = ops::sdpa_forward(
        o.stream(),
        &qr.tref(),
        &kr.tref(),
        &vr.tref(),
        bias_full.as_ref().map(|t| t.tref()).as_ref(),
        in_graph_mask,
        &o.tmut(),
        scale,
        None,
    );
    match r {
        Ok(()) => Ok(o),
        Err(e) if e.is_not_supported() || matches!(e, crate::Error::InvalidArgument { .. }) => {
            tracing::debug!("{OP}: fused graph not used ({e}); composing it");
            Ok(fallback(q, k, v, mask, bias))
        }
        Err(e) => Err(e),
    }
}

/// `[1, 1, sq, skv]` additive bias: 0 where key `j` may be seen by query `i`
/// (`j <= i + skv - sq`, the bottom-right aligned causal mask Burn uses), -inf elsewhere.
pub(crate) fn causal_bias(like: &CudnnTensor, sq: i64, skv: i64) -> Result<CudnnTensor> {
    const OP: &str = "attention";
    let device = like.device();
    let rows = structure::arange(device, 0..sq, 1, DType::I64, OP)?.reshape(&[sq, 1])?;
    let cols = structure::arange(device, 0..skv, 1, DType::I64, OP)?.reshape(&[1, skv])?;
    let shifted = math::add_scalar(rows, Scalar::Int(skv - sq), OP)?;
    let hidden = exec::compare(shifted, cols, CompareOp::Lt, BoolStore::Native, OP)?;
    let hidden = hidden.reshape(&[1, 1, sq, skv])?;
    let zeros = exec::full(device, &[1, 1, sq, skv], like.dtype, 0.0, OP)?;
    structure::mask_fill(zeros, hidden, Scalar::Float(f64::NEG_INFINITY), OP)
}
