//! Quantiles of sorted samples, in the two definitions Fleetdeck uses, each named for what it computes.
//!
//! - [`nearest_rank`]: a value that was observed, the one at rank ⌈q·n⌉. The canary's TTFT p95 and
//!   fleet-sim's replay report use it, so what the what-if predicts and what the canary judges are the
//!   same figure by construction.
//! - [`interpolated`]: linear interpolation between the two closest ranks (rank q·(n−1), counted from 0),
//!   smooth in q: fleet-sim's bench report and the history's bootstrap intervals use it.
//!
//! Both take values sorted ascending (`sort_by(f64::total_cmp)`) and answer `None` for no values;
//! neither checks the order, which costs a pass over the values.

/// The value at rank ⌈`q`·n⌉ (1-based, clamped to 1..=n) of ascending `sorted` values; `None` when empty.
pub fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    // `as usize` saturates: a negative or NaN rank becomes 0, then rank 1.
    let rank = (q * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// The `q` quantile (`q` clamped to 0..=1) of ascending `sorted` values by linear interpolation between
/// the closest ranks; `None` when empty.
pub fn interpolated(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = q.clamp(0.0, 1.0) * last as f64;
    let (low, high) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64))
}

/// A 95 % confidence interval of the `q` quantile of the distribution the ascending `sorted` values were
/// drawn from, without assuming its shape: the values at the ranks the count of samples below the true
/// quantile (binomial, n·q on average) reaches with 95 % probability, by the normal approximation
/// (n·q·(1−q) should be at least 5 or so). `None` when empty.
///
/// It says how far a measured p95 can move by chance. With 300 requests the p95 is the 285th value, and
/// the interval runs from the 277th to the 293rd: where a few percent of requests miss the cache
/// and take several times longer, that spans both kinds of request, and no prediction of the p95 can be
/// judged finer than that.
pub fn confidence_interval(sorted: &[f64], q: f64) -> Option<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    let mean = q * n as f64;
    let spread = 1.96 * (mean * (1.0 - q)).sqrt();
    // 1-based ranks, clamped to the samples there are; `as usize` saturates a negative rank to 0.
    let low = ((mean - spread).floor() as usize).clamp(1, n);
    let high = ((mean + spread).ceil() as usize).clamp(1, n);
    Some((sorted[low - 1], sorted[high - 1]))
}

/// The median of ascending `sorted` values, by [`interpolated`]: the middle value, or the mean of the
/// two middle ones for an even count; `None` when empty.
pub fn median(sorted: &[f64]) -> Option<f64> {
    interpolated(sorted, 0.5)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn nearest_rank_picks_the_value_at_the_rounded_up_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&values, 0.50), Some(50.0));
        assert_eq!(nearest_rank(&values, 0.95), Some(95.0));
        assert_eq!(nearest_rank(&values, 0.99), Some(99.0));
        assert_eq!(nearest_rank(&values, 0.0), Some(1.0), "rank 0 is clamped to the first");
        assert_eq!(nearest_rank(&values, 1.5), Some(100.0), "beyond the last is the last");
        assert_eq!(nearest_rank(&[3.0], 0.99), Some(3.0));
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0], 0.5), Some(2.0));
        assert_eq!(nearest_rank(&[1.0, 2.0], 0.5), Some(1.0), "rank 1 of 2");
        assert_eq!(nearest_rank(&[], 0.5), None);
    }

    #[test]
    fn a_quantiles_interval_spans_the_ranks_chance_reaches() {
        let values: Vec<f64> = (1..=300).map(f64::from).collect();
        // n·q = 285, 1.96·sqrt(285·0.05) = 7.4: ranks 277 to 293.
        assert_eq!(confidence_interval(&values, 0.95), Some((277.0, 293.0)));
        let (low, high) = confidence_interval(&values, 0.5).unwrap();
        assert!(low < 150.0 && high > 150.0, "{low} {high}");
        // Few samples: the interval is clamped to them, never out of range.
        assert_eq!(confidence_interval(&[7.0], 0.95), Some((7.0, 7.0)));
        assert_eq!(confidence_interval(&[1.0, 2.0, 3.0], 0.99), Some((2.0, 3.0)));
        assert_eq!(confidence_interval(&[], 0.95), None);
    }

    #[test]
    fn interpolated_lies_between_the_closest_ranks() {
        let values: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(interpolated(&values, 0.5), Some(51.0));
        assert_eq!(interpolated(&values, 0.95), Some(96.0));
        assert_eq!(interpolated(&[1.0, 2.0], 0.5), Some(1.5));
        assert_eq!(interpolated(&[1.0, 2.0], 0.25), Some(1.25));
        assert_eq!(interpolated(&[1.0, 2.0], -1.0), Some(1.0), "q is clamped");
        assert_eq!(interpolated(&[7.0], 0.9), Some(7.0));
        assert_eq!(interpolated(&[], 0.5), None);
    }

    #[test]
    fn the_median_is_the_middle_or_the_mean_of_the_two_middle_values() {
        assert_eq!(median(&[1.0, 2.0, 3.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    fn sorted_values() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(-1e9..1e9f64, 1..200).prop_map(|mut values| {
            values.sort_by(f64::total_cmp);
            values
        })
    }

    proptest! {
        #[test]
        fn nearest_rank_is_an_observed_value_and_grows_with_q(values in sorted_values(), a in 0.0..=1.0f64, b in 0.0..=1.0f64) {
            let (low, high) = (a.min(b), a.max(b));
            let (at_low, at_high) = (nearest_rank(&values, low).unwrap(), nearest_rank(&values, high).unwrap());
            prop_assert!(values.contains(&at_low));
            prop_assert!(at_low <= at_high);
            // At least a share q of the values are at or below it.
            let at_or_below = values.iter().filter(|v| **v <= at_high).count();
            prop_assert!(at_or_below as f64 >= high * values.len() as f64 - 1e-9);
        }

        #[test]
        fn interpolated_stays_between_its_neighbours_and_spans_the_values(values in sorted_values(), q in 0.0..=1.0f64) {
            let got = interpolated(&values, q).unwrap();
            let rank = q * (values.len() - 1) as f64;
            let (low, high) = (values[rank.floor() as usize], values[rank.ceil() as usize]);
            // One rounding of the interpolation may step past a neighbour by an ulp or so.
            let slack = 1e-9 * low.abs().max(high.abs()).max(1.0);
            prop_assert!(low - slack <= got && got <= high + slack, "{low} <= {got} <= {high}");
            prop_assert_eq!(interpolated(&values, 0.0), values.first().copied());
            prop_assert_eq!(interpolated(&values, 1.0), values.last().copied());
        }
    }
}
