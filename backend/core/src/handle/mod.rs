//! Thread-pooled handles: the generic [`pool::DeviceThreadHandlePool`], generic over the
//! handle kind. The cuDNN kind, whose handles carry their own plan cache, is
//! [`plan::CudnnKind`](crate::plan::CudnnKind).

pub mod pool;

pub use pool::{DeviceThreadHandlePool, HandleKind, PoolStats};
