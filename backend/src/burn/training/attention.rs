//! Attention for training on [`Cudnn`]: cuDNN's fused flash-attention forward (writing the
//! softmax statistics) and its backward, cuDNN's fused attention backward graph
//! ([`crate::ops::sdpa_backward`]), or, where cuDNN declines, the same math from the
//! backend's own ops (probabilities recomputed from the statistics). f32 attention without a
//! bias (cuDNN's fused graphs take f16/bf16 only) runs the engine's math path
//! ([`crate::ops::attention_math_forward`]: two cuDNN matmuls around one softmax kernel,
//! keeping the probabilities for a backward of five matmuls and one kernel).

use burn_backend::ops::AttentionModuleOptions;
use burn_backend::{DType, Scalar};

use super::super::layers::{attention as layer_attention, causal_bias};
use super::super::math::{self, ReduceOp};
use super::super::tensor::{storage_type, CudnnTensor};
use super::super::{exec, structure};
use crate::error::{InOp, Result};
use crate::ops::elementwise::{BinaryOp, UnaryOp};
use crate::ops::{self, SdpaBackward, TensorRef};

/// A tensor's dims and dtype: what decides which attention path takes it.
pub(super) type Meta = (Vec<usize>, DType);

fn meta(t: &CudnnTensor) -> Meta {
    (t.dims().iter().map(|&d| d as usize).collect(), t.dtype)
}

/// True when the fused graphs take these tensors: f16/bf16, head dims multiples of 8 up to
/// 256, and a causal mask only with no more queries than keys.
pub(super) fn fusable(
    q: &CudnnTensor,
    k: &CudnnTensor,
    v: &CudnnTensor,
    bias: Option<&CudnnTensor>,
    causal: bool,
) -> bool {
    fusable_shapes([meta(q), meta(k), meta(v)], bias.map(meta), causal)
}

/// [`dropout_fusable_shapes`] of these tensors.
pub(super) fn dropout_fusable(
    q: &CudnnTensor,
    k: &CudnnTensor,
    v: &CudnnTensor,
    bias: Option<&CudnnTensor>,
    causal: bool,
) -> bool {
    dropout_fusable_shapes([meta(q), meta(k), meta(v)], bias.map(meta), causal)
}

/// True when the training forward and backward of this crate take these tensors: the fused
/// graphs ([`fusable`]) or the f32 math path ([`math_path`]).
pub(super) fn trainable(
    q: &CudnnTensor,
    k: &CudnnTensor,
    v: &CudnnTensor,
    bias: Option<&CudnnTensor>,
    causal: bool,
) -> bool {
    trainable_shapes([meta(q), meta(k), meta(v)], bias.map(meta), causal)
}

/// [`trainable`] from the dims and dtypes of q, k, v and the bias.
pub(super) fn trainable_shapes(qkv: [Meta; 3], bias: Option<Meta>, causal: bool) -> bool {
    math_path_shapes(qkv.clone(), bias.is_some(), causal) || fusable_shapes(qkv, bias, causal)
}

/// True when the fused graphs take these tensors with dropout on the probabilities:
/// [`fusable_shapes`], and a causal mask only for square scores (cuDNN has no dropout with a
/// bottom-right mask).
pub(super) fn dropout_fusable_shapes(qkv: [Meta; 3], bias: Option<Meta>, causal: bool) -> bool {
    let square = qkv[0].0.get(2) == qkv[1].0.get(2);
    fusable_shapes(qkv, bias, causal) && (square || !causal)
}

/// [`fusable`] from the dims and dtypes of q, k, v and the bias.
fn fusable_shapes(qkv: [Meta; 3], bias: Option<Meta>, causal: bool) -> bool {
    let [(qd, qt), (kd, kt), (vd, vt)] = qkv;
    qd.len() == 4
        && kd.len() == 4
        && vd.len() == 4
        && kt == qt
        && vt == qt
        && bias.as_ref().is_none_or(|(bd, bt)| *bt == qt && bd.len() == 4)
        && storage_type(qt).is_some_and(|dt| ops::sdpa_fusable(dt, qd[3] as i64, vd[3] as i64, kd[2] as i64))
        && !(causal && qd[2] > kd[2])
        // cuDNN combines a bias with the causal mask only for square scores.
        && !(causal && bias.is_some() && qd[2] != kd[2])
}

/// True when f32 attention runs the engine's math path: q, k, v f32 `[b, h, s, d]` that
/// agree, a key sequence, no bias, and a causal mask only with no more queries than keys.
fn math_path(q: &CudnnTensor, k: &CudnnTensor, v: &CudnnTensor, bias: Option<&CudnnTensor>, causal: bool) -> bool {
    math_path_shapes([meta(q), meta(k), meta(v)], bias.is_some(), causal)
}

/// [`math_path`] from the dims and dtypes of q, k and v and whether there is a bias.
pub(super) fn math_path_shapes(qkv: [Meta; 3], bias: bool, causal: bool) -> bool {
    let [(qd, qt), (kd, kt), (vd, vt)] = qkv;
    [qt, kt, vt].iter().all(|&t| t == DType::F32)
        && !bias
        && qd.len() == 4
        && kd.len() == 4
        && vd.len() == 4
        && kd[..2] == qd[..2]
        && vd[..3] == kd[..3]
        && kd[3] == qd[3]
        && kd[2] > 0
        && !(causal && qd[2] > kd[2])
}

/// Last dim unit-stride with positive strides (what the attention graphs read in place).
fn ready(t: &CudnnTensor) -> Result<CudnnTensor> {
    let s = &t.layout.strides;
    if s.last() == Some(&1) && s.iter().all(|&v| v > 0) {
        Ok(t.clone())
    } else {
        t.clone().contiguous()
    }
}

/// A new `[b, h, s, d]` tensor stored as `[b, s, h, d]` (heads merge for free afterwards).
fn bshd_like(like: &CudnnTensor, dims: [i64; 4], op: &str) -> Result<CudnnTensor> {
    let [b, h, s, d] = dims;
    let t = CudnnTensor::empty(like.device(), &[b, s, h, d], like.dtype, op)?;
    let layout = t.layout.permute(&[0, 2, 1, 3]).in_op(op)?;
    Ok(t.with_layout(layout))
}

/// Dropout on the attention probabilities: the probability of dropping and the Philox seed
/// and offset (an `I64` tensor of two elements on the device), which the backward reuses to
/// regenerate the forward's mask.
#[derive(Clone, Debug)]
pub(crate) struct Dropout {
    pub(crate) probability: f64,
    pub(crate) rng: CudnnTensor,
}

impl Dropout {
    /// The seed and offset views of [`Dropout::rng`], each one `I64` `[1, 1, 1, 1]`.
    fn views(&self) -> Result<[TensorRef<'_>; 2]> {
        const OP: &str = "attention dropout";
        let rng = self.rng.tref();
        if self.rng.dtype != DType::I64 || rng.numel() < 2 || !rng.is_packed() {
            return Err(crate::error::Error::invalid_arg(
                OP,
                "rng",
                format!("{:?} {:?}: need two packed I64", rng.dims(), self.rng.dtype),
            ));
        }
        let one = [1i64; 4];
        Ok([rng.view(0, &one, &one)?, rng.view(1, &one, &one)?])
    }

    /// The engine's dropout operand over `views` (from [`Dropout::views`]).
    fn op<'a>(&self, [seed, offset]: &'a [TensorRef<'a>; 2]) -> ops::AttentionDropout<'a> {
        ops::AttentionDropout {
            probability: self.probability as f32,
            seed,
            offset,
        }
    }
}

/// What the backward pass needs.
#[derive(Clone, Debug)]
pub(crate) struct AttentionSaved {
    q: CudnnTensor,
    k: CudnnTensor,
    v: CudnnTensor,
    o: CudnnTensor,
    stats: CudnnTensor,
    bias: Option<CudnnTensor>,
    causal: bool,
    scale: f64,
    /// The math path's probabilities, packed f32 `[b, h, s_q, s_kv]` (its backward reads
    /// them instead of recomputing them).
    probs: Option<CudnnTensor>,
    /// The forward's dropout (fused graphs only).
    dropout: Option<Dropout>,
}

impl AttentionSaved {
    /// The saved state from the forward's inputs as passed, its output and statistics: what
    /// a lazily recorded forward hands its backward.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rebuild(
        q: CudnnTensor,
        k: CudnnTensor,
        v: CudnnTensor,
        o: CudnnTensor,
        stats: CudnnTensor,
        bias: Option<CudnnTensor>,
        causal: bool,
        scale: f64,
        dropout: Option<Dropout>,
    ) -> Result<Self> {
        Ok(Self {
            q: ready(&q)?,
            k: ready(&k)?,
            v: ready(&v)?,
            o,
            stats,
            bias: bias.as_ref().map(ready).transpose()?,
            causal,
            scale,
            probs: None,
            dropout,
        })
    }

    /// The softmax statistics (log-sum-exp per query row, f32 `[b, h, s_q, 1]`).
    pub(super) fn stats(&self) -> &CudnnTensor {
        &self.stats
    }

    /// The math path's probabilities (f32 `[b, h, s_q, s_kv]`), when the forward took it.
    pub(super) fn probs(&self) -> Option<&CudnnTensor> {
        self.probs.as_ref()
    }

    /// The saved state with the math path's probabilities: its backward then reads them.
    pub(super) fn with_probs(mut self, probs: Option<CudnnTensor>) -> Self {
        self.probs = probs;
        self
    }
}

/// Fused forward writing the statistics; `None` when cuDNN declines the case. `bias_grad`
/// says whether the backward will want the bias's gradient (which plan to prefetch). With
/// `dropout` only the fused graphs run (the math path has no dropout: `None`), and a new
/// plan is built before it runs rather than composed meanwhile (a composed forward's mask
/// could not be regenerated by the fused backward).
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    q: CudnnTensor,
    k: CudnnTensor,
    v: CudnnTensor,
    bias: Option<CudnnTensor>,
    causal: bool,
    scale: f64,
    bias_grad: bool,
    dropout: Option<Dropout>,
) -> Result<Option<(CudnnTensor, AttentionSaved)>> {
    const OP: &str = "attention";
    if math_path(&q, &k, &v, bias.as_ref(), causal) {
        if dropout.is_some() {
            return Ok(None);
        }
        return math_forward(q, k, v, causal, scale).map(Some);
    }
    let (q, k, v) = (ready(&q)?, ready(&k)?, ready(&v)?);
    let bias = bias.as_ref().map(ready).transpose()?;
    let (qd, vd) = (q.dims().to_vec(), v.dims().to_vec());
    let o = bshd_like(&q, [qd[0], qd[1], qd[2], vd[3]], OP)?;
    let stats = CudnnTensor::empty(q.device(), &[qd[0], qd[1], qd[2], 1], DType::F32, OP)?;
    // The views borrow `bias`, which the saved state takes afterwards.
    let r = {
        let tb = bias.as_ref().map(|b| b.tref());
        let views = dropout.as_ref().map(Dropout::views).transpose()?;
        let drop = dropout.as_ref().zip(views.as_ref()).map(|(d, v)| d.op(v));
        // The backward's plan builds beside the forward's and the rest of the forward pass
        // (on a fresh machine both need a runtime compile).
        let prefetched = ops::sdpa_backward_prefetch(
            o.stream(),
            &q.tref(),
            &k.tref(),
            &v.tref(),
            tb.as_ref(),
            causal,
            &o.tref(),
            scale as f32,
            &stats.tref(),
            bias_grad,
            drop.as_ref(),
        );
        if let Err(e) = prefetched {
            tracing::debug!("{OP}: backward plan not prefetched ({e})");
        }
        // A new fused forward builds in the background and this call composes meanwhile,
        // except with dropout (see `ops::sdpa_forward_when_built`).
        ops::sdpa_forward_when_built(
            o.stream(),
            &q.tref(),
            &k.tref(),
            &v.tref(),
            tb.as_ref(),
            causal,
            &o.tmut(),
            scale as f32,
            Some(&stats.tmut()),
            drop.as_ref(),
        )
    };
    match r {
        Ok(false) => Ok(None),
        Ok(true) => Ok(Some((
            o.clone(),
            AttentionSaved {
                q,
                k,
                v,
                o,
                stats,
                bias,
                causal,
                scale,
                probs: None,
                dropout,
            },
        ))),
        Err(e) if e.is_not_supported() => {
            tracing::debug!("{OP}: fused forward not used ({e}); composing it");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The math path's forward ([`math_path`] holds): the output stored bshd, the saved state
/// with the probabilities.
fn math_forward(
    q: CudnnTensor,
    k: CudnnTensor,
    v: CudnnTensor,
    causal: bool,
    scale: f64,
) -> Result<(CudnnTensor, AttentionSaved)> {
    const OP: &str = "attention";
    let (q, k, v) = (ready(&q)?, ready(&k)?, ready(&v)?);
    let (qd, kd, vd) = (q.dims().to_vec(), k.dims().to_vec(), v.dims().to_vec());
    let o = bshd_like(&q, [qd[0], qd[1], qd[2], vd[3]], OP)?;
    let stats = CudnnTensor::empty(q.device(), &[qd[0], qd[1], qd[2], 1], DType::F32, OP)?;
    let probs = CudnnTensor::empty(q.device(), &[qd[0], qd[1], qd[2], kd[2]], DType::F32, OP)?;
    ops::attention_math_forward(
        o.stream(),
        &q.tref(),
        &k.tref(),
        &v.tref(),
        causal,
        scale as f32,
        &probs.tmut(),
        Some(&stats.tmut()),
        &o.tmut(),
    )?;
    let saved = AttentionSaved {
        q,
        k,
        v,
        o: o.clone(),
        stats,
        bias: None,
        causal,
        scale,
        probs: Some(probs),
        dropout: None,
    };
    Ok((o, saved))
}

/// The math path's backward from the saved probabilities `p`: `[dq, dk, dv]` stored bshd.
fn math_backward(s: &AttentionSaved, p: &CudnnTensor, d_o: CudnnTensor) -> Result<[CudnnTensor; 3]> {
    const OP: &str = "attention_backward";
    let d_o = ready(&exec::cast(d_o, DType::F32, OP)?)?;
    let [dq, dk, dv] = super::batch_norm::try_map([&s.q, &s.k, &s.v], |t| {
        let d = t.dims();
        bshd_like(t, [d[0], d[1], d[2], d[3]], OP)
    })?;
    let ds = CudnnTensor::empty(p.device(), p.dims(), DType::F32, OP)?;
    {
        let (tq, tk, tv, tp, tdo) = (s.q.tref(), s.k.tref(), s.v.tref(), p.tref(), d_o.tref());
        let (tdq, tdk, tdv, tds) = (dq.tmut(), dk.tmut(), dv.tmut(), ds.tmut());
        let args = ops::AttentionMathBackward {
            q: &tq,
            k: &tk,
            v: &tv,
            p: &tp,
            d_o: &tdo,
            dq: &tdq,
            dk: &tdk,
            dv: &tdv,
            ds: &tds,
        };
        ops::attention_math_backward(d_o.stream(), &args, s.scale as f32)?;
    }
    Ok([dq, dk, dv])
}

/// The gradients of an attention: `[dq, dk, dv]` and, when asked for, the bias's.
pub(crate) type AttentionGrads<T> = ([T; 3], Option<T>);

/// `[dq, dk, dv]` and (with `want_bias` and a bias) the bias's gradient, in the bias's dims
/// and dtype, from cuDNN's fused backward, or the composed one where it declines.
pub(super) fn backward(s: &AttentionSaved, d_o: CudnnTensor, want_bias: bool) -> Result<AttentionGrads<CudnnTensor>> {
    const OP: &str = "attention_backward";
    if let Some(p) = &s.probs {
        return Ok((math_backward(s, p, d_o)?, None));
    }
    let d_o = ready(&exec::cast(d_o, s.q.dtype, OP)?)?;
    let [dq, dk, dv] = super::batch_norm::try_map([&s.q, &s.k, &s.v], |t| {
        let d = t.dims();
        bshd_like(t, [d[0], d[1], d[2], d[3]], OP)
    })?;
    // The bias's gradient, packed, in q's dtype (what the fused graph writes).
    let d_bias = match s.bias.as_ref().filter(|_| want_bias) {
        Some(b) => Some(CudnnTensor::empty(b.device(), b.dims(), s.q.dtype, OP)?),
        None => None,
    };
    // The views borrow the tensors, which are returned below.
    let r = {
        let tb = s.bias.as_ref().map(|b| b.tref());
        let tdb = d_bias.as_ref().map(|t| t.tmut());
        let (tq, tk, tv, to, tdo, tst) = (
            s.q.tref(),
            s.k.tref(),
            s.v.tref(),
            s.o.tref(),
            d_o.tref(),
            s.stats.tref(),
        );
        let (tdq, tdk, tdv) = (dq.tmut(), dk.tmut(), dv.tmut());
        let views = s.dropout.as_ref().map(Dropout::views).transpose()?;
        let dropout = s.dropout.as_ref().zip(views.as_ref()).map(|(d, v)| d.op(v));
        let args = SdpaBackward {
            q: &tq,
            k: &tk,
            v: &tv,
            o: &to,
            d_o: &tdo,
            stats: &tst,
            bias: tb.as_ref(),
            dq: &tdq,
            dk: &tdk,
            dv: &tdv,
            d_bias: tdb.as_ref(),
            dropout,
        };
        ops::sdpa_backward(d_o.stream(), &args, s.causal, s.scale as f32)
    };
    match r {
        Ok(()) => {
            let d_bias = match (d_bias, &s.bias) {
                (Some(db), Some(b)) => Some(exec::cast(db, b.dtype, OP)?),
                _ => None,
            };
            Ok(([dq, dk, dv], d_bias))
        }
        // The composed backward cannot regenerate cuDNN's dropout mask.
        Err(e) if e.is_not_supported() && s.dropout.is_none() => {
            tracing::debug!("{OP}: fused backward not used ({e}); composing it");
            composed_backward(s, d_o, want_bias)
        }
        Err(e) => Err(e),
    }
}

/// `q·kᵀ·scale + bias` with the causal mask, in f32, from f32 `q` and `k`.
fn scores_f32(
    q: CudnnTensor,
    k: CudnnTensor,
    bias: Option<&CudnnTensor>,
    causal: bool,
    scale: f64,
) -> Result<CudnnTensor> {
    const OP: &str = "attention";
    let (sq, skv) = (q.dims()[2], k.dims()[2]);
    let kt = structure::swap_dims(k, 2, 3, OP)?;
    let mut scores = math::mul_scalar(math::float_matmul(q, kt, OP)?, Scalar::Float(scale), OP)?;
    if let Some(b) = bias {
        scores = exec::binary(scores, exec::cast(b.clone(), DType::F32, OP)?, BinaryOp::Add, OP)?;
    }
    if causal {
        scores = exec::binary(scores.clone(), causal_bias(&scores, sq, skv)?, BinaryOp::Add, OP)?;
    }
    Ok(scores)
}

/// `exp(a - b)` (b broadcast).
fn exp_diff(a: CudnnTensor, b: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    exec::unary(exec::binary(a, b, BinaryOp::Sub, op)?, UnaryOp::Exp, op)
}

/// The forward from the backend's ops in f32, with the statistics the backward needs:
/// `(o in q's dtype, log-sum-exp f32 [b, h, s_q, 1])`. For a lazily recorded forward whose
/// fused graph cuDNN declines when it runs.
pub(super) fn composed_forward(
    q: CudnnTensor,
    k: CudnnTensor,
    v: CudnnTensor,
    bias: Option<CudnnTensor>,
    causal: bool,
    scale: f64,
) -> Result<(CudnnTensor, CudnnTensor)> {
    const OP: &str = "attention";
    let dtype = q.dtype;
    let f32_ = |t: CudnnTensor| exec::cast(t, DType::F32, OP);
    let scores = scores_f32(f32_(q)?, f32_(k)?, bias.as_ref(), causal, scale)?;
    let max = math::reduce_dim(scores.clone(), 3, ReduceOp::Max, OP)?;
    let sum = math::reduce_dim(exp_diff(scores.clone(), max.clone(), OP)?, 3, ReduceOp::Sum, OP)?;
    let stats = exec::binary(max, exec::unary(sum, UnaryOp::Log, OP)?, BinaryOp::Add, OP)?;
    let p = exp_diff(scores, stats.clone(), OP)?;
    let o = exec::cast(math::float_matmul(p, f32_(v)?, OP)?, dtype, OP)?;
    Ok((o, stats))
}

/// The attention backward from the backend's ops in f32: `P = exp(q·kᵀ·scale + bias − lse)`,
/// `dV = Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)) · scale`, `dQ = dS·K`, `dK = dSᵀ·Q`, and
/// with `want_bias` (and a bias) `dBias = dS / scale` summed over the bias's size-1 dims.
fn composed_backward(s: &AttentionSaved, d_o: CudnnTensor, want_bias: bool) -> Result<AttentionGrads<CudnnTensor>> {
    const OP: &str = "attention_backward";
    let f32_ = |t: &CudnnTensor| exec::cast(t.clone(), DType::F32, OP);
    let (q, k, v, o, d_o) = (f32_(&s.q)?, f32_(&s.k)?, f32_(&s.v)?, f32_(&s.o)?, f32_(&d_o)?);
    let t = |x: CudnnTensor| structure::swap_dims(x, 2, 3, OP);
    let mul = |a: CudnnTensor, b: CudnnTensor| exec::binary(a, b, BinaryOp::Mul, OP);
    let scores = scores_f32(q.clone(), k.clone(), s.bias.as_ref(), s.causal, s.scale)?;
    let p = exp_diff(scores, s.stats.clone(), OP)?;
    let dv = math::float_matmul(t(p.clone())?, d_o.clone(), OP)?;
    let dp = math::float_matmul(d_o.clone(), t(v)?, OP)?;
    let row = math::reduce_dim(mul(d_o, o)?, 3, ReduceOp::Sum, OP)?;
    let ds_raw = mul(p, exec::binary(dp, row, BinaryOp::Sub, OP)?)?;
    let d_bias = match s.bias.as_ref().filter(|_| want_bias) {
        Some(b) => Some(exec::cast(sum_to(ds_raw.clone(), b.dims(), OP)?, b.dtype, OP)?),
        None => None,
    };
    let ds = math::mul_scalar(ds_raw, Scalar::Float(s.scale), OP)?;
    let dq = math::float_matmul(ds.clone(), k, OP)?;
    let dk = math::float_matmul(t(ds)?, q, OP)?;
    let grads = super::batch_norm::try_map([dq, dk, dv], |g| exec::cast(g, s.q.dtype, OP))?;
    Ok((grads, d_bias))
}

/// `x` summed over every dim where `dims` is 1 and `x`'s is not (kept with size 1): the
/// gradient of a tensor of `dims` broadcast to `x`'s shape.
fn sum_to(mut x: CudnnTensor, dims: &[i64], op: &str) -> Result<CudnnTensor> {
    for (dim, &want) in dims.iter().enumerate() {
        if want == 1 && x.dims()[dim] != 1 {
            x = math::reduce_dim(x, dim, ReduceOp::Sum, op)?;
        }
    }
    Ok(x)
}

/// Burn's attention options for a plain causal-or-not attention with this scale.
pub(super) fn options(causal: bool, scale: f64) -> AttentionModuleOptions {
    AttentionModuleOptions {
        scale: Some(scale),
        softcap: None,
        is_causal: causal,
    }
}

/// Attention on `Cudnn` (no gradients): the fused forward with the output stored bshd, or
/// the backend's attention op.
pub(super) fn cudnn(
    q: CudnnTensor,
    k: CudnnTensor,
    v: CudnnTensor,
    bias: Option<CudnnTensor>,
    causal: bool,
    scale: f64,
) -> Result<CudnnTensor> {
    if fusable(&q, &k, &v, bias.as_ref(), causal) {
        if let Some((o, _)) = forward(
            q.clone(),
            k.clone(),
            v.clone(),
            bias.clone(),
            causal,
            scale,
            false,
            None,
        )? {
            return Ok(o);
        }
    }
    layer_attention(q, k, v, None, bias, options(causal, scale))
}
