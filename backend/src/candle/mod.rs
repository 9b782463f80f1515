//! Candle 0.11 integration (feature `candle`; on `Device::Cuda` tensors with `candle-cuda`).
//!
//! - [`CudnnExt`]: an extension trait on [`candle_core::Tensor`] with cuDNN convolutions
//!   (1-D/2-D/3-D and N-d, any padding, stride, dilation and groups — one grouped graph),
//!   transposed convolution, conv + bias + activation as one fused graph, matmul
//!   (+ bias + activation), max/average pooling, layer/RMS/batch norm and scaled dot-product
//!   attention.
//! - [`ops`]: the Candle `CustomOp`s behind it. Every op has a `cuda_fwd` that runs our cuDNN
//!   graph on **Candle's own stream** with Candle's memory (no copies: device pointers are read
//!   through cudarc's `DevicePtr` guards, kept alive until the graph is enqueued; outputs are
//!   allocated on Candle's stream and wrapped in a `CudaStorage`), a `cpu_fwd` (a float64
//!   reference: correct, not fast, so the same program runs on `Device::Cpu`), and a `bwd` that
//!   Candle's autograd uses, made of our own ops (conv dgrad/wgrad graphs, pooling backward) or
//!   one fused engine backward (batch norm, layer/RMS norm, attention), so training runs
//!   through cuDNN and the engine's kernels too.
//! - Training: [`ops::batch_norm_train`] (batch statistics, running statistics updated in
//!   place, backward from the saved mean and inverse std), the training variants of
//!   [`ops::Norm`] and [`ops::Sdpa`] (forward keeping the row / softmax statistics, backward
//!   through the engine's norm backward and cuDNN's fused attention backward), and
//!   [`optim::FusedAdamW`] (candle-nn's AdamW as one multi-tensor kernel launch per 32
//!   variables).
//! - [`nn`]: layers loading the same `VarBuilder` names as candle-nn's (`weight`, `bias`,
//!   `running_mean`, `running_var`), so a candle-nn model switches by changing imports;
//!   [`nn::BatchNorm`] trains on the fused batch-norm op.
//!
//! Layout: Candle tensors are logically NCHW. An input whose strides are channels-last (an
//! NHWC buffer viewed as NCHW, e.g. `x_nhwc.permute((0, 3, 1, 2))`) runs channels-last, and the
//! output is produced channels-last too (again an NCHW-shaped view), so a chain of layers stays
//! NHWC without copies. Any other packed layout (a transposed matrix, a permuted tensor) is
//! passed to cuDNN through its strides; layouts with gaps, overlaps or broadcast (stride 0)
//! dims are copied once (`Tensor::contiguous`) before the op.
//!
//! Dtypes: f32, f16 and bf16 on CUDA; the CPU reference also takes f64. Layer/RMS norm run a
//! cuDNN norm graph (inference) or the engine's norm kernels (training), attention cuDNN's
//! fused flash-attention graphs (f16/bf16, forward and backward); the cases those do not take
//! (masks, f32 attention, other dtypes, cuDNN declining a shape) compose Candle's own ops
//! around our matmuls: see [`CudnnExt::cudnn_layer_norm`] and [`CudnnExt::cudnn_sdpa`].
//!
//! Errors are values: the ops return `candle_core::Error`s that wrap the crate's
//! [`Error`](crate::Error); an [`Error`](crate::Error) from the engine's own functions becomes
//! one with `candle_core::Error::wrap` (the error type lives in `cudnn-backend-core`, so no
//! `From` conversion into Candle's can be written).

mod access;
pub mod collective;
mod cpu;
#[cfg(feature = "candle-cuda")]
mod cuda;
mod ext;
pub mod nn;
pub mod ops;
pub mod optim;
mod saved;

pub use crate::ops::{Activation, ConvParams, PoolMode};
pub use ext::{Conv1dParams, Conv2dParams, Conv3dParams, ConvTranspose2dParams, CudnnExt};

/// Shorthand for an argument error of `op` as a Candle error.
pub(crate) fn arg_err(op: &'static str, arg: &'static str, reason: impl Into<String>) -> candle_core::Error {
    candle_core::Error::wrap(crate::Error::invalid_arg(op, arg, reason))
}
