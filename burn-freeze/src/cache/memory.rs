//! The in-memory tier: activations kept as device tensors within a byte budget.

use std::collections::HashMap;

use super::key::CacheKey;

/// Entries kept as they are (on their device), up to a budget in bytes.
#[derive(Debug)]
pub(crate) struct MemoryTier<H> {
    entries: HashMap<CacheKey, (H, usize)>,
    used: usize,
    budget: usize,
}

impl<H: Clone> MemoryTier<H> {
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: HashMap::new(),
            used: 0,
            budget,
        }
    }

    /// Stores `value` of `bytes` bytes, or hands it back when the budget is spent.
    pub(crate) fn insert(&mut self, key: CacheKey, value: H, bytes: usize) -> Result<(), H> {
        if self.used + bytes > self.budget {
            return Err(value);
        }
        if let Some((_, old)) = self.entries.insert(key, (value, bytes)) {
            self.used -= old;
        }
        self.used += bytes;
        Ok(())
    }

    pub(crate) fn get(&self, key: &CacheKey) -> Option<H> {
        self.entries.get(key).map(|(value, _)| value.clone())
    }

    pub(crate) fn remove(&mut self, key: &CacheKey) -> bool {
        match self.entries.remove(key) {
            Some((_, bytes)) => {
                self.used -= bytes;
                true
            }
            None => false,
        }
    }

    pub(crate) fn used(&self) -> usize {
        self.used
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
