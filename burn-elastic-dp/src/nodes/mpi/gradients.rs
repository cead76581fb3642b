//! A stage's gradients exchanged with the other processes: the large ones summed in place in their
//! own memory, the small ones packed into the stage's arena; given back to tensors once and shared.

use std::sync::Arc;
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};

use crate::error::ElasticError;

use super::link::{NodeLink, lock, node_error};
use super::sum::{Arena, WHOLE_VALUES, Whole};
use crate::collective::Slot;
use crate::nodes::phases::ExchangePhases;

/// Where the leader put a gradient for the exchange.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// Its own memory: the next of `arena.whole` (they are in slot order).
    Whole,
    /// `arena.packed[offset..offset + len]`.
    Packed(usize),
}

/// Takes the gradients of a module's parameters out of `grads` in the
/// module's visiting order (the same on every replica): the leader puts
/// them into its stage's arena, another replica only drops them.
struct CopyOut<'a, B: Backend> {
    grads: &'a mut GradientsParams,
    /// The leader's arena (emptied first, the packed part's capacity kept);
    /// `None` on the other replicas.
    arena: Option<&'a mut Arena>,
    slots: Vec<Slot>,
    places: Vec<Place>,
    /// The first gradient's device and dtype: the reduced ones take them.
    device: Option<(B::Device, DType)>,
    error: Option<String>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for CopyOut<'_, AB::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let Some(grad) = self.grads.remove::<AB::InnerBackend, D>(param.id) else {
            return;
        };
        let shape = grad.dims().to_vec();
        let len = shape.iter().product();
        if self.device.is_none() {
            self.device = Some((grad.device(), grad.dtype()));
        }
        let Some(arena) = self.arena.as_deref_mut() else {
            self.slots.push(Slot {
                id: param.id,
                shape,
                len,
            });
            return;
        };
        // Its memory as it is (no copy on the CPU backend when nothing
        // else holds the tensor), as f32.
        let mut data = grad.into_data();
        if data.dtype != DType::F32 {
            data = data.convert::<f32>();
        }
        // Where it goes depends on its size alone, so that every rank lays
        // the stage out alike: a large gradient keeps its memory (copied
        // only when its bytes are not aligned for f32), a small one is
        // packed.
        let copied = if len >= WHOLE_VALUES {
            let aligned = if data.as_slice::<f32>().is_ok() {
                Ok(data)
            } else {
                data.to_vec::<f32>()
                    .map(|values| TensorData::new(values, [len]))
            };
            aligned.map(|data| {
                self.places.push(Place::Whole);
                arena.whole.push(Whole::new(data, &shape));
            })
        } else {
            self.places.push(Place::Packed(arena.packed.len()));
            match data.as_slice::<f32>() {
                Ok(values) => {
                    arena.packed.extend_from_slice(values);
                    Ok(())
                }
                Err(_) => data
                    .to_vec::<f32>()
                    .map(|values| arena.packed.extend_from_slice(&values)),
            }
        };
        self.slots.push(Slot {
            id: param.id,
            shape,
            len,
        });
        if let Err(error) = copied {
            self.error
                .get_or_insert_with(|| format!("reading the gradient of {}: {error:?}", param.id));
        }
    }
}

/// The shared result of an exchange: one reduced gradient per slot.
type Parts<B> = Vec<Tensor<B, 1>>;

/// The group-wide sum of the gradients of `module`'s parameters (this
/// process's sum in `grads`) on stage `stage`, for local replica
/// `replica`: the leader exchanges them with the other processes in one
/// exchange, summed in place (see [`Arena`]: each large gradient in its own
/// memory, the small ones packed in the stage's arena, kept across steps;
/// buckets of at most [`BUCKET_VALUES`](super::BUCKET_VALUES)); the other
/// local replicas drop theirs and take the leader's result.
///
/// Only the leader touches the values: its gradients (after the sum inside
/// the process, the same on every local replica) go into the arena, and
/// the sums come back as one tensor per parameter, which the other local
/// replicas share (a tensor handle each, moved to their devices); they drop
/// their own gradients without reading them. On the CPU backend only the
/// small gradients are copied.
pub(crate) fn all_reduce_gradients<AB, M>(
    link: &NodeLink,
    replica: usize,
    stage: usize,
    module: &M,
    mut grads: GradientsParams,
    deadline: Instant,
) -> Result<GradientsParams, ElasticError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let start = Instant::now();
    if replica > 0 {
        // The same sums as the leader's (the sum inside the process came
        // first): dropped unread, the leader's taken instead.
        let mut take = CopyOut::<AB::InnerBackend> {
            grads: &mut grads,
            arena: None,
            slots: Vec::new(),
            places: Vec::new(),
            device: None,
            error: None,
        };
        module.visit(&mut take);
        let (slots, device) = (take.slots, take.device);
        let shared = link.leader_result(replica, deadline)?;
        let Some((device, _)) = device else {
            return Ok(grads);
        };
        let parts = shared
            .downcast_ref::<Parts<AB::InnerBackend>>()
            .filter(|parts| parts.len() == slots.len())
            .ok_or_else(|| {
                node_error(
                    link.rank,
                    format!(
                        "the leader replica's sums are not those of stage {stage}'s {} gradients",
                        slots.len()
                    ),
                )
            })?;
        let parts = parts
            .iter()
            .map(|part| part.clone().to_device(&device))
            .collect();
        crate::collective::register_parts::<AB, M>(module, &mut grads, slots, parts);
        return Ok(grads);
    }
    let result = leader_exchange::<AB, M>(link, stage, module, &mut grads, deadline, start);
    link.share(match &result {
        Ok((_, parts)) => Ok(Arc::new(parts.clone())),
        Err(error) => Err(error.to_string()),
    });
    let (slots, parts) = result?;
    let back = Instant::now();
    crate::collective::register_parts::<AB, M>(module, &mut grads, slots, parts);
    link.record(&ExchangePhases {
        copy_back: back.elapsed(),
        total: start.elapsed(),
        ..ExchangePhases::default()
    });
    Ok(grads)
}

/// The leader's exchange of stage `stage`: its gradients out of `grads`
/// into the stage's arena, summed over the processes in place, and back as
/// one tensor per parameter (with the slots they belong to).
fn leader_exchange<AB, M>(
    link: &NodeLink,
    stage: usize,
    module: &M,
    grads: &mut GradientsParams,
    deadline: Instant,
    start: Instant,
) -> Result<(Vec<Slot>, Parts<AB::InnerBackend>), ElasticError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let mut arena = lock(&link.arenas).take(stage);
    let before = arena.packed.capacity();
    arena.packed.clear();
    arena.whole.clear();
    let mut copy = CopyOut::<AB::InnerBackend> {
        grads,
        arena: Some(&mut arena),
        slots: Vec::new(),
        places: Vec::new(),
        device: None,
        error: None,
    };
    module.visit(&mut copy);
    let (slots, places, device, error) = (copy.slots, copy.places, copy.device, copy.error);
    if let Some(message) = error {
        return Err(node_error(link.rank, message));
    }
    let packed = arena.packed.len();
    if arena.packed.capacity() > 2 * packed.max(1) {
        // The stage holds far fewer gradients than before (a freeze, a
        // repartition): the arena keeps no more than twice what it holds.
        arena.packed.shrink_to_fit();
    }
    if arena.packed.capacity() != before {
        tracing::debug!(stage, packed, "gradient arena (re)allocated");
    }
    let copy_out = start.elapsed();
    // Nothing trains here: the exchange still runs (with no value) to keep
    // every process in step.
    let mut arena = link.sum(arena, deadline)?;
    let back = Instant::now();
    let mut parts = Vec::with_capacity(slots.len());
    if let Some((device, dtype)) = device {
        let mut whole = arena.whole.drain(..);
        for (slot, place) in slots.iter().zip(&places) {
            let mut data = match *place {
                Place::Whole => whole.next().map(|whole| whole.data).ok_or_else(|| {
                    node_error(
                        link.rank,
                        format!("stage {stage}: fewer gradients came back than went out"),
                    )
                })?,
                Place::Packed(offset) => {
                    TensorData::new(arena.packed[offset..offset + slot.len].to_vec(), [slot.len])
                }
            };
            if dtype != DType::F32 {
                data = data.convert_dtype(dtype);
            }
            // A flat view of the same memory (no copy on the CPU backend):
            // `register_parts` gives it the parameter's shape again.
            let data = TensorData::from_bytes(data.bytes, [slot.len], data.dtype);
            parts.push(Tensor::<AB::InnerBackend, 1>::from_data(data, &device));
        }
    }
    // `whole` is empty again (drained above, or never filled): the arena
    // keeps no gradient's memory across steps.
    lock(&link.arenas).keep(stage, arena);
    link.record(&ExchangePhases {
        copy_out,
        copy_back: back.elapsed(),
        ..ExchangePhases::default()
    });
    Ok((slots, parts))
}
