//! Burn's op traits for [`Cudnn`](super::Cudnn), one module per trait.

mod activation;
mod bool;
mod float;
mod int;
pub(crate) mod module;
pub(crate) mod qtensor;
mod transaction;
