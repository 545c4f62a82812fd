//! `heatsink maintain`: runs the rules' maintenance jobs once.
//!
//! Each kind lists its jobs ([`crate::kinds::RuleSpec::jobs`]: the counter's
//! `compact`, …); this driver runs every job of every selected rule, or only the
//! one named by `--job`. A job run holds a named lock on the database
//! (`GET_LOCK('heatsink:<job>:<db>.<table>', 0)`): when several proxies' sidecars or cron
//! entries start the same job, one runs it and the others skip it, so scheduling
//! it everywhere is safe. `heatsink compact` is `maintain --job compact --apply`.
//!
//! Without `--apply` the run is a dry run: each job reads what it needs and prints
//! the statements it would run (the rotation's `ALTER TABLE`s, the compaction's
//! per-key transaction and how many keys and slot rows it would fold), and nothing
//! changes — no lock or lease is taken either. `serve --maintain-url` runs the jobs
//! with apply.
//!
//! On a Galera cluster `GET_LOCK` is local to the node it runs on, so two runs
//! through two nodes would both take it. There (`wsrep_on = ON`) the lock is a lease
//! row in the InnoDB table `heatsink_locks` of the database, taken with one upsert in
//! autocommit: certification decides between runs on different nodes, and the
//! loser, retried, finds the winner's row. The lease is released when the job ends,
//! and lapses after [`LEASE_SECONDS`] if the run died.

use std::io::Write;
use std::path::Path;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::error::{Error, OrErr, Result, Source};
use crate::kinds::{JobContext, RuleSpec};
use crate::schema::{connect, default_db, emit};

/// Prints a job's summary line and adds its failed items to `failed`.
fn record(
    out: &mut dyn Write,
    spec: &dyn RuleSpec,
    report: crate::kinds::JobReport,
    failed: &mut Vec<String>,
) -> Result<()> {
    emit(out, &format!("rule {}: {}", spec.name(), report.summary))?;
    failed.extend(
        report
            .failed
            .into_iter()
            .map(|f| format!("rule {}: {f}", spec.name())),
    );
    Ok(())
}

/// A cluster-wide lease (Galera) lapses this long after it was taken, so that a run
/// that died does not block the job for ever.
pub const LEASE_SECONDS: u32 = 3600;

/// Keys or rows per batch when `--batch` is not given.
pub const DEFAULT_BATCH: usize = 1000;

/// What `heatsink maintain` was asked to do.
#[derive(Debug, Clone)]
pub struct MaintainOptions<'a> {
    /// Rule file or directory of rule files.
    pub rules: &'a Path,
    /// `mysql://user:pw@host:port/db` of the database the rules apply to.
    pub backend_url: &'a str,
    /// Only this rule, when given.
    pub rule: Option<&'a str>,
    /// Only this job, when given.
    pub job: Option<&'a str>,
    /// Keys or rows per batch, for jobs that work in batches.
    pub batch: usize,
    /// Execute the jobs; `false`: a dry run that prints what they would do.
    pub apply: bool,
    /// How long jobs (a mailbox fill) run: chunks, throttle, progress.
    pub jobs: crate::jobs::Settings,
}

/// Runs the selected jobs once (or, without `apply`, prints what they would do)
/// and prints one summary line per rule and job. Fails
/// when a rule does not fit its tables or an item of a job failed (the other items
/// are still done).
pub async fn run(opts: &MaintainOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let specs = crate::rules::select(crate::rules::specs(opts.rules)?, opts.rule)?;
    let work: Vec<(&dyn RuleSpec, &str)> = specs
        .iter()
        .flat_map(|s| s.jobs().iter().map(move |j| (s.as_ref(), j.name)))
        .filter(|(_, job)| opts.job.is_none_or(|want| want == *job))
        .collect();
    if work.is_empty() {
        if let Some(rule) = opts.rule {
            return Err(Error::new(
                Source::Rules,
                format!(
                    "rule '{rule}' has no maintenance job{}",
                    opts.job.map(|j| format!(" '{j}'")).unwrap_or_default()
                ),
            ));
        }
        let what = opts.job.unwrap_or("maintenance");
        emit(out, &format!("no rules with a {what} job: nothing to do"))?;
        return Ok(());
    }
    let mut conn = connect(opts.backend_url).await?;
    let default_db = default_db(opts.backend_url)?;
    let mut failed = Vec::new();
    if !opts.apply {
        emit(
            out,
            "-- dry run: the statements below are not executed; run with --apply to execute them",
        )?;
        for (spec, job) in work {
            emit(out, &format!("-- rule {}: {job}", spec.name()))?;
            let mut ctx = JobContext {
                conn: &mut conn,
                default_db: default_db.as_deref(),
                batch: opts.batch.max(1),
                out: &mut *out,
                apply: false,
                jobs: opts.jobs.clone(),
            };
            let report = spec.run_job(job, &mut ctx).await?;
            record(out, spec, report, &mut failed)?;
        }
        let _ = conn.disconnect().await;
        return finish(failed);
    }
    let lease = match default_db.as_deref() {
        Some(db) if crate::schema::on_galera(&mut conn).await? => {
            Some(Lease::create(&mut conn, db).await?)
        }
        _ => None,
    };
    for (spec, job) in work {
        let lock = lock_name(spec, job, default_db.as_deref());
        let taken = match &lease {
            Some(l) => l.take(&mut conn, &lock).await?,
            None => take_lock(&mut conn, &lock).await?,
        };
        if !taken {
            emit(
                out,
                &format!(
                    "rule {}: {job} is running elsewhere (lock '{lock}' is held); skipped",
                    spec.name()
                ),
            )?;
            continue;
        }
        let mut ctx = JobContext {
            conn: &mut conn,
            default_db: default_db.as_deref(),
            batch: opts.batch.max(1),
            out: &mut *out,
            apply: true,
            jobs: opts.jobs.clone(),
        };
        let report = spec.run_job(job, &mut ctx).await;
        match &lease {
            Some(l) => l.release(&mut conn, &lock).await?,
            None => release_lock(&mut conn, &lock).await?,
        }
        record(out, spec, report?, &mut failed)?;
    }
    let _ = conn.disconnect().await;
    finish(failed)
}

/// The run's outcome: an error listing the items that failed, if any did.
fn finish(failed: Vec<String>) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        Source::Backend,
        format!(
            "{} items could not be maintained:\n  {}",
            failed.len(),
            failed.join("\n  ")
        ),
    ))
}

/// Runs every rule's maintenance jobs every `interval` (the first run after one
/// interval), for `heatsink serve --maintain-url`: on a thread of its own with a
/// single-threaded runtime (jobs hold one connection and are not `Send`), for the
/// life of the process. The rules are read again for each run, so a reload applies.
/// Each job holds its named lock, so of many proxies one does a run; the others log
/// that it was skipped. Failures are logged and retried at the next run.
pub fn periodic(
    rules: std::path::PathBuf,
    url: String,
    interval: std::time::Duration,
    max_rows_per_second: Option<f64>,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::with_cause(Source::Internal, "starting the maintenance runtime", e))?;
    std::thread::Builder::new()
        .name("heatsink-maintain".into())
        .spawn(move || {
            runtime.block_on(async {
                loop {
                    tokio::time::sleep(interval).await;
                    let opts = MaintainOptions {
                        rules: &rules,
                        backend_url: &url,
                        rule: None,
                        job: None,
                        batch: DEFAULT_BATCH,
                        apply: true,
                        // Progress goes to the log and to /metrics.
                        jobs: crate::jobs::Settings {
                            max_rows_per_second,
                            progress: false,
                            ..Default::default()
                        },
                    };
                    let mut out = Vec::new();
                    let result = run(&opts, &mut out).await;
                    for line in String::from_utf8_lossy(&out).lines() {
                        tracing::info!(target: "heatsink::maintain", "{line}");
                    }
                    if let Err(e) = result {
                        tracing::warn!(target: "heatsink::maintain", error = %e, "maintenance run failed");
                    }
                }
            });
        })
        .map_err(|e| Error::with_cause(Source::Internal, "starting the maintenance thread", e))?;
    Ok(())
}

/// The lock of `job` on `spec`'s logical table: `heatsink:<job>:<db>.<table>`, so
/// that proxies sharing a database share it, whatever they call the rule (a hash of
/// that when it would exceed the server's 64 characters).
fn lock_name(spec: &dyn RuleSpec, job: &str, default_db: Option<&str>) -> String {
    let mut table = spec.table().to_string();
    if !table.contains('.') {
        table = format!("{}.{table}", default_db.unwrap_or_default());
    }
    let name = format!("heatsink:{job}:{table}");
    if name.len() <= 64 {
        return name;
    }
    // FNV-1a: stable across builds, so every proxy computes the same name.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("heatsink:{h:016x}")
}

/// Takes the named lock without waiting; `false` when another connection holds it.
async fn take_lock(conn: &mut Conn, name: &str) -> Result<bool> {
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, 0)", (name,))
        .await
        .or_err(Source::Backend, || format!("taking lock '{name}'"))?;
    Ok(got.flatten() == Some(1))
}

/// Releases the named lock.
async fn release_lock(conn: &mut Conn, name: &str) -> Result<()> {
    conn.exec_drop("DO RELEASE_LOCK(?)", (name,))
        .await
        .or_err(Source::Backend, || format!("releasing lock '{name}'"))
}

/// Cluster-wide job locks: lease rows in `<db>.heatsink_locks`.
struct Lease {
    /// `` `db`.`heatsink_locks` ``.
    table: String,
    /// This run's identity in the rows it owns.
    owner: String,
}

impl Lease {
    /// Creates the lease table when missing (InnoDB, a primary key: Galera
    /// replicates it).
    async fn create(conn: &mut Conn, db: &str) -> Result<Lease> {
        let table = format!("`{}`.`heatsink_locks`", db.replace('`', "``"));
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {table} (name VARCHAR(64) NOT NULL PRIMARY KEY, \
             owner VARCHAR(64) NOT NULL, expires DATETIME(6) NOT NULL) ENGINE=InnoDB"
        ))
        .await
        .or_err(Source::Backend, || format!("creating {table}"))?;
        let owner = format!(
            "{}:{}:{:016x}",
            std::process::id(),
            conn.id(),
            rand::random::<u64>()
        );
        Ok(Lease { table, owner })
    }

    /// Takes the lease `name` unless another run holds it and it has not lapsed.
    /// Certification conflicts (two nodes taking it at once) are retried: the
    /// retry sees the row that won.
    async fn take(&self, conn: &mut Conn, name: &str) -> Result<bool> {
        let upsert = format!(
            "INSERT INTO {t} (name, owner, expires) VALUES (?, ?, NOW(6) + INTERVAL {LEASE_SECONDS} SECOND) \
             ON DUPLICATE KEY UPDATE owner = IF(expires < NOW(6), VALUES(owner), owner), \
             expires = IF(owner = VALUES(owner), VALUES(expires), expires)",
            t = self.table
        );
        let mut attempt = 0;
        loop {
            attempt += 1;
            match conn.exec_drop(upsert.as_str(), (name, &self.owner)).await {
                Ok(()) => break,
                Err(mysql_async::Error::Server(e)) if e.code == 1213 && attempt < 10 => {
                    tokio::time::sleep(std::time::Duration::from_millis(rand::random_range(
                        1..=(5u64 << attempt.min(6)),
                    )))
                    .await;
                }
                Err(e) => {
                    return Err(Error::with_cause(
                        Source::Backend,
                        format!("taking lease '{name}'"),
                        e,
                    ))
                }
            }
        }
        let owner: Option<String> = conn
            .exec_first(
                format!("SELECT owner FROM {} WHERE name = ?", self.table),
                (name,),
            )
            .await
            .or_err(Source::Backend, || format!("reading lease '{name}'"))?;
        Ok(owner.as_deref() == Some(self.owner.as_str()))
    }

    /// Gives the lease back (only if this run still holds it).
    async fn release(&self, conn: &mut Conn, name: &str) -> Result<()> {
        conn.exec_drop(
            format!("DELETE FROM {} WHERE name = ? AND owner = ?", self.table),
            (name, &self.owner),
        )
        .await
        .or_err(Source::Backend, || format!("releasing lease '{name}'"))
    }
}
