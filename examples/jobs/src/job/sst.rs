//! The real path: a pretrained Hugging Face BERT checkpoint fine-tuned on
//! SST-2 (or SST-5).

use std::path::Path;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, ElasticSampler};
use burn_freeze::{AutodiffActivation, IntoLayerStack};
use models::bert::{BertInput, BertPooling};
use models::pretrained::BertCheckpoint;
use models::sst::{SstBatch, SstBatcher, SstDataset, SstItem, SstLabels, SstSplit};
use models::tokenizer::{Padding, WordPieceTokenizer};

use super::{JobError, JobSpec, Method, Observer, Pretrained, RunRecord};
use crate::backend::{self, Inner, Train};
use crate::task::accuracy;

/// The real path: a pretrained BERT checkpoint fine-tuned on SST-2 (or
/// SST-5: [`JobSpec::load_sst_labelled`]).
#[derive(Debug, Clone)]
pub struct SstJob {
    /// SST-2 or SST-5: the classifier has [`SstLabels::classes`] outputs.
    pub labels: SstLabels,
    /// Training sentences (a seeded subset when the spec asks for fewer).
    pub train: SstDataset,
    /// Held-out sentences (the dev split, or its first `eval_samples`).
    pub dev: SstDataset,
    /// The freeze rule's validation sentences: training-split sentences
    /// outside the subset ([`JobSpec::validation_samples`] of them; none
    /// when the job trains on the whole split).
    pub validation: SstDataset,
    /// Tokenizes sentences to a fixed length (a sample keeps its shape, as
    /// AutoCache needs).
    pub batcher: SstPairs,
}

/// [`SstBatcher`] giving the `(input, labels)` pairs the trainer takes.
#[derive(Debug, Clone)]
pub struct SstPairs(pub SstBatcher);

impl<B: Backend> Batcher<B, SstItem, (BertInput<B>, Tensor<B, 1, Int>)> for SstPairs {
    fn batch(&self, items: Vec<SstItem>, device: &B::Device) -> (BertInput<B>, Tensor<B, 1, Int>) {
        let batch: SstBatch<B> = self.0.batch(items, device);
        (batch.input, batch.labels)
    }
}

/// Accuracy of `model` on an SST-format file (PTB trees) read with the
/// job's labels, in batches of 64.
pub fn sst_accuracy(model: &Pretrained, file: &Path, job: &SstJob) -> Result<f64, JobError> {
    let Pretrained::Bert(stack) = model else {
        return Err(JobError::Spec(
            "--eval-file needs a BERT fine-tuned on SST".into(),
        ));
    };
    let data = SstDataset::from_file_labelled(file, job.labels)
        .map_err(|e| JobError::Data(format!("--eval-file {}: {e}", file.display())))?;
    if data.is_empty() {
        return Err(JobError::Data(format!(
            "--eval-file {}: no {} sentence",
            file.display(),
            job.labels.name()
        )));
    }
    let device = backend::device(0);
    let model = burn_freeze::FreezableStack::new(stack.clone());
    let (mut right, mut total) = (0.0, 0usize);
    for chunk in data.items().chunks(64) {
        let (input, labels): (BertInput<Train>, Tensor<Train, 1, Int>) =
            job.batcher.batch(chunk.to_vec(), &device);
        let n = chunk.len();
        right += accuracy(model.forward_inner(input.inner()), labels.inner()) * n as f64;
        total += n;
    }
    Ok(right / total as f64)
}

/// A flag's path and why it cannot be read, as a [`JobError::Data`].
fn unreadable(flag: &str, path: &Path, error: &dyn std::fmt::Display) -> JobError {
    JobError::Data(format!("{flag} {}: {error}", path.display()))
}

impl JobSpec {
    /// The real path: loads a Hugging Face BERT checkpoint from `weights`
    /// (config.json, model.safetensors, tokenizer.json; a fresh 2-class
    /// classifier on the mean-pooled states) and SST-2 from `data` (train.txt
    /// and dev.txt, PTB trees), sentences tokenized to `max_length` tokens.
    /// `samples` (when smaller than the training split) picks a seeded
    /// subset, `eval_samples` the first dev sentences.
    pub fn load_sst(
        &self,
        weights: &Path,
        data: &Path,
        max_length: usize,
    ) -> Result<(Pretrained, SstJob), JobError> {
        self.load_sst_labelled(weights, data, max_length, SstLabels::Binary)
    }

    /// [`load_sst`](Self::load_sst) with `labels`: SST-5
    /// ([`SstLabels::FineGrained`]) keeps the neutral sentences and gives
    /// the classifier 5 outputs, one per root label.
    pub fn load_sst_labelled(
        &self,
        weights: &Path,
        data: &Path,
        max_length: usize,
        labels: SstLabels,
    ) -> Result<(Pretrained, SstJob), JobError> {
        let (train, validation, dev) = self.sst_splits(data, labels)?;
        let checkpoint =
            BertCheckpoint::open(weights).map_err(|e| unreadable("--weights", weights, &e))?;
        let device = backend::device(0);
        <Inner as Backend>::seed(&device, self.seed);
        let config = checkpoint
            .config(labels.classes())
            .with_pooling(BertPooling::Mean);
        if max_length > config.max_position {
            return Err(JobError::Spec(format!(
                "--max-length {max_length} exceeds the {} positions of {}",
                config.max_position,
                weights.display()
            )));
        }
        let (model, report) = checkpoint
            .load::<Train>(&config, &device)
            .map_err(|e| unreadable("--weights", weights, &e))?;
        tracing::info!(%report, "pretrained weights loaded");
        let tokenizer = WordPieceTokenizer::from_file(checkpoint.tokenizer_path())
            .map_err(|e| unreadable("--weights", weights, &e))?
            .with_max_length(max_length)
            .with_padding(Padding::Fixed(max_length));
        let job = SstJob {
            labels,
            train,
            dev,
            validation,
            batcher: SstPairs(SstBatcher::new(tokenizer)),
        };
        // The checkpoint has no classifier: it is drawn here, once, so that
        // every run fine-tunes the same weights.
        Ok((
            Pretrained::Bert(model.into_layer_stack()).materialized(),
            job,
        ))
    }

    /// The training sentences of `labels` (a seeded subset of `samples`
    /// when fewer are asked for), validation sentences (the first of the
    /// training split's others, [`validation_samples`](Self::validation_samples)
    /// at most) and the first `eval_samples` dev sentences.
    fn sst_splits(
        &self,
        data: &Path,
        labels: SstLabels,
    ) -> Result<(SstDataset, SstDataset, SstDataset), JobError> {
        let read = |split| {
            SstDataset::split_labelled(data, split, labels)
                .map_err(|e| unreadable("--data", data, &e))
        };
        let (train, dev) = (read(SstSplit::Train)?, read(SstSplit::Dev)?);
        if train.is_empty() || dev.is_empty() {
            return Err(JobError::Data(format!(
                "--data {}: train.txt or dev.txt holds no {} sentence",
                data.display(),
                labels.name()
            )));
        }
        let (train, validation) = if self.samples < train.len() {
            let items = train.items();
            let mut sampler = ElasticSampler::new(
                items.len(),
                BatchPolicy::FixedGlobal {
                    batch: self.samples,
                },
                self.seed,
            )
            .map_err(|e| JobError::Spec(e.to_string()))?;
            let chosen = sampler.next_batch(1).expect("a non-empty split");
            let mut taken = vec![false; items.len()];
            chosen.iter().for_each(|&i| taken[i] = true);
            let validation: Vec<_> = (0..items.len())
                .filter(|&i| !taken[i])
                .take(self.validation_samples())
                .map(|i| items[i].clone())
                .collect();
            let train: Vec<_> = chosen.into_iter().map(|i| items[i].clone()).collect();
            (SstDataset::from(train), SstDataset::from(validation))
        } else {
            (train, SstDataset::from(Vec::new()))
        };
        Ok((train, validation, dev.take(self.eval_samples)))
    }

    /// The units' memory ([`burn_pipe::balance::measure_unit_memory`]) of
    /// `pretrained` on the first global batch of `job`'s training sentences,
    /// as memory-aware AutoPipe measures it on its first batch.
    pub fn sst_unit_memory(
        &self,
        pretrained: &Pretrained,
        job: &SstJob,
    ) -> Result<burn_pipe::UnitMemory, JobError> {
        let Pretrained::Bert(stack) = pretrained else {
            return Err(JobError::Spec("SST-2 fine-tunes a BERT".into()));
        };
        let device = backend::device(0);
        let items: Vec<SstItem> = job.train.items().iter().take(self.batch).cloned().collect();
        let (input, _): (BertInput<Train>, Tensor<Train, 1, Int>) =
            job.batcher.batch(items, &device);
        burn_pipe::balance::measure_unit_memory(stack, input, &device)
            .map_err(|error| JobError::Trainer(error.into()))
    }

    /// [`finetune`](Self::finetune) on SST ([`load_sst`](Self::load_sst)),
    /// on the first `samples` training sentences where the spec asks for
    /// fewer than the job holds.
    pub fn finetune_sst(
        &self,
        pretrained: &Pretrained,
        job: &SstJob,
        name: &str,
        method: &Method,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, Pretrained), JobError> {
        let Pretrained::Bert(stack) = pretrained else {
            return Err(JobError::Spec("SST-2 fine-tunes a BERT".into()));
        };
        let held_out = job
            .batcher
            .batch(job.dev.items().to_vec(), &backend::device(0));
        let validation = (!job.validation.is_empty()).then(|| {
            job.batcher
                .batch(job.validation.items().to_vec(), &backend::device(0))
        });
        // A spec of fewer samples than the job loaded (the (b*) search's
        // short runs) trains on the first of them.
        let subset;
        let train = if self.samples < job.train.len() {
            subset = job.train.clone().take(self.samples);
            &subset
        } else {
            &job.train
        };
        let (record, stack) = self.finetune_data(
            stack.clone(),
            name,
            method,
            train,
            &job.batcher,
            held_out,
            validation,
            observer,
        )?;
        Ok((record, Pretrained::Bert(stack)))
    }
}
