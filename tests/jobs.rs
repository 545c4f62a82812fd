//! Long jobs (`src/jobs.rs`): a rollup's backfill and a push timeline's mailbox
//! fill report their progress, keep to `--max-rows-per-second`, keep their progress
//! in `heatsink_jobs`, and, killed with SIGKILL half way and run again, end exact:
//! the rollup equals a fresh `GROUP BY` over the log, the mailboxes equal each
//! reader's newest timeline messages; reads through heatsink while a fill is half
//! done answer what the plain tables answer.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::Cli;
use common::client::{run, run_text, Outcome};
use common::fixture::{fresh_db, scalar, Env, Rule};
use common::{http_get, mariadb, sample};

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
    let mut log = mariadb().query_strings(&format!(
        "SELECT CAST(track_id AS CHAR), DATE_FORMAT(created_at, '%Y-%m-%d'), COUNT(*), \
         CAST(IFNULL(SUM(user_id), 0) AS CHAR) FROM {db}.plays \
         GROUP BY track_id, DATE_FORMAT(created_at, '%Y-%m-%d')"
    ));
    let mut rollup = mariadb().query_strings(&format!(
        "SELECT IF(hs_nulls & 1, NULL, CAST(track_id AS CHAR)), \
         IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d')), SUM(hs_rows), \
         CAST(CAST(SUM(hs_sum_user_id) AS SIGNED) AS CHAR) FROM {db}.plays_by_track_day \
         GROUP BY track_id, hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0"
    ));
    log.sort();
    rollup.sort();
    (log, rollup)
}

/// `heatsink migrate --apply` for the rules in `rules` on `db` with `extra`
/// arguments, as a child process (stdout and stderr piped to files).
fn spawn_migrate(rules: &std::path::Path, db: &str, extra: &[&str]) -> (Child, tempfile::TempDir) {
    let logs = tempfile::tempdir().unwrap();
    let out = std::fs::File::create(logs.path().join("out")).unwrap();
    let err = std::fs::File::create(logs.path().join("err")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_heatsink"))
        .arg("migrate")
        .arg("--rules")
        .arg(rules)
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .args(extra)
        .env_remove("HEATSINK_BACKEND_URL")
        .env_remove("HEATSINK_RULES")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    (child, logs)
}

/// The job's `(state, rows_done)` in `heatsink_jobs`, if it has a row.
fn job_row(db: &str, rule: &str, job: &str) -> Option<(String, u64)> {
    let exists = scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'heatsink_jobs'"
    ));
    if exists.as_deref() != Some("1") {
        return None;
    }
    let rows = mariadb().query_strings(&format!(
        "SELECT state, CAST(rows_done AS CHAR) FROM {db}.heatsink_jobs WHERE rule = '{rule}' AND job = '{job}'"
    ));
    let r = rows.into_iter().next()?;
    Some((
        r[0].clone().unwrap_or_default(),
        r[1].as_deref().and_then(|n| n.parse().ok()).unwrap_or(0),
    ))
}

/// Waits until the rollup backfill of `rule` runs (its snapshot is taken).
fn wait_running(child: &mut Child, logs: &std::path::Path, db: &str, rule: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while job_row(db, rule, "backfill").is_none_or(|(s, _)| s != "running") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "migrate ended ({status}) before the job ran:\n{}\n{}",
                std::fs::read_to_string(logs.join("out")).unwrap_or_default(),
                std::fs::read_to_string(logs.join("err")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the job did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the job has committed at least `rows` items and is still running,
/// then kills `child` with SIGKILL; returns the items done when it was killed.
fn kill_mid_way(
    child: &mut Child,
    logs: &std::path::Path,
    db: &str,
    rule: &str,
    job: &str,
    rows: u64,
) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((state, done)) = job_row(db, rule, job) {
            if state == "running" && done >= rows {
                break;
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "migrate ended ({status}) before the job was half way:\n{}\n{}",
                std::fs::read_to_string(logs.join("out")).unwrap_or_default(),
                std::fs::read_to_string(logs.join("err")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the job made no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    job_row(db, rule, job).map(|(_, n)| n).unwrap_or(0)
}

#[test]
fn a_throttled_backfill_prints_progress_lines_and_keeps_to_its_rate() {
    let db = "jobs_throttle";
    let rows = 600u64;
    fresh_db(db, &plays(rows));
    let rules = common::client::rules_dir("rollup.toml", &rollup_rule());
    let started = Instant::now();
    let (code, out, err) = Cli::new(["migrate", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .arg("--chunk")
        .arg("50")
        .arg("--max-rows-per-second")
        .arg("200")
        .arg("--progress-every")
        .arg("0.5")
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

fn stdout_of(logs: &std::path::Path) -> String {
    std::fs::read_to_string(logs.join("out")).unwrap_or_default()
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
    let (mut child, logs) = spawn_migrate(rules.path(), db, &throttled);
    // The writes start once the snapshot is taken: its last key is then 2000.
    wait_running(&mut child, logs.path(), db, "plays_daily");
    let w = writer(db, 0, 20, Duration::from_millis(40));
    let done1 = kill_mid_way(&mut child, logs.path(), db, "plays_daily", "backfill", 200);
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
    let (_, out, err) = Cli::new(["check", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .run();
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
    let (mut child, logs) = spawn_migrate(rules.path(), db, &throttled);
    let w = writer(db, 30, 45, Duration::from_millis(40));
    let done2 = kill_mid_way(
        &mut child,
        logs.path(),
        db,
        "plays_daily",
        "backfill",
        done1 + 300,
    );
    w.join().unwrap();
    let out = stdout_of(logs.path());
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
    let (mut child, logs) = spawn_migrate(rules.path(), db, &throttled);
    let w = writer(db, 50, 70, Duration::from_millis(40));
    kill_mid_way(&mut child, logs.path(), db, "plays_hourly", "backfill", 200);
    w.join().unwrap();
    let out = stdout_of(logs.path());
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
    let (code, out, err) = Cli::new(["migrate", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .run();
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
    let (mut child, logs) = spawn_migrate(
        rules.path(),
        db,
        &["--chunk", "20", "--max-rows-per-second", "400"],
    );
    let w = writer(db, 0, 10, Duration::from_millis(40));
    let done = kill_mid_way(&mut child, logs.path(), db, "plays_daily", "backfill", 200);
    w.join().unwrap();
    assert!(done > 0 && done < 2000, "killed after {done} rows");
    // A delta trigger gone (dropped by hand): the deltas are incomplete, so the
    // next run cannot continue and starts over.
    mariadb().exec(&format!("DROP TRIGGER {db}.plays_by_track_day_hs_bf_upd"));
    for round in 10..20 {
        write_to_log(db, round);
    }
    let (_, out, err) = Cli::new(["check", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .run();
    assert!(
        out.contains("backfills it again (from the start)")
            || err.contains("backfills it again (from the start)"),
        "{out}\n{err}"
    );
    let (code, out, err) = Cli::new(["migrate", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .run();
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
        let mut cli = Cli::new(["migrate", "--rules"])
            .arg(rules.path())
            .arg("--backend-url")
            .arg(mariadb().url(db))
            .arg("--apply");
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
    let (mut child, logs) = spawn_migrate(
        rules.path(),
        db,
        &["--chunk", "20", "--max-rows-per-second", "400"],
    );
    kill_mid_way(&mut child, logs.path(), db, "plays_daily", "backfill", 100);
    assert_eq!(deltas_left(db).len(), 4, "{:?}", deltas_left(db));
    // The rule leaves the rule files; its revert drops what the backfill kept too.
    let none = common::client::rules_dir("other.toml", "");
    let (code, out, err) = Cli::new(["migrate", "--revert", "plays_daily", "--rules"])
        .arg(none.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .run();
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

/// Column flags that follow MariaDB's plan (a join sorted through a temporary table
/// loses the key and AUTO_INCREMENT flags): either form is the plain query's answer
/// (as in tests/timeline.rs).
const PLAN_FLAGS: u16 = 0x0002 | 0x0004 | 0x0008 | 0x0200 | 0x4000 | 0x8000;

fn masked(mut o: Outcome) -> Outcome {
    for c in &mut o.columns {
        c.flags =
            mysql_async::consts::ColumnFlags::from_bits_truncate(c.flags.bits() & !PLAN_FLAGS);
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
    let (mut child, logs) = spawn_migrate(
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
    let done = kill_mid_way(&mut child, logs.path(), db, "friends", "fill", 15);
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
    let (code, out, err) = Cli::new(["migrate", "--rules"])
        .arg(env.rules_path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .run();
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
    let (code, out, err) = Cli::new(["maintain", "--rules"])
        .arg(env.rules_path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--job")
        .arg("trim")
        .arg("--apply")
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
    let (code, out, err) = Cli::new(["migrate", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(mariadb().url(db))
        .arg("--apply")
        .arg("--defer-jobs")
        .run();
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
