//! Splitting a mini-batch into micro-batches.

use crate::runtime::error::PipeError;

/// Sizes of `micro_batches` consecutive micro-batches of a batch of `batch`
/// samples: as equal as possible, the larger ones first, so the last
/// micro-batch is the smaller one when the batch does not divide evenly.
///
/// ```
/// assert_eq!(burn_pipe::micro::micro_batch_sizes(10, 4).unwrap(), vec![3, 3, 2, 2]);
/// assert!(burn_pipe::micro::micro_batch_sizes(3, 4).is_err());
/// ```
pub fn micro_batch_sizes(batch: usize, micro_batches: usize) -> Result<Vec<usize>, PipeError> {
    if micro_batches == 0 {
        return Err(PipeError::NoMicroBatches);
    }
    if batch < micro_batches {
        return Err(PipeError::BatchTooSmall {
            batch,
            micro_batches,
        });
    }
    let (size, rest) = (batch / micro_batches, batch % micro_batches);
    Ok((0..micro_batches)
        .map(|i| size + usize::from(i < rest))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_cover_the_batch_in_order() {
        for batch in 1..40 {
            for m in 1..=batch {
                let sizes = micro_batch_sizes(batch, m).unwrap();
                assert_eq!(sizes.len(), m);
                assert_eq!(sizes.iter().sum::<usize>(), batch);
                assert!(sizes.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
            }
        }
    }

    #[test]
    fn bad_counts_are_errors() {
        assert!(matches!(
            micro_batch_sizes(4, 0),
            Err(PipeError::NoMicroBatches)
        ));
        assert!(matches!(
            micro_batch_sizes(2, 3),
            Err(PipeError::BatchTooSmall {
                batch: 2,
                micro_batches: 3
            })
        ));
    }
}
