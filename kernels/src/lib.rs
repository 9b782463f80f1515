//! The CUDA C++ sources of [cudnn-backend](https://crates.io/crates/cudnn-backend)'s kernels,
//! embedded as strings.
//!
//! cudnn-backend compiles them with NVRTC on the machine that runs them (no CUDA toolkit at
//! build time); this crate only carries the text, so the sources live beside the crate that
//! embeds them and a build from crates.io finds them. Every source is compiled with
//! [`PRELUDE`] in front, and the sources marked so in cudnn-backend with [`COMMON`] after it.

#![no_std]
#![warn(missing_docs)]

/// Compiled before every source: the `KERNEL` entry-point macro (one template per kernel, so
/// the loader instantiates only the kernel it is asked for).
pub const PRELUDE: &str = include_str!("../prelude.cuh");

/// Shared definitions: strided layouts, f16/bf16 conversions, per-channel loads and stores.
pub const COMMON: &str = include_str!("../common.cuh");

/// Bias add + activation, in place.
pub const BIAS_ACT: &str = include_str!("../bias_act.cu");

/// Op codes and per-op math of the elementwise kernels (the head of the elementwise source;
/// the generated fused kernels are built on it).
pub const ELEMENTWISE_MATH: &str = include_str!("../elementwise_math.cuh");

/// Fill, copy/cast, unary, binary, compare and where on strided views: [`ELEMENTWISE_MATH`]
/// followed by `elementwise.cu`.
pub const ELEMENTWISE: &str = concat!(
    include_str!("../elementwise_math.cuh"),
    include_str!("../elementwise.cu")
);

/// Reductions, arg-reductions and scans along one axis.
pub const REDUCE: &str = include_str!("../reduce.cu");

/// Gather, scatter-add, index-select and index-add along one axis.
pub const INDEX: &str = include_str!("../index.cu");

/// Philox4x32-10 uniform, normal, bernoulli and uniform_int on strided outputs.
pub const RANDOM: &str = include_str!("../random.cu");

/// Stable bitonic sort of rows along one axis, and the merge passes of long rows.
pub const SORT: &str = include_str!("../sort.cu");

/// 2-D max (with indices), average and adaptive average pooling, forward and backward.
pub const POOL: &str = include_str!("../pool.cu");

/// Nearest, bilinear and bicubic interpolation (forward and backward) and grid sampling.
pub const RESIZE: &str = include_str!("../resize.cu");

/// Integer matmul, 3-vector cross product, symmetric int8 quantize / dequantize.
pub const LINALG: &str = include_str!("../linalg.cu");

/// Batch normalization: training statistics, inference, backward (with residual + ReLU).
pub const BATCH_NORM: &str = include_str!("../batch_norm.cu");

/// Multi-tensor fused optimizer steps (Adam / AdamW).
pub const OPTIM: &str = include_str!("../optim.cu");

/// Layer and RMS norm training forward (with row statistics) and backward.
pub const NORM: &str = include_str!("../norm.cu");

/// The row softmax of attention's f32 math path, forward (in place, with the causal mask) and
/// backward.
pub const ATTENTION: &str = include_str!("../attention.cu");

/// CTC loss: the log-space forward and backward recursions and the gradient.
pub const CTC: &str = include_str!("../ctc.cu");

/// Cross-entropy of logits rows against class targets: the one-pass forward (row loss and
/// log-sum-exp), the one-pass logits gradient, and the mean's small reductions.
pub const CROSS_ENTROPY: &str = include_str!("../cross_entropy.cu");

/// Direct convolution (cross-correlation) forward, backward data and backward filter on
/// strided views, 1 to 3 spatial dims, with groups.
pub const CONV: &str = include_str!("../conv.cu");
