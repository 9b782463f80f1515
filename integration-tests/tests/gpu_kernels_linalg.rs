//! The linalg kernels (`cudnn_backend::kernels::linalg`) against straightforward CPU
//! computations: integer matmul exactly (broadcast batches, transposed and gapped
//! operands, I64 and I32 with wrap-around), the float matmul in every float dtype within
//! one rounding of the f64 product (broadcast and stride-0 batches, transposed and gapped
//! operands; no TF32), the cross product in every float dtype, and
//! symmetric int8 quantization exactly against a CPU implementation of burn's formula
//! (per tensor and per block), with dequantize(quantize(x)) within scale / 2 of x.
//! Outputs are poisoned first. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::linalg as la;
use cudnn_backend::types::{row_major_strides, TensorMut, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{gather_from_strided, scatter_to_strided, strided_len, SplitMix64};
use integration_tests::views_of;
use integration_tests::{download, poisoned, round_to, upload, DevTensor};

use DataType::*;

const FLOATS: [DataType; 4] = [F32, F16, BF16, F64];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

fn us(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

fn numel(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

fn packed(dims: &[i64]) -> Vec<i64> {
    row_major_strides(dims).to_vec()
}

/// Packed strides with a gap of one element between neighbours (every stride doubled).
fn gapped(dims: &[i64]) -> Vec<i64> {
    packed(dims).iter().map(|s| s * 2).collect()
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

// ---------------------------------------------------------------------------------------
// Integer and int8 buffers (values carried as i64)

struct IntDev {
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    buf: CudaSlice<u8>,
}

fn encode_int(dtype: DataType, v: &[i64]) -> Vec<u8> {
    match dtype {
        I64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        I8 => v.iter().map(|&x| x as i8 as u8).collect(),
        d => panic!("encode_int: {d:?}"),
    }
}

fn decode_int(dtype: DataType, b: &[u8]) -> Vec<i64> {
    b.chunks_exact(dtype.size())
        .map(|c| match dtype {
            I64 => i64::from_le_bytes(c.try_into().unwrap()),
            I32 => i32::from_le_bytes(c.try_into().unwrap()) as i64,
            I8 => c[0] as i8 as i64,
            d => panic!("decode_int: {d:?}"),
        })
        .collect()
}

fn upload_int(s: &Arc<CudaStream>, values: &[i64], dims: &[i64], st: &[i64], dtype: DataType) -> IntDev {
    let len = strided_len(&us(dims), &us(st)).max(1);
    let mut host = vec![0x5A5A_5A5Ai64; len];
    scatter_to_strided(values, &us(dims), &us(st), &mut host);
    let buf = s.clone_htod(&encode_int(dtype, &host)).expect("upload");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(s, &buf, 0, dims, st, dtype) };
    IntDev { t, m, buf }
}

fn poisoned_int(s: &Arc<CudaStream>, dims: &[i64], st: &[i64], dtype: DataType) -> IntDev {
    let len = strided_len(&us(dims), &us(st)).max(1);
    let buf = s.clone_htod(&vec![0xA5u8; len * dtype.size()]).expect("alloc");
    // SAFETY: the views are fields of the struct that owns the buffer, dropped before it.
    let (t, m) = unsafe { views_of(s, &buf, 0, dims, st, dtype) };
    IntDev { t, m, buf }
}

fn download_int(s: &Arc<CudaStream>, d: &IntDev) -> Vec<i64> {
    let bytes = s.clone_dtoh(&d.buf).expect("download");
    gather_from_strided(&decode_int(d.t.dtype(), &bytes), &us(d.t.dims()), &us(d.t.strides()))
}

/// A packed F32 buffer poisoned with NaN, read back as raw f32.
fn poisoned_f32(s: &Arc<CudaStream>, n: usize) -> DevTensor {
    poisoned(s, &[n as i64], &[1], F32)
}

fn download_f32(s: &Arc<CudaStream>, buf: &CudaSlice<u8>, n: usize) -> Vec<f32> {
    let bytes = s.clone_dtoh(buf).expect("download");
    bytes
        .chunks_exact(4)
        .take(n)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Report

struct Report {
    name: &'static str,
    runs: usize,
    worst: f64,
    failures: Vec<String>,
}

impl Report {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            runs: 0,
            worst: 0.0,
            failures: Vec::new(),
        }
    }

    /// Counts mismatches of `out` against `reference` (exact).
    fn exact<T: PartialEq + std::fmt::Debug>(&mut self, case: String, out: &[T], reference: &[T]) {
        self.runs += 1;
        if out.len() != reference.len() {
            self.failures
                .push(format!("{case}: {} values, expected {}", out.len(), reference.len()));
            return;
        }
        let mismatches = out.iter().zip(reference).filter(|(o, r)| o != r).count();
        self.worst = self.worst.max(mismatches as f64);
        if let Some(i) = out.iter().zip(reference).position(|(o, r)| o != r) {
            self.failures.push(format!(
                "{case}: {mismatches} mismatches, first at {i}: got {:?} expected {:?}",
                out[i], reference[i]
            ));
        }
    }

    /// Records a normalized error `err` against `limit` (NaN fails).
    fn within(&mut self, case: String, err: f64, limit: f64) {
        self.runs += 1;
        self.worst = self.worst.max(err);
        if err.is_nan() || err > limit {
            self.failures.push(format!("{case}: error {err:.3e} > {limit:.0e}"));
        }
    }

    fn error(&mut self, case: String, e: cudnn_backend::Error) {
        self.runs += 1;
        self.failures.push(format!("{case}: {e}"));
    }

    fn finish(self, what: &str) {
        println!(
            "linalg {}: {} cases, {} failed, worst {what} {:.3e}",
            self.name,
            self.runs,
            self.failures.len(),
            self.worst
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
// int_matmul

/// Strides of `dims` with the last two dims stored swapped (a transposed matrix).
fn transposed(dims: &[i64]) -> Vec<i64> {
    let r = dims.len();
    let mut order: Vec<usize> = (0..r).collect();
    order.swap(r - 2, r - 1);
    let mut s = vec![0i64; r];
    let mut acc = 1;
    for &d in order.iter().rev() {
        s[d] = acc;
        acc *= dims[d];
    }
    s
}

/// CPU `a · b` with broadcast batches, wrapping in the dtype's width.
fn cpu_int_matmul(dtype: DataType, a: &[i64], ad: &[i64], b: &[i64], bd: &[i64], cd: &[i64]) -> Vec<i64> {
    let r = cd.len();
    let (m, n, k) = (cd[r - 2] as usize, cd[r - 1] as usize, ad[r - 1] as usize);
    let nb = numel(&cd[..r - 2]);
    let mut out = Vec::with_capacity(numel(cd));
    for z in 0..nb {
        let bc = coords(z, &cd[..r - 2]);
        let base = |dims: &[i64]| {
            bc.iter()
                .zip(&dims[..r - 2])
                .fold(0usize, |acc, (&c, &d)| acc * d as usize + if d == 1 { 0 } else { c })
        };
        let (ab, bb) = (base(ad) * m * k, base(bd) * k * n);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0i64;
                for kk in 0..k {
                    acc = acc.wrapping_add(a[ab + i * k + kk].wrapping_mul(b[bb + kk * n + j]));
                }
                out.push(if dtype == I32 { acc as i32 as i64 } else { acc });
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn int_matmul_exact_with_broadcast_transpose_and_wrap() {
    let s = stream();
    let mut rng = SplitMix64::new(41);
    let mut r = Report::new("int_matmul");
    type Shapes = (&'static [i64], &'static [i64], &'static [i64]);
    let shapes: [Shapes; 7] = [
        (&[4, 5], &[5, 6], &[4, 6]),
        (&[2, 3, 17, 33], &[2, 3, 33, 19], &[2, 3, 17, 19]),
        (&[2, 1, 16, 7], &[1, 3, 7, 18], &[2, 3, 16, 18]),
        (&[5, 8, 4], &[1, 4, 6], &[5, 8, 6]),
        (&[70, 130], &[130, 90], &[70, 90]),
        (&[3, 0], &[0, 4], &[3, 4]),
        (&[1, 1], &[1, 1], &[1, 1]),
    ];
    for dtype in [I64, I32] {
        for (ad, bd, cd) in shapes {
            for (layout, wide) in [
                ("packed", false),
                ("transposed", false),
                ("gapped", true),
                ("packed", true),
            ] {
                let make = |rng: &mut SplitMix64, n: usize| -> Vec<i64> {
                    (0..n)
                        .map(|_| match (wide, dtype) {
                            (false, _) => rng.below(2001) as i64 - 1000,
                            (true, I32) => rng.next_u64() as i32 as i64,
                            (true, _) => rng.next_u64() as i64,
                        })
                        .collect()
                };
                let av = make(&mut rng, numel(ad));
                let bv = make(&mut rng, numel(bd));
                let (sa, sb, sc) = match layout {
                    "transposed" => (transposed(ad), transposed(bd), packed(cd)),
                    "gapped" => (gapped(ad), packed(bd), gapped(cd)),
                    _ => (packed(ad), packed(bd), packed(cd)),
                };
                let a = upload_int(&s, &av, ad, &sa, dtype);
                let b = upload_int(&s, &bv, bd, &sb, dtype);
                let c = poisoned_int(&s, cd, &sc, dtype);
                let case = format!("{dtype:?} {ad:?}x{bd:?} {layout} wide={wide}");
                if let Err(e) = la::int_matmul(&s, &a.t, &b.t, &c.m) {
                    r.error(case, e);
                    continue;
                }
                let want = cpu_int_matmul(dtype, &av, ad, &bv, bd, cd);
                r.exact(case, &download_int(&s, &c), &want);
            }
        }
    }
    r.finish("mismatches");
}

// ---------------------------------------------------------------------------------------
// matmul (exact float GEMM)

/// CPU `a · b` in f64 with broadcast batches: the products' sums and the sums of their
/// magnitudes (the scale a rounding error is measured against).
fn cpu_float_matmul(a: &[f64], ad: &[i64], b: &[f64], bd: &[i64], cd: &[i64]) -> (Vec<f64>, Vec<f64>) {
    let r = cd.len();
    let (m, n, k) = (cd[r - 2] as usize, cd[r - 1] as usize, ad[r - 1] as usize);
    let nb = numel(&cd[..r - 2]);
    let (mut out, mut mag) = (Vec::with_capacity(numel(cd)), Vec::with_capacity(numel(cd)));
    for z in 0..nb {
        let bc = coords(z, &cd[..r - 2]);
        let base = |dims: &[i64]| {
            bc.iter()
                .zip(&dims[..r - 2])
                .fold(0usize, |acc, (&c, &d)| acc * d as usize + if d == 1 { 0 } else { c })
        };
        let (ab, bb) = (base(ad) * m * k, base(bd) * k * n);
        for i in 0..m {
            for j in 0..n {
                let (mut acc, mut abs) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let p = a[ab + i * k + kk] * b[bb + kk * n + j];
                    acc += p;
                    abs += p.abs();
                }
                out.push(acc);
                mag.push(abs);
            }
        }
    }
    (out, mag)
}

/// `dims` with every batch dim (all but the last two) set to 1.
fn unit_batches(dims: &[i64]) -> Vec<i64> {
    let r = dims.len();
    dims.iter()
        .enumerate()
        .map(|(i, &d)| if i + 2 < r { 1 } else { d })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn float_matmul_exact_with_broadcast_and_strides() {
    let s = stream();
    let mut rng = SplitMix64::new(44);
    let mut r = Report::new("matmul");
    let mut shapes: Vec<(Vec<i64>, Vec<i64>, Vec<i64>)> = [
        (&[4, 5][..], &[5, 6][..], &[4, 6][..]),
        (&[2, 3, 17, 33], &[2, 3, 33, 19], &[2, 3, 17, 19]),
        (&[2, 1, 16, 7], &[1, 3, 7, 18], &[2, 3, 16, 18]),
        (&[5, 8, 4], &[1, 4, 6], &[5, 8, 6]),
        (&[1, 4, 5], &[3, 5, 6], &[3, 4, 6]),
        (&[70, 130], &[130, 90], &[70, 90]),
        (&[2, 1000], &[1000, 9], &[2, 9]),
        (&[3, 0], &[0, 4], &[3, 4]),
        (&[1, 1], &[1, 1], &[1, 1]),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_vec(), b.to_vec(), c.to_vec()))
    .collect();
    // Random shapes: 0-2 batch dims, each broadcast on one side at random.
    for _ in 0..8 {
        let nb = rng.below(3) as usize;
        let (m, n, k) = (
            1 + rng.below(40) as i64,
            1 + rng.below(40) as i64,
            1 + rng.below(70) as i64,
        );
        let (mut ad, mut bd, mut cd) = (vec![], vec![], vec![]);
        for _ in 0..nb {
            let d = 1 + rng.below(4) as i64;
            let side = rng.below(3);
            ad.push(if side == 1 { 1 } else { d });
            bd.push(if side == 2 { 1 } else { d });
            cd.push(d);
        }
        ad.extend([m, k]);
        bd.extend([k, n]);
        cd.extend([m, n]);
        shapes.push((ad, bd, cd));
    }
    for dtype in FLOATS {
        // One rounding to the dtype, measured against the sum of |products| (floored at
        // the smallest normal value, below which the rounding step is absolute).
        let (limit, floor) = match dtype {
            F32 => (2e-7, f32::MIN_POSITIVE as f64),
            F64 => (1e-13, f64::MIN_POSITIVE),
            F16 => (1e-3, 6.103515625e-5),
            _ => (8e-3, f32::MIN_POSITIVE as f64),
        };
        for (ad, bd, cd) in &shapes {
            for layout in ["packed", "transposed", "gapped", "expanded"] {
                // "expanded": a's batch dims are stride-0 views of one matrix.
                let expanded = layout == "expanded" && ad.len() > 2;
                let a_logical = if expanded { unit_batches(ad) } else { ad.clone() };
                let av = rng.fill(numel(&a_logical));
                let bv = rng.fill(numel(bd));
                let (sa, sb, sc) = match layout {
                    "transposed" => (transposed(ad), transposed(bd), transposed(cd)),
                    "gapped" => (gapped(ad), transposed(bd), gapped(cd)),
                    _ => (packed(&a_logical), packed(bd), packed(cd)),
                };
                let mut a = upload(&s, &av, &a_logical, &sa, dtype);
                if expanded {
                    let mut st = sa.clone();
                    st[..ad.len() - 2].fill(0);
                    a.t = a.t.reshaped(ad, &st).expect("broadcast view");
                }
                let b = upload(&s, &bv, bd, &sb, dtype);
                let c = poisoned(&s, cd, &sc, dtype);
                let case = format!("{dtype:?} {ad:?}x{bd:?} {layout}");
                if let Err(e) = la::matmul(&s, &a.t, &b.t, &c.m) {
                    r.error(case, e);
                    continue;
                }
                let (want, mag) = cpu_float_matmul(&a.values, &a_logical, &b.values, bd, cd);
                let got = download(&s, &c);
                let worst = got
                    .iter()
                    .zip(want.iter().zip(&mag))
                    .map(|(&g, (&w, &m))| (g - w).abs() / m.max(floor))
                    .fold(0.0f64, |acc, e| {
                        if e.is_nan() || acc.is_nan() {
                            f64::NAN
                        } else {
                            acc.max(e)
                        }
                    });
                r.within(case, worst, limit);
            }
        }
    }
    r.finish("error relative to sum |a·b|");
}

// ---------------------------------------------------------------------------------------
// cross3

/// Strides of `dims` broadcast to `shape` (size-1 / missing leading dims get 0).
fn bcast(dims: &[i64], st: &[i64], shape: &[i64]) -> Vec<i64> {
    let lead = shape.len() - dims.len();
    let mut out = vec![0i64; shape.len()];
    for (i, (&d, &s)) in dims.iter().zip(st).enumerate() {
        out[lead + i] = if d == 1 { 0 } else { s };
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cross3_every_float_dtype() {
    let s = stream();
    let mut rng = SplitMix64::new(42);
    let mut r = Report::new("cross3");
    type Case = (&'static [i64], &'static [i64], &'static [i64], usize);
    let cases: [Case; 5] = [
        (&[3], &[3], &[3], 0),
        (&[7, 3], &[7, 3], &[7, 3], 1),
        (&[3, 5], &[3, 1], &[3, 5], 0),
        (&[4, 3], &[2, 4, 3], &[2, 4, 3], 2),
        (&[2, 3, 1, 6], &[2, 3, 5, 1], &[2, 3, 5, 6], 1),
    ];
    for dtype in FLOATS {
        let limit = match dtype {
            F32 => 1e-6,
            F64 => 1e-12,
            _ => 1e-2,
        };
        for (ad, bd, od, axis) in cases {
            for gap in [false, true] {
                let sa = if gap { gapped(ad) } else { packed(ad) };
                let a = upload(&s, &rng.fill(numel(ad)), ad, &sa, dtype);
                let b = upload(&s, &rng.fill(numel(bd)), bd, &packed(bd), dtype);
                let so = if gap { gapped(od) } else { packed(od) };
                let out = poisoned(&s, od, &so, dtype);
                let case = format!("{dtype:?} {ad:?}x{bd:?}->{od:?} axis {axis} gap={gap}");
                if let Err(e) = la::cross3(&s, &a.t, &b.t, axis, &out.m) {
                    r.error(case, e);
                    continue;
                }
                let got = download(&s, &out);
                // CPU in f64 over out's elements, a and b read through broadcast strides of
                // their packed logical values.
                let (pa, pb) = (bcast(ad, &packed(ad), od), bcast(bd, &packed(bd), od));
                let at = |p: &[i64], v: &[f64], c: &[usize], k: usize| {
                    let mut c = c.to_vec();
                    c[axis] = k;
                    v[c.iter().zip(p).map(|(&x, &st)| x as i64 * st).sum::<i64>() as usize]
                };
                let mut worst = 0.0f64;
                for (i, &g) in got.iter().enumerate() {
                    let c = coords(i, od);
                    let (k1, k2) = ((c[axis] + 1) % 3, (c[axis] + 2) % 3);
                    let (p, q) = (
                        at(&pa, &a.values, &c, k1) * at(&pb, &b.values, &c, k2),
                        at(&pa, &a.values, &c, k2) * at(&pb, &b.values, &c, k1),
                    );
                    let err = (g - (p - q)).abs() / (p.abs() + q.abs() + 1e-30);
                    worst = worst.max(if g.is_nan() { f64::NAN } else { err });
                }
                r.within(case, worst, limit);
            }
        }
    }
    r.finish("relative error");
}

// ---------------------------------------------------------------------------------------
// quantize / dequantize

/// burn-ndarray's symmetric int8 (Q8S) scales and values for blocks of `block`.
fn cpu_quantize(x: &[f32], block: usize) -> (Vec<f32>, Vec<i64>) {
    let mut scales = Vec::new();
    let mut q = Vec::with_capacity(x.len());
    for chunk in x.chunks(block) {
        let m = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut sc = (m * 2.0) / 254.0;
        if sc == 0.0 {
            sc = 0.1;
        }
        scales.push(sc);
        for v in chunk {
            let r = (v / sc).round().clamp(-127.0, 127.0);
            q.push(if r.is_nan() { 0 } else { r as i64 });
        }
    }
    (scales, q)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantize_dequantize_symmetric_i8() {
    let s = stream();
    let mut rng = SplitMix64::new(43);
    let mut rq = Report::new("quantize");
    let mut rd = Report::new("dequantize");
    let mut rr = Report::new("round_trip");
    type Case = (&'static [i64], Option<usize>);
    let cases: [Case; 7] = [
        (&[6, 32], None),
        (&[6, 32], Some(32)),
        (&[6, 32], Some(1)),
        (&[40, 37], Some(37)),
        (&[4, 64], Some(8)),
        (&[300_001], None),
        (&[5, 2048], Some(1024)),
    ];
    for dtype in FLOATS {
        for (dims, block) in cases {
            let n = numel(dims);
            let blk = block.unwrap_or(n);
            // Scaled values, with a zero block and exact multiples of a power of two.
            let mut v: Vec<f64> = rng.fill(n).iter().map(|x| x * 10.0).collect();
            if n > blk {
                v[..blk].fill(0.0);
                for (i, x) in v[blk..2 * blk].iter_mut().enumerate() {
                    *x = (i as f64 - 3.0) * 0.25;
                }
            }
            let x = upload(&s, &v, dims, &packed(dims), dtype);
            let nb = n / blk;
            let scales = poisoned_f32(&s, nb);
            let q = poisoned_int(&s, dims, &packed(dims), I8);
            let case = format!("{dtype:?} {dims:?} block {block:?}");
            if let Err(e) = la::quantize_symmetric_i8(&s, &x.t, block, &scales.m, &q.m) {
                rq.error(case, e);
                continue;
            }
            let xf: Vec<f32> = x.values.iter().map(|&v| v as f32).collect();
            let (want_s, want_q) = cpu_quantize(&xf, blk);
            let got_s = download_f32(&s, &scales.buf, nb);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            rq.exact(format!("{case} scales"), &bits(&got_s), &bits(&want_s));
            let got_q = download_int(&s, &q);
            rq.exact(format!("{case} values"), &got_q, &want_q);
            for out_dt in FLOATS {
                let out = poisoned(&s, dims, &packed(dims), out_dt);
                let case = format!("{case} -> {out_dt:?}");
                if let Err(e) = la::dequantize_symmetric_i8(&s, &q.t, block, &scales.t, &out.m) {
                    rd.error(case, e);
                    continue;
                }
                let got = download(&s, &out);
                let want: Vec<f64> = want_q
                    .iter()
                    .enumerate()
                    .map(|(i, &qv)| round_to(out_dt, (want_s[i / blk] * qv as f32) as f64))
                    .collect();
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                rd.exact(case.clone(), &bits(&got), &bits(&want));
                if out_dt == F32 {
                    // |x' - x| <= scale / 2 (measured in scales).
                    let worst = got
                        .iter()
                        .zip(&xf)
                        .enumerate()
                        .map(|(i, (&g, &xv))| (g - xv as f64).abs() / want_s[i / blk] as f64)
                        .fold(0.0f64, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) });
                    rr.within(case, worst, 0.5 + 1e-5);
                }
            }
        }
    }
    rq.finish("mismatches");
    rd.finish("mismatches");
    rr.finish("error in scales");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn argument_errors_before_any_launch() {
    let s = stream();
    let mut r = Report::new("errors");
    let x = upload(&s, &[1.0; 8], &[2, 4], &[1, 2], F32);
    let scales = poisoned_f32(&s, 1);
    let q = poisoned_int(&s, &[2, 4], &packed(&[2, 4]), I8);
    r.runs += 1;
    match la::quantize_symmetric_i8(&s, &x.t, None, &scales.m, &q.m) {
        Err(cudnn_backend::Error::InvalidArgument { arg: "x", .. }) => {}
        other => r.failures.push(format!("transposed x: {other:?}")),
    }
    let a = upload_int(&s, &[1; 6], &[2, 3], &packed(&[2, 3]), I64);
    let c = poisoned_int(&s, &[2, 2], &packed(&[2, 2]), I64);
    r.runs += 1;
    match la::int_matmul(&s, &a.t, &a.t, &c.m) {
        Err(cudnn_backend::Error::InvalidArgument { arg: "b", .. }) => {}
        other => r.failures.push(format!("K mismatch: {other:?}")),
    }
    r.finish("n/a");
}
