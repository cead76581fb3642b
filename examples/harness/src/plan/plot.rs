//! PNG plots of `plan`: predicted against measured times, and speed-up
//! against GPU count.

use std::path::Path;

use plotters::prelude::*;

use super::PlanCliError;
use super::calibrate::Calibrated;

/// Registers the embedded font (`crate::plots`) as "sans-serif".
fn font() -> Result<(), PlanCliError> {
    crate::plots::fonts();
    Ok(())
}

fn plot_error(e: impl std::fmt::Display) -> PlanCliError {
    PlanCliError::Plot(e.to_string())
}

/// Predicted against measured seconds, one series per named group, with the
/// line of perfect prediction and the ±15% band.
pub fn predicted_vs_measured(
    path: &Path,
    series: &[(&str, &[Calibrated])],
) -> Result<(), PlanCliError> {
    font()?;
    let all: Vec<&Calibrated> = series.iter().flat_map(|(_, s)| s.iter()).collect();
    let hi = all
        .iter()
        .map(|c| c.predicted.max(c.measured))
        .fold(0.0, f64::max)
        * 1.15;
    let lo = all
        .iter()
        .map(|c| c.predicted.min(c.measured))
        .fold(f64::INFINITY, f64::min)
        / 1.15;
    let root = BitMapBackend::new(path, (900, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "plan: predicted vs measured on this machine (log-log)",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("measured seconds")
        .y_desc("predicted seconds")
        .x_label_formatter(&|v| format!("{v:.3}"))
        .y_label_formatter(&|v| format!("{v:.3}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(plot_error)?;
    for (factor, style, label) in [
        (1.0, BLACK.stroke_width(1), "predicted = measured"),
        (1.15, BLACK.mix(0.3).stroke_width(1), "±15%"),
        (1.0 / 1.15, BLACK.mix(0.3).stroke_width(1), ""),
    ] {
        let line = chart
            .draw_series(LineSeries::new(
                [(lo, lo * factor), (hi, hi * factor)],
                style,
            ))
            .map_err(plot_error)?;
        if !label.is_empty() {
            line.label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        }
    }
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (i, (name, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(
                points
                    .iter()
                    .map(|c| Circle::new((c.measured, c.predicted), 5, color.filled())),
            )
            .map_err(plot_error)?
            .label(*name)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)
}

/// Speed-up over the baseline against GPU count, one line per named series.
pub fn speedup_vs_gpus(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), PlanCliError> {
    font()?;
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.0))
        .collect();
    let x_lo = xs.iter().copied().fold(f64::INFINITY, f64::min) / 1.3;
    let x_hi = xs.iter().copied().fold(0.0, f64::max) * 1.3;
    let y_hi = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, (900, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..y_hi)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("GPUs (8 per node)")
        .y_desc("speed-up over pipeline + data parallel")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(plot_error)?;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (i, (name, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)
}
