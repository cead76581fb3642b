//! The rows of a table gradient that a step touched (a word embedding's: one row per token seen
//! in the batch), packed side by side for the exchange and put back after: what lets the
//! exchange send only those rows and still give the bits of the whole table's sum.
//!
//! A row no rank touched holds +0.0 everywhere on every rank, and the sum of +0.0s is +0.0: it
//! is its own sum, so it needs no exchange. A row is *touched* when any of its values has a bit
//! set (so -0.0 counts as touched: its sum with another rank's +0.0 is +0.0, not -0.0).

/// Whether each of `values`' rows of `width` values (the last one
/// incomplete, if any, counts as a row) has a bit set, 1 or 0.
pub(crate) fn touched(values: &[f32], width: usize) -> Vec<u8> {
    values
        .chunks(width.max(1))
        .map(|row| u8::from(row.iter().fold(0u32, |bits, v| bits | v.to_bits()) != 0))
        .collect()
}

/// Rows marked in `marks` (one mark per row of `width`, 0 for not
/// marked), one after another. Rows past the marks are not taken.
pub(crate) fn pack(values: &[f32], width: usize, marks: &[u8]) -> Vec<f32> {
    let rows = marks.iter().filter(|&&m| m != 0).count();
    let mut packed = Vec::with_capacity(rows * width);
    for (row, _) in values
        .chunks(width.max(1))
        .zip(marks)
        .filter(|(_, m)| **m != 0)
    {
        packed.extend_from_slice(row);
    }
    packed
}

/// Writes `packed` (what [`pack`] made of `values` with the same `width`
/// and `marks`, after it was summed) back into the marked rows of `values`.
pub(crate) fn unpack(values: &mut [f32], width: usize, marks: &[u8], packed: &[f32]) {
    let mut sums = packed;
    for (row, _) in values
        .chunks_mut(width.max(1))
        .zip(marks)
        .filter(|(_, m)| **m != 0)
    {
        let (sum, rest) = sums.split_at(row.len().min(sums.len()));
        row[..sum.len()].copy_from_slice(sum);
        sums = rest;
    }
}

/// Whether sending only the `marked` rows of a table of `rows` pays: when
/// at most half are (above that, the marking's extra copies cost more than
/// the values they save).
pub(crate) fn worth_packing(marked: usize, rows: usize) -> bool {
    2 * marked <= rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's table summed as the exchange sums it (the union of the
    /// ranks' touched rows packed, packs added element by element in rank
    /// order, put back) against the whole tables added element by element.
    fn sparse_and_dense(ranks: &[Vec<f32>], width: usize) -> (Vec<f32>, Vec<f32>) {
        let mut marks = vec![0u8; ranks[0].len().div_ceil(width)];
        for table in ranks {
            for (mark, t) in marks.iter_mut().zip(touched(table, width)) {
                *mark = (*mark).max(t);
            }
        }
        let packs: Vec<Vec<f32>> = ranks.iter().map(|t| pack(t, width, &marks)).collect();
        let mut sum = packs[0].clone();
        for pack in &packs[1..] {
            sum.iter_mut().zip(pack).for_each(|(s, v)| *s += v);
        }
        let mut sparse = ranks[0].clone();
        unpack(&mut sparse, width, &marks, &sum);
        let mut dense = ranks[0].clone();
        for table in &ranks[1..] {
            dense.iter_mut().zip(table).for_each(|(s, v)| *s += v);
        }
        (sparse, dense)
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn rows_with_a_bit_set_are_touched() {
        assert_eq!(
            touched(&[0.0, 0.0, 1.0, 0.0, -0.0, 0.0, 0.0], 2),
            vec![0, 1, 1, 0]
        );
        assert_eq!(touched(&[], 4), Vec::<u8>::new());
    }

    #[test]
    fn the_packed_sum_has_the_bits_of_the_whole_sum() {
        // Two ranks over a table of 6 rows of 3: rank 0 touched rows 1 and
        // 4, rank 1 rows 4 and 5 (with a -0.0 in row 5 and in row 2 of rank
        // 0, which no other value of the row sets), rows 0 and 3 untouched.
        let width = 3;
        let mut a = vec![0.0f32; 18];
        let mut b = vec![0.0f32; 18];
        a[3..6].copy_from_slice(&[0.5, -1.25, 3.0]);
        a[6] = -0.0;
        a[12..15].copy_from_slice(&[1e-8, 2.0, -0.0]);
        b[12..15].copy_from_slice(&[1.0, -2.0, 0.0]);
        b[15..18].copy_from_slice(&[-0.0, 7.5, 0.1]);
        let (sparse, dense) = sparse_and_dense(&[a.clone(), b.clone()], width);
        assert_eq!(bits(&sparse), bits(&dense));
        // Only the touched rows were packed: 4 of 6.
        let marks: Vec<u8> = touched(&a, width)
            .into_iter()
            .zip(touched(&b, width))
            .map(|(x, y)| x.max(y))
            .collect();
        assert_eq!(marks, vec![0, 1, 1, 0, 1, 1]);
        assert_eq!(pack(&a, width, &marks).len(), 4 * width);
        // Three ranks, rows of uneven values: the same bits as adding the
        // whole tables in the same order.
        let c: Vec<f32> = (0..18)
            .map(|i| if i % 7 == 0 { 0.3 * i as f32 } else { 0.0 })
            .collect();
        let (sparse, dense) = sparse_and_dense(&[a, b, c], width);
        assert_eq!(bits(&sparse), bits(&dense));
    }

    #[test]
    fn unpack_puts_the_rows_back_where_pack_took_them() {
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let marks = [1, 0, 1, 0];
        let packed = pack(&values, 3, &marks);
        assert_eq!(packed, vec![0.0, 1.0, 2.0, 6.0, 7.0, 8.0]);
        let mut back = vec![-1.0; 12];
        unpack(&mut back, 3, &marks, &packed);
        assert_eq!(
            back,
            vec![
                0.0, 1.0, 2.0, -1.0, -1.0, -1.0, 6.0, 7.0, 8.0, -1.0, -1.0, -1.0
            ]
        );
    }

    #[test]
    fn packing_pays_up_to_half_the_rows() {
        assert!(worth_packing(0, 10));
        assert!(worth_packing(5, 10));
        assert!(!worth_packing(6, 10));
    }
}
