//! CTC loss on the GPU (`kernels/ctc.cu`): the log-space forward and backward recursions in
//! one launch each (sequential in time inside the kernel, not one launch per step), the loss,
//! and the gradient with respect to the log-probabilities.
//!
//! Everything after the loads runs in f64 whatever the dtype: the log forward and backward
//! variables grow like `-T log C` and the posteriors cancel them back to O(1), so f32
//! recursions would lose about `|alpha| * 2^-24` of each gradient entry (1e-3 relative at
//! `T = 1000`); in f64 the only error left is the final rounding to the dtype. The
//! definitions follow Burn's `ctc_loss`: input lengths clamp to `[1, T]` (an empty input
//! reads the first step), target lengths to `[0, S]`, a label outside `[0, C)` has
//! probability 0, a sample with no alignment has loss `+inf` and a zero gradient. The
//! gradient is the exact derivative of the loss (`-grad_loss[n]` times the posterior of the
//! alignments through each `(t, class)`, zero from a sample's input length on), so it agrees
//! with differentiating Burn's decomposed `ctc_loss_default`. It has no atomics and is
//! deterministic. The float64 host mirror is `cudnn_backend_reference::ctc_loss`.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch_ctc::{self as launch, CtcArgs, CtcGradPtrs, CtcInputPtrs};
use crate::graph::DataType;
use crate::kernels::check::{check_tensor, float_slot, on_stream};
use crate::kernels::{stream_function, CTC};
use crate::types::{row_major_strides, TensorMut, TensorRef};

const OP: &str = "ctc_loss";

/// The inputs of a CTC loss.
#[derive(Clone, Copy, Debug)]
pub struct CtcInputs<'r, 'a> {
    /// Log-probabilities `[T, N, C]` (F32, F16, BF16 or F64; any strides; `T >= 1`).
    pub log_probs: &'r TensorRef<'a>,
    /// Target labels `[N, S]` (I64), padded past each sample's target length.
    pub targets: &'r TensorRef<'a>,
    /// Input length of each sample, `[N]` (I64).
    pub input_lengths: &'r TensorRef<'a>,
    /// Target length of each sample, `[N]` (I64).
    pub target_lengths: &'r TensorRef<'a>,
    /// The blank class, in `[0, C)`.
    pub blank: i64,
}

/// The dtype of the recursions' workspaces and of the loss, whatever the log-probabilities'.
pub const WORKSPACE_DTYPE: DataType = DataType::F64;

/// Dims of the recursions' workspaces for `inputs`: `[T, N, 2S + 1]`.
pub fn workspace_dims(inputs: &CtcInputs) -> Vec<i64> {
    let s = inputs.targets.dims.get(1).copied().unwrap_or(0);
    let lp = &inputs.log_probs.dims;
    vec![
        lp.first().copied().unwrap_or(0),
        lp.get(1).copied().unwrap_or(0),
        2 * s + 1,
    ]
}

/// A validated problem: the kernels (forward, backward, gradient) for its dtype and their
/// arguments.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CtcPlan {
    pub entries: [&'static str; 3],
    pub args: CtcArgs,
}

/// `ctc_{alpha,beta,grad}_<dt>` by [`float_slot`].
const ENTRIES: [[&str; 3]; 4] = [
    ["ctc_alpha_f32", "ctc_beta_f32", "ctc_grad_f32"],
    ["ctc_alpha_f16", "ctc_beta_f16", "ctc_grad_f16"],
    ["ctc_alpha_bf16", "ctc_beta_bf16", "ctc_grad_bf16"],
    ["ctc_alpha_f64", "ctc_beta_f64", "ctc_grad_f64"],
];

fn expect_dims(arg: &'static str, t: &TensorRef, want: &[i64], what: &str) -> Result<()> {
    check_tensor(OP, arg, t)?;
    if t.dims[..] != want[..] {
        return Err(Error::invalid_arg(
            OP,
            arg,
            format!("dims {:?}, expected {want:?} ({what})", t.dims),
        ));
    }
    Ok(())
}

fn expect_dtype(arg: &'static str, t: &TensorRef, want: DataType) -> Result<()> {
    if t.dtype != want {
        return Err(Error::invalid_arg(
            OP,
            arg,
            format!("dtype {:?}, expected {want:?}", t.dtype),
        ));
    }
    Ok(())
}

/// Checks that an output is `want` dims of `dtype`, packed row-major.
fn expect_packed_output(arg: &'static str, t: &TensorRef, want: &[i64], dtype: DataType, what: &str) -> Result<()> {
    expect_dims(arg, t, want, what)?;
    expect_dtype(arg, t, dtype)?;
    let packed = t
        .dims
        .iter()
        .zip(t.strides.iter().zip(row_major_strides(want)))
        .all(|(&d, (&s, r))| d <= 1 || s == r);
    if !packed {
        return Err(Error::invalid_arg(
            OP,
            arg,
            format!("strides {:?} are not row-major packed for dims {want:?}", t.strides),
        ));
    }
    Ok(())
}

/// Validates the inputs; `None` when there is nothing to compute (an empty batch).
pub(crate) fn plan(inputs: &CtcInputs) -> Result<Option<CtcPlan>> {
    let lp = inputs.log_probs;
    check_tensor(OP, "log_probs", lp)?;
    let entries = ENTRIES[float_slot(OP, "log_probs", lp.dtype)?];
    let &[steps, batch, classes] = lp.dims.as_slice() else {
        return Err(Error::invalid_arg(
            OP,
            "log_probs",
            format!("dims {:?} are not [T, N, C]", lp.dims),
        ));
    };
    if steps == 0 {
        return Err(Error::invalid_arg(
            OP,
            "log_probs",
            "T is 0: CTC needs at least one input step",
        ));
    }
    if !(0..classes).contains(&inputs.blank) {
        return Err(Error::invalid_arg(
            OP,
            "blank",
            format!("blank {} is not a class of [0, {classes})", inputs.blank),
        ));
    }
    let tg = inputs.targets;
    check_tensor(OP, "targets", tg)?;
    expect_dtype("targets", tg, DataType::I64)?;
    let &[tn, max_target] = tg.dims.as_slice() else {
        return Err(Error::invalid_arg(
            OP,
            "targets",
            format!("dims {:?} are not [N, S]", tg.dims),
        ));
    };
    if tn != batch {
        return Err(Error::invalid_arg(
            OP,
            "targets",
            format!("dims {:?}: {tn} samples, log_probs has {batch}", tg.dims),
        ));
    }
    for (arg, t) in [
        ("input_lengths", inputs.input_lengths),
        ("target_lengths", inputs.target_lengths),
    ] {
        expect_dims(arg, t, &[batch], "one length per sample")?;
        expect_dtype(arg, t, DataType::I64)?;
    }
    if batch == 0 {
        return Ok(None);
    }
    Ok(Some(CtcPlan {
        entries,
        args: CtcArgs {
            steps,
            batch,
            classes,
            lp_strides: [lp.strides[0], lp.strides[1], lp.strides[2]],
            max_target,
            target_strides: [tg.strides[0], tg.strides[1]],
            length_strides: [inputs.input_lengths.strides[0], inputs.target_lengths.strides[0]],
            blank: inputs.blank,
        },
    }))
}

fn input_ptrs(inputs: &CtcInputs) -> CtcInputPtrs {
    CtcInputPtrs {
        log_probs: inputs.log_probs.address(),
        targets: inputs.targets.address(),
        input_lengths: inputs.input_lengths.address(),
        target_lengths: inputs.target_lengths.address(),
    }
}

fn on_stream_all(stream: &CudaStream, inputs: &CtcInputs, outputs: &[(&'static str, &TensorRef)]) -> Result<()> {
    on_stream(
        stream,
        OP,
        &[
            ("log_probs", inputs.log_probs),
            ("targets", inputs.targets),
            ("input_lengths", inputs.input_lengths),
            ("target_lengths", inputs.target_lengths),
        ],
    )?;
    on_stream(stream, OP, outputs)
}

/// The CTC loss of each sample into `nll` (`[N]`, [`WORKSPACE_DTYPE`], packed), with the
/// log forward variables into `log_alpha` ([`workspace_dims`], [`WORKSPACE_DTYPE`], packed;
/// [`ctc_backward`] reads them). One kernel launch.
pub fn ctc_forward(stream: &Arc<CudaStream>, inputs: &CtcInputs, log_alpha: &TensorMut, nll: &TensorMut) -> Result<()> {
    on_stream_all(stream, inputs, &[("log_alpha", log_alpha), ("nll", nll)])?;
    let Some(p) = plan(inputs)? else { return Ok(()) };
    let acc = WORKSPACE_DTYPE;
    expect_packed_output("log_alpha", log_alpha, &workspace_dims(inputs), acc, "[T, N, 2S + 1]")?;
    expect_packed_output("nll", nll, &[p.args.batch], acc, "[N]")?;
    let f = stream_function(stream, CTC, p.entries[0])?;
    launch::alpha(
        stream,
        &f,
        &input_ptrs(inputs),
        &p.args,
        log_alpha.address(),
        nll.address(),
    )
}

/// The gradient of `sum_n grad_loss[n] * loss[n]` with respect to the log-probabilities into
/// `grad` (`[T, N, C]`, their dtype, packed), from [`ctc_forward`]'s `log_alpha` and `nll` for
/// the same inputs; `grad_loss` is `[N]` in the log-probabilities' dtype (any stride) and
/// `log_beta` a workspace like `log_alpha`. Two kernel launches.
pub fn ctc_backward(
    stream: &Arc<CudaStream>,
    inputs: &CtcInputs,
    log_alpha: &TensorRef,
    nll: &TensorRef,
    grad_loss: &TensorRef,
    log_beta: &TensorMut,
    grad: &TensorMut,
) -> Result<()> {
    on_stream_all(
        stream,
        inputs,
        &[
            ("log_alpha", log_alpha),
            ("nll", nll),
            ("grad_loss", grad_loss),
            ("log_beta", log_beta),
            ("grad", grad),
        ],
    )?;
    let Some(p) = plan(inputs)? else { return Ok(()) };
    let dtype = inputs.log_probs.dtype;
    let acc = WORKSPACE_DTYPE;
    let work = workspace_dims(inputs);
    expect_packed_output("log_alpha", log_alpha, &work, acc, "[T, N, 2S + 1]")?;
    expect_packed_output("log_beta", log_beta, &work, acc, "[T, N, 2S + 1]")?;
    expect_packed_output("nll", nll, &[p.args.batch], acc, "[N]")?;
    expect_dims("grad_loss", grad_loss, &[p.args.batch], "one gradient per sample")?;
    expect_dtype("grad_loss", grad_loss, dtype)?;
    expect_packed_output("grad", grad, &inputs.log_probs.dims, dtype, "[T, N, C]")?;
    let ptrs = input_ptrs(inputs);
    let beta = stream_function(stream, CTC, p.entries[1])?;
    launch::beta(stream, &beta, &ptrs, &p.args, log_beta.address())?;
    if grad.numel() == 0 {
        return Ok(());
    }
    let g = stream_function(stream, CTC, p.entries[2])?;
    let gp = CtcGradPtrs {
        alpha: log_alpha.address(),
        beta: log_beta.address(),
        nll: nll.address(),
        grad_loss: grad_loss.address(),
        grad_loss_stride: grad_loss.strides[0],
        grad: grad.address(),
    };
    launch::grad(stream, &g, &ptrs, &p.args, &gp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, 0x1000)
    }

    fn arg_of(r: Result<Option<CtcPlan>>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn plan_takes_strides_and_names_bad_arguments() {
        let lp = TensorRef::fake(&[8, 2, 5], &[5, 40, 1], DataType::F16, 0x1000);
        let tg = t(&[2, 3], DataType::I64);
        let il = TensorRef::fake(&[2], &[2], DataType::I64, 0x1000);
        let tl = t(&[2], DataType::I64);
        let ok = CtcInputs {
            log_probs: &lp,
            targets: &tg,
            input_lengths: &il,
            target_lengths: &tl,
            blank: 0,
        };
        let p = plan(&ok).unwrap().unwrap();
        assert_eq!(p.entries, ["ctc_alpha_f16", "ctc_beta_f16", "ctc_grad_f16"]);
        assert_eq!(
            p.args,
            CtcArgs {
                steps: 8,
                batch: 2,
                classes: 5,
                lp_strides: [5, 40, 1],
                max_target: 3,
                target_strides: [3, 1],
                length_strides: [2, 1],
                blank: 0,
            }
        );
        assert_eq!(workspace_dims(&ok), [8, 2, 7]);
        assert_eq!(arg_of(plan(&CtcInputs { blank: 5, ..ok })), "blank");
        let i32s = t(&[2, 3], DataType::I32);
        assert_eq!(arg_of(plan(&CtcInputs { targets: &i32s, ..ok })), "targets");
        let three = t(&[3, 3], DataType::I64);
        assert_eq!(arg_of(plan(&CtcInputs { targets: &three, ..ok })), "targets");
        let short = t(&[1], DataType::I64);
        assert_eq!(
            arg_of(plan(&CtcInputs {
                target_lengths: &short,
                ..ok
            })),
            "target_lengths"
        );
        let ints = t(&[8, 2, 5], DataType::I32);
        assert_eq!(arg_of(plan(&CtcInputs { log_probs: &ints, ..ok })), "log_probs");
        let no_steps = t(&[0, 2, 5], DataType::F32);
        assert_eq!(
            arg_of(plan(&CtcInputs {
                log_probs: &no_steps,
                ..ok
            })),
            "log_probs"
        );
        let empty = (
            t(&[4, 0, 5], DataType::F32),
            t(&[0, 3], DataType::I64),
            t(&[0], DataType::I64),
        );
        let none = CtcInputs {
            log_probs: &empty.0,
            targets: &empty.1,
            input_lengths: &empty.2,
            target_lengths: &empty.2,
            blank: 0,
        };
        assert_eq!(plan(&none).unwrap(), None);
    }

    #[test]
    fn outputs_must_be_packed_in_the_workspace_dtype() {
        let want = [4, 2, 7];
        let f64s = DataType::F64;
        assert!(expect_packed_output("log_alpha", &t(&want, f64s), &want, f64s, "").is_ok());
        let f32s = t(&want, DataType::F32);
        assert!(expect_packed_output("log_alpha", &f32s, &want, f64s, "").is_err());
        let transposed = TensorRef::fake(&want, &[7, 28, 1], f64s, 0x1000);
        assert!(expect_packed_output("log_alpha", &transposed, &want, f64s, "").is_err());
        assert!(expect_packed_output("log_alpha", &t(&[4, 2, 6], f64s), &want, f64s, "").is_err());
    }
}
