//! MPI in this process: its initialisation, rank and size, and the end of the job.

use std::sync::atomic::{AtomicBool, Ordering};

use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::error::ElasticError;

/// Whether a link of this process failed: the job must end.
pub(super) static FAILED: AtomicBool = AtomicBool::new(false);

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
    /// This process's rank among the job's processes on this machine, and
    /// their number.
    local: (usize, usize),
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("local_rank", &self.local.0)
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
        // The processes sharing this machine's memory (MPI_Comm_split_type
        // SHARED): one collective call, made by every rank here at init.
        let world = SimpleCommunicator::world();
        let machine = world.split_shared(world.rank());
        let local = (machine.rank() as usize, machine.size() as usize);
        Ok(Self {
            universe: Some(universe),
            local,
        })
    }

    /// This process's rank among the job's processes on this machine (0
    /// first): ranks on one machine take disjoint devices by it (rank `l`
    /// of `n` on a machine with `n * d` GPUs takes devices `l*d..(l+1)*d`).
    pub fn local_rank(&self) -> usize {
        self.local.0
    }

    /// The job's processes on this machine.
    pub fn local_size(&self) -> usize {
        self.local.1
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

/// Processes in the MPI job when MPI is initialised and the job has
/// several; `None` otherwise.
pub(crate) fn job_size() -> Option<usize> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return None;
    }
    let size = SimpleCommunicator::world().size() as usize;
    (size > 1).then_some(size)
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
pub(super) fn end_job(why: &str) -> ! {
    tracing::error!(why, "ending the MPI job (MPI_Abort)");
    eprintln!("burn-elastic-dp: {why}; ending the MPI job (MPI_Abort)");
    SimpleCommunicator::world().abort(3)
}
