//! Which Burn IR nodes this crate runs, and the engine parameters each maps to.
//!
//! A [`Claim`] is built from one IR node (a `ModuleOperationIr`, or the float `select_assign`
//! with addition that Burn's embedding gradient is; stream-relative IR: ids and shapes are
//! placeholders until the operation runs) and names the tensors the node reads and writes
//! and the engine call. Everything here is pure and runs on the CPU.

use burn_backend::tensor::IndexingUpdateOp;
use burn_backend::DType;
use burn_ir::{BaseOperationIr, ModuleOperationIr, OperationIr, TensorIr};
use cudnn_backend_core::ops::pool2d::Pool2d;
use cudnn_backend_core::ops::{ConvParams, ConvTransposeParams, PoolMode, PoolParams};
use cudnn_backend_core::types::DataType;

/// One engine call for one IR node.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// `out = conv(x, w) (+ bias)`: `ops::conv_forward`, or `ops::conv_bias_act_forward`
    /// with the identity activation when the node has a bias.
    ConvForward {
        /// Input `[N, C, spatial..]`.
        x: TensorIr,
        /// Filter `[K, C/groups, window..]`.
        w: TensorIr,
        /// Bias `[K]`, if any.
        bias: Option<TensorIr>,
        /// Output `[N, K, spatial..]`.
        out: TensorIr,
        /// Geometry.
        params: ConvParams,
    },
    /// `out = dx = conv_backward_data(dy, w)`: the node also reads `x` (its shape only).
    ConvBackwardData {
        /// The forward's input (read by the node, not by the engine).
        x: TensorIr,
        /// Filter.
        w: TensorIr,
        /// Output gradient.
        dy: TensorIr,
        /// Input gradient (x's shape).
        out: TensorIr,
        /// Forward geometry.
        params: ConvParams,
    },
    /// `out = dw = conv_backward_filter(x, dy)`: the node also reads `w` (its shape only).
    ConvBackwardFilter {
        /// The forward's input.
        x: TensorIr,
        /// Filter (read by the node, not by the engine).
        w: TensorIr,
        /// Output gradient.
        dy: TensorIr,
        /// Filter gradient (w's shape).
        out: TensorIr,
        /// Forward geometry.
        params: ConvParams,
    },
    /// `out = conv_transpose(x, w) (+ bias)`: `ops::conv_transpose_forward` (cuDNN's
    /// backward-data of the convolution it transposes; the bias added by the engine's bias
    /// kernel). Its gradients reach the fusion stream as convolution nodes.
    ConvTransposeForward {
        /// Input `[N, C_in, spatial..]`.
        x: TensorIr,
        /// Filter `[C_in, C_out/groups, window..]`.
        w: TensorIr,
        /// Bias `[C_out]`, if any.
        bias: Option<TensorIr>,
        /// Output `[N, C_out, spatial..]`.
        out: TensorIr,
        /// Geometry.
        params: ConvTransposeParams,
    },
    /// `out = pool(x)`: `ops::pool_forward` (max without indices, or average).
    PoolForward {
        /// Input.
        x: TensorIr,
        /// Output.
        out: TensorIr,
        /// Window geometry and mode.
        params: PoolParams,
    },
    /// Average pooling's `out = dx` from `dy`: `ops::pool_backward` (the node also reads x).
    AvgPoolBackward {
        /// The forward's input (read by the node, not by the engine).
        x: TensorIr,
        /// Output gradient.
        dy: TensorIr,
        /// Input gradient.
        out: TensorIr,
        /// Window geometry and mode.
        params: PoolParams,
    },
    /// Max pooling's `out = dx` from `dy`: the forward's output is recomputed from `x`
    /// and `ops::pool_backward` routes each gradient to its window's maximum; the node's
    /// `indices` are read but not used (on ties the gradient may go to another maximal
    /// element than Burn's index names: an equally valid subgradient).
    MaxPoolBackward {
        /// The forward's input.
        x: TensorIr,
        /// Output gradient.
        dy: TensorIr,
        /// The forward's indices (an integer tensor).
        indices: TensorIr,
        /// Input gradient.
        out: TensorIr,
        /// Window geometry.
        params: PoolParams,
    },
    /// Average pooling by the engine's pooling kernels, which follow PyTorch's (and Burn's)
    /// `ceil_mode` and divisor rules: `ops::pool2d::avg_pool2d`. 2-D pooling with
    /// `ceil_mode`, and every 1-D average pooling (as 2-D with a unit height).
    AvgPoolKernel {
        /// Input.
        x: TensorIr,
        /// Output.
        out: TensorIr,
        /// Window geometry (2-D; a 1-D pool's height is 1).
        pool: Pool2d,
        /// Whether padded elements count in the divisor.
        count_include_pad: bool,
    },
    /// The gradient of [`Claim::AvgPoolKernel`]: `ops::pool2d::avg_pool2d_backward` (the node
    /// also reads x).
    AvgPoolKernelBackward {
        /// The forward's input (read by the node, not by the engine).
        x: TensorIr,
        /// Output gradient.
        dy: TensorIr,
        /// Input gradient.
        out: TensorIr,
        /// Window geometry.
        pool: Pool2d,
        /// Whether padded elements count in the divisor.
        count_include_pad: bool,
    },
    /// Adaptive average pooling (1-D or 2-D): `ops::pool2d::adaptive_avg_pool2d`, the output
    /// size from the output's dims.
    AdaptiveAvgPool {
        /// Input.
        x: TensorIr,
        /// Output.
        out: TensorIr,
    },
    /// The gradient of [`Claim::AdaptiveAvgPool`]: `ops::pool2d::adaptive_avg_pool2d_backward`
    /// (the node also reads x).
    AdaptiveAvgPoolBackward {
        /// The forward's input (read by the node, not by the engine).
        x: TensorIr,
        /// Output gradient.
        dy: TensorIr,
        /// Input gradient.
        out: TensorIr,
    },
    /// `out = tensor` with row `i` of `value` added to row `indices[i]` (a float
    /// `select_assign` along dim 0 with addition: Burn's embedding gradient): a copy, then
    /// `ops::index::index_add`, which sums the rows of equal indices before adding them (many
    /// padding tokens on one row do not serialize in atomics).
    RowsAdd {
        /// The tensor added to `[rows, ..]`.
        tensor: TensorIr,
        /// Row of each value row, `[n]` I32 or I64.
        indices: TensorIr,
        /// The rows added, `[n, ..]` (tensor's trailing dims).
        value: TensorIr,
        /// The result (tensor's dims).
        out: TensorIr,
    },
}

/// Why a node stays Burn's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Declined {
    /// Not a node this crate claims (element-wise, matmul, transposed convolution, ...).
    NotClaimed,
    /// A dtype other than f32, f16 or bf16, or operands of different dtypes.
    DType,
    /// Max pooling with `ceil_mode` (cuDNN's output size rounds down; the pooling kernels'
    /// max pooling writes indices, which the plain node has no tensor for).
    CeilMode,
    /// Max pooling with a dilation other than 1.
    Dilation,
}

impl Claim {
    /// The claim for a stream operation, or why it stays Burn's.
    pub fn from_operation(op: &OperationIr) -> Result<Self, Declined> {
        match op {
            OperationIr::Module(node) => Self::from_ir(node),
            OperationIr::BaseFloat(BaseOperationIr::SelectAssign(a)) => {
                let (t, v, i) = (&a.tensor.shape, &a.value.shape, &a.indices.shape);
                let rows_of_tensor = a.dim == 0
                    && t.num_dims() == v.num_dims()
                    && i.num_dims() == 1
                    && i[0] == v[0]
                    && t.iter().skip(1).eq(v.iter().skip(1));
                if a.update != IndexingUpdateOp::Add || !rows_of_tensor {
                    return Err(Declined::NotClaimed);
                }
                if !matches!(a.indices.dtype, DType::I32 | DType::I64) {
                    return Err(Declined::DType);
                }
                let claim = Claim::RowsAdd {
                    tensor: a.tensor.clone(),
                    indices: a.indices.clone(),
                    value: a.value.clone(),
                    out: a.out.clone(),
                };
                claim.dtype()?;
                Ok(claim)
            }
            _ => Err(Declined::NotClaimed),
        }
    }

    /// The claim for `node`, or why it stays Burn's.
    pub fn from_ir(node: &ModuleOperationIr) -> Result<Self, Declined> {
        use ModuleOperationIr as M;
        let claim = match node {
            M::Conv1d(op) => conv_forward(&op.x, &op.weight, &op.bias, &op.out, conv1d(&op.options)),
            M::Conv2d(op) => conv_forward(&op.x, &op.weight, &op.bias, &op.out, conv2d(&op.options)),
            M::Conv3d(op) => conv_forward(&op.x, &op.weight, &op.bias, &op.out, conv3d(&op.options)),
            M::Conv1dXBackward(op) => conv_data(&op.x, &op.weight, &op.output_grad, &op.out, conv1d(&op.options)),
            M::Conv2dXBackward(op) => conv_data(&op.x, &op.weight, &op.output_grad, &op.out, conv2d(&op.options)),
            M::Conv3dXBackward(op) => conv_data(&op.x, &op.weight, &op.output_grad, &op.out, conv3d(&op.options)),
            M::Conv1dWeightBackward(op) => {
                conv_filter(&op.x, &op.weight, &op.output_grad, &op.out, conv1d(&op.options))
            }
            M::Conv2dWeightBackward(op) => {
                conv_filter(&op.x, &op.weight, &op.output_grad, &op.out, conv2d(&op.options))
            }
            M::Conv3dWeightBackward(op) => {
                conv_filter(&op.x, &op.weight, &op.output_grad, &op.out, conv3d(&op.options))
            }
            M::ConvTranspose1d(op) => conv_transpose!(op),
            M::ConvTranspose2d(op) => conv_transpose!(op),
            M::ConvTranspose3d(op) => conv_transpose!(op),
            M::AvgPool2d(op) if op.ceil_mode => Claim::AvgPoolKernel {
                x: op.x.clone(),
                out: op.out.clone(),
                pool: pool2d(op.kernel_size, op.stride, op.padding, true),
                count_include_pad: op.count_include_pad,
            },
            M::AvgPool2d(op) => Claim::PoolForward {
                x: op.x.clone(),
                out: op.out.clone(),
                params: pool(avg_mode(op.count_include_pad), op.kernel_size, op.stride, op.padding),
            },
            M::AvgPool2dBackward(op) if op.ceil_mode => Claim::AvgPoolKernelBackward {
                x: op.x.clone(),
                dy: op.grad.clone(),
                out: op.out.clone(),
                pool: pool2d(op.kernel_size, op.stride, op.padding, true),
                count_include_pad: op.count_include_pad,
            },
            M::AvgPool2dBackward(op) => Claim::AvgPoolBackward {
                x: op.x.clone(),
                dy: op.grad.clone(),
                out: op.out.clone(),
                params: pool(avg_mode(op.count_include_pad), op.kernel_size, op.stride, op.padding),
            },
            M::AvgPool1d(op) => Claim::AvgPoolKernel {
                x: op.x.clone(),
                out: op.out.clone(),
                pool: pool2d([1, op.kernel_size], [1, op.stride], [0, op.padding], op.ceil_mode),
                count_include_pad: op.count_include_pad,
            },
            M::AvgPool1dBackward(op) => Claim::AvgPoolKernelBackward {
                x: op.x.clone(),
                dy: op.grad.clone(),
                out: op.out.clone(),
                pool: pool2d([1, op.kernel_size], [1, op.stride], [0, op.padding], op.ceil_mode),
                count_include_pad: op.count_include_pad,
            },
            M::AdaptiveAvgPool1d(op) => Claim::AdaptiveAvgPool {
                x: op.x.clone(),
                out: op.out.clone(),
            },
            M::AdaptiveAvgPool2d(op) => Claim::AdaptiveAvgPool {
                x: op.x.clone(),
                out: op.out.clone(),
            },
            M::AdaptiveAvgPool1dBackward(op) => Claim::AdaptiveAvgPoolBackward {
                x: op.x.clone(),
                dy: op.grad.clone(),
                out: op.out.clone(),
            },
            M::AdaptiveAvgPool2dBackward(op) => Claim::AdaptiveAvgPoolBackward {
                x: op.x.clone(),
                dy: op.grad.clone(),
                out: op.out.clone(),
            },
            M::MaxPool2d(op) => {
                max_pool_supported(op.ceil_mode, op.dilation)?;
                Claim::PoolForward {
                    x: op.x.clone(),
                    out: op.out.clone(),
                    params: pool(PoolMode::Max, op.kernel_size, op.stride, op.padding),
                }
            }
            M::MaxPool2dWithIndicesBackward(op) => {
                max_pool_supported(op.ceil_mode, op.dilation)?;
                Claim::MaxPoolBackward {
                    x: op.x.clone(),
                    dy: op.grad.clone(),
                    indices: op.indices.clone(),
                    out: op.out.clone(),
                    params: pool(PoolMode::Max, op.kernel_size, op.stride, op.padding),
                }
            }
            _ => return Err(Declined::NotClaimed),
        };
        claim.dtype()?;
        Ok(claim)
    }

    /// The engine's name of the operation (for errors and counters).
    pub fn name(&self) -> &'static str {
        match self {
            Claim::ConvForward { .. } => "conv_forward",
            Claim::ConvBackwardData { .. } => "conv_backward_data",
            Claim::ConvBackwardFilter { .. } => "conv_backward_filter",
            Claim::ConvTransposeForward { .. } => "conv_transpose_forward",
            Claim::PoolForward { .. } | Claim::AvgPoolKernel { .. } | Claim::AdaptiveAvgPool { .. } => "pool_forward",
            Claim::AvgPoolBackward { .. }
            | Claim::MaxPoolBackward { .. }
            | Claim::AvgPoolKernelBackward { .. }
            | Claim::AdaptiveAvgPoolBackward { .. } => "pool_backward",
            Claim::RowsAdd { .. } => "index_add",
        }
    }

    /// The float tensors the node reads, in the engine's operand order (tensors read only
    /// for their shape included), then its integer inputs.
    pub fn inputs(&self) -> Vec<&TensorIr> {
        match self {
            Claim::ConvForward { x, w, bias, .. } | Claim::ConvTransposeForward { x, w, bias, .. } => {
                [Some(x), Some(w), bias.as_ref()].into_iter().flatten().collect()
            }
            Claim::ConvBackwardData { x, w, dy, .. } | Claim::ConvBackwardFilter { x, w, dy, .. } => vec![x, w, dy],
            Claim::PoolForward { x, .. } | Claim::AvgPoolKernel { x, .. } | Claim::AdaptiveAvgPool { x, .. } => vec![x],
            Claim::AvgPoolBackward { x, dy, .. }
            | Claim::AvgPoolKernelBackward { x, dy, .. }
            | Claim::AdaptiveAvgPoolBackward { x, dy, .. } => vec![x, dy],
            Claim::RowsAdd {
                tensor, indices, value, ..
            } => vec![tensor, indices, value],
            Claim::MaxPoolBackward { x, dy, indices, .. } => vec![x, dy, indices],
        }
    }

    /// The tensor the node writes.
    pub fn output(&self) -> &TensorIr {
        match self {
            Claim::ConvForward { out, .. }
            | Claim::ConvTransposeForward { out, .. }
            | Claim::ConvBackwardData { out, .. }
            | Claim::ConvBackwardFilter { out, .. }
            | Claim::PoolForward { out, .. }
            | Claim::AvgPoolBackward { out, .. }
            | Claim::MaxPoolBackward { out, .. }
            | Claim::AvgPoolKernel { out, .. }
            | Claim::AvgPoolKernelBackward { out, .. }
            | Claim::AdaptiveAvgPool { out, .. }
            | Claim::AdaptiveAvgPoolBackward { out, .. }
            | Claim::RowsAdd { out, .. } => out,
        }
    }

    /// The one engine dtype of every float operand.
    pub fn dtype(&self) -> Result<DataType, Declined> {
        let out = data_type(self.output().dtype).ok_or(Declined::DType)?;
        let floats = self.inputs().into_iter().filter(|t| !is_indices(self, t));
        if floats.into_iter().all(|t| data_type(t.dtype) == Some(out)) {
            Ok(out)
        } else {
            Err(Declined::DType)
        }
    }
}

/// Whether `t` is the claim's integer operand (indices), which the dtype rule skips.
fn is_indices(claim: &Claim, t: &TensorIr) -> bool {
    match claim {
        Claim::MaxPoolBackward { indices, .. } | Claim::RowsAdd { indices, .. } => indices.id == t.id,
        _ => false,
    }
}

/// The engine dtype of a Burn float dtype this crate runs.
pub fn data_type(d: DType) -> Option<DataType> {
    match d {
        DType::F32 => Some(DataType::F32),
        DType::F16 => Some(DataType::F16),
        DType::BF16 => Some(DataType::BF16),
        _ => None,
    }
}

fn conv_forward(x: &TensorIr, w: &TensorIr, bias: &Option<TensorIr>, out: &TensorIr, params: ConvParams) -> Claim {
    Claim::ConvForward {
        x: x.clone(),
        w: w.clone(),
        bias: bias.clone(),
        out: out.clone(),
        params,
    }
}

/// The claim of a `ConvTranspose{1,2,3}dOpIr` (the three differ only in their options' rank).
macro_rules! conv_transpose {
    ($op:expr) => {
        Claim::ConvTransposeForward {
            x: $op.x.clone(),
            w: $op.weight.clone(),
            bias: $op.bias.clone(),
            out: $op.out.clone(),
            params: transposed(
                &$op.options.padding,
                &$op.options.stride,
                &$op.options.dilation,
                &$op.options.padding_out,
                $op.options.groups,
            ),
        }
    };
}
use conv_transpose;

/// The engine geometry of Burn's transposed-convolution options (symmetric padding).
fn transposed(
    padding: &[usize],
    stride: &[usize],
    dilation: &[usize],
    padding_out: &[usize],
    groups: usize,
) -> ConvTransposeParams {
    ConvTransposeParams {
        conv: ConvParams::new(&i64s(padding), &i64s(stride), &i64s(dilation), groups as i64),
        padding_out: i64s(padding_out),
    }
}

fn conv_data(x: &TensorIr, w: &TensorIr, dy: &TensorIr, out: &TensorIr, params: ConvParams) -> Claim {
    Claim::ConvBackwardData {
        x: x.clone(),
        w: w.clone(),
        dy: dy.clone(),
        out: out.clone(),
        params,
    }
}

fn conv_filter(x: &TensorIr, w: &TensorIr, dy: &TensorIr, out: &TensorIr, params: ConvParams) -> Claim {
    Claim::ConvBackwardFilter {
        x: x.clone(),
        w: w.clone(),
        dy: dy.clone(),
        out: out.clone(),
        params,
    }
}

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// The engine geometry of Burn's 1-D convolution options (padding before/after per dim).
pub fn conv1d(o: &burn_ir::Conv1dOptionsIr) -> ConvParams {
    conv_params(&o.padding, &o.stride, &o.dilation, o.groups)
}

/// The engine geometry of Burn's 2-D convolution options (padding before/after per dim).
pub fn conv2d(o: &burn_ir::Conv2dOptionsIr) -> ConvParams {
    conv_params(&o.padding, &o.stride, &o.dilation, o.groups)
}

/// The engine geometry of Burn's 3-D convolution options (symmetric padding).
pub fn conv3d(o: &burn_ir::Conv3dOptionsIr) -> ConvParams {
    ConvParams::new(&i64s(&o.padding), &i64s(&o.stride), &i64s(&o.dilation), o.groups as i64)
}

fn conv_params(padding: &[(usize, usize)], stride: &[usize], dilation: &[usize], groups: usize) -> ConvParams {
    let pre: Vec<usize> = padding.iter().map(|p| p.0).collect();
    let post: Vec<usize> = padding.iter().map(|p| p.1).collect();
    ConvParams::new(&i64s(&pre), &i64s(stride), &i64s(dilation), groups as i64).with_post_padding(&i64s(&post))
}

fn avg_mode(count_include_pad: bool) -> PoolMode {
    if count_include_pad {
        PoolMode::AvgIncludePadding
    } else {
        PoolMode::AvgExcludePadding
    }
}

fn pool(mode: PoolMode, window: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> PoolParams {
    PoolParams::new(mode, &i64s(&window), &i64s(&stride), &i64s(&padding))
}

/// The pooling kernels' 2-D geometry (no dilation: average pooling has none).
fn pool2d(window: [usize; 2], stride: [usize; 2], padding: [usize; 2], ceil_mode: bool) -> Pool2d {
    let i = |v: [usize; 2]| v.map(|x| x as i64);
    Pool2d {
        kernel: i(window),
        stride: i(stride),
        padding: i(padding),
        dilation: [1, 1],
        ceil_mode,
    }
}

impl Claim {
    /// Whether the engine runs the node's 3-D `[N, C, L]` operands as `[N, C, 1, L]` (1-D
    /// pooling on the 2-D kernels).
    pub fn unit_height(&self) -> bool {
        match self {
            Claim::AvgPoolKernel { x, .. }
            | Claim::AvgPoolKernelBackward { x, .. }
            | Claim::AdaptiveAvgPool { x, .. }
            | Claim::AdaptiveAvgPoolBackward { x, .. } => x.shape.num_dims() == 3,
            _ => false,
        }
    }
}

fn max_pool_supported(ceil_mode: bool, dilation: [usize; 2]) -> Result<(), Declined> {
    if ceil_mode {
        Err(Declined::CeilMode)
    } else if dilation != [1, 1] {
        Err(Declined::Dilation)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_backend::Shape;
    use burn_ir::{
        AvgPool2dOpIr, Conv1dOptionsIr, Conv2dOpIr, Conv2dOptionsIr, Conv2dWeightBackwardOpIr, Conv2dXBackwardOpIr,
        Conv3dOpIr, Conv3dOptionsIr, MaxPool2dOpIr, MaxPool2dWithIndicesBackwardOpIr, TensorId, TensorStatus,
    };

    fn t(id: u64, shape: &[usize], dtype: DType) -> TensorIr {
        TensorIr {
            id: TensorId::new(id),
            shape: Shape::from(shape.to_vec()),
            status: TensorStatus::ReadOnly,
            dtype,
        }
    }

    fn opts2() -> Conv2dOptionsIr {
        Conv2dOptionsIr {
            stride: [2, 1],
            padding: [(1, 2), (0, 3)],
            dilation: [1, 2],
            groups: 4,
        }
    }

    #[test]
    fn conv2d_options_map_to_asymmetric_geometry() {
        let p = conv2d(&opts2());
        assert_eq!(p.pre_padding, vec![1, 0]);
        assert_eq!(p.post_padding, vec![2, 3]);
        assert_eq!(p.stride, vec![2, 1]);
        assert_eq!(p.dilation, vec![1, 2]);
        assert_eq!(p.groups, 4);
    }

    #[test]
    fn conv1d_and_conv3d_options() {
        let p = conv1d(&Conv1dOptionsIr {
            stride: [3],
            padding: [(2, 1)],
            dilation: [2],
            groups: 1,
        });
        assert_eq!(
            (p.pre_padding, p.post_padding, p.stride, p.dilation),
            (vec![2], vec![1], vec![3], vec![2])
        );
        let p = conv3d(&Conv3dOptionsIr {
            stride: [1, 2, 3],
            padding: [1, 0, 2],
            dilation: [1, 1, 2],
            groups: 2,
        });
        assert_eq!(p.pre_padding, p.post_padding);
        assert_eq!(
            (p.pre_padding, p.stride, p.dilation, p.groups),
            (vec![1, 0, 2], vec![1, 2, 3], vec![1, 1, 2], 2)
        );
    }

    #[test]
    fn conv_forward_with_and_without_bias() {
        let node = |bias| {
            ModuleOperationIr::Conv2d(Conv2dOpIr {
                x: t(1, &[2, 8, 9, 9], DType::BF16),
                weight: t(2, &[8, 2, 3, 3], DType::BF16),
                bias,
                options: opts2(),
                out: t(4, &[2, 8, 5, 7], DType::BF16),
            })
        };
        let c = Claim::from_ir(&node(None)).unwrap();
        assert_eq!(c.name(), "conv_forward");
        assert_eq!(c.inputs().len(), 2);
        assert_eq!(c.dtype(), Ok(DataType::BF16));
        let c = Claim::from_ir(&node(Some(t(3, &[8], DType::BF16)))).unwrap();
        assert_eq!(
            c.inputs().iter().map(|t| t.id.value()).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(c.output().id.value(), 4);
        let c3 = ModuleOperationIr::Conv3d(Conv3dOpIr {
            x: t(1, &[1, 2, 4, 4, 4], DType::F32),
            weight: t(2, &[2, 2, 1, 1, 1], DType::F32),
            bias: None,
            options: Conv3dOptionsIr {
                stride: [1; 3],
                padding: [0; 3],
                dilation: [1; 3],
                groups: 1,
            },
            out: t(3, &[1, 2, 4, 4, 4], DType::F32),
        });
        assert!(matches!(Claim::from_ir(&c3), Ok(Claim::ConvForward { .. })));
    }

    #[test]
    fn conv_backward_nodes() {
        let x = t(1, &[2, 8, 9, 9], DType::F32);
        let w = t(2, &[8, 2, 3, 3], DType::F32);
        let dy = t(3, &[2, 8, 5, 7], DType::F32);
        let data = ModuleOperationIr::Conv2dXBackward(Conv2dXBackwardOpIr {
            x: x.clone(),
            weight: w.clone(),
            output_grad: dy.clone(),
            options: opts2(),
            out: t(4, &[2, 8, 9, 9], DType::F32),
        });
        let c = Claim::from_ir(&data).unwrap();
        assert_eq!(c.name(), "conv_backward_data");
        assert_eq!(c.inputs().len(), 3, "x is read for its shape: consumed like Burn does");
        let filter = ModuleOperationIr::Conv2dWeightBackward(Conv2dWeightBackwardOpIr {
            x,
            weight: w,
            output_grad: dy,
            options: opts2(),
            out: t(4, &[8, 2, 3, 3], DType::F32),
        });
        match Claim::from_ir(&filter).unwrap() {
            Claim::ConvBackwardFilter { out, params, .. } => {
                assert_eq!(out.id.value(), 4);
                assert_eq!(params, conv2d(&opts2()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn transposed_convolutions_map_to_the_engines_transposed_op() {
        let node = ModuleOperationIr::ConvTranspose2d(burn_ir::ConvTranspose2dOpIr {
            x: t(1, &[2, 4, 5, 6], DType::BF16),
            weight: t(2, &[4, 3, 3, 3], DType::BF16),
            bias: Some(t(3, &[6], DType::BF16)),
            options: burn_ir::ConvTranspose2dOptionsIr {
                stride: [2, 1],
                padding: [1, 0],
                padding_out: [1, 0],
                dilation: [1, 2],
                groups: 2,
            },
            out: t(4, &[2, 6, 10, 10], DType::BF16),
        });
        let c = Claim::from_ir(&node).unwrap();
        assert_eq!(c.name(), "conv_transpose_forward");
        assert_eq!(
            c.inputs().iter().map(|t| t.id.value()).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        match c {
            Claim::ConvTransposeForward { params, .. } => {
                assert_eq!(params.padding_out, vec![1, 0]);
                assert_eq!(
                    (
                        params.conv.pre_padding,
                        params.conv.stride,
                        params.conv.dilation,
                        params.conv.groups
                    ),
                    (vec![1, 0], vec![2, 1], vec![1, 2], 2)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_embedding_gradients_row_adds_are_claimed() {
        let op = |dim, update, indices_dtype| {
            OperationIr::BaseFloat(BaseOperationIr::SelectAssign(burn_ir::SelectAssignOpIr {
                tensor: t(1, &[30522, 768], DType::BF16),
                dim,
                indices: t(2, &[8192], indices_dtype),
                value: t(3, &[8192, 768], DType::BF16),
                update,
                out: t(4, &[30522, 768], DType::BF16),
            }))
        };
        let c = Claim::from_operation(&op(0, IndexingUpdateOp::Add, DType::I32)).unwrap();
        assert_eq!((c.name(), c.dtype()), ("index_add", Ok(DataType::BF16)));
        assert_eq!(
            c.inputs().iter().map(|t| t.id.value()).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(is_indices(&c, c.inputs()[1]) && !is_indices(&c, c.inputs()[0]));
        assert!(Claim::from_operation(&op(0, IndexingUpdateOp::Add, DType::I64)).is_ok());
        assert_eq!(
            Claim::from_operation(&op(0, IndexingUpdateOp::Assign, DType::I64)),
            Err(Declined::NotClaimed)
        );
        assert_eq!(
            Claim::from_operation(&op(1, IndexingUpdateOp::Add, DType::I64)),
            Err(Declined::NotClaimed)
        );
        assert_eq!(
            Claim::from_operation(&op(0, IndexingUpdateOp::Add, DType::F32)),
            Err(Declined::DType)
        );
        // Module nodes go through `from_ir`.
        let pool = OperationIr::Module(ModuleOperationIr::AdaptiveAvgPool2d(burn_ir::AdaptiveAvgPool2dOpIr {
            x: t(1, &[1, 2, 4, 4], DType::F32),
            output_size: [1, 1],
            out: t(2, &[1, 2, 1, 1], DType::F32),
        }));
        assert!(matches!(
            Claim::from_operation(&pool),
            Ok(Claim::AdaptiveAvgPool { .. })
        ));
    }

    #[test]
    fn dtypes_other_than_half_and_single_stay_burns() {
        let node = |xd, wd| {
            ModuleOperationIr::Conv2d(Conv2dOpIr {
                x: t(1, &[1, 1, 3, 3], xd),
                weight: t(2, &[1, 1, 1, 1], wd),
                bias: None,
                options: opts2(),
                out: t(3, &[1, 1, 3, 3], xd),
            })
        };
        assert_eq!(Claim::from_ir(&node(DType::F64, DType::F64)), Err(Declined::DType));
        assert_eq!(Claim::from_ir(&node(DType::F32, DType::F16)), Err(Declined::DType));
        assert!(Claim::from_ir(&node(DType::F16, DType::F16)).is_ok());
    }

    #[test]
    fn pooling_nodes() {
        let avg = |include, ceil| {
            ModuleOperationIr::AvgPool2d(AvgPool2dOpIr {
                x: t(1, &[1, 3, 8, 8], DType::F32),
                kernel_size: [3, 2],
                stride: [2, 2],
                padding: [1, 0],
                count_include_pad: include,
                ceil_mode: ceil,
                out: t(2, &[1, 3, 4, 4], DType::F32),
            })
        };
        match Claim::from_ir(&avg(false, false)).unwrap() {
            Claim::PoolForward { params, .. } => {
                assert_eq!(params.mode, PoolMode::AvgExcludePadding);
                assert_eq!(
                    (params.window, params.stride, params.pre_padding),
                    (vec![3, 2], vec![2, 2], vec![1, 0])
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(Claim::from_ir(&avg(true, false)), Ok(Claim::PoolForward { params, .. }) if params.mode == PoolMode::AvgIncludePadding)
        );
        // `ceil_mode` takes the pooling kernels (PyTorch's output size and divisor rules).
        match Claim::from_ir(&avg(true, true)).unwrap() {
            Claim::AvgPoolKernel {
                pool,
                count_include_pad,
                ..
            } => {
                assert!(pool.ceil_mode && count_include_pad);
                assert_eq!((pool.kernel, pool.stride, pool.padding), ([3, 2], [2, 2], [1, 0]));
            }
            other => panic!("{other:?}"),
        }
        let max = |dilation| {
            ModuleOperationIr::MaxPool2d(MaxPool2dOpIr {
                x: t(1, &[1, 3, 8, 8], DType::F32),
                kernel_size: [2, 2],
                stride: [2, 2],
                padding: [0, 0],
                dilation,
                ceil_mode: false,
                out: t(2, &[1, 3, 4, 4], DType::F32),
            })
        };
        assert!(
            matches!(Claim::from_ir(&max([1, 1])), Ok(Claim::PoolForward { params, .. }) if params.mode == PoolMode::Max)
        );
        assert_eq!(Claim::from_ir(&max([2, 2])), Err(Declined::Dilation));
    }

    #[test]
    fn one_d_and_adaptive_average_pooling_take_the_pooling_kernels() {
        let avg1 = ModuleOperationIr::AvgPool1d(burn_ir::AvgPool1dOpIr {
            x: t(1, &[2, 3, 17], DType::F32),
            kernel_size: 4,
            stride: 3,
            padding: 1,
            count_include_pad: false,
            ceil_mode: true,
            out: t(2, &[2, 3, 7], DType::F32),
        });
        let c = Claim::from_ir(&avg1).unwrap();
        assert!(c.unit_height(), "[N, C, L] runs as [N, C, 1, L]");
        assert_eq!(c.name(), "pool_forward");
        match c {
            Claim::AvgPoolKernel {
                pool,
                count_include_pad,
                ..
            } => {
                assert_eq!((pool.kernel, pool.stride, pool.padding), ([1, 4], [1, 3], [0, 1]));
                assert!(pool.ceil_mode && !count_include_pad);
            }
            other => panic!("{other:?}"),
        }
        let back1 = ModuleOperationIr::AvgPool1dBackward(burn_ir::AvgPool1dBackwardOpIr {
            x: t(1, &[2, 3, 17], DType::BF16),
            grad: t(2, &[2, 3, 7], DType::BF16),
            kernel_size: 4,
            stride: 3,
            padding: 1,
            count_include_pad: true,
            ceil_mode: false,
            out: t(3, &[2, 3, 17], DType::BF16),
        });
        let c = Claim::from_ir(&back1).unwrap();
        assert_eq!(
            (c.name(), c.inputs().len(), c.unit_height()),
            ("pool_backward", 2, true)
        );
        assert_eq!(c.dtype(), Ok(DataType::BF16));

        let adaptive2 = ModuleOperationIr::AdaptiveAvgPool2d(burn_ir::AdaptiveAvgPool2dOpIr {
            x: t(1, &[4, 2048, 7, 7], DType::F16),
            output_size: [1, 1],
            out: t(2, &[4, 2048, 1, 1], DType::F16),
        });
        let c = Claim::from_ir(&adaptive2).unwrap();
        assert!(matches!(c, Claim::AdaptiveAvgPool { .. }) && !c.unit_height());
        let adaptive1_back = ModuleOperationIr::AdaptiveAvgPool1dBackward(burn_ir::AdaptiveAvgPool1dBackwardOpIr {
            x: t(1, &[2, 5, 30], DType::F32),
            grad: t(2, &[2, 5, 7], DType::F32),
            out: t(3, &[2, 5, 30], DType::F32),
        });
        let c = Claim::from_ir(&adaptive1_back).unwrap();
        assert!(matches!(c, Claim::AdaptiveAvgPoolBackward { .. }) && c.unit_height());
        assert_eq!(c.output().id.value(), 3);
        // 3-D adaptive pooling stays Burn's.
        let adaptive3 = ModuleOperationIr::AdaptiveAvgPool3d(burn_ir::AdaptiveAvgPool3dOpIr {
            x: t(1, &[1, 2, 4, 4, 4], DType::F32),
            output_size: [2, 2, 2],
            out: t(2, &[1, 2, 2, 2, 2], DType::F32),
        });
        assert_eq!(Claim::from_ir(&adaptive3), Err(Declined::NotClaimed));
    }

    #[test]
    fn max_pool_backward_reads_integer_indices() {
        let node = ModuleOperationIr::MaxPool2dWithIndicesBackward(MaxPool2dWithIndicesBackwardOpIr {
            x: t(1, &[1, 3, 8, 8], DType::BF16),
            grad: t(2, &[1, 3, 4, 4], DType::BF16),
            indices: t(3, &[1, 3, 4, 4], DType::I64),
            kernel_size: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
            out: t(4, &[1, 3, 8, 8], DType::BF16),
        });
        let c = Claim::from_ir(&node).unwrap();
        assert_eq!(c.dtype(), Ok(DataType::BF16));
        assert_eq!(c.inputs().len(), 3);
    }

    #[test]
    fn other_nodes_are_not_claimed() {
        let node = ModuleOperationIr::MaxPool1d(burn_ir::MaxPool1dOpIr {
            x: t(1, &[1, 3, 8], DType::F32),
            kernel_size: 2,
            stride: 2,
            padding: 0,
            dilation: 1,
            ceil_mode: false,
            out: t(2, &[1, 3, 4], DType::F32),
        });
        assert_eq!(Claim::from_ir(&node), Err(Declined::NotClaimed));
    }
}
