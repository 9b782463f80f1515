//! Scaled dot-product attention as one cuDNN graph (the fused flash-attention engines).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, run_with_scalars, OpKey, TensorRef};
use crate::error::{Error, Result};
use crate::graph::{DataType, Graph, PointwiseMode, ReduceOp, Scalar};

fn check(q: &TensorRef, k: &TensorRef, v: &TensorRef, bias: Option<&TensorRef>, o: &TensorRef) -> Result<()> {
    const OP: &str = "sdpa";
    for (name, t) in [("q", q), ("k", k), ("v", v), ("o", o)] {
        t.check(OP, name)?;
        if t.dims.len() != 4 {
            return Err(Error::invalid_arg(
                OP,
                name,
                format!("dims {:?}: need [batch, heads, seq, head_dim]", t.dims),
            ));
        }
        if t.dtype != q.dtype {
            return Err(Error::invalid_arg(
                OP,
                name,
                format!("dtype {:?} differs from q's {:?}", t.dtype, q.dtype),
            ));
        }
    }
    let (b, h, sq, d) = (q.dims[0], q.dims[1], q.dims[2], q.dims[3]);
    let skv = k.dims[2];
    if k.dims != [b, h, skv, d] {
        return Err(Error::invalid_arg(
            OP,
            "k",
            format!(
                "dims {:?} do not match q {:?} (need [{b}, {h}, seq_kv, {d}])",
                k.dims, q.dims
            ),
        ));
    }
    let dv = v.dims[3];
    if v.dims != [b, h, skv, dv] {
        return Err(Error::invalid_arg(
            OP,
            "v",
            format!("dims {:?}: need [{b}, {h}, {skv}, head_dim_v]", v.dims),
        ));
    }
    if o.dims != [b, h, sq, dv] {
        return Err(Error::invalid_arg(
            OP,
            "o",
            format!("dims {:?}: need [{b}, {h}, {sq}, {dv}]", o.dims),
        ));
    }
    if let Some(bias) = bias {
        bias.check(OP, "bias")?;
        let ok = bias.dims.len() == 4
            && (bias.dims[0] == b || bias.dims[0] == 1)
            && (bias.dims[1] == h || bias.dims[1] == 1)
            && bias.dims[2..] == [sq, skv];
        if !ok {
            return Err(Error::invalid_arg(
                OP,
                "bias",
                format!("dims {:?}: need [{b} or 1, {h} or 1, {sq}, {skv}]", bias.dims),
            ));
        }
    }
    Ok(())
}

/// True when cuDNN's fused attention engines take these sizes: f16 or bf16, head dims
/// `head_dim` (q, k) and `head_dim_v` (v) multiples of 8 up to 256, and at least one key.
/// Callers check this before preparing inputs; [`sdpa_forward`] may still return a
/// not-supported error for a case a GPU lacks an engine for.
pub fn sdpa_fusable(dtype: DataType, head_dim: i64, head_dim_v: i64, seq_kv: i64) -> bool {
    let head_ok = |d: i64| d > 0 && d % 8 == 0 && d <= 256;
    matches!(dtype, DataType::F16 | DataType::BF16) && head_ok(head_dim) && head_ok(head_dim_v) && seq_kv > 0
}

/// `o = softmax(q · kᵀ · scale + bias) · v` per batch and head as ONE cuDNN graph
/// (matmul, scale, optional additive bias, optional causal mask, softmax, matmul), which
/// cuDNN runs with its fused flash-attention engines. `q [B, H, Sq, D]`, `k [B, H, Skv, D]`,
/// `v [B, H, Skv, Dv]`, `o [B, H, Sq, Dv]`, `bias [B|1, H|1, Sq, Skv]`.
///
/// `causal` lets query `i` see keys `j <= i + Skv - Sq` (the mask aligned to the bottom
/// right, as Burn and PyTorch's `is_causal` with a KV cache define it; the usual lower
/// triangle when `Sq == Skv`). The mask is computed inside the fused kernel, which skips
/// the masked blocks; it needs `Sq <= Skv`, and cuDNN takes a bias with it only when
/// `Sq == Skv`.
///
/// With `stats` (f32 `[B, H, Sq, 1]`, packed) the softmax log-sum-exp `max + ln Σ exp` of
/// every row is written too (what a backward pass needs); without it cuDNN runs its
/// inference variant.
///
/// cuDNN only has engines for f16 and bf16 with head dims that are multiples of 8 (up to
/// 128 or 256 by GPU) and unit-stride rows; other cases return a not-supported error
/// ([`Error::is_not_supported`]) so the caller can compose the attention instead.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_forward(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    bias: Option<&TensorRef>,
    causal: bool,
    o: &TensorRef,
    scale: f32,
    stats: Option<&TensorRef>,
) -> Result<()> {
    const OP: &str = "sdpa";
    check(q, k, v, bias, o)?;
    if causal && q.dims[2] > k.dims[2] {
        return Err(Error::invalid_arg(
            OP,
            "q",
            format!(
                "a causal mask needs no more queries ({}) than keys ({}): rows would see no key",
                q.dims[2], k.dims[2]
            ),
        ));
    }
    if let Some(st) = stats {
        st.check(OP, "stats")?;
        let want = [q.dims[0], q.dims[1], q.dims[2], 1];
        if st.dims != want || st.dtype != DataType::F32 || !st.is_packed() {
            return Err(Error::invalid_arg(
                OP,
                "stats",
                format!("{:?} {:?}: need packed f32 {want:?}", st.dims, st.dtype),
            ));
        }
    }
    let operands = [
        ("q", Some(q)),
        ("k", Some(k)),
        ("v", Some(v)),
        ("bias", bias),
        ("o", Some(o)),
        ("stats", stats),
    ];
    check_on_stream_device(stream, OP, &operands)?;
    if o.is_empty() {
        return Ok(());
    }
    if !matches!(q.dtype, DataType::F16 | DataType::BF16) {
        return Err(Error::Unsupported {
            graph: format!("sdpa {:?} {:?}", q.dims, q.dtype),
            reason: "cuDNN's fused attention engines take f16 or bf16 only".into(),
        });
    }
    if k.dims[2] == 0 {
        return Err(Error::Unsupported {
            graph: format!("sdpa {:?}", q.dims),
            reason: "an empty key sequence leaves the softmax undefined".into(),
        });
    }
    let (b, h, sq, skv) = (q.dims[0], q.dims[1], q.dims[2], k.dims[2]);
    // Bottom-right alignment shifts the row index by Skv - Sq (the frontend's pattern: + Skv, - Sq).
    let shifted_mask = causal && sq != skv;
    let (neg_inf, skv32, sq32) = (f32::NEG_INFINITY, skv as i32, sq as i32);
    // The graph multiplies q by kᵀ: the same memory with the last two dims swapped.
    let mut kt = k.clone();
    kt.dims.swap(2, 3);
    kt.strides.swap(2, 3);
    let build = || {
        let mut g = Graph::new();
        let qi = q.add_input(&mut g, "q");
        let ki = kt.add_input(&mut g, "k_t");
        let vi = v.add_input(&mut g, "v");
        let si = g.scalar("scale", Scalar::F32(scale), 4);
        let bi = bias.map(|t| t.add_input(&mut g, "bias"));
        let mask_scalars = causal.then(|| {
            let fill = g.scalar("masked", Scalar::F32(neg_inf), 4);
            let shift = shifted_mask.then(|| {
                (
                    g.scalar("seq_kv", Scalar::I32(skv32), 4),
                    g.scalar("seq_q", Scalar::I32(sq32), 4),
                )
            });
            (fill, shift)
        });
        let scores = g.matmul(qi, ki);
        let mut s = g.pointwise(PointwiseMode::Mul, scores, Some(si));
        if let Some(bi) = bi {
            s = g.pointwise(PointwiseMode::Add, s, Some(bi));
        }
        if let Some((fill, shift)) = mask_scalars {
            let (i32_, bool_) = (DataType::I32, DataType::Bool);
            let mut row = g.pointwise_typed(PointwiseMode::GenIndex(2), s, None, DataType::F32, i32_);
            let col = g.pointwise_typed(PointwiseMode::GenIndex(3), s, None, DataType::F32, i32_);
            if let Some((kv_len, q_len)) = shift {
                row = g.pointwise_typed(PointwiseMode::Add, row, Some(kv_len), i32_, i32_);
                row = g.pointwise_typed(PointwiseMode::Sub, row, Some(q_len), i32_, i32_);
            }
            let keep = g.pointwise_typed(PointwiseMode::CmpGe, row, Some(col), bool_, bool_);
            s = g.select(s, fill, keep);
        }
        let row = [b, h, sq, 1];
        let max = g.reduction(ReduceOp::Max, s, &row);
        let shifted = g.pointwise(PointwiseMode::Sub, s, Some(max));
        let e = g.pointwise(PointwiseMode::Exp, shifted, None);
        let sum = g.reduction(ReduceOp::Sum, e, &row);
        // cuDNN's attention pattern also derives the softmax statistics max + ln(sum), which
        // inference leaves unread.
        let log_sum = g.pointwise(PointwiseMode::Log, sum, None);
        let lse = g.pointwise(PointwiseMode::Add, max, Some(log_sum));
        match stats {
            Some(st) => st.bind_output(&mut g, lse),
            None => {
                g.allow_unused(lse);
            }
        }
        let p = g.pointwise(PointwiseMode::Div, e, Some(sum));
        // The second product takes the probabilities in the input type.
        g.set_virtual_dtype(p, q.dtype);
        let out = g.matmul(p, vi);
        o.bind_output(&mut g, out);
        g
    };
    // uids: q 1, k_t 2, v 3, scale 4, [bias], [masked value, [seq_kv, seq_q]], then one per
    // node output in order: scores, scaled, [biased], [row, col, [row + skv, - sq], keep,
    // masked], max, shifted, exp, sum, ln sum, statistics, probabilities, o.
    let nb = bias.is_some() as i64;
    let mut io = vec![(1, q.ptr), (2, kt.ptr), (3, v.ptr), (4, (&scale as *const f32) as u64)];
    if let Some(t) = bias {
        io.push((5, t.ptr));
    }
    if causal {
        io.push((io.len() as i64 + 1, (&neg_inf as *const f32) as u64));
        if shifted_mask {
            io.push((io.len() as i64 + 1, (&skv32 as *const i32) as u64));
            io.push((io.len() as i64 + 1, (&sq32 as *const i32) as u64));
        }
    }
    let inputs = io.len() as i64;
    let mask_nodes = if causal { 4 + 2 * shifted_mask as i64 } else { 0 };
    // The statistics are the output of the node after scores, scaled, [biased], the mask
    // nodes and the five softmax nodes; o comes two nodes later.
    let stats_uid = inputs + 2 + nb + mask_nodes + 6;
    if let Some(st) = stats {
        io.push((stats_uid, st.ptr));
    }
    io.push((stats_uid + 2, o.ptr));
    let mut key = OpKey::new(OP);
    key.ints(&[nb, stats.is_some() as i64, causal as i64 + shifted_mask as i64])
        .tensor(q)
        .tensor(&kt)
        .tensor(v)
        .tensor(o);
    if let Some(st) = stats {
        key.tensor(st);
    }
    if let Some(t) = bias {
        key.tensor(t);
    }
    run_with_scalars(stream, OP, key, &io, &build)
}
