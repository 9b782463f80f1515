//! Batched reads (`TransactionOps`).
//!
//! Burn's default `tr_execute` reads the tensors one after the other, each read waiting for
//! the device. Here every tensor of a transaction is first copied (one elementwise copy
//! kernel each, any strides) into its slot of a single staging buffer per device; that
//! buffer then comes back with one device→host transfer followed by one synchronisation.
//!
//! Why a staging buffer rather than one asynchronous copy per tensor: cudarc copies into a
//! host `Vec` (pageable memory), and a device→host copy into pageable memory returns only
//! once it has completed, so back-to-back per-tensor copies would each wait on the stream.
//! One transfer of the staging buffer waits exactly once, whatever the number of tensors,
//! and needs no pinned allocation.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use burn_backend::ops::*;
use burn_backend::{ExecutionError, TensorData, TensorMetadata};

use super::qtensor;
use crate::burn::memory::Storage;
use crate::burn::tensor::{expect, CudnnTensor};
use crate::burn::{exec, Cudnn};
use crate::view::ViewLayout;

/// Alignment (bytes) of each tensor's slot in the staging buffer: a multiple of every
/// element size, so each slot starts on a whole element.
const SLOT_ALIGN: usize = 16;

/// The packed row-major bytes of every tensor (in the order given), read with one
/// device→host transfer and one stream synchronisation per device.
///
/// Panics with `cudnn-backend: <op>: ...` on an engine error (allocation, copy, transfer).
pub(crate) fn read_batch(tensors: &[CudnnTensor], op: &'static str) -> Vec<Vec<u8>> {
    let mut out = vec![Vec::new(); tensors.len()];
    let mut by_device: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        by_device.entry(t.device().ordinal()).or_default().push(i);
    }
    for indices in by_device.values() {
        if let [i] = indices[..] {
            // One tensor on this device: read it directly (a packed copy only if strided).
            out[i] = tensors[i].clone().read_bytes();
            continue;
        }
        // Slot of each tensor: (byte offset, byte length).
        let mut slots = Vec::with_capacity(indices.len());
        let mut total = 0usize;
        for &i in indices {
            let len = tensors[i].numel() as usize * tensors[i].kind().size();
            let start = total.next_multiple_of(SLOT_ALIGN);
            slots.push((start, len));
            total = start + len;
        }
        let device = tensors[indices[0]].device();
        let staging = expect(op, Storage::alloc(device, total, "transaction staging buffer"));
        for (&i, &(start, len)) in indices.iter().zip(&slots) {
            if len == 0 {
                continue;
            }
            let src = &tensors[i];
            let layout = ViewLayout {
                offset: (start / src.kind().size()) as i64,
                ..ViewLayout::contiguous(src.dims())
            };
            let dst = CudnnTensor {
                storage: staging.clone(),
                layout,
                dtype: src.dtype,
            };
            exec::copy_into(src, &dst, op);
        }
        // One transfer and one synchronisation for the whole group.
        let host = expect(op, staging.read(0, total));
        for (&i, &(start, len)) in indices.iter().zip(&slots) {
            out[i] = host[start..start + len].to_vec();
        }
    }
    out
}

/// The message of a caught panic.
pub(crate) fn panic_reason(panic: Box<dyn std::any::Any + Send>, op: &str) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| format!("cudnn-backend: {op} failed"))
}

/// Runs a read, turning a panic (engine error, device lost, ...) into an `ExecutionError`.
pub(crate) fn catch_read<T>(op: &str, f: impl FnOnce() -> T) -> Result<T, ExecutionError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| ExecutionError::WithContext {
        reason: panic_reason(panic, op),
    })
}

/// The data of a float/int/bool tensor from its packed bytes (as `data::into_data` builds it).
fn tensor_data(t: &CudnnTensor, bytes: Vec<u8>) -> TensorData {
    TensorData::from_bytes_vec(bytes, t.shape(), t.dtype)
}

/// Reads every tensor of the transaction in one batch (see the module docs).
fn execute(tr: TransactionPrimitive<Cudnn>) -> TransactionPrimitiveData {
    const OP: &str = "tr_execute";
    let (n_floats, n_ints, n_bools) = (tr.read_floats.len(), tr.read_ints.len(), tr.read_bools.len());
    let mut tensors: Vec<CudnnTensor> = Vec::with_capacity(n_floats + n_ints + n_bools + 2 * tr.read_qfloats.len());
    tensors.extend(tr.read_floats);
    tensors.extend(tr.read_ints);
    tensors.extend(tr.read_bools);
    let mut qmeta = Vec::with_capacity(tr.read_qfloats.len());
    for q in tr.read_qfloats {
        qmeta.push((q.shape(), q.scheme));
        tensors.push(q.values);
        tensors.push(q.scales);
    }
    let n_plain = n_floats + n_ints + n_bools;
    let mut bytes = read_batch(&tensors, OP);
    let q_bytes = bytes.split_off(n_plain);
    let mut read_floats: Vec<TensorData> = tensors.iter().zip(bytes).map(|(t, b)| tensor_data(t, b)).collect();
    let mut read_ints = read_floats.split_off(n_floats);
    let read_bools = read_ints.split_off(n_ints);
    let mut q_bytes = q_bytes.into_iter();
    let read_qfloats = qmeta
        .into_iter()
        .map(|(shape, scheme)| {
            let values = q_bytes.next().unwrap_or_default();
            let scales = q_bytes.next().unwrap_or_default();
            qtensor::q_data(shape, scheme, values, scales)
        })
        .collect();
    TransactionPrimitiveData {
        read_floats,
        read_qfloats,
        read_ints,
        read_bools,
    }
}

impl TransactionOps<Cudnn> for Cudnn {
    /// All reads of the transaction share one staging transfer and one synchronisation per
    /// device; the returned future is already complete.
    fn tr_execute(
        transaction: TransactionPrimitive<Cudnn>,
    ) -> impl std::future::Future<Output = Result<TransactionPrimitiveData, ExecutionError>> + Send {
        std::future::ready(catch_read("tr_execute", || execute(transaction)))
    }
}
