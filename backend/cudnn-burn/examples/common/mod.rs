//! What the Burn 0.22 trainers share: their flags, the device set-up (with or without
//! `cudnn_burn::register()`), a progress bar, the loss curve, the closing JSON line, and a
//! trace of one step's fusion stream (`--trace-step FILE`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn_fusion::observer::{BlockOperations, FusionObservation, FusionObserver};
use burn_ir::OperationIr;

use burn::prelude::*;
use burn::tensor::FloatDType;
use indicatif::{ProgressBar, ProgressStyle};

/// The flags every trainer takes.
pub struct Args {
    /// Register cudnn-burn's provider before the first tensor operation.
    pub register: bool,
    /// Training steps (the first compiles kernels and builds plans, and is not timed).
    pub steps: usize,
    /// Samples per step.
    pub batch: usize,
    /// The device's default float dtype: parameters, activations and gradients.
    pub dtype: FloatDType,
    /// Where to write the trace of the second step's fusion stream, if anywhere.
    pub trace_step: Option<String>,
}

/// Parses `--register`, `--steps N`, `--batch-size N`, `--dtype f32|f16|bf16` and
/// `--trace-step FILE`.
pub fn parse_args(default_batch: usize) -> Result<Args, String> {
    let mut a = Args {
        register: false,
        steps: 30,
        batch: default_batch,
        dtype: FloatDType::F32,
        trace_step: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: &String| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--register" => a.register = true,
            "--steps" => a.steps = number(value()?)?.max(2),
            "--batch-size" => a.batch = number(value()?)?.max(1),
            "--trace-step" => a.trace_step = Some(value()?.clone()),
            "--dtype" => {
                a.dtype = match value()?.as_str() {
                    "f32" => FloatDType::F32,
                    "f16" => FloatDType::F16,
                    "bf16" => FloatDType::BF16,
                    other => return Err(format!("--dtype {other}: need f32, f16 or bf16")),
                }
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(a)
}

/// Registers the provider when asked, then returns CUDA device 0 with the float dtype set and
/// autodiff on. Registration comes first: Burn's fusion registry is sealed once a tensor
/// operation runs.
pub fn training_device(args: &Args) -> Result<Device, String> {
    if args.register {
        cudnn_burn::register().map_err(|e| e.to_string())?;
    }
    let mut device = Device::cuda(0);
    device
        .configure(args.dtype)
        .map_err(|e| format!("setting the float dtype {:?}: {e:?}", args.dtype))?;
    Ok(device.autodiff())
}

/// The losses of a run and the time from the end of its first step.
pub struct Run {
    losses: Vec<f32>,
    timed_from: Option<Instant>,
    bar: ProgressBar,
    /// `--trace-step`: the file, and the trace while it records (the second step).
    trace: Option<(String, Option<Tracing>)>,
}

/// A step trace being recorded, and the guard that keeps its observer installed.
type Tracing = (Arc<StepTrace>, FusionObservation);

impl Run {
    /// A run of `steps` steps, with a progress bar on standard error; with `trace_step`, the
    /// fusion stream between the first and the second step's loss is written there.
    pub fn new(steps: usize, trace_step: Option<String>) -> Self {
        let bar = ProgressBar::new(steps as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self {
            losses: Vec::with_capacity(steps),
            timed_from: None,
            bar,
            trace: trace_step.map(|path| (path, None)),
        }
    }

    /// Records one step's loss (the first step ends when its loss is read). With a trace,
    /// observing starts after the first step and stops after the second: the traced step is
    /// slowed by the trace and counts in the timing like the others.
    pub fn step(&mut self, loss: f32) {
        if self.losses.is_empty() {
            self.timed_from = Some(Instant::now());
        }
        self.losses.push(loss);
        if let Some((path, observing)) = &mut self.trace {
            match (self.losses.len(), observing.take()) {
                (1, _) => {
                    let trace = Arc::new(StepTrace::default());
                    *observing = Some((trace.clone(), FusionObservation::new(trace)));
                }
                (2, Some((trace, observation))) => {
                    drop(observation);
                    match std::fs::write(&*path, trace.render()) {
                        Ok(()) => self.bar.println(format!("fusion trace of step 2 written to {path}")),
                        Err(e) => self.bar.println(format!("--trace-step {path}: {e}")),
                    }
                }
                (_, kept) => *observing = kept,
            }
        }
        self.bar.set_message(format!("loss {loss:.4}"));
        self.bar.inc(1);
    }

    /// Ends the bar, prints the loss curve, cudnn-burn's counters and the JSON line
    /// `{"model":..,"variant":"burn"|"cudnn-burn","dtype":..,"ms_per_step":..,"loss_first":..,"loss_last":..}`.
    pub fn finish(self, model: &str, args: &Args) {
        self.bar.finish();
        let steps_timed = self.losses.len().saturating_sub(1).max(1);
        let ms_per_step = self
            .timed_from
            .map_or(f64::NAN, |t0| t0.elapsed().as_secs_f64() * 1e3 / steps_timed as f64);
        println!("loss curve: {}", sparkline(&self.losses));
        if let Some(s) = cudnn_burn::stats() {
            println!("cudnn-burn: {s:?}");
        }
        let variant = if args.register { "cudnn-burn" } else { "burn" };
        let first = self.losses.first().copied().unwrap_or(f32::NAN);
        let last = self.losses.last().copied().unwrap_or(f32::NAN);
        println!(
            "{{\"model\":\"{model}\",\"variant\":\"{variant}\",\"dtype\":\"{:?}\",\"ms_per_step\":{ms_per_step:.3},\"loss_first\":{first:.5},\"loss_last\":{last:.5}}}",
            args.dtype
        );
    }
}

/// What the fusion server did during the traced step: every operation it registered and the
/// blocks it ran (the operations one fused kernel, one claimed node or one unfused operation
/// covers). The observer only clones operations on the server's thread; they are formatted
/// when the trace is written.
#[derive(Default)]
struct StepTrace {
    registered: Mutex<Vec<OperationIr>>,
    blocks: Mutex<Vec<Vec<OperationIr>>>,
}

impl FusionObserver for StepTrace {
    fn registered(&self, operation: &OperationIr) {
        lock(&self.registered).push(operation.clone());
    }

    fn block_starts(&self, block: BlockOperations<'_>) {
        lock(&self.blocks).push(block.iter().cloned().collect());
    }

    fn block_ran(&self) {}
}

/// The guarded value, also after a panic elsewhere poisoned the lock (the trace is only read).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StepTrace {
    /// The trace as text: a summary, the blocks by how often each sequence of operation kinds
    /// ran, the blocks in order, then every registered operation in full.
    fn render(&self) -> String {
        let registered = lock(&self.registered);
        let blocks: Vec<String> = lock(&self.blocks)
            .iter()
            .map(|b| b.iter().map(op_kind).collect::<Vec<_>>().join(" + "))
            .collect();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for b in &blocks {
            *counts.entry(b).or_default() += 1;
        }
        let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
        counts.sort_by_key(|&(sig, n)| (std::cmp::Reverse(n), sig));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} operations registered, {} blocks run ({} of several operations)",
            registered.len(),
            blocks.len(),
            blocks.iter().filter(|b| b.contains(" + ")).count()
        );
        let _ = writeln!(out, "\n## blocks by kind (runs, operations)");
        for (sig, n) in &counts {
            let _ = writeln!(out, "{n:5}  {sig}");
        }
        let _ = writeln!(out, "\n## blocks in order");
        for (i, b) in blocks.iter().enumerate() {
            let _ = writeln!(out, "{i:5}  {b}");
        }
        let _ = writeln!(out, "\n## registered operations in order");
        for (i, r) in registered.iter().enumerate() {
            let _ = writeln!(out, "{i:5}  {r:?}");
        }
        out
    }
}

/// A short name of an operation's kind from its `Debug` form: the outer variant and the
/// operation's own (`Module::Conv2d`, `NumericFloat::Add`, `BaseFloat::Reshape`); a leading
/// dtype argument (`NumericFloat(F32, Add(..))`) is skipped.
fn op_kind(op: &OperationIr) -> String {
    kind_of(&format!("{op:?}"))
}

/// [`op_kind`] of an operation's `Debug` text.
fn kind_of(text: &str) -> String {
    let mut parts = text
        .split(['(', '{'])
        .map(|p| p.rsplit(", ").next().unwrap_or(p).trim());
    let outer = parts.next().unwrap_or_default();
    match parts.next().filter(|p| !p.is_empty()) {
        Some(inner) => format!("{outer}::{inner}"),
        None => outer.to_string(),
    }
}

/// The losses as one line of block characters, lowest to highest (at most 60, evenly picked).
pub fn sparkline(values: &[f32]) -> String {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let (lo, hi) = finite.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    let n = values.len().min(60);
    (0..n)
        .map(|i| values[i * values.len() / n.max(1)])
        .map(|v| {
            if !v.is_finite() {
                '?'
            } else if hi > lo {
                BLOCKS[(((v - lo) / (hi - lo)) * 7.0).round() as usize]
            } else {
                BLOCKS[0]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{kind_of, sparkline};

    #[test]
    fn operation_kinds_name_the_outer_and_inner_variant() {
        assert_eq!(kind_of("Module(Conv2d(Conv2dOpIr { x: .. }))"), "Module::Conv2d");
        assert_eq!(
            kind_of("NumericFloat(F32, Add(BinaryOpIr { lhs: .. }))"),
            "NumericFloat::Add"
        );
        assert_eq!(
            kind_of("BaseFloat(Reshape(ShapeOpIr { input: .. }))"),
            "BaseFloat::Reshape"
        );
        assert_eq!(kind_of("Drop(TensorIr { id: .. })"), "Drop::TensorIr");
        assert_eq!(kind_of("Init"), "Init");
    }

    #[test]
    fn sparkline_spans_lowest_to_highest_and_marks_non_finite_losses() {
        assert_eq!(sparkline(&[3.0, 2.0, 1.0]), "█▅▁");
        assert_eq!(sparkline(&[1.0, f32::NAN]), "▁?");
        assert_eq!(sparkline(&[2.0, 2.0]), "▁▁");
        assert_eq!(
            sparkline(&(0..600).map(|i| i as f32).collect::<Vec<_>>())
                .chars()
                .count(),
            60
        );
        assert_eq!(sparkline(&[]), "");
    }
}
