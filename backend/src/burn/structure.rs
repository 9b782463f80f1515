//! Shape, indexing, creation and cast ops shared by the float, int and bool op traits.
//!
//! Every function here is dtype-agnostic: the float, int and bool trait methods call the same
//! function with their op name (used in error messages). Views (permute, swap, transpose,
//! expand, unfold, reshape of viewable layouts, slices whose strides stay non-negative) share
//! the buffer; everything else runs in the kernel families of [`crate::ops`] on the tensor's
//! stream. The only host read is the element count of [`argwhere`] (its output shape depends
//! on the data).

use std::ops::Range;
use std::sync::Arc;

use burn_backend::ops::{GridSampleOptions, GridSamplePaddingMode, InterpolateMode};
use burn_backend::tensor::IndexingUpdateOp;
use burn_backend::{DType, IntDType, Scalar, Shape, Slice};

use super::exec::{self, check_same_device, check_same_dtype};
use super::tensor::{to_dims, CudnnTensor};
use super::CudnnDevice;
use crate::error::{Error, InOp, Result};
use crate::graph::{packed_strides, DataType};
use crate::ops::elementwise::{self as ew, BinaryOp, UnaryOp};
use crate::ops::reduce::{self as red, ScanOp};
use crate::ops::{index as ix, resize};
use crate::runtime;
use crate::types::{TensorMut, TensorRef};
use crate::view::ViewLayout;

// ---------------------------------------------------------------------------------------
// Creation

/// Largest magnitude up to which every integer is exact in an `f64`.
const F64_EXACT: i64 = 1 << 53;

/// Writes the scalar `s` into every element of `out` (a writable view). Integer scalars are
/// converted exactly (wrapping to the width of an integer dtype), also beyond 2^53 for I64.
fn fill_scalar(out: &CudnnTensor, s: Scalar) -> Result<()> {
    let stream = out.stream();
    let kind = out.kind();
    let int = match s {
        Scalar::Int(v) => Some(v),
        Scalar::UInt(v) => Some(v as i64),
        _ => None,
    };
    let value = match (int, kind) {
        (Some(v), DataType::I64) if !(-F64_EXACT..=F64_EXACT).contains(&v) => {
            // The kernels take the value as f64: write the two 32-bit halves separately
            // (little-endian), each exact as an i32.
            let l = &out.layout;
            let strides: Vec<i64> = l.strides.iter().map(|&s| s * 2).collect();
            let half = |k: i64| out.storage.view_mut(2 * l.offset + k, &l.dims, &strides, DataType::I32);
            let (low, high) = (half(0)?, half(1)?);
            ew::fill(stream, &low, v as i32 as f64)?;
            return ew::fill(stream, &high, (v >> 32) as i32 as f64);
        }
        (Some(v), DataType::I32) => v as i32 as f64,
        (Some(v), DataType::I8) => v as i8 as f64,
        (Some(v), DataType::U8) => v as u8 as f64,
        _ => exec::scalar_f64(s),
    };
    ew::fill(stream, &out.tmut(), value)
}

/// A packed tensor of `shape` and `dtype` on `device`, every element `value`.
pub(crate) fn full(device: &CudnnDevice, shape: &Shape, dtype: DType, value: Scalar, op: &str) -> Result<CudnnTensor> {
    let out = exec::empty(device, shape, dtype, op)?;
    fill_scalar(&out, value)?;
    Ok(out)
}

/// A float tensor of `shape` whose every element is `value`, as one stored element expanded
/// to the shape (stride 0 along every dim): `zeros`, `ones` and `full` write one element, not
/// the whole tensor (burn-autodiff's `sum_dim` backward, say, multiplies a full-size `ones`
/// by the gradient). Readers take it as any strided view; nothing writes into it in place
/// (in-place paths take only packed tensors they hold alone). A shape larger than the
/// device's memory is an out-of-memory error, as for a packed tensor.
pub(crate) fn constant(
    device: &CudnnDevice,
    shape: &Shape,
    dtype: DType,
    value: Scalar,
    op: &str,
) -> Result<CudnnTensor> {
    let dims = to_dims(shape);
    // A shape no packed tensor could have on this device is rejected as for one (as PyTorch
    // fails to allocate it), though only one element is stored.
    let bytes = super::tensor::checked_bytes(op, &dims, dtype)?;
    if dims.iter().product::<i64>() <= 1 {
        return full(device, shape, dtype, value, op);
    }
    let total = device.open()?.info().total_memory;
    if bytes > total {
        return Err(Error::OutOfMemory {
            op: "a constant tensor",
            bytes,
            message: format!("the device holds {total} bytes"),
        });
    }
    let one = full(device, &Shape::from(vec![1usize; dims.len()]), dtype, value, op)?;
    exec::expand(one, &dims, op)
}

/// A one-element tensor of `like`'s dtype and rank holding `value` (broadcasts against `like`).
fn scalar_like(like: &CudnnTensor, value: Scalar, op: &str) -> Result<CudnnTensor> {
    let out = like.empty_on(&vec![1; like.rank()], like.dtype, op)?;
    fill_scalar(&out, value)?;
    Ok(out)
}

/// `start, start + step, …` below `range.end` as a 1-D tensor of `dtype`, computed on the
/// device: a cumulative sum of `step`s plus `start - step` (exact integer arithmetic,
/// wrapping to the width of `dtype`).
pub(crate) fn arange(
    device: &Arc<runtime::Device>,
    range: Range<i64>,
    step: usize,
    dtype: DType,
    op: &str,
) -> Result<CudnnTensor> {
    if step == 0 {
        return Err(Error::invalid_input(op, "step must be positive, got 0"));
    }
    let len = if range.end > range.start {
        ((range.end as i128 - range.start as i128 + step as i128 - 1) / step as i128) as i64
    } else {
        0
    };
    let steps = exec::full(device, &[len], dtype, step as f64, op)?;
    let out = CudnnTensor::empty(device, &[len], dtype, op)?;
    red::scan(out.stream(), ScanOp::CumSum, &steps.tref(), 0, &out.tmut())?;
    let shift = range.start.wrapping_sub(step as i64);
    if shift != 0 {
        let s = out.empty_on(&[1], dtype, op)?;
        fill_scalar(&s, Scalar::Int(shift))?;
        let r = out.tmut();
        ew::binary(out.stream(), BinaryOp::Add, &r, &s.tref(), &r)?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Views

/// An error naming `op` unless `dim` is a dim of a tensor of rank `rank`.
fn check_dim(op: &str, dim: usize, rank: usize) -> Result<()> {
    if dim >= rank {
        return Err(Error::invalid_input(
            op,
            format!("dim {dim} out of range for rank {rank}"),
        ));
    }
    Ok(())
}

/// `t` under `shape` (row-major order): a view when the strides allow, else a packed copy.
pub(crate) fn reshape(t: CudnnTensor, shape: &Shape) -> Result<CudnnTensor> {
    t.reshape(&to_dims(shape))
}

/// Dims `a` and `b` swapped (a view).
pub(crate) fn swap_dims(t: CudnnTensor, a: usize, b: usize, op: &str) -> Result<CudnnTensor> {
    let layout = t.layout.transpose(a, b).in_op(op)?;
    Ok(t.with_layout(layout))
}

/// The last two dims swapped (a view; rank < 2 is returned unchanged).
pub(crate) fn transpose(t: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    let rank = t.rank();
    if rank < 2 {
        return Ok(t);
    }
    swap_dims(t, rank - 2, rank - 1, op)
}

/// Dim `i` of the result is dim `axes[i]` of `t` (a view).
pub(crate) fn permute(t: CudnnTensor, axes: &[usize], op: &str) -> Result<CudnnTensor> {
    let layout = t.layout.permute(axes).in_op(op)?;
    Ok(t.with_layout(layout))
}

/// `t` broadcast to `shape` (a view with stride 0 on the expanded dims).
pub(crate) fn expand(t: CudnnTensor, shape: &Shape, op: &str) -> Result<CudnnTensor> {
    exec::expand(t, &to_dims(shape), op)
}

/// Windows of `size` every `step` along `dim`: that dim becomes the window count and a
/// trailing dim of `size` is appended (a view; no window when `size` exceeds the dim).
pub(crate) fn unfold(t: CudnnTensor, dim: usize, size: usize, step: usize, op: &str) -> Result<CudnnTensor> {
    check_dim(op, dim, t.rank())?;
    let (size, step) = (size as i64, step as i64);
    if size > t.dims()[dim] && step > 0 {
        let mut dims = t.dims().to_vec();
        dims[dim] = 0;
        dims.push(size);
        return Ok(t.with_layout(ViewLayout {
            offset: t.layout.offset,
            ..ViewLayout::contiguous(&dims)
        }));
    }
    let layout = t.layout.unfold(dim, size, step).in_op(op)?;
    Ok(t.with_layout(layout))
}

// ---------------------------------------------------------------------------------------
// Slices and flips (signed strides)

/// A strided view whose strides may be negative: what slices with negative steps and flips
/// read or write.
struct SignedView {
    dims: crate::types::Shape,
    strides: crate::types::Shape,
    /// Element offset of element (0, …, 0) from the buffer start.
    offset: i64,
}

impl SignedView {
    /// The same view as `layout`.
    fn of(layout: &ViewLayout) -> Self {
        Self {
            dims: layout.dims.clone(),
            strides: layout.strides.clone(),
            offset: layout.offset,
        }
    }

    /// The view as a [`ViewLayout`] when no stride that matters (dim > 1) is negative.
    fn as_layout(&self) -> Option<ViewLayout> {
        if self.dims.iter().zip(&self.strides).any(|(&d, &s)| d > 1 && s < 0) {
            return None;
        }
        Some(ViewLayout {
            dims: self.dims.clone(),
            strides: self.strides.iter().map(|s| s.abs()).collect(),
            offset: self.offset,
        })
    }

    /// The view as a kernel operand over `t`'s buffer (an error when it leaves the buffer).
    fn tref<'t>(&self, t: &'t CudnnTensor) -> Result<TensorRef<'t>> {
        t.storage.view(self.offset, &self.dims, &self.strides, t.kind())
    }

    /// The view as a kernel output over `t`'s buffer (an error when it leaves the buffer).
    fn tmut<'t>(&self, t: &'t CudnnTensor) -> Result<TensorMut<'t>> {
        t.storage.view_mut(self.offset, &self.dims, &self.strides, t.kind())
    }
}

/// The view of `layout` that Burn's `slices` select (missing trailing slices take whole dims;
/// negative start/end count from the end; a negative step walks the range backwards from its
/// last element, as ndarray does).
fn slice_view(layout: &ViewLayout, slices: &[Slice], op: &str) -> Result<SignedView> {
    if slices.len() > layout.dims.len() {
        return Err(Error::invalid_input(
            op,
            format!(
                "{} slices given for a tensor of rank {}",
                slices.len(),
                layout.dims.len()
            ),
        ));
    }
    let mut v = SignedView::of(layout);
    for (d, s) in slices.iter().enumerate() {
        let n = v.dims[d] as usize;
        let range = s.to_range(n);
        let len = s.output_size(n) as i64;
        let first = match len {
            0 => 0,
            _ if s.step > 0 => range.start as i64,
            _ => range.end as i64 - 1,
        };
        v.offset += first * v.strides[d];
        v.dims[d] = len;
        v.strides[d] *= s.step as i64;
    }
    Ok(v)
}

/// A packed copy of the signed view `v` of `t`.
fn copy_view(t: &CudnnTensor, v: &SignedView, op: &str) -> Result<CudnnTensor> {
    let out = t.empty_on(&v.dims, t.dtype, op)?;
    ew::copy(t.stream(), &v.tref(t)?, &out.tmut())?;
    Ok(out)
}

/// Burn's `slice`: a view for non-negative resulting strides, else a packed copy read
/// through negative strides. An error when the slices leave the tensor.
pub(crate) fn slice(t: CudnnTensor, slices: &[Slice], op: &str) -> Result<CudnnTensor> {
    let v = slice_view(&t.layout, slices, op)?;
    // Check that the view lies in the buffer before a tensor carries it.
    v.tref(&t).in_op(op)?;
    match v.as_layout() {
        Some(layout) => Ok(t.with_layout(layout)),
        None => copy_view(&t, &v, op),
    }
}

/// `t` itself when it is the only view of its packed buffer and already of `dtype` (an op may
/// then write into it), else a packed copy converted to `dtype`.
pub(crate) fn owned(t: CudnnTensor, dtype: DType, op: &str) -> Result<CudnnTensor> {
    if t.dtype == dtype && t.is_exclusive() {
        return Ok(t);
    }
    exec::copy_to_new(&t, dtype, op)
}

/// Burn's `slice_assign`: `t` with the sliced region replaced by `value` (broadcast to the
/// region). Functional: `t` is copied first unless nothing else can see its buffer.
pub(crate) fn slice_assign(t: CudnnTensor, slices: &[Slice], value: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    check_same_device(op, &t, &value)?;
    check_same_dtype(op, &t, &value)?;
    let dtype = t.dtype;
    let out = owned(t, dtype, op)?;
    let dst = slice_view(&out.layout, slices, op)?;
    ew::copy(out.stream(), &value.tref(), &dst.tmut(&out).in_op(op)?)?;
    Ok(out)
}

/// `layout` reversed along `axes` (dims of one element or stride 0 are left as they are).
fn flip_view(layout: &ViewLayout, axes: &[usize], op: &str) -> Result<SignedView> {
    let mut v = SignedView::of(layout);
    for &a in axes {
        if a >= v.dims.len() {
            return Err(Error::invalid_input(
                op,
                format!("axis {a} out of range for rank {}", v.dims.len()),
            ));
        }
        if v.dims[a] > 1 && v.strides[a] > 0 {
            v.offset += (v.dims[a] - 1) * v.strides[a];
            v.strides[a] = -v.strides[a];
        }
    }
    Ok(v)
}

/// Elements reversed along `axes` (a packed copy read through negative strides; `t` itself
/// when every flipped dim has one element or stride 0).
pub(crate) fn flip(t: CudnnTensor, axes: &[usize], op: &str) -> Result<CudnnTensor> {
    let v = flip_view(&t.layout, axes, op)?;
    match v.as_layout() {
        Some(layout) => Ok(t.with_layout(layout)),
        None => copy_view(&t, &v, op),
    }
}

// ---------------------------------------------------------------------------------------
// Concatenation and repetition

/// `t` repeated `times` along `dim` (tiled: `[a, b]` → `[a, b, a, b]`): one copy of a
/// broadcast view into a packed `[.., times, len, ..]` buffer, viewed as `[.., times·len, ..]`.
pub(crate) fn repeat_dim(t: CudnnTensor, dim: usize, times: usize, op: &str) -> Result<CudnnTensor> {
    check_dim(op, dim, t.rank())?;
    if times == 1 {
        return Ok(t);
    }
    let mut tiled = t.dims().to_vec();
    tiled.insert(dim, times as i64);
    let src = t.layout.unsqueeze(dim).and_then(|l| l.expand(&tiled)).in_op(op)?;
    let out = t.empty_on(&tiled, t.dtype, op)?;
    exec::copy_into(&t.with_layout(src), &out, op)?;
    let mut dims = t.dims().to_vec();
    dims[dim] *= times as i64;
    out.reshape(&dims)
}

/// `tensors` joined along `dim` (one copy per input into its slice of the output).
pub(crate) fn cat(tensors: Vec<CudnnTensor>, dim: usize, op: &str) -> Result<CudnnTensor> {
    let mut tensors = tensors;
    if tensors.len() == 1 {
        if let Some(t) = tensors.pop() {
            return Ok(t);
        }
    }
    let Some(first) = tensors.first() else {
        return Err(Error::invalid_input(op, "no tensors to concatenate; pass at least one"));
    };
    let rank = first.rank();
    check_dim(op, dim, rank)?;
    let mut dims = first.dims().to_vec();
    dims[dim] = 0;
    for t in &tensors {
        check_same_device(op, first, t)?;
        check_same_dtype(op, first, t)?;
        let same = t.rank() == rank && (0..rank).all(|d| d == dim || t.dims()[d] == first.dims()[d]);
        if !same {
            return Err(Error::invalid_input(
                op,
                format!("shapes {:?} and {:?} differ outside dim {dim}", first.dims(), t.dims()),
            ));
        }
        dims[dim] += t.dims()[dim];
    }
    let out = first.empty_on(&dims, first.dtype, op)?;
    let mut start = 0;
    for t in &tensors {
        let len = t.dims()[dim];
        if t.numel() > 0 {
            let region = out.layout.slice(dim, start, start + len, 1)?;
            exec::copy_into(t, &out.with_layout(region), op)?;
        }
        start += len;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Casts and masks

/// `t` converted to `dtype` (a view when the storage type already matches; float → int
/// truncates toward zero, anything → bool is `!= 0`).
pub(crate) fn cast(t: CudnnTensor, dtype: DType, op: &str) -> Result<CudnnTensor> {
    exec::cast(t, dtype, op)
}

/// `cond ? a : b` elementwise with broadcasting, written into `b` when it is the only view of
/// its buffer and already has the output dims.
fn where_into_b(cond: &CudnnTensor, a: &CudnnTensor, b: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    check_same_device(op, cond, a)?;
    check_same_device(op, a, &b)?;
    check_same_dtype(op, a, &b)?;
    let dims = exec::broadcast_dims(op, &exec::broadcast_dims(op, cond.dims(), a.dims())?, b.dims())?;
    let out = if b.is_exclusive() && b.dims() == dims.as_slice() {
        b.clone()
    } else {
        CudnnTensor::empty_for_operands(&[cond, a, &b], &dims, b.dtype, op)?
    };
    ew::where_(b.stream(), &cond.tref(), &a.tref(), &b.tref(), &out.tmut())?;
    Ok(out)
}

/// Burn's `mask_where`: `value` where `mask` is true, else `t` (broadcast together).
pub(crate) fn mask_where(t: CudnnTensor, mask: CudnnTensor, value: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    where_into_b(&mask, &value, t, op)
}

/// Burn's `mask_fill`: `value` where `mask` is true, else `t`.
pub(crate) fn mask_fill(t: CudnnTensor, mask: CudnnTensor, value: Scalar, op: &str) -> Result<CudnnTensor> {
    let fill = scalar_like(&t, value, op)?;
    where_into_b(&mask, &fill, t, op)
}

// ---------------------------------------------------------------------------------------
// Gather / scatter / select

/// Indices in a dtype the index kernels read (I64 or I32 as given, others converted to I64).
fn index_tensor(indices: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    match indices.kind() {
        DataType::I64 | DataType::I32 => Ok(indices),
        _ => exec::copy_to_new(&indices, DType::I64, op),
    }
}

/// The dtype the atomic adds run in for `t`, given how many updates (`updates`) go into its
/// `axis_len` slices along the axis: its own when supported, else I32 (narrow ints and bool;
/// bool results are `!= 0`, so adding is a logical or). F16 and BF16 sum in F32 when some
/// slice must take several updates (an embedding's gradient, positions repeated over a
/// batch): 32-bit float atomics keep their rate when many threads add into one element,
/// where 16-bit ones slow to a crawl, and the sum is rounded once instead of at every add.
fn accumulation_dtype(dtype: DType, updates: i64, axis_len: i64) -> DType {
    match crate::burn::tensor::storage_type(dtype) {
        Some(DataType::F16 | DataType::BF16) if updates > axis_len => DType::F32,
        Some(DataType::F32 | DataType::F16 | DataType::BF16 | DataType::F64 | DataType::I32 | DataType::I64) => dtype,
        _ => DType::I32,
    }
}

/// Burn's `gather`: `out[.., i, ..] = t[.., indices[.., i, ..], ..]` along `dim`; `out` has
/// the indices' dims and `t`'s dtype.
pub(crate) fn gather(dim: usize, t: CudnnTensor, indices: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    check_same_device(op, &t, &indices)?;
    let indices = index_tensor(indices, op)?;
    let out = t.empty_on(indices.dims(), t.dtype, op)?;
    ix::gather(t.stream(), &t.tref(), dim, &indices.tref(), &out.tmut())?;
    Ok(out)
}

/// Burn's `select`: the slices of `t` along `dim` at the 1-D `indices`, in their order.
pub(crate) fn select(t: CudnnTensor, dim: usize, indices: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    check_same_device(op, &t, &indices)?;
    check_dim(op, dim, t.rank())?;
    let indices = index_tensor(indices, op)?;
    let mut dims = t.dims().to_vec();
    dims[dim] = indices.numel();
    let out = t.empty_on(&dims, t.dtype, op)?;
    ix::index_select(t.stream(), &t.tref(), dim, &indices.tref(), &out.tmut())?;
    Ok(out)
}

/// Which accumulate kernel [`accumulate`] runs.
#[derive(Clone, Copy)]
enum Accumulate {
    /// Element-wise indices (`scatter_add` / `scatter_or`).
    Scatter,
    /// 1-D indices of whole slices (`select_add` / `select_or`).
    Select,
}

/// `t` with `value` added at `indices` along `dim` (duplicates accumulate; for bool tensors
/// the sum is read back as `!= 0`, i.e. a logical or). Functional: `t` is copied first unless
/// nothing else can see its buffer.
fn accumulate(
    kind: Accumulate,
    dim: usize,
    t: CudnnTensor,
    indices: CudnnTensor,
    value: CudnnTensor,
    op: &str,
) -> Result<CudnnTensor> {
    check_same_device(op, &t, &indices)?;
    check_same_device(op, &t, &value)?;
    check_same_dtype(op, &t, &value)?;
    let dtype = t.dtype;
    let axis_len = t.dims().get(dim).copied().unwrap_or(0);
    let updates = match kind {
        Accumulate::Scatter => value.dims().get(dim).copied().unwrap_or(0),
        Accumulate::Select => indices.numel(),
    };
    let work = accumulation_dtype(dtype, updates, axis_len);
    let target = owned(t, work, op)?;
    let value = exec::cast(value, work, op)?;
    let indices = index_tensor(indices, op)?;
    let stream = target.stream();
    let r = match kind {
        Accumulate::Scatter => ix::scatter_add(stream, &target.tmut(), dim, &indices.tref(), &value.tref()),
        Accumulate::Select => ix::index_add(stream, &target.tmut(), dim, &indices.tref(), &value.tref()),
    };
    r?;
    exec::cast(target, dtype, op)
}

/// Burn's `scatter_add` (and `bool_scatter_or`).
pub(crate) fn scatter_add(
    dim: usize,
    t: CudnnTensor,
    indices: CudnnTensor,
    value: CudnnTensor,
    op: &str,
) -> Result<CudnnTensor> {
    accumulate(Accumulate::Scatter, dim, t, indices, value, op)
}

/// Burn's `select_add` (and `bool_select_or`).
pub(crate) fn select_add(
    t: CudnnTensor,
    dim: usize,
    indices: CudnnTensor,
    value: CudnnTensor,
    op: &str,
) -> Result<CudnnTensor> {
    accumulate(Accumulate::Select, dim, t, indices, value, op)
}

/// The dims of `gather_nd`'s output / `scatter_nd`'s values for `indices` `[.., K]` into
/// `data_dims`: `indices.dims[..-1] ++ data_dims[K..]`.
fn nd_dims(indices: &CudnnTensor, data_dims: &[i64], op: &str) -> Result<Vec<i64>> {
    let Some((&k, tuple_dims)) = indices.dims().split_last() else {
        return Err(Error::invalid_input(
            op,
            "indices need at least one dim (the last holds the index tuples)",
        ));
    };
    if k as usize > data_dims.len() {
        return Err(Error::invalid_input(
            op,
            format!("index tuples of {k} coordinates for data of rank {}", data_dims.len()),
        ));
    }
    Ok([tuple_dims, &data_dims[k as usize..]].concat())
}

/// Burn's `gather_nd`: `out[b.., s..] = data[indices[b.., :], s..]`, shaped
/// `indices.dims[..-1] ++ data.dims[K..]` (one kernel on the strided views). A tuple with a
/// coordinate out of range (where burn-ndarray panics) yields a slice of zeros.
pub(crate) fn gather_nd(data: CudnnTensor, indices: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    check_same_device(op, &data, &indices)?;
    let indices = index_tensor(indices, op)?;
    let dims = nd_dims(&indices, data.dims(), op)?;
    let out = data.empty_on(&dims, data.dtype, op)?;
    ix::gather_nd(out.stream(), &data.tref(), &indices.tref(), &out.tmut())?;
    Ok(out)
}

/// Burn's `scatter_nd`: `data` with the slices at the index tuples of `indices` updated by
/// `values` (`indices.dims[..-1] ++ data.dims[K..]`) through `reduction`, in one kernel
/// (atomic updates; functional: `data` is copied first unless nothing else can see its
/// buffer).
///
/// Duplicate tuples: `Add`, `Mul`, `Min` and `Max` combine every candidate, in an order that
/// only affects float rounding of `Add`/`Mul` (`Min`/`Max` follow burn-ndarray: a NaN value
/// never replaces, a NaN element stays). `Assign` leaves each element holding one of its
/// candidates, unspecified which (like PyTorch's `index_put_` without `accumulate`;
/// burn-ndarray keeps the last). In the engine's deterministic mode `Add`, `Mul` and
/// `Assign` run [`ix::scatter_nd_ordered`] instead: tuple order, bit-reproducible, `Assign`
/// keeps the last candidate. A tuple with a coordinate out of range (where burn-ndarray
/// panics) updates nothing.
pub(crate) fn scatter_nd(
    data: CudnnTensor,
    indices: CudnnTensor,
    values: CudnnTensor,
    reduction: IndexingUpdateOp,
    op: &str,
) -> Result<CudnnTensor> {
    check_same_device(op, &data, &indices)?;
    check_same_device(op, &data, &values)?;
    check_same_dtype(op, &data, &values)?;
    let indices = index_tensor(indices, op)?;
    nd_dims(&indices, data.dims(), op)?;
    let update = match reduction {
        IndexingUpdateOp::Assign => ix::ScatterNdOp::Assign,
        IndexingUpdateOp::Add => ix::ScatterNdOp::Add,
        IndexingUpdateOp::Mul => ix::ScatterNdOp::Mul,
        IndexingUpdateOp::Min => ix::ScatterNdOp::Min,
        IndexingUpdateOp::Max => ix::ScatterNdOp::Max,
    };
    let dtype = data.dtype;
    let out = owned(data, dtype, op)?;
    ix::scatter_nd(out.stream(), &out.tmut(), &indices.tref(), &values.tref(), update)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Grid sampling and argwhere

/// Burn's `float_grid_sample_2d`: bilinear with zeros padding in the resize kernel; other
/// paddings through Burn's reference composition of our ops (still on the device).
pub(crate) fn grid_sample_2d(
    x: CudnnTensor,
    grid: CudnnTensor,
    options: GridSampleOptions,
    op: &str,
) -> Result<CudnnTensor> {
    match (&options.mode, &options.padding_mode) {
        (InterpolateMode::Bilinear, GridSamplePaddingMode::Zeros) => {}
        (InterpolateMode::Bilinear, _) => {
            // Burn's composition calls the op traits (it panics there on an error).
            return Ok(burn_backend::ops::grid_sample::float_grid_sample_2d_ref::<super::Cudnn>(x, grid, options));
        }
        (mode, _) => {
            return Err(Error::invalid_input(
                op,
                format!("interpolation mode {mode:?} is not supported; use InterpolateMode::Bilinear"),
            ))
        }
    }
    check_same_device(op, &x, &grid)?;
    if x.rank() != 4 || grid.rank() != 4 {
        return Err(Error::invalid_input(
            op,
            format!(
                "expects x [N, C, H, W] and grid [N, H_out, W_out, 2], got {:?} and {:?}",
                x.dims(),
                grid.dims()
            ),
        ));
    }
    let (xd, gd) = (x.dims(), grid.dims());
    let out = x.empty_on(&[xd[0], xd[1], gd[1], gd[2]], x.dtype, op)?;
    resize::grid_sample_2d(x.stream(), &x.tref(), &grid.tref(), options.align_corners, &out.tmut())?;
    Ok(out)
}

/// Burn's `bool_argwhere`: the coordinates `[count, rank]` of the true elements in row-major
/// order, as `out_dtype`. A running count of the true elements gives each its output row
/// (one host read of the total sizes the output), then the coordinates are scattered there.
pub(crate) fn argwhere(mask: CudnnTensor, out_dtype: IntDType, op: &str) -> Result<CudnnTensor> {
    let dims = mask.dims().to_vec();
    let rank = dims.len() as i64;
    let n = mask.numel();
    let dtype: DType = out_dtype.into();
    if n == 0 {
        return mask.empty_on(&[0, rank], dtype, op);
    }
    let stream = mask.stream().clone();
    let flags = exec::copy_to_new(&mask, DType::I64, op)?.reshape(&[n])?;
    let rows = flags.empty_like(DType::I64, op)?;
    red::scan(&stream, ScanOp::CumSum, &flags.tref(), 0, &rows.tmut())?;
    let last = rows.layout.slice(0, n - 1, n, 1)?;
    let bytes = rows.with_layout(last).read_bytes()?;
    let count = i64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
    if count == 0 {
        return mask.empty_on(&[0, rank], dtype, op);
    }
    // Row of each true element: its running count - 1; false elements get -1 (skipped).
    let r = rows.tmut();
    ew::binary(&stream, BinaryOp::Mul, &r, &flags.tref(), &r)?;
    ew::unary(&stream, UnaryOp::AddScalar(-1.0), &r, &r)?;
    // Coordinates of every element: dim j's arange broadcast over the other dims.
    let coords = mask.empty_on(&[n, rank], DType::I64, op)?;
    let longest = dims.iter().copied().max().unwrap_or(1);
    let ramp = arange(mask.device(), 0..longest, 1, DType::I64, op)?;
    let order: Vec<usize> = (0..dims.len()).collect();
    let packed = packed_strides(&dims, &order);
    let coord_strides: Vec<i64> = packed.iter().map(|s| s * rank).collect();
    for j in 0..dims.len() {
        let mut src_strides = vec![0i64; dims.len()];
        src_strides[j] = 1;
        let ramp_view = ramp.tref();
        let src = ramp_view.reshaped(&dims, &src_strides)?;
        let coords_view = coords.tmut();
        let dst = coords_view.view_mut(j as i64, &dims, &coord_strides)?;
        ew::copy(&stream, &src, &dst)?;
    }
    let out = exec::full(mask.device(), &[count, rank], DType::I64, 0.0, op)?;
    ix::index_add(&stream, &out.tmut(), 0, &rows.tref(), &coords.tref())?;
    exec::cast(out, dtype, op)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffer offsets of the view's elements in row-major order.
    fn offsets(v: &SignedView) -> Vec<i64> {
        let n: i64 = v.dims.iter().product();
        (0..n)
            .map(|mut i| {
                let mut off = v.offset;
                for (&d, &s) in v.dims.iter().zip(&v.strides).rev() {
                    off += (i % d) * s;
                    i /= d;
                }
                off
            })
            .collect()
    }

    #[test]
    fn half_adds_run_in_f32_only_where_a_slice_takes_several_updates() {
        for half in [DType::F16, DType::BF16] {
            // 8192 rows (a batch of positions) into 256: summed in f32, rounded once.
            assert_eq!(accumulation_dtype(half, 8192, 256), DType::F32);
            // No more updates than slices: the half kernel.
            assert_eq!(accumulation_dtype(half, 256, 256), half);
        }
        for own in [DType::F32, DType::Flex32, DType::F64, DType::I32, DType::I64] {
            assert_eq!(accumulation_dtype(own, 8192, 256), own);
        }
        for narrow in [DType::Bool(burn_backend::BoolStore::Native), DType::I8, DType::U8] {
            assert_eq!(accumulation_dtype(narrow, 4, 2), DType::I32);
        }
    }

    #[test]
    fn slices_follow_ndarray_semantics() {
        let row = ViewLayout::contiguous(&[6]);
        let cases: [(Slice, Vec<i64>); 7] = [
            (Slice::new(1, Some(4), 1), vec![1, 2, 3]),
            (Slice::new(0, None, 2), vec![0, 2, 4]),
            (Slice::new(-2, None, 1), vec![4, 5]),
            (Slice::new(0, Some(-1), 1), vec![0, 1, 2, 3, 4]),
            // Negative steps walk backwards from the last element of the range.
            (Slice::new(0, None, -1), vec![5, 4, 3, 2, 1, 0]),
            (Slice::new(0, Some(5), -2), vec![4, 2, 0]),
            (Slice::new(4, Some(2), 1), vec![]),
        ];
        for (s, want) in cases {
            let v = slice_view(&row, &[s], "test").unwrap();
            assert_eq!(offsets(&v), want, "{s:?}");
            assert_eq!(v.as_layout().is_some(), s.step > 0 || want.len() <= 1, "{s:?}");
        }
    }

    #[test]
    fn slices_of_a_transposed_view_with_missing_trailing_slices() {
        // [3, 4] transposed to [4, 3]: element (i, j) at j * 4 + i.
        let t = ViewLayout::contiguous(&[3, 4]).transpose(0, 1).unwrap();
        let v = slice_view(&t, &[Slice::new(0, None, -2)], "test").unwrap();
        assert_eq!(v.dims.to_vec(), vec![2, 3]);
        assert_eq!(offsets(&v), vec![3, 7, 11, 1, 5, 9]);
        let v = slice_view(&t, &[Slice::new(1, Some(3), 1), Slice::new(1, None, 1)], "test").unwrap();
        let layout = v.as_layout().unwrap();
        assert_eq!((layout.dims.to_vec(), layout.offset), (vec![2, 2], 5));
        assert_eq!(offsets(&v), vec![5, 9, 6, 10]);
    }

    #[test]
    fn flips_reverse_only_dims_that_change() {
        let v = flip_view(&ViewLayout::contiguous(&[2, 3]), &[1], "test").unwrap();
        assert_eq!(offsets(&v), vec![2, 1, 0, 5, 4, 3]);
        let v = flip_view(&ViewLayout::contiguous(&[2, 3]), &[0, 1], "test").unwrap();
        assert_eq!(offsets(&v), vec![5, 4, 3, 2, 1, 0]);
        // Size-1 and broadcast dims: nothing to reverse, so the flip stays a view.
        let e = ViewLayout::contiguous(&[1, 3]).expand(&[4, 3]).unwrap();
        assert!(flip_view(&e, &[0], "test").unwrap().as_layout().is_some());
        assert!(flip_view(&ViewLayout::contiguous(&[1, 3]), &[0], "test")
            .unwrap()
            .as_layout()
            .is_some());
    }
}
