//! Burn's data parallelism on `Autodiff<Cudnn>` (feature `distributed`), on two GPUs: a small
//! MLP trained with Burn's Adam for a few steps on two replicas, each on half of every batch,
//! with gradients averaged through NCCL during the backward pass, ends bit-identical on both
//! GPUs and equal (within reduction-order noise) to the same model trained on one GPU with
//! the whole batch. Tests named `two_gpus_*` need two GPUs and fail saying so.
//!
//! ```sh
//! cargo test --release -p cudnn-backend --features distributed --test burn_distributed -- --include-ignored
//! ```

#![cfg(feature = "distributed")]

use burn_autodiff::Autodiff;
use burn_backend::distributed::{DistributedBackend, DistributedConfig, ReduceOperation};
use burn_core as burn;
use burn_core::module::{AutodiffModule, Module};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{Tensor, TensorData};
use burn_nn::loss::{MseLoss, Reduction};
use burn_nn::{Linear, LinearConfig, Relu};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use cudnn_backend::burn::distributed::replicas;
use cudnn_backend::burn::{Cudnn, CudnnDevice};

type B = Autodiff<Cudnn>;

const BATCH: usize = 64;
const STEPS: usize = 5;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            a: LinearConfig::new(16, 32).init(device),
            b: LinearConfig::new(32, 4).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.b.forward(Relu::new().forward(self.a.forward(x)))
    }
}

/// Deterministic inputs `[BATCH, 16]` and targets `[BATCH, 4]` in [-1, 1).
fn data() -> (Vec<f32>, Vec<f32>) {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let x = (0..BATCH * 16).map(|_| next()).collect();
    let y = (0..BATCH * 4).map(|_| next()).collect();
    (x, y)
}

/// Trains `model` on rows `rows` of every batch for [`STEPS`] steps on `device`.
fn train(mut model: Mlp<B>, device: &CudnnDevice, rows: std::ops::Range<usize>) -> Mlp<B> {
    let (x, y) = data();
    let n = rows.len();
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(x[rows.start * 16..rows.end * 16].to_vec(), [n, 16]),
        device,
    );
    let y = Tensor::<B, 2>::from_data(
        TensorData::new(y[rows.start * 4..rows.end * 4].to_vec(), [n, 4]),
        device,
    );
    let mut optim = AdamConfig::new().init();
    for _ in 0..STEPS {
        let loss = MseLoss::new().forward(model.forward(x.clone()), y.clone(), Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    model
}

/// Every parameter of `model`, flattened, in f64.
fn params(model: &Mlp<B>) -> Vec<f64> {
    let m = model.valid();
    [
        m.a.weight.val().into_data(),
        m.a.bias.as_ref().unwrap().val().into_data(),
    ]
    .into_iter()
    .chain([
        m.b.weight.val().into_data(),
        m.b.bias.as_ref().unwrap().val().into_data(),
    ])
    .flat_map(|d| d.to_vec::<f32>().unwrap())
    .map(f64::from)
    .collect()
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_data_parallel_training_matches_one_gpu_with_the_whole_batch() {
    let n = cudnn_backend::runtime::device_count().expect("needs CUDA GPUs");
    assert!(n >= 2, "this test needs two CUDA GPUs; the machine has {n}");
    let devices = [CudnnDevice::new(0), CudnnDevice::new(1)];
    <B as Backend>::seed(&devices[0], 7);
    // Initialized and forked once, so the single-GPU model and both replicas start from the
    // same weights (Burn's lazy parameters would otherwise initialize in each clone).
    let mut models = replicas(Mlp::<B>::new(&devices[0]), &[devices[0], devices[0], devices[1]]).into_iter();
    let single = params(&train(models.next().unwrap(), &devices[0], 0..BATCH));
    let replicas: Vec<Mlp<B>> = models.collect();

    <B as DistributedBackend>::start_communication_server(
        &devices,
        DistributedConfig {
            all_reduce_op: ReduceOperation::Mean,
        },
    );
    let replicas: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = replicas
            .into_iter()
            .zip(&devices)
            .enumerate()
            .map(|(rank, (model, device))| {
                let half = BATCH / 2;
                s.spawn(move || params(&train(model, device, rank * half..(rank + 1) * half)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("replica thread")).collect()
    });
    <B as DistributedBackend>::close_communication_server(&devices[0]);

    assert_eq!(replicas[0], replicas[1], "the replicas must end bit-identical");
    let num: f64 = replicas[0].iter().zip(&single).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = single.iter().map(|b| b * b).sum();
    let rel = (num / den).sqrt();
    println!("data parallel vs one GPU after {STEPS} Adam steps: relative L2 {rel:.2e}");
    assert!(
        rel < 1e-5,
        "two half-batch replicas drifted from the whole-batch model: relative L2 {rel:e}"
    );
}
