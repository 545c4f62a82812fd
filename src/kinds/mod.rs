//! Rule kinds: one folder per kind, each owning its whole life.

pub mod counter;
pub mod ring;

use crate::rewrite::merge::MergeMetric;

/// The merged-items counter of every kind that merges writes (group commit), in
/// the order `/metrics` shows them.
pub static MERGE_METRICS: &[&MergeMetric] = &[&counter::merge::METRIC, &ring::merge::METRIC];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MergedItems;

    #[test]
    fn merged_items_keep_their_metric_names() {
        let items = MergedItems::default();
        for m in [
            counter::merge::Increments::merger(),
            ring::merge::Inserts::merger(true),
        ] {
            assert!(MERGE_METRICS.iter().any(|x| std::ptr::eq(*x, m.metric())));
        }
        items.add(&counter::merge::METRIC, 3);
        items.add(&ring::merge::METRIC, 5);
        items.add(&ring::merge::METRIC, 1);
        let shown: Vec<(&str, u64)> = items.iter().map(|(m, v)| (m.name, v)).collect();
        assert_eq!(
            shown,
            [
                ("heatsink_coalesced_increments_total", 3),
                ("heatsink_coalesced_rows_total", 6)
            ]
        );
    }
}
