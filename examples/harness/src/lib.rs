//! The benchmark harness of this repository, behind `bench` and `plan`:
//! the benchmarks and their reports, the (b*) search for the strongest
//! configuration without freezing, the planner's presets, profiles and
//! calibration against measured runs, and the PNG plots.

// Device types are `Copy` on the CPU backend but not on CUDA: keep the clones.
#![allow(clippy::clone_on_copy)]

pub mod bench;
pub mod plan;
pub mod plots;
pub mod strongest;
