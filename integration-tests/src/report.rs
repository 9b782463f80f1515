//! The check tally the GPU kernel tests share: counts checks, keeps the worst error (and the
//! most exact-comparison mismatches) per dtype, collects failures, and prints one summary
//! line before panicking with every failure.

use std::fmt::Display;

use cudnn_backend::graph::DataType;
use cudnn_backend_reference::rel_l2_error;

/// Results of one kernel test: a count of checks, the worst error and the most mismatches
/// per dtype, and the failures.
pub struct KernelReport {
    family: &'static str,
    name: &'static str,
    runs: usize,
    worst: Vec<(DataType, f64)>,
    mismatches: Vec<(DataType, usize)>,
    failures: Vec<String>,
}

impl KernelReport {
    /// An empty report; `family` (the kernel module: "conv", "pool", ...) and `name` head the
    /// summary line.
    pub fn new(family: &'static str, name: &'static str) -> Self {
        Self {
            family,
            name,
            runs: 0,
            worst: Vec::new(),
            mismatches: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// One check of an error measure: fails when `err` is NaN or above `limit`; `err` counts
    /// towards the worst of `dtype` (a NaN only where it is the first). `what` names the
    /// measure in the failure ("rel L2 error", ...).
    pub fn record(&mut self, case: String, dtype: DataType, err: f64, limit: f64, what: &str) {
        self.runs += 1;
        match self.worst.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, w)) => *w = w.max(err),
            None => self.worst.push((dtype, err)),
        }
        if err.is_nan() || err > limit {
            self.failures.push(format!("{case}: {what} {err:.3e} > {limit:.0e}"));
        }
    }

    /// Relative L2 error of `out` against `reference` within `limit` (different lengths
    /// fail, as a NaN error).
    pub fn close(&mut self, case: String, dtype: DataType, out: &[f64], reference: &[f64], limit: f64) {
        let err = if out.len() == reference.len() {
            rel_l2_error(out, reference)
        } else {
            f64::NAN
        };
        self.record(case, dtype, err, limit, "rel L2 error");
    }

    /// Exact equality, where NaN equals NaN (NaN propagation is checked by value, while a
    /// poisoned non-NaN value shows as a mismatch). Different lengths fail.
    pub fn exact(&mut self, case: String, dtype: DataType, out: &[f64], reference: &[f64]) {
        self.compare(case, dtype, out, reference, |o, r| o == r || (o.is_nan() && r.is_nan()));
    }

    /// Exact equality, where NaN equals nothing, NaN included: an output left NaN-poisoned
    /// (unwritten) never matches. Different lengths fail.
    pub fn exact_strict(&mut self, case: String, dtype: DataType, out: &[f64], reference: &[f64]) {
        self.compare(case, dtype, out, reference, |o, r| o == r);
    }

    fn compare(&mut self, case: String, dtype: DataType, out: &[f64], reference: &[f64], same: fn(f64, f64) -> bool) {
        self.runs += 1;
        let differ = |(o, r): (&f64, &f64)| !same(*o, *r);
        let mismatches = out.iter().zip(reference).filter(|&p| differ(p)).count();
        match self.mismatches.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, m)) => *m = (*m).max(mismatches),
            None => self.mismatches.push((dtype, mismatches)),
        }
        if out.len() != reference.len() {
            self.failures
                .push(format!("{case}: {} values, expected {}", out.len(), reference.len()));
        } else if let Some(i) = out.iter().zip(reference).position(differ) {
            self.failures.push(format!(
                "{case}: {mismatches} mismatches, first at {i}: got {} expected {}",
                out[i], reference[i]
            ));
        }
    }

    /// A check that failed with error `e`.
    pub fn error(&mut self, case: String, e: impl Display) {
        self.runs += 1;
        self.failures.push(format!("{case}: {e}"));
    }

    /// A check that failed; `case` is the whole message.
    pub fn fail(&mut self, case: String) {
        self.runs += 1;
        self.failures.push(case);
    }

    /// A failure that adds no check (a further finding of a check counted elsewhere, or one
    /// about the test as a whole); `message` is the whole message.
    pub fn note_failure(&mut self, message: String) {
        self.failures.push(message);
    }

    /// A check that passed.
    pub fn pass(&mut self) {
        self.runs += 1;
    }

    /// Prints the summary line and panics listing the failures, if any.
    pub fn finish(self) {
        let worst: Vec<String> = self
            .worst
            .iter()
            .map(|(d, e)| format!("{d:?} {e:.2e}"))
            .chain(self.mismatches.iter().map(|(d, n)| format!("{d:?} {n} mismatches")))
            .collect();
        println!(
            "{} {}: {} checks, {} failed, worst {}",
            self.family,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(r: &KernelReport) -> (usize, usize) {
        (r.runs, r.failures.len())
    }

    #[test]
    fn record_and_close() {
        let mut r = KernelReport::new("t", "record");
        r.record("a".into(), DataType::F32, 1e-7, 1e-6, "rel L2 error");
        r.record("b".into(), DataType::F32, 2e-6, 1e-6, "adjoint mismatch");
        r.record("c".into(), DataType::F32, f64::NAN, 1e-6, "rel L2 error");
        assert_eq!(counts(&r), (3, 2));
        assert_eq!(r.worst, vec![(DataType::F32, 2e-6)]);
        assert_eq!(r.failures[0], "b: adjoint mismatch 2.000e-6 > 1e-6");
        r.close("d".into(), DataType::F16, &[1.0, 2.0], &[1.0, 2.0], 1e-3);
        r.close("e".into(), DataType::F16, &[1.0], &[1.0, 2.0], 1e-3);
        assert_eq!(counts(&r), (5, 3));
        assert!(r.failures[2].starts_with("e: rel L2 error NaN"));
    }

    #[test]
    fn exact_and_exact_strict() {
        let nan = f64::NAN;
        let mut r = KernelReport::new("t", "exact");
        r.exact("a".into(), DataType::F32, &[1.0, nan], &[1.0, nan]);
        assert_eq!(counts(&r), (1, 0));
        r.exact_strict("b".into(), DataType::F32, &[1.0, nan], &[1.0, nan]);
        assert_eq!(counts(&r), (2, 1));
        assert_eq!(r.failures[0], "b: 1 mismatches, first at 1: got NaN expected NaN");
        r.exact("c".into(), DataType::I64, &[1.0], &[1.0, 2.0]);
        assert_eq!(r.failures[1], "c: 1 values, expected 2");
        assert_eq!(r.mismatches, vec![(DataType::F32, 1), (DataType::I64, 0)]);
    }

    #[test]
    fn counts_and_finish() {
        let mut r = KernelReport::new("t", "counts");
        r.pass();
        r.error("a".into(), "boom");
        r.fail("b".into());
        r.note_failure("c".into());
        assert_eq!(counts(&r), (3, 3));
        assert_eq!(r.failures, ["a: boom", "b", "c"]);
        let panic = std::panic::catch_unwind(move || r.finish()).expect_err("failures panic");
        assert_eq!(crate::panic_message(&*panic), "counts failures:\na: boom\nb\nc");
        KernelReport::new("t", "clean").finish();
    }
}
