//! Reductions (sum, prod, mean, max, min, any, all), arg-reductions (argmax, argmin) and
//! inclusive scans (cumsum, cumprod, cummax, cummin) along one axis, on strided views.
//!
//! Every call is validated and turned into a `RowPlan` by pure host code: the problem is
//! viewed as `n_out` rows of `len` elements, with the input's reduced axis moved last (so
//! row `o`, element `k` is the input's row-major index `o * len + k` of that permuted view),
//! dims merged where strides allow. The plan is then launched on the caller's stream; nothing
//! synchronizes.
//!
//! Accumulation: f32/f16/bf16 in f32 (f16/bf16 rounded on store), f64 in f64, integers and
//! bool in i64 (sums and products wrap to the output type). Max/Min (and CumMax/CumMin)
//! propagate NaN. Results are bitwise reproducible run to run: the summation order depends
//! only on the shape.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_reduce::{launch_rows, RowArgs, REDUCE_THREADS};
use crate::graph::{may_overlap, DataType};
use crate::kernels::layout::{coalesce, kernel_layout};
use crate::kernels::{stream_function, REDUCE};
use crate::ops::TensorRef;

/// A reduction along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (0 for an empty axis; integers wrap).
    Sum,
    /// Product (1 for an empty axis; integers wrap).
    Prod,
    /// Arithmetic mean (float dtypes only; NaN for an empty axis).
    Mean,
    /// Maximum (NaN propagates; an empty axis is an error).
    Max,
    /// Minimum (NaN propagates; an empty axis is an error).
    Min,
    /// True when some element is nonzero (output `Bool`; false for an empty axis).
    Any,
    /// True when every element is nonzero (output `Bool`; true for an empty axis).
    All,
}

impl ReduceOp {
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Mean => 2,
            ReduceOp::Max => 3,
            ReduceOp::Min => 4,
            ReduceOp::Any => 5,
            ReduceOp::All => 6,
        }
    }

    fn is_logical(self) -> bool {
        matches!(self, ReduceOp::Any | ReduceOp::All)
    }
}

/// An arg-reduction along one axis: the index (I64) of the first extreme element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgOp {
    /// Index of the first maximum.
    ArgMax,
    /// Index of the first minimum.
    ArgMin,
}

/// An inclusive scan along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Running sum (integers wrap).
    CumSum,
    /// Running product (integers wrap).
    CumProd,
    /// Running maximum (NaN propagates).
    CumMax,
    /// Running minimum (NaN propagates).
    CumMin,
}

impl ScanOp {
    fn code(self) -> i32 {
        match self {
            ScanOp::CumSum => 0,
            ScanOp::CumProd => 1,
            ScanOp::CumMax => 2,
            ScanOp::CumMin => 3,
        }
    }
}

/// Which kernel family a plan launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Reduce,
    Arg,
    Scan,
}

/// Everything one launch needs, computed without touching the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowPlan {
    /// Kernel entry point, e.g. `reduce_f32`.
    pub entry: &'static str,
    /// The launch arguments (pointers, layouts, sizes, op, group, blocks).
    pub args: RowArgs,
}

/// `reduce_<dt>`, `argreduce_<dt>` or `scan_<dt>` for `dtype` (bool shares `u8`).
pub(crate) fn entry(kind: Kind, dtype: DataType) -> &'static str {
    macro_rules! pick {
        ($p:literal) => {
            match dtype {
                DataType::F32 => concat!($p, "_f32"),
                DataType::F16 => concat!($p, "_f16"),
                DataType::BF16 => concat!($p, "_bf16"),
                DataType::F64 => concat!($p, "_f64"),
                DataType::I64 => concat!($p, "_i64"),
                DataType::I32 => concat!($p, "_i32"),
                DataType::I8 => concat!($p, "_i8"),
                DataType::U8 | DataType::Bool => concat!($p, "_u8"),
            }
        };
    }
    match kind {
        Kind::Reduce => pick!("reduce"),
        Kind::Arg => pick!("argreduce"),
        Kind::Scan => pick!("scan"),
    }
}

/// Threads per row of a reduction: one for short rows, a warp for medium ones, the whole
/// block for long rows or when there are few rows to spread.
pub(crate) fn reduce_group(n_out: i64, len: i64) -> u32 {
    if len > 1024 || (len > 64 && n_out <= 1024) {
        REDUCE_THREADS
    } else if len > 8 {
        32
    } else {
        1
    }
}

fn blocks_for(rows: i64, rows_per_block: i64) -> u32 {
    let b = (rows.max(1) as u64).div_ceil(rows_per_block.max(1) as u64);
    b.clamp(1, 65_535 * 8) as u32
}

fn check_pair(op: &'static str, x: &TensorRef, out: &TensorRef) -> Result<()> {
    x.check(op, "x")?;
    out.check(op, "out")?;
    x.dims
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::invalid_arg(op, "x", format!("{:?} has more than 2^63 elements", x.dims)))?;
    if may_overlap(&out.dims, &out.strides) {
        return Err(Error::invalid_arg(
            op,
            "out",
            format!("dims {:?} / strides {:?} overlap themselves", out.dims, out.strides),
        ));
    }
    Ok(())
}

fn check_axis(op: &'static str, x: &TensorRef, axis: usize) -> Result<()> {
    if axis >= x.dims.len() {
        return Err(Error::invalid_arg(
            op,
            "axis",
            format!("axis {axis} out of range for rank {} ({:?})", x.dims.len(), x.dims),
        ));
    }
    Ok(())
}

/// Packs `shape`/`strides` after merging (one operand alone: same elements, same order).
fn packed(op: &'static str, shape: &[i64], strides: &[i64]) -> Result<KernelLayout> {
    let (s, st) = coalesce(shape, &[strides.to_vec()]);
    kernel_layout(op, &s, &st[0])
}

/// The row layouts of `x` (axis last, `len` elements per row) and `out` (either one element
/// per row, or — for scans — the same rows as `x`), with the non-axis dims merged jointly.
fn row_layouts(
    op: &'static str,
    x: &TensorRef,
    out: &TensorRef,
    axis: usize,
    out_has_axis: bool,
) -> Result<(KernelLayout, KernelLayout, i64, i64)> {
    let rest = |v: &[i64]| -> Vec<i64> {
        v.iter()
            .enumerate()
            .filter(|&(i, _)| i != axis)
            .map(|(_, &d)| d)
            .collect()
    };
    let len = x.dims[axis];
    let (shape, strides) = coalesce(&rest(&x.dims), &[rest(&x.strides), rest(&out.strides)]);
    let n_out: i64 = shape.iter().product();
    let with_axis = |s: &[i64], a: i64| -> (Vec<i64>, Vec<i64>) {
        let mut sh = shape.clone();
        sh.push(len);
        let mut st = s.to_vec();
        st.push(a);
        (sh, st)
    };
    let (xs, xst) = with_axis(&strides[0], x.strides[axis]);
    let x_layout = packed(op, &xs, &xst)?;
    let out_layout = if out_has_axis {
        let (os, ost) = with_axis(&strides[1], out.strides[axis]);
        packed(op, &os, &ost)?
    } else {
        packed(op, &shape, &strides[1])?
    };
    Ok((x_layout, out_layout, n_out, len))
}

fn expect_dims(op: &'static str, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<()> {
    let mut want = x.dims.clone();
    want[axis] = 1;
    if out.dims != want {
        return Err(Error::invalid_arg(
            op,
            "out",
            format!(
                "dims {:?}, expected {want:?} (x {:?} reduced over axis {axis})",
                out.dims, x.dims
            ),
        ));
    }
    Ok(())
}

fn expect_dtype(op: &'static str, out: &TensorRef, want: DataType) -> Result<()> {
    if out.dtype != want {
        return Err(Error::invalid_arg(
            op,
            "out",
            format!("dtype {:?}, expected {want:?}", out.dtype),
        ));
    }
    Ok(())
}

fn check_reduce_dtype(name: &'static str, op: ReduceOp, x: &TensorRef, out: &TensorRef) -> Result<()> {
    if op == ReduceOp::Mean && !x.dtype.is_float() {
        return Err(Error::invalid_arg(
            name,
            "x",
            format!("Mean needs a float dtype, got {:?}", x.dtype),
        ));
    }
    if matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Mean) && x.dtype == DataType::Bool {
        return Err(Error::invalid_arg(
            name,
            "x",
            format!("{op:?} is not defined on Bool (cast first)"),
        ));
    }
    let want = if op.is_logical() { DataType::Bool } else { x.dtype };
    expect_dtype(name, out, want)
}

fn empty_axis_error(name: &'static str, what: &str, x: &TensorRef, axis: usize) -> Error {
    Error::invalid_arg(name, "x", format!("{what} of an empty axis {axis} (dims {:?})", x.dims))
}

/// Validates a `reduce` call and plans it; `None` when the output is empty.
pub(crate) fn plan_reduce(op: ReduceOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<Option<RowPlan>> {
    const NAME: &str = "reduce";
    check_pair(NAME, x, out)?;
    check_axis(NAME, x, axis)?;
    expect_dims(NAME, x, axis, out)?;
    check_reduce_dtype(NAME, op, x, out)?;
    if out.is_empty() {
        return Ok(None);
    }
    if x.dims[axis] == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(empty_axis_error(NAME, &format!("{op:?}"), x, axis));
    }
    let (x_layout, out_layout, n_out, len) = row_layouts(NAME, x, out, axis, false)?;
    Ok(Some(row_plan(
        entry(Kind::Reduce, x.dtype),
        x,
        out,
        (x_layout, out_layout, n_out, len),
        op.code(),
    )))
}

fn row_plan(
    entry: &'static str,
    x: &TensorRef,
    out: &TensorRef,
    (x_layout, out_layout, n_out, len): (KernelLayout, KernelLayout, i64, i64),
    op: i32,
) -> RowPlan {
    let group = reduce_group(n_out, len);
    RowPlan {
        entry,
        args: RowArgs {
            x: x.ptr,
            x_layout,
            out: out.ptr,
            out_layout,
            n_out,
            len,
            op,
            group: group as i32,
            blocks: blocks_for(n_out, (REDUCE_THREADS / group) as i64),
        },
    }
}

/// Validates a `reduce_all` call and plans it (always one row; an empty `x` is a row of
/// length 0, so sum/prod/any/all of nothing still write their identity).
pub(crate) fn plan_reduce_all(op: ReduceOp, x: &TensorRef, out: &TensorRef) -> Result<Option<RowPlan>> {
    const NAME: &str = "reduce_all";
    check_pair(NAME, x, out)?;
    if out.numel() != 1 {
        return Err(Error::invalid_arg(
            NAME,
            "out",
            format!("dims {:?}: expected exactly one element", out.dims),
        ));
    }
    check_reduce_dtype(NAME, op, x, out)?;
    let len = x.numel();
    if len == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(Error::invalid_arg(
            NAME,
            "x",
            format!("{op:?} of an empty tensor (dims {:?})", x.dims),
        ));
    }
    let x_layout = packed(NAME, &x.dims, &x.strides)?;
    let out_layout = KernelLayout::default();
    Ok(Some(row_plan(
        entry(Kind::Reduce, x.dtype),
        x,
        out,
        (x_layout, out_layout, 1, len),
        op.code(),
    )))
}

/// Validates an `arg_reduce` call and plans it; `None` when the output is empty.
pub(crate) fn plan_arg_reduce(op: ArgOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<Option<RowPlan>> {
    const NAME: &str = "arg_reduce";
    check_pair(NAME, x, out)?;
    check_axis(NAME, x, axis)?;
    expect_dims(NAME, x, axis, out)?;
    expect_dtype(NAME, out, DataType::I64)?;
    if out.is_empty() {
        return Ok(None);
    }
    if x.dims[axis] == 0 {
        return Err(empty_axis_error(NAME, &format!("{op:?}"), x, axis));
    }
    let layouts = row_layouts(NAME, x, out, axis, false)?;
    let code = match op {
        ArgOp::ArgMax => 0,
        ArgOp::ArgMin => 1,
    };
    Ok(Some(row_plan(entry(Kind::Arg, x.dtype), x, out, layouts, code)))
}

/// Validates a `scan` call and plans it; `None` when the output is empty.
pub(crate) fn plan_scan(op: ScanOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<Option<RowPlan>> {
    const NAME: &str = "scan";
    check_pair(NAME, x, out)?;
    check_axis(NAME, x, axis)?;
    if out.dims != x.dims {
        return Err(Error::invalid_arg(
            NAME,
            "out",
            format!("dims {:?}, expected {:?} (same as x)", out.dims, x.dims),
        ));
    }
    expect_dtype(NAME, out, x.dtype)?;
    if matches!(op, ScanOp::CumSum | ScanOp::CumProd) && x.dtype == DataType::Bool {
        return Err(Error::invalid_arg(
            NAME,
            "x",
            format!("{op:?} is not defined on Bool (cast first)"),
        ));
    }
    if out.is_empty() {
        return Ok(None);
    }
    let (x_layout, out_layout, n_out, len) = row_layouts(NAME, x, out, axis, true)?;
    // Short rows: one thread per row, sequential; long rows: one block per row.
    let (group, blocks) = if len <= 64 {
        (1u32, blocks_for(n_out, REDUCE_THREADS as i64))
    } else {
        (REDUCE_THREADS, blocks_for(n_out, 1))
    };
    Ok(Some(RowPlan {
        entry: entry(Kind::Scan, x.dtype),
        args: RowArgs {
            x: x.ptr,
            x_layout,
            out: out.ptr,
            out_layout,
            n_out,
            len,
            op: op.code(),
            group: group as i32,
            blocks,
        },
    }))
}

fn launch(stream: &Arc<CudaStream>, plan: Option<RowPlan>) -> Result<()> {
    let Some(plan) = plan else { return Ok(()) };
    let f = stream_function(stream, REDUCE, plan.entry)?;
    launch_rows(stream, &f, &plan.args)
}

/// Reduces `x` over `axis` into `out` (dims of `x` with `dims[axis] = 1`; dtype of `x`,
/// or `Bool` for [`ReduceOp::Any`]/[`ReduceOp::All`]). Enqueued on `stream`, never synced.
pub fn reduce(stream: &Arc<CudaStream>, op: ReduceOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<()> {
    launch(stream, plan_reduce(op, x, axis, out)?)
}

/// Reduces every element of `x` into the single element of `out` (any rank, all dims 1).
pub fn reduce_all(stream: &Arc<CudaStream>, op: ReduceOp, x: &TensorRef, out: &TensorRef) -> Result<()> {
    launch(stream, plan_reduce_all(op, x, out)?)
}

/// Writes into `out` (I64, dims of `x` with `dims[axis] = 1`) the index along `axis` of the
/// first maximum/minimum. A NaN is selected only when it is the first element of its row.
pub fn arg_reduce(stream: &Arc<CudaStream>, op: ArgOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<()> {
    launch(stream, plan_arg_reduce(op, x, axis, out)?)
}

/// Inclusive scan of `x` along `axis` into `out` (same dims and dtype).
pub fn scan(stream: &Arc<CudaStream>, op: ScanOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<()> {
    launch(stream, plan_scan(op, x, axis, out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef {
        TensorRef::contiguous(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef {
        TensorRef::new(dims, strides, dtype, P)
    }

    /// Host model of the kernel's index math: element (o, k) of the plan.
    fn offset(l: &KernelLayout, mut i: i64) -> i64 {
        let mut off = l.offset;
        for d in (0..l.rank as usize).rev() {
            off += (i % l.shape[d]) * l.strides[d];
            i /= l.shape[d];
        }
        off
    }

    /// Offsets of x (row-major over its dims) at which reducing `axis` visits (o, k).
    fn expected_offsets(x: &TensorRef, axis: usize) -> Vec<Vec<i64>> {
        let rank = x.dims.len();
        let mut order: Vec<usize> = (0..rank).filter(|&d| d != axis).collect();
        order.push(axis);
        let dims: Vec<i64> = order.iter().map(|&d| x.dims[d]).collect();
        let n: i64 = dims.iter().product();
        let len = x.dims[axis];
        let mut rows = vec![Vec::new(); (n / len.max(1)) as usize];
        for i in 0..n {
            let mut r = i;
            let mut off = 0;
            for j in (0..rank).rev() {
                off += (r % dims[j]) * x.strides[order[j]];
                r /= dims[j];
            }
            rows[(i / len) as usize].push(off);
        }
        rows
    }

    fn plan_offsets(p: &RowPlan) -> Vec<Vec<i64>> {
        let a = &p.args;
        (0..a.n_out)
            .map(|o| (0..a.len).map(|k| offset(&a.x_layout, o * a.len + k)).collect())
            .collect()
    }

    #[test]
    fn axis_is_moved_last_for_every_axis_and_layout() {
        let cases: Vec<TensorRef> = vec![
            t(&[2, 3, 4], DataType::F32),
            ts(&[2, 3, 4], &[1, 2, 6], DataType::F32),  // fully transposed
            ts(&[2, 3, 4], &[0, 4, 1], DataType::F32),  // broadcast dim 0
            ts(&[2, 3, 4], &[24, 8, 2], DataType::F32), // gaps
            ts(&[5, 1, 3], &[3, 3, 1], DataType::F32),
        ];
        for x in &cases {
            for axis in 0..3 {
                let mut od = x.dims.clone();
                od[axis] = 1;
                let out = t(&od, DataType::F32);
                let p = plan_reduce(ReduceOp::Sum, x, axis, &out).unwrap().unwrap();
                assert_eq!(p.entry, "reduce_f32");
                assert_eq!(p.args.len, x.dims[axis]);
                assert_eq!(plan_offsets(&p), expected_offsets(x, axis), "{x:?} axis {axis}");
                // Output rows are enumerated row-major over the remaining dims.
                let offs: Vec<i64> = (0..p.args.n_out).map(|o| offset(&p.args.out_layout, o)).collect();
                assert_eq!(offs, (0..p.args.n_out).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn packed_rows_merge_into_few_dims() {
        let x = t(&[4, 5, 6, 7], DataType::F16);
        let p = plan_reduce(ReduceOp::Sum, &x, 3, &t(&[4, 5, 6, 1], DataType::F16))
            .unwrap()
            .unwrap();
        assert_eq!((p.args.x_layout.rank, p.args.out_layout.rank), (1, 1));
        assert_eq!((p.args.n_out, p.args.len), (120, 7));
        let p = plan_reduce(ReduceOp::Max, &x, 1, &t(&[4, 1, 6, 7], DataType::F16))
            .unwrap()
            .unwrap();
        assert_eq!(p.args.x_layout.rank, 3);
        assert_eq!(&p.args.x_layout.shape[..3], &[4, 42, 5]);
        assert_eq!(&p.args.x_layout.strides[..3], &[210, 1, 42]);
    }

    #[test]
    fn scan_output_layout_follows_the_input_rows() {
        let x = ts(&[3, 4], &[1, 3], DataType::I32); // transposed
        let out = ts(&[3, 4], &[8, 2], DataType::I32); // strided
        for axis in 0..2 {
            let p = plan_scan(ScanOp::CumSum, &x, axis, &out).unwrap().unwrap();
            assert_eq!(p.entry, "scan_i32");
            let xo = plan_offsets(&p);
            let a = p.args;
            let oo: Vec<Vec<i64>> = (0..a.n_out)
                .map(|o| (0..a.len).map(|k| offset(&a.out_layout, o * a.len + k)).collect())
                .collect();
            assert_eq!(xo, expected_offsets(&x, axis));
            assert_eq!(oo, expected_offsets(&out, axis));
            assert_eq!(a.group, 1);
        }
        let long = t(&[2, 1000], DataType::F32);
        let p = plan_scan(ScanOp::CumMax, &long, 1, &long).unwrap().unwrap();
        assert_eq!((p.args.group, p.args.blocks, p.args.op), (256, 2, 2));
    }

    #[test]
    fn reduce_all_flattens_in_row_major_order() {
        let x = ts(&[3, 4], &[1, 3], DataType::F64);
        let out = t(&[1, 1], DataType::F64);
        let p = plan_reduce_all(ReduceOp::Prod, &x, &out).unwrap().unwrap();
        assert_eq!((p.args.n_out, p.args.len, p.args.op), (1, 12, 1));
        let offs: Vec<i64> = (0..12).map(|i| offset(&p.args.x_layout, i)).collect();
        assert_eq!(offs, vec![0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]);
        assert_eq!(p.args.out_layout.rank, 0);
        let p = plan_reduce_all(ReduceOp::Sum, &t(&[0, 3], DataType::I32), &t(&[1], DataType::I32))
            .unwrap()
            .unwrap();
        assert_eq!(p.args.len, 0);
    }

    #[test]
    fn groups_and_entries() {
        assert_eq!(reduce_group(1, 100_000), 256);
        assert_eq!(reduce_group(100_000, 100), 32);
        assert_eq!(reduce_group(10, 100), 256);
        assert_eq!(reduce_group(1_000_000, 3), 1);
        assert_eq!(entry(Kind::Arg, DataType::Bool), "argreduce_u8");
        assert_eq!(entry(Kind::Scan, DataType::BF16), "scan_bf16");
        let p = plan_reduce(
            ReduceOp::Sum,
            &t(&[1, 100_000], DataType::F32),
            1,
            &t(&[1, 1], DataType::F32),
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.args.group, p.args.blocks), (256, 1));
        let p = plan_reduce(
            ReduceOp::Sum,
            &t(&[100_000, 3], DataType::F32),
            1,
            &t(&[100_000, 1], DataType::F32),
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.args.group, p.args.blocks), (1, 391));
    }

    fn arg_err(r: Result<Option<RowPlan>>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn invalid_calls_are_typed_errors() {
        let x = t(&[2, 3], DataType::F32);
        let o = t(&[2, 1], DataType::F32);
        assert_eq!(arg_err(plan_reduce(ReduceOp::Sum, &x, 2, &o)), "axis");
        assert_eq!(arg_err(plan_reduce(ReduceOp::Sum, &x, 0, &o)), "out");
        assert_eq!(arg_err(plan_reduce(ReduceOp::Any, &x, 1, &o)), "out");
        assert!(plan_reduce(ReduceOp::Any, &x, 1, &t(&[2, 1], DataType::Bool)).is_ok());
        assert_eq!(
            arg_err(plan_reduce(ReduceOp::Sum, &x, 1, &t(&[2, 1], DataType::F16))),
            "out"
        );
        assert_eq!(
            arg_err(plan_reduce(ReduceOp::Sum, &x, 1, &t(&[2], DataType::F32))),
            "out"
        );
        let xi = t(&[2, 3], DataType::I32);
        assert_eq!(
            arg_err(plan_reduce(ReduceOp::Mean, &xi, 1, &t(&[2, 1], DataType::I32))),
            "x"
        );
        let xb = t(&[2, 3], DataType::Bool);
        assert_eq!(
            arg_err(plan_reduce(ReduceOp::Sum, &xb, 1, &t(&[2, 1], DataType::Bool))),
            "x"
        );
        let bad = TensorRef::new(&[2, 3], &[3], DataType::F32, P);
        assert_eq!(arg_err(plan_reduce(ReduceOp::Sum, &bad, 1, &o)), "x");
        let null = TensorRef::new(&[2, 3], &[3, 1], DataType::F32, 0);
        assert_eq!(arg_err(plan_reduce(ReduceOp::Sum, &null, 1, &o)), "x");
        // Output overlapping itself (a broadcast output).
        let o_bcast = ts(&[2, 1, 2], &[0, 1, 1], DataType::F32);
        let x3 = t(&[2, 3, 2], DataType::F32);
        assert_eq!(arg_err(plan_reduce(ReduceOp::Sum, &x3, 1, &o_bcast)), "out");
        // Empty axis.
        let xe = t(&[2, 0], DataType::F32);
        assert_eq!(arg_err(plan_reduce(ReduceOp::Max, &xe, 1, &o)), "x");
        assert_eq!(
            arg_err(plan_arg_reduce(ArgOp::ArgMin, &xe, 1, &t(&[2, 1], DataType::I64))),
            "x"
        );
        assert!(plan_reduce(ReduceOp::Sum, &xe, 1, &o).unwrap().is_some());
        assert!(plan_reduce(ReduceOp::All, &xe, 1, &t(&[2, 1], DataType::Bool))
            .unwrap()
            .is_some());
        // Empty output: nothing to launch, even for Max.
        let xz = t(&[0, 3], DataType::F32);
        assert!(plan_reduce(ReduceOp::Max, &xz, 1, &t(&[0, 1], DataType::F32))
            .unwrap()
            .is_none());
        // Arg-reduce output must be I64.
        assert_eq!(arg_err(plan_arg_reduce(ArgOp::ArgMax, &x, 1, &o)), "out");
        // Scans.
        assert_eq!(arg_err(plan_scan(ScanOp::CumSum, &x, 1, &o)), "out");
        assert_eq!(
            arg_err(plan_scan(ScanOp::CumSum, &x, 1, &t(&[2, 3], DataType::F64))),
            "out"
        );
        assert_eq!(arg_err(plan_scan(ScanOp::CumProd, &xb, 1, &xb)), "x");
        assert!(plan_scan(ScanOp::CumMax, &xb, 1, &xb).unwrap().is_some());
        assert!(plan_scan(ScanOp::CumSum, &xz, 0, &xz).unwrap().is_none());
        // reduce_all.
        assert_eq!(arg_err(plan_reduce_all(ReduceOp::Sum, &x, &o)), "out");
        assert_eq!(
            arg_err(plan_reduce_all(ReduceOp::Min, &xz, &t(&[1], DataType::F32))),
            "x"
        );
        // Too many dims after merging.
        let dims = [2i64; 10];
        let strides: Vec<i64> = (0..10).map(|i| 1i64 << (2 * (9 - i) + 1)).collect();
        let xw = ts(&dims, &strides, DataType::F32);
        let mut od = dims.to_vec();
        od[0] = 1;
        assert_eq!(
            arg_err(plan_reduce(ReduceOp::Sum, &xw, 0, &t(&od, DataType::F32))),
            "shape"
        );
    }

    #[test]
    fn overlap_detection() {
        assert!(!may_overlap(&[2, 3], &[3, 1]));
        assert!(!may_overlap(&[2, 3], &[1, 2]));
        assert!(!may_overlap(&[2, 3], &[8, 2]));
        assert!(!may_overlap(&[1, 3], &[0, 1]));
        assert!(may_overlap(&[2, 3], &[0, 1]));
        assert!(may_overlap(&[2, 3], &[2, 1]));
        assert!(!may_overlap(&[], &[]));
    }
}
