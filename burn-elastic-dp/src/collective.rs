//! The burn-collective glue: one group per process, formed by registering every replica's peer,
//! dissolved by finishing them, reset after a failure; every blocking call bounded.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use burn::collective::{
    AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation, finish_collective, register,
    reset_collective,
};
use burn::config::Config;
use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorPrimitive};
use crossbeam_channel::{Receiver, Sender, bounded};

use crate::error::ElasticError;

/// How the replicas' gradients are all-reduced; both give the same mean.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum AllReduce {
    /// One collective call per gradient tensor, in parameter-id order
    /// (burn-optim's `GradientsParams::all_reduce`).
    PerTensor,
    /// Gradients flattened into buckets of about `bucket_bytes` bytes, one
    /// collective call per bucket (as PyTorch DDP does).
    Bucketed {
        /// Bytes per bucket (at least 1).
        bucket_bytes: usize,
    },
}

/// The process's one collective group: a token taken by the live group and
/// given back when it is dropped.
fn token() -> &'static (Sender<()>, Receiver<()>) {
    static TOKEN: OnceLock<(Sender<()>, Receiver<()>)> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let (tx, rx) = bounded(1);
        tx.send(()).expect("a fresh channel has room");
        (tx, rx)
    })
}

/// Holds the process's collective while alive.
#[derive(Debug)]
pub(crate) struct GroupToken(());

impl GroupToken {
    /// Takes the token, waiting at most `timeout` for another group to end.
    pub fn acquire(timeout: Duration) -> Result<Self, ElasticError> {
        token()
            .1
            .recv_timeout(timeout)
            .map(|()| GroupToken(()))
            .map_err(|_| ElasticError::GroupBusy { waited: timeout })
    }
}

impl Drop for GroupToken {
    fn drop(&mut self) {
        let _ = token().0.try_send(());
    }
}

/// Peer ids per formation of a group (more than any group has replicas).
const PEERS_PER_GENERATION: usize = 1 << 16;

/// Formations of a group in this process so far.
static GENERATIONS: AtomicUsize = AtomicUsize::new(0);

/// A generation no formation in this process has had: peer ids unique
/// across every group of the process, one after another included.
pub(crate) fn next_generation() -> usize {
    GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1
}

/// The peer of replica `replica` in the group's `generation`-th formation.
/// Every formation has peers of its own, so a replica thread left behind by
/// a failed step (still computing when the group went on without it) gets
/// an error from a later formation instead of joining its all-reduce.
pub(crate) fn peer(generation: usize, replica: usize) -> PeerId {
    PeerId::from(
        generation
            .wrapping_mul(PEERS_PER_GENERATION)
            .wrapping_add(replica),
    )
}

/// Registers `devices.len()` peers (one per replica, on that replica's
/// device) with backend `B`, from one thread each, waiting at most
/// `timeout`, all-reducing with `strategy` between them. On failure the
/// collective is reset; a registration thread that cannot start fails
/// first, no peer registered ([`ElasticError::Spawn`]).
///
/// burn-collective 0.21 keeps one local server per backend type per process
/// and its calls have no timeout: a registration waits for every peer, an
/// all-reduce for every registered peer. The group therefore registers from
/// threads that run nothing else (so none can fail half-way), bounds those
/// waits, and on a failure resets the collective, which drops every pending
/// operation so that no caller stays blocked.
pub(crate) fn form<B: Backend>(
    generation: usize,
    devices: &[B::Device],
    strategy: AllReduceStrategy,
    timeout: Duration,
) -> Result<(), ElasticError> {
    let config = CollectiveConfig::default()
        .with_num_devices(devices.len())
        .with_local_all_reduce_strategy(strategy);
    let (tx, rx) = crossbeam_channel::unbounded();
    // Every registration thread starts first, each waiting for the word to
    // register: one that cannot start leaves no peer registered (the others,
    // their word dropped, end at once).
    let mut go = Vec::with_capacity(devices.len());
    for (replica, device) in devices.iter().enumerate() {
        let (tx, device, config) = (tx.clone(), device.clone(), config.clone());
        let spawn_failed = |message: String| ElasticError::Spawn {
            replica,
            what: "registration",
            message,
        };
        burn_freeze::fault::check(crate::fault::REGISTER_THREAD, Some(replica), None)
            .map_err(|injected| spawn_failed(injected.to_string()))?;
        let (word, wait) = bounded::<()>(1);
        // Detached: a registration only waits for the others, and a reset
        // releases it; nothing else runs on these threads.
        thread::Builder::new()
            .name(format!("burn-elastic-dp register {replica}"))
            .spawn(move || {
                burn_pipe::plumbing::quiet_worker_panics();
                // Bounded: the word comes, or is dropped, as soon as every
                // registration thread has started.
                if wait.recv().is_ok() {
                    let result = register::<B>(peer(generation, replica), device, config);
                    let _ = tx.send((replica, result));
                }
            })
            .map_err(|error| spawn_failed(error.to_string()))?;
        go.push(word);
    }
    drop(tx);
    for word in go {
        // The thread waits for its word: the slot is empty.
        let _ = word.send(());
    }
    let deadline = Instant::now() + timeout;
    let mut done = vec![false; devices.len()];
    while done.iter().any(|d| !d) {
        match rx.recv_deadline(deadline) {
            Ok((replica, Ok(()))) => done[replica] = true,
            Ok((replica, Err(error))) => {
                reset_collective::<B>();
                return Err(ElasticError::Collective {
                    replica,
                    operation: "register".into(),
                    message: format!("{error:?}"),
                });
            }
            Err(_) => {
                reset_collective::<B>();
                return Err(ElasticError::Timeout {
                    missing: (0..devices.len()).filter(|&r| !done[r]).collect(),
                    waited: timeout,
                    lost: Vec::new(),
                });
            }
        }
    }
    tracing::debug!(replicas = devices.len(), "collective group formed");
    Ok(())
}

/// Unregisters every peer of a group of `replicas` (each call returns at
/// once), so that a group of another size can form.
pub(crate) fn dissolve<B: Backend>(generation: usize, replicas: usize) {
    for replica in 0..replicas {
        if let Err(error) = finish_collective::<B>(peer(generation, replica)) {
            tracing::warn!(
                replica,
                ?error,
                "finishing a collective peer failed; resetting"
            );
            reset_collective::<B>();
            return;
        }
    }
}

/// The sum over the group of `grads`, the gradients of `module`'s
/// parameters on stage `stage` of replica `replica` (peer `peer`), as `mode`
/// says: one collective call per tensor, or per bucket of tensors. Every
/// peer must call this with the same mode, module structure and tensors.
pub(crate) fn all_reduce<AB, M>(
    mode: AllReduce,
    peer: PeerId,
    replica: usize,
    stage: usize,
    module: &M,
    grads: GradientsParams,
) -> Result<GradientsParams, ElasticError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    match mode {
        AllReduce::PerTensor => all_reduce_sum::<AB::InnerBackend>(peer, replica, stage, grads),
        AllReduce::Bucketed { bucket_bytes } => {
            all_reduce_sum_bucketed::<AB, M>(peer, replica, stage, module, grads, bucket_bytes)
        }
    }
}

/// The sum of `grads` over the group (one collective call per tensor, in
/// parameter-id order; every peer must call this with the same tensors).
///
/// A sum, not a mean: the replicas scale their losses by their share of the
/// batch, so the sum is the batch's gradient. burn-collective's mean divides
/// every peer's copy of the shared sum apart, a full pass over the gradients
/// per replica; the sum is handed to every peer as one shared buffer.
fn all_reduce_sum<B: Backend>(
    peer: PeerId,
    replica: usize,
    stage: usize,
    grads: GradientsParams,
) -> Result<GradientsParams, ElasticError> {
    grads
        .all_reduce::<B>(peer, ReduceOperation::Sum)
        .map_err(|error| ElasticError::Collective {
            replica,
            operation: format!("all-reduce of stage {stage}'s gradients"),
            message: format!("{error:?}"),
        })
}

/// One gradient of a bucket: its parameter, shape and element count.
pub(crate) struct Slot {
    pub id: ParamId,
    pub shape: Vec<usize>,
    pub len: usize,
}

/// Takes every gradient of `module`'s parameters out of `grads`, flattened,
/// in the module's visiting order (the same on every replica).
struct Flatten<'a, B: Backend> {
    grads: &'a mut GradientsParams,
    slots: Vec<Slot>,
    flat: Vec<Tensor<B, 1>>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Flatten<'_, AB::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if let Some(grad) = self.grads.remove::<AB::InnerBackend, D>(param.id) {
            let shape = grad.dims().to_vec();
            let len = shape.iter().product();
            self.slots.push(Slot {
                id: param.id,
                shape,
                len,
            });
            self.flat.push(grad.reshape([len]));
        }
    }
}

/// Puts reduced gradients back, reshaped, under their parameters.
struct Unflatten<'a, B: Backend> {
    grads: &'a mut GradientsParams,
    reduced: std::collections::HashMap<ParamId, (Vec<usize>, Tensor<B, 1>)>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Unflatten<'_, AB::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if let Some((shape, flat)) = self.reduced.remove(&param.id) {
            let dims: [usize; D] = shape
                .try_into()
                .expect("a gradient has its parameter's rank");
            self.grads
                .register::<AB::InnerBackend, D>(param.id, flat.reshape(dims));
        }
    }
}

/// Takes the gradients of `module`'s parameters out of `grads`, each
/// flattened, in the module's visiting order (the same on every replica).
pub(crate) fn flatten<AB, M>(
    module: &M,
    grads: &mut GradientsParams,
) -> (Vec<Slot>, Vec<Tensor<AB::InnerBackend, 1>>)
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let mut flatten = Flatten::<AB::InnerBackend> {
        grads,
        slots: Vec::new(),
        flat: Vec::new(),
    };
    module.visit(&mut flatten);
    (flatten.slots, flatten.flat)
}

/// Cuts `bucket` (the gradients of `slots`, one after another) back into
/// gradients and puts them in `reduced` under their parameters.
fn split_bucket<B: Backend>(
    slots: Vec<Slot>,
    bucket: Tensor<B, 1>,
    reduced: &mut std::collections::HashMap<ParamId, (Vec<usize>, Tensor<B, 1>)>,
) {
    let mut start = 0;
    for slot in slots {
        let part = bucket.clone().narrow(0, start, slot.len);
        start += slot.len;
        reduced.insert(slot.id, (slot.shape, part));
    }
}

/// Puts `parts` (the flattened gradients of `slots`, one per slot, in
/// order) back into `grads` under `module`'s parameters.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // the exchange between processes
pub(crate) fn register_parts<AB, M>(
    module: &M,
    grads: &mut GradientsParams,
    slots: Vec<Slot>,
    parts: Vec<Tensor<AB::InnerBackend, 1>>,
) where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let reduced = slots
        .into_iter()
        .zip(parts)
        .map(|(slot, part)| (slot.id, (slot.shape, part)))
        .collect();
    module.visit(&mut Unflatten::<AB::InnerBackend> { grads, reduced });
}

/// The sum of the gradients of `module`'s parameters over the group,
/// flattened into buckets of about `bucket_bytes` (as PyTorch DDP does): one
/// collective call per bucket instead of one per tensor. Every peer must
/// call this with the same module structure and bucket size.
fn all_reduce_sum_bucketed<AB, M>(
    peer: PeerId,
    replica: usize,
    stage: usize,
    module: &M,
    mut grads: GradientsParams,
    bucket_bytes: usize,
) -> Result<GradientsParams, ElasticError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let (slots, flat) = flatten::<AB, M>(module, &mut grads);
    let mut reduced = std::collections::HashMap::with_capacity(slots.len());
    let mut pending: Vec<(Slot, Tensor<AB::InnerBackend, 1>)> = Vec::new();
    let mut pending_bytes = 0;
    let mut items = slots.into_iter().zip(flat).peekable();
    while let Some((slot, tensor)) = items.next() {
        pending_bytes += slot.len * tensor.dtype().size();
        pending.push((slot, tensor));
        if pending_bytes >= bucket_bytes || items.peek().is_none() {
            let (slots, tensors): (Vec<Slot>, Vec<_>) = pending.drain(..).unzip();
            let bucket = Tensor::cat(tensors, 0).into_primitive().tensor();
            let bucket = burn::collective::all_reduce::<AB::InnerBackend>(
                peer,
                bucket,
                ReduceOperation::Sum,
            )
            .map_err(|error| ElasticError::Collective {
                replica,
                operation: format!("all-reduce of a gradient bucket of stage {stage}"),
                message: format!("{error:?}"),
            })?;
            let bucket =
                Tensor::<AB::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(bucket));
            split_bucket(slots, bucket, &mut reduced);
            pending_bytes = 0;
        }
    }
    module.visit(&mut Unflatten::<AB::InnerBackend> {
        grads: &mut grads,
        reduced,
    });
    Ok(grads)
}
