//! The Burn device: a CUDA device ordinal, opened lazily through [`runtime::Device`].

use std::sync::Arc;

use burn_backend::{DeviceId, DeviceOps};

use crate::error::Result;
use crate::runtime;

/// Burn's `type_id` for devices of this backend.
pub const DEVICE_TYPE_ID: u16 = 0x0C0D;

/// A CUDA GPU for the [`Cudnn`](super::Cudnn) backend. `Default` is GPU 0.
///
/// Creating one never fails; the device is opened by the first tensor operation, which
/// panics with the engine's error (no driver, no GPU, no such ordinal) when it cannot be.
/// Call [`CudnnDevice::try_open`] to check first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CudnnDevice {
    /// CUDA device ordinal.
    pub index: u16,
}

impl CudnnDevice {
    /// GPU `index` (CUDA ordinal).
    pub fn new(index: usize) -> Self {
        Self { index: index as u16 }
    }

    /// Opens the device, or returns why it cannot be opened (no driver, no GPU, ...).
    pub fn try_open(&self) -> Result<Arc<runtime::Device>> {
        let dev = runtime::Device::new(self.index as usize)?;
        super::memory::prepare_device(&dev)?;
        Ok(dev)
    }

    /// Opens the device, or returns the engine's error in the context
    /// `cannot open CUDA device <index>`.
    pub(crate) fn open(&self) -> Result<Arc<runtime::Device>> {
        self.try_open()
            .map_err(|e| e.in_op(&format!("cannot open CUDA device {}", self.index)))
    }
}

impl burn_backend::Device for CudnnDevice {
    fn from_id(device_id: DeviceId) -> Self {
        Self {
            index: device_id.index_id,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: DEVICE_TYPE_ID,
            index_id: self.index,
        }
    }
}

impl DeviceOps for CudnnDevice {}
