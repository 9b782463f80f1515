//! A pure-Rust graph IR modelled on cudnn-frontend v1: tensors and nodes, `validate()`
//! (shape/dtype inference and checks, CPU only), a stable [signature](Graph::signature_bytes)
//! for the plan cache, and lowering to cuDNN backend descriptors (the only part that
//! touches FFI, in the private `lower` module).

pub(crate) mod lower;
mod signature;
mod types;
mod validate;

pub use crate::types::{conv_output_size, may_overlap, packed_strides, stride_order};
pub use signature::SignatureContext;
use types::Given;
pub use types::*;

/// A graph of cuDNN operations under construction.
///
/// Build it with [`Graph::tensor`] and the op methods (each returns the op's output as a
/// virtual tensor), mark the tensors you want written with [`Graph::set_output`], then call
/// [`Graph::validate`], which infers every unknown dim, stride and dtype and rejects
/// inconsistent graphs with a precise [`Error::InvalidGraph`](crate::Error::InvalidGraph).
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) nodes: Vec<Node>,
    /// Accumulation type of every op unless the op overrides it (default f32).
    pub compute_type: DataType,
    /// Data type of virtual (intermediate) tensors (default f32).
    pub intermediate_type: DataType,
    pub(crate) validated: bool,
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

impl Graph {
    /// An empty graph computing in f32.
    pub fn new() -> Self {
        Self {
            tensors: Vec::new(),
            nodes: Vec::new(),
            compute_type: DataType::F32,
            intermediate_type: DataType::F32,
            validated: false,
        }
    }

    fn push_tensor(&mut self, t: Tensor) -> TensorId {
        self.validated = false;
        self.tensors.push(t);
        TensorId(self.tensors.len() - 1)
    }

    /// Adds a graph input (a non-virtual tensor backed by device memory).
    /// `strides` are in elements; layout (NCHW, NHWC, transposed, ...) comes from them.
    pub fn tensor(&mut self, name: &str, dims: &[i64], strides: &[i64], dtype: DataType) -> TensorId {
        let uid = self.tensors.len() as i64 + 1;
        self.push_tensor(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            dtype: Some(dtype),
            uid,
            is_virtual: false,
            by_value: None,
            alignment: 16,
            given: Given::ALL,
            may_be_unused: false,
        })
    }

    /// Adds a scalar passed by value at execution time (e.g. a scale), broadcast over `rank` dims.
    pub fn scalar(&mut self, name: &str, value: Scalar, rank: usize) -> TensorId {
        let uid = self.tensors.len() as i64 + 1;
        self.push_tensor(Tensor {
            name: name.to_string(),
            dims: vec![1; rank],
            strides: vec![1; rank],
            dtype: Some(value.data_type()),
            uid,
            is_virtual: false,
            by_value: Some(value),
            alignment: 16,
            given: Given::ALL,
            may_be_unused: false,
        })
    }

    fn virtual_tensor(&mut self, name: String) -> TensorId {
        let uid = self.tensors.len() as i64 + 1;
        self.push_tensor(Tensor {
            name,
            dims: Vec::new(),
            strides: Vec::new(),
            dtype: None,
            uid,
            is_virtual: true,
            by_value: None,
            alignment: 16,
            given: Given::default(),
            may_be_unused: false,
        })
    }

    fn push_node(&mut self, op: Op) {
        let name = format!("{}#{}", op.kind_name(), self.nodes.len());
        self.validated = false;
        self.nodes.push(Node { name, op });
    }

    /// Convolution forward (`y = x ⋆ w`); groups are inferred from `x.C / w.C`.
    pub fn conv_fprop(&mut self, x: TensorId, w: TensorId, attrs: ConvAttrs) -> TensorId {
        let y = self.virtual_tensor(format!("conv_fprop#{}.y", self.nodes.len()));
        self.push_node(Op::ConvFprop { x, w, y, attrs });
        y
    }

    /// Convolution backward data: `dx` (with the given dims) from `dy` and `w`.
    pub fn conv_dgrad(&mut self, dy: TensorId, w: TensorId, dx_dims: &[i64], attrs: ConvAttrs) -> TensorId {
        let dx = self.virtual_tensor(format!("conv_dgrad#{}.dx", self.nodes.len()));
        self.set_dims(dx, dx_dims);
        self.push_node(Op::ConvDgrad { dy, w, dx, attrs });
        dx
    }

    /// Convolution backward filter: `dw` (with the given dims) from `x` and `dy`.
    pub fn conv_wgrad(&mut self, x: TensorId, dy: TensorId, dw_dims: &[i64], attrs: ConvAttrs) -> TensorId {
        let dw = self.virtual_tensor(format!("conv_wgrad#{}.dw", self.nodes.len()));
        self.set_dims(dw, dw_dims);
        self.push_node(Op::ConvWgrad { x, dy, dw, attrs });
        dw
    }

    /// Batched matrix product `c[.., M, N] = a[.., M, K] · b[.., K, N]`; batch dims broadcast.
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> TensorId {
        let c = self.virtual_tensor(format!("matmul#{}.c", self.nodes.len()));
        self.push_node(Op::Matmul { a, b, c, compute: None });
        c
    }

    /// Elementwise op. Binary modes take `b` (broadcast to `a`'s shape, like a bias);
    /// backward modes take `a = dy`, `b = x` and produce `dx`.
    pub fn pointwise(&mut self, mode: PointwiseMode, a: TensorId, b: Option<TensorId>) -> TensorId {
        let y = self.virtual_tensor(format!("pointwise#{}.y", self.nodes.len()));
        self.push_node(Op::Pointwise {
            mode,
            a,
            b,
            t: None,
            y,
            compute: None,
        });
        y
    }

    /// [`Graph::pointwise`] computing in `compute` and producing `out` (e.g. i32 indices
    /// from [`PointwiseMode::GenIndex`], bool from [`PointwiseMode::CmpGe`]).
    pub fn pointwise_typed(
        &mut self,
        mode: PointwiseMode,
        a: TensorId,
        b: Option<TensorId>,
        compute: DataType,
        out: DataType,
    ) -> TensorId {
        let y = self.virtual_tensor(format!("pointwise#{}.y", self.nodes.len()));
        self.push_node(Op::Pointwise {
            mode,
            a,
            b,
            t: None,
            y,
            compute: Some(compute),
        });
        self.set_virtual_dtype(y, out);
        y
    }

    /// `mask ? a : b` elementwise (`b` and the bool `mask` broadcast to `a`).
    pub fn select(&mut self, a: TensorId, b: TensorId, mask: TensorId) -> TensorId {
        let y = self.virtual_tensor(format!("pointwise#{}.y", self.nodes.len()));
        self.push_node(Op::Pointwise {
            mode: PointwiseMode::BinarySelect,
            a,
            b: Some(b),
            t: Some(mask),
            y,
            compute: None,
        });
        y
    }

    /// `a + bias`, with `bias` broadcast (e.g. dims `[1, K, 1, 1]`).
    pub fn bias_add(&mut self, a: TensorId, bias: TensorId) -> TensorId {
        self.pointwise(PointwiseMode::Add, a, Some(bias))
    }

    /// Reduction of `x` to `out_dims` (each dim equal to x's or 1).
    pub fn reduction(&mut self, op: ReduceOp, x: TensorId, out_dims: &[i64]) -> TensorId {
        let y = self.virtual_tensor(format!("reduction#{}.y", self.nodes.len()));
        self.set_dims(y, out_dims);
        self.push_node(Op::Reduction {
            op,
            x,
            y,
            compute: None,
        });
        y
    }

    /// Pooling forward. With `with_index` (max pool only) also returns the argmax index tensor.
    pub fn resample_fwd(
        &mut self,
        x: TensorId,
        attrs: ResampleAttrs,
        with_index: bool,
    ) -> (TensorId, Option<TensorId>) {
        let y = self.virtual_tensor(format!("resample_fwd#{}.y", self.nodes.len()));
        let index = with_index.then(|| {
            let i = self.virtual_tensor(format!("resample_fwd#{}.index", self.nodes.len()));
            self.tensors[i.0].dtype = Some(DataType::I8);
            self.tensors[i.0].given.dtype = true;
            i
        });
        self.push_node(Op::ResampleFwd { x, y, index, attrs });
        (y, index)
    }

    /// Pooling backward: `dx` (with the given dims) from `dy`; max pool needs `x` and `y`
    /// (or the forward's `index`).
    pub fn resample_bwd(
        &mut self,
        dy: TensorId,
        dx_dims: &[i64],
        attrs: ResampleAttrs,
        x: Option<TensorId>,
        y: Option<TensorId>,
        index: Option<TensorId>,
    ) -> TensorId {
        let dx = self.virtual_tensor(format!("resample_bwd#{}.dx", self.nodes.len()));
        self.set_dims(dx, dx_dims);
        self.push_node(Op::ResampleBwd {
            dy,
            dx,
            x,
            y,
            index,
            attrs,
        });
        dx
    }

    /// Normalization forward over every dim of `x` but the first (reshape `[.., d]` rows to
    /// `[rows, d, 1, 1]`): `scale` and `bias` have dims `x` with the first set to 1, `epsilon`
    /// is a [scalar](Graph::scalar). With `with_stats` (training phase) it also returns the
    /// per-row mean and inverse standard deviation (f32, dims `[rows, 1, ..]`).
    pub fn norm_forward(
        &mut self,
        mode: NormMode,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: TensorId,
        with_stats: bool,
    ) -> (TensorId, Option<(TensorId, TensorId)>) {
        let n = self.nodes.len();
        let y = self.virtual_tensor(format!("norm_forward#{n}.y"));
        let stats = with_stats.then(|| {
            let mean = self.virtual_tensor(format!("norm_forward#{n}.mean"));
            let inv_var = self.virtual_tensor(format!("norm_forward#{n}.inv_var"));
            for t in [mean, inv_var] {
                self.tensors[t.0].dtype = Some(DataType::F32);
                self.tensors[t.0].given.dtype = true;
            }
            (mean, inv_var)
        });
        self.push_node(Op::NormForward {
            mode,
            x,
            scale,
            bias,
            epsilon,
            y,
            mean: stats.map(|s| s.0),
            inv_var: stats.map(|s| s.1),
        });
        (y, stats)
    }

    /// A Bernoulli mask of `dims` (f32: 1.0 with probability `keep_probability`, else 0.0)
    /// from the Philox generator keyed by the device `I64` scalars `seed` and `offset`
    /// (dims all 1): the same pair gives the same mask, so a backward graph regenerates its
    /// forward's dropout.
    pub fn rng_bernoulli(&mut self, seed: TensorId, offset: TensorId, dims: &[i64], keep_probability: f64) -> TensorId {
        let y = self.virtual_tensor(format!("rng#{}.y", self.nodes.len()));
        self.set_dims(y, dims);
        self.tensors[y.0].dtype = Some(DataType::F32);
        self.tensors[y.0].given.dtype = true;
        self.push_node(Op::Rng {
            seed,
            offset,
            y,
            keep_probability,
        });
        y
    }

    /// `x` under `dims` and `strides` (the same number of elements): the reshape operation
    /// fused patterns use to read an intermediate transposed.
    pub fn reshape(&mut self, x: TensorId, dims: &[i64], strides: &[i64]) -> TensorId {
        let y = self.virtual_tensor(format!("reshape#{}.y", self.nodes.len()));
        self.set_dims(y, dims).set_strides(y, strides);
        self.push_node(Op::Reshape { x, y });
        y
    }

    /// Sets the data type of a virtual (intermediate) tensor, e.g. the f16 probabilities
    /// between the two products of attention.
    pub fn set_virtual_dtype(&mut self, t: TensorId, dtype: DataType) -> &mut Self {
        self.validated = false;
        let tensor = &mut self.tensors[t.0];
        tensor.dtype = Some(dtype);
        tensor.given.dtype = true;
        self
    }

    /// Lets the virtual tensor `t` stay unconsumed: some fused engines match patterns that
    /// compute a value nothing reads (attention's softmax statistics in inference).
    pub fn allow_unused(&mut self, t: TensorId) -> &mut Self {
        self.validated = false;
        self.tensors[t.0].may_be_unused = true;
        self
    }

    /// Marks `t` as a graph output written to device memory, with the given data type.
    /// Its strides default to the layout of the producing op's first input.
    pub fn set_output(&mut self, t: TensorId, dtype: DataType) -> &mut Self {
        self.validated = false;
        let tensor = &mut self.tensors[t.0];
        tensor.is_virtual = false;
        tensor.dtype = Some(dtype);
        tensor.given.dtype = true;
        self
    }

    /// Sets explicit strides (elements) on a tensor, e.g. to write an output in NHWC.
    pub fn set_strides(&mut self, t: TensorId, strides: &[i64]) -> &mut Self {
        self.validated = false;
        self.tensors[t.0].strides = strides.to_vec();
        self.tensors[t.0].given.strides = true;
        self
    }

    /// Sets explicit dims on a tensor (checked against inference by `validate`).
    pub fn set_dims(&mut self, t: TensorId, dims: &[i64]) -> &mut Self {
        self.validated = false;
        self.tensors[t.0].dims = dims.to_vec();
        self.tensors[t.0].given.dims = true;
        self
    }

    /// Declares the byte alignment of a tensor's device pointer (16, 8, 4 or 2).
    pub fn set_alignment(&mut self, t: TensorId, bytes: u32) -> &mut Self {
        self.validated = false;
        self.tensors[t.0].alignment = bytes;
        self
    }

    /// The tensor behind `id`.
    pub fn tensor_info(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0]
    }

    /// All tensors, in creation order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// All nodes, in creation (topological) order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// True once `validate()` succeeded and nothing changed since.
    pub fn is_validated(&self) -> bool {
        self.validated
    }

    /// A one-line human description, used in error messages (e.g. `conv_fprop+pointwise(relu)`).
    pub fn describe(&self) -> String {
        let ops: Vec<String> = self.nodes.iter().map(|n| n.op.describe()).collect();
        let io: Vec<String> = self
            .tensors
            .iter()
            .filter(|t| !t.is_virtual && t.by_value.is_none())
            .map(|t| format!("{}{:?}{:?}", t.name, t.dims, t.dtype.unwrap_or(DataType::F32)))
            .collect();
        format!("graph[{}]({})", ops.join("+"), io.join(", "))
    }
}
