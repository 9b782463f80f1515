//! Typed launches of the training layer/RMS norm kernels (`kernels/norm.cu`).
//!
//! The caller (`ops::norm_train`) has checked that the data are packed `[rows, n]` rows of
//! the entry point's dtype, the parameters `n` elements of dtype `pdt`, the statistics
//! `rows` f32 and the partials buffer `2 * chunks * n` f32.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{warp_per_row, CountedLaunch};
use crate::types::DeviceAddress;

/// Rows per block (`NORM_ROWS`; one warp per row).
const ROWS: u32 = 8;
/// Lanes per row (`NORM_LANES`).
const LANES: u32 = 32;

fn row_grid(rows: i64) -> LaunchConfig {
    warp_per_row(rows, ROWS)
}

/// Addresses of one norm pass (0 = absent) and its sizes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NormArgs {
    pub x: DeviceAddress,
    pub y_or_dy: DeviceAddress,
    pub dx: DeviceAddress,
    pub rows: i64,
    pub n: i64,
    pub gamma: DeviceAddress,
    pub beta: DeviceAddress,
    pub pdt: i32,
    pub eps: f32,
    pub rms: i32,
    pub mean: DeviceAddress,
    pub invstd: DeviceAddress,
}

/// Launches `norm_fwd_<dt>(x, y, rows, n, gamma, beta, pdt, eps, rms, mean, invstd)`.
pub(crate) fn forward(stream: &CudaStream, f: &CudaFunction, a: &NormArgs) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a.x)
        .arg(&a.y_or_dy)
        .arg(&a.rows)
        .arg(&a.n)
        .arg(&a.gamma)
        .arg(&a.beta)
        .arg(&a.pdt)
        .arg(&a.eps)
        .arg(&a.rms)
        .arg(&a.mean)
        .arg(&a.invstd);
    // SAFETY: the arguments match `norm_fwd_<dt>(const T*, T*, long long x2, const void* x2,
    // int, float, int, float* x2)`; x and y hold rows * n packed elements, every non-null
    // parameter n and every non-null statistic rows (checked by the caller).
    unsafe { b.launch_counted(row_grid(a.rows)) }?;
    Ok(())
}

/// Launches `norm_bwd_dx_<dt>(x, dy, dx, rows, n, gamma, pdt, mean, invstd, rms)`.
pub(crate) fn backward_dx(stream: &CudaStream, f: &CudaFunction, a: &NormArgs) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a.x)
        .arg(&a.y_or_dy)
        .arg(&a.dx)
        .arg(&a.rows)
        .arg(&a.n)
        .arg(&a.gamma)
        .arg(&a.pdt)
        .arg(&a.mean)
        .arg(&a.invstd)
        .arg(&a.rms);
    // SAFETY: the arguments match `norm_bwd_dx_<dt>(const T* x2, T*, long long x2, const
    // void*, int, const float* x2, int)`; x, dy and dx hold rows * n packed elements, dx
    // overlaps neither input, the statistics hold rows floats (mean may be null for RMS).
    unsafe { b.launch_counted(row_grid(a.rows)) }?;
    Ok(())
}

/// Launches `norm_bwd_params_<dt>(x, dy, rows, n, mean, invstd, rms, chunk, part)` over
/// `chunks` chunks of `chunk` rows.
pub(crate) fn backward_params(
    stream: &CudaStream,
    f: &CudaFunction,
    a: &NormArgs,
    chunk: i64,
    chunks: u32,
    part: DeviceAddress,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: ((a.n as u64).div_ceil(LANES as u64) as u32, chunks, 1),
        block_dim: (LANES, ROWS, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&a.x)
        .arg(&a.y_or_dy)
        .arg(&a.rows)
        .arg(&a.n)
        .arg(&a.mean)
        .arg(&a.invstd)
        .arg(&a.rms)
        .arg(&chunk)
        .arg(&part);
    // SAFETY: the arguments match `norm_bwd_params_<dt>(const T* x2, long long x2, const
    // float* x2, int, long long, float*)`; x and dy hold rows * n packed elements, the
    // statistics rows floats, `part` 2 * chunks * n floats, chunks * chunk >= rows.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Launches `norm_bwd_params_finalize(part, chunks, n, dgamma, dbeta, pdt)`.
pub(crate) fn params_finalize(
    stream: &CudaStream,
    f: &CudaFunction,
    part: DeviceAddress,
    chunks: i32,
    n: i64,
    [dgamma, dbeta]: [DeviceAddress; 2],
    pdt: i32,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: ((n as u64).div_ceil(128) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&part).arg(&chunks).arg(&n).arg(&dgamma).arg(&dbeta).arg(&pdt);
    // SAFETY: the arguments match `norm_bwd_params_finalize(const float*, int, long long,
    // void* x2, int)`; `part` holds the 2 * chunks * n partials, the non-null outputs n
    // elements of dtype `pdt`.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}
