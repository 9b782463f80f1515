//! A fused run after an operation no fuser starts with: [`LeadFuser`].
//!
//! burn-fusion groups the operations it explores into blocks of operations that share
//! tensors, and a block runs as the best optimization its fusers offer from its first
//! operation, or else operation by operation, all of it. A convolution recorded
//! while another block is still being explored opens a block of its own, and the operations
//! that read its output join that block: with no fuser able to start with the convolution,
//! burn-fusion would run the whole block unfused. A batch norm's statistics right after a
//! convolution are such a block: unfused, a strided copy, two reduction passes and two
//! elementwise kernels for each of the mean and the variance, where the fused reduction takes
//! one launch each.
//!
//! [`LeadFuser`] wraps one of the fusers: when the block's first operation is one the inner
//! fuser refuses, it keeps that operation as a lead and offers the inner fuser's run of the
//! operations after it. A slice may lead before such an operation: a training loop's batch,
//! sliced from the dataset's tensor right before the first convolution, opens the forward
//! pass's first block, which then holds the stem's batch-norm statistics. The optimization
//! runs the leads as burn-fusion would (the backend's own ops), then the fused run.

use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::{BaseOperationIr, OperationIr};

use super::CudnnOptimization;

/// Wraps fuser `F`: leading operations `F` refuses, then `F`'s run of the operations after them.
#[derive(Clone, Debug)]
pub(crate) struct LeadFuser<F> {
    inner: F,
    /// The leading operations `F` refused so far.
    leads: Vec<OperationIr>,
    /// `F` took an operation after the leads.
    started: bool,
    /// `F` took the first operation (the plain fuser covers that block), or an operation
    /// neither `F` nor the leads take came first.
    closed: bool,
}

impl<F> LeadFuser<F> {
    /// Wraps `inner`, a fuser in its reset state.
    pub(crate) fn new(inner: F) -> Self {
        Self {
            inner,
            leads: Vec::new(),
            started: false,
            closed: false,
        }
    }
}

/// Whether `op` may follow `leads` as a leading operation: a module operation (a convolution,
/// a pooling, their backward passes) first or after a float slice (a view, no kernel), or a
/// slice first; so at most two leads, a slice then a module operation. Matmuls and the other tensor operations stay out: the pattern fusers start
/// with them (Burn's composed linear gradients and dynamic quantization, which must match the
/// unfused backend bit for bit), and a led elementwise run would take their operations.
fn may_lead(op: &OperationIr, leads: &[OperationIr]) -> bool {
    let after_slice = matches!(leads, [OperationIr::BaseFloat(BaseOperationIr::Slice(_))]);
    match op {
        OperationIr::Module(_) => leads.is_empty() || after_slice,
        OperationIr::BaseFloat(BaseOperationIr::Slice(_)) => leads.is_empty(),
        _ => false,
    }
}

/// Leading operations run as they are, then a fused run of the operations after them.
#[derive(Debug)]
pub struct LeadOptimization {
    /// The leading operations (relative ids), for the serialized state.
    pub(crate) leads: Vec<OperationIr>,
    /// The fused run after them.
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
        if self.started {
            self.inner.fuse(op);
            return;
        }
        let mut probe = self.inner.clone();
        probe.fuse(op);
        if probe.status() == FuserStatus::Open || !probe.is_empty() {
            if self.leads.is_empty() {
                // The plain fuser covers this block.
                self.closed = true;
            } else {
                self.inner = probe;
                self.started = true;
            }
        } else if may_lead(op, &self.leads) {
            self.leads.push(op.clone());
        } else {
            self.closed = true;
        }
    }

    fn finish(&mut self) -> CudnnOptimization {
        if self.leads.is_empty() {
            panic!("cudnn-backend: internal error: a fused run without its leading operation was finished")
        }
        CudnnOptimization::Lead(LeadOptimization {
            leads: self.leads.clone(),
            inner: Box::new(self.inner.finish()),
        })
    }

    fn reset(&mut self) {
        self.inner.reset();
        self.leads.clear();
        self.started = false;
        self.closed = false;
    }

    fn status(&self) -> FuserStatus {
        match (self.started, self.closed) {
            (_, true) => FuserStatus::Closed,
            (false, false) => FuserStatus::Open,
            (true, false) => self.inner.status(),
        }
    }

    fn properties(&self) -> FuserProperties {
        if self.closed || !self.started {
            return FuserProperties { score: 0, ready: false };
        }
        self.inner.properties()
    }

    fn len(&self) -> usize {
        if self.started && !self.closed {
            self.leads.len() + self.inner.len()
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
        ScalarOpIr, SliceOpIr, TensorStatus, UnaryOpIr,
    };

    use super::super::test_ir::t;
    use super::*;
    use crate::burn::fusion::elementwise::ElementwiseFuser;

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
                    l.leads[..],
                    [OperationIr::Module(ModuleOperationIr::AdaptiveAvgPool2d(_))]
                ));
                assert!(matches!(*l.inner, CudnnOptimization::Elementwise(_)));
                assert_eq!(CudnnOptimization::Lead(l).len(), 3);
            }
            other => panic!("{other:?}"),
        }
        f.reset();
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 0));
    }

    /// Rows `0..8` of `input` (`[16, 4, 6, 6]`): a batch sliced from a dataset's tensor.
    fn slice(input: u64, out: u64) -> OperationIr {
        OperationIr::BaseFloat(BaseOperationIr::Slice(SliceOpIr {
            tensor: t(input, &[16, 4, 6, 6], TensorStatus::ReadOnly, F),
            ranges: vec![burn_backend::Slice::new(0, Some(8), 1)],
            out: t(out, &[8, 4, 6, 6], TensorStatus::NotInit, F),
        }))
    }

    #[test]
    fn a_slice_then_a_module_operation_lead_the_inner_run() {
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&slice(0, 1));
        assert_eq!((f.status(), f.properties().ready), (FuserStatus::Open, false));
        f.fuse(&pool(1, 2));
        assert_eq!((f.status(), f.properties().ready), (FuserStatus::Open, false));
        f.fuse(&add_scalar(2, 3));
        f.fuse(&exp(3, 4));
        assert_eq!(f.len(), 4);
        match f.finish() {
            CudnnOptimization::Lead(l) => {
                assert!(matches!(
                    l.leads[..],
                    [
                        OperationIr::BaseFloat(BaseOperationIr::Slice(_)),
                        OperationIr::Module(ModuleOperationIr::AdaptiveAvgPool2d(_))
                    ]
                ));
                assert_eq!(CudnnOptimization::Lead(l).len(), 4);
            }
            other => panic!("{other:?}"),
        }
        // A slice alone leads too.
        f.reset();
        f.fuse(&slice(0, 1));
        let add = |input: u64, out: u64| {
            OperationIr::NumericFloat(
                F,
                NumericOperationIr::AddScalar(ScalarOpIr {
                    lhs: t(input, &[8, 4, 6, 6], TensorStatus::ReadWrite, F),
                    rhs: ScalarIr::Float(1.0),
                    out: t(out, &[8, 4, 6, 6], TensorStatus::NotInit, F),
                }),
            )
        };
        f.fuse(&add(1, 2));
        f.fuse(&add(2, 3));
        assert_eq!((f.len(), f.properties().ready), (3, true));
    }

    #[test]
    fn two_module_operations_or_a_slice_after_one_lead_nothing() {
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&pool(0, 1));
        f.fuse(&pool(1, 2));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 0));
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&pool(0, 1));
        f.fuse(&slice(1, 2));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 0));
        let mut f = LeadFuser::new(ElementwiseFuser::default());
        f.fuse(&slice(0, 1));
        f.fuse(&slice(1, 2));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 0));
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
