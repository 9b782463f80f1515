//! Sort kernels on strided views: a stable sort of every row along one axis, writing the
//! sorted values and/or the original indices.
//!
//! [`sort`] takes the stream first, validates all its arguments, and only enqueues work
//! (it never synchronizes). The input may be arbitrarily strided (negative and 0 strides
//! included); each output must have the input's dims, must not overlap itself (no 0 stride
//! on a dim > 1) and must not alias the input. Empty inputs return `Ok(())` at once after
//! validation.
//!
//! **Order.** The sort is stable: equal keys keep their original order, in ascending and
//! in descending sorts alike (as PyTorch's `stable=True`), so argsort is deterministic.
//! NaN sorts as the largest value (after +inf ascending, first descending); -0.0 and
//! +0.0 are equal. F16 and BF16 compare through f32; values are copied bit-exactly from
//! the input.
//!
//! **Row length.** Rows (the length of `axis`) of up to [`MAX_SORT_LEN`] = 4096 elements
//! are sorted by one block in shared memory. Longer rows (up to `i32::MAX` elements) are
//! merge-sorted: chunks of [`MAX_SORT_LEN`] are sorted the same way into scratch memory
//! (12 bytes per element of x, 24 when more than one merge pass runs; allocated
//! stream-ordered for the call and released after it), then runs are merged pairwise in
//! `ceil(log2(len / 4096))` passes, the last one writing the outputs. The order is the
//! same either way.
//!
//! Host work is split in two: a pure `plan_sort` (validation, layouts, kernel choice,
//! block and shared-memory size, merge passes) that needs no device, and the launch of the
//! planned kernels (`kernels/sort.cu`: `sort_rows_<dt>`, a bitonic sort of (key, index)
//! pairs padded to a power of two with sentinels that sort after every element; for long
//! rows `sort_chunks_<dt>` and `merge_runs_b{1,2,4,8}`, a merge-path merge of sorted runs).

use crate::kernels::check::{check_tensor, on_stream, on_stream_opt};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_sort::{self as launch, MergePass, SortRows};
use crate::ffi::memory::DeviceBuffer;
use crate::graph::{may_overlap, DataType};
use crate::kernels::layout::{coalesce, kernel_layout};
use crate::kernels::{stream_function, stream_functions, SORT};
use crate::types::{TensorMut, TensorRef};

/// Longest row (length of the sorted axis) one block sorts in shared memory; longer rows
/// are merge-sorted from chunks of this length (`SORT_CHUNK` in `kernels/sort.cu`).
pub const MAX_SORT_LEN: i64 = 4096;

/// Longest row [`sort`] accepts (row positions are i32 in the merge scratch).
const MAX_MERGE_LEN: i64 = i32::MAX as i64;

/// Outputs per thread of a merge pass (`MERGE_ITEMS` in `kernels/sort.cu`; divides
/// [`MAX_SORT_LEN`]).
const MERGE_ITEMS: i64 = 8;

/// Bytes of shared memory per padded element: an 8-byte key and a 4-byte index.
const SHARED_BYTES_PER_ELEMENT: i64 = 8 + 4;

/// Most threads per block.
const MAX_THREADS: i64 = 1024;

// ---------------------------------------------------------------------------------------
// Plan (pure host logic)

/// What [`sort`] launches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SortPlan {
    pub entry: &'static str,
    /// Layouts of (x, values, indices) over the row shape (every dim but the axis); an
    /// output that is not written gets x's layout (unused).
    pub layouts: [KernelLayout; 3],
    /// Strides of (x, values, indices) along the axis.
    pub axis_strides: [i64; 3],
    pub rows: SortRows,
    pub write_values: bool,
    pub write_indices: bool,
    /// For rows longer than [`MAX_SORT_LEN`]: the chunk sort and merge passes (`rows` then
    /// describes the chunk sort: `padded` = [`MAX_SORT_LEN`]).
    pub merge: Option<MergeSort>,
}

/// The long-row path of a [`SortPlan`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MergeSort {
    /// `sort_chunks_<dt>`.
    pub chunk_entry: &'static str,
    /// `merge_runs_b{1,2,4,8}` by element size.
    pub merge_entry: &'static str,
    /// Chunks of [`MAX_SORT_LEN`] per row.
    pub chunks: i64,
    /// Merge passes (widths `MAX_SORT_LEN * 2^p`); the last writes the outputs.
    pub passes: u32,
    /// Scratch (keys, indices) array pairs: 1 for a single pass, else 2 (ping-pong).
    pub pairs: usize,
    /// Elements of one scratch array (`rows * len`).
    pub elements: i64,
}

impl MergeSort {
    /// Bytes of scratch: `pairs` u64 key arrays, then `pairs` i32 index arrays.
    pub fn scratch_bytes(&self) -> usize {
        self.pairs * self.elements as usize * (8 + 4)
    }

    /// Device addresses of scratch pair `k` (keys, indices) in a buffer at `base`.
    pub(crate) fn pair(
        &self,
        base: crate::types::DeviceAddress,
        k: usize,
    ) -> (crate::types::DeviceAddress, crate::types::DeviceAddress) {
        let n = self.elements as u64;
        let keys = base.offset_bytes(8 * n * k as u64);
        let idx = base.offset_bytes(8 * n * self.pairs as u64 + 4 * n * k as u64);
        (keys, idx)
    }
}

/// `sort_rows_<dt>` (every dtype is supported).
fn entry(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F32 => "sort_rows_f32",
        DataType::F16 => "sort_rows_f16",
        DataType::BF16 => "sort_rows_bf16",
        DataType::F64 => "sort_rows_f64",
        DataType::I64 => "sort_rows_i64",
        DataType::I32 => "sort_rows_i32",
        DataType::I8 => "sort_rows_i8",
        DataType::U8 => "sort_rows_u8",
        DataType::Bool => "sort_rows_bool",
    }
}

/// `sort_chunks_<dt>`.
fn chunk_entry(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F32 => "sort_chunks_f32",
        DataType::F16 => "sort_chunks_f16",
        DataType::BF16 => "sort_chunks_bf16",
        DataType::F64 => "sort_chunks_f64",
        DataType::I64 => "sort_chunks_i64",
        DataType::I32 => "sort_chunks_i32",
        DataType::I8 => "sort_chunks_i8",
        DataType::U8 => "sort_chunks_u8",
        DataType::Bool => "sort_chunks_bool",
    }
}

/// `merge_runs_b{1,2,4,8}` by element size.
fn merge_entry(dtype: DataType) -> &'static str {
    match dtype.size() {
        1 => "merge_runs_b1",
        2 => "merge_runs_b2",
        4 => "merge_runs_b4",
        _ => "merge_runs_b8",
    }
}

/// Checks an output: its own consistency, `want` dtype, x's dims, no self-overlap, and
/// not the same memory as x.
fn check_output(op: &'static str, arg: &'static str, t: &TensorRef, want: DataType, x: &TensorRef) -> Result<()> {
    let numel = check_tensor(op, arg, t)?;
    if t.dtype != want {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dtype {:?} is not {want:?}", t.dtype),
        ));
    }
    if t.dims != x.dims {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dims {:?} differ from x's {:?}", t.dims, x.dims),
        ));
    }
    if may_overlap(&t.dims, &t.strides) {
        let msg = format!(
            "dims {:?} with strides {:?} overlap (a 0 or too small stride)",
            t.dims, t.strides
        );
        return Err(Error::invalid_arg(op, arg, msg));
    }
    if numel > 0 && t.ptr == x.ptr {
        return Err(Error::invalid_arg(
            op,
            arg,
            "must not alias x (the sort is not in place)",
        ));
    }
    Ok(())
}

/// `v` without its element `axis`.
fn without_axis(v: &[i64], axis: usize) -> Vec<i64> {
    v.iter()
        .enumerate()
        .filter(|&(d, _)| d != axis)
        .map(|(_, &s)| s)
        .collect()
}

pub(crate) fn plan_sort(
    x: &TensorRef,
    axis: usize,
    descending: bool,
    values_out: Option<&TensorRef>,
    indices_out: Option<&TensorRef>,
) -> Result<Option<SortPlan>> {
    const OP: &str = "sort";
    let numel = check_tensor(OP, "x", x)?;
    let entry = entry(x.dtype);
    let rank = x.dims.len();
    if axis >= rank {
        return Err(Error::invalid_arg(
            OP,
            "axis",
            format!("axis {axis} is out of range for x of rank {rank}"),
        ));
    }
    if let Some(v) = values_out {
        check_output(OP, "values_out", v, x.dtype, x)?;
    }
    if let Some(i) = indices_out {
        check_output(OP, "indices_out", i, DataType::I64, x)?;
    }
    let len = x.dims[axis];
    if len > MAX_MERGE_LEN {
        return Err(Error::invalid_arg(
            OP,
            "x",
            format!("rows longer than {MAX_MERGE_LEN} elements are not supported (axis {axis} has {len})"),
        ));
    }
    if numel == 0 || (values_out.is_none() && indices_out.is_none()) {
        return Ok(None);
    }
    let strides_of = |t: Option<&TensorRef>| t.map_or_else(|| x.strides.clone(), |t| t.strides.clone());
    let all = [x.strides.clone(), strides_of(values_out), strides_of(indices_out)];
    let axis_strides = [all[0][axis], all[1][axis], all[2][axis]];
    let row_strides: Vec<Vec<i64>> = all.iter().map(|s| without_axis(s, axis)).collect();
    let (shape, merged) = coalesce(&without_axis(&x.dims, axis), &row_strides);
    let layouts = [
        kernel_layout(OP, &shape, &merged[0])?,
        kernel_layout(OP, &shape, &merged[1])?,
        kernel_layout(OP, &shape, &merged[2])?,
    ];
    let rows = numel / len;
    let merge = (len > MAX_SORT_LEN).then(|| {
        let chunks = (len + MAX_SORT_LEN - 1) / MAX_SORT_LEN;
        let passes = (chunks as u64).next_power_of_two().trailing_zeros();
        MergeSort {
            chunk_entry: chunk_entry(x.dtype),
            merge_entry: merge_entry(x.dtype),
            chunks,
            passes,
            pairs: if passes > 1 { 2 } else { 1 },
            elements: numel,
        }
    });
    let padded = (len.min(MAX_SORT_LEN) as u64).next_power_of_two() as i64;
    Ok(Some(SortPlan {
        entry,
        layouts,
        axis_strides,
        rows: SortRows {
            len,
            padded,
            rows,
            descending,
            threads: padded.clamp(32, MAX_THREADS) as u32,
            shared_bytes: (padded * SHARED_BYTES_PER_ELEMENT) as u32,
        },
        write_values: values_out.is_some(),
        write_indices: indices_out.is_some(),
        merge,
    }))
}

/// Enqueues the long-row path of `p`: the chunk sort into scratch memory, then the merge
/// passes, the last one writing `values` / `indices` (0 when not written). The scratch
/// buffer is freed stream-ordered after the last pass.
fn merge_sort(
    stream: &Arc<CudaStream>,
    p: &SortPlan,
    m: &MergeSort,
    x: crate::types::DeviceAddress,
    values: crate::types::DeviceAddress,
    indices: crate::types::DeviceAddress,
) -> Result<()> {
    let [chunk_fn, merge_fn] = stream_functions(stream, SORT, [m.chunk_entry, m.merge_entry])?;
    let scratch = DeviceBuffer::alloc(stream, m.scratch_bytes(), "sort")?;
    let pair = |k: usize| m.pair(scratch.address(), k);
    let (keys, idx) = pair(0);
    launch::sort_chunks(
        stream,
        &chunk_fn,
        x,
        keys,
        idx,
        &p.layouts[0],
        p.axis_strides[0],
        m.chunks,
        &p.rows,
    )?;
    let mut width = MAX_SORT_LEN;
    for pass in 0..m.passes {
        let last = pass + 1 == m.passes;
        let src = pair(pass as usize % 2);
        let dst = (!last).then(|| pair((pass as usize + 1) % 2));
        let merge = MergePass {
            len: p.rows.len,
            width,
            rows: p.rows.rows,
            items: MERGE_ITEMS,
        };
        launch::merge_runs(
            stream,
            &merge_fn,
            x,
            src,
            dst,
            values,
            indices,
            &p.layouts,
            &p.axis_strides,
            &merge,
        )?;
        width *= 2;
    }
    drop(scratch);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Public API

/// Sorts every row of `x` along `axis` (rows: all combinations of the other indices),
/// writing the sorted values to `values_out` (x's dims and dtype) and/or the original
/// positions along `axis` to `indices_out` (x's dims, `I64`). The sort is stable (ties
/// keep their order, also when `descending`) and NaN sorts as the largest value. Rows
/// longer than [`MAX_SORT_LEN`] elements are merge-sorted through scratch memory allocated
/// for the call (see the module docs). dtypes: F32, F16, BF16, F64, I64, I32, I8, U8,
/// Bool. With neither output nothing is enqueued.
pub fn sort(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    axis: usize,
    descending: bool,
    values_out: Option<&TensorMut>,
    indices_out: Option<&TensorMut>,
) -> Result<()> {
    on_stream(stream, "sort", &[("x", x)])?;
    let (values_out, indices_out) = (values_out.map(|t| &**t), indices_out.map(|t| &**t));
    on_stream_opt(
        stream,
        "sort",
        &[("values_out", values_out), ("indices_out", indices_out)],
    )?;
    let Some(p) = plan_sort(x, axis, descending, values_out, indices_out)? else {
        return Ok(());
    };
    // A pointer of 0 tells the kernel not to write that output.
    let values = crate::types::DeviceAddress::of(values_out);
    let indices = crate::types::DeviceAddress::of(indices_out);
    if let Some(m) = &p.merge {
        return merge_sort(stream, &p, m, x.address(), values, indices);
    }
    let f = stream_function(stream, SORT, p.entry)?;
    launch::sort_rows(
        stream,
        &f,
        x.address(),
        values,
        indices,
        &p.layouts,
        &p.axis_strides,
        &p.rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use DataType::*;

    const P: u64 = 0x1000;
    const Q: u64 = 0x8000;
    const R: u64 = 0x10000;

    fn t(dims: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, ptr)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, ptr)
    }

    use crate::kernels::invalid_argument as invalid;

    #[test]
    fn entry_names_by_dtype() {
        for (d, e) in [
            (F32, "sort_rows_f32"),
            (F16, "sort_rows_f16"),
            (BF16, "sort_rows_bf16"),
            (F64, "sort_rows_f64"),
            (I64, "sort_rows_i64"),
            (I32, "sort_rows_i32"),
            (I8, "sort_rows_i8"),
            (U8, "sort_rows_u8"),
            (Bool, "sort_rows_bool"),
        ] {
            let p = plan_sort(&t(&[3, 5], d, P), 1, false, Some(&t(&[3, 5], d, Q)), None)
                .unwrap()
                .unwrap();
            assert_eq!(p.entry, e);
            assert!(p.write_values && !p.write_indices);
        }
    }

    #[test]
    fn block_and_shared_memory_follow_the_padded_length() {
        for (len, padded, threads) in [
            (1, 1, 32),
            (2, 2, 32),
            (3, 4, 32),
            (17, 32, 32),
            (100, 128, 128),
            (1000, 1024, 1024),
            (4096, 4096, 1024),
        ] {
            let x = t(&[2, len], F32, P);
            let p = plan_sort(&x, 1, true, None, Some(&t(&[2, len], I64, R)))
                .unwrap()
                .unwrap();
            assert_eq!(
                p.rows,
                SortRows {
                    len,
                    padded,
                    rows: 2,
                    descending: true,
                    threads,
                    shared_bytes: (padded * 12) as u32,
                }
            );
            assert!(p.rows.shared_bytes <= 48 * 1024);
        }
    }

    #[test]
    fn layouts_drop_the_axis_and_carry_its_strides() {
        // x [4, 5, 6] sorted along the middle axis, x transposed, values packed, indices
        // gapped.
        let x = ts(&[4, 5, 6], &[1, 4, 20], F16, P);
        let v = t(&[4, 5, 6], F16, Q);
        let i = ts(&[4, 5, 6], &[60, 12, 2], I64, R);
        let p = plan_sort(&x, 1, false, Some(&v), Some(&i)).unwrap().unwrap();
        assert_eq!(p.axis_strides, [4, 6, 12]);
        assert_eq!(p.rows.rows, 24);
        assert_eq!(p.rows.len, 5);
        assert_eq!(p.layouts[0].rank, 2);
        assert_eq!(&p.layouts[0].shape[..2], &[4, 6]);
        assert_eq!(&p.layouts[0].strides[..2], &[1, 20]);
        assert_eq!(&p.layouts[1].strides[..2], &[30, 1]);
        assert_eq!(&p.layouts[2].strides[..2], &[60, 2]);
        // Packed along the last axis: the rows merge into one dim.
        let p = plan_sort(&t(&[3, 4, 7], I32, P), 2, false, Some(&t(&[3, 4, 7], I32, Q)), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.layouts[0].rank, p.layouts[0].shape[0], p.layouts[0].strides[0]),
            (1, 12, 7)
        );
        assert_eq!(p.axis_strides, [1, 1, 1]);
        // Axis first of a rank-1 tensor: one row, rank-0 layouts.
        let p = plan_sort(&t(&[9], U8, P), 0, false, None, Some(&t(&[9], I64, R)))
            .unwrap()
            .unwrap();
        assert_eq!((p.rows.rows, p.layouts[0].rank), (1, 0));
        assert!(!p.write_values && p.write_indices);
        // An absent output gets x's layout.
        assert_eq!(p.layouts[1], p.layouts[0]);
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let x = t(&[4, 3], F32, P);
        let v = t(&[4, 3], F32, Q);
        let i = t(&[4, 3], I64, R);
        let (op, arg, why) = invalid(plan_sort(&x, 2, false, Some(&v), None));
        assert_eq!((op, arg), ("sort", "axis"));
        assert!(why.contains("rank 2"), "{why}");
        assert_eq!(
            invalid(plan_sort(&x, 0, false, Some(&t(&[4, 3], F16, Q)), None)).1,
            "values_out"
        );
        assert_eq!(
            invalid(plan_sort(&x, 0, false, Some(&t(&[3, 4], F32, Q)), None)).1,
            "values_out"
        );
        let (_, arg, why) = invalid(plan_sort(&x, 0, false, None, Some(&t(&[4, 3], I32, R))));
        assert_eq!(arg, "indices_out");
        assert!(why.contains("I64"), "{why}");
        assert_eq!(
            invalid(plan_sort(&x, 0, false, Some(&v), Some(&t(&[4], I64, R)))).1,
            "indices_out"
        );
        // Self-overlapping outputs and outputs aliasing x.
        let (_, arg, why) = invalid(plan_sort(&x, 0, false, Some(&ts(&[4, 3], &[0, 1], F32, Q)), None));
        assert_eq!(arg, "values_out");
        assert!(why.contains("overlap"), "{why}");
        assert_eq!(
            invalid(plan_sort(&x, 1, false, None, Some(&ts(&[4, 3], &[1, 1], I64, R)))).1,
            "indices_out"
        );
        assert_eq!(
            invalid(plan_sort(&x, 0, false, Some(&t(&[4, 3], F32, P)), Some(&i))).1,
            "values_out"
        );
        // Broadcast and negative-stride inputs are fine.
        assert!(plan_sort(&ts(&[4, 3], &[0, -1], F32, P), 0, false, Some(&v), Some(&i)).is_ok());
        // dims/strides mismatch, negative dims, null pointers
        assert_eq!(
            invalid(plan_sort(&ts(&[4, 3], &[3], F32, P), 0, false, Some(&v), None)).1,
            "x"
        );
        assert_eq!(
            invalid(plan_sort(&ts(&[-4, 3], &[3, 1], F32, P), 0, false, None, None)).1,
            "x"
        );
        assert_eq!(invalid(plan_sort(&t(&[4, 3], F32, 0), 0, false, Some(&v), None)).1, "x");
        assert_eq!(
            invalid(plan_sort(&x, 0, false, None, Some(&t(&[4, 3], I64, 0)))).1,
            "indices_out"
        );
    }

    #[test]
    fn long_rows_are_merge_sorted() {
        // Short rows: no merge.
        let p = plan_sort(&t(&[2, 4096], F32, P), 1, false, Some(&t(&[2, 4096], F32, Q)), None)
            .unwrap()
            .unwrap();
        assert!(p.merge.is_none());
        for (len, chunks, passes, pairs) in [
            (4097, 2, 1, 1),
            (8192, 2, 1, 1),
            (8193, 3, 2, 2),
            (16384, 4, 2, 2),
            (16385, 5, 3, 2),
            (100_000, 25, 5, 2),
        ] {
            let x = t(&[3, len], F16, P);
            let p = plan_sort(&x, 1, true, Some(&t(&[3, len], F16, Q)), Some(&t(&[3, len], I64, R)))
                .unwrap()
                .unwrap();
            let m = p.merge.clone().expect("merge");
            assert_eq!(
                (m.chunks, m.passes, m.pairs, m.elements),
                (chunks, passes, pairs, 3 * len),
                "len {len}"
            );
            assert_eq!((m.chunk_entry, m.merge_entry), ("sort_chunks_f16", "merge_runs_b2"));
            // Merging `passes` times doubles the run width from 4096 to cover the row.
            assert!(MAX_SORT_LEN << m.passes >= len && MAX_SORT_LEN << (m.passes - 1) < len);
            // The chunk sort uses the full-chunk block.
            assert_eq!(
                (
                    p.rows.padded,
                    p.rows.threads,
                    p.rows.shared_bytes,
                    p.rows.rows,
                    p.rows.len
                ),
                (4096, 1024, 4096 * 12, 3, len)
            );
            assert_eq!(m.scratch_bytes(), pairs * 3 * len as usize * 12);
            // Scratch pairs: keys first (8-byte aligned), then the i32 indices.
            let n = 3 * len as u64;
            let raw = |k| {
                let (a, b) = m.pair(crate::types::DeviceAddress::of_allocation(0x1000), k);
                (a.get(), b.get())
            };
            assert_eq!(raw(0), (0x1000, 0x1000 + 8 * n * pairs as u64));
            if pairs == 2 {
                assert_eq!(raw(1), (0x1000 + 8 * n, 0x1000 + 8 * n * 2 + 4 * n));
            }
        }
        for (d, e) in [
            (F32, "merge_runs_b4"),
            (F64, "merge_runs_b8"),
            (I8, "merge_runs_b1"),
            (Bool, "merge_runs_b1"),
        ] {
            let p = plan_sort(&t(&[5000], d, P), 0, false, None, Some(&t(&[5000], I64, R)))
                .unwrap()
                .unwrap();
            assert_eq!(p.merge.expect("merge").merge_entry, e);
        }
        // The sorted axis only counts: long rows along axis 0.
        let p = plan_sort(&t(&[4097, 2], I32, P), 1, false, Some(&t(&[4097, 2], I32, Q)), None)
            .unwrap()
            .unwrap();
        assert!(p.merge.is_none());
        let p = plan_sort(&t(&[4097, 2], I32, P), 0, false, Some(&t(&[4097, 2], I32, Q)), None)
            .unwrap()
            .unwrap();
        assert_eq!(p.merge.map(|m| (m.chunks, m.chunk_entry)), Some((2, "sort_chunks_i32")));
        // Rows beyond i32 positions are rejected.
        let huge = 1i64 << 31;
        let (_, arg, why) = invalid(plan_sort(
            &ts(&[huge], &[0], F32, P),
            0,
            false,
            None,
            Some(&t(&[huge], I64, R)),
        ));
        assert_eq!(arg, "x");
        assert!(why.contains("longer than 2147483647"), "{why}");
    }

    #[test]
    fn empty_inputs_and_no_outputs_plan_nothing_but_still_validate() {
        let x = t(&[0, 3], F32, P);
        assert!(plan_sort(&x, 1, false, Some(&t(&[0, 3], F32, 0)), None)
            .unwrap()
            .is_none());
        assert!(
            plan_sort(&t(&[4, 0], F32, P), 1, false, Some(&t(&[4, 0], F32, Q)), None)
                .unwrap()
                .is_none()
        );
        assert!(plan_sort(&t(&[4, 3], F32, P), 1, false, None, None).unwrap().is_none());
        invalid(plan_sort(&x, 1, false, Some(&t(&[0, 3], F16, Q)), None));
        invalid(plan_sort(&x, 2, false, None, None));
    }

    #[test]
    fn too_many_dims_is_an_error() {
        let dims = [2i64; 10];
        let strides: Vec<i64> = (0..10).map(|i| 1i64 << (2 * (9 - i))).collect();
        let x = ts(&dims, &strides, F32, P);
        let (_, _, why) = invalid(plan_sort(&x, 0, false, None, Some(&t(&dims, I64, R))));
        assert!(why.contains("at most 8"), "{why}");
    }
}
