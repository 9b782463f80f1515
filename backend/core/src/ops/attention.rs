//! Scaled dot-product attention as one cuDNN graph (the fused flash-attention engines).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, run_when_built, run_with_scalars, OpKey, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::graph::{DataType, Graph, PointwiseMode, ReduceOp, Scalar, TensorId};
use crate::types::row_major_strides;

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
    if k.dims[..] != [b, h, skv, d] {
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
    if v.dims[..] != [b, h, skv, dv] {
        return Err(Error::invalid_arg(
            OP,
            "v",
            format!("dims {:?}: need [{b}, {h}, {skv}, head_dim_v]", v.dims),
        ));
    }
    if o.dims[..] != [b, h, sq, dv] {
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

/// Dropout on the attention probabilities inside the fused graphs: each probability is
/// kept with probability `1 - probability` and scaled by `1 / (1 - probability)`, the mask
/// drawn by cuDNN's Philox generator from `seed` and `offset`. The backward regenerates the
/// same mask from the same pair, so a forward and its backward must be given equal values.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDropout<'a> {
    /// The probability of dropping, in `[0, 1)`.
    pub probability: f32,
    /// The Philox seed: one `I64` on the device (dims all 1).
    pub seed: &'a TensorRef<'a>,
    /// The Philox offset: one `I64` on the device (dims all 1).
    pub offset: &'a TensorRef<'a>,
}

impl AttentionDropout<'_> {
    /// The keep probability the generator is given, the same value forward and backward.
    fn keep(&self) -> f64 {
        1.0 - f64::from(self.probability)
    }

    /// The scale of kept probabilities, `1 / keep`.
    fn scale(&self) -> f32 {
        (1.0 / self.keep()) as f32
    }

    fn check(&self, op: &'static str) -> Result<()> {
        if !(0.0..1.0).contains(&self.probability) {
            return Err(Error::invalid_arg(
                op,
                "dropout",
                format!("probability {}: need [0, 1)", self.probability),
            ));
        }
        for (name, t) in [("dropout seed", self.seed), ("dropout offset", self.offset)] {
            t.check(op, name)?;
            if t.dims.is_empty() || t.dims.iter().any(|&n| n != 1) || t.dtype != DataType::I64 {
                return Err(Error::invalid_arg(
                    op,
                    name,
                    format!("{:?} {:?}: need one I64", t.dims, t.dtype),
                ));
            }
        }
        Ok(())
    }
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
    o: &TensorMut,
    scale: f32,
    stats: Option<&TensorMut>,
) -> Result<()> {
    sdpa_forward_impl(
        stream,
        q,
        k,
        v,
        bias,
        causal,
        o,
        scale,
        stats.map(TensorMut::as_input),
        None,
        None,
        false,
    )
    .map(|_| ())
}

/// [`sdpa_forward`] with dropout on the probabilities before the product with `v` (see
/// [`AttentionDropout`]; the statistics are the softmax's, before dropout, as the backward
/// wants them). With `mask` (f32 `[B, H, Sq, Skv]`) the dropout mask (1 kept, 0 dropped) is
/// stored too, for tests. cuDNN takes dropout with a top-left causal mask (`Sq == Skv`)
/// but not a bottom-right one.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_forward_dropout(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    bias: Option<&TensorRef>,
    causal: bool,
    o: &TensorMut,
    scale: f32,
    stats: Option<&TensorMut>,
    dropout: &AttentionDropout<'_>,
    mask: Option<&TensorMut>,
) -> Result<()> {
    sdpa_forward_impl(
        stream,
        q,
        k,
        v,
        bias,
        causal,
        o,
        scale,
        stats.map(TensorMut::as_input),
        Some(dropout),
        mask.map(TensorMut::as_input),
        false,
    )
    .map(|_| ())
}

/// [`sdpa_forward`] for callers that can compose the attention instead: when its fused plan
/// is new (on a fresh machine it needs a runtime compile, about a second), the build starts
/// on a background thread and `Ok(false)` says that nothing ran; later calls run the plan
/// once it is built (`Ok(true)`). With a benchmark or deterministic policy it always runs.
/// `dropout` as in [`sdpa_forward_dropout`]; with it a new plan is built before it runs
/// (never `Ok(false)`), since a composed forward's mask is not the one the fused backward
/// regenerates.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_forward_when_built(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    bias: Option<&TensorRef>,
    causal: bool,
    o: &TensorMut,
    scale: f32,
    stats: Option<&TensorMut>,
    dropout: Option<&AttentionDropout<'_>>,
) -> Result<bool> {
    sdpa_forward_impl(
        stream,
        q,
        k,
        v,
        bias,
        causal,
        o,
        scale,
        stats.map(TensorMut::as_input),
        dropout,
        None,
        dropout.is_none(),
    )
}

/// The by-value scalars of the forward graph, whose host addresses its variant pack binds.
struct ForwardScalars {
    scale: f32,
    masked: f32,
    seq: [i32; 2],
    dropout_scale: f32,
}

/// The operands of the forward attention graph (`kt`: k with its last two dims swapped).
struct ForwardGraph<'t, 'a> {
    q: &'t TensorRef<'a>,
    kt: &'t TensorRef<'a>,
    v: &'t TensorRef<'a>,
    bias: Option<&'t TensorRef<'a>>,
    causal: bool,
    o: &'t TensorRef<'a>,
    stats: Option<&'t TensorRef<'a>>,
    dropout: Option<&'t AttentionDropout<'a>>,
    mask: Option<&'t TensorRef<'a>>,
}

impl ForwardGraph<'_, '_> {
    /// A causal mask aligned to the bottom right of rectangular scores.
    fn shifted_mask(&self) -> bool {
        self.causal && self.q.dims[2] != self.kt.dims[3]
    }

    fn graph(&self, host: &ForwardScalars) -> Graph {
        let Self {
            q,
            kt,
            v,
            bias,
            causal,
            o,
            stats,
            dropout,
            mask,
        } = *self;
        let (b, h, sq, skv) = (q.dims[0], q.dims[1], q.dims[2], kt.dims[3]);
        let shifted_mask = self.shifted_mask();
        let mut g = Graph::new();
        let qi = q.add_input(&mut g, "q");
        let ki = kt.add_input(&mut g, "k_t");
        let vi = v.add_input(&mut g, "v");
        let si = g.scalar("scale", Scalar::F32(host.scale), 4);
        let bi = bias.map(|t| t.add_input(&mut g, "bias"));
        let mask_scalars = causal.then(|| {
            let fill = g.scalar("masked", Scalar::F32(host.masked), 4);
            let shift = shifted_mask.then(|| {
                (
                    g.scalar("seq_kv", Scalar::I32(host.seq[0]), 4),
                    g.scalar("seq_q", Scalar::I32(host.seq[1]), 4),
                )
            });
            (fill, shift)
        });
        let drop_inputs = dropout.map(|d| {
            let seed = d.seed.add_input(&mut g, "dropout_seed");
            let offset = d.offset.add_input(&mut g, "dropout_offset");
            let scale = g.scalar("dropout_scale", Scalar::F32(host.dropout_scale), 4);
            (seed, offset, scale, d.keep())
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
        let mut p = g.pointwise(PointwiseMode::Div, e, Some(sum));
        if let Some((seed, offset, drop_scale, keep)) = drop_inputs {
            let m = g.rng_bernoulli(seed, offset, &[b, h, sq, skv], keep);
            if let Some(mt) = mask {
                mt.bind_output(&mut g, m);
            }
            let kept = g.pointwise(PointwiseMode::Mul, p, Some(m));
            p = g.pointwise(PointwiseMode::Mul, kept, Some(drop_scale));
        }
        // The second product takes the probabilities in the input type.
        g.set_virtual_dtype(p, q.dtype);
        let out = g.matmul(p, vi);
        o.bind_output(&mut g, out);
        g
    }

    /// The variant pack: (uid, address) of every non-virtual tensor in uid order, the
    /// by-value scalars at their addresses in `host`.
    fn io(&self, host: &ForwardScalars) -> Vec<(i64, u64)> {
        let Self {
            q,
            kt,
            v,
            bias,
            causal,
            o,
            stats,
            dropout,
            mask,
        } = *self;
        let shifted_mask = self.shifted_mask();
        let addr = |x: &f32| (x as *const f32) as u64;
        // uids: q 1, k_t 2, v 3, scale 4, [bias], [masked value, [seq_kv, seq_q]], [dropout
        // seed, offset, scale], then one per node output in order: scores, scaled, [biased],
        // [row, col, [row + skv, - sq], keep, masked], max, shifted, exp, sum, ln sum,
        // statistics, probabilities, [dropout mask, kept, scaled], o.
        let nb = bias.is_some() as i64;
        let mut io = vec![(1, q.ptr), (2, kt.ptr), (3, v.ptr), (4, addr(&host.scale))];
        if let Some(t) = bias {
            io.push((5, t.ptr));
        }
        if causal {
            io.push((io.len() as i64 + 1, addr(&host.masked)));
            if shifted_mask {
                io.push((io.len() as i64 + 1, (&host.seq[0] as *const i32) as u64));
                io.push((io.len() as i64 + 1, (&host.seq[1] as *const i32) as u64));
            }
        }
        if let Some(d) = dropout {
            io.push((io.len() as i64 + 1, d.seed.ptr));
            io.push((io.len() as i64 + 1, d.offset.ptr));
            io.push((io.len() as i64 + 1, addr(&host.dropout_scale)));
        }
        let inputs = io.len() as i64;
        let mask_nodes = if causal { 4 + 2 * shifted_mask as i64 } else { 0 };
        // The statistics are the output of the node after scores, scaled, [biased], the mask
        // nodes and the five softmax nodes; o comes two nodes later (five with dropout).
        let stats_uid = inputs + 2 + nb + mask_nodes + 6;
        if let Some(st) = stats {
            io.push((stats_uid, st.ptr));
        }
        if let Some(m) = mask {
            io.push((stats_uid + 2, m.ptr));
        }
        io.push((stats_uid + 2 + 3 * dropout.is_some() as i64, o.ptr));
        io
    }
}

#[allow(clippy::too_many_arguments)]
fn sdpa_forward_impl(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    bias: Option<&TensorRef>,
    causal: bool,
    o: &TensorRef,
    scale: f32,
    stats: Option<&TensorRef>,
    dropout: Option<&AttentionDropout<'_>>,
    mask: Option<&TensorRef>,
    when_built: bool,
) -> Result<bool> {
    const OP: &str = "sdpa";
    check(q, k, v, bias, o)?;
    if let Some(d) = dropout {
        d.check(OP)?;
    }
    if let Some(m) = mask {
        m.check(OP, "mask")?;
        let want = [q.dims[0], q.dims[1], q.dims[2], k.dims[2]];
        if dropout.is_none() || m.dims[..] != want[..] || m.dtype != DataType::F32 {
            return Err(Error::invalid_arg(
                OP,
                "mask",
                format!("{:?} {:?}: need dropout and f32 {want:?}", m.dims, m.dtype),
            ));
        }
    }
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
        if st.dims[..] != want[..] || st.dtype != DataType::F32 || !st.is_packed() {
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
        ("dropout seed", dropout.map(|d| d.seed)),
        ("dropout offset", dropout.map(|d| d.offset)),
        ("mask", mask),
    ];
    check_on_stream_device(stream, OP, &operands)?;
    if o.is_empty() {
        return Ok(true);
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
    let (sq, skv) = (q.dims[2], k.dims[2]);
    // Bottom-right alignment shifts the row index by Skv - Sq (the frontend's pattern: + Skv, - Sq).
    let shifted_mask = causal && sq != skv;
    if dropout.is_some() && shifted_mask {
        return Err(Error::Unsupported {
            graph: format!("sdpa {:?} kv {skv}", q.dims),
            reason: "cuDNN takes dropout with a causal mask only when Sq == Skv".into(),
        });
    }
    let host = ForwardScalars {
        scale,
        masked: f32::NEG_INFINITY,
        seq: [skv as i32, sq as i32],
        dropout_scale: dropout.map_or(1.0, AttentionDropout::scale),
    };
    // The graph multiplies q by kᵀ: the same memory with the last two dims swapped.
    let mut kt = k.clone();
    kt.dims.swap(2, 3);
    kt.strides.swap(2, 3);
    let f = ForwardGraph {
        q,
        kt: &kt,
        v,
        bias,
        causal,
        o,
        stats,
        dropout,
        mask,
    };
    let io = f.io(&host);
    let build = || f.graph(&host);
    let nb = bias.is_some() as i64;
    let mut key = OpKey::new(OP);
    // The keep probability is part of the graph (the generator's attribute).
    let keep_bits = dropout.map_or(0, |d| d.keep().to_bits() as i64);
    key.ints(&[
        nb,
        stats.is_some() as i64,
        causal as i64 + shifted_mask as i64,
        keep_bits,
        mask.is_some() as i64,
    ])
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
    if let Some(d) = dropout {
        key.tensor(d.seed).tensor(d.offset);
    }
    if let Some(m) = mask {
        key.tensor(m);
    }
    if when_built {
        run_when_built(stream, OP, key, &io, false, &build)
    } else {
        run_with_scalars(stream, OP, key, &io, &build).map(|()| true)
    }
}

/// Operands of [`sdpa_backward`]: the forward's inputs, output and softmax statistics, the
/// output's gradient, and where the input gradients go (the bias's only when asked for).
/// Shapes as in [`sdpa_forward`]; the gradients take their tensors' own strides.
#[derive(Clone, Copy, Debug)]
pub struct SdpaBackward<'a> {
    /// Queries `[B, H, Sq, D]`.
    pub q: &'a TensorRef<'a>,
    /// Keys `[B, H, Skv, D]`.
    pub k: &'a TensorRef<'a>,
    /// Values `[B, H, Skv, Dv]`.
    pub v: &'a TensorRef<'a>,
    /// The forward output `[B, H, Sq, Dv]`.
    pub o: &'a TensorRef<'a>,
    /// The output's gradient `[B, H, Sq, Dv]`.
    pub d_o: &'a TensorRef<'a>,
    /// The forward's log-sum-exp statistics, f32 `[B, H, Sq, 1]` packed.
    pub stats: &'a TensorRef<'a>,
    /// The forward's additive bias, if any.
    pub bias: Option<&'a TensorRef<'a>>,
    /// Gradient of `q` (like `q`).
    pub dq: &'a TensorMut<'a>,
    /// Gradient of `k` (like `k`).
    pub dk: &'a TensorMut<'a>,
    /// Gradient of `v` (like `v`).
    pub dv: &'a TensorMut<'a>,
    /// Gradient of the bias, if wanted (needs `bias`): the bias's dims, `q`'s dtype. It is
    /// `P ∘ (dO·Vᵀ − rowsum(dO ∘ O))` summed over the dims the bias broadcasts (size 1).
    pub d_bias: Option<&'a TensorMut<'a>>,
    /// The forward's dropout (the same probability, seed and offset), if it had one.
    pub dropout: Option<AttentionDropout<'a>>,
}

/// The transposed view of a virtual `[B, H, M, N]` product: dims `[B, H, N, M]`.
fn transposed_dims(dims: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let (b, h, m, n) = (dims[0], dims[1], dims[2], dims[3]);
    (vec![b, h, n, m], vec![h * m * n, m * n, 1, n])
}

/// The by-value scalars of the backward graph.
#[derive(Clone, Copy, Debug)]
struct BackwardScalars {
    scale: TensorId,
    /// The factor of `rowsum(dO ∘ O)`: 1, or the keep probability under dropout.
    one: TensorId,
    masked: Option<TensorId>,
    seq: Option<(TensorId, TensorId)>,
    /// `1 / keep` under dropout.
    dropout_scale: Option<TensorId>,
}

/// The backward graph of [`sdpa_backward`] and the device address of every tensor it binds
/// (`sum` and `acc` are the f32 scratch tensors); the by-value scalars are listed by
/// [`BackwardScalars`] so the caller can bind host values that outlive the execution.
///
/// Without `a.d_bias`, dQ goes through the f32 accumulator `acc_t` (given exactly when
/// `a.d_bias` is not). With it, cuDNN's dBias pattern (its "dP workspace" variant) takes dQ
/// straight from the `dS·K` product; dBias is the sum of `dS` before the scale.
fn backward_graph(
    a: &SdpaBackward<'_>,
    sum_t: &TensorRef,
    acc_t: Option<&TensorRef>,
    causal: bool,
    scale: f32,
) -> (Graph, Vec<(TensorId, u64)>, BackwardScalars) {
    debug_assert_eq!(
        acc_t.is_some(),
        a.d_bias.is_none(),
        "the accumulator is dQ's path without dBias"
    );
    let (b, h, sq) = (a.q.dims[0], a.q.dims[1], a.q.dims[2]);
    let skv = a.k.dims[2];
    let shifted_mask = causal && sq != skv;
    let (kt, vt) = (a.k.transposed(2, 3), a.v.transposed(2, 3));
    let mut g = Graph::new();
    let mut bound: Vec<(TensorId, u64)> = Vec::new();
    let mut input = |g: &mut Graph, t: &TensorRef, name: &str| {
        let id = t.add_input(g, name);
        bound.push((id, t.ptr));
        id
    };
    let qi = input(&mut g, a.q, "q");
    let kti = input(&mut g, &kt, "k_t");
    let vti = input(&mut g, &vt, "v_t");
    let oi = input(&mut g, a.o, "o");
    let doi = input(&mut g, a.d_o, "d_o");
    let si = input(&mut g, a.stats, "stats");
    let bi = a.bias.map(|t| input(&mut g, t, "bias"));
    let scale_i = g.scalar("scale", Scalar::F32(scale), 4);
    let one_i = g.scalar("one", Scalar::F32(1.0), 4);
    let mut scalars = BackwardScalars {
        scale: scale_i,
        one: one_i,
        masked: None,
        seq: None,
        dropout_scale: None,
    };
    let drop = a.dropout.map(|d| {
        let seed = input(&mut g, d.seed, "dropout_seed");
        let offset = input(&mut g, d.offset, "dropout_offset");
        let scale = g.scalar("dropout_scale", Scalar::F32(d.scale()), 4);
        scalars.dropout_scale = Some(scale);
        let m = g.rng_bernoulli(seed, offset, &[b, h, sq, skv], d.keep());
        (m, scale)
    });
    let mask = causal.then(|| {
        let fill = g.scalar("masked", Scalar::F32(f32::NEG_INFINITY), 4);
        scalars.masked = Some(fill);
        let shift = shifted_mask.then(|| {
            let kv = g.scalar("seq_kv", Scalar::I32(skv as i32), 4);
            let q = g.scalar("seq_q", Scalar::I32(sq as i32), 4);
            scalars.seq = Some((kv, q));
            (kv, q)
        });
        (fill, shift)
    });
    // softmax_sum = rowsum(dO ∘ O) · 1, or · keep under dropout (an f32 output the pattern
    // keeps in memory).
    let prod = g.pointwise(PointwiseMode::Mul, doi, Some(oi));
    let rows = g.reduction(ReduceOp::Sum, prod, &[b, h, sq, 1]);
    let softmax_sum = g.pointwise(PointwiseMode::Mul, rows, Some(one_i));
    sum_t.bind_output(&mut g, softmax_sum);
    bound.push((softmax_sum, sum_t.ptr));
    // P = exp(Q·Kᵀ·scale [+ bias] − stats) [masked].
    let scores = g.matmul(qi, kti);
    let mut s = g.pointwise(PointwiseMode::Mul, scores, Some(scale_i));
    if let Some(bi) = bi {
        s = g.pointwise(PointwiseMode::Add, s, Some(bi));
    }
    s = g.pointwise(PointwiseMode::Sub, s, Some(si));
    if let Some((fill, shift)) = mask {
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
    let p = g.pointwise(PointwiseMode::Exp, s, None);
    // dV = Pᵀ · dO, with the forward's dropout on P.
    let p_out = match drop {
        Some((m, d_scale)) => {
            let kept = g.pointwise(PointwiseMode::Mul, p, Some(m));
            g.pointwise(PointwiseMode::Mul, kept, Some(d_scale))
        }
        None => p,
    };
    let (pt_dims, pt_strides) = transposed_dims(&[b, h, sq, skv]);
    let pt = g.reshape(p_out, &pt_dims, &pt_strides);
    g.set_virtual_dtype(pt, a.q.dtype);
    let dv_out = g.matmul(pt, doi);
    a.dv.bind_output(&mut g, dv_out);
    bound.push((dv_out, a.dv.ptr));
    // dS = P ∘ (dO · Vᵀ − softmax_sum) · scale; under dropout
    // dS = P ∘ (dO · Vᵀ ∘ mask − keep · rowsum(dO ∘ O)) / keep · scale.
    let mut dp = g.matmul(doi, vti);
    if let Some((m, _)) = drop {
        dp = g.pointwise(PointwiseMode::Mul, dp, Some(m));
    }
    let centered = g.pointwise(PointwiseMode::Sub, dp, Some(softmax_sum));
    let mut ds_raw = g.pointwise(PointwiseMode::Mul, centered, Some(p));
    if let Some((_, d_scale)) = drop {
        ds_raw = g.pointwise(PointwiseMode::Mul, ds_raw, Some(d_scale));
    }
    // dBias = dS before the scale, summed over the bias's broadcast dims.
    if let Some(d_bias) = a.d_bias {
        let db_out = g.reduction(ReduceOp::Sum, ds_raw, &d_bias.dims);
        d_bias.bind_output(&mut g, db_out);
        bound.push((db_out, d_bias.ptr));
    }
    let ds = g.pointwise(PointwiseMode::Mul, ds_raw, Some(scale_i));
    // dK = dSᵀ · Q.
    let dst = g.reshape(ds, &pt_dims, &pt_strides);
    g.set_virtual_dtype(dst, a.q.dtype);
    let dk_out = g.matmul(dst, qi);
    a.dk.bind_output(&mut g, dk_out);
    bound.push((dk_out, a.dk.ptr));
    // dQ = dS · K, through the f32 accumulator unless dBias is computed.
    let k_view = g.reshape(kti, &a.k.dims, &a.k.strides);
    let dq_out = match acc_t {
        Some(acc_t) => {
            let acc = g.matmul(ds, k_view);
            acc_t.bind_output(&mut g, acc);
            bound.push((acc, acc_t.ptr));
            g.pointwise(PointwiseMode::Identity, acc, None)
        }
        None => g.matmul(ds, k_view),
    };
    a.dq.bind_output(&mut g, dq_out);
    bound.push((dq_out, a.dq.ptr));
    (g, bound, scalars)
}

/// The plan key of [`sdpa_backward`]'s graph.
fn backward_key(a: &SdpaBackward<'_>, causal: bool) -> OpKey {
    let (kt, vt) = (a.k.transposed(2, 3), a.v.transposed(2, 3));
    let shifted_mask = causal && a.q.dims[2] != a.k.dims[2];
    let mut key = OpKey::new("sdpa_backward");
    // 0: no bias, 1: a bias, 2: a bias and its gradient.
    let bias_code = a.bias.is_some() as i64 + a.d_bias.is_some() as i64;
    let keep_bits = a.dropout.map_or(0, |d| d.keep().to_bits() as i64);
    key.ints(&[bias_code, causal as i64 + shifted_mask as i64, keep_bits]);
    for t in [a.q, &kt, &vt, a.o, a.d_o, a.stats, a.dq, a.dk, a.dv] {
        key.tensor(t);
    }
    if let Some(d) = a.dropout {
        key.tensor(d.seed).tensor(d.offset);
    }
    if let Some(t) = a.bias {
        key.tensor(t);
    }
    if let Some(t) = a.d_bias {
        key.tensor(t);
    }
    key
}

/// Starts building, in the background, the plan [`sdpa_backward`] will need for the forward
/// just run (`q`, `k`, `v`, `o`, `stats`, `bias` as passed to [`sdpa_forward`]), so that on a
/// fresh machine its runtime compilation overlaps the rest of the forward pass. With
/// `bias_grad` (and a bias) it is the plan that also computes the bias's gradient, into a
/// fresh packed tensor of the bias's dims; `dropout` is the forward's. The gradients are assumed laid out like their
/// forward tensors and freshly allocated (16-byte aligned); if the backward's tensors differ,
/// it builds its own plan as it would have anyway.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_backward_prefetch(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    bias: Option<&TensorRef>,
    causal: bool,
    o: &TensorRef,
    scale: f32,
    stats: &TensorRef,
    bias_grad: bool,
    dropout: Option<&AttentionDropout<'_>>,
) -> Result<()> {
    if !matches!(q.dtype, DataType::F16 | DataType::BF16) || o.is_empty() || k.dims[2] == 0 {
        return Ok(());
    }
    // Any 16-byte-aligned address stands for the buffers the backward will allocate.
    const FRESH: u64 = 256;
    let fresh = |t: &TensorRef| TensorMut::placeholder(&t.dims, &t.strides, t.dtype, FRESH);
    let d_o = TensorRef::placeholder(&o.dims, &o.strides, o.dtype, FRESH);
    let (dq, dk, dv) = (fresh(q), fresh(k), fresh(v));
    let (b, h, sq, d) = (q.dims[0], q.dims[1], q.dims[2], q.dims[3]);
    let packed = |dims: &[i64]| TensorRef::placeholder(dims, &row_major_strides(dims), DataType::F32, FRESH);
    let (sum_t, acc_t) = (packed(&[b, h, sq, 1]), packed(&[b, h, sq, d]));
    let d_bias = bias
        .filter(|_| bias_grad)
        .map(|t| TensorMut::placeholder(&t.dims, &row_major_strides(&t.dims), q.dtype, FRESH));
    let a = SdpaBackward {
        q,
        k,
        v,
        o,
        d_o: &d_o,
        stats,
        bias,
        dq: &dq,
        dk: &dk,
        dv: &dv,
        d_bias: d_bias.as_ref(),
        dropout: dropout.copied(),
    };
    let acc_t = d_bias.is_none().then_some(&acc_t);
    super::prefetch(stream, "sdpa_backward", backward_key(&a, causal), &|| {
        backward_graph(&a, &sum_t, acc_t, causal, scale).0
    })
}

/// Checks [`SdpaBackward::d_bias`]: given only with the bias, with its dims and q's dtype.
fn check_d_bias(a: &SdpaBackward<'_>) -> Result<()> {
    const OP: &str = "sdpa_backward";
    let Some(db) = a.d_bias else {
        return Ok(());
    };
    db.check(OP, "d_bias")?;
    let Some(bias) = a.bias else {
        return Err(Error::invalid_arg(
            OP,
            "d_bias",
            "a bias gradient needs the forward's bias",
        ));
    };
    if db.dims != bias.dims || db.dtype != a.q.dtype {
        return Err(Error::invalid_arg(
            OP,
            "d_bias",
            format!(
                "{:?} {:?}: need the bias's dims {:?} and q's dtype {:?}",
                db.dims, db.dtype, bias.dims, a.q.dtype
            ),
        ));
    }
    Ok(())
}

/// Attention backward as ONE cuDNN graph, the fused flash-attention backward pattern:
/// recomputes the probabilities from `q`, `k` and the saved statistics, then
/// `dV = Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)) · scale`, `dK = dSᵀ·Q`, `dQ = dS·K`,
/// and with `d_bias` the bias's gradient `dS / scale` summed over its broadcast dims.
/// `scale`, `causal` and the bias must be the forward's. f16/bf16 only; cases cuDNN has no
/// engine for (some bias-gradient shapes among them) return a not-supported error
/// ([`Error::is_not_supported`]).
pub fn sdpa_backward(stream: &Arc<CudaStream>, a: &SdpaBackward<'_>, causal: bool, scale: f32) -> Result<()> {
    const OP: &str = "sdpa_backward";
    check(a.q, a.k, a.v, a.bias, a.o)?;
    for (name, t, like) in [
        ("d_o", a.d_o, a.o),
        ("dq", a.dq, a.q),
        ("dk", a.dk, a.k),
        ("dv", a.dv, a.v),
    ] {
        t.check(OP, name)?;
        if t.dims != like.dims || t.dtype != like.dtype {
            return Err(Error::invalid_arg(
                OP,
                name,
                format!("{:?} {:?}: need {:?} {:?}", t.dims, t.dtype, like.dims, like.dtype),
            ));
        }
    }
    let (b, h, sq, d) = (a.q.dims[0], a.q.dims[1], a.q.dims[2], a.q.dims[3]);
    let skv = a.k.dims[2];
    let st = a.stats;
    st.check(OP, "stats")?;
    if st.dims[..] != [b, h, sq, 1] || st.dtype != DataType::F32 || !st.is_packed() {
        return Err(Error::invalid_arg(
            OP,
            "stats",
            format!("{:?} {:?}: need packed f32 [{b}, {h}, {sq}, 1]", st.dims, st.dtype),
        ));
    }
    if causal && sq > skv {
        return Err(Error::invalid_arg(
            OP,
            "q",
            "a causal mask needs no more queries than keys",
        ));
    }
    check_d_bias(a)?;
    if let Some(d) = &a.dropout {
        d.check(OP)?;
        if causal && sq != skv {
            return Err(Error::Unsupported {
                graph: format!("{OP} q {:?} kv {skv}", a.q.dims),
                reason: "cuDNN takes dropout with a causal mask only when Sq == Skv".into(),
            });
        }
    }
    let operands = [
        ("q", Some(a.q)),
        ("k", Some(a.k)),
        ("v", Some(a.v)),
        ("o", Some(a.o)),
        ("d_o", Some(a.d_o)),
        ("stats", Some(st)),
        ("bias", a.bias),
        ("dq", Some(a.dq)),
        ("dk", Some(a.dk)),
        ("dv", Some(a.dv)),
        ("d_bias", a.d_bias.map(TensorMut::as_input)),
        ("dropout seed", a.dropout.map(|d| d.seed)),
        ("dropout offset", a.dropout.map(|d| d.offset)),
    ];
    check_on_stream_device(stream, OP, &operands)?;
    if a.q.is_empty() || a.k.is_empty() {
        return Err(Error::Unsupported {
            graph: format!("{OP} q {:?} k {:?}", a.q.dims, a.k.dims),
            reason: "empty attention has no fused backward".into(),
        });
    }
    if !matches!(a.q.dtype, DataType::F16 | DataType::BF16) {
        return Err(Error::Unsupported {
            graph: format!("{OP} {:?} {:?}", a.q.dims, a.q.dtype),
            reason: "cuDNN's fused attention engines take f16 or bf16 only".into(),
        });
    }
    // f32 scratch the pattern writes: the row sums of dO ∘ O and (without dBias) dQ's
    // accumulator. The accumulator starts 256-byte aligned (cuDNN reads it with vector loads).
    let with_acc = a.d_bias.is_none();
    let sum_bytes = ((b * h * sq) as usize * 4).next_multiple_of(256);
    let acc_bytes = if with_acc { (b * h * sq * d) as usize * 4 } else { 0 };
    let scratch = crate::ffi::memory::DeviceBuffer::alloc(stream, sum_bytes + acc_bytes, "attention backward scratch")?;
    if with_acc && crate::runtime::cudnn_version().unwrap_or(0) < 90600 {
        // Older cuDNN reads the accumulator before writing it.
        crate::ffi::launch::memset_zero(stream, scratch.address().offset_bytes(sum_bytes as u64), acc_bytes)?;
    }
    let packed = |offset: usize, dims: &[i64]| {
        scratch.view_mut((offset / 4) as i64, dims, &row_major_strides(dims), DataType::F32)
    };
    let sum_t = packed(0, &[b, h, sq, 1])?;
    let acc_t = with_acc.then(|| packed(sum_bytes, &[b, h, sq, d])).transpose()?;
    let one = a.dropout.map_or(1.0, |d| d.keep() as f32);
    let drop_scale = a.dropout.map_or(1.0, |d| d.scale());
    let (neg_inf, skv32, sq32) = (f32::NEG_INFINITY, skv as i32, sq as i32);
    let (g, bound, sc) = backward_graph(a, &sum_t, acc_t.as_deref(), causal, scale);
    let mut scalars = vec![
        (sc.scale, (&scale as *const f32) as u64),
        (sc.one, (&one as *const f32) as u64),
    ];
    if let Some(m) = sc.masked {
        scalars.push((m, (&neg_inf as *const f32) as u64));
    }
    if let Some((kv, q)) = sc.seq {
        scalars.push((kv, (&skv32 as *const i32) as u64));
        scalars.push((q, (&sq32 as *const i32) as u64));
    }
    if let Some(d) = sc.dropout_scale {
        scalars.push((d, (&drop_scale as *const f32) as u64));
    }
    let mut io: Vec<(i64, u64)> = bound
        .iter()
        .chain(&scalars)
        .map(|&(id, ptr)| (g.tensor_info(id).uid, ptr))
        .collect();
    io.sort_unstable_by_key(|&(uid, _)| uid);
    run_with_scalars(stream, OP, backward_key(a, causal), &io, &|| g.clone())?;
    // The scratch is freed stream-ordered, after the graph that uses it.
    drop((sum_t, acc_t));
    drop(scratch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, ptr)
    }

    #[test]
    fn forward_graphs_bind_every_memory_tensor_at_its_uid() {
        let bf = DataType::BF16;
        let host = ForwardScalars {
            scale: 0.25,
            masked: f32::NEG_INFINITY,
            seq: [7, 5],
            dropout_scale: 1.0 / 0.9,
        };
        let (seed, offset) = (
            t(&[1, 1, 1, 1], DataType::I64, 4096),
            t(&[1, 1, 1, 1], DataType::I64, 4104),
        );
        let drop = AttentionDropout {
            probability: 0.1,
            seed: &seed,
            offset: &offset,
        };
        for skv in [5, 7] {
            let q = t(&[2, 3, 5, 16], bf, 256);
            let kt = TensorRef::fake(&[2, 3, 16, skv], &[3 * skv * 16, skv * 16, 1, 16], bf, 512);
            let v = t(&[2, 3, skv, 8], bf, 768);
            let o = t(&[2, 3, 5, 8], bf, 1024);
            let stats = t(&[2, 3, 5, 1], DataType::F32, 1280);
            let bias = t(&[1, 3, 5, skv], bf, 1536);
            let mask = t(&[2, 3, 5, skv], DataType::F32, 1792);
            for bits in 0..32u32 {
                let [causal, with_bias, with_stats, with_drop, with_mask] = [0, 1, 2, 3, 4].map(|i| bits >> i & 1 == 1);
                // Dropout takes no bottom-right mask; a stored mask needs dropout.
                if (with_drop && causal && skv != 5) || (with_mask && !with_drop) {
                    continue;
                }
                let label = format!("skv {skv} causal {causal} bias {with_bias} stats {with_stats} dropout {with_drop} mask {with_mask}");
                let f = ForwardGraph {
                    q: &q,
                    kt: &kt,
                    v: &v,
                    bias: with_bias.then_some(&bias),
                    causal,
                    o: &o,
                    stats: with_stats.then_some(&stats),
                    dropout: with_drop.then_some(&drop),
                    mask: with_mask.then_some(&mask),
                };
                let mut g = f.graph(&host);
                g.validate().unwrap_or_else(|e| panic!("{label}: {e}"));
                let io = f.io(&host);
                let uids: Vec<i64> = io.iter().map(|e| e.0).collect();
                assert!(uids.windows(2).all(|w| w[0] < w[1]), "{label}: uid order {uids:?}");
                let memory: Vec<i64> = g.tensors().iter().filter(|t| !t.is_virtual).map(|t| t.uid).collect();
                assert_eq!(uids, memory, "{label}");
                // Device operands sit at their own uids (host scalars have host addresses).
                for tensor in g.tensors().iter().filter(|t| !t.is_virtual && t.by_value.is_none()) {
                    let ptr = io.iter().find(|e| e.0 == tensor.uid).map(|e| e.1);
                    let want = match tensor.name.as_str() {
                        "q" => 256,
                        "k_t" => 512,
                        "v" => 768,
                        "bias" => 1536,
                        "dropout_seed" => 4096,
                        "dropout_offset" => 4104,
                        _ if tensor.dims == [2, 3, 5, 8] => 1024,
                        _ if tensor.dims == [2, 3, 5, 1] => 1280,
                        _ => 1792,
                    };
                    assert_eq!(ptr, Some(want), "{label}: `{}`", tensor.name);
                }
            }
        }
    }

    #[test]
    fn backward_graphs_validate_and_bind_every_memory_tensor() {
        let bf = DataType::BF16;
        let (q, k, v) = (
            t(&[2, 3, 5, 16], bf, 256),
            t(&[2, 3, 7, 16], bf, 512),
            t(&[2, 3, 7, 8], bf, 768),
        );
        let (o, d_o) = (t(&[2, 3, 5, 8], bf, 1024), t(&[2, 3, 5, 8], bf, 1280));
        let stats = t(&[2, 3, 5, 1], DataType::F32, 1536);
        let (dq, dk, dv) = (
            t(&[2, 3, 5, 16], bf, 2048),
            t(&[2, 3, 7, 16], bf, 2304),
            t(&[2, 3, 7, 8], bf, 2560),
        );
        let sum = t(&[2, 3, 5, 1], DataType::F32, 2816);
        let acc = t(&[2, 3, 5, 16], DataType::F32, 3072);
        // No bias, then every broadcast of the bias, each without and with its gradient.
        let mut cases: Vec<(Option<[i64; 2]>, bool)> = vec![(None, false)];
        for bh in [[1, 1], [1, 3], [2, 1], [2, 3]] {
            cases.extend([(Some(bh), false), (Some(bh), true)]);
        }
        let (seed, offset) = (
            t(&[1, 1, 1, 1], DataType::I64, 4096),
            t(&[1, 1, 1, 1], DataType::I64, 4104),
        );
        let drop = AttentionDropout {
            probability: 0.25,
            seed: &seed,
            offset: &offset,
        };
        // Dropout takes no bottom-right causal mask (these scores are 5 × 7).
        for (causal, dropout) in [(false, None), (true, None), (false, Some(drop))] {
            for &(bias_bh, with_grad) in &cases {
                let label = format!(
                    "causal {causal} bias {bias_bh:?} d_bias {with_grad} dropout {}",
                    dropout.is_some()
                );
                let bias = bias_bh.map(|[bb, bh]| t(&[bb, bh, 5, 7], bf, 1792));
                let d_bias = bias_bh
                    .filter(|_| with_grad)
                    .map(|[bb, bh]| TensorMut::fake_packed(&[bb, bh, 5, 7], bf, 3328));
                let a = SdpaBackward {
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &o,
                    d_o: &d_o,
                    stats: &stats,
                    bias: bias.as_ref(),
                    dq: &TensorMut::fake_of(&dq),
                    dk: &TensorMut::fake_of(&dk),
                    dv: &TensorMut::fake_of(&dv),
                    d_bias: d_bias.as_ref(),
                    dropout,
                };
                check_d_bias(&a).unwrap_or_else(|e| panic!("{label}: {e}"));
                let acc_t = (!with_grad).then_some(&acc);
                let (mut g, bound, sc) = backward_graph(&a, &sum, acc_t, causal, 0.25);
                g.validate().unwrap_or_else(|e| panic!("{label}: {e}"));
                // Every non-virtual tensor is bound once: to memory or as a scalar.
                let mut ids: Vec<TensorId> = bound.iter().map(|b| b.0).collect();
                ids.extend([sc.scale, sc.one]);
                ids.extend(sc.masked);
                ids.extend(sc.seq.into_iter().flat_map(|(a, b)| [a, b]));
                ids.extend(sc.dropout_scale);
                let memory: Vec<usize> = g
                    .tensors()
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !t.is_virtual)
                    .map(|(i, _)| i)
                    .collect();
                let mut got: Vec<usize> = ids.iter().map(|id| g.tensor_info(*id).uid as usize - 1).collect();
                got.sort_unstable();
                assert_eq!(got, memory, "{label}");
                assert_eq!(g.tensor_info(bound.last().unwrap().0).dims, vec![2, 3, 5, 16]);
                // dBias replaces the accumulator: one memory tensor more or less, not both.
                let bound_ptrs: Vec<u64> = bound.iter().map(|b| b.1).collect();
                assert_eq!(bound_ptrs.contains(&3072), !with_grad, "{label}: accumulator");
                assert_eq!(bound_ptrs.contains(&3328), with_grad, "{label}: d_bias");
                // The key tells the three bias cases apart.
                let plain = SdpaBackward { d_bias: None, ..a };
                assert_eq!(
                    backward_key(&a, causal).bytes() == backward_key(&plain, causal).bytes(),
                    !with_grad,
                    "{label}: key"
                );
                let undropped = SdpaBackward { dropout: None, ..a };
                assert_eq!(
                    backward_key(&a, causal).bytes() == backward_key(&undropped, causal).bytes(),
                    dropout.is_none(),
                    "{label}: dropout key"
                );
            }
        }
    }

    #[test]
    fn bias_gradient_needs_the_bias_its_dims_and_q_dtype() {
        let (bf, h) = (DataType::BF16, DataType::F16);
        let q = t(&[2, 3, 5, 16], bf, 256);
        let k = t(&[2, 3, 7, 16], bf, 512);
        let o = t(&[2, 3, 5, 16], bf, 768);
        let stats = t(&[2, 3, 5, 1], DataType::F32, 1024);
        let bias = t(&[1, 3, 5, 7], bf, 1280);
        let grads = [TensorMut::fake_of(&q), TensorMut::fake_of(&k), TensorMut::fake_of(&k)];
        let check = |bias: Option<&TensorRef<'static>>, d_bias: Option<&TensorMut<'static>>| {
            check_d_bias(&SdpaBackward {
                q: &q,
                k: &k,
                v: &k,
                o: &o,
                d_o: &o,
                stats: &stats,
                bias,
                dq: &grads[0],
                dk: &grads[1],
                dv: &grads[2],
                d_bias,
                dropout: None,
            })
        };
        let good = TensorMut::fake_packed(&[1, 3, 5, 7], bf, 1536);
        let other_dims = TensorMut::fake_packed(&[2, 3, 5, 7], bf, 1536);
        let other_dtype = TensorMut::fake_packed(&[1, 3, 5, 7], h, 1536);
        assert!(check(Some(&bias), Some(&good)).is_ok());
        assert!(check(None, None).is_ok());
        assert!(check(Some(&bias), None).is_ok());
        let bad = [
            (None, &good, "without the bias"),
            (Some(&bias), &other_dims, "other dims"),
            (Some(&bias), &other_dtype, "other dtype"),
        ];
        for (b, db, what) in bad {
            let e = check(b, Some(db)).expect_err(what);
            assert!(!e.is_not_supported(), "{what}: {e}");
            assert!(e.to_string().contains("d_bias"), "{what}: {e}");
        }
    }
}
