//! Backward of the fused activations, composed of Candle ops (elementwise work only).

use candle_core::{DType, Result, Tensor};

use crate::ops::Activation;

/// True when `act'` can be written in terms of the activation's output alone (no need to
/// recompute the pre-activation).
pub(crate) fn grad_from_output(act: Activation) -> bool {
    matches!(
        act,
        Activation::Identity | Activation::Relu | Activation::Sigmoid | Activation::Tanh | Activation::Elu(_)
    )
}

/// The dtype elementwise backward math runs in: f64 for f64, else f32.
pub(crate) fn acc_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `grad · act'(z)` where `y = act(z)` is the op output and `z` the pre-activation (needed
/// only when [`grad_from_output`] is false). Computed in f32 (f64 for f64), returned in
/// `grad`'s dtype.
pub(crate) fn act_backward(act: Activation, y: &Tensor, z: Option<&Tensor>, grad: &Tensor) -> Result<Tensor> {
    if act == Activation::Identity {
        return Ok(grad.clone());
    }
    let acc = acc_dtype(grad.dtype());
    let g = grad.to_dtype(acc)?;
    let y = y.to_dtype(acc)?;
    let pre = || -> Result<Tensor> {
        match z {
            Some(z) => z.to_dtype(acc),
            None => candle_core::bail!("activation backward needs the pre-activation"),
        }
    };
    let d = match act {
        Activation::Identity => unreachable!(),
        Activation::Relu => y.gt(0.0)?.to_dtype(acc)?,
        Activation::Sigmoid => (&y * y.affine(-1.0, 1.0)?)?,
        Activation::Tanh => y.sqr()?.affine(-1.0, 1.0)?,
        Activation::Elu(alpha) => {
            let pos = y.gt(0.0)?;
            pos.where_cond(&y.ones_like()?, &(&y + alpha)?)?
        }
        Activation::Gelu => {
            let z = pre()?;
            let cdf = ((&z * std::f64::consts::FRAC_1_SQRT_2)?.erf()? + 1.0)? * 0.5;
            let pdf = (z.sqr()? * -0.5)?.exp()? * (1.0 / (2.0 * std::f64::consts::PI).sqrt());
            (cdf? + (&z * pdf?)?)?
        }
        Activation::GeluTanh => {
            let z = pre()?;
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let z2 = z.sqr()?;
            let u = ((&z * (&z2 * 0.044715)?.affine(1.0, 1.0)?)? * k)?;
            let t = u.tanh()?;
            let du = ((&z2 * (3.0 * 0.044715))?.affine(k, k))?;
            let left = t.affine(0.5, 0.5)?;
            let right = ((&z * 0.5)? * t.sqr()?.affine(-1.0, 1.0)?)?;
            (left + (right * du)?)?
        }
        Activation::Swish(beta) => {
            let z = pre()?;
            let s = ((&z * -beta)?.exp()? + 1.0)?.recip()?;
            let bz = (&z * beta)?;
            (&s + ((bz * &s)? * s.affine(-1.0, 1.0)?)?)?
        }
    };
    (g * d)?.to_dtype(grad.dtype())
}
