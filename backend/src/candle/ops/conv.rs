//! Convolutions: forward, backward data (also transposed convolution), backward filter,
//! and conv + bias + activation fused.

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::act::{acc_dtype, act_backward, grad_from_output};
use super::{idims, in_format, is_channels_last, logical, packed, physical_dims, same_dtype};
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::{arg_err, cpu};
use crate::ops::{Activation, ConvParams};
use cudnn_backend_reference as reference;

/// The reference activation matching `a`.
/// The float64 reference's description of a convolution of geometry `p`.
fn reference_geometry(p: &ConvParams) -> reference::ConvGeometry {
    reference::ConvGeometry::from_i64(&p.pre_padding, &p.post_padding, &p.stride, &p.dilation, p.groups)
}

pub(crate) fn ref_act(a: Activation) -> reference::Activation {
    match a {
        Activation::Identity => reference::Activation::Identity,
        Activation::Relu => reference::Activation::Relu,
        Activation::Gelu => reference::Activation::Gelu,
        Activation::GeluTanh => reference::Activation::GeluTanh,
        Activation::Sigmoid => reference::Activation::Sigmoid,
        Activation::Tanh => reference::Activation::Tanh,
        Activation::Elu(alpha) => reference::Activation::Elu { alpha },
        Activation::Swish(beta) => reference::Activation::Swish { beta },
    }
}

/// Validates a forward convolution of `x` by `w` and returns y's logical dims.
pub(crate) fn conv_out_dims(op: &'static str, p: &ConvParams, x: &[usize], w: &[usize]) -> Result<Vec<usize>> {
    let s = p.stride.len();
    if !(1..=3).contains(&s) {
        return Err(arg_err(
            op,
            "params",
            format!("{s} spatial dims: 1, 2 or 3 are supported"),
        ));
    }
    if x.len() != s + 2 || w.len() != s + 2 {
        return Err(arg_err(
            op,
            "x",
            format!("x {x:?} and w {w:?} need rank {} for {s} spatial dims", s + 2),
        ));
    }
    let g = p.groups;
    if g < 1 || x[1] as i64 != w[1] as i64 * g || w[0] as i64 % g != 0 {
        return Err(arg_err(
            op,
            "groups",
            format!(
                "{g} groups need x channels ({}) = filter channels ({}) x groups and filters ({}) divisible by groups",
                x[1], w[1], w[0]
            ),
        ));
    }
    let y = p.output_dims(&idims(x), &idims(w)).map_err(candle_core::Error::wrap)?;
    Ok(cpu::udims(&y))
}

/// Float64 result (logical row-major) as CPU storage in the op's memory format.
fn finish_cpu(op: &'static str, v: Vec<f64>, dims: &[usize], cl: bool, dtype: DType) -> Result<(CpuStorage, Shape)> {
    let v = cpu::to_physical(v, dims, cl);
    Ok((cpu::write(op, &v, dtype)?, physical_dims(dims, cl).into()))
}

fn is_empty(d: &[usize]) -> bool {
    d.contains(&0)
}

/// `y = conv(x, w)`: cross-correlation with padding, stride, dilation and groups, any number
/// of spatial dims. Inputs: x (N, C, spatial...), w (K, C/groups, window...).
#[derive(Clone, Debug)]
pub struct Conv {
    /// Geometry and groups.
    pub params: ConvParams,
    /// Produce the output channels-last (shape N, spatial..., K) instead of NCHW.
    pub channels_last: bool,
}

impl CustomOp2 for Conv {
    fn name(&self) -> &'static str {
        "cudnn-conv"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle conv";
        let y = conv_out_dims(OP, &self.params, xl.dims(), wl.dims())?;
        same_dtype(OP, &[("x", xs.dtype()), ("w", ws.dtype())])?;
        let out = if is_empty(&y) || is_empty(xl.dims()) || is_empty(wl.dims()) {
            vec![0.0; y.iter().product()]
        } else {
            let (x, w) = (cpu::read(OP, "x", xs, xl)?, cpu::read(OP, "w", ws, wl)?);
            reference::conv_forward(&x, xl.dims(), &w, wl.dims(), &reference_geometry(&self.params))
        };
        finish_cpu(OP, out, &y, self.channels_last, xs.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle conv";
        let y = conv_out_dims(OP, &self.params, xl.dims(), wl.dims())?;
        same_dtype(OP, &[("x", xs.dtype()), ("w", ws.dtype())])?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let w = cuda::input(OP, "w", ws, wl, &stream)?;
        let strides = super::packed_strides(&y, self.channels_last);
        let out = cuda::with_output(OP, &xs.device, &stream, x.dtype(), &idims(&y), &strides, |yr| {
            crate::ops::conv_forward(&stream, &x, &w, yr, &self.params)
        })?;
        Ok((out, physical_dims(&y, self.channels_last).into()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = logical(grad.clone(), self.channels_last)?;
        let dx = conv_backward_data(&g, w, x.dims(), &self.params)?;
        let dw = conv_backward_filter(x, &g, w.dims(), &self.params, is_channels_last(w.layout()))?;
        Ok((Some(dx), Some(dw)))
    }
}

/// `dx = conv_backward_data(dy, w)`: the gradient of [`Conv`] with respect to x (cuDNN's
/// dgrad graph), also the forward of a transposed convolution. Inputs: dy, w.
#[derive(Clone, Debug)]
pub struct ConvBackwardData {
    /// Geometry of the forward convolution.
    pub params: ConvParams,
    /// Logical dims of x (and so of dx).
    pub x_dims: Vec<usize>,
    /// Produce dx channels-last.
    pub channels_last: bool,
}

impl ConvBackwardData {
    fn check(&self, op: &'static str, dy: &[usize], w: &[usize]) -> Result<()> {
        let y = conv_out_dims(op, &self.params, &self.x_dims, w)?;
        if y != dy {
            return Err(arg_err(
                op,
                "dy",
                format!("x {:?} convolves to {y:?}, but dy is {dy:?}", self.x_dims),
            ));
        }
        Ok(())
    }
}

impl CustomOp2 for ConvBackwardData {
    fn name(&self) -> &'static str {
        "cudnn-conv-backward-data"
    }

    fn cpu_fwd(&self, ds: &CpuStorage, dl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle conv_backward_data";
        self.check(OP, dl.dims(), wl.dims())?;
        same_dtype(OP, &[("dy", ds.dtype()), ("w", ws.dtype())])?;
        let x = &self.x_dims;
        let out = if is_empty(x) || is_empty(dl.dims()) || is_empty(wl.dims()) {
            vec![0.0; x.iter().product()]
        } else {
            let (dy, w) = (cpu::read(OP, "dy", ds, dl)?, cpu::read(OP, "w", ws, wl)?);
            reference::conv_backward_data(&dy, dl.dims(), &w, wl.dims(), x, &reference_geometry(&self.params))
        };
        finish_cpu(OP, out, x, self.channels_last, ds.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, ds: &CudaStorage, dl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle conv_backward_data";
        self.check(OP, dl.dims(), wl.dims())?;
        same_dtype(OP, &[("dy", ds.dtype()), ("w", ws.dtype())])?;
        let stream = cuda::stream(ds);
        let dy = cuda::input(OP, "dy", ds, dl, &stream)?;
        let w = cuda::input(OP, "w", ws, wl, &stream)?;
        let x = &self.x_dims;
        let strides = super::packed_strides(x, self.channels_last);
        let out = cuda::with_output(OP, &ds.device, &stream, dy.dtype(), &idims(x), &strides, |dx| {
            crate::ops::conv_backward_data(&stream, &dy, &w, dx, &self.params)
        })?;
        Ok((out, physical_dims(x, self.channels_last).into()))
    }

    fn bwd(&self, dy: &Tensor, w: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // dx = D(dy, w) is linear in each argument: the adjoints are conv and wgrad.
        let g = logical(grad.clone(), self.channels_last)?;
        let d_dy = conv(&g, w, &self.params)?;
        let d_w = conv_backward_filter(&g, dy, w.dims(), &self.params, is_channels_last(w.layout()))?;
        Ok((Some(d_dy), Some(d_w)))
    }
}

/// `dw = conv_backward_filter(x, dy)`: the gradient of [`Conv`] with respect to w (cuDNN's
/// wgrad graph). Inputs: x, dy.
#[derive(Clone, Debug)]
pub struct ConvBackwardFilter {
    /// Geometry of the forward convolution.
    pub params: ConvParams,
    /// Logical dims of w (and so of dw).
    pub w_dims: Vec<usize>,
    /// Produce dw channels-last.
    pub channels_last: bool,
}

impl ConvBackwardFilter {
    fn check(&self, op: &'static str, x: &[usize], dy: &[usize]) -> Result<()> {
        let y = conv_out_dims(op, &self.params, x, &self.w_dims)?;
        if y != dy {
            return Err(arg_err(
                op,
                "dy",
                format!("x {x:?} convolves to {y:?}, but dy is {dy:?}"),
            ));
        }
        Ok(())
    }
}

impl CustomOp2 for ConvBackwardFilter {
    fn name(&self) -> &'static str {
        "cudnn-conv-backward-filter"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ds: &CpuStorage, dl: &Layout) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle conv_backward_filter";
        self.check(OP, xl.dims(), dl.dims())?;
        same_dtype(OP, &[("x", xs.dtype()), ("dy", ds.dtype())])?;
        let w = &self.w_dims;
        let out = if is_empty(w) || is_empty(xl.dims()) || is_empty(dl.dims()) {
            vec![0.0; w.iter().product()]
        } else {
            let (x, dy) = (cpu::read(OP, "x", xs, xl)?, cpu::read(OP, "dy", ds, dl)?);
            reference::conv_backward_filter(&x, xl.dims(), &dy, dl.dims(), w, &reference_geometry(&self.params))
        };
        finish_cpu(OP, out, w, self.channels_last, xs.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ds: &CudaStorage, dl: &Layout) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle conv_backward_filter";
        self.check(OP, xl.dims(), dl.dims())?;
        same_dtype(OP, &[("x", xs.dtype()), ("dy", ds.dtype())])?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let dy = cuda::input(OP, "dy", ds, dl, &stream)?;
        let w = &self.w_dims;
        let strides = super::packed_strides(w, self.channels_last);
        let out = cuda::with_output(OP, &xs.device, &stream, x.dtype(), &idims(w), &strides, |dw| {
            crate::ops::conv_backward_filter(&stream, &x, &dy, dw, &self.params)
        })?;
        Ok((out, physical_dims(w, self.channels_last).into()))
    }

    fn bwd(&self, x: &Tensor, dy: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // dw = W(x, dy) is linear in each argument: the adjoints are dgrad and conv.
        let g = logical(grad.clone(), self.channels_last)?;
        let d_x = conv_backward_data(dy, &g, x.dims(), &self.params)?;
        let d_dy = conv(x, &g, &self.params)?;
        Ok((Some(d_x), Some(d_dy)))
    }
}

/// `y = act(conv(x, w) + b)` as one fused cuDNN graph. Inputs: x, w, b (K elements).
#[derive(Clone, Debug)]
pub struct ConvBiasAct {
    /// Geometry and groups.
    pub params: ConvParams,
    /// Activation after the bias.
    pub act: Activation,
    /// Produce the output channels-last.
    pub channels_last: bool,
}

fn check_bias(op: &'static str, b: &[usize], k: usize) -> Result<()> {
    if b.iter().product::<usize>() != k || b.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(arg_err(
            op,
            "b",
            format!("needs {k} elements (one per filter), got dims {b:?}"),
        ));
    }
    Ok(())
}

impl CustomOp3 for ConvBiasAct {
    fn name(&self) -> &'static str {
        "cudnn-conv-bias-act"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "candle conv_bias_act";
        let y = conv_out_dims(OP, &self.params, xl.dims(), wl.dims())?;
        check_bias(OP, bl.dims(), wl.dims()[0])?;
        same_dtype(OP, &[("x", xs.dtype()), ("w", ws.dtype()), ("b", bs.dtype())])?;
        let mut out = if is_empty(&y) || is_empty(xl.dims()) || is_empty(wl.dims()) {
            vec![0.0; y.iter().product()]
        } else {
            let (x, w) = (cpu::read(OP, "x", xs, xl)?, cpu::read(OP, "w", ws, wl)?);
            reference::conv_forward(&x, xl.dims(), &w, wl.dims(), &reference_geometry(&self.params))
        };
        if !is_empty(&y) {
            let b = cpu::read(OP, "b", bs, bl)?;
            reference::bias_activation(&mut out, &y, 1, &b, ref_act(self.act));
        }
        finish_cpu(OP, out, &y, self.channels_last, xs.dtype())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        const OP: &str = "candle conv_bias_act";
        let y = conv_out_dims(OP, &self.params, xl.dims(), wl.dims())?;
        check_bias(OP, bl.dims(), wl.dims()[0])?;
        same_dtype(OP, &[("x", xs.dtype()), ("w", ws.dtype()), ("b", bs.dtype())])?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "x", xs, xl, &stream)?;
        let w = cuda::input(OP, "w", ws, wl, &stream)?;
        let b = cuda::input(OP, "b", bs, bl, &stream)?;
        let strides = super::packed_strides(&y, self.channels_last);
        let out = cuda::with_output(OP, &xs.device, &stream, x.dtype(), &idims(&y), &strides, |yr| {
            crate::ops::conv_bias_act_forward(&stream, &x, &w, &b, yr, &self.params, self.act)
        })?;
        Ok((out, physical_dims(&y, self.channels_last).into()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = logical(grad.clone(), self.channels_last)?;
        let y = logical(res.clone(), self.channels_last)?;
        let z = if grad_from_output(self.act, res.dtype()) {
            None
        } else {
            // The pre-activation again, bias fused into the convolution.
            Some(conv_bias_act(x, w, b, &self.params, Activation::Identity)?)
        };
        let dz = act_backward(self.act, &y, z.as_ref(), &g)?;
        let other: Vec<usize> = (0..dz.rank()).filter(|&d| d != 1).collect();
        let db = dz
            .to_dtype(acc_dtype(dz.dtype()))?
            .sum(other)?
            .to_dtype(b.dtype())?
            .reshape(b.shape())?;
        let dx = conv_backward_data(&dz, w, x.dims(), &self.params)?;
        let dw = conv_backward_filter(x, &dz, w.dims(), &self.params, is_channels_last(w.layout()))?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// `y = conv(x, w)` with autograd (N-d: x (N, C, spatial...), w (K, C/groups, window...)).
/// A channels-last x gives a channels-last y; unpacked layouts are copied once.
pub fn conv(x: &Tensor, w: &Tensor, p: &ConvParams) -> Result<Tensor> {
    conv_out_dims("conv", p, x.dims(), w.dims())?;
    let x = packed(x)?;
    let cl = is_channels_last(x.layout());
    let w = in_format(w, cl)?;
    let op = Conv {
        params: p.clone(),
        channels_last: cl,
    };
    logical(x.apply_op2(&w, op)?, cl)
}

/// `dx = conv_backward_data(dy, w)` with autograd; `x_dims` are the forward input's dims.
pub fn conv_backward_data(dy: &Tensor, w: &Tensor, x_dims: &[usize], p: &ConvParams) -> Result<Tensor> {
    let dy = packed(dy)?;
    let cl = is_channels_last(dy.layout());
    let w = in_format(w, cl)?;
    let op = ConvBackwardData {
        params: p.clone(),
        x_dims: x_dims.to_vec(),
        channels_last: cl,
    };
    op.check("conv_backward_data", dy.dims(), w.dims())?;
    logical(dy.apply_op2(&w, op)?, cl)
}

/// `dw = conv_backward_filter(x, dy)` with autograd; `w_dims` are the filter's dims and
/// `channels_last` the memory format of dw.
pub fn conv_backward_filter(
    x: &Tensor,
    dy: &Tensor,
    w_dims: &[usize],
    p: &ConvParams,
    channels_last: bool,
) -> Result<Tensor> {
    let x = packed(x)?;
    let dy = in_format(dy, is_channels_last(x.layout()))?;
    let op = ConvBackwardFilter {
        params: p.clone(),
        w_dims: w_dims.to_vec(),
        channels_last,
    };
    op.check("conv_backward_filter", x.dims(), dy.dims())?;
    logical(x.apply_op2(&dy, op)?, channels_last)
}

/// Transposed convolution with autograd (PyTorch's `conv_transposeNd`): x (N, Cin, in...),
/// w (Cin, Cout/groups, window...), output (N, Cout, out...) with
/// `out = (in - 1)·stride - pre - post + dilation·(window - 1) + output_padding + 1`.
/// It is the data gradient of the forward convolution from the output back to x.
pub fn conv_transpose(x: &Tensor, w: &Tensor, p: &ConvParams, output_padding: &[usize]) -> Result<Tensor> {
    const OP: &str = "conv_transpose";
    let s = p.stride.len();
    let (xd, wd) = (x.dims(), w.dims());
    if s == 0 || xd.len() != s + 2 || wd.len() != s + 2 || output_padding.len() != s {
        return Err(arg_err(
            OP,
            "x",
            format!("x {xd:?}, w {wd:?} and output_padding {output_padding:?} need {s} spatial dims"),
        ));
    }
    if xd[1] != wd[0] {
        return Err(arg_err(
            OP,
            "w",
            format!("x has {} channels but w {wd:?} expects {}", xd[1], wd[0]),
        ));
    }
    let mut out = vec![xd[0], wd[1] * p.groups.max(1) as usize];
    for i in 0..s {
        let (st, dil) = (p.stride[i], p.dilation[i]);
        if output_padding[i] as i64 >= st.max(dil) {
            return Err(arg_err(
                OP,
                "output_padding",
                format!("{output_padding:?} must be smaller than stride or dilation"),
            ));
        }
        let o = (xd[i + 2] as i64 - 1) * st - p.pre_padding[i] - p.post_padding[i]
            + dil * (wd[i + 2] as i64 - 1)
            + output_padding[i] as i64
            + 1;
        if o < 1 {
            return Err(arg_err(OP, "padding", format!("output size {o} in spatial dim {i}")));
        }
        out.push(o as usize);
    }
    conv_backward_data(x, w, &out, p)
}

/// `y = act(conv(x, w) + b)` with autograd, one fused cuDNN graph forward.
pub fn conv_bias_act(x: &Tensor, w: &Tensor, b: &Tensor, p: &ConvParams, act: Activation) -> Result<Tensor> {
    conv_out_dims("conv_bias_act", p, x.dims(), w.dims())?;
    check_bias("conv_bias_act", b.dims(), w.dims()[0])?;
    let (x, b) = (packed(x)?, packed(b)?);
    let cl = is_channels_last(x.layout());
    let w = in_format(w, cl)?;
    let op = ConvBiasAct {
        params: p.clone(),
        act,
        channels_last: cl,
    };
    logical(x.apply_op3(&w, &b, op)?, cl)
}
