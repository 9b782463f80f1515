//! CTC loss (`ModuleOps::ctc_loss` and its native backward) through the CTC kernels: one
//! launch for the forward recursion instead of a dozen ops per time step, computed in f64
//! whatever the log-probabilities' dtype (see [`crate::kernels::ctc`]).

use burn_backend::DType;

use crate::burn::exec;
use crate::burn::tensor::{expect, CudnnTensor};
use crate::kernels::ctc::{self as kctc, CtcInputs};

/// The integer operands as I64 (what the kernels read), on the log-probabilities' device.
fn as_i64(t: CudnnTensor, log_probs: &CudnnTensor, op: &str) -> CudnnTensor {
    exec::check_same_device(op, log_probs, &t);
    exec::cast(t, DType::I64, op)
}

/// The dtype of the recursions' workspaces and of the loss before it is cast back
/// ([`kctc::WORKSPACE_DTYPE`]).
const WORKSPACE: DType = DType::F64;

/// The forward recursion of `log_probs [T, N, C]`: the log forward variables `[T, N, 2S + 1]`
/// and the loss `[N]`, both in f64.
fn forward(
    log_probs: &CudnnTensor,
    targets: &CudnnTensor,
    lengths: [&CudnnTensor; 2],
    blank: usize,
    op: &str,
) -> (CudnnTensor, CudnnTensor) {
    let (lp, tg, il, tl) = (log_probs.tref(), targets.tref(), lengths[0].tref(), lengths[1].tref());
    let inputs = CtcInputs {
        log_probs: &lp,
        targets: &tg,
        input_lengths: &il,
        target_lengths: &tl,
        blank: blank as i64,
    };
    let alpha = log_probs.empty_on(&kctc::workspace_dims(&inputs), WORKSPACE, op);
    let nll = log_probs.empty_on(&[log_probs.dims()[1]], WORKSPACE, op);
    expect(
        op,
        kctc::ctc_forward(log_probs.stream(), &inputs, &alpha.tmut(), &nll.tmut()),
    );
    (alpha, nll)
}

/// Burn's `ctc_loss`: the per-sample loss `[N]` in the log-probabilities' dtype.
pub(crate) fn ctc_loss(
    log_probs: CudnnTensor,
    targets: CudnnTensor,
    input_lengths: CudnnTensor,
    target_lengths: CudnnTensor,
    blank: usize,
) -> CudnnTensor {
    const OP: &str = "ctc_loss";
    let tg = as_i64(targets, &log_probs, OP);
    let il = as_i64(input_lengths, &log_probs, OP);
    let tl = as_i64(target_lengths, &log_probs, OP);
    let (_, nll) = forward(&log_probs, &tg, [&il, &tl], blank, OP);
    exec::cast(nll, log_probs.dtype, OP)
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
) -> CudnnTensor {
    const OP: &str = "ctc_loss_backward";
    let tg = as_i64(targets, &log_probs, OP);
    let il = as_i64(input_lengths, &log_probs, OP);
    let tl = as_i64(target_lengths, &log_probs, OP);
    exec::check_same_device(OP, &log_probs, &grad_loss);
    let grad_loss = exec::cast(grad_loss, log_probs.dtype, OP);
    let (alpha, nll) = forward(&log_probs, &tg, [&il, &tl], blank, OP);
    let beta = alpha.empty_like(alpha.dtype, OP);
    let grad = log_probs.empty_like(log_probs.dtype, OP);
    let (lp, tgr, ilr, tlr) = (log_probs.tref(), tg.tref(), il.tref(), tl.tref());
    let inputs = CtcInputs {
        log_probs: &lp,
        targets: &tgr,
        input_lengths: &ilr,
        target_lengths: &tlr,
        blank: blank as i64,
    };
    expect(
        OP,
        kctc::ctc_backward(
            log_probs.stream(),
            &inputs,
            &alpha.tref(),
            &nll.tref(),
            &grad_loss.tref(),
            &beta.tmut(),
            &grad.tmut(),
        ),
    );
    grad
}
