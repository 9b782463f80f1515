//! Example programs live in this package; see the `[[example]]` targets. This library holds
//! what the training examples share.

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
        )
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

    /// `--dtype f32|f16|bf16`.
    pub fn parse_dtype(value: &str) -> Result<FloatDType, String> {
        match value {
            "f32" => Ok(FloatDType::F32),
            "f16" => Ok(FloatDType::F16),
            "bf16" => Ok(FloatDType::BF16),
            other => Err(format!("--dtype {other}: use f32, f16 or bf16")),
        }
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
}
