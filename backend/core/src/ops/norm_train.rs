//! Layer and RMS norm for training: a forward that writes the row statistics and the
//! backward (`dx`, `dscale`, `dbias`), as NVRTC kernels over packed rows.
//!
//! cuDNN's norm graph ([`super::norm_forward`]) serves inference; its training phase writes
//! no statistics for RMS norm, so training uses these kernels for both modes: one warp per
//! row, and parameter gradients summed over fixed chunks of rows in a fixed order
//! (deterministic).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::launch_norm::{self as launch, NormArgs};
use crate::graph::{DataType, NormMode};
use crate::kernels::check::check_packed_rows;
use crate::kernels::{stream_function, NORM};
use crate::runtime::with_workspace;
use crate::types::DeviceAddress;

/// Rows per chunk of the parameter-gradient partial sums.
const CHUNK_ROWS: i64 = 256;

/// Operands of [`norm_backward`]. Outputs left `None` are not computed.
#[derive(Clone, Copy, Debug)]
pub struct NormBackward<'a> {
    /// The forward input `[rows, features]`, packed.
    pub x: &'a TensorRef<'a>,
    /// Gradient of the output (like `x`).
    pub dy: &'a TensorRef<'a>,
    /// The forward scale `[features]` (1 when absent).
    pub scale: Option<&'a TensorRef<'a>>,
    /// Row means of the forward (layer norm), f32 `[rows]`.
    pub mean: Option<&'a TensorRef<'a>>,
    /// Row inverse standard deviations of the forward, f32 `[rows]`.
    pub inv_std: &'a TensorRef<'a>,
    /// Gradient of the input (like `x`).
    pub dx: Option<&'a TensorMut<'a>>,
    /// Gradient of the scale (dtype of the scale, or f32 without one).
    pub d_scale: Option<&'a TensorMut<'a>>,
    /// Gradient of the bias.
    pub d_bias: Option<&'a TensorMut<'a>>,
}

fn entry(kernel: &str, dtype: DataType) -> &'static str {
    match (kernel, dtype) {
        ("fwd", DataType::F32) => "norm_fwd_f32",
        ("fwd", DataType::F16) => "norm_fwd_f16",
        ("fwd", _) => "norm_fwd_bf16",
        ("dx", DataType::F32) => "norm_bwd_dx_f32",
        ("dx", DataType::F16) => "norm_bwd_dx_f16",
        ("dx", _) => "norm_bwd_dx_bf16",
        ("params", DataType::F32) => "norm_bwd_params_f32",
        ("params", DataType::F16) => "norm_bwd_params_f16",
        _ => "norm_bwd_params_bf16",
    }
}

/// Checks a packed `[rows, features]` data operand of x's dims and dtype.
fn rows_like(op: &'static str, arg: &'static str, x: &TensorRef, t: &TensorRef) -> Result<()> {
    t.check(op, arg)?;
    if t.dims.len() != 2 || t.dims != x.dims || t.dtype != x.dtype {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!(
                "{:?} {:?}: need [rows, features] {:?} {:?}",
                t.dims, t.dtype, x.dims, x.dtype
            ),
        ));
    }
    if !matches!(t.dtype, DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dtype {:?}: F32, F16 or BF16", t.dtype),
        ));
    }
    check_packed_rows(op, arg, t, "features")
}

/// Checks the per-feature parameters (one dtype: f32 or the data's); returns its code.
fn param_code(
    op: &'static str,
    features: i64,
    data: DataType,
    params: &[(&'static str, Option<&TensorRef>)],
) -> Result<i32> {
    let mut dtype = None;
    for &(arg, t) in params {
        let Some(t) = t else { continue };
        t.check(op, arg)?;
        if t.numel() != features || !t.is_packed() || !(t.dtype == DataType::F32 || t.dtype == data) {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "{:?} {:?}: need {features} packed F32 or {data:?} elements",
                    t.dims, t.dtype
                ),
            ));
        }
        if dtype.is_some_and(|d| d != t.dtype) {
            return Err(Error::invalid_arg(op, arg, "all parameters must share one dtype"));
        }
        dtype = Some(t.dtype);
    }
    Ok(match dtype {
        Some(DataType::F16) => 1,
        Some(DataType::BF16) => 2,
        _ => 0,
    })
}

fn check_stats(op: &'static str, rows: i64, stats: &[(&'static str, Option<&TensorRef>)]) -> Result<()> {
    for &(arg, t) in stats {
        let Some(t) = t else { continue };
        t.check(op, arg)?;
        if t.numel() != rows || t.dtype != DataType::F32 || !t.is_packed() {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("{:?} {:?}: need {rows} packed F32 elements", t.dims, t.dtype),
            ));
        }
    }
    Ok(())
}

fn ptr(t: Option<&TensorRef>) -> DeviceAddress {
    DeviceAddress::of(t)
}

/// Layer or RMS norm forward for training over packed rows `x [rows, features]`:
/// `y = (x - mean) · inv_std · scale + bias` (RMS norm: no mean), writing the row
/// `inv_std` (and, for layer norm, the row `mean`; pass `None` for RMS norm).
#[allow(clippy::too_many_arguments)]
pub fn norm_train_forward(
    stream: &Arc<CudaStream>,
    mode: NormMode,
    x: &TensorRef,
    scale: Option<&TensorRef>,
    bias: Option<&TensorRef>,
    y: &TensorMut,
    epsilon: f64,
    mean: Option<&TensorMut>,
    inv_std: &TensorMut,
) -> Result<()> {
    const OP: &str = "norm_train_forward";
    let mean = mean.map(TensorMut::as_input);
    rows_like(OP, "x", x, x)?;
    rows_like(OP, "y", x, y)?;
    let (rows, features) = (x.dims[0], x.dims[1]);
    let pdt = param_code(OP, features, x.dtype, &[("scale", scale), ("bias", bias)])?;
    check_stats(OP, rows, &[("mean", mean), ("inv_std", Some(inv_std))])?;
    let rms = mode == NormMode::RmsNorm;
    if rms && mean.is_some() {
        return Err(Error::invalid_arg(OP, "mean", "RMS norm has no mean"));
    }
    if !rms && mean.is_none() {
        return Err(Error::invalid_arg(OP, "mean", "layer norm writes the row means"));
    }
    if features == 0 {
        return Err(Error::invalid_arg(
            OP,
            "x",
            "zero features: the statistics are undefined",
        ));
    }
    check_on_stream_device(
        stream,
        OP,
        &[
            ("x", Some(x)),
            ("y", Some(y)),
            ("scale", scale),
            ("bias", bias),
            ("mean", mean),
            ("inv_std", Some(inv_std)),
        ],
    )?;
    if rows == 0 {
        return Ok(());
    }
    let f = stream_function(stream, NORM, entry("fwd", x.dtype))?;
    launch::forward(
        stream,
        &f,
        &NormArgs {
            x: x.address(),
            y_or_dy: y.address(),
            rows,
            n: features,
            gamma: ptr(scale),
            beta: ptr(bias),
            pdt,
            eps: epsilon as f32,
            rms: rms as i32,
            mean: ptr(mean),
            invstd: inv_std.address(),
            ..Default::default()
        },
    )
}

/// Layer or RMS norm backward from the forward's row statistics (`mean` for layer norm
/// only): `dx`, `d_scale` and `d_bias`, each when asked for.
pub fn norm_backward(stream: &Arc<CudaStream>, mode: NormMode, a: &NormBackward<'_>) -> Result<()> {
    const OP: &str = "norm_backward";
    rows_like(OP, "x", a.x, a.x)?;
    rows_like(OP, "dy", a.x, a.dy)?;
    if let Some(dx) = a.dx {
        rows_like(OP, "dx", a.x, dx)?;
    }
    let (rows, features) = (a.x.dims[0], a.x.dims[1]);
    let pdt = param_code(
        OP,
        features,
        a.x.dtype,
        &[
            ("scale", a.scale),
            ("d_scale", a.d_scale.map(TensorMut::as_input)),
            ("d_bias", a.d_bias.map(TensorMut::as_input)),
        ],
    )?;
    let rms = mode == NormMode::RmsNorm;
    if rms == a.mean.is_some() {
        return Err(Error::invalid_arg(
            OP,
            "mean",
            "layer norm needs the row means, RMS norm none",
        ));
    }
    check_stats(OP, rows, &[("mean", a.mean), ("inv_std", Some(a.inv_std))])?;
    check_on_stream_device(
        stream,
        OP,
        &[
            ("x", Some(a.x)),
            ("dy", Some(a.dy)),
            ("scale", a.scale),
            ("mean", a.mean),
            ("inv_std", Some(a.inv_std)),
            ("dx", a.dx.map(TensorMut::as_input)),
            ("d_scale", a.d_scale.map(TensorMut::as_input)),
            ("d_bias", a.d_bias.map(TensorMut::as_input)),
        ],
    )?;
    if features == 0 {
        return Ok(());
    }
    let args = NormArgs {
        x: a.x.address(),
        y_or_dy: a.dy.address(),
        dx: ptr(a.dx.map(TensorMut::as_input)),
        rows,
        n: features,
        gamma: ptr(a.scale),
        pdt,
        rms: rms as i32,
        mean: ptr(a.mean),
        invstd: a.inv_std.address(),
        ..Default::default()
    };
    if a.dx.is_some() && rows > 0 {
        let f = stream_function(stream, NORM, entry("dx", a.x.dtype))?;
        launch::backward_dx(stream, &f, &args)?;
    }
    if a.d_scale.is_none() && a.d_bias.is_none() {
        return Ok(());
    }
    let chunks = ((rows + CHUNK_ROWS - 1) / CHUNK_ROWS).max(1);
    let params = stream_function(stream, NORM, entry("params", a.x.dtype))?;
    let finalize = stream_function(stream, NORM, "norm_bwd_params_finalize")?;
    with_workspace(stream, (2 * chunks * features) as usize * 4, |part| {
        if rows > 0 {
            launch::backward_params(stream, &params, &args, CHUNK_ROWS, chunks as u32, part)?;
        } else {
            crate::ffi::launch::memset_zero(stream, part, (2 * chunks * features) as usize * 4)?;
        }
        launch::params_finalize(
            stream,
            &finalize,
            part,
            chunks as i32,
            features,
            [
                ptr(a.d_scale.map(TensorMut::as_input)),
                ptr(a.d_bias.map(TensorMut::as_input)),
            ],
            pdt,
        )
    })
}
