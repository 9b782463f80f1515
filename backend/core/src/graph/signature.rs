//! The stable byte signature of a graph, the key of the plan cache.

use super::{Graph, Op, PointwiseMode, Scalar};

/// Execution context folded into a signature: a plan built for one GPU architecture,
/// cuDNN version or engine policy must never be reused for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SignatureContext {
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// cuDNN version number (e.g. 91400).
    pub cudnn_version: u64,
    /// Engine policy bits (mode, TF32, workspace cap class ...).
    pub policy: u64,
}

const SIGNATURE_VERSION: u8 = 1;

impl SignatureContext {
    /// Appends the context's canonical bytes (used by graph and op signatures alike).
    pub fn append_to(&self, out: &mut Vec<u8>) {
        out.push(SIGNATURE_VERSION);
        out.extend_from_slice(
            &(self.compute_capability.0 as u64 * 100 + self.compute_capability.1 as u64).to_le_bytes(),
        );
        out.extend_from_slice(&self.cudnn_version.to_le_bytes());
        out.extend_from_slice(&self.policy.to_le_bytes());
    }
}

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn list(&mut self, v: &[i64]) {
        self.u64(v.len() as u64);
        for &x in v {
            self.i64(x);
        }
    }
    fn tid(&mut self, g: &Graph, t: super::TensorId) {
        self.i64(g.tensors[t.0].uid);
    }
    fn opt(&mut self, g: &Graph, t: Option<super::TensorId>) {
        match t {
            Some(t) => self.tid(g, t),
            None => self.i64(-1),
        }
    }
    fn dtype(&mut self, d: Option<super::DataType>) {
        self.u8(d.map_or(255, |d| d.code()));
    }
}

impl Graph {
    /// Canonical bytes identifying everything a built plan depends on: op kinds and
    /// attributes, every tensor's dims, strides, dtype, virtuality and pointer alignment,
    /// the compute types, and `ctx` (GPU architecture, cuDNN version, engine policy).
    /// Equal graphs give equal bytes; any differing field changes them. By-value scalar
    /// *values* are excluded (they are runtime arguments), their dtype is included.
    pub fn signature_bytes(&self, ctx: &SignatureContext) -> Vec<u8> {
        self.encode(ctx, true)
    }

    /// [`signature_bytes`](Self::signature_bytes) without the tensors' sizes: each tensor's
    /// rank and the order of its strides (its layout) stand in for its dims and strides. Graphs
    /// that differ only in sizes have the same topology bytes (what cuDNN's kernel cache for
    /// dynamic-shape graphs may share kernels between).
    pub fn topology_bytes(&self, ctx: &SignatureContext) -> Vec<u8> {
        self.encode(ctx, false)
    }

    fn encode(&self, ctx: &SignatureContext, sizes: bool) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(64 + 48 * self.tensors.len()));
        ctx.append_to(&mut e.0);
        e.dtype(Some(self.compute_type));
        e.dtype(Some(self.intermediate_type));
        e.u64(self.tensors.len() as u64);
        for t in &self.tensors {
            e.i64(t.uid);
            e.dtype(t.dtype);
            e.u8(t.is_virtual as u8 | (t.by_value.is_some() as u8) << 1);
            e.u8(t.alignment as u8);
            if sizes {
                e.list(&t.dims);
                e.list(&t.strides);
            } else {
                let mut order: Vec<i64> = (0..t.strides.len() as i64).collect();
                order.sort_by_key(|&i| std::cmp::Reverse(t.strides[i as usize]));
                e.list(&order);
            }
        }
        e.u64(self.nodes.len() as u64);
        for n in &self.nodes {
            match &n.op {
                Op::ConvFprop { x, w, y, attrs }
                | Op::ConvDgrad { dy: x, w, dx: y, attrs }
                | Op::ConvWgrad { x, dy: w, dw: y, attrs } => {
                    e.u8(match n.op {
                        Op::ConvFprop { .. } => 1,
                        Op::ConvDgrad { .. } => 2,
                        _ => 3,
                    });
                    e.tid(self, *x);
                    e.tid(self, *w);
                    e.tid(self, *y);
                    e.list(&attrs.geometry.pre_padding);
                    e.list(&attrs.geometry.post_padding);
                    e.list(&attrs.geometry.stride);
                    e.list(&attrs.geometry.dilation);
                    e.u8(attrs.mode as u8);
                    e.dtype(attrs.compute);
                }
                Op::Matmul { a, b, c, compute } => {
                    e.u8(4);
                    e.tid(self, *a);
                    e.tid(self, *b);
                    e.tid(self, *c);
                    e.dtype(*compute);
                }
                Op::Pointwise {
                    mode,
                    a,
                    b,
                    t,
                    y,
                    compute,
                } => {
                    e.u8(5);
                    e.u64(mode.cudnn() as u64);
                    if matches!(
                        mode,
                        PointwiseMode::Elu(_) | PointwiseMode::Swish(_) | PointwiseMode::GenIndex(_)
                    ) {
                        e.u64(mode.param().to_bits());
                    }
                    e.tid(self, *a);
                    e.opt(self, *b);
                    e.opt(self, *t);
                    e.tid(self, *y);
                    e.dtype(*compute);
                }
                Op::Reduction { op, x, y, compute } => {
                    e.u8(6);
                    e.u8(op.cudnn() as u8);
                    e.tid(self, *x);
                    e.tid(self, *y);
                    e.dtype(*compute);
                }
                Op::ResampleFwd { x, y, index, attrs } => {
                    e.u8(7);
                    e.tid(self, *x);
                    e.tid(self, *y);
                    e.opt(self, *index);
                    resample(&mut e, attrs);
                }
                Op::ResampleBwd {
                    dy,
                    dx,
                    x,
                    y,
                    index,
                    attrs,
                } => {
                    e.u8(8);
                    e.tid(self, *dy);
                    e.tid(self, *dx);
                    e.opt(self, *x);
                    e.opt(self, *y);
                    e.opt(self, *index);
                    resample(&mut e, attrs);
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
                    e.u8(9);
                    e.u8(mode.cudnn() as u8);
                    e.tid(self, *x);
                    e.tid(self, *scale);
                    e.opt(self, *bias);
                    e.tid(self, *epsilon);
                    e.tid(self, *y);
                    e.opt(self, *mean);
                    e.opt(self, *inv_var);
                }
                Op::Reshape { x, y } => {
                    e.u8(10);
                    e.tid(self, *x);
                    e.tid(self, *y);
                }
                Op::Rng {
                    seed,
                    offset,
                    y,
                    keep_probability,
                } => {
                    e.u8(11);
                    e.tid(self, *seed);
                    e.tid(self, *offset);
                    e.tid(self, *y);
                    e.u64(keep_probability.to_bits());
                }
            }
        }
        // Scalars: only their kind matters to the plan.
        for t in &self.tensors {
            if let Some(s) = t.by_value {
                e.u8(match s {
                    Scalar::F32(_) => 1,
                    Scalar::F64(_) => 2,
                    Scalar::I64(_) => 3,
                    Scalar::I32(_) => 4,
                });
            }
        }
        e.0
    }
}

fn resample(e: &mut Enc, a: &super::ResampleAttrs) {
    e.u8(a.mode.cudnn() as u8);
    e.list(&a.window);
    e.list(&a.stride);
    e.list(&a.pre_padding);
    e.list(&a.post_padding);
}
