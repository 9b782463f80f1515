//! # cudnn-backend
//!
//! Convolutions, pooling, matmuls and fused ops at cuDNN speed from Rust.
//!
//! The engine is the crate `cudnn-backend-core` (no framework dependency), re-exported here at
//! the same paths; this crate adds the framework adapters.
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
//! - `burn` (feature `burn`, default): the Burn 0.21 backend `Cudnn`, `CudnnFusion` and
//!   drop-in modules and optimizers;
//! - `candle` (feature `candle`): Candle custom ops, the `CudnnExt` trait and candle-nn-style
//!   layers (feature `candle-cuda` runs them on Candle's CUDA tensors).
//!
//! cuDNN, the CUDA driver, NVRTC and NCCL are loaded at run time: the crate builds on machines
//! without CUDA, and a machine without a GPU gets a clear [`Error`] instead of a panic.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "burn")]
#[cfg_attr(docsrs, doc(cfg(feature = "burn")))]
pub mod burn;
#[cfg(feature = "candle")]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub mod candle;
#[doc(inline)]
pub use cudnn_backend_core::{collective, config, graph, handle, kernels, ops, plan, runtime, types, view};
// The engine's error and FFI modules, for the adapters' `crate::error` and `crate::ffi` paths.
#[cfg(feature = "burn")]
use cudnn_backend_core::error;
#[cfg(any(feature = "burn", feature = "candle"))]
use cudnn_backend_core::ffi;

pub use cudnn_backend_core::Device;
pub use cudnn_backend_core::{engine, Engine};
pub use cudnn_backend_core::{CudnnStatus, Error, InOp, Result};
pub use cudnn_backend_core::{CUDNN_LIB_ENV, CUDNN_LIB_NAMES, NCCL_LIB_ENV, NCCL_LIB_NAMES};

/// Re-export of the `cudarc` version the crate is built on (streams, device memory).
pub use cudnn_backend_core::cudarc;
