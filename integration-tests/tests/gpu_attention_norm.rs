//! `ops::sdpa_forward` (fused attention) and `ops::norm_forward` (layer / RMS norm) against
//! float64 references on random shapes and layouts, outputs poisoned. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::{DataType, NormMode};
use cudnn_backend::ops::{self, NormStats};
use cudnn_backend::Device;
use cudnn_backend_reference::{self as cpu, SplitMix64};
use integration_tests::{bound, download, poisoned, random, strides, upload, DevTensor, Layout, Shard};

const CASES: usize = 24;

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

fn pick<T: Copy>(rng: &mut SplitMix64, v: &[T]) -> T {
    v[(rng.next_u64() % v.len() as u64) as usize]
}

fn range(rng: &mut SplitMix64, lo: i64, hi: i64) -> i64 {
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as i64
}

/// Strides of a `[b, h, s, d]` tensor stored as `[b, s, h, d]` (a head split of `[b, s, h·d]`).
fn bshd(dims: &[i64]) -> Vec<i64> {
    let (h, s, d) = (dims[1], dims[2], dims[3]);
    vec![s * h * d, d, h * d, 1]
}

/// Row-major packed strides.
fn packed(dims: &[i64]) -> Vec<i64> {
    strides(dims, Layout::Nchw)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sdpa_matches_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(41);
    let (mut runs, mut unsupported, mut failures, mut worst) = (0, Vec::new(), Vec::new(), 0.0f64);
    let mut causal_runs = 0;
    let shard = Shard::from_env();
    for (t, dtype) in [DataType::F16, DataType::BF16].into_iter().enumerate() {
        for case in 0..CASES {
            if !shard.has(t * CASES + case) {
                continue;
            }
            let (b, h) = (range(&mut rng, 1, 3), range(&mut rng, 1, 4));
            let (sq, skv) = (range(&mut rng, 1, 130), range(&mut rng, 1, 130));
            // Every third case masks causally in the graph (bottom-right aligned: query i sees
            // keys j <= i + skv - sq), which needs sq <= skv, and sq == skv with a bias.
            let bias_kind = case % 4;
            let causal = case % 3 == 1;
            let sq = match (causal, bias_kind) {
                (false, _) => sq,
                (true, 0) => sq.min(skv),
                (true, _) => skv,
            };
            let d = pick(&mut rng, &[8, 16, 32, 64, 128]);
            let dv = if case % 3 == 0 { pick(&mut rng, &[8, 32, 64]) } else { d };
            let head_split = case % 2 == 1;
            let layout = |dims: &[i64]| if head_split { bshd(dims) } else { packed(dims) };
            let (qd, kd, vd, od) = ([b, h, sq, d], [b, h, skv, d], [b, h, skv, dv], [b, h, sq, dv]);
            let q = random(&s, &mut rng, &qd, &layout(&qd), dtype);
            let k = random(&s, &mut rng, &kd, &layout(&kd), dtype);
            let v = random(&s, &mut rng, &vd, &layout(&vd), dtype);
            let o = poisoned(&s, &od, &layout(&od), dtype);
            // Bias: none, per-(query, key) broadcast over batch and heads, or full; the
            // causal variant has -inf above the diagonal (each row keeps key 0).
            let bias = (bias_kind > 0).then(|| {
                let (bb, bh) = if bias_kind == 3 { (b, h) } else { (1, 1) };
                let dims = [bb, bh, sq, skv];
                let n = (bb * bh * sq * skv) as usize;
                let vals: Vec<f64> = if bias_kind == 2 {
                    (0..n)
                        .map(|i| {
                            let (r, c) = ((i as i64 / skv) % sq, i as i64 % skv);
                            if c > r {
                                f64::NEG_INFINITY
                            } else {
                                0.0
                            }
                        })
                        .collect()
                } else {
                    rng.fill(n)
                };
                (upload(&s, &vals, &dims, &packed(&dims), dtype), [bb, bh])
            });
            let scale = 1.0 / (d as f64).sqrt() * if case % 5 == 0 { 2.0 } else { 1.0 };
            let label = format!(
                "{dtype:?} q{qd:?} k{kd:?} v{vd:?} {} bias{bias_kind} causal {causal} scale {scale:.3}",
                if head_split { "bshd" } else { "bhsd" }
            );
            // Every other case also writes the softmax statistics (log-sum-exp per row).
            let with_stats = case % 2 == 0;
            let st = poisoned(&s, &[b, h, sq, 1], &packed(&[b, h, sq, 1]), DataType::F32);
            let label = format!("{label} stats {with_stats}");
            let r = ops::sdpa_forward(
                &s,
                &q.t,
                &k.t,
                &v.t,
                bias.as_ref().map(|(t, _)| &t.t),
                causal,
                &o.m,
                scale as f32,
                with_stats.then_some(&st.m),
            );
            match r {
                Ok(()) => {}
                Err(e) if e.is_not_supported() => {
                    unsupported.push(format!("{label}: {e}"));
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{label}: {e}"));
                    continue;
                }
            }
            let got = download(&s, &o);
            // Bias of (batch·head, i, j), broadcast over batch and heads where its dims are 1.
            let bias_at = bias.as_ref().map(|(t, [bb, bh])| {
                let (vals, bb, bh) = (&t.values, *bb as usize, *bh as usize);
                let (h, sq, skv) = (h as usize, sq as usize, skv as usize);
                move |hd: usize, i: usize, j: usize| {
                    let (b0, h0) = (if bb == 1 { 0 } else { hd / h }, if bh == 1 { 0 } else { hd % h });
                    vals[((b0 * bh + h0) * sq + i) * skv + j]
                }
            });
            let (sq_, skv_) = (sq as usize, skv as usize);
            let score_bias = |hd: usize, i: usize, j: usize| {
                let masked = if causal && cpu::causal_masked(i, j, sq_, skv_) {
                    f64::NEG_INFINITY
                } else {
                    0.0
                };
                masked + bias_at.as_ref().map_or(0.0, |f| f(hd, i, j))
            };
            let (want, want_lse) = cpu::attention(
                &q.values,
                &k.values,
                &v.values,
                [(b * h) as usize, sq as usize, skv as usize, d as usize, dv as usize],
                scale,
                Some(&score_bias),
            );
            let mut checks = vec![("o", cpu::rel_l2_error(&got, &want))];
            if with_stats {
                checks.push(("stats", cpu::rel_l2_error(&download(&s, &st), &want_lse)));
            }
            runs += 1;
            causal_runs += causal as usize;
            for (what, err) in checks {
                worst = worst.max(err);
                if err.is_nan() || err > bound(dtype) {
                    failures.push(format!("{label} {what}: rel L2 error {err:.3e} > {:.0e}", bound(dtype)));
                }
            }
        }
    }
    // f32 has no fused engine: a typed not-supported error, never a wrong result.
    let qd = [1i64, 2, 16, 64];
    let q = random(&s, &mut rng, &qd, &packed(&qd), DataType::F32);
    let o = poisoned(&s, &qd, &packed(&qd), DataType::F32);
    let f32_err =
        ops::sdpa_forward(&s, &q.t, &q.t, &q.t, None, false, &o.m, 0.125, None).expect_err("f32 sdpa must be refused");
    assert!(f32_err.is_not_supported(), "f32 sdpa: {f32_err}");
    println!(
        "sdpa: {runs} runs checked ({causal_runs} with the causal mask in the graph), {} not supported by cuDNN, {} failed; worst rel L2 {worst:.2e}",
        unsupported.len(),
        failures.len()
    );
    for u in &unsupported {
        println!("  not supported: {u}");
    }
    assert!(failures.is_empty(), "sdpa failures:\n{}", failures.join("\n"));
    assert!(runs * shard.parts() >= CASES, "only {runs} sdpa cases ran on cuDNN");
    assert!(
        causal_runs * shard.parts() >= CASES / 3,
        "only {causal_runs} causal sdpa cases ran on cuDNN"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_and_rms_norm_match_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(43);
    let (mut runs, mut unsupported, mut failures) = (0, Vec::new(), Vec::new());
    let mut worst: Vec<(String, f64)> = Vec::new();
    let shard = Shard::from_env();
    let mut index = 0;
    for mode in [NormMode::LayerNorm, NormMode::RmsNorm] {
        for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
            for case in 0..CASES {
                index += 1;
                if !shard.has(index - 1) {
                    continue;
                }
                let rows = range(&mut rng, 1, 300);
                let f = pick(&mut rng, &[1, 7, 64, 127, 768, 1024, 2000, 4096]);
                let row_stride = if case % 3 == 0 { f + 5 } else { f };
                let x = random(&s, &mut rng, &[rows, f], &[row_stride, 1], dtype);
                let y = poisoned(&s, &[rows, f], &[row_stride, 1], dtype);
                let pdt = if case % 2 == 0 { DataType::F32 } else { dtype };
                let scale_vals: Vec<f64> = rng.fill(f as usize).iter().map(|v| 1.0 + 0.5 * v).collect();
                let scale = upload(&s, &scale_vals, &[f], &[1], pdt);
                let bias = (case % 4 != 1).then(|| random(&s, &mut rng, &[f], &[1], pdt));
                let with_stats = mode == NormMode::LayerNorm && case % 3 == 2;
                let mean = poisoned(&s, &[rows], &[1], DataType::F32);
                let inv = poisoned(&s, &[rows], &[1], DataType::F32);
                let stats = with_stats.then_some(NormStats {
                    mean: &mean.m,
                    inv_std: &inv.m,
                });
                let eps = 1e-5;
                let label = format!(
                    "{mode:?} {dtype:?} [{rows}, {f}] row stride {row_stride} params {pdt:?} bias {} stats {with_stats}",
                    bias.is_some()
                );
                let r = ops::norm_forward(&s, mode, &x.t, &scale.t, bias.as_ref().map(|b| &b.t), &y.m, eps, stats);
                // cuDNN's norm engines take packed rows only: padded rows must be refused
                // with a typed not-supported error; packed ones must run.
                match r {
                    Ok(()) if row_stride == f => {}
                    Ok(()) => {
                        failures.push(format!("{label}: padded rows were accepted"));
                        continue;
                    }
                    Err(e) if e.is_not_supported() && row_stride != f => {
                        unsupported.push(format!("{label}: {e}"));
                        continue;
                    }
                    Err(e) => {
                        failures.push(format!("{label}: {e}"));
                        continue;
                    }
                }
                let got = download(&s, &y);
                let centred = mode == NormMode::LayerNorm;
                let bias_vals = bias.as_ref().map(|b| b.values.as_slice());
                let (want, want_mean, want_inv) =
                    cpu::norm(&x.values, f as usize, &scale.values, bias_vals, centred, eps);
                let mut check = |what: &str, got: &[f64], want: &[f64], dt: DataType| {
                    let err = cpu::rel_l2_error(got, want);
                    runs += 1;
                    let key = format!("{mode:?} {dt:?} {what}");
                    match worst.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, w)) => *w = w.max(err),
                        None => worst.push((key, err)),
                    }
                    if err.is_nan() || err > bound(dt) {
                        failures.push(format!("{label} {what}: rel L2 error {err:.3e} > {:.0e}", bound(dt)));
                    }
                };
                check("y", &got, &want, dtype);
                if with_stats {
                    check("mean", &download(&s, &mean), &want_mean, DataType::F32);
                    check("inv_std", &download(&s, &inv), &want_inv, DataType::F32);
                }
            }
        }
    }
    let worst: Vec<String> = worst.iter().map(|(k, e)| format!("{k} {e:.2e}")).collect();
    println!(
        "norm: {runs} checks, {} padded-row cases refused as not supported, {} failed; worst rel L2: {}",
        unsupported.len(),
        failures.len(),
        worst.join(", ")
    );
    assert!(failures.is_empty(), "norm failures:\n{}", failures.join("\n"));
    assert!(
        runs * shard.parts() >= 2 * CASES,
        "only {runs} norm checks ran on cuDNN"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sdpa_backward_matches_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(47);
    let (mut runs, mut unsupported, mut failures, mut worst) = (0, Vec::new(), Vec::new(), 0.0f64);
    let shard = Shard::from_env();
    for (t, dtype) in [DataType::F16, DataType::BF16].into_iter().enumerate() {
        for case in 0..12 {
            if !shard.has(t * 12 + case) {
                continue;
            }
            let (b, h) = (range(&mut rng, 1, 3), range(&mut rng, 1, 4));
            let skv = range(&mut rng, 2, 130);
            let causal = case % 3 == 1;
            let with_bias = case % 4 == 2;
            let sq = if causal && with_bias {
                skv
            } else if causal {
                range(&mut rng, 1, skv)
            } else {
                range(&mut rng, 1, 130)
            };
            let d = pick(&mut rng, &[16, 32, 64, 128]);
            let dv = if case % 5 == 0 { pick(&mut rng, &[32, 64]) } else { d };
            let head_split = case % 2 == 1;
            let layout = |dims: &[i64]| if head_split { bshd(dims) } else { packed(dims) };
            let (qd, kd, vd, od) = ([b, h, sq, d], [b, h, skv, d], [b, h, skv, dv], [b, h, sq, dv]);
            let q = random(&s, &mut rng, &qd, &layout(&qd), dtype);
            let k = random(&s, &mut rng, &kd, &layout(&kd), dtype);
            let v = random(&s, &mut rng, &vd, &layout(&vd), dtype);
            let d_o = random(&s, &mut rng, &od, &layout(&od), dtype);
            let bias = with_bias.then(|| {
                let dims = [1, 1, sq, skv];
                upload(&s, &rng.fill((sq * skv) as usize), &dims, &packed(&dims), dtype)
            });
            let o = poisoned(&s, &od, &layout(&od), dtype);
            let st = poisoned(&s, &[b, h, sq, 1], &packed(&[b, h, sq, 1]), DataType::F32);
            let scale = 1.0 / (d as f64).sqrt();
            let label = format!(
                "{dtype:?} q{qd:?} k{kd:?} v{vd:?} {} causal {causal} bias {with_bias}",
                if head_split { "bshd" } else { "bhsd" }
            );
            let bt = bias.as_ref().map(|t| &t.t);
            if let Err(e) = ops::sdpa_forward(&s, &q.t, &k.t, &v.t, bt, causal, &o.m, scale as f32, Some(&st.m)) {
                failures.push(format!("{label} forward: {e}"));
                continue;
            }
            let (dq, dk, dvv) = (
                poisoned(&s, &qd, &layout(&qd), dtype),
                poisoned(&s, &kd, &layout(&kd), dtype),
                poisoned(&s, &vd, &layout(&vd), dtype),
            );
            let args = ops::SdpaBackward {
                q: &q.t,
                k: &k.t,
                v: &v.t,
                o: &o.t,
                d_o: &d_o.t,
                stats: &st.t,
                bias: bt,
                dq: &dq.m,
                dk: &dk.m,
                dv: &dvv.m,
                d_bias: None,
                dropout: None,
            };
            match ops::sdpa_backward(&s, &args, causal, scale as f32) {
                Ok(()) => {}
                Err(e) if e.is_not_supported() => {
                    unsupported.push(format!("{label}: {e}"));
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{label}: {e}"));
                    continue;
                }
            }
            let (sq_, skv_) = (sq as usize, skv as usize);
            let bias_vals = bias.as_ref().map(|t| t.values.clone());
            let score_bias = |_hd: usize, i: usize, j: usize| {
                let masked = if causal && cpu::causal_masked(i, j, sq_, skv_) {
                    f64::NEG_INFINITY
                } else {
                    0.0
                };
                masked + bias_vals.as_ref().map_or(0.0, |bv| bv[i * skv_ + j])
            };
            let (wq, wk, wv) = cpu::attention_backward(
                &q.values,
                &k.values,
                &v.values,
                &d_o.values,
                [(b * h) as usize, sq_, skv_, d as usize, dv as usize],
                scale,
                Some(&score_bias),
            );
            runs += 1;
            let tol = if dtype == DataType::BF16 { 3e-2 } else { 1e-2 };
            let grads = [("dq", &dq, wq), ("dk", &dk, wk), ("dv", &dvv, wv)];
            check_grads(&s, &label, tol, &grads, &mut worst, &mut failures);
        }
    }
    println!(
        "sdpa backward: {runs} runs checked, {} not supported by cuDNN, {} failed; worst rel L2 {worst:.2e}",
        unsupported.len(),
        failures.len()
    );
    for u in &unsupported {
        println!("  not supported: {u}");
    }
    assert!(failures.is_empty(), "sdpa backward failures:\n{}", failures.join("\n"));
    assert!(
        runs * shard.parts() >= 12,
        "only {runs} sdpa backward cases ran on cuDNN"
    );
}

/// `d_scores` (`[b·h, lq, lk]`, the gradient of the biased scores) summed into the dims
/// `[bb, bh, lq, lk]` of a bias broadcast over the batch (`bb` 1) or the heads (`bh` 1).
fn bias_grad_of(d_scores: &[f64], [h, lq, lk]: [usize; 3], [bb, bh]: [usize; 2]) -> Vec<f64> {
    let mut out = vec![0.0; bb * bh * lq * lk];
    for (hd, scores) in d_scores.chunks(lq * lk).enumerate() {
        let (b0, h0) = (if bb == 1 { 0 } else { hd / h }, if bh == 1 { 0 } else { hd % h });
        let slot = &mut out[(b0 * bh + h0) * lq * lk..][..lq * lk];
        slot.iter_mut().zip(scores).for_each(|(o, g)| *o += g);
    }
    out
}

/// Compares each downloaded gradient with its float64 reference: errors above `tol` (or NaN)
/// go to `failures` labelled `label name`; the largest error goes to `worst`.
fn check_grads(
    s: &Arc<CudaStream>,
    label: &str,
    tol: f64,
    grads: &[(&str, &DevTensor, Vec<f64>)],
    worst: &mut f64,
    failures: &mut Vec<String>,
) {
    for (name, got, want) in grads {
        let err = cpu::rel_l2_error(&download(s, got), want);
        *worst = worst.max(err);
        if err.is_nan() || err > tol {
            failures.push(format!("{label} {name}: rel L2 error {err:.3e} > {tol:.0e}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sdpa_backward_bias_gradient_matches_f64_reference() {
    let s = stream();
    let mut rng = SplitMix64::new(53);
    let (mut runs, mut failures, mut worst) = (0, Vec::new(), 0.0f64);
    let shard = Shard::from_env();
    // Every broadcast of the bias, with and without the causal mask, once with sequence
    // lengths that are multiples of 64 (what cuDNN before 9.5 needs for dBias) and once
    // with arbitrary ones.
    const SHAPES: [&str; 4] = ["[1,H,Sq,Skv]", "[B,H,Sq,Skv]", "[1,1,Sq,Skv]", "[B,1,Sq,Skv]"];
    let mut index = 0;
    for dtype in [DataType::F16, DataType::BF16] {
        let (mut fused, mut declined, mut ran) = (Vec::new(), Vec::new(), 0);
        for (shape_i, shape) in SHAPES.into_iter().enumerate() {
            for causal in [false, true] {
                for aligned in [true, false] {
                    index += 1;
                    if !shard.has(index - 1) {
                        continue;
                    }
                    ran += 1;
                    let (b, h) = (range(&mut rng, 2, 3), range(&mut rng, 2, 4));
                    let seq = |rng: &mut SplitMix64| {
                        if aligned {
                            pick(rng, &[64, 128])
                        } else {
                            range(rng, 2, 130)
                        }
                    };
                    let skv = seq(&mut rng);
                    // cuDNN combines a bias with the causal mask only for square scores.
                    let sq = if causal { skv } else { seq(&mut rng) };
                    let [bb, bh] = match shape_i {
                        0 => [1, h],
                        1 => [b, h],
                        2 => [1, 1],
                        _ => [b, 1],
                    };
                    let d = pick(&mut rng, &[32, 64, 128]);
                    let dv = if index % 3 == 0 { pick(&mut rng, &[32, 64]) } else { d };
                    let head_split = index % 2 == 1;
                    let layout = |dims: &[i64]| if head_split { bshd(dims) } else { packed(dims) };
                    let (qd, kd, vd, od) = ([b, h, sq, d], [b, h, skv, d], [b, h, skv, dv], [b, h, sq, dv]);
                    let bd = [bb, bh, sq, skv];
                    let q = random(&s, &mut rng, &qd, &layout(&qd), dtype);
                    let k = random(&s, &mut rng, &kd, &layout(&kd), dtype);
                    let v = random(&s, &mut rng, &vd, &layout(&vd), dtype);
                    let d_o = random(&s, &mut rng, &od, &layout(&od), dtype);
                    let bias = random(&s, &mut rng, &bd, &packed(&bd), dtype);
                    let o = poisoned(&s, &od, &layout(&od), dtype);
                    let st = poisoned(&s, &[b, h, sq, 1], &packed(&[b, h, sq, 1]), DataType::F32);
                    let scale = 1.0 / (d as f64).sqrt();
                    let what = format!("bias {shape} {bd:?} causal {causal}");
                    let label = format!(
                        "{dtype:?} q{qd:?} k{kd:?} v{vd:?} {} {what}",
                        if head_split { "bshd" } else { "bhsd" }
                    );
                    let r = ops::sdpa_forward(
                        &s,
                        &q.t,
                        &k.t,
                        &v.t,
                        Some(&bias.t),
                        causal,
                        &o.m,
                        scale as f32,
                        Some(&st.m),
                    );
                    match r {
                        Ok(()) => {}
                        Err(e) if e.is_not_supported() => {
                            declined.push(format!("{label} (forward): {e}"));
                            continue;
                        }
                        Err(e) => {
                            failures.push(format!("{label} forward: {e}"));
                            continue;
                        }
                    }
                    let (dq, dk, dvv, db) = (
                        poisoned(&s, &qd, &layout(&qd), dtype),
                        poisoned(&s, &kd, &layout(&kd), dtype),
                        poisoned(&s, &vd, &layout(&vd), dtype),
                        poisoned(&s, &bd, &packed(&bd), dtype),
                    );
                    let args = ops::SdpaBackward {
                        q: &q.t,
                        k: &k.t,
                        v: &v.t,
                        o: &o.t,
                        d_o: &d_o.t,
                        stats: &st.t,
                        bias: Some(&bias.t),
                        dq: &dq.m,
                        dk: &dk.m,
                        dv: &dvv.m,
                        d_bias: Some(&db.m),
                        dropout: None,
                    };
                    match ops::sdpa_backward(&s, &args, causal, scale as f32) {
                        Ok(()) => fused.push(what.clone()),
                        Err(e) if e.is_not_supported() => {
                            declined.push(format!("{label}: {e}"));
                            continue;
                        }
                        Err(e) => {
                            failures.push(format!("{label}: {e}"));
                            continue;
                        }
                    }
                    let (h_, sq_, skv_) = (h as usize, sq as usize, skv as usize);
                    let (bb_, bh_) = (bb as usize, bh as usize);
                    let score_bias = |hd: usize, i: usize, j: usize| {
                        let masked = if causal && cpu::causal_masked(i, j, sq_, skv_) {
                            f64::NEG_INFINITY
                        } else {
                            0.0
                        };
                        let (b0, h0) = (if bb_ == 1 { 0 } else { hd / h_ }, if bh_ == 1 { 0 } else { hd % h_ });
                        masked + bias.values[((b0 * bh_ + h0) * sq_ + i) * skv_ + j]
                    };
                    let sizes = [(b * h) as usize, sq_, skv_, d as usize, dv as usize];
                    let (wq, wk, wv, w_scores) = cpu::attention_backward_with_scores(
                        &q.values,
                        &k.values,
                        &v.values,
                        &d_o.values,
                        sizes,
                        scale,
                        Some(&score_bias),
                    );
                    let wb = bias_grad_of(&w_scores, [h_, sq_, skv_], [bb_, bh_]);
                    runs += 1;
                    let tol = if dtype == DataType::BF16 { 3e-2 } else { 1e-2 };
                    let grads = [("dq", &dq, wq), ("dk", &dk, wk), ("dv", &dvv, wv), ("d_bias", &db, wb)];
                    check_grads(&s, &label, tol, &grads, &mut worst, &mut failures);
                }
            }
        }
        eprintln!(
            "sdpa backward with dBias, {dtype:?}: {} of {ran} cases fused, {} declined by cuDNN",
            fused.len(),
            declined.len()
        );
        for f in &fused {
            eprintln!("  fused: {f}");
        }
        for d in &declined {
            eprintln!("  declined: {d}");
        }
        // Sharded, a process may draw only shapes cuDNN declines; whole, every dtype must
        // compute dBias for some bias shape.
        if shard.parts() == 1 {
            assert!(
                !fused.is_empty(),
                "cuDNN computed dBias for no bias shape in {dtype:?}:\n{}",
                declined.join("\n")
            );
        }
    }
    eprintln!(
        "sdpa backward with dBias: {runs} runs checked, {} failed; worst rel L2 {worst:.2e}",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "sdpa backward dBias failures:\n{}",
        failures.join("\n")
    );
}
