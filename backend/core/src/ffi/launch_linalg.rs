//! Typed launches of the linear-algebra and quantization kernels (`kernels/linalg.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::linalg` have validated dtypes, shapes, layouts and packing beforehand, so
//! every element a kernel touches lies inside the views the caller was handed.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Side of the square output tile (and thread block) of `int_matmul_*` and `matmul_*`.
pub(crate) const MM_TILE: u32 = 16;

/// Threads per block of `quant_scales_*` (`QS_THREADS` in the kernel).
const QS_THREADS: u32 = 256;

/// Largest grid extent used along any axis (the kernels loop over the rest).
const MAX_GRID: u64 = 65_535;

/// Sizes and element strides of one `[M, K] · [K, N] -> [M, N]` problem of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MatmulShape {
    pub batches: i64,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// `[a_m, a_k, b_k, b_n, c_m, c_n]`.
    pub strides: [i64; 6],
}

/// Launches `int_matmul_<dt>` or `matmul_<dt>` (one signature: `(const T* a, const T* b,
/// T* c, Layout la, Layout lb, Layout lc, i64 batches, i64 M, i64 N, i64 K, i64 sam,
/// i64 sak, i64 sbk, i64 sbn, i64 scm, i64 scn)`) with 16x16 blocks.
pub(crate) fn batched_matmul(
    stream: &CudaStream,
    f: &CudaFunction,
    ptrs: [DeviceAddress; 3],
    batch_layouts: &[KernelLayout; 3],
    s: &MatmulShape,
) -> Result<()> {
    let tiles = |d: i64| (d as u64).div_ceil(MM_TILE as u64).clamp(1, MAX_GRID) as u32;
    let cfg = LaunchConfig {
        grid_dim: (tiles(s.n), tiles(s.m), (s.batches as u64).clamp(1, MAX_GRID) as u32),
        block_dim: (MM_TILE, MM_TILE, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&ptrs[0])
        .arg(&ptrs[1])
        .arg(&ptrs[2])
        .arg(&batch_layouts[0])
        .arg(&batch_layouts[1])
        .arg(&batch_layouts[2])
        .arg(&s.batches)
        .arg(&s.m)
        .arg(&s.n)
        .arg(&s.k);
    for st in &s.strides {
        b.arg(st);
    }
    // SAFETY: the arguments match `int_matmul_<dt>` / `matmul_<dt>(const T*, const T*, T*,
    // Layout, Layout, Layout, long long x 10)` (T the dtype of all three operands, checked
    // by the caller's plan); the batch layouts give each operand's base offset for every
    // batch index < batches, and from there a is read at m*sam + k*sak (m < M, k < K),
    // b at k*sbk + n*sbn and c written at m*scm + n*scn, all inside the views validated by
    // the caller; the kernel's 16x16 shared tiles match the 16x16 block.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Launches `cross3_<dt>(const T* a, const T* b, T* out, Layout la, Layout lb, Layout lo,
/// i64 sa, i64 sb, i64 so, i64 n)`.
pub(crate) fn cross3(
    stream: &CudaStream,
    f: &CudaFunction,
    ptrs: [DeviceAddress; 3],
    layouts: &[KernelLayout; 3],
    axis_strides: [i64; 3],
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&ptrs[0])
        .arg(&ptrs[1])
        .arg(&ptrs[2])
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&axis_strides[0])
        .arg(&axis_strides[1])
        .arg(&axis_strides[2])
        .arg(&n);
    // SAFETY: the arguments match `cross3_<dt>(const T*, const T*, T*, Layout, Layout,
    // Layout, long long, long long, long long, long long)`; for every item < n each layout
    // gives the operand's offset of component 0, and components 1 and 2 lie one and two
    // axis strides further, inside the views (the axis has size 3 in all three operands,
    // validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `quant_scales_<dt>(const T* x, float* scales, i64 block, i64 nblocks)`, one
/// block of 256 threads per scale (grid-stride beyond 65 535 scales).
pub(crate) fn quant_scales(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    scales: DeviceAddress,
    block: i64,
    nblocks: i64,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: ((nblocks as u64).clamp(1, MAX_GRID) as u32, 1, 1),
        block_dim: (QS_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&scales).arg(&block).arg(&nblocks);
    // SAFETY: the arguments match `quant_scales_<dt>(const T*, float*, long long, long
    // long)`; x holds nblocks * block packed elements and scales nblocks packed f32
    // (validated by the caller); the block size equals the kernel's `QS_THREADS`.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}

/// Launches `quantize_<dt>(const T* x, const float* scales, i8* out, i64 block, i64 n)`.
pub(crate) fn quantize(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    scales: DeviceAddress,
    out: DeviceAddress,
    block: i64,
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&scales).arg(&out).arg(&block).arg(&n);
    // SAFETY: the arguments match `quantize_<dt>(const T*, const float*, signed char*,
    // long long, long long)`; x and out hold n packed elements and scales n / block packed
    // f32 (block > 0 divides n; validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `dequantize_<dt>(const i8* q, const float* scales, T* out, i64 block, i64 n)`.
pub(crate) fn dequantize(
    stream: &CudaStream,
    f: &CudaFunction,
    q: DeviceAddress,
    scales: DeviceAddress,
    out: DeviceAddress,
    block: i64,
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&q).arg(&scales).arg(&out).arg(&block).arg(&n);
    // SAFETY: the arguments match `dequantize_<dt>(const signed char*, const float*, T*,
    // long long, long long)`; q and out hold n packed elements and scales n / block packed
    // f32 (block > 0 divides n; validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}
