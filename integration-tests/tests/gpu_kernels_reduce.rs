//! The reduction / arg-reduction / scan kernels (`cudnn_backend::kernels::reduce`) against a
//! CPU reference, for every op and dtype, axis first / middle / last, long axes, length-1
//! axes, transposed and broadcast (0-stride) inputs, with poisoned outputs. Needs a CUDA GPU.
//!
//! Exact: integers and bool (wrapping like the kernels), max/min, arg indices, cummax/cummin.
//! Relative L2 error: f32 1e-5 (sums, means, products), f64 1e-12, f16/bf16 1e-2.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::reduce::{self, ArgOp, ReduceOp, ScanOp};
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{gather_from_strided, rel_l2_error, scatter_to_strided, strided_len, SplitMix64};
use half::{bf16, f16};
use integration_tests::views_of;
use integration_tests::{round_to, Shard};

const FLOATS: [DataType; 4] = [DataType::F32, DataType::F16, DataType::BF16, DataType::F64];
const INTS: [DataType; 4] = [DataType::I64, DataType::I32, DataType::I8, DataType::U8];
const ALL: [DataType; 9] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::F64,
    DataType::I64,
    DataType::I32,
    DataType::I8,
    DataType::U8,
    DataType::Bool,
];
const REDUCE_OPS: [ReduceOp; 7] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Any,
    ReduceOp::All,
];
const SCAN_OPS: [ScanOp; 4] = [ScanOp::CumSum, ScanOp::CumProd, ScanOp::CumMax, ScanOp::CumMin];

/// (dims, axis): first / middle / last axes, long axes (both the block-per-row and the
/// warp-per-row paths), length-1 axes, rank 1 and rank 5.
fn shapes() -> Vec<(Vec<i64>, usize)> {
    vec![
        (vec![7], 0),
        (vec![1, 100_000], 1),
        (vec![30_000, 2], 0),
        (vec![5, 1, 6], 1),
        (vec![3, 4, 5], 0),
        (vec![3, 4, 5], 1),
        (vec![3, 4, 5], 2),
        (vec![2, 300, 3], 1),
        (vec![1000, 17], 1),
        (vec![1000, 17], 0),
        (vec![64, 65], 1),
        (vec![2000, 3], 1),
        (vec![2, 3, 2, 3, 4], 2),
    ]
}

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

fn is_float(dt: DataType) -> bool {
    dt.is_float()
}

// ---- device buffers in any dtype ----------------------------------------------------------

struct Dev {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
}

fn us(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

fn encode(dt: DataType, v: &[f64]) -> Vec<u8> {
    match dt {
        DataType::F32 => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        DataType::F16 => v.iter().flat_map(|&x| f16::from_f64(x).to_le_bytes()).collect(),
        DataType::BF16 => v.iter().flat_map(|&x| bf16::from_f64(x).to_le_bytes()).collect(),
        DataType::F64 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        DataType::I64 => v.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
        DataType::I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        DataType::I8 => v.iter().map(|&x| x as i8 as u8).collect(),
        DataType::U8 | DataType::Bool => v.iter().map(|&x| x as u8).collect(),
    }
}

/// Floats as f64; integers and bool as exact i64 (carried in `ints`).
fn decode(dt: DataType, b: &[u8]) -> (Vec<f64>, Vec<i64>) {
    let f: Vec<f64> = match dt {
        DataType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DataType::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        _ => Vec::new(),
    };
    let i: Vec<i64> = match dt {
        DataType::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        DataType::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        DataType::I8 => b.iter().map(|&x| x as i8 as i64).collect(),
        DataType::U8 | DataType::Bool => b.iter().map(|&x| x as i64).collect(),
        _ => Vec::new(),
    };
    (f, i)
}

/// Uploads logical row-major `values` (already representable in `dt`) into a view with
/// `strides` (0 strides allowed: the values must then agree along that dim).
fn upload(s: &Arc<CudaStream>, values: &[f64], dims: &[i64], strides: &[i64], dt: DataType) -> Dev {
    let (d, st) = (us(dims), us(strides));
    let len = strided_len(&d, &st).max(1);
    let fill = if is_float(dt) { f64::NAN } else { 77.0 };
    let mut host = vec![fill; len];
    scatter_to_strided(values, &d, &st, &mut host);
    let buf = s.clone_htod(&encode(dt, &host)).expect("upload");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(s, &buf, 0, dims, strides, dt) };
    Dev { t, m, buf }
}

/// An output poisoned with 0xFF bytes (NaN, -1, 255, or an invalid bool).
fn poisoned(s: &Arc<CudaStream>, dims: &[i64], strides: &[i64], dt: DataType) -> Dev {
    let len = strided_len(&us(dims), &us(strides)).max(1);
    let buf = s.clone_htod(&vec![0xFFu8; len * dt.size()]).expect("alloc");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(s, &buf, 0, dims, strides, dt) };
    Dev { t, m, buf }
}

/// Reads `d` back in logical row-major order (synchronizes).
fn download(s: &Arc<CudaStream>, d: &Dev) -> (Vec<f64>, Vec<i64>) {
    let bytes = s.clone_dtoh(&d.buf).expect("download");
    let (f, i) = decode(d.t.dtype(), &bytes);
    let (dims, st) = (us(d.t.dims()), us(d.t.strides()));
    let g = |v: &[f64]| {
        if v.is_empty() {
            Vec::new()
        } else {
            gather_from_strided(v, &dims, &st)
        }
    };
    let gi = |v: &[i64]| {
        if v.is_empty() {
            Vec::new()
        } else {
            gather_from_strided(v, &dims, &st)
        }
    };
    (g(&f), gi(&i))
}

fn contiguous(dims: &[i64]) -> Vec<i64> {
    row_major_strides(dims).to_vec()
}

/// Column-major strides: every dim transposed relative to row-major.
fn column_major(dims: &[i64]) -> Vec<i64> {
    let mut st = vec![0i64; dims.len()];
    let mut acc = 1i64;
    for (d, &n) in dims.iter().enumerate() {
        st[d] = acc;
        acc *= n.max(1);
    }
    st
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    /// Row-major packed.
    Packed,
    /// Column-major (a full transpose); outputs also column-major.
    Transposed,
    /// One dim broadcast with stride 0 (the reduced axis when it is the only one > 1).
    Broadcast,
}
const VIEWS: [View; 3] = [View::Packed, View::Transposed, View::Broadcast];

/// The input strides for `view`, and for broadcasts the dim whose values repeat.
fn input_strides(view: View, dims: &[i64], axis: usize) -> (Vec<i64>, Option<usize>) {
    match view {
        View::Packed => (contiguous(dims), None),
        View::Transposed => (column_major(dims), None),
        View::Broadcast => {
            let d = (0..dims.len())
                .rev()
                .find(|&d| d != axis && dims[d] > 1)
                .unwrap_or(axis);
            let mut st = contiguous(dims);
            st[d] = 0;
            (st, Some(d))
        }
    }
}

fn output_strides(view: View, dims: &[i64]) -> Vec<i64> {
    match view {
        View::Transposed => column_major(dims),
        _ => contiguous(dims),
    }
}

/// Makes values constant along `bdim` (copies index 0 of that dim everywhere).
fn broadcast_values(v: &mut [f64], dims: &[i64], bdim: usize) {
    let inner: i64 = dims[bdim + 1..].iter().product();
    let n = dims[bdim];
    for i in 0..v.len() as i64 {
        let k = (i / inner) % n;
        if k != 0 {
            v[i as usize] = v[(i - k * inner) as usize];
        }
    }
}

// ---- value generation ----------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gen {
    /// Sums and means: mostly positive floats, or integers spread over the dtype.
    Additive,
    /// Products: floats near 1, nonzero small integers (products wrap).
    Multiplicative,
    /// Max/min/arg: few distinct values (many ties).
    Ties,
    /// Any/all: zero with probability `p` (percent).
    Truth(u64),
}

fn gen(rng: &mut SplitMix64, dt: DataType, g: Gen, n: usize) -> Vec<f64> {
    let int = |rng: &mut SplitMix64, lo: i64, hi: i64| lo + rng.below((hi - lo + 1) as u64) as i64;
    (0..n)
        .map(|_| {
            let v = match (g, dt) {
                (Gen::Truth(p), _) => {
                    if rng.below(100) < p {
                        0.0
                    } else if is_float(dt) {
                        rng.next_f64() * 0.5 + if rng.below(2) == 0 { 0.6 } else { -0.6 }
                    } else if dt == DataType::Bool || dt == DataType::U8 {
                        int(rng, 1, 2) as f64
                    } else {
                        int(rng, 1, 3) as f64 * if rng.below(2) == 0 { 1.0 } else { -1.0 }
                    }
                }
                (_, DataType::Bool) => rng.below(2) as f64,
                (Gen::Additive, DataType::U8) => int(rng, 0, 255) as f64,
                (Gen::Additive, DataType::I8) => int(rng, -128, 127) as f64,
                (Gen::Additive, DataType::I32) => int(rng, -2_000_000_000, 2_000_000_000) as f64,
                (Gen::Additive, DataType::I64) => int(rng, -1 << 50, 1 << 50) as f64,
                (Gen::Additive, _) => 0.25 + 0.75 * rng.next_f64(),
                (Gen::Multiplicative, DataType::U8) => int(rng, 1, 7) as f64,
                (Gen::Multiplicative, _) if !is_float(dt) => {
                    int(rng, 1, 3) as f64 * if rng.below(2) == 0 { 1.0 } else { -1.0 }
                }
                // Long rows (where a broadcast row repeats one value n times) stay near 1 so that
                // v^n neither overflows nor underflows.
                (Gen::Multiplicative, _) => {
                    let spread = if n > 10_000 { 1e-4 } else { 1e-2 };
                    (1.0 + spread * rng.next_f64()) * if rng.below(50) == 0 { -1.0 } else { 1.0 }
                }
                (Gen::Ties, DataType::U8) => int(rng, 0, 6) as f64,
                (Gen::Ties, _) if !is_float(dt) => int(rng, -3, 3) as f64,
                (Gen::Ties, _) => int(rng, -3, 3) as f64 + 0.5 * rng.below(2) as f64,
            };
            round_to(dt, v)
        })
        .collect()
}

// ---- CPU reference ----------------------------------------------------------------------------

/// Logical (row-major over `dims`) index of element `k` of row `o` (rows enumerate the
/// remaining dims row-major).
fn index_of(dims: &[i64], axis: usize, o: i64, k: i64) -> usize {
    let mut rem = o;
    let mut idx = vec![0i64; dims.len()];
    for d in (0..dims.len()).rev() {
        if d == axis {
            continue;
        }
        idx[d] = rem % dims[d];
        rem /= dims[d];
    }
    idx[axis] = k;
    idx.iter().zip(dims).fold(0i64, |acc, (&i, &n)| acc * n + i) as usize
}

fn rows(values: &[f64], dims: &[i64], axis: usize) -> Vec<Vec<f64>> {
    let len = dims[axis];
    let n_out: i64 = dims
        .iter()
        .enumerate()
        .filter(|&(d, _)| d != axis)
        .map(|(_, &n)| n)
        .product();
    (0..n_out)
        .map(|o| (0..len).map(|k| values[index_of(dims, axis, o, k)]).collect())
        .collect()
}

fn wrap(dt: DataType, v: i64) -> i64 {
    match dt {
        DataType::I32 => v as i32 as i64,
        DataType::I8 => v as i8 as i64,
        DataType::U8 => v as u8 as i64,
        _ => v,
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// Expected result of `op` over `row`: float (f64) or exact integer.
enum Want {
    F(f64),
    I(i64),
}

fn reduce_ref(op: ReduceOp, dt: DataType, row: &[f64]) -> Want {
    match op {
        ReduceOp::Any => return Want::I(row.iter().any(|&v| v != 0.0) as i64),
        ReduceOp::All => return Want::I(row.iter().all(|&v| v != 0.0) as i64),
        _ => {}
    }
    if is_float(dt) {
        Want::F(match op {
            ReduceOp::Sum => row.iter().sum(),
            ReduceOp::Mean => row.iter().sum::<f64>() / row.len() as f64,
            ReduceOp::Prod => row.iter().product(),
            ReduceOp::Max => row.iter().copied().fold(f64::NEG_INFINITY, fmax),
            _ => row.iter().copied().fold(f64::INFINITY, fmin),
        })
    } else {
        let it = row.iter().map(|&v| v as i64);
        Want::I(wrap(
            dt,
            match op {
                ReduceOp::Sum => it.fold(0i64, |a, b| a.wrapping_add(b)),
                ReduceOp::Prod => it.fold(1i64, |a, b| a.wrapping_mul(b)),
                ReduceOp::Max => it.max().unwrap(),
                _ => it.min().unwrap(),
            },
        ))
    }
}

/// Sequential semantics: strict comparison from element 0, so ties keep the first index
/// and a NaN is chosen only at index 0.
fn arg_ref(op: ArgOp, row: &[f64]) -> i64 {
    let (mut best, mut bi) = (row[0], 0usize);
    for (k, &v) in row.iter().enumerate().skip(1) {
        let better = match op {
            ArgOp::ArgMax => v > best,
            ArgOp::ArgMin => v < best,
        };
        if better {
            best = v;
            bi = k;
        }
    }
    bi as i64
}

fn scan_ref(op: ScanOp, dt: DataType, row: &[f64]) -> Vec<Want> {
    let mut out = Vec::with_capacity(row.len());
    if is_float(dt) {
        let mut acc = 0.0;
        for (k, &v) in row.iter().enumerate() {
            acc = if k == 0 {
                v
            } else {
                match op {
                    ScanOp::CumSum => acc + v,
                    ScanOp::CumProd => acc * v,
                    ScanOp::CumMax => fmax(acc, v),
                    ScanOp::CumMin => fmin(acc, v),
                }
            };
            out.push(Want::F(acc));
        }
    } else {
        let mut acc = 0i64;
        for (k, &v) in row.iter().enumerate() {
            let v = v as i64;
            acc = if k == 0 {
                v
            } else {
                match op {
                    ScanOp::CumSum => acc.wrapping_add(v),
                    ScanOp::CumProd => acc.wrapping_mul(v),
                    ScanOp::CumMax => acc.max(v),
                    ScanOp::CumMin => acc.min(v),
                }
            };
            out.push(Want::I(wrap(dt, acc)));
        }
    }
    out
}

// ---- report --------------------------------------------------------------------------------------

/// Collects per-case outcomes and fails the test at the end with every failure listed.
struct Report {
    family: &'static str,
    cases: usize,
    worst: Vec<(DataType, f64)>,
    failures: Vec<String>,
}

fn float_bound(dt: DataType) -> f64 {
    match dt {
        DataType::F32 => 1e-5,
        DataType::F64 => 1e-12,
        _ => 1e-2,
    }
}

fn same_float(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

impl Report {
    fn new(family: &'static str) -> Self {
        Self {
            family,
            cases: 0,
            worst: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn note(&mut self, dt: DataType, err: f64) {
        match self.worst.iter_mut().find(|(d, _)| *d == dt) {
            Some((_, w)) => *w = if err.is_nan() { f64::NAN } else { w.max(err) },
            None => self.worst.push((dt, err)),
        }
    }

    /// Compares `want` with the output (`f` for float dtypes, `i` for the others): exact
    /// when `exact` or integer, else relative L2 within `bound`.
    fn check(
        &mut self,
        case: String,
        dt: DataType,
        want: &[Want],
        got: &(Vec<f64>, Vec<i64>),
        exact: bool,
        bound: f64,
    ) {
        self.cases += 1;
        let (f, i) = (&got.0[..], &got.1[..]);
        let n = want.len();
        let got_len = if f.is_empty() { i.len() } else { f.len() };
        if got_len != n {
            self.failures.push(format!("{case}: {got_len} outputs, expected {n}"));
            return;
        }
        let mut wf = Vec::new();
        for (j, w) in want.iter().enumerate() {
            match w {
                Want::I(x) => {
                    if i.get(j) != Some(x) {
                        self.failures
                            .push(format!("{case}: element {j}: got {:?}, expected {x}", i.get(j)));
                        return;
                    }
                }
                Want::F(x) => {
                    let y = round_to(dt, *x);
                    if exact && !same_float(f[j], y) {
                        self.failures
                            .push(format!("{case}: element {j}: got {}, expected {y}", f[j]));
                        return;
                    }
                    wf.push(*x);
                }
            }
        }
        if !wf.is_empty() && !exact {
            let err = rel_l2_error(f, &wf);
            self.note(dt, err);
            if err.is_nan() || err > bound {
                self.failures
                    .push(format!("{case}: rel L2 error {err:.3e} > {bound:.0e}"));
            }
        } else {
            self.note(dt, 0.0);
        }
    }

    fn fail(&mut self, case: String, what: String) {
        self.cases += 1;
        self.failures.push(format!("{case}: {what}"));
    }

    fn finish(self) {
        let worst: Vec<String> = self.worst.iter().map(|(d, e)| format!("{d:?} {e:.2e}")).collect();
        println!(
            "reduce {}: {} cases, {} failed, worst err {}",
            self.family,
            self.cases,
            self.failures.len(),
            worst.join(", ")
        );
        assert!(
            self.failures.is_empty(),
            "reduce {}: {} failures:\n{}",
            self.family,
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

// ---- inputs --------------------------------------------------------------------------------------

/// Random values for `dims` in `dt`, made constant along the broadcast dim when `view`
/// broadcasts, uploaded with that view's strides.
fn input(
    s: &Arc<CudaStream>,
    rng: &mut SplitMix64,
    dims: &[i64],
    axis: usize,
    view: View,
    dt: DataType,
    g: Gen,
) -> (Dev, Vec<f64>) {
    let n: i64 = dims.iter().product();
    let mut v = gen(rng, dt, g, n as usize);
    let (st, bdim) = input_strides(view, dims, axis);
    if let Some(b) = bdim {
        broadcast_values(&mut v, dims, b);
    }
    (upload(s, &v, dims, &st, dt), v)
}

fn reduce_gen(op: ReduceOp, rng: &mut SplitMix64) -> Gen {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => Gen::Additive,
        ReduceOp::Prod => Gen::Multiplicative,
        ReduceOp::Max | ReduceOp::Min => Gen::Ties,
        ReduceOp::Any | ReduceOp::All => Gen::Truth([3, 50, 97][rng.below(3) as usize]),
    }
}

fn reduce_supports(op: ReduceOp, dt: DataType) -> bool {
    match op {
        ReduceOp::Mean => is_float(dt),
        ReduceOp::Sum | ReduceOp::Prod => dt != DataType::Bool,
        _ => true,
    }
}

/// f32 products of very long rows accumulate ~sqrt(n)·eps relative error.
fn bound_for(dt: DataType, multiplicative: bool, len: i64) -> f64 {
    match dt {
        // Products of many factors near 1 accumulate biased rounding: the error lies between
        // sqrt(len) x eps and len x eps (len = 1e5: 2e-5 .. 6e-3).
        DataType::F32 if multiplicative && len > 10_000 => 3e-3,
        // Rounding error grows with the row length (about len x eps in the worst case).
        DataType::F64 if len > 10_000 => 1e-10,
        _ => float_bound(dt),
    }
}

// ---- tests ---------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduce_matches_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(71);
    let mut report = Report::new("reduce");
    for op in REDUCE_OPS {
        for dt in ALL {
            if !reduce_supports(op, dt) {
                continue;
            }
            for (dims, axis) in shapes() {
                for view in VIEWS {
                    let case = format!("{op:?} {dt:?} {dims:?} axis {axis} {view:?}");
                    let g = reduce_gen(op, &mut rng);
                    let (x, v) = input(&s, &mut rng, &dims, axis, view, dt, g);
                    let mut od = dims.clone();
                    od[axis] = 1;
                    let odt = if matches!(op, ReduceOp::Any | ReduceOp::All) {
                        DataType::Bool
                    } else {
                        dt
                    };
                    let out = poisoned(&s, &od, &output_strides(view, &od), odt);
                    if let Err(e) = reduce::reduce(&s, op, &x.t, axis, &out.m) {
                        report.fail(case, e.to_string());
                        continue;
                    }
                    let got = download(&s, &out);
                    let want: Vec<Want> = rows(&v, &dims, axis).iter().map(|r| reduce_ref(op, dt, r)).collect();
                    let exact = matches!(op, ReduceOp::Max | ReduceOp::Min);
                    let bound = bound_for(dt, op == ReduceOp::Prod, dims[axis]);
                    report.check(case, odt, &want, &got, exact, bound);
                }
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduce_all_matches_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(72);
    let mut report = Report::new("reduce_all");
    let shapes: Vec<Vec<i64>> = vec![vec![1], vec![3, 4], vec![257, 513], vec![100_000], vec![2, 3, 5, 7]];
    for op in REDUCE_OPS {
        for dt in ALL {
            if !reduce_supports(op, dt) {
                continue;
            }
            for dims in &shapes {
                for view in [View::Packed, View::Transposed] {
                    let case = format!("{op:?} {dt:?} {dims:?} {view:?}");
                    let g = reduce_gen(op, &mut rng);
                    let (x, v) = input(&s, &mut rng, dims, 0, view, dt, g);
                    let odt = if matches!(op, ReduceOp::Any | ReduceOp::All) {
                        DataType::Bool
                    } else {
                        dt
                    };
                    let od = vec![1i64; dims.len()];
                    let out = poisoned(&s, &od, &contiguous(&od), odt);
                    if let Err(e) = reduce::reduce_all(&s, op, &x.t, &out.m) {
                        report.fail(case, e.to_string());
                        continue;
                    }
                    let got = download(&s, &out);
                    let want = vec![reduce_ref(op, dt, &v)];
                    let exact = matches!(op, ReduceOp::Max | ReduceOp::Min);
                    let bound = bound_for(dt, op == ReduceOp::Prod, v.len() as i64);
                    report.check(case, odt, &want, &got, exact, bound);
                }
            }
        }
    }
    // Empty inputs: identities for sum / prod / any / all; errors for max / min.
    for dt in [DataType::F32, DataType::I32] {
        for (op, want) in [
            (ReduceOp::Sum, 0.0),
            (ReduceOp::Prod, 1.0),
            (ReduceOp::Any, 0.0),
            (ReduceOp::All, 1.0),
        ] {
            let case = format!("empty {op:?} {dt:?}");
            let x = upload(&s, &[], &[0, 3], &[3, 1], dt);
            let odt = if matches!(op, ReduceOp::Any | ReduceOp::All) {
                DataType::Bool
            } else {
                dt
            };
            let out = poisoned(&s, &[1], &[1], odt);
            if let Err(e) = reduce::reduce_all(&s, op, &x.t, &out.m) {
                report.fail(case, e.to_string());
                continue;
            }
            let got = download(&s, &out);
            let w = if is_float(odt) {
                Want::F(want)
            } else {
                Want::I(want as i64)
            };
            report.check(case, odt, &[w], &got, true, 0.0);
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn empty_axes_and_errors() {
    let s = stream();
    let mut report = Report::new("empty axes");
    let x = upload(&s, &[], &[4, 0], &[1, 1], DataType::F32);
    for (op, want) in [(ReduceOp::Sum, 0.0), (ReduceOp::Prod, 1.0), (ReduceOp::Mean, f64::NAN)] {
        let out = poisoned(&s, &[4, 1], &[1, 1], DataType::F32);
        let case = format!("{op:?} over an empty axis");
        match reduce::reduce(&s, op, &x.t, 1, &out.m) {
            Ok(()) => {
                let got = download(&s, &out);
                report.check(
                    case,
                    DataType::F32,
                    &[Want::F(want), Want::F(want), Want::F(want), Want::F(want)],
                    &got,
                    true,
                    0.0,
                );
            }
            Err(e) => report.fail(case, e.to_string()),
        }
    }
    for op in [ReduceOp::Max, ReduceOp::Min] {
        let out = poisoned(&s, &[4, 1], &[1, 1], DataType::F32);
        report.cases += 1;
        if !matches!(
            reduce::reduce(&s, op, &x.t, 1, &out.m),
            Err(cudnn_backend::Error::InvalidArgument { .. })
        ) {
            report
                .failures
                .push(format!("{op:?} over an empty axis: expected InvalidArgument"));
        }
    }
    let out = poisoned(&s, &[4, 1], &[1, 1], DataType::I64);
    report.cases += 1;
    if reduce::arg_reduce(&s, ArgOp::ArgMax, &x.t, 1, &out.m).is_ok() {
        report
            .failures
            .push("ArgMax over an empty axis: expected an error".into());
    }
    // Empty outputs are a no-op.
    let xe = upload(&s, &[], &[0, 5], &[5, 1], DataType::F32);
    let oe = poisoned(&s, &[0, 1], &[1, 1], DataType::F32);
    report.cases += 1;
    if let Err(e) = reduce::reduce(&s, ReduceOp::Max, &xe.t, 1, &oe.m) {
        report.failures.push(format!("empty output: {e}"));
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn arg_reduce_matches_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(73);
    let mut report = Report::new("arg_reduce");
    for op in [ArgOp::ArgMax, ArgOp::ArgMin] {
        for dt in ALL {
            for (dims, axis) in shapes() {
                for view in VIEWS {
                    let case = format!("{op:?} {dt:?} {dims:?} axis {axis} {view:?}");
                    let (x, v) = input(&s, &mut rng, &dims, axis, view, dt, Gen::Ties);
                    let mut od = dims.clone();
                    od[axis] = 1;
                    let out = poisoned(&s, &od, &output_strides(view, &od), DataType::I64);
                    if let Err(e) = reduce::arg_reduce(&s, op, &x.t, axis, &out.m) {
                        report.fail(case, e.to_string());
                        continue;
                    }
                    let got = download(&s, &out);
                    let want: Vec<Want> = rows(&v, &dims, axis).iter().map(|r| Want::I(arg_ref(op, r))).collect();
                    report.check(case, DataType::I64, &want, &got, true, 0.0);
                }
            }
        }
    }
    // NaN rule, short and long rows (thread, warp and block paths), NaN at index 0 in some rows.
    for dt in FLOATS {
        for (dims, axis) in [
            (vec![2000, 3], 1usize),
            (vec![50, 40], 1),
            (vec![6, 5000], 1),
            (vec![40, 50], 0),
        ] {
            for op in [ArgOp::ArgMax, ArgOp::ArgMin] {
                let case = format!("NaN {op:?} {dt:?} {dims:?} axis {axis}");
                let n: i64 = dims.iter().product();
                let mut v = gen(&mut rng, dt, Gen::Ties, n as usize);
                for x in v.iter_mut() {
                    if rng.below(10) == 0 {
                        *x = f64::NAN;
                    }
                }
                // Make some rows start with a NaN.
                let len = dims[axis];
                let n_out = n / len;
                for o in (0..n_out).step_by(3) {
                    v[index_of(&dims, axis, o, 0)] = f64::NAN;
                }
                let x = upload(&s, &v, &dims, &contiguous(&dims), dt);
                let mut od = dims.clone();
                od[axis] = 1;
                let out = poisoned(&s, &od, &contiguous(&od), DataType::I64);
                if let Err(e) = reduce::arg_reduce(&s, op, &x.t, axis, &out.m) {
                    report.fail(case, e.to_string());
                    continue;
                }
                let got = download(&s, &out);
                let want: Vec<Want> = rows(&v, &dims, axis).iter().map(|r| Want::I(arg_ref(op, r))).collect();
                report.check(case.clone(), DataType::I64, &want, &got, true, 0.0);
                // Max/Min propagate the NaN.
                let rop = if op == ArgOp::ArgMax {
                    ReduceOp::Max
                } else {
                    ReduceOp::Min
                };
                let outv = poisoned(&s, &od, &contiguous(&od), dt);
                if let Err(e) = reduce::reduce(&s, rop, &x.t, axis, &outv.m) {
                    report.fail(case, e.to_string());
                    continue;
                }
                let got = download(&s, &outv);
                let want: Vec<Want> = rows(&v, &dims, axis).iter().map(|r| reduce_ref(rop, dt, r)).collect();
                report.check(format!("{case} values"), dt, &want, &got, true, 0.0);
            }
        }
    }
    // Hand-written ties and NaNs.
    let fixed: [(&[f64], i64, i64); 5] = [
        (&[f64::NAN, 1.0, 2.0], 0, 0),
        (&[1.0, f64::NAN, 3.0, 3.0], 2, 0),
        (&[2.0, f64::NAN], 0, 0),
        (&[5.0, 5.0, 1.0, 1.0], 0, 2),
        (&[-1.0, 4.0, -2.0, 4.0, -2.0], 1, 2),
    ];
    for (row, amax, amin) in fixed {
        for (op, want) in [(ArgOp::ArgMax, amax), (ArgOp::ArgMin, amin)] {
            let case = format!("fixed {op:?} {row:?}");
            let n = row.len() as i64;
            let x = upload(&s, row, &[1, n], &[n, 1], DataType::F32);
            let out = poisoned(&s, &[1, 1], &[1, 1], DataType::I64);
            match reduce::arg_reduce(&s, op, &x.t, 1, &out.m) {
                Ok(()) => {
                    let got = download(&s, &out);
                    report.check(case, DataType::I64, &[Want::I(want)], &got, true, 0.0);
                }
                Err(e) => report.fail(case, e.to_string()),
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scan_matches_reference() {
    scan_suite("scan", 74, &shapes());
}

/// Only rows that take the block-per-row scan (longer than 64, so shared memory is used):
/// one chunk, a partial second chunk, and many chunks with a carried prefix, over few rows;
/// small enough to run under compute-sanitizer's racecheck.
#[test]
#[ignore = "needs a CUDA GPU"]
fn block_scans_of_few_rows() {
    let shapes = vec![
        (vec![3, 65], 1),
        (vec![2, 300, 3], 1),
        (vec![17, 1000], 0),
        (vec![2, 5000], 1),
    ];
    scan_suite("block scans", 77, &shapes);
}

/// Every scan op in every dtype on `shapes` in every view, against the reference.
fn scan_suite(name: &'static str, seed: u64, shapes: &[(Vec<i64>, usize)]) {
    let s = stream();
    let mut rng = SplitMix64::new(seed);
    let mut report = Report::new(name);
    let shard = Shard::from_env();
    for (o, op) in SCAN_OPS.into_iter().enumerate() {
        for (d, dt) in ALL.into_iter().enumerate() {
            if dt == DataType::Bool && matches!(op, ScanOp::CumSum | ScanOp::CumProd) {
                continue;
            }
            if !shard.has(o * ALL.len() + d) {
                continue;
            }
            for (dims, axis) in shapes.iter().cloned() {
                for view in VIEWS {
                    let case = format!("{op:?} {dt:?} {dims:?} axis {axis} {view:?}");
                    let g = match op {
                        ScanOp::CumSum => Gen::Additive,
                        ScanOp::CumProd => Gen::Multiplicative,
                        _ => Gen::Ties,
                    };
                    let (x, v) = input(&s, &mut rng, &dims, axis, view, dt, g);
                    let out = poisoned(&s, &dims, &output_strides(view, &dims), dt);
                    if let Err(e) = reduce::scan(&s, op, &x.t, axis, &out.m) {
                        report.fail(case, e.to_string());
                        continue;
                    }
                    let got = download(&s, &out);
                    // The reference in logical row-major order of the output.
                    let mut want: Vec<Want> = (0..v.len()).map(|_| Want::I(0)).collect();
                    for (o, r) in rows(&v, &dims, axis).iter().enumerate() {
                        for (k, w) in scan_ref(op, dt, r).into_iter().enumerate() {
                            want[index_of(&dims, axis, o as i64, k as i64)] = w;
                        }
                    }
                    let exact = matches!(op, ScanOp::CumMax | ScanOp::CumMin);
                    let bound = bound_for(dt, op == ScanOp::CumProd, dims[axis]);
                    report.check(case, dt, &want, &got, exact, bound);
                }
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn float_results_are_bitwise_reproducible() {
    let s = stream();
    let mut rng = SplitMix64::new(75);
    let mut report = Report::new("reproducibility");
    let cases: [(Vec<i64>, usize); 4] = [
        (vec![1, 100_000], 1),
        (vec![1000, 17], 0),
        (vec![64, 65], 1),
        (vec![30_000, 2], 0),
    ];
    for dt in [DataType::F32, DataType::F16] {
        for (dims, axis) in &cases {
            let (x, _) = input(&s, &mut rng, dims, *axis, View::Transposed, dt, Gen::Additive);
            let mut od = dims.clone();
            od[*axis] = 1;
            let run = |f: &dyn Fn(&Dev) -> cudnn_backend::Result<()>, od: &[i64]| -> Option<Vec<u8>> {
                let out = poisoned(&s, od, &contiguous(od), dt);
                f(&out).ok()?;
                s.clone_dtoh(&out.buf).ok()
            };
            let sum = |o: &Dev| reduce::reduce(&s, ReduceOp::Sum, &x.t, *axis, &o.m);
            let cum = |o: &Dev| reduce::scan(&s, ScanOp::CumSum, &x.t, *axis, &o.m);
            let all = |o: &Dev| reduce::reduce_all(&s, ReduceOp::Sum, &x.t, &o.m);
            let one = vec![1i64; dims.len()];
            type Launch<'a> = &'a dyn Fn(&Dev) -> cudnn_backend::Result<()>;
            let runs: [(&str, Launch, &Vec<i64>); 3] =
                [("sum", &sum, &od), ("cumsum", &cum, dims), ("sum_all", &all, &one)];
            for (name, f, shape) in runs {
                report.cases += 1;
                let a = run(f, shape);
                let b = run(f, shape);
                if a.is_none() || a != b {
                    report
                        .failures
                        .push(format!("{name} {dt:?} {dims:?} axis {axis}: runs differ (or failed)"));
                }
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn int_and_bool_values_are_exact_for_every_dtype() {
    // A compact cross-check of the integer paths on a mid-size shape with every view,
    // including wrapping sums of large i32/u8 values.
    let s = stream();
    let mut rng = SplitMix64::new(76);
    let mut report = Report::new("int sums");
    for dt in INTS {
        for view in VIEWS {
            let dims = vec![33, 1500];
            let case = format!("Sum {dt:?} {dims:?} axis 1 {view:?}");
            let (x, v) = input(&s, &mut rng, &dims, 1, view, dt, Gen::Additive);
            let out = poisoned(&s, &[33, 1], &[1, 1], dt);
            if let Err(e) = reduce::reduce(&s, ReduceOp::Sum, &x.t, 1, &out.m) {
                report.fail(case, e.to_string());
                continue;
            }
            let got = download(&s, &out);
            let want: Vec<Want> = rows(&v, &dims, 1)
                .iter()
                .map(|r| reduce_ref(ReduceOp::Sum, dt, r))
                .collect();
            report.check(case, dt, &want, &got, true, 0.0);
        }
    }
    report.finish();
}

// ---- long rows, long columns and big tensors (the split-row and column paths) ----------------

/// [`rows`] for big inputs: row `o = i * inner + j` of the `(outer, len, inner)` view of the
/// logical row-major values, element `k` at `(i * len + k) * inner + j`.
fn rows_fast(values: &[f64], dims: &[i64], axis: usize) -> Vec<Vec<f64>> {
    let len = dims[axis] as usize;
    let outer = dims[..axis].iter().product::<i64>() as usize;
    let inner = dims[axis + 1..].iter().product::<i64>() as usize;
    let mut out = Vec::with_capacity(outer * inner);
    for i in 0..outer {
        for j in 0..inner {
            out.push((0..len).map(|k| values[(i * len + k) * inner + j]).collect());
        }
    }
    out
}

/// Any/all inputs whose answers hinge on single elements: everything is 0 (any) or 1 (all)
/// except one opposite element, at a random position, in every third row.
fn sparse_truth(rng: &mut SplitMix64, dims: &[i64], axis: usize, any: bool) -> Vec<f64> {
    let len = dims[axis] as usize;
    let inner = dims[axis + 1..].iter().product::<i64>() as usize;
    let n = dims.iter().product::<i64>() as usize;
    let base = if any { 0.0 } else { 1.0 };
    let mut v = vec![base; n];
    for o in (0..n / len).step_by(3) {
        let (i, j) = (o / inner, o % inner);
        let k = rng.below(len as u64) as usize;
        v[(i * len + k) * inner + j] = 1.0 - base;
    }
    v
}

/// The ops checked on long rows / columns of `dt`: f16 sums of long rows overflow f16, and
/// float products of thousands of factors are covered by the row-path tests.
fn big_ops(dt: DataType, len: i64) -> Vec<ReduceOp> {
    match dt {
        DataType::Bool => vec![ReduceOp::Any, ReduceOp::All],
        DataType::F16 if len > 50_000 => vec![ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min],
        _ if is_float(dt) => vec![ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min],
        _ => vec![ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max],
    }
}

/// Random values for `op` on `dims` (sparse truth values for any/all).
fn big_values(rng: &mut SplitMix64, op: ReduceOp, dt: DataType, dims: &[i64], axis: usize) -> Vec<f64> {
    match op {
        ReduceOp::Any | ReduceOp::All => sparse_truth(rng, dims, axis, op == ReduceOp::Any),
        _ => {
            let g = reduce_gen(op, rng);
            gen(rng, dt, g, dims.iter().product::<i64>() as usize)
        }
    }
}

fn out_dtype(op: ReduceOp, dt: DataType) -> DataType {
    if matches!(op, ReduceOp::Any | ReduceOp::All) {
        DataType::Bool
    } else {
        dt
    }
}

/// One `reduce` of `dims` over `axis` (packed or transposed input and output) against the
/// reference, with the usual tolerances.
fn big_reduce_case(
    s: &Arc<CudaStream>,
    rng: &mut SplitMix64,
    report: &mut Report,
    (op, dt): (ReduceOp, DataType),
    dims: &[i64],
    axis: usize,
    view: View,
) {
    let case = format!("{op:?} {dt:?} {dims:?} axis {axis} {view:?}");
    let v = big_values(rng, op, dt, dims, axis);
    let x = upload(s, &v, dims, &input_strides(view, dims, axis).0, dt);
    let mut od = dims.to_vec();
    od[axis] = 1;
    let odt = out_dtype(op, dt);
    let out = poisoned(s, &od, &output_strides(view, &od), odt);
    if let Err(e) = reduce::reduce(s, op, &x.t, axis, &out.m) {
        report.fail(case, e.to_string());
        return;
    }
    let got = download(s, &out);
    let want: Vec<Want> = rows_fast(&v, dims, axis)
        .iter()
        .map(|r| reduce_ref(op, dt, r))
        .collect();
    let exact = matches!(op, ReduceOp::Max | ReduceOp::Min);
    let bound = bound_for(dt, op == ReduceOp::Prod, dims[axis]);
    report.check(case, odt, &want, &got, exact, bound);
}

const BIG_DTYPES: [DataType; 7] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::F64,
    DataType::I32,
    DataType::I64,
    DataType::Bool,
];

/// Few long rows take the split-row path (chunks of a row reduced by separate blocks into
/// scratch, then combined); the transposed views of the same shapes take the split column
/// path (3 contiguous outputs).
#[test]
#[ignore = "needs a CUDA GPU"]
fn split_rows_match_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(78);
    let mut report = Report::new("split rows");
    for view in [View::Packed, View::Transposed] {
        for dt in BIG_DTYPES {
            for op in big_ops(dt, 300_000) {
                big_reduce_case(&s, &mut rng, &mut report, (op, dt), &[3, 300_000], 1, view);
            }
        }
    }
    // Batch-norm style statistics: 64 rows of 131072.
    for dt in [DataType::F32, DataType::F16, DataType::BF16] {
        for op in [ReduceOp::Mean, ReduceOp::Max, ReduceOp::Sum] {
            if dt == DataType::F16 && op == ReduceOp::Sum {
                continue;
            }
            big_reduce_case(&s, &mut rng, &mut report, (op, dt), &[64, 131_072], 1, View::Packed);
        }
    }
    // NaN anywhere in a long row wins for max/min (in one chunk of several).
    for dt in [DataType::F32, DataType::BF16] {
        for op in [ReduceOp::Max, ReduceOp::Min] {
            let dims = [4i64, 100_000];
            let case = format!("NaN {op:?} {dt:?} {dims:?}");
            let mut v = gen(&mut rng, dt, Gen::Ties, 400_000);
            v[77_777] = f64::NAN; // row 0
            v[2 * 100_000 + 99_999] = f64::NAN; // row 2, last element
            let x = upload(&s, &v, &dims, &contiguous(&dims), dt);
            let out = poisoned(&s, &[4, 1], &[1, 1], dt);
            if let Err(e) = reduce::reduce(&s, op, &x.t, 1, &out.m) {
                report.fail(case, e.to_string());
                continue;
            }
            let got = download(&s, &out);
            let want: Vec<Want> = rows_fast(&v, &dims, 1).iter().map(|r| reduce_ref(op, dt, r)).collect();
            report.check(case, dt, &want, &got, true, 0.0);
        }
    }
    report.finish();
}

/// `reduce_all` of ~1e6 elements (packed, and transposed: rows that are not linear in
/// memory) and of 3e7 elements: the split-row path with one row.
#[test]
#[ignore = "needs a CUDA GPU"]
fn big_reduce_all_matches_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(79);
    let mut report = Report::new("big reduce_all");
    let mut cases: Vec<(Vec<i64>, View, DataType, ReduceOp)> = Vec::new();
    for view in [View::Packed, View::Transposed] {
        for dt in BIG_DTYPES {
            for op in big_ops(dt, 1_000_000) {
                cases.push((vec![1000, 1000], view, dt, op));
            }
        }
    }
    for (dt, op) in [
        (DataType::F32, ReduceOp::Sum),
        (DataType::F32, ReduceOp::Mean),
        (DataType::F32, ReduceOp::Max),
        (DataType::BF16, ReduceOp::Mean),
        (DataType::BF16, ReduceOp::Min),
        (DataType::I32, ReduceOp::Sum),
        (DataType::Bool, ReduceOp::All),
    ] {
        cases.push((vec![30_000_000], View::Packed, dt, op));
    }
    for (dims, view, dt, op) in cases {
        let case = format!("{op:?} {dt:?} {dims:?} {view:?}");
        let n: i64 = dims.iter().product();
        let v = big_values(&mut rng, op, dt, &[n], 0);
        let x = upload(&s, &v, &dims, &input_strides(view, &dims, 0).0, dt);
        let odt = out_dtype(op, dt);
        let od = vec![1i64; dims.len()];
        let out = poisoned(&s, &od, &contiguous(&od), odt);
        if let Err(e) = reduce::reduce_all(&s, op, &x.t, &out.m) {
            report.fail(case, e.to_string());
            continue;
        }
        let got = download(&s, &out);
        let want = vec![reduce_ref(op, dt, &v)];
        let exact = matches!(op, ReduceOp::Max | ReduceOp::Min);
        let bound = bound_for(dt, op == ReduceOp::Prod, n);
        report.check(case, odt, &want, &got, exact, bound);
    }
    report.finish();
}

/// Reductions over a non-innermost axis take the column path (consecutive threads on
/// consecutive outputs), split across blocks when there are few output tiles: a bias
/// gradient (dim 0 of [8192, 2048]), dims 0 / 1 / 2 of [128, 64, 1024], narrow columns,
/// several outer tiles, and a column-major input reduced over its last dim.
#[test]
#[ignore = "needs a CUDA GPU"]
fn column_reductions_match_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(80);
    let mut report = Report::new("columns");
    let shard = Shard::from_env();
    let cases: Vec<(Vec<i64>, usize, View)> = vec![
        (vec![8192, 2048], 0, View::Packed),
        (vec![128, 64, 1024], 0, View::Packed),
        (vec![128, 64, 1024], 1, View::Packed),
        (vec![128, 64, 1024], 2, View::Packed),
        (vec![30_000, 3], 0, View::Packed),
        (vec![16, 2048, 8], 1, View::Packed),
        (vec![2048, 8192], 1, View::Transposed),
    ];
    for (c, (dims, axis, view)) in cases.iter().enumerate() {
        if !shard.has(c) {
            continue;
        }
        for dt in BIG_DTYPES {
            for op in big_ops(dt, dims[*axis]) {
                big_reduce_case(&s, &mut rng, &mut report, (op, dt), dims, *axis, *view);
            }
        }
    }
    report.finish();
}

/// The split-row, split-column, column and big reduce_all paths give bitwise identical
/// results run to run (fixed chunking and combine order, no atomics).
#[test]
#[ignore = "needs a CUDA GPU"]
fn split_and_column_paths_are_bitwise_reproducible() {
    let s = stream();
    let mut rng = SplitMix64::new(81);
    let mut report = Report::new("split reproducibility");
    let cases: [(Vec<i64>, Option<usize>, DataType, ReduceOp); 5] = [
        (vec![64, 131_072], Some(1), DataType::F32, ReduceOp::Sum),
        (vec![8192, 2048], Some(0), DataType::F32, ReduceOp::Sum),
        (vec![8192, 2048], Some(0), DataType::BF16, ReduceOp::Mean),
        (vec![128, 64, 1024], Some(0), DataType::F16, ReduceOp::Sum),
        (vec![10_000_000], None, DataType::F32, ReduceOp::Sum),
    ];
    for (dims, axis, dt, op) in cases {
        let v = gen(&mut rng, dt, Gen::Additive, dims.iter().product::<i64>() as usize);
        let x = upload(&s, &v, &dims, &contiguous(&dims), dt);
        let od: Vec<i64> = match axis {
            Some(a) => {
                let mut od = dims.clone();
                od[a] = 1;
                od
            }
            None => vec![1; dims.len()],
        };
        let run = || -> Option<Vec<u8>> {
            let out = poisoned(&s, &od, &contiguous(&od), dt);
            match axis {
                Some(a) => reduce::reduce(&s, op, &x.t, a, &out.m).ok()?,
                None => reduce::reduce_all(&s, op, &x.t, &out.m).ok()?,
            }
            s.clone_dtoh(&out.buf).ok()
        };
        report.cases += 1;
        let first = run();
        let same = first.is_some() && (0..3).all(|_| run() == first);
        if !same {
            report
                .failures
                .push(format!("{op:?} {dt:?} {dims:?} axis {axis:?}: runs differ (or failed)"));
        }
    }
    report.finish();
}
