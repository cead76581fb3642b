//! The benchmarks behind `--bin bench`, one file each, and their report writer.

pub mod alloc;
pub mod elastic;
pub mod elastic_nodes;
pub mod freeze;
pub mod headline;
pub mod pipe;
mod report;

pub use report::{BenchError, median, title, write_report};
