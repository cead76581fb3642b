//! `bench elastic --mpi` (under `mpirun`, cargo feature `mpi`): the all-reduce
//! of MiniLM's gradients between processes, against the ring bound.

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

use super::{BenchError, median};
use pipetransformer_jobs::backend::{self, Train};

mod summary;

use summary::{BATCH, Phases, RankTimes, summarize};

fn run_err<E: std::fmt::Display>(error: E) -> BenchError {
    BenchError::Run(error.to_string())
}

/// The pipelines `bench elastic --mpi` measures exposed communication on,
/// besides one stage.
const PIPELINE_STAGES: [usize; 2] = [2, 4];

/// What [`rank_steps`] measured: MiniLM's parameter count in f32 bytes, the
/// buckets of its exchange, the bytes it sent (the rows of the word
/// embeddings no rank touched are not), and one rank's timed steps.
struct Measured {
    gradient_bytes: usize,
    buckets: usize,
    sent_bytes: usize,
    times: RankTimes,
}

/// One rank's timed steps, one replica per rank of `stages` stages (on as
/// many logical devices).
fn rank_steps(
    rank: usize,
    nodes: NodeConfig,
    steps: usize,
    stages: usize,
) -> Result<Measured, BenchError> {
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
        .init(stack, vec![vec![device.clone(); stages]], || {
            AdamConfig::new().init()
        })
        .map_err(run_err)?;
    let mut times = RankTimes {
        rank,
        step_ms: Vec::new(),
        all_reduce_ms: Vec::new(),
        exchange: Phases::default(),
    };
    let (mut buckets, mut sent) = (0, 0);
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
            sent = phases.values - phases.skipped;
            times.exchange.push(&phases);
        }
    }
    Ok(Measured {
        gradient_bytes: params * std::mem::size_of::<f32>(),
        buckets,
        sent_bytes: sent * std::mem::size_of::<f32>(),
        times,
    })
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

/// `bench elastic --mpi`: this process is one rank of an MPI job.
///
/// `bench elastic --mpi` (under `mpirun`, cargo feature `mpi`): the
/// all-reduce between processes, per step, for MiniLM's gradients (the same
/// model as `bench elastic`), one replica per process, through the group's
/// cross-process transport; against the ring bound 2(N-1)/N x bytes / link
/// bandwidth, the link measured between ranks 0 and 1 (MPI ping-pong of the
/// gradients' size). The TCP hub this replaced was measured by the same
/// harness (`bench elastic --tcp`, removed with the hub; the README quotes
/// both).
///
/// Each rank runs the same steps on the same batches; a step's all-reduce
/// time on a rank is from the end of its backward pass to the reduced
/// gradients back in its stage (flattening, the exchange, unflattening).
/// The rank that finished its pass last waits for no one, so the step's
/// figure is the smallest of the ranks' times.
///
/// The exchange's phases (`ReplicaGroup::exchange_phases`: copy out, the
/// consistency check, `MPI_Allreduce`, copy back) are printed per step for
/// the rank that arrived last, next to a bare `MPI_Allreduce` of the same
/// buckets measured in the same run and the ring bound, with the ratio
/// exchange / bare (the target: at most 1.3); the JSON has them under
/// `exchange` and per rank. Then the same replica as pipelines of 2 and 4
/// stages: the exposed communication (the time a step waits on the
/// exchange after its last backward; each stage's exchange starts when its
/// own backward ends) against the exchange's total (the target: at most
/// 30%), under `pipelines`.
#[cfg(feature = "mpi")]
pub fn run_mpi(quick: bool) -> Result<(), BenchError> {
    use mpi::topology::SimpleCommunicator;

    let steps = if quick { 3 } else { 6 };
    let mpi = burn_elastic_dp::Mpi::init().map_err(run_err)?;
    let (rank, size) = (mpi.rank(), mpi.size());
    if size < 2 {
        return Err(run_err(
            "bench elastic --mpi measures the all-reduce between the processes of an MPI job: run it under mpirun -np 2 (or more)",
        ));
    }
    let world = SimpleCommunicator::world();
    let link = link_bandwidth(&world, rank);
    let tcp = if rank == 0 {
        loopback_bandwidth()?
    } else {
        0.0
    };
    let Measured {
        gradient_bytes,
        buckets,
        sent_bytes,
        times: mine,
    } = rank_steps(rank, NodeConfig::new(), steps, 1)?;
    let raw_ms = bare_all_reduce_ms(&world, gradient_bytes, steps);
    let sent_ms = bare_all_reduce_ms(&world, sent_bytes, steps);
    let gathered = gather(&world, &mine, steps * size);
    // The same replica as pipelines of 2 and 4 stages: each stage's
    // exchange starts when its backward ends, behind the earlier stages'.
    let mut pipelines = Vec::new();
    for stages in PIPELINE_STAGES {
        let mine = rank_steps(rank, NodeConfig::new(), steps, stages)?.times;
        let gathered = gather(&world, &mine, steps * size);
        let ranks: Vec<RankTimes> = (0..size).map(|r| gathered.rank(r, steps)).collect();
        pipelines.push(summary::exposure(stages, &ranks, steps));
    }
    if rank == 0 {
        let ranks = (0..size).map(|r| gathered.rank(r, steps)).collect();
        let name = format!(
            "MPI point-to-point between ranks 0 and 1 (TCP on 127.0.0.1, the hub's link: {:.2} GB/s)",
            tcp / 1e9
        );
        summarize(
            "mpi",
            gradient_bytes,
            ranks,
            &name,
            link,
            summary::Bare {
                all_ms: raw_ms,
                sent_ms,
                sent_bytes,
                buckets,
            },
            pipelines,
        )?;
        let n = size as f64;
        println!(
            "  MPI_Allreduce alone of all {:.1} MB (buckets of at most {} MiB): {raw_ms:.1} ms, bus bandwidth {:.2} GB/s",
            gradient_bytes as f64 / 1e6,
            burn_elastic_dp::MPI_BUCKET_VALUES * 4 >> 20,
            gradient_bytes as f64 / (raw_ms * 1e-3) / 1e9 * 2.0 * (n - 1.0) / n
        );
    }
    drop(mpi);
    Ok(())
}

/// Bytes per second between ranks 0 and 1 of `world`: they send the
/// gradients' bytes back and forth.
#[cfg(feature = "mpi")]
fn link_bandwidth(world: &mpi::topology::SimpleCommunicator, rank: usize) -> f64 {
    use mpi::traits::*;

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
    link
}

/// MPI's own share: the median milliseconds of one `MPI_Allreduce` of as
/// many f32 values as `gradient_bytes`, alone, in buckets of at most
/// [`MPI_BUCKET_VALUES`](burn_elastic_dp::MPI_BUCKET_VALUES) (as few calls as
/// the group could make), over `steps` rounds after a warm-up.
#[cfg(feature = "mpi")]
fn bare_all_reduce_ms(
    world: &mpi::topology::SimpleCommunicator,
    gradient_bytes: usize,
    steps: usize,
) -> f64 {
    use mpi::traits::*;

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
    median(raw[1..].to_vec())
}

/// Every rank's times, gathered on every rank (rank after rank).
#[cfg(feature = "mpi")]
struct Gathered {
    step_ms: Vec<f64>,
    all_reduce_ms: Vec<f64>,
    phases: [Vec<f64>; 5],
}

/// Gathers `mine` from every rank of `world` (`values` figures per series
/// over all ranks).
#[cfg(feature = "mpi")]
fn gather(world: &mpi::topology::SimpleCommunicator, mine: &RankTimes, values: usize) -> Gathered {
    use mpi::traits::*;

    let mut step_ms = vec![0.0f64; values];
    let mut all_reduce_ms = vec![0.0f64; values];
    world.all_gather_into(&mine.step_ms[..], &mut step_ms[..]);
    world.all_gather_into(&mine.all_reduce_ms[..], &mut all_reduce_ms[..]);
    let mut phases: [Vec<f64>; 5] = std::array::from_fn(|_| vec![0.0f64; values]);
    for (all, row) in phases.iter_mut().zip(mine.exchange.rows()) {
        world.all_gather_into(&row[..], &mut all[..]);
    }
    Gathered {
        step_ms,
        all_reduce_ms,
        phases,
    }
}

#[cfg(feature = "mpi")]
impl Gathered {
    /// Rank `r`'s times of `steps` steps.
    fn rank(&self, r: usize, steps: usize) -> RankTimes {
        let mut exchange = Phases::default();
        for (row, all) in exchange.rows_mut().into_iter().zip(&self.phases) {
            *row = all[r * steps..(r + 1) * steps].to_vec();
        }
        RankTimes {
            rank: r,
            step_ms: self.step_ms[r * steps..(r + 1) * steps].to_vec(),
            all_reduce_ms: self.all_reduce_ms[r * steps..(r + 1) * steps].to_vec(),
            exchange,
        }
    }
}

/// `bench elastic --mpi` without the feature: the error saying how to build it.
#[cfg(not(feature = "mpi"))]
pub fn run_mpi(_quick: bool) -> Result<(), BenchError> {
    Err(run_err(
        "bench elastic --mpi needs the examples' cargo feature `mpi` (OpenMPI: apt-get install -y libopenmpi-dev openmpi-bin libclang-dev): cargo build --release -p examples --features mpi --bin bench, then mpirun -np 2 target/release/bench elastic --mpi",
    ))
}
