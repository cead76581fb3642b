//! A replica group trains as one pipeline on the whole batch: its gradients
//! equal one pipeline's, its replicas stay bit-identical, a policy freezes
//! them all, and a failing replica ends the step with an error naming it,
//! changing nothing.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, SgdConfig};
use burn::prelude::*;
use burn_elastic_dp::{AllReduce, ElasticError, ReplicaConfig};
use burn_freeze::FreezeFront;
use burn_freeze::{AutoFreeze, FixedSchedule, LayerMap, LayerStack, StackMarker};
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig};

burn_freeze::test_backend!();

#[derive(Module, Debug)]
pub struct Dense<B: Backend> {
    linear: Linear<B>,
    /// Panics when it sees a batch of exactly this many samples (0: never).
    #[module(skip)]
    trip: usize,
    /// Stalls for `.1` milliseconds on a batch of exactly `.0` samples.
    #[module(skip)]
    stall: (usize, u64),
}

impl<B: Backend> Dense<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        assert!(
            x.dims()[0] != self.trip,
            "tripwire: a batch of {} samples",
            self.trip
        );
        if x.dims()[0] == self.stall.0 {
            // Simulates a replica stuck in its own computation.
            std::thread::sleep(std::time::Duration::from_millis(self.stall.1));
        }
        x.clone() + self.linear.forward(x).tanh()
    }
}

#[derive(Module, Debug)]
pub struct Head<B: Backend> {
    linear: Linear<B>,
}

impl<B: Backend> Head<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
burn_freeze::unit!(Head<B>: Tensor<B, 2> => Tensor<B, 2>);

type Types = StackMarker<B, Dense<B>, Dense<B>, Head<B>>;

const WIDTH: usize = 8;
const CLASSES: usize = 3;

/// 6 units: 5 residual blocks and a head; `trip` on the third block.
fn stack(trip: usize) -> LayerStack<Types> {
    stalling_stack(trip, (0, 0))
}

/// [`stack`] whose third block also stalls as `stall` says.
fn stalling_stack(trip: usize, stall: (usize, u64)) -> LayerStack<Types> {
    let device = Default::default();
    let dense = |trip, stall| Dense {
        linear: LinearConfig::new(WIDTH, WIDTH).init(&device),
        trip,
        stall,
    };
    LayerStack::new(
        dense(0, (0, 0)),
        vec![
            dense(0, (0, 0)),
            dense(trip, stall),
            dense(0, (0, 0)),
            dense(0, (0, 0)),
        ],
        Head {
            linear: LinearConfig::new(WIDTH, CLASSES).init(&device),
        },
    )
}

/// Batch `seed` of `n` samples.
fn batch(seed: u64, n: usize) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let x: Vec<f32> = (0..n * WIDTH).map(|_| 2.0 * next() - 1.0).collect();
    let y: Vec<i64> = (0..n)
        .map(|_| (next() * CLASSES as f32) as i64 % CLASSES as i64)
        .collect();
    let device = Default::default();
    (
        Tensor::<B, 1>::from_data(TensorData::new(x, [n * WIDTH]), &device).reshape([n, WIDTH]),
        Tensor::from_data(TensorData::new(y, [n]), &device),
    )
}

/// Every float parameter's values, in visiting order.
struct Collect(Vec<TensorData>);
impl<Be: Backend> ModuleVisitor<Be> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        self.0.push(param.val().to_data());
    }
}

fn weights(stack: &LayerStack<Types>) -> Vec<TensorData> {
    let mut collect = Collect(Vec::new());
    stack.first().visit(&mut collect);
    stack.middle().iter().for_each(|u| u.visit(&mut collect));
    stack.last().visit(&mut collect);
    collect.0
}

/// Largest |a - b| over the largest |b|, over all tensors of two gradient sets.
fn relative_diff<M: Module<B>>(
    module: &M,
    actual: &GradientsParams,
    expected: &GradientsParams,
) -> f32 {
    struct Diff<'a> {
        actual: &'a GradientsParams,
        expected: &'a GradientsParams,
        worst: f32,
        compared: usize,
    }
    impl<Be: Backend> ModuleVisitor<Be> for Diff<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
            let a = self
                .actual
                .get::<Inner, D>(param.id)
                .expect("a gradient per parameter");
            let e = self
                .expected
                .get::<Inner, D>(param.id)
                .expect("a gradient per parameter");
            let scale = e.clone().abs().max().into_scalar().max(f32::MIN_POSITIVE);
            self.worst = self.worst.max((a - e).abs().max().into_scalar() / scale);
            self.compared += 1;
        }
    }
    let mut diff = Diff {
        actual,
        expected,
        worst: 0.0,
        compared: 0,
    };
    module.visit(&mut diff);
    assert!(diff.compared > 0, "compared no gradient");
    diff.worst
}

fn loss(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

fn pipeline_config() -> PipelineConfig {
    PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![3, 3]))
}

#[test]
fn replicas_on_a_split_batch_give_one_pipelines_gradients_on_the_whole_batch() {
    let device: Device<B> = Default::default();
    // Per tensor, and in buckets of 300 bytes (several per stage, a tensor
    // of 8 x 8 floats filling one alone), and one bucket per stage.
    for (replicas, samples, mode) in [
        (2, 8, AllReduce::PerTensor),
        (3, 10, AllReduce::PerTensor),
        (2, 8, AllReduce::Bucketed { bucket_bytes: 300 }),
        (3, 10, AllReduce::Bucketed { bucket_bytes: 300 }),
        (
            3,
            10,
            AllReduce::Bucketed {
                bucket_bytes: 1 << 20,
            },
        ),
    ] {
        let model = stack(0);
        let _ = weights(&model); // read the weights before cloning
        let (x, y) = batch(replicas as u64, samples);
        let mut single = pipeline_config()
            .init(model.clone(), vec![device; 2], || SgdConfig::new().init())
            .unwrap();
        single
            .forward_backward(x.clone(), y.clone(), loss, StepOptions::new())
            .unwrap();
        let mut group = ReplicaConfig::new()
            .with_pipeline(pipeline_config())
            .with_all_reduce(mode)
            .init(model, vec![vec![device; 2]; replicas], || {
                SgdConfig::new().init()
            })
            .unwrap();
        let report = group.forward_backward(x, y, loss).unwrap();
        assert_eq!(report.shards.iter().sum::<usize>(), samples);
        for r in 0..replicas {
            for s in 0..2 {
                let diff = relative_diff(
                    group.replica(r).stage(s).trainable(),
                    group.replica(r).gradients(s).unwrap(),
                    single.gradients(s).unwrap(),
                );
                assert!(
                    diff <= 1e-5,
                    "R={replicas} ({:?}, {mode:?}): replica {r} stage {s} differs by {diff}",
                    report.shards
                );
            }
        }
    }
}

#[test]
fn after_ten_adam_steps_the_replicas_are_bit_identical() {
    let device: Device<B> = Default::default();
    let model = stack(0);
    let _ = weights(&model);
    let mut single: Pipeline<Types, _> = pipeline_config()
        .init(model.clone(), vec![device; 2], || AdamConfig::new().init())
        .unwrap();
    let mut group = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(model, vec![vec![device; 2]; 2], || AdamConfig::new().init())
        .unwrap();
    for step in 0..10 {
        let (x, y) = batch(100 + step, 8);
        single
            .train_step(x.clone(), y.clone(), loss, StepOptions::new(), 1e-2)
            .unwrap();
        group.train_step(x, y, loss, 1e-2).unwrap();
    }
    let replica0 = weights(&group.replica(0).to_layer_stack());
    let replica1 = weights(&group.replica(1).to_layer_stack());
    assert!(
        replica0
            .iter()
            .zip(&replica1)
            .all(|(a, b)| a.as_bytes() == b.as_bytes()),
        "the replicas drifted apart"
    );
    // And they trained as the single pipeline did (the same maths; rounding
    // differs with the summation order).
    for (a, b) in replica0.iter().zip(weights(&single.to_layer_stack())) {
        let a = a.to_vec::<f32>().unwrap();
        let b = b.to_vec::<f32>().unwrap();
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(worst <= 1e-4 * scale.max(1.0), "weights differ by {worst}");
    }
}

#[test]
fn a_freeze_policy_moves_every_replica() {
    let device: Device<B> = Default::default();
    let mut group = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(stack(0), vec![vec![device; 2]; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    let mut auto = AutoFreeze::new(FixedSchedule::Fronts(vec![0, 2, 4]), LayerMap::per_unit(6));
    for epoch in 0..3 {
        let (x, y) = batch(200 + epoch, 6);
        group.train_step(x, y, loss, 1e-2).unwrap();
        auto.after_epoch(&mut group).unwrap();
    }
    assert_eq!(group.front(), 4);
    for r in 0..2 {
        assert_eq!(group.replica(r).front(), 4, "replica {r}");
        assert_eq!(group.replica(r).stage(0).num_trainable(), 0, "replica {r}");
    }
    // Repartitioning moves every replica; training goes on.
    group
        .repartition(&[5, 1], vec![vec![device; 2]; 2])
        .unwrap();
    let (x, y) = batch(300, 6);
    group.train_step(x, y, loss, 1e-2).unwrap();
    assert_eq!(group.replica(1).balance(), vec![5, 1]);
    // Evaluation from the activation after the frozen units, the batch
    // shared among the replicas, gives the whole forward's output.
    let (x, _) = batch(400, 7);
    assert_eq!(group.cached_prefix(), 4);
    let input = burn_freeze::plumbing::Flow::Input(x.clone().inner());
    let kept = group.forward_frozen_inner(input, 0, 4).unwrap();
    let shared = group.forward_inner_from(kept, 4).unwrap();
    shared.into_data().assert_approx_eq::<f32>(
        &group.forward_inner(x.inner()).unwrap().into_data(),
        Default::default(),
    );
}

#[test]
fn a_failing_replica_is_named_and_the_step_changes_nothing() {
    let device: Device<B> = Default::default();
    // Batch 5 over 2 replicas: shards of 3 and 2 samples, in 2 micro-batches
    // each (2 + 1 and 1 + 1): only replica 0 sees a 2-sample micro-batch,
    // which trips the third block, on stage 0.
    let mut group = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(stack(2), vec![vec![device; 2]; 2], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let before = weights(&group.to_layer_stack().unwrap());
    let (x, y) = batch(400, 5);
    let error = group.train_step(x, y, loss, 0.1).unwrap_err();
    match &error {
        ElasticError::Replica {
            replica: 0,
            source:
                PipeError::StageFailed {
                    stage: 0,
                    phase: "forward",
                    ..
                },
        } => {}
        other => panic!("unexpected error: {other}"),
    }
    assert!(error.to_string().contains("tripwire"), "{error}");
    for r in 0..2 {
        assert!(group.replica(r).gradients(0).is_none() && group.replica(r).gradients(1).is_none());
    }
    let after = weights(&group.to_layer_stack().unwrap());
    assert!(
        before
            .iter()
            .zip(&after)
            .all(|(a, b)| a.as_bytes() == b.as_bytes())
    );
    // The group re-forms and trains on: 4 samples, 1 + 1 per replica.
    let (x, y) = batch(401, 4);
    let report = group.train_step(x, y, loss, 0.1).unwrap();
    assert_eq!(report.shards, vec![2, 2]);
}

#[test]
fn a_group_resized_one_two_four_two_trains_as_a_fixed_group() {
    let device: Device<B> = Default::default();
    let model = stack(0);
    let _ = weights(&model);
    // The same global batch of 8 every step: through one pipeline (R = 1
    // throughout; burn-collective holds one group per process, and a fixed
    // R computes the same gradients, as the first test shows), and through a
    // group at R = 1, 2, 4, 2 for three steps each, Adam's state moving to
    // new replicas.
    let mut fixed: Pipeline<Types, _> = pipeline_config()
        .init(model.clone(), vec![device; 2], || AdamConfig::new().init())
        .unwrap();
    let mut elastic = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(model, vec![vec![device; 2]], || AdamConfig::new().init())
        .unwrap();
    for (phase, replicas) in [1, 2, 4, 2].into_iter().enumerate() {
        if phase > 0 {
            elastic.resize(vec![vec![device; 2]; replicas]).unwrap();
        }
        assert_eq!(elastic.num_replicas(), replicas);
        for step in 0..3 {
            let (x, y) = batch(500 + 10 * phase as u64 + step, 8);
            fixed
                .train_step(x.clone(), y.clone(), loss, StepOptions::new(), 1e-2)
                .unwrap();
            let report = elastic.train_step(x, y, loss, 1e-2).unwrap();
            assert_eq!(report.shards.len(), replicas);
            assert_eq!(report.shards.iter().sum::<usize>(), 8);
        }
    }
    let expected = weights(&fixed.to_layer_stack());
    for r in 0..2 {
        let actual = weights(&elastic.replica(r).to_layer_stack());
        for (a, b) in actual.iter().zip(&expected) {
            let a = a.to_vec::<f32>().unwrap();
            let b = b.to_vec::<f32>().unwrap();
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(
                worst <= 1e-4 * scale.max(1.0),
                "replica {r}: weights differ by {worst}"
            );
        }
    }
    // Bad sizes change nothing.
    assert!(matches!(
        elastic.resize(Vec::new()),
        Err(ElasticError::NoReplicas)
    ));
    assert!(matches!(
        elastic.resize(vec![vec![device; 3]]),
        Err(ElasticError::UnevenReplicas { .. })
    ));
    assert_eq!(elastic.num_replicas(), 2);
}

/// A group of `replicas` 2-stage SGD replicas of `stack` with `config`,
/// built once no other test's group holds the process's collective (its
/// short timeout also bounds that wait; the other tests run in parallel).
fn init_when_free(
    config: &ReplicaConfig,
    stack: LayerStack<Types>,
    replicas: usize,
) -> burn_elastic_dp::ReplicaGroup<
    Types,
    burn::optim::adaptor::OptimizerAdaptor<
        burn::optim::Sgd<Inner>,
        burn_freeze::TrainableUnits<Types>,
        B,
    >,
> {
    let device: Device<B> = Default::default();
    for _ in 0..1000 {
        match config.init(stack.clone(), vec![vec![device; 2]; replicas], || {
            SgdConfig::new().init()
        }) {
            Err(ElasticError::GroupBusy { .. }) => continue,
            other => return other.unwrap(),
        }
    }
    panic!("another test's group held the collective for 1000 waits");
}

#[test]
fn a_stalled_replica_is_left_behind_within_the_bound_and_the_group_goes_on() {
    // Replica 0 (shard of 3: micro-batches of 2 and 1) stalls 1.5 s on its
    // 2-sample micro-batch; replica 1 finishes and waits in the all-reduce.
    // At the 300 ms deadline the collective is reset, which releases
    // replica 1; replica 0, still computing after the grace (30 ms), is left
    // behind: the step returns long before the stall ends.
    let config = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .with_timeout_ms(300);
    let mut group = init_when_free(&config, stalling_stack(0, (2, 1500)), 2);
    let before = weights(&group.to_layer_stack().unwrap());
    let (x, y) = batch(600, 5);
    let started = std::time::Instant::now();
    let error = group.train_step(x, y, loss, 0.1).unwrap_err();
    let returned_after = started.elapsed();
    match &error {
        ElasticError::Timeout {
            missing,
            waited,
            lost,
        } => {
            assert_eq!(missing, &vec![0], "{error}");
            assert_eq!(lost, &vec![0], "{error}");
            assert_eq!(waited.as_millis(), 300);
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(
        returned_after < std::time::Duration::from_millis(1400),
        "the step waited {returned_after:?} for a stalled replica"
    );
    assert_eq!(group.num_replicas(), 1);
    let after = weights(&group.to_layer_stack().unwrap());
    assert!(
        before
            .iter()
            .zip(&after)
            .all(|(a, b)| a.as_bytes() == b.as_bytes())
    );
    // The survivor trains the next step (no 2-sample micro-batch).
    let (x, y) = batch(601, 6);
    group.train_step(x, y, loss, 0.1).unwrap();
}

#[test]
fn a_replica_left_behind_cannot_join_the_survivors_all_reduce() {
    // 13 samples over 3 replicas: shards 5, 4, 4, micro-batches 3 + 2, 2 + 2,
    // 2 + 2: replica 0 alone stalls (1 s, on its 3-sample micro-batch) and is
    // left behind. The survivors (now replicas 0 and 1) go on stepping while
    // it wakes, finishes its pass and calls the all-reduce as replica 0 of
    // the old formation: it must get an error, not join theirs. So the
    // survivors' weights equal a fresh 2-replica group's from the same
    // weights on the same batches, bit for bit.
    let config = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .with_timeout_ms(250);
    let mut group = init_when_free(&config, stalling_stack(0, (3, 1000)), 3);
    let started = std::time::Instant::now();
    let (x, y) = batch(800, 13);
    match group.train_step(x, y, loss, 0.1).unwrap_err() {
        ElasticError::Timeout { lost, .. } => assert_eq!(lost, vec![0]),
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(group.num_replicas(), 2);
    let survivors = group.to_layer_stack().unwrap();
    let mut steps = 0u64;
    // Until well after the stalled replica woke (at most 5000 steps).
    while started.elapsed() < std::time::Duration::from_millis(1800) && steps < 5000 {
        let (x, y) = batch(900 + steps, 4);
        group.train_step(x, y, loss, 0.05).unwrap();
        steps += 1;
    }
    let trained = weights(&group.to_layer_stack().unwrap());
    assert!(
        (0..2).all(|r| weights(&group.replica(r).to_layer_stack())
            .iter()
            .zip(&trained)
            .all(|(a, b)| a.as_bytes() == b.as_bytes())),
        "the survivors drifted apart"
    );
    drop(group);
    let mut fresh = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(survivors, vec![vec![Default::default(); 2]; 2], || {
            SgdConfig::new().init()
        })
        .unwrap();
    for step in 0..steps {
        let (x, y) = batch(900 + step, 4);
        fresh.train_step(x, y, loss, 0.05).unwrap();
    }
    let expected = weights(&fresh.to_layer_stack().unwrap());
    assert!(
        trained
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.as_bytes() == b.as_bytes()),
        "the survivors' {steps} steps differ from a fresh group's"
    );
}

#[test]
fn tests_run_on_the_selected_backend() {
    assert_eq!(B::name(&Default::default()), BACKEND_NAME);
}

#[test]
fn the_group_shrinks_to_the_survivors_and_redoes_the_step_losing_nothing() {
    let device: Device<B> = Default::default();
    // 9 samples over 2 replicas: shards of 5 and 4, micro-batches of 3 + 2
    // and 2 + 2; the tripwire on 3-sample micro-batches fails replica 0 only.
    let model = stack(3);
    let _ = weights(&model);
    let mut group = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(model.clone(), vec![vec![device; 2]; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    let (x, y) = batch(700, 9);
    let error = group
        .train_step(x.clone(), y.clone(), loss, 1e-2)
        .unwrap_err();
    assert!(
        matches!(error, ElasticError::Replica { replica: 0, .. }),
        "{error}"
    );
    group.remove_replica(0).unwrap();
    assert_eq!(group.num_replicas(), 1);
    // The same batch again, on the survivor (micro-batches of 5 and 4).
    group.train_step(x.clone(), y.clone(), loss, 1e-2).unwrap();
    let (x2, y2) = batch(701, 9);
    group
        .train_step(x2.clone(), y2.clone(), loss, 1e-2)
        .unwrap();
    // One pipeline that saw each batch once.
    let mut single: Pipeline<Types, _> = pipeline_config()
        .init(model, vec![device; 2], || AdamConfig::new().init())
        .unwrap();
    single
        .train_step(x, y, loss, StepOptions::new(), 1e-2)
        .unwrap();
    single
        .train_step(x2, y2, loss, StepOptions::new(), 1e-2)
        .unwrap();
    let expected = weights(&single.to_layer_stack());
    let actual = weights(&group.to_layer_stack().unwrap());
    assert!(
        expected
            .iter()
            .zip(&actual)
            .all(|(a, b)| a.as_bytes() == b.as_bytes()),
        "the survivor trained differently from one pipeline on the same batches"
    );
    assert!(matches!(
        group.remove_replica(0),
        Err(ElasticError::CannotRemove {
            replica: 0,
            replicas: 1
        })
    ));
}

#[test]
fn a_group_taken_apart_lets_a_group_of_another_size_form() {
    // `into_layer_stack` must finish every peer, or the next group of
    // another size fails to register (RegisterParamsMismatch).
    let device: Device<B> = Default::default();
    for replicas in [3, 2] {
        let mut group = ReplicaConfig::new()
            .with_pipeline(pipeline_config())
            .init(stack(0), vec![vec![device; 2]; replicas], || {
                SgdConfig::new().init()
            })
            .unwrap();
        let (x, y) = batch(replicas as u64, 12);
        group.forward_backward(x, y, loss).unwrap();
        let _ = group.into_layer_stack();
    }
}

/// A caller's own pipeline next to a group: `?` on its `PipeError` in a
/// function returning `ElasticError` compiles and keeps the pipeline's
/// error and message.
#[test]
fn a_pipelines_own_error_converts_with_the_question_mark() {
    fn stages_of_a_pipeline_on_one_device() -> Result<usize, ElasticError> {
        // Two stages (pipeline_config's balance) but one device.
        let pipeline = pipeline_config().init(stack(0), vec![Default::default()], || {
            SgdConfig::new().init()
        })?;
        Ok(pipeline.num_stages())
    }
    let error = stages_of_a_pipeline_on_one_device().unwrap_err();
    assert!(
        matches!(
            error,
            ElasticError::Pipeline(PipeError::DeviceCount {
                devices: 1,
                stages: 2
            })
        ),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "1 devices given for 2 stages: give exactly one device per stage"
    );
}
