//! Layer / RMS norm and scaled dot-product attention as cuDNN graphs on Candle tensors, with
//! float64 CPU references and backward passes composed of Candle ops (f32 math).

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use super::same_dtype;
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::{arg_err, cpu};
use crate::graph::NormMode;

/// Layer or RMS norm over the last dim of `x` (inputs x, weight[, bias]; weight and bias hold
/// the last dim's size). Apply with [`norm`].
#[derive(Clone, Debug)]
pub struct Norm {
    /// Layer norm (centred) or RMS norm.
    pub mode: NormMode,
    /// Added to the variance (mean square) before the square root.
    pub eps: f64,
}

impl Norm {
    fn op_name(&self) -> &'static str {
        match self.mode {
            NormMode::LayerNorm => "candle layer_norm",
            NormMode::RmsNorm => "candle rms_norm",
        }
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
        let (_, d) = self.rows(xl.dims(), &params)?;
        let x = cpu::read(op, "x", xs, xl)?;
        let w = cpu::read(op, "weight", ws, wl)?;
        let b = bias.map(|(s, l)| cpu::read(op, "bias", s, l)).transpose()?;
        let centred = self.mode == NormMode::LayerNorm;
        let (y, _, _) = crate::reference::norm(&x, d, &w, b.as_deref(), centred, self.eps);
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
        let op = self.op_name();
        let mut params = vec![("weight", wl.dims())];
        params.extend(bias.map(|(_, l)| ("bias", l.dims())));
        let (rows, d) = self.rows(xl.dims(), &params)?;
        if !xl.is_contiguous() {
            return Err(arg_err(op, "x", "needs a contiguous tensor (norm() makes one)"));
        }
        let stream = cuda::stream(xs);
        let (x, _gx) = cuda::input(op, "x", xs, xl, &stream)?;
        let (w, _gw) = cuda::input(op, "weight", ws, wl, &stream)?;
        let b = bias.map(|(s, l)| cuda::input(op, "bias", s, l, &stream)).transpose()?;
        let x2 = crate::ops::TensorRef::new(&[rows as i64, d as i64], &[d as i64, 1], x.dtype, x.ptr);
        let flat = |t: &crate::ops::TensorRef| crate::ops::TensorRef::new(&[d as i64], &[1], t.dtype, t.ptr);
        let (w1, b1) = (flat(&w), b.as_ref().map(|(t, _)| flat(t)));
        let out = cuda::with_output(op, &xs.device, &stream, x.dtype, &x2.dims, &x2.strides, |y| {
            crate::ops::norm_forward(&stream, self.mode, &x2, &w1, b1.as_ref(), y, self.eps, None)
        })?;
        Ok((out, xl.shape().clone()))
    }

    /// Gradients (dx, dweight, dbias) of the norm for output gradient `g`, in f32.
    fn grads(&self, x: &Tensor, w: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let acc = if x.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let d = x.dim(D::Minus1)?;
        let rows = x.elem_count() / d.max(1);
        let xf = x.to_dtype(acc)?.reshape((rows, d))?;
        let gf = g.to_dtype(acc)?.reshape((rows, d))?;
        let wf = w.to_dtype(acc)?.reshape((1, d))?;
        let centred = match self.mode {
            NormMode::LayerNorm => xf.broadcast_sub(&xf.mean_keepdim(1)?)?,
            NormMode::RmsNorm => xf,
        };
        let inv = (centred.sqr()?.mean_keepdim(1)? + self.eps)?.sqrt()?.recip()?;
        let xhat = centred.broadcast_mul(&inv)?;
        let dxhat = gf.broadcast_mul(&wf)?;
        let proj = (&dxhat * &xhat)?.mean_keepdim(1)?;
        let mut inner = (&dxhat - xhat.broadcast_mul(&proj)?)?;
        if self.mode == NormMode::LayerNorm {
            inner = inner.broadcast_sub(&dxhat.mean_keepdim(1)?)?;
        }
        let dx = inner.broadcast_mul(&inv)?.reshape(x.shape())?.to_dtype(x.dtype())?;
        let dw = (&gf * &xhat)?.sum(0)?.reshape(w.shape())?.to_dtype(w.dtype())?;
        let db = gf.sum(0)?.reshape(w.shape())?.to_dtype(w.dtype())?;
        Ok((dx, dw, db))
    }
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
        let (dx, dw, _) = self.grads(x, w, grad)?;
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
        let (dx, dw, db) = self.grads(x, w, grad)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// Layer or RMS norm of `x` over its last dim with autograd: one cuDNN norm graph on CUDA
/// (f32, f16, bf16), the float64 reference on the CPU. `weight`/`bias`: the last dim's size.
pub fn norm(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, mode: NormMode, eps: f64) -> Result<Tensor> {
    let op = Norm { mode, eps };
    let x = x.contiguous()?;
    match bias {
        Some(b) => x.apply_op3(weight, b, op),
        None => x.apply_op2(weight, op),
    }
}

/// Scaled dot-product attention `softmax(q·kᵀ·scale)·v` over (B, H, L, D) tensors (inputs q,
/// k, v). Apply with [`sdpa`]; on CUDA it is one fused cuDNN graph (f16/bf16, head dims
/// multiples of 8 up to 256).
#[derive(Clone, Debug)]
pub struct Sdpa {
    /// Multiplies the scores before the softmax.
    pub scale: f64,
    /// Query `i` sees keys `j <= i + Lk - Lq` only (bottom-right causal mask; needs Lq <= Lk).
    pub causal: bool,
}

/// The causal mask as an additive (lq, lk) bias of 0 / -inf in `dtype` on `device`.
pub(crate) fn causal_bias(lq: usize, lk: usize, dtype: DType, device: &candle_core::Device) -> Result<Tensor> {
    let v: Vec<f32> = (0..lq * lk)
        .map(|e| {
            if crate::reference::causal_masked(e / lk, e % lk, lq, lk) {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(v, (lq, lk), device)?.to_dtype(dtype)
}

const SDPA: &str = "candle sdpa";

/// (B, H, Lq, Lk, D, Dv) after checking the shapes.
fn sdpa_dims(q: &[usize], k: &[usize], v: &[usize]) -> Result<[usize; 6]> {
    if q.len() != 4 || k.len() != 4 || v.len() != 4 {
        return Err(arg_err(
            SDPA,
            "q",
            format!("q {q:?}, k {k:?}, v {v:?} must be (B, H, L, D)"),
        ));
    }
    let [b, h, lq, d] = [q[0], q[1], q[2], q[3]];
    let lk = k[2];
    if k != [b, h, lk, d] || v[..3] != [b, h, lk] {
        return Err(arg_err(
            SDPA,
            "k",
            format!("q {q:?}, k {k:?} and v {v:?} disagree (need k (B, H, Lk, D), v (B, H, Lk, Dv))"),
        ));
    }
    Ok([b, h, lq, lk, d, v[3]])
}

impl CustomOp3 for Sdpa {
    fn name(&self) -> &'static str {
        "cudnn-sdpa"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        same_dtype(SDPA, &[("q", qs.dtype()), ("k", ks.dtype()), ("v", vs.dtype())])?;
        let [b, h, lq, lk, d, dv] = sdpa_dims(ql.dims(), kl.dims(), vl.dims())?;
        self.check_causal(lq, lk)?;
        let (q, k, v) = (
            cpu::read(SDPA, "q", qs, ql)?,
            cpu::read(SDPA, "k", ks, kl)?,
            cpu::read(SDPA, "v", vs, vl)?,
        );
        let mask = |_: usize, i: usize, j: usize| {
            if crate::reference::causal_masked(i, j, lq, lk) {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        };
        let bias = self.causal.then_some(&mask as &dyn Fn(usize, usize, usize) -> f64);
        let (out, _) = crate::reference::attention(&q, &k, &v, [b * h, lq, lk, d, dv], self.scale, bias);
        Ok((cpu::write(SDPA, &out, qs.dtype())?, Shape::from(vec![b, h, lq, dv])))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        qs: &CudaStorage,
        ql: &Layout,
        ks: &CudaStorage,
        kl: &Layout,
        vs: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        same_dtype(SDPA, &[("q", qs.dtype()), ("k", ks.dtype()), ("v", vs.dtype())])?;
        let [b, h, lq, lk, _, dv] = sdpa_dims(ql.dims(), kl.dims(), vl.dims())?;
        self.check_causal(lq, lk)?;
        let stream = cuda::stream(qs);
        let (q, _gq) = cuda::input(SDPA, "q", qs, ql, &stream)?;
        let (k, _gk) = cuda::input(SDPA, "k", ks, kl, &stream)?;
        let (v, _gv) = cuda::input(SDPA, "v", vs, vl, &stream)?;
        let dims = [b as i64, h as i64, lq as i64, dv as i64];
        let strides = super::packed_strides(&[b, h, lq, dv], false);
        let out = cuda::with_output(SDPA, &qs.device, &stream, q.dtype, &dims, &strides, |o| {
            crate::ops::sdpa_forward(&stream, &q, &k, &v, None, self.causal, o, self.scale as f32, None)
        })?;
        Ok((out, Shape::from(vec![b, h, lq, dv])))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let acc = if q.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let (qf, kf, vf, g) = (
            q.to_dtype(acc)?,
            k.to_dtype(acc)?,
            v.to_dtype(acc)?,
            grad.to_dtype(acc)?,
        );
        let mut s = (qf.matmul(&kf.t()?)? * self.scale)?;
        if self.causal {
            let (lq, lk) = (q.dims()[2], k.dims()[2]);
            s = s.broadcast_add(&causal_bias(lq, lk, acc, q.device())?)?;
        }
        let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let dv = p.t()?.matmul(&g)?;
        let dp = g.matmul(&vf.t()?)?;
        let ds = (&p * dp.broadcast_sub(&(&dp * &p)?.sum_keepdim(D::Minus1)?)?)?;
        let dq = (ds.matmul(&kf)? * self.scale)?;
        let dk = (ds.t()?.matmul(&qf)? * self.scale)?;
        Ok((
            Some(dq.to_dtype(q.dtype())?),
            Some(dk.to_dtype(k.dtype())?),
            Some(dv.to_dtype(v.dtype())?),
        ))
    }
}

impl Sdpa {
    fn check_causal(&self, lq: usize, lk: usize) -> Result<()> {
        if self.causal {
            check_causal(lq, lk)?;
        }
        Ok(())
    }
}

/// A causal mask with more queries than keys would leave rows with no key to see.
pub(crate) fn check_causal(lq: usize, lk: usize) -> Result<()> {
    if lq > lk {
        let msg = format!("a causal mask needs no more queries ({lq}) than keys ({lk})");
        return Err(arg_err(SDPA, "q", msg));
    }
    Ok(())
}

/// True when cuDNN's fused attention takes these tensors: on CUDA, rank 4, one dtype, and
/// sizes [`crate::ops::sdpa_fusable`] accepts.
pub(crate) fn sdpa_fusable(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    // The engines take f16/bf16 only; other dtypes need no mapping.
    let dtype = match q.dtype() {
        DType::F16 => crate::graph::DataType::F16,
        DType::BF16 => crate::graph::DataType::BF16,
        _ => return false,
    };
    q.device().is_cuda()
        && [q, k, v].iter().all(|t| t.rank() == 4 && t.dtype() == q.dtype())
        && crate::ops::sdpa_fusable(dtype, q.dims()[3] as i64, v.dims()[3] as i64, k.dims()[2] as i64)
}

/// `softmax(q·kᵀ·scale)·v` with autograd as the [`Sdpa`] op (inputs made contiguous);
/// `causal` masks as [`Sdpa::causal`] says.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, Sdpa { scale, causal })
}
