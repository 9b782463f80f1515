//! Example programs live in this package; see the `[[example]]` targets. This library holds
//! what the training examples share.

/// A fingerprint of a model's parameters, so two training runs can be compared bit for bit
/// (the deterministic mode's check: `CUDNN_BACKEND_MODE=deterministic`, same seed, same data).
pub mod digest {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::backend::Backend;
    use burn::tensor::{Bool, Int, Tensor, TensorData};

    /// FNV-1a (64-bit) over every parameter's values (float, int and bool tensors, in the
    /// module's visiting order, as stored: dtype and bytes). Parameter ids, which Burn draws
    /// afresh in every process, are left out.
    #[derive(Default)]
    struct Fnv {
        hash: Option<u64>,
        bytes: usize,
        /// Only the float parameters that take gradients (no running statistics).
        trainable_only: bool,
    }

    impl Fnv {
        /// Hashes a dtype tag, then the value bytes.
        fn add_bytes(&mut self, tag: &str, bytes: &[u8]) {
            let mut h = self.hash.unwrap_or(0xcbf2_9ce4_8422_2325);
            for &b in tag.as_bytes().iter().chain(bytes) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            self.bytes += bytes.len();
            self.hash = Some(h);
        }

        fn add(&mut self, data: TensorData) {
            self.add_bytes(&format!("{:?}", data.dtype), data.as_bytes());
        }

        fn finish(self) -> Result<String, String> {
            let hash = self.hash.ok_or("the model has no parameters")?;
            Ok(format!("{hash:016x} ({} bytes)", self.bytes))
        }
    }

    impl<B: Backend> ModuleVisitor<B> for Fnv {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if !self.trainable_only || value.is_require_grad() {
                self.add(value.into_data());
            }
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            if !self.trainable_only {
                self.add(param.val().into_data());
            }
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            if !self.trainable_only {
                self.add(param.val().into_data());
            }
        }
    }

    fn digest<B: Backend, M: Module<B>>(model: &M, trainable_only: bool) -> Result<String, String> {
        let mut v = Fnv {
            trainable_only,
            ..Fnv::default()
        };
        model.visit(&mut v);
        v.finish()
    }

    /// The digest of `model`'s parameter values (running statistics included), with the
    /// number of bytes hashed.
    pub fn parameters<B: Backend, M: Module<B>>(model: &M) -> Result<String, String> {
        digest(model, false)
    }

    /// The digest of the float parameters that take gradients (on an autodiff backend), without
    /// running statistics: what data-parallel replicas share exactly (each replica's batch
    /// norm tracks the statistics of its own shard).
    pub fn trainable_parameters<B: Backend, M: Module<B>>(model: &M) -> Result<String, String> {
        digest(model, true)
    }

    /// The digest of every variable of a Candle `VarMap` (running statistics included), in
    /// name order (a `VarMap`'s own order is its hash map's): each name, dtype and values.
    #[cfg(feature = "candle")]
    pub fn candle_variables(varmap: &candle_nn::VarMap) -> Result<String, String> {
        let data = varmap.data().lock().map_err(|_| "the VarMap's lock is poisoned")?;
        let mut named: Vec<_> = data.iter().collect();
        named.sort_by(|a, b| a.0.cmp(b.0));
        let mut v = Fnv::default();
        for (name, var) in named {
            let t = var.as_tensor();
            // f32 holds every f16/bf16 value exactly: the bits stay a faithful fingerprint.
            let values: Vec<f32> = t
                .flatten_all()
                .and_then(|f| f.to_dtype(candle_core::DType::F32))
                .and_then(|f| f.to_vec1())
                .map_err(|e| format!("{name}: {e}"))?;
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
            v.add_bytes(&format!("{name} {:?}", t.dtype()), &bytes);
        }
        v.finish()
    }
}

/// Per-epoch training curves: what train_burn and train_candle record and plot.
pub mod curves {
    /// Per-epoch history.
    #[derive(Default)]
    pub struct History {
        /// Mean training loss of each epoch.
        pub loss: Vec<f64>,
        /// Test accuracy (0-1) after each epoch.
        pub accuracy: Vec<f64>,
    }

    impl History {
        /// Records epoch `epoch`; an error when its mean loss is not finite (training diverged).
        pub fn push_epoch(&mut self, epoch: usize, loss: f64, accuracy: f64) -> Result<(), String> {
            if !loss.is_finite() {
                return Err(format!("epoch {epoch}: the training loss is {loss}"));
            }
            self.loss.push(loss);
            self.accuracy.push(accuracy);
            Ok(())
        }
    }

    /// The progress bar of epoch `epoch` of `epochs`, `steps` steps long.
    pub fn epoch_bar(steps: usize, epoch: usize, epochs: usize) -> Result<indicatif::ProgressBar, String> {
        let style =
            indicatif::ProgressStyle::with_template("epoch {msg} [{bar:40}] {pos}/{len} steps, {per_sec}, eta {eta}")
                .map_err(|e| e.to_string())?
                .progress_chars("=> ");
        let bar = indicatif::ProgressBar::new(steps as u64).with_style(style);
        bar.set_message(format!("{epoch}/{epochs}"));
        Ok(bar)
    }

    /// Ends an epoch's bar with `summary`, also printed as a line when no terminal shows the
    /// bar (a log file).
    pub fn finish_epoch(bar: &indicatif::ProgressBar, summary: String) {
        if bar.is_hidden() {
            println!("epoch {summary}");
        }
        bar.finish_with_message(summary);
    }

    /// Writes the checkpoint `save` makes at `out/file` and the curves at `out/curves.png`,
    /// and prints both paths.
    pub fn save_run(
        out: &std::path::Path,
        file: &str,
        history: &History,
        save: impl FnOnce(&std::path::Path) -> Result<(), String>,
    ) -> Result<(), String> {
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let checkpoint = out.join(file);
        save(&checkpoint).map_err(|e| format!("saving {}: {e}", checkpoint.display()))?;
        let png = out.join("curves.png");
        plot(history, &png)?;
        println!("checkpoint: {}, curves: {}", checkpoint.display(), png.display());
        Ok(())
    }

    /// Two panels: mean training loss and test accuracy per epoch.
    pub fn plot(h: &History, path: &std::path::Path) -> Result<(), String> {
        use plotters::prelude::*;
        let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
        let root = BitMapBackend::new(path, (800, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (left, right) = root.split_horizontally(400);
        let epochs = h.loss.len().max(2) as f64;
        for (area, values, color, top) in [
            (&left, &h.loss, RED, h.loss.iter().cloned().fold(0.0, f64::max) * 1.1),
            (&right, &h.accuracy, BLUE, 1.0),
        ] {
            let mut chart = ChartBuilder::on(area)
                .margin(20)
                .build_cartesian_2d(1.0..epochs, 0.0..top.max(1e-6) * 1.02)
                .map_err(|e| err(&e))?;
            // Text needs a font backend, which this build leaves out: a frame and quarter lines
            // stand in for the axes (left panel: loss from 0 to 1.1x its maximum; right: accuracy 0-1).
            let top = top.max(1e-6);
            for q in 0..=4 {
                let y = top * q as f64 / 4.0;
                let style = if q == 0 || q == 4 {
                    BLACK.stroke_width(2)
                } else {
                    BLACK.mix(0.2).stroke_width(1)
                };
                chart
                    .draw_series(LineSeries::new([(1.0, y), (epochs, y)], style))
                    .map_err(|e| err(&e))?;
            }
            for x in [1.0, epochs] {
                chart
                    .draw_series(LineSeries::new([(x, 0.0), (x, top)], BLACK.stroke_width(2)))
                    .map_err(|e| err(&e))?;
            }
            let points = || values.iter().enumerate().map(|(i, &v)| (i as f64 + 1.0, v));
            chart
                .draw_series(LineSeries::new(points(), color.stroke_width(3)))
                .map_err(|e| err(&e))?;
            chart
                .draw_series(points().map(|p| Circle::new(p, 5, color.filled())))
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))
    }
}

/// Start-up figures the training examples print after their first step.
pub mod startup {
    use std::time::Instant;

    /// `first step: … s after start`, then the kernel loader's and cuDNN's start-up costs.
    pub fn report(started: Instant) -> String {
        let k = cudnn_backend::kernels::compile_stats();
        let p = cudnn_backend::plan::stats();
        let r = cudnn_backend::plan::serialized_plan_counts();
        format!(
            "first step: {:.2} s after start\nkernels: {} compiled ({} alongside others, {:.0} ms NVRTC summed over \
             threads), {} from the disk cache ({:.0} ms loading)\ncudnn: {} plans built in {:.0} ms, {} restored from \
             the disk cache, {} stored",
            started.elapsed().as_secs_f64(),
            k.compiled,
            k.prefetched,
            k.compile_ms,
            k.disk_hits,
            k.load_ms,
            p.choice_builds,
            p.build_time_ns as f64 / 1e6,
            r.restored,
            r.stored
        ) + &build_timeline()
    }

    /// cuDNN executions served by a captured CUDA graph so far (replays, and the launch that
    /// follows each capture), from the engine's plan statistics.
    pub fn graph_replays() -> u64 {
        let s = cudnn_backend::plan::stats();
        s.replay_launches + s.replay_captures
    }

    /// `launches per step: …`: this crate's kernels and cuDNN executions per step of
    /// `launches` (counted over `steps` steps; `replays` of the executions from captured
    /// graphs), the fused runs that ran unfused, and the host time in each kind of work.
    pub fn launches_per_step(launches: &cudnn_backend::runtime::LaunchCounts, replays: u64, steps: usize) -> String {
        let per = |n: u64| n as f64 / steps.max(1) as f64;
        format!(
            "launches per step: {:.0} kernels, {:.0} cuDNN executions ({:.0} replayed as CUDA graphs); \
             fused runs run unfused: {:.1}; \
             host ms per step in fused runs {:.2}, in cuDNN executions {:.2}, in kernel launches {:.2}, \
             in allocations and frees {:.2}",
            per(launches.kernels),
            per(launches.cudnn_executions),
            per(replays),
            per(launches.fused_fallbacks),
            per(launches.fused_ns) * 1e-6,
            per(launches.cudnn_ns) * 1e-6,
            per(launches.launch_ns) * 1e-6,
            per(launches.memory_ns) * 1e-6
        )
    }

    /// [`launches_per_step`], then `fusion server thread: … ms CPU per step`: the CPU time of
    /// burn-fusion's device server threads since `before` (a
    /// [`crate::host_profile::thread_times`] snapshot taken with the launch counts and
    /// [`graph_replays`]), per step.
    pub fn epoch_host_report(
        launches: &cudnn_backend::runtime::LaunchCounts,
        replays: u64,
        before: &[crate::host_profile::ThreadTimes],
        steps: usize,
    ) -> String {
        let cpu = crate::host_profile::cpu_s_of(before, &crate::host_profile::thread_times(), "DS");
        format!(
            "{}\nfusion server thread: {:.2} ms CPU per step",
            launches_per_step(launches, replays, steps),
            cpu * 1e3 / steps.max(1) as f64
        )
    }

    /// `first step: … s after start` alone: for a backend other than ours (`--backend
    /// burn-cuda`), whose compiles and autotuning this crate's counters do not see.
    pub fn first_step(started: Instant) -> String {
        format!("first step: {:.2} s after start", started.elapsed().as_secs_f64())
    }

    /// With `CUDNN_BACKEND_BUILD_TRACE` set: the time the main thread waited on builds, and
    /// every compile, wait and plan build of the start-up (one line each, by start time).
    fn build_timeline() -> String {
        use cudnn_backend::runtime::{build_events, thread_ms, BuildKind};
        if std::env::var_os("CUDNN_BACKEND_BUILD_TRACE").is_none() {
            return String::new();
        }
        let mut events = build_events();
        events.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        let mut out = format!(
            "\nmain thread waited: {:.0} ms for kernels, {:.0} ms building plans, {:.0} ms for speculative plans",
            thread_ms(&events, BuildKind::KernelWait, "main"),
            thread_ms(&events, BuildKind::PlanBuild, "main"),
            thread_ms(&events, BuildKind::PlanWait, "main"),
        );
        for e in &events {
            out += &format!(
                "\n  {:>8.1} ms +{:>7.1} ms {:<14} {:<28} {}",
                e.start_ms,
                e.ms,
                format!("{:?}", e.kind),
                e.thread,
                e.label
            );
        }
        out
    }
}

/// What the Burn training examples share on the command line and at start-up.
pub mod cli {
    use burn::tensor::backend::set_default_float_dtype;
    use burn::tensor::FloatDType;
    use cudnn_backend::burn::{Cudnn, CudnnDevice};

    /// `--device gpu|cuda|cpu` as "use the GPU".
    pub fn parse_device(value: &str) -> Result<bool, String> {
        match value {
            "gpu" | "cuda" => Ok(true),
            "cpu" => Ok(false),
            other => Err(format!("--device {other}: use gpu or cpu")),
        }
    }

    /// `--backend ours|burn-cuda`: which backend trains the model.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum BackendChoice {
        /// This crate's `Cudnn` (`CudnnFusion` with `--fusion`; Burn's ndarray on the CPU).
        #[default]
        Ours,
        /// Burn's own CUDA backend (burn-cuda with burn-fusion and autotuning, kernels from
        /// CubeCL compiled by NVRTC at run time): the examples built with `--features burn-cuda`.
        BurnCuda,
    }

    impl BackendChoice {
        /// Whether this crate's launch counters see the training's kernels (not on burn-cuda).
        pub fn counts_launches(self) -> bool {
            self == Self::Ours
        }
    }

    /// `--backend ours|burn-cuda` (`cudnn` is accepted for `ours`).
    pub fn parse_backend(value: &str) -> Result<BackendChoice, String> {
        match value {
            "ours" | "cudnn" => Ok(BackendChoice::Ours),
            "burn-cuda" => Ok(BackendChoice::BurnCuda),
            other => Err(format!("--backend {other}: use ours or burn-cuda")),
        }
    }

    /// The flags `--backend burn-cuda` cannot take with it, as an error message: it trains
    /// Burn's own modules (`--stock`; the fused drop-ins are this crate's and run on ours), is
    /// fused already (no `--fusion`, which selects `CudnnFusion`) and runs on the GPU.
    pub fn burn_cuda_flag_conflict(device: Option<bool>, stock: bool, fusion: bool) -> Option<&'static str> {
        if !stock {
            Some(
                "--backend burn-cuda trains Burn's own modules and Adam: add --stock (the fused drop-in \
                 modules and FusedAdam run on this crate's backend only)",
            )
        } else if fusion {
            Some("--fusion selects this crate's CudnnFusion; burn-cuda runs burn-fusion already: drop --fusion")
        } else if device == Some(false) {
            Some("--backend burn-cuda runs on the GPU: drop --device cpu")
        } else {
            None
        }
    }

    /// Burn's CUDA backend as the `burn-cuda` feature builds it: `Fusion<CubeBackend<CudaRuntime>>`
    /// (burn's `fusion` feature makes `burn::backend::Cuda` the fused one), autotuned.
    #[cfg(feature = "burn-cuda")]
    pub type BurnCuda = burn::backend::Cuda;

    /// GPU 0 for `--backend burn-cuda`, with `dtype` as its default float dtype. CubeCL's CUDA
    /// runtime panics on a machine without the driver (cudarc `unwrap`s) and on its first kernel
    /// compile without NVRTC or a CUDA toolkit folder (it passes `<toolkit>/include` to NVRTC,
    /// and its kernels include `cuda_runtime.h`), so these are checked first: exits with status
    /// 2 and the reason when one is missing, and warns when the toolkit has no headers.
    #[cfg(feature = "burn-cuda")]
    pub fn burn_cuda_device(program: &str, dtype: FloatDType) -> burn::backend::cuda::CudaDevice {
        fn fail(program: &str, e: &dyn std::fmt::Display) -> ! {
            eprintln!("{program}: --backend burn-cuda, but {e}");
            std::process::exit(2);
        }
        if let Err(e) = cudnn_backend::runtime::device_count() {
            fail(program, &e);
        }
        if let Err(e) = cudnn_backend::runtime::check_nvrtc() {
            fail(program, &e);
        }
        match cuda_toolkit() {
            None => fail(
                program,
                &"burn-cuda compiles its kernels with NVRTC against a CUDA toolkit's headers and found none \
                  (CUDA_PATH, /usr/local/cuda, /opt/cuda or nvcc in /usr/bin): set CUDA_PATH",
            ),
            Some(root) if !root.join("include/cuda_runtime.h").exists() => eprintln!(
                "{program}: warning: {} has no include/cuda_runtime.h, which burn-cuda's kernels include; \
                 set CUDA_PATH to a CUDA toolkit if kernel compiles fail",
                root.display()
            ),
            Some(_) => {}
        }
        let device = burn::backend::cuda::CudaDevice::default();
        if dtype != FloatDType::F32 {
            if let Err(e) = set_default_float_dtype::<BurnCuda>(&device, dtype) {
                eprintln!("{program}: --backend burn-cuda --dtype {dtype:?}: {e:?}");
                std::process::exit(2);
            }
        }
        device
    }

    /// The CUDA toolkit folder CubeCL's CUDA runtime uses (cubecl-cuda 0.10's `cuda_path`):
    /// `CUDA_PATH`, else `/usr/local/cuda`, `/opt/cuda`, or `/usr` when `/usr/bin/nvcc` exists.
    #[cfg(feature = "burn-cuda")]
    fn cuda_toolkit() -> Option<std::path::PathBuf> {
        use std::path::{Path, PathBuf};
        if let Some(path) = std::env::var_os("CUDA_PATH") {
            return Some(PathBuf::from(path));
        }
        [
            ("/usr/local/cuda", "/usr/local/cuda"),
            ("/opt/cuda", "/opt/cuda"),
            ("/usr/bin/nvcc", "/usr"),
        ]
        .into_iter()
        .find(|(probe, _)| Path::new(probe).exists())
        .map(|(_, root)| PathBuf::from(root))
    }

    /// `--backend burn-cuda` in a build without the `burn-cuda` feature: exits with status 2.
    pub fn burn_cuda_missing(program: &str) -> ! {
        eprintln!(
            "{program}: --backend burn-cuda needs the examples built with `--features burn-cuda` \
             (cargo build --release -p examples --features burn-cuda --example {program})"
        );
        std::process::exit(2);
    }

    /// `--dtype f32|f16|bf16`.
    pub fn parse_dtype(value: &str) -> Result<FloatDType, String> {
        match value {
            "f32" => Ok(FloatDType::F32),
            "f16" => Ok(FloatDType::F16),
            "bf16" => Ok(FloatDType::BF16),
            other => Err(format!("--dtype {other}: use f32, f16 or bf16")),
        }
    }

    /// `--dtype f32|f16|bf16` as a Candle dtype (the Candle examples).
    #[cfg(feature = "candle")]
    pub fn parse_candle_dtype(value: &str) -> Result<candle_core::DType, String> {
        Ok(match parse_dtype(value)? {
            FloatDType::F16 => candle_core::DType::F16,
            FloatDType::BF16 => candle_core::DType::BF16,
            _ => candle_core::DType::F32,
        })
    }

    /// Whether `program` trains on the GPU: as asked (`--device`), else when one is usable.
    /// Exits with status 2 when the GPU was asked for and cannot be used, and sets the default
    /// float dtype of the GPU device; the CPU backend takes f32 only.
    pub fn use_gpu(program: &str, asked: Option<bool>, device: &CudnnDevice, dtype: FloatDType) -> bool {
        let gpu = match (asked, device.try_open()) {
            (Some(false), _) => false,
            (_, Ok(_)) => true,
            (Some(true), Err(e)) => {
                eprintln!("{program}: --device gpu, but {e}");
                std::process::exit(2);
            }
            (None, Err(e)) => {
                println!("note: no usable GPU ({e}); training on Burn's ndarray CPU backend");
                false
            }
        };
        if dtype != FloatDType::F32 {
            if !gpu {
                eprintln!("{program}: the CPU backend trains in f32 only");
                std::process::exit(2);
            }
            if let Err(e) = set_default_float_dtype::<Cudnn>(device, dtype) {
                eprintln!("{program}: --dtype {dtype:?}: {e:?}");
                std::process::exit(2);
            }
        }
        gpu
    }

    /// Writes the engine's kernel launch events ([`cudnn_backend::kernels::LAUNCH_LOG_TARGET`],
    /// debug level) to `path`, one line each, for the rest of the process (`--kernel-log FILE`).
    pub fn kernel_log(path: &str) -> Result<(), String> {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::Layer as _;
        let file = std::fs::File::create(path).map_err(|e| format!("--kernel-log {path}: {e}"))?;
        let targets = tracing_subscriber::filter::Targets::new()
            .with_target(cudnn_backend::kernels::LAUNCH_LOG_TARGET, tracing::Level::DEBUG);
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .without_time()
            .with_level(false)
            .with_target(false);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer.with_filter(targets)))
            .map_err(|e| format!("--kernel-log {path}: {e}"))
    }
}

/// `--host-profile FILE`: where the host (CPU) time of the timed training steps goes, from a
/// sampling profiler (feature `host-profile`), written as text tables of the hottest functions.
pub mod host_profile {
    /// A running profile; [`Session::finish`] writes the tables.
    pub struct Session {
        // Declared (and so dropped) before the guard: no timer may fire once pprof's signal
        // handler is gone, whether the session finishes or is dropped on an error.
        #[cfg(feature = "host-profile")]
        timers: thread_timers::ThreadTimers,
        #[cfg(feature = "host-profile")]
        guard: pprof::ProfilerGuard<'static>,
        path: std::path::PathBuf,
        started: std::time::Instant,
        threads_at_start: Vec<ThreadTimes>,
    }

    /// One thread's accumulated times, read from `/proc/self/task` (Linux).
    #[derive(Clone, Debug, PartialEq)]
    pub struct ThreadTimes {
        /// Thread id.
        pub tid: u32,
        /// Thread name.
        pub name: String,
        /// Seconds on a CPU (scheduler statistics where the kernel keeps them, else clock ticks).
        pub cpu_s: f64,
        /// Times the thread left the CPU to wait (a lock, a sleep, a blocking call).
        pub voluntary_switches: u64,
    }

    /// The times of every thread of this process (empty where `/proc` is not readable).
    pub fn thread_times() -> Vec<ThreadTimes> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        let mut out: Vec<ThreadTimes> = tasks
            .flatten()
            .filter_map(|task| {
                let tid = task.file_name().to_str()?.parse().ok()?;
                let dir = task.path();
                let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
                let name = read("comm")?.trim().to_owned();
                let cpu_s = read("schedstat")
                    .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
                    .map(|ns| ns * 1e-9)
                    .or_else(|| cpu_ticks_of_stat(&read("stat")?).map(|t| t as f64 / 100.0))?;
                let voluntary_switches = read("status")
                    .and_then(|s| {
                        s.lines()
                            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                            .and_then(|v| v.trim().parse().ok())
                    })
                    .unwrap_or(0);
                Some(ThreadTimes {
                    tid,
                    name,
                    cpu_s,
                    voluntary_switches,
                })
            })
            .collect();
        out.sort_by_key(|t| t.tid);
        out
    }

    /// `utime + stime` (clock ticks) of a `/proc/.../stat` line; the name field may hold spaces.
    pub fn cpu_ticks_of_stat(stat: &str) -> Option<u64> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3 of the line, utime 14 and stime 15.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(utime + stime)
    }

    /// CPU seconds of the threads named `prefix…` between two [`thread_times`] snapshots
    /// (burn-fusion's device server threads are `DS…`).
    pub fn cpu_s_of(before: &[ThreadTimes], after: &[ThreadTimes], prefix: &str) -> f64 {
        after
            .iter()
            .filter(|t| t.name.starts_with(prefix))
            .map(|t| since(before, t).0)
            .sum()
    }

    /// `t`'s CPU seconds and voluntary waits since its entry in `before` (all of them when it
    /// started later).
    fn since(before: &[ThreadTimes], t: &ThreadTimes) -> (f64, u64) {
        let (cpu0, waits0) = before
            .iter()
            .find(|b| b.tid == t.tid)
            .map_or((0.0, 0), |b| (b.cpu_s, b.voluntary_switches));
        (t.cpu_s - cpu0, t.voluntary_switches.saturating_sub(waits0))
    }

    /// A table of each thread's CPU time over `wall_s` between two [`thread_times`] snapshots.
    pub fn thread_table(before: &[ThreadTimes], after: &[ThreadTimes], wall_s: f64) -> String {
        let mut out = format!("\n## thread CPU time over {wall_s:.3} s of wall time\n");
        for t in after {
            let (cpu, waits) = since(before, t);
            if cpu <= 0.0 {
                continue;
            }
            out.push_str(&format!(
                "{:6.1}% {:9.3} s {:9} waits  {} ({})\n",
                100.0 * cpu / wall_s.max(1e-9),
                cpu,
                waits,
                t.name,
                t.tid
            ));
        }
        out
    }

    /// Samples per second of CPU time asked of each thread's timer. Linux checks CPU-time
    /// timers once per kernel tick, so a thread gets at most one sample per tick (250 per
    /// second on a 250 Hz kernel), whatever is asked here.
    #[cfg(feature = "host-profile")]
    const FREQUENCY: i32 = 2000;

    /// Comma-separated thread-name prefixes: only the threads whose name starts with one of
    /// them are sampled (all threads when unset). Timers of several busy threads fire on the
    /// same tick and pprof keeps one of the colliding samples, so a thread sampled alone (for
    /// burn-fusion's server thread, `DS`) gets every tick's sample.
    pub const THREADS_ENV: &str = "HOST_PROFILE_THREADS";

    /// The ids of the `threads` whose names start with one of the comma-separated
    /// `prefixes` (all of them for `None` or an empty list).
    pub fn sampled_tids(threads: &[ThreadTimes], prefixes: Option<&str>) -> Vec<i32> {
        let prefixes: Vec<&str> = prefixes
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        threads
            .iter()
            .filter(|t| prefixes.is_empty() || prefixes.iter().any(|p| t.name.starts_with(p)))
            .map(|t| t.tid as i32)
            .collect()
    }

    impl Session {
        /// Starts sampling the process's threads: those [`THREADS_ENV`] names, or all of them.
        #[cfg(feature = "host-profile")]
        pub fn start(path: &std::path::Path) -> Result<Self, String> {
            // Samples that land in these libraries are dropped (unwinding from some of them is
            // unreliable); `HOST_PROFILE_BLOCKLIST=vdso` also keeps the samples taken inside
            // libc, such as driver system calls.
            let blocklist =
                std::env::var("HOST_PROFILE_BLOCKLIST").unwrap_or_else(|_| "libc,libgcc,pthread,vdso".into());
            let blocklist: Vec<&str> = blocklist.split(',').filter(|s| !s.is_empty()).collect();
            // pprof's own process-wide timer sends nearly all its signals to the main thread;
            // it runs at 1 Hz here and one CPU-time timer per thread takes the samples.
            let guard = pprof::ProfilerGuardBuilder::default()
                .frequency(1)
                .blocklist(&blocklist)
                .build()
                .map_err(|e| format!("--host-profile: {e}"))?;
            let threads_at_start = thread_times();
            let only = std::env::var(THREADS_ENV).ok();
            let tids = sampled_tids(&threads_at_start, only.as_deref());
            if tids.is_empty() {
                return Err(format!(
                    "--host-profile: no thread's name starts with {THREADS_ENV}={}",
                    only.unwrap_or_default()
                ));
            }
            let timers = thread_timers::ThreadTimers::start(&tids, FREQUENCY)?;
            Ok(Self {
                timers,
                guard,
                path: path.to_owned(),
                started: std::time::Instant::now(),
                threads_at_start,
            })
        }

        /// Without the `host-profile` feature there is no profiler to start.
        #[cfg(not(feature = "host-profile"))]
        pub fn start(path: &std::path::Path) -> Result<Self, String> {
            let _ = path;
            Err("--host-profile needs the examples built with `--features host-profile`".into())
        }

        /// Stops sampling and writes the tables to the file given to [`Session::start`].
        #[cfg_attr(not(feature = "host-profile"), allow(unused_mut))]
        pub fn finish(mut self) -> Result<(), String> {
            #[cfg(feature = "host-profile")]
            self.timers.stop();
            let wall_s = self.started.elapsed().as_secs_f64();
            let threads = thread_table(&self.threads_at_start, &thread_times(), wall_s);
            let text = self.tables()? + &threads;
            std::fs::write(&self.path, text).map_err(|e| format!("{}: {e}", self.path.display()))
        }

        #[cfg(not(feature = "host-profile"))]
        fn tables(&self) -> Result<String, String> {
            Err("--host-profile needs the `host-profile` feature".into())
        }

        #[cfg(feature = "host-profile")]
        fn tables(&self) -> Result<String, String> {
            let report = self
                .guard
                .report()
                .build()
                .map_err(|e| format!("--host-profile: {e}"))?;
            let stacks: Vec<(String, Vec<String>, u64)> = report
                .data
                .iter()
                .map(|(frames, &count)| {
                    let names = frames.frames.iter().flatten().map(|s| short_name(&s.name())).collect();
                    (frames.thread_name.clone(), names, count.max(0) as u64)
                })
                .collect();
            // The stacks themselves, root first, for flame graphs and call-tree questions.
            let folded = self.path.with_extension("folded");
            std::fs::write(&folded, folded_stacks(&stacks)).map_err(|e| format!("{}: {e}", folded.display()))?;
            Ok(summarize(stacks.into_iter()))
        }
    }

    /// One CPU-time timer per thread, each sending `SIGPROF` (pprof's sampling signal) to its own
    /// thread, so every thread is sampled in proportion to its CPU time (Linux).
    #[cfg(feature = "host-profile")]
    mod thread_timers {
        /// The timers of [`ThreadTimers::start`]; [`ThreadTimers::stop`] deletes them.
        pub struct ThreadTimers(Vec<libc::timer_t>);

        /// The clock id of thread `tid`'s CPU time (the kernel's per-thread scheduler clock).
        fn thread_cpu_clock(tid: i32) -> libc::clockid_t {
            ((!tid) << 3) | 6
        }

        impl ThreadTimers {
            /// Starts a timer firing `frequency` times per second of each thread's CPU time.
            pub fn start(tids: &[i32], frequency: i32) -> Result<Self, String> {
                let period_ns = 1_000_000_000 / i64::from(frequency.max(1));
                let period = libc::timespec {
                    tv_sec: period_ns / 1_000_000_000,
                    tv_nsec: period_ns % 1_000_000_000,
                };
                let spec = libc::itimerspec {
                    it_interval: period,
                    it_value: period,
                };
                let mut timers = Self(Vec::new());
                for &tid in tids {
                    // SAFETY: an all-zero `sigevent` is a valid value of this plain C struct.
                    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
                    event.sigev_notify = libc::SIGEV_THREAD_ID;
                    event.sigev_signo = libc::SIGPROF;
                    event.sigev_notify_thread_id = tid;
                    let mut timer: libc::timer_t = std::ptr::null_mut();
                    // SAFETY: `event` and `timer` are live locals for the call; the clock names a
                    // thread of this process (one that has exited makes the call fail, skipped).
                    if unsafe { libc::timer_create(thread_cpu_clock(tid), &mut event, &mut timer) } != 0 {
                        continue;
                    }
                    timers.0.push(timer);
                    // SAFETY: `timer` was just created; `spec` outlives the call.
                    if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
                        return Err(format!(
                            "--host-profile: timer_settime: {}",
                            std::io::Error::last_os_error()
                        ));
                    }
                }
                Ok(timers)
            }

            /// Deletes the timers (before the report is built, so no signal arrives during it).
            pub fn stop(&mut self) {
                for timer in self.0.drain(..) {
                    // SAFETY: each timer was created by `start` and is deleted once (drained).
                    unsafe { libc::timer_delete(timer) };
                }
            }
        }

        impl Drop for ThreadTimers {
            fn drop(&mut self) {
                self.stop();
            }
        }
    }

    /// A demangled symbol without its trailing `::h<hash>`.
    pub fn short_name(name: &str) -> String {
        match name.rfind("::h") {
            Some(i) if name.len() - i == 19 && name[i + 3..].bytes().all(|b| b.is_ascii_hexdigit()) => {
                name[..i].to_owned()
            }
            _ => name.to_owned(),
        }
    }

    /// The crate a symbol belongs to (`<impl X for Y>` paths count as Y's crate).
    pub fn crate_of(name: &str) -> &str {
        let trimmed = name
            .trim_start_matches(['<', '&', '*'])
            .trim_start_matches("mut ")
            .trim_start_matches("dyn ");
        let end = trimmed.find("::").unwrap_or(trimmed.len());
        let head = &trimmed[..end];
        if head.is_empty() || head.contains(' ') {
            "?"
        } else {
            head
        }
    }

    /// Crates whose frames are attributed to the nearest caller outside them.
    const LIBRARY_CRATES: &[&str] = &[
        "core",
        "alloc",
        "std",
        "hashbrown",
        "Unknown",
        "?",
        "__rust_alloc",
        "malloc",
    ];

    /// `(thread, leaf-first frame names, samples)` as folded stacks: one line per stack,
    /// `thread;root;…;leaf samples` (the input of flame-graph tools).
    pub fn folded_stacks(stacks: &[(String, Vec<String>, u64)]) -> String {
        let mut out = String::new();
        for (thread, names, count) in stacks {
            out.push_str(thread);
            for name in names.iter().rev() {
                out.push(';');
                out.push_str(&name.replace(';', ":"));
            }
            out.push_str(&format!(" {count}\n"));
        }
        out
    }

    /// Text tables from `(thread, leaf-first frame names, samples)`: samples per thread, per
    /// responsible crate (the first frame outside the standard library), and the functions with
    /// the most self and inclusive samples.
    pub fn summarize(stacks: impl Iterator<Item = (String, Vec<String>, u64)>) -> String {
        use std::collections::{BTreeMap, HashMap, HashSet};
        let mut threads: BTreeMap<String, u64> = BTreeMap::new();
        let mut crates: HashMap<String, u64> = HashMap::new();
        let mut leaf: HashMap<String, u64> = HashMap::new();
        let mut inclusive: HashMap<String, u64> = HashMap::new();
        let mut total = 0;
        for (thread, names, count) in stacks {
            total += count;
            *threads.entry(thread).or_default() += count;
            let owner = names
                .iter()
                .map(|n| crate_of(n))
                .find(|c| !LIBRARY_CRATES.contains(c))
                .unwrap_or("(library only)");
            *crates.entry(owner.to_owned()).or_default() += count;
            if let Some(first) = names.first() {
                *leaf.entry(first.clone()).or_default() += count;
            }
            let unique: HashSet<&String> = names.iter().collect();
            for n in unique {
                *inclusive.entry(n.clone()).or_default() += count;
            }
        }
        let mut out = format!("host profile: {total} samples\n");
        let pct = |c: u64| 100.0 * c as f64 / total.max(1) as f64;
        let mut table = |title: &str, rows: Vec<(String, u64)>, limit: usize| {
            out.push_str(&format!("\n## {title}\n"));
            for (name, c) in rows.into_iter().take(limit) {
                let name: String = name.chars().take(220).collect();
                out.push_str(&format!("{:6.2}% {c:7} {name}\n", pct(c)));
            }
        };
        let sorted = |m: HashMap<String, u64>| {
            let mut v: Vec<_> = m.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            v
        };
        table(
            "threads (samples collide between busy threads: compare threads by the CPU-time table, \
             or sample one alone with HOST_PROFILE_THREADS)",
            threads.into_iter().collect(),
            40,
        );
        table(
            "responsible crate (first frame outside core/alloc/std)",
            sorted(crates),
            40,
        );
        table("self (leaf function)", sorted(leaf), 60);
        table("inclusive (function anywhere on the stack)", sorted(inclusive), 150);
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn names_lose_their_hash_and_find_their_crate() {
            assert_eq!(
                short_name("burn_fusion::stream::Foo::bar::h0123456789abcdef"),
                "burn_fusion::stream::Foo::bar"
            );
            assert_eq!(short_name("a::h12"), "a::h12");
            assert_eq!(
                crate_of("<cudnn_backend::burn::Cudnn as burn_backend::Backend>::sync"),
                "cudnn_backend"
            );
            assert_eq!(crate_of("Unknown"), "Unknown");
        }

        #[test]
        fn stat_lines_give_cpu_ticks_and_threads_their_share() {
            let line = "42 (DS U-1 (x)) S 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 1 0";
            assert_eq!(cpu_ticks_of_stat(line), Some(280));
            assert_eq!(cpu_ticks_of_stat("garbage"), None);
            let t = |tid, cpu_s, voluntary_switches| ThreadTimes {
                tid,
                name: format!("t{tid}"),
                cpu_s,
                voluntary_switches,
            };
            let text = thread_table(&[t(1, 1.0, 10)], &[t(1, 1.5, 14), t(2, 0.25, 3), t(3, 0.0, 0)], 1.0);
            let server = |tid, cpu_s| ThreadTimes {
                name: "DSU-3085-0".into(),
                ..t(tid, cpu_s, 0)
            };
            assert_eq!(
                cpu_s_of(&[server(7, 1.0)], &[server(7, 1.75), t(1, 9.0, 0)], "DS"),
                0.75
            );
            assert!(text.contains("  50.0%     0.500 s         4 waits  t1 (1)"), "{text}");
            assert!(text.contains("  25.0%     0.250 s         3 waits  t2 (2)"), "{text}");
            assert!(!text.contains("t3"), "{text}");
            let all = [t(1, 0.0, 0), server(7, 0.0), server(8, 0.0)];
            assert_eq!(sampled_tids(&all, None), vec![1, 7, 8]);
            assert_eq!(sampled_tids(&all, Some(" , ")), vec![1, 7, 8]);
            assert_eq!(sampled_tids(&all, Some("DS")), vec![7, 8]);
            assert_eq!(sampled_tids(&all, Some("t1, DSU-3085")), vec![1, 7, 8]);
            assert!(sampled_tids(&all, Some("cudnn")).is_empty());
            // This process has at least its own thread.
            assert!(!thread_times().is_empty());
        }

        #[test]
        fn summary_attributes_library_frames_to_their_caller() {
            let stacks = vec![
                (
                    "main".to_owned(),
                    vec!["alloc::alloc::alloc".into(), "burn_autodiff::graph::x".into()],
                    3,
                ),
                ("main".to_owned(), vec!["cudarc::driver::launch".into()], 1),
            ];
            assert_eq!(
                folded_stacks(&stacks),
                "main;burn_autodiff::graph::x;alloc::alloc::alloc 3\nmain;cudarc::driver::launch 1\n"
            );
            let text = summarize(stacks.into_iter());
            assert!(text.contains("host profile: 4 samples"));
            assert!(text.contains(" 75.00%       3 burn_autodiff\n"), "{text}");
            assert!(text.contains(" 25.00%       1 cudarc\n"), "{text}");
        }
    }
}

pub mod models;

/// A small CNN trained with burn-train's `Learner` (the train_learner example).
pub mod learner;

#[cfg(feature = "candle")]
pub mod candle_models;
