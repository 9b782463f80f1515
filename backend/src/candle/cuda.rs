//! CUDA side of the custom ops (feature `candle-cuda`): Candle storage as views
//! ([`TensorRef`], [`TensorMut`]) made with the safe constructors from its cudarc slices, on
//! Candle's own stream, and outputs allocated there and wrapped as `CudaStorage`.

use std::sync::Arc;

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};

use super::arg_err;
use crate::ffi::uninit::alloc_uninit;
use crate::graph::DataType;
use crate::types::{TensorMut, TensorRef};

/// Candle's stream of the device that holds `s`: every op is enqueued there.
pub(crate) fn stream(s: &CudaStorage) -> Arc<CudaStream> {
    s.device.cuda_stream()
}

/// A view of `s` with layout `l`, borrowed for reading by work on `stream` (cudarc records
/// the read there when the view drops).
pub(crate) fn input<'a>(
    op: &'static str,
    arg: &'static str,
    s: &'a CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
) -> Result<TensorRef<'a>> {
    let whole = match &s.slice {
        CudaStorageSlice::F32(x) => TensorRef::from_slice(x, stream, &[x.len() as i64], &[1]),
        CudaStorageSlice::F16(x) => TensorRef::from_slice(x, stream, &[x.len() as i64], &[1]),
        CudaStorageSlice::BF16(x) => TensorRef::from_slice(x, stream, &[x.len() as i64], &[1]),
        _ => {
            let msg = format!("dtype {:?} is not supported on CUDA (f32, f16, bf16)", s_dtype(s));
            return Err(arg_err(op, arg, msg));
        }
    };
    laid_out(whole, l)
}

/// An int64 view of `s` with layout `l` (ids, class targets), borrowed for reading by work on
/// `stream`.
pub(crate) fn i64_input<'a>(
    op: &'static str,
    arg: &'static str,
    s: &'a CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
) -> Result<TensorRef<'a>> {
    let CudaStorageSlice::I64(x) = &s.slice else {
        return Err(arg_err(op, arg, format!("needs i64 values, not {:?}", s_dtype(s))));
    };
    laid_out(TensorRef::from_slice(x, stream, &[x.len() as i64], &[1]), l)
}

/// The part of a whole storage's view that layout `l` describes.
fn laid_out<'a>(whole: crate::Result<TensorRef<'a>>, l: &Layout) -> Result<TensorRef<'a>> {
    let (dims, strides, start) = layout(l);
    whole
        .and_then(|w| w.view(start, &dims, &strides))
        .map_err(candle_core::Error::wrap)
}

/// A writable view of `s` with layout `l` (storage Candle lent mutably, e.g. to an in-place
/// op), for work on `stream` (cudarc records the write there when the view drops).
pub(crate) fn output_of<'a>(
    op: &'static str,
    arg: &'static str,
    s: &'a mut CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
) -> Result<TensorMut<'a>> {
    let dtype = s_dtype(s);
    let (dims, strides, start) = layout(l);
    let whole = match &mut s.slice {
        CudaStorageSlice::F32(x) => TensorMut::from_slice(x, stream, &[x.len() as i64], &[1]),
        CudaStorageSlice::F16(x) => TensorMut::from_slice(x, stream, &[x.len() as i64], &[1]),
        CudaStorageSlice::BF16(x) => TensorMut::from_slice(x, stream, &[x.len() as i64], &[1]),
        _ => {
            let msg = format!("dtype {dtype:?} is not supported on CUDA (f32, f16, bf16)");
            return Err(arg_err(op, arg, msg));
        }
    };
    whole
        .and_then(|w| w.view_mut(start, &dims, &strides))
        .map_err(candle_core::Error::wrap)
}

/// Candle's layout as engine dims, strides and the element offset of its first element.
pub(crate) fn layout(l: &Layout) -> (Vec<i64>, Vec<i64>, i64) {
    let dims = l.dims().iter().map(|&d| d as i64).collect();
    let strides = l.stride().iter().map(|&d| d as i64).collect();
    (dims, strides, l.start_offset() as i64)
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
            DataType::F32 => Output::F32(alloc_uninit(stream, len, op).map_err(candle_core::Error::wrap)?),
            DataType::F16 => Output::F16(alloc_uninit(stream, len, op).map_err(candle_core::Error::wrap)?),
            DataType::BF16 => Output::BF16(alloc_uninit(stream, len, op).map_err(candle_core::Error::wrap)?),
            other => return Err(arg_err(op, "dtype", format!("{other:?} is not supported"))),
        })
    }

    /// A writable view of the buffer with logical `dims` and element `strides`, for work on
    /// `stream` (checked to stay inside the buffer).
    pub(crate) fn view<'a>(
        &'a mut self,
        stream: &'a CudaStream,
        dims: &[i64],
        strides: &[i64],
    ) -> Result<TensorMut<'a>> {
        match self {
            Output::F32(x) => TensorMut::from_slice(x, stream, dims, strides),
            Output::F16(x) => TensorMut::from_slice(x, stream, dims, strides),
            Output::BF16(x) => TensorMut::from_slice(x, stream, dims, strides),
        }
        .map_err(candle_core::Error::wrap)
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
/// permutation), lets `run` write it through a [`TensorMut`], and wraps it as storage of
/// `dev`.
pub(crate) fn with_output(
    op: &'static str,
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dt: DataType,
    dims: &[i64],
    strides: &[i64],
    run: impl FnOnce(&TensorMut) -> crate::Result<()>,
) -> Result<CudaStorage> {
    let len = dims.iter().product::<i64>() as usize;
    let mut out = Output::alloc(op, stream, dt, len)?;
    run(&out.view(stream, dims, strides)?).map_err(candle_core::Error::wrap)?;
    Ok(out.into_storage(dev.clone()))
}
