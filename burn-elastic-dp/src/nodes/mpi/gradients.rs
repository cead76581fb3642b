//! A stage's gradients exchanged with the other processes: copied into the stage's arena, summed
//! there in place, read back once and shared.

use std::sync::Arc;
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};

use crate::error::ElasticError;

use super::link::{NodeLink, lock, node_error};
use crate::collective::Slot;
use crate::nodes::phases::ExchangePhases;

/// Takes the gradients of a module's parameters out of `grads` in the
/// module's visiting order (the same on every replica): the leader copies
/// them into its stage's arena, another replica only drops them.
struct CopyOut<'a, B: Backend> {
    grads: &'a mut GradientsParams,
    /// The leader's arena (emptied first, its capacity kept); `None` on the
    /// other replicas.
    send: Option<&'a mut Vec<f32>>,
    slots: Vec<Slot>,
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
        self.slots.push(Slot {
            id: param.id,
            shape,
            len,
        });
        let Some(send) = self.send.as_deref_mut() else {
            return;
        };
        let mut data = grad.into_data();
        if data.dtype != DType::F32 {
            data = data.convert::<f32>();
        }
        let copied = match data.as_slice::<f32>() {
            Ok(values) => {
                send.extend_from_slice(values);
                Ok(())
            }
            // Bytes not aligned for f32: read them by value.
            Err(_) => data
                .to_vec::<f32>()
                .map(|values| send.extend_from_slice(&values)),
        };
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
/// message (buckets of at most [`BUCKET_VALUES`](super::BUCKET_VALUES)) summed in place in the
/// stage's arena, kept across steps; the other local replicas drop theirs and take the leader's
/// result.
///
/// Only the leader copies: its gradients (after the sum inside the process,
/// the same on every local replica) into the arena, and the sums
/// back into one tensor per parameter, which the other local replicas
/// share (a tensor handle each, moved to their devices); they drop their
/// own gradients without reading them.
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
            send: None,
            slots: Vec::new(),
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
    let before = arena.values.capacity();
    arena.values.clear();
    let mut copy = CopyOut::<AB::InnerBackend> {
        grads,
        send: Some(&mut arena.values),
        slots: Vec::new(),
        device: None,
        error: None,
    };
    module.visit(&mut copy);
    let (slots, device, error) = (copy.slots, copy.device, copy.error);
    if let Some(message) = error {
        return Err(node_error(link.rank, message));
    }
    let len = arena.values.len();
    if arena.values.capacity() > 2 * len.max(1) {
        // The stage holds far fewer gradients than before (a freeze, a
        // repartition): the arena keeps no more than twice what it holds.
        arena.values.shrink_to_fit();
    }
    if arena.values.capacity() != before {
        tracing::debug!(stage, values = len, "gradient arena (re)allocated");
    }
    let copy_out = start.elapsed();
    // Nothing trains here: the exchange still runs (with no value) to keep
    // every process in step.
    let arena = link.sum(arena, deadline)?;
    let back = Instant::now();
    let mut parts = Vec::with_capacity(slots.len());
    if let Some((device, dtype)) = device {
        let mut offset = 0;
        for slot in &slots {
            let values = arena.values[offset..offset + slot.len].to_vec();
            offset += slot.len;
            let mut data = TensorData::new(values, [slot.len]);
            if dtype != DType::F32 {
                data = data.convert_dtype(dtype);
            }
            parts.push(Tensor::<AB::InnerBackend, 1>::from_data(data, &device));
        }
    }
    lock(&link.arenas).keep(stage, arena);
    link.record(&ExchangePhases {
        copy_out,
        copy_back: back.elapsed(),
        ..ExchangePhases::default()
    });
    Ok((slots, parts))
}
