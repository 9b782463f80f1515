//! Thread-pooled handles: the generic [`pool::DeviceThreadHandlePool`] and the cuDNN kind
//! whose handles carry their own plan cache.

mod cudnn;
pub mod pool;

pub use cudnn::{cudnn_pool, CudnnKind, PooledCudnn, PLAN_CACHE_CAPACITY_ENV};
pub use pool::{DeviceThreadHandlePool, HandleKind, PoolStats};
