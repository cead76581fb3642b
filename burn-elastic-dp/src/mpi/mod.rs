//! The exchange between processes over MPI (cargo feature `mpi`): the
//! processes of one MPI job (`mpirun`), one [`NodeLink`] each.
//!
//! Each process's leader replica hands its values to the link's MPI thread,
//! which, in exchange order:
//! 1. tells every other rank it arrived (an 8-byte message);
//! 2. checks with one small `MPI_Allreduce` that every rank is at the same
//!    exchange with as many values;
//! 3. sums the values with one `MPI_Allreduce` (SUM, f32) per bucket of at
//!    most [`BUCKET_VALUES`], in order;
//! 4. takes the other ranks' arrival messages.
//!
//! Same bits on every rank: with two ranks each element of the sum is one
//! f32 addition of the two ranks' values, and addition is commutative, so
//! both ranks hold the same bits whatever algorithm MPI picks. With more
//! ranks the MPI standard does not promise it (only recommends it), so the
//! ranks then compare a CRC-32 of the result (one more small all-reduce) and,
//! should they differ, take rank 0's result (`MPI_Bcast`). Reducing to rank 0
//! and broadcasting every time would move twice the bytes of a ring
//! all-reduce on two ranks.
//!
//! No hang: MPI calls have no timeout, so the leader waits for the MPI
//! thread only until the step's deadline (a watchdog). Past it, the ranks
//! whose arrival message has not come are the ones that did not arrive; the
//! step fails with [`ElasticError::NodesStalled`] naming them and the step,
//! the link stays failed (the MPI thread stays blocked), and the job ends:
//! when [`Mpi`] is dropped, or at the latest one more step timeout later,
//! this process calls `MPI_Abort`, which ends every rank.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};
use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::error::ElasticError;

mod sum;

use sum::{Job, serve};

/// Values per `MPI_Allreduce` of a group's exchange (64 MiB of f32; MPI
/// counts are 32-bit).
pub const BUCKET_VALUES: usize = 16 << 20;
/// The tag of arrival messages.
const ARRIVED: i32 = 7;
/// Whether a link of this process failed: the job must end.
static FAILED: AtomicBool = AtomicBool::new(false);

/// MPI in this process, initialised with `MPI_THREAD_MULTIPLE`: create one
/// at the start of `main` in a process started by `mpirun` and hold it
/// while groups across processes ([`NodeConfig`](crate::NodeConfig)) are
/// used. Dropping it finalises MPI, or, after a failed exchange, ends the
/// whole job (`MPI_Abort`).
///
/// ```no_run
/// let mpi = burn_elastic_dp::Mpi::init()?;
/// println!("rank {} of {}", mpi.rank(), mpi.size());
/// # Ok::<(), burn_elastic_dp::ElasticError>(())
/// ```
pub struct Mpi {
    universe: Option<Universe>,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Mpi {
    /// Initialises MPI; fails when it already is, or when the library does
    /// not grant `MPI_THREAD_MULTIPLE`.
    pub fn init() -> Result<Self, ElasticError> {
        let bad = |message: &str| Err(ElasticError::BadNodeConfig(message.into()));
        let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Multiple)
        else {
            return bad("MPI is already initialised (one burn_elastic_dp::Mpi per process)");
        };
        if threading != Threading::Multiple {
            return bad("this MPI library does not grant MPI_THREAD_MULTIPLE");
        }
        Ok(Self {
            universe: Some(universe),
        })
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        SimpleCommunicator::world().rank() as usize
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        SimpleCommunicator::world().size() as usize
    }
}

/// This process's rank when MPI is initialised in a job of several
/// processes; `None` otherwise.
pub(crate) fn job_rank() -> Option<usize> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return None;
    }
    let world = SimpleCommunicator::world();
    (world.size() > 1).then(|| world.rank() as usize)
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if FAILED.load(Ordering::SeqCst) {
            // An MPI thread is still blocked in a collective: finalising
            // would wait for it forever.
            end_job("a cross-process exchange failed");
        }
        drop(self.universe.take());
    }
}

/// Ends every rank of the job.
fn end_job(why: &str) -> ! {
    tracing::error!(why, "ending the MPI job (MPI_Abort)");
    eprintln!("burn-elastic-dp: {why}; ending the MPI job (MPI_Abort)");
    SimpleCommunicator::world().abort(3)
}

/// The result of one exchange, from the leader to the other local replicas.
type Reduced = Result<Arc<Vec<f32>>, String>;

/// This process's connection to the other processes of the MPI job.
pub(crate) struct NodeLink {
    rank: usize,
    size: usize,
    /// Replicas of each process, by rank.
    replicas: Vec<usize>,
    jobs: Mutex<Sender<Job>>,
    /// Exchanges done, and why the link failed once it has.
    state: Mutex<(u64, Option<String>)>,
    /// Steps begun; the step of the exchange under way, if any.
    steps: AtomicU64,
    under_way: Mutex<Option<u64>>,
    /// To local replicas `1..`: the leader's result of each exchange.
    followers: Vec<Sender<Reduced>>,
    inboxes: Vec<Receiver<Reduced>>,
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
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

fn node_error(node: usize, message: String) -> ElasticError {
    ElasticError::Node { node, message }
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
        .spawn(move || serve(queue))
        .map_err(|error| node_error(rank, format!("starting the MPI thread: {error}")))?;
    // Unbounded: the leader may run ahead through stages with nothing to
    // all-reduce in this process; the results queue up in stage order.
    let (followers, inboxes) = (1..local).map(|_| unbounded()).unzip();
    let (abort_tx, abort_rx) = bounded(0);
    let mut link = NodeLink {
        rank,
        size,
        replicas: Vec::new(),
        jobs: Mutex::new(jobs),
        state: Mutex::new((0, None)),
        steps: AtomicU64::new(0),
        under_way: Mutex::new(None),
        followers,
        inboxes,
        abort_tx: Mutex::new(Some(abort_tx)),
        abort_rx,
        step_timeout,
    };
    let mut counts = vec![0.0; size];
    counts[rank] = local as f32;
    let counts = link
        .exchange(counts, Instant::now() + join_timeout)
        .map_err(|error| match error {
            ElasticError::NodesStalled { missing, .. } => ElasticError::NodesMissing {
                missing,
                waited: join_timeout,
            },
            other => other,
        })?;
    link.replicas = counts.iter().map(|&c| c as usize).collect();
    if let Some(rank) = link.replicas.iter().position(|&c| c == 0) {
        return Err(node_error(rank, "it has no replica".into()));
    }
    tracing::info!(
        rank,
        replicas = ?link.replicas,
        "joined the processes of the replica group (MPI)"
    );
    Ok(Some(Arc::new(link)))
}

impl NodeLink {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Every rank's replica count.
    pub fn replicas(&self) -> &[usize] {
        &self.replicas
    }

    /// Counts a step (named in the errors of its exchanges).
    pub fn begin_step(&self) {
        self.steps.fetch_add(1, Ordering::SeqCst);
    }

    /// Fails the link: whatever waits on it in this process returns with an
    /// error; the other processes see this one miss the exchange. The link
    /// stays failed and the job ends (see the module documentation).
    pub fn abort(&self) {
        self.fail("the step failed or passed its deadline in this process".into());
        self.abort_tx
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
    }

    /// The error of the exchange under way, if any: the step and the ranks
    /// that have not arrived at it.
    pub fn waiting_on(&self) -> Option<ElasticError> {
        let step = (*self.under_way.lock().unwrap_or_else(|p| p.into_inner()))?;
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
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
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

    /// The group-wide sum of `values` (this process's local sum, the same
    /// on every local replica), for local replica `replica`: the leader
    /// exchanges with the other processes, the others wait for its result.
    /// Every process must call this in the same order with as many values.
    pub fn all_reduce(
        &self,
        replica: usize,
        values: Vec<f32>,
        deadline: Instant,
    ) -> Result<Arc<Vec<f32>>, ElasticError> {
        if replica > 0 {
            let inbox = &self.inboxes[replica - 1];
            let timeout = deadline.saturating_duration_since(Instant::now());
            return select! {
                recv(inbox) -> reduced => match reduced {
                    Ok(Ok(reduced)) => Ok(reduced),
                    Ok(Err(message)) => Err(node_error(self.rank, message)),
                    Err(_) => Err(node_error(self.rank, "the leader replica is gone".into())),
                },
                recv(self.abort_rx) -> _ => Err(node_error(self.rank, "the step was aborted".into())),
                default(timeout) => Err(ElasticError::NodesMissing { missing: vec![self.rank], waited: self.step_timeout }),
            };
        }
        let result = self.exchange(values, deadline).map(Arc::new);
        let shared = result
            .as_ref()
            .map(Arc::clone)
            .map_err(|error| error.to_string());
        for follower in &self.followers {
            let _ = follower.send(shared.clone());
        }
        result
    }

    /// Runs one exchange on the MPI thread, waiting for it until `deadline`.
    fn exchange(&self, values: Vec<f32>, deadline: Instant) -> Result<Vec<f32>, ElasticError> {
        let round = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
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
            values,
            reply,
        };
        if self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .is_err()
        {
            return Err(node_error(self.rank, "the MPI thread is gone".into()));
        }
        *self.under_way.lock().unwrap_or_else(|p| p.into_inner()) = Some(step);
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
        *self.under_way.lock().unwrap_or_else(|p| p.into_inner()) = None;
        match outcome {
            Ok(total) => {
                self.state.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
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

/// The group-wide sum of the gradients of `module`'s parameters (this
/// process's sum in `grads`), flattened into one message per stage, for
/// local replica `replica`.
pub(crate) fn all_reduce_gradients<AB, M>(
    link: &NodeLink,
    replica: usize,
    module: &M,
    mut grads: GradientsParams,
    deadline: Instant,
) -> Result<GradientsParams, ElasticError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let (slots, flat) = crate::collective::flatten::<AB, M>(module, &mut grads);
    if flat.is_empty() {
        // Nothing trains here; the exchange still runs to keep every process
        // in step.
        link.all_reduce(replica, Vec::new(), deadline)?;
        return Ok(grads);
    }
    let flat = Tensor::cat(flat, 0);
    let (device, dtype) = (flat.device(), flat.dtype());
    let values = flat
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|error| node_error(link.rank, format!("reading gradients: {error:?}")))?;
    let len = values.len();
    let reduced = link.all_reduce(replica, values, deadline)?;
    let data = TensorData::new(reduced.as_ref().clone(), [len]).convert_dtype(dtype);
    let flat = Tensor::<AB::InnerBackend, 1>::from_data(data, &device);
    crate::collective::unflatten::<AB, M>(module, &mut grads, slots, flat);
    Ok(grads)
}
