//! The MPI thread of a link: each exchange's MPI calls, in order (see the
//! steps in the documentation of `mpi`).

use crossbeam_channel::{Receiver, Sender};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::{ARRIVED, BUCKET_VALUES};

/// One exchange for the MPI thread.
pub(super) struct Job {
    pub round: u64,
    pub values: Vec<f32>,
    pub reply: Sender<Result<Vec<f32>, String>>,
}

/// The MPI thread: runs the exchanges in order until the link is dropped.
pub(super) fn serve(queue: Receiver<Job>) {
    let world = SimpleCommunicator::world();
    for job in queue {
        let result = sum(&world, job.round, &job.values);
        let _ = job.reply.send(result);
    }
}

/// Every rank's `values` summed, the same bits on every rank.
fn sum(world: &SimpleCommunicator, round: u64, values: &[f32]) -> Result<Vec<f32>, String> {
    let (rank, size) = (world.rank(), world.size());
    let others = || (0..size).filter(move |&r| r != rank);
    for peer in others() {
        world.process_at_rank(peer).send_with_tag(&round, ARRIVED);
    }
    // Every rank at the same exchange with as many values (MIN of x and -x
    // gives the smallest and the largest).
    let (round_i, len_i) = (round as i64, values.len() as i64);
    let mut check = [0i64; 4];
    world.all_reduce_into(
        &[round_i, -round_i, len_i, -len_i][..],
        &mut check[..],
        SystemOperation::min(),
    );
    let mut total = vec![0f32; values.len()];
    let agreed = check[0] == -check[1] && check[2] == -check[3];
    if agreed {
        for (send, receive) in values
            .chunks(BUCKET_VALUES)
            .zip(total.chunks_mut(BUCKET_VALUES))
        {
            world.all_reduce_into(send, receive, SystemOperation::sum());
        }
    }
    for peer in others() {
        let _: (u64, _) = world.process_at_rank(peer).receive_with_tag(ARRIVED);
    }
    if !agreed {
        return Err(format!(
            "the ranks are at exchanges {}..={} with {}..={} values: they run different steps or models",
            check[0], -check[1], check[2], -check[3]
        ));
    }
    if size > 2 {
        same_bits(world, &mut total);
    }
    Ok(total)
}

/// Makes every rank hold rank 0's `total` should the ranks' bits differ.
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
