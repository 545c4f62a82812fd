//! The rollup planner: aggregate reads of the log answered from the rollup table.
//!
//! Writes to the log pass through unchanged: the triggers `heatsink migrate`
//! installs keep the rollup exact in the same transaction. `TRUNCATE` of the log
//! fires no trigger and is refused; other DDL on the log is refused as for every
//! kind. Reads the rollup cannot answer exactly pass through to the log.

use sqlparser::ast::Statement;

use super::spec::{Bucket, Measure, RollupSpec};
use crate::kinds::logical::LogicalTable;
use crate::rewrite::shape::{ddl_rejection, is_table_ddl};
use crate::rewrite::{Plan, PlanContext, Rule, TableName};
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
    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        self.logical.tables()
    }

    fn shadow(&self) -> bool {
        self.shadow
    }

    fn sharing(&self) -> Option<u32> {
        Some(self.rank())
    }

    fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.logical.metadata_query(current_db)
    }

    fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.logical.provide_metadata(current_db, columns);
    }

    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, String> {
        match stmt {
            Statement::Truncate(_) => Err(format!(
                "TRUNCATE of rollup table {} fires no trigger, so rollup table {} would keep counting the removed rows; use DELETE, or truncate both on the database directly",
                self.logical.name(),
                self.rollup_table
            )),
            Statement::LoadData { .. } | Statement::LockTables { .. } => Ok(None),
            _ if is_table_ddl(stmt) => Err(ddl_rejection(
                stmt,
                "rollup",
                self.logical.name(),
                &format!("rollup table {} and its triggers", self.rollup_table),
            )),
            Statement::Query(q) => super::read::plan_read(self, q, ctx),
            _ => Ok(None),
        }
    }
}
