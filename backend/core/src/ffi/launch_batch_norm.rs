//! Typed launches of the batch-norm kernels (`kernels/batch_norm.cu`).
//!
//! The caller (`ops::batch_norm`) has validated every view as an `[N, C, S]` view inside its
//! allocation, the dtypes against the entry points, and sized the f32 workspace (partials
//! and coefficients); each function mirrors one kernel's C signature.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch};
use crate::types::DeviceAddress;

/// Strides (elements) of the N, C and S axes; `struct BnView` in the kernel source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BnView {
    pub sn: i64,
    pub sc: i64,
    pub ss: i64,
}

// SAFETY: `BnView` is three i64 with `#[repr(C)]`, the layout of `struct BnView { i64 sn,
// sc, ss; }` in kernels/batch_norm.cu; any bit pattern is valid.
unsafe impl cudarc::driver::DeviceRepr for BnView {}

/// Shape and walk of one batch-norm pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BnShape {
    pub n: i64,
    pub c: i64,
    pub s: i64,
    /// 0: (n, c, s) with s innermost; 1: (n, s, c) with c innermost.
    pub order: i32,
    /// Elements (order 0) or rows (order 1) per reduction chunk.
    pub chunk_len: i64,
    /// Number of chunks (`ceil(n * s / chunk_len)`).
    pub chunks: i32,
}

/// Threads per block of the reductions (`BN_THREADS`), and their channels-last block shape
/// (`BN_LANES` x `BN_ROWS`).
const BN_THREADS: u32 = 256;
const BN_LANES: u32 = 32;
const BN_ROWS: u32 = 8;

fn reduction_grid(sh: &BnShape) -> LaunchConfig {
    let (grid_y, block) = if sh.order == 0 {
        (sh.c as u32, (BN_THREADS, 1, 1))
    } else {
        ((sh.c as u32).div_ceil(BN_LANES), (BN_LANES, BN_ROWS, 1))
    };
    LaunchConfig {
        grid_dim: (sh.chunks as u32, grid_y, 1),
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

/// The grid of the finalize kernels: `(BN_LANES, BN_ROWS)` blocks, each combining the chunks'
/// partials of `BN_LANES` channels (rows split the chunks).
fn chunk_combine_grid(c: i64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((c as u32).div_ceil(BN_LANES), 1, 1),
        block_dim: (BN_LANES, BN_ROWS, 1),
        shared_mem_bytes: 0,
    }
}

fn per_channel_grid(c: i64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((c as u32).div_ceil(128), 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `bn_stats_<dt>(x, vx, N, C, S, order, chunk_len, part)`.
pub(crate) fn stats(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    vx: &BnView,
    sh: &BnShape,
    part: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(vx)
        .arg(&sh.n)
        .arg(&sh.c)
        .arg(&sh.s)
        .arg(&sh.order)
        .arg(&sh.chunk_len)
        .arg(&part);
    // SAFETY: the arguments match `bn_stats_<dt>(const T*, BnView, long long x3, int,
    // long long, float*)`; `x` covers every (n, c, s) offset under `vx` (validated by the
    // caller) and `part` holds 3 * chunks * C floats; the grid is the one the kernel's walk
    // expects for `order` (chunks x channels or channel tiles).
    unsafe { b.launch_counted(reduction_grid(sh)) }?;
    Ok(())
}

/// Per-channel inputs and outputs of `bn_finalize` (0 = absent).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FinalizeArgs {
    pub part: DeviceAddress,
    pub chunks: i32,
    pub c: i64,
    pub eps: f32,
    pub momentum: f32,
    pub unbiased: i32,
    pub scale: DeviceAddress,
    pub bias: DeviceAddress,
    pub pdt: i32,
    pub rmean_in: DeviceAddress,
    pub rvar_in: DeviceAddress,
    pub rmean_out: DeviceAddress,
    pub rvar_out: DeviceAddress,
    pub save_mean: DeviceAddress,
    pub save_invstd: DeviceAddress,
    pub coef: DeviceAddress,
}

/// Launches `bn_finalize`.
pub(crate) fn finalize(stream: &CudaStream, f: &CudaFunction, a: &FinalizeArgs) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&a.part)
        .arg(&a.chunks)
        .arg(&a.c)
        .arg(&a.eps)
        .arg(&a.momentum)
        .arg(&a.unbiased)
        .arg(&a.scale)
        .arg(&a.bias)
        .arg(&a.pdt)
        .arg(&a.rmean_in)
        .arg(&a.rvar_in)
        .arg(&a.rmean_out)
        .arg(&a.rvar_out)
        .arg(&a.save_mean)
        .arg(&a.save_invstd)
        .arg(&a.coef);
    // SAFETY: the arguments match `bn_finalize(const float*, int, long long, float, float,
    // int, const void* x2, int, const void* x2, void* x2, float* x3)`; `part` holds the
    // 3 * chunks * C partials the stats kernel wrote, every non-null parameter pointer holds
    // C elements of dtype `pdt`, the saved statistics C floats and `coef` 2 * C floats.
    unsafe { b.launch_counted(chunk_combine_grid(a.c)) }?;
    Ok(())
}

/// Launches `bn_inference_coef(C, eps, scale, bias, pdt, rmean, rvar, coef)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn inference_coef(
    stream: &CudaStream,
    f: &CudaFunction,
    c: i64,
    eps: f32,
    scale: DeviceAddress,
    bias: DeviceAddress,
    pdt: i32,
    rmean: DeviceAddress,
    rvar: DeviceAddress,
    coef: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&c)
        .arg(&eps)
        .arg(&scale)
        .arg(&bias)
        .arg(&pdt)
        .arg(&rmean)
        .arg(&rvar)
        .arg(&coef);
    // SAFETY: the arguments match `bn_inference_coef(long long, float, const void* x2, int,
    // const void* x2, float*)`; the running statistics (and scale/bias when non-null) hold C
    // elements of dtype `pdt`, `coef` 2 * C floats.
    unsafe { b.launch_counted(per_channel_grid(c)) }?;
    Ok(())
}

/// A data operand of the apply kernels: address (0 = absent) and view.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BnOperand {
    pub ptr: DeviceAddress,
    pub view: BnView,
}

/// Launches `bn_apply_<dt>(x, vx, z, vz, y, vy, N, C, S, order, coef, relu)`.
pub(crate) fn apply(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, z, y]: [&BnOperand; 3],
    sh: &BnShape,
    coef: DeviceAddress,
    relu: bool,
) -> Result<()> {
    let relu = relu as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&x.ptr)
        .arg(&x.view)
        .arg(&z.ptr)
        .arg(&z.view)
        .arg(&y.ptr)
        .arg(&y.view)
        .arg(&sh.n)
        .arg(&sh.c)
        .arg(&sh.s)
        .arg(&sh.order)
        .arg(&coef)
        .arg(&relu);
    // SAFETY: the arguments match `bn_apply_<dt>(const T*, BnView, const T*, BnView, T*,
    // BnView, long long x3, int, const float*, int)`; x, z (when non-null) and y cover every
    // (n, c, s) offset under their views, y does not overlap itself (validated by the
    // caller), `coef` holds 2 * C floats written earlier on this stream.
    unsafe { b.launch_counted(grid_for((sh.n * sh.c * sh.s) as u64)) }?;
    Ok(())
}

/// Launches `bn_grad_stats_<dt>(x, vx, y, vy, dy, vdy, N, C, S, order, chunk_len, mean, part)`.
pub(crate) fn grad_stats(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, y, dy]: [&BnOperand; 3],
    sh: &BnShape,
    mean: DeviceAddress,
    part: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x.ptr)
        .arg(&x.view)
        .arg(&y.ptr)
        .arg(&y.view)
        .arg(&dy.ptr)
        .arg(&dy.view)
        .arg(&sh.n)
        .arg(&sh.c)
        .arg(&sh.s)
        .arg(&sh.order)
        .arg(&sh.chunk_len)
        .arg(&mean)
        .arg(&part);
    // SAFETY: the arguments match `bn_grad_stats_<dt>(const T*, BnView, const T*, BnView,
    // const T*, BnView, long long x3, int, long long, const float*, float*)`; x, y (when
    // non-null) and dy cover every (n, c, s) offset under their views, `mean` holds C floats
    // and `part` 2 * chunks * C floats; the grid matches `order`.
    unsafe { b.launch_counted(reduction_grid(sh)) }?;
    Ok(())
}

/// Launches `bn_grad_finalize(part, chunks, C, count, scale, pdt, mean, invstd, dscale,
/// dbias, coef)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn grad_finalize(
    stream: &CudaStream,
    f: &CudaFunction,
    sh: &BnShape,
    part: DeviceAddress,
    scale: DeviceAddress,
    pdt: i32,
    [mean, invstd]: [DeviceAddress; 2],
    [dscale, dbias]: [DeviceAddress; 2],
    coef: DeviceAddress,
) -> Result<()> {
    let count = (sh.n * sh.s) as f32;
    let mut b = stream.launch_builder(f);
    b.arg(&part)
        .arg(&sh.chunks)
        .arg(&sh.c)
        .arg(&count)
        .arg(&scale)
        .arg(&pdt)
        .arg(&mean)
        .arg(&invstd)
        .arg(&dscale)
        .arg(&dbias)
        .arg(&coef);
    // SAFETY: the arguments match `bn_grad_finalize(const float*, int, long long, float,
    // const void*, int, const float* x2, void* x2, float*)`; `part` holds the 2 * chunks * C
    // partials, mean/invstd C floats, scale/dscale/dbias (when non-null) C elements of dtype
    // `pdt`, `coef` 3 * C floats.
    unsafe { b.launch_counted(chunk_combine_grid(sh.c)) }?;
    Ok(())
}

/// Launches `bn_grad_apply_<dt>(x, vx, y, vy, dy, vdy, dx, vdx, dz, vdz, N, C, S, order, coef)`.
pub(crate) fn grad_apply(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, y, dy, dx, dz]: [&BnOperand; 5],
    sh: &BnShape,
    coef: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    for o in [x, y, dy, dx, dz] {
        b.arg(&o.ptr).arg(&o.view);
    }
    b.arg(&sh.n).arg(&sh.c).arg(&sh.s).arg(&sh.order).arg(&coef);
    // SAFETY: the arguments match `bn_grad_apply_<dt>(const T*, BnView, const T*, BnView,
    // const T*, BnView, T*, BnView, T*, BnView, long long x3, int, const float*)`; every
    // non-null operand covers all (n, c, s) offsets under its view, the written ones (dx, dz)
    // do not overlap themselves or the inputs, `coef` holds 3 * C floats.
    unsafe { b.launch_counted(grid_for((sh.n * sh.c * sh.s) as u64)) }?;
    Ok(())
}

/// Shape of a packed channels-last pass (the `*_vec_*` kernels): `rows` = N * S rows of `c`
/// channels, reduction chunks of `chunk_len` rows, blocks of `lanes` vectors by
/// `BN_THREADS / lanes` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BnVecShape {
    pub rows: i64,
    pub c: i64,
    /// Elements per 16-byte vector (4 for f32, 8 for f16/bf16); divides `c`.
    pub vec: i64,
    pub chunk_len: i64,
    pub chunks: i32,
    /// Vectors of a row per block (1 to 32).
    pub lanes: u32,
}

impl BnVecShape {
    /// The same pass as a [`BnShape`] for the per-channel kernels (`bn_grad_finalize` reads
    /// the chunk count, channels and element count).
    pub(crate) fn as_shape(&self) -> BnShape {
        BnShape {
            n: self.rows,
            c: self.c,
            s: 1,
            order: 1,
            chunk_len: self.chunk_len,
            chunks: self.chunks,
        }
    }

    fn reduction_grid(&self) -> LaunchConfig {
        let vectors = (self.c / self.vec) as u32;
        LaunchConfig {
            grid_dim: (self.chunks as u32, vectors.div_ceil(self.lanes), 1),
            block_dim: (self.lanes, BN_THREADS / self.lanes, 1),
            shared_mem_bytes: 0,
        }
    }

    fn vectors(&self) -> i64 {
        self.rows * (self.c / self.vec)
    }
}

/// Launches `bn_stats_vec_<dt>(x, rows, C, chunk_len, part)`.
pub(crate) fn stats_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    sh: &BnVecShape,
    part: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&sh.rows).arg(&sh.c).arg(&sh.chunk_len).arg(&part);
    // SAFETY: the arguments match `bn_stats_vec_<dt>(const T*, long long x3, float*)`; `x`
    // is 16-byte aligned and holds rows * C packed elements with C a multiple of the vector
    // width (validated by the caller), `part` holds 3 * chunks * C floats; the grid covers
    // the chunks and the row's vectors in lanes, as the kernel's walk expects.
    unsafe { b.launch_counted(sh.reduction_grid()) }?;
    Ok(())
}

/// Launches `bn_apply_vec_<dt>(x, z, y, vecs, C, coef, relu)`.
pub(crate) fn apply_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, z, y]: [DeviceAddress; 3],
    sh: &BnVecShape,
    coef: DeviceAddress,
    relu: bool,
) -> Result<()> {
    let (relu, vecs) = (relu as i32, sh.vectors());
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&z).arg(&y).arg(&vecs).arg(&sh.c).arg(&coef).arg(&relu);
    // SAFETY: the arguments match `bn_apply_vec_<dt>(const T* x2, T*, long long x2, const
    // float*, int)`; x, z (when non-null) and y are 16-byte aligned and hold rows * C packed
    // elements, y overlaps neither, `coef` is 16-byte aligned and holds 2 * C floats written
    // earlier on this stream.
    unsafe { b.launch_counted(grid_for(vecs as u64)) }?;
    Ok(())
}

/// Launches `bn_grad_stats_vec_<dt>(x, y, dy, rows, C, chunk_len, mean, part)`.
pub(crate) fn grad_stats_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, y, dy]: [DeviceAddress; 3],
    sh: &BnVecShape,
    mean: DeviceAddress,
    part: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&y)
        .arg(&dy)
        .arg(&sh.rows)
        .arg(&sh.c)
        .arg(&sh.chunk_len)
        .arg(&mean)
        .arg(&part);
    // SAFETY: the arguments match `bn_grad_stats_vec_<dt>(const T* x3, long long x3, const
    // float*, float*)`; x, y (when non-null) and dy are 16-byte aligned and hold rows * C
    // packed elements, `mean` is 16-byte aligned with C floats, `part` holds 2 * chunks * C
    // floats; the grid is the reductions' grid.
    unsafe { b.launch_counted(sh.reduction_grid()) }?;
    Ok(())
}

/// Launches `bn_grad_apply_vec_<dt>(x, y, dy, dx, dz, vecs, C, coef)`.
pub(crate) fn grad_apply_vec(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, y, dy, dx, dz]: [DeviceAddress; 5],
    sh: &BnVecShape,
    coef: DeviceAddress,
) -> Result<()> {
    let vecs = sh.vectors();
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&y)
        .arg(&dy)
        .arg(&dx)
        .arg(&dz)
        .arg(&vecs)
        .arg(&sh.c)
        .arg(&coef);
    // SAFETY: the arguments match `bn_grad_apply_vec_<dt>(const T* x3, T* x2, long long x2,
    // const float*)`; every non-null operand is 16-byte aligned and holds rows * C packed
    // elements, dx and dz overlap no other operand, `coef` is 16-byte aligned with 3 * C
    // floats.
    unsafe { b.launch_counted(grid_for(vecs as u64)) }?;
    Ok(())
}

/// Shape of a packed planes pass (the `*_planes_*` kernels): `n` x `c` planes of `s`
/// elements, S innermost (packed NCHW), moved in 16-byte vectors of `vec` elements (`vec`
/// divides `s`); reduction chunks of `chunk_len` vectors of one channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BnPlanesShape {
    pub n: i64,
    pub c: i64,
    pub s: i64,
    /// Elements per 16-byte vector (4 for f32, 8 for f16/bf16).
    pub vec: i64,
    pub chunk_len: i64,
    pub chunks: i32,
}

impl BnPlanesShape {
    /// The strided pass's shape over the same elements (what the finalize steps read).
    pub(crate) fn as_shape(&self) -> BnShape {
        BnShape {
            n: self.n,
            c: self.c,
            s: self.s,
            order: 0,
            chunk_len: self.chunk_len * self.vec,
            chunks: self.chunks,
        }
    }

    fn plane_vecs(&self) -> i64 {
        self.s / self.vec
    }

    fn vectors(&self) -> i64 {
        self.n * self.c * self.plane_vecs()
    }
}

/// Launches `bn_stats_planes_<dt>(x, N, C, plane_vecs, chunk_len, part)`.
pub(crate) fn stats_planes(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    sh: &BnPlanesShape,
    part: DeviceAddress,
) -> Result<()> {
    let pv = sh.plane_vecs();
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&sh.n).arg(&sh.c).arg(&pv).arg(&sh.chunk_len).arg(&part);
    // SAFETY: the arguments match `bn_stats_planes_<dt>(const T*, long long x4, float*)`; `x`
    // is 16-byte aligned and holds N * C * S packed elements with S a multiple of the vector
    // (checked by the caller), `part` holds 3 * chunks * C floats; the grid is chunks x C.
    unsafe { b.launch_counted(reduction_grid(&sh.as_shape())) }?;
    Ok(())
}

/// Launches `bn_apply_planes_<dt>(x, z, y, vecs, plane_vecs, C, coef, relu)`.
pub(crate) fn apply_planes(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, z, y]: [DeviceAddress; 3],
    sh: &BnPlanesShape,
    coef: DeviceAddress,
    relu: bool,
) -> Result<()> {
    let (relu, vecs, pv) = (relu as i32, sh.vectors(), sh.plane_vecs());
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&z)
        .arg(&y)
        .arg(&vecs)
        .arg(&pv)
        .arg(&sh.c)
        .arg(&coef)
        .arg(&relu);
    // SAFETY: the arguments match `bn_apply_planes_<dt>(const T* x2, T*, long long x3, const
    // float*, int)`; x, z (when non-null) and y are 16-byte aligned and packed [N, C, S] with
    // S a multiple of the vector, y does not overlap x or z (checked by the caller), `coef`
    // holds 2 * C floats written earlier on this stream.
    unsafe { b.launch_counted(grid_for(vecs as u64)) }?;
    Ok(())
}

/// Launches `bn_grad_stats_planes_<dt>(x, y, dy, N, C, plane_vecs, chunk_len, mean, part)`.
pub(crate) fn grad_stats_planes(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, y, dy]: [DeviceAddress; 3],
    sh: &BnPlanesShape,
    mean: DeviceAddress,
    part: DeviceAddress,
) -> Result<()> {
    let pv = sh.plane_vecs();
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&y)
        .arg(&dy)
        .arg(&sh.n)
        .arg(&sh.c)
        .arg(&pv)
        .arg(&sh.chunk_len)
        .arg(&mean)
        .arg(&part);
    // SAFETY: the arguments match `bn_grad_stats_planes_<dt>(const T* x3, long long x4, const
    // float*, float*)`; x, y (when non-null) and dy are 16-byte aligned and packed [N, C, S]
    // with S a multiple of the vector, `mean` holds C floats and `part` 2 * chunks * C floats;
    // the grid is chunks x C.
    unsafe { b.launch_counted(reduction_grid(&sh.as_shape())) }?;
    Ok(())
}

/// Launches `bn_grad_apply_planes_<dt>(x, y, dy, dx, dz, vecs, plane_vecs, C, coef)`.
pub(crate) fn grad_apply_planes(
    stream: &CudaStream,
    f: &CudaFunction,
    [x, y, dy, dx, dz]: [DeviceAddress; 5],
    sh: &BnPlanesShape,
    coef: DeviceAddress,
) -> Result<()> {
    let (vecs, pv) = (sh.vectors(), sh.plane_vecs());
    let mut b = stream.launch_builder(f);
    b.arg(&x)
        .arg(&y)
        .arg(&dy)
        .arg(&dx)
        .arg(&dz)
        .arg(&vecs)
        .arg(&pv)
        .arg(&sh.c)
        .arg(&coef);
    // SAFETY: the arguments match `bn_grad_apply_planes_<dt>(const T* x3, T* x2, long long
    // x3, const float*)`; every non-null operand is 16-byte aligned and packed [N, C, S] with S
    // a multiple of the vector, dx and dz do not overlap the inputs or each other (checked by
    // the caller), `coef` holds 3 * C floats.
    unsafe { b.launch_counted(grid_for(vecs as u64)) }?;
    Ok(())
}
