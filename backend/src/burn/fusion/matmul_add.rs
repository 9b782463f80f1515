//! A matmul whose product is only added to a tensor of its dims, run as one cuDNN matmul
//! graph adding that tensor in its epilogue.
//!
//! burn-autodiff sums the gradients a tensor receives from its several uses: the backward of a
//! matmul records the swap of the other operand's last two dims, the product of the incoming
//! gradient with it, then an add of that product to the gradient registered before
//! (`float_add(new, old)`). A residual connection after a linear layer without bias is the
//! same pattern in the forward pass. Unfused, the add is a launch of its own that reads the
//! product back (the elementwise fuser offers no run of one operation), and a block that
//! opens with the swap, which no other fuser starts with, runs operation by operation.
//! [`MatmulAddFuser`] recognizes a matmul, optionally after a swap of dims whose result only
//! it reads, followed by an add of its product (at its last use) to a float tensor of the
//! same dims, and [`MatmulAddOptimization`] runs it through [`math::float_matmul_add`]: one
//! graph where the product runs on cuDNN, the product then the add as the unfused operations
//! otherwise.
//!
//! The matmul (with its swap) is a complete match by itself, which the add extends. While
//! the fuser waits for the add it holds its block open, and burn-fusion then merges into it
//! the blocks of later operations that read the same tensors (the weight gradient's swap and
//! matmul, which read the same output gradient); a block whose fusers all fail from its first
//! operation runs operation by operation, so without the bare match such a merged block lost
//! the linear weight gradient's fused GEMM. With it, the matmul runs alone (as unfused) and
//! burn-fusion explores the operations after it afresh.

use burn_fusion::stream::Context;
use burn_ir::{BaseOperationIr, FloatOperationIr, NumericOperationIr, OperationIr, SwapDimsOpIr, TensorId, TensorIr};

use super::optimization::{global_ir, is_float, last_use, take_inputs, CudnnOptimization};
use super::staged::{self, StagedFuser};
use super::CudnnFusionHandle;
use crate::burn::tensor::CudnnTensor;
use crate::burn::{math, structure, Cudnn};
use crate::error::Result;

/// A matmul operand: a tensor, or the run's swap of a tensor's dims.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    /// The tensor and whether the run holds its last use.
    Tensor(TensorId, bool),
    /// Tensor `input` (with whether the run holds its last use) with dims `dims` swapped.
    Swapped {
        input: (TensorId, bool),
        dims: (usize, usize),
    },
}

impl Operand {
    /// The operand read by the matmul as `read`, given the run's leading swap.
    fn of(read: &TensorIr, swap: Option<&SwapDimsOpIr>) -> Operand {
        match swap {
            Some(s) if s.out.id == read.id => Operand::Swapped {
                input: (s.input.id, last_use(&s.input)),
                dims: (s.dim1, s.dim2),
            },
            _ => Operand::Tensor(read.id, last_use(read)),
        }
    }

    /// The tensor the run takes for it.
    fn source(self) -> (TensorId, bool) {
        match self {
            Operand::Tensor(id, last) => (id, last),
            Operand::Swapped { input, .. } => input,
        }
    }

    /// The operand from its source tensor `t`.
    fn view(self, t: CudnnTensor) -> Result<CudnnTensor> {
        match self {
            Operand::Tensor(..) => Ok(t),
            Operand::Swapped { dims: (a, b), .. } => structure::swap_dims(t, a, b, "fused matmul + add"),
        }
    }
}

/// The matched run, in relative ids: what the optimization reads and writes.
#[derive(Clone, Debug)]
pub struct MatmulAddOptimization {
    /// The matmul's operands.
    lhs: Operand,
    rhs: Operand,
    /// The tensor added to the product and whether the run holds its last use (none: the
    /// matmul alone).
    addend: Option<(TensorId, bool)>,
    /// The product, or the sum.
    out: TensorId,
    pub(crate) operations: Vec<OperationIr>,
}

/// Where the match stands.
#[derive(Clone, Debug, Default)]
pub(crate) enum Stage {
    /// Waiting for a float matmul or a swap of dims.
    #[default]
    Start,
    /// A swap of dims: a matmul reading its result for the last time must follow.
    Matmul(SwapDimsOpIr),
    /// The matmul `lhs · rhs = product`, complete; an add reading the product for the last
    /// time may follow.
    Product {
        lhs: Operand,
        rhs: Operand,
        product: TensorIr,
    },
    /// The whole run.
    Done {
        lhs: Operand,
        rhs: Operand,
        addend: TensorIr,
        out: TensorId,
    },
}

/// Matches a matmul followed by the add of its product to a tensor of its dims (see the
/// module).
pub(crate) type MatmulAddFuser = StagedFuser<Stage>;

impl staged::Stage for Stage {
    type Optimization = MatmulAddOptimization;

    fn step(&self, op: &OperationIr, _ops: &[OperationIr]) -> Option<Stage> {
        match (self, op) {
            (Stage::Start, OperationIr::BaseFloat(BaseOperationIr::SwapDims(s))) => {
                is_float(s.input.dtype).then(|| Stage::Matmul(s.clone()))
            }
            (Stage::Start | Stage::Matmul(_), OperationIr::Float(_, FloatOperationIr::Matmul(m))) => {
                let swap = match self {
                    Stage::Matmul(s) => Some(s),
                    _ => None,
                };
                // The swapped tensor is read by the matmul only (once, for the last time).
                let swap_read = swap.is_none_or(|s| {
                    let reads = [&m.lhs, &m.rhs].into_iter().filter(|t| t.id == s.out.id);
                    reads.clone().count() == 1 && reads.into_iter().all(last_use)
                });
                let fits =
                    swap_read && is_float(m.out.dtype) && m.lhs.dtype == m.out.dtype && m.rhs.dtype == m.out.dtype;
                fits.then(|| Stage::Product {
                    lhs: Operand::of(&m.lhs, swap),
                    rhs: Operand::of(&m.rhs, swap),
                    product: m.out.clone(),
                })
            }
            (Stage::Product { lhs, rhs, product }, OperationIr::NumericFloat(_, NumericOperationIr::Add(b))) => {
                let (read, addend) = if b.lhs.id == product.id {
                    (&b.lhs, &b.rhs)
                } else {
                    (&b.rhs, &b.lhs)
                };
                let fits = read.id == product.id
                    && addend.id != product.id
                    && last_use(read)
                    && addend.shape == product.shape
                    && addend.dtype == product.dtype
                    && b.out.shape == product.shape
                    && b.out.dtype == product.dtype;
                fits.then(|| Stage::Done {
                    lhs: *lhs,
                    rhs: *rhs,
                    addend: addend.clone(),
                    out: b.out.id,
                })
            }
            _ => None,
        }
    }

    fn done(&self) -> bool {
        matches!(self, Stage::Product { .. } | Stage::Done { .. })
    }

    fn extends(&self) -> bool {
        matches!(self, Stage::Product { .. })
    }

    fn optimization(&self, ops: &[OperationIr]) -> MatmulAddOptimization {
        match self {
            Stage::Product { lhs, rhs, product } => MatmulAddOptimization {
                lhs: *lhs,
                rhs: *rhs,
                addend: None,
                out: product.id,
                operations: ops.to_vec(),
            },
            Stage::Done { lhs, rhs, addend, out } => MatmulAddOptimization {
                lhs: *lhs,
                rhs: *rhs,
                addend: Some((addend.id, last_use(addend))),
                out: *out,
                operations: ops.to_vec(),
            },
            _ => panic!("cudnn-backend: internal error: an incomplete matmul + add match was finished"),
        }
    }

    fn wrap(optimization: MatmulAddOptimization) -> CudnnOptimization {
        CudnnOptimization::MatmulAdd(optimization)
    }
}

impl MatmulAddOptimization {
    /// Runs the product (with the add in its epilogue) and registers the result.
    pub(crate) fn execute(&self, context: &mut Context<CudnnFusionHandle>) -> Result<()> {
        const OP: &str = "fused matmul + add";
        let out_ir = global_ir(context, &self.out, OP);
        let (lhs, rhs) = (self.lhs.source(), self.rhs.source());
        let out = match self.addend {
            Some(addend) => {
                let [l, r, addend] = take_inputs(context, [lhs, rhs, addend], OP);
                math::float_matmul_add(self.lhs.view(l)?, self.rhs.view(r)?, addend, OP)?
            }
            None => {
                let [l, r] = take_inputs(context, [lhs, rhs], OP);
                math::float_matmul(self.lhs.view(l)?, self.rhs.view(r)?, OP)?
            }
        };
        context.handles.register_float_tensor::<Cudnn>(&out_ir.id, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::DType;
    use burn_fusion::{FuserStatus, OperationFuser};
    use burn_ir::{BinaryOpIr, MatmulOpIr, TensorStatus};

    use super::*;

    use TensorStatus::{NotInit, ReadOnly, ReadWrite};

    fn t(id: u64, dims: &[usize], status: TensorStatus) -> TensorIr {
        crate::burn::fusion::test_ir::t(id, dims, status, DType::F32)
    }

    /// burn-autodiff's gradient of a linear input `[B, S, K]` (relative dims 1, 2, 3): the
    /// `[1, K, N]` weight view (N: 4) swapped, the product of the `[B, S, N]` gradient with it,
    /// then its sum with the gradient registered before (`earlier`), the new product first.
    fn summed(product_status: TensorStatus, earlier: TensorIr) -> Vec<OperationIr> {
        vec![
            OperationIr::BaseFloat(BaseOperationIr::SwapDims(SwapDimsOpIr {
                input: t(7, &[0, 3, 4], ReadOnly),
                out: t(2, &[0, 4, 3], NotInit),
                dim1: 1,
                dim2: 2,
            })),
            OperationIr::Float(
                DType::F32,
                FloatOperationIr::Matmul(MatmulOpIr {
                    lhs: t(1, &[1, 2, 4], ReadWrite),
                    rhs: t(2, &[0, 4, 3], ReadWrite),
                    out: t(3, &[1, 2, 3], NotInit),
                }),
            ),
            OperationIr::NumericFloat(
                DType::F32,
                NumericOperationIr::Add(BinaryOpIr {
                    lhs: t(3, &[1, 2, 3], product_status),
                    rhs: earlier,
                    out: t(6, &[1, 2, 3], NotInit),
                }),
            ),
        ]
    }

    #[test]
    fn a_product_summed_into_a_gradient_is_matched_with_its_swap() {
        let mut f = MatmulAddFuser::default();
        let ops = summed(ReadWrite, t(5, &[1, 2, 3], ReadWrite));
        f.fuse(&ops[0]);
        assert_eq!(f.status(), FuserStatus::Open);
        assert!(!f.properties().ready);
        // The swap and the matmul: complete, and open to the add.
        f.fuse(&ops[1]);
        assert_eq!(f.status(), FuserStatus::Open);
        assert!(f.properties().ready && f.properties().score == 4);
        f.fuse(&ops[2]);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.len() == 3 && f.properties().score == 6);
        let o = f.complete().expect("a complete match");
        let swapped = Operand::Swapped {
            input: (TensorId::new(7), false),
            dims: (1, 2),
        };
        assert_eq!(
            (o.lhs, o.rhs, o.addend, o.out),
            (
                Operand::Tensor(TensorId::new(1), true),
                swapped,
                Some((TensorId::new(5), true)),
                TensorId::new(6)
            )
        );
        // Without the swap, and with the add's operands in the other order.
        let mut plain = ops[1..].to_vec();
        if let OperationIr::NumericFloat(_, NumericOperationIr::Add(b)) = &mut plain[1] {
            std::mem::swap(&mut b.lhs, &mut b.rhs);
        }
        let o = MatmulAddFuser::matched(&plain).expect("the matmul and the add");
        assert_eq!(
            (o.rhs, o.addend),
            (Operand::Tensor(TensorId::new(2), true), Some((TensorId::new(5), true)))
        );
    }

    #[test]
    fn without_a_fitting_add_the_matmul_runs_alone() {
        for ops in [
            // The product read again later: it must be stored.
            summed(ReadOnly, t(5, &[1, 2, 3], ReadWrite)),
            // An addend that broadcasts (a bias) is the linear-forward fuser's.
            summed(ReadWrite, t(5, &[0, 0, 3], ReadWrite)),
            // The product added to itself.
            summed(ReadWrite, t(3, &[1, 2, 3], ReadWrite)),
        ] {
            assert!(MatmulAddFuser::matched(&ops).is_none());
            let mut f = MatmulAddFuser::default();
            for op in &ops {
                f.fuse(op);
            }
            assert_eq!(f.status(), FuserStatus::Closed);
            let o = f.complete().expect("the swap and the matmul");
            assert_eq!((o.addend, o.out, f.len()), (None, TensorId::new(3), 2));
        }
        let ops = summed(ReadWrite, t(5, &[1, 2, 3], ReadWrite));
        assert!(MatmulAddFuser::matched(&ops[..2]).is_some_and(|o| o.addend.is_none()));
    }

    #[test]
    fn a_swap_read_again_after_the_matmul_is_left_alone() {
        let mut ops = summed(ReadWrite, t(5, &[1, 2, 3], ReadWrite));
        if let OperationIr::Float(_, FloatOperationIr::Matmul(m)) = &mut ops[1] {
            m.rhs.status = ReadOnly;
        }
        assert!(MatmulAddFuser::matched(&ops).is_none());
    }
}
