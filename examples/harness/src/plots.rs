//! PNG plots of fine-tuning runs (per-epoch curves, a run's shape, bars), one
//! file each, in the DejaVu Sans embedded from `examples/harness/assets`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use burn_elastic_dp::EpochReport;

use pipetransformer_jobs::job::{EpochRecord, RunRecord};

/// DejaVu Sans (Bitstream Vera licence, `examples/harness/assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 600;

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {message}")]
pub struct PlotError {
    /// The PNG's path.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// One named curve: (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// One named bar with a value and a label printed above it.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Name under the bar.
    pub name: String,
    /// Height.
    pub value: f64,
    /// Text above the bar (e.g. "2.1x, 97.0%").
    pub label: String,
}

/// Registers the embedded font as "sans-serif" (once per process).
pub fn fonts() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // The embedded font parses; registration cannot fail on it.
        let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn fail(path: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |message| PlotError {
        path: path.to_path_buf(),
        message,
    }
}

fn palette(i: usize) -> RGBColor {
    const COLOURS: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    COLOURS[i % COLOURS.len()]
}

fn span(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-9);
    (lo - pad, hi + pad)
}

/// A tick label: up to 3 decimals, trailing zeros dropped.
fn tick(v: f64) -> String {
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

/// `series` with each y replaced by its log10 (non-positive values left
/// out).
fn log10_series(series: &[Series]) -> Vec<Series> {
    series
        .iter()
        .map(|s| Series {
            name: s.name.clone(),
            points: s
                .points
                .iter()
                .filter(|p| p.1 > 0.0)
                .map(|&(x, y)| (x, y.log10()))
                .collect(),
        })
        .collect()
}

/// A y tick label: on a log axis (`log_y`, `y` the log10) the value itself.
fn y_tick(y: f64, log_y: bool) -> String {
    if log_y {
        let v = 10f64.powf(y);
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    } else {
        tick(y)
    }
}

/// Draws `series` as lines with markers, one colour each, with a legend;
/// with `log_y` the y axis is logarithmic (non-positive values are left
/// out); the legend goes where `legend` says (where the curves are not).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
    legend: SeriesLabelPosition,
) -> Result<PathBuf, PlotError> {
    fonts();
    let err = fail(path);
    // A log axis is drawn as log10 of the values, labelled with the values.
    let logged: Vec<Series>;
    let series = if log_y {
        logged = log10_series(series);
        &logged[..]
    } else {
        series
    };
    let y_tick = |y: &f64| y_tick(*y, log_y);
    let (x0, x1) = span(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (y0, y1) = span(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&y_tick)
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, s) in series.iter().enumerate() {
        let colour = palette(i);
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| p.1.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, colour.filled())),
            )
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(path.to_path_buf())
}

/// Draws `bars` side by side, each with its label above it; a dashed line
/// marks `reference` (e.g. 1.0 for "as fast as the baseline") when given.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    bars: &[Bar],
    reference: Option<f64>,
) -> Result<PathBuf, PlotError> {
    fonts();
    let err = fail(path);
    let top = bars
        .iter()
        .map(|b| b.value)
        .chain(reference)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.2;
    let top = if top > 0.0 { top } else { 1.0 };
    let n = bars.len().max(1);
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let names: Vec<String> = bars.iter().map(|b| b.name.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0.0f64..top)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .y_label_formatter(&|y| tick(*y))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let x = i as f64;
            Rectangle::new(
                [(x - 0.35, 0.0), (x + 0.35, b.value.max(0.0))],
                palette(i).filled(),
            )
        }))
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                b.label.clone(),
                (i as f64 - 0.3, b.value.max(0.0) + top * 0.02),
                ("sans-serif", 15),
            )
        }))
        .map_err(|e| err(e.to_string()))?;
    if let Some(r) = reference {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(-0.5, r), (n as f64 - 0.5, r)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(path.to_path_buf())
}

/// A figure of each epoch that [`per_epoch`] draws, one curve per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochMetric {
    /// Samples per second (log scale: frozen, cached epochs run orders of
    /// magnitude faster), as `throughput.png`.
    Throughput,
    /// Mean training loss, as `loss.png`.
    Loss,
    /// Held-out accuracy (%) after the epoch, as `accuracy.png`.
    Accuracy,
}

impl EpochMetric {
    /// Every metric, in the order the binaries draw them.
    pub const ALL: [Self; 3] = [Self::Throughput, Self::Loss, Self::Accuracy];

    /// (file, title, y label, log scale, legend position).
    fn chart(
        self,
    ) -> (
        &'static str,
        &'static str,
        &'static str,
        bool,
        SeriesLabelPosition,
    ) {
        use SeriesLabelPosition::{LowerRight, UpperLeft, UpperRight};
        match self {
            Self::Throughput => (
                "throughput.png",
                "Training throughput per epoch",
                "samples/s (log scale)",
                true,
                UpperLeft,
            ),
            Self::Loss => (
                "loss.png",
                "Training loss per epoch",
                "mean loss",
                false,
                UpperRight,
            ),
            Self::Accuracy => (
                "accuracy.png",
                "Held-out accuracy per epoch",
                "accuracy (%)",
                false,
                LowerRight,
            ),
        }
    }

    fn value(self, epoch: &EpochRecord) -> f64 {
        match self {
            Self::Throughput => epoch.report.samples_per_second,
            Self::Loss => epoch.report.loss,
            Self::Accuracy => 100.0 * epoch.accuracy,
        }
    }
}

/// `metric` per epoch, one curve per run, as its PNG in `dir`.
pub fn per_epoch(
    dir: &Path,
    runs: &[RunRecord],
    metric: EpochMetric,
) -> Result<PathBuf, PlotError> {
    let (file, title, y_label, log_scale, legend) = metric.chart();
    let series: Vec<Series> = runs
        .iter()
        .map(|run| Series {
            name: run.name.clone(),
            points: run
                .epochs
                .iter()
                .map(|e| (e.report.epoch as f64, metric.value(e)))
                .collect(),
        })
        .collect();
    line_chart(
        &dir.join(file),
        title,
        "epoch",
        y_label,
        &series,
        log_scale,
        legend,
    )
}

/// A run's shape at the end of each epoch: frozen layers F, stages K and
/// replicas R, as `shape-<file>.png`.
pub fn shape(dir: &Path, run: &RunRecord, file: &str) -> Result<PathBuf, PlotError> {
    let one = |name: &str, f: &dyn Fn(&EpochReport) -> f64| Series {
        name: name.into(),
        points: run
            .epochs
            .iter()
            .map(|e| (e.report.epoch as f64, f(&e.report)))
            .collect(),
    };
    line_chart(
        &dir.join(format!("shape-{file}.png")),
        &format!("{}: F, K, R at the end of each epoch", run.name),
        "epoch",
        "count",
        &[
            one("F (frozen layers)", &|e| e.frozen_layers as f64),
            one("K (stages)", &|e| e.stages as f64),
            one("R (replicas)", &|e| e.total_replicas.max(e.replicas) as f64),
        ],
        false,
        SeriesLabelPosition::MiddleRight,
    )
}
