//! The index kernels (`cudnn_backend::kernels::index`) against straightforward CPU
//! computations in f64: gather and index_select in every dtype, scatter_add and index_add
//! in every dtype they support (with duplicate indices), gather_nd in every dtype and
//! scatter_nd with every update op in every dtype (with duplicate index tuples, NaN for
//! min/max, wrapping ints), I64 and I32 indices, packed, transposed and gapped layouts,
//! poisoned outputs, and out-of-range indices (skipped); the ordered (deterministic)
//! scatter_nd against the host in tuple order, run to run. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::index::{self as ix, ScatterNdOp};
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{gather_from_strided, scatter_to_strided, strided_len, SplitMix64};
use half::{bf16, f16};
use integration_tests::views_of;
use integration_tests::{round_to, KernelReport};

use DataType::*;

const ALL: [DataType; 9] = [F32, F16, BF16, F64, I32, I64, U8, I8, Bool];
const ADD: [DataType; 6] = [F32, F16, BF16, F64, I32, I64];
const INDEX_TYPES: [DataType; 2] = [I64, I32];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

// ---------------------------------------------------------------------------------------
// Host <-> device in every dtype (values carried as f64: ints stay below 2^53 here)

/// `v` as stored in `dtype` (floats rounded; ints and bool are generated in range).
fn to_dtype(dtype: DataType, v: f64) -> f64 {
    if dtype.is_float() {
        round_to(dtype, v)
    } else {
        v
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
    /// Logical values (row-major, already converted to the dtype).
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
    let buf = stream
        .clone_htod(&whole_words(encode(dtype, &host), 0))
        .expect("upload");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(stream, &buf, 0, dims, st, dtype) };
    Dev { t, m, buf, values }
}

/// `bytes` padded with `fill` to whole 4-byte words: 1-byte scatter updates work on the
/// aligned word around the element, so their buffers are allocated in whole words.
fn whole_words(mut bytes: Vec<u8>, fill: u8) -> Vec<u8> {
    bytes.resize(bytes.len().next_multiple_of(4), fill);
    bytes
}

/// Byte an output is poisoned with: 0xFF (NaN for floats, an invalid bool) or 0xA5 (ints).
fn poison_byte(dtype: DataType) -> u8 {
    if dtype.is_float() || dtype == Bool {
        0xFF
    } else {
        0xA5
    }
}

fn poisoned(stream: &Arc<CudaStream>, dims: &[i64], st: &[i64], dtype: DataType) -> Dev {
    let len = strided_len(&us(dims), &us(st)).max(1);
    let buf = stream
        .clone_htod(&whole_words(
            vec![poison_byte(dtype); len * dtype.size()],
            poison_byte(dtype),
        ))
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

/// Coordinates of row-major index `i` in `dims`.
fn coords(mut i: usize, dims: &[i64]) -> Vec<usize> {
    let mut c = vec![0usize; dims.len()];
    for d in (0..dims.len()).rev() {
        let n = dims[d] as usize;
        c[d] = i % n;
        i /= n;
    }
    c
}

/// Row-major index of `c` in `dims`.
fn linear(c: &[usize], dims: &[i64]) -> usize {
    c.iter().zip(dims).fold(0, |acc, (&x, &n)| acc * n as usize + x)
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

/// One layout case: the indexed operand (x or target), the axis, and the iteration
/// operands (indices, out or values).
#[derive(Clone, Debug)]
struct Case {
    data: (Vec<i64>, Vec<i64>),
    axis: usize,
    /// Element-wise form: the indices' dims; 1-D form: `[k]`.
    idx: (Vec<i64>, Vec<i64>),
    /// Strides of out/values (dims are implied).
    other: Vec<i64>,
}

/// Cases for gather / scatter_add (indices of the data's rank).
fn elementwise_cases() -> Vec<Case> {
    let c = |dd: &[i64], ds: Vec<i64>, axis, id: &[i64], is: Vec<i64>, os: Vec<i64>| Case {
        data: (dd.to_vec(), ds),
        axis,
        idx: (id.to_vec(), is),
        other: os,
    };
    vec![
        c(&[17], packed(&[17]), 0, &[23], packed(&[23]), packed(&[23])),
        c(
            &[5, 7],
            reversed(&[5, 7]),
            1,
            &[5, 4],
            reversed(&[5, 4]),
            packed(&[5, 4]),
        ),
        c(
            &[6, 9],
            packed(&[6, 9]),
            0,
            &[10, 9],
            packed(&[10, 9]),
            reversed(&[10, 9]),
        ),
        c(
            &[4, 3, 5],
            reversed(&[4, 3, 5]),
            1,
            &[4, 6, 2],
            packed(&[4, 6, 2]),
            gapped(&[4, 6, 2]),
        ),
        c(
            &[2, 3, 2, 3, 4],
            reversed(&[2, 3, 2, 3, 4]),
            4,
            &[2, 3, 2, 3, 7],
            packed(&[2, 3, 2, 3, 7]),
            reversed(&[2, 3, 2, 3, 7]),
        ),
        c(&[3, 4], gapped(&[3, 4]), 0, &[2, 4], reversed(&[2, 4]), gapped(&[2, 4])),
        c(
            &[300, 257],
            packed(&[300, 257]),
            0,
            &[700, 257],
            packed(&[700, 257]),
            packed(&[700, 257]),
        ),
    ]
}

/// Cases for index_select / index_add (1-D indices of length k).
fn vector_cases() -> Vec<Case> {
    let c = |dd: &[i64], ds: Vec<i64>, axis, k: i64, is: i64, os: Vec<i64>| Case {
        data: (dd.to_vec(), ds),
        axis,
        idx: (vec![k], vec![is]),
        other: os,
    };
    vec![
        c(&[17], packed(&[17]), 0, 29, 1, packed(&[29])),
        c(&[5, 7], reversed(&[5, 7]), 1, 11, 2, packed(&[5, 11])),
        c(&[6, 9], packed(&[6, 9]), 0, 4, 1, reversed(&[4, 9])),
        c(&[4, 3, 5], reversed(&[4, 3, 5]), 1, 8, 3, gapped(&[4, 8, 5])),
        c(
            &[2, 3, 2, 3, 4],
            packed(&[2, 3, 2, 3, 4]),
            2,
            5,
            1,
            reversed(&[2, 3, 5, 3, 4]),
        ),
        c(&[3, 4], gapped(&[3, 4]), 1, 9, 1, gapped(&[3, 9])),
        c(&[500, 129], packed(&[500, 129]), 0, 1200, 1, packed(&[1200, 129])),
    ]
}

/// The out/values dims of a case.
fn other_dims(case: &Case, vector: bool) -> Vec<i64> {
    if vector {
        let mut d = case.data.0.clone();
        d[case.axis] = case.idx.0[0];
        d
    } else {
        case.idx.0.clone()
    }
}

/// The data element read or updated by iteration item `i` (row-major over `dims`).
fn data_index(case: &Case, vector: bool, dims: &[i64], idx: &[f64], i: usize) -> Option<usize> {
    let mut c = coords(i, dims);
    let k = if vector { idx[c[case.axis]] } else { idx[i] };
    if k < 0.0 || k >= case.data.0[case.axis] as f64 {
        return None;
    }
    c[case.axis] = k as usize;
    Some(linear(&c, &case.data.0))
}

// ---------------------------------------------------------------------------------------
// Random inputs

/// A random value representable in `dtype` (ints in a dtype-friendly range).
fn rand_val(rng: &mut SplitMix64, dtype: DataType) -> f64 {
    match dtype {
        Bool => rng.below(2) as f64,
        U8 => rng.below(256) as f64,
        I8 => rng.below(256) as f64 - 128.0,
        I32 | I64 => rng.below(2001) as f64 - 1000.0,
        _ => rng.next_f64(),
    }
}

fn rand_vec(rng: &mut SplitMix64, n: usize, dtype: DataType) -> Vec<f64> {
    (0..n).map(|_| rand_val(rng, dtype)).collect()
}

/// `n` random indices in `0..len` (repeats included).
fn rand_indices(rng: &mut SplitMix64, n: usize, len: i64) -> Vec<f64> {
    (0..n).map(|_| rng.below(len as u64) as f64).collect()
}

/// Tolerance of the atomic adds (summation order differs from the CPU's; f16/bf16 round
/// after every add).
fn add_bound(dtype: DataType) -> f64 {
    match dtype {
        F32 => 1e-5,
        F64 => 1e-12,
        F16 => 1e-2,
        _ => 3e-2,
    }
}

// ---------------------------------------------------------------------------------------
// gather / index_select

fn run_gather(r: &mut KernelReport, s: &Arc<CudaStream>, rng: &mut SplitMix64, vector: bool) {
    let cases = if vector { vector_cases() } else { elementwise_cases() };
    for case in &cases {
        let odims = other_dims(case, vector);
        for dtype in ALL {
            for it in INDEX_TYPES {
                let x = upload(
                    s,
                    &rand_vec(rng, numel(&case.data.0), dtype),
                    &case.data.0,
                    &case.data.1,
                    dtype,
                );
                let idx_vals = rand_indices(rng, numel(&case.idx.0), case.data.0[case.axis]);
                let idx = upload(s, &idx_vals, &case.idx.0, &case.idx.1, it);
                let out = poisoned(s, &odims, &case.other, dtype);
                let name = format!("{dtype:?} idx {it:?} {case:?}");
                let res = if vector {
                    ix::index_select(s, &x.t, case.axis, &idx.t, &out.m)
                } else {
                    ix::gather(s, &x.t, case.axis, &idx.t, &out.m)
                };
                if let Err(e) = res {
                    r.error(name, e);
                    continue;
                }
                let want: Vec<f64> = (0..numel(&odims))
                    .map(|i| x.values[data_index(case, vector, &odims, &idx.values, i).expect("in range")])
                    .collect();
                r.exact_strict(name, dtype, &download(s, &out), &want);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gather_every_dtype_and_layout() {
    let s = stream();
    let mut r = KernelReport::new("index", "gather");
    run_gather(&mut r, &s, &mut SplitMix64::new(21), false);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn index_select_every_dtype_and_layout() {
    let s = stream();
    let mut r = KernelReport::new("index", "index_select");
    run_gather(&mut r, &s, &mut SplitMix64::new(22), true);
    r.finish();
}

// ---------------------------------------------------------------------------------------
// scatter_add / index_add

/// `acc + v` as the ordered kernels compute it: f32 arithmetic rounded to the dtype after
/// every add (f64 and ints exactly).
fn ordered_add(dtype: DataType, acc: f64, v: f64) -> f64 {
    match dtype {
        F64 | I32 | I64 => acc + v,
        _ => to_dtype(dtype, to_dtype(F32, acc + v)),
    }
}

/// `ordered`: the sequential kernels, checked bit for bit against the host adding in the
/// same order (each element's contributions in axis order) and against a second run.
fn run_add(r: &mut KernelReport, s: &Arc<CudaStream>, rng: &mut SplitMix64, vector: bool, ordered: bool) {
    let cases = if vector { vector_cases() } else { elementwise_cases() };
    for case in &cases {
        let odims = other_dims(case, vector);
        for dtype in ADD {
            for it in INDEX_TYPES {
                let target = upload(
                    s,
                    &rand_vec(rng, numel(&case.data.0), dtype),
                    &case.data.0,
                    &case.data.1,
                    dtype,
                );
                // Indices drawn from a third of the axis: many duplicates.
                let len = case.data.0[case.axis];
                let idx_vals = rand_indices(rng, numel(&case.idx.0), (len / 3).max(1));
                let idx = upload(s, &idx_vals, &case.idx.0, &case.idx.1, it);
                let values = upload(s, &rand_vec(rng, numel(&odims), dtype), &odims, &case.other, dtype);
                let name = format!("{dtype:?} idx {it:?} {case:?}");
                let add = |t: &Dev| match (vector, ordered) {
                    (true, false) => ix::index_add(s, &t.m, case.axis, &idx.t, &values.t),
                    (false, false) => ix::scatter_add(s, &t.m, case.axis, &idx.t, &values.t),
                    (true, true) => ix::index_add_ordered(s, &t.m, case.axis, &idx.t, &values.t),
                    (false, true) => ix::scatter_add_ordered(s, &t.m, case.axis, &idx.t, &values.t),
                };
                if let Err(e) = add(&target) {
                    r.error(name, e);
                    continue;
                }
                // Row-major order over the values visits each element's contributions in
                // axis order, the order of the ordered kernels.
                let mut want = target.values.clone();
                for (i, v) in values.values.iter().enumerate() {
                    let k = data_index(case, vector, &odims, &idx.values, i).expect("in range");
                    want[k] = if ordered {
                        ordered_add(dtype, want[k], *v)
                    } else {
                        want[k] + v
                    };
                }
                let got = download(s, &target);
                if ordered {
                    let again = upload(s, &target.values, &case.data.0, &case.data.1, dtype);
                    if let Err(e) = add(&again) {
                        r.error(format!("{name} (second run)"), e);
                        continue;
                    }
                    r.exact_strict(format!("{name} (second run)"), dtype, &download(s, &again), &got);
                    r.exact_strict(name, dtype, &got, &want);
                } else if dtype.is_float() {
                    r.close(name, dtype, &got, &want, add_bound(dtype));
                } else {
                    r.exact_strict(name, dtype, &got, &want);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scatter_add_every_dtype_with_duplicates() {
    let s = stream();
    let mut r = KernelReport::new("index", "scatter_add");
    run_add(&mut r, &s, &mut SplitMix64::new(31), false, false);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scatter_add_ordered_is_bit_exact_and_repeatable() {
    let s = stream();
    let mut r = KernelReport::new("index", "scatter_add_ordered");
    run_add(&mut r, &s, &mut SplitMix64::new(33), false, true);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn index_add_ordered_is_bit_exact_and_repeatable() {
    let s = stream();
    let mut r = KernelReport::new("index", "index_add_ordered");
    run_add(&mut r, &s, &mut SplitMix64::new(34), true, true);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn index_add_every_dtype_with_duplicates() {
    let s = stream();
    let mut r = KernelReport::new("index", "index_add");
    run_add(&mut r, &s, &mut SplitMix64::new(32), true, false);
    r.finish();
}

/// `index_add` of whole rows along axis 0 with enough indices for the sorted-rows kernel (an
/// embedding's gradient): 3,000 indices into 50 rows of 300 elements (two column tiles), 40 %
/// of them on one hot row, a few out of range (skipped), the target's rows gapped; every
/// float dtype, I64 and I32 indices, against f64 sums.
#[test]
#[ignore = "needs a CUDA GPU"]
fn index_add_rows_with_a_hot_row() {
    let s = stream();
    let mut r = KernelReport::new("index", "index_add rows");
    let mut rng = SplitMix64::new(35);
    let (rows, d, m) = (50i64, 300i64, 3000i64);
    let (td, ts) = (vec![rows, d], vec![320i64, 1]);
    for dtype in [F32, F16, BF16, F64] {
        for it in INDEX_TYPES {
            let idx_vals: Vec<f64> = (0..m)
                .map(|i| match i % 10 {
                    0..=3 => 3.0,
                    4 if i % 100 == 4 => -1.0,
                    5 if i % 100 == 5 => rows as f64,
                    _ => rng.below(rows as u64) as f64,
                })
                .collect();
            let target = upload(&s, &rand_vec(&mut rng, numel(&td), dtype), &td, &ts, dtype);
            let idx = upload(&s, &idx_vals, &[m], &[1], it);
            let values = upload(
                &s,
                &rand_vec(&mut rng, (m * d) as usize, dtype),
                &[m, d],
                &packed(&[m, d]),
                dtype,
            );
            let name = format!("{dtype:?} idx {it:?}");
            if let Err(e) = ix::index_add(&s, &target.m, 0, &idx.t, &values.t) {
                r.error(name, e);
                continue;
            }
            let mut want = target.values.clone();
            for (i, &k) in idx_vals.iter().enumerate() {
                if (0.0..rows as f64).contains(&k) {
                    let k = k as usize;
                    for c in 0..d as usize {
                        want[k * d as usize + c] += values.values[i * d as usize + c];
                    }
                }
            }
            r.close(name, dtype, &download(&s, &target), &want, add_bound(dtype));
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// Out-of-range indices

/// Negative and too-large indices are skipped: gather/index_select leave the output
/// poisoned there, the adds add nothing (and nothing outside the operands is touched).
#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_range_indices_are_skipped() {
    let s = stream();
    let mut r = KernelReport::new("index", "out of range");
    let mut rng = SplitMix64::new(41);
    let poison = decode(I32, &[0xA5; 4])[0];
    let (xd, xs) = (vec![4i64, 6], packed(&[4, 6]));
    for it in INDEX_TYPES {
        let x = upload(&s, &rand_vec(&mut rng, 24, I32), &xd, &xs, I32);
        // gather along axis 1 with indices [4, 5]: some -1, 6, 100, -100.
        let bad = [-1.0, 6.0, 100.0, -100.0];
        let idx_vals: Vec<f64> = (0..20)
            .map(|i| if i % 3 == 0 { bad[i % 4] } else { rng.below(6) as f64 })
            .collect();
        let idx = upload(&s, &idx_vals, &[4, 5], &packed(&[4, 5]), it);
        let out = poisoned(&s, &[4, 5], &packed(&[4, 5]), I32);
        let case = Case {
            data: (xd.clone(), xs.clone()),
            axis: 1,
            idx: (vec![4, 5], packed(&[4, 5])),
            other: packed(&[4, 5]),
        };
        match ix::gather(&s, &x.t, 1, &idx.t, &out.m) {
            Err(e) => r.error(format!("gather {it:?}"), e),
            Ok(()) => {
                let want: Vec<f64> = (0..20)
                    .map(|i| data_index(&case, false, &[4, 5], &idx.values, i).map_or(poison, |j| x.values[j]))
                    .collect();
                r.exact_strict(format!("gather {it:?}"), I32, &download(&s, &out), &want);
            }
        }
        // scatter_add with the same indices: skipped items add nothing.
        let target = upload(&s, &rand_vec(&mut rng, 24, I32), &xd, &xs, I32);
        let values = upload(&s, &rand_vec(&mut rng, 20, I32), &[4, 5], &packed(&[4, 5]), I32);
        match ix::scatter_add(&s, &target.m, 1, &idx.t, &values.t) {
            Err(e) => r.error(format!("scatter_add {it:?}"), e),
            Ok(()) => {
                let mut want = target.values.clone();
                for (i, v) in values.values.iter().enumerate() {
                    if let Some(j) = data_index(&case, false, &[4, 5], &idx.values, i) {
                        want[j] += v;
                    }
                }
                r.exact_strict(format!("scatter_add {it:?}"), I32, &download(&s, &target), &want);
            }
        }
        // index_select / index_add along axis 0 with 1-D indices [7].
        let vidx_vals = [2.0, -1.0, 0.0, 4.0, 3.0, -7.0, 1.0];
        let vidx = upload(&s, &vidx_vals, &[7], &[1], it);
        let vcase = Case {
            data: (xd.clone(), xs.clone()),
            axis: 0,
            idx: (vec![7], vec![1]),
            other: packed(&[7, 6]),
        };
        let out = poisoned(&s, &[7, 6], &packed(&[7, 6]), I32);
        match ix::index_select(&s, &x.t, 0, &vidx.t, &out.m) {
            Err(e) => r.error(format!("index_select {it:?}"), e),
            Ok(()) => {
                let want: Vec<f64> = (0..42)
                    .map(|i| data_index(&vcase, true, &[7, 6], &vidx.values, i).map_or(poison, |j| x.values[j]))
                    .collect();
                r.exact_strict(format!("index_select {it:?}"), I32, &download(&s, &out), &want);
            }
        }
        let target = upload(&s, &rand_vec(&mut rng, 24, I32), &xd, &xs, I32);
        let values = upload(&s, &rand_vec(&mut rng, 42, I32), &[7, 6], &packed(&[7, 6]), I32);
        match ix::index_add(&s, &target.m, 0, &vidx.t, &values.t) {
            Err(e) => r.error(format!("index_add {it:?}"), e),
            Ok(()) => {
                let mut want = target.values.clone();
                for (i, v) in values.values.iter().enumerate() {
                    if let Some(j) = data_index(&vcase, true, &[7, 6], &vidx.values, i) {
                        want[j] += v;
                    }
                }
                r.exact_strict(format!("index_add {it:?}"), I32, &download(&s, &target), &want);
            }
        }
    }
    r.finish();
}

/// f16/bf16 atomics on neighbouring elements (both halves of one 32-bit word) under heavy
/// contention: every value lands on one of the first 4 elements.
#[test]
#[ignore = "needs a CUDA GPU"]
fn half_atomics_share_words_correctly() {
    let s = stream();
    let mut r = KernelReport::new("index", "half atomics");
    let mut rng = SplitMix64::new(51);
    for dtype in [F16, BF16] {
        for it in INDEX_TYPES {
            let n = 1024usize;
            // +-1 on ~256 items per element: every partial sum stays well below 256 in
            // magnitude, so it is exact in f16 and bf16 whatever the order.
            let target = upload(&s, &[0.0; 8], &[8], &[1], dtype);
            let idx_vals = rand_indices(&mut rng, n, 4);
            let idx = upload(&s, &idx_vals, &[n as i64], &[1], it);
            let vals: Vec<f64> = (0..n).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
            let values = upload(&s, &vals, &[n as i64], &[1], dtype);
            let name = format!("{dtype:?} idx {it:?}");
            match ix::scatter_add(&s, &target.m, 0, &idx.t, &values.t) {
                Err(e) => r.error(name, e),
                Ok(()) => {
                    let mut want = vec![0.0; 8];
                    for (k, v) in idx_vals.iter().zip(&vals) {
                        want[*k as usize] += v;
                    }
                    r.exact_strict(name, dtype, &download(&s, &target), &want);
                }
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// gather_nd / scatter_nd

const ND_OPS: [ScatterNdOp; 5] = [
    ScatterNdOp::Assign,
    ScatterNdOp::Add,
    ScatterNdOp::Mul,
    ScatterNdOp::Min,
    ScatterNdOp::Max,
];

/// One nd case: data (dims, strides), indices (dims `[.., K]`, strides), strides of
/// out/values (dims `indices.dims[..-1] ++ data.dims[K..]`).
#[derive(Clone, Debug)]
struct NdCase {
    data: (Vec<i64>, Vec<i64>),
    idx: (Vec<i64>, Vec<i64>),
    other: Vec<i64>,
}

impl NdCase {
    /// Data dims and strides, indices dims and strides, and the strides of the other
    /// operand (gather_nd's output or scatter_nd's values).
    fn new(data: &[i64], data_strides: Vec<i64>, idx: &[i64], idx_strides: Vec<i64>, other: Vec<i64>) -> Self {
        Self {
            data: (data.to_vec(), data_strides),
            idx: (idx.to_vec(), idx_strides),
            other,
        }
    }

    fn k(&self) -> usize {
        *self.idx.0.last().expect("indices have a last dim") as usize
    }

    fn tuples(&self) -> usize {
        numel(&self.idx.0[..self.idx.0.len() - 1])
    }

    fn other_dims(&self) -> Vec<i64> {
        let r = self.idx.0.len();
        [&self.idx.0[..r - 1], &self.data.0[self.k()..]].concat()
    }

    /// The data element that item `i` of out/values reads or updates, from the logical
    /// (row-major `[tuples, K]`) index values; `None` for a tuple out of range.
    fn data_index(&self, idx: &[f64], i: usize) -> Option<usize> {
        let k = self.k();
        let slice = &self.data.0[k..];
        let inner = numel(slice);
        let (t, s) = (i / inner, i % inner);
        let mut c = Vec::with_capacity(self.data.0.len());
        for j in 0..k {
            let v = idx[t * k + j];
            if v < 0.0 || v >= self.data.0[j] as f64 {
                return None;
            }
            c.push(v as usize);
        }
        c.extend(coords(s, slice));
        Some(linear(&c, &self.data.0))
    }
}

fn nd_cases() -> Vec<NdCase> {
    let c = NdCase::new;
    vec![
        // K = 1: rows of a packed matrix.
        c(
            &[6, 5, 4],
            packed(&[6, 5, 4]),
            &[10, 1],
            packed(&[10, 1]),
            packed(&[10, 5, 4]),
        ),
        // K = 2 into transposed data, transposed indices, gapped values.
        c(
            &[6, 5, 4],
            reversed(&[6, 5, 4]),
            &[3, 4, 2],
            reversed(&[3, 4, 2]),
            gapped(&[3, 4, 4]),
        ),
        // K = rank: single elements, many duplicates.
        c(&[7, 3], packed(&[7, 3]), &[50, 2], packed(&[50, 2]), packed(&[50])),
        // K = 0: every tuple is the whole (gapped) tensor.
        c(&[5, 4], gapped(&[5, 4]), &[3, 0], packed(&[3, 0]), reversed(&[3, 5, 4])),
        // Rank 4 data, K = 3, rank-3 indices.
        c(
            &[2, 3, 4, 5],
            packed(&[2, 3, 4, 5]),
            &[2, 2, 3],
            packed(&[2, 2, 3]),
            packed(&[2, 2, 5]),
        ),
        // Rank-1 indices: one tuple.
        c(&[4, 9], reversed(&[4, 9]), &[1], vec![1], vec![2]),
        // Larger: neighbouring narrow elements under contention.
        c(
            &[40, 33],
            packed(&[40, 33]),
            &[300, 1],
            packed(&[300, 1]),
            packed(&[300, 33]),
        ),
    ]
}

/// Random index tuples for `case`: coordinate j in `0..max(1, dims[j] / 2)` (duplicates)
/// or `0..dims[j]` (few duplicates).
fn rand_tuples(rng: &mut SplitMix64, case: &NdCase, dups: bool) -> Vec<f64> {
    let k = case.k();
    (0..case.tuples() * k)
        .map(|i| {
            let n = case.data.0[i % k];
            let n = if dups { (n / 2).max(1) } else { n };
            rng.below(n as u64) as f64
        })
        .collect()
}

/// `v` wrapped to the integer `dtype` (Bool: `!= 0`).
fn wrap(dtype: DataType, v: i64) -> f64 {
    match dtype {
        I8 => v as i8 as f64,
        U8 => v as u8 as f64,
        I32 => v as i32 as f64,
        Bool => (v != 0) as i64 as f64,
        _ => v as f64,
    }
}

/// burn-ndarray's update of `cur` by `v` (floats in f64; ints wrapping; Bool as 0/1).
fn nd_apply(op: ScatterNdOp, dtype: DataType, cur: f64, v: f64) -> f64 {
    let float = dtype.is_float();
    match op {
        ScatterNdOp::Assign => v,
        ScatterNdOp::Add if float => cur + v,
        ScatterNdOp::Add => wrap(dtype, (cur as i64).wrapping_add(v as i64)),
        ScatterNdOp::Mul if float => cur * v,
        ScatterNdOp::Mul => wrap(dtype, (cur as i64).wrapping_mul(v as i64)),
        ScatterNdOp::Min => {
            if v < cur {
                v
            } else {
                cur
            }
        }
        ScatterNdOp::Max => {
            if v > cur {
                v
            } else {
                cur
            }
        }
    }
}

/// Values for `op`: factors near ±1 for float Mul, small ints for int Mul (no i64
/// overflow in f64), some NaN for float Min/Max, else the usual random values.
fn nd_values(rng: &mut SplitMix64, n: usize, dtype: DataType, op: ScatterNdOp) -> Vec<f64> {
    (0..n)
        .map(|_| match op {
            ScatterNdOp::Mul if dtype.is_float() => {
                let m = 1.0 + rng.next_f64() * 0.5;
                if rng.below(2) == 0 {
                    m
                } else {
                    -m
                }
            }
            ScatterNdOp::Mul if matches!(dtype, I32 | I64) => rng.below(7) as f64 - 3.0,
            ScatterNdOp::Min | ScatterNdOp::Max if dtype.is_float() && rng.below(10) == 0 => f64::NAN,
            _ => rand_val(rng, dtype),
        })
        .collect()
}

/// NaN mapped to a finite marker so exact comparisons treat NaN as equal to NaN.
fn nan_marked(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| if x.is_nan() { 1e300 } else { x }).collect()
}

fn run_gather_nd(r: &mut KernelReport, s: &Arc<CudaStream>, rng: &mut SplitMix64) {
    for case in &nd_cases() {
        let odims = case.other_dims();
        for dtype in ALL {
            for it in INDEX_TYPES {
                let x = upload(
                    s,
                    &rand_vec(rng, numel(&case.data.0), dtype),
                    &case.data.0,
                    &case.data.1,
                    dtype,
                );
                // Full range plus some tuples out of range (-1 or the dim): zeros.
                let k = case.k();
                let idx_vals: Vec<f64> = rand_tuples(rng, case, false)
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| match rng.below(12) {
                        0 => -1.0,
                        1 => case.data.0[i % k] as f64,
                        _ => v,
                    })
                    .collect();
                let idx = upload(s, &idx_vals, &case.idx.0, &case.idx.1, it);
                let out = poisoned(s, &odims, &case.other, dtype);
                let name = format!("{dtype:?} idx {it:?} {case:?}");
                if let Err(e) = ix::gather_nd(s, &x.t, &idx.t, &out.m) {
                    r.error(name, e);
                    continue;
                }
                let want: Vec<f64> = (0..numel(&odims))
                    .map(|i| case.data_index(&idx.values, i).map_or(0.0, |j| x.values[j]))
                    .collect();
                r.exact_strict(name, dtype, &download(s, &out), &want);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gather_nd_every_dtype_and_layout() {
    let s = stream();
    let mut r = KernelReport::new("index", "gather_nd");
    run_gather_nd(&mut r, &s, &mut SplitMix64::new(61));
    r.finish();
}

/// scatter_nd of `op` over every case, dtype and index type, with duplicate tuples
/// (`dups`); Assign checks that every element holds one of its candidates.
fn run_scatter_nd(r: &mut KernelReport, s: &Arc<CudaStream>, rng: &mut SplitMix64, op: ScatterNdOp, dups: bool) {
    for case in &nd_cases() {
        let vdims = case.other_dims();
        for dtype in ALL {
            for it in INDEX_TYPES {
                let mut data = rand_vec(rng, numel(&case.data.0), dtype);
                if dtype.is_float() && matches!(op, ScatterNdOp::Min | ScatterNdOp::Max) {
                    for v in data.iter_mut().step_by(7) {
                        *v = f64::NAN;
                    }
                }
                let target = upload(s, &data, &case.data.0, &case.data.1, dtype);
                let idx = upload(s, &rand_tuples(rng, case, dups), &case.idx.0, &case.idx.1, it);
                let values = upload(s, &nd_values(rng, numel(&vdims), dtype, op), &vdims, &case.other, dtype);
                let name = format!("{op:?} {dtype:?} idx {it:?} dups {dups} {case:?}");
                if let Err(e) = ix::scatter_nd(s, &target.m, &idx.t, &values.t, op) {
                    r.error(name, e);
                    continue;
                }
                let got = download(s, &target);
                let mut want = target.values.clone();
                let mut candidates: Vec<Vec<f64>> = vec![Vec::new(); want.len()];
                for (i, &v) in values.values.iter().enumerate() {
                    let j = case.data_index(&idx.values, i).expect("in range");
                    want[j] = nd_apply(op, dtype, want[j], v);
                    candidates[j].push(v);
                }
                let exact =
                    !dtype.is_float() || matches!(op, ScatterNdOp::Assign | ScatterNdOp::Min | ScatterNdOp::Max);
                if op == ScatterNdOp::Assign {
                    // Any candidate may win a duplicated element.
                    for (j, c) in candidates.iter().enumerate() {
                        if c.iter().any(|&v| v.to_bits() == got[j].to_bits()) {
                            want[j] = got[j];
                        }
                    }
                }
                if exact {
                    r.exact_strict(name, dtype, &nan_marked(&got), &nan_marked(&want));
                } else {
                    r.close(name, dtype, &got, &want, add_bound(dtype));
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scatter_nd_every_op_and_dtype_with_duplicates() {
    let s = stream();
    let mut rng = SplitMix64::new(62);
    for op in ND_OPS {
        let mut r = KernelReport::new("index", "scatter_nd");
        run_scatter_nd(&mut r, &s, &mut rng, op, true);
        println!("scatter_nd {op:?} (duplicate tuples):");
        r.finish();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scatter_nd_every_op_and_dtype_few_duplicates() {
    let s = stream();
    let mut rng = SplitMix64::new(63);
    for op in ND_OPS {
        let mut r = KernelReport::new("index", "scatter_nd");
        run_scatter_nd(&mut r, &s, &mut rng, op, false);
        println!("scatter_nd {op:?} (full-range tuples):");
        r.finish();
    }
}

/// Tuples with a coordinate out of range: gather_nd writes zeros, scatter_nd updates
/// nothing (every op), and nothing outside the operands is touched.
#[test]
#[ignore = "needs a CUDA GPU"]
fn nd_out_of_range_tuples_are_skipped() {
    let s = stream();
    let mut r = KernelReport::new("index", "nd out of range");
    let mut rng = SplitMix64::new(64);
    let case = NdCase {
        data: (vec![4, 6, 3], packed(&[4, 6, 3])),
        idx: (vec![12, 2], packed(&[12, 2])),
        other: packed(&[12, 3]),
    };
    let bad = [-1.0, 4.0, 100.0, -100.0];
    for it in INDEX_TYPES {
        let idx_vals: Vec<f64> = (0..24)
            .map(|i| {
                if i % 5 == 0 {
                    bad[i % 4]
                } else {
                    rng.below(if i % 2 == 0 { 4 } else { 6 }) as f64
                }
            })
            .collect();
        let idx = upload(&s, &idx_vals, &case.idx.0, &case.idx.1, it);
        let x = upload(&s, &rand_vec(&mut rng, 72, I32), &case.data.0, &case.data.1, I32);
        let out = poisoned(&s, &[12, 3], &case.other, I32);
        match ix::gather_nd(&s, &x.t, &idx.t, &out.m) {
            Err(e) => r.error(format!("gather_nd {it:?}"), e),
            Ok(()) => {
                let want: Vec<f64> = (0..36)
                    .map(|i| case.data_index(&idx.values, i).map_or(0.0, |j| x.values[j]))
                    .collect();
                assert!(want.len() == 36 && (0..36).any(|i| case.data_index(&idx.values, i).is_none()));
                r.exact_strict(format!("gather_nd {it:?}"), I32, &download(&s, &out), &want);
            }
        }
        for op in ND_OPS {
            let target = upload(&s, &rand_vec(&mut rng, 72, I32), &case.data.0, &case.data.1, I32);
            let values = upload(&s, &nd_values(&mut rng, 36, I32, op), &[12, 3], &case.other, I32);
            let name = format!("scatter_nd {op:?} {it:?}");
            match ix::scatter_nd(&s, &target.m, &idx.t, &values.t, op) {
                Err(e) => r.error(name, e),
                Ok(()) => {
                    let got = download(&s, &target);
                    let mut want = target.values.clone();
                    let mut hit = vec![Vec::new(); want.len()];
                    for (i, &v) in values.values.iter().enumerate() {
                        if let Some(j) = case.data_index(&idx.values, i) {
                            want[j] = nd_apply(op, I32, want[j], v);
                            hit[j].push(v);
                        }
                    }
                    if op == ScatterNdOp::Assign {
                        // Any candidate may win a duplicated element.
                        for (j, c) in hit.iter().enumerate() {
                            if c.contains(&got[j]) {
                                want[j] = got[j];
                            }
                        }
                    }
                    r.exact_strict(name, I32, &got, &want);
                }
            }
        }
    }
    r.finish();
}

/// Sub-word compare-and-swap under heavy contention: 1024 updates land on the first 4 of
/// 8 elements (all in one or two 32-bit words) for the 1- and 2-byte dtypes, every op but
/// Assign; the untouched neighbours must keep their values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn nd_narrow_atomics_share_words_correctly() {
    let s = stream();
    let mut r = KernelReport::new("index", "nd narrow atomics");
    let mut rng = SplitMix64::new(65);
    for dtype in [U8, I8, Bool, F16, BF16] {
        for op in [ScatterNdOp::Add, ScatterNdOp::Mul, ScatterNdOp::Min, ScatterNdOp::Max] {
            let n = 1024usize;
            let data: Vec<f64> = (0..8)
                .map(|i| if dtype == Bool { (i % 2) as f64 } else { i as f64 })
                .collect();
            let target = upload(&s, &data, &[8], &[1], dtype);
            let idx_vals = rand_indices(&mut rng, n, 4);
            let idx = upload(&s, &idx_vals, &[n as i64, 1], &[1, 1], I64);
            // Adds of +-1 (partial sums stay exact in f16/bf16), multiplications by +-1,
            // random values for min/max.
            let vals: Vec<f64> = (0..n)
                .map(|i| match (op, dtype) {
                    (ScatterNdOp::Add | ScatterNdOp::Mul, Bool) => (i % 3 != 0) as i64 as f64,
                    (ScatterNdOp::Add | ScatterNdOp::Mul, U8) => 1.0 + (i % 2) as f64 * 254.0,
                    (ScatterNdOp::Add | ScatterNdOp::Mul, _) => {
                        if i % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        }
                    }
                    _ => rand_val(&mut rng, dtype),
                })
                .collect();
            let values = upload(&s, &vals, &[n as i64], &[1], dtype);
            let name = format!("{op:?} {dtype:?}");
            match ix::scatter_nd(&s, &target.m, &idx.t, &values.t, op) {
                Err(e) => r.error(name, e),
                Ok(()) => {
                    let mut want = target.values.clone();
                    for (k, &v) in idx_vals.iter().zip(&values.values) {
                        want[*k as usize] = nd_apply(op, dtype, want[*k as usize], v);
                    }
                    r.exact_strict(name, dtype, &download(&s, &target), &want);
                }
            }
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// scatter_nd_ordered (deterministic mode)

/// Dtypes of the ordered scatter_nd test: every float and two ints.
const ORDERED_ND: [DataType; 6] = [F32, F16, BF16, F64, I32, I8];

/// Cases for the ordered scatter_nd: many duplicate tuples (their coordinates are drawn
/// from half of each dim), slices (K < rank), permuted and gapped targets, and one case
/// with more tuples than one sort block holds (the merge-sort path of the keys).
fn ordered_nd_cases() -> Vec<NdCase> {
    let c = NdCase::new;
    vec![
        // K = 2 < rank into a transposed target; gapped values.
        c(
            &[6, 5, 4],
            reversed(&[6, 5, 4]),
            &[200, 2],
            packed(&[200, 2]),
            gapped(&[200, 4]),
        ),
        // K = 1 rows of a gapped target, transposed indices and values, rank-3 indices.
        c(
            &[9, 7],
            gapped(&[9, 7]),
            &[6, 20, 1],
            reversed(&[6, 20, 1]),
            reversed(&[6, 20, 7]),
        ),
        // K = rank: single elements.
        c(
            &[7, 3],
            reversed(&[7, 3]),
            &[300, 2],
            reversed(&[300, 2]),
            packed(&[300]),
        ),
        // K = 0: every tuple is the whole tensor.
        c(&[5, 4], gapped(&[5, 4]), &[9, 0], packed(&[9, 0]), reversed(&[9, 5, 4])),
        // Rank-4 target, K = 3.
        c(
            &[2, 3, 4, 5],
            reversed(&[2, 3, 4, 5]),
            &[8, 4, 3],
            packed(&[8, 4, 3]),
            packed(&[8, 4, 5]),
        ),
        // 5000 tuples (> MAX_SORT_LEN) onto 20 rows of a transposed target.
        c(
            &[40, 33],
            reversed(&[40, 33]),
            &[5000, 1],
            packed(&[5000, 1]),
            packed(&[5000, 33]),
        ),
    ]
}

/// A random non-zero value for the ordered scatter_nd: floats of magnitude 0.5..1.5 (Mul:
/// 0.95..1.05, so long products stay finite), ints of magnitude 1..1000 (I8: 1..127; Mul:
/// 1..3), either sign; some NaN for float Min/Max when `nan`.
fn nonzero_val(rng: &mut SplitMix64, dtype: DataType, op: ScatterNdOp, nan: bool) -> f64 {
    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    let mag = match (dtype.is_float(), op, dtype) {
        (true, ScatterNdOp::Mul, _) => 0.95 + rng.next_f64() * 0.1,
        (true, ScatterNdOp::Min | ScatterNdOp::Max, _) if nan && rng.below(10) == 0 => f64::NAN,
        (true, _, _) => 0.5 + rng.next_f64(),
        (false, ScatterNdOp::Mul, _) => 1.0 + rng.below(3) as f64,
        (false, _, I8) => 1.0 + rng.below(127) as f64,
        (false, _, _) => 1.0 + rng.below(1000) as f64,
    };
    sign * mag
}

/// What `scatter_nd_ordered` computes for one element: `vals` (the values of the tuples
/// that address it, in tuple order) combined into `cur` in the kernel's compute type (f32
/// for F32/F16/BF16, rounded to the dtype once at the end; f64; ints wrapping); Assign
/// takes the last value.
fn ordered_nd_apply(op: ScatterNdOp, dtype: DataType, cur: f64, vals: &[f64]) -> f64 {
    if vals.is_empty() {
        return cur;
    }
    match (op, dtype) {
        (ScatterNdOp::Assign, _) => *vals.last().expect("not empty"),
        (_, F32 | F16 | BF16) => {
            let acc = vals.iter().fold(cur as f32, |acc, &v| {
                let v = v as f32;
                match op {
                    ScatterNdOp::Add => acc + v,
                    ScatterNdOp::Mul => acc * v,
                    ScatterNdOp::Min if v < acc => v,
                    ScatterNdOp::Max if v > acc => v,
                    _ => acc,
                }
            });
            match dtype {
                F16 => f16::from_f32(acc).to_f64(),
                BF16 => bf16::from_f32(acc).to_f64(),
                _ => acc as f64,
            }
        }
        _ => vals.iter().fold(cur, |acc, &v| nd_apply(op, dtype, acc, v)),
    }
}

/// Bound on the relative L2 error of the ordered Add against the f64 sum in tuple order:
/// f32 accumulation (F32, F16, BF16) and one rounding to the dtype (unit roundoff 2^-11 for
/// F16, 2^-8 for BF16).
fn ordered_add_bound(dtype: DataType) -> f64 {
    match dtype {
        F32 => 1e-6,
        F64 => 1e-14,
        F16 => 1e-3,
        _ => 4e-3,
    }
}

/// The raw bytes of `d`'s buffer.
fn raw(stream: &Arc<CudaStream>, d: &Dev) -> Vec<u8> {
    stream.clone_dtoh(&d.buf).expect("download")
}

/// Records whether `a` and `b` are the same bytes.
fn same_bits(r: &mut KernelReport, case: String, dtype: DataType, a: &[u8], b: &[u8]) {
    let (x, y): (Vec<f64>, Vec<f64>) = (
        a.iter().map(|&v| v as f64).collect(),
        b.iter().map(|&v| v as f64).collect(),
    );
    r.exact_strict(case, dtype, &x, &y);
}

/// Restores the engine policy when dropped.
struct PolicyGuard(cudnn_backend::plan::EnginePolicy);

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        cudnn_backend::plan::set_policy(self.0);
    }
}

/// `scatter_nd_ordered` with every op over [`ordered_nd_cases`] in [`ORDERED_ND`] dtypes,
/// with some tuples out of range: two runs give the same bits; the result equals the host
/// combining each element's values in tuple order in the kernel's arithmetic (so Assign
/// keeps the last tuple's value); Add is within [`ordered_add_bound`] of the f64 sum;
/// Min/Max equal the atomic `scatter_nd`. Finally `scatter_nd` in deterministic mode runs
/// the ordered form (same bits).
#[test]
#[ignore = "needs a CUDA GPU"]
fn scatter_nd_ordered_is_repeatable_and_in_tuple_order() {
    let s = stream();
    let mut r = KernelReport::new("index", "scatter_nd_ordered");
    let mut add = KernelReport::new("index", "scatter_nd_ordered Add vs f64");
    let mut rng = SplitMix64::new(66);
    for case in &ordered_nd_cases() {
        let vdims = case.other_dims();
        let k = case.k();
        for dtype in ORDERED_ND {
            for op in ND_OPS {
                let it = INDEX_TYPES[rng.below(2) as usize];
                let minmax = matches!(op, ScatterNdOp::Min | ScatterNdOp::Max);
                let data: Vec<f64> = (0..numel(&case.data.0))
                    .map(|_| nonzero_val(&mut rng, dtype, op, minmax))
                    .collect();
                let vals: Vec<f64> = (0..numel(&vdims))
                    .map(|_| nonzero_val(&mut rng, dtype, op, minmax))
                    .collect();
                // Duplicates, plus some coordinates out of range (-1 or the dim).
                let idx_vals: Vec<f64> = rand_tuples(&mut rng, case, true)
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| match rng.below(16) {
                        0 => -1.0,
                        1 => case.data.0[i % k] as f64,
                        _ => v,
                    })
                    .collect();
                let idx = upload(&s, &idx_vals, &case.idx.0, &case.idx.1, it);
                let values = upload(&s, &vals, &vdims, &case.other, dtype);
                let name = format!("{op:?} {dtype:?} idx {it:?} {case:?}");
                let run = |ordered: bool| {
                    let t = upload(&s, &data, &case.data.0, &case.data.1, dtype);
                    let res = if ordered {
                        ix::scatter_nd_ordered(&s, &t.m, &idx.t, &values.t, op)
                    } else {
                        ix::scatter_nd(&s, &t.m, &idx.t, &values.t, op)
                    };
                    res.map(|()| t)
                };
                let (first, second) = match (run(true), run(true)) {
                    (Ok(a), Ok(b)) => (a, b),
                    (Err(e), _) | (_, Err(e)) => {
                        r.error(name, e);
                        continue;
                    }
                };
                same_bits(
                    &mut r,
                    format!("{name} (second run)"),
                    dtype,
                    &raw(&s, &first),
                    &raw(&s, &second),
                );
                // Each element's values in tuple order (row-major over the values).
                let mut hits: Vec<Vec<f64>> = vec![Vec::new(); first.values.len()];
                for (i, &v) in values.values.iter().enumerate() {
                    if let Some(j) = case.data_index(&idx.values, i) {
                        hits[j].push(v);
                    }
                }
                assert!(hits.iter().any(|h| h.len() > 1), "{name}: no duplicate tuples");
                let got = download(&s, &first);
                let want: Vec<f64> = first
                    .values
                    .iter()
                    .zip(&hits)
                    .map(|(&cur, h)| ordered_nd_apply(op, dtype, cur, h))
                    .collect();
                r.exact_strict(name.clone(), dtype, &nan_marked(&got), &nan_marked(&want));
                match op {
                    ScatterNdOp::Add if dtype.is_float() => {
                        let sum: Vec<f64> = first
                            .values
                            .iter()
                            .zip(&hits)
                            .map(|(&cur, h)| h.iter().fold(cur, |a, v| a + v))
                            .collect();
                        add.close(name.clone(), dtype, &got, &sum, ordered_add_bound(dtype));
                    }
                    ScatterNdOp::Min | ScatterNdOp::Max => match run(false) {
                        Ok(atomic) => same_bits(
                            &mut r,
                            format!("{name} (vs atomic)"),
                            dtype,
                            &raw(&s, &first),
                            &raw(&s, &atomic),
                        ),
                        Err(e) => r.error(format!("{name} (atomic)"), e),
                    },
                    _ => {}
                }
                // Deterministic mode routes scatter_nd's Add/Mul/Assign to the ordered form.
                if case.idx.0 == [200, 2] && !minmax {
                    let guard = PolicyGuard(cudnn_backend::plan::policy());
                    cudnn_backend::plan::set_policy(cudnn_backend::plan::EnginePolicy {
                        deterministic: true,
                        ..guard.0
                    });
                    let routed = run(false);
                    drop(guard);
                    match routed {
                        Ok(t) => same_bits(
                            &mut r,
                            format!("{name} (deterministic scatter_nd)"),
                            dtype,
                            &raw(&s, &first),
                            &raw(&s, &t),
                        ),
                        Err(e) => r.error(format!("{name} (deterministic scatter_nd)"), e),
                    }
                }
            }
        }
    }
    add.finish();
    r.finish();
}
