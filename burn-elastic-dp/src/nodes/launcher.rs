//! What an MPI launcher (`mpirun`, `mpiexec`, `srun`) tells a process through its environment, read
//! without MPI: how many processes the job has and which of them share this machine.

use crate::error::ElasticError;

fn var(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Processes in the job this process was launched into, as the launcher's
/// environment says: OpenMPI's `OMPI_COMM_WORLD_SIZE`, MPICH's and Intel
/// MPI's (and `srun --mpi=pmi2`'s) `PMI_SIZE`, or Slurm's
/// `SLURM_STEP_NUM_TASKS` under `srun --mpi=pmix`. `None` outside a
/// launcher. Read without MPI, so that a binary built without the cargo
/// feature `mpi` can refuse to run as one of N independent copies
/// ([`check_mpi_build`]).
pub fn world_size() -> Option<usize> {
    var("OMPI_COMM_WORLD_SIZE")
        .or_else(|| var("PMI_SIZE"))
        .or_else(|| {
            std::env::var_os("PMIX_RANK")
                .is_some()
                .then(|| var("SLURM_STEP_NUM_TASKS"))
                .flatten()
        })
}

/// This process's rank among the job's processes on this machine, as the
/// launcher's environment says (`OMPI_COMM_WORLD_LOCAL_RANK`,
/// `MPI_LOCALRANKID`, `SLURM_LOCALID`); `None` outside a launcher: ranks
/// on one machine take disjoint devices by it. With the feature `mpi`,
/// [`Mpi::local_rank`](crate::Mpi::local_rank) asks MPI itself.
pub fn local_rank() -> Option<usize> {
    var("OMPI_COMM_WORLD_LOCAL_RANK")
        .or_else(|| var("MPI_LOCALRANKID"))
        .or_else(|| var("PMI_LOCAL_RANK"))
        .or_else(|| var("SLURM_LOCALID"))
}

/// Fails when this process was launched as one of several processes of an
/// MPI job but this build has no MPI (the cargo feature `mpi` of
/// burn-elastic-dp): it would run as one of N independent jobs, each
/// training alone into the same output directory. Call it at the start of
/// a binary.
///
/// ```
/// // Outside a launcher (or with the feature on) nothing is refused.
/// if burn_elastic_dp::launcher::world_size().is_none() {
///     assert!(burn_elastic_dp::launcher::check_mpi_build().is_ok());
/// }
/// ```
pub fn check_mpi_build() -> Result<(), ElasticError> {
    match world_size() {
        Some(size) if size > 1 && !cfg!(feature = "mpi") => {
            Err(ElasticError::BadNodeConfig(format!(
                "started by an MPI launcher as one of {size} processes, but built without the cargo feature `mpi`: \
                 each process would train alone; build with --features mpi (apt-get install -y libopenmpi-dev openmpi-bin libclang-dev), or run one process without mpirun"
            )))
        }
        _ => Ok(()),
    }
}

/// The element-wise maximum of every process's `values` in the MPI job
/// (the same on every rank), for settings each rank measures before any
/// group exists (a memory budget from measured activations, say), so that
/// every rank configures the same run; `values` unchanged in a job of one
/// process. Every rank must call it, at the same point of its program;
/// within `timeout` (else [`ElasticError::NodesMissing`]). Needs a held
/// [`Mpi`](crate::Mpi).
///
/// ```no_run
/// use std::time::Duration;
///
/// let _mpi = burn_elastic_dp::Mpi::init()?;
/// let measured = 41.5_f64;
/// let agreed = burn_elastic_dp::launcher::agree_max(&[measured], Duration::from_secs(60))?;
/// assert!(agreed[0] >= measured);
/// # Ok::<(), burn_elastic_dp::ElasticError>(())
/// ```
#[cfg(feature = "mpi")]
pub fn agree_max(values: &[f64], timeout: std::time::Duration) -> Result<Vec<f64>, ElasticError> {
    let deadline = std::time::Instant::now() + timeout;
    // A link of one (notional) replica per rank: the exchange needs no more.
    match crate::nodes::mpi::join(1, timeout, timeout)? {
        Some(link) => link.max(values.to_vec(), deadline),
        None => Ok(values.to_vec()),
    }
}
