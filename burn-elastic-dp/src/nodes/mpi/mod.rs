//! The exchange between processes over MPI (cargo feature `mpi`): one [`NodeLink`] per process of
//! an MPI job (`mpirun`), whose MPI thread runs the exchanges, one after another.

mod gradients;
mod link;
mod sum;
mod universe;

pub(crate) use gradients::all_reduce_gradients;
pub(crate) use link::{NodeLink, StepHeader, join};
pub use sum::BUCKET_VALUES;
pub use universe::Mpi;
pub(crate) use universe::{job_rank, job_size};
