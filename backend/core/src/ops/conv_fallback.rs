//! The backend's exact direct-convolution kernels ([`crate::kernels::conv`]) as the fallback
//! of the cuDNN convolution ops.
//!
//! - **No engine.** When cuDNN offers no engine for a convolution graph (`GRAPH_JIT_ONLY`
//!   has none for grouped convolutions, f32 backward passes and some f16 shapes; the full
//!   library declines exotic geometries), the op runs the direct kernel instead of failing,
//!   with one warning per op that names the graph and the reason. PyTorch falls back to its
//!   own native convolutions the same way.
//! - **Checked engines under `GRAPH_JIT_ONLY`.** The runtime-compiled engines of that
//!   configuration can return wrong results for some geometries (cuDNN 9.14 on an H100, e.g.
//!   an NCHW convolution with stride (2, 1) and dilation (1, 2)). There, the first run of
//!   each new convolution (op, shapes, strides, dtype, geometry) is compared with the direct
//!   kernel on the same inputs (one host read of both results); a result beyond the dtype's
//!   bound is replaced by the kernel's, and that convolution runs the kernel from then on,
//!   with a warning. The check costs one extra convolution and a synchronization per new
//!   shape, in this configuration only.
//! - **Grouped convolutions under `GRAPH_JIT_ONLY`** skip cuDNN and run the direct kernel.
//!   That configuration has no engine for most of them, and one of its runtime-compiled
//!   forward engines can make misaligned writes into very small outputs (a 32-byte output,
//!   memcheck), a fault that ends the CUDA context. The convolutions with outputs that small
//!   are grouped ones (e.g. bf16 `[2, 8, 1, 1]`, 4 groups), and a fault cannot be caught by
//!   checking the result afterwards, so these are kept off cuDNN there.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use half::{bf16, f16};

use super::{TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::memory::DeviceBuffer;
use crate::types::{row_major_strides, DataType};

/// Under `GRAPH_JIT_ONLY`: convolutions (their op keys) whose cuDNN result failed the check
/// and run the direct kernel, and those whose result passed it.
#[derive(Default)]
pub(crate) struct Verdicts {
    direct: HashSet<Vec<u8>>,
    checked: HashSet<Vec<u8>>,
}

fn verdicts() -> &'static Mutex<Verdicts> {
    crate::engine().conv_verdicts.get_or_init(Default::default)
}

/// The key under which a convolution's verdict is kept: only under `GRAPH_JIT_ONLY`, where
/// cuDNN's results are checked. Elsewhere nothing is kept (a declined graph is remembered by
/// the plan cache, so its next call fails fast), and the common path takes no lock.
pub(super) fn verdict_key(key: &super::OpKey) -> Option<Vec<u8>> {
    crate::plan::policy::graph_jit_only().then(|| key.bytes())
}

/// Runs `cudnn` (which writes `out`), or `direct` (the same result from the direct kernel)
/// when cuDNN declines, and with a `key` ([`verdict_key`]) when this convolution was
/// rejected before or cuDNN's first result disagrees with the direct kernel's. A grouped
/// convolution (`groups > 1`) with a key runs `direct` without trying cuDNN (see the module).
pub(super) fn cudnn_or_direct(
    stream: &Arc<CudaStream>,
    op: &'static str,
    key: Option<Vec<u8>>,
    groups: i64,
    out: &TensorMut,
    cudnn: impl FnOnce() -> Result<()>,
    direct: impl Fn(&TensorMut) -> Result<()>,
) -> Result<()> {
    let lock = || verdicts().lock().unwrap_or_else(|e| e.into_inner());
    if key.is_some() && groups > 1 {
        warn_once(
            op,
            "under GRAPH_JIT_ONLY grouped convolutions skip cuDNN's runtime-compiled engines (one faulted the \
             device on a grouped convolution)",
        );
        return direct(out);
    }
    if key.as_ref().is_some_and(|k| lock().direct.contains(k)) {
        return direct(out);
    }
    match (cudnn(), key) {
        (Err(e), _) if e.is_not_supported() => {
            warn_once(op, &format!("cuDNN has no engine: {e}"));
            direct(out)
        }
        (Err(e), _) => Err(e),
        (Ok(()), None) => Ok(()),
        (Ok(()), Some(key)) if lock().checked.contains(&key) => Ok(()),
        (Ok(()), Some(key)) => {
            let scratch = DeviceBuffer::alloc(stream, out.numel() as usize * out.dtype.size(), op)?;
            let expected = scratch.view_mut(0, &out.dims, &row_major_strides(&out.dims), out.dtype)?;
            direct(&expected)?;
            let err = rel_l2(stream, op, out, &expected, &scratch)?;
            let bound = bound(out.dtype);
            if err <= bound {
                lock().checked.insert(key);
                return Ok(());
            }
            warn_once(
                op,
                &format!(
                    "cuDNN's runtime-compiled engine returned a result {err:.2e} (relative L2) away from the exact \
                     convolution (bound {bound:.0e}) for the output {:?}",
                    **out
                ),
            );
            lock().direct.insert(key);
            crate::kernels::elementwise::copy(stream, &expected, out)
        }
    }
}

/// The first fallback of each op is a warning; later ones are debug messages.
fn warn_once(op: &'static str, why: &str) {
    if crate::engine().first_warning(op) {
        tracing::warn!(
            "{op}: {why}. Running the backend's exact direct-convolution kernel instead (slower than cuDNN; \
             further cases of {op} are logged at debug level)"
        );
    } else {
        tracing::debug!("{op}: {why}; running the direct-convolution kernel");
    }
}

/// Relative L2 distance allowed between cuDNN's result and the exact one: rounding and
/// summation order (and TF32, when allowed) stay far below it; a wrong result does not.
fn bound(dtype: DataType) -> f64 {
    match dtype {
        DataType::F64 => 1e-9,
        DataType::F32 if !crate::plan::policy().allow_tf32 => 1e-4,
        _ => 3e-2,
    }
}

/// `||got - want|| / ||want||` of a cuDNN result `got` (any strides) and the direct kernel's
/// `want` (packed at the start of `want_buf`), both read back to the host.
fn rel_l2(
    stream: &Arc<CudaStream>,
    op: &'static str,
    got: &TensorMut,
    want: &TensorRef,
    want_buf: &DeviceBuffer,
) -> Result<f64> {
    let bytes = got.numel() as usize * got.dtype.size();
    let packed = DeviceBuffer::alloc(stream, bytes, op)?;
    let got_packed = packed.view_mut(0, &got.dims, &row_major_strides(&got.dims), got.dtype)?;
    crate::kernels::elementwise::copy(stream, got, &got_packed)?;
    let (mut g, mut w) = (vec![0u8; bytes], vec![0u8; bytes]);
    packed.read(0, &mut g)?;
    want_buf.read(0, &mut w)?;
    let (g, w) = (to_f64(got.dtype, &g, op)?, to_f64(want.dtype, &w, op)?);
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in g.iter().zip(&w) {
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    if !diff.is_finite() {
        return Ok(f64::INFINITY);
    }
    Ok((diff / norm.max(f64::MIN_POSITIVE)).sqrt())
}

fn to_f64(dtype: DataType, bytes: &[u8], op: &'static str) -> Result<Vec<f64>> {
    let chunks = bytes.chunks_exact(dtype.size());
    Ok(match dtype {
        DataType::F32 => chunks
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DataType::F64 => chunks
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        DataType::F16 => chunks.map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DataType::BF16 => chunks.map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        other => {
            return Err(Error::Unsupported {
                graph: op.to_string(),
                reason: format!("checking a {other:?} convolution result"),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_strides_are_row_major() {
        assert_eq!(row_major_strides(&[2, 3, 4, 5]).to_vec(), vec![60, 20, 5, 1]);
        assert_eq!(row_major_strides(&[7]).to_vec(), vec![1]);
        assert_eq!(row_major_strides(&[3, 0, 2]).to_vec(), vec![2, 2, 1]);
    }

    #[test]
    fn host_values_decode_per_dtype() {
        let f = to_f64(DataType::F32, &1.5f32.to_le_bytes(), "t").unwrap();
        assert_eq!(f, vec![1.5]);
        let h = to_f64(DataType::F16, &f16::from_f64(-2.0).to_le_bytes(), "t").unwrap();
        assert_eq!(h, vec![-2.0]);
        let b = to_f64(DataType::BF16, &bf16::from_f64(0.5).to_le_bytes(), "t").unwrap();
        assert_eq!(b, vec![0.5]);
        assert!(to_f64(DataType::I32, &[0; 4], "t").is_err());
    }

    #[test]
    fn bounds_catch_wrong_results_only() {
        assert!(bound(DataType::F16) < 0.1 && bound(DataType::BF16) < 0.1);
        assert!(bound(DataType::F64) < 1e-6);
    }
}
