//! Fused Adam and AdamW for Burn: drop-ins for `burn::optim::{AdamConfig, AdamWConfig}`
//! (same config fields and defaults; `init()` returns a Burn [`Optimizer`] whose record is
//! the record of Burn's Adam/AdamW, so optimizer checkpoints load both ways).
//!
//! On `Autodiff<Cudnn>` (and `Autodiff<CudnnFusion>`, as one recorded custom operation) one
//! step updates every parameter, both moments, the bias correction
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

use burn_backend::tensor::FloatTensor;
use burn_backend::DType;

use super::fusion::custom::{record, Lazy};
use super::route::{cast_primitive, is_cudnn, route, Route};
use super::tensor::{expect, tmut_of, tref_of, CudnnTensor};
use super::{exec, layout, Cudnn, CudnnFusion};
use crate::error::Result;
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
            fallback: (!matches!(route::<B::InnerBackend>(), Route::Cudnn | Route::Fusion)).then(burn),
        }
    }

    /// True when steps run fused (the backend is `Autodiff<Cudnn>` or `Autodiff<CudnnFusion>`).
    pub fn is_fused(&self) -> bool {
        self.fallback.is_none()
    }

    /// Collects every parameter with a gradient, updates them all in one fused launch
    /// (recorded as one custom operation on `Fusion<Cudnn>`), then maps the new values in.
    fn fused_step(&mut self, lr: LearningRate, module: M, grads: Grads) -> M {
        let mut collect = CollectMapper::<O, B> {
            records: &mut self.records,
            grads,
            clipping: self.grad_clipping.as_ref(),
            pending: Vec::new(),
        };
        let module = module.map(&mut collect);
        let pending = std::mem::take(&mut collect.pending);
        let options = AdamOptions { lr, ..self.options };
        // The trait boundary of `Optimizer::step`: an engine error panics here.
        let updated = expect("adam_step", run_step::<B::InnerBackend>(&pending, &options));
        let mut apply = ApplyMapper::<O, B> {
            records: &mut self.records,
            updated: pending
                .iter()
                .map(|p| p.id)
                .zip(updated.into_iter().zip(pending.iter().map(|p| p.step)))
                .collect(),
        };
        module.map(&mut apply)
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

/// One parameter's tensors for the fused launch (`I` is the inner backend).
struct Pending<I: Backend> {
    id: ParamId,
    param: FloatTensor<I>,
    grad: FloatTensor<I>,
    /// First, second and AMSGrad's maximum second moment (none on the first step).
    moments: [Option<FloatTensor<I>>; 3],
    step: u64,
}

/// Updated parameter, first and second moment, and AMSGrad's maximum second moment.
type Updated<I> = ([FloatTensor<I>; 3], Option<FloatTensor<I>>);

/// The step of every collected parameter on the inner backend `I` (ours: [`Cudnn`], or
/// `Fusion<Cudnn>`, where the launch is recorded as one custom operation).
fn run_step<I: Backend>(pending: &[Pending<I>], o: &AdamOptions) -> Result<Vec<Updated<I>>> {
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let to = |t: &FloatTensor<I>| cast_primitive::<I, Cudnn>(t.clone());
    let back = |t: CudnnTensor| cast_primitive::<Cudnn, I>(t);
    if is_cudnn::<I>() {
        let eager: Vec<_> = pending
            .iter()
            .map(|p| {
                (
                    to(&p.param),
                    to(&p.grad),
                    p.moments.each_ref().map(|m| m.as_ref().map(to)),
                    p.step,
                )
            })
            .collect();
        return Ok(step_cudnn(eager, o)?
            .into_iter()
            .map(|(u, m)| (u.map(back), m.map(back)))
            .collect());
    }
    let lazy = |t: &FloatTensor<I>| cast_primitive::<I, CudnnFusion>(t.clone());
    let from_lazy = |t: FloatTensor<CudnnFusion>| cast_primitive::<CudnnFusion, I>(t);
    let recorded: Vec<_> = pending
        .iter()
        .map(|p| {
            (
                lazy(&p.param),
                lazy(&p.grad),
                p.moments.each_ref().map(|m| m.as_ref().map(lazy)),
                p.step,
            )
        })
        .collect();
    Ok(record_step(recorded, *o)
        .into_iter()
        .map(|(u, m)| (u.map(from_lazy), m.map(from_lazy)))
        .collect())
}

/// Records the fused step of every parameter as one custom operation on `Fusion<Cudnn>`.
fn record_step(inputs: Vec<AdamInput<Lazy>>, o: AdamOptions) -> Vec<Updated<CudnnFusion>> {
    let has: Vec<[bool; 3]> = inputs
        .iter()
        .map(|(_, _, m, _)| m.each_ref().map(|m| m.is_some()))
        .collect();
    let steps: Vec<u64> = inputs.iter().map(|i| i.3).collect();
    let n = steps.len();
    let per_param = 3 + usize::from(o.amsgrad);
    let outputs = inputs
        .iter()
        .flat_map(|(p, ..)| std::iter::repeat_n((p.shape.clone(), p.dtype), per_param))
        .collect();
    let flat = inputs
        .into_iter()
        .flat_map(|(p, g, m, _)| [Some(p), Some(g)].into_iter().chain(m).flatten())
        .collect();
    let out = record("cudnn_adam_step", flat, outputs, move |ins| {
        let mut ins = ins.into_iter();
        let mut next = || {
            ins.next().ok_or_else(|| {
                crate::error::Error::invalid_input("cudnn_adam_step", "internal error: fewer tensors than declared")
            })
        };
        let inputs = has
            .iter()
            .zip(&steps)
            .map(|(has, &step)| {
                let (p, g) = (next()?, next()?);
                let mut moments = [None, None, None];
                for (slot, &present) in moments.iter_mut().zip(has) {
                    if present {
                        *slot = Some(next()?);
                    }
                }
                Ok((p, g, moments, step))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(step_cudnn(inputs, &o)?
            .into_iter()
            .flat_map(|(u, m)| u.into_iter().chain(m))
            .collect())
    });
    // `record` returns exactly the `n * per_param` outputs declared above.
    debug_assert_eq!(out.len(), n * per_param);
    out.chunks_exact(per_param)
        .map(|c| ([c[0].clone(), c[1].clone(), c[2].clone()], c.get(3).cloned()))
        .collect()
}

/// Packs the inputs, allocates the outputs and launches the fused step for every parameter
/// (grouped by device): `(param, grad, moments, step)` in, [`Updated`] out, in order.
fn step_cudnn(inputs: Vec<AdamInput<CudnnTensor>>, o: &AdamOptions) -> Result<Vec<Updated<Cudnn>>> {
    const OP: &str = "adam_step";
    let prepared: Vec<_> = inputs
        .into_iter()
        .map(|(param, grad, moments, step)| {
            // One format for the parameter, its gradient and moments: channels-last when the
            // gradient is (a convolution filter's gradient on a channels-last network; the
            // parameter is stored channels-last from its first step on), else row-major.
            let channels_last = layout::is_channels_last(&grad.layout);
            let packed = |t: CudnnTensor, dtype: DType| {
                let t = exec::cast(t, dtype, OP)?;
                if channels_last {
                    t.channels_last(OP)
                } else {
                    t.row_major(OP)
                }
            };
            let dtype = param.dtype;
            let p = packed(param, dtype)?;
            let g = packed(grad, dtype)?;
            let [m, v, vm] = moments.map(|m| m.map(|t| packed(t, dtype)).transpose());
            let moments = [m?, v?, vm?];
            let new = || CudnnTensor::empty_in_format_of(&p, p.dims(), p.dtype, OP);
            let outputs = [new()?, new()?, new()?];
            let max_out = o.amsgrad.then(new).transpose()?;
            Ok((p, g, moments, outputs, max_out, step))
        })
        .collect::<Result<_>>()?;
    let mut devices: Vec<usize> = prepared.iter().map(|p| p.0.device().ordinal()).collect();
    devices.sort_unstable();
    devices.dedup();
    for dev in devices {
        let group: Vec<_> = prepared.iter().filter(|p| p.0.device().ordinal() == dev).collect();
        let refs: Vec<_> = group
            .iter()
            .map(|(p, g, moments, outputs, max_out, step)| {
                (
                    p.tref(),
                    g.tref(),
                    moments.each_ref().map(tref_of),
                    outputs.each_ref().map(|t| t.tmut()),
                    tmut_of(max_out),
                    *step,
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
        ops::adam_step(group[0].0.stream(), &params, o)?;
    }
    Ok(prepared
        .into_iter()
        .map(|(_, _, _, outputs, max_out, _)| (outputs, max_out))
        .collect())
}

/// One parameter's inputs to a fused step: parameter, gradient, the three optional moments
/// and the step number.
pub(crate) type AdamInput<T> = (T, T, [Option<T>; 3], u64);

/// First pass of a step: takes every parameter's gradient (clipped) and optimizer state,
/// leaving the module unchanged.
struct CollectMapper<'a, O, B>
where
    O: MomentumOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
{
    records: &'a mut HashMap<ParamId, AdaptorRecord<O, B>>,
    grads: Grads,
    clipping: Option<&'a GradientClipping>,
    pending: Vec<Pending<B::InnerBackend>>,
}

fn primitive<I: Backend, const D: usize>(t: Tensor<I, D>) -> FloatTensor<I> {
    t.into_primitive().tensor()
}

fn from_primitive<I: Backend, const D: usize>(t: FloatTensor<I>) -> Tensor<I, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

impl<O, B> ModuleMapper<B> for CollectMapper<'_, O, B>
where
    O: MomentumOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
{
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some((grad, device)) = self.grads.remove::<B::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
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
        let moments = match momentum {
            Some(s) => [
                Some(primitive(s.moment_1)),
                Some(primitive(s.moment_2)),
                s.max_moment_2.map(primitive),
            ],
            None => [None, None, None],
        };
        self.pending.push(Pending {
            id,
            param: primitive(tensor.clone().inner()),
            grad: primitive(grad),
            moments,
            step,
        });
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Second pass of a step: swaps in every updated parameter and stores its new state.
struct ApplyMapper<'a, O, B>
where
    O: MomentumOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
{
    records: &'a mut HashMap<ParamId, AdaptorRecord<O, B>>,
    updated: HashMap<ParamId, (Updated<B::InnerBackend>, u64)>,
}

impl<O, B> ModuleMapper<B> for ApplyMapper<'_, O, B>
where
    O: MomentumOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
{
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some((([value, m, v], max), step)) = self.updated.remove(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let state = AdaptiveMomentumState::<B::InnerBackend, D> {
            time: step as usize,
            moment_1: from_primitive(m),
            moment_2: from_primitive(v),
            max_moment_2: max.map(from_primitive),
        };
        self.records
            .insert(id, AdaptorRecord::from_state(O::from_momentum(state)));
        let mut updated = Tensor::<B, D>::from_inner(from_primitive(value));
        if tensor.is_require_grad() {
            updated = updated.require_grad();
        }
        // A parameter of a data-parallel model stays marked, as burn-optim's adaptor keeps it.
        #[cfg(feature = "distributed")]
        if tensor.is_distributed() {
            updated = updated.set_distributed(burn_backend::distributed::DistributedParamId::from(id.val()));
        }
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
