//! Embedding lookup on Candle tensors whose backward pass is the engine's scatter-add. Candle's
//! own lookup (`index_select`) differentiates through its `index_add` kernel, which gives each
//! of the table's columns one thread that walks every id in turn (serial in the number of
//! ids); the engine's `index_add` spreads the ids over the GPU (rows of equal ids summed
//! before atomic adds, or per-column in id order in deterministic mode).

#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use crate::candle::arg_err;

/// Rows `ids` of a 2-D table (inputs: table `[V, H]` f32/f16/bf16, ids `[N]` i64 on CUDA);
/// the output is `[N, H]`. Apply with [`embedding_lookup`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct EmbeddingLookup;

/// The table's gradient: `out[ids[i]] += grad[i]` into zeros (inputs: grad `[N, H]` f32,
/// ids `[N]` i64; output `[vocab, H]` f32).
#[derive(Clone, Copy, Debug)]
struct EmbeddingGrad {
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    vocab: usize,
}

fn cpu_refused(op: &'static str) -> Result<(CpuStorage, Shape)> {
    Err(arg_err(
        op,
        "table",
        "runs on CUDA tensors (on the CPU the lookup is Candle's index_select)",
    ))
}

impl CustomOp2 for EmbeddingLookup {
    fn name(&self) -> &'static str {
        "cudnn-embedding"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_refused("candle embedding")
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, ts: &CudaStorage, tl: &Layout, is: &CudaStorage, il: &Layout) -> Result<(CudaStorage, Shape)> {
        use crate::candle::cuda;
        const OP: &str = "candle embedding";
        let (&[_, h], &[n]) = (tl.dims(), il.dims()) else {
            return Err(arg_err(OP, "table", "needs a 2-D table and 1-D ids"));
        };
        let stream = cuda::stream(ts);
        let table = cuda::input(OP, "table", ts, tl, &stream)?;
        let ids = cuda::i64_input(OP, "ids", is, il, &stream)?;
        let dims = [n as i64, h as i64];
        let out = cuda::with_output(OP, &ts.device, &stream, table.dtype(), &dims, &[h as i64, 1], |out| {
            crate::ops::index::index_select(&stream, &table, 0, &ids, out)
        })?;
        Ok((out, (n, h).into()))
    }

    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // Accumulated in f32 (as PyTorch's embedding backward), rounded to the table's dtype.
        let vocab = table.dims()[0];
        let dtable = grad
            .to_dtype(DType::F32)?
            .contiguous()?
            .apply_op2_no_bwd(ids, &EmbeddingGrad { vocab })?
            .to_dtype(table.dtype())?;
        Ok((Some(dtable), None))
    }
}

impl CustomOp2 for EmbeddingGrad {
    fn name(&self) -> &'static str {
        "cudnn-embedding-backward"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_refused("candle embedding backward")
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, gs: &CudaStorage, gl: &Layout, is: &CudaStorage, il: &Layout) -> Result<(CudaStorage, Shape)> {
        use crate::candle::cuda;
        const OP: &str = "candle embedding backward";
        let &[_, h] = gl.dims() else {
            return Err(arg_err(OP, "grad", "needs a 2-D gradient"));
        };
        let stream = cuda::stream(gs);
        let grad = cuda::input(OP, "grad", gs, gl, &stream)?;
        let ids = cuda::i64_input(OP, "ids", is, il, &stream)?;
        let dims = [self.vocab as i64, h as i64];
        let out = cuda::with_output(OP, &gs.device, &stream, grad.dtype(), &dims, &[h as i64, 1], |out| {
            crate::ops::elementwise::fill(&stream, out, 0.0)?;
            crate::ops::index::index_add(&stream, out, 0, &ids, &grad)
        })?;
        Ok((out, (self.vocab, h).into()))
    }
}

/// `table[ids]`: `ids`' dims with the table's row width appended, differentiable in `table`.
/// On CUDA with an f32/f16/bf16 table the engine's gather and scatter-add; elsewhere Candle's
/// `index_select` (ids of any integer dtype).
pub fn embedding_lookup(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (_, h) = table.dims2()?;
    let mut dims = ids.dims().to_vec();
    dims.push(h);
    let flat = ids.flatten_all()?;
    let fused = cfg!(feature = "candle-cuda")
        && table.device().is_cuda()
        && matches!(table.dtype(), DType::F32 | DType::F16 | DType::BF16);
    let rows = if fused {
        table.apply_op2(&flat.to_dtype(DType::I64)?, EmbeddingLookup)?
    } else {
        table.index_select(&flat, 0)?
    };
    rows.reshape(dims)
}
