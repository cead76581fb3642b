//! The per-epoch PipeTransformer schedule and its predicted time: the freeze front, the shape from
//! the trainer's shape rule, the cache, and each epoch's steps simulated, the all-reduce costed.

use crate::pipetransformer::plan::config::PlanConfig;
use crate::pipetransformer::plan::error::{PlanError, check};
use crate::pipetransformer::plan::model::ModelSpec;
use crate::pipetransformer::plan::outcome::{EpochPlan, EpochTime, Plan};
use crate::pipetransformer::plan::step::{Layout, simulate_step};
use crate::pipetransformer::plan::transition::transition_cost;
use crate::pipetransformer::shape::{PipelineShape, ShapeRule, StartError};
use crate::sampler::BatchPolicy;

/// Plans every epoch of `config` on `model`, and the baseline. Each
/// epoch's shape comes from the trainer's shape rule ([`ShapeRule::start`],
/// then [`ShapeRule::after_move`] whenever the front moves, and
/// [`ShapeRule::micro_batches`] for M), on the units' costs under
/// [`PlanConfig::costs`]. The time of each epoch is split into compute,
/// bubble, all-reduce and transitions; the baseline is pipeline plus data
/// parallel, nothing frozen.
///
/// It uses the rules the real code uses, in the trainer's vocabulary
/// ([`FreezeRule`](crate::FreezeRule), [`Parts`](crate::Parts),
/// [`LayerSpec`](crate::LayerSpec), [`CostModel`](crate::CostModel)):
/// burn-freeze's freeze schedule and layer map, the trainer's shape rule
/// ([`ShapeRule`]) on burn-pipe's one cost rule
/// ([`burn_pipe::UnitCosts`]), burn-pipe's micro-batch count and schedule
/// (`stage_ops`), and the replica group's all-reduce (per tensor or
/// bucketed, burn-collective's ring, tree and centralized strategies,
/// locally then across nodes).
///
/// ```
/// use burn_elastic_dp::{BatchPolicy, FreezeRule, LayerSpec};
/// use burn_elastic_dp::plan::{ClusterConfig, Link, ModelSpec, PlanConfig, UnitSpec, plan};
///
/// let unit = |name: String| UnitSpec {
///     name, forward: 1e-3, backward: 2e-3, forward_fixed: 0.0, backward_fixed: 0.0,
///     measured: vec![], activation_bytes: 1 << 12, saved_bytes: 0, param_tensors: vec![1 << 20],
/// };
/// let model = ModelSpec {
///     model: "toy".into(), source: "made up".into(),
///     layers: LayerSpec::Uniform { offset: 1, per_layer: 2, layers: 4 },
///     units: (0..10).map(|u| unit(format!("unit {u}"))).collect(),
/// };
/// let link = Link::new(10e9, 1e-5);
/// let config = PlanConfig::new(
///     ClusterConfig::new(4, 1, link, link), BatchPolicy::PerReplica { batch: 64 }, 6400, 4,
///     FreezeRule::AlphaSchedule { alpha: 0.5 },
/// )
/// .with_stages(Some(4)); // the paper's start; `None`: the fewest stages that fit
/// let plan = plan(&config, &model).unwrap();
/// assert_eq!(plan.epochs[0].stages, 4);
/// assert!(plan.epochs.last().unwrap().replicas > 1);
/// assert!(plan.speedup() > 1.0);
/// ```
pub fn plan(config: &PlanConfig, model: &ModelSpec) -> Result<Plan, PlanError> {
    config.validate(model)?;
    Ok(Plan {
        epochs: run(config, model, false)?,
        baseline: run(config, model, true)?,
        micro_batches_measured: config.micro_batches.is_none()
            && config.micro_batch_times.is_some(),
    })
}

/// The epochs of PipeTransformer, or of the baseline (nothing frozen).
fn run(
    config: &PlanConfig,
    model: &ModelSpec,
    baseline: bool,
) -> Result<Vec<EpochPlan>, PlanError> {
    let map = model.layer_map()?;
    // Every node runs the shape rule on its own devices, in lockstep (as
    // the trainer's MPI ranks do): a pipeline stays within a node, and the
    // run holds `nodes` times one node's replicas.
    // The trainer's shape rule: its start (memory-aware AutoPipe, or the
    // paper's fixed start), the shape after each move and M for each shape.
    let mut rule = ShapeRule::new(
        config.shape_settings(),
        model.unit_costs(config.costs),
        model.unit_memory(),
    );
    rule.set_micro_batch_times(config.micro_batch_times.clone());
    let mut shape = rule
        .start()
        .map_err(|error| PlanError::Invalid(start_message(&error)))?;
    let mut epochs: Vec<EpochPlan> = Vec::with_capacity(config.epochs);
    for epoch in 0..config.epochs {
        let previous = epochs.last();
        let frozen_layers = if baseline {
            0
        } else {
            config.front(map.num_layers(), epoch)
        };
        let front = map.unit_front(frozen_layers);
        // The trainer reshapes when the front moves, at once.
        let front_before = previous.map_or(0, |p| p.front);
        if frozen_layers > previous.map_or(0, |p| p.frozen_layers) {
            shape = rule
                .after_move((front_before, front), &shape)
                .map_err(|error| PlanError::Invalid(start_message(&error)))?;
        }
        let cached = config.parts.cache && front > 0;
        let at = EpochFront {
            epoch,
            frozen_layers,
            front,
            cached,
        };
        let replicas = shape.replicas * config.cluster.nodes;
        let micro_batches = rule.micro_batches(&shape, front, replicas).count;
        epochs.push(plan_epoch(
            config,
            model,
            &shape,
            at,
            micro_batches,
            previous,
        )?);
    }
    Ok(epochs)
}

/// Where an epoch's freeze front stands.
struct EpochFront {
    epoch: usize,
    frozen_layers: usize,
    front: usize,
    cached: bool,
}

/// One epoch at `shape` (this node's), after `previous`: its batch, steps,
/// simulated step and transition.
fn plan_epoch(
    config: &PlanConfig,
    model: &ModelSpec,
    shape: &PipelineShape,
    at: EpochFront,
    micro_batches: usize,
    previous: Option<&EpochPlan>,
) -> Result<EpochPlan, PlanError> {
    let EpochFront {
        epoch,
        frozen_layers,
        front,
        cached,
    } = at;
    let nodes = config.cluster.nodes;
    let (stages, replicas) = (shape.stages(), shape.replicas * nodes);
    let (replica_batch, global_batch) = match config.batch {
        BatchPolicy::PerReplica { batch } => (batch, batch * replicas),
        BatchPolicy::FixedGlobal { batch } => (batch / replicas, batch),
    };
    check(replica_batch >= micro_batches, || {
        format!(
            "epoch {epoch}: {replicas} replicas get {replica_batch} samples each per step, fewer than the {micro_batches} micro-batches of K={stages}: raise the batch (at least {}) or lower the micro-batches",
            micro_batches * replicas
        )
    })?;
    let steps = config.samples.div_ceil(global_batch);
    // The cache holds the previous epoch's frozen output when it was
    // cached then; the first cached epoch computes the prefix to fill it.
    let cache_front = match previous {
        Some(p) if cached && p.cached => p.front,
        _ => 0,
    };
    let layout = Layout {
        stages,
        replicas,
        balance: &shape.balance,
        front,
        cache_front,
        cached,
        micro_batch: replica_batch as f64 / micro_batches as f64,
        micro_batches,
    };
    let (step, bubble_fraction) = simulate_step(config, model, &layout)?;
    let transition = match previous {
        None => 0.0,
        Some(p) => transition_cost(config, model, p, &shape.with_replicas(replicas), front),
    };
    Ok(EpochPlan {
        epoch,
        frozen_layers,
        front,
        cached,
        stages,
        balance: shape.balance.clone(),
        replicas,
        micro_batches,
        replica_batch,
        steps,
        step,
        bubble_fraction,
        time: EpochTime {
            steps: step.scaled(steps as f64),
            transition,
        },
    })
}

/// The planner's message for a start that does not fit (the trainer's
/// `TrainerError::DoesNotFit` and `StageDoesNotFit` say the same).
fn start_message(error: &StartError) -> String {
    match error {
        StartError::NoFit(no) if no.alone => format!(
            "unit {} alone needs {} bytes but a device holds {}: no pipeline of up to {} stages fits",
            no.unit, no.needed, no.budget, no.stages
        ),
        StartError::NoFit(no) => format!(
            "the stage starting at unit {} needs {} bytes but a device holds {}: no pipeline of up to {} stages fits",
            no.unit, no.needed, no.budget, no.stages
        ),
        StartError::StageOver(over) => format!(
            "stage {} of the {}-stage start needs {} bytes but a device holds {}",
            over.stage, over.stages, over.needed, over.budget
        ),
    }
}
