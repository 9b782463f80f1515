//! # cudnn-backend-core
//!
//! The engine of `cudnn-backend`: convolutions, pooling, matmuls and fused ops at cuDNN speed
//! on raw device buffers, with no framework dependency. The `cudnn-backend` crate re-exports
//! these modules at the same paths and adds the Burn and Candle adapters.
//!
//! Layers (data flows one way):
//! - [`ops`]: framework-neutral entry points on raw device buffers (conv forward/backward,
//!   conv+bias+activation fused, matmul (+bias+activation), pooling forward/backward,
//!   attention forward/backward, norms, and the training ops: batch norm, layer/RMS norm
//!   backward, a multi-tensor Adam step);
//! - [`graph`]: a pure-Rust graph IR with validation, shape inference and signatures;
//! - [`plan`]: heuristics, engine filtering, autotuning and the plan cache;
//! - [`handle`]: the thread-pooled cuDNN handle manager;
//! - [`runtime`]: library probing, devices, streams and workspace memory;
//! - [`view`]: strided-view algebra (permute, slice, expand, reshape, unfold) for framework tensors;
//! - [`kernels`]: NVRTC-compiled elementwise and reduction kernels on strided views;
//! - [`collective`]: all-reduce, broadcast and all-gather between GPUs through NCCL;
//! - [`config`]: every setting the crate reads from the environment, read once;
//! - `Engine` (`engine()`, hidden): the one object that owns every cache, pool, table and counter.
//!
//! Items marked `#[doc(hidden)]` are the adapters' interface (what `cudnn-backend`'s Burn and
//! Candle adapters reach in the engine), not a stable API.
//!
//! cuDNN, the CUDA driver, NVRTC and NCCL are loaded at run time: the crate builds on machines
//! without CUDA, and a machine without a GPU gets a clear [`Error`] instead of a panic.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod collective;
pub mod config;
#[doc(hidden)]
pub mod error;
// Hidden, so its docs may link to its private modules.
#[doc(hidden)]
#[allow(rustdoc::private_intra_doc_links)]
pub mod ffi;
pub mod graph;
pub mod handle;
pub mod kernels;
pub mod ops;
pub mod plan;
pub mod runtime;
mod state;
pub mod types;
pub mod view;

#[doc(inline)]
pub use error::{CudnnStatus, Error, InOp, Result};
#[doc(inline)]
pub use ffi::{CUDNN_LIB_ENV, CUDNN_LIB_NAMES, NCCL_LIB_ENV, NCCL_LIB_NAMES};
pub use runtime::Device;
#[doc(hidden)]
pub use state::Engine;

/// The process's engine (the layers reach their state through it).
static ENGINE: Engine = Engine::new();

/// The process's [`Engine`]: every cache, pool, table and counter of the crate (the
/// adapters' interface, not a stable API).
#[doc(hidden)]
pub fn engine() -> &'static Engine {
    &ENGINE
}

/// Re-export of the `cudarc` version the crate is built on (streams, device memory).
pub use cudarc;
