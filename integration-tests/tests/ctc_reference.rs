//! The float64 CTC reference (`cudnn_backend_reference::ctc_loss` / `ctc_loss_backward`, which
//! the GPU kernels mirror) against Burn's own definition on burn-ndarray: the loss of
//! `ctc_loss_default` and its gradient through `Autodiff<NdArray>`. No GPU needed.

use burn_backend::ops::ModuleOps;
use burn_backend::ops::{FloatTensorOps, IntTensorOps};
use burn_backend::{read_sync, AutodiffBackend, TensorData};
use cudnn_backend_reference::{ctc_loss, ctc_loss_backward, rel_l2_error, CtcProblem};
use integration_tests::ctc::{ctc_cases, ctc_log_probs, CtcCase};

type Nd = burn_ndarray::NdArray<f32>;
type Ad = burn_autodiff::Autodiff<Nd>;

/// Log-probabilities of a case, rounded to f32 (what ndarray sees).
fn log_probs(dims: [usize; 3], seed: u64) -> Vec<f64> {
    ctc_log_probs(dims, seed, 2.0)
        .iter()
        .map(|&x| x as f32 as f64)
        .collect()
}

fn values(d: TensorData) -> Vec<f64> {
    d.convert::<f64>().to_vec::<f64>().expect("f64 values")
}

/// Burn's loss and the gradient of `sum(loss * grad_loss)` w.r.t. `log_probs`.
fn burn_reference(case: &CtcCase, lp: &[f64], grad_loss: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let dev = Default::default();
    let [_, n, _] = case.dims;
    let s = case.targets.len() / n;
    let f = |v: &[f64], shape: Vec<usize>| {
        Ad::float_from_data(
            TensorData::new(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape),
            &dev,
        )
    };
    let i = |v: &[i64], shape: Vec<usize>| Ad::int_from_data(TensorData::new(v.to_vec(), shape), &dev);
    let lp_t = Ad::float_set_require_grad(f(lp, case.dims.to_vec()), true);
    let loss = Ad::ctc_loss(
        lp_t.clone(),
        i(&case.targets, vec![n, s]),
        i(&case.input_lengths, vec![n]),
        i(&case.target_lengths, vec![n]),
        case.blank as usize,
    );
    let loss_values = values(read_sync(Nd::float_into_data(Ad::inner(loss.clone()))).expect("read"));
    let objective = Ad::float_sum(Ad::float_mul(loss, f(grad_loss, vec![n])));
    let grads = Ad::backward(objective);
    let grad = Ad::grad(&lp_t, &grads).expect("a gradient for log_probs");
    (loss_values, values(read_sync(Nd::float_into_data(grad)).expect("read")))
}

#[test]
fn ctc_reference_matches_burns_loss_and_autodiff_gradient() {
    for (k, case) in ctc_cases().iter().enumerate() {
        let [t, n, c] = case.dims;
        let lp = log_probs(case.dims, 100 + k as u64);
        let grad_loss: Vec<f64> = (0..n).map(|i| 0.5 + 0.25 * i as f64).collect();
        let problem = case.problem(&lp);
        let (want_loss, want_grad) = burn_reference(case, &lp, &grad_loss);
        let loss = ctc_loss(&problem);
        let grad = ctc_loss_backward(&problem, &grad_loss);
        assert!(loss.iter().all(|l| l.is_finite()), "{}: {loss:?}", case.name);
        let e = rel_l2_error(&loss, &want_loss);
        assert!(
            e < 1e-5,
            "{}: loss {loss:?} vs Burn {want_loss:?} (rel L2 {e:.2e})",
            case.name
        );
        assert_eq!(grad.len(), t * n * c);
        // Burn's gradient is computed in f32 with reductions whose order follows ndarray's
        // thread split, so it moves by a few 1e-5 from run to run.
        let e = rel_l2_error(&grad, &want_grad);
        assert!(
            e < 1e-4,
            "{}: gradient rel L2 {e:.2e} against Autodiff<NdArray>",
            case.name
        );
    }
}

#[test]
fn unreachable_targets_have_infinite_loss_and_no_gradient() {
    // Three repeats of one label need five steps; the second sample has four.
    let dims = [6, 2, 4];
    let lp = log_probs(dims, 7);
    let problem = CtcProblem {
        log_probs: &lp,
        dims,
        targets: &[1, 2, 3, 1, 1, 1],
        max_target_len: 3,
        input_lengths: &[6, 4],
        target_lengths: &[3, 3],
        blank: 0,
    };
    let loss = ctc_loss(&problem);
    assert!(loss[0].is_finite() && loss[1] == f64::INFINITY, "{loss:?}");
    let grad = ctc_loss_backward(&problem, &[1.0, 1.0]);
    for t in 0..dims[0] {
        let row = &grad[(t * 2 + 1) * 4..(t * 2 + 2) * 4];
        assert!(row.iter().all(|&g| g == 0.0), "t {t}: {row:?}");
    }
    // Each step's gradient of a reachable sample sums to minus the step's total posterior
    // (one alignment position per step): -1 within the input length.
    for t in 0..6 {
        let sum: f64 = grad[t * 8..t * 8 + 4].iter().sum();
        assert!((sum + 1.0).abs() < 1e-9, "t {t}: {sum}");
    }
}
