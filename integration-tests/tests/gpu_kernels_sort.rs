//! The sort kernel (`cudnn_backend::kernels::sort`) against a CPU stable sort: every
//! dtype, ascending and descending, many ties (small ints), NaN, ±inf and ±0 for floats,
//! row lengths 1 to 4096 (one block per row) and 4097 to 100 000 (chunk sort + merge
//! passes), the axis first, in the middle and last, packed, transposed and gapped layouts,
//! poisoned outputs; values (bit for bit) and indices must match exactly. Needs a CUDA GPU.

use std::cmp::Ordering;
use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::sort as so;
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{gather_from_strided, scatter_to_strided, strided_len, SplitMix64};
use half::{bf16, f16};
use integration_tests::views_of;
use integration_tests::{round_to, Shard};

use DataType::*;

const ALL: [DataType; 9] = [F32, F16, BF16, F64, I64, I32, I8, U8, Bool];
const LENS: [i64; 6] = [1, 2, 3, 17, 1000, 4096];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

// ---------------------------------------------------------------------------------------
// Host <-> device in every dtype (values carried as f64: ints stay below 2^53 here)

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
            // A poisoned (unwritten) bool shows as -1.
            Bool if c[0] > 1 => -1.0,
            U8 | Bool => c[0] as f64,
            I8 => c[0] as i8 as f64,
        })
        .collect()
}

struct Dev {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
    /// Logical values (row-major, already converted to the dtype).
    values: Vec<f64>,
}

fn us(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

fn upload(stream: &Arc<CudaStream>, values: &[f64], dims: &[i64], st: &[i64], dtype: DataType) -> Dev {
    let values: Vec<f64> = values
        .iter()
        .map(|&v| if dtype.is_float() { round_to(dtype, v) } else { v })
        .collect();
    let len = strided_len(&us(dims), &us(st)).max(1);
    let mut host = vec![if dtype.is_float() { f64::NAN } else { 77.0 }; len];
    scatter_to_strided(&values, &us(dims), &us(st), &mut host);
    let buf = stream.clone_htod(&encode(dtype, &host)).expect("upload");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(stream, &buf, 0, dims, st, dtype) };
    Dev { t, m, buf, values }
}

/// Byte an output is poisoned with: 0x7B for floats (a large finite value no input
/// holds, so a NaN in the output is never mistaken for poison), 0xFF for bool (invalid)
/// and 0xA5 for ints.
fn poison_byte(dtype: DataType) -> u8 {
    match dtype {
        Bool => 0xFF,
        d if d.is_float() => 0x7B,
        _ => 0xA5,
    }
}

fn poisoned(stream: &Arc<CudaStream>, dims: &[i64], st: &[i64], dtype: DataType) -> Dev {
    let len = strided_len(&us(dims), &us(st)).max(1);
    let buf = stream
        .clone_htod(&vec![poison_byte(dtype); len * dtype.size()])
        .expect("alloc");
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

fn numel(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

// ---------------------------------------------------------------------------------------
// Layouts

fn packed(dims: &[i64]) -> Vec<i64> {
    row_major_strides(dims).to_vec()
}

/// Strides of `dims` stored with the dim order reversed (a full transpose).
fn reversed(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![0i64; dims.len()];
    let mut acc = 1;
    for (d, &n) in dims.iter().enumerate() {
        s[d] = acc;
        acc *= n;
    }
    s
}

/// Packed strides with a gap of one element between neighbours (every stride doubled).
fn gapped(dims: &[i64]) -> Vec<i64> {
    packed(dims).iter().map(|s| s * 2).collect()
}

/// One case: dims, the axis, and the strides of x, values and indices.
#[derive(Clone, Debug)]
struct Case {
    dims: Vec<i64>,
    axis: usize,
    x: Vec<i64>,
    values: Vec<i64>,
    indices: Vec<i64>,
}

/// Every row length with the axis first, in the middle and last, once packed and once
/// with a transposed input and gapped / transposed outputs; plus a rank-1 row.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for len in LENS {
        out.push(Case {
            dims: vec![len],
            axis: 0,
            x: vec![1],
            values: vec![1],
            indices: vec![1],
        });
        for (axis, dims) in [(0, vec![len, 3, 2]), (1, vec![3, len, 2]), (2, vec![3, 2, len])] {
            out.push(Case {
                x: packed(&dims),
                values: packed(&dims),
                indices: packed(&dims),
                dims: dims.clone(),
                axis,
            });
            out.push(Case {
                x: reversed(&dims),
                values: gapped(&dims),
                indices: reversed(&dims),
                dims,
                axis,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Reference

/// Total order of the sort: NaN above everything, -0.0 == +0.0.
fn total(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).expect("not NaN"),
    }
}

/// Stable CPU sort of every row of `x` (row-major `dims`) along `axis`: (values, indices).
fn reference(x: &[f64], dims: &[i64], axis: usize, descending: bool) -> (Vec<f64>, Vec<f64>) {
    let len = dims[axis] as usize;
    let inner: usize = dims[axis + 1..].iter().product::<i64>() as usize;
    let outer: usize = dims[..axis].iter().product::<i64>() as usize;
    let mut values = vec![0.0; x.len()];
    let mut indices = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * len + k) * inner + i;
            let mut row: Vec<(f64, usize)> = (0..len).map(|k| (x[at(k)], k)).collect();
            if descending {
                row.sort_by(|a, b| total(b.0, a.0));
            } else {
                row.sort_by(|a, b| total(a.0, b.0));
            }
            for (k, &(v, j)) in row.iter().enumerate() {
                values[at(k)] = v;
                indices[at(k)] = j as f64;
            }
        }
    }
    (values, indices)
}

// ---------------------------------------------------------------------------------------
// Report

struct Report {
    name: &'static str,
    runs: usize,
    failures: Vec<String>,
}

impl Report {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            runs: 0,
            failures: Vec::new(),
        }
    }

    /// Bit-exact equality (any NaN equals any NaN; -0.0 differs from +0.0).
    fn exact(&mut self, case: String, out: &[f64], reference: &[f64]) {
        self.runs += 1;
        let same = |o: f64, r: f64| (o.is_nan() && r.is_nan()) || o.to_bits() == r.to_bits();
        let mismatches = out.iter().zip(reference).filter(|(&o, &r)| !same(o, r)).count();
        if out.len() != reference.len() {
            self.failures
                .push(format!("{case}: {} values, expected {}", out.len(), reference.len()));
        } else if let Some(i) = out.iter().zip(reference).position(|(&o, &r)| !same(o, r)) {
            self.failures.push(format!(
                "{case}: {mismatches} mismatches, first at {i}: got {} expected {}",
                out[i], reference[i]
            ));
        }
    }

    fn error(&mut self, case: String, e: cudnn_backend::Error) {
        self.runs += 1;
        self.failures.push(format!("{case}: {e}"));
    }

    fn finish(self) {
        println!(
            "sort {}: {} checks, {} failed",
            self.name,
            self.runs,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{} failures:\n{}",
            self.name,
            self.failures.join("\n")
        );
    }
}

// ---------------------------------------------------------------------------------------
// Random inputs

/// A random value of `dtype`, with many ties; floats include NaN, ±inf and ±0.
fn rand_val(rng: &mut SplitMix64, dtype: DataType) -> f64 {
    let tie = rng.below(2) == 0;
    match dtype {
        Bool => rng.below(2) as f64,
        U8 if tie => rng.below(4) as f64,
        U8 => rng.below(256) as f64,
        I8 if tie => rng.below(5) as f64 - 2.0,
        I8 => rng.below(256) as f64 - 128.0,
        I32 | I64 if tie => rng.below(7) as f64 - 3.0,
        I32 => [i32::MIN as f64, i32::MAX as f64, rng.below(2_000_000_001) as f64 - 1e9][rng.below(3) as usize],
        I64 => [
            -(2f64.powi(53)),
            2f64.powi(53),
            rng.below(1 << 40) as f64 - 2f64.powi(39),
        ][rng.below(3) as usize],
        _ => match rng.below(12) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => -0.0,
            4 => 0.0,
            5..=7 => rng.below(5) as f64 - 2.0,
            _ => rng.next_f64() * 8.0 - 4.0,
        },
    }
}

fn rand_vec(rng: &mut SplitMix64, n: usize, dtype: DataType) -> Vec<f64> {
    (0..n).map(|_| rand_val(rng, dtype)).collect()
}

// ---------------------------------------------------------------------------------------
// Tests

/// Sorts every case in every dtype both ways; `outputs` picks values and/or indices.
fn run(r: &mut Report, s: &Arc<CudaStream>, rng: &mut SplitMix64, cases: &[Case], outputs: (bool, bool)) {
    let shard = Shard::from_env();
    for (c, case) in cases.iter().enumerate() {
        for (d, dtype) in ALL.into_iter().enumerate() {
            if !shard.has(c * ALL.len() + d) {
                continue;
            }
            for descending in [false, true] {
                let x = upload(s, &rand_vec(rng, numel(&case.dims), dtype), &case.dims, &case.x, dtype);
                let v = poisoned(s, &case.dims, &case.values, dtype);
                let i = poisoned(s, &case.dims, &case.indices, I64);
                let name = format!("{dtype:?} desc {descending} {case:?}");
                let res = so::sort(
                    s,
                    &x.t,
                    case.axis,
                    descending,
                    outputs.0.then_some(&v.m),
                    outputs.1.then_some(&i.m),
                );
                if let Err(e) = res {
                    r.error(name, e);
                    continue;
                }
                let (want_v, want_i) = reference(&x.values, &case.dims, case.axis, descending);
                if outputs.0 {
                    r.exact(format!("{name} values"), &download(s, &v), &want_v);
                }
                if outputs.1 {
                    r.exact(format!("{name} indices"), &download(s, &i), &want_i);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sort_every_dtype_length_axis_and_layout() {
    let s = stream();
    let mut r = Report::new("values+indices");
    run(&mut r, &s, &mut SplitMix64::new(31), &cases(), (true, true));
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sort_values_only_and_indices_only() {
    let s = stream();
    let small: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.dims.len() == 3 && numel(&c.dims) < 200)
        .collect();
    let mut r = Report::new("values only");
    run(&mut r, &s, &mut SplitMix64::new(32), &small, (true, false));
    r.finish();
    let mut r = Report::new("indices only");
    run(&mut r, &s, &mut SplitMix64::new(33), &small, (false, true));
    r.finish();
}

/// One row per kernel path, every dtype both ways: a bitonic sort with fewer elements than
/// threads (3), one element per thread (33, 1000) and several (2049, 4096), and the merge
/// sort with one and two merge passes (4097; 12_289 leaves an odd run), then values only and
/// indices only on the longest rows. Few blocks: small enough to run under racecheck.
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_sort_path_on_single_rows() {
    let s = stream();
    let row = |len: i64| Case {
        dims: vec![len],
        axis: 0,
        x: vec![1],
        values: vec![1],
        indices: vec![1],
    };
    let rows: Vec<Case> = [3, 33, 1000, 2049, 4096, 4097, 12_289].into_iter().map(row).collect();
    let mut r = Report::new("single rows");
    run(&mut r, &s, &mut SplitMix64::new(38), &rows, (true, true));
    run(&mut r, &s, &mut SplitMix64::new(39), &rows[4..], (true, false));
    run(&mut r, &s, &mut SplitMix64::new(40), &rows[4..], (false, true));
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn many_rows_loop_over_the_grid() {
    // More rows than blocks in one launch (65535 * 8), short rows.
    let s = stream();
    let mut r = Report::new("many rows");
    let dims = vec![600_000, 3];
    let case = Case {
        x: packed(&dims),
        values: packed(&dims),
        indices: packed(&dims),
        dims,
        axis: 1,
    };
    let mut rng = SplitMix64::new(34);
    for dtype in [F32, I32] {
        let x = upload(
            &s,
            &rand_vec(&mut rng, numel(&case.dims), dtype),
            &case.dims,
            &case.x,
            dtype,
        );
        let v = poisoned(&s, &case.dims, &case.values, dtype);
        let i = poisoned(&s, &case.dims, &case.indices, I64);
        let name = format!("{dtype:?} {:?}", case.dims);
        if let Err(e) = so::sort(&s, &x.t, case.axis, false, Some(&v.m), Some(&i.m)) {
            r.error(name, e);
            continue;
        }
        let (want_v, want_i) = reference(&x.values, &case.dims, case.axis, false);
        r.exact(format!("{name} values"), &download(&s, &v), &want_v);
        r.exact(format!("{name} indices"), &download(&s, &i), &want_i);
    }
    r.finish();
}

/// Row lengths around the merge thresholds: 2 chunks (one merge pass, the second run
/// short or full), 3 to 5 chunks (an odd run left over), up to 25 chunks (5 passes).
const LONG_LENS: [i64; 8] = [4097, 5000, 8192, 8193, 12_289, 16_385, 40_000, 100_000];

/// Long rows: the axis alone, last of `[2, len]` (packed) and first of `[len, 2]`
/// (transposed input, gapped values, transposed indices).
fn long_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for len in LONG_LENS {
        out.push(Case {
            dims: vec![len],
            axis: 0,
            x: vec![1],
            values: vec![1],
            indices: vec![1],
        });
        let dims = vec![2, len];
        out.push(Case {
            x: packed(&dims),
            values: packed(&dims),
            indices: packed(&dims),
            dims,
            axis: 1,
        });
        if len <= 16_385 {
            let dims = vec![len, 2];
            out.push(Case {
                x: reversed(&dims),
                values: gapped(&dims),
                indices: reversed(&dims),
                dims,
                axis: 0,
            });
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn long_rows_every_dtype_and_layout() {
    let s = stream();
    let mut r = Report::new("long rows values+indices");
    run(&mut r, &s, &mut SplitMix64::new(35), &long_cases(), (true, true));
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn long_rows_values_only_and_indices_only() {
    let s = stream();
    let some: Vec<Case> = long_cases()
        .into_iter()
        .filter(|c| c.dims.len() == 2 && numel(&c.dims) <= 2 * 16_385)
        .collect();
    let mut r = Report::new("long rows values only");
    run(&mut r, &s, &mut SplitMix64::new(36), &some, (true, false));
    r.finish();
    let mut r = Report::new("long rows indices only");
    run(&mut r, &s, &mut SplitMix64::new(37), &some, (false, true));
    r.finish();
}

/// Long rows made only of ties (one value, or two alternating) and already sorted /
/// reverse-sorted rows: the merge must keep the original order of equal keys.
#[test]
#[ignore = "needs a CUDA GPU"]
fn long_rows_ties_and_presorted() {
    let s = stream();
    let mut r = Report::new("long rows ties");
    for len in [4097i64, 12_289, 65_536, 100_000] {
        let n = len as usize;
        let rows: [(&str, Vec<f64>); 5] = [
            ("constant", vec![1.0; n]),
            ("alternating", (0..n).map(|i| (i % 2) as f64).collect()),
            ("ascending", (0..n).map(|i| (i / 3) as f64).collect()),
            ("descending", (0..n).map(|i| ((n - i) / 3) as f64).collect()),
            (
                "nan and inf",
                (0..n).map(|i| [f64::NAN, f64::INFINITY, -0.0, 0.0][i % 4]).collect(),
            ),
        ];
        for (what, vals) in rows {
            for dtype in [F32, I32, BF16] {
                if !dtype.is_float() && what == "nan and inf" {
                    continue;
                }
                for descending in [false, true] {
                    let dims = [len];
                    let x = upload(&s, &vals, &dims, &[1], dtype);
                    let v = poisoned(&s, &dims, &[1], dtype);
                    let i = poisoned(&s, &dims, &[1], I64);
                    let name = format!("{what} {dtype:?} len {len} desc {descending}");
                    if let Err(e) = so::sort(&s, &x.t, 0, descending, Some(&v.m), Some(&i.m)) {
                        r.error(name, e);
                        continue;
                    }
                    let (want_v, want_i) = reference(&x.values, &dims, 0, descending);
                    r.exact(format!("{name} values"), &download(&s, &v), &want_v);
                    r.exact(format!("{name} indices"), &download(&s, &i), &want_i);
                }
            }
        }
    }
    r.finish();
}

/// Many long rows (the chunk grid loops over rows * chunks blocks).
#[test]
#[ignore = "needs a CUDA GPU"]
fn many_long_rows() {
    let s = stream();
    let mut r = Report::new("many long rows");
    let dims = vec![300, 9000];
    let case = Case {
        x: packed(&dims),
        values: packed(&dims),
        indices: packed(&dims),
        dims,
        axis: 1,
    };
    let mut rng = SplitMix64::new(38);
    for dtype in [F32, I64] {
        for descending in [false, true] {
            let x = upload(
                &s,
                &rand_vec(&mut rng, numel(&case.dims), dtype),
                &case.dims,
                &case.x,
                dtype,
            );
            let v = poisoned(&s, &case.dims, &case.values, dtype);
            let i = poisoned(&s, &case.dims, &case.indices, I64);
            let name = format!("{dtype:?} desc {descending} {:?}", case.dims);
            if let Err(e) = so::sort(&s, &x.t, case.axis, descending, Some(&v.m), Some(&i.m)) {
                r.error(name, e);
                continue;
            }
            let (want_v, want_i) = reference(&x.values, &case.dims, case.axis, descending);
            r.exact(format!("{name} values"), &download(&s, &v), &want_v);
            r.exact(format!("{name} indices"), &download(&s, &i), &want_i);
        }
    }
    r.finish();
}
