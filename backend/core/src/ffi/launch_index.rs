//! Typed launches of the index kernels (`kernels/index.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::index` have validated dtypes, shapes and the layouts beforehand, so every
//! element a kernel touches lies inside the views the caller was handed (indices outside
//! the indexed axis are skipped by the kernels themselves).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// The indexed axis of an index kernel: indices must lie in `0..len`; one step along it
/// is `stride` elements of the indexed operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexAxis {
    pub stride: i64,
    pub len: i64,
}

/// Launches `gather_b{1,2,4,8}(const T* x, const void* idx, int idx64, T* out, Layout lx,
/// Layout li, Layout lo, i64 axis_stride, i64 axis_len, i64 n)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    idx: DeviceAddress,
    idx64: bool,
    out: DeviceAddress,
    layouts: &[KernelLayout; 3],
    axis: IndexAxis,
    n: i64,
) -> Result<()> {
    let idx64 = idx64 as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&idx)
        .arg(&idx64)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&axis.stride)
        .arg(&axis.len)
        .arg(&n);
    // SAFETY: the arguments match `gather_bN(const T*, const void*, int, T*, Layout,
    // Layout, Layout, long long, long long, long long)`; the indices and output views are
    // in bounds for every item < n, `idx64` names the indices' element type, and x is read
    // only at `offset + k * axis_stride` with `0 <= k < axis_len`, inside its view
    // (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `scatter_add_seq_<dt>(T*, const void*, int, const T*, Layout, Layout, Layout,
/// i64 axis_stride, i64 axis_len, i64 lines, i64 len)`: one thread per line of `len` steps.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_add_seq(
    stream: &CudaStream,
    f: &CudaFunction,
    target: DeviceAddress,
    idx: DeviceAddress,
    idx64: bool,
    values: DeviceAddress,
    layouts: &[KernelLayout; 3],
    axis: IndexAxis,
    lines: i64,
    len: i64,
) -> Result<()> {
    let idx64 = idx64 as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&target)
        .arg(&idx)
        .arg(&idx64)
        .arg(&values)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&axis.stride)
        .arg(&axis.len)
        .arg(&lines)
        .arg(&len);
    // SAFETY: the arguments match `scatter_add_seq_<dt>(T*, const void*, int, const T*,
    // Layout, Layout, Layout, long long, long long, long long, long long)`; the layouts cover
    // `lines * len` items (the caller's iteration shape with the axis last), the indices and
    // values views are in bounds for each, and the target is updated only at
    // `offset + k * axis_stride` with `0 <= k < axis_len`, inside its view; distinct lines
    // never reach the same target element (validated by the caller: no overlap).
    unsafe { b.launch_counted(grid_for(lines as u64)) }?;
    Ok(())
}

/// Launches `scatter_add_<dt>(T* target, const void* idx, int idx64, const T* values,
/// Layout lt, Layout li, Layout lv, i64 axis_stride, i64 axis_len, i64 n)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_add(
    stream: &CudaStream,
    f: &CudaFunction,
    target: DeviceAddress,
    idx: DeviceAddress,
    idx64: bool,
    values: DeviceAddress,
    layouts: &[KernelLayout; 3],
    axis: IndexAxis,
    n: i64,
) -> Result<()> {
    let idx64 = idx64 as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&target)
        .arg(&idx)
        .arg(&idx64)
        .arg(&values)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&axis.stride)
        .arg(&axis.len)
        .arg(&n);
    // SAFETY: the arguments match `scatter_add_<dt>(T*, const void*, int, const T*,
    // Layout, Layout, Layout, long long, long long, long long)`; the indices and values
    // views are in bounds for every item < n, `idx64` names the indices' element type, and
    // the target is updated (atomically) only at `offset + k * axis_stride` with
    // `0 <= k < axis_len`, inside its view (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Sorted positions one block of `index_add_rows_<dt>` sums (`IAR_CHUNK` in
/// `kernels/index.cu`).
pub(crate) const ROWS_CHUNK: i64 = 32;

/// The rows of an `index_add_rows_<dt>` launch: `m` sorted indices into a target of
/// `axis_len` rows; each row is `d` contiguous elements, target rows `target_stride`
/// elements apart and values rows `values_stride` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowsAdd {
    pub m: i64,
    pub d: i64,
    pub axis_len: i64,
    pub target_stride: i64,
    pub values_stride: i64,
}

/// Launches `index_add_rows_<dt>(T* target, const void* sorted, int idx64, const i64* perm,
/// const T* values, i64 ts, i64 vs, i64 d, i64 axis_len, i64 m)`: a block per
/// [`ROWS_CHUNK`] sorted positions and tile of up to 256 columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn index_add_rows(
    stream: &CudaStream,
    f: &CudaFunction,
    target: DeviceAddress,
    sorted: DeviceAddress,
    idx64: bool,
    perm: DeviceAddress,
    values: DeviceAddress,
    rows: &RowsAdd,
) -> Result<()> {
    let idx64 = idx64 as i32;
    // At least one warp: the first ROWS_CHUNK threads stage the chunk's keys.
    let threads = ((rows.d + 31) / 32 * 32).clamp(32, 256);
    let cfg = LaunchConfig {
        grid_dim: (
            ((rows.m + ROWS_CHUNK - 1) / ROWS_CHUNK) as u32,
            ((rows.d + threads - 1) / threads) as u32,
            1,
        ),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&target)
        .arg(&sorted)
        .arg(&idx64)
        .arg(&perm)
        .arg(&values)
        .arg(&rows.target_stride)
        .arg(&rows.values_stride)
        .arg(&rows.d)
        .arg(&rows.axis_len)
        .arg(&rows.m);
    // SAFETY: the arguments match `index_add_rows_<dt>(T*, const void*, int, const i64*,
    // const T*, long long x5)`; `sorted` (of the type `idx64` names) and `perm` hold `m`
    // elements, every `perm` value is a row of `values` (a permutation of 0..m, written by
    // the sort), every row of values and target is `d` contiguous elements at its stride
    // inside its view, and the target is updated (atomically) only at rows `0 <= k <
    // axis_len` (validated by the caller).
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Launches `gather_nd_b{1,2,4,8}(const T* x, const void* idx, int idx64, T* out, Layout lx,
/// Layout li, Layout lo, Layout lk, i64 kstride, i64 n)` (`layouts` = `[lx, li, lo]`,
/// `indexed` = `lk`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_nd(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    idx: DeviceAddress,
    idx64: bool,
    out: DeviceAddress,
    layouts: &[KernelLayout; 3],
    indexed: &KernelLayout,
    coord_stride: i64,
    n: i64,
) -> Result<()> {
    let idx64 = idx64 as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&idx)
        .arg(&idx64)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(indexed)
        .arg(&coord_stride)
        .arg(&n);
    // SAFETY: the arguments match `gather_nd_bN(const T*, const void*, int, T*, Layout,
    // Layout, Layout, Layout, long long, long long)`; the output view and the first
    // coordinate of every index tuple are in bounds for every item < n, the other
    // `indexed.rank - 1` coordinates lie `coord_stride` apart inside the indices' view,
    // `idx64` names the indices' element type, and x is read only at coordinates the
    // kernel checked against `indexed.shape`, inside its view (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `scatter_nd_<dt>(T* target, const void* idx, int idx64, const T* values,
/// Layout lt, Layout li, Layout lv, Layout lk, i64 kstride, int op, i64 n)`
/// (`layouts` = `[lt, li, lv]`, `indexed` = `lk`, `op` the kernel's update-op code).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_nd(
    stream: &CudaStream,
    f: &CudaFunction,
    target: DeviceAddress,
    idx: DeviceAddress,
    idx64: bool,
    values: DeviceAddress,
    layouts: &[KernelLayout; 3],
    indexed: &KernelLayout,
    coord_stride: i64,
    op: i32,
    n: i64,
) -> Result<()> {
    let idx64 = idx64 as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&target)
        .arg(&idx)
        .arg(&idx64)
        .arg(&values)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(indexed)
        .arg(&coord_stride)
        .arg(&op)
        .arg(&n);
    // SAFETY: the arguments match `scatter_nd_<dt>(T*, const void*, int, const T*, Layout,
    // Layout, Layout, Layout, long long, int, long long)`; the values view and the first
    // coordinate of every index tuple are in bounds for every item < n, the other
    // coordinates lie `coord_stride` apart inside the indices' view, `idx64` names the
    // indices' element type, and the target is updated only at coordinates the kernel
    // checked against `indexed.shape`, inside its view (validated by the caller). Sub-word
    // updates compare-and-swap the aligned 32-bit word holding the element, which lies in
    // the same (at least 256-byte aligned) allocation.
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `scatter_nd_keys(const void* idx, int idx64, i64* keys, Layout li, Layout lk,
/// i64 kstride, i64 slice, i64 m)`: the sort key of each of the `tuples` index tuples
/// (`index_layout` = `li` over the joint shape `tuples * slice`, `indexed` = `lk`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_nd_keys(
    stream: &CudaStream,
    f: &CudaFunction,
    idx: DeviceAddress,
    idx64: bool,
    keys: DeviceAddress,
    index_layout: &KernelLayout,
    indexed: &KernelLayout,
    coord_stride: i64,
    slice: i64,
    tuples: i64,
) -> Result<()> {
    let idx64 = idx64 as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&idx)
        .arg(&idx64)
        .arg(&keys)
        .arg(index_layout)
        .arg(indexed)
        .arg(&coord_stride)
        .arg(&slice)
        .arg(&tuples);
    // SAFETY: the arguments match `scatter_nd_keys(const void*, int, long long*, Layout,
    // Layout, long long, long long, long long)`; item `t * slice` of the index layout is
    // the first coordinate of tuple t < tuples, in bounds like the other `indexed.rank - 1`
    // coordinates `coord_stride` apart inside the indices' view, `idx64` names the indices'
    // element type, and `keys` holds `tuples` i64 of scratch written only here (validated
    // and allocated by the caller).
    unsafe { b.launch_counted(grid_for(tuples as u64)) }?;
    Ok(())
}

/// Launches `scatter_nd_ordered_<dt>(T* target, const i64* keys, const i64* perm,
/// const T* values, Layout lt, Layout lv, Layout lk, i64 slice, int op, i64 n)`
/// (`layouts` = `[lt, li, lv]` of the scatter_nd plan, `li` unused; `indexed` = `lk`;
/// `keys` sorted ascending and `perm` their original tuple positions, `n / slice` of each).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_nd_ordered(
    stream: &CudaStream,
    f: &CudaFunction,
    target: DeviceAddress,
    keys: DeviceAddress,
    perm: DeviceAddress,
    values: DeviceAddress,
    layouts: &[KernelLayout; 3],
    indexed: &KernelLayout,
    slice: i64,
    op: i32,
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&target)
        .arg(&keys)
        .arg(&perm)
        .arg(&values)
        .arg(&layouts[0])
        .arg(&layouts[2])
        .arg(indexed)
        .arg(&slice)
        .arg(&op)
        .arg(&n);
    // SAFETY: the arguments match `scatter_nd_ordered_<dt>(T*, const long long*, const
    // long long*, const T*, Layout, Layout, Layout, long long, int, long long)`; `keys` and
    // `perm` hold `n / slice` i64 each (the sorted keys and the stable sort's permutation of
    // `0..n / slice`), so every values item `perm[p] * slice + e` is below n and in bounds,
    // and the target is written only at `loff(lt, e)` plus the coordinates decoded from a key
    // below the product of `indexed.shape`, inside its view (validated by the caller). Each
    // target element is written by the one thread at the start of its run of equal keys.
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}
