//! The benchmark harness behind `bench` and `plan`: the workspace's benchmarks, PipeTransformer
//! against the strongest setup without freezing (b*), and the planner against measured runs.

// Device types are `Copy` on the CPU backend but not on CUDA: keep the clones.
#![allow(clippy::clone_on_copy)]

pub mod bench;
pub mod plan;
pub mod plots;
pub mod strongest;
