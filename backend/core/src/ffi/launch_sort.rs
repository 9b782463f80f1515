//! Typed launches of the sort kernels (`kernels/sort.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the caller in
//! `kernels::sort` has validated dtypes, shapes and the layouts beforehand, so every
//! element a kernel touches lies inside the views the caller was handed.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Most blocks a sort launch uses (each loops over rows `blockIdx.x + k * gridDim.x`).
const MAX_BLOCKS: i64 = 65_535 * 8;

/// The rows of a sort launch: `rows` rows of `len` elements, sorted in shared memory as
/// `padded` (a power of two >= `len`) key/index pairs by blocks of `threads` threads with
/// `shared_bytes` of dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SortRows {
    pub len: i64,
    pub padded: i64,
    pub rows: i64,
    pub descending: bool,
    pub threads: u32,
    pub shared_bytes: u32,
}

/// Launches `sort_rows_<dt>(const T* x, T* values, i64* indices, int write_values,
/// int write_indices, Layout lx, Layout lv, Layout li, i64 sx, i64 sv, i64 si, i64 len,
/// i64 padded, int descending, i64 rows)`. `values` / `indices` are 0 when not written
/// (their layouts are then unused).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sort_rows(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    values: DeviceAddress,
    indices: DeviceAddress,
    layouts: &[KernelLayout; 3],
    axis_strides: &[i64; 3],
    rows: &SortRows,
) -> Result<()> {
    let write_values = (values != DeviceAddress::NULL) as i32;
    let write_indices = (indices != DeviceAddress::NULL) as i32;
    let descending = rows.descending as i32;
    let cfg = LaunchConfig {
        grid_dim: (rows.rows.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (rows.threads, 1, 1),
        shared_mem_bytes: rows.shared_bytes,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&values)
        .arg(&indices)
        .arg(&write_values)
        .arg(&write_indices)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&axis_strides[0])
        .arg(&axis_strides[1])
        .arg(&axis_strides[2])
        .arg(&rows.len)
        .arg(&rows.padded)
        .arg(&descending)
        .arg(&rows.rows);
    // SAFETY: the arguments match `sort_rows_<dt>(const T*, T*, long long*, int, int,
    // Layout, Layout, Layout, long long, long long, long long, long long, long long, int,
    // long long)`; every row r < rows of each operand starts at `offset_of(layout, r)` and
    // holds `len` elements `axis_stride` apart inside its view (validated by the caller),
    // an output is touched only when its pointer is non-zero, and the dynamic shared
    // memory holds `padded` u64 keys plus `padded` i32 indices.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Launches `sort_chunks_<dt>(const T* x, u64* keys, i32* idx, Layout lx, i64 sx, i64 len,
/// int descending, i64 rows)` over `rows.rows * chunks` blocks (grid-stride), with
/// `rows.shared_bytes` of dynamic shared memory for one chunk. `keys` and `idx` are
/// scratch arrays of `rows.rows * rows.len` elements each.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sort_chunks(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    keys: DeviceAddress,
    idx: DeviceAddress,
    lx: &KernelLayout,
    sx: i64,
    chunks: i64,
    rows: &SortRows,
) -> Result<()> {
    let descending = rows.descending as i32;
    let blocks = rows.rows.saturating_mul(chunks);
    let cfg = LaunchConfig {
        grid_dim: (blocks.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (rows.threads, 1, 1),
        shared_mem_bytes: rows.shared_bytes,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&keys)
        .arg(&idx)
        .arg(lx)
        .arg(&sx)
        .arg(&rows.len)
        .arg(&descending)
        .arg(&rows.rows);
    // SAFETY: the arguments match `sort_chunks_<dt>(const T*, unsigned long long*, int*,
    // Layout, long long, long long, int, long long)`; every row r < rows of x starts at
    // `offset_of(lx, r)` and holds `len` elements `sx` apart inside its view (validated by
    // the caller), the scratch arrays hold `rows * len` keys and indices (allocated by the
    // caller for this launch), and the dynamic shared memory holds one chunk's u64 keys
    // plus i32 indices.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// One merge pass of a long-row sort: runs of `width` elements merged pairwise in every
/// one of `rows` rows of `len` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MergePass {
    pub len: i64,
    pub width: i64,
    pub rows: i64,
    /// Items per thread of the kernel (`MERGE_ITEMS` in `kernels/sort.cu`).
    pub items: i64,
}

/// Launches `merge_runs_b{1,2,4,8}(const T* x, const u64* skeys, const i32* sidx,
/// u64* dkeys, i32* didx, T* values, i64* indices, int final_pass, int write_values,
/// int write_indices, Layout lx, Layout lv, Layout li, i64 sx, i64 sv, i64 si, i64 len,
/// i64 width, i64 rows)`. `src` / `dst` are (keys, indices) scratch arrays of
/// `rows * len` elements; `dst` is `None` on the final pass, which writes `values` /
/// `indices` instead (each 0 when not written; their layouts are then unused).
#[allow(clippy::too_many_arguments)]
pub(crate) fn merge_runs(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    src: (DeviceAddress, DeviceAddress),
    dst: Option<(DeviceAddress, DeviceAddress)>,
    values: DeviceAddress,
    indices: DeviceAddress,
    layouts: &[KernelLayout; 3],
    axis_strides: &[i64; 3],
    pass: &MergePass,
) -> Result<()> {
    let final_pass = dst.is_none() as i32;
    let (dkeys, didx) = dst.unwrap_or((DeviceAddress::NULL, DeviceAddress::NULL));
    let write_values = (values != DeviceAddress::NULL) as i32;
    let write_indices = (indices != DeviceAddress::NULL) as i32;
    let tiles = pass.rows.saturating_mul((pass.len + pass.items - 1) / pass.items);
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&src.0)
        .arg(&src.1)
        .arg(&dkeys)
        .arg(&didx)
        .arg(&values)
        .arg(&indices)
        .arg(&final_pass)
        .arg(&write_values)
        .arg(&write_indices)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&axis_strides[0])
        .arg(&axis_strides[1])
        .arg(&axis_strides[2])
        .arg(&pass.len)
        .arg(&pass.width)
        .arg(&pass.rows);
    // SAFETY: the arguments match `merge_runs_bN(const T*, const unsigned long long*,
    // const int*, unsigned long long*, int*, T*, long long*, int, int, int, Layout, Layout,
    // Layout, long long, long long, long long, long long, long long, long long)`; the
    // scratch arrays hold `rows * len` elements (the destination is written only when
    // `dst` is given), the indices read from the source are row positions `< len`
    // (written by `sort_chunks` and earlier passes), and on the final pass every row r of
    // x and of each written output starts at `offset_of(layout, r)` and holds `len`
    // elements `axis_stride` apart inside its view (validated by the caller).
    unsafe { b.launch_counted(grid_for(tiles as u64)) }?;
    Ok(())
}
