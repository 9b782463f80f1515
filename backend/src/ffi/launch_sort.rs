//! Typed launches of the sort kernels (`kernels/sort.cu`).
//!
//! The function's argument list mirrors the kernels' C signature; the caller in
//! `kernels::sort` has validated dtypes, shapes and the layouts beforehand, so every
//! element a kernel touches lies inside the views the caller was handed.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::KernelLayout;

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
    x: u64,
    values: u64,
    indices: u64,
    layouts: &[KernelLayout; 3],
    axis_strides: &[i64; 3],
    rows: &SortRows,
) -> Result<()> {
    let write_values = (values != 0) as i32;
    let write_indices = (indices != 0) as i32;
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
    unsafe { b.launch(cfg) }?;
    Ok(())
}
