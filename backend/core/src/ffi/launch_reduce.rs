//! Typed launches of the reduction and scan kernels (`kernels/reduce.cu`).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Threads per block of every `kernels/reduce.cu` kernel (`RED_THREADS` there).
pub(crate) const REDUCE_THREADS: u32 = 256;

/// Arguments shared by `reduce_*`, `argreduce_*` and `scan_*`:
/// `(const T* x, Layout xl, void*/i64*/T* out, Layout ol, i64 n_out, i64 len, int op, int group)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowArgs {
    /// Device address of the input's element (0, ..., 0).
    pub x: DeviceAddress,
    /// The input view with the axis moved last (row `o`, element `k` = index `o * len + k`).
    pub x_layout: KernelLayout,
    /// Device address of the output's element (0, ..., 0).
    pub out: DeviceAddress,
    /// The output view (`n_out` elements for reductions, `n_out * len` for scans).
    pub out_layout: KernelLayout,
    /// Number of rows.
    pub n_out: i64,
    /// Row length (the axis).
    pub len: i64,
    /// Op code understood by the kernel.
    pub op: i32,
    /// Threads per row: 1, 32 or [`REDUCE_THREADS`].
    pub group: i32,
    /// Blocks to launch.
    pub blocks: u32,
}

/// A `(x, y)` grid (each at least 1) of [`REDUCE_THREADS`]-thread blocks.
fn grid(x: u32, y: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x.max(1), y.max(1), 1),
        block_dim: (REDUCE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches one `reduce_*`, `argreduce_*` or `scan_*` kernel with `a.blocks` blocks of
/// [`REDUCE_THREADS`] threads.
pub(crate) fn launch_rows(stream: &CudaStream, f: &CudaFunction, a: &RowArgs) -> Result<()> {
    let cfg = grid(a.blocks, 1);
    let mut b = stream.launch_builder(f);
    b.arg(&a.x)
        .arg(&a.x_layout)
        .arg(&a.out)
        .arg(&a.out_layout)
        .arg(&a.n_out)
        .arg(&a.len)
        .arg(&a.op)
        .arg(&a.group);
    // SAFETY: the argument list matches the kernels' C signature (pointer, Layout by value,
    // pointer, Layout by value, long long, long long, int, int; `KernelLayout` is
    // `#[repr(C)]`-identical to `struct Layout`). The caller (kernels::reduce) validated
    // both views with `TensorRef::check` and built the layouts from their dims/strides, so
    // every offset the kernel computes (`offset_of` over `n_out * len` input indices and
    // the output indices) lies inside the caller's allocations, the element types match
    // the entry point's dtype, and the output does not overlap itself.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Arguments of `reduce_split_*` (pass 1 of a split-row reduction):
/// `(const T* x, Layout xl, A* partial, i64 n_out, i64 len, i64 chunk, i64 parts, int op)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitArgs {
    /// Device address of the input's element (0, ..., 0).
    pub x: DeviceAddress,
    /// The input view with the axis moved last (as in [`RowArgs::x_layout`]).
    pub x_layout: KernelLayout,
    /// Scratch for `n_out * parts` accumulators (chunk `c` of row `o` at `c * n_out + o`).
    pub partial: DeviceAddress,
    /// Number of rows.
    pub n_out: i64,
    /// Row length.
    pub len: i64,
    /// Elements per chunk (the last chunk may be shorter).
    pub chunk: i64,
    /// Chunks per row.
    pub parts: i64,
    /// Op code understood by the kernel.
    pub op: i32,
    /// Blocks to launch (grid-stride over `n_out * parts` chunks).
    pub blocks: u32,
}

/// Launches one `reduce_split_*` kernel with `a.blocks` blocks of [`REDUCE_THREADS`] threads.
pub(crate) fn launch_split(stream: &CudaStream, f: &CudaFunction, a: &SplitArgs) -> Result<()> {
    let cfg = grid(a.blocks, 1);
    let mut b = stream.launch_builder(f);
    b.arg(&a.x)
        .arg(&a.x_layout)
        .arg(&a.partial)
        .arg(&a.n_out)
        .arg(&a.len)
        .arg(&a.chunk)
        .arg(&a.parts)
        .arg(&a.op);
    // SAFETY: the argument list matches the kernels' C signature (pointer, Layout by value,
    // pointer, four long long, int). The caller (kernels::reduce) validated `x` with
    // `TensorRef::check` and built its layout from its dims/strides, so every input offset
    // lies inside the caller's allocation; `partial` is a scratch buffer of at least
    // `n_out * parts` accumulators of the entry point's accumulator type, alive (freed
    // stream-ordered) until the kernel has run.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Arguments of `reduce_cols_*` and `reduce_finish_*`: `(const T*/A* x, i64 outer, i64 len,
/// i64 inner, i64 so, i64 sl, void* out, Layout ol, A* partial, i64 chunk, i64 mean_len,
/// int op, int tx)`. The input is `(outer, len, inner)` with element strides
/// `(outer_stride, len_stride, 1)`; output `o = i * inner + j` reduces over the middle dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColArgs {
    /// Device address of the input's element (0, 0, 0) (the scratch partials for a finish).
    pub x: DeviceAddress,
    /// Outer extent.
    pub outer: i64,
    /// Reduced extent.
    pub len: i64,
    /// Inner (contiguous) extent.
    pub inner: i64,
    /// Element stride of the outer dim.
    pub outer_stride: i64,
    /// Element stride of the reduced dim.
    pub len_stride: i64,
    /// Device address of the output's element (0, ..., 0) (unused when `partial` is set).
    pub out: DeviceAddress,
    /// The output view, enumerating the `outer * inner` outputs.
    pub out_layout: KernelLayout,
    /// 0: store finished results to `out`; else scratch for `parts * outer * inner`
    /// accumulators (chunk `c` of output `o` at `c * outer * inner + o`).
    pub partial: DeviceAddress,
    /// Reduced-dim elements per chunk (`blockIdx.y` picks the chunk).
    pub chunk: i64,
    /// Divisor of [`crate::kernels::reduce::ReduceOp::Mean`] (the full reduced length).
    pub mean_len: i64,
    /// Op code understood by the kernel.
    pub op: i32,
    /// Threads per tile along `inner` (a power of two up to 32).
    pub tx: i32,
    /// Blocks along x (grid-stride over the `outer * ceil(inner / tx)` tiles).
    pub blocks: u32,
    /// Blocks along y: the number of chunks (1 when `partial` is 0).
    pub parts: u32,
}

/// Launches one `reduce_cols_*` or `reduce_finish_*` kernel on a `(a.blocks, a.parts)` grid
/// of [`REDUCE_THREADS`]-thread blocks.
pub(crate) fn launch_cols(stream: &CudaStream, f: &CudaFunction, a: &ColArgs) -> Result<()> {
    let cfg = grid(a.blocks, a.parts);
    let mut b = stream.launch_builder(f);
    b.arg(&a.x)
        .arg(&a.outer)
        .arg(&a.len)
        .arg(&a.inner)
        .arg(&a.outer_stride)
        .arg(&a.len_stride)
        .arg(&a.out)
        .arg(&a.out_layout)
        .arg(&a.partial)
        .arg(&a.chunk)
        .arg(&a.mean_len)
        .arg(&a.op)
        .arg(&a.tx);
    // SAFETY: the argument list matches the kernels' C signature (pointer, five long long,
    // pointer, Layout by value, pointer, two long long, two int). The caller
    // (kernels::reduce) derived (outer, len, inner) and the strides from a validated input
    // view (or, for a finish, from the scratch it allocated with `parts * outer * inner`
    // accumulators), so every input offset `i * outer_stride + k * len_stride + j` lies
    // inside that allocation; the output layout was built from the validated, non-overlapping
    // output view; `partial`, when set, holds `parts * outer * inner` accumulators and is
    // freed stream-ordered after the kernel; `tx` divides [`REDUCE_THREADS`].
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}
