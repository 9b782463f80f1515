//! Device memory for Candle outputs (feature `candle-cuda`): typed, uninitialised,
//! stream-ordered allocations that a cuDNN graph or kernel then writes in full.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

use crate::error::{Error, Result};

/// Allocates `len` elements of uninitialised device memory of type `T` ordered on `stream`
/// (at least one element, so that empty tensors still own a valid allocation).
pub(crate) fn alloc_uninit<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
    op: &'static str,
) -> Result<CudaSlice<T>> {
    // SAFETY: `T` is a plain numeric element type (f32, f16, bf16) for which every bit
    // pattern is a valid value. The buffer is handed to exactly one op, which writes every
    // element of the output view before Candle can read it (the same contract as
    // `torch.empty`); no host code reads it before that.
    unsafe { stream.alloc::<T>(len.max(1)) }.map_err(|e| Error::OutOfMemory {
        op,
        bytes: len * std::mem::size_of::<T>(),
        message: e.to_string(),
    })
}
