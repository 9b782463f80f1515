//! NVRTC compilation of one kernel (or of a whole source that still uses `extern "C"`) straight
//! to a CUBIN for the device's architecture, so the driver has nothing to JIT at load. PTX only
//! when the device is newer than every architecture the loaded NVRTC knows.

use std::sync::OnceLock;

use cudnn_backend_kernels as kernel_sources;

use super::KernelSource;
use crate::error::Result;
use crate::ffi::nvrtc::{self, Output};

/// `kernels/prelude.cuh`: the `KERNEL` macro, prepended to every source.
pub(crate) const PRELUDE: &str = kernel_sources::PRELUDE;

/// The full translation unit of `source`: prelude, then `common.cuh` when it asks, then its code.
pub(crate) fn full_source(source: KernelSource) -> String {
    let common = if source.common { super::COMMON } else { "" };
    format!("{PRELUDE}\n{common}\n{}", source.code)
}

/// Whether `source` follows the `KERNEL` convention (compiled one kernel at a time); a source
/// with `extern "C"` anywhere is compiled whole and its kernels are loaded by their plain names.
pub(crate) fn per_kernel(source: KernelSource) -> bool {
    !source.code.contains("extern \"C\"")
}

/// The name expression that instantiates kernel `name` (see `kernels/prelude.cuh`).
pub(crate) fn name_expression(name: &str) -> String {
    format!("{name}<0>")
}

/// What NVRTC is asked to produce for one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Target {
    /// CUBIN (the normal case) or PTX (fallback).
    pub output: Output,
    /// `10 * major + minor` of the architecture compiled for.
    pub arch: u32,
}

impl Target {
    /// The target for a device of compute capability `cc`, given the real architectures the
    /// loaded NVRTC supports (`nvrtcGetSupportedArchs`): a CUBIN for the device's own
    /// architecture when NVRTC knows it; PTX for the newest known architecture below the
    /// device when the device is newer than NVRTC (the driver JIT-compiles it, once); a CUBIN
    /// for the device's architecture otherwise (NVRTC then reports why it cannot).
    pub(crate) fn for_device(cc: (u32, u32), supported: &[i32]) -> Target {
        let want = cc.0 * 10 + cc.1;
        if supported.iter().any(|&a| a as u32 == want) {
            return Target {
                output: Output::Cubin,
                arch: want,
            };
        }
        match supported.iter().map(|&a| a as u32).filter(|&a| a < want).max() {
            Some(below) => Target {
                output: Output::Ptx,
                arch: below,
            },
            None => Target {
                output: Output::Cubin,
                arch: want,
            },
        }
    }

    /// The NVRTC options for this target.
    pub(crate) fn options(&self) -> Vec<String> {
        let kind = match self.output {
            Output::Cubin => "sm",
            Output::Ptx => "compute",
        };
        vec![format!("--gpu-architecture={kind}_{}", self.arch)]
    }

    /// E.g. `sm_90` or `compute_120` (for logs and the cache key).
    pub(crate) fn label(&self) -> String {
        match self.output {
            Output::Cubin => format!("sm_{}", self.arch),
            Output::Ptx => format!("compute_{}", self.arch),
        }
    }
}

/// The loaded NVRTC's version and supported architectures (queried once per process).
pub(crate) fn nvrtc_info() -> Result<((i32, i32), &'static [i32])> {
    static INFO: OnceLock<((i32, i32), Vec<i32>)> = OnceLock::new();
    if let Some((v, a)) = INFO.get() {
        return Ok((*v, a));
    }
    let info = (nvrtc::version()?, nvrtc::supported_archs()?);
    let (v, a) = INFO.get_or_init(|| info);
    Ok((*v, a))
}

/// A compiled unit: the image and the symbol to load.
#[derive(Debug)]
pub(crate) struct Image {
    /// CUBIN or PTX bytes.
    pub bytes: Vec<u8>,
    /// The kernel's lowered (mangled) name; empty for a whole-source unit.
    pub symbol: String,
}

/// Compiles `kernel` of `source` (or all of `source` when `kernel` is `None`) for `target`.
pub(crate) fn compile(source: KernelSource, kernel: Option<&str>, target: Target) -> Result<Image> {
    let exprs: Vec<String> = kernel.map(name_expression).into_iter().collect();
    let out = nvrtc::compile(
        &full_source(source),
        source.name,
        &exprs,
        &target.options(),
        target.output,
    )?;
    Ok(Image {
        bytes: out.image,
        symbol: out.lowered.into_iter().next().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_prefers_cubin_and_falls_back_to_ptx() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        let t = Target::for_device((9, 0), &archs);
        assert_eq!((t.output, t.arch, t.label()), (Output::Cubin, 90, "sm_90".to_string()));
        assert_eq!(t.options(), ["--gpu-architecture=sm_90"]);
        // Newer than NVRTC: PTX for the newest architecture below, JIT-compiled by the driver.
        let t = Target::for_device((12, 1), &archs);
        assert_eq!((t.output, t.arch), (Output::Ptx, 120));
        assert_eq!(t.options(), ["--gpu-architecture=compute_120"]);
        // Older than NVRTC: ask for the device's own architecture (NVRTC says why it cannot).
        let t = Target::for_device((7, 0), &archs);
        assert_eq!((t.output, t.arch), (Output::Cubin, 70));
    }

    #[test]
    fn every_source_follows_the_kernel_convention() {
        for s in super::super::ALL_SOURCES {
            assert!(
                per_kernel(*s),
                "{} still declares extern \"C\" kernels: convert it to the KERNEL convention \
                 (sed -i 's/extern \"C\" __global__/KERNEL/' kernels/{}; see kernels/prelude.cuh)",
                s.name,
                s.name
            );
            assert!(s.code.contains("KERNEL void"), "{} declares no KERNEL", s.name);
        }
        assert!(!per_kernel(KernelSource {
            name: "legacy.cu",
            code: "extern \"C\" __global__ void k() {}",
            common: false,
        }));
        let full = full_source(super::super::BIAS_ACT);
        assert!(full.starts_with(PRELUDE) && full.ends_with(super::super::BIAS_ACT.code));
        assert_eq!(name_expression("binary_f32"), "binary_f32<0>");
    }
}
