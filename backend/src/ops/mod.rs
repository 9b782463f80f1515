//! Framework-neutral entry points on raw device buffers: each op is one call that builds
//! its cuDNN graph, looks up (or builds) the plan through the handle pool and plan cache,
//! and enqueues the work on the given stream.
//!
//! Tensors are passed as [`TensorRef`]s: dims and strides in elements (layout comes from
//! strides, so NCHW and NHWC are both just strides), a dtype and a device pointer.
//! Outputs are written, never read. Nothing synchronizes.

mod conv;
mod fallback;
mod matmul;
mod pool;
mod tensor;

pub use conv::{conv_backward_data, conv_backward_filter, conv_bias_act_forward, conv_forward, ConvParams};
pub use matmul::{matmul, matmul_bias_act};
pub use pool::{pool_backward, pool_forward, PoolMode, PoolParams};
pub use tensor::{Activation, TensorRef};

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::plan::{execute_graph_on, Binding};

/// Validates `g` (mapping graph errors to argument errors of `op`) and executes it.
fn run(stream: &Arc<CudaStream>, g: &mut Graph, bindings: &[Binding], op: &'static str) -> Result<()> {
    g.validate().map_err(|e| match e {
        Error::InvalidGraph(msg) => Error::invalid_arg(op, "tensors", msg),
        other => other,
    })?;
    execute_graph_on(stream, g, bindings)
}

/// Zero-fills an output whose op has an empty reduction (e.g. a batch of 0 in wgrad).
fn zero_fill(stream: &Arc<CudaStream>, t: &TensorRef) -> Result<()> {
    let bytes = t.extent_elements() as usize * t.dtype.size();
    crate::ffi::launch::memset_zero(stream, t.ptr, bytes)
}
