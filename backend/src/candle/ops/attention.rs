//! Scaled dot-product attention on Candle tensors. On CUDA (f16/bf16) the forward pass is
//! cuDNN's fused flash-attention graph; the training op also writes the softmax log-sum-exp
//! statistics, and its backward pass is cuDNN's fused attention backward graph from them (dq,
//! dk and dv from one graph). Where cuDNN declines a case, and on the CPU (float64 reference
//! forward), the backward pass is composed of Candle ops in f32 (f64 for f64 inputs).

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use super::same_dtype;
#[cfg(feature = "candle-cuda")]
use crate::candle::cuda;
use crate::candle::saved::Saved;
use crate::candle::{arg_err, cpu};

/// Scaled dot-product attention `softmax(q·kᵀ·scale)·v` over (B, H, L, D) tensors (inputs q,
/// k, v). Apply with [`sdpa`]; on CUDA it is one fused cuDNN graph (f16/bf16, head dims
/// multiples of 8 up to 256).
///
/// Backward: the op made by [`Sdpa::training`] keeps the softmax log-sum-exp statistics of
/// its CUDA forward pass, and its backward pass is cuDNN's fused attention backward graph
/// (unmasked or causal). Where that cannot run — no statistics kept ([`Sdpa::new`], or an op
/// value applied twice), the CPU, f32/f64, or a case cuDNN declines with a not-supported
/// error — the backward pass is composed of Candle ops in f32 (f64 for f64 inputs):
/// probabilities recomputed from q and k, then the four products of the attention backward.
#[derive(Clone, Debug)]
pub struct Sdpa {
    /// Multiplies the scores before the softmax.
    pub scale: f64,
    /// Query `i` sees keys `j <= i + Lk - Lq` only (bottom-right causal mask; needs Lq <= Lk).
    pub causal: bool,
    // Statistics are written on CUDA only (the CPU backward is composed).
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    training: bool,
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    saved: Saved,
}

impl Sdpa {
    /// The inference op (cuDNN's inference variant of the fused graph on CUDA).
    pub fn new(scale: f64, causal: bool) -> Self {
        Self {
            scale,
            causal,
            training: false,
            saved: Saved::default(),
        }
    }

    /// The training op: on CUDA the forward graph also writes the log-sum-exp statistics
    /// (f32 `[B, H, Lq, 1]`) that the fused backward graph reads.
    pub fn training(scale: f64, causal: bool) -> Self {
        Self {
            training: true,
            ..Self::new(scale, causal)
        }
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

/// (B, H, Lq, Lk, D, Dv) after checking the shapes.
fn sdpa_dims(q: &[usize], k: &[usize], v: &[usize]) -> Result<[usize; 6]> {
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
    Ok([b, h, lq, lk, d, v[3]])
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
        let [b, h, lq, lk, d, dv] = sdpa_dims(ql.dims(), kl.dims(), vl.dims())?;
        self.check_causal(lq, lk)?;
        let (q, k, v) = (
            cpu::read(SDPA, "q", qs, ql)?,
            cpu::read(SDPA, "k", ks, kl)?,
            cpu::read(SDPA, "v", vs, vl)?,
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
        Ok((cpu::write(SDPA, &out, qs.dtype())?, Shape::from(vec![b, h, lq, dv])))
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
        same_dtype(SDPA, &[("q", qs.dtype()), ("k", ks.dtype()), ("v", vs.dtype())])?;
        let [b, h, lq, lk, _, dv] = sdpa_dims(ql.dims(), kl.dims(), vl.dims())?;
        self.check_causal(lq, lk)?;
        let stream = cuda::stream(qs);
        let q = cuda::input(SDPA, "q", qs, ql, &stream)?;
        let k = cuda::input(SDPA, "k", ks, kl, &stream)?;
        let v = cuda::input(SDPA, "v", vs, vl, &stream)?;
        let dims = [b as i64, h as i64, lq as i64, dv as i64];
        let strides = super::packed_strides(&[b, h, lq, dv], false);
        // The forward graph into a new output; the engine's error apart from Candle's.
        let run = |stats: Option<&crate::ops::TensorMut>| -> Result<crate::Result<CudaStorage>> {
            let mut o = cuda::Output::alloc(SDPA, &stream, q.dtype, b * h * lq * dv)?;
            let r = {
                let or = o.view(&stream, &dims, &strides)?;
                crate::ops::sdpa_forward(&stream, &q, &k, &v, None, self.causal, &or, self.scale as f32, stats)
            };
            Ok(r.map(|()| o.into_storage(qs.device.clone())))
        };
        let out = if self.training {
            let mut stats = cuda::Output::alloc(SDPA, &stream, crate::graph::DataType::F32, b * h * lq)?;
            let trained = {
                let d = [b as i64, h as i64, lq as i64, 1];
                let st = stats.view(&stream, &d, &super::packed_strides(&[b, h, lq, 1], false))?;
                run(Some(&st))?
            };
            match trained {
                Ok(out) => {
                    let kept = cuda::tensor(stats.into_storage(qs.device.clone()), (b, h, lq, 1));
                    self.saved.keep(vec![kept]);
                    out
                }
                // No engine writes the statistics for this case: the inference graph, and a
                // composed backward pass.
                Err(e) if e.is_not_supported() => run(None)??,
                Err(e) => return Err(e.into()),
            }
        } else {
            run(None)??
        };
        Ok((out, Shape::from(vec![b, h, lq, dv])))
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
        if let Some(stats) = self.saved.get() {
            if let Some([dq, dk, dv]) = self.fused_backward(q, k, v, res, grad, &stats[0])? {
                return Ok((Some(dq), Some(dk), Some(dv)));
            }
        }
        #[cfg(not(feature = "candle-cuda"))]
        let _ = res;
        self.composed_backward(q, k, v, grad)
    }
}

impl Sdpa {
    /// cuDNN's fused attention backward from the forward's statistics: `Some([dq, dk, dv])`,
    /// or `None` when cuDNN has no engine for the case (the caller composes it).
    #[cfg(feature = "candle-cuda")]
    fn fused_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        grad: &Tensor,
        stats: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        use crate::ops::SdpaBackward;

        const OP: &str = "candle sdpa backward";
        if !sdpa_fusable(q, k, v) || ![q, k, v, o].iter().all(|t| t.is_contiguous()) {
            return Ok(None);
        }
        let d_o = grad.to_dtype(o.dtype())?.contiguous()?;
        let guards = [q, k, v, o, &d_o, stats].map(|t| t.storage_and_layout());
        let names = ["q", "k", "v", "o", "d_o", "stats"];
        let stream = cuda::stream(cuda::storage_of(OP, "q", &guards[0].0)?);
        let mut refs = Vec::with_capacity(6);
        for ((g, l), name) in guards.iter().zip(names) {
            refs.push(cuda::input(OP, name, cuda::storage_of(OP, name, g)?, l, &stream)?);
        }
        let mut grads = Vec::with_capacity(3);
        for t in [q, k, v] {
            let dt = refs[0].dtype;
            grads.push(cuda::Output::alloc(OP, &stream, dt, t.elem_count())?);
        }
        let r = {
            let mut views = Vec::with_capacity(3);
            for (g, t) in grads.iter_mut().zip([&refs[0], &refs[1], &refs[2]]) {
                views.push(g.view(&stream, &t.dims, &super::packed_strides(&cpu::udims(&t.dims), false))?);
            }
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
            };
            crate::ops::sdpa_backward(&stream, &args, self.causal, self.scale as f32)
        };
        match r {
            Ok(()) => {}
            Err(e) if e.is_not_supported() => {
                tracing::debug!("{OP}: fused backward not used ({e}); composing it");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        let dev = &cuda::storage_of(OP, "q", &guards[0].0)?.device;
        let mut out = grads
            .into_iter()
            .zip([q, k, v])
            .map(|(g, t)| cuda::tensor(g.into_storage(dev.clone()), t.shape()));
        match (out.next(), out.next(), out.next()) {
            (Some(dq), Some(dk), Some(dv)) => Ok(Some([dq, dk, dv])),
            _ => Ok(None),
        }
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
        let acc = if q.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let (qf, kf, vf, g) = (
            q.to_dtype(acc)?,
            k.to_dtype(acc)?,
            v.to_dtype(acc)?,
            grad.to_dtype(acc)?,
        );
        let mut s = (qf.matmul(&kf.t()?)? * self.scale)?;
        if self.causal {
            let (lq, lk) = (q.dims()[2], k.dims()[2]);
            s = s.broadcast_add(&causal_bias(lq, lk, acc, q.device())?)?;
        }
        let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let dv = p.t()?.matmul(&g)?;
        let dp = g.matmul(&vf.t()?)?;
        let ds = (&p * dp.broadcast_sub(&(&dp * &p)?.sum_keepdim(D::Minus1)?)?)?;
        let dq = (ds.matmul(&kf)? * self.scale)?;
        let dk = (ds.t()?.matmul(&qf)? * self.scale)?;
        Ok((
            Some(dq.to_dtype(q.dtype())?),
            Some(dk.to_dtype(k.dtype())?),
            Some(dv.to_dtype(v.dtype())?),
        ))
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

/// True when cuDNN's fused attention takes these tensors: on CUDA, rank 4, one dtype, and
/// sizes [`crate::ops::sdpa_fusable`] accepts.
pub(crate) fn sdpa_fusable(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    // The engines take f16/bf16 only; other dtypes need no mapping.
    let dtype = match q.dtype() {
        DType::F16 => crate::graph::DataType::F16,
        DType::BF16 => crate::graph::DataType::BF16,
        _ => return false,
    };
    q.device().is_cuda()
        && [q, k, v].iter().all(|t| t.rank() == 4 && t.dtype() == q.dtype())
        && crate::ops::sdpa_fusable(dtype, q.dims()[3] as i64, v.dims()[3] as i64, k.dims()[2] as i64)
}

/// `softmax(q·kᵀ·scale)·v` with autograd as the [`Sdpa`] op (inputs made contiguous);
/// `causal` masks as [`Sdpa::causal`] says. When a gradient can be needed (an input is a
/// variable or depends on one) it is the training op, whose backward pass is cuDNN's fused
/// attention backward where it applies.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let op = if q.track_op() || k.track_op() || v.track_op() {
        Sdpa::training(scale, causal)
    } else {
        Sdpa::new(scale, causal)
    };
    q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}
