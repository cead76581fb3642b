//! The spill tier: one file per entry in a directory of the user's choosing.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::TensorData;

use super::key::CacheKey;
use crate::error::CacheError;

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// Entries written as MessagePack files of their tensors' data.
///
/// The tier makes its own fresh sub-directory inside the chosen one and
/// removes it, with everything in it, when dropped; the chosen directory itself
/// is never deleted.
#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: PathBuf,
    entries: HashMap<CacheKey, usize>,
    used: u64,
    budget: Option<u64>,
}

impl DiskTier {
    /// Creates a fresh sub-directory of `parent` and checks that it can be written.
    pub(crate) fn create(parent: &Path, budget: Option<u64>) -> Result<Self, CacheError> {
        let unwritable = |source| CacheError::UnwritableDirectory {
            path: parent.to_path_buf(),
            source,
        };
        fs::create_dir_all(parent).map_err(unwritable)?;
        let dir = parent.join(format!(
            "burn-freeze-cache-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir).map_err(unwritable)?;
        let probe = dir.join("probe");
        if let Err(source) = fs::write(&probe, b"probe").and_then(|()| fs::remove_file(&probe)) {
            let _ = fs::remove_dir_all(&dir);
            return Err(unwritable(source));
        }
        Ok(Self {
            dir,
            entries: HashMap::new(),
            used: 0,
            budget,
        })
    }

    /// The directory this tier writes to (inside the one the user chose).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `bytes` more would still fit the disk budget.
    pub(crate) fn has_room(&self, bytes: u64) -> bool {
        self.budget.is_none_or(|budget| self.used + bytes <= budget)
    }

    /// Writes an entry. On failure nothing is kept and the error is returned.
    pub(crate) fn insert(&mut self, key: CacheKey, parts: &[TensorData]) -> io::Result<()> {
        let encoded = rmp_serde::to_vec(parts).map_err(io::Error::other)?;
        let bytes = encoded.len();
        if !self.has_room(bytes as u64) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "the disk budget of the activation cache is spent",
            ));
        }
        let path = self.dir.join(key.file_name());
        if let Err(error) = fs::write(&path, &encoded) {
            let _ = fs::remove_file(&path);
            return Err(error);
        }
        self.remove(&key);
        self.entries.insert(key, bytes);
        self.used += bytes as u64;
        Ok(())
    }

    /// Reads an entry back.
    pub(crate) fn get(&self, key: &CacheKey) -> Option<io::Result<Vec<TensorData>>> {
        self.entries.get(key)?;
        let read = || -> io::Result<Vec<TensorData>> {
            let bytes = fs::read(self.dir.join(key.file_name()))?;
            rmp_serde::from_slice(&bytes).map_err(io::Error::other)
        };
        Some(read())
    }

    pub(crate) fn remove(&mut self, key: &CacheKey) -> bool {
        match self.entries.remove(key) {
            Some(bytes) => {
                self.used -= bytes as u64;
                let _ = fs::remove_file(self.dir.join(key.file_name()));
                true
            }
            None => false,
        }
    }

    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        if let Err(error) = fs::remove_dir_all(&self.dir)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), %error, "could not remove the activation cache's spill directory");
        }
    }
}
