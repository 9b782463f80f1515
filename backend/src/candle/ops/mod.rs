//! The Candle custom ops and the tensor-level functions that apply them.
//!
//! Each op struct implements Candle's `CustomOp1/2/3`: `cpu_fwd` (float64 reference),
//! `cuda_fwd` (our cuDNN graph or engine kernel on Candle's stream, feature `candle-cuda`) and
//! `bwd` (made of these same ops, so gradients run through cuDNN's dgrad/wgrad/pooling-backward
//! too, or one fused engine backward: batch norm, layer/RMS norm, attention).
//!
//! A Candle op returns one tensor, but a fused backward pass computes several gradients in one
//! call (batch norm: dx, dweight and dbias from one pass over the data). Those `bwd`s call the
//! engine op directly on the storages of their operands and wrap each gradient buffer it wrote
//! as a tensor (`Tensor::from_storage`), so one backward costs the engine's launches and nothing
//! more. What the forward pass saves for it (statistics) is kept in the op value, which Candle's
//! graph holds until the backward pass.
//! The free functions ([`conv`], [`matmul`], [`pool`], ...) validate the arguments, pick
//! the memory format, make a single copy of inputs whose layout cuDNN cannot take, apply
//! the op with autograd tracking and return logically-shaped (NCHW) tensors.

mod act;
mod attention;
mod batch_norm;
mod conv;
mod cross_entropy;
mod embedding;
mod matmul;
mod norm;
mod pool;

pub(crate) use attention::{causal_bias, check_causal, sdpa_supported};
pub use attention::{sdpa, sdpa_heads, Sdpa};
pub use batch_norm::{batch_norm_add_train, batch_norm_train, BatchNormAddTrain, BatchNormTrain};
pub use conv::{
    conv, conv_backward_data, conv_backward_filter, conv_bias_act, conv_transpose, Conv, ConvBackwardData,
    ConvBackwardFilter, ConvBiasAct,
};
pub use cross_entropy::{cross_entropy, cross_entropy_ignore_index, CrossEntropy};
pub use embedding::embedding_lookup;
pub use matmul::{matmul, matmul_bias_act, Matmul, MatmulBiasAct};
pub use norm::{norm, Norm};
pub use pool::{pool, pool_backward, Pool, PoolBackwardAvg, PoolBackwardMax};

use candle_core::{Layout, Result, Tensor};

/// Whether the gradients' elementwise and reduction steps (the activation derivative, the
/// linear bias gradient) run as the engine's fused kernels on CUDA: yes unless
/// `CUDNN_BACKEND_CANDLE_FUSED_GRADS` is `0`, `false`, `off` or `no` (then Candle ops, for
/// comparisons).
pub(crate) fn fused_grads() -> bool {
    crate::config::config().candle_fused_grads
}

/// Row-major (`channels_last == false`) or channels-last packed strides for logical `dims`
/// (N, C, spatial...).
pub(crate) fn packed_strides(dims: &[usize], channels_last: bool) -> Vec<i64> {
    let r = dims.len();
    let mut order: Vec<usize> = (0..r).collect();
    if channels_last && r >= 3 {
        order = std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect();
    }
    let mut strides = vec![0i64; r];
    let mut acc = 1i64;
    for &i in order.iter().rev() {
        strides[i] = acc;
        acc *= dims[i] as i64;
    }
    strides
}

/// The dims in memory order: (N, spatial..., C) when channels-last.
pub(crate) fn physical_dims(dims: &[usize], channels_last: bool) -> Vec<usize> {
    if !channels_last || dims.len() < 3 {
        return dims.to_vec();
    }
    let mut v = vec![dims[0]];
    v.extend_from_slice(&dims[2..]);
    v.push(dims[1]);
    v
}

/// A physically-shaped op result back as the logical (N, C, spatial...) view.
pub(crate) fn logical(t: Tensor, channels_last: bool) -> Result<Tensor> {
    let r = t.rank();
    if !channels_last || r < 3 {
        return Ok(t);
    }
    let perm: Vec<usize> = std::iter::once(0)
        .chain(std::iter::once(r - 1))
        .chain(1..r - 1)
        .collect();
    t.permute(perm)
}

/// True when `dims`/`strides` equal the given packed strides, ignoring size-1 dims.
fn strides_match(dims: &[usize], strides: &[usize], expect: &[i64]) -> bool {
    dims.iter()
        .zip(strides)
        .zip(expect)
        .all(|((&d, &s), &e)| d <= 1 || s as i64 == e)
}

/// True when the layout is channels-last packed and not also row-major packed (a layout
/// that is both, e.g. with one channel, counts as row-major).
pub(crate) fn is_channels_last(l: &Layout) -> bool {
    let dims = l.dims();
    dims.len() >= 3
        && strides_match(dims, l.stride(), &packed_strides(dims, true))
        && !strides_match(dims, l.stride(), &packed_strides(dims, false))
}

/// True when some ordering of the dims is row-major packed: no gaps, overlaps or
/// broadcast dims (such views go to cuDNN through their strides).
pub(crate) fn is_packed(l: &Layout) -> bool {
    let mut axes: Vec<usize> = (0..l.dims().len()).filter(|&i| l.dims()[i] > 1).collect();
    axes.sort_by_key(|&i| l.stride()[i]);
    let mut expect = 1usize;
    for i in axes {
        if l.stride()[i] != expect {
            return false;
        }
        expect *= l.dims()[i];
    }
    true
}

/// `t` stored in the given memory format (channels-last or row-major): itself when it already
/// is, else one copy (cuDNN engines want the tensors of one convolution in one format).
pub(crate) fn in_format(t: &Tensor, channels_last: bool) -> Result<Tensor> {
    let (dims, strides) = (t.dims(), t.stride());
    if dims.len() < 3 || strides_match(dims, strides, &packed_strides(dims, channels_last)) {
        return Ok(t.clone());
    }
    if !channels_last {
        return t.contiguous();
    }
    let r = dims.len();
    let to_last: Vec<usize> = std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect();
    logical(t.permute(to_last)?.contiguous()?, true)
}

/// `t` itself when its layout is packed, else one contiguous copy.
pub(crate) fn packed(t: &Tensor) -> Result<Tensor> {
    if is_packed(t.layout()) {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

/// Checks that all tensors share one dtype.
pub(crate) fn same_dtype(op: &'static str, ts: &[(&'static str, candle_core::DType)]) -> Result<()> {
    let first = ts[0].1;
    for &(name, d) in &ts[1..] {
        if d != first {
            return Err(super::arg_err(
                op,
                name,
                format!("dtype {d:?} differs from {}'s {first:?}", ts[0].0),
            ));
        }
    }
    Ok(())
}

/// usize dims as i64.
pub(crate) fn idims(d: &[usize]) -> Vec<i64> {
    d.iter().map(|&x| x as i64).collect()
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;
    use crate::ops::ConvParams;

    fn refs(t: &Tensor) -> (Vec<i64>, Vec<i64>) {
        (idims(t.dims()), idims(t.stride()))
    }

    /// The channels-last case that failed on the GPU (`conv2d_bias_act` F32, x [4, 10, 20, 18],
    /// w [16, 5, 2, 3], padding [2, 1], stride [2, 1], dilation [1, 2], 2 groups, NHWC) hands
    /// `conv_bias_act_forward` exactly the views the engine-level test passes for it
    /// (`TensorRef::channels_last` for x, w and y, bias [16] stride [1]), and Candle gets the
    /// output back as the NCHW view of an NHWC buffer.
    #[test]
    fn channels_last_conv_views_match_the_engine_tests_tensor_refs() {
        let cpu = Device::Cpu;
        let nhwc = |d: [usize; 4]| {
            Tensor::zeros((d[0], d[2], d[3], d[1]), DType::F32, &cpu)
                .unwrap()
                .permute((0, 3, 1, 2))
                .unwrap()
        };
        let want = |d: &[usize]| {
            let dims = idims(d);
            let strides = crate::types::channels_last_strides(&dims).to_vec();
            (dims, strides)
        };
        let x = packed(&nhwc([4, 10, 20, 18])).unwrap();
        assert!(is_channels_last(x.layout()));
        assert_eq!(refs(&x), want(&[4, 10, 20, 18]));
        let w = in_format(&nhwc([16, 5, 2, 3]), true).unwrap();
        assert_eq!(refs(&w), want(&[16, 5, 2, 3]));
        // A row-major filter is copied to the same KRSC view.
        let w_rm = Tensor::zeros((16, 5, 2, 3), DType::F32, &cpu).unwrap();
        assert_eq!(refs(&in_format(&w_rm, true).unwrap()), want(&[16, 5, 2, 3]));
        let p = ConvParams::new(&[2, 1], &[2, 1], &[1, 2], 2);
        let y = super::conv::conv_out_dims("test", &p, x.dims(), w.dims()).unwrap();
        assert_eq!(y, [4, 16, 12, 16]);
        assert_eq!(packed_strides(&y, true), want(&y).1);
        assert_eq!(physical_dims(&y, true), [4, 12, 16, 16]);
        let back = logical(Tensor::zeros(physical_dims(&y, true), DType::F32, &cpu).unwrap(), true).unwrap();
        assert_eq!(refs(&back), want(&y));
        let b = packed(&Tensor::zeros(16, DType::F32, &cpu).unwrap()).unwrap();
        assert_eq!(refs(&b), (vec![16], vec![1]));
    }
}
