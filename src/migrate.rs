//! `heatsink migrate`: the schema objects counter and ring rules need.
//!
//! A `[[counter]]` rule keeps the application's table as the counter's base value and
//! spreads increments over a slot table (see [`crate::rewrite::counter`]). For every
//! counter rule this command reads the logical table from `information_schema`, checks
//! that the rule fits it, and prints the DDL that creates:
//!
//! 1. the slot table: the key columns with exactly the logical table's types
//!    (character set and collation included, so the join on the key compares the same
//!    way), the slot number column, one `BIGINT NOT NULL DEFAULT 0` column per counter
//!    (deltas may be negative), `PRIMARY KEY (key…, slot)`, InnoDB, the logical
//!    table's default character set and collation;
//! 2. the trigger `<slot_table>_hs_ai`, `AFTER INSERT` on the slot table, which inserts
//!    the logical row (counters at 0) when an increment names a key that has none yet.
//!    A counter without key columns needs no trigger: its logical table must hold its
//!    one row.
//!
//! The rule is refused (nothing is printed or created for any rule) when the logical
//! table is missing, a key or counter column is missing, a counter column is not an
//! integer, the key columns are not exactly the primary key or a unique key (then
//! `INSERT IGNORE` would not create exactly one row per key), or an existing slot table
//! or trigger does not match what the rule needs.
//!
//! With `--apply` the statements are executed. They are idempotent (`IF NOT EXISTS`),
//! so running the command twice is harmless; objects that already exist and match are
//! reported and left alone.
//!
//! The database of a table is the rule's `db.` prefix, else the database of
//! `--backend-url`. An unqualified slot table lives next to its logical table.
//!
//! The checks are shared with [`crate::kinds::counter::compact`], which refuses to touch a rule whose
//! tables do not fit it.
//!
//! ## Ring rules
//!
//! A `[[ring]]` rule stores a "keep the last N per key" log as fixed-size rings (see
//! [`crate::rewrite::ring`]). From the logical (log) table the command derives:
//!
//! 1. the ring table: every logical column with its exact type, character set,
//!    collation, nullability, default, `ON UPDATE` and `AUTO_INCREMENT` (the log's
//!    `AUTO_INCREMENT` column gets a secondary `KEY (<ai>)`), but without the log's
//!    keys; then `<slot_column> SMALLINT UNSIGNED NOT NULL` (`INT UNSIGNED` when
//!    `size` > 65535) and `<seq_column> BIGINT UNSIGNED NOT NULL`, neither with a
//!    default; `PRIMARY KEY (key…, slot)`. Key columns are `NOT NULL` there even when
//!    the log's are nullable (rows with a NULL key cannot be kept);
//! 2. the sequence table: the key columns (exact types), `<seq_column> BIGINT UNSIGNED
//!    NOT NULL`, `PRIMARY KEY (key…)`. A ring without key columns has one sequence
//!    row, held in place by a `single_row` column whose default every insert repeats;
//! 3. `<ring_table>_hs_seq`, a `BEFORE INSERT` trigger on the ring table that numbers
//!    every row inserted into it: it takes the key's next sequence number from the
//!    sequence table (`INSERT … VALUES (NEW.k…, LAST_INSERT_ID(1)) ON DUPLICATE KEY
//!    UPDATE seq = LAST_INSERT_ID(seq + 1)`, read back with `LAST_INSERT_ID()`, which
//!    MariaDB restores when the trigger ends) and sets `seq` and `slot = seq % size`.
//!    The rule's inserts give both as NULL, so without the trigger they fail (1048)
//!    instead of filling slot 0;
//! 4. the trigger on the log described below.
//!
//! The rule is refused when the log is missing or not a base table, a key column is
//! missing or TEXT/BLOB, the slot or sequence column name is already a logical column,
//! `order_by` is not a column, the log has generated columns (ring inserts assign
//! every column), an existing ring or sequence table does not fit (for instance the
//! log's `AUTO_INCREMENT` column is not `AUTO_INCREMENT` in the ring), or a trigger of
//! one of the two names exists that is not `BEFORE INSERT` on the ring, respectively
//! `AFTER INSERT` on the log.
//!
//! **Backfill and the switch.** With `--apply`, when the ring table is new (or it and
//! the sequence table are both empty, e.g. after an interrupted backfill) and the log
//! has rows, each key's latest `size` rows are copied into the ring: "latest" by
//! `order_by` then the primary key, or by the primary key alone. A copied row keeps
//! its id; its sequence number is its position in the key's full history
//! (`ROW_NUMBER()` over the key, oldest first) and its slot that number modulo
//! `size`; the sequence table gets each key's row count, so new inserts continue after
//! the history. The backfill runs before `<ring_table>_hs_seq` exists (the trigger
//! would renumber the copied rows; an existing one is dropped for the backfill and
//! created again). Then the ring's `AUTO_INCREMENT` counter is raised to the log's
//! (`ALTER TABLE … AUTO_INCREMENT`) when it is lower, so ids keep increasing across the
//! switch and inserts through heatsink report the ids the log would have given.
//!
//! Clients rarely all move to heatsink at the same instant, so the command also
//! installs `<ring_table>_hs_log`, an `AFTER INSERT` trigger on the log that mirrors a
//! row appended to the log directly into the ring: the row with its id, slot and
//! sequence NULL (the ring's trigger numbers it) and the rule's guarded upsert; rows
//! with a NULL key are skipped; the appending client's `LAST_INSERT_ID()` is untouched.
//! The backfill, the counter and both triggers' creation happen under `LOCK TABLES log
//! WRITE, ring WRITE, seq WRITE`, so every row appended to the log is counted exactly
//! once, backfilled or mirrored: the rule can be switched on while the application
//! keeps inserting, and no row that belongs in the latest N is lost. Appends and reads
//! of the log wait for the backfill. Once every client goes through heatsink nothing
//! appends to the log any more and the trigger is idle; it keeps the ring in step with
//! writers that bypass heatsink.

use std::io::Write;
use std::path::Path;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Row, Value};

use crate::error::{Error, Result, Source};
use crate::rules::spec::{quote, CounterSpec, RingSpec, TableName};

/// Suffix of the trigger that creates missing logical rows.
pub const TRIGGER_SUFFIX: &str = "_hs_ai";

/// Suffix of the trigger on a ring rule's log that mirrors direct appends into the ring.
pub const RING_TRIGGER_SUFFIX: &str = "_hs_log";

/// Suffix of the trigger on a ring table that numbers its rows (sequence and slot).
pub const SEQ_TRIGGER_SUFFIX: &str = "_hs_seq";

/// Longest identifier MySQL/MariaDB accept.
const MAX_IDENT: usize = 64;

/// What `heatsink migrate` was asked to do.
#[derive(Debug, Clone)]
pub struct MigrateOptions<'a> {
    /// Rule file or directory of rule files.
    pub rules: &'a Path,
    /// `mysql://user:pw@host:port/db` of the database the rules apply to.
    pub backend_url: &'a str,
    /// Execute the statements instead of only printing them.
    pub apply: bool,
    /// Only this rule, when given.
    pub rule: Option<&'a str>,
}

/// Checks every counter and ring rule under `opts.rules` against the database and
/// prints (and, with `apply`, executes) the DDL it needs. Nothing is executed unless
/// every selected rule passes its checks.
pub async fn run(opts: &MigrateOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let counters = crate::rules::counter_specs(opts.rules)?;
    let rings = ring_specs(opts.rules)?;
    let (specs, rings) = match opts.rule {
        None => (counters, rings),
        Some(name) => {
            let counters: Vec<CounterSpec> =
                counters.into_iter().filter(|s| s.name == name).collect();
            let rings: Vec<RingSpec> = rings.into_iter().filter(|s| s.name == name).collect();
            if counters.is_empty() && rings.is_empty() {
                return Err(Error::new(
                    Source::Rules,
                    format!("no counter or ring rule named '{name}'"),
                ));
            }
            (counters, rings)
        }
    };
    if specs.is_empty() && rings.is_empty() {
        emit(out, "-- no counter or ring rules: nothing to migrate")?;
        return Ok(());
    }
    let mut conn = connect(opts.backend_url).await?;
    let default_db = default_db(opts.backend_url)?;
    let mut checked = Vec::with_capacity(specs.len());
    let mut checked_rings = Vec::with_capacity(rings.len());
    let mut refused = Vec::new();
    for spec in &specs {
        match check_rule(&mut conn, spec, default_db.as_deref()).await {
            Ok(c) => checked.push(c),
            Err(e) if e.source == Source::Rules => refused.push(e.context),
            Err(e) => return Err(e),
        }
    }
    for spec in &rings {
        match check_ring(&mut conn, spec, default_db.as_deref()).await {
            Ok(c) => checked_rings.push(c),
            Err(e) if e.source == Source::Rules => refused.push(e.context),
            Err(e) => return Err(e),
        }
    }
    if !refused.is_empty() {
        let _ = conn.disconnect().await;
        return Err(Error::new(
            Source::Rules,
            format!(
                "migration refused, nothing was changed:\n  {}",
                refused.join("\n  ")
            ),
        ));
    }
    for rule in &checked {
        print_and_apply(&mut conn, rule, opts.apply, out).await?;
    }
    for rule in &checked_rings {
        print_and_apply_ring(&mut conn, rule, opts.apply, out).await?;
    }
    let _ = conn.disconnect().await;
    Ok(())
}

/// Prints one rule's plan and, with `apply`, executes it.
async fn print_and_apply(
    conn: &mut Conn,
    rule: &CheckedRule,
    apply: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let key = if rule.key.is_empty() {
        "no key: one global counter".to_string()
    } else {
        format!("key {}", list(&rule.key))
    };
    emit(
        out,
        &format!(
            "-- rule {}: counter table {} ({key}; counters {}), {} slots in {}",
            rule.spec.name,
            rule.logical.quoted(),
            list(&rule.columns),
            rule.spec.slots,
            rule.slot.quoted(),
        ),
    )?;
    for note in &rule.notes {
        emit(out, &format!("-- note: {note}"))?;
    }
    let mut statements: Vec<(&str, String)> = Vec::new();
    match &rule.create_table {
        Some(ddl) => statements.push(("created slot table", ddl.clone())),
        None => emit(
            out,
            &format!(
                "-- slot table {} exists and matches the rule",
                rule.slot.quoted()
            ),
        )?,
    }
    match &rule.trigger {
        TriggerPlan::NotNeeded => emit(
            out,
            &format!(
                "-- no trigger: without key columns the counter is the single row of {}, which must exist",
                rule.logical.quoted()
            ),
        )?,
        TriggerPlan::Exists => emit(
            out,
            &format!("-- trigger {} exists and matches the rule", rule.trigger_quoted()),
        )?,
        TriggerPlan::Create(ddl) => statements.push(("created trigger", ddl.clone())),
    }
    for (done, sql) in statements {
        emit(out, &format!("{sql};"))?;
        if apply {
            conn.query_drop(sql.as_str()).await.map_err(|e| {
                Error::with_cause(
                    Source::Backend,
                    format!("rule {}: executing `{sql}`", rule.spec.name),
                    e,
                )
            })?;
            emit(out, &format!("-- applied: {done}"))?;
        }
    }
    emit(out, "")
}

/// Keeps the rule named `only` (an error when there is none), or every rule.
pub(crate) fn select_rules(
    specs: Vec<CounterSpec>,
    only: Option<&str>,
) -> Result<Vec<CounterSpec>> {
    let Some(name) = only else {
        return Ok(specs);
    };
    let picked: Vec<CounterSpec> = specs.into_iter().filter(|s| s.name == name).collect();
    if picked.is_empty() {
        return Err(Error::new(
            Source::Rules,
            format!("no counter rule named '{name}'"),
        ));
    }
    Ok(picked)
}

/// Writes one line.
pub(crate) fn emit(out: &mut dyn Write, line: &str) -> Result<()> {
    writeln!(out, "{line}").map_err(|e| Error::with_cause(Source::Internal, "writing output", e))
}

/// `` `a`, `b` `` for messages and DDL.
fn list(cols: &[String]) -> String {
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
fn redact(url: &str) -> String {
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
fn schema_err(what: String, e: mysql_async::Error) -> Error {
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

impl Column {
    /// `TINYINT` … `BIGINT`, signed or not.
    fn is_integer(&self) -> bool {
        integer_max(&self.data_type, false).is_some()
    }

    fn is_unsigned(&self) -> bool {
        self.column_type.to_ascii_lowercase().contains("unsigned")
    }

    /// The type as DDL: `varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin`.
    fn type_sql(&self) -> String {
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
    fn same_type(&self, other: &Column) -> bool {
        self.column_type.eq_ignore_ascii_case(&other.column_type)
            && opt_eq(&self.charset, &other.charset)
            && opt_eq(&self.collation, &other.collation)
    }
}

fn opt_eq(a: &Option<String>, b: &Option<String>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        (None, None) => true,
        _ => false,
    }
}

/// Largest value an integer `DATA_TYPE` holds; `None` for other types.
fn integer_max(data_type: &str, unsigned: bool) -> Option<u64> {
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
}

impl Table {
    /// Key column `k` of this (logical) table, `logical`: refused when it is missing
    /// or TEXT/BLOB, which the primary key of `physical` ("a ring table") cannot hold.
    fn key_column(
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

fn text(row: &Row, i: usize) -> Option<String> {
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
        if whole {
            table.unique.push((index, cols));
        }
    }
    Ok(Some(table))
}

/// Whether two column lists name the same set of columns.
fn same_set(a: &[String], b: &[String]) -> bool {
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
}

/// A counter rule checked against the database.
#[derive(Debug, Clone)]
pub(crate) struct CheckedRule {
    /// The rule as written.
    pub spec: CounterSpec,
    /// The logical table, database resolved.
    pub logical: TableName,
    /// The slot table, database resolved.
    pub slot: TableName,
    /// Key columns, spelled as in the logical table.
    pub key: Vec<String>,
    /// Counter columns, spelled as in the logical table.
    pub columns: Vec<String>,
    /// The slot number column.
    pub slot_column: String,
    /// `CREATE TABLE` for a missing slot table; `None` when it exists and matches.
    pub create_table: Option<String>,
    /// Trigger name (in the slot table's database).
    pub trigger_name: String,
    /// What to do about the trigger.
    pub trigger: TriggerPlan,
    /// Remarks for the operator (printed as comments).
    pub notes: Vec<String>,
}

impl CheckedRule {
    fn trigger_quoted(&self) -> String {
        TableName {
            db: self.slot.db.clone(),
            name: self.trigger_name.clone(),
        }
        .quoted()
    }
}

/// `<slot_table>_hs_ai`, shortened with a hash of the full name when that would exceed
/// 64 characters.
pub fn trigger_name(slot_table: &str) -> String {
    suffixed_name(slot_table, TRIGGER_SUFFIX)
}

/// `<base><suffix>`, shortened with a hash of `base` when that would exceed 64
/// characters.
fn suffixed_name(base: &str, suffix: &str) -> String {
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

/// Resolves `spec`'s tables to a database: the rule's prefix, else `default_db` (the
/// URL's); an unqualified slot table lives next to the logical table.
pub(crate) fn resolve(
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> Result<(TableName, TableName)> {
    let refuse =
        |reason: String| Error::new(Source::Rules, format!("counter '{}': {reason}", spec.name));
    let mut logical = TableName::parse(&spec.table).map_err(refuse)?;
    let mut slot = TableName::parse(&spec.slot_table).map_err(refuse)?;
    if logical.db.is_none() {
        logical.db = Some(default_db.map(str::to_string).ok_or_else(|| {
            refuse(format!(
                "table `{}` names no database and --backend-url has none",
                spec.table
            ))
        })?);
    }
    if slot.db.is_none() {
        slot.db = logical.db.clone();
    }
    Ok((logical, slot))
}

/// Checks one counter rule against the database and works out the DDL it needs.
/// A refusal is an [`Error`] with [`Source::Rules`] whose context names the rule and
/// the reason; backend failures have [`Source::Backend`].
pub(crate) async fn check_rule(
    conn: &mut Conn,
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> Result<CheckedRule> {
    let refuse =
        |reason: String| Error::new(Source::Rules, format!("counter '{}': {reason}", spec.name));
    spec.validate().map_err(refuse)?;
    let (logical, slot) = resolve(spec, default_db)?;
    let Some(table) = inspect_table(conn, &logical).await? else {
        return Err(refuse(format!("table {} does not exist", logical.quoted())));
    };
    if !table.table_type.eq_ignore_ascii_case("BASE TABLE") {
        return Err(refuse(format!(
            "{} is a {}, not a base table",
            logical.quoted(),
            table.table_type
        )));
    }
    let mut notes = Vec::new();

    // Key columns: present, usable in a primary key, exactly a unique key.
    let mut key_cols: Vec<Column> = Vec::new();
    for k in &spec.key {
        key_cols.push(
            table
                .key_column(k, &logical, "a slot table")
                .map_err(refuse)?
                .clone(),
        );
    }
    let key: Vec<String> = key_cols.iter().map(|c| c.name.clone()).collect();
    if !key.is_empty() {
        if !table.unique.iter().any(|(_, cols)| same_set(cols, &key)) {
            let have: Vec<String> = table
                .unique
                .iter()
                .map(|(n, cols)| format!("{n} ({})", list(cols)))
                .collect();
            let have = if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            };
            return Err(refuse(format!(
                "key ({}) is neither the primary key nor a unique key of {}, so one row per key is not guaranteed (unique keys: {have})",
                list(&key),
                logical.quoted()
            )));
        }
        for c in key_cols.iter().filter(|c| c.nullable) {
            notes.push(format!(
                "key column `{}` is nullable; rows whose key is NULL cannot be incremented through slot rows",
                c.name
            ));
        }
    }

    // Counter columns: present and integer.
    let mut columns = Vec::new();
    for c in &spec.columns {
        let col = table.column(c).ok_or_else(|| {
            refuse(format!(
                "counter column `{c}` is not a column of {}",
                logical.quoted()
            ))
        })?;
        if !col.is_integer() {
            return Err(refuse(format!(
                "counter column `{}` of {} is {}, not an integer type",
                col.name,
                logical.quoted(),
                col.column_type
            )));
        }
        columns.push(col.name.clone());
    }
    if table
        .engine
        .as_deref()
        .is_some_and(|e| !e.eq_ignore_ascii_case("InnoDB"))
    {
        notes.push(format!(
            "{} uses {}; rewritten statements are only atomic on a transactional engine such as InnoDB",
            logical.quoted(),
            table.engine.as_deref().unwrap_or_default()
        ));
    }

    let create_table = match inspect_table(conn, &slot).await? {
        None => Some(create_table_sql(spec, &slot, &table, &key_cols, &columns)),
        Some(existing) => {
            let problems = slot_table_problems(spec, &existing, &key_cols, &columns);
            if !problems.is_empty() {
                return Err(refuse(format!(
                    "slot table {} exists but does not match the rule: {}",
                    slot.quoted(),
                    problems.join("; ")
                )));
            }
            None
        }
    };

    let trigger_name = trigger_name(&slot.name);
    let trigger = if key.is_empty() {
        let rows: Vec<Row> = conn
            .query(format!("SELECT COUNT(*) FROM {}", logical.quoted()))
            .await
            .map_err(|e| schema_err(format!("counting rows of {}", logical.quoted()), e))?;
        let n = rows
            .first()
            .and_then(|r| r.get_opt::<u64, usize>(0))
            .and_then(|r| r.ok())
            .unwrap_or_default();
        if n != 1 {
            notes.push(format!(
                "{} holds {n} rows; a counter without key columns needs exactly one",
                logical.quoted()
            ));
        }
        TriggerPlan::NotNeeded
    } else {
        let body = trigger_body(&logical, &key, &columns);
        let trig = TableName {
            db: slot.db.clone(),
            name: trigger_name.clone(),
        };
        match existing_trigger(conn, &trig).await? {
            None => TriggerPlan::Create(format!(
                "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {} FOR EACH ROW {body}",
                trig.quoted(),
                slot.quoted()
            )),
            Some(t) => {
                let on_slot = t.table.eq_ignore_ascii_case(&slot.name)
                    && t.timing.eq_ignore_ascii_case("AFTER")
                    && t.event.eq_ignore_ascii_case("INSERT");
                let found = normalize(&t.body);
                // A hand-written equivalent (same INSERT IGNORE into the logical table,
                // e.g. without the counters) is accepted; anything else is not ours.
                let creates_row = found.starts_with("insert ignore into")
                    && found.contains(&logical.name.to_ascii_lowercase());
                if !on_slot || !creates_row {
                    return Err(refuse(format!(
                        "trigger {} exists but is not `AFTER INSERT ON {} FOR EACH ROW {body}` (it is `{} {} ON {} FOR EACH ROW {}`); drop it or rename the slot table",
                        trig.quoted(),
                        slot.quoted(),
                        t.timing,
                        t.event,
                        quote(&t.table),
                        t.body
                    )));
                }
                if found != normalize(&body) {
                    notes.push(format!(
                        "trigger {} exists with the body `{}`; left as it is",
                        trig.quoted(),
                        t.body
                    ));
                }
                TriggerPlan::Exists
            }
        }
    };
    let omitted: Vec<String> = table
        .columns
        .iter()
        .filter(|c| !c.omittable && !key.contains(&c.name) && !columns.contains(&c.name))
        .map(|c| c.name.clone())
        .collect();
    if !key.is_empty() && !omitted.is_empty() {
        notes.push(format!(
            "{} has no default for {}; rows the trigger creates get the type's implicit default there",
            logical.quoted(),
            list(&omitted)
        ));
    }

    Ok(CheckedRule {
        spec: spec.clone(),
        logical,
        slot,
        key,
        columns,
        slot_column: spec.slot_column.clone(),
        create_table,
        trigger_name,
        trigger,
        notes,
    })
}

/// `CREATE TABLE IF NOT EXISTS` for the slot table.
fn create_table_sql(
    spec: &CounterSpec,
    slot: &TableName,
    logical: &Table,
    key: &[Column],
    columns: &[String],
) -> String {
    let mut lines: Vec<String> = key
        .iter()
        .map(|c| format!("  {} {} NOT NULL", quote(&c.name), c.type_sql()))
        .collect();
    lines.push(format!(
        "  {} SMALLINT UNSIGNED NOT NULL",
        quote(&spec.slot_column)
    ));
    for c in columns {
        lines.push(format!("  {} BIGINT NOT NULL DEFAULT 0", quote(c)));
    }
    let pk: Vec<String> = key
        .iter()
        .map(|c| quote(&c.name))
        .chain(std::iter::once(quote(&spec.slot_column)))
        .collect();
    lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    let mut options = "ENGINE=InnoDB".to_string();
    if let Some(cs) = &logical.charset {
        options.push_str(&format!(" DEFAULT CHARSET={cs}"));
    }
    if let Some(coll) = &logical.collation {
        options.push_str(&format!(" COLLATE={coll}"));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {options}",
        slot.quoted(),
        lines.join(",\n")
    )
}

/// What is wrong with an existing slot table for this rule (empty: it fits).
fn slot_table_problems(
    spec: &CounterSpec,
    slot: &Table,
    key: &[Column],
    columns: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    for k in key {
        match slot.column(&k.name) {
            None => problems.push(format!("key column `{}` is missing", k.name)),
            Some(c) if !c.same_type(k) => problems.push(format!(
                "key column `{}` is {} but the logical table's is {}",
                k.name,
                c.type_sql(),
                k.type_sql()
            )),
            Some(_) => {}
        }
    }
    match slot.column(&spec.slot_column) {
        None => problems.push(format!("slot column `{}` is missing", spec.slot_column)),
        Some(c) => match integer_max(&c.data_type, c.is_unsigned()) {
            None => problems.push(format!(
                "slot column `{}` is {}, not an integer type",
                c.name, c.column_type
            )),
            Some(max) if max < u64::from(spec.slots.saturating_sub(1)) => problems.push(format!(
                "slot column `{}` ({}) cannot hold slot {}",
                c.name,
                c.column_type,
                spec.slots - 1
            )),
            Some(_) => {}
        },
    }
    for name in columns {
        match slot.column(name) {
            None => problems.push(format!("counter column `{name}` is missing")),
            Some(c) if !c.is_integer() || c.is_unsigned() => problems.push(format!(
                "counter column `{name}` is {}, not a signed integer (deltas may be negative)",
                c.column_type
            )),
            Some(_) => {}
        }
    }
    let want_pk: Vec<String> = key
        .iter()
        .map(|c| c.name.clone())
        .chain(std::iter::once(spec.slot_column.clone()))
        .collect();
    match &slot.primary {
        Some(pk) if same_set(pk, &want_pk) => {}
        Some(pk) => problems.push(format!(
            "primary key is ({}), not ({})",
            list(pk),
            list(&want_pk)
        )),
        None => problems.push(format!("no primary key; it needs ({})", list(&want_pk))),
    }
    for c in &slot.columns {
        let used = want_pk
            .iter()
            .chain(columns)
            .any(|n| n.eq_ignore_ascii_case(&c.name));
        if !used && !c.omittable {
            problems.push(format!(
                "column `{}` is NOT NULL without a default, so slot inserts would fail",
                c.name
            ));
        }
    }
    problems
}

/// The trigger's statement: create the logical row with counters at 0.
fn trigger_body(logical: &TableName, key: &[String], columns: &[String]) -> String {
    let cols: Vec<String> = key.iter().chain(columns).map(|c| quote(c)).collect();
    let vals: Vec<String> = key
        .iter()
        .map(|k| format!("NEW.{}", quote(k)))
        .chain(columns.iter().map(|_| "0".to_string()))
        .collect();
    format!(
        "INSERT IGNORE INTO {} ({}) VALUES ({})",
        logical.quoted(),
        cols.join(", "),
        vals.join(", ")
    )
}

/// An existing trigger, as `information_schema.TRIGGERS` describes it.
struct ExistingTrigger {
    table: String,
    timing: String,
    event: String,
    body: String,
}

async fn existing_trigger(conn: &mut Conn, t: &TableName) -> Result<Option<ExistingTrigger>> {
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

/// What to do about `name`, a trigger of a ring rule that must be `<timing> INSERT
/// ON <table>` (`on`) with `body`: create it with `create` when it is missing; keep
/// one that exists (with a note when its body differs). `Err(reason)` when a trigger
/// of that name does something else.
async fn plan_insert_trigger(
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
fn normalize(sql: &str) -> String {
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

// ---------------------------------------------------------------------------------------
// Ring rules

/// Column of a keyless ring's sequence table: every insert repeats its default, so the
/// table keeps exactly one row.
pub const SINGLE_ROW: &str = "single_row";
/// The backfill's derived column: a row's position in its key's history (1 = oldest).
const POS: &str = "__heatsink_pos";
/// The backfill's derived column: the number of rows in the key's history.
const COUNT: &str = "__heatsink_count";

/// The `[[ring]]` rules under `path`, in file order. Every file is first validated
/// exactly as `serve` would load it.
pub(crate) fn ring_specs(path: &Path) -> Result<Vec<RingSpec>> {
    let mut specs = Vec::new();
    for file in crate::rules::rule_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("reading rule file {}", file.display()),
                e,
            )
        })?;
        crate::rules::parse_file(&text, &file)
            .map_err(|e| Error::with_cause(Source::Rules, "invalid rule file", e))?;
        let parsed: crate::rules::spec::RuleFile = toml::from_str(&text).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("invalid rule file {}", file.display()),
                e,
            )
        })?;
        specs.extend(parsed.ring);
    }
    Ok(specs)
}

/// A ring rule checked against the database.
#[derive(Debug, Clone)]
pub(crate) struct CheckedRing {
    /// The rule as written.
    pub spec: RingSpec,
    /// The log table, database resolved.
    pub logical: TableName,
    /// The ring table, database resolved.
    pub ring: TableName,
    /// The sequence table, database resolved.
    pub seq: TableName,
    /// Key columns, spelled as in the log.
    pub key: Vec<String>,
    /// `CREATE TABLE` for a missing ring table; `None` when it exists and fits.
    pub create_ring: Option<String>,
    /// `CREATE TABLE` for a missing sequence table; `None` when it exists and fits.
    pub create_seq: Option<String>,
    /// The backfill (ring rows, then sequence values); `None` when the log gives no
    /// order to tell the latest rows by (then it must be empty).
    pub backfill: Option<[String; 2]>,
    /// Whether the backfill is due: the log has rows and the ring and sequence tables
    /// are new or empty. Checked again under the table locks when applying.
    pub backfill_due: bool,
    /// The log's `AUTO_INCREMENT` column, if any.
    pub auto_inc: Option<String>,
    /// Unique keys of the log (name, columns) the ring does not enforce: all but a
    /// key of the `AUTO_INCREMENT` column alone, whose generated ids are unique.
    pub unenforced_unique: Vec<(String, Vec<String>)>,
    /// The log's next id when the ring's counter is below it (checked again when
    /// applying): the ring's `AUTO_INCREMENT` is raised to it.
    pub raise_auto_inc: Option<u64>,
    /// The trigger on the ring that numbers its rows.
    pub seq_trigger_name: TableName,
    /// What to do about that trigger.
    pub seq_trigger: TriggerPlan,
    /// The statement creating it (also to create it again after a backfill).
    pub create_seq_trigger: String,
    /// The trigger on the log that mirrors rows appended to it directly.
    pub trigger_name: TableName,
    /// What to do about that trigger.
    pub trigger: TriggerPlan,
    /// Remarks for the operator (printed as comments).
    pub notes: Vec<String>,
}

/// Resolves a ring rule's tables to a database: the rule's prefix, else
/// `default_db`; unqualified ring and sequence tables live next to the log.
pub(crate) fn resolve_ring(
    spec: &RingSpec,
    default_db: Option<&str>,
) -> Result<(TableName, TableName, TableName)> {
    let refuse =
        |reason: String| Error::new(Source::Rules, format!("ring '{}': {reason}", spec.name));
    let mut logical = TableName::parse(&spec.table).map_err(refuse)?;
    let mut ring = TableName::parse(&spec.ring_table).map_err(refuse)?;
    let mut seq = TableName::parse(&spec.seq_table_name()).map_err(refuse)?;
    if logical.db.is_none() {
        logical.db = Some(default_db.map(str::to_string).ok_or_else(|| {
            refuse(format!(
                "table `{}` names no database and --backend-url has none",
                spec.table
            ))
        })?);
    }
    for t in [&mut ring, &mut seq] {
        if t.db.is_none() {
            t.db = logical.db.clone();
        }
    }
    Ok((logical, ring, seq))
}

/// Whether a query returns at least one row.
async fn has_rows(conn: &mut Conn, sql: String, what: String) -> Result<bool> {
    let rows: Vec<Row> = conn.query(sql).await.map_err(|e| schema_err(what, e))?;
    Ok(!rows.is_empty())
}

/// Whether table `t` holds a row.
async fn table_has_rows(conn: &mut Conn, t: &TableName) -> Result<bool> {
    has_rows(
        conn,
        format!("SELECT 1 FROM {} LIMIT 1", t.quoted()),
        format!("reading {}", t.quoted()),
    )
    .await
}

/// Checks one ring rule against the database and works out the DDL and backfill it
/// needs. A refusal is an [`Error`] with [`Source::Rules`] whose context names the
/// rule and the reason; backend failures have [`Source::Backend`].
pub(crate) async fn check_ring(
    conn: &mut Conn,
    spec: &RingSpec,
    default_db: Option<&str>,
) -> Result<CheckedRing> {
    let refuse =
        |reason: String| Error::new(Source::Rules, format!("ring '{}': {reason}", spec.name));
    spec.validate().map_err(refuse)?;
    let (logical, ring, seq) = resolve_ring(spec, default_db)?;
    let Some(table) = inspect_table(conn, &logical).await? else {
        return Err(refuse(format!("table {} does not exist", logical.quoted())));
    };
    if !table.table_type.eq_ignore_ascii_case("BASE TABLE") {
        return Err(refuse(format!(
            "{} is a {}, not a base table",
            logical.quoted(),
            table.table_type
        )));
    }
    let mut notes = Vec::new();
    if let Some(c) = table.columns.iter().find(|c| c.extra.contains("generated")) {
        return Err(refuse(format!(
            "column `{}` of {} is generated; a ring table cannot hold it (ring inserts assign every column)",
            c.name,
            logical.quoted()
        )));
    }

    let mut key_cols: Vec<Column> = Vec::new();
    for k in &spec.key {
        let col = table
            .key_column(k, &logical, "a ring table")
            .map_err(refuse)?;
        if col.nullable {
            notes.push(format!(
                "key column `{}` is nullable in the log but NOT NULL in the ring: rows whose key is NULL cannot be kept (the backfill skips them)",
                col.name
            ));
        }
        key_cols.push(col.clone());
    }
    let key: Vec<String> = key_cols.iter().map(|c| c.name.clone()).collect();
    for (what, c) in [
        ("slot_column", &spec.slot_column),
        ("seq_column", &spec.seq_column),
    ] {
        if table.column(c).is_some() {
            return Err(refuse(format!(
                "{what} `{c}` is already a column of {}; choose another name",
                logical.quoted()
            )));
        }
    }
    let order_by = match &spec.order_by {
        Some(o) => Some(
            table
                .column(o)
                .ok_or_else(|| {
                    refuse(format!(
                        "order_by column `{o}` is not a column of {}",
                        logical.quoted()
                    ))
                })?
                .name
                .clone(),
        ),
        None => None,
    };
    if table
        .engine
        .as_deref()
        .is_some_and(|e| !e.eq_ignore_ascii_case("InnoDB"))
    {
        notes.push(format!(
            "{} uses {}; the ring tables are InnoDB",
            logical.quoted(),
            table.engine.as_deref().unwrap_or_default()
        ));
    }
    let auto_inc = table
        .columns
        .iter()
        .find(|c| c.extra.contains("auto_increment"))
        .map(|c| c.name.clone());
    if let Some(a) = &auto_inc {
        notes.push(format!(
            "`{a}` stays AUTO_INCREMENT in the ring: ids and last_insert_id continue the log's"
        ));
    }

    let existing_ring = inspect_table(conn, &ring).await?;
    let create_ring = match &existing_ring {
        None => Some(create_ring_sql(spec, &ring, &table, &key)),
        Some(existing) => {
            let problems = ring_table_problems(spec, existing, &table, &key);
            if !problems.is_empty() {
                return Err(refuse(format!(
                    "ring table {} exists but does not match the rule: {}",
                    ring.quoted(),
                    problems.join("; ")
                )));
            }
            None
        }
    };
    let existing_seq = inspect_table(conn, &seq).await?;
    let create_seq = match &existing_seq {
        None => Some(create_seq_sql(spec, &seq, &table, &key_cols)),
        Some(existing) => {
            let problems = seq_table_problems(spec, existing, &key_cols);
            if !problems.is_empty() {
                return Err(refuse(format!(
                    "sequence table {} exists but does not match the rule: {}",
                    seq.quoted(),
                    problems.join("; ")
                )));
            }
            None
        }
    };

    let log_has_rows = table_has_rows(conn, &logical).await?;
    let ring_has_rows = match existing_ring {
        Some(_) => table_has_rows(conn, &ring).await?,
        None => false,
    };
    let seq_has_rows = match existing_seq {
        Some(_) => table_has_rows(conn, &seq).await?,
        None => false,
    };
    let backfill_due = log_has_rows && !ring_has_rows && !seq_has_rows;
    if log_has_rows && !backfill_due {
        notes.push(format!(
            "no backfill: {} already holds rows",
            if ring_has_rows { &ring } else { &seq }.quoted()
        ));
    }
    let mut order: Vec<String> = order_by.iter().cloned().collect();
    let tiebreak = table.primary.clone().or_else(|| {
        table
            .unique
            .iter()
            .find(|(_, cols)| {
                cols.iter()
                    .all(|c| table.column(c).is_some_and(|c| !c.nullable))
            })
            .map(|(_, cols)| cols.clone())
    });
    for c in tiebreak.unwrap_or_default() {
        if !order.iter().any(|o| o.eq_ignore_ascii_case(&c)) {
            order.push(c);
        }
    }
    let backfill = if order.is_empty() {
        if backfill_due {
            return Err(refuse(format!(
                "{} has rows but neither order_by nor a primary key says which are the latest; set order_by",
                logical.quoted()
            )));
        }
        None
    } else {
        if backfill_due && order_by.is_some() && table.primary.is_none() {
            notes.push(format!(
                "{} has no primary key: rows with equal `{}` are backfilled in an arbitrary order",
                logical.quoted(),
                order[0]
            ));
        }
        Some(backfill_sql(
            spec, &logical, &ring, &seq, &table, &key_cols, &order,
        ))
    };
    let raise_auto_inc = match &auto_inc {
        Some(a) => {
            let log_next = next_id(conn, &logical, a).await?;
            let ring_next = if existing_ring.is_some() {
                next_id(conn, &ring, a).await?
            } else {
                1
            };
            (log_next > ring_next).then_some(log_next)
        }
        None => None,
    };

    let seq_trigger_name = TableName {
        db: ring.db.clone(),
        name: suffixed_name(&ring.name, SEQ_TRIGGER_SUFFIX),
    };
    let seq_body = seq_trigger_body(spec, &seq, &key_cols);
    let create_seq_trigger = format!(
        "CREATE TRIGGER IF NOT EXISTS {} BEFORE INSERT ON {} FOR EACH ROW {seq_body}",
        seq_trigger_name.quoted(),
        ring.quoted()
    );
    let seq_trigger = plan_insert_trigger(
        conn,
        &seq_trigger_name,
        (&ring, "BEFORE"),
        &seq_body,
        create_seq_trigger.clone(),
        &mut notes,
    )
    .await?
    .map_err(refuse)?;

    let trigger_name = TableName {
        db: logical.db.clone(),
        name: suffixed_name(&ring.name, RING_TRIGGER_SUFFIX),
    };
    let body = ring_trigger_body(spec, &ring, &table, &key_cols);
    let create = format!(
        "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {} FOR EACH ROW {body}",
        trigger_name.quoted(),
        logical.quoted()
    );
    let trigger = plan_insert_trigger(
        conn,
        &trigger_name,
        (&logical, "AFTER"),
        &body,
        create,
        &mut notes,
    )
    .await?
    .map_err(refuse)?;

    let unenforced_unique = table
        .unique
        .iter()
        .filter(|(_, cols)| {
            !matches!((cols.as_slice(), &auto_inc), ([c], Some(a)) if c.eq_ignore_ascii_case(a))
        })
        .cloned()
        .collect();
    Ok(CheckedRing {
        spec: spec.clone(),
        logical,
        ring,
        seq,
        key,
        create_ring,
        create_seq,
        backfill,
        backfill_due,
        auto_inc,
        unenforced_unique,
        raise_auto_inc,
        seq_trigger_name,
        seq_trigger,
        create_seq_trigger,
        trigger_name,
        trigger,
        notes,
    })
}

/// The `ON UPDATE` expression of a column's `EXTRA`, if any.
fn on_update(extra: &str) -> Option<&str> {
    let at = extra.find("on update ")?;
    let rest = &extra[at + "on update ".len()..];
    let end = rest.find(',').unwrap_or(rest.len());
    Some(rest[..end].trim()).filter(|s| !s.is_empty())
}

/// A log column as a ring column: same type, nullability, default, `ON UPDATE` and
/// `AUTO_INCREMENT`; `NOT NULL` when it is part of the primary key.
fn ring_column_sql(c: &Column, in_key: bool) -> String {
    let nullable = c.nullable && !in_key;
    let mut s = format!(
        "  {} {} {}",
        quote(&c.name),
        c.type_sql(),
        if nullable { "NULL" } else { "NOT NULL" }
    );
    if let Some(d) = &c.default {
        if nullable || !d.eq_ignore_ascii_case("NULL") {
            s.push_str(&format!(" DEFAULT {d}"));
        }
    }
    if let Some(on) = on_update(&c.extra) {
        s.push_str(&format!(" ON UPDATE {on}"));
    }
    if c.extra.contains("auto_increment") {
        s.push_str(" AUTO_INCREMENT");
    }
    if c.extra.contains("invisible") {
        s.push_str(" INVISIBLE");
    }
    s
}

/// The slot column's type for `size` slots.
fn slot_type(size: u32) -> &'static str {
    if size > 65_535 {
        "INT UNSIGNED"
    } else {
        "SMALLINT UNSIGNED"
    }
}

/// `ENGINE=InnoDB` and the log's default character set and collation.
fn table_options(logical: &Table) -> String {
    let mut options = "ENGINE=InnoDB".to_string();
    if let Some(cs) = &logical.charset {
        options.push_str(&format!(" DEFAULT CHARSET={cs}"));
    }
    if let Some(coll) = &logical.collation {
        options.push_str(&format!(" COLLATE={coll}"));
    }
    options
}

fn is_in(cols: &[String], name: &str) -> bool {
    cols.iter().any(|c| c.eq_ignore_ascii_case(name))
}

/// `CREATE TABLE IF NOT EXISTS` for the ring table.
fn create_ring_sql(spec: &RingSpec, ring: &TableName, logical: &Table, key: &[String]) -> String {
    let mut lines: Vec<String> = logical
        .columns
        .iter()
        .map(|c| ring_column_sql(c, is_in(key, &c.name)))
        .collect();
    lines.push(format!(
        "  {} {} NOT NULL",
        quote(&spec.slot_column),
        slot_type(spec.size)
    ));
    lines.push(format!(
        "  {} BIGINT UNSIGNED NOT NULL",
        quote(&spec.seq_column)
    ));
    let pk: Vec<String> = key
        .iter()
        .chain(std::iter::once(&spec.slot_column))
        .map(|c| quote(c))
        .collect();
    lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    if let Some(ai) = logical
        .columns
        .iter()
        .find(|c| c.extra.contains("auto_increment"))
    {
        lines.push(format!("  KEY ({})", quote(&ai.name)));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {}",
        ring.quoted(),
        lines.join(",\n"),
        table_options(logical)
    )
}

/// `CREATE TABLE IF NOT EXISTS` for the sequence table.
fn create_seq_sql(spec: &RingSpec, seq: &TableName, logical: &Table, key: &[Column]) -> String {
    let mut lines: Vec<String> = key
        .iter()
        .map(|c| format!("  {} {} NOT NULL", quote(&c.name), c.type_sql()))
        .collect();
    let mut pk: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    if key.is_empty() {
        lines.push(format!(
            "  {} TINYINT UNSIGNED NOT NULL DEFAULT 0",
            quote(SINGLE_ROW)
        ));
        pk.push(quote(SINGLE_ROW));
    }
    lines.push(format!(
        "  {} BIGINT UNSIGNED NOT NULL",
        quote(&spec.seq_column)
    ));
    lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {}",
        seq.quoted(),
        lines.join(",\n"),
        table_options(logical)
    )
}

/// Problems of an existing integer column meant to hold values up to `max`.
fn integer_column_problem(t: &Table, name: &str, what: &str, max: u64) -> Option<String> {
    match t.column(name) {
        None => Some(format!("{what} `{name}` is missing")),
        Some(c) => match integer_max(&c.data_type, c.is_unsigned()) {
            None => Some(format!(
                "{what} `{}` is {}, not an integer type",
                c.name, c.column_type
            )),
            Some(m) if m < max => Some(format!(
                "{what} `{}` ({}) cannot hold {max}",
                c.name, c.column_type
            )),
            Some(_) => None,
        },
    }
}

/// Problems with `t`'s primary key and with columns no ring statement assigns.
fn key_and_extra_problems(t: &Table, want_pk: &[String], assigned: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    match &t.primary {
        Some(pk) if same_set(pk, want_pk) => {}
        Some(pk) => problems.push(format!(
            "primary key is ({}), not ({})",
            list(pk),
            list(want_pk)
        )),
        None => problems.push(format!("no primary key; it needs ({})", list(want_pk))),
    }
    for c in &t.columns {
        if !is_in(assigned, &c.name) && !c.omittable {
            problems.push(format!(
                "column `{}` is NOT NULL without a default, so inserts would fail",
                c.name
            ));
        }
    }
    problems
}

/// What is wrong with an existing ring table for this rule (empty: it fits).
fn ring_table_problems(
    spec: &RingSpec,
    ring: &Table,
    logical: &Table,
    key: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    for l in &logical.columns {
        match ring.column(&l.name) {
            None => problems.push(format!("column `{}` is missing", l.name)),
            Some(c) if !c.same_type(l) => problems.push(format!(
                "column `{}` is {} but the log's is {}",
                l.name,
                c.type_sql(),
                l.type_sql()
            )),
            Some(c)
                if l.extra.contains("auto_increment") && !c.extra.contains("auto_increment") =>
            {
                problems.push(format!(
                    "column `{}` is not AUTO_INCREMENT (the log's is, and inserts leave it to the table)",
                    l.name
                ))
            }
            Some(_) => {}
        }
    }
    problems.extend(integer_column_problem(
        ring,
        &spec.slot_column,
        "slot column",
        u64::from(spec.size.saturating_sub(1)),
    ));
    problems.extend(integer_column_problem(
        ring,
        &spec.seq_column,
        "sequence column",
        u64::from(u32::MAX),
    ));
    let want_pk: Vec<String> = key
        .iter()
        .cloned()
        .chain(std::iter::once(spec.slot_column.clone()))
        .collect();
    let assigned: Vec<String> = logical
        .columns
        .iter()
        .map(|c| c.name.clone())
        .chain([spec.slot_column.clone(), spec.seq_column.clone()])
        .collect();
    problems.extend(key_and_extra_problems(ring, &want_pk, &assigned));
    problems
}

/// What is wrong with an existing sequence table for this rule (empty: it fits).
fn seq_table_problems(spec: &RingSpec, seq: &Table, key: &[Column]) -> Vec<String> {
    let mut problems = Vec::new();
    for k in key {
        match seq.column(&k.name) {
            None => problems.push(format!("key column `{}` is missing", k.name)),
            Some(c) if !c.same_type(k) => problems.push(format!(
                "key column `{}` is {} but the log's is {}",
                k.name,
                c.type_sql(),
                k.type_sql()
            )),
            Some(_) => {}
        }
    }
    problems.extend(integer_column_problem(
        seq,
        &spec.seq_column,
        "sequence column",
        u64::from(u32::MAX),
    ));
    let mut want_pk: Vec<String> = key.iter().map(|c| c.name.clone()).collect();
    if key.is_empty() {
        want_pk.push(SINGLE_ROW.to_string());
    }
    let assigned: Vec<String> = key
        .iter()
        .map(|c| c.name.clone())
        .chain(std::iter::once(spec.seq_column.clone()))
        .collect();
    problems.extend(key_and_extra_problems(seq, &want_pk, &assigned));
    problems
}

/// The backfill: the latest `size` rows of each key into the ring (with their ids),
/// and each key's history length into the sequence table.
fn backfill_sql(
    spec: &RingSpec,
    logical: &TableName,
    ring: &TableName,
    seq: &TableName,
    table: &Table,
    key: &[Column],
    order: &[String],
) -> [String; 2] {
    let keys: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    let partition = if keys.is_empty() {
        String::new()
    } else {
        format!("PARTITION BY {} ", keys.join(", "))
    };
    let order: Vec<String> = order.iter().map(|c| format!("{} ASC", quote(c))).collect();
    let not_null: Vec<String> = key
        .iter()
        .filter(|c| c.nullable)
        .map(|c| format!("{} IS NOT NULL", quote(&c.name)))
        .collect();
    let filter = if not_null.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", not_null.join(" AND "))
    };
    let cols: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
    let picked: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("h.{}", quote(&c.name)))
        .collect();
    let size = spec.size;
    let ring_sql = format!(
        "INSERT INTO {ring} ({cols}, {slot}, {seqc})\nSELECT {picked}, h.{pos} % {size}, h.{pos}\nFROM (SELECT {cols}, ROW_NUMBER() OVER ({partition}ORDER BY {order}) AS {pos}, COUNT(*) OVER ({part_only}) AS {count}\n      FROM {log}{filter}) AS h\nWHERE h.{pos} + {size} > h.{count}",
        ring = ring.quoted(),
        cols = cols.join(", "),
        slot = quote(&spec.slot_column),
        seqc = quote(&spec.seq_column),
        picked = picked.join(", "),
        pos = quote(POS),
        count = quote(COUNT),
        order = order.join(", "),
        part_only = partition.trim_end(),
        log = logical.quoted(),
    );
    let seqc = quote(&spec.seq_column);
    let seq_sql = if keys.is_empty() {
        format!(
            "INSERT INTO {} ({seqc})\nSELECT COUNT(*) FROM {}{filter}\nON DUPLICATE KEY UPDATE {seqc} = GREATEST({seqc}, VALUES({seqc}))",
            seq.quoted(),
            logical.quoted()
        )
    } else {
        format!(
            "INSERT INTO {} ({k}, {seqc})\nSELECT {k}, COUNT(*) FROM {}{filter} GROUP BY {k}\nON DUPLICATE KEY UPDATE {seqc} = GREATEST({seqc}, VALUES({seqc}))",
            seq.quoted(),
            logical.quoted(),
            k = keys.join(", ")
        )
    };
    [ring_sql, seq_sql]
}

/// Runs one statement, mapping failures to a backend error naming the rule.
async fn run_sql(conn: &mut Conn, rule: &str, sql: &str) -> Result<u64> {
    conn.query_drop(sql).await.map_err(|e| {
        Error::with_cause(
            Source::Backend,
            format!("rule {rule}: executing `{sql}`"),
            e,
        )
    })?;
    Ok(conn.affected_rows())
}

/// The id an insert into `t` would generate for its AUTO_INCREMENT column `col`: the
/// table's counter, and at least one above the largest id present.
async fn next_id(conn: &mut Conn, t: &TableName, col: &str) -> Result<u64> {
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

/// `ALTER TABLE ring AUTO_INCREMENT = next`.
fn raise_auto_inc_sql(ring: &TableName, next: u64) -> String {
    format!("ALTER TABLE {} AUTO_INCREMENT = {next}", ring.quoted())
}

/// The body of `<ring_table>_hs_seq`, `BEFORE INSERT` on the ring: takes the key's
/// next sequence number (`LAST_INSERT_ID(1)` on a key's first insert, since `VALUES
/// (k, 1)` would leave a stale LAST_INSERT_ID()) and sets the row's sequence and slot.
/// MariaDB restores the session's LAST_INSERT_ID() when the trigger ends.
fn seq_trigger_body(spec: &RingSpec, seq: &TableName, key: &[Column]) -> String {
    let seqc = quote(&spec.seq_column);
    let mut cols: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    let mut vals: Vec<String> = key
        .iter()
        .map(|c| format!("NEW.{}", quote(&c.name)))
        .collect();
    cols.push(seqc.clone());
    vals.push("LAST_INSERT_ID(1)".into());
    format!(
        "BEGIN INSERT INTO {} ({}) VALUES ({}) ON DUPLICATE KEY UPDATE {seqc} = LAST_INSERT_ID({seqc} + 1); \
         SET NEW.{seqc} = LAST_INSERT_ID(); SET NEW.{} = NEW.{seqc} % {}; END",
        seq.quoted(),
        cols.join(", "),
        vals.join(", "),
        quote(&spec.slot_column),
        spec.size
    )
}

/// The body of the trigger that mirrors a row appended to the log directly (by a
/// client that does not go through heatsink yet) into the ring: the row with its id,
/// slot and sequence NULL (the ring's `BEFORE INSERT` trigger numbers it), and the
/// rule's guarded upsert. Rows with a NULL key are skipped.
fn ring_trigger_body(spec: &RingSpec, ring: &TableName, table: &Table, key: &[Column]) -> String {
    let seqc = quote(&spec.seq_column);
    let cols: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
    let vals: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("NEW.{}", quote(&c.name)))
        .collect();
    let mut update: Vec<String> = table
        .columns
        .iter()
        .filter(|c| !key.iter().any(|k| k.name.eq_ignore_ascii_case(&c.name)))
        .map(|c| {
            format!(
                "{0} = IF(VALUES({seqc}) > {seqc}, VALUES({0}), {0})",
                quote(&c.name)
            )
        })
        .collect();
    // Last: the guards above compare with the row's old sequence number.
    update.push(format!(
        "{seqc} = IF(VALUES({seqc}) > {seqc}, VALUES({seqc}), {seqc})"
    ));
    let insert = format!(
        "INSERT INTO {} ({}, {}, {seqc}) VALUES ({}, NULL, NULL) ON DUPLICATE KEY UPDATE {}",
        ring.quoted(),
        cols.join(", "),
        quote(&spec.slot_column),
        vals.join(", "),
        update.join(", ")
    );
    let nullable: Vec<String> = key
        .iter()
        .filter(|c| c.nullable)
        .map(|c| format!("NEW.{} IS NOT NULL", quote(&c.name)))
        .collect();
    if nullable.is_empty() {
        insert
    } else {
        format!(
            "BEGIN IF {} THEN {insert}; END IF; END",
            nullable.join(" AND ")
        )
    }
}

/// Runs `sql`s in order, stopping at the first failure.
async fn run_all(conn: &mut Conn, rule: &str, sql: &[&str]) -> Result<Vec<u64>> {
    let mut affected = Vec::with_capacity(sql.len());
    for s in sql {
        affected.push(run_sql(conn, rule, s).await?);
    }
    Ok(affected)
}

/// What the locked part of a ring migration did.
struct RingApplied {
    /// Ring and sequence rows backfilled.
    backfilled: Option<Vec<u64>>,
    /// The ring's new AUTO_INCREMENT counter.
    raised: Option<u64>,
    /// Triggers created.
    created: Vec<String>,
}

/// Under the table locks: backfill (when still due, without the ring's numbering
/// trigger), raise the ring's AUTO_INCREMENT counter, create the triggers, commit.
async fn apply_ring_locked(conn: &mut Conn, rule: &CheckedRing) -> Result<RingApplied> {
    let name = &rule.spec.name;
    let due = table_has_rows(conn, &rule.logical).await?
        && !table_has_rows(conn, &rule.ring).await?
        && !table_has_rows(conn, &rule.seq).await?;
    let backfilled = match (&rule.backfill, due) {
        (Some([ring_sql, seq_sql]), true) => {
            // The numbering trigger would renumber the copied rows.
            let drop = format!("DROP TRIGGER IF EXISTS {}", rule.seq_trigger_name.quoted());
            run_sql(conn, name, &drop).await?;
            Some(run_all(conn, name, &[ring_sql, seq_sql]).await?)
        }
        (None, true) => {
            return Err(Error::new(
                Source::Rules,
                format!(
                    "ring '{name}': {} has rows but neither order_by nor a primary key says which are the latest; set order_by",
                    rule.logical.quoted()
                ),
            ))
        }
        (_, false) => None,
    };
    let mut raised = None;
    if let Some(ai) = &rule.auto_inc {
        let log_next = next_id(conn, &rule.logical, ai).await?;
        if log_next > next_id(conn, &rule.ring, ai).await? {
            // ALTER TABLE commits the backfill.
            run_sql(conn, name, &raise_auto_inc_sql(&rule.ring, log_next)).await?;
            raised = Some(log_next);
        }
    }
    let mut created = Vec::new();
    if backfilled.is_some() || matches!(rule.seq_trigger, TriggerPlan::Create(_)) {
        run_sql(conn, name, &rule.create_seq_trigger).await?;
        created.push(rule.seq_trigger_name.quoted());
    }
    if let TriggerPlan::Create(ddl) = &rule.trigger {
        run_sql(conn, name, ddl).await?;
        created.push(rule.trigger_name.quoted());
    }
    run_sql(conn, name, "COMMIT").await?;
    Ok(RingApplied {
        backfilled,
        raised,
        created,
    })
}

/// Prints one ring rule's plan and, with `apply`, executes it.
async fn print_and_apply_ring(
    conn: &mut Conn,
    rule: &CheckedRing,
    apply: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let name = &rule.spec.name;
    let key = if rule.key.is_empty() {
        "no key: one ring".to_string()
    } else {
        format!("key {}", list(&rule.key))
    };
    emit(
        out,
        &format!(
            "-- rule {name}: ring of {} rows per key for log {} ({key}) in {}, sequences in {}",
            rule.spec.size,
            rule.logical.quoted(),
            rule.ring.quoted(),
            rule.seq.quoted(),
        ),
    )?;
    for note in &rule.notes {
        emit(out, &format!("-- note: {note}"))?;
    }
    for (what, ddl, table) in [
        ("ring table", &rule.create_ring, &rule.ring),
        ("sequence table", &rule.create_seq, &rule.seq),
    ] {
        match ddl {
            Some(sql) => {
                emit(out, &format!("{sql};"))?;
                if apply {
                    run_sql(conn, name, sql).await?;
                    emit(out, &format!("-- applied: created {what}"))?;
                }
            }
            None => emit(
                out,
                &format!("-- {what} {} exists and matches the rule", table.quoted()),
            )?,
        }
    }
    let backfill = rule.backfill.as_ref().filter(|_| rule.backfill_due);
    let create_seq_trigger = matches!(rule.seq_trigger, TriggerPlan::Create(_));
    let create_log_trigger = matches!(rule.trigger, TriggerPlan::Create(_));
    for (exists, t) in [
        (!create_seq_trigger, &rule.seq_trigger_name),
        (!create_log_trigger, &rule.trigger_name),
    ] {
        if exists {
            emit(out, &format!("-- trigger {} exists", t.quoted()))?;
        }
    }
    if !(rule.backfill_due || create_seq_trigger || create_log_trigger) {
        // Nothing to lock for; at most the counter to raise.
        if let (Some(next), Some(ai)) = (rule.raise_auto_inc, &rule.auto_inc) {
            emit(out, &format!("{};", raise_auto_inc_sql(&rule.ring, next)))?;
            if apply {
                let next = next_id(conn, &rule.logical, ai).await?;
                if next > next_id(conn, &rule.ring, ai).await? {
                    run_sql(conn, name, &raise_auto_inc_sql(&rule.ring, next)).await?;
                    emit(
                        out,
                        &format!(
                            "-- applied: AUTO_INCREMENT of {} raised to {next}",
                            rule.ring.quoted()
                        ),
                    )?;
                }
            }
        }
        return emit(out, "");
    }

    // The log stays locked from the backfill until both triggers exist, so every row
    // appended to it is either backfilled or mirrored.
    let lock = format!(
        "LOCK TABLES {} WRITE, {} WRITE, {} WRITE",
        rule.logical.quoted(),
        rule.ring.quoted(),
        rule.seq.quoted()
    );
    if create_seq_trigger {
        emit(
            out,
            &format!(
                "-- trigger {}: numbers every row inserted into {} (the key's next sequence number and its slot)",
                rule.seq_trigger_name.quoted(),
                rule.ring.quoted()
            ),
        )?;
    } else if backfill.is_some() {
        emit(
            out,
            &format!(
                "-- trigger {}: dropped for the backfill (it would renumber the copied rows) and created again",
                rule.seq_trigger_name.quoted()
            ),
        )?;
    }
    if create_log_trigger {
        emit(
            out,
            &format!(
                "-- trigger {}: rows appended to {} directly (by clients not yet going through heatsink) are mirrored into the ring",
                rule.trigger_name.quoted(),
                rule.logical.quoted()
            ),
        )?;
    }
    emit(out, "SET autocommit = 0;")?;
    emit(out, &format!("{lock};"))?;
    if let Some([ring_sql, seq_sql]) = backfill {
        if !create_seq_trigger {
            emit(
                out,
                &format!("DROP TRIGGER IF EXISTS {};", rule.seq_trigger_name.quoted()),
            )?;
        }
        emit(
            out,
            &format!(
                "-- backfill: the latest {} rows of each key of {} with their ids, numbered by their position in the key's history",
                rule.spec.size,
                rule.logical.quoted()
            ),
        )?;
        emit(out, &format!("{ring_sql};"))?;
        emit(out, &format!("{seq_sql};"))?;
    }
    if let Some(next) = rule.raise_auto_inc {
        emit(
            out,
            "-- ids continue the log's (applied with the log's counter under the locks)",
        )?;
        emit(out, &format!("{};", raise_auto_inc_sql(&rule.ring, next)))?;
    }
    emit(out, "DELIMITER ;;")?;
    if create_seq_trigger || backfill.is_some() {
        emit(out, &format!("{};;", rule.create_seq_trigger))?;
    }
    if let TriggerPlan::Create(ddl) = &rule.trigger {
        emit(out, &format!("{ddl};;"))?;
    }
    emit(out, "DELIMITER ;")?;
    emit(out, "COMMIT;")?;
    emit(out, "UNLOCK TABLES;")?;
    emit(out, "SET autocommit = 1;")?;
    if apply {
        run_all(conn, name, &["SET autocommit = 0", &lock]).await?;
        let done = apply_ring_locked(conn, rule).await;
        if done.is_err() {
            let _ = conn.query_drop("ROLLBACK").await;
        }
        let _ = conn.query_drop("UNLOCK TABLES").await;
        let _ = conn.query_drop("SET autocommit = 1").await;
        let done = done?;
        if let Some(counts) = done.backfilled {
            emit(
                out,
                &format!(
                    "-- applied: backfilled {} ring rows and {} sequence rows",
                    counts[0], counts[1]
                ),
            )?;
        }
        if let Some(next) = done.raised {
            emit(
                out,
                &format!(
                    "-- applied: AUTO_INCREMENT of {} raised to {next}",
                    rule.ring.quoted()
                ),
            )?;
        }
        for t in done.created {
            emit(out, &format!("-- applied: created trigger {t}"))?;
        }
    }
    emit(out, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_names_fit() {
        assert_eq!(trigger_name("hits_slots"), "hits_slots_hs_ai");
        let long = "s".repeat(64);
        let t = trigger_name(&long);
        assert_eq!(t.len(), 64);
        assert!(t.ends_with(TRIGGER_SUFFIX));
        assert_ne!(t, trigger_name(&format!("{}t", "s".repeat(63))));
        assert_eq!(trigger_name(&"a".repeat(58)).len(), 64);
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
    fn trigger_body_sets_counters_to_zero() {
        let t = TableName::parse("shop.hits").unwrap();
        assert_eq!(
            trigger_body(&t, &["slug".into()], &["cnt".into()]),
            "INSERT IGNORE INTO `shop`.`hits` (`slug`, `cnt`) VALUES (NEW.`slug`, 0)"
        );
    }

    fn col(name: &str, column_type: &str, nullable: bool, default: Option<&str>) -> Column {
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

    #[test]
    fn ring_columns_copy_the_log_with_auto_increment() {
        let mut id = col("id", "int(11)", false, None);
        id.extra = "auto_increment".into();
        assert_eq!(
            ring_column_sql(&id, false),
            "  `id` int(11) NOT NULL AUTO_INCREMENT"
        );
        let mut ts = col("ts", "timestamp(3)", false, Some("current_timestamp(3)"));
        ts.extra = "on update current_timestamp(3)".into();
        assert_eq!(
            ring_column_sql(&ts, false),
            "  `ts` timestamp(3) NOT NULL DEFAULT current_timestamp(3) ON UPDATE current_timestamp(3)"
        );
        let k = col("uid", "int(11)", true, Some("NULL"));
        assert_eq!(ring_column_sql(&k, true), "  `uid` int(11) NOT NULL");
        assert_eq!(
            ring_column_sql(&k, false),
            "  `uid` int(11) NULL DEFAULT NULL"
        );
        assert_eq!(
            on_update("on update current_timestamp(), invisible"),
            Some("current_timestamp()")
        );
        assert_eq!(on_update("auto_increment"), None);
        assert_eq!(slot_type(65_535), "SMALLINT UNSIGNED");
        assert_eq!(slot_type(65_536), "INT UNSIGNED");
        assert_eq!(suffixed_name("r", RING_TRIGGER_SUFFIX), "r_hs_log");
        assert_eq!(suffixed_name("r", SEQ_TRIGGER_SUFFIX), "r_hs_seq");
        for suffix in [RING_TRIGGER_SUFFIX, SEQ_TRIGGER_SUFFIX] {
            let long = suffixed_name(&"r".repeat(64), suffix);
            assert_eq!(long.len(), 64);
            assert!(long.ends_with(suffix));
        }
    }

    fn ring_fixture() -> (crate::rules::spec::RuleFile, Table, Column) {
        let spec: crate::rules::spec::RuleFile = toml::from_str(
            "[[ring]]\nname = \"v\"\ntable = \"log\"\nkey = [\"uid\"]\nsize = 5\nring_table = \"r\"\n",
        )
        .unwrap();
        let mut id = col("id", "int(11)", false, None);
        id.extra = "auto_increment".into();
        let uid = col("uid", "int(11)", true, None);
        let table = Table {
            table_type: "BASE TABLE".into(),
            engine: Some("InnoDB".into()),
            collation: None,
            charset: None,
            columns: vec![id, uid.clone(), col("v", "int(11)", false, None)],
            primary: Some(vec!["id".into()]),
            unique: Vec::new(),
        };
        (spec, table, uid)
    }

    #[test]
    fn ring_table_keeps_auto_increment_with_a_key() {
        let (spec, table, _) = ring_fixture();
        assert_eq!(
            create_ring_sql(
                &spec.ring[0],
                &TableName::parse("d.r").unwrap(),
                &table,
                &["uid".into()]
            ),
            "CREATE TABLE IF NOT EXISTS `d`.`r` (\n  `id` int(11) NOT NULL AUTO_INCREMENT,\n  `uid` int(11) NOT NULL,\n  \
             `v` int(11) NOT NULL,\n  `slot` SMALLINT UNSIGNED NOT NULL,\n  `seq` BIGINT UNSIGNED NOT NULL,\n  \
             PRIMARY KEY (`uid`, `slot`),\n  KEY (`id`)\n) ENGINE=InnoDB"
        );
    }

    #[test]
    fn ring_triggers_number_and_mirror_rows() {
        let (spec, table, uid) = ring_fixture();
        let seq = TableName::parse("d.r_seq").unwrap();
        assert_eq!(
            seq_trigger_body(&spec.ring[0], &seq, std::slice::from_ref(&uid)),
            "BEGIN INSERT INTO `d`.`r_seq` (`uid`, `seq`) VALUES (NEW.`uid`, LAST_INSERT_ID(1)) \
             ON DUPLICATE KEY UPDATE `seq` = LAST_INSERT_ID(`seq` + 1); \
             SET NEW.`seq` = LAST_INSERT_ID(); SET NEW.`slot` = NEW.`seq` % 5; END"
        );
        assert_eq!(
            seq_trigger_body(&spec.ring[0], &seq, &[]),
            "BEGIN INSERT INTO `d`.`r_seq` (`seq`) VALUES (LAST_INSERT_ID(1)) \
             ON DUPLICATE KEY UPDATE `seq` = LAST_INSERT_ID(`seq` + 1); \
             SET NEW.`seq` = LAST_INSERT_ID(); SET NEW.`slot` = NEW.`seq` % 5; END"
        );
        let ring = TableName::parse("d.r").unwrap();
        let upsert = "INSERT INTO `d`.`r` (`id`, `uid`, `v`, `slot`, `seq`) VALUES (NEW.`id`, NEW.`uid`, NEW.`v`, NULL, NULL) \
             ON DUPLICATE KEY UPDATE `id` = IF(VALUES(`seq`) > `seq`, VALUES(`id`), `id`), `v` = IF(VALUES(`seq`) > `seq`, VALUES(`v`), `v`), \
             `seq` = IF(VALUES(`seq`) > `seq`, VALUES(`seq`), `seq`)";
        assert_eq!(
            ring_trigger_body(&spec.ring[0], &ring, &table, std::slice::from_ref(&uid)),
            format!("BEGIN IF NEW.`uid` IS NOT NULL THEN {upsert}; END IF; END")
        );
        let mut not_null = uid;
        not_null.nullable = false;
        assert_eq!(
            ring_trigger_body(&spec.ring[0], &ring, &table, &[not_null]),
            upsert
        );
    }

    #[test]
    fn sql_comparison_ignores_layout() {
        assert_eq!(
            normalize("INSERT  IGNORE\n INTO x;"),
            normalize("insert ignore into x")
        );
    }
}
