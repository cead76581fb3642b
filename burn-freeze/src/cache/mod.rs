//! AutoCache: frozen-prefix outputs kept per sample, so a frozen unit runs
//! once per sample instead of once per epoch.

mod cacheable;
mod disk;
mod holder;
mod key;
mod memory;
mod serve;

use std::collections::{BTreeSet, HashMap};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn::prelude::Backend;

pub use cacheable::Cacheable;
use disk::DiskTier;
pub use holder::CacheHolder;
use key::CacheKey;
use memory::MemoryTier;
pub use serve::{BatchStart, CachedStart, StackCache, cached_prefix, serve_cached};

use crate::error::CacheError;

/// Sizes and place of an [`ActivationCache`].
///
/// ```
/// use burn_freeze::CacheConfig;
///
/// let config = CacheConfig::new(64 << 20).with_spill_dir(Some(std::env::temp_dir()));
/// assert_eq!(config.memory_budget_bytes, 64 << 20);
/// assert!(config.disk_budget_bytes.is_none());
/// ```
#[derive(Config, Debug)]
pub struct CacheConfig {
    /// Bytes of activations the in-memory tier may hold (on the activations' device).
    pub memory_budget_bytes: usize,
    /// Directory for the spill tier; `None` keeps the cache in memory only. A
    /// fresh sub-directory is made inside it and removed when the cache is dropped.
    pub spill_dir: Option<PathBuf>,
    /// Bytes the spill tier may write; `None` for no limit but the disk's.
    pub disk_budget_bytes: Option<u64>,
}

/// Counters of an [`ActivationCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Samples served from an entry at the current front.
    pub hits: u64,
    /// Samples served from an entry at a lower front (only the newly frozen units ran).
    pub partial_hits: u64,
    /// Samples whose frozen prefix ran from the input.
    pub misses: u64,
    /// Entries written to the spill tier.
    pub spilled: u64,
    /// Samples not cached because both tiers were full or a write failed.
    pub not_cached: u64,
    /// Failed writes or reads of spill files.
    pub disk_errors: u64,
    /// Bytes held in memory now.
    pub memory_bytes: usize,
    /// Entries held in memory now.
    pub memory_entries: usize,
    /// Bytes held on disk now.
    pub disk_bytes: u64,
    /// Entries held on disk now.
    pub disk_entries: usize,
}

#[derive(Debug, Clone)]
struct SampleShapes {
    input: Vec<Vec<usize>>,
    output: Vec<Vec<usize>>,
}

/// Per-sample frozen-prefix outputs of type `H` (an activation on backend `B`),
/// in memory and on disk.
///
/// An entry is the output of the first `front` units for one sample, filed
/// under `(sample, front)`. When the freeze front grows from
/// `F_prev` to `F_new`, a sample's `F_prev` entry is the starting point: only
/// units `F_prev..F_new` run, and the new entry replaces the old one. Entries
/// live in memory up to [`CacheConfig::memory_budget_bytes`], then spill to
/// files in a directory the user picks ([`CacheConfig::spill_dir`]), removed
/// when the cache is dropped. When both tiers are full, or a write fails
/// (a full disk), the sample is simply not cached and its prefix is recomputed
/// next time: a warning, never an error, and never a wrong result.
///
/// The cache trusts that a sample id names the same input every time (no
/// random augmentation of the frozen prefix's input); it checks that the
/// shapes agree and refuses an id that comes back with another shape.
///
/// Attach one to a [`FreezableStack`](crate::FreezableStack) with
/// [`attach_cache`](crate::CacheHolder::attach_cache) and train with
/// [`forward_cached`](crate::FreezableStack::forward_cached).
///
/// ```
/// use burn::backend::Flex;
/// use burn::prelude::*;
/// use burn_freeze::{ActivationCache, CacheConfig};
///
/// let device = Default::default();
/// let dir = std::env::temp_dir();
/// let mut cache = ActivationCache::<Flex, Tensor<Flex, 2>>::new(
///     CacheConfig::new(0).with_spill_dir(Some(dir)), // no memory: everything spills
/// ).unwrap();
/// let x = Tensor::<Flex, 2>::from_floats([[1.0, 2.0]], &device);
/// cache.insert(7, 3, x.clone(), &[vec![1, 2]]).unwrap();
/// let (front, back) = cache.lookup(7, 5, &device).unwrap();
/// assert_eq!(front, 3);
/// back.into_data().assert_eq(&x.into_data(), true);
/// assert_eq!(cache.stats().disk_entries, 1);
/// let spill = cache.spill_dir().unwrap().to_path_buf();
/// drop(cache);
/// assert!(!spill.exists()); // files removed when done
/// ```
#[derive(Debug)]
pub struct ActivationCache<B: Backend, H> {
    memory: MemoryTier<H>,
    disk: Option<DiskTier>,
    fronts: HashMap<u64, BTreeSet<usize>>,
    shapes: HashMap<u64, SampleShapes>,
    stats: CacheStats,
    warned_full: bool,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend, H: Clone> ActivationCache<B, H> {
    /// An empty cache. Fails when the spill directory cannot be created or written.
    pub fn new(config: CacheConfig) -> Result<Self, CacheError> {
        let disk = match &config.spill_dir {
            Some(dir) => Some(DiskTier::create(dir, config.disk_budget_bytes)?),
            None => None,
        };
        Ok(Self {
            memory: MemoryTier::new(config.memory_budget_bytes),
            disk,
            fronts: HashMap::new(),
            shapes: HashMap::new(),
            stats: CacheStats::default(),
            warned_full: false,
            _backend: PhantomData,
        })
    }

    /// The directory the spill tier writes to (a fresh one inside the chosen
    /// directory), if there is a spill tier.
    pub fn spill_dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(DiskTier::dir)
    }

    /// Counters and sizes.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            memory_bytes: self.memory.used(),
            memory_entries: self.memory.len(),
            disk_bytes: self.disk.as_ref().map_or(0, DiskTier::used),
            disk_entries: self.disk.as_ref().map_or(0, DiskTier::len),
            ..self.stats
        }
    }

    /// Number of entries, both tiers.
    pub fn len(&self) -> usize {
        self.fronts.values().map(BTreeSet::len).sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fails when `sample` was seen before with inputs of other shapes
    /// (`input_shapes` are one sample's, batch dimension 1). Changes nothing.
    pub fn check_input(&self, sample: u64, input_shapes: &[Vec<usize>]) -> Result<(), CacheError> {
        match self.shapes.get(&sample) {
            Some(known) if known.input != input_shapes => Err(CacheError::ShapeMismatch {
                sample,
                cached: known.input.clone(),
                found: input_shapes.to_vec(),
            }),
            _ => Ok(()),
        }
    }

    fn warn_full(&mut self, why: &str) {
        if !self.warned_full {
            tracing::warn!(
                "activation cache full ({why}); further samples are recomputed, not cached"
            );
            self.warned_full = true;
        }
    }

    fn remove(&mut self, key: CacheKey) {
        self.memory.remove(&key);
        if let Some(disk) = self.disk.as_mut() {
            disk.remove(&key);
        }
        if let Some(fronts) = self.fronts.get_mut(&key.sample) {
            fronts.remove(&key.front);
            if fronts.is_empty() {
                self.fronts.remove(&key.sample);
            }
        }
    }

    /// Drops every entry that has passed through more than `front` units:
    /// what an unfreeze to `front` makes stale. Entries at or below it stay valid.
    pub fn invalidate_above(&mut self, front: usize) {
        let stale: Vec<CacheKey> = self
            .fronts
            .iter()
            .flat_map(|(&sample, fronts)| {
                fronts
                    .range(front + 1..)
                    .map(move |&f| CacheKey::new(sample, f))
            })
            .collect();
        if !stale.is_empty() {
            tracing::debug!(
                entries = stale.len(),
                front,
                "activation cache: dropping stale entries"
            );
        }
        for key in stale {
            self.remove(key);
        }
    }

    /// Drops every entry (the shapes seen per sample are kept).
    pub fn clear(&mut self) {
        self.invalidate_above(0);
        let keys: Vec<CacheKey> = self
            .fronts
            .iter()
            .flat_map(|(&s, fronts)| fronts.iter().map(move |&f| CacheKey::new(s, f)))
            .collect();
        for key in keys {
            self.remove(key);
        }
    }

    pub(crate) fn count_hit(&mut self, full: bool) {
        if full {
            self.stats.hits += 1;
        } else {
            self.stats.partial_hits += 1;
        }
    }

    pub(crate) fn count_miss(&mut self) {
        self.stats.misses += 1;
    }
}

impl<B: Backend, H: Cacheable<B>> ActivationCache<B, H> {
    /// Fails when `sample` was cached before with an output of other shapes
    /// than `value`'s. Changes nothing.
    pub fn check_output(&self, sample: u64, value: &H) -> Result<(), CacheError> {
        match self.shapes.get(&sample) {
            Some(known) if known.output != value.shapes() => Err(CacheError::ShapeMismatch {
                sample,
                cached: known.output.clone(),
                found: value.shapes(),
            }),
            _ => Ok(()),
        }
    }

    /// The entry of `sample` with the highest front at most `max_front`, as
    /// `(front, value)` on `device`. A spill file that cannot be read is
    /// dropped with a warning and the next lower entry is tried.
    pub fn lookup(
        &mut self,
        sample: u64,
        max_front: usize,
        device: &B::Device,
    ) -> Option<(usize, H)> {
        loop {
            let front = *self.fronts.get(&sample)?.range(..=max_front).next_back()?;
            let key = CacheKey::new(sample, front);
            if let Some(value) = self.memory.get(&key) {
                return Some((front, value));
            }
            let read = self.disk.as_ref().and_then(|disk| disk.get(&key));
            // A spill file that decodes into other parts than the sample's
            // output (rewritten in place) is refused, not rebuilt.
            let expected = self.shapes.get(&sample).map(|s| s.output.clone());
            let read = read.map(|read| {
                read.and_then(|parts| {
                    let found: Vec<Vec<usize>> = parts.iter().map(|p| p.shape.to_vec()).collect();
                    match expected.as_ref().is_none_or(|e| *e == found) {
                        true => Ok(parts),
                        false => Err(std::io::Error::other(format!(
                            "it holds parts of shapes {found:?}, the sample's output has {:?}",
                            expected.as_deref().unwrap_or_default()
                        ))),
                    }
                })
            });
            match read {
                Some(Ok(parts)) => return Some((front, H::from_data(parts, device))),
                Some(Err(error)) => {
                    tracing::warn!(sample, front, %error, "cannot read a spilled activation; recomputing it");
                    self.stats.disk_errors += 1;
                }
                None => {}
            }
            self.remove(key);
        }
    }

    /// Caches `value`, the output of the first `front` units for `sample`,
    /// whose input had `input_shapes` (batch dimension 1). Entries of the
    /// sample at lower fronts are superseded and dropped.
    ///
    /// Fails only on a shape mismatch, changing nothing. When both tiers are
    /// full or the write fails, the value is not cached and a warning is logged.
    pub fn insert(
        &mut self,
        sample: u64,
        front: usize,
        value: H,
        input_shapes: &[Vec<usize>],
    ) -> Result<(), CacheError> {
        self.check_input(sample, input_shapes)?;
        self.check_output(sample, &value)?;
        self.shapes.entry(sample).or_insert_with(|| SampleShapes {
            input: input_shapes.to_vec(),
            output: value.shapes(),
        });
        let key = CacheKey::new(sample, front);
        // The new entry supersedes the sample's entries at lower fronts (and an
        // older copy of itself): free their room first.
        let superseded: Vec<usize> = self
            .fronts
            .get(&sample)
            .map(|fronts| fronts.range(..=front).copied().collect())
            .unwrap_or_default();
        for old in superseded {
            self.remove(CacheKey::new(sample, old));
        }
        let bytes = value.num_bytes();
        let stored = match self.memory.insert(key, value, bytes) {
            Ok(()) => true,
            Err(value) => self.spill(key, &value),
        };
        if stored {
            self.warned_full = false;
            self.fronts.entry(sample).or_default().insert(front);
        } else {
            self.stats.not_cached += 1;
        }
        Ok(())
    }

    fn spill(&mut self, key: CacheKey, value: &H) -> bool {
        let Some(disk) = self.disk.as_mut() else {
            self.warn_full("the memory budget is spent and there is no spill directory");
            return false;
        };
        if !disk.has_room(value.num_bytes() as u64) {
            self.warn_full("the memory and disk budgets are spent");
            return false;
        }
        match disk.insert(key, &value.to_data_parts()) {
            Ok(()) => {
                self.stats.spilled += 1;
                true
            }
            Err(error) => {
                self.stats.disk_errors += 1;
                tracing::warn!(sample = key.sample, front = key.front, %error,
                    "cannot spill an activation to disk; it will be recomputed");
                false
            }
        }
    }
}
