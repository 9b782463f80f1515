//! Tensors and op attributes of the graph IR.

pub use crate::types::DataType;
use crate::types::{Activation, ConvGeometry};

/// Index of a tensor in its [`Graph`](super::Graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId(pub(crate) usize);

impl TensorId {
    /// Position in the graph's tensor list.
    pub fn index(self) -> usize {
        self.0
    }
}

/// A value passed by value (host memory) at execution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// An f32 scalar.
    F32(f32),
    /// An f64 scalar.
    F64(f64),
    /// An i64 scalar.
    I64(i64),
    /// An i32 scalar.
    I32(i32),
}

impl Scalar {
    /// The scalar's data type.
    pub fn data_type(self) -> DataType {
        match self {
            Scalar::F32(_) => DataType::F32,
            Scalar::F64(_) => DataType::F64,
            Scalar::I64(_) => DataType::I64,
            Scalar::I32(_) => DataType::I32,
        }
    }
}

/// A tensor of the graph: an input, an output, or a virtual intermediate.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Name used in error messages.
    pub name: String,
    /// Dims (empty until inferred).
    pub dims: Vec<i64>,
    /// Strides in elements (empty until inferred).
    pub strides: Vec<i64>,
    /// Element type (None until inferred).
    pub dtype: Option<DataType>,
    /// Unique id used in the variant pack.
    pub uid: i64,
    /// Virtual tensors never touch memory.
    pub is_virtual: bool,
    /// Pass-by-value scalar, if this is one.
    pub by_value: Option<Scalar>,
    /// Byte alignment of the device pointer (16, 8, 4 or 2).
    pub alignment: u32,
    /// Which of dims / strides / dtype the user set (the rest is re-inferred by every
    /// `validate()`).
    pub(crate) given: Given,
    /// A virtual output no node consumes is allowed (see [`Graph::allow_unused`](super::Graph::allow_unused)).
    pub(crate) may_be_unused: bool,
}

/// Which tensor properties were set by the user rather than inferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Given {
    pub dims: bool,
    pub strides: bool,
    pub dtype: bool,
}

impl Given {
    pub(crate) const ALL: Given = Given {
        dims: true,
        strides: true,
        dtype: true,
    };
}

impl Tensor {
    /// Number of elements (None on overflow).
    pub fn numel(&self) -> Option<i64> {
        self.dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
    }
}

/// Convolution mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ConvMode {
    /// Cross-correlation (what frameworks call convolution).
    #[default]
    CrossCorrelation,
    /// True convolution (flipped filter).
    Convolution,
}

/// Attributes of a convolution node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvAttrs {
    /// Padding, stride and dilation per spatial dim. Its `groups` is not used: a graph's
    /// convolution takes the group count from its tensors (input channels / filter channels).
    pub geometry: ConvGeometry,
    /// Convolution mode.
    pub mode: ConvMode,
    /// Accumulation type (default: the graph's compute type).
    pub compute: Option<DataType>,
}

impl ConvAttrs {
    /// A cross-correlation with symmetric padding, stride and dilation.
    pub fn new(padding: &[i64], stride: &[i64], dilation: &[i64]) -> Self {
        Self::cross_correlation(ConvGeometry::new(padding, stride, dilation, 1))
    }

    /// A cross-correlation (what frameworks call convolution) of `geometry`.
    pub fn cross_correlation(geometry: ConvGeometry) -> Self {
        Self {
            geometry,
            mode: ConvMode::CrossCorrelation,
            compute: None,
        }
    }

    /// Number of spatial dims.
    pub fn spatial(&self) -> usize {
        self.geometry.stride.len()
    }
}

/// Elementwise modes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PointwiseMode {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// max(a, b)
    Max,
    /// min(a, b)
    Min,
    /// e^a
    Exp,
    /// ln a
    Log,
    /// √a
    Sqrt,
    /// 1/√a
    Rsqrt,
    /// -a
    Neg,
    /// |a|
    Abs,
    /// a (a copy / cast)
    Identity,
    /// max(a, 0)
    Relu,
    /// a·Φ(a) (erf form)
    Gelu,
    /// GELU, tanh approximation
    GeluTanh,
    /// 1/(1+e^-a)
    Sigmoid,
    /// tanh a
    Tanh,
    /// ELU with the given alpha
    Elu(f64),
    /// a·sigmoid(beta·a) (beta = 1: SiLU)
    Swish(f64),
    /// dy·(x > 0) (a = dy, b = x)
    ReluBwd,
    /// dy·gelu'(x)
    GeluBwd,
    /// dy·σ'(x)
    SigmoidBwd,
    /// dy·tanh'(x)
    TanhBwd,
    /// The index of each element of `a` along the given axis (i32 output; `a` gives the
    /// shape only).
    GenIndex(i64),
    /// a >= b (bool output).
    CmpGe,
    /// `mask ? a : b`, the mask being the third input (see [`Graph::select`](crate::graph::Graph::select)).
    BinarySelect,
}

impl PointwiseMode {
    /// The pointwise mode of a fused activation, or None for identity.
    pub(crate) fn of_activation(a: Activation) -> Option<Self> {
        Some(match a {
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

    /// True when the mode takes two inputs.
    pub fn is_binary(self) -> bool {
        use PointwiseMode::*;
        matches!(self, Add | Sub | Mul | Div | Max | Min | CmpGe | BinarySelect) || self.is_backward()
    }

    /// True for activation-backward modes (inputs dy, x; output dx).
    pub fn is_backward(self) -> bool {
        use PointwiseMode::*;
        matches!(self, ReluBwd | GeluBwd | SigmoidBwd | TanhBwd)
    }

    /// The `cudnnPointwiseMode_t` value.
    pub(crate) fn cudnn(self) -> u32 {
        use PointwiseMode::*;
        match self {
            Add => 0,
            Mul => 1,
            Min => 2,
            Max => 3,
            Sqrt => 4,
            Div => 6,
            Sub => 9,
            Abs => 10,
            Exp => 13,
            Log => 15,
            Neg => 16,
            Rsqrt => 17,
            Identity => 21,
            Relu => 100,
            Tanh => 101,
            Sigmoid => 102,
            Elu(_) => 103,
            Gelu => 104,
            Swish(_) => 106,
            GeluTanh => 107,
            ReluBwd => 200,
            TanhBwd => 201,
            SigmoidBwd => 202,
            GeluBwd => 204,
            CmpGe => 303,
            GenIndex(_) => 501,
            BinarySelect => 601,
        }
    }

    pub(crate) fn param(self) -> f64 {
        match self {
            PointwiseMode::Elu(a) => a,
            PointwiseMode::Swish(b) => b,
            PointwiseMode::GenIndex(axis) => axis as f64,
            _ => 0.0,
        }
    }
}

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Σ
    Sum,
    /// max
    Max,
    /// min
    Min,
    /// mean
    Mean,
}

impl ReduceOp {
    /// The `cudnnReduceTensorOp_t` value.
    pub(crate) fn cudnn(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Mean => 5,
        }
    }
}

/// Pooling modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResampleMode {
    /// Max pooling (padding counts as -inf).
    MaxPool,
    /// Average pooling dividing by the full window (padding counts as 0).
    AvgPoolIncludePadding,
    /// Average pooling dividing by the in-bounds element count.
    AvgPoolExcludePadding,
}

impl ResampleMode {
    /// The `cudnnResampleMode_t` value.
    pub(crate) fn cudnn(self) -> u32 {
        match self {
            ResampleMode::MaxPool => 3,
            ResampleMode::AvgPoolIncludePadding => 2,
            ResampleMode::AvgPoolExcludePadding => 4,
        }
    }
}

/// Attributes of a pooling (resample) node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResampleAttrs {
    /// Pooling mode.
    pub mode: ResampleMode,
    /// Window size per spatial dim.
    pub window: Vec<i64>,
    /// Stride per spatial dim.
    pub stride: Vec<i64>,
    /// Padding before each spatial dim.
    pub pre_padding: Vec<i64>,
    /// Padding after each spatial dim.
    pub post_padding: Vec<i64>,
}

impl ResampleAttrs {
    /// Number of spatial dims.
    pub fn spatial(&self) -> usize {
        self.window.len()
    }
}

/// Normalization modes of [`Op::NormForward`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormMode {
    /// `(x - mean) / sqrt(var + eps) * scale + bias`, statistics over every dim but the first.
    LayerNorm,
    /// `x / sqrt(mean(x²) + eps) * scale (+ bias)`, statistics over every dim but the first.
    RmsNorm,
}

impl NormMode {
    /// The `cudnnBackendNormMode_t` value.
    pub(crate) fn cudnn(self) -> u32 {
        match self {
            NormMode::LayerNorm => 0,
            NormMode::RmsNorm => 4,
        }
    }
}

/// One operation of the graph. Field names are the op's ports (inputs, then outputs).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// y = conv(x, w)
    ConvFprop {
        x: TensorId,
        w: TensorId,
        y: TensorId,
        attrs: ConvAttrs,
    },
    /// dx = conv_bwd_data(dy, w)
    ConvDgrad {
        dy: TensorId,
        w: TensorId,
        dx: TensorId,
        attrs: ConvAttrs,
    },
    /// dw = conv_bwd_filter(x, dy)
    ConvWgrad {
        x: TensorId,
        dy: TensorId,
        dw: TensorId,
        attrs: ConvAttrs,
    },
    /// c = a · b
    Matmul {
        a: TensorId,
        b: TensorId,
        c: TensorId,
        compute: Option<DataType>,
    },
    /// y = mode(a[, b][, t]) (`t`: the mask of a select)
    Pointwise {
        mode: PointwiseMode,
        a: TensorId,
        b: Option<TensorId>,
        t: Option<TensorId>,
        y: TensorId,
        compute: Option<DataType>,
    },
    /// y = reduce(x)
    Reduction {
        op: ReduceOp,
        x: TensorId,
        y: TensorId,
        compute: Option<DataType>,
    },
    /// y = pool(x)
    ResampleFwd {
        x: TensorId,
        y: TensorId,
        index: Option<TensorId>,
        attrs: ResampleAttrs,
    },
    /// dx = pool_bwd(dy[, x, y, index])
    ResampleBwd {
        dy: TensorId,
        dx: TensorId,
        x: Option<TensorId>,
        y: Option<TensorId>,
        index: Option<TensorId>,
        attrs: ResampleAttrs,
    },
    /// y = norm(x) · scale + bias. `epsilon` is a scalar tensor; `mean` and `inv_var`
    /// (training phase) receive the per-row statistics.
    NormForward {
        mode: NormMode,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: TensorId,
        y: TensorId,
        mean: Option<TensorId>,
        inv_var: Option<TensorId>,
    },
    /// y = x under other dims and strides (same elements, e.g. a transposed view of a
    /// virtual tensor inside a fused pattern).
    Reshape { x: TensorId, y: TensorId },
    /// y = Bernoulli(`keep_probability`) samples (1.0 kept, 0.0 dropped) from the Philox
    /// generator at `seed` and `offset` (device `I64` scalars), the same for the same pair:
    /// the dropout mask of a fused attention, regenerated by its backward.
    Rng {
        seed: TensorId,
        offset: TensorId,
        y: TensorId,
        keep_probability: f64,
    },
}

impl Op {
    /// Stable short name of the op kind.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::ConvFprop { .. } => "conv_fprop",
            Op::ConvDgrad { .. } => "conv_dgrad",
            Op::ConvWgrad { .. } => "conv_wgrad",
            Op::Matmul { .. } => "matmul",
            Op::Pointwise { .. } => "pointwise",
            Op::Reduction { .. } => "reduction",
            Op::ResampleFwd { .. } => "resample_fwd",
            Op::ResampleBwd { .. } => "resample_bwd",
            Op::NormForward { .. } => "norm_forward",
            Op::Reshape { .. } => "reshape",
            Op::Rng { .. } => "rng",
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Op::Pointwise { mode, .. } => format!("pointwise({mode:?})"),
            Op::Reduction { op, .. } => format!("reduction({op:?})"),
            Op::ResampleFwd { attrs, .. } | Op::ResampleBwd { attrs, .. } => {
                format!("{}({:?})", self.kind_name(), attrs.mode)
            }
            Op::NormForward { mode, .. } => format!("norm_forward({mode:?})"),
            _ => self.kind_name().to_string(),
        }
    }

    /// Input tensors, in port order.
    pub fn inputs(&self) -> Vec<TensorId> {
        match self {
            Op::ConvFprop { x, w, .. } => vec![*x, *w],
            Op::ConvDgrad { dy, w, .. } => vec![*dy, *w],
            Op::ConvWgrad { x, dy, .. } => vec![*x, *dy],
            Op::Matmul { a, b, .. } => vec![*a, *b],
            Op::Pointwise { a, b, t, .. } => std::iter::once(*a).chain(*b).chain(*t).collect(),
            Op::Reduction { x, .. } => vec![*x],
            Op::ResampleFwd { x, .. } => vec![*x],
            Op::ResampleBwd { dy, x, y, index, .. } => std::iter::once(*dy).chain(*x).chain(*y).chain(*index).collect(),
            Op::NormForward {
                x,
                scale,
                bias,
                epsilon,
                ..
            } => [*x, *scale].into_iter().chain(*bias).chain([*epsilon]).collect(),
            Op::Reshape { x, .. } => vec![*x],
            Op::Rng { seed, offset, .. } => vec![*seed, *offset],
        }
    }

    /// Output tensors.
    pub fn outputs(&self) -> Vec<TensorId> {
        match self {
            Op::ConvFprop { y, .. } => vec![*y],
            Op::ConvDgrad { dx, .. } => vec![*dx],
            Op::ConvWgrad { dw, .. } => vec![*dw],
            Op::Matmul { c, .. } => vec![*c],
            Op::Pointwise { y, .. } => vec![*y],
            Op::Reduction { y, .. } => vec![*y],
            Op::ResampleFwd { y, index, .. } => std::iter::once(*y).chain(*index).collect(),
            Op::ResampleBwd { dx, .. } => vec![*dx],
            Op::NormForward { y, mean, inv_var, .. } => std::iter::once(*y).chain(*mean).chain(*inv_var).collect(),
            Op::Reshape { y, .. } | Op::Rng { y, .. } => vec![*y],
        }
    }
}

/// A named node.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Name used in errors (`kind#index`).
    pub name: String,
    /// The operation.
    pub op: Op,
}
