//! Sums over the leading dims as Burn composes them under `Fusion<B>` (the linear bias
//! gradient), run as one reduction.
//!
//! burn-fusion 0.21 does not forward `linear_bias_backward` to the backend, so for an output
//! gradient `[B, S, N]` Burn's default records a sum over dim 0 (`[1, S, N]`), a sum over
//! dim 1 (`[1, 1, N]`) and a reshape to `[N]`. On the GPU each sum is its own column
//! reduction over a thin axis, and the intermediate is rounded to the gradient's dtype.
//!
//! [`LeadingSumFuser`] recognizes a run of `k >= 2` float sums (F32, F16, BF16) over dims
//! `0, 1, .., k - 1` in that order, each reading the previous one's result at its last use.
//! The reshape that follows is absorbed when it reads the last sum's result at its last use
//! and only drops leading dims the sums reduced (Burn's reshape to `[N]`); any other next
//! operation ends the run before it. [`LeadingSumOptimization`] views the summed tensor as
//! `[product of the k leading dims, rest..]` (a view when the strides allow, else a packed
//! copy) and sums axis 0 in one reduction, as `Cudnn::linear_bias_backward` does: the
//! intermediate sums are never materialized, and the whole folded batch accumulates in f32
//! (the reduction's accumulator) instead of through an intermediate rounded to the
//! gradient's dtype.

use burn_backend::Shape;
use burn_fusion::stream::Context;
use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::{BaseOperationIr, NumericOperationIr, OperationIr, TensorId, TensorIr};

use crate::burn::fusion::engine::run::{global_ir, handle_tensor, is_float, last_use, status_of};
use crate::burn::fusion::CudnnFusionHandle;
use crate::burn::fusion::CudnnOptimization;
use crate::burn::math::{self, ReduceOp};
use crate::burn::tensor::to_dims;
use crate::burn::{Cudnn, CudnnTensor};
use crate::error::Result;

/// The matched run, in relative ids: what the optimization reads and writes.
#[derive(Clone, Debug)]
pub struct LeadingSumOptimization {
    /// The summed tensor and whether the run holds its last use.
    input: (TensorId, bool),
    /// How many leading dims the run sums (`k >= 2`).
    leading: usize,
    /// The result: the last sum's, or the absorbed reshape's.
    out: TensorId,
    /// The operations, for the serialized state.
    pub(crate) operations: Vec<OperationIr>,
}

/// Matches a chain of sums over the leading dims (see the module).
#[derive(Clone, Debug, Default)]
pub(crate) struct LeadingSumFuser {
    /// The first sum's input: the tensor summed.
    input: Option<TensorIr>,
    /// The latest result of the run (the last sum's, or the absorbed reshape's).
    last: Option<TensorIr>,
    /// The sums matched so far; the next one must reduce dim `sums`.
    sums: usize,
    /// The run ends with an absorbed reshape.
    reshaped: bool,
    /// The operations of the run so far.
    ops: Vec<OperationIr>,
    /// The run is over: nothing more is taken.
    closed: bool,
}

/// What `op` adds to the run.
enum Step {
    /// The next sum: its input and output.
    Sum { input: TensorIr, out: TensorIr },
    /// The closing reshape: its output.
    Reshape { out: TensorIr },
}

/// Whether `out` is `input` without some of its first `reduced` dims (size 1 after the
/// sums): shapes compare in the run's relative dims, which name equal sizes alike.
fn drops_reduced_dims(input: &TensorIr, out: &TensorIr, reduced: usize) -> bool {
    let (i, o) = (input.shape.to_vec(), out.shape.to_vec());
    o.len() < i.len() && i.len() - o.len() <= reduced && i[i.len() - o.len()..] == o[..]
}

impl LeadingSumFuser {
    /// What `op` adds to the run, or `None` when it does not continue it.
    fn step(&self, op: &OperationIr) -> Option<Step> {
        if self.reshaped {
            return None;
        }
        match op {
            OperationIr::NumericFloat(dtype, NumericOperationIr::SumDim(s)) => {
                let typed = is_float(*dtype) && s.input.dtype == *dtype && s.out.dtype == *dtype;
                let chained = match &self.last {
                    None => true,
                    Some(last) => s.input.id == last.id && last_use(&s.input),
                };
                (typed && chained && s.axis == self.sums).then(|| Step::Sum {
                    input: s.input.clone(),
                    out: s.out.clone(),
                })
            }
            OperationIr::BaseFloat(BaseOperationIr::Reshape(s)) => {
                let last = self.last.as_ref()?;
                let fits = self.sums >= 2
                    && s.input.id == last.id
                    && last_use(&s.input)
                    && s.out.dtype == s.input.dtype
                    && drops_reduced_dims(&s.input, &s.out, self.sums);
                fits.then(|| Step::Reshape { out: s.out.clone() })
            }
            _ => None,
        }
    }

    /// Whether the run so far is worth running as one reduction.
    fn ready(&self) -> bool {
        self.sums >= 2
    }

    /// The optimization of `ops` (a saved state), if they are one complete run.
    pub(crate) fn from_operations(ops: &[OperationIr]) -> Option<LeadingSumOptimization> {
        let mut f = Self::default();
        for op in ops {
            f.fuse(op);
        }
        (f.ready() && f.ops.len() == ops.len()).then(|| f.build())
    }

    /// The optimization of the run so far (only once it is [ready](Self::ready)).
    fn build(&self) -> LeadingSumOptimization {
        match (&self.input, &self.last) {
            (Some(input), Some(out)) if self.ready() => LeadingSumOptimization {
                input: (input.id, last_use(input)),
                leading: self.sums,
                out: out.id,
                operations: self.ops.clone(),
            },
            _ => panic!("cudnn-backend: internal error: an incomplete leading-dims sum was finished"),
        }
    }
}

impl OperationFuser<CudnnOptimization> for LeadingSumFuser {
    fn fuse(&mut self, op: &OperationIr) {
        if self.closed {
            return;
        }
        match self.step(op) {
            Some(Step::Sum { input, out }) => {
                self.input.get_or_insert(input);
                self.last = Some(out);
                self.sums += 1;
                self.ops.push(op.clone());
            }
            Some(Step::Reshape { out }) => {
                self.last = Some(out);
                self.reshaped = true;
                self.ops.push(op.clone());
                // Nothing follows a reshape in the pattern.
                self.closed = true;
            }
            None => self.closed = true,
        }
    }

    fn finish(&mut self) -> CudnnOptimization {
        CudnnOptimization::LeadingSum(self.build())
    }

    fn reset(&mut self) {
        *self = Self::default();
    }

    fn status(&self) -> FuserStatus {
        status_of(self.closed)
    }

    fn properties(&self) -> FuserProperties {
        let ready = self.ready();
        FuserProperties {
            // Every absorbed operation is one launch (or view) fewer; no other fuser takes sums.
            score: if ready { self.ops.len() as u64 } else { 0 },
            ready,
        }
    }

    fn len(&self) -> usize {
        self.ops.len()
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CudnnOptimization>> {
        Box::new(self.clone())
    }
}

/// `x` summed over its first `leading` dims in one reduction, shaped as `out`.
fn sum_leading(x: CudnnTensor, x_shape: &Shape, leading: usize, out: &Shape) -> Result<CudnnTensor> {
    const OP: &str = "fused leading-dims sum";
    let dims = to_dims(x_shape);
    let leading = leading.min(dims.len());
    let mut folded = vec![dims[..leading].iter().product::<i64>()];
    folded.extend_from_slice(&dims[leading..]);
    let x = x.reshape(&folded)?;
    math::reduce_dim(x, 0, ReduceOp::Sum, OP)?.reshape(&to_dims(out))
}

impl LeadingSumOptimization {
    /// Runs the one reduction and registers its result.
    pub(crate) fn execute(&self, context: &mut Context<CudnnFusionHandle>) -> Result<()> {
        const OP: &str = "fused leading-dims sum";
        let (input_ir, out_ir) = (global_ir(context, &self.input.0, OP), global_ir(context, &self.out, OP));
        let x = handle_tensor(context, &input_ir.id, OP);
        if self.input.1 {
            context.handles.remove_handle(input_ir.id);
        }
        let sum = sum_leading(x, &input_ir.shape, self.leading, &out_ir.shape)?;
        context.handles.register_float_tensor::<Cudnn>(&out_ir.id, sum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::DType;
    use burn_ir::{ReduceDimOpIr, ShapeOpIr, TensorStatus, UnaryOpIr};

    use super::*;

    use TensorStatus::{NotInit, ReadOnly, ReadWrite};

    use crate::burn::fusion::test_ir::t;

    /// A float sum of tensor `input` over `axis` into tensor `input + 1`.
    fn sum(input: u64, dims: &[usize], status: TensorStatus, axis: usize) -> OperationIr {
        let mut out = dims.to_vec();
        out[axis] = 1;
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::SumDim(ReduceDimOpIr {
                input: t(input, dims, status, DType::F32),
                out: t(input + 1, &out, NotInit, DType::F32),
                axis,
                accumulator_len: 1,
            }),
        )
    }

    fn reshape(input: u64, dims: &[usize], status: TensorStatus, out: &[usize]) -> OperationIr {
        OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
            input: t(input, dims, status, DType::F32),
            out: t(input + 1, out, NotInit, DType::F32),
        }))
    }

    /// Burn's composed bias gradient of a `[4, 33, 48]` output gradient (tensor 1): two sums
    /// and the reshape to `[48]` (tensor 4).
    fn bias_gradient(dy_status: TensorStatus, reshape_input: TensorStatus) -> Vec<OperationIr> {
        vec![
            sum(1, &[4, 33, 48], dy_status, 0),
            sum(2, &[1, 33, 48], ReadWrite, 1),
            reshape(3, &[1, 1, 48], reshape_input, &[48]),
        ]
    }

    fn fused(ops: &[OperationIr]) -> LeadingSumFuser {
        let mut f = LeadingSumFuser::default();
        for op in ops {
            f.fuse(op);
        }
        f
    }

    #[test]
    fn the_composed_bias_gradient_is_matched_whole() {
        let ops = bias_gradient(ReadWrite, ReadWrite);
        let mut f = LeadingSumFuser::default();
        f.fuse(&ops[0]);
        assert!(f.status() == FuserStatus::Open && !f.properties().ready);
        f.fuse(&ops[1]);
        // Two sums are a match already; the fuser waits for a reshape.
        assert!(f.status() == FuserStatus::Open && f.properties().ready);
        f.fuse(&ops[2]);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.properties().score == 3 && f.len() == 3);
        let o = f.build();
        assert_eq!(
            (o.input, o.leading, o.out),
            ((TensorId::new(1), true), 2, TensorId::new(4))
        );

        // An output gradient read elsewhere too: the run leaves its handle in place.
        let o = fused(&bias_gradient(ReadOnly, ReadWrite)).build();
        assert_eq!(o.input, (TensorId::new(1), false));
    }

    #[test]
    fn a_last_sum_read_elsewhere_ends_the_run_before_the_reshape() {
        let f = fused(&bias_gradient(ReadWrite, ReadOnly));
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.len() == 2);
        assert_eq!(f.build().out, TensorId::new(3));
    }

    #[test]
    fn a_chain_of_three_sums_over_a_4d_tensor_is_matched() {
        let ops = vec![
            sum(1, &[2, 3, 4, 5], ReadOnly, 0),
            sum(2, &[1, 3, 4, 5], ReadWrite, 1),
            sum(3, &[1, 1, 4, 5], ReadWrite, 2),
            // Not a drop of reduced leading dims: ends the run.
            reshape(4, &[1, 1, 1, 5], ReadWrite, &[5, 1]),
        ];
        let f = fused(&ops);
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.len() == 3);
        let o = f.build();
        assert_eq!(
            (o.input, o.leading, o.out),
            ((TensorId::new(1), false), 3, TensorId::new(4))
        );
        // A reshape dropping only some of the reduced dims is absorbed.
        let mut ops = ops;
        ops[3] = reshape(4, &[1, 1, 1, 5], ReadWrite, &[1, 5]);
        let f = fused(&ops);
        assert!(f.properties().ready && f.len() == 4);
        assert_eq!(f.build().out, TensorId::new(5));
    }

    #[test]
    fn runs_that_are_not_a_leading_sum_chain_are_left_alone() {
        let not_ready = |ops: Vec<OperationIr>| {
            let f = fused(&ops);
            assert_eq!(f.status(), FuserStatus::Closed, "{ops:?}");
            assert!(!f.properties().ready && f.properties().score == 0, "{ops:?}");
            assert!(LeadingSumFuser::from_operations(&ops).is_none(), "{ops:?}");
        };
        // Dim 1 first.
        not_ready(vec![
            sum(1, &[4, 33, 48], ReadWrite, 1),
            sum(2, &[4, 1, 48], ReadWrite, 0),
        ]);
        // The intermediate is read elsewhere.
        not_ready(vec![
            sum(1, &[4, 33, 48], ReadWrite, 0),
            sum(2, &[1, 33, 48], ReadOnly, 1),
        ]);
        // The second sum reads another tensor.
        not_ready(vec![
            sum(1, &[4, 33, 48], ReadWrite, 0),
            sum(7, &[1, 33, 48], ReadWrite, 1),
        ]);
        // A single sum, reshaped.
        not_ready(vec![
            sum(1, &[33, 48], ReadWrite, 0),
            reshape(2, &[1, 48], ReadWrite, &[48]),
        ]);
        // Int sums.
        let int_sum = |input: u64, dims: &[usize], out: &[usize], axis: usize| {
            OperationIr::NumericInt(
                DType::I64,
                NumericOperationIr::SumDim(ReduceDimOpIr {
                    input: t(input, dims, ReadWrite, DType::I64),
                    out: t(input + 1, out, NotInit, DType::I64),
                    axis,
                    accumulator_len: 1,
                }),
            )
        };
        not_ready(vec![
            int_sum(1, &[4, 33, 48], &[1, 33, 48], 0),
            int_sum(2, &[1, 33, 48], &[1, 1, 48], 1),
        ]);
        // F64 sums (not a dtype of the pattern).
        let f64_sum = |input: u64, dims: &[usize], out: &[usize], axis: usize| {
            OperationIr::NumericFloat(
                DType::F64,
                NumericOperationIr::SumDim(ReduceDimOpIr {
                    input: t(input, dims, ReadWrite, DType::F64),
                    out: t(input + 1, out, NotInit, DType::F64),
                    axis,
                    accumulator_len: 1,
                }),
            )
        };
        not_ready(vec![
            f64_sum(1, &[4, 33, 48], &[1, 33, 48], 0),
            f64_sum(2, &[1, 33, 48], &[1, 1, 48], 1),
        ]);
        // Something else first.
        not_ready(vec![
            OperationIr::Float(
                DType::F32,
                burn_ir::FloatOperationIr::Exp(UnaryOpIr {
                    input: t(9, &[4, 33, 48], ReadWrite, DType::F32),
                    out: t(1, &[4, 33, 48], NotInit, DType::F32),
                }),
            ),
            sum(1, &[4, 33, 48], ReadWrite, 0),
            sum(2, &[1, 33, 48], ReadWrite, 1),
        ]);
    }

    #[test]
    fn the_saved_state_rebuilds_the_same_run() {
        for ops in [
            bias_gradient(ReadWrite, ReadWrite),
            bias_gradient(ReadOnly, ReadOnly)[..2].to_vec(),
        ] {
            let o = fused(&ops).build();
            let r = LeadingSumFuser::from_operations(&o.operations).expect("a saved run");
            assert_eq!((r.input, r.leading, r.out), (o.input, o.leading, o.out));
            assert_eq!(r.operations, ops);
        }
        // Operations beyond the run are not a saved run.
        let mut ops = bias_gradient(ReadWrite, ReadOnly);
        ops.push(sum(3, &[1, 1, 48], ReadWrite, 2));
        assert!(LeadingSumFuser::from_operations(&ops).is_none());
    }
}
