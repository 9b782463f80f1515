//! Typed launches of the reduction and scan kernels (`kernels/reduce.cu`).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{CountedLaunch, KernelLayout};

/// Threads per block of every `kernels/reduce.cu` kernel (`RED_THREADS` there).
pub(crate) const REDUCE_THREADS: u32 = 256;

/// Arguments shared by `reduce_*`, `argreduce_*` and `scan_*`:
/// `(const T* x, Layout xl, void*/i64*/T* out, Layout ol, i64 n_out, i64 len, int op, int group)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowArgs {
    /// Device address of the input's element (0, ..., 0).
    pub x: u64,
    /// The input view with the axis moved last (row `o`, element `k` = index `o * len + k`).
    pub x_layout: KernelLayout,
    /// Device address of the output's element (0, ..., 0).
    pub out: u64,
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

/// Launches one `reduce_*`, `argreduce_*` or `scan_*` kernel with `a.blocks` blocks of
/// [`REDUCE_THREADS`] threads.
pub(crate) fn launch_rows(stream: &CudaStream, f: &CudaFunction, a: &RowArgs) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: (a.blocks.max(1), 1, 1),
        block_dim: (REDUCE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
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
