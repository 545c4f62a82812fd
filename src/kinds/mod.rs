//! Rule kinds: one folder per kind, each owning its whole life.

pub mod counter;
pub mod ring;

use crate::rewrite::merge::MergeMetric;

/// The merged-items counter of every kind that merges writes (group commit), in
/// the order `/metrics` shows them.
pub static MERGE_METRICS: &[&MergeMetric] = &[&counter::merge::METRIC, &ring::merge::METRIC];
