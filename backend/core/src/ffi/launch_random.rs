//! Typed launches of the random kernels (`kernels/random.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::random` have validated dtypes, parameters and the output layout beforehand,
//! so every element a kernel writes lies inside the view the caller was handed. Every
//! kernel runs one thread per Philox block of four outputs, so the grid covers
//! `ceil(n / 4)` items.

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// The output view and generator position shared by every random kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RandomTarget<'a> {
    /// Device address of the output view.
    pub out: DeviceAddress,
    /// Its (coalesced) layout.
    pub layout: &'a KernelLayout,
    /// Number of outputs.
    pub n: i64,
    /// Philox counter offset (in blocks).
    pub offset: u64,
    /// Philox key.
    pub seed: u64,
}

fn blocks(n: i64) -> u64 {
    (n as u64).div_ceil(4)
}

/// Launches `uniform_<dt>(T* out, Layout lo, i64 n, u64 offset, u64 seed, double low,
/// double range, double lo_c, double hi_c)`.
pub(crate) fn uniform(stream: &CudaStream, f: &CudaFunction, t: &RandomTarget<'_>, params: [f64; 4]) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&t.out)
        .arg(t.layout)
        .arg(&t.n)
        .arg(&t.offset)
        .arg(&t.seed)
        .arg(&params[0])
        .arg(&params[1])
        .arg(&params[2])
        .arg(&params[3]);
    // SAFETY: the arguments match `uniform_<dt>(T*, Layout, long long, unsigned long long,
    // unsigned long long, double, double, double, double)`; `out` addresses a view whose
    // every offset under the layout for indices < n is in bounds and of the kernel's
    // element type (validated by the caller), and the kernel only writes there.
    unsafe { b.launch_counted(grid_for(blocks(t.n))) }?;
    Ok(())
}

/// Launches `normal_<dt>(T* out, Layout lo, i64 n, u64 offset, u64 seed, double mean,
/// double std)`.
pub(crate) fn normal(stream: &CudaStream, f: &CudaFunction, t: &RandomTarget<'_>, mean: f64, std: f64) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&t.out)
        .arg(t.layout)
        .arg(&t.n)
        .arg(&t.offset)
        .arg(&t.seed)
        .arg(&mean)
        .arg(&std);
    // SAFETY: the arguments match `normal_<dt>(T*, Layout, long long, unsigned long long,
    // unsigned long long, double, double)`; the output view is in bounds for every index
    // < n and of the kernel's element type (validated by the caller).
    unsafe { b.launch_counted(grid_for(blocks(t.n))) }?;
    Ok(())
}

/// Launches `bernoulli_b{1,2,4,8}(T* out, Layout lo, i64 n, u64 offset, u64 seed,
/// u64 thr, u64 one)`.
pub(crate) fn bernoulli(stream: &CudaStream, f: &CudaFunction, t: &RandomTarget<'_>, thr: u64, one: u64) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&t.out)
        .arg(t.layout)
        .arg(&t.n)
        .arg(&t.offset)
        .arg(&t.seed)
        .arg(&thr)
        .arg(&one);
    // SAFETY: the arguments match `bernoulli_bN(T*, Layout, long long, unsigned long long,
    // unsigned long long, unsigned long long, unsigned long long)`; the output view is in
    // bounds for every index < n and has the element size the kernel was chosen for.
    unsafe { b.launch_counted(grid_for(blocks(t.n))) }?;
    Ok(())
}

/// Launches `uniform_int_b{1,4,8}(T* out, Layout lo, i64 n, u64 offset, u64 seed,
/// i64 low, u64 range, int wide)`.
pub(crate) fn uniform_int(
    stream: &CudaStream,
    f: &CudaFunction,
    t: &RandomTarget<'_>,
    low: i64,
    range: u64,
    wide: bool,
) -> Result<()> {
    let wide = wide as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&t.out)
        .arg(t.layout)
        .arg(&t.n)
        .arg(&t.offset)
        .arg(&t.seed)
        .arg(&low)
        .arg(&range)
        .arg(&wide);
    // SAFETY: the arguments match `uniform_int_bN(T*, Layout, long long, unsigned long
    // long, unsigned long long, long long, unsigned long long, int)`; the output view is
    // in bounds for every index < n and has the element size the kernel was chosen for.
    unsafe { b.launch_counted(grid_for(blocks(t.n))) }?;
    Ok(())
}
