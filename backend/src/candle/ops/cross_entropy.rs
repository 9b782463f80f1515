//! Cross-entropy of logits rows against class targets on Candle tensors. candle-nn's
//! `loss::cross_entropy` composes log-softmax (a max, a subtraction, an exponential, a sum, a
//! log), a gather and a mean, and differentiates each step: a dozen passes over a
//! `[rows, classes]` tensor that in a language model is the largest of the step. On CUDA this
//! op is the engine's two kernels (one read of the logits forward, one read and one write
//! backward, f32 accumulation in any dtype); on the CPU the float64 reference.

use candle_core::backend::BackendStorage;
#[cfg(feature = "candle-cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};

use crate::candle::saved::Saved;
use crate::candle::{arg_err, cpu};
use crate::ops::CrossEntropyMean;

const OP: &str = "candle cross_entropy";

/// The mean cross-entropy of `logits [rows, classes]` (f32, f16, bf16) against `targets
/// [rows]` (integer classes), as a scalar of the logits' dtype. Apply with [`cross_entropy`]
/// or [`cross_entropy_ignore_index`].
#[derive(Clone, Debug)]
pub struct CrossEntropy {
    /// A target value whose rows add nothing (PyTorch's `ignore_index`); the mean is then over
    /// the other rows. Without one, the mean is over every row (candle-nn's).
    ignore_index: Option<i64>,
    /// The forward's row log-sum-exp (CUDA), what the backward pass reads.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    saved: Saved,
}

impl CrossEntropy {
    /// The op: every row counted, or the rows whose target is not `ignore_index`.
    pub fn new(ignore_index: Option<i64>) -> Self {
        Self {
            ignore_index,
            saved: Saved::default(),
        }
    }

    fn ignore(&self) -> &[i64] {
        self.ignore_index.as_slice()
    }

    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    fn mean_over(&self) -> CrossEntropyMean {
        match self.ignore_index {
            Some(_) => CrossEntropyMean::TargetRows,
            None => CrossEntropyMean::AllRows,
        }
    }

    /// `(rows, classes)` of the operands' dims.
    fn problem(logits: &[usize], targets: &[usize]) -> Result<(usize, usize)> {
        let &[rows, classes] = logits else {
            return Err(arg_err(
                OP,
                "logits",
                format!("dims {logits:?} are not [rows, classes]"),
            ));
        };
        if targets != [rows] {
            return Err(arg_err(
                OP,
                "targets",
                format!("dims {targets:?}: need [{rows}] (one class per logits row)"),
            ));
        }
        if classes == 0 {
            return Err(arg_err(
                OP,
                "logits",
                "no classes: the softmax of an empty row is undefined",
            ));
        }
        Ok((rows, classes))
    }

    /// The gradient of the logits for the gradient `grad` of the mean (a scalar).
    fn backward(&self, logits: &Tensor, targets: &Tensor, grad: &Tensor) -> Result<Tensor> {
        match logits.device() {
            Device::Cpu => {
                let (rows, classes) = Self::problem(logits.dims(), targets.dims())?;
                let x = logits.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
                let t = targets.detach().to_dtype(DType::I64)?.to_vec1::<i64>()?;
                let g = grad.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
                let dx = cudnn_backend_reference::cross_entropy_backward(
                    &x,
                    classes,
                    &t,
                    self.ignore(),
                    self.ignore_index.is_some(),
                    g[0],
                );
                Tensor::from_vec(dx, (rows, classes), &Device::Cpu)?.to_dtype(logits.dtype())
            }
            #[cfg(feature = "candle-cuda")]
            Device::Cuda(_) => self.backward_cuda(logits, targets, grad),
            other => Err(arg_err(
                OP,
                "logits",
                format!("device {:?} is not supported", other.location()),
            )),
        }
    }

    #[cfg(feature = "candle-cuda")]
    fn backward_cuda(&self, logits: &Tensor, targets: &Tensor, grad: &Tensor) -> Result<Tensor> {
        use crate::candle::cuda;
        use crate::ops::CrossEntropyBackward;

        let (rows, classes) = Self::problem(logits.dims(), targets.dims())?;
        let grad = grad.contiguous()?;
        let lse = match self.saved.get() {
            Some(s) if s.len() == 1 => s.into_iter().next(),
            _ => None,
        };
        let lse = match lse {
            Some(l) => l,
            // This op value ran more than one forward: the row log-sum-exp once more.
            None => {
                let fresh = CrossEntropy::new(self.ignore_index);
                logits.detach().apply_op2_no_bwd(&targets.detach(), &fresh)?;
                match fresh.saved.get() {
                    Some(s) if s.len() == 1 => s.into_iter().next().expect("one saved tensor"),
                    _ => return Err(arg_err(OP, "logits", "the forward kept no row statistics")),
                }
            }
        };
        let (xg, xl) = logits.storage_and_layout();
        let xs = cuda::storage_of(OP, "logits", &xg)?;
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "logits", xs, xl, &stream)?;
        let (tg, tl) = targets.storage_and_layout();
        let t = cuda::i64_input(OP, "targets", cuda::storage_of(OP, "targets", &tg)?, tl, &stream)?;
        let (lg, ll) = lse.storage_and_layout();
        let l = cuda::input(OP, "lse", cuda::storage_of(OP, "lse", &lg)?, ll, &stream)?;
        let (gg, gl) = grad.storage_and_layout();
        let g = cuda::input(OP, "grad", cuda::storage_of(OP, "grad", &gg)?, gl, &stream)?;
        let dims = [rows as i64, classes as i64];
        let out = cuda::with_output(
            OP,
            &xs.device,
            &stream,
            x.dtype(),
            &dims,
            &[classes as i64, 1],
            |d_logits| {
                let args = CrossEntropyBackward {
                    logits: &x,
                    targets: &t,
                    ignore: self.ignore(),
                    lse: &l,
                    grad: &g,
                    mean_over: self.mean_over(),
                    d_logits,
                };
                crate::ops::cross_entropy_backward(&stream, &args)
            },
        )?;
        Ok(cuda::tensor(out, (rows, classes)))
    }
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "cudnn-cross-entropy"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ts: &CpuStorage, tl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, classes) = Self::problem(xl.dims(), tl.dims())?;
        let x = cpu::read(OP, "logits", xs, xl)?;
        let t = cpu::read_ints(OP, "targets", ts, tl)?;
        let out = cudnn_backend_reference::cross_entropy(&x, classes, &t, self.ignore(), self.ignore_index.is_some());
        Ok((cpu::write(OP, &[out.mean], xs.dtype())?, Shape::from(())))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ts: &CudaStorage, tl: &Layout) -> Result<(CudaStorage, Shape)> {
        use crate::candle::cuda::{self, Output};
        use crate::graph::DataType;
        use crate::ops::CrossEntropyForward;

        let (rows, _) = Self::problem(xl.dims(), tl.dims())?;
        if !xl.is_contiguous() {
            return Err(arg_err(
                OP,
                "logits",
                "needs contiguous logits (cross_entropy() makes them)",
            ));
        }
        let stream = cuda::stream(xs);
        let x = cuda::input(OP, "logits", xs, xl, &stream)?;
        let t = cuda::i64_input(OP, "targets", ts, tl, &stream)?;
        let mut lse = Output::alloc(OP, &stream, DataType::F32, rows)?;
        let mut mean = Output::alloc(OP, &stream, x.dtype(), 1)?;
        {
            let lse_view = lse.view(&stream, &[rows as i64], &[1])?;
            let mean_view = mean.view(&stream, &[1], &[1])?;
            let args = CrossEntropyForward {
                logits: &x,
                targets: &t,
                ignore: self.ignore(),
                lse: &lse_view,
                row_loss: None,
                mean: Some(&mean_view),
                mean_over: self.mean_over(),
            };
            crate::ops::cross_entropy_forward(&stream, &args).map_err(candle_core::Error::wrap)?;
        }
        let dev = &xs.device;
        self.saved.keep(vec![cuda::tensor(lse.into_storage(dev.clone()), rows)]);
        Ok((mean.into_storage(dev.clone()), Shape::from(())))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(self.backward(logits, targets, grad)?), None))
    }
}

/// Checks the operands and applies `op` with autograd (contiguous logits; int64 targets on
/// CUDA, the kernels' type).
fn apply(logits: &Tensor, targets: &Tensor, op: CrossEntropy) -> Result<Tensor> {
    CrossEntropy::problem(logits.dims(), targets.dims())?;
    if !matches!(logits.dtype(), DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
        return Err(arg_err(
            OP,
            "logits",
            format!(
                "dtype {:?} is not supported (f32, f16, bf16; f64 on the CPU)",
                logits.dtype()
            ),
        ));
    }
    if !targets.dtype().is_int() {
        return Err(arg_err(
            OP,
            "targets",
            format!("dtype {:?} is not an integer type", targets.dtype()),
        ));
    }
    let targets = match logits.device() {
        Device::Cuda(_) => targets.to_dtype(DType::I64)?,
        _ => targets.clone(),
    };
    logits.contiguous()?.apply_op2(&targets, op)
}

/// The mean cross-entropy of `logits [rows, classes]` against integer `targets [rows]`, as
/// candle-nn's `loss::cross_entropy` computes it (every row counted), as a scalar of the
/// logits' dtype, differentiable in the logits. f32/f16/bf16 logits need no cast to f32 first:
/// the kernels accumulate in f32.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    apply(logits, targets, CrossEntropy::new(None))
}

/// [`cross_entropy`] where rows whose target is `ignore_index` add nothing and the mean is
/// over the other rows (PyTorch's `F.cross_entropy(..., ignore_index=...)`; NaN when every
/// row is ignored).
pub fn cross_entropy_ignore_index(logits: &Tensor, targets: &Tensor, ignore_index: i64) -> Result<Tensor> {
    apply(logits, targets, CrossEntropy::new(Some(ignore_index)))
}
