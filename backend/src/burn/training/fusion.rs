//! The fused training ops on `Fusion<Cudnn>`: each forward and backward is recorded in
//! burn-fusion's lazy queue as one custom operation that runs the [`Cudnn`] kernels when
//! the queue executes, so `Autodiff<CudnnFusion>` trains with the same fused batch norm,
//! norm and attention passes as `Autodiff<Cudnn>` while the fusers take the rest.

use burn_backend::{DType, Shape, TensorMetadata};

use super::super::fusion::custom::{optional, record, take, Lazy};
use super::super::tensor::expect;
use super::super::CudnnFusion;
use super::attention::AttentionGrads;
use super::kernels::TrainingKernels;
use super::{attention, batch_norm, norm, BatchNormOutput, TrainingOps};
use crate::graph::NormMode;
use crate::ops::BatchNormOptions;

/// Per-channel (or per-feature) metadata: `[n]` of `dtype`.
fn vector(n: usize, dtype: DType) -> (Shape, DType) {
    (Shape::from(vec![n]), dtype)
}

/// The metadata of the gradients `want` asks for, in order (a backward's outputs).
fn wanted<const N: usize>(metas: [(Shape, DType); N], want: [bool; N]) -> Vec<(Shape, DType)> {
    metas
        .into_iter()
        .zip(want)
        .filter(|(_, w)| *w)
        .map(|(m, _)| m)
        .collect()
}

/// The recorded gradients back in their slots, `None` where `want` did not ask.
fn spread<const N: usize>(out: Vec<Lazy>, want: [bool; N]) -> [Option<Lazy>; N] {
    let mut out = out.into_iter();
    want.map(|w| if w { out.next() } else { None })
}

/// What a recorded batch norm's backward needs.
#[derive(Clone, Debug)]
pub(crate) struct LazyBnSaved {
    x: Lazy,
    y: Option<Lazy>,
    scale: Lazy,
    mean: Lazy,
    inv_std: Lazy,
}

/// What a recorded norm's backward needs.
#[derive(Clone, Debug)]
pub(crate) struct LazyNormSaved {
    x: Lazy,
    scale: Lazy,
    mean: Option<Lazy>,
    inv_std: Lazy,
    mode: NormMode,
}

/// What a recorded attention's backward needs.
#[derive(Clone, Debug)]
pub(crate) struct LazyAttentionSaved {
    q: Lazy,
    k: Lazy,
    v: Lazy,
    o: Lazy,
    stats: Lazy,
    bias: Option<Lazy>,
    causal: bool,
    scale: f64,
    /// The f32 math path's probabilities (its backward reads them).
    probs: Option<Lazy>,
}

/// Records the fused attention forward keeping the softmax statistics; cuDNN decides when
/// the queue executes, and a case it declines runs the composed forward there (same output
/// and statistics). f32 attention without a bias records the math path instead, with the
/// probabilities as a third output. `bias_grad`: the backward will want the bias's gradient.
fn record_attention(
    q: Lazy,
    k: Lazy,
    v: Lazy,
    bias: Option<Lazy>,
    causal: bool,
    scale: f64,
    bias_grad: bool,
) -> (Lazy, LazyAttentionSaved) {
    let (qd, kd, vd) = (q.shape.to_vec(), k.shape.to_vec(), v.shape.to_vec());
    let math = attention::math_path_shapes(
        [(qd.clone(), q.dtype), (kd.clone(), k.dtype), (vd.clone(), v.dtype)],
        bias.is_some(),
        causal,
    );
    let mut outputs = vec![
        (Shape::from(vec![qd[0], qd[1], qd[2], vd[3]]), q.dtype),
        (Shape::from(vec![qd[0], qd[1], qd[2], 1]), DType::F32),
    ];
    if math {
        outputs.push((Shape::from(vec![qd[0], qd[1], qd[2], kd[2]]), DType::F32));
    }
    let has_bias = bias.is_some();
    let mut inputs = vec![q.clone(), k.clone(), v.clone()];
    inputs.extend(bias.clone());
    let out = record("cudnn_attention", inputs, outputs, move |ins| {
        let mut ins = ins.into_iter();
        let [q, k, v] = take(&mut ins)?;
        let bias = optional(&mut ins, has_bias);
        let fused = attention::forward(q.clone(), k.clone(), v.clone(), bias.clone(), causal, scale, bias_grad)?;
        let out = match fused {
            Some((o, saved)) => {
                let mut out = vec![o, saved.stats().clone()];
                out.extend(saved.probs().cloned());
                out
            }
            None => {
                let (o, stats) = attention::composed_forward(q, k, v, bias, causal, scale)?;
                vec![o, stats]
            }
        };
        if out.len() != 2 + usize::from(math) {
            return Err(crate::error::Error::invalid_input(
                "cudnn_attention",
                "internal error: the forward took another path than the one recorded",
            ));
        }
        Ok(out)
    });
    let mut out = out.into_iter();
    let [o, stats] = expect("cudnn_attention", take(&mut out));
    let saved = LazyAttentionSaved {
        q,
        k,
        v,
        o: o.clone(),
        stats,
        bias,
        causal,
        scale,
        probs: optional(&mut out, math),
    };
    (o, saved)
}

impl TrainingKernels for CudnnFusion {
    type BnSaved = LazyBnSaved;
    type NormSaved = LazyNormSaved;
    type AttentionSaved = LazyAttentionSaved;

    fn bn_forward(
        x: Lazy,
        scale: Lazy,
        bias: Lazy,
        residual: Option<Lazy>,
        running: [Lazy; 2],
        options: &BatchNormOptions,
    ) -> (Lazy, [Lazy; 2], LazyBnSaved) {
        let c = scale.shape[0];
        let running_dtype = running[0].dtype;
        let has_residual = residual.is_some();
        let mut outputs = vec![(x.shape(), x.dtype), vector(c, running_dtype), vector(c, running_dtype)];
        outputs.extend([vector(c, DType::F32), vector(c, DType::F32)]);
        let mut inputs = vec![x.clone(), scale.clone(), bias];
        inputs.extend(running);
        inputs.extend(residual);
        let o = *options;
        let out = record("cudnn_batch_norm_train", inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [x, scale, bias, rm, rv] = take(&mut ins)?;
            let residual = optional(&mut ins, has_residual);
            let (y, [rm, rv], saved) = batch_norm::forward(x, scale, bias, residual, [rm, rv], &o)?;
            let [mean, inv_std] = saved.stats().map(|t| t.clone());
            Ok(vec![y, rm, rv, mean, inv_std])
        });
        let [y, rm, rv, mean, inv_std] = expect("cudnn_batch_norm_train", take(&mut out.into_iter()));
        let saved = LazyBnSaved {
            x,
            y: options.relu.then(|| y.clone()),
            scale,
            mean,
            inv_std,
        };
        (y, [rm, rv], saved)
    }

    fn bn_backward(s: &LazyBnSaved, dy: Lazy, want: [bool; 4]) -> [Option<Lazy>; 4] {
        let c = s.scale.shape[0];
        let full = (s.x.shape(), s.x.dtype);
        let per_channel = vector(c, s.scale.dtype);
        let outputs = wanted([full.clone(), full, per_channel.clone(), per_channel], want);
        let has_y = s.y.is_some();
        let mut inputs = vec![s.x.clone(), s.scale.clone(), s.mean.clone(), s.inv_std.clone(), dy];
        inputs.extend(s.y.clone());
        let out = record("cudnn_batch_norm_backward", inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [x, scale, mean, inv_std, dy] = take(&mut ins)?;
            let y = optional(&mut ins, has_y);
            let saved = batch_norm::BnSaved::rebuild(x, y, scale, mean, inv_std)?;
            Ok(batch_norm::backward(&saved, dy, want)?.into_iter().flatten().collect())
        });
        spread(out, want)
    }

    fn norm_forward(x: Lazy, scale: Lazy, bias: Option<Lazy>, epsilon: f64, mode: NormMode) -> (Lazy, LazyNormSaved) {
        let features = x.shape.to_vec().last().copied().unwrap_or(1);
        let rows = x.shape.num_elements().checked_div(features).unwrap_or(0);
        let layer = mode == NormMode::LayerNorm;
        let mut outputs = vec![(x.shape(), x.dtype)];
        if layer {
            outputs.push(vector(rows, DType::F32));
        }
        outputs.push(vector(rows, DType::F32));
        let has_bias = bias.is_some();
        let mut inputs = vec![x.clone(), scale.clone()];
        inputs.extend(bias);
        let out = record("cudnn_norm_train", inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [x, scale] = take(&mut ins)?;
            let bias = optional(&mut ins, has_bias);
            let (y, saved) = norm::forward(x, scale, bias, epsilon, mode)?;
            let (mean, inv_std) = saved.stats();
            let mut out = vec![y];
            out.extend(mean.cloned());
            out.push(inv_std.clone());
            Ok(out)
        });
        let mut out = out.into_iter();
        let [y] = expect("cudnn_norm_train", take(&mut out));
        let mean = optional(&mut out, layer);
        let [inv_std] = expect("cudnn_norm_train", take(&mut out));
        let saved = LazyNormSaved {
            x,
            scale,
            mean,
            inv_std,
            mode,
        };
        (y, saved)
    }

    fn norm_backward(s: &LazyNormSaved, dy: Lazy, want: [bool; 3]) -> [Option<Lazy>; 3] {
        let features = s.x.shape.to_vec().last().copied().unwrap_or(1);
        let per_feature = vector(features, s.scale.dtype);
        let outputs = wanted([(s.x.shape(), s.x.dtype), per_feature.clone(), per_feature], want);
        let mode = s.mode;
        let has_mean = s.mean.is_some();
        let mut inputs = vec![s.x.clone(), s.scale.clone(), s.inv_std.clone(), dy];
        inputs.extend(s.mean.clone());
        let out = record("cudnn_norm_backward", inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [x, scale, inv_std, dy] = take(&mut ins)?;
            let mean = optional(&mut ins, has_mean);
            let saved = norm::NormSaved::rebuild(x, scale, mean, inv_std, mode)?;
            Ok(norm::backward(&saved, dy, want)?.into_iter().flatten().collect())
        });
        spread(out, want)
    }

    fn attention_fusable(q: &Lazy, k: &Lazy, v: &Lazy, bias: Option<&Lazy>, causal: bool) -> bool {
        let meta = |t: &Lazy| (t.shape.to_vec(), t.dtype);
        attention::trainable_shapes([meta(q), meta(k), meta(v)], bias.map(meta), causal)
    }

    /// Always `Some`: cuDNN decides when the queue executes, and a case it declines runs the
    /// composed forward there (same output and statistics).
    fn attention_forward(
        q: Lazy,
        k: Lazy,
        v: Lazy,
        bias: Option<Lazy>,
        causal: bool,
        scale: f64,
        bias_grad: bool,
    ) -> Option<(Lazy, LazyAttentionSaved)> {
        Some(record_attention(q, k, v, bias, causal, scale, bias_grad))
    }

    fn attention_backward(s: &LazyAttentionSaved, d_o: Lazy, want_bias: bool) -> AttentionGrads<Lazy> {
        const OP: &str = "cudnn_attention_backward";
        let mut outputs = [&s.q, &s.k, &s.v].map(|t| (t.shape(), s.q.dtype)).to_vec();
        let (causal, scale, has_bias) = (s.causal, s.scale, s.bias.is_some());
        // The bias's gradient is one more output, in the bias's shape and dtype.
        let with_d_bias = want_bias && has_bias;
        outputs.extend(s.bias.as_ref().filter(|_| with_d_bias).map(|b| (b.shape(), b.dtype)));
        let has_probs = s.probs.is_some();
        let mut inputs = vec![s.q.clone(), s.k.clone(), s.v.clone(), s.o.clone(), s.stats.clone(), d_o];
        inputs.extend(s.bias.clone());
        inputs.extend(s.probs.clone());
        let out = record(OP, inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [q, k, v, o, stats, d_o] = take(&mut ins)?;
            let bias = optional(&mut ins, has_bias);
            let probs = optional(&mut ins, has_probs);
            let saved = attention::AttentionSaved::rebuild(q, k, v, o, stats, bias, causal, scale)?.with_probs(probs);
            let (grads, d_bias) = attention::backward(&saved, d_o, with_d_bias)?;
            let mut out = grads.to_vec();
            out.extend(d_bias);
            Ok(out)
        });
        let mut out = out.into_iter();
        let grads = expect(OP, take(&mut out));
        (grads, optional(&mut out, with_d_bias))
    }
}

impl TrainingOps for CudnnFusion {
    fn batch_norm_train(
        x: Lazy,
        scale: Lazy,
        bias: Lazy,
        residual: Option<Lazy>,
        running_mean: Lazy,
        running_var: Lazy,
        options: BatchNormOptions,
    ) -> BatchNormOutput<Self> {
        let (output, [running_mean, running_var], _) =
            Self::bn_forward(x, scale, bias, residual, [running_mean, running_var], &options);
        BatchNormOutput {
            output,
            running_mean,
            running_var,
        }
    }

    fn batch_norm_inference(
        x: Lazy,
        scale: Lazy,
        bias: Lazy,
        residual: Option<Lazy>,
        running_mean: Lazy,
        running_var: Lazy,
        epsilon: f64,
        relu: bool,
    ) -> Lazy {
        let outputs = vec![(x.shape(), x.dtype)];
        let has_residual = residual.is_some();
        let mut inputs = vec![x, scale, bias, running_mean, running_var];
        inputs.extend(residual);
        let out = record("cudnn_batch_norm_inference", inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [x, scale, bias, rm, rv] = take(&mut ins)?;
            let residual = optional(&mut ins, has_residual);
            Ok(vec![batch_norm::inference(
                x, scale, bias, residual, rm, rv, epsilon, relu,
            )?])
        });
        let [y] = expect("cudnn_batch_norm_inference", take(&mut out.into_iter()));
        y
    }

    fn norm(x: Lazy, scale: Lazy, bias: Option<Lazy>, epsilon: f64, mode: NormMode) -> Lazy {
        Self::norm_forward(x, scale, bias, epsilon, mode).0
    }

    fn sdpa(q: Lazy, k: Lazy, v: Lazy, bias: Option<Lazy>, causal: bool, scale: f64) -> Lazy {
        if Self::attention_fusable(&q, &k, &v, bias.as_ref(), causal) {
            return record_attention(q, k, v, bias, causal, scale, false).0;
        }
        let outputs = vec![(
            Shape::from(vec![q.shape[0], q.shape[1], q.shape[2], v.shape[3]]),
            q.dtype,
        )];
        let has_bias = bias.is_some();
        let mut inputs = vec![q, k, v];
        inputs.extend(bias);
        let out = record("cudnn_attention_composed", inputs, outputs, move |ins| {
            let mut ins = ins.into_iter();
            let [q, k, v] = take(&mut ins)?;
            let bias = optional(&mut ins, has_bias);
            Ok(vec![attention::cudnn(q, k, v, bias, causal, scale)?])
        });
        let [y] = expect("cudnn_attention_composed", take(&mut out.into_iter()));
        y
    }
}
