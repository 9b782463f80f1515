//! The Burn 0.22 spike: does this project's cuDNN engine run Burn 0.22's convolutions through
//! CubeCL's fusion registry, ordered with CubeCL's CUDA stream, with outputs from CubeCL's
//! allocator? It registers the `cudnn-burn` crate's provider (`cudnn_burn::register`, which
//! claims convolution and pooling nodes and orders the engine's stream with CubeCL's on the
//! GPU) and answers with printed evidence:
//!
//! - (a) correctness and speed of the claimed 2-D convolutions on ResNet-50 shapes against a
//!   float64 reference;
//! - (b) whether single-convolution segments reach the provider and it wins them: its
//!   counters (`cudnn_burn::stats`) over a conv -> relu -> conv -> add chain and the timed runs;
//! - (c) memory: outputs through `client.empty`, and how the cuDNN workspace is provided.
//!
//! Registering is process-wide and sealed once fusion starts, so each configuration runs in
//! its own process: `--mode burn` (nothing registered: Burn's own convolution), `--mode
//! cudnn`; `--mode all` (default) runs both as child processes and prints one table.
//! Correctness is judged in every process against the same float64 reference (fixed-seed
//! inputs; full outputs for the small chain, a fixed sample of output points for the
//! ResNet-50 shapes); the whole-output L2 norm is printed too.
//!
//! ```sh
//! scripts/burn-0.22-offline.sh   # BURN_022_PROFILE=release for timings
//! target/burn-0.22/release/cudnn_spike [--mode all|burn|cudnn] [--batch 64] [--reps 50]
//!     [--rounds 3] [--samples 4096]
//! ```

// The modules live in `cudnn_spike/` next to this file (a binary root resolves `mod` in its own
// directory, `src/bin/`).
#[path = "cudnn_spike/error.rs"]
mod error;
#[path = "cudnn_spike/reference.rs"]
mod reference;
#[path = "cudnn_spike/scenarios.rs"]
mod scenarios;

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

use burn::prelude::Device;
use cudnn_burn::Stats;

use error::{Result, SpikeError};
use reference::ConvShape;
use scenarios::{Dtype, ShapePlan};

/// Command-line settings.
#[derive(Clone, Debug)]
struct Args {
    mode: String,
    batch: usize,
    reps: usize,
    rounds: usize,
    samples: usize,
}

const USAGE: &str = "usage: cudnn_spike [--mode all|burn|cudnn] [--batch N] [--reps N] [--rounds N] [--samples N]";

fn parse_args() -> Result<Args> {
    let mut a = Args {
        mode: "all".into(),
        batch: 64,
        reps: 50,
        rounds: 3,
        samples: 4096,
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
            "--batch" => a.batch = number()?.max(1) as usize,
            "--reps" => a.reps = number()?.max(1) as usize,
            "--rounds" => a.rounds = number()?.max(1) as usize,
            "--samples" => a.samples = number()?.max(1) as usize,
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

fn count_line(label: &str, section: &str, c: &Stats, convs: u64) -> String {
    format!(
        "COUNT|{label}|{section}|{}|{}|{}|{}|{convs}",
        c.offered, c.claimed, c.engine_runs, c.fallbacks
    )
}

/// One configuration (`--mode burn|cudnn`) in this process. Returns whether every check passed.
fn run_one(args: &Args) -> Result<bool> {
    let cudnn = args.mode == "cudnn";
    let label = args.mode.clone();
    println!("== cudnn_spike, mode {label} ==");
    println!("{}", preflight(cudnn)?);
    let mut ok = true;
    let mut notes = Vec::new();

    if cudnn {
        cudnn_burn::register().map_err(|e| SpikeError::run("cudnn_burn::register", e))?;
        println!(
            "registered cudnn-burn's provider `{}` (score {}): convolutions and pooling on the engine's stream, \
             ordered with CubeCL's by stream memory operations",
            cudnn_burn::NAME,
            cudnn_burn::SCORE
        );
    } else {
        println!("nothing registered: Burn 0.22's own convolution (the baseline)");
    }
    let device = Device::cuda(0);

    println!("\n-- (b) fusion offers and claims: out = conv2(relu(conv1(x))) + x, 4 reps, [2,8,12,12], full float64 check --");
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let r = scenarios::chain(&device, dtype, 4)?;
        let pass = r.rel_err <= dtype.tolerance();
        ok &= pass;
        let c = r.counts;
        println!(
            "{}: rel L2 vs float64 {:.2e} ({}); blocks offered {}, won {}; claimed nodes run on the engine {}, by \
             fallback {}; convs executed {}",
            dtype.name(),
            r.rel_err,
            if pass { "ok" } else { "FAIL" },
            c.offered,
            c.claimed,
            c.engine_runs,
            c.fallbacks,
            r.convs
        );
        notes.push(count_line(&label, &format!("chain-{}", dtype.name()), &c, r.convs));
    }

    println!(
        "\n-- (a) ResNet-50 convolutions, batch {}: correctness ({} sampled points vs float64), then {} rounds of {} \
         back-to-back convolutions --",
        args.batch, args.samples, args.rounds, args.reps
    );
    let plan = ShapePlan {
        samples: args.samples,
        reps: args.reps,
        rounds: args.rounds,
    };
    let mut rows = Vec::new();
    for shape in shapes(args.batch) {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let r = scenarios::run_shape(&device, &shape, dtype, &plan)?;
            let pass = r.rel_err <= dtype.tolerance();
            ok &= pass;
            println!(
                "{:<22} {:<4} rel L2 {:.2e} ({}) |y| {:.6e}  {:.3} ms/conv (median {:.3}); timed convs {}: engine {}, \
                 fallback {}",
                shape.label(),
                dtype.name(),
                r.rel_err,
                if pass { "ok" } else { "FAIL" },
                r.norm,
                r.ms_best,
                r.ms_median,
                r.timed_convs,
                r.counts.engine_runs,
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
    if cudnn {
        device.sync().map_err(|e| SpikeError::run("final sync", e))?;
        let engine = cudnn_backend_core::Device::new(0)?;
        println!(
            "outputs: client.empty(bytes) on the input handle's client (CubeCL's allocator); cuDNN workspace: the \
             engine's per-stream buffer (not CubeCL's), now {} bytes",
            cudnn_backend_core::runtime::workspace_bytes(engine.stream())
        );
        let lc = cudnn_backend_core::runtime::launch_counts();
        println!(
            "engine: {} cuDNN plan executions, {} engine NVRTC kernel launches (packing copies, direct-convolution \
             fallback, memsets)",
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
}

/// `--mode all`: the two configurations as child processes, their output passed through,
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
    ];
    let configs: [&[&str]; 2] = [&["--mode", "burn"], &["--mode", "cudnn"]];
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

    let modes = ["burn", "cudnn"];
    println!(
        "== cudnn_spike summary (batch {}, {} convs per timed round, best of {}) ==",
        args.batch, args.reps, args.rounds
    );
    println!(
        "{:<22} {:<5} | {:>9} {:>8} | {:>9} {:>8} | {:>11}",
        "shape", "dtype", "burn err", "ms", "cudnn err", "ms", "|y| spread"
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
    println!("\nprovider counters (blocks offered / won / engine runs / fallbacks / convs executed):");
    for c in all
        .counts
        .iter()
        .filter(|c| c[2].starts_with("chain") || c[2].contains("64->64"))
    {
        println!("  {:<20} {:<34} {}", c[1], c[2], c[3..].join(" / "));
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
