//! Elastic data parallelism over Burn pipelines (not implemented yet).
//!
//! This crate will replicate `burn-pipe` pipelines over the devices that
//! freezing frees (AutoDP: `devices / K` replicas), all-reduce gradients
//! across replicas with burn-collective, and own the PipeTransformer loop that
//! moves the freeze front, re-plans the pipeline and resizes the replica group
//! each epoch. It has no public API yet; see `../shared/ARCHITECTURE.md` for
//! the plan.
