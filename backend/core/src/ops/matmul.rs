//! Batched matrix products, plain and with fused bias + activation.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::fallback::bias_act_in_place;
use super::{
    check_on_stream_device, prefetch, run, run_when_built, zero_fill, Activation, OpKey, TensorMut, TensorRef,
};
use crate::error::{Error, Result};
use crate::ffi::memory::DeviceBuffer;
use crate::graph::{Graph, PointwiseMode};
use crate::kernels::elementwise::copy;
use crate::types::{row_major_strides, DataType};

fn check(op: &'static str, a: &TensorRef, b: &TensorRef, c: &TensorRef) -> Result<()> {
    a.check(op, "a")?;
    b.check(op, "b")?;
    c.check(op, "c")?;
    if a.dims.len() < 2 || a.dims.len() != b.dims.len() || a.dims.len() != c.dims.len() {
        return Err(Error::invalid_arg(
            op,
            "a",
            format!("a {:?}, b {:?} and c {:?} need one rank >= 2", a.dims, b.dims, c.dims),
        ));
    }
    Ok(())
}

/// `c[.., M, N] = a[.., M, K] · b[.., K, N]`; batch dims broadcast (size 1 against any).
/// Transposed operands are just strides (e.g. `b` with strides `[.., 1, K]`).
pub fn matmul(stream: &Arc<CudaStream>, a: &TensorRef, b: &TensorRef, c: &TensorMut) -> Result<()> {
    matmul_bias_act(stream, a, b, None, c, Activation::Identity)
}

/// Starts cuDNN's one-time set-up on a background plan-build thread by building the plan of
/// a small f32 matmul there: loading cuDNN's engine and heuristics libraries, its first
/// handle and heuristics query (about 0.5 s in a fresh process) then overlap the program's
/// start-up instead of stalling its first cuDNN op. Does nothing in benchmark mode (whose
/// builds need real buffers).
// The Burn adapter starts it.
#[doc(hidden)]
pub fn warm_up_cudnn(stream: &Arc<CudaStream>) -> Result<()> {
    // Never dereferenced: the plan is built, not run.
    const FRESH: u64 = 256;
    let dims = [1i64, 64, 64];
    let strides = row_major_strides(&dims);
    let (a, b) = (
        TensorRef::placeholder(&dims, &strides, DataType::F32, FRESH),
        TensorRef::placeholder(&dims, &strides, DataType::F32, FRESH),
    );
    let c = TensorMut::placeholder(&dims, &strides, DataType::F32, FRESH);
    let key = matmul_key("matmul", &a, &b, None, &c, Activation::Identity);
    prefetch(stream, "matmul", key, &|| {
        matmul_graph(&a, &b, None, &c, Activation::Identity)
    })
}

/// The graph of `c = act(a · b + bias)` (uids: a 1, b 2, product 3, then bias 4 and
/// bias-add 5, then the activation).
fn matmul_graph(a: &TensorRef, b: &TensorRef, bias: Option<&TensorRef>, c: &TensorMut, act: Activation) -> Graph {
    let mut g = Graph::new();
    let (ai, bi) = (a.add_input(&mut g, "a"), b.add_input(&mut g, "b"));
    let mut out = g.matmul(ai, bi);
    if let Some(bias) = bias {
        let bt = bias.add_input(&mut g, "bias");
        out = g.bias_add(out, bt);
    }
    if let Some(m) = PointwiseMode::of_activation(act) {
        out = g.pointwise(m, out, None);
    }
    c.bind_output(&mut g, out);
    g
}

/// The plan-cache key of [`matmul_graph`] for `op`.
fn matmul_key(
    op: &'static str,
    a: &TensorRef,
    b: &TensorRef,
    bias: Option<&TensorRef>,
    c: &TensorMut,
    act: Activation,
) -> OpKey {
    let mut key = OpKey::new(op);
    key.tensor(a).tensor(b).tensor(c).act(act);
    if let Some(bias) = bias {
        key.tensor(bias);
    }
    key
}

/// `c = act(a · b + bias)` as ONE cuDNN graph; `bias` holds N elements (dims `[N]` or
/// `[1, .., 1, N]`). Falls back to matmul + one bias/activation kernel when no engine
/// supports the fused graph.
pub fn matmul_bias_act(
    stream: &Arc<CudaStream>,
    a: &TensorRef,
    b: &TensorRef,
    bias: Option<&TensorRef>,
    c: &TensorMut,
    act: Activation,
) -> Result<()> {
    let op = if bias.is_some() || act != Activation::Identity {
        "matmul_bias_act"
    } else {
        "matmul"
    };
    check(op, a, b, c)?;
    let r = c.dims.len();
    let n = c.dims[r - 1];
    let bias_full = match bias {
        Some(bias) => {
            bias.check(op, "bias")?;
            if bias.numel() != n || bias.dims.iter().filter(|&&d| d != 1).count() > 1 {
                return Err(Error::invalid_arg(
                    op,
                    "bias",
                    format!("needs {n} elements, got dims {:?}", bias.dims),
                ));
            }
            if bias.dtype != c.dtype {
                return Err(Error::invalid_arg(
                    op,
                    "bias",
                    format!("dtype {:?} differs from c's {:?}", bias.dtype, c.dtype),
                ));
            }
            let s = bias.strides[bias.dims.iter().position(|&d| d == n).unwrap_or(0)].max(1);
            let mut dims = vec![1i64; r];
            dims[r - 1] = n;
            let mut strides = vec![n * s; r];
            strides[r - 1] = s;
            Some(bias.reshaped(&dims, &strides)?)
        }
        None => None,
    };
    check_on_stream_device(
        stream,
        op,
        &[("a", Some(a)), ("b", Some(b)), ("bias", bias), ("c", Some(c))],
    )?;
    if c.is_empty() {
        return Ok(());
    }
    if act == Activation::Tanh {
        // cuDNN's fused tanh returns NaN for large inputs (see conv_bias_act_forward).
        matmul_bias_act(stream, a, b, bias, c, Activation::Identity)?;
        return super::fallback::tanh_in_place(stream, c);
    }
    if a.is_empty() || b.is_empty() {
        zero_fill(stream, c)?;
        return if bias_full.is_some() || act != Activation::Identity {
            bias_act_in_place(stream, op, c, bias_full.as_ref(), r - 1, act)
        } else {
            Ok(())
        };
    }
    let bias3 = bias_full.as_ref().map(rank3_bias).transpose()?;
    for (a3, b3, c3) in batches(a, b, c)? {
        matmul3(stream, op, &a3, &b3, bias3.as_ref(), &c3, act)?;
    }
    Ok(())
}

/// Bias `[1, .., 1, N]` as rank 3.
fn rank3_bias<'a>(b: &TensorRef<'a>) -> Result<TensorRef<'a>> {
    let r = b.dims.len();
    b.reshaped(&[1, 1, b.dims[r - 1]], &[b.strides[0], b.strides[0], b.strides[r - 1]])
}

/// Splits a broadcast batched product into rank-3 problems cuDNN runs directly: batch dims
/// are merged when strides allow; `b` shared by every batch is folded into M; other
/// broadcasts become one problem per batch index (all sharing one cached plan).
#[allow(clippy::type_complexity)]
fn batches<'a>(
    a: &TensorRef<'a>,
    b: &TensorRef<'a>,
    c: &TensorMut<'a>,
) -> Result<Vec<(TensorRef<'a>, TensorRef<'a>, TensorMut<'a>)>> {
    let r = c.dims.len();
    let nb = r - 2;
    // b shared by all batches, a and c packed along (batch.., M): fold batches into M.
    let b_shared = b.dims[..nb].iter().all(|&d| d == 1);
    if b_shared && nb > 0 && foldable(a, nb) && foldable(c, nb) {
        let m: i64 = a.dims[..=nb].iter().product();
        let fold = |t: &TensorRef, cols: i64| {
            [
                vec![1, m, cols],
                vec![m * t.strides[nb], t.strides[nb], t.strides[nb + 1]],
            ]
        };
        let k = a.dims[r - 1];
        let b3 = b.reshaped(
            &[1, b.dims[r - 2], b.dims[r - 1]],
            &[b.dims[r - 2] * b.dims[r - 1], b.strides[r - 2], b.strides[r - 1]],
        )?;
        let [ad, as_] = fold(a, k);
        let [cd, cs] = fold(c, c.dims[r - 1]);
        return Ok(vec![(a.reshaped(&ad, &as_)?, b3, c.reshaped_mut(&cd, &cs)?)]);
    }
    // General case: iterate over batch indices, merging the trailing batch dims where a, b
    // and c all have matching extents and mergeable strides.
    let batch = &c.dims[..nb];
    let mut inner = 1i64; // merged trailing batch extent
    let mut split = nb; // batch dims [split..nb) are merged into `inner`
    while split > 0 {
        let i = split - 1;
        let same = a.dims[i] == batch[i] && b.dims[i] == batch[i];
        let mergeable = split == nb
            || [a, b, c]
                .iter()
                .all(|t| t.strides[i] == t.strides[i + 1] * t.dims[i + 1]);
        if !same || !mergeable {
            break;
        }
        inner *= batch[i];
        split = i;
    }
    let inner_stride = |t: &TensorRef| {
        if split < nb {
            t.strides[nb - 1]
        } else {
            t.dims[nb] * t.strides[nb]
        }
    };
    let part = |t: &TensorRef| {
        [
            vec![inner, t.dims[r - 2], t.dims[r - 1]],
            vec![inner_stride(t), t.strides[r - 2], t.strides[r - 1]],
        ]
    };
    let ([ad, as_], [bd, bs], [cd, cs]) = (part(a), part(b), part(c));
    let outer: Vec<i64> = batch[..split].to_vec();
    let count: i64 = outer.iter().product();
    (0..count)
        .map(|flat| {
            let (mut rem, mut oa, mut ob, mut oc) = (flat, 0i64, 0i64, 0i64);
            for i in (0..split).rev() {
                let idx = rem % outer[i];
                rem /= outer[i];
                oa += if a.dims[i] == 1 { 0 } else { idx * a.strides[i] };
                ob += if b.dims[i] == 1 { 0 } else { idx * b.strides[i] };
                oc += idx * c.strides[i];
            }
            Ok((a.view(oa, &ad, &as_)?, b.view(ob, &bd, &bs)?, c.view_mut(oc, &cd, &cs)?))
        })
        .collect()
}

/// True when dims `0..=nb` (batch dims and M) of `t` form one evenly strided run.
fn foldable(t: &TensorRef, nb: usize) -> bool {
    (0..nb).all(|i| t.strides[i] == t.strides[i + 1] * t.dims[i + 1])
}

/// One rank-3 product (+ bias + activation) as one graph, with the unfused fallback.
fn matmul3(
    stream: &Arc<CudaStream>,
    op: &'static str,
    a: &TensorRef,
    b: &TensorRef,
    bias: Option<&TensorRef>,
    c: &TensorMut,
    act: Activation,
) -> Result<()> {
    if [a, b, c].into_iter().chain(bias).any(|t| t.alignment() < 16) {
        return matmul3_aligned(stream, op, a, b, bias, c, act);
    }
    let fused = bias.is_some() || act != Activation::Identity;
    let build = || matmul_graph(a, b, bias, c, act);
    // uids as matmul_graph assigns them.
    let mut io = vec![(1, a.ptr), (2, b.ptr)];
    let mut last = 3;
    if let Some(bias) = bias {
        io.push((4, bias.ptr));
        last = 5;
    }
    if PointwiseMode::of_activation(act).is_some() {
        last += 1;
    }
    io.push((last, c.ptr));
    let key = matmul_key(op, a, b, bias, c, act);
    let unfused = || {
        matmul3(stream, op, a, b, None, c, Activation::Identity)?;
        bias_act_in_place(stream, op, c, bias, 2, act)
    };
    if !fused {
        return run(stream, op, key, &io, &build);
    }
    // A new fused graph may need a runtime-compiled engine (0.3 s or more to build): it builds
    // in the background while the unfused pair runs.
    match run_when_built(stream, op, key, &io, true, &build) {
        Ok(true) => Ok(()),
        Ok(false) => unfused(),
        Err(e) if e.is_not_supported() => {
            tracing::debug!("{op}: fused graph unsupported ({e}); running matmul + bias/activation kernel");
            unfused()
        }
        Err(e) => Err(e),
    }
}

/// `matmul3` for operands whose pointers are not 16-byte aligned (a view starting at an odd
/// element): cuDNN accepts the declared alignment but its cuBLASLt engines fail at run
/// time, so such operands are copied into fresh packed buffers (and `c` copied back).
fn matmul3_aligned(
    stream: &Arc<CudaStream>,
    op: &'static str,
    a: &TensorRef,
    b: &TensorRef,
    bias: Option<&TensorRef>,
    c: &TensorMut,
    act: Activation,
) -> Result<()> {
    let scratch = |t: &TensorRef| -> Result<Option<DeviceBuffer>> {
        if t.alignment() >= 16 {
            return Ok(None);
        }
        DeviceBuffer::alloc(stream, t.numel() as usize * t.dtype.size(), op).map(Some)
    };
    let bufs = [
        scratch(a)?,
        scratch(b)?,
        scratch(c)?,
        bias.map(scratch).transpose()?.flatten(),
    ];
    let [a2, b2, c2, bias2] = [
        packed_in(&bufs[0], a)?,
        packed_in(&bufs[1], b)?,
        packed_in(&bufs[2], c)?,
        bias.map(|t| packed_in(&bufs[3], t)).transpose()?.flatten(),
    ];
    for (src, dst) in [(a, &a2), (b, &b2)].into_iter().chain(bias.map(|t| (t, &bias2))) {
        if let Some(dst) = dst {
            copy(stream, src, dst)?;
        }
    }
    let (a_in, b_in, c_out) = (
        a2.as_deref().unwrap_or(a),
        b2.as_deref().unwrap_or(b),
        c2.as_ref().unwrap_or(c),
    );
    matmul3(stream, op, a_in, b_in, bias2.as_deref().or(bias), c_out, act)?;
    if let Some(c2) = &c2 {
        copy(stream, c2, c)?;
    }
    // The buffers are freed in stream order, after the work above.
    drop((a2, b2, c2, bias2));
    drop(bufs);
    Ok(())
}

/// A packed view of `t`'s dims and dtype in `buf`, when there is one.
pub(super) fn packed_in<'b>(buf: &'b Option<DeviceBuffer>, t: &TensorRef) -> Result<Option<TensorMut<'b>>> {
    buf.as_ref()
        .map(|buf| buf.view_mut(0, &t.dims, &row_major_strides(&t.dims), t.dtype))
        .transpose()
}
