//! Device memory for adapter outputs (Candle's on CUDA): typed, uninitialised,
//! stream-ordered allocations that a cuDNN graph or kernel then writes in full.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{Error, Result};
use crate::types::DeviceElement;

/// The element types [`alloc_uninit`] takes: `f32`, `f16` and `bf16`.
#[doc(hidden)]
pub trait UninitElement: DeviceElement {}
impl UninitElement for f32 {}
impl UninitElement for half::f16 {}
impl UninitElement for half::bf16 {}

/// Allocates `len` elements of uninitialised device memory of type `T` ordered on `stream`
/// (at least one element, so that empty tensors still own a valid allocation).
#[doc(hidden)]
pub fn alloc_uninit<T: UninitElement>(stream: &Arc<CudaStream>, len: usize, op: &'static str) -> Result<CudaSlice<T>> {
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
