//! `TensorRef` (a strided view of device memory) and `Activation`.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::memory::device_memory_ordinal;
use crate::graph::{packed_strides, DataType, Graph, PointwiseMode, TensorId};

/// A strided tensor in device memory. `ptr` is a `CUdeviceptr` on the stream's device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    /// Logical dims, e.g. N, C, H, W.
    pub dims: Vec<i64>,
    /// Strides in elements, one per dim.
    pub strides: Vec<i64>,
    /// Element type.
    pub dtype: DataType,
    /// Device address of element (0, 0, ...).
    pub ptr: u64,
}

impl TensorRef {
    /// A tensor with explicit strides.
    pub fn new(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> Self {
        Self {
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            dtype,
            ptr,
        }
    }

    /// A row-major packed tensor (NCHW for images).
    pub fn contiguous(dims: &[i64], dtype: DataType, ptr: u64) -> Self {
        let order: Vec<usize> = (0..dims.len()).collect();
        Self::new(dims, &packed_strides(dims, &order), dtype, ptr)
    }

    /// A channels-last packed tensor: dims N, C, spatial... stored as N, spatial..., C (NHWC).
    pub fn channels_last(dims: &[i64], dtype: DataType, ptr: u64) -> Self {
        let mut order: Vec<usize> = vec![0];
        order.extend(2..dims.len());
        if dims.len() > 1 {
            order.push(1);
        }
        Self::new(dims, &packed_strides(dims, &order), dtype, ptr)
    }

    /// Number of elements.
    pub fn numel(&self) -> i64 {
        self.dims.iter().product()
    }

    /// True when some dim is 0.
    pub fn is_empty(&self) -> bool {
        self.dims.contains(&0)
    }

    /// Elements spanned in memory (`1 + Σ (d-1)·s`; 0 when empty; saturates on overflow).
    pub fn extent_elements(&self) -> i64 {
        if self.is_empty() {
            return 0;
        }
        self.dims
            .iter()
            .zip(&self.strides)
            .try_fold(1i64, |acc, (&d, &s)| {
                (d - 1).checked_mul(s).and_then(|v| acc.checked_add(v))
            })
            .unwrap_or(i64::MAX)
    }

    /// True when the elements tile their memory exactly: no gaps and no overlaps
    /// (some ordering of the dims is row-major packed).
    pub fn is_packed(&self) -> bool {
        let mut axes: Vec<usize> = (0..self.dims.len()).filter(|&i| self.dims[i] > 1).collect();
        axes.sort_by_key(|&i| self.strides[i]);
        let mut expect = 1i64;
        for i in axes {
            if self.strides[i] != expect {
                return false;
            }
            expect = expect.saturating_mul(self.dims[i]);
        }
        true
    }

    /// Largest power of two (≤ 16) dividing the pointer: what cuDNN may assume.
    pub fn alignment(&self) -> u32 {
        if self.ptr == 0 {
            return 16;
        }
        (1u64 << self.ptr.trailing_zeros().min(4)) as u32
    }

    /// Checks the view itself: dims/strides lengths, signs, and pointer alignment.
    pub(crate) fn check(&self, op: &'static str, arg: &'static str) -> Result<()> {
        if self.dims.len() != self.strides.len() {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("{} dims but {} strides", self.dims.len(), self.strides.len()),
            ));
        }
        if let Some(d) = self.dims.iter().find(|&&d| d < 0) {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("negative dim {d} in {:?}", self.dims),
            ));
        }
        if let Some(s) = self.strides.iter().find(|&&s| s < 0) {
            return Err(Error::invalid_arg(
                op,
                arg,
                format!("negative stride {s} in {:?}: pass a copied tensor", self.strides),
            ));
        }
        if self.extent_elements().checked_mul(self.dtype.size() as i64).is_none() {
            let msg = format!(
                "dims {:?} / strides {:?} overflow a 64-bit byte extent",
                self.dims, self.strides
            );
            return Err(Error::invalid_arg(op, arg, msg));
        }
        if !self.is_empty() {
            if self.ptr == 0 {
                return Err(Error::invalid_arg(op, arg, "null device pointer"));
            }
            if !self.ptr.is_multiple_of(self.dtype.size() as u64) {
                return Err(Error::invalid_arg(
                    op,
                    arg,
                    format!(
                        "pointer {:#x} is not aligned to its {:?} element size ({} bytes)",
                        self.ptr,
                        self.dtype,
                        self.dtype.size()
                    ),
                ));
            }
        }
        Ok(())
    }

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

/// Checks that no non-empty operand points into another GPU's memory than `stream`'s: a
/// kernel reading it would fault and leave the context unusable, so it is an argument
/// error naming `op`, the operand and both GPUs. Host, managed and unknown addresses are
/// left to the driver.
pub(crate) fn check_on_stream_device(
    stream: &Arc<CudaStream>,
    op: &'static str,
    operands: &[(&'static str, Option<&TensorRef>)],
) -> Result<()> {
    let here = stream.context().ordinal();
    stream.context().bind_to_thread()?;
    for &(arg, t) in operands {
        let Some(t) = t.filter(|t| !t.is_empty()) else {
            continue;
        };
        if let Some(there) = device_memory_ordinal(t.ptr).filter(|&there| there != here) {
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

/// Activation applied after a bias in the fused ops.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Activation {
    /// No activation.
    #[default]
    Identity,
    /// max(x, 0)
    Relu,
    /// x·Φ(x)
    Gelu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// 1/(1+e^-x)
    Sigmoid,
    /// tanh x
    Tanh,
    /// ELU with alpha.
    Elu(f64),
    /// x·sigmoid(beta·x) (beta = 1 is SiLU).
    Swish(f64),
}

impl Activation {
    /// The pointwise mode, or None for identity.
    pub(crate) fn mode(self) -> Option<PointwiseMode> {
        Some(match self {
            Activation::Identity => return None,
            Activation::Relu => PointwiseMode::Relu,
            Activation::Gelu => PointwiseMode::Gelu,
            Activation::GeluTanh => PointwiseMode::GeluTanh,
            Activation::Sigmoid => PointwiseMode::Sigmoid,
            Activation::Tanh => PointwiseMode::Tanh,
            Activation::Elu(a) => PointwiseMode::Elu(a),
            Activation::Swish(b) => PointwiseMode::Swish(b),
        })
    }

    /// (code, parameter) understood by `kernels/bias_act.cu`.
    pub(crate) fn kernel_code(self) -> (i32, f32) {
        match self {
            Activation::Identity => (0, 0.0),
            Activation::Relu => (1, 0.0),
            Activation::Gelu => (2, 0.0),
            Activation::GeluTanh => (3, 0.0),
            Activation::Sigmoid => (4, 0.0),
            Activation::Tanh => (5, 0.0),
            Activation::Elu(a) => (6, a as f32),
            Activation::Swish(b) => (7, b as f32),
        }
    }
}
