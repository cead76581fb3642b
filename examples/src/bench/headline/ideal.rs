//! The headline's cost model on unit times profiled once: what each
//! freeze schedule allows (the "ideal" speed-up) and the modelled phases
//! of the per-phase breakdown.

use burn::data::dataloader::batcher::Batcher;
use burn_pipe::{UnitProfile, profile_units};

use crate::backend;
use crate::job::{FINETUNE_CLASSES, JobModel, JobSpec, Pretrained, RunRecord, with_model};

/// Unit-profile repetitions (the fastest counts).
const PROFILE_REPEATS: usize = 5;

/// Each unit's forward and backward time on one global batch.
pub(super) fn profile(spec: &JobSpec, pretrained: &Pretrained) -> Vec<UnitProfile> {
    let device = backend::device(0);
    let items: Vec<usize> = (0..spec.batch).collect();
    with_model!(pretrained, M, stack => {
        let (x, _) = M::task(FINETUNE_CLASSES, spec.seed).batch(items, &device);
        profile_units(stack, x, &device, PROFILE_REPEATS)
    })
}

/// The cost model of one run, per epoch: (frozen forward, active forward
/// and backward), in seconds per global batch. The front during epoch `T`
/// is the one epoch `T - 1` ended with.
pub(super) fn modelled(profile: &[UnitProfile], run: &RunRecord, cache: bool) -> Vec<(f64, f64)> {
    let fwd: Vec<f64> = profile.iter().map(|p| p.forward.as_secs_f64()).collect();
    let both: Vec<f64> = profile.iter().map(|p| p.cost(false, false)).collect();
    let units = profile.len();
    let mut previous = 0;
    run.epochs
        .iter()
        .enumerate()
        .map(|(t, _)| {
            let front = if t == 0 {
                0
            } else {
                run.epochs[t - 1].report.front
            };
            let front = front.min(units);
            // `+ 0.0`: an empty f64 sum is -0.0.
            let frozen: f64 = 0.0
                + if cache {
                    fwd[previous.min(front)..front].iter().sum::<f64>()
                } else {
                    fwd[..front].iter().sum::<f64>()
                };
            previous = front;
            (frozen, both[front..].iter().sum())
        })
        .collect()
}

/// What the run's freeze schedule allows: every unit's forward and
/// backward in every epoch over the modelled work of its epochs.
pub(super) fn ideal_speedup(profile: &[UnitProfile], run: &RunRecord, cache: bool) -> f64 {
    let full: f64 = profile.iter().map(|p| p.cost(false, false)).sum();
    let work: f64 = modelled(profile, run, cache)
        .iter()
        .map(|(f, a)| f + a)
        .sum();
    full * run.epochs.len() as f64 / work
}
