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
use std::panic::{catch_unwind, AssertUnwindSafe};

use burn_backend::quantization::QuantScheme;
use burn_backend::{DType, ExecutionError, Shape, TensorData};

use super::device::CudnnDevice;
use super::exec;
use super::memory::Storage;
use super::tensor::{expect, storage_type, to_dims, to_shape, CudnnTensor};
use crate::view::ViewLayout;

/// Uploads `data`; a dtype the backend cannot hold is first converted to `fallback`.
pub(crate) fn from_data(data: TensorData, device: &CudnnDevice, fallback: DType, op: &str) -> CudnnTensor {
    let data = if storage_type(data.dtype).is_some() {
        data
    } else {
        data.convert_dtype(fallback)
    };
    let dev = device.open();
    let storage = expect(op, Storage::from_host(&dev, data.as_bytes(), "from_data"));
    CudnnTensor {
        storage,
        layout: ViewLayout::contiguous(&to_dims(&data.shape)),
        dtype: data.dtype,
    }
}

/// Downloads `t` (waits for the device's stream); Burn's future is already complete.
pub(crate) fn into_data(t: CudnnTensor) -> std::future::Ready<Result<TensorData, ExecutionError>> {
    let shape = to_shape(t.dims());
    let dtype = t.dtype;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.read_bytes()))
        .map(|bytes| TensorData::from_bytes_vec(bytes, shape, dtype))
        .map_err(|panic| ExecutionError::WithContext {
            reason: panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "cudnn-backend: into_data failed".into()),
        });
    std::future::ready(result)
}

/// `t` on `device`: the same tensor when it is already there, else a copy through the host.
pub(crate) fn to_device(t: CudnnTensor, device: &CudnnDevice) -> CudnnTensor {
    if t.device().ordinal() == device.index as usize {
        return t;
    }
    let dtype = t.dtype;
    let shape = to_shape(t.dims());
    let bytes = t.read_bytes();
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
