//! The fuser shared by the fixed-sequence patterns (the composed linear weight gradient and
//! forward, the composed dynamic quantization): a [`Stage`] machine that takes the operations
//! one at a time and either advances or breaks, ready once a whole sequence matched. A stage
//! may go on past a complete match (an optional tail, such as an activation after the linear
//! forward): if the tail then breaks, the fuser offers the last complete match.

use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::OperationIr;

use crate::burn::fusion::engine::run::status_of;
use crate::burn::fusion::CudnnOptimization;

/// Where a fixed-sequence match stands.
pub(crate) trait Stage: Clone + Default + std::fmt::Debug + Send + Sync + 'static {
    /// The optimization of a complete match.
    type Optimization;

    /// The stage after `op` (`ops`: the operations matched before it), or `None` when `op`
    /// breaks the pattern.
    fn step(&self, op: &OperationIr, ops: &[OperationIr]) -> Option<Self>;

    /// The whole pattern matched.
    fn done(&self) -> bool;

    /// A complete match that may still grow (an optional tail may follow).
    fn extends(&self) -> bool {
        false
    }

    /// The optimization of the complete match of `ops` (called only when [`done`](Self::done)).
    fn optimization(&self, ops: &[OperationIr]) -> Self::Optimization;

    /// [`optimization`](Self::optimization) as the backend's optimization enum.
    fn wrap(optimization: Self::Optimization) -> CudnnOptimization;
}

/// Matches one fixed sequence of operations ([`Stage`] `S`); closes at its first mismatch
/// or once the sequence is complete and cannot grow.
#[derive(Clone, Debug, Default)]
pub(crate) struct StagedFuser<S> {
    stage: S,
    ops: Vec<OperationIr>,
    closed: bool,
    /// The last complete match and how many operations it covers.
    last_done: Option<(S, usize)>,
}

impl<S: Stage> StagedFuser<S> {
    /// The optimization of `ops` (a saved state) when they are exactly one complete match.
    pub(crate) fn matched(ops: &[OperationIr]) -> Option<S::Optimization> {
        let mut f = Self::default();
        for op in ops {
            f.fuse(op);
        }
        match &f.last_done {
            Some((stage, n)) if *n == ops.len() => Some(stage.optimization(ops)),
            _ => None,
        }
    }

    /// The optimization of the last complete match, if any.
    pub(crate) fn complete(&self) -> Option<S::Optimization> {
        self.last_done
            .as_ref()
            .map(|(stage, n)| stage.optimization(&self.ops[..*n]))
    }
}

impl<S: Stage> OperationFuser<CudnnOptimization> for StagedFuser<S> {
    fn fuse(&mut self, op: &OperationIr) {
        if self.closed {
            return;
        }
        match self.stage.step(op, &self.ops) {
            Some(stage) => {
                self.ops.push(op.clone());
                if stage.done() {
                    self.last_done = Some((stage.clone(), self.ops.len()));
                }
                self.closed = stage.done() && !stage.extends();
                self.stage = stage;
            }
            None => {
                // A tail that broke off: back to the last complete match's operations.
                self.closed = true;
                if let Some((_, n)) = self.last_done {
                    self.ops.truncate(n);
                }
            }
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
        let matched = self.last_done.as_ref().map_or(0, |(_, n)| *n);
        FuserProperties {
            // Beats an elementwise run over part of the same operations.
            score: 2 * matched as u64,
            ready: self.last_done.is_some(),
        }
    }

    fn len(&self) -> usize {
        self.ops.len()
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CudnnOptimization>> {
        Box::new(self.clone())
    }
}
