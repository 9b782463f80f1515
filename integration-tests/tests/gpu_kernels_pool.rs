//! The pooling kernels (`cudnn_backend::kernels::pool`) against straightforward CPU
//! computations in f64: max pooling with flat indices (exact indices on tie-free inputs,
//! first max on deliberate ties, NaN propagation) and its backward, average pooling with
//! ceil_mode / count_include_pad and its backward, adaptive average pooling and its
//! backward; every float dtype, NCHW, NHWC, reversed and gapped layouts, poisoned outputs.
//! Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::pool::{self as pl, Pool2d};
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{gather_from_strided, strided_len, SplitMix64};
use integration_tests::views_of;
use integration_tests::{download, poisoned, upload, KernelReport};

use DataType::*;

const FLOATS: [DataType; 4] = [F32, F16, BF16, F64];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

fn limit(dtype: DataType) -> f64 {
    match dtype {
        F32 => 1e-5,
        F64 => 1e-12,
        _ => 1e-2,
    }
}

fn us(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

// ---------------------------------------------------------------------------------------
// I64 index buffers

struct DevIdx {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
}

/// An I64 output poisoned with -1 (every byte 0xFF).
fn poisoned_idx(s: &Arc<CudaStream>, dims: &[i64], st: &[i64]) -> DevIdx {
    let len = strided_len(&us(dims), &us(st)).max(1);
    let buf = s.clone_htod(&vec![0xFFu8; len * 8]).expect("alloc");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(s, &buf, 0, dims, st, I64) };
    DevIdx { t, m, buf }
}

fn download_idx(s: &Arc<CudaStream>, d: &DevIdx) -> Vec<f64> {
    let bytes = s.clone_dtoh(&d.buf).expect("download");
    let all: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect();
    gather_from_strided(&all, &us(d.t.dims()), &us(d.t.strides()))
}

// ---------------------------------------------------------------------------------------
// Layouts of [N, C, H, W]

#[derive(Clone, Copy, Debug)]
enum Lay {
    Nchw,
    Nhwc,
    Reversed,
    Gapped,
}

fn strides(lay: Lay, d: &[i64]) -> Vec<i64> {
    let packed = |order: [usize; 4]| {
        // `order` lists dims from outermost to innermost in memory.
        let mut s = vec![0i64; 4];
        let mut acc = 1;
        for &a in order.iter().rev() {
            s[a] = acc;
            acc *= d[a].max(1);
        }
        s
    };
    match lay {
        Lay::Nchw => packed([0, 1, 2, 3]),
        Lay::Nhwc => packed([0, 2, 3, 1]),
        Lay::Reversed => packed([3, 2, 1, 0]),
        Lay::Gapped => packed([0, 1, 2, 3]).iter().map(|x| x * 2).collect(),
    }
}

const LAYS: [(Lay, Lay); 4] = [
    (Lay::Nchw, Lay::Nchw),
    (Lay::Nhwc, Lay::Nhwc),
    (Lay::Reversed, Lay::Nchw),
    (Lay::Gapped, Lay::Reversed),
];

// ---------------------------------------------------------------------------------------
// CPU references (f64, row-major [N, C, H, W])

fn pool(k: [i64; 2], s: [i64; 2], p: [i64; 2], d: [i64; 2], ceil: bool) -> Pool2d {
    Pool2d {
        kernel: k,
        stride: s,
        padding: p,
        dilation: d,
        ceil_mode: ceil,
    }
}

/// PyTorch's pooling output size, written independently of the crate.
fn out_len(len: i64, k: i64, s: i64, p: i64, d: i64, ceil: bool) -> i64 {
    let eff = d * (k - 1) + 1;
    let num = len + 2 * p - eff;
    let mut o = if ceil {
        (num + s - 1).div_euclid(s) + 1
    } else {
        num.div_euclid(s) + 1
    };
    if ceil && (o - 1) * s >= len + p {
        o -= 1;
    }
    o
}

fn out_dims(x: &[i64; 4], p: &Pool2d) -> [i64; 4] {
    let f = |a: usize| {
        out_len(
            x[2 + a],
            p.kernel[a],
            p.stride[a],
            p.padding[a],
            p.dilation[a],
            p.ceil_mode,
        )
    };
    [x[0], x[1], f(0), f(1)]
}

/// Max pooling: values and flat plane indices (first max, a NaN wins).
fn max_ref(x: &[f64], xd: &[i64; 4], p: &Pool2d) -> (Vec<f64>, Vec<f64>) {
    let od = out_dims(xd, p);
    let (h, w) = (xd[2], xd[3]);
    let (mut vals, mut idx) = (Vec::new(), Vec::new());
    for plane in 0..(xd[0] * xd[1]) {
        let base = (plane * h * w) as usize;
        for oh in 0..od[2] {
            for ow in 0..od[3] {
                let mut best: Option<(f64, i64)> = None;
                for a in 0..p.kernel[0] {
                    let ih = oh * p.stride[0] - p.padding[0] + a * p.dilation[0];
                    for e in 0..p.kernel[1] {
                        let iw = ow * p.stride[1] - p.padding[1] + e * p.dilation[1];
                        if ih < 0 || ih >= h || iw < 0 || iw >= w {
                            continue;
                        }
                        let v = x[base + (ih * w + iw) as usize];
                        let take = match best {
                            None => true,
                            Some((b, _)) => !b.is_nan() && (v > b || v.is_nan()),
                        };
                        if take {
                            best = Some((v, ih * w + iw));
                        }
                    }
                }
                let (v, i) = best.unwrap_or((f64::NEG_INFINITY, -1));
                vals.push(v);
                idx.push(i as f64);
            }
        }
    }
    (vals, idx)
}

/// Max pooling backward by scattering dy at the indices.
fn max_bwd_ref(idx: &[f64], dy: &[f64], yd: &[i64; 4], xd: &[i64; 4]) -> Vec<f64> {
    let plane_x = (xd[2] * xd[3]) as usize;
    let plane_y = (yd[2] * yd[3]) as usize;
    let mut dx = vec![0.0; xd.iter().product::<i64>() as usize];
    for (i, (&k, &g)) in idx.iter().zip(dy).enumerate() {
        if k >= 0.0 && (k as usize) < plane_x {
            dx[(i / plane_y) * plane_x + k as usize] += g;
        }
    }
    dx
}

/// Average pooling windows: (clipped rows, clipped cols, divisor) of output (oh, ow).
fn avg_window(xd: &[i64; 4], p: &Pool2d, cip: bool, oh: i64, ow: i64) -> ([i64; 2], [i64; 2], f64) {
    let (h, w) = (xd[2], xd[3]);
    let hs = oh * p.stride[0] - p.padding[0];
    let ws = ow * p.stride[1] - p.padding[1];
    let he = (hs + p.kernel[0]).min(h + p.padding[0]);
    let we = (ws + p.kernel[1]).min(w + p.padding[1]);
    let padded = (he - hs) * (we - ws);
    let (hs, ws, he, we) = (hs.max(0), ws.max(0), he.min(h), we.min(w));
    let div = if cip { padded } else { (he - hs) * (we - ws) };
    ([hs, he], [ws, we], div as f64)
}

fn avg_ref(x: &[f64], xd: &[i64; 4], p: &Pool2d, cip: bool) -> Vec<f64> {
    let od = out_dims(xd, p);
    let (h, w) = (xd[2], xd[3]);
    let mut out = Vec::new();
    for plane in 0..(xd[0] * xd[1]) {
        for oh in 0..od[2] {
            for ow in 0..od[3] {
                let ([hs, he], [ws, we], div) = avg_window(xd, p, cip, oh, ow);
                let mut sum = 0.0;
                for ih in hs..he {
                    for iw in ws..we {
                        sum += x[((plane * h + ih) * w + iw) as usize];
                    }
                }
                out.push(if hs < he && ws < we { sum / div } else { 0.0 });
            }
        }
    }
    out
}

/// Average pooling backward by scattering (the kernel gathers).
fn avg_bwd_ref(dy: &[f64], xd: &[i64; 4], p: &Pool2d, cip: bool) -> Vec<f64> {
    let od = out_dims(xd, p);
    let (h, w) = (xd[2], xd[3]);
    let mut dx = vec![0.0; xd.iter().product::<i64>() as usize];
    let mut i = 0;
    for plane in 0..(xd[0] * xd[1]) {
        for oh in 0..od[2] {
            for ow in 0..od[3] {
                let ([hs, he], [ws, we], div) = avg_window(xd, p, cip, oh, ow);
                for ih in hs..he {
                    for iw in ws..we {
                        dx[((plane * h + ih) * w + iw) as usize] += dy[i] / div;
                    }
                }
                i += 1;
            }
        }
    }
    dx
}

fn adaptive_range(i: i64, len: i64, out: i64) -> (i64, i64) {
    ((i * len) / out, ((i + 1) * len + out - 1) / out)
}

fn adaptive_ref(x: &[f64], xd: &[i64; 4], od: &[i64; 4]) -> Vec<f64> {
    let (h, w) = (xd[2], xd[3]);
    let mut out = Vec::new();
    for plane in 0..(xd[0] * xd[1]) {
        for oh in 0..od[2] {
            let (hs, he) = adaptive_range(oh, h, od[2]);
            for ow in 0..od[3] {
                let (ws, we) = adaptive_range(ow, w, od[3]);
                let mut sum = 0.0;
                for ih in hs..he {
                    for iw in ws..we {
                        sum += x[((plane * h + ih) * w + iw) as usize];
                    }
                }
                out.push(sum / ((he - hs) * (we - ws)) as f64);
            }
        }
    }
    out
}

fn adaptive_bwd_ref(dy: &[f64], xd: &[i64; 4], od: &[i64; 4]) -> Vec<f64> {
    let (h, w) = (xd[2], xd[3]);
    let mut dx = vec![0.0; xd.iter().product::<i64>() as usize];
    let mut i = 0;
    for plane in 0..(xd[0] * xd[1]) {
        for oh in 0..od[2] {
            let (hs, he) = adaptive_range(oh, h, od[2]);
            for ow in 0..od[3] {
                let (ws, we) = adaptive_range(ow, w, od[3]);
                let div = ((he - hs) * (we - ws)) as f64;
                for ih in hs..he {
                    for iw in ws..we {
                        dx[((plane * h + ih) * w + iw) as usize] += dy[i] / div;
                    }
                }
                i += 1;
            }
        }
    }
    dx
}

// ---------------------------------------------------------------------------------------
// Inputs

/// Tie-free planes: a permutation of `0..H*W` per plane, scaled by 1/4 and centred (exact
/// in every float dtype for planes of up to 256 elements).
fn distinct(rng: &mut SplitMix64, d: &[i64; 4]) -> Vec<f64> {
    let plane = (d[2] * d[3]) as usize;
    assert!(plane <= 256, "plane too large to be tie-free in bf16");
    let mut out = Vec::new();
    for _ in 0..(d[0] * d[1]) {
        let mut p: Vec<usize> = (0..plane).collect();
        for i in (1..plane).rev() {
            p.swap(i, rng.below(i as u64 + 1) as usize);
        }
        out.extend(p.iter().map(|&v| (v as f64 - plane as f64 / 2.0) * 0.25));
    }
    out
}

fn random(rng: &mut SplitMix64, d: &[i64]) -> Vec<f64> {
    rng.fill(d.iter().product::<i64>() as usize)
}

/// Max-pool geometries over inputs of at most 16 x 16.
fn max_cases() -> Vec<([i64; 4], Pool2d)> {
    vec![
        ([2, 3, 8, 8], pool([2, 2], [2, 2], [0, 0], [1, 1], false)),
        ([2, 3, 5, 5], pool([2, 2], [2, 2], [0, 0], [1, 1], true)),
        ([1, 4, 6, 6], pool([3, 3], [2, 2], [1, 1], [1, 1], true)),
        ([3, 2, 7, 9], pool([3, 2], [2, 1], [1, 1], [1, 1], false)),
        ([2, 2, 11, 13], pool([3, 3], [1, 2], [1, 0], [2, 2], false)),
        ([2, 2, 10, 10], pool([3, 3], [2, 2], [0, 1], [2, 1], true)),
        ([1, 3, 16, 15], pool([5, 4], [3, 3], [2, 2], [1, 1], true)),
        ([2, 5, 9, 7], pool([1, 1], [2, 3], [0, 0], [1, 1], true)),
    ]
}

/// Average-pool geometries (dilation 1).
fn avg_cases() -> Vec<([i64; 4], Pool2d)> {
    vec![
        ([2, 3, 8, 8], pool([2, 2], [2, 2], [0, 0], [1, 1], false)),
        ([2, 3, 5, 5], pool([2, 2], [2, 2], [0, 0], [1, 1], true)),
        ([1, 4, 6, 6], pool([3, 3], [2, 2], [1, 1], [1, 1], true)),
        ([2, 2, 7, 7], pool([3, 3], [2, 2], [1, 1], [1, 1], true)),
        ([3, 2, 7, 9], pool([3, 2], [2, 1], [1, 1], [1, 1], false)),
        ([1, 3, 16, 15], pool([5, 4], [3, 3], [2, 2], [1, 1], true)),
        ([2, 2, 9, 10], pool([2, 3], [3, 2], [1, 1], [1, 1], true)),
        ([2, 3, 12, 12], pool([3, 3], [1, 1], [1, 1], [1, 1], false)),
    ]
}

fn dims_of(d: &[i64; 4]) -> Vec<i64> {
    d.to_vec()
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
#[ignore = "needs a CUDA GPU"]
fn max_pool_values_and_indices() {
    let s = stream();
    let mut rng = SplitMix64::new(0x9001);
    let mut r = KernelReport::new("pool", "max_pool2d_with_indices");
    for (xd, p) in max_cases() {
        let od = out_dims(&xd, &p);
        for dtype in FLOATS {
            for (lx, lo) in LAYS {
                let case = format!("{dtype:?} x {xd:?} {lx:?} out {lo:?} {p:?}");
                let x = upload(&s, &distinct(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                let idx = poisoned_idx(&s, &od, &strides(lo, &od));
                if let Err(e) = pl::max_pool2d_with_indices(&s, &x.t, &p, &out.m, &idx.m) {
                    r.error(case, e);
                    continue;
                }
                let (vals, want_idx) = max_ref(&x.values, &xd, &p);
                r.exact(format!("{case} values"), dtype, &download(&s, &out), &vals);
                r.exact(format!("{case} indices"), I64, &download_idx(&s, &idx), &want_idx);
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn max_pool_ties_pick_the_first_max_and_nan_wins() {
    let s = stream();
    let mut rng = SplitMix64::new(0x9002);
    let mut r = KernelReport::new("pool", "max_pool2d ties and NaN");
    for (xd, p) in max_cases() {
        let od = out_dims(&xd, &p);
        for dtype in FLOATS {
            let n = xd.iter().product::<i64>() as usize;
            // Values from {-1, 0, 1}: many ties; a few NaNs.
            let mut v: Vec<f64> = (0..n).map(|_| rng.below(3) as f64 - 1.0).collect();
            for _ in 0..(n / 40).max(1) {
                v[rng.below(n as u64) as usize] = f64::NAN;
            }
            for (lx, lo) in [(Lay::Nchw, Lay::Nchw), (Lay::Nhwc, Lay::Reversed)] {
                let case = format!("{dtype:?} x {xd:?} {lx:?} out {lo:?} {p:?}");
                let x = upload(&s, &v, &xd, &strides(lx, &xd), dtype);
                let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                let idx = poisoned_idx(&s, &od, &strides(lo, &od));
                if let Err(e) = pl::max_pool2d_with_indices(&s, &x.t, &p, &out.m, &idx.m) {
                    r.error(case, e);
                    continue;
                }
                let (vals, want_idx) = max_ref(&x.values, &xd, &p);
                r.exact(format!("{case} values"), dtype, &download(&s, &out), &vals);
                r.exact(format!("{case} indices"), I64, &download_idx(&s, &idx), &want_idx);
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn max_pool_backward_scatters_by_indices() {
    let s = stream();
    let mut rng = SplitMix64::new(0x9003);
    let mut r = KernelReport::new("pool", "max_pool2d_backward");
    for (xd, p) in max_cases() {
        let od = out_dims(&xd, &p);
        for dtype in FLOATS {
            for (lx, lo) in LAYS {
                let case = format!("{dtype:?} x {xd:?} {lx:?} dy {lo:?} {p:?}");
                let x = upload(&s, &distinct(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                let idx = poisoned_idx(&s, &od, &packed_like(&od));
                let dy = upload(&s, &random(&mut rng, &od), &od, &strides(lo, &od), dtype);
                let dx = poisoned(&s, &xd, &strides(lx, &xd), dtype);
                let run = pl::max_pool2d_with_indices(&s, &x.t, &p, &out.m, &idx.m)
                    .and_then(|_| pl::max_pool2d_backward(&s, &idx.t, &dy.t, &dx.m));
                if let Err(e) = run {
                    r.error(case, e);
                    continue;
                }
                let got_idx = download_idx(&s, &idx);
                let (_, want_idx) = max_ref(&x.values, &xd, &p);
                r.exact(format!("{case} indices"), I64, &got_idx, &want_idx);
                let want = max_bwd_ref(&want_idx, &dy.values, &od, &xd);
                r.close(case, dtype, &download(&s, &dx), &want, limit(dtype));
            }
        }
    }
    r.finish();
}

/// The deterministic gather form: the same gradients as the scatter (within the float
/// bound), and bit-identical over two runs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn max_pool_backward_gather_is_repeatable() {
    let s = stream();
    let mut rng = SplitMix64::new(0x9013);
    let mut r = KernelReport::new("pool", "max_pool2d_backward_gather");
    for (xd, p) in max_cases() {
        let od = out_dims(&xd, &p);
        for dtype in FLOATS {
            for (lx, lo) in LAYS {
                let case = format!("{dtype:?} x {xd:?} {lx:?} dy {lo:?} {p:?}");
                let x = upload(&s, &distinct(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                let idx = poisoned_idx(&s, &od, &packed_like(&od));
                let dy = upload(&s, &random(&mut rng, &od), &od, &strides(lo, &od), dtype);
                let mut runs: Vec<_> = (0..2)
                    .map(|_| {
                        let dx = poisoned(&s, &xd, &strides(lx, &xd), dtype);
                        pl::max_pool2d_with_indices(&s, &x.t, &p, &out.m, &idx.m)
                            .and_then(|_| pl::max_pool2d_backward_gather(&s, &idx.t, &dy.t, &p, &dx.m))
                            .map(|_| download(&s, &dx))
                    })
                    .collect();
                let second = runs.pop().expect("two runs");
                match (runs.pop().expect("two runs"), second) {
                    (Ok(a), Ok(b)) => {
                        let (_, want_idx) = max_ref(&x.values, &xd, &p);
                        let want = max_bwd_ref(&want_idx, &dy.values, &od, &xd);
                        r.close(case.clone(), dtype, &a, &want, limit(dtype));
                        r.exact(format!("{case} second run"), dtype, &b, &a);
                    }
                    (Err(e), _) | (_, Err(e)) => r.error(case, e),
                }
            }
        }
    }
    r.finish();
}

fn packed_like(d: &[i64]) -> Vec<i64> {
    row_major_strides(d).to_vec()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn avg_pool_forward_and_backward() {
    let s = stream();
    let mut rng = SplitMix64::new(0x9004);
    let mut fwd = KernelReport::new("pool", "avg_pool2d");
    let mut bwd = KernelReport::new("pool", "avg_pool2d_backward");
    for (xd, p) in avg_cases() {
        let od = out_dims(&xd, &p);
        for dtype in FLOATS {
            for (lx, lo) in LAYS {
                for cip in [false, true] {
                    let case = format!("{dtype:?} x {xd:?} {lx:?} out {lo:?} cip={cip} {p:?}");
                    let x = upload(&s, &random(&mut rng, &dims_of(&xd)), &xd, &strides(lx, &xd), dtype);
                    let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                    match pl::avg_pool2d(&s, &x.t, &p, cip, &out.m) {
                        Ok(()) => fwd.close(
                            case.clone(),
                            dtype,
                            &download(&s, &out),
                            &avg_ref(&x.values, &xd, &p, cip),
                            limit(dtype),
                        ),
                        Err(e) => fwd.error(case.clone(), e),
                    }
                    let dy = upload(&s, &random(&mut rng, &od), &od, &strides(lo, &od), dtype);
                    let dx = poisoned(&s, &xd, &strides(lx, &xd), dtype);
                    match pl::avg_pool2d_backward(&s, &dy.t, &p, cip, &dx.m) {
                        Ok(()) => bwd.close(
                            case,
                            dtype,
                            &download(&s, &dx),
                            &avg_bwd_ref(&dy.values, &xd, &p, cip),
                            limit(dtype),
                        ),
                        Err(e) => bwd.error(case, e),
                    }
                }
            }
        }
    }
    fwd.finish();
    bwd.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn adaptive_avg_pool_forward_and_backward() {
    let s = stream();
    let mut rng = SplitMix64::new(0x9005);
    let mut fwd = KernelReport::new("pool", "adaptive_avg_pool2d");
    let mut bwd = KernelReport::new("pool", "adaptive_avg_pool2d_backward");
    let cases: [([i64; 4], [i64; 2]); 7] = [
        ([2, 3, 8, 8], [4, 4]),
        ([2, 3, 7, 9], [3, 4]),
        ([1, 4, 10, 6], [1, 1]),
        ([2, 2, 5, 5], [7, 3]),
        ([3, 2, 13, 11], [5, 6]),
        ([2, 3, 1, 1], [2, 2]),
        ([1, 64, 33, 17], [7, 7]),
    ];
    for (xd, [oh, ow]) in cases {
        let od = [xd[0], xd[1], oh, ow];
        for dtype in FLOATS {
            for (lx, lo) in LAYS {
                let case = format!("{dtype:?} x {xd:?} {lx:?} -> {od:?} {lo:?}");
                let x = upload(&s, &random(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                match pl::adaptive_avg_pool2d(&s, &x.t, &out.m) {
                    Ok(()) => fwd.close(
                        case.clone(),
                        dtype,
                        &download(&s, &out),
                        &adaptive_ref(&x.values, &xd, &od),
                        limit(dtype),
                    ),
                    Err(e) => fwd.error(case.clone(), e),
                }
                let dy = upload(&s, &random(&mut rng, &od), &od, &strides(lo, &od), dtype);
                let dx = poisoned(&s, &xd, &strides(lx, &xd), dtype);
                match pl::adaptive_avg_pool2d_backward(&s, &dy.t, &dx.m) {
                    Ok(()) => bwd.close(
                        case,
                        dtype,
                        &download(&s, &dx),
                        &adaptive_bwd_ref(&dy.values, &xd, &od),
                        limit(dtype),
                    ),
                    Err(e) => bwd.error(case, e),
                }
            }
        }
    }
    fwd.finish();
    bwd.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn output_sizes_match_the_independent_formula() {
    let mut r = KernelReport::new("pool", "output_hw");
    for (xd, p) in max_cases().into_iter().chain(avg_cases()) {
        let want = out_dims(&xd, &p);
        match p.output_hw(xd[2], xd[3]) {
            Ok(hw) => r.exact(
                format!("{xd:?} {p:?}"),
                I64,
                &[hw[0] as f64, hw[1] as f64],
                &[want[2] as f64, want[3] as f64],
            ),
            Err(e) => r.error(format!("{xd:?} {p:?}"), e),
        }
    }
    r.finish();
}
