//! A rollup rule as the planner holds it: the log, its rollup table, bucket and
//! measures, and the finer rollups of the same log it reads ragged edges from.

use std::sync::OnceLock;

use super::spec::{Bucket, Measure, RollupSpec};
use crate::kinds::logical::LogicalTable;
use crate::rewrite::TableName;

/// A `[[rollup]]` rule, ready to plan statements.
pub struct RollupRule {
    /// Rule name from the file.
    pub(super) name: String,
    /// The log, with the dimensions as its key columns.
    pub(super) logical: LogicalTable,
    /// The rollup table as written in the rule.
    pub(super) rollup_table: TableName,
    /// The log's time column.
    pub(super) time: String,
    /// Bucket width.
    pub(super) bucket: Bucket,
    /// Aggregates kept (`count(*)` first).
    pub(super) measures: Vec<Measure>,
    /// `mode = "shadow"`.
    pub(super) shadow: bool,
    /// `coalesce` (default on): concurrent inserts into the log may merge.
    pub(super) coalesce: bool,
    /// `exact_flags` (default on): column flags the shape does not settle are
    /// taken from the server's plan of the read.
    pub(super) exact_flags: bool,
    /// Rollups of the same log with finer buckets (hours under days), which the
    /// ragged edges of a range are read from before the log ([`Rule::cooperate`]).
    pub(super) finer: OnceLock<Vec<Tier>>,
}

/// A finer rollup of the same log, as another rule keeps it.
#[derive(Debug, Clone)]
pub(super) struct Tier {
    /// Its rollup table as written in its rule.
    pub(super) table: TableName,
    /// Its dimensions, in its order (bit i of its `hs_nulls` is dimension i).
    pub(super) dims: Vec<String>,
    /// Its bucket width.
    pub(super) bucket: Bucket,
    /// Its aggregates.
    pub(super) measures: Vec<Measure>,
}

impl Tier {
    /// Whether the tier keeps `column`'s count (`sum` false) or also its sum.
    pub(super) fn measures(&self, column: &str, sum: bool) -> bool {
        self.measures.iter().any(|m| match m {
            Measure::Count(c) => !sum && c.eq_ignore_ascii_case(column),
            Measure::Sum(c) => c.eq_ignore_ascii_case(column),
            Measure::Rows => false,
        })
    }

    /// The position of dimension `name` among the tier's.
    pub(super) fn dim(&self, name: &str) -> Option<usize> {
        self.dims.iter().position(|d| d.eq_ignore_ascii_case(name))
    }
}

/// Whether two rules name the same table (databases and names compared as the
/// server compares them on a case-insensitive file system: without case).
pub(super) fn same_table(a: &TableName, b: &TableName) -> bool {
    a.name.eq_ignore_ascii_case(&b.name)
        && match (&a.db, &b.db) {
            (Some(x), Some(y)) => x.eq_ignore_ascii_case(y),
            (None, None) => true,
            _ => false,
        }
}

impl RollupRule {
    /// Builds the rule from a validated spec.
    pub fn new(spec: &RollupSpec) -> Result<Self, String> {
        spec.validate()?;
        Ok(RollupRule {
            name: spec.name.clone(),
            logical: LogicalTable::new(TableName::parse(&spec.table)?, spec.dimensions.clone()),
            rollup_table: TableName::parse(&spec.rollup_table)?,
            time: spec.time.clone(),
            bucket: spec.bucket,
            measures: spec.parsed_measures()?,
            shadow: spec.mode == crate::rules::spec::Mode::Shadow,
            coalesce: spec.coalesce,
            exact_flags: spec.exact_flags,
            finer: OnceLock::new(),
        })
    }

    /// The rank among the rollups of one log: fewer dimensions and coarser buckets
    /// make a smaller table, asked first.
    pub(super) fn rank(&self) -> u32 {
        let dims = self.logical.key().len() as u32;
        2 * dims + u32::from(self.bucket == Bucket::Hour)
    }
}
