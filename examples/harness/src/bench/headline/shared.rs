//! What the headline's runs share: the progress lines, pretraining, and
//! (b*)'s search.

use std::time::Instant;

use super::configs::{self, DEVICES, Setting, strongest_base};
use crate::bench::BenchError;
use crate::strongest::{self, StepClock, Strongest, fits_without_budget};
use pipetransformer_jobs::job::{
    EpochRecord, JobError, JobSpec, Method, Observer, Pretrained, RunRecord,
};

/// Prints one line per epoch to stderr.
pub(super) struct Progress;

impl Observer for Progress {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        eprintln!("-- {name}: {epochs} epochs of {samples} samples");
    }
    fn epoch(&mut self, record: &EpochRecord) {
        // Pretraining has no held-out accuracy.
        let accuracy = if record.accuracy.is_nan() {
            "    -".to_string()
        } else {
            format!("{:>5.1}", 100.0 * record.accuracy)
        };
        let e = &record.report;
        eprintln!(
            "   epoch {:>2}: loss {:.4}  acc {accuracy}%  {:>7.2} s  {:>7.1} samples/s  F={} K={} R={}",
            e.epoch, e.loss, e.seconds, e.samples_per_second, e.frozen_layers, e.stages, e.replicas
        );
    }
}

pub(super) fn run_err<E: std::fmt::Display>(error: E) -> BenchError {
    BenchError::Run(error.to_string())
}

/// The pretrained model and the seconds pretraining took.
pub(super) fn pretrain(spec: &JobSpec) -> (Pretrained, f64) {
    let start = Instant::now();
    let pretrained = spec.pretrain_with(configs::pretraining(spec), &mut Progress);
    let pretrain_seconds = start.elapsed().as_secs_f64();
    println!(
        "pretrained in {pretrain_seconds:.0} s ({} epochs); {} parameters, {} units",
        spec.pretrain_epochs,
        pretrained.num_params(),
        pretrained.num_units()
    );
    (pretrained, pretrain_seconds)
}

/// (b*): each candidate fine-tuned for a few steps by `finetune` on
/// [`DEVICES`] devices in `setting` (a candidate whose stages exceed its
/// budget is refused by the trainer and skipped), the fastest per step;
/// printed.
pub(super) fn find_strongest(
    spec: &JobSpec,
    setting: &Setting,
    finetune: impl FnMut(&JobSpec, &Method, &mut StepClock) -> Result<RunRecord, JobError>,
) -> Result<Strongest, BenchError> {
    let base = strongest_base(setting);
    let found =
        strongest::find(spec, &base, DEVICES, fits_without_budget, finetune).map_err(run_err)?;
    println!("{}", found.summary());
    Ok(found)
}

/// [`find_strongest`] under a budget at which the model does not fit one
/// device: an error when (b*) still runs on one stage.
pub(super) fn find_pipelined(
    spec: &JobSpec,
    setting: &Setting,
    finetune: impl FnMut(&JobSpec, &Method, &mut StepClock) -> Result<RunRecord, JobError>,
) -> Result<Strongest, BenchError> {
    let found = find_strongest(spec, setting, finetune)?;
    if found.winner.stages < 2 {
        return Err(BenchError::Run(format!(
            "under the budget (b*) must pipeline, but K={} fit",
            found.winner.stages
        )));
    }
    Ok(found)
}
