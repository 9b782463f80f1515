//! Interpolation (nearest, bilinear, bicubic) and its backward pass.

use super::*;
use crate::burn::tensor::{expect, CudnnTensor};
use crate::kernels::resize::{self as kresize, InterpolateMode as KMode};

/// The kernels' mode for Burn's, or a panic naming the unsupported one.
fn interp_mode(op: &str, mode: &burn_backend::ops::InterpolateMode) -> KMode {
    use burn_backend::ops::InterpolateMode as M;
    match mode {
        M::Nearest => KMode::Nearest,
        M::Bilinear => KMode::Bilinear,
        M::Bicubic => KMode::Bicubic,
        // Lanczos3 runs as two exact GEMMs (`lanczos` module) before the kernels are asked.
        M::Lanczos3 => panic!("cudnn-backend: {op}: the resize kernels have no Lanczos3 mode; use layers::lanczos"),
    }
}

/// Resizes `x [N, C, H, W]` to `[N, C, oh, ow]`.
pub(crate) fn interpolate(
    x: CudnnTensor,
    size: [usize; 2],
    options: &burn_backend::ops::InterpolateOptions,
) -> CudnnTensor {
    const OP: &str = "interpolate";
    require_float(OP, &x);
    if matches!(options.mode, burn_backend::ops::InterpolateMode::Lanczos3) {
        return lanczos::lanczos3_interpolate(x, size, options.align_corners);
    }
    let mode = interp_mode(OP, &options.mode);
    let d = x.dims();
    assert!(d.len() == 4, "cudnn-backend: {OP}: input {d:?} must be [N, C, H, W]");
    let out = x.empty_on(&[d[0], d[1], size[0] as i64, size[1] as i64], x.dtype, OP);
    expect(
        OP,
        kresize::interpolate(x.stream(), &x.tref(), mode, options.align_corners, &out.tmut()),
    );
    out
}

/// Gradient of [`interpolate`] with respect to `x`.
pub(crate) fn interpolate_backward(
    x: &CudnnTensor,
    dy: CudnnTensor,
    options: &burn_backend::ops::InterpolateOptions,
) -> CudnnTensor {
    const OP: &str = "interpolate_backward";
    require_float(OP, &dy);
    if matches!(options.mode, burn_backend::ops::InterpolateMode::Lanczos3) {
        return lanczos::lanczos3_interpolate_backward(x.dims(), dy, options.align_corners);
    }
    let mode = interp_mode(OP, &options.mode);
    let dx = dy.empty_on(x.dims(), dy.dtype, OP);
    expect(
        OP,
        kresize::interpolate_backward(dx.stream(), &dy.tref(), mode, options.align_corners, &dx.tmut()),
    );
    dx
}
