//! Cross-entropy of logits rows against class targets, forward and backward, as NVRTC
//! kernels that read the logits once each way (Burn composes log-softmax, a gather and a mean:
//! several passes over a `[rows, classes]` tensor that is the largest of a language model).
//!
//! The forward keeps a running maximum and sum of exponentials per thread in one pass over
//! each row and writes the row's log-sum-exp (for the backward) and loss; the mean is a
//! one-block reduction. The backward writes `g / denominator · (softmax(x) - onehot(target))`
//! in one pass. All accumulate in f32 whatever the logits' dtype and are deterministic (fixed
//! reduction orders, no atomics).
//!
//! Targets in the ignore set (Burn's `pad_tokens`, PyTorch's `ignore_index`) give loss 0 and
//! a zero gradient row. A target outside `[0, classes)` that is not ignored is not detected on
//! the host (that would read the targets back every step): its row's loss and gradient are
//! NaN, so the mean and every gradient computed from it show it.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::launch_cross_entropy::{self as launch, XentProblem, MAX_IGNORE};
use crate::graph::DataType;
use crate::kernels::check::{check_aligned, check_disjoint, check_packed_rows, check_tensor};
use crate::kernels::cross_entropy::{ignore_set, scalar_code, vectors_line_up, Kernel, Variant, MEAN, SCALE};
use crate::kernels::{stream_functions, CROSS_ENTROPY};
use crate::runtime::with_workspace;

/// Most target values one call may ignore.
pub const CROSS_ENTROPY_MAX_IGNORE: usize = MAX_IGNORE;

/// What the mean of a cross-entropy divides the summed row losses by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CrossEntropyMean {
    /// Every row, ignored ones included (Burn's `CrossEntropyLoss` with `pad_tokens`).
    #[default]
    AllRows,
    /// The rows whose target is not ignored (PyTorch's `ignore_index`; NaN when none is).
    TargetRows,
}

/// Operands of [`cross_entropy_forward`].
#[derive(Clone, Copy, Debug)]
pub struct CrossEntropyForward<'a> {
    /// Logits `[rows, classes]`, packed row-major, F32, F16 or BF16 (`classes >= 1`).
    pub logits: &'a TensorRef<'a>,
    /// The class of each row, `[rows]` I64 (any stride).
    pub targets: &'a TensorRef<'a>,
    /// Target values whose rows are ignored (at most [`CROSS_ENTROPY_MAX_IGNORE`]).
    pub ignore: &'a [i64],
    /// Written: the row log-sum-exp, `rows` packed F32 (0 on ignored rows): what the
    /// backward reads.
    pub lse: &'a TensorMut<'a>,
    /// Written when given: the row losses `lse - x[target]`, `rows` packed F32 (0 on ignored
    /// rows).
    pub row_loss: Option<&'a TensorMut<'a>>,
    /// Written when given: the mean row loss, one element of F32, F16 or BF16.
    pub mean: Option<&'a TensorMut<'a>>,
    /// The mean's denominator.
    pub mean_over: CrossEntropyMean,
}

/// Operands of [`cross_entropy_backward`].
#[derive(Clone, Copy, Debug)]
pub struct CrossEntropyBackward<'a> {
    /// The forward's logits.
    pub logits: &'a TensorRef<'a>,
    /// The forward's targets.
    pub targets: &'a TensorRef<'a>,
    /// The forward's ignored target values.
    pub ignore: &'a [i64],
    /// The forward's row log-sum-exp.
    pub lse: &'a TensorRef<'a>,
    /// The gradient of the mean loss: one element of F32, F16 or BF16.
    pub grad: &'a TensorRef<'a>,
    /// The forward mean's denominator.
    pub mean_over: CrossEntropyMean,
    /// Written: the gradient of the logits (their dims, dtype and packed layout). It may be
    /// the logits' own memory (computed in place) but must not overlap it otherwise.
    pub d_logits: &'a TensorMut<'a>,
}

/// The validated sizes: `(rows, classes, the targets' stride)`.
fn check_problem(op: &'static str, logits: &TensorRef, targets: &TensorRef, ignore: &[i64]) -> Result<(i64, i64, i64)> {
    check_tensor(op, "logits", logits)?;
    let &[rows, classes] = logits.dims() else {
        return Err(Error::invalid_arg(
            op,
            "logits",
            format!("dims {:?} are not [rows, classes]", logits.dims()),
        ));
    };
    if !matches!(logits.dtype(), DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::invalid_arg(
            op,
            "logits",
            format!("dtype {:?} is not supported (F32, F16 or BF16)", logits.dtype()),
        ));
    }
    if classes == 0 {
        return Err(Error::invalid_arg(
            op,
            "logits",
            "no classes: the softmax of an empty row is undefined",
        ));
    }
    check_packed_rows(op, "logits", logits, "classes")?;
    check_aligned(op, "logits", logits)?;
    check_tensor(op, "targets", targets)?;
    if targets.dims() != [rows] || targets.dtype() != DataType::I64 {
        return Err(Error::invalid_arg(
            op,
            "targets",
            format!(
                "{:?} {:?}: need [{rows}] I64 (one class per logits row)",
                targets.dims(),
                targets.dtype()
            ),
        ));
    }
    check_aligned(op, "targets", targets)?;
    if ignore.len() > MAX_IGNORE {
        return Err(Error::invalid_arg(
            op,
            "ignore",
            format!("{} values: at most {MAX_IGNORE}", ignore.len()),
        ));
    }
    Ok((rows, classes, targets.strides()[0]))
}

/// Checks a per-row f32 operand: `rows` packed F32 elements.
fn check_rows_f32(op: &'static str, arg: &'static str, t: &TensorRef, rows: i64) -> Result<()> {
    check_tensor(op, arg, t)?;
    if t.numel() != rows || t.dtype() != DataType::F32 || !t.is_packed() {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("{:?} {:?}: need {rows} packed F32 elements", t.dims(), t.dtype()),
        ));
    }
    check_aligned(op, arg, t)
}

/// Checks a one-element F32, F16 or BF16 operand.
fn check_scalar(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<()> {
    check_tensor(op, arg, t)?;
    if t.numel() != 1 || !matches!(t.dtype(), DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("{:?} {:?}: need one F32, F16 or BF16 element", t.dims(), t.dtype()),
        ));
    }
    check_aligned(op, arg, t)
}

/// Checks that every written operand's memory meets no other operand's.
fn check_written_apart(
    op: &'static str,
    written: &[(&'static str, &TensorRef)],
    read: &[(&'static str, &TensorRef)],
) -> Result<()> {
    for (i, &(arg, out)) in written.iter().enumerate() {
        for &(other, t) in written[..i].iter().chain(read) {
            check_disjoint(op, arg, out, other, t)?;
        }
    }
    Ok(())
}

fn problem(
    targets: &TensorRef,
    t_stride: i64,
    rows: i64,
    classes: i64,
    ignore: &[i64],
    mean_over: CrossEntropyMean,
) -> XentProblem {
    XentProblem {
        targets: targets.address(),
        t_stride,
        rows,
        k: classes,
        ignore: ignore_set(ignore),
        counted: i32::from(mean_over == CrossEntropyMean::TargetRows),
    }
}

/// Cross-entropy forward over `logits [rows, classes]` and `targets [rows]`: writes the row
/// log-sum-exp, and the row losses and their mean when asked. Ignored rows have loss 0; a
/// target outside `[0, classes)` that is not ignored gives its row a NaN loss (see the module
/// docs). With no rows the mean is NaN (0 / 0).
pub fn cross_entropy_forward(stream: &Arc<CudaStream>, a: &CrossEntropyForward<'_>) -> Result<()> {
    const OP: &str = "cross_entropy_forward";
    let (rows, classes, t_stride) = check_problem(OP, a.logits, a.targets, a.ignore)?;
    check_rows_f32(OP, "lse", a.lse, rows)?;
    if let Some(l) = a.row_loss {
        check_rows_f32(OP, "row_loss", l, rows)?;
    }
    if let Some(m) = a.mean {
        check_scalar(OP, "mean", m)?;
    }
    let mut written = vec![("lse", &**a.lse)];
    written.extend(a.row_loss.map(|l| ("row_loss", &**l)));
    written.extend(a.mean.map(|m| ("mean", &**m)));
    check_written_apart(OP, &written, &[("logits", a.logits), ("targets", a.targets)])?;
    check_on_stream_device(
        stream,
        OP,
        &[
            ("logits", Some(a.logits)),
            ("targets", Some(a.targets)),
            ("lse", Some(a.lse)),
            ("row_loss", a.row_loss.map(|l| &**l)),
            ("mean", a.mean.map(|m| &**m)),
        ],
    )?;
    let p = problem(a.targets, t_stride, rows, classes, a.ignore, a.mean_over);
    let variant = Variant::for_classes(classes);
    let [fwd, mean] = stream_functions(
        stream,
        CROSS_ENTROPY,
        [variant.entry(Kernel::Forward, a.logits.dtype()), MEAN],
    )?;
    let run = |loss: crate::types::DeviceAddress| -> Result<()> {
        if rows > 0 {
            launch::forward(
                stream,
                &fwd,
                variant.grid(),
                &p,
                a.logits.address(),
                [loss, a.lse.address()],
            )?;
        }
        match a.mean {
            Some(m) => launch::mean(stream, &mean, &p, loss, m.address(), scalar_code(m.dtype())),
            None => Ok(()),
        }
    };
    match a.row_loss {
        Some(l) => run(l.address()),
        None => with_workspace(stream, rows as usize * 4, run),
    }
}

/// Cross-entropy backward: `d_logits = grad / denominator · (softmax(logits) - onehot(target))`
/// per row from the forward's log-sum-exp, zero on ignored rows and NaN on rows whose target
/// is outside `[0, classes)`. One read of the logits and one write of the gradient, which may
/// replace the logits in place.
pub fn cross_entropy_backward(stream: &Arc<CudaStream>, a: &CrossEntropyBackward<'_>) -> Result<()> {
    const OP: &str = "cross_entropy_backward";
    let (rows, classes, t_stride) = check_problem(OP, a.logits, a.targets, a.ignore)?;
    check_rows_f32(OP, "lse", a.lse, rows)?;
    check_scalar(OP, "grad", a.grad)?;
    let dx = &**a.d_logits;
    check_tensor(OP, "d_logits", dx)?;
    if dx.dims() != a.logits.dims() || dx.dtype() != a.logits.dtype() {
        return Err(Error::invalid_arg(
            OP,
            "d_logits",
            format!(
                "{:?} {:?}: need the logits' {:?} {:?}",
                dx.dims(),
                dx.dtype(),
                a.logits.dims(),
                a.logits.dtype()
            ),
        ));
    }
    check_packed_rows(OP, "d_logits", dx, "classes")?;
    check_aligned(OP, "d_logits", dx)?;
    let in_place = dx.ptr() == a.logits.ptr();
    let mut read = vec![("targets", a.targets), ("lse", a.lse), ("grad", a.grad)];
    if !in_place {
        read.push(("logits", a.logits));
    }
    check_written_apart(OP, &[("d_logits", dx)], &read)?;
    check_on_stream_device(
        stream,
        OP,
        &[
            ("logits", Some(a.logits)),
            ("targets", Some(a.targets)),
            ("lse", Some(a.lse)),
            ("grad", Some(a.grad)),
            ("d_logits", Some(dx)),
        ],
    )?;
    if rows == 0 {
        return Ok(());
    }
    let p = problem(a.targets, t_stride, rows, classes, a.ignore, a.mean_over);
    let variant = Variant::for_classes(classes);
    let [bwd, scale] = stream_functions(
        stream,
        CROSS_ENTROPY,
        [variant.entry(Kernel::Backward, a.logits.dtype()), SCALE],
    )?;
    let vec = vectors_line_up(a.logits.ptr(), dx.ptr());
    with_workspace(stream, 4, |ws| {
        launch::scale(stream, &scale, &p, a.grad.address(), scalar_code(a.grad.dtype()), ws)?;
        launch::backward(
            stream,
            &bwd,
            variant.grid(),
            &p,
            a.logits.address(),
            [a.lse.address(), ws],
            vec,
            dx.address(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::invalid_argument;

    fn problem_of(logits: &TensorRef, targets: &TensorRef, ignore: &[i64]) -> Result<(i64, i64, i64)> {
        check_problem("xent", logits, targets, ignore)
    }

    #[test]
    fn packed_rows_with_i64_targets_are_accepted() {
        let x = TensorRef::fake_packed(&[6, 50_257], DataType::BF16, 4096);
        let t = TensorRef::fake_packed(&[6], DataType::I64, 1 << 30);
        assert_eq!(problem_of(&x, &t, &[0]).unwrap(), (6, 50_257, 1));
        // Strided targets and a single row of any stride.
        let t2 = TensorRef::fake(&[6], &[3], DataType::I64, 1 << 30);
        assert_eq!(problem_of(&x, &t2, &[]).unwrap().2, 3);
        let one = TensorRef::fake(&[1, 10], &[77, 1], DataType::F32, 4096);
        let t1 = TensorRef::fake_packed(&[1], DataType::I64, 1 << 30);
        assert_eq!(problem_of(&one, &t1, &[]).unwrap(), (1, 10, 1));
    }

    #[test]
    fn bad_operands_are_typed_errors() {
        let t = TensorRef::fake_packed(&[4], DataType::I64, 1 << 30);
        let cases: Vec<(TensorRef, TensorRef, Vec<i64>, &str)> = vec![
            (
                TensorRef::fake_packed(&[4, 10], DataType::F64, 4096),
                t.clone(),
                vec![],
                "logits",
            ),
            (
                TensorRef::fake_packed(&[4, 10, 2], DataType::F32, 4096),
                t.clone(),
                vec![],
                "logits",
            ),
            (
                TensorRef::fake_packed(&[4, 0], DataType::F32, 4096),
                t.clone(),
                vec![],
                "logits",
            ),
            // Transposed (column-major) and gapped rows.
            (
                TensorRef::fake(&[4, 10], &[1, 4], DataType::F32, 4096),
                t.clone(),
                vec![],
                "logits",
            ),
            (
                TensorRef::fake(&[4, 10], &[12, 1], DataType::F32, 4096),
                t.clone(),
                vec![],
                "logits",
            ),
            // Misaligned logits.
            (
                TensorRef::fake_packed(&[4, 10], DataType::F32, 4098),
                t.clone(),
                vec![],
                "logits",
            ),
            (
                TensorRef::fake_packed(&[4, 10], DataType::F32, 4096),
                TensorRef::fake_packed(&[4], DataType::I32, 1 << 30),
                vec![],
                "targets",
            ),
            (
                TensorRef::fake_packed(&[4, 10], DataType::F32, 4096),
                TensorRef::fake_packed(&[5], DataType::I64, 1 << 30),
                vec![],
                "targets",
            ),
            (
                TensorRef::fake_packed(&[4, 10], DataType::F32, 4096),
                t.clone(),
                (0..9).collect(),
                "ignore",
            ),
        ];
        for (x, tg, ign, arg) in cases {
            let (op, got, reason) = invalid_argument(problem_of(&x, &tg, &ign));
            assert_eq!((op, got), ("xent", arg), "{x:?} {tg:?}: {reason}");
        }
    }

    #[test]
    fn outputs_are_checked_for_shape_dtype_and_overlap() {
        let lse = TensorRef::fake_packed(&[4], DataType::F32, 8192);
        check_rows_f32("xent", "lse", &lse, 4).unwrap();
        let (_, arg, _) = invalid_argument(check_rows_f32("xent", "lse", &lse, 5));
        assert_eq!(arg, "lse");
        let half = TensorRef::fake_packed(&[4], DataType::F16, 8192);
        assert!(check_rows_f32("xent", "lse", &half, 4).is_err());
        let gapped = TensorRef::fake(&[4], &[2], DataType::F32, 8192);
        assert!(check_rows_f32("xent", "lse", &gapped, 4).is_err());
        check_scalar("xent", "mean", &TensorRef::fake_packed(&[1], DataType::BF16, 256)).unwrap();
        check_scalar("xent", "mean", &TensorRef::fake_packed(&[], DataType::F32, 256)).unwrap();
        assert!(check_scalar("xent", "mean", &TensorRef::fake_packed(&[2], DataType::F32, 256)).is_err());
        assert!(check_scalar("xent", "mean", &TensorRef::fake_packed(&[1], DataType::I64, 256)).is_err());
        // An lse inside the logits, and two outputs on one buffer.
        let x = TensorRef::fake_packed(&[4, 10], DataType::F32, 4096);
        let inside = TensorRef::fake_packed(&[4], DataType::F32, 4096 + 16);
        let (_, arg, reason) = invalid_argument(check_written_apart("xent", &[("lse", &inside)], &[("logits", &x)]));
        assert_eq!(arg, "lse", "{reason}");
        let (_, arg, _) = invalid_argument(check_written_apart(
            "xent",
            &[("lse", &lse), ("row_loss", &lse)],
            &[("logits", &x)],
        ));
        assert_eq!(arg, "row_loss");
        check_written_apart("xent", &[("lse", &lse)], &[("logits", &x)]).unwrap();
    }
}
