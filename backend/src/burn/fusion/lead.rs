//! A fused run after an operation no fuser starts with: [`LeadFuser`].
//!
//! burn-fusion groups the operations it explores into blocks of operations that share
//! tensors, and a block runs as the best optimization its fusers offer from its first
//! operation, or else operation by operation, all of it. A convolution recorded
//! while another block is still being explored opens a block of its own, and the operations
//! that read its output join that block: with no fuser able to start with the convolution,
//! burn-fusion then runs the whole block unfused. In the stock CNN, the batch-norm statistics
//! of five of the nine convolutions ran that way (a strided copy, two reduction passes and two
//! elementwise kernels for each of the mean and the variance, where the fused reduction
//! takes one launch each).
//!
//! [`LeadFuser`] wraps one of the fusers: when the block's first operation is one the inner
//! fuser refuses, it keeps that operation as the lead and offers the inner fuser's run of the
//! operations after it. The optimization runs the lead as burn-fusion would (the backend's own
//! op), then the fused run.

use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::OperationIr;

use super::optimization::CudnnOptimization;

/// Wraps fuser `F`: a leading operation `F` refuses, then `F`'s run of the operations after it.
#[derive(Clone, Debug)]
pub(crate) struct LeadFuser<F> {
    inner: F,
    /// The first operation, once `F` refused it.
    lead: Option<OperationIr>,
    /// `F` took the first operation (the plain fuser covers that block) or the lead is one
    /// this fuser never leads with.
    closed: bool,
}

impl<F> LeadFuser<F> {
    /// Wraps `inner`, a fuser in its reset state.
    pub(crate) fn new(inner: F) -> Self {
        Self {
            inner,
            lead: None,
            closed: false,
        }
    }
}

/// Whether `op` may lead a fused run: a module operation (a convolution, a pooling, their
/// backward passes). Matmuls and tensor operations stay out: the pattern fusers start with
/// them (Burn's composed linear gradients and dynamic quantization, which must match the
/// unfused backend bit for bit), and a led elementwise run would take their operations.
fn may_lead(op: &OperationIr) -> bool {
    matches!(op, OperationIr::Module(_))
}

/// A leading operation run as it is, then a fused run of the operations after it.
#[derive(Debug)]
pub struct LeadOptimization {
    /// The leading operation (relative ids), for the serialized state.
    pub(crate) lead: Box<OperationIr>,
    /// The fused run after it.
    pub(crate) inner: Box<CudnnOptimization>,
}

impl<F> OperationFuser<CudnnOptimization> for LeadFuser<F>
where
    F: OperationFuser<CudnnOptimization> + Clone + 'static,
{
    fn fuse(&mut self, op: &OperationIr) {
        if self.closed {
            return;
        }
        if self.lead.is_some() {
            self.inner.fuse(op);
            return;
        }
        let mut probe = self.inner.clone();
        probe.fuse(op);
        if probe.status() == FuserStatus::Open || !probe.is_empty() || !may_lead(op) {
            self.closed = true;
        } else {
            self.lead = Some(op.clone());
        }
    }

    fn finish(&mut self) -> CudnnOptimization {
        let Some(lead) = self.lead.clone().map(Box::new) else {
            panic!("cudnn-backend: internal error: a fused run without its leading operation was finished")
        };
        CudnnOptimization::Lead(LeadOptimization {
            lead,
            inner: Box::new(self.inner.finish()),
        })
    }

    fn reset(&mut self) {
        self.inner.reset();
        self.lead = None;
        self.closed = false;
    }

    fn status(&self) -> FuserStatus {
        match (&self.lead, self.closed) {
            (_, true) => FuserStatus::Closed,
            (None, false) => FuserStatus::Open,
            (Some(_), false) => self.inner.status(),
        }
    }

    fn properties(&self) -> FuserProperties {
        if self.closed || self.lead.is_none() {
            return FuserProperties { score: 0, ready: false };
        }
        self.inner.properties()
    }

    fn len(&self) -> usize {
        if self.lead.is_some() && !self.closed {
            1 + self.inner.len()
        } else {
            0
        }
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CudnnOptimization>> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::DType;
    use burn_fusion::NumOperations;
    use burn_ir::{
        AdaptiveAvgPool2dOpIr, FloatOperationIr, MatmulOpIr, ModuleOperationIr, NumericOperationIr, ScalarIr,
        ScalarOpIr, TensorStatus, UnaryOpIr,
    };

    use super::super::fuser::ElementwiseFuser;
    use super::super::test_ir::t;
    use super::*;

    const F: DType = DType::F32;

    /// An adaptive average pooling of `input` (`[8, 4, 6, 6]`), its output taken as the
    /// `[8, 4]` the run reads (a module operation: it may lead).
    fn pool(input: u64, out: u64) -> OperationIr {
        OperationIr::Module(ModuleOperationIr::AdaptiveAvgPool2d(AdaptiveAvgPool2dOpIr {
            x: t(input, &[8, 4, 6, 6], TensorStatus::ReadOnly, F),
            output_size: [1, 1],
            out: t(out, &[8, 4], TensorStatus::NotInit, F),
        }))
    }

    fn matmul(lhs: u64, rhs: u64, out: u64) -> OperationIr {
        OperationIr::Float(
            F,
            FloatOperationIr::Matmul(MatmulOpIr {
                lhs: t(lhs, &[8, 16], TensorStatus::ReadOnly, F),
                rhs: t(rhs, &[16, 4], TensorStatus::ReadOnly, F),
                out: t(out, &[8, 4], TensorStatus::NotInit, F),
            }),
        )
    }

    fn add_scalar(input: u64, out: u64) -> OperationIr {
        OperationIr::NumericFloat(
            F,
            NumericOperationIr::AddScalar(ScalarOpIr {
                lhs: t(input, &[8, 4], TensorStatus::ReadWrite, F),
                rhs: ScalarIr::Float(1.0),
                out: t(out, &[8, 4], TensorStatus::NotInit, F),
            }),
        )
    }

    fn exp(input: u64, out: u64) -> OperationIr {
        OperationIr::Float(
            F,
            FloatOperationIr::Exp(UnaryOpIr {
                input: t(input, &[8, 4], TensorStatus::ReadWrite, F),
                out: t(out, &[8, 4], TensorStatus::NotInit, F),
            }),
        )
    }

    #[test]
    fn a_refused_first_operation_leads_the_inner_run() {
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&pool(0, 2));
        assert_eq!(f.status(), FuserStatus::Open);
        assert!(!f.properties().ready, "the lead alone is no run");
        f.fuse(&add_scalar(2, 3));
        f.fuse(&exp(3, 4));
        assert_eq!(f.len(), 3);
        assert_eq!(f.properties().score, ElementwiseFuser::default().properties().score + 2);
        match f.finish() {
            CudnnOptimization::Lead(l) => {
                assert!(matches!(
                    *l.lead,
                    OperationIr::Module(ModuleOperationIr::AdaptiveAvgPool2d(_))
                ));
                assert!(matches!(*l.inner, CudnnOptimization::Elementwise(_)));
                assert_eq!(CudnnOptimization::Lead(l).len(), 3);
            }
            other => panic!("{other:?}"),
        }
        f.reset();
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 0));
    }

    #[test]
    fn a_first_operation_the_inner_fuser_takes_a_matmul_or_a_drop_closes_it() {
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&add_scalar(2, 3));
        assert_eq!(f.status(), FuserStatus::Closed);
        f.fuse(&exp(3, 4));
        assert_eq!((f.len(), f.properties().ready), (0, false));
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&OperationIr::Drop(t(5, &[8, 4], TensorStatus::ReadWrite, F)));
        assert_eq!(f.status(), FuserStatus::Closed);
        // A matmul leads nothing: the pattern fusers (linear gradients) start with it.
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&matmul(0, 1, 2));
        f.fuse(&add_scalar(2, 3));
        assert_eq!(
            (f.status(), f.len(), f.properties().ready),
            (FuserStatus::Closed, 0, false)
        );
    }
}
