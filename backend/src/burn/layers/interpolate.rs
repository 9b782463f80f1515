//! Interpolation (nearest, bilinear, bicubic) and its backward pass.

use super::*;
use crate::burn::tensor::CudnnTensor;
use crate::ops::resize::{self as kresize, InterpolateMode as KMode};

/// The kernels' mode for Burn's, or an error naming the unsupported one.
fn interp_mode(op: &str, mode: &burn_backend::ops::InterpolateMode) -> Result<KMode> {
    use burn_backend::ops::InterpolateMode as M;
    Ok(match mode {
        M::Nearest => KMode::Nearest,
        M::Bilinear => KMode::Bilinear,
        M::Bicubic => KMode::Bicubic,
        // Lanczos3 runs as two exact GEMMs (`lanczos` module) before the kernels are asked.
        M::Lanczos3 => {
            return Err(Error::invalid_input(
                op,
                "the resize kernels have no Lanczos3 mode; use layers::lanczos",
            ))
        }
    })
}

/// Resizes `x [N, C, H, W]` to `[N, C, oh, ow]`.
pub(crate) fn interpolate(
    x: CudnnTensor,
    size: [usize; 2],
    options: &burn_backend::ops::InterpolateOptions,
) -> Result<CudnnTensor> {
    const OP: &str = "interpolate";
    require_float(OP, &x)?;
    if matches!(options.mode, burn_backend::ops::InterpolateMode::Lanczos3) {
        return lanczos::lanczos3_interpolate(x, size, options.align_corners);
    }
    let mode = interp_mode(OP, &options.mode)?;
    let d = x.dims();
    if d.len() != 4 {
        return Err(Error::invalid_input(OP, format!("input {d:?} must be [N, C, H, W]")));
    }
    let out = x.empty_on(&[d[0], d[1], size[0] as i64, size[1] as i64], x.dtype, OP)?;
    kresize::interpolate(x.stream(), &x.tref(), mode, options.align_corners, &out.tmut())?;
    Ok(out)
}

/// Gradient of [`interpolate`] with respect to `x`.
pub(crate) fn interpolate_backward(
    x: &CudnnTensor,
    dy: CudnnTensor,
    options: &burn_backend::ops::InterpolateOptions,
) -> Result<CudnnTensor> {
    const OP: &str = "interpolate_backward";
    require_float(OP, &dy)?;
    if matches!(options.mode, burn_backend::ops::InterpolateMode::Lanczos3) {
        return lanczos::lanczos3_interpolate_backward(x.dims(), dy, options.align_corners);
    }
    let mode = interp_mode(OP, &options.mode)?;
    let dx = dy.empty_on(x.dims(), dy.dtype, OP)?;
    kresize::interpolate_backward(dx.stream(), &dy.tref(), mode, options.align_corners, &dx.tmut())?;
    Ok(dx)
}
