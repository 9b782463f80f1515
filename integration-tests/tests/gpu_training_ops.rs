//! The training ops — batch norm (training forward, inference, backward; residual + ReLU
//! fusions), the multi-tensor Adam/AdamW step, the training layer/RMS norms and the
//! cross-entropy — against float64 references on random shapes, NCHW and NHWC, f32/f16/bf16,
//! outputs poisoned. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{
    self, AdamOptions, AdamParam, BatchNormBackward, BatchNormForward, BatchNormInference, BatchNormOptions,
    CrossEntropyBackward, CrossEntropyForward, CrossEntropyMean, RunningStats, TensorMut, TensorRef,
};
use cudnn_backend::types::row_major_strides;
use cudnn_backend::Device;
use cudnn_backend_reference::{self as cpu, rel_l2_error, SplitMix64};
use integration_tests::{bound, download, poisoned, round_to, strides, upload, DevTensor, Layout, Shard};

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

fn range(rng: &mut SplitMix64, lo: i64, hi: i64) -> i64 {
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as i64
}

/// Uniform values in [lo, hi) (`next_f64` is uniform in [-1, 1)).
fn values(rng: &mut SplitMix64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| lo + (hi - lo) * (rng.next_f64() + 1.0) / 2.0).collect()
}

fn vec1(s: &Arc<CudaStream>, v: &[f64], dtype: DataType) -> DevTensor {
    let n = v.len() as i64;
    upload(s, v, &[n], &[1], dtype)
}

fn poisoned1(s: &Arc<CudaStream>, n: i64, dtype: DataType) -> DevTensor {
    poisoned(s, &[n], &[1], dtype)
}

/// Records the worst relative error of `what` and a failure when over `limit`.
struct Check {
    worst: f64,
    failures: Vec<String>,
}

impl Check {
    fn new() -> Self {
        Self {
            worst: 0.0,
            failures: Vec::new(),
        }
    }

    fn cmp(&mut self, label: &str, what: &str, out: &[f64], reference: &[f64], limit: f64) {
        let e = rel_l2_error(out, reference);
        self.worst = self.worst.max(e);
        if e.is_nan() || e > limit {
            let first = |v: &[f64]| {
                v.iter()
                    .take(4)
                    .map(|x| format!("{x:.4}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let bad = out.iter().position(|v| !v.is_finite());
            self.failures.push(format!(
                "{label}: {what} rel-L2 {e:.3e} > {limit:.0e} (got [{}], want [{}], first non-finite at {bad:?} of {})",
                first(out),
                first(reference),
                out.len()
            ));
        }
    }

    fn finish(self, name: &str, runs: usize) {
        println!("{name}: {runs} runs, worst rel-L2 {:.3e}", self.worst);
        assert!(self.failures.is_empty(), "{}", self.failures.join("\n"));
    }
}

/// Mean of the float64 reference's values shifted so the batch statistics are not ~0.
const SHIFT: f64 = 1.5;

#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_forward_and_backward_match_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(2027);
    let shard = Shard::from_env();
    let mut check = Check::new();
    let mut runs = 0;
    let dtypes = [DataType::F32, DataType::F16, DataType::BF16];
    for case in 0..36 {
        let dtype = dtypes[case % 3];
        if !shard.has(case) {
            continue;
        }
        let layout = if case % 2 == 0 { Layout::Nchw } else { Layout::Nhwc };
        let rank4 = case % 6 != 5;
        // Every fourth case is channels-last with a channel count the 16-byte vectors divide
        // (the packed channels-last kernels); the others any count.
        let (n, c) = if case % 4 == 1 {
            (range(&mut rng, 1, 9), 8 * range(&mut rng, 1, 9))
        } else {
            (range(&mut rng, 1, 9), range(&mut rng, 1, 70))
        };
        // Every fourth case, channels-first, has planes the 16-byte vectors divide (a width of
        // 8, 16 or 24: the packed planes kernels).
        let w = if case % 4 == 0 {
            8 * range(&mut rng, 1, 3)
        } else {
            range(&mut rng, 2, 19)
        };
        let dims: Vec<i64> = if rank4 {
            vec![n, c, range(&mut rng, 1, 17), w]
        } else {
            vec![n.max(2), c]
        };
        let st = strides(&dims, layout);
        let count: i64 = dims.iter().product();
        let pdt = if case % 4 < 2 { DataType::F32 } else { dtype };
        let relu = case % 3 != 1;
        let residual = case % 4 == 3 || case % 8 == 4;
        let unbiased = case % 5 != 0;
        let label = format!("{dtype:?} {dims:?} {layout:?} params {pdt:?} relu {relu} residual {residual}");
        let xv: Vec<f64> = values(&mut rng, count as usize, -1.0, 1.0)
            .iter()
            .map(|v| v + SHIFT)
            .collect();
        let x = upload(&s, &xv, &dims, &st, dtype);
        let z = residual.then(|| upload(&s, &values(&mut rng, count as usize, -1.0, 1.0), &dims, &st, dtype));
        let scale = vec1(&s, &values(&mut rng, c as usize, 0.5, 1.5), pdt);
        let bias = vec1(&s, &values(&mut rng, c as usize, -0.5, 0.5), pdt);
        let rmean = vec1(&s, &values(&mut rng, c as usize, -1.0, 1.0), pdt);
        let rvar = vec1(&s, &values(&mut rng, c as usize, 0.5, 2.0), pdt);
        let (rmean_out, rvar_out) = (poisoned1(&s, c, pdt), poisoned1(&s, c, pdt));
        let y = poisoned(&s, &dims, &st, dtype);
        let (mean, inv_std) = (poisoned1(&s, c, DataType::F32), poisoned1(&s, c, DataType::F32));
        let o = BatchNormOptions {
            epsilon: 1e-5,
            momentum: 0.1,
            unbiased_running_var: unbiased,
            relu,
        };
        let fwd = BatchNormForward {
            x: &x.t,
            residual: z.as_ref().map(|z| &z.t),
            y: &y.m,
            scale: Some(&scale.t),
            bias: Some(&bias.t),
            running: Some(RunningStats {
                mean: &rmean.t,
                var: &rvar.t,
                mean_out: &rmean_out.m,
                var_out: &rvar_out.m,
            }),
            saved_mean: &mean.m,
            saved_inv_std: &inv_std.m,
        };
        ops::batch_norm_train_forward(&s, &fwd, &o).unwrap_or_else(|e| panic!("{label}: {e}"));
        let udims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let (ry, rm, ri, ru) = cpu::batch_norm_train(
            &x.values,
            &udims,
            &scale.values,
            &bias.values,
            z.as_ref().map(|z| z.values.as_slice()),
            o.epsilon,
            relu,
        );
        let tol = bound(dtype);
        check.cmp(&label, "y", &download(&s, &y), &ry, tol);
        check.cmp(&label, "mean", &download(&s, &mean), &rm, 1e-5);
        check.cmp(
            &label,
            "inv_std",
            &download(&s, &inv_std),
            &ri,
            if dtype == DataType::F32 { 1e-5 } else { 1e-4 },
        );
        let var_used: Vec<f64> = if unbiased {
            ru
        } else {
            ri.iter().map(|i| 1.0 / (i * i) - o.epsilon).collect()
        };
        let ref_rm: Vec<f64> = rmean.values.iter().zip(&rm).map(|(r, m)| 0.9 * r + 0.1 * m).collect();
        let ref_rv: Vec<f64> = rvar
            .values
            .iter()
            .zip(&var_used)
            .map(|(r, v)| 0.9 * r + 0.1 * v)
            .collect();
        let ptol = bound(pdt).max(1e-5);
        check.cmp(&label, "running mean", &download(&s, &rmean_out), &ref_rm, ptol);
        check.cmp(&label, "running var", &download(&s, &rvar_out), &ref_rv, ptol);

        // Backward from the saved statistics (y as uploaded, so the ReLU mask matches).
        let yin = upload(&s, &ry, &dims, &st, dtype);
        let dy = upload(&s, &values(&mut rng, count as usize, -1.0, 1.0), &dims, &st, dtype);
        let (dx, dz) = (poisoned(&s, &dims, &st, dtype), poisoned(&s, &dims, &st, dtype));
        let (dscale, dbias) = (poisoned1(&s, c, pdt), poisoned1(&s, c, pdt));
        let saved_mean = vec1(&s, &rm, DataType::F32);
        let saved_inv = vec1(&s, &ri, DataType::F32);
        let bwd = BatchNormBackward {
            x: &x.t,
            y: relu.then_some(&yin.t),
            dy: &dy.t,
            dx: Some(&dx.m),
            d_residual: residual.then_some(&dz.m),
            scale: Some(&scale.t),
            saved_mean: &saved_mean.t,
            saved_inv_std: &saved_inv.t,
            d_scale: Some(&dscale.m),
            d_bias: Some(&dbias.m),
        };
        ops::batch_norm_backward(&s, &bwd).unwrap_or_else(|e| panic!("{label} backward: {e}"));
        let (rdx, rdz, rds, rdb) = cpu::batch_norm_backward(
            &x.values,
            relu.then_some(yin.values.as_slice()),
            &dy.values,
            &udims,
            &scale.values,
            &saved_mean.values,
            &saved_inv.values,
        );
        check.cmp(&label, "dx", &download(&s, &dx), &rdx, tol);
        if residual {
            check.cmp(&label, "d_residual", &download(&s, &dz), &rdz, tol);
        }
        check.cmp(&label, "d_scale", &download(&s, &dscale), &rds, tol.max(bound(pdt)));
        check.cmp(&label, "d_bias", &download(&s, &dbias), &rdb, tol.max(bound(pdt)));

        // Inference with the running statistics.
        let yi = poisoned(&s, &dims, &st, dtype);
        let inf = BatchNormInference {
            x: &x.t,
            residual: z.as_ref().map(|z| &z.t),
            y: &yi.m,
            scale: Some(&scale.t),
            bias: Some(&bias.t),
            mean: &rmean.t,
            var: &rvar.t,
        };
        ops::batch_norm_inference(&s, &inf, o.epsilon, relu).unwrap_or_else(|e| panic!("{label} inference: {e}"));
        let ryi: Vec<f64> = (0..count as usize)
            .map(|i| {
                let ch = (i / (count / (dims[0] * c)) as usize) % c as usize;
                let v = (x.values[i] - rmean.values[ch]) / (rvar.values[ch] + o.epsilon).sqrt() * scale.values[ch]
                    + bias.values[ch]
                    + z.as_ref().map_or(0.0, |z| z.values[i]);
                if relu && v < 0.0 {
                    0.0
                } else {
                    v
                }
            })
            .collect();
        check.cmp(&label, "inference y", &download(&s, &yi), &ryi, tol);
        runs += 1;
    }
    check.finish("batch_norm", runs);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_large_batch_statistics_are_accurate_and_deterministic() {
    // The CNN's first layer at batch 128: 131072 values per channel, many chunks.
    let s = stream();
    let mut rng = SplitMix64::new(7);
    let dims = [128i64, 32, 32, 32];
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let st = strides(&dims, layout);
        let count: i64 = dims.iter().product();
        let xv: Vec<f64> = values(&mut rng, count as usize, 2.0, 4.0);
        let x = upload(&s, &xv, &dims, &st, DataType::F32);
        let mut outs = Vec::new();
        for _ in 0..2 {
            let y = poisoned(&s, &dims, &st, DataType::F32);
            let (mean, inv) = (poisoned1(&s, 32, DataType::F32), poisoned1(&s, 32, DataType::F32));
            let fwd = BatchNormForward {
                x: &x.t,
                residual: None,
                y: &y.m,
                scale: None,
                bias: None,
                running: None,
                saved_mean: &mean.m,
                saved_inv_std: &inv.m,
            };
            ops::batch_norm_train_forward(&s, &fwd, &BatchNormOptions::default()).expect("forward");
            outs.push((download(&s, &y), download(&s, &mean), download(&s, &inv)));
        }
        let (_, rm, ri, _) =
            cpu::batch_norm_train(&x.values, &[128, 32, 32, 32], &[1.0; 32], &[0.0; 32], None, 1e-5, false);
        let em = rel_l2_error(&outs[0].1, &rm);
        let ei = rel_l2_error(&outs[0].2, &ri);
        println!("large batch {layout:?}: mean rel-L2 {em:.2e}, inv_std rel-L2 {ei:.2e}");
        assert!(em < 1e-6 && ei < 1e-5, "{layout:?}: mean {em:.2e} inv_std {ei:.2e}");
        assert!(outs[0] == outs[1], "{layout:?}: two runs differ");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_refuses_bad_input_with_typed_errors() {
    let s = stream();
    let mut rng = SplitMix64::new(3);
    let x1 = upload(
        &s,
        &values(&mut rng, 3, -1.0, 1.0),
        &[1, 3, 1, 1],
        &[3, 1, 1, 1],
        DataType::F32,
    );
    let y1 = poisoned(&s, &[1, 3, 1, 1], &[3, 1, 1, 1], DataType::F32);
    let (m, i) = (poisoned1(&s, 3, DataType::F32), poisoned1(&s, 3, DataType::F32));
    let run = |x: &TensorRef, y: &TensorMut| {
        ops::batch_norm_train_forward(
            &s,
            &BatchNormForward {
                x,
                residual: None,
                y,
                scale: None,
                bias: None,
                running: None,
                saved_mean: &m.m,
                saved_inv_std: &i.m,
            },
            &BatchNormOptions::default(),
        )
    };
    let e = run(&x1.t, &y1.m).expect_err("one value per channel");
    assert!(e.to_string().contains("more than one"), "{e}");
    let empty =
        x1.m.view_mut(0, &[0, 3, 4, 4], &row_major_strides(&[0, 3, 4, 4]))
            .expect("empty view");
    let e = run(&empty, &empty).expect_err("empty batch");
    assert!(e.to_string().contains("more than one"), "{e}");
    let x2 = upload(
        &s,
        &values(&mut rng, 24, -1.0, 1.0),
        &[2, 3, 2, 2],
        &[12, 4, 2, 1],
        DataType::F32,
    );
    let y_other = poisoned(&s, &[2, 3, 2, 3], &[18, 6, 3, 1], DataType::F32);
    assert!(run(&x2.t, &y_other.m).is_err(), "mismatched dims");
    let y_half = poisoned(&s, &[2, 3, 2, 2], &[12, 4, 2, 1], DataType::F16);
    assert!(run(&x2.t, &y_half.m).is_err(), "mismatched dtypes");
    // Channels-last and sliced inputs are handled, not refused.
    let x_cl = upload(
        &s,
        &values(&mut rng, 24, -1.0, 1.0),
        &[2, 3, 2, 2],
        &[12, 1, 6, 3],
        DataType::F32,
    );
    let y_cl = poisoned(&s, &[2, 3, 2, 2], &[12, 1, 6, 3], DataType::F32);
    run(&x_cl.t, &y_cl.m).expect("channels-last");
}

/// One tensor's f64 state for the Adam test.
struct AdamState {
    p: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
    vmax: Vec<f64>,
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn adam_step_matches_f64_reference_over_steps() {
    let s = stream();
    let mut rng = SplitMix64::new(99);
    let mut check = Check::new();
    let mut runs = 0;
    // (options, dtype): Adam, Adam + L2 + AMSGrad, AdamW, AdamW cautious; 40 tensors (two
    // launches), sizes from 1 to ~20000 elements.
    let variants = [
        (
            AdamOptions {
                lr: 1e-2,
                ..Default::default()
            },
            DataType::F32,
        ),
        (
            AdamOptions {
                lr: 1e-2,
                l2_penalty: 0.05,
                amsgrad: true,
                epsilon: 1e-5,
                ..Default::default()
            },
            DataType::F32,
        ),
        (
            AdamOptions {
                lr: 3e-3,
                decoupled_decay: 0.1,
                ..Default::default()
            },
            DataType::BF16,
        ),
        (
            AdamOptions {
                lr: 3e-3,
                decoupled_decay: 0.1,
                cautious: true,
                ..Default::default()
            },
            DataType::F16,
        ),
    ];
    for (o, dtype) in variants {
        let label = format!("{dtype:?} {o:?}");
        let sizes: Vec<i64> = (0..40)
            .map(|k| if k % 7 == 0 { 1 } else { range(&mut rng, 2, 20_000) })
            .collect();
        let mut state: Vec<AdamState> = sizes
            .iter()
            .map(|&n| AdamState {
                p: values(&mut rng, n as usize, -1.0, 1.0),
                m: vec![],
                v: vec![],
                vmax: vec![],
            })
            .collect();
        let mut dev: Vec<[Option<DevTensor>; 4]> = sizes.iter().map(|_| [None, None, None, None]).collect();
        for (k, st) in state.iter().enumerate() {
            dev[k][0] = Some(vec1(&s, &st.p, dtype));
        }
        for step in 1..=3u64 {
            let grads: Vec<DevTensor> = sizes
                .iter()
                .map(|&n| vec1(&s, &values(&mut rng, n as usize, -1.0, 1.0), dtype))
                .collect();
            let outs: Vec<[DevTensor; 4]> = sizes
                .iter()
                .map(|&n| std::array::from_fn(|_| poisoned1(&s, n, dtype)))
                .collect();
            let params: Vec<AdamParam<'_>> = (0..sizes.len())
                .map(|k| AdamParam {
                    param: &dev[k][0].as_ref().unwrap().t,
                    grad: &grads[k].t,
                    moment1: dev[k][1].as_ref().map(|t| &t.t),
                    moment2: dev[k][2].as_ref().map(|t| &t.t),
                    max_moment2: dev[k][3].as_ref().map(|t| &t.t),
                    param_out: &outs[k][0].m,
                    moment1_out: &outs[k][1].m,
                    moment2_out: &outs[k][2].m,
                    max_moment2_out: o.amsgrad.then_some(&outs[k][3].m),
                    step,
                })
                .collect();
            ops::adam_step(&s, &params, &o).unwrap_or_else(|e| panic!("{label}: {e}"));
            drop(params);
            for (k, out) in outs.into_iter().enumerate() {
                let st = &mut state[k];
                // The reference steps from the values the GPU holds (rounded to the dtype).
                let gin = &grads[k].values;
                let decay = if o.cautious { 0.0 } else { o.decoupled_decay as f64 };
                let (mut rp, rmo, rv, rvm) = cpu::adam_step(
                    &st.p,
                    gin,
                    &st.m,
                    &st.v,
                    &st.vmax,
                    step,
                    o.lr,
                    (o.beta1 as f64, o.beta2 as f64, o.epsilon as f64),
                    (o.l2_penalty as f64, decay),
                    o.amsgrad,
                    // Moments are stored (and used) in the tensors' dtype.
                    |v| round_to(dtype, v),
                );
                if o.cautious {
                    for i in 0..rp.len() {
                        if (st.p[i] >= 0.0) == (rmo[i] >= 0.0) {
                            rp[i] -= st.p[i] * o.lr * o.decoupled_decay as f64;
                        }
                    }
                }
                let [p, m, v, vm] = out;
                let (gp, gm, gv) = (download(&s, &p), download(&s, &m), download(&s, &v));
                let tol = bound(dtype).max(1e-5);
                check.cmp(&label, &format!("step {step} tensor {k} param"), &gp, &rp, tol);
                check.cmp(&label, &format!("step {step} tensor {k} m"), &gm, &rmo, tol);
                check.cmp(&label, &format!("step {step} tensor {k} v"), &gv, &rv, tol);
                if o.amsgrad {
                    check.cmp(
                        &label,
                        &format!("step {step} tensor {k} vmax"),
                        &download(&s, &vm),
                        &rvm,
                        tol,
                    );
                }
                // Continue from the GPU's own state (as stored), like a training loop.
                st.p = gp;
                st.m = gm;
                st.v = gv;
                dev[k] = [Some(p), Some(m), Some(v), o.amsgrad.then_some(vm)];
                if o.amsgrad {
                    st.vmax = download(&s, dev[k][3].as_ref().unwrap());
                }
            }
            runs += 1;
        }
    }
    check.finish("adam_step", runs);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_inference_alone() {
    // The smallest inference case on a fresh stream state, values printed on failure.
    let s = stream();
    let dims = [2i64, 3, 2, 2];
    let st = strides(&dims, Layout::Nchw);
    let xv: Vec<f64> = (0..24).map(|i| i as f64 * 0.25 - 2.0).collect();
    let x = upload(&s, &xv, &dims, &st, DataType::F32);
    let mean = vec1(&s, &[0.5, -0.5, 1.0], DataType::F32);
    let var = vec1(&s, &[1.0, 2.0, 0.5], DataType::F32);
    let scale = vec1(&s, &[1.0, 2.0, 0.5], DataType::F32);
    let bias = vec1(&s, &[0.0, 0.1, -0.1], DataType::F32);
    let y = poisoned(&s, &dims, &st, DataType::F32);
    let inf = BatchNormInference {
        x: &x.t,
        residual: None,
        y: &y.m,
        scale: Some(&scale.t),
        bias: Some(&bias.t),
        mean: &mean.t,
        var: &var.t,
    };
    ops::batch_norm_inference(&s, &inf, 1e-5, false).expect("inference");
    let got = download(&s, &y);
    let want: Vec<f64> = (0..24)
        .map(|i| {
            let c = (i / 4) % 3;
            (xv[i] - mean.values[c]) / (var.values[c] + 1e-5).sqrt() * scale.values[c] + bias.values[c]
        })
        .collect();
    let e = rel_l2_error(&got, &want);
    assert!(e < 1e-6, "rel-L2 {e:.3e}\ngot  {got:?}\nwant {want:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_and_rms_norm_training_match_f64_reference() {
    use cudnn_backend::graph::NormMode;
    let s = stream();
    let mut rng = SplitMix64::new(61);
    let mut check = Check::new();
    let mut runs = 0;
    let shard = Shard::from_env();
    let dtypes = [DataType::F32, DataType::F16, DataType::BF16];
    for case in 0..30 {
        if !shard.has(case) {
            continue;
        }
        let dtype = dtypes[case % 3];
        let mode = if case % 2 == 0 {
            NormMode::LayerNorm
        } else {
            NormMode::RmsNorm
        };
        let rms = mode == NormMode::RmsNorm;
        let rows = range(&mut rng, 1, 300);
        let features = if case % 5 == 0 {
            range(&mut rng, 1, 40)
        } else {
            range(&mut rng, 32, 1100)
        };
        let pdt = if case % 4 < 2 { DataType::F32 } else { dtype };
        let with_bias = !rms || case % 3 == 0;
        let label = format!("{mode:?} {dtype:?} [{rows}, {features}] params {pdt:?} bias {with_bias}");
        let dims = [rows, features];
        let st = [features, 1];
        let xv: Vec<f64> = values(&mut rng, (rows * features) as usize, -1.0, 2.0);
        let x = upload(&s, &xv, &dims, &st, dtype);
        let w = vec1(&s, &values(&mut rng, features as usize, 0.5, 1.5), pdt);
        let bias = with_bias.then(|| vec1(&s, &values(&mut rng, features as usize, -0.5, 0.5), pdt));
        let y = poisoned(&s, &dims, &st, dtype);
        let mean = (!rms).then(|| poisoned1(&s, rows, DataType::F32));
        let inv = poisoned1(&s, rows, DataType::F32);
        ops::norm_train_forward(
            &s,
            mode,
            &x.t,
            Some(&w.t),
            bias.as_ref().map(|b| &b.t),
            &y.m,
            1e-5,
            mean.as_ref().map(|m| &m.m),
            &inv.m,
        )
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        let (ry, rm, ri) = cpu::norm(
            &x.values,
            features as usize,
            &w.values,
            bias.as_ref().map(|b| b.values.as_slice()),
            !rms,
            1e-5,
        );
        let tol = bound(dtype);
        check.cmp(&label, "y", &download(&s, &y), &ry, tol);
        if let Some(m) = &mean {
            check.cmp(&label, "mean", &download(&s, m), &rm, 1e-5);
        }
        check.cmp(
            &label,
            "inv_std",
            &download(&s, &inv),
            &ri,
            if dtype == DataType::F32 { 1e-5 } else { 1e-4 },
        );
        // Backward from exact statistics.
        let dy = upload(
            &s,
            &values(&mut rng, (rows * features) as usize, -1.0, 1.0),
            &dims,
            &st,
            dtype,
        );
        let (sm, si) = (vec1(&s, &rm, DataType::F32), vec1(&s, &ri, DataType::F32));
        let dx = poisoned(&s, &dims, &st, dtype);
        let (dw, db) = (poisoned1(&s, features, pdt), poisoned1(&s, features, pdt));
        let args = ops::NormBackward {
            x: &x.t,
            dy: &dy.t,
            scale: Some(&w.t),
            mean: (!rms).then_some(&sm.t),
            inv_std: &si.t,
            dx: Some(&dx.m),
            d_scale: Some(&dw.m),
            d_bias: Some(&db.m),
        };
        ops::norm_backward(&s, mode, &args).unwrap_or_else(|e| panic!("{label} backward: {e}"));
        let (rdx, rdw, rdb) = cpu::norm_backward(&x.values, &dy.values, features as usize, &w.values, !rms, &rm, &ri);
        check.cmp(&label, "dx", &download(&s, &dx), &rdx, tol);
        check.cmp(&label, "d_scale", &download(&s, &dw), &rdw, tol.max(bound(pdt)));
        check.cmp(&label, "d_bias", &download(&s, &db), &rdb, tol.max(bound(pdt)));
        runs += 1;
    }
    check.finish("norm training", runs);
}

/// Logits `[rows, classes]` (uniform in [-4, 4), never zero) uploaded in `dtype`, one element
/// into their buffer when `offset` (rows then start off the 16-byte grid), with the views and
/// the rounded values.
struct Logits {
    dev: DevTensor,
    t: TensorRef<'static>,
    m: TensorMut<'static>,
    values: Vec<f64>,
}

fn logits(s: &Arc<CudaStream>, rng: &mut SplitMix64, rows: i64, classes: i64, dtype: DataType, offset: bool) -> Logits {
    let n = rows * classes;
    let skip = i64::from(offset);
    let v: Vec<f64> = values(rng, (n + skip) as usize, -4.0, 4.0)
        .into_iter()
        .map(|x| if x == 0.0 { 0.5 } else { x })
        .collect();
    let dev = upload(s, &v, &[n + skip], &[1], dtype);
    let dims = [rows, classes];
    let st = row_major_strides(&dims);
    let t = dev.t.view(skip, &dims, &st).expect("logits view");
    let m = dev.m.view_mut(skip, &dims, &st).expect("logits view");
    let values = dev.values[skip as usize..].to_vec();
    Logits { dev, t, m, values }
}

/// Targets uniform over the classes, every fifth row -100 (ignored), at `stride` elements
/// apart in their buffer.
fn targets(s: &Arc<CudaStream>, rng: &mut SplitMix64, rows: i64, classes: i64, stride: i64) -> (DevTensor, Vec<i64>) {
    let t: Vec<i64> = (0..rows)
        .map(|i| if i % 5 == 2 { -100 } else { range(rng, 0, classes - 1) })
        .collect();
    let v: Vec<f64> = t.iter().map(|&x| x as f64).collect();
    (upload(s, &v, &[rows], &[stride], DataType::I64), t)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cross_entropy_forward_and_backward_match_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(2029);
    let mut check = Check::new();
    let mut runs = 0;
    // GPT-2's vocabulary (odd: no multiple of any vector width), ImageNet's and CIFAR's class
    // counts, both sides of the warp / block threshold (2048), one class, rows past the grid.
    let shapes: [(i64, i64); 8] = [
        (8, 50_257),
        (37, 10),
        (64, 2048),
        (5, 2049),
        (3, 1),
        (130, 3),
        (12, 1000),
        (4, 8191),
    ];
    let ignore = [-100, 3];
    for (case, &(rows, classes)) in shapes.iter().enumerate() {
        for (di, dtype) in [DataType::F32, DataType::BF16, DataType::F16].into_iter().enumerate() {
            let k = case * 3 + di;
            let offset = k % 2 == 1;
            let mean_over = if k % 3 == 1 {
                CrossEntropyMean::TargetRows
            } else {
                CrossEntropyMean::AllRows
            };
            let in_place = k % 4 == 3;
            let t_stride = if case % 2 == 0 { 1 } else { 3 };
            let label = format!(
                "{dtype:?} [{rows}, {classes}] offset {offset} {mean_over:?} in place {in_place} target stride {t_stride}"
            );
            let x = logits(&s, &mut rng, rows, classes, dtype, offset);
            let (tg, tv) = targets(&s, &mut rng, rows, classes, t_stride);
            let (lse, row_loss) = (poisoned1(&s, rows, DataType::F32), poisoned1(&s, rows, DataType::F32));
            let mean = poisoned(&s, &[1], &[1], dtype);
            let fwd = CrossEntropyForward {
                logits: &x.t,
                targets: &tg.t,
                ignore: &ignore,
                lse: &lse.m,
                row_loss: Some(&row_loss.m),
                mean: Some(&mean.m),
                mean_over,
            };
            ops::cross_entropy_forward(&s, &fwd).unwrap_or_else(|e| panic!("{label}: {e}"));
            let counted = mean_over == CrossEntropyMean::TargetRows;
            let r = cpu::cross_entropy(&x.values, classes as usize, &tv, &ignore, counted);
            // Row statistics are f32 whatever the logits' dtype.
            check.cmp(&label, "row loss", &download(&s, &row_loss), &r.row_loss, 1e-5);
            check.cmp(&label, "lse", &download(&s, &lse), &r.lse, 1e-5);
            check.cmp(&label, "mean", &download(&s, &mean), &[r.mean], bound(dtype));

            let grad = vec1(&s, &[0.75], dtype);
            let dx = poisoned(&s, &[rows, classes], &row_major_strides(&[rows, classes]), dtype);
            let d_logits = if in_place { &x.m } else { &dx.m };
            let bwd = CrossEntropyBackward {
                logits: &x.t,
                targets: &tg.t,
                ignore: &ignore,
                lse: &lse.t,
                grad: &grad.t,
                mean_over,
                d_logits,
            };
            ops::cross_entropy_backward(&s, &bwd).unwrap_or_else(|e| panic!("{label} backward: {e}"));
            let rdx = cpu::cross_entropy_backward(&x.values, classes as usize, &tv, &ignore, counted, grad.values[0]);
            let got = if in_place {
                download(&s, &x.dev)[usize::from(offset)..].to_vec()
            } else {
                download(&s, &dx)
            };
            check.cmp(&label, "d_logits", &got, &rdx, bound(dtype));
            runs += 1;
        }
    }
    check.finish("cross_entropy", runs);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cross_entropy_flags_out_of_range_targets_and_is_deterministic() {
    let s = stream();
    let mut rng = SplitMix64::new(31);
    let (rows, classes) = (6, 50_257);
    let x = logits(&s, &mut rng, rows, classes, DataType::BF16, true);
    // Row 1 ignored, row 3 past the last class, row 4 negative and not ignored.
    let tv = [5i64, -100, 50_256, 50_257, -1, 0];
    let tg = upload(&s, &tv.map(|t| t as f64), &[rows], &[1], DataType::I64);
    let run = || {
        let (lse, row_loss) = (poisoned1(&s, rows, DataType::F32), poisoned1(&s, rows, DataType::F32));
        let mean = poisoned(&s, &[1], &[1], DataType::F32);
        let fwd = CrossEntropyForward {
            logits: &x.t,
            targets: &tg.t,
            ignore: &[-100],
            lse: &lse.m,
            row_loss: Some(&row_loss.m),
            mean: Some(&mean.m),
            mean_over: CrossEntropyMean::AllRows,
        };
        ops::cross_entropy_forward(&s, &fwd).expect("forward");
        let grad = vec1(&s, &[1.0], DataType::F32);
        let dx = poisoned(
            &s,
            &[rows, classes],
            &row_major_strides(&[rows, classes]),
            DataType::BF16,
        );
        let bwd = CrossEntropyBackward {
            logits: &x.t,
            targets: &tg.t,
            ignore: &[-100],
            lse: &lse.t,
            grad: &grad.t,
            mean_over: CrossEntropyMean::AllRows,
            d_logits: &dx.m,
        };
        ops::cross_entropy_backward(&s, &bwd).expect("backward");
        (download(&s, &row_loss), download(&s, &mean), download(&s, &dx))
    };
    let (loss, mean, dx) = run();
    let bad = |r: usize| r == 3 || r == 4;
    for r in 0..rows as usize {
        let row = &dx[r * classes as usize..(r + 1) * classes as usize];
        if bad(r) {
            assert!(
                loss[r].is_nan() && row.iter().all(|v| v.is_nan()),
                "row {r}: out of range, not NaN"
            );
        } else if r == 1 {
            assert!(
                loss[r] == 0.0 && row.iter().all(|&v| v == 0.0),
                "row {r}: ignored, not zero"
            );
        } else {
            assert!(
                loss[r].is_finite() && row.iter().all(|v| v.is_finite()),
                "row {r}: not finite"
            );
        }
    }
    assert!(mean[0].is_nan(), "the mean of NaN rows: {}", mean[0]);
    // Fixed reduction orders: a second run gives the same bits.
    let again = run();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&again.0), bits(&loss), "row losses differ between runs");
    assert_eq!(bits(&again.2), bits(&dx), "gradients differ between runs");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cross_entropy_refuses_bad_input_with_typed_errors() {
    let s = stream();
    let mut rng = SplitMix64::new(5);
    let x = logits(&s, &mut rng, 4, 10, DataType::F32, false);
    let (tg, _) = targets(&s, &mut rng, 4, 10, 1);
    let (lse, loss) = (poisoned1(&s, 4, DataType::F32), poisoned1(&s, 4, DataType::F32));
    let fwd = |logits: &TensorRef, targets: &TensorRef, ignore: &[i64], lse: &TensorMut| {
        let a = CrossEntropyForward {
            logits,
            targets,
            ignore,
            lse,
            row_loss: Some(&loss.m),
            mean: None,
            mean_over: CrossEntropyMean::AllRows,
        };
        match ops::cross_entropy_forward(&s, &a) {
            Err(cudnn_backend::Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    };
    let transposed = x.t.view(0, &[4, 10], &[1, 4]).expect("view");
    assert_eq!(fwd(&transposed, &tg.t, &[], &lse.m), "logits");
    let int32 = poisoned(&s, &[4], &[1], DataType::I32);
    assert_eq!(fwd(&x.t, &int32.t, &[], &lse.m), "targets");
    assert_eq!(fwd(&x.t, &tg.t, &[0; 9], &lse.m), "ignore");
    let short = poisoned1(&s, 3, DataType::F32);
    assert_eq!(fwd(&x.t, &tg.t, &[], &short.m), "lse");
    // The row losses written over the lse.
    assert_eq!(fwd(&x.t, &tg.t, &[], &loss.m), "row_loss");
    // A gradient that overlaps the logits without being them.
    let grad = vec1(&s, &[1.0], DataType::F32);
    let wide = logits(&s, &mut rng, 5, 10, DataType::F32, false);
    let shifted = wide.m.view_mut(10, &[4, 10], &[10, 1]).expect("view");
    let base = wide.t.view(0, &[4, 10], &[10, 1]).expect("view");
    let bwd = CrossEntropyBackward {
        logits: &base,
        targets: &tg.t,
        ignore: &[],
        lse: &lse.t,
        grad: &grad.t,
        mean_over: CrossEntropyMean::AllRows,
        d_logits: &shifted,
    };
    let e = ops::cross_entropy_backward(&s, &bwd).expect_err("overlapping gradient");
    assert!(e.to_string().contains("d_logits"), "{e}");
}
