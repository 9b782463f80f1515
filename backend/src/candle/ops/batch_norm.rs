//! Batch normalization in training mode on Candle tensors: normalization with the batch
//! statistics, the running-statistic update in place, and a backward pass from the saved
//! statistics. On CUDA these are the engine's batch-norm kernels (forward: statistics, running
//! update and output in three launches; backward: dx, dweight and dbias in three); on the CPU
//! float64 references.

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, Var};

use super::{in_format, is_channels_last, logical, physical_dims};
use crate::candle::access::{addr, check_distinct, storage_id};
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::saved::Saved;
use crate::candle::{arg_err, cpu};
use crate::ops::BatchNormOptions;

const OP: &str = "candle batch_norm_train";

/// Batch norm in training mode over channel dim 1 of `x` (N, C, spatial...): normalizes with
/// the batch mean and (biased) variance, applies the optional per-channel weight and bias and
/// the optional ReLU ([`BatchNormOptions::relu`]), and updates the running statistics in place:
/// `running = (1 - momentum) · running + momentum · batch`, the running variance taking the
/// unbiased batch variance unless [`BatchNormOptions::unbiased_running_var`] is off. Apply with
/// [`batch_norm_train`].
///
/// Inputs: x (f32/f16/bf16; the CPU reference also f64) and, with affine parameters, weight
/// and bias (`CustomOp3`; `CustomOp1` without). Weight, bias and the running statistics hold
/// C elements each and share one dtype, f32 or x's. Each channel needs more than one value
/// (N · spatial > 1). An x stored channels-last gives an output stored channels-last,
/// returned in the shape (N, spatial..., C) ([`batch_norm_train`] hands back its NCHW view).
///
/// The batch mean and inverse standard deviation are kept in the op for the backward pass,
/// which computes dx, dweight and dbias in one engine call (three launches on CUDA).
#[derive(Clone, Debug)]
pub struct BatchNormTrain {
    options: BatchNormOptions,
    running: Option<(Var, Var)>,
    saved: Saved,
}

/// The checked sizes of a call: x's logical dims, its channels, and whether it is stored
/// channels-last.
struct Geometry {
    dims: Vec<usize>,
    c: usize,
    channels_last: bool,
}

impl Geometry {
    fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Values per channel.
    fn count(&self) -> usize {
        self.dims[0] * self.dims[2..].iter().product::<usize>()
    }
}

/// Gradients: dx, the residual's gradient when the op adds one, and (dweight, dbias) with
/// affine parameters.
type Grads = (Tensor, Option<Tensor>, Option<(Tensor, Tensor)>);

impl BatchNormTrain {
    /// The op with these options (epsilon, momentum, running-variance convention, ReLU),
    /// updating `running` = (mean, variance) in place when given.
    pub fn new(options: BatchNormOptions, running: Option<(&Var, &Var)>) -> Self {
        Self {
            options,
            running: running.map(|(m, v)| (m.clone(), v.clone())),
            saved: Saved::default(),
        }
    }

    /// Checks x's rank, dtype, layout and batch size and the per-channel tensors' sizes and
    /// dtypes (`params`: name, dims, dtype).
    fn geometry(&self, x: &Layout, x_dtype: DType, params: &[(&'static str, &[usize], DType)]) -> Result<Geometry> {
        let dims = x.dims().to_vec();
        if dims.len() < 2 {
            return Err(arg_err(OP, "x", format!("dims {dims:?}: needs (N, C, spatial...)")));
        }
        if !matches!(x_dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            return Err(arg_err(
                OP,
                "x",
                format!("dtype {x_dtype:?}: f32, f16 or bf16 (also f64 on the CPU)"),
            ));
        }
        let c = dims[1];
        let mut all: Vec<(&'static str, Vec<usize>, DType)> =
            params.iter().map(|&(n, d, t)| (n, d.to_vec(), t)).collect();
        if let Some((m, v)) = &self.running {
            all.push(("running_mean", m.dims().to_vec(), m.dtype()));
            all.push(("running_var", v.dims().to_vec(), v.dtype()));
        }
        let first = all.first().map(|(n, _, t)| (*n, *t));
        for (name, d, dt) in &all {
            if d.iter().product::<usize>() != c {
                return Err(arg_err(
                    OP,
                    name,
                    format!("dims {d:?}: need {c} elements (x's channels)"),
                ));
            }
            if *dt != DType::F32 && *dt != x_dtype {
                return Err(arg_err(
                    OP,
                    name,
                    format!("dtype {dt:?}: must be F32 or x's {x_dtype:?}"),
                ));
            }
            if let Some((first_name, first_dt)) = first.filter(|&(_, t)| t != *dt) {
                return Err(arg_err(
                    OP,
                    name,
                    format!("dtype {dt:?} differs from {first_name}'s {first_dt:?} (one dtype for all)"),
                ));
            }
        }
        let g = Geometry {
            channels_last: is_channels_last(x),
            dims,
            c,
        };
        if c > 0 && g.count() <= 1 {
            return Err(arg_err(
                OP,
                "x",
                format!(
                    "dims {:?} give {} value(s) per channel: training batch norm needs more than one",
                    g.dims,
                    g.count()
                ),
            ));
        }
        if !g.channels_last && !x.is_contiguous() {
            return Err(arg_err(
                OP,
                "x",
                "needs a row-major or channels-last packed tensor (batch_norm_train makes one)",
            ));
        }
        Ok(g)
    }

    /// Refuses running statistics that share storage with each other or with an input (the
    /// update write-locks them while the inputs are read-locked).
    fn check_running(&self, inputs: &[usize]) -> Result<()> {
        if let Some((m, v)) = &self.running {
            let written = [("running_mean", storage_id(m)), ("running_var", storage_id(v))];
            check_distinct(OP, &written, inputs)?;
        }
        Ok(())
    }

    /// Checks that the residual has x's dims, dtype and strides.
    fn check_residual(x: &Layout, x_dtype: DType, r: &Layout, r_dtype: DType) -> Result<()> {
        if r.dims() != x.dims() || r.stride() != x.stride() {
            return Err(arg_err(
                OP,
                "residual",
                format!(
                    "dims {:?} strides {:?}: must be stored like x (dims {:?}, strides {:?})",
                    r.dims(),
                    r.stride(),
                    x.dims(),
                    x.stride()
                ),
            ));
        }
        if r_dtype != x_dtype {
            return Err(arg_err(
                OP,
                "residual",
                format!("dtype {r_dtype:?} differs from x's {x_dtype:?}"),
            ));
        }
        Ok(())
    }

    fn cpu_forward(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        residual: Option<(&CpuStorage, &Layout)>,
        affine: Option<[(&CpuStorage, &Layout); 2]>,
    ) -> Result<(CpuStorage, Shape)> {
        let params: Vec<_> = affine
            .iter()
            .flat_map(|[(ws, wl), (bs, bl)]| [("weight", wl.dims(), ws.dtype()), ("bias", bl.dims(), bs.dtype())])
            .collect();
        let g = self.geometry(xl, xs.dtype(), &params)?;
        let mut inputs = vec![addr(xs)];
        inputs.extend(affine.iter().flat_map(|[(ws, _), (bs, _)]| [addr(*ws), addr(*bs)]));
        if let Some((rs, rl)) = residual {
            Self::check_residual(xl, xs.dtype(), rl, rs.dtype())?;
            inputs.push(addr(rs));
        }
        self.check_running(&inputs)?;
        let shape: Shape = physical_dims(&g.dims, g.channels_last).into();
        if g.numel() == 0 {
            return Ok((cpu::write(OP, &[], xs.dtype())?, shape));
        }
        let x = cpu::read(OP, "x", xs, xl)?;
        let (scale, bias) = match affine {
            Some([(ws, wl), (bs, bl)]) => (cpu::read(OP, "weight", ws, wl)?, cpu::read(OP, "bias", bs, bl)?),
            None => (vec![1.0; g.c], vec![0.0; g.c]),
        };
        let r = residual.map(|(rs, rl)| cpu::read(OP, "residual", rs, rl)).transpose()?;
        let o = &self.options;
        let (y, means, invs, unbiased) =
            cudnn_backend_reference::batch_norm_train(&x, &g.dims, &scale, &bias, r.as_deref(), o.epsilon, o.relu);
        if let Some((rm, rv)) = &self.running {
            let count = g.count() as f64;
            let batch_var: Vec<f64> = if o.unbiased_running_var {
                unbiased
            } else {
                unbiased.iter().map(|v| v * (count - 1.0) / count).collect()
            };
            update_running(rm, &means, o.momentum)?;
            update_running(rv, &batch_var, o.momentum)?;
        }
        self.saved.keep(vec![
            Tensor::from_vec(means, g.c, &Device::Cpu)?,
            Tensor::from_vec(invs, g.c, &Device::Cpu)?,
        ]);
        let y = cpu::to_physical(y, &g.dims, g.channels_last);
        Ok((cpu::write(OP, &y, xs.dtype())?, shape))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_forward(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        residual: Option<(&CudaStorage, &Layout)>,
        affine: Option<[(&CudaStorage, &Layout); 2]>,
    ) -> Result<(CudaStorage, Shape)> {
        use crate::candle::cuda::Output;
        use crate::graph::DataType;
        use crate::ops::{BatchNormForward, RunningStats};

        let params: Vec<_> = affine
            .iter()
            .flat_map(|[(ws, wl), (bs, bl)]| [("weight", wl.dims(), ws.dtype()), ("bias", bl.dims(), bs.dtype())])
            .collect();
        let g = self.geometry(xl, xs.dtype(), &params)?;
        let mut inputs = vec![addr(xs)];
        inputs.extend(affine.iter().flat_map(|[(ws, _), (bs, _)]| [addr(*ws), addr(*bs)]));
        if let Some((rs, rl)) = residual {
            Self::check_residual(xl, xs.dtype(), rl, rs.dtype())?;
            inputs.push(addr(rs));
        }
        self.check_running(&inputs)?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let r = residual
            .map(|(rs, rl)| cuda::input(OP, "residual", rs, rl, &stream))
            .transpose()?;
        let mut aff = Vec::with_capacity(2);
        for (name, (s, l)) in ["weight", "bias"].into_iter().zip(affine.into_iter().flatten()) {
            if !l.is_contiguous() {
                return Err(arg_err(OP, name, "needs a contiguous tensor"));
            }
            aff.push(cuda::input(OP, name, s, l, &stream)?);
        }
        let c = g.c as i64;
        let scale = aff
            .first()
            .map(|t| t.reshaped(&[c], &[1]))
            .transpose()
            .map_err(candle_core::Error::wrap)?;
        let bias = aff
            .get(1)
            .map(|t| t.reshaped(&[c], &[1]))
            .transpose()
            .map_err(candle_core::Error::wrap)?;
        let dims = super::idims(&g.dims);
        let strides = super::packed_strides(&g.dims, g.channels_last);
        let mut y = Output::alloc(OP, &stream, x.dtype(), g.numel())?;
        let mut mean = Output::alloc(OP, &stream, DataType::F32, g.c)?;
        let mut inv = Output::alloc(OP, &stream, DataType::F32, g.c)?;
        {
            let yr = y.view(&stream, &dims, &strides)?;
            let mr = mean.view(&stream, &[c], &[1])?;
            let ir = inv.view(&stream, &[c], &[1])?;
            let run = |running: Option<RunningStats<'_>>| -> Result<()> {
                let a = BatchNormForward {
                    x: &x,
                    residual: r.as_ref(),
                    y: &yr,
                    scale: scale.as_ref(),
                    bias: bias.as_ref(),
                    running,
                    saved_mean: &mr,
                    saved_inv_std: &ir,
                };
                crate::ops::batch_norm_train_forward(&stream, &a, &self.options).map_err(candle_core::Error::wrap)
            };
            match &self.running {
                Some((rm, rv)) => {
                    let written = [rm.as_tensor(), rv.as_tensor()];
                    crate::candle::access::with_written(OP, &written, &mut |v| {
                        let (m, var) = (
                            v[0].reshaped_mut(&[c], &[1]).map_err(candle_core::Error::wrap)?,
                            v[1].reshaped_mut(&[c], &[1]).map_err(candle_core::Error::wrap)?,
                        );
                        run(Some(RunningStats {
                            mean: &m,
                            var: &var,
                            mean_out: &m,
                            var_out: &var,
                        }))
                    })?
                }
                None => run(None)?,
            }
        }
        let dev = &xs.device;
        self.saved.keep(vec![
            cuda::tensor(mean.into_storage(dev.clone()), g.c),
            cuda::tensor(inv.into_storage(dev.clone()), g.c),
        ]);
        let shape: Shape = physical_dims(&g.dims, g.channels_last).into();
        Ok((y.into_storage(dev.clone()), shape))
    }

    /// The backward pass from the op's input `x`, its output `y` and output gradient `grad`
    /// (both in the op's output shape) and, with affine parameters, (weight, bias); with
    /// `residual` also the gradient of the added residual.
    fn backward(
        &self,
        x: &Tensor,
        residual: bool,
        affine: Option<(&Tensor, &Tensor)>,
        y: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads> {
        let cl = is_channels_last(x.layout());
        // The gradient as a logical view stored like x (one copy when it is stored otherwise).
        let g = logical(grad.clone(), cl)?;
        let g = if g.rank() >= 3 {
            in_format(&g, cl)?
        } else {
            g.contiguous()?
        };
        let y = logical(y.clone(), cl)?;
        if x.elem_count() == 0 {
            let zeros = affine.map(|(w, b)| Ok::<_, candle_core::Error>((w.zeros_like()?, b.zeros_like()?)));
            let dr = residual.then(|| x.zeros_like()).transpose()?;
            return Ok((x.zeros_like()?, dr, zeros.transpose()?));
        }
        match x.device() {
            Device::Cpu => self.backward_cpu(x, residual, affine, &y, &g),
            #[cfg(feature = "candle-cuda")]
            Device::Cuda(_) => self.backward_cuda(x, residual, affine, &y, &g, cl),
            other => Err(arg_err(
                OP,
                "x",
                format!("device {:?} is not supported", other.location()),
            )),
        }
    }

    fn backward_cpu(
        &self,
        x: &Tensor,
        residual: bool,
        affine: Option<(&Tensor, &Tensor)>,
        y: &Tensor,
        g: &Tensor,
    ) -> Result<Grads> {
        let dims = x.dims();
        let c = dims[1];
        let (xv, gv) = (f64s(x)?, f64s(g)?);
        let yv = self.options.relu.then(|| f64s(y)).transpose()?;
        let scale = match affine {
            Some((w, _)) => f64s(w)?,
            None => vec![1.0; c],
        };
        let (means, invs) = match self.saved.get() {
            Some(s) if s.len() == 2 => (f64s(&s[0])?, f64s(&s[1])?),
            _ => {
                let (ones, zeros) = (vec![1.0; c], vec![0.0; c]);
                let o = &self.options;
                let (_, m, i, _) =
                    cudnn_backend_reference::batch_norm_train(&xv, dims, &ones, &zeros, None, o.epsilon, false);
                (m, i)
            }
        };
        let (dx, dr, dscale, dbias) =
            cudnn_backend_reference::batch_norm_backward(&xv, yv.as_deref(), &gv, dims, &scale, &means, &invs);
        let back = |v: Vec<f64>, like: &Tensor| Tensor::from_vec(v, like.shape(), &Device::Cpu)?.to_dtype(like.dtype());
        let params = affine.map(|(w, b)| Ok::<_, candle_core::Error>((back(dscale, w)?, back(dbias, b)?)));
        let dr = residual.then(|| back(dr, x)).transpose()?;
        Ok((back(dx, x)?, dr, params.transpose()?))
    }

    #[cfg(feature = "candle-cuda")]
    fn backward_cuda(
        &self,
        x: &Tensor,
        residual: bool,
        affine: Option<(&Tensor, &Tensor)>,
        y: &Tensor,
        g: &Tensor,
        cl: bool,
    ) -> Result<Grads> {
        use crate::candle::cuda::Output;
        use crate::ops::BatchNormBackward;

        let dims = x.dims().to_vec();
        let c = dims[1] as i64;
        let (xg, xl) = x.storage_and_layout();
        let xs = cuda::storage_of(OP, "x", &xg)?;
        let stream = cuda::stream(xs);
        let xr = cuda::input(OP, "x", xs, xl, &stream)?;
        let (gg, gl) = g.storage_and_layout();
        let gr = cuda::input(OP, "grad", cuda::storage_of(OP, "grad", &gg)?, gl, &stream)?;
        let (yg, yl) = y.storage_and_layout();
        let yr = cuda::input(OP, "y", cuda::storage_of(OP, "y", &yg)?, yl, &stream)?;
        let wg = affine.map(|(w, _)| w.storage_and_layout());
        let w = match &wg {
            Some((s, l)) => {
                let t = cuda::input(OP, "weight", cuda::storage_of(OP, "weight", s)?, l, &stream)?;
                Some(t.reshaped(&[c], &[1]).map_err(candle_core::Error::wrap)?)
            }
            None => None,
        };
        let stats = match self.saved.get() {
            Some(s) if s.len() == 2 => s,
            _ => self.recompute_stats_cuda(&stream, xs, &xr)?,
        };
        let (mg, ml) = stats[0].storage_and_layout();
        let mr = cuda::input(OP, "saved_mean", cuda::storage_of(OP, "saved_mean", &mg)?, ml, &stream)?;
        let (ig, il) = stats[1].storage_and_layout();
        let ir = cuda::input(
            OP,
            "saved_inv_std",
            cuda::storage_of(OP, "saved_inv_std", &ig)?,
            il,
            &stream,
        )?;
        let numel = x.elem_count();
        let mut dx = Output::alloc(OP, &stream, xr.dtype(), numel)?;
        let mut dr = residual
            .then(|| Output::alloc(OP, &stream, xr.dtype(), numel))
            .transpose()?;
        let pdt = w.as_ref().map(|t| t.dtype());
        let mut dwb = match pdt {
            Some(dt) => Some([
                Output::alloc(OP, &stream, dt, dims[1])?,
                Output::alloc(OP, &stream, dt, dims[1])?,
            ]),
            None => None,
        };
        {
            let strides = super::packed_strides(&dims, cl);
            let dxr = dx.view(&stream, &super::idims(&dims), &strides)?;
            let drr = dr
                .as_mut()
                .map(|d| d.view(&stream, &super::idims(&dims), &strides))
                .transpose()?;
            let views = match dwb.as_mut() {
                Some([dw, db]) => Some([dw.view(&stream, &[c], &[1])?, db.view(&stream, &[c], &[1])?]),
                None => None,
            };
            let a = BatchNormBackward {
                x: &xr,
                y: self.options.relu.then_some(&yr),
                dy: &gr,
                dx: Some(&dxr),
                d_residual: drr.as_ref(),
                scale: w.as_ref(),
                saved_mean: &mr,
                saved_inv_std: &ir,
                d_scale: views.as_ref().map(|v| &v[0]),
                d_bias: views.as_ref().map(|v| &v[1]),
            };
            crate::ops::batch_norm_backward(&stream, &a).map_err(candle_core::Error::wrap)?;
        }
        let dev = &xs.device;
        let grad_of = |o: Output| logical(cuda::tensor(o.into_storage(dev.clone()), physical_dims(&dims, cl)), cl);
        let dx = grad_of(dx)?;
        let dr = dr.map(grad_of).transpose()?;
        let params = match (dwb, affine) {
            (Some([dw, db]), Some((w, b))) => Some((
                cuda::tensor(dw.into_storage(dev.clone()), w.shape()),
                cuda::tensor(db.into_storage(dev.clone()), b.shape()),
            )),
            _ => None,
        };
        Ok((dx, dr, params))
    }

    /// The batch statistics `[mean, inv_std]` of `x` for a backward pass whose forward kept
    /// none: the forward kernels once more (no running update), into a scratch output.
    #[cfg(feature = "candle-cuda")]
    fn recompute_stats_cuda(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        xs: &CudaStorage,
        x: &crate::ops::TensorRef,
    ) -> Result<Vec<Tensor>> {
        use crate::candle::cuda::Output;
        use crate::graph::DataType;
        use crate::ops::BatchNormForward;

        let c = x.dims()[1] as usize;
        let mut y = Output::alloc(OP, stream, x.dtype(), x.numel() as usize)?;
        let mut mean = Output::alloc(OP, stream, DataType::F32, c)?;
        let mut inv = Output::alloc(OP, stream, DataType::F32, c)?;
        {
            let yr = y.view(stream, x.dims(), x.strides())?;
            let mr = mean.view(stream, &[c as i64], &[1])?;
            let ir = inv.view(stream, &[c as i64], &[1])?;
            let a = BatchNormForward {
                x,
                residual: None,
                y: &yr,
                scale: None,
                bias: None,
                running: None,
                saved_mean: &mr,
                saved_inv_std: &ir,
            };
            let o = BatchNormOptions {
                relu: false,
                ..self.options
            };
            crate::ops::batch_norm_train_forward(stream, &a, &o).map_err(candle_core::Error::wrap)?;
        }
        let dev = &xs.device;
        Ok(vec![
            cuda::tensor(mean.into_storage(dev.clone()), c),
            cuda::tensor(inv.into_storage(dev.clone()), c),
        ])
    }
}

impl CustomOp1 for BatchNormTrain {
    fn name(&self) -> &'static str {
        "cudnn-batch-norm-train"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        self.cpu_forward(xs, xl, None, None)
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        self.cuda_forward(xs, xl, None, None)
    }

    fn bwd(&self, x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.backward(x, false, None, res, grad)?.0))
    }
}

impl CustomOp3 for BatchNormTrain {
    fn name(&self) -> &'static str {
        "cudnn-batch-norm-train-affine"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu_forward(xs, xl, None, Some([(ws, wl), (bs, bl)]))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.cuda_forward(xs, xl, None, Some([(ws, wl), (bs, bl)]))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, _, params) = self.backward(x, false, Some((w, b)), res, grad)?;
        let (dw, db) = params.unzip();
        Ok((Some(dx), dw, db))
    }
}

/// [`BatchNormTrain`] with a residual added before the optional ReLU: `relu(bn(x) + residual)`
/// in one op, forward and backward (the residual's gradient is the ReLU-masked output
/// gradient), so a residual block's `+ skip` and ReLU are no graph nodes of their own. Inputs:
/// x and the residual (`CustomOp2`), and with affine parameters weight and bias packed into one
/// tensor of 2·C elements, weight first (`CustomOp3`: Candle's custom ops take at most three
/// tensors). Apply with [`batch_norm_add_train`].
#[derive(Clone, Debug)]
pub struct BatchNormAddTrain(BatchNormTrain);

impl BatchNormAddTrain {
    /// The op with these options, updating `running` = (mean, variance) in place when given.
    pub fn new(options: BatchNormOptions, running: Option<(&Var, &Var)>) -> Self {
        Self(BatchNormTrain::new(options, running))
    }
}

/// The weight and bias halves of the packed per-channel parameters (2·C elements).
fn packed_halves(l: &Layout) -> Result<[Layout; 2]> {
    let n = l.shape().elem_count();
    if !l.is_contiguous() || !n.is_multiple_of(2) {
        return Err(arg_err(
            OP,
            "weight_and_bias",
            format!("dims {:?}: needs 2·C contiguous elements (weight, then bias)", l.dims()),
        ));
    }
    let c = n / 2;
    Ok([
        Layout::contiguous_with_offset(c, l.start_offset()),
        Layout::contiguous_with_offset(c, l.start_offset() + c),
    ])
}

impl candle_core::CustomOp2 for BatchNormAddTrain {
    fn name(&self) -> &'static str {
        "cudnn-batch-norm-add-train"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, rs: &CpuStorage, rl: &Layout) -> Result<(CpuStorage, Shape)> {
        self.0.cpu_forward(xs, xl, Some((rs, rl)), None)
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, rs: &CudaStorage, rl: &Layout) -> Result<(CudaStorage, Shape)> {
        self.0.cuda_forward(xs, xl, Some((rs, rl)), None)
    }

    fn bwd(&self, x: &Tensor, _r: &Tensor, res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dr, _) = self.0.backward(x, true, None, res, grad)?;
        Ok((Some(dx), dr))
    }
}

impl CustomOp3 for BatchNormAddTrain {
    fn name(&self) -> &'static str {
        "cudnn-batch-norm-add-train-affine"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        rs: &CpuStorage,
        rl: &Layout,
        ps: &CpuStorage,
        pl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [wl, bl] = packed_halves(pl)?;
        self.0.cpu_forward(xs, xl, Some((rs, rl)), Some([(ps, &wl), (ps, &bl)]))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        rs: &CudaStorage,
        rl: &Layout,
        ps: &CudaStorage,
        pl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let [wl, bl] = packed_halves(pl)?;
        self.0
            .cuda_forward(xs, xl, Some((rs, rl)), Some([(ps, &wl), (ps, &bl)]))
    }

    fn bwd(
        &self,
        x: &Tensor,
        _r: &Tensor,
        params: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let c = params.elem_count() / 2;
        let (w, b) = (params.narrow(0, 0, c)?, params.narrow(0, c, c)?);
        let (dx, dr, dwb) = self.0.backward(x, true, Some((&w, &b)), res, grad)?;
        let dparams = dwb.map(|(dw, db)| Tensor::cat(&[&dw, &db], 0)).transpose()?;
        Ok((Some(dx), dr, dparams))
    }
}

/// Batch norm in training mode with autograd as the [`BatchNormTrain`] op: `x` (N, C,
/// spatial...) normalized with its batch statistics, times `weight` plus `bias` (C elements
/// each) when given, ReLU when `options.relu`; `running` = (mean, variance) updated in place
/// with `options.momentum`. x stored channels-last stays channels-last (the result is its NCHW
/// view); other layouts are copied to row-major once.
pub fn batch_norm_train(
    x: &Tensor,
    weight_and_bias: Option<(&Tensor, &Tensor)>,
    running: Option<(&Var, &Var)>,
    options: &BatchNormOptions,
) -> Result<Tensor> {
    let channels_last = x.rank() >= 3 && is_channels_last(x.layout());
    let x = if channels_last { x.clone() } else { x.contiguous()? };
    let op = BatchNormTrain::new(*options, running);
    let y = match weight_and_bias {
        Some((w, b)) => x.apply_op3(&w.contiguous()?, &b.contiguous()?, op)?,
        None => x.apply_op1(op)?,
    };
    logical(y, channels_last)
}

/// `relu(bn(x) + residual)` (ReLU when `options.relu`) in training mode with autograd as the
/// [`BatchNormAddTrain`] op: [`batch_norm_train`] with the residual (x's dims and dtype) added
/// before the ReLU, forward and backward in the same kernels. The residual is stored like x
/// (one copy when it is not).
pub fn batch_norm_add_train(
    x: &Tensor,
    residual: &Tensor,
    weight_and_bias: Option<(&Tensor, &Tensor)>,
    running: Option<(&Var, &Var)>,
    options: &BatchNormOptions,
) -> Result<Tensor> {
    if residual.dims() != x.dims() {
        return Err(arg_err(
            OP,
            "residual",
            format!("dims {:?} differ from x's {:?}", residual.dims(), x.dims()),
        ));
    }
    let channels_last = x.rank() >= 3 && is_channels_last(x.layout());
    let x = if channels_last { x.clone() } else { x.contiguous()? };
    let residual = if x.rank() >= 3 {
        in_format(residual, channels_last)?
    } else {
        residual.contiguous()?
    };
    let op = BatchNormAddTrain::new(*options, running);
    let y = match weight_and_bias {
        Some((w, b)) => {
            let params = Tensor::cat(&[&w.flatten_all()?, &b.flatten_all()?], 0)?;
            x.apply_op3(&residual, &params, op)?
        }
        None => x.apply_op2(&residual, op)?,
    };
    logical(y, channels_last)
}

/// The logical values of `t` as float64 (CPU tensors).
fn f64s(t: &Tensor) -> Result<Vec<f64>> {
    t.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// `running = (1 - momentum) · running + momentum · batch` on a CPU variable.
fn update_running(var: &Var, batch: &[f64], momentum: f64) -> Result<()> {
    let new: Vec<f64> = f64s(var.as_tensor())?
        .iter()
        .zip(batch)
        .map(|(r, b)| (1.0 - momentum) * r + momentum * b)
        .collect();
    var.set(&Tensor::from_vec(new, var.shape(), &Device::Cpu)?.to_dtype(var.dtype())?)
}
