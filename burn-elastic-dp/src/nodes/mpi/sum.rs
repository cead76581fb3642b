//! The MPI thread of a link: each exchange's MPI calls, in order.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Values per `MPI_Allreduce` of a group's exchange (64 MiB of f32; MPI
/// counts are 32-bit).
pub const BUCKET_VALUES: usize = 16 << 20;
/// The tag of arrival messages.
pub(super) const ARRIVED: i32 = 7;
/// Whether a link of this process failed: the job must end.

/// What one exchange combines across the ranks.
#[derive(Debug)]
pub(super) enum Payload {
    /// The element-wise sum of every rank's values (gradients, in the
    /// send buffer), the same bits on every rank (in the receive buffer).
    Sum(SumBuffers),
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
            Payload::Sum(buffers) => buffers.send.len(),
            Payload::Gather(v) => v.len(),
            Payload::Max(v) => v.len(),
        }
    }
}

/// The buffers of one stage's exchange of gradients, kept across steps by
/// the link: this process's values, and their sum over every rank (as long,
/// reallocated only when the stage's gradients change size).
#[derive(Debug, Default)]
pub(super) struct SumBuffers {
    pub send: Vec<f32>,
    pub recv: Vec<f32>,
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
/// 3. sums the values with one `MPI_Allreduce` (SUM, f32) per bucket of at
///    most [`BUCKET_VALUES`], in order, from the stage's send buffer into
///    its receive buffer, both kept across steps (reallocated only when the
///    stage's gradients change size);
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
        Payload::Sum(buffers) => buffers.send.len().div_ceil(BUCKET_VALUES),
        _ => 0,
    };
    let result = agreed.then(|| match payload {
        Payload::Sum(mut buffers) => {
            sum(world, &mut buffers);
            Payload::Sum(buffers)
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

/// Every rank's `buffers.send` summed into `buffers.recv` (as long), the
/// same bits on every rank: one `MPI_Allreduce` per bucket, into the
/// buffers kept across steps (mpi 0.8 has no `MPI_IN_PLACE`; the receive
/// buffer is the one reused instead).
fn sum(world: &SimpleCommunicator, buffers: &mut SumBuffers) {
    let SumBuffers { send, recv } = buffers;
    debug_assert_eq!(send.len(), recv.len());
    for (send, receive) in send
        .chunks(BUCKET_VALUES)
        .zip(recv.chunks_mut(BUCKET_VALUES))
    {
        world.all_reduce_into(send, receive, SystemOperation::sum());
    }
    if world.size() > 2 {
        same_bits(world, recv);
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
