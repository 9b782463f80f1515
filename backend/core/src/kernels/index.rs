//! Index kernels on strided views: gather, scatter-add, index-select and index-add along
//! one axis, and the multi-dimensional [`gather_nd`] / [`scatter_nd`] (index tuples into
//! the leading dims, with an update op: assign, add, mul, min or max).
//!
//! Every function takes the stream first, validates all its arguments, and only enqueues
//! work (it never synchronizes). Indices are `I64` or `I32`; every operand may be
//! arbitrarily strided (negative strides included), and the written operand (`out` or
//! `target`) must not overlap itself (no 0 stride on a dim > 1) nor alias the other
//! operands. Empty iteration shapes return `Ok(())` at once after validation.
//!
//! **Bounds are the caller's responsibility.** Index values are only known on the device,
//! so they are not validated: an index outside `0..dim` (negative included) never reads
//! or writes out of bounds, but its item is skipped. `gather` / `index_select` leave that
//! output element unwritten, `scatter_add` / `index_add` add nothing for it; an index tuple
//! of `gather_nd` with a coordinate out of range yields a zero slice, one of `scatter_nd`
//! updates nothing.
//!
//! Host work is split in two: a pure `plan_*` function (validation, layouts, kernel
//! choice) that needs no device, and the launch of the planned kernel (`kernels/index.cu`:
//! `gather_b{1,2,4,8}` by element size, `scatter_add_<dt>` per dtype; `index_select` and
//! `index_add` run the same kernels with the 1-D indices broadcast along the axis;
//! `gather_nd_b{1,2,4,8}` and `scatter_nd_<dt>`).
//! The adds use atomics (f32/f64/i32/i64 natively; f16 from sm_70 and bf16 from sm_90 by the
//! hardware's half add, before that by 16-bit compare-and-swap), so
//! float sums with duplicate indices are not bit-reproducible. An `index_add` of whole rows
//! along axis 0 (an embedding's gradient, where padding or mask tokens send thousands of
//! indices to one row) sorts the indices first and adds each run of equal indices within a
//! chunk of 32 as one sum (`index_add_rows_<dt>`), so a hot row takes one atomic add per
//! chunk. `scatter_nd` updates
//! atomically too (native add/min/max where the hardware has them, compare-and-swap loops
//! otherwise). For 1-byte dtypes (i8, u8, bool) the loop works on the containing aligned
//! 32-bit word: their output buffers must be allocated in whole 4-byte words (the Burn
//! backend's storage rounds every allocation up to 16 bytes).
//!
//! The engine's deterministic mode replaces the atomics: `scatter_add` / `index_add` run
//! `scatter_add_seq_<dt>` (one thread per line along the axis), and `scatter_nd` with
//! `Add`, `Mul` or `Assign` runs [`scatter_nd_ordered`] (`scatter_nd_keys`, a stable sort
//! of the keys, then `scatter_nd_ordered_<dt>`: one thread per run of equal index tuples
//! and slice element, in tuple order).

use crate::kernels::check::{check_no_overlap, check_tensor, on_stream, same_dtype};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_index::{self as launch, IndexAxis, RowsAdd};
use crate::ffi::memory::DeviceBuffer;
use crate::graph::DataType;
use crate::kernels::layout::{coalesce, kernel_layout};
use crate::kernels::{stream_function, stream_functions, INDEX};
use crate::types::{row_major_strides, TensorMut, TensorRef};

// ---------------------------------------------------------------------------------------
// Plans (pure host logic)

/// What every index op launches: the indexed operand, the indices and the third operand
/// (`out` or `values`), in that order, over one iteration shape of `n` items.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct IndexPlan {
    pub entry: &'static str,
    /// Whether the indices are `I64` (else `I32`).
    pub idx64: bool,
    /// Layouts of (indexed operand with stride 0 on the axis, indices, out/values).
    pub layouts: [KernelLayout; 3],
    pub axis: IndexAxis,
    pub n: i64,
    /// For the sequential adds (deterministic mode): the steps of each line (the iteration
    /// shape's axis, laid out last); 0 otherwise.
    pub line_len: i64,
}

/// `gather_b{1,2,4,8}` by element size.
fn gather_entry(dtype: DataType) -> &'static str {
    match dtype.size() {
        1 => "gather_b1",
        2 => "gather_b2",
        4 => "gather_b4",
        _ => "gather_b8",
    }
}

/// `scatter_add_<dt>` (atomic), or with `sequential` `scatter_add_seq_<dt>`, for the dtypes
/// the adds support.
fn add_entry(op: &'static str, arg: &'static str, dtype: DataType, sequential: bool) -> Result<&'static str> {
    let (atomic, ordered) = match dtype {
        DataType::F32 => ("scatter_add_f32", "scatter_add_seq_f32"),
        DataType::F16 => ("scatter_add_f16", "scatter_add_seq_f16"),
        DataType::BF16 => ("scatter_add_bf16", "scatter_add_seq_bf16"),
        DataType::F64 => ("scatter_add_f64", "scatter_add_seq_f64"),
        DataType::I32 => ("scatter_add_i32", "scatter_add_seq_i32"),
        DataType::I64 => ("scatter_add_i64", "scatter_add_seq_i64"),
        _ => {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("dtype {dtype:?} is not supported (F32, F16, BF16, F64, I32 or I64)"),
            ))
        }
    };
    Ok(if sequential { ordered } else { atomic })
}

/// Checks the indices' dtype; returns whether they are `I64`.
fn check_index_dtype(op: &'static str, indices: &TensorRef) -> Result<bool> {
    match indices.dtype {
        DataType::I64 => Ok(true),
        DataType::I32 => Ok(false),
        d => Err(Error::invalid_arg(
            op,
            "indices",
            format!("dtype {d:?} is not I64 or I32"),
        )),
    }
}

fn check_axis(op: &'static str, axis: usize, rank: usize, arg: &'static str) -> Result<()> {
    if axis >= rank {
        return Err(Error::invalid_arg(
            op,
            "axis",
            format!("axis {axis} is out of range for {arg} of rank {rank}"),
        ));
    }
    Ok(())
}

/// `dims` with `dims[axis]` replaced by `len`.
fn with_axis(dims: &[i64], axis: usize, len: i64) -> Vec<i64> {
    let mut d = dims.to_vec();
    d[axis] = len;
    d
}

/// Checks the element-wise form's indices against the indexed operand (`data`): same
/// rank and no larger off the axis.
fn check_elementwise_indices(
    op: &'static str,
    data_arg: &'static str,
    data: &TensorRef,
    axis: usize,
    indices: &TensorRef,
) -> Result<()> {
    if indices.dims.len() != data.dims.len() {
        return Err(Error::invalid_arg(
            op,
            "indices",
            format!(
                "rank {} ({:?}) differs from {data_arg}'s rank {} ({:?})",
                indices.dims.len(),
                indices.dims,
                data.dims.len(),
                data.dims
            ),
        ));
    }
    check_axis(op, axis, data.dims.len(), data_arg)?;
    for (d, (&i, &x)) in indices.dims.iter().zip(&data.dims).enumerate() {
        if d != axis && i > x {
            return Err(Error::invalid_arg(
                op,
                "indices",
                format!(
                    "dims {:?} exceed {data_arg}'s {:?} at dim {d} (only the axis {axis} may be larger)",
                    indices.dims, data.dims
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that the 1-D form's indices are 1-D; returns their length.
fn check_vector_indices(op: &'static str, indices: &TensorRef) -> Result<i64> {
    if indices.dims.len() != 1 {
        return Err(Error::invalid_arg(
            op,
            "indices",
            format!("must be 1-D, got dims {:?}", indices.dims),
        ));
    }
    Ok(indices.dims[0])
}

/// Merges the dims of the iteration `shape` jointly over the three operands' strides and
/// packs the layouts; the indexed operand `data` gets stride 0 on `axis` (the kernel adds
/// `index * axis.stride`). With `axis_last` the axis is moved to the innermost position
/// first (item `l * len + a` is then step `a` of line `l`: the sequential adds).
fn layouts(
    op: &'static str,
    shape: &[i64],
    data: &TensorRef,
    axis: usize,
    idx_strides: Vec<i64>,
    other_strides: Vec<i64>,
    axis_last: bool,
) -> Result<([KernelLayout; 3], IndexAxis)> {
    let ax = IndexAxis {
        stride: data.strides[axis],
        len: data.dims[axis],
    };
    let data_strides = with_axis(&data.strides, axis, 0);
    let mut all = [shape.to_vec(), data_strides, idx_strides, other_strides];
    if axis_last {
        for v in all.iter_mut() {
            let x = v.remove(axis);
            v.push(x);
        }
    }
    let [shape, data_strides, idx_strides, other_strides] = all;
    let (shape, strides) = coalesce(&shape, &[data_strides, idx_strides, other_strides]);
    let mut out = [KernelLayout::default(); 3];
    for (l, s) in out.iter_mut().zip(&strides) {
        *l = kernel_layout(op, &shape, s)?;
    }
    Ok((out, ax))
}

/// Strides of 1-D indices broadcast along `axis` of a rank-`rank` iteration shape.
fn vector_index_strides(indices: &TensorRef, axis: usize, rank: usize) -> Vec<i64> {
    let mut s = vec![0i64; rank];
    s[axis] = indices.strides[0];
    s
}

pub(crate) fn plan_gather(
    x: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    out: &TensorRef,
) -> Result<Option<IndexPlan>> {
    const OP: &str = "gather";
    check_tensor(OP, "x", x)?;
    check_tensor(OP, "indices", indices)?;
    let n = check_tensor(OP, "out", out)?;
    let idx64 = check_index_dtype(OP, indices)?;
    check_elementwise_indices(OP, "x", x, axis, indices)?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    if out.dims != indices.dims {
        return Err(Error::invalid_arg(
            OP,
            "out",
            format!("dims {:?} differ from the indices' {:?}", out.dims, indices.dims),
        ));
    }
    check_no_overlap(OP, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    let (layouts, axis) = layouts(
        OP,
        &out.dims,
        x,
        axis,
        indices.strides.to_vec(),
        out.strides.to_vec(),
        false,
    )?;
    Ok(Some(IndexPlan {
        entry: gather_entry(x.dtype),
        idx64,
        layouts,
        axis,
        n,
        line_len: 0,
    }))
}

/// Validates a `scatter_add` and plans it: atomic adds, or with `sequential` one thread per
/// line adding in axis order (deterministic).
pub(crate) fn plan_scatter_add(
    target: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
    sequential: bool,
) -> Result<Option<IndexPlan>> {
    const OP: &str = "scatter_add";
    check_tensor(OP, "target", target)?;
    check_tensor(OP, "indices", indices)?;
    let n = check_tensor(OP, "values", values)?;
    let entry = add_entry(OP, "target", target.dtype, sequential)?;
    let idx64 = check_index_dtype(OP, indices)?;
    check_elementwise_indices(OP, "target", target, axis, indices)?;
    same_dtype(OP, "values", values, target.dtype, "target")?;
    if values.dims != indices.dims {
        return Err(Error::invalid_arg(
            OP,
            "values",
            format!("dims {:?} differ from the indices' {:?}", values.dims, indices.dims),
        ));
    }
    check_no_overlap(OP, "target", target)?;
    if n == 0 {
        return Ok(None);
    }
    let line_len = if sequential { values.dims[axis] } else { 0 };
    let (layouts, axis) = layouts(
        OP,
        &values.dims,
        target,
        axis,
        indices.strides.to_vec(),
        values.strides.to_vec(),
        sequential,
    )?;
    Ok(Some(IndexPlan {
        entry,
        idx64,
        layouts,
        axis,
        n,
        line_len,
    }))
}

pub(crate) fn plan_index_select(
    x: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    out: &TensorRef,
) -> Result<Option<IndexPlan>> {
    const OP: &str = "index_select";
    check_tensor(OP, "x", x)?;
    check_tensor(OP, "indices", indices)?;
    let n = check_tensor(OP, "out", out)?;
    let idx64 = check_index_dtype(OP, indices)?;
    let k = check_vector_indices(OP, indices)?;
    check_axis(OP, axis, x.dims.len(), "x")?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    let want = with_axis(&x.dims, axis, k);
    if out.dims[..] != want[..] {
        return Err(Error::invalid_arg(
            OP,
            "out",
            format!(
                "dims {:?} differ from {want:?} (x's dims with axis {axis} set to the index count)",
                out.dims
            ),
        ));
    }
    check_no_overlap(OP, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    let idx_strides = vector_index_strides(indices, axis, out.dims.len());
    let (layouts, axis) = layouts(OP, &out.dims, x, axis, idx_strides, out.strides.to_vec(), false)?;
    Ok(Some(IndexPlan {
        entry: gather_entry(x.dtype),
        idx64,
        layouts,
        axis,
        n,
        line_len: 0,
    }))
}

/// Validates an `index_add` and plans it (see [`plan_scatter_add`] for `sequential`).
pub(crate) fn plan_index_add(
    target: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
    sequential: bool,
) -> Result<Option<IndexPlan>> {
    const OP: &str = "index_add";
    check_tensor(OP, "target", target)?;
    check_tensor(OP, "indices", indices)?;
    let n = check_tensor(OP, "values", values)?;
    let entry = add_entry(OP, "target", target.dtype, sequential)?;
    let idx64 = check_index_dtype(OP, indices)?;
    let k = check_vector_indices(OP, indices)?;
    check_axis(OP, axis, target.dims.len(), "target")?;
    same_dtype(OP, "values", values, target.dtype, "target")?;
    let want = with_axis(&target.dims, axis, k);
    if values.dims[..] != want[..] {
        return Err(Error::invalid_arg(
            OP,
            "values",
            format!(
                "dims {:?} differ from {want:?} (target's dims with axis {axis} set to the index count)",
                values.dims
            ),
        ));
    }
    check_no_overlap(OP, "target", target)?;
    if n == 0 {
        return Ok(None);
    }
    let idx_strides = vector_index_strides(indices, axis, values.dims.len());
    let line_len = if sequential { values.dims[axis] } else { 0 };
    let (layouts, axis) = layouts(
        OP,
        &values.dims,
        target,
        axis,
        idx_strides,
        values.strides.to_vec(),
        sequential,
    )?;
    Ok(Some(IndexPlan {
        entry,
        idx64,
        layouts,
        axis,
        n,
        line_len,
    }))
}

/// Indices from which an [`index_add`] of whole rows sorts them first (fewer cost more to
/// sort than their atomic adds).
const ROWS_MIN_INDICES: i64 = 64;

/// An [`index_add`] of whole rows along axis 0 (an embedding's gradient) through sorted
/// indices: its kernel and rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowsPlan {
    entry: &'static str,
    idx64: bool,
    rows: RowsAdd,
}

/// The sorted-rows plan of a validated, non-empty `index_add` when it adds whole rows: axis
/// 0, a float dtype, at least [`ROWS_MIN_INDICES`] indices, and target and values each
/// contiguous after their first dim. `None`: the element-wise atomic kernel runs it.
pub(crate) fn plan_index_add_rows(
    target: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
) -> Option<RowsPlan> {
    let entry = match target.dtype {
        DataType::F32 => "index_add_rows_f32",
        DataType::F64 => "index_add_rows_f64",
        DataType::F16 => "index_add_rows_f16",
        DataType::BF16 => "index_add_rows_bf16",
        _ => return None,
    };
    let m = indices.dims[0];
    let rows_contiguous = |t: &TensorRef| t.strides[1..] == row_major_strides(&t.dims[1..])[..];
    let d: i64 = target.dims[1..].iter().product();
    let tiles = (d + 255) / 256;
    (axis == 0
        && m >= ROWS_MIN_INDICES
        && d > 0
        && tiles <= i64::from(u16::MAX)
        && rows_contiguous(target)
        && rows_contiguous(values))
    .then_some(RowsPlan {
        entry,
        idx64: indices.dtype == DataType::I64,
        rows: RowsAdd {
            m,
            d,
            axis_len: target.dims[0],
            target_stride: target.strides[0],
            values_stride: values.strides[0],
        },
    })
}

/// Enqueues a [`RowsPlan`]: a stable sort of the indices (keys and their positions into
/// scratch memory freed in stream order), then `index_add_rows_<dt>`.
fn index_add_rows(
    stream: &Arc<CudaStream>,
    p: &RowsPlan,
    target: &TensorRef,
    indices: &TensorRef,
    values: &TensorRef,
) -> Result<()> {
    let m = p.rows.m;
    let key_bytes = m as usize * indices.dtype.size();
    // Positions (i64) after the keys, 8-byte aligned.
    let perm_at = key_bytes.div_ceil(8) * 8;
    let scratch = DeviceBuffer::alloc(stream, perm_at + m as usize * 8, "index_add")?;
    let keys = scratch.view_mut(0, &[m], &[1], indices.dtype)?;
    let perm = scratch.view_mut(perm_at as i64 / 8, &[m], &[1], DataType::I64)?;
    crate::kernels::sort::sort(stream, indices, 0, false, Some(&keys), Some(&perm))?;
    let f = stream_function(stream, INDEX, p.entry)?;
    launch::index_add_rows(
        stream,
        &f,
        target.address(),
        keys.address(),
        p.idx64,
        perm.address(),
        values.address(),
        &p.rows,
    )?;
    drop((keys, perm));
    drop(scratch);
    Ok(())
}

/// How [`scatter_nd`] combines a value with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterNdOp {
    /// Overwrite. With duplicate index tuples each element ends up holding one of its
    /// candidate values: unspecified which in the atomic [`scatter_nd`] (like PyTorch's
    /// `index_put_` without `accumulate`), the last tuple's in [`scatter_nd_ordered`] (and
    /// so in the engine's deterministic mode; as burn-ndarray).
    Assign,
    /// `element + value` (ints wrap; Bool: logical or).
    Add,
    /// `element * value` (ints wrap; Bool: logical and).
    Mul,
    /// `value` when `value < element`, else `element` (a NaN value never replaces, a NaN
    /// element stays, as burn-ndarray).
    Min,
    /// `value` when `value > element`, else `element` (NaN as for `Min`).
    Max,
}

impl ScatterNdOp {
    /// The kernel's `op` code (`ND_ASSIGN` .. `ND_MAX` in `kernels/index.cu`).
    fn code(self) -> i32 {
        match self {
            ScatterNdOp::Assign => 0,
            ScatterNdOp::Add => 1,
            ScatterNdOp::Mul => 2,
            ScatterNdOp::Min => 3,
            ScatterNdOp::Max => 4,
        }
    }
}

/// What [`gather_nd`] and [`scatter_nd`] launch over the `n` items of the joint shape
/// `tuple dims ++ slice dims`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NdPlan {
    pub entry: &'static str,
    /// Whether the indices are `I64` (else `I32`).
    pub idx64: bool,
    /// Layouts of (indexed operand with stride 0 on the tuple dims, a tuple's first
    /// coordinate with stride 0 on the slice dims, out/values).
    pub layouts: [KernelLayout; 3],
    /// The K indexed dims of the indexed operand: their lengths and strides.
    pub indexed: KernelLayout,
    /// Stride between the coordinates of one index tuple.
    pub coord_stride: i64,
    /// Items of the joint shape: `tuples * slice`.
    pub n: i64,
    /// Index tuples (the product of the indices' dims but the last).
    pub tuples: i64,
    /// Elements of one slice (the product of the indexed operand's dims from K).
    pub slice: i64,
}

/// `scatter_nd_<dt>` (atomic), or with `ordered` `scatter_nd_ordered_<dt>` (every dtype is
/// supported by both).
fn scatter_nd_entry(dtype: DataType, ordered: bool) -> &'static str {
    let (atomic, sorted) = match dtype {
        DataType::F32 => ("scatter_nd_f32", "scatter_nd_ordered_f32"),
        DataType::F16 => ("scatter_nd_f16", "scatter_nd_ordered_f16"),
        DataType::BF16 => ("scatter_nd_bf16", "scatter_nd_ordered_bf16"),
        DataType::F64 => ("scatter_nd_f64", "scatter_nd_ordered_f64"),
        DataType::I32 => ("scatter_nd_i32", "scatter_nd_ordered_i32"),
        DataType::I64 => ("scatter_nd_i64", "scatter_nd_ordered_i64"),
        DataType::I8 => ("scatter_nd_i8", "scatter_nd_ordered_i8"),
        DataType::U8 => ("scatter_nd_u8", "scatter_nd_ordered_u8"),
        DataType::Bool => ("scatter_nd_bool", "scatter_nd_ordered_bool"),
    };
    if ordered {
        sorted
    } else {
        atomic
    }
}

/// The kernel that computes the sort keys of the ordered scatter_nd (one per index tuple).
const SCATTER_ND_KEYS: &str = "scatter_nd_keys";

/// Most index tuples the ordered scatter_nd sorts (one row of [`crate::kernels::sort::sort`]).
const MAX_ORDERED_TUPLES: i64 = i32::MAX as i64;

/// Bytes of scratch of the ordered scatter_nd for `tuples` index tuples: three `I64`
/// arrays (keys, sorted keys, the sort's permutation); the sort of more than
/// [`crate::kernels::sort::MAX_SORT_LEN`] keys allocates its own merge scratch besides.
fn ordered_nd_scratch_bytes(tuples: i64) -> usize {
    3 * tuples as usize * DataType::I64.size()
}

/// `gather_nd_b{1,2,4,8}` by element size.
fn gather_nd_entry(dtype: DataType) -> &'static str {
    match dtype.size() {
        1 => "gather_nd_b1",
        2 => "gather_nd_b2",
        4 => "gather_nd_b4",
        _ => "gather_nd_b8",
    }
}

/// Validates the operands of the nd forms (`data` indexed by `indices` `[.., K]`, `other`
/// of dims `indices.dims[..-1] ++ data.dims[K..]` and data's dtype, `written` not
/// self-overlapping) and plans the launch; `None` when there is nothing to do.
fn plan_nd(
    op: &'static str,
    entry: &'static str,
    (data_arg, data): (&'static str, &TensorRef),
    indices: &TensorRef,
    (other_arg, other): (&'static str, &TensorRef),
    written: (&'static str, &TensorRef),
) -> Result<Option<NdPlan>> {
    check_tensor(op, data_arg, data)?;
    check_tensor(op, "indices", indices)?;
    let n = check_tensor(op, other_arg, other)?;
    let idx64 = check_index_dtype(op, indices)?;
    same_dtype(op, other_arg, other, data.dtype, data_arg)?;
    let Some((&k, tuple_dims)) = indices.dims.split_last() else {
        return Err(Error::invalid_arg(
            op,
            "indices",
            "must have at least one dim (the last one holds the index tuples)",
        ));
    };
    let k = k as usize;
    if k > data.dims.len() {
        return Err(Error::invalid_arg(
            op,
            "indices",
            format!(
                "tuples of {k} coordinates ({:?}) exceed {data_arg}'s rank {} ({:?})",
                indices.dims,
                data.dims.len(),
                data.dims
            ),
        ));
    }
    let slice_dims = &data.dims[k..];
    let want = [tuple_dims, slice_dims].concat();
    if other.dims[..] != want[..] {
        return Err(Error::invalid_arg(
            op,
            other_arg,
            format!(
                "dims {:?} differ from {want:?} (the indices' dims without the last, then {data_arg}'s dims from {k})",
                other.dims
            ),
        ));
    }
    check_no_overlap(op, written.0, written.1)?;
    if n == 0 {
        return Ok(None);
    }
    let tuples = tuple_dims.len();
    let data_strides = [vec![0; tuples], data.strides[k..].to_vec()].concat();
    let idx_strides = [indices.strides[..tuples].to_vec(), vec![0; slice_dims.len()]].concat();
    let (shape, strides) = coalesce(&want, &[data_strides, idx_strides, other.strides.to_vec()]);
    let mut layouts = [KernelLayout::default(); 3];
    for (l, s) in layouts.iter_mut().zip(&strides) {
        *l = kernel_layout(op, &shape, s)?;
    }
    let tuple_count: i64 = tuple_dims.iter().product();
    Ok(Some(NdPlan {
        entry,
        idx64,
        layouts,
        indexed: kernel_layout(op, &data.dims[..k], &data.strides[..k])?,
        coord_stride: indices.strides[tuples],
        n,
        tuples: tuple_count,
        slice: n / tuple_count,
    }))
}

pub(crate) fn plan_gather_nd(x: &TensorRef, indices: &TensorRef, out: &TensorRef) -> Result<Option<NdPlan>> {
    const OP: &str = "gather_nd";
    plan_nd(
        OP,
        gather_nd_entry(x.dtype),
        ("x", x),
        indices,
        ("out", out),
        ("out", out),
    )
}

/// Validates a `scatter_nd` and plans it: atomic updates, or with `ordered` the sorted
/// form (keys, a stable sort, then one thread per run of equal tuples and slice element),
/// which sorts at most `i32::MAX` index tuples.
pub(crate) fn plan_scatter_nd(
    target: &TensorRef,
    indices: &TensorRef,
    values: &TensorRef,
    ordered: bool,
) -> Result<Option<NdPlan>> {
    const OP: &str = "scatter_nd";
    let plan = plan_nd(
        OP,
        scatter_nd_entry(target.dtype, ordered),
        ("target", target),
        indices,
        ("values", values),
        ("target", target),
    )?;
    if let Some(p) = &plan {
        if ordered && p.tuples > MAX_ORDERED_TUPLES {
            return Err(Error::invalid_arg(
                OP,
                "indices",
                format!(
                    "{} index tuples exceed the {MAX_ORDERED_TUPLES} the ordered (deterministic) form sorts",
                    p.tuples
                ),
            ));
        }
    }
    Ok(plan)
}

// ---------------------------------------------------------------------------------------
// Public API

/// `out[i_0, .., i_r] = x[i_0, .., indices[i_0, .., i_r], .., i_r]` with the index at
/// position `axis`. `indices` (`I64` or `I32`) has `x`'s rank and dims no larger than
/// `x`'s off the axis; `out` has the indices' dims and `x`'s dtype (any dtype). An index
/// outside `0..x.dims[axis]` leaves its output element unwritten (bounds are the
/// caller's responsibility).
pub fn gather(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    out: &TensorMut,
) -> Result<()> {
    on_stream(stream, "gather", &[("x", x), ("indices", indices), ("out", out)])?;
    let Some(p) = plan_gather(x, axis, indices, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, INDEX, p.entry)?;
    launch::gather(
        stream,
        &f,
        x.address(),
        indices.address(),
        p.idx64,
        out.address(),
        &p.layouts,
        p.axis,
        p.n,
    )
}

/// `target[i_0, .., indices[i_0, .., i_r], .., i_r] += values[i_0, .., i_r]` (in place,
/// the index at position `axis`; duplicate indices accumulate). `indices` (`I64` or `I32`)
/// has `target`'s rank and dims no larger than `target`'s off the axis; `values` has the
/// indices' dims and `target`'s dtype (F32, F16, BF16, F64, I32 or I64; ints wrap). An
/// index outside `0..target.dims[axis]` adds nothing (bounds are the caller's
/// responsibility). Atomic adds, so float sums of duplicate indices may round differently
/// between runs; in the engine's deterministic mode this is [`scatter_add_ordered`].
pub fn scatter_add(
    stream: &Arc<CudaStream>,
    target: &TensorMut,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
) -> Result<()> {
    add_with(
        stream,
        "scatter_add",
        plan_scatter_add,
        target,
        axis,
        indices,
        values,
        deterministic(),
    )
}

/// [`scatter_add`] with every element's additions in axis order (one thread per line along
/// the axis, no atomics): bit-reproducible, slower when there are few lines.
pub fn scatter_add_ordered(
    stream: &Arc<CudaStream>,
    target: &TensorMut,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
) -> Result<()> {
    add_with(
        stream,
        "scatter_add",
        plan_scatter_add,
        target,
        axis,
        indices,
        values,
        true,
    )
}

/// Whether the adds run sequentially per line (the engine's deterministic mode).
fn deterministic() -> bool {
    crate::plan::policy().deterministic
}

/// A `plan_scatter_add` / `plan_index_add`.
type AddPlanner = fn(&TensorRef, usize, &TensorRef, &TensorRef, bool) -> Result<Option<IndexPlan>>;

/// Checks streams, plans with `planner` (atomic, or with `ordered` sequential per line) and
/// enqueues a scatter_add / index_add.
#[allow(clippy::too_many_arguments)]
fn add_with(
    stream: &Arc<CudaStream>,
    op: &'static str,
    planner: AddPlanner,
    target: &TensorMut,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
    ordered: bool,
) -> Result<()> {
    on_stream(
        stream,
        op,
        &[("target", target), ("indices", indices), ("values", values)],
    )?;
    let Some(p) = planner(target, axis, indices, values, ordered)? else {
        return Ok(());
    };
    launch_add(stream, &p, target, indices, values)
}

/// Enqueues a planned scatter_add / index_add: atomic, or sequential per line.
fn launch_add(
    stream: &Arc<CudaStream>,
    p: &IndexPlan,
    target: &TensorMut,
    indices: &TensorRef,
    values: &TensorRef,
) -> Result<()> {
    let f = stream_function(stream, INDEX, p.entry)?;
    if p.line_len > 0 {
        return launch::scatter_add_seq(
            stream,
            &f,
            target.address(),
            indices.address(),
            p.idx64,
            values.address(),
            &p.layouts,
            p.axis,
            p.n / p.line_len,
            p.line_len,
        );
    }
    launch::scatter_add(
        stream,
        &f,
        target.address(),
        indices.address(),
        p.idx64,
        values.address(),
        &p.layouts,
        p.axis,
        p.n,
    )
}

/// `out.select(axis, i) = x.select(axis, indices[i])`: `out` has `x`'s dims with
/// `dims[axis]` replaced by the length of the 1-D `indices` (`I64` or `I32`), and `x`'s
/// dtype (any dtype). An index outside `0..x.dims[axis]` leaves its output slice
/// unwritten (bounds are the caller's responsibility).
pub fn index_select(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    axis: usize,
    indices: &TensorRef,
    out: &TensorMut,
) -> Result<()> {
    on_stream(stream, "index_select", &[("x", x), ("indices", indices), ("out", out)])?;
    let Some(p) = plan_index_select(x, axis, indices, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, INDEX, p.entry)?;
    launch::gather(
        stream,
        &f,
        x.address(),
        indices.address(),
        p.idx64,
        out.address(),
        &p.layouts,
        p.axis,
        p.n,
    )
}

/// `target.select(axis, indices[i]) += values.select(axis, i)` (in place; duplicate
/// indices accumulate): `values` has `target`'s dims with `dims[axis]` replaced by the
/// length of the 1-D `indices` (`I64` or `I32`), and `target`'s dtype (F32, F16, BF16,
/// F64, I32 or I64; ints wrap). An index outside `0..target.dims[axis]` adds nothing
/// (bounds are the caller's responsibility). Atomic adds; in the engine's deterministic
/// mode this is [`index_add_ordered`].
pub fn index_add(
    stream: &Arc<CudaStream>,
    target: &TensorMut,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
) -> Result<()> {
    if deterministic() {
        return index_add_ordered(stream, target, axis, indices, values);
    }
    on_stream(
        stream,
        "index_add",
        &[("target", target), ("indices", indices), ("values", values)],
    )?;
    let Some(p) = plan_index_add(target, axis, indices, values, false)? else {
        return Ok(());
    };
    match plan_index_add_rows(target, axis, indices, values) {
        Some(rows) => index_add_rows(stream, &rows, target, indices, values),
        None => launch_add(stream, &p, target, indices, values),
    }
}

/// [`index_add`] with every element's additions in index order (one thread per line along
/// the axis, no atomics): bit-reproducible.
pub fn index_add_ordered(
    stream: &Arc<CudaStream>,
    target: &TensorMut,
    axis: usize,
    indices: &TensorRef,
    values: &TensorRef,
) -> Result<()> {
    add_with(stream, "index_add", plan_index_add, target, axis, indices, values, true)
}

/// `out[b.., s..] = x[indices[b.., 0], .., indices[b.., K - 1], s..]`: `indices` (`I64`
/// or `I32`) has dims `[.., K]` with `K <= x`'s rank; `out` has dims
/// `indices.dims[..-1] ++ x.dims[K..]` and `x`'s dtype (any dtype). An index tuple with a
/// coordinate outside `0..x.dims[j]` yields a slice of zeros (bounds are the caller's
/// responsibility).
pub fn gather_nd(stream: &Arc<CudaStream>, x: &TensorRef, indices: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "gather_nd", &[("x", x), ("indices", indices), ("out", out)])?;
    let Some(p) = plan_gather_nd(x, indices, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, INDEX, p.entry)?;
    launch::gather_nd(
        stream,
        &f,
        x.address(),
        indices.address(),
        p.idx64,
        out.address(),
        &p.layouts,
        &p.indexed,
        p.coord_stride,
        p.n,
    )
}

/// `target[indices[b.., 0], .., indices[b.., K - 1], s..] op= values[b.., s..]` (in place):
/// `indices` (`I64` or `I32`) has dims `[.., K]` with `K <= target`'s rank; `values` has
/// dims `indices.dims[..-1] ++ target.dims[K..]` and `target`'s dtype (any dtype). An index
/// tuple with a coordinate outside `0..target.dims[j]` updates nothing (bounds are the
/// caller's responsibility).
///
/// Atomic updates: duplicate tuples combine through `op` in an unspecified order. `Add`,
/// `Mul`, `Min` and `Max` are order-independent up to float rounding for `Add` and `Mul`
/// (halfs round after every update); with `Assign` each element receives one of its
/// candidates (see [`ScatterNdOp`]). In the engine's deterministic mode
/// (`CUDNN_BACKEND_MODE=deterministic`) `Add`, `Mul` and `Assign` run
/// [`scatter_nd_ordered`] instead (bit-reproducible; `Assign` keeps the last tuple's
/// value); `Min` and `Max` stay atomic, their result is exact whatever the order.
pub fn scatter_nd(
    stream: &Arc<CudaStream>,
    target: &TensorMut,
    indices: &TensorRef,
    values: &TensorRef,
    op: ScatterNdOp,
) -> Result<()> {
    if deterministic() && matches!(op, ScatterNdOp::Add | ScatterNdOp::Mul | ScatterNdOp::Assign) {
        return scatter_nd_ordered(stream, target, indices, values, op);
    }
    on_stream(
        stream,
        "scatter_nd",
        &[("target", target), ("indices", indices), ("values", values)],
    )?;
    let Some(p) = plan_scatter_nd(target, indices, values, false)? else {
        return Ok(());
    };
    let f = stream_function(stream, INDEX, p.entry)?;
    launch::scatter_nd(
        stream,
        &f,
        target.address(),
        indices.address(),
        p.idx64,
        values.address(),
        &p.layouts,
        &p.indexed,
        p.coord_stride,
        op.code(),
        p.n,
    )
}

/// [`scatter_nd`] without atomics, bit-reproducible: every target element's updates are
/// applied by one thread in tuple order (the order of the indices' dims but the last,
/// row-major), as burn-ndarray applies them. `Assign` keeps the value of the last tuple
/// that addresses an element; `Add` and `Mul` combine from the current element in f32 for
/// F16/BF16 (rounded once at the end, unlike the atomic form, which rounds after every
/// update), in the dtype for F32/F64, and wrapping for ints (the same result as the atomic
/// form); `Min` and `Max` as [`scatter_nd`].
///
/// Enqueues three steps on `stream`: a key per tuple (the row-major index of the element it
/// addresses over the K indexed dims; out-of-range tuples sort last and are skipped), a
/// stable [`sort`](crate::kernels::sort::sort) of the keys, and the update, one thread
/// per run of equal keys and slice element. Scratch: 24 bytes per index tuple (keys, sorted
/// keys, permutation) plus the sort's merge scratch above
/// [`MAX_SORT_LEN`](crate::kernels::sort::MAX_SORT_LEN) tuples, allocated stream-ordered
/// for the call. At most `i32::MAX` index tuples. Slower than the atomic form when many
/// tuples address the same element (their updates are serial).
pub fn scatter_nd_ordered(
    stream: &Arc<CudaStream>,
    target: &TensorMut,
    indices: &TensorRef,
    values: &TensorRef,
    op: ScatterNdOp,
) -> Result<()> {
    const OP: &str = "scatter_nd";
    on_stream(
        stream,
        OP,
        &[("target", target), ("indices", indices), ("values", values)],
    )?;
    let Some(p) = plan_scatter_nd(target, indices, values, true)? else {
        return Ok(());
    };
    let [keys_fn, update_fn] = stream_functions(stream, INDEX, [SCATTER_ND_KEYS, p.entry])?;
    let scratch = DeviceBuffer::alloc(stream, ordered_nd_scratch_bytes(p.tuples), OP)?;
    let (dims, strides) = ([p.tuples], [1i64]);
    let keys = scratch.view(0, &dims, &strides, DataType::I64)?;
    let sorted = scratch.view_mut(p.tuples, &dims, &strides, DataType::I64)?;
    let perm = scratch.view_mut(2 * p.tuples, &dims, &strides, DataType::I64)?;
    launch::scatter_nd_keys(
        stream,
        &keys_fn,
        indices.address(),
        p.idx64,
        keys.address(),
        &p.layouts[1],
        &p.indexed,
        p.coord_stride,
        p.slice,
        p.tuples,
    )?;
    crate::kernels::sort::sort(stream, &keys, 0, false, Some(&sorted), Some(&perm))?;
    launch::scatter_nd_ordered(
        stream,
        &update_fn,
        target.address(),
        sorted.address(),
        perm.address(),
        values.address(),
        &p.layouts,
        &p.indexed,
        p.slice,
        op.code(),
        p.n,
    )
    // `scratch` drops here (after its views): freed stream-ordered, after the queued work.
}

#[cfg(test)]
mod tests {
    use super::*;

    use DataType::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
    }

    #[test]
    fn whole_rows_along_axis_0_take_the_sorted_kernel() {
        let (target, idx, values) = (t(&[30522, 768], BF16), t(&[8192], I64), t(&[8192, 768], BF16));
        let p = plan_index_add_rows(&target, 0, &idx, &values).expect("rows plan");
        assert_eq!((p.entry, p.idx64), ("index_add_rows_bf16", true));
        assert_eq!(
            p.rows,
            RowsAdd {
                m: 8192,
                d: 768,
                axis_len: 30522,
                target_stride: 768,
                values_stride: 768
            }
        );
        // Trailing dims merge into the row; a gapped target row stride is kept.
        let target3 = ts(&[10, 4, 8], &[40, 8, 1], F32);
        let p = plan_index_add_rows(&target3, 0, &t(&[64], I32), &t(&[64, 4, 8], F32)).expect("rows plan");
        assert_eq!((p.rows.d, p.rows.target_stride, p.idx64), (32, 40, false));
        // Other axes, ints, few indices and non-contiguous rows keep the element-wise kernel.
        assert!(plan_index_add_rows(&t(&[768, 100], F32), 1, &t(&[100], I64), &t(&[768, 100], F32)).is_none());
        assert!(plan_index_add_rows(&t(&[100, 8], I64), 0, &idx, &t(&[8192, 8], I64)).is_none());
        assert!(plan_index_add_rows(&t(&[100, 8], F32), 0, &t(&[63], I64), &t(&[63, 8], F32)).is_none());
        let transposed = ts(&[100, 8], &[1, 100], F32);
        assert!(plan_index_add_rows(&transposed, 0, &t(&[64], I64), &t(&[64, 8], F32)).is_none());
    }

    #[test]
    fn sequential_adds_walk_each_line_along_the_axis() {
        use DataType::*;
        // scatter_add over axis 0 of [3, 4] values into a [5, 4] target: 4 lines (one per
        // column) of 3 steps; step a of line l reads values[a, l] and targets column l.
        let (target, idx, values) = (t(&[5, 4], F32), t(&[3, 4], I64), t(&[3, 4], F32));
        let p = plan_scatter_add(&target, 0, &idx, &values, true).unwrap().unwrap();
        assert_eq!((p.entry, p.line_len, p.n), ("scatter_add_seq_f32", 3, 12));
        for l in 0..4 {
            for a in 0..3 {
                let i = l * 3 + a;
                assert_eq!(p.layouts[2].host_offset(i), a * 4 + l, "values item {i}");
                assert_eq!(p.layouts[1].host_offset(i), a * 4 + l, "indices item {i}");
                assert_eq!(p.layouts[0].host_offset(i), l, "target item {i} (axis stride 0)");
            }
        }
        assert_eq!((p.axis.stride, p.axis.len), (4, 5));
        // index_add over axis 1 of [2, 6] values into [2, 3]: 2 lines of 6 steps.
        let p = plan_index_add(&t(&[2, 3], BF16), 1, &t(&[6], I32), &t(&[2, 6], BF16), true)
            .unwrap()
            .unwrap();
        assert_eq!((p.entry, p.line_len), ("scatter_add_seq_bf16", 6));
        assert_eq!(p.layouts[2].host_offset(6 + 2), 6 + 2);
        assert_eq!(p.layouts[1].host_offset(6 + 2), 2, "indices broadcast over lines");
        assert_eq!(p.layouts[0].host_offset(6 + 2), 3, "row 1 of the target");
        // The atomic plans keep the iteration order and no line length.
        let p = plan_scatter_add(&target, 0, &idx, &values, false).unwrap().unwrap();
        assert_eq!((p.entry, p.line_len), ("scatter_add_f32", 0));
    }

    use crate::kernels::invalid_argument as invalid;

    #[test]
    fn entry_names_by_dtype() {
        let i = t(&[2, 3], I64);
        for (d, e) in [
            (Bool, "gather_b1"),
            (U8, "gather_b1"),
            (I8, "gather_b1"),
            (F16, "gather_b2"),
            (BF16, "gather_b2"),
            (F32, "gather_b4"),
            (I32, "gather_b4"),
            (F64, "gather_b8"),
            (I64, "gather_b8"),
        ] {
            assert_eq!(
                plan_gather(&t(&[4, 3], d), 0, &i, &t(&[2, 3], d))
                    .unwrap()
                    .unwrap()
                    .entry,
                e
            );
            let v = t(&[3], I32);
            let p = plan_index_select(&t(&[4, 3], d), 0, &v, &t(&[3, 3], d))
                .unwrap()
                .unwrap();
            assert_eq!((p.entry, p.idx64), (e, false));
        }
        for (d, e) in [
            (F32, "scatter_add_f32"),
            (F16, "scatter_add_f16"),
            (BF16, "scatter_add_bf16"),
            (F64, "scatter_add_f64"),
            (I32, "scatter_add_i32"),
            (I64, "scatter_add_i64"),
        ] {
            let p = plan_scatter_add(&t(&[4, 3], d), 0, &i, &t(&[2, 3], d), false)
                .unwrap()
                .unwrap();
            assert_eq!((p.entry, p.idx64), (e, true));
            let v = t(&[5], I64);
            assert_eq!(
                plan_index_add(&t(&[4, 3], d), 1, &v, &t(&[4, 5], d), false)
                    .unwrap()
                    .unwrap()
                    .entry,
                e
            );
        }
        for d in [U8, I8, Bool] {
            let (op, arg, why) = invalid(plan_scatter_add(&t(&[4], d), 0, &t(&[4], I64), &t(&[4], d), false));
            assert_eq!((op, arg), ("scatter_add", "target"));
            assert!(why.contains(&format!("{d:?}")), "{why}");
            assert_eq!(
                invalid(plan_index_add(&t(&[4], d), 0, &t(&[4], I64), &t(&[4], d), false)).1,
                "target"
            );
        }
    }

    #[test]
    fn gather_layouts_zero_the_axis_and_carry_its_stride() {
        // x [5, 7] transposed, gather along axis 1 with indices [5, 3].
        let x = ts(&[5, 7], &[1, 5], F32);
        let p = plan_gather(&x, 1, &t(&[5, 3], I32), &t(&[5, 3], F32)).unwrap().unwrap();
        assert_eq!(p.axis, IndexAxis { stride: 5, len: 7 });
        assert_eq!(p.n, 15);
        assert_eq!(p.layouts[0].rank, 2);
        assert_eq!(&p.layouts[0].strides[..2], &[1, 0]);
        assert_eq!(&p.layouts[1].strides[..2], &[3, 1]);
        assert_eq!(&p.layouts[2].strides[..2], &[3, 1]);
        assert!(!p.idx64);
        // Along axis 0 of a packed [4, 6] with full-width indices: all merge into one dim
        // except that x's zero axis stride keeps two.
        let p = plan_gather(&t(&[4, 6], F16), 0, &t(&[2, 6], I64), &t(&[2, 6], F16))
            .unwrap()
            .unwrap();
        assert_eq!(p.axis, IndexAxis { stride: 6, len: 4 });
        assert_eq!((p.layouts[0].rank, &p.layouts[0].strides[..2]), (2, &[0i64, 1][..]));
        // Smaller indices than x off the axis are allowed; x keeps its own strides.
        let p = plan_gather(&t(&[4, 6], F32), 1, &t(&[2, 3], I64), &t(&[2, 3], F32))
            .unwrap()
            .unwrap();
        assert_eq!(&p.layouts[0].strides[..2], &[6, 0]);
        assert_eq!(p.axis, IndexAxis { stride: 1, len: 6 });
    }

    #[test]
    fn select_broadcasts_the_vector_indices() {
        let idx = ts(&[4], &[2], I64);
        let p = plan_index_select(&t(&[3, 5, 2], BF16), 1, &idx, &t(&[3, 4, 2], BF16))
            .unwrap()
            .unwrap();
        assert_eq!(p.n, 24);
        assert_eq!(p.axis, IndexAxis { stride: 2, len: 5 });
        assert_eq!(p.layouts[1].rank, 3);
        assert_eq!(&p.layouts[1].strides[..3], &[0, 2, 0]);
        assert_eq!(&p.layouts[0].strides[..3], &[10, 0, 1]);
        let p = plan_index_add(&t(&[6, 2], F32), 0, &t(&[3], I32), &ts(&[3, 2], &[1, 3], F32), false)
            .unwrap()
            .unwrap();
        assert_eq!(p.axis, IndexAxis { stride: 2, len: 6 });
        assert_eq!(&p.layouts[2].strides[..2], &[1, 3]);
        assert_eq!(&p.layouts[1].strides[..2], &[1, 0]);
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let x = t(&[4, 3], F32);
        let i = t(&[2, 3], I64);
        let o = t(&[2, 3], F32);
        // index dtype
        let (op, arg, why) = invalid(plan_gather(&x, 0, &t(&[2, 3], F32), &o));
        assert_eq!((op, arg), ("gather", "indices"));
        assert!(why.contains("F32"), "{why}");
        // axis
        let (_, arg, why) = invalid(plan_gather(&x, 2, &i, &o));
        assert_eq!(arg, "axis");
        assert!(why.contains("rank 2"), "{why}");
        assert_eq!(invalid(plan_index_select(&x, 5, &t(&[2], I32), &o)).1, "axis");
        assert_eq!(invalid(plan_index_add(&x, 2, &t(&[2], I32), &o, false)).1, "axis");
        // rank / off-axis dims
        assert_eq!(invalid(plan_gather(&x, 0, &t(&[6], I64), &t(&[6], F32))).1, "indices");
        assert_eq!(
            invalid(plan_gather(&x, 0, &t(&[2, 4], I64), &t(&[2, 4], F32))).1,
            "indices"
        );
        assert!(plan_gather(&x, 0, &t(&[9, 3], I64), &t(&[9, 3], F32)).is_ok());
        assert_eq!(
            invalid(plan_scatter_add(&x, 1, &t(&[5, 3], I64), &t(&[5, 3], F32), false)).1,
            "indices"
        );
        // out/values dims and dtypes
        assert_eq!(invalid(plan_gather(&x, 0, &i, &t(&[3, 3], F32))).1, "out");
        assert_eq!(invalid(plan_gather(&x, 0, &i, &t(&[2, 3], F16))).1, "out");
        assert_eq!(
            invalid(plan_scatter_add(&x, 0, &i, &t(&[2, 2], F32), false)).1,
            "values"
        );
        assert_eq!(
            invalid(plan_scatter_add(&x, 0, &i, &t(&[2, 3], F64), false)).1,
            "values"
        );
        assert_eq!(invalid(plan_index_select(&x, 0, &t(&[2, 1], I64), &o)).1, "indices");
        let (_, arg, why) = invalid(plan_index_select(&x, 1, &t(&[2], I64), &t(&[4, 3], F32)));
        assert_eq!(arg, "out");
        assert!(why.contains("[4, 2]"), "{why}");
        assert_eq!(
            invalid(plan_index_add(&x, 0, &t(&[2], I64), &t(&[2, 4], F32), false)).1,
            "values"
        );
        assert_eq!(
            invalid(plan_index_add(&x, 0, &t(&[2], I64), &t(&[2, 3], I32), false)).1,
            "values"
        );
        // dims/strides mismatch, negative dims, null pointers
        assert_eq!(invalid(plan_gather(&ts(&[4, 3], &[3], F32), 0, &i, &o)).1, "x");
        assert_eq!(
            invalid(plan_gather(&x, 0, &ts(&[-2, 3], &[3, 1], I64), &o)).1,
            "indices"
        );
        assert_eq!(
            invalid(plan_gather(&x, 0, &i, &TensorRef::fake_packed(&[2, 3], F32, 0))).1,
            "out"
        );
        assert_eq!(
            invalid(plan_scatter_add(
                &TensorRef::fake_packed(&[4, 3], F32, 0),
                0,
                &i,
                &o,
                false
            ))
            .1,
            "target"
        );
    }

    #[test]
    fn written_operands_must_not_overlap() {
        let x = t(&[4, 3], F32);
        let i = t(&[2, 3], I64);
        let (_, arg, why) = invalid(plan_gather(&x, 0, &i, &ts(&[2, 3], &[0, 1], F32)));
        assert_eq!(arg, "out");
        assert!(why.contains("overlap"), "{why}");
        assert_eq!(
            invalid(plan_scatter_add(
                &ts(&[4, 3], &[1, 1], F32),
                0,
                &i,
                &t(&[2, 3], F32),
                false
            ))
            .1,
            "target"
        );
        assert_eq!(
            invalid(plan_index_add(
                &ts(&[4, 3], &[0, 1], F32),
                0,
                &t(&[2], I64),
                &t(&[2, 3], F32),
                false
            ))
            .1,
            "target"
        );
        // Broadcast (0-stride) inputs are fine; so are negative strides.
        assert!(plan_gather(
            &ts(&[4, 3], &[0, 1], F32),
            0,
            &ts(&[2, 3], &[0, 0], I64),
            &t(&[2, 3], F32)
        )
        .is_ok());
        assert!(plan_scatter_add(&ts(&[4, 3], &[-3, 1], F32), 0, &i, &ts(&[2, 3], &[0, 1], F32), false).is_ok());
    }

    #[test]
    fn empty_iterations_plan_nothing_but_still_validate() {
        let x = t(&[4, 3], F32);
        assert!(plan_gather(&x, 0, &t(&[0, 3], I64), &t(&[0, 3], F32))
            .unwrap()
            .is_none());
        assert!(plan_index_select(&x, 1, &t(&[0], I32), &t(&[4, 0], F32))
            .unwrap()
            .is_none());
        assert!(
            plan_index_add(&x, 0, &t(&[0], I64), &TensorRef::fake_packed(&[0, 3], F32, 0), false)
                .unwrap()
                .is_none()
        );
        assert!(
            plan_scatter_add(&t(&[0, 3], I32), 0, &t(&[2, 3], I64), &t(&[2, 3], I32), false)
                .unwrap()
                .is_some()
        );
        invalid(plan_gather(&x, 0, &t(&[0, 3], F32), &t(&[0, 3], F32)));
        invalid(plan_index_add(&t(&[0], U8), 0, &t(&[0], I64), &t(&[0], U8), false));
        invalid(plan_index_select(&x, 0, &t(&[0], I64), &t(&[0, 4], F32)));
    }

    #[test]
    fn too_many_dims_is_an_error() {
        let dims = [2i64; 9];
        let strides: Vec<i64> = (0..9).map(|i| 1i64 << (2 * (8 - i))).collect();
        let x = ts(&dims, &strides, F32);
        let (_, _, why) = invalid(plan_gather(&x, 0, &t(&dims, I64), &t(&dims, F32)));
        assert!(why.contains("at most 8"), "{why}");
    }
    #[test]
    fn nd_entries_by_dtype() {
        let i = t(&[5, 2], I64);
        for (d, g, sc) in [
            (F32, "gather_nd_b4", "scatter_nd_f32"),
            (F16, "gather_nd_b2", "scatter_nd_f16"),
            (BF16, "gather_nd_b2", "scatter_nd_bf16"),
            (F64, "gather_nd_b8", "scatter_nd_f64"),
            (I32, "gather_nd_b4", "scatter_nd_i32"),
            (I64, "gather_nd_b8", "scatter_nd_i64"),
            (I8, "gather_nd_b1", "scatter_nd_i8"),
            (U8, "gather_nd_b1", "scatter_nd_u8"),
            (Bool, "gather_nd_b1", "scatter_nd_bool"),
        ] {
            let p = plan_gather_nd(&t(&[4, 3, 6], d), &i, &t(&[5, 6], d)).unwrap().unwrap();
            assert_eq!((p.entry, p.idx64), (g, true));
            let p = plan_scatter_nd(&t(&[4, 3, 6], d), &t(&[5, 2], I32), &t(&[5, 6], d), false)
                .unwrap()
                .unwrap();
            assert_eq!((p.entry, p.idx64), (sc, false));
        }
        let codes: Vec<i32> = [
            ScatterNdOp::Assign,
            ScatterNdOp::Add,
            ScatterNdOp::Mul,
            ScatterNdOp::Min,
            ScatterNdOp::Max,
        ]
        .iter()
        .map(|o| o.code())
        .collect();
        assert_eq!(codes, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn ordered_nd_entries_sizes_and_scratch() {
        for (d, e) in [
            (F32, "scatter_nd_ordered_f32"),
            (F16, "scatter_nd_ordered_f16"),
            (BF16, "scatter_nd_ordered_bf16"),
            (F64, "scatter_nd_ordered_f64"),
            (I32, "scatter_nd_ordered_i32"),
            (I64, "scatter_nd_ordered_i64"),
            (I8, "scatter_nd_ordered_i8"),
            (U8, "scatter_nd_ordered_u8"),
            (Bool, "scatter_nd_ordered_bool"),
        ] {
            let (x, i, v) = (t(&[4, 3, 6], d), t(&[5, 2], I32), t(&[5, 6], d));
            let ordered = plan_scatter_nd(&x, &i, &v, true).unwrap().unwrap();
            let atomic = plan_scatter_nd(&x, &i, &v, false).unwrap().unwrap();
            assert_eq!((ordered.entry, ordered.tuples, ordered.slice, ordered.n), (e, 5, 6, 30));
            // Only the kernel differs.
            assert_eq!(NdPlan { entry: e, ..atomic }, ordered);
        }
        // (target dims, indices dims, tuples, slice)
        for (xd, id, tuples, slice) in [
            (&[4i64, 3, 6][..], &[2i64, 5, 2][..], 10, 6),
            (&[4, 3], &[7, 2], 7, 1),
            (&[4, 3], &[5, 0], 5, 12),
            (&[4, 9], &[1], 1, 9),
            (&[2, 3, 4, 5], &[2, 2, 3], 4, 5),
        ] {
            let k = *id.last().unwrap() as usize;
            let vd = [&id[..id.len() - 1], &xd[k..]].concat();
            let p = plan_scatter_nd(&t(xd, F32), &t(id, I64), &t(&vd, F32), true)
                .unwrap()
                .unwrap();
            assert_eq!(
                (p.tuples, p.slice, p.n),
                (tuples, slice, tuples * slice),
                "{xd:?} {id:?}"
            );
        }
        assert_eq!(ordered_nd_scratch_bytes(1), 24);
        assert_eq!(ordered_nd_scratch_bytes(1000), 24_000);
        assert_eq!(SCATTER_ND_KEYS, "scatter_nd_keys");
    }

    /// What the ordered kernels assume of the plan's layouts: item `t * slice` of the
    /// indices' layout is tuple t's first coordinate, item `t * slice + e` of the target's
    /// is element e of the slice whatever t (the tuple dims have stride 0), and values item
    /// `t * slice + e` is element e of tuple t's values.
    #[test]
    fn ordered_nd_items_split_into_tuple_and_slice() {
        // target [6, 5, 4] transposed, K = 2, indices [3, 4, 2] stored transposed, values
        // [3, 4, 4] gapped.
        let x = ts(&[6, 5, 4], &[1, 6, 30], F16);
        let idx = ts(&[3, 4, 2], &[1, 3, 12], I32);
        let v = ts(&[3, 4, 4], &[32, 8, 2], F16);
        let p = plan_scatter_nd(&x, &idx, &v, true).unwrap().unwrap();
        assert_eq!((p.tuples, p.slice, p.coord_stride), (12, 4, 12));
        assert_eq!(
            (&p.indexed.shape[..2], &p.indexed.strides[..2]),
            (&[6i64, 5][..], &[1i64, 6][..])
        );
        for tuple in 0..12 {
            let (a, b) = (tuple / 4, tuple % 4);
            assert_eq!(p.layouts[1].host_offset(tuple * 4), a + 3 * b, "tuple {tuple}");
            for e in 0..4 {
                let i = tuple * 4 + e;
                assert_eq!(p.layouts[0].host_offset(i), p.layouts[0].host_offset(e));
                assert_eq!(p.layouts[0].host_offset(e), 30 * e);
                assert_eq!(p.layouts[2].host_offset(i), 32 * a + 8 * b + 2 * e);
            }
        }
        // Broadcast indices (one tuple for all) and values: still one key per tuple.
        let p = plan_scatter_nd(
            &t(&[4, 3], F32),
            &ts(&[5, 1], &[0, 0], I64),
            &ts(&[5, 3], &[0, 1], F32),
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.tuples, p.slice), (5, 3));
        assert!((0..5).all(|tuple| p.layouts[1].host_offset(tuple * 3) == 0));
    }

    #[test]
    fn ordered_nd_sorts_at_most_i32_max_tuples() {
        let x = t(&[4, 3], F32);
        let many = i32::MAX as i64 + 1;
        let (i, v) = (t(&[many, 1], I64), t(&[many, 3], F32));
        let (op, arg, why) = invalid(plan_scatter_nd(&x, &i, &v, true));
        assert_eq!((op, arg), ("scatter_nd", "indices"));
        assert!(why.contains(&many.to_string()) && why.contains("ordered"), "{why}");
        // The atomic form has no such limit, and the ordered one takes i32::MAX tuples.
        assert!(plan_scatter_nd(&x, &i, &v, false).unwrap().is_some());
        let (i, v) = (t(&[many - 1, 1], I64), t(&[many - 1, 3], F32));
        assert_eq!(
            plan_scatter_nd(&x, &i, &v, true).unwrap().unwrap().tuples,
            i32::MAX as i64
        );
        // Validation and empty plans are the atomic form's.
        assert_eq!(
            invalid(plan_scatter_nd(&x, &t(&[5, 1], I64), &t(&[5, 3], I32), true)).1,
            "values"
        );
        assert!(plan_scatter_nd(&x, &t(&[0, 1], I64), &t(&[0, 3], F32), true)
            .unwrap()
            .is_none());
    }

    #[test]
    fn nd_layouts_split_tuple_and_slice_dims() {
        // data [4, 3, 6] (transposed storage), indices [2, 5, 2] packed, out [2, 5, 6].
        let data = ts(&[4, 3, 6], &[1, 4, 12], F32);
        let p = plan_gather_nd(&data, &t(&[2, 5, 2], I64), &t(&[2, 5, 6], F32))
            .unwrap()
            .unwrap();
        assert_eq!(p.n, 60);
        assert_eq!(p.coord_stride, 1);
        assert_eq!(p.indexed.rank, 2);
        assert_eq!(
            (&p.indexed.shape[..2], &p.indexed.strides[..2]),
            (&[4i64, 3][..], &[1i64, 4][..])
        );
        // The two tuple dims merge (indices and out chain; data has 0 strides there).
        assert_eq!(p.layouts[0].rank, 2);
        assert_eq!(&p.layouts[0].shape[..2], &[10, 6]);
        assert_eq!(&p.layouts[0].strides[..2], &[0, 12]);
        assert_eq!(&p.layouts[1].strides[..2], &[2, 0]);
        assert_eq!(&p.layouts[2].strides[..2], &[6, 1]);
        // K = rank: the slices are single elements; indices transposed ([3, 2] stored as
        // [2, 3]): coordinates 3 apart.
        let p = plan_scatter_nd(&t(&[4, 3], I32), &ts(&[3, 2], &[1, 3], I64), &t(&[3], I32), false)
            .unwrap()
            .unwrap();
        assert_eq!((p.n, p.coord_stride), (3, 3));
        assert_eq!((p.layouts[1].rank, p.layouts[1].strides[0]), (1, 1));
        assert_eq!(
            (&p.indexed.shape[..2], &p.indexed.strides[..2]),
            (&[4i64, 3][..], &[3i64, 1][..])
        );
        // K = 0: every tuple is the whole tensor; rank-1 indices: one tuple.
        let p = plan_scatter_nd(&t(&[4, 3], F64), &t(&[5, 0], I64), &t(&[5, 4, 3], F64), false)
            .unwrap()
            .unwrap();
        assert_eq!((p.indexed.rank, p.n), (0, 60));
        assert_eq!(&p.layouts[0].strides[..2], &[0, 1]);
        let p = plan_gather_nd(&t(&[4, 3], U8), &t(&[1], I32), &t(&[3], U8))
            .unwrap()
            .unwrap();
        assert_eq!((p.indexed.rank, p.n, p.layouts[1].rank), (1, 3, 1));
        assert_eq!(p.layouts[1].strides[0], 0);
    }

    #[test]
    fn nd_argument_errors_name_the_argument() {
        let x = t(&[4, 3], F32);
        let i = t(&[5, 1], I64);
        let (op, arg, why) = invalid(plan_gather_nd(&x, &t(&[5, 3], I64), &t(&[5], F32)));
        assert_eq!((op, arg), ("gather_nd", "indices"));
        assert!(why.contains("rank 2"), "{why}");
        assert_eq!(invalid(plan_gather_nd(&x, &t(&[], I64), &t(&[], F32))).1, "indices");
        assert_eq!(
            invalid(plan_gather_nd(&x, &t(&[5, 1], F32), &t(&[5, 3], F32))).1,
            "indices"
        );
        let (_, arg, why) = invalid(plan_gather_nd(&x, &i, &t(&[5, 4], F32)));
        assert_eq!(arg, "out");
        assert!(why.contains("[5, 3]"), "{why}");
        assert_eq!(invalid(plan_gather_nd(&x, &i, &t(&[5, 3], F16))).1, "out");
        assert_eq!(invalid(plan_gather_nd(&x, &i, &ts(&[5, 3], &[0, 1], F32))).1, "out");
        let (op, arg, _) = invalid(plan_scatter_nd(&x, &i, &t(&[5, 3], I32), false));
        assert_eq!((op, arg), ("scatter_nd", "values"));
        assert_eq!(
            invalid(plan_scatter_nd(&ts(&[4, 3], &[0, 1], F32), &i, &t(&[5, 3], F32), false)).1,
            "target"
        );
        assert_eq!(
            invalid(plan_scatter_nd(
                &TensorRef::fake_packed(&[4, 3], F32, 0),
                &i,
                &t(&[5, 3], F32),
                false
            ))
            .1,
            "target"
        );
        // Broadcast values and indices are fine, and so is an empty target with tuples
        // (all out of range).
        assert!(plan_scatter_nd(&x, &ts(&[5, 1], &[0, 0], I64), &ts(&[5, 3], &[0, 1], F32), false).is_ok());
        assert!(plan_scatter_nd(&t(&[0, 3], F32), &i, &t(&[5, 3], F32), false)
            .unwrap()
            .is_some());
        // Nothing to do: no tuples or empty slices.
        assert!(plan_scatter_nd(&x, &t(&[0, 1], I64), &t(&[0, 3], F32), false)
            .unwrap()
            .is_none());
        assert!(plan_gather_nd(&t(&[4, 0], F32), &i, &t(&[5, 0], F32))
            .unwrap()
            .is_none());
        // Too many dims after merging.
        let dims = [2i64; 9];
        let strides: Vec<i64> = (0..9).map(|i| 1i64 << (2 * (8 - i))).collect();
        let (_, _, why) = invalid(plan_gather_nd(
            &ts(&dims, &strides, F32),
            &t(&[3, 1], I64),
            &t(&[3, 2, 2, 2, 2, 2, 2, 2, 2], F32),
        ));
        assert!(why.contains("at most 8"), "{why}");
    }
}
