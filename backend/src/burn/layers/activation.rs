//! Activation backward passes and the activations Burn composes.

use super::*;
use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::ops::elementwise::{BinaryOp, UnaryOp};

/// `grad` where `output > 0`, else 0 (relu's backward from its output, as Burn's default:
/// a NaN output passes the gradient).
pub(crate) fn relu_backward(output: CudnnTensor, grad: CudnnTensor) -> Result<CudnnTensor> {
    exec::binary(grad, output, BinaryOp::ReluBackward, "relu_backward")
}

/// Runs `f` on `t` in the compute dtype (F32 for half types) and casts the result back.
pub(crate) fn in_compute_dtype(
    t: CudnnTensor,
    op: &str,
    f: impl FnOnce(CudnnTensor) -> Result<CudnnTensor>,
) -> Result<CudnnTensor> {
    let dtype = t.dtype;
    let out = f(exec::cast(t, compute_dtype(dtype), op)?)?;
    exec::cast(out, dtype, op)
}

/// Burn's default `gelu_backward` (the derivative of the tanh approximation, which is what
/// burn-ndarray computes) as one elementwise pass.
pub(crate) fn gelu_backward(x: CudnnTensor, grad: CudnnTensor) -> Result<CudnnTensor> {
    // One kernel pass: the derivative is computed in f32 (f64 for f64) per element.
    let x = exec::cast(x, grad.dtype, "gelu_backward")?;
    exec::binary(grad, x, BinaryOp::GeluBackward, "gelu_backward")
}

/// `output (1 - output) grad`.
pub(crate) fn sigmoid_backward(output: CudnnTensor, grad: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "sigmoid_backward";
    let one_minus = exec::unary(output.clone(), UnaryOp::MulScalar(-1.0), OP)?;
    let one_minus = exec::unary(one_minus, UnaryOp::AddScalar(1.0), OP)?;
    let v = exec::binary(one_minus, output, BinaryOp::Mul, OP)?;
    exec::binary(v, grad, BinaryOp::Mul, OP)
}

/// `clamp(alpha x + beta, 0, 1)`.
pub(crate) fn hard_sigmoid(x: CudnnTensor, alpha: f64, beta: f64) -> Result<CudnnTensor> {
    const OP: &str = "hard_sigmoid";
    in_compute_dtype(x, OP, |x| {
        let y = exec::unary(x, UnaryOp::MulScalar(alpha), OP)?;
        let y = exec::unary(y, UnaryOp::AddScalar(beta), OP)?;
        exec::unary(y, UnaryOp::Clamp { min: 0.0, max: 1.0 }, OP)
    })
}

/// `log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))` (stable for large |x|).
pub(crate) fn log_sigmoid(x: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "log_sigmoid";
    in_compute_dtype(x, OP, |x| {
        let soft = exec::unary(x.clone(), UnaryOp::Abs, OP)?;
        let soft = exec::unary(soft, UnaryOp::Neg, OP)?;
        let soft = exec::unary(soft, UnaryOp::Exp, OP)?;
        let soft = exec::unary(soft, UnaryOp::Log1p, OP)?;
        let m = exec::binary_scalar(x, 0.0, BinaryOp::Min, OP)?;
        exec::binary(m, soft, BinaryOp::Sub, OP)
    })
}

/// Gradient of [`log_sigmoid`]: `grad · sigmoid(-x)` (Burn's default formula simplified).
pub(crate) fn log_sigmoid_backward(x: CudnnTensor, grad: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "log_sigmoid_backward";
    let s = exec::unary(x, UnaryOp::Neg, OP)?;
    let s = exec::unary(s, UnaryOp::Sigmoid, OP)?;
    exec::binary(s, grad, BinaryOp::Mul, OP)
}
