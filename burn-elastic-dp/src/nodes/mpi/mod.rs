//! The exchange between processes over MPI (cargo feature `mpi`): the
//! processes of one MPI job (`mpirun`), one [`NodeLink`] each.
//!
//! Each process's leader replica hands its values to the link's MPI thread,
//! which, in exchange order:
//! 1. tells every other rank it arrived (an 8-byte message);
//! 2. checks with one small `MPI_Allreduce` that every rank is at the same
//!    exchange with as many values;
//! 3. sums the values with one `MPI_Allreduce` (SUM, f32) per bucket of at
//!    most [`BUCKET_VALUES`], in order, from the stage's send buffer into
//!    its receive buffer, both kept across steps (reallocated only when the
//!    stage's gradients change size);
//! 4. takes the other ranks' arrival messages.
//!
//! Only the leader copies: its gradients (after the sum inside the process,
//! the same on every local replica) into the send buffer, and the sums
//! back into one tensor per parameter, which the other local replicas
//! share (a tensor handle each, moved to their devices); they drop their
//! own gradients without reading them.
//!
//! Same bits on every rank: with two ranks each element of the sum is one
//! f32 addition of the two ranks' values, and addition is commutative, so
//! both ranks hold the same bits whatever algorithm MPI picks. With more
//! ranks the MPI standard does not promise it (only recommends it), so the
//! ranks then compare a CRC-32 of the result (one more small all-reduce) and,
//! should they differ, take rank 0's result (`MPI_Bcast`). Reducing to rank 0
//! and broadcasting every time would move twice the bytes of a ring
//! all-reduce on two ranks.
//!
//! No hang: MPI calls have no timeout, so the leader waits for the MPI
//! thread only until the step's deadline (a watchdog). Past it, the ranks
//! whose arrival message has not come are the ones that did not arrive; the
//! step fails with [`ElasticError::NodesStalled`] naming them and the step,
//! the link stays failed (the MPI thread stays blocked), and the job ends:
//! when [`Mpi`] is dropped, or at the latest one more step timeout later,
//! this process calls `MPI_Abort`, which ends every rank.

mod gradients;
mod link;
mod sum;
mod universe;

pub(crate) use gradients::all_reduce_gradients;
pub(crate) use link::{NodeLink, StepHeader, join};
pub use sum::BUCKET_VALUES;
pub use universe::Mpi;
pub(crate) use universe::{job_rank, job_size};
