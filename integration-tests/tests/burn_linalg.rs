//! `burn::tensor::linalg::det` on `Cudnn`, repeated: every call on the same input must return
//! the same bits, and match burn-ndarray. Small enough to run under compute-sanitizer's
//! racecheck and initcheck (the conformance suite's `linalg` group covers more cases, too
//! many for racecheck). The same determinants are also computed while another thread keeps the
//! device busy with new cuDNN plans, workspaces and buffer-cache releases.
//!
//! ```sh
//! cargo test -p integration-tests --test burn_linalg -- --ignored
//! cargo test -p integration-tests --features burn-selfcheck --test burn_linalg
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use integration_tests::burn_ref::{Nd, Rng};

/// The backend under test.
#[cfg(not(feature = "burn-selfcheck"))]
type Tested = cudnn_backend::burn::Cudnn;
/// Self-check: the reference against itself.
#[cfg(feature = "burn-selfcheck")]
type Tested = Nd;

const N: usize = 20;
const REPEATS: usize = 24;

/// Integers in `[-4, 4]` with the last row the sum of the first two (exactly singular), or a
/// well-conditioned `I + U(-0.5, 0.5) / n`.
fn matrix(rng: &mut Rng, singular: bool) -> Vec<f32> {
    let mut m: Vec<f32> = (0..N * N)
        .map(|i| {
            if singular {
                (rng.unit() * 9.0).floor() as f32 - 4.0
            } else {
                let eye = if i / N == i % N { 1.0 } else { 0.0 };
                eye + ((rng.unit() - 0.5) / N as f64) as f32
            }
        })
        .collect();
    if singular {
        for j in 0..N {
            m[(N - 1) * N + j] = m[j] + m[N + j];
        }
    }
    m
}

fn det_bits<B: Backend>(values: &[f32]) -> Vec<u32> {
    let dev = Default::default();
    let t = Tensor::<B, 3>::from_data(TensorData::new(values.to_vec(), [1, N, N]), &dev);
    let d = burn::tensor::linalg::det::<B, 3, 2, 1>(t);
    d.into_data()
        .to_vec::<f32>()
        .expect("f32 determinant")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// The six determinants, each computed [`REPEATS`] times: every call returns the first
/// call's bits, and that value matches burn-ndarray's.
fn check_repeated_determinants() {
    let mut rng = Rng::new(0xde7);
    for case in 0..6 {
        let singular = case % 2 == 0;
        let m = matrix(&mut rng, singular);
        let want = det_bits::<Nd>(&m);
        let first = det_bits::<Tested>(&m);
        for k in 1..REPEATS {
            let again = det_bits::<Tested>(&m);
            assert_eq!(
                again,
                first,
                "case {case} (singular {singular}): call {k} returned {:?}, the first {:?}",
                again.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>(),
                first.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>()
            );
        }
        let (g, w) = (f32::from_bits(first[0]) as f64, f32::from_bits(want[0]) as f64);
        // The LU path multiplies exactly (one rounding per product), like ndarray: equal up
        // to the order of a few f32 additions; singular inputs give the same (tiny or 0) value.
        let tol = 1e-3 * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= tol,
            "case {case} (singular {singular}): det {g} vs ndarray {w}"
        );
    }
}

#[test]
#[cfg_attr(not(feature = "burn-selfcheck"), ignore = "needs a CUDA GPU")]
fn det_is_bitwise_repeatable_and_matches_ndarray() {
    check_repeated_determinants();
}

/// Work on the same device from another thread while the determinants run: matmuls and
/// convolutions of changing shapes (new cuDNN plans, workspaces), reductions, and Burn's
/// `memory_cleanup` (the tensor buffer cache released), until `stop` is set (at least one
/// round).
fn background_load(stop: &AtomicBool) {
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::ConvOptions;
    let dev = Default::default();
    let mut rng = Rng::new(0x10ad);
    let mut values = |len: usize| (0..len).map(|_| rng.unit() as f32 - 0.5).collect::<Vec<_>>();
    for round in 0.. {
        let n = 64 + 32 * (round % 7);
        let a = Tensor::<Tested, 2>::from_data(TensorData::new(values(n * n), [n, n]), &dev);
        let b = Tensor::<Tested, 2>::from_data(TensorData::new(values(n * n), [n, n]), &dev);
        let c = a.matmul(b).sum_dim(1);
        let x = Tensor::<Tested, 4>::from_data(TensorData::new(values(4 * 8 * n), [4, 8, n / 8, 8]), &dev);
        let w = Tensor::<Tested, 4>::from_data(TensorData::new(values(16 * 8 * 9), [16, 8, 3, 3]), &dev);
        let y = conv2d(x, w, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1)).mean();
        // Read back, so the work is done before the buffers go back to the cache.
        let _ = (c.into_data(), y.into_data());
        if round % 3 == 2 {
            <Tested as Backend>::memory_cleanup(&dev);
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
    }
}

/// Sets its flag when dropped: the load thread stops when the checks end, passing or not.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
#[cfg_attr(not(feature = "burn-selfcheck"), ignore = "needs a CUDA GPU")]
fn det_is_bitwise_repeatable_beside_other_work_on_the_device() {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| background_load(&stop));
        let _stop = StopOnDrop(&stop);
        check_repeated_determinants();
    });
}
