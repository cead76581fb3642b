//! Where units live: checking a balance, cutting a stack into stages on
//! their devices, and the optimizer each stage gets.

use burn::optim::GradientsParams;
use burn::tensor::Device;
use burn_freeze::plumbing::{GradientSums, WeightSnapshot};
use burn_freeze::{InnerBackendOf, LayerStack, StackTypes, TrainableUnits, UnitRange};

use crate::runtime::config::PipelineConfig;
use crate::runtime::error::PipeError;

/// One stage: its units, its optimizer, its device.
pub(crate) struct Stage<S: StackTypes, O> {
    /// `None` only while the units are inside a worker or an optimizer step.
    pub units: Option<UnitRange<S>>,
    pub optimizer: O,
    pub device: Device<S::Backend>,
    /// Stack indices of the units this stage holds.
    pub range: std::ops::Range<usize>,
    /// Gradients accumulated since the last optimizer step.
    pub pending: Option<GradientsParams>,
    /// Running sums of the stage's trainable parameters' gradients over
    /// the steps taken, when the pipeline keeps them.
    pub sums: Option<GradientSums<InnerBackendOf<S>>>,
    /// The trainable weights before the last optimizer step, when the
    /// pipeline measures update gains (none after a repartition: the
    /// first step after it has no gain to read).
    pub snapshot: Option<WeightSnapshot<InnerBackendOf<S>>>,
}

impl<S: StackTypes, O> Stage<S, O> {
    /// The stage's units, present between calls.
    pub fn units(&self) -> &UnitRange<S> {
        self.units
            .as_ref()
            .expect("a stage's units are present between calls")
    }

    /// The stage's units, mutably.
    pub fn units_mut(&mut self) -> &mut UnitRange<S> {
        self.units
            .as_mut()
            .expect("a stage's units are present between calls")
    }
}

/// Checks a balance and device list against a stack of `units` units, then
/// the configuration's own fields ([`PipelineConfig::check`]).
pub(crate) fn validate(
    balance: &[usize],
    units: usize,
    devices: usize,
    config: &PipelineConfig,
) -> Result<(), PipeError> {
    if balance.is_empty() {
        return Err(PipeError::NoStages);
    }
    if balance.len() > units {
        return Err(PipeError::TooManyStages {
            stages: balance.len(),
            units,
        });
    }
    if balance.contains(&0) || balance.iter().sum::<usize>() != units {
        return Err(PipeError::BadBalance {
            balance: balance.to_vec(),
            units,
        });
    }
    if devices != balance.len() {
        return Err(PipeError::DeviceCount {
            devices,
            stages: balance.len(),
        });
    }
    config.validate()
}

/// Places a stack on stages: stage `s` holds the next `balance[s]` units
/// (those before `front` frozen) on `devices[s]`, as fresh parameter leaves
/// there, with the optimizer that `optimizer` gives for its trainable units.
/// `balance` is already validated.
pub(crate) fn place<S: StackTypes, O>(
    stack: LayerStack<S>,
    balance: &[usize],
    front: usize,
    devices: Vec<Device<S::Backend>>,
    mut optimizer: impl FnMut(&TrainableUnits<S>) -> O,
) -> Vec<Stage<S, O>> {
    UnitRange::split(stack, balance)
        .expect("the balance was validated")
        .into_iter()
        .zip(devices)
        .map(|(mut units, device)| {
            units.freeze_to(front);
            let units = units.fork(&device);
            Stage {
                optimizer: optimizer(units.trainable()),
                range: units.units(),
                units: Some(units),
                device,
                pending: None,
                sums: None,
                snapshot: None,
            }
        })
        .collect()
}
