//! The Burn 0.21 backend (feature `burn`): [`Cudnn`].
//!
//! ```no_run
//! use burn_backend::Backend;
//! use cudnn_backend::burn::{Cudnn, CudnnDevice};
//! let device = CudnnDevice::default(); // GPU 0
//! assert!(Cudnn::name(&device).starts_with("cudnn"));
//! ```
//!
//! Convolutions (1-D/2-D/3-D, transposed, and their backward passes), pooling and matmuls
//! run as cuDNN graphs through [`crate::ops`] (handle pool, plan cache); every other op
//! runs in the NVRTC kernel families `ops` also holds. Ops enqueue on the device's stream
//! and never wait; [`Backend::sync`] and reading data wait.

mod buffer_cache;
pub(crate) mod data;
mod device;
#[cfg(feature = "distributed")]
pub mod distributed;

#[cfg(feature = "distributed")]
pub(crate) use burn_backend::distributed::DistributedBackend as AutodiffInner;
/// The bound `Autodiff<B>` puts on its inner backend: `Backend`, or `DistributedBackend`
/// under burn-autodiff's `distributed` feature (which this crate's `distributed` turns on).
#[cfg(not(feature = "distributed"))]
pub(crate) use burn_backend::Backend as AutodiffInner;
pub(crate) mod exec;
pub mod fusion;
pub(crate) mod layers;
pub(crate) mod layout;
pub(crate) mod math;
mod memory;
pub mod nn;
mod ops;
pub mod optim;
pub mod process_group;
mod random;
mod route;
mod shared_state;
pub(crate) mod structure;
mod tensor;
mod training;

use burn_backend::{Backend, BackendTypes, BoolStore, DType, DTypeUsage, DTypeUsageSet, ExecutionError};

pub use device::{CudnnDevice, DEVICE_TYPE_ID};
pub use fusion::CudnnFusion;
pub use tensor::{CudnnQTensor, CudnnTensor};
pub use training::{BatchNormOutput, TrainingOps};

/// The adapter's state (its modules reach their part through [`state`]).
static STATE: shared_state::BurnState = shared_state::BurnState::new();

/// The Burn adapter's state: buffers, per-device set-up, flushers, the generator.
pub(crate) fn state() -> &'static shared_state::BurnState {
    &STATE
}

/// The cuDNN backend for Burn: `type B = burn::backend::Autodiff<Cudnn>;`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cudnn;

impl BackendTypes for Cudnn {
    type Device = CudnnDevice;
    type FloatTensorPrimitive = CudnnTensor;
    type FloatElem = f32;
    type IntTensorPrimitive = CudnnTensor;
    type IntElem = i64;
    type BoolTensorPrimitive = CudnnTensor;
    type BoolElem = bool;
    type QuantizedTensorPrimitive = CudnnQTensor;
}

impl Backend for Cudnn {
    fn name(device: &Self::Device) -> String {
        format!("cudnn<gpu:{}>", device.index)
    }

    fn seed(_device: &Self::Device, seed: u64) {
        random::seed(seed);
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        let dev = device
            .try_open()
            .map_err(|e| ExecutionError::WithContext { reason: e.to_string() })?;
        dev.synchronize().map_err(|e| ExecutionError::WithContext {
            reason: format!("cudnn-backend: synchronizing GPU {}: {e}", device.index),
        })
    }

    fn memory_cleanup(device: &Self::Device) {
        if let Ok(dev) = device.try_open() {
            if let Err(e) = memory::release_cached_memory(&dev) {
                tracing::warn!("cudnn-backend: releasing cached memory of GPU {}: {e}", device.index);
            }
        }
    }

    fn dtype_usage(_device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => DTypeUsage::general() | DTypeUsage::Accelerated,
            DType::Flex32 | DType::F64 | DType::I64 | DType::I32 | DType::I8 | DType::U8 => DTypeUsage::general(),
            DType::Bool(BoolStore::Native | BoolStore::U8) => DTypeUsage::general(),
            DType::QFloat(scheme) if ops::qtensor::supports_scheme(&scheme) => DTypeUsage::general(),
            _ => DTypeUsageSet::empty(),
        }
    }

    fn device_count(type_id: u16) -> usize {
        if type_id != DEVICE_TYPE_ID {
            return 0;
        }
        crate::runtime::device_count().unwrap_or(0)
    }
}
