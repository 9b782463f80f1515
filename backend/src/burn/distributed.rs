//! Burn's data-parallel training on our backend: `DistributedBackend` for [`Cudnn`]
//! (feature `distributed`), so `burn-train`'s multi-device learner and
//! `Autodiff<Cudnn>`'s gradient synchronisation (burn-autodiff's `distributed` feature) run
//! their all-reduces through NCCL. `CudnnFusion` gets the same through burn-fusion.
//!
//! Burn's sync server calls [`all_reduce`](DistributedBackend::all_reduce) once per device
//! for each parameter, from one thread, as soon as every device has that parameter's
//! gradient (during the backward pass). One thread cannot issue NCCL calls for several GPUs
//! one at a time (each may wait for the others), so the calls of a parameter are collected
//! until all devices of the group have arrived (queued per device and paired in order: under
//! `Fusion<Cudnn>` a device's all-reduces run when its own queue flushes, so one device may
//! run ahead of another). Complete parameters gather in a bucket, as in
//! PyTorch's `DistributedDataParallel`: a bucket is launched as one NCCL group once it holds
//! [`BUCKET_MB_ENV`] MiB (25 by default), and the rest when a device synchronizes at the end
//! of the backward pass. The reduction runs in place on each gradient's device stream,
//! ordered after the backward kernels that produced it and before any later use (no
//! separate communication stream: the GPU runs a reduction between backward kernels rather
//! than beside them, which keeps the memory pool's stream ordering simple; the host still
//! never waits for it).

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use burn_backend::distributed::{CollectiveTensor, DistributedBackend, DistributedParamId, ReduceOperation};
use burn_backend::DeviceId;
use burn_core::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn_core::tensor::backend::{AutodiffBackend, Backend};
use burn_core::tensor::{Bool, Int, Tensor};

use super::tensor::{expect, CudnnTensor};
use super::{Cudnn, CudnnDevice};
use crate::collective::{group, Communicator, ReduceOp};
pub use crate::config::BUCKET_MB_ENV;
use crate::error::{Error, Result};
use crate::runtime::Device;

/// One replica of `model` per device for data-parallel training with Burn's gradient
/// synchronisation: the parameters are initialized first (Burn's parameters are lazy, and
/// each clone of a model whose parameters were never read draws its own initial values, so
/// replicas cloned from it would start from different weights), then the model is forked to
/// each device and its float parameters are marked distributed (`Tensor::set_distributed`,
/// keyed by parameter id), so `backward()` all-reduces their gradients across the devices
/// between [`DistributedBackend::start_communication_server`] and
/// [`DistributedBackend::close_communication_server`]. Burn's optimizers keep the mark.
pub fn replicas<B: AutodiffBackend, M: Module<B>>(model: M, devices: &[B::Device]) -> Vec<M> {
    model.visit(&mut Initialize);
    devices
        .iter()
        .map(|device| model.clone().fork(device).map(&mut MarkDistributed))
        .collect()
}

/// Reads every parameter once, which initializes the lazy ones in place.
struct Initialize;

impl<B: Backend> ModuleVisitor<B> for Initialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let _ = param.val();
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        let _ = param.val();
    }
}

/// Marks every float parameter distributed under its parameter id.
struct MarkDistributed;

impl<B: AutodiffBackend> ModuleMapper<B> for MarkDistributed {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.set_distributed(DistributedParamId::from(id.val())), mapper)
    }
}

/// One queue of submitted tensors per device of a group (rank order).
type DeviceQueues = Vec<VecDeque<CudnnTensor>>;

/// The data-parallel groups' state (in the adapter's [`BurnState`](super::shared_state::BurnState)).
pub(crate) struct Groups {
    /// Communicators per group of device ordinals (sorted), made on first use.
    communicators: Mutex<Option<HashMap<Vec<usize>, Vec<Communicator>>>>,
    /// Gradients waiting for the rest of their group, per group.
    pending: Mutex<Option<HashMap<Vec<usize>, DeviceQueues>>>,
    /// Signalled whenever a group's waiting gradients were complete (moved to a bucket).
    arrived: Condvar,
    /// Complete gradients not launched yet, per group: launched together (one NCCL group)
    /// once they hold [`bucket_bytes`] or when a device of the group synchronizes. The lock
    /// is held while a bucket is launched, so a device that finds its group's bucket empty
    /// knows its reductions are enqueued.
    buckets: Mutex<Option<HashMap<Vec<usize>, Bucket>>>,
}

impl Groups {
    pub(crate) const fn new() -> Self {
        Groups {
            communicators: Mutex::new(None),
            pending: Mutex::new(None),
            arrived: Condvar::new(),
            buckets: Mutex::new(None),
        }
    }
}

fn groups() -> &'static Groups {
    &super::state().groups
}

/// Gradients of one group ready to reduce: per parameter, one tensor per device and the op.
#[derive(Default)]
struct Bucket {
    entries: Vec<(Vec<CudnnTensor>, ReduceOperation)>,
    /// Bytes of one device's share.
    bytes: usize,
}

/// The bucket size in bytes ([`BUCKET_MB_ENV`], default 25 MiB; 0 launches every
/// parameter on its own; [`Config::ddp_bucket_bytes`](crate::config::Config::ddp_bucket_bytes)).
fn bucket_bytes() -> usize {
    crate::config::config().ddp_bucket_bytes
}

impl DistributedBackend for Cudnn {
    fn all_reduce(tensor: CudnnTensor, op: ReduceOperation, device_ids: Vec<DeviceId>) -> CollectiveTensor<Self> {
        CollectiveTensor::new(expect("all_reduce", all_reduce(tensor, op, &device_ids)))
    }

    fn sync_collective(device: &CudnnDevice) {
        expect("sync_collective", sync_collective(device.index as usize))
    }
}

/// The sorted, distinct ordinals of a group.
fn group_key(device_ids: &[DeviceId]) -> Vec<usize> {
    let mut key: Vec<usize> = device_ids.iter().map(|id| id.index_id as usize).collect();
    key.sort_unstable();
    key.dedup();
    key
}

/// Queues `tensor` (copied first unless it is the exclusive, packed owner of its buffer);
/// launches the group's all-reduce when the last device's tensor arrives.
fn all_reduce(tensor: CudnnTensor, op: ReduceOperation, device_ids: &[DeviceId]) -> Result<CudnnTensor> {
    const OP: &str = "all_reduce";
    let key = group_key(device_ids);
    let ordinal = tensor.device().ordinal();
    if !key.contains(&ordinal) {
        return Err(Error::invalid_input(
            OP,
            format!("a tensor on GPU {ordinal} was submitted for a group of GPUs {key:?}"),
        ));
    }
    if key.len() == 1 {
        return Ok(tensor);
    }
    let dtype = tensor.dtype;
    let out = super::structure::owned(tensor, dtype, OP)?;
    let ready = {
        let mut pending = groups().pending.lock().unwrap_or_else(|e| e.into_inner());
        let queues = pending
            .get_or_insert_with(HashMap::new)
            .entry(key.clone())
            .or_insert_with(|| vec![VecDeque::new(); key.len()]);
        let rank = key.iter().position(|&o| o == ordinal).unwrap_or_default();
        queues[rank].push_back(out.clone());
        let set = take_complete(queues);
        check_same_parameter(&key, &set)?;
        set
    };
    if !ready.is_empty() {
        let bytes = ready[0].numel() as usize * ready[0].dtype.size();
        let mut buckets = groups().buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.get_or_insert_with(HashMap::new).entry(key.clone()).or_default();
        bucket.entries.push((ready, op));
        bucket.bytes += bytes;
        let full = bucket.bytes >= bucket_bytes();
        let launched = if full {
            launch(&key, std::mem::take(bucket))
        } else {
            Ok(())
        };
        drop(buckets);
        groups().arrived.notify_all();
        launched?;
    }
    Ok(out)
}

/// The next complete set of a group's queued submissions (one per device, in rank order),
/// or nothing while a device has none queued. Every device submits its tensors in one order
/// (Burn's sync server walks the parameters in one order for all of them), so the `i`-th
/// submissions of the devices belong together, however far one device's queue runs ahead of
/// another's (under `Fusion<Cudnn>` a device's queued all-reduces run when its own queue is
/// flushed).
fn take_complete<T>(queues: &mut [VecDeque<T>]) -> Vec<T> {
    if queues.iter().any(VecDeque::is_empty) {
        return Vec::new();
    }
    queues.iter_mut().filter_map(VecDeque::pop_front).collect()
}

/// Checks that a complete set holds one parameter: the same dims and dtype on every device.
fn check_same_parameter(key: &[usize], set: &[CudnnTensor]) -> Result<()> {
    let Some(first) = set.first() else { return Ok(()) };
    match set.iter().find(|t| t.dims() != first.dims() || t.dtype != first.dtype) {
        None => Ok(()),
        Some(odd) => Err(Error::invalid_input(
            "all_reduce",
            format!(
                "the devices of {key:?} submitted their tensors in different orders: GPU {} sent {:?} {:?}, GPU {} \
                 {:?} {:?}",
                first.device().ordinal(),
                first.dims(),
                first.dtype,
                odd.device().ordinal(),
                odd.dims(),
                odd.dtype
            ),
        )),
    }
}

/// One NCCL group for a bucket: an in-place all-reduce of each device's tensor of each
/// parameter on its stream (NCCL aggregates the group's collectives into few kernels).
fn launch(key: &[usize], bucket: Bucket) -> Result<()> {
    if bucket.entries.is_empty() {
        return Ok(());
    }
    let comms = communicators(key)?;
    group(|| {
        for (tensors, op) in &bucket.entries {
            let op = match op {
                ReduceOperation::Sum => ReduceOp::Sum,
                ReduceOperation::Mean => ReduceOp::Mean,
            };
            for t in tensors {
                let ordinal = t.device().ordinal();
                let rank = key.iter().position(|&o| o == ordinal).ok_or_else(|| {
                    Error::invalid_input("all_reduce", format!("GPU {ordinal} is not in the group {key:?}"))
                })?;
                comms[rank].all_reduce(t.stream(), &t.tref(), &t.tmut(), op)?;
            }
        }
        Ok(())
    })
}

/// Launches the buckets of every group that holds GPU `ordinal`.
fn flush_buckets(ordinal: usize) -> Result<()> {
    let mut buckets = groups().buckets.lock().unwrap_or_else(|e| e.into_inner());
    let Some(all) = buckets.as_mut() else { return Ok(()) };
    for (key, bucket) in all.iter_mut().filter(|(key, _)| key.contains(&ordinal)) {
        launch(key, std::mem::take(bucket))?;
    }
    Ok(())
}

/// The group's communicators (rank `i` on GPU `key[i]`), made once.
fn communicators(key: &[usize]) -> Result<Vec<Communicator>> {
    let mut all = groups().communicators.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(comms) = all.get(key) {
        return Ok(comms.clone());
    }
    let devices = key.iter().map(|&o| Device::new(o)).collect::<Result<Vec<_>>>()?;
    let comms = Communicator::init_all(&devices)?;
    all.insert(key.to_vec(), comms.clone());
    Ok(comms)
}

/// Makes `ordinal`'s stream ready for work that reads the reduced gradients. The reductions
/// run on the gradients' own streams, so that is only a matter of every group holding one
/// of this GPU's gradients having been launched: under `Fusion<Cudnn>` each device's
/// queued all-reduce runs when that device's queue is flushed, so a group may still wait
/// for another device's thread. Waits for that (up to the collective timeout), launches the
/// buckets of this GPU's groups, then reports a communicator of this GPU that the watchdog
/// aborted.
fn sync_collective(ordinal: usize) -> Result<()> {
    let deadline = Instant::now() + crate::collective::timeout_from_env();
    let mut pending = groups().pending.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let waiting = pending
            .iter()
            .flat_map(|m| m.iter())
            .find(|(key, queues)| {
                key.iter()
                    .position(|&o| o == ordinal)
                    .is_some_and(|rank| !queues[rank].is_empty())
            })
            .map(|(key, queues)| (key.clone(), queues.iter().filter(|q| !q.is_empty()).count()));
        let Some((key, arrived)) = waiting else { break };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Collective {
                op: "sync_collective",
                reason: format!(
                    "GPU {ordinal}'s gradient waited for the other GPUs of {key:?} ({arrived} of {} arrived) until the \
                     timeout; every device of a data-parallel group needs its own thread driving it",
                    key.len()
                ),
            });
        }
        pending = groups()
            .arrived
            .wait_timeout(pending, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    drop(pending);
    flush_buckets(ordinal)?;
    let all = groups().communicators.lock().unwrap_or_else(|e| e.into_inner());
    for comm in all.iter().flat_map(|m| m.values()).flatten() {
        if comm.device().ordinal() == ordinal {
            comm.status()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submissions_pair_in_order_however_far_one_device_runs_ahead() {
        let mut queues: Vec<VecDeque<&str>> = vec![VecDeque::new(); 2];
        // GPU 0 submits three parameters before GPU 1 submits any.
        for p in ["a0", "b0", "c0"] {
            queues[0].push_back(p);
            assert!(
                take_complete(&mut queues).is_empty(),
                "{p}: GPU 1 has nothing queued yet"
            );
        }
        queues[1].push_back("a1");
        assert_eq!(take_complete(&mut queues), ["a0", "a1"]);
        assert!(take_complete(&mut queues).is_empty());
        queues[1].push_back("b1");
        queues[1].push_back("c1");
        assert_eq!(take_complete(&mut queues), ["b0", "b1"]);
        assert_eq!(take_complete(&mut queues), ["c0", "c1"]);
        assert!(queues.iter().all(VecDeque::is_empty));
    }

    #[test]
    fn groups_are_keyed_by_sorted_distinct_ordinals() {
        let id = |i: u16| DeviceId {
            type_id: super::super::device::DEVICE_TYPE_ID,
            index_id: i,
        };
        assert_eq!(group_key(&[id(3), id(1), id(3), id(0)]), vec![0, 1, 3]);
    }
}
