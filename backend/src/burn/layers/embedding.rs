//! Embeddings (forward and backward) and im2col through the index kernels.

use burn_backend::DType;

use super::*;
use crate::burn::exec;
use crate::burn::tensor::CudnnTensor;
use crate::ops::index as kindex;
use crate::view::ViewLayout;

/// `indices` flattened to 1-D, as I64 or I32 (what the index kernels take).
fn flat_indices(indices: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    let idx = match indices.dtype {
        DType::I64 | DType::I32 => indices,
        DType::I8 | DType::U8 => exec::cast(indices, DType::I64, op)?,
        other => {
            return Err(Error::invalid_input(
                op,
                format!("indices of dtype {other:?} are not supported (use I64 or I32)"),
            ))
        }
    };
    let n = idx.numel();
    idx.reshape(&[n])
}

/// `weights [V, D]` rows selected by `indices [..]` → `[.., D]`.
pub(crate) fn embedding(weights: CudnnTensor, indices: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "embedding";
    exec::check_same_device(OP, &weights, &indices)?;
    let mut dims = indices.dims().to_vec();
    let d = weights.dims()[1];
    dims.push(d);
    let idx = flat_indices(indices, OP)?;
    let out = weights.empty_on(&[idx.numel(), d], weights.dtype, OP)?;
    kindex::index_select(out.stream(), &weights.tref(), 0, &idx.tref(), &out.tmut())?;
    out.reshape(&dims)
}

/// Gradient of [`embedding`]: the rows of `dy [.., D]` added into zeros `[V, D]` at
/// `indices` (duplicates accumulate).
pub(crate) fn embedding_backward(weights: &CudnnTensor, dy: CudnnTensor, indices: CudnnTensor) -> Result<CudnnTensor> {
    const OP: &str = "embedding_backward";
    exec::check_same_device(OP, &dy, &indices)?;
    let [v, d] = [weights.dims()[0], weights.dims()[1]];
    let idx = flat_indices(indices, OP)?;
    let dtype = dy.dtype;
    // Half-precision rows are summed in an f32 table and rounded once (the sorted row adds
    // of `index_add` would round each chunk's sum into a half table).
    let work = compute_dtype(dtype);
    let dy = exec::cast(dy.reshape(&[idx.numel(), d])?, work, OP)?;
    let out = exec::full(dy.device(), &[v, d], work, 0.0, OP)?;
    kindex::index_add(out.stream(), &out.tmut(), 0, &idx.tref(), &dy.tref())?;
    exec::cast(out, dtype, OP)
}

/// im2col: `x [N, C, H, W]` → `[N, C·kh·kw, L]` (PyTorch's `unfold`), as one strided copy
/// of a zero-padded input.
pub(crate) fn unfold4d(
    x: CudnnTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> Result<CudnnTensor> {
    const OP: &str = "unfold4d";
    let d = x.dims().to_vec();
    if d.len() != 4 {
        return Err(Error::invalid_input(OP, format!("input {d:?} must be [N, C, H, W]")));
    }
    let [k0, k1] = kernel.map(|v| v as i64);
    let [s0, s1] = stride.map(|v| v as i64);
    let [p0, p1] = padding.map(|v| v as i64);
    let [d0, d1] = dilation.map(|v| v as i64);
    let (hp, wp) = (d[2] + 2 * p0, d[3] + 2 * p1);
    let (e0, e1) = (d0 * (k0 - 1) + 1, d1 * (k1 - 1) + 1);
    if !(k0 > 0 && k1 > 0 && hp >= e0 && wp >= e1) {
        return Err(Error::invalid_input(
            OP,
            format!("kernel {kernel:?} (dilation {dilation:?}) does not fit the padded input {hp}x{wp}"),
        ));
    }
    let (oh, ow) = ((hp - e0) / s0 + 1, (wp - e1) / s1 + 1);
    let xp = if p0 == 0 && p1 == 0 {
        x
    } else {
        let xp = exec::full(x.device(), &[d[0], d[1], hp, wp], x.dtype, 0.0, OP)?;
        let inner = narrow(&narrow(&xp, OP, 2, p0, p0 + d[2])?, OP, 3, p1, p1 + d[3])?;
        exec::copy_into(&x, &inner, OP)?;
        xp
    };
    let st = &xp.layout.strides;
    let windows = ViewLayout {
        dims: crate::types::Shape::from_slice(&[d[0], d[1], k0, k1, oh, ow]),
        strides: crate::types::Shape::from_slice(&[st[0], st[1], d0 * st[2], d1 * st[3], s0 * st[2], s1 * st[3]]),
        offset: xp.layout.offset,
    };
    let cols = exec::copy_to_new(&xp.with_layout(windows), xp.dtype, OP)?;
    cols.reshape(&[d[0], d[1] * k0 * k1, oh * ow])
}
