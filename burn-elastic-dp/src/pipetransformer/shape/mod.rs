//! The shape rule, AutoPipe's and AutoDP's decision, owned by one type ([`ShapeRule`]): the
//! starting pipeline, then after each move of the front, stages, balance, replicas, and the
//! micro-batch count of every shape.

mod form;
mod memory;
mod reshape;
mod rule;

pub use form::PipelineShape;
pub use memory::{MemoryFit, NoFit, StageOver, StartError, stage_counts};
pub use rule::{MicroBatchSource, MicroBatches, ShapeRule, ShapeSettings};

#[cfg(test)]
mod tests {
    use super::form::balanced_shape;
    use super::reshape::{Reshaping, reshape};
    use burn_pipe::UnitCosts;
    use burn_pipe::balance::largest_stage;

    fn rules(pipe: bool, dp: bool, cache: bool, initial_largest: f64) -> Reshaping {
        Reshaping {
            pipe,
            dp,
            cache,
            devices: 8,
            initial_largest,
            memory: None,
        }
    }

    #[test]
    fn the_pipeline_shortens_and_replicas_grow_as_the_front_moves() {
        let costs = UnitCosts::from_params(&[1; 16], 1.0 / 3.0);
        let (mut shape, largest) = balanced_shape(&costs, 8, 1);
        assert_eq!(shape.balance, vec![2; 8]);
        let mut seen = Vec::new();
        for front in [0, 8, 12, 14, 15] {
            shape = reshape(&costs, front, &shape, &rules(true, true, true, largest));
            assert_eq!(shape.balance.iter().sum::<usize>(), 16);
            assert!(largest_stage(&costs.at(front, true), &shape.balance) <= largest);
            seen.push((shape.stages(), shape.replicas));
        }
        assert_eq!(seen, vec![(8, 1), (4, 2), (2, 4), (1, 8), (1, 8)]);
    }

    #[test]
    fn frozen_units_sit_on_stage_zero_when_cached() {
        let costs = UnitCosts::from_params(&[3, 1, 1, 1, 1, 1, 1, 3], 0.5);
        let (shape, largest) = balanced_shape(&costs, 4, 1);
        let next = reshape(&costs, 3, &shape, &rules(true, true, true, largest));
        let mut start = 0;
        for (stage, &n) in next.balance.iter().enumerate() {
            if stage > 0 {
                assert!(start >= 3, "a frozen unit on stage {stage}");
            }
            start += n;
        }
    }

    #[test]
    fn a_part_that_is_off_keeps_its_value() {
        let costs = UnitCosts::from_params(&[1; 8], 1.0 / 3.0);
        let (shape, largest) = balanced_shape(&costs, 4, 1);
        let no_pipe = reshape(&costs, 6, &shape, &rules(false, true, true, largest));
        assert_eq!(no_pipe.balance, shape.balance);
        assert_eq!(no_pipe.replicas, 2); // 8 devices, 4 stages
        let no_dp = reshape(&costs, 6, &shape, &rules(true, false, true, largest));
        assert_eq!(no_dp.replicas, 1);
        assert!(no_dp.stages() < 4);
        // Without the cache frozen units still cost their forward pass.
        let uncached = reshape(&costs, 4, &shape, &rules(true, true, false, largest));
        let cached = reshape(&costs, 4, &shape, &rules(true, true, true, largest));
        assert!(uncached.stages() >= cached.stages());
    }

    #[test]
    fn every_unit_frozen_keeps_the_shape() {
        let costs = UnitCosts::from_params(&[1; 4], 1.0 / 3.0);
        let (shape, largest) = balanced_shape(&costs, 2, 1);
        let next = reshape(&costs, 4, &shape, &rules(true, false, true, largest));
        assert_eq!(next, shape);
    }
}
