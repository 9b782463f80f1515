//! Fused Adam and AdamW for Burn: drop-ins for `burn::optim::{AdamConfig, AdamWConfig}`
//! (same config fields and defaults; `init()` returns a Burn [`Optimizer`] whose record is
//! the record of Burn's Adam/AdamW, so optimizer checkpoints load both ways).
//!
//! On `Autodiff<Cudnn>` one step updates every parameter, both moments, the bias correction
//! and the weight decay in one kernel launch per 32 tensors ([`crate::ops::adam_step`]);
//! Burn's own Adam runs about a dozen launches per parameter. On any other backend the step
//! is Burn's own optimizer.

use burn_core as burn;
use burn_core::config::Config;
use burn_core::module::{AutodiffModule, ModuleMapper, Param, ParamId};
use burn_core::tensor::backend::{AutodiffBackend, Backend};
use burn_core::tensor::{Tensor, TensorPrimitive};
use burn_optim::adaptor::OptimizerAdaptor;
use burn_optim::decay::WeightDecayConfig;
use burn_optim::grad_clipping::{GradientClipping, GradientClippingConfig};
use burn_optim::record::AdaptorRecord;
use burn_optim::{
    Adam, AdamConfig, AdamState, AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate,
    MultiGradientsParams, Optimizer, SimpleOptimizer,
};
use hashbrown::HashMap;

use super::route::{cast_primitive, is_cudnn};
use super::tensor::{expect, CudnnTensor};
use super::{exec, Cudnn};
use crate::ops::{self, AdamOptions, AdamParam};

/// Configuration of [`FusedAdam`]: the fields and defaults of `burn::optim::AdamConfig`.
#[derive(Config, Debug)]
pub struct FusedAdamConfig {
    /// Decay of the first moment.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the root of the second moment for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Whether to use AMSGrad.
    #[config(default = false)]
    pub amsgrad: bool,
    /// L2 weight decay added to the gradient.
    pub weight_decay: Option<WeightDecayConfig>,
    /// Gradient clipping, applied to each gradient before the step.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// Configuration of [`FusedAdamW`]: the fields and defaults of `burn::optim::AdamWConfig`.
#[derive(Config, Debug)]
pub struct FusedAdamWConfig {
    /// Decay of the first moment.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the root of the second moment for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Decoupled weight decay.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Cautious weight decay: skipped where the parameter and the update differ in sign.
    #[config(default = false)]
    pub cautious_weight_decay: bool,
    /// Whether to use AMSGrad.
    #[config(default = false)]
    pub amsgrad: bool,
    /// Gradient clipping, applied to each gradient before the step.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// The Adam family's optimizer states: both wrap Burn's `AdaptiveMomentumState`.
pub trait MomentumOptimizer<B: Backend>: SimpleOptimizer<B> {
    /// The moments of a state.
    fn into_momentum<const D: usize>(state: Self::State<D>) -> AdaptiveMomentumState<B, D>;
    /// A state from its moments.
    fn from_momentum<const D: usize>(momentum: AdaptiveMomentumState<B, D>) -> Self::State<D>;
}

impl<B: Backend> MomentumOptimizer<B> for Adam {
    fn into_momentum<const D: usize>(state: AdamState<B, D>) -> AdaptiveMomentumState<B, D> {
        state.momentum
    }

    fn from_momentum<const D: usize>(momentum: AdaptiveMomentumState<B, D>) -> AdamState<B, D> {
        AdamState::new(momentum)
    }
}

impl<B: Backend> MomentumOptimizer<B> for AdamW {
    fn into_momentum<const D: usize>(state: AdamWState<B, D>) -> AdaptiveMomentumState<B, D> {
        state.momentum
    }

    fn from_momentum<const D: usize>(momentum: AdaptiveMomentumState<B, D>) -> AdamWState<B, D> {
        AdamWState { momentum }
    }
}

/// A fused Adam-family optimizer (see [`FusedAdam`], [`FusedAdamW`]).
#[derive(Clone)]
pub struct FusedAdamOptimizer<O, M, B>
where
    O: MomentumOptimizer<B::InnerBackend> + Clone,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    options: AdamOptions,
    grad_clipping: Option<GradientClipping>,
    records: HashMap<ParamId, AdaptorRecord<O, B>>,
    /// Burn's own optimizer, used when the backend is not ours.
    fallback: Option<OptimizerAdaptor<O, M, B>>,
}

/// Fused Adam (the optimizer of [`FusedAdamConfig::init`]).
pub type FusedAdam<M, B> = FusedAdamOptimizer<Adam, M, B>;

/// Fused AdamW (the optimizer of [`FusedAdamWConfig::init`]).
pub type FusedAdamW<M, B> = FusedAdamOptimizer<AdamW, M, B>;

impl FusedAdamConfig {
    /// The same configuration as Burn's `AdamConfig`.
    pub fn to_burn(&self) -> AdamConfig {
        AdamConfig::new()
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2)
            .with_epsilon(self.epsilon)
            .with_amsgrad(self.amsgrad)
            .with_weight_decay(self.weight_decay.clone())
            .with_grad_clipping(self.grad_clipping.clone())
    }

    /// The optimizer: fused on `Autodiff<Cudnn>`, Burn's Adam on other backends.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> FusedAdam<M, B> {
        let options = AdamOptions {
            lr: 0.0,
            beta1: self.beta_1,
            beta2: self.beta_2,
            epsilon: self.epsilon,
            l2_penalty: self.weight_decay.as_ref().map_or(0.0, |w| w.penalty),
            decoupled_decay: 0.0,
            cautious: false,
            amsgrad: self.amsgrad,
        };
        FusedAdamOptimizer::new(options, self.grad_clipping.as_ref(), || self.to_burn().init())
    }
}

impl FusedAdamWConfig {
    /// The same configuration as Burn's `AdamWConfig`.
    pub fn to_burn(&self) -> AdamWConfig {
        AdamWConfig::new()
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2)
            .with_epsilon(self.epsilon)
            .with_weight_decay(self.weight_decay)
            .with_cautious_weight_decay(self.cautious_weight_decay)
            .with_amsgrad(self.amsgrad)
            .with_grad_clipping(self.grad_clipping.clone())
    }

    /// The optimizer: fused on `Autodiff<Cudnn>`, Burn's AdamW on other backends.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> FusedAdamW<M, B> {
        let options = AdamOptions {
            lr: 0.0,
            beta1: self.beta_1,
            beta2: self.beta_2,
            epsilon: self.epsilon,
            l2_penalty: 0.0,
            decoupled_decay: self.weight_decay,
            cautious: self.cautious_weight_decay,
            amsgrad: self.amsgrad,
        };
        FusedAdamOptimizer::new(options, self.grad_clipping.as_ref(), || self.to_burn().init())
    }
}

impl<O, M, B> FusedAdamOptimizer<O, M, B>
where
    O: MomentumOptimizer<B::InnerBackend> + Clone,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    fn new(
        options: AdamOptions,
        clipping: Option<&GradientClippingConfig>,
        burn: impl FnOnce() -> OptimizerAdaptor<O, M, B>,
    ) -> Self {
        Self {
            options,
            grad_clipping: clipping.map(|c| c.init()),
            records: HashMap::new(),
            fallback: (!is_cudnn::<B::InnerBackend>()).then(burn),
        }
    }

    /// True when steps run fused (the backend is `Autodiff<Cudnn>`).
    pub fn is_fused(&self) -> bool {
        self.fallback.is_none()
    }

    fn fused_step(&mut self, lr: LearningRate, module: M, grads: Grads) -> M {
        let mut mapper = StepMapper::<O, B> {
            records: &mut self.records,
            grads,
            clipping: self.grad_clipping.as_ref(),
            amsgrad: self.options.amsgrad,
            pending: Vec::new(),
        };
        let module = module.map(&mut mapper);
        let pending = std::mem::take(&mut mapper.pending);
        let options = AdamOptions { lr, ..self.options };
        launch(&pending, &options);
        module
    }
}

/// The gradients of one step (one device or several).
enum Grads {
    Single(GradientsParams),
    Multi(MultiGradientsParams),
}

impl Grads {
    fn remove<B: Backend, const D: usize>(&mut self, id: ParamId) -> Option<(Tensor<B, D>, B::Device)> {
        match self {
            Grads::Single(g) => g.remove::<B, D>(id).map(|t| {
                let device = t.device();
                (t, device)
            }),
            Grads::Multi(g) => g.remove::<B, D>(id),
        }
    }
}

/// One parameter's tensors for the fused launch.
struct Pending {
    param: CudnnTensor,
    grad: CudnnTensor,
    moments: [Option<CudnnTensor>; 3],
    outputs: [CudnnTensor; 3],
    max_out: Option<CudnnTensor>,
    step: u64,
}

/// Launches the fused step for every parameter collected (grouped by device).
fn launch(pending: &[Pending], o: &AdamOptions) {
    let mut devices: Vec<usize> = pending.iter().map(|p| p.param.device().ordinal()).collect();
    devices.sort_unstable();
    devices.dedup();
    for dev in devices {
        let group: Vec<&Pending> = pending.iter().filter(|p| p.param.device().ordinal() == dev).collect();
        let refs: Vec<_> = group
            .iter()
            .map(|p| {
                let r = |t: &Option<CudnnTensor>| t.as_ref().map(|t| t.tref());
                (
                    p.param.tref(),
                    p.grad.tref(),
                    p.moments.each_ref().map(r),
                    p.outputs.each_ref().map(|t| t.tref()),
                    r(&p.max_out),
                    p.step,
                )
            })
            .collect();
        let params: Vec<AdamParam<'_>> = refs
            .iter()
            .map(|(p, g, [m, v, vm], [po, mo, vo], vmo, step)| AdamParam {
                param: p,
                grad: g,
                moment1: m.as_ref(),
                moment2: v.as_ref(),
                max_moment2: vm.as_ref(),
                param_out: po,
                moment1_out: mo,
                moment2_out: vo,
                max_moment2_out: vmo.as_ref(),
                step: *step,
            })
            .collect();
        expect("adam_step", ops::adam_step(group[0].param.stream(), &params, o));
    }
}

/// Maps every parameter with a gradient to its updated value: the new tensors are
/// allocated here and written by the one launch after the mapping (stream order makes
/// every later use see them written).
struct StepMapper<'a, O, B>
where
    O: MomentumOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
{
    records: &'a mut HashMap<ParamId, AdaptorRecord<O, B>>,
    grads: Grads,
    clipping: Option<&'a GradientClipping>,
    /// Whether the step keeps AMSGrad's maximum second moment.
    amsgrad: bool,
    pending: Vec<Pending>,
}

fn to_cudnn<I: Backend, const D: usize>(t: Tensor<I, D>) -> CudnnTensor {
    cast_primitive::<I, Cudnn>(t.into_primitive().tensor())
}

fn from_cudnn<I: Backend, const D: usize>(t: CudnnTensor) -> Tensor<I, D> {
    Tensor::from_primitive(TensorPrimitive::Float(cast_primitive::<Cudnn, I>(t)))
}

impl<O, B> ModuleMapper<B> for StepMapper<'_, O, B>
where
    O: MomentumOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
{
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        const OP: &str = "adam_step";
        let (id, tensor, mapper) = param.consume();
        let Some((grad, device)) = self.grads.remove::<B::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let require_grad = tensor.is_require_grad();
        let tensor = if tensor.device() != device {
            tensor.to_device(&device)
        } else {
            tensor
        };
        let grad = match self.clipping {
            Some(c) => c.clip_gradient(grad),
            None => grad,
        };
        let momentum = self
            .records
            .remove(&id)
            .map(|r| O::into_momentum(O::to_device(r.into_state::<D>(), &device)));
        let step = momentum.as_ref().map_or(1, |m| m.time as u64 + 1);
        let p = to_cudnn(tensor.inner()).contiguous();
        let packed = |t: CudnnTensor| exec::cast(t, p.dtype, OP).contiguous();
        let g = packed(to_cudnn(grad));
        let (m, v, vm) = match momentum {
            Some(s) => (
                Some(packed(to_cudnn(s.moment_1))),
                Some(packed(to_cudnn(s.moment_2))),
                s.max_moment_2.map(|t| packed(to_cudnn(t))),
            ),
            None => (None, None, None),
        };
        let new = || p.empty_like(p.dtype, OP);
        let outputs = [new(), new(), new()];
        let max_out = self.amsgrad.then(new);
        let state = AdaptiveMomentumState::<B::InnerBackend, D> {
            time: step as usize,
            moment_1: from_cudnn(outputs[1].clone()),
            moment_2: from_cudnn(outputs[2].clone()),
            max_moment_2: max_out.clone().map(from_cudnn),
        };
        self.records
            .insert(id, AdaptorRecord::from_state(O::from_momentum(state)));
        let mut updated = Tensor::<B, D>::from_inner(from_cudnn(outputs[0].clone()));
        if require_grad {
            updated = updated.require_grad();
        }
        self.pending.push(Pending {
            param: p,
            grad: g,
            moments: [m, v, vm],
            outputs,
            max_out,
            step,
        });
        Param::from_mapped_value(id, updated, mapper)
    }
}

impl<O, M, B> Optimizer<M, B> for FusedAdamOptimizer<O, M, B>
where
    O: MomentumOptimizer<B::InnerBackend> + Clone,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    type Record = HashMap<ParamId, AdaptorRecord<O, B>>;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        match &mut self.fallback {
            Some(burn) => burn.step(lr, module, grads),
            None => self.fused_step(lr, module, Grads::Single(grads)),
        }
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        match &mut self.fallback {
            Some(burn) => burn.step_multi(lr, module, grads),
            None => self.fused_step(lr, module, Grads::Multi(grads)),
        }
    }

    fn to_record(&self) -> Self::Record {
        match &self.fallback {
            Some(burn) => burn.to_record(),
            None => self.records.clone(),
        }
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        match self.fallback.take() {
            Some(burn) => self.fallback = Some(burn.load_record(record)),
            None => self.records = record,
        }
        self
    }
}
