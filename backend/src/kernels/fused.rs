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
//! persistent kernel cache keyed by the source's hash), once per program and device; later
//! launches of the same program are one map lookup. [`ready_or_queue`] builds new programs on
//! background threads, so a caller can run the operations unfused until the kernel is ready.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaStream};

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_fused::{self as launch, FusedArgs};
use crate::graph::DataType;
use crate::kernels::check::{check_no_overlap, check_tensor};
use crate::kernels::elementwise::{BinaryOp, CompareOp, UnaryOp};
use crate::kernels::layout::{broadcast_strides, coalesce, kernel_layout};
use crate::kernels::{stream_function, KernelSource};
use crate::ops::TensorRef;

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
    fn gives_bool(&self) -> bool {
        matches!(
            self,
            FusedOp::Compare(..) | FusedOp::Not(_) | FusedOp::And(..) | FusedOp::Or(..)
        )
    }

    fn operands(&self) -> Vec<Value> {
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
}

fn storable(dtype: DataType) -> bool {
    matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16 | DataType::Bool)
}

impl Program {
    /// Checks the program: limits, operand references and types, storage dtypes.
    pub fn validate(&self) -> Result<()> {
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
        if self.outputs.is_empty() {
            return err("no outputs".into());
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

    /// The CUDA source of the program's kernel `fused_elementwise` (it calls the math of
    /// `kernels/elementwise_math.cuh`, which precedes it in the compiled text).
    pub fn source(&self) -> String {
        let mut s = String::with_capacity(1024 + 96 * self.ops.len());
        let _ = writeln!(
            s,
            "\nstruct FusedArgs {{ u64 ptr[{}]; Layout in_layout[{MAX_INPUTS}]; Layout out_layout; float s[{MAX_SCALARS}]; i64 n; }};",
            MAX_INPUTS + MAX_OUTPUTS
        );
        s.push_str("KERNEL void fused_elementwise(const FusedArgs a) {\n    FOR_EACH(i, a.n) {\n");
        s.push_str("        const i64 o = offset_of(a.out_layout, i);\n");
        for (k, d) in self.inputs.iter().enumerate() {
            let load = match d {
                DataType::F32 => format!("((const float*)a.ptr[{k}])[offset_of(a.in_layout[{k}], i)]"),
                DataType::F16 => format!("f16_to_f32(((const u16*)a.ptr[{k}])[offset_of(a.in_layout[{k}], i)])"),
                DataType::BF16 => format!("bf16_to_f32(((const u16*)a.ptr[{k}])[offset_of(a.in_layout[{k}], i)])"),
                _ => format!("(((const u8*)a.ptr[{k}])[offset_of(a.in_layout[{k}], i)] != 0)"),
            };
            let ty = if *d == DataType::Bool { "bool" } else { "float" };
            let _ = writeln!(s, "        const {ty} x{k} = {load};");
        }
        let v = |v: Value| match v {
            Value::Input(k) => format!("x{k}"),
            Value::Reg(r) => format!("r{r}"),
            Value::Scalar(k) => format!("a.s[{k}]"),
        };
        for (i, op) in self.ops.iter().enumerate() {
            let ty = if op.gives_bool() { "bool" } else { "float" };
            let expr = match *op {
                FusedOp::Unary(code, x) => format!("unary_math_f32({code}, {}, 0.0f, 0.0f)", v(x)),
                FusedOp::Binary(b, x, y) => format!("binary_math_f32({}, {}, {})", b.code(), v(x), v(y)),
                FusedOp::Compare(c, x, y) => {
                    let sym = match c {
                        CompareOp::Eq => "==",
                        CompareOp::Ne => "!=",
                        CompareOp::Lt => "<",
                        CompareOp::Le => "<=",
                        CompareOp::Gt => ">",
                        CompareOp::Ge => ">=",
                    };
                    format!("({} {sym} {})", v(x), v(y))
                }
                FusedOp::Select(c, x, y) => format!("({} ? {} : {})", v(c), v(x), v(y)),
                FusedOp::Clamp(x, lo, hi) => format!("unary_math_f32(26, {}, {}, {})", v(x), v(lo), v(hi)),
                FusedOp::Round(x, DataType::F16) => format!("f16_to_f32(f32_to_f16({}))", v(x)),
                FusedOp::Round(x, DataType::BF16) => format!("bf16_to_f32(f32_to_bf16({}))", v(x)),
                FusedOp::Round(x, _) => v(x),
                FusedOp::FromBool(x) => format!("({} ? 1.0f : 0.0f)", v(x)),
                FusedOp::Not(x) => format!("(!{})", v(x)),
                FusedOp::And(x, y) => format!("({} && {})", v(x), v(y)),
                FusedOp::Or(x, y) => format!("({} || {})", v(x), v(y)),
            };
            let _ = writeln!(s, "        const {ty} r{i} = {expr};");
        }
        for (j, &(r, d)) in self.outputs.iter().enumerate() {
            let p = MAX_INPUTS + j;
            let store = match d {
                DataType::F32 => format!("((float*)a.ptr[{p}])[o] = r{r};"),
                DataType::F16 => format!("((u16*)a.ptr[{p}])[o] = f32_to_f16(r{r});"),
                DataType::BF16 => format!("((u16*)a.ptr[{p}])[o] = f32_to_bf16(r{r});"),
                _ => format!("((u8*)a.ptr[{p}])[o] = r{r} ? 1 : 0;"),
            };
            let _ = writeln!(s, "        {store}");
        }
        s.push_str("    }\n}\n");
        s
    }
}

/// Entry point of every generated program.
const ENTRY: &str = "fused_elementwise";

/// The kernel source of `program` (generated once per distinct program, then looked up).
fn source_for(program: &Program) -> Result<KernelSource> {
    static SOURCES: OnceLock<Mutex<HashMap<Program, KernelSource>>> = OnceLock::new();
    let mut map = SOURCES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = map.get(program) {
        return Ok(*s);
    }
    program.validate()?;
    let code = format!("{}\n{}", super::ELEMENTWISE_MATH, program.source());
    let name = format!("fused-{:032x}.cu", super::cache::source_hash(&code));
    // One leak per distinct program: the loader keys kernels by `&'static str`.
    let s = KernelSource {
        name: Box::leak(name.into_boxed_str()),
        code: Box::leak(code.into_boxed_str()),
        common: true,
    };
    map.insert(program.clone(), s);
    Ok(s)
}

/// Builds queued in the background: (device ordinal, source name) pending or failed.
#[derive(Default)]
struct Builds {
    queue: std::collections::VecDeque<(Arc<CudaStream>, KernelSource)>,
    pending: std::collections::HashSet<(usize, &'static str)>,
    failed: HashMap<(usize, &'static str), String>,
    workers: usize,
}

fn builds() -> &'static (Mutex<Builds>, Condvar) {
    static B: OnceLock<(Mutex<Builds>, Condvar)> = OnceLock::new();
    B.get_or_init(Default::default)
}

/// One background builder: compiles (or reads from the kernel cache) queued programs until
/// the queue is empty.
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
        let (stream, source) = job;
        let key = (stream.context().ordinal(), source.name);
        let result = stream_function(&stream, source, ENTRY);
        let mut b = lock.lock().unwrap_or_else(|e| e.into_inner());
        b.pending.remove(&key);
        if let Err(e) = result {
            b.failed.insert(key, e.to_string());
        }
        done.notify_all();
    }
}

/// The kernel of `program` on the device of `stream` when it is built; otherwise `Ok(None)`
/// after queueing its build on a background thread (up to one per CPU core), so the caller
/// runs the operations unfused meanwhile and a new program never stalls the stream's host
/// thread. `Err` when the program is invalid or its build failed.
pub fn ready_or_queue(stream: &Arc<CudaStream>, program: &Program) -> Result<Option<CudaFunction>> {
    let source = source_for(program)?;
    let ordinal = stream.context().ordinal();
    if let Some(f) = super::load::ready(ordinal, source, ENTRY) {
        return Ok(Some(f));
    }
    let (lock, _) = builds();
    let mut b = lock.lock().unwrap_or_else(|e| e.into_inner());
    let key = (ordinal, source.name);
    if let Some(reason) = b.failed.get(&key) {
        return Err(Error::Cuda {
            op: "building a fused elementwise kernel",
            message: reason.clone(),
        });
    }
    if b.pending.insert(key) {
        b.queue.push_back((stream.clone(), source));
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
                return stream_function(stream, source, ENTRY).map(Some);
            }
        }
    }
    Ok(None)
}

/// Blocks until every queued fused-kernel build has finished (tests and benchmarks call it
/// after a warm-up step, so later steps run fused).
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
    outputs: &[TensorRef],
    scalars: &[f32],
) -> Result<()> {
    let f = stream_function(stream, source_for(program)?, ENTRY)?;
    run_built(stream, &f, program, inputs, outputs, scalars)
}

/// [`run`] with the program's kernel `f` already in hand (from [`ready_or_queue`]), so a
/// launch takes no lock and no program lookup.
pub fn run_built(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    program: &Program,
    inputs: &[TensorRef],
    outputs: &[TensorRef],
    scalars: &[f32],
) -> Result<()> {
    const OP: &str = "fused elementwise";
    if inputs.len() != program.inputs.len()
        || outputs.len() != program.outputs.len()
        || scalars.len() != program.scalars
    {
        return Err(Error::invalid_arg(
            OP,
            "operands",
            format!(
                "{} inputs, {} outputs, {} scalars for a program of {}, {}, {}",
                inputs.len(),
                outputs.len(),
                scalars.len(),
                program.inputs.len(),
                program.outputs.len(),
                program.scalars
            ),
        ));
    }
    let out0 = &outputs[0];
    let n = check_tensor(OP, "out", out0)?;
    for (j, (o, &(_, d))) in outputs.iter().zip(&program.outputs).enumerate() {
        check_tensor(OP, "out", o)?;
        check_no_overlap(OP, "out", o)?;
        if o.dims != out0.dims || o.strides != out0.strides || o.dtype != d {
            return Err(Error::invalid_arg(
                OP,
                "out",
                format!(
                    "output {j} is {:?} {:?} {:?}; want {:?} {:?} {d:?}",
                    o.dims, o.strides, o.dtype, out0.dims, out0.strides
                ),
            ));
        }
    }
    let mut strides = Vec::with_capacity(inputs.len() + 1);
    for (k, (t, &d)) in inputs.iter().zip(&program.inputs).enumerate() {
        check_tensor(OP, "input", t)?;
        if t.dtype != d {
            return Err(Error::invalid_arg(
                OP,
                "input",
                format!("input {k} is {:?}, the program reads {d:?}", t.dtype),
            ));
        }
        strides.push(broadcast_strides(OP, &t.dims, &t.strides, &out0.dims)?);
    }
    strides.push(out0.strides.clone());
    if n == 0 {
        return Ok(());
    }
    let (shape, strides) = coalesce(&out0.dims, &strides);
    let mut args = FusedArgs {
        ptr: [0; MAX_INPUTS + MAX_OUTPUTS],
        in_layout: [KernelLayout::default(); MAX_INPUTS],
        out_layout: kernel_layout(OP, &shape, &strides[inputs.len()])?,
        s: [0.0; MAX_SCALARS],
        n,
    };
    for (k, t) in inputs.iter().enumerate() {
        args.ptr[k] = t.ptr;
        args.in_layout[k] = kernel_layout(OP, &shape, &strides[k])?;
    }
    for (j, o) in outputs.iter().enumerate() {
        args.ptr[MAX_INPUTS + j] = o.ptr;
    }
    args.s[..scalars.len()].copy_from_slice(scalars);
    launch::fused(stream, f, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn valid_programs_generate_one_kernel() {
        let p = relu_add();
        p.validate().unwrap();
        let src = p.source();
        assert!(src.contains("KERNEL void fused_elementwise"));
        assert!(src.contains("const float x0 = f16_to_f32("));
        assert!(src.contains("const bool r1 = (r0 <= a.s[0]);"));
        assert!(src.contains("= f32_to_f16(r2);"));
        assert!(src.contains("= r1 ? 1 : 0;"));
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
