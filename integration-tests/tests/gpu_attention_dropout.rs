//! Dropout inside cuDNN's fused attention (`ops::sdpa_forward_dropout` and `ops::sdpa_backward`
//! with `dropout`): the mask is Bernoulli with the asked rate, reproduces from the same seed
//! and offset, and output and gradients match a float64 reference that applies the stored
//! mask. Needs a CUDA GPU.

use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, AttentionDropout};
use cudnn_backend::Device;
use cudnn_backend_reference::{self as cpu, SplitMix64};
use integration_tests::{download, poisoned, random, strides, upload, Layout};

/// `[o, dq, dk, dv]` of attention with dropout mask `mask` (1 kept, 0 dropped) and keep
/// probability `keep`, per head, in float64: `P = softmax(q·kᵀ·scale)`,
/// `o = (P ∘ mask / keep) · v`, and the gradients of `Σ o ∘ d_o`.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    mask: &[f64],
    [heads, sq, skv, d]: [usize; 4],
    scale: f64,
    keep: f64,
) -> [Vec<f64>; 4] {
    let (mut o, mut dq, mut dk, mut dv) = (
        vec![0.0; heads * sq * d],
        vec![0.0; heads * sq * d],
        vec![0.0; heads * skv * d],
        vec![0.0; heads * skv * d],
    );
    for hd in 0..heads {
        let (qh, kh, vh) = (&q[hd * sq * d..], &k[hd * skv * d..], &v[hd * skv * d..]);
        let (doh, mh) = (&d_o[hd * sq * d..], &mask[hd * sq * skv..]);
        for i in 0..sq {
            let s: Vec<f64> = (0..skv)
                .map(|j| (0..d).map(|c| qh[i * d + c] * kh[j * d + c]).sum::<f64>() * scale)
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
            let pd: Vec<f64> = (0..skv).map(|j| p[j] * mh[i * skv + j] / keep).collect();
            // dP of the dropped probabilities, then through the mask to P.
            let dpd: Vec<f64> = (0..skv)
                .map(|j| (0..d).map(|c| doh[i * d + c] * vh[j * d + c]).sum::<f64>())
                .collect();
            let dp: Vec<f64> = (0..skv).map(|j| dpd[j] * mh[i * skv + j] / keep).collect();
            let row: f64 = (0..skv).map(|j| dp[j] * p[j]).sum();
            for j in 0..skv {
                let ds = p[j] * (dp[j] - row) * scale;
                for c in 0..d {
                    o[(hd * sq + i) * d + c] += pd[j] * vh[j * d + c];
                    dv[(hd * skv + j) * d + c] += pd[j] * doh[i * d + c];
                    dq[(hd * sq + i) * d + c] += ds * kh[j * d + c];
                    dk[(hd * skv + j) * d + c] += ds * qh[i * d + c];
                }
            }
        }
    }
    [o, dq, dk, dv]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_dropout_mask_reproduces_and_gradients_match_f64_reference() {
    let s = Device::new(0).expect("this test needs a CUDA GPU").stream().clone();
    let mut rng = SplitMix64::new(59);
    let packed = |dims: &[i64]| strides(dims, Layout::Nchw);
    let mut report = Vec::new();
    for (dtype, (b, h, sq, skv, d), probability) in [
        (DataType::BF16, (2, 3, 64, 80, 64), 0.1f32),
        (DataType::F16, (1, 2, 96, 96, 32), 0.3),
    ] {
        let (qd, kd, od) = ([b, h, sq, d], [b, h, skv, d], [b, h, sq, d]);
        let md = [b, h, sq, skv];
        let (q, k, v) = (
            random(&s, &mut rng, &qd, &packed(&qd), dtype),
            random(&s, &mut rng, &kd, &packed(&kd), dtype),
            random(&s, &mut rng, &kd, &packed(&kd), dtype),
        );
        let d_o = random(&s, &mut rng, &od, &packed(&od), dtype);
        let one = [1i64; 4];
        let seed = upload(&s, &[1234.0], &one, &one, DataType::I64);
        let offsets = [
            upload(&s, &[7.0], &one, &one, DataType::I64),
            upload(&s, &[8.0], &one, &one, DataType::I64),
        ];
        let other_seed = upload(&s, &[4321.0], &one, &one, DataType::I64);
        let scale = 1.0 / (d as f64).sqrt();
        let label = format!("{dtype:?} q{qd:?} k{kd:?} p {probability}");
        let forward = |seed: &integration_tests::DevTensor, offset: &integration_tests::DevTensor| {
            let o = poisoned(&s, &od, &packed(&od), dtype);
            let st = poisoned(&s, &[b, h, sq, 1], &packed(&[b, h, sq, 1]), DataType::F32);
            let mask = poisoned(&s, &md, &packed(&md), DataType::F32);
            let drop = AttentionDropout {
                probability,
                seed: &seed.t,
                offset: &offset.t,
            };
            ops::sdpa_forward_dropout(
                &s,
                &q.t,
                &k.t,
                &v.t,
                None,
                false,
                &o.m,
                scale as f32,
                Some(&st.m),
                &drop,
                Some(&mask.m),
            )
            .unwrap_or_else(|e| panic!("{label} forward: {e}"));
            (o, st, mask)
        };
        let (o, st, mask) = forward(&seed, &offsets[0]);
        let (_, _, again) = forward(&seed, &offsets[0]);
        let (_, _, next_offset) = forward(&seed, &offsets[1]);
        let (_, _, other) = forward(&other_seed, &offsets[0]);
        let m = download(&s, &mask);
        assert!(
            m.iter().all(|&x| x == 0.0 || x == 1.0),
            "{label}: mask values other than 0 and 1"
        );
        let dropped = m.iter().filter(|&&x| x == 0.0).count() as f64 / m.len() as f64;
        // Over tens of thousands of draws the rate is within a few hundredths of p.
        assert!(
            (dropped - f64::from(probability)).abs() < 0.02,
            "{label}: dropped {dropped:.4}"
        );
        assert_eq!(
            download(&s, &again),
            m,
            "{label}: the same seed and offset gave another mask"
        );
        // Two independent masks differ in 2p(1 - p) of their elements.
        let differ = |t| download(&s, t).iter().zip(&m).filter(|(a, b)| a != b).count() as f64 / m.len() as f64;
        let expected = 2.0 * f64::from(probability) * (1.0 - f64::from(probability));
        let other_seed_differ = differ(&other);
        assert!(
            (other_seed_differ - expected).abs() < 0.03,
            "{label}: another seed changed {other_seed_differ:.4} of the mask (independent: {expected:.4})"
        );
        // cuDNN's Philox offset moves the draws along the counter: the next offset is another
        // mask, not an independent one (callers draw a fresh seed per call).
        let next_offset_differ = differ(&next_offset);
        assert!(next_offset_differ > 0.0, "{label}: another offset gave the same mask");
        report.push(format!(
            "{label}: another seed changed {other_seed_differ:.4} of the mask, the next offset {next_offset_differ:.4}"
        ));

        let (dq, dk, dv) = (
            poisoned(&s, &qd, &packed(&qd), dtype),
            poisoned(&s, &kd, &packed(&kd), dtype),
            poisoned(&s, &kd, &packed(&kd), dtype),
        );
        let args = ops::SdpaBackward {
            q: &q.t,
            k: &k.t,
            v: &v.t,
            o: &o.t,
            d_o: &d_o.t,
            stats: &st.t,
            bias: None,
            dq: &dq.m,
            dk: &dk.m,
            dv: &dv.m,
            d_bias: None,
            dropout: Some(AttentionDropout {
                probability,
                seed: &seed.t,
                offset: &offsets[0].t,
            }),
        };
        ops::sdpa_backward(&s, &args, false, scale as f32).unwrap_or_else(|e| panic!("{label} backward: {e}"));
        let keep = 1.0 - f64::from(probability);
        let dims = [(b * h) as usize, sq as usize, skv as usize, d as usize];
        let want = reference(&q.values, &k.values, &v.values, &d_o.values, &m, dims, scale, keep);
        let tol = if dtype == DataType::BF16 { 3e-2 } else { 1e-2 };
        for (name, got, want) in [
            ("o", &o, &want[0]),
            ("dq", &dq, &want[1]),
            ("dk", &dk, &want[2]),
            ("dv", &dv, &want[3]),
        ] {
            let err = cpu::rel_l2_error(&download(&s, got), want);
            report.push(format!("{label} {name}: rel L2 {err:.2e}"));
            assert!(err <= tol, "{label} {name}: rel L2 error {err:.3e} > {tol:.0e}");
        }
    }
    println!("attention dropout:\n  {}", report.join("\n  "));
}
