//! A CUDA device: its primary context, default stream and properties.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaStream};

use super::probe::{check_driver, device_count};
use crate::error::{Error, Result};

/// Static facts about a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Total device memory in bytes.
    pub total_memory: usize,
}

/// A CUDA device opened through its primary context. Cheap to clone (`Arc`); one per ordinal.
#[derive(Debug)]
pub struct Device {
    ordinal: usize,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    pub(crate) tuning_loaded: OnceLock<()>,
}

/// Most devices one process may open (ordinals 0..MAX_DEVICES).
pub const MAX_DEVICES: usize = 64;

static DEVICES: [OnceLock<Arc<Device>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
static OPEN_LOCK: Mutex<()> = Mutex::new(());

impl Device {
    /// Opens device `ordinal` (cached: later calls return the same `Arc`).
    /// Fails with a clear [`Error`] when there is no driver, no device, or no such ordinal.
    ///
    /// ```no_run
    /// use cudnn_backend_core::Device;
    ///
    /// match Device::new(0) {
    ///     Ok(device) => {
    ///         let (major, minor) = device.info().compute_capability;
    ///         println!("{} (sm_{major}{minor})", device.info().name);
    ///     }
    ///     // Says what was searched (driver, cuDNN, NVRTC) and what to install.
    ///     Err(e) => eprintln!("no GPU: {e}"),
    /// }
    /// ```
    pub fn new(ordinal: usize) -> Result<Arc<Device>> {
        if let Some(d) = DEVICES.get(ordinal).and_then(|slot| slot.get()) {
            return Ok(d.clone());
        }
        let _open = OPEN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        super::build_trace::start_clock();
        // Builds may run in the background from here on: the process waits for them at exit.
        crate::ffi::nvrtc::arm_main_thread_exit_wait();
        if let Some(d) = DEVICES.get(ordinal).and_then(|slot| slot.get()) {
            return Ok(d.clone());
        }
        check_driver()?;
        let count = device_count()?;
        if ordinal >= count || ordinal >= MAX_DEVICES {
            return Err(Error::NoDevice(format!(
                "device {ordinal} requested but only {count} present"
            )));
        }
        let context = CudaContext::new(ordinal)
            .map_err(|e| Error::NoDevice(format!("creating a context on device {ordinal}: {e}")))?;
        let (major, minor) = context.compute_capability()?;
        let info = DeviceInfo {
            name: context.name()?,
            compute_capability: (major as u32, minor as u32),
            sm_count: context.attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            total_memory: context.total_mem()?,
        };
        // A dedicated stream (not the legacy default stream): it can be captured into CUDA
        // graphs and does not serialize with unrelated work on the null stream.
        let stream = context.new_stream()?;
        let dev = Arc::new(Device {
            ordinal,
            context,
            stream,
            info,
            tuning_loaded: OnceLock::new(),
        });
        Ok(DEVICES[ordinal].get_or_init(|| dev).clone())
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The device's own stream (created by the crate, non-blocking), used when the caller
    /// passes none.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Device properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Blocks until all work on the default stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(Error::from)
    }
}
