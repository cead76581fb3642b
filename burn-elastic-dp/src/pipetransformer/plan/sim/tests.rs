//! The pipeline simulation's tests.

use super::*;
use crate::pipetransformer::plan::config::ReduceTiming;
use crate::pipetransformer::plan::step::step_time;
use burn_pipe::schedule::stage_ops;

fn uniform(k: usize, forward: f64, backward: f64) -> Vec<StageWork> {
    (0..k)
        .map(|device| StageWork {
            forward,
            backward,
            device,
        })
        .collect()
}

/// A stage's forward and backward work on `device`.
fn stage(forward: f64, backward: f64, device: usize) -> StageWork {
    StageWork {
        forward,
        backward,
        device,
    }
}

#[test]
fn uniform_bubble_is_k_minus_1_over_m_plus_k_minus_1() {
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        for k in 1..=8 {
            for m in [1, 2, 3, 4, 7, 8, 16, 32] {
                for (f, b) in [(1.0, 2.0), (0.3, 0.3), (2.0, 1.0)] {
                    let trace = PipelineSim::new(schedule, m, uniform(k, f, b))
                        .run()
                        .unwrap();
                    let expected = (k - 1) as f64 / (m + k - 1) as f64;
                    assert!(
                        (trace.bubble_fraction() - expected).abs() < 1e-9,
                        "{schedule:?} K={k} M={m} f={f} b={b}: {} vs {expected}",
                        trace.bubble_fraction()
                    );
                    let makespan = (m + k - 1) as f64 * (f + b);
                    assert!((trace.makespan - makespan).abs() < 1e-9 * makespan);
                }
            }
        }
    }
}

#[test]
fn passes_run_in_stage_ops_order_and_respect_messages() {
    let stages = vec![stage(1.0, 2.5, 0), stage(0.5, 1.0, 1), stage(2.0, 3.0, 2)];
    let mut sim = PipelineSim::new(Schedule::OneFOneB, 5, stages);
    sim.sends = vec![0.25, 0.125];
    let trace = sim.run().unwrap();
    for s in 0..3 {
        let order: Vec<Op> = trace.spans[s].iter().map(|span| span.op).collect();
        assert_eq!(order, stage_ops(Schedule::OneFOneB, s, 3, 5));
        for pair in trace.spans[s].windows(2) {
            assert!(pair[1].start >= pair[0].end - 1e-12);
        }
    }
    let end = |s: usize, op: Op| trace.spans[s].iter().find(|x| x.op == op).unwrap().end;
    let start = |s: usize, op: Op| trace.spans[s].iter().find(|x| x.op == op).unwrap().start;
    for n in 0..5 {
        assert!(start(1, Op::Forward(n)) >= end(0, Op::Forward(n)) + 0.25 - 1e-12);
        assert!(start(2, Op::Forward(n)) >= end(1, Op::Forward(n)) + 0.125 - 1e-12);
        assert!(start(1, Op::Backward(n)) >= end(2, Op::Backward(n)) + 0.125 - 1e-12);
        assert!(start(0, Op::Backward(n)) >= end(1, Op::Backward(n)) + 0.25 - 1e-12);
    }
    // The slowest stage bounds the step from below.
    assert!(trace.makespan >= 5.0 * 5.0);
}

#[test]
fn stages_sharing_one_device_share_its_throughput() {
    // Two stages on one device of capacity 1: no overlap is possible, so
    // the step takes the sum of all the work.
    let shared = vec![stage(1.0, 2.0, 0), stage(1.0, 2.0, 0)];
    let trace = PipelineSim::new(Schedule::GPipe, 8, shared.clone())
        .run()
        .unwrap();
    assert!((trace.makespan - 2.0 * 8.0 * 3.0).abs() < 1e-9);
    // Capacity 2: as fast as two devices.
    let mut sim = PipelineSim::new(Schedule::GPipe, 8, shared);
    sim.device_capacity = vec![2.0];
    let trace = sim.run().unwrap();
    assert!((trace.makespan - 9.0 * 3.0).abs() < 1e-9);
}

/// Two stages on one device of capacity 2 (a 2-core CPU), each pass
/// taking `p` cores alone.
fn two_on_one_cpu(p: f64, m: usize) -> PipelineTrace {
    let shared = vec![stage(1.0, 2.0, 0); 2];
    let mut sim = PipelineSim::new(Schedule::GPipe, m, shared);
    sim.device_capacity = vec![2.0];
    sim.parallelism = vec![p, p];
    sim.run().unwrap()
}

#[test]
fn passes_of_one_core_each_run_at_full_speed_together_on_two() {
    // p = 1, C = 2: the two stages overlap as if on two devices.
    let trace = two_on_one_cpu(1.0, 8);
    assert!((trace.makespan - 9.0 * 3.0).abs() < 1e-9);
}

#[test]
fn passes_taking_the_whole_cpu_alone_add_up() {
    // p = 2, C = 2: one pass alone already takes both cores, so two at
    // once each run at half speed: the step is the sum of all the work.
    let trace = two_on_one_cpu(2.0, 8);
    assert!((trace.makespan - 2.0 * 8.0 * 3.0).abs() < 1e-9);
}

#[test]
fn partial_parallelism_lies_between() {
    // p = 1.5: two at once get 1 core each, 2/3 of their speed alone.
    let (one, two, mid) = (
        two_on_one_cpu(1.0, 8),
        two_on_one_cpu(2.0, 8),
        two_on_one_cpu(1.5, 8),
    );
    assert!(one.makespan < mid.makespan && mid.makespan < two.makespan);
    // M = 1: nothing overlaps, so parallelism changes nothing.
    assert!((two_on_one_cpu(1.5, 1).makespan - 6.0).abs() < 1e-9);
}

#[test]
fn shares_respect_each_cap_and_the_capacity() {
    assert_eq!(shares(&[1.0, 1.0, 1.0], 2.0), vec![2.0 / 3.0; 3]);
    assert_eq!(shares(&[0.25, 1.0, 2.0], 2.0), vec![0.25, 0.875, 0.875]);
    assert_eq!(shares(&[0.25, 0.5], 2.0), vec![0.25, 0.5]);
    assert_eq!(shares(&[], 2.0), Vec::<f64>::new());
    for caps in [vec![0.3, 1.7, 0.9, 2.0], vec![1.2; 5], vec![0.1, 0.2]] {
        let given = shares(&caps, 2.0);
        let total: f64 = given.iter().sum();
        assert!(given.iter().zip(&caps).all(|(g, c)| *g <= c + 1e-12));
        assert!((total - caps.iter().sum::<f64>().min(2.0)).abs() < 1e-12);
    }
}

#[test]
fn a_capped_pass_leaves_the_rest_to_the_other() {
    // Stage 0's forward takes 0.5 core, stage 1's 2 cores; together on
    // 2 cores stage 1 gets 1.5 of its 2: 3/4 of its speed alone.
    let stages = vec![stage(10.0, 0.0, 0), stage(1.0, 0.0, 0)];
    let mut sim = PipelineSim::new(Schedule::GPipe, 2, stages);
    sim.device_capacity = vec![2.0];
    sim.parallelism = vec![0.5, 2.0];
    let trace = sim.run().unwrap();
    // Stage 1's first forward (from 10 to 10 + 1 / 0.75) overlaps stage
    // 0's second; the second (from 20) runs alone: 1 s.
    let spans = &trace.spans[1];
    assert!((spans[0].end - (10.0 + 1.0 / 0.75)).abs() < 1e-9);
    assert!((trace.makespan - 21.0).abs() < 1e-9);
}

#[test]
fn pass_overhead_adds_to_every_pass_on_the_critical_path() {
    let mut sim = PipelineSim::new(Schedule::GPipe, 4, uniform(3, 1.0, 2.0));
    sim.pass_overhead = 0.1;
    let trace = sim.run().unwrap();
    let expected = (4 + 3 - 1) as f64 * (1.0 + 2.0 + 0.2);
    assert!((trace.makespan - expected).abs() < 1e-9);
}

#[test]
fn reduce_after_pass_is_exposed_per_stage_overlaps() {
    let stages = vec![stage(1.0, 2.0, 0), stage(1.0, 2.0, 1)];
    let trace = PipelineSim::new(Schedule::OneFOneB, 4, stages)
        .run()
        .unwrap();
    let after = step_time(&trace, &[1.0, 1.0], ReduceTiming::AfterPass);
    assert!((after.all_reduce - 2.0).abs() < 1e-12);
    // The last stage finishes before the first: its reduce hides.
    let per_stage = step_time(&trace, &[1.0, 1.0], ReduceTiming::PerStage);
    assert!(trace.stage_end(1) < trace.stage_end(0));
    assert!((per_stage.all_reduce - 1.0).abs() < 1e-12);
    assert!((after.compute + after.bubble - trace.makespan).abs() < 1e-12);
}

#[test]
fn a_frozen_stage_has_no_backward_pass() {
    let stages = vec![stage(1.0, 0.0, 0), stage(1.0, 2.0, 1)];
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        let mut sim = PipelineSim::new(schedule, 4, stages.clone());
        sim.pass_overhead = 0.5;
        let trace = sim.run().unwrap();
        assert_eq!(trace.spans[0].len(), 4, "{schedule:?}");
        assert!(
            trace.spans[0]
                .iter()
                .all(|s| matches!(s.op, Op::Forward(_)))
        );
        // Stage 0 streams its forwards back to back, never waiting for
        // a gradient.
        assert!(
            (trace.stage_end(0) - 4.0 * 1.5).abs() < 1e-9,
            "{schedule:?}"
        );
    }
}

#[test]
fn bad_inputs_are_named() {
    let err = PipelineSim::new(Schedule::GPipe, 0, uniform(2, 1.0, 1.0))
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("micro-batches"));
    let mut sim = PipelineSim::new(Schedule::GPipe, 2, uniform(3, 1.0, 1.0));
    sim.sends = vec![1.0];
    assert!(sim.run().unwrap_err().to_string().contains("per boundary"));
    let err = PipelineSim::new(Schedule::GPipe, 2, uniform(2, -1.0, 1.0))
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("stage 0"));
    let mut sim = PipelineSim::new(Schedule::GPipe, 2, uniform(2, 1.0, 1.0));
    sim.parallelism = vec![1.0];
    assert!(sim.run().unwrap_err().to_string().contains("per stage"));
    sim.parallelism = vec![1.0, 0.0];
    assert!(sim.run().unwrap_err().to_string().contains("> 0"));
}
