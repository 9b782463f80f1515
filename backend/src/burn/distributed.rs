//! Burn's data-parallel training on our backend: `DistributedBackend` for [`Cudnn`]
//! (feature `distributed`), so `burn-train`'s multi-device learner and
//! `Autodiff<Cudnn>`'s gradient synchronisation (burn-autodiff's `distributed` feature) run
//! their all-reduces through NCCL. `CudnnFusion` gets the same through burn-fusion.
//!
//! Burn's sync server calls [`all_reduce`](DistributedBackend::all_reduce) once per device
//! for each parameter, from one thread, as soon as every device has that parameter's
//! gradient (during the backward pass). One thread cannot issue NCCL calls for several GPUs
//! one at a time (each may wait for the others), so the calls of a parameter are collected
//! until all devices of the group have arrived and then launched as one NCCL group. The
//! reduction runs in place on each gradient's device stream, ordered after the backward
//! kernels that produced it and before any later use (no separate communication stream:
//! the GPU runs a reduction between backward kernels rather than beside them, which keeps
//! the memory pool's stream ordering simple; the host still never waits for it).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use burn_backend::distributed::{CollectiveTensor, DistributedBackend, ReduceOperation};
use burn_backend::DeviceId;

use super::exec::copy_to_new;
use super::tensor::{expect, CudnnTensor};
use super::{Cudnn, CudnnDevice};
use crate::collective::{group, Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::runtime::Device;

/// Communicators per group of device ordinals (sorted), made on first use.
static COMMUNICATORS: Mutex<Option<HashMap<Vec<usize>, Vec<Communicator>>>> = Mutex::new(None);
/// Gradients waiting for the rest of their group, per group.
static PENDING: Mutex<Option<HashMap<Vec<usize>, Vec<CudnnTensor>>>> = Mutex::new(None);
/// Signalled whenever a group's waiting gradients were launched.
static LAUNCHED: Condvar = Condvar::new();

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
    let out = if tensor.is_exclusive() {
        tensor
    } else {
        copy_to_new(&tensor, tensor.dtype, OP)?
    };
    let ready = {
        let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = pending.get_or_insert_with(HashMap::new).entry(key.clone()).or_default();
        if waiting.iter().any(|t| t.device().ordinal() == ordinal) {
            return Err(Error::invalid_input(
                OP,
                format!("GPU {ordinal} submitted a second tensor before the group {key:?} finished the first"),
            ));
        }
        waiting.push(out.clone());
        if waiting.len() == key.len() {
            std::mem::take(waiting)
        } else {
            Vec::new()
        }
    };
    if !ready.is_empty() {
        let launched = launch(&key, &ready, op);
        LAUNCHED.notify_all();
        launched?;
    }
    Ok(out)
}

/// One NCCL group: an in-place all-reduce of each device's tensor on its stream.
fn launch(key: &[usize], tensors: &[CudnnTensor], op: ReduceOperation) -> Result<()> {
    let op = match op {
        ReduceOperation::Sum => ReduceOp::Sum,
        ReduceOperation::Mean => ReduceOp::Mean,
    };
    let comms = communicators(key)?;
    group(|| {
        for t in tensors {
            let ordinal = t.device().ordinal();
            let rank = key.iter().position(|&o| o == ordinal).ok_or_else(|| {
                Error::invalid_input("all_reduce", format!("GPU {ordinal} is not in the group {key:?}"))
            })?;
            comms[rank].all_reduce(t.stream(), &t.tref(), &t.tmut(), op)?;
        }
        Ok(())
    })
}

/// The group's communicators (rank `i` on GPU `key[i]`), made once.
fn communicators(key: &[usize]) -> Result<Vec<Communicator>> {
    let mut all = COMMUNICATORS.lock().unwrap_or_else(|e| e.into_inner());
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
/// for another device's thread. Waits for that (up to the collective timeout), then
/// reports a communicator of this GPU that the watchdog aborted.
fn sync_collective(ordinal: usize) -> Result<()> {
    let deadline = Instant::now() + crate::collective::timeout_from_env();
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let waiting = pending
            .iter()
            .flat_map(|m| m.iter())
            .find(|(_, ts)| ts.iter().any(|t| t.device().ordinal() == ordinal))
            .map(|(key, ts)| (key.clone(), ts.len()));
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
        pending = LAUNCHED
            .wait_timeout(pending, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    drop(pending);
    let all = COMMUNICATORS.lock().unwrap_or_else(|e| e.into_inner());
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
    fn groups_are_keyed_by_sorted_distinct_ordinals() {
        let id = |i: u16| DeviceId {
            type_id: super::super::device::DEVICE_TYPE_ID,
            index_id: i,
        };
        assert_eq!(group_key(&[id(3), id(1), id(3), id(0)]), vec![0, 1, 3]);
    }
}
