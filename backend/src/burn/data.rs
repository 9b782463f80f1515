//! Host transfers: `from_data` uploads, `into_data` downloads (the only host round trips),
//! and batched reads.
//!
//! Batched reads (`TransactionOps`, `q_into_data`): Burn's default `tr_execute` reads the
//! tensors one after the other, each read waiting for the device. Here every tensor of a
//! batch is first copied (one elementwise copy kernel each, any strides) into its slot of a
//! single staging buffer per device; that buffer then comes back with one device→host
//! transfer followed by one synchronisation. cudarc copies into a host `Vec` (pageable
//! memory), and a device→host copy into pageable memory returns only once it has completed,
//! so back-to-back per-tensor copies would each wait on the stream; one transfer of the
//! staging buffer waits exactly once, whatever the number of tensors, and needs no pinned
//! allocation.

use std::collections::BTreeMap;

use burn_backend::quantization::QuantScheme;
use burn_backend::{DType, ExecutionError, Shape, TensorData};

use super::device::CudnnDevice;
use super::exec;
use super::memory::Storage;
use super::tensor::{storage_type, to_dims, to_shape, CudnnTensor};
use crate::error::{Error, Result};
use crate::view::ViewLayout;

/// Uploads `data`; a dtype the backend cannot hold is first converted to `fallback`.
pub(crate) fn from_data(data: TensorData, device: &CudnnDevice, fallback: DType, op: &str) -> Result<CudnnTensor> {
    let data = if storage_type(data.dtype).is_some() {
        data
    } else {
        data.convert_dtype(fallback)
    };
    let dev = device.open()?;
    let storage = Storage::from_host(&dev, data.as_bytes(), "from_data").map_err(|e| e.in_op(op))?;
    Ok(CudnnTensor {
        storage,
        layout: ViewLayout::contiguous(&to_dims(&data.shape)),
        dtype: data.dtype,
    })
}

/// Downloads `t` (waits for the device's stream); Burn's future is already complete. An
/// engine error (allocation, copy, transfer, a lost device) comes back as Burn's
/// `ExecutionError`, with no panic on the way.
pub(crate) fn into_data(t: CudnnTensor) -> std::future::Ready<Result<TensorData, ExecutionError>> {
    let shape = to_shape(t.dims());
    let dtype = t.dtype;
    let result = t
        .read_bytes()
        .map(|bytes| TensorData::from_bytes_vec(bytes, shape, dtype))
        .map_err(|e| execution_error("into_data", e));
    std::future::ready(result)
}

/// An engine error as Burn's `ExecutionError` of a read (`op`).
pub(crate) fn execution_error(op: &str, e: Error) -> ExecutionError {
    ExecutionError::WithContext {
        reason: format!("cudnn-backend: {}", e.in_op(op)),
    }
}

/// `t` on `device`: the same tensor when it is already there, else a copy through the host.
pub(crate) fn to_device(t: CudnnTensor, device: &CudnnDevice) -> Result<CudnnTensor> {
    if t.device().ordinal() == device.index as usize {
        return Ok(t);
    }
    let dtype = t.dtype;
    let shape = to_shape(t.dims());
    let bytes = t.read_bytes()?;
    from_data(
        TensorData::from_bytes_vec(bytes, shape, dtype),
        device,
        dtype,
        "to_device",
    )
}

/// Alignment (bytes) of each tensor's slot in the staging buffer: a multiple of every
/// element size, so each slot starts on a whole element.
const SLOT_ALIGN: usize = 16;

/// The packed row-major bytes of every tensor (in the order given), read with one
/// device→host transfer and one stream synchronisation per device.
pub(crate) fn read_batch(tensors: &[CudnnTensor], op: &'static str) -> Result<Vec<Vec<u8>>> {
    let mut out = vec![Vec::new(); tensors.len()];
    let mut by_device: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        by_device.entry(t.device().ordinal()).or_default().push(i);
    }
    for indices in by_device.values() {
        if let [i] = indices[..] {
            // One tensor on this device: read it directly (a packed copy only if strided).
            out[i] = tensors[i].clone().read_bytes()?;
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
        let staging = Storage::alloc(device, total, "transaction staging buffer")?;
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
            exec::copy_into(src, &dst, op)?;
        }
        // One transfer and one synchronisation for the whole group.
        let host = staging.read(0, total)?;
        for (&i, &(start, len)) in indices.iter().zip(&slots) {
            out[i] = host[start..start + len].to_vec();
        }
    }
    Ok(out)
}

/// The `TensorData` burn-ndarray's `q_into_data` builds: the i8 values in row-major order
/// followed by the f32 scales (`TensorData::quantized`).
pub(crate) fn q_data(shape: Shape, scheme: QuantScheme, values: Vec<u8>, scales: Vec<u8>) -> TensorData {
    let values: Vec<i8> = values.into_iter().map(|v| v as i8).collect();
    let scales: Vec<f32> = scales
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    TensorData::quantized(values, shape, scheme, &scales)
}
