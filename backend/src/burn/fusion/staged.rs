//! The fuser shared by the fixed-sequence patterns (the composed linear weight gradient, the
//! composed dynamic quantization): a [`Stage`] machine that takes the operations one at a time
//! and either advances or breaks, ready only when the whole sequence matched.

use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::OperationIr;

use super::optimization::{status_of, CudnnOptimization};

/// Where a fixed-sequence match stands.
pub(crate) trait Stage: Clone + Default + std::fmt::Debug + Send + Sync + 'static {
    /// The optimization of a complete match.
    type Optimization;

    /// The stage after `op` (`ops`: the operations matched before it), or `None` when `op`
    /// breaks the pattern.
    fn step(&self, op: &OperationIr, ops: &[OperationIr]) -> Option<Self>;

    /// The whole pattern matched.
    fn done(&self) -> bool;

    /// The optimization of the complete match of `ops` (called only when [`done`](Self::done)).
    fn optimization(&self, ops: &[OperationIr]) -> Self::Optimization;

    /// [`optimization`](Self::optimization) as the backend's optimization enum.
    fn wrap(optimization: Self::Optimization) -> CudnnOptimization;
}

/// Matches one fixed sequence of operations ([`Stage`] `S`); closes at its first mismatch
/// or once the sequence is complete.
#[derive(Clone, Debug, Default)]
pub(crate) struct StagedFuser<S> {
    stage: S,
    ops: Vec<OperationIr>,
    closed: bool,
}

impl<S: Stage> StagedFuser<S> {
    /// The optimization of `ops` (a saved state) when they are exactly one complete match.
    pub(crate) fn matched(ops: &[OperationIr]) -> Option<S::Optimization> {
        let mut f = Self::default();
        for op in ops {
            f.fuse(op);
        }
        (f.stage.done() && f.ops.len() == ops.len()).then(|| f.stage.optimization(&f.ops))
    }

    /// The optimization of the match so far, when it is complete.
    pub(crate) fn complete(&self) -> Option<S::Optimization> {
        self.stage.done().then(|| self.stage.optimization(&self.ops))
    }
}

impl<S: Stage> OperationFuser<CudnnOptimization> for StagedFuser<S> {
    fn fuse(&mut self, op: &OperationIr) {
        if self.closed {
            return;
        }
        match self.stage.step(op, &self.ops) {
            Some(stage) => {
                self.closed = stage.done();
                self.stage = stage;
                self.ops.push(op.clone());
            }
            None => self.closed = true,
        }
    }

    fn finish(&mut self) -> CudnnOptimization {
        match self.complete() {
            Some(o) => S::wrap(o),
            None => panic!("cudnn-backend: internal error: an incomplete pattern match was finished"),
        }
    }

    fn reset(&mut self) {
        *self = Self::default();
    }

    fn status(&self) -> FuserStatus {
        status_of(self.closed)
    }

    fn properties(&self) -> FuserProperties {
        let done = self.stage.done();
        FuserProperties {
            // Beats an elementwise run over part of the same operations.
            score: if done { 2 * self.ops.len() as u64 } else { 0 },
            ready: done,
        }
    }

    fn len(&self) -> usize {
        self.ops.len()
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CudnnOptimization>> {
        Box::new(self.clone())
    }
}
