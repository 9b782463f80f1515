//! Fused elementwise programs: a straight-line sequence of float and bool operations over
//! broadcast inputs, generated as one CUDA kernel per distinct program and launched once
//! instead of once per operation.
//!
//! A [`Program`] names its inputs by storage dtype, its operations in order (operation `i`
//! writes register `i`) and the registers it stores. Floats compute in f32 whatever their
//! storage (f32, f16, bf16): intermediates are not rounded to a half type unless a
//! [`FusedOp::Round`] asks for it (what a cast does), so a fused chain is at least as accurate
//! as the same operations run one by one. The math is the elementwise kernels' own
//! (`kernels/elementwise_math.cuh` heads every generated source), so results match the
//! unfused ops bit for bit in f32.
//!
//! The generated source is compiled like every other kernel (NVRTC straight to a CUBIN, the
//! persistent kernel cache keyed by the source's hash), once per program, launch [`Variant`]
//! (rank of the merged shape, vector width) and device; later launches of the same program
//! are one map lookup. [`ready_or_queue`] builds new programs on background threads, so a
//! caller can run the operations unfused until the kernel is ready.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::{CudaFunction, CudaStream};

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_fused::{self as launch, FusedArgs};
use crate::graph::{may_overlap, DataType};
use crate::kernels::check::{check_layout, check_tensor};
use crate::kernels::elementwise::{BinaryOp, CompareOp, UnaryOp};
use crate::kernels::emit::{Expr, Let, Ty};
use crate::kernels::layout::{broadcast_strides, coalesce, kernel_layout};
use crate::kernels::{stream_function, KernelSource};
use crate::types::{row_major_strides, DeviceAddress, Shape, TensorMut, TensorRef};

pub use crate::ffi::launch_fused::{MAX_INPUTS, MAX_OUTPUTS, MAX_SCALARS};

/// Most operations in one program (keeps generated sources and register pressure small).
pub const MAX_OPS: usize = 64;

/// An operand of a [`FusedOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// Input `k` of the program, loaded at the element's broadcast offset.
    Input(u8),
    /// The result of operation `k` (an earlier one).
    Reg(u16),
    /// Scalar `k` of the launch (an f32 passed by value).
    Scalar(u8),
}

impl Value {
    /// The value in the generated source: `xK` (input), `rK` (register), `a.s[K]` (scalar).
    pub(crate) fn to_expr(self) -> Expr {
        Expr::var(match self {
            Value::Input(k) => format!("x{k}"),
            Value::Reg(r) => format!("r{r}"),
            Value::Scalar(k) => format!("a.s[{k}]"),
        })
    }

    /// [`Value::to_expr`] as text.
    pub(crate) fn expr(self) -> String {
        self.to_expr().to_string()
    }
}

/// One operation of a [`Program`]. Float operations take and give f32 values; comparisons,
/// `Not`, `And` and `Or` give bools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// A parameterless float [`UnaryOp`] (by its kernel code; build with [`FusedOp::unary`]).
    Unary(i32, Value),
    /// A float [`BinaryOp`] (not the bitwise ones).
    Binary(BinaryOp, Value, Value),
    /// A float comparison, giving a bool.
    Compare(CompareOp, Value, Value),
    /// `cond ? a : b` (`cond` a bool, `a` and `b` floats).
    Select(Value, Value, Value),
    /// `min(max(x, lo), hi)`; NaN stays NaN.
    Clamp(Value, Value, Value),
    /// A float rounded to the precision of a storage dtype (a cast to f16 or bf16 inside the
    /// program); f32 leaves it unchanged.
    Round(Value, DataType),
    /// A bool as a float (1 or 0).
    FromBool(Value),
    /// Logical not.
    Not(Value),
    /// Logical and.
    And(Value, Value),
    /// Logical or.
    Or(Value, Value),
}

impl FusedOp {
    /// A float unary operation, or `None` for the ones that carry parameters
    /// (`AddScalar`, `MulScalar`, `PowScalar`, `Clamp`, `LeakyRelu`: use a scalar operand).
    pub fn unary(op: UnaryOp, x: Value) -> Option<FusedOp> {
        // Codes 23.. are the parameterised ops (`U_ADD_SCALAR` and after).
        (op.code() < 23).then(|| FusedOp::Unary(op.code(), x))
    }

    /// Whether the result is a bool.
    pub(crate) fn gives_bool(&self) -> bool {
        matches!(
            self,
            FusedOp::Compare(..) | FusedOp::Not(_) | FusedOp::And(..) | FusedOp::Or(..)
        )
    }

    /// What the operation computes, as an expression of its operands.
    pub(crate) fn value(&self) -> Expr {
        let v = |x: Value| x.to_expr();
        let math = |name, code, x, lo, hi| Expr::Call(name, vec![Expr::Int(code), x, lo, hi]);
        match *self {
            FusedOp::Unary(code, x) => math("unary_math_f32", code, v(x), Expr::Float("0.0f"), Expr::Float("0.0f")),
            FusedOp::Binary(b, x, y) => Expr::Call("binary_math_f32", vec![Expr::Int(b.code()), v(x), v(y)]),
            FusedOp::Compare(c, x, y) => {
                let sym = match c {
                    CompareOp::Eq => "==",
                    CompareOp::Ne => "!=",
                    CompareOp::Lt => "<",
                    CompareOp::Le => "<=",
                    CompareOp::Gt => ">",
                    CompareOp::Ge => ">=",
                };
                v(x).infix(sym, v(y))
            }
            FusedOp::Select(c, x, y) => Expr::select(v(c), v(x), v(y)),
            FusedOp::Clamp(x, lo, hi) => math("unary_math_f32", 26, v(x), v(lo), v(hi)),
            FusedOp::Round(x, d) => Expr::round(v(x), d),
            FusedOp::FromBool(x) => Expr::select(v(x), Expr::Float("1.0f"), Expr::Float("0.0f")),
            FusedOp::Not(x) => Expr::Not(Box::new(v(x))),
            FusedOp::And(x, y) => v(x).infix("&&", v(y)),
            FusedOp::Or(x, y) => v(x).infix("||", v(y)),
        }
    }

    /// The values the operation reads.
    pub(crate) fn operands(&self) -> Vec<Value> {
        match *self {
            FusedOp::Unary(_, a) | FusedOp::Round(a, _) | FusedOp::FromBool(a) | FusedOp::Not(a) => vec![a],
            FusedOp::Binary(_, a, b) | FusedOp::Compare(_, a, b) | FusedOp::And(a, b) | FusedOp::Or(a, b) => {
                vec![a, b]
            }
            FusedOp::Select(a, b, c) | FusedOp::Clamp(a, b, c) => vec![a, b, c],
        }
    }
}

/// A fused elementwise program: inputs (by storage dtype), operations, stored registers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Program {
    /// Storage dtype of each input (`F32`, `F16`, `BF16` or `Bool`).
    pub inputs: Vec<DataType>,
    /// Number of scalar operands.
    pub scalars: usize,
    /// The operations; operation `i` writes register `i`.
    pub ops: Vec<FusedOp>,
    /// The stored registers with their storage dtype, in output order.
    pub outputs: Vec<(u16, DataType)>,
    /// Bit `j` set: output `j` holds a value of the launch's *small* shape (one that
    /// broadcasts to the launch shape, such as a `[1, C, 1, 1]` statistic beside `[N, C, H, W]`
    /// values): it is stored once per element of that shape, by the threads whose
    /// coordinates on its broadcast dims are 0.
    pub small_outputs: u16,
}

fn storable(dtype: DataType) -> bool {
    matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16 | DataType::Bool)
}

impl Program {
    /// Whether output `j` is stored at the small layout (see [`Program::small_outputs`]).
    #[doc(hidden)]
    pub fn is_small(&self, j: usize) -> bool {
        self.small_outputs >> j & 1 == 1
    }

    /// The packed dims of output `j` in a launch over `out_dims` whose small outputs have
    /// `small_dims`.
    fn output_dims<'d>(&self, j: usize, out_dims: &'d [i64], small_dims: Option<&'d [i64]>) -> &'d [i64] {
        match small_dims {
            Some(small) if self.is_small(j) => small,
            _ => out_dims,
        }
    }

    /// Checks the program: limits, operand references and types, storage dtypes.
    pub fn validate(&self) -> Result<()> {
        if self.outputs.is_empty() {
            return Err(Error::invalid_arg("fused elementwise", "program", "no outputs"));
        }
        self.validate_operations()
    }

    /// [`Program::validate`] without requiring a stored output (a program that feeds a fused
    /// reduction may store nothing else).
    pub(crate) fn validate_operations(&self) -> Result<()> {
        let err = |reason: String| Err(Error::invalid_arg("fused elementwise", "program", reason));
        if self.inputs.len() > MAX_INPUTS
            || self.outputs.len() > MAX_OUTPUTS
            || self.scalars > MAX_SCALARS
            || self.ops.len() > MAX_OPS
        {
            return err(format!(
                "{} inputs, {} outputs, {} scalars, {} ops (at most {MAX_INPUTS}, {MAX_OUTPUTS}, {MAX_SCALARS}, {MAX_OPS})",
                self.inputs.len(),
                self.outputs.len(),
                self.scalars,
                self.ops.len()
            ));
        }
        if let Some(d) = self.inputs.iter().find(|d| !storable(**d)) {
            return err(format!("input dtype {d:?} (supported: F32, F16, BF16, Bool)"));
        }
        for (i, op) in self.ops.iter().enumerate() {
            let want_bool: Vec<bool> = match op {
                FusedOp::Select(..) => vec![true, false, false],
                FusedOp::FromBool(_) | FusedOp::Not(_) | FusedOp::And(..) | FusedOp::Or(..) => {
                    vec![true; op.operands().len()]
                }
                _ => vec![false; op.operands().len()],
            };
            for (v, want) in op.operands().into_iter().zip(want_bool) {
                let is_bool = match v {
                    Value::Input(k) => match self.inputs.get(k as usize) {
                        Some(d) => *d == DataType::Bool,
                        None => return err(format!("op {i} reads input {k} of {}", self.inputs.len())),
                    },
                    Value::Reg(r) if (r as usize) < i => self.ops[r as usize].gives_bool(),
                    Value::Reg(r) => return err(format!("op {i} reads register {r} before it is written")),
                    Value::Scalar(k) if (k as usize) < self.scalars => false,
                    Value::Scalar(k) => return err(format!("op {i} reads scalar {k} of {}", self.scalars)),
                };
                if is_bool != want {
                    return err(format!("op {i} ({op:?}): operand {v:?} has the wrong type"));
                }
            }
            if let FusedOp::Unary(code, _) = op {
                if !(0..=22).contains(code) {
                    return err(format!("op {i}: unary code {code} is not a parameterless float op"));
                }
            }
            if let FusedOp::Binary(b, ..) = op {
                if !b.supports(DataType::F32) {
                    return err(format!("op {i}: {b:?} is not a float op"));
                }
            }
        }
        if u32::from(self.small_outputs) >> self.outputs.len() != 0 {
            return err(format!(
                "small outputs {:#b} of {} outputs",
                self.small_outputs,
                self.outputs.len()
            ));
        }
        for &(r, d) in &self.outputs {
            let Some(op) = self.ops.get(r as usize) else {
                return err(format!("output register {r} of {} ops", self.ops.len()));
            };
            if !storable(d) || op.gives_bool() != (d == DataType::Bool) {
                return err(format!("register {r} cannot be stored as {d:?}"));
            }
        }
        Ok(())
    }

    /// Writes the operations as `const float rI = ...;` lines (bools for the bool results),
    /// reading input `k` as `xK` and scalar `k` as `a.s[K]`, each line prefixed by `indent`.
    pub(crate) fn emit_operations(&self, s: &mut String, indent: &str) {
        self.emit_operations_upto(s, indent, self.ops.len());
    }

    /// [`Program::emit_operations`] for the first `n` operations only.
    pub(crate) fn emit_operations_upto(&self, s: &mut String, indent: &str, n: usize) {
        for (i, op) in self.ops.iter().enumerate().take(n) {
            let value = Let {
                ty: if op.gives_bool() { Ty::Bool } else { Ty::Float },
                name: format!("r{i}"),
                value: op.value(),
            };
            let _ = writeln!(s, "{indent}{value}");
        }
    }

    /// Declares `pK` (input `K`, from `a.ptr[K]` plus its layout's offset) and `qJ` (output
    /// `J`, from `a.ptr[MAX_INPUTS + J]` followed by `out_offset`, a source term or "").
    pub(crate) fn emit_pointers(&self, s: &mut String, out_offset: &str) {
        for (k, d) in self.inputs.iter().enumerate() {
            let _ = writeln!(
                s,
                "    const {t}* p{k} = (const {t}*)a.ptr[{k}] + a.in_layout[{k}].offset;",
                t = storage_type(*d)
            );
        }
        for (j, &(_, d)) in self.outputs.iter().enumerate() {
            let _ = writeln!(
                s,
                "    {t}* q{j} = ({t}*)a.ptr[{p}]{out_offset};",
                t = storage_type(d),
                p = MAX_INPUTS + j
            );
        }
    }

    /// Declares `xK`, the f32 (or bool) value of input `K` read from its storage element
    /// `raw(K)`, each line prefixed by `indent`.
    pub(crate) fn emit_input_values(&self, s: &mut String, indent: &str, raw: impl Fn(usize) -> String) {
        for (k, d) in self.inputs.iter().enumerate() {
            let value = Let {
                ty: if *d == DataType::Bool { Ty::Bool } else { Ty::Float },
                name: format!("x{k}"),
                value: Expr::load(Expr::var(raw(k)), *d),
            };
            let _ = writeln!(s, "{indent}{value}");
        }
    }

    /// Checks a launch's operand counts against the program's.
    pub(crate) fn check_operand_counts(
        &self,
        op: &'static str,
        inputs: usize,
        outputs: usize,
        scalars: usize,
    ) -> Result<()> {
        if inputs != self.inputs.len() || outputs != self.outputs.len() || scalars != self.scalars {
            return Err(Error::invalid_arg(
                op,
                "operands",
                format!(
                    "{inputs} inputs, {outputs} outputs, {scalars} scalars for a program of {}, {}, {}",
                    self.inputs.len(),
                    self.outputs.len(),
                    self.scalars
                ),
            ));
        }
        Ok(())
    }

    /// Checks each input (a valid view of the program's dtype) and returns its strides
    /// broadcast to `dims`.
    pub(crate) fn input_strides(&self, op: &'static str, inputs: &[TensorRef], dims: &[i64]) -> Result<Vec<Vec<i64>>> {
        inputs
            .iter()
            .zip(&self.inputs)
            .enumerate()
            .map(|(k, (t, &d))| {
                check_tensor(op, "input", t)?;
                if t.dtype != d {
                    return Err(Error::invalid_arg(
                        op,
                        "input",
                        format!("input {k} is {:?}, the program reads {d:?}", t.dtype),
                    ));
                }
                broadcast_strides(op, &t.dims, &t.strides, dims)
            })
            .collect()
    }

    /// The CUDA source of the program's kernel `fused_elementwise` for launch shape
    /// `variant` (it calls the math of `kernels/elementwise_math.cuh`, which precedes it in
    /// the compiled text).
    ///
    /// The kernel walks groups of `variant.vec` consecutive elements of the innermost
    /// (coalesced) dim: the coordinates of a group are computed once, with the rank a
    /// compile-time constant (unrolled, strides read straight from the launch arguments), and
    /// each operand whose innermost stride is 1 moves its group with one vector access; a
    /// broadcast operand (stride 0) loads once, any other stride gathers.
    pub fn source(&self, variant: Variant) -> String {
        let mut s = String::with_capacity(2048 + 128 * self.ops.len());
        let _ = writeln!(
            s,
            "\nstruct FusedArgs {{ u64 ptr[{}]; Layout in_layout[{MAX_INPUTS}]; Layout out_layout; Layout small_layout; float s[{MAX_SCALARS}]; i64 n; }};",
            MAX_INPUTS + MAX_OUTPUTS
        );
        s.push_str(VECTOR_ACCESS);
        let rank = variant.rank.max(1);
        let vec = variant.vec.max(1);
        let idx = if variant.wide {
            "unsigned long long"
        } else {
            "unsigned int"
        };
        let _ = writeln!(s, "#define FR {rank}\n#define FV {vec}\ntypedef {idx} FIDX;");
        s.push_str("KERNEL void fused_elementwise(const FusedArgs a) {\n");
        s.push_str(
            "    FIDX sh[FR];\n#pragma unroll\n    for (int d = 0; d < FR; ++d) sh[d] = (FIDX)a.out_layout.shape[d];\n",
        );
        s.push_str("    sh[FR - 1] /= FV;\n    const FIDX groups = (FIDX)(a.n / FV);\n");
        self.emit_pointers(&mut s, " + a.out_layout.offset");
        s.push_str(
            "    for (FIDX g = (FIDX)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (FIDX)gridDim.x * blockDim.x) {\n",
        );
        let small = self.small_outputs != 0;
        let offsets: Vec<String> = (0..self.inputs.len())
            .map(|k| format!("o{k} = 0"))
            .chain(std::iter::once("oo = 0".to_string()))
            .chain(small.then(|| "os = 0".to_string()))
            .collect();
        let _ = writeln!(s, "        i64 {};\n        FIDX j = g;", offsets.join(", "));
        if small {
            s.push_str("        bool ks = true;\n");
        }
        s.push_str("#pragma unroll\n        for (int d = FR - 1; d >= 0; --d) {\n");
        s.push_str("            const FIDX c = d == 0 ? j : j % sh[d];\n            j = d == 0 ? j : j / sh[d];\n");
        s.push_str("            const i64 cc = d == FR - 1 ? (i64)c * FV : (i64)c;\n");
        for k in 0..self.inputs.len() {
            let _ = writeln!(s, "            o{k} += cc * a.in_layout[{k}].strides[d];");
        }
        s.push_str("            oo += cc * a.out_layout.strides[d];\n");
        if small {
            // The small outputs: stored where every coordinate they broadcast along is 0.
            s.push_str("            os += cc * a.small_layout.strides[d];\n            if (a.small_layout.strides[d] == 0 && cc != 0) ks = false;\n");
        }
        s.push_str("        }\n");
        for (k, d) in self.inputs.iter().enumerate() {
            let t = storage_type(*d);
            let _ = writeln!(
                s,
                "        {t} v{k}[FV];\n        fused_load<{t}, FV>(p{k}, o{k}, a.in_layout[{k}].strides[FR - 1], v{k});"
            );
        }
        for (j, &(_, d)) in self.outputs.iter().enumerate() {
            let _ = writeln!(s, "        {} w{j}[FV];", storage_type(d));
        }
        s.push_str("#pragma unroll\n        for (int v = 0; v < FV; ++v) {\n");
        self.emit_input_values(&mut s, "            ", |k| format!("v{k}[v]"));
        self.emit_operations(&mut s, "            ");
        for (j, &(r, d)) in self.outputs.iter().enumerate() {
            let _ = writeln!(s, "            w{j}[v] = {};", store_expr(&format!("r{r}"), d));
        }
        s.push_str("        }\n");
        for (j, &(_, d)) in self.outputs.iter().enumerate() {
            if self.is_small(j) {
                // Broadcast along the inner dim: only the group at coordinate 0 stores, its
                // first element.
                let _ = writeln!(
                    s,
                    "        if (ks) {{ if (a.small_layout.strides[FR - 1] == 0) q{j}[os] = w{j}[0]; \
                     else fused_store<{t}, FV>(q{j}, os, a.small_layout.strides[FR - 1], w{j}); }}",
                    t = storage_type(d)
                );
            } else {
                let _ = writeln!(
                    s,
                    "        fused_store<{}, FV>(q{j}, oo, a.out_layout.strides[FR - 1], w{j});",
                    storage_type(d)
                );
            }
        }
        s.push_str("    }\n}\n");
        s
    }
}

/// The storage element of dtype `d` for the f32 (or bool) value `value` (an expression's
/// text), as text.
pub(crate) fn store_expr(value: &str, d: DataType) -> String {
    Expr::store(Expr::var(value), d).to_string()
}

/// The CUDA type an operand of storage dtype `d` is read and written as.
pub(crate) fn storage_type(d: DataType) -> &'static str {
    match d {
        DataType::F32 => "float",
        DataType::F16 | DataType::BF16 => "u16",
        _ => "u8",
    }
}

/// Group loads and stores of the generated kernels: one vector access of `V` elements when
/// the innermost stride is 1 (the host checked the alignment), one load for a broadcast
/// (stride 0), element by element otherwise.
pub(crate) const VECTOR_ACCESS: &str = r#"
template <int B> struct FusedRaw;
template <> struct FusedRaw<1> { typedef u8 T; };
template <> struct FusedRaw<2> { typedef u16 T; };
template <> struct FusedRaw<4> { typedef u32 T; };
template <> struct FusedRaw<8> { typedef uint2 T; };
template <> struct FusedRaw<16> { typedef uint4 T; };
struct __align__(32) FusedRaw32 { uint4 lo, hi; };
template <> struct FusedRaw<32> { typedef FusedRaw32 T; };
template <typename S, int V>
__device__ __forceinline__ void fused_load(const S* p, i64 o, i64 inner, S (&x)[V]) {
    if (inner == 1) {
        typedef typename FusedRaw<sizeof(S) * V>::T R;
        union { R r; S s[V]; } u;
        u.r = *(const R*)(p + o);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = u.s[v];
    } else if (inner == 0) {
        const S b = p[o];
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = b;
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = p[o + v * inner];
    }
}
template <typename S, int V>
__device__ __forceinline__ void fused_store(S* p, i64 o, i64 inner, const S (&x)[V]) {
    if (inner == 1) {
        typedef typename FusedRaw<sizeof(S) * V>::T R;
        union { R r; S s[V]; } u;
#pragma unroll
        for (int v = 0; v < V; ++v) u.s[v] = x[v];
        *(R*)(p + o) = u.r;
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) p[o + v * inner] = x[v];
    }
}
"#;

/// How a program's kernel is specialized for a launch: the rank of the coalesced shape, the
/// elements each thread moves per step (a vector width the innermost dim and every
/// vector-accessed operand's alignment allow) and whether indices need 64 bits. Programs
/// compile once per variant they meet (usually one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Variant {
    /// Dims after merging (1 to the kernels' maximum).
    pub rank: u8,
    /// Consecutive innermost elements per thread step: 1, 2, 4 or 8.
    pub vec: u8,
    /// More than `2^31` groups: 64-bit indexing.
    pub wide: bool,
}

/// Widest vector step for a program with `operands` inputs and outputs whose widest element
/// has `widest` bytes: each operand's step may hold 32 bytes with up to 4 operands, 16 with up
/// to 10, 8 beyond (more operands, more registers per step), and at most 8 elements. A step's
/// registers follow its bytes, so 16-bit programs move twice the elements of f32 ones: a
/// memory-bound kernel keeps its bytes in flight per thread at any dtype.
pub(crate) fn max_vec(operands: usize, widest: usize) -> i64 {
    let bytes: i64 = match operands {
        0..=4 => 32,
        5..=10 => 16,
        _ => 8,
    };
    (bytes / widest.max(1) as i64).clamp(1, 8)
}

/// Whether an operand of `strides` (innermost last), starting at byte address `addr`, with
/// elements of `size` bytes, can move groups of `v` innermost elements as the generated
/// kernels do: with an innermost stride of 1 its other strides are multiples of `v` and its
/// address is aligned to `v` elements (any other innermost stride broadcasts or gathers).
pub(crate) fn vector_access_fits(strides: &[i64], addr: u64, size: usize, v: i64) -> bool {
    strides.last() != Some(&1)
        || (strides[..strides.len() - 1].iter().all(|s| s % v == 0) && addr.is_multiple_of(v as u64 * size as u64))
}

/// The variant for a launch over the coalesced `shape`, where operand `k` has `strides[k]`,
/// starts at byte address `addrs[k]` and has elements of `sizes[k]` bytes.
fn choose_variant(shape: &[i64], strides: &[Vec<i64>], addrs: &[u64], sizes: &[usize], n: i64) -> Variant {
    let rank = shape.len().max(1);
    let inner = shape.last().copied().unwrap_or(1);
    let widest = sizes.iter().copied().max().unwrap_or(4);
    let vec = [8i64, 4, 2, 1]
        .into_iter()
        .filter(|&v| v <= max_vec(strides.len(), widest))
        .find(|&v| {
            inner % v == 0
                && strides
                    .iter()
                    .zip(addrs)
                    .zip(sizes)
                    .all(|((st, &addr), &size)| vector_access_fits(st, addr, size, v))
        })
        .unwrap_or(1);
    Variant {
        rank: rank as u8,
        vec: vec as u8,
        wide: n / vec >= 1 << 31,
    }
}

/// Entry point of every generated program.
const ENTRY: &str = "fused_elementwise";

/// The kernel source of `program` in `variant` (generated once, then looked up).
fn source_for(program: &Program, variant: Variant) -> Result<KernelSource> {
    let mut map = super::state()
        .fused_sources
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (program.clone(), variant);
    if let Some(s) = map.get(&key) {
        return Ok(*s);
    }
    program.validate()?;
    let s = generated_source("fused", program.source(variant));
    map.insert(key, s);
    Ok(s)
}

/// A generated kernel source (after the elementwise math), named by its hash. Callers keep
/// one per distinct program: it is leaked, because the loader keys kernels by `&'static str`.
pub(crate) fn generated_source(prefix: &str, body: String) -> KernelSource {
    let code = format!("{}\n{body}", super::ELEMENTWISE_MATH);
    let name = format!("{prefix}-{:032x}.cu", crate::runtime::disk_cache::source_hash(&code));
    KernelSource {
        name: Box::leak(name.into_boxed_str()),
        code: Box::leak(code.into_boxed_str()),
        common: true,
    }
}

/// The generated sources of elementwise programs, by program and variant.
pub(super) type Sources = HashMap<(Program, Variant), KernelSource>;

/// Builds queued in the background: (device ordinal, source name) pending or failed.
#[derive(Default)]
pub(super) struct Builds {
    queue: std::collections::VecDeque<(Arc<CudaStream>, KernelSource, &'static str)>,
    pending: std::collections::HashSet<(usize, &'static str)>,
    failed: HashMap<(usize, &'static str), String>,
    workers: usize,
}

fn builds() -> &'static (Mutex<Builds>, Condvar) {
    super::state().fused_builds.get_or_init(Default::default)
}

/// Compiles (or loads from the kernel cache) generated kernel `entry` of `source` for the
/// device of `stream`; a fused-kernel build fault armed for tests fails it instead.
fn build(stream: &Arc<CudaStream>, source: KernelSource, entry: &'static str) -> Result<CudaFunction> {
    if let Some(injected) = crate::runtime::fault::fused_build_fault(source.name) {
        return Err(injected);
    }
    stream_function(stream, source, entry)
}

/// One background builder: compiles (or reads from the kernel cache) queued programs until
/// the queue is empty. Each build counts as one in flight for the exit hook
/// ([`CompileSlot`](crate::ffi::nvrtc::CompileSlot)), its module load from the disk cache
/// included, so the process waits for it at exit instead of tearing the driver down under
/// it; once the process is exiting, queued builds are dropped unbuilt.
fn build_worker() {
    let (lock, done) = builds();
    loop {
        let job = {
            let mut b = lock.lock().unwrap_or_else(|e| e.into_inner());
            match b.queue.pop_front() {
                Some(j) => j,
                None => {
                    b.workers -= 1;
                    return;
                }
            }
        };
        let (stream, source, entry) = job;
        let key = (stream.context().ordinal(), source.name);
        // `None`: the process is exiting, and the kernel is left unbuilt (not failed).
        let result = crate::ffi::nvrtc::CompileSlot::enter("a background fused-kernel build")
            .ok()
            .map(|_in_flight| build(&stream, source, entry));
        let mut b = lock.lock().unwrap_or_else(|e| e.into_inner());
        b.pending.remove(&key);
        if let Some(Err(e)) = result {
            b.failed.insert(key, e.to_string());
        }
        done.notify_all();
    }
}

/// The kernel of `program` in `variant` on the device of `stream` when it is built;
/// otherwise `Ok(None)` after queueing its build on a background thread (up to one per CPU
/// core), so the caller runs the operations unfused meanwhile and a new program never stalls
/// the stream's host thread. `Err` when the program is invalid or its build failed.
///
/// In the engine's deterministic mode the kernel is built here instead: a fused kernel keeps
/// intermediates in registers (and contracts multiply-adds), so fused and unfused runs of the
/// same operations round differently, and which one ran must not depend on how fast a build
/// finished (the cuDNN plans built in the background follow the same rule).
pub fn ready_or_queue(stream: &Arc<CudaStream>, program: &Program, variant: Variant) -> Result<Option<CudaFunction>> {
    let source = source_for(program, variant)?;
    ready_or_queue_source(stream, source, ENTRY, "building a fused elementwise kernel")
}

/// [`ready_or_queue`] for kernel `entry` of any generated `source`; `what` names the build
/// in its error.
pub(crate) fn ready_or_queue_source(
    stream: &Arc<CudaStream>,
    source: KernelSource,
    entry: &'static str,
    what: &'static str,
) -> Result<Option<CudaFunction>> {
    let ordinal = stream.context().ordinal();
    if let Some(f) = super::load::ready(ordinal, source, entry) {
        return Ok(Some(f));
    }
    let (lock, _) = builds();
    let mut b = lock.lock().unwrap_or_else(|e| e.into_inner());
    let key = (ordinal, source.name);
    if let Some(reason) = b.failed.get(&key) {
        return Err(Error::Cuda {
            op: what,
            message: reason.clone(),
        });
    }
    if crate::plan::policy().deterministic {
        drop(b);
        return build(stream, source, entry).map(Some);
    }
    if b.pending.insert(key) {
        b.queue.push_back((stream.clone(), source, entry));
        if b.workers < super::load::parallelism() {
            b.workers += 1;
            if std::thread::Builder::new()
                .name("cudnn-fusion-build".into())
                .spawn(build_worker)
                .is_err()
            {
                b.workers -= 1;
                drop(b);
                // No thread: build here instead.
                return build(stream, source, entry).map(Some);
            }
        }
    }
    Ok(None)
}

/// Blocks until every queued fused-kernel build has finished (`ops::wait_for_builds` waits
/// for the cuDNN plans built in the background too).
pub fn wait_for_builds() {
    let (lock, done) = builds();
    let mut b = lock.lock().unwrap_or_else(|e| e.into_inner());
    while !b.pending.is_empty() {
        b = done.wait(b).unwrap_or_else(|e| e.into_inner());
    }
}

/// Runs `program`: `inputs` broadcast to the dims of the outputs, which all share those dims
/// and must not overlap themselves; `scalars` are the program's scalar operands. Builds its
/// kernel first when needed (blocking).
pub fn run(
    stream: &Arc<CudaStream>,
    program: &Program,
    inputs: &[TensorRef],
    outputs: &[TensorMut],
    scalars: &[f32],
) -> Result<()> {
    let launch = FusedLaunch::new(program, inputs, outputs, scalars)?;
    let f = stream_function(stream, source_for(program, launch.variant)?, ENTRY)?;
    launch.launch(stream, program, &f, launch.variant)
}

/// An address every fresh device allocation is aligned to (at least): where
/// [`FusedLaunch::for_packed_outputs`] assumes its outputs until they are bound.
const OUTPUT_ALIGNMENT: u64 = 256;

/// A checked launch of a program: its arguments and the kernel variant they need. It keeps
/// the views it was given, so their memory stays borrowed until it drops.
#[derive(Clone, Debug)]
pub struct FusedLaunch<'a> {
    args: FusedArgs,
    variant: Variant,
    /// The dims the launch covers (its full-shape outputs').
    out_dims: Shape,
    /// The dims of the program's small outputs, when it has any.
    small_dims: Option<Shape>,
    /// Whether real outputs are bound ([`FusedLaunch::for_packed_outputs`] has none yet).
    bound: bool,
    /// How many of `views` are inputs (the outputs follow).
    inputs: usize,
    /// The inputs and outputs the arguments point into.
    views: Vec<TensorRef<'a>>,
}

/// An output as the launch needs it.
struct OutputDesc<'t> {
    dims: &'t [i64],
    strides: &'t [i64],
    dtype: DataType,
    ptr: u64,
    address: DeviceAddress,
}

impl<'t> OutputDesc<'t> {
    fn of(t: &'t TensorRef) -> Self {
        Self {
            dims: &t.dims,
            strides: &t.strides,
            dtype: t.dtype,
            ptr: t.ptr,
            address: t.address(),
        }
    }
}

/// The pointer-free part of a launch from [`FusedLaunch::for_packed_outputs`]: it serves
/// every later launch of the program whose [`launch_key`] is the same (inputs of the same
/// dims, strides, dtypes and address alignment, outputs of the same dims), which then skips
/// the checks and the layout packing.
#[derive(Clone, Debug)]
pub struct PackedLaunch {
    args: FusedArgs,
    variant: Variant,
    out_dims: Shape,
    small_dims: Option<Shape>,
}

/// Appends to `key` (a buffer reused between launches) what a [`PackedLaunch`] depends on:
/// the launch dims and small dims, and each input's dims, strides, dtype and address
/// alignment (up to 256 bytes, more than any vector access needs).
pub fn launch_key(key: &mut Vec<i64>, inputs: &[TensorRef], out_dims: &[i64], small_dims: Option<&[i64]>) {
    key.reserve(2 + out_dims.len() * 2 + inputs.iter().map(|t| 3 + 2 * t.dims.len()).sum::<usize>());
    key.push(out_dims.len() as i64);
    key.extend_from_slice(out_dims);
    match small_dims {
        Some(s) => {
            key.push(s.len() as i64);
            key.extend_from_slice(s);
        }
        None => key.push(-1),
    }
    for t in inputs {
        push_operand_key(key, t);
    }
}

/// Appends what a launch's checks read of operand `t` to `key`: its dims, strides and dtype,
/// and its address's alignment (up to 256 bytes; -1 for a null address).
pub(crate) fn push_operand_key(key: &mut Vec<i64>, t: &TensorRef) {
    key.push(t.dims.len() as i64);
    key.extend_from_slice(&t.dims);
    key.extend_from_slice(&t.strides);
    key.push(t.dtype as i64);
    key.push(if t.ptr == 0 {
        -1
    } else {
        i64::from(t.ptr.trailing_zeros().min(8))
    });
}

impl<'a> FusedLaunch<'a> {
    /// Checks `inputs`, `outputs` and `scalars` against `program` (as [`run`] describes) and
    /// packs the launch.
    pub fn new(
        program: &Program,
        inputs: &[TensorRef<'a>],
        outputs: &[TensorMut<'a>],
        scalars: &[f32],
    ) -> Result<Self> {
        const OP: &str = "fused elementwise";
        if program.small_outputs != 0 {
            return Err(Error::invalid_arg(
                OP,
                "program",
                "small outputs need a launch with their shape",
            ));
        }
        let descs: Vec<OutputDesc> = outputs.iter().map(|o| OutputDesc::of(o)).collect();
        let Some(out0) = descs.first() else {
            return Err(Error::invalid_arg(OP, "out", "no outputs"));
        };
        let mut launch = Self::pack(
            program,
            inputs,
            &descs,
            scalars,
            (out0.dims, out0.strides, out0.ptr),
            None,
        )?;
        launch.views.extend(outputs.iter().map(|o| TensorRef::clone(o)));
        launch.bound = true;
        Ok(launch)
    }

    /// Packs a launch over `launch` (dims, strides and address of its full-shape outputs);
    /// the program's small outputs are packed with `small_dims`, which broadcast to those dims.
    fn pack(
        program: &Program,
        inputs: &[TensorRef<'a>],
        outputs: &[OutputDesc],
        scalars: &[f32],
        launch: (&[i64], &[i64], u64),
        small_dims: Option<&[i64]>,
    ) -> Result<Self> {
        const OP: &str = "fused elementwise";
        program.check_operand_counts(OP, inputs.len(), outputs.len(), scalars.len())?;
        let (out_dims, out_strides, out_ptr) = launch;
        let n = check_layout(OP, "out", out_dims, out_strides, out_ptr)?;
        if may_overlap(out_dims, out_strides) {
            let msg = format!("dims {out_dims:?} with strides {out_strides:?} overlap (a 0 or too small stride)");
            return Err(Error::invalid_arg(OP, "out", msg));
        }
        let small_strides = match small_dims {
            Some(dims) => broadcast_strides(OP, dims, &row_major_strides(dims), out_dims)?,
            None if program.small_outputs != 0 => {
                return Err(Error::invalid_arg(OP, "program", "small outputs without their shape"));
            }
            None => vec![0; out_dims.len()],
        };
        for (j, (o, &(_, d))) in outputs.iter().zip(&program.outputs).enumerate() {
            check_layout(OP, "out", o.dims, o.strides, o.ptr)?;
            let want_dims = program.output_dims(j, out_dims, small_dims);
            let want_strides = if want_dims == out_dims {
                crate::types::Shape::from_slice(out_strides)
            } else {
                row_major_strides(want_dims)
            };
            if o.dims != want_dims || o.strides != want_strides.as_slice() || o.dtype != d {
                return Err(Error::invalid_arg(
                    OP,
                    "out",
                    format!(
                        "output {j} is {:?} {:?} {:?}; want {want_dims:?} {want_strides:?} {d:?}",
                        o.dims, o.strides, o.dtype
                    ),
                ));
            }
        }
        let mut strides = program.input_strides(OP, inputs, out_dims)?;
        strides.push(out_strides.to_vec());
        strides.push(small_strides);
        let (mut shape, mut strides) = coalesce(out_dims, &strides);
        if shape.is_empty() {
            // One element (or none): rank 1 of length 1.
            shape.push(1);
            for s in &mut strides {
                s.push(0);
            }
        }
        let out_strides = &strides[inputs.len()];
        let small_strides = &strides[inputs.len() + 1];
        let mut all_strides: Vec<Vec<i64>> = strides[..inputs.len()].to_vec();
        let mut addrs: Vec<u64> = inputs.iter().map(|t| t.ptr).collect();
        let mut sizes: Vec<usize> = inputs.iter().map(|t| t.dtype.size()).collect();
        for (j, o) in outputs.iter().enumerate() {
            all_strides.push(if program.is_small(j) {
                small_strides.clone()
            } else {
                out_strides.clone()
            });
            addrs.push(o.ptr);
            sizes.push(o.dtype.size());
        }
        let variant = choose_variant(&shape, &all_strides, &addrs, &sizes, n);
        let mut args = FusedArgs {
            ptr: [crate::types::DeviceAddress::NULL; MAX_INPUTS + MAX_OUTPUTS],
            in_layout: [KernelLayout::default(); MAX_INPUTS],
            out_layout: kernel_layout(OP, &shape, out_strides)?,
            small_layout: kernel_layout(OP, &shape, small_strides)?,
            s: [0.0; MAX_SCALARS],
            n,
        };
        for (k, t) in inputs.iter().enumerate() {
            args.ptr[k] = t.address();
            args.in_layout[k] = kernel_layout(OP, &shape, &strides[k])?;
        }
        for (j, o) in outputs.iter().enumerate() {
            args.ptr[MAX_INPUTS + j] = o.address;
        }
        args.s[..scalars.len()].copy_from_slice(scalars);
        Ok(Self {
            args,
            variant,
            out_dims: Shape::from_slice(out_dims),
            small_dims: small_dims.map(Shape::from_slice),
            bound: false,
            inputs: inputs.len(),
            views: inputs.to_vec(),
        })
    }

    /// A launch of `program` over `inputs` into packed outputs of `out_dims` that do not exist
    /// yet (its small outputs, if any, packed with `small_dims`): its variant is known (for
    /// [`ready_or_queue`]) before the outputs are allocated; [`FusedLaunch::bind`] supplies
    /// them and the scalars, and only then can it launch.
    pub fn for_packed_outputs(
        program: &Program,
        inputs: &[TensorRef<'a>],
        out_dims: &[i64],
        small_dims: Option<&[i64]>,
    ) -> Result<Self> {
        let strides = row_major_strides(out_dims);
        let small_strides = small_dims.map(row_major_strides).unwrap_or_default();
        let outputs: Vec<OutputDesc> = program
            .outputs
            .iter()
            .enumerate()
            .map(|(j, &(_, dtype))| {
                let dims = program.output_dims(j, out_dims, small_dims);
                OutputDesc {
                    dims,
                    strides: if dims == out_dims { &strides } else { &small_strides },
                    dtype,
                    ptr: OUTPUT_ALIGNMENT,
                    address: DeviceAddress::NULL,
                }
            })
            .collect();
        let launch = (out_dims, strides.as_slice(), OUTPUT_ALIGNMENT);
        Self::pack(
            program,
            inputs,
            &outputs,
            &vec![0.0; program.scalars],
            launch,
            small_dims,
        )
    }

    /// The pointer-free part of this launch, before its outputs are bound (see
    /// [`PackedLaunch`]).
    pub fn packed(&self) -> PackedLaunch {
        PackedLaunch {
            args: self.args,
            variant: self.variant,
            out_dims: self.out_dims.clone(),
            small_dims: self.small_dims.clone(),
        }
    }

    /// The launch [`FusedLaunch::for_packed_outputs`] would make for `inputs`, from the
    /// `packed` part of one it made for inputs of the same [`launch_key`] (the caller
    /// compares the keys); its outputs are bound as for that one.
    pub fn from_packed(packed: &PackedLaunch, inputs: &[TensorRef<'a>]) -> Self {
        let mut args = packed.args;
        for (k, t) in inputs.iter().enumerate() {
            args.ptr[k] = t.address();
        }
        Self {
            args,
            variant: packed.variant,
            out_dims: packed.out_dims.clone(),
            small_dims: packed.small_dims.clone(),
            bound: false,
            inputs: inputs.len(),
            views: inputs.to_vec(),
        }
    }

    /// Binds the real outputs (packed, of the dims and dtypes the launch was made for) and the
    /// scalars of a launch from [`FusedLaunch::for_packed_outputs`] (or rebinds them). An
    /// output less aligned than the variant's vector accesses need narrows the vector width.
    pub fn bind(&mut self, program: &Program, outputs: &[TensorMut<'a>], scalars: &[f32]) -> Result<()> {
        const OP: &str = "fused elementwise";
        if outputs.len() != program.outputs.len() || scalars.len() != program.scalars {
            return Err(Error::invalid_arg(
                OP,
                "operands",
                format!(
                    "{} outputs, {} scalars for a program of {}, {}",
                    outputs.len(),
                    scalars.len(),
                    program.outputs.len(),
                    program.scalars
                ),
            ));
        }
        for (j, (o, &(_, d))) in outputs.iter().zip(&program.outputs).enumerate() {
            check_tensor(OP, "out", o)?;
            let want = program.output_dims(j, &self.out_dims, self.small_dims.as_deref());
            if o.dims[..] != want[..] || o.strides[..] != row_major_strides(want)[..] || o.dtype != d {
                return Err(Error::invalid_arg(
                    OP,
                    "out",
                    format!(
                        "output {j} is {:?} {:?} {:?}; want packed {want:?} {d:?}",
                        o.dims, o.strides, o.dtype
                    ),
                ));
            }
        }
        for (j, (o, &(_, d))) in outputs.iter().zip(&program.outputs).enumerate() {
            let mut vec = u64::from(self.variant.vec.max(1));
            while vec > 1 && o.ptr % (vec * d.size() as u64) != 0 {
                vec /= 2;
            }
            // Narrower widths keep every other condition of the variant (they divide it).
            self.variant.vec = vec as u8;
            self.args.ptr[MAX_INPUTS + j] = o.address();
        }
        self.variant.wide = self.args.n / i64::from(self.variant.vec) >= 1 << 31;
        self.args.s[..scalars.len()].copy_from_slice(scalars);
        self.views.truncate(self.inputs);
        self.views.extend(outputs.iter().map(|o| TensorRef::clone(o)));
        self.bound = true;
        Ok(())
    }

    /// The kernel variant this launch needs.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Thread steps of the launch (elements / vector width); 0 launches nothing.
    fn groups(&self) -> u64 {
        self.args.n as u64 / u64::from(self.variant.vec.max(1))
    }

    /// Launches with `f`, the program's kernel for [`FusedLaunch::variant`] (from
    /// [`ready_or_queue`]); builds the right one first (blocking) when `f` was made for
    /// another variant (`f_variant`).
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        program: &Program,
        f: &CudaFunction,
        f_variant: Variant,
    ) -> Result<()> {
        const OP: &str = "fused elementwise";
        if !self.bound {
            return Err(Error::invalid_arg(OP, "outputs", "bind the outputs before launching"));
        }
        for v in &self.views {
            v.check_stream(stream, OP, "operands")?;
        }
        if tracing::enabled!(target: super::LAUNCH_LOG_TARGET, tracing::Level::DEBUG) {
            let rank = usize::from(self.variant.rank.max(1));
            let strides: Vec<&[i64]> = (0..self.inputs)
                .map(|k| super::dims(&self.args.in_layout[k].strides, rank))
                .collect();
            tracing::debug!(
                target: super::LAUNCH_LOG_TARGET,
                kernel = ENTRY,
                kernels = u64::from(self.groups() > 0),
                ops = program.ops.len(),
                inputs = program.inputs.len(),
                outputs = program.outputs.len(),
                small_outputs = program.small_outputs,
                shape = ?super::dims(&self.args.out_layout.shape, rank),
                input_strides = ?strides,
                vec = self.variant.vec,
                wide = self.variant.wide,
                grid = launch::fused_grid(self.groups()),
            );
        }
        if f_variant == self.variant {
            return launch::fused(stream, f, &self.args, self.groups());
        }
        let f = stream_function(stream, source_for(program, self.variant)?, ENTRY)?;
        launch::fused(stream, &f, &self.args, self.groups())
    }
}

/// A program that reads no tensor: a fill, scaled (burn-autodiff's `mean_dim` backward before
/// the gradient joins it). For the CPU and NVRTC tests.
#[cfg(test)]
pub(crate) fn scaled_fill_program() -> Program {
    Program {
        inputs: vec![],
        scalars: 2,
        ops: vec![
            FusedOp::Round(Value::Scalar(0), DataType::F32),
            FusedOp::Binary(BinaryOp::Mul, Value::Reg(0), Value::Scalar(1)),
        ],
        outputs: vec![(1, DataType::F32)],
        small_outputs: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation kind, every operand kind and every storage dtype, as the kernel
    /// source spells them: the generated text the fused kernels are compiled from.
    #[test]
    fn operations_loads_and_stores_are_spelled_exactly() {
        let (x0, x1, x2) = (Value::Input(0), Value::Input(1), Value::Input(2));
        let p = Program {
            inputs: vec![DataType::F32, DataType::F16, DataType::Bool, DataType::BF16],
            scalars: 2,
            ops: vec![
                FusedOp::unary(UnaryOp::Exp, x0).unwrap(),
                FusedOp::Binary(BinaryOp::Mul, Value::Reg(0), Value::Scalar(1)),
                FusedOp::Compare(CompareOp::Gt, x1, Value::Scalar(0)),
                FusedOp::Select(x2, Value::Reg(1), Value::Input(3)),
                FusedOp::Clamp(Value::Reg(3), Value::Scalar(0), Value::Scalar(1)),
                FusedOp::Round(Value::Reg(4), DataType::F16),
                FusedOp::Round(Value::Reg(5), DataType::BF16),
                FusedOp::Round(Value::Reg(6), DataType::F32),
                FusedOp::FromBool(Value::Reg(2)),
                FusedOp::Not(x2),
                FusedOp::And(Value::Reg(2), Value::Reg(9)),
                FusedOp::Or(Value::Reg(10), x2),
                FusedOp::Compare(CompareOp::Eq, Value::Reg(7), Value::Reg(8)),
            ],
            outputs: vec![
                (7, DataType::F32),
                (6, DataType::F16),
                (5, DataType::BF16),
                (11, DataType::Bool),
            ],
            small_outputs: 0,
        };
        p.validate().unwrap();
        let mut ops = String::new();
        p.emit_operations(&mut ops, "  ");
        let exp = UnaryOp::Exp.code();
        let mul = BinaryOp::Mul.code();
        let want = format!(
            "  const float r0 = unary_math_f32({exp}, x0, 0.0f, 0.0f);
  const float r1 = binary_math_f32({mul}, r0, a.s[1]);
  const bool r2 = (x1 > a.s[0]);
  const float r3 = (x2 ? r1 : x3);
  const float r4 = unary_math_f32(26, r3, a.s[0], a.s[1]);
  const float r5 = f16_to_f32(f32_to_f16(r4));
  const float r6 = bf16_to_f32(f32_to_bf16(r5));
  const float r7 = r6;
  const float r8 = (r2 ? 1.0f : 0.0f);
  const bool r9 = (!x2);
  const bool r10 = (r2 && r9);
  const bool r11 = (r10 || x2);
  const bool r12 = (r7 == r8);
"
        );
        assert_eq!(ops, want);
        let mut loads = String::new();
        p.emit_input_values(&mut loads, "", |k| format!("v{k}[v]"));
        assert_eq!(
            loads,
            "const float x0 = v0[v];\nconst float x1 = f16_to_f32(v1[v]);\nconst bool x2 = (v2[v] != 0);\n\
             const float x3 = bf16_to_f32(v3[v]);\n"
        );
        let stores: Vec<String> = p
            .outputs
            .iter()
            .map(|&(r, d)| store_expr(&format!("r{r}"), d))
            .collect();
        assert_eq!(stores, ["r7", "f32_to_f16(r6)", "f32_to_bf16(r5)", "(u8)(r11 ? 1 : 0)"]);
    }

    fn relu_add() -> Program {
        // y = max(a + b, 0) stored f16, and the mask a + b <= 0 stored as bools.
        Program {
            inputs: vec![DataType::F16, DataType::F32],
            scalars: 1,
            ops: vec![
                FusedOp::Binary(BinaryOp::Add, Value::Input(0), Value::Input(1)),
                FusedOp::Compare(CompareOp::Le, Value::Reg(0), Value::Scalar(0)),
                FusedOp::Select(Value::Reg(1), Value::Scalar(0), Value::Reg(0)),
            ],
            outputs: vec![(2, DataType::F16), (1, DataType::Bool)],
            small_outputs: 0,
        }
    }

    #[test]
    fn valid_programs_generate_one_kernel() {
        let p = relu_add();
        p.validate().unwrap();
        let src = p.source(Variant {
            rank: 2,
            vec: 4,
            wide: false,
        });
        assert!(src.contains("KERNEL void fused_elementwise"));
        assert!(src.contains("#define FR 2\n#define FV 4\ntypedef unsigned int FIDX;"));
        assert!(src.contains("fused_load<u16, FV>(p0, o0, a.in_layout[0].strides[FR - 1], v0);"));
        assert!(src.contains("const float x0 = f16_to_f32(v0[v]);"));
        assert!(src.contains("const bool r1 = (r0 <= a.s[0]);"));
        assert!(src.contains("w0[v] = f32_to_f16(r2);"));
        assert!(src.contains("w1[v] = (u8)(r1 ? 1 : 0);"));
        assert!(src.contains("fused_store<u8, FV>(q1, oo, a.out_layout.strides[FR - 1], w1);"));
    }

    #[test]
    fn the_vector_width_follows_the_inner_dim_the_alignment_and_the_operand_count() {
        let v = |shape: &[i64], strides: &[Vec<i64>], addrs: &[u64], sizes: &[usize]| {
            let n = shape.iter().product();
            let c = choose_variant(shape, strides, addrs, sizes, n);
            (c.rank, c.vec)
        };
        // A bias [512] over [8192, 512] bf16, packed output: 8 per step.
        let bias = [vec![512, 1], vec![0, 1], vec![512, 1]];
        assert_eq!(v(&[8192, 512], &bias, &[0, 0, 0], &[2, 2, 2]), (2, 8));
        // The bias starts 8 bytes in: 4 per step keeps its vector loads aligned.
        assert_eq!(v(&[8192, 512], &bias, &[0, 8, 0], &[2, 2, 2]), (2, 4));
        // An inner dim of 6: 2 per step; of 7: 1.
        assert_eq!(v(&[10, 6], &[vec![6, 1], vec![6, 1]], &[0, 0], &[4, 4]), (2, 2));
        assert_eq!(v(&[10, 7], &[vec![7, 1], vec![7, 1]], &[0, 0], &[4, 4]), (2, 1));
        // A gathered (transposed) input needs no alignment; a row stride of 6 limits to 2.
        assert_eq!(v(&[8, 16], &[vec![1, 8], vec![16, 1]], &[2, 0], &[4, 4]), (2, 8));
        assert_eq!(v(&[8, 4], &[vec![6, 1], vec![4, 1]], &[0, 0], &[4, 4]), (2, 2));
        // Many operands: 16 bytes per step, then 8 (f32: 4, then 2; 16-bit: 8, then 4; the
        // widest operand decides).
        let six = vec![vec![1i64]; 6];
        assert_eq!(v(&[1024], &six, &[0; 6], &[4; 6]), (1, 4));
        assert_eq!(v(&[1024], &six, &[0; 6], &[2; 6]), (1, 8));
        assert_eq!(v(&[1024], &six, &[0; 6], &[2, 2, 2, 2, 2, 4]), (1, 4));
        let twelve = vec![vec![1i64]; 12];
        assert_eq!(v(&[1024], &twelve, &[0; 12], &[4; 12]), (1, 2));
        assert_eq!(v(&[1024], &twelve, &[0; 12], &[2; 12]), (1, 4));
        // Burn's batch-norm normalization in bf16 (x, mean, std, gamma, beta; x - mean, its
        // quotient and the output stored): 8 per step, 16-byte accesses.
        let bn = [
            vec![802816, 12544, 1],
            vec![0, 1, 0],
            vec![0, 1, 0],
            vec![0, 1, 0],
            vec![0, 1, 0],
        ];
        let bn: Vec<Vec<i64>> = bn
            .into_iter()
            .chain(std::iter::repeat_n(vec![802816, 12544, 1], 3))
            .collect();
        assert_eq!(v(&[64, 64, 12544], &bn, &[0; 8], &[2; 8]), (3, 8));
        // 2^31 groups and more index in 64 bits.
        let c = choose_variant(&[1 << 32], &[vec![1], vec![1]], &[0, 0], &[1, 1], 1 << 32);
        assert_eq!((c.vec, c.wide), (8, false));
        assert!(choose_variant(&[1 << 34], &[vec![1], vec![1]], &[0, 0], &[1, 1], 1 << 34).wide);
    }

    #[test]
    fn a_program_that_reads_no_tensor_launches_over_its_outputs() {
        let p = scaled_fill_program();
        p.validate().unwrap();
        let dims = [8i64, 16];
        let mut launch = FusedLaunch::for_packed_outputs(&p, &[], &dims, None).unwrap();
        launch
            .bind(&p, &[TensorMut::fake_packed(&dims, DataType::F32, 0x3000)], &[1.0, 0.5])
            .unwrap();
        // Packed outputs alone decide the vector width.
        assert!(launch.variant().vec > 1);
    }

    #[test]
    fn small_outputs_are_stored_once_per_element_of_their_shape() {
        // relu_add over [2, 3, 4, 4] with its f16 result stored at [1, 3, 1, 1] (small).
        let p = Program {
            small_outputs: 0b01,
            ..relu_add()
        };
        p.validate().unwrap();
        let src = p.source(Variant {
            rank: 3,
            vec: 4,
            wide: false,
        });
        assert!(src.contains("if (a.small_layout.strides[d] == 0 && cc != 0) ks = false;"));
        assert!(src.contains("if (ks) { if (a.small_layout.strides[FR - 1] == 0) q0[os] = w0[0];"));
        let (dims, small) = ([2i64, 3, 4, 4], [1i64, 3, 1, 1]);
        let inputs = [
            TensorRef::fake_packed(&dims, DataType::F16, 0x1000),
            TensorRef::fake_packed(&[4], DataType::F32, 0x2000),
        ];
        let mut launch = FusedLaunch::for_packed_outputs(&p, &inputs, &dims, Some(&small)).unwrap();
        // The small output's broadcast inner dim does not narrow the vector width.
        assert_eq!((launch.variant().rank, launch.variant().vec), (4, 4));
        assert_eq!(&launch.args.small_layout.strides[..4], &[0, 1, 0, 0]);
        let outs = [
            TensorMut::fake_packed(&small, DataType::F16, 0x3000),
            TensorMut::fake_packed(&dims, DataType::Bool, 0x4000),
        ];
        launch.bind(&p, &outs, &[0.5]).unwrap();
        // The small output at full size, or a program with small outputs but no small shape,
        // is refused.
        let full = [
            TensorMut::fake_packed(&dims, DataType::F16, 0x3000),
            TensorMut::fake_packed(&dims, DataType::Bool, 0x4000),
        ];
        assert!(launch.bind(&p, &full, &[0.5]).is_err());
        assert!(FusedLaunch::for_packed_outputs(&p, &inputs, &dims, None).is_err());
        assert!(FusedLaunch::new(&p, &inputs, &full, &[0.5]).is_err());
    }

    #[test]
    fn binding_outputs_narrows_the_vector_width_to_their_alignment() {
        let p = relu_add();
        let dims = [8i64, 16];
        let inputs = [
            TensorRef::fake_packed(&dims, DataType::F16, 0x1000),
            TensorRef::fake_packed(&[16], DataType::F32, 0x2000),
        ];
        let mut launch = FusedLaunch::for_packed_outputs(&p, &inputs, &dims, None).unwrap();
        assert_eq!(launch.variant().vec, 8);
        let out = |ptr_f16: u64| {
            [
                TensorMut::fake_packed(&dims, DataType::F16, ptr_f16),
                TensorMut::fake_packed(&dims, DataType::Bool, 0x4000),
            ]
        };
        launch.bind(&p, &out(0x3000), &[0.5]).unwrap();
        assert_eq!(launch.variant().vec, 8);
        // An f16 output 4 bytes past an aligned address allows 2 per step.
        launch.bind(&p, &out(0x3004), &[0.5]).unwrap();
        assert_eq!(launch.variant().vec, 2);
        // Outputs of other dims, or too few scalars, are refused.
        let wrong = [
            TensorMut::fake_packed(&[16, 8], DataType::F16, 0x3000),
            TensorMut::fake_packed(&dims, DataType::Bool, 0x4000),
        ];
        assert!(launch.bind(&p, &wrong, &[0.5]).is_err());
        assert!(launch.bind(&p, &out(0x3000), &[]).is_err());
    }

    #[test]
    fn invalid_programs_are_errors() {
        let mut p = relu_add();
        p.ops[0] = FusedOp::Binary(BinaryOp::Add, Value::Reg(1), Value::Input(1));
        assert!(p.validate().is_err(), "reads a later register");
        let mut p = relu_add();
        p.ops[2] = FusedOp::Select(Value::Reg(0), Value::Scalar(0), Value::Reg(0));
        assert!(p.validate().is_err(), "float condition");
        let mut p = relu_add();
        p.outputs[1] = (1, DataType::F32);
        assert!(p.validate().is_err(), "bool stored as float");
        let mut p = relu_add();
        p.inputs[0] = DataType::I64;
        assert!(p.validate().is_err(), "int input");
        assert!(FusedOp::unary(UnaryOp::MulScalar(2.0), Value::Input(0)).is_none());
        assert!(FusedOp::unary(UnaryOp::Exp, Value::Input(0)).is_some());
        let mut p = relu_add();
        p.outputs.clear();
        assert!(p.validate().is_err(), "no outputs");
    }
}
