//! Engine ops with fixed random inputs, for the concurrency tests: each job runs one op
//! into an output view it is given, so many threads can run the same job into their own
//! buffers and compare the bytes with a single-thread run.

use std::sync::Arc;

use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, ConvParams, PoolMode, PoolParams, TensorMut};
use cudnn_backend_reference::SplitMix64;

use crate::{random, strides, DevTensor, Layout};

/// Runs one op with the given inputs into the given output view.
pub type RunFn = Box<dyn Fn(&Arc<CudaStream>, &[DevTensor], &TensorMut) -> cudnn_backend::Result<()> + Send + Sync>;

/// The dims, strides and dtype of a job's output.
#[derive(Clone, Debug, PartialEq)]
pub struct OutSpec {
    /// Dims.
    pub dims: Vec<i64>,
    /// Strides in elements.
    pub strides: Vec<i64>,
    /// Element type.
    pub dtype: DataType,
}

impl OutSpec {
    fn new(dims: &[i64], strides: &[i64], dtype: DataType) -> Self {
        Self {
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            dtype,
        }
    }
}

/// One engine op with fixed inputs; `run` writes into the output view it is given.
pub struct Job {
    /// Op and case number, for messages.
    pub name: String,
    /// The inputs (kept alive for the views).
    pub inputs: Vec<DevTensor>,
    /// The output's dims, strides and dtype (its memory is allocated per run).
    pub out: OutSpec,
    /// The op.
    pub run: RunFn,
}

/// A convolution case: N, C, H (= W), K, R (= S), stride, dtype, layout. Padding is R/2.
pub type ConvCase = (i64, i64, i64, i64, i64, i64, DataType, Layout);
/// A batched matmul case: batch, M, K, N, dtype.
pub type MatmulCase = (i64, i64, i64, i64, DataType);
/// A 3x3 / stride 2 / padding 1 pooling case on [2, 8, 13, 13]: mode, dtype, layout.
pub type PoolCase = (PoolMode, DataType, Layout);

/// Jobs with inputs drawn from `seed`: conv forward, data grad and filter grad per conv
/// case, one matmul per matmul case, pooling forward and backward per pool case.
pub fn engine_jobs(
    s: &Arc<CudaStream>,
    seed: u64,
    convs: &[ConvCase],
    matmuls: &[MatmulCase],
    pools: &[PoolCase],
) -> Vec<Job> {
    let mut rng = SplitMix64::new(seed);
    let mut jobs = Vec::new();
    for (i, &(n, c, h, k, r, stride, dtype, layout)) in convs.iter().enumerate() {
        let p = ConvParams::new(&[r / 2, r / 2], &[stride, stride], &[1, 1], 1);
        let (xd, wd) = (vec![n, c, h, h], vec![k, c, r, r]);
        let yd = p.output_dims(&xd, &wd).unwrap();
        let x = random(s, &mut rng, &xd, &strides(&xd, layout), dtype);
        let dy = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
        let (p1, p2, p3) = (p.clone(), p.clone(), p.clone());
        jobs.push(Job {
            name: format!("conv_fwd#{i}"),
            inputs: vec![
                random(s, &mut rng, &xd, &strides(&xd, layout), dtype),
                random(s, &mut rng, &wd, &strides(&wd, layout), dtype),
            ],
            out: OutSpec::new(&yd, &strides(&yd, layout), dtype),
            run: Box::new(move |s, i, o| ops::conv_forward(s, &i[0].t, &i[1].t, o, &p1)),
        });
        jobs.push(Job {
            name: format!("conv_dgrad#{i}"),
            inputs: vec![
                random(s, &mut rng, &yd, &strides(&yd, layout), dtype),
                random(s, &mut rng, &wd, &strides(&wd, layout), dtype),
            ],
            out: OutSpec::new(&xd, &strides(&xd, layout), dtype),
            run: Box::new(move |s, i, o| ops::conv_backward_data(s, &i[0].t, &i[1].t, o, &p2)),
        });
        jobs.push(Job {
            name: format!("conv_wgrad#{i}"),
            inputs: vec![x, dy],
            out: OutSpec::new(&wd, &strides(&wd, layout), dtype),
            run: Box::new(move |s, i, o| ops::conv_backward_filter(s, &i[0].t, &i[1].t, o, &p3)),
        });
    }
    for (i, &(b, m, kk, nn, dtype)) in matmuls.iter().enumerate() {
        let (ad, bd, cd) = (vec![b, m, kk], vec![b, kk, nn], vec![b, m, nn]);
        jobs.push(Job {
            name: format!("matmul#{i}"),
            inputs: vec![
                random(s, &mut rng, &ad, &strides(&ad, Layout::Nchw), dtype),
                random(s, &mut rng, &bd, &strides(&bd, Layout::Nchw), dtype),
            ],
            out: OutSpec::new(&cd, &strides(&cd, Layout::Nchw), dtype),
            run: Box::new(|s, i, o| ops::matmul(s, &i[0].t, &i[1].t, o)),
        });
    }
    for (i, &(mode, dtype, layout)) in pools.iter().enumerate() {
        let p = PoolParams::new(mode, &[3, 3], &[2, 2], &[1, 1]);
        let xd = vec![2, 8, 13, 13];
        let yd = p.output_dims(&xd).unwrap();
        let x = random(s, &mut rng, &xd, &strides(&xd, layout), dtype);
        let pf = p.clone();
        jobs.push(Job {
            name: format!("pool_fwd#{i}"),
            inputs: vec![random(s, &mut rng, &xd, &strides(&xd, layout), dtype)],
            out: OutSpec::new(&yd, &strides(&yd, layout), dtype),
            run: Box::new(move |s, i, o| ops::pool_forward(s, &i[0].t, o, &pf)),
        });
        // Backward needs the forward's y: compute it once into an input buffer.
        let y = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
        ops::pool_forward(s, &x.t, &y.m, &p).unwrap();
        let dy = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
        jobs.push(Job {
            name: format!("pool_bwd#{i}"),
            inputs: vec![x, y, dy],
            out: OutSpec::new(&xd, &strides(&xd, layout), dtype),
            run: Box::new(move |s, i, o| ops::pool_backward(s, Some(&i[0].t), Some(&i[1].t), &i[2].t, o, &p)),
        });
    }
    s.synchronize().unwrap();
    jobs
}

/// Runs `job` into a fresh buffer poisoned with 0xFF on `s` and returns the output bytes.
pub fn run_once(s: &Arc<CudaStream>, job: &Job) -> Vec<u8> {
    let out = crate::poisoned(s, &job.out.dims, &job.out.strides, job.out.dtype);
    (job.run)(s, &job.inputs, &out.m).unwrap_or_else(|e| panic!("{}: {e}", job.name));
    s.clone_dtoh(&out.buf).unwrap()
}
