//! Dynamic quantization as Burn composes it under `Fusion<B>`, run as `Cudnn`'s
//! `quantize_dynamic` (scales computed in f32).
//!
//! burn-fusion 0.21 records `quantize` but not `quantize_dynamic`, so Burn's default records
//! the range and the scales as tensor ops in the input's dtype: `min(x)` and `max(x)` (per
//! block: a reshape to `[blocks, block_len]`, `min_dim` / `max_dim` over dim 1 and reshapes
//! to the scales' shape), `|min|`, `|max|`, `lower`, `mask_where` (the larger of the two),
//! `* 2`, `/ (b - a)` (the quantized range), then `quantize(x, scales)`. For f16 or bf16
//! inputs every step rounds to the half dtype, so the scales, and then the quantized values
//! at rounding boundaries, differ from what `Cudnn` (and burn-ndarray, and PyTorch) compute
//! in f32. [`QuantizeDynamicFuser`] recognizes exactly that run, with every intermediate at
//! its last use, and [`QuantizeDynamicOptimization`] runs `Cudnn`'s `quantize_dynamic` on
//! `x`. The two scalars are relative at fusion time, so their values (2 and `b - a`) are
//! checked when the run executes; any other values run the operations one by one.

use burn_backend::quantization::{QuantLevel, QuantScheme};
use burn_fusion::stream::Context;
use burn_ir::{BaseOperationIr, FloatOperationIr, NumericOperationIr, OperationIr, ScalarIr, TensorId, TensorIr};

use super::engine::run::{global_ir, handle_tensor, is_float, last_use, scalar_f64};
use super::engine::staged::{self, StagedFuser};
use super::CudnnFusionHandle;
use super::CudnnOptimization;
use crate::burn::ops::qtensor::{quantize_dynamic_impl, supports_scheme};
use crate::burn::Cudnn;
use crate::error::Result;

/// The matched run, in relative ids.
#[derive(Clone, Debug)]
pub struct QuantizeDynamicOptimization {
    /// The quantized tensor and whether the run holds its last use.
    x: (TensorId, bool),
    /// The quantized result.
    out: TensorId,
    scheme: QuantScheme,
    /// The scalars of `* 2` and `/ (b - a)`, checked at execution.
    factor: ScalarIr,
    divisor: ScalarIr,
    pub(crate) operations: Vec<OperationIr>,
}

/// Where the match stands; `x` is the input being quantized.
#[derive(Clone, Debug, Default)]
pub(crate) enum Stage {
    /// Waiting for `min(x)` (per tensor) or the reshape of `x` into blocks.
    #[default]
    Start,
    /// Per tensor: waiting for `max(x)`.
    Max { x: TensorIr, min: TensorId },
    /// Per block: waiting for `min_dim(blocks, 1)`.
    BlockMin { x: TensorIr, blocks: TensorId },
    /// Per block: waiting for the reshape of the block minima.
    BlockMinReshape {
        x: TensorIr,
        blocks: TensorId,
        min: TensorId,
    },
    /// Per block: waiting for `max_dim(blocks, 1)`.
    BlockMax {
        x: TensorIr,
        blocks: TensorId,
        min: TensorId,
    },
    /// Per block: waiting for the reshape of the block maxima.
    BlockMaxReshape { x: TensorIr, min: TensorId, max: TensorId },
    /// Waiting for `|min|`.
    AbsMin { x: TensorIr, min: TensorId, max: TensorId },
    /// Waiting for `|max|`.
    AbsMax {
        x: TensorIr,
        abs_min: TensorId,
        max: TensorId,
    },
    /// Waiting for `|min| < |max|`.
    Lower {
        x: TensorIr,
        abs_min: TensorId,
        abs_max: TensorId,
    },
    /// Waiting for the larger of the two.
    Select {
        x: TensorIr,
        abs_min: TensorId,
        abs_max: TensorId,
        mask: TensorId,
    },
    /// Waiting for `* 2`.
    Double { x: TensorIr, range: TensorId },
    /// Waiting for `/ (b - a)`.
    Divide {
        x: TensorIr,
        doubled: TensorId,
        factor: ScalarIr,
    },
    /// Waiting for `quantize(x, scales)`.
    Quantize {
        x: TensorIr,
        scales: TensorId,
        factor: ScalarIr,
        divisor: ScalarIr,
    },
    /// The whole run matched.
    Done {
        x: TensorIr,
        out: TensorId,
        scheme: QuantScheme,
        factor: ScalarIr,
        divisor: ScalarIr,
    },
}

/// Matches Burn's composed dynamic quantization (see the module).
pub(crate) type QuantizeDynamicFuser = StagedFuser<Stage>;

/// `t` is tensor `id` read at its last use.
fn last(t: &TensorIr, id: TensorId) -> bool {
    t.id == id && last_use(t)
}

/// `t` is tensor `id` read again later.
fn kept(t: &TensorIr, id: TensorId) -> bool {
    t.id == id && !last_use(t)
}

impl staged::Stage for Stage {
    type Optimization = QuantizeDynamicOptimization;

    fn step(&self, op: &OperationIr, ops: &[OperationIr]) -> Option<Stage> {
        use BaseOperationIr as Base;
        use NumericOperationIr as Num;
        let stage = match (self, op) {
            (Stage::Start, OperationIr::NumericFloat(_, Num::Min(r)))
                if is_float(r.input.dtype) && !last_use(&r.input) =>
            {
                Stage::Max {
                    x: r.input.clone(),
                    min: r.out.id,
                }
            }
            (Stage::Start, OperationIr::BaseFloat(Base::Reshape(r)))
                if is_float(r.input.dtype) && !last_use(&r.input) && r.out.shape.num_dims() == 2 =>
            {
                Stage::BlockMin {
                    x: r.input.clone(),
                    blocks: r.out.id,
                }
            }
            (Stage::Max { x, min }, OperationIr::NumericFloat(_, Num::Max(r))) if kept(&r.input, x.id) => {
                Stage::AbsMin {
                    x: x.clone(),
                    min: *min,
                    max: r.out.id,
                }
            }
            (Stage::BlockMin { x, blocks }, OperationIr::NumericFloat(_, Num::MinDim(r)))
                if kept(&r.input, *blocks) && r.axis == 1 =>
            {
                Stage::BlockMinReshape {
                    x: x.clone(),
                    blocks: *blocks,
                    min: r.out.id,
                }
            }
            (Stage::BlockMinReshape { x, blocks, min }, OperationIr::BaseFloat(Base::Reshape(r)))
                if last(&r.input, *min) =>
            {
                Stage::BlockMax {
                    x: x.clone(),
                    blocks: *blocks,
                    min: r.out.id,
                }
            }
            (Stage::BlockMax { x, blocks, min }, OperationIr::NumericFloat(_, Num::MaxDim(r)))
                if last(&r.input, *blocks) && r.axis == 1 =>
            {
                Stage::BlockMaxReshape {
                    x: x.clone(),
                    min: *min,
                    max: r.out.id,
                }
            }
            (Stage::BlockMaxReshape { x, min, max }, OperationIr::BaseFloat(Base::Reshape(r)))
                if last(&r.input, *max) =>
            {
                Stage::AbsMin {
                    x: x.clone(),
                    min: *min,
                    max: r.out.id,
                }
            }
            (Stage::AbsMin { x, min, max }, OperationIr::NumericFloat(_, Num::Abs(u))) if last(&u.input, *min) => {
                Stage::AbsMax {
                    x: x.clone(),
                    abs_min: u.out.id,
                    max: *max,
                }
            }
            (Stage::AbsMax { x, abs_min, max }, OperationIr::NumericFloat(_, Num::Abs(u))) if last(&u.input, *max) => {
                Stage::Lower {
                    x: x.clone(),
                    abs_min: *abs_min,
                    abs_max: u.out.id,
                }
            }
            (Stage::Lower { x, abs_min, abs_max }, OperationIr::NumericFloat(_, Num::Lower(b)))
                if kept(&b.lhs, *abs_min) && kept(&b.rhs, *abs_max) =>
            {
                Stage::Select {
                    x: x.clone(),
                    abs_min: *abs_min,
                    abs_max: *abs_max,
                    mask: b.out.id,
                }
            }
            (
                Stage::Select {
                    x,
                    abs_min,
                    abs_max,
                    mask,
                },
                OperationIr::BaseFloat(Base::MaskWhere(m)),
            ) if last(&m.tensor, *abs_min) && last(&m.mask, *mask) && last(&m.value, *abs_max) => Stage::Double {
                x: x.clone(),
                range: m.out.id,
            },
            (Stage::Double { x, range }, OperationIr::NumericFloat(_, Num::MulScalar(s))) if last(&s.lhs, *range) => {
                Stage::Divide {
                    x: x.clone(),
                    doubled: s.out.id,
                    factor: s.rhs,
                }
            }
            (Stage::Divide { x, doubled, factor }, OperationIr::NumericFloat(_, Num::DivScalar(s)))
                if last(&s.lhs, *doubled) =>
            {
                Stage::Quantize {
                    x: x.clone(),
                    scales: s.out.id,
                    factor: *factor,
                    divisor: s.rhs,
                }
            }
            (
                Stage::Quantize {
                    x,
                    scales,
                    factor,
                    divisor,
                },
                OperationIr::Float(_, FloatOperationIr::Quantize(q)),
            ) if q.tensor.id == x.id && last(&q.qparams.scales, *scales) && level_fits(ops, &q.scheme) => Stage::Done {
                x: q.tensor.clone(),
                out: q.out.id,
                scheme: q.scheme,
                factor: *factor,
                divisor: *divisor,
            },
            _ => return None,
        };
        Some(stage)
    }

    fn done(&self) -> bool {
        matches!(self, Stage::Done { .. })
    }

    fn optimization(&self, ops: &[OperationIr]) -> QuantizeDynamicOptimization {
        match self {
            Stage::Done {
                x,
                out,
                scheme,
                factor,
                divisor,
            } => QuantizeDynamicOptimization {
                x: (x.id, last_use(x)),
                out: *out,
                scheme: *scheme,
                factor: *factor,
                divisor: *divisor,
                operations: ops.to_vec(),
            },
            _ => panic!("cudnn-backend: internal error: an incomplete dynamic-quantization match was finished"),
        }
    }

    fn wrap(optimization: QuantizeDynamicOptimization) -> CudnnOptimization {
        CudnnOptimization::QuantizeDynamic(optimization)
    }
}

/// The scheme is one `Cudnn` quantizes, at the level the run (`ops`, starting with the
/// reshape into blocks or with `min`) computed scales for. Sizes are not checked here: the
/// fusers see relative shapes (each distinct size replaced by an id), so whether the blocks
/// divide the tensor is checked on the real shape when the run executes.
fn level_fits(ops: &[OperationIr], scheme: &QuantScheme) -> bool {
    let blockwise = matches!(ops.first(), Some(OperationIr::BaseFloat(BaseOperationIr::Reshape(_))));
    let level_ok = match scheme.level {
        QuantLevel::Tensor => !blockwise,
        QuantLevel::Block(_) => blockwise,
    };
    level_ok && supports_scheme(scheme)
}

impl QuantizeDynamicOptimization {
    /// Quantizes `x` with f32 scales and registers the result; `Ok(false)` (nothing done)
    /// when the run's scalars are not Burn's `2` and `b - a`, so the caller runs the
    /// operations one by one.
    pub(crate) fn execute(&self, context: &mut Context<CudnnFusionHandle>) -> Result<bool> {
        const OP: &str = "fused quantize_dynamic";
        let (a, b) = self.scheme.value.range();
        let expected = [(self.factor, 2.0), (self.divisor, f64::from(b - a))];
        if !expected.iter().all(|&(s, want)| scalar_f64(context, s) == Some(want)) {
            return Ok(false);
        }
        let x_ir = global_ir(context, &self.x.0, OP);
        if let QuantLevel::Block(b) = self.scheme.level {
            if !x_ir.shape.num_elements().is_multiple_of(b.num_elements()) {
                return Ok(false);
            }
        }
        let out_ir = global_ir(context, &self.out, OP);
        let x = handle_tensor(context, &x_ir.id, OP);
        if self.x.1 {
            context.handles.remove_handle(x_ir.id);
        }
        let q = quantize_dynamic_impl(x, &self.scheme, OP)?;
        context.handles.register_quantized_tensor::<Cudnn>(&out_ir.id, q);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::quantization::{BlockSize, QuantValue};
    use burn_backend::DType;
    use burn_fusion::{FuserStatus, OperationFuser};
    use burn_ir::{
        BinaryOpIr, MaskWhereOpIr, QuantizationParametersIr, QuantizeOpIr, ReduceDimOpIr, ReduceOpIr, ScalarOpIr,
        ShapeOpIr, TensorStatus, UnaryOpIr,
    };

    use super::*;

    use crate::burn::fusion::test_ir::t;

    /// The ops Burn's default `quantize_dynamic` records for an f16 `[4, 8]` input: per
    /// tensor, or per block of 8 (`[4, 1]` scales). `keep_range`: the range is read again
    /// after the run (no match then).
    fn composed(blockwise: bool, keep_range: bool) -> Vec<OperationIr> {
        use TensorStatus::{NotInit, ReadOnly, ReadWrite};
        let h = DType::F16;
        let x = |s| t(1, &[4, 8], s, h);
        let p: &[usize] = if blockwise { &[4, 1] } else { &[1] };
        let mut ops = Vec::new();
        if blockwise {
            ops.push(OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
                input: x(ReadOnly),
                out: t(2, &[4, 8], NotInit, h),
            })));
            for (op_in, status, reduced, reshaped) in [(2, ReadOnly, 3, 4), (2, ReadWrite, 5, 6)] {
                let r = ReduceDimOpIr {
                    input: t(op_in, &[4, 8], status, h),
                    out: t(reduced, &[4, 1], NotInit, h),
                    axis: 1,
                    accumulator_len: 1,
                };
                let min = reduced == 3;
                ops.push(OperationIr::NumericFloat(
                    h,
                    if min {
                        NumericOperationIr::MinDim(r)
                    } else {
                        NumericOperationIr::MaxDim(r)
                    },
                ));
                ops.push(OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr {
                    input: t(reduced, &[4, 1], ReadWrite, h),
                    out: t(reshaped, p, NotInit, h),
                })));
            }
        } else {
            ops.push(OperationIr::NumericFloat(
                h,
                NumericOperationIr::Min(ReduceOpIr {
                    input: x(ReadOnly),
                    out: t(4, p, NotInit, h),
                }),
            ));
            ops.push(OperationIr::NumericFloat(
                h,
                NumericOperationIr::Max(ReduceOpIr {
                    input: x(ReadOnly),
                    out: t(6, p, NotInit, h),
                }),
            ));
        }
        for (input, out) in [(4, 7), (6, 8)] {
            ops.push(OperationIr::NumericFloat(
                h,
                NumericOperationIr::Abs(UnaryOpIr {
                    input: t(input, p, ReadWrite, h),
                    out: t(out, p, NotInit, h),
                }),
            ));
        }
        ops.push(OperationIr::NumericFloat(
            h,
            NumericOperationIr::Lower(BinaryOpIr {
                lhs: t(7, p, ReadOnly, h),
                rhs: t(8, p, ReadOnly, h),
                out: t(9, p, NotInit, DType::Bool(burn_backend::BoolStore::Native)),
            }),
        ));
        ops.push(OperationIr::BaseFloat(BaseOperationIr::MaskWhere(MaskWhereOpIr {
            tensor: t(7, p, ReadWrite, h),
            mask: t(9, p, ReadWrite, DType::Bool(burn_backend::BoolStore::Native)),
            value: t(8, p, ReadWrite, h),
            out: t(10, p, NotInit, h),
        })));
        ops.push(OperationIr::NumericFloat(
            h,
            NumericOperationIr::MulScalar(ScalarOpIr {
                lhs: t(10, p, ReadWrite, h),
                rhs: ScalarIr::UInt(0),
                out: t(11, p, NotInit, h),
            }),
        ));
        ops.push(OperationIr::NumericFloat(
            h,
            NumericOperationIr::DivScalar(ScalarOpIr {
                lhs: t(11, p, ReadWrite, h),
                rhs: ScalarIr::UInt(1),
                out: t(12, p, NotInit, h),
            }),
        ));
        let scheme = QuantScheme::default().with_value(QuantValue::Q8S);
        let scheme = if blockwise {
            scheme.with_level(QuantLevel::Block(BlockSize::new([8])))
        } else {
            scheme
        };
        let status = if keep_range { ReadOnly } else { ReadWrite };
        ops.push(OperationIr::Float(
            h,
            FloatOperationIr::Quantize(QuantizeOpIr {
                tensor: x(ReadWrite),
                qparams: QuantizationParametersIr {
                    scales: t(12, p, status, h),
                },
                scheme,
                out: t(13, &[4, 8], NotInit, DType::QFloat(scheme)),
            }),
        ));
        ops
    }

    #[test]
    fn burns_composed_dynamic_quantization_is_matched_whole() {
        for blockwise in [false, true] {
            let ops = composed(blockwise, false);
            let mut f = QuantizeDynamicFuser::default();
            for op in &ops {
                assert_eq!(f.status(), FuserStatus::Open, "blockwise {blockwise}");
                assert!(!f.properties().ready);
                f.fuse(op);
            }
            assert_eq!(f.status(), FuserStatus::Closed);
            assert!(f.properties().ready && f.len() == ops.len(), "blockwise {blockwise}");
            let o = f.complete().expect("a match");
            assert_eq!((o.x, o.out), ((TensorId::new(1), true), TensorId::new(13)));
            assert_eq!((o.factor, o.divisor), (ScalarIr::UInt(0), ScalarIr::UInt(1)));
            assert!(QuantizeDynamicFuser::matched(&o.operations).is_some());
        }
    }

    #[test]
    fn blockwise_runs_match_on_relative_shapes() {
        // burn-fusion hands the fusers relative shapes: each distinct size becomes an id, so
        // a `[16, 64]` input quantized in blocks of 32 arrives as `[1, 2]`, whose "element
        // count" says nothing about the blocks.
        let mut ops = composed(true, false);
        for op in &mut ops {
            if let OperationIr::Float(_, FloatOperationIr::Quantize(q)) = op {
                q.tensor.shape = burn_backend::Shape::from(vec![1, 2]);
                q.scheme = q.scheme.with_level(QuantLevel::Block(BlockSize::new([32])));
            }
            if let OperationIr::BaseFloat(BaseOperationIr::Reshape(r)) = op {
                if r.input.id == TensorId::new(1) {
                    r.input.shape = burn_backend::Shape::from(vec![1, 2]);
                }
            }
        }
        assert!(QuantizeDynamicFuser::matched(&ops).is_some());
    }

    #[test]
    fn runs_that_differ_are_left_alone() {
        // The scales are read after the run.
        assert!(QuantizeDynamicFuser::matched(&composed(false, true)).is_none());
        // A prefix is not a match.
        let ops = composed(true, false);
        assert!(QuantizeDynamicFuser::matched(&ops[..ops.len() - 1]).is_none());
        // A tensor-level run that quantizes per block (or the reverse) is not Burn's.
        let mut ops = composed(false, false);
        if let Some(OperationIr::Float(_, FloatOperationIr::Quantize(q))) = ops.last_mut() {
            q.scheme = q.scheme.with_level(QuantLevel::Block(BlockSize::new([8])));
        }
        assert!(QuantizeDynamicFuser::matched(&ops).is_none());
    }
}
