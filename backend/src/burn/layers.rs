//! Neural-network building blocks behind `ModuleOps` and `ActivationOps`: convolutions
//! (plain and transposed, with their backward passes) and linear layers as cuDNN graphs,
//! pooling, interpolation, embeddings and im2col through the NVRTC kernels, and small
//! device-side helpers (arange, views, fills) shared by the deformable convolution and
//! the DFT.
//!
//! Every function enqueues on the tensors' device stream and never waits. Results are
//! fresh packed row-major tensors (or views of them); inputs may be any strided view.

mod deform;
mod fft;
mod lanczos;
mod transformer;

pub(crate) use deform::{deform_conv2d, deform_conv2d_backward};
pub(crate) use fft::{irfft, rfft};
pub(crate) use transformer::{attention, causal_bias, layer_norm};

use std::sync::Arc;

use burn_backend::DType;

use super::exec;
use super::tensor::{expect, CudnnTensor};
use crate::kernels::elementwise::{self as ew, BinaryOp, UnaryOp};
use crate::kernels::index as kindex;
use crate::kernels::pool::{self as kpool, Pool2d};
use crate::kernels::reduce::{self as kreduce, ReduceOp, ScanOp};
use crate::kernels::resize::{self as kresize, InterpolateMode as KMode};
use crate::ops::{self, Activation, ConvParams, PoolMode, PoolParams};
use crate::runtime;
use crate::view::ViewLayout;

// ---------------------------------------------------------------------------------------
// Small shared helpers

/// Panics unless `t` holds a float dtype cuDNN computes in (F32, Flex32, F16, BF16).
pub(crate) fn require_cudnn_float(op: &str, t: &CudnnTensor) {
    match t.dtype {
        DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {}
        DType::F64 => panic!("cudnn-backend: {op}: F64 is not supported by cuDNN; cast the tensors to F32 first"),
        other => panic!("cudnn-backend: {op}: dtype {other:?} is not a float dtype (F32, F16 or BF16 expected)"),
    }
}

/// Panics unless `t` holds a float dtype the pooling/resize kernels take (F32, Flex32,
/// F16, BF16, F64).
pub(crate) fn require_float(op: &str, t: &CudnnTensor) {
    match t.dtype {
        DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 | DType::F64 => {}
        other => panic!("cudnn-backend: {op}: dtype {other:?} is not a float dtype (F32, F16, BF16 or F64 expected)"),
    }
}

/// Panics unless both tensors are on one device and share a dtype.
fn check_pair(op: &str, a: &CudnnTensor, b: &CudnnTensor) {
    exec::check_same_device(op, a, b);
    exec::check_same_dtype(op, a, b);
}

/// A view of `t` built by `f` from its layout (panics naming `op` on an invalid view).
pub(crate) fn view(
    t: &CudnnTensor,
    op: &str,
    f: impl FnOnce(&ViewLayout) -> crate::error::Result<ViewLayout>,
) -> CudnnTensor {
    t.with_layout(expect(op, f(&t.layout)))
}

/// `t[.., start..end, ..]` along `axis` (a view).
pub(crate) fn narrow(t: &CudnnTensor, op: &str, axis: usize, start: i64, end: i64) -> CudnnTensor {
    view(t, op, |l| l.slice(axis, start, end, 1))
}

/// Fills the (possibly strided) view `t` with `value`.
pub(crate) fn fill(t: &CudnnTensor, value: f64, op: &str) {
    if t.numel() > 0 {
        expect(op, ew::fill(t.stream(), &t.tmut(), value));
    }
}

/// `0, 1, .., n - 1` as a 1-D tensor of `dtype`, built on the device (a running sum of
/// ones in I64, cast when `dtype` differs).
pub(crate) fn arange(device: &Arc<runtime::Device>, n: i64, dtype: DType, op: &str) -> CudnnTensor {
    let ones = exec::full(device, &[n], DType::I64, 1.0, op);
    let out = CudnnTensor::empty(device, &[n], DType::I64, op);
    if n > 0 {
        expect(
            op,
            kreduce::scan(device.stream(), ScanOp::CumSum, &ones.tref(), 0, &out.tmut()),
        );
    }
    let out = exec::unary(out, UnaryOp::AddScalar(-1.0), op);
    exec::cast(out, dtype, op)
}

/// Writes `op(a, b)` (broadcast) into the existing view `out`.
pub(crate) fn binary_into(a: &CudnnTensor, b: &CudnnTensor, op: BinaryOp, out: &CudnnTensor, name: &str) {
    expect(name, ew::binary(out.stream(), op, &a.tref(), &b.tref(), &out.tmut()));
}

/// Sum of `t` over `axis`, keeping it with size 1.
pub(crate) fn sum_axis(t: &CudnnTensor, axis: usize, op: &str) -> CudnnTensor {
    let mut dims = t.dims().to_vec();
    dims[axis] = 1;
    let out = t.empty_on(&dims, t.dtype, op);
    expect(
        op,
        kreduce::reduce(t.stream(), ReduceOp::Sum, &t.tref(), axis, &out.tmut()),
    );
    out
}

/// Sums into the existing view `out` (dims of `t` with `dims[axis] = 1`).
pub(crate) fn sum_axis_into(t: &CudnnTensor, axis: usize, out: &CudnnTensor, op: &str) {
    expect(
        op,
        kreduce::reduce(t.stream(), ReduceOp::Sum, &t.tref(), axis, &out.tmut()),
    );
}

/// The dtype intermediate results of a composed op are kept in: F32 for half types.
pub(crate) fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 | DType::Flex32 => DType::F32,
        d => d,
    }
}

// ---------------------------------------------------------------------------------------
// Convolutions

/// Convolution geometry in Burn's terms (one entry per spatial dim).
#[derive(Clone, Debug)]
pub(crate) struct ConvGeom {
    pub stride: Vec<usize>,
    pub padding: Vec<usize>,
    pub dilation: Vec<usize>,
    pub groups: usize,
}

impl ConvGeom {
    fn params(&self) -> ConvParams {
        let v = |s: &[usize]| s.iter().map(|&x| x as i64).collect::<Vec<_>>();
        ConvParams::new(
            &v(&self.padding),
            &v(&self.stride),
            &v(&self.dilation),
            self.groups as i64,
        )
    }
}

/// `y = conv(x, w) (+ bias)`: one cuDNN graph (conv, or conv + bias add).
pub(crate) fn conv(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    bias: Option<CudnnTensor>,
    g: &ConvGeom,
) -> CudnnTensor {
    require_cudnn_float(op, &x);
    check_pair(op, &x, &w);
    let p = g.params();
    let (x, w) = (x.cudnn_ready(), w.cudnn_ready());
    let dims = expect(op, p.output_dims(x.dims(), w.dims()));
    let y = x.empty_on(&dims, x.dtype, op);
    match bias {
        Some(b) => {
            check_pair(op, &x, &b);
            let b = b.cudnn_ready();
            expect(
                op,
                ops::conv_bias_act_forward(
                    x.stream(),
                    &x.tref(),
                    &w.tref(),
                    &b.tref(),
                    &y.tmut(),
                    &p,
                    Activation::Identity,
                ),
            );
        }
        None => expect(op, ops::conv_forward(x.stream(), &x.tref(), &w.tref(), &y.tmut(), &p)),
    }
    y
}

/// Gradient of [`conv`] with respect to its input (dims `x_dims`).
pub(crate) fn conv_x_backward(
    op: &'static str,
    x_dims: &[i64],
    w: CudnnTensor,
    dy: CudnnTensor,
    g: &ConvGeom,
) -> CudnnTensor {
    require_cudnn_float(op, &dy);
    check_pair(op, &dy, &w);
    let (w, dy) = (w.cudnn_ready(), dy.cudnn_ready());
    let dx = dy.empty_on(x_dims, dy.dtype, op);
    expect(
        op,
        ops::conv_backward_data(dy.stream(), &dy.tref(), &w.tref(), &dx.tmut(), &g.params()),
    );
    dx
}

/// Gradient of [`conv`] with respect to its filter (dims `w_dims`).
pub(crate) fn conv_weight_backward(
    op: &'static str,
    x: CudnnTensor,
    w_dims: &[i64],
    dy: CudnnTensor,
    g: &ConvGeom,
) -> CudnnTensor {
    require_cudnn_float(op, &x);
    check_pair(op, &x, &dy);
    let (x, dy) = (x.cudnn_ready(), dy.cudnn_ready());
    let dw = dy.empty_on(w_dims, dy.dtype, op);
    expect(
        op,
        ops::conv_backward_filter(x.stream(), &x.tref(), &dy.tref(), &dw.tmut(), &g.params()),
    );
    dw
}

/// Bias gradient of a (transposed) convolution: `dy [N, C, spatial..]` summed over every
/// dim but the channels, as `[C]`.
pub(crate) fn conv_bias_backward(op: &str, dy: CudnnTensor) -> CudnnTensor {
    let d = dy.dims().to_vec();
    assert!(
        d.len() >= 2,
        "cudnn-backend: {op}: output gradient {d:?} needs rank >= 2 ([N, C, ..])"
    );
    let (n, c) = (d[0], d[1]);
    let s: i64 = d[2..].iter().product();
    let t = dy.reshape(&[n, c, s]);
    let t = sum_axis(&t, 2, op);
    let t = if n == 1 { t } else { sum_axis(&t, 0, op) };
    t.reshape(&[c])
}

/// Transposed-convolution geometry in Burn's terms.
#[derive(Clone, Debug)]
pub(crate) struct ConvTransposeGeom {
    pub stride: Vec<usize>,
    pub padding: Vec<usize>,
    pub padding_out: Vec<usize>,
    pub dilation: Vec<usize>,
    pub groups: usize,
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
    fn plan(&self, op: &str, input: &[i64], kernel: &[i64]) -> TransposePlan {
        let n = input.len();
        let (mut pre, mut post, mut out, mut valid) = (vec![], vec![], vec![], vec![]);
        for i in 0..n {
            let (s, p, po, d) = (
                self.stride[i] as i64,
                self.padding[i] as i64,
                self.padding_out[i] as i64,
                self.dilation[i] as i64,
            );
            let (l, k) = (input[i], kernel[i]);
            let o = (l - 1) * s + d * (k - 1) + 1 + po - 2 * p;
            assert!(
                o > 0,
                "cudnn-backend: {op}: the output size {o} of spatial dim {i} is not positive (input {l}, kernel {k}, \
                 stride {s}, padding {p}, padding_out {po}, dilation {d})"
            );
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
        let v = |s: &[usize]| s.iter().map(|&x| x as i64).collect::<Vec<_>>();
        let params =
            ConvParams::new(&pre, &v(&self.stride), &v(&self.dilation), self.groups as i64).with_post_padding(&post);
        TransposePlan { params, out, valid }
    }

    /// The transposed conv's input spatial dims for its output spatial dims `out`.
    fn input_size(&self, out: &[i64], kernel: &[i64]) -> Vec<i64> {
        (0..out.len())
            .map(|i| {
                let (s, p, po, d) = (
                    self.stride[i] as i64,
                    self.padding[i] as i64,
                    self.padding_out[i] as i64,
                    self.dilation[i] as i64,
                );
                (out[i] + 2 * p - po - d * (kernel[i] - 1) - 1) / s + 1
            })
            .collect()
    }
}

/// Restricts the spatial dims (from dim 2) of `t` to `valid` (a view).
fn spatial_prefix(t: &CudnnTensor, valid: &[i64], op: &str) -> CudnnTensor {
    let mut t = t.clone();
    for (i, &v) in valid.iter().enumerate() {
        if t.dims()[i + 2] != v {
            t = narrow(&t, op, i + 2, 0, v);
        }
    }
    t
}

/// Transposed convolution `x [N, C_in, in..]` by `w [C_in, C_out / groups, k..]`
/// (+ bias): cuDNN's backward-data of the convolution it transposes.
pub(crate) fn conv_transpose(
    op: &'static str,
    x: CudnnTensor,
    w: CudnnTensor,
    bias: Option<CudnnTensor>,
    g: &ConvTransposeGeom,
) -> CudnnTensor {
    require_cudnn_float(op, &x);
    check_pair(op, &x, &w);
    let (x, w) = (x.cudnn_ready(), w.cudnn_ready());
    let (xd, wd) = (x.dims().to_vec(), w.dims().to_vec());
    assert!(
        xd.len() == wd.len() && xd.len() >= 3,
        "cudnn-backend: {op}: input {xd:?} and weight {wd:?} need the same rank >= 3"
    );
    let plan = g.plan(op, &xd[2..], &wd[2..]);
    let mut dims = vec![xd[0], wd[1] * g.groups as i64];
    dims.extend(&plan.out);
    let y = x.empty_on(&dims, x.dtype, op);
    if plan.valid == plan.out {
        expect(
            op,
            ops::conv_backward_data(x.stream(), &x.tref(), &w.tref(), &y.tmut(), &plan.params),
        );
    } else {
        fill(&y, 0.0, op);
        if plan.valid.iter().all(|&v| v > 0) {
            let mut vd = dims[..2].to_vec();
            vd.extend(&plan.valid);
            let tmp = x.empty_on(&vd, x.dtype, op);
            expect(
                op,
                ops::conv_backward_data(x.stream(), &x.tref(), &w.tref(), &tmp.tmut(), &plan.params),
            );
            exec::copy_into(&tmp, &spatial_prefix(&y, &plan.valid, op), op);
        }
    }
    match bias {
        Some(b) => {
            check_pair(op, &y, &b);
            let mut bd = vec![1i64; dims.len()];
            bd[1] = dims[1];
            let b = b.reshape(&bd);
            exec::binary(y, b, BinaryOp::Add, op)
        }
        None => y,
    }
}

/// Gradient of [`conv_transpose`] with respect to its input: the convolution of `dy`.
pub(crate) fn conv_transpose_x_backward(
    op: &'static str,
    w: CudnnTensor,
    dy: CudnnTensor,
    g: &ConvTransposeGeom,
) -> CudnnTensor {
    require_cudnn_float(op, &dy);
    check_pair(op, &dy, &w);
    let (dd, wd) = (dy.dims().to_vec(), w.dims().to_vec());
    let input = g.input_size(&dd[2..], &wd[2..]);
    let plan = g.plan(op, &input, &wd[2..]);
    let mut dims = vec![dd[0], wd[0]];
    dims.extend(&input);
    let dx = dy.empty_on(&dims, dy.dtype, op);
    if plan.valid.iter().any(|&v| v <= 0) {
        fill(&dx, 0.0, op);
        return dx;
    }
    let dy = spatial_prefix(&dy, &plan.valid, op).cudnn_ready();
    let w = w.cudnn_ready();
    expect(
        op,
        ops::conv_forward(dy.stream(), &dy.tref(), &w.tref(), &dx.tmut(), &plan.params),
    );
    dx
}

/// Gradient of [`conv_transpose`] with respect to its filter: cuDNN's backward-filter of
/// the transposed convolution with the roles of input and output gradient swapped.
pub(crate) fn conv_transpose_weight_backward(
    op: &'static str,
    x: CudnnTensor,
    w_dims: &[i64],
    dy: CudnnTensor,
    g: &ConvTransposeGeom,
) -> CudnnTensor {
    require_cudnn_float(op, &x);
    check_pair(op, &x, &dy);
    let xd = x.dims().to_vec();
    let plan = g.plan(op, &xd[2..], &w_dims[2..]);
    let dw = x.empty_on(w_dims, x.dtype, op);
    if plan.valid.iter().any(|&v| v <= 0) {
        fill(&dw, 0.0, op);
        return dw;
    }
    let dy = spatial_prefix(&dy, &plan.valid, op).cudnn_ready();
    let x = x.cudnn_ready();
    expect(
        op,
        ops::conv_backward_filter(x.stream(), &dy.tref(), &x.tref(), &dw.tmut(), &plan.params),
    );
    dw
}

// ---------------------------------------------------------------------------------------
// Linear layers

/// `[.., K]` as `[M, K]` (a view when the strides allow, else a packed copy).
fn fold_rows(t: CudnnTensor) -> CudnnTensor {
    let d = t.dims().to_vec();
    let k = d.last().copied().unwrap_or(1);
    let m: i64 = d[..d.len().saturating_sub(1)].iter().product();
    t.reshape(&[m, k])
}

/// `a · b` for rank-2 operands: the exact GEMM for F64 (cuDNN has no F64 matmul), else
/// cuDNN on [`CudnnTensor::matmul_ready`] views.
fn matmul2(a: CudnnTensor, b: CudnnTensor, op: &str) -> CudnnTensor {
    if a.dtype == DType::F64 {
        return super::math::exact_matmul(&a, &b, op);
    }
    let (a, b) = (a.matmul_ready(), b.matmul_ready());
    let c = a.empty_on(&[a.dims()[0], b.dims()[1]], a.dtype, op);
    expect(op, ops::matmul(c.stream(), &a.tref(), &b.tref(), &c.tmut()));
    c
}

/// Panics unless `t` holds a float dtype the linear layers take (F32, Flex32, F16, BF16
/// on cuDNN; F64 on the exact GEMM kernel).
fn require_linear_float(op: &str, t: &CudnnTensor) {
    if t.dtype != DType::F64 {
        require_cudnn_float(op, t);
    }
}

/// `x [.., K] · w [K, N] (+ bias [N])` as one cuDNN matmul graph with leading dims
/// folded into M (F64: the exact GEMM kernel, then the bias add).
pub(crate) fn linear(x: CudnnTensor, w: CudnnTensor, bias: Option<CudnnTensor>) -> CudnnTensor {
    const OP: &str = "linear";
    require_linear_float(OP, &x);
    check_pair(OP, &x, &w);
    assert!(
        w.rank() == 2,
        "cudnn-backend: linear: weight {:?} must be [d_input, d_output]",
        w.dims()
    );
    let lead: Vec<i64> = x.dims()[..x.rank().saturating_sub(1)].to_vec();
    let n = w.dims()[1];
    let mut dims = lead;
    dims.push(n);
    if x.dtype == DType::F64 {
        let y = matmul2(fold_rows(x), w, OP);
        let y = match bias {
            Some(b) => {
                check_pair(OP, &y, &b);
                exec::binary(y, b.reshape(&[1, n]), BinaryOp::Add, OP)
            }
            None => y,
        };
        return y.reshape(&dims);
    }
    let x2 = fold_rows(x).matmul_ready();
    let w = w.matmul_ready();
    let y = x2.empty_on(&[x2.dims()[0], n], x2.dtype, OP);
    let b = bias.map(|b| {
        check_pair(OP, &y, &b);
        b.cudnn_ready()
    });
    expect(
        OP,
        ops::matmul_bias_act(
            y.stream(),
            &x2.tref(),
            &w.tref(),
            b.as_ref().map(|b| b.tref()).as_ref(),
            &y.tmut(),
            Activation::Identity,
        ),
    );
    y.reshape(&dims)
}

/// The transpose of a rank-2 tensor (a view).
fn t2(t: &CudnnTensor, op: &str) -> CudnnTensor {
    view(t, op, |l| l.transpose(0, 1))
}

/// `dy [.., N] · wᵀ` → `[.., K]` (gradient of [`linear`] with respect to `x`).
pub(crate) fn linear_x_backward(w: CudnnTensor, dy: CudnnTensor) -> CudnnTensor {
    const OP: &str = "linear_x_backward";
    require_linear_float(OP, &dy);
    check_pair(OP, &dy, &w);
    let lead: Vec<i64> = dy.dims()[..dy.rank().saturating_sub(1)].to_vec();
    let k = w.dims()[0];
    let dx = matmul2(fold_rows(dy), t2(&w, OP), OP);
    let mut dims = lead;
    dims.push(k);
    dx.reshape(&dims)
}

/// `xᵀ · dy` with every leading dim folded into the contraction → `[K, N]` (gradient of
/// [`linear`] with respect to its weight; one GEMM).
pub(crate) fn linear_weight_backward(x: CudnnTensor, dy: CudnnTensor) -> CudnnTensor {
    const OP: &str = "linear_weight_backward";
    require_linear_float(OP, &x);
    check_pair(OP, &x, &dy);
    let xt = t2(&fold_rows(x), OP);
    matmul2(xt, fold_rows(dy), OP)
}

/// `dy [.., N]` summed over every dim but the last → `[N]`.
pub(crate) fn linear_bias_backward(dy: CudnnTensor) -> CudnnTensor {
    const OP: &str = "linear_bias_backward";
    let n = dy.dims().last().copied().unwrap_or(1);
    let dy2 = fold_rows(dy);
    sum_axis(&dy2, 0, OP).reshape(&[n])
}

// ---------------------------------------------------------------------------------------
// Embeddings and im2col

/// `indices` flattened to 1-D, as I64 or I32 (what the index kernels take).
fn flat_indices(indices: CudnnTensor, op: &str) -> CudnnTensor {
    let idx = match indices.dtype {
        DType::I64 | DType::I32 => indices,
        DType::I8 | DType::U8 => exec::cast(indices, DType::I64, op),
        other => panic!("cudnn-backend: {op}: indices of dtype {other:?} are not supported (use I64 or I32)"),
    };
    let n = idx.numel();
    idx.reshape(&[n])
}

/// `weights [V, D]` rows selected by `indices [..]` → `[.., D]`.
pub(crate) fn embedding(weights: CudnnTensor, indices: CudnnTensor) -> CudnnTensor {
    const OP: &str = "embedding";
    exec::check_same_device(OP, &weights, &indices);
    let mut dims = indices.dims().to_vec();
    let d = weights.dims()[1];
    dims.push(d);
    let idx = flat_indices(indices, OP);
    let out = weights.empty_on(&[idx.numel(), d], weights.dtype, OP);
    expect(
        OP,
        kindex::index_select(out.stream(), &weights.tref(), 0, &idx.tref(), &out.tmut()),
    );
    out.reshape(&dims)
}

/// Gradient of [`embedding`]: the rows of `dy [.., D]` added into zeros `[V, D]` at
/// `indices` (duplicates accumulate).
pub(crate) fn embedding_backward(weights: &CudnnTensor, dy: CudnnTensor, indices: CudnnTensor) -> CudnnTensor {
    const OP: &str = "embedding_backward";
    exec::check_same_device(OP, &dy, &indices);
    let [v, d] = [weights.dims()[0], weights.dims()[1]];
    let idx = flat_indices(indices, OP);
    let dtype = dy.dtype;
    // Half-precision rows are summed in f32: native float atomics instead of 16-bit
    // compare-and-swap loops, which many indices hitting one row (small vocabularies,
    // positions repeated over a batch) serialize.
    let work = compute_dtype(dtype);
    let dy = exec::cast(dy.reshape(&[idx.numel(), d]), work, OP);
    let out = exec::full(dy.device(), &[v, d], work, 0.0, OP);
    expect(
        OP,
        kindex::index_add(out.stream(), &out.tmut(), 0, &idx.tref(), &dy.tref()),
    );
    exec::cast(out, dtype, OP)
}

/// im2col: `x [N, C, H, W]` → `[N, C·kh·kw, L]` (PyTorch's `unfold`), as one strided copy
/// of a zero-padded input.
pub(crate) fn unfold4d(
    x: CudnnTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> CudnnTensor {
    const OP: &str = "unfold4d";
    let d = x.dims().to_vec();
    assert!(
        d.len() == 4,
        "cudnn-backend: unfold4d: input {d:?} must be [N, C, H, W]"
    );
    let [k0, k1] = kernel.map(|v| v as i64);
    let [s0, s1] = stride.map(|v| v as i64);
    let [p0, p1] = padding.map(|v| v as i64);
    let [d0, d1] = dilation.map(|v| v as i64);
    let (hp, wp) = (d[2] + 2 * p0, d[3] + 2 * p1);
    let (e0, e1) = (d0 * (k0 - 1) + 1, d1 * (k1 - 1) + 1);
    assert!(
        k0 > 0 && k1 > 0 && hp >= e0 && wp >= e1,
        "cudnn-backend: unfold4d: kernel {kernel:?} (dilation {dilation:?}) does not fit the padded input {hp}x{wp}"
    );
    let (oh, ow) = ((hp - e0) / s0 + 1, (wp - e1) / s1 + 1);
    let xp = if p0 == 0 && p1 == 0 {
        x
    } else {
        let xp = exec::full(x.device(), &[d[0], d[1], hp, wp], x.dtype, 0.0, OP);
        let inner = narrow(&narrow(&xp, OP, 2, p0, p0 + d[2]), OP, 3, p1, p1 + d[3]);
        exec::copy_into(&x, &inner, OP);
        xp
    };
    let st = &xp.layout.strides;
    let windows = ViewLayout {
        dims: vec![d[0], d[1], k0, k1, oh, ow],
        strides: vec![st[0], st[1], d0 * st[2], d1 * st[3], s0 * st[2], s1 * st[3]],
        offset: xp.layout.offset,
    };
    let cols = exec::copy_to_new(&xp.with_layout(windows), xp.dtype, OP);
    cols.reshape(&[d[0], d[1] * k0 * k1, oh * ow])
}

// ---------------------------------------------------------------------------------------
// Pooling

/// Burn's 2-D pooling arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolArgs {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

/// Output sizes of a pooling: Burn's (`calculate_pool_output_size`, which keeps a
/// `ceil_mode` window that starts in the right padding) and the kernels' (PyTorch's rule,
/// which drops it; never larger).
struct PoolShape {
    pool: Pool2d,
    burn: [i64; 2],
    kernel: [i64; 2],
}

impl PoolArgs {
    fn shape(&self, op: &str, x: &CudnnTensor) -> PoolShape {
        let d = x.dims();
        assert!(d.len() == 4, "cudnn-backend: {op}: input {d:?} must be [N, C, H, W]");
        let pool = Pool2d {
            kernel: self.kernel.map(|v| v as i64),
            stride: self.stride.map(|v| v as i64),
            padding: self.padding.map(|v| v as i64),
            dilation: self.dilation.map(|v| v as i64),
            ceil_mode: self.ceil_mode,
        };
        let kernel = expect(op, pool.output_hw(d[2], d[3]));
        let mut burn = [0i64; 2];
        for a in 0..2 {
            let (k, s, p, dl) = (pool.kernel[a], pool.stride[a], pool.padding[a], pool.dilation[a]);
            let num = d[2 + a] + 2 * p - dl * (k - 1) - 1;
            burn[a] = if self.ceil_mode {
                (num + s - 1) / s + 1
            } else {
                num / s + 1
            };
        }
        PoolShape { pool, burn, kernel }
    }
}

/// `t[.., ..h, ..w]` (a view).
fn top_left(t: &CudnnTensor, hw: [i64; 2], op: &str) -> CudnnTensor {
    narrow(&narrow(t, op, 2, 0, hw[0]), op, 3, 0, hw[1])
}

/// Max pooling with flat `h * W + w` indices (I64) into each input plane; first maximum
/// wins. Windows Burn keeps past PyTorch's `ceil_mode` rule hold -inf with index 0, as
/// burn-ndarray writes them.
pub(crate) fn max_pool2d_with_indices(x: CudnnTensor, a: &PoolArgs) -> (CudnnTensor, CudnnTensor) {
    const OP: &str = "max_pool2d_with_indices";
    require_float(OP, &x);
    let s = a.shape(OP, &x);
    let d = x.dims();
    let dims = [d[0], d[1], s.burn[0], s.burn[1]];
    let out = x.empty_on(&dims, x.dtype, OP);
    let idx = x.empty_on(&dims, DType::I64, OP);
    let (ko, ki) = if s.burn == s.kernel {
        (out.clone(), idx.clone())
    } else {
        fill(&out, f64::NEG_INFINITY, OP);
        fill(&idx, 0.0, OP);
        (top_left(&out, s.kernel, OP), top_left(&idx, s.kernel, OP))
    };
    expect(
        OP,
        kpool::max_pool2d_with_indices(x.stream(), &x.tref(), &s.pool, &ko.tmut(), &ki.tmut()),
    );
    drop((ko, ki));
    (out, idx)
}

/// Max pooling values only: cuDNN's pooling when it computes exactly Burn's windows
/// (no dilation, no `ceil_mode` extension, F32/F16/BF16), else the indexed kernel.
pub(crate) fn max_pool2d(x: CudnnTensor, a: &PoolArgs) -> CudnnTensor {
    const OP: &str = "max_pool2d";
    require_float(OP, &x);
    let s = a.shape(OP, &x);
    let floor = PoolArgs { ceil_mode: false, ..*a }.shape(OP, &x);
    let cudnn_ok = a.dilation == [1, 1]
        && s.burn == floor.burn
        && matches!(x.dtype, DType::F32 | DType::Flex32 | DType::F16 | DType::BF16);
    if !cudnn_ok {
        return max_pool2d_with_indices(x, a).0;
    }
    let x = x.cudnn_ready();
    let d = x.dims();
    let out = x.empty_on(&[d[0], d[1], s.burn[0], s.burn[1]], x.dtype, OP);
    let p = PoolParams::new(PoolMode::Max, &s.pool.kernel, &s.pool.stride, &s.pool.padding);
    expect(OP, ops::pool_forward(x.stream(), &x.tref(), &out.tmut(), &p));
    out
}

/// Gradient of max pooling from its indices: each `dy` element is added at the input
/// position its index names (deterministic per position, as burn-ndarray).
pub(crate) fn max_pool2d_backward(x: &CudnnTensor, dy: CudnnTensor, indices: CudnnTensor) -> CudnnTensor {
    const OP: &str = "max_pool2d_with_indices_backward";
    require_float(OP, &dy);
    exec::check_same_device(OP, &dy, &indices);
    let idx = match indices.dtype {
        DType::I64 => indices,
        _ => exec::cast(indices, DType::I64, OP),
    };
    let dx = dy.empty_on(x.dims(), dy.dtype, OP);
    expect(
        OP,
        kpool::max_pool2d_backward(dx.stream(), &idx.tref(), &dy.tref(), &dx.tmut()),
    );
    dx
}

/// Average pooling (burn-ndarray's divisor rules for `count_include_pad` and `ceil_mode`).
/// A window Burn keeps past PyTorch's `ceil_mode` rule has no input element: it holds
/// 0 / (its size inside the padded input), i.e. 0, or NaN when that size is 0 or padding
/// is not counted, as burn-ndarray computes it.
pub(crate) fn avg_pool2d(x: CudnnTensor, a: &PoolArgs, count_include_pad: bool) -> CudnnTensor {
    const OP: &str = "avg_pool2d";
    require_float(OP, &x);
    let s = a.shape(OP, &x);
    let d = x.dims().to_vec();
    let dims = [d[0], d[1], s.burn[0], s.burn[1]];
    let out = x.empty_on(&dims, x.dtype, OP);
    let ko = if s.burn == s.kernel {
        out.clone()
    } else {
        // Value of an extra window along axis `ax` (row or column).
        let extra_ok = |ax: usize| {
            let start = s.kernel[ax] * s.pool.stride[ax];
            count_include_pad && start < d[2 + ax] + 2 * s.pool.padding[ax]
        };
        let val = |ok: bool| if ok { 0.0 } else { f64::NAN };
        let (rows, cols) = (s.burn[0] > s.kernel[0], s.burn[1] > s.kernel[1]);
        if rows {
            fill(&narrow(&out, OP, 2, s.kernel[0], s.burn[0]), val(extra_ok(0)), OP);
        }
        if cols {
            fill(&narrow(&out, OP, 3, s.kernel[1], s.burn[1]), val(extra_ok(1)), OP);
        }
        if rows && cols {
            let corner = narrow(
                &narrow(&out, OP, 2, s.kernel[0], s.burn[0]),
                OP,
                3,
                s.kernel[1],
                s.burn[1],
            );
            fill(&corner, val(extra_ok(0) && extra_ok(1)), OP);
        }
        top_left(&out, s.kernel, OP)
    };
    expect(
        OP,
        kpool::avg_pool2d(x.stream(), &x.tref(), &s.pool, count_include_pad, &ko.tmut()),
    );
    drop(ko);
    out
}

/// Gradient of [`avg_pool2d`] (windows past PyTorch's `ceil_mode` rule contribute nothing).
pub(crate) fn avg_pool2d_backward(
    x: &CudnnTensor,
    dy: CudnnTensor,
    a: &PoolArgs,
    count_include_pad: bool,
) -> CudnnTensor {
    const OP: &str = "avg_pool2d_backward";
    require_float(OP, &dy);
    let s = a.shape(OP, x);
    let dy = if dy.dims()[2..] == s.kernel[..] {
        dy
    } else {
        top_left(&dy, s.kernel, OP)
    };
    let dx = dy.empty_on(x.dims(), dy.dtype, OP);
    expect(
        OP,
        kpool::avg_pool2d_backward(dx.stream(), &dy.tref(), &s.pool, count_include_pad, &dx.tmut()),
    );
    dx
}

/// Adaptive average pooling to `[oh, ow]`.
pub(crate) fn adaptive_avg_pool2d(x: CudnnTensor, size: [usize; 2]) -> CudnnTensor {
    const OP: &str = "adaptive_avg_pool2d";
    require_float(OP, &x);
    let d = x.dims();
    assert!(d.len() == 4, "cudnn-backend: {OP}: input {d:?} must be [N, C, H, W]");
    let out = x.empty_on(&[d[0], d[1], size[0] as i64, size[1] as i64], x.dtype, OP);
    expect(OP, kpool::adaptive_avg_pool2d(x.stream(), &x.tref(), &out.tmut()));
    out
}

/// Gradient of [`adaptive_avg_pool2d`].
pub(crate) fn adaptive_avg_pool2d_backward(x: &CudnnTensor, dy: CudnnTensor) -> CudnnTensor {
    const OP: &str = "adaptive_avg_pool2d_backward";
    require_float(OP, &dy);
    let dx = dy.empty_on(x.dims(), dy.dtype, OP);
    expect(
        OP,
        kpool::adaptive_avg_pool2d_backward(dx.stream(), &dy.tref(), &dx.tmut()),
    );
    dx
}

/// `[N, C, L]` as `[N, C, 1, L]` (a view).
pub(crate) fn as_2d(t: &CudnnTensor, op: &str) -> CudnnTensor {
    assert!(
        t.rank() == 3,
        "cudnn-backend: {op}: input {:?} must be [N, C, L]",
        t.dims()
    );
    view(t, op, |l| l.unsqueeze(2))
}

/// `[N, C, 1, L]` back to `[N, C, L]` (a view).
pub(crate) fn as_1d(t: &CudnnTensor, op: &str) -> CudnnTensor {
    view(t, op, |l| l.squeeze(2))
}

// ---------------------------------------------------------------------------------------
// Interpolation

/// The kernels' mode for Burn's, or a panic naming the unsupported one.
fn interp_mode(op: &str, mode: &burn_backend::ops::InterpolateMode) -> KMode {
    use burn_backend::ops::InterpolateMode as M;
    match mode {
        M::Nearest => KMode::Nearest,
        M::Bilinear => KMode::Bilinear,
        M::Bicubic => KMode::Bicubic,
        // Lanczos3 runs as two exact GEMMs (`lanczos` module) before the kernels are asked.
        M::Lanczos3 => panic!("cudnn-backend: {op}: the resize kernels have no Lanczos3 mode; use layers::lanczos"),
    }
}

/// Resizes `x [N, C, H, W]` to `[N, C, oh, ow]`.
pub(crate) fn interpolate(
    x: CudnnTensor,
    size: [usize; 2],
    options: &burn_backend::ops::InterpolateOptions,
) -> CudnnTensor {
    const OP: &str = "interpolate";
    require_float(OP, &x);
    if matches!(options.mode, burn_backend::ops::InterpolateMode::Lanczos3) {
        return lanczos::lanczos3_interpolate(x, size, options.align_corners);
    }
    let mode = interp_mode(OP, &options.mode);
    let d = x.dims();
    assert!(d.len() == 4, "cudnn-backend: {OP}: input {d:?} must be [N, C, H, W]");
    let out = x.empty_on(&[d[0], d[1], size[0] as i64, size[1] as i64], x.dtype, OP);
    expect(
        OP,
        kresize::interpolate(x.stream(), &x.tref(), mode, options.align_corners, &out.tmut()),
    );
    out
}

/// Gradient of [`interpolate`] with respect to `x`.
pub(crate) fn interpolate_backward(
    x: &CudnnTensor,
    dy: CudnnTensor,
    options: &burn_backend::ops::InterpolateOptions,
) -> CudnnTensor {
    const OP: &str = "interpolate_backward";
    require_float(OP, &dy);
    if matches!(options.mode, burn_backend::ops::InterpolateMode::Lanczos3) {
        return lanczos::lanczos3_interpolate_backward(x.dims(), dy, options.align_corners);
    }
    let mode = interp_mode(OP, &options.mode);
    let dx = dy.empty_on(x.dims(), dy.dtype, OP);
    expect(
        OP,
        kresize::interpolate_backward(dx.stream(), &dy.tref(), mode, options.align_corners, &dx.tmut()),
    );
    dx
}

// ---------------------------------------------------------------------------------------
// Activations

/// `grad` where `output > 0`, else 0 (relu's backward from its output, as Burn's default:
/// a NaN output passes the gradient).
pub(crate) fn relu_backward(output: CudnnTensor, grad: CudnnTensor) -> CudnnTensor {
    exec::binary(grad, output, BinaryOp::ReluBackward, "relu_backward")
}

/// Runs `f` on `t` in the compute dtype (F32 for half types) and casts the result back.
pub(crate) fn in_compute_dtype(t: CudnnTensor, op: &str, f: impl FnOnce(CudnnTensor) -> CudnnTensor) -> CudnnTensor {
    let dtype = t.dtype;
    let out = f(exec::cast(t, compute_dtype(dtype), op));
    exec::cast(out, dtype, op)
}

/// Burn's default `gelu_backward` (the derivative of the tanh approximation, which is what
/// burn-ndarray computes) as one elementwise pass.
pub(crate) fn gelu_backward(x: CudnnTensor, grad: CudnnTensor) -> CudnnTensor {
    // One kernel pass: the derivative is computed in f32 (f64 for f64) per element.
    let x = exec::cast(x, grad.dtype, "gelu_backward");
    exec::binary(grad, x, BinaryOp::GeluBackward, "gelu_backward")
}

/// `output (1 - output) grad`.
pub(crate) fn sigmoid_backward(output: CudnnTensor, grad: CudnnTensor) -> CudnnTensor {
    const OP: &str = "sigmoid_backward";
    let one_minus = exec::unary(output.clone(), UnaryOp::MulScalar(-1.0), OP);
    let one_minus = exec::unary(one_minus, UnaryOp::AddScalar(1.0), OP);
    let v = exec::binary(one_minus, output, BinaryOp::Mul, OP);
    exec::binary(v, grad, BinaryOp::Mul, OP)
}

/// `clamp(alpha x + beta, 0, 1)`.
pub(crate) fn hard_sigmoid(x: CudnnTensor, alpha: f64, beta: f64) -> CudnnTensor {
    const OP: &str = "hard_sigmoid";
    in_compute_dtype(x, OP, |x| {
        let y = exec::unary(x, UnaryOp::MulScalar(alpha), OP);
        let y = exec::unary(y, UnaryOp::AddScalar(beta), OP);
        exec::unary(y, UnaryOp::Clamp { min: 0.0, max: 1.0 }, OP)
    })
}

/// `log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))` (stable for large |x|).
pub(crate) fn log_sigmoid(x: CudnnTensor) -> CudnnTensor {
    const OP: &str = "log_sigmoid";
    in_compute_dtype(x, OP, |x| {
        let soft = exec::unary(x.clone(), UnaryOp::Abs, OP);
        let soft = exec::unary(soft, UnaryOp::Neg, OP);
        let soft = exec::unary(soft, UnaryOp::Exp, OP);
        let soft = exec::unary(soft, UnaryOp::Log1p, OP);
        let m = exec::binary_scalar(x, 0.0, BinaryOp::Min, OP);
        exec::binary(m, soft, BinaryOp::Sub, OP)
    })
}

/// Gradient of [`log_sigmoid`]: `grad · sigmoid(-x)` (Burn's default formula simplified).
pub(crate) fn log_sigmoid_backward(x: CudnnTensor, grad: CudnnTensor) -> CudnnTensor {
    const OP: &str = "log_sigmoid_backward";
    let s = exec::unary(x, UnaryOp::Neg, OP);
    let s = exec::unary(s, UnaryOp::Sigmoid, OP);
    exec::binary(s, grad, BinaryOp::Mul, OP)
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
                                    stride: vec![s as usize],
                                    padding: vec![p as usize],
                                    padding_out: vec![po as usize],
                                    dilation: vec![d as usize],
                                    groups: 1,
                                };
                                let plan = g.plan("test", &[l], &[k]);
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
