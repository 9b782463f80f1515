//! Reductions (sum, prod, mean, max, min, any, all), arg-reductions (argmax, argmin) and
//! inclusive scans (cumsum, cumprod, cummax, cummin) along one axis, on strided views.
//!
//! Every call is validated and turned into a `RowPlan` by pure host code: the problem is
//! viewed as `n_out` rows of `len` elements, with the input's reduced axis moved last (so
//! row `o`, element `k` is the input's row-major index `o * len + k` of that permuted view),
//! dims merged where strides allow. The plan is then launched on the caller's stream; nothing
//! synchronizes.
//!
//! `reduce` and `reduce_all` pick one of three paths (`ReducePlan`):
//! * rows: a group of 1, 32 or 256 threads per row (`reduce_<dt>`);
//! * split rows: few long rows (`SPLIT_MIN_LEN` or more elements, fewer than
//!   `FEW_BLOCKS` rows) are cut into chunks, one block each (`reduce_split_<dt>`), whose
//!   partials go to a stream-ordered scratch buffer of accumulators; `reduce_finish_<dt>`
//!   combines each row's partials in a fixed order;
//! * columns: when the reduced axis is not the innermost in memory and the outputs are
//!   contiguous in the input (`(outer, len, inner)` with inner stride 1), consecutive threads
//!   take consecutive outputs so warps read contiguous memory (`reduce_cols_<dt>`); few
//!   output tiles and a long axis split the axis across blocks through the same scratch.
//!
//! Accumulation: f32/f16/bf16 in f32 (f16/bf16 rounded on store), f64 in f64, integers and
//! bool in i64 (sums and products wrap to the output type). Max/Min (and CumMax/CumMin)
//! propagate NaN. Results are bitwise reproducible run to run: the summation order depends
//! only on the shape.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_reduce::{launch_cols, launch_rows, launch_split, ColArgs, RowArgs, SplitArgs, REDUCE_THREADS};
use crate::ffi::memory::DeviceBuffer;
use crate::graph::{may_overlap, DataType};
use crate::kernels::check::on_stream;
use crate::kernels::layout::{coalesce, kernel_layout};
use crate::kernels::{stream_function, stream_functions, REDUCE};
use crate::types::{TensorMut, TensorRef};

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
    /// Pass 1 of a split-row reduction (`reduce_split_<dt>`).
    Split,
    /// Column reduction, or its pass 1 when split (`reduce_cols_<dt>`).
    Cols,
    /// Pass 2 of a split reduction: partials to output (`reduce_finish_<dt>`).
    Finish,
}

/// Blocks below which a reduction leaves the GPU under-occupied (2 per SM of a 132-SM H100).
pub(crate) const FEW_BLOCKS: i64 = 264;
/// Blocks a split reduction aims for (rows x chunks, or column tiles x chunks).
pub(crate) const TARGET_BLOCKS: i64 = 1024;
/// Shortest row the split-row path takes.
pub(crate) const SPLIT_MIN_LEN: i64 = 8192;
/// Fewest input elements per chunk of a split (column chunks: rows x tile width).
pub(crate) const MIN_CHUNK: i64 = 2048;
/// Widest column tile: threads of a block along the contiguous output dim.
const MAX_TILE: i64 = 32;

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
        Kind::Split => pick!("reduce_split"),
        Kind::Cols => pick!("reduce_cols"),
        Kind::Finish => pick!("reduce_finish"),
    }
}

/// Bytes of one accumulator of `dtype` (f32 for f32/f16/bf16, f64, i64 for ints and bool).
pub(crate) fn acc_bytes(dtype: DataType) -> usize {
    match dtype {
        DataType::F32 | DataType::F16 | DataType::BF16 => 4,
        _ => 8,
    }
}

/// The first launch of a two-pass reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstPass {
    /// `reduce_split_<dt>`: chunks of few long rows.
    Split(&'static str, SplitArgs),
    /// `reduce_cols_<dt>` with the reduced axis split across `blockIdx.y`.
    Cols(&'static str, ColArgs),
}

impl FirstPass {
    fn entry(&self) -> &'static str {
        match self {
            FirstPass::Split(e, _) | FirstPass::Cols(e, _) => e,
        }
    }
}

/// Two launches through a scratch buffer of `parts * n_out` accumulators (chunk `c` of
/// output `o` at `c * n_out + o`); the scratch address (0 in the plan) is set at launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TwoPass {
    /// Pass 1: writes the partials.
    pub first: FirstPass,
    /// Pass 2 (`reduce_finish_<dt>`): the partials as `(1, parts, n_out)` to the output.
    pub finish: (&'static str, ColArgs),
    /// Bytes of scratch.
    pub scratch_bytes: usize,
}

impl TwoPass {
    /// Both launches with the scratch buffer at `scratch`.
    pub(crate) fn with_scratch(&self, scratch: crate::types::DeviceAddress) -> (FirstPass, ColArgs) {
        let first = match self.first {
            FirstPass::Split(e, a) => FirstPass::Split(e, SplitArgs { partial: scratch, ..a }),
            FirstPass::Cols(e, a) => FirstPass::Cols(e, ColArgs { partial: scratch, ..a }),
        };
        (
            first,
            ColArgs {
                x: scratch,
                ..self.finish.1
            },
        )
    }
}

/// How a `reduce` / `reduce_all` call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReducePlan {
    /// One `reduce_<dt>` launch (a group of threads per row).
    Rows(RowPlan),
    /// One `reduce_cols_<dt>` launch (consecutive threads on consecutive outputs).
    Cols(&'static str, ColArgs),
    /// Split rows or split columns.
    TwoPass(TwoPass),
}

/// `a / b` rounded up (`a >= 0`, `b > 0`).
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// Threads along the contiguous dim of a column tile: `inner` rounded up to a power of two,
/// at most [`MAX_TILE`].
fn tile_width(inner: i64) -> i64 {
    (inner.max(1) as u64).next_power_of_two().min(MAX_TILE as u64) as i64
}

/// `(parts, chunk)` cutting `len` into chunks of at least `min_len` elements (rounded up to
/// a multiple of `align`) so that `units * parts` approaches [`TARGET_BLOCKS`]; `parts` is 1
/// when fewer than two chunks would result.
fn split_len(units: i64, len: i64, min_len: i64, align: i64) -> (i64, i64) {
    let parts = ceil_div(TARGET_BLOCKS, units.max(1)).min(len / min_len.max(1));
    if parts < 2 {
        return (1, len);
    }
    let chunk = ceil_div(ceil_div(len, parts), align) * align;
    let parts = ceil_div(len, chunk);
    if parts < 2 {
        (1, len)
    } else {
        (parts, chunk)
    }
}

/// The finish of a two-pass reduction: `parts` partials per output, read as the column
/// problem `(1, parts, n_out)`, stored through `out_layout` (mean divided by `mean_len`).
fn finish_args(
    n_out: i64,
    parts: i64,
    out: crate::types::DeviceAddress,
    out_layout: KernelLayout,
    mean_len: i64,
    op: i32,
) -> ColArgs {
    let tx = tile_width(n_out);
    ColArgs {
        x: crate::types::DeviceAddress::NULL,
        outer: 1,
        len: parts,
        inner: n_out,
        outer_stride: 0,
        len_stride: n_out,
        out,
        out_layout,
        partial: crate::types::DeviceAddress::NULL,
        chunk: parts,
        mean_len,
        op,
        tx: tx as i32,
        blocks: blocks_for(ceil_div(n_out, tx), 1),
        parts: 1,
    }
}

/// The split-row plan for `n_out` rows of `len` (`x_layout` as for `reduce_<dt>`), or `None`
/// when the rows are short or numerous enough for one block per row.
fn split_rows_plan(
    dtype: DataType,
    (x, x_layout): (crate::types::DeviceAddress, KernelLayout),
    (out, out_layout): (crate::types::DeviceAddress, KernelLayout),
    n_out: i64,
    len: i64,
    op: i32,
) -> Option<TwoPass> {
    if len < SPLIT_MIN_LEN || n_out >= FEW_BLOCKS {
        return None;
    }
    let (parts, chunk) = split_len(n_out, len, MIN_CHUNK, REDUCE_THREADS as i64);
    if parts < 2 {
        return None;
    }
    let first = SplitArgs {
        x,
        x_layout,
        partial: crate::types::DeviceAddress::NULL,
        n_out,
        len,
        chunk,
        parts,
        op,
        blocks: blocks_for(n_out * parts, 1),
    };
    Some(TwoPass {
        first: FirstPass::Split(entry(Kind::Split, dtype), first),
        finish: (
            entry(Kind::Finish, dtype),
            finish_args(n_out, parts, out, out_layout, len, op),
        ),
        scratch_bytes: (n_out * parts) as usize * acc_bytes(dtype),
    })
}

/// `x` reduced over `axis` as a column problem: `(outer, outer_stride, inner, out_layout)`
/// where the non-axis dims (ordered by decreasing stride in `x`, size-1 dims dropped) merge
/// into `outer x inner` with inner stride 1, and `out_layout` enumerates the outputs in that
/// order. `None` when they do not (e.g. the axis is innermost, or the inner dims have gaps).
fn col_geometry(
    op: &'static str,
    x: &TensorRef,
    out: &TensorRef,
    axis: usize,
) -> Option<(i64, i64, i64, KernelLayout)> {
    let mut rest: Vec<usize> = (0..x.dims.len()).filter(|&d| d != axis && x.dims[d] != 1).collect();
    rest.sort_by_key(|&d| std::cmp::Reverse(x.strides[d]));
    let pick = |v: &[i64]| -> Vec<i64> { rest.iter().map(|&d| v[d]).collect() };
    let shape = pick(&x.dims);
    let (xs, xst) = coalesce(&shape, &[pick(&x.strides)]);
    let (outer, outer_stride, inner) = match (xs.as_slice(), xst[0].as_slice()) {
        (&[n], &[1]) => (1, 0, n),
        (&[m, n], &[s, 1]) => (m, s, n),
        _ => return None,
    };
    let out_layout = packed(op, &shape, &pick(&out.strides)).ok()?;
    Some((outer, outer_stride, inner, out_layout))
}

/// The column plan of a `reduce` call, or `None` when its geometry is not a column problem
/// or the axis is shorter than 2.
fn col_plan(op: ReduceOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Option<ReducePlan> {
    let len = x.dims[axis];
    if len < 2 {
        return None;
    }
    let (outer, outer_stride, inner, out_layout) = col_geometry("reduce", x, out, axis)?;
    let tx = tile_width(inner);
    let tiles = outer * ceil_div(inner, tx);
    let args = ColArgs {
        x: x.address(),
        outer,
        len,
        inner,
        outer_stride,
        len_stride: x.strides[axis],
        out: out.address(),
        out_layout,
        partial: crate::types::DeviceAddress::NULL,
        chunk: len,
        mean_len: len,
        op: op.code(),
        tx: tx as i32,
        blocks: blocks_for(tiles, 1),
        parts: 1,
    };
    let cols = entry(Kind::Cols, x.dtype);
    if tiles < FEW_BLOCKS {
        let ty = REDUCE_THREADS as i64 / tx;
        let (parts, chunk) = split_len(tiles, len, ceil_div(MIN_CHUNK, tx), ty);
        if parts >= 2 {
            let n_out = outer * inner;
            return Some(ReducePlan::TwoPass(TwoPass {
                first: FirstPass::Cols(
                    cols,
                    ColArgs {
                        chunk,
                        parts: parts as u32,
                        ..args
                    },
                ),
                finish: (
                    entry(Kind::Finish, x.dtype),
                    finish_args(n_out, parts, out.address(), out_layout, len, op.code()),
                ),
                scratch_bytes: (n_out * parts) as usize * acc_bytes(x.dtype),
            }));
        }
    }
    Some(ReducePlan::Cols(cols, args))
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

/// Validates a `reduce` call and plans it (columns, then split rows, then rows: see the
/// module docs); `None` when the output is empty.
pub(crate) fn plan_reduce(op: ReduceOp, x: &TensorRef, axis: usize, out: &TensorRef) -> Result<Option<ReducePlan>> {
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
    if let Some(p) = col_plan(op, x, axis, out) {
        return Ok(Some(p));
    }
    Ok(Some(rows_or_split(x, out, (x_layout, out_layout, n_out, len), op)))
}

/// The split-row plan when it applies, else the one-launch row plan.
fn rows_or_split(
    x: &TensorRef,
    out: &TensorRef,
    layouts: (KernelLayout, KernelLayout, i64, i64),
    op: ReduceOp,
) -> ReducePlan {
    let (x_layout, out_layout, n_out, len) = layouts;
    match split_rows_plan(
        x.dtype,
        (x.address(), x_layout),
        (out.address(), out_layout),
        n_out,
        len,
        op.code(),
    ) {
        Some(t) => ReducePlan::TwoPass(t),
        None => ReducePlan::Rows(row_plan(entry(Kind::Reduce, x.dtype), x, out, layouts, op.code())),
    }
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
            x: x.address(),
            x_layout,
            out: out.address(),
            out_layout,
            n_out,
            len,
            op,
            group: group as i32,
            blocks: blocks_for(n_out, (REDUCE_THREADS / group) as i64),
        },
    }
}

/// Validates a `reduce_all` call and plans it (always one row, split when long; an empty
/// `x` is a row of length 0, so sum/prod/any/all of nothing still write their identity).
pub(crate) fn plan_reduce_all(op: ReduceOp, x: &TensorRef, out: &TensorRef) -> Result<Option<ReducePlan>> {
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
    Ok(Some(rows_or_split(x, out, (x_layout, out_layout, 1, len), op)))
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
            x: x.address(),
            x_layout,
            out: out.address(),
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

/// Enqueues a reduction plan. A two-pass plan allocates its scratch stream-ordered and frees
/// it stream-ordered after both launches (as `sort` does).
fn launch_reduce(stream: &Arc<CudaStream>, plan: Option<ReducePlan>) -> Result<()> {
    match plan {
        None => Ok(()),
        Some(ReducePlan::Rows(p)) => launch(stream, Some(p)),
        Some(ReducePlan::Cols(e, a)) => {
            let f = stream_function(stream, REDUCE, e)?;
            launch_cols(stream, &f, &a)
        }
        Some(ReducePlan::TwoPass(t)) => {
            let [first_fn, finish_fn] = stream_functions(stream, REDUCE, [t.first.entry(), t.finish.0])?;
            let scratch = DeviceBuffer::alloc(stream, t.scratch_bytes, "reduce")?;
            let (first, finish) = t.with_scratch(scratch.address());
            match first {
                FirstPass::Split(_, a) => launch_split(stream, &first_fn, &a)?,
                FirstPass::Cols(_, a) => launch_cols(stream, &first_fn, &a)?,
            }
            launch_cols(stream, &finish_fn, &finish)?;
            drop(scratch);
            Ok(())
        }
    }
}

/// Reduces `x` over `axis` into `out` (dims of `x` with `dims[axis] = 1`; dtype of `x`,
/// or `Bool` for [`ReduceOp::Any`]/[`ReduceOp::All`]). Enqueued on `stream`, never synced
/// (long rows and long columns use a stream-ordered scratch buffer of a few KiB).
pub fn reduce(stream: &Arc<CudaStream>, op: ReduceOp, x: &TensorRef, axis: usize, out: &TensorMut) -> Result<()> {
    on_stream(stream, "reduce", &[("x", x), ("out", out)])?;
    launch_reduce(stream, plan_reduce(op, x, axis, out)?)
}

/// Reduces every element of `x` into the single element of `out` (any rank, all dims 1).
pub fn reduce_all(stream: &Arc<CudaStream>, op: ReduceOp, x: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "reduce_all", &[("x", x), ("out", out)])?;
    launch_reduce(stream, plan_reduce_all(op, x, out)?)
}

/// Writes into `out` (I64, dims of `x` with `dims[axis] = 1`) the index along `axis` of the
/// first maximum/minimum. A NaN is selected only when it is the first element of its row.
pub fn arg_reduce(stream: &Arc<CudaStream>, op: ArgOp, x: &TensorRef, axis: usize, out: &TensorMut) -> Result<()> {
    on_stream(stream, "arg_reduce", &[("x", x), ("out", out)])?;
    launch(stream, plan_arg_reduce(op, x, axis, out)?)
}

/// Inclusive scan of `x` along `axis` into `out` (same dims and dtype).
pub fn scan(stream: &Arc<CudaStream>, op: ScanOp, x: &TensorRef, axis: usize, out: &TensorMut) -> Result<()> {
    on_stream(stream, "scan", &[("x", x), ("out", out)])?;
    launch(stream, plan_scan(op, x, axis, out)?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
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

    /// The row plan of a call the planner must leave on the row path.
    fn rows(p: Result<Option<ReducePlan>>) -> RowPlan {
        match p.unwrap().unwrap() {
            ReducePlan::Rows(r) => r,
            other => panic!("expected the row path, got {other:?}"),
        }
    }

    fn plan_offsets(p: &RowPlan) -> Vec<Vec<i64>> {
        let a = &p.args;
        (0..a.n_out)
            .map(|o| (0..a.len).map(|k| a.x_layout.host_offset(o * a.len + k)).collect())
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
                // The row path's layouts (whatever path the planner picks for this call).
                let layouts = row_layouts("t", x, &out, axis, false).unwrap();
                let p = row_plan("reduce_f32", x, &out, layouts, 0);
                assert_eq!(p.args.len, x.dims[axis]);
                assert_eq!(plan_offsets(&p), expected_offsets(x, axis), "{x:?} axis {axis}");
                // Output rows are enumerated row-major over the remaining dims.
                let offs: Vec<i64> = (0..p.args.n_out).map(|o| p.args.out_layout.host_offset(o)).collect();
                assert_eq!(offs, (0..p.args.n_out).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn packed_rows_merge_into_few_dims() {
        let x = t(&[4, 5, 6, 7], DataType::F16);
        let p = rows(plan_reduce(ReduceOp::Sum, &x, 3, &t(&[4, 5, 6, 1], DataType::F16)));
        assert_eq!((p.args.x_layout.rank, p.args.out_layout.rank), (1, 1));
        assert_eq!((p.args.n_out, p.args.len), (120, 7));
        let out = t(&[4, 1, 6, 7], DataType::F16);
        let p = row_plan("reduce_f16", &x, &out, row_layouts("t", &x, &out, 1, false).unwrap(), 3);
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
                .map(|o| (0..a.len).map(|k| a.out_layout.host_offset(o * a.len + k)).collect())
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
        let p = rows(plan_reduce_all(ReduceOp::Prod, &x, &out));
        assert_eq!((p.args.n_out, p.args.len, p.args.op), (1, 12, 1));
        let offs: Vec<i64> = (0..12).map(|i| p.args.x_layout.host_offset(i)).collect();
        assert_eq!(offs, vec![0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]);
        assert_eq!(p.args.out_layout.rank, 0);
        let p = rows(plan_reduce_all(
            ReduceOp::Sum,
            &t(&[0, 3], DataType::I32),
            &t(&[1], DataType::I32),
        ));
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
        let p = rows(plan_reduce(
            ReduceOp::Sum,
            &t(&[1, 5000], DataType::F32),
            1,
            &t(&[1, 1], DataType::F32),
        ));
        assert_eq!((p.args.group, p.args.blocks), (256, 1));
        let p = rows(plan_reduce(
            ReduceOp::Sum,
            &t(&[100_000, 3], DataType::F32),
            1,
            &t(&[100_000, 1], DataType::F32),
        ));
        assert_eq!((p.args.group, p.args.blocks), (1, 391));
    }

    fn arg_err<T: std::fmt::Debug>(r: Result<Option<T>>) -> &'static str {
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
        let bad = TensorRef::fake(&[2, 3], &[3], DataType::F32, P);
        assert_eq!(arg_err(plan_reduce(ReduceOp::Sum, &bad, 1, &o)), "x");
        let null = TensorRef::fake(&[2, 3], &[3, 1], DataType::F32, 0);
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

    // ---- host simulation of the kernels' index math -------------------------------------

    /// Where a block's result goes: an output offset, or a scratch slot.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Dest {
        Out(i64),
        Part(i64),
    }

    /// Per destination, the input offsets (or scratch slots) folded into it.
    type Reads = BTreeMap<Dest, Vec<i64>>;

    const THREADS: i64 = REDUCE_THREADS as i64;
    const SCRATCH: u64 = 0x9000_0000;

    fn put(m: &mut Reads, d: Dest, reads: Vec<i64>) {
        assert!(m.insert(d, reads).is_none(), "{d:?} written twice");
    }

    /// `rows_are_linear` / `row_step` of reduce.cu.
    fn linear_step(l: &KernelLayout, len: i64) -> Option<i64> {
        let r = l.rank as usize;
        (len > 0 && (r == 0 || l.shape[r - 1] % len == 0)).then(|| if r == 0 { 0 } else { l.strides[r - 1] })
    }

    /// `red_row_range` of reduce.cu: offsets of elements k0, k0 + step, ... < k1 of row o.
    fn row_range(l: &KernelLayout, o: i64, len: i64, k0: i64, k1: i64, step: i64) -> Vec<i64> {
        let ks = (k0..k1).step_by(step as usize);
        match linear_step(l, len) {
            Some(s) => {
                let base = l.host_offset(o * len);
                ks.map(|k| base + k * s).collect()
            }
            None => ks.map(|k| l.host_offset(o * len + k)).collect(),
        }
    }

    /// `reduce_impl`: every (block, grid-stride step, thread).
    fn sim_rows(a: &RowArgs) -> Reads {
        let group = a.group as i64;
        let per_block = THREADS / group;
        let mut m = Reads::new();
        for block in 0..a.blocks as i64 {
            let mut base = block * per_block;
            while base < a.n_out {
                let mut acc: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
                for tid in 0..THREADS {
                    let (lane, o) = (tid % group, base + tid / group);
                    if o < a.n_out {
                        let r = row_range(&a.x_layout, o, a.len, lane, a.len, group);
                        acc.entry(o).or_default().extend(r);
                    }
                }
                for (o, r) in acc {
                    put(&mut m, Dest::Out(a.out_layout.host_offset(o)), r);
                }
                base += a.blocks as i64 * per_block;
            }
        }
        m
    }

    /// `reduce_split_impl`.
    fn sim_split(a: &SplitArgs) -> Reads {
        let mut m = Reads::new();
        for block in 0..a.blocks as i64 {
            let mut b = block;
            while b < a.n_out * a.parts {
                let (o, c) = (b / a.parts, b % a.parts);
                let (k0, k1) = (c * a.chunk, (c * a.chunk + a.chunk).min(a.len));
                let r = (0..THREADS)
                    .flat_map(|tid| row_range(&a.x_layout, o, a.len, k0 + tid, k1, THREADS))
                    .collect();
                put(&mut m, Dest::Part(c * a.n_out + o), r);
                b += a.blocks as i64;
            }
        }
        m
    }

    /// `reduce_cols_impl` (also the finish, whose "input offsets" are scratch slots).
    fn sim_cols(a: &ColArgs) -> Reads {
        let tx = a.tx as i64;
        assert!((tx as u64).is_power_of_two() && tx <= MAX_TILE);
        let ty = THREADS / tx;
        let tiles_per_outer = ceil_div(a.inner, tx);
        let n_out = a.outer * a.inner;
        assert!(
            a.partial != crate::types::DeviceAddress::NULL || a.parts == 1,
            "an unsplit launch stores its results"
        );
        let mut m = Reads::new();
        for c in 0..a.parts as i64 {
            let (k0, k1) = (c * a.chunk, (c * a.chunk + a.chunk).min(a.len));
            for block in 0..a.blocks as i64 {
                let mut t = block;
                while t < a.outer * tiles_per_outer {
                    let i = t / tiles_per_outer;
                    let mut acc: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
                    for tid in 0..THREADS {
                        let (lx, ly) = (tid % tx, tid / tx);
                        let j = (t - i * tiles_per_outer) * tx + lx;
                        if j < a.inner {
                            let base = i * a.outer_stride + j;
                            let r = (k0 + ly..k1).step_by(ty as usize).map(|k| base + k * a.len_stride);
                            acc.entry(j).or_default().extend(r);
                        }
                    }
                    for (j, r) in acc {
                        let o = i * a.inner + j;
                        let d = if a.partial != crate::types::DeviceAddress::NULL {
                            Dest::Part(c * n_out + o)
                        } else {
                            Dest::Out(a.out_layout.host_offset(o))
                        };
                        put(&mut m, d, r);
                    }
                    t += a.blocks as i64;
                }
            }
        }
        m
    }

    /// Simulates `plan` end to end: per output offset, the sorted input offsets that reach it
    /// (through the scratch for two-pass plans, each partial written and read exactly once).
    /// Also checks the mean divisor and the scratch size.
    fn simulate(plan: &ReducePlan, dtype: DataType, full_len: i64) -> BTreeMap<i64, Vec<i64>> {
        let m = match plan {
            ReducePlan::Rows(p) => {
                assert_eq!(p.args.len, full_len);
                sim_rows(&p.args)
            }
            ReducePlan::Cols(_, a) => {
                assert_eq!(
                    (a.mean_len, a.len, a.partial),
                    (full_len, full_len, crate::types::DeviceAddress::NULL)
                );
                sim_cols(a)
            }
            ReducePlan::TwoPass(t) => {
                let (first, finish) = t.with_scratch(crate::types::DeviceAddress::of_allocation(SCRATCH));
                assert_eq!(
                    (finish.x, finish.partial, finish.parts),
                    (
                        crate::types::DeviceAddress::of_allocation(SCRATCH),
                        crate::types::DeviceAddress::NULL,
                        1
                    )
                );
                assert_eq!(finish.mean_len, full_len);
                let mut parts = match first {
                    FirstPass::Split(e, a) => {
                        assert!(
                            e.starts_with("reduce_split_")
                                && a.partial == crate::types::DeviceAddress::of_allocation(SCRATCH)
                        );
                        assert!(a.parts >= 2 && a.chunk * (a.parts - 1) < a.len && a.chunk * a.parts >= a.len);
                        sim_split(&a)
                    }
                    FirstPass::Cols(e, a) => {
                        assert!(
                            e.starts_with("reduce_cols_")
                                && a.partial == crate::types::DeviceAddress::of_allocation(SCRATCH)
                        );
                        let p = a.parts as i64;
                        assert!(p >= 2 && a.chunk * (p - 1) < a.len && a.chunk * p >= a.len);
                        assert_eq!(a.outer * a.inner, finish.inner);
                        sim_cols(&a)
                    }
                };
                assert!(t.finish.0.starts_with("reduce_finish_"));
                assert_eq!(t.scratch_bytes, parts.len() * acc_bytes(dtype));
                assert_eq!(parts.len() as i64, finish.len * finish.inner);
                let mut m = Reads::new();
                for (d, slots) in sim_cols(&finish) {
                    let reads = slots
                        .iter()
                        .flat_map(|&s| {
                            parts
                                .remove(&Dest::Part(s))
                                .unwrap_or_else(|| panic!("slot {s} read twice"))
                        })
                        .collect();
                    put(&mut m, d, reads);
                }
                assert!(parts.is_empty(), "partials never read: {:?}", parts.keys());
                m
            }
        };
        m.into_iter()
            .map(|(d, mut r)| match d {
                Dest::Out(o) => {
                    r.sort_unstable();
                    (o, r)
                }
                Dest::Part(s) => panic!("partial {s} left as a result"),
            })
            .collect()
    }

    /// What `reduce(x, axis) -> out` must produce: per output offset, the sorted input offsets.
    fn expected_map(x: &TensorRef, axis: usize, out: &TensorRef) -> BTreeMap<i64, Vec<i64>> {
        let outs = expected_offsets(out, axis);
        expected_offsets(x, axis)
            .into_iter()
            .zip(outs)
            .map(|(mut r, o)| {
                r.sort_unstable();
                (o[0], r)
            })
            .collect()
    }

    fn path(p: &ReducePlan) -> &'static str {
        match p {
            ReducePlan::Rows(_) => "rows",
            ReducePlan::Cols(..) => "cols",
            ReducePlan::TwoPass(TwoPass {
                first: FirstPass::Split(..),
                ..
            }) => "split",
            ReducePlan::TwoPass(TwoPass {
                first: FirstPass::Cols(..),
                ..
            }) => "cols2",
        }
    }

    #[test]
    fn simulated_plans_read_every_element_once_into_the_right_output() {
        // (x, axis, out strides (None: packed), expected path)
        let cases: Vec<(TensorRef, usize, Option<Vec<i64>>, &str)> = vec![
            // Split rows: packed, gapped rows, a strided output.
            (t(&[3, 20_000], DataType::F32), 1, None, "split"),
            (ts(&[4, 9000], &[9100, 1], DataType::F16), 1, Some(vec![3, 1]), "split"),
            (t(&[2, 3, 10_000], DataType::I32), 2, None, "split"),
            // Rows that are long but strided in memory and not expressible as columns.
            (ts(&[2, 3, 9000], &[54_000, 18_000, 2], DataType::F64), 2, None, "split"),
            // The same rows with a stride-1 dim elsewhere: columns (inner 2), split.
            (ts(&[2, 3, 9000], &[1, 36_000, 2], DataType::F64), 2, None, "cols2"),
            // Columns: packed, outer > 1, permuted, broadcast along the axis, strided output.
            (t(&[64, 48], DataType::F32), 0, None, "cols"),
            (t(&[2, 5, 7], DataType::BF16), 1, None, "cols"),
            (t(&[3, 4, 5], DataType::F32), 0, None, "cols"),
            (t(&[3, 4, 5], DataType::F32), 1, Some(vec![1, 7, 3]), "cols"),
            (ts(&[2, 3, 4], &[1, 2, 6], DataType::F32), 2, None, "cols"),
            (ts(&[3, 4, 5], &[0, 5, 1], DataType::U8), 0, None, "cols"),
            (ts(&[5, 6, 3], &[1, 40, 5], DataType::F32), 1, None, "cols"),
            (t(&[30_000, 2], DataType::F32), 0, None, "cols2"),
            // Split columns: column-major rows, one tile, several outer tiles.
            (ts(&[3, 20_000], &[1, 3], DataType::F32), 1, None, "cols2"),
            (t(&[4096, 40], DataType::I64), 0, None, "cols2"),
            (t(&[16, 2048, 8], DataType::Bool), 1, None, "cols2"),
            // Rows: axis innermost, zero-stride rest dims, short rows.
            (t(&[3, 4, 5], DataType::F32), 2, None, "rows"),
            (ts(&[3, 4, 5], &[20, 0, 1], DataType::F32), 2, None, "rows"),
            (ts(&[3, 4, 5], &[20, 0, 1], DataType::F32), 0, None, "rows"),
            (ts(&[2, 3, 4], &[1, 2, 6], DataType::F32), 0, None, "rows"),
            (t(&[300, 70], DataType::F32), 1, None, "rows"),
            (t(&[5, 1, 3], DataType::F32), 1, None, "rows"),
        ];
        for (x, axis, ost, want) in &cases {
            let mut od = x.dims.clone();
            od[*axis] = 1;
            let odt = if x.dtype == DataType::Bool {
                DataType::Bool
            } else {
                x.dtype
            };
            let out = match ost {
                Some(st) => ts(&od, st, odt),
                None => t(&od, odt),
            };
            let op = if x.dtype == DataType::Bool {
                ReduceOp::Any
            } else {
                ReduceOp::Max
            };
            let p = plan_reduce(op, x, *axis, &out).unwrap().unwrap();
            assert_eq!(path(&p), *want, "{x:?} axis {axis}");
            assert_eq!(
                simulate(&p, x.dtype, x.dims[*axis]),
                expected_map(x, *axis, &out),
                "{x:?} axis {axis}"
            );
        }
    }

    #[test]
    fn simulated_reduce_all_reads_every_element_once() {
        let cases: Vec<(TensorRef, &str)> = vec![
            (t(&[50_000], DataType::F32), "split"),
            (t(&[7, 3000], DataType::BF16), "split"),
            // Transposed: rows are not linear, every element goes through offset_of.
            (ts(&[200, 100], &[1, 200], DataType::F64), "split"),
            (ts(&[3, 4], &[1, 3], DataType::I8), "rows"),
            (t(&[8191], DataType::F32), "rows"),
            (t(&[0, 3], DataType::F32), "rows"),
        ];
        for (x, want) in &cases {
            let out = t(&[1], x.dtype);
            let p = plan_reduce_all(ReduceOp::Sum, x, &out).unwrap().unwrap();
            assert_eq!(path(&p), *want, "{x:?}");
            let mut all: Vec<i64> = expected_offsets(x, 0).concat();
            all.sort_unstable();
            let want_map: BTreeMap<i64, Vec<i64>> = [(0, all)].into_iter().collect();
            assert_eq!(simulate(&p, x.dtype, x.numel()), want_map, "{x:?}");
        }
    }

    #[test]
    fn row_step_agrees_with_offset_of_whenever_rows_are_linear() {
        let cases: Vec<TensorRef> = vec![
            t(&[2, 3, 4], DataType::F32),
            ts(&[2, 3, 4], &[1, 2, 6], DataType::F32),
            ts(&[2, 3, 4], &[0, 4, 1], DataType::F32),
            ts(&[2, 3, 4], &[24, 8, 2], DataType::F32),
            ts(&[2, 3, 4], &[12, 0, 0], DataType::F32),
            ts(&[5, 1, 3], &[3, 3, 1], DataType::F32),
        ];
        for x in &cases {
            for axis in 0..3 {
                let mut od = x.dims.clone();
                od[axis] = 1;
                let layouts = row_layouts("t", x, &t(&od, DataType::F32), axis, false).unwrap();
                let p = row_plan("reduce_f32", x, &t(&od, DataType::F32), layouts, 0);
                // `reduce` rows are always linear (the axis is the last dim before merging).
                let s = linear_step(&p.args.x_layout, p.args.len).expect("linear");
                for o in 0..p.args.n_out {
                    let base = p.args.x_layout.host_offset(o * p.args.len);
                    for k in 0..p.args.len {
                        assert_eq!(p.args.x_layout.host_offset(o * p.args.len + k), base + k * s);
                    }
                }
            }
            // reduce_all: linear only when the last merged dim holds the whole tensor.
            let p = rows(plan_reduce_all(ReduceOp::Sum, x, &t(&[1], DataType::F32)));
            if let Some(s) = linear_step(&p.args.x_layout, p.args.len) {
                for k in 0..p.args.len {
                    assert_eq!(p.args.x_layout.host_offset(k), k * s, "{x:?}");
                }
            }
        }
        let p = rows(plan_reduce_all(
            ReduceOp::Sum,
            &ts(&[3, 4], &[1, 3], DataType::F32),
            &t(&[1], DataType::F32),
        ));
        assert_eq!(linear_step(&p.args.x_layout, 12), None);
    }

    #[test]
    fn planner_picks_paths_chunks_and_scratch() {
        let two = |p: ReducePlan| match p {
            ReducePlan::TwoPass(t) => t,
            other => panic!("expected a two-pass plan, got {other:?}"),
        };
        // Batch-norm style mean over [64, 131072]: 16 chunks of 8192 per row, 1024 blocks.
        for (dt, acc) in [(DataType::F32, 4), (DataType::F16, 4), (DataType::BF16, 4)] {
            let x = t(&[64, 131_072], dt);
            let tp = two(plan_reduce(ReduceOp::Mean, &x, 1, &t(&[64, 1], dt)).unwrap().unwrap());
            let FirstPass::Split(e, a) = tp.first else {
                panic!("{tp:?}")
            };
            assert_eq!(e, entry(Kind::Split, dt));
            assert_eq!(
                (a.n_out, a.len, a.parts, a.chunk, a.blocks),
                (64, 131_072, 16, 8192, 1024)
            );
            assert_eq!(tp.scratch_bytes, 64 * 16 * acc);
            let (fe, f) = tp.finish;
            assert_eq!(fe, entry(Kind::Finish, dt));
            assert_eq!(
                (f.outer, f.len, f.inner, f.len_stride, f.tx, f.blocks),
                (1, 16, 64, 64, 32, 2)
            );
            assert_eq!((f.mean_len, f.op), (131_072, 2));
        }
        // [3, 300000]: chunks of >= 2048 elements (multiples of 256).
        let tp = two(plan_reduce(
            ReduceOp::Sum,
            &t(&[3, 300_000], DataType::F32),
            1,
            &t(&[3, 1], DataType::F32),
        )
        .unwrap()
        .unwrap());
        let FirstPass::Split(_, a) = tp.first else { panic!() };
        assert_eq!((a.parts, a.chunk), (131, 2304));
        // reduce_all of 3e7 and 1e6 elements.
        let tp = two(
            plan_reduce_all(ReduceOp::Sum, &t(&[30_000_000], DataType::F16), &t(&[1], DataType::F16))
                .unwrap()
                .unwrap(),
        );
        let FirstPass::Split(_, a) = tp.first else { panic!() };
        assert_eq!((a.n_out, a.parts, a.chunk, a.blocks), (1, 1020, 29_440, 1020));
        assert_eq!(tp.scratch_bytes, 1020 * 4);
        assert_eq!((tp.finish.1.tx, tp.finish.1.blocks), (1, 1));
        let tp = two(plan_reduce_all(
            ReduceOp::Prod,
            &t(&[1000, 1000], DataType::I32),
            &t(&[1, 1], DataType::I32),
        )
        .unwrap()
        .unwrap());
        let FirstPass::Split(e, a) = tp.first else { panic!() };
        assert_eq!((e, a.parts, a.chunk), ("reduce_split_i32", 435, 2304));
        assert_eq!(tp.scratch_bytes, 435 * 8);
        // Many long rows, or short ones: the row path.
        assert_eq!(
            path(
                &plan_reduce(
                    ReduceOp::Sum,
                    &t(&[264, 10_000], DataType::F32),
                    1,
                    &t(&[264, 1], DataType::F32)
                )
                .unwrap()
                .unwrap()
            ),
            "rows"
        );
        assert_eq!(
            path(
                &plan_reduce(
                    ReduceOp::Sum,
                    &t(&[3, 8191], DataType::F32),
                    1,
                    &t(&[3, 1], DataType::F32)
                )
                .unwrap()
                .unwrap()
            ),
            "rows"
        );
        // Bias gradient: sum over dim 0 of [8192, 2048]: 64 tiles of 32 columns, 16 chunks.
        for (dt, acc) in [
            (DataType::F32, 4),
            (DataType::F64, 8),
            (DataType::I32, 8),
            (DataType::Bool, 8),
        ] {
            let op = if dt == DataType::Bool {
                ReduceOp::All
            } else {
                ReduceOp::Sum
            };
            let tp = two(plan_reduce(op, &t(&[8192, 2048], dt), 0, &t(&[1, 2048], dt))
                .unwrap()
                .unwrap());
            let FirstPass::Cols(e, a) = tp.first else {
                panic!("{tp:?}")
            };
            assert_eq!(e, entry(Kind::Cols, dt));
            assert_eq!((a.outer, a.len, a.inner, a.len_stride, a.tx), (1, 8192, 2048, 2048, 32));
            assert_eq!((a.blocks, a.parts, a.chunk), (64, 16, 512));
            assert_eq!(tp.scratch_bytes, 16 * 2048 * acc);
            assert_eq!((tp.finish.1.len, tp.finish.1.inner, tp.finish.1.blocks), (16, 2048, 64));
        }
        // [128, 64, 1024]: dims 0 and 1 are columns without a split; dim 2 is rows.
        let x = t(&[128, 64, 1024], DataType::F32);
        let ReducePlan::Cols(e, a) = plan_reduce(ReduceOp::Sum, &x, 0, &t(&[1, 64, 1024], DataType::F32))
            .unwrap()
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(e, "reduce_cols_f32");
        assert_eq!(
            (
                a.outer,
                a.outer_stride,
                a.len,
                a.len_stride,
                a.inner,
                a.tx,
                a.blocks,
                a.parts
            ),
            (1, 0, 128, 65_536, 65_536, 32, 2048, 1)
        );
        let ReducePlan::Cols(_, a) = plan_reduce(ReduceOp::Sum, &x, 1, &t(&[128, 1, 1024], DataType::F32))
            .unwrap()
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (a.outer, a.outer_stride, a.len, a.len_stride, a.inner, a.blocks),
            (128, 65_536, 64, 1024, 1024, 4096)
        );
        assert_eq!(
            path(
                &plan_reduce(ReduceOp::Sum, &x, 2, &t(&[128, 64, 1], DataType::F32))
                    .unwrap()
                    .unwrap()
            ),
            "rows"
        );
        // Narrow columns get narrow tiles (tx = 4 for 3 outputs).
        let ReducePlan::Cols(_, a) = plan_reduce(
            ReduceOp::Sum,
            &t(&[1000, 3], DataType::F32),
            0,
            &t(&[1, 3], DataType::F32),
        )
        .unwrap()
        .unwrap() else {
            panic!()
        };
        assert_eq!((a.tx, a.inner, a.blocks), (4, 3, 1));
        // Length-1 and empty axes stay on the row path.
        assert_eq!(
            path(
                &plan_reduce(ReduceOp::Sum, &t(&[1, 8], DataType::F32), 0, &t(&[1, 8], DataType::F32))
                    .unwrap()
                    .unwrap()
            ),
            "rows"
        );
        assert_eq!(
            path(
                &plan_reduce(
                    ReduceOp::Mean,
                    &t(&[0, 8], DataType::F32),
                    0,
                    &t(&[1, 8], DataType::F32)
                )
                .unwrap()
                .unwrap()
            ),
            "rows"
        );
        assert_eq!(entry(Kind::Finish, DataType::Bool), "reduce_finish_u8");
        assert_eq!(split_len(1, 8192, MIN_CHUNK, 256), (4, 2048));
        assert_eq!(split_len(2000, 100_000, MIN_CHUNK, 256), (1, 100_000));
        assert_eq!(split_len(1, 10_000, 4096, 4096), (2, 8192));
        assert_eq!(split_len(1, 5000, 4096, 4096), (1, 5000));
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
