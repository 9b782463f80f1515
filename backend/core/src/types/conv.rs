//! The convolution geometry every layer shares.

use crate::error::{Error, Result};

/// Output size of one spatial dim of a convolution, or `None` when the dilated filter does
/// not fit the padded input (or a size is not positive).
pub fn conv_output_size(input: i64, k: i64, pre: i64, post: i64, stride: i64, dil: i64) -> Option<i64> {
    if k < 1 || stride < 1 || dil < 1 {
        return None;
    }
    let eff = dil.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = input.checked_add(pre)?.checked_add(post)?;
    if padded < eff {
        return None;
    }
    Some((padded - eff) / stride + 1)
}

/// Convolution geometry: padding before and after, stride and dilation (one entry per
/// spatial dim) and the group count. The one description of a convolution every layer uses:
/// the ops (`ops::ConvParams` is this type), the graph's conv nodes (`graph::ConvAttrs`
/// holds one), the framework adapters and the float64 reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// Padding before each spatial dim.
    pub pre_padding: Vec<i64>,
    /// Padding after each spatial dim.
    pub post_padding: Vec<i64>,
    /// Stride.
    pub stride: Vec<i64>,
    /// Dilation.
    pub dilation: Vec<i64>,
    /// Groups: input channels / filter channels.
    pub groups: i64,
}

impl ConvGeometry {
    /// Symmetric padding.
    pub fn new(padding: &[i64], stride: &[i64], dilation: &[i64], groups: i64) -> Self {
        Self {
            pre_padding: padding.to_vec(),
            post_padding: padding.to_vec(),
            stride: stride.to_vec(),
            dilation: dilation.to_vec(),
            groups,
        }
    }

    /// Same, with separate padding after each spatial dim.
    pub fn with_post_padding(mut self, post: &[i64]) -> Self {
        self.post_padding = post.to_vec();
        self
    }

    /// Output dims (N, K, spatial...) of a forward convolution of `x_dims` by `w_dims`.
    pub fn output_dims(&self, x_dims: &[i64], w_dims: &[i64]) -> Result<Vec<i64>> {
        let s = self.stride.len();
        if x_dims.len() != s + 2 || w_dims.len() != s + 2 {
            return Err(Error::invalid_arg(
                "conv",
                "dims",
                format!("x {x_dims:?} and w {w_dims:?} need rank {}", s + 2),
            ));
        }
        self.check_geometry("conv")?;
        let mut out = vec![x_dims[0], w_dims[0]];
        for i in 0..s {
            let o = conv_output_size(
                x_dims[i + 2],
                w_dims[i + 2],
                self.pre_padding[i],
                self.post_padding[i],
                self.stride[i],
                self.dilation[i],
            )
            .ok_or_else(|| {
                Error::invalid_arg(
                    "conv",
                    "w",
                    format!("in spatial dim {i} the filter is empty or does not fit the padded input"),
                )
            })?;
            out.push(o);
        }
        Ok(out)
    }

    /// Checks the geometry itself: one entry per spatial dim everywhere, stride and dilation
    /// at least 1, no negative padding.
    pub(crate) fn check_geometry(&self, op: &'static str) -> Result<()> {
        let s = self.stride.len();
        if self.pre_padding.len() != s || self.post_padding.len() != s || self.dilation.len() != s {
            return Err(Error::invalid_arg(
                op,
                "params",
                "padding, stride and dilation need one entry per spatial dim",
            ));
        }
        if self.stride.iter().chain(&self.dilation).any(|&v| v < 1) {
            let msg = format!("stride {:?} and dilation {:?} must be >= 1", self.stride, self.dilation);
            return Err(Error::invalid_arg(op, "params", msg));
        }
        if self.pre_padding.iter().chain(&self.post_padding).any(|&v| v < 0) {
            return Err(Error::invalid_arg(op, "params", "padding must be >= 0"));
        }
        Ok(())
    }

    /// [`check_geometry`](Self::check_geometry), and `groups` against the input's `c` channels and
    /// the filter's `c_per_group`.
    pub(crate) fn check(&self, op: &'static str, c: i64, c_per_group: i64) -> Result<()> {
        self.check_geometry(op)?;
        if self.groups < 1 || c_per_group * self.groups != c {
            let msg = format!(
                "{} groups, but input has {c} channels and the filter {c_per_group} per group",
                self.groups
            );
            return Err(Error::invalid_arg(op, "groups", msg));
        }
        Ok(())
    }
}
