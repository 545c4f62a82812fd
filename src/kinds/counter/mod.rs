//! The counter kind: hot single-row counters spread over slot rows, summed on read.
//!
//! - `spec.rs`: the `[[counter]]` section and its validation;
//! - `plan.rs`: the planner ([`CounterRule`]): increments become slot upserts, reads
//!   sum base and slots;
//! - `schema.rs`: the slot table and trigger `heatsink migrate` creates, and what
//!   `check --backend-url` reports;
//! - `compact.rs`: the `compact` maintenance job, folding slot deltas into the base.

pub mod advise;
pub mod compact;
pub mod merge;
pub mod plan;
pub mod revert;
pub mod schema;
pub mod spec;

use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

pub use plan::CounterRule;
pub use spec::CounterSpec;

use crate::error::Result;
use crate::kinds::logical::{assumed_column, Assumed};
use crate::kinds::{
    Job, JobContext, JobReport, Kind, Leftovers, Migration, RevertContext, RuleSpec, SchemaError,
};
use crate::report::Severity;
use crate::rewrite::merge::MergeMetric;
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::schema::TriggerPlan;
use crate::wire::resultset::ColumnDef;

/// The counter kind, as the registry lists it.
pub struct Counter;

impl Kind for Counter {
    fn advise(&self, workload: &crate::advice::Workload) -> crate::advice::Advice {
        advise::advise(workload)
    }

    fn section(&self) -> &'static str {
        "counter"
    }

    fn parse(&self, text: &str) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error> {
        crate::kinds::specs_of::<CounterSpec>(text, self.section())
    }

    fn merge_metric(&self) -> Option<&'static MergeMetric> {
        Some(&merge::METRIC)
    }
}

/// The counter's maintenance jobs.
const JOBS: &[Job] = &[Job {
    name: "compact",
    about: "fold slot deltas back into the base values and delete the slot rows",
}];

#[async_trait(?Send)]
impl RuleSpec for CounterSpec {
    fn kind(&self) -> &'static str {
        Counter.section()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn physical_tables(&self) -> Vec<String> {
        vec![self.slot_table.clone()]
    }

    /// Increments upsert slot rows, sets and deletes clear them, reads sum them.
    fn client_tables(&self) -> Vec<(String, crate::kinds::SideAccess)> {
        vec![(self.slot_table.clone(), crate::kinds::SideAccess::Write)]
    }

    fn rule(&self) -> std::result::Result<Arc<dyn Rule>, String> {
        self.validate()?;
        Ok(Arc::new(CounterRule::new(self)?))
    }

    /// Key columns as `VARCHAR(255)`, counter columns as `BIGINT NOT NULL`.
    fn assumed_columns(&self) -> Vec<ColumnDef> {
        let Ok(table) = TableName::parse(&self.table) else {
            return Vec::new();
        };
        let key = self.key.iter().map(|k| (k, Assumed::Key));
        let counters = self.columns.iter().map(|c| (c, Assumed::Integer));
        key.chain(counters)
            .map(|(name, shape)| assumed_column(&table.name, name, shape))
            .collect()
    }

    async fn schema(
        &self,
        conn: &mut Conn,
        default_db: Option<&str>,
    ) -> std::result::Result<Box<dyn Migration>, SchemaError> {
        Ok(Box::new(schema::check_rule(conn, self, default_db).await?))
    }

    fn jobs(&self) -> &'static [Job] {
        JOBS
    }

    fn to_toml(&self) -> std::result::Result<String, String> {
        crate::kinds::entry_toml(self.kind(), self)
    }

    fn leftovers(&self, default_db: Option<&str>) -> std::result::Result<Leftovers, String> {
        revert::leftovers(self, default_db)
    }

    fn draining(&self) -> bool {
        self.drain
    }

    /// Folds the slot rows into the logical table, then drops the slot table.
    async fn revert(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        revert::revert(self, ctx).await
    }

    /// A proxy that loaded the rule early may have written slot rows: they are
    /// folded as in a revert, exactly, before the slot table is dropped.
    async fn back_out(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        revert::revert(self, ctx).await
    }

    async fn run_job(&self, job: &str, ctx: &mut JobContext<'_>) -> Result<JobReport> {
        match job {
            "compact" => compact::job(self, ctx).await,
            _ => Err(crate::error::Error::new(
                crate::error::Source::Internal,
                format!("counter '{}': no job named '{job}'", self.name),
            )),
        }
    }
}

#[async_trait(?Send)]
impl Migration for schema::CheckedRule {
    async fn problems(&self, _conn: &mut Conn) -> Result<Vec<(Severity, String)>> {
        let mut out = Vec::new();
        if self.create_table.is_some() {
            out.push((
                Severity::Error,
                format!(
                    "slot table {} does not exist (`heatsink migrate` creates it)",
                    self.slot.quoted()
                ),
            ));
        }
        if let TriggerPlan::Create(_) = self.trigger {
            out.push((
                Severity::Error,
                format!(
                    "trigger {} on {} does not exist, so increments of a new key would not create its row (`heatsink migrate` creates it)",
                    self.trigger_quoted(),
                    self.slot.quoted()
                ),
            ));
        }
        out.extend(self.notes.iter().map(|n| (Severity::Warning, n.clone())));
        Ok(out)
    }

    async fn run(&self, conn: &mut Conn, apply: bool, out: &mut dyn Write) -> Result<()> {
        schema::print_and_apply(conn, self, apply, out).await
    }
}
