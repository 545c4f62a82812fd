//! `heatsink migrate`: the schema objects counter rules need.
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
//! The checks are shared with [`crate::compact`], which refuses to touch a rule whose
//! tables do not fit it.

use std::io::Write;
use std::path::Path;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Row, Value};

use crate::error::{Error, Result, Source};
use crate::rules::spec::{quote, CounterSpec, TableName};

/// Suffix of the trigger that creates missing logical rows.
pub const TRIGGER_SUFFIX: &str = "_hs_ai";

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

/// Checks every counter rule under `opts.rules` against the database and prints (and,
/// with `apply`, executes) the DDL it needs. Nothing is executed unless every selected
/// rule passes its checks.
pub async fn run(opts: &MigrateOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let specs = select_rules(crate::rules::counter_specs(opts.rules)?, opts.rule)?;
    if specs.is_empty() {
        emit(out, "-- no counter rules: nothing to migrate")?;
        return Ok(());
    }
    let mut conn = connect(opts.backend_url).await?;
    let default_db = default_db(opts.backend_url)?;
    let mut checked = Vec::with_capacity(specs.len());
    let mut refused = Vec::new();
    for spec in &specs {
        match check_rule(&mut conn, spec, default_db.as_deref()).await {
            Ok(c) => checked.push(c),
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
        let has_default = text(row, 6).is_some();
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
    let full = format!("{slot_table}{TRIGGER_SUFFIX}");
    if full.len() <= MAX_IDENT {
        return full;
    }
    // FNV-1a: stable across builds and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in slot_table.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let keep = MAX_IDENT - TRIGGER_SUFFIX.len() - 9;
    // Rule identifiers are ASCII, so any byte index is a character boundary.
    let prefix: String = slot_table.chars().take(keep).collect();
    format!("{prefix}_{h:08x}{TRIGGER_SUFFIX}")
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
        let col = table.column(k).ok_or_else(|| {
            refuse(format!(
                "key column `{k}` is not a column of {}",
                logical.quoted()
            ))
        })?;
        if col.data_type.contains("blob") || col.data_type.contains("text") {
            return Err(refuse(format!(
                "key column `{}` is {}, which a slot table's primary key cannot hold",
                col.name, col.column_type
            )));
        }
        key_cols.push(col.clone());
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

    #[test]
    fn sql_comparison_ignores_layout() {
        assert_eq!(
            normalize("INSERT  IGNORE\n INTO x;"),
            normalize("insert ignore into x")
        );
    }
}
