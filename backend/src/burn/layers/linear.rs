//! Linear layers and their backward passes as matmuls (cuDNN graphs).

use burn_backend::DType;

use super::*;
use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::ops::elementwise::BinaryOp;
use crate::ops::{self, Activation};

/// `[.., K]` as `[M, K]` (a view when the strides allow, else a packed copy).
fn fold_rows(t: CudnnTensor) -> Result<CudnnTensor> {
    let d = t.dims().to_vec();
    let k = d.last().copied().unwrap_or(1);
    let m: i64 = d[..d.len().saturating_sub(1)].iter().product();
    t.reshape(&[m, k])
}

/// `a · b` for rank-2 operands: the exact GEMM for F64 (cuDNN has no F64 matmul), else
/// cuDNN on [`CudnnTensor::matmul_ready`] views.
fn matmul2(a: CudnnTensor, b: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    if a.dtype == DType::F64 {
        return crate::burn::math::exact_matmul(&a, &b, op);
    }
    let (a, b) = (a.matmul_ready()?, b.matmul_ready()?);
    let c = a.empty_on(&[a.dims()[0], b.dims()[1]], a.dtype, op)?;
    ops::matmul(c.stream(), &a.tref(), &b.tref(), &c.tmut())?;
    Ok(c)
}

/// An error unless `t` holds a float dtype the linear layers take (F32, Flex32, F16, BF16
/// on cuDNN; F64 on the exact GEMM kernel).
fn require_linear_float(op: &str, t: &CudnnTensor) -> Result<()> {
    if t.dtype != DType::F64 {
        require_cudnn_float(op, t)?;
    }
    Ok(())
}

/// `x [.., K] · w [K, N] (+ bias [N])` as one cuDNN matmul graph with leading dims
/// folded into M (F64: the exact GEMM kernel, then the bias add).
pub(crate) fn linear(x: CudnnTensor, w: CudnnTensor, bias: Option<CudnnTensor>) -> Result<CudnnTensor> {
    linear_act(x, w, bias, Activation::Identity)
}

/// [`linear`] with `act` applied in the graph's epilogue (F32, F16, BF16 only).
pub(crate) fn linear_act(
    x: CudnnTensor,
    w: CudnnTensor,
    bias: Option<CudnnTensor>,
    act: Activation,
) -> Result<CudnnTensor> {
    const OP: &str = "linear";
    require_linear_float(OP, &x)?;
    check_pair(OP, &x, &w)?;
    if x.dtype == DType::F64 && act != Activation::Identity {
        return Err(Error::invalid_input(
            OP,
            format!("an {act:?} epilogue needs F32, F16 or BF16 (F64 runs on the exact GEMM kernel)"),
        ));
    }
    if w.rank() != 2 {
        return Err(Error::invalid_input(
            OP,
            format!("weight {:?} must be [d_input, d_output]", w.dims()),
        ));
    }
    let lead: Vec<i64> = x.dims()[..x.rank().saturating_sub(1)].to_vec();
    let n = w.dims()[1];
    let mut dims = lead;
    dims.push(n);
    if x.dtype == DType::F64 {
        let y = matmul2(fold_rows(x)?, w, OP)?;
        let y = match bias {
            Some(b) => {
                check_pair(OP, &y, &b)?;
                exec::binary(y, b.reshape(&[1, n])?, BinaryOp::Add, OP)?
            }
            None => y,
        };
        return y.reshape(&dims);
    }
    let x2 = fold_rows(x)?.matmul_ready()?;
    let w = w.matmul_ready()?;
    let y = x2.empty_on(&[x2.dims()[0], n], x2.dtype, OP)?;
    let b = bias
        .map(|b| {
            check_pair(OP, &y, &b)?;
            b.cudnn_ready()
        })
        .transpose()?;
    ops::matmul_bias_act(
        y.stream(),
        &x2.tref(),
        &w.tref(),
        b.as_ref().map(|b| b.tref()).as_ref(),
        &y.tmut(),
        act,
    )?;
    y.reshape(&dims)
}

/// The transpose of a rank-2 tensor (a view).
fn t2(t: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    view(t, op, |l| l.transpose(0, 1))
}

/// `dy [.., N] · wᵀ` → `[.., K]` (gradient of [`linear`] with respect to `x`).
pub(crate) fn linear_x_backward(w: CudnnTensor, dy: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "linear_x_backward";
    require_linear_float(OP, &dy)?;
    check_pair(OP, &dy, &w)?;
    let lead: Vec<i64> = dy.dims()[..dy.rank().saturating_sub(1)].to_vec();
    let k = w.dims()[0];
    let dx = matmul2(fold_rows(dy)?, t2(&w, OP)?, OP)?;
    let mut dims = lead;
    dims.push(k);
    dx.reshape(&dims)
}

/// `xᵀ · dy` with every leading dim folded into the contraction → `[K, N]` (gradient of
/// [`linear`] with respect to its weight; one GEMM).
pub(crate) fn linear_weight_backward(x: CudnnTensor, dy: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "linear_weight_backward";
    require_linear_float(OP, &x)?;
    check_pair(OP, &x, &dy)?;
    let xt = t2(&fold_rows(x)?, OP)?;
    matmul2(xt, fold_rows(dy)?, OP)
}

/// `dy [.., N]` summed over every dim but the last → `[N]`.
pub(crate) fn linear_bias_backward(dy: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "linear_bias_backward";
    let n = dy.dims().last().copied().unwrap_or(1);
    let dy2 = fold_rows(dy)?;
    sum_axis(&dy2, 0, OP)?.reshape(&[n])
}
