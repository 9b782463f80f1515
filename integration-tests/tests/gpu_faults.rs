//! Faults: with the GPU's memory exhausted, ops fail with an error the caller can catch (or
//! succeed on a plan needing no workspace) — never crash or hang — and after memory is freed
//! the same pool and caches work again. Injected faults (`plan::fault`) check the same for
//! failed plan builds and failed workspace allocations. Needs a CUDA GPU.

use std::sync::{Arc, Mutex, MutexGuard};

use cudnn_backend::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, ConvParams};
use cudnn_backend::plan::fault;
use cudnn_backend::{Device, Error};
use cudnn_backend_reference::{self as cpu, SplitMix64};
use integration_tests::{download, poisoned, random, strides, DevTensor, Layout};

/// The tests run one at a time: the out-of-memory test fills the GPU, which would make the
/// others' allocations fail (faults themselves are armed per thread). They also use a kernel
/// and plan cache of their own: an injected plan-build fault needs a plan that is built, not
/// one an earlier run left in the persistent cache.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    integration_tests::fresh_kernel_cache();
    guard
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_is_an_error_and_the_engine_recovers() {
    let _serial = one_at_a_time();
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
    let outcome = ops::conv_forward(&s, &x.t, &w.t, &y.m, &p);
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
    ops::conv_forward(&s, &x.t, &w.t, &y.m, &p).expect("conv after freeing memory");
    let g = integration_tests::reference_geometry(&p);
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

/// Relative L2 error allowed against the f64 reference (f32 data, TF32 off; f16 data).
fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => 1e-4,
        _ => 1e-2,
    }
}

/// Which convolution a [`ConvCase`] runs.
#[derive(Clone, Copy, Debug)]
enum Pass {
    Forward,
    Data,
    Filter,
}

/// One convolution pass with its inputs, a poisoned output and the f64 reference.
struct ConvCase {
    name: String,
    pass: Pass,
    a: DevTensor,
    b: DevTensor,
    out: DevTensor,
    p: ConvParams,
    reference: Vec<f64>,
}

impl ConvCase {
    /// A case on `x_dims` by `w_dims` (3x3, padding 1) in `dtype` and `layout`.
    fn new(
        s: &Arc<CudaStream>,
        seed: u64,
        pass: Pass,
        xd: [i64; 4],
        wd: [i64; 4],
        dtype: DataType,
        layout: Layout,
    ) -> Self {
        let mut rng = SplitMix64::new(seed);
        let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
        let yd = p.output_dims(&xd, &wd).unwrap();
        let g = integration_tests::reference_geometry(&p);
        let u = |d: &[i64]| d.iter().map(|&v| v as usize).collect::<Vec<_>>();
        let (a, b, out, reference) = match pass {
            Pass::Forward => {
                let x = random(s, &mut rng, &xd, &strides(&xd, layout), dtype);
                let w = random(s, &mut rng, &wd, &strides(&wd, layout), dtype);
                let r = cpu::conv_forward(&x.values, &u(&xd), &w.values, &u(&wd), &g);
                (x, w, poisoned(s, &yd, &strides(&yd, layout), dtype), r)
            }
            Pass::Data => {
                let dy = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
                let w = random(s, &mut rng, &wd, &strides(&wd, layout), dtype);
                let r = cpu::conv_backward_data(&dy.values, &u(&yd), &w.values, &u(&wd), &u(&xd), &g);
                (dy, w, poisoned(s, &xd, &strides(&xd, layout), dtype), r)
            }
            Pass::Filter => {
                let x = random(s, &mut rng, &xd, &strides(&xd, layout), dtype);
                let dy = random(s, &mut rng, &yd, &strides(&yd, layout), dtype);
                let r = cpu::conv_backward_filter(&x.values, &u(&xd), &dy.values, &u(&yd), &u(&wd), &g);
                (x, dy, poisoned(s, &wd, &strides(&wd, layout), dtype), r)
            }
        };
        s.synchronize().unwrap();
        Self {
            name: format!("{pass:?} x{xd:?} w{wd:?} {dtype:?} {layout:?}"),
            pass,
            a,
            b,
            out,
            p,
            reference,
        }
    }

    /// Zeroes the output (so a run that writes nothing shows) and runs the pass on `s`.
    fn run(&mut self, s: &Arc<CudaStream>) -> cudnn_backend::Result<()> {
        s.memset_zeros(&mut self.out.buf).expect("clear the output");
        let (a, b, o) = (&self.a.t, &self.b.t, &self.out.m);
        match self.pass {
            Pass::Forward => ops::conv_forward(s, a, b, o, &self.p),
            Pass::Data => ops::conv_backward_data(s, a, b, o, &self.p),
            Pass::Filter => ops::conv_backward_filter(s, a, b, o, &self.p),
        }
    }

    /// Relative L2 error of the output against the reference (synchronizes).
    fn error(&self, s: &Arc<CudaStream>) -> f64 {
        cpu::rel_l2_error(&download(s, &self.out), &self.reference)
    }

    /// Runs without faults and asserts the result is right.
    fn assert_works(&mut self, s: &Arc<CudaStream>, when: &str) {
        self.run(s).unwrap_or_else(|e| panic!("{}: {when}: {e}", self.name));
        let err = self.error(s);
        let tol = tolerance(self.out.t.dtype());
        assert!(err <= tol, "{}: {when}: rel L2 error {err:.2e} > {tol:.0e}", self.name);
    }
}

/// Plan-build faults injected on this thread since `before`.
fn builds_since(before: (usize, usize)) -> usize {
    fault::injected().0 - before.0
}

/// Workspace-allocation faults injected on this thread since `before`.
fn allocs_since(before: (usize, usize)) -> usize {
    fault::injected().1 - before.1
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_failed_plan_build_falls_through_to_the_next_engine_and_never_poisons_the_cache() {
    let _serial = one_at_a_time();
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let s = dev.context().new_stream().unwrap();
    // Shapes no other test uses, so the first call builds plans; channels multiples of 8 and
    // a dtype cuDNN's engines take in every library configuration.
    let (x1, w1) = ([3, 24, 21, 21], [16, 24, 3, 3]);
    let (x2, w2) = ([2, 32, 19, 19], [16, 32, 3, 3]);
    let (dt, layout) = integration_tests::cudnn_conv_dtype();

    // The first engine fails to build: the next one runs, and the result is right.
    let mut one = ConvCase::new(&s, 11, Pass::Forward, x1, w1, dt, layout);
    let before = fault::injected();
    fault::fail_next_plan_builds(1);
    let outcome = one.run(&s);
    fault::disarm();
    let first_fault = builds_since(before);
    println!("faults: first engine's plan build failed -> {outcome:?} ({first_fault} fault injected)");
    assert_eq!(first_fault, 1, "the plan build fault did not fire");
    outcome.unwrap_or_else(|e| panic!("{}: no engine after the first ran: {e}", one.name));
    let err = one.error(&s);
    println!("faults: result on the next engine: rel L2 error {err:.2e}");
    assert!(err <= tolerance(dt), "wrong result on the next engine: {err:.2e}");
    // A fault-free repeat (cached plan) gives the same bits.
    let first_bits = download(&s, &one.out);
    one.assert_works(&s, "fault-free repeat");
    assert_eq!(
        download(&s, &one.out),
        first_bits,
        "the repeat differs from the run with a fault"
    );

    // Every engine fails to build: a typed error, not remembered as "unsupported".
    let mut all = ConvCase::new(&s, 12, Pass::Forward, x2, w2, dt, Layout::Nhwc);
    let before = fault::injected();
    fault::fail_next_plan_builds(100_000);
    let outcome = all.run(&s);
    fault::disarm();
    let all_faults = builds_since(before);
    println!("faults: every plan build failed ({all_faults} faults injected) -> {outcome:?}");
    assert!(all_faults >= 1, "no plan build fault fired");
    match &outcome {
        Err(Error::Cudnn { status, .. }) => assert_eq!(*status, fault::INJECTED_BUILD_STATUS),
        other => panic!("expected the build failure as Error::Cudnn, got {other:?}"),
    }
    // The same op now builds and runs: neither a failed plan nor "unsupported" was cached.
    all.assert_works(&s, "after every engine failed once");
    // Same from another thread (another pooled handle, the shared choice cache).
    std::thread::scope(|t| {
        t.spawn(|| {
            let all = &mut all;
            let s2 = dev.context().new_stream().unwrap();
            all.run(&s2).expect("conv on another thread after the faults");
            s2.synchronize().unwrap();
        });
    });
    println!(
        "faults: plan builds: {} faults injected in all",
        first_fault + all_faults
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_failed_workspace_allocation_falls_back_to_a_smaller_plan_or_a_typed_error() {
    let _serial = one_at_a_time();
    let dev = Device::new(0).expect("needs a CUDA GPU");
    // Passes whose plans usually need workspace (filter gradients, large f16 channels-last).
    // The f32 cases take the dtype that runs on a cuDNN engine in this library configuration
    // (under GRAPH_JIT_ONLY f32 convolutions run in the backend's direct kernels, which take
    // no workspace), and the two larger cases give the runtime-compiled engines reason to
    // split their reductions.
    let (dt, lay) = integration_tests::cudnn_conv_dtype();
    let cases = [
        (Pass::Filter, [8, 32, 30, 30], [32, 32, 3, 3], dt, lay),
        (
            Pass::Forward,
            [16, 64, 26, 26],
            [64, 64, 3, 3],
            DataType::F16,
            Layout::Nhwc,
        ),
        (Pass::Data, [8, 48, 22, 22], [40, 48, 3, 3], dt, lay),
        (
            Pass::Filter,
            [16, 64, 18, 18],
            [64, 64, 3, 3],
            DataType::F16,
            Layout::Nhwc,
        ),
        (Pass::Filter, [16, 128, 28, 28], [128, 128, 3, 3], dt, lay),
        (Pass::Data, [16, 128, 28, 28], [128, 128, 3, 3], dt, lay),
    ];
    let mut injected = 0;
    for (i, &(pass, xd, wd, dtype, layout)) in cases.iter().enumerate() {
        // The first allocation fails: it is tried again after the cached memory is released,
        // and the plan keeps its engine (so its results do not change). A fresh stream's
        // workspace slot is empty, so a plan needing workspace has to allocate.
        let s = dev.context().new_stream().unwrap();
        let mut case = ConvCase::new(&s, 30 + i as u64, pass, xd, wd, dtype, layout);
        let switches = cudnn_backend::runtime::launch_counts().engine_switches;
        let (once, once_faults) = run_with_alloc_faults(&mut case, &s, 1, "after a failed workspace allocation");
        assert!(once.is_ok(), "{}: one failed allocation: {once:?}", case.name);
        assert_eq!(
            cudnn_backend::runtime::launch_counts().engine_switches,
            switches,
            "{}: one failed allocation moved the graph to another engine",
            case.name
        );
        // Every allocation fails: only a plan without workspace can run (the graph moves to
        // it); otherwise a typed out-of-memory error.
        let s = dev.context().new_stream().unwrap();
        let (always, always_faults) = run_with_alloc_faults(&mut case, &s, 100_000, "without workspace");
        // Afterwards the op works again, on both streams' fresh slots.
        case.assert_works(&s, "after the workspace faults");
        let s = dev.context().new_stream().unwrap();
        case.assert_works(&s, "after the workspace faults, fresh stream");
        println!(
            "faults: {}: one failed allocation ({once_faults} injected) -> {}; all failing ({always_faults} injected) -> {}",
            case.name,
            describe(&once),
            describe(&always)
        );
        injected += once_faults + always_faults;
    }
    println!("faults: workspace allocations: {injected} faults injected in all");
    assert!(
        injected > 0,
        "no case's plan needed workspace, so no allocation fault fired: pick larger cases"
    );
}

/// Runs `case` on `s` with the next `count` workspace allocations failing: it must give the
/// right result or a typed out-of-memory error. Returns the outcome and the faults injected.
fn run_with_alloc_faults(
    case: &mut ConvCase,
    s: &Arc<CudaStream>,
    count: usize,
    what: &str,
) -> (cudnn_backend::Result<()>, usize) {
    let before = fault::injected();
    fault::fail_next_workspace_allocs(count);
    let outcome = case.run(s);
    fault::disarm();
    let faults = allocs_since(before);
    match &outcome {
        Ok(()) => {
            let err = case.error(s);
            let tol = tolerance(case.out.t.dtype());
            assert!(err <= tol, "{}: wrong result {what}: {err:.2e}", case.name);
        }
        Err(Error::OutOfMemory { .. }) => {}
        Err(e) => panic!("{}: {what} got {e} (expected the result or OutOfMemory)", case.name),
    }
    (outcome, faults)
}

fn describe(r: &cudnn_backend::Result<()>) -> String {
    match r {
        Ok(()) => "ok, right result".into(),
        Err(e) => format!("error: {e}"),
    }
}
