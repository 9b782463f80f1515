//! Pooling through the NVRTC kernels ([`crate::kernels::pool`]) when cuDNN's pooling API is
//! not installed: under `CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY` only the graph and runtime-compiled
//! engine sub-libraries are present, and `cudnnPoolingForward`/`Backward` live in another
//! one. 1-D and 2-D windows with symmetric padding of at most half the window (PyTorch's
//! rule, which the kernels follow); max-pooling backward recomputes the argmax positions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{PoolMode, PoolParams, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::memory::DeviceBuffer;
use crate::graph::DataType;
use crate::kernels::pool::{self as kpool, Pool2d};
use crate::plan::policy::{graph_jit_only, LIB_CONFIG_ENV};
use crate::types::row_major_strides;

/// `CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED`: the call's sub-library is not installed.
const SUBLIBRARY_LOADING_FAILED: u32 = 1008;

static LEGACY_MISSING: AtomicBool = AtomicBool::new(false);

/// Whether cuDNN's pooling API is known to be absent: the configuration says so, or a call
/// already failed to load its sub-library.
pub(super) fn legacy_unavailable() -> bool {
    LEGACY_MISSING.load(Ordering::Relaxed) || graph_jit_only()
}

/// True (and remembered) when `e` says the pooling API's sub-library is missing.
pub(super) fn is_missing_sublibrary(e: &Error) -> bool {
    let missing = matches!(e.root(), Error::Cudnn { status, .. } if status.0 == SUBLIBRARY_LOADING_FAILED);
    if missing {
        tracing::warn!("cuDNN's pooling API is not installed ({e}); pooling runs in the NVRTC kernels");
        LEGACY_MISSING.store(true, Ordering::Relaxed);
    }
    missing
}

/// `t` as `[N, C, H, W]`: a 1-D `[N, C, L]` view gains a unit H.
fn as_2d<'a>(t: &TensorRef<'a>) -> Result<TensorRef<'a>> {
    if t.dims.len() == 4 {
        return Ok(t.clone());
    }
    let (d, s) = (&t.dims, &t.strides);
    t.reshaped(&[d[0], d[1], 1, d[2]], &[s[0], s[1], s[2] * d[2].max(1), s[2]])
}

fn as_2d_mut<'a>(t: &TensorMut<'a>) -> Result<TensorMut<'a>> {
    if t.dims.len() == 4 {
        return t.reshaped_mut(&t.dims, &t.strides);
    }
    let (d, s) = (&t.dims, &t.strides);
    t.reshaped_mut(&[d[0], d[1], 1, d[2]], &[s[0], s[1], s[2] * d[2].max(1), s[2]])
}

/// The kernels' geometry for `p`, or why they cannot run it.
fn geometry(op: &'static str, p: &PoolParams) -> Result<Pool2d> {
    let unsupported = |reason: String| Error::Unsupported {
        graph: op.into(),
        reason: format!(
            "cuDNN's pooling API is not installed ({LIB_CONFIG_ENV}=GRAPH_JIT_ONLY or a missing sub-library) and the \
             pooling kernels cannot run this window: {reason}; install the full cuDNN (unset {LIB_CONFIG_ENV})"
        ),
    };
    if p.pre_padding != p.post_padding {
        return Err(unsupported(format!(
            "asymmetric padding {:?} / {:?}",
            p.pre_padding, p.post_padding
        )));
    }
    let [kernel, stride, padding] = match p.window.len() {
        1 => [[1, p.window[0]], [1, p.stride[0]], [0, p.pre_padding[0]]],
        2 => [
            [p.window[0], p.window[1]],
            [p.stride[0], p.stride[1]],
            [p.pre_padding[0], p.pre_padding[1]],
        ],
        n => return Err(unsupported(format!("{n}-D windows (the kernels pool 1-D and 2-D)"))),
    };
    if kernel.iter().zip(&padding).any(|(&k, &pad)| pad > k / 2) {
        return Err(unsupported(format!(
            "padding {padding:?} above half the window {kernel:?}"
        )));
    }
    Ok(Pool2d {
        kernel,
        stride,
        padding,
        dilation: [1, 1],
        ceil_mode: false,
    })
}

/// Scratch for a packed `dims` view of `dtype` (kept alive while the view is used).
fn scratch(stream: &Arc<CudaStream>, dims: &[i64], dtype: DataType, op: &'static str) -> Result<DeviceBuffer> {
    let n: i64 = dims.iter().product();
    DeviceBuffer::alloc(stream, n.max(1) as usize * dtype.size(), op)
}

/// `y = pool(x)` in the kernels.
pub(super) fn forward(stream: &Arc<CudaStream>, x: &TensorRef, y: &TensorMut, p: &PoolParams) -> Result<()> {
    const OP: &str = "pool_forward";
    let g = geometry(OP, p)?;
    let (x4, y4) = (as_2d(x)?, as_2d_mut(y)?);
    match p.mode {
        PoolMode::Max => {
            let buf = scratch(stream, &y4.dims, DataType::I64, OP)?;
            let idx = buf.view_mut(0, &y4.dims, &row_major_strides(&y4.dims), DataType::I64)?;
            kpool::max_pool2d_with_indices(stream, &x4, &g, &y4, &idx)
        }
        PoolMode::AvgIncludePadding => kpool::avg_pool2d(stream, &x4, &g, true, &y4),
        PoolMode::AvgExcludePadding => kpool::avg_pool2d(stream, &x4, &g, false, &y4),
    }
}

/// `dx = pool_backward(dy)` in the kernels (`x` is the forward's input; max pooling finds
/// its argmax positions again). Max pooling adds overlapping windows' gradients atomically,
/// or in the deterministic mode gathers them in window order.
pub(super) fn backward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    dy: &TensorRef,
    dx: &TensorMut,
    p: &PoolParams,
) -> Result<()> {
    const OP: &str = "pool_backward";
    let g = geometry(OP, p)?;
    let (dy4, dx4) = (as_2d(dy)?, as_2d_mut(dx)?);
    match p.mode {
        PoolMode::Max => {
            let x4 = as_2d(x)?;
            let packed = row_major_strides(&dy4.dims);
            let buf = scratch(stream, &dy4.dims, DataType::I64, OP)?;
            let idx = buf.view_mut(0, &dy4.dims, &packed, DataType::I64)?;
            let values = scratch(stream, &dy4.dims, dy4.dtype, OP)?;
            let y = values.view_mut(0, &dy4.dims, &packed, dy4.dtype)?;
            kpool::max_pool2d_with_indices(stream, &x4, &g, &y, &idx)?;
            if crate::plan::policy().deterministic {
                kpool::max_pool2d_backward_gather(stream, &idx, &dy4, &g, &dx4)
            } else {
                kpool::max_pool2d_backward(stream, &idx, &dy4, &dx4)
            }
        }
        PoolMode::AvgIncludePadding => kpool::avg_pool2d_backward(stream, &dy4, &g, true, &dx4),
        PoolMode::AvgExcludePadding => kpool::avg_pool2d_backward(stream, &dy4, &g, false, &dx4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_maps_1d_and_2d_windows_and_names_what_it_cannot_run() {
        let p1 = PoolParams::new(PoolMode::Max, &[3], &[2], &[1]);
        let g = geometry("t", &p1).unwrap();
        assert_eq!((g.kernel, g.stride, g.padding), ([1, 3], [1, 2], [0, 1]));
        let p2 = PoolParams::new(PoolMode::AvgExcludePadding, &[2, 3], &[2, 1], &[1, 1]);
        let g = geometry("t", &p2).unwrap();
        assert_eq!(
            (g.kernel, g.stride, g.padding, g.dilation),
            ([2, 3], [2, 1], [1, 1], [1, 1])
        );
        let why = |p: &PoolParams| geometry("t", p).unwrap_err().to_string();
        let p3 = PoolParams::new(PoolMode::Max, &[2, 2, 2], &[1, 1, 1], &[0, 0, 0]);
        assert!(why(&p3).contains("3-D"), "{}", why(&p3));
        assert!(why(&p3).contains("GRAPH_JIT_ONLY"), "{}", why(&p3));
        let wide = PoolParams::new(PoolMode::Max, &[3, 3], &[1, 1], &[2, 2]);
        assert!(why(&wide).contains("half the window"), "{}", why(&wide));
        let mut asym = PoolParams::new(PoolMode::Max, &[3, 3], &[1, 1], &[1, 1]);
        asym.post_padding = vec![0, 0];
        assert!(why(&asym).contains("asymmetric"), "{}", why(&asym));
    }

    #[test]
    fn one_d_views_gain_a_unit_height() {
        let x = TensorRef::fake(&[2, 3, 5], &[15, 5, 1], DataType::F32, 0x1000);
        let x4 = as_2d(&x).unwrap();
        assert_eq!(
            (x4.dims.as_slice(), x4.strides.as_slice()),
            (&[2, 3, 1, 5][..], &[15, 5, 5, 1][..])
        );
        let cl = TensorRef::fake(&[2, 3, 5], &[15, 1, 3], DataType::F32, 0x1000);
        let c4 = as_2d(&cl).unwrap();
        assert_eq!(c4.strides, [15, 1, 15, 3]);
    }
}
