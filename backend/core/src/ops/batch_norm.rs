//! Batch normalization: training forward (batch statistics, running-statistic update,
//! saved mean and inverse standard deviation), inference forward, and backward, each with
//! the optional residual add and ReLU that ResNet blocks fuse into it.
//!
//! Data is `[N, C, spatial...]` f32/f16/bf16 in any layout whose spatial dims form one
//! strided run (NCHW, NHWC and their slices); statistics are f32. Each pass is three
//! NVRTC kernels (partial reduction, per-channel finalize, elementwise apply) whose
//! partials are combined in a fixed order, so results are deterministic.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::launch_batch_norm::{self as launch, BnOperand, BnView, FinalizeArgs};
use crate::graph::{may_overlap, DataType};
use crate::kernels::batch_norm::{coef_at, partial_floats, scratch_bytes, Kernel, Ncs, Pass};
use crate::kernels::{stream_function, BATCH_NORM};
use crate::runtime::{with_workspace, Device};
use crate::types::DeviceAddress;

/// Hyper-parameters of a batch-norm training pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    /// Added to the variance before the square root.
    pub epsilon: f64,
    /// Weight of the batch statistic in the running update:
    /// `running = (1 - momentum) * running + momentum * batch`.
    pub momentum: f64,
    /// Whether the running variance takes the unbiased batch variance (`/ (M - 1)`, as
    /// PyTorch does) or the biased one (`/ M`, as Burn's `BatchNorm` does). The output is
    /// always normalized with the biased variance.
    pub unbiased_running_var: bool,
    /// Apply ReLU after the normalization (and the residual add).
    pub relu: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        Self {
            epsilon: 1e-5,
            momentum: 0.1,
            unbiased_running_var: true,
            relu: false,
        }
    }
}

/// Running statistics of a training pass: read from `mean`/`var`, written to
/// `mean_out`/`var_out` (which may be the same buffers). `[C]`, f32 or the data dtype.
#[derive(Clone, Copy, Debug)]
pub struct RunningStats<'a> {
    /// Running mean before the step.
    pub mean: &'a TensorRef<'a>,
    /// Running variance before the step.
    pub var: &'a TensorRef<'a>,
    /// Running mean after the step.
    pub mean_out: &'a TensorMut<'a>,
    /// Running variance after the step.
    pub var_out: &'a TensorMut<'a>,
}

/// Operands of [`batch_norm_train_forward`]:
/// `y = relu?((x - mean) * inv_std * scale + bias + residual)` with the batch statistics.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormForward<'a> {
    /// Input `[N, C, spatial...]`.
    pub x: &'a TensorRef<'a>,
    /// Optional tensor added after the normalization (like `x`).
    pub residual: Option<&'a TensorRef<'a>>,
    /// Output (like `x`).
    pub y: &'a TensorMut<'a>,
    /// Per-channel scale `[C]` (1 when absent), f32 or the data dtype.
    pub scale: Option<&'a TensorRef<'a>>,
    /// Per-channel bias `[C]` (0 when absent), f32 or the data dtype.
    pub bias: Option<&'a TensorRef<'a>>,
    /// Running statistics to update, if any.
    pub running: Option<RunningStats<'a>>,
    /// Batch mean, `[C]` f32 (for the backward pass).
    pub saved_mean: &'a TensorMut<'a>,
    /// Batch `1 / sqrt(var + epsilon)`, `[C]` f32 (for the backward pass).
    pub saved_inv_std: &'a TensorMut<'a>,
}

/// Operands of [`batch_norm_inference`]: normalization with the running statistics.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormInference<'a> {
    /// Input `[N, C, spatial...]`.
    pub x: &'a TensorRef<'a>,
    /// Optional tensor added after the normalization.
    pub residual: Option<&'a TensorRef<'a>>,
    /// Output.
    pub y: &'a TensorMut<'a>,
    /// Per-channel scale (1 when absent).
    pub scale: Option<&'a TensorRef<'a>>,
    /// Per-channel bias (0 when absent).
    pub bias: Option<&'a TensorRef<'a>>,
    /// Running mean `[C]`.
    pub mean: &'a TensorRef<'a>,
    /// Running variance `[C]`.
    pub var: &'a TensorRef<'a>,
}

/// Operands of [`batch_norm_backward`]. Outputs left `None` are not computed.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormBackward<'a> {
    /// The forward input.
    pub x: &'a TensorRef<'a>,
    /// The forward output: needed (and only read) when the forward applied ReLU.
    pub y: Option<&'a TensorRef<'a>>,
    /// Gradient of the output.
    pub dy: &'a TensorRef<'a>,
    /// Gradient of the input.
    pub dx: Option<&'a TensorMut<'a>>,
    /// Gradient of the residual (the ReLU-masked `dy`; equal to `dy` without ReLU).
    pub d_residual: Option<&'a TensorMut<'a>>,
    /// The forward scale (1 when absent).
    pub scale: Option<&'a TensorRef<'a>>,
    /// `saved_mean` of the forward pass.
    pub saved_mean: &'a TensorRef<'a>,
    /// `saved_inv_std` of the forward pass.
    pub saved_inv_std: &'a TensorRef<'a>,
    /// Gradient of the scale `[C]` (dtype of the scale, or f32 without one).
    pub d_scale: Option<&'a TensorMut<'a>>,
    /// Gradient of the bias `[C]` (dtype of the scale, or f32 without one).
    pub d_bias: Option<&'a TensorMut<'a>>,
}

/// Reads `t` as `[N, C, S]` (S = product of dims 2..): its spatial dims must form one
/// strided run (true for packed NCHW and NHWC and for their batch and channel slices).
fn ncs(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<Ncs> {
    t.check(op, arg)?;
    if t.dims.len() < 2 {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!(
                "rank {} ({:?}): batch norm needs [N, C, spatial...]",
                t.dims.len(),
                t.dims
            ),
        ));
    }
    if !matches!(t.dtype, DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dtype {:?} is not supported (F32, F16 or BF16)", t.dtype),
        ));
    }
    let spatial: Vec<(i64, i64)> = (2..t.dims.len())
        .map(|d| (t.dims[d], t.strides[d]))
        .filter(|&(n, _)| n != 1)
        .collect();
    let s: i64 = spatial.iter().map(|&(n, _)| n).product();
    let ss = spatial.last().map_or(1, |&(_, st)| st);
    let mut expect = ss;
    for &(n, st) in spatial.iter().rev() {
        if st != expect {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "spatial dims {:?} with strides {:?} are not one strided run: pass a packed copy",
                    &t.dims[2..],
                    &t.strides[2..]
                ),
            ));
        }
        expect = st * n;
    }
    Ok(Ncs {
        n: t.dims[0],
        c: t.dims[1],
        s,
        view: BnView {
            sn: t.strides[0],
            sc: t.strides[1],
            ss,
        },
    })
}

/// Checks a data operand against the input's dims and dtype; `written` ones must not
/// overlap themselves.
fn like_x(op: &'static str, arg: &'static str, x: &TensorRef, t: &TensorRef, written: bool) -> Result<BnOperand> {
    let v = ncs(op, arg, t)?;
    if t.dims != x.dims {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dims {:?} differ from x's {:?}", t.dims, x.dims),
        ));
    }
    if t.dtype != x.dtype {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dtype {:?} differs from x's {:?}", t.dtype, x.dtype),
        ));
    }
    if written && may_overlap(&t.dims, &t.strides) {
        return Err(Error::invalid_arg(
            op,
            arg,
            "overlapping view (a 0 or too small stride)",
        ));
    }
    Ok(BnOperand {
        ptr: t.address(),
        view: v.view,
    })
}

fn operand(
    op: &'static str,
    arg: &'static str,
    x: &TensorRef,
    t: Option<&TensorRef>,
    written: bool,
) -> Result<BnOperand> {
    t.map_or(Ok(BnOperand::default()), |t| like_x(op, arg, x, t, written))
}

/// The kernels' code of a parameter dtype (0 f32, 1 f16, 2 bf16).
fn param_code(dtype: DataType) -> i32 {
    match dtype {
        DataType::F16 => 1,
        DataType::BF16 => 2,
        _ => 0,
    }
}

/// Checks the per-channel parameter tensors: `[C]` elements, packed, all of one dtype that
/// is f32 or the data dtype. Returns the dtype code (f32 when there are none).
fn check_params(
    op: &'static str,
    c: i64,
    data: DataType,
    params: &[(&'static str, Option<&TensorRef>)],
) -> Result<i32> {
    let mut dtype: Option<(DataType, &'static str)> = None;
    for &(arg, t) in params {
        let Some(t) = t else { continue };
        t.check(op, arg)?;
        if t.numel() != c || !t.is_packed() {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "needs {c} packed elements (one per channel), got dims {:?} strides {:?}",
                    t.dims, t.strides
                ),
            ));
        }
        if t.dtype != DataType::F32 && t.dtype != data {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("dtype {:?}: must be F32 or the data's {data:?}", t.dtype),
            ));
        }
        match dtype {
            Some((d, first)) if d != t.dtype => {
                return Err(Error::invalid_arg(
                    op,
                    arg,
                    format!(
                        "dtype {:?} differs from {first}'s {d:?} (one dtype for all parameters)",
                        t.dtype
                    ),
                ))
            }
            None => dtype = Some((t.dtype, arg)),
            _ => {}
        }
    }
    Ok(dtype.map_or(0, |(d, _)| param_code(d)))
}

/// Checks the saved statistics: `[C]` packed f32.
fn check_stats(op: &'static str, c: i64, stats: &[(&'static str, &TensorRef)]) -> Result<()> {
    for &(arg, t) in stats {
        t.check(op, arg)?;
        if t.numel() != c || !t.is_packed() || t.dtype != DataType::F32 {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("needs {c} packed F32 elements, got dims {:?} {:?}", t.dims, t.dtype),
            ));
        }
    }
    Ok(())
}

fn sm_count(stream: &Arc<CudaStream>) -> Result<u32> {
    Ok(Device::new(stream.context().ordinal())?.info().sm_count)
}

fn ptr(t: Option<&TensorRef>) -> DeviceAddress {
    DeviceAddress::of(t)
}

/// Rejects batches with at most one value per channel (their variance is undefined), as
/// PyTorch does in training.
fn check_batch(op: &'static str, x: &TensorRef, v: &Ncs) -> Result<()> {
    if v.n * v.s <= 1 {
        return Err(Error::invalid_arg(
            op,
            "x",
            format!(
                "dims {:?} give {} value(s) per channel: training batch norm needs more than one",
                x.dims,
                v.n * v.s
            ),
        ));
    }
    Ok(())
}

/// Batch-norm training forward: normalizes `x` with its per-channel batch statistics,
/// applies scale, bias, the optional residual and ReLU, writes the saved statistics and
/// updates the running statistics. Errors for fewer than two values per channel.
pub fn batch_norm_train_forward(
    stream: &Arc<CudaStream>,
    a: &BatchNormForward<'_>,
    o: &BatchNormOptions,
) -> Result<()> {
    const OP: &str = "batch_norm_train_forward";
    let xv = ncs(OP, "x", a.x)?;
    let xo = like_x(OP, "x", a.x, a.x, false)?;
    let zo = operand(OP, "residual", a.x, a.residual, false)?;
    let yo = like_x(OP, "y", a.x, a.y, true)?;
    let c = xv.c;
    let run = a.running;
    let pdt = check_params(
        OP,
        c,
        a.x.dtype,
        &[
            ("scale", a.scale),
            ("bias", a.bias),
            ("running.mean", run.map(|r| r.mean)),
            ("running.var", run.map(|r| r.var)),
            ("running.mean_out", run.map(|r| r.mean_out.as_input())),
            ("running.var_out", run.map(|r| r.var_out.as_input())),
        ],
    )?;
    check_stats(
        OP,
        c,
        &[("saved_mean", a.saved_mean), ("saved_inv_std", a.saved_inv_std)],
    )?;
    if c == 0 {
        return Ok(());
    }
    check_batch(OP, a.x, &xv)?;
    check_on_stream_device(
        stream,
        OP,
        &[
            ("x", Some(a.x)),
            ("residual", a.residual),
            ("y", Some(a.y)),
            ("scale", a.scale),
            ("bias", a.bias),
            ("running.mean", run.map(|r| r.mean)),
            ("running.var", run.map(|r| r.var)),
            ("running.mean_out", run.map(|r| r.mean_out.as_input())),
            ("running.var_out", run.map(|r| r.var_out.as_input())),
            ("saved_mean", Some(a.saved_mean)),
            ("saved_inv_std", Some(a.saved_inv_std)),
        ],
    )?;
    let sm = sm_count(stream)?;
    let pass = Pass::choose(&xv, a.x.dtype, &[&xo, &zo, &yo], sm, true);
    let finalize = stream_function(stream, BATCH_NORM, "bn_finalize")?;
    let kernel = |k: Kernel| stream_function(stream, BATCH_NORM, pass.entry(k, a.x.dtype));
    let (stats, apply) = (kernel(Kernel::Stats)?, kernel(Kernel::Apply)?);
    let part_floats = partial_floats(3, &pass);
    with_workspace(stream, scratch_bytes(part_floats, 2 * c as usize), |ws| {
        let coef = coef_at(ws, part_floats);
        match &pass {
            Pass::ChannelsLast(v) => launch::stats_vec(stream, &stats, xo.ptr, v, ws)?,
            Pass::Planes(p) => launch::stats_planes(stream, &stats, xo.ptr, p, ws)?,
            Pass::Strided(sh) => launch::stats(stream, &stats, xo.ptr, &xo.view, sh, ws)?,
        }
        let fin = FinalizeArgs {
            part: ws,
            chunks: pass.shape().chunks,
            c,
            eps: o.epsilon as f32,
            momentum: o.momentum as f32,
            unbiased: o.unbiased_running_var as i32,
            scale: ptr(a.scale),
            bias: ptr(a.bias),
            pdt,
            rmean_in: ptr(run.map(|r| r.mean)),
            rvar_in: ptr(run.map(|r| r.var)),
            rmean_out: ptr(run.map(|r| r.mean_out.as_input())),
            rvar_out: ptr(run.map(|r| r.var_out.as_input())),
            save_mean: a.saved_mean.address(),
            save_invstd: a.saved_inv_std.address(),
            coef,
        };
        launch::finalize(stream, &finalize, &fin)?;
        match &pass {
            Pass::ChannelsLast(v) => launch::apply_vec(stream, &apply, [xo.ptr, zo.ptr, yo.ptr], v, coef, o.relu),
            Pass::Planes(p) => launch::apply_planes(stream, &apply, [xo.ptr, zo.ptr, yo.ptr], p, coef, o.relu),
            Pass::Strided(sh) => launch::apply(stream, &apply, [&xo, &zo, &yo], sh, coef, o.relu),
        }
    })
}

/// Batch-norm inference forward: normalizes `x` with the running statistics, then scale,
/// bias, the optional residual and ReLU.
pub fn batch_norm_inference(
    stream: &Arc<CudaStream>,
    a: &BatchNormInference<'_>,
    epsilon: f64,
    relu: bool,
) -> Result<()> {
    const OP: &str = "batch_norm_inference";
    let xv = ncs(OP, "x", a.x)?;
    let xo = like_x(OP, "x", a.x, a.x, false)?;
    let zo = operand(OP, "residual", a.x, a.residual, false)?;
    let yo = like_x(OP, "y", a.x, a.y, true)?;
    let c = xv.c;
    let pdt = check_params(
        OP,
        c,
        a.x.dtype,
        &[
            ("scale", a.scale),
            ("bias", a.bias),
            ("mean", Some(a.mean)),
            ("var", Some(a.var)),
        ],
    )?;
    if a.x.is_empty() {
        return Ok(());
    }
    check_on_stream_device(
        stream,
        OP,
        &[
            ("x", Some(a.x)),
            ("residual", a.residual),
            ("y", Some(a.y)),
            ("scale", a.scale),
            ("bias", a.bias),
            ("mean", Some(a.mean)),
            ("var", Some(a.var)),
        ],
    )?;
    let sm = sm_count(stream)?;
    let pass = Pass::choose(&xv, a.x.dtype, &[&xo, &zo, &yo], sm, true);
    let coef_fn = stream_function(stream, BATCH_NORM, "bn_inference_coef")?;
    let apply = stream_function(stream, BATCH_NORM, pass.entry(Kernel::Apply, a.x.dtype))?;
    with_workspace(stream, scratch_bytes(0, 2 * c as usize), |ws| {
        let coef = coef_at(ws, 0);
        launch::inference_coef(
            stream,
            &coef_fn,
            c,
            epsilon as f32,
            ptr(a.scale),
            ptr(a.bias),
            pdt,
            a.mean.address(),
            a.var.address(),
            coef,
        )?;
        match &pass {
            Pass::ChannelsLast(v) => launch::apply_vec(stream, &apply, [xo.ptr, zo.ptr, yo.ptr], v, coef, relu),
            Pass::Planes(p) => launch::apply_planes(stream, &apply, [xo.ptr, zo.ptr, yo.ptr], p, coef, relu),
            Pass::Strided(sh) => launch::apply(stream, &apply, [&xo, &zo, &yo], sh, coef, relu),
        }
    })
}

/// Batch-norm backward from the saved statistics: `dx`, the residual's gradient, and the
/// scale and bias gradients (each only when asked for).
pub fn batch_norm_backward(stream: &Arc<CudaStream>, a: &BatchNormBackward<'_>) -> Result<()> {
    const OP: &str = "batch_norm_backward";
    let xv = ncs(OP, "x", a.x)?;
    let xo = like_x(OP, "x", a.x, a.x, false)?;
    let yo = operand(OP, "y", a.x, a.y, false)?;
    let dyo = like_x(OP, "dy", a.x, a.dy, false)?;
    let dxo = operand(OP, "dx", a.x, a.dx.map(TensorMut::as_input), true)?;
    let dzo = operand(OP, "d_residual", a.x, a.d_residual.map(TensorMut::as_input), true)?;
    let c = xv.c;
    let pdt = check_params(
        OP,
        c,
        a.x.dtype,
        &[
            ("scale", a.scale),
            ("d_scale", a.d_scale.map(TensorMut::as_input)),
            ("d_bias", a.d_bias.map(TensorMut::as_input)),
        ],
    )?;
    check_stats(
        OP,
        c,
        &[("saved_mean", a.saved_mean), ("saved_inv_std", a.saved_inv_std)],
    )?;
    if c == 0 {
        return Ok(());
    }
    check_batch(OP, a.x, &xv)?;
    check_on_stream_device(
        stream,
        OP,
        &[
            ("x", Some(a.x)),
            ("y", a.y),
            ("dy", Some(a.dy)),
            ("dx", a.dx.map(TensorMut::as_input)),
            ("d_residual", a.d_residual.map(TensorMut::as_input)),
            ("scale", a.scale),
            ("saved_mean", Some(a.saved_mean)),
            ("saved_inv_std", Some(a.saved_inv_std)),
            ("d_scale", a.d_scale.map(TensorMut::as_input)),
            ("d_bias", a.d_bias.map(TensorMut::as_input)),
        ],
    )?;
    let sm = sm_count(stream)?;
    // The channels-last vectors also read the saved mean 16 bytes at a time.
    let mean_aligned = a.saved_mean.ptr.is_multiple_of(16);
    let pass = Pass::choose(&xv, a.x.dtype, &[&xo, &yo, &dyo, &dxo, &dzo], sm, mean_aligned);
    let grad_finalize = stream_function(stream, BATCH_NORM, "bn_grad_finalize")?;
    let kernel = |k: Kernel| stream_function(stream, BATCH_NORM, pass.entry(k, a.x.dtype));
    let (grad_stats, grad_apply) = (kernel(Kernel::GradStats)?, kernel(Kernel::GradApply)?);
    let part_floats = partial_floats(2, &pass);
    with_workspace(stream, scratch_bytes(part_floats, 3 * c as usize), |ws| {
        let coef = coef_at(ws, part_floats);
        let sh = pass.shape();
        let mean = a.saved_mean.address();
        match &pass {
            Pass::ChannelsLast(v) => {
                launch::grad_stats_vec(stream, &grad_stats, [xo.ptr, yo.ptr, dyo.ptr], v, mean, ws)?
            }
            Pass::Planes(p) => launch::grad_stats_planes(stream, &grad_stats, [xo.ptr, yo.ptr, dyo.ptr], p, mean, ws)?,
            Pass::Strided(sh) => launch::grad_stats(stream, &grad_stats, [&xo, &yo, &dyo], sh, mean, ws)?,
        }
        launch::grad_finalize(
            stream,
            &grad_finalize,
            &sh,
            ws,
            ptr(a.scale),
            pdt,
            [a.saved_mean.address(), a.saved_inv_std.address()],
            [
                ptr(a.d_scale.map(TensorMut::as_input)),
                ptr(a.d_bias.map(TensorMut::as_input)),
            ],
            coef,
        )?;
        if a.dx.is_none() && a.d_residual.is_none() {
            return Ok(());
        }
        let data = [xo.ptr, yo.ptr, dyo.ptr, dxo.ptr, dzo.ptr];
        match &pass {
            Pass::ChannelsLast(v) => launch::grad_apply_vec(stream, &grad_apply, data, v, coef),
            Pass::Planes(p) => launch::grad_apply_planes(stream, &grad_apply, data, p, coef),
            Pass::Strided(sh) => launch::grad_apply(stream, &grad_apply, [&xo, &yo, &dyo, &dxo, &dzo], sh, coef),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[i64], strides: &[i64]) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, DataType::F32, 256)
    }

    #[test]
    fn ncs_reads_nchw_nhwc_and_slices() {
        let v = ncs("t", "x", &TensorRef::fake_packed(&[2, 3, 4, 5], DataType::F32, 256)).unwrap();
        assert_eq!((v.n, v.c, v.s), (2, 3, 20));
        assert_eq!(v.view, BnView { sn: 60, sc: 20, ss: 1 });
        let v = ncs(
            "t",
            "x",
            &TensorRef::fake_channels_last(&[2, 3, 4, 5], DataType::F32, 256),
        )
        .unwrap();
        assert_eq!(v.view, BnView { sn: 60, sc: 1, ss: 3 });
        // A channel slice of NCHW keeps one spatial run; size-1 spatial dims are ignored.
        let v = ncs("t", "x", &t(&[2, 2, 1, 5], &[60, 20, 99, 1])).unwrap();
        assert_eq!((v.s, v.view.ss), (5, 1));
        // Rank 2 ([N, C]) has S = 1.
        let v = ncs("t", "x", &t(&[7, 3], &[3, 1])).unwrap();
        assert_eq!((v.n, v.c, v.s), (7, 3, 1));
        // Transposed spatial dims are not one run.
        assert!(ncs("t", "x", &t(&[2, 3, 4, 5], &[60, 20, 1, 4])).is_err());
        assert!(ncs("t", "x", &t(&[3], &[1])).is_err());
        assert!(ncs("t", "x", &TensorRef::fake_packed(&[2, 3], DataType::I32, 256)).is_err());
    }

    #[test]
    fn parameters_share_one_dtype() {
        let f32p = TensorRef::fake_packed(&[4], DataType::F32, 256);
        let f16p = TensorRef::fake_packed(&[4], DataType::F16, 256);
        let bf = TensorRef::fake_packed(&[4], DataType::BF16, 256);
        assert_eq!(check_params("t", 4, DataType::F16, &[("a", Some(&f32p))]).unwrap(), 0);
        assert_eq!(
            check_params("t", 4, DataType::F16, &[("a", Some(&f16p)), ("b", None)]).unwrap(),
            1
        );
        assert_eq!(check_params("t", 4, DataType::F16, &[]).unwrap(), 0);
        assert!(check_params("t", 4, DataType::F16, &[("a", Some(&f32p)), ("b", Some(&f16p))]).is_err());
        assert!(check_params("t", 4, DataType::F16, &[("a", Some(&bf))]).is_err());
        assert!(check_params("t", 5, DataType::F32, &[("a", Some(&f32p))]).is_err());
    }
}
