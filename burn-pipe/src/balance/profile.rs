//! Measuring each unit's forward and backward time on the real backend.

use std::time::Instant;

use burn::tensor::Device;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Activation, AutodiffActivation, Differentiable, LayerStack, StackTypes, Unit};

use crate::balance::costs::UnitProfile;
use crate::balance::micro_count::error::MicroSearchError;
use crate::balance::micro_count::times::{MicroBatchTimes, check_sizes};

/// Times each unit's forward and backward pass on `input`, the fastest of
/// `repeats` runs (at least 1), synchronising the device around each timing.
pub fn profile_units<S>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
    repeats: usize,
) -> Vec<UnitProfile>
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
{
    type B<S> = <S as StackTypes>::Backend;
    let mut best: Vec<Option<UnitProfile>> = vec![None; stack.num_units()];
    for _ in 0..repeats.max(1) {
        let mut times = Vec::with_capacity(stack.num_units());
        let (hidden, time) = time_unit::<B<S>, _, _>(
            device,
            || stack.first().forward(input.clone()),
            None::<&S::Hidden>,
        );
        times.push(time);
        let mut hidden = hidden;
        for unit in stack.middle() {
            let leaf = S::Hidden::from_inner(hidden.inner()).require_grad();
            let (out, time) =
                time_unit::<B<S>, _, _>(device, || unit.forward(leaf.clone()), Some(&leaf));
            times.push(time);
            hidden = out;
        }
        let leaf = S::Hidden::from_inner(hidden.inner()).require_grad();
        let (_, time) =
            time_unit::<B<S>, _, _>(device, || stack.last().forward(leaf.clone()), Some(&leaf));
        times.push(time);
        for (slot, time) in best.iter_mut().zip(times) {
            *slot = Some(match *slot {
                None => time,
                Some(old) => UnitProfile {
                    forward: old.forward.min(time.forward),
                    backward: old.backward.min(time.backward),
                },
            });
        }
    }
    best.into_iter()
        .map(|p| p.expect("at least one repeat"))
        .collect()
}

/// [`profile_units`] at each micro-batch size of `sizes` (increasing, 1 to
/// the batch; [`micro_batch_profile_sizes`](crate::micro_batch_profile_sizes)
/// picks a few), each on the first `size` samples of `input` (split as the
/// pipeline splits a batch): the table [`choose_micro_batches`](crate::choose_micro_batches)
/// reads. Fails, before timing anything, on a size beyond the batch or
/// sizes that are not strictly increasing from 1.
pub fn profile_micro_batches<S>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
    sizes: &[usize],
    repeats: usize,
) -> Result<MicroBatchTimes, MicroSearchError>
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
{
    let batch = input.batch_size();
    if let Some(&size) = sizes.iter().find(|&&size| size > batch) {
        return Err(MicroSearchError::SizeTooLarge { size, batch });
    }
    check_sizes(sizes)?;
    let profiles = sizes
        .iter()
        .map(|&size| {
            let part = if size == batch {
                input.clone()
            } else {
                let mut parts = input.clone().split_batch(&[size, batch - size]);
                parts.swap_remove(0)
            };
            tracing::debug!(size, "profiling every unit at a micro-batch size");
            profile_units(stack, part, device, repeats)
        })
        .collect();
    MicroBatchTimes::new(sizes.to_vec(), profiles)
}

/// Runs `forward`, then a backward pass seeded with the output itself.
fn time_unit<B, O, Run>(
    device: &Device<B>,
    forward: Run,
    input: Option<&impl Differentiable<B>>,
) -> (O, UnitProfile)
where
    B: AutodiffBackend,
    O: Differentiable<B>,
    Run: FnOnce() -> O,
{
    B::sync(device).expect("device sync");
    let start = Instant::now();
    let output = forward();
    B::sync(device).expect("device sync");
    let forward_time = start.elapsed();
    let seed = output.clone().inner();
    let start = Instant::now();
    let grads = output.seed(seed).backward();
    if let Some(input) = input {
        let _ = input.grad(&grads);
    }
    B::sync(device).expect("device sync");
    let backward = start.elapsed();
    (
        output,
        UnitProfile {
            forward: forward_time,
            backward,
        },
    )
}
