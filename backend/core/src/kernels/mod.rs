//! CUDA C kernels for what cuDNN does not cover, compiled by NVRTC at first use (the sources
//! live in the `cudnn-backend-kernels` crate, the repository's `kernels/` folder, which
//! embeds them as strings).
//!
//! # Loading
//!
//! `kernels::function` (crate-internal) returns a kernel by its plain name (`"binary_f32"`). The first request in a
//! process reads the kernel's CUBIN from the on-disk cache ([`crate::runtime::disk_cache`], on by default in the
//! user's cache directory, `CUDNN_BACKEND_KERNEL_CACHE` moves or disables it) or compiles it
//! with NVRTC straight to a CUBIN for the device's architecture (`compile.rs`; PTX only when the
//! GPU is newer than the NVRTC found), one kernel at a time, and loads it with
//! `cuModuleLoadData`: the driver JIT-compiles nothing. Kernels that usually run together
//! compile in parallel (`warm.rs`); later requests are one map lookup. [`compile_stats`] counts
//! compiles, disk hits and time.
//!
//! # Kernel convention (for new `.cu` files)
//!
//! * Every source gets `kernels/prelude.cuh` prepended, then `kernels/common.cuh` when its
//!   `KernelSource::common` is set.
//! * Declare entry points `KERNEL void name(...)` (the prelude's macro for
//!   `template <int = 0> __global__`), not `extern "C" __global__ void name(...)`; macros that
//!   stamp out one kernel per dtype work unchanged. The loader instantiates only the requested
//!   kernel (NVRTC name expression `name<0>`) and maps the plain name to the mangled symbol.
//! * Entry-point names are unique within their source (no overloads).
//! * A source that still contains `extern "C"` keeps working: it is compiled whole, once per
//!   device, and its kernels are loaded by their plain names (slower on a fresh machine).
//! * Add the new `KernelSource` to `ALL_SOURCES` below so the NVRTC-only tests compile it.
//! * Kernels of a new source that run in most training steps may be listed in a group of
//!   `warm.rs`, so they compile alongside their neighbours.

use cudarc::driver::CudaFunction;
use cudnn_backend_kernels as kernel_sources;

pub(crate) mod compile;
// Hidden, so its docs may link to private modules.
#[doc(hidden)]
#[allow(rustdoc::private_intra_doc_links)]
pub mod load;
pub(crate) mod warm;

pub use load::{compile_stats, wait_for_background_compiles, CompileStats};
pub(crate) use load::{function, prefetch};

pub(crate) mod batch_norm;
pub(crate) mod check;
pub mod conv;
pub(crate) mod cross_entropy;
pub mod ctc;
pub mod elementwise;
pub(crate) mod emit;
pub mod fused;
pub mod fused_reduce;
pub mod index;
pub(crate) mod layout;
pub mod linalg;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod resize;
pub mod sort;

use crate::error::Result;
use crate::runtime::Device;

/// The `tracing` target of the generated kernels' launch events (debug level): one event per
/// fused element-wise or fused reduction launch, with its program's size, iteration shape,
/// vector width and grid, in launch order. A profiler's per-kernel rows of the same run can be
/// matched to them (`bench/kernel_table.py`).
pub const LAUNCH_LOG_TARGET: &str = "cudnn_backend::launch";

/// The first `rank` values of a kernel layout's shape or strides, as launch events print them.
fn dims(values: &[i64], rank: usize) -> &[i64] {
    &values[..rank.min(values.len())]
}

/// The kernels' part of the [`Engine`](crate::Engine): the loader (loaded modules,
/// disk cache, compile pool and counters) and the sources generated for fused programs with
/// their background builds.
pub(crate) struct KernelState {
    loader: load::Loader,
    fused_sources: std::sync::OnceLock<std::sync::Mutex<fused::Sources>>,
    fused_builds: std::sync::OnceLock<(std::sync::Mutex<fused::Builds>, std::sync::Condvar)>,
    reduce_sources:
        std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<fused_reduce::ReduceProgram, KernelSource>>>,
}

impl KernelState {
    pub(crate) const fn new() -> Self {
        KernelState {
            loader: load::Loader::new(),
            fused_sources: std::sync::OnceLock::new(),
            fused_builds: std::sync::OnceLock::new(),
            reduce_sources: std::sync::OnceLock::new(),
        }
    }
}

fn state() -> &'static KernelState {
    &crate::engine().kernels
}

/// One kernel source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelSource {
    /// File name, e.g. `elementwise.cu` (identifies the source in the loader's maps).
    pub name: &'static str,
    /// The CUDA C++ text.
    pub code: &'static str,
    /// Whether `kernels/common.cuh` is prepended.
    pub common: bool,
}

/// Shared CUDA definitions (layouts, f16/bf16 conversions).
pub(crate) const COMMON: &str = kernel_sources::COMMON;

/// Bias add + activation, in place.
pub(crate) const BIAS_ACT: KernelSource = KernelSource {
    name: "bias_act.cu",
    code: kernel_sources::BIAS_ACT,
    common: false,
};

/// [`function`] on the device of `stream`.
pub(crate) fn stream_function(
    stream: &cudarc::driver::CudaStream,
    source: KernelSource,
    name: &'static str,
) -> Result<CudaFunction> {
    function(&*Device::new(stream.context().ordinal())?, source, name)
}

/// Several kernels of `source` on the device of `stream`, the missing ones built in parallel
/// (for ops that launch more than one kernel).
pub(crate) fn stream_functions<const N: usize>(
    stream: &cudarc::driver::CudaStream,
    source: KernelSource,
    names: [&'static str; N],
) -> Result<[CudaFunction; N]> {
    let dev = Device::new(stream.context().ordinal())?;
    prefetch(&dev, &names.map(|n| (source, n)))?;
    let mut out = Vec::with_capacity(N);
    for n in names {
        out.push(function(&dev, source, n)?);
    }
    out.try_into().map_err(|_| crate::Error::Cuda {
        op: "loading kernels",
        message: "kernel count mismatch".into(),
    })
}

/// Fill, copy/cast, unary, binary, compare and where on strided views.
pub(crate) const ELEMENTWISE: KernelSource = KernelSource {
    name: "elementwise.cu",
    code: kernel_sources::ELEMENTWISE,
    common: true,
};

/// Op codes and per-op math of the elementwise kernels (the head of [`ELEMENTWISE`]); the
/// generated fused kernels are built on it.
pub(crate) const ELEMENTWISE_MATH: &str = kernel_sources::ELEMENTWISE_MATH;

/// Reductions, arg-reductions and scans along one axis.
pub(crate) const REDUCE: KernelSource = KernelSource {
    name: "reduce.cu",
    code: kernel_sources::REDUCE,
    common: true,
};

/// Gather, scatter-add, index-select and index-add along one axis.
pub(crate) const INDEX: KernelSource = KernelSource {
    name: "index.cu",
    code: kernel_sources::INDEX,
    common: true,
};

/// Philox4x32-10 uniform, normal, bernoulli and uniform_int on strided outputs.
pub(crate) const RANDOM: KernelSource = KernelSource {
    name: "random.cu",
    code: kernel_sources::RANDOM,
    common: true,
};

/// Stable bitonic sort of rows along one axis (values and/or i64 indices).
pub(crate) const SORT: KernelSource = KernelSource {
    name: "sort.cu",
    code: kernel_sources::SORT,
    common: true,
};

/// 2-D max (with indices), average and adaptive average pooling, forward and backward.
pub(crate) const POOL: KernelSource = KernelSource {
    name: "pool.cu",
    code: kernel_sources::POOL,
    common: true,
};

/// Nearest, bilinear and bicubic interpolation (forward and backward) and bilinear grid
/// sampling.
pub(crate) const RESIZE: KernelSource = KernelSource {
    name: "resize.cu",
    code: kernel_sources::RESIZE,
    common: true,
};

/// Integer matmul, 3-vector cross product, symmetric int8 quantize / dequantize.
pub(crate) const LINALG: KernelSource = KernelSource {
    name: "linalg.cu",
    code: kernel_sources::LINALG,
    common: true,
};

/// Batch normalization: training statistics, inference, backward (with residual + ReLU).
pub(crate) const BATCH_NORM: KernelSource = KernelSource {
    name: "batch_norm.cu",
    code: kernel_sources::BATCH_NORM,
    common: true,
};

/// Multi-tensor fused optimizer steps (Adam / AdamW).
pub(crate) const OPTIM: KernelSource = KernelSource {
    name: "optim.cu",
    code: kernel_sources::OPTIM,
    common: true,
};

/// Layer and RMS norm training forward (with row statistics) and backward.
pub(crate) const NORM: KernelSource = KernelSource {
    name: "norm.cu",
    code: kernel_sources::NORM,
    common: true,
};

/// The row softmax of attention's f32 math path (forward and backward).
pub(crate) const ATTENTION: KernelSource = KernelSource {
    name: "attention.cu",
    code: kernel_sources::ATTENTION,
    common: true,
};

/// CTC loss recursions and gradient.
pub(crate) const CTC: KernelSource = KernelSource {
    name: "ctc.cu",
    code: kernel_sources::CTC,
    common: true,
};

/// Cross-entropy over logits rows: one-pass forward and logits gradient, and the mean.
pub(crate) const CROSS_ENTROPY: KernelSource = KernelSource {
    name: "cross_entropy.cu",
    code: kernel_sources::CROSS_ENTROPY,
    common: true,
};

/// Direct convolution forward, backward data and backward filter (exact fallbacks for
/// convolutions no cuDNN engine runs).
pub(crate) const CONV: KernelSource = KernelSource {
    name: "conv.cu",
    code: kernel_sources::CONV,
    common: true,
};

/// Every kernel source, for the compile checks.
#[cfg(test)]
pub(crate) const ALL_SOURCES: &[KernelSource] = &[
    BIAS_ACT,
    ELEMENTWISE,
    REDUCE,
    INDEX,
    RANDOM,
    SORT,
    POOL,
    RESIZE,
    LINALG,
    BATCH_NORM,
    OPTIM,
    NORM,
    ATTENTION,
    CTC,
    CONV,
    CROSS_ENTROPY,
];

#[cfg(test)]
mod nvrtc_tests;

/// The op, argument and reason of an `Error::InvalidArgument` (the kernel modules' tests
/// check that every rejected call names them); panics on anything else.
#[cfg(test)]
pub(crate) fn invalid_argument(r: Result<impl std::fmt::Debug>) -> (&'static str, &'static str, String) {
    match r {
        Err(crate::error::Error::InvalidArgument { op, arg, reason }) => (op, arg, reason),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
