//! Typed launches of the CTC loss kernels (`kernels/ctc.cu`).
//!
//! The callers in `kernels::ctc` have validated dtypes, dims and strides beforehand, so every
//! element a kernel touches lies inside the views the caller was handed.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::CountedLaunch;
use crate::types::DeviceAddress;

/// Threads per block of the recursions (one block per sample, threads over target positions).
const RECURSION_THREADS: u32 = 256;
/// Threads per block of the gradient (one block per `(t, n)` row).
const GRAD_THREADS: u32 = 128;
/// Largest grid used (the kernels loop over the rest).
const MAX_GRID: u64 = 65_535 * 8;

/// Sizes and element strides of a CTC problem. Matches `struct CtcArgs` in `kernels/ctc.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CtcArgs {
    /// `T`, `N`, `C`.
    pub steps: i64,
    pub batch: i64,
    pub classes: i64,
    /// Strides of `log_probs` along T, N and C.
    pub lp_strides: [i64; 3],
    /// `S`, the padded target length.
    pub max_target: i64,
    /// Strides of `targets` along N and S.
    pub target_strides: [i64; 2],
    /// Strides of `input_lengths` and `target_lengths`.
    pub length_strides: [i64; 2],
    pub blank: i64,
}

// SAFETY: `CtcArgs` is plain old data (twelve i64, `#[repr(C)]`, no padding) laid out as the
// CUDA `struct CtcArgs` (twelve consecutive long long fields), valid for any bits.
unsafe impl cudarc::driver::DeviceRepr for CtcArgs {}

/// Device addresses of the inputs every CTC kernel reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CtcInputPtrs {
    pub log_probs: DeviceAddress,
    pub targets: DeviceAddress,
    pub input_lengths: DeviceAddress,
    pub target_lengths: DeviceAddress,
}

fn blocks(n: i64, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n.max(1) as u64).min(MAX_GRID) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `ctc_alpha_<dt>(lp, targets, il, tl, CtcArgs, A* alpha, A* nll)`.
pub(crate) fn alpha(
    stream: &CudaStream,
    f: &CudaFunction,
    p: &CtcInputPtrs,
    args: &CtcArgs,
    alpha: DeviceAddress,
    nll: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&p.log_probs)
        .arg(&p.targets)
        .arg(&p.input_lengths)
        .arg(&p.target_lengths)
        .arg(args)
        .arg(&alpha)
        .arg(&nll);
    // SAFETY: the arguments match `ctc_alpha_<dt>(const T*, const i64*, const i64*, const i64*,
    // CtcArgs, A*, A*)`; the caller checked that log_probs covers `[T, N, C]` with the given
    // strides, targets `[N, S]`, the lengths `[N]`, and that `alpha` holds `T * N * (2S + 1)`
    // and `nll` `N` packed accumulator elements.
    unsafe { b.launch_counted(blocks(args.batch, RECURSION_THREADS)) }?;
    Ok(())
}

/// Launches `ctc_beta_<dt>(lp, targets, il, tl, CtcArgs, A* beta)`.
pub(crate) fn beta(
    stream: &CudaStream,
    f: &CudaFunction,
    p: &CtcInputPtrs,
    args: &CtcArgs,
    beta: DeviceAddress,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&p.log_probs)
        .arg(&p.targets)
        .arg(&p.input_lengths)
        .arg(&p.target_lengths)
        .arg(args)
        .arg(&beta);
    // SAFETY: as in `alpha`, with `beta` holding `T * N * (2S + 1)` packed accumulator
    // elements.
    unsafe { b.launch_counted(blocks(args.batch, RECURSION_THREADS)) }?;
    Ok(())
}

/// The recursions' outputs the gradient reads, and the per-sample loss gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CtcGradPtrs {
    pub alpha: DeviceAddress,
    pub beta: DeviceAddress,
    pub nll: DeviceAddress,
    pub grad_loss: DeviceAddress,
    /// Element stride of `grad_loss`.
    pub grad_loss_stride: i64,
    pub grad: DeviceAddress,
}

/// Launches `ctc_grad_<dt>(lp, targets, il, tl, CtcArgs, alpha, beta, nll, grad_loss,
/// gl_stride, grad)`, one block per `(t, n)` row.
pub(crate) fn grad(
    stream: &CudaStream,
    f: &CudaFunction,
    p: &CtcInputPtrs,
    args: &CtcArgs,
    g: &CtcGradPtrs,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&p.log_probs)
        .arg(&p.targets)
        .arg(&p.input_lengths)
        .arg(&p.target_lengths)
        .arg(args)
        .arg(&g.alpha)
        .arg(&g.beta)
        .arg(&g.nll)
        .arg(&g.grad_loss)
        .arg(&g.grad_loss_stride)
        .arg(&g.grad);
    // SAFETY: the arguments match `ctc_grad_<dt>(const T*, const i64*, const i64*, const i64*,
    // CtcArgs, const A*, const A*, const A*, const T*, i64, T*)`; besides the inputs of
    // `alpha`, the caller checked `grad_loss` (`N` elements at the given stride) and `grad`
    // (`T * N * C` packed elements of the log-probabilities' dtype).
    unsafe { b.launch_counted(blocks(args.steps * args.batch, GRAD_THREADS)) }?;
    Ok(())
}
