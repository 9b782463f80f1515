//! Small enums shared by the ops, the kernels and the framework adapters.

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

/// Pooling modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolMode {
    /// Max pooling (padding never wins).
    Max,
    /// Average over the whole window, padding counted as zeros.
    AvgIncludePadding,
    /// Average over the in-bounds elements only.
    AvgExcludePadding,
}
