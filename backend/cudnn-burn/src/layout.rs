//! Operand layouts: CubeCL stores tensors made from host data *pitched* (each row padded to
//! 16 bytes), and its views may be permuted or broadcast. cuDNN rejects some strided filters
//! and runs strided activations slowly, so every operand that is not packed row-major is
//! copied into a packed buffer before the engine runs the operation.

use std::sync::Arc;

use cudnn_backend_core::cudarc::driver::CudaStream;
use cudnn_backend_core::ops::elementwise::copy;
use cudnn_backend_core::ops::{TensorMut, TensorRef};
use cudnn_backend_core::types::{row_major_strides, DataType};

/// Row-major strides (in elements) of a packed tensor of `dims`.
pub fn contiguous(dims: &[usize]) -> Vec<usize> {
    row_major_strides(&to_i64(dims)).iter().map(|&s| s as usize).collect()
}

/// Whether `strides` lay `dims` out row-major with no gaps (the strides of size-1 dims do not
/// matter: no two elements differ in them).
pub fn is_packed(dims: &[usize], strides: &[usize]) -> bool {
    dims.len() == strides.len()
        && dims
            .iter()
            .zip(strides.iter().zip(&contiguous(dims)))
            .all(|(&d, (&s, &w))| d == 1 || s == w)
}

/// Elements of a tensor of `dims`.
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// `usize` values as the `i64`s the engine's views take.
pub fn to_i64(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// `src` itself when `packed` is `None`, else a packed copy of it made on `stream` at
/// address `packed`.
///
/// # Safety
/// `packed`, when given, addresses `dims`' element count of `dtype` on `stream`'s device,
/// alive and used by no other work until the returned view's last use on `stream`.
pub unsafe fn packed_view<'a>(
    stream: &Arc<CudaStream>,
    src: TensorRef<'a>,
    packed: Option<u64>,
    dims: &[usize],
    dtype: DataType,
) -> cudnn_backend_core::Result<TensorRef<'a>> {
    let Some(ptr) = packed else { return Ok(src) };
    let (dims, strides) = (to_i64(dims), to_i64(&contiguous(dims)));
    // SAFETY: the caller guarantees `ptr` holds `dims`' elements of `dtype`, exclusively ours.
    let dst = unsafe { TensorMut::from_raw(&dims, &strides, dtype, ptr) };
    copy(stream, &src, &dst)?;
    // SAFETY: as above; the copy into it is enqueued on `stream` before any later reader.
    Ok(unsafe { TensorRef::from_raw(&dims, &strides, dtype, ptr) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides() {
        assert_eq!(contiguous(&[64, 128, 28, 28]), vec![128 * 28 * 28, 28 * 28, 28, 1]);
        assert_eq!(contiguous(&[5]), vec![1]);
        assert_eq!(contiguous(&[]), Vec::<usize>::new());
    }

    #[test]
    fn pitched_rows_are_not_packed() {
        // [2, 3, 3, 3] f32 with rows padded to 16 bytes (4 elements): the filter cuDNN rejects.
        assert!(!is_packed(&[2, 3, 3, 3], &[36, 12, 4, 1]));
        assert!(is_packed(&[2, 3, 3, 3], &[27, 9, 3, 1]));
    }

    #[test]
    fn size_one_dims_and_permutations() {
        assert!(is_packed(&[1, 8, 1, 1], &[999, 1, 7, 3]));
        // NHWC strides of an NCHW-shaped tensor: packed in memory, not row-major.
        assert!(!is_packed(&[2, 8, 4, 4], &[128, 1, 32, 8]));
        assert!(!is_packed(&[2, 8], &[8]), "rank mismatch");
        assert!(!is_packed(&[4, 4], &[0, 1]), "broadcast");
    }
}
