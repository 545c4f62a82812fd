//! The timeline kind: the friends-timeline read (messages of the authors a reader
//! follows, newest first) served without reading every followee's every message.
//!
//! - `spec.rs`: the `[[timeline]]` section and its validation;
//! - `plan.rs`: the planner ([`TimelineRule`]): the read bounded below by the
//!   `(n + k)`-th newest id of the reader's mailbox (push, hybrid) or of the
//!   followees' newest ids (pull), in one statement;
//! - `schema.rs`: the mailbox, its triggers and backfill (`migrate`), what `check
//!   --backend-url` verifies (the `(author, id)` index, the mailbox and its
//!   triggers), and the `trim` job that bounds the mailbox.

pub mod advise;
pub mod plan;
pub mod schema;
pub mod spec;

use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

pub use plan::TimelineRule;
pub use spec::TimelineSpec;

use crate::error::Result;
use crate::kinds::logical::{assumed_column, Assumed};
use crate::kinds::{Job, JobContext, JobReport, Kind, Leftovers, Migration, RuleSpec, SchemaError};
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::wire::resultset::ColumnDef;

/// Push and hybrid: each reader's mailbox cut to its `mailbox_size` newest entries.
const TRIM: Job = Job {
    name: "trim",
    about: "cut each reader's timeline mailbox to its mailbox_size newest entries",
};

/// Push and hybrid: the mailboxes filled (what `migrate --apply` starts; resumable).
const FILL: Job = Job {
    name: schema::FILL,
    about: "fill the timeline mailboxes of a push or hybrid rule (resumes where a fill stopped)",
};

/// The timeline kind, as the registry lists it.
pub struct Timeline;

impl Kind for Timeline {
    fn advise(&self, workload: &crate::advice::Workload) -> crate::advice::Advice {
        advise::advise(workload)
    }

    fn section(&self) -> &'static str {
        "timeline"
    }

    fn parse(&self, text: &str) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error> {
        crate::kinds::specs_of::<TimelineSpec>(text, self.section())
    }
}

#[async_trait(?Send)]
impl RuleSpec for TimelineSpec {
    fn kind(&self) -> &'static str {
        Timeline.section()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn table(&self) -> &str {
        &self.messages
    }

    fn physical_tables(&self) -> Vec<String> {
        self.mailbox.iter().cloned().collect()
    }

    fn rule(&self) -> std::result::Result<Arc<dyn Rule>, String> {
        Ok(Arc::new(TimelineRule::new(self)?))
    }

    /// `id` (AUTO_INCREMENT) and the author column as `BIGINT`.
    fn assumed_columns(&self) -> Vec<ColumnDef> {
        let Ok(table) = TableName::parse(&self.messages) else {
            return Vec::new();
        };
        let mut id = assumed_column(&table.name, "id", Assumed::Integer);
        id.flags |= 0x0200 | 0x0002;
        vec![
            id,
            assumed_column(&table.name, &self.message_author, Assumed::Integer),
        ]
    }

    fn to_toml(&self) -> std::result::Result<String, String> {
        crate::kinds::entry_toml(self.kind(), self)
    }

    /// Push and hybrid: the mailbox and its six triggers on the message and follow
    /// tables; pull leaves nothing.
    fn leftovers(&self, default_db: Option<&str>) -> std::result::Result<Leftovers, String> {
        let Some(mailbox) = &self.mailbox else {
            return Ok(Leftovers::default());
        };
        let (_, physical) = crate::kinds::resolved(&self.messages, &[mailbox], default_db)?;
        let mut triggers = Vec::new();
        for m in &physical {
            for which in ["_hs_msg", "_hs_fol"] {
                for event in ["_ins", "_upd", "_del"] {
                    triggers.push(crate::kinds::trigger_in(
                        &m.db,
                        &m.name,
                        &format!("{which}{event}"),
                    ));
                }
            }
        }
        Ok(Leftovers {
            tables: physical,
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

    fn jobs(&self) -> &'static [Job] {
        match self.mode {
            spec::Serve::Pull => &[],
            _ => &[FILL, TRIM],
        }
    }

    async fn run_job(&self, job: &str, ctx: &mut JobContext<'_>) -> Result<JobReport> {
        if job == FILL.name {
            return schema::fill(self, ctx).await;
        }
        if job != TRIM.name {
            return Err(crate::error::Error::new(
                crate::error::Source::Internal,
                format!("rule {}: no job named '{job}'", self.name),
            ));
        }
        schema::trim(self, ctx).await
    }
}
