//! Batched matrix products, plain and with fused bias + activation.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::fallback::bias_act_in_place;
use super::{run, zero_fill, Activation, TensorRef};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::plan::Binding;

fn check(op: &'static str, a: &TensorRef, b: &TensorRef, c: &TensorRef) -> Result<()> {
    a.check(op, "a")?;
    b.check(op, "b")?;
    c.check(op, "c")?;
    if a.dims.len() < 2 || a.dims.len() != b.dims.len() || a.dims.len() != c.dims.len() {
        return Err(Error::invalid_arg(
            op,
            "a",
            format!("a {:?}, b {:?} and c {:?} need one rank >= 2", a.dims, b.dims, c.dims),
        ));
    }
    Ok(())
}

/// `c[.., M, N] = a[.., M, K] · b[.., K, N]`; batch dims broadcast (size 1 against any).
/// Transposed operands are just strides (e.g. `b` with strides `[.., 1, K]`).
pub fn matmul(stream: &Arc<CudaStream>, a: &TensorRef, b: &TensorRef, c: &TensorRef) -> Result<()> {
    matmul_bias_act(stream, a, b, None, c, Activation::Identity)
}

/// `c = act(a · b + bias)` as ONE cuDNN graph; `bias` holds N elements (dims `[N]` or
/// `[1, .., 1, N]`). Falls back to matmul + one bias/activation kernel when no engine
/// supports the fused graph.
pub fn matmul_bias_act(
    stream: &Arc<CudaStream>,
    a: &TensorRef,
    b: &TensorRef,
    bias: Option<&TensorRef>,
    c: &TensorRef,
    act: Activation,
) -> Result<()> {
    let op = if bias.is_some() || act != Activation::Identity {
        "matmul_bias_act"
    } else {
        "matmul"
    };
    check(op, a, b, c)?;
    let r = c.dims.len();
    let n = c.dims[r - 1];
    let bias_full = match bias {
        Some(bias) => {
            bias.check(op, "bias")?;
            if bias.numel() != n || bias.dims.iter().filter(|&&d| d != 1).count() > 1 {
                return Err(Error::invalid_arg(
                    op,
                    "bias",
                    format!("needs {n} elements, got dims {:?}", bias.dims),
                ));
            }
            if bias.dtype != c.dtype {
                return Err(Error::invalid_arg(
                    op,
                    "bias",
                    format!("dtype {:?} differs from c's {:?}", bias.dtype, c.dtype),
                ));
            }
            let s = bias.strides[bias.dims.iter().position(|&d| d == n).unwrap_or(0)].max(1);
            let mut dims = vec![1i64; r];
            dims[r - 1] = n;
            let mut strides = vec![n * s; r];
            strides[r - 1] = s;
            Some(TensorRef::new(&dims, &strides, bias.dtype, bias.ptr))
        }
        None => None,
    };
    if c.is_empty() {
        return Ok(());
    }
    if a.is_empty() || b.is_empty() {
        zero_fill(stream, c)?;
        return if bias_full.is_some() || act != Activation::Identity {
            bias_act_in_place(stream, op, c, bias_full.as_ref(), r - 1, act)
        } else {
            Ok(())
        };
    }
    let mut g = Graph::new();
    let (ai, bi) = (a.add_input(&mut g, "a"), b.add_input(&mut g, "b"));
    let mut out = g.matmul(ai, bi);
    let mut bindings = vec![Binding::new(ai, a.ptr), Binding::new(bi, b.ptr)];
    if let Some(bias) = &bias_full {
        let bt = bias.add_input(&mut g, "bias");
        bindings.push(Binding::new(bt, bias.ptr));
        out = g.bias_add(out, bt);
    }
    if let Some(m) = act.mode() {
        out = g.pointwise(m, out, None);
    }
    c.bind_output(&mut g, out);
    bindings.push(Binding::new(out, c.ptr));
    match run(stream, &mut g, &bindings, op) {
        Err(e) if e.is_not_supported() && (bias_full.is_some() || act != Activation::Identity) => {
            tracing::debug!("{op}: fused graph unsupported ({e}); running matmul + bias/activation kernel");
            matmul(stream, a, b, c)?;
            bias_act_in_place(stream, op, c, bias_full.as_ref(), r - 1, act)
        }
        other => other,
    }
}
