//! `bench elastic --mpi` (under `mpirun`, cargo feature `mpi`): the
//! all-reduce between processes, per step, for MiniLM's gradients (the same
//! model as `bench elastic`), one replica per process, through the group's
//! cross-process transport; against the ring bound 2(N-1)/N x bytes / link
//! bandwidth, the link measured between ranks 0 and 1 (MPI ping-pong of the
//! gradients' size). The TCP hub this replaced was measured by the same
//! harness (`bench elastic --tcp`, removed with the hub; the README quotes
//! both).
//!
//! Each rank runs the same steps on the same batches; a step's all-reduce
//! time on a rank is from the end of its backward pass to the reduced
//! gradients back in its stage (flattening, the exchange, unflattening).
//! The rank that finished its pass last waits for no one, so the step's
//! figure is the smallest of the ranks' times.
//!
//! The exchange's phases (`ReplicaGroup::exchange_phases`: copy out, the
//! consistency check, `MPI_Allreduce`, copy back) are printed per step for
//! the rank that arrived last, next to a bare `MPI_Allreduce` of the same
//! buckets measured in the same run and the ring bound, with the ratio
//! exchange / bare (the target: at most 1.3); the JSON has them under
//! `exchange` and per rank.

// Without the feature only the error of `run_mpi` is built.
#![cfg_attr(not(feature = "mpi"), allow(dead_code, unused_imports))]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn_elastic_dp::{NodeConfig, ReplicaConfig};
use burn_freeze::IntoLayerStack;
use burn_pipe::PipelineConfig;
use models::bert::BertConfig;
use models::synthetic::MajorityTokens;
use serde::Serialize;

use super::{BenchError, median, write_report};
use pipetransformer_jobs::backend::{self, Train};

/// Global batch of every step (small: the all-reduce weighs most there).
const BATCH: usize = 8;

/// One rank's times, step by step (after one warm-up step).
#[derive(Debug, Serialize)]
struct RankTimes {
    rank: usize,
    step_ms: Vec<f64>,
    all_reduce_ms: Vec<f64>,
    /// The phases of the group's exchange with the other processes, step
    /// by step ([`burn_elastic_dp::ExchangePhases`]).
    exchange: Phases,
}

/// The phases of the group's exchange, in ms, one figure per step (or one
/// median per phase in the report's summary).
#[derive(Debug, Default, Clone, Serialize)]
struct Phases {
    copy_out_ms: Vec<f64>,
    check_ms: Vec<f64>,
    mpi_all_reduce_ms: Vec<f64>,
    copy_back_ms: Vec<f64>,
    total_ms: Vec<f64>,
}

impl Phases {
    /// The figures as one row per phase, in order (copy out, check,
    /// MPI_Allreduce, copy back, total).
    fn rows(&self) -> [&Vec<f64>; 5] {
        [
            &self.copy_out_ms,
            &self.check_ms,
            &self.mpi_all_reduce_ms,
            &self.copy_back_ms,
            &self.total_ms,
        ]
    }

    fn rows_mut(&mut self) -> [&mut Vec<f64>; 5] {
        [
            &mut self.copy_out_ms,
            &mut self.check_ms,
            &mut self.mpi_all_reduce_ms,
            &mut self.copy_back_ms,
            &mut self.total_ms,
        ]
    }

    fn push(&mut self, phases: &burn_elastic_dp::ExchangePhases) {
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

/// The exchange's phases per step: medians over the steps of the figures
/// of the rank that arrived last at each step (the smallest total: it
/// waited for no one), against the bare `MPI_Allreduce` of the same buckets.
#[derive(Debug, Serialize)]
struct PhaseSummary {
    copy_out_ms: f64,
    check_ms: f64,
    mpi_all_reduce_ms: f64,
    copy_back_ms: f64,
    /// The whole exchange (hand-offs to and from the MPI thread included).
    exchange_ms: f64,
    /// `MPI_Allreduce` alone of as many f32 values in the same buckets,
    /// measured in the same run.
    bare_all_reduce_ms: f64,
    /// `exchange_ms / bare_all_reduce_ms` (the target: at most 1.3).
    exchange_over_bare: f64,
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
    ranks: Vec<RankTimes>,
}

fn run_err<E: std::fmt::Display>(error: E) -> BenchError {
    BenchError::Run(error.to_string())
}

/// MiniLM's parameter count in f32 bytes, the buckets of its exchange, and
/// one rank's timed steps.
fn rank_steps(
    rank: usize,
    nodes: NodeConfig,
    steps: usize,
) -> Result<(usize, usize, RankTimes), BenchError> {
    let device = backend::device(0);
    let config = BertConfig::minilm_l6_h384(2).with_dropout(0.0);
    let task = MajorityTokens::new(64, 12, 24, 5);
    let stack = config.init::<Train>(&device).into_layer_stack();
    let _ = stack.forward(task.batch::<Train>(0, 1, &device).0);
    let params: usize = stack.unit_params().iter().sum();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut group = ReplicaConfig::new()
        .with_pipeline(PipelineConfig::new().with_micro_batches(Some(2)))
        .with_timeout_ms(600_000)
        .with_nodes(Some(nodes))
        .init(stack, vec![vec![device.clone()]], || {
            AdamConfig::new().init()
        })
        .map_err(run_err)?;
    let mut times = RankTimes {
        rank,
        step_ms: Vec::new(),
        all_reduce_ms: Vec::new(),
        exchange: Phases::default(),
    };
    let mut buckets = 0;
    for step in 0..=steps {
        let (input, labels) = task.batch::<Train>(step, BATCH, &device);
        let loss = loss_fn.clone();
        let report = group
            .train_step(input, labels, move |l, y| loss.forward(l, y), 1e-4)
            .map_err(run_err)?;
        if step > 0 {
            times.step_ms.push(report.wall.as_secs_f64() * 1e3);
            let reduce = report.all_reduce.first().copied().unwrap_or(Duration::ZERO);
            times.all_reduce_ms.push(reduce.as_secs_f64() * 1e3);
            let phases = group.exchange_phases().unwrap_or_default();
            buckets = phases.buckets;
            times.exchange.push(&phases);
        }
    }
    Ok((params * std::mem::size_of::<f32>(), buckets, times))
}

/// Bytes per second through one TCP connection on 127.0.0.1 (256 MiB in
/// 4 MiB writes): the link of two processes on this machine.
fn loopback_bandwidth() -> Result<f64, BenchError> {
    const CHUNK: usize = 4 << 20;
    const TOTAL: usize = 256 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(run_err)?;
    let address = listener.local_addr().map_err(run_err)?;
    let reader = std::thread::spawn(move || -> std::io::Result<Duration> {
        let (mut stream, _) = listener.accept()?;
        let mut buffer = vec![0u8; CHUNK];
        let mut read = 0;
        let start = Instant::now();
        while read < TOTAL {
            let n = stream.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            read += n;
        }
        Ok(start.elapsed())
    });
    let mut stream = TcpStream::connect(address).map_err(run_err)?;
    let chunk = vec![1u8; CHUNK];
    for _ in 0..TOTAL / CHUNK {
        stream.write_all(&chunk).map_err(run_err)?;
    }
    drop(stream);
    let elapsed = reader
        .join()
        .map_err(|_| run_err("the reader thread panicked"))?
        .map_err(run_err)?;
    Ok(TOTAL as f64 / elapsed.as_secs_f64())
}

/// Prints and saves the figures of every rank's times; `bare_ms`: the bare
/// `MPI_Allreduce` of `buckets` buckets of the gradients' size.
fn summarize(
    transport: &'static str,
    gradient_bytes: usize,
    ranks: Vec<RankTimes>,
    link: &str,
    link_bytes_per_s: f64,
    (bare_ms, buckets): (f64, usize),
) -> Result<(), BenchError> {
    let steps = ranks[0].all_reduce_ms.len();
    let per_step: Vec<f64> = (0..steps)
        .map(|s| {
            ranks
                .iter()
                .map(|r| r.all_reduce_ms[s])
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let all_reduce_ms = median(per_step);
    let step_ms = median(ranks[0].step_ms.clone());
    let n = ranks.len() as f64;
    let algorithm = gradient_bytes as f64 / (all_reduce_ms * 1e-3) / 1e9;
    let bus = algorithm * 2.0 * (n - 1.0) / n;
    let ring_bound_ms = 2.0 * (n - 1.0) / n * gradient_bytes as f64 / link_bytes_per_s * 1e3;
    println!(
        "bench elastic --{transport} ({}; {} processes x 1 replica on this machine; MiniLM-L6-H384, {:.1} MB of f32 gradients; global batch {BATCH}; median of {steps} steps after one warm-up)",
        backend::NAME,
        ranks.len(),
        gradient_bytes as f64 / 1e6,
    );
    for rank in &ranks {
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
    println!(
        "  step {step_ms:.0} ms; cross-process all-reduce {all_reduce_ms:.1} ms per step ({:.1}% of the step); algorithm bandwidth {algorithm:.2} GB/s, bus bandwidth {bus:.2} GB/s",
        100.0 * all_reduce_ms / step_ms
    );
    println!(
        "  link: {link} {:.2} GB/s; ring bound 2(N-1)/N x bytes / link = {ring_bound_ms:.1} ms ({:.0}% of it reached)",
        link_bytes_per_s / 1e9,
        100.0 * ring_bound_ms / all_reduce_ms
    );
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
    let exchange = PhaseSummary {
        copy_out_ms,
        check_ms,
        mpi_all_reduce_ms,
        copy_back_ms,
        exchange_ms,
        bare_all_reduce_ms: bare_ms,
        exchange_over_bare: exchange_ms / bare_ms,
        ring_bound_ms,
        buckets,
    };
    println!(
        "  the exchange's phases per step ({buckets} buckets; the rank that arrived last, median of {steps} steps):"
    );
    for (phase, ms) in [
        ("copy out (gradients into the send buffer)", copy_out_ms),
        ("consistency check (kind, round, length)", check_ms),
        ("MPI_Allreduce of the buckets", mpi_all_reduce_ms),
        ("copy back (into the gradient tensors)", copy_back_ms),
        (
            "hand-offs (the rest)",
            exchange_ms - copy_out_ms - check_ms - mpi_all_reduce_ms - copy_back_ms,
        ),
        ("the group's exchange", exchange_ms),
        ("bare MPI_Allreduce, same buckets, this run", bare_ms),
        ("ring bound", ring_bound_ms),
    ] {
        println!("    {phase:<44} {ms:>9.1} ms");
    }
    println!(
        "  exchange / bare MPI_Allreduce = {:.2} (target: at most 1.3: {})",
        exchange.exchange_over_bare,
        if exchange.exchange_over_bare <= 1.3 {
            "met"
        } else {
            "MISSED"
        }
    );
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
        ranks,
    };
    let path = write_report(&format!("elastic-{transport}"), &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `bench elastic --mpi`: this process is one rank of an MPI job.
#[cfg(feature = "mpi")]
pub fn run_mpi(quick: bool) -> Result<(), BenchError> {
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;

    let steps = if quick { 3 } else { 6 };
    let mpi = burn_elastic_dp::Mpi::init().map_err(run_err)?;
    let (rank, size) = (mpi.rank(), mpi.size());
    if size < 2 {
        return Err(run_err(
            "bench elastic --mpi measures the all-reduce between the processes of an MPI job: run it under mpirun -np 2 (or more)",
        ));
    }
    let world = SimpleCommunicator::world();
    // The link: ranks 0 and 1 send the gradients' bytes back and forth.
    let bytes = 90_000_000;
    let mut buffer = vec![1u8; bytes];
    let reps = 3;
    world.barrier();
    let start = Instant::now();
    for _ in 0..reps {
        match rank {
            0 => {
                world.process_at_rank(1).send(&buffer[..]);
                world.process_at_rank(1).receive_into(&mut buffer[..]);
            }
            1 => {
                world.process_at_rank(0).receive_into(&mut buffer[..]);
                world.process_at_rank(0).send(&buffer[..]);
            }
            _ => {}
        }
    }
    let link = (2 * reps * bytes) as f64 / start.elapsed().as_secs_f64();
    drop(buffer);
    let tcp = if rank == 0 {
        loopback_bandwidth()?
    } else {
        0.0
    };
    let (gradient_bytes, buckets, mine) = rank_steps(rank, NodeConfig::new(), steps)?;
    // MPI's own share: one MPI_Allreduce of as many f32 values, alone.
    let values = vec![1.0f32; gradient_bytes / 4];
    let mut total = vec![0.0f32; values.len()];
    let mut raw = Vec::new();
    for _ in 0..=steps {
        world.barrier();
        let start = Instant::now();
        for (send, receive) in values
            .chunks(burn_elastic_dp::MPI_BUCKET_VALUES)
            .zip(total.chunks_mut(burn_elastic_dp::MPI_BUCKET_VALUES))
        {
            world.all_reduce_into(send, receive, mpi::collective::SystemOperation::sum());
        }
        raw.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let raw_ms = median(raw[1..].to_vec());
    let mut step_ms = vec![0.0f64; steps * size];
    let mut all_reduce_ms = vec![0.0f64; steps * size];
    world.all_gather_into(&mine.step_ms[..], &mut step_ms[..]);
    world.all_gather_into(&mine.all_reduce_ms[..], &mut all_reduce_ms[..]);
    let mut phases: [Vec<f64>; 5] = std::array::from_fn(|_| vec![0.0f64; steps * size]);
    for (all, row) in phases.iter_mut().zip(mine.exchange.rows()) {
        world.all_gather_into(&row[..], &mut all[..]);
    }
    if rank == 0 {
        let ranks = (0..size)
            .map(|r| {
                let mut exchange = Phases::default();
                for (row, all) in exchange.rows_mut().into_iter().zip(&phases) {
                    *row = all[r * steps..(r + 1) * steps].to_vec();
                }
                RankTimes {
                    rank: r,
                    step_ms: step_ms[r * steps..(r + 1) * steps].to_vec(),
                    all_reduce_ms: all_reduce_ms[r * steps..(r + 1) * steps].to_vec(),
                    exchange,
                }
            })
            .collect();
        let name = format!(
            "MPI point-to-point between ranks 0 and 1 (TCP on 127.0.0.1, the hub's link: {:.2} GB/s)",
            tcp / 1e9
        );
        summarize("mpi", gradient_bytes, ranks, &name, link, (raw_ms, buckets))?;
        let n = size as f64;
        println!(
            "  MPI_Allreduce alone of the same {:.1} MB (buckets as the group's): {raw_ms:.1} ms, bus bandwidth {:.2} GB/s",
            gradient_bytes as f64 / 1e6,
            gradient_bytes as f64 / (raw_ms * 1e-3) / 1e9 * 2.0 * (n - 1.0) / n
        );
    }
    drop(mpi);
    Ok(())
}

/// `bench elastic --mpi` without the feature: the error saying how to build it.
#[cfg(not(feature = "mpi"))]
pub fn run_mpi(_quick: bool) -> Result<(), BenchError> {
    Err(run_err(
        "bench elastic --mpi needs the examples' cargo feature `mpi` (OpenMPI: apt-get install -y libopenmpi-dev openmpi-bin libclang-dev): cargo build --release -p examples --features mpi --bin bench, then mpirun -np 2 target/release/bench elastic --mpi",
    ))
}
