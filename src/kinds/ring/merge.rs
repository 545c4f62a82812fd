//! Group commit of ring inserts (`coalesce = true` on a `[[ring]]`): concurrent
//! inserts into the same ring become one multi-row upsert ([`crate::kinds::inserts`]),
//! the parts ordered by their key so that every writer takes the keys' sequence and
//! ring rows in the same order.
//!
//! The same pieces serve a multi-row insert into a log with an AUTO_INCREMENT
//! column that runs alone: it runs with `RETURNING` to report its first row's id.

use std::sync::Arc;

pub use crate::kinds::inserts::InsertPieces as RingPieces;
use crate::kinds::inserts::{Flavor, Inserts};
use crate::rewrite::merge::{MergeMetric, MergeTable, Merger};

/// Ring rows written as part of a merged write.
pub static METRIC: MergeMetric = MergeMetric {
    name: "heatsink_coalesced_rows_total",
    help: "Ring rows written as part of a merged write.",
};

/// The ring's names and answers.
static FLAVOR: Flavor = Flavor {
    name: "ring insert",
    name_alone: "ring insert, alone",
    explain: "concurrent autocommit inserts into the same ring may be merged into one multi-row write, answered after it committed (coalesce)",
    metric: &METRIC,
    returning_alone: true,
    lanes: 1,
};

/// The ring's [`Merger`], as a plan carries it.
pub fn merger(merges: bool, table: Option<MergeTable>) -> Arc<dyn Merger> {
    Inserts::merger(merges, &FLAVOR, table)
}
