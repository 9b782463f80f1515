//! Benchmarks of the public `ops` API on one GPU, plus the host-side hot paths (handle pool,
//! plan-cache lookup, signature hashing).
//!
//! ```text
//! cargo run --release -p examples --example bench -- [--json out.json] [--quick] [--only <substring>]
//!     [--benchmark-mode] [--allow-tf32] [--runs N] [--list]
//! ```
//!
//! `--list` prints the selected case names without touching the GPU (with `--json`, it writes
//! them with null measurements).
//!
//! `cold_start/*` cases time whole child processes (the `quickstart` and `train_burn` examples
//! next to this binary) with `CUDA_CACHE_DISABLE=1` and a kernel cache that is fresh
//! (`fresh_cache`: every kernel compiled, as on a new machine) or filled by an untimed run
//! (`warm_cache`); `median_ms` is the child's wall time (one run).
//!
//! `burn_op_cost/*` cases time Burn tensor operations from the host: a chain of 4,000
//! (`BENCH_OP_COST_ITERS`) iterations of a product by a scalar followed by either a sum with a scalar (two
//! elementwise operations) or a swap of dims (a view), on `Cudnn` (eager: each operation
//! launches at once) and on `CudnnFusion` (lazy: burn-fusion records each operation, hands it
//! to its server thread, and runs what our fusers join as one kernel); `us_per_call` is the
//! wall time per iteration, a read back of the result included; `burn_op_cost/kernel_launch`
//! is the product alone, launched from the kernel layer. PyTorch has no counterpart
//! here (its eager per-operation cost is in the training rows).
//!
//! `sm_carveout/*` cases time a ResNet-50 3x3 convolution (batch 256, fp16 NHWC) on the whole
//! GPU and limited to half its SMs (`EnginePolicy::sm_count_target`), a 256 MiB copy kernel
//! on a second stream, and both at once (the span from the first start to the last end, per
//! call): with the carveout the copy overlaps the convolution instead of queueing behind it.
//! PyTorch has no counterpart.
//!
//! GPU cases: warm-up, then the median of `--runs` runs, each timed with a pair of CUDA events
//! (host-side launch cost included, as in `torch.cuda.Event` timing). Inputs are random; when one
//! set of buffers fits in L2, runs rotate over three sets so no run reads the previous run's data
//! from L2. `bench/compare_torch.py --rust out.json` times the same cases with PyTorch.
//!
//! `BENCH_HOST_PROFILE=FILE` (built with `--features host-profile`) writes where the host time
//! of the selected cases went (see `--host-profile` of the training examples).

use std::error::Error as StdError;
use std::hint::black_box;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use cudnn_backend::cudarc::driver::sys::CUevent_flags;
use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use cudnn_backend::graph::{ConvAttrs, DataType, Graph, SignatureContext};
use cudnn_backend::ops::{self, Activation, ConvParams, PoolMode, PoolParams, TensorMut, TensorRef};
use cudnn_backend::plan::cache::{CacheStats, PlanLru, Signature};
use cudnn_backend::plan::cudnn_pool;
use cudnn_backend::plan::{self, EnginePolicy};
use cudnn_backend::runtime::{self, Device};
use cudnn_backend::types::{channels_last_strides, row_major_strides};
use cudnn_backend_reference::causal_masked;
use half::{bf16, f16};

type BoxResult<T> = Result<T, Box<dyn StdError>>;

/// Batch size of the ResNet-50 conv and pooling cases.
const BATCH: i64 = 64;
/// Buffer sets at most this large are rotated (3 sets) so that L2 (50 MB on H100/H200) is cold.
const L2_BYTES: usize = 50 << 20;
/// Buffer sets rotated when one set fits in L2.
const ROTATE_SETS: usize = 3;
const WARMUP_RUNS: usize = 5;

const USAGE: &str = "usage: bench [--json out.json] [--quick] [--only <substring>] [--benchmark-mode] \
                     [--allow-tf32] [--runs N] [--list]";

// ---------------------------------------------------------------------------------------------
// Command line

#[derive(Clone, Debug)]
struct Opts {
    json: Option<String>,
    quick: bool,
    only: Option<String>,
    benchmark_mode: bool,
    allow_tf32: bool,
    runs: usize,
    list: bool,
}

impl Opts {
    fn parse(args: impl Iterator<Item = String>) -> Result<Opts, String> {
        let mut o = Opts {
            json: None,
            quick: false,
            only: None,
            benchmark_mode: false,
            allow_tf32: false,
            runs: 0,
            list: false,
        };
        let mut args = args.peekable();
        while let Some(a) = args.next() {
            let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
            match a.as_str() {
                "--json" => o.json = Some(value("--json")?),
                "--only" => o.only = Some(value("--only")?),
                "--runs" => {
                    let v = value("--runs")?;
                    o.runs = v.parse().map_err(|_| format!("--runs: `{v}` is not a count"))?;
                }
                "--quick" => o.quick = true,
                "--benchmark-mode" => o.benchmark_mode = true,
                "--allow-tf32" => o.allow_tf32 = true,
                "--list" => o.list = true,
                "-h" | "--help" => return Err(USAGE.to_string()),
                other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
            }
        }
        if o.runs == 0 {
            o.runs = if o.quick { 10 } else { 50 };
        }
        Ok(o)
    }

    /// Iterations of the host-side micro-benchmarks (handle pool, cache lookups).
    fn host_iters(&self) -> usize {
        if self.quick {
            100_000
        } else {
            1_000_000
        }
    }

    /// Back-to-back calls of the tiny-conv host-cost case.
    fn host_cost_calls(&self) -> usize {
        if self.quick {
            1000
        } else {
            5000
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results and JSON

/// Minimal JSON value (the example avoids extra dependencies).
#[derive(Clone, Debug)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn opt(v: Option<f64>) -> Json {
        v.map_or(Json::Null, Json::Num)
    }

    fn str(s: &str) -> Json {
        Json::Str(s.to_string())
    }

    fn obj(fields: Vec<(&str, Json)>) -> Json {
        Json::Obj(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    fn write(&self, out: &mut String, indent: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(x) if x.is_finite() => out.push_str(&format!("{x}")),
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => write_json_string(out, s),
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    out.push_str(&" ".repeat(indent + 2));
                    v.write(out, indent + 2);
                }
                out.push_str(&format!("\n{}]", " ".repeat(indent)));
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_json_string(out, k);
                    out.push_str(": ");
                    v.write(out, indent);
                }
                out.push('}');
            }
        }
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One benchmark case: metadata (set when the case list is built) and its measurements.
#[derive(Clone, Debug, Default)]
struct Case {
    name: String,
    kind: &'static str,
    dtype: Option<&'static str>,
    layout: Option<&'static str>,
    shape: Vec<(&'static str, Json)>,
    median_ms: Option<f64>,
    tflops: Option<f64>,
    gbps: Option<f64>,
    us_per_call: Option<f64>,
    ns: Option<f64>,
    /// Why the case failed (then every measurement is None).
    error: Option<String>,
}

impl Case {
    fn new(name: String, kind: &'static str) -> Case {
        Case {
            name,
            kind,
            ..Case::default()
        }
    }

    fn with_fmt(mut self, fmt: Fmt) -> Case {
        self.dtype = Some(fmt.dtype_name());
        self.layout = Some(fmt.layout_name());
        self
    }

    fn with_shape(mut self, shape: Vec<(&'static str, Json)>) -> Case {
        self.shape = shape;
        self
    }

    /// Sets the median time and the rates derived from `flops` and `bytes`.
    fn set_time(&mut self, ms: f64, flops: Option<f64>, bytes: Option<f64>) {
        self.median_ms = Some(ms);
        self.tflops = flops.map(|f| f / (ms * 1e-3) / 1e12);
        self.gbps = bytes.map(|b| b / (ms * 1e-3) / 1e9);
    }

    fn summary(&self) -> String {
        let mut s = String::new();
        if let Some(ms) = self.median_ms {
            s.push_str(&format!("{ms:10.4} ms"));
        }
        if let Some(t) = self.tflops {
            s.push_str(&format!("  {t:8.2} TFLOP/s"));
        }
        if let Some(g) = self.gbps {
            s.push_str(&format!("  {g:8.1} GB/s"));
        }
        if let Some(u) = self.us_per_call {
            s.push_str(&format!("  {u:8.2} us/call"));
        }
        if let Some(n) = self.ns {
            s.push_str(&format!("  {n:8.1} ns"));
        }
        s
    }

    fn to_json(&self) -> Json {
        let shape = self.shape.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        Json::obj(vec![
            ("name", Json::str(&self.name)),
            ("kind", Json::str(self.kind)),
            ("dtype", self.dtype.map_or(Json::Null, Json::str)),
            ("layout", self.layout.map_or(Json::Null, Json::str)),
            ("shape", Json::Obj(shape)),
            ("median_ms", Json::opt(self.median_ms)),
            ("tflops", Json::opt(self.tflops)),
            ("gbps", Json::opt(self.gbps)),
            ("us_per_call", Json::opt(self.us_per_call)),
            ("ns", Json::opt(self.ns)),
            ("error", self.error.as_deref().map_or(Json::Null, Json::str)),
        ])
    }
}

fn int(v: i64) -> Json {
    Json::Num(v as f64)
}

// ---------------------------------------------------------------------------------------------
// Data types, layouts, buffers

/// Data type + activation layout of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fmt {
    dtype: DataType,
    nhwc: bool,
}

impl Fmt {
    const FP16_NHWC: Fmt = Fmt {
        dtype: DataType::F16,
        nhwc: true,
    };
    const BF16_NHWC: Fmt = Fmt {
        dtype: DataType::BF16,
        nhwc: true,
    };
    const FP32_NCHW: Fmt = Fmt {
        dtype: DataType::F32,
        nhwc: false,
    };

    fn dtype_name(self) -> &'static str {
        dtype_name(self.dtype)
    }

    fn layout_name(self) -> &'static str {
        if self.nhwc {
            "nhwc"
        } else {
            "nchw"
        }
    }

    fn label(self) -> String {
        format!("{}_{}", self.dtype_name(), self.layout_name())
    }

    /// An N, C, spatial... tensor (activations and filters) in this layout, not yet backed.
    fn image(self, dims: &[i64]) -> Proto {
        let strides = if self.nhwc {
            channels_last_strides(dims)
        } else {
            row_major_strides(dims)
        };
        Proto::new(dims, strides.to_vec(), self.dtype)
    }

    /// A packed row-major tensor (bias, matrices), not yet backed.
    fn packed(self, dims: &[i64]) -> Proto {
        Proto::new(dims, row_major_strides(dims).to_vec(), self.dtype)
    }
}

/// The dims, strides and dtype of a case tensor, before it has memory.
#[derive(Clone, Debug)]
struct Proto {
    dims: Vec<i64>,
    strides: Vec<i64>,
    dtype: DataType,
}

impl Proto {
    fn new(dims: &[i64], strides: Vec<i64>, dtype: DataType) -> Self {
        Self {
            dims: dims.to_vec(),
            strides,
            dtype,
        }
    }

    /// Elements from the first to the last one in memory (`1 + Σ (d-1)·s`; 0 when empty).
    fn extent_elements(&self) -> i64 {
        if self.dims.contains(&0) {
            return 0;
        }
        1 + self
            .dims
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum::<i64>()
    }
}

fn dtype_name(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F16 => "fp16",
        DataType::BF16 => "bf16",
        DataType::F32 => "fp32",
        _ => "other",
    }
}

fn tensor_bytes(t: &Proto) -> usize {
    t.extent_elements() as usize * t.dtype.size()
}

/// xorshift64*: a tiny, fast PRNG for filling inputs.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 23) as f32) - 1.0
    }
}

/// `n` random elements of `dtype`, little-endian bytes.
fn random_bytes(dtype: DataType, n: usize, rng: &mut Rng) -> BoxResult<Vec<u8>> {
    let mut out = Vec::with_capacity(n * dtype.size());
    match dtype {
        DataType::F32 => (0..n).for_each(|_| out.extend_from_slice(&rng.next_f32().to_le_bytes())),
        DataType::F16 => (0..n).for_each(|_| out.extend_from_slice(&f16::from_f32(rng.next_f32()).to_le_bytes())),
        DataType::BF16 => (0..n).for_each(|_| out.extend_from_slice(&bf16::from_f32(rng.next_f32()).to_le_bytes())),
        other => return Err(format!("no random fill for {other:?}").into()),
    }
    Ok(out)
}

/// Device memory for case tensors.
mod dev_buf {
    use super::*;

    /// `bytes` zeroed bytes (at least one).
    pub(super) fn zeros(stream: &Arc<CudaStream>, bytes: usize) -> BoxResult<CudaSlice<u8>> {
        Ok(stream.alloc_zeros::<u8>(bytes.max(1))?)
    }

    /// Random elements for every element `t` spans.
    pub(super) fn random(stream: &Arc<CudaStream>, t: &Proto, rng: &mut Rng) -> BoxResult<CudaSlice<u8>> {
        upload(stream, &random_bytes(t.dtype, t.extent_elements() as usize, rng)?)
    }

    /// A copy of `host` (at least one byte).
    pub(super) fn upload(stream: &Arc<CudaStream>, host: &[u8]) -> BoxResult<CudaSlice<u8>> {
        let mut mem = stream.alloc_zeros::<u8>(host.len().max(1))?;
        stream.memcpy_htod(host, &mut mem)?;
        Ok(mem)
    }
}

/// How a case tensor is initialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    Random,
    Zero,
    /// 0 where a query may see a key (bottom-right causal), -inf elsewhere: a `[.., Sq, Skv]`
    /// attention bias.
    CausalBias,
}

/// The bytes of a causal attention bias of `t`'s dims (its last two: queries, keys).
fn causal_bias_bytes(t: &Proto) -> BoxResult<Vec<u8>> {
    let r = t.dims.len();
    let (sq, skv) = (t.dims[r - 2], t.dims[r - 1]);
    let n = t.extent_elements();
    let mut out = Vec::with_capacity(n as usize * t.dtype.size());
    for e in 0..n {
        let (i, j) = ((e / skv % sq) as usize, (e % skv) as usize);
        let v = if causal_masked(i, j, sq as usize, skv as usize) {
            f32::NEG_INFINITY
        } else {
            0.0
        };
        match t.dtype {
            DataType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
            other => return Err(format!("no causal bias for {other:?}").into()),
        }
    }
    Ok(out)
}

/// One or more sets of backed tensors; runs rotate over the sets.
struct Sets {
    sets: Vec<Vec<(Proto, CudaSlice<u8>)>>,
}

impl Sets {
    /// Backs `protos` with device memory: three sets when one set fits in L2, else one.
    fn new(stream: &Arc<CudaStream>, seed: u64, protos: &[(Proto, Fill)]) -> BoxResult<Sets> {
        let set_bytes: usize = protos.iter().map(|(t, _)| tensor_bytes(t)).sum();
        let count = if set_bytes <= L2_BYTES { ROTATE_SETS } else { 1 };
        let mut rng = Rng::new(seed);
        let mut sets = Vec::with_capacity(count);
        for _ in 0..count {
            let mut set = Vec::with_capacity(protos.len());
            for (proto, fill) in protos {
                let buf = match fill {
                    Fill::Random => dev_buf::random(stream, proto, &mut rng)?,
                    Fill::Zero => dev_buf::zeros(stream, tensor_bytes(proto))?,
                    Fill::CausalBias => dev_buf::upload(stream, &causal_bias_bytes(proto)?)?,
                };
                set.push((proto.clone(), buf));
            }
            sets.push(set);
        }
        stream.synchronize()?;
        Ok(Sets { sets })
    }

    /// A view of every tensor of every set for ops on `stream`: writable, so one set serves
    /// any op (a `&TensorMut` is read as a `&TensorRef`).
    fn views<'a>(&'a mut self, stream: &'a Arc<CudaStream>) -> BoxResult<Vec<Vec<TensorMut<'a>>>> {
        let mut out = Vec::with_capacity(self.sets.len());
        for set in &mut self.sets {
            let mut views = Vec::with_capacity(set.len());
            for (p, mem) in set.iter_mut() {
                views.push(TensorMut::from_bytes(mem, stream, p.dtype, &p.dims, &p.strides)?);
            }
            out.push(views);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Timing

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// Calls timed back to back between one pair of CUDA events (the per-call time is their mean),
/// so that host launch overhead overlaps GPU work as in a real training step.
const CALLS_PER_RUN: usize = 10;

/// Warm-up, then the median over `runs` of the CUDA-event time per `op` call, each run being
/// [`CALLS_PER_RUN`] back-to-back calls that cycle through the buffer sets.
fn time_gpu(
    ctx: &Ctx,
    sets: &[Vec<TensorMut>],
    mut op: impl FnMut(&[TensorMut]) -> cudnn_backend::Result<()>,
) -> BoxResult<f64> {
    let stream = &ctx.stream;
    let n = sets.len();
    for i in 0..WARMUP_RUNS.max(n) {
        op(&sets[i % n])?;
    }
    stream.synchronize()?;
    let mut times = Vec::with_capacity(ctx.opts.runs);
    for i in 0..ctx.opts.runs {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for k in 0..CALLS_PER_RUN {
            op(&sets[(i * CALLS_PER_RUN + k) % n])?;
        }
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64 / CALLS_PER_RUN as f64);
    }
    Ok(median(times))
}

/// Host nanoseconds per iteration of `f` over `iters` iterations (after `iters / 10` warm-up).
fn time_host_ns(iters: usize, mut f: impl FnMut(usize) -> BoxResult<()>) -> BoxResult<f64> {
    for i in 0..iters / 10 {
        f(i)?;
    }
    let t0 = Instant::now();
    for i in 0..iters {
        f(i)?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e9 / iters as f64)
}

// ---------------------------------------------------------------------------------------------
// Case definitions

/// What every case gets: the device, its stream and the options.
struct Ctx {
    device: Arc<Device>,
    stream: Arc<CudaStream>,
    opts: Opts,
}

type RunFn = Box<dyn Fn(&Ctx, &mut Case) -> BoxResult<()>>;

/// A case to run: its metadata and the closure measuring it.
struct CaseDef {
    case: Case,
    run: RunFn,
}

impl CaseDef {
    fn new(case: Case, run: impl Fn(&Ctx, &mut Case) -> BoxResult<()> + 'static) -> CaseDef {
        CaseDef {
            case,
            run: Box::new(run),
        }
    }
}

/// A convolution layer: C input channels, H = W input size, K filters, R = S kernel, stride, pad.
#[derive(Clone, Copy, Debug)]
struct ConvLayer {
    c: i64,
    h: i64,
    k: i64,
    r: i64,
    stride: i64,
    pad: i64,
}

impl ConvLayer {
    const fn new(c: i64, h: i64, k: i64, r: i64, stride: i64, pad: i64) -> ConvLayer {
        ConvLayer {
            c,
            h,
            k,
            r,
            stride,
            pad,
        }
    }

    fn name(&self) -> String {
        let s = if self.stride != 1 {
            format!("s{}", self.stride)
        } else {
            String::new()
        };
        format!("c{}h{}k{}r{}{s}", self.c, self.h, self.k, self.r)
    }

    fn out_size(&self) -> i64 {
        (self.h + 2 * self.pad - self.r) / self.stride + 1
    }

    fn x_dims(&self, n: i64) -> [i64; 4] {
        [n, self.c, self.h, self.h]
    }

    fn w_dims(&self) -> [i64; 4] {
        [self.k, self.c, self.r, self.r]
    }

    fn y_dims(&self, n: i64) -> [i64; 4] {
        let o = self.out_size();
        [n, self.k, o, o]
    }

    fn params(&self) -> ConvParams {
        ConvParams::new(&[self.pad; 2], &[self.stride; 2], &[1, 1], 1)
    }

    fn flops(&self, n: i64) -> f64 {
        let o = self.out_size() as f64;
        2.0 * (n * self.k * self.c * self.r * self.r) as f64 * o * o
    }

    fn shape(&self, n: i64) -> Vec<(&'static str, Json)> {
        vec![
            ("n", int(n)),
            ("c", int(self.c)),
            ("h", int(self.h)),
            ("w", int(self.h)),
            ("k", int(self.k)),
            ("r", int(self.r)),
            ("s", int(self.r)),
            ("stride", int(self.stride)),
            ("pad", int(self.pad)),
            ("ho", int(self.out_size())),
            ("wo", int(self.out_size())),
        ]
    }
}

/// ResNet-50 conv layers.
const RESNET50: [ConvLayer; 6] = [
    ConvLayer::new(64, 56, 64, 3, 1, 1),
    ConvLayer::new(256, 56, 64, 1, 1, 0),
    ConvLayer::new(128, 28, 128, 3, 1, 1),
    ConvLayer::new(256, 14, 256, 3, 1, 1),
    ConvLayer::new(512, 7, 512, 3, 1, 1),
    ConvLayer::new(3, 224, 64, 7, 2, 3),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConvDir {
    Fwd,
    Dgrad,
    Wgrad,
    BiasRelu,
}

impl ConvDir {
    fn kind(self) -> &'static str {
        match self {
            ConvDir::Fwd => "conv_fwd",
            ConvDir::Dgrad => "conv_dgrad",
            ConvDir::Wgrad => "conv_wgrad",
            ConvDir::BiasRelu => "conv_bias_relu",
        }
    }
}

fn conv_layers(quick: bool) -> Vec<ConvLayer> {
    if quick {
        vec![RESNET50[0], RESNET50[3]]
    } else {
        RESNET50.to_vec()
    }
}

fn conv_defs(opts: &Opts) -> Vec<CaseDef> {
    let plain = [Fmt::FP16_NHWC, Fmt::BF16_NHWC, Fmt::FP32_NCHW];
    let fused = [Fmt::FP16_NHWC, Fmt::BF16_NHWC];
    let mut defs = Vec::new();
    for dir in [ConvDir::Fwd, ConvDir::Dgrad, ConvDir::Wgrad, ConvDir::BiasRelu] {
        let fmts: &[Fmt] = if dir == ConvDir::BiasRelu { &fused } else { &plain };
        for &fmt in fmts {
            for layer in conv_layers(opts.quick) {
                let name = format!("{}/{}/{}", dir.kind(), fmt.label(), layer.name());
                let case = Case::new(name, dir.kind()).with_fmt(fmt).with_shape(layer.shape(BATCH));
                defs.push(CaseDef::new(case, move |ctx, case| {
                    run_conv(ctx, case, layer, fmt, dir)
                }));
            }
        }
    }
    defs
}

fn run_conv(ctx: &Ctx, case: &mut Case, layer: ConvLayer, fmt: Fmt, dir: ConvDir) -> BoxResult<()> {
    let s = &ctx.stream;
    let p = layer.params();
    let x = fmt.image(&layer.x_dims(BATCH));
    let w = fmt.image(&layer.w_dims());
    let y = fmt.image(&layer.y_dims(BATCH));
    let ms = match dir {
        ConvDir::Fwd => {
            let mut sets = Sets::new(s, 1, &[(x, Fill::Random), (w, Fill::Random), (y, Fill::Zero)])?;
            let views = sets.views(s)?;
            time_gpu(ctx, &views, |t| ops::conv_forward(s, &t[0], &t[1], &t[2], &p))?
        }
        ConvDir::Dgrad => {
            let mut sets = Sets::new(s, 2, &[(y, Fill::Random), (w, Fill::Random), (x, Fill::Zero)])?;
            let views = sets.views(s)?;
            time_gpu(ctx, &views, |t| ops::conv_backward_data(s, &t[0], &t[1], &t[2], &p))?
        }
        ConvDir::Wgrad => {
            let mut sets = Sets::new(s, 3, &[(x, Fill::Random), (y, Fill::Random), (w, Fill::Zero)])?;
            let views = sets.views(s)?;
            time_gpu(ctx, &views, |t| ops::conv_backward_filter(s, &t[0], &t[1], &t[2], &p))?
        }
        ConvDir::BiasRelu => {
            let bias = fmt.packed(&[layer.k]);
            let protos = [
                (x, Fill::Random),
                (w, Fill::Random),
                (bias, Fill::Random),
                (y, Fill::Zero),
            ];
            let mut sets = Sets::new(s, 4, &protos)?;
            let views = sets.views(s)?;
            time_gpu(ctx, &views, |t| {
                ops::conv_bias_act_forward(s, &t[0], &t[1], &t[2], &t[3], &p, Activation::Relu)
            })?
        }
    };
    case.set_time(ms, Some(layer.flops(BATCH)), None);
    Ok(())
}

fn matmul_defs(opts: &Opts) -> Vec<CaseDef> {
    let sizes: &[i64] = if opts.quick { &[1024, 4096] } else { &[1024, 4096, 8192] };
    let mut defs = Vec::new();
    for dtype in [DataType::F16, DataType::BF16, DataType::F32] {
        for &n in sizes {
            let name = format!("matmul/{}/m{n}n{n}k{n}", dtype_name(dtype));
            let mut case = Case::new(name, "matmul").with_shape(vec![("m", int(n)), ("n", int(n)), ("k", int(n))]);
            case.dtype = Some(dtype_name(dtype));
            case.layout = Some("row_major");
            defs.push(CaseDef::new(case, move |ctx, case| {
                run_matmul(ctx, case, dtype, n, n, n)
            }));
        }
    }
    defs
}

fn run_matmul(ctx: &Ctx, case: &mut Case, dtype: DataType, m: i64, n: i64, k: i64) -> BoxResult<()> {
    let s = &ctx.stream;
    let fmt = Fmt { dtype, nhwc: false };
    let protos = [
        (fmt.packed(&[m, k]), Fill::Random),
        (fmt.packed(&[k, n]), Fill::Random),
        (fmt.packed(&[m, n]), Fill::Zero),
    ];
    let mut sets = Sets::new(s, 5, &protos)?;
    let ms = time_gpu(ctx, &sets.views(&ctx.stream)?, |t| ops::matmul(s, &t[0], &t[1], &t[2]))?;
    case.set_time(ms, Some(2.0 * (m * n * k) as f64), None);
    Ok(())
}

/// How an attention case masks: not at all, causally inside the fused graph, or causally
/// through a materialised -inf bias (the only way before the in-graph mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttnMask {
    None,
    Causal,
    CausalBias,
}

impl AttnMask {
    fn name(self) -> &'static str {
        match self {
            AttnMask::None => "none",
            AttnMask::Causal => "causal",
            AttnMask::CausalBias => "causal_bias",
        }
    }
}

/// Fused attention, B=4, H=16, head dim 128, Sq = Skv, f16 and bf16, for each mask.
fn sdpa_defs(opts: &Opts) -> Vec<CaseDef> {
    let seqs: &[i64] = if opts.quick { &[1024] } else { &[1024, 4096] };
    let (b, h, d) = (4i64, 16i64, 128i64);
    let mut defs = Vec::new();
    for dtype in [DataType::F16, DataType::BF16] {
        for &s in seqs {
            for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBias] {
                let name = format!("sdpa/{}/b{b}h{h}s{s}d{d}/{}", dtype_name(dtype), mask.name());
                let shape = vec![
                    ("b", int(b)),
                    ("h", int(h)),
                    ("sq", int(s)),
                    ("skv", int(s)),
                    ("d", int(d)),
                    ("mask", Json::str(mask.name())),
                ];
                let mut case = Case::new(name, "sdpa").with_shape(shape);
                case.dtype = Some(dtype_name(dtype));
                case.layout = Some("bhsd");
                defs.push(CaseDef::new(case, move |ctx, case| {
                    run_sdpa(ctx, case, dtype, [b, h, s, d], mask)
                }));
            }
        }
    }
    defs
}

fn run_sdpa(ctx: &Ctx, case: &mut Case, dtype: DataType, [b, h, s, d]: [i64; 4], mask: AttnMask) -> BoxResult<()> {
    let st = &ctx.stream;
    let fmt = Fmt { dtype, nhwc: false };
    let mut protos = vec![
        (fmt.packed(&[b, h, s, d]), Fill::Random),
        (fmt.packed(&[b, h, s, d]), Fill::Random),
        (fmt.packed(&[b, h, s, d]), Fill::Random),
        (fmt.packed(&[b, h, s, d]), Fill::Zero),
    ];
    if mask == AttnMask::CausalBias {
        protos.push((fmt.packed(&[1, 1, s, s]), Fill::CausalBias));
    }
    let mut sets = Sets::new(st, 11, &protos)?;
    let scale = 1.0 / (d as f32).sqrt();
    let causal = mask == AttnMask::Causal;
    let ms = time_gpu(ctx, &sets.views(&ctx.stream)?, |t| {
        ops::sdpa_forward(
            st,
            &t[0],
            &t[1],
            &t[2],
            t.get(4).map(TensorMut::as_input),
            causal,
            &t[3],
            scale,
            None,
        )
    })?;
    // Two products of 2·S·S·D per head; a causal mask leaves half of them to compute.
    let full = 4.0 * (b * h * s * s * d) as f64;
    case.set_time(ms, Some(if mask == AttnMask::None { full } else { full / 2.0 }), None);
    Ok(())
}

/// A pooling case: mode, window, stride, padding on an N×C×H×H input.
#[derive(Clone, Copy, Debug)]
struct PoolCfg {
    mode: PoolMode,
    window: i64,
    stride: i64,
    pad: i64,
    c: i64,
    h: i64,
}

impl PoolCfg {
    fn mode_name(&self) -> &'static str {
        match self.mode {
            PoolMode::Max => "max",
            PoolMode::AvgIncludePadding => "avg",
            PoolMode::AvgExcludePadding => "avg_exclude_pad",
        }
    }

    fn name(&self) -> String {
        format!(
            "{}_k{}s{}p{}_c{}h{}",
            self.mode_name(),
            self.window,
            self.stride,
            self.pad,
            self.c,
            self.h
        )
    }

    fn params(&self) -> PoolParams {
        PoolParams::new(self.mode, &[self.window; 2], &[self.stride; 2], &[self.pad; 2])
    }

    fn x_dims(&self) -> [i64; 4] {
        [BATCH, self.c, self.h, self.h]
    }

    fn shape(&self) -> BoxResult<Vec<(&'static str, Json)>> {
        let y = self.params().output_dims(&self.x_dims())?;
        Ok(vec![
            ("mode", Json::str(self.mode_name())),
            ("n", int(BATCH)),
            ("c", int(self.c)),
            ("h", int(self.h)),
            ("w", int(self.h)),
            ("window", int(self.window)),
            ("stride", int(self.stride)),
            ("pad", int(self.pad)),
            ("ho", int(y[2])),
            ("wo", int(y[3])),
        ])
    }
}

const POOLS: [PoolCfg; 2] = [
    PoolCfg {
        mode: PoolMode::Max,
        window: 3,
        stride: 2,
        pad: 1,
        c: 64,
        h: 112,
    },
    PoolCfg {
        mode: PoolMode::AvgIncludePadding,
        window: 2,
        stride: 2,
        pad: 0,
        c: 256,
        h: 56,
    },
];

fn pool_defs() -> Vec<CaseDef> {
    let mut defs = Vec::new();
    for backward in [false, true] {
        let kind = if backward { "pool_bwd" } else { "pool_fwd" };
        for fmt in [Fmt::FP16_NHWC, Fmt::FP32_NCHW] {
            for cfg in POOLS {
                let name = format!("{kind}/{}/{}", fmt.label(), cfg.name());
                let case = Case::new(name, kind)
                    .with_fmt(fmt)
                    .with_shape(cfg.shape().unwrap_or_default());
                defs.push(CaseDef::new(case, move |ctx, case| {
                    run_pool(ctx, case, cfg, fmt, backward)
                }));
            }
        }
    }
    defs
}

fn run_pool(ctx: &Ctx, case: &mut Case, cfg: PoolCfg, fmt: Fmt, backward: bool) -> BoxResult<()> {
    let s = &ctx.stream;
    let p = cfg.params();
    let x = fmt.image(&cfg.x_dims());
    let y = fmt.image(&p.output_dims(&x.dims)?);
    let (xb, yb) = (tensor_bytes(&x) as f64, tensor_bytes(&y) as f64);
    let (ms, bytes) = if !backward {
        let mut sets = Sets::new(s, 6, &[(x, Fill::Random), (y, Fill::Zero)])?;
        let ms = time_gpu(ctx, &sets.views(&ctx.stream)?, |t| {
            ops::pool_forward(s, &t[0], &t[1], &p)
        })?;
        (ms, xb + yb)
    } else if cfg.mode == PoolMode::Max {
        // x, y (the forward's real output, so argmax positions are consistent), dy, dx.
        let protos = [
            (x.clone(), Fill::Random),
            (y.clone(), Fill::Zero),
            (y, Fill::Random),
            (x, Fill::Zero),
        ];
        let mut sets = Sets::new(s, 7, &protos)?;
        let views = sets.views(s)?;
        for t in &views {
            ops::pool_forward(s, &t[0], &t[1], &p)?;
        }
        let ms = time_gpu(ctx, &views, |t| {
            ops::pool_backward(s, Some(t[0].as_input()), Some(t[1].as_input()), &t[2], &t[3], &p)
        })?;
        (ms, 2.0 * (xb + yb))
    } else {
        let mut sets = Sets::new(s, 8, &[(y, Fill::Random), (x, Fill::Zero)])?;
        let ms = time_gpu(ctx, &sets.views(&ctx.stream)?, |t| {
            ops::pool_backward(s, None, None, &t[0], &t[1], &p)
        })?;
        (ms, xb + yb)
    };
    case.set_time(ms, None, Some(bytes));
    Ok(())
}

/// The tiny conv of the host-cost case: N=1, C=8, 8x8, K=8, 3x3, pad 1, fp32 NCHW.
const TINY: ConvLayer = ConvLayer::new(8, 8, 8, 3, 1, 1);

fn host_defs(opts: &Opts) -> Vec<CaseDef> {
    let calls = opts.host_cost_calls();
    let iters = opts.host_iters();
    let mut tiny_shape = TINY.shape(1);
    tiny_shape.push(("calls", int(calls as i64)));
    let host = Case::new(format!("host_cost/fp32_nchw/{}n1", TINY.name()), "host_cost")
        .with_fmt(Fmt::FP32_NCHW)
        .with_shape(tiny_shape);
    let iters_shape = || vec![("iters", int(iters as i64))];
    let mut lookup_shape = iters_shape();
    lookup_shape.push(("entries", int(LOOKUP_ENTRIES as i64)));
    let mut host_plain = host.clone();
    host_plain.name = format!("{}/no_graph_replay", host.name);
    vec![
        CaseDef::new(host, move |ctx, case| run_host_cost(ctx, case, calls, true)),
        CaseDef::new(host_plain, move |ctx, case| run_host_cost(ctx, case, calls, false)),
        CaseDef::new(
            Case::new("device_check/pointer_device".into(), "device_check").with_shape(iters_shape()),
            move |ctx, case| run_pointer_device(ctx, case, iters),
        ),
        CaseDef::new(
            Case::new("handle_acquire/with_handle".into(), "handle_acquire").with_shape(iters_shape()),
            move |ctx, case| run_handle_acquire(ctx, case, iters),
        ),
        CaseDef::new(
            Case::new("cache_lookup/plan_lru_get".into(), "cache_lookup").with_shape(lookup_shape.clone()),
            move |ctx, case| run_cache_lookup(ctx, case, iters),
        ),
        CaseDef::new(
            Case::new("cache_lookup/signature_hash".into(), "cache_lookup").with_shape(lookup_shape),
            move |ctx, case| run_signature_hash(ctx, case, iters),
        ),
        CaseDef::new(
            Case::new("cache_lookup/signature_encode".into(), "cache_lookup").with_shape(iters_shape()),
            move |ctx, case| run_signature_encode(ctx, case, iters / 10),
        ),
    ]
}

/// Host wall time per `conv_forward` call on the plan-cache hot path, with or without CUDA
/// graph replay of the repeated call.
fn run_host_cost(ctx: &Ctx, case: &mut Case, calls: usize, replay: bool) -> BoxResult<()> {
    let saved = plan::policy();
    plan::set_policy(EnginePolicy {
        graph_replay: replay,
        ..saved
    });
    let result = host_cost(ctx, case, calls);
    plan::set_policy(saved);
    result
}

fn host_cost(ctx: &Ctx, case: &mut Case, calls: usize) -> BoxResult<()> {
    let s = &ctx.stream;
    let fmt = Fmt::FP32_NCHW;
    let p = TINY.params();
    let protos = [
        (fmt.image(&TINY.x_dims(1)), Fill::Random),
        (fmt.image(&TINY.w_dims()), Fill::Random),
        (fmt.image(&TINY.y_dims(1)), Fill::Zero),
    ];
    let mut sets = Sets::new(s, 9, &protos)?;
    let views = sets.views(s)?;
    let t = &views[0];
    for _ in 0..100 {
        ops::conv_forward(s, &t[0], &t[1], &t[2], &p)?;
    }
    s.synchronize()?;
    let before = plan::stats();
    let t0 = Instant::now();
    for _ in 0..calls {
        ops::conv_forward(s, &t[0], &t[1], &t[2], &p)?;
    }
    let enqueue = t0.elapsed();
    s.synchronize()?;
    let total = t0.elapsed();
    let after = plan::stats();
    case.us_per_call = Some(enqueue.as_secs_f64() * 1e6 / calls as f64);
    println!(
        "    (incl. final sync {:.2} us/call; plan hits +{}, misses +{}; graph replays +{}, captures +{}, failed +{})",
        total.as_secs_f64() * 1e6 / calls as f64,
        after.plan_hits.saturating_sub(before.plan_hits),
        after.plan_misses.saturating_sub(before.plan_misses),
        after.replay_launches.saturating_sub(before.replay_launches),
        after.replay_captures.saturating_sub(before.replay_captures),
        after.replay_failures.saturating_sub(before.replay_failures)
    );
    Ok(())
}

/// The driver query behind the engine's per-operand device check (one per operand per op).
fn run_pointer_device(ctx: &Ctx, case: &mut Case, iters: usize) -> BoxResult<()> {
    let sets = Sets::new(&ctx.stream, 3, &[(Fmt::FP32_NCHW.image(&TINY.x_dims(1)), Fill::Random)])?;
    let ptr = sets.sets[0][0].1.device_ptr(&ctx.stream).0;
    let found = runtime::pointer_device(ptr);
    if found != Some(ctx.device.ordinal()) {
        return Err(format!("pointer_device of a GPU {} buffer gave {found:?}", ctx.device.ordinal()).into());
    }
    case.ns = Some(time_host_ns(iters, |_| {
        black_box(runtime::pointer_device(black_box(ptr)));
        Ok(())
    })?);
    Ok(())
}

fn run_handle_acquire(ctx: &Ctx, case: &mut Case, iters: usize) -> BoxResult<()> {
    let stream = ctx.stream.cu_stream() as usize;
    let device = ctx.device.ordinal();
    let pool = cudnn_pool();
    case.ns = Some(time_host_ns(iters, |_| {
        pool.with_handle(device, stream, |h| {
            black_box(h);
        })?;
        Ok(())
    })?);
    Ok(())
}

/// Entries of the LRU in the lookup benchmark.
const LOOKUP_ENTRIES: usize = 1000;

/// The signature context of this device, cuDNN and policy, as the executor builds it.
fn signature_context(ctx: &Ctx) -> BoxResult<SignatureContext> {
    Ok(SignatureContext {
        compute_capability: ctx.device.info().compute_capability,
        cudnn_version: runtime::cudnn_version()? as u64,
        policy: plan::policy().signature_bits(),
    })
}

/// A validated fp16 NHWC conv-forward graph whose dims vary with `i` (1000 distinct values).
fn conv_graph(i: usize) -> BoxResult<Graph> {
    let i = i as i64;
    let (n, c, h, k) = (1 + i % 10, 16 * (1 + i / 10 % 10), 7 * (1 + i / 100 % 10), 64);
    let fmt = Fmt::FP16_NHWC;
    let layer = ConvLayer::new(c, h, k, 3, 1, 1);
    let (x, w, y) = (
        fmt.image(&layer.x_dims(n)),
        fmt.image(&layer.w_dims()),
        fmt.image(&layer.y_dims(n)),
    );
    let mut g = Graph::new();
    let xi = g.tensor("x", &x.dims, &x.strides, x.dtype);
    let wi = g.tensor("w", &w.dims, &w.strides, w.dtype);
    g.set_alignment(xi, 16).set_alignment(wi, 16);
    let yi = g.conv_fprop(xi, wi, ConvAttrs::new(&[1, 1], &[1, 1], &[1, 1]));
    g.set_output(yi, y.dtype)
        .set_dims(yi, &y.dims)
        .set_strides(yi, &y.strides)
        .set_alignment(yi, 16);
    g.validate()?;
    Ok(g)
}

fn signature_bytes_set(ctx: &Ctx) -> BoxResult<Vec<Vec<u8>>> {
    let sctx = signature_context(ctx)?;
    (0..LOOKUP_ENTRIES)
        .map(|i| Ok(conv_graph(i)?.signature_bytes(&sctx)))
        .collect()
}

fn mean_len(bytes: &[Vec<u8>]) -> f64 {
    bytes.iter().map(Vec::len).sum::<usize>() as f64 / bytes.len().max(1) as f64
}

/// Index sequence visiting all entries in a scattered order.
fn scattered(i: usize) -> usize {
    (i * 7919) % LOOKUP_ENTRIES
}

fn run_cache_lookup(ctx: &Ctx, case: &mut Case, iters: usize) -> BoxResult<()> {
    let bytes = signature_bytes_set(ctx)?;
    let mut lru = PlanLru::<u64>::new(LOOKUP_ENTRIES + 24, CacheStats::new());
    for (i, b) in bytes.iter().enumerate() {
        lru.insert(Signature::from_bytes(b), i as u64);
    }
    // Separate copies, as the executor builds a fresh key per call (no pointer-equal fast path).
    let keys: Vec<Signature> = bytes.iter().map(|b| Signature::from_bytes(b)).collect();
    let ns = time_host_ns(iters, |i| {
        let v = lru.get(&keys[scattered(i)]).ok_or("cache lookup missed")?;
        black_box(*v);
        Ok(())
    })?;
    case.ns = Some(ns);
    case.shape.push(("sig_bytes", Json::Num(mean_len(&bytes))));
    Ok(())
}

fn run_signature_hash(ctx: &Ctx, case: &mut Case, iters: usize) -> BoxResult<()> {
    let bytes = signature_bytes_set(ctx)?;
    let ns = time_host_ns(iters, |i| {
        black_box(Signature::from_bytes(black_box(&bytes[scattered(i)])).hash64());
        Ok(())
    })?;
    case.ns = Some(ns);
    case.shape.push(("sig_bytes", Json::Num(mean_len(&bytes))));
    Ok(())
}

/// Cost of `Graph::signature_bytes` (run on every op call before the cache lookup).
fn run_signature_encode(ctx: &Ctx, case: &mut Case, iters: usize) -> BoxResult<()> {
    let sctx = signature_context(ctx)?;
    let g = conv_graph(0)?;
    case.ns = Some(time_host_ns(iters, |_| {
        black_box(g.signature_bytes(black_box(&sctx)));
        Ok(())
    })?);
    case.shape = vec![("iters", int(iters as i64))];
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cold start: whole child processes, fresh or warm kernel cache

/// A child program of the cold-start cases: an example next to this binary, with arguments.
struct ColdStartProgram {
    /// The case's name (`cold_start/<case>/...`).
    case: &'static str,
    /// The example's executable.
    name: &'static str,
    args: &'static [&'static str],
}

const COLD_START_PROGRAMS: &[ColdStartProgram] = &[
    ColdStartProgram {
        case: "quickstart",
        name: "quickstart",
        args: &[],
    },
    ColdStartProgram {
        case: "train_burn",
        name: "train_burn",
        args: &[
            "--epochs",
            "1",
            "--train",
            "128",
            "--test",
            "128",
            "--batch-size",
            "128",
        ],
    },
    ColdStartProgram {
        case: "train_transformer",
        name: "train_transformer",
        args: &["--epochs", "1", "--train", "64", "--test", "32", "--batch-size", "32"],
    },
    ColdStartProgram {
        case: "train_transformer_bf16",
        name: "train_transformer",
        args: &[
            "--epochs",
            "1",
            "--train",
            "64",
            "--test",
            "32",
            "--batch-size",
            "32",
            "--dtype",
            "bf16",
        ],
    },
];

/// A fresh, empty directory under the system temp dir (removed by the caller).
fn fresh_dir(tag: &str) -> BoxResult<std::path::PathBuf> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("cudnn-backend-bench-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs `program` once with the kernel cache in `cache` and the driver's own cache off
/// (`CUDA_CACHE_DISABLE=1`, as on a fresh machine); returns the wall time in ms and stdout.
fn run_child(program: &ColdStartProgram, cache: &std::path::Path, out: &std::path::Path) -> BoxResult<(f64, String)> {
    let exe = std::env::current_exe()?
        .parent()
        .ok_or("bench has no parent directory")?
        .join(program.name);
    if !exe.exists() {
        return Err(format!("{} not found next to bench (build the examples)", exe.display()).into());
    }
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(program.args)
        .env("CUDNN_BACKEND_KERNEL_CACHE", cache)
        .env("CUDA_CACHE_DISABLE", "1")
        .stdin(std::process::Stdio::null());
    if program.name.starts_with("train_") {
        cmd.arg("--out").arg(out);
    }
    let t = Instant::now();
    let output = cmd.output()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    // The examples print their start-up lines on stderr (stdout may be a progress bar).
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!("{} exited with {}: {tail}", program.name, output.status).into());
    }
    Ok((ms, stdout))
}

/// Wall time of one child run (ms) with a fresh kernel cache (`warm` false) or with one that an
/// untimed run of the same program filled (`warm` true). Prints the child's kernel and
/// first-step lines.
fn run_cold_start(case: &mut Case, program: &ColdStartProgram, warm: bool) -> BoxResult<()> {
    let dir = fresh_dir(program.name)?;
    let cache = dir.join("kernels");
    let out = dir.join("out");
    let result = (|| {
        if warm {
            run_child(program, &cache, &out)?;
        }
        run_child(program, &cache, &out)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (ms, stdout) = result?;
    for line in stdout
        .lines()
        .filter(|l| l.starts_with("kernels:") || l.starts_with("first step:") || l.starts_with("cudnn:"))
    {
        println!("  {}: {line}", case.name);
    }
    case.median_ms = Some(ms);
    Ok(())
}

fn cold_start_defs() -> Vec<CaseDef> {
    let mut defs = Vec::new();
    for (i, p) in COLD_START_PROGRAMS.iter().enumerate() {
        for warm in [false, true] {
            let name = format!(
                "cold_start/{}/{}",
                p.case,
                if warm { "warm_cache" } else { "fresh_cache" }
            );
            let shape = vec![("args", Json::str(&p.args.join(" "))), ("runs", int(1))];
            defs.push(CaseDef::new(
                Case::new(name, "cold_start").with_shape(shape),
                move |_ctx, case| run_cold_start(case, &COLD_START_PROGRAMS[i], warm),
            ));
        }
    }
    defs
}

// ---------------------------------------------------------------------------------------------
// New shapes: the first call of a never-seen shape (host time to the end of the work)

/// Device memory for `n` f32 values.
fn scratch(stream: &Arc<CudaStream>, n: usize) -> BoxResult<CudaSlice<u8>> {
    Ok(stream.alloc_zeros::<u8>(4 * n.max(1))?)
}

/// Median over `n` never-seen shapes of the wall time of one call (to `synchronize`).
fn first_calls(ctx: &Ctx, n: usize, mut call: impl FnMut(usize) -> BoxResult<()>) -> BoxResult<f64> {
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        ctx.stream.synchronize()?;
        let t = Instant::now();
        call(i)?;
        ctx.stream.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

fn new_shape_defs() -> Vec<CaseDef> {
    let mut defs = Vec::new();
    // A new f16 conv (64 -> 64 channels, 3x3) per call: the spatial size differs each time.
    defs.push(CaseDef::new(
        Case::new("new_shape/conv_fprop_f16".into(), "new_shape").with_shape(vec![("shapes", int(9))]),
        |ctx, case| {
            let s = ctx.stream.clone();
            let x = scratch(&s, 8 * 64 * 80 * 80)?;
            let w = scratch(&s, 64 * 64 * 9)?;
            let mut y = scratch(&s, 8 * 64 * 80 * 80)?;
            let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
            case.median_ms = Some(first_calls(ctx, 9, |i| {
                let hw = 41 + 3 * i as i64 + (std::process::id() % 7) as i64;
                let (xd, wd) = ([8, 64, hw, hw], [64, 64, 3, 3]);
                let xt = TensorRef::from_bytes(&x, &s, DataType::F16, &xd, &channels_last_strides(&xd))?;
                let wt = TensorRef::from_bytes(&w, &s, DataType::F16, &wd, &channels_last_strides(&wd))?;
                let yt = TensorMut::from_bytes(&mut y, &s, DataType::F16, &xd, &channels_last_strides(&xd))?;
                Ok(ops::conv_forward(&s, &xt, &wt, &yt, &p)?)
            })?);
            Ok(())
        },
    ));
    // A new f32 matmul per call (M differs), as cuDNN plans them.
    defs.push(CaseDef::new(
        Case::new("new_shape/matmul_f32".into(), "new_shape").with_shape(vec![("shapes", int(9))]),
        |ctx, case| {
            let s = ctx.stream.clone();
            let a = scratch(&s, 1200 * 512)?;
            let b = scratch(&s, 512 * 512)?;
            let mut c = scratch(&s, 1200 * 512)?;
            case.median_ms = Some(first_calls(ctx, 9, |i| {
                let m = 1000 + 17 * i as i64 + (std::process::id() % 13) as i64;
                let at = TensorRef::from_bytes(&a, &s, DataType::F32, &[m, 512], &[512, 1])?;
                let bt = TensorRef::from_bytes(&b, &s, DataType::F32, &[512, 512], &[512, 1])?;
                let ct = TensorMut::from_bytes(&mut c, &s, DataType::F32, &[m, 512], &[512, 1])?;
                Ok(ops::matmul(&s, &at, &bt, &ct)?)
            })?);
            Ok(())
        },
    ));
    // Burn's LU and determinant of an n x n matrix on our backend (a new product shape for
    // every column of the factorization). A warm-up on an 8 x 8 matrix first compiles the
    // kernels the algorithm uses (a one-time cost per machine with the persistent kernel
    // cache, measured by the cold_start cases), so the timed call measures what new shapes
    // cost. The determinant takes n = 499: shapes the LU case has not met.
    for (name, n, det) in [
        ("new_shape/burn_lu_500", 500, false),
        ("new_shape/burn_det_499", 499, true),
    ] {
        defs.push(CaseDef::new(
            Case::new(name.into(), "new_shape").with_shape(vec![("n", int(n as i64))]),
            move |ctx, case| {
                use burn::tensor::{Distribution, Tensor};
                type B = cudnn_backend::burn::Cudnn;
                let device = cudnn_backend::burn::CudnnDevice::new(ctx.device.ordinal());
                let run = |m: &Tensor<B, 2>| {
                    if det {
                        let d: Tensor<B, 1> = burn::tensor::linalg::det::<B, 3, 2, 1>(m.clone().unsqueeze::<3>());
                        let _ = d.into_data();
                    } else {
                        let (_, l, _) = burn::tensor::linalg::lu::<B, 2, 1>(m.clone());
                        let _ = l.into_data();
                    }
                };
                run(&Tensor::<B, 2>::random([8, 8], Distribution::Normal(0.0, 1.0), &device));
                let m = Tensor::<B, 2>::random([n, n], Distribution::Normal(0.0, 1.0), &device);
                case.median_ms = Some(first_calls(ctx, 1, |_| {
                    run(&m);
                    Ok(())
                })?);
                Ok(())
            },
        ));
    }
    defs
}

// ---------------------------------------------------------------------------------------------
// Host cost per Burn operation, eager and under lazy fusion

/// Iterations of the timed loop of the `burn_op_cost` cases (`BENCH_OP_COST_ITERS` sets
/// another count, e.g. for a longer host profile).
fn op_cost_iters() -> usize {
    std::env::var("BENCH_OP_COST_ITERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(4000)
}

/// Wall time per iteration (µs) of `iters` iterations of `x = x.mul_scalar(c).OP`, OP being
/// `add_scalar(d)` (`fusable`: two elementwise operations a fuser joins) or `swap_dims(0, 1)`
/// (a view: under lazy fusion each product then runs alone), on a 64 x 64 f32 tensor, then a
/// read back of the result. Warm-up chains first compile the kernels (and fused programs).
fn burn_chain_us<B: burn::tensor::backend::Backend>(device: &B::Device, fusable: bool, iters: usize) -> f64 {
    use burn::tensor::{Distribution, Tensor};
    let chain = |mut x: Tensor<B, 2>, n: usize| {
        for _ in 0..n {
            x = x.mul_scalar(0.999);
            x = if fusable {
                x.add_scalar(0.001)
            } else {
                x.swap_dims(0, 1)
            };
        }
        let _ = x.into_data();
    };
    let x = Tensor::<B, 2>::random([64, 64], Distribution::Uniform(0.5, 1.5), device);
    for _ in 0..3 {
        chain(x.clone(), 64);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let start = std::time::Instant::now();
    chain(x, iters);
    start.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn burn_op_cost_defs() -> Vec<CaseDef> {
    let mut defs = Vec::new();
    // The same product launched from the kernel layer (`kernels::elementwise::binary_scalar`
    // on two 64 x 64 f32 buffers): what a launch costs below Burn and the backend's tensors.
    defs.push(CaseDef::new(
        Case::new("burn_op_cost/kernel_launch".into(), "host").with_shape(vec![("iters", int(op_cost_iters() as i64))]),
        |ctx, case| {
            use cudnn_backend::kernels::elementwise::{binary_scalar, BinaryOp};
            let s = ctx.stream.clone();
            let a = scratch(&s, 64 * 64 * 4)?;
            let mut o = scratch(&s, 64 * 64 * 4)?;
            let (dims, strides) = ([64i64, 64], [64i64, 1]);
            let at = TensorRef::from_bytes(&a, &s, DataType::F32, &dims, &strides)?;
            let ot = TensorMut::from_bytes(&mut o, &s, DataType::F32, &dims, &strides)?;
            for _ in 0..64 {
                binary_scalar(&s, BinaryOp::Mul, &at, 0.999, &ot)?;
            }
            s.synchronize()?;
            let iters = op_cost_iters();
            let start = std::time::Instant::now();
            for _ in 0..iters {
                binary_scalar(&s, BinaryOp::Mul, &at, 0.999, &ot)?;
            }
            s.synchronize()?;
            case.us_per_call = Some(start.elapsed().as_secs_f64() * 1e6 / iters as f64);
            Ok(())
        },
    ));
    for (label, lazy, fusable) in [
        ("eager_two_launches", false, true),
        ("eager_launch_and_view", false, false),
        ("lazy_fused", true, true),
        ("lazy_launch_and_view", true, false),
    ] {
        defs.push(CaseDef::new(
            Case::new(format!("burn_op_cost/{label}"), "host").with_shape(vec![("iters", int(op_cost_iters() as i64))]),
            move |ctx, case| {
                let device = cudnn_backend::burn::CudnnDevice::new(ctx.device.ordinal());
                case.us_per_call = Some(if lazy {
                    burn_chain_us::<cudnn_backend::burn::CudnnFusion>(&device, fusable, op_cost_iters())
                } else {
                    burn_chain_us::<cudnn_backend::burn::Cudnn>(&device, fusable, op_cost_iters())
                });
                Ok(())
            },
        ));
    }
    defs
}

// ---------------------------------------------------------------------------------------------
// SM carveout: a convolution limited to part of the GPU, next to a bandwidth-bound kernel on
// a second stream

/// Batch of the carveout convolution (ResNet-50's first 3x3 layer, long enough to overlap).
const CARVEOUT_BATCH: i64 = 256;
/// Elements (f32) the second stream's copy kernel moves per call: 256 MiB read, 256 MiB written.
const CARVEOUT_COPY_ELEMS: i64 = 64 << 20;

/// Which part of the carveout experiment a case times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carveout {
    /// The convolution alone, on the whole GPU.
    ConvFull,
    /// The convolution alone, limited to half the SMs.
    ConvHalf,
    /// The copy kernel alone, on the second stream.
    Copy,
    /// Both at once, the convolution on the whole GPU.
    TogetherFull,
    /// Both at once, the convolution limited to half the SMs.
    TogetherHalf,
}

impl Carveout {
    const ALL: [Carveout; 5] = [
        Carveout::ConvFull,
        Carveout::ConvHalf,
        Carveout::Copy,
        Carveout::TogetherFull,
        Carveout::TogetherHalf,
    ];

    fn label(self) -> &'static str {
        match self {
            Carveout::ConvFull => "conv_full",
            Carveout::ConvHalf => "conv_half_sms",
            Carveout::Copy => "copy_second_stream",
            Carveout::TogetherFull => "together_full",
            Carveout::TogetherHalf => "together_half_sms",
        }
    }

    fn half(self) -> bool {
        matches!(self, Carveout::ConvHalf | Carveout::TogetherHalf)
    }
}

fn carveout_defs() -> Vec<CaseDef> {
    let layer = RESNET50[0];
    Carveout::ALL
        .into_iter()
        .map(|part| {
            let mut shape = layer.shape(CARVEOUT_BATCH);
            shape.push(("copy_elems", int(CARVEOUT_COPY_ELEMS)));
            let case = Case::new(format!("sm_carveout/{}", part.label()), "sm_carveout")
                .with_fmt(Fmt::FP16_NHWC)
                .with_shape(shape);
            CaseDef::new(case, move |ctx, case| {
                let saved = plan::policy();
                let target = part.half().then(|| (ctx.device.info().sm_count / 2).max(1));
                plan::set_policy(EnginePolicy {
                    sm_count_target: target,
                    ..saved
                });
                let result = run_carveout(ctx, case, layer, part);
                plan::set_policy(saved);
                case.shape.push(("sm_count", int(ctx.device.info().sm_count as i64)));
                case.shape
                    .push(("sm_count_target", target.map_or(Json::Null, |t| int(t as i64))));
                result
            })
        })
        .collect()
}

/// Times one part of the carveout experiment: per call (the median of runs of
/// [`CALLS_PER_RUN`] calls); "together" runs the calls of both streams at once and times the
/// span from the first start to the last end.
fn run_carveout(ctx: &Ctx, case: &mut Case, layer: ConvLayer, part: Carveout) -> BoxResult<()> {
    let s = &ctx.stream;
    let side = s.context().new_stream()?;
    let fmt = Fmt::FP16_NHWC;
    let p = layer.params();
    let conv_protos = [
        (fmt.image(&layer.x_dims(CARVEOUT_BATCH)), Fill::Random),
        (fmt.image(&layer.w_dims()), Fill::Random),
        (fmt.image(&layer.y_dims(CARVEOUT_BATCH)), Fill::Zero),
    ];
    let copy = Fmt::FP32_NCHW.packed(&[CARVEOUT_COPY_ELEMS]);
    let mut conv_sets = Sets::new(s, 5, &conv_protos)?;
    let mut copy_sets = Sets::new(&side, 6, &[(copy.clone(), Fill::Random), (copy, Fill::Zero)])?;
    let conv = conv_sets.views(s)?;
    let copies = copy_sets.views(&side)?;
    let run_conv = |i: usize| {
        let t = &conv[i % conv.len()];
        ops::conv_forward(s, &t[0], &t[1], &t[2], &p)
    };
    let run_copy = |i: usize| {
        let t = &copies[i % copies.len()];
        cudnn_backend::kernels::elementwise::copy(&side, &t[0], &t[1])
    };
    for i in 0..WARMUP_RUNS {
        run_conv(i)?;
        run_copy(i)?;
    }
    s.synchronize()?;
    side.synchronize()?;
    let mut times = Vec::with_capacity(ctx.opts.runs);
    for run in 0..ctx.opts.runs {
        let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        side.wait(&start)?;
        for k in 0..CALLS_PER_RUN {
            let i = run * CALLS_PER_RUN + k;
            if part != Carveout::Copy {
                run_conv(i)?;
            }
            if matches!(part, Carveout::Copy | Carveout::TogetherFull | Carveout::TogetherHalf) {
                run_copy(i)?;
            }
        }
        s.join(&side)?;
        let end = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64 / CALLS_PER_RUN as f64);
    }
    let ms = median(times);
    let copy_bytes = 2.0 * 4.0 * CARVEOUT_COPY_ELEMS as f64;
    match part {
        Carveout::Copy => case.set_time(ms, None, Some(copy_bytes)),
        Carveout::ConvFull | Carveout::ConvHalf => case.set_time(ms, Some(layer.flops(CARVEOUT_BATCH)), None),
        Carveout::TogetherFull | Carveout::TogetherHalf => case.set_time(ms, None, None),
    }
    Ok(())
}

/// `--only`: keeps the cases whose name contains the substring.
fn selected(only: Option<&str>, name: &str) -> bool {
    match only {
        Some(s) => name.contains(s),
        None => true,
    }
}

fn all_defs(opts: &Opts) -> Vec<CaseDef> {
    let mut defs = conv_defs(opts);
    defs.extend(matmul_defs(opts));
    defs.extend(sdpa_defs(opts));
    defs.extend(pool_defs());
    defs.extend(host_defs(opts));
    defs.extend(cold_start_defs());
    defs.extend(new_shape_defs());
    defs.extend(burn_op_cost_defs());
    defs.extend(carveout_defs());
    defs
}

// ---------------------------------------------------------------------------------------------
// Driver

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Runs one case; a failure (error or panic) prints `ERROR <case>: <error>` and is recorded
/// in the returned case's `error`.
fn run_case(ctx: &Ctx, def: &CaseDef) -> Case {
    let mut case = def.case.clone();
    let outcome = catch_unwind(AssertUnwindSafe(|| (def.run)(ctx, &mut case)));
    let err = match outcome {
        Ok(Ok(())) => {
            println!("{:<48} {}", case.name, case.summary());
            return case;
        }
        Ok(Err(e)) => e.to_string(),
        Err(p) => format!("panicked: {}", panic_message(p.as_ref())),
    };
    // Surface (and clear, where possible) asynchronous errors before the next case.
    let sync = ctx.stream.synchronize().err().map(|e| format!(" (stream: {e})"));
    let err = format!("{err}{}", sync.unwrap_or_default());
    println!("ERROR {}: {err}", case.name);
    Case {
        error: Some(err),
        ..def.case.clone()
    }
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn print_table(cases: &[Case]) {
    println!();
    println!(
        "{:<48} | {:>10} | {:>8} | {:>8} | {:>8} | {:>8}",
        "case", "ms", "TFLOP/s", "GB/s", "us/call", "ns"
    );
    println!("{}", "-".repeat(48 + 5 * 11 + 10));
    for c in cases {
        if let Some(e) = &c.error {
            println!("{:<48} | ERROR: {e}", c.name);
            continue;
        }
        println!(
            "{:<48} | {:>10} | {:>8} | {:>8} | {:>8} | {:>8}",
            c.name,
            fmt_opt(c.median_ms, 4),
            fmt_opt(c.tflops, 2),
            fmt_opt(c.gbps, 1),
            fmt_opt(c.us_per_call, 2),
            fmt_opt(c.ns, 1)
        );
    }
}

fn version_string(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
}

/// Header facts recorded in the JSON.
struct RunInfo {
    device: String,
    compute_capability: (u32, u32),
    cudnn_version: Option<usize>,
    policy: EnginePolicy,
}

fn write_json(path: &str, info: &RunInfo, opts: &Opts, cases: &[Case]) -> std::io::Result<()> {
    let (major, minor) = info.compute_capability;
    let doc = Json::obj(vec![
        ("device", Json::str(&info.device)),
        ("compute_capability", Json::str(&format!("{major}.{minor}"))),
        ("cudnn_version", Json::opt(info.cudnn_version.map(|v| v as f64))),
        ("allow_tf32", Json::Bool(info.policy.allow_tf32)),
        ("benchmark_mode", Json::Bool(info.policy.benchmark)),
        ("policy", Json::str(&format!("{:?}", info.policy))),
        ("runs", Json::Num(opts.runs as f64)),
        ("warmup", Json::Num(WARMUP_RUNS as f64)),
        ("quick", Json::Bool(opts.quick)),
        ("l2_rotate_bytes", Json::Num(L2_BYTES as f64)),
        ("cases", Json::Arr(cases.iter().map(Case::to_json).collect())),
    ]);
    let mut out = String::new();
    doc.write(&mut out, 0);
    out.push('\n');
    std::fs::write(path, out)
}

/// Applies `--benchmark-mode` / `--allow-tf32` on top of the current (environment) policy.
fn apply_policy(opts: &Opts) -> EnginePolicy {
    let mut p = plan::policy();
    p.benchmark |= opts.benchmark_mode;
    p.allow_tf32 |= opts.allow_tf32;
    plan::set_policy(p);
    plan::policy()
}

fn print_header(info: &RunInfo) {
    let (major, minor) = info.compute_capability;
    println!("device            : {} (sm_{major}{minor})", info.device);
    let cudnn = info
        .cudnn_version
        .map_or("unavailable".into(), |v| format!("{} ({v})", version_string(v)));
    println!("cuDNN             : {cudnn}");
    println!("policy            : {:?}", info.policy);
    println!(
        "benchmark mode    : {}",
        if info.policy.benchmark {
            "on (autotune)"
        } else {
            "off (heuristics)"
        }
    );
    println!(
        "TF32 for fp32     : {} (PyTorch defaults: conv ON, matmul OFF; compare_torch.py follows this run)",
        if info.policy.allow_tf32 { "ON" } else { "OFF" }
    );
}

/// `--list`: the case names (and, with `--json`, the case list with null measurements).
fn list_cases(opts: &Opts, defs: &[CaseDef]) {
    for d in defs {
        println!("{}", d.case.name);
    }
    println!("{} cases", defs.len());
    if let Some(path) = &opts.json {
        let info = RunInfo {
            device: "none (--list)".into(),
            compute_capability: (0, 0),
            cudnn_version: None,
            policy: apply_policy(opts),
        };
        let cases: Vec<Case> = defs.iter().map(|d| d.case.clone()).collect();
        match write_json(path, &info, opts, &cases) {
            Ok(()) => println!("wrote {path}"),
            Err(e) => println!("ERROR writing {path}: {e}"),
        }
    }
}

fn main() {
    let opts = match Opts::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let defs: Vec<CaseDef> = all_defs(&opts)
        .into_iter()
        .filter(|d| selected(opts.only.as_deref(), &d.case.name))
        .collect();
    if opts.list {
        list_cases(&opts, &defs);
        return;
    }
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("{e}");
            println!("no GPU: nothing to benchmark");
            return;
        }
    };
    let policy = apply_policy(&opts);
    let info = RunInfo {
        device: device.info().name.clone(),
        compute_capability: device.info().compute_capability,
        cudnn_version: runtime::cudnn_version().map_err(|e| println!("cuDNN: {e}")).ok(),
        policy,
    };
    print_header(&info);
    let ctx = Ctx {
        stream: device.stream().clone(),
        device,
        opts: opts.clone(),
    };
    println!(
        "cases             : {} (runs {}, warm-up {WARMUP_RUNS})\n",
        defs.len(),
        opts.runs
    );
    let t0 = Instant::now();
    // `BENCH_HOST_PROFILE=FILE` (examples feature `host-profile`): where the host time of the
    // selected cases goes.
    let profile =
        std::env::var_os("BENCH_HOST_PROFILE").map(|path| examples::host_profile::Session::start(path.as_ref()));
    let results: Vec<Case> = defs.iter().map(|d| run_case(&ctx, d)).collect();
    if let Some(Err(e)) = profile.map(|p| p.and_then(|p| p.finish())) {
        println!("host profile: {e}");
    }
    print_table(&results);
    let st = plan::stats();
    println!(
        "\n{} of {} cases ok in {:.1} s; plan cache: {} hits, {} misses, {:.1} ms building",
        results.iter().filter(|c| c.error.is_none()).count(),
        defs.len(),
        t0.elapsed().as_secs_f64(),
        st.plan_hits,
        st.plan_misses,
        st.build_time_ns as f64 * 1e-6
    );
    if let Some(path) = &opts.json {
        match write_json(path, &info, &opts, &results) {
            Ok(()) => println!("wrote {path}"),
            Err(e) => println!("ERROR writing {path}: {e}"),
        }
    }
}
