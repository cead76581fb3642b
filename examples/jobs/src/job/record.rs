//! What a run records and who watches it: an [`EpochRecord`] per epoch, a
//! [`RunRecord`] per run, and the [`Observer`].

use burn_elastic_dp::EpochReport;
use serde::{Deserialize, Serialize};

/// One epoch: the trainer's report (for plain Burn, the same figures with
/// one stage, one replica, nothing frozen) and the accuracy after it.
///
/// The report's fields are flattened: in JSON an epoch reads as one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch's figures, as the trainer reports them.
    #[serde(flatten)]
    pub report: EpochReport,
    /// Held-out accuracy after it, in [0, 1] (NaN where nothing is held
    /// out, as in pretraining).
    pub accuracy: f64,
}

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// What ran.
    pub name: String,
    /// Its epochs.
    pub epochs: Vec<EpochRecord>,
    /// Training seconds over all epochs (evaluation excluded).
    pub seconds: f64,
    /// Held-out accuracy at the end.
    pub accuracy: f64,
}

impl RunRecord {
    /// Of [`seconds`](Self::seconds), what the trainer spent measuring
    /// before it trained (activations, unit costs, micro-batch times:
    /// [`EpochReport::profiling_seconds`](burn_elastic_dp::EpochReport::profiling_seconds)).
    pub fn profiling_seconds(&self) -> f64 {
        self.epochs.iter().map(|e| e.report.profiling_seconds).sum()
    }

    /// Of [`seconds`](Self::seconds), what the freeze rule spent on its
    /// evidence and decisions
    /// ([`EpochReport::rule_seconds`](burn_elastic_dp::EpochReport::rule_seconds)).
    pub fn rule_seconds(&self) -> f64 {
        self.epochs.iter().map(|e| e.report.rule_seconds).sum()
    }

    /// The run `name` of `epochs`: their seconds summed, the last one's
    /// accuracy (NaN without epochs).
    pub fn new(name: &str, epochs: Vec<EpochRecord>) -> Self {
        Self {
            name: name.to_string(),
            seconds: epochs.iter().map(|e| e.report.seconds).sum(),
            accuracy: epochs.last().map_or(f64::NAN, |e| e.accuracy),
            epochs,
        }
    }
}

/// What watches a run: told after each step and each epoch.
pub trait Observer {
    /// A run starts: `epochs` of `samples` samples.
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        let _ = (name, epochs, samples);
    }
    /// A step of `samples` samples ended with mean loss `loss`.
    fn step(&mut self, samples: usize, loss: f32) {
        let _ = (samples, loss);
    }
    /// An epoch ended.
    fn epoch(&mut self, record: &EpochRecord) {
        let _ = record;
    }
}

/// Watches nothing.
pub struct Silent;
impl Observer for Silent {}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> EpochReport {
        EpochReport {
            epoch: 2,
            steps: 8,
            samples: 256,
            loss: 1.25,
            seconds: 0.5,
            samples_per_second: 512.0,
            transition_seconds: 0.001,
            profiling_seconds: 0.0,
            rule_seconds: 0.0,
            all_reduce_seconds: 0.0,
            bubble_seconds: 0.0,
            frozen_layers: 3,
            front: 7,
            stages: 1,
            replicas: 4,
            total_replicas: 4,
            micro_batches: 1,
            balance: vec![11],
            transitions: Vec::new(),
            cache_hits: 256,
            cache_misses: 0,
        }
    }

    #[test]
    fn an_epoch_reads_as_one_flat_object_and_round_trips() {
        let record = EpochRecord {
            report: report(),
            accuracy: 0.75,
        };
        let json = serde_json::to_value(&record).unwrap();
        assert!(json.get("report").is_none(), "nested: {json}");
        assert_eq!(json["epoch"], 2);
        assert_eq!(json["front"], 7);
        assert_eq!(json["accuracy"], 0.75);
        let back: EpochRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back.report, record.report);
        assert_eq!(back.accuracy, 0.75);
    }

    #[test]
    fn a_run_sums_its_seconds_and_ends_with_its_last_accuracy() {
        let epoch = |accuracy| EpochRecord {
            report: report(),
            accuracy,
        };
        let run = RunRecord::new("r", vec![epoch(0.5), epoch(0.75)]);
        assert_eq!((run.seconds, run.accuracy), (1.0, 0.75));
        assert!(RunRecord::new("empty", Vec::new()).accuracy.is_nan());
    }
}
