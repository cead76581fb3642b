//! The MPI thread of a link: each exchange's MPI calls, in order.

use std::time::{Duration, Instant};

use burn::tensor::TensorData;
use crossbeam_channel::{Receiver, Sender};
use mpi::collective::SystemOperation;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::nodes::rows;

/// Values per `MPI_Allreduce` of a group's exchange (64 MiB of f32; MPI
/// counts are 32-bit).
pub const BUCKET_VALUES: usize = 16 << 20;
/// Gradients of at least this many values are reduced in their own memory
/// (one `MPI_Allreduce` each, no copy where the backend hands its buffer
/// over); smaller ones are packed side by side in the stage's arena, where a
/// copy costs less than an MPI call of their own.
pub(super) const WHOLE_VALUES: usize = 1 << 16;
/// A two-dimensional gradient of at least this many rows is a table of
/// which a step touches few rows (a word embedding's: one row per token of
/// the vocabulary seen in the batch): only the rows that are not all zero on
/// some rank are exchanged.
pub(super) const SPARSE_ROWS: usize = 1 << 13;
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
            Payload::Sum(arena) => arena.values(),
            Payload::Gather(v) => v.len(),
            Payload::Max(v) => v.len(),
        }
    }
}

/// One stage's gradients for an exchange, summed in place (`MPI_IN_PLACE`):
/// this process's sum goes in and every rank's sum comes out in the same
/// memory, with no second buffer.
///
/// - `whole`: each gradient of at least [`WHOLE_VALUES`] values in its own
///   memory, taken from its tensor (`into_data`, which on the CPU backend
///   hands the tensor's buffer over without a copy) and given back to a
///   tensor the same way; a table of at least [`SPARSE_ROWS`] rows (a word
///   embedding's) exchanges only its rows that some rank touched;
/// - `packed`: the smaller ones side by side, copied in and out (an MPI
///   call each would cost more than the copy). Kept across steps by the
///   link: its capacity follows the stage's small gradients; it grows on the
///   first step and after a thaw or a repartition, and shrinks when it holds
///   less than half of it.
///
/// Every rank lays a stage out alike (the module's visiting order and the
/// same threshold), and the MPI thread reduces `whole` in order, then
/// `packed`.
#[derive(Debug, Default)]
pub(super) struct Arena {
    pub whole: Vec<Whole>,
    pub packed: Vec<f32>,
}

/// A gradient summed in its own memory.
#[derive(Debug)]
pub(super) struct Whole {
    /// Its values (f32).
    pub data: TensorData,
    /// Values per row when only its touched rows are exchanged (a table of
    /// at least [`SPARSE_ROWS`] rows); 0: all of it, in buckets.
    pub row: usize,
}

impl Whole {
    /// `data` (f32) of a gradient of shape `shape`.
    pub fn new(data: TensorData, shape: &[usize]) -> Self {
        let row = match shape {
            [rows, width] if *rows >= SPARSE_ROWS && *width > 0 => *width,
            _ => 0,
        };
        Self { data, row }
    }
}

/// One buffer of an exchange: values, and their row width when only the
/// touched rows are exchanged (0: all of them).
type Buffer<'a> = (&'a mut [f32], usize);

impl Arena {
    /// The f32 values it holds.
    pub fn values(&self) -> usize {
        self.packed.len()
            + self
                .whole
                .iter()
                .map(|whole| whole.data.num_elements())
                .sum::<usize>()
    }

    /// Its buffers in reduction order, as f32 slices.
    fn buffers(&mut self) -> Result<Vec<Buffer<'_>>, String> {
        let mut buffers = Vec::with_capacity(self.whole.len() + 1);
        for whole in &mut self.whole {
            let values = whole
                .data
                .as_mut_slice::<f32>()
                .map_err(|error| format!("a gradient's memory is not f32 values: {error:?}"))?;
            buffers.push((values, whole.row));
        }
        buffers.push((&mut self.packed[..], 0));
        Ok(buffers)
    }
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
    /// Values of a sum not sent: the rows of tables no rank touched.
    pub skipped: usize,
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
    let mut sent = Sent::default();
    let mut failed = None;
    let result = agreed.then(|| match payload {
        Payload::Sum(mut arena) => {
            match arena.buffers() {
                Ok(mut buffers) => sent = sum(world, &mut buffers),
                // Checked when the arena was filled: unreachable in practice,
                // and every rank then fails the same exchange at its check.
                Err(error) => failed = Some(error),
            }
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
    if let Some(error) = failed {
        return Err(error);
    }
    let result = result.map(|payload| Done {
        payload,
        check: check_time,
        reduce,
        buckets: sent.buckets,
        skipped: sent.skipped,
    });
    result.ok_or_else(|| {
        format!(
            "the ranks are at exchanges {}..={} of kinds {}..={} with {}..={} values: they run different steps or models",
            check[0], -check[1], check[2], -check[3], check[4], -check[5]
        )
    })
}

/// What a sum sent: its `MPI_Allreduce` calls, and the values it did not
/// send (rows no rank touched).
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    buckets: usize,
    skipped: usize,
}

/// Every rank's `buffers` summed in place, the same bits on every rank: one
/// `MPI_Allreduce` with `MPI_IN_PLACE` per bucket of each buffer, so that no
/// second buffer is written and read back; of a table, only its touched
/// rows ([`sum_rows`]).
fn sum(world: &SimpleCommunicator, buffers: &mut [Buffer<'_>]) -> Sent {
    let mut sent = Sent::default();
    for (values, row) in buffers.iter_mut() {
        if *row > 0 && values.len() % *row == 0 {
            sum_rows(world, values, *row, &mut sent);
        } else {
            sum_buckets(world, values, &mut sent);
        }
    }
    if world.size() > 2 {
        same_bits(world, buffers);
    }
    sent
}

/// `values` summed in place in buckets of at most [`BUCKET_VALUES`].
fn sum_buckets(world: &SimpleCommunicator, values: &mut [f32], sent: &mut Sent) {
    for bucket in values.chunks_mut(BUCKET_VALUES) {
        sum_in_place(world, bucket);
        sent.buckets += 1;
    }
}

/// `values`, rows of `width`, summed in place exchanging only the rows
/// some rank touched ([`rows`]): every rank marks its rows with a bit set
/// (one `MPI_Allreduce` of a byte per row, MAX), then the marked rows go
/// side by side into one buffer, summed in place and copied back. A row no
/// rank marked is +0.0 everywhere on every rank, which is its sum, so the
/// result has the bits of the whole table's sum; with more than half the
/// rows marked the whole table is summed instead.
fn sum_rows(world: &SimpleCommunicator, values: &mut [f32], width: usize, sent: &mut Sent) {
    let mine = rows::touched(values, width);
    let mut marks = vec![0u8; mine.len()];
    world.all_reduce_into(&mine[..], &mut marks[..], SystemOperation::max());
    let marked = marks.iter().filter(|&&m| m != 0).count();
    if !rows::worth_packing(marked, marks.len()) {
        sum_buckets(world, values, sent);
        return;
    }
    let mut packed = rows::pack(values, width, &marks);
    sum_buckets(world, &mut packed, sent);
    rows::unpack(values, width, &marks, &packed);
    sent.skipped += values.len() - packed.len();
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

/// Makes every rank hold rank 0's `buffers` should the ranks' bits differ.
///
/// Same bits on every rank: with two ranks each element of the sum is one
/// f32 addition of the two ranks' values, and addition is commutative, so
/// both ranks hold the same bits whatever algorithm MPI picks (and `sum`
/// skips this check). With more ranks the MPI standard does not promise it
/// (only recommends it), so the ranks then compare a CRC-32 of the result
/// (one more small all-reduce) and, should they differ, take rank 0's result
/// (`MPI_Bcast`). Reducing to rank 0 and broadcasting every time would move
/// twice the bytes of a ring all-reduce on two ranks.
fn same_bits(world: &SimpleCommunicator, buffers: &mut [Buffer<'_>]) {
    let mut hasher = crc32fast::Hasher::new();
    for chunk in buffers.iter().flat_map(|(values, _)| values.chunks(4096)) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        hasher.update(&bytes);
    }
    let crc = i64::from(hasher.finalize());
    let mut range = [0i64; 2];
    world.all_reduce_into(&[crc, -crc][..], &mut range[..], SystemOperation::min());
    if range[0] != -range[1] {
        tracing::debug!("the ranks' sums differ in their last bits: taking rank 0's");
        let root = world.process_at_rank(0);
        for (values, _) in buffers.iter_mut() {
            for bucket in values.chunks_mut(BUCKET_VALUES) {
                root.broadcast_into(bucket);
            }
        }
    }
}
