//! Typed launches of the direct convolution kernels (`kernels/conv.cu`).
//!
//! Each function's argument list mirrors one kernel's C signature; the callers in
//! `kernels::conv` have validated dtypes, ranks, the dims of all three operands against
//! each other and the geometry (the output dims follow the convolution formula, groups
//! divide both channel counts), and built the [`ConvShape`] from those dims and the views'
//! own strides, so every element a kernel reads or writes lies inside the views the caller
//! was handed.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{grid_for, CountedLaunch};
use crate::types::DeviceAddress;

/// Geometry and strides of one convolution, padded to 3 spatial dims. Matches
/// `struct ConvShape` in `kernels/conv.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConvShape {
    /// Batch size N.
    pub n: i64,
    /// Input channels C.
    pub c: i64,
    /// Output channels K.
    pub k: i64,
    /// Input channels per group (C / groups).
    pub cg: i64,
    /// Output channels per group (K / groups).
    pub kg: i64,
    /// Input spatial sizes.
    pub input: [i64; 3],
    /// Filter spatial sizes.
    pub ker: [i64; 3],
    /// Output spatial sizes.
    pub out: [i64; 3],
    /// Padding before each spatial dim.
    pub pre: [i64; 3],
    /// Stride.
    pub stride: [i64; 3],
    /// Dilation.
    pub dil: [i64; 3],
    /// Element strides of x (or dx), `[N, C, I0, I1, I2]`.
    pub xs: [i64; 5],
    /// Element strides of w (or dw), `[K, C/groups, R0, R1, R2]`.
    pub ws: [i64; 5],
    /// Element strides of y (or dy), `[N, K, O0, O1, O2]`.
    pub ys: [i64; 5],
    /// Divisors of the walk over the written tensor: its logical dim `d` of item `i` is
    /// `(i / div[d]) % dims[d]`.
    pub div: [i64; 5],
    /// 1 when the written tensor has fewer than 2^31 elements.
    pub index32: i32,
    /// Padding to the C struct's 8-byte alignment.
    pub pad: i32,
}

// SAFETY: `ConvShape` is plain old data with a `#[repr(C)]` layout identical to the CUDA
// `struct ConvShape` (43 i64 then two int: 352 bytes, no interior padding), valid for any
// bits.
unsafe impl cudarc::driver::DeviceRepr for ConvShape {}

/// Threads per block of `conv_bwd_filter_<dt>` at most (`CONV_RED_THREADS`).
pub(crate) const CONV_RED_THREADS: u32 = 256;

/// Launches `conv_fwd_<dt>(const T* x, const T* w, T* y, ConvShape s, i64 n)` or
/// `conv_bwd_data_<dt>(const T* dy, const T* w, T* dx, ConvShape s, i64 n)`: one thread per
/// item of the `n` written elements (grid-stride).
pub(crate) fn per_element(
    stream: &CudaStream,
    f: &CudaFunction,
    a: DeviceAddress,
    b: DeviceAddress,
    out: DeviceAddress,
    shape: &ConvShape,
    n: i64,
) -> Result<()> {
    let mut l = stream.launch_builder(f);
    l.arg(&a).arg(&b).arg(&out).arg(shape).arg(&n);
    // SAFETY: the arguments match `conv_fwd_<dt>` / `conv_bwd_data_<dt>(const T*, const T*,
    // T*, ConvShape, long long)`; the written view holds the `n` elements its dims in
    // `shape` describe, and the inputs are read only at coordinates inside their own dims
    // (window taps are clipped to the input, output positions to the output; validated by
    // the caller).
    unsafe { l.launch_counted(grid_for(n as u64)) }?;
    Ok(())
}

/// Launches `conv_bwd_filter_<dt>(const T* x, const T* dy, T* dw, ConvShape s, i64 n)`:
/// `threads` (a power of two, 32 ..= [`CONV_RED_THREADS`]) per block, one block per dw
/// element (grid-stride over the `n` elements).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_filter(
    stream: &CudaStream,
    f: &CudaFunction,
    x: DeviceAddress,
    dy: DeviceAddress,
    dw: DeviceAddress,
    shape: &ConvShape,
    n: i64,
    threads: u32,
) -> Result<()> {
    debug_assert!(threads.is_power_of_two() && (32..=CONV_RED_THREADS).contains(&threads));
    let cfg = LaunchConfig {
        grid_dim: ((n as u64).clamp(1, 65_535 * 8) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = stream.launch_builder(f);
    l.arg(&x).arg(&dy).arg(&dw).arg(shape).arg(&n);
    // SAFETY: the arguments match `conv_bwd_filter_<dt>(const T*, const T*, T*, ConvShape,
    // long long)`; dw holds the `n` elements its dims in `shape` describe, x and dy are read
    // only at coordinates inside their dims (the output box of each tap is clipped to
    // where the input is, validated by the caller), and the block size is a power of two
    // no larger than the kernel's static reduction buffer.
    unsafe { l.launch_counted(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_shape_matches_the_c_struct_size() {
        // 43 i64 + 2 int in `struct ConvShape` (kernels/conv.cu).
        assert_eq!(std::mem::size_of::<ConvShape>(), 43 * 8 + 2 * 4);
        assert_eq!(std::mem::align_of::<ConvShape>(), 8);
    }
}
