//! What a cached activation is filed under.

use serde::{Deserialize, Serialize};

/// A cached frozen-prefix output: sample `sample` after the first `front` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct CacheKey {
    /// The sample's id, stable across epochs (e.g. its index in the dataset).
    pub(crate) sample: u64,
    /// How many units the cached output has passed through.
    pub(crate) front: usize,
}

impl CacheKey {
    /// The key of `sample` after `front` units.
    pub(crate) fn new(sample: u64, front: usize) -> Self {
        Self { sample, front }
    }

    /// The name of the file holding this entry in the spill directory.
    pub(crate) fn file_name(&self) -> String {
        format!("s{}-f{}.bfc", self.sample, self.front)
    }
}

#[cfg(test)]
mod tests {
    use super::CacheKey;

    #[test]
    fn a_key_names_its_spill_file() {
        assert_eq!(CacheKey::new(42, 5).file_name(), "s42-f5.bfc");
    }
}
