//! A process's link to the other processes: joining them, and each exchange's hand-off to the MPI
//! thread.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};
use mpi::environment::Threading;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::error::ElasticError;

use super::sum::{ARRIVED, Arena, Done, Job, Payload, serve};

use super::universe::{FAILED, end_job};
use crate::nodes::phases::ExchangePhases;

/// The result of one exchange, from the leader to the other local replicas:
/// one reduced gradient per parameter (`Vec<Tensor<B, 1>>` of the inner
/// backend), shared, or why there is none.
type Reduced = Result<Arc<dyn Any + Send + Sync>, String>;

/// The gradient arena of every stage's exchange, kept across steps.
#[derive(Debug, Default)]
pub(super) struct Arenas {
    /// By stage; taken by the leader for its exchange and put back after.
    stages: Vec<Option<Arena>>,
    /// Whether the stage's arena was used since the last step began.
    used: Vec<bool>,
}

impl Arenas {
    /// Forgets the arenas of the stages that had no exchange in the last
    /// step (a repartition to fewer stages, say).
    fn new_step(&mut self) {
        for (stage, used) in self.stages.iter_mut().zip(&mut self.used) {
            if !*used {
                *stage = None;
            }
            *used = false;
        }
    }

    pub(super) fn take(&mut self, stage: usize) -> Arena {
        if self.stages.len() <= stage {
            self.stages.resize_with(stage + 1, || None);
            self.used.resize(stage + 1, false);
        }
        self.used[stage] = true;
        self.stages[stage].take().unwrap_or_default()
    }

    pub(super) fn keep(&mut self, stage: usize, arena: Arena) {
        if let Some(slot) = self.stages.get_mut(stage) {
            *slot = Some(arena);
        }
    }
}

/// What a rank says of itself at the start of every step (one small
/// all-gather): the ranks must agree on the step and the shape; the
/// replica counts and the stop requests are read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepHeader {
    /// This process's replicas.
    pub local: usize,
    /// A hash of the shape every replica runs (balance, front, micro-batches).
    pub shape: u64,
    /// Whether this process was asked to stop (a SIGTERM, say).
    pub stop: bool,
}

/// The channels from the leader replica to the other local replicas.
struct Followers {
    senders: Vec<Sender<Reduced>>,
    inboxes: Vec<Receiver<Reduced>>,
}

impl Followers {
    /// Channels for `local` replicas (the leader and `local - 1` others).
    fn new(local: usize) -> Self {
        // Unbounded: the leader may run ahead through stages with nothing to
        // all-reduce in this process; the results queue up in stage order.
        let (senders, inboxes) = (1..local).map(|_| unbounded()).unzip();
        Self { senders, inboxes }
    }
}

/// This process's connection to the other processes of the MPI job.
pub(crate) struct NodeLink {
    pub(super) rank: usize,
    size: usize,
    /// Replicas of each process, by rank, as last exchanged.
    counts: Mutex<Vec<usize>>,
    jobs: Mutex<Sender<Job>>,
    /// Exchanges done, and why the link failed once it has.
    state: Mutex<(u64, Option<String>)>,
    /// Steps begun; the step of the exchange under way, if any.
    steps: AtomicU64,
    under_way: Mutex<Option<u64>>,
    /// To local replicas `1..`: the leader's result of each exchange.
    followers: Mutex<Followers>,
    /// Whether a rank asked to stop in the last step's header.
    stop_seen: AtomicBool,
    /// The phases of this step's exchanges of gradients, as the leader saw them.
    phases: Mutex<ExchangePhases>,
    /// The leader's gradient arenas, by stage, kept across steps.
    pub(super) arenas: Mutex<Arenas>,
    /// Dropped on abort, which wakes the waits of this process.
    abort_tx: Mutex<Option<Sender<()>>>,
    abort_rx: Receiver<()>,
    /// The group's bound on a step, reported in timeouts.
    step_timeout: Duration,
}

impl std::fmt::Debug for NodeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLink")
            .field("rank", &self.rank)
            .field("replicas", &self.replicas())
            .finish_non_exhaustive()
    }
}

pub(super) fn node_error(node: usize, message: String) -> ElasticError {
    ElasticError::Node { node, message }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Joins the other processes of the MPI job, exchanging every rank's
/// replica count within `join_timeout`: `None` in a job of one process.
pub(crate) fn join(
    local: usize,
    step_timeout: Duration,
    join_timeout: Duration,
) -> Result<Option<Arc<NodeLink>>, ElasticError> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(ElasticError::BadNodeConfig(
            "MPI is not initialised: hold a burn_elastic_dp::Mpi (Mpi::init) in a process started by mpirun".into(),
        ));
    }
    if mpi::environment::threading_support() != Threading::Multiple {
        return Err(ElasticError::BadNodeConfig(
            "MPI was initialised without MPI_THREAD_MULTIPLE (use burn_elastic_dp::Mpi::init)"
                .into(),
        ));
    }
    let world = SimpleCommunicator::world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    if size == 1 {
        return Ok(None);
    }
    let (jobs, queue) = unbounded::<Job>();
    std::thread::Builder::new()
        .name("burn-elastic-dp mpi".into())
        .spawn(move || {
            burn_pipe::plumbing::quiet_worker_panics();
            serve(queue)
        })
        .map_err(|error| node_error(rank, format!("starting the MPI thread: {error}")))?;
    let (abort_tx, abort_rx) = bounded(0);
    let link = NodeLink {
        rank,
        size,
        counts: Mutex::new(Vec::new()),
        jobs: Mutex::new(jobs),
        state: Mutex::new((0, None)),
        steps: AtomicU64::new(0),
        under_way: Mutex::new(None),
        followers: Mutex::new(Followers::new(local)),
        stop_seen: AtomicBool::new(false),
        phases: Mutex::new(ExchangePhases::default()),
        arenas: Mutex::new(Arenas::default()),
        abort_tx: Mutex::new(Some(abort_tx)),
        abort_rx,
        step_timeout,
    };
    link.set_local(local, Instant::now() + join_timeout)
        .map_err(|error| match error {
            ElasticError::NodesStalled { missing, .. } => ElasticError::NodesMissing {
                missing,
                waited: join_timeout,
            },
            other => other,
        })?;
    tracing::info!(
        rank,
        replicas = ?link.replicas(),
        "joined the processes of the replica group (MPI)"
    );
    Ok(Some(Arc::new(link)))
}

impl NodeLink {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Every rank's replica count, as last exchanged.
    pub fn replicas(&self) -> Vec<usize> {
        lock(&self.counts).clone()
    }

    /// Whether a rank asked to stop in the last step's header.
    pub fn stop_seen(&self) -> bool {
        self.stop_seen.load(Ordering::SeqCst)
    }

    /// The phases of this step's exchanges of gradients so far (the last
    /// step's once it ended), as this process's leader replica saw them.
    pub fn phases(&self) -> ExchangePhases {
        *lock(&self.phases)
    }

    /// Adds `phases` to this step's.
    pub(super) fn record(&self, phases: &ExchangePhases) {
        lock(&self.phases).add(phases);
    }

    /// Sets this process's replica count to `local` (at a step boundary, on
    /// every rank at the same point: a resize in lockstep, or the join) and
    /// exchanges every rank's count, within `deadline`.
    pub fn set_local(&self, local: usize, deadline: Instant) -> Result<(), ElasticError> {
        *lock(&self.followers) = Followers::new(local);
        let all = self.gather(vec![local as i64], deadline)?;
        let counts: Vec<usize> = all.iter().map(|r| r[0].max(0) as usize).collect();
        if let Some(rank) = counts.iter().position(|&c| c == 0) {
            return Err(node_error(rank, "it has no replica".into()));
        }
        *lock(&self.counts) = counts;
        Ok(())
    }

    /// Begins a step: every rank's [`StepHeader`] gathered within
    /// `deadline` (one small all-gather), the ranks checked to be at the
    /// same step with the same shape, and every rank's replica count and
    /// stop request taken from it. A rank that disagrees fails the step
    /// with an error naming it (every rank sees the same headers, so every
    /// rank fails alike).
    pub fn begin_step(
        &self,
        header: StepHeader,
        deadline: Instant,
    ) -> Result<Vec<usize>, ElasticError> {
        let step = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        *lock(&self.phases) = ExchangePhases::default();
        lock(&self.arenas).new_step();
        let record = vec![
            step as i64,
            header.local as i64,
            header.shape as i64,
            i64::from(header.stop),
        ];
        let all = self.gather(record, deadline)?;
        let first = &all[0];
        for (rank, row) in all.iter().enumerate() {
            if row[0] != first[0] || row[2] != first[2] {
                return Err(node_error(
                    rank,
                    format!(
                        "out of lockstep: at step {} with shape {:016x} ({} replicas), while rank 0 is at step {} with shape {:016x} ({} replicas); every rank must change its shape at the same step by the same rule",
                        row[0], row[2] as u64, row[1], first[0], first[2] as u64, first[1]
                    ),
                ));
            }
            if row[1] < 1 {
                return Err(node_error(rank, "it has no replica".into()));
            }
        }
        let counts: Vec<usize> = all.iter().map(|row| row[1] as usize).collect();
        *lock(&self.counts) = counts.clone();
        if all.iter().any(|row| row[3] != 0) {
            self.stop_seen.store(true, Ordering::SeqCst);
        }
        Ok(counts)
    }

    /// Every rank's `record` (as long on every rank), by rank, within
    /// `deadline`. Every rank must call it at the same point.
    pub fn gather(
        &self,
        record: Vec<i64>,
        deadline: Instant,
    ) -> Result<Vec<Vec<i64>>, ElasticError> {
        let len = record.len();
        match self.exchange(Payload::Gather(record), deadline)?.payload {
            Payload::Gather(all) if len > 0 => Ok(all.chunks(len).map(<[i64]>::to_vec).collect()),
            Payload::Gather(_) => Ok(vec![Vec::new(); self.size]),
            _ => Err(node_error(
                self.rank,
                "the MPI thread answered another kind of exchange".into(),
            )),
        }
    }

    /// The element-wise maximum over every rank of `values` (as many on
    /// every rank), within `deadline`: exact, the same on every rank.
    pub fn max(&self, values: Vec<f64>, deadline: Instant) -> Result<Vec<f64>, ElasticError> {
        match self.exchange(Payload::Max(values), deadline)?.payload {
            Payload::Max(max) => Ok(max),
            _ => Err(node_error(
                self.rank,
                "the MPI thread answered another kind of exchange".into(),
            )),
        }
    }

    /// Fails the link: whatever waits on it in this process returns with an
    /// error; the other processes see this one miss the exchange. The link
    /// stays failed and the job ends (see [`NodeLink::exchange`]).
    pub fn abort(&self) {
        self.fail("the step failed or passed its deadline in this process".into());
        lock(&self.abort_tx).take();
    }

    /// The error of the exchange under way, if any: the step and the ranks
    /// that have not arrived at it.
    pub fn waiting_on(&self) -> Option<ElasticError> {
        let step = (*lock(&self.under_way))?;
        Some(ElasticError::NodesStalled {
            step,
            missing: self.not_arrived(),
            waited: self.step_timeout,
        })
    }

    /// The other ranks whose arrival message for the exchange under way has
    /// not come.
    fn not_arrived(&self) -> Vec<usize> {
        let world = SimpleCommunicator::world();
        (0..self.size)
            .filter(|&r| r != self.rank)
            .filter(|&r| {
                world
                    .process_at_rank(r as i32)
                    .immediate_probe_with_tag(ARRIVED)
                    .is_none()
            })
            .collect()
    }

    /// Marks the link failed; the job ends at the latest one step timeout later.
    fn fail(&self, why: String) {
        let mut state = lock(&self.state);
        if state.1.is_some() {
            return;
        }
        state.1 = Some(why.clone());
        if !FAILED.swap(true, Ordering::SeqCst) {
            let grace = self.step_timeout;
            let _ = std::thread::Builder::new()
                .name("burn-elastic-dp mpi watchdog".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    end_job(&format!(
                        "{why}, and the process had not ended {grace:?} later"
                    ));
                });
        }
    }

    /// The group-wide sum of `arena`'s values (this process's local sum),
    /// in place, by the leader replica; the arena comes back for the next
    /// step. Every process must call this in the same order with as many
    /// values.
    pub(super) fn sum(&self, arena: Arena, deadline: Instant) -> Result<Arena, ElasticError> {
        let values = arena.values();
        match self.exchange(Payload::Sum(arena), deadline)? {
            Done {
                payload: Payload::Sum(arena),
                check,
                reduce,
                buckets,
                skipped,
            } => {
                self.record(&ExchangePhases {
                    exchanges: 1,
                    values,
                    buckets,
                    skipped,
                    check,
                    all_reduce: reduce,
                    ..ExchangePhases::default()
                });
                Ok(arena)
            }
            _ => Err(node_error(
                self.rank,
                "the MPI thread answered another kind of exchange".into(),
            )),
        }
    }

    /// Hands the leader's result of an exchange to the other local replicas.
    pub(super) fn share(&self, result: Reduced) {
        let senders = lock(&self.followers).senders.clone();
        for follower in &senders {
            let _ = follower.send(result.clone());
        }
    }

    /// The leader's result of the next exchange, for local replica
    /// `replica` (not the leader), waited for until `deadline`.
    pub(super) fn leader_result(
        &self,
        replica: usize,
        deadline: Instant,
    ) -> Result<Arc<dyn Any + Send + Sync>, ElasticError> {
        let inbox = lock(&self.followers).inboxes.get(replica - 1).cloned();
        let Some(inbox) = inbox else {
            return Err(node_error(
                self.rank,
                format!("local replica {replica} is not in the group"),
            ));
        };
        let timeout = deadline.saturating_duration_since(Instant::now());
        select! {
            recv(inbox) -> reduced => match reduced {
                Ok(Ok(reduced)) => Ok(reduced),
                Ok(Err(message)) => Err(node_error(self.rank, message)),
                Err(_) => Err(node_error(self.rank, "the leader replica is gone".into())),
            },
            recv(self.abort_rx) -> _ => Err(node_error(self.rank, "the step was aborted".into())),
            default(timeout) => Err(ElasticError::NodesMissing { missing: vec![self.rank], waited: self.step_timeout }),
        }
    }

    /// Runs one exchange on the MPI thread, waiting for it until `deadline`.
    ///
    /// No hang: MPI calls have no timeout, so the leader waits for the MPI
    /// thread only until the step's deadline (a watchdog). Past it, the ranks
    /// whose arrival message has not come are the ones that did not arrive; the
    /// step fails with [`ElasticError::NodesStalled`] naming them and the step,
    /// the link stays failed (the MPI thread stays blocked), and the job ends:
    /// when [`Mpi`](super::Mpi) is dropped, or at the latest one more step
    /// timeout later, this process calls `MPI_Abort`, which ends every rank.
    fn exchange(&self, payload: Payload, deadline: Instant) -> Result<Done, ElasticError> {
        let round = {
            let state = lock(&self.state);
            if let Some(why) = &state.1 {
                return Err(node_error(
                    self.rank,
                    format!(
                        "the link to the other processes failed earlier ({why}); start every process again"
                    ),
                ));
            }
            state.0
        };
        let step = self.steps.load(Ordering::SeqCst);
        let (reply, result) = bounded(1);
        let job = Job {
            round,
            payload,
            reply,
        };
        if lock(&self.jobs).send(job).is_err() {
            return Err(node_error(self.rank, "the MPI thread is gone".into()));
        }
        *lock(&self.under_way) = Some(step);
        let timeout = deadline.saturating_duration_since(Instant::now());
        let outcome = select! {
            recv(result) -> total => total.unwrap_or_else(|_| Err("the MPI thread is gone".into())).map_err(|message| node_error(self.rank, message)),
            recv(self.abort_rx) -> _ => Err(node_error(
                self.rank,
                "the exchange was aborted here (the step failed or passed its deadline)".into(),
            )),
            default(timeout) => Err(ElasticError::NodesStalled {
                step,
                missing: self.not_arrived(),
                waited: self.step_timeout,
            }),
        };
        *lock(&self.under_way) = None;
        match outcome {
            Ok(total) => {
                lock(&self.state).0 += 1;
                Ok(total)
            }
            Err(error) => {
                tracing::error!(%error, "cross-process exchange failed");
                self.fail(error.to_string());
                Err(error)
            }
        }
    }
}
