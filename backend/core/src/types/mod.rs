//! The value types every layer shares, at the bottom of the crate (nothing here depends on
//! another module of it): element types, strided views of device memory, layout helpers, the
//! activation and pooling enums and the convolution geometry.
//!
//! The other modules re-export what their callers need (`ops::TensorRef`,
//! `graph::DataType`, ...), so either path works.

mod conv;
mod dtype;
mod layout;
mod op_kinds;
mod tensor;

pub use conv::{conv_output_size, ConvGeometry};
pub use dtype::{DataType, DeviceElement};
pub use layout::{
    channels_last_order, channels_last_strides, may_overlap, packed_strides, row_major_strides, stride_order, Shape,
};
pub use op_kinds::{Activation, PoolMode};
pub(crate) use tensor::check_part;
pub(crate) use tensor::DeviceAddress;
pub use tensor::{TensorMut, TensorRef};
