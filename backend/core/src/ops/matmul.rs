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
    let padded = PaddedDims::of(a, b, c);
    if padded.is_some() || [a, b, c].into_iter().chain(bias).any(|t| t.alignment() < 16) {
        let dims = padded.unwrap_or(PaddedDims {
            m: a.dims[1],
            k: a.dims[2],
            n: b.dims[2],
        });
        return matmul3_repacked(stream, op, &dims, a, b, bias, c, act);
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

/// Multiply-adds from which a product pads a dim that is some operand's contiguous dim and not
/// a multiple of 16 bytes: cuBLASLt and cuDNN pick element-aligned kernels for such a dim
/// (a language model's vocabulary of 50,257 or 30,522) whatever the strides, several times
/// slower than copying the operands to zero-padded buffers first.
const PAD_MIN_MACS: i64 = 1 << 30;

/// The smallest of M, K and N from which such a product is padded.
const PAD_MIN_DIM: i64 = 128;

/// The dims `[M, K, N]` of a large rank-3 product with every dim that is some operand's
/// contiguous dim rounded up to a multiple of 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PaddedDims {
    m: i64,
    k: i64,
    n: i64,
}

impl PaddedDims {
    /// `None` when the product is small or no dim needs padding.
    fn of(a: &TensorRef, b: &TensorRef, c: &TensorRef) -> Option<Self> {
        let [m, k, n] = [a.dims[1], a.dims[2], b.dims[2]];
        // Thin products (a matrix-vector one) are bound by reading the operands, which a
        // padded copy would only add to.
        if a.dims[0].max(c.dims[0]) * m * k * n < PAD_MIN_MACS || m.min(k).min(n) < PAD_MIN_DIM {
            return None;
        }
        let per = (16 / c.dtype.size() as i64).max(1);
        // Whether inner dim `d` (1: rows, 2: columns) of `t` is its contiguous one.
        let contiguous = |t: &TensorRef, d: usize| t.strides[d] == 1 && t.strides[3 - d] != 1;
        let pad = |n: i64, needed: bool| {
            if needed && n % per != 0 {
                (n + per - 1) / per * per
            } else {
                n
            }
        };
        let padded = Self {
            m: pad(m, contiguous(a, 1) || contiguous(c, 1)),
            k: pad(k, contiguous(a, 2) || contiguous(b, 1)),
            n: pad(n, contiguous(b, 2) || contiguous(c, 2)),
        };
        (padded != Self { m, k, n }).then_some(padded)
    }
}

/// Strides of a packed `[batch, rows, cols]` buffer in `t`'s orientation (column-major inner
/// dims when `t` is), and its element count.
fn packed_like(t: &TensorRef, [batch, rows, cols]: [i64; 3]) -> (Vec<i64>, i64) {
    let strides = if t.strides[1] == 1 && t.strides[2] != 1 {
        vec![rows * cols, 1, rows]
    } else {
        vec![rows * cols, cols, 1]
    };
    (strides, (batch * rows * cols).max(1))
}

/// `matmul3` on copies in fresh buffers of the operands that need them (`c` copied back):
/// operands whose pointers are not 16-byte aligned (a view starting at an odd element: cuDNN
/// accepts the declared alignment but its cuBLASLt engines fail at run time), and operands
/// whose dims `p` enlarges (zero-filled first, so the padding of a reduced dim adds nothing;
/// padded rows or columns of `c` are dropped by the copy back).
#[allow(clippy::too_many_arguments)]
fn matmul3_repacked(
    stream: &Arc<CudaStream>,
    op: &'static str,
    p: &PaddedDims,
    a: &TensorRef,
    b: &TensorRef,
    bias: Option<&TensorRef>,
    c: &TensorMut,
    act: Activation,
) -> Result<()> {
    let want = |t: &TensorRef, rows: i64, cols: i64| [t.dims[0], rows, cols];
    let shapes = [want(a, p.m, p.k), want(b, p.k, p.n), want(c, p.m, p.n), [1, 1, p.n]];
    let operands = [Some(a), Some(b), Some(&**c), bias];
    // Per operand that moves: its buffer, the strides of its copy, and whether its dims grow.
    let mut bufs = Vec::with_capacity(4);
    for (t, shape) in operands.iter().zip(shapes) {
        bufs.push(match t {
            Some(t) if t.dims[..] != shape[..] || t.alignment() < 16 => {
                let (strides, elems) = packed_like(t, shape);
                let buf = DeviceBuffer::alloc(stream, elems as usize * t.dtype.size(), op)?;
                Some((buf, strides, t.dims[..] != shape[..]))
            }
            _ => None,
        });
    }
    // Per moved operand: its whole (padded) view and the part that holds its elements.
    let moved = |k: usize, t: &TensorRef| -> Result<Option<(TensorMut<'_>, TensorMut<'_>)>> {
        let Some((buf, strides, _)) = &bufs[k] else {
            return Ok(None);
        };
        let whole = buf.view_mut(0, &shapes[k], strides, t.dtype)?;
        let part = buf.view_mut(0, &t.dims, strides, t.dtype)?;
        Ok(Some((whole, part)))
    };
    let views = [
        moved(0, a)?,
        moved(1, b)?,
        moved(2, c)?,
        bias.map(|t| moved(3, t)).transpose()?.flatten(),
    ];
    for (k, t) in [(0, Some(a)), (1, Some(b)), (3, bias)] {
        if let (Some(t), Some((whole, part))) = (t, &views[k]) {
            if bufs[k].as_ref().is_some_and(|(_, _, grown)| *grown) {
                zero_fill(stream, whole)?;
            }
            copy(stream, t, part)?;
        }
    }
    {
        let pick = |k: usize| views[k].as_ref().map(|(whole, _)| (**whole).clone());
        let a2 = pick(0).unwrap_or_else(|| a.clone());
        let b2 = pick(1).unwrap_or_else(|| b.clone());
        let bias2 = pick(3).or_else(|| bias.cloned());
        match &views[2] {
            Some((whole, part)) => {
                matmul3(stream, op, &a2, &b2, bias2.as_ref(), whole, act)?;
                copy(stream, part, c)?;
            }
            None => matmul3(stream, op, &a2, &b2, bias2.as_ref(), c, act)?,
        }
    }
    // The buffers are freed in stream order, after the work above.
    drop(views);
    drop(bufs);
    Ok(())
}

/// A packed view of `t`'s dims and dtype in `buf`, when there is one.
pub(super) fn packed_in<'b>(buf: &'b Option<DeviceBuffer>, t: &TensorRef) -> Result<Option<TensorMut<'b>>> {
    buf.as_ref()
        .map(|buf| buf.view_mut(0, &t.dims, &row_major_strides(&t.dims), t.dtype))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[i64], strides: &[i64]) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, DataType::BF16, 0x1000)
    }

    #[test]
    fn a_large_product_pads_an_odd_contiguous_dim() {
        let (m, k, v) = (8192i64, 768i64, 50257i64);
        // GPT-2's logits h · Wᵀ: the vocabulary is c's contiguous dim.
        let (h, wt) = (t(&[1, m, k], &[m * k, k, 1]), t(&[1, k, v], &[v * k, 1, k]));
        let logits = t(&[1, m, v], &[m * v, v, 1]);
        assert_eq!(PaddedDims::of(&h, &wt, &logits), Some(PaddedDims { m, k, n: 50264 }));
        // The input gradient dY · W: the vocabulary is the reduced dim.
        let w = t(&[1, v, k], &[v * k, k, 1]);
        let dh = t(&[1, m, k], &[m * k, k, 1]);
        assert_eq!(PaddedDims::of(&logits, &w, &dh), Some(PaddedDims { m, k: 50264, n: k }));
        // The weight gradient dYᵀ · h: the vocabulary is the column-major a's rows.
        let dyt = t(&[1, v, m], &[m * v, 1, v]);
        let dw = t(&[1, v, k], &[v * k, k, 1]);
        assert_eq!(PaddedDims::of(&dyt, &h, &dw), Some(PaddedDims { m: 50264, k: m, n: k }));
        // Aligned dims, small products and thin ones are left alone.
        let (a, b) = (t(&[1, m, k], &[m * k, k, 1]), t(&[1, k, 3072], &[3072 * k, 3072, 1]));
        assert_eq!(PaddedDims::of(&a, &b, &t(&[1, m, 3072], &[m * 3072, 3072, 1])), None);
        let small = t(&[1, 64, 1001], &[64 * 1001, 1001, 1]);
        assert_eq!(
            PaddedDims::of(
                &t(&[1, 64, k], &[64 * k, k, 1]),
                &t(&[1, k, 1001], &[1001 * k, 1001, 1]),
                &small
            ),
            None
        );
    }

    #[test]
    fn padded_copies_keep_the_operand_orientation() {
        let wt = t(&[1, 768, 50257], &[768 * 50257, 1, 768]);
        assert_eq!(
            packed_like(&wt, [1, 768, 50264]),
            (vec![768 * 50264, 1, 768], 768 * 50264)
        );
        let logits = t(&[2, 4, 5], &[20, 5, 1]);
        assert_eq!(packed_like(&logits, [2, 4, 8]), (vec![32, 8, 1], 64));
    }
}
