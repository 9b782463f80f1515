//! Elementwise kernels on strided views: fill, copy/cast, unary, binary, compare, where.
//!
//! Every function takes the stream first, validates all its arguments, and only enqueues
//! work (it never synchronizes). Inputs are broadcast to the output's dims (numpy rules:
//! size-1 or missing leading dims), every operand may be arbitrarily strided (negative
//! strides included), and the output must not overlap itself (no 0 stride on a dim > 1).
//! Empty outputs return `Ok(())` at once after validation.
//!
//! Host work is split in two: a pure `plan_*` function (validation, broadcasting, dim
//! merging, kernel choice) that needs no device, and the launch of the planned kernel
//! (`kernels/elementwise.cu`, one entry point per dtype family with the op as an argument).

use crate::kernels::check::{check_no_overlap, check_tensor, same_dtype};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_elementwise::{self as launch, ScalarParam, UnaryParams};
use crate::graph::DataType;
use crate::kernels::layout::{broadcast_strides, coalesce, kernel_layout};
use crate::kernels::{stream_function, ELEMENTWISE};
use crate::ops::TensorRef;

/// A unary operation (the kernels' `op` code is the declaration order).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// `ln(1 + x)`.
    Log1p,
    /// `e^x - 1`.
    Expm1,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `1 / x`.
    Recip,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Tangent.
    Tan,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// Exact GELU: `x/2 * (1 + erf(x / sqrt 2))`.
    Gelu,
    /// Error function.
    Erf,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
    /// Round to nearest, half to even.
    Round,
    /// Round toward zero.
    Trunc,
    /// -1, 0 or 1 (NaN stays NaN).
    Sign,
    /// `x * x`.
    Square,
    /// `x + s` (for ints `s` is truncated to an integer first).
    AddScalar(f64),
    /// `x * s` (for ints `s` is truncated to an integer first).
    MulScalar(f64),
    /// `x ^ p` (floats only).
    PowScalar(f64),
    /// `min(max(x, min), max)` (NaN stays NaN; for ints the bounds are truncated).
    Clamp {
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
    /// `x < 0 ? x * slope : x`.
    LeakyRelu(f64),
}

impl UnaryOp {
    /// The kernel's op code (`U_*` in `elementwise.cu`).
    pub(crate) fn code(self) -> i32 {
        match self {
            UnaryOp::Neg => 0,
            UnaryOp::Abs => 1,
            UnaryOp::Exp => 2,
            UnaryOp::Log => 3,
            UnaryOp::Log1p => 4,
            UnaryOp::Expm1 => 5,
            UnaryOp::Sqrt => 6,
            UnaryOp::Rsqrt => 7,
            UnaryOp::Recip => 8,
            UnaryOp::Sin => 9,
            UnaryOp::Cos => 10,
            UnaryOp::Tan => 11,
            UnaryOp::Tanh => 12,
            UnaryOp::Sigmoid => 13,
            UnaryOp::Relu => 14,
            UnaryOp::Gelu => 15,
            UnaryOp::Erf => 16,
            UnaryOp::Floor => 17,
            UnaryOp::Ceil => 18,
            UnaryOp::Round => 19,
            UnaryOp::Trunc => 20,
            UnaryOp::Sign => 21,
            UnaryOp::Square => 22,
            UnaryOp::AddScalar(_) => 23,
            UnaryOp::MulScalar(_) => 24,
            UnaryOp::PowScalar(_) => 25,
            UnaryOp::Clamp { .. } => 26,
            UnaryOp::LeakyRelu(_) => 27,
        }
    }

    /// The two scalar parameters (`p0`, `p1`).
    fn params(self) -> (f64, f64) {
        match self {
            UnaryOp::AddScalar(s) | UnaryOp::MulScalar(s) | UnaryOp::PowScalar(s) | UnaryOp::LeakyRelu(s) => (s, 0.0),
            UnaryOp::Clamp { min, max } => (min, max),
            _ => (0.0, 0.0),
        }
    }

    /// Whether the op is defined on integer dtypes.
    fn supports_int(self) -> bool {
        matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::Square
                | UnaryOp::AddScalar(_)
                | UnaryOp::MulScalar(_)
                | UnaryOp::Clamp { .. }
        )
    }
}

/// A binary operation (the kernels' `op` code is the declaration order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b` (ints wrap).
    Add,
    /// `a - b` (ints wrap).
    Sub,
    /// `a * b` (ints wrap).
    Mul,
    /// `a / b`; ints truncate toward zero and division by zero gives 0.
    Div,
    /// Remainder with the sign of the divisor (floor mod, like Python); ints: `x % 0 == 0`.
    Rem,
    /// `a ^ b`; ints: integer power, negative exponents give 0 except for bases 1 and -1.
    Pow,
    /// Larger of the two (floats: NaN propagates).
    Max,
    /// Smaller of the two (floats: NaN propagates).
    Min,
    /// `atan2(a, b)` (floats only).
    Atan2,
    /// Bitwise and (ints and bool only).
    BitAnd,
    /// Bitwise or (ints and bool only).
    BitOr,
    /// Bitwise xor (ints and bool only).
    BitXor,
    /// The ReLU gradient `a` at output `b`: 0 where `b <= 0`, else `a` (floats only).
    ReluBackward,
    /// The GELU gradient `a` at input `b`, with the derivative of GELU's tanh approximation
    /// (what Burn's default `gelu_backward` computes; floats only).
    GeluBackward,
}

impl BinaryOp {
    /// The kernel's op code (`B_*` in `elementwise.cu`).
    pub(crate) fn code(self) -> i32 {
        self as i32
    }

    fn is_bitwise(self) -> bool {
        matches!(self, BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor)
    }

    /// Whether the op is defined for `dtype`.
    pub(crate) fn supports(self, dtype: DataType) -> bool {
        if dtype.is_float() {
            !self.is_bitwise()
        } else if dtype == DataType::Bool {
            self.is_bitwise()
        } else {
            !matches!(self, BinaryOp::Atan2 | BinaryOp::ReluBackward | BinaryOp::GeluBackward)
        }
    }
}

/// A comparison; the result is one byte 0/1. NaN compares false except for `Ne`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

// ---------------------------------------------------------------------------------------
// Plans (pure host logic)

/// Index of `dtype` in the per-dtype entry tables, also the `cast` kernel's dtype code
/// (`DT_*` in `elementwise.cu`).
fn dtype_code(dtype: DataType) -> usize {
    match dtype {
        DataType::F32 => 0,
        DataType::F16 => 1,
        DataType::BF16 => 2,
        DataType::F64 => 3,
        DataType::I32 => 4,
        DataType::I64 => 5,
        DataType::U8 => 6,
        DataType::I8 => 7,
        DataType::Bool => 8,
    }
}

// Entry points per dtype, in `dtype_code` order (bool uses the u8 kernels).
const UNARY_ENTRIES: [&str; 9] = [
    "unary_f32",
    "unary_f16",
    "unary_bf16",
    "unary_f64",
    "unary_i32",
    "unary_i64",
    "unary_u8",
    "unary_i8",
    "unary_u8",
];
const BINARY_ENTRIES: [&str; 9] = [
    "binary_f32",
    "binary_f16",
    "binary_bf16",
    "binary_f64",
    "binary_i32",
    "binary_i64",
    "binary_u8",
    "binary_i8",
    "binary_u8",
];
const BINARY_SCALAR_ENTRIES: [&str; 9] = [
    "binary_scalar_f32",
    "binary_scalar_f16",
    "binary_scalar_bf16",
    "binary_scalar_f64",
    "binary_scalar_i32",
    "binary_scalar_i64",
    "binary_scalar_u8",
    "binary_scalar_i8",
    "binary_scalar_u8",
];
const COMPARE_SCALAR_ENTRIES: [&str; 9] = [
    "compare_scalar_f32",
    "compare_scalar_f16",
    "compare_scalar_bf16",
    "compare_scalar_f64",
    "compare_scalar_i32",
    "compare_scalar_i64",
    "compare_scalar_u8",
    "compare_scalar_i8",
    "compare_scalar_u8",
];
const COMPARE_ENTRIES: [&str; 9] = [
    "compare_f32",
    "compare_f16",
    "compare_bf16",
    "compare_f64",
    "compare_i32",
    "compare_i64",
    "compare_u8",
    "compare_i8",
    "compare_u8",
];

/// `<family>_b{1,2,4,8}` by element size.
fn sized_entry(family: &str, dtype: DataType) -> &'static str {
    match (family, dtype.size()) {
        ("fill", 1) => "fill_b1",
        ("fill", 2) => "fill_b2",
        ("fill", 4) => "fill_b4",
        ("fill", _) => "fill_b8",
        ("copy", 1) => "copy_b1",
        ("copy", 2) => "copy_b2",
        ("copy", 4) => "copy_b4",
        ("copy", _) => "copy_b8",
        (_, 1) => "where_b1",
        (_, 2) => "where_b2",
        (_, 4) => "where_b4",
        _ => "where_b8",
    }
}

/// Validates `out` and `inputs`, broadcasts the inputs to `out.dims`, merges dims jointly
/// and packs the layouts (inputs in order, then `out`). `None` when `out` is empty.
fn prepare(
    op: &'static str,
    out_arg: &'static str,
    out: &TensorRef,
    inputs: &[(&'static str, &TensorRef)],
) -> Result<Option<(Vec<KernelLayout>, i64)>> {
    let n = check_tensor(op, out_arg, out)?;
    check_no_overlap(op, out_arg, out)?;
    let mut strides = Vec::with_capacity(inputs.len() + 1);
    for (arg, t) in inputs {
        check_tensor(op, arg, t)?;
        strides.push(
            broadcast_strides(op, &t.dims, &t.strides, &out.dims)
                .map_err(|e| Error::invalid_arg(op, arg, e.to_string()))?,
        );
    }
    strides.push(out.strides.clone());
    if n == 0 {
        return Ok(None);
    }
    let (shape, strides) = coalesce(&out.dims, &strides);
    let layouts = strides
        .iter()
        .map(|s| kernel_layout(op, &shape, s))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((layouts, n)))
}

fn array<const N: usize>(v: Vec<KernelLayout>) -> [KernelLayout; N] {
    let mut a = [KernelLayout::default(); N];
    a.copy_from_slice(&v);
    a
}

/// What `fill` launches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FillPlan {
    pub entry: &'static str,
    pub layout: KernelLayout,
    pub n: i64,
    pub bits: u64,
}

/// The bit pattern of `value` in `dtype` (float -> int truncates, NaN -> 0, wraps to the
/// width like the cast kernel; bool: `value != 0`).
fn fill_bits(dtype: DataType, value: f64) -> u64 {
    let int = if value.is_nan() { 0 } else { value as i64 };
    match dtype {
        DataType::F32 => (value as f32).to_bits() as u64,
        DataType::F16 => half::f16::from_f64(value).to_bits() as u64,
        DataType::BF16 => half::bf16::from_f64(value).to_bits() as u64,
        DataType::F64 => value.to_bits(),
        DataType::I32 => int as i32 as u32 as u64,
        DataType::I64 => int as u64,
        DataType::U8 => int as u8 as u64,
        DataType::I8 => int as i8 as u8 as u64,
        DataType::Bool => (value != 0.0) as u64,
    }
}

pub(crate) fn plan_fill(out: &TensorRef, value: f64) -> Result<Option<FillPlan>> {
    Ok(prepare("fill", "out", out, &[])?.map(|(l, n)| FillPlan {
        entry: sized_entry("fill", out.dtype),
        layout: l[0],
        n,
        bits: fill_bits(out.dtype, value),
    }))
}

/// What `copy` launches: a bit copy for equal dtypes, else `cast` with two dtype codes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CopyPlan {
    pub entry: &'static str,
    /// `Some((src code, dst code))` for `cast`.
    pub cast: Option<(i32, i32)>,
    pub layouts: [KernelLayout; 2],
    pub n: i64,
}

pub(crate) fn plan_copy(src: &TensorRef, dst: &TensorRef) -> Result<Option<CopyPlan>> {
    let prepared = prepare("copy", "dst", dst, &[("src", src)])?;
    let (entry, cast) = if src.dtype == dst.dtype {
        (sized_entry("copy", dst.dtype), None)
    } else {
        (
            "cast",
            Some((dtype_code(src.dtype) as i32, dtype_code(dst.dtype) as i32)),
        )
    };
    Ok(prepared.map(|(l, n)| CopyPlan {
        entry,
        cast,
        layouts: array(l),
        n,
    }))
}

/// What `unary` launches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct UnaryPlan {
    pub entry: &'static str,
    pub op: i32,
    pub params: UnaryParams,
    pub layouts: [KernelLayout; 2],
    pub n: i64,
}

/// Float scalar -> integer kernel parameter (truncates toward zero, saturates, NaN -> 0).
fn int_param(v: f64) -> i64 {
    if v.is_nan() {
        0
    } else {
        v as i64
    }
}

pub(crate) fn plan_unary(op: UnaryOp, x: &TensorRef, out: &TensorRef) -> Result<Option<UnaryPlan>> {
    same_dtype("unary", "x", x, out.dtype, "the output")?;
    let dtype = out.dtype;
    let params = if dtype.is_float() {
        let (p0, p1) = op.params();
        UnaryParams::Float(p0, p1)
    } else if dtype != DataType::Bool && op.supports_int() {
        let (p0, p1) = op.params();
        UnaryParams::Int(int_param(p0), int_param(p1))
    } else {
        return Err(Error::invalid_arg(
            "unary",
            "op",
            format!("{op:?} is not defined for {dtype:?}"),
        ));
    };
    let prepared = prepare("unary", "out", out, &[("x", x)])?;
    Ok(prepared.map(|(l, n)| UnaryPlan {
        entry: UNARY_ENTRIES[dtype_code(dtype)],
        op: op.code(),
        params,
        layouts: array(l),
        n,
    }))
}

/// What `binary` and `compare` launch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BinaryPlan {
    pub entry: &'static str,
    pub op: i32,
    pub layouts: [KernelLayout; 3],
    pub n: i64,
}

pub(crate) fn plan_binary(op: BinaryOp, a: &TensorRef, b: &TensorRef, out: &TensorRef) -> Result<Option<BinaryPlan>> {
    same_dtype("binary", "a", a, out.dtype, "the output")?;
    same_dtype("binary", "b", b, out.dtype, "the output")?;
    let dtype = out.dtype;
    if !op.supports(dtype) {
        return Err(Error::invalid_arg(
            "binary",
            "op",
            format!("{op:?} is not defined for {dtype:?}"),
        ));
    }
    let prepared = prepare("binary", "out", out, &[("a", a), ("b", b)])?;
    Ok(prepared.map(|(l, n)| BinaryPlan {
        entry: BINARY_ENTRIES[dtype_code(dtype)],
        op: op.code(),
        layouts: array(l),
        n,
    }))
}

pub(crate) fn plan_compare(op: CompareOp, a: &TensorRef, b: &TensorRef, out: &TensorRef) -> Result<Option<BinaryPlan>> {
    if !matches!(out.dtype, DataType::Bool | DataType::U8) {
        return Err(Error::invalid_arg(
            "compare",
            "out",
            format!("dtype {:?} is not Bool or U8", out.dtype),
        ));
    }
    same_dtype("compare", "b", b, a.dtype, "the output").map_err(|_| {
        Error::invalid_arg(
            "compare",
            "b",
            format!("dtype {:?} differs from a's {:?}", b.dtype, a.dtype),
        )
    })?;
    let prepared = prepare("compare", "out", out, &[("a", a), ("b", b)])?;
    Ok(prepared.map(|(l, n)| BinaryPlan {
        entry: COMPARE_ENTRIES[dtype_code(a.dtype)],
        op: op as i32,
        layouts: array(l),
        n,
    }))
}

/// `value` as the by-value scalar operand of a kernel on `dtype`: rounded to the dtype
/// exactly as a one-element tensor of it would hold it (floats round, ints truncate and
/// wrap to their width, bool is `!= 0`), then widened to the kernel's parameter type.
fn scalar_param(dtype: DataType, value: f64) -> ScalarParam {
    let bits = fill_bits(dtype, value);
    match dtype {
        DataType::F32 => ScalarParam::Float(f32::from_bits(bits as u32) as f64),
        DataType::F16 => ScalarParam::Float(half::f16::from_bits(bits as u16).to_f64()),
        DataType::BF16 => ScalarParam::Float(half::bf16::from_bits(bits as u16).to_f64()),
        DataType::F64 => ScalarParam::Float(value),
        DataType::I32 => ScalarParam::Int(bits as u32 as i32 as i64),
        DataType::I64 => ScalarParam::Int(bits as i64),
        DataType::I8 => ScalarParam::Int(bits as u8 as i8 as i64),
        DataType::U8 | DataType::Bool => ScalarParam::Int(bits as u8 as i64),
    }
}

/// What `binary_scalar` and `compare_scalar` launch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ScalarPlan {
    pub entry: &'static str,
    pub op: i32,
    pub scalar: ScalarParam,
    pub layouts: [KernelLayout; 2],
    pub n: i64,
}

pub(crate) fn plan_binary_scalar(op: BinaryOp, a: &TensorRef, s: f64, out: &TensorRef) -> Result<Option<ScalarPlan>> {
    same_dtype("binary_scalar", "a", a, out.dtype, "the output")?;
    let dtype = out.dtype;
    if !op.supports(dtype) {
        return Err(Error::invalid_arg(
            "binary_scalar",
            "op",
            format!("{op:?} is not defined for {dtype:?}"),
        ));
    }
    let prepared = prepare("binary_scalar", "out", out, &[("a", a)])?;
    Ok(prepared.map(|(l, n)| ScalarPlan {
        entry: BINARY_SCALAR_ENTRIES[dtype_code(dtype)],
        op: op.code(),
        scalar: scalar_param(dtype, s),
        layouts: array(l),
        n,
    }))
}

pub(crate) fn plan_compare_scalar(op: CompareOp, a: &TensorRef, s: f64, out: &TensorRef) -> Result<Option<ScalarPlan>> {
    if !matches!(out.dtype, DataType::Bool | DataType::U8) {
        return Err(Error::invalid_arg(
            "compare_scalar",
            "out",
            format!("dtype {:?} is not Bool or U8", out.dtype),
        ));
    }
    let prepared = prepare("compare_scalar", "out", out, &[("a", a)])?;
    Ok(prepared.map(|(l, n)| ScalarPlan {
        entry: COMPARE_SCALAR_ENTRIES[dtype_code(a.dtype)],
        op: op as i32,
        scalar: scalar_param(a.dtype, s),
        layouts: array(l),
        n,
    }))
}

/// What `where_` launches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WherePlan {
    pub entry: &'static str,
    pub layouts: [KernelLayout; 4],
    pub n: i64,
}

pub(crate) fn plan_where(cond: &TensorRef, a: &TensorRef, b: &TensorRef, out: &TensorRef) -> Result<Option<WherePlan>> {
    if !matches!(cond.dtype, DataType::Bool | DataType::U8) {
        return Err(Error::invalid_arg(
            "where",
            "cond",
            format!("dtype {:?} is not Bool or U8", cond.dtype),
        ));
    }
    same_dtype("where", "a", a, out.dtype, "the output")?;
    same_dtype("where", "b", b, out.dtype, "the output")?;
    let prepared = prepare("where", "out", out, &[("cond", cond), ("a", a), ("b", b)])?;
    Ok(prepared.map(|(l, n)| WherePlan {
        entry: sized_entry("where", out.dtype),
        layouts: array(l),
        n,
    }))
}

// ---------------------------------------------------------------------------------------
// Public API

/// Sets every element of `out` to `value` converted to `out.dtype` (ints: truncated toward
/// zero, NaN -> 0, wrapped to the width; bool: `value != 0`).
pub fn fill(stream: &Arc<CudaStream>, out: &TensorRef, value: f64) -> Result<()> {
    let Some(p) = plan_fill(out, value)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::fill(stream, &f, out.ptr, &p.layout, p.n, p.bits)
}

/// Copies `src` (broadcast to `dst.dims`) into `dst`, casting when the dtypes differ
/// (any pair of dtypes; float -> int truncates toward zero with NaN -> 0 and wraps to the
/// width; to bool: `!= 0`).
pub fn copy(stream: &Arc<CudaStream>, src: &TensorRef, dst: &TensorRef) -> Result<()> {
    let Some(p) = plan_copy(src, dst)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    match p.cast {
        Some((s, d)) => launch::cast(stream, &f, src.ptr, s, dst.ptr, d, &p.layouts, p.n),
        None => launch::copy(stream, &f, src.ptr, dst.ptr, &p.layouts, p.n),
    }
}

/// `out = op(x)` with `x` broadcast to `out.dims` and of `out`'s dtype. Float ops run on
/// f32/f16/bf16/f64 (f16/bf16 in f32); ints (not bool) support `Neg`, `Abs`, `Sign`,
/// `Square`, `AddScalar`, `MulScalar` and `Clamp`.
pub fn unary(stream: &Arc<CudaStream>, op: UnaryOp, x: &TensorRef, out: &TensorRef) -> Result<()> {
    let Some(p) = plan_unary(op, x, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::unary(stream, &f, x.ptr, out.ptr, &p.layouts, p.n, p.op, p.params)
}

/// `out = a op b` with `a` and `b` broadcast to `out.dims`, all of one dtype. Bitwise ops
/// on ints and bool only (bool supports only those), `Atan2` on floats only.
pub fn binary(stream: &Arc<CudaStream>, op: BinaryOp, a: &TensorRef, b: &TensorRef, out: &TensorRef) -> Result<()> {
    let Some(p) = plan_binary(op, a, b, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::binary(stream, &f, a.ptr, b.ptr, out.ptr, &p.layouts, p.n, p.op)
}

/// `out = a op s` for a scalar `s` passed to the kernel by value (no one-element tensor,
/// no fill launch); `s` is first rounded to the dtype like a tensor of it. The ops and
/// dtypes of [`binary`].
pub fn binary_scalar(stream: &Arc<CudaStream>, op: BinaryOp, a: &TensorRef, s: f64, out: &TensorRef) -> Result<()> {
    let Some(p) = plan_binary_scalar(op, a, s, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::with_scalar(stream, &f, a.ptr, out.ptr, &p.layouts, p.n, p.op, p.scalar)
}

/// `out = a op s` as 0/1 bytes for a scalar `s` passed by value (rounded to `a`'s dtype
/// first). NaN compares false except for `Ne`.
pub fn compare_scalar(stream: &Arc<CudaStream>, op: CompareOp, a: &TensorRef, s: f64, out: &TensorRef) -> Result<()> {
    let Some(p) = plan_compare_scalar(op, a, s, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::with_scalar(stream, &f, a.ptr, out.ptr, &p.layouts, p.n, p.op, p.scalar)
}

/// `out = a op b` as 0/1 bytes (`out` Bool or U8), `a` and `b` of one dtype and broadcast
/// to `out.dims`. NaN compares false except for `Ne`.
pub fn compare(stream: &Arc<CudaStream>, op: CompareOp, a: &TensorRef, b: &TensorRef, out: &TensorRef) -> Result<()> {
    let Some(p) = plan_compare(op, a, b, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::binary(stream, &f, a.ptr, b.ptr, out.ptr, &p.layouts, p.n, p.op)
}

/// `out = cond ? a : b` elementwise (`cond` Bool or U8, nonzero is true), all broadcast to
/// `out.dims`; `a`, `b` and `out` of one dtype.
pub fn where_(stream: &Arc<CudaStream>, cond: &TensorRef, a: &TensorRef, b: &TensorRef, out: &TensorRef) -> Result<()> {
    let Some(p) = plan_where(cond, a, b, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::where_(stream, &f, cond.ptr, a.ptr, b.ptr, out.ptr, &p.layouts, p.n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef {
        TensorRef::contiguous(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef {
        TensorRef::new(dims, strides, dtype, P)
    }

    fn invalid(r: Result<impl std::fmt::Debug>) -> (&'static str, &'static str, String) {
        match r {
            Err(Error::InvalidArgument { op, arg, reason }) => (op, arg, reason),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn op_codes_follow_declaration_order() {
        assert_eq!(UnaryOp::Neg.code(), 0);
        assert_eq!(UnaryOp::Square.code(), 22);
        assert_eq!(UnaryOp::LeakyRelu(0.1).code(), 27);
        assert_eq!(UnaryOp::Clamp { min: 1.0, max: 2.0 }.params(), (1.0, 2.0));
        assert_eq!(BinaryOp::Atan2.code(), 8);
        assert_eq!(BinaryOp::BitXor.code(), 11);
        assert_eq!(BinaryOp::ReluBackward.code(), 12);
        assert_eq!(BinaryOp::GeluBackward.code(), 13);
        assert_eq!(CompareOp::Ge as i32, 5);
    }

    #[test]
    fn entry_names_by_dtype() {
        use DataType::*;
        let x = |d| t(&[4], d);
        let names: Vec<_> = [F32, F16, BF16, F64, I32, I64, U8, I8]
            .into_iter()
            .map(|d| plan_unary(UnaryOp::Neg, &x(d), &x(d)).unwrap().unwrap().entry)
            .collect();
        assert_eq!(
            names,
            [
                "unary_f32",
                "unary_f16",
                "unary_bf16",
                "unary_f64",
                "unary_i32",
                "unary_i64",
                "unary_u8",
                "unary_i8"
            ]
        );
        let p = plan_binary(BinaryOp::BitAnd, &x(Bool), &x(Bool), &x(Bool))
            .unwrap()
            .unwrap();
        assert_eq!(p.entry, "binary_u8");
        let p = plan_compare(CompareOp::Lt, &x(BF16), &x(BF16), &x(Bool))
            .unwrap()
            .unwrap();
        assert_eq!((p.entry, p.op), ("compare_bf16", 2));
        for (d, e) in [
            (Bool, "where_b1"),
            (F16, "where_b2"),
            (I32, "where_b4"),
            (F64, "where_b8"),
        ] {
            assert_eq!(plan_where(&x(Bool), &x(d), &x(d), &x(d)).unwrap().unwrap().entry, e);
        }
        for (d, e) in [(I8, "fill_b1"), (BF16, "fill_b2"), (F32, "fill_b4"), (I64, "fill_b8")] {
            assert_eq!(plan_fill(&x(d), 1.0).unwrap().unwrap().entry, e);
        }
        let p = plan_copy(&x(F16), &x(F16)).unwrap().unwrap();
        assert_eq!((p.entry, p.cast), ("copy_b2", None));
        let p = plan_copy(&x(I64), &x(Bool)).unwrap().unwrap();
        assert_eq!((p.entry, p.cast), ("cast", Some((5, 8))));
    }

    #[test]
    fn fill_bit_patterns() {
        assert_eq!(fill_bits(DataType::F32, 1.5), 1.5f32.to_bits() as u64);
        assert_eq!(fill_bits(DataType::F16, 1.0), 0x3c00);
        assert_eq!(fill_bits(DataType::BF16, 1.0), 0x3f80);
        assert_eq!(fill_bits(DataType::F64, -2.0), (-2.0f64).to_bits());
        assert_eq!(fill_bits(DataType::I32, -1.7), 0xffff_ffff);
        assert_eq!(fill_bits(DataType::I64, f64::NAN), 0);
        assert_eq!(fill_bits(DataType::I64, -3.9), (-3i64) as u64);
        assert_eq!(fill_bits(DataType::U8, 300.0), 44);
        assert_eq!(fill_bits(DataType::I8, -1.0), 0xff);
        assert_eq!(fill_bits(DataType::Bool, 0.5), 1);
        assert_eq!(fill_bits(DataType::Bool, 0.0), 0);
    }

    #[test]
    fn unsupported_ops_name_op_and_dtype() {
        let x = t(&[3], DataType::I32);
        let (op, arg, why) = invalid(plan_unary(UnaryOp::Exp, &x, &x));
        assert_eq!((op, arg), ("unary", "op"));
        assert!(why.contains("Exp") && why.contains("I32"), "{why}");
        let b = t(&[3], DataType::Bool);
        invalid(plan_unary(UnaryOp::Neg, &b, &b));
        let (_, _, why) = invalid(plan_binary(
            BinaryOp::BitOr,
            &t(&[3], DataType::F32),
            &t(&[3], DataType::F32),
            &t(&[3], DataType::F32),
        ));
        assert!(why.contains("BitOr") && why.contains("F32"), "{why}");
        invalid(plan_binary(BinaryOp::Atan2, &x, &x, &x));
        invalid(plan_binary(BinaryOp::Add, &b, &b, &b));
        // Supported int ops plan fine, with scalars truncated.
        let p = plan_unary(UnaryOp::Clamp { min: -2.7, max: 5.9 }, &x, &x)
            .unwrap()
            .unwrap();
        assert_eq!(p.params, UnaryParams::Int(-2, 5));
        let f = t(&[3], DataType::F16);
        let p = plan_unary(UnaryOp::PowScalar(2.5), &f, &f).unwrap().unwrap();
        assert_eq!(p.params, UnaryParams::Float(2.5, 0.0));
    }

    #[test]
    fn dtype_mismatches_are_errors() {
        let f = t(&[3], DataType::F32);
        let h = t(&[3], DataType::F16);
        assert_eq!(invalid(plan_unary(UnaryOp::Neg, &h, &f)).1, "x");
        assert_eq!(invalid(plan_binary(BinaryOp::Add, &f, &h, &f)).1, "b");
        assert_eq!(invalid(plan_compare(CompareOp::Eq, &f, &f, &f)).1, "out");
        assert_eq!(
            invalid(plan_compare(CompareOp::Eq, &f, &h, &t(&[3], DataType::Bool))).1,
            "b"
        );
        assert!(plan_compare(CompareOp::Eq, &h, &h, &t(&[3], DataType::U8)).is_ok());
        assert_eq!(invalid(plan_where(&f, &f, &f, &f)).1, "cond");
        assert_eq!(invalid(plan_where(&t(&[3], DataType::U8), &f, &h, &f)).1, "b");
    }

    #[test]
    fn shape_and_stride_errors() {
        let f = DataType::F32;
        // dims/strides length mismatch
        assert_eq!(invalid(plan_fill(&ts(&[2, 3], &[3], f), 0.0)).1, "out");
        assert_eq!(invalid(plan_copy(&ts(&[3], &[1, 1], f), &t(&[3], f))).1, "src");
        // negative dim
        invalid(plan_fill(&ts(&[-1], &[1], f), 0.0));
        // not broadcastable / input larger than output
        assert_eq!(
            invalid(plan_binary(BinaryOp::Add, &t(&[4], f), &t(&[3], f), &t(&[3], f))).1,
            "a"
        );
        invalid(plan_unary(UnaryOp::Neg, &t(&[2, 3], f), &t(&[3], f)));
        // overlapping outputs
        let (_, arg, why) = invalid(plan_fill(&ts(&[4, 3], &[0, 1], f), 0.0));
        assert_eq!(arg, "out");
        assert!(why.contains("overlap"), "{why}");
        invalid(plan_fill(&ts(&[4, 3], &[2, 1], f), 0.0));
        invalid(plan_copy(&t(&[3], f), &ts(&[3], &[0], f)));
        // a 0 stride on a size-1 dim and negative strides are fine
        assert!(plan_fill(&ts(&[1, 3], &[0, 1], f), 0.0).unwrap().is_some());
        assert!(plan_fill(&ts(&[2, 3], &[-3, 1], f), 0.0).unwrap().is_some());
        // null pointer
        invalid(plan_fill(&TensorRef::contiguous(&[3], f, 0), 0.0));
        // too many dims after merging
        let dims = [2i64; 9];
        let strides: Vec<i64> = (0..9).map(|i| 1i64 << (2 * (8 - i))).collect();
        invalid(plan_fill(&ts(&dims, &strides, f), 0.0));
    }

    #[test]
    fn empty_outputs_plan_nothing_but_still_validate() {
        let f = DataType::F32;
        assert!(plan_fill(&t(&[0, 3], f), 1.0).unwrap().is_none());
        assert!(plan_fill(&TensorRef::contiguous(&[0], f, 0), 1.0).unwrap().is_none());
        assert!(
            plan_binary(BinaryOp::Add, &t(&[1, 3], f), &t(&[0, 3], f), &t(&[0, 3], f))
                .unwrap()
                .is_none()
        );
        invalid(plan_binary(
            BinaryOp::Add,
            &t(&[2, 3], f),
            &t(&[0, 3], f),
            &t(&[0, 3], f),
        ));
        invalid(plan_unary(UnaryOp::Exp, &t(&[0], DataType::I8), &t(&[0], DataType::I8)));
    }

    #[test]
    fn broadcast_and_merge_layouts() {
        let f = DataType::F32;
        // [1, 4] + [3, 4] -> [3, 4]: packed out merges nothing with a broadcast operand.
        let p = plan_binary(BinaryOp::Add, &t(&[1, 4], f), &t(&[3, 4], f), &t(&[3, 4], f))
            .unwrap()
            .unwrap();
        assert_eq!(p.n, 12);
        assert_eq!(p.layouts[0].rank, 2);
        assert_eq!(&p.layouts[0].strides[..2], &[0, 1]);
        assert_eq!(&p.layouts[1].strides[..2], &[4, 1]);
        // A missing leading dim and all-packed operands merge into one dim.
        let p = plan_binary(BinaryOp::Mul, &t(&[2, 3, 4], f), &t(&[2, 3, 4], f), &t(&[2, 3, 4], f))
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.layouts[2].rank, p.layouts[2].shape[0], p.layouts[2].strides[0]),
            (1, 24, 1)
        );
        let p = plan_unary(UnaryOp::Neg, &t(&[4], f), &t(&[5, 4], f)).unwrap().unwrap();
        assert_eq!(&p.layouts[0].strides[..2], &[0, 1]);
        // A transposed input keeps two dims.
        let p = plan_copy(&ts(&[3, 5], &[1, 3], f), &t(&[3, 5], f)).unwrap().unwrap();
        assert_eq!((p.layouts[0].rank, &p.layouts[0].strides[..2]), (2, &[1i64, 3][..]));
        // A scalar output is rank 0.
        let p = plan_fill(&t(&[], f), 2.0).unwrap().unwrap();
        assert_eq!((p.layout.rank, p.n), (0, 1));
    }
}
