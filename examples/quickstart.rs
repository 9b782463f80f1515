//! Quickstart: one fused conv + bias + ReLU through cuDNN, checked against the float64 CPU
//! reference. Without a GPU it says why and runs the CPU reference alone.
//!
//! `cargo run --release --example quickstart`

use cudnn_backend::ops::{self, Activation, ConvParams, TensorMut, TensorRef};
use cudnn_backend::{runtime, Device};
use cudnn_backend_reference::{self as cpu, ConvGeometry, SplitMix64};

const X_DIMS: [usize; 4] = [8, 32, 28, 28];
const W_DIMS: [usize; 4] = [64, 32, 3, 3];

fn main() {
    let mut rng = SplitMix64::new(2024);
    let x = rng.fill(X_DIMS.iter().product());
    let w = rng.fill(W_DIMS.iter().product());
    let bias = rng.fill(W_DIMS[0]);
    let geometry = ConvGeometry {
        pre_padding: vec![1, 1],
        post_padding: vec![1, 1],
        stride: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    };
    let y_dims = geometry.output_dims(&X_DIMS, &W_DIMS);
    let mut reference = cpu::conv_forward(&x, &X_DIMS, &w, &W_DIMS, &geometry);
    cpu::bias_activation(&mut reference, &y_dims, 1, &bias, cpu::Activation::Relu);
    println!("conv {X_DIMS:?} * {W_DIMS:?} + bias, ReLU -> {y_dims:?} (f32, NCHW)");
    println!("{}", runtime::report());

    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("\nNo GPU: {e}");
            let checksum: f64 = reference.iter().sum();
            println!(
                "Ran the CPU reference only: {} outputs, checksum {checksum:.6}",
                reference.len()
            );
            return;
        }
    };
    match run_on_gpu(&device, &x, &w, &bias, &y_dims) {
        Ok(out) => {
            let err = cpu::rel_l2_error(&out, &reference);
            println!(
                "\nGPU: {} (sm_{}{})",
                device.info().name,
                device.info().compute_capability.0,
                device.info().compute_capability.1
            );
            println!("relative L2 error vs float64 reference: {err:.2e} (bound 1e-5)");
            let stats = cudnn_backend::plan::stats();
            println!("plan cache: {} misses, {} hits", stats.plan_misses, stats.plan_hits);
            let k = cudnn_backend::kernels::compile_stats();
            println!(
                "kernels: {} compiled ({:.0} ms NVRTC), {} from the disk cache",
                k.compiled, k.compile_ms, k.disk_hits
            );
            if err > 1e-5 {
                eprintln!("FAILED: error above bound");
                std::process::exit(1);
            }
            println!("OK");
        }
        Err(e) => {
            eprintln!("cuDNN run failed: {e}");
            std::process::exit(1);
        }
    }
}

fn run_on_gpu(
    device: &Device,
    x: &[f64],
    w: &[f64],
    bias: &[f64],
    y_dims: &[usize],
) -> cudnn_backend::Result<Vec<f64>> {
    let stream = device.stream();
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
    let dims = |d: &[usize]| d.iter().map(|&a| a as i64).collect::<Vec<i64>>();
    let xb = stream.clone_htod(&f32s(x))?;
    let wb = stream.clone_htod(&f32s(w))?;
    let bb = stream.clone_htod(&f32s(bias))?;
    let mut yb = stream.alloc_zeros::<f32>(y_dims.iter().product())?;
    {
        // Views borrow the buffers (checked to hold every element), so the memory stays
        // alive and, for the output, unaliased while the ops use it.
        let xt = TensorRef::packed(&xb, stream, &dims(&X_DIMS))?;
        let wt = TensorRef::packed(&wb, stream, &dims(&W_DIMS))?;
        let bt = TensorRef::packed(&bb, stream, &[W_DIMS[0] as i64])?;
        let yt = TensorMut::packed(&mut yb, stream, &dims(y_dims))?;
        let params = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
        // Twice: the second call is served from the plan cache.
        for _ in 0..2 {
            ops::conv_bias_act_forward(stream, &xt, &wt, &bt, &yt, &params, Activation::Relu)?;
        }
    }
    let out = stream.clone_dtoh(&yb)?;
    Ok(out.into_iter().map(f64::from).collect())
}
