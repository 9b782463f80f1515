//! Scaled dot-product attention on Candle tensors. On CUDA, f16/bf16 run cuDNN's fused
//! flash-attention graph; the training op also writes the softmax log-sum-exp statistics,
//! and its backward pass is cuDNN's fused attention backward graph from them (dq, dk and dv
//! from one graph). f32 runs the engine's math path (two cuDNN matmuls around one row-softmax
//! kernel, the probabilities kept for a backward of five matmuls and one kernel). Where cuDNN
//! declines a case, and on the CPU (float64 reference forward), the backward pass is composed
//! of Candle ops in f32 (f64 for f64 inputs).
//!
//! Two layouts: (B, H, L, D) tensors, any strides with a unit last stride, or, with
//! [`Sdpa::with_heads`], (B, L, H·D) tensors whose last dim holds the heads side by side (what
//! a linear layer writes: no reshape, transpose or copy around the op, in either pass).

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use super::same_dtype;
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::saved::Saved;
use crate::candle::{arg_err, cpu};

/// Scaled dot-product attention `softmax(q·kᵀ·scale)·v` (inputs q, k, v). Apply with
/// [`sdpa`] or [`sdpa_heads`]; on CUDA it is one fused cuDNN graph for f16/bf16 (head dims
/// multiples of 8 up to 256) and the engine's math path for f32.
///
/// Backward: the op made by [`Sdpa::training`] keeps what its CUDA forward computed for the
/// backward pass (the softmax log-sum-exp statistics for f16/bf16, the probabilities for
/// f32), and its backward pass is cuDNN's fused attention backward graph (unmasked or
/// causal), or for f32 the math path's backward. Where that cannot run — nothing kept
/// ([`Sdpa::new`], or an op value applied twice), the CPU, f64, or a case cuDNN declines with
/// a not-supported error — the backward pass is composed of Candle ops in f32 (f64 for f64
/// inputs): probabilities recomputed from q and k, then the four products of the attention
/// backward.
#[derive(Clone, Debug)]
pub struct Sdpa {
    /// Multiplies the scores before the softmax.
    pub scale: f64,
    /// Query `i` sees keys `j <= i + Lk - Lq` only (bottom-right causal mask; needs Lq <= Lk).
    pub causal: bool,
    /// `Some(h)`: q, k, v and the output are (B, L, H·D) with `h` heads side by side in the
    /// last dim; `None`: (B, H, L, D).
    pub heads: Option<usize>,
    // Kept on CUDA only (the CPU backward is composed).
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    training: bool,
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    saved: Saved,
}

impl Sdpa {
    /// The inference op over (B, H, L, D) tensors (cuDNN's inference variant of the fused
    /// graph on CUDA).
    pub fn new(scale: f64, causal: bool) -> Self {
        Self {
            scale,
            causal,
            heads: None,
            training: false,
            saved: Saved::default(),
        }
    }

    /// The training op: on CUDA the forward also keeps what the backward reads (f16/bf16:
    /// the log-sum-exp statistics, f32 `[B, H, Lq, 1]`; f32: the probabilities).
    pub fn training(scale: f64, causal: bool) -> Self {
        Self {
            training: true,
            ..Self::new(scale, causal)
        }
    }

    /// The op over (B, L, H·D) tensors with `heads` heads side by side in the last dim.
    pub fn with_heads(mut self, heads: usize) -> Self {
        self.heads = Some(heads);
        self
    }
}

/// The causal mask as an additive (lq, lk) bias of 0 / -inf in `dtype` on `device`.
pub(crate) fn causal_bias(lq: usize, lk: usize, dtype: DType, device: &candle_core::Device) -> Result<Tensor> {
    let v: Vec<f32> = (0..lq * lk)
        .map(|e| {
            if cudnn_backend_reference::causal_masked(e / lk, e % lk, lq, lk) {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(v, (lq, lk), device)?.to_dtype(dtype)
}

const SDPA: &str = "candle sdpa";

/// The sizes of one attention call and the layout its tensors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    b: usize,
    h: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    /// (B, L, H·D) tensors rather than (B, H, L, D).
    heads_packed: bool,
}

impl Geometry {
    /// The sizes after checking the shapes of q, k and v for `heads`.
    fn of(heads: Option<usize>, q: &[usize], k: &[usize], v: &[usize]) -> Result<Self> {
        let Some(h) = heads else {
            if q.len() != 4 || k.len() != 4 || v.len() != 4 {
                return Err(arg_err(
                    SDPA,
                    "q",
                    format!("q {q:?}, k {k:?}, v {v:?} must be (B, H, L, D)"),
                ));
            }
            let [b, h, lq, d] = [q[0], q[1], q[2], q[3]];
            let lk = k[2];
            if k != [b, h, lk, d] || v[..3] != [b, h, lk] {
                return Err(arg_err(
                    SDPA,
                    "k",
                    format!("q {q:?}, k {k:?} and v {v:?} disagree (need k (B, H, Lk, D), v (B, H, Lk, Dv))"),
                ));
            }
            return Ok(Self {
                b,
                h,
                lq,
                lk,
                d,
                dv: v[3],
                heads_packed: false,
            });
        };
        if q.len() != 3 || k.len() != 3 || v.len() != 3 {
            return Err(arg_err(
                SDPA,
                "q",
                format!("q {q:?}, k {k:?}, v {v:?} must be (B, L, H·D) with {h} heads"),
            ));
        }
        if h == 0 || !q[2].is_multiple_of(h) || !v[2].is_multiple_of(h) {
            return Err(arg_err(
                SDPA,
                "heads",
                format!("{h} heads do not divide the features of q {q:?} and v {v:?}"),
            ));
        }
        let [b, lq, d, lk] = [q[0], q[1], q[2] / h, k[1]];
        if k != [b, lk, q[2]] || v[..2] != [b, lk] {
            return Err(arg_err(
                SDPA,
                "k",
                format!("q {q:?}, k {k:?} and v {v:?} disagree (need k (B, Lk, H·D), v (B, Lk, H·Dv))"),
            ));
        }
        Ok(Self {
            b,
            h,
            lq,
            lk,
            d,
            dv: v[2] / h,
            heads_packed: true,
        })
    }

    /// The shape of a tensor of `len` positions and `x` features per head in this layout.
    fn shape(&self, len: usize, x: usize) -> Vec<usize> {
        if self.heads_packed {
            vec![self.b, len, self.h * x]
        } else {
            vec![self.b, self.h, len, x]
        }
    }

    /// `(dims, strides)` of the (B, H, L, X) view of a tensor of this layout with `strides`.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    fn bhlx(&self, len: usize, x: usize, strides: &[i64]) -> ([i64; 4], [i64; 4]) {
        let dims = [self.b as i64, self.h as i64, len as i64, x as i64];
        if self.heads_packed {
            (dims, [strides[0], x as i64 * strides[2], strides[1], strides[2]])
        } else {
            (dims, [strides[0], strides[1], strides[2], strides[3]])
        }
    }

    /// Positions and per-head features of q, k, v and the output.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    fn sizes(&self) -> [(usize, usize); 4] {
        [
            (self.lq, self.d),
            (self.lk, self.d),
            (self.lk, self.dv),
            (self.lq, self.dv),
        ]
    }
}

/// (B, L, H, X) row-major values (a (B, L, H·X) tensor) as (B, H, L, X), or back with
/// `inverse`.
fn swap_heads(v: &[f64], [b, l, h, x]: [usize; 4], inverse: bool) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for bi in 0..b {
        for li in 0..l {
            for hi in 0..h {
                let bshd = ((bi * l + li) * h + hi) * x;
                let bhsd = ((bi * h + hi) * l + li) * x;
                let (from, to) = if inverse { (bhsd, bshd) } else { (bshd, bhsd) };
                out[to..to + x].copy_from_slice(&v[from..from + x]);
            }
        }
    }
    out
}

impl CustomOp3 for Sdpa {
    fn name(&self) -> &'static str {
        "cudnn-sdpa"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        same_dtype(SDPA, &[("q", qs.dtype()), ("k", ks.dtype()), ("v", vs.dtype())])?;
        let g = Geometry::of(self.heads, ql.dims(), kl.dims(), vl.dims())?;
        let Geometry {
            b, h, lq, lk, d, dv, ..
        } = g;
        self.check_causal(lq, lk)?;
        let read = |name, s, l, len, x| -> Result<Vec<f64>> {
            let v = cpu::read(SDPA, name, s, l)?;
            Ok(if g.heads_packed {
                swap_heads(&v, [b, len, h, x], false)
            } else {
                v
            })
        };
        let (q, k, v) = (
            read("q", qs, ql, lq, d)?,
            read("k", ks, kl, lk, d)?,
            read("v", vs, vl, lk, dv)?,
        );
        let mask = |_: usize, i: usize, j: usize| {
            if cudnn_backend_reference::causal_masked(i, j, lq, lk) {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        };
        let bias = self.causal.then_some(&mask as &dyn Fn(usize, usize, usize) -> f64);
        let (out, _) = cudnn_backend_reference::attention(&q, &k, &v, [b * h, lq, lk, d, dv], self.scale, bias);
        let out = if g.heads_packed {
            swap_heads(&out, [b, lq, h, dv], true)
        } else {
            out
        };
        Ok((cpu::write(SDPA, &out, qs.dtype())?, Shape::from(g.shape(lq, dv))))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        qs: &CudaStorage,
        ql: &Layout,
        ks: &CudaStorage,
        kl: &Layout,
        vs: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use crate::graph::DataType;

        same_dtype(SDPA, &[("q", qs.dtype()), ("k", ks.dtype()), ("v", vs.dtype())])?;
        let g = Geometry::of(self.heads, ql.dims(), kl.dims(), vl.dims())?;
        let Geometry { b, h, lq, lk, dv, .. } = g;
        self.check_causal(lq, lk)?;
        let stream = cuda::stream(qs);
        let [qz, kz, vz, _] = g.sizes();
        let view = |name, s, l: &Layout, (len, x): (usize, usize)| -> Result<crate::ops::TensorRef<'_>> {
            let t = cuda::input(SDPA, name, s, l, &stream)?;
            let (dims, strides) = g.bhlx(len, x, t.strides());
            t.reshaped(&dims, &strides).map_err(candle_core::Error::wrap)
        };
        let q = view("q", qs, ql, qz)?;
        let k = view("k", ks, kl, kz)?;
        let v = view("v", vs, vl, vz)?;
        let out_shape = g.shape(lq, dv);
        let (o_dims, o_strides) = g.bhlx(lq, dv, &super::packed_strides(&out_shape, false));
        let mut o = cuda::Output::alloc(SDPA, &stream, q.dtype(), b * h * lq * dv)?;
        if q.dtype() == DataType::F32 {
            // The math path; the probabilities are what its backward reads.
            let p_dims = [b, h, lq, lk];
            let mut p = cuda::Output::alloc(SDPA, &stream, DataType::F32, p_dims.iter().product())?;
            {
                let pv = p.view(
                    &stream,
                    &p_dims.map(|x| x as i64),
                    &super::packed_strides(&p_dims, false),
                )?;
                let ov = o.view(&stream, &o_dims, &o_strides)?;
                crate::ops::attention_math_forward(&stream, &q, &k, &v, self.causal, self.scale as f32, &pv, None, &ov)
                    .map_err(candle_core::Error::wrap)?;
            }
            if self.training {
                self.saved
                    .keep(vec![cuda::tensor(p.into_storage(qs.device.clone()), p_dims.to_vec())]);
            }
            return Ok((o.into_storage(qs.device.clone()), Shape::from(out_shape)));
        }
        // The fused graph into `o`; the engine's error apart from Candle's.
        let mut run = |stats: Option<&crate::ops::TensorMut>| -> Result<crate::Result<()>> {
            let ov = o.view(&stream, &o_dims, &o_strides)?;
            Ok(crate::ops::sdpa_forward(
                &stream,
                &q,
                &k,
                &v,
                None,
                self.causal,
                &ov,
                self.scale as f32,
                stats,
            ))
        };
        if self.training {
            let mut stats = cuda::Output::alloc(SDPA, &stream, DataType::F32, b * h * lq)?;
            let trained = {
                let d = [b as i64, h as i64, lq as i64, 1];
                let st = stats.view(&stream, &d, &super::packed_strides(&[b, h, lq, 1], false))?;
                run(Some(&st))?
            };
            match trained {
                Ok(()) => {
                    let kept = cuda::tensor(stats.into_storage(qs.device.clone()), (b, h, lq, 1));
                    self.saved.keep(vec![kept]);
                }
                // No engine writes the statistics for this case: the inference graph, and a
                // composed backward pass.
                Err(e) if e.is_not_supported() => run(None)?.map_err(candle_core::Error::wrap)?,
                Err(e) => return Err(candle_core::Error::wrap(e)),
            }
        } else {
            run(None)?.map_err(candle_core::Error::wrap)?
        }
        Ok((o.into_storage(qs.device.clone()), Shape::from(out_shape)))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "candle-cuda")]
        if let Some(kept) = self.saved.get() {
            if let Some([dq, dk, dv]) = self.engine_backward(q, k, v, res, grad, &kept[0])? {
                return Ok((Some(dq), Some(dk), Some(dv)));
            }
        }
        #[cfg(not(feature = "candle-cuda"))]
        let _ = res;
        self.composed_backward(q, k, v, grad)
    }
}

impl Sdpa {
    /// The backward pass from what the CUDA forward kept (`kept`: the probabilities for f32,
    /// the softmax statistics for f16/bf16): the math path's backward or cuDNN's fused
    /// attention backward, writing gradients laid out like q, k and v. `Some([dq, dk, dv])`,
    /// or `None` when cuDNN has no engine for the case (the caller composes it).
    #[cfg(feature = "candle-cuda")]
    fn engine_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        grad: &Tensor,
        kept: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        use crate::graph::DataType;
        use crate::ops::{AttentionMathBackward, SdpaBackward};
        use crate::types::{packed_strides, stride_order};

        const OP: &str = "candle sdpa backward";
        let g = Geometry::of(self.heads, q.dims(), k.dims(), v.dims())?;
        let math = q.dtype() == DType::F32;
        if !math && !sdpa_supported(q, k, v, self.heads) {
            return Ok(None);
        }
        let d_o = grad.to_dtype(o.dtype())?.contiguous()?;
        let tensors = [q, k, v, o, &d_o, kept];
        let guards = tensors.map(|t| t.storage_and_layout());
        let names = ["q", "k", "v", "o", "d_o", if math { "p" } else { "stats" }];
        let stream = cuda::stream(cuda::storage_of(OP, "q", &guards[0].0)?);
        let [qz, kz, vz, oz] = g.sizes();
        let mut refs = Vec::with_capacity(6);
        for (((storage, layout), name), size) in
            guards
                .iter()
                .zip(names)
                .zip([Some(qz), Some(kz), Some(vz), Some(oz), Some(oz), None])
        {
            let t = cuda::input(OP, name, cuda::storage_of(OP, name, storage)?, layout, &stream)?;
            refs.push(match size {
                Some((len, x)) => {
                    let (dims, strides) = g.bhlx(len, x, t.strides());
                    t.reshaped(&dims, &strides).map_err(candle_core::Error::wrap)?
                }
                None => t,
            });
        }
        // Each gradient packed in its input's stride order (q's layout is q's gradient's).
        let mut grads = Vec::with_capacity(3);
        for t in [q, k, v] {
            let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
            let strides: Vec<i64> = t.stride().iter().map(|&s| s as i64).collect();
            let order = stride_order(&strides);
            let packed = packed_strides(&dims, &order);
            grads.push((
                cuda::Output::alloc(OP, &stream, refs[0].dtype(), t.elem_count())?,
                order,
                packed,
            ));
        }
        let r = {
            let mut views = Vec::with_capacity(3);
            for ((buf, _, packed), (len, x)) in grads.iter_mut().zip([qz, kz, vz]) {
                let (dims, strides) = g.bhlx(len, x, packed);
                views.push(buf.view(&stream, &dims, &strides)?);
            }
            if math {
                let p_dims = [g.b, g.h, g.lq, g.lk];
                let mut ds = cuda::Output::alloc(OP, &stream, DataType::F32, p_dims.iter().product())?;
                let ds = ds.view(
                    &stream,
                    &p_dims.map(|x| x as i64),
                    &super::packed_strides(&p_dims, false),
                )?;
                let args = AttentionMathBackward {
                    q: &refs[0],
                    k: &refs[1],
                    v: &refs[2],
                    p: &refs[5],
                    d_o: &refs[4],
                    dq: &views[0],
                    dk: &views[1],
                    dv: &views[2],
                    ds: &ds,
                };
                crate::ops::attention_math_backward(&stream, &args, self.scale as f32)
            } else {
                let args = SdpaBackward {
                    q: &refs[0],
                    k: &refs[1],
                    v: &refs[2],
                    o: &refs[3],
                    d_o: &refs[4],
                    stats: &refs[5],
                    bias: None,
                    dq: &views[0],
                    dk: &views[1],
                    dv: &views[2],
                    d_bias: None,
                    dropout: None,
                };
                crate::ops::sdpa_backward(&stream, &args, self.causal, self.scale as f32)
            }
        };
        match r {
            Ok(()) => {}
            Err(e) if e.is_not_supported() => {
                tracing::debug!("{OP}: fused backward not used ({e}); composing it");
                return Ok(None);
            }
            Err(e) => return Err(candle_core::Error::wrap(e)),
        }
        let dev = &cuda::storage_of(OP, "q", &guards[0].0)?.device;
        let mut out = Vec::with_capacity(3);
        for ((buf, order, _), t) in grads.into_iter().zip([q, k, v]) {
            let stored: Vec<usize> = order.iter().map(|&a| t.dims()[a]).collect();
            let mut back = vec![0; order.len()];
            for (i, &a) in order.iter().enumerate() {
                back[a] = i;
            }
            out.push(cuda::tensor(buf.into_storage(dev.clone()), stored).permute(back)?);
        }
        Ok(out.try_into().ok())
    }

    /// The attention backward of Candle ops: `P = softmax(q·kᵀ·scale [causal])`, `dV = Pᵀ·dO`,
    /// `dS = P ∘ (dO·Vᵀ − rowsum(dO·Vᵀ ∘ P))`, `dQ = dS·K·scale`, `dK = dSᵀ·Q·scale`.
    fn composed_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = Geometry::of(self.heads, q.dims(), k.dims(), v.dims())?;
        let acc = if q.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        // (B, L, H·X) → (B, H, L, X) and back.
        let split = |t: &Tensor, len: usize, x: usize| -> Result<Tensor> {
            let t = t.to_dtype(acc)?;
            if g.heads_packed {
                t.reshape((g.b, len, g.h, x))?.transpose(1, 2)?.contiguous()
            } else {
                Ok(t)
            }
        };
        let merge = |t: Tensor, like: &Tensor| -> Result<Tensor> {
            let t = if g.heads_packed {
                let (len, x) = (t.dim(2)?, t.dim(3)?);
                t.transpose(1, 2)?.reshape((g.b, len, g.h * x))?
            } else {
                t
            };
            t.to_dtype(like.dtype())
        };
        let (qf, kf, vf, gr) = (
            split(q, g.lq, g.d)?,
            split(k, g.lk, g.d)?,
            split(v, g.lk, g.dv)?,
            split(grad, g.lq, g.dv)?,
        );
        let mut s = (qf.matmul(&kf.t()?)? * self.scale)?;
        if self.causal {
            s = s.broadcast_add(&causal_bias(g.lq, g.lk, acc, q.device())?)?;
        }
        let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let dv = p.t()?.matmul(&gr)?;
        let dp = gr.matmul(&vf.t()?)?;
        let ds = (&p * dp.broadcast_sub(&(&dp * &p)?.sum_keepdim(D::Minus1)?)?)?;
        let dq = (ds.matmul(&kf)? * self.scale)?;
        let dk = (ds.t()?.matmul(&qf)? * self.scale)?;
        Ok((Some(merge(dq, q)?), Some(merge(dk, k)?), Some(merge(dv, v)?)))
    }

    fn check_causal(&self, lq: usize, lk: usize) -> Result<()> {
        if self.causal {
            check_causal(lq, lk)?;
        }
        Ok(())
    }
}

/// A causal mask with more queries than keys would leave rows with no key to see.
pub(crate) fn check_causal(lq: usize, lk: usize) -> Result<()> {
    if lq > lk {
        let msg = format!("a causal mask needs no more queries ({lq}) than keys ({lk})");
        return Err(arg_err(SDPA, "q", msg));
    }
    Ok(())
}

/// True when the engine runs this attention on the GPU: on CUDA, one dtype, shapes of
/// `heads`' layout, and f32 (the math path) or f16/bf16 sizes cuDNN's fused graphs take
/// ([`crate::ops::sdpa_fusable`]).
pub(crate) fn sdpa_supported(q: &Tensor, k: &Tensor, v: &Tensor, heads: Option<usize>) -> bool {
    let Ok(g) = Geometry::of(heads, q.dims(), k.dims(), v.dims()) else {
        return false;
    };
    let same = [k, v].iter().all(|t| t.dtype() == q.dtype());
    let engine = match q.dtype() {
        DType::F32 => true,
        DType::F16 => crate::ops::sdpa_fusable(crate::graph::DataType::F16, g.d as i64, g.dv as i64, g.lk as i64),
        DType::BF16 => crate::ops::sdpa_fusable(crate::graph::DataType::BF16, g.d as i64, g.dv as i64, g.lk as i64),
        _ => false,
    };
    q.device().is_cuda() && same && engine
}

/// `t` when the engine can read it in place (a unit last stride; every other dim of more
/// than one element a positive stride, and those strides and the start a multiple of 8
/// elements: the 16-byte alignment cuDNN's attention engines take for f16/bf16), else a
/// contiguous copy (broadcast views included).
fn readable_in_place(t: &Tensor) -> Result<Tensor> {
    let l = t.layout();
    let (dims, strides) = (l.dims(), l.stride());
    let rank = dims.len();
    let aligned = rank == 0
        || (strides[rank - 1] == 1 || dims[rank - 1] == 1)
            && (0..rank - 1).all(|i| dims[i] == 1 || (strides[i] > 0 && strides[i].is_multiple_of(8)))
            && l.start_offset().is_multiple_of(8);
    if aligned {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

/// The op for these inputs: the training op when a gradient can be needed (an input is a
/// variable or depends on one), else the inference op.
fn op_for(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Sdpa {
    if q.track_op() || k.track_op() || v.track_op() {
        Sdpa::training(scale, causal)
    } else {
        Sdpa::new(scale, causal)
    }
}

/// `softmax(q·kᵀ·scale)·v` over (B, H, L, D) tensors with autograd as the [`Sdpa`] op (read
/// in place; copied only when a last dim is strided or a stride unaligned); `causal` masks as [`Sdpa::causal`]
/// says. The training op's backward pass is cuDNN's fused attention backward (f16/bf16) or
/// the math path's (f32) where it applies.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let op = op_for(q, k, v, scale, causal);
    readable_in_place(q)?.apply_op3(&readable_in_place(k)?, &readable_in_place(v)?, op)
}

/// [`sdpa`] over (B, L, H·D) tensors, `heads` heads side by side in the last dim (as a
/// linear layer writes them), returning (B, Lq, H·Dv): multi-head attention without a
/// reshape, transpose or copy around it, in either pass.
pub fn sdpa_heads(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize, scale: f64, causal: bool) -> Result<Tensor> {
    let op = op_for(q, k, v, scale, causal).with_heads(heads);
    readable_in_place(q)?.apply_op3(&readable_in_place(k)?, &readable_in_place(v)?, op)
}
