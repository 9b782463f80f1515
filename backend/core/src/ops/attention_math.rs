//! Attention's math path in f32: `softmax(q·kᵀ·scale)·v` as two batched cuDNN matmuls around
//! one row-softmax kernel, keeping the probabilities for the backward pass (five matmuls and
//! one softmax-backward kernel). cuDNN's fused attention graphs take f16/bf16 only; this is
//! what f32 attention runs instead (PyTorch's math path does the same products).
//!
//! Operands whose batch and head dims do not merge into one stride (heads side by side in a
//! (B, L, H·D) buffer) are staged through packed copies, so each product is one cuDNN
//! matmul rather than one per batch.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::matmul::packed_in;
use super::{check_on_stream_device, matmul, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::launch_attention as launch;
use crate::ffi::memory::DeviceBuffer;
use crate::graph::DataType;
use crate::kernels::elementwise::copy;
use crate::kernels::{stream_function, ATTENTION};

/// Operands of [`attention_math_backward`]: the forward's inputs, its probabilities, the
/// output gradient, the three gradients to write and a scratch buffer like `p`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionMathBackward<'a> {
    /// Queries `[B, H, Lq, D]` (any strides, last dim unit).
    pub q: &'a TensorRef<'a>,
    /// Keys `[B, H, Lk, D]`.
    pub k: &'a TensorRef<'a>,
    /// Values `[B, H, Lk, Dv]`.
    pub v: &'a TensorRef<'a>,
    /// The forward's probabilities, packed f32 `[B, H, Lq, Lk]`.
    pub p: &'a TensorRef<'a>,
    /// Gradient of the output `[B, H, Lq, Dv]`.
    pub d_o: &'a TensorRef<'a>,
    /// Gradient of q (like q).
    pub dq: &'a TensorMut<'a>,
    /// Gradient of k (like k).
    pub dk: &'a TensorMut<'a>,
    /// Gradient of v (like v).
    pub dv: &'a TensorMut<'a>,
    /// Scratch for the score gradients, packed f32 `[B, H, Lq, Lk]`.
    pub ds: &'a TensorMut<'a>,
}

/// True when `t`'s batch and head dims merge into one stride (cuDNN runs the product over
/// it as one batched matmul).
fn heads_merge(t: &TensorRef) -> bool {
    t.dims[0] <= 1 || t.dims[1] <= 1 || t.strides[0] == t.dims[1] * t.strides[1]
}

/// A packed f32 buffer for `t` when its batch and head dims do not merge, else none.
fn stage(stream: &Arc<CudaStream>, op: &'static str, t: &TensorRef) -> Result<Option<DeviceBuffer>> {
    if heads_merge(t) {
        return Ok(None);
    }
    DeviceBuffer::alloc(stream, t.numel() as usize * t.dtype.size(), op).map(Some)
}

/// (B·H·Lq, Lk, Lq) after checking q, k, v, the probabilities and the output shapes.
fn dims(
    op: &'static str,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    p: &TensorRef,
    o: &TensorRef,
) -> Result<(i64, i64, i64)> {
    for (arg, t) in [("q", q), ("k", k), ("v", v), ("p", p), ("o", o)] {
        t.check(op, arg)?;
        if t.dtype != DataType::F32 || t.dims.len() != 4 {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("{:?} {:?}: need a rank-4 F32 tensor", t.dims, t.dtype),
            ));
        }
    }
    let [b, h, lq, d] = [q.dims[0], q.dims[1], q.dims[2], q.dims[3]];
    let lk = k.dims[2];
    if k.dims[..] != [b, h, lk, d] || v.dims[..3] != [b, h, lk] || o.dims[..] != [b, h, lq, v.dims[3]] {
        return Err(Error::invalid_arg(
            op,
            "k",
            format!(
                "q {:?}, k {:?}, v {:?} and o {:?} disagree",
                q.dims, k.dims, v.dims, o.dims
            ),
        ));
    }
    if p.dims[..] != [b, h, lq, lk] || !p.is_packed() {
        return Err(Error::invalid_arg(
            op,
            "p",
            format!("{:?}: need packed [{b}, {h}, {lq}, {lk}]", p.dims),
        ));
    }
    if lk == 0 {
        return Err(Error::invalid_arg(
            op,
            "k",
            "an empty key sequence leaves the softmax undefined",
        ));
    }
    Ok((b * h * lq, lk, lq))
}

/// `o = softmax(q·kᵀ·scale)·v` in f32, writing the probabilities into `p` (packed
/// `[B, H, Lq, Lk]`) and, when given, the row log-sum-exp of the scaled scores into `lse`
/// (packed f32 `[B, H, Lq, 1]`). `causal`: query `i` sees keys `j <= i + Lk − Lq` (needs
/// `Lq <= Lk`).
#[allow(clippy::too_many_arguments)]
pub fn attention_math_forward(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    causal: bool,
    scale: f32,
    p: &TensorMut,
    lse: Option<&TensorMut>,
    o: &TensorMut,
) -> Result<()> {
    const OP: &str = "attention_math_forward";
    let (rows, lk, lq) = dims(OP, q, k, v, p.as_input(), o.as_input())?;
    if causal && lq > lk {
        return Err(Error::invalid_arg(
            OP,
            "q",
            format!("a causal mask needs no more queries ({lq}) than keys ({lk})"),
        ));
    }
    if let Some(l) = lse {
        l.as_input().check(OP, "lse")?;
        if l.dtype != DataType::F32 || l.numel() != rows || !l.is_packed() {
            return Err(Error::invalid_arg(
                OP,
                "lse",
                format!("{:?}: need {rows} packed F32 elements", l.dims),
            ));
        }
    }
    check_on_stream_device(
        stream,
        OP,
        &[
            ("q", Some(q)),
            ("k", Some(k)),
            ("v", Some(v)),
            ("p", Some(p.as_input())),
            ("lse", lse.map(TensorMut::as_input)),
            ("o", Some(o.as_input())),
        ],
    )?;
    if rows == 0 || o.numel() == 0 {
        return Ok(());
    }
    let bufs = [
        stage(stream, OP, q)?,
        stage(stream, OP, k)?,
        stage(stream, OP, v)?,
        stage(stream, OP, o)?,
    ];
    let [q2, k2, v2, o2] = [
        packed_in(&bufs[0], q)?,
        packed_in(&bufs[1], k)?,
        packed_in(&bufs[2], v)?,
        packed_in(&bufs[3], o)?,
    ];
    for (src, dst) in [(q, &q2), (k, &k2), (v, &v2)] {
        if let Some(dst) = dst {
            copy(stream, src, dst)?;
        }
    }
    let (q, k, v) = (
        q2.as_deref().unwrap_or(q),
        k2.as_deref().unwrap_or(k),
        v2.as_deref().unwrap_or(v),
    );
    matmul(stream, q, &k.transposed(2, 3), p)?;
    let f = stream_function(stream, ATTENTION, "attn_softmax_f32")?;
    launch::softmax(
        stream,
        &f,
        p.address(),
        lse.map_or(crate::types::DeviceAddress::NULL, |l| l.address()),
        rows,
        lk,
        lq,
        scale,
        causal,
    )?;
    matmul(stream, p.as_input(), v, o2.as_ref().unwrap_or(o))?;
    if let Some(o2) = &o2 {
        copy(stream, o2, o)?;
    }
    // The buffers are freed in stream order, after the work above.
    drop((q2, k2, v2, o2));
    drop(bufs);
    Ok(())
}

/// The backward of [`attention_math_forward`] from its probabilities: `dV = Pᵀ·dO`,
/// `dS = P ∘ (dO·Vᵀ − rowsum(P ∘ dO·Vᵀ))·scale`, `dQ = dS·K`, `dK = dSᵀ·Q`.
pub fn attention_math_backward(stream: &Arc<CudaStream>, a: &AttentionMathBackward<'_>, scale: f32) -> Result<()> {
    const OP: &str = "attention_math_backward";
    let (rows, lk, _) = dims(OP, a.q, a.k, a.v, a.p, a.d_o)?;
    for (arg, g, like) in [("dq", a.dq, a.q), ("dk", a.dk, a.k), ("dv", a.dv, a.v)] {
        if g.dims != like.dims || g.dtype != DataType::F32 {
            return Err(Error::invalid_arg(
                OP,
                arg,
                format!("{:?} {:?}: need {:?} F32", g.dims, g.dtype, like.dims),
            ));
        }
    }
    if a.ds.dims != a.p.dims || a.ds.dtype != DataType::F32 || !a.ds.is_packed() {
        return Err(Error::invalid_arg(
            OP,
            "ds",
            format!("{:?}: need packed {:?} F32", a.ds.dims, a.p.dims),
        ));
    }
    let bytes = (a.p.numel() * 4) as u64;
    if a.ds.ptr < a.p.ptr + bytes && a.p.ptr < a.ds.ptr + bytes {
        return Err(Error::invalid_arg(OP, "ds", "overlaps the probabilities p"));
    }
    check_on_stream_device(
        stream,
        OP,
        &[
            ("q", Some(a.q)),
            ("k", Some(a.k)),
            ("v", Some(a.v)),
            ("p", Some(a.p)),
            ("d_o", Some(a.d_o)),
            ("dq", Some(a.dq.as_input())),
            ("dk", Some(a.dk.as_input())),
            ("dv", Some(a.dv.as_input())),
            ("ds", Some(a.ds.as_input())),
        ],
    )?;
    if rows == 0 {
        return Ok(());
    }
    let bufs = [
        stage(stream, OP, a.q)?,
        stage(stream, OP, a.k)?,
        stage(stream, OP, a.v)?,
        stage(stream, OP, a.d_o)?,
        stage(stream, OP, a.dq)?,
        stage(stream, OP, a.dk)?,
        stage(stream, OP, a.dv)?,
    ];
    let [q2, k2, v2, do2, dq2, dk2, dv2] = [
        packed_in(&bufs[0], a.q)?,
        packed_in(&bufs[1], a.k)?,
        packed_in(&bufs[2], a.v)?,
        packed_in(&bufs[3], a.d_o)?,
        packed_in(&bufs[4], a.dq)?,
        packed_in(&bufs[5], a.dk)?,
        packed_in(&bufs[6], a.dv)?,
    ];
    for (src, dst) in [(a.q, &q2), (a.k, &k2), (a.v, &v2), (a.d_o, &do2)] {
        if let Some(dst) = dst {
            copy(stream, src, dst)?;
        }
    }
    let (q, k, v, d_o) = (
        q2.as_deref().unwrap_or(a.q),
        k2.as_deref().unwrap_or(a.k),
        v2.as_deref().unwrap_or(a.v),
        do2.as_deref().unwrap_or(a.d_o),
    );
    let (dq, dk, dv) = (
        dq2.as_ref().unwrap_or(a.dq),
        dk2.as_ref().unwrap_or(a.dk),
        dv2.as_ref().unwrap_or(a.dv),
    );
    matmul(stream, &a.p.transposed(2, 3), d_o, dv)?;
    matmul(stream, d_o, &v.transposed(2, 3), a.ds)?;
    let f = stream_function(stream, ATTENTION, "attn_softmax_bwd_f32")?;
    launch::softmax_backward(stream, &f, a.p.address(), a.ds.address(), rows, lk, scale)?;
    matmul(stream, a.ds.as_input(), k, dq)?;
    matmul(stream, &a.ds.as_input().transposed(2, 3), q, dk)?;
    for (src, dst) in [(&dq2, a.dq), (&dk2, a.dk), (&dv2, a.dv)] {
        if let Some(src) = src {
            copy(stream, src, dst)?;
        }
    }
    // The buffers are freed in stream order, after the work above.
    drop((q2, k2, v2, do2, dq2, dk2, dv2));
    drop(bufs);
    Ok(())
}
