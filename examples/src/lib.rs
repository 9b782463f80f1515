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
