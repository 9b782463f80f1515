//! Pooling through the NVRTC kernels ([`crate::kernels::pool`]) when cuDNN's pooling API is
//! not installed: under `CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY` only the graph and runtime-compiled
//! engine sub-libraries are present, and `cudnnPoolingForward`/`Backward` live in another
//! one. 1-D, 2-D and 3-D windows with symmetric padding of at most half the window
//! (PyTorch's rule, which the kernels follow); max-pooling backward recomputes the argmax
//! positions. A 3-D window pools separably: the 2-D kernels pool every depth slice over
//! (H, W), then pool the result along the depth (a `[kd, 1]` window over `[D, OH * OW]`).
//! That is exact for all three modes: a maximum over a box is the maximum of per-slice
//! maxima (ties resolve to the first depth, then the first position in it, as a scan in
//! (d, h, w) order), and an average's divisor (the window, or its part inside the input)
//! is the product of the per-dim ones.

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

/// The kernels' geometry for `p`: one 2-D window, or for a 3-D window the (H, W) window and
/// the depth window (`[kd, 1]` over `[D, OH * OW]`); or why they cannot run it.
fn geometry(op: &'static str, p: &PoolParams) -> Result<(Pool2d, Option<Pool2d>)> {
    if p.window.len() == 3 {
        let hw = PoolParams {
            mode: p.mode,
            window: p.window[1..].to_vec(),
            stride: p.stride[1..].to_vec(),
            pre_padding: p.pre_padding[1..].to_vec(),
            post_padding: p.post_padding[1..].to_vec(),
        };
        let depth = PoolParams {
            mode: p.mode,
            window: vec![p.window[0], 1],
            stride: vec![p.stride[0], 1],
            pre_padding: vec![p.pre_padding[0], 0],
            post_padding: vec![p.post_padding[0], 0],
        };
        return Ok((window(op, &hw)?, Some(window(op, &depth)?)));
    }
    Ok((window(op, p)?, None))
}

/// The kernels' geometry for a 1-D or 2-D window, or why they cannot run it.
fn window(op: &'static str, p: &PoolParams) -> Result<Pool2d> {
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
        n => return Err(unsupported(format!("{n}-D windows (the kernels pool 1-D to 3-D)"))),
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
    match geometry(OP, p)? {
        (g, None) => forward_2d(stream, &as_2d(x)?, &as_2d_mut(y)?, &g, p.mode),
        (hw, Some(depth)) => {
            let t = Slices::new(stream, x, y, OP)?;
            let planes = t.planes(y.dtype)?;
            for d in 0..t.depth {
                forward_2d(stream, &slice(x, d)?, &t.plane_mut(&planes, d, y.dtype)?, &hw, p.mode)?;
            }
            let (dims, strides) = merged_hw(OP, y)?;
            let y3 = y.view_mut(0, &dims, &strides)?;
            let t_all = t.by_depth(&planes, y.dtype)?;
            forward_2d(stream, &t_all, &y3, &depth, p.mode)
        }
    }
}

fn forward_2d(stream: &Arc<CudaStream>, x4: &TensorRef, y4: &TensorMut, g: &Pool2d, mode: PoolMode) -> Result<()> {
    const OP: &str = "pool_forward";
    match mode {
        PoolMode::Max => {
            let buf = scratch(stream, &y4.dims, DataType::I64, OP)?;
            let idx = buf.view_mut(0, &y4.dims, &row_major_strides(&y4.dims), DataType::I64)?;
            kpool::max_pool2d_with_indices(stream, x4, g, y4, &idx)
        }
        PoolMode::AvgIncludePadding => kpool::avg_pool2d(stream, x4, g, true, y4),
        PoolMode::AvgExcludePadding => kpool::avg_pool2d(stream, x4, g, false, y4),
    }
}

/// Depth slice `d` of a 5-D `[N, C, D, H, W]` view: `[N, C, H, W]`.
fn slice<'a>(t: &TensorRef<'a>, d: i64) -> Result<TensorRef<'a>> {
    let (dims, s) = (&t.dims, &t.strides);
    t.view(
        d * s[2],
        &[dims[0], dims[1], dims[3], dims[4]],
        &[s[0], s[1], s[3], s[4]],
    )
}

fn slice_mut<'a>(t: &TensorMut<'a>, d: i64) -> Result<TensorMut<'a>> {
    let (dims, s) = (&t.dims, &t.strides);
    t.view_mut(
        d * s[2],
        &[dims[0], dims[1], dims[3], dims[4]],
        &[s[0], s[1], s[3], s[4]],
    )
}

/// The dims and strides of `y` (or `dy`) `[N, C, OD, OH, OW]` as `[N, C, OD, OH * OW]`
/// (OH and OW must merge: true for packed NCDHW and NDHWC).
fn merged_hw(op: &'static str, y: &TensorRef) -> Result<([i64; 4], [i64; 4])> {
    let (d, s) = (&y.dims, &y.strides);
    if s[3] != s[4] * d[4] && d[3] > 1 {
        return Err(Error::Unsupported {
            graph: op.into(),
            reason: format!(
                "the pooling kernels need the output's H and W to merge for a 3-D window, got strides {s:?}"
            ),
        });
    }
    Ok(([d[0], d[1], d[2], d[3] * d[4]], [s[0], s[1], s[2], s[4]]))
}

/// The intermediate of a separable 3-D pooling: the input pooled over (H, W) in every depth
/// slice, `[N, C, D, OH, OW]` packed in scratch.
struct Slices {
    n: i64,
    c: i64,
    depth: i64,
    out_hw: [i64; 2],
    stream: Arc<CudaStream>,
    op: &'static str,
}

impl Slices {
    /// For `x` `[N, C, D, H, W]` pooled to `y` `[N, C, OD, OH, OW]`.
    fn new(stream: &Arc<CudaStream>, x: &TensorRef, y: &TensorRef, op: &'static str) -> Result<Self> {
        if x.dims.len() != 5 || y.dims.len() != 5 {
            return Err(Error::invalid_arg(
                op,
                "x",
                format!("a 3-D window needs 5-D x and y, got {:?} and {:?}", x.dims, y.dims),
            ));
        }
        Ok(Self {
            n: x.dims[0],
            c: x.dims[1],
            depth: x.dims[2],
            out_hw: [y.dims[3], y.dims[4]],
            stream: stream.clone(),
            op,
        })
    }

    fn dims(&self) -> [i64; 5] {
        [self.n, self.c, self.depth, self.out_hw[0], self.out_hw[1]]
    }

    /// Scratch for the intermediate (or its gradient, or its argmax positions).
    fn planes(&self, dtype: DataType) -> Result<DeviceBuffer> {
        scratch(&self.stream, &self.dims(), dtype, self.op)
    }

    /// Depth slice `d` of the intermediate of `dtype` in `buf`, `[N, C, OH, OW]`.
    fn plane_mut<'b>(&self, buf: &'b DeviceBuffer, d: i64, dtype: DataType) -> Result<TensorMut<'b>> {
        let dims = self.dims();
        let s = row_major_strides(&dims);
        buf.view_mut(
            d * s[2],
            &[dims[0], dims[1], dims[3], dims[4]],
            &[s[0], s[1], s[3], s[4]],
            dtype,
        )
    }

    /// The whole intermediate of `dtype` in `buf` as `[N, C, D, OH * OW]`, the depth
    /// pooling's 2-D input.
    fn by_depth<'b>(&self, buf: &'b DeviceBuffer, dtype: DataType) -> Result<TensorMut<'b>> {
        let dims = [self.n, self.c, self.depth, self.out_hw[0] * self.out_hw[1]];
        buf.view_mut(0, &dims, &row_major_strides(&dims), dtype)
    }
}

/// `dx = pool_backward(dy)` in the kernels (`x` is the forward's input; max pooling finds
/// its argmax positions again). Max pooling adds overlapping windows' gradients atomically,
/// or in the deterministic mode gathers them in window order. A 3-D window runs the two
/// stages of the forward backwards: the depth pooling's backward into the intermediate's
/// gradient, then each depth slice's (H, W) pooling backward.
pub(super) fn backward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    dy: &TensorRef,
    dx: &TensorMut,
    p: &PoolParams,
) -> Result<()> {
    const OP: &str = "pool_backward";
    match geometry(OP, p)? {
        (g, None) => backward_2d(stream, &as_2d(x)?, &as_2d(dy)?, &as_2d_mut(dx)?, &g, p.mode),
        (hw, Some(depth)) => {
            let t = Slices::new(stream, x, dy, OP)?;
            let (dims, strides) = merged_hw(OP, dy)?;
            let dy3 = dy.view(0, &dims, &strides)?;
            let grads = t.planes(dx.dtype)?;
            let dt_all = t.by_depth(&grads, dx.dtype)?;
            // The depth stage's input: the (H, W)-pooled slices, which max pooling needs to
            // find its argmax (the averages do not read it).
            let values;
            let t_all = if matches!(p.mode, PoolMode::Max) {
                values = t.planes(x.dtype)?;
                for d in 0..t.depth {
                    forward_2d(stream, &slice(x, d)?, &t.plane_mut(&values, d, x.dtype)?, &hw, p.mode)?;
                }
                t.by_depth(&values, x.dtype)?
            } else {
                t.by_depth(&grads, dx.dtype)?
            };
            backward_2d(stream, &t_all, &dy3, &dt_all, &depth, p.mode)?;
            for d in 0..t.depth {
                let dt = t.plane_mut(&grads, d, dx.dtype)?;
                backward_2d(stream, &slice(x, d)?, &dt, &slice_mut(dx, d)?, &hw, p.mode)?;
            }
            Ok(())
        }
    }
}

/// One 2-D pooling backward (`x4` read by max pooling only).
fn backward_2d(
    stream: &Arc<CudaStream>,
    x4: &TensorRef,
    dy4: &TensorRef,
    dx4: &TensorMut,
    g: &Pool2d,
    mode: PoolMode,
) -> Result<()> {
    const OP: &str = "pool_backward";
    match mode {
        PoolMode::Max => {
            let packed = row_major_strides(&dy4.dims);
            let buf = scratch(stream, &dy4.dims, DataType::I64, OP)?;
            let idx = buf.view_mut(0, &dy4.dims, &packed, DataType::I64)?;
            let values = scratch(stream, &dy4.dims, x4.dtype, OP)?;
            let y = values.view_mut(0, &dy4.dims, &packed, x4.dtype)?;
            kpool::max_pool2d_with_indices(stream, x4, g, &y, &idx)?;
            if crate::plan::policy().deterministic {
                kpool::max_pool2d_backward_gather(stream, &idx, dy4, g, dx4)
            } else {
                kpool::max_pool2d_backward(stream, &idx, dy4, dx4)
            }
        }
        PoolMode::AvgIncludePadding => kpool::avg_pool2d_backward(stream, dy4, g, true, dx4),
        PoolMode::AvgExcludePadding => kpool::avg_pool2d_backward(stream, dy4, g, false, dx4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_maps_1d_and_2d_windows_and_names_what_it_cannot_run() {
        let p1 = PoolParams::new(PoolMode::Max, &[3], &[2], &[1]);
        let (g, depth) = geometry("t", &p1).unwrap();
        assert!(depth.is_none());
        assert_eq!((g.kernel, g.stride, g.padding), ([1, 3], [1, 2], [0, 1]));
        let p2 = PoolParams::new(PoolMode::AvgExcludePadding, &[2, 3], &[2, 1], &[1, 1]);
        let (g, _) = geometry("t", &p2).unwrap();
        assert_eq!(
            (g.kernel, g.stride, g.padding, g.dilation),
            ([2, 3], [2, 1], [1, 1], [1, 1])
        );
        let why = |p: &PoolParams| geometry("t", p).unwrap_err().to_string();
        let p3 = PoolParams::new(PoolMode::Max, &[4, 2, 3], &[2, 2, 1], &[1, 1, 0]);
        let (hw, depth) = geometry("t", &p3).unwrap();
        let depth = depth.expect("a 3-D window pools its depth separately");
        assert_eq!((hw.kernel, hw.stride, hw.padding), ([2, 3], [2, 1], [1, 0]));
        assert_eq!((depth.kernel, depth.stride, depth.padding), ([4, 1], [2, 1], [1, 0]));
        let p4 = PoolParams::new(PoolMode::Max, &[2, 2, 2, 2], &[1, 1, 1, 1], &[0, 0, 0, 0]);
        assert!(why(&p4).contains("4-D"), "{}", why(&p4));
        assert!(why(&p4).contains("GRAPH_JIT_ONLY"), "{}", why(&p4));
        let deep = PoolParams::new(PoolMode::Max, &[2, 3, 3], &[1, 1, 1], &[2, 1, 1]);
        assert!(why(&deep).contains("half the window"), "{}", why(&deep));
        let wide = PoolParams::new(PoolMode::Max, &[3, 3], &[1, 1], &[2, 2]);
        assert!(why(&wide).contains("half the window"), "{}", why(&wide));
        let mut asym = PoolParams::new(PoolMode::Max, &[3, 3], &[1, 1], &[1, 1]);
        asym.post_padding = vec![0, 0];
        assert!(why(&asym).contains("asymmetric"), "{}", why(&asym));
    }

    #[test]
    fn depth_slices_and_merged_planes_of_5d_views() {
        let ncdhw = TensorRef::fake(&[2, 3, 4, 5, 6], &[360, 120, 30, 6, 1], DataType::F32, 0x1000);
        let s = slice(&ncdhw, 2).unwrap();
        assert_eq!(
            (s.dims.as_slice(), s.strides.as_slice()),
            (&[2, 3, 5, 6][..], &[360, 120, 6, 1][..])
        );
        assert_eq!(s.ptr, 0x1000 + 2 * 30 * 4);
        let ndhwc = TensorRef::fake(&[2, 3, 4, 5, 6], &[360, 1, 90, 18, 3], DataType::F16, 0x2000);
        let s = slice(&ndhwc, 1).unwrap();
        assert_eq!(
            (s.dims.as_slice(), s.strides.as_slice()),
            (&[2, 3, 5, 6][..], &[360, 1, 18, 3][..])
        );
        assert_eq!(s.ptr, 0x2000 + 90 * 2);
        assert_eq!(merged_hw("t", &ncdhw).unwrap(), ([2, 3, 4, 30], [360, 120, 30, 1]));
        assert_eq!(merged_hw("t", &ndhwc).unwrap(), ([2, 3, 4, 30], [360, 1, 90, 3]));
        let gapped = TensorRef::fake(&[2, 3, 4, 5, 6], &[1440, 480, 120, 24, 2], DataType::F32, 0x1000);
        assert!(merged_hw("t", &gapped).unwrap_err().to_string().contains("merge"));
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
        assert_eq!(c4.strides.to_vec(), [15, 1, 15, 3].to_vec());
    }
}
