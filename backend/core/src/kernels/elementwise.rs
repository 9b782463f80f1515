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
//!
//! `unary`, `binary` and `binary_scalar` on float dtypes run vector kernels
//! (`unary_vec_<dt>`, ...: V consecutive elements per thread step, one 4-, 8- or 16-byte
//! access per operand) when the merged layouts and the device addresses allow it (see
//! [`vector_width`]: contiguous tensors, row-broadcast biases, broadcast scalars and columns,
//! aligned views); every other layout runs the one-element-per-step kernels.

use crate::kernels::check::{check_no_overlap, check_tensor, on_stream, same_dtype};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_elementwise::{self as launch, ScalarParam, UnaryParams, VecStep};
use crate::graph::DataType;
use crate::kernels::layout::{broadcast_strides, coalesce, in_memory_order, kernel_layout};
use crate::kernels::{stream_function, ELEMENTWISE};
use crate::types::{TensorMut, TensorRef};

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
    #[doc(hidden)]
    pub fn code(self) -> i32 {
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

/// Vector entry points (`unary_vec_<dt>` in `elementwise.cu`) per float dtype, in
/// `dtype_code` order (F32, F16, BF16, F64).
pub(crate) const UNARY_VEC_ENTRIES: [&str; 4] = ["unary_vec_f32", "unary_vec_f16", "unary_vec_bf16", "unary_vec_f64"];
/// Vector entry points `binary_vec_<dt>`, in the order of [`UNARY_VEC_ENTRIES`].
pub(crate) const BINARY_VEC_ENTRIES: [&str; 4] =
    ["binary_vec_f32", "binary_vec_f16", "binary_vec_bf16", "binary_vec_f64"];
/// Vector entry points `binary_scalar_vec_<dt>`, in the order of [`UNARY_VEC_ENTRIES`].
pub(crate) const BINARY_SCALAR_VEC_ENTRIES: [&str; 4] = [
    "binary_scalar_vec_f32",
    "binary_scalar_vec_f16",
    "binary_scalar_vec_bf16",
    "binary_scalar_vec_f64",
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
    strides.push(out.strides.to_vec());
    if n == 0 {
        return Ok(None);
    }
    let lead = strides.len() - 1;
    let (shape, strides) = in_memory_order(&out.dims, &strides, lead);
    let (shape, strides) = coalesce(&shape, &strides);
    let layouts = strides
        .iter()
        .map(|s| kernel_layout(op, &shape, s))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((layouts, n)))
}

// ---------------------------------------------------------------------------------------
// Vector steps: which launches move V consecutive elements per thread step

/// Widest vector step of a dtype's vector kernels: one 16-byte access.
const VECTOR_BYTES: usize = 16;

/// The innermost stride of an operand's (coalesced) layout; `None` for rank 0.
fn inner_stride(l: &KernelLayout) -> Option<i64> {
    let rank = l.rank as usize;
    (rank > 0).then(|| l.strides[rank - 1])
}

/// Whether an operand with innermost stride 1, starting at byte address `addr`, can be
/// moved `vec` elements of `elem_size` bytes at a time: its start is aligned to the vector
/// and every outer stride is a multiple of `vec` (so every group start stays aligned).
fn vector_aligned(l: &KernelLayout, addr: u64, vec: i64, elem_size: usize) -> bool {
    let rank = l.rank as usize;
    addr.is_multiple_of(vec as u64 * elem_size as u64) && l.strides[..rank - 1].iter().all(|s| s % vec == 0)
}

/// Elements per thread step for a launch over the jointly coalesced `layouts` (inputs
/// first, the output last) whose views start at byte addresses `addrs`, with elements of
/// `elem_size` bytes: the widest V in 8, 4, 2 (at most 16 bytes) such that the output's
/// innermost stride is 1, every input's is 1 (vector access) or 0 (broadcast: one load per
/// group), the innermost dim is a multiple of V, and every vector-accessed operand is
/// [`vector_aligned`]. 1 (the scalar kernels) when there is none.
fn choose_vector_width(layouts: &[KernelLayout], addrs: &[u64], elem_size: usize) -> u32 {
    let Some(out) = layouts.last() else {
        return 1;
    };
    if inner_stride(out) != Some(1) || layouts.iter().any(|l| !matches!(inner_stride(l), Some(0 | 1))) {
        return 1;
    }
    let inner = out.shape[out.rank as usize - 1];
    let widest = (VECTOR_BYTES / elem_size.max(1)) as i64;
    [8i64, 4, 2]
        .into_iter()
        .filter(|&v| v <= widest && inner % v == 0)
        .find(|&v| {
            layouts
                .iter()
                .zip(addrs)
                .all(|(l, &addr)| inner_stride(l) == Some(0) || vector_aligned(l, addr, v, elem_size))
        })
        .map_or(1, |v| v as u32)
}

/// [`choose_vector_width`] for a launch on `dtype`: 1 for the non-float dtypes (which have
/// no vector kernels).
fn float_vector_width(dtype: DataType, layouts: &[KernelLayout], addrs: &[u64]) -> u32 {
    if dtype.is_float() {
        choose_vector_width(layouts, addrs, dtype.size())
    } else {
        1
    }
}

/// `l` walked in groups of `vec` consecutive innermost elements: the innermost dim divided
/// by `vec`, its stride multiplied by it (0 stays 0), 32-bit indexing when the groups fit.
fn group_layout(l: &KernelLayout, vec: i64) -> KernelLayout {
    let rank = l.rank as usize;
    let mut g = *l;
    g.shape[rank - 1] /= vec;
    g.strides[rank - 1] *= vec;
    let groups = g.shape[..rank].iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
    g.index32 = groups.is_some_and(|n| n < 1 << 31) as i32;
    g
}

/// The layouts a launch of step `vec` takes: group layouts for a vector kernel, unchanged
/// for the scalar kernels (`vec` 1).
fn step_layouts(layouts: Vec<KernelLayout>, vec: u32) -> Vec<KernelLayout> {
    if vec <= 1 {
        return layouts;
    }
    layouts.iter().map(|l| group_layout(l, i64::from(vec))).collect()
}

/// The vector launch of a plan with `vec` elements per step over `n` elements; `None` for
/// the scalar kernels.
fn vec_step(vec: u32, n: i64, op: i32) -> Option<VecStep> {
    (vec > 1).then(|| VecStep {
        groups: n / i64::from(vec),
        vec: vec as i32,
        op,
    })
}

/// Elements per thread step that [`unary`], [`binary`] and [`binary_scalar`] use for these
/// operands (broadcast to `out.dims`, at their device addresses): V > 1 when they run a
/// vector kernel (a float dtype; the output and every input with innermost stride 1 or 0
/// after merging dims; the innermost dim a multiple of V; every input with stride 1, and
/// the output, aligned to V elements with outer strides that are multiples of V), 1 when
/// they run the one-element-per-step kernels. `Ok(1)` for an empty output.
pub fn vector_width(inputs: &[&TensorRef], out: &TensorRef) -> Result<u32> {
    for x in inputs {
        same_dtype("vector_width", "input", x, out.dtype, "the output")?;
    }
    let named: Vec<(&'static str, &TensorRef)> = inputs.iter().map(|x| ("input", *x)).collect();
    let Some((layouts, _)) = prepare("vector_width", "out", out, &named)? else {
        return Ok(1);
    };
    let addrs: Vec<u64> = inputs.iter().map(|x| x.ptr).chain(std::iter::once(out.ptr)).collect();
    Ok(float_vector_width(out.dtype, &layouts, &addrs))
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

/// `p` (a copy without cast of `elem`-byte elements from address `src` to `dst`) moving
/// 16- or 8-byte groups of consecutive elements when both operands allow it: a unit innermost
/// stride, an innermost size and every other stride that the group divides, and aligned
/// addresses. A permuted copy of `[.., 64]` rows then takes a quarter of the index
/// arithmetic of one per element. `p` unchanged otherwise.
pub(crate) fn widened_copy(p: CopyPlan, src: u64, dst: u64, elem: usize) -> CopyPlan {
    for (bytes, entry) in [(16usize, "copy_b16"), (8, "copy_b8")] {
        if elem >= bytes || bytes % elem != 0 {
            continue;
        }
        let r = (bytes / elem) as i64;
        let fits = |l: &KernelLayout| {
            let rank = l.rank as usize;
            rank > 0
                && l.strides[rank - 1] == 1
                && l.shape[rank - 1] % r == 0
                && l.offset % r == 0
                && l.strides[..rank - 1].iter().all(|s| s % r == 0)
        };
        let aligned = src.is_multiple_of(bytes as u64) && dst.is_multiple_of(bytes as u64);
        if !(aligned && p.layouts.iter().all(fits)) {
            continue;
        }
        let group = |l: &KernelLayout| {
            let rank = l.rank as usize;
            let mut g = *l;
            g.shape[rank - 1] /= r;
            for s in &mut g.strides[..rank - 1] {
                *s /= r;
            }
            g.offset /= r;
            g
        };
        return CopyPlan {
            entry,
            cast: None,
            layouts: [group(&p.layouts[0]), group(&p.layouts[1])],
            n: p.n / r,
        };
    }
    p
}

/// What `unary` launches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct UnaryPlan {
    pub entry: &'static str,
    pub op: i32,
    pub params: UnaryParams,
    pub layouts: [KernelLayout; 2],
    pub n: i64,
    /// Elements per thread step: 1 for a scalar kernel; V > 1 for a vector kernel, whose
    /// `layouts` are then group layouts (float dtypes only, so `params` are `Float`).
    pub vec: u32,
}

impl UnaryPlan {
    /// The vector launch, or `None` for the scalar kernel.
    pub(crate) fn vec_step(&self) -> Option<VecStep> {
        vec_step(self.vec, self.n, self.op)
    }
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
    Ok(prepared.map(|(l, n)| {
        let vec = float_vector_width(dtype, &l, &[x.ptr, out.ptr]);
        UnaryPlan {
            entry: match vec {
                1 => UNARY_ENTRIES[dtype_code(dtype)],
                _ => UNARY_VEC_ENTRIES[dtype_code(dtype)],
            },
            op: op.code(),
            params,
            layouts: array(step_layouts(l, vec)),
            n,
            vec,
        }
    }))
}

/// What `binary` and `compare` launch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BinaryPlan {
    pub entry: &'static str,
    pub op: i32,
    pub layouts: [KernelLayout; 3],
    pub n: i64,
    /// Elements per thread step: 1 for a scalar kernel (always for `compare`); V > 1 for a
    /// vector kernel, whose `layouts` are then group layouts.
    pub vec: u32,
}

impl BinaryPlan {
    /// The vector launch, or `None` for the scalar kernel.
    pub(crate) fn vec_step(&self) -> Option<VecStep> {
        vec_step(self.vec, self.n, self.op)
    }
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
    Ok(prepared.map(|(l, n)| {
        let vec = float_vector_width(dtype, &l, &[a.ptr, b.ptr, out.ptr]);
        BinaryPlan {
            entry: match vec {
                1 => BINARY_ENTRIES[dtype_code(dtype)],
                _ => BINARY_VEC_ENTRIES[dtype_code(dtype)],
            },
            op: op.code(),
            layouts: array(step_layouts(l, vec)),
            n,
            vec,
        }
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
        vec: 1,
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
    /// Elements per thread step: 1 for a scalar kernel (always for `compare_scalar`); V > 1
    /// for a vector kernel, whose `layouts` are then group layouts (float dtypes only, so
    /// `scalar` is `Float`).
    pub vec: u32,
}

impl ScalarPlan {
    /// The vector launch, or `None` for the scalar kernel.
    pub(crate) fn vec_step(&self) -> Option<VecStep> {
        vec_step(self.vec, self.n, self.op)
    }
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
    Ok(prepared.map(|(l, n)| {
        let vec = float_vector_width(dtype, &l, &[a.ptr, out.ptr]);
        ScalarPlan {
            entry: match vec {
                1 => BINARY_SCALAR_ENTRIES[dtype_code(dtype)],
                _ => BINARY_SCALAR_VEC_ENTRIES[dtype_code(dtype)],
            },
            op: op.code(),
            scalar: scalar_param(dtype, s),
            layouts: array(step_layouts(l, vec)),
            n,
            vec,
        }
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
        vec: 1,
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
pub fn fill(stream: &Arc<CudaStream>, out: &TensorMut, value: f64) -> Result<()> {
    on_stream(stream, "fill", &[("out", out)])?;
    let Some(p) = plan_fill(out, value)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::fill(stream, &f, out.address(), &p.layout, p.n, p.bits)
}

/// Copies `src` (broadcast to `dst.dims`) into `dst`, casting when the dtypes differ
/// (any pair of dtypes; float -> int truncates toward zero with NaN -> 0 and wraps to the
/// width; to bool: `!= 0`).
pub fn copy(stream: &Arc<CudaStream>, src: &TensorRef, dst: &TensorMut) -> Result<()> {
    on_stream(stream, "copy", &[("src", src), ("dst", dst)])?;
    let Some(p) = plan_copy(src, dst)? else {
        return Ok(());
    };
    let p = if p.cast.is_none() {
        widened_copy(p, src.ptr, dst.ptr, dst.dtype.size())
    } else {
        p
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    match p.cast {
        Some((s, d)) => launch::cast(stream, &f, src.address(), s, dst.address(), d, &p.layouts, p.n),
        None => launch::copy(stream, &f, src.address(), dst.address(), &p.layouts, p.n),
    }
}

/// `out = op(x)` with `x` broadcast to `out.dims` and of `out`'s dtype. Float ops run on
/// f32/f16/bf16/f64 (f16/bf16 in f32); ints (not bool) support `Neg`, `Abs`, `Sign`,
/// `Square`, `AddScalar`, `MulScalar` and `Clamp`.
pub fn unary(stream: &Arc<CudaStream>, op: UnaryOp, x: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "unary", &[("x", x), ("out", out)])?;
    let Some(p) = plan_unary(op, x, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    match (p.vec_step(), p.params) {
        (Some(step), UnaryParams::Float(p0, p1)) => {
            launch::unary_vec(stream, &f, x.address(), out.address(), &p.layouts, step, (p0, p1))
        }
        _ => launch::unary(stream, &f, x.address(), out.address(), &p.layouts, p.n, p.op, p.params),
    }
}

/// `out = a op b` with `a` and `b` broadcast to `out.dims`, all of one dtype. Bitwise ops
/// on ints and bool only (bool supports only those), `Atan2` on floats only.
pub fn binary(stream: &Arc<CudaStream>, op: BinaryOp, a: &TensorRef, b: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "binary", &[("a", a), ("b", b), ("out", out)])?;
    let Some(p) = plan_binary(op, a, b, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    match p.vec_step() {
        Some(step) => launch::binary_vec(stream, &f, a.address(), b.address(), out.address(), &p.layouts, step),
        None => launch::binary(
            stream,
            &f,
            a.address(),
            b.address(),
            out.address(),
            &p.layouts,
            p.n,
            p.op,
        ),
    }
}

/// `out = a op s` for a scalar `s` passed to the kernel by value (no one-element tensor,
/// no fill launch); `s` is first rounded to the dtype like a tensor of it. The ops and
/// dtypes of [`binary`].
pub fn binary_scalar(stream: &Arc<CudaStream>, op: BinaryOp, a: &TensorRef, s: f64, out: &TensorMut) -> Result<()> {
    on_stream(stream, "binary_scalar", &[("a", a), ("out", out)])?;
    let Some(p) = plan_binary_scalar(op, a, s, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    match (p.vec_step(), p.scalar) {
        (Some(step), ScalarParam::Float(v)) => {
            launch::with_scalar_vec(stream, &f, a.address(), out.address(), &p.layouts, step, v)
        }
        _ => launch::with_scalar(stream, &f, a.address(), out.address(), &p.layouts, p.n, p.op, p.scalar),
    }
}

/// `out = a op s` as 0/1 bytes for a scalar `s` passed by value (rounded to `a`'s dtype
/// first). NaN compares false except for `Ne`.
pub fn compare_scalar(stream: &Arc<CudaStream>, op: CompareOp, a: &TensorRef, s: f64, out: &TensorMut) -> Result<()> {
    on_stream(stream, "compare_scalar", &[("a", a), ("out", out)])?;
    let Some(p) = plan_compare_scalar(op, a, s, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::with_scalar(stream, &f, a.address(), out.address(), &p.layouts, p.n, p.op, p.scalar)
}

/// `out = a op b` as 0/1 bytes (`out` Bool or U8), `a` and `b` of one dtype and broadcast
/// to `out.dims`. NaN compares false except for `Ne`.
pub fn compare(stream: &Arc<CudaStream>, op: CompareOp, a: &TensorRef, b: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "compare", &[("a", a), ("b", b), ("out", out)])?;
    let Some(p) = plan_compare(op, a, b, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::binary(
        stream,
        &f,
        a.address(),
        b.address(),
        out.address(),
        &p.layouts,
        p.n,
        p.op,
    )
}

/// `out = cond ? a : b` elementwise (`cond` Bool or U8, nonzero is true), all broadcast to
/// `out.dims`; `a`, `b` and `out` of one dtype.
pub fn where_(stream: &Arc<CudaStream>, cond: &TensorRef, a: &TensorRef, b: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "where", &[("cond", cond), ("a", a), ("b", b), ("out", out)])?;
    let Some(p) = plan_where(cond, a, b, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, ELEMENTWISE, p.entry)?;
    launch::where_(
        stream,
        &f,
        cond.address(),
        a.address(),
        b.address(),
        out.address(),
        &p.layouts,
        p.n,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
    }

    use crate::kernels::invalid_argument as invalid;

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
        // 3 elements: no vector step divides them, so the floats take the scalar kernels too.
        let x = |d| t(&[3], d);
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
        invalid(plan_fill(&TensorRef::fake_packed(&[3], f, 0), 0.0));
        // too many dims after merging
        let dims = [2i64; 9];
        let strides: Vec<i64> = (0..9).map(|i| 1i64 << (2 * (8 - i))).collect();
        invalid(plan_fill(&ts(&dims, &strides, f), 0.0));
    }

    #[test]
    fn empty_outputs_plan_nothing_but_still_validate() {
        let f = DataType::F32;
        assert!(plan_fill(&t(&[0, 3], f), 1.0).unwrap().is_none());
        assert!(plan_fill(&TensorRef::fake_packed(&[0], f, 0), 1.0).unwrap().is_none());
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
        // I32: the element layouts (float dtypes may take vector kernels, whose group layouts
        // are tested below).
        let f = DataType::I32;
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
        // The heads of attention, [B, S, H, D] copied to [B, H, S, D]: groups of four f32s
        // along D (16 bytes), the other strides in groups too.
        let heads = ts(&[2, 3, 5, 8], &[3 * 5 * 8, 8, 3 * 8, 1], f);
        let p = plan_copy(&heads, &t(&[2, 3, 5, 8], f)).unwrap().unwrap();
        let g = widened_copy(p.clone(), 256, 512, 4);
        assert_eq!((g.entry, g.n), ("copy_b16", p.n / 4));
        let r = g.layouts[0].rank as usize;
        assert_eq!(g.layouts[0].shape[r - 1] * 4, p.layouts[0].shape[r - 1]);
        assert_eq!(&g.layouts[0].strides[..r], &[30, 2, 6, 1][..]);
        // Addresses aligned to 8 bytes only: groups of two; a transposed innermost dim or an
        // odd innermost size: element by element.
        assert_eq!(widened_copy(p.clone(), 264, 512, 4).entry, "copy_b8");
        let p = plan_copy(&ts(&[3, 5], &[1, 3], f), &t(&[3, 5], f)).unwrap().unwrap();
        assert_eq!(widened_copy(p, 256, 512, 4).entry, "copy_b4");
        let p = plan_copy(&ts(&[4, 3], &[1, 4], f), &t(&[4, 3], f)).unwrap().unwrap();
        assert_eq!(widened_copy(p, 256, 512, 4).entry, "copy_b4");
        // A scalar output is rank 0.
        let p = plan_fill(&t(&[], f), 2.0).unwrap().unwrap();
        assert_eq!((p.layout.rank, p.n), (0, 1));
    }

    fn layouts_of(p: &BinaryPlan) -> Vec<(i32, Vec<i64>, Vec<i64>, i32)> {
        p.layouts
            .iter()
            .map(|l| {
                let r = l.rank as usize;
                (l.rank, l.shape[..r].to_vec(), l.strides[..r].to_vec(), l.index32)
            })
            .collect()
    }

    /// `binary`'s elements per step for `a op b -> out`, all of `dtype`.
    fn bin_vec(a: &TensorRef, b: &TensorRef, out: &TensorRef) -> u32 {
        plan_binary(BinaryOp::Add, a, b, out).unwrap().unwrap().vec
    }

    fn at(t: TensorRef, ptr: u64) -> TensorRef<'static> {
        t.fake_at(ptr)
    }

    #[test]
    fn contiguous_float_tensors_take_the_widest_vector_step() {
        use DataType::*;
        for (d, v) in [(F32, 4), (F16, 8), (BF16, 8), (F64, 2)] {
            let x = t(&[8192, 512], d);
            let p = plan_binary(BinaryOp::Add, &x, &x, &x).unwrap().unwrap();
            assert_eq!(p.vec, v, "{d:?}");
            assert_eq!(p.entry, BINARY_VEC_ENTRIES[dtype_code(d)]);
            let groups = 8192 * 512 / v as i64;
            // One merged dim walked in groups: shape / V, stride V.
            assert_eq!(layouts_of(&p), vec![(1, vec![groups], vec![v as i64], 1); 3]);
            let step = p.vec_step().unwrap();
            assert_eq!((step.groups, step.vec, step.op), (groups, v as i32, 0));
            let u = plan_unary(UnaryOp::Exp, &x, &x).unwrap().unwrap();
            assert_eq!((u.entry, u.vec), (UNARY_VEC_ENTRIES[dtype_code(d)], v));
            let sc = plan_binary_scalar(BinaryOp::Mul, &x, 2.0, &x).unwrap().unwrap();
            assert_eq!((sc.entry, sc.vec), (BINARY_SCALAR_VEC_ENTRIES[dtype_code(d)], v));
            assert_eq!(vector_width(&[&x, &x], &x).unwrap(), v);
        }
        assert_eq!(
            [
                UNARY_VEC_ENTRIES[2],
                BINARY_VEC_ENTRIES[1],
                BINARY_SCALAR_VEC_ENTRIES[0]
            ],
            ["unary_vec_bf16", "binary_vec_f16", "binary_scalar_vec_f32"]
        );
    }

    #[test]
    fn broadcast_operands_load_once_per_group() {
        let bf = DataType::BF16;
        let x = t(&[64, 96], bf);
        // A bias along rows: strides (0, 1), vector-accessed, two dims kept.
        let p = plan_binary(BinaryOp::Add, &x, &t(&[96], bf), &x).unwrap().unwrap();
        assert_eq!(p.vec, 8);
        assert_eq!(
            layouts_of(&p),
            vec![
                (2, vec![64, 12], vec![96, 8], 1),
                (2, vec![64, 12], vec![0, 8], 1),
                (2, vec![64, 12], vec![96, 8], 1)
            ]
        );
        // A broadcast scalar (one element, or rank 0): stride 0, any address.
        for s in [t(&[1], bf), t(&[], bf), at(t(&[1], bf), P + 2)] {
            let p = plan_binary(BinaryOp::Mul, &x, &s, &x).unwrap().unwrap();
            assert_eq!((p.vec, p.layouts[1].rank, p.layouts[1].strides[0]), (8, 1, 0));
        }
        // A column broadcast [64, 1]: strides (1, 0), one load per group, any address.
        let col = at(t(&[64, 1], bf), P + 2);
        let p = plan_binary(BinaryOp::Sub, &col, &x, &x).unwrap().unwrap();
        assert_eq!(p.vec, 8);
        assert_eq!(layouts_of(&p)[0], (2, vec![64, 12], vec![1, 0], 1));
        // A bias broadcast along the outer dims of a rank-3 tensor.
        let x3 = t(&[4, 5, 16], DataType::F32);
        assert_eq!(bin_vec(&x3, &t(&[4, 1, 16], DataType::F32), &x3), 4);
    }

    #[test]
    fn alignment_narrows_or_refuses_the_vector_step() {
        let bf = DataType::BF16;
        let x = t(&[64, 96], bf);
        // The start address of any vector-accessed operand (input or output) picks V.
        for (offset, v) in [(0, 8), (2, 1), (4, 2), (6, 1), (8, 4), (16, 8), (24, 4)] {
            let shifted = at(x.clone(), P + offset);
            assert_eq!(bin_vec(&shifted, &x, &x), v, "a at +{offset}");
            assert_eq!(bin_vec(&x, &x, &shifted), v, "out at +{offset}");
            assert_eq!(bin_vec(&x, &at(t(&[96], bf), P + offset), &x), v, "bias at +{offset}");
        }
        let f = DataType::F32;
        let y = t(&[16, 32], f);
        assert_eq!(bin_vec(&at(y.clone(), P + 4), &y, &y), 1);
        assert_eq!(bin_vec(&at(y.clone(), P + 8), &y, &y), 2);
        let d = t(&[16, 32], DataType::F64);
        assert_eq!(bin_vec(&at(d.clone(), P + 8), &d, &d), 1);
        // A misaligned view falls back to the scalar kernel with its plain layouts.
        let p = plan_unary(UnaryOp::Neg, &at(x.clone(), P + 2), &x).unwrap().unwrap();
        assert_eq!((p.entry, p.vec, p.vec_step()), ("unary_bf16", 1, None));
        assert_eq!((p.layouts[0].shape[0], p.layouts[0].strides[0]), (64 * 96, 1));
    }

    #[test]
    fn the_inner_dim_and_outer_strides_must_be_multiples_of_the_step() {
        let bf = DataType::BF16;
        // Inner dim 7, 6 or 12 (with a broadcast bias keeping the rows apart).
        for (cols, v) in [(7, 1), (6, 2), (12, 4), (24, 8)] {
            let x = t(&[10, cols], bf);
            assert_eq!(bin_vec(&x, &t(&[cols], bf), &x), v, "{cols} columns");
        }
        // Rows of 16 at row strides 20, 18, 17 (a gapped input), or a gapped output.
        let out = t(&[8, 16], bf);
        for (row, v) in [(24, 8), (20, 4), (18, 2), (17, 1)] {
            let a = ts(&[8, 16], &[row, 1], bf);
            assert_eq!(bin_vec(&a, &out, &out), v, "input row stride {row}");
            assert_eq!(bin_vec(&out, &out, &a), v, "output row stride {row}");
        }
        // A broadcast (stride 0) operand's outer strides are free.
        let col = ts(&[8, 1], &[3, 1], bf);
        assert_eq!(bin_vec(&col, &out, &out), 8);
    }

    #[test]
    fn non_unit_inner_strides_and_other_dtypes_take_the_scalar_kernels() {
        let f = DataType::F32;
        let out = t(&[8, 16], f);
        // A transposed input, a gapped (stride 2) inner dim, a reversed one.
        for a in [
            ts(&[8, 16], &[1, 8], f),
            ts(&[8, 16], &[32, 2], f),
            ts(&[8, 16], &[16, -1], f),
        ] {
            assert_eq!(bin_vec(&a, &out, &out), 1, "{:?}", a.strides);
            assert_eq!(bin_vec(&out, &out, &ts(&[8, 16], &a.strides, f)), 1);
        }
        // A negative outer stride that is a multiple of V is fine.
        assert_eq!(bin_vec(&ts(&[8, 16], &[-16, 1], f), &out, &out), 4);
        // A single element, integer and bool dtypes, and comparisons stay scalar.
        assert_eq!(bin_vec(&t(&[], f), &t(&[], f), &t(&[], f)), 1);
        for d in [DataType::I32, DataType::I64, DataType::U8, DataType::I8] {
            let x = t(&[64, 64], d);
            let p = plan_binary(BinaryOp::Add, &x, &x, &x).unwrap().unwrap();
            assert_eq!((p.vec, p.vec_step()), (1, None), "{d:?}");
            assert_eq!(plan_unary(UnaryOp::Neg, &x, &x).unwrap().unwrap().vec, 1);
            assert_eq!(vector_width(&[&x], &x).unwrap(), 1);
        }
        let b = t(&[64], DataType::Bool);
        assert_eq!(plan_binary(BinaryOp::BitOr, &b, &b, &b).unwrap().unwrap().vec, 1);
        let x = t(&[64], f);
        let c = plan_compare(CompareOp::Lt, &x, &x, &t(&[64], DataType::Bool))
            .unwrap()
            .unwrap();
        assert_eq!((c.entry, c.vec), ("compare_f32", 1));
        let c = plan_compare_scalar(CompareOp::Lt, &x, 0.5, &t(&[64], DataType::U8))
            .unwrap()
            .unwrap();
        assert_eq!((c.entry, c.vec), ("compare_scalar_f32", 1));
        // Vector plans always carry float parameters.
        let p = plan_unary(UnaryOp::Clamp { min: -1.0, max: 1.0 }, &x, &x)
            .unwrap()
            .unwrap();
        assert_eq!((p.vec, p.params), (4, UnaryParams::Float(-1.0, 1.0)));
        assert!(vector_width(&[&t(&[64], DataType::F16)], &x).is_err());
        assert_eq!(vector_width(&[&t(&[0], f)], &t(&[0], f)).unwrap(), 1);
    }

    #[test]
    fn group_layouts_index_in_32_bits_while_the_groups_fit() {
        let f = DataType::F16;
        // 2^32 elements: more than 2^31 elements, but 2^29 groups of 8.
        let big = t(&[1 << 16, 1 << 16], f);
        let p = plan_unary(UnaryOp::Neg, &big, &big).unwrap().unwrap();
        assert_eq!((p.vec, p.layouts[1].index32, p.layouts[1].shape[0]), (8, 1, 1 << 29));
        let huge = t(&[1 << 20, 1 << 16], f);
        let p = plan_unary(UnaryOp::Neg, &huge, &huge).unwrap().unwrap();
        assert_eq!((p.vec, p.layouts[1].index32), (8, 0));
        assert_eq!(p.vec_step().unwrap().groups, 1 << 33);
    }
}
