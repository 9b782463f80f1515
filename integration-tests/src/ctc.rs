//! CTC test problems shared by the CPU check of the float64 reference (`ctc_reference`) and
//! the GPU kernel tests (`gpu_ctc`).

use cudnn_backend_reference::{CtcProblem, SplitMix64};

/// One batch: log-probabilities `[T, N, C]`, targets `[N, S]`, lengths, blank.
#[derive(Clone, Debug)]
pub struct CtcCase {
    /// What the case exercises.
    pub name: &'static str,
    /// `[T, N, C]`.
    pub dims: [usize; 3],
    /// Targets, row-major `[N, S]` (padded).
    pub targets: Vec<i64>,
    /// Input length of each sample.
    pub input_lengths: Vec<i64>,
    /// Target length of each sample.
    pub target_lengths: Vec<i64>,
    /// The blank class.
    pub blank: i64,
}

impl CtcCase {
    /// `S`, the padded target length.
    pub fn max_target_len(&self) -> usize {
        self.targets.len() / self.dims[1]
    }

    /// The reference's view of this case with `log_probs`.
    pub fn problem<'a>(&'a self, log_probs: &'a [f64]) -> CtcProblem<'a> {
        CtcProblem {
            log_probs,
            dims: self.dims,
            targets: &self.targets,
            max_target_len: self.max_target_len(),
            input_lengths: &self.input_lengths,
            target_lengths: &self.target_lengths,
            blank: self.blank,
        }
    }
}

/// Cases where every sample has an alignment: repeated labels, mixed input lengths (one
/// beyond T), runs of repeats, an empty target, a blank other than 0.
pub fn ctc_cases() -> Vec<CtcCase> {
    vec![
        CtcCase {
            name: "repeated label, input lengths 8 and 6",
            dims: [8, 2, 5],
            targets: vec![1, 2, 2, 3, 1, 0],
            input_lengths: vec![8, 6],
            target_lengths: vec![3, 2],
            blank: 0,
        },
        CtcCase {
            name: "mixed lengths, runs of repeats, an empty target",
            dims: [20, 4, 7],
            targets: vec![1, 1, 1, 2, 2, 3, 4, 3, 4, 3, 5, 6, 0, 0, 0, 2, 2, 0, 0, 0],
            input_lengths: vec![20, 13, 9, 4],
            target_lengths: vec![5, 5, 2, 0],
            blank: 0,
        },
        CtcCase {
            name: "blank last, an input length beyond T",
            dims: [12, 3, 6],
            targets: vec![0, 1, 2, 3, 3, 3, 4, 0, 4, 2, 0, 0],
            input_lengths: vec![12, 40, 7],
            target_lengths: vec![4, 3, 2],
            blank: 5,
        },
    ]
}

/// Log-softmax over the classes of seeded logits in `[-scale, scale)`.
pub fn ctc_log_probs(dims: [usize; 3], seed: u64, scale: f64) -> Vec<f64> {
    SplitMix64::new(seed)
        .fill(dims.iter().product())
        .chunks(dims[2])
        .flat_map(|row| {
            let m = row.iter().map(|x| scale * x).fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (scale * x - m).exp()).sum::<f64>().ln();
            row.iter().map(move |x| scale * x - lse).collect::<Vec<_>>()
        })
        .collect()
}
