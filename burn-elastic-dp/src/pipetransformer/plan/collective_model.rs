//! The cost of an all-reduce, modelled on burn-collective 0.21's strategies (ring, tree,
//! centralized; local, then across nodes) and the replica group's bucketing ([`AllReduce`]).

use burn::collective::AllReduceStrategy;
use burn::config::Config;

use crate::AllReduce;
use crate::pipetransformer::plan::error::PlanError;

/// A link between two devices: bytes per second and seconds per message.
/// Costs follow the alpha-beta model: sending `b` bytes over a link costs
/// `latency + b / bandwidth`.
///
/// ```
/// use burn_elastic_dp::plan::Link;
///
/// // 100 Gb/s InfiniBand, 5 us per message.
/// let ib = Link::new(100e9 / 8.0, 5e-6);
/// assert_eq!(ib.transfer(12.5e9), 1.0 + 5e-6);
/// ```
#[derive(Config, Debug, Copy, PartialEq)]
pub struct Link {
    /// Bytes per second (> 0).
    pub bandwidth: f64,
    /// Seconds per message (>= 0).
    pub latency: f64,
}

impl Link {
    /// Seconds to send `bytes` bytes as one message.
    pub fn transfer(&self, bytes: f64) -> f64 {
        self.latency + bytes / self.bandwidth
    }

    /// Checks that the bandwidth is positive and the latency not negative,
    /// naming the link `what` in the error.
    pub fn validate(&self, what: &str) -> Result<(), PlanError> {
        if !(self.bandwidth.is_finite() && self.bandwidth > 0.0) {
            return Err(PlanError::Invalid(format!(
                "{what} bandwidth must be a positive number of bytes per second, got {}",
                self.bandwidth
            )));
        }
        if !(self.latency.is_finite() && self.latency >= 0.0) {
            return Err(PlanError::Invalid(format!(
                "{what} latency must be a number of seconds >= 0, got {}",
                self.latency
            )));
        }
        Ok(())
    }
}

/// Ring all-reduce of `bytes` over `n` peers (reduce-scatter then
/// all-gather, `n - 1` steps each, `bytes / n` per step):
/// `2 (n - 1) / n * bytes / bandwidth + 2 (n - 1) * latency`.
///
/// ```
/// use burn_elastic_dp::plan::{Link, ring_all_reduce};
///
/// let link = Link::new(1e9, 1e-5);
/// let t = ring_all_reduce(4e9, 4, link);
/// assert!((t - (1.5 * 4.0 + 6.0 * 1e-5)).abs() < 1e-12);
/// assert_eq!(ring_all_reduce(4e9, 1, link), 0.0);
/// ```
pub fn ring_all_reduce(bytes: f64, n: usize, link: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n = n as f64;
    2.0 * (n - 1.0) / n * bytes / link.bandwidth + 2.0 * (n - 1.0) * link.latency
}

/// Levels of burn-collective's tree of `arity` children per parent over
/// `n` peers (each level groups `arity + 1` peers under one).
fn tree_depth(n: usize, arity: u32) -> u32 {
    let group = arity as usize + 1;
    let (mut left, mut depth) = (n, 0);
    while left > 1 {
        left = left.div_ceil(group);
        depth += 1;
    }
    depth
}

/// Tree reduce of `bytes` over `n` peers to one (burn-collective's
/// `Tree(arity)`): on each of the `ceil(log_{arity+1} n)` levels a parent
/// receives its children's whole tensors one after another:
/// `depth * arity * (latency + bytes / bandwidth)` (on the critical path).
pub fn tree_reduce(bytes: f64, n: usize, arity: u32, link: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    tree_depth(n, arity.max(1)) as f64 * arity.max(1) as f64 * link.transfer(bytes)
}

/// Tree all-reduce: a [`tree_reduce`] then a broadcast down the same tree,
/// `2 * depth * arity * (latency + bytes / bandwidth)`; with arity 1, the
/// textbook binary-tree `2 log2(n) (latency + bytes / bandwidth)`.
///
/// ```
/// use burn_elastic_dp::plan::{Link, tree_all_reduce};
///
/// let link = Link::new(1e9, 1e-5);
/// // 8 peers, binary tree: 3 levels up, 3 down.
/// assert!((tree_all_reduce(1e9, 8, 1, link) - 6.0 * (1.0 + 1e-5)).abs() < 1e-12);
/// ```
pub fn tree_all_reduce(bytes: f64, n: usize, arity: u32, link: Link) -> f64 {
    2.0 * tree_reduce(bytes, n, arity, link)
}

/// Centralized reduce: one peer receives the other `n - 1` tensors one
/// after another.
pub fn centralized_reduce(bytes: f64, n: usize, link: Link) -> f64 {
    n.saturating_sub(1) as f64 * link.transfer(bytes)
}

/// Centralized all-reduce: reduce on one peer, then send the result back to
/// each: `2 (n - 1) (latency + bytes / bandwidth)`.
pub fn centralized_all_reduce(bytes: f64, n: usize, link: Link) -> f64 {
    2.0 * centralized_reduce(bytes, n, link)
}

/// All-reduce of `bytes` over `n` peers joined by `link` with `strategy`.
///
/// ```
/// use burn::collective::AllReduceStrategy;
/// use burn_elastic_dp::plan::{Link, all_reduce_cost, ring_all_reduce};
///
/// let link = Link::new(1e9, 1e-6);
/// assert_eq!(all_reduce_cost(AllReduceStrategy::Ring, 1e6, 8, link), ring_all_reduce(1e6, 8, link));
/// ```
pub fn all_reduce_cost(strategy: AllReduceStrategy, bytes: f64, n: usize, link: Link) -> f64 {
    match strategy {
        AllReduceStrategy::Ring => ring_all_reduce(bytes, n, link),
        AllReduceStrategy::Tree(arity) => tree_all_reduce(bytes, n, arity, link),
        AllReduceStrategy::Centralized => centralized_all_reduce(bytes, n, link),
    }
}

/// Where the peers of one all-reduce sit and which algorithms join them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceGroup {
    /// Peers on each node taking part (the most on any one node).
    pub per_node: usize,
    /// Nodes taking part.
    pub nodes: usize,
    /// Link between devices of one node.
    pub intra: Link,
    /// Link between nodes.
    pub inter: Link,
    /// Algorithm between the peers of one node.
    pub local: AllReduceStrategy,
    /// Algorithm between nodes.
    pub global: AllReduceStrategy,
}

impl ReduceGroup {
    /// Seconds to all-reduce one tensor of `bytes` bytes, as burn-collective
    /// does it: within one node the local strategy; across nodes a local
    /// reduce to one device per node (a ring all-reduce, when the local
    /// strategy is a ring), the global strategy between nodes, and a local
    /// broadcast (none after a local ring).
    ///
    /// ```
    /// use burn::collective::AllReduceStrategy;
    /// use burn_elastic_dp::plan::{Link, ReduceGroup, ring_all_reduce};
    ///
    /// let (intra, inter) = (Link::new(1e10, 1e-6), Link::new(1e9, 1e-5));
    /// let group = ReduceGroup {
    ///     per_node: 4, nodes: 2, intra, inter,
    ///     local: AllReduceStrategy::Ring, global: AllReduceStrategy::Ring,
    /// };
    /// let t = group.cost(1e6);
    /// assert_eq!(t, ring_all_reduce(1e6, 4, intra) + ring_all_reduce(1e6, 2, inter));
    /// ```
    pub fn cost(&self, bytes: f64) -> f64 {
        if self.nodes <= 1 {
            return all_reduce_cost(self.local, bytes, self.per_node, self.intra);
        }
        let (n, link) = (self.per_node, self.intra);
        let (reduce, broadcast) = match self.local {
            AllReduceStrategy::Ring => (ring_all_reduce(bytes, n, link), 0.0),
            AllReduceStrategy::Tree(arity) => {
                let half = tree_reduce(bytes, n, arity, link);
                (half, half)
            }
            AllReduceStrategy::Centralized => {
                let half = centralized_reduce(bytes, n, link);
                (half, half)
            }
        };
        reduce + all_reduce_cost(self.global, bytes, self.nodes, self.inter) + broadcast
    }

    /// Seconds to all-reduce gradient tensors of `tensor_bytes` bytes (in
    /// the replica group's order) as the replica group does in `mode`: one
    /// collective call per tensor, or tensors concatenated into buckets that
    /// close once they hold at least `bucket_bytes` (and at the last tensor).
    ///
    /// ```
    /// use burn::collective::AllReduceStrategy;
    /// use burn_elastic_dp::AllReduce;
    /// use burn_elastic_dp::plan::{Link, ReduceGroup};
    ///
    /// let link = Link::new(1e9, 1e-3);
    /// let group = ReduceGroup {
    ///     per_node: 2, nodes: 1, intra: link, inter: link,
    ///     local: AllReduceStrategy::Ring, global: AllReduceStrategy::Ring,
    /// };
    /// let tensors = [1000, 1000, 1000, 1000];
    /// let per_tensor = group.bucketed_cost(&tensors, AllReduce::PerTensor);
    /// let two_buckets = group.bucketed_cost(&tensors, AllReduce::Bucketed { bucket_bytes: 2000 });
    /// // Same bytes, half the calls: two latencies of each ring step saved.
    /// assert!((per_tensor - two_buckets - 2.0 * 2.0 * 1e-3).abs() < 1e-12);
    /// ```
    pub fn bucketed_cost(&self, tensor_bytes: &[usize], mode: AllReduce) -> f64 {
        buckets(tensor_bytes, mode)
            .into_iter()
            .map(|bytes| self.cost(bytes as f64))
            .sum()
    }
}

/// Bytes of each collective call the replica group makes for gradient
/// tensors of `tensor_bytes` bytes under `mode` (see
/// [`ReduceGroup::bucketed_cost`]).
///
/// ```
/// use burn_elastic_dp::AllReduce;
/// use burn_elastic_dp::plan::buckets;
///
/// assert_eq!(buckets(&[3, 3, 3], AllReduce::PerTensor), vec![3, 3, 3]);
/// assert_eq!(buckets(&[3, 3, 3], AllReduce::Bucketed { bucket_bytes: 5 }), vec![6, 3]);
/// ```
pub fn buckets(tensor_bytes: &[usize], mode: AllReduce) -> Vec<usize> {
    match mode {
        AllReduce::PerTensor => tensor_bytes.to_vec(),
        AllReduce::Bucketed { bucket_bytes } => {
            let mut out = Vec::new();
            let mut pending = 0;
            for (i, &bytes) in tensor_bytes.iter().enumerate() {
                pending += bytes;
                if pending >= bucket_bytes || i + 1 == tensor_bytes.len() {
                    out.push(pending);
                    pending = 0;
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: Link = Link {
        bandwidth: 3.0e9,
        latency: 7.0e-6,
    };

    #[test]
    fn ring_matches_the_textbook_formula() {
        for n in 2..40 {
            for bytes in [1.0, 4096.0, 3.3e8] {
                let nf = n as f64;
                let textbook = 2.0 * (nf - 1.0) / nf * bytes / LINK.bandwidth
                    + 2.0 * (nf - 1.0) * LINK.latency;
                let got = ring_all_reduce(bytes, n, LINK);
                assert!((got - textbook).abs() <= 1e-12 * textbook, "n={n}");
            }
        }
        // The bandwidth term tends to 2 bytes / bandwidth as n grows.
        let big = ring_all_reduce(1e9, 100_000, Link::new(1e9, 0.0));
        assert!(big < 2.0 && big > 1.999);
    }

    #[test]
    fn tree_matches_its_formula() {
        for n in 2..70usize {
            for arity in 1..4u32 {
                let depth = (n as f64).log(arity as f64 + 1.0).ceil();
                // log of an exact power can round up by one ulp: recompute by
                // counting, but check against the float form where it is exact.
                let counted = tree_depth(n, arity) as f64;
                assert!(counted == depth || (depth - counted - 1.0).abs() < 1e-9);
                let expected = 2.0 * counted * arity as f64 * (LINK.latency + 1e6 / LINK.bandwidth);
                let got = tree_all_reduce(1e6, n, arity, LINK);
                assert!((got - expected).abs() < 1e-12, "n={n} arity={arity}");
            }
        }
        // Binary: 2 log2(n) transfers for a power of two.
        let t = tree_all_reduce(1e6, 16, 1, LINK);
        assert!((t - 8.0 * LINK.transfer(1e6)).abs() < 1e-12);
    }

    #[test]
    fn ring_beats_tree_on_large_tensors_and_loses_on_tiny_ones() {
        let n = 16;
        assert!(ring_all_reduce(1e9, n, LINK) < tree_all_reduce(1e9, n, 1, LINK));
        assert!(ring_all_reduce(4.0, n, LINK) > tree_all_reduce(4.0, n, 1, LINK));
    }

    #[test]
    fn bucketing_adds_one_call_latency_per_bucket() {
        let link = Link::new(1e9, 1e-3);
        let group = ReduceGroup {
            per_node: 4,
            nodes: 1,
            intra: link,
            inter: link,
            local: AllReduceStrategy::Ring,
            global: AllReduceStrategy::Ring,
        };
        let tensors = vec![4000; 12];
        let per_call_latency = 2.0 * 3.0 * link.latency;
        let bandwidth_part = 2.0 * 3.0 / 4.0 * 48_000.0 / link.bandwidth;
        for (bucket, calls) in [(4000, 12), (8000, 6), (12_000, 4), (1 << 30, 1)] {
            let got = group.bucketed_cost(
                &tensors,
                AllReduce::Bucketed {
                    bucket_bytes: bucket,
                },
            );
            let expected = bandwidth_part + calls as f64 * per_call_latency;
            assert!((got - expected).abs() < 1e-12, "bucket {bucket}");
        }
        let per_tensor = group.bucketed_cost(&tensors, AllReduce::PerTensor);
        assert!((per_tensor - (bandwidth_part + 12.0 * per_call_latency)).abs() < 1e-12);
    }

    #[test]
    fn crossing_nodes_costs_the_slow_link() {
        let (intra, inter) = (Link::new(1e11, 1e-6), Link::new(1e9, 1e-5));
        let mut group = ReduceGroup {
            per_node: 8,
            nodes: 1,
            intra,
            inter,
            local: AllReduceStrategy::Tree(2),
            global: AllReduceStrategy::Ring,
        };
        let one_node = group.cost(1e8);
        group.nodes = 2;
        let two_nodes = group.cost(1e8);
        assert!(two_nodes > one_node + ring_all_reduce(1e8, 2, inter) * 0.99);
        let expected = 2.0 * tree_reduce(1e8, 8, 2, intra) + ring_all_reduce(1e8, 2, inter);
        assert!((two_nodes - expected).abs() < 1e-12);
    }
}
