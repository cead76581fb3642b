//! The headline's results: a [`Row`] per configuration, the [`Phases`] of
//! (c), the [`Targets`], and the tables that print them.

use serde::{Deserialize, Serialize};

use super::configs::{Configuration, Group, STRONGEST, uses_cache};
use super::ideal::{ideal_speedup, modelled};
use crate::bench::BenchError;
use burn_pipe::UnitProfile;
use pipetransformer_jobs::job::{JobSpec, RunRecord};

/// One configuration's results.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Row {
    pub(super) key: String,
    pub(super) group: Group,
    pub(super) run: RunRecord,
    /// Peak heap during the run, above the level before it.
    pub(super) peak_bytes: Option<usize>,
    pub(super) speedup_vs_plain: f64,
    pub(super) speedup_vs_baseline: f64,
    /// What the freeze schedule allows (cost model); 1 for no freezing.
    pub(super) ideal_speedup: f64,
    /// Measured speed-up over (b) / ideal.
    pub(super) fraction_of_ideal_vs_baseline: f64,
    /// Measured speed-up over (a) / ideal.
    pub(super) fraction_of_ideal_vs_plain: f64,
    /// Final accuracy minus (b)'s, in points.
    pub(super) accuracy_delta_vs_baseline: f64,
    /// Final accuracy minus (a)'s, in points.
    pub(super) accuracy_delta_vs_plain: f64,
    /// Speed-up over (b*), the strongest configuration that freezes
    /// nothing (0 in reports written before (b*) existed).
    #[serde(default)]
    pub(super) speedup_vs_strongest: f64,
    /// Measured speed-up over (b*) / ideal.
    #[serde(default)]
    pub(super) fraction_of_ideal_vs_strongest: f64,
    /// Final accuracy minus (b*)'s, in points.
    #[serde(default)]
    pub(super) accuracy_delta_vs_strongest: f64,
}

/// The rows of `runs` (each with its peak heap), in the order of
/// `configurations`, whose first two are (a) and (b); (b*) is the one
/// keyed [`STRONGEST`] (without it, (b) stands in).
pub(super) fn rows(
    configurations: &[Configuration],
    runs: Vec<(RunRecord, Option<usize>)>,
    profile: &[UnitProfile],
) -> Vec<Row> {
    let (plain, baseline) = (runs[0].0.clone(), runs[1].0.clone());
    let strongest = configurations
        .iter()
        .position(|c| c.key == STRONGEST)
        .map_or_else(|| baseline.clone(), |i| runs[i].0.clone());
    configurations
        .iter()
        .zip(runs)
        .map(|(c, (run, peak))| {
            let ideal = ideal_speedup(profile, &run, uses_cache(&c.method));
            let vs_plain = plain.seconds / run.seconds;
            let vs_base = baseline.seconds / run.seconds;
            let vs_strongest = strongest.seconds / run.seconds;
            Row {
                key: c.key.to_string(),
                group: c.group,
                peak_bytes: peak,
                speedup_vs_plain: vs_plain,
                speedup_vs_baseline: vs_base,
                ideal_speedup: ideal,
                fraction_of_ideal_vs_baseline: vs_base / ideal,
                fraction_of_ideal_vs_plain: vs_plain / ideal,
                accuracy_delta_vs_baseline: 100.0 * (run.accuracy - baseline.accuracy),
                accuracy_delta_vs_plain: 100.0 * (run.accuracy - plain.accuracy),
                speedup_vs_strongest: vs_strongest,
                fraction_of_ideal_vs_strongest: vs_strongest / ideal,
                accuracy_delta_vs_strongest: 100.0 * (run.accuracy - strongest.accuracy),
                run,
            }
        })
        .collect()
}

/// Row (c), PipeTransformer with all four parts.
pub(super) fn row_c(rows: &[Row]) -> Result<&Row, BenchError> {
    rows.iter()
        .find(|r| r.key == "c")
        .ok_or_else(|| BenchError::Run("no row (c) in the results".into()))
}

fn mib(bytes: Option<usize>) -> String {
    bytes.map_or("-".into(), |b| {
        format!("{:.1}", b as f64 / (1 << 20) as f64)
    })
}

/// The main table: a line per configuration.
pub(super) fn print_rows(rows: &[Row], spec: &JobSpec) {
    println!(
        "{:<36} {:>8} {:>7} {:>9} {:>7} {:>7} {:>8} {:>6} {:>7} {:>7} {:>9} {:>6} {:>6} {:>7}",
        "configuration",
        "wall s",
        "prof. s",
        "samples/s",
        "vs (a)",
        "vs (b)",
        "vs (b*)",
        "ideal",
        "of id.",
        "peak MiB",
        "acc %",
        "d(a)",
        "d(b)",
        "d(b*)"
    );
    for row in rows {
        let r = &row.run;
        println!(
            "{:<36} {:>8.1} {:>7.2} {:>9.1} {:>6.2}x {:>6.2}x {:>7.2}x {:>5.2}x {:>6.0}% {:>8} {:>9.2} {:>+6.2} {:>+6.2} {:>+7.2}",
            r.name,
            r.seconds,
            r.profiling_seconds(),
            (spec.samples * spec.epochs) as f64 / r.seconds,
            row.speedup_vs_plain,
            row.speedup_vs_baseline,
            row.speedup_vs_strongest,
            row.ideal_speedup,
            100.0 * row.fraction_of_ideal_vs_strongest,
            mib(row.peak_bytes),
            100.0 * r.accuracy,
            row.accuracy_delta_vs_plain,
            row.accuracy_delta_vs_baseline,
            row.accuracy_delta_vs_strongest,
        );
    }
    println!(
        "(wall s: training seconds, evaluation excluded; prof. s: of which the trainer measured before training (activations for the budget; unit costs and micro-batch times where profiled), paid inside the timed epochs by every configuration that measures; vs: speed-up in wall time; ideal: the freeze schedule's cost model; of id.: speed-up vs (b*) / ideal; d: accuracy points vs (a), (b), (b*); (b*): the fastest configuration that freezes nothing, measured)"
    );
}

/// Samples/s per epoch of every row, and (c)'s F/K/R per epoch.
pub(super) fn print_epochs(rows: &[Row], c: &Row) {
    println!("samples/s per epoch:");
    for row in rows {
        let per: Vec<String> = row
            .run
            .epochs
            .iter()
            .map(|e| format!("{:.0}", e.report.samples_per_second))
            .collect();
        println!("  {:<30} {}", row.run.name, per.join(" "));
    }
    println!("(c) F/K/R per epoch (at its end):");
    let shape: Vec<String> = c
        .run
        .epochs
        .iter()
        .map(|e| {
            let e = &e.report;
            format!("{}/{}/{}", e.frozen_layers, e.stages, e.replicas)
        })
        .collect();
    println!("  {}", shape.join(" "));
}

/// One epoch of (c), split by phase (seconds).
#[derive(Debug, Serialize)]
pub(super) struct Phases {
    epoch: usize,
    wall: f64,
    /// Modelled: frozen units' forward for the samples whose prefix ran.
    frozen_forward_model: f64,
    /// Modelled: active units' forward and backward.
    active_model: f64,
    /// Measured: all-reduce (slowest replica, per step, summed).
    all_reduce: f64,
    /// Measured: transitions (freeze, repartition, resize).
    transitions: f64,
    /// Measured: stage idle time (see `EpochReport::bubble_seconds`).
    bubble: f64,
    /// Wall minus the rest: cache reads, batching, optimizer steps, threads
    /// and channels, and the model's error (negative when the stages ran in
    /// parallel on more than one core).
    other: f64,
    cache_hits: u64,
    cache_misses: u64,
}

impl Phases {
    /// The seconds of the table's columns, wall first.
    fn seconds(&self) -> [f64; 7] {
        [
            self.wall,
            self.frozen_forward_model,
            self.active_model,
            self.all_reduce,
            self.transitions,
            self.bubble,
            self.other,
        ]
    }
}

/// The per-phase breakdown of `run` (with AutoCache), the modelled phases
/// from `profile`.
pub(super) fn breakdown(profile: &[UnitProfile], run: &RunRecord, spec: &JobSpec) -> Vec<Phases> {
    let batches = spec.samples as f64 / spec.batch as f64;
    modelled(profile, run, true)
        .into_iter()
        .zip(&run.epochs)
        .map(|((frozen, active), e)| {
            let e = &e.report;
            let frozen_forward_model = frozen * batches;
            let active_model = active * batches;
            let all_reduce = e.all_reduce_seconds * e.steps as f64;
            let other = e.seconds
                - frozen_forward_model
                - active_model
                - all_reduce
                - e.transition_seconds
                - e.bubble_seconds;
            Phases {
                epoch: e.epoch,
                wall: e.seconds,
                frozen_forward_model,
                active_model,
                all_reduce,
                transitions: e.transition_seconds,
                bubble: e.bubble_seconds,
                other,
                cache_hits: e.cache_hits,
                cache_misses: e.cache_misses,
            }
        })
        .collect()
}

/// The breakdown's table, a line per epoch and their sums.
pub(super) fn print_breakdown(breakdown: &[Phases]) {
    println!(
        "(c) per-phase breakdown, seconds (frozen fwd and active fwd+bwd modelled from the unit profile; all-reduce, transitions, bubble measured; other = the rest):"
    );
    println!(
        "  {:>5} {:>8} {:>10} {:>10} {:>10} {:>11} {:>8} {:>8} {:>7} {:>7}",
        "epoch",
        "wall",
        "frozen fwd",
        "active f+b",
        "all-reduce",
        "transitions",
        "bubble",
        "other",
        "hits",
        "misses"
    );
    let mut total = [0.0f64; 7];
    for p in breakdown {
        let [wall, frozen, active, all_reduce, transitions, bubble, other] = p.seconds();
        println!(
            "  {:>5} {wall:>8.2} {frozen:>10.2} {active:>10.2} {all_reduce:>10.2} {transitions:>11.2} {bubble:>8.2} {other:>8.2} {:>7} {:>7}",
            p.epoch, p.cache_hits, p.cache_misses
        );
        for (t, v) in total.iter_mut().zip(p.seconds()) {
            *t += v;
        }
    }
    let [wall, frozen, active, all_reduce, transitions, bubble, other] = total;
    println!(
        "  {:>5} {wall:>8.2} {frozen:>10.2} {active:>10.2} {all_reduce:>10.2} {transitions:>11.2} {bubble:>8.2} {other:>8.2}",
        "all"
    );
}

/// The goals for (c) in the memory-bound setting: against the paper's
/// (b), and against (b*).
#[derive(Debug, Serialize)]
pub(super) struct Targets {
    speedup_vs_baseline_4x: bool,
    accuracy_within_half_point_of_baseline: bool,
    fraction_of_ideal_85_percent: bool,
    speedup_vs_strongest_3x: bool,
    accuracy_within_half_point_of_strongest: bool,
    fraction_of_ideal_vs_strongest_85_percent: bool,
}

impl Targets {
    /// Which goals row (c) meets.
    pub(super) fn of(c: &Row) -> Self {
        Self {
            speedup_vs_baseline_4x: c.speedup_vs_baseline >= 4.0,
            accuracy_within_half_point_of_baseline: c.accuracy_delta_vs_baseline >= -0.5,
            fraction_of_ideal_85_percent: c.fraction_of_ideal_vs_baseline >= 0.85,
            speedup_vs_strongest_3x: c.speedup_vs_strongest >= 3.0,
            accuracy_within_half_point_of_strongest: c.accuracy_delta_vs_strongest >= -0.5,
            fraction_of_ideal_vs_strongest_85_percent: c.fraction_of_ideal_vs_strongest >= 0.85,
        }
    }

    /// Two lines, against (b) and against (b*): each goal met or missed,
    /// with (c)'s figure.
    pub(super) fn print(&self, c: &Row) {
        println!(
            "targets for (c): >= 4x vs (b): {} ({:.2}x); accuracy >= (b) - 0.5 pt: {} ({:+.2} pt); >= 85% of ideal: {} ({:.0}% of {:.2}x vs (b); {:.0}% vs (a), {:.2}x)",
            yes(self.speedup_vs_baseline_4x),
            c.speedup_vs_baseline,
            yes(self.accuracy_within_half_point_of_baseline),
            c.accuracy_delta_vs_baseline,
            yes(self.fraction_of_ideal_85_percent),
            100.0 * c.fraction_of_ideal_vs_baseline,
            c.ideal_speedup,
            100.0 * c.fraction_of_ideal_vs_plain,
            c.speedup_vs_plain
        );
        println!(
            "targets for (c) against (b*): >= 3x vs (b*): {} ({:.2}x); accuracy >= (b*) - 0.5 pt: {} ({:+.2} pt); >= 85% of ideal: {} ({:.0}% of {:.2}x vs (b*))",
            yes(self.speedup_vs_strongest_3x),
            c.speedup_vs_strongest,
            yes(self.accuracy_within_half_point_of_strongest),
            c.accuracy_delta_vs_strongest,
            yes(self.fraction_of_ideal_vs_strongest_85_percent),
            100.0 * c.fraction_of_ideal_vs_strongest,
            c.ideal_speedup,
        );
    }
}

fn yes(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of a report written before (b*) existed, as `--replot` reads it.
    const OLD_ROW: &str = r#"{"key":"c","group":"Headline",
        "run":{"name":"(c)","epochs":[],"seconds":2.0,"accuracy":0.9},
        "peak_bytes":null,"speedup_vs_plain":3.0,"speedup_vs_baseline":2.0,
        "ideal_speedup":4.0,"fraction_of_ideal_vs_baseline":0.5,
        "fraction_of_ideal_vs_plain":0.75,"accuracy_delta_vs_baseline":0.1,
        "accuracy_delta_vs_plain":-0.2}"#;

    #[test]
    fn a_row_saved_before_the_strongest_baseline_still_loads() {
        let row: Row = serde_json::from_str(OLD_ROW).unwrap();
        assert_eq!(row.speedup_vs_baseline, 2.0);
        assert_eq!(row.speedup_vs_strongest, 0.0);
        let json = serde_json::to_value(&row).unwrap();
        assert!(json.get("speedup_vs_strongest").is_some());
    }
}
