//! Float64 CPU reference implementations ("correct, not fast") used by GPU
//! tests, examples and benchmarks to check cuDNN results.
//!
//! Conventions:
//! * every tensor is a *logical*, row-major, contiguous `f64` slice in the
//!   canonical framework order: activations `N, C, spatial…` (NCW / NCHW /
//!   NCDHW), filters `K, C/groups, spatial…`, matrices `[..batch, M, K]`;
//! * the spatial rank is 1, 2 or 3;
//! * use [`scatter_to_strided`] / [`gather_from_strided`] to move data between
//!   this logical order and an arbitrary strided device layout (e.g. NHWC).
//!
//! These are test references: every function **panics** (via `assert!`, with
//! a descriptive message) when given inconsistent dimensions or lengths.
//!
//! The heavier kernels (convolutions, matmul, pooling) split their outer loops
//! over `std::thread::scope` threads; each output element is computed by a
//! single thread in a fixed order, so results are bit-for-bit deterministic.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

// ---------------------------------------------------------------------------
// Small internal helpers
// ---------------------------------------------------------------------------

fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Right-aligns `v` into a 3-element array, filling the leading slots.
fn pad3(v: &[usize], fill: usize) -> [usize; 3] {
    let mut a = [fill; 3];
    a[3 - v.len()..].copy_from_slice(v);
    a
}

/// Flat offset of `p` inside a contiguous `[.., d0, d1, d2]` block number `base`.
fn idx3(base: usize, d: [usize; 3], p: [usize; 3]) -> usize {
    ((base * d[0] + p[0]) * d[1] + p[1]) * d[2] + p[2]
}

/// All multi-indices of a 3-D grid in row-major order.
fn grid(d: [usize; 3]) -> impl Iterator<Item = [usize; 3]> {
    (0..d[0]).flat_map(move |a| (0..d[1]).flat_map(move |b| (0..d[2]).map(move |c| [a, b, c])))
}

/// Memory offsets of every logical element (row-major order) of a strided view.
fn offsets(dims: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for (&d, &s) in dims.iter().zip(strides) {
        offs = offs.iter().flat_map(|&o| (0..d).map(move |i| o + i * s)).collect();
    }
    offs
}

/// Runs `f(chunk_index, chunk)` over `out.chunks_mut(chunk)`, spreading the
/// chunks over scoped threads when the estimated `cost` (flops) is large.
fn par_chunks<F>(out: &mut [f64], chunk: usize, cost: usize, f: F)
where
    F: Fn(usize, &mut [f64]) + Sync,
{
    if chunk == 0 || out.is_empty() {
        return;
    }
    let n_chunks = out.len() / chunk;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(n_chunks);
    if threads <= 1 || cost < (1 << 18) {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
        return;
    }
    let per = n_chunks.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, block) in out.chunks_mut(per * chunk).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (j, c) in block.chunks_mut(chunk).enumerate() {
                    f(t * per + j, c);
                }
            });
        }
    });
}

fn check_len(name: &str, data_len: usize, dims: &[usize]) {
    assert_eq!(
        data_len,
        product(dims),
        "reference: {name} has {data_len} elements but dims {dims:?} need {}",
        product(dims)
    );
}

// ---------------------------------------------------------------------------
// Convolution
// ---------------------------------------------------------------------------

/// Convolution geometry (per spatial dimension, outermost first).
///
/// `pre_padding`, `post_padding`, `stride` and `dilation` must each have one
/// entry per spatial dimension; `groups` must divide both C and K.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Zero padding before each spatial dimension.
    pub pre_padding: Vec<usize>,
    /// Zero padding after each spatial dimension.
    pub post_padding: Vec<usize>,
    /// Stride of each spatial dimension (>= 1).
    pub stride: Vec<usize>,
    /// Dilation of each spatial dimension (>= 1).
    pub dilation: Vec<usize>,
    /// Number of groups (>= 1).
    pub groups: usize,
}

impl ConvGeometry {
    /// The geometry from signed per-dim lists (as engines and frameworks keep them).
    ///
    /// Panics on a negative value.
    pub fn from_i64(pre_padding: &[i64], post_padding: &[i64], stride: &[i64], dilation: &[i64], groups: i64) -> Self {
        let u = |v: &[i64]| -> Vec<usize> {
            v.iter()
                .map(|&x| usize::try_from(x).expect("ConvGeometry::from_i64: negative value"))
                .collect()
        };
        Self {
            pre_padding: u(pre_padding),
            post_padding: u(post_padding),
            stride: u(stride),
            dilation: u(dilation),
            groups: usize::try_from(groups).expect("ConvGeometry::from_i64: negative groups"),
        }
    }

    /// Output dims `[N, K, out spatial…]` for input `x_dims` and filter
    /// `w_dims`, with `out = (in + pre + post - dil*(k-1) - 1)/stride + 1`.
    ///
    /// Panics on inconsistent dims or when the dilated filter does not fit
    /// in the padded input.
    pub fn output_dims(&self, x_dims: &[usize], w_dims: &[usize]) -> Vec<usize> {
        let p = ConvPlan::new(x_dims, w_dims, self);
        let r = x_dims.len() - 2;
        let mut out = vec![p.n, p.k];
        out.extend_from_slice(&p.out[3 - r..]);
        out
    }
}

/// Validated convolution problem, normalised to 3 spatial dimensions.
struct ConvPlan {
    n: usize,
    c: usize,
    k: usize,
    cg: usize,
    kg: usize,
    inp: [usize; 3],
    ker: [usize; 3],
    out: [usize; 3],
    pre: [usize; 3],
    stride: [usize; 3],
    dil: [usize; 3],
}

impl ConvPlan {
    fn new(x_dims: &[usize], w_dims: &[usize], g: &ConvGeometry) -> Self {
        let rank = x_dims.len();
        assert!(
            (3..=5).contains(&rank),
            "conv: x dims {x_dims:?} must be N, C + 1..=3 spatial dims"
        );
        assert_eq!(
            w_dims.len(),
            rank,
            "conv: filter dims {w_dims:?} must have the same rank as x dims {x_dims:?}"
        );
        let r = rank - 2;
        for (name, v) in [
            ("pre_padding", &g.pre_padding),
            ("post_padding", &g.post_padding),
            ("stride", &g.stride),
            ("dilation", &g.dilation),
        ] {
            assert_eq!(v.len(), r, "conv: {name} {v:?} must have {r} entries");
        }
        assert!(
            g.stride.iter().chain(&g.dilation).all(|&s| s >= 1),
            "conv: stride {:?} and dilation {:?} must be >= 1",
            g.stride,
            g.dilation
        );
        let (n, c, k) = (x_dims[0], x_dims[1], w_dims[0]);
        assert!(
            g.groups >= 1 && c % g.groups == 0 && k % g.groups == 0,
            "conv: groups {} must divide C {c} and K {k}",
            g.groups
        );
        let cg = c / g.groups;
        assert_eq!(
            w_dims[1], cg,
            "conv: filter dims {w_dims:?} need C/groups = {cg} in axis 1"
        );
        let inp = pad3(&x_dims[2..], 1);
        let ker = pad3(&w_dims[2..], 1);
        let pre = pad3(&g.pre_padding, 0);
        let post = pad3(&g.post_padding, 0);
        let stride = pad3(&g.stride, 1);
        let dil = pad3(&g.dilation, 1);
        let mut out = [1; 3];
        for d in 0..3 {
            assert!(ker[d] >= 1, "conv: filter dims {w_dims:?} must be >= 1");
            let padded = inp[d] + pre[d] + post[d];
            let eff = dil[d] * (ker[d] - 1) + 1;
            assert!(
                padded >= eff,
                "conv: dilated filter extent {eff} exceeds padded input {padded} (x {x_dims:?}, w {w_dims:?})"
            );
            out[d] = (padded - eff) / stride[d] + 1;
        }
        ConvPlan {
            n,
            c,
            k,
            cg,
            kg: k / g.groups,
            inp,
            ker,
            out,
            pre,
            stride,
            dil,
        }
    }

    /// Input coordinate read by output `o`, filter tap `r` along axis `d`.
    fn in_coord(&self, d: usize, o: usize, r: usize) -> Option<usize> {
        (o * self.stride[d] + r * self.dil[d])
            .checked_sub(self.pre[d])
            .filter(|&i| i < self.inp[d])
    }

    /// Output coordinate that reads input `i` through filter tap `r` on axis `d`.
    fn out_coord(&self, d: usize, i: usize, r: usize) -> Option<usize> {
        let t = (i + self.pre[d]).checked_sub(r * self.dil[d])?;
        if t % self.stride[d] != 0 {
            return None;
        }
        Some(t / self.stride[d]).filter(|&o| o < self.out[d])
    }

    /// `(tap, input coord)` pairs read by output `o` along axis `d`.
    fn taps(&self, d: usize, o: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.ker[d]).filter_map(move |r| self.in_coord(d, o, r).map(|i| (r, i)))
    }

    /// `(tap, output coord)` pairs that read input `i` along axis `d`.
    fn outs_reading(&self, d: usize, i: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.ker[d]).filter_map(move |r| self.out_coord(d, i, r).map(|o| (r, o)))
    }

    /// `(output coord, input coord)` pairs connected by tap `r` along axis `d`.
    fn outs_for_tap(&self, d: usize, r: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.out[d]).filter_map(move |o| self.in_coord(d, o, r).map(|i| (o, i)))
    }

    fn out_dims(&self, rank: usize) -> Vec<usize> {
        let mut v = vec![self.n, self.k];
        v.extend_from_slice(&self.out[5 - rank..]);
        v
    }

    fn macs(&self) -> usize {
        self.n * self.k * self.cg * product(&self.out) * product(&self.ker)
    }
}

/// Forward convolution (cross-correlation, as cuDNN's `CROSS_CORRELATION`
/// mode), with padding, stride, dilation and groups. Returns `y` with dims
/// [`ConvGeometry::output_dims`]. Panics on inconsistent dims.
pub fn conv_forward(x: &[f64], x_dims: &[usize], w: &[f64], w_dims: &[usize], g: &ConvGeometry) -> Vec<f64> {
    let p = ConvPlan::new(x_dims, w_dims, g);
    check_len("conv_forward x", x.len(), x_dims);
    check_len("conv_forward w", w.len(), w_dims);
    let mut y = vec![0.0; p.n * p.k * product(&p.out)];
    par_chunks(&mut y, product(&p.out), p.macs(), |nk, ys| {
        let (n, k) = (nk / p.k, nk % p.k);
        let grp = k / p.kg;
        for o in grid(p.out) {
            let mut acc = 0.0;
            for cc in 0..p.cg {
                let (xb, wb) = (n * p.c + grp * p.cg + cc, k * p.cg + cc);
                for (r0, i0) in p.taps(0, o[0]) {
                    for (r1, i1) in p.taps(1, o[1]) {
                        for (r2, i2) in p.taps(2, o[2]) {
                            acc += x[idx3(xb, p.inp, [i0, i1, i2])] * w[idx3(wb, p.ker, [r0, r1, r2])];
                        }
                    }
                }
            }
            ys[idx3(0, p.out, o)] = acc;
        }
    });
    y
}

/// Gradient of [`conv_forward`] with respect to `x` (the adjoint of the
/// forward map in `x`): returns `dx` with dims `x_dims`. Panics if `dy_dims`
/// is not the forward output shape or on other inconsistent dims.
pub fn conv_backward_data(
    dy: &[f64],
    dy_dims: &[usize],
    w: &[f64],
    w_dims: &[usize],
    x_dims: &[usize],
    g: &ConvGeometry,
) -> Vec<f64> {
    let p = ConvPlan::new(x_dims, w_dims, g);
    assert_eq!(
        dy_dims,
        p.out_dims(x_dims.len()).as_slice(),
        "conv_backward_data: dy dims do not match the forward output dims"
    );
    check_len("conv_backward_data dy", dy.len(), dy_dims);
    check_len("conv_backward_data w", w.len(), w_dims);
    let mut dx = vec![0.0; product(x_dims)];
    // Gather formulation (independent of the forward loop structure): each
    // input element sums over the (output, tap) pairs that read it.
    par_chunks(&mut dx, product(&p.inp), p.macs(), |nc, dxs| {
        let (n, ch) = (nc / p.c, nc % p.c);
        let (grp, cc) = (ch / p.cg, ch % p.cg);
        for i in grid(p.inp) {
            let mut acc = 0.0;
            for k in grp * p.kg..(grp + 1) * p.kg {
                for (r0, o0) in p.outs_reading(0, i[0]) {
                    for (r1, o1) in p.outs_reading(1, i[1]) {
                        for (r2, o2) in p.outs_reading(2, i[2]) {
                            acc += dy[idx3(n * p.k + k, p.out, [o0, o1, o2])]
                                * w[idx3(k * p.cg + cc, p.ker, [r0, r1, r2])];
                        }
                    }
                }
            }
            dxs[idx3(0, p.inp, i)] = acc;
        }
    });
    dx
}

/// Gradient of [`conv_forward`] with respect to the filter: returns `dw`
/// with dims `w_dims`. Panics if `dy_dims` is not the forward output shape or
/// on other inconsistent dims.
pub fn conv_backward_filter(
    x: &[f64],
    x_dims: &[usize],
    dy: &[f64],
    dy_dims: &[usize],
    w_dims: &[usize],
    g: &ConvGeometry,
) -> Vec<f64> {
    let p = ConvPlan::new(x_dims, w_dims, g);
    assert_eq!(
        dy_dims,
        p.out_dims(x_dims.len()).as_slice(),
        "conv_backward_filter: dy dims do not match the forward output dims"
    );
    check_len("conv_backward_filter x", x.len(), x_dims);
    check_len("conv_backward_filter dy", dy.len(), dy_dims);
    let mut dw = vec![0.0; product(w_dims)];
    par_chunks(&mut dw, p.cg * product(&p.ker), p.macs(), |k, dws| {
        let grp = k / p.kg;
        for cc in 0..p.cg {
            let xb = grp * p.cg + cc;
            for r in grid(p.ker) {
                let mut acc = 0.0;
                for n in 0..p.n {
                    for (o0, i0) in p.outs_for_tap(0, r[0]) {
                        for (o1, i1) in p.outs_for_tap(1, r[1]) {
                            for (o2, i2) in p.outs_for_tap(2, r[2]) {
                                acc += x[idx3(n * p.c + xb, p.inp, [i0, i1, i2])]
                                    * dy[idx3(n * p.k + k, p.out, [o0, o1, o2])];
                            }
                        }
                    }
                }
                dws[idx3(cc, p.ker, r)] = acc;
            }
        }
    });
    dw
}

// ---------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------

/// Batched matrix product `a [..batch, M, K] @ b [..batch, K, N]`.
///
/// Both ranks must be >= 2. Batch dims broadcast numpy-style (right-aligned;
/// a missing or size-1 dim broadcasts). Returns `(c, [..batch, M, N])`.
/// Panics on inconsistent dims.
pub fn matmul(a: &[f64], a_dims: &[usize], b: &[f64], b_dims: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let (ra, rb) = (a_dims.len(), b_dims.len());
    assert!(
        ra >= 2 && rb >= 2,
        "matmul: ranks must be >= 2 (a {a_dims:?}, b {b_dims:?})"
    );
    check_len("matmul a", a.len(), a_dims);
    check_len("matmul b", b.len(), b_dims);
    let (m, ka) = (a_dims[ra - 2], a_dims[ra - 1]);
    let (kb, n) = (b_dims[rb - 2], b_dims[rb - 1]);
    assert_eq!(ka, kb, "matmul: inner dims differ (a {a_dims:?}, b {b_dims:?})");
    let k = ka;
    let rank = (ra - 2).max(rb - 2);
    let bdim = |dims: &[usize], r: usize, i: usize| -> usize {
        // i counts batch axes of the output from the left.
        (i + r).checked_sub(rank).map_or(1, |j| dims[j])
    };
    let mut out_batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let (da, db) = (bdim(a_dims, ra - 2, i), bdim(b_dims, rb - 2, i));
        assert!(
            da == db || da == 1 || db == 1,
            "matmul: batch dims do not broadcast (a {a_dims:?}, b {b_dims:?})"
        );
        out_batch.push(if da == 1 { db } else { da });
    }
    // Matrix-unit strides with 0 on broadcast axes.
    let bstrides = |dims: &[usize], r: usize| -> Vec<usize> {
        let own: Vec<usize> = (0..rank).map(|i| bdim(dims, r, i)).collect();
        let cs = contiguous_strides(&own);
        (0..rank).map(|i| if own[i] == 1 { 0 } else { cs[i] }).collect()
    };
    let a_off = offsets(&out_batch, &bstrides(a_dims, ra - 2));
    let b_off = offsets(&out_batch, &bstrides(b_dims, rb - 2));
    let batch = product(&out_batch);
    let mut c = vec![0.0; batch * m * n];
    par_chunks(&mut c, n, batch * m * n * k, |row, cs| {
        let (bi, i) = (row / m, row % m);
        let a0 = a_off[bi] * m * k + i * k;
        let b0 = b_off[bi] * k * n;
        for (j, cj) in cs.iter_mut().enumerate() {
            *cj = (0..k).map(|p| a[a0 + p] * b[b0 + p * n + j]).sum();
        }
    });
    let mut dims = out_batch;
    dims.extend([m, n]);
    (c, dims)
}

// ---------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------

/// Pointwise activation functions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `x`.
    Identity,
    /// `max(x, 0)`; derivative 1 for `x > 0`, else 0.
    Relu,
    /// Exact GELU `0.5·x·(1 + erf(x/√2))`.
    Gelu,
    /// Tanh-approximated GELU `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// Logistic sigmoid `1/(1 + e^-x)`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// `x` for `x > 0`, else `alpha·(e^x − 1)`.
    Elu {
        /// Negative-side scale.
        alpha: f64,
    },
    /// Swish / SiLU `x·sigmoid(beta·x)`.
    Swish {
        /// Sigmoid slope.
        beta: f64,
    },
}

const GELU_TANH_C: f64 = 0.044715;
/// √(2/π).
const SQRT_2_OVER_PI: f64 = FRAC_2_SQRT_PI * FRAC_1_SQRT_2;

/// erf(x) for |x| < 2 via the non-alternating series
/// erf(x) = 2/√π · e^{-x²} · Σ 2ⁿ x^{2n+1} / (1·3·…·(2n+1)).
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let (mut term, mut sum) = (x.abs(), x.abs());
    for n in 1..200 {
        term *= 2.0 * x2 / (2 * n + 1) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    (FRAC_2_SQRT_PI * (-x2).exp() * sum).copysign(x)
}

/// erfc(x) for x >= 2 via the continued fraction
/// erfc(x) = e^{-x²}/√π · 1/(x + ½/(x + 1/(x + 3/2/(x + …)))).
fn erfc_cf(x: f64) -> f64 {
    let mut f = x;
    for k in (1..=100).rev() {
        f = x + (k as f64 / 2.0) / f;
    }
    0.5 * FRAC_2_SQRT_PI * (-x * x).exp() / f
}

/// Error function, accurate to a few ulps.
#[cfg(test)]
fn erf(x: f64) -> f64 {
    if x.is_nan() || x.abs() < 2.0 {
        erf_series(x)
    } else {
        (1.0 - erfc_cf(x.abs())).copysign(x)
    }
}

/// Complementary error function, accurate to a few ulps relative (so
/// `Φ(x) = erfc(-x/√2)/2` stays accurate in the far negative tail).
fn erfc(x: f64) -> f64 {
    if x.is_nan() || x.abs() < 2.0 {
        1.0 - erf_series(x)
    } else if x > 0.0 {
        erfc_cf(x)
    } else {
        2.0 - erfc_cf(-x)
    }
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Applies `act` to `x`.
pub fn activation(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Identity => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => 0.5 * x * erfc(-x * FRAC_1_SQRT_2),
        Activation::GeluTanh => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)).tanh()),
        Activation::Sigmoid => sigmoid(x),
        Activation::Tanh => x.tanh(),
        Activation::Elu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha * x.exp_m1()
            }
        }
        Activation::Swish { beta } => x * sigmoid(beta * x),
    }
}

/// `d act(x)/dx · dy`, where `x` is the activation's *input*. At the kinks of
/// Relu/Elu (`x = 0`) the left derivative is used.
pub fn activation_backward(act: Activation, x: f64, dy: f64) -> f64 {
    let d = match act {
        Activation::Identity => 1.0,
        Activation::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Gelu => {
            let cdf = 0.5 * erfc(-x * FRAC_1_SQRT_2);
            let pdf = 0.5 * FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * (-0.5 * x * x).exp();
            cdf + x * pdf
        }
        Activation::GeluTanh => {
            let t = (SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_C * x * x)
        }
        Activation::Sigmoid => {
            let s = sigmoid(x);
            s * (1.0 - s)
        }
        Activation::Tanh => {
            let t = x.tanh();
            1.0 - t * t
        }
        Activation::Elu { alpha } => {
            if x > 0.0 {
                1.0
            } else {
                alpha * x.exp()
            }
        }
        Activation::Swish { beta } => {
            let s = sigmoid(beta * x);
            s + beta * x * s * (1.0 - s)
        }
    };
    d * dy
}

/// In place `y = act(y + bias[c])`, where `c` is the index along
/// `channel_axis` of `y_dims`. Panics if `bias.len() != y_dims[channel_axis]`
/// or on inconsistent dims.
pub fn bias_activation(y: &mut [f64], y_dims: &[usize], channel_axis: usize, bias: &[f64], act: Activation) {
    assert!(
        channel_axis < y_dims.len(),
        "bias_activation: channel axis {channel_axis} out of range for dims {y_dims:?}"
    );
    check_len("bias_activation y", y.len(), y_dims);
    let c = y_dims[channel_axis];
    assert_eq!(
        bias.len(),
        c,
        "bias_activation: bias has {} elements, channel axis has {c}",
        bias.len()
    );
    if y.is_empty() {
        return;
    }
    let inner = product(&y_dims[channel_axis + 1..]);
    for (i, v) in y.iter_mut().enumerate() {
        *v = activation(act, *v + bias[(i / inner) % c]);
    }
}

// ---------------------------------------------------------------------------
// Pooling
// ---------------------------------------------------------------------------

/// Pooling modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// Maximum over in-bounds elements (padding acts as −∞). NaN propagates.
    Max,
    /// Sum of in-bounds elements divided by the full window volume.
    AvgIncludePadding,
    /// Sum of in-bounds elements divided by their count.
    AvgExcludePadding,
}

/// Pooling geometry (per spatial dimension, outermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Window extent of each spatial dimension (>= 1).
    pub window: Vec<usize>,
    /// Stride of each spatial dimension (>= 1).
    pub stride: Vec<usize>,
    /// Padding before each spatial dimension.
    pub pre_padding: Vec<usize>,
    /// Padding after each spatial dimension.
    pub post_padding: Vec<usize>,
    /// Pooling mode.
    pub mode: PoolMode,
}

impl PoolGeometry {
    /// Output dims `[N, C, out spatial…]` with
    /// `out = (in + pre + post - window)/stride + 1`. Panics on inconsistent dims.
    pub fn output_dims(&self, x_dims: &[usize]) -> Vec<usize> {
        let p = PoolPlan::new(x_dims, self);
        let mut v = x_dims[..2].to_vec();
        v.extend_from_slice(&p.out[5 - x_dims.len()..]);
        v
    }
}

/// Validated pooling problem, normalised to 3 spatial dimensions.
struct PoolPlan {
    inp: [usize; 3],
    win: [usize; 3],
    stride: [usize; 3],
    pre: [usize; 3],
    out: [usize; 3],
}

impl PoolPlan {
    fn new(x_dims: &[usize], g: &PoolGeometry) -> Self {
        let rank = x_dims.len();
        assert!(
            (3..=5).contains(&rank),
            "pool: x dims {x_dims:?} must be N, C + 1..=3 spatial dims"
        );
        let r = rank - 2;
        for (name, v) in [
            ("window", &g.window),
            ("stride", &g.stride),
            ("pre_padding", &g.pre_padding),
            ("post_padding", &g.post_padding),
        ] {
            assert_eq!(v.len(), r, "pool: {name} {v:?} must have {r} entries");
        }
        assert!(
            g.window.iter().chain(&g.stride).all(|&s| s >= 1),
            "pool: window {:?} and stride {:?} must be >= 1",
            g.window,
            g.stride
        );
        let inp = pad3(&x_dims[2..], 1);
        let win = pad3(&g.window, 1);
        let stride = pad3(&g.stride, 1);
        let pre = pad3(&g.pre_padding, 0);
        let post = pad3(&g.post_padding, 0);
        let mut out = [1; 3];
        for d in 0..3 {
            let padded = inp[d] + pre[d] + post[d];
            assert!(
                padded >= win[d],
                "pool: window {:?} exceeds padded input (x {x_dims:?})",
                g.window
            );
            out[d] = (padded - win[d]) / stride[d] + 1;
        }
        PoolPlan {
            inp,
            win,
            stride,
            pre,
            out,
        }
    }

    /// In-bounds flat (in-plane) input offsets of output `o`'s window, in
    /// row-major scan order.
    fn window(&self, o: [usize; 3]) -> Vec<usize> {
        let coords = |d: usize| -> Vec<usize> {
            (0..self.win[d])
                .filter_map(|r| {
                    (o[d] * self.stride[d] + r)
                        .checked_sub(self.pre[d])
                        .filter(|&i| i < self.inp[d])
                })
                .collect()
        };
        let (c0, c1, c2) = (coords(0), coords(1), coords(2));
        let mut v = Vec::with_capacity(c0.len() * c1.len() * c2.len());
        for &i0 in &c0 {
            for &i1 in &c1 {
                for &i2 in &c2 {
                    v.push(idx3(0, self.inp, [i0, i1, i2]));
                }
            }
        }
        v
    }

    fn for_each_out(&self, mut f: impl FnMut(usize, Vec<usize>)) {
        for o in grid(self.out) {
            f(idx3(0, self.out, o), self.window(o));
        }
    }
}

/// First maximal element of `win` in `plane` (NaN wins and sticks).
fn argmax(plane: &[f64], win: &[usize]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for &i in win {
        let v = plane[i];
        match best {
            None => best = Some(i),
            Some(b) if v > plane[b] || (v.is_nan() && !plane[b].is_nan()) => best = Some(i),
            _ => {}
        }
    }
    best
}

/// Pooling forward. A window lying entirely in padding yields −∞ (max) or 0
/// (avg-exclude). Panics on inconsistent dims.
pub fn pool_forward(x: &[f64], x_dims: &[usize], g: &PoolGeometry) -> Vec<f64> {
    let p = PoolPlan::new(x_dims, g);
    check_len("pool_forward x", x.len(), x_dims);
    let (in_vol, out_vol) = (product(&p.inp), product(&p.out));
    let win_vol = product(&p.win) as f64;
    let mut y = vec![0.0; x_dims[0] * x_dims[1] * out_vol];
    par_chunks(&mut y, out_vol, x.len() * product(&p.win), |pl, ys| {
        let plane = &x[pl * in_vol..(pl + 1) * in_vol];
        p.for_each_out(|o, win| {
            let sum: f64 = win.iter().map(|&i| plane[i]).sum();
            ys[o] = match g.mode {
                PoolMode::Max => argmax(plane, &win).map_or(f64::NEG_INFINITY, |i| plane[i]),
                PoolMode::AvgIncludePadding => sum / win_vol,
                PoolMode::AvgExcludePadding if win.is_empty() => 0.0,
                PoolMode::AvgExcludePadding => sum / win.len() as f64,
            };
        });
    });
    y
}

/// Pooling backward: `dx` with dims `x_dims` for output gradient `dy`. Max:
/// the whole `dy` of a window goes to its first maximal in-bounds element
/// (row-major scan order); avg: `dy` is spread over the in-bounds elements
/// with the forward divisor. Panics on inconsistent dims.
pub fn pool_backward(x: &[f64], x_dims: &[usize], dy: &[f64], g: &PoolGeometry) -> Vec<f64> {
    let p = PoolPlan::new(x_dims, g);
    check_len("pool_backward x", x.len(), x_dims);
    check_len("pool_backward dy", dy.len(), &g.output_dims(x_dims));
    let (in_vol, out_vol) = (product(&p.inp), product(&p.out));
    let win_vol = product(&p.win) as f64;
    let mut dx = vec![0.0; x.len()];
    par_chunks(&mut dx, in_vol, x.len() * product(&p.win), |pl, dxs| {
        let plane = &x[pl * in_vol..(pl + 1) * in_vol];
        let dys = &dy[pl * out_vol..(pl + 1) * out_vol];
        p.for_each_out(|o, win| match g.mode {
            PoolMode::Max => {
                if let Some(i) = argmax(plane, &win) {
                    dxs[i] += dys[o];
                }
            }
            PoolMode::AvgIncludePadding | PoolMode::AvgExcludePadding => {
                let div = if g.mode == PoolMode::AvgIncludePadding {
                    win_vol
                } else {
                    win.len() as f64
                };
                for &i in &win {
                    dxs[i] += dys[o] / div;
                }
            }
        });
    });
    dx
}

// ---------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (0 for an empty reduction).
    Sum,
    /// Maximum (−∞ for an empty reduction; NaN propagates).
    Max,
    /// Minimum (+∞ for an empty reduction; NaN propagates).
    Min,
    /// Arithmetic mean (NaN for an empty reduction).
    Mean,
}

/// Reduces `x` (dims `dims`) over `axes`; reduced axes are kept with size 1,
/// so the result has `product(dims with axes set to 1)` elements. Panics on
/// out-of-range or duplicate axes.
pub fn reduce(x: &[f64], dims: &[usize], axes: &[usize], op: ReduceOp) -> Vec<f64> {
    check_len("reduce x", x.len(), dims);
    let mut out_dims = dims.to_vec();
    for (j, &a) in axes.iter().enumerate() {
        assert!(a < dims.len(), "reduce: axis {a} out of range for dims {dims:?}");
        assert!(!axes[..j].contains(&a), "reduce: duplicate axis {a} in {axes:?}");
        out_dims[a] = 1;
    }
    let cs = contiguous_strides(&out_dims);
    let strides: Vec<usize> = (0..dims.len())
        .map(|d| if axes.contains(&d) { 0 } else { cs[d] })
        .collect();
    let init = match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let mut out = vec![init; product(&out_dims)];
    for (&v, o) in x.iter().zip(offsets(dims, &strides)) {
        let acc = &mut out[o];
        match op {
            ReduceOp::Sum | ReduceOp::Mean => *acc += v,
            ReduceOp::Max if v > *acc || v.is_nan() => *acc = v,
            ReduceOp::Min if v < *acc || v.is_nan() => *acc = v,
            _ => {}
        }
    }
    if op == ReduceOp::Mean {
        let count = axes.iter().map(|&a| dims[a]).product::<usize>() as f64;
        out.iter_mut().for_each(|v| *v /= count);
    }
    out
}

// ---------------------------------------------------------------------------
// Attention and normalization
// ---------------------------------------------------------------------------

/// True where query `i` of `sq` may not see key `j` of `skv` under the causal mask aligned to
/// the bottom right (`j > i + skv - sq`; the lower triangle when `sq == skv`), as
/// `ops::sdpa_forward` with `causal`, Burn and PyTorch's `is_causal` define it.
pub fn causal_masked(i: usize, j: usize, sq: usize, skv: usize) -> bool {
    j + sq > i + skv
}

/// Scaled dot-product attention `softmax(q·kᵀ·scale + bias)·v` over `heads` independent
/// (batch × head) slices: `q [heads, lq, d]`, `k [heads, lk, d]`, `v [heads, lk, dv]`,
/// `bias(head, i, j)` added to each score. Returns the output `[heads, lq, dv]` and the
/// log-sum-exp `max + ln Σ exp` of every score row `[heads, lq]`. Panics on inconsistent
/// lengths.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    [heads, lq, lk, d, dv]: [usize; 5],
    scale: f64,
    bias: Option<&dyn Fn(usize, usize, usize) -> f64>,
) -> (Vec<f64>, Vec<f64>) {
    assert!(q.len() == heads * lq * d && k.len() == heads * lk * d && v.len() == heads * lk * dv);
    let mut out = vec![0.0; heads * lq * dv];
    let mut lse = Vec::with_capacity(heads * lq);
    let mut p = vec![0.0; lk];
    for hd in 0..heads {
        for i in 0..lq {
            let qr = &q[(hd * lq + i) * d..][..d];
            for (j, pj) in p.iter_mut().enumerate() {
                let kr = &k[(hd * lk + j) * d..][..d];
                *pj = qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>() * scale + bias.map_or(0.0, |f| f(hd, i, j));
            }
            let m = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            p.iter_mut().for_each(|x| *x = (*x - m).exp());
            let sum: f64 = p.iter().sum();
            lse.push(m + sum.ln());
            for c in 0..dv {
                out[(hd * lq + i) * dv + c] = (0..lk).map(|j| p[j] / sum * v[(hd * lk + j) * dv + c]).sum();
            }
        }
    }
    (out, lse)
}

/// The gradients `(dq, dk, dv)` of [`attention`] for the output gradient `d_o`
/// (`[heads, lq, dv]`), same layouts and bias (a bias of `-inf` masks a score).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sizes: [usize; 5],
    scale: f64,
    bias: Option<&dyn Fn(usize, usize, usize) -> f64>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (dq, dk, dv, _) = attention_backward_with_scores(q, k, v, d_o, sizes, scale, bias);
    (dq, dk, dv)
}

/// [`attention_backward`] plus the gradient of the biased scores `q·kᵀ·scale + bias`
/// (`[heads, lq, lk]`): `P ∘ (dP − rowsum(P ∘ dP))` with `dP = dO·Vᵀ`, which is also the
/// gradient of an additive bias of that shape.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_with_scores(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    [heads, lq, lk, d, dv]: [usize; 5],
    scale: f64,
    bias: Option<&dyn Fn(usize, usize, usize) -> f64>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dq, mut dk, mut dvv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let mut d_scores = vec![0.0; heads * lq * lk];
    let mut p = vec![0.0; lk];
    let mut dp = vec![0.0; lk];
    for hd in 0..heads {
        for i in 0..lq {
            let qr = &q[(hd * lq + i) * d..][..d];
            for (j, pj) in p.iter_mut().enumerate() {
                let kr = &k[(hd * lk + j) * d..][..d];
                *pj = qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>() * scale + bias.map_or(0.0, |f| f(hd, i, j));
            }
            let m = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            p.iter_mut().for_each(|x| *x = (*x - m).exp());
            let sum: f64 = p.iter().sum();
            p.iter_mut().for_each(|x| *x /= sum);
            let dor = &d_o[(hd * lq + i) * dv..][..dv];
            for j in 0..lk {
                let vr = &v[(hd * lk + j) * dv..][..dv];
                dp[j] = dor.iter().zip(vr).map(|(a, b)| a * b).sum();
                for c in 0..dv {
                    dvv[(hd * lk + j) * dv + c] += p[j] * dor[c];
                }
            }
            let dot: f64 = (0..lk).map(|j| p[j] * dp[j]).sum();
            for j in 0..lk {
                let d_score = p[j] * (dp[j] - dot);
                d_scores[(hd * lq + i) * lk + j] = d_score;
                let ds = d_score * scale;
                for c in 0..d {
                    dq[(hd * lq + i) * d + c] += ds * k[(hd * lk + j) * d + c];
                    dk[(hd * lk + j) * d + c] += ds * qr[c];
                }
            }
        }
    }
    (dq, dk, dvv, d_scores)
}

/// Layer norm (`centred`) or RMS norm of every row of `x` (`features` per row):
/// `(x - mean) / sqrt(var + eps) · w + b`, with mean 0 for RMS norm. Returns `y`, the row
/// means and the row inverse standard deviations. Panics on inconsistent lengths.
pub fn norm(
    x: &[f64],
    features: usize,
    w: &[f64],
    b: Option<&[f64]>,
    centred: bool,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    assert!(features > 0 && x.len().is_multiple_of(features) && w.len() == features);
    let n = features as f64;
    let (mut y, mut means, mut invs) = (Vec::with_capacity(x.len()), Vec::new(), Vec::new());
    for row in x.chunks(features) {
        let mean = if centred { row.iter().sum::<f64>() / n } else { 0.0 };
        let inv = 1.0 / (row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n + eps).sqrt();
        y.extend(
            row.iter()
                .enumerate()
                .map(|(i, v)| (v - mean) * inv * w[i] + b.map_or(0.0, |b| b[i])),
        );
        means.push(mean);
        invs.push(inv);
    }
    (y, means, invs)
}

/// Batch-norm training forward on logical row-major `[N, C, spatial...]` data (`dims`):
/// `y = relu?((x - mean_c) * inv_std_c * scale_c + bias_c + residual)` with the biased batch
/// variance. Returns `y`, the channel means, inverse standard deviations and the unbiased
/// variances (for running updates).
pub fn batch_norm_train(
    x: &[f64],
    dims: &[usize],
    scale: &[f64],
    bias: &[f64],
    residual: Option<&[f64]>,
    eps: f64,
    relu: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c) = (dims[0], dims[1]);
    let s: usize = dims[2..].iter().product();
    let at = |b: usize, ch: usize, k: usize| (b * c + ch) * s + k;
    let m = (n * s) as f64;
    let (mut means, mut invs, mut unbiased) = (vec![0.0; c], vec![0.0; c], vec![0.0; c]);
    for ch in 0..c {
        let vals = (0..n).flat_map(|b| (0..s).map(move |k| (b, k)));
        let mean = vals.clone().map(|(b, k)| x[at(b, ch, k)]).sum::<f64>() / m;
        let ss = vals.map(|(b, k)| (x[at(b, ch, k)] - mean).powi(2)).sum::<f64>();
        means[ch] = mean;
        invs[ch] = 1.0 / (ss / m + eps).sqrt();
        unbiased[ch] = ss / (m - 1.0).max(1.0);
    }
    let mut y = vec![0.0; x.len()];
    for (i, out) in y.iter_mut().enumerate() {
        let ch = (i / s) % c;
        let mut v = (x[i] - means[ch]) * invs[ch] * scale[ch] + bias[ch] + residual.map_or(0.0, |r| r[i]);
        if relu && v < 0.0 {
            v = 0.0;
        }
        *out = v;
    }
    (y, means, invs, unbiased)
}

/// Batch-norm backward from the forward's data (logical row-major `[N, C, spatial...]`):
/// with `y` given the forward applied ReLU and `dy` is masked by `y > 0` first. Returns
/// `dx`, the masked `dy` (the residual's gradient), `dscale` and `dbias`.
pub fn batch_norm_backward(
    x: &[f64],
    y: Option<&[f64]>,
    dy: &[f64],
    dims: &[usize],
    scale: &[f64],
    mean: &[f64],
    inv_std: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c) = (dims[0], dims[1]);
    let s: usize = dims[2..].iter().product();
    let m = (n * s) as f64;
    let g: Vec<f64> = dy
        .iter()
        .enumerate()
        .map(|(i, &d)| match y {
            Some(y) if y[i] <= 0.0 => 0.0,
            _ => d,
        })
        .collect();
    let (mut dscale, mut dbias) = (vec![0.0; c], vec![0.0; c]);
    for (i, &gi) in g.iter().enumerate() {
        let ch = (i / s) % c;
        dbias[ch] += gi;
        dscale[ch] += gi * (x[i] - mean[ch]) * inv_std[ch];
    }
    let dx = g
        .iter()
        .enumerate()
        .map(|(i, &gi)| {
            let ch = (i / s) % c;
            let xhat = (x[i] - mean[ch]) * inv_std[ch];
            scale[ch] * inv_std[ch] * (gi - dbias[ch] / m - xhat * dscale[ch] / m)
        })
        .collect();
    (dx, g, dscale, dbias)
}

/// One Adam / AdamW step on one tensor in float64 (`step` counts from 1; `m`, `v`, `vmax`
/// empty on the first step): `g += l2·p; m = b1·m + (1-b1)·g; v = b2·v + (1-b2)·g²;
/// p = p·(1 - lr·decay) - lr·(m / (1-b1^t)) / (sqrt(v' / (1-b2^t)) + eps)` with
/// `v' = max(vmax, v)` under AMSGrad. `store` rounds the new moments as their storage
/// does (the identity for float64 moments). Returns `(p, m, v, vmax)`.
#[allow(clippy::too_many_arguments)]
pub fn adam_step(
    p: &[f64],
    g: &[f64],
    m: &[f64],
    v: &[f64],
    vmax: &[f64],
    step: u64,
    lr: f64,
    (beta1, beta2, eps): (f64, f64, f64),
    (l2, decay): (f64, f64),
    amsgrad: bool,
    store: impl Fn(f64) -> f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let t = step as i32;
    let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
    let mut out = (vec![], vec![], vec![], vec![]);
    for i in 0..p.len() {
        let gi = g[i] + l2 * p[i];
        let mi = store(beta1 * m.get(i).copied().unwrap_or(0.0) + (1.0 - beta1) * gi);
        let vi = store(beta2 * v.get(i).copied().unwrap_or(0.0) + (1.0 - beta2) * gi * gi);
        let vu = if amsgrad {
            vmax.get(i).copied().unwrap_or(vi).max(vi)
        } else {
            vi
        };
        let upd = (mi / bc1) / ((vu / bc2).sqrt() + eps);
        out.0.push(p[i] - p[i] * lr * decay - lr * upd);
        out.1.push(mi);
        out.2.push(vi);
        out.3.push(vu);
    }
    out
}

/// The gradients `(dx, dw, db)` of [`norm`] for the output gradient `dy`, from the forward's
/// row means and inverse standard deviations.
pub fn norm_backward(
    x: &[f64],
    dy: &[f64],
    features: usize,
    w: &[f64],
    centred: bool,
    means: &[f64],
    invs: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = features as f64;
    let (mut dx, mut dw, mut db) = (Vec::with_capacity(x.len()), vec![0.0; features], vec![0.0; features]);
    for (r, (xr, dyr)) in x.chunks(features).zip(dy.chunks(features)).enumerate() {
        let (m, inv) = (means[r], invs[r]);
        let xhat: Vec<f64> = xr.iter().map(|v| (v - m) * inv).collect();
        let g: Vec<f64> = dyr.iter().zip(w).map(|(d, w)| d * w).collect();
        let a = if centred { g.iter().sum::<f64>() / n } else { 0.0 };
        let b = g.iter().zip(&xhat).map(|(g, h)| g * h).sum::<f64>() / n;
        dx.extend(g.iter().zip(&xhat).map(|(g, h)| inv * (g - a - h * b)));
        for i in 0..features {
            dw[i] += dyr[i] * xhat[i];
            db[i] += dyr[i];
        }
    }
    (dx, dw, db)
}

// ---------------------------------------------------------------------------
// CTC loss
// ---------------------------------------------------------------------------

/// A batch of CTC problems: `log_probs` `[T, N, C]`, `targets` `[N, S]` (padded), and the
/// per-sample input and target lengths.
#[derive(Clone, Copy, Debug)]
pub struct CtcProblem<'a> {
    /// Log-probabilities, row-major `[T, N, C]`.
    pub log_probs: &'a [f64],
    /// `[T, N, C]`.
    pub dims: [usize; 3],
    /// Target labels, row-major `[N, S]`.
    pub targets: &'a [i64],
    /// `S`, the padded target length.
    pub max_target_len: usize,
    /// Input length of each sample (clamped to `[0, T]`).
    pub input_lengths: &'a [i64],
    /// Target length of each sample (clamped to `[0, S]`).
    pub target_lengths: &'a [i64],
    /// The blank class.
    pub blank: i64,
}

/// `log(exp(a) + exp(b))`, `-inf` when both are.
fn log_add(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + (-(a - b).abs()).exp().ln_1p()
}

impl CtcProblem<'_> {
    fn check(&self) {
        let [t, n, c] = self.dims;
        assert!(t > 0, "CTC needs at least one input step");
        assert_eq!(
            self.log_probs.len(),
            t * n * c,
            "log_probs is not [T, N, C] = {:?}",
            self.dims
        );
        assert_eq!(self.targets.len(), n * self.max_target_len, "targets is not [N, S]");
        assert_eq!(self.input_lengths.len(), n, "input_lengths is not [N]");
        assert_eq!(self.target_lengths.len(), n, "target_lengths is not [N]");
    }

    /// Label `s` of sample `n`'s blank-extended target `[b, y1, b, y2, ..., b]`.
    fn label(&self, n: usize, s: usize) -> i64 {
        if s.is_multiple_of(2) {
            self.blank
        } else {
            self.targets[n * self.max_target_len + s / 2]
        }
    }

    /// `log_probs[t, n, class]`, `-inf` for a class outside `[0, C)`.
    fn lp(&self, t: usize, n: usize, class: i64) -> f64 {
        let [_, nn, c] = self.dims;
        if class < 0 || class as usize >= c {
            return f64::NEG_INFINITY;
        }
        self.log_probs[(t * nn + n) * c + class as usize]
    }

    /// Sample `n`'s input length clamped to `[1, T]` (Burn reads the first step of an empty
    /// input) and target length clamped to `[0, S]`.
    fn lengths(&self, n: usize) -> (usize, usize) {
        let len = self.input_lengths[n].clamp(1, self.dims[0] as i64) as usize;
        let tl = self.target_lengths[n].clamp(0, self.max_target_len as i64) as usize;
        (len, tl)
    }

    /// Whether the path may skip from `s - 2` to `s` (a label differing from the previous one).
    fn may_skip(&self, n: usize, s: usize) -> bool {
        s >= 2 && self.label(n, s) != self.blank && self.label(n, s) != self.label(n, s - 2)
    }

    /// Sample `n`'s log forward variables `[T][2S + 1]`: rows from the sample's input length
    /// on repeat the last computed one.
    fn alpha(&self, n: usize) -> Vec<Vec<f64>> {
        let (len, tl) = self.lengths(n);
        let (steps, valid) = (self.dims[0], 2 * tl + 1);
        let width = 2 * self.max_target_len + 1;
        let mut rows = vec![vec![f64::NEG_INFINITY; width]; steps];
        for (s, v) in rows[0].iter_mut().enumerate().take(valid.min(2)) {
            *v = self.lp(0, n, self.label(n, s));
        }
        for t in 1..steps {
            let prev = rows[t - 1].clone();
            if t >= len {
                rows[t] = prev;
                continue;
            }
            for s in 0..valid {
                let mut a = prev[s];
                if s >= 1 {
                    a = log_add(a, prev[s - 1]);
                }
                if self.may_skip(n, s) {
                    a = log_add(a, prev[s - 2]);
                }
                rows[t][s] = a + self.lp(t, n, self.label(n, s));
            }
        }
        rows
    }

    /// Sample `n`'s log backward variables `[T][2S + 1]` (`-inf` from its input length on).
    fn beta(&self, n: usize) -> Vec<Vec<f64>> {
        let (len, tl) = self.lengths(n);
        let valid = 2 * tl + 1;
        let width = 2 * self.max_target_len + 1;
        let mut rows = vec![vec![f64::NEG_INFINITY; width]; self.dims[0]];
        let first = valid.saturating_sub(2);
        for (s, v) in rows[len - 1].iter_mut().enumerate().take(valid).skip(first) {
            *v = self.lp(len - 1, n, self.label(n, s));
        }
        for t in (0..len - 1).rev() {
            for s in 0..valid {
                let next = &rows[t + 1];
                let mut b = next[s];
                if s + 1 < valid {
                    b = log_add(b, next[s + 1]);
                }
                if s + 2 < valid && self.may_skip(n, s + 2) {
                    b = log_add(b, next[s + 2]);
                }
                rows[t][s] = b + self.lp(t, n, self.label(n, s));
            }
        }
        rows
    }

    /// Sample `n`'s negative log-likelihood from its forward variables.
    fn nll_of(&self, n: usize, alpha: &[Vec<f64>]) -> f64 {
        let (len, tl) = self.lengths(n);
        let last = &alpha[len - 1];
        let mut ll = last[2 * tl];
        if tl > 0 {
            ll = log_add(ll, last[2 * tl - 1]);
        }
        -ll
    }
}

/// CTC loss per sample (`-log p(target | input)`, `+inf` where no alignment exists), as Burn's
/// `ctc_loss` defines it: lengths are clamped to the tensor extents (an input length below 1
/// reads the first step) and a class outside `[0, C)` has probability 0.
pub fn ctc_loss(p: &CtcProblem) -> Vec<f64> {
    p.check();
    (0..p.dims[1]).map(|n| p.nll_of(n, &p.alpha(n))).collect()
}

/// Gradient of `sum_n grad_loss[n] * ctc_loss[n]` with respect to `log_probs` (`[T, N, C]`):
/// `-grad_loss[n]` times the posterior of the alignments through each `(t, class)`; zero
/// from a sample's (clamped) input length on and for samples without an alignment.
pub fn ctc_loss_backward(p: &CtcProblem, grad_loss: &[f64]) -> Vec<f64> {
    p.check();
    let [steps, batch, classes] = p.dims;
    assert_eq!(grad_loss.len(), batch, "grad_loss is not [N]");
    let mut grad = vec![0.0; steps * batch * classes];
    for n in 0..batch {
        let (alpha, beta) = (p.alpha(n), p.beta(n));
        let nll = p.nll_of(n, &alpha);
        if nll == f64::INFINITY {
            continue;
        }
        let (len, tl) = p.lengths(n);
        for t in 0..len {
            for s in 0..2 * tl + 1 {
                let (a, b) = (alpha[t][s], beta[t][s]);
                let class = p.label(n, s);
                if a == f64::NEG_INFINITY || b == f64::NEG_INFINITY || class < 0 || class as usize >= classes {
                    continue;
                }
                let posterior = (a + b - p.lp(t, n, class) + nll).exp();
                grad[(t * batch + n) * classes + class as usize] -= grad_loss[n] * posterior;
            }
        }
    }
    grad
}

// ---------------------------------------------------------------------------
// Cross-entropy
// ---------------------------------------------------------------------------

/// What [`cross_entropy`] computes over logits rows.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyOutput {
    /// `lse - x[target]` per row: 0 on ignored rows, NaN where the target is outside
    /// `[0, classes)` and not ignored.
    pub row_loss: Vec<f64>,
    /// `log(sum(exp(x)))` per row (0 on ignored rows).
    pub lse: Vec<f64>,
    /// The summed row losses over every row, or with `targets_only` over the rows not ignored.
    pub mean: f64,
}

/// Whether `target` is ignored (`Some(false)`), a class of `[0, classes)` (`Some(true)`), or
/// out of range (`None`).
fn class_of(target: i64, classes: usize, ignore: &[i64]) -> Option<bool> {
    if ignore.contains(&target) {
        Some(false)
    } else {
        (0..classes as i64).contains(&target).then_some(true)
    }
}

/// The denominator of [`cross_entropy`]'s mean.
fn xent_denominator(targets: &[i64], classes: usize, ignore: &[i64], targets_only: bool) -> f64 {
    if targets_only {
        targets
            .iter()
            .filter(|&&t| class_of(t, classes, ignore) != Some(false))
            .count() as f64
    } else {
        targets.len() as f64
    }
}

/// Cross-entropy of row-major logits `[targets.len(), classes]` against class `targets`:
/// rows whose target is in `ignore` have loss 0 (Burn's `pad_tokens`); the mean divides by
/// every row (Burn's `CrossEntropyLoss`) or, with `targets_only`, by the rows not ignored
/// (PyTorch's `ignore_index`). Panics on inconsistent lengths.
pub fn cross_entropy(
    logits: &[f64],
    classes: usize,
    targets: &[i64],
    ignore: &[i64],
    targets_only: bool,
) -> CrossEntropyOutput {
    assert!(classes > 0, "cross_entropy: no classes");
    assert_eq!(
        logits.len(),
        targets.len() * classes,
        "cross_entropy: logits are not [rows, classes]"
    );
    let (mut row_loss, mut lse) = (Vec::with_capacity(targets.len()), Vec::with_capacity(targets.len()));
    for (row, &t) in logits.chunks(classes).zip(targets) {
        let Some(valid) = class_of(t, classes, ignore) else {
            lse.push(log_sum_exp(row));
            row_loss.push(f64::NAN);
            continue;
        };
        if !valid {
            lse.push(0.0);
            row_loss.push(0.0);
            continue;
        }
        let l = log_sum_exp(row);
        lse.push(l);
        row_loss.push(l - row[t as usize]);
    }
    let mean = row_loss.iter().sum::<f64>() / xent_denominator(targets, classes, ignore, targets_only);
    CrossEntropyOutput { row_loss, lse, mean }
}

/// Gradient of `grad ·` [`cross_entropy`]`(...).mean` with respect to the logits:
/// `grad / denominator · (softmax(row) - onehot(target))`, zero on ignored rows, NaN on rows
/// whose target is out of range.
pub fn cross_entropy_backward(
    logits: &[f64],
    classes: usize,
    targets: &[i64],
    ignore: &[i64],
    targets_only: bool,
    grad: f64,
) -> Vec<f64> {
    assert!(classes > 0, "cross_entropy_backward: no classes");
    assert_eq!(
        logits.len(),
        targets.len() * classes,
        "cross_entropy_backward: logits are not [rows, classes]"
    );
    let scale = grad / xent_denominator(targets, classes, ignore, targets_only);
    let mut dx = Vec::with_capacity(logits.len());
    for (row, &t) in logits.chunks(classes).zip(targets) {
        match class_of(t, classes, ignore) {
            None => dx.extend(row.iter().map(|_| f64::NAN)),
            Some(false) => dx.extend(row.iter().map(|_| 0.0)),
            Some(true) => {
                let l = log_sum_exp(row);
                dx.extend(
                    row.iter()
                        .enumerate()
                        .map(|(c, &x)| scale * ((x - l).exp() - f64::from(c as i64 == t))),
                );
            }
        }
    }
    dx
}

/// `log(sum(exp(row)))`, shifted by the row's maximum.
fn log_sum_exp(row: &[f64]) -> f64 {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + row.iter().map(|&x| (x - m).exp()).sum::<f64>().ln()
}

// ---------------------------------------------------------------------------
// Layout helpers
// ---------------------------------------------------------------------------

/// Row-major (contiguous) strides of `dims`, in elements.
pub fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Strides (in logical `N, C, spatial…` axis order) of a channels-last
/// memory layout `N, spatial…, C` (e.g. NHWC). Panics if `dims.len() < 2`.
pub fn channels_last_strides(dims: &[usize]) -> Vec<usize> {
    assert!(dims.len() >= 2, "channels_last_strides: dims {dims:?} need N and C");
    let mut mem_dims = vec![dims[0]];
    mem_dims.extend_from_slice(&dims[2..]);
    mem_dims.push(dims[1]);
    let ms = contiguous_strides(&mem_dims);
    let mut s = vec![ms[0], 1];
    s.extend_from_slice(&ms[1..ms.len() - 1]);
    s
}

/// Minimum buffer length addressed by a strided view:
/// `1 + Σ (d−1)·s`, or 0 if any dim is 0.
pub fn strided_len(dims: &[usize], strides: &[usize]) -> usize {
    assert_eq!(dims.len(), strides.len(), "strided_len: dims/strides rank mismatch");
    if dims.contains(&0) {
        return 0;
    }
    1 + dims.iter().zip(strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>()
}

/// Writes a logical row-major tensor into a strided buffer:
/// `out[Σ idx·stride] = logical[row-major idx]`. Elements of `out` not
/// addressed by the view are left untouched. Panics if `out` is too short.
pub fn scatter_to_strided<T: Copy>(logical: &[T], dims: &[usize], strides: &[usize], out: &mut [T]) {
    check_len("scatter_to_strided logical", logical.len(), dims);
    let need = strided_len(dims, strides);
    assert!(
        out.len() >= need,
        "scatter_to_strided: buffer has {} elements, view needs {need}",
        out.len()
    );
    for (&v, o) in logical.iter().zip(offsets(dims, strides)) {
        out[o] = v;
    }
}

/// Reads a strided buffer into a logical row-major tensor (inverse of
/// [`scatter_to_strided`]). Panics if `buf` is too short.
pub fn gather_from_strided<T: Copy>(buf: &[T], dims: &[usize], strides: &[usize]) -> Vec<T> {
    let need = strided_len(dims, strides);
    assert!(
        buf.len() >= need,
        "gather_from_strided: buffer has {} elements, view needs {need}",
        buf.len()
    );
    offsets(dims, strides).into_iter().map(|o| buf[o]).collect()
}

// ---------------------------------------------------------------------------
// Comparison and random data
// ---------------------------------------------------------------------------

/// Relative L2 error `‖out − ref‖₂ / ‖ref‖₂`. Returns `+∞` if `out` contains
/// NaN/±∞ or the lengths differ; returns `‖out‖₂` when `‖ref‖₂ = 0`.
pub fn rel_l2_error(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let ref_norm = reference.iter().map(|r| r * r).sum::<f64>().sqrt();
    if ref_norm == 0.0 {
        return out.iter().map(|o| o * o).sum::<f64>().sqrt();
    }
    let diff = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o - r) * (o - r))
        .sum::<f64>()
        .sqrt();
    diff / ref_norm
}

/// Tiny deterministic SplitMix64 generator for reproducible test inputs.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Creates a generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// Next raw 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform value in `[-1, 1)` (53-bit resolution).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (2.0 / (1u64 << 53) as f64) - 1.0
    }

    /// Value in `0..n` (multiply-shift; bias below `n / 2⁶⁴`). Panics if `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "SplitMix64::below: n must be > 0");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// `n` values from [`SplitMix64::next_f64`].
    pub fn fill(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next_f64()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(pre: &[usize], post: &[usize], stride: &[usize], dil: &[usize], groups: usize) -> ConvGeometry {
        ConvGeometry {
            pre_padding: pre.to_vec(),
            post_padding: post.to_vec(),
            stride: stride.to_vec(),
            dilation: dil.to_vec(),
            groups,
        }
    }

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn norm(a: &[f64]) -> f64 {
        dot(a, a).sqrt()
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len(), "length mismatch");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= tol * (1.0 + y.abs()),
                "index {i}: {x} vs {y}\n{a:?}\n{b:?}"
            );
        }
    }

    #[test]
    fn conv1d_padding_by_hand() {
        let x = [1.0, 2.0, 3.0];
        let w = [1.0, 10.0, 100.0];
        let g = geom(&[1], &[1], &[1], &[1], 1);
        assert_eq!(g.output_dims(&[1, 1, 3], &[1, 1, 3]), vec![1, 1, 3]);
        // Cross-correlation: y[o] = Σ_r x[o + r - pre]·w[r].
        assert_eq!(
            conv_forward(&x, &[1, 1, 3], &w, &[1, 1, 3], &g),
            vec![210.0, 321.0, 32.0]
        );
        let g = geom(&[2], &[0], &[1], &[1], 1);
        assert_eq!(
            conv_forward(&x, &[1, 1, 3], &w, &[1, 1, 3], &g),
            vec![100.0, 210.0, 321.0]
        );
    }

    #[test]
    fn conv2d_stride2_dilation2_by_hand() {
        // x[a][b] = 5a + b, w = [[1,2],[3,4]], stride 2, dilation 2, no padding.
        let x: Vec<f64> = (0..25).map(f64::from).collect();
        let w = [1.0, 2.0, 3.0, 4.0];
        let g = geom(&[0, 0], &[0, 0], &[2, 2], &[2, 2], 1);
        assert_eq!(g.output_dims(&[1, 1, 5, 5], &[1, 1, 2, 2]), vec![1, 1, 2, 2]);
        let y = conv_forward(&x, &[1, 1, 5, 5], &w, &[1, 1, 2, 2], &g);
        assert_eq!(y, vec![82.0, 102.0, 182.0, 202.0]);
        // With 2 channels and K = 2 (second filter = 2x first, second channel = -x).
        let mut x2 = x.clone();
        x2.extend(x.iter().map(|v| -v));
        let mut w2 = vec![1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 1.0];
        w2.extend(w2.clone().iter().map(|v| 2.0 * v));
        let y2 = conv_forward(&x2, &[1, 2, 5, 5], &w2, &[2, 2, 2, 2], &g);
        // filter0: ch0 · w − ch1 · x[2o0+2][2o1+2]
        let e0 = [82.0 - 12.0, 102.0 - 14.0, 182.0 - 22.0, 202.0 - 24.0];
        let mut e = e0.to_vec();
        e.extend(e0.iter().map(|v| 2.0 * v));
        assert_eq!(y2, e);
    }

    #[test]
    fn grouped_conv_equals_separate_convs() {
        let mut rng = SplitMix64::new(7);
        let (xd, wd) = ([2, 4, 5, 6], [6, 2, 3, 3]);
        let x = rng.fill(product(&xd));
        let w = rng.fill(product(&wd));
        let g = geom(&[1, 0], &[1, 2], &[1, 2], &[1, 1], 2);
        let y = conv_forward(&x, &xd, &w, &wd, &g);
        let yd = g.output_dims(&xd, &wd);
        let g1 = ConvGeometry { groups: 1, ..g.clone() };
        let plane = 5 * 6;
        let mut expect = Vec::new();
        let parts: Vec<Vec<f64>> = (0..2)
            .map(|grp| {
                let xs: Vec<f64> = (0..2)
                    .flat_map(|n| x[(n * 4 + 2 * grp) * plane..(n * 4 + 2 * grp + 2) * plane].to_vec())
                    .collect();
                let ws = &w[grp * 3 * 18..(grp + 1) * 3 * 18];
                conv_forward(&xs, &[2, 2, 5, 6], ws, &[3, 2, 3, 3], &g1)
            })
            .collect();
        let oplane = yd[2] * yd[3];
        for n in 0..2 {
            for part in &parts {
                expect.extend_from_slice(&part[n * 3 * oplane..(n + 1) * 3 * oplane]);
            }
        }
        assert_eq!(yd, vec![2, 6, 5, 3]);
        assert_close(&y, &expect, 1e-14);
    }

    /// (x dims, w dims, geometry) cases covering ranks 1-3, groups, stride,
    /// dilation and asymmetric padding.
    fn adjoint_cases() -> Vec<(Vec<usize>, Vec<usize>, ConvGeometry)> {
        vec![
            (vec![2, 3, 11], vec![4, 3, 3], geom(&[2], &[0], &[2], &[1], 1)),
            (vec![1, 6, 13], vec![6, 2, 3], geom(&[0], &[3], &[1], &[2], 3)),
            (
                vec![2, 3, 8, 9],
                vec![5, 3, 3, 2],
                geom(&[1, 0], &[0, 2], &[2, 1], &[1, 2], 1),
            ),
            (
                vec![2, 6, 9, 7],
                vec![9, 2, 3, 3],
                geom(&[2, 1], &[1, 0], &[2, 2], &[2, 1], 3),
            ),
            (
                vec![1, 2, 5, 6, 7],
                vec![3, 2, 2, 3, 2],
                geom(&[1, 0, 2], &[0, 1, 1], &[1, 2, 2], &[2, 1, 2], 1),
            ),
            (
                vec![2, 3, 6, 5, 7],
                vec![6, 1, 3, 2, 3],
                geom(&[0, 2, 1], &[2, 0, 0], &[2, 1, 3], &[1, 2, 1], 3),
            ),
            // Large enough to take the multi-threaded path.
            (
                vec![2, 8, 16, 16],
                vec![16, 4, 3, 3],
                geom(&[1, 0], &[1, 2], &[1, 1], &[1, 2], 2),
            ),
        ]
    }

    #[test]
    fn conv_backward_is_adjoint_of_forward() {
        let mut rng = SplitMix64::new(42);
        for (xd, wd, g) in adjoint_cases() {
            let yd = g.output_dims(&xd, &wd);
            let x = rng.fill(product(&xd));
            let w = rng.fill(product(&wd));
            let dy = rng.fill(product(&yd));
            let y = conv_forward(&x, &xd, &w, &wd, &g);
            assert_eq!(y.len(), product(&yd));
            let dx = conv_backward_data(&dy, &yd, &w, &wd, &xd, &g);
            let dw = conv_backward_filter(&x, &xd, &dy, &yd, &wd, &g);
            let lhs = dot(&y, &dy);
            let via_x = dot(&x, &dx);
            let via_w = dot(&w, &dw);
            let scale = lhs.abs().max(1e-3 * norm(&y) * norm(&dy));
            assert!((lhs - via_x).abs() <= 1e-9 * scale, "{xd:?} {g:?}: {lhs} vs {via_x}");
            assert!((lhs - via_w).abs() <= 1e-9 * scale, "{xd:?} {g:?}: {lhs} vs {via_w}");
            // Also compare the full dx / dw against the finite-difference-free
            // Jacobian-transpose applied to a few basis vectors.
            for _ in 0..3 {
                let i = rng.below(x.len() as u64) as usize;
                let mut e = vec![0.0; x.len()];
                e[i] = 1.0;
                let col = conv_forward(&e, &xd, &w, &wd, &g);
                assert!((dot(&col, &dy) - dx[i]).abs() < 1e-12, "dx[{i}]");
                let j = rng.below(w.len() as u64) as usize;
                let mut e = vec![0.0; w.len()];
                e[j] = 1.0;
                let col = conv_forward(&x, &xd, &e, &wd, &g);
                assert!((dot(&col, &dy) - dw[j]).abs() < 1e-12, "dw[{j}]");
            }
        }
    }

    #[test]
    fn conv_output_dims_formula() {
        let g = geom(&[1, 2], &[0, 3], &[2, 3], &[2, 1], 1);
        // (10+1+0-2*2-1)/2+1 = 4 ; (7+2+3-3)/3+1 = 4
        assert_eq!(g.output_dims(&[3, 4, 10, 7], &[8, 4, 3, 3]), vec![3, 8, 4, 4]);
    }

    #[test]
    #[should_panic(expected = "groups")]
    fn conv_bad_groups_panics() {
        let g = geom(&[0], &[0], &[1], &[1], 2);
        g.output_dims(&[1, 3, 5], &[2, 1, 3]);
    }

    #[test]
    #[should_panic(expected = "C/groups")]
    fn conv_bad_filter_channels_panics() {
        let g = geom(&[0], &[0], &[1], &[1], 1);
        g.output_dims(&[1, 3, 5], &[2, 2, 3]);
    }

    #[test]
    fn matmul_by_hand() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let (c, d) = matmul(&a, &[2, 3], &b, &[3, 2]);
        assert_eq!(d, vec![2, 2]);
        assert_eq!(c, vec![58.0, 64.0, 139.0, 154.0]);
    }

    #[test]
    fn matmul_broadcast_batch() {
        let mut rng = SplitMix64::new(3);
        let (m, k, n) = (2, 3, 4);
        let a = rng.fill(2 * m * k);
        let b = rng.fill(3 * k * n);
        let (c, d) = matmul(&a, &[2, 1, m, k], &b, &[1, 3, k, n]);
        assert_eq!(d, vec![2, 3, m, n]);
        for i in 0..2 {
            for j in 0..3 {
                let ai = &a[i * m * k..(i + 1) * m * k];
                let bj = &b[j * k * n..(j + 1) * k * n];
                let blk = &c[(i * 3 + j) * m * n..(i * 3 + j + 1) * m * n];
                for r in 0..m {
                    for s in 0..n {
                        let e: f64 = (0..k).map(|p| ai[r * k + p] * bj[p * n + s]).sum();
                        assert!((blk[r * n + s] - e).abs() < 1e-14);
                    }
                }
                let (cij, _) = matmul(ai, &[m, k], bj, &[k, n]);
                assert_eq!(blk, cij.as_slice());
            }
        }
        // Rank mismatch: [M,K] @ [3,K,N] broadcasts a over the batch.
        let (c2, d2) = matmul(&a[..m * k], &[m, k], &b, &[3, k, n]);
        assert_eq!(d2, vec![3, m, n]);
        let (c3, _) = matmul(&a[..m * k], &[1, m, k], &b, &[3, k, n]);
        assert_eq!(c2, c3);
        assert_eq!(&c2[..m * n], &c[..m * n]);
    }

    #[test]
    fn matmul_large_matches_naive() {
        // 2 x 48 x 64 x 40 flops: takes the multi-threaded path.
        let mut rng = SplitMix64::new(17);
        let (bt, m, k, n) = (2, 48, 64, 40);
        let a = rng.fill(bt * m * k);
        let b = rng.fill(k * n);
        let (c, d) = matmul(&a, &[bt, m, k], &b, &[1, k, n]);
        assert_eq!(d, vec![bt, m, n]);
        for r in 0..bt * m {
            for j in 0..n {
                let e: f64 = (0..k).map(|p| a[r * k + p] * b[p * n + j]).sum();
                assert!((c[r * n + j] - e).abs() < 1e-12);
            }
        }
    }

    #[test]
    #[should_panic(expected = "broadcast")]
    fn matmul_bad_broadcast_panics() {
        matmul(&[0.0; 8], &[2, 2, 2], &[0.0; 12], &[3, 2, 2]);
    }

    fn pool_geom(mode: PoolMode, win: &[usize], stride: &[usize], pre: &[usize], post: &[usize]) -> PoolGeometry {
        PoolGeometry {
            window: win.to_vec(),
            stride: stride.to_vec(),
            pre_padding: pre.to_vec(),
            post_padding: post.to_vec(),
            mode,
        }
    }

    #[test]
    fn pool_padded_border_by_hand() {
        let x: Vec<f64> = (1..=9).map(f64::from).collect();
        let xd = [1, 1, 3, 3];
        let mk = |mode| pool_geom(mode, &[2, 2], &[2, 2], &[1, 1], &[1, 1]);
        assert_eq!(mk(PoolMode::Max).output_dims(&xd), vec![1, 1, 2, 2]);
        // Windows: {1}, {2,3}, {4,7}, {5,6,8,9}.
        assert_eq!(pool_forward(&x, &xd, &mk(PoolMode::Max)), vec![1.0, 3.0, 7.0, 9.0]);
        assert_eq!(
            pool_forward(&x, &xd, &mk(PoolMode::AvgIncludePadding)),
            vec![0.25, 1.25, 2.75, 7.0]
        );
        assert_eq!(
            pool_forward(&x, &xd, &mk(PoolMode::AvgExcludePadding)),
            vec![1.0, 2.5, 5.5, 7.0]
        );
        let dy = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(
            pool_backward(&x, &xd, &dy, &mk(PoolMode::Max)),
            vec![1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 3.0, 0.0, 4.0]
        );
        assert_eq!(
            pool_backward(&x, &xd, &dy, &mk(PoolMode::AvgIncludePadding)),
            vec![0.25, 0.5, 0.5, 0.75, 1.0, 1.0, 0.75, 1.0, 1.0]
        );
        assert_eq!(
            pool_backward(&x, &xd, &dy, &mk(PoolMode::AvgExcludePadding)),
            vec![1.0, 1.0, 1.0, 1.5, 1.0, 1.0, 1.5, 1.0, 1.0]
        );
        // Ties: the first maximal element in row-major order gets dy.
        let g = pool_geom(PoolMode::Max, &[2, 2], &[2, 2], &[0, 0], &[0, 0]);
        assert_eq!(
            pool_backward(&[5.0; 4], &[1, 1, 2, 2], &[3.0], &g),
            vec![3.0, 0.0, 0.0, 0.0]
        );
        let t = [1.0, 7.0, 7.0, 2.0];
        assert_eq!(pool_backward(&t, &[1, 1, 2, 2], &[3.0], &g), vec![0.0, 3.0, 0.0, 0.0]);
    }

    /// (x dims, window, stride, pre, post).
    type PoolCase = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>);

    fn pool_cases() -> Vec<PoolCase> {
        vec![
            (vec![2, 3, 10], vec![3], vec![2], vec![1], vec![2]),
            (vec![2, 2, 7, 8], vec![3, 2], vec![2, 3], vec![1, 0], vec![2, 1]),
            (
                vec![1, 2, 5, 6, 4],
                vec![2, 3, 2],
                vec![1, 2, 2],
                vec![1, 2, 0],
                vec![0, 1, 1],
            ),
        ]
    }

    #[test]
    fn avg_pool_backward_is_adjoint() {
        let mut rng = SplitMix64::new(11);
        for mode in [PoolMode::AvgIncludePadding, PoolMode::AvgExcludePadding] {
            let mut cases = pool_cases();
            // Large enough to take the multi-threaded path.
            cases.push((vec![2, 4, 64, 64], vec![3, 3], vec![2, 1], vec![1, 2], vec![1, 0]));
            for (xd, win, st, pre, post) in cases {
                let g = pool_geom(mode, &win, &st, &pre, &post);
                let x = rng.fill(product(&xd));
                let dy = rng.fill(product(&g.output_dims(&xd)));
                let y = pool_forward(&x, &xd, &g);
                let dx = pool_backward(&x, &xd, &dy, &g);
                let (a, b) = (dot(&y, &dy), dot(&x, &dx));
                assert!(
                    (a - b).abs() <= 1e-12 * norm(&y) * norm(&dy),
                    "{mode:?} {xd:?}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn attention_score_gradient_matches_finite_differences() {
        let mut rng = SplitMix64::new(21);
        let sizes @ [heads, lq, lk, d, dv] = [2, 3, 4, 5, 3];
        let (q, k, v) = (
            rng.fill(heads * lq * d),
            rng.fill(heads * lk * d),
            rng.fill(heads * lk * dv),
        );
        let (d_o, bias) = (rng.fill(heads * lq * dv), rng.fill(heads * lq * lk));
        let loss = |bias: &[f64]| {
            let f = |hd: usize, i: usize, j: usize| bias[(hd * lq + i) * lk + j];
            dot(&attention(&q, &k, &v, sizes, 0.4, Some(&f)).0, &d_o)
        };
        let f = |hd: usize, i: usize, j: usize| bias[(hd * lq + i) * lk + j];
        let (dq, _, _, d_scores) = attention_backward_with_scores(&q, &k, &v, &d_o, sizes, 0.4, Some(&f));
        assert_eq!(dq, attention_backward(&q, &k, &v, &d_o, sizes, 0.4, Some(&f)).0);
        let h = 1e-6;
        for i in 0..bias.len() {
            let (mut bp, mut bm) = (bias.clone(), bias.clone());
            bp[i] += h;
            bm[i] -= h;
            let fd = (loss(&bp) - loss(&bm)) / (2.0 * h);
            assert!(
                (fd - d_scores[i]).abs() < 1e-7,
                "d_scores[{i}] = {} vs fd {fd}",
                d_scores[i]
            );
        }
    }

    #[test]
    fn max_pool_backward_matches_finite_differences() {
        let mut rng = SplitMix64::new(5);
        for (xd, win, st, pre, post) in pool_cases() {
            let g = pool_geom(PoolMode::Max, &win, &st, &pre, &post);
            let x = rng.fill(product(&xd)); // distinct with probability ~1
            let dy = rng.fill(product(&g.output_dims(&xd)));
            let dx = pool_backward(&x, &xd, &dy, &g);
            let loss = |x: &[f64]| dot(&pool_forward(x, &xd, &g), &dy);
            let h = 1e-7;
            for i in 0..x.len() {
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[i] += h;
                xm[i] -= h;
                let fd = (loss(&xp) - loss(&xm)) / (2.0 * h);
                assert!((fd - dx[i]).abs() < 1e-6, "{xd:?} dx[{i}] = {} vs fd {fd}", dx[i]);
            }
            assert!(dx.iter().any(|&v| v != 0.0));
        }
    }

    fn all_activations() -> Vec<Activation> {
        vec![
            Activation::Identity,
            Activation::Relu,
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Sigmoid,
            Activation::Tanh,
            Activation::Elu { alpha: 0.7 },
            Activation::Swish { beta: 1.3 },
        ]
    }

    #[test]
    fn activation_values() {
        // erf reference values (from high-precision tables).
        for (x, e) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (-1.5, -0.966_105_146_475_310_7),
            (3.5, 0.999_999_256_901_627_7),
        ] {
            assert!((erf(x) - e).abs() < 3e-16, "erf({x}) = {} vs {e}", erf(x));
        }
        assert!((erf(1e-10) / 1.128_379_167_095_512_6e-10 - 1.0).abs() < 1e-15);
        for (x, e) in [(3.0, 2.209_049_699_858_544e-5), (5.0, 1.537_459_794_428_035e-12)] {
            assert!((erfc(x) / e - 1.0).abs() < 1e-15, "erfc({x})");
            assert!((erfc(-x) + erfc(x) - 2.0).abs() < 1e-15, "erfc(-{x})");
        }
        // Far negative tail: GELU(-10) = -10 · Φ(-10) = -10 · 7.619853024160527e-24.
        let g = activation(Activation::Gelu, -10.0);
        assert!((g / -7.619_853_024_160_527e-23 - 1.0).abs() < 1e-14, "{g}");
        assert!((activation(Activation::Gelu, 1.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
        assert!((activation(Activation::GeluTanh, 1.0) - 0.841_191_990_608_276_8).abs() < 1e-15);
        assert_eq!(activation(Activation::Relu, -2.0), 0.0);
        assert_eq!(activation(Activation::Relu, 2.0), 2.0);
        assert!((activation(Activation::Sigmoid, 0.0) - 0.5).abs() < 1e-16);
        assert!((activation(Activation::Sigmoid, -800.0)).abs() < 1e-300);
        assert!((activation(Activation::Elu { alpha: 2.0 }, -1.0) - 2.0 * ((-1.0f64).exp() - 1.0)).abs() < 1e-15);
        let s = activation(Activation::Swish { beta: 2.0 }, 1.5);
        assert!((s - 1.5 / (1.0 + (-3.0f64).exp())).abs() < 1e-15);
    }

    #[test]
    fn activation_backward_matches_finite_differences() {
        let mut rng = SplitMix64::new(9);
        for act in all_activations() {
            for _ in 0..200 {
                let mut x = 4.0 * rng.next_f64();
                if x.abs() < 1e-2 {
                    x += 0.1;
                }
                let dy = rng.next_f64();
                let h = 1e-5;
                let fd = (activation(act, x + h) - activation(act, x - h)) / (2.0 * h) * dy;
                let an = activation_backward(act, x, dy);
                assert!((fd - an).abs() < 1e-8, "{act:?} at {x}: {an} vs fd {fd}");
            }
        }
    }

    #[test]
    fn bias_activation_by_hand() {
        // NCHW [2, 2, 1, 2], channel axis 1.
        let mut y = vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0, 7.0, -8.0];
        bias_activation(&mut y, &[2, 2, 1, 2], 1, &[0.5, 10.0], Activation::Relu);
        assert_eq!(y, vec![1.5, 0.0, 13.0, 6.0, 5.5, 0.0, 17.0, 2.0]);
        // Channel-last [2, 2]: axis 1 is innermost.
        let mut y = vec![1.0, 2.0, 3.0, 4.0];
        bias_activation(&mut y, &[2, 2], 1, &[-1.0, 1.0], Activation::Identity);
        assert_eq!(y, vec![0.0, 3.0, 2.0, 5.0]);
    }

    #[test]
    fn reduce_by_hand() {
        let x: Vec<f64> = (0..24).map(f64::from).collect(); // dims [2,3,4], x = 12i + 4j + k
        let s = reduce(&x, &[2, 3, 4], &[1], ReduceOp::Sum);
        let e: Vec<f64> = (0..2)
            .flat_map(|i| (0..4).map(move |k| (36 * i + 12 + 3 * k) as f64))
            .collect();
        assert_eq!(s, e);
        assert_eq!(reduce(&x, &[2, 3, 4], &[0, 2], ReduceOp::Max), vec![15.0, 19.0, 23.0]);
        assert_eq!(reduce(&x, &[2, 3, 4], &[2, 0], ReduceOp::Min), vec![0.0, 4.0, 8.0]);
        assert_eq!(reduce(&x, &[2, 3, 4], &[0, 1, 2], ReduceOp::Mean), vec![11.5]);
        assert_eq!(reduce(&x, &[2, 3, 4], &[], ReduceOp::Sum), x);
        let mut xn = x.clone();
        xn[5] = f64::NAN;
        assert!(reduce(&xn, &[2, 3, 4], &[2], ReduceOp::Max)[1].is_nan());
    }

    #[test]
    fn layout_round_trips() {
        let dims = [2, 3, 4, 5];
        let s = channels_last_strides(&dims);
        assert_eq!(s, vec![60, 1, 15, 3]);
        assert_eq!(contiguous_strides(&dims), vec![60, 20, 5, 1]);
        assert_eq!(strided_len(&dims, &s), 120);
        let x: Vec<f64> = (0..120).map(f64::from).collect();
        let mut buf = vec![-1.0; 120];
        scatter_to_strided(&x, &dims, &s, &mut buf);
        // NHWC: element (n, c, h, w) lives at ((n*4 + h)*5 + w)*3 + c.
        let (n, c, h, w) = (1, 2, 3, 4);
        assert_eq!(buf[((n * 4 + h) * 5 + w) * 3 + c], x[((n * 3 + c) * 4 + h) * 5 + w]);
        assert_eq!(gather_from_strided(&buf, &dims, &s), x);
        // Column-major (transposed) matrix.
        let m = [1, 2, 3, 4, 5, 6];
        let mut t = [0; 6];
        scatter_to_strided(&m, &[2, 3], &[1, 2], &mut t);
        assert_eq!(t, [1, 4, 2, 5, 3, 6]);
        assert_eq!(gather_from_strided(&t, &[2, 3], &[1, 2]), m.to_vec());
        // Padded strides leave gaps untouched.
        assert_eq!(strided_len(&[2, 3], &[8, 2]), 13);
        let mut g = [0; 13];
        scatter_to_strided(&m, &[2, 3], &[8, 2], &mut g);
        assert_eq!(g, [1, 0, 2, 0, 3, 0, 0, 0, 4, 0, 5, 0, 6]);
        assert_eq!(gather_from_strided(&g, &[2, 3], &[8, 2]), m.to_vec());
        // 3-D channels-last and edge cases.
        assert_eq!(channels_last_strides(&[2, 3, 4, 5, 6]), vec![360, 1, 90, 18, 3]);
        assert_eq!(strided_len(&[2, 0, 3], &[1, 1, 1]), 0);
        assert_eq!(strided_len(&[], &[]), 1);
    }

    #[test]
    #[should_panic(expected = "view needs")]
    fn scatter_short_buffer_panics() {
        let mut out = [0.0; 5];
        scatter_to_strided(&[1.0; 6], &[2, 3], &[1, 2], &mut out);
    }

    #[test]
    fn rel_l2_error_edge_cases() {
        assert_eq!(rel_l2_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(rel_l2_error(&[1.0, 1.0], &[1.0, 0.0]), 1.0);
        assert!((rel_l2_error(&[3.0, 4.0], &[0.0, 0.0]) - 5.0).abs() < 1e-15);
        assert_eq!(rel_l2_error(&[f64::NAN, 1.0], &[1.0, 1.0]), f64::INFINITY);
        assert_eq!(rel_l2_error(&[f64::INFINITY], &[1.0]), f64::INFINITY);
        assert_eq!(rel_l2_error(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(rel_l2_error(&[], &[]), 0.0);
    }

    #[test]
    fn splitmix64_is_deterministic_and_in_range() {
        // Reference first output of SplitMix64 seeded with 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut a = SplitMix64::new(123);
        let mut b = SplitMix64::new(123);
        assert_eq!(a.fill(100), b.fill(100));
        let v = a.fill(10_000);
        assert!(v.iter().all(|&x| (-1.0..1.0).contains(&x)));
        assert!(v.iter().any(|&x| x < -0.99) && v.iter().any(|&x| x > 0.99));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.05);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            seen[a.below(7) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn cross_entropy_by_hand() {
        // Rows [0, 0] (target 0), [0, ln 3] (target 1), and one ignored (-100).
        let x = [0.0, 0.0, 0.0, 3f64.ln(), 5.0, -2.0];
        let t = [0, 1, -100];
        let all = cross_entropy(&x, 2, &t, &[-100], false);
        let (l0, l1) = (2f64.ln(), (4.0f64 / 3.0).ln());
        assert!((all.row_loss[0] - l0).abs() < 1e-15 && (all.row_loss[1] - l1).abs() < 1e-15);
        assert_eq!(all.row_loss[2], 0.0);
        assert!((all.lse[0] - 2f64.ln()).abs() < 1e-15 && (all.lse[1] - 4f64.ln()).abs() < 1e-15);
        assert!((all.mean - (l0 + l1) / 3.0).abs() < 1e-15);
        let counted = cross_entropy(&x, 2, &t, &[-100], true);
        assert!((counted.mean - (l0 + l1) / 2.0).abs() < 1e-15);
        // softmax - onehot, times grad / 3: [-1/2, 1/2], [1/4, -1/4], zeros.
        let dx = cross_entropy_backward(&x, 2, &t, &[-100], false, 1.5);
        let want = [-0.25, 0.25, 0.125, -0.125, 0.0, 0.0];
        assert!(dx.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15), "{dx:?}");
        let dx = cross_entropy_backward(&x, 2, &t, &[-100], true, 1.0);
        assert!((dx[0] + 0.25).abs() < 1e-15 && (dx[3] + 0.125).abs() < 1e-15);
        // A target outside [0, classes) that is not ignored: NaN row, NaN mean.
        let bad = cross_entropy(&x, 2, &[0, 2, -100], &[-100], false);
        assert!(bad.row_loss[1].is_nan() && bad.mean.is_nan() && !bad.row_loss[0].is_nan());
        let dx = cross_entropy_backward(&x, 2, &[0, 2, -100], &[-100], false, 1.0);
        assert!(dx[2].is_nan() && dx[3].is_nan() && dx[0].is_finite() && dx[4] == 0.0);
        // Large logits do not overflow; every gradient row sums to 0.
        let big = cross_entropy(&[1000.0, 1000.0], 2, &[1], &[], false);
        assert!((big.mean - 2f64.ln()).abs() < 1e-12);
        let mut rng = SplitMix64::new(4);
        let x = rng.fill(5 * 7);
        let dx = cross_entropy_backward(&x, 7, &[0, 6, 3, 3, 1], &[], false, 1.0);
        for row in dx.chunks(7) {
            assert!(row.iter().sum::<f64>().abs() < 1e-15);
        }
    }

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() {
        let mut rng = SplitMix64::new(8);
        let x = rng.fill(4 * 5);
        let t = [2, 0, 9, 4];
        let dx = cross_entropy_backward(&x, 5, &t, &[9], true, 0.7);
        let h = 1e-6;
        for i in 0..x.len() {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[i] += h;
            down[i] -= h;
            let fd = 0.7 * (cross_entropy(&up, 5, &t, &[9], true).mean - cross_entropy(&down, 5, &t, &[9], true).mean)
                / (2.0 * h);
            assert!((fd - dx[i]).abs() < 1e-8, "{i}: {} vs fd {fd}", dx[i]);
        }
    }
}
