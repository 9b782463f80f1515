//! 2-D pooling kernels for the cases cuDNN cannot express: max pooling with flat indices
//! (dilation, `ceil_mode`) and its backward from those indices, average pooling with
//! PyTorch's `ceil_mode` / `count_include_pad` divisor rules, and adaptive average
//! pooling.
//!
//! Every function takes the stream first, validates all its arguments, and only enqueues
//! work (it never synchronizes). Tensors are `[N, C, H, W]` in any strides (NCHW, NHWC,
//! transposed, gapped); the written operands must not overlap themselves (no 0 stride on
//! a dim > 1) nor alias the inputs. Dtypes are F32, F16, BF16 and F64 (f16/bf16
//! accumulate in f32). Empty outputs return `Ok(())` at once after validation.
//!
//! Max-pool indices are `I64` flat indices `h * W + w` into each `(n, c)` input plane,
//! like PyTorch and Burn: the first maximum in window order wins ties and a NaN wins over
//! any number. The max backward zero-fills `dx` and scatters `dy` by the indices with
//! atomic adds (f16/bf16 by compare-and-swap on the containing 32-bit word), so sums of
//! overlapping windows are not bit-reproducible; the average and adaptive backwards
//! gather instead (each `dx` element sums its windows' contributions: deterministic).
//!
//! Host work is split in two: a pure `plan_*` function (validation, layouts, kernel
//! choice) that needs no device, and the launch of the planned kernel (`kernels/pool.cu`:
//! `maxpool2d_{fwd,bwd}_<dt>`, `avgpool2d_{fwd,bwd}_<dt>`,
//! `adaptive_avgpool2d_{fwd,bwd}_<dt>` and `pool_zero_b{2,4,8}`).

use crate::kernels::check::{check_no_overlap, check_rank4, float_slot, on_stream, same_dtype, view_layout};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_pool::{self as launch, PoolWindow};
use crate::graph::DataType;
use crate::kernels::{stream_function, stream_functions, POOL};
use crate::types::{TensorMut, TensorRef};

/// 2-D pooling geometry, `[height, width]` each (PyTorch's `max_pool2d` / `avg_pool2d`
/// arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2d {
    /// Window size (> 0).
    pub kernel: [i64; 2],
    /// Step between windows (> 0).
    pub stride: [i64; 2],
    /// Implicit padding on both sides (0 ..= kernel / 2).
    pub padding: [i64; 2],
    /// Spacing of window elements (> 0; average pooling requires 1).
    pub dilation: [i64; 2],
    /// Round the output size up: an extra window may start past the last full one, as long
    /// as it starts inside the input or the left padding.
    pub ceil_mode: bool,
}

impl Pool2d {
    /// The output `[OH, OW]` for an input of `h` x `w`, by PyTorch's rules:
    /// `(in + 2p - d(k-1) - 1 (+ s-1 with ceil_mode)) / s + 1`, minus one with `ceil_mode`
    /// when the last window would start in the right padding. Errors on invalid geometry
    /// or an output smaller than 1.
    pub fn output_hw(&self, h: i64, w: i64) -> Result<[i64; 2]> {
        self.output_hw_for("pool2d", "x", h, w)
    }

    /// Checks the geometry (positive kernel/stride/dilation, 0 <= padding <= kernel / 2).
    fn check(&self, op: &'static str) -> Result<()> {
        for (name, v) in [
            ("kernel", self.kernel),
            ("stride", self.stride),
            ("dilation", self.dilation),
        ] {
            if v.iter().any(|&x| x <= 0) {
                return Err(Error::invalid_arg(op, "p", format!("{name} {v:?} must be positive")));
            }
        }
        for a in 0..2 {
            if self.padding[a] < 0 || self.padding[a] > self.kernel[a] / 2 {
                return Err(Error::invalid_arg(
                    op,
                    "p",
                    format!(
                        "padding {:?} must be between 0 and half the kernel {:?}",
                        self.padding, self.kernel
                    ),
                ));
            }
        }
        Ok(())
    }

    fn output_hw_for(&self, op: &'static str, arg: &'static str, h: i64, w: i64) -> Result<[i64; 2]> {
        self.check(op)?;
        let mut out = [0i64; 2];
        for (a, &len) in [h, w].iter().enumerate() {
            let (k, s, p, d) = (self.kernel[a], self.stride[a], self.padding[a], self.dilation[a]);
            let span = d
                .checked_mul(k - 1)
                .and_then(|x| x.checked_add(1))
                .ok_or_else(|| Error::invalid_arg(op, "p", "dilated kernel overflows"))?;
            let room = len + 2 * p - span;
            if len <= 0 || room < 0 {
                return Err(Error::invalid_arg(
                    op,
                    arg,
                    format!(
                        "input {h}x{w} is smaller than the dilated kernel {:?} (dilation {:?}) with padding {:?}",
                        self.kernel, self.dilation, self.padding
                    ),
                ));
            }
            let mut o = (room + if self.ceil_mode { s - 1 } else { 0 }) / s + 1;
            if self.ceil_mode && (o - 1) * s >= len + p {
                o -= 1;
            }
            out[a] = o;
        }
        Ok(out)
    }

    fn window(&self) -> PoolWindow {
        PoolWindow {
            kh: self.kernel[0],
            kw: self.kernel[1],
            sh: self.stride[0],
            sw: self.stride[1],
            ph: self.padding[0],
            pw: self.padding[1],
            dh: self.dilation[0],
            dw: self.dilation[1],
        }
    }
}

// ---------------------------------------------------------------------------------------
// Plans (pure host logic)

/// Max pooling forward: layouts of (x, out, indices) over `n` output elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MaxPlan {
    pub entry: &'static str,
    pub layouts: [KernelLayout; 3],
    pub window: PoolWindow,
    pub n: i64,
}

/// Max pooling backward: zero-fill dx (`zero_n` elements), then scatter the `n` dy
/// elements; layouts of (indices, dy, dx).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MaxBackwardPlan {
    pub zero_entry: &'static str,
    pub zero_n: i64,
    pub entry: &'static str,
    pub layouts: [KernelLayout; 3],
    pub n: i64,
}

/// Average / adaptive pooling, forward or backward: layouts of (source, destination) over
/// the `n` destination elements (the window is unused by the adaptive kernels).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AvgPlan {
    pub entry: &'static str,
    pub layouts: [KernelLayout; 2],
    pub window: PoolWindow,
    pub count_include_pad: bool,
    pub n: i64,
}

const MAX_FWD: [&str; 4] = [
    "maxpool2d_fwd_f32",
    "maxpool2d_fwd_f16",
    "maxpool2d_fwd_bf16",
    "maxpool2d_fwd_f64",
];
const MAX_BWD: [&str; 4] = [
    "maxpool2d_bwd_f32",
    "maxpool2d_bwd_f16",
    "maxpool2d_bwd_bf16",
    "maxpool2d_bwd_f64",
];
const MAX_BWD_GATHER: [&str; 4] = [
    "maxpool2d_bwd_gather_f32",
    "maxpool2d_bwd_gather_f16",
    "maxpool2d_bwd_gather_bf16",
    "maxpool2d_bwd_gather_f64",
];
const AVG_FWD: [&str; 4] = [
    "avgpool2d_fwd_f32",
    "avgpool2d_fwd_f16",
    "avgpool2d_fwd_bf16",
    "avgpool2d_fwd_f64",
];
const AVG_BWD: [&str; 4] = [
    "avgpool2d_bwd_f32",
    "avgpool2d_bwd_f16",
    "avgpool2d_bwd_bf16",
    "avgpool2d_bwd_f64",
];
const ADAPTIVE_FWD: [&str; 4] = [
    "adaptive_avgpool2d_fwd_f32",
    "adaptive_avgpool2d_fwd_f16",
    "adaptive_avgpool2d_fwd_bf16",
    "adaptive_avgpool2d_fwd_f64",
];
const ADAPTIVE_BWD: [&str; 4] = [
    "adaptive_avgpool2d_bwd_f32",
    "adaptive_avgpool2d_bwd_f16",
    "adaptive_avgpool2d_bwd_bf16",
    "adaptive_avgpool2d_bwd_f64",
];

/// `pool_zero_b{2,4,8}` by element size (float dtypes only reach here).
fn zero_entry(dtype: DataType) -> &'static str {
    match dtype.size() {
        2 => "pool_zero_b2",
        4 => "pool_zero_b4",
        _ => "pool_zero_b8",
    }
}

fn expect_dims(op: &'static str, arg: &'static str, t: &TensorRef, want: &[i64], why: &str) -> Result<()> {
    if t.dims[..] != want[..] {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("dims {:?} differ from {want:?} ({why})", t.dims),
        ));
    }
    Ok(())
}

/// `[N, C, OH, OW]` for input `x` under `p`.
fn pooled_dims(op: &'static str, arg: &'static str, x: &TensorRef, p: &Pool2d) -> Result<[i64; 4]> {
    let [oh, ow] = p.output_hw_for(op, arg, x.dims[2], x.dims[3])?;
    Ok([x.dims[0], x.dims[1], oh, ow])
}

fn check_avg_geometry(op: &'static str, p: &Pool2d) -> Result<()> {
    if p.dilation != [1, 1] {
        return Err(Error::invalid_arg(
            op,
            "p",
            format!("dilation {:?} must be [1, 1] for average pooling", p.dilation),
        ));
    }
    Ok(())
}

pub(crate) fn plan_max_pool2d(
    x: &TensorRef,
    p: &Pool2d,
    out: &TensorRef,
    indices: &TensorRef,
) -> Result<Option<MaxPlan>> {
    const OP: &str = "max_pool2d_with_indices";
    check_rank4(OP, "x", x)?;
    let n = check_rank4(OP, "out", out)?;
    check_rank4(OP, "indices", indices)?;
    let slot = float_slot(OP, "x", x.dtype)?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    if indices.dtype != DataType::I64 {
        return Err(Error::invalid_arg(
            OP,
            "indices",
            format!("dtype {:?} is not I64", indices.dtype),
        ));
    }
    let want = pooled_dims(OP, "x", x, p)?;
    expect_dims(OP, "out", out, &want, "x's N, C and the pooled H, W")?;
    expect_dims(OP, "indices", indices, &want, "out's dims")?;
    check_no_overlap(OP, "out", out)?;
    check_no_overlap(OP, "indices", indices)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(MaxPlan {
        entry: MAX_FWD[slot],
        layouts: [view_layout(OP, x)?, view_layout(OP, out)?, view_layout(OP, indices)?],
        window: p.window(),
        n,
    }))
}

pub(crate) fn plan_max_pool2d_backward(
    indices: &TensorRef,
    dy: &TensorRef,
    dx: &TensorRef,
) -> Result<Option<MaxBackwardPlan>> {
    const OP: &str = "max_pool2d_backward";
    check_rank4(OP, "indices", indices)?;
    let n = check_rank4(OP, "dy", dy)?;
    let zero_n = check_rank4(OP, "dx", dx)?;
    let slot = float_slot(OP, "dx", dx.dtype)?;
    same_dtype(OP, "dy", dy, dx.dtype, "dx")?;
    if indices.dtype != DataType::I64 {
        return Err(Error::invalid_arg(
            OP,
            "indices",
            format!("dtype {:?} is not I64", indices.dtype),
        ));
    }
    expect_dims(OP, "indices", indices, &dy.dims, "dy's dims")?;
    if dy.dims[..2] != dx.dims[..2] {
        return Err(Error::invalid_arg(
            OP,
            "dy",
            format!("N, C of {:?} differ from dx's {:?}", dy.dims, dx.dims),
        ));
    }
    check_no_overlap(OP, "dx", dx)?;
    if zero_n == 0 {
        return Ok(None);
    }
    Ok(Some(MaxBackwardPlan {
        zero_entry: zero_entry(dx.dtype),
        zero_n,
        entry: MAX_BWD[slot],
        layouts: [view_layout(OP, indices)?, view_layout(OP, dy)?, view_layout(OP, dx)?],
        n,
    }))
}

/// The deterministic max-pool backward: the scatter plan's checks, plus `dy`'s spatial dims
/// must be what `p` gives for `dx`'s.
pub(crate) fn plan_max_pool2d_backward_gather(
    indices: &TensorRef,
    dy: &TensorRef,
    p: &Pool2d,
    dx: &TensorRef,
) -> Result<Option<(MaxBackwardPlan, PoolWindow)>> {
    const OP: &str = "max_pool2d_backward";
    let Some(plan) = plan_max_pool2d_backward(indices, dy, dx)? else {
        return Ok(None);
    };
    p.check(OP)?;
    // With `ceil_mode`, Burn keeps one more window than PyTorch's rule when the last one
    // starts in the padding: it covers no input element (index -1) and adds nothing.
    let want = p.output_hw_for(OP, "dx", dx.dims[2], dx.dims[3])?;
    let extra = p.ceil_mode as i64;
    if (0..2).any(|a| dy.dims[2 + a] < want[a] || dy.dims[2 + a] > want[a] + extra) {
        return Err(Error::invalid_arg(
            OP,
            "dy",
            format!(
                "spatial dims {:?} differ from {want:?} ({:?} pooled by {p:?})",
                &dy.dims[2..],
                dx.dims
            ),
        ));
    }
    let slot = float_slot(OP, "dx", dx.dtype)?;
    Ok(Some((
        MaxBackwardPlan {
            entry: MAX_BWD_GATHER[slot],
            n: plan.zero_n,
            ..plan
        },
        p.window(),
    )))
}

pub(crate) fn plan_avg_pool2d(
    x: &TensorRef,
    p: &Pool2d,
    count_include_pad: bool,
    out: &TensorRef,
) -> Result<Option<AvgPlan>> {
    const OP: &str = "avg_pool2d";
    check_rank4(OP, "x", x)?;
    let n = check_rank4(OP, "out", out)?;
    let slot = float_slot(OP, "x", x.dtype)?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    check_avg_geometry(OP, p)?;
    let want = pooled_dims(OP, "x", x, p)?;
    expect_dims(OP, "out", out, &want, "x's N, C and the pooled H, W")?;
    check_no_overlap(OP, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(AvgPlan {
        entry: AVG_FWD[slot],
        layouts: [view_layout(OP, x)?, view_layout(OP, out)?],
        window: p.window(),
        count_include_pad,
        n,
    }))
}

pub(crate) fn plan_avg_pool2d_backward(
    dy: &TensorRef,
    p: &Pool2d,
    count_include_pad: bool,
    dx: &TensorRef,
) -> Result<Option<AvgPlan>> {
    const OP: &str = "avg_pool2d_backward";
    check_rank4(OP, "dy", dy)?;
    let n = check_rank4(OP, "dx", dx)?;
    let slot = float_slot(OP, "dx", dx.dtype)?;
    same_dtype(OP, "dy", dy, dx.dtype, "dx")?;
    check_avg_geometry(OP, p)?;
    let want = pooled_dims(OP, "dx", dx, p)?;
    expect_dims(OP, "dy", dy, &want, "dx's N, C and the pooled H, W")?;
    check_no_overlap(OP, "dx", dx)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(AvgPlan {
        entry: AVG_BWD[slot],
        layouts: [view_layout(OP, dy)?, view_layout(OP, dx)?],
        window: p.window(),
        count_include_pad,
        n,
    }))
}

/// Checks the adaptive pair: same N and C, positive spatial dims on both sides unless the
/// batch is empty.
fn check_adaptive(
    op: &'static str,
    input: (&'static str, &TensorRef),
    output: (&'static str, &TensorRef),
) -> Result<()> {
    let (ia, i) = input;
    let (oa, o) = output;
    if i.dims[..2] != o.dims[..2] {
        return Err(Error::invalid_arg(
            op,
            oa,
            format!("N, C of {:?} differ from {ia}'s {:?}", o.dims, i.dims),
        ));
    }
    if i.dims[0] * i.dims[1] > 0 {
        for (arg, t) in [(ia, i), (oa, o)] {
            if t.dims[2] <= 0 || t.dims[3] <= 0 {
                return Err(Error::invalid_arg(
                    op,
                    arg,
                    format!("spatial dims of {:?} must be positive", t.dims),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn plan_adaptive_avg_pool2d(x: &TensorRef, out: &TensorRef) -> Result<Option<AvgPlan>> {
    const OP: &str = "adaptive_avg_pool2d";
    check_rank4(OP, "x", x)?;
    let n = check_rank4(OP, "out", out)?;
    let slot = float_slot(OP, "x", x.dtype)?;
    same_dtype(OP, "out", out, x.dtype, "x")?;
    check_adaptive(OP, ("x", x), ("out", out))?;
    check_no_overlap(OP, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(AvgPlan {
        entry: ADAPTIVE_FWD[slot],
        layouts: [view_layout(OP, x)?, view_layout(OP, out)?],
        window: PoolWindow::default(),
        count_include_pad: false,
        n,
    }))
}

pub(crate) fn plan_adaptive_avg_pool2d_backward(dy: &TensorRef, dx: &TensorRef) -> Result<Option<AvgPlan>> {
    const OP: &str = "adaptive_avg_pool2d_backward";
    check_rank4(OP, "dy", dy)?;
    let n = check_rank4(OP, "dx", dx)?;
    let slot = float_slot(OP, "dx", dx.dtype)?;
    same_dtype(OP, "dy", dy, dx.dtype, "dx")?;
    check_adaptive(OP, ("dx", dx), ("dy", dy))?;
    check_no_overlap(OP, "dx", dx)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(AvgPlan {
        entry: ADAPTIVE_BWD[slot],
        layouts: [view_layout(OP, dy)?, view_layout(OP, dx)?],
        window: PoolWindow::default(),
        count_include_pad: false,
        n,
    }))
}

// ---------------------------------------------------------------------------------------
// Public API

/// Max pooling of `x` `[N, C, H, W]` into `out` `[N, C, OH, OW]` (`OH, OW` from
/// [`Pool2d::output_hw`]; same dtype) and `indices` (`I64`, same dims): the flat index
/// `h * W + w` of each maximum in its input plane. The first maximum in window order
/// wins ties; a NaN wins over any number.
pub fn max_pool2d_with_indices(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    p: &Pool2d,
    out: &TensorMut,
    indices: &TensorMut,
) -> Result<()> {
    on_stream(
        stream,
        "max_pool2d_with_indices",
        &[("x", x), ("out", out), ("indices", indices)],
    )?;
    let Some(plan) = plan_max_pool2d(x, p, out, indices)? else {
        return Ok(());
    };
    let f = stream_function(stream, POOL, plan.entry)?;
    launch::max_forward(
        stream,
        &f,
        x.address(),
        out.address(),
        indices.address(),
        &plan.layouts,
        plan.window,
        plan.n,
    )
}

/// Max pooling backward: zero-fills `dx` `[N, C, H, W]`, then adds each `dy` element
/// `[N, C, OH, OW]` at the flat plane position its `indices` element (`I64`, dy's dims)
/// names (indices outside `0..H * W` add nothing). Atomic adds: sums of overlapping
/// windows are not bit-reproducible.
pub fn max_pool2d_backward(
    stream: &Arc<CudaStream>,
    indices: &TensorRef,
    dy: &TensorRef,
    dx: &TensorMut,
) -> Result<()> {
    on_stream(
        stream,
        "max_pool2d_backward",
        &[("indices", indices), ("dy", dy), ("dx", dx)],
    )?;
    let Some(plan) = plan_max_pool2d_backward(indices, dy, dx)? else {
        return Ok(());
    };
    // A packed `dx` (any dim order) is one span of memory: the driver's memset clears it at
    // copy bandwidth; other views take the strided zeroing kernel.
    let f = if dx.is_packed() {
        crate::ffi::launch::memset_zero(stream, dx.address(), plan.zero_n as usize * dx.dtype.size())?;
        stream_function(stream, POOL, plan.entry)?
    } else {
        let [z, f] = stream_functions(stream, POOL, [plan.zero_entry, plan.entry])?;
        crate::ffi::launch::zero_view(stream, &z, dx.address(), &plan.layouts[2], plan.zero_n)?;
        f
    };
    if plan.n == 0 {
        return Ok(());
    }
    launch::max_backward(
        stream,
        &f,
        indices.address(),
        dy.address(),
        dx.address(),
        &plan.layouts,
        plan.n,
    )
}

/// [`max_pool2d_backward`] without atomics: every `dx` element sums, in window order, the
/// `dy` of the windows of `p` (the forward's geometry) that contain it and whose index names
/// it, so results are bit-reproducible (what the engine's deterministic mode uses).
pub fn max_pool2d_backward_gather(
    stream: &Arc<CudaStream>,
    indices: &TensorRef,
    dy: &TensorRef,
    p: &Pool2d,
    dx: &TensorMut,
) -> Result<()> {
    on_stream(
        stream,
        "max_pool2d_backward",
        &[("indices", indices), ("dy", dy), ("dx", dx)],
    )?;
    let Some((plan, window)) = plan_max_pool2d_backward_gather(indices, dy, p, dx)? else {
        return Ok(());
    };
    let f = stream_function(stream, POOL, plan.entry)?;
    launch::max_backward_gather(
        stream,
        &f,
        indices.address(),
        dy.address(),
        dx.address(),
        &plan.layouts,
        &window,
        plan.n,
    )
}

/// Average pooling of `x` `[N, C, H, W]` into `out` `[N, C, OH, OW]` (same dtype;
/// `p.dilation` must be `[1, 1]`). PyTorch's divisor: with `count_include_pad` the window
/// clipped to the padded input (a `ceil_mode` extension past the padding is not counted),
/// otherwise the number of input elements in the window.
pub fn avg_pool2d(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    p: &Pool2d,
    count_include_pad: bool,
    out: &TensorMut,
) -> Result<()> {
    on_stream(stream, "avg_pool2d", &[("x", x), ("out", out)])?;
    let Some(plan) = plan_avg_pool2d(x, p, count_include_pad, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, POOL, plan.entry)?;
    launch::avg(
        stream,
        &f,
        x.address(),
        out.address(),
        &plan.layouts,
        plan.window,
        plan.count_include_pad,
        plan.n,
    )
}

/// Average pooling backward: writes every element of `dx` `[N, C, H, W]` with the sum of
/// `dy / divisor` over the windows containing it (`dy` is `[N, C, OH, OW]` for `dx`'s
/// H, W under `p`; deterministic, no atomics).
pub fn avg_pool2d_backward(
    stream: &Arc<CudaStream>,
    dy: &TensorRef,
    p: &Pool2d,
    count_include_pad: bool,
    dx: &TensorMut,
) -> Result<()> {
    on_stream(stream, "avg_pool2d_backward", &[("dy", dy), ("dx", dx)])?;
    let Some(plan) = plan_avg_pool2d_backward(dy, p, count_include_pad, dx)? else {
        return Ok(());
    };
    let f = stream_function(stream, POOL, plan.entry)?;
    launch::avg(
        stream,
        &f,
        dy.address(),
        dx.address(),
        &plan.layouts,
        plan.window,
        plan.count_include_pad,
        plan.n,
    )
}

/// Adaptive average pooling of `x` `[N, C, H, W]` into `out` `[N, C, OH, OW]` (any
/// positive OH, OW; same dtype): output `i` of `O` averages input
/// `floor(i * L / O) .. ceil((i + 1) * L / O)` on each spatial axis.
pub fn adaptive_avg_pool2d(stream: &Arc<CudaStream>, x: &TensorRef, out: &TensorMut) -> Result<()> {
    on_stream(stream, "adaptive_avg_pool2d", &[("x", x), ("out", out)])?;
    let Some(plan) = plan_adaptive_avg_pool2d(x, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, POOL, plan.entry)?;
    launch::adaptive(stream, &f, x.address(), out.address(), &plan.layouts, plan.n)
}

/// Adaptive average pooling backward: writes every element of `dx` `[N, C, H, W]` with
/// the sum of `dy / window size` over the windows containing it (deterministic).
pub fn adaptive_avg_pool2d_backward(stream: &Arc<CudaStream>, dy: &TensorRef, dx: &TensorMut) -> Result<()> {
    on_stream(stream, "adaptive_avg_pool2d_backward", &[("dy", dy), ("dx", dx)])?;
    let Some(plan) = plan_adaptive_avg_pool2d_backward(dy, dx)? else {
        return Ok(());
    };
    let f = stream_function(stream, POOL, plan.entry)?;
    launch::adaptive(stream, &f, dy.address(), dx.address(), &plan.layouts, plan.n)
}

#[cfg(test)]
mod tests {
    use super::*;

    use DataType::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
    }

    use crate::kernels::invalid_argument as invalid;

    fn pool(k: i64, s: i64, p: i64, d: i64, ceil: bool) -> Pool2d {
        Pool2d {
            kernel: [k, k],
            stride: [s, s],
            padding: [p, p],
            dilation: [d, d],
            ceil_mode: ceil,
        }
    }

    #[test]
    fn output_sizes_follow_pytorch() {
        // (H, k, s, p, d, ceil) -> OH, checked against torch.nn.functional.max_pool2d.
        for (h, k, s, p, d, ceil, want) in [
            (5, 2, 2, 0, 1, false, 2),
            (5, 2, 2, 0, 1, true, 3),
            (6, 3, 2, 1, 1, false, 3),
            (6, 3, 2, 1, 1, true, 4),
            (7, 3, 2, 1, 1, true, 4),
            (8, 3, 3, 0, 1, true, 3),
            (8, 3, 3, 0, 1, false, 2),
            (4, 2, 2, 0, 1, true, 2),
            (10, 3, 1, 1, 2, false, 8),
            (10, 3, 2, 0, 2, true, 4),
            (10, 3, 2, 0, 2, false, 3),
            (1, 1, 1, 0, 1, false, 1),
            (3, 3, 5, 1, 1, true, 1),
            (32, 7, 2, 3, 1, false, 16),
        ] {
            let got = pool(k, s, p, d, ceil).output_hw(h, h).unwrap();
            assert_eq!(got, [want, want], "H={h} k={k} s={s} p={p} d={d} ceil={ceil}");
        }
        let p = Pool2d {
            kernel: [2, 3],
            stride: [2, 1],
            padding: [1, 0],
            dilation: [1, 2],
            ceil_mode: false,
        };
        assert_eq!(p.output_hw(5, 9).unwrap(), [3, 5]);
    }

    #[test]
    fn invalid_geometry_is_an_error() {
        for bad in [
            pool(0, 1, 0, 1, false),
            pool(2, 0, 0, 1, false),
            pool(2, 1, 0, 0, false),
        ] {
            let (_, arg, why) = invalid(bad.output_hw(8, 8));
            assert_eq!(arg, "p");
            assert!(why.contains("positive"), "{why}");
        }
        let (_, arg, why) = invalid(pool(3, 1, 2, 1, false).output_hw(8, 8));
        assert_eq!(arg, "p");
        assert!(why.contains("half"), "{why}");
        assert_eq!(invalid(pool(3, 1, -1, 1, false).output_hw(8, 8)).1, "p");
        let (_, arg, why) = invalid(pool(3, 1, 0, 2, false).output_hw(4, 8));
        assert_eq!(arg, "x");
        assert!(why.contains("smaller"), "{why}");
        assert_eq!(invalid(pool(1, 1, 0, 1, false).output_hw(0, 8)).1, "x");
    }

    #[test]
    fn entry_names_by_dtype() {
        let p = pool(2, 2, 0, 1, false);
        for (d, s) in [(F32, "f32"), (F16, "f16"), (BF16, "bf16"), (F64, "f64")] {
            let x = t(&[2, 3, 8, 8], d);
            let o = t(&[2, 3, 4, 4], d);
            let i = t(&[2, 3, 4, 4], I64);
            let m = plan_max_pool2d(&x, &p, &o, &i).unwrap().unwrap();
            assert_eq!(m.entry, format!("maxpool2d_fwd_{s}"));
            assert_eq!(m.n, 96);
            let b = plan_max_pool2d_backward(&i, &o, &x).unwrap().unwrap();
            assert_eq!(b.entry, format!("maxpool2d_bwd_{s}"));
            assert_eq!(b.zero_entry, format!("pool_zero_b{}", d.size()));
            assert_eq!((b.n, b.zero_n), (96, 384));
            let a = plan_avg_pool2d(&x, &p, true, &o).unwrap().unwrap();
            assert_eq!(
                (a.entry, a.count_include_pad),
                (AVG_FWD[float_slot("t", "x", d).unwrap()], true)
            );
            assert_eq!(a.entry, format!("avgpool2d_fwd_{s}"));
            let a = plan_avg_pool2d_backward(&o, &p, false, &x).unwrap().unwrap();
            assert_eq!((a.entry, a.n), (AVG_BWD[float_slot("t", "x", d).unwrap()], 384));
            assert_eq!(a.entry, format!("avgpool2d_bwd_{s}"));
            let o = t(&[2, 3, 3, 5], d);
            let a = plan_adaptive_avg_pool2d(&x, &o).unwrap().unwrap();
            assert_eq!((a.entry, a.n), (ADAPTIVE_FWD[float_slot("t", "x", d).unwrap()], 90));
            assert_eq!(a.entry, format!("adaptive_avgpool2d_fwd_{s}"));
            let a = plan_adaptive_avg_pool2d_backward(&o, &x).unwrap().unwrap();
            assert_eq!(a.entry, format!("adaptive_avgpool2d_bwd_{s}"));
        }
        for d in [I32, I64, U8, Bool] {
            let (op, arg, why) = invalid(plan_avg_pool2d(&t(&[1, 1, 4, 4], d), &p, false, &t(&[1, 1, 2, 2], d)));
            assert_eq!((op, arg), ("avg_pool2d", "x"));
            assert!(why.contains(&format!("{d:?}")), "{why}");
        }
    }

    #[test]
    fn layouts_keep_the_four_dims_and_strides() {
        // NHWC-strided x [2, 3, 7, 6].
        let x = ts(&[2, 3, 7, 6], &[126, 1, 18, 3], BF16);
        let p = pool(3, 2, 1, 1, true);
        let out = t(&[2, 3, 4, 4], BF16);
        let idx = t(&[2, 3, 4, 4], I64);
        let m = plan_max_pool2d(&x, &p, &out, &idx).unwrap().unwrap();
        assert_eq!(m.layouts[0].rank, 4);
        assert_eq!(&m.layouts[0].shape[..4], &[2, 3, 7, 6]);
        assert_eq!(&m.layouts[0].strides[..4], &[126, 1, 18, 3]);
        assert_eq!(&m.layouts[1].strides[..4], &[48, 16, 4, 1]);
        assert_eq!(
            m.window,
            PoolWindow {
                kh: 3,
                kw: 3,
                sh: 2,
                sw: 2,
                ph: 1,
                pw: 1,
                dh: 1,
                dw: 1
            }
        );
        // Size-1 dims are kept (the kernels decode four coordinates).
        let x = t(&[1, 1, 4, 4], F32);
        let a = plan_adaptive_avg_pool2d(&x, &t(&[1, 1, 1, 1], F32)).unwrap().unwrap();
        assert_eq!(&a.layouts[1].shape[..4], &[1, 1, 1, 1]);
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let p = pool(2, 2, 0, 1, false);
        let x = t(&[2, 3, 8, 8], F32);
        let o = t(&[2, 3, 4, 4], F32);
        let i = t(&[2, 3, 4, 4], I64);
        // rank
        let (op, arg, why) = invalid(plan_max_pool2d(&t(&[3, 8, 8], F32), &p, &o, &i));
        assert_eq!((op, arg), ("max_pool2d_with_indices", "x"));
        assert!(why.contains("rank 3"), "{why}");
        // out dims / dtype, indices dtype / dims
        let (_, arg, why) = invalid(plan_max_pool2d(&x, &p, &t(&[2, 3, 5, 4], F32), &i));
        assert_eq!(arg, "out");
        assert!(why.contains("[2, 3, 4, 4]"), "{why}");
        assert_eq!(invalid(plan_max_pool2d(&x, &p, &t(&[2, 3, 4, 4], F16), &i)).1, "out");
        assert_eq!(
            invalid(plan_max_pool2d(&x, &p, &o, &t(&[2, 3, 4, 4], I32))).1,
            "indices"
        );
        assert_eq!(
            invalid(plan_max_pool2d(&x, &p, &o, &t(&[2, 3, 4, 3], I64))).1,
            "indices"
        );
        assert_eq!(invalid(plan_max_pool2d(&x, &pool(2, 2, 2, 1, false), &o, &i)).1, "p");
        // backward
        assert_eq!(
            invalid(plan_max_pool2d_backward(&t(&[2, 3, 4, 4], I32), &o, &x)).1,
            "indices"
        );
        assert_eq!(
            invalid(plan_max_pool2d_backward(&t(&[2, 3, 4, 5], I64), &o, &x)).1,
            "indices"
        );
        assert_eq!(
            invalid(plan_max_pool2d_backward(&i, &t(&[2, 3, 4, 4], F64), &x)).1,
            "dy"
        );
        assert_eq!(
            invalid(plan_max_pool2d_backward(&i, &o, &t(&[2, 4, 8, 8], F32))).1,
            "dy"
        );
        // avg: dilation, dims
        let (op, arg, why) = invalid(plan_avg_pool2d(&x, &pool(2, 2, 0, 2, false), false, &o));
        assert_eq!((op, arg), ("avg_pool2d", "p"));
        assert!(why.contains("dilation"), "{why}");
        assert_eq!(invalid(plan_avg_pool2d(&x, &p, false, &t(&[2, 3, 4, 3], F32))).1, "out");
        assert_eq!(
            invalid(plan_avg_pool2d_backward(&t(&[2, 3, 3, 4], F32), &p, true, &x)).1,
            "dy"
        );
        assert_eq!(
            invalid(plan_avg_pool2d_backward(
                &o,
                &pool(2, 2, 0, 1, true),
                true,
                &t(&[2, 3, 9, 9], F32)
            ))
            .1,
            "dy"
        );
        assert!(plan_avg_pool2d_backward(
            &t(&[2, 3, 5, 5], F32),
            &pool(2, 2, 0, 1, true),
            true,
            &t(&[2, 3, 9, 9], F32)
        )
        .is_ok());
        // adaptive
        assert_eq!(invalid(plan_adaptive_avg_pool2d(&x, &t(&[2, 2, 3, 3], F32))).1, "out");
        assert_eq!(invalid(plan_adaptive_avg_pool2d(&x, &t(&[2, 3, 0, 3], F32))).1, "out");
        assert_eq!(invalid(plan_adaptive_avg_pool2d(&t(&[2, 3, 0, 3], F32), &o)).1, "x");
        assert_eq!(
            invalid(plan_adaptive_avg_pool2d_backward(&o, &t(&[1, 3, 8, 8], F32))).1,
            "dy"
        );
        // strides, negative dims, null pointers
        assert_eq!(
            invalid(plan_avg_pool2d(&ts(&[2, 3, 8, 8], &[1, 1, 1], F32), &p, false, &o)).1,
            "x"
        );
        assert_eq!(
            invalid(plan_avg_pool2d(&ts(&[2, -3, 8, 8], &[1, 1, 1, 1], F32), &p, false, &o)).1,
            "x"
        );
        assert_eq!(
            invalid(plan_avg_pool2d(
                &x,
                &p,
                false,
                &TensorRef::fake_packed(&[2, 3, 4, 4], F32, 0)
            ))
            .1,
            "out"
        );
    }

    #[test]
    fn written_operands_must_not_overlap() {
        let p = pool(2, 2, 0, 1, false);
        let x = t(&[2, 3, 8, 8], F32);
        let o = t(&[2, 3, 4, 4], F32);
        let i = t(&[2, 3, 4, 4], I64);
        let bad = [0, 16, 4, 1];
        let (_, arg, why) = invalid(plan_max_pool2d(&x, &p, &ts(&[2, 3, 4, 4], &bad, F32), &i));
        assert_eq!(arg, "out");
        assert!(why.contains("overlap"), "{why}");
        assert_eq!(
            invalid(plan_max_pool2d(&x, &p, &o, &ts(&[2, 3, 4, 4], &bad, I64))).1,
            "indices"
        );
        assert_eq!(
            invalid(plan_max_pool2d_backward(
                &i,
                &o,
                &ts(&[2, 3, 8, 8], &[0, 64, 8, 1], F32)
            ))
            .1,
            "dx"
        );
        assert_eq!(
            invalid(plan_avg_pool2d(&x, &p, true, &ts(&[2, 3, 4, 4], &bad, F32))).1,
            "out"
        );
        // Broadcast inputs are fine.
        assert!(plan_avg_pool2d(&ts(&[2, 3, 8, 8], &[0, 0, 8, 1], F32), &p, true, &o).is_ok());
        assert!(plan_max_pool2d_backward(&ts(&[2, 3, 4, 4], &[0, 0, 4, 1], I64), &o, &x).is_ok());
    }

    #[test]
    fn empty_outputs_plan_nothing_but_still_validate() {
        let p = pool(2, 2, 0, 1, false);
        let x = t(&[0, 3, 8, 8], F32);
        let o = t(&[0, 3, 4, 4], F32);
        assert!(plan_max_pool2d(&x, &p, &o, &t(&[0, 3, 4, 4], I64)).unwrap().is_none());
        assert!(plan_avg_pool2d(&x, &p, false, &o).unwrap().is_none());
        assert!(plan_adaptive_avg_pool2d(&x, &t(&[0, 3, 0, 0], F32)).unwrap().is_none());
        assert!(plan_max_pool2d_backward(&t(&[0, 3, 4, 4], I64), &o, &x)
            .unwrap()
            .is_none());
        invalid(plan_avg_pool2d(&x, &p, false, &t(&[0, 3, 4, 4], F16)));
        invalid(plan_max_pool2d(&x, &p, &o, &t(&[0, 3, 4, 3], I64)));
        // An empty dy still zero-fills dx.
        let b = plan_max_pool2d_backward(&t(&[2, 3, 0, 0], I64), &t(&[2, 3, 0, 0], F32), &t(&[2, 3, 8, 8], F32))
            .unwrap()
            .unwrap();
        assert_eq!((b.n, b.zero_n), (0, 384));
    }
}
