//! Probing the shared libraries before any `cudarc` call (which would panic on a missing
//! library), so a machine without a GPU, a driver or cuDNN gets a clear [`Error`].

use crate::error::{Error, Result};
pub use crate::ffi::{check_driver, check_nvrtc};

/// The loaded cuDNN's version number (e.g. 91400 for 9.14.0).
pub fn cudnn_version() -> Result<usize> {
    crate::ffi::cudnn_version()
}

/// Number of CUDA devices; an error when the driver is missing or sees none.
pub fn device_count() -> Result<usize> {
    check_driver()?;
    let n = cudarc::driver::CudaContext::device_count()
        .map_err(|e| Error::NoDevice(format!("cuInit/cuDeviceGetCount failed: {e}")))?;
    if n <= 0 {
        return Err(Error::NoDevice("the NVIDIA driver loaded but reports 0 devices".into()));
    }
    Ok(n as usize)
}

/// What the run-time found, for diagnostics (`quickstart` prints it).
#[derive(Debug, Clone)]
pub struct RuntimeReport {
    /// libcuda as loaded, or the error.
    pub driver: std::result::Result<String, String>,
    /// Number of devices, or the error.
    pub devices: std::result::Result<usize, String>,
    /// cuDNN version and path, or the error.
    pub cudnn: std::result::Result<(usize, String), String>,
    /// libnvrtc as loaded, or the error.
    pub nvrtc: std::result::Result<String, String>,
}

/// Probes everything without failing.
pub fn report() -> RuntimeReport {
    RuntimeReport {
        driver: check_driver().map_err(|e| e.to_string()),
        devices: match check_driver() {
            Ok(_) => device_count().map_err(|e| e.to_string()),
            Err(_) => Err("no driver (see above)".into()),
        },
        cudnn: crate::ffi::api()
            .map(|a| (a.version, a.path.clone()))
            .map_err(|e| e.to_string()),
        nvrtc: check_nvrtc().map_err(|e| e.to_string()),
    }
}

impl std::fmt::Display for RuntimeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |r: &std::result::Result<String, String>| match r {
            Ok(s) => s.clone(),
            Err(e) => format!("unavailable: {e}"),
        };
        writeln!(f, "CUDA driver : {}", show(&self.driver))?;
        writeln!(
            f,
            "devices     : {}",
            show(&self.devices.clone().map(|n| n.to_string()))
        )?;
        writeln!(
            f,
            "cuDNN       : {}",
            show(
                &self
                    .cudnn
                    .clone()
                    .map(|(v, p)| format!("{}.{}.{} ({p})", v / 10000, v / 100 % 100, v % 100))
            )
        )?;
        write!(f, "NVRTC       : {}", show(&self.nvrtc))
    }
}
