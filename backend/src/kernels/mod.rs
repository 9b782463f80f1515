//! CUDA C kernels for what cuDNN does not cover, compiled by NVRTC once per device
//! (the sources live in the repository's `kernels/` folder and are embedded with
//! `include_str!`; `kernels/common.cuh` is prepended to every source that asks for it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

pub(crate) mod check;
pub mod elementwise;
pub mod index;
pub(crate) mod layout;
pub mod linalg;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod resize;
pub mod sort;

use crate::error::{Error, Result};
use crate::runtime::{check_nvrtc, Device};

/// One kernel source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelSource {
    pub name: &'static str,
    pub code: &'static str,
    /// Whether `kernels/common.cuh` is prepended.
    pub common: bool,
}

/// Shared CUDA definitions (layouts, f16/bf16 conversions).
pub(crate) const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// Bias add + activation, in place.
pub(crate) const BIAS_ACT: KernelSource = KernelSource {
    name: "bias_act.cu",
    code: include_str!("../../../kernels/bias_act.cu"),
    common: false,
};

type ModuleKey = (usize, &'static str);

fn modules() -> &'static Mutex<HashMap<ModuleKey, Arc<CudaModule>>> {
    static MODULES: OnceLock<Mutex<HashMap<ModuleKey, Arc<CudaModule>>>> = OnceLock::new();
    MODULES.get_or_init(Default::default)
}

fn arch(dev: &Device) -> &'static str {
    static ARCHS: OnceLock<Mutex<HashMap<(u32, u32), &'static str>>> = OnceLock::new();
    let cc = dev.info().compute_capability;
    let mut map = ARCHS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    map.entry(cc)
        .or_insert_with(|| Box::leak(format!("sm_{}{}", cc.0, cc.1).into_boxed_str()))
}

/// [`function`] on the device of `stream`.
pub(crate) fn stream_function(
    stream: &cudarc::driver::CudaStream,
    source: KernelSource,
    name: &'static str,
) -> Result<CudaFunction> {
    function(&*Device::new(stream.context().ordinal())?, source, name)
}

/// Loads `function` from `source`, compiling the source for `dev` on first use.
pub(crate) fn function(dev: &Device, source: KernelSource, function: &'static str) -> Result<CudaFunction> {
    type FunctionKey = (usize, &'static str, &'static str);
    static FUNCTIONS: OnceLock<Mutex<HashMap<FunctionKey, CudaFunction>>> = OnceLock::new();
    let functions = FUNCTIONS.get_or_init(Default::default);
    if let Some(f) = functions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(dev.ordinal(), source.name, function))
    {
        return Ok(f.clone());
    }
    let key = (dev.ordinal(), source.name);
    let mut map = modules().lock().unwrap_or_else(|e| e.into_inner());
    let module = match map.get(&key) {
        Some(m) => m.clone(),
        None => {
            check_nvrtc()?;
            let ptx = compile(source, arch(dev))?;
            let m = dev.context().load_module(ptx)?;
            map.insert(key, m.clone());
            m
        }
    };
    let f = module.load_function(function)?;
    functions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((dev.ordinal(), source.name, function), f.clone());
    Ok(f)
}

/// Fill, copy/cast, unary, binary, compare and where on strided views.
pub(crate) const ELEMENTWISE: KernelSource = KernelSource {
    name: "elementwise.cu",
    code: include_str!("../../../kernels/elementwise.cu"),
    common: true,
};

/// Reductions, arg-reductions and scans along one axis.
pub(crate) const REDUCE: KernelSource = KernelSource {
    name: "reduce.cu",
    code: include_str!("../../../kernels/reduce.cu"),
    common: true,
};

/// Gather, scatter-add, index-select and index-add along one axis.
pub(crate) const INDEX: KernelSource = KernelSource {
    name: "index.cu",
    code: include_str!("../../../kernels/index.cu"),
    common: true,
};

/// Philox4x32-10 uniform, normal, bernoulli and uniform_int on strided outputs.
pub(crate) const RANDOM: KernelSource = KernelSource {
    name: "random.cu",
    code: include_str!("../../../kernels/random.cu"),
    common: true,
};

/// Stable bitonic sort of rows along one axis (values and/or i64 indices).
pub(crate) const SORT: KernelSource = KernelSource {
    name: "sort.cu",
    code: include_str!("../../../kernels/sort.cu"),
    common: true,
};

/// 2-D max (with indices), average and adaptive average pooling, forward and backward.
pub(crate) const POOL: KernelSource = KernelSource {
    name: "pool.cu",
    code: include_str!("../../../kernels/pool.cu"),
    common: true,
};

/// Nearest, bilinear and bicubic interpolation (forward and backward) and bilinear grid
/// sampling.
pub(crate) const RESIZE: KernelSource = KernelSource {
    name: "resize.cu",
    code: include_str!("../../../kernels/resize.cu"),
    common: true,
};

/// Integer matmul, 3-vector cross product, symmetric int8 quantize / dequantize.
pub(crate) const LINALG: KernelSource = KernelSource {
    name: "linalg.cu",
    code: include_str!("../../../kernels/linalg.cu"),
    common: true,
};

/// Batch normalization: training statistics, inference, backward (with residual + ReLU).
pub(crate) const BATCH_NORM: KernelSource = KernelSource {
    name: "batch_norm.cu",
    code: include_str!("../../../kernels/batch_norm.cu"),
    common: true,
};

/// Multi-tensor fused optimizer steps (Adam / AdamW).
pub(crate) const OPTIM: KernelSource = KernelSource {
    name: "optim.cu",
    code: include_str!("../../../kernels/optim.cu"),
    common: true,
};

/// Every kernel source, for the compile check.
#[cfg(test)]
const ALL_SOURCES: &[KernelSource] = &[
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
];

/// Compiles `source` (with `common.cuh` when it asks) to PTX for `arch` (e.g. `sm_90`).
fn compile(source: KernelSource, arch: &'static str) -> Result<cudarc::nvrtc::Ptx> {
    let code = if source.common {
        format!("{COMMON}\n{}", source.code)
    } else {
        source.code.to_string()
    };
    let opts = CompileOptions {
        arch: Some(arch),
        name: Some(source.name.to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(code, opts).map_err(|e| Error::Nvrtc {
        kernel: source.name,
        log: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs only libnvrtc (no GPU): every source must compile for Hopper.
    #[test]
    #[ignore = "needs libnvrtc on the loader path"]
    fn every_kernel_source_compiles() {
        check_nvrtc().expect("libnvrtc");
        let failures: Vec<String> = ALL_SOURCES
            .iter()
            .filter_map(|s| compile(*s, "sm_90").err().map(|e| e.to_string()))
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
