//! Typed launches of the row-softmax kernels of attention's f32 math path
//! (`kernels/attention.cu`).
//!
//! The caller (`ops::attention_math`) has checked that the scores are packed f32
//! `[rows, n]`, that the log-sum-exp (when given) holds `rows` f32 and that `rows` is a
//! multiple of the query length `lq <= n` (one block of `lq` rows per batch and head).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::{warp_per_row, CountedLaunch};
use crate::types::DeviceAddress;

/// Rows per block (`ATTN_ROWS`; one warp per row).
const ROWS: u32 = 8;

fn row_grid(rows: i64) -> LaunchConfig {
    warp_per_row(rows, ROWS)
}

/// Launches `attn_softmax_f32(s, lse, rows, n, lq, scale, causal)`: `s` in place, `lse`
/// written when non-zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax(
    stream: &CudaStream,
    f: &CudaFunction,
    s: DeviceAddress,
    lse: DeviceAddress,
    rows: i64,
    n: i64,
    lq: i64,
    scale: f32,
    causal: bool,
) -> Result<()> {
    let causal = causal as i32;
    let mut b = stream.launch_builder(f);
    b.arg(&s).arg(&lse).arg(&rows).arg(&n).arg(&lq).arg(&scale).arg(&causal);
    // SAFETY: the arguments match `attn_softmax_f32(float*, float*, long long x3, float,
    // int)`; s holds rows * n packed floats, lse is null or holds rows floats, lq divides
    // rows and lq <= n (checked by the caller), so every row sees at least one key.
    unsafe { b.launch_counted(row_grid(rows)) }?;
    Ok(())
}

/// Launches `attn_softmax_bwd_f32(p, dp, rows, n, scale)`: `dp` in place.
pub(crate) fn softmax_backward(
    stream: &CudaStream,
    f: &CudaFunction,
    p: DeviceAddress,
    dp: DeviceAddress,
    rows: i64,
    n: i64,
    scale: f32,
) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&p).arg(&dp).arg(&rows).arg(&n).arg(&scale);
    // SAFETY: the arguments match `attn_softmax_bwd_f32(const float*, float*, long long x2,
    // float)`; p and dp hold rows * n packed floats each and do not overlap (checked by the
    // caller).
    unsafe { b.launch_counted(row_grid(rows)) }?;
    Ok(())
}
