//! The tensor primitive: a shared device buffer plus a strided view (dims, strides,
//! offset) and a dtype. Views (transpose, permute, slice, expand, reshape of viewable
//! data) share the buffer; cuDNN and the kernels read the strides directly.

use std::sync::Arc;

use burn_backend::quantization::QuantScheme;
use burn_backend::{DType, QTensorPrimitive, Shape, TensorMetadata};
use cudarc::driver::CudaStream;

use super::device::CudnnDevice;
use super::memory::Storage;
use crate::error::Result;
use crate::graph::DataType;
use crate::ops::TensorRef;
use crate::runtime;
use crate::view::ViewLayout;

/// A tensor of the [`Cudnn`](super::Cudnn) backend (float, int and bool tensors alike).
#[derive(Clone)]
pub struct CudnnTensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: ViewLayout,
    pub(crate) dtype: DType,
}

impl std::fmt::Debug for CudnnTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudnnTensor")
            .field("dims", &self.layout.dims)
            .field("strides", &self.layout.strides)
            .field("offset", &self.layout.offset)
            .field("dtype", &self.dtype)
            .field("device", &self.storage.device().ordinal())
            .finish()
    }
}

impl TensorMetadata for CudnnTensor {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn shape(&self) -> Shape {
        to_shape(&self.layout.dims)
    }

    fn rank(&self) -> usize {
        self.layout.dims.len()
    }
}

/// The engine dtype that stores a Burn dtype, or `None` when the backend cannot hold it.
pub(crate) fn storage_type(dtype: DType) -> Option<DataType> {
    Some(match dtype {
        DType::F32 | DType::Flex32 => DataType::F32,
        DType::F16 => DataType::F16,
        DType::BF16 => DataType::BF16,
        DType::F64 => DataType::F64,
        DType::I64 => DataType::I64,
        DType::I32 => DataType::I32,
        DType::I8 => DataType::I8,
        DType::U8 => DataType::U8,
        DType::Bool(burn_backend::BoolStore::Native | burn_backend::BoolStore::U8) => DataType::Bool,
        _ => return None,
    })
}

/// The engine dtype for `dtype`, or a panic naming `op` and the supported dtypes.
pub(crate) fn engine_dtype(op: &str, dtype: DType) -> DataType {
    storage_type(dtype).unwrap_or_else(|| {
        panic!(
            "cudnn-backend: {op}: dtype {dtype:?} is not supported (supported: F32, Flex32, F16, BF16, F64, \
             I64, I32, I8, U8, Bool(Native), Bool(U8)); cast to a supported dtype first"
        )
    })
}

/// Burn shape from engine dims.
pub(crate) fn to_shape(dims: &[i64]) -> Shape {
    Shape::from(dims.iter().map(|&d| d as usize).collect::<Vec<_>>())
}

/// Engine dims from a Burn shape.
pub(crate) fn to_dims(shape: &Shape) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// Unwraps an engine result or panics with `cudnn-backend: <op>: <error>` (Burn's ops
/// return tensors, not results).
pub(crate) fn expect<T>(op: &str, r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("cudnn-backend: {op}: {e}"),
    }
}

impl CudnnTensor {
    /// A packed row-major tensor with uninitialised contents.
    pub(crate) fn empty(device: &Arc<runtime::Device>, dims: &[i64], dtype: DType, op: &str) -> Self {
        let elem = engine_dtype(op, dtype).size();
        let numel: i64 = dims.iter().product();
        let storage = expect(op, Storage::alloc(device, numel as usize * elem, "tensor allocation"));
        Self {
            storage,
            layout: ViewLayout::contiguous(dims),
            dtype,
        }
    }

    /// A packed tensor like `self` (same device and dims) of `dtype`.
    pub(crate) fn empty_like(&self, dtype: DType, op: &str) -> Self {
        Self::empty(self.device(), &self.layout.dims, dtype, op)
    }

    /// A packed tensor of `dims` on `self`'s device.
    pub(crate) fn empty_on(&self, dims: &[i64], dtype: DType, op: &str) -> Self {
        Self::empty(self.device(), dims, dtype, op)
    }

    /// Dims.
    pub(crate) fn dims(&self) -> &[i64] {
        &self.layout.dims
    }

    /// Number of elements.
    pub(crate) fn numel(&self) -> i64 {
        self.layout.numel()
    }

    /// Rank.
    pub(crate) fn rank(&self) -> usize {
        self.layout.dims.len()
    }

    /// The runtime device.
    pub(crate) fn device(&self) -> &Arc<runtime::Device> {
        self.storage.device()
    }

    /// The device's stream, where every op on this tensor is enqueued.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        self.storage.device().stream()
    }

    /// The Burn device.
    pub(crate) fn burn_device(&self) -> CudnnDevice {
        CudnnDevice::new(self.device().ordinal())
    }

    /// The engine dtype (panics for dtypes the backend cannot hold).
    pub(crate) fn kind(&self) -> DataType {
        engine_dtype("tensor", self.dtype)
    }

    /// The strided view the engine's ops and kernels take.
    pub(crate) fn tref(&self) -> TensorRef {
        self.layout.tensor_ref(self.kind(), self.storage.ptr())
    }

    /// Another view of the same buffer.
    pub(crate) fn with_layout(&self, layout: ViewLayout) -> Self {
        Self {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
        }
    }

    /// The same buffer and view under another dtype of the same storage type
    /// (e.g. `Bool(Native)` as `Bool(U8)`).
    pub(crate) fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// Row-major packed (size-1 dims may have any stride).
    pub(crate) fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// True when this tensor is the only view of a buffer it covers exactly, packed:
    /// an op may then write its result into it.
    pub(crate) fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
            && self.layout.offset == 0
            && self.is_contiguous()
            && self.numel() as usize * self.kind().size() == self.storage.bytes()
    }

    /// A packed row-major copy, or `self` when already packed.
    pub(crate) fn contiguous(self) -> Self {
        if self.is_contiguous() {
            return self;
        }
        super::exec::copy_to_new(&self, self.dtype, "contiguous")
    }

    /// The elements in row-major order under `dims`: a view when the strides allow,
    /// else a packed copy.
    pub(crate) fn reshape(self, dims: &[i64]) -> Self {
        let n: i64 = dims.iter().product();
        assert_eq!(
            n,
            self.numel(),
            "cudnn-backend: reshape: cannot reshape {:?} ({} elements) into {dims:?} ({n} elements)",
            self.dims(),
            self.numel()
        );
        if let Some(layout) = self.layout.reshape(dims) {
            return self.with_layout(layout);
        }
        let packed = super::exec::copy_to_new(&self, self.dtype, "reshape");
        let layout = ViewLayout {
            offset: packed.layout.offset,
            ..ViewLayout::contiguous(dims)
        };
        packed.with_layout(layout)
    }

    /// A view cuDNN accepts: positive strides without overlap (any dim order, so
    /// channels-last views go straight in); otherwise a packed copy.
    pub(crate) fn cudnn_ready(self) -> Self {
        let r = self.tref();
        if r.is_packed() && r.strides.iter().zip(&r.dims).all(|(&s, &d)| s > 0 || d == 1) {
            return self;
        }
        super::exec::copy_to_new(&self, self.dtype, "cudnn input")
    }

    /// Bytes of the packed view, read to the host (waits for the device's stream).
    pub(crate) fn read_bytes(self) -> Vec<u8> {
        let t = self.contiguous();
        let elem = t.kind().size();
        let start = t.layout.offset as usize * elem;
        let len = t.numel() as usize * elem;
        expect("into_data", t.storage.read(start, len))
    }
}

/// A quantized tensor: the int8 values and their f32 scales (one per tensor or per block).
#[derive(Clone, Debug)]
pub struct CudnnQTensor {
    /// The quantized values (dtype I8), shaped like the logical tensor.
    pub(crate) values: CudnnTensor,
    /// The scales (dtype F32): one element per tensor, or one per block.
    pub(crate) scales: CudnnTensor,
    /// The quantization scheme.
    pub(crate) scheme: QuantScheme,
}

impl TensorMetadata for CudnnQTensor {
    fn dtype(&self) -> DType {
        DType::QFloat(self.scheme)
    }

    fn shape(&self) -> Shape {
        self.values.shape()
    }

    fn rank(&self) -> usize {
        self.values.rank()
    }
}

impl QTensorPrimitive for CudnnQTensor {
    fn scheme(&self) -> &QuantScheme {
        &self.scheme
    }
}
