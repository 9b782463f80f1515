//! The tensor primitive: a shared device buffer plus a strided view (dims, strides,
//! offset) and a dtype. Views (transpose, permute, slice, expand, reshape of viewable
//! data) share the buffer; cuDNN and the kernels read the strides directly.

use std::sync::Arc;

use burn_backend::quantization::QuantScheme;
use burn_backend::{DType, QTensorPrimitive, Shape, TensorMetadata};
use cudarc::driver::CudaStream;

use super::device::CudnnDevice;
use super::memory::Storage;
use crate::error::{Error, Result};
use crate::graph::DataType;
use crate::runtime;
use crate::types::{TensorMut, TensorRef};
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

/// The dtypes the backend holds, as its messages name them.
const SUPPORTED_DTYPES: &str = "F32, Flex32, F16, BF16, F64, I64, I32, I8, U8, Bool(Native), Bool(U8)";

/// The engine dtype for `dtype`, or an error naming `op` and the supported dtypes.
pub(crate) fn engine_dtype(op: &str, dtype: DType) -> Result<DataType> {
    storage_type(dtype).ok_or_else(|| {
        Error::invalid_input(
            op,
            format!(
                "dtype {dtype:?} is not supported (supported: {SUPPORTED_DTYPES}); cast to a supported dtype first"
            ),
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

/// Bytes of a packed tensor of `dims` and `dtype`, or an error naming `op` when the dtype
/// is not one the backend holds, a dim is negative (a size that wrapped around) or the size
/// does not fit in the address space.
pub(crate) fn checked_bytes(op: &str, dims: &[i64], dtype: DType) -> Result<usize> {
    let Some(kind) = storage_type(dtype) else {
        return Err(Error::invalid_input(
            op,
            format!(
                "dtype {dtype:?} is not supported (supported: {SUPPORTED_DTYPES}); cast to a supported dtype first"
            ),
        ));
    };
    let elem = kind.size();
    let sizes: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    let bytes = sizes.and_then(|sizes| {
        if sizes.contains(&0) {
            return Some(0);
        }
        sizes
            .iter()
            .try_fold(elem, |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize)
    });
    bytes.ok_or_else(|| {
        Error::invalid_input(
            op,
            format!("shape {dims:?} of {dtype:?} is too large: its size in bytes overflows the address space"),
        )
    })
}

/// The read views of optional tensors.
pub(crate) fn tref_of(t: &Option<CudnnTensor>) -> Option<TensorRef<'_>> {
    t.as_ref().map(CudnnTensor::tref)
}

/// The write views of optional tensors (results allocated for the call).
pub(crate) fn tmut_of(t: &Option<CudnnTensor>) -> Option<TensorMut<'_>> {
    t.as_ref().map(CudnnTensor::tmut)
}

/// The trait boundary: unwraps a result of the Burn layer or panics with
/// `cudnn-backend: <op>: <error>` (Burn's op traits return tensors, not results). An error
/// that already names `op` is not prefixed twice (see [`Error::in_op`]).
pub(crate) fn expect<T>(op: &str, r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("cudnn-backend: {}", e.in_op(op)),
    }
}

/// Unwraps a result that cannot be an error for a well-formed tensor (a broken internal
/// invariant, not bad input), panicking with `what` otherwise.
fn invariant<T>(what: &str, r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("cudnn-backend: internal error: {what}: {e}"),
    }
}

impl CudnnTensor {
    /// A packed row-major tensor with uninitialised contents.
    pub(crate) fn empty(device: &Arc<runtime::Device>, dims: &[i64], dtype: DType, op: &str) -> Result<Self> {
        let bytes = checked_bytes(op, dims, dtype)?;
        Ok(Self {
            storage: Storage::alloc(device, bytes, "tensor allocation")?,
            layout: ViewLayout::contiguous(dims),
            dtype,
        })
    }

    /// A packed tensor like `self` (same device and dims) of `dtype`.
    pub(crate) fn empty_like(&self, dtype: DType, op: &str) -> Result<Self> {
        Self::empty(self.device(), &self.layout.dims, dtype, op)
    }

    /// A packed tensor of `dims` on `self`'s device.
    pub(crate) fn empty_on(&self, dims: &[i64], dtype: DType, op: &str) -> Result<Self> {
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

    /// The engine dtype. Every tensor holds a dtype the backend stores (allocation and
    /// upload reject or convert the others), so this cannot fail for a well-formed tensor.
    pub(crate) fn kind(&self) -> DataType {
        invariant("tensor dtype", engine_dtype("tensor", self.dtype))
    }

    /// The strided view the engine's ops and kernels read. A tensor's layout lies in its
    /// buffer (every op that makes a view checks it), so this cannot fail.
    pub(crate) fn tref(&self) -> TensorRef<'_> {
        let l = &self.layout;
        invariant(
            "tensor view",
            self.storage.view(l.offset, &l.dims, &l.strides, self.kind()),
        )
    }

    /// The strided view the engine's ops and kernels write: for a result this tensor was
    /// allocated for (or a buffer it owns alone). Cannot fail, as [`tref`](Self::tref).
    pub(crate) fn tmut(&self) -> TensorMut<'_> {
        let l = &self.layout;
        invariant(
            "tensor view",
            self.storage.view_mut(l.offset, &l.dims, &l.strides, self.kind()),
        )
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

    /// True when this tensor is the only view of a buffer it covers exactly, packed (row-major
    /// or channels-last): an op may then write its result into it.
    pub(crate) fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
            && self.layout.offset == 0
            && self.is_packed_either_format()
            && self.numel() as usize * self.kind().size() == self.storage.bytes()
    }
}

/// The strides of `dims` packed in dim order `order` (outermost first), when `strides`
/// equal them on every dim of size > 1; `None` otherwise.
pub(crate) fn packed_strides_in(dims: &[i64], strides: &[i64], order: &[usize]) -> Option<Vec<i64>> {
    let mut packed = vec![0i64; dims.len()];
    let mut next = 1i64;
    for &d in order.iter().rev() {
        if dims[d] != 1 && strides[d] != next {
            return None;
        }
        packed[d] = next;
        next *= dims[d];
    }
    Some(packed)
}

/// The normalised strides [`CudnnTensor::matmul_ready`] accepts for a non-empty operand of
/// `dims` (rank >= 2) with `strides`, or `None` when it needs a copy.
pub(crate) fn matmul_strides(dims: &[i64], strides: &[i64]) -> Option<Vec<i64>> {
    let r = dims.len();
    let (rows, cols) = (dims[r - 2], dims[r - 1]);
    let (sr, sc) = (strides[r - 2], strides[r - 1]);
    // Row-major: unit column stride, rows at least a row apart.
    let row_major = {
        let sc = if cols == 1 { 1 } else { sc };
        let sr = if rows == 1 { cols } else { sr };
        (sc == 1 && sr >= cols).then_some((sr, sc))
    };
    // Transposed: unit row stride, columns at least a column apart.
    let transposed = || {
        let sr = if rows == 1 { 1 } else { sr };
        let sc = if cols == 1 { rows } else { sc };
        (sr == 1 && sc >= rows).then_some((sr, sc))
    };
    let (sr, sc) = row_major.or_else(transposed)?;
    let span = (rows - 1) * sr + (cols - 1) * sc + 1;
    let mut out = strides.to_vec();
    out[r - 2] = sr;
    out[r - 1] = sc;
    let mut extent = span;
    for i in 0..r - 2 {
        if dims[i] != 1 {
            if strides[i] < span {
                return None;
            }
            extent = extent.max(dims[i] * strides[i]);
        }
    }
    for i in 0..r - 2 {
        if dims[i] == 1 {
            out[i] = extent;
        }
    }
    Some(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cudnn_layouts_are_row_major_or_channels_last() {
        let rm: Vec<usize> = vec![0, 1, 2, 3];
        let cl: Vec<usize> = vec![0, 2, 3, 1];
        // NCHW packed; size-1 dims get the packed stride whatever they had.
        assert_eq!(
            packed_strides_in(&[2, 3, 4, 5], &[60, 20, 5, 1], &rm),
            Some(vec![60, 20, 5, 1])
        );
        assert_eq!(
            packed_strides_in(&[1, 3, 1, 5], &[0, 5, 99, 1], &rm),
            Some(vec![15, 5, 5, 1])
        );
        // NHWC packed matches channels-last only.
        let nhwc = [60, 1, 15, 3];
        assert_eq!(packed_strides_in(&[2, 3, 4, 5], &nhwc, &rm), None);
        assert_eq!(packed_strides_in(&[2, 3, 4, 5], &nhwc, &cl), Some(nhwc.to_vec()));
        // Fully reversed (the conformance suite's permuted view) and gapped: neither.
        let rev = [1, 2, 6, 24];
        assert_eq!(packed_strides_in(&[2, 3, 4, 5], &rev, &rm), None);
        assert_eq!(packed_strides_in(&[2, 3, 4, 5], &rev, &cl), None);
        assert_eq!(packed_strides_in(&[2, 3, 4, 5], &[120, 40, 10, 2], &rm), None);
    }

    #[test]
    fn matmul_operands_are_row_major_or_transposed_with_outer_batches() {
        // Row-major, transposed, and a gapped leading dimension pass unchanged.
        assert_eq!(matmul_strides(&[2, 4, 5], &[20, 5, 1]), Some(vec![20, 5, 1]));
        assert_eq!(matmul_strides(&[2, 4, 5], &[20, 1, 4]), Some(vec![20, 1, 4]));
        assert_eq!(matmul_strides(&[4, 5], &[8, 1]), Some(vec![8, 1]));
        // The reversed permutation of [2, 4, 5] (batch innermost): copy.
        assert_eq!(matmul_strides(&[2, 4, 5], &[1, 2, 8]), None);
        // Batch dim interleaved with a transposed matrix: copy.
        assert_eq!(matmul_strides(&[3, 5, 6], &[6, 18, 1]), None);
        // Gapped columns and stride-0 batches: copy.
        assert_eq!(matmul_strides(&[4, 5], &[10, 2]), None);
        assert_eq!(matmul_strides(&[3, 4, 5], &[0, 5, 1]), None);
        // Size-1 dims are normalised: a row vector, a column vector, a unit batch.
        assert_eq!(matmul_strides(&[1, 5], &[0, 1]), Some(vec![5, 1]));
        assert_eq!(matmul_strides(&[4, 1], &[1, 0]), Some(vec![1, 1]));
        assert_eq!(matmul_strides(&[1, 4, 5], &[0, 1, 4]), Some(vec![20, 1, 4]));
        assert_eq!(matmul_strides(&[2, 1, 4, 5], &[20, 7, 5, 1]), Some(vec![20, 40, 5, 1]));
        // A strided row vector reads as a transposed matrix with a gapped leading dim.
        assert_eq!(matmul_strides(&[1, 5], &[9, 3]), Some(vec![1, 3]));
    }
}
