//! Custom operations on [`CudnnFusion`]: an operation recorded in burn-fusion's lazy queue
//! (burn-ir's `CustomOpIr`) that runs [`Cudnn`] code on its inputs' tensors when the queue
//! executes. How the fused training ops and the fused optimizer step reach the fusion
//! backend; the fusers see them as boundaries.

use std::fmt;

use burn_backend::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::FusionTensor;
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{CudnnFusionHandle, CudnnFusionRuntime};
use crate::burn::tensor::expect;
use crate::burn::{Cudnn, CudnnTensor};
use crate::error::Result;

/// A float tensor of [`CudnnFusion`].
pub(crate) type Lazy = FusionTensor<CudnnFusionRuntime>;

/// What a custom operation runs on the executing queue: the inputs' [`Cudnn`] tensors in, the
/// outputs' out (in the declared order, dims and dtypes), or the error that stopped it.
type Run = Box<dyn Fn(Vec<CudnnTensor>) -> Result<Vec<CudnnTensor>> + Send + Sync>;

/// One recorded custom operation.
struct CustomOp {
    ir: CustomOpIr,
    run: Run,
}

impl fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomOp").field("ir", &self.ir).finish_non_exhaustive()
    }
}

/// The trait boundary of a recorded operation: an error of its run panics, naming it.
impl Operation<CudnnFusionRuntime> for CustomOp {
    fn execute(&self, handles: &mut HandleContainer<CudnnFusionHandle>) {
        let inputs = self
            .ir
            .inputs
            .iter()
            .map(|t| handles.get_float_tensor::<Cudnn>(t))
            .collect();
        let outputs = expect(&self.ir.id, (self.run)(inputs));
        assert_eq!(
            outputs.len(),
            self.ir.outputs.len(),
            "cudnn-backend: internal error: custom operation {} made {} outputs for {} declared",
            self.ir.id,
            outputs.len(),
            self.ir.outputs.len()
        );
        for (ir, t) in self.ir.outputs.iter().zip(outputs) {
            debug_assert_eq!(
                (t.dims().iter().map(|&d| d as usize).collect::<Vec<_>>(), t.dtype),
                (ir.shape.to_vec(), ir.dtype)
            );
            handles.register_float_tensor::<Cudnn>(&ir.id, t);
        }
    }
}

/// Records custom operation `name` over `inputs` (the first sets the device) with outputs of
/// the given dims and dtypes, which `run` computes from the inputs when the queue executes.
pub(crate) fn record(
    name: &'static str,
    inputs: Vec<Lazy>,
    outputs: Vec<(Shape, DType)>,
    run: impl Fn(Vec<CudnnTensor>) -> Result<Vec<CudnnTensor>> + Send + Sync + 'static,
) -> Vec<Lazy> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let outputs: Vec<TensorIr> = outputs
        .into_iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect();
    let ir = CustomOpIr {
        id: name.to_owned(),
        inputs,
        outputs,
    };
    let op = CustomOp {
        ir: ir.clone(),
        run: Box::new(run),
    };
    client.register(streams, OperationIr::Custom(ir), op)
}

/// Takes the next `N` items of `it` (the caller declared that many); an error when fewer
/// are left (a broken invariant of the recorded operation).
pub(crate) fn take<T, const N: usize>(it: &mut impl Iterator<Item = T>) -> Result<[T; N]> {
    let items: Vec<T> = it.by_ref().take(N).collect();
    items.try_into().map_err(|got: Vec<T>| {
        crate::error::Error::invalid_input(
            "custom operation",
            format!("internal error: {} tensors where {N} were declared", got.len()),
        )
    })
}

/// The next item of `it` when `present` (an optional input the caller declared).
pub(crate) fn optional<T>(it: &mut impl Iterator<Item = T>, present: bool) -> Option<T> {
    if present {
        it.next()
    } else {
        None
    }
}
