//! Typed launches of the elementwise kernels (`kernels/elementwise.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::elementwise` have validated dtypes, shapes and the layouts beforehand, so
//! every element a kernel touches lies inside the views the caller was handed.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch, KernelLayout};
use crate::types::DeviceAddress;

/// Launches `fill_b{1,2,4,8}(T* out, Layout lo, i64 n, u64 bits)`.
pub(crate) fn fill(
    stream: &CudaStream,
    f: &CudaFunction,
    out: DeviceAddress,
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
    src: DeviceAddress,
    dst: DeviceAddress,
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
    src: DeviceAddress,
    src_code: i32,
    dst: DeviceAddress,
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
    x: DeviceAddress,
    y: DeviceAddress,
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
    a: DeviceAddress,
    b_ptr: DeviceAddress,
    out: DeviceAddress,
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
    cond: DeviceAddress,
    a: DeviceAddress,
    b_ptr: DeviceAddress,
    out: DeviceAddress,
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
    a: DeviceAddress,
    out: DeviceAddress,
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

// ---------------------------------------------------------------------------------------
// Vector kernels (`unary_vec_<dt>`, `binary_vec_<dt>`, `binary_scalar_vec_<dt>`)

/// Most blocks of a vector-kernel launch (about 16 per SM of a 132-SM H100, like the fused
/// kernels' `MAX_BLOCKS`); larger tensors take more grid-stride steps per thread.
pub(crate) const VEC_MAX_BLOCKS: u64 = 2048;

/// Threads per block of a vector-kernel launch.
const VEC_THREADS: u32 = 256;

/// Grid for a grid-stride loop over `groups` thread steps, at most [`VEC_MAX_BLOCKS`] blocks.
pub(crate) fn vec_grid(groups: u64) -> LaunchConfig {
    let blocks = groups.div_ceil(u64::from(VEC_THREADS)).clamp(1, VEC_MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (VEC_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What every vector launch shares: the group layouts (innermost dim divided by `vec`,
/// innermost stride multiplied by it), the group count and the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VecStep {
    /// Thread steps: the elements divided by `vec`.
    pub groups: i64,
    /// Elements per thread step (2, 4 or 8, at most 16 bytes).
    pub vec: i32,
    /// The kernel's op code.
    pub op: i32,
}

/// Launches `unary_vec_<dt>(const T* x, T* y, Layout lx, Layout ly, i64 groups, int op,
/// double p0, double p1, int vec)`.
pub(crate) fn unary_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    y: DeviceAddress,
    layouts: &[KernelLayout; 2],
    step: VecStep,
    params: (f64, f64),
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&y)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&step.groups)
        .arg(&step.op)
        .arg(&params.0)
        .arg(&params.1)
        .arg(&step.vec);
    // SAFETY: the arguments match `unary_vec_<dt>(const T*, T*, Layout, Layout, long long,
    // int, double, double, int)`; both views, walked as `groups` groups of `vec` elements
    // under their group layouts, are in bounds, and every vector-accessed operand's address
    // and outer strides are multiples of `vec` elements (validated by the caller's plan).
    unsafe { b.launch_counted(vec_grid(step.groups as u64)) }?;
    Ok(())
}

/// Launches `binary_vec_<dt>(const T* a, const T* b, T* out, Layout la, Layout lb,
/// Layout lo, i64 groups, int op, int vec)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn binary_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    a: DeviceAddress,
    b_ptr: DeviceAddress,
    out: DeviceAddress,
    layouts: &[KernelLayout; 3],
    step: VecStep,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a)
        .arg(&b_ptr)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&layouts[2])
        .arg(&step.groups)
        .arg(&step.op)
        .arg(&step.vec);
    // SAFETY: the arguments match `binary_vec_<dt>(const T*, const T*, T*, Layout, Layout,
    // Layout, long long, int, int)`; the three views, walked as `groups` groups of `vec`
    // elements under their group layouts, are in bounds, and every vector-accessed operand's
    // address and outer strides are multiples of `vec` elements (validated by the caller's
    // plan).
    unsafe { b.launch_counted(vec_grid(step.groups as u64)) }?;
    Ok(())
}

/// Launches `binary_scalar_vec_<dt>(const T* a, T* out, Layout la, Layout lo, i64 groups,
/// int op, double s, int vec)`.
pub(crate) fn with_scalar_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    a: DeviceAddress,
    out: DeviceAddress,
    layouts: &[KernelLayout; 2],
    step: VecStep,
    scalar: f64,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a)
        .arg(&out)
        .arg(&layouts[0])
        .arg(&layouts[1])
        .arg(&step.groups)
        .arg(&step.op)
        .arg(&scalar)
        .arg(&step.vec);
    // SAFETY: the arguments match `binary_scalar_vec_<dt>(const T*, T*, Layout, Layout,
    // long long, int, double, int)`; both views, walked as `groups` groups of `vec` elements
    // under their group layouts, are in bounds, and every vector-accessed operand's address
    // and outer strides are multiples of `vec` elements (validated by the caller's plan).
    unsafe { b.launch_counted(vec_grid(step.groups as u64)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_grids_are_capped() {
        assert_eq!(vec_grid(0).grid_dim.0, 1);
        assert_eq!(vec_grid(256).grid_dim.0, 1);
        assert_eq!(vec_grid(257).grid_dim.0, 2);
        assert_eq!(vec_grid(8192 * 512 / 8).grid_dim.0, 2048);
        assert_eq!(vec_grid(1 << 40).grid_dim.0, VEC_MAX_BLOCKS as u32);
        assert_eq!(vec_grid(1).block_dim.0, 256);
    }
}
