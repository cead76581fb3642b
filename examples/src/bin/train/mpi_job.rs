//! `train` under `mpirun` (cargo feature `mpi`): one process per node, each
//! running its share of the PipeTransformer replicas on its own `--devices`;
//! rank and world size come from MPI. Without the feature, or run without
//! a launcher, or in a job of one process, `train` runs as always.
//!
//! Across processes the group keeps its replicas (it cannot resize), so
//! AutoDP is off; the unit costs are parameter counts (each rank's timings
//! would differ, and with them its balance); plain Burn and (b*) are not
//! run. Rank 0 prints and saves what a one-process run does; the other
//! ranks print nothing on stdout (errors still go to stderr) and save
//! their model in `OUTPUT_DIR/rank-<r>`; every rank's trainer logs and
//! checkpoints are in `OUTPUT_DIR/rank-<r>` and `OUTPUT_DIR/checkpoints/rank-<r>`.

use std::path::Path;

use burn_elastic_dp::{NodeConfig, TrainerConfig};
use examples::job::Pretrained;

use crate::Failure;
use crate::cli::{Args, Costs};

/// This process's place in the job: the MPI environment (kept until the
/// run ends), its rank and the number of processes.
pub(crate) struct MpiJob {
    #[cfg(feature = "mpi")]
    _mpi: Option<burn_elastic_dp::Mpi>,
    rank: usize,
    size: usize,
}

/// Variables an MPI launcher sets in every process it starts.
#[cfg(feature = "mpi")]
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"];

impl MpiJob {
    /// Initialises MPI when the process was started by an MPI launcher
    /// (and built with the feature); else a job of one process.
    pub(crate) fn start() -> Result<Self, Failure> {
        #[cfg(feature = "mpi")]
        if LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            let mpi = burn_elastic_dp::Mpi::init().map_err(Failure::io)?;
            let (rank, size) = (mpi.rank(), mpi.size());
            return Ok(Self {
                _mpi: Some(mpi),
                rank,
                size,
            });
        }
        Ok(Self {
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

    /// The flags a run across processes runs with: AutoDP off, parameter
    /// costs, no plain Burn or (b*) run; `--plain` and `--costs profiled`
    /// refused. Says what changed (rank 0) and silences the other ranks'
    /// stdout. As given in a job of one process.
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
        if let Some(Costs::Profiled) = args.costs {
            return Err(Failure::usage(
                "--costs profiled under mpirun: each rank's timings differ, so would its balance; use --costs params",
            ));
        }
        args.no_dp = true;
        args.no_baseline = true;
        args.costs = Some(Costs::Params);
        if self.is_leader() {
            println!(
                "{} processes (MPI), {} devices each: AutoDP off (a group across processes keeps its replicas, so R cannot change), unit costs from parameter counts (the same balance on every rank); plain Burn and (b*) are not run under MPI. Ranks 1.. print nothing; their logs are in {}/rank-<r>",
                self.size,
                args.devices,
                args.output_dir.display()
            );
        } else {
            silence_stdout();
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
        config.check(devices).map_err(Failure::usage)?;
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

/// Sends this process's stdout to /dev/null (a rank other than 0: its
/// lines would repeat rank 0's).
fn silence_stdout() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 on two open descriptors; stdout then refers to
        // /dev/null (`null` may close: the duplicate stays open).
        unsafe {
            libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO);
        }
    }
}
