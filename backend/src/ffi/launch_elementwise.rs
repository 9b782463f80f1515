//! Typed launches of the elementwise kernels (`kernels/elementwise.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::elementwise` have validated dtypes, shapes and the layouts beforehand, so
//! every element a kernel touches lies inside the views the caller was handed.

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};

/// Launches `fill_b{1,2,4,8}(T* out, Layout lo, i64 n, u64 bits)`.
pub(crate) fn fill(
    stream: &CudaStream,
    f: &CudaFunction,
    out: u64,
    lo: &KernelLayout,
    n: i64,
    bits: u64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&out).arg(lo).arg(&n).arg(&bits);
    // SAFETY: the arguments match `fill_bN(T*, Layout, long long, unsigned long long)`;
    // `out` addresses a view whose every offset under `lo` for indices < n is in bounds
    // (validated by the caller), and the kernel only writes there.
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `copy_b{1,2,4,8}(const T* src, T* dst, Layout ls, Layout ld, i64 n)`.
pub(crate) fn copy(
    stream: &CudaStream,
    f: &CudaFunction,
    src: u64,
    dst: u64,
    layouts: &[KernelLayout; 2],
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&src).arg(&dst).arg(&layouts[0]).arg(&layouts[1]).arg(&n);
    // SAFETY: the arguments match `copy_bN(const T*, T*, Layout, Layout, long long)`;
    // both views are in bounds for every index < n under their layouts (validated by the
    // caller) and have the element size the kernel was chosen for.
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `cast(const void* src, int sdt, void* dst, int ddt, Layout ls, Layout ld, i64 n)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cast(
    stream: &CudaStream,
    f: &CudaFunction,
    src: u64,
    src_code: i32,
    dst: u64,
    dst_code: i32,
    layouts: &[KernelLayout; 2],
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&src)
        .arg(&src_code)
        .arg(&dst)
        .arg(&dst_code)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&n);
    // SAFETY: the arguments match `cast(const void*, int, void*, int, Layout, Layout,
    // long long)`; the dtype codes describe the element types of `src` and `dst`, whose
    // views are in bounds for every index < n (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Scalar parameters of a unary kernel: f64 for the float kernels, i64 for the int ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum UnaryParams {
    /// `double p0, double p1`.
    Float(f64, f64),
    /// `long long p0, long long p1`.
    Int(i64, i64),
}

/// Launches `unary_<dt>(const T* x, T* y, Layout lx, Layout ly, i64 n, int op, P p0, P p1)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unary(
    stream: &CudaStream,
    f: &CudaFunction,
    x: u64,
    y: u64,
    layouts: &[KernelLayout; 2],
    n: i64,
    op: i32,
    params: UnaryParams,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&y).arg(&layouts[0]).arg(&layouts[1]).arg(&n).arg(&op);
    let (fp, ip) = match params {
        UnaryParams::Float(p0, p1) => ([p0, p1], None),
        UnaryParams::Int(p0, p1) => ([0.0, 0.0], Some([p0, p1])),
    };
    match &ip {
        Some(ip) => b.arg(&ip[0]).arg(&ip[1]),
        None => b.arg(&fp[0]).arg(&fp[1]),
    };
    // SAFETY: the arguments match `unary_<dt>(const T*, T*, Layout, Layout, long long,
    // int, P, P)` with P = double for the float kernels and long long for the int kernels
    // (the caller picks `params` by the kernel's family); both views are in bounds for
    // every index < n (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `binary_<dt>` or `compare_<dt>`:
/// `(const T* a, const T* b, U* out, Layout la, Layout lb, Layout lo, i64 n, int op)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn binary(
    stream: &CudaStream,
    f: &CudaFunction,
    a: u64,
    b_ptr: u64,
    out: u64,
    layouts: &[KernelLayout; 3],
    n: i64,
    op: i32,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a)
        .arg(&b_ptr)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&n)
        .arg(&op);
    // SAFETY: the arguments match `binary_<dt>` / `compare_<dt>(const T*, const T*, U*,
    // Layout, Layout, Layout, long long, int)`; all three views are in bounds for every
    // index < n (validated by the caller) and have the kernel's element types.
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `where_b{1,2,4,8}(const u8* cond, const T* a, const T* b, T* out,
/// Layout lc, Layout la, Layout lb, Layout lo, i64 n)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn where_(
    stream: &CudaStream,
    f: &CudaFunction,
    cond: u64,
    a: u64,
    b_ptr: u64,
    out: u64,
    layouts: &[KernelLayout; 4],
    n: i64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&cond)
        .arg(&a)
        .arg(&b_ptr)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&layouts[3])
        .arg(&n);
    // SAFETY: the arguments match `where_bN(const u8*, const T*, const T*, T*, Layout,
    // Layout, Layout, Layout, long long)`; the four views are in bounds for every index
    // < n (validated by the caller); `cond` has one-byte elements.
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// The scalar operand of `binary_scalar_<dt>` / `compare_scalar_<dt>`: `double` for the
/// float kernels, `long long` for the integer ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ScalarParam {
    /// `double s`.
    Float(f64),
    /// `long long s`.
    Int(i64),
}

/// Launches `binary_scalar_<dt>` or `compare_scalar_<dt>`:
/// `(const T* a, U* out, Layout la, Layout lo, i64 n, int op, S s)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn with_scalar(
    stream: &CudaStream,
    f: &CudaFunction,
    a: u64,
    out: u64,
    layouts: &[KernelLayout; 2],
    n: i64,
    op: i32,
    scalar: ScalarParam,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a).arg(&out).arg(&layouts[0]).arg(&layouts[1]).arg(&n).arg(&op);
    let (fs, is) = match scalar {
        ScalarParam::Float(v) => (v, 0i64),
        ScalarParam::Int(v) => (0.0, v),
    };
    match scalar {
        ScalarParam::Float(_) => b.arg(&fs),
        ScalarParam::Int(_) => b.arg(&is),
    };
    // SAFETY: the arguments match `binary_scalar_<dt>` / `compare_scalar_<dt>(const T*, U*,
    // Layout, Layout, long long, int, S)` with S = double for the float kernels and long
    // long for the integer ones (the plan picks the variant by the entry's dtype); both
    // views are in bounds for every index < n (validated by the caller).
    unsafe { b.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}
