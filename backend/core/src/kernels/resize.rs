//! Resize kernels: nearest, bilinear and bicubic interpolation of `[N, C, H, W]` tensors
//! to any `[N, C, OH, OW]`, their backwards, and bilinear grid sampling (Burn's
//! `interpolate`, `interpolate_backward` and `float_grid_sample_2d`).
//!
//! Every function takes the stream first, validates all its arguments, and only enqueues
//! work (it never synchronizes). Tensors are `[N, C, H, W]` in any strides (NCHW, NHWC,
//! transposed, gapped); the written operand must not overlap itself (no 0 stride on a
//! dim > 1) nor alias the inputs. Dtypes are F32, F16, BF16 and F64 (f16/bf16 accumulate
//! in f32). Empty outputs return `Ok(())` at once after validation.
//!
//! Index conventions are burn-ndarray 0.21's (PyTorch's), source coordinates computed in
//! f64:
//! - nearest: `floor(o * (in / out))` (align_corners is ignored);
//! - bilinear / bicubic with `align_corners`: `o * (in - 1) / max(out - 1, 1)`; without:
//!   `(o + 0.5) * (in / out) - 0.5`, clamped to `[0, in - 1]` for bilinear only;
//! - bilinear reads `floor(s)` and `min(ceil(s), in - 1)`; bicubic (A = -0.75) reads
//!   `floor(s) - 1 ..= floor(s) + 2` clamped into the input.
//!
//! The nearest backward gathers (deterministic); the bilinear and bicubic backwards
//! zero-fill `dx` and scatter with atomic adds (f16/bf16 by compare-and-swap on the
//! containing 32-bit word), so they are not bit-reproducible. Grid sampling is bilinear
//! with zeros padding (Burn's `GridSampleOptions` default mode and padding; the caller
//! passes `align_corners`, whose Burn default is `false`).
//!
//! Host work is split in two: a pure `plan_*` function (validation, layouts, kernel
//! choice) that needs no device, and the launch of the planned kernel (`kernels/resize.cu`:
//! `interp_{nearest,bilinear,bicubic}_{fwd,bwd}_<dt>`, `grid_sample_<dt>` and
//! `resize_zero_b{2,4,8}`).

use crate::kernels::check::{check_no_overlap, check_rank4, float_slot, on_stream, same_dtype, view_layout};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_resize as launch;
use crate::ffi::memory::DeviceBuffer;
use crate::graph::DataType;
use crate::kernels::{stream_function, stream_functions, RESIZE};
use crate::types::{row_major_strides, TensorMut, TensorRef};

/// Interpolation algorithm (Burn's `InterpolateMode` without Lanczos3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InterpolateMode {
    /// Nearest neighbour: `floor(o * in / out)`.
    Nearest,
    /// Bilinear, 2 x 2 taps.
    Bilinear,
    /// Bicubic convolution (A = -0.75), 4 x 4 taps clamped to the border.
    Bicubic,
}

impl InterpolateMode {
    fn slot(self) -> usize {
        match self {
            InterpolateMode::Nearest => 0,
            InterpolateMode::Bilinear => 1,
            InterpolateMode::Bicubic => 2,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Plans (pure host logic)

/// Interpolation forward or backward: optionally zero-fill the destination (`zero_n`
/// elements), then run `entry` over `n` elements; layouts of (source, destination).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InterpPlan {
    pub zero_entry: Option<&'static str>,
    pub zero_n: i64,
    pub entry: &'static str,
    pub layouts: [KernelLayout; 2],
    pub align_corners: bool,
    pub n: i64,
}

/// Grid sampling: layouts of (x, grid, out) over the `n` output elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GridSamplePlan {
    pub entry: &'static str,
    pub layouts: [KernelLayout; 3],
    pub align_corners: bool,
    pub n: i64,
}

/// Entries by mode (nearest, bilinear, bicubic) then dtype (F32, F16, BF16, F64).
const FWD: [[&str; 4]; 3] = [
    [
        "interp_nearest_fwd_f32",
        "interp_nearest_fwd_f16",
        "interp_nearest_fwd_bf16",
        "interp_nearest_fwd_f64",
    ],
    [
        "interp_bilinear_fwd_f32",
        "interp_bilinear_fwd_f16",
        "interp_bilinear_fwd_bf16",
        "interp_bilinear_fwd_f64",
    ],
    [
        "interp_bicubic_fwd_f32",
        "interp_bicubic_fwd_f16",
        "interp_bicubic_fwd_bf16",
        "interp_bicubic_fwd_f64",
    ],
];
const BWD: [[&str; 4]; 3] = [
    [
        "interp_nearest_bwd_f32",
        "interp_nearest_bwd_f16",
        "interp_nearest_bwd_bf16",
        "interp_nearest_bwd_f64",
    ],
    [
        "interp_bilinear_bwd_f32",
        "interp_bilinear_bwd_f16",
        "interp_bilinear_bwd_bf16",
        "interp_bilinear_bwd_f64",
    ],
    [
        "interp_bicubic_bwd_f32",
        "interp_bicubic_bwd_f16",
        "interp_bicubic_bwd_bf16",
        "interp_bicubic_bwd_f64",
    ],
];
/// The deterministic two-pass backward: (width pass, height pass) by mode (bilinear,
/// bicubic) then dtype.
const BWD_ORDERED: [[(&str, &str); 4]; 2] = [
    [
        ("interp_bilinear_bwd_w_f32", "interp_bilinear_bwd_h_f32"),
        ("interp_bilinear_bwd_w_f16", "interp_bilinear_bwd_h_f16"),
        ("interp_bilinear_bwd_w_bf16", "interp_bilinear_bwd_h_bf16"),
        ("interp_bilinear_bwd_w_f64", "interp_bilinear_bwd_h_f64"),
    ],
    [
        ("interp_bicubic_bwd_w_f32", "interp_bicubic_bwd_h_f32"),
        ("interp_bicubic_bwd_w_f16", "interp_bicubic_bwd_h_f16"),
        ("interp_bicubic_bwd_w_bf16", "interp_bicubic_bwd_h_bf16"),
        ("interp_bicubic_bwd_w_f64", "interp_bicubic_bwd_h_f64"),
    ],
];
const GRID: [&str; 4] = [
    "grid_sample_f32",
    "grid_sample_f16",
    "grid_sample_bf16",
    "grid_sample_f64",
];

/// `resize_zero_b{2,4,8}` by element size (float dtypes only reach here).
fn zero_entry(dtype: DataType) -> &'static str {
    match dtype.size() {
        2 => "resize_zero_b2",
        4 => "resize_zero_b4",
        _ => "resize_zero_b8",
    }
}

/// Checks the (input-sized, output-sized) pair: same N and C; when the output-sized side
/// has elements, the input-sized side needs a positive H and W (it is sampled).
fn check_pair(
    op: &'static str,
    input: (&'static str, &TensorRef),
    output: (&'static str, &TensorRef, i64),
) -> Result<()> {
    let (ia, i) = input;
    let (oa, o, o_numel) = output;
    if i.dims[..2] != o.dims[..2] {
        return Err(Error::invalid_arg(
            op,
            oa,
            format!("N, C of {:?} differ from {ia}'s {:?}", o.dims, i.dims),
        ));
    }
    if o_numel > 0 && (i.dims[2] == 0 || i.dims[3] == 0) {
        return Err(Error::invalid_arg(
            op,
            ia,
            format!(
                "spatial dims of {:?} must be positive to resize to {:?}",
                i.dims, o.dims
            ),
        ));
    }
    Ok(())
}

pub(crate) fn plan_interpolate(
    x: &TensorRef,
    mode: InterpolateMode,
    align_corners: bool,
    out: &TensorRef,
) -> Result<Option<InterpPlan>> {
    const OP: &str = "interpolate";
    check_rank4(OP, "x", x)?;
    let n = check_rank4(OP, "out", out)?;
    let slot = float_slot(OP, "x", x.dtype)?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    check_pair(OP, ("x", x), ("out", out, n))?;
    check_no_overlap(OP, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(InterpPlan {
        zero_entry: None,
        zero_n: 0,
        entry: FWD[mode.slot()][slot],
        layouts: [view_layout(OP, x)?, view_layout(OP, out)?],
        align_corners,
        n,
    }))
}

pub(crate) fn plan_interpolate_backward(
    dy: &TensorRef,
    mode: InterpolateMode,
    align_corners: bool,
    dx: &TensorRef,
) -> Result<Option<InterpPlan>> {
    const OP: &str = "interpolate_backward";
    let dy_n = check_rank4(OP, "dy", dy)?;
    let dx_n = check_rank4(OP, "dx", dx)?;
    let slot = float_slot(OP, "dx", dx.dtype)?;
    same_dtype(OP, "dy", dy, dx.dtype, "dx")?;
    check_pair(OP, ("dx", dx), ("dy", dy, dy_n))?;
    check_no_overlap(OP, "dx", dx)?;
    if dx_n == 0 {
        return Ok(None);
    }
    let layouts = [view_layout(OP, dy)?, view_layout(OP, dx)?];
    let entry = BWD[mode.slot()][slot];
    Ok(Some(match mode {
        // Gather over dx: every element is written, no zero-fill.
        InterpolateMode::Nearest => InterpPlan {
            zero_entry: None,
            zero_n: 0,
            entry,
            layouts,
            align_corners,
            n: dx_n,
        },
        InterpolateMode::Bilinear | InterpolateMode::Bicubic => InterpPlan {
            zero_entry: Some(zero_entry(dx.dtype)),
            zero_n: dx_n,
            entry,
            layouts,
            align_corners,
            n: dy_n,
        },
    }))
}

pub(crate) fn plan_grid_sample_2d(
    x: &TensorRef,
    grid: &TensorRef,
    align_corners: bool,
    out: &TensorRef,
) -> Result<Option<GridSamplePlan>> {
    const OP: &str = "grid_sample_2d";
    check_rank4(OP, "x", x)?;
    check_rank4(OP, "grid", grid)?;
    let n = check_rank4(OP, "out", out)?;
    let slot = float_slot(OP, "x", x.dtype)?;
    same_dtype(OP, "grid", grid, x.dtype, "x")?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    if grid.dims[0] != x.dims[0] || grid.dims[3] != 2 {
        return Err(Error::invalid_arg(
            OP,
            "grid",
            format!("dims {:?} are not [N, OH, OW, 2] with x's N = {}", grid.dims, x.dims[0]),
        ));
    }
    let want = [x.dims[0], x.dims[1], grid.dims[1], grid.dims[2]];
    if out.dims[..] != want[..] {
        return Err(Error::invalid_arg(
            OP,
            "out",
            format!("dims {:?} differ from {want:?} (x's N, C and grid's OH, OW)", out.dims),
        ));
    }
    check_pair(OP, ("x", x), ("out", out, n))?;
    check_no_overlap(OP, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(GridSamplePlan {
        entry: GRID[slot],
        layouts: [view_layout(OP, x)?, view_layout(OP, grid)?, view_layout(OP, out)?],
        align_corners,
        n,
    }))
}

// ---------------------------------------------------------------------------------------
// Public API

fn run(
    stream: &Arc<CudaStream>,
    plan: &InterpPlan,
    src: crate::types::DeviceAddress,
    dst: crate::types::DeviceAddress,
) -> Result<()> {
    let f = stream_function(stream, RESIZE, plan.entry)?;
    if let Some(z) = plan.zero_entry {
        let z = stream_function(stream, RESIZE, z)?;
        crate::ffi::launch::zero_view(stream, &z, dst, &plan.layouts[1], plan.zero_n)?;
    }
    if plan.n == 0 {
        return Ok(());
    }
    launch::interp(stream, &f, src, dst, &plan.layouts, plan.align_corners, plan.n)
}

/// Interpolates `x` `[N, C, H, W]` into `out` `[N, C, OH, OW]` (same dtype, any OH, OW;
/// H and W positive unless `out` is empty) with `mode` (`align_corners` as in Burn's
/// `InterpolateOptions`; ignored by `Nearest`).
pub fn interpolate(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    mode: InterpolateMode,
    align_corners: bool,
    out: &TensorMut,
) -> Result<()> {
    on_stream(stream, "interpolate", &[("x", x), ("out", out)])?;
    let Some(plan) = plan_interpolate(x, mode, align_corners, out)? else {
        return Ok(());
    };
    run(stream, &plan, x.address(), out.address())
}

/// Interpolation backward: writes `dx` `[N, C, H, W]` with the adjoint of
/// [`interpolate`] applied to `dy` `[N, C, OH, OW]` (same dtype). Nearest gathers
/// (deterministic); bilinear and bicubic zero-fill `dx` and scatter with atomic adds, or in
/// the engine's deterministic mode run [`interpolate_backward_ordered`].
pub fn interpolate_backward(
    stream: &Arc<CudaStream>,
    dy: &TensorRef,
    mode: InterpolateMode,
    align_corners: bool,
    dx: &TensorMut,
) -> Result<()> {
    if mode != InterpolateMode::Nearest && crate::plan::policy().deterministic {
        return interpolate_backward_ordered(stream, dy, mode, align_corners, dx);
    }
    on_stream(stream, "interpolate_backward", &[("dy", dy), ("dx", dx)])?;
    let Some(plan) = plan_interpolate_backward(dy, mode, align_corners, dx)? else {
        return Ok(());
    };
    run(stream, &plan, dy.address(), dx.address())
}

/// [`interpolate_backward`] without atomics: two gather passes over the separable weights
/// (along W into an accumulator-precision `[N, C, OH, W]` scratch, then along H), so every
/// `dx` element is a fixed-order sum and results are bit-reproducible. Nearest runs
/// [`interpolate_backward`]'s own gather.
pub fn interpolate_backward_ordered(
    stream: &Arc<CudaStream>,
    dy: &TensorRef,
    mode: InterpolateMode,
    align_corners: bool,
    dx: &TensorMut,
) -> Result<()> {
    const OP: &str = "interpolate_backward";
    on_stream(stream, OP, &[("dy", dy), ("dx", dx)])?;
    let Some(plan) = plan_interpolate_backward(dy, mode, align_corners, dx)? else {
        return Ok(());
    };
    let entries = match mode {
        InterpolateMode::Nearest => return run(stream, &plan, dy.address(), dx.address()),
        InterpolateMode::Bilinear => &BWD_ORDERED[0],
        InterpolateMode::Bicubic => &BWD_ORDERED[1],
    };
    let (entry_w, entry_h) = entries[float_slot(OP, "dx", dx.dtype)?];
    let acc = if dx.dtype == DataType::F64 {
        DataType::F64
    } else {
        DataType::F32
    };
    let tmp_dims = [dy.dims[0], dy.dims[1], dy.dims[2], dx.dims[3]];
    let tmp_n: i64 = tmp_dims.iter().product();
    let scratch = DeviceBuffer::alloc(stream, tmp_n.max(1) as usize * acc.size(), OP)?;
    let tmp = scratch.view_mut(0, &tmp_dims, &row_major_strides(&tmp_dims), acc)?;
    let lt = view_layout(OP, &tmp)?;
    let [fw, fh] = stream_functions(stream, RESIZE, [entry_w, entry_h])?;
    if tmp_n > 0 {
        launch::interp(
            stream,
            &fw,
            dy.address(),
            tmp.address(),
            &[plan.layouts[0], lt],
            align_corners,
            tmp_n,
        )?;
    }
    launch::interp(
        stream,
        &fh,
        tmp.address(),
        dx.address(),
        &[lt, plan.layouts[1]],
        align_corners,
        dx.numel(),
    )
}

/// Bilinear grid sampling with zeros padding: `out[n, c, h, w]` samples `x`
/// `[N, C, H, W]` at `grid[n, h, w]` = `(x, y)` `[N, OH, OW, 2]` (same dtype), where -1
/// and 1 are the corner pixel centres with `align_corners` and their outer edges without
/// (Burn's default). Taps outside the input, and non-finite coordinates, read 0.
pub fn grid_sample_2d(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    grid: &TensorRef,
    align_corners: bool,
    out: &TensorMut,
) -> Result<()> {
    on_stream(stream, "grid_sample_2d", &[("x", x), ("grid", grid), ("out", out)])?;
    let Some(plan) = plan_grid_sample_2d(x, grid, align_corners, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, RESIZE, plan.entry)?;
    launch::grid_sample(
        stream,
        &f,
        x.address(),
        grid.address(),
        out.address(),
        &plan.layouts,
        plan.align_corners,
        plan.n,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use DataType::*;
    use InterpolateMode::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
    }

    use crate::kernels::invalid_argument as invalid;

    // Mirrors of the coordinate helpers in `kernels/resize.cu`.

    fn nearest_src(o: i64, inp: i64, out: i64) -> i64 {
        let ratio = inp as f64 / out as f64;
        ((ratio * o as f64).floor() as i64).min(inp - 1)
    }

    fn linear_src(o: i64, inp: i64, out: i64, align: bool) -> f64 {
        if align {
            ((inp - 1) as f64 / (out - 1).max(1) as f64) * o as f64
        } else {
            (o as f64 + 0.5) * (inp as f64 / out as f64) - 0.5
        }
    }

    fn linear_taps(o: i64, inp: i64, out: i64, align: bool) -> (i64, i64, f64) {
        let mut s = linear_src(o, inp, out, align);
        if !align {
            s = s.max(0.0).min((inp - 1) as f64);
        }
        let f = s.floor();
        (f as i64, (s.ceil() as i64).min(inp - 1), s - f)
    }

    fn cubic_taps(o: i64, inp: i64, out: i64, align: bool) -> ([i64; 4], [f64; 4]) {
        let s = linear_src(o, inp, out, align);
        let f = s.floor();
        let t = s - f;
        let a = -0.75;
        let c1 = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
        let c2 = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
        let base = f as i64;
        let idx = [0, 1, 2, 3].map(|k| (base - 1 + k).max(0).min(inp - 1));
        (idx, [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)])
    }

    fn nearest_range(i: i64, inp: i64, out: i64) -> (i64, i64) {
        (
            ((i * out) / inp - 1).max(0),
            (((i + 1) * out + inp - 1) / inp + 1).min(out),
        )
    }

    fn grid_src(g: f64, size: i64, align: bool) -> f64 {
        if align {
            (g + 1.0) * (size - 1) as f64 / 2.0
        } else {
            (g + 1.0) * size as f64 / 2.0 - 0.5
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn nearest_coordinates_follow_pytorch() {
        // 2 -> 5: floor(o * 0.4) = 0 0 0 1 1; 5 -> 2: floor(o * 2.5) = 0 2; 3 -> 3: identity.
        let map = |inp: i64, out: i64| (0..out).map(|o| nearest_src(o, inp, out)).collect::<Vec<_>>();
        assert_eq!(map(2, 5), [0, 0, 0, 1, 1]);
        assert_eq!(map(5, 2), [0, 2]);
        assert_eq!(map(3, 3), [0, 1, 2]);
        assert_eq!(map(4, 6), [0, 0, 1, 2, 2, 3]);
        assert_eq!(map(7, 3), [0, 2, 4]);
    }

    #[test]
    fn nearest_backward_ranges_cover_every_source() {
        // Every output o with source i lies in i's candidate range (the gather is the
        // exact adjoint of the forward).
        for inp in 1..40 {
            for out in 1..40 {
                for o in 0..out {
                    let i = nearest_src(o, inp, out);
                    assert!((0..inp).contains(&i));
                    let (lo, hi) = nearest_range(i, inp, out);
                    assert!(lo <= o && o < hi, "in {inp} out {out} o {o} i {i} range {lo}..{hi}");
                }
            }
        }
    }

    #[test]
    fn linear_coordinates_follow_pytorch() {
        // align_corners: 3 -> 5 steps by 0.5; out = 1 reads index 0.
        assert!(close(linear_src(3, 3, 5, true), 1.5));
        assert!(close(linear_src(0, 4, 1, true), 0.0));
        // half-pixel: 4 -> 8: (o + 0.5) / 2 - 0.5 = -0.25, 0.25, ...; 8 -> 4: 2o + 0.5.
        assert!(close(linear_src(0, 4, 8, false), -0.25));
        assert!(close(linear_src(3, 4, 8, false), 1.25));
        assert!(close(linear_src(2, 8, 4, false), 4.5));
        // Bilinear taps clamp the coordinate, and the upper tap, into the input.
        assert_eq!(linear_taps(0, 4, 8, false), (0, 0, 0.0));
        assert_eq!(linear_taps(7, 4, 8, false), (3, 3, 0.0));
        let (i0, i1, w) = linear_taps(3, 4, 8, false);
        assert_eq!((i0, i1), (1, 2));
        assert!(close(w, 0.25));
        let (i0, i1, w) = linear_taps(1, 3, 5, true);
        assert_eq!((i0, i1), (0, 1));
        assert!(close(w, 0.5));
    }

    #[test]
    fn cubic_taps_and_weights() {
        // t = 0: weights (0, 1, 0, 0); t = 0.5: (-0.09375, 0.59375, 0.59375, -0.09375).
        let (idx, w) = cubic_taps(2, 5, 5, true);
        assert_eq!(idx, [1, 2, 3, 4]);
        for (a, b) in w.iter().zip([0.0, 1.0, 0.0, 0.0]) {
            assert!(close(*a, b), "{w:?}");
        }
        let (idx, w) = cubic_taps(1, 3, 5, true);
        assert_eq!(idx, [0, 0, 1, 2]);
        for (a, b) in w.iter().zip([-0.09375, 0.59375, 0.59375, -0.09375]) {
            assert!(close(*a, b), "{w:?}");
        }
        // Weights sum to 1 for any t; border taps clamp (4 -> 8 half-pixel: s = -0.25).
        let (idx, w) = cubic_taps(0, 4, 8, false);
        assert_eq!(idx, [0, 0, 0, 1]);
        assert!(close(w.iter().sum::<f64>(), 1.0));
        let (idx, _) = cubic_taps(7, 4, 8, false);
        assert_eq!(idx, [2, 3, 3, 3]);
    }

    #[test]
    fn grid_coordinates_follow_burn() {
        assert!(close(grid_src(-1.0, 5, true), 0.0));
        assert!(close(grid_src(1.0, 5, true), 4.0));
        assert!(close(grid_src(0.0, 5, true), 2.0));
        assert!(close(grid_src(-1.0, 4, false), -0.5));
        assert!(close(grid_src(1.0, 4, false), 3.5));
        assert!(close(grid_src(0.0, 4, false), 1.5));
    }

    #[test]
    fn entry_names_by_mode_and_dtype() {
        for (d, s) in [(F32, "f32"), (F16, "f16"), (BF16, "bf16"), (F64, "f64")] {
            let x = t(&[2, 3, 4, 5], d);
            let y = t(&[2, 3, 7, 3], d);
            for (m, name) in [(Nearest, "nearest"), (Bilinear, "bilinear"), (Bicubic, "bicubic")] {
                let p = plan_interpolate(&x, m, true, &y).unwrap().unwrap();
                assert_eq!(p.entry, format!("interp_{name}_fwd_{s}"));
                assert_eq!((p.zero_entry, p.n, p.align_corners), (None, 126, true));
                let b = plan_interpolate_backward(&y, m, false, &x).unwrap().unwrap();
                assert_eq!(b.entry, format!("interp_{name}_bwd_{s}"));
                assert!(!b.align_corners);
                if m == Nearest {
                    assert_eq!((b.zero_entry, b.n), (None, 120));
                } else {
                    let z = format!("resize_zero_b{}", d.size());
                    assert_eq!((b.zero_entry, b.zero_n, b.n), (Some(z.as_str()), 120, 126));
                }
            }
            let g = plan_grid_sample_2d(&x, &t(&[2, 6, 7, 2], d), false, &t(&[2, 3, 6, 7], d))
                .unwrap()
                .unwrap();
            assert_eq!((g.entry, g.n), (GRID[float_slot("t", "x", d).unwrap()], 252));
            assert_eq!(g.entry, format!("grid_sample_{s}"));
        }
        for d in [I32, I64, U8, Bool] {
            let (op, arg, why) = invalid(plan_interpolate(
                &t(&[1, 1, 2, 2], d),
                Bilinear,
                false,
                &t(&[1, 1, 4, 4], d),
            ));
            assert_eq!((op, arg), ("interpolate", "x"));
            assert!(why.contains(&format!("{d:?}")), "{why}");
        }
    }

    #[test]
    fn layouts_keep_the_four_dims_and_strides() {
        let x = ts(&[2, 3, 7, 6], &[126, 1, 18, 3], BF16);
        let out = t(&[2, 3, 1, 1], BF16);
        let p = plan_interpolate(&x, Bicubic, false, &out).unwrap().unwrap();
        assert_eq!(p.layouts[0].rank, 4);
        assert_eq!(&p.layouts[0].shape[..4], &[2, 3, 7, 6]);
        assert_eq!(&p.layouts[0].strides[..4], &[126, 1, 18, 3]);
        assert_eq!(&p.layouts[1].shape[..4], &[2, 3, 1, 1]);
        let g = ts(&[2, 1, 1, 2], &[2, 2, 2, 1], BF16);
        let p = plan_grid_sample_2d(&x, &g, true, &out).unwrap().unwrap();
        assert_eq!(&p.layouts[1].shape[..4], &[2, 1, 1, 2]);
        assert_eq!(&p.layouts[1].strides[..4], &[2, 2, 2, 1]);
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let x = t(&[2, 3, 4, 4], F32);
        let o = t(&[2, 3, 8, 8], F32);
        let (op, arg, why) = invalid(plan_interpolate(&t(&[3, 4, 4], F32), Nearest, false, &o));
        assert_eq!((op, arg), ("interpolate", "x"));
        assert!(why.contains("rank 3"), "{why}");
        let (_, arg, why) = invalid(plan_interpolate(&x, Nearest, false, &t(&[2, 4, 8, 8], F32)));
        assert_eq!(arg, "out");
        assert!(why.contains("N, C"), "{why}");
        assert_eq!(
            invalid(plan_interpolate(&x, Bilinear, false, &t(&[2, 3, 8, 8], F16))).1,
            "out"
        );
        let (_, arg, why) = invalid(plan_interpolate(&t(&[2, 3, 0, 4], F32), Bilinear, true, &o));
        assert_eq!(arg, "x");
        assert!(why.contains("positive"), "{why}");
        // An empty output from an empty input is fine.
        assert!(
            plan_interpolate(&t(&[2, 3, 0, 4], F32), Bilinear, true, &t(&[2, 3, 0, 8], F32))
                .unwrap()
                .is_none()
        );
        // backward
        assert_eq!(
            invalid(plan_interpolate_backward(&t(&[2, 3, 8, 8], F64), Bicubic, false, &x)).1,
            "dy"
        );
        assert_eq!(
            invalid(plan_interpolate_backward(&t(&[1, 3, 8, 8], F32), Bicubic, false, &x)).1,
            "dy"
        );
        assert_eq!(
            invalid(plan_interpolate_backward(&o, Nearest, false, &t(&[2, 3, 0, 4], F32))).1,
            "dx"
        );
        assert_eq!(
            invalid(plan_interpolate_backward(&o, Nearest, false, &t(&[2, 3, 4, 4], I32))).1,
            "dx"
        );
        // grid sample
        let g = t(&[2, 8, 8, 2], F32);
        assert!(plan_grid_sample_2d(&x, &g, false, &o).is_ok());
        assert_eq!(
            invalid(plan_grid_sample_2d(&x, &t(&[2, 8, 8, 3], F32), false, &o)).1,
            "grid"
        );
        assert_eq!(
            invalid(plan_grid_sample_2d(&x, &t(&[1, 8, 8, 2], F32), false, &o)).1,
            "grid"
        );
        assert_eq!(
            invalid(plan_grid_sample_2d(&x, &t(&[2, 8, 8, 2], F16), false, &o)).1,
            "grid"
        );
        assert_eq!(
            invalid(plan_grid_sample_2d(&x, &t(&[2, 8, 8], F32), false, &o)).1,
            "grid"
        );
        let (_, arg, why) = invalid(plan_grid_sample_2d(&x, &g, false, &t(&[2, 3, 8, 7], F32)));
        assert_eq!(arg, "out");
        assert!(why.contains("[2, 3, 8, 8]"), "{why}");
        assert_eq!(
            invalid(plan_grid_sample_2d(&t(&[2, 3, 4, 0], F32), &g, false, &o)).1,
            "x"
        );
        // strides, negative dims, null pointers
        assert_eq!(
            invalid(plan_interpolate(
                &ts(&[2, 3, 4, 4], &[1, 1, 1], F32),
                Nearest,
                false,
                &o
            ))
            .1,
            "x"
        );
        assert_eq!(
            invalid(plan_interpolate(
                &ts(&[2, -3, 4, 4], &[1, 1, 1, 1], F32),
                Nearest,
                false,
                &o
            ))
            .1,
            "x"
        );
        assert_eq!(
            invalid(plan_interpolate(
                &x,
                Nearest,
                false,
                &TensorRef::fake_packed(&[2, 3, 8, 8], F32, 0)
            ))
            .1,
            "out"
        );
    }

    #[test]
    fn written_operands_must_not_overlap() {
        let x = t(&[2, 3, 4, 4], F32);
        let bad = ts(&[2, 3, 8, 8], &[0, 64, 8, 1], F32);
        let (_, arg, why) = invalid(plan_interpolate(&x, Bilinear, false, &bad));
        assert_eq!(arg, "out");
        assert!(why.contains("overlap"), "{why}");
        assert_eq!(
            invalid(plan_interpolate_backward(
                &t(&[2, 3, 8, 8], F32),
                Bicubic,
                true,
                &ts(&[2, 3, 4, 4], &[16, 0, 4, 1], F32)
            ))
            .1,
            "dx"
        );
        assert_eq!(
            invalid(plan_grid_sample_2d(&x, &t(&[2, 8, 8, 2], F32), false, &bad)).1,
            "out"
        );
        // Broadcast inputs are fine.
        let o = t(&[2, 3, 8, 8], F32);
        assert!(plan_interpolate(&ts(&[2, 3, 4, 4], &[0, 0, 4, 1], F32), Nearest, false, &o).is_ok());
        assert!(plan_grid_sample_2d(&x, &ts(&[2, 8, 8, 2], &[0, 0, 0, 1], F32), false, &o).is_ok());
    }

    #[test]
    fn empty_outputs_plan_nothing_but_still_validate() {
        let x = t(&[0, 3, 4, 4], F32);
        let o = t(&[0, 3, 8, 8], F32);
        assert!(plan_interpolate(&x, Bicubic, false, &o).unwrap().is_none());
        assert!(plan_interpolate_backward(&o, Bilinear, false, &x).unwrap().is_none());
        assert!(plan_grid_sample_2d(&x, &t(&[0, 8, 8, 2], F32), false, &o)
            .unwrap()
            .is_none());
        invalid(plan_interpolate(&x, Bicubic, false, &t(&[0, 3, 8, 8], F16)));
        // An empty dy still zero-fills dx for the scattering modes.
        let b = plan_interpolate_backward(&t(&[2, 3, 0, 0], F32), Bilinear, true, &t(&[2, 3, 4, 4], F32))
            .unwrap()
            .unwrap();
        assert_eq!((b.zero_n, b.n), (96, 0));
        let b = plan_interpolate_backward(&t(&[2, 3, 0, 0], F32), Nearest, true, &t(&[2, 3, 4, 4], F32))
            .unwrap()
            .unwrap();
        assert_eq!((b.zero_entry, b.n), (None, 96));
    }
}
