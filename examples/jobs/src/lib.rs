//! The jobs that the binaries of `examples` and the benchmark harness run, on the backend the cargo
//! features choose: a tiny transformer pretrained, then fine-tuned plainly or with PipeTransformer.

// Device types are `Copy` on the CPU backend but not on CUDA: keep the clones.
#![allow(clippy::clone_on_copy)]

pub mod allocator;
pub mod backend;
pub mod cli;
pub mod job;
pub mod task;

/// The process's stop request, raised by SIGTERM (a scheduler's
/// preemption; a second SIGTERM ends the process at once): a trainer that
/// watches it checkpoints at its next step boundary and returns
/// `TrainerError::Stopped`, and the binaries exit with
/// [`burn_elastic_dp::STOPPED_EXIT_CODE`]. Installed on first use.
pub fn stop_signal() -> burn_elastic_dp::StopSignal {
    static SIGNAL: std::sync::OnceLock<burn_elastic_dp::StopSignal> = std::sync::OnceLock::new();
    SIGNAL
        .get_or_init(|| {
            burn_elastic_dp::StopSignal::on_termination().unwrap_or_else(|error| {
                tracing::warn!(%error, "SIGTERM not handled: the process ends at once on it");
                burn_elastic_dp::StopSignal::new()
            })
        })
        .clone()
}

/// Sends this process's stdout to /dev/null (Linux with glibc; elsewhere
/// nothing): the ranks other than 0 of an MPI job print nothing, so that
/// rank 0's tables are read alone.
pub fn silence_stdout() {
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

/// Sends `tracing` logs to stderr, filtered by `RUST_LOG` (default `info`,
/// burn-collective's at `warn`), coloured only on a terminal.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,burn_collective=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
