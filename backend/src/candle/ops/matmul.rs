//! Batched matrix products, plain and with fused bias + activation.

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::act::{acc_dtype, act_backward, grad_from_output};
use super::conv::ref_act;
use super::same_dtype;
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::{arg_err, cpu};
use crate::ops::Activation;
use cudnn_backend_reference as reference;

/// Validates `a [.., M, K] · b [.., K, N]` (same rank; batch dims equal or 1) and returns
/// the output dims (broadcast batch, M, N).
pub(crate) fn mm_out_dims(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let r = a.len();
    if r < 2 || b.len() != r {
        return Err(arg_err(op, "a", format!("a {a:?} and b {b:?} need one rank >= 2")));
    }
    if a[r - 1] != b[r - 2] {
        return Err(arg_err(op, "b", format!("inner dims differ: a {a:?}, b {b:?}")));
    }
    let mut out = Vec::with_capacity(r);
    for i in 0..r - 2 {
        if a[i] != b[i] && a[i] != 1 && b[i] != 1 {
            return Err(arg_err(
                op,
                "b",
                format!("batch dims of a {a:?} and b {b:?} do not broadcast"),
            ));
        }
        out.push(if a[i] == 1 { b[i] } else { a[i] });
    }
    out.extend([a[r - 2], b[r - 1]]);
    Ok(out)
}

/// True when cuDNN can read the layout through its strides: the matrix is row- or
/// column-major (possibly with a leading-dimension gap), batch dims may be broadcast.
fn mm_layout_ok(l: &Layout) -> bool {
    let (d, s) = (l.dims(), l.stride());
    let r = d.len();
    if r < 2 {
        return false;
    }
    let (m, k, sm, sk) = (d[r - 2], d[r - 1], s[r - 2], s[r - 1]);
    let row = (sk == 1 || k == 1) && (sm >= k || m == 1);
    let col = (sm == 1 || m == 1) && (sk >= m || k == 1);
    row || col
}

fn mm_input(t: &Tensor) -> Result<Tensor> {
    if mm_layout_ok(t.layout()) {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

/// Sums `t` over the batch dims that `dims` broadcast (size 1 in `dims`).
fn reduce_to(t: Tensor, dims: &[usize]) -> Result<Tensor> {
    let mut t = t;
    for (i, &d) in dims.iter().enumerate().take(dims.len().saturating_sub(2)) {
        if d == 1 && t.dims()[i] != 1 {
            t = t.sum_keepdim(i)?;
        }
    }
    Ok(t)
}

#[cfg(feature = "candle-cuda")]
fn broadcast_batch(t: crate::ops::TensorRef) -> crate::Result<crate::ops::TensorRef> {
    let r = t.dims().len();
    let dims: Vec<i64> = (t.dims().iter().zip(t.strides()).enumerate())
        .map(|(i, (&d, &s))| if i + 2 < r && s == 0 { 1 } else { d })
        .collect();
    t.reshaped(&dims, t.strides())
}

/// `c = a · b` (batched, broadcast batch dims). Inputs: a, b.
#[derive(Clone, Copy, Debug, Default)]
pub struct Matmul;

impl CustomOp2 for Matmul {
    fn name(&self) -> &'static str {
        "cudnn-matmul"
    }

    fn cpu_fwd(&self, as_: &CpuStorage, al: &Layout, bs: &CpuStorage, bl: &Layout) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle matmul";
        let c = mm_out_dims(OP, al.dims(), bl.dims())?;
        same_dtype(OP, &[("a", as_.dtype()), ("b", bs.dtype())])?;
        let (a, b) = (cpu::read(OP, "a", as_, al)?, cpu::read(OP, "b", bs, bl)?);
        let (out, _) = reference::matmul(&a, al.dims(), &b, bl.dims());
        Ok((cpu::write(OP, &out, as_.dtype())?, c.into()))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, as_: &CudaStorage, al: &Layout, bs: &CudaStorage, bl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle matmul";
        let c = mm_out_dims(OP, al.dims(), bl.dims())?;
        same_dtype(OP, &[("a", as_.dtype()), ("b", bs.dtype())])?;
        let stream = cuda::stream(as_);
        let a = cuda::input(OP, "a", as_, al, &stream)?;
        let b = cuda::input(OP, "b", bs, bl, &stream)?;
        let (a, b) = (
            broadcast_batch(a).map_err(candle_core::Error::wrap)?,
            broadcast_batch(b).map_err(candle_core::Error::wrap)?,
        );
        let strides = super::packed_strides(&c, false);
        let out = cuda::with_output(OP, &as_.device, &stream, a.dtype(), &super::idims(&c), &strides, |cr| {
            crate::ops::matmul(&stream, &a, &b, cr)
        })?;
        Ok((out, c.into()))
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let da = reduce_to(matmul(grad, &b.t()?)?, a.dims())?;
        let db = reduce_to(matmul(&a.t()?, grad)?, b.dims())?;
        Ok((Some(da), Some(db)))
    }
}

/// `c = act(a · b + bias)` as one fused cuDNN graph. Inputs: a, b, bias (N elements).
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulBiasAct {
    /// Activation after the bias.
    pub act: Activation,
}

fn check_bias(op: &'static str, bias: &[usize], n: usize) -> Result<()> {
    if bias.iter().product::<usize>() != n || bias.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(arg_err(op, "bias", format!("needs {n} elements, got dims {bias:?}")));
    }
    Ok(())
}

impl CustomOp3 for MatmulBiasAct {
    fn name(&self) -> &'static str {
        "cudnn-matmul-bias-act"
    }

    fn cpu_fwd(
        &self,
        as_: &CpuStorage,
        al: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
        cs: &CpuStorage,
        cl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle matmul_bias_act";
        let c = mm_out_dims(OP, al.dims(), bl.dims())?;
        check_bias(OP, cl.dims(), c[c.len() - 1])?;
        same_dtype(OP, &[("a", as_.dtype()), ("b", bs.dtype()), ("bias", cs.dtype())])?;
        let (a, b) = (cpu::read(OP, "a", as_, al)?, cpu::read(OP, "b", bs, bl)?);
        let bias = cpu::read(OP, "bias", cs, cl)?;
        let (mut out, _) = reference::matmul(&a, al.dims(), &b, bl.dims());
        if !out.is_empty() {
            reference::bias_activation(&mut out, &c, c.len() - 1, &bias, ref_act(self.act));
        }
        Ok((cpu::write(OP, &out, as_.dtype())?, c.into()))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        as_: &CudaStorage,
        al: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
        cs: &CudaStorage,
        cl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle matmul_bias_act";
        let c = mm_out_dims(OP, al.dims(), bl.dims())?;
        check_bias(OP, cl.dims(), c[c.len() - 1])?;
        same_dtype(OP, &[("a", as_.dtype()), ("b", bs.dtype()), ("bias", cs.dtype())])?;
        let stream = cuda::stream(as_);
        let a = cuda::input(OP, "a", as_, al, &stream)?;
        let b = cuda::input(OP, "b", bs, bl, &stream)?;
        let bias = cuda::input(OP, "bias", cs, cl, &stream)?;
        let (a, b) = (
            broadcast_batch(a).map_err(candle_core::Error::wrap)?,
            broadcast_batch(b).map_err(candle_core::Error::wrap)?,
        );
        let strides = super::packed_strides(&c, false);
        let out = cuda::with_output(OP, &as_.device, &stream, a.dtype(), &super::idims(&c), &strides, |cr| {
            crate::ops::matmul_bias_act(&stream, &a, &b, Some(&bias), cr, self.act)
        })?;
        Ok((out, c.into()))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let n = bias.elem_count();
        let z = if grad_from_output(self.act, res.dtype()) {
            None
        } else {
            // The pre-activation again, bias fused into the product.
            Some(matmul_bias_act(a, b, bias, Activation::Identity)?)
        };
        let dz = act_backward(self.act, res, z.as_ref(), grad)?;
        let dbias = column_sums(&dz.reshape(((), n))?)?
            .to_dtype(bias.dtype())?
            .reshape(bias.shape())?;
        let da = reduce_to(matmul(&dz, &b.t()?)?, a.dims())?;
        let db = reduce_to(matmul(&a.t()?, &dz)?, b.dims())?;
        Ok((Some(da), Some(db), Some(dbias)))
    }
}

/// The sums of the columns of a 2-D `x` (`[N]`, x's dtype, accumulated in f32 or f64): on
/// CUDA one engine column reduction, elsewhere Candle ops.
fn column_sums(x: &Tensor) -> Result<Tensor> {
    if cfg!(feature = "candle-cuda")
        && super::fused_grads()
        && x.device().is_cuda()
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
    {
        return x.apply_op1_no_bwd(&ColumnSums)?.squeeze(0);
    }
    x.to_dtype(acc_dtype(x.dtype()))?.sum(0)?.to_dtype(x.dtype())
}

/// `[M, N]` to its column sums `[1, N]` (the engine's reduction over axis 0).
#[derive(Clone, Copy, Debug)]
struct ColumnSums;

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "cudnn-column-sums"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(arg_err(
            "candle column sums",
            "x",
            "runs on CUDA tensors (the CPU sums with Candle ops)",
        ))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle column sums";
        let &[_, n] = xl.dims() else {
            return Err(arg_err(OP, "x", "needs a 2-D tensor"));
        };
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let out = cuda::with_output(
            OP,
            &xs.device,
            &stream,
            x.dtype(),
            &[1, n as i64],
            &[n as i64, 1],
            |out| crate::ops::reduce::reduce(&stream, crate::ops::reduce::ReduceOp::Sum, &x, 0, out),
        )?;
        Ok((out, (1, n).into()))
    }
}

/// Brings `a` and `b` to one rank by adding leading size-1 dims.
fn same_rank(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let up = |t: &Tensor, r: usize| -> Result<Tensor> {
        let mut t = t.clone();
        while t.rank() < r {
            t = t.unsqueeze(0)?;
        }
        Ok(t)
    };
    let r = a.rank().max(b.rank());
    Ok((up(a, r)?, up(b, r)?))
}

/// `a · b` with autograd: ranks >= 2, batch dims broadcast (a missing or size-1 dim).
/// Transposed operands are read through their strides.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = same_rank(a, b)?;
    mm_out_dims("matmul", a.dims(), b.dims())?;
    mm_input(&a)?.apply_op2(&mm_input(&b)?, Matmul)
}

/// `act(a · b + bias)` with autograd (one fused cuDNN graph forward); `bias` has N elements.
pub fn matmul_bias_act(a: &Tensor, b: &Tensor, bias: &Tensor, act: Activation) -> Result<Tensor> {
    let (a, b) = same_rank(a, b)?;
    let c = mm_out_dims("matmul_bias_act", a.dims(), b.dims())?;
    check_bias("matmul_bias_act", bias.dims(), c[c.len() - 1])?;
    let bias = if bias.is_contiguous() {
        bias.clone()
    } else {
        bias.contiguous()?
    };
    mm_input(&a)?.apply_op3(&mm_input(&b)?, &bias, MatmulBiasAct { act })
}
