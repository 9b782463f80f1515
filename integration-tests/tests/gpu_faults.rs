//! Faults: with the GPU's memory exhausted, ops fail with an error the caller can catch (or
//! succeed on a plan needing no workspace) — never crash or hang — and after memory is freed
//! the same pool and caches work again. Needs a CUDA GPU.

use cudnn_backend::cudarc::driver::CudaSlice;
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, ConvParams};
use cudnn_backend::reference::{self as cpu, SplitMix64};
use cudnn_backend::{Device, Error};
use integration_tests::{download, poisoned, random, strides, Layout};

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_is_an_error_and_the_engine_recovers() {
    let dev = Device::new(0).expect("needs a CUDA GPU");
    // A fresh stream: its workspace slot starts empty, so a plan needing workspace must allocate.
    let s = dev.context().new_stream().unwrap();
    let mut rng = SplitMix64::new(3);
    let (xd, wd) = ([32i64, 64, 56, 56], [64i64, 64, 3, 3]);
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    let yd = p.output_dims(&xd, &wd).unwrap();
    let (xs, ws, ys) = (
        strides(&xd, Layout::Nhwc),
        strides(&wd, Layout::Nhwc),
        strides(&yd, Layout::Nhwc),
    );
    let x = random(&s, &mut rng, &xd, &xs, DataType::F16);
    let w = random(&s, &mut rng, &wd, &ws, DataType::F16);
    let y = poisoned(&s, &yd, &ys, DataType::F16);
    s.synchronize().unwrap();

    // Fill the device: 1 GiB chunks, then 16 MiB chunks, until allocation fails.
    let mut hog: Vec<CudaSlice<u8>> = Vec::new();
    for chunk in [1usize << 30, 16 << 20] {
        while let Ok(b) = s.alloc_zeros::<u8>(chunk) {
            hog.push(b);
        }
    }
    s.synchronize().unwrap();
    let held: usize = hog.iter().map(|b| b.len()).sum();
    let outcome = ops::conv_forward(&s, &x.t, &w.t, &y.t, &p);
    let sync = s.synchronize();
    println!(
        "faults: held {:.1} GiB; conv with memory full -> {outcome:?}; sync -> {sync:?}",
        held as f64 / (1u64 << 30) as f64
    );
    match &outcome {
        Ok(()) => {}
        Err(Error::OutOfMemory { .. })
        | Err(Error::Cudnn { .. })
        | Err(Error::Unsupported { .. })
        | Err(Error::Cuda { .. }) => {}
        Err(other) => panic!("unexpected error kind with memory full: {other}"),
    }

    drop(hog);
    s.synchronize().unwrap();
    // Same thread, same pooled handle, same caches: must work and be right now.
    ops::conv_forward(&s, &x.t, &w.t, &y.t, &p).expect("conv after freeing memory");
    let g = cpu::ConvGeometry {
        pre_padding: vec![1, 1],
        post_padding: vec![1, 1],
        stride: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    };
    let reference = cpu::conv_forward(
        &x.values,
        &integration_tests::udims(&x),
        &w.values,
        &integration_tests::udims(&w),
        &g,
    );
    let err = cpu::rel_l2_error(&download(&s, &y), &reference);
    println!("faults: after freeing, rel L2 error {err:.2e}");
    assert!(err <= 1e-2, "wrong result after recovery: {err}");
}
