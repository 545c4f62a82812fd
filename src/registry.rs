//! The `heatsink_rules` table: which rules `heatsink migrate --apply` set up in a
//! database, and how each was written.
//!
//! A rule leaves objects in the database (slot and ring tables, triggers, …) that
//! only the rule names. Once the DBA removes the rule from the rule files, nothing
//! in them tells `heatsink migrate --revert` or `heatsink check` what those objects
//! were. So `migrate --apply` records every rule it migrated in `heatsink_rules`, in
//! the database of the rule's logical table:
//!
//! ```sql
//! CREATE TABLE heatsink_rules (
//!   name VARCHAR(64) NOT NULL PRIMARY KEY,  -- the rule's name
//!   kind VARCHAR(32) NOT NULL,              -- its section (`counter`)
//!   logical_table VARCHAR(129) NOT NULL,    -- `db.table`, resolved
//!   spec TEXT NOT NULL,                     -- the rule as a rule-file entry
//!   state VARCHAR(16) NULL,                 -- NULL: migrated; 'migrating': the first
//!                                           --   migrate --apply has not finished;
//!                                           --   'folded': a revert brought the data
//!                                           --   back; 'reverted'
//!   updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
//!     ON UPDATE CURRENT_TIMESTAMP(6)
//! ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
//! ```
//!
//! Only `migrate` (with the DBA's credentials) reads and writes it; proxies never
//! do, and hold no state of it. A revert keeps the row (state `reverted`), so that
//! running it again finds the rule and reports that nothing is left to do; migrating
//! the rule again resets the row.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::error::{Error, Result, Source};
use crate::kinds::RuleSpec;
use crate::rules::spec::TableName;
use crate::schema::{schema_err, text};

pub use crate::kinds::revert::{registry_table, Registered, FOLDED, MIGRATING, REVERTED, TABLE};

/// `CREATE TABLE IF NOT EXISTS` of the registry in `db`.
pub fn create_sql(db: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n  name VARCHAR(64) NOT NULL PRIMARY KEY,\n  \
         kind VARCHAR(32) NOT NULL,\n  logical_table VARCHAR(129) NOT NULL,\n  \
         spec TEXT NOT NULL,\n  state VARCHAR(16) NULL,\n  \
         updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)\n\
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        registry_table(db).quoted()
    )
}

/// Records `spec`, whose logical table is `logical` (resolved), as migrated:
/// creates the registry when missing and inserts or replaces the rule's row.
pub async fn record(conn: &mut Conn, logical: &TableName, spec: &dyn RuleSpec) -> Result<()> {
    write(conn, logical, spec, false).await
}

/// Records `spec` as [`MIGRATING`] before its first migration makes anything, so
/// that a migration stopped half way (a backfill killed) is known to `migrate
/// --revert`, which then backs it out. A rule recorded otherwise (migrated,
/// or half reverted) keeps its row; a reverted one, or one still migrating, takes
/// the rule as written now.
pub async fn record_migrating(
    conn: &mut Conn,
    logical: &TableName,
    spec: &dyn RuleSpec,
) -> Result<()> {
    write(conn, logical, spec, true).await
}

async fn write(
    conn: &mut Conn,
    logical: &TableName,
    spec: &dyn RuleSpec,
    first: bool,
) -> Result<()> {
    let db = logical.db.clone().ok_or_else(|| {
        Error::new(
            Source::Internal,
            format!("rule {}: the logical table has no database", spec.name()),
        )
    })?;
    let entry = spec
        .to_toml()
        .map_err(|e| Error::new(Source::Internal, format!("rule {}: {e}", spec.name())))?;
    let table = registry_table(&db);
    conn.query_drop(create_sql(&db))
        .await
        .map_err(|e| schema_err(format!("creating {}", table.quoted()), e))?;
    // Assignments run left to right: `state` is the old one until the last.
    let sql = if first {
        format!(
            "INSERT INTO {} (name, kind, logical_table, spec, state) VALUES (?, ?, ?, ?, '{MIGRATING}') \
             ON DUPLICATE KEY UPDATE \
             kind = IF(state IN ('{MIGRATING}', '{REVERTED}'), VALUES(kind), kind), \
             logical_table = IF(state IN ('{MIGRATING}', '{REVERTED}'), VALUES(logical_table), logical_table), \
             spec = IF(state IN ('{MIGRATING}', '{REVERTED}'), VALUES(spec), spec), \
             state = IF(state IN ('{MIGRATING}', '{REVERTED}'), '{MIGRATING}', state)",
            table.quoted()
        )
    } else {
        format!(
            "INSERT INTO {} (name, kind, logical_table, spec, state) VALUES (?, ?, ?, ?, NULL) \
             ON DUPLICATE KEY UPDATE kind = VALUES(kind), logical_table = VALUES(logical_table), \
             spec = VALUES(spec), state = NULL",
            table.quoted()
        )
    };
    conn.exec_drop(
        sql,
        (
            spec.name(),
            spec.kind(),
            format!("{db}.{}", logical.name),
            entry,
        ),
    )
    .await
    .map_err(|e| {
        schema_err(
            format!("recording rule {} in {}", spec.name(), table.quoted()),
            e,
        )
    })
}

/// Every rule recorded in database `only`, or, without it, in any database the
/// connection's user can see.
pub async fn all(conn: &mut Conn, only: Option<&str>) -> Result<Vec<Registered>> {
    let dbs: Vec<String> = conn
        .exec(
            "SELECT TABLE_SCHEMA FROM information_schema.TABLES WHERE TABLE_NAME = ? \
             AND (? IS NULL OR TABLE_SCHEMA = ?) ORDER BY TABLE_SCHEMA",
            (TABLE, only, only),
        )
        .await
        .map_err(|e| schema_err(format!("looking for {TABLE} tables"), e))?;
    let mut out = Vec::new();
    for db in dbs {
        let table = registry_table(&db);
        let rows: Vec<Row> = conn
            .query(format!(
                "SELECT name, kind, logical_table, spec, state FROM {} ORDER BY name",
                table.quoted()
            ))
            .await
            .map_err(|e| schema_err(format!("reading {}", table.quoted()), e))?;
        for r in rows {
            out.push(Registered {
                db: db.clone(),
                name: text(&r, 0).unwrap_or_default(),
                kind: text(&r, 1).unwrap_or_default(),
                logical_table: text(&r, 2).unwrap_or_default(),
                spec: text(&r, 3).unwrap_or_default(),
                state: text(&r, 4),
            });
        }
    }
    Ok(out)
}

/// Sets the state of rule `name` in `table` (a registry).
pub async fn set_state(
    conn: &mut Conn,
    table: &TableName,
    name: &str,
    state: Option<&str>,
) -> Result<()> {
    conn.exec_drop(
        format!("UPDATE {} SET state = ? WHERE name = ?", table.quoted()),
        (state, name),
    )
    .await
    .map_err(|e| schema_err(format!("updating rule {name} in {}", table.quoted()), e))
}
