//! Cross-entropy of logits rows on [`Cudnn`]: the one-pass forward (the mean loss, the row
//! log-sum-exp kept) and the one-pass logits gradient, [`crate::ops::cross_entropy_forward`]
//! and [`crate::ops::cross_entropy_backward`].

use burn_backend::DType;

use super::super::exec;
use super::super::tensor::CudnnTensor;
use crate::error::{Error, Result};
use crate::ops::{self, CrossEntropyBackward, CrossEntropyForward, CrossEntropyMean};

/// What the backward pass needs.
#[derive(Clone, Debug)]
pub(crate) struct XentSaved {
    /// The logits, packed `[rows, classes]`.
    logits: CudnnTensor,
    /// The targets as I64 `[rows]`.
    targets: CudnnTensor,
    /// The row log-sum-exp, f32 `[rows]`.
    lse: CudnnTensor,
    ignore: Vec<i64>,
    mean_over: CrossEntropyMean,
}

/// The logits packed and the targets as I64, after checking their dims.
fn operands(logits: CudnnTensor, targets: CudnnTensor, op: &str) -> Result<(CudnnTensor, CudnnTensor)> {
    exec::check_same_device(op, &logits, &targets)?;
    let (ld, td) = (logits.dims(), targets.dims());
    if ld.len() != 2 || td.len() != 1 || td[0] != ld[0] {
        return Err(Error::invalid_input(
            op,
            format!("logits {ld:?} and targets {td:?}: need [rows, classes] and [rows]"),
        ));
    }
    Ok((logits.contiguous()?, exec::cast(targets, DType::I64, op)?))
}

impl XentSaved {
    /// The saved state from the forward's inputs as passed and its row log-sum-exp: what a
    /// lazily recorded forward hands its backward.
    pub(super) fn rebuild(
        logits: CudnnTensor,
        targets: CudnnTensor,
        lse: CudnnTensor,
        ignore: Vec<i64>,
        mean_over: CrossEntropyMean,
    ) -> Result<Self> {
        let (logits, targets) = operands(logits, targets, "cross_entropy_backward")?;
        Ok(Self {
            logits,
            targets,
            lse,
            ignore,
            mean_over,
        })
    }

    /// The row log-sum-exp, f32 `[rows]`.
    pub(super) fn lse(&self) -> &CudnnTensor {
        &self.lse
    }
}

/// The mean loss (`[1]`, the logits' dtype) and what the backward needs.
pub(super) fn forward(
    logits: CudnnTensor,
    targets: CudnnTensor,
    ignore: &[i64],
    mean_over: CrossEntropyMean,
) -> Result<(CudnnTensor, XentSaved)> {
    const OP: &str = "cross_entropy_forward";
    let (logits, targets) = operands(logits, targets, OP)?;
    let rows = logits.dims()[0];
    let lse = logits.empty_on(&[rows], DType::F32, OP)?;
    let loss = logits.empty_on(&[1], logits.dtype, OP)?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, tt, tl, tm) = (logits.tref(), targets.tref(), lse.tmut(), loss.tmut());
        let args = CrossEntropyForward {
            logits: &tx,
            targets: &tt,
            ignore,
            lse: &tl,
            row_loss: None,
            mean: Some(&tm),
            mean_over,
        };
        ops::cross_entropy_forward(loss.stream(), &args)?;
    }
    let saved = XentSaved {
        logits,
        targets,
        lse,
        ignore: ignore.to_vec(),
        mean_over,
    };
    Ok((loss, saved))
}

/// The logits' gradient (their dims and dtype) for the gradient `grad` of the mean loss.
pub(super) fn backward(s: &XentSaved, grad: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "cross_entropy_backward";
    exec::check_same_device(OP, &s.logits, &grad)?;
    if grad.numel() != 1 {
        return Err(Error::invalid_input(
            OP,
            format!("the loss's gradient has dims {:?}, not one element", grad.dims()),
        ));
    }
    let grad = match grad.dtype {
        DType::F32 | DType::F16 | DType::BF16 => grad,
        _ => exec::cast(grad, DType::F32, OP)?,
    };
    let dx = s.logits.empty_like(s.logits.dtype, OP)?;
    // The views borrow the tensors, which are moved below.
    {
        let (tx, tt, tl, tg, tdx) = (s.logits.tref(), s.targets.tref(), s.lse.tref(), grad.tref(), dx.tmut());
        let args = CrossEntropyBackward {
            logits: &tx,
            targets: &tt,
            ignore: &s.ignore,
            lse: &tl,
            grad: &tg,
            mean_over: s.mean_over,
            d_logits: &tdx,
        };
        ops::cross_entropy_backward(dx.stream(), &args)?;
    }
    Ok(dx)
}
