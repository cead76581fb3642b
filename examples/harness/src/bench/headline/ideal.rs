//! The headline's cost model on profiled unit times: the ideal speed-up of
//! each freeze schedule and the modelled phases of (c).

use burn::data::dataloader::batcher::Batcher;
use burn_pipe::balance::UnitState;
use burn_pipe::{UnitCosts, UnitProfile, profile_units};

use crate::bench::BenchError;

use pipetransformer_jobs::backend;
use pipetransformer_jobs::job::{
    FINETUNE_CLASSES, JobModel, JobSpec, Pretrained, RunRecord, with_model,
};

/// Unit-profile repetitions (the fastest counts).
const PROFILE_REPEATS: usize = 5;

/// Each unit's forward and backward time on one global batch.
pub(super) fn profile(
    spec: &JobSpec,
    pretrained: &Pretrained,
) -> Result<Vec<UnitProfile>, BenchError> {
    let device = backend::device(0);
    let items: Vec<usize> = (0..spec.batch).collect();
    with_model!(pretrained, M, stack => {
        let (x, _) = M::task(FINETUNE_CLASSES, spec.task, spec.seed).batch(items, &device);
        profile_units(stack, x, &device, PROFILE_REPEATS).map_err(|e| BenchError::Run(e.to_string()))
    })
}

/// The front during each epoch of `run`: the one the epoch before ended
/// with (nothing frozen in epoch 0).
fn fronts_during(run: &RunRecord) -> Vec<usize> {
    std::iter::once(0)
        .chain(run.epochs.iter().map(|epoch| epoch.report.front))
        .take(run.epochs.len())
        .collect()
}

/// The cost model of one run, per epoch: (frozen forward, active forward
/// and backward), in seconds per global batch, by the one cost rule
/// ([`UnitCosts::cost`]): with the cache on, a unit frozen in an earlier
/// epoch is served from the cache and costs nothing.
pub(super) fn modelled(profile: &[UnitProfile], run: &RunRecord, cache: bool) -> Vec<(f64, f64)> {
    let costs = UnitCosts::from_profile(profile);
    costs
        .epoch_fronts(&fronts_during(run), cache)
        .into_iter()
        .map(|(front, cached)| {
            let (mut frozen, mut active) = (0.0, 0.0);
            for unit in 0..costs.len() {
                match UnitState::of(unit, front, cached) {
                    UnitState::Training => active += costs.cost(unit, UnitState::Training),
                    state => frozen += costs.cost(unit, state),
                }
            }
            (frozen, active)
        })
        .collect()
}

/// What the run's freeze schedule allows: every unit's forward and
/// backward in every epoch over the modelled work of its epochs
/// ([`UnitCosts::ideal_speedup`], the rule the planner and trainer use).
pub(super) fn ideal_speedup(profile: &[UnitProfile], run: &RunRecord, cache: bool) -> f64 {
    UnitCosts::from_profile(profile).ideal_speedup(&fronts_during(run), cache)
}
