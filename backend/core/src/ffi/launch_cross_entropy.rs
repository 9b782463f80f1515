//! Typed launches of the cross-entropy kernels (`kernels/cross_entropy.cu`).
//!
//! The caller (`ops::cross_entropy`) has checked that the logits (and their gradient) are
//! packed `[rows, k]` rows of the entry point's dtype, the targets `rows` i64 elements at
//! `t_stride` apart, the per-row outputs and statistics `rows` packed f32, and the scalars
//! one element of their dtype code.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::CountedLaunch;
use crate::types::DeviceAddress;

/// Most target values one call ignores (`XENT_MAX_IGNORE`).
pub(crate) const MAX_IGNORE: usize = 8;

/// Threads of the one-block reductions (`XENT_REDUCE_THREADS`).
const REDUCE_THREADS: u32 = 512;

/// Largest grid of the row kernels (they loop over the remaining rows).
const MAX_GRID: u64 = 65_535 * 8;

/// The ignored target values. Matches `struct XentIgnore` in `kernels/cross_entropy.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct XentIgnore {
    /// How many of `values` are used (at most [`MAX_IGNORE`]).
    pub n: i64,
    pub values: [i64; MAX_IGNORE],
}

// SAFETY: `XentIgnore` is plain old data (nine i64, `#[repr(C)]`, no padding) laid out as the
// CUDA `struct XentIgnore` (one long long and a long long[8]), valid for any bits.
unsafe impl cudarc::driver::DeviceRepr for XentIgnore {}

/// How a row kernel covers the rows: `lanes` threads per row, `rows_per_block` rows per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowGrid {
    pub lanes: u32,
    pub rows_per_block: u32,
}

impl RowGrid {
    fn config(&self, rows: i64) -> LaunchConfig {
        let blocks = (rows.max(1) as u64).div_ceil(self.rows_per_block as u64).min(MAX_GRID);
        LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (self.lanes, self.rows_per_block, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// The problem every kernel of the family reads: targets, sizes and ignored values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct XentProblem {
    pub targets: DeviceAddress,
    pub t_stride: i64,
    pub rows: i64,
    pub k: i64,
    pub ignore: XentIgnore,
    /// 1: the mean divides by the rows not ignored; 0: by every row.
    pub counted: i32,
}

/// Launches `xent_fwd[_warp]_<dt>(x, targets, t_stride, rows, k, ignore, loss, lse)`.
pub(crate) fn forward(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: RowGrid,
    p: &XentProblem,
    x: DeviceAddress,
    [loss, lse]: [DeviceAddress; 2],
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&p.targets)
        .arg(&p.t_stride)
        .arg(&p.rows)
        .arg(&p.k)
        .arg(&p.ignore)
        .arg(&loss)
        .arg(&lse);
    // SAFETY: the arguments match `xent_fwd[_warp]_<dt>(const T*, const i64*, long long x3,
    // XentIgnore, float* x2)`; x holds rows * k packed elements of the entry's dtype, the
    // targets rows i64 at t_stride apart, loss and lse rows floats each (checked by the
    // caller); `grid` is the entry's (lanes, rows per block), which its block merge assumes.
    unsafe { b.launch_counted(grid.config(p.rows)) }?;
    Ok(())
}

/// Launches `xent_bwd[_warp]_<dt>(x, targets, t_stride, lse, scale, rows, k, ignore, vec, dx)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: RowGrid,
    p: &XentProblem,
    x: DeviceAddress,
    [lse, scale]: [DeviceAddress; 2],
    vec: bool,
    dx: DeviceAddress,
) -> Result<()> {
    let vec = i32::from(vec);
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&p.targets)
        .arg(&p.t_stride)
        .arg(&lse)
        .arg(&scale)
        .arg(&p.rows)
        .arg(&p.k)
        .arg(&p.ignore)
        .arg(&vec)
        .arg(&dx);
    // SAFETY: the arguments match `xent_bwd[_warp]_<dt>(const T*, const i64*, long long,
    // const float* x2, long long x2, XentIgnore, int, T*)`; x and dx hold rows * k packed
    // elements (dx is x itself or overlaps nothing read), the targets rows i64 at t_stride
    // apart, lse rows floats, scale one float; `vec` is set only when x and dx have the
    // same offset within 16 bytes (checked by the caller).
    unsafe { b.launch_counted(grid.config(p.rows)) }?;
    Ok(())
}

fn one_block() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (REDUCE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `xent_mean(loss, targets, t_stride, rows, k, ignore, counted, out, odt)`.
pub(crate) fn mean(
    stream: &CudaStream,
    f: &CudaFunction,
    p: &XentProblem,
    loss: DeviceAddress,
    out: DeviceAddress,
    odt: i32,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&loss)
        .arg(&p.targets)
        .arg(&p.t_stride)
        .arg(&p.rows)
        .arg(&p.k)
        .arg(&p.ignore)
        .arg(&p.counted)
        .arg(&out)
        .arg(&odt);
    // SAFETY: the arguments match `xent_mean(const float*, const i64*, long long x3,
    // XentIgnore, int, void*, int)`; loss holds rows floats, the targets rows i64 at t_stride
    // apart, out one element of dtype code odt (0 f32, 1 f16, 2 bf16).
    unsafe { b.launch_counted(one_block()) }?;
    Ok(())
}

/// Launches `xent_scale(g, gdt, targets, t_stride, rows, k, ignore, counted, scale)`.
pub(crate) fn scale(
    stream: &CudaStream,
    f: &CudaFunction,
    p: &XentProblem,
    g: DeviceAddress,
    gdt: i32,
    out: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&g)
        .arg(&gdt)
        .arg(&p.targets)
        .arg(&p.t_stride)
        .arg(&p.rows)
        .arg(&p.k)
        .arg(&p.ignore)
        .arg(&p.counted)
        .arg(&out);
    // SAFETY: the arguments match `xent_scale(const void*, int, const i64*, long long x3,
    // XentIgnore, int, float*)`; g holds one element of dtype code gdt (0 f32, 1 f16,
    // 2 bf16), the targets rows i64 at t_stride apart, out one float.
    unsafe { b.launch_counted(one_block()) }?;
    Ok(())
}
