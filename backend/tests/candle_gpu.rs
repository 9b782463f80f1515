//! GPU tests of the Candle feature (feature `candle-cuda`, a CUDA GPU with cuDNN 9):
//! every op against a float64 reference on random shapes per dtype, gradients against
//! Candle's own CUDA ops, a CNN of our layers training, several threads on one device, and a
//! ResNet-50 conv benchmark against Candle's conv2d (its JSON feeds bench/compare_torch.py).
//!
//! Run: `cargo test --release -p cudnn-backend --features candle-cuda --test candle_gpu --
//! --include-ignored --test-threads=1 --nocapture` (see scripts/setup-candle-cuda.sh).
#![cfg(feature = "candle-cuda")]

use std::sync::Arc;

use candle_core::{DType, Device, Module, ModuleT, Result, Tensor, Var};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use cudnn_backend::candle::nn as cnn;
use cudnn_backend::candle::{Activation, Conv1dParams, Conv2dParams, Conv3dParams, ConvTranspose2dParams, CudnnExt};
use cudnn_backend_reference::SplitMix64;

const CASES: usize = 20;
/// Every fused activation (ELU and Swish with one parameter each).
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
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn gpu() -> Device {
    static REPORT: std::sync::Once = std::sync::Once::new();
    // Which cuDNN, NVRTC and driver this process loaded (they depend on LD_LIBRARY_PATH).
    REPORT.call_once(|| println!("{}", cudnn_backend::runtime::report()));
    Device::new_cuda(0).expect("needs a CUDA GPU")
}

fn rand_cpu(rng: &mut SplitMix64, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

fn r(rng: &mut SplitMix64, lo: usize, hi: usize) -> usize {
    lo + rng.below((hi - lo + 1) as u64) as usize
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let (a, b) = (vals(a), vals(b));
    if a.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

/// An input of a random case: float64 values and whether it is stored channels-last.
struct In(Tensor, bool);

fn to_gpu(i: &In, dt: DType, dev: &Device) -> Tensor {
    let t = i.0.to_dtype(dt).unwrap().to_device(dev).unwrap();
    if i.1 && t.rank() >= 3 {
        let r = t.rank();
        let to_last: Vec<usize> = std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect();
        t.permute(to_last)
            .unwrap()
            .contiguous()
            .unwrap()
            .permute(from_channels_last(r))
            .unwrap()
    } else {
        t
    }
}

fn tol(dt: DType, f32_tol: f64) -> f64 {
    match dt {
        DType::F32 => f32_tol,
        DType::F16 => 1e-2,
        _ => 2e-2,
    }
}

/// Runs `f` on `CASES` random cases per dtype on the GPU and on the CPU in float64 (on the
/// GPU inputs rounded to the dtype), and checks the relative L2 error. Prints the worst.
fn check<P>(
    name: &str,
    f32_tol: f64,
    mut gen: impl FnMut(&mut SplitMix64) -> Option<(Vec<In>, P, String)>,
    f: impl Fn(&[Tensor], &P) -> Result<Tensor>,
) {
    let dev = gpu();
    let mut rng = SplitMix64::new(name.bytes().map(u64::from).sum());
    for dt in DTYPES {
        let (mut done, mut worst, mut worst_case) = (0, 0f64, String::new());
        let mut tries = 0;
        while done < CASES {
            tries += 1;
            assert!(tries < 50 * CASES, "{name}: the generator rarely makes a valid case");
            let Some((inputs, prm, desc)) = gen(&mut rng) else {
                continue;
            };
            let g: Vec<Tensor> = inputs.iter().map(|i| to_gpu(i, dt, &dev)).collect();
            let c: Vec<Tensor> = g
                .iter()
                .map(|t| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap())
                .collect();
            let y = f(&g, &prm).unwrap_or_else(|e| panic!("{name} {dt:?} {desc}: {e}"));
            assert_eq!(y.dtype(), dt, "{name}: output dtype");
            let want = f(&c, &prm).unwrap();
            let e = rel_err(&y, &want);
            if e.is_nan() || e > tol(dt, f32_tol) {
                let why = diagnose(&g, &y, &want, |t| f(t, &prm));
                panic!("{name} {dt:?} {desc}: relative L2 error {e:e}\n{why}");
            }
            if e >= worst {
                (worst, worst_case) = (e, desc);
            }
            done += 1;
        }
        println!("{name:<22} {dt:?}: {CASES} shapes, max rel L2 {worst:.2e} ({worst_case})");
    }
}

/// Non-finite values of `t`: how many, and the logical index of the first.
fn non_finite(t: &Tensor) -> (usize, Option<Vec<usize>>) {
    let v = vals(t);
    let first = v.iter().position(|x| !x.is_finite()).map(|mut i| {
        let mut idx = vec![0; t.rank()];
        for (d, &n) in t.dims().iter().enumerate().rev() {
            idx[d] = i % n;
            i /= n;
        }
        idx
    });
    (v.iter().filter(|x| !x.is_finite()).count(), first)
}

/// What a failed case looks like: non-finite outputs, finite inputs, and whether running the
/// same op again on the same GPU tensors (also after a device synchronize) repeats it: a
/// deterministic engine result or a transient one (stale memory, ordering).
fn diagnose(g: &[Tensor], y: &Tensor, want: &Tensor, f: impl Fn(&[Tensor]) -> Result<Tensor>) -> String {
    let mut out = Vec::new();
    let (bad, first) = non_finite(y);
    out.push(format!(
        "  output {:?} strides {:?}: {bad} of {} non-finite, first at {first:?}",
        y.dims(),
        y.stride(),
        y.elem_count()
    ));
    for (i, t) in g.iter().enumerate() {
        let (bad, _) = non_finite(t);
        out.push(format!(
            "  input {i} {:?} strides {:?}: {bad} non-finite",
            t.dims(),
            t.stride()
        ));
    }
    for label in ["rerun", "rerun after synchronize"] {
        if label != "rerun" {
            let _ = g[0].device().synchronize();
        }
        match f(g) {
            Ok(y2) => {
                let same = vals(&y2).iter().zip(vals(y)).all(|(a, b)| a.to_bits() == b.to_bits());
                out.push(format!(
                    "  {label}: rel L2 {:.3e}, {} non-finite, bitwise equal to the first run: {same}",
                    rel_err(&y2, want),
                    non_finite(&y2).0
                ));
            }
            Err(e) => out.push(format!("  {label}: {e}")),
        }
    }
    out.join("\n")
}

fn act_of(i: usize) -> Activation {
    [
        Activation::Identity,
        Activation::Relu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Gelu,
        Activation::Swish(1.0),
    ][i % 6]
}

fn conv2d_case(rng: &mut SplitMix64) -> Option<(Vec<In>, Conv2dParams, String)> {
    let groups = [1, 1, 2, 4][r(rng, 0, 3)];
    let depthwise = groups > 1 && rng.below(3) == 0;
    let cg = if depthwise { 1 } else { r(rng, 1, 8) };
    let kg = r(rng, 1, 8);
    let (n, h, w) = (r(rng, 1, 4), r(rng, 4, 20), r(rng, 4, 20));
    let (kh, kw) = (r(rng, 1, 5), r(rng, 1, 5));
    let p = Conv2dParams {
        padding: [r(rng, 0, 2), r(rng, 0, 2)],
        stride: [r(rng, 1, 3), r(rng, 1, 3)],
        dilation: [r(rng, 1, 2), r(rng, 1, 2)],
        groups,
    };
    if h + 2 * p.padding[0] < p.dilation[0] * (kh - 1) + 1 || w + 2 * p.padding[1] < p.dilation[1] * (kw - 1) + 1 {
        return None;
    }
    let cl = rng.below(2) == 1;
    let x = In(rand_cpu(rng, &[n, cg * groups, h, w]), cl);
    let wt = In(rand_cpu(rng, &[kg * groups, cg, kh, kw]), cl);
    let desc = format!("x {:?} w {:?} {p:?} nhwc={cl}", x.0.dims(), wt.0.dims());
    Some((vec![x, wt], p, desc))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv2d_matches_f64_reference() {
    check("conv2d", 1e-4, conv2d_case, |t, p| t[0].cudnn_conv2d(&t[1], *p));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv2d_gradients_match_f64_reference() {
    check(
        "conv2d dgrad+wgrad",
        1e-4,
        |rng| {
            let (mut v, p, d) = conv2d_case(rng)?;
            let y = v[0].0.cudnn_conv2d(&v[1].0, p).ok()?;
            v.push(In(rand_cpu(rng, y.dims()), v[0].1));
            Some((v, p, d))
        },
        |t, p| {
            let (x, w) = (Var::from_tensor(&t[0])?, Var::from_tensor(&t[1])?);
            let y = x.as_tensor().cudnn_conv2d(w.as_tensor(), *p)?;
            let loss = (y.to_dtype(DType::F32)? * t[2].to_dtype(DType::F32)?)?.sum_all()?;
            let g = loss.backward()?;
            let dx = g.get(x.as_tensor()).unwrap().flatten_all()?;
            let dw = g.get(w.as_tensor()).unwrap().flatten_all()?;
            Tensor::cat(&[dx, dw], 0)
        },
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv1d_conv3d_and_transpose_match_f64_reference() {
    check(
        "conv1d",
        1e-4,
        |rng| {
            let g = r(rng, 1, 3);
            let (n, c, k, l, kw) = (
                r(rng, 1, 4),
                g * r(rng, 1, 6),
                g * r(rng, 1, 6),
                r(rng, 8, 40),
                r(rng, 1, 5),
            );
            let p = Conv1dParams {
                padding: r(rng, 0, 2),
                stride: r(rng, 1, 3),
                dilation: r(rng, 1, 2),
                groups: g,
            };
            if l + 2 * p.padding < p.dilation * (kw - 1) + 1 {
                return None;
            }
            let cl = rng.below(2) == 1;
            let d = format!("x [{n},{c},{l}] k {k} win {kw} {p:?} nlc={cl}");
            Some((
                vec![
                    In(rand_cpu(rng, &[n, c, l]), cl),
                    In(rand_cpu(rng, &[k, c / g, kw]), cl),
                ],
                p,
                d,
            ))
        },
        |t, p| t[0].cudnn_conv1d(&t[1], *p),
    );
    check(
        "conv3d",
        1e-4,
        |rng| {
            let g = r(rng, 1, 2);
            let (n, c, k) = (r(rng, 1, 2), g * r(rng, 1, 4), g * r(rng, 1, 4));
            let (d, h, w) = (r(rng, 3, 8), r(rng, 3, 8), r(rng, 3, 8));
            let win = r(rng, 1, 3);
            let p = Conv3dParams {
                padding: [r(rng, 0, 1); 3],
                stride: [1, r(rng, 1, 2), 1],
                dilation: [1; 3],
                groups: g,
            };
            let cl = rng.below(2) == 1;
            let desc = format!("x [{n},{c},{d},{h},{w}] k {k} win {win} {p:?} ndhwc={cl}");
            Some((
                vec![
                    In(rand_cpu(rng, &[n, c, d, h, w]), cl),
                    In(rand_cpu(rng, &[k, c / g, win, win, win]), cl),
                ],
                p,
                desc,
            ))
        },
        |t, p| t[0].cudnn_conv3d(&t[1], *p),
    );
    check(
        "conv_transpose2d",
        1e-4,
        |rng| {
            let g = r(rng, 1, 2);
            let (n, c, k, h, w, win) = (
                r(rng, 1, 3),
                g * r(rng, 1, 6),
                r(rng, 1, 6),
                r(rng, 2, 12),
                r(rng, 2, 12),
                r(rng, 1, 4),
            );
            let s = r(rng, 1, 3);
            let p = ConvTranspose2dParams {
                padding: [r(rng, 0, (win - 1).min(1)); 2],
                output_padding: [r(rng, 0, s - 1); 2],
                stride: [s; 2],
                dilation: [1; 2],
                groups: g,
            };
            let cl = rng.below(2) == 1;
            let desc = format!("x [{n},{c},{h},{w}] out {} win {win} {p:?} nhwc={cl}", k * g);
            Some((
                vec![
                    In(rand_cpu(rng, &[n, c, h, w]), cl),
                    In(rand_cpu(rng, &[c, k, win, win]), false),
                ],
                p,
                desc,
            ))
        },
        |t, p| t[0].cudnn_conv_transpose2d(&t[1], *p),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_conv_bias_act_matches_f64_reference() {
    let mut which = 0usize;
    check(
        "conv2d_bias_act",
        1e-4,
        |rng| {
            let (mut v, p, d) = conv2d_case(rng)?;
            let k = v[1].0.dims()[0];
            v.push(In(rand_cpu(rng, &[k]), false));
            which += 1;
            let act = act_of(which);
            Some((v, (p, act), format!("{d} {act:?}")))
        },
        |t, (p, act)| t[0].cudnn_conv2d_bias_act(&t[1], &t[2], *p, *act),
    );
}

/// The geometries of the engine-level test (integration-tests gpu_ops.rs,
/// `conv_bias_act_grouped_dilated_every_activation`: grouped, dilated, strided, padding as
/// large as the window) through the Candle op, for every activation, dtype and layout. Every
/// failure is listed with the plain convolution's error on the same tensors (conv engine or
/// the bias/activation part?) and the diagnosis of `diagnose`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_conv_bias_act_grouped_dilated_every_activation() {
    let dev = gpu();
    let mut rng = SplitMix64::new(15);
    let acts = EVERY_ACTIVATION;
    // (x, w, padding, stride, dilation, groups)
    let geometries = [
        ([4, 10, 20, 18], [16, 5, 2, 3], [2, 1], [2, 1], [1, 2], 2),
        ([4, 10, 20, 18], [16, 10, 2, 3], [2, 1], [2, 1], [1, 2], 1),
        ([2, 8, 9, 9], [8, 2, 3, 3], [1, 1], [1, 1], [1, 1], 4),
    ];
    let (mut runs, mut failures) = (0, Vec::new());
    for dt in DTYPES {
        for nhwc in [false, true] {
            for (xd, wd, padding, stride, dilation, groups) in geometries {
                let p = Conv2dParams {
                    padding,
                    stride,
                    dilation,
                    groups,
                };
                for act in acts {
                    let inputs = [
                        In(rand_cpu(&mut rng, &xd), nhwc),
                        In(rand_cpu(&mut rng, &wd), nhwc),
                        In(rand_cpu(&mut rng, &[wd[0]]), false),
                    ];
                    let g: Vec<Tensor> = inputs.iter().map(|i| to_gpu(i, dt, &dev)).collect();
                    let c: Vec<Tensor> = g
                        .iter()
                        .map(|t| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap())
                        .collect();
                    let f = |t: &[Tensor]| t[0].cudnn_conv2d_bias_act(&t[1], &t[2], p, act);
                    let label = format!("{dt:?} nhwc={nhwc} x {xd:?} w {wd:?} {p:?} {act:?}");
                    runs += 1;
                    let y = match f(&g) {
                        Ok(y) => y,
                        Err(e) => {
                            failures.push(format!("{label}: {e}"));
                            continue;
                        }
                    };
                    let want = f(&c).unwrap();
                    let e = rel_err(&y, &want);
                    if e.is_nan() || e > tol(dt, 1e-4) {
                        let conv = match (g[0].cudnn_conv2d(&g[1], p), c[0].cudnn_conv2d(&c[1], p)) {
                            (Ok(a), Ok(b)) => format!("{:.3e}", rel_err(&a, &b)),
                            (Err(e), _) | (_, Err(e)) => e.to_string(),
                        };
                        let why = diagnose(&g, &y, &want, f);
                        failures.push(format!(
                            "{label}: rel L2 {e:.3e}; plain conv on the same tensors: rel L2 {conv}\n{why}"
                        ));
                    }
                }
            }
        }
    }
    println!("conv2d_bias_act grouped: {runs} runs, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Isolates the fused conv + bias + tanh case: the same inputs on Candle's default device
/// (per-thread default stream) and on a device with its own stream, against the unfused
/// result (our conv + bias, then Candle's tanh), with the pre-activation values printed
/// where the fused output is not finite.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_tanh_on_default_and_own_stream() {
    let mut rng = SplitMix64::new(77);
    let p = Conv2dParams {
        padding: [1, 1],
        stride: [1, 1],
        dilation: [1, 1],
        groups: 4,
    };
    let (x, w, b) = (
        rand_cpu(&mut rng, &[2, 8, 9, 9]),
        rand_cpu(&mut rng, &[8, 2, 3, 3]),
        rand_cpu(&mut rng, &[8]),
    );
    let mut report = Vec::new();
    let mut bad_total = 0;
    for (label, dev) in [
        ("default stream", gpu()),
        ("own stream", Device::new_cuda_with_stream(0).unwrap()),
    ] {
        for act in [Activation::Tanh, Activation::Sigmoid] {
            let (xg, wg, bg) = (
                x.to_dtype(DType::F32).unwrap().to_device(&dev).unwrap(),
                w.to_dtype(DType::F32).unwrap().to_device(&dev).unwrap(),
                b.to_dtype(DType::F32).unwrap().to_device(&dev).unwrap(),
            );
            let fused = xg.cudnn_conv2d_bias_act(&wg, &bg, p, act).unwrap();
            let z = xg.cudnn_conv2d_bias_act(&wg, &bg, p, Activation::Identity).unwrap();
            let unfused = match act {
                Activation::Tanh => z.tanh().unwrap(),
                _ => candle_nn::ops::sigmoid(&z).unwrap(),
            };
            let (bad, first) = non_finite(&fused);
            bad_total += bad;
            let (fv, zv) = (vals(&fused), vals(&z));
            let samples: Vec<String> = fv
                .iter()
                .zip(&zv)
                .filter(|(f, _)| !f.is_finite())
                .take(4)
                .map(|(f, z)| format!("{f} (pre-activation {z:.4})"))
                .collect();
            report.push(format!(
                "{label} {act:?}: {bad} of {} non-finite (first {first:?}: {samples:?}); rel L2 vs unfused {:.3e}",
                fused.elem_count(),
                rel_err(&fused, &unfused)
            ));
        }
    }
    println!("{}", report.join("\n"));
    assert_eq!(bad_total, 0, "non-finite fused outputs:\n{}", report.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmuls_match_f64_reference() {
    let mut i = 0usize;
    let mut gen = |rng: &mut SplitMix64| {
        let (m, k, n) = (r(rng, 1, 96), r(rng, 1, 96), r(rng, 1, 96));
        let nb = r(rng, 0, 2);
        let mut ad: Vec<usize> = (0..nb).map(|_| r(rng, 1, 4)).collect();
        let mut bd = ad.clone();
        if nb > 0 && rng.below(2) == 1 {
            bd[0] = 1; // broadcast
        }
        let bt = rng.below(2) == 1; // b stored transposed
        ad.extend([m, k]);
        let bshape: Vec<usize> = bd.iter().copied().chain(if bt { [n, k] } else { [k, n] }).collect();
        i += 1;
        let act = act_of(i);
        let d = format!("a {ad:?} b {bshape:?} transposed={bt} {act:?}");
        Some((
            vec![
                In(rand_cpu(rng, &ad), false),
                In(rand_cpu(rng, &bshape), false),
                In(rand_cpu(rng, &[n]), false),
            ],
            (bt, act),
            d,
        ))
    };
    let b_of = |t: &[Tensor], bt: bool| if bt { t[1].t().unwrap() } else { t[1].clone() };
    // f32 matmuls run on TF32 tensor cores (see docs/numerics.md).
    check("matmul", 5e-3, &mut gen, |t, (bt, _)| t[0].cudnn_matmul(&b_of(t, *bt)));
    check("matmul_bias_act", 5e-3, &mut gen, |t, (bt, act)| {
        t[0].cudnn_matmul_bias_act(&b_of(t, *bt), &t[2], *act)
    });
}

/// The gradients of the fused matmul + bias + activation (dx, dw, dbias through the fused
/// `grad · act'` kernel on the GPU) against the float64 CPU path, for every activation. `a`
/// is scaled by 1/√K so the pre-activation is O(1), as at a network's initialization: f32
/// products run on TF32 (about 1e-3 relative), and for saturating activations (sigmoid, tanh)
/// the gradient's relative error grows with |z| times z's error (1e-2 at |z| ≈ 5, for any
/// formula of the derivative), which this test is not about.
#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_bias_act_gradients_match_f64_reference() -> Result<()> {
    let acts = &EVERY_ACTIVATION[1..];
    let mut i = 0usize;
    let gen = |rng: &mut SplitMix64| {
        let (m, k, n) = (r(rng, 1, 64), r(rng, 1, 64), r(rng, 1, 64));
        i += 1;
        let act = acts[i % acts.len()];
        let a = (rand_cpu(rng, &[m, k]) * (1.0 / (k as f64).sqrt())).unwrap();
        Some((
            vec![
                In(a, false),
                In(rand_cpu(rng, &[k, n]), false),
                In(rand_cpu(rng, &[n]), false),
                In(rand_cpu(rng, &[m, n]), false),
            ],
            act,
            format!("a [{m}, {k}] b [{k}, {n}] {act:?}"),
        ))
    };
    let grads = |t: &[Tensor], act: Activation| -> Result<Vec<Tensor>> {
        let (a, b, bias) = (
            Var::from_tensor(&t[0])?,
            Var::from_tensor(&t[1])?,
            Var::from_tensor(&t[2])?,
        );
        let y = a
            .as_tensor()
            .cudnn_matmul_bias_act(b.as_tensor(), bias.as_tensor(), act)?;
        let loss = (y.to_dtype(DType::F32)? * t[3].to_dtype(DType::F32)?)?.sum_all()?;
        let g = loss.backward()?;
        [&a, &b, &bias]
            .iter()
            .map(|v| g.get(v.as_tensor()).unwrap().flatten_all())
            .collect()
    };
    // Each gradient on its own first (which part is off, for every activation), then all.
    let dev = gpu();
    let mut rng = SplitMix64::new(71);
    let mut off = Vec::new();
    for &act in acts {
        let dims: [&[usize]; 4] = [&[3, 40], &[40, 24], &[24], &[3, 24]];
        let mut inputs = dims.map(|d| rand_cpu(&mut rng, d));
        inputs[0] = (&inputs[0] * (1.0 / 40f64.sqrt()))?;
        let g: Vec<Tensor> = inputs
            .iter()
            .map(|t| t.to_dtype(DType::F32).unwrap().to_device(&dev).unwrap())
            .collect();
        let c: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(DType::F64).unwrap()).collect();
        let (got, want) = (grads(&g, act)?, grads(&c, act)?);
        let errs: Vec<f64> = got.iter().zip(&want).map(|(x, y)| rel_err(x, y)).collect();
        println!(
            "matmul_bias_act {act:?} F32: rel L2 da {:.2e} db {:.2e} dbias {:.2e}",
            errs[0], errs[1], errs[2]
        );
        if errs.iter().any(|e| e.is_nan() || *e >= 5e-3) {
            off.push(format!(
                "{act:?}: da {:.2e} db {:.2e} dbias {:.2e}",
                errs[0], errs[1], errs[2]
            ));
        }
    }
    assert!(off.is_empty(), "gradients off: {}", off.join("; "));
    check("matmul_bias_act grads", 5e-3, gen, |t, act| {
        Tensor::cat(&grads(t, *act)?, 0)
    });
    Ok(())
}

/// Our embedding layer (the engine's gather, and its scatter-add for the table's gradient,
/// accumulated in f32): the lookup equals Candle's `index_select` on the same GPU, the table's
/// gradient matches a float64 CPU `index_add`; f32/f16/bf16, ids repeated many times.
#[test]
#[ignore = "needs a CUDA GPU"]
fn embedding_lookup_and_gradient_match_candles() -> Result<()> {
    let dev = gpu();
    let mut rng = SplitMix64::new(41);
    for dt in DTYPES {
        for (vocab, width, batch, seq) in [(64, 512, 8, 256), (1000, 96, 3, 7), (5, 33, 4, 100)] {
            let table = rand_cpu(&mut rng, &[vocab, width]).to_dtype(dt)?.to_device(&dev)?;
            let ids: Vec<u32> = (0..batch * seq).map(|_| rng.below(vocab as u64) as u32).collect();
            let ids = Tensor::from_vec(ids, (batch, seq), &dev)?;
            let weight = rand_cpu(&mut rng, &[batch, seq, width])
                .to_dtype(DType::F32)?
                .to_device(&dev)?;
            let v = Var::from_tensor(&table)?;
            let rows = cnn::Embedding::new(v.as_tensor().clone(), width).forward(&ids)?;
            let loss = (rows.to_dtype(DType::F32)? * &weight)?.sum_all()?;
            let grad = loss.backward()?.get(v.as_tensor()).unwrap().clone();
            let want_rows = candle_nn::Embedding::new(table.clone(), width).forward(&ids)?;
            assert_eq!(rows.dims(), &[batch, seq, width]);
            assert_eq!(vals(&rows), vals(&want_rows), "{dt:?} lookup differs from index_select");
            let cpu = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F64);
            let want_grad = Tensor::zeros((vocab, width), DType::F64, &Device::Cpu)?.index_add(
                &ids.flatten_all()?.to_device(&Device::Cpu)?,
                &cpu(&weight)?.reshape((batch * seq, width))?,
                0,
            )?;
            let e = rel_err(&grad, &want_grad);
            assert!(
                e < tol(dt, 1e-6),
                "{dt:?} vocab {vocab} width {width}: table gradient rel L2 {e:.2e}"
            );
            println!("embedding {dt:?} [{vocab}, {width}] x {batch}x{seq} ids: gradient rel L2 {e:.2e}");
        }
    }
    Ok(())
}

/// The fused cross-entropy on CUDA (loss and logits gradient) against the float64 reference
/// on the CPU device, with and without an ignored class, including a vocabulary-sized row.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cross_entropy_and_gradient_match_f64_reference() -> Result<()> {
    use cudnn_backend::candle::ops::{cross_entropy, cross_entropy_ignore_index};
    let dev = gpu();
    let mut rng = SplitMix64::new(53);
    for dt in DTYPES {
        for (rows, classes) in [(37, 11), (64, 1000), (8, 50_257)] {
            let x = (rand_cpu(&mut rng, &[rows, classes]) * 6.0)?;
            let t: Vec<u32> = (0..rows).map(|_| rng.below(classes as u64) as u32).collect();
            let targets = Tensor::from_vec(t, rows, &Device::Cpu)?;
            for ignore in [None, Some(i64::from(targets.get(0)?.to_scalar::<u32>()?))] {
                let loss = |logits: &Tensor, targets: &Tensor| match ignore {
                    Some(i) => cross_entropy_ignore_index(logits, targets, i),
                    None => cross_entropy(logits, targets),
                };
                // The reference sees the logits rounded to the dtype, as the GPU does.
                let x_cpu = Var::from_tensor(&x.to_dtype(dt)?.to_dtype(DType::F64)?)?;
                let want = loss(x_cpu.as_tensor(), &targets)?;
                let want_grad = want.backward()?.get(x_cpu.as_tensor()).unwrap().clone();
                let x_gpu = Var::from_tensor(&x.to_dtype(dt)?.to_device(&dev)?)?;
                let got = loss(x_gpu.as_tensor(), &targets.to_device(&dev)?)?;
                assert_eq!(got.dtype(), dt);
                let got_grad = got.backward()?.get(x_gpu.as_tensor()).unwrap().clone();
                let (e, eg) = (rel_err(&got, &want), rel_err(&got_grad, &want_grad));
                assert!(
                    e < tol(dt, 1e-6) && eg < tol(dt, 1e-6),
                    "{dt:?} [{rows}, {classes}] ignore {ignore:?}: loss rel {e:.2e}, gradient rel L2 {eg:.2e}"
                );
                println!("cross-entropy {dt:?} [{rows}, {classes}] ignore {ignore:?}: loss {e:.2e}, gradient {eg:.2e}");
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pooling_matches_f64_reference() {
    let gen = |rng: &mut SplitMix64| {
        let (n, c, h, w) = (r(rng, 1, 4), r(rng, 1, 16), r(rng, 4, 24), r(rng, 4, 24));
        let k = r(rng, 1, 4);
        let s = r(rng, 1, 3);
        let pad = r(rng, 0, k / 2);
        let cl = rng.below(2) == 1;
        let d = format!("x [{n},{c},{h},{w}] k {k} s {s} pad {pad} nhwc={cl}");
        Some((vec![In(rand_cpu(rng, &[n, c, h, w]), cl)], (k, s, pad), d))
    };
    check("max_pool2d", 1e-6, gen, |t, &(k, s, p)| {
        t[0].cudnn_max_pool2d([k, k], [s, s], [p, p])
    });
    check("avg_pool2d incl", 1e-5, gen, |t, &(k, s, p)| {
        t[0].cudnn_avg_pool2d([k, k], [s, s], [p, p], true)
    });
    check("avg_pool2d excl", 1e-5, gen, |t, &(k, s, p)| {
        t[0].cudnn_avg_pool2d([k, k], [s, s], [p, p], false)
    });
    check("max_pool2d backward", 1e-5, gen, |t, &(k, s, p)| {
        let x = Var::from_tensor(&t[0])?;
        let y = x.as_tensor().cudnn_max_pool2d([k, k], [s, s], [p, p])?;
        let lw = Tensor::arange(0f32, y.elem_count() as f32, y.device())?
            .reshape(y.shape())?
            .cos()?;
        let g = (y.to_dtype(DType::F32)? * lw)?.sum_all()?.backward()?;
        Ok(g.get(x.as_tensor()).unwrap().clone())
    });
    check("avg_pool2d backward", 1e-5, gen, |t, &(k, s, p)| {
        let x = Var::from_tensor(&t[0])?;
        let y = x.as_tensor().cudnn_avg_pool2d([k, k], [s, s], [p, p], false)?;
        let lw = Tensor::arange(0f32, y.elem_count() as f32, y.device())?
            .reshape(y.shape())?
            .cos()?;
        let g = (y.to_dtype(DType::F32)? * lw)?.sum_all()?.backward()?;
        Ok(g.get(x.as_tensor()).unwrap().clone())
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_and_sdpa_match_f64_reference() {
    let gen = |rng: &mut SplitMix64| {
        let (b, l, h) = (r(rng, 1, 4), r(rng, 1, 32), r(rng, 2, 256));
        let d = format!("x [{b},{l},{h}]");
        Some((
            vec![
                In(rand_cpu(rng, &[b, l, h]), false),
                In(rand_cpu(rng, &[h]), false),
                In(rand_cpu(rng, &[h]), false),
            ],
            (),
            d,
        ))
    };
    check("layer_norm", 1e-5, gen, |t, _| {
        t[0].cudnn_layer_norm(&t[1], Some(&t[2]), 1e-5)
    });
    check("rms_norm", 1e-5, gen, |t, _| t[0].cudnn_rms_norm(&t[1], 1e-5));
    check(
        "batch_norm",
        1e-5,
        |rng| {
            let (n, c, h, w) = (r(rng, 1, 4), r(rng, 1, 32), r(rng, 1, 16), r(rng, 1, 16));
            let var = rand_cpu(rng, &[c]).abs().unwrap();
            let cl = rng.below(2) == 1;
            let v = vec![
                In(rand_cpu(rng, &[n, c, h, w]), cl),
                In(rand_cpu(rng, &[c]), false),
                In(var, false),
                In(rand_cpu(rng, &[c]), false),
                In(rand_cpu(rng, &[c]), false),
            ];
            Some((v, (), format!("x [{n},{c},{h},{w}] nhwc={cl}")))
        },
        |t, _| t[0].cudnn_batch_norm(&t[1], &t[2], Some(&t[3]), Some(&t[4]), 1e-5),
    );
    check(
        "sdpa",
        5e-3,
        |rng| {
            let (b, h, lq, lk, d) = (
                r(rng, 1, 2),
                r(rng, 1, 4),
                r(rng, 1, 64),
                r(rng, 1, 64),
                [8, 16, 32, 64][r(rng, 0, 3)],
            );
            let desc = format!("q [{b},{h},{lq},{d}] k/v len {lk}");
            let v = vec![
                In(rand_cpu(rng, &[b, h, lq, d]), false),
                In(rand_cpu(rng, &[b, h, lk, d]), false),
                In(rand_cpu(rng, &[b, h, lk, d]), false),
                In(rand_cpu(rng, &[lq, lk]), false),
            ];
            Some((v, 1.0 / (d as f64).sqrt(), desc))
        },
        |t, &scale| t[0].cudnn_sdpa(&t[1], &t[2], Some(&t[3]), scale),
    );
    // Without a mask, f16/bf16 take cuDNN's fused attention graph (f32: the composed path);
    // so does the causal mask (bottom-right aligned, Lq <= Lk), computed in the graph.
    check(
        "sdpa fused",
        5e-3,
        |rng| unmasked_sdpa_case(rng, false),
        |t, &scale| t[0].cudnn_sdpa(&t[1], &t[2], None, scale),
    );
    check(
        "sdpa causal",
        5e-3,
        |rng| unmasked_sdpa_case(rng, true),
        |t, &scale| t[0].cudnn_causal_sdpa(&t[1], &t[2], scale),
    );
}

/// q, k, v of a random attention case without a mask input (Lq <= Lk when `causal`), the
/// scale and a description.
fn unmasked_sdpa_case(rng: &mut SplitMix64, causal: bool) -> Option<(Vec<In>, f64, String)> {
    let (b, h, lq, lk, d, dv) = (
        r(rng, 1, 2),
        r(rng, 1, 4),
        r(rng, 1, 80),
        r(rng, 1, 80),
        [8, 16, 32, 64, 128][r(rng, 0, 4)],
        [8, 32, 64][r(rng, 0, 2)],
    );
    let lq = if causal { lq.min(lk) } else { lq };
    let desc = format!("causal {causal} q [{b},{h},{lq},{d}] k len {lk} v dim {dv}");
    let v = vec![
        In(rand_cpu(rng, &[b, h, lq, d]), false),
        In(rand_cpu(rng, &[b, h, lk, d]), false),
        In(rand_cpu(rng, &[b, h, lk, dv]), false),
    ];
    Some((v, 1.0 / (d as f64).sqrt(), desc))
}

/// Layer and RMS norm through cuDNN for feature sizes 1..=33 and around 64, 128 and 256 in
/// each dtype, each call synchronized and checked, printing progress (a size an engine
/// mishandles shows up as the last line printed).
#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_over_every_feature_size() {
    use std::io::Write;
    let dev = gpu();
    let mut rng = SplitMix64::new(57);
    let mut worst = 0.0f64;
    for dt in DTYPES {
        for rms in [true, false] {
            for h in (1..=33usize).chain([63, 64, 65, 127, 128, 129, 255, 256, 257]) {
                print!("{dt:?} {} h={h} ", if rms { "rms" } else { "layer" });
                std::io::stdout().flush().unwrap();
                let x = rand_cpu(&mut rng, &[3, 5, h]);
                let w = rand_cpu(&mut rng, &[h]);
                let (xg, wg) = (
                    x.to_dtype(dt).unwrap().to_device(&dev).unwrap(),
                    w.to_dtype(dt).unwrap().to_device(&dev).unwrap(),
                );
                let y = if rms {
                    xg.cudnn_rms_norm(&wg, 1e-5)
                } else {
                    xg.cudnn_layer_norm(&wg, None, 1e-5)
                }
                .unwrap();
                dev.synchronize().unwrap();
                let (xc, wc) = (
                    xg.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap(),
                    wg.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap(),
                );
                let want = if rms {
                    xc.cudnn_rms_norm(&wc, 1e-5)
                } else {
                    xc.cudnn_layer_norm(&wc, None, 1e-5)
                }
                .unwrap();
                let e = rel_err(&y, &want);
                worst = worst.max(if dt == DType::F32 { e } else { 0.0 });
                println!("{e:.1e}");
                assert!(e <= tol(dt, 1e-5), "{dt:?} rms={rms} h={h}: rel L2 {e:.3e}");
            }
        }
    }
    println!("norms over every feature size: worst f32 rel L2 {worst:.2e}");
}

/// Gradients of the layer norm, RMS norm and fused attention (the engine's norm backward and
/// cuDNN's fused attention backward) against the same functions written with Candle's own
/// ops, on the GPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_and_sdpa_gradients_match_candle_ops() {
    let dev = gpu();
    let mut rng = SplitMix64::new(31);
    let var = |rng: &mut SplitMix64, dims: &[usize], dt: DType| {
        Var::from_tensor(&rand_cpu(rng, dims).to_dtype(dt).unwrap().to_device(&dev).unwrap()).unwrap()
    };
    let composed_ln = |x: &Tensor, w: &Tensor, b: Option<&Tensor>, rms: bool| -> Result<Tensor> {
        let xf = x.to_dtype(DType::F32)?;
        let c = if rms {
            xf.clone()
        } else {
            xf.broadcast_sub(&xf.mean_keepdim(2)?)?
        };
        let y = c.broadcast_div(&(c.sqr()?.mean_keepdim(2)? + 1e-5)?.sqrt()?)?;
        let y = y.broadcast_mul(&w.to_dtype(DType::F32)?)?;
        match b {
            Some(b) => y.broadcast_add(&b.to_dtype(DType::F32)?),
            None => Ok(y),
        }
    };
    let mut report = Vec::new();
    for dt in [DType::F32, DType::BF16] {
        for rms in [false, true] {
            let (x, w, b) = (
                var(&mut rng, &[3, 7, 96], dt),
                var(&mut rng, &[96], dt),
                var(&mut rng, &[96], dt),
            );
            let probe = rand_cpu(&mut rng, &[3, 7, 96])
                .to_dtype(DType::F32)
                .unwrap()
                .to_device(&dev)
                .unwrap();
            let ours = if rms {
                x.as_tensor().cudnn_rms_norm(w.as_tensor(), 1e-5).unwrap()
            } else {
                x.as_tensor()
                    .cudnn_layer_norm(w.as_tensor(), Some(b.as_tensor()), 1e-5)
                    .unwrap()
            };
            let loss = (ours.to_dtype(DType::F32).unwrap() * &probe)
                .unwrap()
                .sum_all()
                .unwrap();
            let vars: Vec<&Var> = if rms { vec![&x, &w] } else { vec![&x, &w, &b] };
            let got = grads(&vars, &loss);
            let theirs = composed_ln(x.as_tensor(), w.as_tensor(), (!rms).then(|| b.as_tensor()), rms).unwrap();
            let want = grads(&vars, &(theirs * &probe).unwrap().sum_all().unwrap());
            let tol = if dt == DType::F32 { 1e-4 } else { 2e-2 };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = rel_err(&g.to_dtype(DType::F32).unwrap(), &w.to_dtype(DType::F32).unwrap());
                report.push(format!(
                    "{} {dt:?} grad {i}: rel L2 {e:.2e}",
                    if rms { "rms_norm" } else { "layer_norm" }
                ));
                assert!(e <= tol, "{}", report.last().unwrap());
            }
        }
    }
    for (dt, causal) in [
        (DType::F16, false),
        (DType::BF16, false),
        (DType::F16, true),
        (DType::BF16, true),
    ] {
        let (q, k, v) = (
            var(&mut rng, &[2, 3, 40, 64], dt),
            var(&mut rng, &[2, 3, 56, 64], dt),
            var(&mut rng, &[2, 3, 56, 32], dt),
        );
        let probe = rand_cpu(&mut rng, &[2, 3, 40, 32])
            .to_dtype(DType::F32)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let scale = 0.125;
        let ours = if causal {
            q.as_tensor().cudnn_causal_sdpa(k.as_tensor(), v.as_tensor(), scale)
        } else {
            q.as_tensor().cudnn_sdpa(k.as_tensor(), v.as_tensor(), None, scale)
        }
        .unwrap();
        let got = grads(
            &[&q, &k, &v],
            &(ours.to_dtype(DType::F32).unwrap() * &probe)
                .unwrap()
                .sum_all()
                .unwrap(),
        );
        let f = |t: &Var| t.as_tensor().to_dtype(DType::F32).unwrap();
        let mut s = (f(&q).matmul(&f(&k).t().unwrap()).unwrap() * scale).unwrap();
        if causal {
            // Query i (of 40) sees keys j <= i + 16 (of 56).
            let hidden: Vec<f32> = (0..40 * 56)
                .map(|e| if e % 56 > e / 56 + 16 { f32::NEG_INFINITY } else { 0.0 })
                .collect();
            let bias = Tensor::from_vec(hidden, (40, 56), &dev).unwrap();
            s = s.broadcast_add(&bias).unwrap();
        }
        let e = s.broadcast_sub(&s.max_keepdim(3).unwrap()).unwrap().exp().unwrap();
        let p = e.broadcast_div(&e.sum_keepdim(3).unwrap()).unwrap();
        let theirs = p.matmul(&f(&v)).unwrap();
        let want = grads(&[&q, &k, &v], &(&theirs * &probe).unwrap().sum_all().unwrap());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = rel_err(&g.to_dtype(DType::F32).unwrap(), &w.to_dtype(DType::F32).unwrap());
            report.push(format!("sdpa {dt:?} causal {causal} grad {i}: rel L2 {e:.2e}"));
            assert!(e <= 2e-2, "{}", report.last().unwrap());
        }
        let e = rel_err(&ours.to_dtype(DType::F32).unwrap(), &theirs);
        report.push(format!(
            "sdpa {dt:?} causal {causal} forward vs f32 composed: rel L2 {e:.2e}"
        ));
        assert!(e <= 1e-2, "{}", report.last().unwrap());
    }
    println!("{}", report.join("\n"));
}

fn grads(vars: &[&Var], loss: &Tensor) -> Vec<Tensor> {
    let g = loss.backward().unwrap();
    vars.iter()
        .map(|v| g.get(v.as_tensor()).expect("gradient").clone())
        .collect()
}

fn close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    let e = rel_err(a, b);
    println!("{what:<36} rel L2 {e:.2e}");
    assert!(e <= tol, "{what}: relative L2 error {e:e} > {tol:e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_match_candles_own_cuda_ops() {
    let dev = gpu();
    let mut rng = SplitMix64::new(21);
    let g32 =
        |rng: &mut SplitMix64, d: &[usize]| rand_cpu(rng, d).to_dtype(DType::F32).unwrap().to_device(&dev).unwrap();
    for (groups, stride, pad, dil) in [(1, 1, 1, 1), (2, 2, 0, 1), (1, 1, 2, 2), (4, 1, 1, 1)] {
        let x = Var::from_tensor(&g32(&mut rng, &[4, 8, 17, 15])).unwrap();
        let w = Var::from_tensor(&g32(&mut rng, &[12, 8 / groups, 3, 3])).unwrap();
        let p = Conv2dParams {
            padding: [pad; 2],
            stride: [stride; 2],
            dilation: [dil; 2],
            groups,
        };
        let ours = x.as_tensor().cudnn_conv2d(w.as_tensor(), p).unwrap();
        let theirs = x.as_tensor().conv2d(w.as_tensor(), pad, stride, dil, groups).unwrap();
        close(
            &ours,
            &theirs,
            1e-4,
            &format!("conv2d fwd g{groups} s{stride} p{pad} d{dil}"),
        );
        let lw = g32(&mut rng, ours.dims());
        let a = grads(&[&x, &w], &(&ours * &lw).unwrap().sum_all().unwrap());
        let b = grads(&[&x, &w], &(&theirs * &lw).unwrap().sum_all().unwrap());
        close(&a[0], &b[0], 1e-4, "conv2d dx");
        close(&a[1], &b[1], 1e-4, "conv2d dw");
    }
    // Transposed convolution.
    let x = Var::from_tensor(&g32(&mut rng, &[2, 6, 9, 9])).unwrap();
    let w = Var::from_tensor(&g32(&mut rng, &[6, 4, 3, 3])).unwrap();
    let p = ConvTranspose2dParams {
        padding: [1, 1],
        output_padding: [1, 1],
        stride: [2, 2],
        ..Default::default()
    };
    let ours = x.as_tensor().cudnn_conv_transpose2d(w.as_tensor(), p).unwrap();
    let theirs = x.as_tensor().conv_transpose2d(w.as_tensor(), 1, 1, 2, 1).unwrap();
    close(&ours, &theirs, 1e-4, "conv_transpose2d fwd");
    let lw = g32(&mut rng, ours.dims());
    let a = grads(&[&x, &w], &(&ours * &lw).unwrap().sum_all().unwrap());
    let b = grads(&[&x, &w], &(&theirs * &lw).unwrap().sum_all().unwrap());
    close(&a[0], &b[0], 1e-4, "conv_transpose2d dx");
    close(&a[1], &b[1], 1e-4, "conv_transpose2d dw");
    // Fused conv + bias + GELU vs Candle's conv2d + broadcast_add + gelu_erf.
    let x = Var::from_tensor(&g32(&mut rng, &[2, 8, 12, 12])).unwrap();
    let w = Var::from_tensor(&g32(&mut rng, &[16, 8, 3, 3])).unwrap();
    let bias = Var::from_tensor(&g32(&mut rng, &[16])).unwrap();
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let ours = x
        .as_tensor()
        .cudnn_conv2d_bias_act(w.as_tensor(), bias.as_tensor(), p, Activation::Gelu)
        .unwrap();
    let theirs = x
        .as_tensor()
        .conv2d(w.as_tensor(), 1, 1, 1, 1)
        .unwrap()
        .broadcast_add(&bias.as_tensor().reshape((1, 16, 1, 1)).unwrap())
        .unwrap()
        .gelu_erf()
        .unwrap();
    close(&ours, &theirs, 1e-4, "conv_bias_gelu fwd");
    let lw = g32(&mut rng, ours.dims());
    let a = grads(&[&x, &w, &bias], &(&ours * &lw).unwrap().sum_all().unwrap());
    let b = grads(&[&x, &w, &bias], &(&theirs * &lw).unwrap().sum_all().unwrap());
    for (i, n) in ["dx", "dw", "db"].iter().enumerate() {
        close(&a[i], &b[i], 1e-4, &format!("conv_bias_gelu {n}"));
    }
    // Matmul (TF32 on our side).
    let a_ = Var::from_tensor(&g32(&mut rng, &[3, 64, 48])).unwrap();
    let b_ = Var::from_tensor(&g32(&mut rng, &[3, 48, 80])).unwrap();
    let ours = a_.as_tensor().cudnn_matmul(b_.as_tensor()).unwrap();
    let theirs = a_.as_tensor().matmul(b_.as_tensor()).unwrap();
    close(&ours, &theirs, 5e-3, "matmul fwd");
    let lw = g32(&mut rng, ours.dims());
    let ga = grads(&[&a_, &b_], &(&ours * &lw).unwrap().sum_all().unwrap());
    let gb = grads(&[&a_, &b_], &(&theirs * &lw).unwrap().sum_all().unwrap());
    close(&ga[0], &gb[0], 5e-3, "matmul da");
    close(&ga[1], &gb[1], 5e-3, "matmul db");
    // Pooling (Candle's max_pool2d backward divides by the window size, so compare with the
    // same pooling written as reshape + max; Candle's avg_pool2d backward needs k == stride).
    let x = Var::from_tensor(&g32(&mut rng, &[2, 8, 16, 16])).unwrap();
    let ours = x.as_tensor().cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).unwrap();
    let theirs = x
        .as_tensor()
        .reshape((2, 8, 8, 2, 8, 2))
        .unwrap()
        .max_keepdim(5)
        .unwrap()
        .max_keepdim(3)
        .unwrap()
        .reshape((2, 8, 8, 8))
        .unwrap();
    close(&ours, &theirs, 0.0, "max_pool2d fwd");
    let lw = g32(&mut rng, ours.dims());
    let a = grads(&[&x], &(&ours * &lw).unwrap().sum_all().unwrap());
    let b = grads(&[&x], &(&theirs * &lw).unwrap().sum_all().unwrap());
    close(&a[0], &b[0], 1e-6, "max_pool2d dx");
    let ours = x.as_tensor().cudnn_avg_pool2d([2, 2], [2, 2], [0, 0], true).unwrap();
    let theirs = x.as_tensor().avg_pool2d(2).unwrap();
    let lw = g32(&mut rng, ours.dims());
    let a = grads(&[&x], &(&ours * &lw).unwrap().sum_all().unwrap());
    let b = grads(&[&x], &(&theirs * &lw).unwrap().sum_all().unwrap());
    close(&a[0], &b[0], 1e-6, "avg_pool2d dx");
}

/// Synthetic two-class images: a bright square in the top-left or the bottom-right quadrant.
fn toy_data(dev: &Device, n: usize, seed: u64) -> (Tensor, Tensor) {
    let mut rng = SplitMix64::new(seed);
    let mut xs = vec![0f32; n * 16 * 16];
    let mut ys = vec![0u32; n];
    for i in 0..n {
        ys[i] = (i % 2) as u32;
        let (oy, ox) = if ys[i] == 0 {
            (r(&mut rng, 0, 4), r(&mut rng, 0, 4))
        } else {
            (r(&mut rng, 8, 12), r(&mut rng, 8, 12))
        };
        for p in 0..256 {
            xs[i * 256 + p] = 0.2 * (rng.next_f64() as f32 - 0.5);
        }
        for yy in oy..oy + 4 {
            for xx in ox..ox + 4 {
                xs[i * 256 + yy * 16 + xx] += 1.0;
            }
        }
    }
    (
        Tensor::from_vec(xs, (n, 1, 16, 16), dev).unwrap(),
        Tensor::from_vec(ys, n, dev).unwrap(),
    )
}

/// A candle-nn style CNN whose layers are ours (changed imports only) trains on the GPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cnn_of_our_layers_trains_on_the_gpu() {
    let dev = gpu();
    let map = VarMap::new();
    let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
    let cfg = cnn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let c1 = cnn::conv2d(1, 16, 3, cfg, vb.pp("c1"))
        .unwrap()
        .with_activation(Activation::Relu);
    let bn1 = cnn::batch_norm(16, 1e-5, vb.pp("bn1")).unwrap();
    let c2 = cnn::conv2d(16, 32, 3, cfg, vb.pp("c2"))
        .unwrap()
        .with_activation(Activation::Relu);
    let fc1 = cnn::linear(32 * 4 * 4, 64, vb.pp("fc1"))
        .unwrap()
        .with_activation(Activation::Relu);
    let fc2 = cnn::linear(64, 2, vb.pp("fc2")).unwrap();
    let mut opt = candle_nn::AdamW::new_lr(map.all_vars(), 1e-3).unwrap();
    let (x, y) = toy_data(&dev, 64, 5);
    let mut losses = Vec::new();
    for _ in 0..40 {
        let h = c1.forward(&x).unwrap();
        let h = bn1.forward_t(&h, true).unwrap();
        let h = h.cudnn_max_pool2d([2, 2], [2, 2], [0, 0]).unwrap();
        let h = c2.forward(&h).unwrap();
        let h = h
            .cudnn_avg_pool2d([2, 2], [2, 2], [0, 0], true)
            .unwrap()
            .flatten_from(1)
            .unwrap();
        let logits = fc2.forward(&fc1.forward(&h).unwrap()).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        opt.backward_step(&loss).unwrap();
    }
    println!(
        "training loss: first {:.4}, last {:.4}",
        losses[0],
        losses[losses.len() - 1]
    );
    assert!(
        losses[losses.len() - 1] < 0.3 * losses[0],
        "loss did not fall: {losses:?}"
    );
}

/// The same model built with candle-nn's layers and with ours, from one VarMap, gives the
/// same loss and gradients (a model switches by changing imports).
#[test]
#[ignore = "needs a CUDA GPU"]
fn candle_nn_model_switches_to_our_layers() {
    let dev = gpu();
    let map = VarMap::new();
    let vb = VarBuilder::from_varmap(&map, DType::F32, &dev);
    let cfg = candle_nn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let theirs_c = candle_nn::conv2d(1, 8, 3, cfg, vb.pp("c")).unwrap();
    let theirs_l = candle_nn::linear(8 * 16 * 16, 2, vb.pp("l")).unwrap();
    let ours_c = cnn::conv2d(1, 8, 3, cfg, vb.pp("c")).unwrap();
    let ours_l = cnn::linear(8 * 16 * 16, 2, vb.pp("l")).unwrap();
    let (x, y) = toy_data(&dev, 8, 6);
    let loss = |c: &dyn Module, l: &dyn Module| {
        let h = c.forward(&x).unwrap().relu().unwrap().flatten_from(1).unwrap();
        candle_nn::loss::cross_entropy(&l.forward(&h).unwrap(), &y).unwrap()
    };
    let (a, b) = (loss(&ours_c, &ours_l), loss(&theirs_c, &theirs_l));
    close(&a, &b, 1e-3, "loss ours vs candle-nn");
    let (ga, gb) = (a.backward().unwrap(), b.backward().unwrap());
    for v in map.all_vars() {
        close(
            ga.get(v.as_tensor()).unwrap(),
            gb.get(v.as_tensor()).unwrap(),
            5e-3,
            "gradient ours vs candle-nn",
        );
    }
}

/// Our ops on a second GPU match the first; operands on two GPUs are an error, after
/// which both GPUs still compute. Needs two CUDA GPUs (fails saying so with fewer).
#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_ops_compute_on_each_and_refuse_mixing() -> Result<()> {
    let n = cudnn_backend::runtime::device_count().expect("needs CUDA GPUs");
    assert!(n >= 2, "this test needs two CUDA GPUs; the machine has {n}");
    let devs = [gpu(), Device::new_cuda(1)?];
    let mut rng = SplitMix64::new(78);
    let (x, w, b) = (
        rand_cpu(&mut rng, &[2, 8, 10, 10]),
        rand_cpu(&mut rng, &[16, 8, 3, 3]),
        rand_cpu(&mut rng, &[16]),
    );
    let (a, m) = (rand_cpu(&mut rng, &[33, 40]), rand_cpu(&mut rng, &[40, 17]));
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let f32_on = |t: &Tensor, d: &Device| t.to_dtype(DType::F32)?.to_device(d);
    let run = |d: &Device| -> Result<(Tensor, Tensor)> {
        let y = f32_on(&x, d)?.cudnn_conv2d_bias_act(&f32_on(&w, d)?, &f32_on(&b, d)?, p, Activation::Relu)?;
        let c = f32_on(&a, d)?.cudnn_matmul(&f32_on(&m, d)?)?;
        Ok((y, c))
    };
    let (y0, c0) = run(&devs[0])?;
    let (y1, c1) = run(&devs[1])?;
    let (ey, ec) = (rel_err(&y1, &y0), rel_err(&c1, &c0));
    assert!(ey < 1e-5 && ec < 2e-3, "GPU 1 vs GPU 0: conv {ey:.2e}, matmul {ec:.2e}");
    let mixed = [
        (
            "conv2d",
            f32_on(&x, &devs[1])?.cudnn_conv2d(&f32_on(&w, &devs[0])?, p).err(),
        ),
        (
            "conv2d_bias_act",
            f32_on(&x, &devs[0])?
                .cudnn_conv2d_bias_act(&f32_on(&w, &devs[0])?, &f32_on(&b, &devs[1])?, p, Activation::Relu)
                .err(),
        ),
        (
            "matmul",
            f32_on(&a, &devs[0])?.cudnn_matmul(&f32_on(&m, &devs[1])?).err(),
        ),
        ("max_pool2d then add", {
            let pooled = f32_on(&x, &devs[1])?.cudnn_max_pool2d([2, 2], [2, 2], [0, 0])?;
            (pooled + f32_on(&x, &devs[0])?.cudnn_max_pool2d([2, 2], [2, 2], [0, 0])?).err()
        }),
    ];
    for (op, err) in &mixed {
        let err = err
            .as_ref()
            .unwrap_or_else(|| panic!("{op}: operands on two GPUs accepted"));
        println!(
            "two GPUs, {op}: refused ({})",
            err.to_string().lines().next().unwrap_or("")
        );
    }
    let (y0b, _) = run(&devs[0])?;
    let (y1b, _) = run(&devs[1])?;
    assert!(
        rel_err(&y0b, &y0) == 0.0 && rel_err(&y1b, &y1) == 0.0,
        "results changed after the refusals"
    );
    println!(
        "two GPUs: conv+bias+relu and matmul on GPU 1 match GPU 0 ({ey:.1e}, {ec:.1e}); {} mixed calls refused",
        mixed.len()
    );
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn several_threads_share_one_candle_device() {
    let dev = gpu();
    let mut rng = SplitMix64::new(31);
    let mut cases = Vec::new();
    for t in 0..6 {
        let x = rand_cpu(&mut rng, &[2, 8 * (1 + t % 3), 14, 14])
            .to_dtype(DType::F16)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let w = rand_cpu(&mut rng, &[16, 8 * (1 + t % 3), 3, 3])
            .to_dtype(DType::F16)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let p = Conv2dParams {
            padding: [1, 1],
            ..Default::default()
        };
        let want = x.cudnn_conv2d(&w, p).unwrap();
        cases.push((x, w, want));
    }
    // Candle's device uses the per-thread default stream: the inputs and the expected outputs
    // were enqueued on this thread's stream, which the workers' streams do not wait for.
    dev.synchronize().unwrap();
    let cases = Arc::new(cases);
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let cases = cases.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let (x, w, want) = &cases[(t + i) % cases.len()];
                    let y = x
                        .cudnn_conv2d(
                            w,
                            Conv2dParams {
                                padding: [1, 1],
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    let e = rel_err(&y, want);
                    assert!(e < 1e-3, "thread {t} iteration {i}: {e}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker panicked");
    }
    let stats = cudnn_backend::plan::stats();
    println!("plan cache after the threads: {stats:?}");
}

// ---------------------------------------------------------------------------------------------
// ResNet-50 conv benchmark: ours vs Candle's conv2d on the same tensors.

/// (c, h, k, r, stride, pad) of ResNet-50's conv layers (the same as examples/bench.rs).
const RESNET50: [(usize, usize, usize, usize, usize, usize); 6] = [
    (64, 56, 64, 3, 1, 1),
    (256, 56, 64, 1, 1, 0),
    (128, 28, 128, 3, 1, 1),
    (256, 14, 256, 3, 1, 1),
    (512, 7, 512, 3, 1, 1),
    (3, 224, 64, 7, 2, 3),
];
const BATCH: usize = 64;
const RUNS: usize = 30;
const CALLS: usize = 10;

/// A uniform random tensor made on the GPU, optionally channels-last.
fn on_gpu(dev: &Device, dims: &[usize], dt: DType, channels_last: bool) -> Tensor {
    let t = Tensor::rand(-1f32, 1f32, dims, dev).unwrap().to_dtype(dt).unwrap();
    if channels_last && dims.len() == 4 {
        t.permute((0, 2, 3, 1))
            .unwrap()
            .contiguous()
            .unwrap()
            .permute((0, 3, 1, 2))
            .unwrap()
    } else {
        t
    }
}

fn time_ms(dev: &Device, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    let Device::Cuda(cd) = dev else { panic!("cuda device") };
    let stream = cd.cuda_stream();
    for _ in 0..5 {
        f()?;
    }
    dev.synchronize()?;
    let flags = Some(cudnn_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let start = stream.record_event(flags).map_err(candle_core::Error::wrap)?;
        for _ in 0..CALLS {
            f()?;
        }
        let end = stream.record_event(flags).map_err(candle_core::Error::wrap)?;
        end.synchronize().map_err(candle_core::Error::wrap)?;
        times.push(start.elapsed_ms(&end).map_err(candle_core::Error::wrap)? as f64 / CALLS as f64);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(times[times.len() / 2])
}

/// Prints ours vs Candle's conv2d (median ms per call, CUDA events) on ResNet-50 shapes and
/// writes `$CANDLE_BENCH_JSON` (default `candle_bench.json`) in the format of
/// `examples/bench.rs --json`, so `python3 bench/compare_torch.py --rust candle_bench.json`
/// times PyTorch on the same cases.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bench_resnet50_convs_vs_candle() {
    let dev = gpu();
    let mut cases = Vec::new();
    let theirs_label = if cfg!(feature = "candle-cudnn") {
        "Candle's conv2d through its cudnn feature"
    } else {
        "Candle's conv2d with its own kernels (built without its cudnn feature)"
    };
    println!("ours vs {theirs_label}");
    println!("{:<44} {:>10} {:>10} {:>8}", "case", "ours ms", "candle ms", "speedup");
    for (dt, layout) in [
        (DType::F32, "nchw"),
        (DType::F16, "nchw"),
        (DType::F16, "nhwc"),
        (DType::BF16, "nhwc"),
    ] {
        for &(c, h, k, rr, stride, pad) in &RESNET50 {
            let nhwc = layout == "nhwc";
            let x = on_gpu(&dev, &[BATCH, c, h, h], dt, nhwc);
            let w = on_gpu(&dev, &[k, c, rr, rr], dt, nhwc);
            let b = on_gpu(&dev, &[k], dt, false);
            let p = Conv2dParams {
                padding: [pad; 2],
                stride: [stride; 2],
                ..Default::default()
            };
            let ho = (h + 2 * pad - rr) / stride + 1;
            let flops = 2.0 * (BATCH * k * c * rr * rr * ho * ho) as f64;
            let dname = match dt {
                DType::F32 => "fp32",
                DType::F16 => "fp16",
                _ => "bf16",
            };
            for kind in ["conv_fwd", "conv_bias_relu"] {
                let name = format!("{kind}/{dname}_{layout}/c{c}_h{h}_k{k}_r{rr}_s{stride}");
                let ours = if kind == "conv_fwd" {
                    time_ms(&dev, || x.cudnn_conv2d(&w, p))
                } else {
                    time_ms(&dev, || x.cudnn_conv2d_bias_act(&w, &b, p, Activation::Relu))
                }
                .unwrap();
                let theirs = if kind == "conv_fwd" {
                    time_ms(&dev, || x.conv2d(&w, pad, stride, 1, 1))
                } else {
                    time_ms(&dev, || {
                        x.conv2d(&w, pad, stride, 1, 1)?
                            .broadcast_add(&b.reshape((1, k, 1, 1))?)?
                            .relu()
                    })
                };
                let theirs = theirs.ok();
                println!(
                    "{name:<44} {ours:>10.4} {:>10} {:>8}",
                    theirs.map_or("error".into(), |t| format!("{t:.4}")),
                    theirs.map_or("-".into(), |t| format!("{:.2}x", t / ours))
                );
                cases.push(format!(
                    "{{\"name\": \"{name}\", \"kind\": \"{kind}\", \"dtype\": \"{dname}\", \"layout\": \"{layout}\", \
                     \"shape\": {{\"n\": {BATCH}, \"c\": {c}, \"h\": {h}, \"w\": {h}, \"k\": {k}, \"r\": {rr}, \"s\": {rr}, \
                     \"stride\": {stride}, \"pad\": {pad}, \"ho\": {ho}, \"wo\": {ho}}}, \"median_ms\": {ours}, \
                     \"tflops\": {}, \"candle_median_ms\": {}}}",
                    flops / (ours * 1e-3) / 1e12,
                    theirs.map_or("null".into(), |t| t.to_string())
                ));
            }
        }
    }
    let path = std::env::var("CANDLE_BENCH_JSON").unwrap_or_else(|_| "candle_bench.json".into());
    let doc = format!(
        "{{\"device\": \"cuda:0\", \"runs\": {RUNS}, \"allow_tf32\": false, \"benchmark_mode\": false, \
         \"source\": \"candle_gpu bench_resnet50_convs_vs_candle\", \"candle\": \"{theirs_label}\", \"cases\": [\n{}\n]}}\n",
        cases.join(",\n")
    );
    std::fs::write(&path, doc).unwrap();
    println!("wrote {path}");
}

// ---------------------------------------------------------------------------
// Training ops: batch norm, norm and attention backward passes, FusedAdamW
// ---------------------------------------------------------------------------

/// The permutation from a rank-`r` tensor stored channels-last `(N, spatial..., C)` to its
/// logical `(N, C, spatial...)` view.
fn from_channels_last(r: usize) -> Vec<usize> {
    std::iter::once(0)
        .chain(std::iter::once(r - 1))
        .chain(1..r - 1)
        .collect()
}

/// Random batch-norm dims `(N, C, spatial...)` of rank 2 to 5, or `None` when a channel would
/// hold a single value (the caller draws again).
fn bn_dims(rng: &mut SplitMix64) -> Option<Vec<usize>> {
    let rank = r(rng, 2, 5);
    let mut dims = vec![r(rng, 1, 6), r(rng, 1, 70)];
    for _ in 2..rank {
        dims.push(r(rng, 1, 9));
    }
    (dims[0] * dims[2..].iter().product::<usize>() > 1).then_some(dims)
}

/// The gradient of a variable stored channels-last (when `channels_last`), seen through the
/// logical view the op was given.
fn logical_grad(g: &Tensor, channels_last: bool) -> Tensor {
    if channels_last {
        g.permute(from_channels_last(g.rank())).unwrap()
    } else {
        g.clone()
    }
}

/// A variable of `t`'s values in `dt` on `dev` and the view an op receives: for channels-last
/// the variable holds (N, spatial..., C) and the view is its NCHW permutation (gradients flow
/// through the view).
fn var_view(t: &Tensor, dt: DType, dev: &Device, channels_last: bool) -> (Var, Tensor) {
    let r = t.rank();
    let t = t.to_dtype(dt).unwrap().to_device(dev).unwrap();
    if !channels_last || r < 3 {
        let v = Var::from_tensor(&t).unwrap();
        let view = v.as_tensor().clone();
        return (v, view);
    }
    let to_last: Vec<usize> = std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect();
    let v = Var::from_tensor(&t.permute(to_last).unwrap().contiguous().unwrap()).unwrap();
    let view = v.as_tensor().permute(from_channels_last(r)).unwrap();
    (v, view)
}

/// `t` on the CPU in float64 after rounding to `dt` (what the GPU computed from).
fn rounded(t: &Tensor, dt: DType) -> Tensor {
    t.to_dtype(dt).unwrap().to_dtype(DType::F64).unwrap()
}

/// Relative L2 error after both sides are on the CPU in float64, checked against `tol`;
/// returns the error.
fn check_rel(got: &Tensor, want: &Tensor, tol: f64, what: &str) -> f64 {
    let e = rel_err(got, want);
    assert!(e <= tol, "{what}: relative L2 error {e:e} > {tol:e}");
    e
}

/// The batch-norm training op on the GPU (the engine's kernels) against the same op's float64
/// CPU reference, on random shapes of ranks 2 to 5, NCHW and channels-last, f32/f16/bf16 data
/// with f32 or data-dtype parameters, with and without affine parameters and ReLU: output,
/// dx, dweight, dbias and both running statistics.
#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_training_matches_f64_reference() {
    use cudnn_backend::candle::ops::batch_norm_train;
    use cudnn_backend::ops::BatchNormOptions;
    let dev = gpu();
    let mut rng = SplitMix64::new(50);
    for dt in DTYPES {
        let param_dtypes = if dt == DType::F32 {
            vec![dt]
        } else {
            vec![DType::F32, dt]
        };
        for pdt in param_dtypes {
            let mut worst = [0f64; 6];
            let mut done = 0;
            while done < 12 {
                let Some(dims) = bn_dims(&mut rng) else { continue };
                let c = dims[1];
                let cl = dims.len() >= 3 && done % 2 == 1;
                let affine = done % 3 != 2;
                let relu = done % 4 == 1;
                let unbiased = done % 5 != 3;
                let what = format!("{dt:?} params {pdt:?} {dims:?} cl {cl} affine {affine} relu {relu}");
                let x = rand_cpu(&mut rng, &dims);
                let (w, b) = (rand_cpu(&mut rng, &[c]), rand_cpu(&mut rng, &[c]));
                let rm = rand_cpu(&mut rng, &[c]);
                let rv = (rand_cpu(&mut rng, &[c]).abs().unwrap() + 0.5).unwrap();
                let probe = rand_cpu(&mut rng, &dims);
                let opts = BatchNormOptions {
                    epsilon: 1e-5,
                    momentum: 0.25,
                    unbiased_running_var: unbiased,
                    relu,
                };
                // One run per device: (y, [dx, dw, db], running mean, running var).
                let run = |dev: &Device, xdt: DType, pdt: DType| {
                    let (xv, xin) = var_view(&x, xdt, dev, cl);
                    let param =
                        |t: &Tensor| Var::from_tensor(&t.to_dtype(pdt).unwrap().to_device(dev).unwrap()).unwrap();
                    let (wv, bv, rmv, rvv) = (param(&w), param(&b), param(&rm), param(&rv));
                    let wb = affine.then_some((wv.as_tensor(), bv.as_tensor()));
                    let y = batch_norm_train(&xin, wb, Some((&rmv, &rvv)), &opts).unwrap();
                    assert_eq!(y.dtype(), xdt, "{what}: output dtype");
                    let p = probe.to_dtype(DType::F32).unwrap().to_device(dev).unwrap();
                    let loss = (y.to_dtype(DType::F32).unwrap() * p).unwrap().sum_all().unwrap();
                    let vars: Vec<&Var> = if affine { vec![&xv, &wv, &bv] } else { vec![&xv] };
                    let g = grads(&vars, &loss);
                    // The gradient of the stored variable, seen through the logical view.
                    let dx = logical_grad(&g[0], cl);
                    let mut gs = vec![dx];
                    gs.extend(g[1..].iter().cloned());
                    (y, gs, rmv.as_tensor().clone(), rvv.as_tensor().clone())
                };
                let (y, g, m, v) = run(&dev, dt, pdt);
                // The reference computes in float64 from the same rounded values.
                let (yr, gr, mr, vr) = {
                    let round = |t: &Tensor, d| rounded(t, d);
                    let (x0, w0, b0, m0, v0) = (
                        round(&x, dt),
                        round(&w, pdt),
                        round(&b, pdt),
                        round(&rm, pdt),
                        round(&rv, pdt),
                    );
                    let (xv, xin) = var_view(&x0, DType::F64, &Device::Cpu, cl);
                    let (wv, bv) = (Var::from_tensor(&w0).unwrap(), Var::from_tensor(&b0).unwrap());
                    let (rmv, rvv) = (Var::from_tensor(&m0).unwrap(), Var::from_tensor(&v0).unwrap());
                    let wb = affine.then_some((wv.as_tensor(), bv.as_tensor()));
                    let y = batch_norm_train(&xin, wb, Some((&rmv, &rvv)), &opts).unwrap();
                    let loss = (&y * &probe).unwrap().sum_all().unwrap();
                    let vars: Vec<&Var> = if affine { vec![&xv, &wv, &bv] } else { vec![&xv] };
                    let g = grads(&vars, &loss);
                    let dx = logical_grad(&g[0], cl);
                    let mut gs = vec![dx];
                    gs.extend(g[1..].iter().cloned());
                    (y, gs, rmv.as_tensor().clone(), rvv.as_tensor().clone())
                };
                let t = tol(dt, 1e-5);
                worst[0] = worst[0].max(check_rel(&y, &yr, t, &format!("{what}: output")));
                for (i, (a, e)) in g.iter().zip(&gr).enumerate() {
                    let e = check_rel(a, e, tol(dt, 1e-4), &format!("{what}: gradient {i}"));
                    worst[1 + i] = worst[1 + i].max(e);
                }
                let st = tol(pdt, 1e-5);
                worst[4] = worst[4].max(check_rel(&m, &mr, st, &format!("{what}: running mean")));
                worst[5] = worst[5].max(check_rel(&v, &vr, st, &format!("{what}: running var")));
                done += 1;
            }
            println!(
                "batch_norm_train {dt:?} params {pdt:?}: 12 shapes, max rel L2 y {:.1e} dx {:.1e} dw {:.1e} db {:.1e} mean {:.1e} var {:.1e}",
                worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]
            );
        }
    }
}

/// The batch-norm op with a residual added before the ReLU (`relu(bn(x) + residual)`, one op
/// forward and backward) on the GPU against the same op's float64 CPU reference: random shapes
/// of ranks 2 to 5, x and the residual stored NCHW or channels-last (alike or not),
/// f32/f16/bf16 data with f32 parameters, with and without affine parameters and ReLU: output,
/// dx, the residual's gradient, dweight and dbias.
#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_add_training_matches_f64_reference() {
    use cudnn_backend::candle::ops::batch_norm_add_train;
    use cudnn_backend::ops::BatchNormOptions;
    let dev = gpu();
    let mut rng = SplitMix64::new(53);
    for dt in DTYPES {
        let mut worst = [0f64; 5];
        let mut done = 0;
        while done < 8 {
            let Some(dims) = bn_dims(&mut rng) else { continue };
            let c = dims[1];
            let rank = dims.len();
            let (x_cl, r_cl) = (rank >= 3 && done % 2 == 1, rank >= 3 && done % 4 >= 2);
            let affine = done % 3 != 2;
            let relu = done % 4 != 3;
            let what = format!("{dt:?} {dims:?} x cl {x_cl} residual cl {r_cl} affine {affine} relu {relu}");
            let (x, res) = (rand_cpu(&mut rng, &dims), rand_cpu(&mut rng, &dims));
            let (w, b) = (rand_cpu(&mut rng, &[c]), rand_cpu(&mut rng, &[c]));
            let probe = rand_cpu(&mut rng, &dims);
            let opts = BatchNormOptions {
                epsilon: 1e-5,
                momentum: 0.25,
                unbiased_running_var: true,
                relu,
            };
            // One run per device: (y, [dx, dresidual, dw, db]); x and the residual rounded to
            // `xdt` first, so both sides start from the same values.
            let run = |dev: &Device, xdt: DType, pdt: DType| {
                let (x0, r0) = (rounded(&x, dt), rounded(&res, dt));
                let (xv, xin) = var_view(&x0, xdt, dev, x_cl);
                let (rv, rin) = var_view(&r0, xdt, dev, r_cl);
                let param = |t: &Tensor| Var::from_tensor(&t.to_dtype(pdt).unwrap().to_device(dev).unwrap()).unwrap();
                let (wv, bv) = (param(&w), param(&b));
                let (rmv, rvv) = (param(&w.zeros_like().unwrap()), param(&w.ones_like().unwrap()));
                let wb = affine.then_some((wv.as_tensor(), bv.as_tensor()));
                let y = batch_norm_add_train(&xin, &rin, wb, Some((&rmv, &rvv)), &opts).unwrap();
                assert_eq!((y.dtype(), y.dims()), (xdt, dims.as_slice()), "{what}: output");
                let p = probe.to_dtype(DType::F32).unwrap().to_device(dev).unwrap();
                let loss = (y.to_dtype(DType::F32).unwrap() * p).unwrap().sum_all().unwrap();
                let vars: Vec<&Var> = if affine {
                    vec![&xv, &rv, &wv, &bv]
                } else {
                    vec![&xv, &rv]
                };
                let mut g = grads(&vars, &loss);
                g[0] = logical_grad(&g[0], x_cl);
                g[1] = logical_grad(&g[1], r_cl);
                (y, g)
            };
            let (y, g) = run(&dev, dt, DType::F32);
            let (yr, gr) = run(&Device::Cpu, DType::F64, DType::F64);
            worst[0] = worst[0].max(check_rel(&y, &yr, tol(dt, 1e-5), &format!("{what}: output")));
            for (i, (a, e)) in g.iter().zip(&gr).enumerate() {
                let e = check_rel(a, e, tol(dt, 1e-4), &format!("{what}: gradient {i}"));
                worst[1 + i] = worst[1 + i].max(e);
            }
            done += 1;
        }
        println!(
            "batch_norm_add_train {dt:?}: 8 shapes, max rel L2 y {:.1e} dx {:.1e} dresidual {:.1e} dw {:.1e} db {:.1e}",
            worst[0], worst[1], worst[2], worst[3], worst[4]
        );
    }
}

/// `nn::BatchNorm` on the GPU: the fused training path and the composed one (Candle ops) give
/// the same outputs, gradients and running statistics, NCHW and channels-last, f32 and bf16
/// inputs with f32 parameters (as `train_candle` runs it).
#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_layer_fused_matches_composed_on_the_gpu() {
    let dev = gpu();
    let mut rng = SplitMix64::new(51);
    for (dt, cl) in [
        (DType::F32, false),
        (DType::F32, true),
        (DType::BF16, false),
        (DType::BF16, true),
    ] {
        let x = rand_cpu(&mut rng, &[8, 24, 9, 7]);
        let probe = rand_cpu(&mut rng, &[8, 24, 9, 7])
            .to_dtype(DType::F32)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let mut results = Vec::new();
        for fused in [true, false] {
            let map = VarMap::new();
            let bn = cnn::batch_norm(24, 1e-5, VarBuilder::from_varmap(&map, DType::F32, &dev).pp("bn"))
                .unwrap()
                .with_fused_training(fused);
            let (w, b) = bn.weight_and_bias().unwrap();
            let (w, b) = (Var::from_tensor(w).unwrap(), Var::from_tensor(b).unwrap());
            let (xv, xin) = var_view(&x, dt, &dev, cl);
            let mut out = None;
            for _ in 0..3 {
                out = Some(bn.forward_relu_t(&xin, true).unwrap());
            }
            let y = out.unwrap();
            let g = grads(
                &[&xv, &w, &b],
                &(y.to_dtype(DType::F32).unwrap() * &probe).unwrap().sum_all().unwrap(),
            );
            results.push((y, g, bn.running_mean().clone(), bn.running_var().clone()));
        }
        let what = format!("BatchNorm {dt:?} channels_last {cl}");
        let t = if dt == DType::F32 { 1e-5 } else { 2e-2 };
        close(&results[0].0, &results[1].0, t, &format!("{what} output"));
        for i in 0..3 {
            close(
                &results[0].1[i],
                &results[1].1[i],
                t.max(1e-4),
                &format!("{what} gradient {i}"),
            );
        }
        close(&results[0].2, &results[1].2, 1e-5, &format!("{what} running mean"));
        close(&results[0].3, &results[1].3, 1e-5, &format!("{what} running var"));
    }
}

/// Layer and RMS norm training on the GPU (the engine's forward keeping the row statistics and
/// its backward from them) against the op's float64 CPU reference on random shapes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_training_matches_f64_reference() {
    use cudnn_backend::candle::ops::norm;
    use cudnn_backend::graph::NormMode;
    let dev = gpu();
    let mut rng = SplitMix64::new(52);
    for dt in DTYPES {
        for mode in [NormMode::LayerNorm, NormMode::RmsNorm] {
            let mut worst = [0f64; 4];
            for case in 0..12 {
                let (rows, d) = (r(&mut rng, 1, 300), [3, 7, 64, 96, 130, 512, 1024][case % 7]);
                let with_bias = case % 2 == 0;
                let x = rand_cpu(&mut rng, &[rows, d]);
                let (w, b) = (rand_cpu(&mut rng, &[d]), rand_cpu(&mut rng, &[d]));
                let probe = rand_cpu(&mut rng, &[rows, d]);
                let run = |dev: &Device, dt: DType| {
                    let v = |t: &Tensor| Var::from_tensor(&t.to_dtype(dt).unwrap().to_device(dev).unwrap()).unwrap();
                    let (xv, wv, bv) = (v(&x), v(&w), v(&b));
                    let bias = with_bias.then(|| bv.as_tensor());
                    let y = norm(xv.as_tensor(), wv.as_tensor(), bias, mode, 1e-5).unwrap();
                    let p = probe.to_dtype(DType::F32).unwrap().to_device(dev).unwrap();
                    let loss = (y.to_dtype(DType::F32).unwrap() * p).unwrap().sum_all().unwrap();
                    let vars: Vec<&Var> = if with_bias { vec![&xv, &wv, &bv] } else { vec![&xv, &wv] };
                    (y, grads(&vars, &loss))
                };
                let (y, g) = run(&dev, dt);
                let round = |t: &Tensor| rounded(t, dt);
                let (yr, gr) = {
                    let v = |t: &Tensor| Var::from_tensor(&round(t)).unwrap();
                    let (xv, wv, bv) = (v(&x), v(&w), v(&b));
                    let bias = with_bias.then(|| bv.as_tensor());
                    let y = norm(xv.as_tensor(), wv.as_tensor(), bias, mode, 1e-5).unwrap();
                    let loss = (&y * &probe).unwrap().sum_all().unwrap();
                    let vars: Vec<&Var> = if with_bias { vec![&xv, &wv, &bv] } else { vec![&xv, &wv] };
                    (y, grads(&vars, &loss))
                };
                let what = format!("{mode:?} {dt:?} [{rows}, {d}] bias {with_bias}");
                worst[0] = worst[0].max(check_rel(&y, &yr, tol(dt, 1e-5), &format!("{what}: output")));
                for (i, (a, e)) in g.iter().zip(&gr).enumerate() {
                    let e = check_rel(a, e, tol(dt, 1e-4), &format!("{what}: gradient {i}"));
                    worst[1 + i] = worst[1 + i].max(e);
                }
            }
            println!(
                "{mode:?} training {dt:?}: 12 shapes, max rel L2 y {:.1e} dx {:.1e} dw {:.1e} db {:.1e}",
                worst[0], worst[1], worst[2], worst[3]
            );
        }
    }
}

/// The attention op's backward passes on the GPU against the float64 reference, unmasked and
/// causal, several shapes: f16/bf16 through cuDNN's fused attention backward graph (one cuDNN
/// execution for dq, dk and dv), f32 through the math path (cuDNN matmuls and the softmax
/// kernels); each in the (B, H, L, D) layout (`sdpa`) and the (B, L, H·D) layout of linear
/// layers (`sdpa_heads`).
#[test]
#[ignore = "needs a CUDA GPU"]
fn sdpa_fused_backward_matches_f64_reference() {
    use cudnn_backend::candle::ops::{sdpa, sdpa_heads};
    let dev = gpu();
    let mut rng = SplitMix64::new(53);
    let shapes = [
        (2, 3, 40, 56, 64, 32),
        (1, 4, 128, 128, 64, 64),
        (3, 2, 17, 33, 128, 128),
        (2, 2, 64, 64, 32, 32),
    ];
    // (B, H, L, X) → (B, L, H·X) and back.
    let merge = |t: &Tensor| {
        let (b, h, l, x) = t.dims4().unwrap();
        t.transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((b, l, h * x))
            .unwrap()
    };
    let split = |t: &Tensor, h: usize| {
        let (b, l, hx) = t.dims3().unwrap();
        t.reshape((b, l, h, hx / h))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    for dt in [DType::F32, DType::F16, DType::BF16] {
        // f32: cuDNN's f32 matmuls run on TF32 tensor cores (docs/numerics.md).
        let (out_tol, grad_tol) = if dt == DType::F32 { (2e-3, 2e-3) } else { (2e-2, 3e-2) };
        for heads_layout in [false, true] {
            for causal in [false, true] {
                for &(b, h, lq, lk, d, dv) in &shapes {
                    let layout = if heads_layout { "(B, L, H·D)" } else { "(B, H, L, D)" };
                    let what = format!("sdpa {dt:?} {layout} causal {causal} q [{b}, {h}, {lq}, {d}] k {lk} v {dv}");
                    let (q, k, v) = (
                        rand_cpu(&mut rng, &[b, h, lq, d]),
                        rand_cpu(&mut rng, &[b, h, lk, d]),
                        rand_cpu(&mut rng, &[b, h, lk, dv]),
                    );
                    let probe = rand_cpu(&mut rng, &[b, h, lq, dv]);
                    let scale = 1.0 / (d as f64).sqrt();
                    let gv = |t: &Tensor| {
                        let t = if heads_layout { merge(t) } else { t.clone() };
                        Var::from_tensor(&t.to_dtype(dt).unwrap().to_device(&dev).unwrap()).unwrap()
                    };
                    let (qv, kv, vv) = (gv(&q), gv(&k), gv(&v));
                    let y = if heads_layout {
                        sdpa_heads(qv.as_tensor(), kv.as_tensor(), vv.as_tensor(), h, scale, causal).unwrap()
                    } else {
                        sdpa(qv.as_tensor(), kv.as_tensor(), vv.as_tensor(), scale, causal).unwrap()
                    };
                    let pr = if heads_layout { merge(&probe) } else { probe.clone() };
                    let p = pr.to_dtype(DType::F32).unwrap().to_device(&dev).unwrap();
                    let loss = (y.to_dtype(DType::F32).unwrap() * p).unwrap().sum_all().unwrap();
                    let before = cudnn_backend::runtime::thread_launch_counts();
                    let mut g = grads(&[&qv, &kv, &vv], &loss);
                    let cudnn_runs = cudnn_backend::runtime::thread_launch_counts()
                        .since(&before)
                        .cudnn_executions;
                    assert!(cudnn_runs >= 1, "{what}: the backward pass ran no cuDNN graph");
                    let mut y = y;
                    if heads_layout {
                        y = split(&y, h);
                        g = g.iter().map(|t| split(t, h)).collect();
                    }
                    let cv = |t: &Tensor| Var::from_tensor(&rounded(t, dt)).unwrap();
                    let (qc, kc, vc) = (cv(&q), cv(&k), cv(&v));
                    let yc = sdpa(qc.as_tensor(), kc.as_tensor(), vc.as_tensor(), scale, causal).unwrap();
                    let gc = grads(&[&qc, &kc, &vc], &(&yc * &probe).unwrap().sum_all().unwrap());
                    let mut report = vec![format!("output {:.1e}", check_rel(&y, &yc, out_tol, &what))];
                    for (i, (a, e)) in g.iter().zip(&gc).enumerate() {
                        let e = check_rel(a, e, grad_tol, &format!("{what}: gradient {i}"));
                        report.push(format!("d{} {e:.1e}", ["q", "k", "v"][i]));
                    }
                    println!("{what}: rel L2 {}", report.join(", "));
                }
            }
        }
    }
}

/// `FusedAdamW` on the GPU: f32 variables (more than one launch's 32) against candle-nn's
/// `AdamW` on the same GPU over several steps, one kernel launch per 32 variables per step;
/// f16/bf16 variables against the float64 update on the CPU (bf16 through the kernel).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_adamw_matches_candle_nn_adamw_on_the_gpu() {
    use cudnn_backend::candle::optim::{FusedAdamW, ParamsAdamW};
    let dev = gpu();
    let mut rng = SplitMix64::new(54);
    let shapes: Vec<Vec<usize>> = (0..40)
        .map(|i| match i % 4 {
            0 => vec![r(&mut rng, 1, 64), r(&mut rng, 1, 64)],
            1 => vec![r(&mut rng, 1, 5000)],
            2 => vec![r(&mut rng, 1, 8), r(&mut rng, 1, 8), 3, 3],
            _ => vec![r(&mut rng, 4000, 9000)],
        })
        .collect();
    let init: Vec<Tensor> = shapes.iter().map(|d| rand_cpu(&mut rng, d)).collect();
    let targets: Vec<Tensor> = shapes.iter().map(|d| rand_cpu(&mut rng, d)).collect();
    let params = ParamsAdamW {
        lr: 0.01,
        weight_decay: 0.05,
        ..Default::default()
    };
    let vars_on = |dev: &Device, dt: DType| -> Vec<Var> {
        init.iter()
            .map(|t| Var::from_tensor(&t.to_dtype(dt).unwrap().to_device(dev).unwrap()).unwrap())
            .collect()
    };
    let loss = |vars: &[Var]| -> Tensor {
        let mut total: Option<Tensor> = None;
        for (v, t) in vars.iter().zip(&targets) {
            let t = t.to_dtype(v.dtype()).unwrap().to_device(v.device()).unwrap();
            let d = (v.as_tensor() - t).unwrap().to_dtype(DType::F32).unwrap();
            let term = d.sqr().unwrap().sum_all().unwrap();
            total = Some(match total {
                Some(s) => (s + term).unwrap(),
                None => term,
            });
        }
        total.unwrap()
    };
    let (ours_vars, theirs_vars) = (vars_on(&dev, DType::F32), vars_on(&dev, DType::F32));
    let mut ours = FusedAdamW::new(ours_vars.clone(), params.clone()).unwrap();
    let mut theirs = candle_nn::AdamW::new(theirs_vars.clone(), params.clone()).unwrap();
    for step in 0..5 {
        let g = loss(&ours_vars).backward().unwrap();
        // This thread's launches only: the other tests run beside this one.
        let before = cudnn_backend::runtime::thread_launch_counts();
        ours.step(&g).unwrap();
        let launches = cudnn_backend::runtime::thread_launch_counts().since(&before).total();
        if step > 0 {
            // The first step also allocates the moments (Candle's zero fills, not counted).
            assert_eq!(launches, 2, "40 f32 variables: two launches per step");
        }
        theirs.backward_step(&loss(&theirs_vars)).unwrap();
    }
    let mut worst = 0f64;
    for (i, (a, b)) in ours_vars.iter().zip(&theirs_vars).enumerate() {
        worst = worst.max(check_rel(
            a.as_tensor(),
            b.as_tensor(),
            1e-5,
            &format!("f32 variable {i}"),
        ));
    }
    println!("FusedAdamW f32 vs candle-nn AdamW after 5 steps: max rel L2 {worst:.1e}");
    for dt in [DType::F16, DType::BF16] {
        let gpu_vars = vars_on(&dev, dt);
        let cpu_vars: Vec<Var> = init
            .iter()
            .map(|t| Var::from_tensor(&rounded(t, dt)).unwrap())
            .collect();
        let mut a = FusedAdamW::new(gpu_vars.clone(), params.clone()).unwrap();
        let mut b = FusedAdamW::new(cpu_vars.clone(), params.clone()).unwrap();
        for step in 0..5 {
            let before = cudnn_backend::runtime::thread_launch_counts();
            a.backward_step(&loss(&gpu_vars)).unwrap();
            let launches = cudnn_backend::runtime::thread_launch_counts().since(&before).total();
            // bf16 takes the fused kernel; f16 the update in f32 Candle ops (its moments would
            // underflow in the kernel).
            if step > 0 && dt == DType::BF16 {
                assert_eq!(
                    launches, 2,
                    "40 {dt:?} variables: the fused kernel, two launches per step"
                );
            }
            b.backward_step(&loss(&cpu_vars)).unwrap();
        }
        let mut worst = 0f64;
        for (i, (x, y)) in gpu_vars.iter().zip(&cpu_vars).enumerate() {
            worst = worst.max(check_rel(
                x.as_tensor(),
                y.as_tensor(),
                tol(dt, 0.0),
                &format!("{dt:?} variable {i}"),
            ));
        }
        println!("FusedAdamW {dt:?} vs float64 after 5 steps: max rel L2 {worst:.1e}");
    }
}

/// Candle's own CUDA path, without this crate's ops, stage by stage against Candle's CPU
/// device on the same values: random initialisation, cuBLAS matmul, a candle-nn linear
/// layer's loss and gradients (log-softmax cross entropy, embedding lookup), and an AdamW
/// step. A training run that diverges on the GPU while this test fails points at the Candle
/// build or the CUDA libraries it loaded rather than at our ops; each stage prints its error.
#[test]
#[ignore = "needs a CUDA GPU"]
fn candles_own_training_pieces_match_its_cpu_device() {
    let dev = gpu();
    let cpu = Device::Cpu;
    let finite = |t: &Tensor| vals(t).iter().all(|v| v.is_finite());
    let close = |stage: &str, g: &Tensor, c: &Tensor| {
        let (g, c) = (vals(g), vals(c));
        let num: f64 = g.iter().zip(&c).map(|(a, b)| (a - b).powi(2)).sum();
        let den: f64 = c.iter().map(|b| b * b).sum();
        let rel = (num / den.max(1e-300)).sqrt();
        println!(
            "candle {stage}: rel L2 {rel:.2e}, finite {}",
            g.iter().all(|v| v.is_finite())
        );
        assert!(rel < 1e-4, "candle {stage}: GPU and CPU differ, rel L2 {rel:e}");
    };
    // Random initialisation (cuRAND) is finite with a plausible spread.
    let init = Tensor::randn(0f32, 1f32, (256, 256), &dev).unwrap();
    let std = vals(&init).iter().map(|v| v * v).sum::<f64>() / 65536.0;
    println!("candle randn: finite {}, mean square {std:.3}", finite(&init));
    assert!(finite(&init) && (0.8..1.2).contains(&std), "randn: mean square {std}");
    let mut rng = SplitMix64::new(11);
    let f32_on = |t: &Tensor, d: &Device| t.to_dtype(DType::F32).unwrap().to_device(d).unwrap();
    let (a, b) = (rand_cpu(&mut rng, &[64, 96]), rand_cpu(&mut rng, &[96, 48]));
    close(
        "matmul",
        &f32_on(&a, &dev).matmul(&f32_on(&b, &dev)).unwrap(),
        &f32_on(&a, &cpu).matmul(&f32_on(&b, &cpu)).unwrap(),
    );
    // An embedding, a linear layer and cross entropy, forward and backward, on both devices.
    let (table, w, bias) = (
        rand_cpu(&mut rng, &[10, 32]),
        rand_cpu(&mut rng, &[5, 32]),
        rand_cpu(&mut rng, &[5]),
    );
    let ids: Vec<u32> = (0..64).map(|_| rng.below(10) as u32).collect();
    let labels: Vec<u32> = (0..64).map(|_| rng.below(5) as u32).collect();
    let run = |d: &Device| {
        let vars: Vec<Var> = [&table, &w, &bias]
            .iter()
            .map(|t| Var::from_tensor(&f32_on(t, d)).unwrap())
            .collect();
        let x = candle_nn::Embedding::new(vars[0].as_tensor().clone(), 32)
            .forward(&Tensor::new(ids.as_slice(), d).unwrap())
            .unwrap();
        let logits = candle_nn::Linear::new(vars[1].as_tensor().clone(), Some(vars[2].as_tensor().clone()))
            .forward(&x)
            .unwrap();
        let log_p = candle_nn::ops::log_softmax(&logits, 1).unwrap();
        let loss = candle_nn::loss::nll(&log_p, &Tensor::new(labels.as_slice(), d).unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        let g: Vec<Tensor> = vars.iter().map(|v| grads.get(v.as_tensor()).unwrap().clone()).collect();
        let mut opt = candle_nn::AdamW::new(vars.clone(), candle_nn::ParamsAdamW::default()).unwrap();
        opt.step(&grads).unwrap();
        ([x, logits, log_p, loss], g, vars)
    };
    let (gf, gg, gv) = run(&dev);
    let (cf, cg, cv) = run(&cpu);
    let stages = ["embedding lookup", "linear", "log-softmax", "cross-entropy loss"];
    let failed: Vec<&str> = stages
        .iter()
        .zip(gf.iter().zip(&cf))
        .filter(|(stage, (g, c))| {
            let (g, c) = (vals(g), vals(c));
            let bad = g.len() != c.len()
                || g.iter()
                    .zip(&c)
                    .any(|(a, b)| !a.is_finite() || (a - b).abs() > 1e-3 * (1.0 + b.abs()));
            let shown: Vec<String> = g
                .iter()
                .zip(&c)
                .take(4)
                .map(|(a, b)| format!("{a:.4}/{b:.4}"))
                .collect();
            println!(
                "candle {stage}: GPU/CPU {}{}",
                shown.join(" "),
                if bad { "  <- differs" } else { "" }
            );
            bad
        })
        .map(|(stage, _)| *stage)
        .collect();
    assert!(
        failed.is_empty(),
        "candle's forward differs from its CPU device at: {failed:?}"
    );
    for (name, (g, c)) in ["embedding grad", "weight grad", "bias grad"]
        .iter()
        .zip(gg.iter().zip(&cg))
    {
        close(name, g, c);
    }
    for (name, (g, c)) in ["embedding after AdamW", "weight after AdamW", "bias after AdamW"]
        .iter()
        .zip(gv.iter().zip(&cv))
    {
        close(name, g.as_tensor(), c.as_tensor());
    }
}

/// Candle's collectives in a data-parallel process: one thread, Candle device and NCCL rank
/// per GPU, on Candle's per-thread stream (which a non-blocking communicator must not hand to
/// NCCL as it is). Each rank's input comes out of a chain of Candle ops still running when
/// the collective is called, and Candle ops read the result at once: a collective unordered
/// with Candle's stream reads or leaves stale values. Sum and mean all-reduces and a
/// broadcast against the host's sums, several rounds. Needs two CUDA GPUs.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_candle_collectives_are_ordered_with_candles_stream() {
    use cudnn_backend::candle::collective::{all_reduce, broadcast};
    use cudnn_backend::collective::{Communicator, ReduceOp, UniqueId};

    let n = cudnn_backend::runtime::device_count().expect("needs CUDA GPUs");
    assert!(n >= 2, "this test needs two CUDA GPUs; the machine has {n}");
    const LEN: usize = 1 << 22;
    const ROUNDS: usize = 4;
    // Rank r's input of round k, on the host.
    let input = |rank: usize, round: usize| -> Vec<f32> {
        let mut rng = SplitMix64::new(900 + 10 * rank as u64 + round as u64);
        (0..LEN).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect()
    };
    let id = UniqueId::new().unwrap();
    /// Per round: the sum, the mean and the broadcast, on the host.
    type Rounds = Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>;
    let results: Vec<Rounds> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (id, input) = (&id, &input);
                s.spawn(move || -> Result<Rounds> {
                    let dev = Device::new_cuda(rank)?;
                    let ours = cudnn_backend::Device::new(rank).unwrap();
                    let comm = Communicator::init_rank(&ours, rank, 2, id, std::time::Duration::from_secs(60)).unwrap();
                    let mut out = Vec::new();
                    for round in 0..ROUNDS {
                        let host = Tensor::from_vec(input(rank, round), LEN, &dev)?;
                        // Still computing when the collectives are called: x = host exactly.
                        let mut x = host.clone();
                        for _ in 0..8 {
                            x = ((x * 3.0)? / 3.0)?;
                        }
                        let x = (x.sqr()?.sqrt()? * host.sign()?)?;
                        let sum = (all_reduce(&x, &comm, ReduceOp::Sum)? * 1.0)?;
                        let mean = (all_reduce(&x, &comm, ReduceOp::Mean)? + 0.0)?;
                        let root = (broadcast(&x, &comm, 1)? * 1.0)?;
                        out.push((sum.to_vec1()?, mean.to_vec1()?, root.to_vec1()?));
                    }
                    Ok(out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    for round in 0..ROUNDS {
        let (a, b) = (input(0, round), input(1, round));
        let rel = |got: &[f32], want: &dyn Fn(usize) -> f64| -> f64 {
            let num: f64 = got.iter().enumerate().map(|(i, &g)| (g as f64 - want(i)).powi(2)).sum();
            let den: f64 = (0..got.len()).map(|i| want(i).powi(2)).sum();
            (num / den).sqrt()
        };
        for (rank, r) in results.iter().enumerate() {
            let (sum, mean, root) = &r[round];
            let e_sum = rel(sum, &|i| a[i] as f64 + b[i] as f64);
            let e_mean = rel(mean, &|i| (a[i] as f64 + b[i] as f64) / 2.0);
            let e_root = rel(root, &|i| b[i] as f64);
            assert!(
                e_sum < 1e-6 && e_mean < 1e-6 && e_root < 1e-6,
                "round {round}, rank {rank}: relative L2 sum {e_sum:.2e}, mean {e_mean:.2e}, broadcast {e_root:.2e}"
            );
        }
    }
    println!("two GPUs, Candle collectives on the per-thread stream: {ROUNDS} rounds of sum, mean, broadcast match");
}
