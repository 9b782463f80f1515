//! Typed launches of the pooling kernels (`kernels/pool.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::pool` have validated dtypes, shapes (rank 4, output dims consistent with the
//! window) and the layouts beforehand, so every element a kernel touches lies inside the
//! views the caller was handed (max-pool indices outside the input plane are skipped by
//! the backward kernel itself).

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Window geometry, height then width. Matches `struct PoolWin` in `kernels/pool.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolWindow {
    pub kh: i64,
    pub kw: i64,
    pub sh: i64,
    pub sw: i64,
    pub ph: i64,
    pub pw: i64,
    pub dh: i64,
    pub dw: i64,
}

// SAFETY: `PoolWindow` is plain old data with a `#[repr(C)]` layout identical to the CUDA
// `struct PoolWin` (eight i64, no padding), valid for any bits.
unsafe impl cudarc::driver::DeviceRepr for PoolWindow {}

/// Launches `maxpool2d_fwd_<dt>(const T* x, T* out, i64* idx, Layout lx, Layout lo,
/// Layout li, PoolWin p, i64 n)` over the `n` output elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn max_forward(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    out: DeviceAddress,
    indices: DeviceAddress,
    layouts: &[KernelLayout; 3],
    window: PoolWindow,
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&out)
        .arg(&indices)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&window)
        .arg(&n);
    // SAFETY: the arguments match `maxpool2d_fwd_<dt>(const T*, T*, long long*, Layout,
    // Layout, Layout, PoolWin, long long)`; out and indices are rank-4 views in bounds for
    // every item < n, and x is read only at coordinates inside its own [N, C, H, W] view
    // (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `maxpool2d_bwd_<dt>(const i64* idx, const T* dy, T* dx, Layout li, Layout ldy,
/// Layout ldx, i64 n)` over the `n` elements of dy.
pub(crate) fn max_backward(
    stream: &CudaStream,
    f: &CudaFunction,
    indices: DeviceAddress,
    dy: DeviceAddress,
    dx: DeviceAddress,
    layouts: &[KernelLayout; 3],
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&indices)
        .arg(&dy)
        .arg(&dx)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&n);
    // SAFETY: the arguments match `maxpool2d_bwd_<dt>(const long long*, const T*, T*,
    // Layout, Layout, Layout, long long)`; indices and dy are rank-4 views in bounds for
    // every item < n, and dx is updated (atomically) only at plane positions `k` with
    // `0 <= k < H * W`, inside its view (validated by the caller; others are skipped).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `maxpool2d_bwd_gather_<dt>(const i64* idx, const T* dy, T* dx, Layout li,
/// Layout ldy, Layout ldx, PoolWin p, i64 n)` over the `n` elements of dx.
#[allow(clippy::too_many_arguments)]
pub(crate) fn max_backward_gather(
    stream: &CudaStream,
    f: &CudaFunction,
    indices: DeviceAddress,
    dy: DeviceAddress,
    dx: DeviceAddress,
    layouts: &[KernelLayout; 3],
    window: &PoolWindow,
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&indices)
        .arg(&dy)
        .arg(&dx)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(window)
        .arg(&n);
    // SAFETY: the arguments match `maxpool2d_bwd_gather_<dt>(const long long*, const T*, T*,
    // Layout, Layout, Layout, PoolWin, long long)`; dx is a rank-4 view written once per item
    // < n, and indices / dy are read only at window coordinates inside their rank-4 dims
    // (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `avgpool2d_{fwd,bwd}_<dt>(const T* src, T* dst, Layout lsrc, Layout ldst,
/// PoolWin p, int count_include_pad, i64 n)` over the `n` elements of dst.
#[allow(clippy::too_many_arguments)]
pub(crate) fn avg(
    stream: &CudaStream,
    f: &CudaFunction,
    src: DeviceAddress,
    dst: DeviceAddress,
    layouts: &[KernelLayout; 2],
    window: PoolWindow,
    count_include_pad: bool,
    n: i64,
) -> Result<()> {
    let cip = count_include_pad as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&src)
        .arg(&dst)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&window)
        .arg(&cip)
        .arg(&n);
    // SAFETY: the arguments match `avgpool2d_{fwd,bwd}_<dt>(const T*, T*, Layout, Layout,
    // PoolWin, int, long long)`; dst is a rank-4 view in bounds for every item < n, and src
    // is read only at coordinates inside its own rank-4 view (the window ranges are clipped
    // to its dims; the dims agree with the window, validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `adaptive_avgpool2d_{fwd,bwd}_<dt>(const T* src, T* dst, Layout lsrc,
/// Layout ldst, i64 n)` over the `n` elements of dst.
pub(crate) fn adaptive(
    stream: &CudaStream,
    f: &CudaFunction,
    src: DeviceAddress,
    dst: DeviceAddress,
    layouts: &[KernelLayout; 2],
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&src).arg(&dst).arg(&layouts[0]).arg(&layouts[1]).arg(&n);
    // SAFETY: the arguments match `adaptive_avgpool2d_{fwd,bwd}_<dt>(const T*, T*, Layout,
    // Layout, long long)`; dst is a rank-4 view in bounds for every item < n, and src is
    // read only at coordinates inside its own rank-4 view (both views have positive H and
    // W and equal N and C, validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}
