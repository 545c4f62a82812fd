//! A rollup rule as `check` found it in the database ([`CheckedRollup`]) and the
//! rollup table's layout that follows from it: its columns, in order, and its
//! primary key (the contract with `plan.rs`, described in `schema.rs`). The
//! triggers, the backfill and `migrate` all build their SQL from these.

use crate::rules::spec::TableName;
use crate::schema::Column;

use super::spec::{Measure, RollupSpec};
use crate::schema::NeededTrigger as Trigger;

/// What the rollup stores for a NULL time.
pub(crate) const NULL_BUCKET: &str = "1000-01-01 00:00:00";

/// One dimension: the log's column and the value stored for NULL.
#[derive(Debug, Clone)]
pub(crate) struct Dimension {
    pub column: Column,
    /// SQL literal of the type's zero value.
    pub zero: String,
}

/// A measure with the column it reads (`count(*)` has none), as the log names it.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub measure: Measure,
    /// Scale of `hs_sum_<col>` (sum only).
    pub scale: u32,
}

/// A stopped backfill that can continue: its delta table and triggers cover the log
/// keys up to `end`, and its chunks are committed up to `position`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resume {
    /// The largest key of the log when the backfill started (its last key).
    pub end: String,
    /// The key the last committed chunk ended at (`None`: no chunk committed).
    pub position: Option<String>,
    /// Items done so far.
    pub rows_done: u64,
}

/// A rollup rule checked against the database.
pub(crate) struct CheckedRollup {
    pub spec: RollupSpec,
    pub log: TableName,
    pub rollup: TableName,
    /// The log's single-column integer primary key, if it has one.
    pub pk: Option<String>,
    pub dims: Vec<Dimension>,
    pub time: String,
    /// The time column is a TIMESTAMP: buckets of UTC.
    pub utc: bool,
    pub measures: Vec<Measured>,
    /// `CREATE TABLE` when the rollup table is missing.
    pub create_table: Option<String>,
    /// Insert, update and delete triggers.
    pub triggers: Vec<Trigger>,
    /// The log has rows and the rollup none, or a backfill stopped half way.
    pub backfill_due: bool,
    /// A backfill stopped half way (its progress row is unfinished): the next one
    /// continues it when it can ([`CheckedRollup::resume`]), else empties the
    /// rollup under the lock and starts over.
    pub restart: bool,
    /// The stopped backfill's delta table and triggers are complete: the next run
    /// continues after its position instead of starting over.
    pub resume: Option<Resume>,
    /// The backfill's delta table (`<rollup>_backfill_delta`), which the delta
    /// triggers fill while a backfill is unfinished.
    pub delta: TableName,
    /// `CREATE TABLE IF NOT EXISTS` of the delta table.
    pub delta_create: String,
    /// The delta table or a delta trigger exists and no backfill continues with
    /// them: migrate drops them (a finished backfill's, or an incomplete set).
    pub stale_delta: bool,
    /// The backfill's progress row.
    pub job: crate::jobs::JobKey,
    /// The existing rollup table has the legacy primary key order.
    pub legacy_key: bool,
    pub notes: Vec<String>,
}

/// The rollup's columns: (name, type as DDL), in layout order.
pub(crate) fn layout(rule: &CheckedRollup) -> Vec<(String, String)> {
    let mut cols: Vec<(String, String)> = rule
        .dims
        .iter()
        .map(|d| (d.column.name.clone(), d.column.type_sql()))
        .collect();
    for (name, ty) in [
        ("hs_nulls", "INT UNSIGNED"),
        ("hs_bucket", "DATETIME"),
        ("hs_slot", "SMALLINT UNSIGNED"),
        ("hs_rows", "BIGINT"),
    ] {
        cols.push((name.into(), ty.into()));
    }
    for c in counted(rule) {
        cols.push((format!("hs_count_{c}"), "BIGINT".into()));
    }
    for (c, scale) in summed(rule) {
        cols.push((format!("hs_sum_{c}"), format!("DECIMAL(65,{scale})")));
    }
    cols
}

/// The columns with an `hs_count_<col>` (every `count(col)` and `sum(col)`), each
/// once, in measure order.
pub(crate) fn counted(rule: &CheckedRollup) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for c in rule.measures.iter().filter_map(|m| m.measure.column()) {
        if !out.iter().any(|x| x.eq_ignore_ascii_case(c)) {
            out.push(c);
        }
    }
    out
}

/// The summed columns and their scales, in measure order.
pub(crate) fn summed(rule: &CheckedRollup) -> Vec<(&str, u32)> {
    rule.measures
        .iter()
        .filter_map(|m| match &m.measure {
            Measure::Sum(c) => Some((c.as_str(), m.scale)),
            _ => None,
        })
        .collect()
}

/// The rollup's primary key columns: the first dimension, the bucket, the other
/// dimensions, the NULL bits and the slot (a rollup without dimensions: the bucket
/// first).
pub(crate) fn primary_key(rule: &CheckedRollup) -> Vec<String> {
    let dims: Vec<String> = rule.dims.iter().map(|d| d.column.name.clone()).collect();
    let at = usize::from(!dims.is_empty());
    let mut key = dims[..at].to_vec();
    key.push("hs_bucket".into());
    key.extend_from_slice(&dims[at..]);
    key.extend(["hs_nulls", "hs_slot"].map(String::from));
    key
}
