//! The MPI thread of a link: each exchange's MPI calls, in order.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mpi::collective::SystemOperation;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Values per `MPI_Allreduce` of a group's exchange (64 MiB of f32; MPI
/// counts are 32-bit).
pub const BUCKET_VALUES: usize = 16 << 20;
/// The tag of arrival messages.
pub(super) const ARRIVED: i32 = 7;

/// What one exchange combines across the ranks.
#[derive(Debug)]
pub(super) enum Payload {
    /// The element-wise sum of every rank's values (a stage's gradients,
    /// in its arena), the same bits on every rank, in place.
    Sum(Arena),
    /// Every rank's record (as long on every rank), gathered in rank order:
    /// step headers, replica counts, checkpoint steps.
    Gather(Vec<i64>),
    /// The element-wise maximum of every rank's values (measurements):
    /// exact and independent of the order of the ranks.
    Max(Vec<f64>),
}

impl Payload {
    /// The kind, checked to be the same on every rank before any payload
    /// moves.
    fn kind(&self) -> i64 {
        match self {
            Payload::Sum(_) => 1,
            Payload::Gather(_) => 2,
            Payload::Max(_) => 3,
        }
    }

    fn len(&self) -> usize {
        match self {
            Payload::Sum(arena) => arena.values.len(),
            Payload::Gather(v) => v.len(),
            Payload::Max(v) => v.len(),
        }
    }
}

/// One stage's gradient arena, kept across steps by the link: the stage's
/// trainable gradients side by side, this process's sum going in and every
/// rank's sum coming out in the same buffer (`MPI_IN_PLACE`). Its capacity
/// follows the stage's gradients: it grows on the first step and after a
/// thaw or a repartition, and shrinks when it holds less than half of it.
#[derive(Debug, Default)]
pub(super) struct Arena {
    pub values: Vec<f32>,
}

/// One exchange for the MPI thread.
pub(super) struct Job {
    pub round: u64,
    pub payload: Payload,
    pub reply: Sender<Result<Done, String>>,
}

/// An exchange done: its result, and how long its MPI calls took.
#[derive(Debug)]
pub(super) struct Done {
    pub payload: Payload,
    /// The arrival messages and the typed check (kind, round, length).
    pub check: Duration,
    /// The payload's collectives.
    pub reduce: Duration,
    /// The payload's `MPI_Allreduce` calls (buckets) of a sum.
    pub buckets: usize,
}

/// The MPI thread: runs the exchanges in order until the link is dropped.
pub(super) fn serve(queue: Receiver<Job>) {
    let world = SimpleCommunicator::world();
    for job in queue {
        let result = exchange(&world, job.round, job.payload);
        let _ = job.reply.send(result);
    }
}

/// Runs one exchange: arrival messages, the check that every rank is at
/// the same exchange of the same kind and length, then the payload.
///
/// Each process's leader replica hands its values to the link's MPI thread,
/// which, in exchange order:
/// 1. tells every other rank it arrived (an 8-byte message);
/// 2. checks with one small `MPI_Allreduce` that every rank is at the same
///    exchange with as many values;
/// 3. sums the values with one `MPI_Allreduce` (SUM, f32, `MPI_IN_PLACE`)
///    per bucket of at most [`BUCKET_VALUES`], in order, in the stage's
///    arena, kept across steps;
/// 4. takes the other ranks' arrival messages.
fn exchange(world: &SimpleCommunicator, round: u64, payload: Payload) -> Result<Done, String> {
    let (rank, size) = (world.rank(), world.size());
    let start = Instant::now();
    let others = || (0..size).filter(move |&r| r != rank);
    for peer in others() {
        world.process_at_rank(peer).send_with_tag(&round, ARRIVED);
    }
    // Every rank at the same exchange, of the same kind, with as many
    // values (MIN of x and -x gives the smallest and the largest).
    let (round_i, kind, len) = (round as i64, payload.kind(), payload.len() as i64);
    let mut check = [0i64; 6];
    world.all_reduce_into(
        &[round_i, -round_i, kind, -kind, len, -len][..],
        &mut check[..],
        SystemOperation::min(),
    );
    let agreed = check[0] == -check[1] && check[2] == -check[3] && check[4] == -check[5];
    let mut check_time = start.elapsed();
    let reduce = Instant::now();
    let buckets = match &payload {
        Payload::Sum(arena) => arena.values.len().div_ceil(BUCKET_VALUES),
        _ => 0,
    };
    let result = agreed.then(|| match payload {
        Payload::Sum(mut arena) => {
            sum(world, &mut arena.values);
            Payload::Sum(arena)
        }
        Payload::Gather(record) => {
            let mut all = vec![0i64; record.len() * size as usize];
            world.all_gather_into(&record[..], &mut all[..]);
            Payload::Gather(all)
        }
        Payload::Max(values) => {
            let mut max = vec![0f64; values.len()];
            world.all_reduce_into(&values[..], &mut max[..], SystemOperation::max());
            Payload::Max(max)
        }
    });
    let reduce = reduce.elapsed();
    let received = Instant::now();
    for peer in others() {
        let _: (u64, _) = world.process_at_rank(peer).receive_with_tag(ARRIVED);
    }
    check_time += received.elapsed();
    let result = result.map(|payload| Done {
        payload,
        check: check_time,
        reduce,
        buckets,
    });
    result.ok_or_else(|| {
        format!(
            "the ranks are at exchanges {}..={} of kinds {}..={} with {}..={} values: they run different steps or models",
            check[0], -check[1], check[2], -check[3], check[4], -check[5]
        )
    })
}

/// Every rank's `values` summed in place, the same bits on every rank: one
/// `MPI_Allreduce` with `MPI_IN_PLACE` per bucket, so that no second buffer
/// is written and read back.
fn sum(world: &SimpleCommunicator, values: &mut [f32]) {
    for bucket in values.chunks_mut(BUCKET_VALUES) {
        sum_in_place(world, bucket);
    }
    if world.size() > 2 {
        same_bits(world, values);
    }
}

unsafe extern "C" {
    /// `MPI_IN_PLACE` from the system's mpi.h (`in_place.c`, built by
    /// build.rs): rsmpi 0.8 does not export it.
    fn burn_elastic_dp_mpi_in_place() -> *mut std::ffi::c_void;
}

/// `MPI_Allreduce(MPI_IN_PLACE, values, SUM)` over `world`: rsmpi 0.8's
/// safe API has no in-place form, so this calls the C function.
///
/// # Panics
/// When `values` holds more than `i32::MAX` values (MPI counts are 32-bit;
/// the callers pass buckets of at most [`BUCKET_VALUES`]).
fn sum_in_place(world: &SimpleCommunicator, values: &mut [f32]) {
    let count = i32::try_from(values.len()).expect("a bucket holds at most BUCKET_VALUES values");
    // SAFETY: `values` is a live, exclusive buffer of `count` f32 for the
    // call's whole duration (a blocking collective); MPI_IN_PLACE as the
    // send buffer makes MPI read and write it; RSMPI_FLOAT and RSMPI_SUM
    // are the library's handles for f32 and sum; `world` is a valid
    // communicator. With MPI's default error handler a failure aborts the
    // job, as every other collective of this link does.
    unsafe {
        mpi::ffi::MPI_Allreduce(
            burn_elastic_dp_mpi_in_place().cast_const(),
            values.as_mut_ptr().cast(),
            count,
            mpi::ffi::RSMPI_FLOAT,
            mpi::ffi::RSMPI_SUM,
            world.as_raw(),
        );
    }
}

/// Makes every rank hold rank 0's `total` should the ranks' bits differ.
///
/// Same bits on every rank: with two ranks each element of the sum is one
/// f32 addition of the two ranks' values, and addition is commutative, so
/// both ranks hold the same bits whatever algorithm MPI picks (and `sum`
/// skips this check). With more ranks the MPI standard does not promise it
/// (only recommends it), so the ranks then compare a CRC-32 of the result
/// (one more small all-reduce) and, should they differ, take rank 0's result
/// (`MPI_Bcast`). Reducing to rank 0 and broadcasting every time would move
/// twice the bytes of a ring all-reduce on two ranks.
fn same_bits(world: &SimpleCommunicator, total: &mut [f32]) {
    let mut hasher = crc32fast::Hasher::new();
    for chunk in total.chunks(4096) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        hasher.update(&bytes);
    }
    let crc = i64::from(hasher.finalize());
    let mut range = [0i64; 2];
    world.all_reduce_into(&[crc, -crc][..], &mut range[..], SystemOperation::min());
    if range[0] != -range[1] {
        tracing::debug!("the ranks' sums differ in their last bits: taking rank 0's");
        let root = world.process_at_rank(0);
        for bucket in total.chunks_mut(BUCKET_VALUES) {
            root.broadcast_into(bucket);
        }
    }
}
