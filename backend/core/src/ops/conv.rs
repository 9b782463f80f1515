//! Convolution forward, backward data, backward filter, and conv+bias+activation fused.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::conv_fallback::{cudnn_or_direct, verdict_key};
use super::fallback::bias_act_in_place;
use super::{check_on_stream_device, run, zero_fill, Activation, ConvParams, OpKey, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::graph::{ConvAttrs, Graph, PointwiseMode};
use crate::kernels;

/// The graph attributes of a cross-correlation with geometry `p`.
fn attrs(p: &ConvParams) -> ConvAttrs {
    ConvAttrs::cross_correlation(p.clone())
}

fn channels(t: &TensorRef, i: usize) -> i64 {
    t.dims.get(i).copied().unwrap_or(0)
}

fn key(op: &'static str, tensors: &[&TensorRef], p: &ConvParams) -> OpKey {
    let mut k = OpKey::new(op);
    for t in tensors {
        k.tensor(t);
    }
    k.ints(&p.pre_padding)
        .ints(&p.post_padding)
        .ints(&p.stride)
        .ints(&p.dilation);
    k
}

/// `y = conv(x, w)` (cross-correlation, as frameworks define convolution).
pub fn conv_forward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    w: &TensorRef,
    y: &TensorMut,
    p: &ConvParams,
) -> Result<()> {
    const OP: &str = "conv_forward";
    x.check(OP, "x")?;
    w.check(OP, "w")?;
    y.check(OP, "y")?;
    p.check(OP, channels(x, 1), channels(w, 1))?;
    check_on_stream_device(stream, OP, &[("x", Some(x)), ("w", Some(w)), ("y", Some(y))])?;
    if y.is_empty() {
        return Ok(());
    }
    if x.is_empty() || w.is_empty() {
        return zero_fill(stream, y);
    }
    let build = || {
        let mut g = Graph::new();
        let (xi, wi) = (x.add_input(&mut g, "x"), w.add_input(&mut g, "w"));
        let yi = g.conv_fprop(xi, wi, attrs(p));
        y.bind_output(&mut g, yi);
        g
    };
    let k = key(OP, &[x, w, y], p);
    cudnn_or_direct(
        stream,
        OP,
        verdict_key(&k),
        p.groups,
        y,
        || run(stream, OP, k, &[(1, x.ptr), (2, w.ptr), (3, y.ptr)], &build),
        |out| kernels::conv::conv_forward(stream, x, w, out, p),
    )
}

/// `dx = conv_backward_data(dy, w)`: the gradient of `conv_forward` with respect to x.
pub fn conv_backward_data(
    stream: &Arc<CudaStream>,
    dy: &TensorRef,
    w: &TensorRef,
    dx: &TensorMut,
    p: &ConvParams,
) -> Result<()> {
    const OP: &str = "conv_backward_data";
    dy.check(OP, "dy")?;
    w.check(OP, "w")?;
    dx.check(OP, "dx")?;
    p.check(OP, channels(dx, 1), channels(w, 1))?;
    check_on_stream_device(stream, OP, &[("dy", Some(dy)), ("w", Some(w)), ("dx", Some(dx))])?;
    if dx.is_empty() {
        return Ok(());
    }
    if dy.is_empty() || w.is_empty() {
        return zero_fill(stream, dx);
    }
    let build = || {
        let mut g = Graph::new();
        let (dyi, wi) = (dy.add_input(&mut g, "dy"), w.add_input(&mut g, "w"));
        let dxi = g.conv_dgrad(dyi, wi, &dx.dims, attrs(p));
        dx.bind_output(&mut g, dxi);
        g
    };
    let k = key(OP, &[dy, w, dx], p);
    cudnn_or_direct(
        stream,
        OP,
        verdict_key(&k),
        p.groups,
        dx,
        || run(stream, OP, k, &[(1, dy.ptr), (2, w.ptr), (3, dx.ptr)], &build),
        |out| kernels::conv::conv_backward_data(stream, dy, w, out, p),
    )
}

/// `dw = conv_backward_filter(x, dy)`: the gradient of `conv_forward` with respect to w.
pub fn conv_backward_filter(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    dy: &TensorRef,
    dw: &TensorMut,
    p: &ConvParams,
) -> Result<()> {
    const OP: &str = "conv_backward_filter";
    x.check(OP, "x")?;
    dy.check(OP, "dy")?;
    dw.check(OP, "dw")?;
    p.check(OP, channels(x, 1), channels(dw, 1))?;
    check_on_stream_device(stream, OP, &[("x", Some(x)), ("dy", Some(dy)), ("dw", Some(dw))])?;
    if dw.is_empty() {
        return Ok(());
    }
    if x.is_empty() || dy.is_empty() {
        return zero_fill(stream, dw);
    }
    let build = || {
        let mut g = Graph::new();
        let (xi, dyi) = (x.add_input(&mut g, "x"), dy.add_input(&mut g, "dy"));
        let dwi = g.conv_wgrad(xi, dyi, &dw.dims, attrs(p));
        dw.bind_output(&mut g, dwi);
        g
    };
    let k = key(OP, &[x, dy, dw], p);
    cudnn_or_direct(
        stream,
        OP,
        verdict_key(&k),
        p.groups,
        dw,
        || run(stream, OP, k, &[(1, x.ptr), (2, dy.ptr), (3, dw.ptr)], &build),
        |out| kernels::conv::conv_backward_filter(stream, x, dy, out, p),
    )
}

/// `y = act(conv(x, w) + bias)` as ONE cuDNN graph (conv → bias add → activation, with
/// f32 intermediates). `bias` holds K elements (dims `[K]` or `[1, K, 1, ...]`). When no
/// engine supports the fused graph (e.g. some f32 layouts), falls back to the conv graph
/// followed by one bias+activation kernel.
///
/// ```no_run
/// use cudnn_backend_core::ops::{self, Activation, ConvParams, TensorMut, TensorRef};
/// use cudnn_backend_core::Device;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let device = Device::new(0)?;
/// let stream = device.stream();
/// let x = stream.clone_htod(&vec![0.5f32; 8 * 32 * 28 * 28])?;
/// let w = stream.clone_htod(&vec![0.1f32; 64 * 32 * 3 * 3])?;
/// let b = stream.clone_htod(&vec![0.0f32; 64])?;
/// let mut y = stream.alloc_zeros::<f32>(8 * 64 * 28 * 28)?;
/// {
///     // Checked views: each holds every element of its dims.
///     let xt = TensorRef::packed(&x, stream, &[8, 32, 28, 28])?;
///     let wt = TensorRef::packed(&w, stream, &[64, 32, 3, 3])?;
///     let bt = TensorRef::packed(&b, stream, &[64])?;
///     let yt = TensorMut::packed(&mut y, stream, &[8, 64, 28, 28])?;
///     // Padding 1, stride 1, dilation 1, one group: a "same" 3x3 convolution.
///     let params = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
///     ops::conv_bias_act_forward(stream, &xt, &wt, &bt, &yt, &params, Activation::Relu)?;
/// }
/// let y = stream.clone_dtoh(&y)?;
/// # Ok(())
/// # }
/// ```
pub fn conv_bias_act_forward(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    w: &TensorRef,
    bias: &TensorRef,
    y: &TensorMut,
    p: &ConvParams,
    act: Activation,
) -> Result<()> {
    const OP: &str = "conv_bias_act_forward";
    x.check(OP, "x")?;
    w.check(OP, "w")?;
    bias.check(OP, "bias")?;
    y.check(OP, "y")?;
    p.check(OP, channels(x, 1), channels(w, 1))?;
    let operands = [("x", Some(x)), ("w", Some(w)), ("bias", Some(bias)), ("y", Some(y))];
    check_on_stream_device(stream, OP, &operands)?;
    let k = channels(w, 0);
    if bias.numel() != k || bias.dims.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(Error::invalid_arg(
            OP,
            "bias",
            format!("needs {k} elements (one per filter), got dims {:?}", bias.dims),
        ));
    }
    if bias.dtype != y.dtype {
        return Err(Error::invalid_arg(
            OP,
            "bias",
            format!("dtype {:?} differs from y's {:?}", bias.dtype, y.dtype),
        ));
    }
    if y.is_empty() {
        return Ok(());
    }
    if act == Activation::Tanh {
        // cuDNN's fused tanh (9.14 and 9.19) returns NaN once |x| passes ~44: fuse conv +
        // bias, then apply tanh with our kernel.
        conv_bias_act_forward(stream, x, w, bias, y, p, Activation::Identity)?;
        return super::fallback::tanh_in_place(stream, y);
    }
    // Bias as [1, K, 1, ...] matching y's rank.
    let rank = y.dims.len();
    let mut bdims = vec![1i64; rank];
    bdims[1] = k;
    let bstride = bias.strides[bias.dims.iter().position(|&d| d == k).unwrap_or(0)].max(1);
    let mut bstrides = vec![k * bstride; rank];
    bstrides[1] = bstride;
    let b4 = bias.reshaped(&bdims, &bstrides)?;
    if x.is_empty() || w.is_empty() {
        zero_fill(stream, y)?;
        return bias_act_in_place(stream, OP, y, Some(&b4), 1, act);
    }
    let build = || {
        let mut g = Graph::new();
        let (xi, wi, bi) = (
            x.add_input(&mut g, "x"),
            w.add_input(&mut g, "w"),
            b4.add_input(&mut g, "bias"),
        );
        let conv = g.conv_fprop(xi, wi, attrs(p));
        let biased = g.bias_add(conv, bi);
        let out = match PointwiseMode::of_activation(act) {
            Some(m) => g.pointwise(m, biased, None),
            None => biased,
        };
        y.bind_output(&mut g, out);
        g
    };
    let y_uid = if PointwiseMode::of_activation(act).is_some() {
        6
    } else {
        5
    };
    let mut k = key(OP, &[x, w, &b4, y], p);
    k.act(act);
    let io = [(1, x.ptr), (2, w.ptr), (3, bias.ptr), (y_uid, y.ptr)];
    // Under GRAPH_JIT_ONLY the fused result is checked against the direct kernel followed by
    // the bias/activation kernel (see `conv_fallback`).
    let id = verdict_key(&k);
    let fused = || match run(stream, OP, k, &io, &build) {
        Err(e) if e.is_not_supported() => {
            tracing::debug!("{OP}: fused graph unsupported ({e}); running conv + bias/activation kernel");
            conv_forward(stream, x, w, y, p)?;
            bias_act_in_place(stream, OP, y, Some(&b4), 1, act)
        }
        other => other,
    };
    let direct = |out: &TensorMut| {
        kernels::conv::conv_forward(stream, x, w, out, p)?;
        bias_act_in_place(stream, OP, out, Some(&b4), 1, act)
    };
    cudnn_or_direct(stream, OP, id, p.groups, y, fused, direct)
}
