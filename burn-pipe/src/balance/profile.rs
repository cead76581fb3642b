//! Measuring each unit's forward and backward time on the real backend.

use std::time::Instant;

use burn::tensor::Device;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Activation, AutodiffActivation, Differentiable, LayerStack, StackTypes, Unit};

use crate::PipeError;
use crate::balance::costs::UnitProfile;
use crate::balance::micro_count::error::MicroSearchError;
use crate::balance::micro_count::times::{MicroBatchTimes, check_sizes};
use crate::balance::sync_device;

/// Times each unit's forward and backward pass on `input`, the fastest of
/// `repeats` runs (at least 1), synchronising the device around each timing.
///
/// Fails with [`PipeError::DeviceSync`], naming the unit, when the device
/// fails to synchronise.
pub fn profile_units<S>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
    repeats: usize,
) -> Result<Vec<UnitProfile>, PipeError>
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
{
    type B<S> = <S as StackTypes>::Backend;
    let last = stack.num_units() - 1;
    let mut best: Option<Vec<UnitProfile>> = None;
    for _ in 0..repeats.max(1) {
        let mut times = Vec::with_capacity(stack.num_units());
        let (hidden, time) = time_unit::<B<S>, _, _>(
            device,
            0,
            || stack.first().forward(input.clone()),
            None::<&S::Hidden>,
        )?;
        times.push(time);
        let mut hidden = hidden;
        for (i, unit) in stack.middle().iter().enumerate() {
            let leaf = S::Hidden::from_inner(hidden.inner()).require_grad();
            let (out, time) =
                time_unit::<B<S>, _, _>(device, i + 1, || unit.forward(leaf.clone()), Some(&leaf))?;
            times.push(time);
            hidden = out;
        }
        let leaf = S::Hidden::from_inner(hidden.inner()).require_grad();
        let (_, time) = time_unit::<B<S>, _, _>(
            device,
            last,
            || stack.last().forward(leaf.clone()),
            Some(&leaf),
        )?;
        times.push(time);
        best = Some(match best {
            None => times,
            Some(old) => (old.into_iter().zip(times))
                .map(|(old, time)| UnitProfile {
                    forward: old.forward.min(time.forward),
                    backward: old.backward.min(time.backward),
                })
                .collect(),
        });
    }
    // `repeats.max(1)` runs: at least one filled `best`.
    Ok(best.unwrap_or_default())
}

/// [`profile_units`] at each micro-batch size of `sizes` (increasing, 1 to
/// the batch; [`micro_batch_profile_sizes`](crate::micro_batch_profile_sizes)
/// picks a few), each on the first `size` samples of `input` (split as the
/// pipeline splits a batch): the table [`choose_micro_batches`](crate::choose_micro_batches)
/// reads. The largest size is timed first, the fastest of `repeats` runs
/// (its row is that batch's unit profile, and its first run warms the
/// model); each smaller size then once, warm: the largest size's
/// `repeats` runs and one run of the rest (at sizes 1 to 32 and 3
/// repeats, a third less than every size 3 times). Fails, before timing
/// anything, on a size beyond the batch or sizes that are not strictly
/// increasing from 1, and with
/// [`MicroSearchError::Profile`] when profiling fails (a device that does
/// not synchronise).
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
    let time_size = |size: usize, repeats: usize| {
        let part = if size == batch {
            input.clone()
        } else {
            let mut parts = input.clone().split_batch(&[size, batch - size]);
            parts.swap_remove(0)
        };
        tracing::debug!(size, repeats, "profiling every unit at a micro-batch size");
        profile_units(stack, part, device, repeats).map_err(|error| MicroSearchError::Profile {
            size,
            error: error.to_string(),
        })
    };
    // `check_sizes` refused an empty list.
    let Some((&largest, smaller)) = sizes.split_last() else {
        return Err(MicroSearchError::NoSizes);
    };
    let top = time_size(largest, repeats)?;
    let mut profiles = smaller
        .iter()
        .map(|&size| time_size(size, 1))
        .collect::<Result<Vec<_>, _>>()?;
    profiles.push(top);
    MicroBatchTimes::new(sizes.to_vec(), profiles)
}

/// Runs unit `unit`'s `forward`, then a backward pass seeded with the
/// output itself.
fn time_unit<B, O, Run>(
    device: &Device<B>,
    unit: usize,
    forward: Run,
    input: Option<&impl Differentiable<B>>,
) -> Result<(O, UnitProfile), PipeError>
where
    B: AutodiffBackend,
    O: Differentiable<B>,
    Run: FnOnce() -> O,
{
    let sync = || sync_device::<B>(device, "profiling", unit);
    sync()?;
    let start = Instant::now();
    let output = forward();
    sync()?;
    let forward_time = start.elapsed();
    let seed = output.clone().inner();
    let start = Instant::now();
    let grads = output.seed(seed).backward();
    if let Some(input) = input {
        let _ = input.grad(&grads);
    }
    sync()?;
    let backward = start.elapsed();
    Ok((
        output,
        UnitProfile {
            forward: forward_time,
            backward,
        },
    ))
}
