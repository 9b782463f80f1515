//! A biased 2-D convolution and Burn's relu after it, run as one cuDNN graph with the
//! activation in its epilogue.
//!
//! Burn's conv2d op carries its bias, which `Cudnn` already adds in the convolution's graph;
//! the relu after it is recorded as its composed operations ([`super::engine::act_tail`]). Where the
//! convolution's output is dropped after the relu (inference: under `Autodiff` Burn keeps it
//! for the backward pass), [`ConvActFuser`] takes the run and [`ConvActOptimization`]
//! computes it as one conv → bias → relu graph; a run recorded with other scalars runs its
//! operations one by one. Gelu stays with the elementwise fuser: cuDNN 9.14 offered no
//! engine for an f32 conv → bias → GELU graph (on an H200), whose fallback, the conv graph and
//! a bias/activation kernel, would also end the elementwise run that could carry on after it.

use burn_backend::ops::ConvOptions;
use burn_fusion::stream::Context;
use burn_ir::{Conv2dOpIr, ModuleOperationIr, OperationIr, TensorId};

use super::engine::act_tail::{scalars_match, Tail, TailScalars};
use super::engine::run::{global_ir, is_float, last_use, take_inputs};
use super::engine::staged::{self, StagedFuser};
use super::CudnnFusionHandle;
use super::CudnnOptimization;
use crate::burn::layers::conv_bias_act;
use crate::burn::ops::module::conv_geom;
use crate::burn::Cudnn;
use crate::error::Result;
use crate::types::{Activation, ConvGeometry};

/// A matched convolution with its activation, in relative ids.
#[derive(Clone, Debug)]
pub struct ConvActOptimization {
    /// The input, the filter and the bias, each with whether the run holds its last use.
    x: (TensorId, bool),
    w: (TensorId, bool),
    bias: (TensorId, bool),
    /// The convolution's geometry, from its recorded options.
    geometry: ConvGeometry,
    /// The activation's output.
    out: TensorId,
    act: Activation,
    scalars: TailScalars,
    pub(crate) operations: Vec<OperationIr>,
}

/// Where the match stands.
#[derive(Clone, Debug, Default)]
pub(crate) enum Stage {
    /// Waiting for a biased float convolution.
    #[default]
    Start,
    /// The convolution, and the activation after it as far as it matched.
    Conv { conv: Box<Conv2dOpIr>, tail: Tail },
}

/// Matches a biased conv2d followed by Burn's relu (see the module).
pub(crate) type ConvActFuser = StagedFuser<Stage>;

impl staged::Stage for Stage {
    type Optimization = ConvActOptimization;

    fn step(&self, op: &OperationIr, _ops: &[OperationIr]) -> Option<Stage> {
        match (self, op) {
            (Stage::Start, OperationIr::Module(ModuleOperationIr::Conv2d(c))) => {
                let fits = c.bias.is_some() && is_float(c.out.dtype);
                fits.then(|| Stage::Conv {
                    conv: Box::new(c.clone()),
                    tail: Tail::Start,
                })
            }
            (Stage::Conv { conv, tail }, op) if tail.open() => {
                tail.step(&conv.out, op).filter(Tail::is_relu).map(|tail| Stage::Conv {
                    conv: conv.clone(),
                    tail,
                })
            }
            _ => None,
        }
    }

    /// Only with its activation: a convolution alone runs as burn-fusion would run it.
    fn done(&self) -> bool {
        matches!(self, Stage::Conv { tail, .. } if tail.matched().is_some())
    }

    fn optimization(&self, ops: &[OperationIr]) -> ConvActOptimization {
        const INCOMPLETE: &str =
            "cudnn-backend: internal error: an incomplete convolution + activation match was finished";
        let Stage::Conv { conv, tail } = self else {
            panic!("{INCOMPLETE}")
        };
        let (Some(bias), Some((act, out, scalars))) = (&conv.bias, tail.matched()) else {
            panic!("{INCOMPLETE}")
        };
        ConvActOptimization {
            x: (conv.x.id, last_use(&conv.x)),
            w: (conv.weight.id, last_use(&conv.weight)),
            bias: (bias.id, last_use(bias)),
            geometry: conv_geom(&ConvOptions::<2>::from(conv.options.clone())),
            out,
            act,
            scalars,
            operations: ops.to_vec(),
        }
    }

    fn wrap(optimization: ConvActOptimization) -> CudnnOptimization {
        CudnnOptimization::ConvAct(optimization)
    }
}

impl ConvActOptimization {
    /// Runs the convolution with its bias and activation and registers the result; `Ok(false)`
    /// (nothing done) when the run's scalars are not Burn's, so the caller runs the
    /// operations one by one.
    pub(crate) fn execute(&self, context: &mut Context<CudnnFusionHandle>) -> Result<bool> {
        const OP: &str = "fused conv2d + relu";
        if !scalars_match(context, &self.scalars) {
            return Ok(false);
        }
        let out_ir = global_ir(context, &self.out, OP);
        let [x, w, bias] = take_inputs(context, [self.x, self.w, self.bias], OP);
        let y = conv_bias_act(OP, x, w, bias, &self.geometry, self.act)?;
        context.handles.register_float_tensor::<Cudnn>(&out_ir.id, y);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::DType;
    use burn_fusion::{FuserStatus, OperationFuser};
    use burn_ir::{Conv2dOptionsIr, TensorIr, TensorStatus};

    use super::*;
    use crate::burn::fusion::engine::act_tail::tests::{gelu, relu};
    use TensorStatus::{NotInit, ReadOnly};

    fn t(id: u64, dims: &[usize], status: TensorStatus) -> TensorIr {
        crate::burn::fusion::test_ir::t(id, dims, status, DType::F32)
    }

    /// A 3x3 convolution of `[1, 2, 3, 3]` by `[4, 2, 3, 3]` (relative dims), with a bias if
    /// asked, into tensor 4.
    fn conv(bias: bool) -> OperationIr {
        OperationIr::Module(ModuleOperationIr::Conv2d(Conv2dOpIr {
            x: t(1, &[0, 1, 2, 2], ReadOnly),
            weight: t(2, &[3, 1, 4, 4], ReadOnly),
            bias: bias.then(|| t(3, &[3], ReadOnly)),
            options: Conv2dOptionsIr {
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
            },
            out: t(4, &[0, 3, 2, 2], NotInit),
        }))
    }

    #[test]
    fn a_biased_convolution_and_its_relu_are_matched_whole() {
        let dims = [0, 3, 2, 2];
        let ops: Vec<_> = std::iter::once(conv(true)).chain(relu(4, &dims, 5, true)).collect();
        let mut f = ConvActFuser::default();
        for op in &ops {
            assert!(!f.properties().ready);
            f.fuse(op);
        }
        assert_eq!(f.status(), FuserStatus::Closed);
        let o = f.complete().expect("a complete match");
        assert_eq!(
            (o.act, o.out, o.bias.0),
            (Activation::Relu, TensorId::new(6), TensorId::new(3))
        );
        assert!(ConvActFuser::matched(&ops).is_some());
        // Gelu is left to the elementwise fuser.
        let gelu_ops: Vec<_> = std::iter::once(conv(true)).chain(gelu(4, &dims, 5)).collect();
        assert!(ConvActFuser::matched(&gelu_ops).is_none());
    }

    #[test]
    fn a_convolution_alone_without_bias_or_with_its_output_kept_is_left_alone() {
        let dims = [0, 3, 2, 2];
        let mut alone = ConvActFuser::default();
        alone.fuse(&conv(true));
        assert!(!alone.properties().ready && alone.status() == FuserStatus::Open);
        let unbiased: Vec<_> = std::iter::once(conv(false)).chain(relu(4, &dims, 5, true)).collect();
        assert!(ConvActFuser::matched(&unbiased).is_none());
        let kept: Vec<_> = std::iter::once(conv(true)).chain(relu(4, &dims, 5, false)).collect();
        let mut f = ConvActFuser::default();
        for op in &kept {
            f.fuse(op);
        }
        assert!(f.status() == FuserStatus::Closed && !f.properties().ready);
    }
}
