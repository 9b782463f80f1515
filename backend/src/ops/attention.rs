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
/// (matmul, scale, optional additive bias, softmax, matmul), which cuDNN runs with its
/// fused flash-attention engines. `q [B, H, Sq, D]`, `k [B, H, Skv, D]`, `v [B, H, Skv, Dv]`,
/// `o [B, H, Sq, Dv]`, `bias [B|1, H|1, Sq, Skv]` (e.g. 0 / -inf for a causal mask).
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
    o: &TensorRef,
    scale: f32,
    stats: Option<&TensorRef>,
) -> Result<()> {
    const OP: &str = "sdpa";
    check(q, k, v, bias, o)?;
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
    let (b, h, sq) = (q.dims[0], q.dims[1], q.dims[2]);
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
        let scores = g.matmul(qi, ki);
        let mut s = g.pointwise(PointwiseMode::Mul, scores, Some(si));
        if let Some(bi) = bi {
            s = g.pointwise(PointwiseMode::Add, s, Some(bi));
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
    // uids: q 1, k_t 2, v 3, scale 4, [bias 5], then one per node output in order: scores,
    // scaled, [biased], max, shifted, exp, sum, ln sum, statistics, probabilities, o.
    let nb = bias.is_some() as i64;
    let mut io = vec![(1, q.ptr), (2, kt.ptr), (3, v.ptr), (4, (&scale as *const f32) as u64)];
    if let Some(t) = bias {
        io.push((5, t.ptr));
    }
    // The statistics are the output of the ninth node (eighth without a bias).
    if let Some(st) = stats {
        io.push((4 + nb + 8 + nb, st.ptr));
    }
    io.push((4 + nb + 10 + nb, o.ptr));
    let mut key = OpKey::new(OP);
    key.ints(&[nb, stats.is_some() as i64])
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
