//! How a global batch is shared among every replica of a group, in this process and in the others:
//! one shard per replica, rank 0's replicas first; each process runs its own replicas' shards.

use crate::error::ElasticError;

/// How the global batch is shared: one shard per replica of the whole group.
#[derive(Debug, Clone)]
pub(crate) struct Shards {
    /// Every replica's shard, ranks in order.
    pub all: Vec<usize>,
    /// The index in `all` of this process's first replica.
    pub first: usize,
    /// This process's replicas.
    pub local: usize,
    /// Samples in the global batch.
    pub batch: usize,
}

impl Shards {
    /// This process's replicas' shards.
    pub fn mine(&self) -> Vec<usize> {
        self.all[self.first..self.first + self.local].to_vec()
    }

    /// Keeps this process's parts of a batch split by `all`.
    pub fn take<T>(&self, parts: Vec<T>) -> Vec<T> {
        parts
            .into_iter()
            .skip(self.first)
            .take(self.local)
            .collect()
    }

    /// The factor on local replica `replica`'s mean loss (its share of the
    /// global batch) so that the sum of the gradients over every replica of
    /// the group is the global batch's.
    pub fn scale(&self, replica: usize) -> f32 {
        self.all[self.first + replica] as f32 / self.batch as f32
    }

    /// The mean loss over this process's samples from its replicas' scaled losses.
    pub fn loss(&self, scaled: impl Iterator<Item = f32>) -> f32 {
        let samples: usize = self.mine().iter().sum();
        scaled.sum::<f32>() * self.batch as f32 / samples as f32
    }
}

/// Shares a batch of `batch` samples between the `local` replicas of this
/// process and those of the other processes: `nodes` is this process's rank
/// and every rank's replica count, when the group spans several processes.
pub(crate) fn shards(
    nodes: Option<(usize, &[usize])>,
    batch: usize,
    local: usize,
) -> Result<Shards, ElasticError> {
    let (replicas, first) = match nodes {
        // A replica of this process left behind by a failed step: the
        // other processes still count it, and cannot be told.
        Some((rank, counts)) if counts[rank] != local => return Err(ElasticError::NodesFixed),
        Some((rank, counts)) => (counts.iter().sum(), counts[..rank].iter().sum()),
        None => (local, 0),
    };
    let all = burn_pipe::micro::micro_batch_sizes(batch, replicas)
        .map_err(|_| ElasticError::BatchTooSmall { batch, replicas })?;
    Ok(Shards {
        all,
        first,
        local,
        batch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_runs_the_shards_of_its_replicas_after_those_of_lower_ranks() {
        // Ranks with 2, 1 and 1 replicas; 9 samples: shards 3, 2, 2, 2.
        let plan = shards(Some((1, &[2, 1, 1])), 9, 1).unwrap();
        assert_eq!(plan.all, vec![3, 2, 2, 2]);
        assert_eq!(plan.mine(), vec![2]);
        assert_eq!(plan.take(vec!['a', 'b', 'c', 'd']), vec!['c']);
        assert!((plan.scale(0) - 2.0 / 9.0).abs() < 1e-7);
        let single = shards(None, 7, 2).unwrap();
        assert_eq!(single.all, vec![4, 3]);
        assert_eq!(single.first, 0);
    }

    #[test]
    fn a_process_that_lost_a_replica_or_a_batch_too_small_is_refused() {
        assert!(matches!(
            shards(Some((0, &[2, 1])), 9, 1),
            Err(ElasticError::NodesFixed)
        ));
        assert!(matches!(
            shards(Some((0, &[2, 1])), 2, 2),
            Err(ElasticError::BatchTooSmall {
                batch: 2,
                replicas: 3
            })
        ));
    }

    /// The trainer's draw (`Trainer::next_batch`: the whole group's R, at
    /// least a sample per micro-batch of every replica, a small tail taken
    /// into the last batch) shared by `shards` among the ranks: every
    /// sample of the epoch is trained exactly once, by one replica of one
    /// rank, and every replica gets at least `micro` samples a step.
    fn epoch_across_ranks(len: usize, policy: crate::BatchPolicy, counts: &[usize], micro: usize) {
        let total: usize = counts.iter().sum();
        let mut sampler = crate::ElasticSampler::new(len, policy, 11).unwrap();
        let mut seen = vec![0usize; len];
        while let Some(batch) = sampler.next_batch_min(total, total * micro) {
            for (rank, &local) in counts.iter().enumerate() {
                let plan = shards(Some((rank, counts)), batch.len(), local).unwrap();
                let parts: Vec<Vec<usize>> = {
                    let mut rest = batch.as_slice();
                    plan.all
                        .iter()
                        .map(|&n| {
                            let (part, tail) = rest.split_at(n);
                            rest = tail;
                            part.to_vec()
                        })
                        .collect()
                };
                for part in plan.take(parts) {
                    assert!(
                        part.len() >= micro,
                        "len {len}, {policy:?}, counts {counts:?}: a replica of rank {rank} got {} samples for {micro} micro-batches",
                        part.len()
                    );
                    for index in part {
                        seen[index] += 1;
                    }
                }
            }
        }
        assert!(
            seen.iter().all(|&n| n == 1),
            "len {len}, {policy:?}, counts {counts:?}: samples seen {seen:?}"
        );
    }

    #[test]
    fn every_sample_once_across_ranks_and_replicas_whatever_the_tail() {
        // Two ranks of 2 replicas each, 2 micro-batches: a step needs 8
        // samples. Tails below one rank's need (3), between it and the
        // group's (6), and above (9), and none; both batch policies (a
        // global batch of 16 either way).
        let micro = 2;
        for counts in [vec![2, 2], vec![2, 1, 3]] {
            for tail in [0, 3, 6, 9] {
                let len = 32 + tail;
                epoch_across_ranks(
                    len,
                    crate::BatchPolicy::FixedGlobal { batch: 16 },
                    &counts,
                    micro,
                );
                let per_replica = 16usize.div_ceil(counts.iter().sum());
                epoch_across_ranks(
                    len,
                    crate::BatchPolicy::PerReplica { batch: per_replica },
                    &counts,
                    micro,
                );
            }
        }
    }
}
