//! The direct convolution kernels (`cudnn_backend::kernels::conv`) against the float64
//! reference (`cudnn_backend_reference::conv_*`): forward, backward data and backward
//! filter; every float dtype; 1-D, 2-D and 3-D; NCHW, NHWC (channels-last strides),
//! reversed and gapped (non-packed) views; groups, depthwise, dilation, stride, asymmetric
//! padding; outputs poisoned with NaN (every element must be written, nothing outside the
//! view); bit-reproducible filter gradients; empty problems. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::conv;
use cudnn_backend::types::{channels_last_strides, row_major_strides, ConvGeometry};
use cudnn_backend::Device;
use cudnn_backend_reference::{self as reference, SplitMix64};
use integration_tests::{bound, download, poisoned, reference_geometry, upload, views_of, DevTensor, KernelReport};

use DataType::*;

const FLOATS: [DataType; 4] = [F32, F16, BF16, F64];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

/// Relative L2 bound against the f64 reference (the inputs are the dtype-rounded values).
fn limit(dtype: DataType) -> f64 {
    match dtype {
        F64 => 1e-12,
        d => bound(d),
    }
}

fn us(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

// ---------------------------------------------------------------------------------------
// Layouts of [N, C, spatial...]

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lay {
    /// Packed row-major (NCW / NCHW / NCDHW).
    Nchw,
    /// Packed channels-last (NWC / NHWC / NDHWC).
    Nhwc,
    /// Packed with the dims in reverse order (innermost N).
    Reversed,
    /// Row-major with every stride doubled: a non-packed view with gaps.
    Gapped,
}

fn strides(lay: Lay, d: &[i64]) -> Vec<i64> {
    match lay {
        Lay::Nchw => row_major_strides(d).to_vec(),
        Lay::Nhwc => channels_last_strides(d).to_vec(),
        Lay::Reversed => {
            let mut s = vec![0i64; d.len()];
            let mut acc = 1;
            for (a, &n) in d.iter().enumerate() {
                s[a] = acc;
                acc *= n.max(1);
            }
            s
        }
        Lay::Gapped => row_major_strides(d).iter().map(|s| s * 2).collect(),
    }
}

/// Layouts of (x, w, y): the activations and the filter in each layout, and mixes.
const LAYS: [(Lay, Lay, Lay); 4] = [
    (Lay::Nchw, Lay::Nchw, Lay::Nchw),
    (Lay::Nhwc, Lay::Nhwc, Lay::Nhwc),
    (Lay::Gapped, Lay::Reversed, Lay::Nhwc),
    (Lay::Reversed, Lay::Gapped, Lay::Gapped),
];

// ---------------------------------------------------------------------------------------
// Problems

struct Case {
    x: Vec<i64>,
    w: Vec<i64>,
    g: ConvGeometry,
}

fn case(x: &[i64], w: &[i64], pre: &[i64], post: &[i64], stride: &[i64], dil: &[i64], groups: i64) -> Case {
    Case {
        x: x.to_vec(),
        w: w.to_vec(),
        g: ConvGeometry::new(pre, stride, dil, groups).with_post_padding(post),
    }
}

impl Case {
    fn y(&self) -> Vec<i64> {
        self.g
            .output_dims(&self.x, &self.w)
            .unwrap_or_else(|e| panic!("bad test case x {:?} w {:?}: {e}", self.x, self.w))
    }

    fn name(&self) -> String {
        format!("x {:?} w {:?} {:?}", self.x, self.w, self.g)
    }
}

fn cases() -> Vec<Case> {
    vec![
        // 1-D
        case(&[2, 4, 17], &[6, 4, 3], &[1], &[1], &[1], &[1], 1),
        case(&[3, 6, 20], &[4, 3, 4], &[2], &[0], &[2], &[2], 2),
        // 2-D: plain, grouped with everything asymmetric, depthwise, depthwise with a
        // channel multiplier and dilation, 1x1 with stride, a filter larger than the input,
        // a stride larger than the filter (dx elements no window reads), wider channels
        case(&[2, 3, 9, 8], &[5, 3, 3, 3], &[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
        case(&[2, 6, 11, 10], &[9, 2, 3, 2], &[1, 0], &[0, 2], &[2, 1], &[1, 2], 3),
        case(&[2, 8, 12, 12], &[8, 1, 3, 3], &[1, 1], &[1, 1], &[2, 2], &[1, 1], 8),
        case(&[1, 4, 9, 9], &[8, 1, 5, 5], &[2, 2], &[2, 2], &[1, 1], &[2, 2], 4),
        case(&[2, 16, 7, 7], &[8, 16, 1, 1], &[0, 0], &[0, 0], &[2, 2], &[1, 1], 1),
        case(&[1, 2, 3, 3], &[2, 2, 5, 5], &[2, 2], &[2, 2], &[1, 1], &[1, 1], 1),
        case(&[2, 3, 10, 10], &[4, 3, 2, 2], &[0, 1], &[0, 0], &[3, 3], &[1, 1], 1),
        case(&[4, 32, 16, 16], &[32, 32, 3, 3], &[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
        // 3-D: grouped and asymmetric, depthwise
        case(
            &[2, 4, 5, 6, 7],
            &[6, 2, 3, 2, 3],
            &[1, 0, 1],
            &[1, 1, 0],
            &[1, 2, 2],
            &[1, 1, 2],
            2,
        ),
        case(
            &[1, 3, 6, 6, 6],
            &[3, 1, 3, 3, 3],
            &[1, 1, 1],
            &[1, 1, 1],
            &[1, 1, 1],
            &[1, 1, 1],
            3,
        ),
    ]
}

/// Random values in ±[0.05, 1): never zero.
fn values(rng: &mut SplitMix64, d: &[i64]) -> Vec<f64> {
    let n = d.iter().product::<i64>() as usize;
    rng.fill(n)
        .into_iter()
        .map(|v| if v < 0.0 { v * 0.95 - 0.05 } else { v * 0.95 + 0.05 })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Report

/// Compares the output with the reference, checks that every element was written (no
/// NaN left from the poison) and that no byte outside the view changed.
fn close(r: &mut KernelReport, s: &Arc<CudaStream>, case: String, out: &DevTensor, reference: &[f64]) {
    let dtype = out.t.dtype();
    let got = download(s, out);
    let unwritten = got.iter().filter(|v| v.is_nan()).count();
    if unwritten > 0 {
        r.fail(format!("{case}: {unwritten} of {} elements not written", got.len()));
        return;
    }
    let strays = strays(s, out);
    if strays > 0 {
        r.note_failure(format!("{case}: {strays} elements outside the view were written"));
    }
    r.close(case, dtype, &got, reference, limit(dtype));
}

/// Elements of a poisoned output's buffer outside its view that are no longer all-ones
/// bits (a write outside the view).
fn strays(s: &Arc<CudaStream>, t: &DevTensor) -> usize {
    let bytes = s.clone_dtoh(&t.buf).expect("download");
    let size = t.t.dtype().size();
    let (d, st) = (us(t.t.dims()), us(t.t.strides()));
    let mut inside = vec![false; bytes.len() / size];
    let mut offs = vec![0usize];
    for (&n, &stride) in d.iter().zip(&st) {
        offs = offs.iter().flat_map(|&o| (0..n).map(move |i| o + i * stride)).collect();
    }
    for o in offs {
        inside[o] = true;
    }
    bytes
        .chunks_exact(size)
        .zip(&inside)
        .filter(|(b, &inn)| !inn && b.iter().any(|&x| x != 0xFF))
        .count()
}

/// Raw bytes of a device tensor's buffer.
fn bits(s: &Arc<CudaStream>, t: &DevTensor) -> Vec<u8> {
    s.clone_dtoh(&t.buf).expect("download")
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_matches_the_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(0xc0_01);
    let mut r = KernelReport::new("conv", "forward");
    for c in cases() {
        let yd = c.y();
        let g = reference_geometry(&c.g);
        for dtype in FLOATS {
            for (lx, lw, ly) in LAYS {
                let name = format!("{dtype:?} {} x {lx:?} w {lw:?} y {ly:?}", c.name());
                let x = upload(&s, &values(&mut rng, &c.x), &c.x, &strides(lx, &c.x), dtype);
                let w = upload(&s, &values(&mut rng, &c.w), &c.w, &strides(lw, &c.w), dtype);
                let y = poisoned(&s, &yd, &strides(ly, &yd), dtype);
                if let Err(e) = conv::conv_forward(&s, &x.t, &w.t, &y.m, &c.g) {
                    r.error(name, e);
                    continue;
                }
                let want = reference::conv_forward(&x.values, &us(&c.x), &w.values, &us(&c.w), &g);
                close(&mut r, &s, name, &y, &want);
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn backward_data_matches_the_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(0xc0_02);
    let mut r = KernelReport::new("conv", "backward_data");
    for c in cases() {
        let yd = c.y();
        let g = reference_geometry(&c.g);
        for dtype in FLOATS {
            for (lx, lw, ly) in LAYS {
                let name = format!("{dtype:?} {} dx {lx:?} w {lw:?} dy {ly:?}", c.name());
                let dy = upload(&s, &values(&mut rng, &yd), &yd, &strides(ly, &yd), dtype);
                let w = upload(&s, &values(&mut rng, &c.w), &c.w, &strides(lw, &c.w), dtype);
                let dx = poisoned(&s, &c.x, &strides(lx, &c.x), dtype);
                if let Err(e) = conv::conv_backward_data(&s, &dy.t, &w.t, &dx.m, &c.g) {
                    r.error(name, e);
                    continue;
                }
                let want = reference::conv_backward_data(&dy.values, &us(&yd), &w.values, &us(&c.w), &us(&c.x), &g);
                close(&mut r, &s, name, &dx, &want);
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn backward_filter_matches_the_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(0xc0_03);
    let mut r = KernelReport::new("conv", "backward_filter");
    for c in cases() {
        let yd = c.y();
        let g = reference_geometry(&c.g);
        for dtype in FLOATS {
            for (lx, lw, ly) in LAYS {
                let name = format!("{dtype:?} {} x {lx:?} dw {lw:?} dy {ly:?}", c.name());
                let x = upload(&s, &values(&mut rng, &c.x), &c.x, &strides(lx, &c.x), dtype);
                let dy = upload(&s, &values(&mut rng, &yd), &yd, &strides(ly, &yd), dtype);
                let dw = poisoned(&s, &c.w, &strides(lw, &c.w), dtype);
                if let Err(e) = conv::conv_backward_filter(&s, &x.t, &dy.t, &dw.m, &c.g) {
                    r.error(name, e);
                    continue;
                }
                let want = reference::conv_backward_filter(&x.values, &us(&c.x), &dy.values, &us(&yd), &us(&c.w), &g);
                close(&mut r, &s, name, &dw, &want);
            }
        }
    }
    r.finish();
}

/// Two runs of each pass on the same inputs give the same bits (no atomics; the filter
/// gradient's block reduction has a fixed shape), including a filter gradient with more
/// elements than the grid has blocks (each block then walks several elements).
#[test]
#[ignore = "needs a CUDA GPU"]
fn results_are_bit_reproducible() {
    let s = stream();
    let mut rng = SplitMix64::new(0xc0_04);
    let mut r = KernelReport::new("conv", "bit-reproducible");
    let mut all = cases();
    // dw [512, 512, 3, 3]: 2.4 M elements, more than the 524 280 blocks of the grid.
    all.push(case(
        &[1, 512, 2, 2],
        &[512, 512, 3, 3],
        &[1, 1],
        &[1, 1],
        &[1, 1],
        &[1, 1],
        1,
    ));
    for c in all {
        let yd = c.y();
        let g = reference_geometry(&c.g);
        for dtype in [F32, BF16] {
            let (lx, lw, ly) = (Lay::Nhwc, Lay::Nchw, Lay::Gapped);
            let name = format!("{dtype:?} {} x {lx:?} w {lw:?} y {ly:?}", c.name());
            let x = upload(&s, &values(&mut rng, &c.x), &c.x, &strides(lx, &c.x), dtype);
            let w = upload(&s, &values(&mut rng, &c.w), &c.w, &strides(lw, &c.w), dtype);
            let dy = upload(&s, &values(&mut rng, &yd), &yd, &strides(ly, &yd), dtype);
            let runs: Vec<[DevTensor; 3]> = (0..2)
                .map(|_| {
                    [
                        poisoned(&s, &yd, &strides(ly, &yd), dtype),
                        poisoned(&s, &c.x, &strides(lx, &c.x), dtype),
                        poisoned(&s, &c.w, &strides(lw, &c.w), dtype),
                    ]
                })
                .collect();
            let mut failed = false;
            for [y, dx, dw] in &runs {
                let run = conv::conv_forward(&s, &x.t, &w.t, &y.m, &c.g)
                    .and_then(|_| conv::conv_backward_data(&s, &dy.t, &w.t, &dx.m, &c.g))
                    .and_then(|_| conv::conv_backward_filter(&s, &x.t, &dy.t, &dw.m, &c.g));
                if let Err(e) = run {
                    r.error(name.clone(), e);
                    failed = true;
                    break;
                }
            }
            if failed {
                continue;
            }
            for (k, pass) in ["forward", "backward_data", "backward_filter"].iter().enumerate() {
                if bits(&s, &runs[0][k]) == bits(&s, &runs[1][k]) {
                    r.pass();
                } else {
                    r.fail(format!("{name}: two {pass} runs differ"));
                }
            }
            // The filter gradient is also right (the large case walks several elements per
            // block).
            let want = reference::conv_backward_filter(&x.values, &us(&c.x), &dy.values, &us(&yd), &us(&c.w), &g);
            close(&mut r, &s, format!("{name} backward_filter"), &runs[0][2], &want);
        }
    }
    r.finish();
}

/// Empty outputs are no-ops; empty sums write zeros (N = 0 for the filter gradient,
/// C / groups = 0 for the forward, K = 0 for the data gradient, an all-padding input).
#[test]
#[ignore = "needs a CUDA GPU"]
fn empty_problems() {
    let s = stream();
    let mut r = KernelReport::new("conv", "empty");
    let g = ConvGeometry::new(&[1, 1], &[1, 1], &[1, 1], 2);
    for dtype in FLOATS {
        let zeros = |t: &DevTensor| vec![0.0; t.t.numel() as usize];
        // N = 0: forward and data gradient write nothing; the filter gradient is zero.
        let x0 = upload(&s, &[], &[0, 4, 5, 5], &row_major_strides(&[0, 4, 5, 5]), dtype);
        let y0 = upload(&s, &[], &[0, 6, 5, 5], &row_major_strides(&[0, 6, 5, 5]), dtype);
        let w = upload(
            &s,
            &[0.5; 6 * 2 * 9],
            &[6, 2, 3, 3],
            &row_major_strides(&[6, 2, 3, 3]),
            dtype,
        );
        let ye = poisoned(&s, &[0, 6, 5, 5], &row_major_strides(&[0, 6, 5, 5]), dtype);
        let dxe = poisoned(&s, &[0, 4, 5, 5], &row_major_strides(&[0, 4, 5, 5]), dtype);
        let dw = poisoned(&s, &[6, 2, 3, 3], &channels_last_strides(&[6, 2, 3, 3]), dtype);
        let run = conv::conv_forward(&s, &x0.t, &w.t, &ye.m, &g)
            .and_then(|_| conv::conv_backward_data(&s, &y0.t, &w.t, &dxe.m, &g))
            .and_then(|_| conv::conv_backward_filter(&s, &x0.t, &y0.t, &dw.m, &g));
        match run {
            Err(e) => r.error(format!("{dtype:?} N = 0"), e),
            Ok(()) => close(&mut r, &s, format!("{dtype:?} N = 0 dw"), &dw, &zeros(&dw)),
        }
        // C / groups = 0 (C = 0): a zero forward. K = 0: a zero data gradient.
        let xc = upload(&s, &[], &[2, 0, 5, 5], &row_major_strides(&[2, 0, 5, 5]), dtype);
        let wc = upload(&s, &[], &[6, 0, 3, 3], &row_major_strides(&[6, 0, 3, 3]), dtype);
        let y = poisoned(&s, &[2, 6, 5, 5], &channels_last_strides(&[2, 6, 5, 5]), dtype);
        match conv::conv_forward(&s, &xc.t, &wc.t, &y.m, &g) {
            Err(e) => r.error(format!("{dtype:?} C = 0"), e),
            Ok(()) => close(&mut r, &s, format!("{dtype:?} C = 0 y"), &y, &zeros(&y)),
        }
        let dyk = upload(&s, &[], &[2, 0, 5, 5], &row_major_strides(&[2, 0, 5, 5]), dtype);
        let wk = upload(&s, &[], &[0, 2, 3, 3], &row_major_strides(&[0, 2, 3, 3]), dtype);
        let dx = poisoned(&s, &[2, 4, 5, 5], &row_major_strides(&[2, 4, 5, 5]), dtype);
        match conv::conv_backward_data(&s, &dyk.t, &wk.t, &dx.m, &g) {
            Err(e) => r.error(format!("{dtype:?} K = 0"), e),
            Ok(()) => close(&mut r, &s, format!("{dtype:?} K = 0 dx"), &dx, &zeros(&dx)),
        }
        // A zero-length input whose padding alone holds the window: every output is zero.
        let g1 = ConvGeometry::new(&[1], &[1], &[1], 1);
        let xe = upload(&s, &[], &[2, 3, 0], &row_major_strides(&[2, 3, 0]), dtype);
        let w1 = upload(
            &s,
            &[0.25; 4 * 3 * 2],
            &[4, 3, 2],
            &row_major_strides(&[4, 3, 2]),
            dtype,
        );
        let y1 = poisoned(&s, &[2, 4, 1], &row_major_strides(&[2, 4, 1]), dtype);
        match conv::conv_forward(&s, &xe.t, &w1.t, &y1.m, &g1) {
            Err(e) => r.error(format!("{dtype:?} all padding"), e),
            Ok(()) => close(&mut r, &s, format!("{dtype:?} all padding y"), &y1, &zeros(&y1)),
        }
    }
    r.finish();
}

/// Invalid arguments are errors naming the op and argument, and launch nothing.
#[test]
#[ignore = "needs a CUDA GPU"]
fn invalid_arguments_are_errors() {
    let s = stream();
    let mut rng = SplitMix64::new(0xc0_05);
    let c = case(&[2, 6, 9, 8], &[4, 3, 3, 3], &[1, 1], &[1, 1], &[1, 1], &[1, 1], 2);
    let yd = c.y();
    let x = upload(&s, &values(&mut rng, &c.x), &c.x, &row_major_strides(&c.x), F32);
    let w = upload(&s, &values(&mut rng, &c.w), &c.w, &row_major_strides(&c.w), F32);
    let wh = upload(&s, &values(&mut rng, &c.w), &c.w, &row_major_strides(&c.w), F16);
    let y = poisoned(&s, &yd, &row_major_strides(&yd), F32);
    let arg_of = |r: cudnn_backend::Result<()>| match r {
        Err(cudnn_backend::Error::InvalidArgument { op, arg, .. }) => (op, arg),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert_eq!(
        arg_of(conv::conv_forward(&s, &x.t, &wh.t, &y.m, &c.g)),
        ("conv_forward", "w")
    );
    let bad_groups = ConvGeometry::new(&[1, 1], &[1, 1], &[1, 1], 4);
    assert_eq!(
        arg_of(conv::conv_forward(&s, &x.t, &w.t, &y.m, &bad_groups)),
        ("conv_forward", "groups")
    );
    // The output may not share memory with an input: y placed over x's buffer.
    // SAFETY: the view lies in x's buffer, which outlives it, and is used on `s` only.
    let (_, y_on_x) = unsafe { views_of(&s, &x.buf, 0, &yd, &row_major_strides(&yd), F32) };
    match conv::conv_forward(&s, &x.t, &w.t, &y_on_x, &c.g) {
        Err(cudnn_backend::Error::InvalidArgument { op, arg, reason }) => {
            assert_eq!((op, arg), ("conv_forward", "y"));
            assert!(reason.contains("x's"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // dw placed over dy's buffer.
    // SAFETY: as above, in y's buffer.
    let (_, dw_on_dy) = unsafe { views_of(&s, &y.buf, 0, &c.w, &row_major_strides(&c.w), F32) };
    match conv::conv_backward_filter(&s, &x.t, &y.t, &dw_on_dy, &c.g) {
        Err(cudnn_backend::Error::InvalidArgument { op, arg, reason }) => {
            assert_eq!((op, arg), ("conv_backward_filter", "dw"));
            assert!(reason.contains("dy's"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // Mismatched dims: dx with the wrong spatial size for dy.
    let dx = poisoned(&s, &[2, 6, 9, 9], &row_major_strides(&[2, 6, 9, 9]), F32);
    assert_eq!(
        arg_of(conv::conv_backward_data(&s, &y.t, &w.t, &dx.m, &c.g)),
        ("conv_backward_data", "dy")
    );
    assert!(download(&s, &dx).iter().all(|v| v.is_nan()));
    // Nothing ran: y is still poisoned.
    assert!(download(&s, &y).iter().all(|v| v.is_nan()));
}
