//! Layer and RMS normalization forward as one cuDNN norm graph.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{check_on_stream_device, run_with_scalars, OpKey, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::graph::{DataType, Graph, NormMode, Scalar};

/// Where [`norm_forward`] writes the per-row statistics (training phase): f32 tensors of
/// `rows` elements each (any dims whose product is `rows`, packed). Layer norm only.
#[derive(Clone, Copy, Debug)]
pub struct NormStats<'a> {
    /// Row means (layer norm; RMS norm writes none).
    pub mean: &'a TensorMut<'a>,
    /// Row inverse standard deviations `1 / sqrt(var + eps)`.
    pub inv_std: &'a TensorMut<'a>,
}

/// Packed `[rows, features]` as cuDNN's `[rows, features, 1, 1]`.
fn rows4<'a>(t: &TensorRef<'a>) -> Result<TensorRef<'a>> {
    let f = t.dims[1].max(1);
    t.reshaped(&[t.dims[0], t.dims[1], 1, 1], &[f, 1, f, f])
}

/// A `[features]` parameter as `[1, features, 1, 1]`.
fn param4<'a>(t: &TensorRef<'a>, features: i64) -> Result<TensorRef<'a>> {
    let s = t
        .strides
        .iter()
        .zip(&t.dims)
        .find(|(_, &d)| d == features)
        .map_or(1, |(&s, _)| s);
    let outer = (features * s).max(1);
    t.reshaped(&[1, features, 1, 1], &[outer, s, outer, outer])
}

/// A per-row statistic as `[rows, 1, 1, 1]`.
fn stat4<'a>(t: &TensorRef<'a>, rows: i64) -> Result<TensorRef<'a>> {
    t.reshaped(&[rows, 1, 1, 1], &[1, 1, 1, 1])
}

fn check(
    op: &'static str,
    x: &TensorRef,
    scale: &TensorRef,
    bias: Option<&TensorRef>,
    y: &TensorRef,
    stats: Option<NormStats<'_>>,
) -> Result<()> {
    x.check(op, "x")?;
    y.check(op, "y")?;
    scale.check(op, "scale")?;
    if x.dims.len() != 2 || y.dims != x.dims {
        return Err(Error::invalid_arg(
            op,
            "x",
            format!("x {:?} and y {:?} must both be [rows, features]", x.dims, y.dims),
        ));
    }
    if y.strides != x.strides {
        return Err(Error::invalid_arg(
            op,
            "y",
            format!(
                "strides {:?} differ from x's {:?} (cuDNN needs equal layouts)",
                y.strides, x.strides
            ),
        ));
    }
    if y.dtype != x.dtype {
        return Err(Error::invalid_arg(
            op,
            "y",
            format!("dtype {:?} differs from x's {:?}", y.dtype, x.dtype),
        ));
    }
    let features = x.dims[1];
    for (name, t) in std::iter::once(("scale", scale)).chain(bias.map(|b| ("bias", b))) {
        t.check(op, name)?;
        if t.numel() != features || t.dims.iter().filter(|&&d| d != 1).count() > 1 {
            return Err(Error::invalid_arg(
                op,
                name,
                format!("needs {features} elements, got dims {:?}", t.dims),
            ));
        }
        if t.dtype != x.dtype && t.dtype != DataType::F32 {
            return Err(Error::invalid_arg(
                op,
                name,
                format!("dtype {:?}: must be f32 or x's {:?}", t.dtype, x.dtype),
            ));
        }
    }
    if let Some(s) = stats {
        if op == "rms_norm" {
            return Err(Error::invalid_arg(
                op,
                "stats",
                "row statistics are written for layer norm only",
            ));
        }
        for (name, t) in [("mean", s.mean), ("inv_std", s.inv_std)] {
            t.check(op, name)?;
            if t.numel() != x.dims[0] || t.dtype != DataType::F32 || !t.is_packed() {
                return Err(Error::invalid_arg(
                    op,
                    name,
                    format!(
                        "needs {} packed f32 elements, got {:?} {:?}",
                        x.dims[0], t.dims, t.dtype
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `y = norm(x) · scale + bias` per row of `x [rows, features]` as ONE cuDNN graph:
/// [`NormMode::LayerNorm`] centres and scales by `1/sqrt(var + epsilon)` (biased variance),
/// [`NormMode::RmsNorm`] scales by `1/sqrt(mean(x²) + epsilon)`. `scale`/`bias` hold
/// `features` elements (f32 or x's dtype; `bias` optional). With `stats` (training) the
/// row statistics are written too. `x` and `y` must be packed rows (strides `[features, 1]`);
/// other layouts return a not-supported error.
/// Returns a not-supported error when cuDNN has no engine for the case.
#[allow(clippy::too_many_arguments)]
pub fn norm_forward(
    stream: &Arc<CudaStream>,
    mode: NormMode,
    x: &TensorRef,
    scale: &TensorRef,
    bias: Option<&TensorRef>,
    y: &TensorMut,
    epsilon: f64,
    stats: Option<NormStats<'_>>,
) -> Result<()> {
    let op = match mode {
        NormMode::LayerNorm => "layer_norm",
        NormMode::RmsNorm => "rms_norm",
    };
    check(op, x, scale, bias, y, stats)?;
    let operands = [
        ("x", Some(x)),
        ("scale", Some(scale)),
        ("bias", bias),
        ("y", Some(y)),
        ("mean", stats.map(|s| &**s.mean)),
        ("inv_std", stats.map(|s| &**s.inv_std)),
    ];
    check_on_stream_device(stream, op, &operands)?;
    if x.is_empty() {
        return Ok(());
    }
    let (rows, features) = (x.dims[0], x.dims[1]);
    if x.strides[1] != 1 || (rows > 1 && x.strides[0] != features) {
        return Err(Error::Unsupported {
            graph: format!("{op} x {:?} strides {:?}", x.dims, x.strides),
            reason: "cuDNN's norm engines need packed rows (strides [features, 1])".into(),
        });
    }
    let (x4, y4) = (rows4(x)?, rows4(y)?);
    let scale4 = param4(scale, features)?;
    let bias4 = bias.map(|b| param4(b, features)).transpose()?;
    let stats4 = match stats {
        Some(s) => Some((stat4(s.mean, rows)?, stat4(s.inv_std, rows)?)),
        None => None,
    };
    let eps = epsilon as f32;
    let build = || {
        let mut g = Graph::new();
        let xi = x4.add_input(&mut g, "x");
        let si = scale4.add_input(&mut g, "scale");
        let bi = bias4.as_ref().map(|b| b.add_input(&mut g, "bias"));
        let ei = g.scalar("epsilon", Scalar::F32(eps), 4);
        let (out, st) = g.norm_forward(mode, xi, si, bi, ei, stats4.is_some());
        y4.bind_output(&mut g, out);
        if let (Some((m, v)), Some((mt, vt))) = (st, stats4.as_ref()) {
            mt.bind_output(&mut g, m);
            vt.bind_output(&mut g, v);
        }
        g
    };
    // uids: x 1, scale 2, [bias 3], epsilon, y, [mean, inv_std].
    let mut io = vec![(1, x4.ptr), (2, scale4.ptr)];
    if let Some(b) = &bias4 {
        io.push((3, b.ptr));
    }
    let e_uid = io.len() as i64 + 1;
    io.push((e_uid, (&eps as *const f32) as u64));
    io.push((e_uid + 1, y4.ptr));
    if let Some((m, v)) = &stats4 {
        io.push((e_uid + 2, m.ptr));
        io.push((e_uid + 3, v.ptr));
    }
    let mut key = OpKey::new(op);
    key.ints(&[bias4.is_some() as i64, stats4.is_some() as i64]);
    key.tensor(&x4).tensor(&scale4).tensor(&y4);
    if let Some(b) = &bias4 {
        key.tensor(b);
    }
    if let Some((m, v)) = &stats4 {
        key.tensor(m).tensor(v);
    }
    run_with_scalars(stream, op, key, &io, &build)
}
