//! Rollup rules: `heatsink migrate --apply` creates the rollup tables, the triggers
//! that keep them exact and the online backfill; every write, straight to the
//! database or through heatsink (also when heatsink is killed under its clients), must
//! leave each rollup equal to a GROUP BY over the log.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cli::migrate;
use common::client::{connect, rules_dir, run};
use common::fixture::{fresh_db, migrate_apply, scalar, Env, Rule};
use common::{mariadb, Proxy};
use mysql_async::prelude::Queryable;

const PLAYS: &str = "CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME DEFAULT NULL, \
     track_id INT DEFAULT NULL, user_id INT DEFAULT NULL, referer TEXT, country VARCHAR(255) DEFAULT NULL, \
     KEY (track_id), KEY (created_at));";

/// The two rollups of `plays` the tests use.
fn rules() -> String {
    let hourly = Rule::rollup(
        "plays_hourly",
        "plays",
        "plays_by_track_hour",
        "created_at",
        "hour",
    )
    .dimensions(&["track_id"])
    .set("slots", "4");
    let daily = Rule::rollup(
        "plays_daily",
        "plays",
        "plays_by_country_day",
        "created_at",
        "day",
    )
    .dimensions(&["track_id", "country"])
    .measures(&["count(*)", "count(user_id)", "sum(user_id)"]);
    format!("{}\n{}", hourly.toml(), daily.toml())
}

type Groups = Vec<Vec<Option<String>>>;

fn sorted(mut rows: Groups) -> Groups {
    rows.sort();
    rows
}

/// (from the log, from the rollup) of the hourly rollup, as sorted groups.
fn hourly(db: &str) -> (Groups, Groups) {
    let log = mariadb().query_strings(&format!(
        "SELECT CAST(track_id AS CHAR), DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00'), COUNT(*) \
         FROM {db}.plays GROUP BY track_id, DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00')"
    ));
    let rollup = mariadb().query_strings(&format!(
        "SELECT IF(hs_nulls & 1, NULL, CAST(track_id AS CHAR)), \
                IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d %H:%i:%s')), SUM(hs_rows) \
         FROM {db}.plays_by_track_hour GROUP BY track_id, hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0"
    ));
    (sorted(log), sorted(rollup))
}

/// (from the log, from the rollup) of the daily rollup, as sorted groups.
fn daily(db: &str) -> (Groups, Groups) {
    let log = mariadb().query_strings(&format!(
        "SELECT CAST(track_id AS CHAR), country, DATE_FORMAT(created_at, '%Y-%m-%d 00:00:00'), \
                COUNT(*), COUNT(user_id), CAST(IFNULL(SUM(user_id), 0) AS CHAR) \
         FROM {db}.plays GROUP BY track_id, country, DATE_FORMAT(created_at, '%Y-%m-%d 00:00:00')"
    ));
    let rollup = mariadb().query_strings(&format!(
        "SELECT IF(hs_nulls & 1, NULL, CAST(track_id AS CHAR)), IF(hs_nulls & 2, NULL, country), \
                IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d %H:%i:%s')), \
                SUM(hs_rows), SUM(hs_count_user_id), CAST(SUM(hs_sum_user_id) AS CHAR) \
         FROM {db}.plays_by_country_day GROUP BY track_id, country, hs_nulls, hs_bucket \
         HAVING SUM(hs_rows) <> 0 OR SUM(hs_count_user_id) <> 0 OR SUM(hs_sum_user_id) <> 0"
    ));
    (sorted(log), sorted(rollup))
}

#[track_caller]
fn assert_exact(db: &str, after: &str) {
    let (log, rollup) = hourly(db);
    assert!(!log.is_empty(), "{after}: the log is empty");
    assert_eq!(rollup, log, "hourly rollup after {after}");
    let (log, rollup) = daily(db);
    assert_eq!(rollup, log, "daily rollup after {after}");
}

const SEED_ROWS: &str = "INSERT INTO plays (created_at, track_id, user_id, referer, country) VALUES \
     ('2024-05-01 10:15:00', 1, 10, 'a', 'US'), ('2024-05-01 10:45:00', 1, NULL, NULL, 'US'), \
     ('2024-05-01 11:00:00', 1, 11, 'b', NULL), ('2024-05-01 23:59:59', NULL, 12, NULL, 'DE'), \
     (NULL, 2, 13, 'c', 'DE'), (NULL, NULL, NULL, NULL, NULL), ('2024-05-02 00:00:00', 2, 14, 'd', 'FR'), \
     ('2024-05-02 08:30:00', 3, -5, 'e', ''), ('2024-05-02 08:31:00', 0, 0, 'f', 'US');";

#[test]
fn migrate_backfills_and_triggers_keep_both_rollups_exact() {
    let db = "rollup_writes";
    fresh_db(db, &format!("{PLAYS} {SEED_ROWS}"));
    let out = migrate_apply(db, &rules());
    assert!(out.contains("-- applied: created rollup table"), "{out}");
    assert!(out.contains("-- applied: backfilled 9 log rows"), "{out}");
    assert!(out.contains("plays_by_track_hour_hs_upd"), "{out}");
    assert_exact(db, "the backfill");

    let writes = [
        "INSERT INTO plays (created_at, track_id, user_id, country) VALUES \
         ('2024-05-01 10:20:00', 1, 20, 'US'), ('2024-05-03 01:00:00', NULL, 21, NULL), (NULL, 4, NULL, 'SE')",
        "INSERT INTO plays (created_at, track_id, user_id, referer, country) \
         SELECT created_at + INTERVAL 1 HOUR, track_id, user_id, referer, country FROM plays WHERE id <= 6",
        "UPDATE plays SET track_id = 5, created_at = created_at + INTERVAL 2 DAY WHERE track_id = 1",
        "UPDATE plays SET country = NULL, user_id = user_id + 100 WHERE country = 'DE'",
        "UPDATE plays SET created_at = NULL WHERE id = 7",
        "UPDATE plays SET referer = 'only the referer' WHERE id = 8",
        "DELETE FROM plays WHERE track_id = 2 OR id = 3",
    ];
    for sql in writes {
        mariadb().exec(&format!("USE {db}; {sql}"));
        assert_exact(db, sql);
    }
    mariadb().exec(&format!(
        "USE {db}; START TRANSACTION; INSERT INTO plays (created_at, track_id) VALUES ('2024-06-01', 9); \
         DELETE FROM plays WHERE id = 1; UPDATE plays SET track_id = 8; ROLLBACK"
    ));
    assert_exact(db, "a rolled-back transaction");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plays.tsv");
    std::fs::write(
        &file,
        "2024-05-04 12:00:00\t6\t30\tUS\n\\N\t6\t\\N\t\\N\n2024-05-04 12:30:00\t\\N\t31\tFR\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let can_read =
        scalar(&format!("SELECT LOAD_FILE('{path}') IS NOT NULL")).as_deref() == Some("1");
    eprintln!("LOAD DATA INFILE readable by the server: {can_read}");
    if can_read {
        mariadb().exec(&format!(
            "USE {db}; LOAD DATA INFILE '{path}' INTO TABLE plays (created_at, track_id, user_id, country)"
        ));
        assert_exact(db, "LOAD DATA INFILE");
    }

    // Everything is in place: a second run changes nothing and backfills nothing.
    let again = migrate_apply(db, &rules());
    assert!(!again.contains("-- applied"), "{again}");
    assert!(again.contains("exists and matches the rule"), "{again}");
    assert_exact(db, "a second migrate");
}

#[test]
fn unsuitable_logs_are_refused() {
    let db = "rollup_refused";
    let cases: [(&str, Rule, &str); 5] = [
        (
            "CREATE TABLE plays (id INT PRIMARY KEY, created_at DATE NULL, track_id INT)",
            Rule::rollup("r", "plays", "plays_r", "created_at", "day"),
            "not DATETIME or TIMESTAMP",
        ),
        (
            PLAYS,
            Rule::rollup("r", "plays", "plays_r", "created_at", "day").dimensions(&["referer"]),
            "dimension `referer`",
        ),
        (
            PLAYS,
            Rule::rollup("r", "plays", "plays_r", "created_at", "day").measures(&["sum(country)"]),
            "not a number",
        ),
        (
            &format!("{PLAYS} CREATE TABLE plays_r (track_id INT NOT NULL PRIMARY KEY);"),
            Rule::rollup("r", "plays", "plays_r", "created_at", "day").dimensions(&["track_id"]),
            "plays_r",
        ),
        (
            "CREATE TABLE plays (uuid CHAR(36) PRIMARY KEY, created_at DATETIME); \
             INSERT INTO plays VALUES ('x', NOW());",
            Rule::rollup("r", "plays", "plays_r", "created_at", "day"),
            "integer primary key",
        ),
    ];
    for (ddl, rule, want) in cases {
        fresh_db(db, ddl);
        let dir = rules_dir("rollup.toml", &rule.toml());
        let (code, out, err) = migrate(dir.path(), db, true);
        assert_ne!(code, 0, "{ddl}: {out}");
        assert!(err.contains(want), "{ddl}: want {want}: {err}");
        assert!(!common::fixture::table_exists(db, "plays_r") || ddl.contains("plays_r"));
    }
}

#[test]
fn backfill_under_concurrent_writers_is_exact() {
    let db = "rollup_concurrent";
    fresh_db(
        db,
        &format!(
            "{PLAYS} INSERT INTO plays (created_at, track_id, user_id, country) \
             SELECT '2024-05-01' + INTERVAL (seq % 500) HOUR, IF(seq % 7 = 0, NULL, seq % 40), \
                    IF(seq % 5 = 0, NULL, seq % 1000), ELT(1 + seq % 4, 'US', 'DE', NULL, 'FR') \
             FROM seq_1_to_50000;"
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    run(Duration::from_secs(60), async {
        let url = mariadb().url(db);
        let mut writers = Vec::new();
        for w in 0..16u64 {
            let (url, stop, done) = (url.clone(), stop.clone(), done.clone());
            writers.push(tokio::spawn(async move {
                let mut conn = connect(&url).await;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let track = if w % 2 == 0 { 7 } else { (w * 31 + i) % 40 };
                    let id = (w * 7919 + i * 104_729) % 50_000 + 1;
                    let sql = match i % 10 {
                        0 => format!(
                            "UPDATE plays SET track_id = {track}, created_at = created_at + INTERVAL 1 DAY, user_id = user_id + 1 WHERE id = {id}"
                        ),
                        5 => format!("DELETE FROM plays WHERE id = {id}"),
                        _ => format!(
                            "INSERT INTO plays (created_at, track_id, user_id, country) \
                             VALUES ('2024-05-10' + INTERVAL {} MINUTE, {track}, {i}, 'SE')",
                            i % 600
                        ),
                    };
                    // A deadlock or lock timeout rolls the whole statement back: fine.
                    if conn.query_drop(&sql).await.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = done.load(Ordering::Relaxed);
        let out = tokio::task::spawn_blocking(|| migrate_apply("rollup_concurrent", &rules()))
            .await
            .unwrap();
        let during = done.load(Ordering::Relaxed) - before;
        assert!(out.contains("-- applied: backfilled"), "{out}");
        assert!(during > 50, "only {during} writes while migrate ran");
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await.unwrap();
        }
    });
    assert!(done.load(Ordering::Relaxed) > 100, "writers barely ran");
    assert_exact(db, "concurrent writes during the backfill");
}

#[test]
fn check_reports_missing_and_differing_objects() {
    let db = "rollup_check";
    fresh_db(db, &format!("{PLAYS} {SEED_ROWS}"));
    let dir = rules_dir("rollup.toml", &rules());
    let path = dir.path().to_str().unwrap().to_string();
    let url = mariadb().url(db);
    let check = || common::cli::heatsink(&["check", "--rules", &path, "--backend-url", &url]);

    let (code, out, err) = check();
    assert_eq!(code, 1, "{out}\n{err}");
    for want in [
        "rollup table `rollup_check`.`plays_by_track_hour` does not exist",
        "trigger `rollup_check`.`plays_by_country_day_hs_upd` on `rollup_check`.`plays` is missing",
        "has rows but `rollup_check`.`plays_by_track_hour` has none",
    ] {
        assert!(out.contains(want), "want {want}:\n{out}");
    }

    migrate_apply(db, &rules());
    let (code, out, err) = check();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("differs"), "{out}");

    mariadb().exec(&format!(
        "USE {db}; DROP TRIGGER plays_by_track_hour_hs_del; \
         CREATE TRIGGER plays_by_track_hour_hs_del AFTER DELETE ON plays FOR EACH ROW SET @x = 1"
    ));
    let (code, out, err) = check();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("plays_by_track_hour_hs_del` on `rollup_check`.`plays` differs"),
        "{out}"
    );

    // A filled rollup whose triggers are gone has missed writes: refused.
    mariadb().exec(&format!(
        "USE {db}; DROP TRIGGER plays_by_track_hour_hs_del"
    ));
    let (code, out, err) = migrate(dir.path(), db, true);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("may have missed writes"), "{err}");
}

#[test]
fn dimensions_of_every_key_type_keep_their_nulls_apart() {
    let db = "rollup_types";
    fresh_db(
        db,
        "CREATE TABLE ev (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, at DATETIME(3), \
           d DATE, e ENUM('x','y'), m DECIMAL(8,2), y YEAR, t TIME, c CHAR(3) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, \
           u BIGINT UNSIGNED, amount DECIMAL(10,3)); \
         INSERT INTO ev (at, d, e, m, y, t, c, u, amount) VALUES \
           ('2024-01-01 05:06:07.890', '2024-01-01', 'y', 1.50, 2024, '10:00:00', 'abc', 18446744073709551615, 1.125), \
           ('2024-01-01 05:59:59', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), \
           ('2024-01-01 06:00:00', '1000-01-01', 'x', 0, 0, '00:00:00', '', 0, -2.5);",
    );
    let rule = Rule::rollup("ev_hourly", "ev", "ev_hourly", "at", "hour")
        .dimensions(&["d", "e", "m", "y", "t", "c", "u"])
        .measures(&["sum(amount)", "count(u)"]);
    migrate_apply(db, &rule.toml());
    mariadb().exec(&format!(
        "USE {db}; INSERT INTO ev (at, e, c, amount) VALUES (NULL, 'x', NULL, 3.001); \
         UPDATE ev SET e = NULL, amount = amount * 2 WHERE id = 1; DELETE FROM ev WHERE id = 3"
    ));
    let dims = ["d", "e", "m", "y", "t", "c", "u"];
    let shown: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| format!("IF(hs_nulls & {}, NULL, CAST({d} AS CHAR))", 1 << i))
        .collect();
    let log = mariadb().query_strings(&format!(
        "SELECT {}, DATE_FORMAT(at, '%Y-%m-%d %H:00:00'), COUNT(*), COUNT(u), CAST(IFNULL(SUM(amount), 0) AS CHAR) \
         FROM {db}.ev GROUP BY {}, DATE_FORMAT(at, '%Y-%m-%d %H:00:00')",
        dims.map(|d| format!("CAST({d} AS CHAR)")).join(", "),
        dims.join(", ")
    ));
    let rollup = mariadb().query_strings(&format!(
        "SELECT {}, IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d %H:%i:%s')), \
                SUM(hs_rows), SUM(hs_count_u), CAST(SUM(hs_sum_amount) AS CHAR) \
         FROM {db}.ev_hourly GROUP BY {}, hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0",
        shown.join(", "),
        dims.join(", ")
    ));
    assert_eq!(sorted(rollup), sorted(log));
    assert_eq!(
        scalar(&format!(
            "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME = 'ev_hourly' AND COLUMN_NAME = 'hs_sum_amount'"
        ))
        .as_deref(),
        Some("decimal(65,3)")
    );
}

/// Which writers of [`write_load`] are connected through heatsink.
fn through_heatsink(writer: u64) -> bool {
    writer.is_multiple_of(2)
}

/// The statement writer `w` sends as its `i`-th, `last` being the id its connection
/// inserted last: mostly single- and multi-row inserts, half of all rows on track 7,
/// some NULL dimensions and times, a few UPDATEs and DELETEs.
fn load_statement(w: u64, i: u64, last: Option<u64>) -> String {
    let row = |k: u64| {
        let n = w * 7919 + i * 31 + k;
        let track = if n.is_multiple_of(2) {
            "7".to_string()
        } else if n % 13 == 1 {
            "NULL".to_string()
        } else {
            (n % 40).to_string()
        };
        let at = if n % 11 == 3 {
            "NULL".to_string()
        } else {
            format!("'2024-05-10' + INTERVAL {} MINUTE", n % 4000)
        };
        let user = if n.is_multiple_of(5) {
            "NULL".to_string()
        } else {
            (n % 1000).to_string()
        };
        let country = ["'US'", "'DE'", "NULL", "'FR'", "''"][(n / 3 % 5) as usize];
        format!("({at}, {track}, {user}, {country})")
    };
    let insert = "INSERT INTO plays (created_at, track_id, user_id, country) VALUES ";
    match (i % 20, last) {
        (7, Some(id)) => format!(
            "UPDATE plays SET track_id = IF(track_id = 7, {}, 7), created_at = created_at + INTERVAL 1 HOUR, \
             user_id = user_id + 1 WHERE id = {id}",
            i % 40
        ),
        (13, Some(id)) => format!("UPDATE plays SET country = NULL, created_at = NULL WHERE id = {id}"),
        (17, Some(id)) => format!("DELETE FROM plays WHERE id = {id}"),
        (3 | 11, _) => {
            let rows: Vec<String> = (0..2 + i % 4).map(row).collect();
            format!("{insert}{}", rows.join(", "))
        }
        _ => format!("{insert}{}", row(0)),
    }
}

/// What the writers of one side (through heatsink or direct) of [`write_load`] saw.
#[derive(Debug, Default, Clone, Copy)]
struct Side {
    /// Statements acknowledged.
    ok: u64,
    /// Statements the server refused (deadlocks, lock wait timeouts).
    refused: u64,
    /// Statements whose connection broke under them (the proxy killed).
    lost: u64,
    /// Statements acknowledged on a connection opened after one was lost.
    ok_after_loss: u64,
}

impl std::ops::AddAssign for Side {
    fn add_assign(&mut self, o: Side) {
        self.ok += o.ok;
        self.refused += o.refused;
        self.lost += o.lost;
        self.ok_after_loss += o.ok_after_loss;
    }
}

/// What the 64 writers of [`write_load`] saw.
#[derive(Debug, Default, Clone, Copy)]
struct LoadCounts {
    proxied: Side,
    direct: Side,
}

/// 64 writers, half through the proxy at `*proxy_url` (read again on every reconnect),
/// half straight to MariaDB, until `stop` is set. A statement that fails (a deadlock,
/// or the proxy killed under it) is counted; a connection that fails is opened again.
async fn write_load(
    db: &str,
    proxy_url: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    round: u64,
) -> LoadCounts {
    let direct_url = mariadb().url(db);
    let mut writers = Vec::new();
    for w in 0..64u64 {
        let (proxy_url, direct_url, stop) = (proxy_url.clone(), direct_url.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let proxied = through_heatsink(w);
            let mut seen = Side::default();
            let mut conn: Option<mysql_async::Conn> = None;
            let mut last = None;
            let mut i = round * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let Some(c) = conn.as_mut() else {
                    let url = if proxied {
                        proxy_url.lock().unwrap().clone()
                    } else {
                        direct_url.clone()
                    };
                    match tokio::time::timeout(
                        Duration::from_secs(5),
                        mysql_async::Conn::from_url(url),
                    )
                    .await
                    {
                        Ok(Ok(c)) => conn = Some(c),
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                    continue;
                };
                i += 1;
                let sql = load_statement(w, i, last);
                match tokio::time::timeout(Duration::from_secs(10), c.query_drop(&sql)).await {
                    Ok(Ok(())) => {
                        seen.ok += 1;
                        if seen.lost > 0 {
                            seen.ok_after_loss += 1;
                        }
                        if sql.starts_with("INSERT") {
                            last = c.last_insert_id();
                        }
                    }
                    // A deadlock or lock wait timeout rolls the statement back.
                    Ok(Err(mysql_async::Error::Server(_))) => seen.refused += 1,
                    // The connection is gone (the proxy was killed): open another.
                    _ => {
                        seen.lost += 1;
                        conn = None;
                    }
                }
            }
            if let Some(c) = conn {
                let _ = c.disconnect().await;
            }
            (proxied, seen)
        }));
    }
    let mut counts = LoadCounts::default();
    for w in writers {
        let (proxied, seen) = w.await.unwrap();
        if proxied {
            counts.proxied += seen;
        } else {
            counts.direct += seen;
        }
    }
    counts
}

/// Waits until no statement of the test user is running in `db` (a statement whose
/// client, or proxy, was killed may still be finishing or rolling back).
fn wait_quiet(db: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let busy = scalar(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{}' \
             AND DB = '{db}' AND COMMAND <> 'Sleep'",
            common::USER
        ));
        if busy.as_deref() == Some("0") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "statements still running in {db} after 20 s: {busy:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Aggregate reads the rollups answer: through heatsink and straight to MariaDB they
/// must give the same rows.
async fn assert_reads_agree(proxy_url: &str, db: &str) {
    let reads = [
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at >= '2024-05-11 13:30:00' \
         GROUP BY track_id ORDER BY track_id",
        "SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id ORDER BY track_id",
        "SELECT track_id, country, COUNT(*) AS n, COUNT(user_id) AS u FROM plays \
         WHERE created_at BETWEEN '2024-05-10 05:17:00' AND '2024-05-12 02:00:00' \
         GROUP BY track_id, country ORDER BY track_id, country",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id = 7 AND created_at < '2024-05-11 20:05:00'",
        "SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays WHERE track_id = 7 \
         AND created_at >= '2024-05-10' GROUP BY d ORDER BY d",
    ];
    let mut through = connect(proxy_url).await;
    let mut direct = connect(&mariadb().url(db)).await;
    for sql in reads {
        let rows = same_rows(&mut through, &mut direct, sql, "").await;
        assert!(rows > 0, "{sql}: no rows");
    }
    through.disconnect().await.unwrap();
    direct.disconnect().await.unwrap();
}

/// Runs `sql` through heatsink and straight to MariaDB and asserts the same rows
/// (`context` is added to the failure message); the number of rows.
async fn same_rows(
    through: &mut mysql_async::Conn,
    direct: &mut mysql_async::Conn,
    sql: &str,
    context: &str,
) -> usize {
    let via: Vec<mysql_async::Row> = through
        .query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let log: Vec<mysql_async::Row> = direct.query(sql).await.unwrap();
    let via: Vec<_> = via.into_iter().map(mysql_async::Row::unwrap).collect();
    let log: Vec<_> = log.into_iter().map(mysql_async::Row::unwrap).collect();
    assert_eq!(via, log, "{sql} {context}");
    log.len()
}

/// 64 writers (half of the rows on one hot track), half through heatsink and half
/// straight to MariaDB: afterwards every rollup equals a GROUP BY over the log. Then the
/// same load again with the proxy killed (SIGKILL) under its writers, the direct writers
/// going on, a new proxy started and the proxied writers resuming on it.
#[test]
fn writers_through_heatsink_and_direct_keep_rollups_exact_across_kill9() {
    let db = "rollup_kill9";
    let mut env = Env::builder(db)
        .schema(format!("{PLAYS} {SEED_ROWS}"))
        .rule("rollup.toml", rules())
        .migrate()
        .start();
    assert_exact(db, "the migrate");
    let proxy_url = Arc::new(Mutex::new(env.url()));

    // Round 1: the proxy stays up.
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load = rt.spawn({
        let (proxy_url, stop) = (proxy_url.clone(), stop.clone());
        async move { write_load("rollup_kill9", proxy_url, stop, 0).await }
    });
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let first = rt.block_on(load).unwrap();
    eprintln!("round 1: {first:?}");
    assert!(first.proxied.ok > 200 && first.direct.ok > 200, "{first:?}");
    assert_eq!(first.proxied.lost + first.direct.lost, 0, "{first:?}");
    wait_quiet(db);
    assert_exact(db, "64 writers through heatsink and direct");
    rt.block_on(assert_reads_agree(&env.url(), db));

    // Round 2: kill -9 of the proxy mid-load, a new proxy, the proxied writers resume.
    let stop = Arc::new(AtomicBool::new(false));
    let load = rt.spawn({
        let (proxy_url, stop) = (proxy_url.clone(), stop.clone());
        async move { write_load("rollup_kill9", proxy_url, stop, 1).await }
    });
    std::thread::sleep(Duration::from_secs(2));
    let pid = env.proxy.pid().expect("proxy running");
    env.proxy.kill9();
    eprintln!("killed heatsink (pid {pid}) with SIGKILL");
    let max_id =
        || scalar(&format!("SELECT MAX(id) FROM {db}.plays")).map(|v| v.parse::<u64>().unwrap());
    let at_kill = max_id();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        max_id() > at_kill,
        "the direct writers stopped with the proxy"
    );
    let (proxy, metrics) = Proxy::builder()
        .rules_dir(env.rules_path())
        .start_with_metrics();
    *proxy_url.lock().unwrap() = proxy.url(db);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let second = rt.block_on(load).unwrap();
    eprintln!("round 2: {second:?}");
    assert!(
        second.proxied.lost > 0,
        "no proxied writer saw the kill: {second:?}"
    );
    assert!(
        second.proxied.ok_after_loss > 100,
        "the proxied writers did not resume on the new proxy: {second:?}"
    );
    assert!(second.direct.ok > 200, "{second:?}");
    assert_eq!(second.direct.lost, 0, "{second:?}");
    wait_quiet(db);
    assert_exact(db, "kill -9 of heatsink under 32 of 64 writers");
    rt.block_on(assert_reads_agree(&proxy.url(db), db));

    // The reads were answered from the rollups, not from the log.
    let (status, body) = common::http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{body}");
    for rule in ["plays_hourly", "plays_daily"] {
        let count = |outcome: &str| {
            common::sample(
                &body,
                &format!("heatsink_rule_statements_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}"),
            )
        };
        eprintln!(
            "{rule}: rewritten {:?}, fallback {:?}",
            count("rewritten"),
            count("fallback")
        );
        assert!(count("rewritten").unwrap_or(0.0) >= 1.0, "{rule}:\n{body}");
        assert_eq!(count("fallback"), Some(0.0), "{rule}:\n{body}");
    }
}

/// Rollup reads through the `mariadb` CLI, which negotiates MariaDB's extended
/// column metadata: the rewritten columns' definitions must stay parseable, and the
/// output (with column types, `--column-type-info`) equal the log's.
#[test]
fn reads_through_the_mariadb_cli_match_the_log() {
    let db = "rollup_cli";
    let env = Env::builder(db)
        .schema(format!("{PLAYS} {SEED_ROWS}"))
        .rule("rollup.toml", rules())
        .migrate()
        .start();
    // Shapes whose plan (and so column flags) MariaDB picks the same way on any data.
    let reads = "SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id;\n\
                 SELECT country, COUNT(*) AS n FROM plays WHERE created_at >= '2024-05-01 12:00' GROUP BY country;\n\
                 SELECT country, COUNT(*) AS n, COUNT(user_id) AS u FROM plays GROUP BY country;\n\
                 SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays GROUP BY d;\n\
                 SELECT COUNT(*) AS n FROM plays WHERE track_id = 1;\n";
    let args = ["--table", "--column-type-info", db];
    let cli = |port| {
        common::cli::mariadb_client(port, common::USER, common::PASSWORD, &args, Some(reads))
    };
    let (via, direct) = (cli(env.proxy.port()), cli(mariadb().port()));
    assert_eq!(via.code, Some(0), "{}", via.stderr);
    assert_eq!(
        via.stdout, direct.stdout,
        "through heatsink:\n{}",
        via.stdout
    );
    assert!(via.stdout.contains("`n`"), "{}", via.stdout);
}

/// What one merged-insert client saw: (user_id of its first row, rows, reported
/// last insert id, info).
type Answer = (i64, u64, u64, Option<String>);

/// Concurrent autocommit inserts through heatsink merge into multi-row inserts
/// (group commit): each client is answered as its own insert would have been — its
/// rows, the id of its own first row (also from `LAST_INSERT_ID()` afterwards), the
/// `Records:` info of a multi-row insert — text and prepared, and the rollups stay
/// exact.
#[test]
fn concurrent_inserts_merge_and_answer_each_client() {
    let db = "rollup_merged";
    let env = Env::builder(db)
        .schema(format!("{PLAYS} {SEED_ROWS}"))
        .rule("rollup.toml", rules())
        .migrate()
        .metrics()
        .start();
    run(Duration::from_secs(120), async {
        let tasks: Vec<_> = (0..32i64)
            .map(|w| {
                let url = env.url();
                tokio::spawn(async move {
                    let mut c = connect(&url).await;
                    let mut seen: Vec<Answer> = Vec::new();
                    let prepared = w % 2 == 1;
                    for i in 0..20i64 {
                        let user = w * 1000 + i;
                        let rows: u64 = if i % 3 == 0 { 2 } else { 1 };
                        let (track, country) = (w % 3, ["DE", "FR", "US"][(i % 3) as usize]);
                        if prepared {
                            let one = "INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), ?, ?, ?)";
                            let two = "INSERT INTO plays (created_at, track_id, user_id, country) VALUES (NOW(), ?, ?, ?), (NOW(), ?, ?, NULL)";
                            if rows == 2 {
                                c.exec_drop(two, (track, user, country, track, user + 500))
                                    .await
                                    .unwrap();
                            } else {
                                c.exec_drop(one, (track, user, country)).await.unwrap();
                            }
                        } else {
                            let second = if rows == 2 {
                                format!(", (NOW(), {track}, {}, NULL)", user + 500)
                            } else {
                                String::new()
                            };
                            c.query_drop(format!(
                                "INSERT INTO plays (created_at, track_id, user_id, country) \
                                 VALUES (NOW(), {track}, {user}, '{country}'){second}"
                            ))
                            .await
                            .unwrap();
                        }
                        let id = c.last_insert_id().unwrap_or(0);
                        let info = c.info().into_owned();
                        seen.push((user, c.affected_rows(), id, (!info.is_empty()).then_some(info)));
                        if i % 5 == 4 {
                            let last: Option<u64> =
                                c.query_first("SELECT LAST_INSERT_ID()").await.unwrap();
                            assert_eq!(last, Some(id), "LAST_INSERT_ID() of client {w}");
                        }
                    }
                    seen
                })
            })
            .collect();
        let mut answers: Vec<Answer> = Vec::new();
        for t in tasks {
            answers.extend(t.await.unwrap());
        }
        let stored: std::collections::HashMap<u64, i64> = env
            .backend_rows("SELECT id, user_id FROM {db}.plays WHERE user_id IS NOT NULL")
            .iter()
            .map(|r| {
                let v = |i: usize| r[i].as_deref().unwrap_or("0").parse::<i64>().unwrap();
                (v(0) as u64, v(1))
            })
            .collect();
        for (user, rows, id, info) in &answers {
            assert_eq!(
                stored.get(id),
                Some(user),
                "row {id} reported to user {user}"
            );
            if *rows == 2 {
                assert_eq!(
                    stored.get(&(id + 1)),
                    Some(&(user + 500)),
                    "second row of {user}"
                );
                assert_eq!(
                    info.as_deref(),
                    Some("Records: 2  Duplicates: 0  Warnings: 0")
                );
            } else {
                assert_eq!(info, &None, "info of user {user}");
            }
        }
        assert!(answers.iter().all(|(_, rows, ..)| *rows >= 1));
        let affected: Vec<u64> = answers.iter().map(|a| a.1).collect();
        let expected: Vec<u64> = (0..32)
            .flat_map(|_| (0..20).map(|i| if i % 3 == 0 { 2 } else { 1 }))
            .collect();
        assert_eq!(affected, expected, "affected rows");
    });
    let m = env.metrics();
    let merged = m["heatsink_rollup_merged_rows_total"];
    eprintln!(
        "merged writes {}, rows {merged}",
        m["heatsink_coalesced_writes_total"]
    );
    assert!(merged > 0, "no insert was merged");
    assert_exact(db, "merged inserts");
}

/// Reads of ranges ending at or after `NOW()` on a log written up to a few minutes
/// ago (and a few rows stamped in the future), through heatsink and straight to
/// MariaDB at the same fixed `NOW()`: the same rows. Through heatsink they take the
/// two-step form (the bounds computed first, then the read with literal bounds,
/// rounding the upper ones up past `NOW()`), counted in `heatsink_prelude_total`.
#[test]
fn reads_up_to_now_take_literal_bounds_and_match_the_log() {
    let db = "rollup_now";
    // ~3,000 plays over the last 12 days at ragged times, some exactly on an hour,
    // a few after NOW(); the fixed NOW() below is the time of the insert.
    let rows = "INSERT INTO plays (created_at, track_id, user_id, country) \
        SELECT IF(seq % 97 = 0, NOW() + INTERVAL (seq % 50) MINUTE, \
                  IF(seq % 61 = 0, DATE_FORMAT(NOW() - INTERVAL seq HOUR, '%Y-%m-%d %H:00:00'), \
                     NOW() - INTERVAL (seq * 347) SECOND)), \
               IF(seq % 11 = 0, NULL, 1 + seq % 3), IF(seq % 7 = 0, NULL, seq % 40), \
               ELT(1 + seq % 4, 'US', 'DE', NULL, 'FR') FROM seq_1_to_3000;";
    let env = Env::builder(db)
        .schema(format!("{PLAYS} {rows}"))
        .rule("rollup.toml", rules())
        .migrate()
        .metrics()
        .start();
    let now = env
        .backend_scalar(&format!(
            "SELECT UNIX_TIMESTAMP(MAX(created_at)) - 3000 FROM {db}.plays"
        ))
        .expect("a time");
    let shapes = [
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at BETWEEN NOW() - INTERVAL {m} MINUTE AND NOW() GROUP BY track_id",
        "SELECT track_id, country, COUNT(*) AS n, COUNT(user_id) AS u, SUM(user_id) AS s FROM plays \
         WHERE track_id IN (1, 2) AND created_at >= NOW() - INTERVAL {m} MINUTE GROUP BY track_id, country",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id = 1 AND created_at > NOW() - INTERVAL {m} MINUTE AND created_at < NOW()",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at BETWEEN NOW() - INTERVAL {m} MINUTE AND NOW() + INTERVAL 20 MINUTE GROUP BY track_id",
        "SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays WHERE track_id = 2 AND created_at >= CURDATE() - INTERVAL {m} MINUTE GROUP BY d",
        "SELECT country, COUNT(*) AS n FROM plays WHERE created_at < NOW() - INTERVAL {m} MINUTE GROUP BY country",
    ];
    let minutes = [
        1,
        17,
        59,
        61,
        95,
        300,
        1439,
        1441,
        2 * 1440 + 7,
        7 * 1440,
        7 * 1440 + 613,
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut through = env.proxied().await;
        let mut direct = env.direct().await;
        for tz in ["'+00:00'", "'+05:30'", "'-09:45'"] {
            for c in [&mut through, &mut direct] {
                c.query_drop(format!("SET time_zone = {tz}, timestamp = {now}"))
                    .await
                    .unwrap();
            }
            for shape in shapes {
                for m in minutes {
                    let sql = shape.replace("{m}", &m.to_string());
                    same_rows(
                        &mut through,
                        &mut direct,
                        &sql,
                        &format!("at time zone {tz}"),
                    )
                    .await;
                }
            }
        }
    });
    // Literal bounds that are rows' own times (on an hour and ragged): the rows on
    // a bound are counted or not as its strictness says.
    let times = env.backend_rows(&format!(
        "(SELECT created_at FROM {db}.plays WHERE created_at = DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00') \
          ORDER BY id LIMIT 3) UNION ALL \
         (SELECT created_at FROM {db}.plays WHERE SECOND(created_at) <> 0 ORDER BY id LIMIT 3)"
    ));
    let mut times: Vec<String> = times.into_iter().filter_map(|r| r[0].clone()).collect();
    times.sort();
    let literal_shapes = [
        "created_at BETWEEN '{a}' AND '{b}'",
        "created_at > '{a}' AND created_at <= '{b}'",
        "created_at >= '{a}' AND created_at < '{b}'",
        "created_at <= '{b}'",
        "created_at > '{a}'",
    ];
    let mut literal_reads = 0u64;
    rt.block_on(async {
        let mut through = env.proxied().await;
        let mut direct = env.direct().await;
        for (i, a) in times.iter().enumerate() {
            for b in &times[i + 1..] {
                for shape in literal_shapes {
                    let sql = format!(
                        "SELECT track_id, COUNT(*) AS n, SUM(user_id) AS s FROM plays WHERE {} GROUP BY track_id",
                        shape.replace("{a}", a).replace("{b}", b)
                    );
                    same_rows(&mut through, &mut direct, &sql, "").await;
                    literal_reads += 1;
                }
            }
        }
    });
    assert!(literal_reads >= 50, "{times:?}");
    let m = env.metrics();
    let literal = m
        .get("heatsink_prelude_total{outcome=\"literal\"}")
        .copied()
        .unwrap_or(0);
    let declined = m
        .get("heatsink_prelude_total{outcome=\"declined\"}")
        .copied()
        .unwrap_or(0);
    let reads = (3 * shapes.len() * minutes.len()) as u64 + literal_reads;
    assert_eq!(literal + declined, reads, "{m:?}");
    assert!(literal >= reads - 3 * minutes.len() as u64, "{m:?}");
}

/// The plays log of [`PLAYS`] with its [`rules`], for differential scripts: rows on
/// zero dates, on `9999-12-31` and on hour boundaries.
struct Reads;

impl common::differential::Kind for Reads {
    fn name(&self) -> &'static str {
        "rollupreads"
    }

    fn schema(&self) -> String {
        format!(
            "{PLAYS} {SEED_ROWS} SET SESSION sql_mode = ''; \
             INSERT INTO plays (created_at, track_id, user_id, country) VALUES \
             ('0000-00-00 00:00:00', 1, 1, 'US'), ('0000-00-00 00:00:00', 2, NULL, NULL), \
             ('2024-00-00 00:00:00', 1, 3, 'DE'), ('9999-12-31 23:59:59', 2, 4, 'US'), \
             ('2024-05-03 00:00:00', 2, 5, 'FR'), ('2024-05-00 10:00:00', 1, 6, 'US'); \
             INSERT INTO plays (created_at, track_id, user_id, country) \
             SELECT '2024-05-01' + INTERVAL (seq * 611) SECOND, seq % 50, seq % 7, \
                    ELT(1 + seq % 3, 'US', 'DE', NULL) FROM seq_1_to_3000;"
        )
    }

    fn rule_toml(&self) -> String {
        rules()
    }

    fn state_query(&self) -> String {
        "SELECT id, created_at, track_id, user_id, country FROM plays ORDER BY id".into()
    }

    fn statement(&self, _g: &mut common::differential::Gen) -> common::differential::Stmt {
        common::differential::Stmt::new()
    }
}

/// Runs each read of `reads` in both protocols after `setup`, through heatsink and
/// directly; panics with every difference.
fn reads_match(diff: &common::differential::Differential<'_>, setup: &[&str], reads: &[&str]) {
    use common::differential::Protocol;
    let mut script: Vec<(&str, Protocol)> = setup.iter().map(|s| (*s, Protocol::Text)).collect();
    for r in reads {
        script.push((r, Protocol::Text));
        script.push((r, Protocol::Binary));
    }
    let report = diff.run_script(&script);
    assert!(
        report.mismatches.is_empty(),
        "{} differences\n{}",
        report.mismatches.len(),
        report.details()
    );
}

/// Under NO_ZERO_DATE (TRADITIONAL includes it) a zero date or a number as a time
/// bound made the one-step form's boundaries NULL to `IS NULL` and not NULL to the
/// comparisons, so the rollup and the log both counted the range (2 vs 4); a bound
/// near 9999 overflowed `+ INTERVAL 1 HOUR` with warnings the log's read does not
/// give. Text reads now forward the statement when the bounds' values decline the
/// literal form; prepared reads with such bounds fall back.
#[test]
fn zero_dates_numbers_and_year_9999_as_bounds_match_the_log() {
    let diff = common::differential::Differential::start(&Reads);
    let reads = [
        "SELECT COUNT(*) AS n FROM plays WHERE created_at BETWEEN '0000-00-00' AND '2026-11-24'",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= 0",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at BETWEEN 0 AND NOW()",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) AND created_at > 20240502",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= '9999-12-31 23:59:59'",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= '9999-12-31 23:00:00'",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at BETWEEN '2024-05-02 10:30' AND '9999-12-31'",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at < '2024-00-00 10:00:00'",
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= '2024-02-30'",
        "SELECT country, COUNT(*) AS n FROM plays WHERE created_at >= '2024-05-02 10:30' GROUP BY country",
    ];
    for mode in ["TRADITIONAL", "NO_ZERO_DATE", "NO_ZERO_IN_DATE", ""] {
        reads_match(&diff, &[&format!("SET sql_mode = '{mode}'")], &reads);
    }
}

/// A dimension compared with a value of another kind: MariaDB answers `track_id =
/// 2.4` with the `track_id = 2` rows when it reads through the index; heatsink
/// answered from the rollup with none. Such reads go to the log.
#[test]
fn dimension_values_of_another_kind_match_the_log() {
    let diff = common::differential::Differential::start(&Reads);
    reads_match(
        &diff,
        &[],
        &[
            "SELECT COUNT(*) AS n FROM plays WHERE track_id = 2.4",
            "SELECT COUNT(*) AS n, SUM(user_id) AS s FROM plays WHERE track_id = 2.0 AND country = 'US'",
            "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (2.4, 3) GROUP BY track_id",
            "SELECT COUNT(*) AS n FROM plays WHERE track_id = '2'",
            "SELECT COUNT(*) AS n FROM plays WHERE country = 0",
            "SELECT COUNT(*) AS n FROM plays WHERE track_id = 2",
        ],
    );
}

/// Time series over zero-in-date rows (`2024-00-00`) under NO_ZERO_IN_DATE: the
/// groups are right but the outer `DATE_FORMAT(MIN(…))` labels the `2024-00` group
/// `0000-00`. Open (docs/design.md, rollup section).
/// Under NO_ZERO_IN_DATE `MIN` reads a zero-in-date time as the zero date: a
/// `DATE_FORMAT` series labelled the `2024-00-00` rows' group `0000-00`, and a `DATE`
/// series labelled a NULL group holding `2024-05-00` and a zero date `0000-00-00`.
/// Every series, in every mode, text and prepared, as the log's read.
#[test]
fn zero_in_date_groups_of_a_time_series_match_the_log() {
    let diff = common::differential::Differential::start(&Reads);
    let reads = [
        "SELECT DATE_FORMAT(created_at, '%Y-%m') AS m, COUNT(*) AS n FROM plays GROUP BY m",
        "SELECT DATE(created_at) AS d, COUNT(*) AS n FROM plays GROUP BY d",
        "SELECT DATE_FORMAT(created_at, '%W %Y') AS w, COUNT(*) AS n FROM plays WHERE track_id = 1 GROUP BY w",
        "SELECT track_id, DATE_FORMAT(created_at, '%Y-%m-%d') AS d, COUNT(*) AS n FROM plays \
         WHERE created_at < '2024-05-02' GROUP BY track_id, d",
        "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00') AS h, COUNT(*) AS n FROM plays \
         WHERE track_id IN (1, 2) GROUP BY h ORDER BY n DESC, h LIMIT 5",
    ];
    for mode in ["TRADITIONAL", "NO_ZERO_IN_DATE", "NO_ZERO_DATE", ""] {
        reads_match(&diff, &[&format!("SET sql_mode = '{mode}'")], &reads);
    }
}

/// An unaliased aggregate — `SELECT COUNT(*) FROM plays WHERE track_id = 2`, the
/// simplest read there is — is answered from the rollup, its column named as the
/// client spelt it (MariaDB keeps case and whitespace, leaves comments out); spellings
/// that share a fingerprint get their own names; an item with a comment goes to the
/// log. Text and prepared, rows and column definitions as directly.
#[test]
fn unaliased_aggregates_are_answered_from_the_rollup_as_spelt() {
    let diff = common::differential::Differential::start(&Reads);
    let rewritten = |outcome: &str| -> f64 {
        let body = common::http_get(diff.metrics_addr(), "/metrics").1;
        ["plays_hourly", "plays_daily"]
            .iter()
            .map(|rule| {
                common::sample(
                    &body,
                    &format!(
                        "heatsink_rule_statements_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}"
                    ),
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let (before, fallbacks) = (rewritten("rewritten"), rewritten("fallback"));
    let answered = [
        "SELECT COUNT(*) FROM plays WHERE track_id = 2",
        "SELECT COUNT( * ) FROM plays WHERE track_id = 3",
        "SELECT COUNT(\n  *) FROM plays WHERE track_id = 3",
        "SELECT count(*) FROM plays",
        "SELECT track_id, COUNT(*), SUM(user_id), COUNT(user_id) FROM plays WHERE track_id IN (1, 2) GROUP BY track_id",
        "SELECT COUNT(*) FROM plays p WHERE p.track_id = 4",
    ];
    let mut before = before;
    for read in answered {
        reads_match(&diff, &[], &[read]);
        let after = rewritten("rewritten");
        assert_eq!(
            after - before,
            2.0,
            "{read}: answered from a rollup, text and prepared"
        );
        before = after;
    }
    assert_eq!(rewritten("fallback"), fallbacks, "no read fell back");
    // With a time range: compared only (whether a text read takes literal bounds or
    // runs as sent depends on its bounds, see
    // `reads_up_to_now_take_literal_bounds_and_match_the_log`).
    reads_match(
        &diff,
        &[],
        &[
            "SELECT country, COUNT(*) AS n, SUM(user_id) FROM plays WHERE created_at >= '2024-05-02 10:30' GROUP BY country",
            "SELECT COUNT(*) FROM plays p WHERE p.track_id = 4 AND created_at < '2024-05-10'",
        ],
    );
    // A comment in the item: not part of MariaDB's name; the read goes to the log.
    reads_match(
        &diff,
        &[],
        &[
            "SELECT COUNT(/* all */ *) FROM plays WHERE track_id = 2",
            "SELECT COUNT(*) AS hs_agg0 FROM plays WHERE track_id = 2",
            "SELECT track_id, COUNT(*) FROM plays GROUP BY track_id ORDER BY hs_agg1 LIMIT 3",
        ],
    );
}

/// `EXTRACT` with a compound unit (`DAY_HOUR`, `HOUR_MINUTE`, `YEAR_MONTH`, …) is
/// not read by the parser (an interval's compound units are; `EXTRACT`'s are not):
/// on the rollups' log the statement runs as sent, counted as a fallback, with the
/// server's own answer, text and prepared.
#[test]
fn compound_unit_extracts_run_as_sent() {
    let diff = common::differential::Differential::start(&Reads);
    let fallbacks = || -> f64 {
        let body = common::http_get(diff.metrics_addr(), "/metrics").1;
        ["plays_hourly", "plays_daily"]
            .iter()
            .map(|rule| {
                common::sample(
                    &body,
                    &format!(
                        "heatsink_rule_statements_total{{rule=\"{rule}\",outcome=\"fallback\"}}"
                    ),
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let before = fallbacks();
    let reads = [
        "SELECT EXTRACT(DAY_HOUR FROM created_at) AS dh, COUNT(*) AS n FROM plays GROUP BY dh ORDER BY dh",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id = 1 AND EXTRACT(HOUR_MINUTE FROM created_at) >= 1030",
        "SELECT id, EXTRACT(YEAR_MONTH FROM created_at) AS ym, EXTRACT(DAY_MICROSECOND FROM created_at) AS dm \
         FROM plays WHERE id < 8 ORDER BY id",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at >= '2024-05-02' \
         AND EXTRACT(DAY_MINUTE FROM created_at) < 21000 GROUP BY track_id ORDER BY track_id",
    ];
    for mode in ["TRADITIONAL", ""] {
        reads_match(&diff, &[&format!("SET sql_mode = '{mode}'")], &reads);
    }
    // Every one ran as sent, text and prepared.
    let ran_as_sent = fallbacks() - before;
    assert_eq!(ran_as_sent, 2.0 * 2.0 * reads.len() as f64, "fallbacks");
}

/// A prepared read whose time bound is a parameter (`created_at >= ?`, `? - INTERVAL
/// 7 DAY`, with a compound unit too) is answered from the rollup when the value bound
/// at execute is a valid date and time of the years 1000–9998 (bound as DATETIME, or
/// as a `'YYYY-MM-DD[ HH:MM:SS[.f]]'` string); any other value — NULL, a number, a
/// zero or invalid date, another spelling, a year near 9999 — runs the client's own
/// statement on the server, counted as a fallback. Each statement is prepared once
/// and executed with every value in turn (types bound, then relying on the types
/// bound before), through heatsink and directly, under two sql_modes.
#[test]
fn prepared_reads_with_a_parameter_as_time_bound_match_the_log() {
    use common::differential::{items_of_prepare, items_of_results};
    use common::rawclient::{ConnectOpts, RawClient, RawParam};
    let diff = common::differential::Differential::start(&Reads);
    let outcome = |outcome: &str| -> f64 {
        let body = common::http_get(diff.metrics_addr(), "/metrics").1;
        ["plays_hourly", "plays_daily"]
            .iter()
            .map(|rule| {
                common::sample(
                    &body,
                    &format!(
                        "heatsink_rule_statements_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}"
                    ),
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let connect = |addr: std::net::SocketAddr, db: &str| {
        RawClient::connect(
            addr,
            &ConnectOpts::new(common::USER, common::PASSWORD).db(db),
        )
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    };
    let mut sides = [
        connect(diff.proxy.addr(), &diff.proxied_db),
        connect(mariadb().addr(), &diff.reference_db),
    ];
    let datetime = |y: u16, mo: u8, d: u8, h: u8, mi: u8| RawParam::Typed {
        ty: 0x0c,
        unsigned: false,
        value: [&[7u8][..], &y.to_le_bytes()[..], &[mo, d, h, mi, 0][..]].concat(),
    };
    // (value, answered from the rollup)
    let values = [
        (RawParam::str("2024-05-02 10:30:00"), true),
        (datetime(2024, 5, 2, 10, 30), true),
        (RawParam::str("2024-05-02"), true),
        (RawParam::str("2024-05-01 23:59:59.5"), true),
        (RawParam::str("0000-00-00"), false),
        (RawParam::Null, false),
        (RawParam::Int(20240502), false),
        (RawParam::str("2024-02-30"), false),
        (RawParam::str("9999-12-31 23:59:59"), false),
        (RawParam::str("2024-05-02 10:30"), false),
        (RawParam::str(" 2024-05-02"), false),
        (
            RawParam::Typed {
                ty: 0x0c,
                unsigned: false,
                value: vec![0],
            },
            false,
        ),
        (datetime(2024, 2, 30, 0, 0), false),
    ];
    let reads: [&str; 6] = [
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= ?",
        "SELECT COUNT(*) AS n, SUM(user_id) AS s FROM plays WHERE created_at >= ? - INTERVAL 7 DAY \
             AND created_at < '2024-05-10'",
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) \
             AND created_at BETWEEN ? AND ? + INTERVAL '1 12' DAY_HOUR GROUP BY track_id",
        "SELECT country, COUNT(*) AS n FROM plays WHERE created_at < ? GROUP BY country ORDER BY n DESC, country",
        "SELECT COUNT(*) AS n FROM plays WHERE track_id = 1 AND ? <= created_at",
        // More groups than DAY_HOUR has: the bound is NULL, on both sides.
        "SELECT COUNT(*) AS n FROM plays WHERE created_at >= ? - INTERVAL '1:2:3' DAY_HOUR",
    ];
    let (rewritten, fallbacks) = (outcome("rewritten"), outcome("fallback"));
    let mut differences = Vec::new();
    for mode in ["TRADITIONAL", ""] {
        for c in sides.iter_mut() {
            c.query(format!("SET sql_mode = '{mode}'"))
                .expect("sql_mode");
        }
        for sql in reads {
            let params = sql.matches('?').count();
            let mut ids = [0u32; 2];
            let mut prepared = Vec::new();
            for (k, c) in sides.iter_mut().enumerate() {
                let (id, packets) = c.prepare(sql).expect("prepare");
                ids[k] = id;
                prepared.push(items_of_prepare(&packets, c.deprecate_eof()));
            }
            if prepared[0] != prepared[1] {
                differences.push(format!(
                    "{sql}: prepare\n  heatsink {:?}\n  direct   {:?}",
                    prepared[0], prepared[1]
                ));
            }
            for (value, _) in &values {
                let vs = vec![value.clone(); params];
                for bound in [true, false] {
                    let mut answers = Vec::new();
                    for (k, c) in sides.iter_mut().enumerate() {
                        let packets = if bound {
                            c.execute(ids[k], &vs)
                        } else {
                            c.execute_with(ids[k], &vs, false, 0)
                        }
                        .expect("execute");
                        answers.push(items_of_results(&packets, c.deprecate_eof()));
                    }
                    if answers[0] != answers[1] {
                        differences.push(format!(
                            "{mode:?} {sql} with {value:?} (types bound: {bound})\n  heatsink {:?}\n  direct   {:?}",
                            answers[0], answers[1]
                        ));
                    }
                }
            }
            for (k, c) in sides.iter_mut().enumerate() {
                c.close_stmt(ids[k]).expect("close");
            }
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    let declined = values.iter().filter(|(_, ok)| !ok).count() as f64;
    // Every execute of a declined value ran the statement as sent; the others were
    // answered from the rollups.
    assert_eq!(
        outcome("fallback") - fallbacks,
        declined * 2.0 * reads.len() as f64 * 2.0,
        "fallbacks"
    );
    assert!(outcome("rewritten") > rewritten, "rewritten");
}

/// A log on which MariaDB reads one grouped read through `KEY (track_id)` and
/// another through `KEY (created_at)` and a temporary table: 6,000 plays over the
/// last 30 days, a third of them of track 1, the rest spread over 199 tracks (with a
/// tenth, MariaDB 10.11 filters the read of one index by the other's row ids,
/// `range|filter`: the flags still follow the index read, but the table form of
/// `EXPLAIN` that [`plan_of`] reads names both keys).
const PLAN_ROWS: &str = "INSERT INTO plays (created_at, track_id, user_id, country) \
     SELECT NOW() - INTERVAL FLOOR((6000 - seq) * (30 * 86400) / 6000) SECOND, \
            IF(seq % 3 = 0, 1, 2 + (seq * 7919) % 199), seq % 1000, ELT(1 + seq % 5, 'US', 'DE', 'FR', 'BR', 'JP') \
     FROM seq_1_to_6000; ANALYZE TABLE plays;";

/// The index MariaDB reads `plays` through for `sql` (EXPLAIN's `key`), and whether
/// it groups through a temporary table.
fn plan_of(db: &str, sql: &str) -> (Option<String>, bool) {
    let sql = sql.replace("FROM plays", &format!("FROM {db}.plays"));
    let rows = mariadb().query_strings(&format!("EXPLAIN {sql}"));
    assert_eq!(rows.len(), 1, "EXPLAIN {sql}: {rows:?}");
    let extra = rows[0][9].clone().unwrap_or_default();
    (rows[0][5].clone(), extra.contains("Using temporary"))
}

/// Grouped reads whose column flags follow the plan MariaDB picks for the log's
/// read — `KEY (track_id)` in index order (key flags on `track_id`, `BINARY` on the
/// count), the same then sorted by the count through a temporary table (no key
/// flags, no `BINARY`), `KEY (created_at)` and a temporary table (the group flag) —
/// answer with the server's own flags (`exact_flags`, the default): full column
/// definitions and rows equal to MariaDB's, text and prepared (the prepare's
/// definitions too, and one prepared statement whose executes flip between plans),
/// all answered from the rollups. With `exact_flags = false` the prediction (a
/// temporary table) stands: the rows are the same, the flags of the index-order
/// read are not.
#[test]
fn column_flags_of_grouped_reads_follow_the_servers_plan() {
    let db = "rollup_plan_flags";
    let env = Env::builder(db)
        .schema(format!("{PLAYS} {PLAN_ROWS}"))
        .rule("rollup.toml", rules())
        .migrate()
        .metrics()
        .start();
    let by_track = "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2) \
                    AND created_at >= NOW() - INTERVAL 7 DAY GROUP BY track_id";
    let by_track_sorted = format!("{by_track} ORDER BY n DESC");
    let by_time = "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2, 3, 4, 5, 6, 7, 8) \
                   AND created_at >= NOW() - INTERVAL 1 DAY GROUP BY track_id ORDER BY n DESC, track_id";
    let window = "SELECT p.track_id, COUNT(*) AS n, COUNT(user_id) AS u FROM plays p WHERE p.track_id IN (1, 9) \
                  AND p.created_at BETWEEN NOW() - INTERVAL 2 DAY AND NOW() - INTERVAL 1 DAY GROUP BY p.track_id";
    // The data give both plans (else the test would not test them).
    assert_eq!(plan_of(db, by_track), (Some("track_id".into()), false));
    assert_eq!(
        plan_of(db, &by_track_sorted),
        (Some("track_id".into()), true)
    );
    assert_eq!(plan_of(db, by_time), (Some("created_at".into()), true));
    assert_eq!(plan_of(db, window), (Some("created_at".into()), true));
    let fallbacks = || -> f64 {
        let body = common::http_get(env.metrics_addr(), "/metrics").1;
        ["plays_hourly", "plays_daily"]
            .iter()
            .map(|rule| {
                common::sample(
                    &body,
                    &format!(
                        "heatsink_rule_statements_total{{rule=\"{rule}\",outcome=\"fallback\"}}"
                    ),
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let before = fallbacks();
    let direct_url = mariadb().url(db);
    run(Duration::from_secs(120), async {
        use common::client::{run_exec, run_text, Meta};
        let mut via = connect(&env.url()).await;
        let mut direct = connect(&direct_url).await;
        for sql in [by_track, &by_track_sorted, by_time, window] {
            let a = run_text(&mut via, sql).await.expect("through heatsink");
            let b = run_text(&mut direct, sql).await.expect("directly");
            assert!(!b.rows.is_empty(), "{sql}");
            assert_eq!(a, b, "text: {sql}");
            let a = run_exec(&mut via, sql, ()).await.expect("through heatsink");
            let b = run_exec(&mut direct, sql, ()).await.expect("directly");
            assert_eq!(a, b, "prepared: {sql}");
        }
        // One prepared statement, its time bound a parameter: the executes' plans
        // differ, the prepare's definitions do not depend on the plan.
        let sql =
            "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2, 3, 4, 5, 6, 7, 8) \
                   AND created_at >= ? GROUP BY track_id";
        let (week, day): (String, String) = via
            .query_first(
                "SELECT CAST(NOW() - INTERVAL 7 DAY AS CHAR), CAST(NOW() - INTERVAL 1 DAY AS CHAR)",
            )
            .await
            .expect("bounds")
            .expect("a row");
        let stmts = [
            via.prep(sql).await.expect("prepare through heatsink"),
            direct.prep(sql).await.expect("prepare directly"),
        ];
        let defs: Vec<Vec<Meta>> = stmts
            .iter()
            .map(|s| s.columns().iter().map(Meta::of).collect())
            .collect();
        assert_eq!(defs[0], defs[1], "prepare: {sql}");
        let mut flags = Vec::new();
        for bound in [&week, &day, &week] {
            let a = run_exec(&mut via, sql, (bound.as_str(),))
                .await
                .expect("via");
            let b = run_exec(&mut direct, sql, (bound.as_str(),))
                .await
                .expect("direct");
            assert_eq!(a, b, "prepared with {bound}: {sql}");
            flags.push(b.columns[0].flags);
        }
        assert_ne!(flags[0], flags[1], "the executes' plans differ");
        // An empty range (the lower bound after the upper): MariaDB does not group
        // ("Impossible WHERE") and gives the table's flags.
        let sql =
            "SELECT track_id, COUNT(*) AS n FROM plays WHERE track_id IN (1, 2, 3, 4, 5, 6, 7, 8) \
                   AND created_at BETWEEN ? AND ? GROUP BY track_id";
        for bounds in [(&week, &day), (&day, &week)] {
            let a = run_exec(&mut via, sql, (bounds.0.as_str(), bounds.1.as_str()))
                .await
                .expect("via");
            let b = run_exec(&mut direct, sql, (bounds.0.as_str(), bounds.1.as_str()))
                .await
                .expect("direct");
            assert_eq!(a, b, "prepared with {bounds:?}: {sql}");
        }
    });
    // Every read was answered from the rollups but the empty range's, whose plan
    // (an Impossible WHERE) ran it as sent, listed as such (`SHOW FALLBACKS`, whose
    // first sighting is logged).
    assert_eq!(fallbacks(), before + 1.0, "fallbacks");
    let log = env.proxy.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("fell back for the first time")
                && l.contains("did not tell its column flags")
                && l.contains("BETWEEN ? AND ?")),
        "{log}"
    );

    // The opt-out keeps the prediction.
    let db = "rollup_plan_predicted";
    let predicted = Rule::rollup(
        "plays_hourly",
        "plays",
        "plays_by_track_hour",
        "created_at",
        "hour",
    )
    .dimensions(&["track_id"])
    .set("exact_flags", "false");
    let env = Env::builder(db)
        .schema(format!("{PLAYS} {PLAN_ROWS}"))
        .rule("rollup.toml", predicted.toml())
        .migrate()
        .start();
    let direct_url = mariadb().url(db);
    run(Duration::from_secs(60), async {
        use common::client::run_text;
        let mut via = connect(&env.url()).await;
        let mut direct = connect(&direct_url).await;
        let a = run_text(&mut via, by_track)
            .await
            .expect("through heatsink");
        let b = run_text(&mut direct, by_track).await.expect("directly");
        assert_eq!(a.rows, b.rows, "{by_track}");
        assert_ne!(a.columns, b.columns, "{by_track}: the predicted flags");
        let a = run_text(&mut via, by_time).await.expect("through heatsink");
        let b = run_text(&mut direct, by_time).await.expect("directly");
        assert_eq!(a, b, "{by_time}: predicted as the server plans it");
    });
}
