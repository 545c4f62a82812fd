//! `heatsink migrate --revert` for a counter: folds the slot rows back into the
//! logical table, then drops the slot table (and its trigger with it).
//!
//! 1. Only a proxy running the rule writes the slot table, so it is watched first
//!    (`--observe`): a change refuses the revert.
//! 2. `RENAME TABLE slot TO <slot>_hs_revert`. The rename waits for transactions
//!    that hold slot rows and is atomic: after it no write can reach the slot rows
//!    any more. A proxy that still ran the rule would now get an error (1146) for
//!    its increments and reads, never a silently lost increment.
//! 3. The renamed table is folded in chunks of `--batch` keys, one transaction each:
//!    `UPDATE logical JOIN (SELECT key, SUM(c) … WHERE key <= bound GROUP BY key)
//!    SET c = c + sum`, then `DELETE … WHERE key <= bound` of exactly those rows.
//!    Nothing else writes the renamed table, so a chunk deletes exactly what it
//!    added; an interruption loses nothing (the chunk rolls back) and a rerun
//!    counts nothing twice (folded rows are gone). The chunks run through the job
//!    runner ([`crate::jobs::run`], job `revert`): progress, throttle, replica
//!    lag, retried deadlocks and lock waits.
//! 4. `DROP TABLE <slot>_hs_revert` once it is empty.
//!
//! A rerun after an interruption finds the renamed table and goes on from step 3;
//! a rerun after success finds neither table and does nothing. Slot rows whose
//! logical row is gone (deleted behind heatsink's back, which reads never showed)
//! are not folded: they would bring the row back.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row, Value};

use super::spec::CounterSpec;
use crate::error::{Error, Result, Source};
use crate::kinds::revert::{refuse_if_written, row_count};
use crate::kinds::{Leftovers, RevertContext, SchemaError};
use crate::rules::spec::{quote, TableName};
use crate::schema::{emit, inspect_table, list, run_sql, schema_err, suffixed_name, values};

/// Suffix of the name the slot table gets while it is folded.
pub const RETIRED_SUFFIX: &str = "_hs_revert";

/// How long the rename waits for transactions holding the slot table.
const RENAME_WAIT_SECS: u32 = 10;

/// The slot table, and the name it has while a revert folds it.
fn tables(
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> std::result::Result<(TableName, TableName, TableName), String> {
    let (logical, slot) = super::schema::resolve(spec, default_db).map_err(|e| match e {
        SchemaError::Refused(r) => r,
        SchemaError::Failed(e) => e.to_string(),
    })?;
    let retired = TableName {
        db: slot.db.clone(),
        name: suffixed_name(&slot.name, RETIRED_SUFFIX),
    };
    Ok((logical, slot, retired))
}

/// The slot table and, when a revert was interrupted, its renamed form.
pub(crate) fn leftovers(
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> std::result::Result<Leftovers, String> {
    let (_, slot, retired) = tables(spec, default_db)?;
    Ok(Leftovers {
        tables: vec![slot, retired],
        triggers: Vec::new(),
    })
}

/// Reverts a counter rule (see the module documentation).
pub(crate) async fn revert(spec: &CounterSpec, ctx: &mut RevertContext<'_>) -> Result<()> {
    if ctx.draining {
        return fold_draining(spec, ctx).await;
    }
    let (logical, slot, retired) =
        tables(spec, ctx.default_db).map_err(|r| Error::new(Source::Rules, r))?;
    let slot_exists = inspect_table(ctx.conn, &slot).await?.is_some();
    let retired_exists = inspect_table(ctx.conn, &retired).await?.is_some();
    if !slot_exists && !retired_exists {
        emit(
            ctx.out,
            &format!(
                "-- counter '{}': {} is gone: nothing to fold",
                spec.name,
                slot.quoted()
            ),
        )?;
        return Ok(());
    }
    if slot_exists {
        refuse_if_written(ctx, &slot, &spec.name).await?;
    }
    let fold = Fold::new(spec, &logical, &retired);
    for (t, exists) in [(&retired, retired_exists), (&slot, slot_exists)] {
        if !exists {
            continue;
        }
        let rows = row_count(ctx.conn, t).await?;
        let keys = fold.keys(ctx.conn, t).await?;
        let chunks = keys.div_ceil(ctx.batch as u64);
        emit(
            ctx.out,
            &format!(
                "-- counter '{}': {rows} slot rows of {keys} keys in {} are folded into {} \
                 (each key's {} += the sum of its slots), in {chunks} transaction{} of at most {} keys \
                 that each delete the slot rows they added; then the table is dropped",
                spec.name,
                t.quoted(),
                logical.quoted(),
                list(&fold.columns),
                if chunks == 1 { "" } else { "s" },
                ctx.batch
            ),
        )?;
    }
    fold.print(ctx, slot_exists)?;
    if !ctx.apply {
        return Ok(());
    }
    if retired_exists {
        fold.run(ctx).await?;
        drop_table(ctx, &retired, &spec.name).await?;
    }
    if slot_exists {
        ctx.conn
            .query_drop(format!(
                "SET SESSION lock_wait_timeout = {RENAME_WAIT_SECS}"
            ))
            .await
            .map_err(|e| schema_err("setting lock_wait_timeout".into(), e))?;
        let rename = format!("RENAME TABLE {} TO {}", slot.quoted(), retired.quoted());
        run_sql(ctx.conn, &spec.name, &rename).await?;
        emit(ctx.out, &format!("-- applied: {rename}"))?;
        fold.run(ctx).await?;
        drop_table(ctx, &retired, &spec.name).await?;
    }
    Ok(())
}

/// The rule is still in the rule files with `drain = true`: proxies still read the
/// slot rows and clear them on sets and deletes, but write none. The slot rows are
/// folded online through the job runner ([`super::compact::drain`], job `drain`):
/// chunks of `--batch` keys, one transaction each with its progress row, each key's
/// slot rows locked, summed into its base and exactly those deleted — exact while
/// proxies run the rule, drained or not; nothing is dropped. The dry run prints the
/// per-key statements, as `heatsink maintain --job compact` does.
async fn fold_draining(spec: &CounterSpec, ctx: &mut RevertContext<'_>) -> Result<()> {
    let (_, slot, _) = tables(spec, ctx.default_db).map_err(|r| Error::new(Source::Rules, r))?;
    emit(
        ctx.out,
        &format!(
            "-- counter '{}' drains (drain = true): its slot rows are folded into the logical \
             table online, in transactions of at most {} keys, while proxies run it; nothing \
             is dropped. Then remove the rule from every proxy's rule files, reload each, and \
             run the revert again to drop {}",
            spec.name,
            ctx.batch,
            slot.quoted()
        ),
    )?;
    let rule = super::compact::checked(ctx.conn, spec, ctx.default_db).await?;
    if rule.create_table.is_some() || !ctx.apply {
        let mut job = crate::kinds::JobContext {
            conn: &mut *ctx.conn,
            default_db: ctx.default_db,
            batch: ctx.batch,
            out: &mut *ctx.out,
            apply: false,
            jobs: Default::default(),
        };
        let report = super::compact::job(spec, &mut job).await?;
        return emit(ctx.out, &format!("-- {}", report.summary));
    }
    let key = crate::jobs::JobKey {
        db: ctx.registry.db.clone(),
        rule: spec.name.clone(),
        job: super::compact::DRAIN_JOB,
    };
    let mut settings = ctx.jobs.clone();
    settings.chunk = Some(ctx.batch);
    let (this_run, keys, chunks, failed) =
        match super::compact::drain(ctx.conn, &rule, &key, &settings).await? {
            super::compact::Drained::Busy => {
                return Err(Error::new(
                    Source::Backend,
                    format!(
                        "counter '{}': another `heatsink migrate --revert {}` is folding {}; \
                         nothing was changed by this one",
                        spec.name,
                        spec.name,
                        slot.quoted()
                    ),
                ))
            }
            super::compact::Drained::Done {
                this_run,
                keys,
                chunks,
                failed,
                ..
            } => (this_run, keys, chunks, failed),
        };
    emit(
        ctx.out,
        &format!(
            "-- applied: folded {this_run} slot rows of {keys} keys into {} in {chunks} \
             transaction{}",
            rule.logical.quoted(),
            if chunks == 1 { "" } else { "s" }
        ),
    )?;
    if !failed.is_empty() {
        return Err(Error::new(
            Source::Backend,
            format!(
                "counter '{}': keys not folded (run the revert again): {}",
                spec.name,
                failed.join("; ")
            ),
        ));
    }
    let left = row_count(ctx.conn, &slot).await?;
    if left > 0 {
        emit(
            ctx.out,
            &format!(
                "-- warning: {} holds {left} slot rows again: a proxy has not reloaded the \
                 rule with drain = true yet; reload it and run the revert again",
                slot.quoted()
            ),
        )?;
    }
    Ok(())
}

async fn drop_table(ctx: &mut RevertContext<'_>, t: &TableName, rule: &str) -> Result<()> {
    let left = row_count(ctx.conn, t).await?;
    if left > 0 {
        return Err(Error::new(
            Source::Internal,
            format!(
                "rule {rule}: {} still holds {left} rows after the fold; not dropped",
                t.quoted()
            ),
        ));
    }
    let sql = format!("DROP TABLE IF EXISTS {}", t.quoted());
    run_sql(ctx.conn, rule, &sql).await?;
    emit(ctx.out, &format!("-- applied: {sql}"))
}

/// The fold's statements for one counter.
struct Fold {
    /// Rule name, for messages.
    rule: String,
    /// The logical table.
    logical: TableName,
    /// The renamed slot table, which the fold reads and empties.
    retired: TableName,
    /// Key columns.
    key: Vec<String>,
    /// Counter columns.
    columns: Vec<String>,
}

impl Fold {
    fn new(spec: &CounterSpec, logical: &TableName, retired: &TableName) -> Fold {
        Fold {
            rule: spec.name.clone(),
            logical: logical.clone(),
            retired: retired.clone(),
            key: spec.key.clone(),
            columns: spec.columns.clone(),
        }
    }

    /// `(k1, k2) <= (?, ?)`, or nothing for a counter without key columns / the
    /// last chunk.
    fn bound(&self, bounded: bool) -> String {
        if !bounded || self.key.is_empty() {
            return String::new();
        }
        let marks = vec!["?"; self.key.len()].join(", ");
        format!(" WHERE ({}) <= ({marks})", list(&self.key))
    }

    /// The keys of `t`.
    async fn keys(&self, conn: &mut Conn, t: &TableName) -> Result<u64> {
        if self.key.is_empty() {
            return Ok(u64::from(row_count(conn, t).await? > 0));
        }
        let n: Option<u64> = conn
            .query_first(format!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM {} GROUP BY {}) k",
                t.quoted(),
                list(&self.key)
            ))
            .await
            .map_err(|e| schema_err(format!("counting the keys of {}", t.quoted()), e))?;
        Ok(n.unwrap_or_default())
    }

    /// The chunk's upper key: the `batch`-th key of the renamed table, `None` when
    /// it holds fewer keys (the chunk is the rest).
    fn bound_sql(&self, batch: usize) -> String {
        format!(
            "SELECT {k} FROM {} GROUP BY {k} ORDER BY {k} LIMIT 1 OFFSET {}",
            self.retired.quoted(),
            batch.saturating_sub(1),
            k = list(&self.key)
        )
    }

    /// Adds the chunk's sums to the logical rows.
    fn update_sql(&self, bounded: bool) -> String {
        let sums: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("COALESCE(SUM({q}), 0) AS {q}", q = quote(c)))
            .collect();
        let set: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("l.{q} = l.{q} + s.{q}", q = quote(c)))
            .collect();
        if self.key.is_empty() {
            return format!(
                "UPDATE {} l JOIN (SELECT {} FROM {}) s SET {}",
                self.logical.quoted(),
                sums.join(", "),
                self.retired.quoted(),
                set.join(", ")
            );
        }
        let on: Vec<String> = self
            .key
            .iter()
            .map(|k| format!("l.{q} = s.{q}", q = quote(k)))
            .collect();
        format!(
            "UPDATE {} l JOIN (SELECT {}, {} FROM {}{} GROUP BY {}) s ON {} SET {}",
            self.logical.quoted(),
            list(&self.key),
            sums.join(", "),
            self.retired.quoted(),
            self.bound(bounded),
            list(&self.key),
            on.join(" AND "),
            set.join(", ")
        )
    }

    /// Deletes the chunk's slot rows.
    fn delete_sql(&self, bounded: bool) -> String {
        format!(
            "DELETE FROM {}{}",
            self.retired.quoted(),
            self.bound(bounded)
        )
    }

    /// Prints the statements (the rename only when the slot table is still there).
    fn print(&self, ctx: &mut RevertContext<'_>, rename_from: bool) -> Result<()> {
        if rename_from {
            let slot = TableName {
                db: self.retired.db.clone(),
                name: self
                    .retired
                    .name
                    .strip_suffix(RETIRED_SUFFIX)
                    .unwrap_or(&self.retired.name)
                    .to_string(),
            };
            emit(
                ctx.out,
                &format!(
                    "RENAME TABLE {} TO {};",
                    slot.quoted(),
                    self.retired.quoted()
                ),
            )?;
        }
        if !self.key.is_empty() {
            emit(
                ctx.out,
                &format!("-- per chunk, its last key: {};", self.bound_sql(ctx.batch)),
            )?;
        }
        emit(ctx.out, "START TRANSACTION;")?;
        emit(ctx.out, &format!("{};", self.update_sql(true)))?;
        emit(ctx.out, &format!("{};", self.delete_sql(true)))?;
        emit(ctx.out, "COMMIT;")?;
        emit(ctx.out, &format!("DROP TABLE {};", self.retired.quoted()))
    }

    /// Folds the renamed table chunk by chunk until it is empty, through the job
    /// runner ([`crate::jobs::run`]): a transaction per chunk of at most
    /// `ctx.batch` keys, progress lines (or a bar), `--max-rows-per-second`,
    /// replica lag, deadlocks retried. The fold's state stays the renamed table
    /// (folded rows are gone); the job's row in `heatsink_jobs` only reports it.
    async fn run(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        let key = crate::jobs::JobKey {
            db: ctx.registry.db.clone(),
            rule: self.rule.clone(),
            job: REVERT_JOB,
        };
        // A fold that finished before (its table is folded again now) starts a
        // new count.
        if crate::jobs::state(ctx.conn, &key)
            .await?
            .is_some_and(|s| !s.unfinished())
        {
            crate::jobs::reset(ctx.conn, &key, crate::jobs::PENDING).await?;
        }
        let mut settings = ctx.jobs.clone();
        settings.chunk = Some(ctx.batch);
        let mut job = FoldJob {
            fold: self,
            chunks: 0,
        };
        match crate::jobs::run(ctx.conn, &key, &settings, &mut job).await? {
            crate::jobs::Outcome::Busy => Err(Error::new(
                Source::Backend,
                format!(
                    "rule {}: another `heatsink migrate --revert {}` is folding {}; nothing \
                     was changed by this one",
                    self.rule,
                    self.rule,
                    self.retired.quoted()
                ),
            )),
            crate::jobs::Outcome::Done { this_run, .. } => emit(
                ctx.out,
                &format!(
                    "-- applied: folded {this_run} slot rows into {} in {} transactions",
                    self.logical.quoted(),
                    job.chunks
                ),
            ),
        }
    }

    /// The next chunk's upper key (`None`: the rest is the chunk), read from the
    /// renamed table.
    async fn next_bound(&self, conn: &mut Conn, batch: usize) -> Result<Option<Vec<Value>>> {
        if self.key.is_empty() {
            return Ok(None);
        }
        let rows: Vec<Row> = conn
            .exec(self.bound_sql(batch), ())
            .await
            .map_err(|e| schema_err(format!("rule {}: reading a chunk's bound", self.rule), e))?;
        Ok(rows.into_iter().next().map(values))
    }

    /// One chunk, in the transaction the runner opened: adds the sums of the keys
    /// up to `bound` (all keys when `None`) and deletes their slot rows; returns
    /// the rows deleted.
    async fn chunk(&self, conn: &mut Conn, bound: Option<Vec<Value>>) -> Result<u64> {
        let bounded = bound.is_some();
        let params = match bound {
            Some(v) => Params::Positional(v),
            None => Params::Empty,
        };
        let result: std::result::Result<u64, mysql_async::Error> = async {
            conn.exec_drop(self.update_sql(bounded), params.clone())
                .await?;
            conn.exec_drop(self.delete_sql(bounded), params).await?;
            Ok(conn.affected_rows())
        }
        .await;
        result.map_err(|e| {
            schema_err(
                format!(
                    "rule {}: folding {} (the chunk is rolled back, nothing of it changed)",
                    self.rule,
                    self.retired.quoted()
                ),
                e,
            )
        })
    }
}

/// The job name of a revert's fold or copy in `heatsink_jobs` and `/metrics`.
pub const REVERT_JOB: &str = "revert";

/// The fold as a job of the runner.
struct FoldJob<'a> {
    fold: &'a Fold,
    /// Transactions that folded something.
    chunks: u64,
}

#[async_trait(?Send)]
impl crate::jobs::Chunked for FoldJob<'_> {
    fn unit(&self) -> &'static str {
        "slot rows"
    }

    async fn total(&mut self, conn: &mut Conn, _after: Option<&str>) -> Result<u64> {
        row_count(conn, &self.fold.retired).await
    }

    /// The chunk starts at the renamed table's first key, whatever `after` says:
    /// folded keys are gone from it.
    async fn chunk(
        &mut self,
        conn: &mut Conn,
        _after: Option<&str>,
        limit: usize,
    ) -> Result<Option<crate::jobs::Step>> {
        let bound = self.fold.next_bound(conn, limit).await?;
        let last = match &bound {
            Some(v) => position(v),
            None => "the last key".to_string(),
        };
        let n = self.fold.chunk(conn, bound).await?;
        if n == 0 {
            return Ok(None);
        }
        self.chunks += 1;
        Ok(Some(crate::jobs::Step { last, rows: n }))
    }
}

/// A key as the progress row shows it (at most 200 characters).
fn position(key: &[Value]) -> String {
    let text: Vec<String> = key.iter().map(|v| v.as_sql(true)).collect();
    text.join(", ").chars().take(200).collect()
}
