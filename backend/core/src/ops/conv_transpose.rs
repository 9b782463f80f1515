//! Transposed convolution (Burn's and PyTorch's `conv_transpose`, with `padding_out`) as
//! cuDNN's backward-data of the convolution it transposes, and its two gradients as that
//! convolution's forward and backward-filter.
//!
//! `padding_out` adds outputs after the last one the convolution reaches. While it is
//! smaller than the stride plus the padding, a post-padding of the convolution makes its
//! input size exactly the transposed output; past that, the trailing outputs receive no
//! contribution: they are zero (plus the bias), and cuDNN computes the leading `valid` part.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::fallback::bias_act_in_place;
use super::{conv_backward_data, conv_backward_filter, conv_forward, ConvParams, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::memory::DeviceBuffer;
use crate::kernels::elementwise::{copy, fill};
use crate::types::{row_major_strides, Activation, DataType};

/// Transposed-convolution geometry: the convolution it transposes (symmetric padding in
/// `conv.pre_padding`) and the extra outputs after each spatial dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvTransposeParams {
    /// The convolution this one transposes: padding (`pre_padding`; `post_padding` is
    /// ignored), stride, dilation, groups.
    pub conv: ConvParams,
    /// Extra size added after each spatial dim of the output (Burn's `padding_out`, PyTorch's
    /// `output_padding`).
    pub padding_out: Vec<i64>,
}

/// How a transposed convolution maps onto the convolution it transposes: that convolution's
/// params (a post-padding chosen so that its output has exactly the transposed conv's input
/// size), the output's spatial dims, and per dim the leading length that receives
/// contributions (`valid`; the rest is zero before the bias).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvTransposePlan {
    /// The convolution cuDNN runs (its backward-data is the transposed convolution).
    pub params: ConvParams,
    /// The output's spatial dims.
    pub out: Vec<i64>,
    /// The leading part of each spatial dim that cuDNN writes.
    pub valid: Vec<i64>,
}

impl ConvTransposePlan {
    /// Whether every output element receives a contribution (no zero tail).
    pub fn covers_output(&self) -> bool {
        self.valid == self.out
    }
}

impl ConvTransposeParams {
    /// The plan for input spatial dims `input` and kernel spatial dims `kernel`; errors when
    /// an output size is not positive.
    pub fn plan(&self, op: &'static str, input: &[i64], kernel: &[i64]) -> Result<ConvTransposePlan> {
        let n = input.len();
        if kernel.len() != n || self.padding_out.len() != n || self.conv.stride.len() != n {
            return Err(Error::invalid_arg(
                op,
                "params",
                format!(
                    "{n} spatial dims, kernel {kernel:?}, stride {:?}, padding_out {:?}",
                    self.conv.stride, self.padding_out
                ),
            ));
        }
        let (mut post, mut out, mut valid) = (vec![], vec![], vec![]);
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
                return Err(Error::invalid_arg(
                    op,
                    "params",
                    format!(
                        "the output size {o} of spatial dim {i} is not positive (input {l}, kernel {k}, \
                         stride {s}, padding {p}, padding_out {po}, dilation {d})"
                    ),
                ));
            }
            let (q, v) = if po < s {
                (p, o)
            } else if po - p < s {
                ((p - po).max(0), o)
            } else {
                (0, o - (po - p))
            };
            post.push(q);
            out.push(o);
            valid.push(v);
        }
        let params = ConvParams {
            post_padding: post,
            ..self.conv.clone()
        };
        Ok(ConvTransposePlan { params, out, valid })
    }

    /// The transposed convolution's input spatial dims for its output spatial dims `out`.
    pub fn input_size(&self, out: &[i64], kernel: &[i64]) -> Vec<i64> {
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

/// `t`'s dims with the spatial ones (from dim 2) replaced by `valid`.
fn with_spatial(t: &TensorRef, valid: &[i64]) -> Vec<i64> {
    let mut dims = t.dims().to_vec();
    dims[2..].copy_from_slice(valid);
    dims
}

/// A packed buffer of `dims` elements of `dtype` on `stream`.
fn packed_buffer(stream: &Arc<CudaStream>, op: &'static str, dims: &[i64], dtype: DataType) -> Result<DeviceBuffer> {
    DeviceBuffer::alloc(stream, dims.iter().product::<i64>() as usize * dtype.size(), op)
}

/// What a gradient of the transposed convolution reads of `dy`, for the plan of input
/// spatial dims `input` and kernel spatial dims `kernel`: the convolution's params and `dy`'s
/// valid part (the view itself when it covers `dy`, else a packed copy in `buf`: a strided
/// part of a tensor is not a layout every cuDNN engine takes); `None` when no output receives
/// a contribution, so the gradient is zero.
fn gradient_input<'b>(
    stream: &Arc<CudaStream>,
    op: &'static str,
    p: &ConvTransposeParams,
    (input, kernel): (&[i64], &[i64]),
    dy: &TensorRef<'b>,
    buf: &'b mut Option<DeviceBuffer>,
) -> Result<Option<(ConvParams, TensorRef<'b>)>> {
    let plan = p.plan(op, input, kernel)?;
    if plan.valid.iter().any(|&v| v <= 0) {
        return Ok(None);
    }
    if dy.dims()[2..] == *plan.valid {
        return Ok(Some((plan.params, dy.clone())));
    }
    let dims = with_spatial(dy, &plan.valid);
    let buf = buf.insert(packed_buffer(stream, op, &dims, dy.dtype())?);
    let packed = buf.view_mut(0, &dims, &row_major_strides(&dims), dy.dtype())?;
    copy(stream, &dy.view(0, &dims, dy.strides())?, &packed)?;
    Ok(Some((plan.params, (*packed).clone())))
}

/// Transposed convolution `y = conv_transpose(x, w) (+ bias)`: `x [N, C_in, in..]`,
/// `w [C_in, C_out / groups, k..]`, `bias [C_out]` (y's dtype, packed), `y [N, C_out, out..]`
/// packed with the output dims of [`ConvTransposeParams::plan`].
pub fn conv_transpose_forward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    w: &TensorRef,
    bias: Option<&TensorRef>,
    y: &TensorMut,
    p: &ConvTransposeParams,
) -> Result<()> {
    const OP: &str = "conv_transpose_forward";
    let (xd, wd) = (x.dims(), w.dims());
    if xd.len() != wd.len() || xd.len() < 3 {
        return Err(Error::invalid_arg(
            OP,
            "w",
            format!("input {xd:?} and weight {wd:?} need the same rank >= 3"),
        ));
    }
    let plan = p.plan(OP, &xd[2..], &wd[2..])?;
    let mut dims = vec![xd[0], wd[1] * p.conv.groups];
    dims.extend(&plan.out);
    if y.dims() != dims || !y.is_packed() {
        return Err(Error::invalid_arg(
            OP,
            "y",
            format!("{:?} / {:?}: need packed dims {dims:?}", y.dims(), y.strides()),
        ));
    }
    if plan.covers_output() {
        conv_backward_data(stream, x, w, y, &plan.params)?;
    } else {
        fill(stream, y, 0.0)?;
        if plan.valid.iter().all(|&v| v > 0) {
            // cuDNN writes a packed buffer of the valid part, copied into y's leading part.
            let vd = with_spatial(y, &plan.valid);
            let part = packed_buffer(stream, OP, &vd, y.dtype())?;
            let tmp = part.view_mut(0, &vd, &row_major_strides(&vd), y.dtype())?;
            conv_backward_data(stream, x, w, &tmp, &plan.params)?;
            copy(stream, &tmp, &y.view_mut(0, &vd, y.strides())?)?;
        }
    }
    match bias {
        Some(b) => bias_act_in_place(stream, OP, y, Some(b), 1, Activation::Identity),
        None => Ok(()),
    }
}

/// Gradient of [`conv_transpose_forward`] with respect to `x`: the convolution of `dy`'s
/// valid part by `w` into `dx` (`[N, C_in, in..]`).
pub fn conv_transpose_backward_data(
    stream: &Arc<CudaStream>,
    dy: &TensorRef,
    w: &TensorRef,
    dx: &TensorMut,
    p: &ConvTransposeParams,
) -> Result<()> {
    const OP: &str = "conv_transpose_backward_data";
    let mut buf = None;
    let input = gradient_input(stream, OP, p, (&dx.dims()[2..], &w.dims()[2..]), dy, &mut buf)?;
    match input {
        Some((params, dy)) => conv_forward(stream, &dy, w, dx, &params),
        None => fill(stream, dx, 0.0),
    }
}

/// Gradient of [`conv_transpose_forward`] with respect to `w`: cuDNN's backward-filter of
/// the transposed convolution with the roles of input and output gradient swapped, into
/// `dw` (`[C_in, C_out / groups, k..]`).
pub fn conv_transpose_backward_filter(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    dy: &TensorRef,
    dw: &TensorMut,
    p: &ConvTransposeParams,
) -> Result<()> {
    const OP: &str = "conv_transpose_backward_filter";
    let mut buf = None;
    let input = gradient_input(stream, OP, p, (&x.dims()[2..], &dw.dims()[2..]), dy, &mut buf)?;
    match input {
        Some((params, dy)) => conv_backward_filter(stream, &dy, x, dw, &params),
        None => fill(stream, dw, 0.0),
    }
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
                                let g = ConvTransposeParams {
                                    conv: ConvParams::new(&[p], &[s], &[d], 1),
                                    padding_out: vec![po],
                                };
                                if out <= 0 {
                                    assert!(g.plan("test", &[l], &[k]).is_err());
                                    continue;
                                }
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
                                assert_eq!(plan.covers_output(), plan.valid[0] == out);
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

    #[test]
    fn mismatched_ranks_are_errors() {
        let g = ConvTransposeParams {
            conv: ConvParams::new(&[1, 1], &[2, 2], &[1, 1], 1),
            padding_out: vec![0],
        };
        assert!(g.plan("test", &[4, 4], &[3, 3]).is_err());
    }
}
