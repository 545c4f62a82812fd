//! The rollup planner: aggregate reads of the log answered from the rollup table.
//!
//! Writes to the log pass through unchanged (plain inserts may be merged with
//! concurrent ones, `merge.rs`): the triggers `heatsink migrate` installs keep the
//! rollup exact in the same transaction. `TRUNCATE` of the log
//! fires no trigger and is refused; other DDL on the log is refused as for every
//! kind. Reads the rollup cannot answer exactly pass through to the log.

use std::sync::Arc;

use sqlparser::ast::Statement;

use super::rule::{same_table, RollupRule, Tier};
use crate::rewrite::shape::{ddl_rejection, is_table_ddl};
use crate::rewrite::{Plan, PlanContext, Refusal, Rule, TableName};
use crate::wire::resultset::ColumnDef;

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
