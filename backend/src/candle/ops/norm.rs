//! Layer and RMS norm over the last dim on Candle tensors. On CUDA the inference op is one
//! cuDNN norm graph; the training op runs the engine's norm kernel, which also writes the row
//! statistics, and its backward pass is the engine's norm backward from them (`dx`, `dweight`
//! and `dbias` from one call). On the CPU both are float64 references.

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use super::same_dtype;
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::saved::Saved;
use crate::candle::{arg_err, cpu};
use crate::graph::NormMode;

/// Layer or RMS norm over the last dim of `x` (inputs x, weight[, bias]; weight and bias hold
/// the last dim's size, in x's dtype). Apply with [`norm`].
///
/// [`Norm::training`] keeps the row statistics of its forward pass for the backward pass;
/// [`Norm::new`] runs cuDNN's inference graph and, should a backward pass run, recomputes them
/// first (one more launch).
#[derive(Clone, Debug)]
pub struct Norm {
    /// Layer norm (centred) or RMS norm.
    pub mode: NormMode,
    /// Added to the variance (mean square) before the square root.
    pub eps: f64,
    training: bool,
    saved: Saved,
}

/// Gradients of a norm: `dx`, `dweight` and, with a bias, `dbias`.
type Grads = (Tensor, Tensor, Option<Tensor>);

impl Norm {
    /// The inference op.
    pub fn new(mode: NormMode, eps: f64) -> Self {
        Self {
            mode,
            eps,
            training: false,
            saved: Saved::default(),
        }
    }

    /// The training op: the forward pass also writes the row means (layer norm) and inverse
    /// standard deviations (f32 on CUDA) that its backward pass reads.
    pub fn training(mode: NormMode, eps: f64) -> Self {
        Self {
            training: true,
            ..Self::new(mode, eps)
        }
    }

    fn op_name(&self) -> &'static str {
        match self.mode {
            NormMode::LayerNorm => "candle layer_norm",
            NormMode::RmsNorm => "candle rms_norm",
        }
    }

    fn centred(&self) -> bool {
        self.mode == NormMode::LayerNorm
    }

    /// (rows, features) of `x`, after checking the parameters' sizes.
    fn rows(&self, x: &[usize], params: &[(&'static str, &[usize])]) -> Result<(usize, usize)> {
        let op = self.op_name();
        let d = *x.last().ok_or_else(|| arg_err(op, "x", "needs rank >= 1"))?;
        for &(name, p) in params {
            if p.iter().product::<usize>() != d {
                return Err(arg_err(
                    op,
                    name,
                    format!("dims {p:?}: need {d} elements (x's last dim)"),
                ));
            }
        }
        Ok((x.iter().product::<usize>() / d.max(1), d))
    }

    fn cpu(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bias: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.op_name();
        let mut params = vec![("weight", wl.dims())];
        params.extend(bias.map(|(_, l)| ("bias", l.dims())));
        let (rows, d) = self.rows(xl.dims(), &params)?;
        if rows * d == 0 {
            return Ok((cpu::write(op, &[], xs.dtype())?, xl.shape().clone()));
        }
        let x = cpu::read(op, "x", xs, xl)?;
        let w = cpu::read(op, "weight", ws, wl)?;
        let b = bias.map(|(s, l)| cpu::read(op, "bias", s, l)).transpose()?;
        let (y, means, invs) = cudnn_backend_reference::norm(&x, d, &w, b.as_deref(), self.centred(), self.eps);
        if self.training {
            self.saved.keep(vec![
                Tensor::from_vec(invs, rows, &Device::Cpu)?,
                Tensor::from_vec(means, rows, &Device::Cpu)?,
            ]);
        }
        Ok((cpu::write(op, &y, xs.dtype())?, xl.shape().clone()))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
        bias: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        use crate::candle::cuda::Output;
        use crate::graph::DataType;

        let op = self.op_name();
        let mut params = vec![("weight", wl.dims())];
        params.extend(bias.map(|(_, l)| ("bias", l.dims())));
        let (rows, d) = self.rows(xl.dims(), &params)?;
        if !xl.is_contiguous() {
            return Err(arg_err(op, "x", "needs a contiguous tensor (norm() makes one)"));
        }
        let stream = cuda::stream(xs);
        let x = cuda::input(op, "x", xs, xl, &stream)?;
        let w = cuda::input(op, "weight", ws, wl, &stream)?;
        let b = bias.map(|(s, l)| cuda::input(op, "bias", s, l, &stream)).transpose()?;
        let (r, f) = (rows as i64, d as i64);
        let x2 = x.reshaped(&[r, f], &[f, 1]).map_err(candle_core::Error::wrap)?;
        let w1 = w.reshaped(&[f], &[1]).map_err(candle_core::Error::wrap)?;
        let b1 = b
            .as_ref()
            .map(|t| t.reshaped(&[f], &[1]))
            .transpose()
            .map_err(candle_core::Error::wrap)?;
        if rows * d == 0 {
            let out = cuda::with_output(op, &xs.device, &stream, x.dtype(), x2.dims(), x2.strides(), |_| Ok(()))?;
            return Ok((out, xl.shape().clone()));
        }
        if !self.training {
            let out = cuda::with_output(op, &xs.device, &stream, x.dtype(), x2.dims(), x2.strides(), |y| {
                crate::ops::norm_forward(&stream, self.mode, &x2, &w1, b1.as_ref(), y, self.eps, None)
            })?;
            return Ok((out, xl.shape().clone()));
        }
        let mut y = Output::alloc(op, &stream, x.dtype(), rows * d)?;
        let mut inv = Output::alloc(op, &stream, DataType::F32, rows)?;
        let mut mean = self
            .centred()
            .then(|| Output::alloc(op, &stream, DataType::F32, rows))
            .transpose()?;
        {
            let yr = y.view(&stream, &[r, f], &[f, 1])?;
            let ir = inv.view(&stream, &[r], &[1])?;
            let m = mean.as_mut().map(|m| m.view(&stream, &[r], &[1])).transpose()?;
            crate::ops::norm_train_forward(
                &stream,
                self.mode,
                &x2,
                Some(&w1),
                b1.as_ref(),
                &yr,
                self.eps,
                m.as_ref(),
                &ir,
            )
            .map_err(candle_core::Error::wrap)?;
        }
        let dev = &xs.device;
        let mut kept = vec![cuda::tensor(inv.into_storage(dev.clone()), rows)];
        kept.extend(mean.map(|m| cuda::tensor(m.into_storage(dev.clone()), rows)));
        self.saved.keep(kept);
        Ok((y.into_storage(dev.clone()), xl.shape().clone()))
    }

    /// The backward pass: the engine's norm backward on CUDA, the float64 reference on the
    /// CPU, from the saved row statistics (recomputed when this op value kept none).
    fn backward(&self, x: &Tensor, w: &Tensor, with_bias: bool, grad: &Tensor) -> Result<Grads> {
        let g = grad.contiguous()?;
        if x.elem_count() == 0 {
            let db = with_bias.then(|| w.zeros_like()).transpose()?;
            return Ok((x.zeros_like()?, w.zeros_like()?, db));
        }
        match x.device() {
            Device::Cpu => self.backward_cpu(x, w, with_bias, &g),
            #[cfg(feature = "candle-cuda")]
            Device::Cuda(_) => self.backward_cuda(x, w, with_bias, &g),
            other => Err(arg_err(
                self.op_name(),
                "x",
                format!("device {:?} is not supported", other.location()),
            )),
        }
    }

    fn backward_cpu(&self, x: &Tensor, w: &Tensor, with_bias: bool, g: &Tensor) -> Result<Grads> {
        let d = w.elem_count();
        let (xv, gv, wv) = (f64s(x)?, f64s(g)?, f64s(w)?);
        let (means, invs) = match self.saved.get() {
            Some(s) if s.len() == 2 => (f64s(&s[1])?, f64s(&s[0])?),
            _ => {
                let (_, m, i) = cudnn_backend_reference::norm(&xv, d, &wv, None, self.centred(), self.eps);
                (m, i)
            }
        };
        let (dx, dw, db) = cudnn_backend_reference::norm_backward(&xv, &gv, d, &wv, self.centred(), &means, &invs);
        let back = |v: Vec<f64>, like: &Tensor| Tensor::from_vec(v, like.shape(), &Device::Cpu)?.to_dtype(like.dtype());
        let db = with_bias.then(|| back(db, w)).transpose()?;
        Ok((back(dx, x)?, back(dw, w)?, db))
    }

    #[cfg(feature = "candle-cuda")]
    fn backward_cuda(&self, x: &Tensor, w: &Tensor, with_bias: bool, g: &Tensor) -> Result<Grads> {
        use crate::candle::cuda::Output;
        use crate::ops::NormBackward;

        let op = self.op_name();
        let d = w.elem_count();
        let rows = x.elem_count() / d;
        let (r, f) = (rows as i64, d as i64);
        if !x.is_contiguous() {
            return Err(arg_err(op, "x", "needs a contiguous tensor (norm() makes one)"));
        }
        let (xg, xl) = x.storage_and_layout();
        let xs = cuda::storage_of(op, "x", &xg)?;
        let stream = cuda::stream(xs);
        let xr = cuda::input(op, "x", xs, xl, &stream)?;
        let (gg, gl) = g.storage_and_layout();
        let gr = cuda::input(op, "grad", cuda::storage_of(op, "grad", &gg)?, gl, &stream)?;
        let (wg, wl) = w.storage_and_layout();
        let wr = cuda::input(op, "weight", cuda::storage_of(op, "weight", &wg)?, wl, &stream)?;
        let x2 = xr.reshaped(&[r, f], &[f, 1]).map_err(candle_core::Error::wrap)?;
        let g2 = gr.reshaped(&[r, f], &[f, 1]).map_err(candle_core::Error::wrap)?;
        let w1 = wr.reshaped(&[f], &[1]).map_err(candle_core::Error::wrap)?;
        let stats = match self.saved.get() {
            Some(s) if s.len() == 1 + self.centred() as usize => s,
            _ => self.recompute_stats_cuda(&stream, xs, &x2, &w1)?,
        };
        let (ig, il) = stats[0].storage_and_layout();
        let ir = cuda::input(op, "inv_std", cuda::storage_of(op, "inv_std", &ig)?, il, &stream)?;
        let mean_guard = stats.get(1).map(|m| m.storage_and_layout());
        let mean = match &mean_guard {
            Some((mg, ml)) => Some(cuda::input(op, "mean", cuda::storage_of(op, "mean", mg)?, ml, &stream)?),
            None => None,
        };
        let mut dx = Output::alloc(op, &stream, xr.dtype(), rows * d)?;
        let mut dw = Output::alloc(op, &stream, wr.dtype(), d)?;
        let mut db = with_bias
            .then(|| Output::alloc(op, &stream, wr.dtype(), d))
            .transpose()?;
        {
            let dxr = dx.view(&stream, &[r, f], &[f, 1])?;
            let dwr = dw.view(&stream, &[f], &[1])?;
            let dbr = db.as_mut().map(|b| b.view(&stream, &[f], &[1])).transpose()?;
            let args = NormBackward {
                x: &x2,
                dy: &g2,
                scale: Some(&w1),
                mean: mean.as_ref(),
                inv_std: &ir,
                dx: Some(&dxr),
                d_scale: Some(&dwr),
                d_bias: dbr.as_ref(),
            };
            crate::ops::norm_backward(&stream, self.mode, &args).map_err(candle_core::Error::wrap)?;
        }
        let dev = &xs.device;
        let db = db.map(|b| cuda::tensor(b.into_storage(dev.clone()), w.shape()));
        let dw = cuda::tensor(dw.into_storage(dev.clone()), w.shape());
        Ok((cuda::tensor(dx.into_storage(dev.clone()), x.shape()), dw, db))
    }

    /// Row statistics `[inv_std, mean?]` of `x` for a backward pass whose forward kept none:
    /// the training kernel once more, into a scratch output.
    #[cfg(feature = "candle-cuda")]
    fn recompute_stats_cuda(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        xs: &CudaStorage,
        x2: &crate::ops::TensorRef,
        w1: &crate::ops::TensorRef,
    ) -> Result<Vec<Tensor>> {
        use crate::candle::cuda::Output;
        use crate::graph::DataType;

        let op = self.op_name();
        let (r, f) = (x2.dims()[0], x2.dims()[1]);
        let mut y = Output::alloc(op, stream, x2.dtype(), (r * f) as usize)?;
        let mut inv = Output::alloc(op, stream, DataType::F32, r as usize)?;
        let mut mean = self
            .centred()
            .then(|| Output::alloc(op, stream, DataType::F32, r as usize))
            .transpose()?;
        {
            let yr = y.view(stream, &[r, f], &[f, 1])?;
            let ir = inv.view(stream, &[r], &[1])?;
            let m = mean.as_mut().map(|m| m.view(stream, &[r], &[1])).transpose()?;
            crate::ops::norm_train_forward(stream, self.mode, x2, Some(w1), None, &yr, self.eps, m.as_ref(), &ir)
                .map_err(candle_core::Error::wrap)?;
        }
        let dev = &xs.device;
        let mut out = vec![cuda::tensor(inv.into_storage(dev.clone()), r as usize)];
        out.extend(mean.map(|m| cuda::tensor(m.into_storage(dev.clone()), r as usize)));
        Ok(out)
    }
}

/// The logical values of `t` as float64 (CPU tensors).
fn f64s(t: &Tensor) -> Result<Vec<f64>> {
    t.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

impl CustomOp2 for Norm {
    fn name(&self) -> &'static str {
        "cudnn-norm"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        same_dtype(self.op_name(), &[("x", xs.dtype()), ("weight", ws.dtype())])?;
        self.cpu(xs, xl, ws, wl, None)
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        same_dtype(self.op_name(), &[("x", xs.dtype()), ("weight", ws.dtype())])?;
        self.cuda(xs, xl, ws, wl, None)
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.backward(x, w, false, grad)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for Norm {
    fn name(&self) -> &'static str {
        "cudnn-norm-bias"
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
        same_dtype(
            self.op_name(),
            &[("x", xs.dtype()), ("weight", ws.dtype()), ("bias", bs.dtype())],
        )?;
        self.cpu(xs, xl, ws, wl, Some((bs, bl)))
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
        same_dtype(
            self.op_name(),
            &[("x", xs.dtype()), ("weight", ws.dtype()), ("bias", bs.dtype())],
        )?;
        self.cuda(xs, xl, ws, wl, Some((bs, bl)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = self.backward(x, w, true, grad)?;
        Ok((Some(dx), Some(dw), db))
    }
}

/// Layer or RMS norm of `x` over its last dim with autograd: on CUDA (f32, f16, bf16) one
/// cuDNN norm graph, or, when a gradient can be needed (an input is a variable or depends on
/// one), the engine's training kernel keeping the row statistics for the fused backward; the
/// float64 reference on the CPU. `weight`/`bias`: the last dim's size, x's dtype.
pub fn norm(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, mode: NormMode, eps: f64) -> Result<Tensor> {
    let tracked = x.track_op() || weight.track_op() || bias.is_some_and(|b| b.track_op());
    let op = if tracked {
        Norm::training(mode, eps)
    } else {
        Norm::new(mode, eps)
    };
    let (x, weight) = (x.contiguous()?, weight.contiguous()?);
    match bias {
        Some(b) => x.apply_op3(&weight, &b.contiguous()?, op),
        None => x.apply_op2(&weight, op),
    }
}
