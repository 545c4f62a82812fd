//! The timeline kind: the friends-timeline read (messages of the authors a reader
//! follows, newest first) served without reading every followee's every message.
//!
//! - `spec.rs`: the `[[timeline]]` section and its validation;
//! - `plan.rs`: the planner ([`TimelineRule`]), pull mode: the read bounded by the
//!   followees' newest ids, in one statement;
//! - `schema.rs`: what `check --backend-url` verifies (the `(author, id)` index pull
//!   needs).
//!
//! Push and hybrid modes (a per-reader mailbox kept by fan-out on write) are not
//! built: such rules are refused when the rule file is read.

pub mod plan;
pub mod schema;
pub mod spec;

use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

pub use plan::TimelineRule;
pub use spec::TimelineSpec;

use crate::kinds::logical::{assumed_column, Assumed};
use crate::kinds::{Kind, Migration, RuleSpec, SchemaError};
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::wire::resultset::ColumnDef;

/// The timeline kind, as the registry lists it.
pub struct Timeline;

impl Kind for Timeline {
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
        Vec::new()
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

    async fn schema(
        &self,
        conn: &mut Conn,
        default_db: Option<&str>,
    ) -> std::result::Result<Box<dyn Migration>, SchemaError> {
        Ok(Box::new(schema::check(conn, self, default_db).await?))
    }
}
