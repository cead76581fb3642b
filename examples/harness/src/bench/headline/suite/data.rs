//! Each task's models and data: the generated tasks pretrain a model per
//! seed, the SST tasks load MiniLM with a classifier drawn from the seed.

use std::time::Instant;

use burn::data::dataset::Dataset;
use burn_pipe::UnitMemory;

use super::super::memory;
use super::super::real::{RealPaths, RealSizes};
use super::super::shared::{Progress, run_err};
use super::task::{SuiteTask, sst_sizes};
use crate::bench::BenchError;
use pipetransformer_jobs::job::{
    JobError, JobSpec, Method, ModelKind, Observer, PretrainSettings, Pretrained, RunRecord,
    SstJob, SstLabels,
};

/// What the suite needs of a task: each seed's spec and model, the units'
/// memory (for the budget) and a fine-tuning run.
pub(super) trait TaskData {
    /// The fine-tuning spec of `seed`.
    fn spec(&self, seed: u64) -> JobSpec;
    /// The model every configuration of `seed` starts from.
    fn model(&mut self, seed: u64) -> Result<Pretrained, BenchError>;
    /// The units' memory of `model` on one global batch of the task.
    fn unit_memory(&self, spec: &JobSpec, model: &Pretrained) -> Result<UnitMemory, BenchError>;
    /// Fine-tunes `model` with `method`, `spec`'s sizes.
    fn finetune<O: Observer>(
        &self,
        spec: &JobSpec,
        model: &Pretrained,
        name: &str,
        method: &Method,
        observer: &mut O,
    ) -> Result<RunRecord, JobError>;
    /// The model's blocks (the freeze policy's layers).
    fn layers(&self) -> usize;
    /// Tokens per sentence, where the task tokenizes.
    fn max_length(&self) -> Option<usize> {
        None
    }
}

/// Models pretrained for the generated tasks, per model and seed (the BERT
/// tasks share theirs: pretraining does not depend on the fine-tuning task).
#[derive(Default)]
pub(super) struct Pretrains {
    models: Vec<((ModelKind, u64), Pretrained)>,
}

/// A generated task (`same`, `middle-majority`, the ViT's).
pub(super) struct Generated<'a> {
    /// The spec (of seed 0) and how it pretrains.
    base: (JobSpec, PretrainSettings),
    pretrains: &'a mut Pretrains,
}

impl<'a> Generated<'a> {
    /// `task` at the sizes `quick` picks; `None` for a task that is not a
    /// generated one.
    pub(super) fn new(task: SuiteTask, quick: bool, pretrains: &'a mut Pretrains) -> Option<Self> {
        Some(Self {
            base: task.generated(quick, 0)?,
            pretrains,
        })
    }

    fn sizes(&self, seed: u64) -> (JobSpec, PretrainSettings) {
        let (spec, settings) = &self.base;
        (
            JobSpec {
                seed,
                ..spec.clone()
            },
            *settings,
        )
    }
}

impl TaskData for Generated<'_> {
    fn spec(&self, seed: u64) -> JobSpec {
        self.sizes(seed).0
    }

    fn model(&mut self, seed: u64) -> Result<Pretrained, BenchError> {
        let (spec, settings) = self.sizes(seed);
        let key = (spec.model, seed);
        if let Some((_, model)) = self.pretrains.models.iter().find(|(k, _)| *k == key) {
            return Ok(model.clone());
        }
        spec.for_pretraining(settings).validate().map_err(run_err)?;
        let start = Instant::now();
        let model = spec.pretrain_with(settings, &mut Progress);
        println!(
            "{:?} seed {seed}: pretrained in {:.0} s ({} epochs)",
            spec.model,
            start.elapsed().as_secs_f64(),
            spec.pretrain_epochs
        );
        self.pretrains.models.push((key, model.clone()));
        Ok(model)
    }

    fn unit_memory(&self, spec: &JobSpec, model: &Pretrained) -> Result<UnitMemory, BenchError> {
        memory::unit_memory(spec, model)
    }

    fn finetune<O: Observer>(
        &self,
        spec: &JobSpec,
        model: &Pretrained,
        name: &str,
        method: &Method,
        observer: &mut O,
    ) -> Result<RunRecord, JobError> {
        spec.finetune(model, name, method, observer)
            .map(|(record, _)| record)
    }

    fn layers(&self) -> usize {
        self.base.0.layers
    }
}

/// MiniLM on SST-2 or SST-5.
pub(super) struct Sst {
    sizes: RealSizes,
    paths: RealPaths,
    labels: SstLabels,
    job: SstJob,
    layers: usize,
}

impl Sst {
    /// Loads `labels`' sentences from `paths` (the training subset drawn
    /// with the sizes' subset seed) at the sizes `quick` picks.
    pub(super) fn load(
        labels: SstLabels,
        quick: bool,
        paths: &RealPaths,
    ) -> Result<Self, BenchError> {
        let sizes = sst_sizes(labels, quick);
        let spec = sizes.spec(sizes.subset_seed, 6);
        spec.validate().map_err(run_err)?;
        let (model, job) = spec
            .load_sst_labelled(&paths.weights, &paths.data, sizes.max_length, labels)
            .map_err(run_err)?;
        let layers = (model.num_units().saturating_sub(2) / 2).max(1);
        println!(
            "{} ({} units, {} parameters) on {} from {}: {} training sentences (subset seed {}), {} dev sentences",
            paths.weights.display(),
            model.num_units(),
            model.num_params(),
            labels.name(),
            paths.data.display(),
            job.train.len(),
            sizes.subset_seed,
            job.dev.len()
        );
        Ok(Self {
            sizes,
            paths: paths.clone(),
            labels,
            job,
            layers,
        })
    }
}

impl TaskData for Sst {
    fn spec(&self, seed: u64) -> JobSpec {
        self.sizes.spec(seed, self.layers)
    }

    /// The checkpoint with its classifier drawn from `seed` (the sentences
    /// are the job's, loaded once).
    fn model(&mut self, seed: u64) -> Result<Pretrained, BenchError> {
        let spec = JobSpec {
            samples: usize::MAX,
            ..self.sizes.spec(seed, self.layers)
        };
        let (model, _) = spec
            .load_sst_labelled(
                &self.paths.weights,
                &self.paths.data,
                self.sizes.max_length,
                self.labels,
            )
            .map_err(run_err)?;
        Ok(model)
    }

    fn unit_memory(&self, spec: &JobSpec, model: &Pretrained) -> Result<UnitMemory, BenchError> {
        spec.sst_unit_memory(model, &self.job).map_err(run_err)
    }

    fn finetune<O: Observer>(
        &self,
        spec: &JobSpec,
        model: &Pretrained,
        name: &str,
        method: &Method,
        observer: &mut O,
    ) -> Result<RunRecord, JobError> {
        spec.finetune_sst(model, &self.job, name, method, observer)
            .map(|(record, _)| record)
    }

    fn layers(&self) -> usize {
        self.layers
    }

    fn max_length(&self) -> Option<usize> {
        Some(self.sizes.max_length)
    }
}
