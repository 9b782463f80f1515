//! The Burn 0.22 spike: can this project's cuDNN engine run Burn 0.22's convolutions through
//! CubeCL's fusion registry (`burn_cubecl::fusion::register`), ordered with CubeCL's CUDA
//! stream, with outputs from CubeCL's allocator? It answers with printed evidence:
//!
//! - (a) ordering: a registered provider claims 2-D convolution forward nodes and runs them with
//!   `cudnn_backend_core::ops::conv_forward`, ordered by `--order host-wait|stream-memory`
//!   (see `ordering.rs`); results are checked against a float64 reference with a race
//!   amplifier on, and a probe counts early passes of the GPU-side wait;
//! - (b) whether single-convolution segments are offered to the registered fuser and whether
//!   it wins them: counters over a conv -> relu -> conv -> add chain and the timed runs;
//! - (c) memory: outputs through `client.empty`, and how the cuDNN workspace is provided.
//!
//! Registering is process-wide and sealed once fusion starts, so each configuration runs in
//! its own process: `--mode burn` (nothing registered: Burn's own convolution), `--mode cudnn
//! --order host-wait|stream-memory`; `--mode all` (default) runs the three as child processes
//! and prints one table. Correctness is judged in every process against the same float64
//! reference (fixed-seed inputs; full outputs for the small chain, a fixed sample of output
//! points for the ResNet-50 shapes), so the modes are compared through it; the whole-output
//! L2 norm is printed too.
//!
//! ```sh
//! scripts/burn-0.22-offline.sh   # BURN_022_PROFILE=release for timings
//! target/burn-0.22/release/cudnn_spike [--mode all|burn|cudnn] [--order host-wait|stream-memory]
//!     [--batch 64] [--reps 50] [--rounds 3] [--samples 4096] [--amplify-us 200]
//! ```

// The modules live in `cudnn_spike/` next to this file (a binary root resolves `mod` in its own
// directory, `src/bin/`).
#[path = "cudnn_spike/error.rs"]
mod error;
#[path = "cudnn_spike/ordering.rs"]
mod ordering;
#[path = "cudnn_spike/provider.rs"]
mod provider;
#[path = "cudnn_spike/reference.rs"]
mod reference;
#[path = "cudnn_spike/scenarios.rs"]
mod scenarios;

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

use burn::prelude::Device;

use error::{Result, SpikeError};
use ordering::{Order, Ordering};
use provider::{CudnnConvProvider, Snapshot, COUNTERS, ORDERING, SCORE};
use reference::ConvShape;
use scenarios::{Dtype, ShapePlan};

/// Command-line settings.
#[derive(Clone, Debug)]
struct Args {
    mode: String,
    order: Order,
    batch: usize,
    reps: usize,
    rounds: usize,
    samples: usize,
    amplify_us: u64,
}

const USAGE: &str = "usage: cudnn_spike [--mode all|burn|cudnn] [--order host-wait|stream-memory] \
                     [--batch N] [--reps N] [--rounds N] [--samples N] [--amplify-us N]";

fn parse_args() -> Result<Args> {
    let mut a = Args {
        mode: "all".into(),
        order: Order::StreamMemory,
        batch: 64,
        reps: 50,
        rounds: 3,
        samples: 4096,
        amplify_us: 200,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| SpikeError::Usage(format!("{flag} needs a value\n{USAGE}")))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| SpikeError::Usage(format!("{flag} {value}: {e}\n{USAGE}")))
        };
        match flag.as_str() {
            "--mode" if ["all", "burn", "cudnn"].contains(&value.as_str()) => a.mode = value.clone(),
            "--order" => {
                a.order = Order::parse(value).ok_or_else(|| SpikeError::Usage(format!("--order {value}\n{USAGE}")))?
            }
            "--batch" => a.batch = number()?.max(1) as usize,
            "--reps" => a.reps = number()?.max(1) as usize,
            "--rounds" => a.rounds = number()?.max(1) as usize,
            "--samples" => a.samples = number()?.max(1) as usize,
            "--amplify-us" => a.amplify_us = number()?,
            _ => return Err(SpikeError::Usage(format!("unknown argument {flag} {value}\n{USAGE}"))),
        }
    }
    Ok(a)
}

/// The ResNet-50-like shapes (NCHW, batch `n`).
fn shapes(n: usize) -> Vec<ConvShape> {
    let conv = |c, k, r, stride, pad| ConvShape {
        n,
        c,
        h: 56,
        w: 56,
        k,
        r,
        s: r,
        stride,
        pad,
    };
    vec![conv(64, 64, 3, 1, 1), conv(256, 64, 1, 1, 0), conv(128, 128, 3, 2, 1)]
}

/// What the program needs before touching the GPU, checked without panicking: the driver and
/// a GPU, NVRTC and the CUDA headers (CubeCL compiles its kernels with NVRTC against them),
/// and cuDNN for the cudnn mode.
fn preflight(need_cudnn: bool) -> Result<String> {
    let r = cudnn_backend_core::runtime::report();
    if let Err(e) = &r.driver {
        return Err(SpikeError::Setup(format!("no CUDA driver: {e}")));
    }
    if let Err(e) = &r.devices {
        return Err(SpikeError::Setup(format!("no GPU: {e}")));
    }
    if let Err(e) = &r.nvrtc {
        return Err(SpikeError::Setup(format!(
            "no NVRTC (CubeCL compiles every kernel with it): {e}"
        )));
    }
    if need_cudnn {
        if let Err(e) = &r.cudnn {
            return Err(SpikeError::Setup(format!("no cuDNN: {e}")));
        }
    }
    let headers = cubecl_cuda::install::cuda_path().map(|p| p.join("include"));
    match &headers {
        Some(inc) if inc.join("cuda_bf16.h").exists() => {}
        _ => {
            return Err(SpikeError::Setup(format!(
                "CubeCL's NVRTC kernels include the CUDA headers (cuda_fp16.h, cuda_bf16.h, cuda/barrier), \
                 not found under {headers:?}: set CUDA_PATH to a CUDA toolkit (or install one in /usr/local/cuda)"
            )))
        }
    }
    Ok(format!(
        "{r}\nCUDA headers: {}",
        headers.map(|p| p.display().to_string()).unwrap_or_default()
    ))
}

fn label(args: &Args) -> String {
    match args.mode.as_str() {
        "cudnn" => format!("cudnn/{}", args.order.name()),
        other => other.to_string(),
    }
}

fn count_line(label: &str, section: &str, c: &Snapshot, convs: u64) -> String {
    format!(
        "COUNT|{label}|{section}|{}|{}|{}|{}|{}|{}|{}|{convs}",
        c.conv_heads, c.conv_declined, c.other_heads, c.fed, c.claims, c.cudnn_runs, c.fallbacks
    )
}

/// One configuration (`--mode burn|cudnn`) in this process. Returns whether every check passed.
fn run_one(args: &Args) -> Result<bool> {
    let cudnn = args.mode == "cudnn";
    let label = label(args);
    println!("== cudnn_spike, mode {label} ==");
    println!("{}", preflight(cudnn)?);
    let mut ok = true;
    let mut notes = Vec::new();

    if cudnn {
        let ordering = Ordering::new(args.order)?;
        if ORDERING.set(ordering).is_err() {
            return Err(SpikeError::Run("ordering set twice".into()));
        }
        burn_cubecl::fusion::register(CudnnConvProvider)
            .map_err(|e| SpikeError::run("burn_cubecl::fusion::register", e))?;
        println!(
            "registered provider `CudnnConv2d` (score {SCORE}) next to the built-ins {:?}",
            burn_cubecl::fusion::BUILTIN_NAMES
        );
        let client = burn_cubecl::CubeDevice::Cuda(cubecl_runtime::device::CudaDevice::new(0)).client();
        let ordering = ORDERING
            .get()
            .ok_or_else(|| SpikeError::Run("ordering missing".into()))?;
        println!("ordering {}: {}", args.order.name(), ordering.self_test(&client)?);
        println!(
            "not possible with burn-cubecl 0.22.1 / cubecl 0.11: (1) enqueueing cuDNN on CubeCL's own CUstream: \
             cubecl-cuda's CudaServer keeps its streams private and Client exposes no stream, event or \
             run-on-stream hook; next best: the engine's own stream, ordered by {}. (2) a cuDNN workspace from \
             CubeCL's allocator: cudnn_backend_core::ops::conv_forward takes no workspace (the engine keeps its own, \
             see (c)); outputs do come from client.empty.",
            args.order.name()
        );
    } else {
        println!("nothing registered: Burn 0.22's own convolution (the baseline)");
    }
    let ordering = ORDERING.get();
    let device = Device::cuda(0);

    println!(
        "\n-- (b) fusion offers and claims: out = conv2(relu(conv1(x))) + x, 4 reps, [2,8,12,12], full float64 check{} --",
        if cudnn && args.order == Order::StreamMemory && args.amplify_us > 0 {
            format!(", race amplifier {} us", args.amplify_us)
        } else {
            String::new()
        }
    );
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let r = scenarios::chain(&device, dtype, 4, ordering, args.amplify_us * 1000)?;
        let pass = r.rel_err <= dtype.tolerance();
        ok &= pass;
        let c = r.counts;
        println!(
            "{}: rel L2 vs float64 {:.2e} ({}); fed {} ops; block heads: {} accepted convs, {} declined convs, \
             {} other; blocks won (finish) {}; claimed convs run on cuDNN {}, by fallback {}; convs executed {}",
            dtype.name(),
            r.rel_err,
            if pass { "ok" } else { "FAIL" },
            c.fed,
            c.conv_heads,
            c.conv_declined,
            c.other_heads,
            c.claims,
            c.cudnn_runs,
            c.fallbacks,
            r.convs
        );
        notes.push(count_line(&label, &format!("chain-{}", dtype.name()), &c, r.convs));
    }

    println!(
        "\n-- (a) ResNet-50 convolutions, batch {}: correctness ({} sampled points vs float64{}), then {} rounds of \
         {} back-to-back convolutions --",
        args.batch,
        args.samples,
        if cudnn && args.order == Order::StreamMemory && args.amplify_us > 0 {
            format!(", race amplifier {} us on both streams", args.amplify_us)
        } else {
            String::new()
        },
        args.rounds,
        args.reps
    );
    let plan = ShapePlan {
        samples: args.samples,
        reps: args.reps,
        rounds: args.rounds,
        amplify_ns: args.amplify_us * 1000,
    };
    let mut rows = Vec::new();
    for shape in shapes(args.batch) {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let r = scenarios::run_shape(&device, &shape, dtype, &plan, ordering)?;
            let pass = r.rel_err <= dtype.tolerance();
            ok &= pass;
            println!(
                "{:<22} {:<4} rel L2 {:.2e} ({}) |y| {:.6e}  {:.3} ms/conv (median {:.3}); timed convs {}: cuDNN {}, \
                 fallback {}",
                shape.label(),
                dtype.name(),
                r.rel_err,
                if pass { "ok" } else { "FAIL" },
                r.norm,
                r.ms_best,
                r.ms_median,
                r.timed_convs,
                r.counts.cudnn_runs,
                r.counts.fallbacks
            );
            rows.push(format!(
                "ROW|{label}|{}|{}|{:.3e}|{:.4}|{:.4}|{:.9e}|{}",
                shape.label(),
                dtype.name(),
                r.rel_err,
                r.ms_best,
                r.ms_median,
                r.norm,
                if pass { "ok" } else { "FAIL" }
            ));
            notes.push(count_line(
                &label,
                &format!("timed-{}-{}", shape.label(), dtype.name()),
                &r.counts,
                r.timed_convs,
            ));
        }
    }

    println!("\n-- (c) memory --");
    if let Some(o) = ordering {
        let total = COUNTERS.snapshot();
        println!(
            "outputs: client.empty(bytes) on the handle's client (CubeCL's allocator), {:.1} MiB over {} claimed convs",
            total.output_bytes as f64 / (1 << 20) as f64,
            total.cudnn_runs
        );
        println!(
            "cuDNN workspace: NOT through CubeCL. conv_forward takes no workspace argument; cudnn-backend-core keeps \
             a per-stream workspace (cudarc allocation on its own stream, grown to the largest plan, reused), now {} \
             bytes on our stream",
            cudnn_backend_core::runtime::workspace_bytes(&o.stream)
        );
        device.sync().map_err(|e| SpikeError::run("final sync", e))?;
        if let Some(w) = o.words()? {
            let v = w.violations;
            ok &= v == 0 && w.signals == w.writes && w.waits == w.signals;
            println!(
                "stream-memory words (self-test included): {} signal kernels ran, our stream's last write {}, {} wait \
                 kernels ran to their end; probe: {v} waits let our stream through before their signal ({})",
                w.signals,
                w.writes,
                w.waits,
                if v == 0 && w.signals == w.writes && w.waits == w.signals {
                    "ok"
                } else {
                    "FAIL"
                }
            );
            notes.push(format!("PROBE|{label}|{v}|{}|{}", w.signals, w.waits));
        }
        let lc = cudnn_backend_core::runtime::launch_counts();
        println!(
            "engine: {} cuDNN plan executions, {} engine NVRTC kernel launches (direct-convolution fallback, memsets)",
            lc.cudnn_executions, lc.kernels
        );
    } else {
        println!("mode burn: outputs and workspace are Burn's own");
    }

    println!("\n-- summary ({label}) --");
    println!(
        "{:<22} {:<5} {:>10} {:>10} {:>10}",
        "shape", "dtype", "rel L2", "ms/conv", "median"
    );
    for row in &rows {
        let f: Vec<&str> = row.split('|').collect();
        if let [_, _, shape, dtype, err, best, median, _, _] = f.as_slice() {
            println!("{shape:<22} {dtype:<5} {err:>10} {best:>10} {median:>10}");
        }
    }
    for line in rows.iter().chain(&notes) {
        println!("{line}");
    }
    Ok(ok)
}

/// A child's machine-readable lines.
#[derive(Default)]
struct Collected {
    rows: Vec<Vec<String>>,
    counts: Vec<Vec<String>>,
    probes: Vec<Vec<String>>,
}

/// `--mode all`: the three configurations as child processes, their output passed through,
/// then one table.
fn run_all(args: &Args) -> Result<bool> {
    println!("{}", preflight(true)?);
    let exe = std::env::current_exe().map_err(|e| SpikeError::run("current_exe", e))?;
    let common = [
        "--batch".to_string(),
        args.batch.to_string(),
        "--reps".into(),
        args.reps.to_string(),
        "--rounds".into(),
        args.rounds.to_string(),
        "--samples".into(),
        args.samples.to_string(),
        "--amplify-us".into(),
        args.amplify_us.to_string(),
    ];
    let configs: [&[&str]; 3] = [
        &["--mode", "burn"],
        &["--mode", "cudnn", "--order", "host-wait"],
        &["--mode", "cudnn", "--order", "stream-memory"],
    ];
    let mut all = Collected::default();
    let mut ok = true;
    for config in configs {
        let mut child = Command::new(&exe)
            .args(config)
            .args(&common)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| SpikeError::run("spawning a child run", e))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| SpikeError::Run("child stdout".into()))?;
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| SpikeError::run("reading a child's output", e))?;
            let fields: Vec<String> = line.split('|').map(str::to_string).collect();
            match fields.first().map(String::as_str) {
                Some("ROW") => all.rows.push(fields),
                Some("COUNT") => all.counts.push(fields),
                Some("PROBE") => all.probes.push(fields),
                _ => println!("{line}"),
            }
        }
        let status = child
            .wait()
            .map_err(|e| SpikeError::run("waiting for a child run", e))?;
        if !status.success() {
            ok = false;
            println!("!! {} exited with {status}", config.join(" "));
        }
        println!();
    }

    let modes = ["burn", "cudnn/host-wait", "cudnn/stream-memory"];
    println!(
        "== cudnn_spike summary (batch {}, {} convs per timed round, best of {}) ==",
        args.batch, args.reps, args.rounds
    );
    println!(
        "{:<22} {:<5} | {:>9} {:>8} | {:>9} {:>8} | {:>9} {:>8} | {:>11}",
        "shape", "dtype", "burn err", "ms", "host err", "ms", "smem err", "ms", "|y| spread"
    );
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in &all.rows {
        let key = (r[2].clone(), r[3].clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (shape, dtype) in keys {
        let mut cells = Vec::new();
        let mut norms = Vec::new();
        for m in modes {
            match all.rows.iter().find(|r| r[1] == m && r[2] == shape && r[3] == dtype) {
                Some(r) => {
                    cells.push(format!("{:>9} {:>8}", r[4], r[5]));
                    norms.push(r[7].parse::<f64>().unwrap_or(f64::NAN));
                }
                None => cells.push(format!("{:>9} {:>8}", "-", "-")),
            }
        }
        let spread = match (
            norms.iter().copied().fold(f64::NAN, f64::max),
            norms.iter().copied().fold(f64::NAN, f64::min),
        ) {
            (hi, lo) if hi.is_finite() && lo.is_finite() && hi > 0.0 => format!("{:.1e}", (hi - lo) / hi),
            _ => "-".into(),
        };
        println!("{shape:<22} {dtype:<5} | {} | {spread:>11}", cells.join(" | "));
    }
    println!(
        "\nfusion counters (conv heads accepted / declined / other heads / ops fed / blocks won / cuDNN runs / \
         fallbacks / convs executed):"
    );
    for c in all
        .counts
        .iter()
        .filter(|c| c[2].starts_with("chain") || c[2].contains("64->64"))
    {
        println!("  {:<20} {:<34} {}", c[1], c[2], c[3..].join(" / "));
    }
    for p in &all.probes {
        println!(
            "  {:<20} stream-memory: probe violations {}, signal kernels {}, wait kernels {}",
            p[1],
            p[2],
            p.get(3).map_or("-", String::as_str),
            p.get(4).map_or("-", String::as_str)
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cudnn_spike: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if args.mode == "all" {
        run_all(&args)
    } else {
        run_one(&args)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("cudnn_spike: some checks failed (see FAIL above)");
            ExitCode::from(3)
        }
        Err(e @ SpikeError::Usage(_)) => {
            eprintln!("cudnn_spike: {e}");
            ExitCode::from(2)
        }
        Err(e @ SpikeError::Setup(_)) => {
            eprintln!("cudnn_spike: cannot run here: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("cudnn_spike: {e}");
            ExitCode::from(1)
        }
    }
}
