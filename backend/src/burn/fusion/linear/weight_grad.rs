//! The linear weight gradient as Burn composes it under `Fusion<B>`, run as one matmul.
//!
//! burn-fusion 0.21 does not forward `linear_weight_backward` to the backend, so for a
//! `[.., S, K]` input Burn's default records `xᵀ` (a swap of the last two dims), a *batched*
//! matmul with the output gradient (`[.., K, N]`: one weight-sized product per batch
//! element), a sum over each batch dim and a reshape to `[K, N]`. [`LinearGradFuser`]
//! recognizes exactly that run, with the swapped input and every intermediate at their last
//! use, and [`LinearGradOptimization`] computes the same `[K, N]` as one GEMM over the folded
//! batch (what `Cudnn` runs for `linear_weight_backward`).

use burn_fusion::stream::Context;
use burn_ir::{BaseOperationIr, FloatOperationIr, NumericOperationIr, OperationIr, TensorId, TensorIr};

use crate::burn::fusion::engine::run::{global_ir, is_float, last_use, take_inputs};
use crate::burn::fusion::engine::staged::{self, StagedFuser};
use crate::burn::fusion::CudnnFusionHandle;
use crate::burn::fusion::CudnnOptimization;
use crate::burn::layers::linear_weight_backward;
use crate::burn::Cudnn;
use crate::error::Result;

/// The matched run, in relative ids: what the optimization reads and writes.
#[derive(Clone, Debug)]
pub struct LinearGradOptimization {
    /// The linear layer's input `[.., S, K]` and whether the run holds its last use.
    x: (TensorId, bool),
    /// The output gradient `[.., S, N]` and whether the run holds its last use.
    dy: (TensorId, bool),
    /// The `[K, N]` result.
    out: TensorId,
    pub(crate) operations: Vec<OperationIr>,
}

/// Where the match stands.
#[derive(Clone, Debug, Default)]
pub(crate) enum Stage {
    /// Waiting for the swap of the last two dims.
    #[default]
    Swap,
    /// Waiting for the batched matmul of the swapped input.
    Matmul { x: TensorIr, xt: TensorId },
    /// Summing batch dim `next` of the product (`ndims - 2` sums in order).
    Sum {
        x: TensorIr,
        dy: TensorIr,
        last: TensorId,
        next: usize,
        batch_dims: usize,
    },
    /// Waiting for the reshape of the summed product to `[K, N]`.
    Reshape { x: TensorIr, dy: TensorIr, last: TensorId },
    /// The whole run matched.
    Done(LinearGradOptimizationParts),
}

/// The tensors of a complete match: the input, the output gradient and the result.
#[derive(Clone, Debug)]
pub(crate) struct LinearGradOptimizationParts {
    x: TensorIr,
    dy: TensorIr,
    out: TensorId,
}

/// Matches Burn's composed linear weight gradient (see the module).
pub(crate) type LinearGradFuser = StagedFuser<Stage>;

impl staged::Stage for Stage {
    type Optimization = LinearGradOptimization;

    fn step(&self, op: &OperationIr, _ops: &[OperationIr]) -> Option<Stage> {
        match (self, op) {
            (Stage::Swap, OperationIr::BaseFloat(BaseOperationIr::SwapDims(s))) => {
                let r = s.input.shape.num_dims();
                let swaps_last_two = r >= 3 && s.dim1.min(s.dim2) == r - 2 && s.dim1.max(s.dim2) == r - 1;
                (swaps_last_two && is_float(s.input.dtype)).then(|| Stage::Matmul {
                    x: s.input.clone(),
                    xt: s.out.id,
                })
            }
            (Stage::Matmul { x, xt }, OperationIr::Float(_, FloatOperationIr::Matmul(m))) => {
                let (xs, gs) = (x.shape.to_vec(), m.rhs.shape.to_vec());
                let r = xs.len();
                let fits = m.lhs.id == *xt
                    && last_use(&m.lhs)
                    && gs.len() == r
                    && gs[..r - 1] == xs[..r - 1]
                    && m.rhs.dtype == x.dtype
                    && m.out.dtype == x.dtype;
                fits.then(|| Stage::Sum {
                    x: x.clone(),
                    dy: m.rhs.clone(),
                    last: m.out.id,
                    next: 0,
                    batch_dims: r - 2,
                })
            }
            (
                Stage::Sum {
                    x,
                    dy,
                    last,
                    next,
                    batch_dims,
                },
                OperationIr::NumericFloat(_, NumericOperationIr::SumDim(s)),
            ) => {
                let fits = s.input.id == *last && last_use(&s.input) && s.axis == *next;
                fits.then(|| {
                    if next + 1 == *batch_dims {
                        Stage::Reshape {
                            x: x.clone(),
                            dy: dy.clone(),
                            last: s.out.id,
                        }
                    } else {
                        Stage::Sum {
                            x: x.clone(),
                            dy: dy.clone(),
                            last: s.out.id,
                            next: next + 1,
                            batch_dims: *batch_dims,
                        }
                    }
                })
            }
            (Stage::Reshape { x, dy, last }, OperationIr::BaseFloat(BaseOperationIr::Reshape(s))) => {
                let (xs, gs) = (x.shape.to_vec(), dy.shape.to_vec());
                let want = [xs[xs.len() - 1], gs[gs.len() - 1]];
                let fits = s.input.id == *last && last_use(&s.input) && s.out.shape.to_vec() == want;
                fits.then(|| {
                    Stage::Done(LinearGradOptimizationParts {
                        x: x.clone(),
                        dy: dy.clone(),
                        out: s.out.id,
                    })
                })
            }
            _ => None,
        }
    }

    fn done(&self) -> bool {
        matches!(self, Stage::Done(_))
    }

    fn optimization(&self, ops: &[OperationIr]) -> LinearGradOptimization {
        match self {
            Stage::Done(p) => LinearGradOptimization {
                x: (p.x.id, last_use(&p.x)),
                dy: (p.dy.id, last_use(&p.dy)),
                out: p.out,
                operations: ops.to_vec(),
            },
            _ => panic!("cudnn-backend: internal error: an incomplete linear-gradient match was finished"),
        }
    }

    fn wrap(optimization: LinearGradOptimization) -> CudnnOptimization {
        CudnnOptimization::LinearGrad(optimization)
    }
}

impl LinearGradOptimization {
    /// Runs the one GEMM and registers its `[K, N]` result.
    pub(crate) fn execute(&self, context: &mut Context<CudnnFusionHandle>) -> Result<()> {
        const OP: &str = "fused linear weight gradient";
        let out_ir = global_ir(context, &self.out, OP);
        let [x, dy] = take_inputs(context, [self.x, self.dy], OP);
        let dw = linear_weight_backward(x, dy)?;
        context.handles.register_float_tensor::<Cudnn>(&out_ir.id, dw);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::DType;
    use burn_fusion::{FuserStatus, OperationFuser};
    use burn_ir::{MatmulOpIr, ReduceDimOpIr, ShapeOpIr, SwapDimsOpIr, TensorStatus};

    use super::*;

    fn t(id: u64, dims: &[usize], status: TensorStatus) -> TensorIr {
        crate::burn::fusion::test_ir::t(id, dims, status, DType::F32)
    }

    /// Burn's composed weight gradient of a `[2, 3, 5, K=4]` input and `[2, 3, 5, N=6]` gradient.
    fn composed(x_status: TensorStatus, product_last_use: bool) -> Vec<OperationIr> {
        use TensorStatus::{NotInit, ReadOnly, ReadWrite};
        let p = if product_last_use { ReadWrite } else { ReadOnly };
        vec![
            OperationIr::BaseFloat(BaseOperationIr::SwapDims(SwapDimsOpIr {
                input: t(1, &[2, 3, 5, 4], x_status),
                out: t(2, &[2, 3, 4, 5], NotInit),
                dim1: 2,
                dim2: 3,
            })),
            OperationIr::Float(
                DType::F32,
                FloatOperationIr::Matmul(MatmulOpIr {
                    lhs: t(2, &[2, 3, 4, 5], ReadWrite),
                    rhs: t(3, &[2, 3, 5, 6], ReadOnly),
                    out: t(4, &[2, 3, 4, 6], NotInit),
                }),
            ),
            OperationIr::NumericFloat(
                DType::F32,
                NumericOperationIr::SumDim(ReduceDimOpIr {
                    input: t(4, &[2, 3, 4, 6], p),
                    out: t(5, &[1, 3, 4, 6], NotInit),
                    axis: 0,
                    accumulator_len: 1,
                }),
            ),
            OperationIr::NumericFloat(
                DType::F32,
                NumericOperationIr::SumDim(ReduceDimOpIr {
                    input: t(5, &[1, 3, 4, 6], ReadWrite),
                    out: t(6, &[1, 1, 4, 6], NotInit),
                    axis: 1,
                    accumulator_len: 1,
                }),
            ),
            OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
                input: t(6, &[1, 1, 4, 6], ReadWrite),
                out: t(7, &[4, 6], NotInit),
            })),
        ]
    }

    #[test]
    fn the_composed_weight_gradient_is_matched_whole() {
        let mut f = LinearGradFuser::default();
        for op in composed(TensorStatus::ReadOnly, true) {
            assert_eq!(f.status(), FuserStatus::Open);
            assert!(!f.properties().ready);
            f.fuse(&op);
        }
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.len() == 5);
        let o = f.complete().expect("a complete match");
        assert_eq!(
            (o.x, o.dy, o.out),
            ((TensorId::new(1), false), (TensorId::new(3), false), TensorId::new(7))
        );
        assert!(LinearGradFuser::matched(&o.operations).is_some());
    }

    #[test]
    fn a_run_whose_intermediate_is_used_elsewhere_is_left_alone() {
        let mut f = LinearGradFuser::default();
        for op in composed(TensorStatus::ReadOnly, false) {
            f.fuse(&op);
        }
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(!f.properties().ready);
        // A prefix alone is not a match either.
        assert!(LinearGradFuser::matched(&composed(TensorStatus::ReadWrite, true)[..4]).is_none());
    }
}
