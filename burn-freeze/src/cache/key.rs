//! What a cached activation is filed under.

use serde::{Deserialize, Serialize};

/// A cached frozen-prefix output: sample `sample` after the first `front` units.
///
/// ```
/// use burn_freeze::CacheKey;
///
/// let key = CacheKey::new(42, 5);
/// assert_eq!(key.file_name(), "s42-f5.bfc");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CacheKey {
    /// The sample's id, stable across epochs (e.g. its index in the dataset).
    pub sample: u64,
    /// How many units the cached output has passed through.
    pub front: usize,
}

impl CacheKey {
    /// The key of `sample` after `front` units.
    pub fn new(sample: u64, front: usize) -> Self {
        Self { sample, front }
    }

    /// The name of the file holding this entry in the spill directory.
    pub fn file_name(&self) -> String {
        format!("s{}-f{}.bfc", self.sample, self.front)
    }
}
