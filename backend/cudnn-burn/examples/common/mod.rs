//! What the Burn 0.22 trainers share: their flags, the device set-up (with or without
//! `cudnn_burn::register()`), a progress bar, the loss curve and the closing JSON line.

use std::time::Instant;

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
}

/// Parses `--register`, `--steps N`, `--batch-size N` and `--dtype f32|f16|bf16`.
pub fn parse_args(default_batch: usize) -> Result<Args, String> {
    let mut a = Args {
        register: false,
        steps: 30,
        batch: default_batch,
        dtype: FloatDType::F32,
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
}

impl Run {
    /// A run of `steps` steps, with a progress bar on standard error.
    pub fn new(steps: usize) -> Self {
        let bar = ProgressBar::new(steps as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self {
            losses: Vec::with_capacity(steps),
            timed_from: None,
            bar,
        }
    }

    /// Records one step's loss (the first step ends when its loss is read).
    pub fn step(&mut self, loss: f32) {
        if self.losses.is_empty() {
            self.timed_from = Some(Instant::now());
        }
        self.losses.push(loss);
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
    use super::sparkline;

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
