//! Max and average pooling, forward and backward: a cuDNN resample graph, or cuDNN's
//! pooling API when no graph engine supports the layout or direction, or the NVRTC pooling
//! kernels when that API is not installed (`CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY`, see
//! [`pool_kernels`](super::pool_kernels)).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::pool_kernels;
use super::{check_on_stream_device, run, OpKey, PoolMode, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::legacy::{LegacyPoolMode, LegacyPooling};
use crate::graph::{Graph, ResampleAttrs, ResampleMode};
use crate::plan::with_cudnn_handle;

/// Pooling window geometry (one entry per spatial dim).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolParams {
    /// Mode.
    pub mode: PoolMode,
    /// Window size.
    pub window: Vec<i64>,
    /// Stride.
    pub stride: Vec<i64>,
    /// Padding before each spatial dim.
    pub pre_padding: Vec<i64>,
    /// Padding after each spatial dim.
    pub post_padding: Vec<i64>,
}

impl PoolParams {
    /// Symmetric padding.
    pub fn new(mode: PoolMode, window: &[i64], stride: &[i64], padding: &[i64]) -> Self {
        Self {
            mode,
            window: window.to_vec(),
            stride: stride.to_vec(),
            pre_padding: padding.to_vec(),
            post_padding: padding.to_vec(),
        }
    }

    /// Output dims (N, C, spatial...) of pooling `x_dims`.
    pub fn output_dims(&self, x_dims: &[i64]) -> Result<Vec<i64>> {
        let s = self.window.len();
        if x_dims.len() != s + 2
            || self.stride.len() != s
            || self.pre_padding.len() != s
            || self.post_padding.len() != s
        {
            return Err(Error::invalid_arg(
                "pool",
                "params",
                format!("x {x_dims:?} needs rank {} and one entry per spatial dim", s + 2),
            ));
        }
        if self.window.iter().chain(&self.stride).any(|&v| v < 1) {
            return Err(Error::invalid_arg(
                "pool",
                "params",
                format!("window {:?} and stride {:?} must be >= 1", self.window, self.stride),
            ));
        }
        if self.pre_padding.iter().chain(&self.post_padding).any(|&v| v < 0) {
            return Err(Error::invalid_arg("pool", "params", "padding must be >= 0"));
        }
        let mut out = x_dims[..2].to_vec();
        for i in 0..s {
            let padded = x_dims[i + 2] + self.pre_padding[i] + self.post_padding[i];
            if padded < self.window[i] {
                return Err(Error::invalid_arg(
                    "pool",
                    "window",
                    format!("window {} exceeds padded input {padded}", self.window[i]),
                ));
            }
            out.push((padded - self.window[i]) / self.stride[i] + 1);
        }
        Ok(out)
    }

    fn attrs(&self) -> ResampleAttrs {
        ResampleAttrs {
            mode: match self.mode {
                PoolMode::Max => ResampleMode::MaxPool,
                PoolMode::AvgIncludePadding => ResampleMode::AvgPoolIncludePadding,
                PoolMode::AvgExcludePadding => ResampleMode::AvgPoolExcludePadding,
            },
            window: self.window.clone(),
            stride: self.stride.clone(),
            pre_padding: self.pre_padding.clone(),
            post_padding: self.post_padding.clone(),
        }
    }

    fn legacy(
        &self,
        x: &TensorRef,
        y: &TensorRef,
        op: &'static str,
        graph_err: Option<&Error>,
    ) -> Result<LegacyPooling> {
        if self.pre_padding != self.post_padding {
            let why = graph_err.map_or("this layout/dtype has no graph engine".to_string(), |e| e.to_string());
            return Err(Error::Unsupported {
                graph: op.into(),
                reason: format!("asymmetric padding needs a graph engine: {why}"),
            });
        }
        Ok(LegacyPooling {
            x_dims: x.dims.to_vec(),
            x_strides: x.strides.to_vec(),
            y_dims: y.dims.to_vec(),
            y_strides: y.strides.to_vec(),
            data_type: x.dtype.cudnn(),
            mode: match self.mode {
                // cuDNN's plain max-pool backward uses atomics; honour deterministic mode.
                PoolMode::Max if crate::plan::policy().deterministic => LegacyPoolMode::MaxDeterministic,
                PoolMode::Max => LegacyPoolMode::Max,
                PoolMode::AvgIncludePadding => LegacyPoolMode::AvgIncludePadding,
                PoolMode::AvgExcludePadding => LegacyPoolMode::AvgExcludePadding,
            },
            window: self.window.clone(),
            padding: self.pre_padding.clone(),
            stride: self.stride.clone(),
        })
    }
}

fn check_shapes(op: &'static str, p: &PoolParams, x: &TensorRef, y: &TensorRef) -> Result<()> {
    let expect = p.output_dims(&x.dims)?;
    if expect[..] != y.dims[..] {
        return Err(Error::invalid_arg(
            op,
            "y",
            format!("x {:?} pools to {expect:?}, got {:?}", x.dims, y.dims),
        ));
    }
    if x.dtype != y.dtype {
        return Err(Error::invalid_arg(
            op,
            "y",
            format!("dtype {:?} differs from x's {:?}", y.dtype, x.dtype),
        ));
    }
    Ok(())
}

/// cuDNN's resample graphs run channels-last f32/f16 correctly; other layouts and bf16
/// (which produced wrong results in cuDNN 9.14) use the pooling API.
fn graph_pooling_supported(x: &TensorRef, y: &TensorRef) -> bool {
    let channels_last = |t: &TensorRef| t.strides.get(1) == Some(&1) && t.dims.len() >= 3;
    matches!(x.dtype, crate::graph::DataType::F32 | crate::graph::DataType::F16) && channels_last(x) && channels_last(y)
}

/// `y = pool(x)`.
pub fn pool_forward(stream: &Arc<CudaStream>, x: &TensorRef, y: &TensorMut, p: &PoolParams) -> Result<()> {
    const OP: &str = "pool_forward";
    x.check(OP, "x")?;
    y.check(OP, "y")?;
    check_shapes(OP, p, x, y)?;
    check_on_stream_device(stream, OP, &[("x", Some(x)), ("y", Some(y))])?;
    if y.is_empty() {
        return Ok(());
    }
    if !graph_pooling_supported(x, y) {
        return legacy_forward(stream, x, y, p, None);
    }
    let build = || {
        let mut g = Graph::new();
        let xi = x.add_input(&mut g, "x");
        let (yi, _) = g.resample_fwd(xi, p.attrs(), false);
        y.bind_output(&mut g, yi);
        g
    };
    let mut key = OpKey::new(OP);
    key.tensor(x)
        .tensor(y)
        .ints(&p.window)
        .ints(&p.stride)
        .ints(&p.pre_padding)
        .ints(&p.post_padding);
    key.ints(&[p.mode as i64]);
    match run(stream, OP, key, &[(1, x.ptr), (2, y.ptr)], &build) {
        Err(e) if e.is_not_supported() => legacy_forward(stream, x, y, p, Some(&e)),
        other => other,
    }
}

/// The forward through cuDNN's pooling API, or the kernels where that API is missing.
fn legacy_forward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    y: &TensorMut,
    p: &PoolParams,
    graph_err: Option<&Error>,
) -> Result<()> {
    if pool_kernels::legacy_unavailable() {
        return pool_kernels::forward(stream, x, y, p);
    }
    let legacy = p.legacy(x, y, "pool_forward", graph_err)?;
    match with_cudnn_handle(stream, |h| legacy.forward(h, x.ptr, y.ptr)) {
        Err(e) if pool_kernels::is_missing_sublibrary(&e) => pool_kernels::forward(stream, x, y, p),
        other => other,
    }
}

/// `dx = pool_backward(dy)`. Max pooling needs the forward's `x` and `y`; average
/// pooling ignores them (pass `None`).
pub fn pool_backward(
    stream: &Arc<CudaStream>,
    x: Option<&TensorRef>,
    y: Option<&TensorRef>,
    dy: &TensorRef,
    dx: &TensorMut,
    p: &PoolParams,
) -> Result<()> {
    const OP: &str = "pool_backward";
    dy.check(OP, "dy")?;
    dx.check(OP, "dx")?;
    check_shapes(OP, p, dx, dy)?;
    check_on_stream_device(stream, OP, &[("x", x), ("y", y), ("dy", Some(dy)), ("dx", Some(dx))])?;
    let (x, y) = match (x, y) {
        (Some(x), Some(y)) => {
            x.check(OP, "x")?;
            y.check(OP, "y")?;
            if x.dims != dx.dims || y.dims != dy.dims {
                return Err(Error::invalid_arg(OP, "x", "x must match dx's dims and y dy's dims"));
            }
            (x, y)
        }
        _ if p.mode == PoolMode::Max => {
            return Err(Error::invalid_arg(
                OP,
                "x",
                "max pooling backward needs the forward's x and y",
            ))
        }
        _ => (dx.as_input(), dy),
    };
    if dx.is_empty() {
        return Ok(());
    }
    // cuDNN's resample-backward graphs crash its heuristics (9.14), so backward uses the
    // pooling API, or the kernels where that API is missing.
    if pool_kernels::legacy_unavailable() {
        return pool_kernels::backward(stream, x, dy, dx, p);
    }
    let legacy = p.legacy(x, y, OP, None)?;
    match with_cudnn_handle(stream, |h| legacy.backward(h, x.ptr, y.ptr, dy.ptr, dx.ptr)) {
        Err(e) if pool_kernels::is_missing_sublibrary(&e) => pool_kernels::backward(stream, x, dy, dx, p),
        other => other,
    }
}
