//! What the ops add to [`TensorRef`]: graph tensors described by a view, and the check
//! that every operand may be used on the op's stream.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::memory::on_another_gpu;
use crate::graph::{Graph, TensorId};
use crate::types::TensorRef;

impl TensorRef<'_> {
    /// Adds the tensor to `g` as an input named `name`, with its pointer alignment.
    pub(crate) fn add_input(&self, g: &mut Graph, name: &str) -> TensorId {
        let id = g.tensor(name, &self.dims, &self.strides, self.dtype);
        g.set_alignment(id, self.alignment());
        id
    }

    /// Marks `id` as the output described by this tensor (dims, strides, dtype, alignment).
    pub(crate) fn bind_output(&self, g: &mut Graph, id: TensorId) {
        g.set_output(id, self.dtype)
            .set_dims(id, &self.dims)
            .set_strides(id, &self.strides)
            .set_alignment(id, self.alignment());
    }
}

/// Checks that every operand may be used on `stream` (a view of a cudarc slice only on the
/// stream it was lent to) and that no non-empty operand points into another GPU's memory
/// than `stream`'s: a kernel reading it would fault and leave the context unusable, so it is
/// an argument error naming `op`, the operand and both GPUs. Host, managed and unknown
/// addresses are left to the driver.
pub(crate) fn check_on_stream_device(
    stream: &Arc<CudaStream>,
    op: &'static str,
    operands: &[(&'static str, Option<&TensorRef>)],
) -> Result<()> {
    let here = stream.context().ordinal();
    stream.context().bind_to_thread()?;
    for &(arg, t) in operands {
        if let Some(t) = t {
            t.check_stream(stream, op, arg)?;
        }
        let Some(t) = t.filter(|t| !t.is_empty()) else {
            continue;
        };
        if let Some(there) = on_another_gpu(t.ptr, here) {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!(
                    "points into GPU {there}'s memory but the stream runs on GPU {here}: copy it to GPU {here} first"
                ),
            ));
        }
    }
    Ok(())
}
