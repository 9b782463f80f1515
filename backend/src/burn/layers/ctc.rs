//! CTC loss (`ModuleOps::ctc_loss` and its native backward) through the CTC kernels: one
//! launch for the forward recursion instead of a dozen ops per time step, computed in f64
//! whatever the log-probabilities' dtype (see [`crate::ops::ctc`]).

use burn_backend::DType;

use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::error::Result;
use crate::ops::ctc::{self as kctc, CtcInputs};

/// The dtype of the recursions' workspaces and of the loss before it is cast back
/// ([`kctc::WORKSPACE_DTYPE`]).
const WORKSPACE: DType = DType::F64;

/// A CTC problem on the device: the log-probabilities `[T, N, C]` and the integer operands
/// as I64 (what the kernels read).
struct Problem {
    log_probs: CudnnTensor,
    targets: CudnnTensor,
    input_lengths: CudnnTensor,
    target_lengths: CudnnTensor,
    blank: i64,
}

impl Problem {
    fn new(
        log_probs: CudnnTensor,
        [targets, input_lengths, target_lengths]: [CudnnTensor; 3],
        blank: usize,
        op: &str,
    ) -> Result<Self> {
        let as_i64 = |t: CudnnTensor| {
            exec::check_same_device(op, &log_probs, &t)?;
            exec::cast(t, DType::I64, op)
        };
        Ok(Self {
            targets: as_i64(targets)?,
            input_lengths: as_i64(input_lengths)?,
            target_lengths: as_i64(target_lengths)?,
            log_probs,
            blank: blank as i64,
        })
    }

    /// Runs `f` with the kernels' view of the problem.
    fn with_inputs<R>(&self, f: impl FnOnce(&CtcInputs) -> R) -> R {
        let (lp, tg) = (self.log_probs.tref(), self.targets.tref());
        let (il, tl) = (self.input_lengths.tref(), self.target_lengths.tref());
        f(&CtcInputs {
            log_probs: &lp,
            targets: &tg,
            input_lengths: &il,
            target_lengths: &tl,
            blank: self.blank,
        })
    }

    /// The forward recursion: the log forward variables `[T, N, 2S + 1]` and the loss `[N]`,
    /// both in f64.
    fn forward(&self, op: &str) -> Result<(CudnnTensor, CudnnTensor)> {
        let lp = &self.log_probs;
        let alpha = lp.empty_on(&self.with_inputs(kctc::workspace_dims), WORKSPACE, op)?;
        let nll = lp.empty_on(&[lp.dims()[1]], WORKSPACE, op)?;
        let done = self.with_inputs(|inputs| kctc::ctc_forward(lp.stream(), inputs, &alpha.tmut(), &nll.tmut()));
        done?;
        Ok((alpha, nll))
    }
}

/// Burn's `ctc_loss`: the per-sample loss `[N]` in the log-probabilities' dtype.
pub(crate) fn ctc_loss(
    log_probs: CudnnTensor,
    targets: CudnnTensor,
    input_lengths: CudnnTensor,
    target_lengths: CudnnTensor,
    blank: usize,
) -> Result<CudnnTensor> {
    const OP: &str = "ctc_loss";
    let problem = Problem::new(log_probs, [targets, input_lengths, target_lengths], blank, OP)?;
    let (_, nll) = problem.forward(OP)?;
    exec::cast(nll, problem.log_probs.dtype, OP)
}

/// Burn's `ctc_loss_backward`: the gradient of `sum(loss * grad_loss)` with respect to
/// `log_probs` (`[T, N, C]`, their dtype). The forward recursion runs again (Burn hands the
/// backward only the inputs), then the backward recursion and the gradient: three launches.
pub(crate) fn ctc_loss_backward(
    log_probs: CudnnTensor,
    targets: CudnnTensor,
    input_lengths: CudnnTensor,
    target_lengths: CudnnTensor,
    grad_loss: CudnnTensor,
    blank: usize,
) -> Result<CudnnTensor> {
    const OP: &str = "ctc_loss_backward";
    exec::check_same_device(OP, &log_probs, &grad_loss)?;
    let grad_loss = exec::cast(grad_loss, log_probs.dtype, OP)?;
    let problem = Problem::new(log_probs, [targets, input_lengths, target_lengths], blank, OP)?;
    let (alpha, nll) = problem.forward(OP)?;
    let beta = alpha.empty_like(alpha.dtype, OP)?;
    let lp = &problem.log_probs;
    let grad = lp.empty_like(lp.dtype, OP)?;
    let done = problem.with_inputs(|inputs| {
        kctc::ctc_backward(
            lp.stream(),
            inputs,
            &alpha.tref(),
            &nll.tref(),
            &grad_loss.tref(),
            &beta.tmut(),
            &grad.tmut(),
        )
    });
    done?;
    Ok(grad)
}
