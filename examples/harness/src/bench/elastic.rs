//! `bench elastic`: replicas of a pipeline (step time at (K, R), the
//! all-reduce per tensor against bucketed) and the group's transitions.

use std::time::{Duration, Instant};

use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{AllReduce, ReplicaConfig, ReplicaGroup};
use burn_freeze::{IntoLayerStack, LayerStack, ParamStates, StackTypes, TrainableUnits};
use burn_pipe::PipelineConfig;
use models::bert::{BertConfig, BertTypes};
use models::synthetic::MajorityTokens;
use serde::Serialize;

use super::{BenchError, median, write_report};
use pipetransformer_jobs::backend::{self, Inner, Train};

#[derive(Debug, Serialize)]
struct StepRow {
    batch: usize,
    stages: usize,
    replicas: usize,
    all_reduce: String,
    step_ms: f64,
    ratio_to_single: f64,
    all_reduce_ms: f64,
    all_reduce_share: f64,
    all_reduce_gb_per_s: f64,
}

#[derive(Debug, Serialize)]
struct TransitionRow {
    transition: String,
    ms: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    step_model: String,
    batches: Vec<usize>,
    /// The batch the all-reduce's share is judged at (the main job's).
    job_batch: usize,
    /// The all-reduce's share of the step at K=1, R=2 and `job_batch`, in
    /// the faster mode.
    job_all_reduce_share: f64,
    repetitions: usize,
    gradient_bytes: usize,
    steps: Vec<StepRow>,
    transition_model: String,
    transitions: Vec<TransitionRow>,
}

fn run_err<E: std::fmt::Display>(error: E) -> BenchError {
    BenchError::Run(error.to_string())
}

fn group<S, O>(
    stack: &LayerStack<S>,
    stages: usize,
    replicas: usize,
    all_reduce: AllReduce,
    make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
) -> Result<ReplicaGroup<S, O>, BenchError>
where
    S: StackTypes<Backend = Train>,
    O: burn::optim::Optimizer<TrainableUnits<S>, Train> + 'static,
    O::Record: ParamStates,
{
    let devices = (0..replicas)
        .map(|r| {
            (0..stages)
                .map(|s| backend::device(r * stages + s))
                .collect()
        })
        .collect();
    ReplicaConfig::new()
        .with_pipeline(PipelineConfig::new().with_micro_batches(Some(2)))
        .with_all_reduce(all_reduce)
        .init(stack.clone(), devices, make_optimizer)
        .map_err(run_err)
}

/// The main job's global batch (`train --batch-size`'s default): the step
/// against which the all-reduce's share is judged.
const JOB_BATCH: usize = 32;

/// The bucketed all-reduce's mode (25 MiB buckets).
const BUCKETED: AllReduce = AllReduce::Bucketed {
    bucket_bytes: 25 << 20,
};

/// Runs the elastic benchmark.
pub fn run(quick: bool) -> Result<(), BenchError> {
    let device = backend::device(0);
    // A tiny batch (where the all-reduce weighs most) and the main job's.
    let (batches, reps) = if quick {
        (vec![8, JOB_BATCH], 3)
    } else {
        (vec![8, 16, JOB_BATCH, 64], 7)
    };
    let config = BertConfig::minilm_l6_h384(2).with_dropout(0.0);
    let task = MajorityTokens::new(64, 12, 24, 5);
    let stack = config.init::<Train>(&device).into_layer_stack();
    // Read the weights once (Burn initialises them lazily).
    let _ = stack.forward(task.batch::<Train>(0, 1, &device).0);
    let params: usize = stack.unit_params().iter().sum();
    let gradient_bytes = params * std::mem::size_of::<f32>();
    let step_model = format!(
        "BERT MiniLM-L6-H384 ({} M parameters, {} units; sequences of 12-24 tokens)",
        params / 1_000_000,
        stack.num_units()
    );
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    println!(
        "bench elastic ({}; backend {}; {step_model}; global batches {batches:?}; median of {reps}; ratios against K=1, R=1 at the same batch in this run)",
        if quick { "quick" } else { "full" },
        backend::NAME
    );
    println!(
        "{:>5} {:>2} {:>2} {:<22} {:>9} {:>6} {:>12} {:>7} {:>9}",
        "batch", "K", "R", "all-reduce", "step ms", "ratio", "all-red. ms", "share", "GB/s"
    );
    let bench = StepBench {
        stack: &stack,
        task: &task,
        loss_fn: &loss_fn,
        device: &device,
        reps,
        gradient_bytes,
    };
    let mut steps = Vec::new();
    for &batch in &batches {
        bench.at_batch(batch, &mut steps)?;
    }
    let job_share = print_job_share(&steps);
    let (transition_model, transitions) = measure_transitions(&task, &loss_fn, &device)?;
    let report = Report {
        bench: "elastic",
        backend: backend::NAME,
        quick,
        step_model,
        batches,
        job_batch: JOB_BATCH,
        job_all_reduce_share: job_share,
        repetitions: reps,
        gradient_bytes,
        steps,
        transition_model,
        transitions,
    };
    let path = write_report("elastic", &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// What the step rows are measured on: the MiniLM-sized model and its task.
struct StepBench<'a> {
    stack: &'a LayerStack<BertTypes<Train>>,
    task: &'a MajorityTokens,
    loss_fn: &'a CrossEntropyLoss<Train>,
    device: &'a Device<Train>,
    reps: usize,
    gradient_bytes: usize,
}

impl StepBench<'_> {
    /// Measures and prints the rows of one global batch, (K, R) in (1, 1),
    /// (2, 1), (1, 2) per tensor and (1, 2) bucketed, each against the first.
    fn at_batch(&self, batch: usize, steps: &mut Vec<StepRow>) -> Result<(), BenchError> {
        let mut single_ms = None;
        for (stages, replicas, all_reduce) in [
            (1, 1, AllReduce::PerTensor),
            (2, 1, AllReduce::PerTensor),
            (1, 2, AllReduce::PerTensor),
            (1, 2, BUCKETED),
        ] {
            let (walls, reduces) = self.time_steps(batch, stages, replicas, all_reduce)?;
            let step_ms = median(walls) * 1e3;
            let single = *single_ms.get_or_insert(step_ms);
            let all_reduce_ms = if replicas > 1 {
                median(reduces) * 1e3
            } else {
                0.0
            };
            let row = StepRow {
                batch,
                stages,
                replicas,
                all_reduce: if replicas > 1 {
                    format!("{all_reduce:?}")
                } else {
                    "none".into()
                },
                step_ms,
                ratio_to_single: step_ms / single,
                all_reduce_ms,
                all_reduce_share: all_reduce_ms / step_ms,
                all_reduce_gb_per_s: if all_reduce_ms > 0.0 {
                    self.gradient_bytes as f64 / (all_reduce_ms * 1e-3) / 1e9
                } else {
                    0.0
                },
            };
            print_step_row(&row);
            steps.push(row);
        }
        Ok(())
    }

    /// Seconds of each timed step (after one warm-up) of a group at
    /// (`stages`, `replicas`), and of each step's all-reduce.
    fn time_steps(
        &self,
        batch: usize,
        stages: usize,
        replicas: usize,
        all_reduce: AllReduce,
    ) -> Result<(Vec<f64>, Vec<f64>), BenchError> {
        let device = self.device;
        let mut group = group(self.stack, stages, replicas, all_reduce, || {
            AdamConfig::new().init()
        })?;
        let mut walls = Vec::new();
        let mut reduces = Vec::new();
        for rep in 0..=self.reps {
            let (input, labels) = self.task.batch::<Train>(rep, batch, device);
            let report = group
                .train_step(input, labels, cross_entropy(self.loss_fn), 1e-4)
                .map_err(run_err)?;
            Inner::sync(device).map_err(|e| run_err(format!("{e:?}")))?;
            if rep > 0 {
                walls.push(report.wall.as_secs_f64());
                // The replica that finished its pass last waited for no
                // one: its all-reduce time is the collective's own cost.
                let own = report
                    .all_reduce
                    .iter()
                    .min()
                    .copied()
                    .unwrap_or(Duration::ZERO);
                reduces.push(own.as_secs_f64());
            }
        }
        drop(group);
        Ok((walls, reduces))
    }
}

/// Prints one row of the step table.
fn print_step_row(row: &StepRow) {
    println!(
        "{:>5} {:>2} {:>2} {:<22} {:>9.1} {:>6.2} {:>12.2} {:>6.1}% {:>9.2}",
        row.batch,
        row.stages,
        row.replicas,
        if row.all_reduce.starts_with("Bucketed") {
            "Bucketed (25 MiB)"
        } else {
            &row.all_reduce
        },
        row.step_ms,
        row.ratio_to_single,
        row.all_reduce_ms,
        100.0 * row.all_reduce_share,
        row.all_reduce_gb_per_s
    );
}

/// Prints and returns the all-reduce's share of the step at K=1, R=2 and
/// the main job's batch, in the faster mode.
fn print_job_share(steps: &[StepRow]) -> f64 {
    // The target: the all-reduce of the MiniLM-sized model's gradients at
    // R = 2 under 10% of its step, judged at the main job's batch.
    let job_share = steps
        .iter()
        .filter(|r| r.batch == JOB_BATCH && r.replicas == 2)
        .map(|r| r.all_reduce_share)
        .fold(f64::INFINITY, f64::min);
    println!(
        "all-reduce at K=1, R=2, global batch {JOB_BATCH} (the main job's), the faster mode: {:.1}% of the step (target: under 10%: {})",
        100.0 * job_share,
        if job_share < 0.10 { "met" } else { "MISSED" }
    );
    job_share
}

/// Times the group's transitions on a BERT-base-sized model and prints
/// them (the paper's 5-23 s per DDP rebuild and 4-18 s per weight copy are
/// its figures for comparison); returns the model's name and the rows.
fn measure_transitions(
    task: &MajorityTokens,
    loss_fn: &CrossEntropyLoss<Train>,
    device: &Device<Train>,
) -> Result<(String, Vec<TransitionRow>), BenchError> {
    let base = BertConfig::base(2).with_dropout(0.0);
    let base_stack = base.init::<Train>(device).into_layer_stack();
    let _ = base_stack.forward(task.batch::<Train>(0, 1, device).0);
    let base_params: usize = base_stack.unit_params().iter().sum();
    let transition_model = format!("BERT-base ({} M parameters)", base_params / 1_000_000);
    let mut group = group(&base_stack, 1, 1, BUCKETED, || AdamConfig::new().init())?;
    let (input, labels) = task.batch::<Train>(0, 4, device);
    group
        .train_step(input, labels, cross_entropy(loss_fn), 1e-4)
        .map_err(run_err)?;
    let mut transitions = Vec::new();
    let mut time =
        |name: &str, f: &mut dyn FnMut() -> Result<(), BenchError>| -> Result<(), BenchError> {
            let start = Instant::now();
            f()?;
            Inner::sync(device).map_err(|e| run_err(format!("{e:?}")))?;
            transitions.push(TransitionRow {
                transition: name.into(),
                ms: start.elapsed().as_secs_f64() * 1e3,
            });
            Ok(())
        };
    time("grow R 1 -> 2 (copy weights and Adam state)", &mut || {
        group.resize(two_replicas(1)).map_err(run_err)
    })?;
    time("re-form the collective group (R = 2)", &mut || {
        group.form().map_err(run_err)
    })?;
    time("repartition K 1 -> 2 on both replicas", &mut || {
        let balance = burn_pipe::balance_exact(&vec![1.0; base.num_units()], 2);
        group
            .repartition(&balance, two_replicas(2))
            .map_err(run_err)
    })?;
    time("shrink R 2 -> 1", &mut || {
        group
            .resize(vec![(0..2).map(backend::device).collect()])
            .map_err(run_err)
    })?;
    drop(group);
    println!(
        "transitions ({transition_model}; the paper: 5-23 s per DDP rebuild, 4-18 s per weight copy):"
    );
    for row in &transitions {
        println!("  {:<46} {:>9.1} ms", row.transition, row.ms);
    }
    Ok((transition_model, transitions))
}

/// The devices of two replicas of `stages` stages each.
fn two_replicas(stages: usize) -> Vec<Vec<Device<Train>>> {
    (0..2)
        .map(|r| {
            (0..stages)
                .map(|s| backend::device(r * stages + s))
                .collect()
        })
        .collect()
}

/// `loss` as an owned function for a step's replica threads.
fn cross_entropy(
    loss: &CrossEntropyLoss<Train>,
) -> impl Fn(Tensor<Train, 2>, Tensor<Train, 1, Int>) -> Tensor<Train, 1> + Send + Sync + 'static {
    let loss = loss.clone();
    move |logits, labels| loss.forward(logits, labels)
}
