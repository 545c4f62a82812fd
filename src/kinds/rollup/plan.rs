//! The rollup planner: aggregate reads of the log answered from the rollup table.
//!
//! Writes to the log pass through unchanged (plain inserts may be merged with
//! concurrent ones, `merge.rs`): the triggers `heatsink migrate` installs keep the
//! rollup exact in the same transaction. `TRUNCATE` of the log
//! fires no trigger and is refused; other DDL on the log is refused as for every
//! kind. Reads the rollup cannot answer exactly pass through to the log.

use std::sync::{Arc, OnceLock};

use sqlparser::ast::Statement;

use super::spec::{Bucket, Measure, RollupSpec};
use crate::kinds::logical::LogicalTable;
use crate::rewrite::shape::{ddl_rejection, is_table_ddl};
use crate::rewrite::{Plan, PlanContext, Refusal, Rule, TableName};
use crate::wire::resultset::ColumnDef;

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
fn same_table(a: &TableName, b: &TableName) -> bool {
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
            finer: OnceLock::new(),
        })
    }

    /// The rank among the rollups of one log: fewer dimensions and coarser buckets
    /// make a smaller table, asked first.
    fn rank(&self) -> u32 {
        let dims = self.logical.key().len() as u32;
        2 * dims + u32::from(self.bucket == Bucket::Hour)
    }
}

impl Rule for RollupRule {
    fn merges(&self) -> bool {
        self.coalesce
    }

    fn physical_tables(&self) -> Vec<(String, String)> {
        vec![(
            self.rollup_table.name.clone(),
            self.logical.name().name.to_string(),
        )]
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        self.logical.tables()
    }

    fn shadow(&self) -> bool {
        self.shadow
    }

    /// Updates and deletes of the log pass through: the triggers keep the rollups.
    fn plans_updates(&self) -> bool {
        false
    }

    /// The log holds every row and the triggers keep the rollups, whatever the
    /// statement.
    fn runs_unread(&self) -> bool {
        true
    }

    fn sharing(&self) -> Option<u32> {
        Some(self.rank())
    }

    /// Learns the finer rollups of the same log (rules in shadow mode are not
    /// trusted to have their tables).
    fn cooperate(&self, sharing: &[Arc<dyn Rule>]) {
        let tiers = sharing
            .iter()
            .filter_map(|r| r.as_any()?.downcast_ref::<RollupRule>())
            .filter(|r| {
                !r.shadow
                    && r.bucket < self.bucket
                    && same_table(r.logical.name(), self.logical.name())
            })
            .map(|r| Tier {
                table: r.rollup_table.clone(),
                dims: r.logical.key().to_vec(),
                bucket: r.bucket,
                measures: r.measures.clone(),
            })
            .collect();
        // Set once, when the engine is built.
        let _ = self.finer.set(tiers);
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.logical.metadata_query(current_db)
    }

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.logical.provide_metadata(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
        match stmt {
            Statement::Truncate(_) => Err(Refusal::ddl(format!(
                "TRUNCATE of rollup table {} fires no trigger, so rollup table {} would keep counting the removed rows; use DELETE, or truncate both on the database directly",
                self.logical.name(),
                self.rollup_table
            ))),
            Statement::LoadData { .. } | Statement::LockTables { .. } => Ok(None),
            _ if is_table_ddl(stmt) => Err(ddl_rejection(
                stmt,
                "rollup",
                self.logical.name(),
                &format!("rollup table {} and its triggers", self.rollup_table),
            )),
            Statement::Query(q) => super::read::plan_read(self, q, ctx),
            Statement::Insert(ins) => super::merge::plan_insert(self, ins, stmt, ctx),
            _ => Ok(None),
        }
    }
}
