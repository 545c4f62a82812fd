//! The live schema, as maintenance commands and kinds' schema work read it: a
//! connection for maintenance work, tables and their columns and keys from
//! `information_schema`, triggers, and small helpers for running DDL and printing
//! what was done. Each kind's own DDL, backfill and checks are in
//! `src/kinds/<kind>/schema.rs`; `heatsink migrate` (`crate::migrate`) drives them.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Row, Value};
use std::io::Write;

use crate::error::{Error, Result, Source};
use crate::rules::spec::{quote, TableName};

/// Longest identifier MySQL/MariaDB accept.
pub(crate) const MAX_IDENT: usize = 64;

/// Writes one line.
pub(crate) fn emit(out: &mut dyn Write, line: &str) -> Result<()> {
    writeln!(out, "{line}").map_err(|e| Error::with_cause(Source::Internal, "writing output", e))
}

/// `` `a`, `b` `` for messages and DDL.
pub(crate) fn list(cols: &[String]) -> String {
    cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ")
}

/// Connects for maintenance work: TCP even for `localhost`, and `CLIENT_FOUND_ROWS` so
/// an `UPDATE` reports the rows it matched (compaction relies on that).
pub(crate) async fn connect(url: &str) -> Result<Conn> {
    let opts = Opts::from_url(url)
        .map_err(|e| Error::with_cause(Source::Internal, "invalid --backend-url", e))?;
    let opts = OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .client_found_rows(true)
        .stmt_cache_size(64);
    Conn::new(opts).await.map_err(|e| {
        Error::with_cause(Source::Backend, format!("connecting to {}", redact(url)), e)
    })
}

/// The database named in the URL, if any.
pub(crate) fn default_db(url: &str) -> Result<Option<String>> {
    let opts = Opts::from_url(url)
        .map_err(|e| Error::with_cause(Source::Internal, "invalid --backend-url", e))?;
    Ok(opts.db_name().filter(|d| !d.is_empty()).map(str::to_string))
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let auth = &url[scheme + 3..at];
            let user = auth.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// A backend error while reading the schema.
pub(crate) fn schema_err(what: String, e: mysql_async::Error) -> Error {
    Error::with_cause(Source::Backend, what, e)
}

/// One column of a table, as `information_schema.COLUMNS` describes it.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    /// Name as the server spells it.
    pub name: String,
    /// `DATA_TYPE`, lower case: `int`, `varchar`, …
    pub data_type: String,
    /// `COLUMN_TYPE`, the full type to copy: `varchar(64)`, `int(10) unsigned`, …
    pub column_type: String,
    /// Character set of a text column.
    pub charset: Option<String>,
    /// Collation of a text column.
    pub collation: Option<String>,
    /// `IS_NULLABLE = 'YES'`.
    pub nullable: bool,
    /// Whether an INSERT that omits the column succeeds in strict mode: it has a
    /// default, is nullable, auto-increment or generated.
    pub omittable: bool,
    /// `COLUMN_DEFAULT`: the default as an SQL expression (`'abc'`, `0`, `NULL`,
    /// `current_timestamp(6)`); `None` when the column has none.
    pub default: Option<String>,
    /// `EXTRA`, lower case: `auto_increment`, `on update current_timestamp(6)`,
    /// `stored generated`, `invisible`, …
    pub extra: String,
}

#[cfg(test)]
impl Column {
    /// A column as `information_schema` would describe it (`column_type` as it spells
    /// it: `int(11)`, `varchar(64)`), without character set or `EXTRA`.
    pub(crate) fn for_test(
        name: &str,
        column_type: &str,
        nullable: bool,
        default: Option<&str>,
    ) -> Column {
        Column {
            name: name.into(),
            data_type: column_type
                .split(['(', ' '])
                .next()
                .unwrap_or_default()
                .into(),
            column_type: column_type.into(),
            charset: None,
            collation: None,
            nullable,
            omittable: nullable || default.is_some(),
            default: default.map(str::to_string),
            extra: String::new(),
        }
    }
}

impl Column {
    /// `TINYINT` … `BIGINT`, signed or not.
    pub(crate) fn is_integer(&self) -> bool {
        integer_max(&self.data_type, false).is_some()
    }

    pub(crate) fn is_unsigned(&self) -> bool {
        self.column_type.to_ascii_lowercase().contains("unsigned")
    }

    /// The type as DDL: `varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin`.
    pub(crate) fn type_sql(&self) -> String {
        let mut s = self.column_type.clone();
        if let Some(cs) = &self.charset {
            s.push_str(&format!(" CHARACTER SET {cs}"));
        }
        if let Some(coll) = &self.collation {
            s.push_str(&format!(" COLLATE {coll}"));
        }
        s
    }

    /// Same type, character set and collation.
    pub(crate) fn same_type(&self, other: &Column) -> bool {
        self.column_type.eq_ignore_ascii_case(&other.column_type)
            && opt_eq(&self.charset, &other.charset)
            && opt_eq(&self.collation, &other.collation)
    }
}

pub(crate) fn opt_eq(a: &Option<String>, b: &Option<String>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        (None, None) => true,
        _ => false,
    }
}

/// Largest value an integer `DATA_TYPE` holds; `None` for other types.
pub(crate) fn integer_max(data_type: &str, unsigned: bool) -> Option<u64> {
    let bits = match data_type.to_ascii_lowercase().as_str() {
        "tinyint" => 8,
        "smallint" => 16,
        "mediumint" => 24,
        "int" | "integer" => 32,
        "bigint" => 64,
        _ => return None,
    };
    Some(if unsigned {
        u64::MAX >> (64 - bits)
    } else {
        (u64::MAX >> (64 - bits)) >> 1
    })
}

/// A table as `information_schema` describes it.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    /// `TABLE_TYPE`: `BASE TABLE`, `VIEW`, …
    pub table_type: String,
    /// Storage engine (none for a view).
    pub engine: Option<String>,
    /// Default collation.
    pub collation: Option<String>,
    /// Default character set (from the collation).
    pub charset: Option<String>,
    /// Columns in table order.
    pub columns: Vec<Column>,
    /// Primary key columns in key order, when there is one.
    pub primary: Option<Vec<String>>,
    /// Unique keys (primary key included) that cover whole columns: name and columns.
    pub unique: Vec<(String, Vec<String>)>,
    /// Unique keys over a prefix of a column (`UNIQUE (name(10))`): name and columns.
    pub unique_prefix: Vec<(String, Vec<String>)>,
}

impl Table {
    /// Key column `k` of this (logical) table, `logical`: refused when it is missing
    /// or TEXT/BLOB, which the primary key of `physical` ("a ring table") cannot hold.
    pub(crate) fn key_column(
        &self,
        k: &str,
        logical: &TableName,
        physical: &str,
    ) -> std::result::Result<&Column, String> {
        let col = self
            .column(k)
            .ok_or_else(|| format!("key column `{k}` is not a column of {}", logical.quoted()))?;
        if col.data_type.contains("blob") || col.data_type.contains("text") {
            return Err(format!(
                "key column `{}` is {}, which {physical}'s primary key cannot hold",
                col.name, col.column_type
            ));
        }
        Ok(col)
    }

    pub(crate) fn column(&self, name: &str) -> Option<&Column> {
        self.columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
    }
}

pub(crate) fn text(row: &Row, i: usize) -> Option<String> {
    row.get_opt::<Option<String>, usize>(i)
        .and_then(|r| r.ok())
        .flatten()
}

/// Reads a table's description; `None` when it does not exist.
pub(crate) async fn inspect_table(conn: &mut Conn, t: &TableName) -> Result<Option<Table>> {
    let db = t.db.clone().unwrap_or_default();
    let name = t.name.clone();
    let what = || format!("reading the schema of {}", t.quoted());
    let rows: Vec<Row> = conn
        .exec(
            "SELECT t.TABLE_TYPE, t.ENGINE, t.TABLE_COLLATION, c.CHARACTER_SET_NAME \
             FROM information_schema.TABLES t \
             LEFT JOIN information_schema.COLLATIONS c ON c.COLLATION_NAME = t.TABLE_COLLATION \
             WHERE t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?",
            (db.clone(), name.clone()),
        )
        .await
        .map_err(|e| schema_err(what(), e))?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let mut table = Table {
        table_type: text(row, 0).unwrap_or_default(),
        engine: text(row, 1),
        collation: text(row, 2),
        charset: text(row, 3),
        columns: Vec::new(),
        primary: None,
        unique: Vec::new(),
        unique_prefix: Vec::new(),
    };
    let rows: Vec<Row> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME, \
                    IS_NULLABLE, COLUMN_DEFAULT, EXTRA \
             FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (db.clone(), name.clone()),
        )
        .await
        .map_err(|e| schema_err(what(), e))?;
    for row in &rows {
        let nullable = text(row, 5).is_some_and(|v| v.eq_ignore_ascii_case("YES"));
        let extra = text(row, 7).unwrap_or_default().to_ascii_lowercase();
        let default = text(row, 6);
        let has_default = default.is_some();
        table.columns.push(Column {
            name: text(row, 0).unwrap_or_default(),
            data_type: text(row, 1).unwrap_or_default().to_ascii_lowercase(),
            column_type: text(row, 2).unwrap_or_default(),
            charset: text(row, 3),
            collation: text(row, 4),
            nullable,
            omittable: nullable
                || has_default
                || extra.contains("auto_increment")
                || extra.contains("generated"),
            default,
            extra,
        });
    }
    let rows: Vec<Row> = conn
        .exec(
            "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART \
             FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0 \
             ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            (db, name),
        )
        .await
        .map_err(|e| schema_err(what(), e))?;
    // (name, columns, covers whole columns)
    let mut keys: Vec<(String, Vec<String>, bool)> = Vec::new();
    for row in &rows {
        let index = text(row, 0).unwrap_or_default();
        let column = text(row, 1).unwrap_or_default();
        let whole = text(row, 2).is_none();
        match keys.last_mut() {
            Some((n, cols, w)) if *n == index => {
                cols.push(column);
                *w &= whole;
            }
            _ => keys.push((index, vec![column], whole)),
        }
    }
    for (index, cols, whole) in keys {
        if index == "PRIMARY" {
            table.primary = Some(cols.clone());
        }
        match whole {
            true => table.unique.push((index, cols)),
            false => table.unique_prefix.push((index, cols)),
        }
    }
    Ok(Some(table))
}

/// Whether two column lists name the same set of columns.
pub(crate) fn same_set(a: &[String], b: &[String]) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|x| b.iter().any(|y| x.eq_ignore_ascii_case(y)))
        && b.iter()
            .all(|y| a.iter().any(|x| x.eq_ignore_ascii_case(y)))
}

/// What to do about the trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TriggerPlan {
    /// A counter without key columns: nothing to create.
    NotNeeded,
    /// The trigger exists with the expected body.
    Exists,
    /// Create it with this statement.
    Create(String),
    /// Replace an earlier form of it with this statement (`CREATE OR REPLACE`).
    Replace(String),
}

/// `<base><suffix>`, shortened with a hash of `base` when that would exceed 64
/// characters.
pub(crate) fn suffixed_name(base: &str, suffix: &str) -> String {
    let full = format!("{base}{suffix}");
    if full.len() <= MAX_IDENT {
        return full;
    }
    // FNV-1a: stable across builds and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in base.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let keep = MAX_IDENT - suffix.len() - 9;
    // Rule identifiers are ASCII, so any byte index is a character boundary.
    let prefix: String = base.chars().take(keep).collect();
    format!("{prefix}_{h:08x}{suffix}")
}

/// An existing trigger, as `information_schema.TRIGGERS` describes it.
pub(crate) struct ExistingTrigger {
    pub table: String,
    pub timing: String,
    pub event: String,
    pub body: String,
}

pub(crate) async fn existing_trigger(
    conn: &mut Conn,
    t: &TableName,
) -> Result<Option<ExistingTrigger>> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT EVENT_OBJECT_TABLE, ACTION_TIMING, EVENT_MANIPULATION, ACTION_STATEMENT \
             FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = ? AND TRIGGER_NAME = ?",
            (t.db.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(format!("reading trigger {}", t.quoted()), e))?;
    Ok(rows.first().map(|r| ExistingTrigger {
        table: text(r, 0).unwrap_or_default(),
        timing: text(r, 1).unwrap_or_default(),
        event: text(r, 2).unwrap_or_default(),
        body: text(r, 3).unwrap_or_default(),
    }))
}

/// The state of a trigger a rule keeps its tables with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TriggerState {
    /// Missing: create it.
    Missing,
    /// Exists with the expected body.
    Fits,
    /// Exists on the right table and event, with another body: left alone.
    Differs,
}

/// One `AFTER` trigger a rule keeps its tables with.
#[derive(Debug, Clone)]
pub(crate) struct NeededTrigger {
    pub name: TableName,
    /// The `CREATE TRIGGER` statement.
    pub create: String,
    pub state: TriggerState,
}

/// Trigger `name`, which must be `AFTER <event> ON <on>` with `body` (created by
/// `create`), as it is in the database. Refused when a trigger of that name is
/// something else (`rename`: what to rename instead, "the mailbox").
pub(crate) async fn needed_trigger(
    conn: &mut Conn,
    name: TableName,
    (on, event): (&TableName, &str),
    body: &str,
    create: String,
    rename: &str,
) -> std::result::Result<NeededTrigger, SchemaError> {
    let state = match existing_trigger(conn, &name).await? {
        None => TriggerState::Missing,
        Some(t) => {
            let fits = t.table.eq_ignore_ascii_case(&on.name)
                && t.timing.eq_ignore_ascii_case("AFTER")
                && t.event.eq_ignore_ascii_case(event);
            if !fits {
                return Err(SchemaError::Refused(format!(
                    "trigger {} exists but is not `AFTER {event} ON {}`; drop it or rename {rename}",
                    name.quoted(),
                    on.quoted()
                )));
            }
            if normalize(&t.body) == normalize(body) {
                TriggerState::Fits
            } else {
                TriggerState::Differs
            }
        }
    };
    Ok(NeededTrigger {
        name,
        create,
        state,
    })
}

/// Prints a line for each of `triggers` that exists (with a note when its body
/// differs) and returns the `CREATE TRIGGER` statements of the missing ones.
pub(crate) fn existing_and_missing<'a>(
    triggers: &'a [NeededTrigger],
    out: &mut dyn Write,
) -> Result<Vec<&'a str>> {
    for t in triggers.iter().filter(|t| t.state != TriggerState::Missing) {
        let differs = if t.state == TriggerState::Differs {
            " but differs from the rule's; left as it is (drop it and run migrate again to replace it)"
        } else {
            ""
        };
        emit(
            out,
            &format!("-- trigger {} exists{differs}", t.name.quoted()),
        )?;
    }
    Ok(triggers
        .iter()
        .filter(|t| t.state == TriggerState::Missing)
        .map(|t| t.create.as_str())
        .collect())
}

/// What to do about `name`, a trigger of a ring rule that must be `<timing> INSERT
/// ON <table>` (`on`) with `body`: create it with `create` when it is missing; keep
/// one that exists (with a note when its body differs). `Err(reason)` when a trigger
/// of that name does something else.
pub(crate) async fn plan_insert_trigger(
    conn: &mut Conn,
    name: &TableName,
    (on, timing): (&TableName, &str),
    body: &str,
    create: String,
    notes: &mut Vec<String>,
) -> Result<std::result::Result<TriggerPlan, String>> {
    let Some(t) = existing_trigger(conn, name).await? else {
        return Ok(Ok(TriggerPlan::Create(create)));
    };
    let fits = t.table.eq_ignore_ascii_case(&on.name)
        && t.timing.eq_ignore_ascii_case(timing)
        && t.event.eq_ignore_ascii_case("INSERT");
    if !fits {
        return Ok(Err(format!(
            "trigger {} exists but is not `{timing} INSERT ON {}`; drop it or rename the ring table",
            name.quoted(),
            on.quoted()
        )));
    }
    if normalize(&t.body) != normalize(body) {
        notes.push(format!(
            "trigger {} exists with another body; left as it is (drop it and run migrate again to replace it)",
            name.quoted()
        ));
    }
    Ok(Ok(TriggerPlan::Exists))
}

/// Collapses whitespace and case for comparing SQL text.
pub(crate) fn normalize(sql: &str) -> String {
    sql.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches(';')
        .to_ascii_lowercase()
}

/// Values of a row, NULL for missing cells.
pub(crate) fn values(row: Row) -> Vec<Value> {
    row.unwrap_raw()
        .into_iter()
        .map(|v| v.unwrap_or(Value::NULL))
        .collect()
}

/// Whether a query returns at least one row.
pub(crate) async fn has_rows(conn: &mut Conn, sql: String, what: String) -> Result<bool> {
    let rows: Vec<Row> = conn.query(sql).await.map_err(|e| schema_err(what, e))?;
    Ok(!rows.is_empty())
}

/// Whether table `t` holds a row.
pub(crate) async fn table_has_rows(conn: &mut Conn, t: &TableName) -> Result<bool> {
    has_rows(
        conn,
        format!("SELECT 1 FROM {} LIMIT 1", t.quoted()),
        format!("reading {}", t.quoted()),
    )
    .await
}

/// Runs one statement, mapping failures to a backend error naming the rule.
pub(crate) async fn run_sql(conn: &mut Conn, rule: &str, sql: &str) -> Result<u64> {
    conn.query_drop(sql).await.map_err(|e| {
        Error::with_cause(
            Source::Backend,
            format!("rule {rule}: executing `{sql}`"),
            e,
        )
    })?;
    Ok(conn.affected_rows())
}

/// Runs `sql`s in order, stopping at the first failure.
pub(crate) async fn run_all(conn: &mut Conn, rule: &str, sql: &[&str]) -> Result<Vec<u64>> {
    let mut affected = Vec::with_capacity(sql.len());
    for s in sql {
        affected.push(run_sql(conn, rule, s).await?);
    }
    Ok(affected)
}

/// The id an insert into `t` would generate for its AUTO_INCREMENT column `col`: the
/// table's counter, and at least one above the largest id present.
pub(crate) async fn next_id(conn: &mut Conn, t: &TableName, col: &str) -> Result<u64> {
    let what = || format!("reading the AUTO_INCREMENT counter of {}", t.quoted());
    let rows: Vec<Row> = conn
        .exec(
            "SELECT AUTO_INCREMENT FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (t.db.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(what(), e))?;
    let counter = rows
        .first()
        .and_then(|r| r.get_opt::<u64, usize>(0))
        .and_then(|r| r.ok())
        .unwrap_or(1);
    let rows: Vec<Row> = conn
        .query(format!(
            "SELECT GREATEST(COALESCE(MAX({}), 0), 0) + 1 FROM {}",
            quote(col),
            t.quoted()
        ))
        .await
        .map_err(|e| schema_err(what(), e))?;
    let above_max = rows
        .first()
        .and_then(|r| r.get_opt::<u64, usize>(0))
        .and_then(|r| r.ok())
        .unwrap_or(1);
    Ok(counter.max(above_max))
}

pub(crate) fn is_in(cols: &[String], name: &str) -> bool {
    cols.iter().any(|c| c.eq_ignore_ascii_case(name))
}

/// The `ON UPDATE` expression of a column's `EXTRA`, if any.
pub(crate) fn on_update(extra: &str) -> Option<&str> {
    let at = extra.find("on update ")?;
    let rest = &extra[at + "on update ".len()..];
    let end = rest.find(',').unwrap_or(rest.len());
    Some(rest[..end].trim()).filter(|s| !s.is_empty())
}

/// `ENGINE=InnoDB` and the log's default character set and collation.
pub(crate) fn table_options(logical: &Table) -> String {
    let mut options = "ENGINE=InnoDB".to_string();
    if let Some(cs) = &logical.charset {
        options.push_str(&format!(" DEFAULT CHARSET={cs}"));
    }
    if let Some(coll) = &logical.collation {
        options.push_str(&format!(" COLLATE={coll}"));
    }
    options
}

/// Whether the server is a Galera node (`wsrep_on = ON`): `GET_LOCK` and
/// `LOCK TABLES` then hold only on that node, and rows written through several nodes
/// at once fail certification.
pub(crate) async fn on_galera(conn: &mut Conn) -> Result<bool> {
    let row: Option<(String, String)> = conn
        .query_first("SHOW VARIABLES LIKE 'wsrep_on'")
        .await
        .map_err(|e| Error::with_cause(Source::Backend, "reading wsrep_on", e))?;
    Ok(row.is_some_and(|(_, v)| v.eq_ignore_ascii_case("ON")))
}

/// Whether the server has `INSERT … RETURNING` (MariaDB ≥ 10.5).
pub(crate) async fn has_returning(conn: &mut Conn) -> Result<bool> {
    let version: Option<String> = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| Error::with_cause(Source::Backend, "reading the server version", e))?;
    Ok(version.is_some_and(|v| crate::wire::handshake::has_returning(&v)))
}

/// Resolves a rule's logical table (`table` as written) and its physical tables
/// (`physical`, as written) to databases: the rule's prefix, else `default_db` (the
/// URL's) for the logical table, and the logical table's database for an unqualified
/// physical table (it lives next to it). Refused when a name is invalid or no
/// database is known.
pub(crate) fn resolve_tables(
    table: &str,
    physical: &[&str],
    default_db: Option<&str>,
) -> std::result::Result<(TableName, Vec<TableName>), SchemaError> {
    let refuse = SchemaError::Refused;
    let mut logical = TableName::parse(table).map_err(refuse)?;
    if logical.db.is_none() {
        logical.db = Some(default_db.map(str::to_string).ok_or_else(|| {
            refuse(format!(
                "table `{table}` names no database and --backend-url has none"
            ))
        })?);
    }
    let mut out = Vec::with_capacity(physical.len());
    for p in physical {
        let mut t = TableName::parse(p).map_err(refuse)?;
        if t.db.is_none() {
            t.db = logical.db.clone();
        }
        out.push(t);
    }
    Ok((logical, out))
}

/// Reads a rule's logical table; refused when it is missing or not a base table.
pub(crate) async fn inspect_base_table(
    conn: &mut Conn,
    t: &TableName,
) -> std::result::Result<Table, SchemaError> {
    let refuse = SchemaError::Refused;
    let Some(table) = inspect_table(conn, t).await? else {
        return Err(refuse(format!("table {} does not exist", t.quoted())));
    };
    if !table.table_type.eq_ignore_ascii_case("BASE TABLE") {
        return Err(refuse(format!(
            "{} is a {}, not a base table",
            t.quoted(),
            table.table_type
        )));
    }
    Ok(table)
}

/// What is wrong with the key columns of an existing physical table `existing`
/// against the logical table's `key` columns (`whose`: "the log's", "the logical
/// table's"): a missing column, or one of another type.
pub(crate) fn key_column_problems(existing: &Table, key: &[Column], whose: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for k in key {
        match existing.column(&k.name) {
            None => problems.push(format!("key column `{}` is missing", k.name)),
            Some(c) if !c.same_type(k) => problems.push(format!(
                "key column `{}` is {} but {whose} is {}",
                k.name,
                c.type_sql(),
                k.type_sql()
            )),
            Some(_) => {}
        }
    }
    problems
}

/// A foreign key, as `information_schema.REFERENTIAL_CONSTRAINTS` and
/// `KEY_COLUMN_USAGE` describe it.
#[derive(Debug, Clone)]
pub(crate) struct ForeignKey {
    /// The constraint's name (unique in its database).
    pub name: String,
    /// The table holding the constraint (the child).
    pub child: TableName,
    /// Its columns in the child, in key order.
    pub columns: Vec<String>,
    /// The referenced table (the parent).
    pub parent: TableName,
    /// The referenced columns, in key order.
    pub parent_columns: Vec<String>,
    /// `DELETE_RULE`: `RESTRICT`, `NO ACTION`, `CASCADE`, `SET NULL`, `SET DEFAULT`.
    pub on_delete: String,
    /// `UPDATE_RULE`, as `on_delete`.
    pub on_update: String,
}

/// Whether a referential action changes the child's rows (rather than refusing).
pub(crate) fn changes_rows(action: &str) -> bool {
    !matches!(
        action.to_ascii_uppercase().as_str(),
        "RESTRICT" | "NO ACTION" | ""
    )
}

impl ForeignKey {
    /// Whether deleting or updating a parent row changes this child's rows
    /// (`CASCADE`, `SET NULL`, `SET DEFAULT`): the server does that without firing the
    /// child's triggers.
    pub(crate) fn changes_child(&self) -> bool {
        changes_rows(&self.on_delete) || changes_rows(&self.on_update)
    }

    /// `` `fk` (`c`) REFERENCES `db`.`p` (`id`) ON DELETE CASCADE ON UPDATE … ``, for
    /// messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} ({}) REFERENCES {} ({}) ON DELETE {} ON UPDATE {}",
            quote(&self.name),
            list(&self.columns),
            self.parent.quoted(),
            list(&self.parent_columns),
            self.on_delete,
            self.on_update
        )
    }

    /// The constraint as a `CREATE TABLE` element, named `name`.
    pub(crate) fn definition(&self, name: &str) -> String {
        format!(
            "CONSTRAINT {} FOREIGN KEY ({}) REFERENCES {} ({}) ON DELETE {} ON UPDATE {}",
            quote(name),
            list(&self.columns),
            self.parent.quoted(),
            list(&self.parent_columns),
            self.on_delete,
            self.on_update
        )
    }
}

/// A CHECK constraint, as `information_schema.CHECK_CONSTRAINTS` describes it.
#[derive(Debug, Clone)]
pub(crate) struct CheckConstraint {
    /// The constraint's name (a column-level CHECK is named after its column).
    pub name: String,
    /// `Column` or `Table`.
    pub level: String,
    /// The expression, as the server prints it (`` `cnt` <= 1000000 ``).
    pub clause: String,
}

impl CheckConstraint {
    /// The constraint as a `CREATE TABLE` element: table-level, same name (so the
    /// server's message names the same constraint).
    pub(crate) fn definition(&self) -> String {
        format!("CONSTRAINT {} CHECK ({})", quote(&self.name), self.clause)
    }

    /// Whether the expression reads column `col` (the server prints column
    /// references quoted).
    pub(crate) fn reads(&self, col: &str) -> bool {
        let quoted = quote(col).to_ascii_lowercase();
        self.clause.to_ascii_lowercase().contains(&quoted)
            || (self.level.eq_ignore_ascii_case("Column") && self.name.eq_ignore_ascii_case(col))
    }
}

/// A trigger on a table, as `information_schema.TRIGGERS` describes it.
#[derive(Debug, Clone)]
pub(crate) struct TableTrigger {
    pub name: TableName,
    /// `BEFORE` or `AFTER`.
    pub timing: String,
    /// `INSERT`, `UPDATE` or `DELETE`.
    pub event: String,
    /// `ACTION_STATEMENT`: the body.
    pub body: String,
}

impl TableTrigger {
    /// `` `db`.`t_bi` (BEFORE INSERT) ``, for messages.
    pub(crate) fn describe(&self) -> String {
        format!("{} ({} {})", self.name.quoted(), self.timing, self.event)
    }
}

/// What a table enforces or sets off besides its columns' types: its CHECK
/// constraints, its foreign keys (as child and as parent) and its triggers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Enforced {
    pub checks: Vec<CheckConstraint>,
    /// Foreign keys of the table (it is the child).
    pub foreign_keys: Vec<ForeignKey>,
    /// Foreign keys of other tables (or itself) that reference it.
    pub referenced_by: Vec<ForeignKey>,
    /// Its triggers, in the order they fire per timing and event.
    pub triggers: Vec<TableTrigger>,
}

impl Enforced {
    /// Its foreign keys that change its rows when a parent row is deleted or updated.
    pub(crate) fn changing_foreign_keys(&self) -> impl Iterator<Item = &ForeignKey> {
        self.foreign_keys.iter().filter(|f| f.changes_child())
    }

    /// Its triggers other than those named in `own` (the rule's own).
    pub(crate) fn other_triggers<'a>(
        &'a self,
        own: &'a [&'a str],
    ) -> impl Iterator<Item = &'a TableTrigger> {
        self.triggers
            .iter()
            .filter(move |t| !own.iter().any(|o| t.name.name.eq_ignore_ascii_case(o)))
    }
}

/// Reads what table `t` enforces: CHECK constraints, foreign keys both ways,
/// triggers.
pub(crate) async fn enforced(conn: &mut Conn, t: &TableName) -> Result<Enforced> {
    let db = t.db.clone().unwrap_or_default();
    let what = || format!("reading the constraints and triggers of {}", t.quoted());
    let rows: Vec<Row> = conn
        .exec(
            "SELECT CONSTRAINT_NAME, LEVEL, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS \
             WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ? ORDER BY CONSTRAINT_NAME",
            (db.clone(), t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(what(), e))?;
    let checks = rows
        .iter()
        .map(|r| CheckConstraint {
            name: text(r, 0).unwrap_or_default(),
            level: text(r, 1).unwrap_or_default(),
            clause: text(r, 2).unwrap_or_default(),
        })
        .collect();
    let child_side = foreign_keys(conn, "k.TABLE_SCHEMA = ? AND k.TABLE_NAME = ?", t).await?;
    let referenced_by = foreign_keys(
        conn,
        "k.REFERENCED_TABLE_SCHEMA = ? AND k.REFERENCED_TABLE_NAME = ?",
        t,
    )
    .await?;
    let rows: Vec<Row> = conn
        .exec(
            "SELECT TRIGGER_SCHEMA, TRIGGER_NAME, ACTION_TIMING, EVENT_MANIPULATION, ACTION_STATEMENT \
             FROM information_schema.TRIGGERS \
             WHERE EVENT_OBJECT_SCHEMA = ? AND EVENT_OBJECT_TABLE = ? \
             ORDER BY ACTION_TIMING, EVENT_MANIPULATION, ACTION_ORDER",
            (db, t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(what(), e))?;
    let triggers = rows
        .iter()
        .map(|r| TableTrigger {
            name: TableName {
                db: text(r, 0),
                name: text(r, 1).unwrap_or_default(),
            },
            timing: text(r, 2).unwrap_or_default(),
            event: text(r, 3).unwrap_or_default(),
            body: text(r, 4).unwrap_or_default(),
        })
        .collect();
    Ok(Enforced {
        checks,
        foreign_keys: child_side,
        referenced_by,
        triggers,
    })
}

/// Foreign keys whose `KEY_COLUMN_USAGE` rows (alias `k`) match `filter` with `t`'s
/// database and name.
async fn foreign_keys(conn: &mut Conn, filter: &str, t: &TableName) -> Result<Vec<ForeignKey>> {
    let sql = format!(
        "SELECT k.CONSTRAINT_SCHEMA, k.CONSTRAINT_NAME, k.TABLE_NAME, k.COLUMN_NAME, \
                k.REFERENCED_TABLE_SCHEMA, k.REFERENCED_TABLE_NAME, k.REFERENCED_COLUMN_NAME, \
                r.DELETE_RULE, r.UPDATE_RULE \
         FROM information_schema.KEY_COLUMN_USAGE k \
         JOIN information_schema.REFERENTIAL_CONSTRAINTS r \
           ON r.CONSTRAINT_SCHEMA = k.CONSTRAINT_SCHEMA AND r.CONSTRAINT_NAME = k.CONSTRAINT_NAME \
          AND r.TABLE_NAME = k.TABLE_NAME \
         WHERE {filter} AND k.REFERENCED_TABLE_NAME IS NOT NULL \
         ORDER BY k.CONSTRAINT_SCHEMA, k.TABLE_NAME, k.CONSTRAINT_NAME, k.ORDINAL_POSITION"
    );
    let rows: Vec<Row> = conn
        .exec(sql, (t.db.clone().unwrap_or_default(), t.name.clone()))
        .await
        .map_err(|e| schema_err(format!("reading the foreign keys of {}", t.quoted()), e))?;
    let mut out: Vec<ForeignKey> = Vec::new();
    for r in &rows {
        let (db, name, table) = (text(r, 0), text(r, 1).unwrap_or_default(), text(r, 2));
        let column = text(r, 3).unwrap_or_default();
        let parent_column = text(r, 6).unwrap_or_default();
        if let Some(fk) = out
            .last_mut()
            .filter(|f| f.name == name && f.child.db == db && Some(&f.child.name) == table.as_ref())
        {
            fk.columns.push(column);
            fk.parent_columns.push(parent_column);
            continue;
        }
        out.push(ForeignKey {
            name,
            child: TableName {
                db: db.clone(),
                name: table.unwrap_or_default(),
            },
            columns: vec![column],
            parent: TableName {
                db: text(r, 4),
                name: text(r, 5).unwrap_or_default(),
            },
            parent_columns: vec![parent_column],
            on_delete: text(r, 7).unwrap_or_default(),
            on_update: text(r, 8).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Refuses a table whose foreign keys change its rows behind its triggers' back
/// (`ON DELETE CASCADE`, `SET NULL`, …: the server applies them without firing the
/// child's triggers), when `kept` says what those triggers keep ("the rollup table
/// `db`.`r`"). The reason names the constraint and what to do.
pub(crate) fn refuse_changing_foreign_keys(
    table: &TableName,
    enforced: &Enforced,
    kept: &str,
) -> std::result::Result<(), SchemaError> {
    let Some(fk) = enforced.changing_foreign_keys().next() else {
        return Ok(());
    };
    Err(SchemaError::Refused(format!(
        "foreign key {} of {} changes its rows when a row of {} is deleted or updated, and \
         the server does that without firing triggers, so {kept} would go stale: make it \
         ON DELETE RESTRICT ON UPDATE RESTRICT (and delete or update the rows of {} \
         explicitly before the parent row), or drop the rule",
        fk.describe(),
        table.quoted(),
        fk.parent.quoted(),
        table.quoted()
    )))
}

/// Privileges a user holds on the logical table that a rule's physical table needs
/// as well: who may read the logical table must read a table the rule's reads use;
/// who may write it (any of `INSERT`, `UPDATE`, `DELETE`) must read and write a
/// table the rule's writes use.
fn needed_privileges(held: &[String], access: SideAccess) -> Vec<&'static str> {
    let has = |p: &str| held.iter().any(|h| h.eq_ignore_ascii_case(p));
    let writes = ["INSERT", "UPDATE", "DELETE"].iter().any(|p| has(p));
    match access {
        SideAccess::Write if writes => vec!["SELECT", "INSERT", "UPDATE", "DELETE"],
        _ if has("SELECT") => vec!["SELECT"],
        _ => Vec::new(),
    }
}

/// A grant a user lacks on one of a rule's physical tables.
#[derive(Debug, Clone)]
pub(crate) struct MissingGrant {
    /// `GRANTEE` as `information_schema` spells it: `'app'@'%'`, `'role'@''`.
    pub grantee: String,
    /// The logical table the user holds privileges on.
    pub logical: TableName,
    /// The rule's physical table.
    pub table: TableName,
    /// The privileges to grant.
    pub privileges: Vec<&'static str>,
}

impl MissingGrant {
    /// The `GRANT` statement (a role, whose host is empty, by its name alone).
    pub(crate) fn sql(&self) -> String {
        let to = self
            .grantee
            .strip_suffix("@''")
            .unwrap_or(&self.grantee)
            .to_string();
        format!(
            "GRANT {} ON {} TO {to}",
            self.privileges.join(", "),
            self.table.quoted()
        )
    }

    /// What `check` says about it.
    pub(crate) fn describe(&self) -> String {
        format!(
            "user {} may use {} but lacks {} on {}, which heatsink's statements for it use \
             (they would fail with 1142): `heatsink migrate --apply` grants it, or run `{}`",
            self.grantee,
            self.logical.quoted(),
            self.privileges.join(", "),
            self.table.quoted(),
            self.sql()
        )
    }
}

/// `(grantee, privilege)` rows of a query over an `information_schema` privilege
/// table, with `params` for its `?`s.
async fn privileges(
    conn: &mut Conn,
    sql: &str,
    params: Vec<Value>,
) -> Result<Vec<(String, String)>> {
    let rows: Vec<Row> = conn
        .exec(sql, params)
        .await
        .map_err(|e| schema_err("reading privileges from information_schema".into(), e))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                text(r, 0).unwrap_or_default(),
                text(r, 1).unwrap_or_default(),
            )
        })
        .collect())
}

/// The grants users lack on a rule's physical tables (`side`, databases resolved,
/// with how heatsink's statements use them), judged by their table-level privileges
/// on the logical table. A privilege held on the physical table, on its database or
/// globally counts as held. Grants on the database or globally reach the physical
/// tables anyway, so only table-level grantees can lack anything. Reads the
/// `information_schema` privilege tables, which show every user's grants only to a
/// user who may read the grant tables (else only its own).
pub(crate) async fn missing_grants(
    conn: &mut Conn,
    logical: &TableName,
    side: &[(TableName, SideAccess)],
) -> Result<Vec<MissingGrant>> {
    let db = logical.db.clone().unwrap_or_default();
    let held = privileges(
        conn,
        "SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.TABLE_PRIVILEGES \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY GRANTEE",
        vec![db.into(), logical.name.as_str().into()],
    )
    .await?;
    let mut grantees: Vec<&str> = held.iter().map(|(g, _)| g.as_str()).collect();
    grantees.dedup();
    let global = privileges(
        conn,
        "SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES",
        Vec::new(),
    )
    .await?;
    let mut out = Vec::new();
    for (table, access) in side {
        let tdb = table.db.clone().unwrap_or_default();
        let mut covered = privileges(
            conn,
            "SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.TABLE_PRIVILEGES \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            vec![tdb.as_str().into(), table.name.as_str().into()],
        )
        .await?;
        covered.extend(
            privileges(
                conn,
                "SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES \
                 WHERE TABLE_SCHEMA = ?",
                vec![tdb.into()],
            )
            .await?,
        );
        covered.extend(global.iter().cloned());
        for g in &grantees {
            let mine: Vec<String> = held
                .iter()
                .filter(|(h, _)| h == g)
                .map(|(_, p)| p.clone())
                .collect();
            let lacking: Vec<&'static str> = needed_privileges(&mine, *access)
                .into_iter()
                .filter(|p| {
                    !covered
                        .iter()
                        .any(|(cg, cp)| cg == g && cp.eq_ignore_ascii_case(p))
                })
                .collect();
            if !lacking.is_empty() {
                out.push(MissingGrant {
                    grantee: g.to_string(),
                    logical: logical.clone(),
                    table: table.clone(),
                    privileges: lacking,
                });
            }
        }
    }
    Ok(out)
}

/// [`missing_grants`] for a rule: its logical `table` and its physical tables the
/// application's statements use (`side`, a rule's `client_tables`), resolved to
/// databases (`default_db` holds unqualified tables). A rule whose names cannot be
/// resolved needs nothing here (its schema check refuses it).
pub(crate) async fn rule_missing_grants(
    conn: &mut Conn,
    table: &str,
    side: &[(String, SideAccess)],
    default_db: Option<&str>,
) -> Result<Vec<MissingGrant>> {
    if side.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = side.iter().map(|(t, _)| t.as_str()).collect();
    let Ok((logical, tables)) = resolve_tables(table, &names, default_db) else {
        return Ok(Vec::new());
    };
    let side: Vec<_> = tables
        .into_iter()
        .zip(side.iter().map(|(_, a)| *a))
        .collect();
    missing_grants(conn, &logical, &side).await
}

/// How statements heatsink runs for the application use one of a rule's physical
/// tables (`crate::kinds::RuleSpec::client_tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideAccess {
    /// Read by rewritten reads: who may `SELECT` the logical table needs `SELECT`.
    Read,
    /// Also written by rewritten writes (upserts, deletes of slot rows): who may
    /// `INSERT`, `UPDATE` or `DELETE` the logical table needs `SELECT, INSERT, UPDATE,
    /// DELETE`, whatever the write (an insert into a ring is an upsert).
    Write,
}

/// Why `crate::kinds::RuleSpec::schema` did not produce a migration.
#[derive(Debug)]
pub enum SchemaError {
    /// The tables do not fit the rule; the reason is a DBA's to act on.
    Refused(String),
    /// The database could not be read (or another failure unrelated to the rule).
    Failed(crate::error::Error),
}

impl From<crate::error::Error> for SchemaError {
    fn from(e: crate::error::Error) -> Self {
        SchemaError::Failed(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_tables_get_what_the_logical_table_allows() {
        use SideAccess::{Read, Write};
        let held = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(needed_privileges(&held(&["SELECT"]), Write), ["SELECT"]);
        assert_eq!(
            needed_privileges(&held(&["INSERT"]), Write),
            ["SELECT", "INSERT", "UPDATE", "DELETE"]
        );
        assert_eq!(
            needed_privileges(&held(&["INSERT"]), Read),
            Vec::<&str>::new()
        );
        assert_eq!(
            needed_privileges(&held(&["SELECT", "INSERT"]), Read),
            ["SELECT"]
        );
        let g = MissingGrant {
            grantee: "'r1'@''".into(),
            logical: TableName::parse("d.t").unwrap(),
            table: TableName::parse("d.t_slots").unwrap(),
            privileges: vec!["SELECT"],
        };
        assert_eq!(g.sql(), "GRANT SELECT ON `d`.`t_slots` TO 'r1'");
    }

    #[test]
    fn integer_ranges() {
        assert_eq!(integer_max("tinyint", true), Some(255));
        assert_eq!(integer_max("smallint", false), Some(32767));
        assert_eq!(integer_max("bigint", true), Some(u64::MAX));
        assert_eq!(integer_max("decimal", false), None);
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact("mysql://u:secret@127.0.0.1:3306/db"),
            "mysql://u@127.0.0.1:3306/db"
        );
        assert_eq!(redact("mysql://127.0.0.1/db"), "mysql://127.0.0.1/db");
    }

    #[test]
    fn sql_comparison_ignores_layout() {
        assert_eq!(
            normalize("INSERT  IGNORE\n INTO x;"),
            normalize("insert ignore into x")
        );
    }
}
