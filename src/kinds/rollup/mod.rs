//! The rollup kind: aggregate reads over a huge append-only log answered exactly from
//! rollup tables that triggers keep current.
//!
//! - `spec.rs`: the `[[rollup]]` section and its validation;
//! - `schema.rs`: the rollup table, the triggers on the log that keep it exact for
//!   every write (through heatsink or not), the online backfill, and what `check
//!   --backend-url` reports;
//! - `plan.rs`: the planner ([`RollupRule`]): aggregate reads of the log answered
//!   from the rollup (whole buckets) and the log (ragged edges).
//!
//! Several rollups may cover one log; they share its table
//! ([`crate::rewrite::Rule::sharing`]) and the smallest that can answer a read does.

pub mod advise;
mod apply;
mod bounds;
mod checked;
pub mod merge;
pub mod plan;
mod read;
mod rule;
pub mod schema;
pub mod spec;
#[cfg(test)]
mod testutil;
mod triggers;

use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

pub use rule::RollupRule;
pub use spec::RollupSpec;

use crate::kinds::logical::{assumed_column, Assumed};
use crate::kinds::{Kind, Leftovers, Migration, RuleSpec, SchemaError};
use crate::rewrite::merge::MergeMetric;
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::wire::resultset::ColumnDef;

/// The rollup kind, as the registry lists it.
pub struct Rollup;

impl Kind for Rollup {
    fn advise(&self, workload: &crate::advice::Workload) -> crate::advice::Advice {
        advise::advise(workload)
    }

    fn section(&self) -> &'static str {
        "rollup"
    }

    fn parse(&self, text: &str) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error> {
        crate::kinds::specs_of::<RollupSpec>(text, self.section())
    }

    fn merge_metric(&self) -> Option<&'static MergeMetric> {
        Some(&merge::METRIC)
    }
}

#[async_trait(?Send)]
impl RuleSpec for RollupSpec {
    fn backfills_under_lock(&self) -> bool {
        true
    }

    fn kind(&self) -> &'static str {
        Rollup.section()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn physical_tables(&self) -> Vec<String> {
        vec![self.rollup_table.clone()]
    }

    fn shares_table(&self) -> bool {
        true
    }

    fn rule(&self) -> std::result::Result<Arc<dyn Rule>, String> {
        self.validate()?;
        Ok(Arc::new(RollupRule::new(self)?))
    }

    /// Dimensions as `VARCHAR(255)` keys, the time column as `DATETIME(6)`, measured
    /// columns as `BIGINT`.
    fn assumed_columns(&self) -> Vec<ColumnDef> {
        let Ok(table) = TableName::parse(&self.table) else {
            return Vec::new();
        };
        let measured: Vec<String> = self
            .parsed_measures()
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m.column().map(str::to_string))
            .collect();
        let dims = self.dimensions.iter().map(|d| (d.clone(), Assumed::Key));
        let time = std::iter::once((self.time.clone(), Assumed::Time));
        let measures = measured.into_iter().map(|c| (c, Assumed::Integer));
        dims.chain(time)
            .chain(measures)
            .map(|(name, shape)| assumed_column(&table.name, &name, shape))
            .collect()
    }

    fn to_toml(&self) -> std::result::Result<String, String> {
        crate::kinds::entry_toml(self.kind(), self)
    }

    /// The rollup table and its three triggers on the log, and what an unfinished
    /// backfill keeps: its delta table and three delta triggers.
    fn leftovers(&self, default_db: Option<&str>) -> std::result::Result<Leftovers, String> {
        let (log, physical) =
            crate::kinds::resolved(&self.table, &[&self.rollup_table], default_db)?;
        let triggers = physical
            .iter()
            .flat_map(|r| {
                triggers::EVENTS.iter().flat_map(|e| {
                    [e.suffix(), e.delta_suffix()]
                        .map(|suffix| crate::kinds::trigger_in(&log.db, &r.name, suffix))
                })
            })
            .collect();
        let deltas: Vec<TableName> = physical.iter().map(schema::delta_table).collect();
        Ok(Leftovers {
            tables: physical.into_iter().chain(deltas).collect(),
            triggers,
        })
    }

    async fn schema(
        &self,
        conn: &mut Conn,
        default_db: Option<&str>,
    ) -> std::result::Result<Box<dyn Migration>, SchemaError> {
        Ok(Box::new(schema::check(conn, self, default_db).await?))
    }
}
