//! The elementwise kernels (`cudnn_backend::kernels::elementwise`) against straightforward
//! CPU computations in f64/i64: every op of every family in every dtype it supports, on
//! packed, transposed, broadcast (`[1, n]`, `[m, 1]`, missing leading dims, scalars),
//! gapped-output and rank 1..5 layouts, with poisoned outputs. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::elementwise::{self as ew, BinaryOp, CompareOp, UnaryOp};
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{gather_from_strided, rel_l2_error, scatter_to_strided, strided_len, SplitMix64};
use half::{bf16, f16};
use integration_tests::views_of;
use integration_tests::{round_to, strides, KernelReport, Layout};

use DataType::*;

const ALL: [DataType; 9] = [F32, F16, BF16, F64, I32, I64, U8, I8, Bool];
const FLOATS: [DataType; 4] = [F32, F16, BF16, F64];
const INTS: [DataType; 4] = [I32, I64, U8, I8];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

// ---------------------------------------------------------------------------------------
// Host <-> device in every dtype (values carried as f64: ints stay below 2^53 here)

/// `v` converted to `dtype` the way the kernels convert (floats: rounded; ints: truncated
/// toward zero, NaN -> 0, wrapped to the width; bool: `!= 0`).
fn to_dtype(dtype: DataType, v: f64) -> f64 {
    if dtype.is_float() {
        return round_to(dtype, v);
    }
    if dtype == Bool {
        return (v != 0.0) as u8 as f64;
    }
    wrap(dtype, if v.is_nan() { 0 } else { v as i64 })
}

/// `v` wrapped to the integer `dtype`'s width.
fn wrap(dtype: DataType, v: i64) -> f64 {
    match dtype {
        I32 => v as i32 as f64,
        I64 => v as f64,
        U8 => v as u8 as f64,
        I8 => v as i8 as f64,
        Bool => (v != 0) as u8 as f64,
        _ => unreachable!(),
    }
}

fn encode(dtype: DataType, v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| -> Vec<u8> {
            match dtype {
                F32 => (x as f32).to_le_bytes().to_vec(),
                F16 => f16::from_f64(x).to_le_bytes().to_vec(),
                BF16 => bf16::from_f64(x).to_le_bytes().to_vec(),
                F64 => x.to_le_bytes().to_vec(),
                I32 => (x as i32).to_le_bytes().to_vec(),
                I64 => (x as i64).to_le_bytes().to_vec(),
                U8 | Bool => vec![x as i64 as u8],
                I8 => vec![x as i64 as i8 as u8],
            }
        })
        .collect()
}

fn decode(dtype: DataType, b: &[u8]) -> Vec<f64> {
    b.chunks_exact(dtype.size())
        .map(|c| match dtype {
            F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            F16 => f16::from_le_bytes([c[0], c[1]]).to_f64(),
            BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            F64 => f64::from_le_bytes(c.try_into().unwrap()),
            I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            // A poisoned (unwritten) bool shows as NaN.
            Bool if c[0] > 1 => f64::NAN,
            U8 | Bool => c[0] as f64,
            I8 => c[0] as i8 as f64,
        })
        .collect()
}

struct Dev {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
    /// Logical values (already converted to the dtype).
    values: Vec<f64>,
}

fn us(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

fn upload(stream: &Arc<CudaStream>, values: &[f64], dims: &[i64], st: &[i64], dtype: DataType) -> Dev {
    let values: Vec<f64> = values.iter().map(|&v| to_dtype(dtype, v)).collect();
    let len = strided_len(&us(dims), &us(st)).max(1);
    let mut host = vec![if dtype.is_float() { f64::NAN } else { 77.0 }; len];
    scatter_to_strided(&values, &us(dims), &us(st), &mut host);
    let buf = stream.clone_htod(&encode(dtype, &host)).expect("upload");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(stream, &buf, 0, dims, st, dtype) };
    Dev { t, m, buf, values }
}

/// An output filled with 0xFF (NaN for floats, an invalid bool) or 0xA5 (ints).
fn poisoned(stream: &Arc<CudaStream>, dims: &[i64], st: &[i64], dtype: DataType) -> Dev {
    let len = strided_len(&us(dims), &us(st)).max(1);
    let byte = if dtype.is_float() || dtype == Bool { 0xFF } else { 0xA5 };
    let buf = stream.clone_htod(&vec![byte; len * dtype.size()]).expect("alloc");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(stream, &buf, 0, dims, st, dtype) };
    Dev {
        t,
        m,
        buf,
        values: Vec::new(),
    }
}

fn download(stream: &Arc<CudaStream>, d: &Dev) -> Vec<f64> {
    let bytes = stream.clone_dtoh(&d.buf).expect("download");
    gather_from_strided(&decode(d.t.dtype(), &bytes), &us(d.t.dims()), &us(d.t.strides()))
}

/// Row-major index -> the broadcast input's logical index.
fn bcast_index(i: usize, out: &[i64], dims: &[i64]) -> usize {
    let lead = out.len() - dims.len();
    let (mut rem, mut idx, mut mul) = (i, 0usize, 1usize);
    for d in (0..out.len()).rev() {
        let c = rem % out[d] as usize;
        rem /= out[d] as usize;
        if d >= lead {
            let n = dims[d - lead] as usize;
            if n != 1 {
                idx += c * mul;
            }
            mul *= n;
        }
    }
    idx
}

fn bcast(d: &Dev, out: &[i64]) -> Vec<f64> {
    let n: i64 = out.iter().product();
    (0..n as usize)
        .map(|i| d.values[bcast_index(i, out, d.t.dims())])
        .collect()
}

// ---------------------------------------------------------------------------------------
// Layout cases

#[derive(Clone, Debug)]
struct Case {
    out: (Vec<i64>, Vec<i64>),
    ins: Vec<(Vec<i64>, Vec<i64>)>,
}

fn packed(dims: &[i64]) -> (Vec<i64>, Vec<i64>) {
    (dims.to_vec(), row_major_strides(dims).to_vec())
}

/// Strides of `dims` stored with the dim order reversed (a full transpose).
fn reversed(dims: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut s = vec![0i64; dims.len()];
    let mut acc = 1;
    for (d, &n) in dims.iter().enumerate() {
        s[d] = acc;
        acc *= n;
    }
    (dims.to_vec(), s)
}

/// Seven layouts; input `k` (0..3) of each case gets a different pattern.
fn cases() -> Vec<Case> {
    let p = packed;
    vec![
        Case {
            out: p(&[17]),
            ins: vec![p(&[17]), p(&[1]), p(&[17])],
        },
        Case {
            out: p(&[5, 7]),
            ins: vec![reversed(&[5, 7]), p(&[5, 7]), (vec![5, 7], vec![14, 2])],
        },
        Case {
            out: p(&[6, 9]),
            ins: vec![p(&[1, 9]), p(&[6, 1]), p(&[6, 9])],
        },
        Case {
            out: p(&[4, 3, 5]),
            ins: vec![p(&[3, 5]), p(&[4, 1, 5]), p(&[])],
        },
        Case {
            out: p(&[2, 3, 2, 3, 4]),
            ins: vec![reversed(&[2, 3, 2, 3, 4]), p(&[3, 1, 3, 4]), p(&[2, 3, 2, 3, 4])],
        },
        Case {
            out: (vec![3, 4], vec![8, 2]),
            ins: vec![reversed(&[3, 4]), p(&[4]), p(&[3, 1])],
        },
        Case {
            out: (vec![2, 3, 4, 5], strides(&[2, 3, 4, 5], Layout::Nhwc)),
            ins: vec![
                p(&[2, 3, 4, 5]),
                p(&[3, 1, 5]),
                (vec![2, 3, 4, 5], strides(&[2, 3, 4, 5], Layout::Nhwc)),
            ],
        },
    ]
}

fn numel(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

// ---------------------------------------------------------------------------------------
// Random inputs (never zero unless asked)

fn nonzero_f(rng: &mut SplitMix64, scale: f64) -> f64 {
    loop {
        let v = rng.next_f64() * scale;
        if v != 0.0 {
            return v;
        }
    }
}

/// A random nonzero value representable in `dtype` (ints in a dtype-friendly range).
fn rand_val(rng: &mut SplitMix64, dtype: DataType) -> f64 {
    match dtype {
        Bool => 1.0 - (rng.below(2) as f64), // bool: zeros are values
        U8 => 1.0 + rng.below(255) as f64,
        I8 => {
            let v = rng.below(200) as i64 - 100;
            if v == 0 {
                7.0
            } else {
                v as f64
            }
        }
        I32 | I64 => {
            let v = rng.below(2001) as i64 - 1000;
            if v == 0 {
                13.0
            } else {
                v as f64
            }
        }
        _ => nonzero_f(rng, 1.0),
    }
}

fn rand_vec(rng: &mut SplitMix64, n: usize, mut g: impl FnMut(&mut SplitMix64) -> f64) -> Vec<f64> {
    (0..n).map(|_| g(rng)).collect()
}

fn float_bound(dtype: DataType, transcendental: bool) -> f64 {
    match (dtype, transcendental) {
        (F32, false) => 1e-6,
        (F32, true) => 1e-5,
        (F64, _) => 1e-12,
        _ => 1e-2,
    }
}

// ---------------------------------------------------------------------------------------
// fill

#[test]
#[ignore = "needs a CUDA GPU"]
fn fill_every_dtype_and_layout() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "fill");
    let mut all = cases();
    all.push(Case {
        out: packed(&[1000, 1031]),
        ins: vec![],
    });
    for case in &all {
        for dtype in ALL {
            for value in [1.5, -2.75, 300.25] {
                let out = poisoned(&s, &case.out.0, &case.out.1, dtype);
                let name = format!("fill {dtype:?} {value} {:?}", case.out);
                if let Err(e) = ew::fill(&s, &out.m, value) {
                    r.error(name, e);
                    continue;
                }
                let got = download(&s, &out);
                r.exact_strict(name, dtype, &got, &vec![to_dtype(dtype, value); numel(&case.out.0)]);
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// copy / cast

#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_and_cast_every_dtype_pair() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "copy/cast");
    let mut rng = SplitMix64::new(11);
    for case in cases() {
        for src_t in ALL {
            for dst_t in ALL {
                let (dims, st) = &case.ins[0];
                let n = numel(dims);
                // Floats with fractions and magnitudes that wrap u8/i8; ints in range.
                let vals = rand_vec(&mut rng, n, |g| {
                    if src_t.is_float() {
                        nonzero_f(g, 300.0)
                    } else {
                        rand_val(g, src_t)
                    }
                });
                let src = upload(&s, &vals, dims, st, src_t);
                let dst = poisoned(&s, &case.out.0, &case.out.1, dst_t);
                let name = format!("copy {src_t:?}->{dst_t:?} {case:?}");
                if let Err(e) = ew::copy(&s, &src.t, &dst.m) {
                    r.error(name, e);
                    continue;
                }
                let want: Vec<f64> = bcast(&src, &case.out.0)
                    .into_iter()
                    .map(|v| to_dtype(dst_t, v))
                    .collect();
                r.exact_strict(name, dst_t, &download(&s, &dst), &want);
            }
        }
    }
    r.finish();
}

/// i64 values above 2^53 survive int -> int casts bit-exactly (no trip through f64).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cast_large_i64_exactly() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "cast i64");
    let big: Vec<i64> = vec![
        (1 << 62) + 12345,
        -(1 << 60) - 7,
        i64::MAX,
        i64::MIN + 3,
        (1 << 53) + 1,
        -((1 << 53) + 1),
        0x1234_5678_9abc_def1,
        -2,
    ];
    let bytes: Vec<u8> = big.iter().flat_map(|v| v.to_le_bytes()).collect();
    let src_buf = s.clone_htod(&bytes).expect("upload");
    let n = [big.len() as i64];
    let src = TensorRef::from_bytes(&src_buf, &s, I64, &n, &[1]).expect("view");
    for dst_t in [I64, I32, U8, I8, Bool] {
        let mut dst_buf = s.clone_htod(&vec![0xA5u8; big.len() * dst_t.size()]).expect("alloc");
        let name = format!("cast I64->{dst_t:?}");
        let dst = TensorMut::from_bytes(&mut dst_buf, &s, dst_t, &n, &[1]).expect("view");
        if let Err(e) = ew::copy(&s, &src, &dst) {
            r.error(name, e);
            continue;
        }
        drop(dst);
        let out = s.clone_dtoh(&dst_buf).expect("download");
        let got: Vec<i64> = out
            .chunks_exact(dst_t.size())
            .map(|c| match dst_t {
                I64 => i64::from_le_bytes(c.try_into().unwrap()),
                I32 => i32::from_le_bytes(c.try_into().unwrap()) as i64,
                I8 => c[0] as i8 as i64,
                _ => c[0] as i64,
            })
            .collect();
        let want: Vec<i64> = big
            .iter()
            .map(|&v| match dst_t {
                I64 => v,
                I32 => v as i32 as i64,
                I8 => v as i8 as i64,
                U8 => v as u8 as i64,
                _ => (v != 0) as i64,
            })
            .collect();
        let (g, w): (Vec<f64>, Vec<f64>) = got
            .iter()
            .zip(&want)
            .map(|(&g, &w)| if g == w { (0.0, 0.0) } else { (1.0, 0.0) })
            .unzip();
        r.exact_strict(format!("{name}: got {got:?}, want {want:?}"), dst_t, &g, &w);
    }
    // And back: i32 -> i64 sign-extends, f64 2^60 -> i64 exactly.
    let vals: Vec<f64> = vec![(1u64 << 60) as f64, -((1u64 << 55) as f64), 3.9, -3.9];
    let src = upload(&s, &vals, &[4], &[1], F64);
    let mut dst_buf = s.clone_htod(&[0u8; 32]).expect("alloc");
    let copied = ew::copy(
        &s,
        &src.t,
        &TensorMut::from_bytes(&mut dst_buf, &s, I64, &[4], &[1]).expect("view"),
    );
    match copied {
        Err(e) => r.error("cast F64->I64".into(), e),
        Ok(()) => {
            let out = s.clone_dtoh(&dst_buf).expect("download");
            let got: Vec<i64> = out
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let want = [1i64 << 60, -(1i64 << 55), 3, -3];
            let ok = got == want;
            r.exact_strict(
                format!("cast F64->I64: got {got:?}, want {want:?}"),
                I64,
                &[ok as u8 as f64],
                &[1.0],
            );
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// unary

const FLOAT_UNARY: [UnaryOp; 28] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Recip,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tan,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::Erf,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
    UnaryOp::Trunc,
    UnaryOp::Sign,
    UnaryOp::Square,
    UnaryOp::AddScalar(0.375),
    UnaryOp::MulScalar(-1.25),
    UnaryOp::PowScalar(1.7),
    UnaryOp::Clamp { min: -0.4, max: 0.55 },
    UnaryOp::LeakyRelu(0.125),
];

fn erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; use the series / continued fraction split.
    if x.abs() < 2.5 {
        // Maclaurin series: converges fast for |x| < 2.5.
        let mut sum = x;
        let mut term = x;
        let x2 = x * x;
        for n in 1..200 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction (Lentz) for larger |x|.
        let ax = x.abs();
        let mut f = ax;
        for k in (1..60).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        let erfc = (-ax * ax).exp() / (f * std::f64::consts::PI.sqrt());
        (1.0 - erfc).copysign(x)
    }
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tan => x.tan(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::Erf => erf(x),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Square => x * x,
        UnaryOp::AddScalar(s) => x + s,
        UnaryOp::MulScalar(s) => x * s,
        UnaryOp::PowScalar(p) => x.powf(p),
        UnaryOp::Clamp { min, max } => x.max(min).min(max),
        UnaryOp::LeakyRelu(a) => {
            if x < 0.0 {
                x * a
            } else {
                x
            }
        }
    }
}

fn unary_int_ref(op: UnaryOp, x: i64) -> i64 {
    let t = |v: f64| v as i64;
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Sign => x.signum(),
        UnaryOp::Square => x.wrapping_mul(x),
        UnaryOp::AddScalar(s) => x.wrapping_add(t(s)),
        UnaryOp::MulScalar(s) => x.wrapping_mul(t(s)),
        UnaryOp::Clamp { min, max } => x.max(t(min)).min(t(max)),
        _ => unreachable!(),
    }
}

/// Inputs suited to `op`'s domain, never zero.
fn unary_input(op: UnaryOp, g: &mut SplitMix64) -> f64 {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::PowScalar(_) => 0.05 + 2.0 * nonzero_f(g, 1.0).abs(),
        UnaryOp::Recip => {
            let v = nonzero_f(g, 1.0);
            v.signum() * (0.2 + v.abs())
        }
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => {
            // Multiples of 0.25 (exact in every float dtype): halves test ties-to-even.
            let k = g.below(41) as i64 - 20;
            if k == 0 {
                0.75
            } else {
                k as f64 * 0.25
            }
        }
        UnaryOp::Log1p => nonzero_f(g, 0.9),
        UnaryOp::Exp | UnaryOp::Expm1 | UnaryOp::Sigmoid | UnaryOp::Gelu | UnaryOp::Erf => nonzero_f(g, 3.0),
        _ => nonzero_f(g, 1.0),
    }
}

fn transcendental(op: UnaryOp) -> bool {
    !matches!(
        op,
        UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Recip
            | UnaryOp::Relu
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Trunc
            | UnaryOp::Sign
            | UnaryOp::Square
            | UnaryOp::AddScalar(_)
            | UnaryOp::MulScalar(_)
            | UnaryOp::Clamp { .. }
            | UnaryOp::LeakyRelu(_)
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn unary_every_op_and_dtype() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "unary");
    let mut rng = SplitMix64::new(22);
    for case in cases() {
        let (dims, st) = &case.ins[0];
        let n = numel(dims);
        for dtype in FLOATS {
            for op in FLOAT_UNARY {
                let vals = rand_vec(&mut rng, n, |g| unary_input(op, g));
                let x = upload(&s, &vals, dims, st, dtype);
                let out = poisoned(&s, &case.out.0, &case.out.1, dtype);
                let name = format!("unary {op:?} {dtype:?} {case:?}");
                if let Err(e) = ew::unary(&s, op, &x.t, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let want: Vec<f64> = bcast(&x, &case.out.0).into_iter().map(|v| unary_ref(op, v)).collect();
                let got = download(&s, &out);
                r.close(name, dtype, &got, &want, float_bound(dtype, transcendental(op)));
            }
        }
        for dtype in INTS {
            let clamp = if dtype == U8 {
                UnaryOp::Clamp { min: 20.9, max: 200.2 }
            } else {
                UnaryOp::Clamp { min: -50.5, max: 60.7 }
            };
            for op in [
                UnaryOp::Neg,
                UnaryOp::Abs,
                UnaryOp::Sign,
                UnaryOp::Square,
                UnaryOp::AddScalar(3.7),
                UnaryOp::MulScalar(-2.0),
                clamp,
            ] {
                let vals = rand_vec(&mut rng, n, |g| rand_val(g, dtype));
                let x = upload(&s, &vals, dims, st, dtype);
                let out = poisoned(&s, &case.out.0, &case.out.1, dtype);
                let name = format!("unary {op:?} {dtype:?} {case:?}");
                if let Err(e) = ew::unary(&s, op, &x.t, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let want: Vec<f64> = bcast(&x, &case.out.0)
                    .into_iter()
                    .map(|v| wrap(dtype, unary_int_ref(op, v as i64)))
                    .collect();
                r.exact_strict(name, dtype, &download(&s, &out), &want);
            }
        }
    }
    // Ops an int dtype does not support are refused.
    let x = upload(&s, &[1.0, 2.0], &[2], &[1], I32);
    if ew::unary(&s, UnaryOp::Exp, &x.t, &x.m).is_ok() {
        r.note_failure("unary Exp on I32 was accepted".into());
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// binary

const FLOAT_BINARY: [BinaryOp; 11] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Rem,
    BinaryOp::Pow,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Atan2,
    BinaryOp::ReluBackward,
    BinaryOp::GeluBackward,
];
const INT_BINARY: [BinaryOp; 11] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Rem,
    BinaryOp::Pow,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::BitAnd,
    BinaryOp::BitOr,
    BinaryOp::BitXor,
];

fn binary_ref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Rem => {
            let r = a % b;
            if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                r + b
            } else {
                r
            }
        }
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Atan2 => a.atan2(b),
        BinaryOp::ReluBackward => {
            if b <= 0.0 {
                0.0
            } else {
                a
            }
        }
        BinaryOp::GeluBackward => {
            let x2 = b * b;
            let t = (b * (0.0356774 * x2 + 0.797885)).tanh();
            let inner2 = b * (0.0535161 * x2 + 0.398942);
            a * (0.5 * t + (inner2 * (1.0 - t * t) + 0.5))
        }
        _ => unreachable!(),
    }
}

fn ipow(a: i64, e: i64) -> i64 {
    if e < 0 {
        return match a {
            1 => 1,
            -1 => {
                if e & 1 == 1 {
                    -1
                } else {
                    1
                }
            }
            _ => 0,
        };
    }
    let mut r = 1i64;
    for _ in 0..e {
        r = r.wrapping_mul(a);
    }
    r
}

fn binary_int_ref(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::Rem => {
            if b == 0 {
                0
            } else {
                let r = a.wrapping_rem(b);
                if r != 0 && ((r < 0) != (b < 0)) {
                    r + b
                } else {
                    r
                }
            }
        }
        BinaryOp::Pow => ipow(a, b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::BitAnd => a & b,
        BinaryOp::BitOr => a | b,
        BinaryOp::BitXor => a ^ b,
        BinaryOp::Atan2 | BinaryOp::ReluBackward | BinaryOp::GeluBackward => unreachable!(),
    }
}

fn binary_inputs(op: BinaryOp, dtype: DataType, g: &mut SplitMix64) -> (f64, f64) {
    if dtype.is_float() {
        let a = nonzero_f(g, 2.0);
        let b = nonzero_f(g, 1.0);
        match op {
            BinaryOp::Pow => (0.05 + a.abs(), b * 2.0),
            BinaryOp::Div | BinaryOp::Rem => (a, b.signum() * (0.25 + b.abs())),
            _ => (a, b),
        }
    } else if dtype == Bool {
        (rand_val(g, Bool), rand_val(g, Bool))
    } else {
        match op {
            BinaryOp::Pow => {
                let base = g.below(9) as f64 - 4.0;
                let e = g.below(9) as f64 - 3.0;
                if dtype == U8 {
                    (base.abs() + 1.0, e.abs())
                } else {
                    (if base == 0.0 { 3.0 } else { base }, e)
                }
            }
            // Include division by zero (must give 0, not trap).
            BinaryOp::Div | BinaryOp::Rem => {
                let a = rand_val(g, dtype);
                let b = if g.below(8) == 0 {
                    0.0
                } else {
                    let v = rand_val(g, dtype);
                    if dtype == U8 {
                        v % 17.0 + 1.0
                    } else {
                        v % 37.0 + if v < 0.0 { -1.0 } else { 1.0 }
                    }
                };
                (a, b)
            }
            _ => (rand_val(g, dtype), rand_val(g, dtype)),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn binary_every_op_and_dtype() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "binary");
    let mut rng = SplitMix64::new(33);
    let mut all = cases();
    all.push(Case {
        out: packed(&[1000, 1031]),
        ins: vec![packed(&[1000, 1031]), packed(&[1031])],
    });
    for (ci, case) in all.iter().enumerate() {
        let big = ci == all.len() - 1;
        for dtype in ALL {
            if big && dtype != F32 {
                continue;
            }
            let ops: &[BinaryOp] = match dtype {
                _ if dtype.is_float() => &FLOAT_BINARY,
                Bool => &[BinaryOp::BitAnd, BinaryOp::BitOr, BinaryOp::BitXor],
                _ => &INT_BINARY,
            };
            for &op in ops {
                if big && op != BinaryOp::Add {
                    continue;
                }
                let (da, sa) = &case.ins[0];
                let (db, sb) = &case.ins[1];
                let (na, nb) = (numel(da), numel(db));
                // Draw pairs, then split: a's and b's values from one generator call.
                let pairs: Vec<(f64, f64)> = (0..na.max(nb)).map(|_| binary_inputs(op, dtype, &mut rng)).collect();
                let av: Vec<f64> = pairs[..na].iter().map(|p| p.0).collect();
                let bv: Vec<f64> = pairs[..nb].iter().map(|p| p.1).collect();
                let a = upload(&s, &av, da, sa, dtype);
                let b = upload(&s, &bv, db, sb, dtype);
                let out = poisoned(&s, &case.out.0, &case.out.1, dtype);
                let name = format!("binary {op:?} {dtype:?}");
                if let Err(e) = ew::binary(&s, op, &a.t, &b.t, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let (ab, bb) = (bcast(&a, &case.out.0), bcast(&b, &case.out.0));
                let got = download(&s, &out);
                if dtype.is_float() {
                    let want: Vec<f64> = ab.iter().zip(&bb).map(|(&x, &y)| binary_ref(op, x, y)).collect();
                    let tr = matches!(op, BinaryOp::Pow | BinaryOp::Atan2 | BinaryOp::GeluBackward);
                    r.close(format!("{name} {case:?}"), dtype, &got, &want, float_bound(dtype, tr));
                } else {
                    let want: Vec<f64> = ab
                        .iter()
                        .zip(&bb)
                        .map(|(&x, &y)| wrap(dtype, binary_int_ref(op, x as i64, y as i64)))
                        .collect();
                    r.exact_strict(format!("{name} {case:?}"), dtype, &got, &want);
                }
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// binary and compare with a scalar passed by value

#[test]
#[ignore = "needs a CUDA GPU"]
fn scalar_operands_every_op_and_dtype() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "scalar");
    let mut rng = SplitMix64::new(35);
    let compares = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];
    for case in cases() {
        for dtype in ALL {
            let ops: &[BinaryOp] = match dtype {
                _ if dtype.is_float() => &FLOAT_BINARY,
                Bool => &[BinaryOp::BitAnd, BinaryOp::BitOr, BinaryOp::BitXor],
                _ => &INT_BINARY,
            };
            let (da, sa) = &case.ins[0];
            for &op in ops {
                let pairs: Vec<(f64, f64)> = (0..numel(da)).map(|_| binary_inputs(op, dtype, &mut rng)).collect();
                let av: Vec<f64> = pairs.iter().map(|p| p.0).collect();
                // An unrounded scalar: the kernel must round it to the dtype first.
                let scalar = pairs.first().map_or(0.5, |p| p.1) * if dtype.is_float() { 1.0001 } else { 1.0 };
                let a = upload(&s, &av, da, sa, dtype);
                let out = poisoned(&s, &case.out.0, &case.out.1, dtype);
                let name = format!("binary_scalar {op:?} {dtype:?} s={scalar}");
                if let Err(e) = ew::binary_scalar(&s, op, &a.t, scalar, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let ab = bcast(&a, &case.out.0);
                let sv = to_dtype(dtype, scalar);
                let got = download(&s, &out);
                if dtype.is_float() {
                    let want: Vec<f64> = ab.iter().map(|&x| binary_ref(op, x, sv)).collect();
                    let tr = matches!(op, BinaryOp::Pow | BinaryOp::Atan2 | BinaryOp::GeluBackward);
                    r.close(format!("{name} {case:?}"), dtype, &got, &want, float_bound(dtype, tr));
                } else {
                    let want: Vec<f64> = ab
                        .iter()
                        .map(|&x| wrap(dtype, binary_int_ref(op, x as i64, sv as i64)))
                        .collect();
                    r.exact_strict(format!("{name} {case:?}"), dtype, &got, &want);
                }
            }
            for op in compares {
                let draw = |g: &mut SplitMix64| -> f64 {
                    if dtype.is_float() && g.below(10) == 0 {
                        f64::NAN
                    } else if dtype == Bool {
                        g.below(2) as f64
                    } else {
                        g.below(4) as f64 - if dtype == U8 { 0.0 } else { 2.0 }
                            + if dtype.is_float() { 0.5 } else { 0.0 }
                    }
                };
                let av: Vec<f64> = (0..numel(da)).map(|_| draw(&mut rng)).collect();
                let scalar = draw(&mut rng);
                let a = upload(&s, &av, da, sa, dtype);
                let out = poisoned(&s, &case.out.0, &case.out.1, Bool);
                let name = format!("compare_scalar {op:?} {dtype:?} s={scalar}");
                if let Err(e) = ew::compare_scalar(&s, op, &a.t, scalar, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let sv = to_dtype(dtype, scalar);
                let want: Vec<f64> = bcast(&a, &case.out.0)
                    .iter()
                    .map(|&x| {
                        (match op {
                            CompareOp::Eq => x == sv,
                            CompareOp::Ne => x != sv,
                            CompareOp::Lt => x < sv,
                            CompareOp::Le => x <= sv,
                            CompareOp::Gt => x > sv,
                            CompareOp::Ge => x >= sv,
                        }) as u8 as f64
                    })
                    .collect();
                r.exact_strict(format!("{name} {case:?}"), Bool, &download(&s, &out), &want);
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// compare

#[test]
#[ignore = "needs a CUDA GPU"]
fn compare_every_op_and_dtype() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "compare");
    let mut rng = SplitMix64::new(44);
    let ops = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];
    for case in cases() {
        for dtype in ALL {
            for op in ops {
                for out_t in [Bool, U8] {
                    if out_t == U8 && op != CompareOp::Le {
                        continue;
                    }
                    // Few distinct values so that equality happens; NaN for floats.
                    let mut draw = |g: &mut SplitMix64| -> f64 {
                        if dtype.is_float() {
                            if g.below(10) == 0 {
                                f64::NAN
                            } else {
                                (g.below(8) as f64 - 3.5) * 0.5
                            }
                        } else if dtype == Bool {
                            g.below(2) as f64
                        } else {
                            1.0 + g.below(4) as f64 - if dtype == U8 { 0.0 } else { 2.0 }
                        }
                    };
                    let (da, sa) = &case.ins[0];
                    let (db, sb) = &case.ins[1];
                    let av = rand_vec(&mut rng, numel(da), &mut draw);
                    let bv = rand_vec(&mut rng, numel(db), &mut draw);
                    let a = upload(&s, &av, da, sa, dtype);
                    let b = upload(&s, &bv, db, sb, dtype);
                    let out = poisoned(&s, &case.out.0, &case.out.1, out_t);
                    let name = format!("compare {op:?} {dtype:?}->{out_t:?} {case:?}");
                    if let Err(e) = ew::compare(&s, op, &a.t, &b.t, &out.m) {
                        r.error(name, e);
                        continue;
                    }
                    let want: Vec<f64> = bcast(&a, &case.out.0)
                        .iter()
                        .zip(bcast(&b, &case.out.0))
                        .map(|(&x, y)| {
                            (match op {
                                CompareOp::Eq => x == y,
                                CompareOp::Ne => x != y,
                                CompareOp::Lt => x < y,
                                CompareOp::Le => x <= y,
                                CompareOp::Gt => x > y,
                                CompareOp::Ge => x >= y,
                            }) as u8 as f64
                        })
                        .collect();
                    r.exact_strict(name, dtype, &download(&s, &out), &want);
                }
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// where

#[test]
#[ignore = "needs a CUDA GPU"]
fn where_every_dtype() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "where");
    let mut rng = SplitMix64::new(55);
    for case in cases() {
        for dtype in ALL {
            for cond_t in [Bool, U8] {
                if cond_t == U8 && !matches!(dtype, F32 | I64) {
                    continue;
                }
                // Operand order: cond takes pattern 1, a pattern 0, b pattern 2.
                let (dc, sc) = &case.ins[1];
                let (da, sa) = &case.ins[0];
                let (db, sb) = &case.ins[2];
                let cv = rand_vec(&mut rng, numel(dc), |g| {
                    if cond_t == U8 {
                        g.below(4) as f64 // 0..3: any nonzero is true
                    } else {
                        g.below(2) as f64
                    }
                });
                let av = rand_vec(&mut rng, numel(da), |g| rand_val(g, dtype));
                let bv = rand_vec(&mut rng, numel(db), |g| rand_val(g, dtype));
                let c = upload(&s, &cv, dc, sc, cond_t);
                let a = upload(&s, &av, da, sa, dtype);
                let b = upload(&s, &bv, db, sb, dtype);
                let out = poisoned(&s, &case.out.0, &case.out.1, dtype);
                let name = format!("where {dtype:?} cond {cond_t:?} {case:?}");
                if let Err(e) = ew::where_(&s, &c.t, &a.t, &b.t, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let (cb, ab, bb) = (bcast(&c, &case.out.0), bcast(&a, &case.out.0), bcast(&b, &case.out.0));
                let want: Vec<f64> = (0..cb.len())
                    .map(|i| if cb[i] != 0.0 { ab[i] } else { bb[i] })
                    .collect();
                r.exact_strict(name, dtype, &download(&s, &out), &want);
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// Generated fused programs (`kernels::fused`) in every launch variant

/// A view of `d` that starts `k` elements into its buffer (a misaligned start for vector
/// accesses), holding `values[k..]` of a packed rank-1 upload.
fn shifted(d: &Dev, k: usize) -> (TensorRef<'static>, Vec<f64>) {
    let n = d.t.dims()[0] - k as i64;
    let t = d.t.view(k as i64, &[n], &[1]).expect("shifted view");
    (t, d.values[k..].to_vec())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_programs_match_the_host_in_every_launch_variant() {
    use cudnn_backend::kernels::fused::{self, FusedLaunch, FusedOp, Program, Value};
    let s = stream();
    let mut rng = SplitMix64::new(41);
    // y = (x + b > 0.25 || m) ? tanh(x + b) : -3, stored in the float dtype; the condition
    // stored as bools.
    let program = |dtype: DataType| Program {
        inputs: vec![dtype, dtype, Bool],
        scalars: 2,
        ops: vec![
            FusedOp::Binary(BinaryOp::Add, Value::Input(0), Value::Input(1)),
            FusedOp::unary(UnaryOp::Tanh, Value::Reg(0)).unwrap(),
            FusedOp::Compare(CompareOp::Gt, Value::Reg(0), Value::Scalar(0)),
            FusedOp::Or(Value::Reg(2), Value::Input(2)),
            FusedOp::Select(Value::Reg(3), Value::Reg(1), Value::Scalar(1)),
        ],
        outputs: vec![(4, dtype), (3, Bool)],
        ..Program::default()
    };
    // (what it covers, out dims, x dims + strides, b dims, m dims, dtype, x shifted by one)
    type Case = (
        &'static str,
        Vec<i64>,
        (Vec<i64>, Vec<i64>),
        Vec<i64>,
        Vec<i64>,
        DataType,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            "bias rows, 8 per step",
            vec![64, 96],
            packed(&[64, 96]),
            vec![96],
            vec![64, 1],
            BF16,
            false,
        ),
        (
            "bias rows f32",
            vec![64, 96],
            packed(&[64, 96]),
            vec![96],
            vec![64, 1],
            F32,
            false,
        ),
        (
            "inner dim 7: 1 per step",
            vec![33, 7],
            packed(&[33, 7]),
            vec![7],
            vec![33, 7],
            F16,
            false,
        ),
        (
            "transposed input gathers",
            vec![8, 16],
            (vec![8, 16], vec![1, 8]),
            vec![16],
            vec![8, 16],
            F32,
            false,
        ),
        (
            "rank 3, middle broadcast",
            vec![4, 5, 16],
            packed(&[4, 5, 16]),
            vec![4, 1, 16],
            vec![1, 5, 1],
            BF16,
            false,
        ),
        (
            "misaligned input start",
            vec![128],
            packed(&[129]),
            vec![128],
            vec![128],
            BF16,
            true,
        ),
        ("one element", vec![], packed(&[]), vec![], vec![], F32, false),
        (
            "many grid steps",
            vec![3, 70_000],
            packed(&[3, 70_000]),
            vec![70_000],
            vec![3, 1],
            F16,
            false,
        ),
    ];
    let mut failures = Vec::new();
    for (what, out_dims, (x_dims, x_st), b_dims, m_dims, dtype, shift) in cases {
        let p = program(dtype);
        let x = upload(
            &s,
            &rand_vec(&mut rng, numel(&x_dims), |g| g.next_f64() * 2.0 - 1.0),
            &x_dims,
            &x_st,
            dtype,
        );
        let (x_ref, x_vals) = if shift {
            shifted(&x, 1)
        } else {
            (x.t.clone(), x.values.clone())
        };
        let b = upload(
            &s,
            &rand_vec(&mut rng, numel(&b_dims), |g| g.next_f64() - 0.5),
            &b_dims,
            &packed(&b_dims).1,
            dtype,
        );
        let m = upload(
            &s,
            &rand_vec(&mut rng, numel(&m_dims), |g| (g.below(5) == 0) as u8 as f64),
            &m_dims,
            &packed(&m_dims).1,
            Bool,
        );
        let out_st = packed(&out_dims).1;
        let y = poisoned(&s, &out_dims, &out_st, dtype);
        let c = poisoned(&s, &out_dims, &out_st, Bool);
        let inputs = [x_ref.clone(), b.t.clone(), m.t.clone()];
        let outputs = [
            y.m.reshaped_mut(y.t.dims(), y.t.strides()).expect("view"),
            c.m.reshaped_mut(c.t.dims(), c.t.strides()).expect("view"),
        ];
        let variant = FusedLaunch::new(&p, &inputs, &outputs, &[0.25, -3.0])
            .expect("launch")
            .variant();
        fused::run(&s, &p, &inputs, &outputs, &[0.25, -3.0]).expect("fused run");
        let xb: Vec<f64> = (0..numel(&out_dims))
            .map(|i| x_vals[bcast_index(i, &out_dims, x_ref.dims())])
            .collect();
        let (bb, mb) = (bcast(&b, &out_dims), bcast(&m, &out_dims));
        let mut want_y = Vec::with_capacity(xb.len());
        let mut want_c = Vec::with_capacity(xb.len());
        for i in 0..xb.len() {
            // The sum in f32 as the kernel computes it, so the comparison agrees exactly.
            let sum = (xb[i] as f32 + bb[i] as f32) as f64;
            let cond = sum > 0.25 || mb[i] != 0.0;
            want_c.push(cond as u8 as f64);
            want_y.push(to_dtype(dtype, if cond { sum.tanh() } else { -3.0 }));
        }
        let (got_y, got_c) = (download(&s, &y), download(&s, &c));
        let tol = if dtype == F32 { 1e-6 } else { 1e-2 };
        let err = rel_l2_error(&got_y, &want_y);
        // A NaN error fails too.
        if err.is_nan() || err > tol || got_c != want_c {
            failures.push(format!(
                "{what} ({dtype:?}, {variant:?}): rel L2 {err:.2e} (bound {tol:.0e}), bools equal: {}",
                got_c == want_c
            ));
        }
        println!("{what}: {variant:?}, rel L2 {err:.2e}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Vector kernels (`unary_vec_<dt>`, `binary_vec_<dt>`, `binary_scalar_vec_<dt>`): the layouts
// that take them, the ones that fall back, and bit-equality with the scalar kernels

/// Poisoned elements after every placed view.
const PAD: usize = 8;

/// A view starting `offset` elements into its own buffer; every element of the buffer
/// outside the view holds 0xFF bytes (NaN for floats).
struct Placed {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
    /// Logical values (already rounded to the dtype); empty for an output.
    values: Vec<f64>,
    offset: usize,
}

/// Buffer positions of the view's elements in row-major logical order (strides >= 0).
fn positions(dims: &[i64], st: &[i64], offset: usize) -> Vec<usize> {
    (0..numel(dims))
        .map(|i| {
            let (mut rem, mut p) = (i as i64, offset as i64);
            for d in (0..dims.len()).rev() {
                p += rem % dims[d] * st[d];
                rem /= dims[d];
            }
            p as usize
        })
        .collect()
}

/// `values` (rounded to `dtype`) as a view `dims`/`st` placed `offset` elements into a
/// poisoned buffer; no values: a poisoned output.
fn place(stream: &Arc<CudaStream>, values: &[f64], dims: &[i64], st: &[i64], dtype: DataType, offset: usize) -> Placed {
    let values: Vec<f64> = values.iter().map(|&v| to_dtype(dtype, v)).collect();
    let pos = positions(dims, st, offset);
    let len = pos.iter().max().map_or(offset + 1, |&p| p + 1) + PAD;
    let size = dtype.size();
    let mut bytes = vec![0xFFu8; len * size];
    for (&p, &v) in pos.iter().zip(&values) {
        bytes[p * size..(p + 1) * size].copy_from_slice(&encode(dtype, &[v]));
    }
    let buf = stream.clone_htod(&bytes).expect("upload");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(stream, &buf, offset * size, dims, st, dtype) };
    Placed {
        t,
        m,
        buf,
        values,
        offset,
    }
}

/// The view's values, and whether every element outside it still holds its poison.
fn read_placed(stream: &Arc<CudaStream>, p: &Placed) -> (Vec<f64>, bool) {
    let bytes = stream.clone_dtoh(&p.buf).expect("download");
    let size = p.t.dtype().size();
    let pos = positions(p.t.dims(), p.t.strides(), p.offset);
    let mut inside = vec![false; bytes.len() / size];
    for &q in &pos {
        inside[q] = true;
    }
    let values = pos
        .iter()
        .map(|&q| decode(p.t.dtype(), &bytes[q * size..(q + 1) * size])[0])
        .collect();
    let untouched = bytes
        .chunks_exact(size)
        .zip(&inside)
        .all(|(c, &i)| i || c.iter().all(|&b| b == 0xFF));
    (values, untouched)
}

/// `p`'s values broadcast to `out` dims.
fn placed_bcast(p: &Placed, out: &[i64]) -> Vec<f64> {
    (0..numel(out))
        .map(|i| p.values[bcast_index(i, out, p.t.dims())])
        .collect()
}

/// Equal values, NaN equal to NaN (the vector and scalar kernels must agree bit for bit).
fn same_values(x: &[f64], y: &[f64]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()))
}

/// A view: dims, strides, offset in elements.
type View = (Vec<i64>, Vec<i64>, usize);

fn at(dims: &[i64], st: &[i64], offset: usize) -> View {
    (dims.to_vec(), st.to_vec(), offset)
}

fn packed_at(dims: &[i64], offset: usize) -> View {
    let (d, s) = packed(dims);
    (d, s, offset)
}

struct VecCase {
    what: &'static str,
    out: View,
    a: View,
    b: View,
    /// Elements per thread step expected for the dtype's widest step (16 bytes).
    vec: fn(u32) -> u32,
    /// A large tensor (one op per family, bf16 and f32): several grid-stride steps.
    big: bool,
}

fn vec_cases() -> Vec<VecCase> {
    let case = |what, out, a, b, vec: fn(u32) -> u32| VecCase {
        what,
        out,
        a,
        b,
        vec,
        big: false,
    };
    let (r, c) = (48, 64);
    vec![
        case(
            "contiguous",
            packed_at(&[r, c], 0),
            packed_at(&[r, c], 0),
            packed_at(&[r, c], 0),
            |m| m,
        ),
        case(
            "bias along rows",
            packed_at(&[r, c], 0),
            packed_at(&[r, c], 0),
            packed_at(&[c], 0),
            |m| m,
        ),
        case(
            "broadcast scalar a",
            packed_at(&[r, c], 0),
            packed_at(&[1], 1),
            packed_at(&[r, c], 0),
            |m| m,
        ),
        case(
            "column broadcast a",
            packed_at(&[r, c], 0),
            packed_at(&[r, 1], 1),
            packed_at(&[r, c], 0),
            |m| m,
        ),
        case(
            "rank 3, middle broadcast",
            packed_at(&[4, 5, 16], 0),
            packed_at(&[4, 5, 16], 0),
            packed_at(&[4, 1, 16], 0),
            |m| m,
        ),
        case(
            "gapped rows (72, 80)",
            at(&[r, c], &[80, 1], 0),
            at(&[r, c], &[72, 1], 0),
            packed_at(&[c], 0),
            |m| m,
        ),
        case(
            "input row stride 68",
            packed_at(&[r, c], 0),
            at(&[r, c], &[68, 1], 0),
            packed_at(&[c], 0),
            |m| m.min(4),
        ),
        case(
            "input 2 elements in",
            packed_at(&[r, c], 0),
            packed_at(&[r, c], 2),
            packed_at(&[r, c], 0),
            |m| m.min(2),
        ),
        case(
            "misaligned input (1 element in)",
            packed_at(&[r, c], 0),
            packed_at(&[r, c], 1),
            packed_at(&[r, c], 0),
            |_| 1,
        ),
        case(
            "misaligned output (1 element in)",
            packed_at(&[r, c], 1),
            packed_at(&[r, c], 0),
            packed_at(&[c], 0),
            |_| 1,
        ),
        // Input rows 8 apart: the dims stay apart (packed ones would merge into one dim).
        case(
            "inner dim 7",
            packed_at(&[33, 7], 0),
            at(&[33, 7], &[8, 1], 0),
            packed_at(&[7], 0),
            |_| 1,
        ),
        case(
            "inner dim 6",
            packed_at(&[40, 6], 0),
            at(&[40, 6], &[8, 1], 0),
            packed_at(&[6], 0),
            |m| m.min(2),
        ),
        case(
            "transposed input",
            packed_at(&[r, c], 0),
            at(&[r, c], &[1, r], 0),
            packed_at(&[c], 0),
            |_| 1,
        ),
        VecCase {
            big: true,
            ..case(
                "many grid steps",
                packed_at(&[4096, 1280], 0),
                packed_at(&[4096, 1280], 0),
                packed_at(&[1280], 0),
                |m| m,
            )
        },
    ]
}

/// One launch into an aligned output and one into the same output placed at an odd element
/// offset (which takes the scalar kernel): checks the expected step, the host reference,
/// bit-equality of the two and that nothing outside either output view was written.
struct VecRun<'a> {
    s: &'a Arc<CudaStream>,
    r: &'a mut KernelReport,
    case: &'a VecCase,
    dtype: DataType,
}

impl VecRun<'_> {
    fn check(
        &mut self,
        name: String,
        inputs: &[&TensorRef],
        launch: &dyn Fn(&TensorMut) -> cudnn_backend::Result<()>,
        want: &[f64],
        bound: f64,
    ) {
        let (dims, st, offset) = &self.case.out;
        let out = place(self.s, &[], dims, st, self.dtype, *offset);
        let odd = if offset % 2 == 0 { offset + 1 } else { offset + 2 };
        let scalar_out = place(self.s, &[], dims, st, self.dtype, odd);
        let widest = 16 / self.dtype.size() as u32;
        let want_vec = (self.case.vec)(widest);
        let got_vec = ew::vector_width(inputs, &out.t).expect("vector_width");
        if got_vec != want_vec {
            self.r
                .note_failure(format!("{name}: {got_vec} elements per step, expected {want_vec}"));
        }
        if ew::vector_width(inputs, &scalar_out.t).expect("vector_width") != 1 {
            self.r.note_failure(format!("{name}: the odd output vectorizes"));
        }
        for o in [&out, &scalar_out] {
            if let Err(e) = launch(&o.m) {
                self.r.error(name.clone(), e);
                return;
            }
        }
        let (got, untouched) = read_placed(self.s, &out);
        let (scalar, scalar_untouched) = read_placed(self.s, &scalar_out);
        if !untouched || !scalar_untouched {
            self.r.note_failure(format!(
                "{name}: wrote outside the output view (vector launch {}, scalar launch {})",
                !untouched, !scalar_untouched
            ));
        }
        if !same_values(&got, &scalar) {
            let i = got.iter().zip(&scalar).position(|(a, b)| a != b).unwrap_or(0);
            self.r.note_failure(format!(
                "{name}: the {got_vec}-wide kernel differs from the scalar one at {i}: {} vs {}",
                got.get(i).copied().unwrap_or(f64::NAN),
                scalar.get(i).copied().unwrap_or(f64::NAN)
            ));
        }
        self.r.close(name, self.dtype, &got, want, bound);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vector_kernels_match_the_host_and_the_scalar_kernels() {
    let s = stream();
    let mut r = KernelReport::new("elementwise", "vector");
    let mut rng = SplitMix64::new(66);
    let unary_ops = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Gelu,
        UnaryOp::Clamp { min: -0.4, max: 0.55 },
        UnaryOp::Sin,
        UnaryOp::Round,
        UnaryOp::PowScalar(1.7),
    ];
    let binary_ops = [
        BinaryOp::Add,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::GeluBackward,
        BinaryOp::Pow,
        BinaryOp::Rem,
        BinaryOp::Atan2,
    ];
    let scalar_ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Max,
        BinaryOp::Pow,
        BinaryOp::Rem,
    ];
    for case in vec_cases() {
        for dtype in FLOATS {
            if case.big && !matches!(dtype, BF16 | F32) {
                continue;
            }
            let out_dims = case.out.0.clone();
            let (ad, ast, aoff) = &case.a;
            let (bd, bst, boff) = &case.b;
            let mut run = VecRun {
                s: &s,
                r: &mut r,
                case: &case,
                dtype,
            };
            for op in unary_ops {
                if case.big && op != UnaryOp::Neg {
                    continue;
                }
                let vals = rand_vec(&mut rng, numel(ad), |g| unary_input(op, g));
                let a = place(&s, &vals, ad, ast, dtype, *aoff);
                let want: Vec<f64> = placed_bcast(&a, &out_dims)
                    .into_iter()
                    .map(|v| unary_ref(op, v))
                    .collect();
                run.check(
                    format!("unary {op:?} {dtype:?} {}", case.what),
                    &[&a.t],
                    &|o| ew::unary(&s, op, &a.t, o),
                    &want,
                    float_bound(dtype, transcendental(op)),
                );
            }
            for op in binary_ops {
                if case.big && op != BinaryOp::Add {
                    continue;
                }
                let (na, nb) = (numel(ad), numel(bd));
                let pairs: Vec<(f64, f64)> = (0..na.max(nb)).map(|_| binary_inputs(op, dtype, &mut rng)).collect();
                let av: Vec<f64> = pairs[..na].iter().map(|p| p.0).collect();
                let bv: Vec<f64> = pairs[..nb].iter().map(|p| p.1).collect();
                let a = place(&s, &av, ad, ast, dtype, *aoff);
                let b = place(&s, &bv, bd, bst, dtype, *boff);
                let want: Vec<f64> = placed_bcast(&a, &out_dims)
                    .iter()
                    .zip(placed_bcast(&b, &out_dims))
                    .map(|(&x, y)| binary_ref(op, x, y))
                    .collect();
                let tr = matches!(op, BinaryOp::Pow | BinaryOp::Atan2 | BinaryOp::GeluBackward);
                run.check(
                    format!("binary {op:?} {dtype:?} {}", case.what),
                    &[&a.t, &b.t],
                    &|o| ew::binary(&s, op, &a.t, &b.t, o),
                    &want,
                    float_bound(dtype, tr),
                );
            }
            for op in scalar_ops {
                if case.big && op != BinaryOp::Sub {
                    continue;
                }
                let pairs: Vec<(f64, f64)> = (0..numel(ad)).map(|_| binary_inputs(op, dtype, &mut rng)).collect();
                let av: Vec<f64> = pairs.iter().map(|p| p.0).collect();
                // An unrounded scalar: the kernels round it to the dtype first.
                let scalar = pairs[0].1 * 1.0001;
                let a = place(&s, &av, ad, ast, dtype, *aoff);
                let sv = to_dtype(dtype, scalar);
                let want: Vec<f64> = placed_bcast(&a, &out_dims)
                    .into_iter()
                    .map(|x| binary_ref(op, x, sv))
                    .collect();
                run.check(
                    format!("binary_scalar {op:?} {dtype:?} s={scalar} {}", case.what),
                    &[&a.t],
                    &|o| ew::binary_scalar(&s, op, &a.t, scalar, o),
                    &want,
                    float_bound(dtype, op == BinaryOp::Pow),
                );
            }
        }
    }
    r.finish();
}
