//! Serving a frozen prefix from an [`ActivationCache`], as a stack's cached
//! forward and a pipeline's first stage both do.

use std::collections::{BTreeMap, HashSet};

use super::{ActivationCache, Cacheable};
use crate::activation::{Activation, AutodiffActivation};
use crate::error::CacheError;
use crate::flow::Flow;
use crate::frozen::FrozenUnits;
use crate::types::{InnerBackendOf, InnerHidden, InnerInput, StackTypes};

/// The cache a stack of types `S` uses: per-sample hidden activations on the
/// inner backend.
pub type StackCache<S> = ActivationCache<InnerBackendOf<S>, InnerHidden<S>>;

/// Where a sample's frozen prefix starts: its position in the batch and the
/// cached value it starts from (`None`: from the input).
type Start<S> = (usize, Option<InnerHidden<S>>);

/// The units a cache serves ahead of a stack split into stages of
/// `balance` units (one stage: the whole stack) at freeze front `front`:
/// the first stage's frozen units, never the stack's last unit (a pass runs
/// at least one); 0 when there is nothing to serve. Every caller that
/// serves or plans a cached prefix asks this.
///
/// ```
/// use burn_freeze::plumbing::cached_prefix;
///
/// assert_eq!(cached_prefix(2, &[3, 3]), 2); // 2 frozen units on stage 0
/// assert_eq!(cached_prefix(5, &[3, 3]), 3); // stage 0 holds 3
/// assert_eq!(cached_prefix(6, &[6]), 5); // never the last unit
/// assert_eq!(cached_prefix(0, &[3, 3]), 0);
/// ```
pub fn cached_prefix(front: usize, balance: &[usize]) -> usize {
    let units: usize = balance.iter().sum();
    let first = balance.first().copied().unwrap_or(0);
    front.min(first).min(units.saturating_sub(1))
}

/// Where a pass over a batch starts: at unit 0 with the model's input
/// (`I`), or at unit `entry` with the output (`H`) of units `0..entry`,
/// served from a cache or computed elsewhere. A model input converts into
/// it (`From`), so a pass that takes `impl Into<BatchStart<I, H>>` (a
/// pipeline's `forward_backward`, say) takes a plain input as it is.
///
/// ```
/// use burn_freeze::plumbing::BatchStart;
///
/// let start: BatchStart<&str, u8> = "input".into();
/// assert!(matches!(start, BatchStart::Input("input")));
/// ```
#[derive(Debug, Clone)]
pub enum BatchStart<I, H> {
    /// The pass runs from the model's input (no cache, or no frozen unit
    /// to serve).
    Input(I),
    /// Units `0..entry` already ran (served from the cache, or computed and
    /// cached).
    Hidden {
        /// The first unit the pass runs.
        entry: usize,
        /// The output of units `0..entry`.
        hidden: H,
    },
}

impl<I, H> From<I> for BatchStart<I, H> {
    fn from(input: I) -> Self {
        BatchStart::Input(input)
    }
}

/// Where a pass of a stack of types `S` starts: its input, or the hidden
/// activation a cache served ([`serve_cached`]).
pub type CachedStart<S> = BatchStart<<S as StackTypes>::Input, InnerHidden<S>>;

/// The start of a cached pass, the one place its sample ids are checked:
/// `ids` must name the samples of `input`, once each (whether or not
/// anything is served); then units `0..entry` (`entry` from
/// [`cached_prefix`], frozen in `frozen`) are served from `cache` on
/// `device` (`None`: where the input is; see [`serve_prefix`]), unless
/// there is no cache or `entry` is 0.
///
/// Fails, changing nothing in the cache, as [`serve_prefix`] does.
pub fn serve_cached<S: StackTypes>(
    cache: Option<&mut StackCache<S>>,
    frozen: &FrozenUnits<S>,
    entry: usize,
    ids: &[u64],
    input: S::Input,
    device: Option<&burn::prelude::Device<InnerBackendOf<S>>>,
) -> Result<CachedStart<S>, CacheError>
where
    InnerInput<S>: Cacheable<InnerBackendOf<S>>,
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    check_sample_ids(ids, input.batch_size())?;
    let Some(cache) = cache.filter(|_| entry > 0) else {
        return Ok(BatchStart::Input(input));
    };
    let input = match device {
        Some(device) => input.inner().to_device(device),
        None => input.inner(),
    };
    let hidden = serve_prefix(cache, frozen, ids, input, entry)?;
    Ok(BatchStart::Hidden { entry, hidden })
}

/// Checks that `ids` name the `batch` samples of a batch, once each.
fn check_sample_ids(ids: &[u64], batch: usize) -> Result<(), CacheError> {
    if ids.len() != batch {
        return Err(CacheError::IdCount {
            batch,
            ids: ids.len(),
        });
    }
    let mut seen = HashSet::with_capacity(ids.len());
    if let Some(dup) = ids.iter().find(|id| !seen.insert(**id)) {
        return Err(CacheError::DuplicateId(*dup));
    }
    Ok(())
}

/// The output of frozen units `0..units` for the batch `input`, whose sample
/// `i` is named `ids[i]`, served from `cache` where it can be and computed
/// with `frozen` (which must start at unit 0 and hold those units frozen)
/// where it cannot.
///
/// A sample cached at `units` skips the frozen units; one cached at a lower
/// front runs only the units frozen since; others run the whole prefix, and
/// every computed output is cached. The result equals running `frozen` on
/// `input`.
///
/// Fails, changing nothing in the cache, when a sample id comes back with
/// inputs or outputs of another shape. `ids` name the batch: callers go
/// through [`serve_cached`], which checks them.
///
/// # Panics
/// When `units` is 0, reaches the stack's last unit, or is not frozen in
/// `frozen` (a caller's bug: [`serve_cached`] asks [`cached_prefix`]).
fn serve_prefix<S: StackTypes>(
    cache: &mut StackCache<S>,
    frozen: &FrozenUnits<S>,
    ids: &[u64],
    input: InnerInput<S>,
    units: usize,
) -> Result<InnerHidden<S>, CacheError>
where
    InnerInput<S>: Cacheable<InnerBackendOf<S>>,
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    assert!(
        units >= 1 && frozen.units().start == 0 && units <= frozen.units().end,
        "serve_prefix: units 0..{units} are not frozen in {:?}",
        frozen.units()
    );
    let input_shapes = check_inputs::<S>(cache, ids, &input)?;
    let device = input.device();
    // Where each sample starts: 0 (from the input) or a cached front.
    let mut outputs: Vec<Option<InnerHidden<S>>> = vec![None; ids.len()];
    let groups = look_up::<S>(cache, ids, units, &device, &mut outputs)?;
    let computed = compute_groups(frozen, &input, groups, ids.len(), units);
    // Check every new entry before storing any, so an error changes nothing.
    check_new_entries::<S>(cache, ids, &computed, &outputs)?;
    store::<S>(cache, ids, units, computed, &input_shapes, &mut outputs)?;
    Ok(Activation::cat_batch(
        outputs
            .into_iter()
            .map(|v| v.expect("every sample served"))
            .collect(),
    ))
}

/// The shapes of one sample of `input` (batch dimension 1), checked against
/// what the cache holds for each of `ids`.
fn check_inputs<S: StackTypes>(
    cache: &StackCache<S>,
    ids: &[u64],
    input: &InnerInput<S>,
) -> Result<Vec<Vec<usize>>, CacheError>
where
    InnerInput<S>: Cacheable<InnerBackendOf<S>>,
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    let mut input_shapes = input.shapes();
    for shape in &mut input_shapes {
        shape[0] = 1;
    }
    for &id in ids {
        cache.check_input(id, &input_shapes)?;
    }
    Ok(input_shapes)
}

/// Looks every sample up: a full hit goes into `outputs`; the others are
/// grouped by the front they start from (position in the batch, cached value).
fn look_up<S: StackTypes>(
    cache: &mut StackCache<S>,
    ids: &[u64],
    units: usize,
    device: &burn::prelude::Device<InnerBackendOf<S>>,
    outputs: &mut [Option<InnerHidden<S>>],
) -> Result<BTreeMap<usize, Vec<Start<S>>>, CacheError>
where
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    let mut groups: BTreeMap<usize, Vec<Start<S>>> = BTreeMap::new();
    crate::fault::check(crate::fault::Phase::CACHE_READ, None, None)
        .map_err(|e| CacheError::Injected(e.to_string()))?;
    for (i, &id) in ids.iter().enumerate() {
        match cache.lookup(id, units, device) {
            Some((front, value)) if front == units => {
                cache.count_hit(true);
                outputs[i] = Some(value);
            }
            Some((front, value)) => {
                cache.count_hit(false);
                groups.entry(front).or_default().push((i, Some(value)));
            }
            None => {
                cache.count_miss();
                groups.entry(0).or_default().push((i, None));
            }
        }
    }
    Ok(groups)
}

/// Runs each group from its front to `units`, one batch per group; the
/// output of each sample, with its position in the batch of `samples`.
fn compute_groups<S: StackTypes>(
    frozen: &FrozenUnits<S>,
    input: &InnerInput<S>,
    groups: BTreeMap<usize, Vec<Start<S>>>,
    samples: usize,
    units: usize,
) -> Vec<(usize, InnerHidden<S>)> {
    let run = |flow, from| match frozen.forward_units(flow, from, units) {
        Flow::Hidden(hidden) => hidden,
        other => panic!(
            "serve_prefix: unit {units} is not a hidden activation: {}",
            other.kind()
        ),
    };
    let mut computed = Vec::new();
    let mut singles = None;
    for (start, members) in groups {
        let sizes = vec![1; members.len()];
        let result = if start == 0 {
            let singles =
                singles.get_or_insert_with(|| input.clone().split_batch(&vec![1; samples]));
            let rows = members.iter().map(|(i, _)| singles[*i].clone()).collect();
            run(Flow::Input(Activation::cat_batch(rows)), 0)
        } else {
            let rows = members
                .iter()
                .map(|(_, value)| value.clone().expect("cached value"))
                .collect();
            run(Flow::Hidden(Activation::cat_batch(rows)), start)
        };
        for ((i, _), value) in members.iter().zip(result.split_batch(&sizes)) {
            computed.push((*i, value));
        }
    }
    computed
}

/// Checks the computed outputs against the cache, and the cached hits
/// against the shape of the first output.
fn check_new_entries<S: StackTypes>(
    cache: &StackCache<S>,
    ids: &[u64],
    computed: &[(usize, InnerHidden<S>)],
    outputs: &[Option<InnerHidden<S>>],
) -> Result<(), CacheError>
where
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    for (i, value) in computed {
        cache.check_output(ids[*i], value)?;
    }
    let reference = computed
        .first()
        .map(|(_, v)| v.shapes())
        .or_else(|| outputs.iter().flatten().next().map(|v| v.shapes()));
    for (i, value) in outputs.iter().enumerate() {
        if let (Some(value), Some(reference)) = (value, &reference)
            && &value.shapes() != reference
        {
            return Err(CacheError::ShapeMismatch {
                sample: ids[i],
                cached: value.shapes(),
                found: reference.clone(),
            });
        }
    }
    Ok(())
}

/// Caches every computed output and puts it in its place in `outputs`.
fn store<S: StackTypes>(
    cache: &mut StackCache<S>,
    ids: &[u64],
    units: usize,
    computed: Vec<(usize, InnerHidden<S>)>,
    input_shapes: &[Vec<usize>],
    outputs: &mut [Option<InnerHidden<S>>],
) -> Result<(), CacheError>
where
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    if !computed.is_empty() {
        crate::fault::check(crate::fault::Phase::CACHE_WRITE, None, None)
            .map_err(|e| CacheError::Injected(e.to_string()))?;
    }
    for (i, value) in computed {
        cache.insert(ids[i], units, value.clone(), input_shapes)?;
        outputs[i] = Some(value);
    }
    Ok(())
}
