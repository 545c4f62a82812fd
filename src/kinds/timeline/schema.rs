//! What `heatsink migrate` and `check --backend-url` do for a timeline rule in pull
//! mode: nothing to create; the pull read needs an index on the messages that
//! starts with (author, id), which is checked.

use std::io::Write;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use super::spec::TimelineSpec;
use crate::check::Severity;
use crate::error::Result;
use crate::kinds::{Migration, SchemaError};
use crate::rules::spec::TableName;
use crate::schema::{emit, inspect_base_table, resolve_tables, schema_err, text};

/// A timeline rule checked against the database.
pub(crate) struct CheckedTimeline {
    name: String,
    messages: TableName,
    /// The message table's AUTO_INCREMENT column.
    id: String,
    /// An index of the messages starting with (author, id), by name.
    index: Option<String>,
    author: String,
}

/// Checks one timeline rule against the database.
pub(crate) async fn check(
    conn: &mut Conn,
    spec: &TimelineSpec,
    default_db: Option<&str>,
) -> std::result::Result<CheckedTimeline, SchemaError> {
    let refuse = SchemaError::Refused;
    spec.validate().map_err(refuse)?;
    let (messages, follows) = resolve_tables(&spec.messages, &[&spec.follows], default_db)?;
    let table = inspect_base_table(conn, &messages).await?;
    let id = table
        .columns
        .iter()
        .find(|c| c.extra.contains("auto_increment"))
        .map(|c| c.name.clone())
        .ok_or_else(|| {
            refuse(format!(
                "{} has no AUTO_INCREMENT column, which orders a timeline",
                messages.quoted()
            ))
        })?;
    if table.column(&spec.message_author).is_none() {
        return Err(refuse(format!(
            "message_author `{}` is not a column of {}",
            spec.message_author,
            messages.quoted()
        )));
    }
    for f in &follows {
        let t = inspect_base_table(conn, f).await?;
        for c in [&spec.follow_reader, &spec.follow_author] {
            if t.column(c).is_none() {
                return Err(refuse(format!("`{c}` is not a column of {}", f.quoted())));
            }
        }
    }
    let index = author_id_index(conn, &messages, &spec.message_author, &id).await?;
    Ok(CheckedTimeline {
        name: spec.name.clone(),
        messages,
        id,
        index,
        author: spec.message_author.clone(),
    })
}

/// The name of an index of `t` whose first two columns are `author` and `id`.
async fn author_id_index(
    conn: &mut Conn,
    t: &TableName,
    author: &str,
    id: &str,
) -> std::result::Result<Option<String>, SchemaError> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',') \
             FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             GROUP BY INDEX_NAME",
            (t.db.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(format!("reading the indexes of {}", t.quoted()), e))?;
    Ok(rows.iter().find_map(|r| {
        let cols = text(r, 1)?;
        let mut it = cols.split(',');
        let starts = it.next()?.eq_ignore_ascii_case(author)
            && it.next().is_some_and(|c| c.eq_ignore_ascii_case(id));
        starts.then(|| text(r, 0)).flatten()
    }))
}

impl CheckedTimeline {
    fn missing_index(&self) -> String {
        format!(
            "{} has no index starting with ({}, {}): every pulled timeline would read each followee's messages in full (add one: ALTER TABLE {} ADD KEY ({}, {}))",
            self.messages.quoted(),
            self.author,
            self.id,
            self.messages.quoted(),
            crate::rules::spec::quote(&self.author),
            crate::rules::spec::quote(&self.id)
        )
    }
}

#[async_trait(?Send)]
impl Migration for CheckedTimeline {
    async fn problems(&self, _conn: &mut Conn) -> Result<Vec<(Severity, String)>> {
        Ok(match &self.index {
            Some(_) => Vec::new(),
            None => vec![(Severity::Error, self.missing_index())],
        })
    }

    async fn run(&self, _conn: &mut Conn, _apply: bool, out: &mut dyn Write) -> Result<()> {
        emit(
            out,
            &format!(
                "-- rule {}: timeline (pull) over {}: nothing to create",
                self.name,
                self.messages.quoted()
            ),
        )?;
        match &self.index {
            Some(i) => emit(out, &format!("-- index `{i}` serves the pull reads"))?,
            None => emit(out, &format!("-- warning: {}", self.missing_index()))?,
        }
        emit(out, "")
    }
}
