//! The random kernels (`cudnn_backend::kernels::random`) against the CPU Philox4x32-10
//! reference: bit-for-bit equality where the CPU can mirror the arithmetic exactly
//! (uniform in every float dtype, bernoulli, uniform_int), close agreement for normal,
//! reproducibility from (seed, offset), and statistics on 1e6 samples, on packed,
//! transposed, gapped and scalar outputs in every supported dtype, with poisoned outputs
//! (gaps must stay poisoned). Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::random::{self as rnd, Philox};
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::rel_l2_error;
use half::{bf16, f16};
use integration_tests::views_of;

use DataType::*;

const ALL: [DataType; 9] = [F32, F16, BF16, F64, I32, I64, U8, I8, Bool];
const FLOATS: [DataType; 4] = [F32, F16, BF16, F64];
const INTS: [DataType; 4] = [I64, I32, I8, U8];
const POISON: u8 = 0xA5;
const BIG: i64 = 1_000_000;

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

// ---------------------------------------------------------------------------------------
// Outputs read back as raw bit patterns

struct Out {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
    /// Element offset of every logical (row-major) index.
    offsets: Vec<usize>,
    /// Buffer length in elements.
    len: usize,
}

/// Element offsets of the row-major logical indices of `dims` under `strides` (>= 0).
fn offsets(dims: &[i64], strides: &[i64]) -> Vec<usize> {
    let n: i64 = dims.iter().product();
    (0..n)
        .map(|mut i| {
            let mut off = 0i64;
            for d in (0..dims.len()).rev() {
                off += (i % dims[d]) * strides[d];
                i /= dims[d];
            }
            off as usize
        })
        .collect()
}

/// A poisoned output (every byte 0xA5).
fn alloc(stream: &Arc<CudaStream>, dims: &[i64], strides: &[i64], dtype: DataType) -> Out {
    let offsets = offsets(dims, strides);
    let len = offsets.iter().max().map_or(1, |&m| m + 1);
    let buf = stream.clone_htod(&vec![POISON; len * dtype.size()]).expect("alloc");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(stream, &buf, 0, dims, strides, dtype) };
    Out {
        t,
        m,
        buf,
        offsets,
        len,
    }
}

/// The bit patterns of the logical elements, and whether every byte outside the view is
/// still poison.
fn read_bits(stream: &Arc<CudaStream>, o: &Out) -> (Vec<u64>, bool) {
    let bytes = stream.clone_dtoh(&o.buf).expect("download");
    let s = o.t.dtype().size();
    let bits = |e: usize| {
        let mut v = [0u8; 8];
        v[..s].copy_from_slice(&bytes[e * s..(e + 1) * s]);
        u64::from_le_bytes(v)
    };
    let mut inside = vec![false; o.len];
    for &e in &o.offsets {
        inside[e] = true;
    }
    let gaps_ok = (0..o.len)
        .filter(|&e| !inside[e])
        .all(|e| bytes[e * s..(e + 1) * s].iter().all(|&b| b == POISON));
    (o.offsets.iter().map(|&e| bits(e)).collect(), gaps_ok)
}

/// A bit pattern of `dtype` as f64 (ints sign- or zero-extended; wide i64 may round).
fn value(dtype: DataType, b: u64) -> f64 {
    match dtype {
        F32 => f32::from_bits(b as u32) as f64,
        F16 => f16::from_bits(b as u16).to_f64(),
        BF16 => bf16::from_bits(b as u16).to_f64(),
        F64 => f64::from_bits(b),
        I32 => b as u32 as i32 as f64,
        I64 => b as i64 as f64,
        I8 => b as u8 as i8 as f64,
        U8 | Bool => b as u8 as f64,
    }
}

fn mask(dtype: DataType) -> u64 {
    match dtype.size() {
        8 => u64::MAX,
        s => (1u64 << (8 * s)) - 1,
    }
}

// ---------------------------------------------------------------------------------------
// CPU reference of the kernels' arithmetic (see the module docs of kernels::random)

fn words(g: Philox, n: usize, stream: u32) -> Vec<u32> {
    (0..n.div_ceil(4))
        .flat_map(|b| g.block(b as u64, stream))
        .take(n)
        .collect()
}

/// The smallest `dtype` value `>= low` and the largest `< high` (16-bit formats by brute
/// force over every bit pattern).
fn clamp_bounds(dtype: DataType, low: f64, high: f64) -> (f64, f64) {
    match dtype {
        F16 | BF16 => {
            let vals: Vec<f64> = (0..=u16::MAX)
                .map(|b| value(dtype, b as u64))
                .filter(|v| v.is_finite())
                .collect();
            let lo = vals.iter().copied().filter(|&v| v >= low).fold(f64::INFINITY, f64::min);
            let hi = vals
                .iter()
                .copied()
                .filter(|&v| v < high)
                .fold(f64::NEG_INFINITY, f64::max);
            (lo, hi)
        }
        F32 => {
            let (mut lo, mut hi) = (low as f32, high as f32);
            if (lo as f64) < low {
                lo = f32_up(lo);
            }
            if hi as f64 >= high {
                hi = -f32_up(-hi);
            }
            (lo as f64, hi as f64)
        }
        _ => (low, -f64_up(-high)),
    }
}

/// The next f32 above `v` (finite).
fn f32_up(v: f32) -> f32 {
    match v {
        _ if v == 0.0 => f32::from_bits(1),
        _ if v > 0.0 => f32::from_bits(v.to_bits() + 1),
        _ => f32::from_bits(v.to_bits() - 1),
    }
}

/// The next f64 above `v` (finite).
fn f64_up(v: f64) -> f64 {
    match v {
        _ if v == 0.0 => f64::from_bits(1),
        _ if v > 0.0 => f64::from_bits(v.to_bits() + 1),
        _ => f64::from_bits(v.to_bits() - 1),
    }
}

fn uniform_ref(dtype: DataType, g: Philox, n: usize, low: f64, high: f64) -> Vec<u64> {
    let (lo_c, hi_c) = clamp_bounds(dtype, low, high);
    let w = words(g, n, 0);
    if dtype == F64 {
        let w2 = words(g, n, 1);
        return (0..n)
            .map(|i| {
                let x = (((w[i] as u64) << 32) | w2[i] as u64) >> 11;
                let u = x as f64 * 2f64.powi(-53);
                u.mul_add(high - low, low).max(lo_c).min(hi_c).to_bits()
            })
            .collect();
    }
    let (l, r) = (low as f32, (high - low) as f32);
    w.iter()
        .map(|&w| {
            let v = ((w >> 8) as f32 * 2f32.powi(-24)).mul_add(r, l);
            let (rounded, bits) = match dtype {
                F32 => (v as f64, v.to_bits() as u64),
                F16 => {
                    let h = f16::from_f32(v);
                    (h.to_f64(), h.to_bits() as u64)
                }
                _ => {
                    let h = bf16::from_f32(v);
                    (h.to_f64(), h.to_bits() as u64)
                }
            };
            let enc = |x: f64| match dtype {
                F32 => (x as f32).to_bits() as u64,
                F16 => f16::from_f64(x).to_bits() as u64,
                _ => bf16::from_f64(x).to_bits() as u64,
            };
            if rounded < lo_c {
                enc(lo_c)
            } else if rounded > hi_c {
                enc(hi_c)
            } else {
                bits
            }
        })
        .collect()
}

/// Box–Muller in f64 from the kernels' uniforms (24-bit, or 53-bit for F64).
fn normal_ref(dtype: DataType, g: Philox, n: usize, mean: f64, std: f64) -> Vec<f64> {
    let (w, w2) = (words(g, n.div_ceil(4) * 4, 0), words(g, n.div_ceil(4) * 4, 1));
    let u = |k: usize, open0: bool| -> f64 {
        let add = open0 as u64;
        if dtype == F64 {
            let x = (((w[k] as u64) << 32) | w2[k] as u64) >> 11;
            (x + add) as f64 * 2f64.powi(-53)
        } else {
            ((w[k] >> 8) as u64 + add) as f64 * 2f64.powi(-24)
        }
    };
    (0..n)
        .map(|i| {
            let p = i & !1;
            let r = (-2.0 * u(p, true).ln()).sqrt();
            let a = 2.0 * std::f64::consts::PI * u(p + 1, false);
            let z = r * if i % 2 == 1 { a.sin() } else { a.cos() };
            mean + std * z
        })
        .collect()
}

fn one_bits(dtype: DataType) -> u64 {
    match dtype {
        F32 => 1f32.to_bits() as u64,
        F16 => f16::ONE.to_bits() as u64,
        BF16 => bf16::ONE.to_bits() as u64,
        F64 => 1f64.to_bits(),
        _ => 1,
    }
}

fn bernoulli_ref(dtype: DataType, g: Philox, n: usize, p: f64) -> Vec<u64> {
    let thr = (p * 4_294_967_296.0) as u64;
    words(g, n, 0)
        .into_iter()
        .map(|w| if (w as u64) < thr { one_bits(dtype) } else { 0 })
        .collect()
}

fn uniform_int_ref(dtype: DataType, g: Philox, n: usize, low: i64, high: i64) -> Vec<u64> {
    let range = high.wrapping_sub(low) as u64;
    let (w, w2) = (words(g, n, 0), words(g, n, 1));
    (0..n)
        .map(|i| {
            let v = if range > 1 << 32 {
                let x = ((w[i] as u64) << 32) | w2[i] as u64;
                ((x as u128 * range as u128) >> 64) as u64
            } else {
                (w[i] as u64 * range) >> 32
            };
            (low as u64).wrapping_add(v) & mask(dtype)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Layouts

fn packed(dims: &[i64]) -> (Vec<i64>, Vec<i64>) {
    (dims.to_vec(), row_major_strides(dims).to_vec())
}

/// `dims` stored with the dim order reversed (a full transpose).
fn transposed(dims: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut s = vec![0i64; dims.len()];
    let mut acc = 1;
    for (d, &n) in dims.iter().enumerate() {
        s[d] = acc;
        acc *= n;
    }
    (dims.to_vec(), s)
}

fn layouts() -> Vec<(Vec<i64>, Vec<i64>)> {
    vec![
        packed(&[]),
        packed(&[1]),
        packed(&[17]),
        packed(&[4, 6]),
        transposed(&[37, 53]),
        (vec![5, 7], vec![14, 2]),
        transposed(&[3, 4, 5]),
        packed(&[1000, 1031]),
    ]
}

fn numel(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

// ---------------------------------------------------------------------------------------
// Report

struct Report {
    name: &'static str,
    runs: usize,
    failures: Vec<String>,
    notes: Vec<String>,
}

impl Report {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            runs: 0,
            failures: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Bit-for-bit equality, and untouched gaps.
    fn exact(&mut self, case: String, got: &(Vec<u64>, bool), want: &[u64]) {
        self.runs += 1;
        let (got, gaps_ok) = got;
        if !gaps_ok {
            self.failures.push(format!("{case}: wrote outside the view"));
        }
        if got.len() != want.len() {
            self.failures
                .push(format!("{case}: {} values, expected {}", got.len(), want.len()));
            return;
        }
        let mismatches = got.iter().zip(want).filter(|(g, w)| g != w).count();
        if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
            self.failures.push(format!(
                "{case}: {mismatches} mismatches, first at {i}: got {:#x} expected {:#x}",
                got[i], want[i]
            ));
        }
    }

    /// A condition with a message on failure.
    fn check(&mut self, case: String, ok: bool, detail: String) {
        self.runs += 1;
        if !ok {
            self.failures.push(format!("{case}: {detail}"));
        }
    }

    fn error(&mut self, case: String, e: cudnn_backend::Error) {
        self.runs += 1;
        self.failures.push(format!("{case}: {e}"));
    }

    fn note(&mut self, s: String) {
        self.notes.push(s);
    }

    fn finish(self) {
        println!(
            "random {}: {} cases, {} failed{}{}",
            self.name,
            self.runs,
            self.failures.len(),
            if self.notes.is_empty() { "" } else { "; " },
            self.notes.join(", ")
        );
        assert!(
            self.failures.is_empty(),
            "{} failures:\n{}",
            self.name,
            self.failures.join("\n")
        );
    }
}

/// |x - want| within `k` standard errors.
fn within(x: f64, want: f64, sigma: f64, k: f64) -> bool {
    (x - want).abs() <= k * sigma
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

// ---------------------------------------------------------------------------------------
// Exact agreement with the CPU reference

#[test]
#[ignore = "needs a CUDA GPU"]
fn uniform_matches_cpu_philox_bit_for_bit() {
    let s = stream();
    let mut r = Report::new("uniform exact");
    let params = [(0.0, 1.0), (-2.5, 7.25), (0.1, 0.2), (-1e3, 1e-3)];
    for (li, (dims, st)) in layouts().iter().enumerate() {
        for dtype in FLOATS {
            for (k, &(low, high)) in params.iter().enumerate() {
                let start = Philox {
                    seed: 0x0123_4567_89ab_cdef ^ (li as u64 * 31 + k as u64),
                    offset: [0, 5, u64::MAX - 2, 1 << 40][k],
                };
                let mut g = start;
                let out = alloc(&s, dims, st, dtype);
                let case = format!("uniform {dtype:?} [{low}, {high}) {dims:?}/{st:?} {start:?}");
                if let Err(e) = rnd::uniform(&s, &mut g, low, high, &out.m) {
                    r.error(case, e);
                    continue;
                }
                let n = numel(dims);
                r.check(
                    case.clone(),
                    g.offset == start.offset.wrapping_add(n.div_ceil(4) as u64),
                    format!("generator advanced to {}", g.offset),
                );
                let want = uniform_ref(dtype, start, n, low, high);
                r.exact(case, &read_bits(&s, &out), &want);
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bernoulli_and_uniform_int_match_cpu_bit_for_bit() {
    let s = stream();
    let mut r = Report::new("bernoulli/uniform_int exact");
    for (li, (dims, st)) in layouts().iter().enumerate() {
        let n = numel(dims);
        for dtype in ALL {
            for p in [0.0, 0.3, 0.5, 1.0] {
                let start = Philox {
                    seed: 99 + li as u64,
                    offset: 1234,
                };
                let mut g = start;
                let out = alloc(&s, dims, st, dtype);
                let case = format!("bernoulli {dtype:?} p={p} {dims:?}/{st:?}");
                match rnd::bernoulli(&s, &mut g, p, &out.m) {
                    Ok(()) => r.exact(case, &read_bits(&s, &out), &bernoulli_ref(dtype, start, n, p)),
                    Err(e) => r.error(case, e),
                }
            }
        }
        for dtype in INTS {
            let mut ranges = vec![(-3i64, 4i64), (0, 2), (0, 100)];
            match dtype {
                I64 => ranges.extend([
                    (i64::MIN, i64::MAX),
                    (-(1 << 40), 1 << 40),
                    (0, 1 << 32),
                    (0, (1 << 32) + 1),
                ]),
                I32 => ranges.push((i32::MIN as i64, i32::MAX as i64 + 1)),
                I8 => ranges.push((-128, 128)),
                _ => ranges.push((0, 256)),
            }
            for (k, &(low, high)) in ranges.iter().enumerate() {
                if dtype == U8 && low < 0 {
                    continue;
                }
                let start = Philox {
                    seed: 7 * li as u64 + k as u64,
                    offset: 42,
                };
                let mut g = start;
                let out = alloc(&s, dims, st, dtype);
                let case = format!("uniform_int {dtype:?} [{low}, {high}) {dims:?}/{st:?}");
                match rnd::uniform_int(&s, &mut g, low, high, &out.m) {
                    Ok(()) => r.exact(case, &read_bits(&s, &out), &uniform_int_ref(dtype, start, n, low, high)),
                    Err(e) => r.error(case, e),
                }
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn normal_matches_cpu_box_muller() {
    let s = stream();
    let mut r = Report::new("normal vs CPU");
    let mut worst = vec![0f64; 4];
    for (dims, st) in layouts() {
        let n = numel(&dims);
        for (di, dtype) in FLOATS.into_iter().enumerate() {
            for (mean, std) in [(0.0, 1.0), (1.5, 2.0), (-3.0, 0.0)] {
                let start = Philox {
                    seed: 0xfeed,
                    offset: 3 + n as u64,
                };
                let mut g = start;
                let out = alloc(&s, &dims, &st, dtype);
                let case = format!("normal {dtype:?} mean={mean} std={std} {dims:?}/{st:?}");
                if let Err(e) = rnd::normal(&s, &mut g, mean, std, &out.m) {
                    r.error(case, e);
                    continue;
                }
                let (bits, gaps_ok) = read_bits(&s, &out);
                let got: Vec<f64> = bits.iter().map(|&b| value(dtype, b)).collect();
                let want = normal_ref(dtype, start, n, mean, std);
                let err = if n == 0 { 0.0 } else { rel_l2_error(&got, &want) };
                let limit = match dtype {
                    F32 => 1e-5,
                    F64 => 1e-12,
                    _ => 1e-2,
                };
                worst[di] = worst[di].max(err);
                r.check(
                    case,
                    gaps_ok && got.iter().all(|v| v.is_finite()) && err <= limit,
                    format!("rel L2 error {err:.3e} (limit {limit:.0e}), gaps untouched: {gaps_ok}"),
                );
            }
        }
    }
    for (d, w) in FLOATS.iter().zip(&worst) {
        r.note(format!("{d:?} worst {w:.2e}"));
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// Reproducibility

#[test]
#[ignore = "needs a CUDA GPU"]
fn same_position_repeats_and_other_positions_differ() {
    let s = stream();
    let mut r = Report::new("reproducibility");
    let (dims, st) = transposed(&[129, 65]);
    let draw = |g: &mut Philox, dtype: DataType, which: usize| -> (Vec<u64>, bool) {
        let out = alloc(&s, &dims, &st, dtype);
        match which {
            0 => rnd::uniform(&s, g, -1.0, 1.0, &out.m),
            1 => rnd::normal(&s, g, 0.0, 1.0, &out.m),
            2 => rnd::bernoulli(&s, g, 0.5, &out.m),
            _ => rnd::uniform_int(&s, g, 0, 1000, &out.m),
        }
        .expect("launch");
        read_bits(&s, &out)
    };
    for (which, dtype) in [(0, F32), (0, BF16), (1, F64), (1, F16), (2, U8), (3, I32)] {
        let name = ["uniform", "normal", "bernoulli", "uniform_int"][which];
        let start = Philox { seed: 2024, offset: 10 };
        let mut g1 = start;
        let a = draw(&mut g1, dtype, which);
        let mut g2 = start;
        let b = draw(&mut g2, dtype, which);
        r.check(
            format!("{name} {dtype:?} same (seed, offset)"),
            a.0 == b.0 && g1 == g2,
            "two draws from one position differ".into(),
        );
        // The advanced generator continues with fresh numbers.
        let c = draw(&mut g1, dtype, which);
        let same = a.0.iter().zip(&c.0).filter(|(x, y)| x == y).count();
        r.check(
            format!("{name} {dtype:?} next offset"),
            (same as f64) < 0.6 * a.0.len() as f64,
            format!("{same} of {} equal after advancing", a.0.len()),
        );
        let mut g3 = Philox { seed: 2025, offset: 10 };
        let d = draw(&mut g3, dtype, which);
        let same = a.0.iter().zip(&d.0).filter(|(x, y)| x == y).count();
        r.check(
            format!("{name} {dtype:?} other seed"),
            (same as f64) < 0.6 * a.0.len() as f64,
            format!("{same} of {} equal with another seed", a.0.len()),
        );
        let mut g4 = Philox { seed: 2024, offset: 11 };
        let e = draw(&mut g4, dtype, which);
        let same = a.0.iter().zip(&e.0).filter(|(x, y)| x == y).count();
        r.check(
            format!("{name} {dtype:?} offset + 1"),
            (same as f64) < 0.6 * a.0.len() as f64,
            format!("{same} of {} equal one offset later", a.0.len()),
        );
        // Offset + 1 is the same stream shifted by one block (4 elements).
        if which == 0 || which == 2 {
            let n = a.0.len();
            let shifted = a.0[4..] == e.0[..n - 4];
            r.check(
                format!("{name} {dtype:?} offset + 1 shifts by 4"),
                shifted,
                "offset + 1 is not the stream shifted by one block".into(),
            );
        }
    }
    // A packed and a transposed output of one shape hold the same logical values.
    let mut g = Philox::new(5);
    let packed_out = alloc(&s, &dims, &packed(&dims).1, F32);
    rnd::uniform(&s, &mut g, 0.0, 1.0, &packed_out.m).expect("launch");
    let mut g = Philox::new(5);
    let u = {
        let out = alloc(&s, &dims, &st, F32);
        rnd::uniform(&s, &mut g, 0.0, 1.0, &out.m).expect("launch");
        read_bits(&s, &out)
    };
    r.check(
        "layout independence".into(),
        read_bits(&s, &packed_out).0 == u.0 && u.1,
        "packed and transposed outputs differ".into(),
    );
    r.finish();
}

// ---------------------------------------------------------------------------------------
// Statistics on 1e6 samples

/// One ulp of `dtype` at `x` (normal range).
fn ulp(dtype: DataType, x: f64) -> f64 {
    let mant = match dtype {
        F32 => 23,
        F16 => 10,
        BF16 => 7,
        _ => 52,
    };
    2f64.powi(x.abs().log2().floor() as i32 - mant)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn uniform_and_normal_statistics() {
    let s = stream();
    let mut r = Report::new("uniform/normal statistics");
    let n = BIG as usize;
    let (dims, st) = transposed(&[1000, 1000]);
    for (k, dtype) in FLOATS.into_iter().enumerate() {
        // Uniform on [-2, 3): mean 0.5, variance 25/12, never `high`.
        let (a, b) = (-2.0f64, 3.0f64);
        let out = alloc(&s, &dims, &st, dtype);
        let mut g = Philox::new(100 + k as u64);
        rnd::uniform(&s, &mut g, a, b, &out.m).expect("uniform");
        let v: Vec<f64> = read_bits(&s, &out).0.iter().map(|&x| value(dtype, x)).collect();
        let (m, var) = mean_var(&v);
        let w = b - a;
        let (mu, sig2) = ((a + b) / 2.0, w * w / 12.0);
        let var_sigma = ((w.powi(4) / 80.0 - sig2 * sig2) / n as f64).sqrt();
        let (lo, hi) = v
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
        r.check(
            format!("uniform {dtype:?} mean"),
            within(m, mu, (sig2 / n as f64).sqrt(), 5.0),
            format!("mean {m} vs {mu}"),
        );
        r.check(
            format!("uniform {dtype:?} variance"),
            within(var, sig2, var_sigma, 5.0),
            format!("variance {var} vs {sig2}"),
        );
        r.check(
            format!("uniform {dtype:?} range"),
            lo >= a && hi < b,
            format!("values span [{lo}, {hi}], outside [{a}, {b})"),
        );
        r.note(format!("uniform {dtype:?} mean {m:.4} var {var:.4}"));

        // Normal(1.5, 2): mean, std, ~68.27% within one std.
        let (mean, std) = (1.5f64, 2.0f64);
        let out = alloc(&s, &dims, &st, dtype);
        rnd::normal(&s, &mut g, mean, std, &out.m).expect("normal");
        let v: Vec<f64> = read_bits(&s, &out).0.iter().map(|&x| value(dtype, x)).collect();
        let (m, var) = mean_var(&v);
        let sd = var.sqrt();
        let inside = v.iter().filter(|&&x| (x - mean).abs() <= std).count() as f64 / n as f64;
        let p1 = 0.682_689_492_137_086;
        // Rounding to the dtype moves values across the boundaries by at most half an ulp.
        let slack = 0.242 / std * (ulp(dtype, mean - std) + ulp(dtype, mean + std));
        r.check(
            format!("normal {dtype:?} mean"),
            within(m, mean, std / (n as f64).sqrt(), 5.0),
            format!("mean {m} vs {mean}"),
        );
        r.check(
            format!("normal {dtype:?} std"),
            within(sd, std, std / (2.0 * n as f64).sqrt(), 5.0),
            format!("std {sd} vs {std}"),
        );
        r.check(
            format!("normal {dtype:?} one-sigma fraction"),
            (inside - p1).abs() <= 5.0 * (p1 * (1.0 - p1) / n as f64).sqrt() + slack,
            format!("{inside} within one std, expected {p1}"),
        );
        r.check(
            format!("normal {dtype:?} finite"),
            v.iter().all(|x| x.is_finite()),
            "non-finite values".into(),
        );
        r.note(format!("normal {dtype:?} mean {m:.4} std {sd:.4} 1-sigma {inside:.4}"));
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn uniform_never_returns_high() {
    let s = stream();
    let mut r = Report::new("never high");
    let (dims, st) = packed(&[BIG]);
    // Narrow-precision intervals where f32 `low + range * u` often rounds to `high`.
    for dtype in FLOATS {
        for (low, high) in [(0.0, 1.0), (1.0, 2.0), (-1.0, 0.0), (1000.0, 1000.5), (0.1, 0.2)] {
            let out = alloc(&s, &dims, &st, dtype);
            let mut g = Philox::new(77);
            let case = format!("uniform {dtype:?} [{low}, {high})");
            if let Err(e) = rnd::uniform(&s, &mut g, low, high, &out.m) {
                r.error(case, e);
                continue;
            }
            let v: Vec<f64> = read_bits(&s, &out).0.iter().map(|&x| value(dtype, x)).collect();
            let bad = v.iter().filter(|&&x| !(x >= low && x < high)).count();
            let (_, hi_c) = clamp_bounds(dtype, low, high);
            let top = v.iter().filter(|&&x| x == hi_c).count();
            r.check(case.clone(), bad == 0, format!("{bad} values outside [{low}, {high})"));
            if (dtype == F16 || dtype == BF16) && high != 0.0 {
                // Without the clamp these would have been `high`: the top value must occur.
                // (Below 0 the half types have subnormals finer than an f32 uniform's step,
                // so `high == 0` never rounds up and its top value is practically unreachable.)
                r.check(case, top > 0, "the largest value below high never occurs".into());
            }
        }
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bernoulli_and_uniform_int_statistics() {
    let s = stream();
    let mut r = Report::new("bernoulli/uniform_int statistics");
    let n = BIG as usize;
    let (dims, st) = transposed(&[1000, 1000]);
    for (k, dtype) in ALL.into_iter().enumerate() {
        for p in [0.3, 0.5, 0.99] {
            let out = alloc(&s, &dims, &st, dtype);
            let mut g = Philox::new(300 + k as u64);
            rnd::bernoulli(&s, &mut g, p, &out.m).expect("bernoulli");
            let v: Vec<f64> = read_bits(&s, &out).0.iter().map(|&x| value(dtype, x)).collect();
            let ones = v.iter().filter(|&&x| x == 1.0).count();
            let zeros = v.iter().filter(|&&x| x == 0.0).count();
            let rate = ones as f64 / n as f64;
            r.check(
                format!("bernoulli {dtype:?} p={p} values"),
                ones + zeros == n,
                format!("{} values are neither 0 nor 1", n - ones - zeros),
            );
            r.check(
                format!("bernoulli {dtype:?} p={p} rate"),
                within(rate, p, (p * (1.0 - p) / n as f64).sqrt(), 5.0),
                format!("rate {rate} vs {p}"),
            );
        }
    }
    for (k, dtype) in INTS.into_iter().enumerate() {
        let (low, high) = if dtype == U8 { (250i64, 256i64) } else { (-3, 4) };
        let out = alloc(&s, &dims, &st, dtype);
        let mut g = Philox::new(400 + k as u64);
        rnd::uniform_int(&s, &mut g, low, high, &out.m).expect("uniform_int");
        let v: Vec<f64> = read_bits(&s, &out).0.iter().map(|&x| value(dtype, x)).collect();
        let kinds = (high - low) as usize;
        let mut counts = vec![0usize; kinds];
        let mut outside = 0;
        for &x in &v {
            let i = x as i64 - low;
            if (0..kinds as i64).contains(&i) && x.fract() == 0.0 {
                counts[i as usize] += 1;
            } else {
                outside += 1;
            }
        }
        let p = 1.0 / kinds as f64;
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        r.check(
            format!("uniform_int {dtype:?} range"),
            outside == 0,
            format!("{outside} values outside [{low}, {high})"),
        );
        r.check(
            format!("uniform_int {dtype:?} coverage"),
            counts.iter().all(|&c| within(c as f64, n as f64 * p, sigma, 5.0)),
            format!("counts {counts:?}, expected {:.0} each", n as f64 * p),
        );
        r.note(format!("uniform_int {dtype:?} counts {counts:?}"));
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn invalid_arguments_are_rejected_without_advancing() {
    let s = stream();
    let mut r = Report::new("invalid arguments");
    let out_f = alloc(&s, &[4], &[1], F32);
    let out_i = alloc(&s, &[4], &[1], I32);
    let overlap = alloc(&s, &[4, 3], &[0, 1], F32);
    let mut g = Philox::new(1);
    let cases: Vec<(&str, cudnn_backend::Result<()>)> = vec![
        ("uniform low == high", rnd::uniform(&s, &mut g, 1.0, 1.0, &out_f.m)),
        ("uniform int dtype", rnd::uniform(&s, &mut g, 0.0, 1.0, &out_i.m)),
        ("uniform overlap", rnd::uniform(&s, &mut g, 0.0, 1.0, &overlap.m)),
        ("normal std < 0", rnd::normal(&s, &mut g, 0.0, -1.0, &out_f.m)),
        ("bernoulli p > 1", rnd::bernoulli(&s, &mut g, 1.5, &out_i.m)),
        ("uniform_int float dtype", rnd::uniform_int(&s, &mut g, 0, 3, &out_f.m)),
        (
            "uniform_int high > max",
            rnd::uniform_int(&s, &mut g, 0, 1 << 40, &out_i.m),
        ),
    ];
    for (name, res) in cases {
        r.check(name.into(), res.is_err(), "accepted".into());
    }
    r.check(
        "generator untouched".into(),
        g == Philox::new(1),
        format!("generator moved to {g:?}"),
    );
    let empty = alloc(&s, &[0, 3], &[3, 1], F32);
    r.check(
        "empty output".into(),
        rnd::uniform(&s, &mut g, 0.0, 1.0, &empty.m).is_ok() && g == Philox::new(1),
        "empty output failed or advanced".into(),
    );
    r.finish();
}
