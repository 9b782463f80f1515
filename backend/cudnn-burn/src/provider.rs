//! The fusion provider registered with Burn's CUDA backend: a fuser that claims single nodes
//! the engine runs ([`Claim`]: convolutions, pooling, the embedding gradient's row adds), and
//! the operation that runs them on the engine (or Burn's implementation through the fallback
//! when the engine cannot).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use burn_cubecl::fusion::{
    CubeFuser, CubeFusionHandle, CubeOptimization, CubeOptimizationState, FallbackOperation, FusedOperation,
    OptimizationProvider,
};
use burn_cubecl::CubeDevice;
use burn_fusion::stream::Context;
use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::OperationIr;

use crate::claim::Claim;
use crate::execute::{cuda_ordinal, execute};
use crate::ordering::Orderings;
use crate::stats::{Counters, Event};

/// The name the provider is registered under.
pub const NAME: &str = "CudnnBurn";

/// The score of a claimed node. The built-in fusers close on a convolution or pooling node
/// with nothing fused (score 0), and the fusion search keeps the strictly highest ready
/// score, so any score above 0 wins those blocks.
pub const SCORE: u64 = 10;

/// What the provider, its fusers and its operations share.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) counters: Counters,
    pub(crate) orderings: Orderings,
    /// The operations whose fallback was already reported.
    warned: Mutex<BTreeSet<&'static str>>,
}

impl Shared {
    /// True the first time a claimed `op` falls back to Burn's implementation in this process:
    /// the fallback is logged once per operation, and counted every time.
    pub(crate) fn first_fallback(&self, op: &'static str) -> bool {
        self.warned.lock().unwrap_or_else(|e| e.into_inner()).insert(op)
    }
}

/// The provider [`crate::register`] registers.
pub(crate) struct CudnnProvider {
    pub(crate) shared: Arc<Shared>,
}

impl OptimizationProvider for CudnnProvider {
    type Operation = CudnnOperation;

    fn fuser(&self, device: &CubeDevice) -> CubeFuser {
        CubeFuser::new(NodeFuser {
            shared: self.shared.clone(),
            cuda: cuda_ordinal(device).is_some(),
            node: None,
            status: FuserStatus::Open,
        })
    }

    fn restore(&self, _device: &CubeDevice, state: &CubeOptimizationState) -> CubeOptimization {
        CubeOptimization::new(CudnnOperation::new(state.decode(), Some(self.shared.clone())))
    }
}

/// Takes a block's first operation when it is a node the engine runs, then closes: the
/// claimed segment is that one node.
#[derive(Clone)]
struct NodeFuser {
    shared: Arc<Shared>,
    /// Whether the fuser's stream is on a CUDA device (elsewhere it claims nothing).
    cuda: bool,
    /// The claimed node and its claim (made once, when the node is offered).
    node: Option<(OperationIr, Claim)>,
    status: FuserStatus,
}

impl OperationFuser<CubeOptimization> for NodeFuser {
    fn fuse(&mut self, operation: &OperationIr) {
        if self.status == FuserStatus::Closed {
            return;
        }
        if let Some(claim) = self.cuda.then(|| Claim::from_operation(operation).ok()).flatten() {
            self.shared.counters.bump(Event::Offered);
            self.node = Some((operation.clone(), claim));
        }
        self.status = FuserStatus::Closed;
    }

    fn finish(&mut self) -> CubeOptimization {
        self.shared.counters.bump(Event::Claimed);
        let (node, claim) = self.node.clone().unzip();
        CubeOptimization::new(CudnnOperation {
            node,
            claim,
            shared: Some(self.shared.clone()),
        })
    }

    fn reset(&mut self) {
        self.node = None;
        self.status = FuserStatus::Open;
    }

    fn status(&self) -> FuserStatus {
        self.status
    }

    fn properties(&self) -> FuserProperties {
        let ready = self.node.is_some();
        FuserProperties {
            score: if ready { SCORE } else { 0 },
            ready,
        }
    }

    fn len(&self) -> usize {
        usize::from(self.node.is_some())
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CubeOptimization>> {
        Box::new(self.clone())
    }
}

/// One claimed node. Its state (for Burn's serialized execution plans) is the IR node; an
/// operation restored without the provider's shared state runs Burn's implementation.
pub(crate) struct CudnnOperation {
    node: Option<OperationIr>,
    claim: Option<Claim>,
    shared: Option<Arc<Shared>>,
}

impl CudnnOperation {
    fn new(node: Option<OperationIr>, shared: Option<Arc<Shared>>) -> Self {
        let claim = node.as_ref().and_then(|n| Claim::from_operation(n).ok());
        Self { node, claim, shared }
    }
}

impl FusedOperation for CudnnOperation {
    const NAME: &'static str = NAME;
    type State = Option<OperationIr>;

    fn num_ops_fused(&self) -> usize {
        usize::from(self.node.is_some())
    }

    fn run(&mut self, context: &mut Context<CubeFusionHandle>, fallback: &dyn Fn(usize) -> Box<dyn FallbackOperation>) {
        if self.node.is_none() {
            return;
        }
        let ran = match (&self.claim, &self.shared) {
            (Some(claim), Some(shared)) => match execute(context, claim, shared) {
                Ok(()) => {
                    shared.counters.bump(Event::Ran(claim.name()));
                    true
                }
                Err(e) => {
                    if shared.first_fallback(claim.name()) {
                        tracing::warn!(
                            op = claim.name(),
                            error = %e,
                            "cudnn-burn: the engine could not run a claimed node, Burn's implementation \
                             runs it (later fallbacks of this operation are counted in cudnn_burn::stats())"
                        );
                    }
                    false
                }
            },
            _ => false,
        };
        if !ran {
            if let Some(shared) = &self.shared {
                shared.counters.bump(Event::Fallback);
            }
            // Nothing was consumed from the context: Burn's node runs as if unclaimed.
            fallback(0).run(context);
        }
    }

    fn to_state(&self) -> Self::State {
        self.node.clone()
    }

    fn from_state(_device: &CubeDevice, state: Self::State) -> Self {
        Self::new(state, None)
    }
}

#[cfg(test)]
mod tests {
    use super::Shared;

    #[test]
    fn a_fallback_is_reported_once_per_operation() {
        let shared = Shared::default();
        assert!(shared.first_fallback("conv_forward"));
        assert!(!shared.first_fallback("conv_forward"));
        assert!(shared.first_fallback("pool_backward"));
    }
}
