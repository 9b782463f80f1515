//! Convolutions (plain and transposed) and their backward passes as cuDNN graphs.

use super::*;
use crate::burn::tensor::CudnnTensor;
use crate::burn::{exec, layout};
use crate::ops::elementwise::BinaryOp;
use crate::ops::{self, Activation, ConvParams};
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

/// Transposed-convolution geometry in Burn's terms.
#[derive(Clone, Debug)]
pub(crate) struct ConvTransposeGeom {
    /// The geometry of the convolution this one transposes (symmetric padding).
    pub conv: ConvGeometry,
    /// Extra size added to one side of each spatial dim of the output.
    pub padding_out: Vec<i64>,
}

/// How a transposed convolution maps onto the cuDNN convolution it transposes: the
/// convolution's params (pre-padding `padding`, a post-padding chosen so that its output
/// has exactly the transposed conv's input size) and, per spatial dim, the length of the
/// transposed conv's output that receives contributions (`valid`; the rest, possible when
/// `padding_out >= stride + padding`, is zero before the bias).
struct TransposePlan {
    params: ConvParams,
    out: Vec<i64>,
    valid: Vec<i64>,
}

impl ConvTransposeGeom {
    /// Plans for input spatial dims `input` and kernel spatial dims `kernel`.
    fn plan(&self, op: &str, input: &[i64], kernel: &[i64]) -> Result<TransposePlan> {
        let n = input.len();
        let (mut pre, mut post, mut out, mut valid) = (vec![], vec![], vec![], vec![]);
        for i in 0..n {
            let (s, p, po, d) = (
                self.conv.stride[i],
                self.conv.pre_padding[i],
                self.padding_out[i],
                self.conv.dilation[i],
            );
            let (l, k) = (input[i], kernel[i]);
            let o = (l - 1) * s + d * (k - 1) + 1 + po - 2 * p;
            if o <= 0 {
                return Err(Error::invalid_input(op, format!("the output size {o} of spatial dim {i} is not positive (input {l}, kernel {k}, stride {s}, padding {p}, padding_out {po}, dilation {d})")));
            }
            let (q, v) = if po < s {
                (p, o)
            } else if po - p < s {
                ((p - po).max(0), o)
            } else {
                (0, o - (po - p))
            };
            pre.push(p);
            post.push(q);
            out.push(o);
            valid.push(v);
        }
        let params = ConvParams {
            pre_padding: pre,
            post_padding: post,
            ..self.conv.clone()
        };
        Ok(TransposePlan { params, out, valid })
    }

    /// The transposed conv's input spatial dims for its output spatial dims `out`.
    fn input_size(&self, out: &[i64], kernel: &[i64]) -> Vec<i64> {
        (0..out.len())
            .map(|i| {
                let (s, p, po, d) = (
                    self.conv.stride[i],
                    self.conv.pre_padding[i],
                    self.padding_out[i],
                    self.conv.dilation[i],
                );
                (out[i] + 2 * p - po - d * (kernel[i] - 1) - 1) / s + 1
            })
            .collect()
    }
}

/// Restricts the spatial dims (from dim 2) of `t` to `valid` (a view).
fn spatial_prefix(t: &CudnnTensor, valid: &[i64], op: &str) -> Result<CudnnTensor> {
    let mut t = t.clone();
    for (i, &v) in valid.iter().enumerate() {
        if t.dims()[i + 2] != v {
            t = narrow(&t, op, i + 2, 0, v)?;
        }
    }
    Ok(t)
}

/// Transposed convolution `x [N, C_in, in..]` by `w [C_in, C_out / groups, k..]`
/// (+ bias): cuDNN's backward-data of the convolution it transposes.
pub(crate) fn conv_transpose(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    bias: Option<CudnnTensor>,
    g: &ConvTransposeGeom,
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
    if plan.valid == plan.out {
        ops::conv_backward_data(x.stream(), &x.tref(), &w.tref(), &y.tmut(), &plan.params)?;
    } else {
        fill(&y, 0.0, op)?;
        if plan.valid.iter().all(|&v| v > 0) {
            let mut vd = dims[..2].to_vec();
            vd.extend(&plan.valid);
            let tmp = x.empty_on(&vd, x.dtype, op)?;
            ops::conv_backward_data(x.stream(), &x.tref(), &w.tref(), &tmp.tmut(), &plan.params)?;
            exec::copy_into(&tmp, &spatial_prefix(&y, &plan.valid, op)?, op)?;
        }
    }
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

/// Gradient of [`conv_transpose`] with respect to its input: the convolution of `dy`.
pub(crate) fn conv_transpose_x_backward(
    op: &'static str,
    w: CudnnTensor,
    dy: CudnnTensor,
    g: &ConvTransposeGeom,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &dy)?;
    check_pair(op, &dy, &w)?;
    let (dd, wd) = (dy.dims().to_vec(), w.dims().to_vec());
    let input = g.input_size(&dd[2..], &wd[2..]);
    let plan = g.plan(op, &input, &wd[2..])?;
    let mut dims = vec![dd[0], wd[0]];
    dims.extend(&input);
    let dx = dy.empty_on(&dims, dy.dtype, op)?;
    if plan.valid.iter().any(|&v| v <= 0) {
        fill(&dx, 0.0, op)?;
        return Ok(dx);
    }
    let dy = spatial_prefix(&dy, &plan.valid, op)?.cudnn_ready()?;
    let w = w.cudnn_ready()?;
    ops::conv_forward(dy.stream(), &dy.tref(), &w.tref(), &dx.tmut(), &plan.params)?;
    Ok(dx)
}

/// Gradient of [`conv_transpose`] with respect to its filter: cuDNN's backward-filter of
/// the transposed convolution with the roles of input and output gradient swapped.
pub(crate) fn conv_transpose_weight_backward(
    op: &'static str,
    x: CudnnTensor,
    w_dims: &[i64],
    dy: CudnnTensor,
    g: &ConvTransposeGeom,
) -> Result<CudnnTensor> {
    require_cudnn_float(op, &x)?;
    check_pair(op, &x, &dy)?;
    let xd = x.dims().to_vec();
    let plan = g.plan(op, &xd[2..], &w_dims[2..])?;
    let dw = x.empty_on(w_dims, x.dtype, op)?;
    if plan.valid.iter().any(|&v| v <= 0) {
        fill(&dw, 0.0, op)?;
        return Ok(dw);
    }
    let dy = spatial_prefix(&dy, &plan.valid, op)?.cudnn_ready()?;
    let x = x.cudnn_ready()?;
    ops::conv_backward_filter(x.stream(), &dy.tref(), &x.tref(), &dw.tmut(), &plan.params)?;
    Ok(dw)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transposed 1-D convolution by its definition: `y[i·s + k·d - p] += x[i] w[k]`.
    fn transpose_reference(x: &[i64], w: &[i64], s: i64, p: i64, d: i64, out: i64) -> Vec<i64> {
        let mut y = vec![0; out as usize];
        for (i, &xv) in x.iter().enumerate() {
            for (k, &wv) in w.iter().enumerate() {
                let o = i as i64 * s + k as i64 * d - p;
                if (0..out).contains(&o) {
                    y[o as usize] += xv * wv;
                }
            }
        }
        y
    }

    /// What the planned cuDNN call computes: the adjoint (backward data) of a convolution
    /// of a `valid`-long input with the planned pre/post padding, zero-extended to `out`.
    fn planned(x: &[i64], w: &[i64], s: i64, d: i64, (pre, post, valid): (i64, i64, i64), out: i64) -> Vec<i64> {
        let k = w.len() as i64;
        let windows = (valid + pre + post - d * (k - 1) - 1).div_euclid(s) + 1;
        assert_eq!(windows, x.len() as i64, "the convolution must map back onto the input");
        let mut y = vec![0; out as usize];
        for (i, &xv) in x.iter().enumerate() {
            for (kk, &wv) in w.iter().enumerate() {
                let o = i as i64 * s + kk as i64 * d - pre;
                if (0..valid).contains(&o) {
                    y[o as usize] += xv * wv;
                }
            }
        }
        y
    }

    #[test]
    fn transposed_conv_plans_match_the_definition() {
        let mut checked = 0;
        for l in 1..5i64 {
            for k in 1..4i64 {
                for s in 1..4i64 {
                    for d in 1..4i64 {
                        for p in 0..4i64 {
                            // Burn allows padding_out < max(stride, dilation).
                            for po in 0..s.max(d) {
                                let out = (l - 1) * s + d * (k - 1) + 1 + po - 2 * p;
                                if out <= 0 {
                                    continue;
                                }
                                let g = ConvTransposeGeom {
                                    conv: ConvGeometry::new(&[p], &[s], &[d], 1),
                                    padding_out: vec![po],
                                };
                                let plan = g.plan("test", &[l], &[k]).unwrap();
                                assert_eq!(plan.out, vec![out]);
                                assert_eq!(g.input_size(&[out], &[k]), vec![l]);
                                let x: Vec<i64> = (0..l).map(|i| 3 * i + 1).collect();
                                let w: Vec<i64> = (0..k).map(|i| 7 - 2 * i).collect();
                                let (pre, post) = (plan.params.pre_padding[0], plan.params.post_padding[0]);
                                assert!(pre >= 0 && post >= 0);
                                if plan.valid[0] <= 0 {
                                    assert!(transpose_reference(&x, &w, s, p, d, out).iter().all(|&v| v == 0));
                                    continue;
                                }
                                assert_eq!(
                                    planned(&x, &w, s, d, (pre, post, plan.valid[0]), out),
                                    transpose_reference(&x, &w, s, p, d, out),
                                    "l={l} k={k} s={s} d={d} p={p} po={po}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 500, "{checked}");
    }
}
