//! Quantized tensor ops (`QTensorOps`).
//!
//! Supported, as in burn-ndarray 0.21: symmetric int8 quantization (`Q8S`, range
//! `[-127, 127]`, and `Q8F`, range `[-128, 127]`), one scale per tensor
//! (`QuantLevel::Tensor`) or per block of `block_size.num_elements()` consecutive elements in
//! row-major order (`QuantLevel::Block`, any block shape), with any `QuantParam` (the scales
//! stay f32 whatever the param type, as burn-ndarray keeps and serializes them). Storage:
//! `QuantStore::Native`, and Burn's default `QuantStore::PackedU32(0)` (four 8-bit values per
//! u32 word along the innermost dim, which for 8-bit values is the native byte order: the
//! values are held as i8 on the device and the tensor keeps and reports the scheme it was
//! given, so `q_into_data` returns data of that scheme).
//! `q = clamp(round(x / scale), a, b)` (round half away from zero) and `x' = scale * q`, where a
//! zero scale counts as 0.1 (burn-ndarray's `valid_scale`). The primitive keeps the scales as
//! given (what `q_into_data` returns); the 0.1 substitution happens where they are used.
//!
//! Layout ops (reshape, permute, expand, flip, select, slice, gather, ...) act on the int8 values
//! directly when the scales stay valid: always for a per-tensor scale, and for per-block
//! scales when the op keeps every element's row-major position (reshape, or a permute/expand
//! that is a no-op on the order). Otherwise a per-block tensor goes through dequantize →
//! float op → dynamic re-quantization with the same scheme (burn-ndarray keeps the old
//! scales, which no longer match the blocks). Arithmetic ops keep Burn's defaults.

use burn_backend::ops::*;
use burn_backend::quantization::{
    QuantLevel, QuantMode, QuantScheme, QuantStore, QuantValue, QuantizationParametersPrimitive, QuantizedBytes,
};
use burn_backend::tensor::{FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::*;
use std::future::Future;

use crate::burn::data::{execution_error, q_data, read_batch};
use crate::burn::structure as st;
use crate::burn::tensor::{expect, to_dims, CudnnTensor};
use crate::burn::{data, exec, Cudnn, CudnnDevice, CudnnQTensor};
use crate::error::{Error, Result};
use crate::ops::elementwise::{BinaryOp, CompareOp, UnaryOp};
use crate::ops::{linalg, reduce};
use crate::view::ViewLayout;

/// Whether the backend implements quantization scheme `scheme`: symmetric, per-tensor or
/// per-block, Q8F or Q8S values, native or `PackedU32(0)` storage, any param type (scales
/// kept in f32). burn-ndarray 0.21 computes the same schemes with native storage (it loads
/// `PackedU32(0)` data but cannot quantize into it).
pub(crate) fn supports_scheme(scheme: &QuantScheme) -> bool {
    let level_ok = match scheme.level {
        QuantLevel::Tensor => true,
        QuantLevel::Block(block) => block.num_elements() > 0,
    };
    level_ok
        && matches!(scheme.mode, QuantMode::Symmetric)
        && matches!(scheme.value, QuantValue::Q8F | QuantValue::Q8S)
        && matches!(scheme.store, QuantStore::Native | QuantStore::PackedU32(0))
}

/// The trait boundary's scheme check: panics with `cudnn-backend: quantization scheme ..
/// not supported by <op>` unless `scheme` is supported (see [`supports_scheme`]). The
/// operations that take a scheme from the caller check it first; a tensor's scheme was
/// checked when the tensor was made.
fn require_scheme(op: &str, scheme: &QuantScheme) {
    if !supports_scheme(scheme) {
        panic!(
            "cudnn-backend: quantization scheme {scheme:?} not supported by {op}; supported: symmetric Q8F/Q8S \
             per-tensor or per-block with native or PackedU32(0) storage"
        )
    }
}

/// `(block, nblocks)`: elements per scale and number of scales for `n` elements (per
/// tensor: one scale for all of them). An error when the block size does not divide `n`.
fn blocks(op: &str, scheme: &QuantScheme, n: i64) -> Result<(Option<usize>, i64)> {
    match scheme.level {
        QuantLevel::Tensor => Ok((None, 1)),
        QuantLevel::Block(block_size) => {
            let block = block_size.num_elements() as i64;
            if block <= 0 || n % block != 0 {
                return Err(Error::invalid_input(
                    op,
                    format!(
                        "{n} elements are not a multiple of the quantization block {block_size:?} ({block} \
                         elements); use a block size that divides the tensor or QuantLevel::Tensor"
                    ),
                ));
            }
            Ok((Some(block as usize), n / block))
        }
    }
}

/// The quantized range `(a, b)` of the scheme's values.
fn q_range(scheme: &QuantScheme) -> (f64, f64) {
    let (a, b) = scheme.value.range();
    (a as f64, b as f64)
}

/// `scales` (F32) with zeros replaced by 0.1, as burn-ndarray's `valid_scale` does.
fn valid_scales(scales: &CudnnTensor, op: &str) -> Result<CudnnTensor> {
    let zero = exec::compare_scalar(scales.clone(), 0.0, CompareOp::Eq, BoolStore::Native, op)?;
    let fallback = exec::scalar_tensor(scales, DType::F32, 0.1, op)?;
    exec::where_(zero, fallback, scales.clone(), op)
}

/// `x` as a packed F32 tensor.
fn packed_f32(x: CudnnTensor, op: &str) -> Result<CudnnTensor> {
    exec::cast(x, DType::F32, op)?.contiguous()
}

/// Quantizes `x` (any float dtype, converted to f32) with the given raw `scales` (one per
/// tensor or per block; any float dtype and shape with that many elements) under a
/// supported `scheme`.
fn quantize_with(x: CudnnTensor, scheme: &QuantScheme, scales: CudnnTensor, op: &str) -> Result<CudnnQTensor> {
    let x = packed_f32(x, op)?;
    let dims = x.dims().to_vec();
    let n = x.numel();
    let (block, nblocks) = blocks(op, scheme, n)?;
    if scales.numel() != nblocks {
        return Err(Error::invalid_input(
            op,
            format!(
                "{} scales given ({:?}) for {nblocks} {} of {dims:?}",
                scales.numel(),
                scales.dims(),
                if block.is_some() {
                    "blocks"
                } else {
                    "tensor (per-tensor scale)"
                }
            ),
        ));
    }
    let scales = packed_f32(scales, op)?.reshape(&[nblocks])?;
    let values = if n == 0 {
        x.empty_like(DType::I8, op)?
    } else {
        let width = block.map_or(n, |b| b as i64);
        let valid = valid_scales(&scales, op)?.reshape(&[nblocks, 1])?;
        let (a, b) = q_range(scheme);
        // y = clamp(x / scale, a, b); clamping first keeps ±inf finite and commutes with
        // rounding since a and b are integers. NaN stays NaN (then becomes 0 in the cast).
        let y = exec::binary(x.reshape(&[nblocks, width])?, valid, BinaryOp::Div, op)?;
        let y = exec::unary(y, UnaryOp::Clamp { min: a, max: b }, op)?;
        // Round half away from zero exactly: t = trunc(y); y - t is exact and in (-1, 1), so
        // trunc(2 (y - t)) is ±1 exactly when |y - t| >= 0.5 (with y's sign), else 0.
        let t = exec::unary(y.clone(), UnaryOp::Trunc, op)?;
        let frac = exec::binary(y, t.clone(), BinaryOp::Sub, op)?;
        let frac = exec::unary(frac, UnaryOp::MulScalar(2.0), op)?;
        let carry = exec::unary(frac, UnaryOp::Trunc, op)?;
        let q = exec::binary(t, carry, BinaryOp::Add, op)?;
        exec::cast(q, DType::I8, op)?.reshape(&dims)?
    };
    Ok(CudnnQTensor {
        values,
        scales,
        scheme: *scheme,
    })
}

/// The dynamic scales of `x` (packed F32): per block, `(2 * max|x|) / (b - a)` with
/// `[a, b]` the quantized range — Burn's `compute_q_params` for min/max calibration.
fn dynamic_scales(x: &CudnnTensor, scheme: &QuantScheme, op: &str) -> Result<CudnnTensor> {
    let n = x.numel();
    let (block, nblocks) = blocks(op, scheme, n)?;
    if n == 0 {
        return exec::full(x.device(), &[nblocks], DType::F32, 0.0, op);
    }
    let width = block.map_or(n, |b| b as i64);
    let abs = exec::unary(x.clone(), UnaryOp::Abs, op)?.reshape(&[nblocks, width])?;
    let max_abs = abs.empty_on(&[nblocks, 1], DType::F32, op)?;
    reduce::reduce(abs.stream(), reduce::ReduceOp::Max, &abs.tref(), 1, &max_abs.tmut())?;
    let (a, b) = q_range(scheme);
    let range = exec::unary(max_abs, UnaryOp::MulScalar(2.0), op)?;
    exec::binary_scalar(range, b - a, BinaryOp::Div, op)?.reshape(&[nblocks])
}

/// Quantizes `x` with scales computed from its own values (min/max calibration) under a
/// supported `scheme`.
pub(crate) fn quantize_dynamic_impl(x: CudnnTensor, scheme: &QuantScheme, op: &str) -> Result<CudnnQTensor> {
    let x = packed_f32(x, op)?;
    let scales = dynamic_scales(&x, scheme, op)?;
    quantize_with(x, scheme, scales, op)
}

/// `scale * q` as a packed tensor of float dtype `dtype`.
fn dequantize_impl(t: CudnnQTensor, dtype: DType, op: &str) -> Result<CudnnTensor> {
    let values = t.values.contiguous()?;
    let (block, _) = blocks(op, &t.scheme, values.numel())?;
    let scales = valid_scales(&t.scales, op)?;
    let out = values.empty_like(dtype, op)?;
    linalg::dequantize_symmetric_i8(values.stream(), &values.tref(), block, &scales.tref(), &out.tmut())?;
    Ok(out)
}

/// A view op on the values (`layout` maps the values' layout to the result's). Per-block
/// scales stay valid when the view enumerates the same packed elements in the same order;
/// otherwise the op runs on the dequantized tensor, which is then re-quantized.
fn view_op(t: CudnnQTensor, op: &str, layout: impl Fn(&ViewLayout) -> Result<ViewLayout>) -> Result<CudnnQTensor> {
    let new = layout(&t.values.layout)?;
    let old = &t.values.layout;
    let same_order =
        old.is_contiguous() && new.is_contiguous() && old.offset == new.offset && old.numel() == new.numel();
    if matches!(t.scheme.level, QuantLevel::Tensor) || same_order {
        let values = t.values.with_layout(new);
        return Ok(CudnnQTensor { values, ..t });
    }
    let scheme = t.scheme;
    let x = dequantize_impl(t, DType::F32, op)?;
    let moved = layout(&x.layout)?;
    quantize_dynamic_impl(x.with_layout(moved), &scheme, op)
}

/// An op that moves elements (flip, select, slice, gather): applied to the int8 values for a
/// per-tensor scale, else to the dequantized tensor, then re-quantized. `f` runs the op on
/// either tensor.
fn gather_op(t: CudnnQTensor, op: &str, f: impl FnOnce(CudnnTensor) -> Result<CudnnTensor>) -> Result<CudnnQTensor> {
    if matches!(t.scheme.level, QuantLevel::Tensor) {
        let CudnnQTensor { values, scales, scheme } = t;
        let values = f(values)?;
        return Ok(CudnnQTensor { values, scales, scheme });
    }
    let scheme = t.scheme;
    let x = dequantize_impl(t, DType::F32, op)?;
    quantize_dynamic_impl(f(x)?, &scheme, op)
}

/// The tensor of quantized `data` on `device` (a supported scheme).
fn from_qdata(data: TensorData, device: &CudnnDevice, scheme: QuantScheme, op: &str) -> Result<CudnnQTensor> {
    let shape = data.shape.clone();
    let n = data.num_elements();
    let (_, nblocks) = blocks(op, &scheme, n as i64)?;
    let q_bytes = QuantizedBytes {
        bytes: data.into_bytes(),
        scheme,
        num_elements: n,
    };
    let (mut values, qparams) = q_bytes.into_vec_i8();
    // Packed storage pads the values to whole u32 words.
    values.truncate(n);
    if values.len() != n || qparams.scales.len() != nblocks as usize {
        return Err(Error::invalid_input(
            op,
            format!(
                "data holds {} values and {} scales, expected {n} and {nblocks}",
                values.len(),
                qparams.scales.len()
            ),
        ));
    }
    let values = data::from_data(TensorData::new(values, shape), device, DType::I8, op)?;
    let nscales = qparams.scales.len();
    let scales = data::from_data(TensorData::new(qparams.scales, [nscales]), device, DType::F32, op)?;
    Ok(CudnnQTensor { values, scales, scheme })
}

impl QTensorOps<Cudnn> for Cudnn {
    /// Accepts the supported schemes (symmetric Q8F/Q8S, per tensor or per block, native or
    /// `PackedU32(0)` storage); the tensor keeps the data's scheme.
    fn q_from_data(data: TensorData, device: &CudnnDevice) -> QuantizedTensor<Cudnn> {
        const OP: &str = "q_from_data";
        let DType::QFloat(scheme) = data.dtype else {
            panic!(
                "cudnn-backend: {OP}: expected DType::QFloat data, got {:?}; use float_from_data for float data",
                data.dtype
            )
        };
        require_scheme(OP, &scheme);
        expect(OP, from_qdata(data, device, scheme, OP))
    }

    fn quantize(
        tensor: FloatTensor<Cudnn>,
        scheme: &QuantScheme,
        qparams: QuantizationParametersPrimitive<Cudnn>,
    ) -> QuantizedTensor<Cudnn> {
        const OP: &str = "quantize";
        require_scheme(OP, scheme);
        expect(OP, quantize_with(tensor, scheme, qparams.scales, OP))
    }

    /// Min/max calibration on the device (same scales as Burn's default, fewer launches).
    fn quantize_dynamic(tensor: FloatTensor<Cudnn>, scheme: &QuantScheme) -> QuantizedTensor<Cudnn> {
        const OP: &str = "quantize_dynamic";
        require_scheme(OP, scheme);
        expect(OP, quantize_dynamic_impl(tensor, scheme, OP))
    }

    fn dequantize(tensor: QuantizedTensor<Cudnn>, dtype: FloatDType) -> FloatTensor<Cudnn> {
        expect("dequantize", dequantize_impl(tensor, dtype.into(), "dequantize"))
    }

    fn q_device(tensor: &QuantizedTensor<Cudnn>) -> CudnnDevice {
        tensor.values.burn_device()
    }

    fn q_to_device(tensor: QuantizedTensor<Cudnn>, device: &CudnnDevice) -> QuantizedTensor<Cudnn> {
        const OP: &str = "q_to_device";
        CudnnQTensor {
            values: expect(OP, data::to_device(tensor.values, device)),
            scales: expect(OP, data::to_device(tensor.scales, device)),
            scheme: tensor.scheme,
        }
    }

    /// Row-major order is unchanged, so per-block scales stay valid.
    fn q_reshape(tensor: QuantizedTensor<Cudnn>, shape: Shape) -> QuantizedTensor<Cudnn> {
        let values = expect("q_reshape", tensor.values.reshape(&to_dims(&shape)));
        CudnnQTensor { values, ..tensor }
    }

    /// Values and scales come back with one transfer and one synchronisation.
    fn q_into_data(tensor: QuantizedTensor<Cudnn>) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        const OP: &str = "q_into_data";
        let shape = tensor.shape();
        let read = read_batch(&[tensor.values, tensor.scales], OP).map(|bytes| {
            let mut bytes = bytes.into_iter();
            let values = bytes.next().unwrap_or_default();
            let scales = bytes.next().unwrap_or_default();
            q_data(shape, tensor.scheme, values, scales)
        });
        std::future::ready(read.map_err(|e| execution_error(OP, e)))
    }

    fn q_expand(tensor: QuantizedTensor<Cudnn>, shape: Shape) -> QuantizedTensor<Cudnn> {
        let dims = to_dims(&shape);
        expect("q_expand", view_op(tensor, "q_expand", |l| l.expand(&dims)))
    }

    fn q_swap_dims(tensor: QuantizedTensor<Cudnn>, dim1: usize, dim2: usize) -> QuantizedTensor<Cudnn> {
        expect(
            "q_swap_dims",
            view_op(tensor, "q_swap_dims", |l| l.transpose(dim1, dim2)),
        )
    }

    fn q_permute(tensor: QuantizedTensor<Cudnn>, axes: &[usize]) -> QuantizedTensor<Cudnn> {
        expect("q_permute", view_op(tensor, "q_permute", |l| l.permute(axes)))
    }

    fn q_flip(tensor: QuantizedTensor<Cudnn>, axes: &[usize]) -> QuantizedTensor<Cudnn> {
        const OP: &str = "q_flip";
        expect(OP, gather_op(tensor, OP, |t| st::flip(t, axes, OP)))
    }

    fn q_select(tensor: QuantizedTensor<Cudnn>, dim: usize, indices: IntTensor<Cudnn>) -> QuantizedTensor<Cudnn> {
        const OP: &str = "q_select";
        expect(OP, gather_op(tensor, OP, |t| st::select(t, dim, indices, OP)))
    }

    /// Gathers the int8 values and keeps the scale for a per-tensor scheme (as burn-ndarray
    /// does), so `q_max_dim`, `q_min_dim`, `q_max_abs_dim` and their `_with_indices` forms
    /// (Burn's defaults: arg-reduction then `q_gather`) return the selected elements exactly,
    /// not dynamically re-quantized ones.
    fn q_gather(dim: usize, tensor: QuantizedTensor<Cudnn>, indices: IntTensor<Cudnn>) -> QuantizedTensor<Cudnn> {
        const OP: &str = "q_gather";
        expect(OP, gather_op(tensor, OP, |t| st::gather(dim, t, indices, OP)))
    }

    fn q_slice(tensor: QuantizedTensor<Cudnn>, slices: &[Slice]) -> QuantizedTensor<Cudnn> {
        const OP: &str = "q_slice";
        expect(OP, gather_op(tensor, OP, |t| st::slice(t, slices, OP)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_backend::quantization::QuantParam;

    /// The f32 op sequence `quantize_with` enqueues (div, clamp, trunc, sub, mul 2, trunc,
    /// add, cast), replayed on the host: every step is an exact IEEE f32 operation.
    fn composed(x: f32, scale: f32, (a, b): (f32, f32)) -> i8 {
        let y = x / scale;
        let y = if y < a { a } else { y };
        let y = if y > b { b } else { y };
        let t = y.trunc();
        let carry = ((y - t) * 2.0).trunc();
        let q = t + carry;
        if q.is_nan() {
            0
        } else {
            q as i8
        }
    }

    /// burn-ndarray's `quantize_one`.
    fn reference(x: f32, scale: f32, (a, b): (f32, f32)) -> i8 {
        (x / scale).round().clamp(a, b) as i8
    }

    #[test]
    fn composed_rounding_matches_ndarray() {
        let ranges = [QuantValue::Q8S.range(), QuantValue::Q8F.range()];
        let edges = [
            0.0f32,
            -0.0,
            0.5,
            -0.5,
            0.499_999_97,
            -0.499_999_97,
            1.5,
            2.5,
            -2.5,
            126.5,
            127.5,
            -127.5,
            -128.5,
            -129.0,
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1.0e-40,
        ];
        for range in ranges {
            for &x in &edges {
                for scale in [1.0f32, 0.1, 0.003_937_008, 7.5] {
                    assert_eq!(
                        composed(x, scale, range),
                        reference(x, scale, range),
                        "x={x} scale={scale}"
                    );
                }
            }
            // Pseudo-random bit patterns (finite values only; ndarray panics on NaN).
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..200_000 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let x = f32::from_bits((state >> 32) as u32);
                // Bias towards the interesting range |x| < 300.
                let x = if state & 1 == 0 {
                    x
                } else {
                    (x.to_bits() % 600_000) as f32 / 1000.0 - 300.0
                };
                if x.is_nan() {
                    continue;
                }
                assert_eq!(composed(x, 1.0, range), reference(x, 1.0, range), "x={x}");
            }
        }
    }

    #[test]
    fn supported_schemes() {
        for store in [QuantStore::Native, QuantStore::PackedU32(0)] {
            let base = QuantScheme::default().with_store(store);
            for value in [QuantValue::Q8F, QuantValue::Q8S] {
                assert!(supports_scheme(&base.with_value(value)));
                assert!(supports_scheme(
                    &base.with_value(value).with_level(QuantLevel::block([32]))
                ));
                assert!(supports_scheme(
                    &base.with_value(value).with_level(QuantLevel::block([4, 8]))
                ));
            }
            for param in [QuantParam::F16, QuantParam::BF16, QuantParam::UE8M0, QuantParam::UE4M3] {
                assert!(supports_scheme(&base.with_param(param)), "{param:?}");
            }
            assert!(!supports_scheme(&base.with_value(QuantValue::Q4S)));
            assert!(!supports_scheme(&base.with_value(QuantValue::E4M3)));
        }
        assert!(supports_scheme(&QuantScheme::default()), "Burn's default scheme");
        assert!(!supports_scheme(
            &QuantScheme::default().with_store(QuantStore::PackedU32(1))
        ));
        assert!(!supports_scheme(
            &QuantScheme::default().with_store(QuantStore::PackedNative(0))
        ));
    }

    #[test]
    fn block_counts() {
        let block = QuantScheme::default().with_level(QuantLevel::block([2, 4]));
        assert_eq!(blocks("t", &block, 24).unwrap(), (Some(8), 3));
        assert_eq!(blocks("t", &QuantScheme::default(), 24).unwrap(), (None, 1));
        // The error names the op; the trait boundary prefixes `cudnn-backend: `.
        let msg = blocks("q_slice", &block, 12).unwrap_err().to_string();
        assert!(msg.starts_with("q_slice: 12 elements"), "{msg}");
    }

    #[test]
    fn data_layout_is_ndarrays() {
        let scheme = QuantScheme::default().with_store(QuantStore::Native);
        let scale = 0.25f32;
        let data = q_data(
            Shape::new([3]),
            scheme,
            vec![1, 0xff, 0x81],
            scale.to_le_bytes().to_vec(),
        );
        let want = TensorData::quantized(vec![1i8, -1, -127], [3], scheme, &[scale]);
        assert_eq!(data.as_bytes(), want.as_bytes());
        assert_eq!(data.dtype, want.dtype);
        assert_eq!(data.shape, want.shape);
    }

    #[test]
    fn packed_u32_data_keeps_its_scheme_and_bytes() {
        // Four 8-bit values per little-endian u32 word: the i8 byte order, so Burn's own
        // serialization of the default scheme is byte-identical to the native one.
        let scheme = QuantScheme::default();
        let scale = 0.5f32;
        let data = q_data(
            Shape::new([2, 3]),
            scheme,
            vec![1, 2, 3, 0xfd, 0xfe, 0xff],
            scale.to_le_bytes().to_vec(),
        );
        let want = TensorData::quantized(vec![1i8, 2, 3, -3, -2, -1], [2, 3], scheme, &[scale]);
        assert_eq!(data.dtype, DType::QFloat(scheme));
        assert_eq!(data.as_bytes(), want.as_bytes());
        let native = TensorData::quantized(
            vec![1i8, 2, 3, -3, -2, -1],
            [2, 3],
            scheme.with_store(QuantStore::Native),
            &[scale],
        );
        assert_eq!(data.as_bytes(), native.as_bytes());
    }
}
