//! Drop-in modules for `burn::nn`: change only the import. Each has the same config fields
//! and record as Burn's, stays generic over any Burn backend, and takes the fused path on
//! `Cudnn` and `Autodiff<Cudnn>`.

mod batch_norm;

pub use batch_norm::{BatchNorm, BatchNormConfig, BatchNormRecord};
