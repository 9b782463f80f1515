//! Direct convolution kernels: forward, backward data and backward filter of cuDNN's
//! cross-correlation (what [`crate::ops::conv_forward`] computes), for the convolutions no
//! cuDNN engine runs (with `CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY` cuDNN 9 offers none for grouped
//! convolutions, f32 backwards and some f16 problems, and only TF32 engines for the f32
//! forward). Exact rather than fast: every output element is one f32 (f64 for F64) sum
//! rounded once.
//!
//! Operands, in NC-first logical order with any strides (NCHW, NHWC / channels-last,
//! transposed or gapped views; nothing is copied), 1 to 3 spatial dims (rank 3 to 5):
//! - `x` / `dx`: `[N, C, I...]`;
//! - `w` / `dw`: `[K, C / groups, R...]`;
//! - `y` / `dy`: `[N, K, O...]` with `O = (I + pre + post - dilation * (R - 1) - 1) / stride + 1`
//!   per spatial dim ([`crate::types::conv_output_size`]).
//!
//! The geometry is a [`ConvGeometry`] with one entry per spatial dim in every field;
//! `groups` must divide C and K. Dtypes are F32, F16, BF16 (accumulated in f32) and F64
//! (accumulated in f64), the same for all three operands.
//!
//! Every function takes the stream first, validates all its arguments (errors name the op
//! and the argument), and only enqueues work (it never synchronizes). The written operand
//! must not overlap itself (no 0 or too small stride on a dim > 1), nor share memory with an
//! input (their address ranges, lowest to highest element, must be disjoint). An empty
//! output returns `Ok(())` at once after validation; an empty sum (C / groups = 0, K = 0, or
//! N = 0 for the filter gradient) writes zeros.
//!
//! All three are deterministic, without atomics: the forward and the data gradient run one
//! thread per output element (the data gradient gathers over the output positions whose
//! window covers its element); the filter gradient runs one block per `dw` element and adds
//! the per-thread partial sums over N and the output positions in a fixed tree, so two runs
//! on the same shapes give the same bits.
//!
//! Host work is split in two: a pure `plan_*` function (validation, the kernel's
//! `ConvShape`, the entry) that needs no device, and
//! the launch (`kernels/conv.cu`: `conv_fwd_<dt>`, `conv_bwd_data_<dt>`,
//! `conv_bwd_filter_<dt>` for `<dt>` in f32, f16, bf16, f64).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch_conv::{self as launch, ConvShape, CONV_RED_THREADS};
use crate::kernels::check::{
    check_aligned, check_disjoint, check_no_overlap, check_tensor, float_slot, on_stream, same_dtype,
};
use crate::kernels::{stream_function, CONV};
use crate::types::{conv_output_size, stride_order, ConvGeometry, TensorMut, TensorRef};

/// Entries by dtype slot (F32, F16, BF16, F64).
const FWD: [&str; 4] = ["conv_fwd_f32", "conv_fwd_f16", "conv_fwd_bf16", "conv_fwd_f64"];
const BWD_DATA: [&str; 4] = [
    "conv_bwd_data_f32",
    "conv_bwd_data_f16",
    "conv_bwd_data_bf16",
    "conv_bwd_data_f64",
];
const BWD_FILTER: [&str; 4] = [
    "conv_bwd_filter_f32",
    "conv_bwd_filter_f16",
    "conv_bwd_filter_bf16",
    "conv_bwd_filter_f64",
];

/// Which of the three passes, and so which operand is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// x, w read; y written.
    Forward,
    /// dy, w read; dx written.
    BackwardData,
    /// x, dy read; dw written.
    BackwardFilter,
}

impl Pass {
    fn op(self) -> &'static str {
        match self {
            Pass::Forward => "conv_forward",
            Pass::BackwardData => "conv_backward_data",
            Pass::BackwardFilter => "conv_backward_filter",
        }
    }

    /// Argument names of the x, w and y slots.
    fn names(self) -> [&'static str; 3] {
        match self {
            Pass::Forward => ["x", "w", "y"],
            Pass::BackwardData => ["dx", "w", "dy"],
            Pass::BackwardFilter => ["x", "dw", "dy"],
        }
    }

    /// Index (in x, w, y order) of the written operand.
    fn written(self) -> usize {
        match self {
            Pass::Forward => 2,
            Pass::BackwardData => 0,
            Pass::BackwardFilter => 1,
        }
    }

    /// Index (in x, w, y order) of the first input, whose dtype the others must have.
    fn first_input(self) -> usize {
        match self {
            Pass::Forward | Pass::BackwardFilter => 0,
            Pass::BackwardData => 2,
        }
    }

    fn entries(self) -> &'static [&'static str; 4] {
        match self {
            Pass::Forward => &FWD,
            Pass::BackwardData => &BWD_DATA,
            Pass::BackwardFilter => &BWD_FILTER,
        }
    }
}

/// One planned launch: `entry` over the `n` elements of the written operand (threads, or
/// blocks of `threads` for the filter gradient).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConvPlan {
    pub entry: &'static str,
    pub shape: ConvShape,
    pub n: i64,
    /// Block size of the filter gradient's reduction (a power of two, 32 ..= 256); the
    /// per-element kernels ignore it.
    pub threads: u32,
}

/// `v` (one entry per spatial dim) placed at the end of 3 slots, the leading ones `fill`.
fn pad3(v: &[i64], fill: i64) -> [i64; 3] {
    let mut a = [fill; 3];
    a[3 - v.len()..].copy_from_slice(v);
    a
}

/// The two leading strides of `t`, then its spatial strides padded to 3 (0 for the
/// size-1 dims added in front).
fn strides5(t: &TensorRef) -> [i64; 5] {
    let sp = pad3(&t.strides[2..], 0);
    [t.strides[0], t.strides[1], sp[0], sp[1], sp[2]]
}

/// Divisors of the walk over `dims` (5 logical dims) in the memory order of `strides`
/// (largest stride slowest; ties in logical order): logical dim `d` of item `i` is
/// `(i / div[d]) % dims[d]`.
fn walk_divisors(dims: &[i64; 5], strides: &[i64; 5]) -> [i64; 5] {
    let abs = strides.map(|s| s.saturating_abs());
    let mut div = [1i64; 5];
    let mut acc = 1i64;
    for &d in stride_order(&abs).iter().rev() {
        div[d] = acc;
        acc = acc.saturating_mul(dims[d].max(1));
    }
    div
}

/// Validates one pass's operands (`t` in x, w, y order) against each other and `g`, and
/// plans its launch; `None` when the written operand is empty.
fn plan(pass: Pass, t: [&TensorRef; 3], g: &ConvGeometry) -> Result<Option<ConvPlan>> {
    let op = pass.op();
    let names = pass.names();
    let [x, w, y] = t;
    let first = pass.first_input();
    let rank = t[first].dims.len();
    if !(3..=5).contains(&rank) {
        let msg = format!(
            "rank {rank} ({:?}) is not 3, 4 or 5 ([N, C] and 1 to 3 spatial dims)",
            t[first].dims
        );
        return Err(Error::invalid_arg(op, names[first], msg));
    }
    for (i, u) in t.iter().enumerate() {
        if u.dims.len() != rank {
            let msg = format!(
                "rank {} ({:?}) differs from {}'s {rank}",
                u.dims.len(),
                u.dims,
                names[first]
            );
            return Err(Error::invalid_arg(op, names[i], msg));
        }
    }
    let mut numel = [0i64; 3];
    for (i, u) in t.iter().enumerate() {
        numel[i] = check_tensor(op, names[i], u)?;
        check_aligned(op, names[i], u)?;
    }
    let dtype = t[first].dtype;
    let slot = float_slot(op, names[first], dtype)?;
    for (i, u) in t.iter().enumerate() {
        if i != first {
            same_dtype(op, names[i], u, dtype, names[first])?;
        }
    }
    let s = rank - 2;
    if g.stride.len() != s {
        let msg = format!(
            "stride {:?} needs one entry per spatial dim ({s} for rank {rank})",
            g.stride
        );
        return Err(Error::invalid_arg(op, "params", msg));
    }
    g.check(op, x.dims[1], w.dims[1])?;
    let (n, c, k) = (x.dims[0], x.dims[1], w.dims[0]);
    if k % g.groups != 0 {
        let msg = format!("{} groups do not divide the {k} output channels", g.groups);
        return Err(Error::invalid_arg(op, "groups", msg));
    }
    let mut want = vec![n, k];
    for d in 0..s {
        let o = conv_output_size(
            x.dims[2 + d],
            w.dims[2 + d],
            g.pre_padding[d],
            g.post_padding[d],
            g.stride[d],
            g.dilation[d],
        )
        .ok_or_else(|| {
            let msg = format!(
                "spatial dim {d}: the filter {:?} (dilation {:?}) is empty or does not fit {}'s {:?} padded by {:?} / {:?}",
                &w.dims[2..],
                g.dilation,
                names[0],
                &x.dims[2..],
                g.pre_padding,
                g.post_padding
            );
            Error::invalid_arg(op, names[1], msg)
        })?;
        want.push(o);
    }
    if y.dims[..] != want[..] {
        let msg = format!(
            "dims {:?} differ from {want:?} ({}'s N, {}'s K and the output size of the geometry)",
            y.dims, names[0], names[1]
        );
        return Err(Error::invalid_arg(op, names[2], msg));
    }
    let wi = pass.written();
    let out = t[wi];
    check_no_overlap(op, names[wi], out)?;
    for (i, u) in t.iter().enumerate() {
        if i != wi {
            check_disjoint(op, names[wi], out, names[i], u)?;
        }
    }
    if numel[wi] == 0 {
        return Ok(None);
    }
    let dims5 = |u: &TensorRef| {
        let sp = pad3(&u.dims[2..], 1);
        [u.dims[0], u.dims[1], sp[0], sp[1], sp[2]]
    };
    let mut shape = ConvShape {
        n,
        c,
        k,
        cg: w.dims[1],
        kg: k / g.groups,
        input: pad3(&x.dims[2..], 1),
        ker: pad3(&w.dims[2..], 1),
        out: pad3(&y.dims[2..], 1),
        pre: pad3(&g.pre_padding, 0),
        stride: pad3(&g.stride, 1),
        dil: pad3(&g.dilation, 1),
        xs: strides5(x),
        ws: strides5(w),
        ys: strides5(y),
        div: [1; 5],
        index32: (numel[wi] < 1 << 31) as i32,
        pad: 0,
    };
    shape.div = walk_divisors(&dims5(out), &strides5(out));
    // The filter gradient's reduction runs over N and the output positions of each tap: a
    // block no larger than the longest of those sums (at least a warp).
    let longest = n.saturating_mul(shape.out.iter().product::<i64>());
    let threads = (longest.clamp(32, CONV_RED_THREADS as i64) as u64).next_power_of_two() as u32;
    Ok(Some(ConvPlan {
        entry: pass.entries()[slot],
        shape,
        n: numel[wi],
        threads,
    }))
}

/// [`conv_forward`]'s validation and plan (pure host logic).
pub(crate) fn plan_forward(x: &TensorRef, w: &TensorRef, y: &TensorRef, g: &ConvGeometry) -> Result<Option<ConvPlan>> {
    plan(Pass::Forward, [x, w, y], g)
}

/// [`conv_backward_data`]'s validation and plan (pure host logic).
pub(crate) fn plan_backward_data(
    dy: &TensorRef,
    w: &TensorRef,
    dx: &TensorRef,
    g: &ConvGeometry,
) -> Result<Option<ConvPlan>> {
    plan(Pass::BackwardData, [dx, w, dy], g)
}

/// [`conv_backward_filter`]'s validation and plan (pure host logic).
pub(crate) fn plan_backward_filter(
    x: &TensorRef,
    dy: &TensorRef,
    dw: &TensorRef,
    g: &ConvGeometry,
) -> Result<Option<ConvPlan>> {
    plan(Pass::BackwardFilter, [x, dw, dy], g)
}

// ---------------------------------------------------------------------------------------
// Public API

/// Convolution forward (cross-correlation): `y[n, k, o] = Σ x[n, c, o * stride - pre + r *
/// dilation] * w[k, c - g * C/groups, r]` over the input channels `c` of `k`'s group `g`
/// and the filter taps `r` that land inside `x` (padding adds nothing). `x` is
/// `[N, C, I...]`, `w` `[K, C / groups, R...]`, `y` `[N, K, O...]` (1 to 3 spatial dims,
/// any strides, one dtype among F32, F16, BF16, F64; see the module docs for the output
/// size). One thread per `y` element; deterministic.
pub fn conv_forward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    w: &TensorRef,
    y: &TensorMut,
    g: &ConvGeometry,
) -> Result<()> {
    on_stream(stream, "conv_forward", &[("x", x), ("w", w), ("y", y)])?;
    let Some(plan) = plan_forward(x, w, y, g)? else {
        return Ok(());
    };
    let f = stream_function(stream, CONV, plan.entry)?;
    launch::per_element(stream, &f, x.address(), w.address(), y.address(), &plan.shape, plan.n)
}

/// Gradient of [`conv_forward`] with respect to its input: writes every element of `dx`
/// `[N, C, I...]` with the sum of `dy[n, k, o] * w[k, c - g * C/groups, r]` over the output
/// channels `k` of `c`'s group and the (tap, output position) pairs that read it
/// (`o * stride - pre + r * dilation = i`). `dy` is `[N, K, O...]` with `O` the forward's
/// output size for `dx`'s spatial dims and `w`'s. One thread per `dx` element;
/// deterministic.
pub fn conv_backward_data(
    stream: &Arc<CudaStream>,
    dy: &TensorRef,
    w: &TensorRef,
    dx: &TensorMut,
    g: &ConvGeometry,
) -> Result<()> {
    on_stream(stream, "conv_backward_data", &[("dy", dy), ("w", w), ("dx", dx)])?;
    let Some(plan) = plan_backward_data(dy, w, dx, g)? else {
        return Ok(());
    };
    let f = stream_function(stream, CONV, plan.entry)?;
    launch::per_element(stream, &f, dy.address(), w.address(), dx.address(), &plan.shape, plan.n)
}

/// Gradient of [`conv_forward`] with respect to its filter: writes every element of `dw`
/// `[K, C / groups, R...]` with the sum of `x[n, c, o * stride - pre + r * dilation] *
/// dy[n, k, o]` over the batch and the output positions whose tap `r` lands inside `x`
/// (`c` the input channel of `k`'s group). One block per `dw` element adds its per-thread
/// partial sums in a fixed tree: two runs on the same shapes give the same bits.
pub fn conv_backward_filter(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    dy: &TensorRef,
    dw: &TensorMut,
    g: &ConvGeometry,
) -> Result<()> {
    on_stream(stream, "conv_backward_filter", &[("x", x), ("dy", dy), ("dw", dw)])?;
    let Some(plan) = plan_backward_filter(x, dy, dw, g)? else {
        return Ok(());
    };
    let f = stream_function(stream, CONV, plan.entry)?;
    launch::backward_filter(
        stream,
        &f,
        x.address(),
        dy.address(),
        dw.address(),
        &plan.shape,
        plan.n,
        plan.threads,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::DataType::{self, *};
    use crate::types::{channels_last_strides, row_major_strides};
    use cudnn_backend_reference as reference;

    const X: u64 = 0x1000_0000;
    const W: u64 = 0x2000_0000;
    const Y: u64 = 0x3000_0000;

    fn t(dims: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, ptr)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, ptr)
    }

    use crate::kernels::invalid_argument as invalid;

    fn geo(pre: &[i64], post: &[i64], stride: &[i64], dil: &[i64], groups: i64) -> ConvGeometry {
        ConvGeometry::new(pre, stride, dil, groups).with_post_padding(post)
    }

    /// A valid 2-D problem: x [2, 6, 9, 8], w [4, 3, 3, 2] (2 groups), stride [2, 1],
    /// dilation [1, 2], padding [1, 0] before and [0, 2] after: y [2, 4, 4, 8].
    fn problem(dtype: DataType) -> (TensorRef<'static>, TensorRef<'static>, TensorRef<'static>, ConvGeometry) {
        let g = geo(&[1, 0], &[0, 2], &[2, 1], &[1, 2], 2);
        (
            t(&[2, 6, 9, 8], dtype, X),
            t(&[4, 3, 3, 2], dtype, W),
            t(&[2, 4, 4, 8], dtype, Y),
            g,
        )
    }

    #[test]
    fn output_dims_follow_the_formula() {
        // (in, k, pre, post, stride, dil) -> out = (in + pre + post - dil (k - 1) - 1) / stride + 1
        for (i, k, pre, post, s, d, want) in [
            (9, 3, 1, 0, 2, 1, 4),
            (8, 2, 0, 2, 1, 2, 8),
            (5, 5, 0, 0, 1, 1, 1),
            (5, 3, 2, 2, 3, 2, 2),
            (1, 3, 1, 1, 1, 1, 1),
            (7, 1, 0, 0, 7, 1, 1),
            (0, 2, 1, 1, 1, 1, 1),
            (10, 4, 3, 0, 2, 3, 2),
        ] {
            let g = geo(&[pre], &[post], &[s], &[d], 1);
            let (x, w) = (t(&[1, 2, i], F32, X), t(&[3, 2, k], F32, W));
            let ok = plan_forward(&x, &w, &t(&[1, 3, want], F32, Y), &g);
            assert!(ok.is_ok(), "in {i} k {k} pre {pre} post {post} s {s} d {d}: {ok:?}");
            let (op, arg, why) = invalid(plan_forward(&x, &w, &t(&[1, 3, want + 1], F32, Y), &g));
            assert_eq!((op, arg), ("conv_forward", "y"));
            assert!(why.contains(&format!("[1, 3, {want}]")), "{why}");
        }
        // 3-D, asymmetric everything.
        let g = geo(&[0, 1, 2], &[1, 0, 0], &[1, 2, 3], &[2, 1, 1], 1);
        let p = plan_forward(
            &t(&[1, 1, 5, 6, 7], F64, X),
            &t(&[2, 1, 2, 3, 2], F64, W),
            &t(&[1, 2, 4, 3, 3], F64, Y),
            &g,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.shape.out, [4, 3, 3]);
        // A filter that does not fit the padded input is the filter's error.
        let g = geo(&[0], &[0], &[1], &[3], 1);
        let (op, arg, why) = invalid(plan_forward(
            &t(&[1, 1, 6], F32, X),
            &t(&[1, 1, 3], F32, W),
            &t(&[1, 1, 1], F32, Y),
            &g,
        ));
        assert_eq!((op, arg), ("conv_forward", "w"));
        assert!(why.contains("does not fit"), "{why}");
        assert_eq!(
            invalid(plan_backward_filter(
                &t(&[1, 1, 6], F32, X),
                &t(&[1, 1, 1], F32, Y),
                &t(&[1, 1, 3], F32, W),
                &g
            ))
            .1,
            "dw"
        );
    }

    #[test]
    fn entry_names_by_dtype() {
        for (d, s) in [(F32, "f32"), (F16, "f16"), (BF16, "bf16"), (F64, "f64")] {
            let (x, w, y, g) = problem(d);
            let f = plan_forward(&x, &w, &y, &g).unwrap().unwrap();
            assert_eq!((f.entry, f.n), (&*format!("conv_fwd_{s}"), 2 * 4 * 4 * 8));
            let b = plan_backward_data(&y, &w, &x, &g).unwrap().unwrap();
            assert_eq!((b.entry, b.n), (&*format!("conv_bwd_data_{s}"), 2 * 6 * 9 * 8));
            let fl = plan_backward_filter(&x, &y, &w, &g).unwrap().unwrap();
            assert_eq!((fl.entry, fl.n), (&*format!("conv_bwd_filter_{s}"), 4 * 3 * 3 * 2));
            // N * O0 * O1 = 64 items per tap at most: a 64-thread block.
            assert_eq!(fl.threads, 64);
        }
        for d in [I32, I64, U8, Bool, I8] {
            let (x, w, y, g) = problem(F32);
            let x = x.fake_at(X);
            let xd = ts(&x.dims, &x.strides, d, X);
            let (op, arg, why) = invalid(plan_forward(&xd, &w, &y, &g));
            assert_eq!((op, arg), ("conv_forward", "x"));
            assert!(why.contains(&format!("{d:?}")), "{why}");
            let yd = ts(&y.dims, &y.strides, d, Y);
            assert_eq!(
                invalid(plan_backward_data(&yd, &w, &x, &g)),
                (
                    "conv_backward_data",
                    "dy",
                    format!("dtype {d:?} is not supported (F32, F16, BF16 or F64)")
                )
            );
        }
    }

    #[test]
    fn reduction_block_sizes() {
        let g = geo(&[0], &[0], &[1], &[1], 1);
        for (n, l, want) in [
            (1, 1, 32),
            (1, 32, 32),
            (1, 33, 64),
            (3, 40, 128),
            (4, 64, 256),
            (100, 1000, 256),
        ] {
            let p = plan_backward_filter(
                &t(&[n, 1, l], F32, X),
                &t(&[n, 1, l], F32, Y),
                &t(&[1, 1, 1], F32, W),
                &g,
            )
            .unwrap()
            .unwrap();
            assert_eq!(p.threads, want, "N {n} L {l}");
        }
    }

    #[test]
    fn argument_errors_name_op_and_argument() {
        let (x, w, y, g) = problem(F32);
        let fwd = |x: &TensorRef, w: &TensorRef, y: &TensorRef, g: &ConvGeometry| invalid(plan_forward(x, w, y, g));
        // ranks
        let (op, arg, why) = fwd(&t(&[2, 6], F32, X), &w, &y, &g);
        assert_eq!((op, arg), ("conv_forward", "x"));
        assert!(why.contains("rank 2"), "{why}");
        assert_eq!(fwd(&t(&[1, 1, 1, 1, 1, 1], F32, X), &w, &y, &g).1, "x");
        assert_eq!(fwd(&x, &t(&[4, 3, 3], F32, W), &y, &g).1, "w");
        assert_eq!(fwd(&x, &w, &t(&[2, 4, 4, 8, 1], F32, Y), &g).1, "y");
        let (op, arg, _) = invalid(plan_backward_data(&y, &w, &t(&[2, 6, 9], F32, X), &g));
        assert_eq!((op, arg), ("conv_backward_data", "dx"));
        // dtypes
        let (_, arg, why) = fwd(&x, &t(&[4, 3, 3, 2], F16, W), &y, &g);
        assert_eq!(arg, "w");
        assert!(why.contains("x's F32"), "{why}");
        assert_eq!(fwd(&x, &w, &t(&[2, 4, 4, 8], F64, Y), &g).1, "y");
        assert_eq!(
            invalid(plan_backward_filter(&x, &y, &t(&[4, 3, 3, 2], BF16, W), &g)).1,
            "dw"
        );
        // geometry: entries per spatial dim, values
        let (_, arg, why) = fwd(&x, &w, &y, &geo(&[1], &[0], &[2], &[1], 2));
        assert_eq!(arg, "params");
        assert!(why.contains("one entry per spatial dim"), "{why}");
        assert_eq!(fwd(&x, &w, &y, &geo(&[1], &[0, 2], &[2, 1], &[1, 2], 2)).1, "params");
        assert_eq!(fwd(&x, &w, &y, &geo(&[1, 0], &[0, 2], &[2, 1], &[1], 2)).1, "params");
        assert_eq!(fwd(&x, &w, &y, &geo(&[1, 0], &[0, 2], &[0, 1], &[1, 2], 2)).1, "params");
        assert_eq!(fwd(&x, &w, &y, &geo(&[1, 0], &[0, 2], &[2, 1], &[1, 0], 2)).1, "params");
        assert_eq!(
            fwd(&x, &w, &y, &geo(&[-1, 0], &[0, 2], &[2, 1], &[1, 2], 2)).1,
            "params"
        );
        // groups: positive, dividing C (with w's C/groups) and K
        for groups in [0, -2, 1, 3] {
            let (op, arg, _) = fwd(&x, &w, &y, &geo(&[1, 0], &[0, 2], &[2, 1], &[1, 2], groups));
            assert_eq!((op, arg), ("conv_forward", "groups"), "groups {groups}");
        }
        let (_, arg, why) = fwd(&x, &t(&[3, 3, 3, 2], F32, W), &t(&[2, 3, 4, 8], F32, Y), &g);
        assert_eq!(arg, "groups");
        assert!(why.contains("3 output channels"), "{why}");
        // dims against each other
        assert_eq!(fwd(&x, &w, &t(&[1, 4, 4, 8], F32, Y), &g).1, "y");
        assert_eq!(fwd(&x, &w, &t(&[2, 5, 4, 8], F32, Y), &g).1, "y");
        assert_eq!(
            invalid(plan_backward_data(&t(&[2, 4, 5, 8], F32, Y), &w, &x, &g)).1,
            "dy"
        );
        assert_eq!(
            invalid(plan_backward_filter(&x, &t(&[2, 4, 4, 7], F32, Y), &w, &g)).1,
            "dy"
        );
        // view consistency: strides, negative dims, null or misaligned pointers
        assert_eq!(fwd(&ts(&[2, 6, 9, 8], &[1, 1, 1], F32, X), &w, &y, &g).1, "x");
        assert_eq!(fwd(&x, &ts(&[4, -3, 3, 2], &[1, 1, 1, 1], F32, W), &y, &g).1, "w");
        assert_eq!(fwd(&x, &w, &t(&[2, 4, 4, 8], F32, 0), &g).1, "y");
        let (_, arg, why) = fwd(&x, &t(&[4, 3, 3, 2], F32, W + 2), &y, &g);
        assert_eq!(arg, "w");
        assert!(why.contains("aligned"), "{why}");
    }

    #[test]
    fn written_operands_must_not_overlap_or_alias() {
        let (x, w, y, g) = problem(F32);
        let (_, arg, why) = invalid(plan_forward(&x, &w, &ts(&[2, 4, 4, 8], &[0, 32, 8, 1], F32, Y), &g));
        assert_eq!(arg, "y");
        assert!(why.contains("overlap"), "{why}");
        assert_eq!(
            invalid(plan_backward_filter(
                &x,
                &y,
                &ts(&[4, 3, 3, 2], &[6, 6, 2, 1], F32, W),
                &g
            ))
            .1,
            "dw"
        );
        // Outputs whose memory meets an input's.
        let (op, arg, why) = invalid(plan_forward(&x, &w, &y.fake_at(X + 4 * 100), &g));
        assert_eq!((op, arg), ("conv_forward", "y"));
        assert!(why.contains("x's"), "{why}");
        let (_, arg, why) = invalid(plan_backward_data(&y, &w, &x.fake_at(W - 4), &g));
        assert_eq!(arg, "dx");
        assert!(why.contains("w's"), "{why}");
        let (_, arg, why) = invalid(plan_backward_filter(&x, &y, &w.fake_at(Y + 4 * 255), &g));
        assert_eq!(arg, "dw");
        assert!(why.contains("dy's"), "{why}");
        // Adjacent memory is fine; broadcast (0-stride) inputs too.
        let y_after_x = y.fake_at(X + 4 * 2 * 6 * 9 * 8);
        assert!(plan_forward(&x, &w, &y_after_x, &g).unwrap().is_some());
        let xb = ts(&[2, 6, 9, 8], &[0, 0, 8, 1], F32, X);
        assert!(plan_forward(&xb, &w, &y, &g).unwrap().is_some());
        // A reversed (negative-stride) output reaching below its pointer into x.
        let rev = ts(&[2, 4, 4, 8], &[128, 32, 8, -1], F32, X + 4 * (2 * 6 * 9 * 8 + 3));
        assert_eq!(invalid(plan_forward(&x, &w, &rev, &g)).1, "y");
    }

    #[test]
    fn empty_outputs_plan_nothing_and_empty_sums_still_run() {
        let g = geo(&[1, 0], &[0, 2], &[2, 1], &[1, 2], 2);
        // N = 0: forward and data gradient have nothing to write; the filter gradient is zeros.
        let (x0, w, y0) = (
            t(&[0, 6, 9, 8], F32, X),
            t(&[4, 3, 3, 2], F32, W),
            t(&[0, 4, 4, 8], F32, Y),
        );
        assert!(plan_forward(&x0, &w, &y0, &g).unwrap().is_none());
        assert!(plan_backward_data(&y0, &w, &x0, &g).unwrap().is_none());
        let p = plan_backward_filter(&x0, &y0, &w, &g).unwrap().unwrap();
        assert_eq!((p.n, p.shape.n, p.threads), (72, 0, 32));
        // C / groups = 0: a zero forward; K = 0: a zero data gradient.
        let p = plan_forward(
            &t(&[2, 0, 9, 8], F32, X),
            &t(&[4, 0, 3, 2], F32, W),
            &t(&[2, 4, 4, 8], F32, Y),
            &g,
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.n, p.shape.cg, p.shape.kg), (256, 0, 2));
        let p = plan_backward_data(
            &t(&[2, 0, 4, 8], F32, Y),
            &t(&[0, 3, 3, 2], F32, W),
            &t(&[2, 6, 9, 8], F32, X),
            &g,
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.n, p.shape.kg), (864, 0));
        // An empty spatial input with padding still has outputs (all padding: zeros).
        let g1 = geo(&[1], &[1], &[1], &[1], 1);
        let p = plan_forward(
            &t(&[1, 1, 0], F32, X),
            &t(&[1, 1, 2], F32, W),
            &t(&[1, 1, 1], F32, Y),
            &g1,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.n, 1);
        // Still validated when empty.
        invalid(plan_forward(&x0, &w, &t(&[0, 4, 4, 7], F32, Y), &g));
        invalid(plan_forward(&x0, &t(&[4, 3, 3, 2], F16, W), &y0, &g));
    }

    #[test]
    fn shapes_pad_to_three_spatial_dims_and_walk_memory_order() {
        // 1-D, packed: spatial padded in front, strides 0 on the added dims.
        let g = geo(&[2], &[1], &[3], &[2], 1);
        let p = plan_forward(
            &t(&[2, 3, 10], F64, X),
            &t(&[5, 3, 3], F64, W),
            &t(&[2, 5, 3], F64, Y),
            &g,
        )
        .unwrap()
        .unwrap();
        let s = p.shape;
        assert_eq!((s.n, s.c, s.k, s.cg, s.kg), (2, 3, 5, 3, 5));
        assert_eq!((s.input, s.ker, s.out), ([1, 1, 10], [1, 1, 3], [1, 1, 3]));
        assert_eq!((s.pre, s.stride, s.dil), ([0, 0, 2], [1, 1, 3], [1, 1, 2]));
        assert_eq!(
            (s.xs, s.ws, s.ys),
            ([30, 10, 0, 0, 1], [9, 3, 0, 0, 1], [15, 3, 0, 0, 1])
        );
        // Size-1 dims (stride 0) walk innermost: their coordinate is always 0.
        assert_eq!((s.div, s.index32), ([15, 3, 1, 1, 1], 1));
        // 2-D channels-last y: channels vary fastest in the walk.
        let (x, w, _, g) = problem(BF16);
        let yd = [2, 4, 4, 8];
        let y = ts(&yd, &channels_last_strides(&yd), BF16, Y);
        let s = plan_forward(&x, &w, &y, &g).unwrap().unwrap().shape;
        assert_eq!(s.ys, [128, 1, 0, 32, 4]);
        assert_eq!(s.div, [128, 1, 1, 32, 4]);
        // The backwards: slot x is dx, slot w is dw, slot y is dy; the walk follows the
        // written operand.
        let dx = ts(&[2, 6, 9, 8], &channels_last_strides(&[2, 6, 9, 8]), BF16, X);
        let s = plan_backward_data(&t(&yd, BF16, Y), &w, &dx, &g)
            .unwrap()
            .unwrap()
            .shape;
        assert_eq!((s.xs, s.ys), ([432, 1, 0, 48, 6], [128, 32, 0, 8, 1]));
        assert_eq!(s.div, [432, 1, 1, 48, 6]);
        let dw = ts(&[4, 3, 3, 2], &[1, 4, 24, 12], BF16, W);
        let s = plan_backward_filter(&x, &t(&yd, BF16, Y), &dw, &g)
            .unwrap()
            .unwrap()
            .shape;
        assert_eq!(s.ws, [1, 4, 0, 24, 12]);
        assert_eq!(s.div, [1, 4, 1, 24, 12]);
        assert_eq!(s.xs, [432, 72, 0, 8, 1]);
    }

    // -----------------------------------------------------------------------------------
    // Host model: the kernels' arithmetic (kernels/conv.cu) over the planned `ConvShape`,
    // checked against the float64 reference on random problems and layouts. It checks the
    // plans (slots, strides, padding to 3-D, walk divisors) end to end without a GPU.

    fn range(base: i64, step: i64, len: i64, count: i64) -> (i64, i64) {
        let lo = if base >= 0 { 0 } else { (-base + step - 1) / step };
        let top = len - 1 - base;
        let hi = if top < 0 { 0 } else { count.min(top / step + 1) };
        (lo, hi.max(lo))
    }

    fn coords(s: &ConvShape, i: i64, dims: [i64; 5]) -> [i64; 5] {
        std::array::from_fn(|d| (i / s.div[d]) % dims[d])
    }

    /// The three kernels on host buffers (`x`, `w`, `y` hold element (0, ...) at index
    /// `base`); returns each written element's offset and value.
    fn model(pass: Pass, s: &ConvShape, bufs: [&[f64]; 3], base: [i64; 3], n: i64) -> Vec<(i64, f64)> {
        let ld = |b: usize, off: i64| bufs[b][(base[b] + off) as usize];
        let dot5 = |st: &[i64; 5], c: [i64; 5]| st.iter().zip(c).map(|(a, b)| a * b).sum::<i64>();
        let mut out = Vec::new();
        for i in 0..n {
            match pass {
                Pass::Forward => {
                    let c = coords(s, i, [s.n, s.k, s.out[0], s.out[1], s.out[2]]);
                    let g = c[1] / s.kg;
                    let mut acc = 0.0;
                    let b: [i64; 3] = std::array::from_fn(|d| c[2 + d] * s.stride[d] - s.pre[d]);
                    let r: [(i64, i64); 3] = std::array::from_fn(|d| range(b[d], s.dil[d], s.input[d], s.ker[d]));
                    for r0 in r[0].0..r[0].1 {
                        for r1 in r[1].0..r[1].1 {
                            for r2 in r[2].0..r[2].1 {
                                for cc in 0..s.cg {
                                    let xi = [
                                        c[0],
                                        g * s.cg + cc,
                                        b[0] + r0 * s.dil[0],
                                        b[1] + r1 * s.dil[1],
                                        b[2] + r2 * s.dil[2],
                                    ];
                                    acc += ld(0, dot5(&s.xs, xi)) * ld(1, dot5(&s.ws, [c[1], cc, r0, r1, r2]));
                                }
                            }
                        }
                    }
                    out.push((dot5(&s.ys, c), acc));
                }
                Pass::BackwardData => {
                    let c = coords(s, i, [s.n, s.c, s.input[0], s.input[1], s.input[2]]);
                    let (g, cc) = (c[1] / s.cg, c[1] % s.cg);
                    let mut acc = 0.0;
                    let taps = |d: usize| {
                        (0..s.ker[d]).filter_map(move |r| {
                            let t = c[2 + d] + s.pre[d] - r * s.dil[d];
                            (t >= 0 && t % s.stride[d] == 0 && t / s.stride[d] < s.out[d])
                                .then_some((r, t / s.stride[d]))
                        })
                    };
                    for (r0, o0) in taps(0) {
                        for (r1, o1) in taps(1) {
                            for (r2, o2) in taps(2) {
                                for k in g * s.kg..(g + 1) * s.kg {
                                    acc += ld(2, dot5(&s.ys, [c[0], k, o0, o1, o2]))
                                        * ld(1, dot5(&s.ws, [k, cc, r0, r1, r2]));
                                }
                            }
                        }
                    }
                    out.push((dot5(&s.xs, c), acc));
                }
                Pass::BackwardFilter => {
                    let c = coords(s, i, [s.k, s.cg, s.ker[0], s.ker[1], s.ker[2]]);
                    let ch = (c[0] / s.kg) * s.cg + c[1];
                    let sh: [i64; 3] = std::array::from_fn(|d| c[2 + d] * s.dil[d] - s.pre[d]);
                    let r: [(i64, i64); 3] = std::array::from_fn(|d| range(sh[d], s.stride[d], s.input[d], s.out[d]));
                    let mut acc = 0.0;
                    for b in 0..s.n {
                        for o0 in r[0].0..r[0].1 {
                            for o1 in r[1].0..r[1].1 {
                                for o2 in r[2].0..r[2].1 {
                                    let xi = [
                                        b,
                                        ch,
                                        o0 * s.stride[0] + sh[0],
                                        o1 * s.stride[1] + sh[1],
                                        o2 * s.stride[2] + sh[2],
                                    ];
                                    acc += ld(0, dot5(&s.xs, xi)) * ld(2, dot5(&s.ys, [b, c[0], o0, o1, o2]));
                                }
                            }
                        }
                    }
                    out.push((dot5(&s.ws, c), acc));
                }
            }
        }
        out
    }

    /// Strides of `dims` in a random memory order, sometimes gapped or with one reversed
    /// spatial dim; returns (strides, element offset of (0, ...) in the buffer, buffer length).
    fn random_layout(rng: &mut reference::SplitMix64, dims: &[i64]) -> (Vec<i64>, i64, usize) {
        let r = dims.len();
        let mut order: Vec<usize> = (0..r).collect();
        match rng.below(4) {
            0 => {}
            1 => order = std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect(),
            _ => {
                for i in (1..r).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
            }
        }
        let gap = 1 + rng.below(2) as i64;
        let mut strides = vec![0i64; r];
        let mut acc = 1;
        for &a in order.iter().rev() {
            strides[a] = acc * gap;
            acc = strides[a] * dims[a].max(1);
        }
        let mut base = 0;
        let a = 2 + rng.below(r as u64 - 2) as usize;
        if rng.below(3) == 0 && dims[a] > 1 {
            base = (dims[a] - 1) * strides[a];
            strides[a] = -strides[a];
        }
        (strides, base, acc as usize + 1)
    }

    #[test]
    fn host_model_of_the_kernels_matches_the_reference() {
        let mut rng = reference::SplitMix64::new(0xc0ffee);
        let mut cases = 0;
        while cases < 150 {
            let sp = 1 + rng.below(3) as usize;
            let (groups, cg, kg, n) = (
                1 + rng.below(3) as i64,
                1 + rng.below(3) as i64,
                1 + rng.below(3) as i64,
                1 + rng.below(2) as i64,
            );
            let mut xd = vec![n, groups * cg];
            let mut wd = vec![groups * kg, cg];
            let (mut pre, mut post, mut st, mut dil) = (vec![], vec![], vec![], vec![]);
            for _ in 0..sp {
                xd.push(1 + rng.below(if sp == 3 { 5 } else { 8 }) as i64);
                wd.push(1 + rng.below(4) as i64);
                pre.push(rng.below(3) as i64);
                post.push(rng.below(3) as i64);
                st.push(1 + rng.below(3) as i64);
                dil.push(1 + rng.below(3) as i64);
            }
            let g = geo(&pre, &post, &st, &dil, groups);
            let Ok(yd) = g.output_dims(&xd, &wd) else { continue };
            cases += 1;
            let rg = reference::ConvGeometry::from_i64(&pre, &post, &st, &dil, groups);
            let ud = |d: &[i64]| d.iter().map(|&v| v as usize).collect::<Vec<_>>();
            let numel = |d: &[i64]| d.iter().product::<i64>() as usize;
            let (xv, wv, dyv) = (rng.fill(numel(&xd)), rng.fill(numel(&wd)), rng.fill(numel(&yd)));
            let want = [
                reference::conv_forward(&xv, &ud(&xd), &wv, &ud(&wd), &rg),
                reference::conv_backward_data(&dyv, &ud(&yd), &wv, &ud(&wd), &ud(&xd), &rg),
                reference::conv_backward_filter(&xv, &ud(&xd), &dyv, &ud(&yd), &ud(&wd), &rg),
            ];
            let lays = [xd.as_slice(), wd.as_slice(), yd.as_slice()].map(|d| random_layout(&mut rng, d));
            let views: Vec<TensorRef> = [(&xd, X), (&wd, W), (&yd, Y)]
                .iter()
                .zip(&lays)
                .map(|((d, p), (s, b, _))| ts(d, s, F64, p + 8 * *b as u64))
                .collect();
            // Host buffers holding the logical values at their strided places.
            let fill = |vals: &[f64], d: &[i64], (s, b, len): &(Vec<i64>, i64, usize)| {
                let mut buf = vec![f64::NAN; *len];
                let rm = row_major_strides(d);
                for (i, v) in vals.iter().enumerate() {
                    let off: i64 = (0..d.len()).map(|a| (i as i64 / rm[a]) % d[a] * s[a]).sum();
                    buf[(b + off) as usize] = *v;
                }
                buf
            };
            let (bx, bw, by) = (
                fill(&xv, &xd, &lays[0]),
                fill(&wv, &wd, &lays[1]),
                fill(&dyv, &yd, &lays[2]),
            );
            let base = [lays[0].1, lays[1].1, lays[2].1];
            let [vx, vw, vy] = [&views[0], &views[1], &views[2]];
            for (j, (pass, plan, written, dims)) in [
                (Pass::Forward, plan_forward(vx, vw, vy, &g), 2, &yd),
                (Pass::BackwardData, plan_backward_data(vy, vw, vx, &g), 0, &xd),
                (Pass::BackwardFilter, plan_backward_filter(vx, vy, vw, &g), 1, &wd),
            ]
            .into_iter()
            .enumerate()
            {
                let p = plan.unwrap().unwrap();
                let got = model(pass, &p.shape, [&bx, &bw, &by], base, p.n);
                // Every element written once, at the offsets of the written view.
                let s = &lays[written].0;
                let rm = row_major_strides(dims);
                let mut by_offset: std::collections::HashMap<i64, f64> = got.into_iter().collect();
                assert_eq!(by_offset.len() as i64, p.n, "{pass:?} wrote some element twice");
                let mut num = 0.0;
                let mut den = 0.0;
                for (i, w) in want[j].iter().enumerate() {
                    let off: i64 = (0..dims.len()).map(|a| (i as i64 / rm[a]) % dims[a] * s[a]).sum();
                    let v = by_offset
                        .remove(&off)
                        .unwrap_or_else(|| panic!("{pass:?}: element {i} not written"));
                    num += (v - w) * (v - w);
                    den += w * w;
                }
                let err = (num / den.max(1e-300)).sqrt();
                assert!(err < 1e-12, "{pass:?} x {xd:?} w {wd:?} {g:?}: rel L2 {err}");
            }
        }
    }
}
