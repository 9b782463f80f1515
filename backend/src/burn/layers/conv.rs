//! Convolutions (plain and transposed) and their backward passes as cuDNN graphs.

use super::*;
use crate::burn::tensor::CudnnTensor;
use crate::burn::{exec, layout};
use crate::ops::elementwise::BinaryOp;
use crate::ops::{self, Activation, ConvTransposeParams};
use crate::types::ConvGeometry;

/// `y = conv(x, w) (+ bias)`: one cuDNN graph (conv, or conv + bias add).
pub(crate) fn conv(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    bias: Option<CudnnTensor>,
    g: &ConvGeometry,
) -> Result<CudnnTensor> {
    match bias {
        Some(b) => conv_bias_act(op, x, w, b, g, Activation::Identity),
        None => {
            let (x, w, y) = conv_operands(op, x, w, g)?;
            ops::conv_forward(x.stream(), &x.tref(), &w.tref(), &y.tmut(), g)?;
            Ok(y)
        }
    }
}

/// The memory format of a convolution's operands: every operand channels-last when the
/// engine policy runs this convolution channels-last ([`layout::conv_channels_last`]),
/// else each as cuDNN takes it (row-major, or channels-last when already so) and new
/// results row-major.
#[derive(Clone, Copy)]
struct Format {
    channels_last: bool,
}

impl Format {
    /// The format of a convolution over input dims `x_dims` on `dtype`.
    fn of(x_dims: &[i64], dtype: DType, g: &ConvGeometry) -> Self {
        let policy = crate::plan::policy().conv_layout;
        Self {
            channels_last: layout::conv_channels_last(policy, x_dims, g.groups, dtype),
        }
    }

    /// `t` in this format (a view when it already is, else one copy).
    fn ready(self, t: CudnnTensor, op: &str) -> Result<CudnnTensor> {
        if self.channels_last {
            t.channels_last(op)
        } else {
            t.cudnn_ready()
        }
    }

    /// A new result of `dims` in this format on `like`'s device.
    fn empty(self, like: &CudnnTensor, dims: &[i64], op: &str) -> Result<CudnnTensor> {
        if self.channels_last {
            CudnnTensor::empty_channels_last(like.device(), dims, like.dtype, op)
        } else {
            like.empty_on(dims, like.dtype, op)
        }
    }
}

/// The input and filter as cuDNN takes them, and the output to write.
fn conv_operands(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    g: &ConvGeometry,
) -> Result<(CudnnTensor, CudnnTensor, CudnnTensor)> {
    require_cudnn_float(op, &x)?;
    check_pair(op, &x, &w)?;
    let f = Format::of(x.dims(), x.dtype, g);
    let (x, w) = (f.ready(x, op)?, f.ready(w, op)?);
    let dims = g.output_dims(x.dims(), w.dims())?;
    let y = f.empty(&x, &dims, op)?;
    Ok((x, w, y))
}

/// `y = act(conv(x, w) + bias)`: one cuDNN graph (conv, bias add, activation), or the conv +
/// bias graph and one bias/activation kernel where no engine takes the whole graph.
pub(crate) fn conv_bias_act(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    b: CudnnTensor,
    g: &ConvGeometry,
    act: Activation,
) -> Result<CudnnTensor> {
    let (x, w, y) = conv_operands(op, x, w, g)?;
    check_pair(op, &x, &b)?;
    let b = b.cudnn_ready()?;
    ops::conv_bias_act_forward(x.stream(), &x.tref(), &w.tref(), &b.tref(), &y.tmut(), g, act)?;
    Ok(y)
}

/// Gradient of [`conv`] with respect to its input (dims `x_dims`).
pub(crate) fn conv_x_backward(
    op: &'static str,
    x_dims: &[i64],
    w: CudnnTensor,
    dy: CudnnTensor,
    g: &ConvGeometry,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &dy)?;
    check_pair(op, &dy, &w)?;
    let f = Format::of(x_dims, dy.dtype, g);
    let (w, dy) = (f.ready(w, op)?, f.ready(dy, op)?);
    let dx = f.empty(&dy, x_dims, op)?;
    ops::conv_backward_data(dy.stream(), &dy.tref(), &w.tref(), &dx.tmut(), g)?;
    Ok(dx)
}

/// Gradient of [`conv`] with respect to its filter (dims `w_dims`).
pub(crate) fn conv_weight_backward(
    op: &'static str,
    x: CudnnTensor,
    w_dims: &[i64],
    dy: CudnnTensor,
    g: &ConvGeometry,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &x)?;
    check_pair(op, &x, &dy)?;
    let f = Format::of(x.dims(), x.dtype, g);
    let (x, dy) = (f.ready(x, op)?, f.ready(dy, op)?);
    let dw = f.empty(&dy, w_dims, op)?;
    ops::conv_backward_filter(x.stream(), &x.tref(), &dy.tref(), &dw.tmut(), g)?;
    Ok(dw)
}

/// Bias gradient of a (transposed) convolution: `dy [N, C, spatial..]` summed over every
/// dim but the channels, as `[C]`.
pub(crate) fn conv_bias_backward(op: &str, dy: CudnnTensor) -> Result<CudnnTensor> {
    let d = dy.dims().to_vec();
    if d.len() < 2 {
        return Err(Error::invalid_input(
            op,
            format!("output gradient {d:?} needs rank >= 2 ([N, C, ..])"),
        ));
    }
    let (n, c) = (d[0], d[1]);
    let s: i64 = d[2..].iter().product();
    let t = dy.reshape(&[n, c, s])?;
    let t = sum_axis(&t, 2, op)?;
    let t = if n == 1 { t } else { sum_axis(&t, 0, op)? };
    t.reshape(&[c])
}

/// Transposed convolution `x [N, C_in, in..]` by `w [C_in, C_out / groups, k..]`
/// (+ bias): the engine's `ops::conv_transpose_forward` (cuDNN's backward-data of the
/// convolution it transposes).
pub(crate) fn conv_transpose(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    bias: Option<CudnnTensor>,
    g: &ConvTransposeParams,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &x)?;
    check_pair(op, &x, &w)?;
    let (x, w) = (x.cudnn_ready()?, w.cudnn_ready()?);
    let (xd, wd) = (x.dims().to_vec(), w.dims().to_vec());
    if !(xd.len() == wd.len() && xd.len() >= 3) {
        return Err(Error::invalid_input(
            op,
            format!("input {xd:?} and weight {wd:?} need the same rank >= 3"),
        ));
    }
    let plan = g.plan(op, &xd[2..], &wd[2..])?;
    let mut dims = vec![xd[0], wd[1] * g.conv.groups];
    dims.extend(&plan.out);
    let y = x.empty_on(&dims, x.dtype, op)?;
    ops::conv_transpose_forward(x.stream(), &x.tref(), &w.tref(), None, &y.tmut(), g)?;
    match bias {
        Some(b) => {
            check_pair(op, &y, &b)?;
            let mut bd = vec![1i64; dims.len()];
            bd[1] = dims[1];
            let b = b.reshape(&bd)?;
            exec::binary(y, b, BinaryOp::Add, op)
        }
        None => Ok(y),
    }
}

/// Gradient of [`conv_transpose`] with respect to its input: the convolution of `dy`
/// (`ops::conv_transpose_backward_data`).
pub(crate) fn conv_transpose_x_backward(
    op: &'static str,
    w: CudnnTensor,
    dy: CudnnTensor,
    g: &ConvTransposeParams,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &dy)?;
    check_pair(op, &dy, &w)?;
    let (dd, wd) = (dy.dims().to_vec(), w.dims().to_vec());
    let mut dims = vec![dd[0], wd[0]];
    dims.extend(g.input_size(&dd[2..], &wd[2..]));
    let dx = dy.empty_on(&dims, dy.dtype, op)?;
    let (dy, w) = (dy.cudnn_ready()?, w.cudnn_ready()?);
    ops::conv_transpose_backward_data(dy.stream(), &dy.tref(), &w.tref(), &dx.tmut(), g)?;
    Ok(dx)
}

/// Gradient of [`conv_transpose`] with respect to its filter
/// (`ops::conv_transpose_backward_filter`).
pub(crate) fn conv_transpose_weight_backward(
    op: &'static str,
    x: CudnnTensor,
    w_dims: &[i64],
    dy: CudnnTensor,
    g: &ConvTransposeParams,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &x)?;
    check_pair(op, &x, &dy)?;
    let dw = x.empty_on(w_dims, x.dtype, op)?;
    let (x, dy) = (x.cudnn_ready()?, dy.cudnn_ready()?);
    ops::conv_transpose_backward_filter(x.stream(), &x.tref(), &dy.tref(), &dw.tmut(), g)?;
    Ok(dw)
}
