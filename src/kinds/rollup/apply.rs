//! What `heatsink migrate` prints and applies for a rollup rule, and what `check
//! --backend-url` reports (the scheme is described in `schema.rs`).

use std::io::Write;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use crate::error::{Error, Result, Source};
use crate::kinds::Migration;
use crate::report::Severity;
use crate::rules::spec::quote;
use crate::schema::{
    emit, existing_and_missing, run_sql, schema_err, table_has_rows, text, values,
};

use super::schema::{
    counted, delta_comment, delta_trigger, summed, CheckedRollup, Resume, TriggerState,
};
use super::spec::Measure;
use super::triggers::{
    create_sql, delta_body, group_exprs, insert_columns, on_duplicate, DELTA_PK, EVENTS,
};

/// Log rows (primary-key values) aggregated per backfill chunk by default.
const CHUNK: usize = 10_000;

/// Most rollup rows one backfill upsert writes.
const UPSERT_ROWS: usize = 500;

#[async_trait(?Send)]
impl Migration for CheckedRollup {
    async fn problems(&self, _conn: &mut Conn) -> Result<Vec<(Severity, String)>> {
        let mut out = Vec::new();
        if self.create_table.is_some() {
            out.push((
                Severity::Error,
                format!(
                    "rollup table {} does not exist (`heatsink migrate` creates it)",
                    self.rollup.quoted()
                ),
            ));
        }
        for t in &self.triggers {
            match t.state {
                TriggerState::Missing => out.push((
                    Severity::Error,
                    format!(
                        "trigger {} on {} is missing, so writes to the log would not reach {} (`heatsink migrate` creates it)",
                        t.name.quoted(),
                        self.log.quoted(),
                        self.rollup.quoted()
                    ),
                )),
                TriggerState::Differs => out.push((
                    Severity::Warning,
                    format!(
                        "trigger {} on {} differs from the rule's; {} may not be exact (drop it and run `heatsink migrate` to replace it)",
                        t.name.quoted(),
                        self.log.quoted(),
                        self.rollup.quoted()
                    ),
                )),
                TriggerState::Fits => {}
            }
        }
        if self.legacy_key {
            out.push((
                Severity::Warning,
                format!(
                    "{} has the primary key order of earlier versions; reads are exact but a time range does not narrow it (rebuild it: drop the table and its triggers, run `heatsink migrate --apply`)",
                    self.rollup.quoted()
                ),
            ));
        }
        if let Some(r) = &self.resume {
            out.push((
                Severity::Warning,
                format!(
                    "the backfill of {} stopped half way (at {} of {}): reads see a partial sum until `heatsink migrate --apply` continues it",
                    self.rollup.quoted(),
                    position_text(r),
                    r.end
                ),
            ));
        } else if self.restart {
            out.push((
                Severity::Warning,
                format!(
                    "the backfill of {} stopped half way: reads see a partial sum until `heatsink migrate --apply` backfills it again (from the start)",
                    self.rollup.quoted()
                ),
            ));
        } else if self.backfill_due {
            out.push((
                Severity::Warning,
                format!(
                    "{} has rows but {} has none: reads would miss them until `heatsink migrate --apply` backfills it",
                    self.log.quoted(),
                    self.rollup.quoted()
                ),
            ));
        }
        if self.stale_delta && !self.backfill_due {
            out.push((
                Severity::Warning,
                format!(
                    "{} or its triggers on {} are left from a backfill that no longer runs; writes to old log rows still fill it (`heatsink migrate --apply` drops them)",
                    self.delta.quoted(),
                    self.log.quoted()
                ),
            ));
        }
        Ok(out)
    }

    async fn run(&self, conn: &mut Conn, apply: bool, out: &mut dyn Write) -> Result<()> {
        self.run_with(conn, apply, &crate::jobs::Settings::default(), out)
            .await
    }

    async fn run_with(
        &self,
        conn: &mut Conn,
        apply: bool,
        jobs: &crate::jobs::Settings,
        out: &mut dyn Write,
    ) -> Result<()> {
        print_header(self, out)?;
        match &self.create_table {
            Some(sql) => {
                emit(out, &format!("{sql};"))?;
                if apply {
                    run_sql(conn, &self.spec.name, sql).await?;
                    emit(out, "-- applied: created rollup table")?;
                }
            }
            None => emit(
                out,
                &format!(
                    "-- rollup table {} exists and matches the rule",
                    self.rollup.quoted()
                ),
            )?,
        }
        let missing = existing_and_missing(&self.triggers, out)?;
        if missing.is_empty() && !self.backfill_due {
            if self.stale_delta {
                print_drop_delta(self, out)?;
                if apply {
                    drop_delta(conn, self, out).await?;
                }
            }
            return emit(out, "");
        }
        print_locked_script(self, &missing, jobs, out)?;
        if self.stale_delta && !self.backfill_due {
            print_drop_delta(self, out)?;
        }
        if apply {
            apply_locked(conn, self, &missing, jobs, out).await?;
        }
        emit(out, "")
    }
}

/// `LOCK TABLES` of the log and the rollup, and of the delta table when a backfill
/// is due (it is emptied or read under the lock).
fn lock_sql(rule: &CheckedRollup) -> String {
    let delta = if rule.backfill_due {
        format!(", {} WRITE", rule.delta.quoted())
    } else {
        String::new()
    };
    format!(
        "LOCK TABLES {} WRITE, {} WRITE{delta}",
        rule.log.quoted(),
        rule.rollup.quoted()
    )
}

/// `<key>` of a stopped backfill's position, or "the start".
fn position_text(r: &Resume) -> String {
    match &r.position {
        Some(p) => p.clone(),
        None => "the start".into(),
    }
}

/// The delta triggers' names, quoted.
fn delta_triggers(rule: &CheckedRollup) -> Vec<String> {
    EVENTS
        .iter()
        .map(|e| delta_trigger(rule, *e).quoted())
        .collect()
}

/// `CREATE TRIGGER` of the three delta triggers for a backfill ending at `end`.
fn delta_trigger_sql(rule: &CheckedRollup, end: &str) -> Vec<String> {
    EVENTS
        .iter()
        .map(|e| {
            create_sql(
                rule,
                &delta_trigger(rule, *e),
                *e,
                &delta_body(rule, *e, end),
            )
        })
        .collect()
}

/// Prints the drop of a finished (or abandoned) backfill's delta triggers and table.
fn print_drop_delta(rule: &CheckedRollup, out: &mut dyn Write) -> Result<()> {
    emit(
        out,
        "-- the backfill's delta triggers and table are no longer needed",
    )?;
    for t in delta_triggers(rule) {
        emit(out, &format!("DROP TRIGGER IF EXISTS {t};"))?;
    }
    emit(
        out,
        &format!("DROP TABLE IF EXISTS {};", rule.delta.quoted()),
    )
}

/// Drops the delta triggers, then the delta table (no write can meet a trigger
/// whose table is gone: `DROP TRIGGER` waits for every transaction that has the
/// log open, and later statements open it without the trigger). A drop that waits
/// too long on a long transaction is left for the next `migrate --apply` (the
/// triggers then only keep filling the table; the rollup is exact either way).
async fn drop_delta(conn: &mut Conn, rule: &CheckedRollup, out: &mut dyn Write) -> Result<()> {
    run_sql(conn, &rule.spec.name, "SET SESSION lock_wait_timeout = 20").await?;
    let mut dropped = Ok(());
    for t in delta_triggers(rule) {
        if let Err(e) = run_sql(
            conn,
            &rule.spec.name,
            &format!("DROP TRIGGER IF EXISTS {t}"),
        )
        .await
        {
            dropped = Err(e);
            break;
        }
    }
    if dropped.is_ok() {
        dropped = run_sql(
            conn,
            &rule.spec.name,
            &format!("DROP TABLE IF EXISTS {}", rule.delta.quoted()),
        )
        .await
        .map(|_| ());
    }
    let _ = conn
        .query_drop("SET SESSION lock_wait_timeout = DEFAULT")
        .await;
    match dropped {
        Ok(()) => emit(
            out,
            &format!(
                "-- applied: dropped the backfill's delta triggers and {}",
                rule.delta.quoted()
            ),
        ),
        Err(e) => emit(
            out,
            &format!(
                "-- note: the backfill's delta triggers and {} are left ({e}); the next `heatsink migrate --apply` drops them",
                rule.delta.quoted()
            ),
        ),
    }
}

fn print_header(rule: &CheckedRollup, out: &mut dyn Write) -> Result<()> {
    let dims: Vec<String> = rule.dims.iter().map(|d| quote(&d.column.name)).collect();
    let measures: Vec<String> = rule.measures.iter().map(measure_text).collect();
    emit(
        out,
        &format!(
            "-- rule {}: rollup of log {} by {} of {}{} in {} ({}; {} slots)",
            rule.spec.name,
            rule.log.quoted(),
            rule.spec.bucket.unit().to_ascii_lowercase(),
            quote(&rule.time),
            if dims.is_empty() {
                String::new()
            } else {
                format!(" and {}", dims.join(", "))
            },
            rule.rollup.quoted(),
            measures.join(", "),
            rule.spec.slots
        ),
    )?;
    for note in &rule.notes {
        emit(out, &format!("-- note: {note}"))?;
    }
    Ok(())
}

fn measure_text(m: &super::schema::Measured) -> String {
    match &m.measure {
        Measure::Rows => "count(*)".into(),
        Measure::Count(c) => format!("count({c})"),
        Measure::Sum(c) => format!("sum({c})"),
    }
}

/// Prints the short locked part and, when due, the backfill.
fn print_locked_script(
    rule: &CheckedRollup,
    missing: &[&str],
    jobs: &crate::jobs::Settings,
    out: &mut dyn Write,
) -> Result<()> {
    emit(
        out,
        "-- the log is locked only while the triggers are created and the backfill's snapshot is taken",
    )?;
    if rule.backfill_due && rule.resume.is_none() {
        emit(out, &format!("{};", rule.delta_create))?;
    }
    emit(out, &format!("{};", lock_sql(rule)))?;
    if let Some(r) = &rule.resume {
        emit(
            out,
            &format!(
                "-- a backfill stopped half way: continuing at {} of {}; the changes made since its snapshot to the rows it has not reached leave the rollup\n{};\nDELETE FROM {};",
                position_text(r),
                r.end,
                subtract_sql(rule, r),
                rule.delta.quoted()
            ),
        )?;
    } else if rule.restart {
        emit(
            out,
            &format!(
                "-- a backfill stopped half way: it starts over from an empty rollup\nTRUNCATE TABLE {};",
                rule.rollup.quoted()
            ),
        )?;
    }
    if rule.backfill_due && rule.resume.is_none() {
        emit(
            out,
            &format!(
                "-- while the backfill runs, the changes to log rows up to its last key (?end, the log's largest key now) are kept in {} too\nTRUNCATE TABLE {};\nALTER TABLE {} COMMENT = '{}';",
                rule.delta.quoted(),
                rule.delta.quoted(),
                rule.delta.quoted(),
                delta_comment("?end")
            ),
        )?;
    }
    emit(out, "DELIMITER ;;")?;
    if rule.backfill_due && rule.resume.is_none() {
        for ddl in delta_trigger_sql(rule, "?end") {
            emit(out, &format!("{ddl};;"))?;
        }
    }
    for ddl in missing {
        emit(out, &format!("{ddl};;"))?;
    }
    emit(out, "DELIMITER ;")?;
    if rule.backfill_due {
        emit(
            out,
            "-- (second connection) START TRANSACTION WITH CONSISTENT SNAPSHOT;",
        )?;
    }
    emit(out, "UNLOCK TABLES;")?;
    if rule.backfill_due {
        emit(
            out,
            &format!(
                "-- backfill (job '{}'): on the snapshot, for each chunk of {} primary-key values ?lo < pk <= ?hi of the log:",
                super::schema::BACKFILL,
                jobs.chunk_or(CHUNK)
            ),
        )?;
        emit(
            out,
            &format!("--   {};", chunk_sql(rule, "?lo", Some("?hi"))),
        )?;
        emit(
            out,
            &format!(
                "--   and its groups added with INSERT INTO {} ({}) VALUES (…) {}; committed with the chunk's progress row",
                rule.rollup.quoted(),
                insert_columns(rule),
                on_duplicate(rule)
            ),
        )?;
        emit(
            out,
            &format!(
                "-- once the last chunk is committed: DROP TRIGGER {}; DROP TABLE {}",
                delta_triggers(rule).join(", "),
                rule.delta.quoted()
            ),
        )?;
    }
    Ok(())
}

/// Subtracts from the rollup (slot 0) the changes the delta table holds for the log
/// keys the stopped backfill had not reached (`position < key <= end`).
fn subtract_sql(rule: &CheckedRollup, r: &Resume) -> String {
    let groups: Vec<String> = rule
        .dims
        .iter()
        .map(|d| quote(&d.column.name))
        .chain(["`hs_nulls`".to_string(), "`hs_bucket`".to_string()])
        .collect();
    let mut select: Vec<String> = groups.clone();
    select.push("0".into());
    select.extend(
        super::schema::layout(rule)
            .into_iter()
            .skip(rule.dims.len() + 3)
            .map(|(n, _)| format!("-SUM({})", quote(&n))),
    );
    let aliased: Vec<String> = select
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{e} AS `c{i}`"))
        .collect();
    let pk = quote(DELTA_PK);
    let after = r
        .position
        .as_ref()
        .map(|p| format!("{pk} > {p} AND "))
        .unwrap_or_default();
    format!(
        "INSERT INTO {} ({}) SELECT * FROM (SELECT {} FROM {} WHERE {after}{pk} <= {} GROUP BY {}) AS `hs_d` {}",
        rule.rollup.quoted(),
        insert_columns(rule),
        aliased.join(", "),
        rule.delta.quoted(),
        r.end,
        groups.join(", "),
        on_duplicate(rule)
    )
}

/// The backfill's aggregate of the log rows with `lo < pk <= hi` (no upper bound
/// for the last chunk): the group
/// expressions, slot 0, then the measures in layout order.
fn chunk_sql(rule: &CheckedRollup, lo: &str, hi: Option<&str>) -> String {
    let mut select = group_exprs(rule, "");
    let groups = select.len();
    select.push("0".into());
    select.push("COUNT(*)".into());
    for c in counted(rule) {
        select.push(format!("COUNT({})", quote(c)));
    }
    for (c, scale) in summed(rule) {
        select.push(format!(
            "CAST(IFNULL(SUM({}), 0) AS DECIMAL(65,{scale}))",
            quote(c)
        ));
    }
    let pk = quote(rule.pk.as_deref().unwrap_or_default());
    let by: Vec<String> = (1..=groups).map(|i| i.to_string()).collect();
    let upto = hi
        .map(|hi| format!(" AND {pk} <= {hi}"))
        .unwrap_or_default();
    format!(
        "SELECT {} FROM {} WHERE {pk} > {lo}{upto} GROUP BY {}",
        select.join(", "),
        rule.log.quoted(),
        by.join(", ")
    )
}

fn backend(rule: &CheckedRollup, what: &str, e: mysql_async::Error) -> Error {
    Error::with_cause(
        Source::Backend,
        format!("rule {}: {what}", rule.spec.name),
        e,
    )
}

/// Under the lock: creates the missing triggers and, when the rollup is still empty
/// and the log is not, opens the backfill's snapshot (or, for a stopped backfill
/// that can continue, takes its deltas out and opens a new snapshot); then unlocks
/// and backfills.
async fn apply_locked(
    conn: &mut Conn,
    rule: &CheckedRollup,
    missing: &[&str],
    jobs: &crate::jobs::Settings,
    out: &mut dyn Write,
) -> Result<()> {
    if rule.backfill_due {
        // One backfill at a time: a second run finds the lock taken.
        if !crate::jobs::try_lock(conn, &rule.job).await? {
            return emit(
                out,
                &format!(
                    "-- rule {}: the backfill of {} is running elsewhere; skipped",
                    rule.spec.name,
                    rule.rollup.quoted()
                ),
            );
        }
        if rule.restart {
            // The check ran before the lock: a run that held it may have moved the
            // backfill on (or finished it) since.
            let now = crate::jobs::state(conn, &rule.job).await;
            let same = match (&now, &rule.resume) {
                (Ok(Some(s)), Some(r)) => s.unfinished() && s.position == r.position,
                (Ok(Some(s)), None) => s.unfinished(),
                _ => false,
            };
            if !same {
                crate::jobs::unlock(conn, &rule.job).await;
                now?;
                return emit(
                    out,
                    &format!(
                        "-- rule {}: the backfill of {} moved on in another run meanwhile; skipped (run migrate again)",
                        rule.spec.name,
                        rule.rollup.quoted()
                    ),
                );
            }
        }
        if rule.resume.is_none() {
            // Before anything of a new backfill exists: a run stopped from here on
            // finds no position of an earlier one.
            if let Err(e) = crate::jobs::reset(conn, &rule.job, crate::jobs::PENDING).await {
                crate::jobs::unlock(conn, &rule.job).await;
                return Err(e);
            }
        }
    }
    let done = apply_held(conn, rule, missing, jobs, out).await;
    if rule.backfill_due {
        crate::jobs::unlock(conn, &rule.job).await;
    }
    done
}

async fn apply_held(
    conn: &mut Conn,
    rule: &CheckedRollup,
    missing: &[&str],
    jobs: &crate::jobs::Settings,
    out: &mut dyn Write,
) -> Result<()> {
    let mut snapshot = if rule.backfill_due {
        let mut c = Conn::new(conn.opts().clone())
            .await
            .map_err(|e| backend(rule, "opening the backfill connection", e))?;
        c.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await
            .map_err(|e| backend(rule, "setting the backfill's isolation level", e))?;
        Some(c)
    } else {
        None
    };
    if rule.backfill_due && rule.resume.is_none() {
        run_sql(conn, &rule.spec.name, &rule.delta_create).await?;
    }
    // A lock request queued behind a long reader of the log would hold up its
    // writers: give up after a while instead.
    run_sql(conn, &rule.spec.name, "SET SESSION lock_wait_timeout = 20").await?;
    let locked = match run_sql(conn, &rule.spec.name, &lock_sql(rule)).await {
        Ok(_) => locked_part(conn, rule, missing, snapshot.as_mut()).await,
        Err(e) => Err(e),
    };
    let _ = conn.query_drop("UNLOCK TABLES").await;
    let _ = conn
        .query_drop("SET SESSION lock_wait_timeout = DEFAULT")
        .await;
    let (created, end) = locked?;
    for name in created {
        emit(out, &format!("-- applied: created trigger {name}"))?;
    }
    match (end, snapshot) {
        (Some(end), Some(snap)) => {
            if let Some(r) = &rule.resume {
                emit(
                    out,
                    &format!(
                        "-- rule {}: the backfill of {} stopped half way: continuing at {} of {} ({} log rows done); its changes since then to the rows after {} taken out of the rollup",
                        rule.spec.name,
                        rule.rollup.quoted(),
                        position_text(r),
                        r.end,
                        r.rows_done,
                        position_text(r)
                    ),
                )?;
            } else if rule.restart {
                emit(
                    out,
                    &format!(
                        "-- rule {}: a backfill stopped half way without its delta triggers: started over",
                        rule.spec.name
                    ),
                )?;
            }
            let mut job = Backfill {
                rule,
                snap,
                end,
                groups: 0,
            };
            let mut settings = jobs.clone();
            settings.chunk = Some(jobs.chunk_or(CHUNK));
            let done = crate::jobs::run(conn, &rule.job, &settings, &mut job).await;
            let _ = job.snap.query_drop("COMMIT").await;
            let _ = job.snap.disconnect().await;
            let done = done.map_err(|e| {
                Error::new(
                    Source::Backend,
                    format!(
                        "{e}\nrule {}: the backfill of {} stopped half way; run migrate --apply again: it continues after the last committed chunk",
                        rule.spec.name,
                        rule.rollup.quoted()
                    ),
                )
            })?;
            match done {
                crate::jobs::Outcome::Done { this_run, .. } => {
                    emit(
                        out,
                        &format!(
                            "-- applied: backfilled {this_run} log rows into {} rollup rows",
                            job.groups
                        ),
                    )?;
                    drop_delta(conn, rule, out).await
                }
                crate::jobs::Outcome::Busy => emit(
                    out,
                    &format!(
                        "-- rule {}: the backfill of {} is running elsewhere; skipped",
                        rule.spec.name,
                        rule.rollup.quoted()
                    ),
                ),
            }
        }
        (_, snap) => {
            if let Some(snap) = snap {
                let _ = snap.disconnect().await;
            }
            if rule.backfill_due {
                // Nothing to backfill after all: nothing is left half done.
                crate::jobs::reset(conn, &rule.job, crate::jobs::DONE).await?;
                drop_delta(conn, rule, out).await?;
                emit(
                    out,
                    &format!(
                        "-- note: no backfill: {} was no longer empty (or the log was) once locked",
                        rule.rollup.quoted()
                    ),
                )?;
            } else if rule.stale_delta {
                drop_delta(conn, rule, out).await?;
            }
            Ok(())
        }
    }
}

/// The part under `LOCK TABLES`: (triggers created, the backfill's last key when
/// there is one to run).
///
/// A stopped backfill that can continue: its deltas of the keys it had not reached
/// leave the rollup and the delta table is emptied, in one transaction, and the new
/// snapshot is opened. Otherwise (a new backfill, or a stopped one without its delta
/// triggers, whose rollup is emptied first): the delta table is emptied and marked
/// with the last key, the delta triggers and the missing triggers are created, and
/// the snapshot is opened.
async fn locked_part(
    conn: &mut Conn,
    rule: &CheckedRollup,
    missing: &[&str],
    mut snapshot: Option<&mut Conn>,
) -> Result<(Vec<String>, Option<String>)> {
    if let (Some(r), Some(snap)) = (&rule.resume, snapshot.as_deref_mut()) {
        take_out_deltas(conn, rule, r).await?;
        start_snapshot(rule, snap).await?;
        return Ok((Vec::new(), Some(r.end.clone())));
    }
    if rule.backfill_due {
        // Whatever an earlier backfill left: a new one starts below.
        for t in delta_triggers(rule) {
            run_sql(
                conn,
                &rule.spec.name,
                &format!("DROP TRIGGER IF EXISTS {t}"),
            )
            .await?;
        }
    }
    if rule.restart {
        // A backfill stopped half way without its delta triggers: its partial sums
        // go, with every trigger delta so far; the new snapshot below starts the
        // sum over.
        run_sql(
            conn,
            &rule.spec.name,
            &format!("TRUNCATE TABLE {}", rule.rollup.quoted()),
        )
        .await?;
    }
    let due = rule.backfill_due
        && table_has_rows(conn, &rule.log).await?
        && !table_has_rows(conn, &rule.rollup).await?;
    let mut end = None;
    let mut created = Vec::new();
    if due {
        let pk = quote(rule.pk.as_deref().unwrap_or_default());
        let last: Option<Row> = conn
            .query_first(format!(
                "SELECT CAST(MAX({pk}) AS CHAR) FROM {}",
                rule.log.quoted()
            ))
            .await
            .map_err(|e| backend(rule, "reading the log's largest key", e))?;
        let Some(last) = last.and_then(|r| text(&r, 0)) else {
            return Ok((created, None));
        };
        run_sql(
            conn,
            &rule.spec.name,
            &format!("TRUNCATE TABLE {}", rule.delta.quoted()),
        )
        .await?;
        run_sql(
            conn,
            &rule.spec.name,
            &format!(
                "ALTER TABLE {} COMMENT = '{}'",
                rule.delta.quoted(),
                delta_comment(&last)
            ),
        )
        .await?;
        for ddl in delta_trigger_sql(rule, &last) {
            if let Err(e) = run_sql(conn, &rule.spec.name, &ddl).await {
                drop_created(conn, &created).await;
                return Err(e);
            }
        }
        created.extend(delta_triggers(rule));
        end = Some(last);
    }
    for (ddl, t) in missing.iter().zip(
        rule.triggers
            .iter()
            .filter(|t| t.state == TriggerState::Missing),
    ) {
        if let Err(e) = run_sql(conn, &rule.spec.name, ddl).await {
            // All three or none: a partial set would make the rollup drift.
            drop_created(conn, &created).await;
            return Err(e);
        }
        created.push(t.name.quoted());
    }
    match (end, snapshot) {
        (Some(end), Some(snap)) => {
            start_snapshot(rule, snap).await?;
            Ok((created, Some(end)))
        }
        _ => Ok((created, None)),
    }
}

/// Drops the triggers of `created` (quoted names) after a failed creation.
async fn drop_created(conn: &mut Conn, created: &[String]) {
    for t in created {
        let _ = conn.query_drop(format!("DROP TRIGGER IF EXISTS {t}")).await;
    }
}

async fn start_snapshot(rule: &CheckedRollup, snap: &mut Conn) -> Result<()> {
    snap.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .await
        .map_err(|e| backend(rule, "starting the backfill's snapshot", e))
}

/// Under the lock, for a stopped backfill that continues: subtracts the delta
/// table's changes to the keys after the position from the rollup and empties the
/// delta table, in one transaction (`autocommit` off: `START TRANSACTION` would
/// release the table locks). Killed in between, neither happened.
async fn take_out_deltas(conn: &mut Conn, rule: &CheckedRollup, r: &Resume) -> Result<()> {
    run_sql(conn, &rule.spec.name, "SET autocommit = 0").await?;
    let mut done = run_sql(conn, &rule.spec.name, &subtract_sql(rule, r))
        .await
        .map(|_| ());
    if done.is_ok() {
        done = run_sql(
            conn,
            &rule.spec.name,
            &format!("DELETE FROM {}", rule.delta.quoted()),
        )
        .await
        .map(|_| ());
    }
    if done.is_ok() {
        done = run_sql(conn, &rule.spec.name, "COMMIT").await.map(|_| ());
    }
    if done.is_err() {
        let _ = conn.query_drop("ROLLBACK").await;
    }
    let _ = conn.query_drop("SET autocommit = 1").await;
    done
}

/// The backfill as a job of the runner: on the snapshot `snap`, chunks of the log's
/// primary key, each chunk's groups upserted on the runner's connection in the
/// transaction that records the chunk's progress.
struct Backfill<'a> {
    rule: &'a CheckedRollup,
    snap: Conn,
    /// The last key: rows after it came after the first snapshot (the triggers
    /// counted them whole).
    end: String,
    /// Rollup rows written (groups upserted).
    groups: u64,
}

#[async_trait(?Send)]
impl crate::jobs::Chunked for Backfill<'_> {
    fn unit(&self) -> &'static str {
        "log rows"
    }

    async fn total(&mut self, conn: &mut Conn, _after: Option<&str>) -> Result<u64> {
        // The server's estimate: counting 20M rows would take a while.
        let log = &self.rule.log;
        let n: Option<Option<u64>> = conn
            .exec_first(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (log.db.clone().unwrap_or_default(), log.name.clone()),
            )
            .await
            .map_err(|e| schema_err(format!("estimating the rows of {}", log.quoted()), e))?;
        Ok(n.flatten().unwrap_or(0))
    }

    async fn chunk(
        &mut self,
        conn: &mut Conn,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<crate::jobs::Step>> {
        let rule = self.rule;
        let snap = &mut self.snap;
        let pk = quote(rule.pk.as_deref().unwrap_or_default());
        let log = rule.log.quoted();
        let end = &self.end;
        let lo = match after {
            Some(lo) => lo.to_string(),
            None => {
                let first: Option<Row> = snap
                    .query_first(format!(
                        "SELECT CAST(MIN({pk}) - 1 AS CHAR) FROM {log} WHERE {pk} <= {end}"
                    ))
                    .await
                    .map_err(|e| schema_err(format!("reading {log}"), e))?;
                match first.and_then(|r| text(&r, 0)) {
                    Some(lo) => lo,
                    None => return Ok(None),
                }
            }
        };
        // The chunk's last key: the limit-th after lo, else the last there is.
        let next: Option<Row> = snap
            .query_first(format!(
                "SELECT CAST({pk} AS CHAR) FROM {log} WHERE {pk} > {lo} AND {pk} <= {end} ORDER BY {pk} LIMIT 1 OFFSET {}",
                limit.max(1) - 1
            ))
            .await
            .map_err(|e| schema_err(format!("reading {log}"), e))?;
        let hi = match next.and_then(|r| text(&r, 0)) {
            Some(hi) => hi,
            None => {
                let last: Option<Row> = snap
                    .query_first(format!(
                        "SELECT CAST(MAX({pk}) AS CHAR) FROM {log} WHERE {pk} > {lo} AND {pk} <= {end}"
                    ))
                    .await
                    .map_err(|e| schema_err(format!("reading {log}"), e))?;
                match last.and_then(|r| text(&r, 0)) {
                    Some(hi) => hi,
                    None => return Ok(None),
                }
            }
        };
        // The binary protocol keeps the values' types (numbers, dates) for the upsert.
        let chunk: Vec<Row> = snap
            .exec(chunk_sql(rule, &lo, Some(&hi)), ())
            .await
            .map_err(|e| schema_err(format!("aggregating {log} after {lo}"), e))?;
        let chunk: Vec<Vec<Value>> = chunk.into_iter().map(values).collect();
        let rows = chunk
            .iter()
            .map(|r| count_of(&r[rule.dims.len() + 3]))
            .sum::<u64>();
        self.groups += upsert_groups(conn, rule, chunk).await?;
        Ok(Some(crate::jobs::Step { last: hi, rows }))
    }
}

fn count_of(v: &Value) -> u64 {
    match v {
        Value::Int(n) => u64::try_from(*n).unwrap_or(0),
        Value::UInt(n) => *n,
        Value::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

/// Adds aggregated groups (rows in layout order) to the rollup; returns how many.
async fn upsert_groups(
    conn: &mut Conn,
    rule: &CheckedRollup,
    rows: Vec<Vec<Value>>,
) -> Result<u64> {
    let n = rows.len() as u64;
    let width = rows.first().map_or(0, Vec::len);
    for batch in rows.chunks(UPSERT_ROWS) {
        let one = format!("({})", vec!["?"; width].join(", "));
        let sql = format!(
            "INSERT INTO {} ({}) VALUES {} {}",
            rule.rollup.quoted(),
            insert_columns(rule),
            vec![one; batch.len()].join(", "),
            on_duplicate(rule)
        );
        let params: Vec<Value> = batch.iter().flatten().cloned().collect();
        conn.exec_drop(sql, params)
            .await
            .map_err(|e| backend(rule, "adding backfilled groups", e))?;
    }
    Ok(n)
}
