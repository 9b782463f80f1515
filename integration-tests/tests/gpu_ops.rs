//! Every `ops` entry point against the float64 CPU reference, in f32, f16 and bf16, NCHW
//! and NHWC, on ≥ 20 random shapes each (odd sizes, stride 2, dilation 2, groups, 1x1 and
//! 7x7 filters), with outputs poisoned before each run. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, Activation, ConvParams, PoolMode, PoolParams, TensorRef};
use cudnn_backend::types::row_major_strides;
use cudnn_backend::Device;
use cudnn_backend_reference::{self as cpu, PoolGeometry, SplitMix64};
use integration_tests::{bound, download, poisoned, random, strides, udims, upload, DevTensor, Layout};

const DTYPES: [DataType; 3] = [DataType::F32, DataType::F16, DataType::BF16];
const LAYOUTS: [Layout; 2] = [Layout::Nchw, Layout::Nhwc];
const CASES: usize = 20;
/// Every activation (with sample parameters).
const EVERY_ACTIVATION: [Activation; 8] = [
    Activation::Identity,
    Activation::Relu,
    Activation::Sigmoid,
    Activation::Tanh,
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Elu(0.5),
    Activation::Swish(1.0),
];

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

/// Collects per-case outcomes and fails the test at the end with every failure listed.
struct Report {
    name: &'static str,
    f32_bound: f64,
    runs: usize,
    worst: Vec<(DataType, f64)>,
    failures: Vec<String>,
}

impl Report {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            f32_bound: bound(DataType::F32),
            runs: 0,
            worst: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// cuDNN's f32 matmul engines run on TF32 tensor cores: the tf32 bound applies unless
    /// the process disabled TF32 with NVIDIA_TF32_OVERRIDE=0.
    fn tf32_matmul(mut self) -> Self {
        if std::env::var("NVIDIA_TF32_OVERRIDE").as_deref() != Ok("0") {
            self.f32_bound = 1e-3;
        }
        self
    }

    fn bound(&self, dtype: DataType) -> f64 {
        if dtype == DataType::F32 {
            self.f32_bound
        } else {
            bound(dtype)
        }
    }

    fn check(&mut self, case: String, dtype: DataType, out: &[f64], reference: &[f64]) {
        self.runs += 1;
        let err = cpu::rel_l2_error(out, reference);
        match self.worst.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, w)) => *w = w.max(err),
            None => self.worst.push((dtype, err)),
        }
        let limit = self.bound(dtype);
        // NaN compares false: an unwritten (poisoned) output fails here.
        if err.is_nan() || err > limit {
            self.failures
                .push(format!("{case}: rel L2 error {err:.3e} > {limit:.0e}"));
        }
    }

    fn error(&mut self, case: String, e: cudnn_backend::Error) {
        self.runs += 1;
        self.failures.push(format!("{case}: {e}"));
    }

    fn finish(self) {
        let worst: Vec<String> = self.worst.iter().map(|(d, e)| format!("{d:?} {e:.2e}")).collect();
        println!(
            "{}: {} runs, {} failed; worst rel L2: {}",
            self.name,
            self.runs,
            self.failures.len(),
            worst.join(", ")
        );
        assert!(
            self.failures.is_empty(),
            "{} failures:\n{}",
            self.name,
            self.failures.join("\n")
        );
    }
}

#[derive(Clone, Debug)]
struct ConvCase {
    x: Vec<i64>,
    w: Vec<i64>,
    p: ConvParams,
}

impl ConvCase {
    fn y(&self) -> Vec<i64> {
        self.p.output_dims(&self.x, &self.w).expect("case geometry")
    }
}

fn pick(rng: &mut SplitMix64, v: &[i64]) -> i64 {
    v[rng.below(v.len() as u64) as usize]
}

/// 20 conv problems: fixed ones covering 1x1, 7x7 stride 2, groups, dilation, 1-D and 3-D,
/// then random ones with odd sizes and asymmetric padding.
fn conv_cases(seed: u64) -> Vec<ConvCase> {
    let mut rng = SplitMix64::new(seed);
    let mut cases = vec![
        ConvCase {
            x: vec![2, 16, 9, 9],
            w: vec![8, 16, 1, 1],
            p: ConvParams::new(&[0, 0], &[1, 1], &[1, 1], 1),
        },
        ConvCase {
            x: vec![1, 3, 23, 23],
            w: vec![8, 3, 7, 7],
            p: ConvParams::new(&[3, 3], &[2, 2], &[1, 1], 1),
        },
        ConvCase {
            x: vec![2, 12, 11, 11],
            w: vec![9, 4, 3, 3],
            p: ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 3),
        },
        ConvCase {
            x: vec![1, 8, 13, 13],
            w: vec![8, 8, 3, 3],
            p: ConvParams::new(&[2, 2], &[1, 1], &[2, 2], 1),
        },
        ConvCase {
            x: vec![3, 5, 17],
            w: vec![7, 5, 3],
            p: ConvParams::new(&[1], &[2], &[1], 1),
        },
        ConvCase {
            x: vec![1, 4, 7, 9, 7],
            w: vec![6, 4, 3, 3, 3],
            p: ConvParams::new(&[1, 1, 1], &[1, 2, 1], &[1, 1, 1], 1),
        },
    ];
    while cases.len() < CASES {
        let spatial = [2usize, 2, 2, 1, 3][rng.below(5) as usize];
        let groups = pick(&mut rng, &[1, 1, 1, 2, 4]);
        let c = groups * pick(&mut rng, &[1, 2, 3, 4, 8]);
        let k = groups * pick(&mut rng, &[1, 2, 3, 5]);
        let n = pick(&mut rng, &[1, 2, 3]);
        let (mut x, mut w) = (vec![n, c], vec![k, c / groups]);
        let mut p = ConvParams::new(&[], &[], &[], groups);
        for _ in 0..spatial {
            let r = pick(&mut rng, if spatial == 3 { &[1, 3] } else { &[1, 3, 5, 7] });
            let d = pick(&mut rng, &[1, 1, 2]);
            let s = pick(&mut rng, &[1, 1, 2]);
            let eff = (r - 1) * d + 1;
            let size = eff + pick(&mut rng, if spatial == 3 { &[0, 2, 4] } else { &[0, 3, 6, 9, 12] });
            let pre = rng.below((eff / 2 + 1) as u64) as i64;
            let post = if rng.below(3) == 0 {
                rng.below((eff / 2 + 1) as u64) as i64
            } else {
                pre
            };
            x.push(size);
            w.push(r);
            p.pre_padding.push(pre);
            p.post_padding.push(post);
            p.stride.push(s);
            p.dilation.push(d);
        }
        cases.push(ConvCase { x, w, p });
    }
    cases
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ConvKind {
    Forward,
    BackwardData,
    BackwardFilter,
    BiasAct(Activation),
}

fn run_conv(
    s: &Arc<CudaStream>,
    rng: &mut SplitMix64,
    kind: ConvKind,
    dtype: DataType,
    layout: Layout,
    case: &ConvCase,
) -> Result<(Vec<f64>, Vec<f64>), cudnn_backend::Error> {
    let yd = case.y();
    let g = integration_tests::reference_geometry(&case.p);
    let (xs, ws, ys) = (strides(&case.x, layout), strides(&case.w, layout), strides(&yd, layout));
    match kind {
        ConvKind::Forward | ConvKind::BiasAct(_) => {
            let x = random(s, rng, &case.x, &xs, dtype);
            let w = random(s, rng, &case.w, &ws, dtype);
            let y = poisoned(s, &yd, &ys, dtype);
            let mut reference = cpu::conv_forward(&x.values, &udims(&x), &w.values, &udims(&w), &g);
            if let ConvKind::BiasAct(act) = kind {
                let b = random(s, rng, &[case.w[0]], &[1], dtype);
                ops::conv_bias_act_forward(s, &x.t, &w.t, &b.t, &y.m, &case.p, act)?;
                cpu::bias_activation(&mut reference, &udims(&y), 1, &b.values, ref_act(act));
                return Ok((download(s, &y), reference));
            }
            ops::conv_forward(s, &x.t, &w.t, &y.m, &case.p)?;
            Ok((download(s, &y), reference))
        }
        ConvKind::BackwardData => {
            let dy = random(s, rng, &yd, &ys, dtype);
            let w = random(s, rng, &case.w, &ws, dtype);
            let dx = poisoned(s, &case.x, &xs, dtype);
            ops::conv_backward_data(s, &dy.t, &w.t, &dx.m, &case.p)?;
            let reference = cpu::conv_backward_data(&dy.values, &udims(&dy), &w.values, &udims(&w), &udims(&dx), &g);
            Ok((download(s, &dx), reference))
        }
        ConvKind::BackwardFilter => {
            let x = random(s, rng, &case.x, &xs, dtype);
            let dy = random(s, rng, &yd, &ys, dtype);
            let dw = poisoned(s, &case.w, &ws, dtype);
            ops::conv_backward_filter(s, &x.t, &dy.t, &dw.m, &case.p)?;
            let reference = cpu::conv_backward_filter(&x.values, &udims(&x), &dy.values, &udims(&dy), &udims(&dw), &g);
            Ok((download(s, &dw), reference))
        }
    }
}

fn ref_act(a: Activation) -> cpu::Activation {
    match a {
        Activation::Identity => cpu::Activation::Identity,
        Activation::Relu => cpu::Activation::Relu,
        Activation::Gelu => cpu::Activation::Gelu,
        Activation::GeluTanh => cpu::Activation::GeluTanh,
        Activation::Sigmoid => cpu::Activation::Sigmoid,
        Activation::Tanh => cpu::Activation::Tanh,
        Activation::Elu(alpha) => cpu::Activation::Elu { alpha },
        Activation::Swish(beta) => cpu::Activation::Swish { beta },
    }
}

fn conv_suite(name: &'static str, kind: impl Fn(usize) -> ConvKind, seed: u64) {
    let s = stream();
    let mut report = Report::new(name);
    let mut rng = SplitMix64::new(seed);
    for dtype in DTYPES {
        for layout in LAYOUTS {
            for (i, case) in conv_cases(seed ^ (dtype as u64) << 8 ^ layout as u64)
                .iter()
                .enumerate()
            {
                let k = kind(i);
                let label = format!(
                    "{name} {dtype:?} {layout:?} #{i} {k:?} x{:?} w{:?} {:?}",
                    case.x, case.w, case.p
                );
                match run_conv(&s, &mut rng, k, dtype, layout, case) {
                    Ok((out, reference)) => report.check(label, dtype, &out, &reference),
                    Err(e) => report.error(label, e),
                }
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_forward_matches_reference() {
    conv_suite("conv_forward", |_| ConvKind::Forward, 11);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_backward_data_matches_reference() {
    conv_suite("conv_backward_data", |_| ConvKind::BackwardData, 12);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_backward_filter_matches_reference() {
    conv_suite("conv_backward_filter", |_| ConvKind::BackwardFilter, 13);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_bias_act_matches_reference() {
    let acts = [
        Activation::Relu,
        Activation::Identity,
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::Gelu,
    ];
    conv_suite("conv_bias_act", |i| ConvKind::BiasAct(acts[i % acts.len()]), 14);
}

/// Grouped, dilated, strided, asymmetric geometries with every activation: the fused graph
/// (or its unfused fallback) must be right for each, in both layouts.
#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_bias_act_grouped_dilated_every_activation() {
    let s = stream();
    let mut report = Report::new("conv_bias_act_grouped");
    let mut rng = SplitMix64::new(15);
    let geometries = [
        (vec![4, 10, 20, 18], vec![16, 5, 2, 3], [2, 1], [2, 1], [1, 2], 2),
        (vec![4, 10, 20, 18], vec![16, 10, 2, 3], [2, 1], [2, 1], [1, 2], 1),
        (vec![2, 8, 9, 9], vec![8, 2, 3, 3], [1, 1], [1, 1], [1, 1], 4),
    ];
    for dtype in DTYPES {
        for layout in LAYOUTS {
            for (x, w, pad, stride, dil, groups) in &geometries {
                for act in EVERY_ACTIVATION {
                    let case = ConvCase {
                        x: x.clone(),
                        w: w.clone(),
                        p: ConvParams::new(pad, stride, dil, *groups),
                    };
                    let label = format!("{dtype:?} {layout:?} x{x:?} w{w:?} g{groups} {act:?}");
                    match run_conv(&s, &mut rng, ConvKind::BiasAct(act), dtype, layout, &case) {
                        Ok((out, reference)) => report.check(label, dtype, &out, &reference),
                        Err(e) => report.error(label, e),
                    }
                }
            }
        }
    }
    report.finish();
}

/// Fused conv + bias + activation and matmul + bias + activation with pre-activations up to
/// about ±100 (tanh and sigmoid saturate; cuDNN's own fused tanh returned NaN there).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_activations_of_large_pre_activations() {
    let s = stream();
    let mut report = Report::new("fused_large_pre_activations").tf32_matmul();
    // TF32's error is relative to the summands: with inputs in [-4, 4) the products near
    // zero, where tanh and sigmoid pass errors on unsaturated, carry ~50x their own scale.
    if report.f32_bound > 1e-5 {
        report.f32_bound = 3e-3;
    }
    let mut rng = SplitMix64::new(17);
    let big = |rng: &mut SplitMix64, n: i64| -> Vec<f64> { rng.fill(n as usize).iter().map(|v| 4.0 * v).collect() };
    for dtype in DTYPES {
        for act in EVERY_ACTIVATION {
            // conv: 2x8x9x9 by 8x2x3x3 in 4 groups, inputs in [-4, 4)
            let (xd, wd) = ([2i64, 8, 9, 9], [8i64, 2, 3, 3]);
            let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 4);
            let yd = p.output_dims(&xd, &wd).unwrap();
            let pk = |d: &[i64]| strides(d, Layout::Nchw);
            let (xv, wv, bv) = (big(&mut rng, 1296), big(&mut rng, 144), big(&mut rng, 8));
            let x = upload(&s, &xv, &xd, &pk(&xd), dtype);
            let w = upload(&s, &wv, &wd, &pk(&wd), dtype);
            let b = upload(&s, &bv, &[8], &[1], dtype);
            let y = poisoned(&s, &yd, &pk(&yd), dtype);
            let label = format!("conv {dtype:?} {act:?}");
            match ops::conv_bias_act_forward(&s, &x.t, &w.t, &b.t, &y.m, &p, act) {
                Ok(()) => {
                    let g = integration_tests::reference_geometry(&p);
                    let mut want = cpu::conv_forward(&x.values, &udims(&x), &w.values, &udims(&w), &g);
                    cpu::bias_activation(&mut want, &udims(&y), 1, &b.values, ref_act(act));
                    report.check(label, dtype, &download(&s, &y), &want);
                }
                Err(e) => report.error(label, e),
            }
            // matmul: [37, 64] x [64, 29] + bias, inputs in [-4, 4)
            let (m, k, n) = (37i64, 64i64, 29i64);
            let (av, bmv, biasv) = (big(&mut rng, m * k), big(&mut rng, k * n), big(&mut rng, n));
            let a = upload(&s, &av, &[m, k], &[k, 1], dtype);
            let bm = upload(&s, &bmv, &[k, n], &[n, 1], dtype);
            let bias = upload(&s, &biasv, &[n], &[1], dtype);
            let c = poisoned(&s, &[m, n], &[n, 1], dtype);
            let label = format!("matmul {dtype:?} {act:?}");
            match ops::matmul_bias_act(&s, &a.t, &bm.t, Some(&bias.t), &c.m, act) {
                Ok(()) => {
                    let mut want = vec![0.0; (m * n) as usize];
                    for i in 0..m as usize {
                        for j in 0..n as usize {
                            let dot: f64 = (0..k as usize)
                                .map(|l| a.values[i * k as usize + l] * bm.values[l * n as usize + j])
                                .sum();
                            want[i * n as usize + j] = dot;
                        }
                    }
                    cpu::bias_activation(&mut want, &[m as usize, n as usize], 1, &bias.values, ref_act(act));
                    report.check(label, dtype, &download(&s, &c), &want);
                }
                Err(e) => report.error(label, e),
            }
        }
    }
    report.finish();
}

/// The fused conv + bias + activation cases on the two implicit streams frameworks use:
/// the per-thread default stream (Candle's) and the legacy default stream.
#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_bias_act_on_per_thread_and_legacy_default_streams() {
    let dev = Device::new(0).expect("these tests need a CUDA GPU");
    let mut report = Report::new("conv_bias_act_implicit_streams");
    let mut rng = SplitMix64::new(16);
    let geometries = [
        (vec![4, 10, 20, 18], vec![16, 5, 2, 3], [2, 1], [2, 1], [1, 2], 2),
        (vec![2, 8, 9, 9], vec![8, 2, 3, 3], [1, 1], [1, 1], [1, 1], 4),
    ];
    for (name, s) in [
        ("per-thread", dev.context().per_thread_stream()),
        ("legacy", dev.context().default_stream()),
    ] {
        for (x, w, pad, stride, dil, groups) in &geometries {
            for act in [Activation::Tanh, Activation::Sigmoid, Activation::Relu] {
                let case = ConvCase {
                    x: x.clone(),
                    w: w.clone(),
                    p: ConvParams::new(pad, stride, dil, *groups),
                };
                let label = format!("{name} x{x:?} w{w:?} g{groups} {act:?}");
                match run_conv(&s, &mut rng, ConvKind::BiasAct(act), DataType::F32, Layout::Nchw, &case) {
                    Ok((out, reference)) => report.check(label, DataType::F32, &out, &reference),
                    Err(e) => report.error(label, e),
                }
            }
        }
    }
    report.finish();
}

/// Matmul operand layouts: row-major or transposed storage.
fn mat_strides(dims: &[i64], transposed: bool) -> Vec<i64> {
    let r = dims.len();
    let mut order: Vec<usize> = (0..r).collect();
    if transposed {
        order.swap(r - 2, r - 1);
    }
    cudnn_backend::graph::packed_strides(dims, &order).to_vec()
}

fn matmul_suite(name: &'static str, with_bias: bool, seed: u64) {
    let s = stream();
    let mut report = Report::new(name).tf32_matmul();
    let mut rng = SplitMix64::new(seed);
    let acts = [
        Activation::Relu,
        Activation::Identity,
        Activation::Gelu,
        Activation::Sigmoid,
    ];
    for dtype in DTYPES {
        for (ta, tb) in [(false, false), (false, true), (true, false)] {
            for i in 0..CASES {
                let rank = [2usize, 3, 3, 4][i % 4];
                let (m, k, n) = (
                    pick(&mut rng, &[1, 7, 16, 33, 64]),
                    pick(&mut rng, &[1, 9, 16, 40, 64]),
                    pick(&mut rng, &[3, 8, 17, 64]),
                );
                let mut ad = Vec::new();
                let mut bd = Vec::new();
                for _ in 2..rank {
                    let (x, y) = match rng.below(3) {
                        0 => (1, 3),
                        1 => (2, 1),
                        _ => (2, 2),
                    };
                    ad.push(x);
                    bd.push(y);
                }
                ad.extend([m, k]);
                bd.extend([k, n]);
                let a = random(&s, &mut rng, &ad, &mat_strides(&ad, ta), dtype);
                let b = random(&s, &mut rng, &bd, &mat_strides(&bd, tb), dtype);
                let (mut reference, cd) = cpu::matmul(&a.values, &udims(&a), &b.values, &udims(&b));
                let cd: Vec<i64> = cd.iter().map(|&d| d as i64).collect();
                let c = poisoned(&s, &cd, &mat_strides(&cd, false), dtype);
                let act = if with_bias {
                    acts[i % acts.len()]
                } else {
                    Activation::Identity
                };
                let label = format!("{name} {dtype:?} ta={ta} tb={tb} #{i} a{ad:?} b{bd:?} {act:?}");
                let (result, again) = if with_bias {
                    let bias = random(&s, &mut rng, &[n], &[1], dtype);
                    let r = ops::matmul_bias_act(&s, &a.t, &b.t, Some(&bias.t), &c.m, act);
                    let cdu: Vec<usize> = cd.iter().map(|&d| d as usize).collect();
                    cpu::bias_activation(&mut reference, &cdu, cdu.len() - 1, &bias.values, ref_act(act));
                    // A new fused shape may run unfused while its plan builds in the background:
                    // the first result is checked, then the same call once the plan is built.
                    if r.is_ok() {
                        report.check(format!("{label} (first call)"), dtype, &download(&s, &c), &reference);
                        cudnn_backend::plan::wait_for_background_builds();
                        let c2 = poisoned(&s, &cd, &mat_strides(&cd, false), dtype);
                        (
                            ops::matmul_bias_act(&s, &a.t, &b.t, Some(&bias.t), &c2.m, act),
                            Some(c2),
                        )
                    } else {
                        (r, None)
                    }
                } else {
                    (ops::matmul(&s, &a.t, &b.t, &c.m), None)
                };
                match result {
                    Ok(()) => report.check(label, dtype, &download(&s, again.as_ref().unwrap_or(&c)), &reference),
                    Err(e) => report.error(label, e),
                }
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_matches_reference() {
    matmul_suite("matmul", false, 21);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_bias_act_matches_reference() {
    matmul_suite("matmul_bias_act", true, 22);
}

/// A fused matmul graph seen for the first time builds its plan on a background thread while
/// the call runs unfused; both calls give the reference result. (When the persistent cache
/// already holds the plan, the first call restores it instead.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_new_fused_matmul_builds_in_the_background_and_then_runs_fused() {
    use cudnn_backend::runtime::{build_events, BuildKind};
    let s = stream();
    let mut rng = SplitMix64::new(77);
    let dtype = DataType::F16;
    // A shape no other test uses, so the events below are this test's.
    let (m, k, n) = (48i64, 40i64, 88i64);
    let a = random(&s, &mut rng, &[m, k], &[k, 1], dtype);
    let b = random(&s, &mut rng, &[k, n], &[n, 1], dtype);
    let bias = random(&s, &mut rng, &[n], &[1], dtype);
    let (mut want, _) = cpu::matmul(&a.values, &udims(&a), &b.values, &udims(&b));
    cpu::bias_activation(
        &mut want,
        &[m as usize, n as usize],
        1,
        &bias.values,
        ref_act(Activation::Relu),
    );
    let mut report = Report::new("matmul_background_build");
    let ours =
        |e: &&cudnn_backend::runtime::BuildEvent| e.label.contains("a[1, 48, 40]F16") && e.label.contains("bias");
    for call in ["first", "second"] {
        let c = poisoned(&s, &[m, n], &[n, 1], dtype);
        match ops::matmul_bias_act(&s, &a.t, &b.t, Some(&bias.t), &c.m, Activation::Relu) {
            Ok(()) => report.check(format!("{call} call"), dtype, &download(&s, &c), &want),
            Err(e) => report.error(format!("{call} call"), e),
        }
        if call == "first" {
            cudnn_backend::plan::wait_for_background_builds();
        }
    }
    report.finish();
    let events = build_events();
    let mine: Vec<_> = events.iter().filter(ours).collect();
    let from_disk =
        mine.iter().any(|e| e.kind == BuildKind::PlanRestore) && !mine.iter().any(|e| e.kind == BuildKind::PlanBuild);
    let built_aside = mine
        .iter()
        .any(|e| e.kind == BuildKind::PlanBuild && e.thread == "cudnn-backend-plan");
    assert!(
        from_disk || built_aside,
        "expected the fused plan built on a background thread (or restored from disk), got {mine:#?}"
    );
}

/// A packed tensor that starts `shift` elements into its buffer (`shift` 1 leaves the
/// pointer off 16-byte alignment), with its logical values.
fn shifted(
    s: &Arc<CudaStream>,
    rng: &mut SplitMix64,
    dims: &[i64],
    dtype: DataType,
    shift: i64,
) -> (DevTensor, TensorRef<'static>, Vec<f64>) {
    let n: i64 = dims.iter().product();
    let flat = random(s, rng, &[n + 1], &[1], dtype);
    let view = flat
        .t
        .view(shift, dims, &row_major_strides(dims))
        .expect("shifted view");
    let values = flat.values[shift as usize..(shift + n) as usize].to_vec();
    (flat, view, values)
}

/// Matmul (+ bias + ReLU) with each operand, and the output, starting at an odd element:
/// cuDNN's cuBLASLt engines fail on such pointers, so the engine copies them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_of_unaligned_views_matches_reference() {
    let s = stream();
    let mut report = Report::new("matmul_unaligned").tf32_matmul();
    let mut rng = SplitMix64::new(23);
    let shapes = [
        (vec![7i64, 9], vec![9i64, 17]),
        (vec![3, 33, 40], vec![3, 40, 64]),
        (vec![2, 3, 5, 16], vec![2, 1, 16, 8]),
    ];
    for dtype in DTYPES {
        for (ad, bd) in &shapes {
            // Bits: a, b, bias, c shifted by one element; 0 is the aligned control.
            for mask in [0u32, 1, 2, 4, 8, 15] {
                let shift = |bit: u32| i64::from(mask >> bit & 1);
                let (_a, a, av) = shifted(&s, &mut rng, ad, dtype, shift(0));
                let (_b, b, bv) = shifted(&s, &mut rng, bd, dtype, shift(1));
                let ud = |d: &[i64]| d.iter().map(|&x| x as usize).collect::<Vec<_>>();
                let (mut reference, cd) = cpu::matmul(&av, &ud(ad), &bv, &ud(bd));
                let cd: Vec<i64> = cd.iter().map(|&d| d as i64).collect();
                let n = cd[cd.len() - 1];
                let (_bias, bias, biasv) = shifted(&s, &mut rng, &[n], dtype, shift(2));
                let numel: i64 = cd.iter().product();
                let out = poisoned(&s, &[numel + 1], &[1], dtype);
                let c = out
                    .m
                    .view_mut(shift(3), &cd, &row_major_strides(&cd))
                    .expect("shifted view");
                let label = format!("{dtype:?} a{ad:?} b{bd:?} shifted {mask:04b}");
                let fused = mask & 4 != 0;
                let result = if fused {
                    cpu::bias_activation(
                        &mut reference,
                        &ud(&cd),
                        cd.len() - 1,
                        &biasv,
                        ref_act(Activation::Relu),
                    );
                    ops::matmul_bias_act(&s, &a, &b, Some(&bias), &c, Activation::Relu)
                } else {
                    ops::matmul(&s, &a, &b, &c)
                };
                match result {
                    Ok(()) => {
                        let all = download(&s, &out);
                        let got = &all[shift(3) as usize..(shift(3) + numel) as usize];
                        report.check(label, dtype, got, &reference);
                    }
                    Err(e) => report.error(label, e),
                }
            }
        }
    }
    report.finish();
}

/// A language model's logits products with a vocabulary that is not a multiple of 16 bytes
/// (2,053), large enough that the engine pads that dim with zeros first: the forward `h · Wᵀ`
/// (odd output rows), the input gradient `dY · W` (the odd dim reduced) and the weight
/// gradient `dYᵀ · h` (an odd column-major operand).
#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_with_odd_leading_dimensions_matches_reference() {
    let s = stream();
    let mut report = Report::new("matmul_odd_leading_dimension").tf32_matmul();
    let mut rng = SplitMix64::new(24);
    let (m, k, vocab) = (1024i64, 768i64, 2053i64);
    for dtype in DTYPES {
        // (label, a dims, a strides, b dims, b strides)
        let cases = [
            ("h·Wt", [m, k], vec![k, 1], [k, vocab], vec![1, k]),
            ("dY·W", [m, vocab], vec![vocab, 1], [vocab, k], vec![k, 1]),
            ("dYt·h", [vocab, m], vec![1, vocab], [m, k], vec![k, 1]),
        ];
        for (name, ad, as_, bd, bs) in cases {
            let a = random(&s, &mut rng, &ad, &as_, dtype);
            let b = random(&s, &mut rng, &bd, &bs, dtype);
            let (reference, cd) = cpu::matmul(&a.values, &udims(&a), &b.values, &udims(&b));
            let cd: Vec<i64> = cd.iter().map(|&d| d as i64).collect();
            let c = poisoned(&s, &cd, &row_major_strides(&cd), dtype);
            let label = format!("{dtype:?} {name}");
            match ops::matmul(&s, &a.t, &b.t, &c.m) {
                Ok(()) => report.check(label, dtype, &download(&s, &c), &reference),
                Err(e) => report.error(label, e),
            }
        }
    }
    report.finish();
}

fn pool_cases(seed: u64) -> Vec<(Vec<i64>, PoolParams)> {
    let mut rng = SplitMix64::new(seed);
    let modes = [PoolMode::Max, PoolMode::AvgIncludePadding, PoolMode::AvgExcludePadding];
    (0..CASES)
        .map(|i| {
            let spatial = [2usize, 2, 1, 3][i % 4];
            let mode = modes[i % 3];
            let mut x = vec![pick(&mut rng, &[1, 2, 3]), pick(&mut rng, &[1, 3, 8, 16])];
            let mut p = PoolParams::new(mode, &[], &[], &[]);
            for _ in 0..spatial {
                let w = pick(&mut rng, &[1, 2, 3, 3, 4]);
                let pad = rng.below(w as u64) as i64;
                let pad = pad.min(w / 2);
                x.push(w + pick(&mut rng, &[0, 3, 6, 10]));
                p.window.push(w);
                p.stride.push(pick(&mut rng, &[1, 2, 2, 3]));
                p.pre_padding.push(pad);
                p.post_padding.push(pad);
            }
            (x, p)
        })
        .collect()
}

fn pool_geometry(p: &PoolParams) -> PoolGeometry {
    let u = |v: &[i64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    PoolGeometry {
        window: u(&p.window),
        stride: u(&p.stride),
        pre_padding: u(&p.pre_padding),
        post_padding: u(&p.post_padding),
        mode: match p.mode {
            PoolMode::Max => cpu::PoolMode::Max,
            PoolMode::AvgIncludePadding => cpu::PoolMode::AvgIncludePadding,
            PoolMode::AvgExcludePadding => cpu::PoolMode::AvgExcludePadding,
        },
    }
}

/// Max-pool inputs with no ties inside any window, exactly representable in bf16:
/// the value depends on (position mod window) through a random injection.
fn tie_free(rng: &mut SplitMix64, dims: &[i64], window: &[i64]) -> Vec<f64> {
    let combos: i64 = window.iter().product();
    let mut perm: Vec<i64> = (0..combos).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let n: i64 = dims.iter().product();
    let spatial = &dims[2..];
    (0..n)
        .map(|flat| {
            let mut rem = flat;
            let mut code = 0;
            let mut coords = vec![0; spatial.len()];
            for a in (0..spatial.len()).rev() {
                coords[a] = rem % spatial[a];
                rem /= spatial[a];
            }
            let nc = rem;
            for (a, &c) in coords.iter().enumerate() {
                code = code * window[a] + c % window[a];
            }
            (perm[code as usize] - combos / 2) as f64 / 8.0 + ((nc * 7) % 5 - 2) as f64
        })
        .collect()
}

fn pool_suite(name: &'static str, backward: bool, seed: u64) {
    let s = stream();
    let mut report = Report::new(name);
    let mut rng = SplitMix64::new(seed);
    for dtype in DTYPES {
        for layout in LAYOUTS {
            for (i, (xd, p)) in pool_cases(seed ^ (dtype as u64) << 8 ^ layout as u64)
                .iter()
                .enumerate()
            {
                let yd = p.output_dims(xd).expect("pool case");
                let (xs, ys) = (strides(xd, layout), strides(&yd, layout));
                let g = pool_geometry(p);
                let label = format!("{name} {dtype:?} {layout:?} #{i} x{xd:?} {p:?}");
                let x = if p.mode == PoolMode::Max {
                    upload(&s, &tie_free(&mut rng, xd, &p.window), xd, &xs, dtype)
                } else {
                    random(&s, &mut rng, xd, &xs, dtype)
                };
                let y = poisoned(&s, &yd, &ys, dtype);
                let fwd = ops::pool_forward(&s, &x.t, &y.m, p);
                let outcome = fwd.and_then(|()| {
                    if !backward {
                        return Ok((download(&s, &y), cpu::pool_forward(&x.values, &udims(&x), &g)));
                    }
                    let dy = random(&s, &mut rng, &yd, &ys, dtype);
                    let dx = poisoned(&s, xd, &xs, dtype);
                    let (xa, ya): (Option<&TensorRef>, Option<&TensorRef>) = if p.mode == PoolMode::Max {
                        (Some(&x.t), Some(&y.t))
                    } else {
                        (None, None)
                    };
                    ops::pool_backward(&s, xa, ya, &dy.t, &dx.m, p)?;
                    Ok((
                        download(&s, &dx),
                        cpu::pool_backward(&x.values, &udims(&x), &dy.values, &g),
                    ))
                });
                match outcome {
                    Ok((out, reference)) => report.check(label, dtype, &out, &reference),
                    Err(e) => report.error(label, e),
                }
            }
        }
    }
    report.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_forward_matches_reference() {
    pool_suite("pool_forward", false, 31);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_backward_matches_reference() {
    pool_suite("pool_backward", true, 32);
}

/// Repeated calls with identical pointers reuse the plan's variant pack and, from the third
/// call, replay a captured CUDA graph: results must follow the buffers' current contents, on
/// the crate's stream and on the legacy default stream, and new pointers must be honoured,
/// also when two pointer sets alternate (each keeps its own pack and graph).
#[test]
#[ignore = "needs a CUDA GPU"]
fn repeated_calls_track_new_input_data() {
    let dev = Device::new(0).expect("these tests need a CUDA GPU");
    let mut report = Report::new("repeated_calls");
    let mut rng = SplitMix64::new(41);
    for (label, s) in [
        ("device stream", dev.stream().clone()),
        ("legacy default stream", dev.context().default_stream()),
    ] {
        let (xd, wd) = ([2i64, 8, 10, 10], [16i64, 8, 3, 3]);
        let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
        let yd = p.output_dims(&xd, &wd).unwrap();
        let (xs, ws, ys) = (
            strides(&xd, Layout::Nhwc),
            strides(&wd, Layout::Nhwc),
            strides(&yd, Layout::Nhwc),
        );
        let mut x = random(&s, &mut rng, &xd, &xs, DataType::F16);
        let w = random(&s, &mut rng, &wd, &ws, DataType::F16);
        let y = poisoned(&s, &yd, &ys, DataType::F16);
        let g = integration_tests::reference_geometry(&p);
        for i in 0..6 {
            // New values in the same buffer (same device pointer).
            let fresh = random(&s, &mut rng, &xd, &xs, DataType::F16);
            s.memcpy_dtod(&fresh.buf, &mut x.buf).unwrap();
            x.values = fresh.values;
            ops::conv_forward(&s, &x.t, &w.t, &y.m, &p).expect("conv");
            let reference = cpu::conv_forward(&x.values, &udims(&x), &w.values, &udims(&w), &g);
            report.check(
                format!("{label} call {i}"),
                DataType::F16,
                &download(&s, &y),
                &reference,
            );
        }
        // A new output buffer after the replay: the call must write there, not to the old one.
        let y2 = poisoned(&s, &yd, &ys, DataType::F16);
        ops::conv_forward(&s, &x.t, &w.t, &y2.m, &p).expect("conv into a new buffer");
        let reference = cpu::conv_forward(&x.values, &udims(&x), &w.values, &udims(&w), &g);
        report.check(
            format!("{label} new output buffer"),
            DataType::F16,
            &download(&s, &y2),
            &reference,
        );
        // Two pointer sets in turn (as two layers of one shape): each keeps its own variant
        // pack and, once repeated, its own captured graph; each call writes its own output.
        for i in 0..8 {
            let fresh = random(&s, &mut rng, &xd, &xs, DataType::F16);
            s.memcpy_dtod(&fresh.buf, &mut x.buf).unwrap();
            x.values = fresh.values;
            let out = if i % 2 == 0 { &y } else { &y2 };
            ops::conv_forward(&s, &x.t, &w.t, &out.m, &p).expect("conv, alternating outputs");
            let reference = cpu::conv_forward(&x.values, &udims(&x), &w.values, &udims(&w), &g);
            report.check(
                format!("{label} alternating call {i}"),
                DataType::F16,
                &download(&s, out),
                &reference,
            );
        }
    }
    report.finish();
}

/// Views made with the safe constructors from cudarc slices: a conv and an elementwise
/// kernel through them match the reference, and the checks that keep safe code inside its
/// memory are errors before anything is enqueued: a view that outgrows its slice, a view
/// made for another stream than the op's, and a part outside its view.
#[test]
#[ignore = "needs a CUDA GPU"]
fn safe_views_of_cudarc_slices() {
    use cudnn_backend::kernels::elementwise as ew;
    use cudnn_backend::ops::TensorMut;
    use cudnn_backend::Error;

    let dev = Device::new(0).expect("these tests need a CUDA GPU");
    let s = dev.stream();
    let mut report = Report::new("safe_views").tf32_matmul();
    let mut rng = SplitMix64::new(59);
    let (xd, wd) = ([2i64, 3, 6, 6], [4i64, 3, 3, 3]);
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    let yd = p.output_dims(&xd, &wd).unwrap();
    let numel = |d: &[i64]| d.iter().product::<i64>() as usize;
    let xv: Vec<f64> = rng.fill(numel(&xd)).iter().map(|&v| v as f32 as f64).collect();
    let wv: Vec<f64> = rng.fill(numel(&wd)).iter().map(|&v| v as f32 as f64).collect();
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
    let x = s.clone_htod(&f32s(&xv)).unwrap();
    let w = s.clone_htod(&f32s(&wv)).unwrap();
    let mut y = s.clone_htod(&vec![f32::NAN; numel(&yd)]).unwrap();
    {
        let xt = TensorRef::packed(&x, s, &xd).expect("x view");
        let wt = TensorRef::packed(&w, s, &wd).expect("w view");
        let yt = TensorMut::packed(&mut y, s, &yd).expect("y view");
        ops::conv_forward(s, &xt, &wt, &yt, &p).expect("conv through safe views");
    }
    let got: Vec<f64> = s.clone_dtoh(&y).unwrap().into_iter().map(f64::from).collect();
    let ud = |d: &[i64]| d.iter().map(|&v| v as usize).collect::<Vec<_>>();
    let want = cpu::conv_forward(&xv, &ud(&xd), &wv, &ud(&wd), &integration_tests::reference_geometry(&p));
    report.check("conv".into(), DataType::F32, &got, &want);
    // In place through one writable view: y = y * y.
    {
        let yt = TensorMut::packed(&mut y, s, &yd).expect("y view");
        ew::binary(s, ew::BinaryOp::Mul, &yt, &yt, &yt).expect("in-place square");
    }
    let squared: Vec<f64> = s.clone_dtoh(&y).unwrap().into_iter().map(f64::from).collect();
    let want_sq: Vec<f64> = got.iter().map(|&v| (v as f32 * v as f32) as f64).collect();
    report.check("in-place square".into(), DataType::F32, &squared, &want_sq);
    report.finish();

    let invalid = |r: cudnn_backend::Result<()>, arg: &str| match r {
        Err(Error::InvalidArgument { arg: a, .. }) if a == arg => {}
        other => panic!("expected an argument error naming {arg}: {other:?}"),
    };
    // A view reaching one element past its slice.
    let outgrown = TensorRef::packed(&x, s, &[2, 3, 6, 7]).map(|_| ());
    invalid(outgrown, "slice");
    // A view made for another stream than the op's (its synchronization is recorded there).
    let other = dev.context().new_stream().expect("second stream");
    let xt = TensorRef::packed(&x, &other, &xd).unwrap();
    let wt = TensorRef::packed(&w, s, &wd).unwrap();
    let yt = TensorMut::packed(&mut y, s, &yd).unwrap();
    invalid(ops::conv_forward(s, &xt, &wt, &yt, &p), "x");
    invalid(ew::unary(s, ew::UnaryOp::Neg, &xt, &yt), "x");
    // A part outside its view.
    let whole = TensorRef::packed(&w, s, &wd).unwrap();
    assert!(whole.view(1, &[numel(&wd) as i64], &[1]).is_err());
    assert!(whole.view(1, &[numel(&wd) as i64 - 1], &[1]).is_ok());
}
