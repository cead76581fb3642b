//! What `train` prints: a progress bar per run, a line per epoch, and the
//! summary table at the end.

use indicatif::{ProgressBar, ProgressStyle};
use pipetransformer_jobs::job::{EpochRecord, Observer, RunRecord};

/// Progress bars for steps, and a line per epoch.
pub(crate) struct Console {
    bar: Option<ProgressBar>,
    /// Whether the F/K/R legend was printed.
    explained: bool,
    /// Units of the model (the front's denominator).
    units: usize,
}

impl Observer for Console {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        let bar = ProgressBar::new((epochs * samples) as u64).with_style(
            ProgressStyle::with_template("{prefix:>14} {bar:30} {pos}/{len} samples, {msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(name.to_string());
        self.bar = Some(bar);
    }

    fn step(&mut self, samples: usize, loss: f32) {
        if let Some(bar) = &self.bar {
            bar.inc(samples as u64);
            bar.set_message(format!("loss {loss:.4}"));
        }
    }

    fn epoch(&mut self, record: &EpochRecord) {
        let explain = !self.explained && record.report.stages * record.report.replicas > 1;
        let line = epoch_line(record, self.units);
        let print = || {
            if explain {
                println!(
                    "  (F = frozen layers of the model, K = pipeline stages, R = data-parallel replicas of the pipeline, M = micro-batches per replica and step, balance = units per stage; the frozen layers' outputs are cached, so later epochs skip them)"
                );
            }
            println!("{line}");
        };
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
        self.explained |= explain;
    }
}

impl Console {
    /// A console for a model of `units` units that explains F, K, R, M
    /// before the first epoch that runs on more than one device.
    pub(crate) fn new(units: usize) -> Self {
        Self {
            bar: None,
            explained: false,
            units,
        }
    }

    /// Clears the progress bar of the run that ended.
    pub(crate) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn epoch_line(record: &EpochRecord, units: usize) -> String {
    let accuracy = if record.accuracy.is_nan() {
        String::new()
    } else {
        format!(", accuracy {:.1}%", 100.0 * record.accuracy)
    };
    format!(
        "  epoch {}: loss {:.4}{accuracy}, {:.0} samples/s ({:.2}s); F={} (front {}/{units} units) K={} R={} M={} balance {:?}{}",
        record.report.epoch,
        record.report.loss,
        record.report.samples_per_second,
        record.report.seconds,
        record.report.frozen_layers,
        record.report.front,
        record.report.stages,
        record.report.total_replicas.max(record.report.replicas),
        record.report.micro_batches,
        record.report.balance,
        if record.report.transition_seconds > 0.0 {
            format!(
                ", transitions {:.1} ms",
                1e3 * record.report.transition_seconds
            )
        } else {
            String::new()
        }
    )
}

/// Records pretraining epochs for the metrics.
pub(crate) struct Pretraining {
    console: Console,
    epochs: Vec<EpochRecord>,
}

impl Pretraining {
    /// Nothing recorded yet.
    pub(crate) fn new() -> Self {
        Self {
            console: Console {
                bar: None,
                explained: true,
                units: 0,
            },
            epochs: Vec::new(),
        }
    }

    /// The pretraining run (no accuracy: nothing is held out), its bar
    /// cleared.
    pub(crate) fn finish(mut self) -> RunRecord {
        self.console.finish();
        RunRecord::new("pretraining", self.epochs)
    }
}

impl Observer for Pretraining {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        self.console.start(name, epochs, samples);
    }
    fn step(&mut self, samples: usize, loss: f32) {
        self.console.step(samples, loss);
    }
    fn epoch(&mut self, record: &EpochRecord) {
        let line = format!(
            "  epoch {}: loss {:.4}, {:.0} samples/s ({:.2}s)",
            record.report.epoch,
            record.report.loss,
            record.report.samples_per_second,
            record.report.seconds
        );
        match &self.console.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
        self.epochs.push(record.clone());
    }
}

/// The summary table: a row per run, the speed-up against plain Burn and
/// against (b*) (the run named `strongest`) where they ran, then
/// PipeTransformer's speed-ups and accuracy changes against both.
pub(crate) fn print_summary(runs: &[RunRecord], samples: usize, strongest: Option<&str>) {
    let seconds_of = |name: &str| runs.iter().find(|r| r.name == name).map(|r| r.seconds);
    let plain = seconds_of("plain Burn");
    let best = strongest.and_then(seconds_of);
    let vs = |base: Option<f64>, run: &RunRecord| {
        base.map_or("-".into(), |b| format!("{:.2}x", b / run.seconds))
    };
    println!();
    println!(
        "{:<16} {:>9} {:>10} {:>12} {:>9} {:>13} {:>14}",
        "run", "accuracy", "train s", "samples/s", "vs plain", "vs strongest", "final F/K/R"
    );
    for run in runs {
        // A resumed run that had nothing left to train has no epoch: no
        // figure to show.
        if run.epochs.is_empty() {
            println!("{:<16} nothing left to train", run.name);
            continue;
        }
        let shape = run.epochs.last().map_or("-".into(), |last| {
            let last = &last.report;
            format!(
                "{}/{}/{}",
                last.frozen_layers,
                last.stages,
                last.total_replicas.max(last.replicas)
            )
        });
        let done = (run.epochs.len() * samples) as f64;
        println!(
            "{:<16} {:>8.1}% {:>10.2} {:>12.0} {:>9} {:>13} {:>14}",
            run.name,
            100.0 * run.accuracy,
            run.seconds,
            done / run.seconds,
            vs(plain, run),
            vs(best, run),
            shape,
        );
    }
    let Some(pipe) = runs
        .iter()
        .find(|r| r.name == "PipeTransformer" && !r.epochs.is_empty())
    else {
        return;
    };
    let against = |name: &str, what: &str| {
        if let Some(base) = runs.iter().find(|r| r.name == name && !r.epochs.is_empty()) {
            println!(
                "PipeTransformer against {what}: {:.2}x the speed, accuracy {:+.1} points",
                base.seconds / pipe.seconds,
                100.0 * (pipe.accuracy - base.accuracy)
            );
        }
    };
    against("plain Burn", "plain Burn (one device)");
    if let Some(name) = strongest {
        against(
            name,
            &format!("{name}, the fastest configuration that freezes nothing on the same devices"),
        );
    }
}
