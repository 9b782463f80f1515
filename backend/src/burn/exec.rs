//! Tensor-level building blocks shared by the op traits: allocation of results, fills,
//! casts, elementwise unary/binary/compare/where with broadcasting, and scalars. Each
//! enqueues on the tensor's device stream and returns an engine error or an input error
//! naming the op.

use std::sync::Arc;

use burn_backend::{BoolDType, BoolStore, DType, Scalar};

use super::tensor::{engine_dtype, matmul_strides, packed_strides_in, CudnnTensor};
use crate::error::{Error, InOp, Result};
use crate::ops::elementwise::{self as ew, BinaryOp, CompareOp, UnaryOp};
use crate::runtime;
use crate::view::ViewLayout;

/// `dtype` filled with `value` (converted like a cast: ints truncate, bool is `!= 0`).
pub(crate) fn full(
    device: &Arc<runtime::Device>,
    dims: &[i64],
    dtype: DType,
    value: f64,
    op: &str,
) -> Result<CudnnTensor> {
    let out = CudnnTensor::empty(device, dims, dtype, op)?;
    ew::fill(device.stream(), &out.tmut(), value)?;
    Ok(out)
}

/// A Burn scalar as the `f64` the kernels take.
pub(crate) fn scalar_f64(s: Scalar) -> f64 {
    match s {
        Scalar::Float(v) => v,
        Scalar::Int(v) => v as f64,
        Scalar::UInt(v) => v as f64,
        Scalar::Bool(v) => v as u8 as f64,
    }
}

/// A one-element tensor of `dtype` holding `value`, broadcastable against rank `rank`.
pub(crate) fn scalar_tensor(like: &CudnnTensor, dtype: DType, value: f64, op: &str) -> Result<CudnnTensor> {
    let dims = vec![1i64; like.rank()];
    full(like.device(), &dims, dtype, value, op)
}

/// Writes `src` (any strides, any dtype) into the view `dst`, converting the dtype.
pub(crate) fn copy_into(src: &CudnnTensor, dst: &CudnnTensor, op: &str) -> Result<()> {
    check_same_device(op, src, dst)?;
    ew::copy(src.stream(), &src.tref(), &dst.tmut())
}

/// A packed copy of `src` as `dtype`.
pub(crate) fn copy_to_new(src: &CudnnTensor, dtype: DType, op: &str) -> Result<CudnnTensor> {
    let out = CudnnTensor::empty(src.device(), src.dims(), dtype, op)?;
    copy_into(src, &out, op)?;
    Ok(out)
}

/// `t` converted to `dtype`; the same tensor (a view) when the dtype already matches. A
/// converted copy keeps a channels-last format (see [`crate::burn::layout`]).
pub(crate) fn cast(t: CudnnTensor, dtype: DType, op: &str) -> Result<CudnnTensor> {
    if t.dtype == dtype {
        return Ok(t);
    }
    if engine_dtype(op, t.dtype)? == engine_dtype(op, dtype)? {
        return Ok(t.with_dtype(dtype));
    }
    let out = CudnnTensor::empty_for_operands(&[&t], t.dims(), dtype, op)?;
    copy_into(&t, &out, op)?;
    Ok(out)
}

/// The numpy-style broadcast of two dim lists, or an error naming `op` when incompatible.
pub(crate) fn broadcast_dims(op: &str, a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
    let rank = a.len().max(b.len());
    let at = |d: &[i64], i: usize| -> i64 {
        let pad = rank - d.len();
        if i < pad {
            1
        } else {
            d[i - pad]
        }
    };
    (0..rank)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            match (x, y) {
                _ if x == y => Ok(x),
                (1, _) => Ok(y),
                (_, 1) => Ok(x),
                _ => Err(Error::invalid_input(
                    op,
                    format!("shapes {a:?} and {b:?} cannot be broadcast together"),
                )),
            }
        })
        .collect()
}

/// `dims` with 1 on every dim (of size > 1) along which each of `operands` is constant: of
/// size 1 there or broadcast (stride 0), dims aligned to the right as in broadcasting. An
/// elementwise result then has one element per such dim, computed once and returned as a
/// broadcast view: no full-size write, and later reads of it stay broadcast reads. `None`
/// when no dim is constant, or when there is nothing to read (a fill).
pub(crate) fn constant_dims(dims: &[i64], operands: &[&CudnnTensor]) -> Option<Vec<i64>> {
    let layouts: Vec<&ViewLayout> = operands.iter().map(|t| &t.layout).collect();
    constant_dims_of(dims, &layouts)
}

/// [`constant_dims`] of operands with these layouts.
fn constant_dims_of(dims: &[i64], operands: &[&ViewLayout]) -> Option<Vec<i64>> {
    if operands.is_empty() {
        return None;
    }
    let rank = dims.len();
    let constant = |i: usize| {
        operands.iter().all(|l| {
            let pad = rank - l.dims.len().min(rank);
            i < pad || {
                let j = i - pad;
                l.dims[j] == 1 || l.strides[j] == 0
            }
        })
    };
    let small: Vec<i64> = (0..rank)
        .map(|i| if dims[i] > 1 && constant(i) { 1 } else { dims[i] })
        .collect();
    (small != dims).then_some(small)
}

/// `t` read over `small` (from [`constant_dims`]): each of its broadcast dims that `small`
/// makes 1 keeps its one element. A view.
pub(crate) fn narrowed(t: &CudnnTensor, small: &[i64]) -> CudnnTensor {
    let pad = small.len() - t.rank().min(small.len());
    let mut layout = t.layout.clone();
    for (j, d) in layout.dims.iter_mut().enumerate() {
        if small[pad + j] == 1 {
            *d = 1;
        }
    }
    t.with_layout(layout)
}

/// An error unless both tensors live on the same GPU.
pub(crate) fn check_same_device(op: &str, a: &CudnnTensor, b: &CudnnTensor) -> Result<()> {
    let (x, y) = (a.device().ordinal(), b.device().ordinal());
    if x != y {
        return Err(Error::invalid_input(
            op,
            format!("tensors are on different devices (GPU {x} and GPU {y}); move one with `to_device` first"),
        ));
    }
    Ok(())
}

/// An error unless both tensors have the same dtype (as Burn's reference backend requires).
pub(crate) fn check_same_dtype(op: &str, a: &CudnnTensor, b: &CudnnTensor) -> Result<()> {
    if engine_dtype(op, a.dtype)? != engine_dtype(op, b.dtype)? {
        return Err(Error::invalid_input(
            op,
            format!("data type mismatch ({:?} and {:?})", a.dtype, b.dtype),
        ));
    }
    Ok(())
}

/// Elementwise `op(x)` into a new packed tensor of `x`'s dtype and format (or into `x`
/// itself when it is the only view of its buffer).
pub(crate) fn unary(x: CudnnTensor, op: UnaryOp, name: &str) -> Result<CudnnTensor> {
    if let Some(small) = constant_dims(x.dims(), &[&x]) {
        let dims = x.dims().to_vec();
        return expand(unary(narrowed(&x, &small), op, name)?, &dims, name);
    }
    let out = if x.is_exclusive() {
        x.clone()
    } else {
        CudnnTensor::empty_for_operands(&[&x], x.dims(), x.dtype, name)?
    };
    ew::unary(x.stream(), op, &x.tref(), &out.tmut())?;
    Ok(out)
}

/// Elementwise `op(a, b)` with broadcasting into a new packed tensor of `a`'s dtype
/// (channels-last when an operand of the result's dims is).
pub(crate) fn binary(a: CudnnTensor, b: CudnnTensor, op: BinaryOp, name: &str) -> Result<CudnnTensor> {
    check_same_device(name, &a, &b)?;
    check_same_dtype(name, &a, &b)?;
    let dims = broadcast_dims(name, a.dims(), b.dims())?;
    if let Some(small) = constant_dims(&dims, &[&a, &b]) {
        let out = binary(narrowed(&a, &small), narrowed(&b, &small), op, name)?;
        return expand(out, &dims, name);
    }
    let out = if a.is_exclusive() && a.dims() == dims.as_slice() {
        a.clone()
    } else if b.is_exclusive() && b.dims() == dims.as_slice() && b.dtype == a.dtype {
        b.clone()
    } else {
        CudnnTensor::empty_for_operands(&[&a, &b], &dims, a.dtype, name)?
    };
    ew::binary(a.stream(), op, &a.tref(), &b.tref(), &out.tmut())?;
    Ok(out)
}

/// `op(a, s)` for a scalar `s` passed to the kernel by value (no one-element tensor, no
/// fill launch); into `a` itself when it is the only view of its buffer.
pub(crate) fn binary_scalar(a: CudnnTensor, s: f64, op: BinaryOp, name: &str) -> Result<CudnnTensor> {
    if let Some(small) = constant_dims(a.dims(), &[&a]) {
        let dims = a.dims().to_vec();
        return expand(binary_scalar(narrowed(&a, &small), s, op, name)?, &dims, name);
    }
    let out = if a.is_exclusive() {
        a.clone()
    } else {
        CudnnTensor::empty_for_operands(&[&a], a.dims(), a.dtype, name)?
    };
    ew::binary_scalar(a.stream(), op, &a.tref(), s, &out.tmut())?;
    Ok(out)
}

/// The bool dtype a comparison produces for Burn's requested `out` dtype (an error for
/// storages the backend does not hold).
pub(crate) fn bool_dtype(op: &str, out: BoolDType) -> Result<DType> {
    if matches!(out, BoolStore::U32) {
        return Err(Error::invalid_input(
            op,
            format!("bool storage {out:?} is not supported (use Bool(Native) or Bool(U8))"),
        ));
    }
    Ok(DType::Bool(out))
}

/// Elementwise comparison with broadcasting, into a new bool tensor.
pub(crate) fn compare(
    a: CudnnTensor,
    b: CudnnTensor,
    op: CompareOp,
    out: BoolDType,
    name: &str,
) -> Result<CudnnTensor> {
    check_same_device(name, &a, &b)?;
    check_same_dtype(name, &a, &b)?;
    let dims = broadcast_dims(name, a.dims(), b.dims())?;
    if let Some(small) = constant_dims(&dims, &[&a, &b]) {
        let small_out = compare(narrowed(&a, &small), narrowed(&b, &small), op, out, name)?;
        return expand(small_out, &dims, name);
    }
    let out = CudnnTensor::empty_for_operands(&[&a, &b], &dims, bool_dtype(name, out)?, name)?;
    ew::compare(a.stream(), op, &a.tref(), &b.tref(), &out.tmut())?;
    Ok(out)
}

/// Comparison against a scalar passed to the kernel by value.
pub(crate) fn compare_scalar(a: CudnnTensor, s: f64, op: CompareOp, out: BoolDType, name: &str) -> Result<CudnnTensor> {
    if let Some(small) = constant_dims(a.dims(), &[&a]) {
        let dims = a.dims().to_vec();
        return expand(compare_scalar(narrowed(&a, &small), s, op, out, name)?, &dims, name);
    }
    let out = CudnnTensor::empty_for_operands(&[&a], a.dims(), bool_dtype(name, out)?, name)?;
    ew::compare_scalar(a.stream(), op, &a.tref(), s, &out.tmut())?;
    Ok(out)
}

/// `cond ? a : b` elementwise with broadcasting; the result has `a`'s dtype.
pub(crate) fn where_(cond: CudnnTensor, a: CudnnTensor, b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    check_same_device(name, &cond, &a)?;
    check_same_device(name, &a, &b)?;
    check_same_dtype(name, &a, &b)?;
    let dims = broadcast_dims(name, &broadcast_dims(name, cond.dims(), a.dims())?, b.dims())?;
    if let Some(small) = constant_dims(&dims, &[&cond, &a, &b]) {
        let out = where_(
            narrowed(&cond, &small),
            narrowed(&a, &small),
            narrowed(&b, &small),
            name,
        )?;
        return expand(out, &dims, name);
    }
    let out = CudnnTensor::empty_for_operands(&[&cond, &a, &b], &dims, a.dtype, name)?;
    ew::where_(a.stream(), &cond.tref(), &a.tref(), &b.tref(), &out.tmut())?;
    Ok(out)
}

/// A view of `t` broadcast to `dims` (stride 0 on the expanded dims).
pub(crate) fn expand(t: CudnnTensor, dims: &[i64], op: &str) -> Result<CudnnTensor> {
    let layout = t.layout.expand(dims).in_op(op)?;
    Ok(t.with_layout(layout))
}

/// An uninitialised packed tensor on a Burn device.
pub(crate) fn empty(
    device: &super::CudnnDevice,
    shape: &burn_backend::Shape,
    dtype: DType,
    op: &str,
) -> Result<CudnnTensor> {
    let dims = super::tensor::to_dims(shape);
    // Reject impossible sizes before touching the device.
    super::tensor::checked_bytes(op, &dims, dtype)?;
    CudnnTensor::empty(&device.open()?, &dims, dtype, op)
}

/// Layout changes that may copy: a packed copy where the view cannot serve.
impl CudnnTensor {
    /// A packed row-major copy, or `self` when already packed.
    pub(crate) fn contiguous(self) -> Result<Self> {
        if self.is_contiguous() {
            return Ok(self);
        }
        copy_to_new(&self, self.dtype, "contiguous")
    }

    /// The elements in row-major order under `dims`: a view when the strides allow,
    /// else a packed copy. An error when the element counts differ.
    pub(crate) fn reshape(self, dims: &[i64]) -> Result<Self> {
        let n: i64 = dims.iter().product();
        if n != self.numel() {
            return Err(Error::invalid_input(
                "reshape",
                format!(
                    "cannot reshape {:?} ({} elements) into {dims:?} ({n} elements)",
                    self.dims(),
                    self.numel()
                ),
            ));
        }
        if let Some(layout) = self.layout.reshape(dims) {
            return Ok(self.with_layout(layout));
        }
        let packed = copy_to_new(&self, self.dtype, "reshape")?;
        let layout = ViewLayout {
            offset: packed.layout.offset,
            ..ViewLayout::contiguous(dims)
        };
        Ok(packed.with_layout(layout))
    }

    /// A view cuDNN's convolution and pooling engines handle reliably: packed row-major
    /// (`NCHW..`) or, at rank >= 3, packed channels-last (`NHWC`, `NDHWC`: dim 1 innermost),
    /// with every size-1 dim given the stride of that packed layout; any other layout
    /// (other dim orders, gaps, broadcasts) becomes one packed row-major copy. (Some
    /// engines, notably half-precision ones, return wrong results for other dim orders.)
    pub(crate) fn cudnn_ready(self) -> Result<Self> {
        let dims = &self.layout.dims;
        let r = dims.len();
        if self.numel() == 0 {
            let layout = ViewLayout {
                offset: self.layout.offset,
                ..ViewLayout::contiguous(dims)
            };
            return Ok(self.with_layout(layout));
        }
        let row_major: Vec<usize> = (0..r).collect();
        let mut orders = vec![row_major];
        if r >= 3 {
            orders.push(crate::types::channels_last_order(r));
        }
        for order in &orders {
            if let Some(strides) = packed_strides_in(dims, &self.layout.strides, order) {
                let layout = ViewLayout {
                    strides: strides.into(),
                    ..self.layout.clone()
                };
                return Ok(self.with_layout(layout));
            }
        }
        copy_to_new(&self, self.dtype, "cudnn input")
    }

    /// A view cuDNN's matmul engines handle reliably, for an operand `[batch.., R, C]` of
    /// rank >= 2: the matrix row-major (`stride[-1] == 1`, `stride[-2] >= C`) or transposed
    /// (`stride[-2] == 1`, `stride[-1] >= R`), and every batch dim of size > 1 strided past
    /// the whole matrix (so each batch is a separate, non-interleaved matrix); size-1 dims get
    /// strides that satisfy this. Anything else (e.g. a batch dim innermost, gapped columns,
    /// stride-0 batch dims: squash those to size 1 first) becomes one packed row-major copy.
    /// An error for an operand of rank < 2.
    pub(crate) fn matmul_ready(self) -> Result<Self> {
        if self.rank() < 2 {
            return Err(Error::invalid_input(
                "matmul",
                format!("operand {:?} needs rank >= 2", self.dims()),
            ));
        }
        if self.numel() == 0 {
            return Ok(self);
        }
        match matmul_strides(&self.layout.dims, &self.layout.strides) {
            Some(strides) => {
                let layout = ViewLayout {
                    strides: strides.into(),
                    ..self.layout.clone()
                };
                Ok(self.with_layout(layout))
            }
            None => copy_to_new(&self, self.dtype, "matmul input"),
        }
    }

    /// Bytes of the packed view, read to the host (waits for the device's stream).
    pub(crate) fn read_bytes(self) -> Result<Vec<u8>> {
        let t = self.contiguous()?;
        let elem = t.kind().size();
        let start = t.layout.offset as usize * elem;
        let len = t.numel() as usize * elem;
        t.storage.read(start, len)
    }
}

#[cfg(test)]
mod tests {
    use super::constant_dims_of;
    use crate::view::ViewLayout;

    fn layout(dims: &[i64], strides: &[i64]) -> ViewLayout {
        ViewLayout::strided(dims, strides)
    }

    #[test]
    fn dims_no_operand_varies_along_are_found_broadcast_or_expanded() {
        // ones([16, 1152]) expanded from one element, times g: [16, 1] (burn-autodiff's
        // mean_dim backward): nothing varies along dim 1.
        let ones = layout(&[16, 1152], &[0, 0]);
        let g = layout(&[16, 1], &[1, 1]);
        assert_eq!(constant_dims_of(&[16, 1152], &[&ones, &g]), Some(vec![16, 1]));
        // A lower-rank operand aligns to the right: [C] against [N, C] leaves dim 0 constant
        // only if the other operand is constant there too.
        let row = layout(&[4], &[1]);
        let full = layout(&[3, 4], &[4, 1]);
        assert_eq!(constant_dims_of(&[3, 4], &[&row]), Some(vec![1, 4]));
        assert_eq!(constant_dims_of(&[3, 4], &[&row, &full]), None);
        // Nothing to read (a fill) or nothing constant: no change.
        assert_eq!(constant_dims_of(&[3, 4], &[]), None);
        assert_eq!(constant_dims_of(&[3, 1], &[&layout(&[3, 1], &[1, 1])]), None);
    }
}
