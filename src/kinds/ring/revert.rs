//! `heatsink migrate --revert` for a ring: copies the ring back into the log, then
//! drops the ring and sequence tables and the log's mirroring trigger.
//!
//! What the log holds afterwards, for every key, is exactly what the ring holds:
//! the key's newest `size` rows as the application saw them through heatsink
//! (rows inserted through a proxy running the rule were only ever in the ring;
//! older rows and rows deleted through heatsink were only hidden by it). Rows of
//! the log whose key is NULL, which no ring keeps, stay. The dry run says so, with
//! the numbers, before anything runs.
//!
//! After the rule left every proxy, their inserts go to the log and the log's
//! trigger mirrors each into the ring, so the ring stays the newest rows of each
//! key until the revert. The copy runs under `LOCK TABLES log WRITE, ring WRITE,
//! seq WRITE, heatsink_rules WRITE` with autocommit off:
//!
//! 1. the mirroring trigger is dropped (its `CREATE` statement kept, to put it back
//!    if a later step fails), since inserting the ring's rows into the log would
//!    otherwise fire it;
//! 2. `DELETE FROM log WHERE key IS NOT NULL`, `INSERT INTO log (columns) SELECT
//!    columns FROM ring ORDER BY key, seq`, and the rule's registry row set to
//!    `folded`, then `COMMIT` — one transaction, so the log is either as it was or
//!    the ring's copy, and a rerun (which sees `folded`) never copies again. The
//!    delete and the copy (in chunks of `--batch` keys of the ring, in key order)
//!    run as a job of [`crate::jobs::run_owned`] inside that transaction: progress
//!    lines or a bar, `--max-rows-per-second`;
//! 3. the log's `AUTO_INCREMENT` counter is raised to the ring's when that is
//!    higher, so ids keep increasing;
//! 4. `UNLOCK TABLES`, then the ring and sequence tables are dropped.
//!
//! Inserts and reads of the log wait for the lock (the copy's duration). A proxy
//! that still ran the rule would get errors (1146) once the ring is gone, never a
//! silently lost row: what it inserted before the lock is in the ring and copied.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row, Value};

use super::schema::RING_TRIGGER_SUFFIX;
use super::spec::RingSpec;
use crate::error::{Error, Result, Source};
use crate::kinds::revert::row_count;
use crate::kinds::revert::FOLDED;
use crate::kinds::{Leftovers, RevertContext, SchemaError};
use crate::rules::spec::{quote, TableName};
use crate::schema::{
    emit, existing_trigger, inspect_table, list, resolve_tables, run_sql, schema_err,
    suffixed_name, text, values,
};

/// How long `LOCK TABLES` waits for transactions holding the tables.
const LOCK_WAIT_SECS: u32 = 10;

/// The log, the ring, the sequence table and the log's mirroring trigger.
fn names(spec: &RingSpec, default_db: Option<&str>) -> std::result::Result<[TableName; 4], String> {
    let seq = spec.seq_table_name();
    let (logical, physical) = resolve_tables(&spec.table, &[&spec.ring_table, &seq], default_db)
        .map_err(|e| match e {
            SchemaError::Refused(r) => r,
            SchemaError::Failed(e) => e.to_string(),
        })?;
    let [ring, seq] = <[TableName; 2]>::try_from(physical)
        .map_err(|_| "internal error: ring and sequence tables".to_string())?;
    let trigger = TableName {
        db: logical.db.clone(),
        name: suffixed_name(&ring.name, RING_TRIGGER_SUFFIX),
    };
    Ok([logical, ring, seq, trigger])
}

/// The ring and sequence tables, and the trigger on the log.
pub(crate) fn leftovers(
    spec: &RingSpec,
    default_db: Option<&str>,
) -> std::result::Result<Leftovers, String> {
    let [_, ring, seq, trigger] = names(spec, default_db)?;
    Ok(Leftovers {
        tables: vec![ring, seq],
        triggers: vec![trigger],
    })
}

/// Reverts a ring rule (see the module documentation).
pub(crate) async fn revert(spec: &RingSpec, ctx: &mut RevertContext<'_>) -> Result<()> {
    let [logical, ring, seq, trigger] =
        names(spec, ctx.default_db).map_err(|r| Error::new(Source::Rules, r))?;
    let folded = ctx.registry.state.as_deref() == Some(FOLDED);
    let ring_exists = inspect_table(ctx.conn, &ring).await?.is_some();
    if folded {
        emit(
            ctx.out,
            &format!(
                "-- ring '{}': an earlier revert already copied {} into {}: only dropping \
                 what is left",
                spec.name,
                ring.quoted(),
                logical.quoted()
            ),
        )?;
    } else if !ring_exists {
        emit(
            ctx.out,
            &format!(
                "-- ring '{}': {} is gone: nothing to copy",
                spec.name,
                ring.quoted()
            ),
        )?;
    } else {
        let copy = Copy::read(ctx.conn, spec, [&logical, &ring, &seq, &trigger]).await?;
        copy.print(ctx).await?;
        if ctx.apply {
            copy.run(ctx).await?;
        }
    }
    crate::kinds::revert::drop_leftovers(
        ctx,
        &Leftovers {
            tables: vec![ring, seq],
            triggers: vec![trigger],
        },
    )
    .await
}

/// The copy of one ring into its log.
struct Copy {
    rule: String,
    size: u32,
    logical: TableName,
    ring: TableName,
    seq: TableName,
    trigger: TableName,
    key: Vec<String>,
    /// The log's columns (all of them are in the ring too).
    columns: Vec<String>,
    seq_column: String,
}

impl Copy {
    async fn read(
        conn: &mut Conn,
        spec: &RingSpec,
        [logical, ring, seq, trigger]: [&TableName; 4],
    ) -> Result<Copy> {
        let log = inspect_table(conn, logical).await?.ok_or_else(|| {
            Error::new(
                Source::Rules,
                format!(
                    "rule {}: the log {} does not exist",
                    spec.name,
                    logical.quoted()
                ),
            )
        })?;
        let ring_table = inspect_table(conn, ring).await?.ok_or_else(|| {
            Error::new(
                Source::Rules,
                format!("rule {}: {} does not exist", spec.name, ring.quoted()),
            )
        })?;
        let mut columns = Vec::new();
        for c in &log.columns {
            if ring_table.column(&c.name).is_none() {
                return Err(Error::new(
                    Source::Rules,
                    format!(
                        "revert refused, nothing was changed: column `{}` of the log {} is \
                         not in {}, so the ring cannot be copied back",
                        c.name,
                        logical.quoted(),
                        ring.quoted()
                    ),
                ));
            }
            columns.push(c.name.clone());
        }
        Ok(Copy {
            rule: spec.name.clone(),
            size: spec.size,
            logical: logical.clone(),
            ring: ring.clone(),
            seq: seq.clone(),
            trigger: trigger.clone(),
            key: spec.key.clone(),
            columns,
            seq_column: spec.seq_column.clone(),
        })
    }

    /// `WHERE k1 IS NOT NULL AND …`: the log rows a ring could hold.
    fn keyed(&self) -> String {
        if self.key.is_empty() {
            return String::new();
        }
        let c: Vec<String> = self
            .key
            .iter()
            .map(|k| format!("{} IS NOT NULL", quote(k)))
            .collect();
        format!(" WHERE {}", c.join(" AND "))
    }

    fn delete_sql(&self) -> String {
        format!("DELETE FROM {}{}", self.logical.quoted(), self.keyed())
    }

    /// The whole copy (what the dry run prints): [`Copy::insert_range_sql`] unbounded.
    fn insert_sql(&self) -> String {
        self.insert_range_sql(false, false)
    }

    fn lock_sql(&self, registry: &TableName) -> String {
        format!(
            "LOCK TABLES {} WRITE, {} WRITE, {} WRITE, {} WRITE",
            self.logical.quoted(),
            self.ring.quoted(),
            self.seq.quoted(),
            registry.quoted()
        )
    }

    /// Says what the log will hold, with the numbers, and prints the statements.
    async fn print(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        let log_rows = row_count(ctx.conn, &self.logical).await?;
        let keyed: Option<u64> = ctx
            .conn
            .query_first(format!(
                "SELECT COUNT(*) FROM {}{}",
                self.logical.quoted(),
                self.keyed()
            ))
            .await
            .map_err(|e| {
                schema_err(format!("counting the rows of {}", self.logical.quoted()), e)
            })?;
        let keyed = keyed.unwrap_or_default();
        let ring_rows = row_count(ctx.conn, &self.ring).await?;
        let keys: Option<u64> = if self.key.is_empty() {
            Some(u64::from(ring_rows > 0))
        } else {
            ctx.conn
                .query_first(format!(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM {} GROUP BY {}) k",
                    self.ring.quoted(),
                    list(&self.key)
                ))
                .await
                .map_err(|e| {
                    schema_err(format!("counting the keys of {}", self.ring.quoted()), e)
                })?
        };
        emit(
            ctx.out,
            &format!(
                "-- ring '{}': afterwards the log {} holds for each key exactly what the ring {} \
                 holds, the key's newest {} rows: its {keyed} rows with a key are deleted \
                 (rows older than the newest {}, rows deleted through heatsink) and the ring's \
                 {ring_rows} rows of {} keys are copied in their place{}",
                self.rule,
                self.logical.quoted(),
                self.ring.quoted(),
                self.size,
                self.size,
                keys.unwrap_or_default(),
                if log_rows > keyed {
                    format!("; its {} rows whose key is NULL stay", log_rows - keyed)
                } else {
                    String::new()
                }
            ),
        )?;
        let others = other_insert_triggers(ctx.conn, &self.logical, &self.trigger).await?;
        if !others.is_empty() {
            emit(
                ctx.out,
                &format!(
                    "-- note: the log's own triggers {} fire for the rows copied back",
                    others.join(", ")
                ),
            )?;
        }
        emit(ctx.out, "SET autocommit = 0;")?;
        emit(
            ctx.out,
            &format!("{};", self.lock_sql(&ctx.registry.table())),
        )?;
        emit(
            ctx.out,
            &format!("DROP TRIGGER IF EXISTS {};", self.trigger.quoted()),
        )?;
        emit(ctx.out, &format!("{};", self.delete_sql()))?;
        if self.key.is_empty() {
            emit(ctx.out, &format!("{};", self.insert_sql()))?;
        } else {
            emit(
                ctx.out,
                &format!(
                    "-- copied in chunks of at most {} keys of {} (one transaction: progress \
                     and --max-rows-per-second per chunk), each chunk's last key: {};",
                    ctx.batch,
                    self.ring.quoted(),
                    self.bound_sql(true, ctx.batch)
                ),
            )?;
            emit(ctx.out, &format!("{};", self.insert_range_sql(true, true)))?;
        }
        emit(ctx.out, "COMMIT;")?;
        emit(
            ctx.out,
            &format!(
                "-- ALTER TABLE {} AUTO_INCREMENT = <the ring's>, when the ring's is higher;",
                self.logical.quoted()
            ),
        )?;
        emit(ctx.out, "UNLOCK TABLES;")?;
        emit(ctx.out, "SET autocommit = 1;")
    }

    /// Runs the copy under the table locks (see the module documentation).
    async fn run(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        let rule = self.rule.clone();
        let recreate: Option<String> = if existing_trigger(ctx.conn, &self.trigger).await?.is_some()
        {
            let row: Option<Row> = ctx
                .conn
                .query_first(format!("SHOW CREATE TRIGGER {}", self.trigger.quoted()))
                .await
                .map_err(|e| schema_err(format!("reading trigger {}", self.trigger.quoted()), e))?;
            row.and_then(|r| text(&r, 2))
        } else {
            None
        };
        run_sql(
            ctx.conn,
            &rule,
            &format!("SET SESSION lock_wait_timeout = {LOCK_WAIT_SECS}"),
        )
        .await?;
        run_sql(ctx.conn, &rule, "SET autocommit = 0").await?;
        if let Err(e) = run_sql(ctx.conn, &rule, &self.lock_sql(&ctx.registry.table())).await {
            let _ = ctx.conn.query_drop("SET autocommit = 1").await;
            return Err(e);
        }
        let copied = self.copy_locked(ctx).await;
        if copied.is_err() {
            let _ = ctx.conn.query_drop("ROLLBACK").await;
            if let Some(sql) = &recreate {
                if existing_trigger(ctx.conn, &self.trigger).await?.is_none() {
                    let _ = ctx.conn.query_drop(sql.as_str()).await;
                }
            }
        }
        let _ = ctx.conn.query_drop("UNLOCK TABLES").await;
        let _ = ctx.conn.query_drop("SET autocommit = 1").await;
        let n = copied?;
        emit(
            ctx.out,
            &format!(
                "-- applied: {} now holds the ring's {n} rows for its keys",
                self.logical.quoted()
            ),
        )
    }

    /// The locked part: returns the rows copied.
    async fn copy_locked(&self, ctx: &mut RevertContext<'_>) -> Result<u64> {
        let rule = self.rule.clone();
        run_sql(
            ctx.conn,
            &rule,
            &format!("DROP TRIGGER IF EXISTS {}", self.trigger.quoted()),
        )
        .await?;
        // The delete and the copy by key ranges of the ring, as a job of the
        // runner that owns this one transaction: progress and the throttle.
        let key = crate::jobs::JobKey {
            db: ctx.registry.db.clone(),
            rule: rule.clone(),
            job: crate::kinds::counter::revert::REVERT_JOB,
        };
        let mut settings = ctx.jobs.clone();
        settings.chunk = Some(ctx.batch);
        let mut job = CopyJob {
            copy: self,
            deleted: false,
            lo: None,
            finished: false,
        };
        let n = crate::jobs::run_owned(ctx.conn, &key, &settings, &mut job).await?;
        ctx.conn
            .exec_drop(
                format!(
                    "UPDATE {} SET state = ? WHERE name = ?",
                    ctx.registry.table().quoted()
                ),
                (FOLDED, &rule),
            )
            .await
            .map_err(|e| schema_err(format!("rule {rule}: recording the copy"), e))?;
        run_sql(ctx.conn, &rule, "COMMIT").await?;
        let ring_ai = auto_increment(ctx.conn, &self.ring).await?;
        let log_ai = auto_increment(ctx.conn, &self.logical).await?;
        if let (Some(r), Some(l)) = (ring_ai, log_ai) {
            if r > l {
                run_sql(
                    ctx.conn,
                    &rule,
                    &format!("ALTER TABLE {} AUTO_INCREMENT = {r}", self.logical.quoted()),
                )
                .await?;
            }
        }
        Ok(n)
    }

    /// `(k1, k2)`.
    fn key_tuple(&self) -> String {
        format!("({})", list(&self.key))
    }

    /// The chunk's last key: the `limit`-th key of the ring after `lo`.
    fn bound_sql(&self, lower: bool, limit: usize) -> String {
        let marks = vec!["?"; self.key.len()].join(", ");
        format!(
            "SELECT {k} FROM {}{} GROUP BY {k} ORDER BY {k} LIMIT 1 OFFSET {}",
            self.ring.quoted(),
            if lower {
                format!(" WHERE {} > ({marks})", self.key_tuple())
            } else {
                String::new()
            },
            limit.saturating_sub(1),
            k = list(&self.key)
        )
    }

    /// The copy of the ring's keys in `(lo, hi]` (either bound may be absent).
    fn insert_range_sql(&self, lower: bool, upper: bool) -> String {
        let marks = vec!["?"; self.key.len()].join(", ");
        let mut cond = Vec::new();
        if lower {
            cond.push(format!("{} > ({marks})", self.key_tuple()));
        }
        if upper {
            cond.push(format!("{} <= ({marks})", self.key_tuple()));
        }
        let order: Vec<String> = self
            .key
            .iter()
            .chain(std::iter::once(&self.seq_column))
            .map(|c| quote(c))
            .collect();
        format!(
            "INSERT INTO {} ({cols}) SELECT {cols} FROM {}{} ORDER BY {}",
            self.logical.quoted(),
            self.ring.quoted(),
            if cond.is_empty() {
                String::new()
            } else {
                format!(" WHERE {}", cond.join(" AND "))
            },
            order.join(", "),
            cols = list(&self.columns)
        )
    }
}

/// The copy back as a job the runner drives inside the revert's transaction
/// ([`crate::jobs::run_owned`]): the first chunk deletes the log's keyed rows,
/// every chunk copies the ring's rows of its `limit` keys, in key order.
struct CopyJob<'a> {
    copy: &'a Copy,
    deleted: bool,
    /// The last key copied.
    lo: Option<Vec<Value>>,
    finished: bool,
}

#[async_trait(?Send)]
impl crate::jobs::Chunked for CopyJob<'_> {
    fn unit(&self) -> &'static str {
        "ring rows"
    }

    async fn total(&mut self, conn: &mut Conn, _after: Option<&str>) -> Result<u64> {
        row_count(conn, &self.copy.ring).await
    }

    async fn chunk(
        &mut self,
        conn: &mut Conn,
        _after: Option<&str>,
        limit: usize,
    ) -> Result<Option<crate::jobs::Step>> {
        if self.finished {
            return Ok(None);
        }
        let copy = self.copy;
        if !self.deleted {
            run_sql(conn, &copy.rule, &copy.delete_sql()).await?;
            self.deleted = true;
        }
        let hi: Option<Vec<Value>> = if copy.key.is_empty() {
            None
        } else {
            let params = match &self.lo {
                Some(lo) => Params::Positional(lo.clone()),
                None => Params::Empty,
            };
            let rows: Vec<Row> = conn
                .exec(copy.bound_sql(self.lo.is_some(), limit), params)
                .await
                .map_err(|e| {
                    schema_err(format!("rule {}: reading a chunk's bound", copy.rule), e)
                })?;
            rows.into_iter().next().map(values)
        };
        let mut params: Vec<Value> = self.lo.clone().unwrap_or_default();
        params.extend(hi.clone().unwrap_or_default());
        let sql = copy.insert_range_sql(self.lo.is_some(), hi.is_some());
        conn.exec_drop(
            sql,
            if params.is_empty() {
                Params::Empty
            } else {
                Params::Positional(params)
            },
        )
        .await
        .map_err(|e| {
            schema_err(
                format!(
                    "rule {}: copying {} into {}",
                    copy.rule,
                    copy.ring.quoted(),
                    copy.logical.quoted()
                ),
                e,
            )
        })?;
        let rows = conn.affected_rows();
        let last = match &hi {
            Some(k) => {
                let t: Vec<String> = k.iter().map(|v| v.as_sql(true)).collect();
                t.join(", ")
            }
            None => "the last key".into(),
        };
        match hi {
            Some(k) => self.lo = Some(k),
            None => self.finished = true,
        }
        Ok(Some(crate::jobs::Step { last, rows }))
    }
}

/// A table's `AUTO_INCREMENT` counter (`None` without such a column).
async fn auto_increment(conn: &mut Conn, t: &TableName) -> Result<Option<u64>> {
    let v: Option<Option<u64>> = conn
        .exec_first(
            "SELECT AUTO_INCREMENT FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (t.db.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(format!("reading the AUTO_INCREMENT of {}", t.quoted()), e))?;
    Ok(v.flatten())
}

/// The log's `INSERT` triggers other than the ring's mirroring one.
async fn other_insert_triggers(
    conn: &mut Conn,
    log: &TableName,
    mirror: &TableName,
) -> Result<Vec<String>> {
    let names: Vec<String> = conn
        .exec(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = ? \
             AND EVENT_OBJECT_TABLE = ? AND EVENT_MANIPULATION = 'INSERT' ORDER BY ACTION_ORDER",
            (log.db.clone().unwrap_or_default(), log.name.clone()),
        )
        .await
        .map_err(|e| schema_err(format!("reading the triggers of {}", log.quoted()), e))?;
    Ok(names
        .into_iter()
        .filter(|n| *n != mirror.name)
        .map(|n| quote(&n))
        .collect())
}
