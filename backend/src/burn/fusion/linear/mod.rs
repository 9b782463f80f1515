//! Burn's composed linear layer: its forward with the bias (and an activation tail) as one
//! cuDNN matmul graph (`bias`), and its weight gradient as one GEMM over the folded batch
//! (`weight_grad`).

mod bias;
mod weight_grad;

pub(crate) use bias::{MatmulBiasFuser, MatmulBiasOptimization};
pub(crate) use weight_grad::{LinearGradFuser, LinearGradOptimization};
