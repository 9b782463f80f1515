//! cuDNN for Burn 0.22+: one call at program start, [`register`], and an unchanged Burn model
//! on `Device::cuda(i)` runs its convolutions and pooling through cudnn-backend's engine.
//!
//! Burn 0.22 has no place for a third-party backend, but its CUDA backend offers single IR
//! nodes to fusers registered with `burn_cubecl::fusion::register`. This crate registers one
//! that claims
//!
//! - convolution forward 1-3-D (with or without bias), and the data and weight gradients
//!   (`Conv{1,2,3}d`, `Conv{1,2,3}dXBackward`, `Conv{1,2,3}dWeightBackward`), and transposed
//!   convolutions 1-3-D (`ConvTranspose{1,2,3}d`),
//! - 2-D average pooling forward and backward (with or without `ceil_mode`), 1-D average
//!   pooling, 1-D and 2-D adaptive average pooling and their backward nodes, and 2-D max
//!   pooling forward (without indices) and backward (`MaxPool2d`,
//!   `MaxPool2dWithIndicesBackward`; no `ceil_mode`, no dilation),
//! - the row adds of an embedding gradient (a float `select_assign` with addition along dim 0),
//!
//! in f32, f16 and bf16, and runs them with `cudnn_backend_core::ops` on the engine's stream,
//! ordered with CubeCL's stream on the GPU (stream memory operations, no host synchronization).
//! Everything else stays Burn's, and a claimed node the engine cannot run (shape, layout,
//! cuDNN support) runs Burn's implementation through the fusion fallback: never a panic, one
//! warning per operation.
//!
//! ```no_run
//! fn main() -> Result<(), cudnn_burn::Error> {
//!     cudnn_burn::register()?; // before the first tensor operation
//!     // ... Burn 0.22 code on burn::prelude::Device::cuda(0), unchanged ...
//!     Ok(())
//! }
//! ```

mod claim;
mod error;
mod execute;
mod layout;
mod ordering;
mod provider;
mod stats;

use std::sync::{Arc, OnceLock};

pub use error::{Error, Result};
pub use provider::{NAME, SCORE};
pub use stats::Stats;

use provider::{CudnnProvider, Shared};

/// The registered provider's shared state. Burn's fusion registry is process-wide (one
/// registration per name, sealed when fusion starts), so the provider's state is too; this
/// is the crate's only process-wide static, and it exists so that [`stats`] can read the
/// registered provider's counters.
static REGISTERED: OnceLock<Arc<Shared>> = OnceLock::new();

/// Registers cudnn-burn's fusion provider with Burn's CUDA backend. Call it once, before the
/// first tensor operation of the program.
///
/// It touches no GPU: the engine opens a device the first time a claimed operation runs on it.
///
/// # Errors
/// [`Error::AlreadyRegistered`] when it ran before in this process, [`Error::FusionStarted`]
/// when Burn's fusion service already runs (a tensor operation came first).
pub fn register() -> Result<()> {
    let shared = Arc::new(Shared::default());
    burn_cubecl::fusion::register(CudnnProvider { shared: shared.clone() })?;
    REGISTERED.set(shared).map_err(|_| Error::AlreadyRegistered)
}

/// What the registered provider did since [`register`], or `None` when it is not registered.
pub fn stats() -> Option<Stats> {
    REGISTERED.get().map(|s| s.counters.snapshot())
}
