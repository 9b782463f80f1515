//! Typed launch of the multi-tensor Adam kernels (`kernels/optim.cu`).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::ffi::launch::CountedLaunch;
use crate::types::DeviceAddress;

/// Most tensors one launch updates (`ADAM_MAX`).
#[doc(hidden)]
pub const ADAM_MAX: usize = 32;

/// Threads per block (`ADAM_THREADS`).
const ADAM_THREADS: u32 = 256;

/// One tensor of a launch (`struct AdamTensor`): addresses (0 = absent), element count and
/// the bias-correction factors of its step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct AdamTensor {
    pub p: DeviceAddress,
    pub g: DeviceAddress,
    pub m: DeviceAddress,
    pub v: DeviceAddress,
    pub vmax: DeviceAddress,
    pub p_out: DeviceAddress,
    pub m_out: DeviceAddress,
    pub v_out: DeviceAddress,
    pub vmax_out: DeviceAddress,
    pub numel: i64,
    pub a: f32,
    pub e: f32,
}

/// The parameter block of one launch (`struct AdamBatch`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AdamBatch {
    pub count: i32,
    pub chunk: i32,
    pub first_chunk: [i32; ADAM_MAX + 1],
    pub t: [AdamTensor; ADAM_MAX],
}

/// Shared hyper-parameters (`struct AdamHyper`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct AdamHyper {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub l2: f32,
    pub decay_rate: f32,
    pub amsgrad: i32,
    pub cautious: i32,
}

// SAFETY: the three structs are `#[repr(C)]` with the field order, types and therefore the
// padding of their CUDA counterparts in kernels/optim.cu (u64/i64/f32/i32 fields only); any
// bit pattern is a valid value.
unsafe impl cudarc::driver::DeviceRepr for AdamTensor {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for AdamBatch {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for AdamHyper {}

/// Launches `adam_<dt>(AdamBatch b, AdamHyper h)` with one block per chunk.
pub(crate) fn adam(stream: &CudaStream, f: &CudaFunction, batch: &AdamBatch, hyper: &AdamHyper) -> Result<()> {
    let blocks = batch.first_chunk[batch.count as usize] as u32;
    if blocks == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (ADAM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(batch).arg(hyper);
    // SAFETY: the arguments match `adam_<dt>(const AdamBatch, AdamHyper)` (both by value,
    // layouts identical to the CUDA structs). The caller (ops::optim) checked that every
    // non-null address of the first `count` tensors holds `numel` packed elements of the
    // entry point's dtype, that outputs overlap inputs only element for element, and built
    // `first_chunk` as the prefix sums of ceil(numel / chunk), so every block maps to one
    // chunk inside one tensor.
    unsafe { b.launch_counted(cfg) }?;
    Ok(())
}
