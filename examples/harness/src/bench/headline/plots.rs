//! The headline's plots, drawn from its rows (also from a saved report).

use std::path::PathBuf;

use super::configs::{Group, SCHEDULE};
use super::rows::{Row, row_c};
use crate::bench::BenchError;
use crate::plots::{self, Bar, EpochMetric};
use pipetransformer_jobs::job::RunRecord;

fn run_err<E: std::fmt::Display>(error: E) -> BenchError {
    BenchError::Run(error.to_string())
}

/// Where the plots go: `target/bench/headline/` (under `CARGO_TARGET_DIR`
/// when set).
pub(super) fn plot_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("bench")
        .join("headline")
}

/// Draws the headline's plots from its rows: throughput, loss, accuracy,
/// (c)'s shape, the ablation and the alpha sweep; gives their paths.
pub(super) fn draw(rows: &[Row]) -> Result<Vec<PathBuf>, BenchError> {
    let dir = plot_dir();
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Write {
        path: dir.clone(),
        source,
    })?;
    let runs: Vec<RunRecord> = rows.iter().map(|r| r.run.clone()).collect();
    let headline: Vec<RunRecord> = rows
        .iter()
        .filter(|r| r.group == Group::Headline)
        .map(|r| r.run.clone())
        .collect();
    let (ablation, sweep) = bars(rows);
    let mut paths = vec![
        plots::per_epoch(&dir, &runs, EpochMetric::Throughput).map_err(run_err)?,
        plots::per_epoch(&dir, &headline, EpochMetric::Loss).map_err(run_err)?,
        plots::per_epoch(&dir, &runs, EpochMetric::Accuracy).map_err(run_err)?,
        plots::shape(&dir, &row_c(rows)?.run, "c").map_err(run_err)?,
    ];
    for (file, title, bars) in [
        (
            "ablation.png",
            "Ablation (alpha = 1/3): speed-up over (b), final accuracy",
            &ablation,
        ),
        (
            "alpha.png",
            "Alpha sweep: speed-up over (b), final accuracy",
            &sweep,
        ),
    ] {
        let path = dir.join(file);
        paths.push(
            plots::bar_chart(&path, title, "speed-up over (b)", bars, Some(1.0))
                .map_err(run_err)?,
        );
    }
    Ok(paths)
}

/// The ablation's and the alpha sweep's bars: speed-up over (b) and final
/// accuracy. (b) first, then the group's rows, (c) where the group puts
/// it: last in the ablation ("all four"), at 1/3 in the alpha sweep.
fn bars(rows: &[Row]) -> (Vec<Bar>, Vec<Bar>) {
    let bar = |r: &Row, name: &str| Bar {
        name: name.to_string(),
        value: r.speedup_vs_baseline,
        label: format!(
            "{:.2}x, {:.1}%",
            r.speedup_vs_baseline,
            100.0 * r.run.accuracy
        ),
    };
    let find = |key: &str| rows.iter().find(|r| r.key == key);
    let in_group = |group: Group| rows.iter().filter(move |r| r.group == group);
    let mut ablation: Vec<Bar> = find("b").map(|r| bar(r, "(b)")).into_iter().collect();
    ablation.extend(in_group(Group::Ablation).map(|r| bar(r, &r.key)));
    ablation.extend(find(SCHEDULE).map(|r| bar(r, "all four (a=1/3)")));
    let mut sweep: Vec<Bar> = find("b").map(|r| bar(r, "(b)")).into_iter().collect();
    let mut alphas: Vec<(f64, Bar)> = in_group(Group::Alpha)
        .map(|r| {
            let name = r.key.trim_start_matches("alpha=");
            (alpha_of(name), bar(r, name))
        })
        .chain(find(SCHEDULE).map(|r| (1.0 / 3.0, bar(r, "1/3 (paper)"))))
        .collect();
    alphas.sort_by(|x, y| x.0.total_cmp(&y.0));
    sweep.extend(alphas.into_iter().map(|(_, b)| b));
    (ablation, sweep)
}

/// The alpha of a sweep key such as "2/5".
fn alpha_of(name: &str) -> f64 {
    match name.split_once('/') {
        Some((n, d)) => n.parse::<f64>().unwrap_or(0.0) / d.parse::<f64>().unwrap_or(1.0),
        None => 0.0,
    }
}
