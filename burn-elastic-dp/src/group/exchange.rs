//! A replica's gradient exchange hidden behind its backward pass: each stage sums its gradients
//! with the other replicas' (in this process, then with the other processes) on its own worker
//! thread as soon as its last backward is done, last stage first, while earlier stages compute.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use burn::optim::GradientsParams;
use burn_freeze::{StackTypes, TrainableUnits};
use burn_pipe::StageGradients;

use super::share::Share;
use crate::collective;
use crate::error::ElasticError;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whose turn it is to exchange: stages go from the last to the first, the
/// order in which a pipeline finishes its backward, so that every replica
/// (and every process) calls the collectives in the same order.
#[derive(Debug)]
struct Turn {
    /// The stage whose exchange may run next (`None`: all done).
    next: Option<usize>,
    /// Set when a stage failed or an exchange failed: the waits give up.
    stopped: bool,
}

/// What the stages' exchanges measured.
#[derive(Debug, Default, Clone, Copy)]
struct Timing {
    /// When every stage had finished its passes.
    computed: Option<Instant>,
    /// When the last exchange ended.
    exchanged: Option<Instant>,
}

/// The [`StageGradients`] hook of one replica's share of a step: stage `s`
/// waits for the stages after it to have exchanged, then sums its gradients
/// over the group (this process's replicas through the collective, then the
/// other processes), on its own thread.
pub(super) struct StageExchange<'a, S: StackTypes, L> {
    share: &'a Share<L>,
    /// Each stage's trainable units (the gradients' parameters).
    modules: Vec<Mutex<TrainableUnits<S>>>,
    turn: Mutex<Turn>,
    changed: Condvar,
    /// The first exchange that failed, as the group reports it.
    error: Mutex<Option<ElasticError>>,
    timing: Mutex<Timing>,
    /// Tells the coordinating thread that the replica's passes are done.
    arrived: Box<dyn Fn() + Send + Sync + 'a>,
}

impl<'a, S: StackTypes, L> StageExchange<'a, S, L> {
    /// The hook for a pass over `modules` (one per stage, in order);
    /// `arrived` is called once every stage has finished its passes.
    pub fn new(
        share: &'a Share<L>,
        modules: Vec<TrainableUnits<S>>,
        arrived: impl Fn() + Send + Sync + 'a,
    ) -> Self {
        let stages = modules.len();
        Self {
            share,
            modules: modules.into_iter().map(Mutex::new).collect(),
            turn: Mutex::new(Turn {
                next: stages.checked_sub(1),
                stopped: false,
            }),
            changed: Condvar::new(),
            error: Mutex::new(None),
            timing: Mutex::new(Timing::default()),
            arrived: Box::new(arrived),
        }
    }

    /// The first exchange error, if one failed (the pass's error then only
    /// says that a hook gave up).
    pub fn take_error(&self) -> Option<ElasticError> {
        lock(&self.error).take()
    }

    /// After the pass: how long it waited on the exchanges after every
    /// stage had finished computing, the communication the backward did not
    /// hide.
    pub fn exposed(&self) -> Duration {
        let timing = *lock(&self.timing);
        match (timing.computed, timing.exchanged) {
            (Some(computed), Some(exchanged)) => exchanged.saturating_duration_since(computed),
            _ => Duration::ZERO,
        }
    }

    /// Stops every wait for a turn.
    fn stop(&self) {
        lock(&self.turn).stopped = true;
        self.changed.notify_all();
    }

    /// Waits until stage `stage` may exchange: the stages after it have,
    /// within the step's deadline.
    fn wait_turn(&self, stage: usize) -> Result<(), String> {
        let mut turn = lock(&self.turn);
        loop {
            if turn.stopped {
                return Err(format!(
                    "stage {stage}'s exchange was given up: a later stage failed"
                ));
            }
            if turn.next == Some(stage) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= self.share.deadline {
                return Err(format!(
                    "stage {stage}'s exchange waited past the step's deadline for the stages after it"
                ));
            }
            turn = self
                .changed
                .wait_timeout(turn, self.share.deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Stage `stage`'s gradients summed over this process's replicas, then
    /// over the processes.
    fn exchange(
        &self,
        stage: usize,
        grads: GradientsParams,
    ) -> Result<GradientsParams, ElasticError> {
        let share = self.share;
        let replica = share.replica;
        burn_freeze::fault::check(crate::fault::ALL_REDUCE, Some(stage), None).map_err(|e| {
            ElasticError::Replica {
                replica,
                source: e.into(),
            }
        })?;
        let module = lock(&self.modules[stage]);
        let grads = if share.local > 1 {
            let peer = collective::peer(share.generation, replica);
            collective::all_reduce::<S::Backend, _>(
                share.mode, peer, replica, stage, &*module, grads,
            )?
        } else {
            grads
        };
        share
            .nodes
            .all_reduce::<S::Backend, _>(replica, stage, &*module, grads, share.deadline)
    }
}

impl<S: StackTypes, L: Send + Sync> StageGradients for StageExchange<'_, S, L> {
    fn stage_done(&self, stage: usize, grads: GradientsParams) -> Result<GradientsParams, String> {
        self.wait_turn(stage)?;
        match self.exchange(stage, grads) {
            Ok(grads) => {
                lock(&self.timing).exchanged = Some(Instant::now());
                lock(&self.turn).next = stage.checked_sub(1);
                self.changed.notify_all();
                Ok(grads)
            }
            Err(error) => {
                let message = error.to_string();
                lock(&self.error).get_or_insert(error);
                self.stop();
                Err(message)
            }
        }
    }

    fn all_computed(&self) {
        lock(&self.timing).computed = Some(Instant::now());
        (self.arrived)();
    }

    fn stage_failed(&self, _stage: usize) {
        self.stop();
    }
}
