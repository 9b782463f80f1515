//! Two GPUs in one process: every op runs on either one, tensors move between them, and an
//! op given operands on different GPUs is refused (an error from the engine `ops`, a panic
//! naming the op and both GPUs from the Burn backend) without faulting either GPU: after
//! the refusals both still compute right results. Needs two CUDA GPUs; with fewer it fails
//! saying so (every test name starts with `two_gpus`, so `--skip two_gpus` leaves them out).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorData};
use burn_backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps, ModuleOps};
use burn_backend::tensor::FloatTensor;
use burn_backend::{read_sync, BoolDType, FloatDType, IntDType, Shape};
use cudnn_backend::burn::{Cudnn, CudnnDevice};
use cudnn_backend::cudarc::driver::CudaStream;
use cudnn_backend::graph::{DataType, NormMode};
use cudnn_backend::ops::{self, ConvParams, NormStats, PoolMode, PoolParams};
use cudnn_backend::plan::{execute_graph_on, Binding};
use cudnn_backend::{runtime, Device, Error};
use cudnn_backend_reference::{self as cpu, SplitMix64};
use integration_tests::{bound, download, panic_message, poisoned, random, strides, udims, DevTensor, Layout};

type B = Cudnn;

/// Both GPUs, or a failure that says this test needs two.
fn two_devices() -> (Arc<Device>, Arc<Device>) {
    let n = runtime::device_count().expect("needs CUDA GPUs");
    assert!(n >= 2, "this test needs two CUDA GPUs; the machine has {n}");
    (Device::new(0).expect("GPU 0"), Device::new(1).expect("GPU 1"))
}

/// A packed NCHW f32 tensor of random values on `s`'s GPU.
fn rand_on(s: &Arc<CudaStream>, rng: &mut SplitMix64, dims: &[i64], dtype: DataType) -> DevTensor {
    random(s, rng, dims, &strides(dims, Layout::Nchw), dtype)
}

/// `r` must be an argument error of `op` naming `arg` and both GPUs.
fn refused(
    what: &str,
    r: cudnn_backend::Result<()>,
    op: &str,
    arg: &str,
    there: usize,
    here: usize,
) -> Result<(), String> {
    match r {
        Err(Error::InvalidArgument { op: o, arg: a, reason }) if o == op && a == arg => {
            let (t, h) = (format!("GPU {there}"), format!("GPU {here}"));
            if reason.contains(&t) && reason.contains(&h) {
                Ok(())
            } else {
                Err(format!("{what}: reason `{reason}` does not name {t} and {h}"))
            }
        }
        Err(e) => Err(format!(
            "{what}: expected an argument error of {op} for {arg}, got: {e}"
        )),
        Ok(()) => Err(format!("{what}: accepted operands on two GPUs")),
    }
}

/// A 3x3 convolution of `x [2, 8, 10, 10]` by `w [16, 8, 3, 3]` on `s`, checked against the
/// float64 reference; returns its output.
fn conv_checked(s: &Arc<CudaStream>, x: &[f64], w: &[f64], label: &str) -> Vec<f64> {
    let (xd, wd, yd) = ([2i64, 8, 10, 10], [16i64, 8, 3, 3], [2i64, 16, 10, 10]);
    let up = |v: &[f64], d: &[i64]| integration_tests::upload(s, v, d, &strides(d, Layout::Nchw), DataType::F32);
    let (xt, wt) = (up(x, &xd), up(w, &wd));
    let y = poisoned(s, &yd, &strides(&yd, Layout::Nchw), DataType::F32);
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    ops::conv_forward(s, &xt.t, &wt.t, &y.m, &p).unwrap_or_else(|e| panic!("{label}: {e}"));
    let got = download(s, &y);
    let want = cpu::conv_forward(
        &xt.values,
        &udims(&xt),
        &wt.values,
        &udims(&wt),
        &integration_tests::reference_geometry(&p),
    );
    let err = cpu::rel_l2_error(&got, &want);
    assert!(err <= bound(DataType::F32), "{label}: relative L2 error {err:.2e}");
    got
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_engine_ops_refuse_operands_of_the_other_gpu() {
    let (d0, d1) = two_devices();
    let (s0, s1) = (d0.stream().clone(), d1.stream().clone());
    let mut rng = SplitMix64::new(71);
    let f32_on = |s: &Arc<CudaStream>, rng: &mut SplitMix64, d: &[i64]| rand_on(s, rng, d, DataType::F32);
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut expect = |what: &str, r, op, arg, there, here| {
        cases += 1;
        if let Err(e) = refused(what, r, op, arg, there, here) {
            failures.push(e);
        }
    };

    // Convolutions: each operand in turn on the other GPU.
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    let (xd, wd) = ([2i64, 8, 10, 10], [16i64, 8, 3, 3]);
    let (x0, w0, y0) = (
        f32_on(&s0, &mut rng, &xd),
        f32_on(&s0, &mut rng, &wd),
        f32_on(&s0, &mut rng, &[2, 16, 10, 10]),
    );
    let (x1, w1, y1) = (
        f32_on(&s1, &mut rng, &xd),
        f32_on(&s1, &mut rng, &wd),
        f32_on(&s1, &mut rng, &[2, 16, 10, 10]),
    );
    let fwd = |s, x: &DevTensor, w: &DevTensor, y: &DevTensor| ops::conv_forward(s, &x.t, &w.t, &y.m, &p);
    expect(
        "conv_forward x on GPU 1",
        fwd(&s0, &x1, &w0, &y0),
        "conv_forward",
        "x",
        1,
        0,
    );
    expect(
        "conv_forward w on GPU 1",
        fwd(&s0, &x0, &w1, &y0),
        "conv_forward",
        "w",
        1,
        0,
    );
    expect(
        "conv_forward y on GPU 0",
        fwd(&s1, &x1, &w1, &y0),
        "conv_forward",
        "y",
        0,
        1,
    );
    let r = ops::conv_backward_data(&s0, &y1.t, &w0.t, &x0.m, &p);
    expect("conv_backward_data dy on GPU 1", r, "conv_backward_data", "dy", 1, 0);
    let r = ops::conv_backward_filter(&s1, &x1.t, &y1.t, &w0.m, &p);
    expect(
        "conv_backward_filter dw on GPU 0",
        r,
        "conv_backward_filter",
        "dw",
        0,
        1,
    );
    let bias0 = f32_on(&s0, &mut rng, &[16]);
    let r = ops::conv_bias_act_forward(&s1, &x1.t, &w1.t, &bias0.t, &y1.m, &p, ops::Activation::Relu);
    expect(
        "conv_bias_act_forward bias on GPU 0",
        r,
        "conv_bias_act_forward",
        "bias",
        0,
        1,
    );

    // Matmuls.
    let (a0, b1, c0) = (
        f32_on(&s0, &mut rng, &[33, 40]),
        f32_on(&s1, &mut rng, &[40, 17]),
        f32_on(&s0, &mut rng, &[33, 17]),
    );
    expect(
        "matmul b on GPU 1",
        ops::matmul(&s0, &a0.t, &b1.t, &c0.m),
        "matmul",
        "b",
        1,
        0,
    );
    let (b0, bias1) = (f32_on(&s0, &mut rng, &[40, 17]), f32_on(&s1, &mut rng, &[17]));
    let r = ops::matmul_bias_act(&s0, &a0.t, &b0.t, Some(&bias1.t), &c0.m, ops::Activation::Gelu);
    expect("matmul_bias_act bias on GPU 1", r, "matmul_bias_act", "bias", 1, 0);

    // Pooling, forward and backward.
    let pp = PoolParams::new(PoolMode::Max, &[2, 2], &[2, 2], &[0, 0]);
    let py1 = f32_on(&s1, &mut rng, &[2, 8, 5, 5]);
    expect(
        "pool_forward y on GPU 1",
        ops::pool_forward(&s0, &x0.t, &py1.m, &pp),
        "pool_forward",
        "y",
        1,
        0,
    );
    let (py0, pdy0) = (
        f32_on(&s0, &mut rng, &[2, 8, 5, 5]),
        f32_on(&s0, &mut rng, &[2, 8, 5, 5]),
    );
    let r = ops::pool_backward(&s0, Some(&x0.t), Some(&py0.t), &pdy0.t, &x1.m, &pp);
    expect("pool_backward dx on GPU 1", r, "pool_backward", "dx", 1, 0);

    // Layer norm with its statistics on the other GPU.
    let (nx, ny) = (f32_on(&s0, &mut rng, &[6, 64]), f32_on(&s0, &mut rng, &[6, 64]));
    let (scale, shift) = (f32_on(&s0, &mut rng, &[64]), f32_on(&s0, &mut rng, &[64]));
    let (mean1, inv1) = (f32_on(&s1, &mut rng, &[6, 1]), f32_on(&s1, &mut rng, &[6, 1]));
    let stats = NormStats {
        mean: &mean1.m,
        inv_std: &inv1.m,
    };
    let r = ops::norm_forward(
        &s0,
        NormMode::LayerNorm,
        &nx.t,
        &scale.t,
        Some(&shift.t),
        &ny.m,
        1e-5,
        Some(stats),
    );
    expect("layer_norm mean on GPU 1", r, "layer_norm", "mean", 1, 0);

    // Fused attention (f16) with its keys on the other GPU.
    let half = |s: &Arc<CudaStream>, rng: &mut SplitMix64, d: &[i64]| rand_on(s, rng, d, DataType::F16);
    let (q1, k0, v1, o1) = (
        half(&s1, &mut rng, &[1, 2, 16, 64]),
        half(&s0, &mut rng, &[1, 2, 16, 64]),
        half(&s1, &mut rng, &[1, 2, 16, 64]),
        half(&s1, &mut rng, &[1, 2, 16, 64]),
    );
    let r = ops::sdpa_forward(&s1, &q1.t, &k0.t, &v1.t, None, false, &o1.m, 0.125, None);
    expect("sdpa k on GPU 0", r, "sdpa", "k", 0, 1);

    // A user-built graph with a binding on the other GPU.
    let mut g = cudnn_backend::graph::Graph::new();
    let xi = g.tensor("x", &xd, &strides(&xd, Layout::Nchw), DataType::F32);
    let wi = g.tensor("w", &wd, &strides(&wd, Layout::Nchw), DataType::F32);
    g.set_alignment(xi, 16).set_alignment(wi, 16);
    let yi = g.conv_fprop(xi, wi, cudnn_backend::graph::ConvAttrs::new(&[1, 1], &[1, 1], &[1, 1]));
    let yd = [2i64, 16, 10, 10];
    g.set_output(yi, DataType::F32)
        .set_dims(yi, &yd)
        .set_strides(yi, &strides(&yd, Layout::Nchw))
        .set_alignment(yi, 16);
    g.validate().expect("valid graph");
    let bindings = [
        Binding::input(xi, &x0.t),
        Binding::input(wi, &w0.t),
        Binding::output(yi, &y1.m),
    ];
    expect(
        "execute_graph y on GPU 1",
        execute_graph_on(&s0, &g, &bindings),
        "execute_graph",
        "bindings",
        1,
        0,
    );

    assert!(
        failures.is_empty(),
        "{} of {cases} refusals wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // Both GPUs still compute, and agree with the reference and each other.
    let (xv, wv) = (rng.fill(2 * 8 * 10 * 10), rng.fill(16 * 8 * 3 * 3));
    let on0 = conv_checked(&s0, &xv, &wv, "conv on GPU 0 after the refusals");
    let on1 = conv_checked(&s1, &xv, &wv, "conv on GPU 1 after the refusals");
    let diff = cpu::rel_l2_error(&on1, &on0);
    assert!(diff <= bound(DataType::F32), "GPU 0 and GPU 1 differ: {diff:.2e}");
    println!("two devices, engine: {cases} mixed-GPU calls refused; conv after them on both GPUs within {:.0e} (GPU 1 vs GPU 0 {diff:.2e})", bound(DataType::F32));
}

/// Exact round trip of `data` through GPU 0 → GPU 1 → GPU 0 for one kind of tensor.
fn round_trip<T>(
    what: &str,
    data: TensorData,
    make: impl Fn(TensorData, &CudnnDevice) -> T,
    to: impl Fn(T, &CudnnDevice) -> T,
    read: impl Fn(T) -> TensorData,
) -> Result<(), String> {
    let (g0, g1) = (CudnnDevice::new(0), CudnnDevice::new(1));
    let there = to(make(data.clone(), &g0), &g1);
    let on1 = read(to(make(data.clone(), &g0), &g1));
    let back = read(to(there, &g0));
    if on1.as_bytes() != data.as_bytes() || back.as_bytes() != data.as_bytes() {
        return Err(format!("{what}: values changed on the way between the GPUs"));
    }
    Ok(())
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    rng.fill(n).into_iter().map(|v| v as f32).collect()
}

/// A backend call given operands on both GPUs, with the op's name.
type MixedCall<'a> = (&'static str, Box<dyn FnOnce() + 'a>);

/// `f` must panic naming both GPUs.
fn panics_naming_both(what: &str, f: impl FnOnce()) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => Err(format!("{what}: mixed GPUs accepted")),
        Err(p) => {
            let msg = panic_message(&*p);
            if msg.contains("GPU 0") && msg.contains("GPU 1") {
                Ok(())
            } else {
                Err(format!("{what}: panic `{msg}` does not name GPU 0 and GPU 1"))
            }
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_burn_tensors_move_compute_on_each_and_refuse_mixing() {
    two_devices();
    let (g0, g1) = (CudnnDevice::new(0), CudnnDevice::new(1));
    let mut failures: Vec<String> = Vec::new();
    let note = |failures: &mut Vec<String>, r: Result<(), String>| {
        if let Err(e) = r {
            failures.push(e);
        }
    };

    // Round trips of every storage type.
    let mut trips = 0;
    let shape = [3usize, 5];
    let fdata = TensorData::new(vals(15, 1), shape);
    for dt in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        let data = fdata.clone().convert_dtype(dt.into());
        trips += 1;
        note(
            &mut failures,
            round_trip(
                &format!("float {dt:?}"),
                data,
                B::float_from_data,
                B::float_to_device,
                |t| read_sync(B::float_into_data(t)).expect("read"),
            ),
        );
    }
    let idata: Vec<i64> = (0..15).map(|i| i * 7 - 40).collect();
    for dt in [IntDType::I64, IntDType::I32] {
        let data = TensorData::new(idata.clone(), shape).convert_dtype(dt.into());
        trips += 1;
        note(
            &mut failures,
            round_trip(&format!("int {dt:?}"), data, B::int_from_data, B::int_to_device, |t| {
                read_sync(B::int_into_data(t)).expect("read")
            }),
        );
    }
    let bdata = TensorData::new((0..15).map(|i| i % 3 == 0).collect::<Vec<_>>(), shape);
    trips += 1;
    note(
        &mut failures,
        round_trip("bool", bdata, B::bool_from_data, B::bool_to_device, |t| {
            read_sync(B::bool_into_data(t)).expect("read")
        }),
    );

    // Ops on GPU 1 agree with the same ops on GPU 0.
    let conv_on = |d: &CudnnDevice| {
        let x = Tensor::<B, 4>::from_data(TensorData::new(vals(2 * 4 * 9 * 9, 2), [2, 4, 9, 9]), d);
        let w = Tensor::<B, 4>::from_data(TensorData::new(vals(8 * 4 * 3 * 3, 3), [8, 4, 3, 3]), d);
        let y = conv2d(x, w, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1));
        let m = y
            .clone()
            .reshape([16, 81])
            .matmul(Tensor::from_data(TensorData::new(vals(81 * 5, 4), [81, 5]), d));
        (
            y.into_data().to_vec::<f32>().expect("f32"),
            m.into_data().to_vec::<f32>().expect("f32"),
        )
    };
    let (c0, m0) = conv_on(&g0);
    let (c1, m1) = conv_on(&g1);
    let rel = |a: &[f32], b: &[f32]| {
        let (a, b): (Vec<f64>, Vec<f64>) = (
            a.iter().map(|&v| v as f64).collect(),
            b.iter().map(|&v| v as f64).collect(),
        );
        cpu::rel_l2_error(&a, &b)
    };
    let (ec, em) = (rel(&c1, &c0), rel(&m1, &m0));
    if ec > 1e-5 || em > 2e-3 {
        failures.push(format!("GPU 1 vs GPU 0: conv2d {ec:.2e}, matmul {em:.2e}"));
    }

    // Mixed GPUs, straight to the backend (no Burn-level device check).
    let f = |d: &CudnnDevice| B::float_from_data(TensorData::new(vals(15, 5), shape), d);
    let i = |d: &CudnnDevice| B::int_from_data(TensorData::new(idata.clone(), shape), d);
    let m = |d: &CudnnDevice| B::bool_from_data(TensorData::new(vec![true; 15], shape), d);
    let idx = |d: &CudnnDevice| B::int_from_data(TensorData::new(vec![0i64; 15], shape), d);
    let conv = || {
        let x = B::float_from_data(TensorData::new(vals(2 * 4 * 9 * 9, 2), [2, 4, 9, 9]), &g0);
        let w = B::float_from_data(TensorData::new(vals(8 * 4 * 3 * 3, 3), [8, 4, 3, 3]), &g1);
        drop(B::conv2d(x, w, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1)))
    };
    let mixed: Vec<MixedCall> = vec![
        ("float_add", Box::new(|| drop(B::float_add(f(&g0), f(&g1))))),
        (
            "float_matmul",
            Box::new(|| drop(B::float_matmul(f(&g0), B::float_reshape(f(&g1), Shape::new([5, 3]))))),
        ),
        (
            "float_lower",
            Box::new(|| drop(B::float_lower(f(&g1), f(&g0), BoolDType::Native))),
        ),
        (
            "float_mask_where",
            Box::new(|| drop(B::float_mask_where(f(&g0), m(&g1), f(&g0)))),
        ),
        ("float_cat", Box::new(|| drop(B::float_cat(vec![f(&g0), f(&g1)], 0)))),
        ("float_gather", Box::new(|| drop(B::float_gather(1, f(&g0), idx(&g1))))),
        ("int_add", Box::new(|| drop(B::int_add(i(&g0), i(&g1))))),
        ("conv2d", Box::new(conv)),
    ];
    let refusals = mixed.len() + 1;
    for (op, call) in mixed {
        note(&mut failures, panics_naming_both(op, call));
    }
    // Through Burn's tensor API (Burn's own check or ours).
    let burn_mixed = catch_unwind(AssertUnwindSafe(|| {
        let a = Tensor::<B, 2>::from_data(fdata.clone(), &g0);
        let b = Tensor::<B, 2>::from_data(fdata.clone(), &g1);
        drop(a + b)
    }));
    if burn_mixed.is_ok() {
        failures.push("Tensor add across GPUs was accepted".into());
    }

    // Both GPUs still compute after the refusals.
    let (c0b, _) = conv_on(&g0);
    let (c1b, _) = conv_on(&g1);
    if c0b != c0 || rel(&c1b, &c0) > 1e-5 {
        failures.push("results after the refusals differ from before".into());
    }
    let cast: FloatTensor<B> = B::float_cast(f(&g1), FloatDType::F16);
    let back = read_sync(B::float_into_data(B::float_to_device(cast, &g0))).expect("read");
    if back.dtype != burn::tensor::DType::F16 {
        failures.push(format!("an f16 tensor moved to GPU 0 reads back as {:?}", back.dtype));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!(
        "two devices, burn: {trips} round trips exact, conv2d/matmul on GPU 1 match GPU 0 ({ec:.1e}, {em:.1e}), {refusals} mixed-GPU calls refused"
    );
}
