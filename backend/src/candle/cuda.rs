//! CUDA side of the custom ops (feature `candle-cuda`): Candle storage as [`TensorRef`]s on
//! Candle's own stream, and outputs allocated there and wrapped as `CudaStorage`.

use std::sync::Arc;

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};

use super::arg_err;
use crate::ffi::candle_interop::alloc_uninit;
use crate::graph::DataType;
use crate::ops::TensorRef;

/// Candle's stream of the device that holds `s`: every op is enqueued there.
pub(crate) fn stream(s: &CudaStorage) -> Arc<CudaStream> {
    s.device.cuda_stream()
}

/// A view of `s` with layout `l` as a [`TensorRef`]; the pointer is valid while the
/// returned guard lives (it records the read on `stream` when dropped).
pub(crate) fn input<'a>(
    op: &'static str,
    arg: &'static str,
    s: &'a CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
) -> Result<(TensorRef, SyncOnDrop<'a>)> {
    let (ptr, guard, dt) = match &s.slice {
        CudaStorageSlice::F32(x) => {
            let (p, g) = x.device_ptr(stream);
            (p, g, DataType::F32)
        }
        CudaStorageSlice::F16(x) => {
            let (p, g) = x.device_ptr(stream);
            (p, g, DataType::F16)
        }
        CudaStorageSlice::BF16(x) => {
            let (p, g) = x.device_ptr(stream);
            (p, g, DataType::BF16)
        }
        _ => {
            let msg = format!("dtype {:?} is not supported on CUDA (f32, f16, bf16)", s_dtype(s));
            return Err(arg_err(op, arg, msg));
        }
    };
    let dims: Vec<i64> = l.dims().iter().map(|&d| d as i64).collect();
    let strides: Vec<i64> = l.stride().iter().map(|&d| d as i64).collect();
    let ptr = ptr + (l.start_offset() * dt.size()) as u64;
    Ok((TensorRef::new(&dims, &strides, dt, ptr), guard))
}

/// A writable view of `s` with layout `l` (storage Candle lent mutably, e.g. to an in-place
/// op) as a [`TensorRef`]; the pointer is valid while the returned guard lives (it records the
/// write on `stream` when dropped).
pub(crate) fn output_of<'a>(
    op: &'static str,
    arg: &'static str,
    s: &'a mut CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
) -> Result<(TensorRef, SyncOnDrop<'a>)> {
    let dtype = s_dtype(s);
    let (ptr, guard, dt) = match &mut s.slice {
        CudaStorageSlice::F32(x) => {
            let (p, g) = x.device_ptr_mut(stream);
            (p, g, DataType::F32)
        }
        CudaStorageSlice::F16(x) => {
            let (p, g) = x.device_ptr_mut(stream);
            (p, g, DataType::F16)
        }
        CudaStorageSlice::BF16(x) => {
            let (p, g) = x.device_ptr_mut(stream);
            (p, g, DataType::BF16)
        }
        _ => {
            let msg = format!("dtype {dtype:?} is not supported on CUDA (f32, f16, bf16)");
            return Err(arg_err(op, arg, msg));
        }
    };
    let dims: Vec<i64> = l.dims().iter().map(|&d| d as i64).collect();
    let strides: Vec<i64> = l.stride().iter().map(|&d| d as i64).collect();
    let ptr = ptr + (l.start_offset() * dt.size()) as u64;
    Ok((TensorRef::new(&dims, &strides, dt, ptr), guard))
}

/// The CUDA storage behind a tensor's read guard, or an argument error naming `arg`.
pub(crate) fn storage_of<'a>(op: &'static str, arg: &'static str, s: &'a Storage) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        _ => Err(arg_err(op, arg, "is not on a CUDA device (all operands must be)")),
    }
}

/// A (row-major) tensor of `shape` over `storage`, outside the autograd graph: how a backward
/// pass returns several gradients that one launch wrote.
pub(crate) fn tensor(storage: CudaStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

fn s_dtype(s: &CudaStorage) -> candle_core::DType {
    use candle_core::backend::BackendStorage;
    s.dtype()
}

/// An output buffer allocated on Candle's stream.
pub(crate) enum Output {
    F32(CudaSlice<f32>),
    F16(CudaSlice<f16>),
    BF16(CudaSlice<bf16>),
}

impl Output {
    /// `len` uninitialised elements of `dt` on `stream`.
    pub(crate) fn alloc(op: &'static str, stream: &Arc<CudaStream>, dt: DataType, len: usize) -> Result<Self> {
        Ok(match dt {
            DataType::F32 => Output::F32(alloc_uninit(stream, len, op)?),
            DataType::F16 => Output::F16(alloc_uninit(stream, len, op)?),
            DataType::BF16 => Output::BF16(alloc_uninit(stream, len, op)?),
            other => return Err(arg_err(op, "dtype", format!("{other:?} is not supported"))),
        })
    }

    /// The device address, valid for writes while the guard lives.
    pub(crate) fn ptr<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        match self {
            Output::F32(x) => x.device_ptr_mut(stream),
            Output::F16(x) => x.device_ptr_mut(stream),
            Output::BF16(x) => x.device_ptr_mut(stream),
        }
    }

    /// A [`TensorRef`] over the whole buffer with logical `dims` and element `strides`; the
    /// address is valid while the guard lives.
    pub(crate) fn view<'a>(
        &'a mut self,
        stream: &'a CudaStream,
        dims: &[i64],
        strides: &[i64],
    ) -> (TensorRef, SyncOnDrop<'a>) {
        let dt = match self {
            Output::F32(_) => DataType::F32,
            Output::F16(_) => DataType::F16,
            Output::BF16(_) => DataType::BF16,
        };
        let (ptr, guard) = self.ptr(stream);
        (TensorRef::new(dims, strides, dt, ptr), guard)
    }

    /// Wraps the buffer as Candle storage of `dev`.
    pub(crate) fn into_storage(self, dev: CudaDevice) -> CudaStorage {
        match self {
            Output::F32(x) => CudaStorage::wrap_cuda_slice(x, dev),
            Output::F16(x) => CudaStorage::wrap_cuda_slice(x, dev),
            Output::BF16(x) => CudaStorage::wrap_cuda_slice(x, dev),
        }
    }
}

/// Allocates an output with logical `dims` and the given element `strides` (a packed
/// permutation), lets `run` write it through a [`TensorRef`], and wraps it as storage of
/// `dev`.
pub(crate) fn with_output(
    op: &'static str,
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dt: DataType,
    dims: &[i64],
    strides: &[i64],
    run: impl FnOnce(&TensorRef) -> crate::Result<()>,
) -> Result<CudaStorage> {
    let len = dims.iter().product::<i64>() as usize;
    let mut out = Output::alloc(op, stream, dt, len)?;
    {
        let (ptr, _guard) = out.ptr(stream);
        run(&TensorRef::new(dims, strides, dt, ptr))?;
    }
    Ok(out.into_storage(dev.clone()))
}
