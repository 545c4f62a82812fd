//! Long jobs (`src/jobs.rs`): a rollup's backfill and a push timeline's mailbox
//! fill report their progress, keep to `--max-rows-per-second`, keep their progress
//! in `heatsink_jobs`, and, killed with SIGKILL half way and run again, end exact:
//! the rollup equals a fresh `GROUP BY` over the log, the mailboxes equal each
//! reader's newest timeline messages; reads through heatsink while a fill is half
//! done answer what the plain tables answer.
//!
//! The runner's behaviours: on a pseudo-terminal (`script(1)`) the progress is a
//! bar redrawn with `\r`, on a pipe plain lines; a chunk that waits too long for a
//! row lock another transaction holds (`--lock-wait-timeout`, error 1205) is rolled
//! back, retried (said on stderr) and the result is exact; with `--replica-url` a
//! job waits while a real replica (a second server replicating from a primary with
//! the binary log on) is stopped and finishes once it runs again. The ring's
//! backfill (one transaction under its table locks, in chunks of keys) and both
//! reverts (the counter's fold, the ring's copy back) report their progress the
//! same way; a killed ring backfill rolls back whole and the next run redoes it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cli::{Cli, Running};
use common::client::{run, run_text, Outcome};
use common::fixture::{fresh_db, scalar, Env, Rule};
use common::packets::FLAGS_BY_PLAN;
use common::{http_get, mariadb, mariadb_primary, replica_of, sample, MariaDb};

/// The log the rollup tests use: `n` rows over a few tracks and days.
fn plays(n: u64) -> String {
    let mut rows = Vec::new();
    for i in 0..n {
        rows.push(format!(
            "('2024-05-{:02} {:02}:{:02}:00', {}, {})",
            1 + i % 7,
            i % 24,
            i % 60,
            i % 13,
            i % 101
        ));
    }
    format!(
        "CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME NULL, \
         track_id INT NULL, user_id INT NULL, KEY (track_id)); \
         INSERT INTO plays (created_at, track_id, user_id) VALUES {};",
        rows.join(", ")
    )
}

fn rollup_rule() -> String {
    Rule::rollup(
        "plays_daily",
        "plays",
        "plays_by_track_day",
        "created_at",
        "day",
    )
    .dimensions(&["track_id"])
    .measures(&["count(*)", "sum(user_id)"])
    .toml()
}

type Groups = Vec<Vec<Option<String>>>;

/// (a fresh GROUP BY over the log, the rollup's groups), sorted.
fn rollup_and_log(db: &str) -> (Groups, Groups) {
    rollup_and_log_on(mariadb(), db)
}

/// [`rollup_and_log`] on `server`.
fn rollup_and_log_on(server: &MariaDb, db: &str) -> (Groups, Groups) {
    let mut log = server.query_strings(&format!(
        "SELECT CAST(track_id AS CHAR), DATE_FORMAT(created_at, '%Y-%m-%d'), COUNT(*), \
         CAST(IFNULL(SUM(user_id), 0) AS CHAR) FROM {db}.plays \
         GROUP BY track_id, DATE_FORMAT(created_at, '%Y-%m-%d')"
    ));
    let mut rollup = server.query_strings(&format!(
        "SELECT IF(hs_nulls & 1, NULL, CAST(track_id AS CHAR)), \
         IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d')), SUM(hs_rows), \
         CAST(CAST(SUM(hs_sum_user_id) AS SIGNED) AS CHAR) FROM {db}.plays_by_track_day \
         GROUP BY track_id, hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0"
    ));
    log.sort();
    rollup.sort();
    (log, rollup)
}

/// `heatsink <command…> --rules <rules> --backend-url <db on the shared server>`.
fn heatsink_on(command: &[&str], rules: &Path, db: &str) -> Cli {
    Cli::on(command, rules, &mariadb().url(db))
}

/// `heatsink migrate` of the rules in `rules` on `db`.
fn migrate(rules: &Path, db: &str) -> Cli {
    heatsink_on(&["migrate"], rules, db)
}

/// `heatsink migrate --apply` with `extra` arguments, in the background.
fn spawn_migrate(rules: &Path, db: &str, extra: &[&str]) -> Running {
    migrate(rules, db).apply().args(extra).spawn()
}

/// `heatsink migrate --revert <rule>` on `db`, its rule files `rules`.
fn revert(rule: &str, rules: &Path, db: &str) -> Cli {
    heatsink_on(&["migrate", "--revert", rule], rules, db)
}

/// The job's `(state, rows_done)` in `heatsink_jobs`, if it has a row.
fn job_row(db: &str, rule: &str, job: &str) -> Option<(String, u64)> {
    job_row_on(mariadb(), db, rule, job)
}

/// [`job_row`] on `server`.
fn job_row_on(server: &MariaDb, db: &str, rule: &str, job: &str) -> Option<(String, u64)> {
    let exists = server.query_strings(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'heatsink_jobs'"
    ));
    if exists.first().and_then(|r| r[0].as_deref()) != Some("1") {
        return None;
    }
    let rows = server.query_strings(&format!(
        "SELECT state, CAST(rows_done AS CHAR) FROM {db}.heatsink_jobs WHERE rule = '{rule}' AND job = '{job}'"
    ));
    let r = rows.into_iter().next()?;
    Some((
        r[0].clone().unwrap_or_default(),
        r[1].as_deref().and_then(|n| n.parse().ok()).unwrap_or(0),
    ))
}

/// Waits until the rollup backfill of `rule` runs (its snapshot is taken).
fn wait_running(run: &mut Running, db: &str, rule: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while job_row(db, rule, "backfill").is_none_or(|(s, _)| s != "running") {
        run.assert_alive("before the job ran");
        assert!(Instant::now() < deadline, "the job did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the job has committed at least `rows` items and is still running,
/// then kills the run with SIGKILL; returns the items done when it was killed.
fn kill_mid_way(run: &mut Running, db: &str, rule: &str, job: &str, rows: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    while job_row(db, rule, job).is_none_or(|(state, done)| state != "running" || done < rows) {
        run.assert_alive("before the job was half way");
        assert!(Instant::now() < deadline, "the job made no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.kill();
    job_row(db, rule, job).map(|(_, n)| n).unwrap_or(0)
}

#[test]
fn a_throttled_backfill_prints_progress_lines_and_keeps_to_its_rate() {
    let db = "jobs_throttle";
    let rows = 600u64;
    fresh_db(db, &plays(rows));
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let started = Instant::now();
    let (code, out, err) = migrate(rules.path(), db)
        .apply()
        .flag("--chunk", 50)
        .flag("--max-rows-per-second", 200)
        .flag("--progress-every", 0.5)
        .run();
    let took = started.elapsed();
    assert_eq!(code, 0, "{out}\n{err}");
    // 600 rows at 200 a second: at least 3 s (a lower bound only).
    assert!(
        took >= Duration::from_secs_f64(rows as f64 / 200.0),
        "took {took:?}"
    );
    assert!(out.contains("-- applied: backfilled 600 log rows"), "{out}");
    // stderr is a pipe here: plain lines, the first with the total, then the
    // progress with the rate and the time left, then the end.
    assert!(
        err.contains("job backfill of rule plays_daily:") && err.contains("log rows to do"),
        "{err}"
    );
    let progress: Vec<&str> = err.lines().filter(|l| l.contains("/s, ETA ")).collect();
    assert!(progress.len() >= 2, "too few progress lines:\n{err}");
    assert!(!err.contains('\r'), "a bar on a pipe:\n{err}");
    assert!(err.contains("done: 600 log rows in all"), "{err}");
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log);
    assert_eq!(
        job_row(db, "plays_daily", "backfill"),
        Some(("done".into(), 600))
    );
}

/// Writes straight to the log (the triggers keep the rollup): inserts of new rows,
/// updates and deletes of old rows on both sides of the backfill's progress, an old
/// key deleted and inserted again, a row moved from an old key past the backfill's
/// last key, and a new row moved onto an old key.
fn write_to_log(db: &str, round: u64) {
    let deleted = 2 + round * 41 % 2000;
    mariadb().exec(&format!(
        "USE {db}; \
         UPDATE plays SET user_id = user_id + 1000, track_id = 99 WHERE id IN ({}, {}); \
         DELETE FROM plays WHERE id IN ({deleted}, {}); \
         INSERT IGNORE INTO plays (id, created_at, track_id, user_id) VALUES \
         ({deleted}, '2024-05-03 08:00:00', 4, {round}); \
         UPDATE IGNORE plays SET id = id + 1000000 WHERE id = {}; \
         INSERT INTO plays (created_at, track_id, user_id) VALUES \
         ('2024-05-0{} 12:00:00', {}, {round}), (NULL, NULL, 7); \
         UPDATE IGNORE plays SET id = {} WHERE id = LAST_INSERT_ID();",
        1 + round * 37 % 2000,
        1 + round * 53 % 2000,
        3 + round * 59 % 2000,
        4 + round * 43 % 2000,
        1 + round % 7,
        round % 5,
        3 + round * 59 % 2000,
    ));
}

/// A second rollup of the same log: hourly, no dimensions.
fn hourly_rule() -> String {
    Rule::rollup(
        "plays_hourly",
        "plays",
        "plays_by_hour",
        "created_at",
        "hour",
    )
    .measures(&["count(*)", "count(track_id)"])
    .toml()
}

/// (a fresh GROUP BY over the log, the hourly rollup's groups), sorted.
fn hourly_and_log(db: &str) -> (Groups, Groups) {
    let mut log = mariadb().query_strings(&format!(
        "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H'), COUNT(*), COUNT(track_id) \
         FROM {db}.plays GROUP BY DATE_FORMAT(created_at, '%Y-%m-%d %H')"
    ));
    let mut rollup = mariadb().query_strings(&format!(
        "SELECT IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d %H')), \
         SUM(hs_rows), SUM(hs_count_track_id) FROM {db}.plays_by_hour \
         GROUP BY hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0"
    ));
    log.sort();
    rollup.sort();
    (log, rollup)
}

/// The job's position in `heatsink_jobs`.
fn job_position(db: &str, rule: &str) -> Option<u64> {
    scalar(&format!(
        "SELECT position FROM {db}.heatsink_jobs WHERE rule = '{rule}' AND job = 'backfill'"
    ))
    .and_then(|p| p.parse().ok())
}

/// The backfill's delta tables and triggers left in `db`.
fn deltas_left(db: &str) -> Vec<String> {
    mariadb()
        .query_strings(&format!(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME LIKE '%backfill_delta' UNION ALL \
             SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = '{db}' \
             AND TRIGGER_NAME LIKE '%hs\\_bf\\_%'"
        ))
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect()
}

/// Writes rounds `from..to` to the log on a thread, `pause` apart.
fn writer(db: &str, from: u64, to: u64, pause: Duration) -> std::thread::JoinHandle<()> {
    let db = db.to_string();
    std::thread::spawn(move || {
        for round in from..to {
            write_to_log(&db, round);
            std::thread::sleep(pause);
        }
    })
}

/// The N of each "backfilled N log rows" line of a run's output.
fn backfilled(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("-- applied: backfilled "))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn a_rollup_backfill_killed_half_way_continues_and_ends_exact() {
    let db = "jobs_rollup_kill";
    fresh_db(db, &plays(2000));
    let rules = common::client::rules_dir(
        "rollup.toml",
        &format!("{}\n{}", rollup_rule(), hourly_rule()),
    );
    let throttled = ["--chunk", "20", "--max-rows-per-second", "400"];
    // First run: killed a few chunks into the daily backfill, writers busy.
    let mut child = spawn_migrate(rules.path(), db, &throttled);
    // The writes start once the snapshot is taken: its last key is then 2000.
    wait_running(&mut child, db, "plays_daily");
    let w = writer(db, 0, 20, Duration::from_millis(40));
    let done1 = kill_mid_way(&mut child, db, "plays_daily", "backfill", 200);
    w.join().unwrap();
    assert!(done1 > 0 && done1 < 2000, "killed after {done1} rows");
    let p1 = job_position(db, "plays_daily").unwrap();
    // The writes to old rows are recorded, on both sides of the position.
    let recorded = |cmp: &str| {
        scalar(&format!(
            "SELECT COUNT(*) FROM {db}.plays_by_track_day_backfill_delta WHERE hs_pk {cmp} {p1}"
        ))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0)
    };
    assert!(
        recorded("<=") > 0 && recorded(">") > 0,
        "no deltas recorded"
    );
    assert_eq!(
        job_row(db, "plays_daily", "backfill").map(|(s, _)| s),
        Some("running".into())
    );
    // check names the stopped backfill and where it stopped.
    let (_, out, err) = heatsink_on(&["check"], rules.path(), db).run();
    assert!(
        out.contains(&format!("stopped half way (at {p1} of 2000)"))
            || err.contains(&format!("stopped half way (at {p1} of 2000)")),
        "{out}\n{err}"
    );
    // Between the runs: more writes; the triggers are on.
    for round in 20..30 {
        write_to_log(db, round);
    }
    // Second run: continues at the position, killed again mid-way.
    let mut child = spawn_migrate(rules.path(), db, &throttled);
    let w = writer(db, 30, 45, Duration::from_millis(40));
    let done2 = kill_mid_way(&mut child, db, "plays_daily", "backfill", done1 + 300);
    w.join().unwrap();
    let out = child.output("out");
    assert!(
        out.contains(&format!(
            "continuing at {p1} of 2000 ({done1} log rows done)"
        )),
        "{out}"
    );
    let p2 = job_position(db, "plays_daily").unwrap();
    assert!(
        p2 > p1 && done2 > done1 && done2 < 2000,
        "{p1} {p2} {done2}"
    );
    for round in 45..50 {
        write_to_log(db, round);
    }
    // Third run: finishes the daily backfill from p2, then the hourly one (killed
    // a few chunks in: several rollups of one log each keep their own deltas).
    let mut child = spawn_migrate(rules.path(), db, &throttled);
    let w = writer(db, 50, 70, Duration::from_millis(40));
    kill_mid_way(&mut child, db, "plays_hourly", "backfill", 200);
    w.join().unwrap();
    let out = child.output("out");
    assert!(
        out.contains(&format!("continuing at {p2} of 2000")),
        "{out}"
    );
    // The daily backfill did only the keys after p2, once.
    let daily = backfilled(&out);
    assert!(
        daily.first().is_some_and(|n| *n <= 2000 - p2),
        "the continuation redid work: {daily:?} after {p2}\n{out}"
    );
    let (state, total) = job_row(db, "plays_daily", "backfill").unwrap();
    assert_eq!(state, "done");
    assert!(
        total <= 2000,
        "{total} rows backfilled of at most 2000 keys"
    );
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log, "the daily rollup once its backfill is done");
    assert!(
        deltas_left(db)
            .iter()
            .all(|t| t.starts_with("plays_by_hour")),
        "{:?}",
        deltas_left(db)
    );
    // Fourth run: the hourly backfill continues and ends.
    let w = writer(db, 70, 80, Duration::from_millis(20));
    let (code, out, err) = migrate(rules.path(), db).apply().run();
    w.join().unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("rule plays_hourly: the backfill of"), "{out}");
    assert!(out.contains("continuing at"), "{out}");
    assert!(err.contains("continuing after"), "{err}");
    assert_eq!(
        job_row(db, "plays_hourly", "backfill").map(|(s, _)| s),
        Some("done".into())
    );
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log, "the daily rollup after the last run");
    let (log, rollup) = hourly_and_log(db);
    assert_eq!(rollup, log, "the hourly rollup after the last run");
    assert_eq!(deltas_left(db), Vec::<String>::new());
    // And they stay exact under later writes.
    for round in 80..85 {
        write_to_log(db, round);
    }
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log, "the daily rollup after more writes");
    let (log, rollup) = hourly_and_log(db);
    assert_eq!(rollup, log, "the hourly rollup after more writes");
}

#[test]
fn a_stopped_rollup_backfill_without_its_delta_triggers_starts_over_exact() {
    let db = "jobs_rollup_restart";
    fresh_db(db, &plays(2000));
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let mut child = spawn_migrate(
        rules.path(),
        db,
        &["--chunk", "20", "--max-rows-per-second", "400"],
    );
    let w = writer(db, 0, 10, Duration::from_millis(40));
    let done = kill_mid_way(&mut child, db, "plays_daily", "backfill", 200);
    w.join().unwrap();
    assert!(done > 0 && done < 2000, "killed after {done} rows");
    // A delta trigger gone (dropped by hand): the deltas are incomplete, so the
    // next run cannot continue and starts over.
    mariadb().exec(&format!("DROP TRIGGER {db}.plays_by_track_day_hs_bf_upd"));
    for round in 10..20 {
        write_to_log(db, round);
    }
    let (_, out, err) = heatsink_on(&["check"], rules.path(), db).run();
    assert!(
        out.contains("backfills it again (from the start)")
            || err.contains("backfills it again (from the start)"),
        "{out}\n{err}"
    );
    let (code, out, err) = migrate(rules.path(), db).apply().run();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("a backfill stopped half way"), "{out}");
    assert!(out.contains("started over"), "{out}");
    assert!(!out.contains("continuing at"), "{out}");
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log, "the rollup after the second run");
    assert_eq!(
        job_row(db, "plays_daily", "backfill").map(|(s, _)| s),
        Some("done".into())
    );
    assert_eq!(deltas_left(db), Vec::<String>::new());
    for round in 20..25 {
        write_to_log(db, round);
    }
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log, "the rollup after more writes");
}

#[test]
fn an_unfinished_rollup_backfill_is_reverted_with_its_delta_triggers_and_table() {
    let db = "jobs_rollup_revert";
    fresh_db(db, &plays(2000));
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let migrate = |extra: &[&str]| {
        let mut cli = migrate(rules.path(), db).apply();
        for a in extra {
            cli = cli.arg(a);
        }
        cli.run()
    };
    let (code, out, err) = migrate(&[]);
    assert_eq!(code, 0, "{out}\n{err}");
    // Rebuilt as check advises for a rollup that missed writes (triggers dropped,
    // emptied), and stopped half way.
    mariadb().exec(&format!(
        "USE {db}; DROP TRIGGER plays_by_track_day_hs_ins; DROP TRIGGER plays_by_track_day_hs_upd; \
         DROP TRIGGER plays_by_track_day_hs_del; TRUNCATE TABLE plays_by_track_day"
    ));
    let mut child = spawn_migrate(
        rules.path(),
        db,
        &["--chunk", "20", "--max-rows-per-second", "400"],
    );
    kill_mid_way(&mut child, db, "plays_daily", "backfill", 100);
    assert_eq!(deltas_left(db).len(), 4, "{:?}", deltas_left(db));
    // The rule leaves the rule files; its revert drops what the backfill kept too.
    let none = common::client::rules_dir("other.toml", "");
    let (code, out, err) = revert("plays_daily", none.path(), db).apply().run();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(
            "DROP TABLE IF EXISTS `jobs_rollup_revert`.`plays_by_track_day_backfill_delta`"
        ),
        "{out}"
    );
    assert_eq!(deltas_left(db), Vec::<String>::new());
    assert_eq!(
        scalar(&format!(
            "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = '{db}'"
        ))
        .as_deref(),
        Some("0")
    );
    assert_eq!(job_row(db, "plays_daily", "backfill"), None);
    // Writes to the log work without them.
    write_to_log(db, 1);
}

const TIMELINE: &str = "CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
     PRIMARY KEY (user_id, follower_id), KEY (follower_id)); \
     CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
     body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));";

const USERS: u64 = 120;
const MAILBOX_SIZE: u64 = 15;

/// A follow graph of [`USERS`] readers and their messages.
fn graph() -> String {
    let mut follows = Vec::new();
    for reader in 1..=USERS {
        for k in 0..(reader % 17) {
            let a = 1 + (reader * 7 + k * 13) % USERS;
            if a != reader {
                follows.push(format!("({reader}, {a})"));
            }
        }
    }
    let messages: Vec<String> = (0..1500)
        .map(|i| format!("({}, 'm{i}')", 1 + (i * 31 + i / 7) % USERS))
        .collect();
    format!(
        "{TIMELINE} INSERT IGNORE INTO follower VALUES {}; INSERT INTO message (user_id, body) VALUES {};",
        follows.join(", "),
        messages.join(", ")
    )
}

fn push_rule() -> String {
    Rule::timeline("friends")
        .set("mode", "\"push\"")
        .set("mailbox", "\"mailbox\"")
        .set("mailbox_size", MAILBOX_SIZE.to_string())
        .toml()
}

/// (each reader's `mailbox_size` newest timeline messages, the mailboxes), sorted.
fn mailboxes_and_timelines(db: &str) -> (Groups, Groups) {
    let mut timelines = mariadb().query_strings(&format!(
        "SELECT CAST(r AS CHAR), CAST(id AS CHAR), CAST(a AS CHAR) FROM \
         (SELECT f.user_id AS r, m.id, m.user_id AS a, \
          ROW_NUMBER() OVER (PARTITION BY f.user_id ORDER BY m.id DESC) AS n \
          FROM {db}.follower f JOIN {db}.message m ON m.user_id = f.follower_id) AS t \
         WHERE n <= {MAILBOX_SIZE}"
    ));
    let mut mailboxes = mariadb().query_strings(&format!(
        "SELECT CAST(hs_reader AS CHAR), CAST(hs_message AS CHAR), CAST(hs_author AS CHAR) FROM {db}.mailbox"
    ));
    timelines.sort();
    mailboxes.sort();
    (timelines, mailboxes)
}

fn masked(mut o: Outcome) -> Outcome {
    for c in &mut o.columns {
        c.flags =
            mysql_async::consts::ColumnFlags::from_bits_truncate(c.flags.bits() & !FLAGS_BY_PLAN);
    }
    o
}

/// The friends timeline of each of a few readers, through heatsink and straight
/// to the database: the same answers.
async fn reads_match(env: &Env) {
    let mut p = env.proxied().await;
    let mut d = env.direct().await;
    for reader in [1, 17, 40, 77, 119] {
        for sql in [
            format!("SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = {reader} ORDER BY m.id DESC LIMIT 10"),
            format!("SELECT m.id FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = {reader} ORDER BY m.id DESC LIMIT 5 OFFSET 12"),
        ] {
            let a = masked(run_text(&mut p, &sql).await.expect("through heatsink"));
            let b = masked(run_text(&mut d, &sql).await.expect("direct"));
            assert_eq!(a, b, "{sql}");
        }
    }
}

#[test]
fn a_mailbox_fill_killed_half_way_continues_and_ends_exact() {
    let db = "jobs_fill_kill";
    let env = Env::builder(db)
        .schema(graph())
        .rule("timeline.toml", push_rule())
        .start();
    let mut child = spawn_migrate(
        env.rules_path(),
        db,
        &["--chunk", "3", "--max-rows-per-second", "30"],
    );
    // Posts and follows while it fills (the triggers copy them).
    let writer = std::thread::spawn({
        let db = db.to_string();
        move || {
            for i in 0..10u64 {
                mariadb().exec(&format!(
                    "USE {db}; INSERT INTO message (user_id, body) VALUES ({}, 'during'); \
                     INSERT IGNORE INTO follower VALUES ({}, {});",
                    1 + i * 11 % USERS,
                    1 + i * 13 % USERS,
                    1 + i * 29 % USERS
                ));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    let done = kill_mid_way(&mut child, db, "friends", "fill", 15);
    writer.join().unwrap();
    assert!(done > 0 && done < USERS, "killed after {done} readers");
    let partial: u64 = scalar(&format!(
        "SELECT COUNT(DISTINCT hs_reader) FROM {db}.mailbox"
    ))
    .and_then(|n| n.parse().ok())
    .unwrap_or(0);
    assert!(partial > 0, "nothing filled before the kill");
    // Half filled: reads through heatsink still answer what the tables answer.
    run(Duration::from_secs(60), reads_match(&env));
    // Writes between the runs go through the triggers.
    mariadb().exec(&format!(
        "USE {db}; INSERT INTO message (user_id, body) VALUES (3, 'late'), (50, 'late'); \
         INSERT IGNORE INTO follower VALUES (2, 60), (90, 5);"
    ));
    let (code, out, err) = migrate(env.rules_path(), db).apply().run();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("continuing after reader"), "{out}");
    assert!(err.contains("continuing after"), "{err}");
    let (state, total) = job_row(db, "friends", "fill").unwrap();
    assert_eq!(state, "done");
    let readers: u64 = scalar(&format!(
        "SELECT COUNT(DISTINCT user_id) FROM {db}.follower"
    ))
    .and_then(|n| n.parse().ok())
    .unwrap();
    assert!(total >= readers, "{total} readers filled of {readers}");
    // Never an entry off the timeline; the posts and follows may have added entries
    // past each reader's newest MAILBOX_SIZE, which the trim job cuts.
    let extras = scalar(&format!(
        "SELECT COUNT(*) FROM {db}.mailbox b \
         LEFT JOIN {db}.message m ON m.id = b.hs_message AND m.user_id = b.hs_author \
         LEFT JOIN {db}.follower f ON f.user_id = b.hs_reader AND f.follower_id = b.hs_author \
         WHERE m.id IS NULL OR f.user_id IS NULL"
    ));
    assert_eq!(extras.as_deref(), Some("0"));
    let (code, out, err) = heatsink_on(&["maintain"], env.rules_path(), db)
        .flag("--job", "trim")
        .apply()
        .run();
    assert_eq!(code, 0, "{out}\n{err}");
    let (timelines, mailboxes) = mailboxes_and_timelines(db);
    assert_eq!(mailboxes, timelines);
    run(Duration::from_secs(60), reads_match(&env));
}

#[test]
fn a_deferred_fill_runs_inside_serve_with_metrics() {
    let db = "jobs_fill_serve";
    fresh_db(db, &graph());
    let rules = common::client::rules_dir("timeline.toml", &push_rule());
    let (code, out, err) = migrate(rules.path(), db).apply().arg("--defer-jobs").run();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("long jobs deferred"), "{out}");
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.mailbox")).as_deref(),
        Some("0")
    );
    assert_eq!(job_row(db, "friends", "fill"), Some(("pending".into(), 0)));
    let env = Env::builder(db)
        .rule("timeline.toml", push_rule())
        .metrics()
        .arg("--maintain-url")
        .arg(mariadb().url(db))
        .arg("--maintain-interval")
        .arg("1")
        .arg("--max-rows-per-second")
        .arg("500")
        .start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while job_row(db, "friends", "fill").map(|(s, _)| s).as_deref() != Some("done") {
        assert!(
            Instant::now() < deadline,
            "serve did not fill:\n{}",
            env.tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (timelines, mailboxes) = mailboxes_and_timelines(db);
    assert_eq!(mailboxes, timelines);
    let (_, body) = http_get(env.metrics_addr(), "/metrics");
    let done = sample(
        &body,
        "heatsink_job_rows_done{job=\"fill\",rule=\"friends\"}",
    );
    let total = sample(
        &body,
        "heatsink_job_rows_total{job=\"fill\",rule=\"friends\"}",
    );
    assert!(done.is_some_and(|d| d > 0.0), "{body}");
    assert_eq!(done, total, "{body}");
    run(Duration::from_secs(60), reads_match(&env));
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn on_a_terminal_the_progress_is_a_bar_not_lines() {
    let db = "jobs_tty";
    fresh_db(db, &plays(600));
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let url = mariadb().url(db);
    let rules_path = rules.path().to_str().unwrap().to_string();
    let args = [
        env!("CARGO_BIN_EXE_heatsink"),
        "migrate",
        "--rules",
        &rules_path,
        "--backend-url",
        &url,
        "--apply",
        "--chunk",
        "50",
        "--max-rows-per-second",
        "400",
        "--progress-every",
        "0.2",
    ];
    let cmd: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
    // script(1) runs the command with its stdin, stdout and stderr on a
    // pseudo-terminal and copies what it writes to its own stdout.
    let ran = common::cli::run_limited(
        Command::new("script")
            .arg("-qfec")
            .arg(cmd.join(" "))
            .arg("/dev/null")
            .env_remove("HEATSINK_BACKEND_URL")
            .env_remove("HEATSINK_RULES"),
        None,
        Duration::from_secs(120),
    );
    let out = ran.stdout;
    assert!(ran.code == Some(0), "{out}\n{}", ran.stderr);
    // The bar: redrawn in place (carriage return, erase line) with the rate and
    // the time left.
    assert!(
        out.contains("\r\x1b[K"),
        "no bar redrawn in place:\n{out:?}"
    );
    let bars = out
        .split('\r')
        .filter(|s| s.contains("plays_daily backfill: [") && s.contains("/s ETA "))
        .count();
    assert!(bars >= 2, "too few bar updates:\n{out:?}");
    assert!(out.contains("] 600/"), "no full bar:\n{out:?}");
    // No plain progress lines (their form: `done/total unit (pct%), rate/s, ETA`).
    assert!(
        !out.contains("/s, ETA "),
        "plain lines on a terminal:\n{out:?}"
    );
    // The first and last lines stay lines.
    assert!(out.contains("log rows to do"), "{out:?}");
    assert!(out.contains("done: 600 log rows in all"), "{out:?}");
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log);
}

/// `db.hits` (slug, cnt) as text rows, sorted.
fn hits(db: &str) -> Groups {
    let mut rows = mariadb().query_strings(&format!(
        "SELECT slug, CAST(cnt AS CHAR) FROM {db}.hits ORDER BY slug"
    ));
    rows.sort();
    rows
}

/// A counter rule migrated on `db.hits` with `keys` keys (`k00`, … base `i`) and
/// four slot rows per key (the slot table filled directly, as proxies would);
/// returns the values the fold must end with.
fn counter_with_slots(db: &str, keys: u64) -> Groups {
    let base: Vec<String> = (0..keys).map(|i| format!("('k{i:02}', {i})")).collect();
    common::fixture::create_counter_db(db, "", &base.join(", "));
    let slot_col = scalar(&format!(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' \
         AND TABLE_NAME = 'hits_slots' AND COLUMN_NAME NOT IN ('slug', 'cnt')"
    ))
    .unwrap();
    let mut slots = Vec::new();
    let mut expected = Vec::new();
    for i in 0..keys {
        let mut sum = i as i64;
        for s in 0..4i64 {
            let d = (i as i64 * 7 + s * 3) % 11 - 4;
            slots.push(format!("('k{i:02}', {s}, {d})"));
            sum += d;
        }
        expected.push(vec![Some(format!("k{i:02}")), Some(sum.to_string())]);
    }
    mariadb().exec(&format!(
        "INSERT INTO {db}.hits_slots (slug, `{slot_col}`, cnt) VALUES {}",
        slots.join(", ")
    ));
    expected
}

#[test]
fn a_chunk_that_waits_too_long_for_a_lock_is_retried_and_the_fold_ends_exact() {
    let db = "jobs_retry";
    let mut expected = counter_with_slots(db, 60);
    let no_rules = tempfile::tempdir().unwrap();
    // The dry run says how much it moves.
    let (code, out, err) = revert("hits", no_rules.path(), db)
        .flag("--observe", 0)
        .flag("--batch", 10)
        .run();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("240 slot rows of 60 keys") && out.contains("in 6 transactions"),
        "{out}"
    );
    // Another transaction holds the row of k25 (in the fold's third chunk of keys).
    run(Duration::from_secs(300), async {
        let mut holder = mysql_async::Conn::from_url(mariadb().admin_url(db).as_str())
            .await
            .unwrap();
        use mysql_async::prelude::Queryable;
        holder
            .query_drop("START TRANSACTION; SELECT * FROM hits WHERE slug = 'k25' FOR UPDATE")
            .await
            .unwrap();
        let mut child = revert("hits", no_rules.path(), db)
            .apply()
            .flag("--observe", 0)
            .flag("--batch", 10)
            .flag("--lock-wait-timeout", 1)
            .flag("--progress-every", 0.1)
            .spawn();
        // The chunk waits a second, is rolled back and retried: the output says so.
        child.wait_for("err", "retrying it in");
        // Whole chunks of 10 keys (4 slot rows each) before the one that waits are
        // committed: two when the fold's UPDATE reaches the logical rows by key,
        // none when the server's plan scans them (it then meets k25 in the first).
        let (state, done) = job_row(db, "hits", "revert").unwrap();
        assert!(
            state == "running" && done % 40 == 0 && done <= 80,
            "{state} {done}"
        );
        // The holder writes the row too, then lets go: the retried chunk folds on
        // top of its write.
        holder
            .query_drop("UPDATE hits SET cnt = cnt + 1000 WHERE slug = 'k25'; COMMIT")
            .await
            .unwrap();
        let _ = holder.disconnect().await;
        let (code, out, err) = child.finish();
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            err.contains("a chunk was rolled back (a lock wait timeout, error 1205)"),
            "{err}"
        );
        assert!(
            err.contains("job revert of rule hits: 240 slot rows to do"),
            "{err}"
        );
        assert!(err.contains("done: 240 slot rows in all"), "{err}");
        assert!(
            out.contains(
                "-- applied: folded 240 slot rows into `jobs_retry`.`hits` in 6 transactions"
            ),
            "{out}"
        );
    });
    // k25 also has the holder's + 1000.
    let k25: i64 = expected[25][1].as_deref().unwrap().parse().unwrap();
    expected[25][1] = Some((k25 + 1000).to_string());
    assert_eq!(hits(db), expected);
    assert!(!common::fixture::table_exists(db, "hits_slots"));
    assert!(!common::fixture::table_exists(db, "hits_slots_hs_revert"));
}

#[test]
fn a_job_waits_while_its_replica_is_stopped_and_finishes_once_it_runs() {
    let primary = mariadb_primary();
    let replica = replica_of(primary);
    let db = "jobs_lag";
    primary.exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}; USE {db}; {}",
        plays(300)
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while replica
        .query_strings(&format!(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'plays'"
        ))
        .first()
        .and_then(|r| r[0].clone())
        .as_deref()
        != Some("1")
        || common::replica_lag(&replica) != Some(0)
    {
        assert!(Instant::now() < deadline, "the replica did not catch up");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Stopped: Seconds_Behind_Master is NULL.
    replica.exec("STOP SLAVE");
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let replica_url = replica.admin_url("");
    let mut child = Cli::on(&["migrate"], rules.path(), &primary.url(db))
        .apply()
        .flag("--chunk", 50)
        .flag("--progress-every", 0.2)
        .flag("--replica-url", &replica_url)
        .spawn();
    child.wait_for("err", "waiting: the replica is not replicating");
    // Still waiting a while later: no chunk done.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        job_row_on(primary, db, "plays_daily", "backfill"),
        Some(("running".into(), 0))
    );
    assert!(
        child.child.try_wait().unwrap().is_none(),
        "migrate ended while the replica was stopped"
    );
    replica.exec("START SLAVE");
    let (code, out, err) = child.finish();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("-- applied: backfilled 300 log rows"), "{out}");
    assert!(err.contains("done: 300 log rows in all"), "{err}");
    let (log, rollup) = rollup_and_log_on(primary, db);
    assert_eq!(rollup, log);
    assert_eq!(
        job_row_on(primary, db, "plays_daily", "backfill"),
        Some(("done".into(), 300))
    );
}

const EVENTS: &str = "CREATE TABLE events (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
     user_id INT NOT NULL, body VARCHAR(20) NOT NULL, KEY (user_id));";

/// `n` events over 50 users.
fn events(n: u64) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!("({}, 'e{i}')", (i * 7) % 50))
        .collect();
    format!(
        "{EVENTS} INSERT INTO events (user_id, body) VALUES {};",
        rows.join(", ")
    )
}

const RING_SIZE: u64 = 5;

fn ring_rule() -> String {
    Rule::ring("recent", "events")
        .key(&["user_id"])
        .size(RING_SIZE as usize)
        .ring_table("events_ring")
        .toml()
}

/// Each user's newest [`RING_SIZE`] events of the log (id, user, body), sorted.
fn newest_events(db: &str, table: &str) -> Groups {
    let mut rows = mariadb().query_strings(&format!(
        "SELECT CAST(id AS CHAR), CAST(user_id AS CHAR), body FROM \
         (SELECT id, user_id, body, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY id DESC) AS n \
          FROM {db}.{table}) AS t WHERE n <= {RING_SIZE}"
    ));
    rows.sort();
    rows
}

/// The ring's rows (id, user, body), sorted.
fn ring_rows(db: &str) -> Groups {
    let mut rows = mariadb().query_strings(&format!(
        "SELECT CAST(id AS CHAR), CAST(user_id AS CHAR), body FROM {db}.events_ring"
    ));
    rows.sort();
    rows
}

#[test]
fn a_ring_backfill_reports_progress_and_a_killed_one_is_redone_whole() {
    let db = "jobs_ring";
    fresh_db(db, &events(2000));
    let expected = newest_events(db, "events");
    let rules = common::client::rules_dir("ring.toml", &ring_rule());
    // Killed half way: the chunks so far are in the one transaction, rolled back.
    let mut child = spawn_migrate(
        rules.path(),
        db,
        &[
            "--chunk",
            "5",
            "--max-rows-per-second",
            "400",
            "--progress-every",
            "0.2",
        ],
    );
    child.wait_for("err", "/s, ETA ");
    child.kill();
    let err = child.output("err");
    assert!(
        err.contains("job backfill of rule recent: 2000 log rows to do in one transaction (stopped, it rolls back whole and the next run does it again from the start)"),
        "{err}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    // The server rolls the dead connection's transaction back.
    while scalar(&format!("SELECT COUNT(*) FROM {db}.events_ring")).as_deref() != Some("0")
        || scalar(&format!("SELECT COUNT(*) FROM {db}.events_ring_seq")).as_deref() != Some("0")
    {
        assert!(Instant::now() < deadline, "the killed backfill left rows");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Run again: the whole backfill, with progress lines, throttled.
    let started = Instant::now();
    let (code, out, err) = migrate(rules.path(), db)
        .apply()
        .flag("--chunk", 10)
        .flag("--max-rows-per-second", 1000)
        .flag("--progress-every", 0.2)
        .run();
    let took = started.elapsed();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(took >= Duration::from_secs(2), "took {took:?}");
    assert!(
        out.contains("-- applied: backfilled 250 ring rows and 50 sequence rows"),
        "{out}"
    );
    assert!(
        err.contains("2000 log rows to do in one transaction"),
        "{err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("/s, ETA ")).collect();
    assert!(lines.len() >= 2, "too few progress lines:\n{err}");
    assert!(!err.contains('\r'), "{err}");
    assert!(err.contains("done: 2000 log rows in all"), "{err}");
    assert_eq!(ring_rows(db), expected);
    // The sequence table continues each key's history.
    assert_eq!(
        scalar(&format!(
            "SELECT CAST(SUM(seq) AS CHAR) FROM {db}.events_ring_seq"
        ))
        .as_deref(),
        Some("2000")
    );
}

#[test]
fn a_ring_revert_copies_back_with_progress_and_its_dry_run_counts_what_moves() {
    let db = "jobs_ring_revert";
    fresh_db(db, &events(1000));
    let expected = newest_events(db, "events");
    common::fixture::migrate_apply(db, &ring_rule());
    assert_eq!(ring_rows(db), expected);
    let no_rules = tempfile::tempdir().unwrap();
    let reverting = |apply: bool| {
        let mut cli = revert("recent", no_rules.path(), db)
            .flag("--batch", 4)
            .flag("--max-rows-per-second", 100)
            .flag("--progress-every", 0.2);
        if apply {
            cli = cli.apply();
        }
        cli.run()
    };
    let (code, out, err) = reverting(false);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("its 1000 rows with a key are deleted")
            && out.contains("the ring's 250 rows of 50 keys are copied"),
        "{out}"
    );
    assert!(out.contains("in chunks of at most 4 keys"), "{out}");
    let started = Instant::now();
    let (code, out, err) = reverting(true);
    let took = started.elapsed();
    assert_eq!(code, 0, "{out}\n{err}");
    // 250 rows at 100 a second: at least 2.5 s (a lower bound only).
    assert!(took >= Duration::from_millis(2500), "took {took:?}");
    assert!(
        err.contains("job revert of rule recent: 250 ring rows to do in one transaction"),
        "{err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("/s, ETA ")).collect();
    assert!(lines.len() >= 2, "too few progress lines:\n{err}");
    assert!(err.contains("done: 250 ring rows in all"), "{err}");
    assert!(out.contains("now holds the ring's 250 rows"), "{out}");
    assert_eq!(newest_events(db, "events"), expected);
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.events")).as_deref(),
        Some("250")
    );
    assert!(!common::fixture::table_exists(db, "events_ring"));
    assert_eq!(
        scalar(&format!(
            "SELECT state FROM {db}.heatsink_rules WHERE name = 'recent'"
        ))
        .as_deref(),
        Some("reverted")
    );
}

#[test]
fn a_counter_revert_keeps_to_its_rate_and_prints_progress_lines() {
    let db = "jobs_fold_rate";
    let expected = counter_with_slots(db, 30);
    let no_rules = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (code, out, err) = revert("hits", no_rules.path(), db)
        .flag("--observe", 0)
        .flag("--batch", 3)
        .flag("--max-rows-per-second", 50)
        .flag("--progress-every", 0.3)
        .apply()
        .run();
    let took = started.elapsed();
    assert_eq!(code, 0, "{out}\n{err}");
    // 120 slot rows at 50 a second: at least 2.4 s (a lower bound only).
    assert!(took >= Duration::from_millis(2400), "took {took:?}");
    assert!(
        err.contains("job revert of rule hits: 120 slot rows to do"),
        "{err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("/s, ETA ")).collect();
    assert!(lines.len() >= 2, "too few progress lines:\n{err}");
    assert!(!err.contains('\r'), "{err}");
    assert!(err.contains("done: 120 slot rows in all"), "{err}");
    assert!(out.contains("in 10 transactions"), "{out}");
    assert_eq!(hits(db), expected);
    // The revert forgets its job rows with the rule.
    assert_eq!(job_row(db, "hits", "revert"), None);
}

/// Increments keys `k00`… of `db.hits` through the proxy at `url`, one key after
/// the other, until `stop`; returns the increments that committed, per key.
fn incrementer(
    url: String,
    keys: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<i64>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            use mysql_async::prelude::Queryable;
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
            let mut done = vec![0i64; keys];
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let sql = format!(
                    "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'k{:02}'",
                    i % keys
                );
                match conn.query_drop(sql).await {
                    Ok(()) => done[i % keys] += 1,
                    // A deadlock with the fold's chunk rolled the increment back.
                    Err(mysql_async::Error::Server(e)) if e.code == 1213 || e.code == 1205 => {}
                    Err(e) => panic!("increment: {e}"),
                }
                i += 7;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            let _ = conn.disconnect().await;
            done
        })
    })
}

/// A draining counter (`drain = true`) is folded by `migrate --revert` through the
/// job runner: chunks of `--batch` keys with their progress rows, progress lines,
/// the throttle. Increments run all along through a proxy that drains (they go to
/// the base rows) and one that has not reloaded yet (they go to slot rows); the
/// fold is killed half way, run again (it continues, saying how much was done) and
/// once more after the increments stop: every increment is counted once, and the
/// slot table ends empty.
#[test]
fn a_draining_fold_killed_half_way_under_increments_ends_exact() {
    let db = "jobs_drain";
    let keys = 60;
    let mut expected = counter_with_slots(db, keys as u64);
    let drained = Env::builder(db)
        .rule(
            "hits.toml",
            Rule::counter("hits", "hits")
                .slots(4)
                .set("drain", "true")
                .toml(),
        )
        .start();
    let not_reloaded = Env::builder(db)
        .rule("hits.toml", common::fixture::counter_rule("hits"))
        .start();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = [
        incrementer(drained.url(), keys, stop.clone()),
        incrementer(not_reloaded.url(), keys, stop.clone()),
    ];
    let fold = || {
        revert("hits", drained.rules_path(), db)
            .flag("--observe", 0)
            .flag("--batch", 5)
            .flag("--progress-every", 0.2)
            .apply()
    };
    let mut first = fold().flag("--max-rows-per-second", 40).spawn();
    let at_kill = kill_mid_way(&mut first, db, "hits", "drain", 60);
    assert!(at_kill >= 60, "{at_kill}");
    let err = first.output("err");
    assert!(err.contains("job drain of rule hits: "), "{err}");
    assert!(err.contains("/s, ETA "), "no progress line:\n{err}");

    let (out, err) = fold().ok();
    assert!(
        err.contains(&format!("continuing after {at_kill} done")),
        "{err}"
    );
    assert!(err.contains("job drain of rule hits: done: "), "{err}");
    assert!(
        out.contains("-- applied: folded ") && out.contains("transactions"),
        "{out}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let counts: Vec<Vec<i64>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    // The slot rows the proxy that has not reloaded wrote since.
    fold().ok();
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.hits_slots")).as_deref(),
        Some("0")
    );
    let total: i64 = counts.iter().flatten().sum();
    assert!(total > 100, "too few increments: {total}");
    for (i, row) in expected.iter_mut().enumerate() {
        let v: i64 = row[1].as_deref().unwrap().parse().unwrap();
        row[1] = Some((v + counts[0][i] + counts[1][i]).to_string());
    }
    assert_eq!(hits(db), expected);
    assert_eq!(
        job_row(db, "hits", "drain").map(|(s, _)| s).as_deref(),
        Some("done")
    );
}

/// The tables (with `SHOW CREATE TABLE`) and triggers of `db`, heatsink's own
/// bookkeeping tables (`heatsink_rules`, `heatsink_jobs`) aside.
fn schema_of(db: &str) -> Groups {
    let tables = mariadb().query_strings(&format!(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' \
         AND TABLE_NAME NOT IN ('heatsink_rules', 'heatsink_jobs') ORDER BY TABLE_NAME"
    ));
    let mut out: Groups = tables
        .iter()
        .flat_map(|t| {
            let t = t[0].clone().unwrap_or_default();
            mariadb().query_strings(&format!("SHOW CREATE TABLE {db}.`{t}`"))
        })
        .collect();
    out.extend(mariadb().query_strings(&format!(
        "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS \
         WHERE TRIGGER_SCHEMA = '{db}' ORDER BY TRIGGER_NAME"
    )));
    out
}

/// A rule's first `migrate --apply`, killed half way through its backfill, is
/// recorded as migrating; `migrate --revert` says what it found (the rollup table,
/// its triggers and the backfill's delta triggers and table, the job row) and backs
/// it out: the schema is the one before the migration, the log's rows untouched;
/// run again it finds nothing left; migrating again then ends exact.
#[test]
fn a_first_migration_killed_during_its_backfill_is_backed_out_by_revert() {
    let db = "jobs_first_backout";
    fresh_db(db, &plays(2000));
    let before = schema_of(db);
    let log = mariadb().query_strings(&format!("SELECT * FROM {db}.plays ORDER BY id"));
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let mut child = spawn_migrate(
        rules.path(),
        db,
        &["--chunk", "20", "--max-rows-per-second", "400"],
    );
    kill_mid_way(&mut child, db, "plays_daily", "backfill", 200);
    assert_ne!(schema_of(db), before);
    assert_eq!(
        scalar(&format!(
            "SELECT state FROM {db}.heatsink_rules WHERE name = 'plays_daily'"
        ))
        .as_deref(),
        Some("migrating")
    );
    let none = common::client::rules_dir("other.toml", "");
    // The dry run says what it found and changes nothing.
    let (out, _) = revert("plays_daily", none.path(), db).ok();
    assert!(out.contains("is recorded as migrating"), "{out}");
    for found in [
        "trigger `jobs_first_backout`.`plays_by_track_day_hs_ins`",
        "trigger `jobs_first_backout`.`plays_by_track_day_hs_bf_upd`",
        "table `jobs_first_backout`.`plays_by_track_day` (",
        "table `jobs_first_backout`.`plays_by_track_day_backfill_delta` (",
        "job backfill in `jobs_first_backout`.`heatsink_jobs` (running, ",
    ] {
        assert!(out.contains(found), "{found}:\n{out}");
    }
    assert_ne!(schema_of(db), before);
    let (out, _) = revert("plays_daily", none.path(), db).apply().ok();
    assert!(
        out.contains("-- applied: rule 'plays_daily' is backed out"),
        "{out}"
    );
    assert_eq!(schema_of(db), before);
    assert_eq!(
        mariadb().query_strings(&format!("SELECT * FROM {db}.plays ORDER BY id")),
        log
    );
    assert_eq!(job_row(db, "plays_daily", "backfill"), None);
    // Again: nothing is left to do.
    let (out, _) = revert("plays_daily", none.path(), db).apply().ok();
    assert!(
        out.contains("none of its triggers and side tables is left"),
        "{out}"
    );
    assert_eq!(schema_of(db), before);
    // The rule migrates afresh, exact.
    migrate(rules.path(), db).apply().ok();
    let (log, rollup) = rollup_and_log(db);
    assert_eq!(rollup, log);
}
