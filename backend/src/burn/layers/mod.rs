//! Neural-network building blocks behind `ModuleOps` and `ActivationOps`, one file per op
//! family: convolutions (plain and transposed, with their backward passes) and linear layers
//! as cuDNN graphs, pooling, interpolation, embeddings and im2col through the NVRTC kernels,
//! activation backward passes, the CTC loss, the deformable convolution, the DFT and the transformer's
//! attention and layer norm; and here the small device-side helpers (arange, views, fills)
//! they share.
//!
//! Every function enqueues on the tensors' device stream and never waits. Results are
//! fresh packed row-major tensors (or views of them); inputs may be any strided view.

mod activation;
mod conv;
mod ctc;
mod deform;
mod embedding;
mod fft;
mod interpolate;
mod lanczos;
mod linear;
mod pool;
mod transformer;

pub(crate) use activation::*;
pub(crate) use conv::*;
pub(crate) use ctc::{ctc_loss, ctc_loss_backward};
pub(crate) use deform::{deform_conv2d, deform_conv2d_backward};
pub(crate) use embedding::*;
pub(crate) use fft::{irfft, rfft};
pub(crate) use interpolate::*;
pub(crate) use linear::*;
pub(crate) use pool::*;
pub(crate) use transformer::{attention, causal_bias, layer_norm};

use std::sync::Arc;

use burn_backend::DType;

use super::exec;
use super::tensor::CudnnTensor;
use crate::error::{Error, InOp, Result};
use crate::ops::elementwise::{self as ew, BinaryOp, UnaryOp};
use crate::ops::reduce::{self as kreduce, ReduceOp, ScanOp};
use crate::runtime;
use crate::view::ViewLayout;

/// An error unless `t` holds a float dtype cuDNN computes in (F32, Flex32, F16, BF16).
pub(crate) fn require_cudnn_float(op: &str, t: &CudnnTensor) -> Result<()> {
    match t.dtype {
        DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {}
        DType::F64 => {
            return Err(Error::invalid_input(
                op,
                "F64 is not supported by cuDNN; cast the tensors to F32 first",
            ))
        }
        other => {
            return Err(Error::invalid_input(
                op,
                format!("dtype {other:?} is not a float dtype (F32, F16 or BF16 expected)"),
            ))
        }
    }
    Ok(())
}

/// An error unless `t` holds a float dtype the pooling/resize kernels take (F32, Flex32,
/// F16, BF16, F64).
pub(crate) fn require_float(op: &str, t: &CudnnTensor) -> Result<()> {
    match t.dtype {
        DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 | DType::F64 => {}
        other => {
            return Err(Error::invalid_input(
                op,
                format!("dtype {other:?} is not a float dtype (F32, F16, BF16 or F64 expected)"),
            ))
        }
    }
    Ok(())
}

/// An error unless both tensors are on one device and share a dtype.
fn check_pair(op: &str, a: &CudnnTensor, b: &CudnnTensor) -> Result<()> {
    exec::check_same_device(op, a, b)?;
    exec::check_same_dtype(op, a, b)?;
    Ok(())
}

/// A view of `t` built by `f` from its layout (an error naming `op` for an invalid view).
pub(crate) fn view(
    t: &CudnnTensor,
    op: &str,
    f: impl FnOnce(&ViewLayout) -> crate::error::Result<ViewLayout>,
) -> Result<CudnnTensor> {
    Ok(t.with_layout(f(&t.layout).in_op(op)?))
}

/// `t[.., start..end, ..]` along `axis` (a view).
pub(crate) fn narrow(t: &CudnnTensor, op: &str, axis: usize, start: i64, end: i64) -> Result<CudnnTensor> {
    view(t, op, |l| l.slice(axis, start, end, 1))
}

/// Fills the (possibly strided) view `t` with `value`.
pub(crate) fn fill(t: &CudnnTensor, value: f64, op: &str) -> Result<()> {
    if t.numel() > 0 {
        ew::fill(t.stream(), &t.tmut(), value).in_op(op)?;
    }
    Ok(())
}

/// `0, 1, .., n - 1` as a 1-D tensor of `dtype`, built on the device (a running sum of
/// ones in I64, cast when `dtype` differs).
pub(crate) fn arange(device: &Arc<runtime::Device>, n: i64, dtype: DType, op: &str) -> Result<CudnnTensor> {
    let ones = exec::full(device, &[n], DType::I64, 1.0, op)?;
    let out = CudnnTensor::empty(device, &[n], DType::I64, op)?;
    if n > 0 {
        kreduce::scan(device.stream(), ScanOp::CumSum, &ones.tref(), 0, &out.tmut())?;
    }
    let out = exec::unary(out, UnaryOp::AddScalar(-1.0), op)?;
    exec::cast(out, dtype, op)
}

/// Writes `op(a, b)` (broadcast) into the existing view `out`.
pub(crate) fn binary_into(a: &CudnnTensor, b: &CudnnTensor, op: BinaryOp, out: &CudnnTensor, name: &str) -> Result<()> {
    ew::binary(out.stream(), op, &a.tref(), &b.tref(), &out.tmut()).in_op(name)
}

/// Sum of `t` over `axis`, keeping it with size 1.
pub(crate) fn sum_axis(t: &CudnnTensor, axis: usize, op: &str) -> Result<CudnnTensor> {
    let mut dims = t.dims().to_vec();
    dims[axis] = 1;
    let out = t.empty_on(&dims, t.dtype, op)?;
    kreduce::reduce(t.stream(), ReduceOp::Sum, &t.tref(), axis, &out.tmut())?;
    Ok(out)
}

/// Sums into the existing view `out` (dims of `t` with `dims[axis] = 1`).
pub(crate) fn sum_axis_into(t: &CudnnTensor, axis: usize, out: &CudnnTensor, op: &str) -> Result<()> {
    kreduce::reduce(t.stream(), ReduceOp::Sum, &t.tref(), axis, &out.tmut()).in_op(op)
}

/// The dtype intermediate results of a composed op are kept in: F32 for half types.
pub(crate) fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 | DType::Flex32 => DType::F32,
        d => d,
    }
}
