//! Typed launches of the resize kernels (`kernels/resize.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::resize` have validated dtypes, shapes (rank 4, matching N and C, positive
//! source H and W whenever anything is read from the source) and the layouts beforehand,
//! so every element a kernel touches lies inside the views the caller was handed (source
//! coordinates are clamped into the input, or skipped when outside it for grid sampling).

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Launches `interp_<mode>_{fwd,bwd}_<dt>(const T* src, T* dst, Layout ls, Layout ld,
/// int align, i64 n)` over `n` elements (the destination's for the forwards and the
/// nearest backward, dy's for the scattering backwards).
#[allow(clippy::too_many_arguments)]
pub(crate) fn interp(
    stream: &CudaStream,
    f: &CudaFunction,
    src: DeviceAddress,
    dst: DeviceAddress,
    layouts: &[KernelLayout; 2],
    align_corners: bool,
    n: i64,
) -> Result<()> {
    let align = align_corners as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&src)
        .arg(&dst)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&align)
        .arg(&n);
    // SAFETY: the arguments match `interp_<mode>_{fwd,bwd}_<dt>(const T*, T*, Layout,
    // Layout, int, long long)`; the iterated view (dst for the gathers, src = dy for the
    // scatters) is rank 4 and in bounds for every item < n, and the other view is accessed
    // only at coordinates clamped into its own [N, C, H, W] dims (H, W > 0, equal N and C,
    // validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `grid_sample_<dt>(const T* x, const T* grid, T* out, Layout lx, Layout lg,
/// Layout lo, int align, i64 n)` over the `n` output elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn grid_sample(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    grid: DeviceAddress,
    out: DeviceAddress,
    layouts: &[KernelLayout; 3],
    align_corners: bool,
    n: i64,
) -> Result<()> {
    let align = align_corners as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&grid)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&align)
        .arg(&n);
    // SAFETY: the arguments match `grid_sample_<dt>(const T*, const T*, T*, Layout, Layout,
    // Layout, int, long long)`; out is a rank-4 view in bounds for every item < n, grid is
    // read at (b, oh, ow, 0..2) inside its [N, OH, OW, 2] view, and x only at coordinates
    // inside its own [N, C, H, W] view (taps outside are skipped; dims validated by the
    // caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}
