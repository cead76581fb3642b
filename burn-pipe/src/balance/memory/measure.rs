//! Per-unit memory measured on a batch: parameter bytes from parameter
//! counts, activation bytes from the heap the forward pass keeps alive.

use burn::tensor::Device;
use burn_freeze::{Activation, AutodiffActivation, Differentiable, LayerStack, StackTypes, Unit};

use super::{HeapCounter, UnitMemory, float_bytes};
use crate::PipeError;
use crate::balance::sync_device;

/// Each unit's parameter bytes and, with [`HeapCounter`] installed, the
/// bytes its forward pass on `input` keeps for the backward pass, per
/// sample: the live heap after the unit's forward (its graph and output
/// held) less the live heap before. Every unit runs on `device`, from a
/// copy of the stack; nothing is trained. Without the counter the
/// activation figures are 0 (unknown).
///
/// Fails with [`PipeError::DeviceSync`], naming the unit, when the device
/// fails to synchronise.
pub fn measure_unit_memory<S>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
) -> Result<UnitMemory, PipeError>
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
{
    let mut memory =
        UnitMemory::from_param_counts(&stack.unit_params(), float_bytes::<S::Backend>());
    if !HeapCounter::installed() {
        return Ok(memory);
    }
    let samples = input.batch_size().max(1) as u64;
    // Twice: the first pass also pays one-time allocations (the backend's
    // and the graph's first buffers); the second is what a step keeps.
    kept_bytes(stack, input.clone(), device)?;
    let kept = kept_bytes(stack, input, device)?;
    memory.activations = kept
        .into_iter()
        .map(|bytes| (bytes as u64).div_ceil(samples))
        .collect();
    Ok(memory)
}

/// The live heap each unit's forward pass on `input` leaves behind, its
/// graph and output held.
fn kept_bytes<S>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
) -> Result<Vec<usize>, PipeError>
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
{
    let sync = |unit| sync_device::<S::Backend>(device, "measuring the memory of", unit);
    let mut kept = Vec::with_capacity(stack.num_units());
    sync(0)?;
    let before = HeapCounter::current();
    let hidden = stack.first().forward(input);
    sync(0)?;
    kept.push(HeapCounter::current().saturating_sub(before));
    // Each unit from a leaf of the previous output, as a pipeline stage
    // starts: what it keeps is its own graph and output.
    // Every graph and leaf held to the end, as a stage holds a
    // micro-batch's until its backward pass.
    let mut held = vec![];
    let mut outputs = vec![hidden.clone()];
    let mut hidden = hidden;
    for (i, unit) in stack.middle().iter().enumerate() {
        let leaf = S::Hidden::from_inner(hidden.inner()).require_grad();
        sync(i + 1)?;
        let before = HeapCounter::current();
        let out = unit.forward(leaf.clone());
        sync(i + 1)?;
        kept.push(HeapCounter::current().saturating_sub(before));
        held.push(leaf);
        outputs.push(out.clone());
        hidden = out;
    }
    let last = stack.num_units() - 1;
    let leaf = S::Hidden::from_inner(hidden.inner()).require_grad();
    sync(last)?;
    let before = HeapCounter::current();
    let out = stack.last().forward(leaf.clone());
    sync(last)?;
    kept.push(HeapCounter::current().saturating_sub(before));
    drop((out, leaf, held, outputs));
    Ok(kept)
}
