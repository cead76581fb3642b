//! The figures of `bench elastic --mpi`: each rank's times, the phases of
//! the group's exchange, and their summary, printed and written.

use std::time::Duration;

use serde::Serialize;

use crate::bench::{BenchError, median, write_report};
use pipetransformer_jobs::backend;

/// Global batch of every step (small: the all-reduce weighs most there).
pub(super) const BATCH: usize = 8;

/// One rank's times, step by step (after one warm-up step).
#[derive(Debug, Serialize)]
pub(super) struct RankTimes {
    pub(super) rank: usize,
    pub(super) step_ms: Vec<f64>,
    pub(super) all_reduce_ms: Vec<f64>,
    /// The phases of the group's exchange with the other processes, step
    /// by step ([`burn_elastic_dp::ExchangePhases`]).
    pub(super) exchange: Phases,
}

/// The phases of the group's exchange, in ms, one figure per step (or one
/// median per phase in the report's summary).
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Phases {
    copy_out_ms: Vec<f64>,
    check_ms: Vec<f64>,
    mpi_all_reduce_ms: Vec<f64>,
    copy_back_ms: Vec<f64>,
    total_ms: Vec<f64>,
}

impl Phases {
    /// The figures as one row per phase, in order (copy out, check,
    /// MPI_Allreduce, copy back, total).
    pub(super) fn rows(&self) -> [&Vec<f64>; 5] {
        [
            &self.copy_out_ms,
            &self.check_ms,
            &self.mpi_all_reduce_ms,
            &self.copy_back_ms,
            &self.total_ms,
        ]
    }

    pub(super) fn rows_mut(&mut self) -> [&mut Vec<f64>; 5] {
        [
            &mut self.copy_out_ms,
            &mut self.check_ms,
            &mut self.mpi_all_reduce_ms,
            &mut self.copy_back_ms,
            &mut self.total_ms,
        ]
    }

    pub(super) fn push(&mut self, phases: &burn_elastic_dp::ExchangePhases) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let figures = [
            phases.copy_out,
            phases.check,
            phases.all_reduce,
            phases.copy_back,
            phases.total,
        ];
        for (row, figure) in self.rows_mut().into_iter().zip(figures) {
            row.push(ms(figure));
        }
    }
}

/// The bare `MPI_Allreduce` the exchange is measured against, in the same
/// run: of every gradient byte in as few buckets as MPI counts allow (what
/// a dense all-reduce of the gradients costs), and of the bytes the exchange
/// sent (the untouched rows of the word embeddings are not sent).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bare {
    pub(super) all_ms: f64,
    pub(super) sent_ms: f64,
    pub(super) sent_bytes: usize,
    /// The exchange's `MPI_Allreduce` calls (a bucket or a gradient each).
    pub(super) buckets: usize,
}

/// The exchange's phases per step: medians over the steps of the figures
/// of the rank that arrived last at each step (the smallest total: it
/// waited for no one), against the bare `MPI_Allreduce`s ([`Bare`]).
#[derive(Debug, Serialize)]
struct PhaseSummary {
    copy_out_ms: f64,
    check_ms: f64,
    mpi_all_reduce_ms: f64,
    copy_back_ms: f64,
    /// The whole exchange (hand-offs to and from the MPI thread included).
    exchange_ms: f64,
    /// `MPI_Allreduce` alone of as many f32 values as the gradients, in
    /// buckets of at most `MPI_BUCKET_VALUES`, measured in the same run.
    bare_all_reduce_ms: f64,
    /// `exchange_ms / bare_all_reduce_ms` (the target: at most 1.3).
    exchange_over_bare: f64,
    /// Bytes the exchange sent (the gradients less the word embeddings'
    /// untouched rows).
    sent_bytes: usize,
    /// `MPI_Allreduce` alone of `sent_bytes`, in the same run.
    bare_sent_ms: f64,
    /// `exchange_ms / bare_sent_ms`: the exchange's cost over MPI's for the
    /// bytes it moves.
    exchange_over_bare_sent: f64,
    /// 2(N-1)/N x bytes / link bandwidth.
    ring_bound_ms: f64,
    buckets: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    transport: &'static str,
    backend: &'static str,
    processes: usize,
    batch: usize,
    steps: usize,
    gradient_bytes: usize,
    step_ms: f64,
    all_reduce_ms: f64,
    algorithm_gb_per_s: f64,
    bus_gb_per_s: f64,
    link: String,
    link_gb_per_s: f64,
    ring_bound_ms: f64,
    /// The exchange's phases against the bare `MPI_Allreduce`.
    exchange: PhaseSummary,
    /// The exposed communication of pipelines of several stages.
    pipelines: Vec<Exposure>,
    ranks: Vec<RankTimes>,
}

/// A pipeline's exposed communication: the step's wait on the exchange
/// after its last backward, against the exchange's whole time.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Exposure {
    stages: usize,
    step_ms: f64,
    /// The exchanges of every stage, summed (the rank that waited least,
    /// median over the steps).
    exchange_ms: f64,
    /// The wait after the last backward (smallest over the ranks, median
    /// over the steps).
    exposed_ms: f64,
    /// `exposed_ms / exchange_ms` (the target: at most 0.3).
    exposed_share: f64,
}

/// The [`Exposure`] of a pipeline of `stages` stages from every rank's
/// times over `steps` steps.
pub(super) fn exposure(stages: usize, ranks: &[RankTimes], steps: usize) -> Exposure {
    let exchange_ms = median_of_least(ranks, steps, |r| &r.exchange.total_ms);
    let exposed_ms = median_of_least(ranks, steps, |r| &r.all_reduce_ms);
    Exposure {
        stages,
        step_ms: median(ranks[0].step_ms.clone()),
        exchange_ms,
        exposed_ms,
        exposed_share: exposed_ms / exchange_ms,
    }
}

/// The median over `steps` steps of each step's smallest `series` figure
/// over the ranks (the rank that arrived last waited for no one).
fn median_of_least(
    ranks: &[RankTimes],
    steps: usize,
    series: impl Fn(&RankTimes) -> &Vec<f64>,
) -> f64 {
    median(
        (0..steps)
            .map(|s| {
                ranks
                    .iter()
                    .map(|r| series(r)[s])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect(),
    )
}

/// The pipelines' exposed communication and the target's verdict.
fn print_exposure(pipelines: &[Exposure]) {
    if pipelines.is_empty() {
        return;
    }
    println!(
        "  exposed communication (the step's wait on the exchange after its last backward), one replica per rank:"
    );
    for p in pipelines {
        println!(
            "    K={}: step {:>6.0} ms, exchange {:>6.1} ms, exposed {:>6.1} ms = {:>5.1}% of it (target: at most 30%: {})",
            p.stages,
            p.step_ms,
            p.exchange_ms,
            p.exposed_ms,
            100.0 * p.exposed_share,
            if p.exposed_share <= 0.3 {
                "met"
            } else {
                "MISSED"
            }
        );
    }
}

/// Prints and saves the figures of every rank's times against the bare
/// `MPI_Allreduce`s (`bare`).
pub(super) fn summarize(
    transport: &'static str,
    gradient_bytes: usize,
    ranks: Vec<RankTimes>,
    link: &str,
    link_bytes_per_s: f64,
    bare: Bare,
    pipelines: Vec<Exposure>,
) -> Result<(), BenchError> {
    let steps = ranks[0].all_reduce_ms.len();
    let all_reduce_ms = median_of_least(&ranks, steps, |r| &r.all_reduce_ms);
    let step_ms = median(ranks[0].step_ms.clone());
    let n = ranks.len() as f64;
    let algorithm = gradient_bytes as f64 / (all_reduce_ms * 1e-3) / 1e9;
    let bus = algorithm * 2.0 * (n - 1.0) / n;
    let ring_bound_ms = 2.0 * (n - 1.0) / n * gradient_bytes as f64 / link_bytes_per_s * 1e3;
    print_ranks(transport, gradient_bytes, &ranks, steps);
    println!(
        "  step {step_ms:.0} ms; cross-process all-reduce (exposed) {all_reduce_ms:.1} ms per step ({:.1}% of the step); algorithm bandwidth {algorithm:.2} GB/s, bus bandwidth {bus:.2} GB/s",
        100.0 * all_reduce_ms / step_ms
    );
    println!(
        "  link: {link} {:.2} GB/s; ring bound 2(N-1)/N x bytes / link = {ring_bound_ms:.1} ms ({:.0}% of it reached)",
        link_bytes_per_s / 1e9,
        100.0 * ring_bound_ms / all_reduce_ms
    );
    let exchange = exchange_summary(&ranks, steps, bare, ring_bound_ms);
    print_exchange(&exchange, steps);
    print_exposure(&pipelines);
    let report = Report {
        bench: "elastic-nodes",
        transport,
        backend: backend::NAME,
        processes: ranks.len(),
        batch: BATCH,
        steps,
        gradient_bytes,
        step_ms,
        all_reduce_ms,
        algorithm_gb_per_s: algorithm,
        bus_gb_per_s: bus,
        link: link.into(),
        link_gb_per_s: link_bytes_per_s / 1e9,
        ring_bound_ms,
        exchange,
        pipelines,
        ranks,
    };
    let path = write_report(&format!("elastic-{transport}"), &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The title line and each rank's step and all-reduce times.
fn print_ranks(transport: &str, gradient_bytes: usize, ranks: &[RankTimes], steps: usize) {
    println!(
        "bench elastic --{transport} ({}; {} processes x 1 replica on this machine; MiniLM-L6-H384, {:.1} MB of f32 gradients; global batch {BATCH}; median of {steps} steps after one warm-up)",
        backend::NAME,
        ranks.len(),
        gradient_bytes as f64 / 1e6,
    );
    for rank in ranks {
        println!(
            "  rank {}: step ms {:?}, all-reduce ms {:?}",
            rank.rank,
            rank.step_ms.iter().map(|v| v.round()).collect::<Vec<_>>(),
            rank.all_reduce_ms
                .iter()
                .map(|v| v.round())
                .collect::<Vec<_>>()
        );
    }
}

/// The exchange's phases: per step those of the rank that waited least,
/// their medians over the `steps` steps, against the bare `MPI_Allreduce`s
/// and the ring bound.
fn exchange_summary(
    ranks: &[RankTimes],
    steps: usize,
    bare: Bare,
    ring_bound_ms: f64,
) -> PhaseSummary {
    // Per step, the phases of the rank that waited least in the exchange.
    let mut last = Phases::default();
    for s in 0..steps {
        let rank = ranks
            .iter()
            .min_by(|a, b| a.exchange.total_ms[s].total_cmp(&b.exchange.total_ms[s]))
            .expect("at least two ranks");
        for (row, figures) in last.rows_mut().into_iter().zip(rank.exchange.rows()) {
            row.push(figures[s]);
        }
    }
    let [
        copy_out_ms,
        check_ms,
        mpi_all_reduce_ms,
        copy_back_ms,
        exchange_ms,
    ] = last.rows().map(|row| median(row.clone()));
    PhaseSummary {
        copy_out_ms,
        check_ms,
        mpi_all_reduce_ms,
        copy_back_ms,
        exchange_ms,
        bare_all_reduce_ms: bare.all_ms,
        exchange_over_bare: exchange_ms / bare.all_ms,
        sent_bytes: bare.sent_bytes,
        bare_sent_ms: bare.sent_ms,
        exchange_over_bare_sent: exchange_ms / bare.sent_ms,
        ring_bound_ms,
        buckets: bare.buckets,
    }
}

/// The table of the exchange's phases and the target's verdict.
fn print_exchange(exchange: &PhaseSummary, steps: usize) {
    let e = exchange;
    println!(
        "  the exchange's phases per step ({} MPI_Allreduce calls of {:.1} MB sent; the rank that arrived last, median of {steps} steps):",
        e.buckets,
        e.sent_bytes as f64 / 1e6
    );
    let hand_offs =
        e.exchange_ms - e.copy_out_ms - e.check_ms - e.mpi_all_reduce_ms - e.copy_back_ms;
    for (phase, ms) in [
        ("copy out (gradients into the exchange)", e.copy_out_ms),
        ("consistency check (kind, round, length)", e.check_ms),
        (
            "MPI_Allreduce (rows marked and packed)",
            e.mpi_all_reduce_ms,
        ),
        ("copy back (into the gradient tensors)", e.copy_back_ms),
        ("hand-offs (the rest)", hand_offs),
        ("the group's exchange", e.exchange_ms),
        (
            "bare MPI_Allreduce of all bytes, this run",
            e.bare_all_reduce_ms,
        ),
        ("bare MPI_Allreduce of the bytes sent", e.bare_sent_ms),
        ("ring bound (all bytes)", e.ring_bound_ms),
    ] {
        println!("    {phase:<44} {ms:>9.1} ms");
    }
    let verdict = |ratio: f64| if ratio <= 1.3 { "met" } else { "MISSED" };
    println!(
        "  exchange / bare MPI_Allreduce of all bytes = {:.2} (target: at most 1.3: {}); of the bytes sent = {:.2} ({})",
        e.exchange_over_bare,
        verdict(e.exchange_over_bare),
        e.exchange_over_bare_sent,
        verdict(e.exchange_over_bare_sent),
    );
}
