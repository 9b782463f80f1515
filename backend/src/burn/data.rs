//! Host transfers: `from_data` uploads, `into_data` downloads (the only host round trips).

use burn_backend::{DType, ExecutionError, TensorData};

use super::device::CudnnDevice;
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
