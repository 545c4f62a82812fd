//! The partition kind: a table partitioned by hour, day or month whose lookups by an opaque key
//! are pruned to the partitions of the time the key carries, and whose partitions
//! rotate.
//!
//! - `spec.rs`: the `[[partition]]` section and its validation;
//! - `keytime.rs`: the SQL that reads a key's time on the server;
//! - `period.rs`: hours, days and months: partition names and bounds;
//! - `plan.rs`: the planner ([`PartitionRule`]): lookups by key get the partition
//!   predicate, inserts that omit the partition column get it from the key;
//! - `schema.rs`: the invariant trigger, the partitioning DDL `heatsink migrate`
//!   prints, and what `check --backend-url` reports;
//! - `rotate.rs`: the `rotate` job of `heatsink maintain` (premade partitions,
//!   expired ones dropped).

pub mod advise;
pub mod keytime;
pub mod period;
pub mod plan;
pub mod rotate;
pub mod schema;
pub mod spec;

use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

pub use plan::PartitionRule;
pub use spec::PartitionSpec;

use crate::error::Result;
use crate::kinds::logical::{assumed_column, Assumed};
use crate::kinds::{Job, JobContext, JobReport, Kind, Leftovers, Migration, RuleSpec, SchemaError};
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::wire::resultset::{types, ColumnDef};

/// The partition kind, as the registry lists it.
pub struct Partition;

impl Kind for Partition {
    fn advise(&self, workload: &crate::advice::Workload) -> crate::advice::Advice {
        advise::advise(workload)
    }

    fn section(&self) -> &'static str {
        "partition"
    }

    fn parse(&self, text: &str) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error> {
        crate::kinds::specs_of::<PartitionSpec>(text, self.section())
    }
}

/// The SQL reading of a spec's key time.
pub(crate) fn key_time_sql(spec: &PartitionSpec) -> keytime::KeyTimeSql {
    keytime::KeyTimeSql {
        kind: spec.key_time,
        pattern: spec.key_pattern.clone(),
        epoch_ms: spec.snowflake_epoch_ms.unwrap_or(0),
        hourly: spec.period == spec::Period::Hour,
    }
}

/// The jobs of a partition rule.
static JOBS: &[Job] = &[Job {
    name: "rotate",
    about:
        "create partitions `premake` periods ahead and drop those wholly older than the retention",
}];

#[async_trait(?Send)]
impl RuleSpec for PartitionSpec {
    fn kind(&self) -> &'static str {
        Partition.section()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn physical_tables(&self) -> Vec<String> {
        Vec::new()
    }

    fn rule(&self) -> std::result::Result<Arc<dyn Rule>, String> {
        self.validate()?;
        Ok(Arc::new(PartitionRule::new(self)?))
    }

    /// The key as a `VARCHAR(255)`, the partition column as a `DATE`.
    fn assumed_columns(&self) -> Vec<ColumnDef> {
        let Ok(table) = TableName::parse(&self.table) else {
            return Vec::new();
        };
        let mut date = assumed_column(&table.name, &self.column, Assumed::Time);
        date.column_type = types::DATE;
        date.decimals = 0;
        date.length = 10;
        vec![assumed_column(&table.name, &self.key, Assumed::Key), date]
    }

    fn to_toml(&self) -> std::result::Result<String, String> {
        crate::kinds::entry_toml(self.kind(), self)
    }

    /// The two triggers that keep rows reachable; the partitioning stays.
    fn leftovers(&self, default_db: Option<&str>) -> std::result::Result<Leftovers, String> {
        let (t, _) = crate::kinds::resolved(&self.table, &[], default_db)?;
        Ok(Leftovers {
            tables: Vec::new(),
            triggers: ["_hs_pins", "_hs_pupd"]
                .iter()
                .map(|s| crate::kinds::trigger_in(&t.db, &t.name, s))
                .collect(),
        })
    }

    async fn schema(
        &self,
        conn: &mut Conn,
        default_db: Option<&str>,
    ) -> std::result::Result<Box<dyn Migration>, SchemaError> {
        Ok(Box::new(schema::check(conn, self, default_db).await?))
    }

    fn jobs(&self) -> &'static [Job] {
        JOBS
    }

    async fn run_job(&self, job: &str, ctx: &mut JobContext<'_>) -> Result<JobReport> {
        match job {
            "rotate" => rotate::run(self, ctx).await,
            _ => Err(crate::error::Error::new(
                crate::error::Source::Internal,
                format!("rule {}: no job named '{job}'", self.name),
            )),
        }
    }
}
