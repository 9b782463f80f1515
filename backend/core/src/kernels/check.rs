//! Argument checks shared by every kernel family: each returns an `InvalidArgument` error
//! naming the op and the argument.

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::graph::{may_overlap, DataType};
use crate::kernels::layout::kernel_layout;
use cudarc::driver::CudaStream;

use crate::types::TensorRef;

/// Checks that every operand may be used on `stream` (a view of a cudarc slice only on the
/// stream it was lent to): the first check of every public kernel entry point.
pub(crate) fn on_stream(stream: &CudaStream, op: &'static str, operands: &[(&'static str, &TensorRef)]) -> Result<()> {
    operands
        .iter()
        .try_for_each(|&(arg, t)| t.check_stream(stream, op, arg))
}

/// [`on_stream`] for operands that may be absent.
pub(crate) fn on_stream_opt(
    stream: &CudaStream,
    op: &'static str,
    operands: &[(&'static str, Option<&TensorRef>)],
) -> Result<()> {
    operands
        .iter()
        .filter_map(|&(arg, t)| t.map(|t| (arg, t)))
        .try_for_each(|(arg, t)| t.check_stream(stream, op, arg))
}

/// Checks one operand's own consistency (dims vs strides, no negative dims, an element
/// count that fits i64, a non-null pointer when non-empty); returns its element count.
pub(crate) fn check_tensor(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<i64> {
    check_layout(op, arg, &t.dims, &t.strides, t.ptr)
}

/// [`check_tensor`] on the parts of an operand.
pub(crate) fn check_layout(
    op: &'static str,
    arg: &'static str,
    dims: &[i64],
    strides: &[i64],
    ptr: u64,
) -> Result<i64> {
    if dims.len() != strides.len() {
        let msg = format!("{} dims but {} strides", dims.len(), strides.len());
        return Err(Error::invalid_arg(op, arg, msg));
    }
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(Error::invalid_arg(op, arg, format!("negative dim {d} in {dims:?}")));
    }
    let numel = dims
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::invalid_arg(op, arg, format!("{dims:?} has too many elements")))?;
    if numel > 0 && ptr == 0 {
        return Err(Error::invalid_arg(op, arg, "null device pointer"));
    }
    Ok(numel)
}

/// [`check_tensor`] for an `[N, C, H, W]` operand.
pub(crate) fn check_rank4(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<i64> {
    if t.dims.len() != 4 {
        let msg = format!("rank {} ({:?}) is not 4 ([N, C, H, W])", t.dims.len(), t.dims);
        return Err(Error::invalid_arg(op, arg, msg));
    }
    check_tensor(op, arg, t)
}

/// Checks that no two elements of a written operand share an address.
pub(crate) fn check_no_overlap(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<()> {
    if may_overlap(&t.dims, &t.strides) {
        let msg = format!(
            "dims {:?} with strides {:?} overlap (a 0 or too small stride)",
            t.dims, t.strides
        );
        return Err(Error::invalid_arg(op, arg, msg));
    }
    Ok(())
}

/// Checks that `t` has dtype `want`, the dtype of the operand named `of`.
pub(crate) fn same_dtype(op: &'static str, arg: &'static str, t: &TensorRef, want: DataType, of: &str) -> Result<()> {
    if t.dtype != want {
        let msg = format!("dtype {:?} differs from {of}'s {want:?}", t.dtype);
        return Err(Error::invalid_arg(op, arg, msg));
    }
    Ok(())
}

/// Position of a float dtype in per-dtype entry tables ordered F32, F16, BF16, F64.
pub(crate) fn float_slot(op: &'static str, arg: &'static str, dtype: DataType) -> Result<usize> {
    match dtype {
        DataType::F32 => Ok(0),
        DataType::F16 => Ok(1),
        DataType::BF16 => Ok(2),
        DataType::F64 => Ok(3),
        d => Err(Error::invalid_arg(
            op,
            arg,
            format!("dtype {d:?} is not supported (F32, F16, BF16 or F64)"),
        )),
    }
}

/// The operand's own dims and strides as a [`KernelLayout`] (no merging).
pub(crate) fn view_layout(op: &'static str, t: &TensorRef) -> Result<KernelLayout> {
    kernel_layout(op, &t.dims, &t.strides)
}

/// The lowest and highest byte addresses (inclusive) of a non-empty view, or `None` when it
/// is empty (validated views: the extent fits in 64 bits).
fn byte_range(t: &TensorRef) -> Option<(u64, u64)> {
    if t.dims.contains(&0) {
        return None;
    }
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in t.dims.iter().zip(&t.strides) {
        let reach = (d as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    let size = t.dtype.size() as i128;
    let base = t.ptr as i128;
    let clamp = |v: i128| v.clamp(0, u64::MAX as i128) as u64;
    Some((clamp(base + lo * size), clamp(base + (hi + 1) * size - 1)))
}

/// Checks that the written operand's memory does not meet an input's.
pub(crate) fn check_disjoint(
    op: &'static str,
    arg: &'static str,
    out: &TensorRef,
    other: &str,
    input: &TensorRef,
) -> Result<()> {
    if let (Some((a0, a1)), Some((b0, b1))) = (byte_range(out), byte_range(input)) {
        if a0 <= b1 && b0 <= a1 {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("memory overlaps {other}'s (the output must not alias an input)"),
            ));
        }
    }
    Ok(())
}

/// Checks that a non-empty view's address is aligned to its element size.
pub(crate) fn check_aligned(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<()> {
    if !t.dims.contains(&0) && !t.ptr.is_multiple_of(t.dtype.size() as u64) {
        let msg = format!(
            "pointer {:#x} is not aligned to its {:?} element size ({} bytes)",
            t.ptr,
            t.dtype,
            t.dtype.size()
        );
        return Err(Error::invalid_arg(op, arg, msg));
    }
    Ok(())
}

/// Checks that a non-empty 2-D view `[rows, cols]` has packed rows (strides `[cols, 1]`;
/// a size-1 dim's stride is free). `cols` names the columns in the message (`features`,
/// `classes`).
pub(crate) fn check_packed_rows(op: &'static str, arg: &'static str, t: &TensorRef, cols: &str) -> Result<()> {
    let (d, st) = (&t.dims, &t.strides);
    if t.numel() > 0 && ((d[1] > 1 && st[1] != 1) || (d[0] > 1 && st[0] != d[1])) {
        let msg = format!("strides {st:?}: rows must be packed ([{cols}, 1]); pass a packed copy");
        return Err(Error::invalid_arg(op, arg, msg));
    }
    Ok(())
}
