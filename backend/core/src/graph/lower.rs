//! Lowering a validated [`Graph`] to cuDNN backend descriptors (an OperationGraph).

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{DataType, Graph, Op, ResampleMode, Tensor, TensorId};
use crate::error::{Error, Result};
use crate::ffi::cudnn_sys::{
    cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T, cudnnBackendDescriptorType_t as K,
};
use crate::ffi::{CudnnHandle, Descriptor};

/// A finalized OperationGraph with every descriptor it references kept alive.
pub(crate) struct LoweredGraph {
    pub(crate) op_graph: Descriptor,
    /// The graph has a convolution (fprop, dgrad or wgrad): cuDNN honours an SM-count
    /// target for these graphs and their bias/activation fusions.
    pub(crate) convolution: bool,
    /// The kernel cache its plans are built with (dynamic-shape graphs only; see
    /// [`DynamicKernelCache`]).
    pub(crate) kernel_cache: Option<Arc<DynamicKernelCache>>,
    /// Lowered as a cuDNN dynamic-shape graph.
    pub(crate) dynamic: bool,
    _parts: Vec<Descriptor>,
}

/// A finalized cuDNN kernel cache (`CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR`, cuDNN 9.5 or newer):
/// shared by the plans of dynamic-shape graphs of one topology, it lets a runtime-compiled
/// engine bind a kernel compiled for another size of the same graph. Plans are built with it
/// one at a time (the lock).
pub(crate) struct DynamicKernelCache(Mutex<Descriptor>);

impl DynamicKernelCache {
    /// A kernel cache for graphs of the topology of `op_graph` (a finalized dynamic-shape
    /// operation graph).
    pub(crate) fn new(op_graph: &Descriptor) -> Result<Self> {
        let mut cache = Descriptor::new(K::CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR)?;
        cache.set_desc(A::CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH, op_graph)?;
        cache.finalize()?;
        Ok(Self(Mutex::new(cache)))
    }

    /// The descriptor, held while a plan is built with it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Descriptor> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Rewrites a graph so every tensor has the rank cuDNN wants: 1-D convolution and pooling
/// become 2-D with a unit height, and tensors of rank < 3 get leading unit dims.
pub(crate) fn lift_ranks(g: &Graph) -> Cow<'_, Graph> {
    let spatial1 = g.nodes.iter().any(|n| match &n.op {
        Op::ConvFprop { attrs, .. } | Op::ConvDgrad { attrs, .. } | Op::ConvWgrad { attrs, .. } => attrs.spatial() == 1,
        Op::ResampleFwd { attrs, .. } | Op::ResampleBwd { attrs, .. } => attrs.spatial() == 1,
        _ => false,
    });
    let min_rank = g.tensors.iter().map(|t| t.dims.len()).min().unwrap_or(3);
    if !spatial1 && min_rank >= 3 {
        return Cow::Borrowed(g);
    }
    let mut g = g.clone();
    if spatial1 {
        for t in &mut g.tensors {
            if t.dims.len() == 3 {
                let s = t.strides[2] * t.dims[2];
                t.dims.insert(2, 1);
                t.strides.insert(2, s);
            }
        }
        for n in &mut g.nodes {
            match &mut n.op {
                Op::ConvFprop { attrs, .. } | Op::ConvDgrad { attrs, .. } | Op::ConvWgrad { attrs, .. } => {
                    attrs.geometry.pre_padding.insert(0, 0);
                    attrs.geometry.post_padding.insert(0, 0);
                    attrs.geometry.stride.insert(0, 1);
                    attrs.geometry.dilation.insert(0, 1);
                }
                Op::ResampleFwd { attrs, .. } | Op::ResampleBwd { attrs, .. } => {
                    attrs.window.insert(0, 1);
                    attrs.stride.insert(0, 1);
                    attrs.pre_padding.insert(0, 0);
                    attrs.post_padding.insert(0, 0);
                }
                _ => {}
            }
        }
    } else {
        for t in &mut g.tensors {
            while t.dims.len() < 3 {
                let s = t.strides.first().copied().unwrap_or(1) * t.dims.first().copied().unwrap_or(1);
                t.dims.insert(0, 1);
                t.strides.insert(0, s.max(1));
            }
        }
    }
    Cow::Owned(g)
}

fn tensor_desc(t: &Tensor, intermediate: DataType) -> Result<Descriptor> {
    let mut d = Descriptor::new(K::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    let dtype = t.dtype.unwrap_or(intermediate);
    d.set_enum(A::CUDNN_ATTR_TENSOR_DATA_TYPE, T::CUDNN_TYPE_DATA_TYPE, dtype.cudnn())?;
    d.set_i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &t.dims)?;
    d.set_i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &t.strides)?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, t.uid)?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, t.alignment as i64)?;
    d.set_bool(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, t.is_virtual)?;
    if t.by_value.is_some() {
        d.set_bool(A::CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?;
    }
    d.finalize()
        .map_err(|e| e.with_context(format!("tensor `{}` dims {:?} strides {:?}", t.name, t.dims, t.strides)))?;
    Ok(d)
}

struct Lowering<'g> {
    g: &'g Graph,
    tensors: Vec<Descriptor>,
    parts: Vec<Descriptor>,
}

impl Lowering<'_> {
    fn t(&self, id: TensorId) -> &Descriptor {
        &self.tensors[id.0]
    }

    fn compute(&self, over: Option<DataType>) -> u32 {
        over.unwrap_or(self.g.compute_type).cudnn()
    }

    fn op(&mut self, op: &Op) -> Result<Descriptor> {
        match op {
            Op::ConvFprop { x, w, y, attrs }
            | Op::ConvDgrad { dy: y, w, dx: x, attrs }
            | Op::ConvWgrad { x, dy: y, dw: w, attrs } => {
                let mut c = Descriptor::new(K::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
                c.set_enum(
                    A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                    T::CUDNN_TYPE_DATA_TYPE,
                    self.compute(attrs.compute),
                )?;
                let mode = match attrs.mode {
                    super::ConvMode::CrossCorrelation => 1,
                    super::ConvMode::Convolution => 0,
                };
                c.set_enum(
                    A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                    T::CUDNN_TYPE_CONVOLUTION_MODE,
                    mode,
                )?;
                c.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, attrs.spatial() as i64)?;
                c.set_i64s(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &attrs.geometry.dilation)?;
                c.set_i64s(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &attrs.geometry.stride)?;
                c.set_i64s(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &attrs.geometry.pre_padding)?;
                c.set_i64s(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &attrs.geometry.post_padding)?;
                c.finalize()?;
                let (kind, ax, aw, ay, adesc, aalpha, abeta) = match op {
                    Op::ConvFprop { .. } => (
                        K::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                    ),
                    Op::ConvDgrad { .. } => (
                        K::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                    ),
                    _ => (
                        K::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                    ),
                };
                let mut o = Descriptor::new(kind)?;
                o.set_desc(ax, self.t(*x))?;
                o.set_desc(aw, self.t(*w))?;
                o.set_desc(ay, self.t(*y))?;
                o.set_desc(adesc, &c)?;
                o.set_f32(aalpha, 1.0)?;
                o.set_f32(abeta, 0.0)?;
                o.finalize()?;
                self.parts.push(c);
                Ok(o)
            }
            Op::Matmul { a, b, c, compute } => {
                let mut m = Descriptor::new(K::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
                m.set_enum(
                    A::CUDNN_ATTR_MATMUL_COMP_TYPE,
                    T::CUDNN_TYPE_DATA_TYPE,
                    self.compute(*compute),
                )?;
                m.finalize()?;
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, self.t(*a))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, self.t(*b))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, self.t(*c))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &m)?;
                o.finalize()?;
                self.parts.push(m);
                Ok(o)
            }
            Op::Pointwise {
                mode,
                a,
                b,
                t,
                y,
                compute,
            } => {
                let mut p = Descriptor::new(K::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
                p.set_enum(A::CUDNN_ATTR_POINTWISE_MODE, T::CUDNN_TYPE_POINTWISE_MODE, mode.cudnn())?;
                p.set_enum(
                    A::CUDNN_ATTR_POINTWISE_MATH_PREC,
                    T::CUDNN_TYPE_DATA_TYPE,
                    self.compute(*compute),
                )?;
                match mode {
                    super::PointwiseMode::Elu(alpha) => p.set_f64(A::CUDNN_ATTR_POINTWISE_ELU_ALPHA, *alpha)?,
                    super::PointwiseMode::Swish(beta) => p.set_f64(A::CUDNN_ATTR_POINTWISE_SWISH_BETA, *beta)?,
                    super::PointwiseMode::GenIndex(axis) => p.set_i64(A::CUDNN_ATTR_POINTWISE_AXIS, *axis)?,
                    _ => {}
                }
                p.finalize()?;
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &p)?;
                if mode.is_backward() {
                    let x = b.ok_or_else(|| Error::InvalidGraph(format!("{mode:?} needs x")))?;
                    o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, self.t(x))?;
                    o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, self.t(*a))?;
                    o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, self.t(*y))?;
                } else {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, self.t(*a))?;
                    if let Some(b) = b {
                        o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, self.t(*b))?;
                    }
                    if let Some(t) = t {
                        o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, self.t(*t))?;
                    }
                    o.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, self.t(*y))?;
                }
                o.set_f32(A::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0)?;
                o.set_f32(A::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0)?;
                o.finalize()?;
                self.parts.push(p);
                Ok(o)
            }
            Op::Reduction { op, x, y, compute } => {
                let mut r = Descriptor::new(K::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
                r.set_enum(
                    A::CUDNN_ATTR_REDUCTION_OPERATOR,
                    T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                    op.cudnn(),
                )?;
                r.set_enum(
                    A::CUDNN_ATTR_REDUCTION_COMP_TYPE,
                    T::CUDNN_TYPE_DATA_TYPE,
                    self.compute(*compute),
                )?;
                r.finalize()?;
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, self.t(*x))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, self.t(*y))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &r)?;
                o.finalize()?;
                self.parts.push(r);
                Ok(o)
            }
            Op::ResampleFwd { x, y, index, attrs } => {
                let r = self.resample_desc(attrs)?;
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC, self.t(*x))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC, self.t(*y))?;
                o.set_f64(A::CUDNN_ATTR_OPERATION_RESAMPLE_FWD_ALPHA, 1.0)?;
                o.set_f64(A::CUDNN_ATTR_OPERATION_RESAMPLE_FWD_BETA, 0.0)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC, &r)?;
                if let Some(i) = index {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC, self.t(*i))?;
                }
                o.finalize()?;
                self.parts.push(r);
                Ok(o)
            }
            Op::ResampleBwd {
                dy,
                dx,
                x,
                y,
                index,
                attrs,
            } => {
                let r = self.resample_desc(attrs)?;
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DXDESC, self.t(*dx))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DYDESC, self.t(*dy))?;
                o.set_f64(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_ALPHA, 1.0)?;
                o.set_f64(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_BETA, 0.0)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DESC, &r)?;
                if let Some(x) = x {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_XDESC, self.t(*x))?;
                }
                if let Some(y) = y {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_YDESC, self.t(*y))?;
                }
                if let Some(i) = index {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_RESAMPLE_BWD_IDXDESC, self.t(*i))?;
                }
                o.finalize()?;
                self.parts.push(r);
                Ok(o)
            }
            Op::NormForward {
                mode,
                x,
                scale,
                bias,
                epsilon,
                y,
                mean,
                inv_var,
            } => {
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)?;
                o.set_enum(
                    A::CUDNN_ATTR_OPERATION_NORM_FWD_MODE,
                    T::CUDNN_TYPE_NORM_MODE,
                    mode.cudnn(),
                )?;
                // cudnnBackendNormFwdPhase_t: 0 inference, 1 training (writes the statistics).
                let phase = u32::from(mean.is_some());
                o.set_enum(
                    A::CUDNN_ATTR_OPERATION_NORM_FWD_PHASE,
                    T::CUDNN_TYPE_NORM_FWD_PHASE,
                    phase,
                )?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, self.t(*x))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, self.t(*scale))?;
                if let Some(b) = bias {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, self.t(*b))?;
                }
                o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, self.t(*epsilon))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, self.t(*y))?;
                if let Some(m) = mean {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, self.t(*m))?;
                }
                if let Some(v) = inv_var {
                    o.set_desc(A::CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, self.t(*v))?;
                }
                o.finalize()?;
                Ok(o)
            }
            Op::Reshape { x, y } => {
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, self.t(*x))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, self.t(*y))?;
                o.finalize()?;
                Ok(o)
            }
            Op::Rng {
                seed,
                offset,
                y,
                keep_probability,
            } => {
                const BERNOULLI: u32 = 0; // CUDNN_RNG_DISTRIBUTION_BERNOULLI
                let mut r = Descriptor::new(K::CUDNN_BACKEND_RNG_DESCRIPTOR)?;
                r.set_enum(
                    A::CUDNN_ATTR_RNG_DISTRIBUTION,
                    T::CUDNN_TYPE_RNG_DISTRIBUTION,
                    BERNOULLI,
                )?;
                r.set_f64(A::CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, *keep_probability)?;
                r.finalize()?;
                let mut o = Descriptor::new(K::CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RNG_YDESC, self.t(*y))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RNG_SEED, self.t(*seed))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, self.t(*offset))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RNG_DESC, &r)?;
                o.finalize()?;
                self.parts.push(r);
                Ok(o)
            }
        }
    }

    fn resample_desc(&self, a: &super::ResampleAttrs) -> Result<Descriptor> {
        let mut r = Descriptor::new(K::CUDNN_BACKEND_RESAMPLE_DESCRIPTOR)?;
        r.set_enum(A::CUDNN_ATTR_RESAMPLE_MODE, T::CUDNN_TYPE_RESAMPLE_MODE, a.mode.cudnn())?;
        r.set_enum(
            A::CUDNN_ATTR_RESAMPLE_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            self.g.compute_type.cudnn(),
        )?;
        r.set_enum(A::CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION, T::CUDNN_TYPE_NAN_PROPOGATION, 1)?;
        let pad_mode = if a.mode == ResampleMode::MaxPool { 1 } else { 0 };
        r.set_enum(
            A::CUDNN_ATTR_RESAMPLE_PADDING_MODE,
            T::CUDNN_TYPE_PADDING_MODE,
            pad_mode,
        )?;
        r.set_i64(A::CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS, a.spatial() as i64)?;
        r.set_fractions(A::CUDNN_ATTR_RESAMPLE_WINDOW_DIMS, &a.window)?;
        r.set_fractions(A::CUDNN_ATTR_RESAMPLE_PRE_PADDINGS, &a.pre_padding)?;
        r.set_fractions(A::CUDNN_ATTR_RESAMPLE_POST_PADDINGS, &a.post_padding)?;
        r.set_fractions(A::CUDNN_ATTR_RESAMPLE_STRIDES, &a.stride)?;
        r.finalize()?;
        Ok(r)
    }
}

/// Lowers a validated graph to a finalized OperationGraph bound to `handle`.
/// `dynamic`: build a cuDNN dynamic-shape operation graph (cuDNN 9.5 or newer).
pub(crate) fn lower(graph: &Graph, handle: &CudnnHandle, dynamic: bool) -> Result<LoweredGraph> {
    if !graph.validated {
        return Err(Error::InvalidGraph(
            "lower() needs a validated graph: call validate() first".into(),
        ));
    }
    let g = lift_ranks(graph);
    let tensors = g
        .tensors
        .iter()
        .map(|t| tensor_desc(t, g.intermediate_type))
        .collect::<Result<Vec<_>>>()?;
    let mut l = Lowering {
        g: &g,
        tensors,
        parts: Vec::new(),
    };
    let mut ops = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        ops.push(l.op(&n.op).map_err(|e| e.with_context(&n.name))?);
    }
    let mut og = Descriptor::new(K::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    og.set_handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle.raw())?;
    let refs: Vec<&Descriptor> = ops.iter().collect();
    og.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?;
    if dynamic {
        og.set_bool(A::CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED, true)?;
    }
    og.finalize().map_err(|e| e.with_context(graph.describe()))?;
    let mut parts = l.parts;
    parts.extend(l.tensors);
    parts.extend(ops);
    let convolution = g
        .nodes
        .iter()
        .any(|n| matches!(n.op, Op::ConvFprop { .. } | Op::ConvDgrad { .. } | Op::ConvWgrad { .. }));
    Ok(LoweredGraph {
        op_graph: og,
        convolution,
        kernel_cache: None,
        dynamic,
        _parts: parts,
    })
}
