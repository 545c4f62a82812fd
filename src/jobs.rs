//! Long jobs: the one runner every backfill, fill and fold goes through.
//!
//! A long job (a rollup's backfill, a push timeline's mailbox fill, …) is a
//! [`Chunked`]: given the key it stopped after, it does the next bounded chunk of
//! work — by key range, never `OFFSET` — and says which key it stopped after and
//! how many items it did. The [`run`] loop around it:
//!
//! - opens a transaction per chunk, lets the job do its work in it, writes the
//!   job's progress row (the key reached, items done) in the same transaction and
//!   commits: a chunk's work and its progress are one commit, so a run killed at
//!   any point (`kill -9`) leaves either both or neither, and running the same
//!   command again continues after the last committed chunk;
//! - keeps the progress in MySQL, in `heatsink_jobs` of the rule's database (next
//!   to `heatsink_rules`, see [`crate::registry`]), never in the process: any
//!   process may continue a job another started;
//! - holds a named lock (`GET_LOCK`) for the run, so that two runs of one job do
//!   not interleave: the second is told the job is running elsewhere;
//! - reports progress — items done, the total (an estimate), the rate and the time
//!   left — as a bar on a terminal's stderr, else as a plain line every few
//!   seconds, and as `/metrics` gauges ([`gauges`]) for jobs run inside `serve`;
//! - throttles: at most [`Settings::max_rows_per_second`] items a second, and
//!   waits while the server reports replication falling behind ([`Lag`]).
//!
//! A job that must be all or nothing (a copy under `LOCK TABLES`: the ring's
//! backfill, its revert's copy back) owns its one transaction instead and goes
//! through [`run_owned`]: the same chunks, progress and throttle, without the
//! progress row, the named lock, retries and lag waits.
//!
//! The kinds own the SQL; the runner knows no kind.
//!
//! ```sql
//! CREATE TABLE heatsink_jobs (
//!   rule VARCHAR(64) NOT NULL, job VARCHAR(32) NOT NULL,
//!   state VARCHAR(16) NOT NULL,         -- 'pending', 'running', 'done'
//!   position VARCHAR(255) NULL,         -- the key the last committed chunk ended at
//!   rows_done BIGINT UNSIGNED NOT NULL, rows_total BIGINT UNSIGNED NULL,
//!   started_at TIMESTAMP(6) NOT NULL, updated_at TIMESTAMP(6) NOT NULL,
//!   PRIMARY KEY (rule, job)
//! ) ENGINE=InnoDB
//! ```

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::error::{Error, OrErr, Result, Source};
use crate::rules::spec::TableName;
use crate::schema::text;

/// The job-state table's name, in the database of the rule's logical table.
pub const TABLE: &str = "heatsink_jobs";

/// Items per chunk when not set.
pub const DEFAULT_CHUNK: usize = 1000;

/// Seconds between plain progress lines when not set.
pub const DEFAULT_REPORT_SECONDS: f64 = 5.0;

/// Galera's receive queue above which a job waits ([`Lag`]).
pub const MAX_RECV_QUEUE: u64 = 100;

/// Seconds a configured replica may fall behind before a job waits ([`Lag`]).
pub const MAX_REPLICA_LAG: u64 = 10;

/// How a long job runs: its pace and how it reports.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Items per chunk (one transaction each); `None`: the job's default.
    pub chunk: Option<usize>,
    /// At most this many items a second; `None`: as fast as the server goes.
    pub max_rows_per_second: Option<f64>,
    /// Seconds between progress lines when stderr is not a terminal.
    pub report_every: Duration,
    /// `mysql://…` of a replica whose `Seconds_Behind_Master` the job watches.
    pub replica_url: Option<String>,
    /// Print progress to stderr (off for jobs run inside `serve`, which log).
    pub progress: bool,
    /// Seconds a chunk waits for a row lock the application holds
    /// (`innodb_lock_wait_timeout` of the job's session) before it is rolled back
    /// and retried; `None`: the server's setting.
    pub lock_wait_timeout: Option<u64>,
}

impl Settings {
    /// The chunk size set, else `default`.
    pub fn chunk_or(&self, default: usize) -> usize {
        self.chunk.unwrap_or(default).max(1)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            chunk: None,
            max_rows_per_second: None,
            report_every: Duration::from_secs_f64(DEFAULT_REPORT_SECONDS),
            replica_url: None,
            progress: true,
            lock_wait_timeout: None,
        }
    }
}

/// One job of one rule: where its progress row lives.
#[derive(Debug, Clone)]
pub struct JobKey {
    /// The database of the rule's logical table (where `heatsink_jobs` lives).
    pub db: String,
    /// The rule's name.
    pub rule: String,
    /// The job's name (`backfill`, `fill`).
    pub job: &'static str,
}

impl JobKey {
    /// `` `db`.`heatsink_jobs` ``.
    pub fn table(&self) -> TableName {
        TableName {
            db: Some(self.db.clone()),
            name: TABLE.into(),
        }
    }

    /// The job's named lock: `heatsink:job:<rule>:<job>` (a hash past 64 bytes).
    fn lock(&self) -> String {
        let name = format!("heatsink:job:{}.{}:{}", self.db, self.rule, self.job);
        if name.len() <= 64 {
            return name;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("heatsink:job:{h:016x}")
    }
}

/// A job's row in `heatsink_jobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    /// `pending`, `running` or `done`.
    pub state: String,
    /// The key the last committed chunk ended at; `None` before the first.
    pub position: Option<String>,
    /// Items done so far.
    pub rows_done: u64,
}

impl JobState {
    /// Whether the job has work left (pending, or stopped half way).
    pub fn unfinished(&self) -> bool {
        self.state != DONE
    }
}

/// A job waiting for its first run.
pub const PENDING: &str = "pending";
/// A job started (and, if no run holds its lock, stopped half way).
pub const RUNNING: &str = "running";
/// A finished job.
pub const DONE: &str = "done";

/// `CREATE TABLE IF NOT EXISTS` of the job table in `db`.
pub fn create_sql(db: &str) -> String {
    let t = TableName {
        db: Some(db.into()),
        name: TABLE.into(),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n  rule VARCHAR(64) NOT NULL,\n  job VARCHAR(32) NOT NULL,\n  \
         state VARCHAR(16) NOT NULL,\n  position VARCHAR(255) NULL,\n  \
         rows_done BIGINT UNSIGNED NOT NULL DEFAULT 0,\n  rows_total BIGINT UNSIGNED NULL,\n  \
         started_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n  \
         updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),\n  \
         PRIMARY KEY (rule, job)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        t.quoted()
    )
}

/// The job's row, if it has one (`None` also when the table does not exist).
pub async fn state(conn: &mut Conn, key: &JobKey) -> Result<Option<JobState>> {
    let exists: Option<i64> = conn
        .exec_first(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (key.db.as_str(), TABLE),
        )
        .await
        .or_err(Source::Backend, || {
            format!("looking for {}", key.table().quoted())
        })?;
    if exists.is_none() {
        return Ok(None);
    }
    let row: Option<Row> = conn
        .exec_first(
            format!(
                "SELECT state, position, CAST(rows_done AS CHAR) FROM {} WHERE rule = ? AND job = ?",
                key.table().quoted()
            ),
            (key.rule.as_str(), key.job),
        )
        .await
        .or_err(Source::Backend, || {
            format!("reading {}", key.table().quoted())
        })?;
    Ok(row.map(|r| JobState {
        state: text(&r, 0).unwrap_or_default(),
        position: text(&r, 1),
        rows_done: text(&r, 2).and_then(|s| s.parse().ok()).unwrap_or(0),
    }))
}

/// Sets the job's row to `state` from the start (no position, nothing done),
/// creating the table when missing.
pub async fn reset(conn: &mut Conn, key: &JobKey, state: &str) -> Result<()> {
    conn.query_drop(create_sql(&key.db))
        .await
        .or_err(Source::Backend, || {
            format!("creating {}", key.table().quoted())
        })?;
    conn.exec_drop(
        format!(
            "INSERT INTO {} (rule, job, state, position, rows_done, rows_total, started_at) \
             VALUES (?, ?, ?, NULL, 0, NULL, NOW(6)) ON DUPLICATE KEY UPDATE state = VALUES(state), \
             position = NULL, rows_done = 0, rows_total = NULL, started_at = NOW(6)",
            key.table().quoted()
        ),
        (key.rule.as_str(), key.job, state),
    )
    .await
    .or_err(Source::Backend, || {
        format!("recording job {} of rule {}", key.job, key.rule)
    })
}

/// Removes every job row of rule `rule` in `db` (`migrate --revert` dropped what
/// the jobs filled; migrating the rule again starts them afresh).
pub async fn forget_rule(conn: &mut Conn, db: &str, rule: &str) -> Result<()> {
    let key = JobKey {
        db: db.to_string(),
        rule: rule.to_string(),
        job: "",
    };
    let exists: Option<i64> = conn
        .exec_first(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (db, TABLE),
        )
        .await
        .or_err(Source::Backend, || {
            format!("looking for {}", key.table().quoted())
        })?;
    if exists.is_none() {
        return Ok(());
    }
    conn.exec_drop(
        format!("DELETE FROM {} WHERE rule = ?", key.table().quoted()),
        (rule,),
    )
    .await
    .or_err(Source::Backend, || {
        format!("forgetting the jobs of rule {rule}")
    })
}

/// Every job row of rule `rule` in `db`: (job, state, items done), by job name.
pub async fn of_rule(conn: &mut Conn, db: &str, rule: &str) -> Result<Vec<(String, JobState)>> {
    let t = TableName {
        db: Some(db.to_string()),
        name: TABLE.into(),
    };
    let exists: Option<i64> = conn
        .exec_first(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (db, TABLE),
        )
        .await
        .or_err(Source::Backend, || format!("looking for {}", t.quoted()))?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let rows: Vec<Row> = conn
        .exec(
            format!(
                "SELECT job, state, position, CAST(rows_done AS CHAR) FROM {} WHERE rule = ? ORDER BY job",
                t.quoted()
            ),
            (rule,),
        )
        .await
        .or_err(Source::Backend, || format!("reading {}", t.quoted()))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                text(r, 0).unwrap_or_default(),
                JobState {
                    state: text(r, 1).unwrap_or_default(),
                    position: text(r, 2),
                    rows_done: text(r, 3).and_then(|s| s.parse().ok()).unwrap_or(0),
                },
            )
        })
        .collect())
}

async fn set_state(conn: &mut Conn, key: &JobKey, state: &str, total: Option<u64>) -> Result<()> {
    conn.exec_drop(
        format!(
            "UPDATE {} SET state = ?, rows_total = COALESCE(?, rows_total) WHERE rule = ? AND job = ?",
            key.table().quoted()
        ),
        (state, total, key.rule.as_str(), key.job),
    )
    .await
    .or_err(Source::Backend, || {
        format!("updating job {} of rule {}", key.job, key.rule)
    })
}

/// What one chunk did.
#[derive(Debug, Clone)]
pub struct Step {
    /// The key the chunk ended at (inclusive): the next chunk starts after it.
    pub last: String,
    /// Items the chunk did (log rows, readers), for progress and the throttle.
    pub rows: u64,
}

/// A job the runner drives chunk by chunk.
#[async_trait(?Send)]
pub trait Chunked {
    /// What one item is, for progress lines (`log rows`, `readers`).
    fn unit(&self) -> &'static str;

    /// An estimate of the items left after `after` (all when `None`).
    async fn total(&mut self, conn: &mut Conn, after: Option<&str>) -> Result<u64>;

    /// Does the next chunk of at most `limit` items after key `after` (from the
    /// start when `None`) on `conn`, inside the transaction the runner opened
    /// (which commits it with the progress row). `None`: nothing left.
    async fn chunk(
        &mut self,
        conn: &mut Conn,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<Step>>;
}

/// What [`run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: items done by this run, and over all runs.
    Done { this_run: u64, total: u64 },
    /// Another run holds the job's lock.
    Busy,
}

/// Runs `job` to the end from where its progress row says it stopped (from the
/// start without one), committing each chunk with its progress. The progress row
/// must exist ([`reset`]) unless the job is new.
pub async fn run(
    conn: &mut Conn,
    key: &JobKey,
    settings: &Settings,
    job: &mut dyn Chunked,
) -> Result<Outcome> {
    if !try_lock(conn, key).await? {
        return Ok(Outcome::Busy);
    }
    let result = run_locked(conn, key, settings, job).await;
    if result.is_err() {
        let _ = conn.query_drop("ROLLBACK").await;
    }
    if settings.lock_wait_timeout.is_some() {
        let _ = conn
            .query_drop("SET SESSION innodb_lock_wait_timeout = DEFAULT")
            .await;
    }
    unlock(conn, key).await;
    gauges::finish(key);
    result
}

/// Takes the job's named lock on `conn` without waiting; `false` when another
/// connection holds it (a run of the job is alive there). A connection may take it
/// again (the lock counts), so a kind may hold it around its own preparation and
/// [`run`].
pub async fn try_lock(conn: &mut Conn, key: &JobKey) -> Result<bool> {
    let lock = key.lock();
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, 0)", (lock.as_str(),))
        .await
        .or_err(Source::Backend, || format!("taking lock '{lock}'"))?;
    Ok(got.flatten() == Some(1))
}

/// Releases one hold of the job's named lock (a dead connection released it).
pub async fn unlock(conn: &mut Conn, key: &JobKey) {
    let _ = conn
        .exec_drop("DO RELEASE_LOCK(?)", (key.lock().as_str(),))
        .await;
}

async fn run_locked(
    conn: &mut Conn,
    key: &JobKey,
    settings: &Settings,
    job: &mut dyn Chunked,
) -> Result<Outcome> {
    let mut st = match state(conn, key).await? {
        Some(s) => s,
        None => {
            reset(conn, key, PENDING).await?;
            JobState {
                state: PENDING.into(),
                position: None,
                rows_done: 0,
            }
        }
    };
    if st.state == DONE {
        return Ok(Outcome::Done {
            this_run: 0,
            total: st.rows_done,
        });
    }
    let left = job.total(conn, st.position.as_deref()).await?;
    let total = st.rows_done + left;
    set_state(conn, key, RUNNING, Some(total)).await?;
    let mut progress = Progress::new(key, job.unit(), st.rows_done, total, settings);
    let mut pace = Pace::new(settings.max_rows_per_second);
    let mut lag = Lag::new(settings.replica_url.as_deref());
    let update = format!(
        "UPDATE {} SET state = '{RUNNING}', position = ?, rows_done = rows_done + ? WHERE rule = ? AND job = ?",
        key.table().quoted()
    );
    if let Some(secs) = settings.lock_wait_timeout {
        conn.query_drop(format!("SET SESSION innodb_lock_wait_timeout = {secs}"))
            .await
            .or_err(Source::Backend, || "setting the job's lock wait timeout")?;
    }
    let mut this_run = 0u64;
    loop {
        lag.wait(conn, &mut progress).await?;
        let mut attempt = 0u32;
        let step = loop {
            attempt += 1;
            conn.query_drop("START TRANSACTION")
                .await
                .or_err(Source::Backend, || {
                    format!("starting a chunk of {}", key.job)
                })?;
            let step = job
                .chunk(
                    conn,
                    st.position.as_deref(),
                    settings.chunk_or(DEFAULT_CHUNK),
                )
                .await;
            let step = match step {
                Ok(Some(s)) => conn
                    .exec_drop(
                        update.as_str(),
                        (s.last.as_str(), s.rows, key.rule.as_str(), key.job),
                    )
                    .await
                    .map(|()| Some(s))
                    .map_err(|e| {
                        Error::with_cause(Source::Backend, "recording the job's progress", e)
                    }),
                other => other,
            };
            let step = match step {
                Ok(s) => conn
                    .query_drop("COMMIT")
                    .await
                    .map(|()| s)
                    .map_err(|e| Error::with_cause(Source::Backend, "committing a chunk", e)),
                Err(e) => Err(e),
            };
            match step {
                Ok(s) => break s,
                // A deadlock or lock wait with the application's writes: the
                // chunk was rolled back; do it again.
                Err(e) if attempt < 10 && retryable(&e) => {
                    let _ = conn.query_drop("ROLLBACK").await;
                    let pause = Duration::from_millis(50 << attempt.min(5));
                    progress.note(&format!(
                        "a chunk was rolled back ({}): retrying it in {} ms (attempt {} of 10)",
                        retry_reason(&e),
                        pause.as_millis(),
                        attempt + 1
                    ));
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e),
            }
        };
        let Some(step) = step else { break };
        st.position = Some(step.last);
        st.rows_done += step.rows;
        this_run += step.rows;
        progress.update(st.rows_done);
        pace.after(step.rows).await;
    }
    set_state(conn, key, DONE, Some(st.rows_done)).await?;
    progress.finish(st.rows_done);
    Ok(Outcome::Done {
        this_run,
        total: st.rows_done,
    })
}

/// A deadlock (1213) or lock wait timeout (1205) anywhere in the error's chain.
fn retryable(e: &Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(mysql_async::Error::Server(s)) = c.downcast_ref::<mysql_async::Error>() {
            return s.code == 1213 || s.code == 1205;
        }
        cause = c.source();
    }
    false
}

/// The server's error a chunk was retried for, for its progress note.
fn retry_reason(e: &Error) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(mysql_async::Error::Server(s)) = c.downcast_ref::<mysql_async::Error>() {
            let what = match s.code {
                1213 => "a deadlock",
                _ => "a lock wait timeout",
            };
            return format!("{what}, error {}", s.code);
        }
        cause = c.source();
    }
    e.to_string()
}

/// Runs `job` to the end inside one transaction the caller opened and ends (a
/// job that must be all or nothing, such as a copy under `LOCK TABLES`): the
/// job owns the transaction, the runner only drives its chunks, reports their
/// progress as [`run`] does (a bar on a terminal, lines otherwise, the gauges)
/// and keeps to [`Settings::max_rows_per_second`]. So there is no progress row
/// (a stopped run rolls back whole and the next one starts over, which the first
/// progress line says), no named lock (the caller's locks serialize runs), no
/// retried chunk (a deadlock rolls back the whole transaction: the error goes to
/// the caller) and no wait for replication lag (nothing of the transaction
/// reaches a replica before it commits; waiting would only hold its locks
/// longer). Returns the items done.
pub async fn run_owned(
    conn: &mut Conn,
    key: &JobKey,
    settings: &Settings,
    job: &mut dyn Chunked,
) -> Result<u64> {
    let result = run_owned_inner(conn, key, settings, job).await;
    gauges::finish(key);
    result
}

async fn run_owned_inner(
    conn: &mut Conn,
    key: &JobKey,
    settings: &Settings,
    job: &mut dyn Chunked,
) -> Result<u64> {
    let total = job.total(conn, None).await?;
    let mut progress = Progress::start(
        key,
        job.unit(),
        0,
        total,
        settings,
        " in one transaction (stopped, it rolls back whole and the next run does it again from the start)",
    );
    let mut pace = Pace::new(settings.max_rows_per_second);
    let mut position: Option<String> = None;
    let mut done = 0u64;
    while let Some(step) = job
        .chunk(conn, position.as_deref(), settings.chunk_or(DEFAULT_CHUNK))
        .await?
    {
        position = Some(step.last);
        done += step.rows;
        progress.update(done);
        pace.after(step.rows).await;
    }
    progress.finish(done);
    Ok(done)
}

/// Keeps a job under its rows-per-second limit.
struct Pace {
    limit: Option<f64>,
    start: Instant,
    rows: u64,
}

impl Pace {
    fn new(limit: Option<f64>) -> Pace {
        Pace {
            limit: limit.filter(|l| *l > 0.0),
            start: Instant::now(),
            rows: 0,
        }
    }

    /// After a chunk of `rows`: sleeps until the run's rate is within the limit.
    async fn after(&mut self, rows: u64) {
        self.rows += rows;
        let Some(limit) = self.limit else { return };
        let due = Duration::from_secs_f64(self.rows as f64 / limit);
        let spent = self.start.elapsed();
        if due > spent {
            tokio::time::sleep(due - spent).await;
        }
    }
}

/// Replication lag as the servers report it. Before each chunk (at most once a
/// second) the job reads, on its own server, `wsrep_local_recv_queue` (Galera:
/// write sets received and not yet applied) and `wsrep_flow_control_paused_ns`
/// (the time replication was paused by flow control); and on the replica given by
/// `--replica-url`, `Seconds_Behind_Master`. It waits while the receive queue is
/// above [`MAX_RECV_QUEUE`], flow control paused replication in the last second,
/// or the replica is more than [`MAX_REPLICA_LAG`] seconds behind. A server that
/// offers none of these (a plain primary) never makes it wait.
pub struct Lag {
    replica_url: Option<String>,
    replica: Option<Conn>,
    paused_ns: Option<u64>,
    checked: Option<Instant>,
}

impl Lag {
    fn new(replica_url: Option<&str>) -> Lag {
        Lag {
            replica_url: replica_url.map(str::to_string),
            replica: None,
            paused_ns: None,
            checked: None,
        }
    }

    async fn wait(&mut self, conn: &mut Conn, progress: &mut Progress) -> Result<()> {
        let mut waited = 0u32;
        loop {
            if self
                .checked
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
            {
                return Ok(());
            }
            self.checked = Some(Instant::now());
            match self.behind(conn).await? {
                None => return Ok(()),
                Some(why) => {
                    if waited.is_multiple_of(10) {
                        progress.note(&format!("waiting: {why}"));
                    }
                    waited += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Why the job should wait, if it should.
    async fn behind(&mut self, conn: &mut Conn) -> Result<Option<String>> {
        let rows: Vec<(String, String)> = conn
            .query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('wsrep_local_recv_queue', 'wsrep_flow_control_paused_ns')",
            )
            .await
            .or_err(Source::Backend, || "reading the replication status")?;
        let status: BTreeMap<String, u64> = rows
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_ascii_lowercase(), v.parse().ok()?)))
            .collect();
        if let Some(q) = status.get("wsrep_local_recv_queue") {
            if *q > MAX_RECV_QUEUE {
                return Ok(Some(format!("Galera receive queue at {q}")));
            }
        }
        if let Some(ns) = status.get("wsrep_flow_control_paused_ns").copied() {
            let before = self.paused_ns.replace(ns);
            if before.is_some_and(|b| ns > b) {
                return Ok(Some("Galera flow control paused replication".into()));
            }
        }
        if let Some(url) = &self.replica_url {
            if self.replica.is_none() {
                self.replica = Some(crate::schema::connect(url).await?);
            }
            if let Some(replica) = self.replica.as_mut() {
                let row: Option<Row> = replica
                    .query_first("SHOW SLAVE STATUS")
                    .await
                    .or_err(Source::Backend, || "reading the replica's status")?;
                let lag = row
                    .as_ref()
                    .and_then(|r| r.get_opt::<Option<u64>, &str>("Seconds_Behind_Master"))
                    .and_then(|v| v.ok())
                    .flatten();
                match lag {
                    Some(s) if s > MAX_REPLICA_LAG => {
                        return Ok(Some(format!("the replica is {s} s behind")))
                    }
                    None if row.is_some() => {
                        return Ok(Some("the replica is not replicating".into()))
                    }
                    _ => {}
                }
            }
        }
        Ok(None)
    }
}

/// Progress of one run: stderr (a bar on a terminal, else a line every
/// [`Settings::report_every`]) and the `/metrics` gauges.
struct Progress {
    key: JobKey,
    unit: &'static str,
    total: u64,
    start: Instant,
    start_done: u64,
    last_line: Instant,
    every: Duration,
    enabled: bool,
    tty: bool,
}

impl Progress {
    fn new(key: &JobKey, unit: &'static str, done: u64, total: u64, s: &Settings) -> Progress {
        Progress::start(key, unit, done, total, s, "")
    }

    /// [`Progress::new`] whose first line ends with `how` (how the job runs).
    fn start(
        key: &JobKey,
        unit: &'static str,
        done: u64,
        total: u64,
        s: &Settings,
        how: &str,
    ) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let p = Progress {
            key: key.clone(),
            unit,
            total,
            start: Instant::now(),
            start_done: done,
            last_line: Instant::now(),
            every: s.report_every,
            enabled: s.progress,
            tty,
        };
        gauges::set(key, done, total, 0.0);
        let from = if done > 0 {
            format!(", continuing after {done} done")
        } else {
            String::new()
        };
        p.line(&format!(
            "job {} of rule {}: {total} {unit} to do{how}{from}",
            key.job, key.rule
        ));
        p
    }

    fn line(&self, text: &str) {
        if !self.enabled {
            tracing::info!(target: "heatsink::jobs", "{text}");
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K");
        }
        let _ = writeln!(err, "{text}");
    }

    fn note(&self, text: &str) {
        self.line(&format!(
            "job {} of rule {}: {text}",
            self.key.job, self.key.rule
        ));
    }

    fn rate(&self, done: u64) -> f64 {
        let secs = self.start.elapsed().as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        done.saturating_sub(self.start_done) as f64 / secs
    }

    fn update(&mut self, done: u64) {
        let total = self.total.max(done);
        let rate = self.rate(done);
        gauges::set(&self.key, done, total, rate);
        if !self.enabled {
            return;
        }
        let eta = if rate > 0.0 {
            format_secs((total - done) as f64 / rate)
        } else {
            "?".into()
        };
        let pct = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        if self.tty {
            let width = 30usize;
            let filled = ((pct / 100.0) * width as f64) as usize;
            let bar = format!(
                "{}{}",
                "#".repeat(filled.min(width)),
                "-".repeat(width - filled.min(width))
            );
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[K{} {}: [{bar}] {done}/{total} {} {pct:.0}% {rate:.0}/s ETA {eta}",
                self.key.rule, self.key.job, self.unit
            );
            let _ = err.flush();
        } else if self.last_line.elapsed() >= self.every {
            self.last_line = Instant::now();
            self.note(&format!(
                "{done}/{total} {} ({pct:.1}%), {rate:.0}/s, ETA {eta}",
                self.unit
            ));
        }
    }

    fn finish(&mut self, done: u64) {
        gauges::set(&self.key, done, done, self.rate(done));
        self.note(&format!(
            "done: {done} {} in all, this run {} at {:.0}/s in {}",
            self.unit,
            done - self.start_done,
            self.rate(done),
            format_secs(self.start.elapsed().as_secs_f64())
        ));
    }
}

fn format_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The `/metrics` gauges of the jobs this process runs: per (job, rule), items
/// done, the total and the rate. Labels are bounded: rule names of the rule set
/// and the kinds' job names.
pub mod gauges {
    use super::*;

    #[derive(Debug, Clone, Copy, Default)]
    struct Gauge {
        done: u64,
        total: u64,
        rate: f64,
        running: bool,
    }

    static GAUGES: Mutex<BTreeMap<(String, String), Gauge>> = Mutex::new(BTreeMap::new());

    /// A gauge's name, help text, and its value in a sample.
    type Metric = (&'static str, &'static str, fn(&Gauge) -> String);

    pub(super) fn set(key: &JobKey, done: u64, total: u64, rate: f64) {
        if let Ok(mut g) = GAUGES.lock() {
            g.insert(
                (key.job.to_string(), key.rule.clone()),
                Gauge {
                    done,
                    total,
                    rate,
                    running: true,
                },
            );
        }
    }

    pub(super) fn finish(key: &JobKey) {
        if let Ok(mut g) = GAUGES.lock() {
            if let Some(x) = g.get_mut(&(key.job.to_string(), key.rule.clone())) {
                x.running = false;
                x.rate = 0.0;
            }
        }
    }

    /// Writes `heatsink_job_rows_done`, `heatsink_job_rows_total`,
    /// `heatsink_job_rows_per_second` and `heatsink_job_running`, one sample per
    /// job this process ran, in Prometheus text format.
    pub fn render(out: &mut String, label: impl Fn(&str) -> String) {
        use std::fmt::Write as _;
        let Ok(g) = GAUGES.lock() else { return };
        let metrics: [Metric; 4] = [
            (
                "heatsink_job_rows_done",
                "Items (log rows, readers) a long job has done, over all its runs.",
                |g| g.done.to_string(),
            ),
            (
                "heatsink_job_rows_total",
                "Items a long job has to do in all (an estimate while it runs).",
                |g| g.total.to_string(),
            ),
            (
                "heatsink_job_rows_per_second",
                "A running long job's rate in this run.",
                |g| format!("{:.1}", g.rate),
            ),
            (
                "heatsink_job_running",
                "1 while this process runs the job.",
                |g| u8::from(g.running).to_string(),
            ),
        ];
        for (name, help, value) in metrics {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for ((job, rule), x) in g.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{job=\"{}\",rule=\"{}\"}} {}",
                    label(job),
                    label(rule),
                    value(x)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_hash_their_lock() {
        let k = JobKey {
            db: "d".repeat(60),
            rule: "r".into(),
            job: "fill",
        };
        assert!(k.lock().len() <= 64);
        let short = JobKey {
            db: "shop".into(),
            rule: "r".into(),
            job: "fill",
        };
        assert_eq!(short.lock(), "heatsink:job:shop.r:fill");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(format_secs(5.2), "5s");
        assert_eq!(format_secs(125.0), "2m05s");
        assert_eq!(format_secs(7300.0), "2h01m");
    }

    #[test]
    fn gauges_render_per_job_and_rule() {
        let k = JobKey {
            db: "shop".into(),
            rule: "gauge_test".into(),
            job: "fill",
        };
        gauges::set(&k, 5, 10, 2.0);
        let mut out = String::new();
        gauges::render(&mut out, str::to_string);
        assert!(out.contains("heatsink_job_rows_done{job=\"fill\",rule=\"gauge_test\"} 5"));
        assert!(out.contains("heatsink_job_rows_total{job=\"fill\",rule=\"gauge_test\"} 10"));
    }
}
