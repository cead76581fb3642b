//! Shared pieces of the runnable PipeTransformer jobs: the backend chosen by
//! cargo feature, and logging set-up.

// Device types are `Copy` on the CPU backend but not on CUDA: keep the clones.
#![allow(clippy::clone_on_copy)]

pub mod backend;
pub mod bench;
pub mod elastic;
pub mod plan;

/// Sends `tracing` logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
