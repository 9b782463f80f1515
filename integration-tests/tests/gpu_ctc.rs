//! The CTC kernels (`cudnn_backend::kernels::ctc`) against the float64 reference
//! (`cudnn_backend_reference::ctc_loss` / `ctc_loss_backward`) in every float dtype: losses
//! and gradients for mixed input lengths, repeated labels, an empty target, an unreachable
//! target, a blank other than 0 and transposed log-probabilities; outputs poisoned first; the
//! gradient bit-identical across repeated calls. Needs a CUDA GPU.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::kernels::ctc::{ctc_backward, ctc_forward, workspace_dims, CtcInputs, WORKSPACE_DTYPE};
use cudnn_backend::types::{row_major_strides, TensorRef};
use cudnn_backend::Device;
use cudnn_backend_reference::{ctc_loss, ctc_loss_backward, rel_l2_error, SplitMix64};
use integration_tests::ctc::{ctc_cases, ctc_log_probs, CtcCase};
use integration_tests::{bound, download, poisoned, upload, views_of};

use DataType::*;

fn stream() -> Arc<CudaStream> {
    Device::new(0).expect("these tests need a CUDA GPU").stream().clone()
}

/// An I64 device tensor.
struct Ints {
    t: TensorRef<'static>,
    _buf: CudaSlice<u8>,
}

fn ints(stream: &Arc<CudaStream>, v: &[i64], dims: &[i64]) -> Ints {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let buf = stream.clone_htod(&bytes).expect("upload");
    // SAFETY: the view is dropped with the buffer (same struct) and used on `stream` only.
    let (t, _) = unsafe { views_of(stream, &buf, 0, dims, &row_major_strides(dims), I64) };
    Ints { t, _buf: buf }
}

/// The shared cases plus an unreachable target (five repeats of one label need nine steps;
/// the sample has six) and a long problem.
fn cases() -> Vec<CtcCase> {
    let mut rng = SplitMix64::new(11);
    let (n, s) = (8usize, 40usize);
    let long_targets: Vec<i64> = (0..n * s).map(|_| 1 + rng.below(29) as i64).collect();
    let mut all = ctc_cases();
    all.push(CtcCase {
        name: "an unreachable target next to a reachable one",
        dims: [6, 2, 4],
        targets: vec![1, 2, 3, 0, 0, 1, 1, 1, 1, 1],
        input_lengths: vec![6, 6],
        target_lengths: vec![3, 5],
        blank: 0,
    });
    all.push(CtcCase {
        name: "T 200, N 8, C 30, S 40",
        dims: [200, n, 30],
        targets: long_targets,
        input_lengths: (0..n as i64).map(|i| 200 - 13 * i).collect(),
        target_lengths: (0..n as i64).map(|i| 40 - 3 * i).collect(),
        blank: 0,
    });
    all
}

/// Max relative error of the losses (equal infinities match).
fn loss_error(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if w.is_infinite() && g == w {
                0.0
            } else {
                (g - w).abs() / w.abs().max(1.0)
            }
        })
        .fold(0.0, |a: f64, e| if e.is_nan() { f64::INFINITY } else { a.max(e) })
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ctc_matches_the_float64_reference() {
    let s = stream();
    let mut failures = Vec::new();
    for (k, case) in cases().iter().enumerate() {
        let [t, n, c] = case.dims;
        let lp = ctc_log_probs(case.dims, 40 + k as u64, 3.0);
        let grad_loss: Vec<f64> = (0..n).map(|i| 0.5 + 0.125 * i as f64).collect();
        let max_target = case.max_target_len();
        for dtype in [F32, F16, BF16, F64] {
            for transposed in [false, true] {
                let dims = [t as i64, n as i64, c as i64];
                // Transposed: stored [N, T, C] and viewed as [T, N, C].
                let strides = if transposed {
                    vec![c as i64, (t * c) as i64, 1]
                } else {
                    row_major_strides(&dims).to_vec()
                };
                let lp_dev = upload(&s, &lp, &dims, &strides, dtype);
                // The reference sees the values the GPU sees (rounded to the dtype).
                let problem = case.problem(&lp_dev.values);
                let gl_dev = upload(&s, &grad_loss, &[n as i64], &[1], dtype);
                let gl_values = gl_dev.values.clone();
                let want_loss = ctc_loss(&problem);
                let want_grad = ctc_loss_backward(&problem, &gl_values);
                let tg = ints(&s, &case.targets, &[n as i64, max_target as i64]);
                let il = ints(&s, &case.input_lengths, &[n as i64]);
                let tl = ints(&s, &case.target_lengths, &[n as i64]);
                let inputs = CtcInputs {
                    log_probs: &lp_dev.t,
                    targets: &tg.t,
                    input_lengths: &il.t,
                    target_lengths: &tl.t,
                    blank: case.blank,
                };
                let acc = WORKSPACE_DTYPE;
                let work = workspace_dims(&inputs);
                let alpha = poisoned(&s, &work, &row_major_strides(&work), acc);
                let beta = poisoned(&s, &work, &row_major_strides(&work), acc);
                let nll = poisoned(&s, &[n as i64], &[1], acc);
                let grads: Vec<Vec<f64>> = (0..2)
                    .map(|_| {
                        let g = poisoned(&s, &dims, &row_major_strides(&dims), dtype);
                        ctc_forward(&s, &inputs, &alpha.m, &nll.m).expect("ctc_forward");
                        ctc_backward(&s, &inputs, &alpha.t, &nll.t, &gl_dev.t, &beta.m, &g.m).expect("ctc_backward");
                        download(&s, &g)
                    })
                    .collect();
                let loss = download(&s, &nll);
                let label = format!("{} {dtype:?}{}", case.name, if transposed { " transposed" } else { "" });
                // Everything runs in f64 from the dtype's values: the loss is f64-accurate
                // and the gradient carries only its final rounding to the dtype.
                let loss_bound = 1e-12;
                let grad_bound = match dtype {
                    F64 => 1e-12,
                    F32 => 1e-6,
                    d => bound(d),
                };
                let le = loss_error(&loss, &want_loss);
                let ge = rel_l2_error(&grads[0], &want_grad);
                if !(le <= loss_bound && ge <= grad_bound) {
                    failures.push(format!("{label}: loss error {le:.2e} (bound {loss_bound:.0e}), gradient rel L2 {ge:.2e} (bound {grad_bound:.0e})"));
                }
                if grads[0].iter().zip(&grads[1]).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    failures.push(format!("{label}: the gradient changed between two identical calls"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ctc_rejects_inconsistent_operands() {
    let s = stream();
    let lp = upload(
        &s,
        &ctc_log_probs([4, 2, 5], 1, 3.0),
        &[4, 2, 5],
        &row_major_strides(&[4, 2, 5]),
        F32,
    );
    let tg = ints(&s, &[1, 2, 3, 4], &[2, 2]);
    let il = ints(&s, &[4, 4], &[2]);
    let inputs = CtcInputs {
        log_probs: &lp.t,
        targets: &tg.t,
        input_lengths: &il.t,
        target_lengths: &il.t,
        blank: 0,
    };
    let nll = poisoned(&s, &[2], &[1], F64);
    let short = poisoned(&s, &[4, 2, 4], &row_major_strides(&[4, 2, 4]), F64);
    let err = ctc_forward(&s, &inputs, &short.m, &nll.m).expect_err("a workspace of the wrong size");
    assert!(err.to_string().contains("log_alpha"), "{err}");
    let single = poisoned(&s, &[4, 2, 5], &row_major_strides(&[4, 2, 5]), F32);
    let err = ctc_forward(&s, &inputs, &single.m, &nll.m).expect_err("a workspace of the wrong dtype");
    assert!(err.to_string().contains("log_alpha"), "{err}");
    let bad_blank = CtcInputs { blank: 5, ..inputs };
    let alpha = poisoned(&s, &[4, 2, 5], &row_major_strides(&[4, 2, 5]), F64);
    let err = ctc_forward(&s, &bad_blank, &alpha.m, &nll.m).expect_err("blank out of range");
    assert!(err.to_string().contains("blank"), "{err}");
}
