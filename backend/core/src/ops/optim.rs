//! A multi-tensor fused Adam / AdamW step: every parameter, both moments, bias correction,
//! weight decay (L2 or decoupled) and AMSGrad in one launch per 32 tensors of one dtype.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::launch_optim::{self as launch, AdamBatch, AdamHyper, AdamTensor, ADAM_MAX};
use crate::graph::DataType;
use crate::kernels::{stream_function, OPTIM};

/// Elements each block updates.
const CHUNK: i64 = 4096;

/// Hyper-parameters of an Adam / AdamW step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamOptions {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to the (bias-corrected) root of the second moment.
    pub epsilon: f32,
    /// Adam's weight decay: `penalty * param` added to the gradient (0 for none).
    pub l2_penalty: f32,
    /// AdamW's decoupled weight decay: `param *= 1 - lr * decay` (0 for none).
    pub decoupled_decay: f32,
    /// Cautious decoupled decay: skipped where the parameter and the new first moment
    /// differ in sign.
    pub cautious: bool,
    /// AMSGrad: normalize by the running maximum of the second moment.
    pub amsgrad: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            l2_penalty: 0.0,
            decoupled_decay: 0.0,
            cautious: false,
            amsgrad: false,
        }
    }
}

/// One parameter tensor of [`adam_step`]. All tensors of one parameter share dims and
/// dtype (f32, f16 or bf16) and are packed; an output may be its own input.
#[derive(Clone, Copy, Debug)]
pub struct AdamParam<'a> {
    /// The parameter before the step.
    pub param: &'a TensorRef<'a>,
    /// Its gradient.
    pub grad: &'a TensorRef<'a>,
    /// First moment before the step (`None` on the first step: zeros).
    pub moment1: Option<&'a TensorRef<'a>>,
    /// Second moment before the step (`None` on the first step: zeros).
    pub moment2: Option<&'a TensorRef<'a>>,
    /// AMSGrad's maximum second moment before the step (`None`: the new second moment).
    pub max_moment2: Option<&'a TensorRef<'a>>,
    /// The parameter after the step.
    pub param_out: &'a TensorMut<'a>,
    /// First moment after the step.
    pub moment1_out: &'a TensorMut<'a>,
    /// Second moment after the step.
    pub moment2_out: &'a TensorMut<'a>,
    /// AMSGrad's maximum after the step (required with `amsgrad`).
    pub max_moment2_out: Option<&'a TensorMut<'a>>,
    /// The step number this update makes (1 for the first), for bias correction.
    pub step: u64,
}

/// The bias-correction factors `(a, e)` of step `t`: `update = m * a / (sqrt(v) + e)`,
/// which equals `(m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`.
pub(crate) fn bias_correction(o: &AdamOptions, t: u64) -> (f32, f32) {
    let t = t.min(i32::MAX as u64) as i32;
    let bc2_sqrt = (1.0 - o.beta2.powi(t)).sqrt();
    (bc2_sqrt / (1.0 - o.beta1.powi(t)), o.epsilon * bc2_sqrt)
}

fn kernel_for(op: &'static str, dtype: DataType) -> Result<&'static str> {
    match dtype {
        DataType::F32 => Ok("adam_f32"),
        DataType::F16 => Ok("adam_f16"),
        DataType::BF16 => Ok("adam_bf16"),
        other => Err(Error::invalid_arg(
            op,
            "param",
            format!("dtype {other:?} is not supported (F32, F16 or BF16)"),
        )),
    }
}

fn check_param(op: &'static str, p: &AdamParam<'_>, amsgrad: bool) -> Result<()> {
    let like = |arg: &'static str, t: &TensorRef| -> Result<()> {
        t.check(op, arg)?;
        if t.dims != p.param.dims || t.dtype != p.param.dtype || !t.is_packed() {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "{:?} {:?} (strides {:?}) must be packed and match the parameter's {:?} {:?}",
                    t.dims, t.dtype, t.strides, p.param.dims, p.param.dtype
                ),
            ));
        }
        if t.strides != p.param.strides && t.numel() > 1 {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "strides {:?} differ from the parameter's {:?}",
                    t.strides, p.param.strides
                ),
            ));
        }
        Ok(())
    };
    like("param", p.param)?;
    like("grad", p.grad)?;
    like("param_out", p.param_out)?;
    like("moment1_out", p.moment1_out)?;
    like("moment2_out", p.moment2_out)?;
    for (arg, t) in [
        ("moment1", p.moment1),
        ("moment2", p.moment2),
        ("max_moment2", p.max_moment2),
        ("max_moment2_out", p.max_moment2_out.map(TensorMut::as_input)),
    ] {
        if let Some(t) = t {
            like(arg, t)?;
        }
    }
    if amsgrad && p.max_moment2_out.is_none() {
        return Err(Error::invalid_arg(op, "max_moment2_out", "required with amsgrad"));
    }
    if p.step == 0 {
        return Err(Error::invalid_arg(op, "step", "steps count from 1"));
    }
    Ok(())
}

/// One fused Adam / AdamW step over `params` (any number, any mix of f32/f16/bf16): reads
/// each parameter, gradient and moments once and writes the new ones, in one launch per
/// 32 tensors of one dtype. Computes in f32; moments are stored in the parameter dtype.
pub fn adam_step(stream: &Arc<CudaStream>, params: &[AdamParam<'_>], o: &AdamOptions) -> Result<()> {
    const OP: &str = "adam_step";
    for p in params {
        check_param(OP, p, o.amsgrad)?;
        kernel_for(OP, p.param.dtype)?;
        check_on_stream_device(
            stream,
            OP,
            &[
                ("param", Some(p.param)),
                ("grad", Some(p.grad)),
                ("moment1", p.moment1),
                ("moment2", p.moment2),
                ("max_moment2", p.max_moment2),
                ("param_out", Some(p.param_out)),
                ("moment1_out", Some(p.moment1_out)),
                ("moment2_out", Some(p.moment2_out)),
                ("max_moment2_out", p.max_moment2_out.map(TensorMut::as_input)),
            ],
        )?;
    }
    let hyper = AdamHyper {
        lr: o.lr as f32,
        beta1: o.beta1,
        beta2: o.beta2,
        l2: o.l2_penalty,
        decay_rate: (o.lr * o.decoupled_decay as f64) as f32,
        amsgrad: o.amsgrad as i32,
        cautious: o.cautious as i32,
    };
    let ptr = crate::types::DeviceAddress::of;
    for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
        let group: Vec<&AdamParam<'_>> = params
            .iter()
            .filter(|p| p.param.dtype == dtype && p.param.numel() > 0)
            .collect();
        if group.is_empty() {
            continue;
        }
        let f = stream_function(stream, OPTIM, kernel_for(OP, dtype)?)?;
        for batch in group.chunks(ADAM_MAX) {
            let mut b = AdamBatch {
                count: batch.len() as i32,
                chunk: CHUNK as i32,
                first_chunk: [0; ADAM_MAX + 1],
                t: [AdamTensor::default(); ADAM_MAX],
            };
            for (i, p) in batch.iter().enumerate() {
                let (a, e) = bias_correction(o, p.step);
                let numel = p.param.numel();
                b.t[i] = AdamTensor {
                    p: p.param.address(),
                    g: p.grad.address(),
                    m: ptr(p.moment1),
                    v: ptr(p.moment2),
                    vmax: ptr(p.max_moment2),
                    p_out: p.param_out.address(),
                    m_out: p.moment1_out.address(),
                    v_out: p.moment2_out.address(),
                    vmax_out: ptr(p.max_moment2_out.map(TensorMut::as_input)),
                    numel,
                    a,
                    e,
                };
                let chunks = (numel + CHUNK - 1) / CHUNK;
                let next = b.first_chunk[i] as i64 + chunks;
                if next > i32::MAX as i64 {
                    return Err(Error::invalid_arg(
                        OP,
                        "param",
                        format!("{numel} elements: too many for one step"),
                    ));
                }
                b.first_chunk[i + 1] = next as i32;
            }
            launch::adam(stream, &f, &b, &hyper)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_correction_matches_the_textbook_form() {
        let o = AdamOptions::default();
        for t in [1u64, 2, 10, 1000] {
            let (a, e) = bias_correction(&o, t);
            let (m, v) = (0.3f64, 0.02f64);
            let bc1 = 1.0 - (o.beta1 as f64).powi(t as i32);
            let bc2 = 1.0 - (o.beta2 as f64).powi(t as i32);
            let textbook = (m / bc1) / ((v / bc2).sqrt() + o.epsilon as f64);
            let ours = m * a as f64 / (v.sqrt() + e as f64);
            assert!(
                (ours - textbook).abs() <= 1e-5 * textbook.abs(),
                "t={t}: {ours} vs {textbook}"
            );
        }
    }

    #[test]
    fn parameters_are_checked() {
        let p = TensorRef::fake_packed(&[4, 3], DataType::F32, 256);
        let g = TensorRef::fake_packed(&[4, 3], DataType::F32, 512);
        let bad = TensorRef::fake_packed(&[3, 4], DataType::F32, 768);
        let half = TensorRef::fake_packed(&[4, 3], DataType::F16, 768);
        let (p_out, g_out) = (TensorMut::fake_of(&p), TensorMut::fake_of(&g));
        let good = AdamParam {
            param: &p,
            grad: &g,
            moment1: None,
            moment2: None,
            max_moment2: None,
            param_out: &p_out,
            moment1_out: &g_out,
            moment2_out: &g_out,
            max_moment2_out: None,
            step: 1,
        };
        assert!(check_param("t", &good, false).is_ok());
        assert!(check_param("t", &good, true).is_err(), "amsgrad needs max_moment2_out");
        assert!(check_param("t", &AdamParam { step: 0, ..good }, false).is_err());
        assert!(check_param("t", &AdamParam { grad: &bad, ..good }, false).is_err());
        assert!(check_param(
            "t",
            &AdamParam {
                moment1: Some(&half),
                ..good
            },
            false
        )
        .is_err());
        let strided = TensorRef::fake(&[4, 3], &[1, 4], DataType::F32, 1024);
        assert!(check_param("t", &AdamParam { grad: &strided, ..good }, false).is_err());
    }

    #[test]
    fn the_parameter_block_fits_the_launch_limit() {
        // Kernel parameters: the batch and the hyper-parameters, under the 4 KiB every
        // architecture accepts.
        let bytes = std::mem::size_of::<AdamBatch>() + std::mem::size_of::<AdamHyper>();
        assert!(bytes <= 4096, "{bytes} bytes");
        assert_eq!(std::mem::size_of::<AdamTensor>(), 88);
    }
}
