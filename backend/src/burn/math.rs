//! Dtype-agnostic arithmetic, comparison, reduction, scan, sort, random and matmul
//! building blocks shared by the float, int and bool op traits (the trait methods are thin
//! calls into these, so float and int ops with the same semantics share one code path).
//!
//! Scalars reach the kernels as `f64` ([`exec::scalar_f64`]), so integer scalars beyond
//! ±2^53 lose precision.

use burn_backend::{BoolDType, DType, Distribution, Scalar, Shape};

pub(crate) use crate::ops::elementwise::{BinaryOp, CompareOp, UnaryOp};
pub(crate) use crate::ops::reduce::{ArgOp, ReduceOp, ScanOp};

use super::exec;
use super::random::with_generator;
use super::tensor::{tmut_of, CudnnTensor};
use super::CudnnDevice;
use crate::error::{Error, InOp, Result};
use crate::graph::DataType;
use crate::ops::sort::MAX_SORT_LEN;
use crate::ops::TensorRef;
use crate::ops::{index, linalg, random as rng, reduce, sort as ksort};

// ---------------------------------------------------------------------------------------
// Elementwise

/// True for the float dtypes.
fn is_float(t: &CudnnTensor) -> bool {
    t.kind().is_float()
}

/// `x + s` (ints: `s` truncated toward zero; wrapping).
pub(crate) fn add_scalar(x: CudnnTensor, s: Scalar, name: &str) -> Result<CudnnTensor> {
    exec::unary(x, UnaryOp::AddScalar(exec::scalar_f64(s)), name)
}

/// `x - s` (as `x + (-s)`, exact for floats; ints wrap).
pub(crate) fn sub_scalar(x: CudnnTensor, s: Scalar, name: &str) -> Result<CudnnTensor> {
    exec::unary(x, UnaryOp::AddScalar(-exec::scalar_f64(s)), name)
}

/// `x * s`.
pub(crate) fn mul_scalar(x: CudnnTensor, s: Scalar, name: &str) -> Result<CudnnTensor> {
    exec::unary(x, UnaryOp::MulScalar(exec::scalar_f64(s)), name)
}

/// `x / s` (a true division, not a multiplication by `1/s`; ints truncate, `x / 0 == 0`).
pub(crate) fn div_scalar(x: CudnnTensor, s: Scalar, name: &str) -> Result<CudnnTensor> {
    exec::binary_scalar(x, exec::scalar_f64(s), BinaryOp::Div, name)
}

/// `x mod s` with the sign of `s` (floor mod).
pub(crate) fn rem_scalar(x: CudnnTensor, s: Scalar, name: &str) -> Result<CudnnTensor> {
    exec::binary_scalar(x, exec::scalar_f64(s), BinaryOp::Rem, name)
}

/// `a ^ b` elementwise with broadcasting (floats: `pow`; ints: integer power, negative
/// exponents give 0 except for bases ±1). `b` is cast to `a`'s dtype first when it is an
/// int tensor raising a float one (`float_powi`).
pub(crate) fn pow(a: CudnnTensor, b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    let b = if is_float(&a) && !is_float(&b) {
        exec::cast(b, a.dtype, name)?
    } else {
        b
    };
    exec::binary(a, b, BinaryOp::Pow, name)
}

/// `x ^ p` for a scalar exponent (floats: one unary pass; ints: integer power).
pub(crate) fn pow_scalar(x: CudnnTensor, p: Scalar, name: &str) -> Result<CudnnTensor> {
    let p = exec::scalar_f64(p);
    if is_float(&x) {
        exec::unary(x, UnaryOp::PowScalar(p), name)
    } else {
        exec::binary_scalar(x, p, BinaryOp::Pow, name)
    }
}

/// `x ^ e` for an integer exponent, with Burn's cheap special cases (`x^0 = 1`, `x^1 = x`,
/// `x^2 = x*x`, and for floats `x^-1 = 1/x`, `x^-2 = 1/(x*x)`); other exponents go to
/// [`pow_scalar`].
pub(crate) fn powi_scalar(x: CudnnTensor, e: Scalar, name: &str) -> Result<CudnnTensor> {
    let float = is_float(&x);
    match exec::scalar_f64(e) as i64 {
        0 => exec::full(x.device(), x.dims(), x.dtype, 1.0, name),
        1 => Ok(x),
        2 => exec::unary(x, UnaryOp::Square, name),
        -1 if float => exec::unary(x, UnaryOp::Recip, name),
        -2 if float => exec::unary(exec::unary(x, UnaryOp::Square, name)?, UnaryOp::Recip, name),
        _ => pow_scalar(x, e, name),
    }
}

/// `clamp(x, min, max)` in one pass; a missing bound is unbounded (NaN stays NaN; for ints
/// the bounds are truncated toward zero).
pub(crate) fn clamp(x: CudnnTensor, min: Option<Scalar>, max: Option<Scalar>, name: &str) -> Result<CudnnTensor> {
    let min = min.map_or(f64::NEG_INFINITY, exec::scalar_f64);
    let max = max.map_or(f64::INFINITY, exec::scalar_f64);
    exec::unary(x, UnaryOp::Clamp { min, max }, name)
}

/// `|x|` (unsigned ints: unchanged, without a kernel).
pub(crate) fn abs(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    if x.dtype == DType::U8 {
        return Ok(x);
    }
    exec::unary(x, UnaryOp::Abs, name)
}

/// Comparison against a scalar (converted to `x`'s dtype like a cast).
pub(crate) fn compare_scalar(
    x: CudnnTensor,
    s: Scalar,
    op: CompareOp,
    out: BoolDType,
    name: &str,
) -> Result<CudnnTensor> {
    exec::compare_scalar(x, exec::scalar_f64(s), op, out, name)
}

/// True where `x` is NaN (`x != x`).
pub(crate) fn is_nan(x: CudnnTensor, out: BoolDType, name: &str) -> Result<CudnnTensor> {
    exec::compare(x.clone(), x, CompareOp::Ne, out, name)
}

/// True where `x` is ±infinity.
pub(crate) fn is_inf(x: CudnnTensor, out: BoolDType, name: &str) -> Result<CudnnTensor> {
    exec::compare_scalar(abs(x, name)?, f64::INFINITY, CompareOp::Eq, out, name)
}

/// The bool dtype of a bool tensor (results of bool ops keep it); an error for other dtypes.
fn bool_store(t: &CudnnTensor, name: &str) -> Result<BoolDType> {
    match t.dtype {
        DType::Bool(store) => Ok(store),
        other => Err(Error::invalid_input(
            name,
            format!("expected a bool tensor, got {other:?}"),
        )),
    }
}

/// Comparison of two bool tensors; the result keeps `a`'s bool dtype.
pub(crate) fn bool_compare(a: CudnnTensor, b: CudnnTensor, op: CompareOp, name: &str) -> Result<CudnnTensor> {
    let out = bool_store(&a, name)?;
    exec::compare(a, b, op, out, name)
}

/// Comparison of a bool tensor with a scalar (`!= 0` is true).
pub(crate) fn bool_compare_scalar(a: CudnnTensor, s: Scalar, op: CompareOp, name: &str) -> Result<CudnnTensor> {
    let out = bool_store(&a, name)?;
    let v = (exec::scalar_f64(s) != 0.0) as u8 as f64;
    exec::compare_scalar(a, v, op, out, name)
}

/// Bitwise not: `x ^ all-ones` (for bool tensors, which hold 0/1, `x ^ 1`).
pub(crate) fn not(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    let ones = if matches!(x.dtype, DType::Bool(_)) { 1.0 } else { -1.0 };
    exec::binary_scalar(x, ones, BinaryOp::BitXor, name)
}

/// `2^b` in `b`'s dtype (wrapping at the dtype's width).
fn pow2(b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    let two = exec::scalar_tensor(&b, b.dtype, 2.0, name)?;
    exec::binary(two, b, BinaryOp::Pow, name)
}

/// `a << b` as `a * 2^b` (wrapping; shifts of the full width or more give 0).
pub(crate) fn shift_left(a: CudnnTensor, b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    exec::check_same_dtype(name, &a, &b)?;
    exec::binary(a, pow2(b, name)?, BinaryOp::Mul, name)
}

/// Arithmetic `a >> b` as the floor division `(a - a mod 2^b) / 2^b` (exact; a shift of
/// the signed dtype's width minus one, where `2^b` wraps negative, is not supported).
pub(crate) fn shift_right(a: CudnnTensor, b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    exec::check_same_dtype(name, &a, &b)?;
    let p = pow2(b, name)?;
    let r = exec::binary(a.clone(), p.clone(), BinaryOp::Rem, name)?;
    let d = exec::binary(a, r, BinaryOp::Sub, name)?;
    exec::binary(d, p, BinaryOp::Div, name)
}

/// [`shift_left`] / [`shift_right`] by a scalar amount.
pub(crate) fn shift_scalar(a: CudnnTensor, s: Scalar, left: bool, name: &str) -> Result<CudnnTensor> {
    let b = exec::scalar_tensor(&a, a.dtype, exec::scalar_f64(s), name)?;
    if left {
        shift_left(a, b, name)
    } else {
        shift_right(a, b, name)
    }
}

// ---------------------------------------------------------------------------------------
// Float functions without a kernel of their own, composed from the elementwise kernels
// (F16/BF16 compute in F32 and round once at the end).

/// Runs `f` in F32 for F16/BF16 inputs (rounding the result back), else in `x`'s dtype.
fn in_wide_float(
    x: CudnnTensor,
    name: &str,
    f: impl FnOnce(CudnnTensor) -> Result<CudnnTensor>,
) -> Result<CudnnTensor> {
    match x.dtype {
        DType::F16 | DType::BF16 => {
            let dtype = x.dtype;
            exec::cast(f(exec::cast(x, DType::F32, name)?)?, dtype, name)
        }
        _ => f(x),
    }
}

fn un(x: CudnnTensor, op: UnaryOp, name: &str) -> Result<CudnnTensor> {
    exec::unary(x, op, name)
}

fn bin(a: CudnnTensor, b: CudnnTensor, op: BinaryOp, name: &str) -> Result<CudnnTensor> {
    exec::binary(a, b, op, name)
}

/// `cosh x = (e + 1/e) / 2` with `e = exp|x|`.
pub(crate) fn cosh(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let e = un(un(x, UnaryOp::Abs, name)?, UnaryOp::Exp, name)?;
        let r = un(e.clone(), UnaryOp::Recip, name)?;
        un(bin(e, r, BinaryOp::Add, name)?, UnaryOp::MulScalar(0.5), name)
    })
}

/// `sinh x = sign(x) (m + m/(m+1)) / 2` with `m = expm1|x|` (accurate near 0).
pub(crate) fn sinh(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let s = un(x.clone(), UnaryOp::Sign, name)?;
        let m = un(un(x, UnaryOp::Abs, name)?, UnaryOp::Expm1, name)?;
        let q = bin(
            m.clone(),
            un(m.clone(), UnaryOp::AddScalar(1.0), name)?,
            BinaryOp::Div,
            name,
        )?;
        let h = un(bin(m, q, BinaryOp::Add, name)?, UnaryOp::MulScalar(0.5), name)?;
        bin(h, s, BinaryOp::Mul, name)
    })
}

/// `atan x = atan2(x, 1)`.
pub(crate) fn atan(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    exec::binary_scalar(x, 1.0, BinaryOp::Atan2, name)
}

/// `sqrt((1 - x)(1 + x))` (NaN outside `[-1, 1]`).
fn sqrt_one_minus_sq(x: &CudnnTensor, name: &str) -> Result<CudnnTensor> {
    let p = un(x.clone(), UnaryOp::AddScalar(1.0), name)?;
    let m = un(un(x.clone(), UnaryOp::Neg, name)?, UnaryOp::AddScalar(1.0), name)?;
    un(bin(m, p, BinaryOp::Mul, name)?, UnaryOp::Sqrt, name)
}

/// `asin x = atan2(x, sqrt(1 - x²))`.
pub(crate) fn asin(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let c = sqrt_one_minus_sq(&x, name)?;
        bin(x, c, BinaryOp::Atan2, name)
    })
}

/// `acos x = atan2(sqrt(1 - x²), x)`.
pub(crate) fn acos(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let s = sqrt_one_minus_sq(&x, name)?;
        bin(s, x, BinaryOp::Atan2, name)
    })
}

/// `asinh x = sign(x) log1p(a + a / (r + sqrt(1 + r²)))` with `a = |x|`, `r = 1/a`
/// (accurate near 0, no overflow for large `a`, 0 at 0).
pub(crate) fn asinh(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let s = un(x.clone(), UnaryOp::Sign, name)?;
        let a = un(x, UnaryOp::Abs, name)?;
        let r = un(a.clone(), UnaryOp::Recip, name)?;
        let h = un(
            un(un(r.clone(), UnaryOp::Square, name)?, UnaryOp::AddScalar(1.0), name)?,
            UnaryOp::Sqrt,
            name,
        )?;
        let q = bin(a.clone(), bin(r, h, BinaryOp::Add, name)?, BinaryOp::Div, name)?;
        let l = un(bin(a, q, BinaryOp::Add, name)?, UnaryOp::Log1p, name)?;
        bin(l, s, BinaryOp::Mul, name)
    })
}

/// `acosh x = log1p(t + sqrt(t) sqrt(t + 2))` with `t = x - 1` (accurate near 1, no
/// overflow for large `x`; NaN below 1).
pub(crate) fn acosh(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let t = un(x, UnaryOp::AddScalar(-1.0), name)?;
        let s1 = un(t.clone(), UnaryOp::Sqrt, name)?;
        let s2 = un(un(t.clone(), UnaryOp::AddScalar(2.0), name)?, UnaryOp::Sqrt, name)?;
        let u = bin(t, bin(s1, s2, BinaryOp::Mul, name)?, BinaryOp::Add, name)?;
        un(u, UnaryOp::Log1p, name)
    })
}

/// `atanh x = log1p(2x / (1 - x)) / 2`.
pub(crate) fn atanh(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    in_wide_float(x, name, |x| {
        let d = un(un(x.clone(), UnaryOp::Neg, name)?, UnaryOp::AddScalar(1.0), name)?;
        let q = bin(un(x, UnaryOp::MulScalar(2.0), name)?, d, BinaryOp::Div, name)?;
        un(un(q, UnaryOp::Log1p, name)?, UnaryOp::MulScalar(0.5), name)
    })
}

// ---------------------------------------------------------------------------------------
// Reductions and scans

/// An error unless `dim` is a dim of `x`.
fn check_dim(name: &str, x: &CudnnTensor, dim: usize) -> Result<()> {
    if dim >= x.rank() {
        return Err(Error::invalid_input(
            name,
            format!(
                "dim {dim} is out of range for a tensor of rank {} ({:?})",
                x.rank(),
                x.dims()
            ),
        ));
    }
    Ok(())
}

/// `x`'s dims with `dims[dim] = 1`.
fn keep_dim(x: &CudnnTensor, dim: usize) -> Vec<i64> {
    let mut dims = x.dims().to_vec();
    dims[dim] = 1;
    dims
}

/// `op` over `dim`, keeping it with size 1, into a new tensor of `dtype`.
fn reduce_dim_as(x: CudnnTensor, dim: usize, op: ReduceOp, dtype: DType, name: &str) -> Result<CudnnTensor> {
    check_dim(name, &x, dim)?;
    if let Some(chunks) = split_chunks(&x, dim, op, dtype) {
        // Few long rows (e.g. batch-norm statistics: one row per channel): reduce chunks of
        // each row in parallel, then the partial results. A pure view splits the axis.
        let len = x.dims()[dim];
        let mut layout = x.layout.clone();
        let stride = layout.strides[dim];
        layout.dims[dim] = chunks;
        layout.strides[dim] = stride * (len / chunks);
        layout.dims.insert(dim + 1, len / chunks);
        layout.strides.insert(dim + 1, stride);
        let split = x.with_layout(layout);
        let partial = reduce_dim_as(split, dim + 1, op, dtype, name)?;
        let mut partial_dims = x.dims().to_vec();
        partial_dims[dim] = chunks;
        let partial = partial.reshape(&partial_dims)?;
        return reduce_dim_as(partial, dim, op, dtype, name);
    }
    let out = x.empty_on(&keep_dim(&x, dim), dtype, name)?;
    reduce::reduce(x.stream(), op, &x.tref(), dim, &out.tmut())?;
    Ok(out)
}

/// How many chunks to split a reduction over `dim` into: `Some(c)` when the rows are long
/// and too few to fill the GPU (one block per row would leave most SMs idle), for ops whose
/// partial results combine exactly the same way (sum, mean of equal chunks, max, min, product)
/// in dtypes that need no intermediate widening.
fn split_chunks(x: &CudnnTensor, dim: usize, op: ReduceOp, dtype: DType) -> Option<i64> {
    let splittable = matches!(
        op,
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min | ReduceOp::Prod
    );
    let wide = matches!(x.dtype, DType::F32 | DType::F64 | DType::I64 | DType::I32);
    let len = x.dims()[dim];
    if !splittable || !wide || dtype != x.dtype || len < 1 << 16 {
        return None;
    }
    let rows = x.numel() / len;
    if rows >= 1024 {
        return None;
    }
    // The largest power-of-two chunk count that leaves chunks of at least 1024 elements.
    let mut chunks = 1i64;
    while chunks < 1024 && len % (chunks * 2) == 0 && len / (chunks * 2) >= 1024 {
        chunks *= 2;
    }
    (chunks > 1).then_some(chunks)
}

/// `op` over every element into a tensor of shape `[1]` and `dtype`.
fn reduce_all_as(x: CudnnTensor, op: ReduceOp, dtype: DType, name: &str) -> Result<CudnnTensor> {
    let out = x.empty_on(&[1], dtype, name)?;
    reduce::reduce_all(x.stream(), op, &x.tref(), &out.tmut())?;
    Ok(out)
}

/// Sum, product, max or min over `dim` (kept with size 1); ints wrap.
pub(crate) fn reduce_dim(x: CudnnTensor, dim: usize, op: ReduceOp, name: &str) -> Result<CudnnTensor> {
    let dtype = x.dtype;
    reduce_dim_as(x, dim, op, dtype, name)
}

/// Sum, product, max or min of every element, shape `[1]`.
pub(crate) fn reduce_all(x: CudnnTensor, op: ReduceOp, name: &str) -> Result<CudnnTensor> {
    let dtype = x.dtype;
    reduce_all_as(x, op, dtype, name)
}

/// Mean over `dim` (kept): floats average; ints divide the (wrapping) sum, truncating.
pub(crate) fn mean_dim(x: CudnnTensor, dim: usize, name: &str) -> Result<CudnnTensor> {
    if is_float(&x) {
        return reduce_dim(x, dim, ReduceOp::Mean, name);
    }
    check_dim(name, &x, dim)?;
    let n = x.dims()[dim];
    div_scalar(reduce_dim(x, dim, ReduceOp::Sum, name)?, Scalar::Int(n), name)
}

/// Mean of every element, shape `[1]` (ints: truncating).
pub(crate) fn mean(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    if is_float(&x) {
        return reduce_all(x, ReduceOp::Mean, name);
    }
    let n = x.numel();
    div_scalar(reduce_all(x, ReduceOp::Sum, name)?, Scalar::Int(n), name)
}

/// Largest `|x|` over `dim` (kept).
pub(crate) fn max_abs_dim(x: CudnnTensor, dim: usize, name: &str) -> Result<CudnnTensor> {
    reduce_dim(abs(x, name)?, dim, ReduceOp::Max, name)
}

/// Largest `|x|` of every element, shape `[1]`.
pub(crate) fn max_abs(x: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    reduce_all(abs(x, name)?, ReduceOp::Max, name)
}

/// Any/all nonzero over `dim` (kept) as a bool tensor of `out`.
pub(crate) fn logical_dim(x: CudnnTensor, dim: usize, op: ReduceOp, out: BoolDType, name: &str) -> Result<CudnnTensor> {
    reduce_dim_as(x, dim, op, exec::bool_dtype(name, out)?, name)
}

/// Any/all nonzero over every element, shape `[1]`, as a bool tensor of `out`.
pub(crate) fn logical_all(x: CudnnTensor, op: ReduceOp, out: BoolDType, name: &str) -> Result<CudnnTensor> {
    reduce_all_as(x, op, exec::bool_dtype(name, out)?, name)
}

/// [`logical_dim`] of a bool tensor, keeping its bool dtype.
pub(crate) fn bool_logical_dim(x: CudnnTensor, dim: usize, op: ReduceOp, name: &str) -> Result<CudnnTensor> {
    let out = bool_store(&x, name)?;
    logical_dim(x, dim, op, out, name)
}

/// [`logical_all`] of a bool tensor, keeping its bool dtype.
pub(crate) fn bool_logical_all(x: CudnnTensor, op: ReduceOp, name: &str) -> Result<CudnnTensor> {
    let out = bool_store(&x, name)?;
    logical_all(x, op, out, name)
}

/// The I64 index along `dim` (kept) of the first maximum/minimum.
fn arg_i64(x: &CudnnTensor, dim: usize, op: ArgOp, name: &str) -> Result<CudnnTensor> {
    check_dim(name, x, dim)?;
    let out = x.empty_on(&keep_dim(x, dim), DType::I64, name)?;
    reduce::arg_reduce(x.stream(), op, &x.tref(), dim, &out.tmut())?;
    Ok(out)
}

/// Index of the first maximum/minimum along `dim` (kept), as `out_dtype`.
pub(crate) fn arg_reduce(x: CudnnTensor, dim: usize, op: ArgOp, out_dtype: DType, name: &str) -> Result<CudnnTensor> {
    exec::cast(arg_i64(&x, dim, op, name)?, out_dtype, name)
}

/// `x` gathered along `dim` at the I64 `indices` (same rank, dims no larger off `dim`).
fn gather_i64(x: &CudnnTensor, dim: usize, indices: &CudnnTensor, name: &str) -> Result<CudnnTensor> {
    let out = x.empty_on(indices.dims(), x.dtype, name)?;
    index::gather(x.stream(), &x.tref(), dim, &indices.tref(), &out.tmut())?;
    Ok(out)
}

/// (values, indices) of the first maximum/minimum along `dim` (kept), indices as
/// `idx_dtype`; the values are read at the indices, so both always agree.
pub(crate) fn arg_reduce_with_values(
    x: CudnnTensor,
    dim: usize,
    op: ArgOp,
    idx_dtype: DType,
    name: &str,
) -> Result<(CudnnTensor, CudnnTensor)> {
    let idx = arg_i64(&x, dim, op, name)?;
    let values = gather_i64(&x, dim, &idx, name)?;
    Ok((values, exec::cast(idx, idx_dtype, name)?))
}

/// Inclusive scan along `dim` into a new tensor.
pub(crate) fn scan(x: CudnnTensor, dim: usize, op: ScanOp, name: &str) -> Result<CudnnTensor> {
    check_dim(name, &x, dim)?;
    let out = x.empty_like(x.dtype, name)?;
    reduce::scan(x.stream(), op, &x.tref(), dim, &out.tmut())?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Sort and top-k

/// Stable sort of `x` along `dim`: the sorted values (when `values`) and the I64 source
/// positions (when `indices`).
fn sort_raw(
    x: &CudnnTensor,
    dim: usize,
    descending: bool,
    values: bool,
    indices: bool,
    name: &str,
) -> Result<(Option<CudnnTensor>, Option<CudnnTensor>)> {
    check_dim(name, x, dim)?;
    let v = values.then(|| x.empty_like(x.dtype, name)).transpose()?;
    let i = indices.then(|| x.empty_like(DType::I64, name)).transpose()?;
    let (vr, ir) = (tmut_of(&v), tmut_of(&i));
    ksort::sort(x.stream(), &x.tref(), dim, descending, vr.as_ref(), ir.as_ref())?;
    drop((vr, ir));
    Ok((v, i))
}

/// The sorted values [`sort_raw`] was asked for (always present when requested).
fn requested(t: Option<CudnnTensor>) -> CudnnTensor {
    t.unwrap_or_else(|| unreachable!("cudnn-backend: internal error: a requested sort output is missing"))
}

/// Values sorted along `dim` (stable; NaN sorts as the largest value).
pub(crate) fn sort(x: CudnnTensor, dim: usize, descending: bool, name: &str) -> Result<CudnnTensor> {
    Ok(requested(sort_raw(&x, dim, descending, true, false, name)?.0))
}

/// Sorted values and their source positions as `idx_dtype`.
pub(crate) fn sort_with_indices(
    x: CudnnTensor,
    dim: usize,
    descending: bool,
    idx_dtype: DType,
    name: &str,
) -> Result<(CudnnTensor, CudnnTensor)> {
    let (v, i) = sort_raw(&x, dim, descending, true, true, name)?;
    Ok((requested(v), exec::cast(requested(i), idx_dtype, name)?))
}

/// The positions that sort `x` along `dim`, as `idx_dtype`.
pub(crate) fn argsort(
    x: CudnnTensor,
    dim: usize,
    descending: bool,
    idx_dtype: DType,
    name: &str,
) -> Result<CudnnTensor> {
    let i = requested(sort_raw(&x, dim, descending, false, true, name)?.1);
    exec::cast(i, idx_dtype, name)
}

/// The first `k` entries of `t` along `dim`, packed.
fn take_front(t: CudnnTensor, dim: usize, k: i64, name: &str) -> Result<CudnnTensor> {
    if t.dims()[dim] == k {
        return Ok(t);
    }
    let layout = t.layout.slice(dim, 0, k, 1).in_op(name)?;
    t.with_layout(layout).contiguous()
}

/// The smallest value of `dtype` (what padding must sort below).
fn lowest(dtype: DType) -> f64 {
    match dtype {
        DType::I64 => i64::MIN as f64,
        DType::I32 => i32::MIN as f64,
        DType::I8 => i8::MIN as f64,
        DType::U8 | DType::Bool(_) => 0.0,
        _ => f64::NEG_INFINITY,
    }
}

/// `[0, 1, .., len - 1]` as an I64 tensor of dims `[1, len]`.
fn arange_row(like: &CudnnTensor, len: i64, name: &str) -> Result<CudnnTensor> {
    let ones = exec::full(like.device(), &[1, len], DType::I64, 1.0, name)?;
    exec::unary(scan(ones, 1, ScanOp::CumSum, name)?, UnaryOp::AddScalar(-1.0), name)
}

/// `t` ([rows or 1, l]) widened to `p` columns, the new ones filled with `fill`.
fn pad_cols(t: CudnnTensor, p: i64, fill: f64, name: &str) -> Result<CudnnTensor> {
    let (rows, l) = (t.dims()[0], t.dims()[1]);
    let out = exec::full(t.device(), &[rows, p], t.dtype, fill, name)?;
    let head = out.with_layout(out.layout.slice(1, 0, l, 1)?);
    exec::copy_into(&t, &head, name)?;
    Ok(out)
}

/// The `k` largest entries along `dim`, largest first, ties by lowest index: the values
/// (when `values`) and their I64 positions. Rows up to [`MAX_SORT_LEN`] are sorted once, and
/// so are longer rows when `k` exceeds half that length; otherwise long rows are cut into
/// chunks of that length whose top `k` survive, repeatedly, until one chunk is left.
fn topk_raw(
    x: CudnnTensor,
    dim: usize,
    k: usize,
    values: bool,
    name: &str,
) -> Result<(Option<CudnnTensor>, CudnnTensor)> {
    check_dim(name, &x, dim)?;
    let len = x.dims()[dim];
    let k = k as i64;
    if k > len {
        return Err(Error::invalid_input(
            name,
            format!("k = {k} exceeds the size {len} of dim {dim}"),
        ));
    }
    let chunk = MAX_SORT_LEN;
    if len <= chunk || k > chunk / 2 {
        let (v, i) = sort_raw(&x, dim, true, values, true, name)?;
        let i = take_front(requested(i), dim, k, name)?;
        return Ok((v.map(|v| take_front(v, dim, k, name)).transpose()?, i));
    }
    // Move `dim` last and flatten the other dims into rows: [rows, len].
    let rank = x.rank();
    let mut perm: Vec<usize> = (0..rank).filter(|&d| d != dim).collect();
    perm.push(dim);
    let moved = x.with_layout(x.layout.permute(&perm).in_op(name)?);
    let rest: Vec<i64> = moved.dims()[..rank - 1].to_vec();
    let rows: i64 = rest.iter().product();
    let mut vals = moved.reshape(&[rows, len])?;
    let mut idx = arange_row(&vals, len, name)?;
    let mut l = len;
    while l > chunk {
        let chunks = (l + chunk - 1) / chunk;
        let p = chunks * chunk;
        if p != l {
            let fill = lowest(vals.dtype);
            vals = pad_cols(vals, p, fill, name)?;
            idx = pad_cols(idx, p, 0.0, name)?;
        }
        let v3 = vals.reshape(&[rows, chunks, chunk])?;
        let idx_rows = idx.dims()[0];
        let i3 = exec::expand(idx.reshape(&[idx_rows, chunks, chunk])?, &[rows, chunks, chunk], name)?;
        let (sv, si) = sort_raw(&v3, 2, true, true, true, name)?;
        let si = take_front(requested(si), 2, k, name)?;
        idx = gather_i64(&i3, 2, &si, name)?.reshape(&[rows, chunks * k])?;
        vals = take_front(requested(sv), 2, k, name)?.reshape(&[rows, chunks * k])?;
        l = chunks * k;
    }
    let (sv, si) = sort_raw(&vals, 1, true, values, true, name)?;
    let si = take_front(requested(si), 1, k, name)?;
    let idx = gather_i64(&idx, 1, &si, name)?;
    // Back to x's dim order: [rest.., k] with the last dim moved to `dim`.
    let mut inverse = vec![0usize; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let mut out_dims = rest;
    out_dims.push(k);
    let restore = |t: CudnnTensor| -> Result<CudnnTensor> {
        let t = t.reshape(&out_dims)?;
        let layout = t.layout.permute(&inverse)?;
        Ok(t.with_layout(layout))
    };
    let values = sv.map(|v| restore(take_front(v, 1, k, name)?)).transpose()?;
    Ok((values, restore(idx)?))
}

/// The `k` largest values along `dim`, largest first.
pub(crate) fn topk(x: CudnnTensor, dim: usize, k: usize, name: &str) -> Result<CudnnTensor> {
    Ok(requested(topk_raw(x, dim, k, true, name)?.0))
}

/// The positions of the `k` largest values along `dim` (ties: lowest index first), as
/// `idx_dtype`.
pub(crate) fn argtopk(x: CudnnTensor, dim: usize, k: usize, idx_dtype: DType, name: &str) -> Result<CudnnTensor> {
    exec::cast(topk_raw(x, dim, k, false, name)?.1, idx_dtype, name)
}

// ---------------------------------------------------------------------------------------
// Random

/// A tensor of `shape` and `dtype` drawn from `dist` with the backend's generator. Floats:
/// `Default` is uniform in `[0, 1)`. Ints: `Default` is uniform in `[0, 255)`, `Uniform`
/// bounds are truncated to integers, `Normal` draws are truncated toward zero.
pub(crate) fn random(
    shape: &Shape,
    dist: Distribution,
    device: &CudnnDevice,
    dtype: DType,
    name: &str,
) -> Result<CudnnTensor> {
    let out = exec::empty(device, shape, dtype, name)?;
    let stream = out.stream().clone();
    let t = out.tmut();
    let float = is_float(&out);
    let r = with_generator(|g| match dist {
        Distribution::Default if float => rng::uniform(&stream, g, 0.0, 1.0, &t),
        Distribution::Default => rng::uniform_int(&stream, g, 0, 255, &t),
        Distribution::Uniform(lo, hi) if float => rng::uniform(&stream, g, lo, hi, &t),
        Distribution::Uniform(lo, hi) => rng::uniform_int(&stream, g, lo as i64, hi as i64, &t),
        Distribution::Bernoulli(p) => rng::bernoulli(&stream, g, p, &t),
        Distribution::Normal(mean, std) if float => rng::normal(&stream, g, mean, std, &t),
        Distribution::Normal(mean, std) => {
            let wide = out.empty_like(DType::F64, name)?;
            rng::normal(&stream, g, mean, std, &wide.tmut())?;
            exec::copy_into(&wide, &out, name)?;
            Ok(())
        }
    });
    drop(t);
    r?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Matmul and cross product

/// The result dims of `a[.., M, K] · b[.., K, N]` (one rank ≥ 2, batch dims broadcast).
fn matmul_dims(name: &str, a: &CudnnTensor, b: &CudnnTensor) -> Result<Vec<i64>> {
    let r = a.rank();
    let (ad, bd) = (a.dims(), b.dims());
    if r < 2 || r != b.rank() {
        return Err(Error::invalid_input(
            name,
            format!("operands need one rank >= 2 (got {ad:?} and {bd:?})"),
        ));
    }
    if ad[r - 1] != bd[r - 2] {
        return Err(Error::invalid_input(
            name,
            format!("inner dims differ ({ad:?} · {bd:?})"),
        ));
    }
    let mut dims = exec::broadcast_dims(name, &ad[..r - 2], &bd[..r - 2])?;
    dims.extend([ad[r - 2], bd[r - 1]]);
    Ok(dims)
}

/// `t` with each expanded (stride-0) batch dim of size > 1 viewed as size 1: the matmul
/// broadcasts it without reading duplicates.
fn squash_expanded_batch(t: CudnnTensor) -> CudnnTensor {
    let mut layout = t.layout.clone();
    let nb = layout.dims.len().saturating_sub(2);
    for i in 0..nb {
        if layout.strides[i] == 0 && layout.dims[i] > 1 {
            layout.dims[i] = 1;
        }
    }
    t.with_layout(layout)
}

/// `t` with every size-1 dim given a stride past the extent of the others (cuDNN wants
/// positive, non-overlapping strides; a size-1 dim's stride addresses nothing).
fn positive_unit_strides(t: TensorRef) -> Result<TensorRef> {
    t.reshaped(t.dims(), &unit_strides_past_extent(t.dims(), t.strides()))
}

/// `strides` with the stride of every size-1 dim of `dims` set past the extent of the others.
fn unit_strides_past_extent(dims: &[i64], strides: &[i64]) -> Vec<i64> {
    let extent = dims
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| d * s)
        .max()
        .unwrap_or(1)
        .max(1);
    dims.iter()
        .zip(strides)
        .map(|(&d, &s)| if d == 1 { extent } else { s })
        .collect()
}

/// Float batched matmul: cuDNN for F32/F16/BF16, the exact GEMM kernel for F64. Expanded
/// batch dims are not materialised: they are broadcast by the matmul, and the result is
/// expanded back when both sides were. Operands cuDNN's engines cannot take directly
/// (neither row-major nor transposed matrices, interleaved batches) are copied once.
pub(crate) fn float_matmul(a: CudnnTensor, b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    exec::check_same_device(name, &a, &b)?;
    exec::check_same_dtype(name, &a, &b)?;
    if a.kind() == DataType::F64 {
        return exact_matmul(&a, &b, name);
    }
    let full = matmul_dims(name, &a, &b)?;
    if is_small_product(&full, a.dims()) {
        return exact_matmul(&a, &b, name);
    }
    let (a, b) = (squash_expanded_batch(a), squash_expanded_batch(b));
    // A right operand shared by every batch: one GEMM over the batch folded into the rows.
    let (a, b, folded) = match folded_dims(&a, &b) {
        Some((rows, dims)) => {
            let (k, n) = (b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]);
            (a.reshape(&[rows, k])?, b.reshape(&[k, n])?, Some(dims))
        }
        None => (a, b, None),
    };
    let (a, b) = (a.matmul_ready()?, b.matmul_ready()?);
    let dims = matmul_dims(name, &a, &b)?;
    let out = a.empty_on(&dims, a.dtype, name)?;
    let (ar, br) = (positive_unit_strides(a.tref())?, positive_unit_strides(b.tref())?);
    let product = crate::ops::matmul(a.stream(), &ar, &br, &out.tmut());
    let out = match product {
        Ok(()) => out,
        // Degenerate products (an inner or outer dim of 1 with unusual strides) for which
        // cuDNN has no engine run in the exact GEMM kernel instead. Its products are exact
        // where cuDNN's f32 engines are TF32, so the first such product is a warning: a
        // result that differs between two runs points here.
        Err(e) if e.is_not_supported() => {
            if crate::engine().first_warning("matmul without a cuDNN engine") {
                tracing::warn!(
                    reason = %e,
                    "{name}: cuDNN offered no engine for a {:?} x {:?} product; it runs on the exact GEMM kernel \
                     (no TF32 rounding, unlike cuDNN's f32 engines; warned once)",
                    a.dims(),
                    b.dims()
                );
            } else {
                tracing::debug!("{name}: cuDNN has no engine ({e}); using the exact GEMM kernel");
            }
            exact_matmul(&a, &b, name)?
        }
        Err(e) => return Err(e),
    };
    let out = match folded {
        Some(dims) => out.reshape(&dims)?,
        None => out,
    };
    if out.dims() == full {
        Ok(out)
    } else {
        exec::expand(out, &full, name)
    }
}

/// For `a[.., M, K] · b[1.., K, N]` with `b` shared by every batch of `a`: the rows of `a`
/// with its batch dims folded in, and the result's dims (`[.., M, N]`). The product then
/// runs as one GEMM `[B·M, K] · [K, N]`, as `torch.matmul` folds it; `a` is copied once when
/// its batches do not fold into rows (a transposed gradient, say), where cuDNN would run one
/// GEMM per batch element. `None` when `b` is batched or `a` has no batch to fold.
fn folded_dims(a: &CudnnTensor, b: &CudnnTensor) -> Option<(i64, Vec<i64>)> {
    let r = a.rank();
    if r < 3 || b.rank() != r || b.dims()[..r - 2].iter().any(|&d| d != 1) {
        return None;
    }
    let (ad, bd) = (a.dims(), b.dims());
    let rows: i64 = ad[..r - 1].iter().product();
    if rows == ad[r - 2] || ad[r - 1] != bd[r - 2] {
        return None;
    }
    let mut dims = ad[..r - 1].to_vec();
    dims.push(bd[r - 1]);
    Some((rows, dims))
}

/// Multiply-adds up to which a float product skips cuDNN (see [`is_small_product`]).
const SMALL_PRODUCT_MACS: i64 = 1 << 22;

/// True for products that run in the exact GEMM kernel instead of a cuDNN plan: outer
/// products (inner dim 1) and products of at most [`SMALL_PRODUCT_MACS`] multiply-adds.
/// Their first call then costs a kernel launch, not a plan build: algorithms that multiply a
/// new small shape at every step (Burn's LU factorization and determinant do one per column)
/// stay fast, and such small products gain nothing from cuDNN's engines anyway.
pub(crate) fn is_small_product(out_dims: &[i64], a_dims: &[i64]) -> bool {
    let k = a_dims.last().copied().unwrap_or(1);
    let macs = out_dims.iter().product::<i64>().saturating_mul(k);
    k <= 1 || macs <= SMALL_PRODUCT_MACS
}

/// Float batched matmul `a[.., M, K] · b[.., K, N]` (one rank >= 2, batch dims broadcast)
/// with the exact GEMM kernel (products and sums in f64, one rounding to the dtype; any
/// strides, no copies). For F64 and for results that must not carry TF32 error; much
/// slower than cuDNN on large products.
pub(crate) fn exact_matmul(a: &CudnnTensor, b: &CudnnTensor, name: &str) -> Result<CudnnTensor> {
    exec::check_same_device(name, a, b)?;
    exec::check_same_dtype(name, a, b)?;
    let dims = matmul_dims(name, a, b)?;
    let out = a.empty_on(&dims, a.dtype, name)?;
    linalg::matmul(a.stream(), &a.tref(), &b.tref(), &out.tmut())?;
    Ok(out)
}

/// Integer batched matmul (wrapping; I8/U8 computed in I32 and wrapped back).
pub(crate) fn int_matmul(a: CudnnTensor, b: CudnnTensor, name: &str) -> Result<CudnnTensor> {
    exec::check_same_device(name, &a, &b)?;
    exec::check_same_dtype(name, &a, &b)?;
    let dims = matmul_dims(name, &a, &b)?;
    let dtype = a.dtype;
    let work = match dtype {
        DType::I64 | DType::I32 => dtype,
        _ => DType::I32,
    };
    let (a, b) = (exec::cast(a, work, name)?, exec::cast(b, work, name)?);
    let out = a.empty_on(&dims, work, name)?;
    linalg::int_matmul(a.stream(), &a.tref(), &b.tref(), &out.tmut())?;
    exec::cast(out, dtype, name)
}

/// The 3-vector cross product along `dim` (other dims broadcast).
pub(crate) fn cross(a: CudnnTensor, b: CudnnTensor, dim: usize, name: &str) -> Result<CudnnTensor> {
    exec::check_same_device(name, &a, &b)?;
    exec::check_same_dtype(name, &a, &b)?;
    let dims = exec::broadcast_dims(name, a.dims(), b.dims())?;
    let out = a.empty_on(&dims, a.dtype, name)?;
    linalg::cross3(a.stream(), &a.tref(), &b.tref(), dim, &out.tmut())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_dims_get_strides_past_the_extent() {
        assert_eq!(unit_strides_past_extent(&[1, 4, 3], &[0, 3, 1]), vec![12, 3, 1]);
        // Transposed matrix: the batch stride covers the whole matrix.
        assert_eq!(unit_strides_past_extent(&[1, 4, 3], &[0, 1, 4]), vec![12, 1, 4]);
        // Every dim 1: stride 1.
        assert_eq!(unit_strides_past_extent(&[1, 1, 1], &[0, 0, 0]), vec![1, 1, 1]);
        // Dims > 1 keep their strides.
        assert_eq!(unit_strides_past_extent(&[2, 1, 3], &[3, 0, 1]), vec![3, 6, 1]);
    }

    #[test]
    fn padding_sorts_below_every_value() {
        assert_eq!(lowest(DType::F32), f64::NEG_INFINITY);
        assert_eq!(lowest(DType::BF16), f64::NEG_INFINITY);
        assert_eq!(lowest(DType::I64) as i64, i64::MIN);
        assert_eq!(lowest(DType::I32), -2147483648.0);
        assert_eq!(lowest(DType::I8), -128.0);
        assert_eq!(lowest(DType::U8), 0.0);
    }
}

#[cfg(test)]
mod small_product_tests {
    use super::is_small_product;

    #[test]
    fn outer_and_small_products_skip_cudnn() {
        assert!(is_small_product(&[500, 500], &[500, 1]), "an outer product");
        assert!(is_small_product(&[128, 10], &[128, 128]));
        assert!(
            !is_small_product(&[8192, 512], &[8192, 512]),
            "a transformer projection"
        );
        assert!(!is_small_product(&[32, 8, 256, 256], &[32, 8, 256, 64]));
    }
}
