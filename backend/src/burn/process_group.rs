//! Data parallelism with one process per GPU, the layout of PyTorch's
//! `DistributedDataParallel` under `torchrun`: every process trains a replica of the model on
//! its own GPU and its shard of each batch, and after each backward pass a
//! [`ProcessGroup`] averages the gradients across the processes through NCCL before the
//! optimizer step, so every replica applies the same update.
//!
//! ```no_run
//! # fn main() -> cudnn_backend::Result<()> {
//! use burn_autodiff::Autodiff;
//! use cudnn_backend::burn::process_group::ProcessGroup;
//! use cudnn_backend::burn::Cudnn;
//! type B = Autodiff<Cudnn>;
//! // RANK, WORLD_SIZE and LOCAL_RANK set by the launcher, and CUDNN_BACKEND_NCCL_ID,
//! // CUDNN_BACKEND_NCCL_ID_FILE or MASTER_ADDR and MASTER_PORT to find the NCCL id.
//! let group = ProcessGroup::from_env()?;
//! let device = group.device();
//! // let model = group.broadcast_parameters::<B, _>(Net::new(&device))?;
//! // per step: let grads = group.all_reduce_gradients(&model, GradientsParams::from_grads(loss.backward(), &model))?;
//! # Ok(()) }
//! ```
//!
//! Burn's own data parallelism (`cudnn_backend::burn::distributed`, feature `distributed`)
//! drives every GPU from one process, and Burn's autodiff keeps its graphs behind
//! process-wide locks, so its replicas contend on the host; separate processes share nothing
//! but NCCL.

use burn_core::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn_core::tensor::backend::AutodiffBackend;
use burn_core::tensor::{Tensor, TensorPrimitive};
use burn_optim::GradientsParams;

use super::structure::owned;
use super::{Cudnn, CudnnDevice, CudnnTensor};
use crate::collective::{group, Bootstrap, Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::runtime::Device;

/// One rank of a data-parallel job: its NCCL communicator and its GPU.
#[derive(Clone, Debug)]
pub struct ProcessGroup {
    comm: Communicator,
}

impl ProcessGroup {
    /// The group of an existing communicator (one rank per process, or per thread).
    pub fn new(comm: Communicator) -> Self {
        Self { comm }
    }

    /// Joins the job this process was launched into: rank and world size from `RANK` and
    /// `WORLD_SIZE`, the GPU from `LOCAL_RANK`, the NCCL id from
    /// [`NCCL_ID_ENV`](crate::collective::NCCL_ID_ENV), else through the file
    /// [`NCCL_ID_FILE_ENV`](crate::collective::NCCL_ID_FILE_ENV) names, else over TCP from
    /// rank 0 at [`MASTER_ADDR_ENV`](crate::collective::MASTER_ADDR_ENV) and
    /// [`MASTER_PORT_ENV`](crate::collective::MASTER_PORT_ENV) (see
    /// [`Bootstrap::unique_id_with`]).
    pub fn from_env() -> Result<Self> {
        let job = Bootstrap::from_env()?;
        let device = Device::new(job.local_rank)?;
        Ok(Self::new(Communicator::from_env(&device)?))
    }

    /// This process's rank, `0..world_size`.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// This rank's GPU.
    pub fn device(&self) -> CudnnDevice {
        CudnnDevice::new(self.comm.device().ordinal())
    }

    /// The communicator underneath.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// `model` with every float parameter replaced by rank 0's values (call it on every rank
    /// right after building the model, so all replicas start equal).
    pub fn broadcast_parameters<B, M>(&self, model: M) -> Result<M>
    where
        B: AutodiffBackend<InnerBackend = Cudnn>,
        M: Module<B>,
    {
        let mut mapper = BroadcastParameters {
            comm: &self.comm,
            error: None,
        };
        let model = group(|| Ok(model.map(&mut mapper)))?;
        match mapper.error {
            Some(e) => Err(e),
            None => Ok(model),
        }
    }

    /// `grads` (of `model`'s parameters on this rank's batch shard) averaged over the ranks:
    /// one in-place NCCL all-reduce per gradient, all in one group, enqueued on the
    /// gradients' stream (the host does not wait). Every rank calls it after each backward
    /// pass, with the same model; parameters without a gradient are skipped on every rank.
    pub fn all_reduce_gradients<B, M>(&self, model: &M, mut grads: GradientsParams) -> Result<GradientsParams>
    where
        B: AutodiffBackend<InnerBackend = Cudnn>,
        M: AutodiffModule<B>,
    {
        let mut take = TakeGradients::<'_> {
            grads: &mut grads,
            taken: Vec::new(),
            error: None,
        };
        model.visit(&mut take);
        let TakeGradients { taken, error, .. } = take;
        if let Some(e) = error {
            return Err(e);
        }
        group(|| {
            for (_, t) in &taken {
                self.comm.all_reduce(t.stream(), &t.tref(), &t.tmut(), ReduceOp::Mean)?;
            }
            Ok(())
        })?;
        let mut put = PutGradients {
            grads: &mut grads,
            taken: taken.into_iter(),
        };
        model.visit(&mut put);
        Ok(grads)
    }

    /// Returns once every rank has called it and this rank's GPU has finished its work so far
    /// (e.g. around a timed epoch).
    pub fn barrier(&self) -> Result<()> {
        let token = into_cudnn(Tensor::<Cudnn, 1>::ones([1], &self.device()));
        self.comm
            .all_reduce(token.stream(), &token.tref(), &token.tmut(), ReduceOp::Sum)?;
        self.comm.synchronize()?;
        token.stream().synchronize().map_err(|e| Error::Cuda {
            op: "barrier",
            message: e.to_string(),
        })
    }
}

fn into_cudnn<const D: usize>(t: Tensor<Cudnn, D>) -> CudnnTensor {
    t.into_primitive().tensor()
}

fn from_cudnn<const D: usize>(t: CudnnTensor) -> Tensor<Cudnn, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Replaces each float parameter by rank 0's values (in place on a private copy).
struct BroadcastParameters<'a> {
    comm: &'a Communicator,
    error: Option<Error>,
}

impl<B: AutodiffBackend<InnerBackend = Cudnn>> ModuleMapper<B> for BroadcastParameters<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        if self.error.is_some() {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let require_grad = tensor.is_require_grad();
        let inner = into_cudnn(tensor.clone().inner());
        let dtype = inner.dtype;
        let received = owned(inner, dtype, "broadcast_parameters").and_then(|t| {
            self.comm.broadcast(t.stream(), &t.tmut(), 0)?;
            Ok(t)
        });
        let value = match received {
            Ok(t) => Tensor::from_inner(from_cudnn::<D>(t)).set_require_grad(require_grad),
            Err(e) => {
                self.error = Some(e);
                tensor
            }
        };
        Param::from_mapped_value(id, value, mapper)
    }
}

/// Removes the float parameters' gradients, in the model's (rank-independent) order, as
/// tensors the all-reduce may overwrite.
struct TakeGradients<'a> {
    grads: &'a mut GradientsParams,
    taken: Vec<(ParamId, CudnnTensor)>,
    error: Option<Error>,
}

impl<B: AutodiffBackend<InnerBackend = Cudnn>> ModuleVisitor<B> for TakeGradients<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.error.is_some() {
            return;
        }
        if let Some(g) = self.grads.remove::<Cudnn, D>(param.id) {
            let g = into_cudnn(g);
            let dtype = g.dtype;
            match owned(g, dtype, "all_reduce_gradients") {
                Ok(t) => self.taken.push((param.id, t)),
                Err(e) => self.error = Some(e),
            }
        }
    }
}

/// Puts the reduced gradients back under their parameters (same visiting order).
struct PutGradients<'a> {
    grads: &'a mut GradientsParams,
    taken: std::vec::IntoIter<(ParamId, CudnnTensor)>,
}

impl<B: AutodiffBackend<InnerBackend = Cudnn>> ModuleVisitor<B> for PutGradients<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some((id, t)) = self.taken.as_slice().first() {
            if *id == param.id {
                let t = t.clone();
                self.taken.next();
                self.grads.register::<Cudnn, D>(param.id, from_cudnn(t));
            }
        }
    }
}
