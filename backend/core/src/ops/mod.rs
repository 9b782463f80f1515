//! Framework-neutral entry points on raw device buffers: each op is one call that builds
//! its cuDNN graph, looks up (or builds) the plan through the handle pool and plan cache,
//! and enqueues the work on the given stream.
//!
//! Tensors are passed as [`TensorRef`]s: dims and strides in elements (layout comes from
//! strides, so NCHW and NHWC are both just strides), a dtype and a device pointer.
//! Outputs are written, never read. Nothing synchronizes.

mod attention;
mod attention_math;
mod batch_norm;
mod conv;
pub(crate) mod conv_fallback;
mod conv_transpose;
mod cross_entropy;
mod fallback;
mod matmul;
mod norm;
mod norm_train;
mod optim;
mod pool;
mod pool_kernels;
mod tensor;

/// The convolution geometry the ops take ([`crate::types::ConvGeometry`]).
pub use crate::types::ConvGeometry as ConvParams;
pub use crate::types::{Activation, PoolMode, TensorMut, TensorRef};
pub use attention::{
    sdpa_backward, sdpa_backward_prefetch, sdpa_forward, sdpa_forward_dropout, sdpa_forward_when_built, sdpa_fusable,
    AttentionDropout, SdpaBackward,
};
pub use attention_math::{attention_math_backward, attention_math_forward, AttentionMathBackward};
pub use batch_norm::{
    batch_norm_backward, batch_norm_inference, batch_norm_train_forward, BatchNormBackward, BatchNormForward,
    BatchNormInference, BatchNormOptions, RunningStats,
};
pub use conv::{conv_backward_data, conv_backward_filter, conv_bias_act_forward, conv_forward};
pub use conv_transpose::{
    conv_transpose_backward_data, conv_transpose_backward_filter, conv_transpose_forward, ConvTransposeParams,
    ConvTransposePlan,
};
pub use cross_entropy::{
    cross_entropy_backward, cross_entropy_forward, CrossEntropyBackward, CrossEntropyForward, CrossEntropyMean,
    CROSS_ENTROPY_MAX_IGNORE,
};
#[doc(hidden)]
pub use matmul::warm_up_cudnn;
pub use matmul::{matmul, matmul_bias_act};
pub use norm::{norm_forward, NormStats};
pub use norm_train::{norm_backward, norm_train_forward, NormBackward};
pub use optim::{adam_step, AdamOptions, AdamParam};
pub use pool::{pool_backward, pool_forward, PoolParams};
use tensor::check_on_stream_device;

// The families that only NVRTC kernels implement, and the generated (fused) kernels' program
// types: the adapters reach every family through `ops`, and `ops` alone chooses between a
// cuDNN graph and a kernel where a family has both (pooling, convolution, normalization,
// attention, matmul).
/// Compiles the kernels a training step needs on a background thread (see
/// [`crate::kernels::load`]).
#[doc(hidden)]
pub use crate::kernels::load::warm_up_in_background;
pub use crate::kernels::pool as pool2d;
pub use crate::kernels::{ctc, elementwise, fused, fused_reduce, index, linalg, random, reduce, resize, sort};

use std::borrow::Cow;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::graph::{Graph, SignatureContext};
use crate::plan::{execute_keyed, execute_keyed_when_built, prefetch_keyed};

/// Blocks until every kernel and cuDNN plan being built in the background is ready (fused
/// elementwise kernels of lazy fusion, fused plans that new shapes start building): tests and
/// benchmarks call it after a warm-up step, so later steps run fused.
pub fn wait_for_builds() {
    crate::kernels::fused::wait_for_builds();
    crate::plan::wait_for_background_builds();
}

/// The cache key of one op call: op name, every tensor's dims, strides, dtype and pointer
/// alignment, and the op's parameters. Together with the execution context it is the plan
/// signature, so a hit needs no graph at all.
pub(crate) struct OpKey(Vec<u8>);

impl OpKey {
    /// The key's bytes (what identifies the call in caches kept outside the plan cache).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0.clone()
    }

    pub(crate) fn new(op: &'static str) -> Self {
        let mut v = Vec::with_capacity(320);
        v.push(0xA5);
        v.extend_from_slice(op.as_bytes());
        v.push(0);
        Self(v)
    }

    pub(crate) fn tensor(&mut self, t: &TensorRef) -> &mut Self {
        self.0
            .extend_from_slice(&[t.dtype.code(), t.alignment() as u8, t.dims.len() as u8]);
        self.ints(&t.dims).ints(&t.strides)
    }

    pub(crate) fn ints(&mut self, v: &[i64]) -> &mut Self {
        self.0.push(v.len() as u8);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }

    pub(crate) fn act(&mut self, a: Activation) -> &mut Self {
        let (code, param) = a.kernel_code();
        self.0.push(code as u8);
        self.0.extend_from_slice(&param.to_bits().to_le_bytes());
        self
    }

    fn finish(self, ctx: &SignatureContext) -> Vec<u8> {
        let mut v = self.0;
        ctx.append_to(&mut v);
        v
    }
}

/// Executes one op: looks its key up in the plan cache and, on a miss only, builds and
/// validates the graph (graph errors become argument errors of `op`). `io` lists the
/// (uid, device pointer) pairs of the graph's non-virtual tensors in uid order.
fn run(
    stream: &Arc<CudaStream>,
    op: &'static str,
    key: OpKey,
    io: &[(i64, u64)],
    build: &dyn Fn() -> Graph,
) -> Result<()> {
    run_graph(stream, op, key, io, true, build)
}

/// [`run`] for graphs with by-value scalars: their `io` entries are host addresses of the
/// values, read when the work is enqueued, so the execution is never captured for replay.
fn run_with_scalars(
    stream: &Arc<CudaStream>,
    op: &'static str,
    key: OpKey,
    io: &[(i64, u64)],
    build: &dyn Fn() -> Graph,
) -> Result<()> {
    run_graph(stream, op, key, io, false, build)
}

fn run_graph(
    stream: &Arc<CudaStream>,
    op: &'static str,
    key: OpKey,
    io: &[(i64, u64)],
    replayable: bool,
    build: &dyn Fn() -> Graph,
) -> Result<()> {
    let (uids, ptrs) = variant_pack(io);
    execute_keyed(stream, |ctx| key.finish(ctx), &uids, &ptrs, replayable, &|| {
        validated(op, build)
    })
}

/// [`run`] (or, `replayable` false, [`run_with_scalars`]) for a fused graph whose op has an
/// unfused way to run: `Ok(false)` when the plan is still being built in the background and
/// nothing ran (see [`crate::plan::execute_keyed_when_built`]).
fn run_when_built(
    stream: &Arc<CudaStream>,
    op: &'static str,
    key: OpKey,
    io: &[(i64, u64)],
    replayable: bool,
    build: &dyn Fn() -> Graph,
) -> Result<bool> {
    let (uids, ptrs) = variant_pack(io);
    execute_keyed_when_built(stream, |ctx| key.finish(ctx), &uids, &ptrs, replayable, &|| {
        validated(op, build)
    })
}

/// Starts building, in the background, the plan of a graph the caller will run soon with
/// the same key (see [`crate::plan::prefetch_keyed`]).
fn prefetch(stream: &Arc<CudaStream>, op: &'static str, key: OpKey, build: &dyn Fn() -> Graph) -> Result<()> {
    prefetch_keyed(stream, |ctx| key.finish(ctx), &|| validated(op, build))
}

/// The uids and pointers of a variant pack given as `(uid, address)` pairs.
fn variant_pack(io: &[(i64, u64)]) -> (Vec<i64>, Vec<*mut c_void>) {
    (
        io.iter().map(|&(u, _)| u).collect(),
        io.iter().map(|&(_, p)| p as *mut c_void).collect(),
    )
}

/// `build()` validated, its errors reported as invalid arguments of `op`.
fn validated<'g>(op: &'static str, build: &dyn Fn() -> Graph) -> Result<Cow<'g, Graph>> {
    let mut g = build();
    g.validate().map_err(|e| match e {
        Error::InvalidGraph(msg) => Error::invalid_arg(op, "tensors", msg),
        other => other,
    })?;
    Ok(Cow::Owned(g))
}

/// Zero-fills an output whose op has an empty reduction (e.g. a batch of 0 in wgrad).
fn zero_fill(stream: &Arc<CudaStream>, t: &TensorMut) -> Result<()> {
    let bytes = t.extent_elements() as usize * t.dtype.size();
    crate::ffi::launch::memset_zero(stream, t.address(), bytes)
}
