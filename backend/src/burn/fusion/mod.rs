//! Lazy fusion on our backend: [`CudnnFusion`] = burn-fusion's `Fusion<Cudnn>`.
//!
//! ```no_run
//! use burn_autodiff::Autodiff;
//! use cudnn_backend::burn::CudnnFusion;
//! type B = Autodiff<CudnnFusion>; // unchanged burn::nn model code runs fused
//! ```
//!
//! burn-fusion records every tensor operation lazily and hands runs of them to our fusers;
//! what no fuser takes runs through [`Cudnn`] exactly as without fusion (convolutions,
//! matmuls, pooling and norms stay cuDNN graphs). The fusers:
//!
//! - **elementwise** (`elementwise/`): a run of float and bool elementwise operations of one output
//!   shape (activations as Burn composes them, residual adds, scaling, masks, casts, the
//!   per-parameter arithmetic of Burn's optimizers, the elementwise parts of backward passes)
//!   becomes one generated kernel ([`crate::ops::fused`]), compiled once per distinct
//!   chain and kept in the persistent kernel cache. Inputs may broadcast, values of one
//!   smaller shape may sit beside the run's (stored once each), and dims along which no input
//!   varies are computed once (the outputs are broadcast views); a tensor whose last use is in
//!   the run lends its buffer to an output. The kernel is specialized to the rank
//!   of the merged shape and moves up to 8 elements per thread step with vector accesses. A
//!   kernel that fails to build falls back to the operations one by one, with a one-time
//!   warning.
//!
//! - **linear weight gradient** (`linear/weight_grad.rs`): Burn's composed `linear_weight_backward` (a
//!   batched matmul of the swapped input with the gradient, then a sum over the batch) runs
//!   as one GEMM over the folded batch.
//!
//! - **linear forward** (`linear/bias.rs`): Burn's composed `Linear` forward (the weight reshaped, a
//!   matmul, the bias reshaped, an add) runs as one cuDNN matmul graph adding the bias in its
//!   epilogue; Burn's relu or gelu after it joins the epilogue where the pre-activation is
//!   not kept (`engine/act_tail.rs`: inference; `Autodiff` keeps it for the backward pass).
//!
//! - **convolution + relu** (`conv_act.rs`): a biased conv2d and Burn's relu after it run as
//!   one conv → bias → relu graph where the convolution's output is not kept (inference).
//!
//! - **linear bias gradient** (`reduce/leading_sum.rs`): Burn's composed `linear_bias_backward` (a
//!   sum over each leading dim in turn, then a reshape to `[N]`), or any such chain of sums
//!   over dims `0, 1, ..`, runs as one reduction over the folded leading dims.
//!
//! - **reduction** (`reduce/`): an elementwise run ending in sums or means over some dims
//!   of one of its values (burn-autodiff's broadcast gradients, Burn's batch-norm statistics
//!   through their channel view) becomes one generated kernel
//!   ([`crate::ops::fused_reduce`]): the value summed and the channel view's copy are
//!   never stored; values of the kept elements' shape computed beside it are stored once each.
//!   Further chains of sums over the same dims that follow in the same pass (burn-autodiff's
//!   batch-norm gradients: three such sums) join the same kernel, each into its own result.
//!
//! - **lead** (`lead.rs`): a block that burn-fusion opens with a module operation no fuser
//!   starts with (a convolution, a pooling) runs as that operation and then the elementwise or
//!   reduction fuser's run of the operations after it, where burn-fusion would run the whole
//!   block operation by operation.
//!
//! Our fused training ops and optimizer step are recorded as custom operations (`custom.rs`):
//! one queue entry each, running the [`Cudnn`] kernels when the queue executes.
//!
//! A background thread per device flushes burn-fusion's operation channel when launches stall
//! (`engine/flusher.rs`; `CUDNN_BACKEND_FUSION_FLUSH_US`). `CUDNN_BACKEND_FUSION=0` turns the fusers off (every operation then runs unfused through
//! the lazy queue, for comparisons).

mod conv_act;
pub(crate) mod custom;
mod elementwise;
mod engine;
mod lead;
mod linear;
mod quantize;
mod reduce;

/// IR builders shared by the fusers' tests.
#[cfg(test)]
pub(crate) mod test_ir {
    use burn_backend::{DType, Shape};
    use burn_ir::{TensorId, TensorIr, TensorStatus};

    /// Tensor `id` of the IR with `dims`, `status` and `dtype`.
    pub(crate) fn t(id: u64, dims: &[usize], status: TensorStatus, dtype: DType) -> TensorIr {
        TensorIr {
            id: TensorId::new(id),
            shape: Shape::from(dims.to_vec()),
            status,
            dtype,
        }
    }
}

use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::DType;
use burn_fusion::stream::{Context, OrderedExecution};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, OperationFuser};
use burn_fusion::{NumOperations, Optimization};
use burn_ir::{BackendIr, OperationIr, TensorHandle};
use serde::{Deserialize, Serialize};

pub use elementwise::ElementwiseOptimization;

use super::tensor::expect;
use super::{Cudnn, CudnnDevice, CudnnQTensor, CudnnTensor};

/// [`Cudnn`] behind burn-fusion's lazy operation queue and our fusers:
/// `type B = burn_autodiff::Autodiff<CudnnFusion>;`.
pub type CudnnFusion = Fusion<Cudnn>;

/// A tensor of [`Cudnn`] as the fusion runtime holds it.
#[derive(Clone, Debug)]
pub enum CudnnFusionHandle {
    /// A float, int or bool tensor.
    Tensor(CudnnTensor),
    /// A quantized tensor (boxed: its scales make it twice a plain tensor's size, and the
    /// handles the fusion context keeps are mostly plain).
    Quantized(Box<CudnnQTensor>),
}

/// The fusion runtime of [`Cudnn`]: its handles, devices and fusers.
#[derive(Debug)]
pub struct CudnnFusionRuntime;

/// Whether `CUDNN_BACKEND_FUSION` leaves the fusers on (anything but `0`, `false`, `off`, `no`;
/// [`Config::fusion`](crate::config::Config::fusion)).
fn fusers_enabled() -> bool {
    crate::config::config().fusion
}

impl FusionRuntime for CudnnFusionRuntime {
    type OptimizationState = CudnnOptimizationState;
    type Optimization = CudnnOptimization;
    type FusionHandle = CudnnFusionHandle;
    type FusionDevice = CudnnDevice;

    fn fusers(device: CudnnDevice) -> Vec<Box<dyn OperationFuser<CudnnOptimization>>> {
        engine::flusher::ensure_started(&device);
        if fusers_enabled() {
            vec![
                Box::new(elementwise::ElementwiseFuser::on(device)),
                Box::new(linear::LinearGradFuser::default()),
                Box::new(linear::MatmulBiasFuser::default()),
                Box::new(conv_act::ConvActFuser::default()),
                Box::new(reduce::LeadingSumFuser::default()),
                Box::new(quantize::QuantizeDynamicFuser::default()),
                Box::new(reduce::ReduceFuser::default()),
                Box::new(lead::LeadFuser::new(elementwise::ElementwiseFuser::on(device))),
                Box::new(lead::LeadFuser::new(reduce::ReduceFuser::default())),
            ]
        } else {
            Vec::new()
        }
    }
}

fn tensor_of(handle: CudnnFusionHandle, kind: &str) -> CudnnTensor {
    match handle {
        CudnnFusionHandle::Tensor(t) => t,
        CudnnFusionHandle::Quantized(_) => {
            panic!("cudnn-backend: internal error: a quantized tensor handle was used as a {kind} tensor")
        }
    }
}

impl BackendIr for Cudnn {
    type Handle = CudnnFusionHandle;

    fn float_tensor(handle: TensorHandle<Self::Handle>) -> FloatTensor<Self> {
        tensor_of(handle.handle, "float")
    }

    fn int_tensor(handle: TensorHandle<Self::Handle>) -> IntTensor<Self> {
        tensor_of(handle.handle, "int")
    }

    fn bool_tensor(handle: TensorHandle<Self::Handle>) -> BoolTensor<Self> {
        tensor_of(handle.handle, "bool")
    }

    fn quantized_tensor(handle: TensorHandle<Self::Handle>) -> QuantizedTensor<Self> {
        match handle.handle {
            CudnnFusionHandle::Quantized(q) => *q,
            CudnnFusionHandle::Tensor(_) => {
                panic!("cudnn-backend: internal error: a plain tensor handle was used as a quantized tensor")
            }
        }
    }

    fn float_tensor_handle(tensor: FloatTensor<Self>) -> Self::Handle {
        CudnnFusionHandle::Tensor(tensor)
    }

    fn int_tensor_handle(tensor: IntTensor<Self>) -> Self::Handle {
        CudnnFusionHandle::Tensor(tensor)
    }

    fn bool_tensor_handle(tensor: BoolTensor<Self>) -> Self::Handle {
        CudnnFusionHandle::Tensor(tensor)
    }

    fn quantized_tensor_handle(tensor: QuantizedTensor<Self>) -> Self::Handle {
        CudnnFusionHandle::Quantized(Box::new(tensor))
    }
}

impl FusionBackend for Cudnn {
    type FusionRuntime = CudnnFusionRuntime;
    type FullPrecisionBackend = Cudnn;

    fn cast_float(tensor: FloatTensor<Self>, dtype: DType) -> Self::Handle {
        const OP: &str = "fusion cast_float";
        CudnnFusionHandle::Tensor(super::tensor::expect(OP, super::exec::cast(tensor, dtype, OP)))
    }
}

/// Every optimization of the backend's fusers.
#[derive(Debug)]
pub enum CudnnOptimization {
    /// Elementwise operations in one kernel.
    Elementwise(ElementwiseOptimization),
    /// Burn's composed linear weight gradient as one matmul.
    LinearGrad(linear::LinearGradOptimization),
    /// Burn's composed linear forward (matmul, then the bias add, then relu or gelu where the
    /// sum is dropped) as one matmul graph.
    MatmulBias(linear::MatmulBiasOptimization),
    /// A biased conv2d and Burn's relu after it (its output dropped) as one graph.
    ConvAct(conv_act::ConvActOptimization),
    /// Burn's chain of sums over the leading dims (the linear bias gradient) as one reduction.
    LeadingSum(reduce::LeadingSumOptimization),
    /// Burn's composed dynamic quantization as `Cudnn`'s (scales in f32).
    QuantizeDynamic(quantize::QuantizeDynamicOptimization),
    /// An elementwise run ending in sums or means over some dims, as one generated kernel.
    Reduce(Box<reduce::ReduceOptimization>),
    /// Operations no fuser starts with (a convolution, a pooling, a slice of a tensor before
    /// one) run as they are, then a fused run of the operations after them.
    Lead(lead::LeadOptimization),
}

/// The serializable form of a [`CudnnOptimization`]: its operations (the fuser rebuilds the
/// rest).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum CudnnOptimizationState {
    /// The operations of an elementwise run.
    Elementwise(Vec<OperationIr>),
    /// The operations of a composed linear weight gradient.
    LinearGrad(Vec<OperationIr>),
    /// The operations of a composed linear forward with a bias.
    MatmulBias(Vec<OperationIr>),
    /// The operations of a biased conv2d and its relu.
    ConvAct(Vec<OperationIr>),
    /// The operations of a chain of sums over the leading dims.
    LeadingSum(Vec<OperationIr>),
    /// The operations of a composed dynamic quantization.
    QuantizeDynamic(Vec<OperationIr>),
    /// The operations of an elementwise run ending in reductions.
    Reduce(Vec<OperationIr>),
    /// The leading operations and the state of the fused run after them.
    Lead(Vec<OperationIr>, Box<CudnnOptimizationState>),
}

impl NumOperations for CudnnOptimization {
    fn len(&self) -> usize {
        match self {
            CudnnOptimization::Elementwise(e) => e.operations.len(),
            CudnnOptimization::LinearGrad(l) => l.operations.len(),
            CudnnOptimization::MatmulBias(m) => m.operations.len(),
            CudnnOptimization::ConvAct(c) => c.operations.len(),
            CudnnOptimization::LeadingSum(s) => s.operations.len(),
            CudnnOptimization::QuantizeDynamic(q) => q.operations.len(),
            CudnnOptimization::Reduce(r) => r.operations.len(),
            CudnnOptimization::Lead(l) => l.leads.len() + l.inner.len(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            CudnnOptimization::Elementwise(_) => "cudnn elementwise",
            CudnnOptimization::LinearGrad(_) => "cudnn linear weight gradient",
            CudnnOptimization::MatmulBias(_) => "cudnn matmul + bias",
            CudnnOptimization::ConvAct(_) => "cudnn conv2d + relu",
            CudnnOptimization::LeadingSum(_) => "cudnn leading-dims sum",
            CudnnOptimization::QuantizeDynamic(_) => "cudnn dynamic quantization",
            CudnnOptimization::Reduce(_) => "cudnn fused reduction",
            CudnnOptimization::Lead(l) => l.inner.name(),
        }
    }
}

impl CudnnOptimization {
    /// Runs the optimization whose operations start at index `first` of `execution`'s
    /// (`first` > 0 for the fused run after a leading operation).
    fn run(
        &mut self,
        context: &mut Context<CudnnFusionHandle>,
        execution: &OrderedExecution<CudnnFusionRuntime>,
        first: usize,
    ) {
        // The trait boundary: an engine error panics here, naming the fused run.
        let fused = match self {
            CudnnOptimization::Elementwise(e) => expect("fused elementwise", e.execute(context)),
            CudnnOptimization::LinearGrad(l) => {
                expect("fused linear weight gradient", l.execute(context));
                true
            }
            CudnnOptimization::MatmulBias(m) => expect("fused matmul + bias", m.execute(context)),
            CudnnOptimization::ConvAct(c) => expect("fused conv2d + relu", c.execute(context)),
            CudnnOptimization::LeadingSum(s) => {
                expect("fused leading-dims sum", s.execute(context));
                true
            }
            CudnnOptimization::QuantizeDynamic(q) => expect("fused quantize_dynamic", q.execute(context)),
            CudnnOptimization::Reduce(r) => expect("fused reduction", r.execute(context)),
            CudnnOptimization::Lead(l) => {
                for i in first..first + l.leads.len() {
                    execution.operation_within_optimization(i).execute(&mut context.handles);
                }
                l.inner.run(context, execution, first + l.leads.len());
                true
            }
        };
        if !fused {
            // Kernel still building, or unbuildable: the operations one by one.
            crate::ffi::counters::add(crate::ffi::counters::Count::FusedFallbacks, 1);
            for i in first..first + self.len() {
                execution.operation_within_optimization(i).execute(&mut context.handles);
            }
        }
    }
}

impl Optimization<CudnnFusionRuntime> for CudnnOptimization {
    fn execute(&mut self, context: &mut Context<CudnnFusionHandle>, execution: &OrderedExecution<CudnnFusionRuntime>) {
        let _timer = crate::ffi::counters::HostTimer::start(crate::ffi::counters::Count::FusedNs);
        self.run(context, execution, 0);
    }

    fn to_state(&self) -> CudnnOptimizationState {
        match self {
            CudnnOptimization::Elementwise(e) => CudnnOptimizationState::Elementwise(e.operations.clone()),
            CudnnOptimization::LinearGrad(l) => CudnnOptimizationState::LinearGrad(l.operations.clone()),
            CudnnOptimization::MatmulBias(m) => CudnnOptimizationState::MatmulBias(m.operations.clone()),
            CudnnOptimization::ConvAct(c) => CudnnOptimizationState::ConvAct(c.operations.clone()),
            CudnnOptimization::LeadingSum(s) => CudnnOptimizationState::LeadingSum(s.operations.clone()),
            CudnnOptimization::QuantizeDynamic(q) => CudnnOptimizationState::QuantizeDynamic(q.operations.clone()),
            CudnnOptimization::Reduce(r) => CudnnOptimizationState::Reduce(r.operations.clone()),
            CudnnOptimization::Lead(l) => CudnnOptimizationState::Lead(l.leads.clone(), Box::new(l.inner.to_state())),
        }
    }

    fn from_state(device: &CudnnDevice, state: CudnnOptimizationState) -> Self {
        match state {
            CudnnOptimizationState::Elementwise(ops) => {
                match elementwise::ElementwiseFuser::from_operations(&ops, Some(*device)) {
                    Some(e) => CudnnOptimization::Elementwise(e),
                    None => panic!("cudnn-backend: a saved fusion state does not describe an elementwise run"),
                }
            }
            CudnnOptimizationState::LinearGrad(ops) => match linear::LinearGradFuser::matched(&ops) {
                Some(l) => CudnnOptimization::LinearGrad(l),
                None => panic!("cudnn-backend: a saved fusion state does not describe a linear weight gradient"),
            },
            CudnnOptimizationState::MatmulBias(ops) => match linear::MatmulBiasFuser::matched(&ops) {
                Some(m) => CudnnOptimization::MatmulBias(m),
                None => panic!("cudnn-backend: a saved fusion state does not describe a linear forward with a bias"),
            },
            CudnnOptimizationState::ConvAct(ops) => match conv_act::ConvActFuser::matched(&ops) {
                Some(c) => CudnnOptimization::ConvAct(c),
                None => {
                    panic!("cudnn-backend: a saved fusion state does not describe a convolution and its relu")
                }
            },
            CudnnOptimizationState::LeadingSum(ops) => match reduce::LeadingSumFuser::from_operations(&ops) {
                Some(s) => CudnnOptimization::LeadingSum(s),
                None => panic!("cudnn-backend: a saved fusion state does not describe a sum over leading dims"),
            },
            CudnnOptimizationState::QuantizeDynamic(ops) => match quantize::QuantizeDynamicFuser::matched(&ops) {
                Some(q) => CudnnOptimization::QuantizeDynamic(q),
                None => panic!("cudnn-backend: a saved fusion state does not describe a dynamic quantization"),
            },
            CudnnOptimizationState::Reduce(ops) => match reduce::ReduceFuser::from_operations(&ops) {
                Some(r) => CudnnOptimization::Reduce(Box::new(r)),
                None => panic!("cudnn-backend: a saved fusion state does not describe a fused reduction"),
            },
            CudnnOptimizationState::Lead(leads, inner) => CudnnOptimization::Lead(lead::LeadOptimization {
                leads,
                inner: Box::new(Self::from_state(device, *inner)),
            }),
        }
    }
}
