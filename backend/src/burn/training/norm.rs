//! Layer and RMS norm over the last dim on [`Cudnn`]: the training forward (row statistics
//! kept) and its backward, [`crate::ops::norm_backward`].

use burn_backend::DType;

use super::super::exec;
use super::super::tensor::{tmut_of, tref_of, CudnnTensor};
use super::batch_norm::try_map;
use crate::error::Result;
use crate::graph::NormMode;
use crate::ops::{self, NormBackward};

/// What the backward pass needs.
#[derive(Clone, Debug)]
pub(crate) struct NormSaved {
    /// The input as packed `[rows, features]`.
    x: CudnnTensor,
    /// The input's dims (the gradient gets them back).
    dims: Vec<i64>,
    scale: CudnnTensor,
    /// The dtype of the scale and bias as passed.
    param_dtype: DType,
    mean: Option<CudnnTensor>,
    inv_std: CudnnTensor,
    mode: NormMode,
}

/// `x` as packed `[rows, features]`, its dims, and `scale` in the dtype the kernels take (the
/// data dtype or f32) with the dtype it was passed in.
fn rows_and_params(
    x: CudnnTensor,
    scale: CudnnTensor,
    op: &str,
) -> Result<(CudnnTensor, Vec<i64>, CudnnTensor, DType)> {
    let dims = x.dims().to_vec();
    let features = dims.last().copied().unwrap_or(1);
    let rows = if features == 0 { 0 } else { x.numel() / features };
    let x2 = x.contiguous()?.reshape(&[rows, features])?;
    let param_dtype = scale.dtype;
    let pdt = if scale.dtype == x2.dtype { x2.dtype } else { DType::F32 };
    let scale = exec::cast(scale, pdt, op)?.contiguous()?;
    Ok((x2, dims, scale, param_dtype))
}

impl NormSaved {
    /// The saved state from the forward's inputs as passed and its row statistics: what a
    /// lazily recorded forward hands its backward.
    pub(super) fn rebuild(
        x: CudnnTensor,
        scale: CudnnTensor,
        mean: Option<CudnnTensor>,
        inv_std: CudnnTensor,
        mode: NormMode,
    ) -> Result<Self> {
        let (x, dims, scale, param_dtype) = rows_and_params(x, scale, "norm_backward")?;
        Ok(Self {
            x,
            dims,
            scale,
            param_dtype,
            mean,
            inv_std,
            mode,
        })
    }

    /// The row statistics: the mean (layer norm only) and the inverse std, f32 `[rows]`.
    pub(super) fn stats(&self) -> (Option<&CudnnTensor>, &CudnnTensor) {
        (self.mean.as_ref(), &self.inv_std)
    }
}

/// Forward over the last dim; returns `y` (x's dims) and what the backward needs.
pub(super) fn forward(
    x: CudnnTensor,
    scale: CudnnTensor,
    bias: Option<CudnnTensor>,
    epsilon: f64,
    mode: NormMode,
) -> Result<(CudnnTensor, NormSaved)> {
    const OP: &str = "norm_train_forward";
    let (x2, dims, scale, param_dtype) = rows_and_params(x, scale, OP)?;
    let bias = bias.map(|b| exec::cast(b, scale.dtype, OP)?.contiguous()).transpose()?;
    let rows = x2.dims()[0];
    let y = x2.empty_like(x2.dtype, OP)?;
    let stat = || CudnnTensor::empty(x2.device(), &[rows], DType::F32, OP);
    let mean = (mode == NormMode::LayerNorm).then(stat).transpose()?;
    let inv_std = stat()?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, ty, ts, ti) = (x2.tref(), y.tmut(), scale.tref(), inv_std.tmut());
        let (tb, tm) = (tref_of(&bias), tmut_of(&mean));
        ops::norm_train_forward(
            y.stream(),
            mode,
            &tx,
            Some(&ts),
            tb.as_ref(),
            &ty,
            epsilon,
            tm.as_ref(),
            &ti,
        )?;
    }
    let saved = NormSaved {
        x: x2,
        dims: dims.clone(),
        scale,
        param_dtype,
        mean,
        inv_std,
        mode,
    };
    Ok((y.reshape(&dims)?, saved))
}

/// `[dx, dscale, dbias]`, each when `want` asks.
pub(super) fn backward(s: &NormSaved, dy: CudnnTensor, want: [bool; 3]) -> Result<[Option<CudnnTensor>; 3]> {
    const OP: &str = "norm_backward";
    let (rows, features) = (s.x.dims()[0], s.x.dims()[1]);
    let dy = exec::cast(dy, s.x.dtype, OP)?
        .contiguous()?
        .reshape(&[rows, features])?;
    let dx = want[0].then(|| s.x.empty_like(s.x.dtype, OP)).transpose()?;
    let [ds, db] = try_map([want[1], want[2]], |w| {
        w.then(|| CudnnTensor::empty(s.x.device(), &[features], s.scale.dtype, OP))
            .transpose()
    })?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, tdy, tscale, ti) = (s.x.tref(), dy.tref(), s.scale.tref(), s.inv_std.tref());
        let (tm, tdx, tds, tdb) = (tref_of(&s.mean), tmut_of(&dx), tmut_of(&ds), tmut_of(&db));
        let args = NormBackward {
            x: &tx,
            dy: &tdy,
            scale: Some(&tscale),
            mean: tm.as_ref(),
            inv_std: &ti,
            dx: tdx.as_ref(),
            d_scale: tds.as_ref(),
            d_bias: tdb.as_ref(),
        };
        ops::norm_backward(dy.stream(), s.mode, &args)?;
    }
    let back = |t: Option<CudnnTensor>| t.map(|t| exec::cast(t, s.param_dtype, OP)).transpose();
    Ok([dx.map(|t| t.reshape(&s.dims)).transpose()?, back(ds)?, back(db)?])
}
