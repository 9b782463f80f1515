//! The cuDNN handle kind: each pooled handle owns its plan LRU (plans are never shared
//! between threads; they travel with their handle back to the pool).

use super::cache::{PlanLru, DEFAULT_PLAN_CACHE_CAPACITY};
use super::engine::BuiltPlan;
use crate::error::{Error, Result};
use crate::ffi::CudnnHandle;
use crate::handle::{DeviceThreadHandlePool, HandleKind};
use crate::runtime::Device;

/// Creates cuDNN handles on a device's primary context and binds streams to them.
#[derive(Debug, Default)]
pub struct CudnnKind;

/// A pooled cuDNN handle with the plans built on it.
pub struct PooledCudnn {
    pub(crate) handle: CudnnHandle,
    pub(crate) plans: PlanLru<BuiltPlan>,
    /// A stream only this handle uses, for capturing repeated executions as CUDA graphs
    /// (created on first need).
    pub(crate) capture_stream: Option<std::sync::Arc<cudarc::driver::CudaStream>>,
}

impl std::fmt::Debug for PooledCudnn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledCudnn({} plans)", self.plans.len())
    }
}

impl HandleKind for CudnnKind {
    type Handle = PooledCudnn;
    type Stream = usize;
    type Error = Error;

    fn create(&self, device: usize) -> Result<PooledCudnn> {
        let dev = Device::new(device)?;
        dev.context().bind_to_thread()?;
        let handle = CudnnHandle::create()?;
        Ok(PooledCudnn {
            capture_stream: None,
            handle,
            plans: PlanLru::new(
                crate::config::config()
                    .plan_cache_capacity
                    .unwrap_or(DEFAULT_PLAN_CACHE_CAPACITY),
                super::cache_stats().clone(),
            ),
        })
    }

    fn bind_stream(&self, h: &mut PooledCudnn, stream: usize) -> Result<()> {
        h.handle.set_stream(stream as *mut std::ffi::c_void)
    }
}

/// The engine's cuDNN handle pool.
pub fn cudnn_pool() -> &'static DeviceThreadHandlePool<CudnnKind> {
    super::state()
        .handles
        .get_or_init(|| DeviceThreadHandlePool::new(CudnnKind))
}
