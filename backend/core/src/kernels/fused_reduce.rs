//! Fused reductions: a fused elementwise [`Program`] whose chosen value (the *target*) is
//! summed over some dims of the program's shape, in one generated kernel. The program's other
//! stored registers are written as the elementwise kernel would write them (each element is
//! visited once), so the values a reduction reads are never stored just to be read back. Its
//! *small* outputs ([`Program::small_outputs`]) have the kept elements' shape: each is stored
//! once per kept element, by the visit of that element's first reduced element. A program may
//! sum up to [`MAX_TARGETS`] values over the same dims in the same pass, each into its own
//! result ([`ReduceProgram::siblings`]).
//!
//! The kernel walks the iteration shape as kept elements (the result's) times reduced ones.
//! A block is `(lanes, rows)` threads: lanes take consecutive kept elements, rows stride over
//! the reduced ones of one chunk. When the innermost dim is reduced the block is one lane of
//! 256 rows, so a warp reads consecutive addresses along it; when it is kept, 32 lanes of 8
//! rows. Long reductions split into chunks across the grid's second dim; their partial sums
//! (f32) are combined in chunk order by a second launch of the same kernel, so results are
//! deterministic. Sums accumulate in f32 whatever the storage dtype and are scaled once (a
//! mean) before the result is rounded to its dtype.

use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream};

use crate::error::{Error, Result};
use crate::ffi::launch::{KernelLayout, MAX_KERNEL_RANK};
pub use crate::ffi::launch_fused::MAX_TARGETS;
use crate::ffi::launch_fused::{self as launch, ReduceArgs, ARRIVALS_SLOT, REDUCE_THREADS, RESULT_SLOT, SCRATCH_SLOT};
use crate::graph::{may_overlap, DataType};
use crate::kernels::check::check_tensor;
use crate::kernels::fused::{
    generated_source, max_vec, push_operand_key, ready_or_queue_source, storage_type, store_expr, vector_access_fits,
    VECTOR_ACCESS,
};
use crate::kernels::fused::{Program, Value, MAX_INPUTS, MAX_SCALARS};
use crate::kernels::layout::{coalesce as coalesce_dims, kernel_layout};
use crate::kernels::KernelSource;
use crate::types::{row_major_strides, TensorMut, TensorRef};

const OP: &str = "fused reduction";

/// Entry point of every generated reduction.
const ENTRY: &str = "fused_reduce";

/// A program and the reduction of one of its values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReduceProgram {
    /// The elementwise operations; its outputs are the other registers it stores (its small
    /// outputs at the kept elements' shape, packed like the result).
    pub program: Program,
    /// The value summed: an input or a register, a float.
    pub target: Value,
    /// More values summed over the same dims, each into a result of its own (burn-autodiff's
    /// batch-norm gradients sum three values of one pass): at most [`MAX_TARGETS`] - 1, for
    /// sums without an epilogue.
    pub siblings: Vec<Value>,
    /// Rank of the iteration shape (1 to the kernels' maximum).
    pub rank: u8,
    /// Bit `d` set: dim `d` of the iteration shape is reduced.
    pub reduced: u8,
    /// The reduction is a max (a NaN anywhere wins, as in the unfused max), not a sum.
    pub max: bool,
    /// Storage dtype of the result (`F32`, `F16` or `BF16`).
    pub out: DataType,
    /// The iteration shape has `2^31` elements or more: 64-bit coordinates.
    pub wide: bool,
    /// Consecutive elements of the innermost dim each thread takes per step (1, 2, 4 or 8),
    /// moved with one vector access by every operand whose innermost stride is 1; above 1
    /// only when that dim is reduced ([`Coalesced::of`] chooses it for the launch).
    pub vec: u8,
    /// Operations after the reduction that read its result, broadcast along the reduced
    /// dims (a softmax's division by its row sum, a layer norm's normalization by its
    /// variance): computed in a second pass over each kept element's reduced ones.
    pub epilogue: Option<Epilogue>,
}

/// The operations of a [`ReduceProgram`] that follow its reduction. The kernel sums over
/// the program's first `prologue_ops` operations (storing nothing), writes the result, then
/// walks the same elements again: it reads the result as input `result_input` (broadcast
/// along the reduced dims, of the result's dtype, so it rounds as a stored result would),
/// computes every operation and stores the program's outputs. When the reduced elements of
/// a kept element span several chunks, that second pass is a third launch, after the
/// partial sums are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// Operations before the reduction (the prologue); the rest read its result.
    pub prologue_ops: u16,
    /// The input that is the reduction's result, when an operation reads it.
    pub result_input: Option<u8>,
}

impl ReduceProgram {
    /// Checks the program, its target, rank, reduced dims and result dtype.
    pub fn validate(&self) -> Result<()> {
        let err = |reason: String| Err(Error::invalid_arg(OP, "program", reason));
        self.program.validate_operations()?;
        let is_float = |target: Value| match target {
            Value::Input(k) => self
                .program
                .inputs
                .get(k as usize)
                .is_some_and(|d| *d != DataType::Bool),
            Value::Reg(r) => (r as usize) < self.program.ops.len() && !self.program.ops[r as usize].gives_bool(),
            Value::Scalar(_) => false,
        };
        if let Some(t) = self.targets().find(|&t| !is_float(t)) {
            return err(format!("target {t:?} is not a float value of the program"));
        }
        if self.targets().count() > MAX_TARGETS || (!self.siblings.is_empty() && (self.max || self.epilogue.is_some()))
        {
            return err(format!(
                "{} targets (at most {MAX_TARGETS}; more than one only for sums without an epilogue)",
                self.targets().count()
            ));
        }
        if self.rank == 0 || usize::from(self.rank) > MAX_KERNEL_RANK {
            return err(format!("rank {} (1 to {MAX_KERNEL_RANK})", self.rank));
        }
        if self.reduced == 0 || u32::from(self.reduced) >= 1u32 << self.rank {
            return err(format!("reduced dims {:#b} of rank {}", self.reduced, self.rank));
        }
        if !matches!(self.out, DataType::F32 | DataType::F16 | DataType::BF16) {
            return err(format!("result dtype {:?} (supported: F32, F16, BF16)", self.out));
        }
        if !matches!(self.vec, 1 | 2 | 4 | 8) || (self.vec > 1 && self.reduced >> (self.rank - 1) & 1 == 0) {
            return err(format!(
                "vector width {} (1, 2, 4 or 8; above 1 the innermost dim must be reduced)",
                self.vec
            ));
        }
        if let Some(e) = self.epilogue {
            let p = usize::from(e.prologue_ops);
            if p > self.program.ops.len() || matches!(self.target, Value::Reg(r) if usize::from(r) >= p) {
                return err(format!(
                    "a prologue of {p} of {} ops for target {:?}",
                    self.program.ops.len(),
                    self.target
                ));
            }
            if let Some(k) = e.result_input {
                if self.program.inputs.get(usize::from(k)) != Some(&self.out) || self.target == Value::Input(k) {
                    return err(format!("result input {k} (the result is {:?})", self.out));
                }
                let reads_result = |op: &crate::kernels::fused::FusedOp| op.operands().contains(&Value::Input(k));
                if self.program.ops[..p].iter().any(reads_result) {
                    return err(format!("a prologue operation reads the result (input {k})"));
                }
            }
        }
        Ok(())
    }

    /// The values summed: the target, then its siblings (result `t` is target `t`'s).
    pub fn targets(&self) -> impl Iterator<Item = Value> + '_ {
        std::iter::once(self.target).chain(self.siblings.iter().copied())
    }

    /// The CUDA source of `fused_reduce` (see the module).
    pub fn source(&self) -> String {
        let p = &self.program;
        let mut s = String::with_capacity(4096 + 128 * p.ops.len());
        let targets = self.targets().count();
        let _ = writeln!(
            s,
            "\nstruct ReduceArgs {{ u64 ptr[{}]; Layout in_layout[{MAX_INPUTS}]; Layout full; float s[{MAX_SCALARS}]; \
             i64 kept; i64 red; i64 chunk; i64 chunks; float scale[{MAX_TARGETS}]; int phase; int warp_rows; }};",
            ARRIVALS_SLOT + 1
        );
        let idx = if self.wide {
            "unsigned long long"
        } else {
            "unsigned int"
        };
        let rt = storage_type(self.out);
        let _ = writeln!(
            s,
            "#define FR {}\n#define FMASK {}u\n#define RED(d) ((FMASK >> (d)) & 1u)\ntypedef {idx} FIDX;",
            self.rank, self.reduced
        );
        if self.vec > 1 {
            // Coordinates count groups of FV innermost elements; offsets along that dim
            // advance FV elements per group.
            let _ = writeln!(s, "#define FV {}", self.vec);
            s.push_str(VECTOR_ACCESS);
        }
        // How two partial results combine, and the start value.
        if self.max {
            s.push_str(
                "__device__ __forceinline__ float red_max(float a, float b) { return (a != a) ? a : ((b != b || b > a) ? b : a); }\n\
                 #define RED_INIT __int_as_float(0xff800000)\n#define COMBINE(a, b) red_max(a, b)\n",
            );
        } else {
            s.push_str("#define RED_INIT 0.0f\n#define COMBINE(a, b) ((a) + (b))\n");
        }
        s.push_str("KERNEL void fused_reduce(const ReduceArgs a) {\n");
        for t in 0..targets {
            let _ = writeln!(s, "    {rt}* res{} = ({rt}*)a.ptr[{}];", suffix(t), RESULT_SLOT + t);
        }
        let _ = writeln!(
            s,
            "    float* part = (float*)a.ptr[{SCRATCH_SLOT}];\n    unsigned* arrivals = (unsigned*)a.ptr[{ARRIVALS_SLOT}];"
        );
        // Phase 1: one thread per kept element sums its chunks' partials in order.
        s.push_str(
            "    if (a.phase == 1) {\n        const i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n        if (o >= a.kept) return;\n",
        );
        for t in 0..targets {
            self.emit_combine(&mut s, t, "        ", "part[{}]");
        }
        s.push_str("        return;\n    }\n");
        // `tx`: the thread's kept lane, `ty`: its reduced row; a warp-rows launch swaps them,
        // so that a warp's lanes read consecutive reduced elements of one kept element.
        s.push_str(
            "    __shared__ float tree[256];\n    const bool wr = a.warp_rows != 0;\n\
             \x20   const unsigned tx = wr ? threadIdx.y : threadIdx.x, ty = wr ? threadIdx.x : threadIdx.y;\n\
             \x20   const unsigned lanes = wr ? blockDim.y : blockDim.x, rows = wr ? blockDim.x : blockDim.y;\n",
        );
        s.push_str("    const i64 o = (i64)blockIdx.x * lanes + tx;\n    const i64 chunk = blockIdx.y;\n");
        for t in 0..targets {
            let _ = writeln!(s, "    float acc{} = RED_INIT;", suffix(t));
        }
        p.emit_pointers(&mut s, "");
        let first_pass = match self.epilogue {
            Some(e) => {
                // Phase 2 is the second pass alone (after the chunks' partials combine).
                s.push_str("    if (a.phase != 2) {\n");
                Pass::Reduce {
                    ops: usize::from(e.prologue_ops),
                    skip: e.result_input,
                }
            }
            None => Pass::ReduceAndStore,
        };
        s.push_str("    if (o < a.kept) {\n");
        // The kept element's offsets, then per reduced element the rest of each offset.
        emit_walk(&mut s, p.inputs.len(), false, self.vec);
        let targets_in_pass: Vec<Value> = self.targets().collect();
        emit_reduced_loop(&mut s, p, &targets_in_pass, first_pass, self.vec);
        // The rows of each lane fold pairwise in a fixed order: by shuffles within the warp
        // of a warp-rows launch (the branch is uniform over the block), else through shared
        // memory (one target after the other, the tree read by all before it is reused).
        for t in 0..targets {
            let x = suffix(t);
            if t > 0 {
                s.push_str("    if (!wr) __syncthreads();\n");
            }
            let _ = writeln!(
                s,
                "    float v{x};\n    if (wr) {{\n#pragma unroll\n        for (int h = 16; h > 0; h >>= 1) acc{x} = COMBINE(acc{x}, __shfl_down_sync(0xffffffffu, acc{x}, h));\n        v{x} = acc{x};\n    }} else {{"
            );
            let _ = writeln!(s, "    tree[ty * lanes + tx] = acc{x};\n    __syncthreads();");
            s.push_str("    for (unsigned h = rows / 2; h > 0; h >>= 1) {\n        if (ty < h) tree[ty * lanes + tx] = COMBINE(tree[ty * lanes + tx], tree[(ty + h) * lanes + tx]);\n        __syncthreads();\n    }\n");
            let _ = writeln!(s, "    v{x} = tree[tx];\n    }}");
        }
        s.push_str("    if (ty == 0 && o < a.kept) {\n");
        for t in 0..targets {
            let x = suffix(t);
            let _ = writeln!(
                s,
                "        if (a.chunks == 1) res{x}[o] = {};\n        else part[{}] = v{x};",
                store_expr(&format!("v{x} * a.scale[{t}]"), self.out),
                partial_index(t, "chunk")
            );
        }
        s.push_str("    }\n");
        // With arrival counters, the last chunk block of each column of blocks to finish
        // combines that column's partial sums in chunk order (the combine of phase 1, in the
        // same launch) and resets its counter for the next launch.
        s.push_str(
            "    if (a.chunks > 1 && a.phase == 0 && arrivals != 0) {\n        __shared__ bool last_arrival;\n        __threadfence();\n        __syncthreads();\n\
             \x20       if (threadIdx.x == 0 && threadIdx.y == 0) {\n            last_arrival = atomicAdd(&arrivals[blockIdx.x], 1u) == (unsigned)(a.chunks - 1);\n            if (last_arrival) arrivals[blockIdx.x] = 0u;\n        }\n        __syncthreads();\n\
             \x20       if (last_arrival && ty == 0 && o < a.kept) {\n            __threadfence();\n",
        );
        for t in 0..targets {
            self.emit_combine(&mut s, t, "            ", "__ldcg(&part[{}])");
        }
        s.push_str("        }\n    }\n");
        if self.epilogue.is_some() {
            // The result is complete once the row's writer is past the barrier (a warp's lane 0,
            // or row 0 of the block); with chunks it is complete only after phase 1.
            s.push_str("    }\n    if (a.chunks > 1 && a.phase == 0) return;\n    if (wr) __syncwarp(); else __syncthreads();\n");
            s.push_str("    if (o < a.kept) {\n");
            emit_walk(&mut s, p.inputs.len(), false, self.vec);
            emit_reduced_loop(&mut s, p, &[], Pass::Store, self.vec);
        }
        s.push_str("}\n");
        s
    }

    /// Emits the combination of target `t`'s partial sums in chunk order, each read as
    /// `read` with `{}` standing for its index, and the store of its result.
    fn emit_combine(&self, s: &mut String, t: usize, indent: &str, read: &str) {
        let x = suffix(t);
        let _ = writeln!(
            s,
            "{indent}{{\n{indent}    float acc = RED_INIT;\n{indent}    for (i64 k = 0; k < a.chunks; ++k) acc = COMBINE(acc, {});\n{indent}    res{x}[o] = {};\n{indent}}}",
            read.replace("{}", &partial_index(t, "k")),
            store_expr(&format!("acc * a.scale[{t}]"), self.out)
        );
    }
}

/// The name suffix of target `t`'s variables (`acc`, `acc1`, ..; `res`, `res1`, ..).
fn suffix(t: usize) -> String {
    if t == 0 {
        String::new()
    } else {
        t.to_string()
    }
}

/// The index in the partial sums of target `t`'s sum of chunk `chunk` for kept element `o`
/// (each target's `chunks * kept` partials follow the previous target's).
fn partial_index(t: usize, chunk: &str) -> String {
    if t == 0 {
        format!("{chunk} * a.kept + o")
    } else {
        format!("({t} * a.chunks + {chunk}) * a.kept + o")
    }
}

/// What one walk over a kept element's reduced elements does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Computes every operation, stores the outputs and accumulates the target (a program
    /// without epilogue).
    ReduceAndStore,
    /// Computes the first `ops` operations and accumulates the target, storing nothing;
    /// input `skip` (the result, not yet written) is not read.
    Reduce { ops: usize, skip: Option<u8> },
    /// Computes every operation and stores the outputs (an epilogue's second pass).
    Store,
}

/// Reduced elements (or groups of `FV`) each thread loads before it computes on them (loads
/// in flight): four single elements, two groups.
fn unroll(vec: u8) -> usize {
    if vec > 1 {
        2
    } else {
        4
    }
}

/// Emits the offsets of one element of `inputs` inputs: for its kept coordinates (`reduced`
/// false: `bK` and `bo`, from the kept index `o`), or added to those for its reduced
/// coordinates (`uK` and `uo`, from the reduced index `r`, keeping the coordinates in
/// `cnt`); the innermost dim comes last. With `vec` above 1 the innermost coordinate counts
/// groups of `FV` elements.
fn emit_walk(s: &mut String, inputs: usize, reduced: bool, vec: u8) {
    let (indent, index, start, off, full_off, skip) = if reduced {
        ("        ", "jj", "(FIDX)r", "u", "uo", "!RED(d)")
    } else {
        ("        ", "j", "(FIDX)o", "b", "bo", "RED(d)")
    };
    let init = |k: Option<usize>| match (reduced, k) {
        (true, Some(k)) => format!("u{k} = b{k}"),
        (true, None) => "uo = bo".to_string(),
        (false, Some(k)) => format!("b{k} = 0"),
        (false, None) => "bo = 0".to_string(),
    };
    let decls: Vec<String> = (0..inputs)
        .map(|k| init(Some(k)))
        .chain(std::iter::once(init(None)))
        .collect();
    let _ = writeln!(s, "{indent}i64 {};\n{indent}FIDX {index} = {start};", decls.join(", "));
    if reduced {
        let _ = writeln!(s, "{indent}FIDX cnt[FR];");
    }
    let _ = writeln!(s, "#pragma unroll\n{indent}for (int d = FR - 1; d >= 0; --d) {{");
    if reduced {
        let _ = writeln!(s, "{indent}    cnt[d] = 0;");
    }
    let _ = writeln!(s, "{indent}    if ({skip}) continue;");
    let _ = writeln!(
        s,
        "{indent}    const FIDX n = (FIDX)a.full.shape[d];\n{indent}    const FIDX c = {index} % n;\n{indent}    {index} /= n;"
    );
    if reduced {
        let _ = writeln!(s, "{indent}    cnt[d] = c;");
    }
    let c = if vec > 1 {
        let _ = writeln!(s, "{indent}    const i64 cc = d == FR - 1 ? (i64)c * FV : (i64)c;");
        "cc"
    } else {
        "(i64)c"
    };
    for k in 0..inputs {
        let _ = writeln!(s, "{indent}    {off}{k} += {c} * a.in_layout[{k}].strides[d];");
    }
    let _ = writeln!(s, "{indent}    {full_off} += {c} * a.full.strides[d];\n{indent}}}");
}

/// Emits the loop over the reduced elements of one chunk, for the thread's row `ty`: the
/// first element's coordinates are divided out once, then each step of `blockDim.y` elements
/// advances them like an odometer (carries by subtraction, a division only for a carry of
/// four or more turns of a dim), and the thread loads [`unroll`] elements before it computes
/// on them, so that several loads are in flight. With `vec` above 1 the elements are groups
/// of `FV` consecutive innermost ones, each moved with one vector access where the operand's
/// innermost stride is 1 (a broadcast operand loads once, another stride gathers).
fn emit_reduced_loop(s: &mut String, p: &Program, targets: &[Value], pass: Pass, vec: u8) {
    let inputs = p.inputs.len();
    let unroll = unroll(vec);
    s.push_str("        const i64 rend = min((chunk + 1) * a.chunk, a.red);\n        i64 r = chunk * a.chunk + ty;\n");
    s.push_str("        const FIDX step = (FIDX)rows;\n");
    emit_walk(s, inputs, true, vec);
    let _ = writeln!(
        s,
        "        while (r < rend) {{\n            bool ok[{unroll}];\n            i64 eo[{unroll}];"
    );
    // Small outputs are stored by the visit of each kept element's first reduced element.
    let small = p.small_outputs != 0 && !matches!(pass, Pass::Reduce { .. });
    if small {
        let _ = writeln!(s, "            bool z[{unroll}];");
    }
    for k in 0..inputs {
        let _ = writeln!(s, "            i64 e{k}[{unroll}];");
    }
    let _ = writeln!(s, "#pragma unroll\n            for (int v = 0; v < {unroll}; ++v) {{");
    s.push_str("                ok[v] = r < rend;\n                eo[v] = uo;\n");
    if small {
        s.push_str("                z[v] = r == 0;\n");
    }
    for k in 0..inputs {
        let _ = writeln!(s, "                e{k}[v] = u{k};");
    }
    s.push_str(
        "                r += step;\n                FIDX carry = step;\n#pragma unroll\n                for (int d = FR - 1; d >= 0; --d) {\n\
         \x20                   if (!RED(d) || carry == 0) continue;\n\
         \x20                   const FIDX n = (FIDX)a.full.shape[d];\n\
         \x20                   if (n == 1) continue;\n\
         \x20                   FIDX c = cnt[d] + carry;\n\
         \x20                   carry = 0;\n\
         \x20                   if (c / 4 >= n) { carry = c / n; c -= carry * n; }\n\
         \x20                   while (c >= n) { c -= n; ++carry; }\n\
         \x20                   const i64 dc = (i64)c - (i64)cnt[d];\n\
         \x20                   cnt[d] = c;\n",
    );
    let dc = if vec > 1 {
        s.push_str("                    const i64 dm = d == FR - 1 ? dc * FV : dc;\n");
        "dm"
    } else {
        "dc"
    };
    for k in 0..inputs {
        let _ = writeln!(s, "                    u{k} += {dc} * a.in_layout[{k}].strides[d];");
    }
    let _ = writeln!(
        s,
        "                    uo += {dc} * a.full.strides[d];\n                }}\n            }}"
    );
    let skip = match pass {
        Pass::Reduce { skip, .. } => skip.map(usize::from),
        _ => None,
    };
    if vec > 1 {
        emit_grouped_body(s, p, targets, pass, skip, unroll);
    } else {
        emit_single_body(s, p, targets, pass, skip, unroll);
    }
    s.push_str("        }\n    }\n");
}

/// The loads and computation of [`emit_reduced_loop`] on `unroll` single elements: input
/// `skip` (the result, not yet written) reads as zeros.
fn emit_single_body(s: &mut String, p: &Program, targets: &[Value], pass: Pass, skip: Option<usize>, unroll: usize) {
    for (k, d) in p.inputs.iter().enumerate() {
        let t = storage_type(*d);
        if Some(k) == skip {
            let _ = writeln!(s, "            {t} l{k}[{unroll}] = {{}};");
            continue;
        }
        let _ = writeln!(
            s,
            "            {t} l{k}[{unroll}];\n#pragma unroll\n            for (int v = 0; v < {unroll}; ++v) l{k}[v] = ok[v] ? p{k}[e{k}[v]] : ({t})0;"
        );
    }
    let _ = writeln!(
        s,
        "#pragma unroll\n            for (int v = 0; v < {unroll}; ++v) {{\n                if (!ok[v]) continue;"
    );
    emit_element(
        s,
        p,
        targets,
        pass,
        "                ",
        |k| format!("l{k}[v]"),
        |j, value| format!("if (z[v]) q{j}[o] = {value};"),
        |j, value| format!("q{j}[eo[v]] = {value};"),
    );
    s.push_str("            }\n");
}

/// Emits, each line prefixed by `indent`, the input values read from `raw(k)`, the pass's
/// operations, the stores of the outputs (none in a reducing pass: `small(j, value)` for a
/// kept-shaped one, `packed(j, value)` for the others) and the accumulation of each target
/// (none in a storing pass).
#[allow(clippy::too_many_arguments)]
fn emit_element(
    s: &mut String,
    p: &Program,
    targets: &[Value],
    pass: Pass,
    indent: &str,
    raw: impl Fn(usize) -> String,
    small: impl Fn(usize, &str) -> String,
    packed: impl Fn(usize, &str) -> String,
) {
    p.emit_input_values(s, indent, raw);
    match pass {
        Pass::Reduce { ops, .. } => p.emit_operations_upto(s, indent, ops),
        _ => p.emit_operations(s, indent),
    }
    if !matches!(pass, Pass::Reduce { .. }) {
        for (j, &(r, d)) in p.outputs.iter().enumerate() {
            let value = store_expr(&format!("r{r}"), d);
            let line = if p.is_small(j) {
                small(j, &value)
            } else {
                packed(j, &value)
            };
            let _ = writeln!(s, "{indent}{line}");
        }
    }
    if pass != Pass::Store {
        for (t, target) in targets.iter().enumerate() {
            let x = suffix(t);
            let _ = writeln!(s, "{indent}acc{x} = COMBINE(acc{x}, {});", target.expr());
        }
    }
}

/// The loads and computation of [`emit_reduced_loop`] on `unroll` groups of `FV` elements:
/// one vector access per operand whose innermost stride is 1, stored outputs (packed) written
/// the same way; input `skip` reads as zeros.
fn emit_grouped_body(s: &mut String, p: &Program, targets: &[Value], pass: Pass, skip: Option<usize>, unroll: usize) {
    let stores = !matches!(pass, Pass::Reduce { .. });
    for (k, d) in p.inputs.iter().enumerate() {
        let t = storage_type(*d);
        if Some(k) == skip {
            let _ = writeln!(s, "            {t} l{k}[{unroll}][FV] = {{}};");
            continue;
        }
        let _ = writeln!(
            s,
            "            {t} l{k}[{unroll}][FV];\n#pragma unroll\n            for (int v = 0; v < {unroll}; ++v) {{\n\
             \x20               if (ok[v]) fused_load<{t}, FV>(p{k}, e{k}[v], a.in_layout[{k}].strides[FR - 1], l{k}[v]);\n\
             \x20               else for (int lane = 0; lane < FV; ++lane) l{k}[v][lane] = ({t})0;\n            }}"
        );
    }
    let _ = writeln!(
        s,
        "#pragma unroll\n            for (int v = 0; v < {unroll}; ++v) {{\n                if (!ok[v]) continue;"
    );
    let packed: Vec<(usize, DataType)> = p
        .outputs
        .iter()
        .enumerate()
        .filter(|&(j, _)| stores && !p.is_small(j))
        .map(|(j, &(_, d))| (j, d))
        .collect();
    for &(j, d) in &packed {
        let _ = writeln!(s, "                {} w{j}[FV];", storage_type(d));
    }
    s.push_str("#pragma unroll\n                for (int lane = 0; lane < FV; ++lane) {\n");
    emit_element(
        s,
        p,
        targets,
        pass,
        "                    ",
        |k| format!("l{k}[v][lane]"),
        |j, value| format!("if (z[v] && lane == 0) q{j}[o] = {value};"),
        |j, value| format!("w{j}[lane] = {value};"),
    );
    s.push_str("                }\n");
    for &(j, d) in &packed {
        let _ = writeln!(
            s,
            "                fused_store<{}, FV>(q{j}, eo[v], (i64)1, w{j});",
            storage_type(d)
        );
    }
    s.push_str("            }\n");
}

/// The kernel source of `rp` (generated once, then looked up).
fn source_for(rp: &ReduceProgram) -> Result<KernelSource> {
    let mut map = super::state()
        .reduce_sources
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = map.get(rp) {
        return Ok(*s);
    }
    rp.validate()?;
    let s = generated_source("fused-reduce", rp.source());
    map.insert(rp.clone(), s);
    Ok(s)
}

/// The kernel of `rp` on the device of `stream` when built; otherwise `Ok(None)` after
/// queueing its build in the background (as [`crate::kernels::fused::ready_or_queue`]).
pub fn ready_or_queue(stream: &Arc<CudaStream>, rp: &ReduceProgram) -> Result<Option<CudaFunction>> {
    ready_or_queue_source(stream, source_for(rp)?, ENTRY, "building a fused reduction kernel")
}

/// Whether an iteration shape of `dims` needs 64-bit coordinates ([`ReduceProgram::wide`]).
pub fn needs_wide(dims: &[i64]) -> bool {
    dims.iter().product::<i64>() >= 1 << 31
}

/// The same reduction over fewer dims: dims of size 1 dropped, and neighbouring dims merged
/// when both are reduced (or both kept) and every operand walks them as one (the outer
/// stride is the inner stride times the inner size). An `NCHW` tensor summed over `N`, `H`
/// and `W` becomes `[N, C, H*W]`: fewer coordinates per element and a longer innermost run.
/// Returns the program for the merged rank and reduced dims, the merged shape and each
/// input's view of it (the unchanged reduction when nothing merges).
pub fn coalesce<'a>(
    rp: &ReduceProgram,
    full: &[i64],
    inputs: &[TensorRef<'a>],
) -> Result<(ReduceProgram, Vec<i64>, Vec<TensorRef<'a>>)> {
    let plan = Coalesced::of(rp, full, inputs)?;
    let views = plan.views(inputs)?;
    Ok((plan.program, plan.dims, views))
}

/// What [`coalesce`] makes of a reduction, without the input views: the same for every call
/// whose inputs have the same dims and strides (a fused run keeps it and makes only the
/// views again).
#[derive(Clone, Debug)]
pub struct Coalesced {
    /// The program for the merged rank and reduced dims.
    pub program: ReduceProgram,
    /// The merged shape.
    pub dims: Vec<i64>,
    /// Each input's strides over the merged shape (`None`: nothing merged, inputs as given).
    strides: Option<Vec<Vec<i64>>>,
}

impl Coalesced {
    /// The merged reduction of `rp` over `full` for `inputs` (see [`coalesce`]).
    pub fn of(rp: &ReduceProgram, full: &[i64], inputs: &[TensorRef]) -> Result<Self> {
        let packed = row_major_strides(full);
        let input_strides = rp.program.input_strides(OP, inputs, full)?;
        let mut strides = input_strides.clone();
        strides.push(packed.to_vec());
        // A stride list that chains across kept dims and across reduced dims but never from
        // one to the other (0 on reduced dims): merging then keeps the two apart.
        strides.push(
            (0..full.len())
                .map(|d| if rp.reduced >> d & 1 == 1 { 0 } else { packed[d] })
                .collect(),
        );
        let (dims, mut merged) = coalesce_dims(full, &strides);
        let reduced: Vec<bool> = merged
            .last()
            .map_or(Vec::new(), |class| class.iter().map(|&s| s == 0).collect());
        let mut plan = if !reduced.contains(&true) || dims.len() == full.len() {
            // Nothing merges: the reduction as given.
            Self {
                program: rp.clone(),
                dims: full.to_vec(),
                strides: None,
            }
        } else {
            let mask = reduced
                .iter()
                .enumerate()
                .fold(0u8, |m, (d, &r)| m | (u8::from(r) << d));
            merged.truncate(inputs.len());
            Self {
                program: ReduceProgram {
                    rank: dims.len() as u8,
                    reduced: mask,
                    ..rp.clone()
                },
                dims,
                strides: Some(merged),
            }
        };
        let strides = plan.strides.as_ref().unwrap_or(&input_strides);
        plan.program.vec = choose_vec(&plan.program, &plan.dims, inputs, strides);
        Ok(plan)
    }

    /// Each input's view of the merged shape (`inputs` of the dims and strides this was made
    /// for).
    pub fn views<'a>(&self, inputs: &[TensorRef<'a>]) -> Result<Vec<TensorRef<'a>>> {
        match &self.strides {
            None => Ok(inputs.to_vec()),
            Some(strides) => inputs
                .iter()
                .zip(strides)
                .map(|(t, s)| t.reshaped(&self.dims, s))
                .collect(),
        }
    }
}

/// Blocks worth of work to aim for: about eight per SM of a large GPU (a reduction is bound
/// by the loads in flight).
const TARGET_BLOCKS: i64 = 1024;

/// The tensors of one launch: `inputs` broadcast to the iteration shape, `outputs` (the
/// program's stored registers) packed with the iteration shape's dims, `results` (one per
/// target) packed with one element per kept element, `scratch` at least
/// [`ReduceLaunch::scratch_len`] f32s when
/// that is not 0, and `arrivals`, when given, at least [`ReduceLaunch::arrivals_len`] zeroed
/// packed u32 (i32) counters that the launch leaves zeroed (then the partial sums combine in
/// the same launch instead of a second one).
#[derive(Clone, Copy)]
pub struct ReduceOperands<'a, 'b> {
    /// The program's inputs.
    pub inputs: &'b [TensorRef<'a>],
    /// The program's stored registers.
    pub outputs: &'b [TensorMut<'a>],
    /// The reductions' results, one per target of the program.
    pub results: &'b [TensorMut<'a>],
    /// Room for the partial sums.
    pub scratch: Option<&'b TensorMut<'a>>,
    /// Zeroed arrival counters, one per column of blocks (see the type).
    pub arrivals: Option<&'b TensorMut<'a>>,
}

/// Reduced elements per kept element up to which a reduction along the innermost dim gives
/// each kept element one warp (a softmax or layer-norm row): beyond it, a whole block and
/// chunks across the grid.
const WARP_ROWS_MAX_REDUCED: i64 = 4096;

/// Kept elements from which warp rows fill the GPU (eight per block: 128 blocks or more).
const WARP_ROWS_MIN_KEPT: i64 = 1024;

/// How a reduction over one iteration shape is spread over the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    /// Kept and reduced element counts.
    kept: i64,
    red: i64,
    /// Chunks of the reduced elements across the grid's second dim.
    chunks: i64,
    /// Threads per block, `(x, y)`.
    block: (u32, u32),
    /// One warp per kept element (`x`: 32 lanes over reduced elements, `y`: kept elements).
    warp_rows: bool,
}

impl Split {
    /// The split of `rp` over `full` (reduced elements counted in groups of `rp.vec`).
    fn of(rp: &ReduceProgram, full: &[i64]) -> Self {
        let (mut kept, mut red) = (1i64, 1i64);
        for (d, n) in grouped_dims(rp, full) {
            if rp.reduced >> d & 1 == 1 {
                red *= n;
            } else {
                kept *= n;
            }
        }
        // The innermost dim of more than one element decides which way warps read.
        let inner_reduced = grouped_dims(rp, full)
            .rev()
            .find(|&(_, n)| n > 1)
            .is_some_and(|(d, _)| rp.reduced >> d & 1 == 1);
        if inner_reduced && red <= WARP_ROWS_MAX_REDUCED && kept >= WARP_ROWS_MIN_KEPT {
            return Self {
                kept,
                red,
                chunks: 1,
                block: (32, REDUCE_THREADS / 32),
                warp_rows: true,
            };
        }
        let block = if inner_reduced || kept == 1 {
            (1, REDUCE_THREADS)
        } else {
            (32, REDUCE_THREADS / 32)
        };
        let lanes = i64::from(block.0);
        let rows = i64::from(block.1);
        let kept_blocks = ((kept + lanes - 1) / lanes).max(1);
        // Enough chunks to fill the GPU, each still at least 16 rows' worth of elements (8
        // of groups).
        let per_row = if rp.vec > 1 { 8 } else { 16 };
        let most = (red / (rows * per_row)).clamp(1, 1024);
        let chunks = (TARGET_BLOCKS / kept_blocks).clamp(1, most);
        Self {
            kept,
            red,
            chunks,
            block,
            warp_rows: false,
        }
    }

    /// Kept elements per block.
    fn kept_per_block(&self) -> i64 {
        i64::from(if self.warp_rows { self.block.1 } else { self.block.0 })
    }

    /// Columns of blocks: the grid's first dim, each block covering [`Split::kept_per_block`]
    /// kept elements.
    fn columns(&self) -> i64 {
        (self.kept + self.kept_per_block() - 1) / self.kept_per_block()
    }
}

/// Whether a reduction over `full` (bit `d` of `reduced`: dim `d` is reduced) may move `vec`
/// consecutive innermost elements at a time: that dim is reduced and a multiple of `vec`,
/// and every input whose innermost stride (in `strides`, broadcast to `full`) is 1 has its
/// other strides multiples of `vec` and its address aligned to `vec` elements. Stored
/// outputs are packed, so only their addresses matter (checked at launch).
fn vector_fits(reduced: u8, full: &[i64], inputs: &[TensorRef], strides: &[Vec<i64>], vec: i64) -> bool {
    let Some(&inner) = full.last() else {
        return false;
    };
    let inner_reduced = reduced >> (full.len() - 1) & 1 == 1;
    inner_reduced
        && inner % vec == 0
        && inputs
            .iter()
            .zip(strides)
            .all(|(t, st)| vector_access_fits(st, t.ptr, t.dtype.size(), vec))
}

/// The widest group of innermost elements (8, 4, 2 or 1) a reduction of `rp` over the merged
/// `full` can move per step, for `inputs` of `strides` over `full`: at most 16 bytes of each
/// operand per access, and narrower for programs of many operands (registers per element).
fn choose_vec(rp: &ReduceProgram, full: &[i64], inputs: &[TensorRef], strides: &[Vec<i64>]) -> u8 {
    let p = &rp.program;
    let widest = p
        .inputs
        .iter()
        .chain(p.outputs.iter().map(|(_, d)| d))
        .map(|d| d.size() as i64)
        .max()
        .unwrap_or(4);
    // The widths of f32 elements whatever the dtype: a reduction holds two steps of every
    // input in flight (its unroll), so wider 16-bit steps would cost registers it lacks.
    let most = max_vec(p.inputs.len() + p.outputs.len(), 4);
    [8i64, 4, 2]
        .into_iter()
        .filter(|&v| v <= most && v * widest <= 16)
        .find(|&v| vector_fits(rp.reduced, full, inputs, strides, v))
        .unwrap_or(1) as u8
}

/// The dims of `full` (index, size) with the innermost counted in groups of `rp.vec`
/// elements: the kernel's iteration shape.
fn grouped_dims<'a>(rp: &ReduceProgram, full: &'a [i64]) -> impl DoubleEndedIterator<Item = (usize, i64)> + Clone + 'a {
    let (last, vec) = (full.len().saturating_sub(1), i64::from(rp.vec.max(1)));
    full.iter()
        .enumerate()
        .map(move |(d, &n)| (d, if d == last { n / vec } else { n }))
}

/// A checked, packed launch of a [`ReduceProgram`] over one iteration shape.
pub struct ReduceLaunch<'a> {
    args: ReduceArgs,
    grid: (u32, u32),
    block: (u32, u32),
    /// The program has an epilogue (a third launch after chunked sums).
    epilogue: bool,
    /// The input the epilogue reads the result through, if any.
    result_input: Option<u8>,
    /// What the launch event tells of the program and operands.
    summary: LaunchSummary,
    /// Held so the views outlive the launch.
    _views: Vec<TensorRef<'a>>,
}

/// The program's operation count and vector width, and the launch's input, stored-output and
/// result counts: what a [`ReduceLaunch`]'s launch event prints besides its arguments.
#[derive(Clone, Copy, Debug)]
struct LaunchSummary {
    ops: usize,
    vec: u8,
    operands: [usize; 3],
}

impl<'a> ReduceLaunch<'a> {
    /// How many f32 partial sums a launch over `full` needs (0: none, the sums go straight
    /// to the result).
    pub fn scratch_len(rp: &ReduceProgram, full: &[i64]) -> usize {
        let s = Split::of(rp, full);
        if s.chunks > 1 {
            (s.kept * s.chunks) as usize * rp.targets().count()
        } else {
            0
        }
    }

    /// How many arrival counters a launch over `full` can use (0: it has one chunk, and
    /// needs none).
    pub fn arrivals_len(rp: &ReduceProgram, full: &[i64]) -> usize {
        let s = Split::of(rp, full);
        if s.chunks > 1 {
            s.columns() as usize
        } else {
            0
        }
    }

    /// Checks and packs a launch of `rp` over iteration shape `full` (see
    /// [`ReduceOperands`]); `scales[t]` multiplies each sum of target `t`.
    pub fn new(
        rp: &ReduceProgram,
        full: &[i64],
        operands: &ReduceOperands<'a, '_>,
        scalars: &[f32],
        scales: &[f32],
    ) -> Result<Self> {
        let ReduceOperands {
            inputs,
            outputs,
            results,
            scratch,
            arrivals,
        } = *operands;
        rp.validate()?;
        let p = &rp.program;
        if full.len() != usize::from(rp.rank) || rp.wide != needs_wide(full) {
            return Err(Error::invalid_arg(
                OP,
                "shape",
                format!("{full:?} for a program of rank {} (wide: {})", rp.rank, rp.wide),
            ));
        }
        p.check_operand_counts(OP, inputs.len(), outputs.len(), scalars.len())?;
        let packed = row_major_strides(full);
        let mut args = ReduceArgs {
            ptr: [crate::types::DeviceAddress::NULL; ARRIVALS_SLOT + 1],
            in_layout: [KernelLayout::default(); MAX_INPUTS],
            full: kernel_layout(OP, full, &packed)?,
            s: [0.0; MAX_SCALARS],
            kept: 0,
            red: 0,
            chunk: 0,
            chunks: 0,
            scale: [1.0; MAX_TARGETS],
            phase: 0,
            warp_rows: 0,
        };
        let input_strides = p.input_strides(OP, inputs, full)?;
        if rp.vec > 1 {
            let outputs_aligned = outputs
                .iter()
                .enumerate()
                .all(|(j, o)| p.is_small(j) || o.ptr % (u64::from(rp.vec) * o.dtype.size() as u64) == 0);
            if !outputs_aligned || !vector_fits(rp.reduced, full, inputs, &input_strides, i64::from(rp.vec)) {
                return Err(Error::invalid_arg(
                    OP,
                    "inputs",
                    format!(
                        "a launch over {full:?} cannot move {} innermost elements at a time",
                        rp.vec
                    ),
                ));
            }
        }
        for (k, (t, strides)) in inputs.iter().zip(&input_strides).enumerate() {
            args.ptr[k] = t.address();
            args.in_layout[k] = kernel_layout(OP, full, strides)?;
        }
        // The kernel counts the innermost coordinate in groups of `vec` elements.
        args.full.shape[full.len() - 1] /= i64::from(rp.vec);
        let split = Split::of(rp, full);
        let Split { kept, red, chunks, .. } = split;
        for (j, (o, &(_, d))) in outputs.iter().zip(&p.outputs).enumerate() {
            check_tensor(OP, "out", o)?;
            // A small output holds one element per kept element, packed like the result.
            let fits = if p.is_small(j) {
                o.dims.iter().product::<i64>() == kept && o.strides[..] == row_major_strides(&o.dims)[..]
            } else {
                o.dims[..] == full[..] && o.strides[..] == packed[..]
            };
            if !fits || o.dtype != d {
                let want = if p.is_small(j) {
                    format!("{kept} packed")
                } else {
                    format!("packed {full:?}")
                };
                return Err(Error::invalid_arg(
                    OP,
                    "out",
                    format!(
                        "output {j} is {:?} {:?} {:?}; want {want} {d:?}",
                        o.dims, o.strides, o.dtype
                    ),
                ));
            }
            args.ptr[MAX_INPUTS + j] = o.address();
        }
        let targets = rp.targets().count();
        if results.len() != targets || scales.len() != targets {
            return Err(Error::invalid_arg(
                OP,
                "results",
                format!(
                    "{} results and {} scales for {targets} targets",
                    results.len(),
                    scales.len()
                ),
            ));
        }
        for (t, result) in results.iter().enumerate() {
            check_tensor(OP, "result", result)?;
            let result_packed = row_major_strides(&result.dims);
            if result.dims.iter().product::<i64>() != kept
                || result.strides[..] != result_packed[..]
                || result.dtype != rp.out
                || may_overlap(&result.dims, &result.strides)
            {
                return Err(Error::invalid_arg(
                    OP,
                    "result",
                    format!(
                        "{:?} {:?} {:?}; want {kept} packed {:?} elements",
                        result.dims, result.strides, result.dtype, rp.out
                    ),
                ));
            }
            args.ptr[RESULT_SLOT + t] = result.address();
            args.scale[t] = scales[t];
        }
        // An epilogue reads the result through its input: the same elements.
        if let Some(k) = rp.epilogue.and_then(|e| e.result_input) {
            let (r, result) = (&inputs[usize::from(k)], &results[0]);
            if r.ptr != result.ptr || r.dtype != result.dtype {
                return Err(Error::invalid_arg(
                    OP,
                    "inputs",
                    format!("input {k} must be the result (the epilogue reads it)"),
                ));
            }
        }
        if chunks > 1 {
            let need = kept * chunks * targets as i64;
            let sc = scratch.ok_or_else(|| buffer_error("scratch", need, DataType::F32))?;
            args.ptr[SCRATCH_SLOT] = packed_buffer("scratch", sc, need, DataType::F32)?;
            if let Some(counters) = arrivals {
                args.ptr[ARRIVALS_SLOT] = packed_buffer("arrivals", counters, split.columns(), DataType::I32)?;
            }
        }
        args.s[..scalars.len()].copy_from_slice(scalars);
        args.kept = kept;
        args.red = red;
        args.chunks = chunks;
        args.chunk = (red + chunks - 1) / chunks;
        args.warp_rows = i32::from(split.warp_rows);
        let grid_x = u32::try_from(split.columns())
            .map_err(|_| Error::invalid_arg(OP, "shape", format!("{kept} kept elements")))?;
        let views = operand_views(operands);
        Ok(Self {
            args,
            grid: (grid_x, chunks as u32),
            block: split.block,
            epilogue: rp.epilogue.is_some(),
            result_input: rp.epilogue.and_then(|e| e.result_input),
            summary: LaunchSummary {
                ops: p.ops.len(),
                vec: rp.vec,
                operands: [inputs.len(), outputs.len(), results.len()],
            },
            _views: views,
        })
    }

    /// Launches with `f`, the kernel of the program the launch was made for.
    pub fn launch(&self, stream: &Arc<CudaStream>, f: &CudaFunction) -> Result<()> {
        for v in &self._views {
            v.check_stream(stream, OP, "operands")?;
        }
        if tracing::enabled!(target: super::LAUNCH_LOG_TARGET, tracing::Level::DEBUG) {
            self.log_launch();
        }
        launch::fused_reduce(stream, f, &self.args, self.grid, self.block, self.epilogue)
    }

    /// The launch event of [`super::LAUNCH_LOG_TARGET`]: the kernels `launch` makes (phase
    /// 0, then phase 1 without arrival counters and phase 2 with an epilogue when the sums are
    /// chunked), the program's size and vector width, the iteration shape (innermost dim in
    /// groups of the vector width) and the split.
    fn log_launch(&self) {
        let a = &self.args;
        let rank = usize::try_from(a.full.rank).unwrap_or(0);
        let (combine, second_pass) = launch::reduce_phases(a, self.epilogue);
        let kernels = if a.kept == 0 {
            0
        } else {
            1 + u32::from(combine) + u32::from(second_pass)
        };
        let LaunchSummary { ops, vec, operands } = self.summary;
        let [inputs, outputs, results] = operands;
        let strides: Vec<&[i64]> = (0..inputs)
            .map(|k| super::dims(&a.in_layout[k].strides, rank))
            .collect();
        tracing::debug!(
            target: super::LAUNCH_LOG_TARGET,
            kernel = ENTRY,
            kernels,
            ops,
            inputs,
            outputs,
            results,
            shape = ?super::dims(&a.full.shape, rank),
            input_strides = ?strides,
            kept = a.kept,
            reduced = a.red,
            chunks = a.chunks,
            warp_rows = a.warp_rows != 0,
            vec,
            grid = ?self.grid,
            block = ?self.block,
            epilogue = self.epilogue,
        );
    }

    /// The pointer-free part of this launch, made over `operands` (see [`PackedReduce`]).
    pub fn packed(&self, operands: &ReduceOperands) -> PackedReduce {
        let mut signature = Vec::new();
        operand_signature(&mut signature, operands);
        let mut args = self.args;
        args.ptr = [crate::types::DeviceAddress::NULL; ARRIVALS_SLOT + 1];
        PackedReduce {
            args,
            grid: self.grid,
            block: self.block,
            epilogue: self.epilogue,
            result_input: self.result_input,
            summary: self.summary,
            signature,
        }
    }

    /// The launch [`ReduceLaunch::new`] would make of the program and iteration shape that
    /// `packed` was made with, over `operands` of the same operand signature (`None`
    /// otherwise: the caller makes it with `new`); `signature` is a reusable buffer.
    pub fn from_packed(
        packed: &PackedReduce,
        operands: &ReduceOperands<'a, '_>,
        scalars: &[f32],
        scales: &[f32],
        signature: &mut Vec<i64>,
    ) -> Option<Self> {
        signature.clear();
        operand_signature(signature, operands);
        let ReduceOperands {
            inputs,
            outputs,
            results,
            scratch,
            arrivals,
        } = *operands;
        if *signature != packed.signature || scalars.len() > MAX_SCALARS || scales.len() != results.len() {
            return None;
        }
        // The one check that is not about shapes: the epilogue reads the result itself.
        if let Some(k) = packed.result_input {
            if inputs.get(usize::from(k)).is_none_or(|r| r.ptr != results[0].ptr) {
                return None;
            }
        }
        let mut args = packed.args;
        for (k, t) in inputs.iter().enumerate() {
            args.ptr[k] = t.address();
        }
        for (j, o) in outputs.iter().enumerate() {
            args.ptr[MAX_INPUTS + j] = o.address();
        }
        for (t, (r, &scale)) in results.iter().zip(scales).enumerate() {
            args.ptr[RESULT_SLOT + t] = r.address();
            args.scale[t] = scale;
        }
        if args.chunks > 1 {
            args.ptr[SCRATCH_SLOT] = scratch.map_or(crate::types::DeviceAddress::NULL, |t| t.address());
            args.ptr[ARRIVALS_SLOT] = arrivals.map_or(crate::types::DeviceAddress::NULL, |t| t.address());
        }
        args.s = [0.0; MAX_SCALARS];
        args.s[..scalars.len()].copy_from_slice(scalars);
        let views = operand_views(operands);
        Some(Self {
            args,
            grid: packed.grid,
            block: packed.block,
            epilogue: packed.epilogue,
            result_input: packed.result_input,
            summary: LaunchSummary {
                operands: [inputs.len(), outputs.len(), results.len()],
                ..packed.summary
            },
            _views: views,
        })
    }
}

/// The pointer-free part of a checked [`ReduceLaunch`] and the operand signature (each
/// operand's dims, strides, dtype and address alignment) it was checked for: a later launch
/// of the same program over the same iteration shape, with operands of that signature,
/// passes every check of [`ReduceLaunch::new`] but one (the epilogue's input must be the
/// result), so [`ReduceLaunch::from_packed`] makes it by setting the addresses, the scalars
/// and the scales.
#[derive(Clone, Debug)]
pub struct PackedReduce {
    args: ReduceArgs,
    grid: (u32, u32),
    block: (u32, u32),
    epilogue: bool,
    result_input: Option<u8>,
    summary: LaunchSummary,
    signature: Vec<i64>,
}

/// Appends to `out` what [`ReduceLaunch::new`]'s checks read of `operands`, besides the
/// program and the iteration shape: the operand counts, and each operand's dims, strides,
/// dtype, whether its address is null and the address's alignment (up to 256 bytes, more
/// than any vector access needs).
fn operand_signature(out: &mut Vec<i64>, operands: &ReduceOperands) {
    out.push(operands.inputs.len() as i64);
    out.push(operands.outputs.len() as i64);
    out.push(operands.results.len() as i64);
    for t in operands.inputs {
        push_operand_key(out, t);
    }
    for o in operands.outputs.iter().chain(operands.results) {
        push_operand_key(out, o);
    }
    for t in [operands.scratch, operands.arrivals] {
        match t {
            Some(t) => push_operand_key(out, t),
            None => out.push(-1),
        }
    }
}

/// Every operand of a launch, for the launch to hold.
fn operand_views<'a>(operands: &ReduceOperands<'a, '_>) -> Vec<TensorRef<'a>> {
    let o = operands;
    let extra = o.scratch.iter().chain(&o.arrivals);
    let mut views = Vec::with_capacity(o.inputs.len() + o.outputs.len() + o.results.len() + 2);
    views.extend(o.inputs.iter().cloned());
    views.extend(o.outputs.iter().chain(o.results).map(|t| TensorRef::clone(t)));
    views.extend(extra.map(|t| TensorRef::clone(t)));
    views
}

/// The error for a buffer operand `name` that is not `need` packed `dtype` elements.
fn buffer_error(name: &'static str, need: i64, dtype: DataType) -> Error {
    Error::invalid_arg(OP, name, format!("{need} packed {dtype:?} elements are needed"))
}

/// The address of `t`, a buffer operand `name` of at least `need` packed `dtype` elements.
fn packed_buffer(name: &'static str, t: &TensorMut, need: i64, dtype: DataType) -> Result<crate::types::DeviceAddress> {
    if t.dtype != dtype || t.dims.iter().product::<i64>() < need || t.strides[..] != row_major_strides(&t.dims)[..] {
        return Err(buffer_error(name, need, dtype));
    }
    check_tensor(OP, name, t)?;
    Ok(t.address())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::elementwise::BinaryOp;
    use crate::kernels::fused::FusedOp;

    /// sum over dims 0, 2, 3 of (a - b) * (a - b), with a - b also stored.
    fn squared_deviation() -> ReduceProgram {
        ReduceProgram {
            program: Program {
                inputs: vec![DataType::F32, DataType::F32],
                scalars: 0,
                ops: vec![
                    FusedOp::Binary(BinaryOp::Sub, Value::Input(0), Value::Input(1)),
                    FusedOp::Binary(BinaryOp::Mul, Value::Reg(0), Value::Reg(0)),
                ],
                outputs: vec![(0, DataType::F32)],
                small_outputs: 0,
            },
            target: Value::Reg(1),
            siblings: vec![],
            rank: 4,
            reduced: 0b1101,
            max: false,
            out: DataType::BF16,
            wide: false,
            vec: 1,
            epilogue: None,
        }
    }

    #[test]
    fn a_valid_reduction_generates_one_kernel_with_both_phases() {
        let rp = squared_deviation();
        rp.validate().unwrap();
        let src = rp.source();
        assert_eq!(src.matches("KERNEL void").count(), 1);
        assert!(src.contains("#define FMASK 13u"));
        assert!(src.contains("acc = COMBINE(acc, r1);"));
        assert!(src.contains("#define COMBINE(a, b) ((a) + (b))"));
        let max = ReduceProgram {
            max: true,
            ..rp.clone()
        }
        .source();
        assert!(max.contains("#define COMBINE(a, b) red_max(a, b)") && max.contains("float acc = RED_INIT;"));
        assert!(src.contains("q0[eo[v]] = r0;"));
        assert!(
            !src.contains(" % n;\n                "),
            "no division per element in the loop"
        );
        assert!(src.contains("f32_to_bf16(v * a.scale[0])") && src.contains("f32_to_bf16(acc * a.scale[0])"));
        assert!(src.contains("__shfl_down_sync") && src.contains("int warp_rows;"));
        // Chunked sums combine in the launch's last block per column, in chunk order.
        assert!(src.contains("atomicAdd(&arrivals[blockIdx.x], 1u) == (unsigned)(a.chunks - 1)"));
        assert!(src.contains("if (last_arrival) arrivals[blockIdx.x] = 0u;"));
        assert!(src.contains("for (i64 k = 0; k < a.chunks; ++k) acc = COMBINE(acc, __ldcg(&part[k * a.kept + o]));"));
    }

    #[test]
    fn sibling_targets_accumulate_fold_and_store_each_into_their_own_result() {
        let rp = ReduceProgram {
            siblings: vec![Value::Input(0), Value::Reg(0)],
            ..squared_deviation()
        };
        rp.validate().unwrap();
        let src = rp.source();
        for (t, value) in [("", "r1"), ("1", "x0"), ("2", "r0")] {
            assert!(
                src.contains(&format!("acc{t} = COMBINE(acc{t}, {value});")),
                "target {t:?}"
            );
            assert!(src.contains(&format!("v{t} = tree[tx];")) && src.contains(&format!("float acc{t} = RED_INIT;")));
        }
        // Results 1 and 2 follow result 0; each target's partial sums follow the previous
        // target's, in phase 1 and in the last arriving block alike.
        assert!(src.contains("u16* res2 = (u16*)a.ptr[26];"));
        assert!(src.contains("else part[(2 * a.chunks + chunk) * a.kept + o] = v2;"));
        assert!(src.contains("acc = COMBINE(acc, part[(1 * a.chunks + k) * a.kept + o]);"));
        assert!(src.contains("acc = COMBINE(acc, __ldcg(&part[(2 * a.chunks + k) * a.kept + o]));"));
        assert!(src.contains("res1[o] = f32_to_bf16(acc * a.scale[1]);"));
        // The shared tree is reused only once every thread has read the previous target's sum.
        assert!(src.contains("    if (!wr) __syncthreads();\n    float v1;"));
        // Siblings only for sums without an epilogue, and at most MAX_TARGETS values.
        assert!(ReduceProgram {
            max: true,
            ..rp.clone()
        }
        .validate()
        .is_err());
        let four_more = ReduceProgram {
            siblings: vec![Value::Input(0); MAX_TARGETS],
            ..rp.clone()
        };
        assert!(four_more.validate().is_err());
        assert!(ReduceProgram {
            siblings: vec![Value::Scalar(0)],
            ..rp.clone()
        }
        .validate()
        .is_err());
        // The scratch buffer holds every target's partial sums.
        let full = [128i64, 64, 32, 32];
        assert_eq!(
            ReduceLaunch::scratch_len(&rp, &full),
            3 * ReduceLaunch::scratch_len(&squared_deviation(), &full)
        );
    }

    #[test]
    fn small_outputs_are_stored_once_per_kept_element() {
        // 1 / b (of the kept elements' shape `[1, C, 1, 1]`) stored beside the sum of a / b.
        let rp = ReduceProgram {
            program: Program {
                inputs: vec![DataType::F32, DataType::F32],
                scalars: 0,
                ops: vec![
                    FusedOp::unary(crate::kernels::elementwise::UnaryOp::Recip, Value::Input(1)).unwrap(),
                    FusedOp::Binary(BinaryOp::Mul, Value::Input(0), Value::Reg(0)),
                ],
                outputs: vec![(0, DataType::F32)],
                small_outputs: 0b1,
            },
            target: Value::Reg(1),
            ..squared_deviation()
        };
        rp.validate().unwrap();
        let src = rp.source();
        assert!(src.contains("z[v] = r == 0;") && src.contains("if (z[v]) q0[o] = r0;"));
        assert!(
            !squared_deviation().source().contains("z[v]"),
            "no flag without small outputs"
        );
        // The small output holds one packed element per kept element (C = 3 here).
        let full = [2, 3, 4, 5];
        let (a, b) = (
            TensorRef::fake(&full, &row_major_strides(&full), DataType::F32, 0x1000),
            TensorRef::fake(&[1, 3, 1, 1], &[3, 1, 1, 1], DataType::F32, 0x2000),
        );
        let result = TensorMut::fake(&[1, 3, 1, 1], &[3, 1, 1, 1], DataType::BF16, 0x3000);
        let scratch = TensorMut::fake(&[1 << 16], &[1], DataType::F32, 0x4000);
        let launch = |small: TensorMut<'static>| {
            let outputs = [small];
            let operands = ReduceOperands {
                inputs: &[a.clone(), b.clone()],
                outputs: &outputs,
                results: std::slice::from_ref(&result),
                scratch: Some(&scratch),
                arrivals: None,
            };
            ReduceLaunch::new(&rp, &full, &operands, &[], &[1.0]).map(|_| ())
        };
        launch(TensorMut::fake(&[3], &[1], DataType::F32, 0x5000)).unwrap();
        launch(TensorMut::fake(&[1, 3, 1, 1], &[3, 1, 1, 1], DataType::F32, 0x5000)).unwrap();
        assert!(launch(TensorMut::fake(&full, &row_major_strides(&full), DataType::F32, 0x5000)).is_err());
        assert!(launch(TensorMut::fake(&[3], &[2], DataType::F32, 0x5000)).is_err());
    }

    #[test]
    fn invalid_targets_masks_and_dtypes_are_errors() {
        let mut rp = squared_deviation();
        rp.target = Value::Reg(2);
        assert!(rp.validate().is_err());
        let mut rp = squared_deviation();
        rp.reduced = 0;
        assert!(rp.validate().is_err());
        let mut rp = squared_deviation();
        rp.reduced = 0b10000;
        assert!(rp.validate().is_err());
        let mut rp = squared_deviation();
        rp.out = DataType::Bool;
        assert!(rp.validate().is_err());
        let mut rp = squared_deviation();
        rp.target = Value::Scalar(0);
        assert!(rp.validate().is_err());
    }

    #[test]
    fn the_split_reads_along_the_inner_dim_and_fills_the_gpu() {
        let rp = squared_deviation();
        // [128, 64, 32, 32], reducing n, h, w: the inner dim is reduced (one lane, 256 rows),
        // 64 kept channels, chunks to fill about 1024 blocks.
        let s = Split::of(&rp, &[128, 64, 32, 32]);
        assert_eq!(
            (s.kept, s.red, s.block, s.warp_rows),
            (64, 128 * 32 * 32, (1, 256), false)
        );
        assert_eq!(s.chunks, 16);
        // Reducing dim 0 of [128, 4, 512]: the inner dim is kept (32 lanes of 8 rows).
        let rp0 = ReduceProgram {
            reduced: 0b001,
            max: false,
            rank: 3,
            ..squared_deviation()
        };
        let s = Split::of(&rp0, &[128, 4, 512]);
        assert_eq!(
            (s.kept, s.red, s.block, s.chunks, s.warp_rows),
            (2048, 128, (32, 8), 1, false)
        );
        assert_eq!(ReduceLaunch::scratch_len(&rp0, &[128, 4, 512]), 0);
        // Softmax rows, [32, 8, 256, 256] over the last dim: a warp per row, eight rows per
        // block, no chunks.
        let rows = ReduceProgram {
            reduced: 0b1000,
            ..squared_deviation()
        };
        let s = Split::of(&rows, &[32, 8, 256, 256]);
        assert_eq!(
            (s.kept, s.red, s.block, s.chunks, s.warp_rows),
            (65536, 256, (32, 8), 1, true)
        );
        assert_eq!(s.kept_per_block(), 8);
        assert_eq!(ReduceLaunch::scratch_len(&rows, &[32, 8, 256, 256]), 0);
        // Long rows, or too few of them to fill the GPU: a block per kept element.
        assert!(!Split::of(&rows, &[32, 8, 256, 8192]).warp_rows);
        assert!(!Split::of(&rows, &[1, 1, 64, 256]).warp_rows);
        assert_eq!(ReduceLaunch::scratch_len(&rp, &[128, 64, 32, 32]), 64 * 16);
        // One arrival counter per column of blocks (64 kept channels, a block's lanes on one
        // each, as the innermost dim is reduced); none without chunks.
        assert_eq!(ReduceLaunch::arrivals_len(&rp, &[128, 64, 32, 32]), 64);
        assert_eq!(ReduceLaunch::arrivals_len(&rows, &[32, 8, 256, 256]), 0);
    }

    #[test]
    fn grouped_reductions_move_the_inner_dim_with_vector_accesses() {
        let rp = ReduceProgram {
            rank: 3,
            reduced: 0b101,
            vec: 4,
            ..squared_deviation()
        };
        rp.validate().unwrap();
        let src = rp.source();
        assert!(
            src.contains("#define FV 4")
                && src.contains("fused_load<float, FV>(p0, e0[v], a.in_layout[0].strides[FR - 1], l0[v]);")
        );
        assert!(src.contains("fused_store<float, FV>(q0, eo[v], (i64)1, w0);"));
        assert!(
            src.contains("const i64 dm = d == FR - 1 ? dc * FV : dc;")
                && src.contains("u1 += dm * a.in_layout[1].strides[d];")
        );
        assert!(
            !squared_deviation().source().contains("FV"),
            "single elements: no groups"
        );
        // Groups only along a reduced innermost dim, of 1, 2, 4 or 8 elements.
        assert!(ReduceProgram {
            reduced: 0b001,
            ..rp.clone()
        }
        .validate()
        .is_err());
        assert!(ReduceProgram { vec: 3, ..rp.clone() }.validate().is_err());
        // [128, 32, 1024] over dims 0 and 2: 32 kept channels, 128 * 256 groups of 4, 16
        // chunks (each thread 8 groups).
        let s = Split::of(&rp, &[128, 32, 1024]);
        assert_eq!((s.kept, s.red, s.block, s.chunks), (32, 128 * 256, (1, 256), 16));
        // The launch counts the innermost dim in groups; a misaligned input is an error.
        let full = [128i64, 32, 1024];
        let packed = row_major_strides(&full);
        let x = TensorRef::fake(&full, &packed, DataType::F32, 1 << 20);
        let mean = TensorRef::fake(&[1, 32, 1], &[32, 1, 1], DataType::F32, 1 << 24);
        let result = TensorMut::fake(&[1, 32, 1], &[32, 1, 1], DataType::BF16, 1 << 30);
        let scratch = TensorMut::fake(&[32 * 16], &[1], DataType::F32, 1 << 31);
        let launch = |x: TensorRef<'static>| {
            let outputs = [TensorMut::fake(&full, &packed, DataType::F32, 1 << 28)];
            let operands = ReduceOperands {
                inputs: &[x, mean.clone()],
                outputs: &outputs,
                results: std::slice::from_ref(&result),
                scratch: Some(&scratch),
                arrivals: None,
            };
            ReduceLaunch::new(&rp, &full, &operands, &[], &[1.0]).map(|l| (l.args.full.shape[2], l.args.red, l.grid))
        };
        assert_eq!(launch(x.clone()).unwrap(), (256, 128 * 256, (32, 16)));
        assert!(launch(TensorRef::fake(&full, &packed, DataType::F32, (1 << 20) + 4)).is_err());
    }

    #[test]
    fn a_packed_launch_takes_new_addresses_and_refuses_other_operands() {
        let rp = ReduceProgram {
            rank: 3,
            reduced: 0b101,
            vec: 4,
            ..squared_deviation()
        };
        let full = [128i64, 32, 1024];
        let packed = row_major_strides(&full);
        let mean = TensorRef::fake(&[1, 32, 1], &[32, 1, 1], DataType::F32, 1 << 24);
        let result = TensorMut::fake(&[1, 32, 1], &[32, 1, 1], DataType::BF16, 1 << 30);
        let scratch = TensorMut::fake(&[32 * 64], &[1], DataType::F32, 1 << 31);
        let inputs = [TensorRef::fake(&full, &packed, DataType::F32, 1 << 20), mean.clone()];
        let outputs = [TensorMut::fake(&full, &packed, DataType::F32, 1 << 28)];
        let first = ReduceOperands {
            inputs: &inputs,
            outputs: &outputs,
            results: std::slice::from_ref(&result),
            scratch: Some(&scratch),
            arrivals: None,
        };
        let packed_launch = ReduceLaunch::new(&rp, &full, &first, &[], &[0.5])
            .unwrap()
            .packed(&first);
        let mut signature = Vec::new();
        // Other addresses of the same alignment, another scale: what `new` makes of them.
        let moved_in = [TensorRef::fake(&full, &packed, DataType::F32, 3 << 20), mean.clone()];
        let moved_out = [TensorMut::fake(&full, &packed, DataType::F32, 5 << 28)];
        let moved = ReduceOperands {
            inputs: &moved_in,
            outputs: &moved_out,
            ..first
        };
        let reused = ReduceLaunch::from_packed(&packed_launch, &moved, &[], &[0.25], &mut signature).expect("reused");
        let fresh = ReduceLaunch::new(&rp, &full, &moved, &[], &[0.25]).unwrap();
        assert_eq!(format!("{:?}", reused.args), format!("{:?}", fresh.args));
        assert_eq!((reused.grid, reused.block), (fresh.grid, fresh.block));
        // A less aligned input, another dtype or other dims: `new` decides again.
        let others = [
            TensorRef::fake(&full, &packed, DataType::F32, (1 << 20) + 4),
            TensorRef::fake(&full, &packed, DataType::F16, 1 << 20),
            TensorRef::fake(
                &[128, 32, 512],
                &row_major_strides(&[128, 32, 512]),
                DataType::F32,
                1 << 20,
            ),
        ];
        for x in others {
            let inputs = [x, mean.clone()];
            let operands = ReduceOperands {
                inputs: &inputs,
                ..first
            };
            assert!(ReduceLaunch::from_packed(&packed_launch, &operands, &[], &[0.5], &mut signature).is_none());
        }
        let no_scratch = ReduceOperands { scratch: None, ..first };
        assert!(ReduceLaunch::from_packed(&packed_launch, &no_scratch, &[], &[0.5], &mut signature).is_none());
    }

    #[test]
    fn the_vector_width_follows_the_inner_dim_the_alignment_and_the_dtypes() {
        let rp = squared_deviation();
        let full = [8i64, 16, 12, 12];
        let mean = TensorRef::fake_packed(&[1, 16, 1, 1], DataType::F32, 1 << 24);
        let vec = |x: TensorRef<'static>, rp: &ReduceProgram| {
            Coalesced::of(rp, &full, &[x, mean.clone()]).unwrap().program.vec
        };
        // f32 operands: 16 bytes per access, 4 elements (144 merged inner elements).
        assert_eq!(vec(TensorRef::fake_packed(&full, DataType::F32, 1 << 20), &rp), 4);
        // An input 4 bytes off a 16-byte boundary moves single elements.
        assert_eq!(vec(TensorRef::fake_packed(&full, DataType::F32, (1 << 20) + 4), &rp), 1);
        // 8 bytes off: pairs.
        assert_eq!(vec(TensorRef::fake_packed(&full, DataType::F32, (1 << 20) + 8), &rp), 2);
        // A kept innermost dim (reducing dim 0 only) moves single elements.
        let rp0 = ReduceProgram {
            reduced: 0b0001,
            ..squared_deviation()
        };
        assert_eq!(vec(TensorRef::fake_packed(&full, DataType::F32, 1 << 20), &rp0), 1);
        // 16-bit operands only: 8 elements per access.
        let half = ReduceProgram {
            program: Program {
                inputs: vec![DataType::BF16, DataType::BF16],
                outputs: vec![(0, DataType::BF16)],
                ..squared_deviation().program
            },
            ..squared_deviation()
        };
        let hmean = TensorRef::fake_packed(&[1, 16, 1, 1], DataType::BF16, 1 << 24);
        let x = TensorRef::fake_packed(&full, DataType::BF16, 1 << 20);
        assert_eq!(Coalesced::of(&half, &full, &[x, hmean]).unwrap().program.vec, 8);
    }

    #[test]
    fn coalescing_merges_reduced_and_kept_neighbours_and_drops_unit_dims() {
        let rp = squared_deviation();
        let x = TensorRef::fake_packed(&[8, 16, 12, 12], DataType::F32, 1 << 20);
        // The mean, [1, 16, 1, 1], broadcast over n, h and w.
        let mean = TensorRef::fake_packed(&[1, 16, 1, 1], DataType::F32, 1 << 24);
        let (merged, dims, views) = coalesce(&rp, &[8, 16, 12, 12], &[x.clone(), mean.clone()]).unwrap();
        assert_eq!(dims, vec![8, 16, 144]);
        assert_eq!((merged.rank, merged.reduced), (3, 0b101));
        assert_eq!(views[0].strides(), &[16 * 144, 144, 1]);
        assert_eq!(views[1].strides(), &[0, 1, 0]);
        merged.validate().unwrap();

        // A transposed input (h and w swapped) cannot merge h with w; n alone stays.
        let xt = x.transposed(2, 3);
        let (merged, dims, _) = coalesce(&rp, &[8, 16, 12, 12], &[xt, mean.clone()]).unwrap();
        assert_eq!((merged.rank, dims), (4, vec![8, 16, 12, 12]));

        // Size-1 dims go: [1, 16, 1, 1] summed over dims 0, 2, 3 keeps dims 1 ... and has no
        // reduced dim left, so nothing changes.
        let (merged, dims, _) = coalesce(&rp, &[1, 16, 1, 1], &[mean.clone(), mean]).unwrap();
        assert_eq!((merged.rank, dims), (4, vec![1, 16, 1, 1]));
    }
}
