//! Collectives on Candle tensors through NCCL ([`crate::collective`]): an all-reduce that
//! Candle's autograd can differentiate (its gradient is the same all-reduce of the output
//! gradient, as in PyTorch's functional collectives) and a broadcast, both as `CustomOp1`s
//! on Candle's stream of the tensor's GPU. The tensor must live on the communicator's GPU
//! (feature `candle-cuda`); on Candle's CPU device they return an error.

#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use crate::collective::{Communicator, ReduceOp};

/// An out-of-place all-reduce of one rank's tensor (see [`all_reduce`]).
#[derive(Clone, Debug)]
pub struct AllReduce {
    /// This rank's communicator.
    pub comm: Communicator,
    /// How the ranks' values combine.
    pub op: ReduceOp,
}

/// An out-of-place broadcast from rank `root` (see [`broadcast`]).
#[derive(Clone, Debug)]
pub struct Broadcast {
    /// This rank's communicator.
    pub comm: Communicator,
    /// The rank whose values every rank receives.
    pub root: usize,
}

fn needs_cuda(op: &'static str) -> candle_core::Error {
    super::arg_err(
        op,
        "x",
        "collectives run on CUDA tensors on the communicator's GPU (Candle's CPU device has no NCCL)",
    )
}

impl CustomOp1 for AllReduce {
    fn name(&self) -> &'static str {
        "cudnn-all-reduce"
    }

    fn cpu_fwd(&self, _s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(needs_cuda("candle all_reduce"))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle all_reduce";
        let stream = super::cuda::stream(s);
        let x = super::cuda::input(OP, "x", s, l, &stream)?;
        let dims = x.dims().to_vec();
        let strides = crate::types::row_major_strides(&dims);
        let out = super::cuda::with_output(OP, &s.device, &stream, x.dtype(), &dims, &strides, |out| {
            self.comm.all_reduce(&stream, &x, out, self.op)
        })?;
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        match self.op {
            ReduceOp::Sum | ReduceOp::Mean => all_reduce(grad, &self.comm, self.op).map(Some),
            other => Err(super::arg_err(
                "candle all_reduce backward",
                "op",
                format!("{other:?} has no gradient here; differentiate through Sum or Mean"),
            )),
        }
    }
}

impl CustomOp1 for Broadcast {
    fn name(&self) -> &'static str {
        "cudnn-broadcast"
    }

    fn cpu_fwd(&self, _s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(needs_cuda("candle broadcast"))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle broadcast";
        let stream = super::cuda::stream(s);
        let x = super::cuda::input(OP, "x", s, l, &stream)?;
        let dims = x.dims().to_vec();
        let strides = crate::types::row_major_strides(&dims);
        let out = super::cuda::with_output(OP, &s.device, &stream, x.dtype(), &dims, &strides, |out| {
            crate::ops::elementwise::copy(&stream, &x, out)?;
            self.comm.broadcast(&stream, out, self.root)
        })?;
        Ok((out, l.shape().clone()))
    }
}

/// The all-reduce of `x` over the communicator's ranks (every rank calls it with a tensor of
/// the same shape and dtype, f32/f16/bf16, in the same order as its other collectives), as a
/// new tensor. Differentiable for [`ReduceOp::Sum`] and [`ReduceOp::Mean`].
pub fn all_reduce(x: &Tensor, comm: &Communicator, op: ReduceOp) -> Result<Tensor> {
    x.contiguous()?.apply_op1(AllReduce { comm: comm.clone(), op })
}

/// Rank `root`'s `x` on every rank (each rank passes a tensor of the same shape and dtype),
/// as a new tensor; e.g. to start the replicas of a data-parallel model from rank 0's weights.
pub fn broadcast(x: &Tensor, comm: &Communicator, root: usize) -> Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&Broadcast {
        comm: comm.clone(),
        root,
    })
}
