//! The headline's memory: memory-aware AutoPipe's estimate against the
//! measured peak heap, and the memory-bound setting's budget.

use burn_elastic_dp::shape::{ShapeRule, ShapeSettings};
use burn_elastic_dp::{BatchPolicy, TrainerConfig};
use burn_pipe::UnitCosts;
use burn_pipe::balance::{MemoryQuery, measure_unit_memory};
use burn_pipe::{Schedule, UnitMemory};
use serde::Serialize;

use super::configs::{DEVICES, Setting, strongest_base};
use super::shared::{Progress, run_err};
use crate::bench::{BenchError, alloc};
use burn::data::dataloader::batcher::Batcher;
use pipetransformer_jobs::backend;

use crate::strongest::{self, StepClock, Strongest, fits_without_budget};
use pipetransformer_jobs::job::{
    FINETUNE_CLASSES, JobModel, JobSpec, Method, Pretrained, RunRecord, with_model,
};

/// Adam's state per parameter, in copies of the parameters.
const ADAM_SLOTS: f64 = 2.0;

/// The estimate against the measurement, the budget of the memory-bound
/// setting, and the runs without it.
///
/// The headline's memory: memory-aware AutoPipe's estimate of each stage
/// next to the measured peak heap of a one-stage run, and the memory-bound
/// setting (the paper's situation): a per-device budget under which the
/// model does not fit one device, so that (b*) must pipeline and
/// PipeTransformer's compression has room to pay.
///
/// The estimate is the trainer's ([`UnitMemory::stages`] on the units'
/// parameters and the activations [`measure_unit_memory`] measures on one
/// global batch, the counted heap of the bench binary): parameters,
/// gradients, Adam's two moments and the activations in flight. The
/// measured figure is the peak heap above the level before a short
/// one-stage run (K = 1, R = 1, M = 1, nothing frozen) of the same job.
#[derive(Debug, Serialize)]
pub(super) struct MemoryReport {
    /// Activation bytes per sample of each unit, as measured.
    pub activations_per_sample: Vec<u64>,
    /// Estimated bytes of the one stage of K = 1 (R = 1, M = 1).
    pub one_stage_estimate: u64,
    /// Measured peak heap of that run.
    pub one_stage_measured_peak: u64,
    /// Estimate / measured.
    pub estimate_over_measured: f64,
    /// Estimated bytes per stage of the exact balance for each K over the
    /// devices (R = D / K, the paper's micro-batches).
    pub stages_by_k: Vec<(usize, Vec<u64>)>,
    /// The memory-bound setting's per-device budget (the main tables').
    pub budget: u64,
    /// Without the budget: (b*) searched, and (b*) and (c) run.
    pub unbounded: Unbounded,
}

/// The runs without a budget (every stage fits one device).
#[derive(Debug, Serialize)]
pub(super) struct Unbounded {
    /// (b*) without the budget: the candidates and the fastest.
    pub strongest: Strongest,
    /// (b*) and (c) without the budget: training seconds, accuracy, shapes.
    pub runs: Vec<BoundRun>,
}

/// One run of the unbounded section.
#[derive(Debug, Serialize)]
pub(super) struct BoundRun {
    pub name: String,
    pub seconds: f64,
    pub accuracy: f64,
    pub first_shape: (usize, usize),
    pub final_shape: (usize, usize, usize),
}

impl BoundRun {
    fn of(record: &RunRecord) -> Self {
        let first = record.epochs.first().map(|e| &e.report);
        let last = record.epochs.last().map(|e| &e.report);
        Self {
            name: record.name.clone(),
            seconds: record.seconds,
            accuracy: record.accuracy,
            first_shape: first.map_or((0, 0), |e| (e.stages, e.replicas)),
            final_shape: last.map_or((0, 0, 0), |e| (e.frozen_layers, e.stages, e.replicas)),
        }
    }
}

/// The units' memory measured on one global batch of the job's task.
pub(super) fn unit_memory(
    spec: &JobSpec,
    pretrained: &Pretrained,
) -> Result<UnitMemory, BenchError> {
    let device = backend::device(0);
    let items: Vec<usize> = (0..spec.batch).collect();
    with_model!(pretrained, M, stack => {
        let (x, _) = M::task(FINETUNE_CLASSES, spec.task, spec.seed).batch(items, &device);
        measure_unit_memory(stack, x, &device).map_err(run_err)
    })
}

/// The memory-bound setting's budget and the estimates it rests on.
#[derive(Debug)]
pub(super) struct Budget {
    memory: UnitMemory,
    one_stage: u64,
    stages_by_k: Vec<(usize, Vec<u64>)>,
    /// Bytes per device.
    pub(super) bytes: u64,
}

/// The per-device budget of the memory-bound setting: 5% over the largest
/// stage of K = 2 and of K = 4 (R = D / K; both fit, at any micro-batch
/// count: sized at one, the most activations 1F1B keeps in flight), which
/// must lie below the one stage of K = 1 (which then does not fit, so (b*)
/// pipelines).
/// The estimate is memory-aware AutoPipe's on the units' parameters and
/// the activations measured on one global batch.
///
/// `memory`: the units' memory measured on one global batch of the task
/// ([`unit_memory`] for the generated one). The stages are sized for the
/// configuration that holds the most: the default freeze rule, whose
/// evidence keeps a snapshot of the blocks' weights
/// ([`TrainerConfig::with_evidence`]), so that every configuration compared
/// can run at K = 2 and 4.
pub(super) fn budget(spec: &JobSpec, memory: UnitMemory) -> Result<Budget, BenchError> {
    let blocks = burn_elastic_dp::LayerSpec::Uniform {
        offset: 1,
        per_layer: 2,
        layers: spec.layers,
    };
    let memory = TrainerConfig::new()
        .with_layers(blocks)
        .with_evidence(&memory);
    let units = memory.len();
    let one_stage = memory.stages(&MemoryQuery {
        balance: &[units],
        front: 0,
        batch: spec.batch,
        micro_batches: 1,
        schedule: Schedule::OneFOneB,
        optimizer_slots: ADAM_SLOTS,
    })[0]
        .total();
    // Parameter costs (bytes are counts times 4: the same balance).
    let params: Vec<usize> = memory.params.iter().map(|&b| b as usize).collect();
    let costs = UnitCosts::from_params(&params, 1.0 / 3.0);
    let stages_by_k: Vec<(usize, Vec<u64>)> = burn_elastic_dp::shape::stage_counts(DEVICES, units)
        .into_iter()
        .map(|k| {
            let mut settings =
                ShapeSettings::new(DEVICES, BatchPolicy::FixedGlobal { batch: spec.batch });
            settings.stages = Some(k);
            settings.optimizer_slots = ADAM_SLOTS;
            // At one micro-batch: a replica's whole share in flight, the
            // most 1F1B keeps at any M up to K, so the budget leaves the
            // trainer free to run each shape at its measured M.
            settings.micro_batches = Some(1);
            let mut rule = ShapeRule::new(settings, costs.clone(), memory.clone());
            let held = match rule.start() {
                Ok(shape) => rule.stage_memory(&shape.balance, 0),
                Err(_) => Vec::new(),
            };
            (k, held.iter().map(|m| m.total()).collect())
        })
        .collect();
    let largest = |k: usize| {
        stages_by_k
            .iter()
            .find(|(kk, _)| *kk == k)
            .and_then(|(_, s)| s.iter().max().copied())
            .unwrap_or(u64::MAX)
    };
    let pipelined = largest(2).max(largest(4));
    let bytes = pipelined + pipelined / 20;
    if bytes >= largest(1) {
        return Err(BenchError::Run(format!(
            "the memory-bound setting needs the largest stage of K = 2 and 4 ({pipelined} bytes) well below K = 1's ({} bytes)",
            largest(1)
        )));
    }
    println!(
        "memory per device (estimated): per stage at K=1/2/4 (R=D/K): {}",
        stages_by_k
            .iter()
            .map(|(k, s)| format!(
                "K={k} [{}]",
                s.iter()
                    .map(|b| format!("{:.1}", mb(*b)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "memory-bound setting: a budget of {:.1} MB per device (K=1's stage, {:.1} MB, does not fit)",
        mb(bytes),
        mb(largest(1))
    );
    Ok(Budget {
        memory,
        one_stage,
        stages_by_k,
        bytes,
    })
}

/// After the main tables: memory-aware AutoPipe's estimate of one stage
/// against the measured peak heap of a short one-stage run, then (b*)
/// searched and (b*) and (c) run without the budget (`unbounded`, (c)'s
/// configuration without its budget, started at that search's shape).
pub(super) fn run(
    spec: &JobSpec,
    pretrained: &Pretrained,
    budget: Budget,
    unbounded: &Setting,
    c_config: &TrainerConfig,
) -> Result<MemoryReport, BenchError> {
    if !alloc::installed() {
        return Err(BenchError::Run(
            "the memory check needs the bench binary's counting allocator".into(),
        ));
    }
    let measured = measure_one_stage(spec, pretrained, unbounded)?;
    println!(
        "memory per device: one stage (K=1, R=1, M=1) estimated {:.1} MB, measured peak {:.1} MB ({:.0}% of it)",
        mb(budget.one_stage),
        mb(measured),
        100.0 * budget.one_stage as f64 / measured.max(1) as f64,
    );
    let (found, runs) = run_unbounded(spec, pretrained, unbounded, c_config)?;
    print_unbounded(&runs);
    Ok(MemoryReport {
        activations_per_sample: budget.memory.activations.clone(),
        one_stage_estimate: budget.one_stage,
        one_stage_measured_peak: measured,
        estimate_over_measured: budget.one_stage as f64 / measured.max(1) as f64,
        stages_by_k: budget.stages_by_k,
        budget: budget.bytes,
        unbounded: Unbounded {
            strongest: found,
            runs,
        },
    })
}

/// The peak heap above the level before a few steps of one stage on one
/// device, nothing frozen, M = 1.
fn measure_one_stage(
    spec: &JobSpec,
    pretrained: &Pretrained,
    unbounded: &Setting,
) -> Result<u64, BenchError> {
    // A few steps of one stage on one device, nothing frozen, M = 1.
    let short = JobSpec {
        samples: 4 * spec.batch,
        eval_samples: spec.batch,
        epochs: 1,
        ..spec.clone()
    };
    let one = strongest::no_freeze_config(
        &strongest_base(unbounded),
        strongest::Candidate {
            stages: 1,
            replicas: 1,
            micro_batches: 1,
        },
    );
    let before = alloc::reset_peak();
    let (record, trained) = short
        .finetune(
            pretrained,
            "one stage",
            &Method::Trainer {
                config: one,
                devices: 1,
            },
            &mut StepClock::default(),
        )
        .map_err(run_err)?;
    drop((record, trained));
    Ok(alloc::peak().saturating_sub(before) as u64)
}

/// (b*) searched without the budget, then (b*) and (c) (`c_config` without
/// its budget, started at the search's shape) run without it.
fn run_unbounded(
    spec: &JobSpec,
    pretrained: &Pretrained,
    unbounded: &Setting,
    c_config: &TrainerConfig,
) -> Result<(Strongest, Vec<BoundRun>), BenchError> {
    let found = strongest::find(
        spec,
        &strongest_base(unbounded),
        DEVICES,
        fits_without_budget,
        |short, method, clock| {
            let (record, _) =
                short.finetune(pretrained, "(b*) candidate without a budget", method, clock)?;
            Ok(record)
        },
    )
    .map_err(run_err)?;
    println!("without a budget: {}", found.summary());
    let mut runs = Vec::new();
    for (name, method) in [
        (
            format!("{} without a budget", strongest::name(found.winner)),
            strongest::method(&strongest_base(unbounded), found.winner, DEVICES),
        ),
        (
            "(c) PipeTransformer without a budget".to_string(),
            Method::Trainer {
                config: c_config
                    .clone()
                    .with_memory(unbounded.memory.clone())
                    .with_stages(Some(found.winner.stages)),
                devices: DEVICES,
            },
        ),
    ] {
        let (record, _) = spec
            .finetune(pretrained, &name, &method, &mut Progress)
            .map_err(run_err)?;
        runs.push(BoundRun::of(&record));
    }
    Ok((found, runs))
}

/// The unbounded runs, a line each, and (c)'s speed against (b*)'s.
fn print_unbounded(runs: &[BoundRun]) {
    for run in runs {
        println!(
            "  {:<40} {:>7.2} s  {:>6.2}%  start K={} R={}  final F/K/R {}/{}/{}",
            run.name,
            run.seconds,
            100.0 * run.accuracy,
            run.first_shape.0,
            run.first_shape.1,
            run.final_shape.0,
            run.final_shape.1,
            run.final_shape.2
        );
    }
    if let [bstar, c] = runs {
        println!(
            "without a budget: (c) {:.2}x the speed of (b*), accuracy {:+.2} pt",
            bstar.seconds / c.seconds,
            100.0 * (c.accuracy - bstar.accuracy)
        );
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
