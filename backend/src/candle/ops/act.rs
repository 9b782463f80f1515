//! Backward of the fused activations: `grad · act'` as one generated elementwise kernel on
//! the GPU (f32/f16/bf16, computed in f32), composed of Candle ops elsewhere.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use crate::graph::DataType;
use crate::ops::elementwise::{BinaryOp, CompareOp, UnaryOp};
use crate::ops::fused::{FusedOp, Program, Value};
use crate::ops::Activation;

/// True when `act'` is taken from the activation's output `y` of dtype `dtype` alone (no need
/// to recompute the pre-activation): ReLU and ELU, and sigmoid (`y (1 - y)`) and tanh
/// (`1 - y²`) in f32/f64. In f16/bf16 those two subtract nearly equal numbers near
/// saturation, and `y`'s rounding alone (half an ulp of 0.9 is 2e-3 in bf16) gives errors of
/// several percent: there they are taken from the pre-activation.
pub(crate) fn grad_from_output(act: Activation, dtype: DType) -> bool {
    match act {
        Activation::Identity | Activation::Relu | Activation::Elu(_) => true,
        Activation::Sigmoid | Activation::Tanh => matches!(dtype, DType::F32 | DType::F64),
        Activation::Gelu | Activation::GeluTanh | Activation::Swish(_) => false,
    }
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
    let from_output = grad_from_output(act, y.dtype());
    let v = if from_output { Some(y) } else { z };
    if let Some(v) = v.filter(|v| fused_applies(grad, v)) {
        return grad.apply_op2_no_bwd(v, &ActBackward { act, from_output });
    }
    composed_act_backward(act, y, z, grad)
}

/// Whether the fused kernel takes `grad` and `v`: CUDA tensors of one float kernel dtype and
/// shape.
fn fused_applies(grad: &Tensor, v: &Tensor) -> bool {
    cfg!(feature = "candle-cuda")
        && super::fused_grads()
        && grad.device().is_cuda()
        && grad.dtype() == v.dtype()
        && matches!(grad.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && grad.dims() == v.dims()
}

/// `grad · act'(v)` in one kernel, `v` the activation's output when [`grad_from_output`],
/// else its input (inputs: grad, v).
#[derive(Clone, Copy, Debug)]
struct ActBackward {
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    act: Activation,
    /// `v` is the output (else the pre-activation).
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    from_output: bool,
}

/// The program of [`ActBackward`] for storage `dtype`: inputs `grad` (0) and `v` (1, the
/// output when `from_output`, else the pre-activation), one output; with its scalar operands.
#[cfg_attr(not(any(feature = "candle-cuda", test)), allow(dead_code))]
fn backward_program(act: Activation, dtype: DataType, from_output: bool) -> (Program, Vec<f32>) {
    use BinaryOp::{Add, Mul, Sub};
    let (g, v) = (Value::Input(0), Value::Input(1));
    let mut ops: Vec<FusedOp> = Vec::new();
    let mut scalars: Vec<f32> = Vec::new();
    let mut k = |x: f64| {
        scalars.push(x as f32);
        Value::Scalar((scalars.len() - 1) as u8)
    };
    let mut push = |op: FusedOp| {
        ops.push(op);
        Value::Reg((ops.len() - 1) as u16)
    };
    let unary = |op: UnaryOp, x: Value| FusedOp::unary(op, x).expect("a parameterless unary op");
    let d = match act {
        Activation::Identity => k(1.0),
        Activation::Relu => {
            let zero = k(0.0);
            let positive = push(FusedOp::Compare(CompareOp::Gt, v, zero));
            push(FusedOp::FromBool(positive))
        }
        Activation::Sigmoid => {
            let one = k(1.0);
            let s = if from_output {
                v
            } else {
                push(unary(UnaryOp::Sigmoid, v))
            };
            let rest = push(FusedOp::Binary(Sub, one, s));
            push(FusedOp::Binary(Mul, s, rest))
        }
        Activation::Tanh => {
            let one = k(1.0);
            let t = if from_output { v } else { push(unary(UnaryOp::Tanh, v)) };
            let sq = push(FusedOp::Binary(Mul, t, t));
            push(FusedOp::Binary(Sub, one, sq))
        }
        Activation::Elu(alpha) => {
            let (zero, alpha, one) = (k(0.0), k(alpha), k(1.0));
            let positive = push(FusedOp::Compare(CompareOp::Gt, v, zero));
            let shifted = push(FusedOp::Binary(Add, v, alpha));
            push(FusedOp::Select(positive, one, shifted))
        }
        Activation::Gelu => {
            // Φ(z) + z φ(z).
            let (r2, one, half) = (k(std::f64::consts::FRAC_1_SQRT_2), k(1.0), k(0.5));
            let (minus_half, norm) = (k(-0.5), k(1.0 / (2.0 * std::f64::consts::PI).sqrt()));
            let scaled = push(FusedOp::Binary(Mul, v, r2));
            let erf = push(unary(UnaryOp::Erf, scaled));
            let erf1 = push(FusedOp::Binary(Add, erf, one));
            let cdf = push(FusedOp::Binary(Mul, erf1, half));
            let sq = push(FusedOp::Binary(Mul, v, v));
            let arg = push(FusedOp::Binary(Mul, sq, minus_half));
            let e = push(unary(UnaryOp::Exp, arg));
            let pdf = push(FusedOp::Binary(Mul, e, norm));
            let zpdf = push(FusedOp::Binary(Mul, v, pdf));
            push(FusedOp::Binary(Add, cdf, zpdf))
        }
        Activation::GeluTanh => {
            // t = tanh(u), u = k z (1 + c z²): 0.5 (1 + t) + 0.5 z (1 - t²) k (1 + 3 c z²).
            let kk = (2.0 / std::f64::consts::PI).sqrt();
            let (c, one, kv, three_ck, half) = (k(0.044715), k(1.0), k(kk), k(3.0 * 0.044715 * kk), k(0.5));
            let sq = push(FusedOp::Binary(Mul, v, v));
            let csq = push(FusedOp::Binary(Mul, sq, c));
            let inner = push(FusedOp::Binary(Add, csq, one));
            let zi = push(FusedOp::Binary(Mul, v, inner));
            let u = push(FusedOp::Binary(Mul, zi, kv));
            let t = push(unary(UnaryOp::Tanh, u));
            let du0 = push(FusedOp::Binary(Mul, sq, three_ck));
            let du = push(FusedOp::Binary(Add, du0, kv));
            let th = push(FusedOp::Binary(Mul, t, half));
            let left = push(FusedOp::Binary(Add, th, half));
            let t2 = push(FusedOp::Binary(Mul, t, t));
            let sech2 = push(FusedOp::Binary(Sub, one, t2));
            let hz = push(FusedOp::Binary(Mul, v, half));
            let right0 = push(FusedOp::Binary(Mul, hz, sech2));
            let right = push(FusedOp::Binary(Mul, right0, du));
            push(FusedOp::Binary(Add, left, right))
        }
        Activation::Swish(beta) => {
            // s = sigmoid(β z): s + β z s (1 - s).
            let (one, beta) = (k(1.0), k(beta));
            let bz = push(FusedOp::Binary(Mul, v, beta));
            let s = push(unary(UnaryOp::Sigmoid, bz));
            let rest = push(FusedOp::Binary(Sub, one, s));
            let bzs = push(FusedOp::Binary(Mul, bz, s));
            let tail = push(FusedOp::Binary(Mul, bzs, rest));
            push(FusedOp::Binary(Add, s, tail))
        }
    };
    let out = push(FusedOp::Binary(Mul, g, d));
    let Value::Reg(out) = out else {
        unreachable!("push returns a register")
    };
    let program = Program {
        inputs: vec![dtype, dtype],
        scalars: scalars.len(),
        ops,
        outputs: vec![(out, dtype)],
        small_outputs: 0,
    };
    (program, scalars)
}

impl CustomOp2 for ActBackward {
    fn name(&self) -> &'static str {
        "cudnn-activation-backward"
    }

    fn cpu_fwd(&self, _g: &CpuStorage, _gl: &Layout, _v: &CpuStorage, _vl: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(crate::candle::arg_err(
            "candle activation backward",
            "grad",
            "the fused kernel runs on CUDA tensors (the CPU takes the composed path)",
        ))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        vs: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::candle::cuda;
        const OP: &str = "candle activation backward";
        let stream = cuda::stream(gs);
        let g = cuda::input(OP, "grad", gs, gl, &stream)?;
        let v = cuda::input(OP, "v", vs, vl, &stream)?;
        let (program, scalars) = backward_program(self.act, g.dtype(), self.from_output);
        let dims = super::idims(gl.dims());
        let strides = super::packed_strides(gl.dims(), false);
        let out = cuda::with_output(OP, &gs.device, &stream, g.dtype(), &dims, &strides, |out| {
            crate::ops::fused::run(
                &stream,
                &program,
                &[g.clone(), v.clone()],
                std::slice::from_ref(out),
                &scalars,
            )
        })?;
        Ok((out, gl.shape().clone()))
    }
}

/// [`act_backward`] with Candle ops.
fn composed_act_backward(act: Activation, y: &Tensor, z: Option<&Tensor>, grad: &Tensor) -> Result<Tensor> {
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
        Activation::Sigmoid => {
            let s = if grad_from_output(act, grad.dtype()) {
                y.clone()
            } else {
                ((pre()? * -1.0)?.exp()? + 1.0)?.recip()?
            };
            (&s * s.affine(-1.0, 1.0)?)?
        }
        Activation::Tanh => {
            let t = if grad_from_output(act, grad.dtype()) {
                y.clone()
            } else {
                pre()?.tanh()?
            };
            t.sqr()?.affine(-1.0, 1.0)?
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// erf to about 1.5e-7 (Abramowitz and Stegun 7.1.26): the same on both sides of the check.
    fn erf(x: f64) -> f64 {
        let t = 1.0 / (1.0 + 0.3275911 * x.abs());
        let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
        (1.0 - poly * (-x * x).exp()).copysign(x)
    }

    fn activation(act: Activation, z: f64) -> f64 {
        match act {
            Activation::Identity => z,
            Activation::Relu => z.max(0.0),
            Activation::Sigmoid => 1.0 / (1.0 + (-z).exp()),
            Activation::Tanh => z.tanh(),
            Activation::Elu(a) => {
                if z > 0.0 {
                    z
                } else {
                    a * (z.exp() - 1.0)
                }
            }
            Activation::Gelu => 0.5 * z * (1.0 + erf(z / 2f64.sqrt())),
            Activation::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * z * (1.0 + (k * (z + 0.044715 * z * z * z)).tanh())
            }
            Activation::Swish(b) => z / (1.0 + (-b * z).exp()),
        }
    }

    /// Runs `program` on the host in f64 (the operations the backward programs use).
    fn eval(program: &Program, inputs: [f64; 2], scalars: &[f32]) -> f64 {
        let mut regs: Vec<f64> = Vec::new();
        let get = |regs: &Vec<f64>, v: Value| match v {
            Value::Input(i) => inputs[i as usize],
            Value::Reg(r) => regs[r as usize],
            Value::Scalar(s) => scalars[s as usize] as f64,
        };
        for op in &program.ops {
            let r = match *op {
                FusedOp::Binary(b, x, y) => {
                    let (x, y) = (get(&regs, x), get(&regs, y));
                    match b {
                        BinaryOp::Add => x + y,
                        BinaryOp::Sub => x - y,
                        BinaryOp::Mul => x * y,
                        BinaryOp::Div => x / y,
                        other => panic!("{other:?} is not used by the backward programs"),
                    }
                }
                FusedOp::Unary(code, x) => {
                    let x = get(&regs, x);
                    if code == UnaryOp::Erf.code() {
                        erf(x)
                    } else if code == UnaryOp::Exp.code() {
                        x.exp()
                    } else if code == UnaryOp::Tanh.code() {
                        x.tanh()
                    } else if code == UnaryOp::Sigmoid.code() {
                        1.0 / (1.0 + (-x).exp())
                    } else {
                        panic!("unary code {code} is not used by the backward programs")
                    }
                }
                FusedOp::Compare(CompareOp::Gt, x, y) => f64::from(get(&regs, x) > get(&regs, y)),
                FusedOp::FromBool(x) => get(&regs, x),
                FusedOp::Select(c, a, b) => {
                    if get(&regs, c) != 0.0 {
                        get(&regs, a)
                    } else {
                        get(&regs, b)
                    }
                }
                other => panic!("{other:?} is not used by the backward programs"),
            };
            regs.push(r);
        }
        regs[program.outputs[0].0 as usize]
    }

    /// Every activation's program is valid and computes `grad · act'` (against a central
    /// difference of the activation) from the output or the input as `act_backward` passes it.
    #[test]
    fn backward_programs_compute_the_derivative() {
        let acts = [
            Activation::Relu,
            Activation::Sigmoid,
            Activation::Tanh,
            Activation::Elu(0.7),
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Swish(1.3),
        ];
        for act in acts {
            for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
                for from_output in [false, true] {
                    let (program, scalars) = backward_program(act, dtype, from_output);
                    program.validate().unwrap_or_else(|e| panic!("{act:?} {dtype:?}: {e}"));
                    assert_eq!(program.scalars, scalars.len());
                }
            }
            for (dtype, storage) in [(DType::F32, DataType::F32), (DType::BF16, DataType::BF16)] {
                let from_output = grad_from_output(act, dtype);
                let (program, scalars) = backward_program(act, storage, from_output);
                for i in 0..41 {
                    let z = -3.05 + 0.15 * i as f64;
                    let grad = 0.25 + 0.1 * i as f64;
                    let h = 1e-5;
                    let want = grad * (activation(act, z + h) - activation(act, z - h)) / (2.0 * h);
                    let v = if from_output { activation(act, z) } else { z };
                    let got = eval(&program, [grad, v], &scalars);
                    assert!(
                        (got - want).abs() <= 2e-5 * (1.0 + want.abs()),
                        "{act:?} {dtype:?} at z = {z}: fused program {got}, central difference {want}"
                    );
                }
            }
        }
    }
}
