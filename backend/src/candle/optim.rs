//! [`FusedAdamW`]: candle-nn's AdamW as one multi-tensor kernel launch per step.

use std::collections::HashSet;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::Optimizer;
pub use candle_nn::ParamsAdamW;

use super::arg_err;

const OP: &str = "candle FusedAdamW";

/// AdamW with decoupled weight decay, a drop-in for `candle_nn::AdamW` (same
/// [`ParamsAdamW`] configuration, same [`Optimizer`] trait, same update): for step `t`
/// (counted per call of `step`, whether or not a variable has a gradient),
/// `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`,
/// `θ = θ·(1 - lr·λ) - lr · (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε)`.
/// Variables without a gradient in the store are left alone, moments included.
///
/// On CUDA, f32 and bf16 variables are updated by the engine's multi-tensor Adam kernel
/// ([`crate::ops::adam_step`]): one launch per 32 variables of one device reads each
/// parameter, gradient and both moments once and writes the parameter and moments in place, in
/// the variables' own storage (their storages write-locked while the launch is enqueued, so no
/// other tensor op interleaves). The kernel computes in f32 (betas and ε rounded to f32, the
/// bias corrections folded into two per-step factors); candle-nn computes the same expression
/// with Candle ops, so results agree to rounding. For bf16 variables the kernel computes in
/// f32 too and keeps the moments in bf16 (as PyTorch's Adam on bf16 parameters). Every other
/// variable (the CPU, f16, f64, other devices) is updated with Candle ops, as candle-nn does,
/// but computed in f32 for f16 variables: candle-nn's own f16 update divides by an ε that
/// rounds to 0, and a second moment stored in f16 underflows to 0 for gradients below about
/// 2e-4, which the kernel (reading the moments as stored) would divide by ε.
///
/// The moments live on the variables' device, allocated (zeros) at the first step that
/// gives a variable a gradient, so variables that never get one (batch-norm running
/// statistics of a `VarMap`) cost no memory.
#[derive(Debug)]
pub struct FusedAdamW {
    vars: Vec<VarState>,
    step_t: usize,
    params: ParamsAdamW,
}

/// A variable and its moments (once it had a gradient).
#[derive(Debug)]
struct VarState {
    var: Var,
    moments: Option<(Var, Var)>,
}

/// What one step does to one variable: its index and its (contiguous) gradient.
struct Update {
    index: usize,
    grad: Tensor,
}

impl Optimizer for FusedAdamW {
    type Config = ParamsAdamW;

    /// Keeps the float variables (as candle-nn's AdamW does), each once.
    fn new(vars: Vec<Var>, params: ParamsAdamW) -> Result<Self> {
        let mut seen = HashSet::new();
        let vars = vars
            .into_iter()
            .filter(|v| v.dtype().is_float() && seen.insert(v.id()))
            .map(|var| VarState { var, moments: None })
            .collect();
        Ok(Self {
            vars,
            step_t: 0,
            params,
        })
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_t += 1;
        let mut updates = Vec::new();
        for (index, s) in self.vars.iter_mut().enumerate() {
            let Some(g) = grads.get(s.var.as_tensor()) else {
                continue;
            };
            if g.shape() != s.var.shape() || g.dtype() != s.var.dtype() {
                return Err(arg_err(
                    OP,
                    "grads",
                    format!(
                        "gradient {:?} {:?} does not match its variable's {:?} {:?}",
                        g.dims(),
                        g.dtype(),
                        s.var.dims(),
                        s.var.dtype()
                    ),
                ));
            }
            if s.var.elem_count() == 0 {
                continue;
            }
            if s.moments.is_none() {
                let (shape, dt, dev) = (s.var.shape(), s.var.dtype(), s.var.device());
                s.moments = Some((Var::zeros(shape, dt, dev)?, Var::zeros(shape, dt, dev)?));
            }
            updates.push(Update {
                index,
                grad: g.contiguous()?,
            });
        }
        let (fused, composed): (Vec<Update>, Vec<Update>) = updates
            .into_iter()
            .partition(|u| fused_applies(&self.vars[u.index].var));
        for u in &composed {
            self.composed_update(u)?;
        }
        for group in groups(&self.vars, fused) {
            for chunk in group.chunks(crate::ffi::launch_optim::ADAM_MAX) {
                self.fused_update(chunk)?;
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr
    }
}

impl FusedAdamW {
    /// The optimizer with candle-nn's default parameters and learning rate `lr`.
    pub fn new_lr(vars: Vec<Var>, lr: f64) -> Result<Self> {
        Self::new(
            vars,
            ParamsAdamW {
                lr,
                ..Default::default()
            },
        )
    }

    /// The configuration.
    pub fn params(&self) -> &ParamsAdamW {
        &self.params
    }

    /// Replaces the configuration (the step count and moments stay).
    pub fn set_params(&mut self, params: ParamsAdamW) {
        self.params = params;
    }

    /// Steps taken so far (the `t` of the bias correction of the last step).
    pub fn step_count(&self) -> usize {
        self.step_t
    }

    /// The variables this optimizer updates.
    pub fn vars(&self) -> Vec<Var> {
        self.vars.iter().map(|s| s.var.clone()).collect()
    }

    /// The bias corrections `(1 / (1-β1^t), 1 / (1-β2^t))` of the current step.
    fn corrections(&self) -> (f64, f64) {
        let t = self.step_t.min(i32::MAX as usize) as i32;
        let p = &self.params;
        (1.0 / (1.0 - p.beta1.powi(t)), 1.0 / (1.0 - p.beta2.powi(t)))
    }

    /// The update of one variable with Candle ops.
    fn composed_update(&self, u: &Update) -> Result<()> {
        let s = &self.vars[u.index];
        let Some((m, v)) = &s.moments else {
            return Ok(());
        };
        let p = &self.params;
        let (scale_m, scale_v) = self.corrections();
        // In f32 for half-precision variables (f64 for f64), rounded once at the end: in f16
        // the default epsilon (1e-8) rounds to 0 and a zero second moment divides by it.
        let dt = s.var.dtype();
        let acc = if dt == DType::F64 { DType::F64 } else { DType::F32 };
        let g = u.grad.to_dtype(acc)?;
        let m_next = ((m.as_tensor().to_dtype(acc)? * p.beta1)? + (&g * (1.0 - p.beta1))?)?;
        let v_next = ((v.as_tensor().to_dtype(acc)? * p.beta2)? + (g.sqr()? * (1.0 - p.beta2))?)?;
        let denom = ((&v_next * scale_v)?.sqrt()? + p.eps)?;
        let step = ((&m_next * scale_m)? / denom)?;
        let theta = ((s.var.as_tensor().to_dtype(acc)? * (1.0 - p.lr * p.weight_decay))? - (step * p.lr)?)?;
        m.set(&m_next.to_dtype(dt)?)?;
        v.set(&v_next.to_dtype(dt)?)?;
        s.var.set(&theta.to_dtype(dt)?)
    }

    /// One launch of the engine's Adam kernel over up to 32 variables of one device and dtype.
    #[cfg(feature = "candle-cuda")]
    fn fused_update(&self, chunk: &[Update]) -> Result<()> {
        use crate::candle::access::{check_distinct, storage_id, with_written};
        use crate::candle::cuda;
        use crate::ops::{adam_step, AdamOptions, AdamParam};

        let mut written: Vec<&Tensor> = Vec::with_capacity(3 * chunk.len());
        for u in chunk {
            let s = &self.vars[u.index];
            let Some((m, v)) = &s.moments else {
                return Err(arg_err(OP, "moments", "missing before the update"));
            };
            written.extend([s.var.as_tensor(), m.as_tensor(), v.as_tensor()]);
        }
        let names = ["parameter", "first moment", "second moment"];
        let written_ids: Vec<(&'static str, usize)> = written
            .iter()
            .enumerate()
            .map(|(i, t)| (names[i % 3], storage_id(t)))
            .collect();
        let read_ids: Vec<usize> = chunk.iter().map(|u| storage_id(&u.grad)).collect();
        check_distinct(OP, &written_ids, &read_ids)?;
        let guards: Vec<_> = chunk.iter().map(|u| u.grad.storage_and_layout()).collect();
        let Some((first, _)) = guards.first() else {
            return Ok(());
        };
        let stream = cuda::stream(cuda::storage_of(OP, "grad", first)?);
        let mut grads = Vec::with_capacity(chunk.len());
        for (g, l) in &guards {
            grads.push(cuda::input(OP, "grad", cuda::storage_of(OP, "grad", g)?, l, &stream)?);
        }
        let p = &self.params;
        let options = AdamOptions {
            lr: p.lr,
            beta1: p.beta1 as f32,
            beta2: p.beta2 as f32,
            epsilon: p.eps as f32,
            l2_penalty: 0.0,
            decoupled_decay: p.weight_decay as f32,
            cautious: false,
            amsgrad: false,
        };
        let step = self.step_t as u64;
        with_written(OP, &written, &mut |v| {
            let params: Vec<AdamParam<'_>> = grads
                .iter()
                .enumerate()
                .map(|(i, g)| AdamParam {
                    param: v[3 * i],
                    grad: g,
                    moment1: Some(v[3 * i + 1]),
                    moment2: Some(v[3 * i + 2]),
                    max_moment2: None,
                    param_out: v[3 * i],
                    moment1_out: v[3 * i + 1],
                    moment2_out: v[3 * i + 2],
                    max_moment2_out: None,
                    step,
                })
                .collect();
            adam_step(&stream, &params, &options).map_err(candle_core::Error::wrap)
        })
    }

    /// Without CUDA support no variable takes the fused path.
    #[cfg(not(feature = "candle-cuda"))]
    fn fused_update(&self, chunk: &[Update]) -> Result<()> {
        chunk.iter().try_for_each(|u| self.composed_update(u))
    }
}

/// Whether the engine's kernel updates `var`: f32 or bf16 on a CUDA device (f16 moments
/// underflow, see [`FusedAdamW`]).
fn fused_applies(var: &Var) -> bool {
    cfg!(feature = "candle-cuda")
        && matches!(var.device(), Device::Cuda(_))
        && matches!(var.dtype(), DType::F32 | DType::BF16)
}

/// The updates grouped by device (Candle device identity: one stream) and dtype, in order.
fn groups(vars: &[VarState], updates: Vec<Update>) -> Vec<Vec<Update>> {
    let mut out: Vec<(Device, DType, Vec<Update>)> = Vec::new();
    for u in updates {
        let var = &vars[u.index].var;
        match out
            .iter_mut()
            .find(|(d, t, _)| d.same_device(var.device()) && *t == var.dtype())
        {
            Some((_, _, group)) => group.push(u),
            None => out.push((var.device().clone(), var.dtype(), vec![u])),
        }
    }
    out.into_iter().map(|(_, _, g)| g).collect()
}
