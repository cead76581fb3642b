//! A timing table for the micro-batch search: each unit's forward and
//! backward time at several micro-batch sizes, read at any size.

use burn::serde::{Deserialize, Serialize};

use crate::balance::costs::{UnitProfile, UnitState};
use crate::balance::micro_count::error::MicroSearchError;

/// Each unit's forward and backward time at several micro-batch sizes: a
/// profile per size ([`profile_micro_batches`](crate::profile_micro_batches)
/// measures one), read at any size by linear interpolation between the
/// measured sizes. Below the smallest size a micro-batch costs what the
/// smallest did; above the largest, the largest's time per sample.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::UnitProfile;
/// use burn_pipe::micro::MicroBatchTimes;
///
/// // Two units; a micro-batch of n samples costs n ms forward, 2n ms backward.
/// let times = MicroBatchTimes::from_fn(&[1, 4], 2, |_unit, n| UnitProfile {
///     forward: Duration::from_millis(n as u64),
///     backward: Duration::from_millis(2 * n as u64),
/// })?;
/// assert_eq!(times.units(), 2);
/// let (forward, backward) = times.unit_seconds(0, 2);
/// assert!((forward - 0.002).abs() < 1e-12 && (backward - 0.004).abs() < 1e-12);
/// assert!((times.unit_seconds(1, 8).0 - 0.008).abs() < 1e-12);
/// # Ok::<(), burn_pipe::micro::MicroSearchError>(())
/// ```
///
/// A table is serde (a checkpoint keeps the one a run chose its micro-batch
/// counts from); reading one checks it as [`new`](Self::new) does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "burn::serde", try_from = "RawTimes")]
pub struct MicroBatchTimes {
    sizes: Vec<usize>,
    /// `profiles[i][u]`: unit `u` at `sizes[i]` samples.
    profiles: Vec<Vec<UnitProfile>>,
}

/// A table as read, before [`MicroBatchTimes::new`] checks it.
#[derive(Deserialize)]
#[serde(crate = "burn::serde")]
struct RawTimes {
    sizes: Vec<usize>,
    profiles: Vec<Vec<UnitProfile>>,
}

impl TryFrom<RawTimes> for MicroBatchTimes {
    type Error = MicroSearchError;

    fn try_from(raw: RawTimes) -> Result<Self, Self::Error> {
        Self::new(raw.sizes, raw.profiles)
    }
}

impl MicroBatchTimes {
    /// From one profile per size (`profiles[i]`, every unit at `sizes[i]`
    /// samples). Fails when there is no size, the sizes are not strictly
    /// increasing from 1 up, or the profiles differ in their (non-zero)
    /// number of units.
    pub fn new(
        sizes: Vec<usize>,
        profiles: Vec<Vec<UnitProfile>>,
    ) -> Result<Self, MicroSearchError> {
        check_sizes(&sizes)?;
        if profiles.len() != sizes.len() {
            return Err(MicroSearchError::ProfileCount {
                profiles: profiles.len(),
                sizes: sizes.len(),
            });
        }
        let expected = profiles[0].len();
        for (profile, &size) in profiles.iter().zip(&sizes) {
            if profile.len() != expected || expected == 0 {
                return Err(MicroSearchError::UnitCount {
                    size,
                    units: profile.len(),
                    expected,
                });
            }
        }
        Ok(Self { sizes, profiles })
    }

    /// A table of `units` units at `sizes`, unit `u` at `n` samples timed
    /// `time(u, n)`: synthetic tables, for tests and what-if studies.
    pub fn from_fn(
        sizes: &[usize],
        units: usize,
        time: impl Fn(usize, usize) -> UnitProfile,
    ) -> Result<Self, MicroSearchError> {
        let profiles = sizes
            .iter()
            .map(|&n| (0..units).map(|u| time(u, n)).collect())
            .collect();
        Self::new(sizes.to_vec(), profiles)
    }

    /// Units timed.
    pub fn units(&self) -> usize {
        self.profiles[0].len()
    }

    /// The measured sizes, increasing.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The measured times: `profiles()[i][u]` is unit `u` at `sizes()[i]`
    /// samples (as given to [`new`](Self::new)).
    pub fn profiles(&self) -> &[Vec<UnitProfile>] {
        &self.profiles
    }

    /// Unit `unit`'s forward and backward seconds on a micro-batch of `size`
    /// samples.
    ///
    /// # Panics
    /// When `unit >= units()`.
    pub fn unit_seconds(&self, unit: usize, size: usize) -> (f64, f64) {
        let point = |i: usize| {
            let p = &self.profiles[i][unit];
            (p.forward.as_secs_f64(), p.backward.as_secs_f64())
        };
        let last = self.sizes.len() - 1;
        match self.sizes.binary_search(&size) {
            Ok(i) => point(i),
            Err(0) => point(0),
            Err(i) if i > last => {
                let (f, b) = point(last);
                let scale = size as f64 / self.sizes[last] as f64;
                (f * scale, b * scale)
            }
            Err(i) => {
                let (lo, hi) = (self.sizes[i - 1] as f64, self.sizes[i] as f64);
                let w = (size as f64 - lo) / (hi - lo);
                let ((f0, b0), (f1, b1)) = (point(i - 1), point(i));
                (f0 + w * (f1 - f0), b0 + w * (b1 - b0))
            }
        }
    }

    /// A stage's forward and backward seconds on `size` samples: the sum
    /// over `units` of each unit's, under the one cost rule (a frozen unit
    /// runs forward only, a cached one not at all).
    pub(crate) fn stage_seconds(
        &self,
        units: std::ops::Range<usize>,
        states: &[UnitState],
        size: usize,
    ) -> (f64, f64) {
        units.fold((0.0, 0.0), |(f, b), u| {
            let (uf, ub) = self.unit_seconds(u, size);
            match states[u] {
                UnitState::Training => (f + uf, b + ub),
                UnitState::Frozen => (f + uf, b),
                UnitState::Cached => (f, b),
            }
        })
    }
}

/// At least one size, strictly increasing from 1 up.
pub(crate) fn check_sizes(sizes: &[usize]) -> Result<(), MicroSearchError> {
    if sizes.is_empty() {
        return Err(MicroSearchError::NoSizes);
    }
    if sizes[0] == 0 || sizes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(MicroSearchError::BadSizes {
            sizes: sizes.to_vec(),
        });
    }
    Ok(())
}

/// The sizes at which to profile for batches of up to `batch` samples per
/// replica: the powers of two below `batch`, and `batch` itself.
///
/// ```
/// assert_eq!(burn_pipe::micro::micro_batch_profile_sizes(12), vec![1, 2, 4, 8, 12]);
/// assert_eq!(burn_pipe::micro::micro_batch_profile_sizes(1), vec![1]);
/// assert!(burn_pipe::micro::micro_batch_profile_sizes(0).is_empty());
/// ```
pub fn micro_batch_profile_sizes(batch: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = (0..usize::BITS)
        .map(|p| 1usize << p)
        .take_while(|&n| n < batch)
        .collect();
    if batch > 0 {
        sizes.push(batch);
    }
    sizes
}
