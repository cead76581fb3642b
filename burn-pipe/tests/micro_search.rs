//! The micro-batch count chosen by measurement: the step model on synthetic
//! timing tables (no clock), the choice against the paper's fixed rule, and
//! the profile that builds a table on a real stack.

mod common;

use std::time::Duration;

use burn_pipe::balance::UnitState;
use burn_pipe::micro::{
    MicroBatchQuery, MicroBatchTimes, MicroSearchError, SharedCores, micro_batch_candidates,
    micro_batch_profile_sizes, predict_step, profile_micro_batches,
};
use burn_pipe::{
    PipelineConfig, Schedule, UnitProfile, choose_micro_batches, default_micro_batches,
};
use common::{user_batch, user_stack};

const SCHEDULES: [Schedule; 2] = [Schedule::GPipe, Schedule::OneFOneB];

/// Every unit takes `forward(n)` ms forward and twice that backward on `n`
/// samples, measured at 1, 2, 4, ... up to 64.
fn table(units: usize, forward: impl Fn(usize) -> f64) -> MicroBatchTimes {
    MicroBatchTimes::from_fn(&micro_batch_profile_sizes(64), units, |_, n| UnitProfile {
        forward: Duration::from_secs_f64(forward(n) * 1e-3),
        backward: Duration::from_secs_f64(2.0 * forward(n) * 1e-3),
    })
    .unwrap()
}

fn query<'a>(balance: &'a [usize], states: &'a [UnitState], batch: usize) -> MicroBatchQuery<'a> {
    MicroBatchQuery {
        balance,
        states,
        batch_per_replica: batch,
        schedule: Schedule::OneFOneB,
        shared: None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn equal_stages_take_m_plus_k_minus_1_stage_times() {
    // A unit costs 1 ms forward per sample, plus 0.5 ms per micro-batch.
    let times = table(8, |n| 0.5 + n as f64);
    let training = [UnitState::Training; 8];
    for schedule in SCHEDULES {
        for balance in [vec![8], vec![4, 4], vec![2, 2, 2, 2], vec![1; 8]] {
            let k = balance.len();
            let per_stage = 8 / k;
            for m in [1, 2, 4, 8, 16] {
                let q = MicroBatchQuery {
                    schedule,
                    ..query(&balance, &training, 32)
                };
                let size = 32 / m;
                let stage = per_stage as f64 * 3.0 * (0.5 + size as f64) * 1e-3;
                let predicted = predict_step(&times, &q, m).unwrap();
                let expected = (m + k - 1) as f64 * stage;
                assert!(
                    close(predicted, expected),
                    "{schedule:?} K={k} M={m}: {predicted} vs {expected}"
                );
            }
        }
    }
}

#[test]
fn steep_per_sample_time_below_8_samples_chooses_fewer_micro_batches_than_the_paper() {
    // Per-sample time rises steeply below 8 samples: a micro-batch of fewer
    // costs as much as one of 8.
    let times = table(4, |n| n.max(8) as f64);
    let training = [UnitState::Training; 4];
    for schedule in SCHEDULES {
        let q = MicroBatchQuery {
            schedule,
            ..query(&[1, 1, 1, 1], &training, 32)
        };
        let choice = choose_micro_batches(&times, &q).unwrap();
        assert_eq!(choice.micro_batches, 4, "{schedule:?}");
        assert_eq!(choice.paper_micro_batches, default_micro_batches(4));
        assert_ne!(choice.micro_batches, choice.paper_micro_batches);
        // 7 stage times of 8 samples against 19 of 8 (2 samples each).
        assert!(close(choice.predicted_step_s, 7.0 * 24.0e-3));
        assert!(close(choice.predicted(16).unwrap(), 19.0 * 24.0e-3));
        let ms: Vec<usize> = choice.candidates.iter().map(|c| c.micro_batches).collect();
        assert_eq!(ms, micro_batch_candidates(4, 32));
        assert!(
            choice
                .candidates
                .iter()
                .all(|c| c.predicted_step_s >= choice.predicted_step_s)
        );
        assert_eq!(choice.candidates[3].micro_batch, 8);
    }
}

#[test]
fn time_proportional_to_samples_fills_the_pipeline_as_far_as_the_search_goes() {
    // No per-micro-batch overhead: more micro-batches only shrink the bubble.
    let times = table(4, |n| n as f64);
    let training = [UnitState::Training; 4];
    // 48 samples: 24 micro-batches (6K, the top of the search) of 2.
    let choice = choose_micro_batches(&times, &query(&[1, 1, 1, 1], &training, 48)).unwrap();
    assert_eq!(choice.micro_batches, 24);
    // One stage has no bubble to fill: every M takes the same time, and the
    // tie goes to the fewest (largest) micro-batches.
    let choice = choose_micro_batches(&times, &query(&[4], &training, 64)).unwrap();
    assert_eq!(choice.micro_batches, 1);
    assert!(
        choice
            .candidates
            .iter()
            .all(|c| close(c.predicted_step_s, choice.predicted_step_s))
    );
}

#[test]
fn a_fixed_cost_per_micro_batch_balances_bubble_against_overhead() {
    // 1 ms per sample plus 2 ms per micro-batch, two stages, 32 samples:
    // (M + 1) (2 + 32 / M) x 3 is least at M = 4.
    let times = table(2, |n| 2.0 + n as f64);
    let training = [UnitState::Training; 2];
    let choice = choose_micro_batches(&times, &query(&[1, 1], &training, 32)).unwrap();
    let expected = (1..=16usize)
        .min_by(|&a, &b| {
            let step = |m: usize| predict_step(&times, &query(&[1, 1], &training, 32), m).unwrap();
            step(a).total_cmp(&step(b))
        })
        .unwrap();
    assert_eq!(choice.micro_batches, expected);
    assert_eq!(choice.micro_batches, 4);
    assert_ne!(choice.micro_batches, default_micro_batches(2));
}

#[test]
fn on_shared_cores_the_work_bounds_the_step_and_fewer_micro_batches_win() {
    // A fixed cost of 1 ms per micro-batch and unit, plus 0.1 ms a sample.
    let times = table(4, |n| 1.0 + 0.1 * n as f64);
    let training = [UnitState::Training; 4];
    let own = query(&[1, 1, 1, 1], &training, 32);
    let on_own_devices = choose_micro_batches(&times, &own).unwrap();
    assert!(on_own_devices.micro_batches > 1, "{on_own_devices:?}");
    // The same 4 stages as threads of one core: every pass in turn, so
    // the step is the whole work, least with one micro-batch.
    let one_core = SharedCores {
        cores: 1,
        replicas: 1,
    };
    let shared = MicroBatchQuery {
        shared: Some(one_core),
        ..own
    };
    for m in [1, 2, 4, 8] {
        let work = 4.0 * m as f64 * 3.0 * (1.0 + 0.1 * (32 / m) as f64) * 1e-3;
        let predicted = predict_step(&times, &shared, m).unwrap();
        assert!(
            close(predicted, work),
            "M = {m}: {predicted} against {work}"
        );
        assert!(predicted >= predict_step(&times, &own, m).unwrap());
    }
    assert_eq!(
        choose_micro_batches(&times, &shared).unwrap().micro_batches,
        1
    );
    // Two replicas on two cores: the same bound.
    let two = SharedCores {
        cores: 2,
        replicas: 2,
    };
    let both = MicroBatchQuery {
        shared: Some(two),
        ..own
    };
    assert!(close(
        predict_step(&times, &both, 4).unwrap(),
        predict_step(&times, &shared, 4).unwrap()
    ));
    // Many cores: the pipeline's own makespan holds again.
    let many = MicroBatchQuery {
        shared: Some(SharedCores {
            cores: 64,
            replicas: 1,
        }),
        ..own
    };
    assert_eq!(
        choose_micro_batches(&times, &many).unwrap().micro_batches,
        on_own_devices.micro_batches
    );
}

#[test]
fn frozen_units_run_forward_only_and_cached_units_not_at_all() {
    let times = table(4, |n| n as f64);
    let balance = [2, 2];
    let (f, b) = (2.0 * 4.0e-3, 2.0 * 8.0e-3); // a stage of 2 units, 4 samples
    let m = 4;
    let at = |states: &[UnitState]| predict_step(&times, &query(&balance, states, 16), m).unwrap();
    // Stage 0 cached: stage 1 runs its micro-batches back to back.
    let cached = [0, 1, 2, 3].map(|u| UnitState::of(u, 2, 2));
    assert!(close(at(&cached), m as f64 * (f + b)));
    // Stage 0 frozen: stage 1 waits for its first forward pass only.
    let frozen = [0, 1, 2, 3].map(|u| UnitState::of(u, 2, 0));
    assert!(close(at(&frozen), f + m as f64 * (f + b)));
    // Everything training: (M + K - 1) stage times.
    let training = [UnitState::Training; 4];
    assert!(close(at(&training), (m + 1) as f64 * (f + b)));
}

#[test]
fn uneven_micro_batches_each_take_their_own_time() {
    let times = table(1, |n| 1.0 + n as f64);
    let training = [UnitState::Training];
    // 10 samples in 4: 3, 3, 2, 2 on one stage.
    let predicted = predict_step(&times, &query(&[1], &training, 10), 4).unwrap();
    let expected = 3.0 * (4.0 + 4.0 + 3.0 + 3.0) * 1e-3;
    assert!(close(predicted, expected), "{predicted} vs {expected}");
}

#[test]
fn times_between_measured_sizes_are_interpolated() {
    let times = MicroBatchTimes::from_fn(&[2, 4, 8], 1, |_, n| UnitProfile {
        forward: Duration::from_millis(n as u64 * n as u64),
        backward: Duration::from_millis(n as u64),
    })
    .unwrap();
    let f = |n| times.unit_seconds(0, n).0;
    assert!(close(f(4), 0.016));
    assert!(close(f(6), (0.016 + 0.064) / 2.0));
    assert!(
        close(f(1), f(2)),
        "below the smallest size: the smallest's time"
    );
    assert!(
        close(f(16), 2.0 * 0.064),
        "above the largest: its time per sample"
    );
    assert_eq!(times.sizes(), &[2, 4, 8]);
}

#[test]
fn bad_tables_and_queries_are_errors() {
    let unit = |_, _| UnitProfile {
        forward: Duration::from_millis(1),
        backward: Duration::from_millis(1),
    };
    assert_eq!(
        MicroBatchTimes::from_fn(&[], 2, unit),
        Err(MicroSearchError::NoSizes)
    );
    for sizes in [vec![0, 1], vec![2, 2], vec![4, 2]] {
        assert!(matches!(
            MicroBatchTimes::from_fn(&sizes, 2, unit),
            Err(MicroSearchError::BadSizes { .. })
        ));
    }
    assert!(matches!(
        MicroBatchTimes::from_fn(&[1], 0, unit),
        Err(MicroSearchError::UnitCount { .. })
    ));
    let one = vec![unit(0, 0)];
    assert!(matches!(
        MicroBatchTimes::new(vec![1, 2], vec![one.clone(), vec![one[0]; 2]]),
        Err(MicroSearchError::UnitCount {
            size: 2,
            units: 2,
            expected: 1
        })
    ));
    assert!(matches!(
        MicroBatchTimes::new(vec![1, 2], vec![one]),
        Err(MicroSearchError::ProfileCount {
            profiles: 1,
            sizes: 2
        })
    ));

    let times = MicroBatchTimes::from_fn(&[1, 2], 2, unit).unwrap();
    let training = [UnitState::Training; 2];
    let choose = |balance: &[usize], states: &[UnitState], batch| {
        choose_micro_batches(&times, &query(balance, states, batch))
    };
    assert_eq!(
        choose(&[1, 1], &training, 0),
        Err(MicroSearchError::NoSamples)
    );
    for balance in [&[][..], &[2, 0], &[1, 2], &[1]] {
        assert!(matches!(
            choose(balance, &training, 4),
            Err(MicroSearchError::BadBalance { .. })
        ));
    }
    assert!(matches!(
        choose(&[1, 1], &training[..1], 4),
        Err(MicroSearchError::StateCount {
            states: 1,
            units: 2
        })
    ));
    for m in [0, 5] {
        assert_eq!(
            predict_step(&times, &query(&[1, 1], &training, 4), m),
            Err(MicroSearchError::MicroBatchCount {
                micro_batches: m,
                batch: 4
            })
        );
    }
    // Errors read as one line naming the accepted range.
    let message = MicroSearchError::MicroBatchCount {
        micro_batches: 5,
        batch: 4,
    }
    .to_string();
    assert!(message.contains("1 to 4"), "{message}");
}

#[test]
fn one_sample_per_replica_has_one_candidate() {
    let times = table(2, |n| n as f64);
    let training = [UnitState::Training; 2];
    let choice = choose_micro_batches(&times, &query(&[1, 1], &training, 1)).unwrap();
    assert_eq!(choice.micro_batches, 1);
    assert_eq!(choice.candidates.len(), 1);
}

#[test]
fn the_profile_times_every_unit_at_every_size_of_the_real_stack() {
    let stack = user_stack(6, 16, 3, 3);
    let (x, _) = user_batch(7, 8, 6, 3);
    let device = Default::default();
    let sizes = micro_batch_profile_sizes(8);
    let times = profile_micro_batches(&stack, x.clone(), &device, &sizes, 1).unwrap();
    assert_eq!(times.units(), stack.num_units());
    assert_eq!(times.sizes(), &[1, 2, 4, 8]);
    // The table answers a query for the stack as a pipeline.
    let pipeline = PipelineConfig::new()
        .init(stack.clone(), vec![device; 2], || {
            burn::optim::SgdConfig::new().init()
        })
        .unwrap();
    let states = vec![UnitState::Training; stack.num_units()];
    let choice = choose_micro_batches(&times, &query(&pipeline.balance(), &states, 8)).unwrap();
    assert!((1..=8).contains(&choice.micro_batches));
    assert!(choice.predicted_step_s.is_finite() && choice.predicted_step_s >= 0.0);

    assert_eq!(
        profile_micro_batches(&stack, x.clone(), &device, &[1, 9], 1).unwrap_err(),
        MicroSearchError::SizeTooLarge { size: 9, batch: 8 }
    );
    assert!(matches!(
        profile_micro_batches(&stack, x, &device, &[4, 2], 1),
        Err(MicroSearchError::BadSizes { .. })
    ));
}

#[test]
fn a_bound_on_the_micro_batch_size_picks_the_fastest_within_it() {
    // Steep below 8 samples: unbounded, 4 micro-batches of 8 win at K = 4.
    let times = table(4, |n| n.max(8) as f64);
    let training = [UnitState::Training; 4];
    let q = query(&[1, 1, 1, 1], &training, 32);
    let bounded =
        burn_pipe::micro::choose_micro_batches_where(&times, &q, |c| c.micro_batch <= 4).unwrap();
    let fastest_within = bounded
        .candidates
        .iter()
        .filter(|c| c.micro_batch <= 4)
        .min_by(|a, b| a.predicted_step_s.total_cmp(&b.predicted_step_s))
        .unwrap();
    assert_eq!(bounded.micro_batches, fastest_within.micro_batches);
    assert_eq!(bounded.micro_batches, 8);
    assert_eq!(
        bounded.candidates,
        choose_micro_batches(&times, &q).unwrap().candidates
    );
    assert_eq!(
        burn_pipe::micro::choose_micro_batches_where(&times, &q, |_| false),
        Err(MicroSearchError::NoCandidate { searched: 24 })
    );
}
