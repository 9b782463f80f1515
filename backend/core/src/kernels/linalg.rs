//! Linear-algebra and quantization kernels: integer and exact float batched matmul, the
//! 3-vector cross product, and symmetric int8 quantize / dequantize (per tensor or per
//! block).
//!
//! Every function takes the stream first, validates all its arguments, and only enqueues
//! work (it never synchronizes). Written operands must not overlap themselves (no 0 or too
//! small stride). Empty outputs return `Ok(())` at once after validation.
//!
//! Host work is split in two: a pure `plan_*` function (validation, layouts, kernel
//! choice) that needs no device, and the launch of the planned kernels
//! (`kernels/linalg.cu`: `int_matmul_{i64,i32}`, `matmul_<dt>`, `cross3_<dt>`, and
//! `quant_scales_<dt>` + `quantize_<dt>` / `dequantize_<dt>`).
//!
//! **Quantization** follows burn's symmetric int8 scheme (`QuantValue::Q8S`, range
//! `[-127, 127]`, as burn-ndarray 0.21 computes it) on blocks of `block` consecutive
//! elements in row-major order (the whole tensor for `None`), one f32 scale per block:
//! `scale = (2 * max|x|) / 254` (a zero scale becomes 0.1, burn-ndarray's `valid_scale`),
//! `q = clamp(round(x / scale), -127, 127)` (round half away from zero, like Rust's
//! `f32::round`; NaN quantizes to 0), and `x' = scale * q`. Values are converted to f32
//! first. The quant ops need packed row-major (contiguous) operands; each scale is
//! reduced by one thread block, so a per-tensor scale of a large tensor is one block's
//! work.

use crate::kernels::check::{check_no_overlap, check_tensor, on_stream, same_dtype};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_linalg::{self as launch, MatmulShape};
use crate::graph::DataType;
use crate::kernels::layout::{broadcast_strides, coalesce, kernel_layout};
use crate::kernels::{stream_function, stream_functions, LINALG};
use crate::types::{TensorMut, TensorRef};

// ---------------------------------------------------------------------------------------
// Shared checks

/// Float dtype suffix of the cross and quant kernels.
fn float_suffix(op: &'static str, arg: &'static str, dtype: DataType) -> Result<&'static str> {
    Ok(match dtype {
        DataType::F32 => "f32",
        DataType::F16 => "f16",
        DataType::BF16 => "bf16",
        DataType::F64 => "f64",
        _ => {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("dtype {dtype:?} is not supported (F32, F16, BF16 or F64)"),
            ))
        }
    })
}

/// `broadcast_strides` with its error naming `arg`.
fn broadcast(op: &'static str, arg: &'static str, t: &TensorRef, shape: &[i64]) -> Result<Vec<i64>> {
    broadcast_strides(op, &t.dims, &t.strides, shape).map_err(|e| match e {
        Error::InvalidArgument { reason, .. } => Error::invalid_arg(op, arg, reason),
        e => e,
    })
}

// ---------------------------------------------------------------------------------------
// int_matmul and matmul

/// The planned `int_matmul_<dt>` or `matmul_<dt>` launch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MatmulPlan {
    pub entry: &'static str,
    /// Batch layouts of (a, b, c) over the coalesced batch shape (stride 0 where broadcast).
    pub batch_layouts: [KernelLayout; 3],
    pub shape: MatmulShape,
}

pub(crate) fn plan_int_matmul(a: &TensorRef, b: &TensorRef, c: &TensorRef) -> Result<Option<MatmulPlan>> {
    const OP: &str = "int_matmul";
    let entry = match a.dtype {
        DataType::I64 => "int_matmul_i64",
        DataType::I32 => "int_matmul_i32",
        d => {
            return Err(Error::invalid_arg(
                OP,
                "a",
                format!("dtype {d:?} is not supported (I64 or I32)"),
            ))
        }
    };
    plan_batched_matmul(OP, entry, a, b, c)
}

pub(crate) fn plan_matmul(a: &TensorRef, b: &TensorRef, c: &TensorRef) -> Result<Option<MatmulPlan>> {
    const OP: &str = "matmul";
    let entry = match float_suffix(OP, "a", a.dtype)? {
        "f32" => "matmul_f32",
        "f16" => "matmul_f16",
        "bf16" => "matmul_bf16",
        _ => "matmul_f64",
    };
    plan_batched_matmul(OP, entry, a, b, c)
}

/// Shared validation and layout of the batched matmuls (`entry` chosen from a's dtype).
fn plan_batched_matmul(
    op: &'static str,
    entry: &'static str,
    a: &TensorRef,
    b: &TensorRef,
    c: &TensorRef,
) -> Result<Option<MatmulPlan>> {
    check_tensor(op, "a", a)?;
    check_tensor(op, "b", b)?;
    let numel = check_tensor(op, "c", c)?;
    same_dtype(op, "b", b, a.dtype, "a")?;
    same_dtype(op, "c", c, a.dtype, "a")?;
    let r = c.dims.len();
    if r < 2 {
        return Err(Error::invalid_arg(
            op,
            "c",
            format!("rank {r} ({:?}) is below 2", c.dims),
        ));
    }
    for (arg, t) in [("a", a), ("b", b)] {
        if t.dims.len() != r {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "rank {} ({:?}) differs from c's rank {r} ({:?})",
                    t.dims.len(),
                    t.dims,
                    c.dims
                ),
            ));
        }
    }
    let (m, n, k) = (c.dims[r - 2], c.dims[r - 1], a.dims[r - 1]);
    if a.dims[r - 2] != m {
        return Err(Error::invalid_arg(
            op,
            "a",
            format!(
                "M = {} differs from c's {m} (a {:?}, c {:?})",
                a.dims[r - 2],
                a.dims,
                c.dims
            ),
        ));
    }
    if b.dims[r - 2] != k {
        return Err(Error::invalid_arg(
            op,
            "b",
            format!(
                "K = {} differs from a's {k} (a {:?}, b {:?})",
                b.dims[r - 2],
                a.dims,
                b.dims
            ),
        ));
    }
    if b.dims[r - 1] != n {
        return Err(Error::invalid_arg(
            op,
            "b",
            format!(
                "N = {} differs from c's {n} (b {:?}, c {:?})",
                b.dims[r - 1],
                b.dims,
                c.dims
            ),
        ));
    }
    let batch = &c.dims[..r - 2];
    let mut batch_strides = vec![c.strides[..r - 2].to_vec()];
    for (arg, t) in [("a", a), ("b", b)] {
        let mut s = Vec::with_capacity(r - 2);
        for (d, (&td, &cd)) in t.dims[..r - 2].iter().zip(batch).enumerate() {
            if td != cd && td != 1 {
                return Err(Error::invalid_arg(
                    op,
                    arg,
                    format!(
                        "batch dim {d} is {td}, neither 1 nor c's {cd} ({arg} {:?}, c {:?})",
                        t.dims, c.dims
                    ),
                ));
            }
            s.push(if td == cd { t.strides[d] } else { 0 });
        }
        batch_strides.insert(batch_strides.len() - 1, s);
    }
    // batch_strides is now [a, b, c].
    check_no_overlap(op, "c", c)?;
    if numel == 0 {
        return Ok(None);
    }
    let (bshape, bstrides) = coalesce(batch, &batch_strides);
    let mut batch_layouts = [KernelLayout::default(); 3];
    for (l, s) in batch_layouts.iter_mut().zip(&bstrides) {
        *l = kernel_layout(op, &bshape, s)?;
    }
    Ok(Some(MatmulPlan {
        entry,
        batch_layouts,
        shape: MatmulShape {
            batches: batch.iter().product(),
            m,
            n,
            k,
            strides: [
                a.strides[r - 2],
                a.strides[r - 1],
                b.strides[r - 2],
                b.strides[r - 1],
                c.strides[r - 2],
                c.strides[r - 1],
            ],
        },
    }))
}

// ---------------------------------------------------------------------------------------
// cross3

/// The planned `cross3_<dt>` launch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cross3Plan {
    pub entry: &'static str,
    /// Layouts of (a, b, out) over out's dims without the axis.
    pub layouts: [KernelLayout; 3],
    /// Steps along the axis of (a, b, out).
    pub axis_strides: [i64; 3],
    pub n: i64,
}

pub(crate) fn plan_cross3(a: &TensorRef, b: &TensorRef, axis: usize, out: &TensorRef) -> Result<Option<Cross3Plan>> {
    const OP: &str = "cross3";
    check_tensor(OP, "a", a)?;
    check_tensor(OP, "b", b)?;
    let numel = check_tensor(OP, "out", out)?;
    let suffix = float_suffix(OP, "out", out.dtype)?;
    same_dtype(OP, "a", a, out.dtype, "out")?;
    same_dtype(OP, "b", b, out.dtype, "out")?;
    let r = out.dims.len();
    if axis >= r {
        return Err(Error::invalid_arg(
            OP,
            "axis",
            format!("axis {axis} is out of range for out of rank {r}"),
        ));
    }
    if out.dims[axis] != 3 {
        return Err(Error::invalid_arg(
            OP,
            "out",
            format!("dim {axis} of {:?} is {}, not 3", out.dims, out.dims[axis]),
        ));
    }
    let mut strides = Vec::with_capacity(3);
    for (arg, t) in [("a", a), ("b", b)] {
        let s = broadcast(OP, arg, t, &out.dims)?;
        let lead = r - t.dims.len();
        if axis < lead || t.dims[axis - lead] != 3 {
            return Err(Error::invalid_arg(
                OP,
                arg,
                format!(
                    "dims {:?} (aligned to out's {:?}) need size 3 along axis {axis}: the vector dim does not broadcast",
                    t.dims, out.dims
                ),
            ));
        }
        strides.push(s);
    }
    strides.push(out.strides.to_vec());
    check_no_overlap(OP, "out", out)?;
    if numel == 0 {
        return Ok(None);
    }
    let axis_strides = [strides[0][axis], strides[1][axis], strides[2][axis]];
    let shape: Vec<i64> = out
        .dims
        .iter()
        .enumerate()
        .filter(|&(d, _)| d != axis)
        .map(|(_, &x)| x)
        .collect();
    let rest: Vec<Vec<i64>> = strides
        .iter()
        .map(|s| {
            s.iter()
                .enumerate()
                .filter(|&(d, _)| d != axis)
                .map(|(_, &x)| x)
                .collect()
        })
        .collect();
    let (shape, rest) = coalesce(&shape, &rest);
    let mut layouts = [KernelLayout::default(); 3];
    for (l, s) in layouts.iter_mut().zip(&rest) {
        *l = kernel_layout(OP, &shape, s)?;
    }
    Ok(Some(Cross3Plan {
        entry: match suffix {
            "f32" => "cross3_f32",
            "f16" => "cross3_f16",
            "bf16" => "cross3_bf16",
            _ => "cross3_f64",
        },
        layouts,
        axis_strides,
        n: numel / 3,
    }))
}

// ---------------------------------------------------------------------------------------
// quantize / dequantize

/// The planned quant kernels: `scales_entry` (quantize only) computes one scale per block,
/// `entry` then (de)quantizes `n` elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QuantPlan {
    pub scales_entry: &'static str,
    pub entry: &'static str,
    /// Elements per scale.
    pub block: i64,
    /// Number of scales.
    pub nblocks: i64,
    /// Number of elements.
    pub n: i64,
}

/// True when `t` is packed in row-major order (size-1 dims may have any stride).
fn is_row_major(t: &TensorRef) -> bool {
    let mut expect = 1i64;
    for (&d, &s) in t.dims.iter().zip(&t.strides).rev() {
        if d != 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(d);
    }
    true
}

fn check_row_major(op: &'static str, arg: &'static str, t: &TensorRef) -> Result<()> {
    if !is_row_major(t) {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!(
                "dims {:?} with strides {:?} are not packed row-major (contiguous); make a contiguous copy first",
                t.dims, t.strides
            ),
        ));
    }
    Ok(())
}

/// Checks that two packed operands' byte ranges do not intersect.
fn check_disjoint(op: &'static str, arg: &'static str, t: &TensorRef, other: &str, u: &TensorRef) -> Result<()> {
    let range = |t: &TensorRef| {
        let bytes = (t.numel().max(0) as u64).saturating_mul(t.dtype.size() as u64);
        (t.ptr, t.ptr.saturating_add(bytes))
    };
    let ((a0, a1), (b0, b1)) = (range(t), range(u));
    if a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
        return Err(Error::invalid_arg(
            op,
            arg,
            format!("memory overlaps {other}'s (written operands must not alias the others)"),
        ));
    }
    Ok(())
}

/// Shared validation of the quant ops: `data` is the float side (x or out), `q` the I8
/// side. Returns (suffix, block, nblocks, n).
fn plan_quant_common(
    op: &'static str,
    (data_arg, data): (&'static str, &TensorRef),
    (q_arg, q): (&'static str, &TensorRef),
    block: Option<usize>,
    scales: &TensorRef,
) -> Result<(&'static str, i64, i64, i64)> {
    let n = check_tensor(op, data_arg, data)?;
    check_tensor(op, q_arg, q)?;
    let ns = check_tensor(op, "scales", scales)?;
    let suffix = float_suffix(op, data_arg, data.dtype)?;
    if q.dtype != DataType::I8 {
        return Err(Error::invalid_arg(op, q_arg, format!("dtype {:?} is not I8", q.dtype)));
    }
    if scales.dtype != DataType::F32 {
        return Err(Error::invalid_arg(
            op,
            "scales",
            format!("dtype {:?} is not F32", scales.dtype),
        ));
    }
    if q.dims != data.dims {
        return Err(Error::invalid_arg(
            op,
            q_arg,
            format!("dims {:?} differ from {data_arg}'s {:?}", q.dims, data.dims),
        ));
    }
    for (arg, t) in [(data_arg, data), (q_arg, q), ("scales", scales)] {
        check_row_major(op, arg, t)?;
    }
    let (block, nblocks) = match block {
        None => (n.max(1), 1),
        Some(0) => return Err(Error::invalid_arg(op, "block", "block size 0")),
        Some(b) => {
            let b = i64::try_from(b)
                .map_err(|_| Error::invalid_arg(op, "block", format!("block size {b} is too large")))?;
            if n % b != 0 {
                return Err(Error::invalid_arg(
                    op,
                    "block",
                    format!(
                        "block size {b} does not divide the {n} elements of {data_arg} {:?}",
                        data.dims
                    ),
                ));
            }
            (b, n / b)
        }
    };
    if ns != nblocks {
        return Err(Error::invalid_arg(
            op,
            "scales",
            format!(
                "{ns} elements ({:?}), expected {nblocks} (one per block of {block})",
                scales.dims
            ),
        ));
    }
    Ok((suffix, block, nblocks, n))
}

pub(crate) fn plan_quantize(
    x: &TensorRef,
    block: Option<usize>,
    scales: &TensorRef,
    out: &TensorRef,
) -> Result<Option<QuantPlan>> {
    const OP: &str = "quantize_symmetric_i8";
    let (suffix, block, nblocks, n) = plan_quant_common(OP, ("x", x), ("out", out), block, scales)?;
    check_no_overlap(OP, "out", out)?;
    check_no_overlap(OP, "scales", scales)?;
    check_disjoint(OP, "out", out, "x", x)?;
    check_disjoint(OP, "scales", scales, "x", x)?;
    check_disjoint(OP, "scales", scales, "out", out)?;
    if n == 0 {
        return Ok(None);
    }
    let (scales_entry, entry) = match suffix {
        "f32" => ("quant_scales_f32", "quantize_f32"),
        "f16" => ("quant_scales_f16", "quantize_f16"),
        "bf16" => ("quant_scales_bf16", "quantize_bf16"),
        _ => ("quant_scales_f64", "quantize_f64"),
    };
    Ok(Some(QuantPlan {
        scales_entry,
        entry,
        block,
        nblocks,
        n,
    }))
}

pub(crate) fn plan_dequantize(
    q: &TensorRef,
    block: Option<usize>,
    scales: &TensorRef,
    out: &TensorRef,
) -> Result<Option<QuantPlan>> {
    const OP: &str = "dequantize_symmetric_i8";
    let (suffix, block, nblocks, n) = plan_quant_common(OP, ("out", out), ("q", q), block, scales)?;
    check_no_overlap(OP, "out", out)?;
    check_disjoint(OP, "out", out, "q", q)?;
    check_disjoint(OP, "out", out, "scales", scales)?;
    if n == 0 {
        return Ok(None);
    }
    let entry = match suffix {
        "f32" => "dequantize_f32",
        "f16" => "dequantize_f16",
        "bf16" => "dequantize_bf16",
        _ => "dequantize_f64",
    };
    Ok(Some(QuantPlan {
        scales_entry: "",
        entry,
        block,
        nblocks,
        n,
    }))
}

// ---------------------------------------------------------------------------------------
// Public API

/// `c[.., M, N] = a[.., M, K] · b[.., K, N]` on `I64` or `I32` (all three the same dtype)
/// with wrapping arithmetic accumulated in 64 bits (an `I32` result is the wrapped 32-bit
/// sum). One rank ≥ 2 for all three; batch dims of `a` and `b` are 1 or c's (broadcast, as
/// in [`crate::ops::matmul`]). Transposed operands are just strides. `K = 0` writes zeros.
pub fn int_matmul(stream: &Arc<CudaStream>, a: &TensorRef, b: &TensorRef, c: &TensorMut) -> Result<()> {
    on_stream(stream, "int_matmul", &[("a", a), ("b", b), ("c", c)])?;
    let Some(p) = plan_int_matmul(a, b, c)? else {
        return Ok(());
    };
    let f = stream_function(stream, LINALG, p.entry)?;
    launch::batched_matmul(
        stream,
        &f,
        [a.address(), b.address(), c.address()],
        &p.batch_layouts,
        &p.shape,
    )
}

/// `c[.., M, N] = a[.., M, K] · b[.., K, N]` on F32, F64, F16 or BF16 (all three the same
/// dtype), computed exactly: every product and partial sum in f64 (no TF32, no reduced
/// precision), rounded once to c's dtype. Shapes, broadcast batch dims (size 1 or stride 0)
/// and arbitrary strides as [`int_matmul`]; `K = 0` writes zeros. A simple tiled kernel:
/// for accuracy-critical or F64 products, not a replacement for cuDNN's fast matmul.
pub fn matmul(stream: &Arc<CudaStream>, a: &TensorRef, b: &TensorRef, c: &TensorMut) -> Result<()> {
    on_stream(stream, "matmul", &[("a", a), ("b", b), ("c", c)])?;
    let Some(p) = plan_matmul(a, b, c)? else {
        return Ok(());
    };
    let f = stream_function(stream, LINALG, p.entry)?;
    launch::batched_matmul(
        stream,
        &f,
        [a.address(), b.address(), c.address()],
        &p.batch_layouts,
        &p.shape,
    )
}

/// `out = a × b`, the 3-vector cross product along `axis` (where `out` has size 3; `a`
/// and `b` also have size 3 there and broadcast to `out` on every other dim). All three
/// have one dtype: F32, F16, BF16 or F64 (f32/f64 computed in double, halfs in f32).
pub fn cross3(stream: &Arc<CudaStream>, a: &TensorRef, b: &TensorRef, axis: usize, out: &TensorMut) -> Result<()> {
    on_stream(stream, "cross3", &[("a", a), ("b", b), ("out", out)])?;
    let Some(p) = plan_cross3(a, b, axis, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, LINALG, p.entry)?;
    launch::cross3(
        stream,
        &f,
        [a.address(), b.address(), out.address()],
        &p.layouts,
        p.axis_strides,
        p.n,
    )
}

/// Symmetric int8 quantization of `x` (F32, F16, BF16 or F64, packed row-major) into
/// `out` (I8, x's dims, packed row-major): computes the scales first (into `scales`, F32
/// packed, one per block of `block` consecutive elements, or exactly one for `None`), then
/// quantizes; see the module docs for the formula. `block` must divide x's element count.
/// `out` and `scales` must not alias `x` or each other.
pub fn quantize_symmetric_i8(
    stream: &Arc<CudaStream>,
    x: &TensorRef,
    block: Option<usize>,
    scales: &TensorRef,
    out: &TensorMut,
) -> Result<()> {
    on_stream(
        stream,
        "quantize_symmetric_i8",
        &[("x", x), ("scales", scales), ("out", out)],
    )?;
    let Some(p) = plan_quantize(x, block, scales, out)? else {
        return Ok(());
    };
    let [fs, fq] = stream_functions(stream, LINALG, [p.scales_entry, p.entry])?;
    launch::quant_scales(stream, &fs, x.address(), scales.address(), p.block, p.nblocks)?;
    launch::quantize(stream, &fq, x.address(), scales.address(), out.address(), p.block, p.n)
}

/// `out = scale * q` per block: `q` (I8, packed row-major), `scales` (F32 packed, one per
/// block of `block` consecutive elements, or one for `None`), `out` (F32, F16, BF16 or
/// F64, q's dims, packed row-major; the product is computed in f32).
pub fn dequantize_symmetric_i8(
    stream: &Arc<CudaStream>,
    q: &TensorRef,
    block: Option<usize>,
    scales: &TensorRef,
    out: &TensorMut,
) -> Result<()> {
    on_stream(
        stream,
        "dequantize_symmetric_i8",
        &[("q", q), ("scales", scales), ("out", out)],
    )?;
    let Some(p) = plan_dequantize(q, block, scales, out)? else {
        return Ok(());
    };
    let f = stream_function(stream, LINALG, p.entry)?;
    launch::dequantize(stream, &f, q.address(), scales.address(), out.address(), p.block, p.n)
}

#[cfg(test)]
mod tests {
    use super::*;

    use DataType::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn tp(dims: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, ptr)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
    }

    use crate::kernels::invalid_argument as invalid;

    #[test]
    fn int_matmul_broadcasts_batches_and_carries_strides() {
        // a [2, 1, 4, 5], b [1, 3, 5, 6] transposed, c [2, 3, 4, 6].
        let a = t(&[2, 1, 4, 5], I64);
        let b = ts(&[1, 3, 5, 6], &[90, 30, 1, 5], I64);
        let c = t(&[2, 3, 4, 6], I64);
        let p = plan_int_matmul(&a, &b, &c).unwrap().unwrap();
        assert_eq!(p.entry, "int_matmul_i64");
        assert_eq!(
            p.shape,
            MatmulShape {
                batches: 6,
                m: 4,
                n: 6,
                k: 5,
                strides: [5, 1, 1, 5, 6, 1],
            }
        );
        assert_eq!(p.batch_layouts[0].rank, 2);
        assert_eq!(&p.batch_layouts[0].strides[..2], &[20, 0]);
        assert_eq!(&p.batch_layouts[1].strides[..2], &[0, 30]);
        assert_eq!(&p.batch_layouts[2].strides[..2], &[72, 24]);
        // Equal packed batch dims merge; rank 2 has an empty batch layout.
        let p = plan_int_matmul(&t(&[2, 3, 4, 5], I32), &t(&[2, 3, 5, 6], I32), &t(&[2, 3, 4, 6], I32))
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.entry, p.shape.batches, p.batch_layouts[0].rank),
            ("int_matmul_i32", 6, 1)
        );
        assert_eq!(p.batch_layouts[1].strides[0], 30);
        let p = plan_int_matmul(&t(&[4, 0], I64), &t(&[0, 6], I64), &t(&[4, 6], I64))
            .unwrap()
            .unwrap();
        assert_eq!((p.shape.batches, p.shape.k, p.batch_layouts[2].rank), (1, 0, 0));
        assert!(plan_int_matmul(&t(&[0, 5], I64), &t(&[5, 6], I64), &t(&[0, 6], I64))
            .unwrap()
            .is_none());
    }

    #[test]
    fn int_matmul_errors_name_the_argument() {
        let a = t(&[4, 5], I64);
        let b = t(&[5, 6], I64);
        let c = t(&[4, 6], I64);
        let (op, arg, why) = invalid(plan_int_matmul(&t(&[4, 5], F32), &b, &c));
        assert_eq!((op, arg), ("int_matmul", "a"));
        assert!(why.contains("F32"), "{why}");
        assert_eq!(invalid(plan_int_matmul(&a, &t(&[5, 6], I32), &c)).1, "b");
        assert_eq!(invalid(plan_int_matmul(&a, &b, &t(&[4, 6], I32))).1, "c");
        assert_eq!(
            invalid(plan_int_matmul(&t(&[4], I64), &t(&[4], I64), &t(&[4], I64))).1,
            "c"
        );
        assert_eq!(
            invalid(plan_int_matmul(&t(&[1, 4, 5], I64), &b, &t(&[1, 4, 6], I64))).1,
            "b"
        );
        assert_eq!(invalid(plan_int_matmul(&t(&[3, 5], I64), &b, &c)).1, "a");
        let (_, arg, why) = invalid(plan_int_matmul(&a, &t(&[4, 6], I64), &c));
        assert_eq!(arg, "b");
        assert!(why.contains("K = 4"), "{why}");
        assert_eq!(invalid(plan_int_matmul(&a, &t(&[5, 7], I64), &c)).1, "b");
        let (_, arg, why) = invalid(plan_int_matmul(
            &t(&[2, 4, 5], I64),
            &t(&[1, 5, 6], I64),
            &t(&[3, 4, 6], I64),
        ));
        assert_eq!(arg, "a");
        assert!(why.contains("batch dim 0"), "{why}");
        let (_, arg, why) = invalid(plan_int_matmul(&a, &b, &ts(&[4, 6], &[1, 0], I64)));
        assert_eq!(arg, "c");
        assert!(why.contains("overlap"), "{why}");
        assert_eq!(
            invalid(plan_int_matmul(&a, &b, &TensorRef::fake_packed(&[4, 6], I64, 0))).1,
            "c"
        );
    }

    #[test]
    fn float_matmul_plans_every_float_dtype() {
        for (d, e) in [
            (F32, "matmul_f32"),
            (F64, "matmul_f64"),
            (F16, "matmul_f16"),
            (BF16, "matmul_bf16"),
        ] {
            // a [3, 4, 5] expanded (stride 0) over the batch, b [1, 5, 6] transposed.
            let a = ts(&[3, 4, 5], &[0, 5, 1], d);
            let b = ts(&[1, 5, 6], &[30, 1, 5], d);
            let c = t(&[3, 4, 6], d);
            let p = plan_matmul(&a, &b, &c).unwrap().unwrap();
            assert_eq!(p.entry, e);
            assert_eq!(
                p.shape,
                MatmulShape {
                    batches: 3,
                    m: 4,
                    n: 6,
                    k: 5,
                    strides: [5, 1, 1, 5, 6, 1],
                }
            );
            assert_eq!(p.batch_layouts[0].rank, 1);
            assert_eq!(
                (
                    p.batch_layouts[0].strides[0],
                    p.batch_layouts[1].strides[0],
                    p.batch_layouts[2].strides[0]
                ),
                (0, 0, 24)
            );
        }
        assert!(plan_matmul(&t(&[0, 5], F32), &t(&[5, 6], F32), &t(&[0, 6], F32))
            .unwrap()
            .is_none());
        let (op, arg, why) = invalid(plan_matmul(&t(&[4, 5], I64), &t(&[5, 6], I64), &t(&[4, 6], I64)));
        assert_eq!((op, arg), ("matmul", "a"));
        assert!(why.contains("I64"), "{why}");
        assert_eq!(
            invalid(plan_matmul(&t(&[4, 5], F32), &t(&[5, 6], F16), &t(&[4, 6], F32))).1,
            "b"
        );
        let (op, arg, why) = invalid(plan_matmul(&t(&[4, 5], F64), &t(&[4, 6], F64), &t(&[4, 6], F64)));
        assert_eq!((op, arg), ("matmul", "b"));
        assert!(why.contains("K = 4"), "{why}");
        assert_eq!(
            invalid(plan_matmul(
                &t(&[4, 5], F32),
                &t(&[5, 6], F32),
                &ts(&[4, 6], &[0, 1], F32)
            ))
            .1,
            "c"
        );
    }

    #[test]
    fn cross3_layouts_drop_the_axis() {
        // a [4, 3] broadcast over out [2, 4, 3]; b [2, 4, 3] with the vector dim first.
        let a = t(&[4, 3], F32);
        let b = ts(&[2, 4, 3], &[4, 1, 8], F32);
        let out = t(&[2, 4, 3], F32);
        let p = plan_cross3(&a, &b, 2, &out).unwrap().unwrap();
        assert_eq!((p.entry, p.n), ("cross3_f32", 8));
        assert_eq!(p.axis_strides, [1, 8, 1]);
        assert_eq!(p.layouts[0].rank, 2);
        assert_eq!(&p.layouts[0].strides[..2], &[0, 3]);
        assert_eq!(&p.layouts[1].strides[..2], &[4, 1]);
        assert_eq!(&p.layouts[2].strides[..2], &[12, 3]);
        for (d, e) in [(F16, "cross3_f16"), (BF16, "cross3_bf16"), (F64, "cross3_f64")] {
            let v = t(&[3], d);
            assert_eq!(plan_cross3(&v, &v, 0, &t(&[3], d)).unwrap().unwrap().entry, e);
        }
        assert!(plan_cross3(&t(&[0, 3], F32), &t(&[3], F32), 1, &t(&[0, 3], F32))
            .unwrap()
            .is_none());
    }

    #[test]
    fn cross3_errors_name_the_argument() {
        let v = t(&[5, 3], F32);
        let (op, arg, why) = invalid(plan_cross3(&v, &v, 0, &t(&[5, 3], F32)));
        assert_eq!((op, arg), ("cross3", "out"));
        assert!(why.contains("not 3"), "{why}");
        assert_eq!(invalid(plan_cross3(&v, &v, 2, &v)).1, "axis");
        assert_eq!(invalid(plan_cross3(&t(&[5, 3], I32), &v, 1, &v)).1, "a");
        assert_eq!(invalid(plan_cross3(&v, &v, 1, &t(&[5, 3], I64))).1, "out");
        assert_eq!(invalid(plan_cross3(&v, &t(&[5, 3], F16), 1, &v)).1, "b");
        let (_, arg, why) = invalid(plan_cross3(&t(&[5, 1], F32), &v, 1, &v));
        assert_eq!(arg, "a");
        assert!(why.contains("does not broadcast"), "{why}");
        assert_eq!(invalid(plan_cross3(&v, &t(&[4, 3], F32), 1, &v)).1, "b");
        assert_eq!(invalid(plan_cross3(&v, &v, 1, &ts(&[5, 3], &[0, 1], F32))).1, "out");
    }

    #[test]
    fn quant_plans_blocks_and_entries() {
        let x = tp(&[4, 8], F32, 0x1000);
        let s = tp(&[1], F32, 0x2000);
        let q = tp(&[4, 8], I8, 0x3000);
        let p = plan_quantize(&x, None, &s, &q).unwrap().unwrap();
        assert_eq!(
            p,
            QuantPlan {
                scales_entry: "quant_scales_f32",
                entry: "quantize_f32",
                block: 32,
                nblocks: 1,
                n: 32,
            }
        );
        let s4 = tp(&[4, 1], F32, 0x2000);
        let p = plan_quantize(&tp(&[4, 8], BF16, 0x1000), Some(8), &s4, &q)
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.scales_entry, p.entry, p.block, p.nblocks),
            ("quant_scales_bf16", "quantize_bf16", 8, 4)
        );
        let p = plan_dequantize(&q, Some(8), &s4, &tp(&[4, 8], F16, 0x1000))
            .unwrap()
            .unwrap();
        assert_eq!((p.entry, p.block, p.nblocks, p.n), ("dequantize_f16", 8, 4, 32));
        // Size-1 dims may have any stride; empty tensors plan nothing.
        let x1 = TensorRef::fake(&[1, 32], &[7, 1], F64, 0x1000);
        assert_eq!(
            plan_quantize(&x1, Some(16), &tp(&[2], F32, 0x2000), &tp(&[1, 32], I8, 0x3000))
                .unwrap()
                .unwrap()
                .entry,
            "quantize_f64"
        );
        assert!(plan_quantize(
            &tp(&[0, 8], F32, 0x1000),
            Some(8),
            &tp(&[0], F32, 0x2000),
            &tp(&[0, 8], I8, 0)
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn quant_errors_name_the_argument() {
        let x = tp(&[4, 8], F32, 0x1000);
        let s = tp(&[1], F32, 0x2000);
        let q = tp(&[4, 8], I8, 0x3000);
        const QOP: &str = "quantize_symmetric_i8";
        const DOP: &str = "dequantize_symmetric_i8";
        let (op, arg, why) = invalid(plan_quantize(&tp(&[4, 8], I32, 0x1000), None, &s, &q));
        assert_eq!((op, arg), (QOP, "x"));
        assert!(why.contains("I32"), "{why}");
        assert_eq!(invalid(plan_quantize(&x, None, &s, &tp(&[4, 8], U8, 0x3000))).1, "out");
        assert_eq!(invalid(plan_quantize(&x, None, &tp(&[1], F16, 0x2000), &q)).1, "scales");
        assert_eq!(invalid(plan_quantize(&x, None, &s, &tp(&[8, 4], I8, 0x3000))).1, "out");
        let (_, arg, why) = invalid(plan_quantize(&x, Some(5), &s, &q));
        assert_eq!(arg, "block");
        assert!(why.contains("does not divide"), "{why}");
        assert_eq!(invalid(plan_quantize(&x, Some(0), &s, &q)).1, "block");
        let (_, arg, why) = invalid(plan_quantize(&x, Some(8), &s, &q));
        assert_eq!(arg, "scales");
        assert!(why.contains("expected 4"), "{why}");
        let xt = TensorRef::fake(&[4, 8], &[1, 4], F32, 0x1000);
        let (_, arg, why) = invalid(plan_quantize(&xt, None, &s, &q));
        assert_eq!(arg, "x");
        assert!(why.contains("row-major"), "{why}");
        let gapped = TensorRef::fake(&[4, 8], &[16, 1], I8, 0x3000);
        assert_eq!(invalid(plan_quantize(&x, None, &s, &gapped)).1, "out");
        // Aliasing.
        assert_eq!(invalid(plan_quantize(&x, None, &s, &tp(&[4, 8], I8, 0x1010))).1, "out");
        assert_eq!(invalid(plan_quantize(&x, None, &tp(&[1], F32, 0x3004), &q)).1, "scales");
        // dequantize
        let (op, arg, _) = invalid(plan_dequantize(&q, None, &s, &tp(&[4, 8], I64, 0x1000)));
        assert_eq!((op, arg), (DOP, "out"));
        assert_eq!(invalid(plan_dequantize(&tp(&[4, 8], U8, 0x3000), None, &s, &x)).1, "q");
        assert_eq!(invalid(plan_dequantize(&q, Some(16), &s, &x)).1, "scales");
        assert_eq!(
            invalid(plan_dequantize(&q, None, &s, &tp(&[4, 8], F32, 0x3008))).1,
            "out"
        );
        assert_eq!(
            invalid(plan_dequantize(&q, None, &s, &TensorRef::fake_packed(&[4, 8], F32, 0))).1,
            "out"
        );
    }
}
