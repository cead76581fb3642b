//! `train` under `mpirun` (cargo feature `mpi`): one process per node, each running its share of
//! the replicas on its own `--devices`; without the feature or a launcher, or alone, as always.

use std::path::Path;

use burn_elastic_dp::{NodeConfig, TrainerConfig};
use pipetransformer_jobs::job::Pretrained;

use crate::Failure;
use crate::cli::Args;

/// This process's place in the job: the MPI environment (kept until the
/// run ends), its rank and the number of processes, which come from MPI.
///
/// Across processes every part runs: AutoDP in lockstep (every rank adds
/// replicas on its freed devices at the same step, by the same rule), and
/// profiled costs and measured memory agreed across the ranks (the
/// slowest's times, the largest activations). Ranks on one machine take
/// disjoint devices (rank `l` of them on devices `l*d..(l+1)*d`). Plain
/// Burn and (b*) are not run. A binary built without the feature refuses
/// to run under a launcher as one of several processes. Rank 0 prints and
/// saves what a one-process run does; the other ranks print nothing on
/// stdout (errors still go to stderr) and save their model in
/// `OUTPUT_DIR/rank-<r>`; every rank's trainer logs and checkpoints are in
/// `OUTPUT_DIR/rank-<r>` and `OUTPUT_DIR/checkpoints/rank-<r>`.
pub(crate) struct MpiJob {
    #[cfg(feature = "mpi")]
    _mpi: Option<burn_elastic_dp::Mpi>,
    rank: usize,
    size: usize,
    /// This process's rank among the job's processes on its machine.
    local_rank: usize,
}

impl MpiJob {
    /// Initialises MPI when the process was started by an MPI launcher
    /// (and built with the feature); else a job of one process. Without the
    /// feature, a process launched as one of several is refused (it would
    /// train alone, into the same output directory as the others).
    pub(crate) fn start() -> Result<Self, Failure> {
        burn_elastic_dp::launcher::check_mpi_build().map_err(Failure::usage)?;
        #[cfg(feature = "mpi")]
        if burn_elastic_dp::launcher::world_size().is_some() {
            let mpi = burn_elastic_dp::Mpi::init().map_err(Failure::io)?;
            let (rank, size) = (mpi.rank(), mpi.size());
            return Ok(Self {
                local_rank: mpi.local_rank(),
                _mpi: Some(mpi),
                rank,
                size,
            });
        }
        Ok(Self {
            local_rank: 0,
            #[cfg(feature = "mpi")]
            _mpi: None,
            rank: 0,
            size: 1,
        })
    }

    /// Whether the run spans several processes.
    pub(crate) fn spans_processes(&self) -> bool {
        self.size > 1
    }

    /// Whether this process prints and saves the job's results (rank 0).
    pub(crate) fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// The flags a run across processes runs with: no plain Burn or (b*)
    /// run; `--plain` refused. Says so (rank 0), silences the other ranks'
    /// stdout, and moves this process's devices past those of the ranks
    /// before it on the same machine. As given in a job of one process.
    pub(crate) fn adapt_args(&self, args: &Args) -> Result<Args, Failure> {
        let mut args = args.clone();
        if !self.spans_processes() {
            return Ok(args);
        }
        if args.plain {
            return Err(Failure::usage(
                "--plain under mpirun: plain Burn runs on one device; run it without mpirun",
            ));
        }
        args.no_baseline = true;
        pipetransformer_jobs::backend::set_first_device(self.local_rank * args.devices as usize);
        if self.is_leader() {
            println!(
                "{} processes (MPI), {} devices each (ranks on one machine take disjoint devices): AutoDP in lockstep across the ranks, measurements agreed (the slowest rank's); plain Burn and (b*) are not run under MPI. Ranks 1.. print nothing; their logs are in {}/rank-<r>",
                self.size,
                args.devices,
                args.output_dir.display()
            );
        } else {
            pipetransformer_jobs::silence_stdout();
        }
        Ok(args)
    }

    /// The trainer's configuration joined to the other processes, checked
    /// again for what cannot work across them.
    pub(crate) fn adapt_config(
        &self,
        config: TrainerConfig,
        devices: usize,
    ) -> Result<TrainerConfig, Failure> {
        if !self.spans_processes() {
            return Ok(config);
        }
        let replicas = config.replicas.clone().with_nodes(Some(NodeConfig::new()));
        let config = config.with_replicas(replicas);
        config
            .validate_on(devices, self.size)
            .map_err(Failure::usage)?;
        Ok(config)
    }

    /// A rank other than 0: its trained model in `dir/rank-<r>/model.mpk`.
    pub(crate) fn save_model(&self, dir: &Path, model: &Pretrained) -> Result<(), Failure> {
        let dir = dir.join(format!("rank-{}", self.rank));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::io(format!("cannot make {}: {e}", dir.display())))?;
        let path = dir.join("model");
        model
            .save_file(&path)
            .map_err(|e| Failure::io(format!("cannot save the model to {}: {e}", path.display())))
    }
}
