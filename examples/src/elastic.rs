//! The PipeTransformer loop as far as it is built: a freeze policy drives the
//! pipeline's front through AutoFreeze (after every step and every epoch),
//! AutoPipe compresses the pipeline when the active units fit in fewer
//! stages, and the pipeline is repartitioned, weights and optimizer state
//! kept. (AutoDP, which would run more replicas on the freed devices,
//! belongs to `burn-elastic-dp`.)

use std::time::Instant;

use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_freeze::{
    AutoFreeze, AutodiffActivation, FreezeError, FreezePolicy, LayerStack, StackTypes,
};
use burn_pipe::{
    PipeError, PipelineConfig, balance_exact, compress, freeze_aware_costs, largest_stage,
    unit_param_costs,
};

use crate::backend::{self, Train};

/// What the loop needs to know beyond the stack and the policy.
#[derive(Debug, Clone)]
pub struct ElasticRun {
    /// Pipeline stages (devices) at the start.
    pub stages: usize,
    /// Micro-batches per step; `None` picks the paper's choice per K.
    pub micro_batches: Option<usize>,
    /// Epochs.
    pub epochs: usize,
    /// Optimizer steps per epoch.
    pub steps: usize,
    /// Adam learning rate.
    pub lr: f64,
}

/// Why the loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    /// The pipeline refused a configuration or a step failed.
    #[error(transparent)]
    Pipe(#[from] PipeError),
    /// The layers do not map onto the stack's units.
    #[error(transparent)]
    Freeze(#[from] FreezeError),
}

/// Forward cost of a frozen unit relative to its forward and backward.
const FROZEN_COST: f64 = 1.0 / 3.0;

/// Share of `labels` that the arg-max of `logits` gets right.
pub fn accuracy(logits: Tensor<backend::Inner, 2>, labels: Tensor<backend::Inner, 1, Int>) -> f64 {
    let samples = labels.dims()[0];
    let correct = logits
        .argmax(1)
        .flatten::<1>(0, 1)
        .equal(labels)
        .int()
        .sum()
        .into_scalar()
        .elem::<i64>();
    correct as f64 / samples as f64
}

/// Trains `stack` as a pipeline under the loop above, with `auto` moving the
/// front, printing one line per epoch with the accuracy on `held_out`, and
/// returns the trained stack. `batch(step)` gives the input and labels of
/// global step `step`.
pub fn train_elastic<S, P>(
    stack: LayerStack<S>,
    run: &ElasticRun,
    mut auto: AutoFreeze<P>,
    batch: impl Fn(usize) -> (S::Input, Tensor<Train, 1, Int>),
    held_out: (S::Input, Tensor<Train, 1, Int>),
    loss: impl Fn(S::Output, Tensor<Train, 1, Int>) -> Tensor<Train, 1> + Sync,
) -> Result<LayerStack<S>, ElasticError>
where
    S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
    P: FreezePolicy,
{
    let units = stack.num_units();
    let devices: Vec<_> = (0..run.stages).map(backend::device).collect();
    let costs = unit_param_costs(&stack);
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(run.micro_batches)
        .init(stack, devices.clone(), || AdamConfig::new().init())?;
    let initial_largest = largest_stage(&costs, &pipeline.balance());
    for epoch in 0..run.epochs {
        let start = Instant::now();
        let (mut total, mut bubble) = (0.0, 0.0);
        for step in 0..run.steps {
            let (input, labels) = batch(epoch * run.steps + step);
            let report = pipeline.train_step(input, labels, &loss, run.lr)?;
            total += report.loss;
            bubble += report.bubble_fraction();
            if auto.after_step(&mut pipeline)?.is_some() {
                compress_to_fit(&mut pipeline, &costs, initial_largest, &devices)?;
            }
        }
        let (input, labels) = held_out.clone();
        let held_out_accuracy = accuracy(pipeline.forward_inner(input.inner()), labels.inner());
        println!(
            "epoch {epoch}: mean loss {:.4}, held-out accuracy {:.1}%, frozen units {}/{units}, K={} {:?}, M={}, bubble {:.2}, {:.2}s",
            total / run.steps as f32,
            100.0 * held_out_accuracy,
            pipeline.front(),
            pipeline.num_stages(),
            pipeline.balance(),
            pipeline.config().micro_batches_for(pipeline.num_stages()),
            bubble / run.steps as f64,
            start.elapsed().as_secs_f64(),
        );
        if auto.after_epoch(&mut pipeline)?.is_some() {
            compress_to_fit(&mut pipeline, &costs, initial_largest, &devices)?;
        }
    }
    Ok(pipeline.into_layer_stack())
}

/// AutoPipe after the front moved: the fewest stages whose largest is no
/// larger than the initial pipeline's, balanced exactly.
fn compress_to_fit<S, O>(
    pipeline: &mut burn_pipe::Pipeline<S, O>,
    costs: &[f64],
    initial_largest: f64,
    devices: &[Device<backend::Inner>],
) -> Result<(), PipeError>
where
    S: StackTypes<Backend = Train>,
    O: burn::optim::Optimizer<burn_freeze::TrainableUnits<S>, Train>,
    O::Record: burn_freeze::ParamStates,
{
    let costs = freeze_aware_costs(costs, pipeline.front(), FROZEN_COST, false);
    let stages = compress(&costs, pipeline.num_stages(), initial_largest);
    let balance = balance_exact(&costs, stages);
    pipeline.repartition(&balance, devices[..stages].to_vec())
}
