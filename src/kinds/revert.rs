//! What a kind needs to take its rule back out (`heatsink migrate --revert`): the
//! rule's record in the database's `heatsink_rules` table, what it leaves behind,
//! and the statements every kind's revert shares. The driver is `crate::revert`;
//! `crate::registry` writes and reads the records.

use std::io::Write;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::error::{Error, Result, Source};
use crate::rules::spec::TableName;
use crate::schema::{emit, existing_trigger, inspect_table, run_sql, schema_err};

use super::RuleSpec;

/// The registry table's name (in each database that holds ruled tables).
pub const TABLE: &str = "heatsink_rules";

/// State of a rule whose first `migrate --apply` has started and not finished
/// (its objects may be half made: a backfill stopped half way).
pub const MIGRATING: &str = "migrating";

/// State of a rule whose revert brought its data back (dropping may remain).
pub const FOLDED: &str = "folded";

/// State of a rule whose revert finished.
pub const REVERTED: &str = "reverted";

/// One row of a `heatsink_rules` table.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The database whose `heatsink_rules` holds the row (the logical table's).
    pub db: String,
    /// The rule's name.
    pub name: String,
    /// Its kind (rule-file section).
    pub kind: String,
    /// The logical table, `db.table`.
    pub logical_table: String,
    /// The rule as a rule-file entry.
    pub spec: String,
    /// `None` (migrated), [`MIGRATING`], [`FOLDED`] or [`REVERTED`].
    pub state: Option<String>,
}

impl Registered {
    /// The `heatsink_rules` table holding this row.
    pub fn table(&self) -> TableName {
        registry_table(&self.db)
    }

    /// The rule, read back from its recorded entry.
    pub fn rule(&self) -> Result<Arc<dyn RuleSpec>> {
        let kind = crate::kinds::kind(&self.kind).ok_or_else(|| {
            Error::new(
                Source::Rules,
                format!(
                    "rule '{}' in {}: unknown kind '{}'",
                    self.name,
                    self.table().quoted(),
                    self.kind
                ),
            )
        })?;
        let mut specs = kind.parse(&self.spec).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!(
                    "rule '{}' in {}: its recorded entry does not parse",
                    self.name,
                    self.table().quoted()
                ),
                e,
            )
        })?;
        match specs.pop() {
            Some(s) if specs.is_empty() && s.name() == self.name => Ok(s),
            _ => Err(Error::new(
                Source::Rules,
                format!(
                    "rule '{}' in {}: its recorded entry is not that one rule",
                    self.name,
                    self.table().quoted()
                ),
            )),
        }
    }
}

/// `` `db`.`heatsink_rules` ``.
pub fn registry_table(db: &str) -> TableName {
    TableName::new(Some(db), TABLE)
}

/// A rule's side tables and the triggers it puts on tables that stay
/// ([`RuleSpec::leftovers`]), databases resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Tables the rule created (dropped by a revert).
    pub tables: Vec<crate::rules::spec::TableName>,
    /// Triggers the rule created on tables that stay (the trigger's database and
    /// name).
    pub triggers: Vec<crate::rules::spec::TableName>,
}

/// What [`RuleSpec::revert`] gets from `heatsink migrate --revert`.
pub struct RevertContext<'a> {
    /// A connection to the database (`CLIENT_FOUND_ROWS`, TCP).
    pub conn: &'a mut Conn,
    /// The database of unqualified tables: the one the rule was registered in.
    pub default_db: Option<&'a str>,
    /// Execute; `false` (the default of `migrate`): print what would be done and
    /// change nothing.
    pub apply: bool,
    /// How long to watch a side table that only a proxy running the rule writes,
    /// before touching it: a change in that time refuses the revert (zero: not
    /// watched).
    pub observe: std::time::Duration,
    /// Keys per transaction where a kind folds in chunks.
    pub batch: usize,
    /// How a kind's copy or fold runs through [`crate::jobs`] (throttle,
    /// progress, replica lag).
    pub jobs: crate::jobs::Settings,
    /// The rule is still in the rule files, draining ([`RuleSpec::draining`]):
    /// proxies still run it, so the kind folds online and drops nothing.
    pub draining: bool,
    /// The rule's row in the registry, which a kind may update in the transaction
    /// that brings its data back (so that a second run knows it is done).
    pub registry: &'a Registered,
    /// Where the plan and progress lines go.
    pub out: &'a mut dyn Write,
}

/// Drops `leftovers`, triggers first (so that writes to the tables that stay never
/// meet a trigger whose table is gone), printing each statement; with
/// `ctx.apply` runs them. What is already gone is reported and skipped.
pub async fn drop_leftovers(ctx: &mut RevertContext<'_>, leftovers: &Leftovers) -> Result<()> {
    let rule = ctx.registry.name.clone();
    let mut nothing = true;
    for t in &leftovers.triggers {
        if existing_trigger(ctx.conn, t).await?.is_none() {
            continue;
        }
        nothing = false;
        let sql = format!("DROP TRIGGER IF EXISTS {}", t.quoted());
        emit(ctx.out, &format!("{sql};"))?;
        if ctx.apply {
            run_sql(ctx.conn, &rule, &sql).await?;
        }
    }
    for t in &leftovers.tables {
        if inspect_table(ctx.conn, t).await?.is_none() {
            continue;
        }
        nothing = false;
        let rows = row_count(ctx.conn, t).await?;
        emit(ctx.out, &format!("-- {} holds {rows} rows", t.quoted()))?;
        let sql = format!("DROP TABLE IF EXISTS {}", t.quoted());
        emit(ctx.out, &format!("{sql};"))?;
        if ctx.apply {
            run_sql(ctx.conn, &rule, &sql).await?;
        }
    }
    if nothing {
        emit(
            ctx.out,
            &format!("-- rule '{rule}': none of its triggers and side tables is left"),
        )?;
    }
    Ok(())
}

/// `SELECT COUNT(*)` of `t`.
pub async fn row_count(conn: &mut Conn, t: &TableName) -> Result<u64> {
    let n: Option<u64> = conn
        .query_first(format!("SELECT COUNT(*) FROM {}", t.quoted()))
        .await
        .map_err(|e| schema_err(format!("counting the rows of {}", t.quoted()), e))?;
    Ok(n.unwrap_or_default())
}

/// `CHECKSUM TABLE t`: its content's checksum (`None` when the table is gone).
async fn checksum(conn: &mut Conn, t: &TableName) -> Result<Option<i64>> {
    let rows: Vec<Row> = conn
        .query(format!("CHECKSUM TABLE {}", t.quoted()))
        .await
        .map_err(|e| schema_err(format!("checksumming {}", t.quoted()), e))?;
    Ok(rows
        .first()
        .and_then(|r| r.get_opt::<Option<i64>, usize>(1))
        .and_then(|r| r.ok())
        .flatten())
}

/// Watches `t`, a table only proxies running rule `rule` write, for `ctx.observe`:
/// refused when its content changes meanwhile (a proxy still runs the rule).
pub async fn refuse_if_written(
    ctx: &mut RevertContext<'_>,
    t: &TableName,
    rule: &str,
) -> Result<()> {
    if ctx.observe.is_zero() {
        return Ok(());
    }
    emit(
        ctx.out,
        &format!(
            "-- watching {} for {:.1} s: only a proxy still running rule '{rule}' writes it",
            t.quoted(),
            ctx.observe.as_secs_f64()
        ),
    )?;
    let before = checksum(ctx.conn, t).await?;
    tokio::time::sleep(ctx.observe).await;
    let after = checksum(ctx.conn, t).await?;
    if before != after {
        return Err(Error::new(
            Source::Rules,
            format!(
                "revert refused, nothing was changed: {} changed while it was watched for \
                 {:.1} s, so a proxy still runs rule '{rule}': remove the rule from the rule \
                 files of every proxy and reload each (SHOW RULES on each admin port must no \
                 longer list it), then run `heatsink migrate --revert {rule}` again",
                t.quoted(),
                ctx.observe.as_secs_f64()
            ),
        ));
    }
    Ok(())
}
