//! An activation as Burn composes it, right after the operation that makes its input: the
//! tail a cuDNN graph's epilogue can take in place of its own launch.
//!
//! burn-fusion 0.21 records Burn's default activations operation by operation: `relu(y)` as
//! `y <= 0` then a fill of that mask with 0, `gelu(y)` as `y / √2`, `erf`, `+ 1`, `y · _` and
//! `/ 2`. [`Tail`] follows those sequences after a producer `y`. A match needs `y` and every
//! intermediate at its last use inside the tail, so nothing but the activation is stored:
//! under `Autodiff` Burn keeps `y` for the backward pass, and the tail is left to the
//! elementwise fuser; it applies where the pre-activation is dropped (inference).
//!
//! Scalars are relative ids in the recorded operations: their values are checked when the
//! run executes ([`scalars_match`]), and a run with other values runs its operations one by
//! one.

use burn_fusion::stream::Context;
use burn_ir::{BaseOperationIr, FloatOperationIr, NumericOperationIr, OperationIr, ScalarIr, TensorId, TensorIr};

use crate::burn::fusion::engine::run::{last_use, scalar_f64};
use crate::burn::fusion::CudnnFusionHandle;
use crate::types::Activation;

/// The scalars a matched tail was recorded with and the values Burn's composition uses.
pub(crate) type TailScalars = Vec<(ScalarIr, f64)>;

/// Where the match of an activation after a producer stands.
#[derive(Clone, Debug, Default)]
pub(crate) enum Tail {
    /// Nothing after the producer yet.
    #[default]
    Start,
    /// relu: `y <= 0` made `mask`; the fill of `y` where it holds must follow.
    ReluFill { mask: TensorId, scalars: TailScalars },
    /// gelu: `y / √2` made `a`: `erf(a)` must follow.
    GeluErf { a: TensorId, scalars: TailScalars },
    /// gelu: `erf` made `b`: `b + 1` must follow.
    GeluOne { b: TensorId, scalars: TailScalars },
    /// gelu: `b + 1` made `c`: `y · c` must follow.
    GeluProduct { c: TensorId, scalars: TailScalars },
    /// gelu: `y · c` made `d`: `d / 2` must follow.
    GeluHalf { d: TensorId, scalars: TailScalars },
    /// The activation matched: `out` holds it.
    Done {
        act: Activation,
        out: TensorIr,
        scalars: TailScalars,
    },
}

/// `op`'s operand `t` is the tensor `id` at its last use.
fn consumes(t: &TensorIr, id: TensorId) -> bool {
    t.id == id && last_use(t)
}

/// `scalars` with `(s, value)` appended.
fn with(scalars: &TailScalars, s: ScalarIr, value: f64) -> TailScalars {
    let mut all = scalars.clone();
    all.push((s, value));
    all
}

impl Tail {
    /// The tail after `op`, `y` being the producer's output, or `None` when `op` breaks it.
    pub(crate) fn step(&self, y: &TensorIr, op: &OperationIr) -> Option<Tail> {
        use NumericOperationIr as N;
        let same = |out: &TensorIr| out.shape == y.shape && out.dtype == y.dtype;
        match (self, op) {
            (Tail::Start, OperationIr::NumericFloat(_, N::LowerEqualElem(s)))
                if s.lhs.id == y.id && !last_use(&s.lhs) =>
            {
                Some(Tail::ReluFill {
                    mask: s.out.id,
                    scalars: vec![(s.rhs, 0.0)],
                })
            }
            (Tail::ReluFill { mask, scalars }, OperationIr::BaseFloat(BaseOperationIr::MaskFill(m)))
                if consumes(&m.tensor, y.id) && consumes(&m.mask, *mask) && same(&m.out) =>
            {
                Some(Tail::Done {
                    act: Activation::Relu,
                    out: m.out.clone(),
                    scalars: with(scalars, m.value, 0.0),
                })
            }
            (Tail::Start, OperationIr::NumericFloat(_, N::DivScalar(s))) if s.lhs.id == y.id && !last_use(&s.lhs) => {
                Some(Tail::GeluErf {
                    a: s.out.id,
                    scalars: vec![(s.rhs, std::f64::consts::SQRT_2)],
                })
            }
            (Tail::GeluErf { a, scalars }, OperationIr::Float(_, FloatOperationIr::Erf(u)))
                if consumes(&u.input, *a) =>
            {
                Some(Tail::GeluOne {
                    b: u.out.id,
                    scalars: scalars.clone(),
                })
            }
            (Tail::GeluOne { b, scalars }, OperationIr::NumericFloat(_, N::AddScalar(s))) if consumes(&s.lhs, *b) => {
                Some(Tail::GeluProduct {
                    c: s.out.id,
                    scalars: with(scalars, s.rhs, 1.0),
                })
            }
            (Tail::GeluProduct { c, scalars }, OperationIr::NumericFloat(_, N::Mul(m))) => {
                let operands = (consumes(&m.lhs, y.id) && consumes(&m.rhs, *c))
                    || (consumes(&m.rhs, y.id) && consumes(&m.lhs, *c));
                operands.then(|| Tail::GeluHalf {
                    d: m.out.id,
                    scalars: scalars.clone(),
                })
            }
            (Tail::GeluHalf { d, scalars }, OperationIr::NumericFloat(_, N::DivScalar(s)))
                if consumes(&s.lhs, *d) && same(&s.out) =>
            {
                Some(Tail::Done {
                    act: Activation::Gelu,
                    out: s.out.clone(),
                    scalars: with(scalars, s.rhs, 2.0),
                })
            }
            _ => None,
        }
    }

    /// A relu, matched or under way (for producers whose graphs take no other activation).
    pub(crate) fn is_relu(&self) -> bool {
        matches!(
            self,
            Tail::ReluFill { .. }
                | Tail::Done {
                    act: Activation::Relu,
                    ..
                }
        )
    }

    /// No tail (the producer alone) or a whole one.
    pub(crate) fn complete(&self) -> bool {
        matches!(self, Tail::Start | Tail::Done { .. })
    }

    /// An activation may still follow.
    pub(crate) fn open(&self) -> bool {
        !matches!(self, Tail::Done { .. })
    }

    /// The activation, where it sits, and the scalars to check.
    pub(crate) fn matched(&self) -> Option<(Activation, TensorId, TailScalars)> {
        match self {
            Tail::Done { act, out, scalars } => Some((*act, out.id, scalars.clone())),
            _ => None,
        }
    }
}

/// Whether the scalars of this execution are Burn's (√2 to f32's precision, as Burn passes it).
pub(crate) fn scalars_match(context: &Context<CudnnFusionHandle>, scalars: &TailScalars) -> bool {
    scalars
        .iter()
        .all(|&(s, want)| scalar_f64(context, s).is_some_and(|v| (v - want).abs() <= 1e-6 * want.abs().max(1.0)))
}

#[cfg(test)]
pub(crate) mod tests {
    use burn_backend::DType;
    use burn_ir::{BinaryOpIr, MaskFillOpIr, ScalarOpIr, TensorStatus, UnaryOpIr};

    use super::*;
    use TensorStatus::{NotInit, ReadOnly, ReadWrite};

    fn t(id: u64, dims: &[usize], status: TensorStatus, dtype: DType) -> TensorIr {
        crate::burn::fusion::test_ir::t(id, dims, status, dtype)
    }

    fn scalar(lhs: TensorIr, id: u64, out: TensorIr) -> ScalarOpIr {
        ScalarOpIr {
            lhs,
            rhs: ScalarIr::UInt(id),
            out,
        }
    }

    /// Burn's relu of tensor `y` (dims `dims`), its operations numbered from `next`;
    /// `y_last`: the fill holds `y`'s last use.
    pub(crate) fn relu(y: u64, dims: &[usize], next: u64, y_last: bool) -> Vec<OperationIr> {
        let (f, b) = (DType::F32, DType::Bool(burn_backend::BoolStore::Native));
        let last = if y_last { ReadWrite } else { ReadOnly };
        vec![
            OperationIr::NumericFloat(
                f,
                NumericOperationIr::LowerEqualElem(scalar(t(y, dims, ReadOnly, f), 0, t(next, dims, NotInit, b))),
            ),
            OperationIr::BaseFloat(BaseOperationIr::MaskFill(MaskFillOpIr {
                tensor: t(y, dims, last, f),
                mask: t(next, dims, ReadWrite, b),
                value: ScalarIr::UInt(1),
                out: t(next + 1, dims, NotInit, f),
            })),
        ]
    }

    /// Burn's gelu of tensor `y`, its operations numbered from `next`.
    pub(crate) fn gelu(y: u64, dims: &[usize], next: u64) -> Vec<OperationIr> {
        let f = DType::F32;
        let n = |i: u64, s| t(next + i, dims, s, f);
        vec![
            OperationIr::NumericFloat(
                f,
                NumericOperationIr::DivScalar(scalar(t(y, dims, ReadOnly, f), 0, n(0, NotInit))),
            ),
            OperationIr::Float(
                f,
                FloatOperationIr::Erf(UnaryOpIr {
                    input: n(0, ReadWrite),
                    out: n(1, NotInit),
                }),
            ),
            OperationIr::NumericFloat(
                f,
                NumericOperationIr::AddScalar(scalar(n(1, ReadWrite), 1, n(2, NotInit))),
            ),
            OperationIr::NumericFloat(
                f,
                NumericOperationIr::Mul(BinaryOpIr {
                    lhs: t(y, dims, ReadWrite, f),
                    rhs: n(2, ReadWrite),
                    out: n(3, NotInit),
                }),
            ),
            OperationIr::NumericFloat(
                f,
                NumericOperationIr::DivScalar(scalar(n(3, ReadWrite), 2, n(4, NotInit))),
            ),
        ]
    }

    fn run(ops: &[OperationIr], y: &TensorIr) -> Option<Tail> {
        ops.iter().try_fold(Tail::Start, |tail, op| tail.step(y, op))
    }

    #[test]
    fn burns_relu_and_gelu_are_matched_after_their_producer() {
        let y = t(9, &[1, 2], NotInit, DType::F32);
        let relu_tail = run(&relu(9, &[1, 2], 20, true), &y).expect("relu matched");
        let (act, out, scalars) = relu_tail.matched().expect("complete");
        assert_eq!((act, out, scalars.len()), (Activation::Relu, TensorId::new(21), 2));
        let gelu_tail = run(&gelu(9, &[1, 2], 20), &y).expect("gelu matched");
        let (act, out, scalars) = gelu_tail.matched().expect("complete");
        assert_eq!((act, out), (Activation::Gelu, TensorId::new(24)));
        assert_eq!(
            scalars.iter().map(|s| s.1).collect::<Vec<_>>(),
            [std::f64::consts::SQRT_2, 1.0, 2.0]
        );
        assert!(!gelu_tail.open() && gelu_tail.complete());
    }

    /// A fusion context holding the given relative scalars (ids 0, 1, ..).
    fn context_with(values: &[f64]) -> Context<CudnnFusionHandle> {
        use burn_fusion::stream::ScalarId;
        Context {
            tensors: Default::default(),
            handles: burn_ir::HandleContainer::new(),
            scalars: values
                .iter()
                .enumerate()
                .map(|(i, &v)| (ScalarId { value: i as u64 }, ScalarIr::Float(v)))
                .collect(),
            shapes_relative2global: Default::default(),
        }
    }

    #[test]
    fn scalars_are_checked_against_burns_when_the_run_executes() {
        let y = t(9, &[1, 2], NotInit, DType::F32);
        let (_, _, gelu_scalars) = run(&gelu(9, &[1, 2], 20), &y).and_then(|t| t.matched()).expect("gelu");
        // Burn passes √2 as an f32.
        let sqrt2 = f64::from(std::f32::consts::SQRT_2);
        assert!(scalars_match(&context_with(&[sqrt2, 1.0, 2.0]), &gelu_scalars));
        // A scaled variant (`x / 2` where Burn divides by √2) is not gelu.
        assert!(!scalars_match(&context_with(&[2.0, 1.0, 2.0]), &gelu_scalars));
        let (_, _, relu_scalars) = run(&relu(9, &[1, 2], 20, true), &y)
            .and_then(|t| t.matched())
            .expect("relu");
        assert!(scalars_match(&context_with(&[0.0, 0.0]), &relu_scalars));
        // `x <= 0.5` filled with 0 is not relu; a missing scalar is no match.
        assert!(!scalars_match(&context_with(&[0.5, 0.0]), &relu_scalars));
        assert!(!scalars_match(&context_with(&[0.0]), &relu_scalars));
    }

    #[test]
    fn a_tail_that_keeps_its_input_or_reads_another_tensor_is_refused() {
        let y = t(9, &[1, 2], NotInit, DType::F32);
        // The pre-activation read again later (Autodiff keeps it): no match.
        assert!(run(&relu(9, &[1, 2], 20, false), &y).is_none());
        // A relu of another tensor.
        assert!(run(&relu(8, &[1, 2], 20, true), &y).is_none());
        // Half a gelu is no complete tail.
        let half = run(&gelu(9, &[1, 2], 20)[..3], &y).expect("a prefix");
        assert!(!half.complete() && half.open() && half.matched().is_none());
    }
}
