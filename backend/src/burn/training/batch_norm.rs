//! Batch norm on [`Cudnn`]: the training forward (batch statistics, running-statistic
//! update, saved mean and inverse std), its backward, and the inference forward.

use burn_backend::DType;

use super::super::exec;
use super::super::tensor::{tmut_of, tref_of, CudnnTensor};
use crate::error::Result;
use crate::ops::{self, BatchNormBackward, BatchNormForward, BatchNormInference, BatchNormOptions, RunningStats};

/// The forward results the backward pass needs.
#[derive(Clone, Debug)]
pub(crate) struct BnSaved {
    x: CudnnTensor,
    /// The output, kept when the forward applied ReLU (its sign masks the gradient).
    y: Option<CudnnTensor>,
    scale: CudnnTensor,
    /// The dtype of the scale and bias parameters as passed (their gradients get it back).
    param_dtype: DType,
    mean: CudnnTensor,
    inv_std: CudnnTensor,
}

impl BnSaved {
    /// The saved state from the forward's inputs as passed (`x`, `scale`), its ReLU output
    /// (`y`) and its statistics: what a lazily recorded forward hands its backward.
    pub(super) fn rebuild(
        x: CudnnTensor,
        y: Option<CudnnTensor>,
        scale: CudnnTensor,
        mean: CudnnTensor,
        inv_std: CudnnTensor,
    ) -> Result<Self> {
        let x = x.cudnn_ready()?;
        let param_dtype = scale.dtype;
        let pdt = param_dtype_for(x.dtype, &scale);
        let scale = exec::cast(scale, pdt, "batch_norm_backward")?.contiguous()?;
        Ok(Self {
            x,
            y: y.map(CudnnTensor::cudnn_ready).transpose()?,
            scale,
            param_dtype,
            mean,
            inv_std,
        })
    }

    /// The batch statistics: mean and inverse std, f32 `[C]`.
    pub(super) fn stats(&self) -> [&CudnnTensor; 2] {
        [&self.mean, &self.inv_std]
    }
}

/// A new packed tensor with `like`'s dims and dim order (`like` is packed).
pub(super) fn empty_as(like: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    let mut out = CudnnTensor::empty(like.device(), like.dims(), like.dtype, op)?;
    out.layout.strides = like.layout.strides.clone();
    Ok(out)
}

/// `f` applied to each element of an array, stopping at the first error.
pub(super) fn try_map<T, U, const N: usize>(items: [T; N], f: impl FnMut(T) -> Result<U>) -> Result<[U; N]> {
    let out: Vec<U> = items.into_iter().map(f).collect::<Result<_>>()?;
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("an array maps to an array of the same length")))
}

/// The residual operand on `x`'s device, ready for the engine (`None` stays `None`).
fn residual_ready(op: &str, x: &CudnnTensor, residual: Option<CudnnTensor>) -> Result<Option<CudnnTensor>> {
    residual
        .map(|r| {
            exec::check_same_device(op, x, &r)?;
            r.cudnn_ready()
        })
        .transpose()
}

/// The per-channel tensors in one dtype the kernels accept: the data dtype or f32.
fn param_dtype_for(data: DType, scale: &CudnnTensor) -> DType {
    if scale.dtype == data {
        data
    } else {
        DType::F32
    }
}

/// Training forward: `(y, [running mean, running var] updated (in the dtype of the running
/// statistics passed), saved state)`.
pub(super) fn forward(
    x: CudnnTensor,
    scale: CudnnTensor,
    bias: CudnnTensor,
    residual: Option<CudnnTensor>,
    running: [CudnnTensor; 2],
    o: &BatchNormOptions,
) -> Result<(CudnnTensor, [CudnnTensor; 2], BnSaved)> {
    const OP: &str = "batch_norm_train";
    let x = x.cudnn_ready()?;
    let residual = residual_ready(OP, &x, residual)?;
    let running_dtype = running[0].dtype;
    let param_dtype_in = scale.dtype;
    let pdt = param_dtype_for(x.dtype, &scale);
    let [scale, bias] = try_map([scale, bias], |t| exec::cast(t, pdt, OP)?.contiguous())?;
    let [rm, rv] = try_map(running, |t| exec::cast(t, pdt, OP)?.contiguous())?;
    let c = x.dims().get(1).copied().unwrap_or(0);
    let y = empty_as(&x, OP)?;
    let [rm_out, rv_out] = try_map([(); 2], |_| CudnnTensor::empty(x.device(), &[c], pdt, OP))?;
    let [mean, inv_std] = try_map([(); 2], |_| CudnnTensor::empty(x.device(), &[c], DType::F32, OP))?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, tz, ty) = (x.tref(), residual.as_ref().map(|r| r.tref()), y.tmut());
        let (ts, tb) = (scale.tref(), bias.tref());
        let (trm, trv, trmo, trvo) = (rm.tref(), rv.tref(), rm_out.tmut(), rv_out.tmut());
        let (tm, ti) = (mean.tmut(), inv_std.tmut());
        let args = BatchNormForward {
            x: &tx,
            residual: tz.as_ref(),
            y: &ty,
            scale: Some(&ts),
            bias: Some(&tb),
            running: Some(RunningStats {
                mean: &trm,
                var: &trv,
                mean_out: &trmo,
                var_out: &trvo,
            }),
            saved_mean: &tm,
            saved_inv_std: &ti,
        };
        ops::batch_norm_train_forward(x.stream(), &args, o)?;
    }
    let saved = BnSaved {
        x,
        y: o.relu.then(|| y.clone()),
        scale,
        param_dtype: param_dtype_in,
        mean,
        inv_std,
    };
    let stats = try_map([rm_out, rv_out], |t| exec::cast(t, running_dtype, OP))?;
    Ok((y, stats, saved))
}

/// Gradients of one batch-norm node: `[dx, d_residual, d_scale, d_bias]`, each computed
/// only when `want` asks for it.
pub(super) fn backward(s: &BnSaved, dy: CudnnTensor, want: [bool; 4]) -> Result<[Option<CudnnTensor>; 4]> {
    const OP: &str = "batch_norm_backward";
    // Gradients arrive in any layout (broadcasts from a mean, say): packed for the kernels.
    let dy = exec::cast(dy, s.x.dtype, OP)?.cudnn_ready()?;
    let [dx, dz] = try_map([want[0], want[1]], |w| w.then(|| empty_as(&s.x, OP)).transpose())?;
    let c = s.scale.numel();
    let [ds, db] = try_map([want[2], want[3]], |w| {
        w.then(|| CudnnTensor::empty(s.x.device(), &[c], s.scale.dtype, OP))
            .transpose()
    })?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, ty, tdy) = (s.x.tref(), tref_of(&s.y), dy.tref());
        let (tdx, tdz, tds, tdb) = (tmut_of(&dx), tmut_of(&dz), tmut_of(&ds), tmut_of(&db));
        let (tscale, tm, ti) = (s.scale.tref(), s.mean.tref(), s.inv_std.tref());
        let args = BatchNormBackward {
            x: &tx,
            y: ty.as_ref(),
            dy: &tdy,
            dx: tdx.as_ref(),
            d_residual: tdz.as_ref(),
            scale: Some(&tscale),
            saved_mean: &tm,
            saved_inv_std: &ti,
            d_scale: tds.as_ref(),
            d_bias: tdb.as_ref(),
        };
        ops::batch_norm_backward(dy.stream(), &args)?;
    }
    let back = |t: Option<CudnnTensor>| t.map(|t| exec::cast(t, s.param_dtype, OP)).transpose();
    Ok([dx, dz, back(ds)?, back(db)?])
}

/// Inference forward with the running statistics, the optional residual add and ReLU.
#[allow(clippy::too_many_arguments)]
pub(super) fn inference(
    x: CudnnTensor,
    scale: CudnnTensor,
    bias: CudnnTensor,
    residual: Option<CudnnTensor>,
    running_mean: CudnnTensor,
    running_var: CudnnTensor,
    epsilon: f64,
    relu: bool,
) -> Result<CudnnTensor> {
    const OP: &str = "batch_norm_inference";
    let x = x.cudnn_ready()?;
    let residual = residual_ready(OP, &x, residual)?;
    let pdt = param_dtype_for(x.dtype, &scale);
    let [scale, bias, rm, rv] = try_map([scale, bias, running_mean, running_var], |t| {
        exec::cast(t, pdt, OP)?.contiguous()
    })?;
    let y = empty_as(&x, OP)?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, tz, ty) = (x.tref(), residual.as_ref().map(|r| r.tref()), y.tmut());
        let (ts, tb, tm, tv) = (scale.tref(), bias.tref(), rm.tref(), rv.tref());
        let args = BatchNormInference {
            x: &tx,
            residual: tz.as_ref(),
            y: &ty,
            scale: Some(&ts),
            bias: Some(&tb),
            mean: &tm,
            var: &tv,
        };
        ops::batch_norm_inference(x.stream(), &args, epsilon, relu)?;
    }
    Ok(y)
}
