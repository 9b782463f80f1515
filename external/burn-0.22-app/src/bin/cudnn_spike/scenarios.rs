//! What the spike runs on Burn 0.22's CUDA device: the conv -> relu -> conv -> add chain with
//! the fusion counters, and per shape a correctness check and a timed chain of convolutions.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::relu;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{FloatDType, TensorData};

use cudnn_backend_reference::{rel_l2_error, SplitMix64};
use cudnn_burn::Stats;

use crate::error::{Result, SpikeError};

use crate::reference::{l2, random_values, ConvShape};

/// The element type of a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }

    /// The relative L2 error a correct convolution stays under: f32 allows TF32 tensor cores
    /// (10-bit mantissa products, f32 accumulation), bf16 the rounding of the bf16 output.
    pub fn tolerance(self) -> f64 {
        match self {
            Dtype::F32 => 5e-3,
            Dtype::Bf16 => 2e-2,
        }
    }
}

fn execution(context: &str) -> impl Fn(burn::tensor::ExecutionError) -> SpikeError + '_ {
    move |e| SpikeError::run(context, e)
}

/// Host values to a tensor of `dtype` (bf16: uploaded as f32, already bf16-exact, then cast).
fn upload(device: &Device, values: Vec<f32>, shape: [usize; 4], dtype: Dtype) -> Tensor<4> {
    let t = Tensor::<4>::from_data(TensorData::new(values, shape), device);
    match dtype {
        Dtype::F32 => t,
        Dtype::Bf16 => t.cast(FloatDType::BF16),
    }
}

/// A tensor's values as f32 (bf16 widened on the device, exactly).
fn download(t: Tensor<4>, dtype: Dtype) -> Result<Vec<f32>> {
    let t = match dtype {
        Dtype::F32 => t,
        Dtype::Bf16 => t.cast(FloatDType::F32),
    };
    let data = t.try_into_data().map_err(execution("reading a result"))?;
    data.try_to_vec::<f32>()
        .map_err(|e| SpikeError::Run(format!("reading a result as f32: {e:?}")))
}

fn options(shape: &ConvShape) -> ConvOptions<2> {
    ConvOptions::new([shape.stride; 2], [shape.pad; 2], [1, 1], 1)
}

/// Inputs and weights of `shape` (weights scaled by 1/sqrt(fan-in), so outputs stay O(1)).
fn inputs(shape: &ConvShape, dtype: Dtype, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let bf = dtype == Dtype::Bf16;
    let x = random_values(&mut rng, shape.x_len(), 1.0, bf);
    let scale = 1.0 / ((shape.c * shape.r * shape.s) as f32).sqrt();
    let w = random_values(&mut rng, shape.w_len(), scale, bf);
    (x, w)
}

/// The chain section: its error and what the counters saw.
pub struct ChainReport {
    pub rel_err: f64,
    pub counts: Stats,
    pub convs: u64,
}

/// The registered provider's counters now (all zero when nothing is registered).
pub fn stats() -> Stats {
    cudnn_burn::stats().unwrap_or_default()
}

/// `out = conv2(relu(conv1(x))) + x`, `reps` times on the same inputs (the first rep explores
/// and builds the fusion plans, the later ones reuse them), every result checked against the
/// float64 chain: relu reads a claimed convolution's output and the second convolution reads
/// relu's, so both directions of the ordering are exercised.
pub fn chain(device: &Device, dtype: Dtype, reps: usize) -> Result<ChainReport> {
    let shape = ConvShape {
        n: 2,
        c: 8,
        h: 12,
        w: 12,
        k: 8,
        r: 3,
        s: 3,
        stride: 1,
        pad: 1,
    };
    let mut rng = SplitMix64::new(0xC4A1_0000 + dtype as u64);
    let bf = dtype == Dtype::Bf16;
    let x = random_values(&mut rng, shape.x_len(), 1.0, bf);
    let scale = 1.0 / ((shape.c * 9) as f32).sqrt();
    let w1 = random_values(&mut rng, shape.w_len(), scale, bf);
    let w2 = random_values(&mut rng, shape.w_len(), scale, bf);

    let y1 = shape.full(&x, &w1);
    let a: Vec<f32> = y1.iter().map(|&v| v.max(0.0) as f32).collect();
    let want: Vec<f64> = shape
        .full(&a, &w2)
        .iter()
        .zip(&x)
        .map(|(&c, &xv)| c + xv as f64)
        .collect();

    let dims = [shape.n, shape.c, shape.h, shape.w];
    let wdims = [shape.k, shape.c, shape.r, shape.s];
    let before = stats();
    let xt = upload(device, x, dims, dtype);
    let (w1t, w2t) = (upload(device, w1, wdims, dtype), upload(device, w2, wdims, dtype));
    let opts = options(&shape);
    let mut outs = Vec::with_capacity(reps);
    for _ in 0..reps {
        let h = relu(conv2d(xt.clone(), w1t.clone(), None, opts.clone()));
        outs.push(conv2d(h, w2t.clone(), None, opts.clone()) + xt.clone());
    }
    let mut worst = 0f64;
    for out in outs {
        let got = download(out, dtype)?;
        let err = rel_l2_error(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want);
        worst = worst.max(err);
    }
    device.sync().map_err(execution("sync after the chain"))?;
    Ok(ChainReport {
        rel_err: worst,
        counts: stats().since(before),
        convs: 2 * reps as u64,
    })
}

/// One shape's results.
pub struct ShapeReport {
    /// Relative L2 error over the sampled points against float64.
    pub rel_err: f64,
    /// ‖y‖₂ over the whole output (a summary two runs can compare).
    pub norm: f64,
    /// ms per convolution: best and median timed round.
    pub ms_best: f64,
    pub ms_median: f64,
    /// Counters over the timed rounds.
    pub counts: Stats,
    pub timed_convs: u64,
}

/// What `run_shape` does.
pub struct ShapePlan {
    pub samples: usize,
    pub reps: usize,
    pub rounds: usize,
}

/// Correctness (one convolution, its sampled points against float64), then
/// `rounds` timed rounds of `reps` back-to-back convolutions of the same input (outputs kept
/// alive until the round's final sync), after one untimed warm-up round.
pub fn run_shape(device: &Device, shape: &ConvShape, dtype: Dtype, plan: &ShapePlan) -> Result<ShapeReport> {
    let (x, w) = inputs(shape, dtype, 0x5EED_0000 + shape.c as u64 * 31 + shape.r as u64);
    let picks = shape.sample(plan.samples);
    let want: Vec<f64> = picks.iter().map(|&i| shape.at(&x, &w, i)).collect();
    let xt = upload(device, x, [shape.n, shape.c, shape.h, shape.w], dtype);
    let wt = upload(device, w, [shape.k, shape.c, shape.r, shape.s], dtype);
    let opts = options(shape);

    let y = download(conv2d(xt.clone(), wt.clone(), None, opts.clone()), dtype)?;
    let rel_err = rel_l2_error(&picks.iter().map(|&i| y[i] as f64).collect::<Vec<_>>(), &want);
    let norm = l2(&y);
    drop(y);

    let round = || -> Result<f64> {
        let mut outs = Vec::with_capacity(plan.reps);
        device.sync().map_err(execution("sync before a timed round"))?;
        let t0 = Instant::now();
        for _ in 0..plan.reps {
            outs.push(conv2d(xt.clone(), wt.clone(), None, opts.clone()));
        }
        device.sync().map_err(execution("sync after a timed round"))?;
        let ms = t0.elapsed().as_secs_f64() * 1e3 / plan.reps as f64;
        drop(outs);
        Ok(ms)
    };
    round()?;
    let before = stats();
    let mut times = (0..plan.rounds.max(1)).map(|_| round()).collect::<Result<Vec<f64>>>()?;
    let counts = stats().since(before);
    times.sort_by(f64::total_cmp);
    Ok(ShapeReport {
        rel_err,
        norm,
        ms_best: times[0],
        ms_median: times[times.len() / 2],
        counts,
        timed_convs: (plan.reps * plan.rounds.max(1)) as u64,
    })
}
