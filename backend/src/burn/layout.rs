//! Memory formats of the backend's tensors. Dims are always Burn's logical ones
//! (`[N, C, H, W]`); the strides choose the format. Convolutions run channels-last
//! (`NHWC`, filters `KRSC`) when the engine policy asks for it ([`ConvLayout::ChannelsLast`],
//! `CUDNN_BACKEND_CONV_LAYOUT=nhwc`), and the ops
//! that follow keep the format of their inputs (as PyTorch's `channels_last` propagates):
//! elementwise results, pooling, batch norm, casts, and the filters an optimizer updates
//! from channels-last gradients. A network's activations then stay channels-last from the
//! first convolution to the pooled features, with no layout transform around each
//! convolution.

use std::sync::Arc;

use burn_backend::DType;

use super::exec;
use super::tensor::{packed_strides_in, CudnnTensor};
use crate::error::Result;
use crate::plan::ConvLayout;
use crate::runtime;
use crate::types::{channels_last_order, channels_last_strides};
use crate::view::ViewLayout;

/// Whether a rank has a channels-last format: images `[N, C, H, W]` and volumes
/// `[N, C, D, H, W]`. (A rank-3 `[B, D, S]` is as often a transposed sequence as a 1-D
/// signal, so it is left row-major.)
fn has_channels_last(rank: usize) -> bool {
    rank == 4 || rank == 5
}

/// Whether `layout` is packed channels-last and not also packed row-major (more than one
/// channel and more than one spatial position): the format is then a real choice that
/// results should keep.
pub(crate) fn is_channels_last(layout: &ViewLayout) -> bool {
    let dims = &layout.dims;
    let r = dims.len();
    has_channels_last(r)
        && dims[1] > 1
        && dims[2..].iter().product::<i64>() > 1
        && packed_strides_in(dims, &layout.strides, &channels_last_order(r)).is_some()
}

impl CudnnTensor {
    /// A packed channels-last tensor (row-major at ranks other than 4 and 5) with
    /// uninitialised contents.
    pub(crate) fn empty_channels_last(
        device: &Arc<runtime::Device>,
        dims: &[i64],
        dtype: DType,
        op: &str,
    ) -> Result<Self> {
        let mut t = Self::empty(device, dims, dtype, op)?;
        if has_channels_last(dims.len()) {
            t.layout.strides = channels_last_strides(dims);
        }
        Ok(t)
    }

    /// A new tensor of `dims` in the format of `like` (channels-last when `like` is, else
    /// row-major), on `like`'s device.
    pub(crate) fn empty_in_format_of(like: &CudnnTensor, dims: &[i64], dtype: DType, op: &str) -> Result<Self> {
        if dims.len() == like.rank() && is_channels_last(&like.layout) {
            Self::empty_channels_last(like.device(), dims, dtype, op)
        } else {
            Self::empty(like.device(), dims, dtype, op)
        }
    }

    /// A new tensor for an elementwise result of `dims` over `operands`: channels-last when
    /// one of them with the result's dims is channels-last, else row-major. A channels-last
    /// gradient or filter thus makes the updated filter channels-last too.
    pub(crate) fn empty_for_operands(operands: &[&CudnnTensor], dims: &[i64], dtype: DType, op: &str) -> Result<Self> {
        let device = operands[0].device();
        if operands.iter().any(|t| t.dims() == dims && is_channels_last(&t.layout)) {
            Self::empty_channels_last(device, dims, dtype, op)
        } else {
            Self::empty(device, dims, dtype, op)
        }
    }

    /// This tensor packed channels-last (row-major at ranks without a channels-last format):
    /// itself as a view when it already is, else one copy.
    pub(crate) fn channels_last(self, op: &str) -> Result<Self> {
        let r = self.rank();
        if !has_channels_last(r) {
            return self.contiguous();
        }
        if let Some(strides) = packed_strides_in(self.dims(), &self.layout.strides, &channels_last_order(r)) {
            let layout = ViewLayout {
                strides: strides.into(),
                ..self.layout.clone()
            };
            return Ok(self.with_layout(layout));
        }
        let out = Self::empty_channels_last(self.device(), self.dims(), self.dtype, op)?;
        exec::copy_into(&self, &out, op)?;
        Ok(out)
    }

    /// This tensor packed row-major with the canonical strides (size-1 dims included, which
    /// a packed view may stride arbitrarily): itself as a view when packed, else one copy.
    pub(crate) fn row_major(self, op: &str) -> Result<Self> {
        let t = if self.is_contiguous() {
            self
        } else {
            exec::copy_to_new(&self, self.dtype, op)?
        };
        let layout = ViewLayout {
            strides: crate::types::row_major_strides(t.dims()),
            ..t.layout.clone()
        };
        Ok(t.with_layout(layout))
    }

    /// Whether the view covers its dims packed, row-major or channels-last.
    pub(crate) fn is_packed_either_format(&self) -> bool {
        self.is_contiguous() || is_channels_last(&self.layout)
    }
}

/// Whether a convolution over input dims `x_dims` with `groups` groups on `dtype` runs
/// channels-last under `layout` (see [`ConvLayout`]): ungrouped 2-D and 3-D float
/// convolutions when the policy asks for it. A 1-D convolution (run as 2-D over
/// `[N, C, 1, L]`) stays channels-first, as its rank-3 results have no channels-last format.
pub(crate) fn conv_channels_last(layout: ConvLayout, x_dims: &[i64], groups: i64, dtype: DType) -> bool {
    let float = matches!(dtype, DType::F32 | DType::Flex32 | DType::F16 | DType::BF16);
    let spatial = match x_dims.len() {
        4 => x_dims[2] > 1,
        5 => true,
        _ => false,
    };
    layout == ConvLayout::ChannelsLast && float && spatial && groups == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dims: &[i64], strides: &[i64]) -> ViewLayout {
        ViewLayout::strided(dims, strides)
    }

    #[test]
    fn channels_last_is_a_real_choice_only() {
        assert!(is_channels_last(&layout(&[2, 3, 4, 5], &[60, 1, 15, 3])));
        assert!(!is_channels_last(&layout(&[2, 3, 4, 5], &[60, 20, 5, 1])));
        // One channel, or one spatial position: both formats coincide.
        assert!(!is_channels_last(&layout(&[2, 1, 4, 5], &[20, 1, 5, 1])));
        assert!(!is_channels_last(&layout(&[2, 3, 1, 1], &[3, 1, 3, 3])));
        // Rank 3 has no channels-last format; a gap between images is not packed.
        assert!(!is_channels_last(&layout(&[2, 3, 7], &[21, 1, 3])));
        assert!(!is_channels_last(&layout(&[2, 3, 4, 5], &[61, 1, 15, 3])));
    }

    #[test]
    fn channels_last_policy_takes_ungrouped_float_image_convolutions() {
        let (img, vol, sig) = ([8, 3, 32, 32], [2, 4, 8, 8, 8], [8, 3, 1, 100]);
        let cl = ConvLayout::ChannelsLast;
        assert!(conv_channels_last(cl, &img, 1, DType::BF16));
        assert!(conv_channels_last(cl, &vol, 1, DType::F32));
        assert!(!conv_channels_last(cl, &img, 3, DType::F16));
        assert!(!conv_channels_last(cl, &sig, 1, DType::F16));
        assert!(!conv_channels_last(cl, &img, 1, DType::F64));
        assert!(!conv_channels_last(ConvLayout::ChannelsFirst, &img, 1, DType::F16));
    }
}
