//! The resize kernels (`cudnn_backend::kernels::resize`) against CPU references in f64
//! written after burn-ndarray 0.21's formulas: nearest, bilinear and bicubic
//! interpolation (up- and down-sampling, both `align_corners`), their backwards (directly
//! against the transposed reference, and as the adjoint of the GPU forward:
//! `<interp(x), dy> == <x, interp_bwd(dy)>`), and bilinear grid sampling with zeros
//! padding; every float dtype, NCHW, NHWC, reversed and gapped layouts, poisoned outputs.
//! Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::resize::{self as rz, InterpolateMode};
use cudnn_backend::Device;
use cudnn_backend_reference::SplitMix64;
use integration_tests::{download, poisoned, upload, KernelReport};

use DataType::*;
use InterpolateMode::*;

const FLOATS: [DataType; 4] = [F32, F16, BF16, F64];
const MODES: [InterpolateMode; 3] = [Nearest, Bilinear, Bicubic];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

fn limit(dtype: DataType) -> f64 {
    match dtype {
        F32 => 1e-5,
        F64 => 1e-12,
        F16 => 1e-2,
        _ => 2e-2,
    }
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
// CPU references (f64, row-major), after burn-ndarray 0.21 `ops/interpolate.rs` and
// `ops/grid_sample.rs`. Each interpolation is a sparse linear map, listed as taps
// (input index along the axis, weight) per output index along each axis.

type Taps = Vec<Vec<(usize, f64)>>;

fn axis_taps(mode: InterpolateMode, inp: usize, out: usize, align: bool) -> Taps {
    (0..out)
        .map(|o| match mode {
            Nearest => {
                let ratio = inp as f64 / out as f64;
                vec![((ratio * o as f64).floor() as usize, 1.0)]
            }
            Bilinear => {
                let s = if align {
                    ((inp - 1) as f64 / (out.max(2) - 1) as f64) * o as f64
                } else {
                    ((o as f64 + 0.5) * (inp as f64 / out as f64) - 0.5).clamp(0.0, (inp - 1) as f64)
                };
                let f = s.floor();
                let w = s - f;
                vec![(f as usize, 1.0 - w), ((s.ceil() as usize).min(inp - 1), w)]
            }
            Bicubic => {
                let s = if align {
                    ((inp - 1) as f64 / (out.max(2) - 1) as f64) * o as f64
                } else {
                    (o as f64 + 0.5) * (inp as f64 / out as f64) - 0.5
                };
                let f = s.floor();
                let t = s - f;
                let a = -0.75;
                let c1 = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
                let c2 = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
                let w = [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)];
                (0..4)
                    .map(|k| {
                        let i = (f as i64 - 1 + k as i64).clamp(0, inp as i64 - 1) as usize;
                        (i, w[k])
                    })
                    .collect()
            }
        })
        .collect()
}

fn interp_ref(x: &[f64], xd: &[i64; 4], od: &[i64; 4], mode: InterpolateMode, align: bool) -> Vec<f64> {
    let (h, w, oh, ow) = (xd[2] as usize, xd[3] as usize, od[2] as usize, od[3] as usize);
    let (th, tw) = (axis_taps(mode, h, oh, align), axis_taps(mode, w, ow, align));
    let mut out = Vec::new();
    for plane in 0..(xd[0] * xd[1]) as usize {
        let base = plane * h * w;
        for row in &th {
            for col in &tw {
                let mut v = 0.0;
                for &(ih, a) in row {
                    for &(iw, b) in col {
                        v += x[base + ih * w + iw] * a * b;
                    }
                }
                out.push(v);
            }
        }
    }
    out
}

/// The transpose of `interp_ref` applied to `dy`.
fn interp_bwd_ref(dy: &[f64], xd: &[i64; 4], od: &[i64; 4], mode: InterpolateMode, align: bool) -> Vec<f64> {
    let (h, w, oh, ow) = (xd[2] as usize, xd[3] as usize, od[2] as usize, od[3] as usize);
    let (th, tw) = (axis_taps(mode, h, oh, align), axis_taps(mode, w, ow, align));
    let mut dx = vec![0.0; (xd[0] * xd[1]) as usize * h * w];
    for plane in 0..(xd[0] * xd[1]) as usize {
        for (o1, row) in th.iter().enumerate() {
            for (o2, col) in tw.iter().enumerate() {
                let g = dy[(plane * oh + o1) * ow + o2];
                for &(ih, a) in row {
                    for &(iw, b) in col {
                        dx[(plane * h + ih) * w + iw] += g * a * b;
                    }
                }
            }
        }
    }
    dx
}

/// Bilinear grid sampling, zeros padding; grid is row-major [N, OH, OW, 2].
fn grid_ref(x: &[f64], xd: &[i64; 4], grid: &[f64], oh: usize, ow: usize, align: bool) -> Vec<f64> {
    let (n, c, h, w) = (xd[0] as usize, xd[1] as usize, xd[2] as usize, xd[3] as usize);
    let mut out = Vec::new();
    for b in 0..n {
        for ch in 0..c {
            for y in 0..oh {
                for xo in 0..ow {
                    let g = ((b * oh + y) * ow + xo) * 2;
                    let (gx, gy) = (grid[g], grid[g + 1]);
                    let (px, py) = if align {
                        ((gx + 1.0) * (w - 1) as f64 / 2.0, (gy + 1.0) * (h - 1) as f64 / 2.0)
                    } else {
                        ((gx + 1.0) * w as f64 / 2.0 - 0.5, (gy + 1.0) * h as f64 / 2.0 - 0.5)
                    };
                    if !px.is_finite() || !py.is_finite() {
                        out.push(0.0);
                        continue;
                    }
                    let (x0, y0) = (px.floor() as i64, py.floor() as i64);
                    let (fx, fy) = (px - px.floor(), py - py.floor());
                    let read = |xi: i64, yi: i64| {
                        if xi >= 0 && xi < w as i64 && yi >= 0 && yi < h as i64 {
                            x[((b * c + ch) * h + yi as usize) * w + xi as usize]
                        } else {
                            0.0
                        }
                    };
                    out.push(
                        read(x0, y0) * (1.0 - fx) * (1.0 - fy)
                            + read(x0, y0 + 1) * (1.0 - fx) * fy
                            + read(x0 + 1, y0) * fx * (1.0 - fy)
                            + read(x0 + 1, y0 + 1) * fx * fy,
                    );
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Adjoint check

/// `<a, b>` against `<c, d>`, relative to the sums of absolute products.
fn adjoint(report: &mut KernelReport, case: String, dtype: DataType, ab: (&[f64], &[f64]), cd: (&[f64], &[f64])) {
    let dot = |u: &[f64], v: &[f64]| -> (f64, f64) {
        u.iter()
            .zip(v)
            .fold((0.0, 0.0), |(s, a), (p, q)| (s + p * q, a + (p * q).abs()))
    };
    let (l, la) = dot(ab.0, ab.1);
    let (r, ra) = dot(cd.0, cd.1);
    let err = if ab.0.len() == ab.1.len() && cd.0.len() == cd.1.len() {
        (l - r).abs() / la.max(ra).max(1e-300)
    } else {
        f64::NAN
    };
    report.record(case, dtype, err, limit(dtype), "adjoint mismatch");
}

// ---------------------------------------------------------------------------------------
// Inputs

fn random(rng: &mut SplitMix64, d: &[i64]) -> Vec<f64> {
    rng.fill(d.iter().product::<i64>() as usize)
}

/// (input dims, output [OH, OW]): up-, down- and mixed sampling, identity, size-1 axes.
fn cases() -> Vec<([i64; 4], [i64; 2])> {
    vec![
        ([2, 3, 4, 5], [8, 9]),
        ([2, 3, 9, 7], [4, 3]),
        ([1, 2, 5, 5], [5, 5]),
        ([2, 2, 1, 3], [3, 1]),
        ([1, 3, 6, 4], [11, 2]),
        ([1, 2, 3, 3], [1, 1]),
        ([1, 4, 16, 12], [7, 29]),
    ]
}

fn od_of(xd: &[i64; 4], o: [i64; 2]) -> [i64; 4] {
    [xd[0], xd[1], o[0], o[1]]
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
#[ignore = "needs a CUDA GPU"]
fn interpolate_forward_matches_burn_ndarray() {
    let s = stream();
    let mut rng = SplitMix64::new(0xA001);
    let mut r = KernelReport::new("resize", "interpolate");
    for (xd, o) in cases() {
        let od = od_of(&xd, o);
        for mode in MODES {
            for align in [false, true] {
                for dtype in FLOATS {
                    for (lx, lo) in LAYS {
                        let case = format!("{dtype:?} {mode:?} align={align} x {xd:?} {lx:?} -> {od:?} {lo:?}");
                        let x = upload(&s, &random(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                        let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                        match rz::interpolate(&s, &x.t, mode, align, &out.m) {
                            Ok(()) => r.close(
                                case,
                                dtype,
                                &download(&s, &out),
                                &interp_ref(&x.values, &xd, &od, mode, align),
                                limit(dtype),
                            ),
                            Err(e) => r.error(case, e),
                        }
                    }
                }
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn interpolate_backward_is_the_adjoint() {
    let s = stream();
    let mut rng = SplitMix64::new(0xA002);
    let mut direct = KernelReport::new("resize", "interpolate_backward");
    let mut adj = KernelReport::new("resize", "interpolate_backward adjoint");
    for (xd, o) in cases() {
        let od = od_of(&xd, o);
        for mode in MODES {
            for align in [false, true] {
                for dtype in FLOATS {
                    for (lx, lo) in LAYS {
                        let case = format!("{dtype:?} {mode:?} align={align} x {xd:?} {lx:?} -> {od:?} {lo:?}");
                        let x = upload(&s, &random(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                        let y = poisoned(&s, &od, &strides(lo, &od), dtype);
                        let dy = upload(&s, &random(&mut rng, &od), &od, &strides(lo, &od), dtype);
                        let dx = poisoned(&s, &xd, &strides(lx, &xd), dtype);
                        let run = rz::interpolate(&s, &x.t, mode, align, &y.m)
                            .and_then(|()| rz::interpolate_backward(&s, &dy.t, mode, align, &dx.m));
                        if let Err(e) = run {
                            direct.error(case, e);
                            continue;
                        }
                        let (yv, dxv) = (download(&s, &y), download(&s, &dx));
                        direct.close(
                            case.clone(),
                            dtype,
                            &dxv,
                            &interp_bwd_ref(&dy.values, &xd, &od, mode, align),
                            limit(dtype),
                        );
                        adjoint(&mut adj, case, dtype, (&yv, &dy.values), (&x.values, &dxv));
                    }
                }
            }
        }
    }
    direct.finish();
    adj.finish();
}

/// The deterministic two-pass backward: the reference within the float bound, and the same
/// bits over two runs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn interpolate_backward_ordered_is_repeatable() {
    let s = stream();
    let mut rng = SplitMix64::new(0xA012);
    let mut r = KernelReport::new("resize", "interpolate_backward_ordered");
    for (xd, o) in cases() {
        let od = od_of(&xd, o);
        for mode in [Bilinear, Bicubic] {
            for align in [false, true] {
                for dtype in FLOATS {
                    for (lx, lo) in LAYS {
                        let case = format!("{dtype:?} {mode:?} align={align} x {xd:?} {lx:?} -> {od:?} {lo:?}");
                        let dy = upload(&s, &random(&mut rng, &od), &od, &strides(lo, &od), dtype);
                        let mut runs = Vec::new();
                        for _ in 0..2 {
                            let dx = poisoned(&s, &xd, &strides(lx, &xd), dtype);
                            match rz::interpolate_backward_ordered(&s, &dy.t, mode, align, &dx.m) {
                                Ok(()) => runs.push(download(&s, &dx)),
                                Err(e) => {
                                    r.error(case.clone(), e);
                                    break;
                                }
                            }
                        }
                        if let [a, b] = &runs[..] {
                            r.close(
                                case.clone(),
                                dtype,
                                a,
                                &interp_bwd_ref(&dy.values, &xd, &od, mode, align),
                                limit(dtype),
                            );
                            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                            r.close(format!("{case} second run"), dtype, b, a, limit(dtype));
                            if !same {
                                r.error(
                                    format!("{case} second run"),
                                    cudnn_backend::Error::invalid_arg(
                                        "test",
                                        "dx",
                                        "the two runs differ in their bits",
                                    ),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn interpolate_backward_direct_case() {
    // 2 -> 4 bilinear, align_corners: the taps of outputs 0..4 are 0, (2/3, 1/3),
    // (1/3, 2/3), 1, so a dy row of ones gives dx = (2, 2); nearest 2 -> 3 maps 0 0 1.
    let s = stream();
    let mut r = KernelReport::new("resize", "interpolate_backward direct");
    for dtype in FLOATS {
        let xd = [1i64, 1, 1, 2];
        let od = [1i64, 1, 1, 4];
        let dy = upload(&s, &[1.0, 1.0, 1.0, 1.0], &od, &strides(Lay::Nchw, &od), dtype);
        let dx = poisoned(&s, &xd, &strides(Lay::Nchw, &xd), dtype);
        match rz::interpolate_backward(&s, &dy.t, Bilinear, true, &dx.m) {
            Ok(()) => r.close(
                format!("{dtype:?} bilinear"),
                dtype,
                &download(&s, &dx),
                &[2.0, 2.0],
                limit(dtype),
            ),
            Err(e) => r.error(format!("{dtype:?} bilinear"), e),
        }
        let od = [1i64, 1, 1, 3];
        let dy = upload(&s, &[1.0, 2.0, 4.0], &od, &strides(Lay::Nchw, &od), dtype);
        let dx = poisoned(&s, &xd, &strides(Lay::Nchw, &xd), dtype);
        match rz::interpolate_backward(&s, &dy.t, Nearest, false, &dx.m) {
            Ok(()) => r.close(
                format!("{dtype:?} nearest"),
                dtype,
                &download(&s, &dx),
                &[3.0, 4.0],
                limit(dtype),
            ),
            Err(e) => r.error(format!("{dtype:?} nearest"), e),
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grid_sample_matches_burn_ndarray() {
    let s = stream();
    let mut rng = SplitMix64::new(0xA003);
    let mut r = KernelReport::new("resize", "grid_sample_2d");
    for (xd, [oh, ow]) in cases() {
        let od = od_of(&xd, [oh, ow]);
        let gd = [xd[0], oh, ow, 2];
        // Row-major grid, and a planar one (x and y in separate planes).
        let planar = vec![oh * ow, ow, 1, xd[0] * oh * ow];
        for align in [false, true] {
            for dtype in FLOATS {
                for (li, (lx, lo)) in LAYS.into_iter().enumerate() {
                    let case = format!("{dtype:?} align={align} x {xd:?} {lx:?} -> {od:?} {lo:?}");
                    let x = upload(&s, &random(&mut rng, &xd), &xd, &strides(lx, &xd), dtype);
                    // Coordinates in [-1.2, 1.2] (some outside the input), a few infinite.
                    let mut gv: Vec<f64> = random(&mut rng, &gd).iter().map(|v| v * 1.2).collect();
                    for (k, g) in gv.iter_mut().enumerate() {
                        if k % 17 == 5 {
                            *g = f64::INFINITY;
                        }
                    }
                    let gs = if li % 2 == 0 {
                        strides(Lay::Nchw, &gd)
                    } else {
                        planar.clone()
                    };
                    let grid = upload(&s, &gv, &gd, &gs, dtype);
                    let out = poisoned(&s, &od, &strides(lo, &od), dtype);
                    match rz::grid_sample_2d(&s, &x.t, &grid.t, align, &out.m) {
                        Ok(()) => r.close(
                            case,
                            dtype,
                            &download(&s, &out),
                            &grid_ref(&x.values, &xd, &grid.values, oh as usize, ow as usize, align),
                            limit(dtype),
                        ),
                        Err(e) => r.error(case, e),
                    }
                }
            }
        }
    }
    r.finish();
}
