//! Balancing (AutoPipe): unit costs and profiles, the partition into stages,
//! the micro-batch count, and each stage's memory.

pub(crate) mod costs;
pub(crate) mod memory;
pub(crate) mod micro_count;
pub(crate) mod partition;
pub(crate) mod profile;
