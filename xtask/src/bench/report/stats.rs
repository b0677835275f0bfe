//! The statistics of the pair ratios: their median, the interval that holds the true
//! median with 95 % confidence whatever their distribution, and their spread. Apart
//! from the table because they are numbers, not cells.

use serde::Serialize;

/// The spread of the pair ratios: `min–max`, or the one ratio of a single pair.
pub(super) fn spread(ratios: &[f64]) -> String {
    let min = ratios.iter().copied().reduce(f64::min);
    let max = ratios.iter().copied().reduce(f64::max);
    match (min, max, ratios.len()) {
        (Some(only), _, 1) => format!("{only:.3} (1 pair)"),
        (Some(min), Some(max), _) => format!("{min:.3}–{max:.3}"),
        _ => "n/a".to_owned(),
    }
}

/// A distribution-free confidence interval of a median: the `k`-th smallest and the
/// `k`-th largest of `n` values, which hold the true median between them with probability
/// `1 − 2·P(Bin(n, ½) < k)` whatever the values' distribution (the pairs need only be
/// independent).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(super) struct MedianInterval {
    pub low: f64,
    pub high: f64,
    /// The exact coverage of the interval, ≥ [`INTERVAL_CONFIDENCE`].
    pub confidence: f64,
}

pub(super) const INTERVAL_CONFIDENCE: f64 = 0.95;

/// The narrowest order-statistic interval of the median of `values` with at least
/// [`INTERVAL_CONFIDENCE`]; none with fewer than six values (even the smallest and the
/// largest of five hold the median with only 94 %).
pub(super) fn median_interval(values: &[f64]) -> Option<MedianInterval> {
    let n = values.len();
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    // P(Bin(n, ½) = i), i = 0..n, built up from 2⁻ⁿ.
    let mut p = 0.5f64.powi(i32::try_from(n).ok()?);
    let mut below = 0.0; // P(Bin(n, ½) < k)
    let mut best = None;
    for k in 1..=n / 2 {
        below += p;
        p *= (n - (k - 1)) as f64 / k as f64;
        let confidence = 1.0 - 2.0 * below;
        if confidence < INTERVAL_CONFIDENCE {
            break;
        }
        best = Some(MedianInterval {
            low: sorted[k - 1],
            high: sorted[n - k],
            confidence,
        });
    }
    best
}

pub(super) fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn median_intervals_hold_95_percent() {
        // Five values cannot give 95 %: even min–max holds the median with 1 − 2/32.
        assert_eq!(median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0]), None);
        // Six: min–max, 1 − 2/64.
        let six = median_interval(&[6.0, 1.0, 5.0, 2.0, 4.0, 3.0]).unwrap();
        assert_eq!((six.low, six.high), (1.0, 6.0));
        assert!((six.confidence - (1.0 - 2.0 / 64.0)).abs() < 1e-12);
        // Seven, the old default: still min–max (1 − 2/128); the second smallest would
        // leave 1 − 16/128 = 87.5 %.
        let seven: Vec<f64> = (1..=7).map(f64::from).collect();
        let i = median_interval(&seven).unwrap();
        assert_eq!((i.low, i.high), (1.0, 7.0));
        // 21 pairs: the 6th smallest and the 6th largest (P(Bin(21, ½) ≤ 5) = 0.0133,
        // so 97.3 %; the 7th would give 92.2 %).
        let many: Vec<f64> = (1..=21).rev().map(f64::from).collect();
        let i = median_interval(&many).unwrap();
        assert_eq!((i.low, i.high), (6.0, 16.0));
        assert!((i.confidence - 0.9734).abs() < 1e-4, "{}", i.confidence);
    }

    #[test]
    fn spreads_of_pair_ratios() {
        assert_eq!(spread(&[]), "n/a");
        assert_eq!(spread(&[0.984]), "0.984 (1 pair)");
        assert_eq!(spread(&[1.02, 0.968, 0.99]), "0.968–1.020");
    }
}
