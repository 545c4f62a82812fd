//! The ring kind: "keep the last N per key" logs stored as fixed-size rings.
//!
//! - `spec.rs`: the `[[ring]]` section and its validation;
//! - `plan.rs`: the planner ([`RingRule`]): inserts become guarded upserts into a
//!   ring slot, reads, deletes and keyed updates go to the ring;
//! - `schema.rs`: the ring and sequence tables, triggers and backfill `heatsink
//!   migrate` creates, and what `check --backend-url` reports.

pub mod advise;
pub mod merge;
pub mod plan;
pub mod revert;
pub mod schema;
pub mod spec;

use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

pub use plan::RingRule;
pub use spec::RingSpec;

use crate::error::Result;
use crate::kinds::logical::{assumed_column, Assumed};
use crate::kinds::{Kind, Leftovers, Migration, RevertContext, RuleSpec, SchemaError};
use crate::report::Severity;
use crate::rewrite::merge::MergeMetric;
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::schema::TriggerPlan;
use crate::wire::resultset::ColumnDef;

/// The ring kind, as the registry lists it.
pub struct Ring;

impl Kind for Ring {
    fn advise(&self, workload: &crate::advice::Workload) -> crate::advice::Advice {
        advise::advise(workload)
    }

    fn section(&self) -> &'static str {
        "ring"
    }

    fn parse(&self, text: &str) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error> {
        crate::kinds::specs_of::<RingSpec>(text, self.section())
    }

    fn merge_metric(&self) -> Option<&'static MergeMetric> {
        Some(&merge::METRIC)
    }
}

#[async_trait(?Send)]
impl RuleSpec for RingSpec {
    fn backfills_under_lock(&self) -> bool {
        true
    }

    fn kind(&self) -> &'static str {
        Ring.section()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn physical_tables(&self) -> Vec<String> {
        vec![self.ring_table.clone(), self.seq_table_name()]
    }

    /// Inserts upsert the ring, reads, updates and deletes use it; only the ring's
    /// trigger writes the sequence table.
    fn client_tables(&self) -> Vec<(String, crate::kinds::SideAccess)> {
        vec![(self.ring_table.clone(), crate::kinds::SideAccess::Write)]
    }

    fn rule(&self) -> std::result::Result<Arc<dyn Rule>, String> {
        self.validate()?;
        Ok(Arc::new(RingRule::new(self)?))
    }

    /// Key columns as `VARCHAR(255)`, the `order_by` column as `DATETIME(6)`.
    fn assumed_columns(&self) -> Vec<ColumnDef> {
        let Ok(table) = TableName::parse(&self.table) else {
            return Vec::new();
        };
        let key = self.key.iter().map(|k| (k, Assumed::Key));
        let order = self.order_by.iter().map(|c| (c, Assumed::Time));
        key.chain(order)
            .map(|(name, shape)| assumed_column(&table.name, name, shape))
            .collect()
    }

    fn to_toml(&self) -> std::result::Result<String, String> {
        crate::kinds::entry_toml(self.kind(), self)
    }

    fn leftovers(&self, default_db: Option<&str>) -> std::result::Result<Leftovers, String> {
        revert::leftovers(self, default_db)
    }

    /// Copies the ring back into the log, then drops the ring's tables and trigger.
    async fn revert(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        revert::revert(self, ctx).await
    }

    async fn schema(
        &self,
        conn: &mut Conn,
        default_db: Option<&str>,
    ) -> std::result::Result<Box<dyn Migration>, SchemaError> {
        Ok(Box::new(schema::check_ring(conn, self, default_db).await?))
    }
}

#[async_trait(?Send)]
impl Migration for schema::CheckedRing {
    async fn problems(&self, conn: &mut Conn) -> Result<Vec<(Severity, String)>> {
        let mut out = Vec::new();
        let missing = "does not exist (`heatsink migrate` creates it)";
        if self.create_ring.is_some() {
            out.push((
                Severity::Error,
                format!("ring table {} {missing}", self.ring.quoted()),
            ));
        }
        if self.create_seq.is_some() {
            out.push((
                Severity::Error,
                format!("sequence table {} {missing}", self.seq.quoted()),
            ));
        }
        if let TriggerPlan::Create(_) = self.seq_trigger {
            out.push((
                Severity::Error,
                format!(
                    "trigger {} on {} is missing or differs from the rule's, so inserts would fail (1048) or be numbered wrongly (`heatsink migrate` creates it)",
                    self.seq_trigger_name.quoted(),
                    self.ring.quoted()
                ),
            ));
        }
        if let TriggerPlan::Create(_) = self.trigger {
            out.push((
                Severity::Warning,
                format!(
                    "trigger {} on {} is missing or differs, so rows appended to the log by writers that bypass heatsink would not reach the ring (`heatsink migrate` creates it)",
                    self.trigger_name.quoted(),
                    self.logical.quoted()
                ),
            ));
        }
        for t in self.copied_triggers.iter().filter(|t| !t.exists) {
            out.push((
                Severity::Error,
                format!(
                    "trigger {} on {} (a copy of the log's {}) is missing, so inserts the log's trigger refuses or changes would be kept as sent (`heatsink migrate` creates it)",
                    t.name.quoted(),
                    self.ring.quoted(),
                    t.original.quoted()
                ),
            ));
        }
        if self.backfill_due {
            out.push((
                Severity::Warning,
                format!(
                    "{} has rows but the ring is empty: reads would show nothing until `heatsink migrate --apply` backfills it",
                    self.logical.quoted()
                ),
            ));
        }
        if self.spec.coalesce
            && self.auto_inc.is_some()
            && !crate::schema::has_returning(conn).await?
        {
            out.push((
                Severity::Warning,
                "coalesce = true, but this server has no INSERT … RETURNING (MariaDB ≥ 10.5): inserts into a log with an AUTO_INCREMENT column will not be merged".to_string(),
            ));
        }
        for (name, cols) in &self.unenforced_unique {
            out.push((
                Severity::Warning,
                format!(
                    "unique key `{name}` ({}) of {} is not enforced by the ring: an insert that the log would refuse as a duplicate (1062) is kept",
                    cols.join(", "),
                    self.logical.quoted()
                ),
            ));
        }
        // migrate's notes describe what it would do (backfill, ids), not problems.
        Ok(out)
    }

    async fn run(&self, conn: &mut Conn, apply: bool, out: &mut dyn Write) -> Result<()> {
        let jobs = crate::jobs::Settings::default();
        schema::print_and_apply_ring(conn, self, apply, &jobs, out).await
    }

    /// The backfill reports its progress and keeps to the throttle (see
    /// `schema::RingBackfill`).
    async fn run_with(
        &self,
        conn: &mut Conn,
        apply: bool,
        jobs: &crate::jobs::Settings,
        out: &mut dyn Write,
    ) -> Result<()> {
        schema::print_and_apply_ring(conn, self, apply, jobs, out).await
    }
}
