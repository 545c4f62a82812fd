//! The counter's `compact` job (`heatsink maintain --job compact`, or `heatsink
//! compact`): folds slot deltas back into the base values, online.
//!
//! A counter's value is `base + SUM(slot deltas)` (see [`super::plan`]).
//! Slot rows accumulate as keys get incremented; compaction moves their sum into the
//! logical table's row and deletes them, one key per short transaction:
//!
//! ```sql
//! START TRANSACTION;
//! SELECT slot, c… FROM slots WHERE key = ? FOR UPDATE;       -- lock this key's deltas
//! UPDATE logical SET c = c + <sum> … WHERE key = ?;           -- fold them into the base
//! DELETE FROM slots WHERE key = ? AND slot IN (<locked>);     -- exactly the rows summed
//! COMMIT;
//! ```
//!
//! `base + SUM(slots)` is the same before and after each transaction, so reads through
//! the proxy stay exact while compaction runs, and increments that land meanwhile are
//! kept: a new slot row is not among the locked ones, an existing one waits for the
//! lock. A key whose slot rows have no logical row (no trigger, or the row was deleted
//! directly) gets one, holding the summed value. Deadlocks (1213) and lock-wait
//! timeouts (1205) roll the key back and retry it a few times.
//!
//! Keys are visited once, in primary-key order, `--batch` at a time, so keys that keep
//! getting incremented do not keep the command busy forever.
//!
//! A dry run (`heatsink maintain` without `--apply`) counts the keys and slot rows
//! that would be folded and prints the per-key transaction; it locks and changes
//! nothing.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use super::schema::{check_rule, CheckedRule};
use super::spec::CounterSpec;
use crate::error::{Error, Result, Source};
use crate::kinds::{JobContext, JobReport, SchemaError};
use crate::rules::spec::quote;
use crate::schema::values;

/// Attempts per key before a deadlock or lock-wait timeout is reported as a failure.
const ATTEMPTS: u32 = 5;

/// What one rule's compaction did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Keys whose slot rows were folded into the base.
    pub keys: u64,
    /// Slot rows deleted.
    pub rows: u64,
    /// Keys that could not be compacted, with the reason.
    pub failed: Vec<String>,
}

/// The `compact` job: folds every key's slot rows of one rule into its base row.
/// Keys that could not be compacted are reported in [`JobReport::failed`]; the other
/// keys are still compacted. A rule whose tables do not fit it is an error.
pub(crate) async fn job(spec: &CounterSpec, ctx: &mut JobContext<'_>) -> Result<JobReport> {
    let rule = checked(ctx.conn, spec, ctx.default_db).await?;
    if rule.create_table.is_some() {
        return Ok(JobReport {
            summary: format!(
                "slot table {} does not exist (run heatsink migrate); nothing to compact",
                rule.slot.quoted()
            ),
            failed: Vec::new(),
        });
    }
    if !ctx.apply {
        return dry_run(ctx, &rule).await;
    }
    let stats = compact_rule(ctx.conn, &rule, ctx.batch.max(1)).await?;
    let summary = format!(
        "{} keys compacted, {} slot rows removed{}",
        stats.keys,
        stats.rows,
        if stats.failed.is_empty() {
            String::new()
        } else {
            format!(", {} keys failed", stats.failed.len())
        }
    );
    Ok(JobReport {
        summary,
        failed: stats.failed,
    })
}

/// The rule checked against its tables; one they do not fit is an error.
pub(crate) async fn checked(
    conn: &mut Conn,
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> Result<CheckedRule> {
    check_rule(conn, spec, default_db)
        .await
        .map_err(|e| match e {
            SchemaError::Refused(reason) => {
                Error::new(Source::Rules, format!("counter '{}': {reason}", spec.name))
            }
            SchemaError::Failed(e) => e,
        })
}

/// The dry run: how many keys and slot rows a compaction would fold now, and the
/// transaction it would run for each key (`?` for the key and the sums).
async fn dry_run(ctx: &mut JobContext<'_>, rule: &CheckedRule) -> Result<JobReport> {
    let slot = rule.slot.quoted();
    let keys = if rule.key.is_empty() {
        "LEAST(COUNT(*), 1)".to_string()
    } else {
        let cols: Vec<String> = rule.key.iter().map(|k| quote(k)).collect();
        format!("COUNT(DISTINCT {})", cols.join(", "))
    };
    let counted: Option<(u64, u64)> = ctx
        .conn
        .query_first(format!("SELECT {keys}, COUNT(*) FROM {slot}"))
        .await
        .map_err(|e| {
            Error::with_cause(
                Source::Backend,
                format!("rule {}: counting the rows of {slot}", rule.spec.name),
                e,
            )
        })?;
    let (keys, rows) = counted.unwrap_or((0, 0));
    let sql = Sql::new(rule);
    crate::schema::emit(
        ctx.out,
        &format!("-- {keys} keys with {rows} slot rows; each key in its own transaction:"),
    )?;
    for line in [
        "START TRANSACTION".to_string(),
        sql.select.clone(),
        sql.update.clone(),
        format!("-- when the base row is missing: {}", sql.insert),
        format!("{}?, …)", sql.delete_prefix),
        "COMMIT".to_string(),
    ] {
        let end = if line.starts_with("--") { "" } else { ";" };
        crate::schema::emit(ctx.out, &format!("{line}{end}"))?;
    }
    Ok(JobReport {
        summary: format!("dry run: {keys} keys would be compacted, {rows} slot rows removed"),
        failed: Vec::new(),
    })
}

/// The SQL one rule's compaction runs, built once.
struct Sql {
    /// Locks and reads one key's slot rows.
    select: String,
    /// Adds the sums to the base row.
    update: String,
    /// Inserts a missing base row.
    insert: String,
    /// `DELETE … AND slot IN (` — the placeholders and `)` are appended per key.
    delete_prefix: String,
}

impl Sql {
    fn new(rule: &CheckedRule) -> Sql {
        let slot = rule.slot.quoted();
        let logical = rule.logical.quoted();
        let key_filter = rule
            .key
            .iter()
            .map(|k| format!("{} = ?", quote(k)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let where_key = if key_filter.is_empty() {
            String::new()
        } else {
            format!(" WHERE {key_filter}")
        };
        let counters: Vec<String> = rule.columns.iter().map(|c| quote(c)).collect();
        let select = format!(
            "SELECT {}, {} FROM {slot}{where_key} FOR UPDATE",
            quote(&rule.slot_column),
            counters.join(", ")
        );
        let update = format!(
            "UPDATE {logical} SET {}{where_key}",
            counters
                .iter()
                .map(|c| format!("{c} = {c} + ?"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let insert_cols: Vec<String> = rule
            .key
            .iter()
            .map(|k| quote(k))
            .chain(counters.clone())
            .collect();
        let marks = vec!["?"; insert_cols.len()].join(", ");
        let insert = if rule.key.is_empty() {
            format!(
                "INSERT INTO {logical} ({}) VALUES ({marks})",
                insert_cols.join(", ")
            )
        } else {
            format!(
                "INSERT INTO {logical} ({}) VALUES ({marks}) ON DUPLICATE KEY UPDATE {}",
                insert_cols.join(", "),
                counters
                    .iter()
                    .map(|c| format!("{c} = {c} + VALUES({c})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let delete_prefix = if key_filter.is_empty() {
            format!("DELETE FROM {slot} WHERE {} IN (", quote(&rule.slot_column))
        } else {
            format!(
                "DELETE FROM {slot} WHERE {key_filter} AND {} IN (",
                quote(&rule.slot_column)
            )
        };
        Sql {
            select,
            update,
            insert,
            delete_prefix,
        }
    }

    /// The next `batch` distinct keys of the slot table after `cursor`, in key order.
    fn next_keys(
        rule: &CheckedRule,
        cursor: Option<&[Value]>,
        batch: usize,
    ) -> (String, Vec<Value>) {
        let cols: Vec<String> = rule.key.iter().map(|k| quote(k)).collect();
        let mut sql = format!(
            "SELECT DISTINCT {} FROM {}",
            cols.join(", "),
            rule.slot.quoted()
        );
        let mut params = Vec::new();
        if let Some(after) = cursor {
            // (k1, k2) > (a, b) spelled out, which every server optimises as a range.
            let mut ors = Vec::new();
            for i in 0..cols.len() {
                let mut ands: Vec<String> = Vec::new();
                for (j, col) in cols.iter().enumerate().take(i) {
                    ands.push(format!("{col} = ?"));
                    params.push(after.get(j).cloned().unwrap_or(Value::NULL));
                }
                ands.push(format!("{} > ?", cols[i]));
                params.push(after.get(i).cloned().unwrap_or(Value::NULL));
                ors.push(format!("({})", ands.join(" AND ")));
            }
            sql.push_str(&format!(" WHERE {}", ors.join(" OR ")));
        }
        sql.push_str(&format!(" ORDER BY {} LIMIT {batch}", cols.join(", ")));
        (sql, params)
    }
}

/// Compacts every key of one rule that has slot rows.
pub(crate) async fn compact_rule(
    conn: &mut Conn,
    rule: &CheckedRule,
    batch: usize,
) -> Result<Stats> {
    let sql = Sql::new(rule);
    let mut stats = Stats::default();
    if rule.key.is_empty() {
        compact_one(conn, rule, &sql, &[], &mut stats).await?;
        return Ok(stats);
    }
    let mut cursor: Option<Vec<Value>> = None;
    loop {
        let (scan, params) = Sql::next_keys(rule, cursor.as_deref(), batch);
        let rows: Vec<Row> = conn.exec(scan.as_str(), params).await.map_err(|e| {
            Error::with_cause(
                Source::Backend,
                format!(
                    "rule {}: listing keys of {}",
                    rule.spec.name,
                    rule.slot.quoted()
                ),
                e,
            )
        })?;
        let keys: Vec<Vec<Value>> = rows.into_iter().map(values).collect();
        for key in &keys {
            compact_one(conn, rule, &sql, key, &mut stats).await?;
        }
        if keys.len() < batch {
            break;
        }
        cursor = keys.last().cloned();
    }
    Ok(stats)
}

/// Compacts one key with retries, recording the outcome in `stats`. Only a lost
/// connection (or another non-server error) aborts the run.
async fn compact_one(
    conn: &mut Conn,
    rule: &CheckedRule,
    sql: &Sql,
    key: &[Value],
    stats: &mut Stats,
) -> Result<()> {
    let mut attempt = 1;
    loop {
        let outcome = compact_key(conn, rule, sql, key).await;
        let err = match outcome {
            Ok(0) => return Ok(()),
            Ok(rows) => {
                stats.keys += 1;
                stats.rows += rows;
                return Ok(());
            }
            Err(e) => e,
        };
        // Best effort: after an error the transaction may already be gone.
        let _ = conn.query_drop("ROLLBACK").await;
        let code = match &err {
            KeyError::Sql(mysql_async::Error::Server(s)) => Some(s.code),
            KeyError::Sql(_) => None,
            KeyError::Value(_) => Some(0),
        };
        match code {
            Some(1213) | Some(1205) if attempt < ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                attempt += 1;
            }
            Some(_) => {
                stats.failed.push(format!("key {}: {err}", show_key(key)));
                return Ok(());
            }
            None => {
                return Err(Error::new(
                    Source::Backend,
                    format!(
                        "rule {}: compacting key {}: {err}",
                        rule.spec.name,
                        show_key(key)
                    ),
                ))
            }
        }
    }
}

/// Why one key's transaction failed.
#[derive(Debug)]
enum KeyError {
    /// The server or the connection.
    Sql(mysql_async::Error),
    /// A value the fold cannot represent.
    Value(String),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Sql(e) => write!(f, "{e}"),
            KeyError::Value(s) => f.write_str(s),
        }
    }
}

impl From<mysql_async::Error> for KeyError {
    fn from(e: mysql_async::Error) -> Self {
        KeyError::Sql(e)
    }
}

/// One key's transaction; returns the slot rows removed. The caller rolls back on error.
async fn compact_key(
    conn: &mut Conn,
    rule: &CheckedRule,
    sql: &Sql,
    key: &[Value],
) -> std::result::Result<u64, KeyError> {
    conn.query_drop("START TRANSACTION").await?;
    let removed = fold_key(conn, rule, sql, key).await?;
    conn.query_drop("COMMIT").await?;
    Ok(removed)
}

/// Folds one key's slot rows into its base row inside the caller's transaction:
/// locks them, adds their sums to the base, deletes exactly the rows summed.
/// Returns the slot rows removed (0: none left, compacted by someone else or the
/// key deleted meanwhile).
async fn fold_key(
    conn: &mut Conn,
    rule: &CheckedRule,
    sql: &Sql,
    key: &[Value],
) -> std::result::Result<u64, KeyError> {
    let rows: Vec<Row> = conn.exec(sql.select.as_str(), key.to_vec()).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut slots = Vec::with_capacity(rows.len());
    let mut sums = vec![0i128; rule.columns.len()];
    for row in rows {
        let mut cells = values(row).into_iter();
        slots.push(cells.next().unwrap_or(Value::NULL));
        for (sum, cell) in sums.iter_mut().zip(cells) {
            *sum += integer(&cell)?;
        }
    }
    let sums: Vec<Value> = sums
        .iter()
        .map(|&s| to_value(s))
        .collect::<std::result::Result<_, _>>()?;

    let mut params = sums.clone();
    params.extend_from_slice(key);
    conn.exec_drop(sql.update.as_str(), params).await?;
    if conn.affected_rows() == 0 {
        let mut params = key.to_vec();
        params.extend(sums);
        conn.exec_drop(sql.insert.as_str(), params).await?;
    }

    let mut delete = sql.delete_prefix.clone();
    delete.push_str(&vec!["?"; slots.len()].join(", "));
    delete.push(')');
    let mut params = key.to_vec();
    params.extend(slots.iter().cloned());
    conn.exec_drop(delete.as_str(), params).await?;
    let removed = conn.affected_rows();
    if removed != slots.len() as u64 {
        // Cannot happen while the rows are locked; never commit a fold that lost rows.
        return Err(KeyError::Value(format!(
            "locked {} slot rows but deleted {removed}; rolled back",
            slots.len()
        )));
    }
    Ok(removed)
}

/// The job name of a draining counter's fold in `heatsink_jobs`.
pub const DRAIN_JOB: &str = "drain";

/// What a draining fold ([`drain`]) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Finished: slot rows folded by this run and over all runs, keys folded and
    /// transactions committed by this run, keys that could not be folded.
    Done {
        this_run: u64,
        total: u64,
        keys: u64,
        chunks: u64,
        failed: Vec<String>,
    },
    /// Another run of the fold holds its lock.
    Busy,
}

/// Folds every key's slot rows of a draining rule into its base row, online,
/// through the job runner ([`crate::jobs::run`], job [`DRAIN_JOB`] of the rule):
/// chunks of `settings.chunk` keys in primary-key order, one transaction each,
/// committed with the job's progress row; progress lines (or a bar), the
/// `/metrics` gauges, the throttle, replica lag, deadlocks and lock waits retried
/// (the whole chunk). Each key of a chunk is folded as [`compact_rule`] folds it
/// (its slot rows locked, summed into the base, exactly those deleted), so the
/// chunk is exact under live increments (docs/design.md, "Long jobs"). A key
/// whose fold the server refuses (an overflowing sum, …) is rolled back to its
/// savepoint and reported; the chunk's other keys are still folded.
pub(crate) async fn drain(
    conn: &mut Conn,
    rule: &CheckedRule,
    key: &crate::jobs::JobKey,
    settings: &crate::jobs::Settings,
) -> Result<Drained> {
    // A fold that finished before (new slot rows are folded now) starts a new count.
    if crate::jobs::state(conn, key)
        .await?
        .is_some_and(|s| !s.unfinished())
    {
        crate::jobs::reset(conn, key, crate::jobs::PENDING).await?;
    }
    let mut job = DrainJob {
        rule,
        sql: Sql::new(rule),
        committed: None,
        proposed: None,
        keys: 0,
        chunks: 0,
        failed: Vec::new(),
    };
    Ok(
        match crate::jobs::run(conn, key, settings, &mut job).await? {
            crate::jobs::Outcome::Busy => Drained::Busy,
            crate::jobs::Outcome::Done { this_run, total } => Drained::Done {
                this_run,
                total,
                keys: job.keys,
                chunks: job.chunks,
                failed: job.failed,
            },
        },
    )
}

/// One chunk the runner was handed: the position it was told, the chunk's last
/// key, and what the chunk did (counted once the runner says it committed).
#[derive(Debug, Clone)]
struct Proposed {
    position: String,
    last: Vec<Value>,
    keys: u64,
    failed: Vec<String>,
}

/// The draining fold as a job of the runner. The runner hands each chunk the
/// position the last committed one returned; a position this run returned is
/// resumed from its key, any other (a run killed before, or none) starts at the
/// slot table's first key: folded keys have no slot rows left, so starting over
/// folds only what is still there (rows a proxy that has not reloaded wrote since
/// included) and counts nothing twice.
struct DrainJob<'a> {
    rule: &'a CheckedRule,
    sql: Sql,
    /// The last chunk known committed.
    committed: Option<Proposed>,
    /// The last chunk handed to the runner (committed once the runner asks for the
    /// chunk after it).
    proposed: Option<Proposed>,
    keys: u64,
    chunks: u64,
    failed: Vec<String>,
}

impl DrainJob<'_> {
    /// Counts the proposed chunk when `after` is its position (the runner
    /// committed it); returns the key to go on after.
    fn settle(&mut self, after: Option<&str>) -> Option<Vec<Value>> {
        if let (Some(p), Some(a)) = (&self.proposed, after) {
            if p.position == a {
                if let Some(p) = self.proposed.take() {
                    self.keys += p.keys;
                    self.chunks += 1;
                    self.failed.extend(p.failed.iter().cloned());
                    self.committed = Some(p);
                }
            }
        }
        self.proposed = None;
        match (&self.committed, after) {
            (Some(c), Some(a)) if c.position == a => Some(c.last.clone()),
            _ => None,
        }
    }

    /// Folds `key` under a savepoint: a server error other than a deadlock or a
    /// lock wait (which the runner retries, whole chunk) rolls back this key only
    /// and is reported. Returns the slot rows removed.
    async fn fold(&self, conn: &mut Conn, key: &[Value], failed: &mut Vec<String>) -> Result<u64> {
        let name = &self.rule.spec.name;
        let sp = |e| Error::with_cause(Source::Backend, format!("rule {name}: a savepoint"), e);
        conn.query_drop("SAVEPOINT hs_drain_key")
            .await
            .map_err(sp)?;
        match fold_key(conn, self.rule, &self.sql, key).await {
            Ok(n) => Ok(n),
            Err(KeyError::Sql(mysql_async::Error::Server(s)))
                if s.code != 1213 && s.code != 1205 =>
            {
                conn.query_drop("ROLLBACK TO SAVEPOINT hs_drain_key")
                    .await
                    .map_err(sp)?;
                failed.push(format!("key {}: {}", show_key(key), s));
                Ok(0)
            }
            Err(KeyError::Value(v)) => {
                conn.query_drop("ROLLBACK TO SAVEPOINT hs_drain_key")
                    .await
                    .map_err(sp)?;
                failed.push(format!("key {}: {v}", show_key(key)));
                Ok(0)
            }
            Err(KeyError::Sql(e)) => Err(Error::with_cause(
                Source::Backend,
                format!("rule {name}: folding key {}", show_key(key)),
                e,
            )),
        }
    }
}

#[async_trait::async_trait(?Send)]
impl crate::jobs::Chunked for DrainJob<'_> {
    fn unit(&self) -> &'static str {
        "slot rows"
    }

    async fn total(&mut self, conn: &mut Conn, _after: Option<&str>) -> Result<u64> {
        crate::kinds::revert::row_count(conn, &self.rule.slot).await
    }

    async fn chunk(
        &mut self,
        conn: &mut Conn,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<crate::jobs::Step>> {
        let cursor = self.settle(after);
        let keys: Vec<Vec<Value>> = if self.rule.key.is_empty() {
            // The single counter row: one chunk.
            if self.committed.is_some() {
                return Ok(None);
            }
            vec![Vec::new()]
        } else {
            let (scan, params) = Sql::next_keys(self.rule, cursor.as_deref(), limit);
            let rows: Vec<Row> = conn.exec(scan.as_str(), params).await.map_err(|e| {
                Error::with_cause(
                    Source::Backend,
                    format!(
                        "rule {}: listing keys of {}",
                        self.rule.spec.name,
                        self.rule.slot.quoted()
                    ),
                    e,
                )
            })?;
            rows.into_iter().map(values).collect()
        };
        let Some(last) = keys.last().cloned() else {
            return Ok(None);
        };
        let mut rows = 0;
        let mut folded = 0;
        let mut failed = Vec::new();
        for key in &keys {
            let n = self.fold(conn, key, &mut failed).await?;
            rows += n;
            folded += u64::from(n > 0);
        }
        // The chunk's number makes each position of a run distinct.
        let position: String = format!("chunk {}, up to key {}", self.chunks + 1, show_key(&last))
            .chars()
            .take(200)
            .collect();
        self.proposed = Some(Proposed {
            position: position.clone(),
            last,
            keys: folded,
            failed,
        });
        Ok(Some(crate::jobs::Step {
            last: position,
            rows,
        }))
    }
}

/// A slot delta as an integer (NULL counts as 0, like `SUM`).
fn integer(v: &Value) -> std::result::Result<i128, KeyError> {
    match v {
        Value::NULL => Ok(0),
        Value::Int(i) => Ok(i128::from(*i)),
        Value::UInt(u) => Ok(i128::from(*u)),
        Value::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.trim().parse::<i128>().ok())
            .ok_or_else(|| KeyError::Value(format!("slot delta {v:?} is not an integer"))),
        other => Err(KeyError::Value(format!(
            "slot delta {other:?} is not an integer"
        ))),
    }
}

/// A sum as a parameter, exactly.
fn to_value(sum: i128) -> std::result::Result<Value, KeyError> {
    if let Ok(i) = i64::try_from(sum) {
        Ok(Value::Int(i))
    } else if let Ok(u) = u64::try_from(sum) {
        Ok(Value::UInt(u))
    } else {
        Err(KeyError::Value(format!(
            "the slot deltas sum to {sum}, beyond any integer column"
        )))
    }
}

/// `('a', 3)` for messages.
fn show_key(key: &[Value]) -> String {
    if key.is_empty() {
        return "(the single counter row)".to_string();
    }
    let parts: Vec<String> = key.iter().map(|v| v.as_sql(false)).collect();
    format!("({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_become_exact_parameters() {
        assert_eq!(to_value(-5).unwrap(), Value::Int(-5));
        assert_eq!(
            to_value(i128::from(u64::MAX)).unwrap(),
            Value::UInt(u64::MAX)
        );
        assert!(to_value(i128::from(u64::MAX) + 1).is_err());
        assert_eq!(integer(&Value::Bytes(b"-12".to_vec())).unwrap(), -12);
        assert_eq!(integer(&Value::NULL).unwrap(), 0);
    }
}
