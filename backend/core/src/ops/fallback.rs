//! The unfused path for fused ops no cuDNN engine supports: run the main op, then one
//! NVRTC kernel applying bias + activation in place.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{Activation, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ffi::launch::{bias_act, BiasActArgs};
use crate::graph::DataType;
use crate::kernels::{stream_function, BIAS_ACT};

/// y = act(y + bias[c]) in place, where c is y's index along `channel_axis`.
pub(crate) fn bias_act_in_place(
    stream: &Arc<CudaStream>,
    op: &'static str,
    y: &TensorMut,
    bias: Option<&TensorRef>,
    channel_axis: usize,
    act: Activation,
) -> Result<()> {
    if !y.is_packed() {
        return Err(Error::Unsupported {
            graph: op.into(),
            reason: "the unfused fallback needs a packed (gap-free) output".into(),
        });
    }
    let name = match y.dtype {
        DataType::F32 => "bias_act_f32",
        DataType::F16 => "bias_act_f16",
        DataType::BF16 => "bias_act_bf16",
        other => return Err(Error::invalid_arg(op, "y", format!("dtype {other:?} not supported"))),
    };
    if let Some(b) = bias {
        if b.dtype != y.dtype || !b.is_packed() || b.numel() != y.dims[channel_axis] {
            return Err(Error::invalid_arg(
                op,
                "bias",
                format!("needs {} packed {:?} elements", y.dims[channel_axis], y.dtype),
            ));
        }
    }
    let f = stream_function(stream, BIAS_ACT, name)?;
    let (activation, param) = act.kernel_code();
    let args = BiasActArgs {
        y: y.address(),
        bias: bias.map_or(crate::types::DeviceAddress::NULL, |b| b.address()),
        n: y.numel(),
        channel_stride: y.strides[channel_axis].max(1),
        channels: y.dims[channel_axis].max(1),
        activation,
        param,
    };
    bias_act(stream, &f, &args)
}

/// `y = tanh(y)` in place on any strided view (the elementwise kernel).
pub(crate) fn tanh_in_place(stream: &Arc<CudaStream>, y: &TensorMut) -> Result<()> {
    crate::kernels::elementwise::unary(stream, crate::kernels::elementwise::UnaryOp::Tanh, y, y)
}
