//! AutoPipe's partition of unit costs into contiguous stages: the exact
//! partitioner, the paper's greedy rule (for comparison), and compression.

/// The largest stage cost of a balance.
pub fn largest_stage(costs: &[f64], balance: &[usize]) -> f64 {
    let mut start = 0;
    balance
        .iter()
        .map(|&n| {
            let sum: f64 = costs[start..start + n].iter().sum();
            start += n;
            sum
        })
        .fold(0.0, f64::max)
}

/// The contiguous partition of `costs` into `stages` non-empty stages that
/// minimises the largest stage cost, found exactly by dynamic programming
/// (`O(stages * n^2)`); among the partitions with that largest stage, the
/// one that balances the rest best (the least sum of squared stage costs),
/// since the other stages' costs decide what each of their devices holds.
/// Returns units per stage.
///
/// # Panics
/// When `stages` is 0 or larger than `costs.len()`.
///
/// ```
/// use burn_pipe::balance_exact;
/// use burn_pipe::balance::largest_stage;
///
/// let costs = [2.0, 2.0, 3.0];
/// let balance = balance_exact(&costs, 2);
/// assert_eq!(balance, vec![2, 1]);
/// assert_eq!(largest_stage(&costs, &balance), 4.0);
/// // The first unit decides the largest stage; the others are spread.
/// let skewed = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
/// assert_eq!(balance_exact(&skewed, 4), vec![1, 2, 2, 3]);
/// ```
pub fn balance_exact(costs: &[f64], stages: usize) -> Vec<usize> {
    let n = costs.len();
    assert!(
        stages >= 1 && stages <= n,
        "cannot split {n} units into {stages} non-empty stages"
    );
    let mut prefix = vec![0.0; n + 1];
    for (i, c) in costs.iter().enumerate() {
        prefix[i + 1] = prefix[i] + c;
    }
    let sum = |a: usize, b: usize| prefix[b] - prefix[a];
    // The least largest stage: best[j][i] is that of the first i units in j
    // stages.
    let mut best = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    best[0][0] = 0.0;
    for j in 1..=stages {
        for i in j..=n - (stages - j) {
            for p in (j - 1)..i {
                best[j][i] = best[j][i].min(best[j - 1][p].max(sum(p, i)));
            }
        }
    }
    // Within that bound (up to rounding of the prefix sums), the least sum
    // of squared stage costs; cut[j][i] is where the last of the j stages
    // starts.
    let bound = best[stages][n];
    let bound = bound + bound.abs() * 1e-9 + f64::MIN_POSITIVE;
    let mut squares = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    let mut cut = vec![vec![0usize; n + 1]; stages + 1];
    squares[0][0] = 0.0;
    for j in 1..=stages {
        for i in j..=n - (stages - j) {
            for p in (j - 1)..i {
                let stage = sum(p, i);
                if stage > bound {
                    continue;
                }
                let candidate = squares[j - 1][p] + stage * stage;
                if candidate < squares[j][i] {
                    squares[j][i] = candidate;
                    cut[j][i] = p;
                }
            }
        }
    }
    let mut balance = vec![0; stages];
    let mut end = n;
    for j in (1..=stages).rev() {
        let start = cut[j][end];
        balance[j - 1] = end - start;
        end = start;
    }
    balance
}

/// The greedy balancer of the paper's released prototype, for comparison.
///
/// Stage by stage, it aims at the mean cost of what is left per remaining
/// stage, plus a slack of the variance of the remaining unit costs divided
/// by the remaining stages, and takes units while the stage stays below that
/// aim. Here every stage takes at least one unit and leaves one for each
/// later stage (the prototype can leave a stage empty); the prototype also
/// puts every frozen unit on the first stage, which callers express through
/// [`UnitCosts::at`](crate::UnitCosts::at). Never better than [`balance_exact`].
///
/// # Panics
/// When `stages` is 0 or larger than `costs.len()`.
pub fn balance_greedy(costs: &[f64], stages: usize) -> Vec<usize> {
    let n = costs.len();
    assert!(
        stages >= 1 && stages <= n,
        "cannot split {n} units into {stages} non-empty stages"
    );
    let mut balance = Vec::with_capacity(stages);
    let mut next = 0;
    for s in 0..stages - 1 {
        let left = stages - s;
        let rest = &costs[next..];
        let mean = rest.iter().sum::<f64>() / rest.len() as f64;
        let variance = rest.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / rest.len() as f64;
        let aim = rest.iter().sum::<f64>() / left as f64 + variance / left as f64;
        let later_stages = left - 1;
        let mut sum = costs[next];
        let mut units = 1;
        while next + units < n - later_stages && sum + costs[next + units] < aim {
            sum += costs[next + units];
            units += 1;
        }
        balance.push(units);
        next += units;
    }
    balance.push(n - next);
    balance
}

/// AutoPipe's compression: starting from `stages`, halve the pipeline while
/// the exact partition of `costs` into half as many stages keeps its largest
/// stage within `initial_largest` (the largest stage before any freezing).
///
/// ```
/// // Half the units frozen and cached: two stages do what four did.
/// let before = [1.0; 8];
/// let initial = burn_pipe::balance::largest_stage(&before, &burn_pipe::balance_exact(&before, 4));
/// let now = burn_pipe::UnitCosts::scaled(&before, 1.0 / 3.0).at(4, true);
/// assert_eq!(burn_pipe::balance::compress(&now, 4, initial), 2);
/// ```
pub fn compress(costs: &[f64], stages: usize, initial_largest: f64) -> usize {
    let mut stages = stages;
    while stages >= 2 {
        let half = stages / 2;
        if largest_stage(costs, &balance_exact(costs, half)) <= initial_largest {
            stages = half;
        } else {
            break;
        }
    }
    stages
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::costs::UnitCosts;

    /// Every contiguous partition of `n` units into `stages` stages.
    fn all_balances(n: usize, stages: usize) -> Vec<Vec<usize>> {
        if stages == 1 {
            return vec![vec![n]];
        }
        (1..=n - (stages - 1))
            .flat_map(|first| {
                all_balances(n - first, stages - 1)
                    .into_iter()
                    .map(move |mut rest| {
                        rest.insert(0, first);
                        rest
                    })
            })
            .collect()
    }

    /// A small deterministic generator of cost vectors.
    fn costs(seed: u64, n: usize) -> Vec<f64> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                1.0 + ((state >> 33) % 100) as f64
            })
            .collect()
    }

    #[test]
    fn exact_matches_brute_force_and_never_loses_to_greedy() {
        let mut strictly_better = 0;
        for seed in 0..60 {
            for n in 1..10 {
                let costs = costs(seed, n);
                for stages in 1..=n {
                    let exact = largest_stage(&costs, &balance_exact(&costs, stages));
                    let optimum = all_balances(n, stages)
                        .iter()
                        .map(|b| largest_stage(&costs, b))
                        .fold(f64::INFINITY, f64::min);
                    assert_eq!(exact, optimum, "costs {costs:?}, {stages} stages");
                    let greedy = balance_greedy(&costs, stages);
                    assert_eq!(greedy.iter().sum::<usize>(), n);
                    assert!(greedy.iter().all(|&u| u > 0));
                    let greedy = largest_stage(&costs, &greedy);
                    assert!(exact <= greedy);
                    strictly_better += usize::from(exact < greedy);
                }
            }
        }
        assert!(strictly_better > 0);
    }

    /// Stage costs of `balance`.
    fn stage_costs(costs: &[f64], balance: &[usize]) -> Vec<f64> {
        let mut start = 0;
        balance
            .iter()
            .map(|&n| {
                start += n;
                costs[start - n..start].iter().sum()
            })
            .collect()
    }

    #[test]
    fn among_equal_largest_stages_the_rest_is_balanced() {
        // Today's [1, 1, 1, 5] had the same largest stage as [1, 2, 2, 3].
        let skewed = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let balance = balance_exact(&skewed, 4);
        assert_eq!(stage_costs(&skewed, &balance), vec![100.0, 2.0, 2.0, 3.0]);
        // Against brute force: the least largest stage, then the least sum
        // of squares among the partitions that reach it.
        let squares = |c: &[f64], b: &[usize]| stage_costs(c, b).iter().map(|s| s * s).sum::<f64>();
        for seed in 0..40 {
            for n in 2..9 {
                let mut costs = costs(seed, n);
                // Skew some instances so that ties in the largest stage are common.
                if seed % 2 == 0 {
                    costs[seed as usize % n] *= 50.0;
                }
                for stages in 1..=n {
                    let ours = balance_exact(&costs, stages);
                    let largest = largest_stage(&costs, &ours);
                    let best = all_balances(n, stages)
                        .into_iter()
                        .filter(|b| largest_stage(&costs, b) <= largest)
                        .map(|b| squares(&costs, &b))
                        .fold(f64::INFINITY, f64::min);
                    assert!(
                        squares(&costs, &ours) <= best * (1.0 + 1e-12),
                        "costs {costs:?}, {stages} stages: {ours:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn exact_beats_greedy_on_a_small_case() {
        let costs = [2.0, 2.0, 3.0];
        assert_eq!(balance_greedy(&costs, 2), vec![1, 2]);
        assert_eq!(largest_stage(&costs, &balance_greedy(&costs, 2)), 5.0);
        assert_eq!(largest_stage(&costs, &balance_exact(&costs, 2)), 4.0);
    }

    #[test]
    fn compression_stops_when_the_largest_stage_would_grow() {
        let costs = [1.0; 8];
        let initial = largest_stage(&costs, &balance_exact(&costs, 8));
        assert_eq!(compress(&costs, 8, initial), 8);
        // Three quarters frozen and cached: 2 active units fit one stage of 1? No: 2 > 1.
        let frozen = UnitCosts::scaled(&costs, 1.0 / 3.0).at(6, true);
        assert_eq!(compress(&frozen, 8, initial), 2);
        // Everything frozen and cached: one stage.
        let all = UnitCosts::scaled(&costs, 1.0 / 3.0).at(8, true);
        assert_eq!(compress(&all, 8, initial), 1);
    }
}
