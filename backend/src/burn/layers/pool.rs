//! Pooling: cuDNN's pooling where it computes Burn's windows, else the pooling kernels.

use burn_backend::DType;

use super::*;
use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::ops::pool2d::{self as kpool, Pool2d};
use crate::ops::{self, PoolMode, PoolParams};

/// Burn's 2-D pooling arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolArgs {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

/// Output sizes of a pooling: Burn's (`calculate_pool_output_size`, which keeps a
/// `ceil_mode` window that starts in the right padding) and the kernels' (PyTorch's rule,
/// which drops it; never larger).
struct PoolShape {
    pool: Pool2d,
    burn: [i64; 2],
    kernel: [i64; 2],
}

impl PoolArgs {
    /// The kernels' geometry.
    fn pool2d(&self) -> Pool2d {
        Pool2d {
            kernel: self.kernel.map(|v| v as i64),
            stride: self.stride.map(|v| v as i64),
            padding: self.padding.map(|v| v as i64),
            dilation: self.dilation.map(|v| v as i64),
            ceil_mode: self.ceil_mode,
        }
    }

    fn shape(&self, op: &str, x: &CudnnTensor) -> Result<PoolShape> {
        let d = x.dims();
        if d.len() != 4 {
            return Err(Error::invalid_input(op, format!("input {d:?} must be [N, C, H, W]")));
        }
        let pool = self.pool2d();
        let kernel = pool.output_hw(d[2], d[3])?;
        let mut burn = [0i64; 2];
        for a in 0..2 {
            let (k, s, p, dl) = (pool.kernel[a], pool.stride[a], pool.padding[a], pool.dilation[a]);
            let num = d[2 + a] + 2 * p - dl * (k - 1) - 1;
            burn[a] = if self.ceil_mode {
                (num + s - 1) / s + 1
            } else {
                num / s + 1
            };
        }
        Ok(PoolShape { pool, burn, kernel })
    }
}

/// `t[.., ..h, ..w]` (a view).
fn top_left(t: &CudnnTensor, hw: [i64; 2], op: &str) -> Result<CudnnTensor> {
    narrow(&narrow(t, op, 2, 0, hw[0])?, op, 3, 0, hw[1])
}

/// Max pooling with flat `h * W + w` indices (I64) into each input plane; first maximum
/// wins. Windows Burn keeps past PyTorch's `ceil_mode` rule hold -inf with index 0, as
/// burn-ndarray writes them.
pub(crate) fn max_pool2d_with_indices(x: CudnnTensor, a: &PoolArgs) -> Result<(CudnnTensor, CudnnTensor)> {
    const OP: &str = "max_pool2d_with_indices";
    require_float(OP, &x)?;
    let s = a.shape(OP, &x)?;
    let d = x.dims();
    let dims = [d[0], d[1], s.burn[0], s.burn[1]];
    let out = CudnnTensor::empty_in_format_of(&x, &dims, x.dtype, OP)?;
    let idx = CudnnTensor::empty_in_format_of(&x, &dims, DType::I64, OP)?;
    let (ko, ki) = if s.burn == s.kernel {
        (out.clone(), idx.clone())
    } else {
        fill(&out, f64::NEG_INFINITY, OP)?;
        fill(&idx, 0.0, OP)?;
        (top_left(&out, s.kernel, OP)?, top_left(&idx, s.kernel, OP)?)
    };
    kpool::max_pool2d_with_indices(x.stream(), &x.tref(), &s.pool, &ko.tmut(), &ki.tmut())?;
    drop((ko, ki));
    Ok((out, idx))
}

/// Max pooling values only: cuDNN's pooling when it computes exactly Burn's windows
/// (no dilation, no `ceil_mode` extension, F32/F16/BF16), else the indexed kernel.
pub(crate) fn max_pool2d(x: CudnnTensor, a: &PoolArgs) -> Result<CudnnTensor> {
    const OP: &str = "max_pool2d";
    require_float(OP, &x)?;
    let s = a.shape(OP, &x)?;
    let floor = PoolArgs { ceil_mode: false, ..*a }.shape(OP, &x)?;
    let cudnn_ok = a.dilation == [1, 1]
        && s.burn == floor.burn
        && matches!(x.dtype, DType::F32 | DType::Flex32 | DType::F16 | DType::BF16);
    if !cudnn_ok {
        return Ok(max_pool2d_with_indices(x, a)?.0);
    }
    let x = x.cudnn_ready()?;
    let d = x.dims();
    let out = CudnnTensor::empty_in_format_of(&x, &[d[0], d[1], s.burn[0], s.burn[1]], x.dtype, OP)?;
    let p = PoolParams::new(PoolMode::Max, &s.pool.kernel, &s.pool.stride, &s.pool.padding);
    ops::pool_forward(x.stream(), &x.tref(), &out.tmut(), &p)?;
    Ok(out)
}

/// Gradient of max pooling from its indices: each `dy` element is added at the input
/// position its index names (as burn-ndarray). In the engine's deterministic mode every
/// input position gathers its windows' gradients in a fixed order (no atomics).
pub(crate) fn max_pool2d_backward(
    x: &CudnnTensor,
    dy: CudnnTensor,
    indices: CudnnTensor,
    a: &PoolArgs,
) -> Result<CudnnTensor> {
    const OP: &str = "max_pool2d_with_indices_backward";
    require_float(OP, &dy)?;
    exec::check_same_device(OP, &dy, &indices)?;
    let idx = match indices.dtype {
        DType::I64 => indices,
        _ => exec::cast(indices, DType::I64, OP)?,
    };
    let dx = CudnnTensor::empty_in_format_of(x, x.dims(), dy.dtype, OP)?;
    let done = {
        let (idx_v, dy_v, dx_v) = (idx.tref(), dy.tref(), dx.tmut());
        if crate::plan::policy().deterministic {
            kpool::max_pool2d_backward_gather(dx.stream(), &idx_v, &dy_v, &a.pool2d(), &dx_v)
        } else {
            kpool::max_pool2d_backward(dx.stream(), &idx_v, &dy_v, &dx_v)
        }
    };
    done?;
    Ok(dx)
}

/// Average pooling (burn-ndarray's divisor rules for `count_include_pad` and `ceil_mode`).
/// A window Burn keeps past PyTorch's `ceil_mode` rule has no input element: it holds
/// 0 / (its size inside the padded input), i.e. 0, or NaN when that size is 0 or padding
/// is not counted, as burn-ndarray computes it.
pub(crate) fn avg_pool2d(x: CudnnTensor, a: &PoolArgs, count_include_pad: bool) -> Result<CudnnTensor> {
    const OP: &str = "avg_pool2d";
    require_float(OP, &x)?;
    let s = a.shape(OP, &x)?;
    let d = x.dims().to_vec();
    let dims = [d[0], d[1], s.burn[0], s.burn[1]];
    let out = CudnnTensor::empty_in_format_of(&x, &dims, x.dtype, OP)?;
    let ko = if s.burn == s.kernel {
        out.clone()
    } else {
        // Value of an extra window along axis `ax` (row or column).
        let extra_ok = |ax: usize| {
            let start = s.kernel[ax] * s.pool.stride[ax];
            count_include_pad && start < d[2 + ax] + 2 * s.pool.padding[ax]
        };
        let val = |ok: bool| if ok { 0.0 } else { f64::NAN };
        let (rows, cols) = (s.burn[0] > s.kernel[0], s.burn[1] > s.kernel[1]);
        if rows {
            fill(&narrow(&out, OP, 2, s.kernel[0], s.burn[0])?, val(extra_ok(0)), OP)?;
        }
        if cols {
            fill(&narrow(&out, OP, 3, s.kernel[1], s.burn[1])?, val(extra_ok(1)), OP)?;
        }
        if rows && cols {
            let corner = narrow(
                &narrow(&out, OP, 2, s.kernel[0], s.burn[0])?,
                OP,
                3,
                s.kernel[1],
                s.burn[1],
            )?;
            fill(&corner, val(extra_ok(0) && extra_ok(1)), OP)?;
        }
        top_left(&out, s.kernel, OP)?
    };
    kpool::avg_pool2d(x.stream(), &x.tref(), &s.pool, count_include_pad, &ko.tmut())?;
    drop(ko);
    Ok(out)
}

/// Gradient of [`avg_pool2d`] (windows past PyTorch's `ceil_mode` rule contribute nothing).
pub(crate) fn avg_pool2d_backward(
    x: &CudnnTensor,
    dy: CudnnTensor,
    a: &PoolArgs,
    count_include_pad: bool,
) -> Result<CudnnTensor> {
    const OP: &str = "avg_pool2d_backward";
    require_float(OP, &dy)?;
    let s = a.shape(OP, x)?;
    let dy = if dy.dims()[2..] == s.kernel[..] {
        dy
    } else {
        top_left(&dy, s.kernel, OP)?
    };
    let dx = CudnnTensor::empty_in_format_of(x, x.dims(), dy.dtype, OP)?;
    kpool::avg_pool2d_backward(dx.stream(), &dy.tref(), &s.pool, count_include_pad, &dx.tmut())?;
    Ok(dx)
}

/// Adaptive average pooling to `[oh, ow]`.
pub(crate) fn adaptive_avg_pool2d(x: CudnnTensor, size: [usize; 2]) -> Result<CudnnTensor> {
    const OP: &str = "adaptive_avg_pool2d";
    require_float(OP, &x)?;
    let d = x.dims();
    if d.len() != 4 {
        return Err(Error::invalid_input(OP, format!("input {d:?} must be [N, C, H, W]")));
    }
    let out = CudnnTensor::empty_in_format_of(&x, &[d[0], d[1], size[0] as i64, size[1] as i64], x.dtype, OP)?;
    kpool::adaptive_avg_pool2d(x.stream(), &x.tref(), &out.tmut())?;
    Ok(out)
}

/// Gradient of [`adaptive_avg_pool2d`].
pub(crate) fn adaptive_avg_pool2d_backward(x: &CudnnTensor, dy: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "adaptive_avg_pool2d_backward";
    require_float(OP, &dy)?;
    let dx = CudnnTensor::empty_in_format_of(x, x.dims(), dy.dtype, OP)?;
    kpool::adaptive_avg_pool2d_backward(dx.stream(), &dy.tref(), &dx.tmut())?;
    Ok(dx)
}

/// `[N, C, L]` as `[N, C, 1, L]` (a view).
pub(crate) fn as_2d(t: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    if t.rank() != 3 {
        return Err(Error::invalid_input(
            op,
            format!("input {:?} must be [N, C, L]", t.dims()),
        ));
    }
    view(t, op, |l| l.unsqueeze(2))
}

/// `[N, C, 1, L]` back to `[N, C, L]` (a view).
pub(crate) fn as_1d(t: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    view(t, op, |l| l.squeeze(2))
}
