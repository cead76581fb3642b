//! One task's results: per configuration the final accuracy and training
//! time over the seeds, the time to accuracy, the first seed's epochs; the
//! table.

use burn_elastic_dp::FreezeRule;
use serde::Serialize;

use super::super::configs::{Configuration, STRONGEST};
use super::super::real_rows::Spread;
use super::tta::{TimeToAccuracy, speedup_at_equal_accuracy, target_of};
use crate::bench::BenchError;
use pipetransformer_jobs::job::{EpochRecord, Method, RunRecord};

/// One epoch of the first seed's run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct EpochLine {
    epoch: usize,
    /// Frozen layers (F) at its end.
    frozen_layers: usize,
    /// The freeze front, in units, at its end.
    front: usize,
    /// Pipeline stages (K) and replicas (R) it trained on.
    stages: usize,
    replicas: usize,
    /// Mean training loss.
    loss: f64,
    /// Held-out accuracy after it, in percent.
    accuracy_percent: f64,
    /// Training seconds (evaluation excluded).
    seconds: f64,
}

impl EpochLine {
    fn of(record: &EpochRecord) -> Self {
        let r = &record.report;
        Self {
            epoch: r.epoch,
            frozen_layers: r.frozen_layers,
            front: r.front,
            stages: r.stages,
            replicas: r.replicas,
            loss: r.loss,
            accuracy_percent: 100.0 * record.accuracy,
            seconds: r.seconds,
        }
    }
}

/// One configuration of a task over the seeds.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ConfigSummary {
    /// `bstar`, `alpha`, `default`.
    pub(super) key: String,
    pub(super) name: String,
    /// The freeze rule (`None`: (b*) freezes nothing).
    freeze: Option<FreezeRule>,
    /// Held-out accuracy after the last epoch, in percent.
    pub(super) final_accuracy_percent: Spread,
    /// Training seconds of the whole run (evaluation excluded).
    train_seconds: Spread,
    /// Of the training seconds, the share the freeze rule spent on its
    /// evidence and decisions (held-out passes, statistics, update gains;
    /// [`EpochReport::rule_seconds`](burn_elastic_dp::EpochReport::rule_seconds)),
    /// in percent, mean over the seeds.
    rule_percent: f64,
    /// Final mean accuracy minus (b*)'s, in points.
    pub(super) accuracy_delta_vs_strongest: f64,
    /// (b*)'s mean training seconds / this one's, whole runs.
    full_run_speedup: f64,
    /// Training seconds until the target ((b*)'s final mean - 0.5 points).
    time_to_accuracy: TimeToAccuracy,
    /// (b*)'s time to accuracy / this one's (`None`: either never).
    pub(super) speedup_at_equal_accuracy: Option<f64>,
    /// The first seed's epochs: front, loss, accuracy.
    first_seed_epochs: Vec<EpochLine>,
    /// Every seed's run, in the order of the seeds.
    runs: Vec<RunRecord>,
}

impl ConfigSummary {
    /// The time-to-accuracy target, in percent (the same in every row).
    pub(super) fn target_percent(&self) -> f64 {
        self.time_to_accuracy.target_percent
    }
}

/// Per epoch of `run`: its training seconds and accuracy in percent.
fn epoch_points(run: &RunRecord) -> Vec<(f64, f64)> {
    run.epochs
        .iter()
        .map(|e| (e.report.seconds, 100.0 * e.accuracy))
        .collect()
}

/// The summaries of `runs` (per configuration, one run per seed), in the
/// order of `configurations`; the target and speed-ups against (b*)'s row.
pub(super) fn summaries(
    configurations: &[Configuration],
    runs: Vec<Vec<RunRecord>>,
) -> Result<Vec<ConfigSummary>, BenchError> {
    let spreads: Vec<(Spread, Spread)> = runs
        .iter()
        .map(|runs| {
            let accuracy: Vec<f64> = runs.iter().map(|r| 100.0 * r.accuracy).collect();
            let seconds: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
            Spread::of(&accuracy).zip(Spread::of(&seconds))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| BenchError::Run("a configuration has no run".into()))?;
    let strongest = configurations
        .iter()
        .position(|c| c.key == STRONGEST)
        .ok_or_else(|| BenchError::Run("no (b*) among the configurations".into()))?;
    let (strongest_accuracy, strongest_seconds) = spreads[strongest];
    let target = target_of(strongest_accuracy.mean);
    let ttas: Vec<TimeToAccuracy> = runs
        .iter()
        .map(|runs| {
            let points: Vec<Vec<(f64, f64)>> = runs.iter().map(epoch_points).collect();
            TimeToAccuracy::of(&points, target)
        })
        .collect();
    Ok(configurations
        .iter()
        .zip(runs)
        .zip(spreads)
        .zip(&ttas)
        .map(|(((c, runs), (accuracy, seconds)), tta)| ConfigSummary {
            key: c.key.to_string(),
            name: c.name.clone(),
            freeze: match &c.method {
                Method::Trainer { config, .. } if config.parts.freeze => {
                    Some(config.freeze.clone())
                }
                _ => None,
            },
            final_accuracy_percent: accuracy,
            train_seconds: seconds,
            rule_percent: 100.0 * runs.iter().map(RunRecord::rule_seconds).sum::<f64>()
                / runs
                    .iter()
                    .map(|r| r.seconds)
                    .sum::<f64>()
                    .max(f64::MIN_POSITIVE),
            accuracy_delta_vs_strongest: accuracy.mean - strongest_accuracy.mean,
            full_run_speedup: strongest_seconds.mean / seconds.mean,
            time_to_accuracy: tta.clone(),
            speedup_at_equal_accuracy: speedup_at_equal_accuracy(&ttas[strongest], tta),
            first_seed_epochs: runs
                .first()
                .map(|run| run.epochs.iter().map(EpochLine::of).collect())
                .unwrap_or_default(),
            runs,
        })
        .collect())
}

/// The table of one task: a line per configuration, then the first seed's
/// epochs of each (`seed`: the first seed).
pub(super) fn print_table(summaries: &[ConfigSummary], seed: u64) {
    let seeds = summaries.first().map_or(0, |s| s.runs.len());
    let target = summaries
        .first()
        .map_or(f64::NAN, ConfigSummary::target_percent);
    println!(
        "{:<28} {:>7} {:>15} {:>8} {:>15} {:>6} {:>13} {:>9} {:>9} {:>7}",
        "configuration",
        "final %",
        "(min..max)",
        "train s",
        "(min..max)",
        "rule %",
        "to target s",
        "x @ acc",
        "x run",
        "d(b*)"
    );
    for s in summaries {
        let (a, t) = (s.final_accuracy_percent, s.train_seconds);
        println!(
            "{:<28} {:>7.2} {:>15} {:>8.1} {:>15} {:>6.1} {:>13} {:>9} {:>8.2}x {:>+7.2}",
            s.name,
            a.mean,
            format!("({:.2}..{:.2})", a.min, a.max),
            t.mean,
            format!("({:.1}..{:.1})", t.min, t.max),
            s.rule_percent,
            s.time_to_accuracy.display(),
            s.speedup_at_equal_accuracy
                .map_or("-".to_string(), |x| format!("{x:.2}x")),
            s.full_run_speedup,
            s.accuracy_delta_vs_strongest,
        );
    }
    println!(
        "(over {seeds} seed(s): final %: held-out accuracy after the last epoch, mean and range; train s: training seconds, evaluation excluded; rule %: of them, the freeze rule's evidence and decisions; to target s: training seconds until the held-out accuracy first reaches {target:.2}% = (b*)'s final mean - 0.5 pt, mean over the seeds, never (k/n) where a seed never reaches it; x @ acc: speed-up at equal accuracy, (b*)'s time to target / this one's; x run: whole-run speed-up over (b*); d(b*): final mean - (b*)'s, points)"
    );
    println!("seed {seed}, per epoch: F frozen layers / front (units), loss, accuracy %:");
    for s in summaries {
        let epochs: Vec<String> = s
            .first_seed_epochs
            .iter()
            .map(|e| {
                format!(
                    "{}/{} {:.3} {:.1}",
                    e.frozen_layers, e.front, e.loss, e.accuracy_percent
                )
            })
            .collect();
        println!("  {:<26} {}", s.name, epochs.join(" | "));
    }
}
