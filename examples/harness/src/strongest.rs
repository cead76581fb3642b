//! The strongest baseline (b*): the fastest configuration that freezes
//! nothing on the same devices, from a few measured steps of each candidate.

use std::time::Instant;

use burn_elastic_dp::{Parts, TrainerConfig, TrainerError};
use serde::{Deserialize, Serialize};

use pipetransformer_jobs::job::{EpochRecord, JobError, JobSpec, Method, Observer, RunRecord};

/// Steps each candidate runs before the clock starts (thread start-up,
/// first allocations, AutoPipe's profiling).
pub const WARM_UP_STEPS: usize = 1;
/// Steps each candidate is timed over.
pub const MEASURED_STEPS: usize = 3;

/// One configuration that freezes nothing: `stages` (K) stages, `replicas`
/// (R) replicas, `micro_batches` (M) per replica and step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// Pipeline stages (K), a divisor of the devices.
    pub stages: usize,
    /// Data-parallel replicas (R = D / K).
    pub replicas: usize,
    /// Micro-batches per replica and step.
    pub micro_batches: usize,
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "K={} R={} M={}",
            self.stages, self.replicas, self.micro_batches
        )
    }
}

/// The search's own hook: accepts every `K`. The per-device memory budget
/// is the trainer's ([`TrainerConfig::memory`]): a candidate with a stage
/// over it is refused by the trainer (at init on its parameters, on the
/// first batch on its measured activations) and [`find`] skips it.
pub fn fits_without_budget(_stages: usize) -> bool {
    true
}

/// The candidates on `devices` devices: `K` over the divisors of
/// `devices`, ascending, that `fits` accepts, with `R = devices / K` and
/// `M = micro_batches(K)`.
///
/// ```
/// use pipetransformer_harness::strongest::{candidates, fits_without_budget};
///
/// let ks: Vec<(usize, usize)> = candidates(4, fits_without_budget, |_| 1)
///     .iter()
///     .map(|c| (c.stages, c.replicas))
///     .collect();
/// assert_eq!(ks, [(1, 4), (2, 2), (4, 1)]);
/// ```
pub fn candidates(
    devices: usize,
    fits: impl Fn(usize) -> bool,
    micro_batches: impl Fn(usize) -> usize,
) -> Vec<Candidate> {
    (1..=devices)
        .filter(|k| devices.is_multiple_of(*k) && fits(*k))
        .map(|k| Candidate {
            stages: k,
            replicas: devices / k,
            micro_batches: micro_batches(k),
        })
        .collect()
}

/// A candidate and its measured seconds per step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    /// What ran.
    pub candidate: Candidate,
    /// Seconds per step over the measured steps.
    pub seconds_per_step: f64,
}

/// The search's outcome: every candidate measured, and the fastest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Strongest {
    /// Each candidate, in the order measured (ascending K).
    pub measured: Vec<Measured>,
    /// The fastest per step.
    pub winner: Candidate,
    /// Steps timed per candidate (after [`WARM_UP_STEPS`]).
    pub steps: usize,
}

impl Strongest {
    /// One line: the candidates with their times, and the winner.
    pub fn summary(&self) -> String {
        let each: Vec<String> = self
            .measured
            .iter()
            .map(|m| format!("{} {:.3} s/step", m.candidate, m.seconds_per_step))
            .collect();
        format!(
            "(b*) candidates, nothing frozen, {} steps timed after {WARM_UP_STEPS} warm-up: {}; fastest: {}",
            self.steps,
            each.join(", "),
            self.winner
        )
    }
}

/// Measures each of `candidates` with `measure` (seconds per step) and
/// picks the fastest; an error where there is no candidate (the `fits`
/// hook refused every K) or a measurement fails.
pub fn pick_fastest(
    candidates: Vec<Candidate>,
    mut measure: impl FnMut(Candidate) -> Result<f64, JobError>,
) -> Result<Strongest, JobError> {
    let mut measured = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        let seconds_per_step = measure(candidate)?;
        tracing::info!(%candidate, seconds_per_step, "(b*) candidate measured");
        measured.push(Measured {
            candidate,
            seconds_per_step,
        });
    }
    let winner = measured
        .iter()
        .min_by(|a, b| a.seconds_per_step.total_cmp(&b.seconds_per_step))
        .map(|m| m.candidate)
        .ok_or_else(|| {
            JobError::Spec(
                "no configuration without freezing fits the devices: every K was refused".into(),
            )
        })?;
    Ok(Strongest {
        measured,
        winner,
        steps: MEASURED_STEPS,
    })
}

/// `base` as a run that freezes nothing in the shape of `candidate`:
/// freeze, pipe and cache off, `candidate.stages` stages and replicas on
/// every device (AutoDP on, so `R = D / K`), its micro-batches; no
/// checkpoints and no logs (the job's own run writes those).
pub fn no_freeze_config(base: &TrainerConfig, candidate: Candidate) -> TrainerConfig {
    no_freeze_config_with(base, candidate, Some(candidate.micro_batches))
}

/// [`no_freeze_config`] with `micro_batches` (`None`: the trainer's own
/// choice).
fn no_freeze_config_with(
    base: &TrainerConfig,
    candidate: Candidate,
    micro_batches: Option<usize>,
) -> TrainerConfig {
    let mut replicas = base.replicas.clone();
    replicas.pipeline = replicas.pipeline.with_micro_batches(micro_batches);
    base.clone()
        .with_parts(
            Parts::new()
                .with_freeze(false)
                .with_pipe(false)
                .with_dp(true)
                .with_cache(false),
        )
        .with_stages(Some(candidate.stages))
        .with_replicas(replicas)
        .with_checkpoint(None)
        .with_output_dir(None)
}

/// The (b*) method for `winner` over `devices` devices.
pub fn method(base: &TrainerConfig, winner: Candidate, devices: usize) -> Method {
    Method::Trainer {
        config: no_freeze_config(base, winner),
        devices,
    }
}

/// Its name in tables: `(b*) no freeze, K=1 R=4`.
pub fn name(winner: Candidate) -> String {
    format!("(b*) K={} R={}", winner.stages, winner.replicas)
}

/// Finds (b*) for `spec` on `devices` devices: every candidate `fits`
/// accepts and the trainer's configuration check passes, `base`'s
/// settings otherwise, trained by `run` for
/// [`WARM_UP_STEPS`] + [`MEASURED_STEPS`] steps (one epoch of that many
/// batches; fewer where the spec has fewer samples) and timed per step.
///
/// The candidates are the pipelines of `K` stages for every divisor `K` of
/// the device count `D`, each run as `R = D / K` data-parallel replicas, its
/// micro-batches the job's `--micro-batches` where given, else chosen as
/// the trainer chooses them: by measurement where the costs are profiled
/// (`CostModel::Profiled`, on the candidate's warm-up step; the count it
/// ran is recorded), by the paper's rule for `K` otherwise; a candidate
/// refused by the `fits` hook is skipped. Each
/// candidate trains [`WARM_UP_STEPS`] + [`MEASURED_STEPS`] steps; the
/// fastest per measured step wins.
///
/// The search is generic over the job's model: it is handed a closure that
/// runs a (short) fine-tuning with a [`Method`]. It lives here, in the
/// examples, while the trainer's API changes; it belongs next to the
/// `Trainer` in burn-elastic-dp once that settles.
pub fn find(
    spec: &JobSpec,
    base: &TrainerConfig,
    devices: usize,
    fits: impl Fn(usize) -> bool,
    mut run: impl FnMut(&JobSpec, &Method, &mut StepClock) -> Result<RunRecord, JobError>,
) -> Result<Strongest, JobError> {
    let short = JobSpec {
        samples: ((WARM_UP_STEPS + MEASURED_STEPS) * spec.batch).min(spec.samples),
        epochs: 1,
        ..spec.clone()
    };
    let micro_batches = |k| base.replicas.pipeline.micro_batches_for(k);
    // A shape the trainer refuses (a global batch smaller than R x M, say)
    // is no candidate either.
    let accepted = |k: usize| {
        let candidate = Candidate {
            stages: k,
            replicas: devices / k,
            micro_batches: micro_batches(k),
        };
        fits(k) && no_freeze_config(base, candidate).validate(devices).is_ok()
    };
    let mut timed = Vec::new();
    for candidate in candidates(devices, accepted, micro_batches) {
        let mut clock = StepClock::default();
        let measures = base.measures_micro_batches(candidate.stages);
        // Where the trainer measures M, it does so on the warm-up step.
        let method = Method::Trainer {
            config: no_freeze_config_with(
                base,
                candidate,
                (!measures).then_some(candidate.micro_batches),
            ),
            devices,
        };
        match run(&short, &method, &mut clock) {
            Ok(record) => {
                let candidate = match (measures, record.epochs.last()) {
                    (true, Some(last)) => Candidate {
                        micro_batches: last.report.micro_batches,
                        ..candidate
                    },
                    _ => candidate,
                };
                let seconds = clock.seconds_per_step(WARM_UP_STEPS).unwrap_or_else(|| {
                    let steps: usize = record.epochs.iter().map(|e| e.report.steps).sum();
                    record.seconds / steps.max(1) as f64
                });
                timed.push((candidate, seconds));
            }
            // A candidate whose stages do not fit the memory budget.
            Err(JobError::Trainer(
                error @ (TrainerError::StageDoesNotFit { .. } | TrainerError::DoesNotFit { .. }),
            )) => {
                tracing::info!(%candidate, %error, "(b*) candidate does not fit the memory budget");
                eprintln!("(b*) candidate {candidate} skipped: {error}");
            }
            Err(error) => return Err(error),
        }
    }
    let seconds = timed.clone();
    pick_fastest(timed.into_iter().map(|(c, _)| c).collect(), |candidate| {
        Ok(seconds
            .iter()
            .find(|(c, _)| *c == candidate)
            .map(|(_, s)| *s)
            .expect("timed above"))
    })
}

/// An [`Observer`] that notes when each step ends.
#[derive(Debug, Default)]
pub struct StepClock {
    ends: Vec<Instant>,
}

impl StepClock {
    /// Seconds per step after the first `warm_up` steps: from the end of
    /// step `warm_up` to the end of the last; `None` with no step after
    /// the warm-up.
    pub fn seconds_per_step(&self, warm_up: usize) -> Option<f64> {
        let start = self.ends.get(warm_up.checked_sub(1)?)?;
        let end = self.ends.last()?;
        let steps = self.ends.len() - warm_up;
        (steps > 0).then(|| end.duration_since(*start).as_secs_f64() / steps as f64)
    }
}

impl Observer for StepClock {
    fn step(&mut self, _samples: usize, _loss: f32) {
        self.ends.push(Instant::now());
    }
    fn epoch(&mut self, _record: &EpochRecord) {}
}
