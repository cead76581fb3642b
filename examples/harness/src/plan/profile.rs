//! Costs measured on this backend: each unit's forward and backward and its
//! frozen forward, fitted as a fixed plus a per-sample time.

use burn_elastic_dp::plan::{MeasuredPass, ModelSpec, UnitSpec};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::Device;
use burn::tensor::backend::Backend;
use burn_freeze::{LayerStack, StackTypes};
use burn_pipe::{UnitProfile, profile_units};
use models::synthetic::{BandImages, MajorityTokens};

use super::presets::{Shape, on_each_batch};
use crate::bench::median;
use pipetransformer_jobs::backend::{self, Train};

/// Least-squares `fixed + per_sample * b` through `(b, seconds)` points,
/// both parts kept at or above 0.
///
/// ```
/// let (fixed, per) = pipetransformer_harness::plan::profile::fit_linear(&[(2.0, 3.0), (8.0, 6.0), (32.0, 18.0)]);
/// assert!((fixed - 2.0).abs() < 1e-9 && (per - 0.5).abs() < 1e-9);
/// ```
pub fn fit_linear(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mean_b = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_t = points.iter().map(|p| p.1).sum::<f64>() / n;
    let var = points.iter().map(|p| (p.0 - mean_b).powi(2)).sum::<f64>();
    let cov = points
        .iter()
        .map(|p| (p.0 - mean_b) * (p.1 - mean_t))
        .sum::<f64>();
    let slope = if var > 0.0 { cov / var } else { 0.0 };
    if slope <= 0.0 {
        return (mean_t.max(0.0), 0.0);
    }
    let fixed = mean_t - slope * mean_b;
    if fixed < 0.0 {
        // Through the origin instead.
        let sbb = points.iter().map(|p| p.0 * p.0).sum::<f64>();
        let sbt = points.iter().map(|p| p.0 * p.1).sum::<f64>();
        return (0.0, sbt / sbb);
    }
    (fixed, slope)
}

/// The median per unit and pass of `repeats` profiles (at least 1), after
/// one warm-up run; the median, as the benchmarks report, rather than the
/// fastest, which a shared machine makes optimistic.
fn median_profile(run: impl Fn() -> Vec<UnitProfile>, repeats: usize) -> Vec<UnitProfile> {
    let _ = run();
    let runs: Vec<Vec<UnitProfile>> = (0..repeats.max(1)).map(|_| run()).collect();
    let median = |mut v: Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    (0..runs[0].len())
        .map(|u| UnitProfile {
            forward: median(runs.iter().map(|r| r[u].forward).collect()),
            backward: median(runs.iter().map(|r| r[u].backward).collect()),
        })
        .collect()
}

/// Median seconds of each unit's forward on the inner backend, as a frozen
/// unit runs (made inner once, as burn-freeze does when it freezes), over
/// `repeats` runs after a warm-up.
fn frozen_forwards<S: StackTypes>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
    repeats: usize,
) -> Vec<f64> {
    use burn::module::AutodiffModule;
    use burn::tensor::backend::Backend;
    use burn_freeze::{AutodiffActivation, Unit};
    type Inner<S> =
        <<S as StackTypes>::Backend as burn::tensor::backend::AutodiffBackend>::InnerBackend;
    let first = stack.first().valid();
    let middle: Vec<_> = stack.middle().iter().map(|u| u.valid()).collect();
    let last = stack.last().valid();
    let sync = || <Inner<S> as Backend>::sync(device).expect("device sync");
    let run = || {
        let mut times = Vec::with_capacity(middle.len() + 2);
        sync();
        let start = Instant::now();
        let mut hidden = S::First::forward_inner(&first, input.clone().inner());
        sync();
        times.push(start.elapsed().as_secs_f64());
        for unit in &middle {
            let start = Instant::now();
            hidden = S::Middle::forward_inner(unit, hidden);
            sync();
            times.push(start.elapsed().as_secs_f64());
        }
        let start = Instant::now();
        let _ = S::Last::forward_inner(&last, hidden);
        sync();
        times.push(start.elapsed().as_secs_f64());
        times
    };
    let _ = run();
    let runs: Vec<Vec<f64>> = (0..repeats.max(1)).map(|_| run()).collect();
    (0..runs[0].len())
        .map(|u| {
            let mut v: Vec<f64> = runs.iter().map(|r| r[u]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect()
}

/// Profiles every unit of `shape` on this backend at each of `batches`
/// (the median of `repeats` runs each), keeps those times (interpolated
/// between batch sizes) and a fit of fixed plus per-sample time; parameter tensors and activation sizes come from the
/// shape (4-byte values).
pub fn profile(shape: &Shape, batches: &[usize], repeats: usize) -> ModelSpec {
    let mut batches = batches.to_vec();
    batches.sort_unstable();
    batches.dedup();
    let batches = &batches[..];
    let profiles = on_each_batch!(shape, batches, |stack, input, device, batch| (
        batch,
        median_profile(
            || profile_units(&stack, input.clone(), &device, 1)
                .unwrap_or_else(|e| panic!("profiling: {e}")),
            repeats
        ),
        frozen_forwards(&stack, input, &device, repeats),
    ));
    let units = shape
        .units()
        .into_iter()
        .enumerate()
        .map(|(i, u)| {
            let points = |pass: fn(&UnitProfile) -> f64| -> Vec<(f64, f64)> {
                profiles
                    .iter()
                    .map(|(b, p, _)| (*b as f64, pass(&p[i])))
                    .collect()
            };
            let (forward_fixed, forward) = fit_linear(&points(|p| p.forward.as_secs_f64()));
            let (backward_fixed, backward) = fit_linear(&points(|p| p.backward.as_secs_f64()));
            UnitSpec {
                name: u.name,
                forward,
                backward,
                forward_fixed,
                backward_fixed,
                measured: profiles
                    .iter()
                    .map(|(b, p, frozen)| MeasuredPass {
                        batch: *b,
                        forward: p[i].forward.as_secs_f64(),
                        backward: p[i].backward.as_secs_f64(),
                        frozen_forward: Some(frozen[i]),
                    })
                    .collect(),
                activation_bytes: u.output_elems * 4,
                saved_bytes: 0,
                param_tensors: u.tensors.iter().map(|n| n * 4).collect(),
            }
        })
        .collect();
    ModelSpec {
        model: shape.describe(),
        source: format!(
            "profiled on {} at batches {batches:?} (median of {repeats} after a warm-up), fitted as fixed + per-sample time",
            backend::NAME
        ),
        layers: shape.layer_spec(),
        units,
    }
}

/// What a step of the main job costs outside the pipeline's passes,
/// measured on this backend.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StepCosts {
    /// Seconds of an Adam step per parameter tensor (burn's optimizer
    /// updates each tensor with a handful of small operations).
    pub optimizer_per_tensor: f64,
    /// Seconds to generate one batch of the job's synthetic data.
    pub data: f64,
    /// Seconds per parameter tensor to collect one micro-batch's gradients
    /// and add them to the accumulated ones (what burn-pipe's stages do
    /// after every backward pass).
    pub accumulate_per_tensor: f64,
}

/// Median seconds of an optimizer step of `model`, and of collecting and
/// accumulating one set of its gradients, over `repeats` steps after a
/// warm-up; `backward` runs a backward pass.
fn time_steps<M: AutodiffModule<Train>>(
    mut model: M,
    backward: impl Fn(&M) -> <Train as burn::tensor::backend::AutodiffBackend>::Gradients,
    repeats: usize,
    device: &burn::tensor::Device<Train>,
) -> (f64, f64) {
    let mut optim = AdamConfig::new().init::<Train, M>();
    let mut accumulator = burn::optim::GradientsAccumulator::<M>::new();
    let (mut steps, mut accumulates) = (Vec::new(), Vec::new());
    for _ in 0..=repeats {
        let mut raw = backward(&model);
        <Train as Backend>::sync(device).expect("device sync");
        let start = Instant::now();
        let g = GradientsParams::from_module(&mut raw, &model);
        accumulator.accumulate(&model, g);
        <Train as Backend>::sync(device).expect("device sync");
        accumulates.push(start.elapsed().as_secs_f64());
        let g = accumulator.grads();
        let start = Instant::now();
        model = optim.step(1e-3, model, g);
        <Train as Backend>::sync(device).expect("device sync");
        steps.push(start.elapsed().as_secs_f64());
    }
    (
        median(steps[1..].to_vec()),
        median(accumulates[1..].to_vec()),
    )
}

/// Times `repeats` Adam steps on the whole model of `shape` (median, per
/// parameter tensor) and the job's data generation for `batch` samples.
pub fn step_costs(shape: &Shape, batch: usize, repeats: usize) -> StepCosts {
    let device = backend::device(0);
    let tensors: usize = shape.units().iter().map(|u| u.tensors.len()).sum();
    let loss = CrossEntropyLossConfig::new().init(&device);
    let repeats = repeats.max(1);
    // Median seconds to make batch `i` of the job's data.
    let data_time = |make: &dyn Fn(usize)| {
        median(
            (0..repeats)
                .map(|i| {
                    let start = Instant::now();
                    make(i);
                    start.elapsed().as_secs_f64()
                })
                .collect(),
        )
    };
    // The optimizer step and data of one model and its task (a macro: the
    // models and tasks are of different types).
    macro_rules! timed {
        ($task:expr, $model:expr) => {{
            let task = $task;
            let (x, y) = task.batch::<Train>(0, batch, &device);
            let step = time_steps(
                $model,
                |m| loss.forward(m.forward(x.clone()), y.clone()).backward(),
                repeats,
                &device,
            );
            (
                step,
                data_time(&|i| drop(task.batch::<Train>(i, batch, &device))),
            )
        }};
    }
    let ((step, accumulate), data) = match shape {
        Shape::Vit(c) => timed!(
            BandImages::new(c.num_classes, c.channels, c.image_size, 7),
            c.init::<Train>(&device)
        ),
        Shape::Bert(c, seq) => timed!(
            MajorityTokens::new(c.vocab_size, *seq, *seq, 7),
            c.init::<Train>(&device)
        ),
    };
    StepCosts {
        optimizer_per_tensor: step / tensors as f64,
        data,
        accumulate_per_tensor: accumulate / tensors as f64,
    }
}
