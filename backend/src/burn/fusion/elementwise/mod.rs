//! The elementwise fuser: a run of float and bool elementwise operations of one output shape
//! as one generated kernel (`fuser`: the matching; `optimization`: the launch).

pub(crate) mod fuser;
mod optimization;

pub(crate) use fuser::ElementwiseFuser;
pub use optimization::ElementwiseOptimization;
