//! A run of elementwise operations as one generated kernel: [`ElementwiseOptimization`].

use std::sync::Arc;

use burn_backend::DType;
use burn_fusion::stream::Context;
use burn_ir::{OperationIr, TensorId};
use cudarc::driver::CudaFunction;
use smallvec::SmallVec;

use crate::burn::fusion::engine::launch_cache::LaunchCache;
use crate::burn::fusion::engine::run::{
    channels_last_walk, global_ir, inverse, permuted, release_consumed, run_inputs, scalar_value, warn_unbuildable,
    FusedInput, FusedScalar, FusedView,
};
use crate::burn::fusion::CudnnFusionHandle;
use crate::burn::tensor::{to_dims, CudnnTensor};
use crate::burn::{exec, Cudnn, CudnnDevice};
use crate::error::Result;
use crate::ops::fused::{self, FusedLaunch, Program, Variant};
use crate::view::ViewLayout;

/// A run of elementwise operations as one generated kernel.
#[derive(Clone, Debug)]
pub struct ElementwiseOptimization {
    pub(crate) program: Program,
    pub(crate) inputs: Vec<FusedInput>,
    /// Stored tensors (relative ids) and their dtypes, in the program's output order.
    pub(crate) outputs: Vec<(TensorId, DType)>,
    /// Tensors made outside the run and dropped inside it.
    pub(crate) dropped: Vec<TensorId>,
    /// Views the run absorbed (an input may be one).
    pub(crate) views: Vec<FusedView>,
    pub(crate) scalars: Vec<FusedScalar>,
    /// Values of the run differ in rank (their non-unit dims agree): inputs are read as views
    /// of the first output's shape (copied where no view exists), and each output is stored
    /// with its own.
    pub(crate) flat: bool,
    /// A mixed run (relative ids of a tensor of the run's shape and one of its small shape):
    /// inputs of a lower rank are read as views of the small shape, and the small outputs
    /// are stored with it (then viewed with their own dims).
    pub(crate) mixed: Option<(TensorId, TensorId)>,
    /// Where a run that reads no tensor launches.
    pub(crate) device: Option<CudnnDevice>,
    /// The operations, for the serialized state and the unfused fallback.
    pub(crate) operations: Vec<OperationIr>,
    /// The program's kernel once built, with the launch variant it was built for (an
    /// optimization lives on one device).
    pub(crate) function: Option<(Variant, CudaFunction)>,
    /// The kernel failed to build: every execution runs the operations one by one, without
    /// asking the builder again.
    pub(crate) unbuildable: bool,
    /// The pointer-free parts of recent launches by key: an execution with a key seen
    /// before (the same shapes, strides, dtypes and alignment) skips the checks and the
    /// packing.
    pub(crate) packed: LaunchCache<Box<fused::PackedLaunch>>,
}

impl ElementwiseOptimization {
    /// Marks the program as unbuildable for good (its operations run one by one from now
    /// on, with a one-time warning); false, for [`ElementwiseOptimization::execute`].
    fn unbuildable_after(&mut self, e: crate::Error) -> bool {
        self.unbuildable = true;
        warn_unbuildable("fused elementwise", &e)
    }

    /// Runs the program; false (nothing consumed) when its kernel is still being built or
    /// cannot be built, so the caller runs the operations one by one instead.
    pub(crate) fn execute(&mut self, context: &mut Context<CudnnFusionHandle>) -> Result<bool> {
        const OP: &str = "fused elementwise";
        if self.unbuildable {
            return Ok(false);
        }
        let mut run = run_inputs(context, &self.inputs, &self.views, OP)?;
        let outputs_ir: Vec<_> = self.outputs.iter().map(|(id, _)| global_ir(context, id, OP)).collect();
        // A mixed run covers the dims of its run-shaped reference; its small outputs have
        // those of the small one.
        let (full, mixed_small) = match self.mixed {
            Some((full_ref, small_ref)) => (
                to_dims(&global_ir(context, &full_ref, OP).shape),
                Some(to_dims(&global_ir(context, &small_ref, OP).shape)),
            ),
            None => (to_dims(&outputs_ir[0].shape), None),
        };
        // Inputs read in another shape than their own: every input of a flat run as the
        // first output's, the lower-rank inputs of a mixed run as the small shape.
        let read_as = |t: CudnnTensor| match &mixed_small {
            _ if self.flat => t.reshape(&full),
            Some(small) if t.rank() != small.len() => t.reshape(small),
            _ => Ok(t),
        };
        if self.flat || mixed_small.is_some() {
            run.tensors = std::mem::take(&mut run.tensors)
                .into_iter()
                .map(read_as)
                .collect::<Result<_>>()?;
        }
        // A run over channels-last tensors walks and stores in their memory order: every
        // operand's dims are permuted alike (a mixed run's small shape, of the run's rank,
        // too), the outputs are packed in that order and handed out as channels-last views
        // (see `crate::burn::layout`).
        let order = match self.flat {
            true => None,
            false => channels_last_walk(&full, &run.tensors),
        };
        let mixed_small = match (&order, mixed_small) {
            (Some(order), Some(small)) => Some(order.iter().map(|&d| small[d]).collect::<Vec<i64>>()),
            (_, small) => small,
        };
        // Dims along which no input varies (all of them for a run that reads no tensor, such
        // as `ones(..) * s`): the run computes one element per such dim and its outputs are
        // broadcast views of full size (flat and mixed runs keep their shapes instead).
        let small = match (self.flat || self.mixed.is_some(), run.tensors.is_empty()) {
            (true, _) => None,
            (false, true) => Some(vec![1; full.len()]).filter(|s| *s != full),
            (false, false) => exec::constant_dims(&full, &run.tensors.iter().collect::<SmallVec<[_; 16]>>()),
        };
        if let Some(small) = &small {
            run.tensors = run.tensors.iter().map(|t| exec::narrowed(t, small)).collect();
        }
        if let Some(order) = &order {
            run.tensors = std::mem::take(&mut run.tensors)
                .into_iter()
                .map(|t| permuted(t, order))
                .collect::<Result<_>>()?;
        }
        let inputs = &run.tensors;
        let device = match (inputs.first(), self.device) {
            (Some(first), _) => first.device().clone(),
            (None, Some(device)) => device.open()?,
            (None, None) => {
                return Ok(self.unbuildable_after(crate::Error::invalid_arg(OP, "inputs", "no inputs and no device")))
            }
        };
        let stream = device.stream().clone();
        let dims = small.clone().unwrap_or_else(|| full.clone());
        let dims: Vec<i64> = match &order {
            Some(order) => order.iter().map(|&d| dims[d]).collect(),
            None => dims,
        };
        // Declared before the launch, which ends up borrowing them, so they outlive it.
        let mut outputs: SmallVec<[CudnnTensor; 4]> = SmallVec::with_capacity(self.outputs.len());
        let in_refs: SmallVec<[_; 8]> = inputs.iter().map(|t| t.tref()).collect();
        fused::launch_key(self.packed.key_mut(), &in_refs, &dims, mixed_small.as_deref());
        let mut launch = match self.packed.get() {
            Some(packed) => FusedLaunch::from_packed(packed, &in_refs),
            None => match FusedLaunch::for_packed_outputs(&self.program, &in_refs, &dims, mixed_small.as_deref()) {
                Ok(l) => {
                    self.packed.insert(Box::new(l.packed()));
                    l
                }
                Err(e) => return Ok(self.unbuildable_after(e)),
            },
        };
        let variant = launch.variant();
        let ready = match &self.function {
            Some((v, f)) if *v == variant => Ok(Some((variant, f.clone()))),
            _ => fused::ready_or_queue(&stream, &self.program, variant).map(|f| f.map(|f| (variant, f))),
        };
        let (variant, function) = match ready {
            Ok(Some(built)) => self.function.insert(built).clone(),
            // Building in the background: unfused this time.
            Ok(None) => return Ok(false),
            Err(e) => return Ok(self.unbuildable_after(e)),
        };
        release_consumed(context, &run, &self.inputs, &self.views, &self.dropped, OP);
        // An input at its last use that nothing else references, packed and of the outputs'
        // dims, lends its buffer to an output of its dtype (each thread reads its element
        // before writing it).
        let mut lent: SmallVec<[bool; 16]> = smallvec::smallvec![false; inputs.len()];
        for (j, &(_, dtype)) in self.outputs.iter().enumerate() {
            if let (Some(small), true) = (&mixed_small, self.program.is_small(j)) {
                outputs.push(CudnnTensor::empty(&device, small, dtype, OP)?);
                continue;
            }
            let lender = inputs.iter().zip(&self.inputs).enumerate().position(|(k, (t, slot))| {
                !lent[k]
                    && slot.last_use
                    && t.dtype == dtype
                    && t.dims() == dims.as_slice()
                    && t.is_contiguous()
                    && t.layout.offset == 0
                    && Arc::strong_count(&t.storage) == 1
            });
            outputs.push(match lender {
                Some(k) => {
                    lent[k] = true;
                    inputs[k].with_layout(ViewLayout::contiguous(&dims))
                }
                None => CudnnTensor::empty(&device, &dims, dtype, OP)?,
            });
        }
        let scalars: SmallVec<[f32; 16]> = self.scalars.iter().map(|s| scalar_value(context, s)).collect();
        let out_refs: SmallVec<[_; 4]> = outputs.iter().map(|t| t.tmut()).collect();
        launch
            .bind(&self.program, &out_refs, &scalars)
            .and_then(|()| launch.launch(&stream, &self.program, &function, variant))?;
        drop((launch, out_refs, in_refs));
        drop(run);
        for (ir, t) in outputs_ir.iter().zip(outputs) {
            let t = match &order {
                Some(order) => t.with_layout(t.layout.permute(&inverse(order))?),
                None => t,
            };
            let t = if self.flat || (self.mixed.is_some() && t.dims() != to_dims(&ir.shape).as_slice()) {
                crate::burn::structure::reshape(t, &ir.shape)?
            } else if small.is_some() {
                exec::expand(t, &full, OP)?
            } else {
                t
            };
            context.handles.register_float_tensor::<Cudnn>(&ir.id, t);
        }
        Ok(true)
    }
}
