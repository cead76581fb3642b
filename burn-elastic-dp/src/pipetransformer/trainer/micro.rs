//! The trainer's micro-batch count M: chosen for every shape from unit times measured at a few
//! micro-batch sizes (profiled costs, no count configured), else the paper's rule.

use burn_freeze::{Activation, Differentiable};
use burn_pipe::{
    MicroBatchChoice, MicroBatchQuery, MicroBatchTimes, UnitState, choose_micro_batches,
    micro_batch_profile_sizes, profile_micro_batches,
};

use super::Trainer;
use super::bounds::{TrainerBackend, TrainerInput, TrainerOutput, TrainerTypes};
use super::error::TrainerError;
use super::rules::CostModel;

impl<TT: TrainerTypes> Trainer<TT> {
    /// The micro-batch count the group runs with and how it was chosen:
    /// `None` while the paper's rule or a configured count holds (no table
    /// of micro-batch times, or `micro_batches` set in the configuration).
    pub fn micro_batch_choice(&self) -> Option<&MicroBatchChoice> {
        self.micro.choice.as_ref()
    }

    /// Gives the unit times at several micro-batch sizes from which M is
    /// chosen (times measured elsewhere, or a synthetic table for a
    /// what-if), instead of measuring them on the first batch, and chooses
    /// M for the current shape at once; every later shape is chosen from
    /// it too, whatever the cost model. A configured `micro_batches` still
    /// holds. The table is not checkpointed: a resumed run measures again
    /// (with profiled costs) or keeps the paper's rule.
    ///
    /// Fails, changing nothing, when the table does not time every unit of
    /// the model.
    pub fn set_micro_batch_times(
        &mut self,
        times: MicroBatchTimes,
    ) -> Result<Option<&MicroBatchChoice>, TrainerError> {
        let units = self.group.num_units();
        if times.units() != units {
            return Err(TrainerError::InvalidConfig {
                field: "micro_batch_times",
                value: format!("a table of {} units", times.units()),
                accepted: "a table that times every unit of the model",
            });
        }
        self.micro.times = Some(times);
        self.choose_micro_batches();
        Ok(self.micro_batch_choice())
    }

    /// Before the first step (of a new or resumed trainer, after the unit
    /// costs' profile): the unit times measured at a few micro-batch sizes
    /// on `input` (a copy of the model on the first device) when the costs
    /// are profiled ([`CostModel::Profiled`]), no table was given and no count
    /// is configured; then M chosen for the current shape. A run that starts
    /// at one stage measures nothing (K never grows; one stage has no bubble:
    /// M = 1).
    pub(super) fn micro_batches_if_pending(
        &mut self,
        input: &TrainerInput<TT>,
    ) -> Result<(), TrainerError>
    where
        TrainerOutput<TT>: Differentiable<TrainerBackend<TT>>,
    {
        if !self.micro.pending {
            return Ok(());
        }
        self.micro.pending = false;
        // One stage has no bubble to fill, and no rule lengthens a pipeline:
        // a run that starts at K = 1 keeps the paper's M = 1 and pays no
        // profile (on MiniLM, as long as a fifth of a short run).
        if let CostModel::Profiled { repeats } = self.config.costs
            && self.config.measures_micro_batches(self.shape().stages())
            && self.micro.times.is_none()
        {
            // The largest batch a replica can get: the global batch of one.
            let largest = self.config.batch.global_batch(1).min(input.batch_size());
            let sizes = micro_batch_profile_sizes(largest);
            let stack = self.group.to_layer_stack()?;
            let device = &self.devices[0];
            let measured = profile_micro_batches(&stack, input.clone(), device, &sizes, repeats)
                .map_err(|error| {
                    tracing::warn!(%error, "micro-batch sizes not profiled; the paper's micro-batch count holds")
                })
                .ok();
            // Every process chooses from the same table: the slowest's.
            self.micro.times = super::agree::micro_batch_times(&self.group, measured)?;
        }
        self.choose_micro_batches();
        Ok(())
    }

    /// M for the current shape from the table, set on the group and
    /// logged; the choice, or `None` when the paper's rule or a configured
    /// count holds (then the group keeps its configured count). Asked for
    /// every shape the run takes (at its first step and after each
    /// transition), by burn-pipe's step model ([`choose_micro_batches`]).
    /// Without a table (a fixed `micro_batches`, or parameter-count costs and
    /// no table given) the paper's rule holds
    /// ([`PipelineConfig::micro_batches`](burn_pipe::PipelineConfig::micro_batches)).
    pub(super) fn choose_micro_batches(&mut self) -> Option<MicroBatchChoice> {
        let configured = self.config.replicas.pipeline.micro_batches;
        let times = self.micro.times.as_ref().filter(|_| configured.is_none())?;
        let shape = self.shape();
        if shape.replicas == 0 {
            return None;
        }
        let units = self.group.num_units();
        let front = self.group.front();
        let parts = self.config.parts;
        // Stage 0's frozen units, as the pipeline serves them (never the
        // last unit), when the cache serves them.
        let cached = if parts.cache && parts.freeze && self.group.cache().is_some() {
            front.min(shape.balance[0]).min(units - 1)
        } else {
            0
        };
        let states: Vec<UnitState> = (0..units)
            .map(|u| UnitState::of(u, front, cached))
            .collect();
        let total = self.group.total_replicas();
        let batch_per_replica = self.config.batch.global_batch(total) / total;
        let query = MicroBatchQuery {
            balance: &shape.balance,
            states: &states,
            batch_per_replica,
            schedule: self.config.replicas.pipeline.schedule,
        };
        let applied = choose_micro_batches(times, &query)
            .map_err(|e| e.to_string())
            .and_then(|choice| {
                let set = self.group.set_micro_batches(Some(choice.micro_batches));
                set.map(|()| choice).map_err(|e| e.to_string())
            });
        match applied {
            Ok(choice) => {
                tracing::info!(
                    K = shape.stages(),
                    R = shape.replicas,
                    batch_per_replica,
                    M = choice.micro_batches,
                    predicted_ms = format!("{:.2}", choice.predicted_step_s * 1e3),
                    paper_M = choice.paper_micro_batches,
                    paper_predicted_ms = choice
                        .predicted(choice.paper_micro_batches)
                        .map(|s| format!("{:.2}", s * 1e3)),
                    "micro-batches chosen from measured times"
                );
                self.micro.choice = Some(choice.clone());
                Some(choice)
            }
            Err(error) => {
                tracing::warn!(%error, "micro-batches not chosen; the paper's count holds");
                // Cannot fail: `None` is always a valid count.
                let _ = self.group.set_micro_batches(None);
                self.micro.choice = None;
                None
            }
        }
    }

    /// Micro-batches per replica with `stages` stages: the group's own
    /// (chosen or configured) at its current length, the configured rule
    /// at another.
    pub(super) fn micro_batches(&self, stages: usize) -> usize {
        if self.group.num_replicas() > 0 && self.group.num_stages() == stages {
            self.group.micro_batches()
        } else {
            self.config.replicas.pipeline.micro_batches_for(stages)
        }
    }
}
