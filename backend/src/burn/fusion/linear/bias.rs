//! A linear layer's forward as Burn composes it under `Fusion<B>`, run as one cuDNN matmul
//! graph with the bias added in its epilogue.
//!
//! burn-fusion 0.21 records `burn::nn::Linear`'s forward on a `[.., K]` input as a reshape of
//! the `[K, N]` weight to the input's rank, a matmul, a reshape of the `[N]` bias to
//! `[1, .., 1, N]`, and an add. Unfused, the add is a launch of its own over the whole output
//! (the elementwise fuser offers no run of one operation). [`MatmulBiasFuser`] recognizes
//! exactly that run, with the reshaped weight, the product and the reshaped bias at their last
//! use, and [`MatmulBiasOptimization`] computes it as `Cudnn`'s linear layer does: the leading
//! dims folded into one GEMM whose epilogue adds the bias (the unfused pair while that graph's
//! plan builds). Products small enough for the exact GEMM kernel, and f64, run the matmul and
//! the add as the unfused operations would.
//!
//! Burn's relu or gelu right after the add, with the sum dropped after it (inference: under
//! `Autodiff` the sum is kept for the backward pass), joins the run as the graph's activation
//! epilogue ([`crate::burn::fusion::engine::act_tail`]); small products, f64 and other scalars run such a run's
//! operations one by one.

use burn_backend::DType;
use burn_fusion::stream::Context;
use burn_ir::{BaseOperationIr, FloatOperationIr, NumericOperationIr, OperationIr, TensorId, TensorIr};

use crate::burn::fusion::engine::act_tail::{scalars_match, Tail, TailScalars};
use crate::burn::fusion::engine::run::{global_ir, is_float, last_use, take_inputs};
use crate::burn::fusion::engine::staged::{self, StagedFuser};
use crate::burn::fusion::CudnnFusionHandle;
use crate::burn::fusion::CudnnOptimization;
use crate::burn::layers::linear_act;
use crate::burn::tensor::{to_dims, CudnnTensor};
use crate::burn::{exec, math, Cudnn};
use crate::error::Result;
use crate::ops::elementwise::BinaryOp;
use crate::types::Activation;

/// The matched run, in relative ids: what the optimization reads and writes.
#[derive(Clone, Debug)]
pub struct MatmulBiasOptimization {
    /// The input `[.., K]`, the weight `[K, N]` and the bias `[N]`, each with whether the run
    /// holds its last use.
    x: (TensorId, bool),
    w: (TensorId, bool),
    bias: (TensorId, bool),
    /// The weight and the bias as the run reshapes them (their dims are the unfused path's).
    w_view: TensorId,
    bias_view: TensorId,
    /// The result `[.., N]` (after the activation, if any).
    out: TensorId,
    /// The activation epilogue and the scalars its composition was recorded with.
    act: Activation,
    scalars: TailScalars,
    pub(crate) operations: Vec<OperationIr>,
}

/// The tensors of a complete match.
#[derive(Clone, Debug)]
pub(crate) struct Parts {
    x: TensorIr,
    w: TensorIr,
    bias: TensorIr,
    w_view: TensorId,
    bias_view: TensorId,
    /// The biased product.
    y: TensorIr,
    /// The activation after it, as far as it matched.
    tail: Tail,
}

/// Where the match stands.
#[derive(Clone, Debug, Default)]
pub(crate) enum Stage {
    /// Waiting for the weight's reshape to the input's rank.
    #[default]
    Start,
    /// The weight `w` reshaped (`w_view`): its matmul must follow.
    Matmul { w: TensorIr, w_view: TensorIr },
    /// The product `y`: the reshape of an `[N]` bias to its rank must follow.
    BiasReshape {
        x: TensorIr,
        w: TensorIr,
        w_view: TensorId,
        y: TensorIr,
    },
    /// The reshaped bias: the sum of the product and it must follow.
    Add {
        x: TensorIr,
        w: TensorIr,
        w_view: TensorId,
        y: TensorIr,
        bias: TensorIr,
        bias_view: TensorId,
    },
    /// The biased product matched, and the activation after it as far as it did.
    Done(Parts),
}

/// Matches Burn's composed linear forward with a bias (see the module).
pub(crate) type MatmulBiasFuser = StagedFuser<Stage>;

/// Relative dims of `t`.
fn dims(t: &TensorIr) -> Vec<usize> {
    t.shape.to_vec()
}

/// Whether `view` is `[1, .., 1]` followed by `trailing` (relative dim id 0 is size 1), of a
/// rank above `trailing`'s.
fn leading_ones_then(view: &[usize], trailing: &[usize]) -> bool {
    view.len() > trailing.len()
        && view.ends_with(trailing)
        && view[..view.len() - trailing.len()].iter().all(|&d| d == 0)
}

impl staged::Stage for Stage {
    type Optimization = MatmulBiasOptimization;

    fn step(&self, op: &OperationIr, _ops: &[OperationIr]) -> Option<Stage> {
        match (self, op) {
            (Stage::Start, OperationIr::BaseFloat(BaseOperationIr::Reshape(s))) => {
                let fits = s.input.shape.num_dims() == 2
                    && is_float(s.input.dtype)
                    && leading_ones_then(&dims(&s.out), &dims(&s.input));
                fits.then(|| Stage::Matmul {
                    w: s.input.clone(),
                    w_view: s.out.clone(),
                })
            }
            (Stage::Matmul { w, w_view }, OperationIr::Float(_, FloatOperationIr::Matmul(m))) => {
                let (xs, ws) = (dims(&m.lhs), dims(w));
                let fits = m.rhs.id == w_view.id
                    && last_use(&m.rhs)
                    && xs.len() == w_view.shape.num_dims()
                    && xs.last() == ws.first()
                    && dims(&m.out).last() == ws.last()
                    && m.lhs.dtype == w.dtype
                    && m.out.dtype == w.dtype;
                fits.then(|| Stage::BiasReshape {
                    x: m.lhs.clone(),
                    w: w.clone(),
                    w_view: w_view.id,
                    y: m.out.clone(),
                })
            }
            (Stage::BiasReshape { x, w, w_view, y }, OperationIr::BaseFloat(BaseOperationIr::Reshape(s))) => {
                let n = &dims(w)[1..];
                let fits = dims(&s.input) == n
                    && s.input.dtype == y.dtype
                    && s.out.shape.num_dims() == y.shape.num_dims()
                    && leading_ones_then(&dims(&s.out), n);
                fits.then(|| Stage::Add {
                    x: x.clone(),
                    w: w.clone(),
                    w_view: *w_view,
                    y: y.clone(),
                    bias: s.input.clone(),
                    bias_view: s.out.id,
                })
            }
            (
                Stage::Add {
                    x,
                    w,
                    w_view,
                    y,
                    bias,
                    bias_view,
                },
                OperationIr::NumericFloat(_, NumericOperationIr::Add(b)),
            ) => {
                let (product, bias_read) = if b.lhs.id == y.id {
                    (&b.lhs, &b.rhs)
                } else {
                    (&b.rhs, &b.lhs)
                };
                let fits = product.id == y.id
                    && bias_read.id == *bias_view
                    && last_use(product)
                    && last_use(bias_read)
                    && dims(&b.out) == dims(y)
                    && b.out.dtype == y.dtype;
                fits.then(|| {
                    Stage::Done(Parts {
                        x: x.clone(),
                        w: w.clone(),
                        bias: bias.clone(),
                        w_view: *w_view,
                        bias_view: *bias_view,
                        y: b.out.clone(),
                        tail: Tail::Start,
                    })
                })
            }
            (Stage::Done(p), op) if p.tail.open() => p
                .tail
                .step(&p.y, op)
                .map(|tail| Stage::Done(Parts { tail, ..p.clone() })),
            _ => None,
        }
    }

    fn done(&self) -> bool {
        matches!(self, Stage::Done(p) if p.tail.complete())
    }

    fn extends(&self) -> bool {
        matches!(self, Stage::Done(p) if p.tail.open())
    }

    fn optimization(&self, ops: &[OperationIr]) -> MatmulBiasOptimization {
        match self {
            Stage::Done(p) => {
                let (act, out, scalars) = p.tail.matched().unwrap_or((Activation::Identity, p.y.id, Vec::new()));
                MatmulBiasOptimization {
                    x: (p.x.id, last_use(&p.x)),
                    w: (p.w.id, last_use(&p.w)),
                    bias: (p.bias.id, last_use(&p.bias)),
                    w_view: p.w_view,
                    bias_view: p.bias_view,
                    out,
                    act,
                    scalars,
                    operations: ops.to_vec(),
                }
            }
            _ => panic!("cudnn-backend: internal error: an incomplete matmul + bias match was finished"),
        }
    }

    fn wrap(optimization: MatmulBiasOptimization) -> CudnnOptimization {
        CudnnOptimization::MatmulBias(optimization)
    }
}

impl MatmulBiasOptimization {
    /// Runs the product with its bias (and activation) and registers the result; `Ok(false)`
    /// (nothing done) for a run with an activation that the graph does not take here (f64,
    /// a small product, scalars other than Burn's), whose operations then run one by one.
    pub(crate) fn execute(&self, context: &mut Context<CudnnFusionHandle>) -> Result<bool> {
        const OP: &str = "fused matmul + bias";
        if self.act != Activation::Identity {
            let (x_ir, w_ir) = (global_ir(context, &self.x.0, OP), global_ir(context, &self.w.0, OP));
            let exact = runs_unfused(x_ir.dtype, &to_dims(&x_ir.shape), &to_dims(&w_ir.shape));
            if exact || !scalars_match(context, &self.scalars) {
                return Ok(false);
            }
        }
        let dims_of = |id: &TensorId| to_dims(&global_ir(context, id, OP).shape);
        let (w_view, bias_view) = (dims_of(&self.w_view), dims_of(&self.bias_view));
        let out_ir = global_ir(context, &self.out, OP);
        let [x, w, bias] = take_inputs(context, [self.x, self.w, self.bias], OP);
        let out = biased_product(x, w, bias, &w_view, &bias_view, self.act)?;
        context.handles.register_float_tensor::<Cudnn>(&out_ir.id, out);
        Ok(true)
    }
}

/// Whether `x · w` (dims `x`, `w`) runs as the unfused operations do: f64, and products the
/// exact GEMM kernel takes.
fn runs_unfused(dtype: DType, x: &[i64], w: &[i64]) -> bool {
    let mut out_dims = x.to_vec();
    if let (Some(last), Some(&n)) = (out_dims.last_mut(), w.last()) {
        *last = n;
    }
    dtype == DType::F64 || math::is_small_product(&out_dims, x)
}

/// `act(x · w + bias)`: one cuDNN graph with the bias and the activation in its epilogue (as
/// `Cudnn`'s linear layer), or, where [`runs_unfused`] (only reached without an activation),
/// the matmul of `w` viewed as `w_view` then the add of `bias` viewed as `bias_view`, as the
/// unfused operations run.
fn biased_product(
    x: CudnnTensor,
    w: CudnnTensor,
    bias: CudnnTensor,
    w_view: &[i64],
    bias_view: &[i64],
    act: Activation,
) -> Result<CudnnTensor> {
    const OP: &str = "fused matmul + bias";
    if runs_unfused(x.dtype, x.dims(), w.dims()) {
        let y = math::float_matmul(x, w.reshape(w_view)?, OP)?;
        return exec::binary(y, bias.reshape(bias_view)?, BinaryOp::Add, OP);
    }
    linear_act(x, w, Some(bias), act)
}

#[cfg(test)]
mod tests {
    use burn_fusion::{FuserStatus, OperationFuser};
    use burn_ir::{BinaryOpIr, MatmulOpIr, ShapeOpIr, TensorStatus};

    use super::*;

    use TensorStatus::{NotInit, ReadOnly, ReadWrite};

    fn t(id: u64, dims: &[usize], status: TensorStatus) -> TensorIr {
        crate::burn::fusion::test_ir::t(id, dims, status, DType::F32)
    }

    /// `input` reshaped to `out`.
    fn reshape(input: TensorIr, out: TensorIr) -> OperationIr {
        OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr { input, out }))
    }

    /// Burn's linear forward on a `[B, S, K]` input (relative dims 1, 2, 3) with a `[K, N]`
    /// weight (N: 4): the weight reshaped, the matmul, the bias reshaped, the add.
    fn composed(product_status: TensorStatus, bias_view_status: TensorStatus) -> Vec<OperationIr> {
        vec![
            reshape(t(1, &[3, 4], ReadOnly), t(2, &[0, 3, 4], NotInit)),
            OperationIr::Float(
                DType::F32,
                FloatOperationIr::Matmul(MatmulOpIr {
                    lhs: t(3, &[1, 2, 3], ReadOnly),
                    rhs: t(2, &[0, 3, 4], ReadWrite),
                    out: t(4, &[1, 2, 4], NotInit),
                }),
            ),
            reshape(t(5, &[4], ReadOnly), t(6, &[0, 0, 4], NotInit)),
            OperationIr::NumericFloat(
                DType::F32,
                NumericOperationIr::Add(BinaryOpIr {
                    lhs: t(4, &[1, 2, 4], product_status),
                    rhs: t(6, &[0, 0, 4], bias_view_status),
                    out: t(7, &[1, 2, 4], NotInit),
                }),
            ),
        ]
    }

    #[test]
    fn the_composed_linear_forward_is_matched_whole() {
        let mut f = MatmulBiasFuser::default();
        for op in composed(ReadWrite, ReadWrite) {
            assert_eq!(f.status(), FuserStatus::Open);
            assert!(!f.properties().ready);
            f.fuse(&op);
        }
        // Complete, and still open to an activation.
        assert_eq!(f.status(), FuserStatus::Open);
        assert!(f.properties().ready && f.len() == 4);
        let o = f.complete().expect("a complete match");
        assert_eq!(
            (o.x, o.w, o.bias, o.out, o.act),
            (
                (TensorId::new(3), false),
                (TensorId::new(1), false),
                (TensorId::new(5), false),
                TensorId::new(7),
                Activation::Identity
            )
        );
        assert_eq!((o.w_view, o.bias_view), (TensorId::new(2), TensorId::new(6)));
        assert!(MatmulBiasFuser::matched(&o.operations).is_some());
        // Anything else next closes it on the four operations.
        f.fuse(&reshape(t(7, &[1, 2, 4], ReadWrite), t(8, &[1, 8], NotInit)));
        assert_eq!(f.status(), FuserStatus::Closed);
        assert!(f.properties().ready && f.len() == 4 && f.properties().score == 8);
    }

    #[test]
    fn a_relu_or_gelu_after_it_joins_the_epilogue() {
        use crate::burn::fusion::engine::act_tail::tests::{gelu, relu};
        for (tail, act, out) in [
            (relu(7, &[1, 2, 4], 8, true), Activation::Relu, 9),
            (gelu(7, &[1, 2, 4], 8), Activation::Gelu, 12),
        ] {
            let mut f = MatmulBiasFuser::default();
            let ops: Vec<_> = composed(ReadWrite, ReadWrite).into_iter().chain(tail).collect();
            for op in &ops {
                f.fuse(op);
            }
            assert_eq!(f.status(), FuserStatus::Closed);
            let o = f.complete().expect("a complete match");
            assert_eq!((o.act, o.out, o.operations.len()), (act, TensorId::new(out), ops.len()));
            assert_eq!(f.properties().score, 2 * ops.len() as u64);
            assert!(MatmulBiasFuser::matched(&ops).is_some_and(|m| m.act == act));
        }
        // A tail that breaks off (the pre-activation kept) leaves the linear forward alone.
        let mut f = MatmulBiasFuser::default();
        for op in composed(ReadWrite, ReadWrite)
            .into_iter()
            .chain(relu(7, &[1, 2, 4], 8, false))
        {
            f.fuse(&op);
        }
        assert_eq!(f.status(), FuserStatus::Closed);
        let o = f.complete().expect("the linear forward");
        assert_eq!(
            (o.act, o.out, o.operations.len(), f.len()),
            (Activation::Identity, TensorId::new(7), 4, 4)
        );
    }

    #[test]
    fn runs_that_keep_an_intermediate_or_differ_are_left_alone() {
        // The product read again later: it must be stored, so the run is not this pattern.
        for (product, bias_view) in [(ReadOnly, ReadWrite), (ReadWrite, ReadOnly)] {
            let mut f = MatmulBiasFuser::default();
            for op in composed(product, bias_view) {
                f.fuse(&op);
            }
            assert_eq!(f.status(), FuserStatus::Closed);
            assert!(!f.properties().ready);
        }
        // A bias of another width, and a prefix alone.
        let mut ops = composed(ReadWrite, ReadWrite);
        ops[2] = reshape(t(5, &[3], ReadOnly), t(6, &[0, 0, 3], NotInit));
        assert!(MatmulBiasFuser::matched(&ops).is_none());
        assert!(MatmulBiasFuser::matched(&composed(ReadWrite, ReadWrite)[..3]).is_none());
        // The weight reshaped to something other than `[1, K, N]`.
        assert!(!leading_ones_then(&[3, 0, 4], &[3, 4]));
        assert!(leading_ones_then(&[0, 0, 3, 4], &[3, 4]));
        assert!(!leading_ones_then(&[3, 4], &[3, 4]));
    }
}
