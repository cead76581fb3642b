//! Optimizer state that follows the units that still train, keyed by
//! parameter id, as units freeze or move between pipeline stages.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ParamId, list_param_ids};
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;

use crate::{StackTypes, TrainableUnits};

/// An optimizer record that is a map from parameter id to per-parameter
/// state, as every Burn optimizer built on `OptimizerAdaptor` (SGD, Adam,
/// AdamW, ...) has.
pub trait ParamStates: Sized {
    /// One parameter's state.
    type State;

    /// The record as `(id, state)` pairs.
    fn into_states(self) -> Vec<(ParamId, Self::State)>;

    /// A record from `(id, state)` pairs.
    fn from_states(states: Vec<(ParamId, Self::State)>) -> Self;
}

impl<T, R> ParamStates for T
where
    T: IntoIterator<Item = (ParamId, R)> + FromIterator<(ParamId, R)>,
{
    type State = R;

    fn into_states(self) -> Vec<(ParamId, R)> {
        self.into_iter().collect()
    }

    fn from_states(states: Vec<(ParamId, R)>) -> Self {
        states.into_iter().collect()
    }
}

/// An optimizer of a stack's trainable units whose state can be copied and
/// saved per parameter: `Optimizer<TrainableUnits<S>, S::Backend> +
/// 'static` with a [`ParamStates`] record, named once. Every such optimizer
/// is one (Burn's Adam, AdamW and SGD are), so generic code writes
/// `O: StackOptimizer<S>`.
///
/// ```
/// use burn::optim::Optimizer;
/// use burn_freeze::{ParamStates, StackOptimizer, StackTypes};
///
/// /// Parameters with optimizer state, for any stack and optimizer.
/// fn with_state<S: StackTypes, O: StackOptimizer<S>>(optimizer: &O) -> usize {
///     optimizer.to_record().into_states().len()
/// }
/// ```
pub trait StackOptimizer<S: StackTypes>:
    Optimizer<TrainableUnits<S>, S::Backend, Record: ParamStates> + 'static
{
}

impl<S, O> StackOptimizer<S> for O
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend> + 'static,
    O::Record: ParamStates,
{
}

/// The optimizer states of one or more optimizers, pooled by parameter id.
pub type StatePool<O, Mo, B> =
    HashMap<ParamId, <<O as Optimizer<Mo, B>>::Record as ParamStates>::State>;

/// Adds `optimizer`'s per-parameter states to `pool`.
pub fn pool_optimizer_state<O, Mo, B>(optimizer: &O, pool: &mut StatePool<O, Mo, B>)
where
    B: AutodiffBackend,
    Mo: AutodiffModule<B>,
    O: Optimizer<Mo, B>,
    O::Record: ParamStates,
{
    pool.extend(optimizer.to_record().into_states());
}

/// `optimizer` holding the states, taken out of `pool`, of `module`'s
/// parameters, and no other: the one helper that keeps the optimizer state
/// of the units that still train.
pub fn optimizer_for<O, Mo, B>(optimizer: O, module: &Mo, pool: &mut StatePool<O, Mo, B>) -> O
where
    B: AutodiffBackend,
    Mo: AutodiffModule<B>,
    O: Optimizer<Mo, B>,
    O::Record: ParamStates,
{
    let own = list_param_ids(module)
        .into_iter()
        .filter_map(|id| pool.remove(&id).map(|state| (id, state)))
        .collect();
    optimizer.load_record(O::Record::from_states(own))
}

/// Keeps only the optimizer state of parameters still in `module`: after the
/// front moves up, the state of newly frozen parameters is dropped.
pub fn retain_optimizer_state<O, Mo, B>(optimizer: O, module: &Mo) -> O
where
    B: AutodiffBackend,
    Mo: AutodiffModule<B>,
    O: Optimizer<Mo, B>,
    O::Record: ParamStates,
{
    let mut pool = StatePool::<O, Mo, B>::new();
    pool_optimizer_state(&optimizer, &mut pool);
    optimizer_for(optimizer, module, &mut pool)
}
