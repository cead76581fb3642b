//! The PipeTransformer loop as far as it is built: each epoch, AutoFreeze's
//! alpha schedule moves the freeze front, AutoPipe compresses the pipeline
//! when the active units fit in fewer stages, and the pipeline is
//! repartitioned, weights and optimizer state kept. (AutoDP, which would run
//! more replicas on the freed devices, belongs to `burn-elastic-dp` and is
//! not built yet.)

use std::time::Instant;

use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_freeze::{
    Activation, AutodiffActivation, Differentiable, FreezeError, LayerMap, LayerStack, Unit,
    alpha_front,
};
use burn_pipe::{
    PipeError, Pipeline, PipelineConfig, balance_exact, compress, freeze_aware_costs,
    largest_stage, unit_param_costs,
};

use crate::backend::{self, Train};

/// What the loop needs to know beyond the stack.
#[derive(Debug, Clone)]
pub struct ElasticRun {
    /// Pipeline stages (devices) at the start.
    pub stages: usize,
    /// Micro-batches per step; `None` picks the paper's choice per K.
    pub micro_batches: Option<usize>,
    /// Freeze with the alpha schedule `ceil(L (1 - (1 - alpha)^epoch))`.
    pub freeze_alpha: Option<f64>,
    /// Transformer layers of the model (two units each, after unit 0).
    pub layers: usize,
    /// Epochs and optimizer steps per epoch.
    pub epochs: usize,
    /// Steps per epoch.
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

/// Trains `stack` as a pipeline under the loop above, printing one line per
/// epoch with the accuracy on `held_out`, and returns the trained stack.
/// `batch(step)` gives the input and labels of global step `step`.
pub fn train_elastic<F, M, L>(
    stack: LayerStack<F, M, L>,
    run: &ElasticRun,
    batch: impl Fn(usize) -> (F::Input, Tensor<Train, 1, Int>),
    held_out: (F::Input, Tensor<Train, 1, Int>),
    loss: impl Fn(L::Output, Tensor<Train, 1, Int>) -> Tensor<Train, 1> + Sync,
) -> Result<LayerStack<F, M, L>, ElasticError>
where
    F: Unit<Train>,
    F::Output: Differentiable<Train>,
    M: Unit<Train, Input = F::Output, Output = F::Output>,
    L: Unit<Train, Input = F::Output, Output = Tensor<Train, 2>>,
    F::Input: Activation<Train>,
{
    let units = stack.len();
    let devices: Vec<_> = (0..run.stages).map(backend::device).collect();
    let costs = unit_param_costs::<Train, F, M, L>(&stack);
    let layer_map = LayerMap::uniform(1, 2, run.layers, units)?;
    let config = PipelineConfig::new().with_micro_batches(run.micro_batches);
    let mut pipeline =
        Pipeline::balanced(stack, devices.clone(), config, || AdamConfig::new().init())?;
    let initial_largest = largest_stage(&costs, &pipeline.balance());
    for epoch in 0..run.epochs {
        if let Some(alpha) = run.freeze_alpha {
            // The head (the last unit) always trains.
            let front = layer_map
                .unit_front(alpha_front(run.layers, alpha, epoch))
                .min(units - 1);
            if front > pipeline.front() {
                pipeline.freeze_to(front)?;
                let costs = freeze_aware_costs(&costs, front, FROZEN_COST, false);
                let stages = compress(&costs, pipeline.num_stages(), initial_largest);
                let balance = balance_exact(&costs, stages);
                pipeline.repartition(&balance, devices[..stages].to_vec())?;
            }
        }
        let start = Instant::now();
        let (mut total, mut bubble) = (0.0, 0.0);
        for step in 0..run.steps {
            let (input, labels) = batch(epoch * run.steps + step);
            let report = pipeline.train_step(input, labels, &loss, run.lr)?;
            total += report.loss;
            bubble += report.bubble_fraction();
        }
        let (input, labels) = held_out.clone();
        let predicted = pipeline
            .forward_inner(input.inner())
            .argmax(1)
            .flatten::<1>(0, 1);
        let correct = predicted
            .equal(labels.inner())
            .int()
            .sum()
            .into_scalar()
            .elem::<i64>();
        println!(
            "epoch {epoch}: mean loss {:.4}, held-out accuracy {:.1}%, frozen units {}/{units}, K={} {:?}, M={}, bubble {:.2}, {:.2}s",
            total / run.steps as f32,
            100.0 * correct as f64 / held_out.1.dims()[0] as f64,
            pipeline.front(),
            pipeline.num_stages(),
            pipeline.balance(),
            pipeline.config().micro_batches_for(pipeline.num_stages()),
            bubble / run.steps as f64,
            start.elapsed().as_secs_f64(),
        );
    }
    Ok(pipeline.into_stack())
}
