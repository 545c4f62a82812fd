//! `SHOW REFUSALS` / `SHOW FALLBACKS` on the admin port, end to end against the real
//! MariaDB: refused statements (a counter's), statements that fall back (a rollup's
//! reads), shadow mode, the bounded tables' eviction, `RESET …`, the totals on
//! `/metrics` and the first-seen log lines (once per shape, capped per minute).
//!
//! Each test has its own database (`rf_<name>`), rules directory and proxy (with
//! `--admin` and `--metrics`).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::client::{assert_refused_by, connect, run, run_text};
use common::fixture::{counter_rule, create_counter_db, Env, Rule};
use common::mariadb;
use common::sample;
use mysql_async::prelude::*;
use mysql_async::{Conn, Row, Value};

/// Time limit of each async test body.
const LIMIT: Duration = Duration::from_secs(120);
const COUNTER: &str = "page_hits";
const ROLLUP: &str = "plays_daily";
const ADMIN_PW: &str = "adm-pw";

const PLAYS: &str =
    "CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME DEFAULT NULL, \
     track_id INT DEFAULT NULL, user_id INT DEFAULT NULL, country VARCHAR(255) DEFAULT NULL, \
     KEY (track_id), KEY (created_at)); \
     INSERT INTO plays (created_at, track_id, user_id, country) VALUES \
     ('2024-03-01 10:00:00', 1, 7, 'US'), ('2024-03-01 11:00:00', 2, 7, 'DE'), \
     ('2024-03-02 10:00:00', 2, 8, NULL), ('2024-03-03 09:00:00', 3, NULL, 'US');";

/// The log line of a refused shape's first sighting.
const REFUSED_LINE: &str = "statement shape refused for the first time";
/// … of a shape a rule in shadow mode would refuse.
const SHADOW_LINE: &str = "shadow: statement shape the rule would refuse";
/// … of a fallback shape.
const FALLBACK_LINE: &str = "statement shape fell back for the first time";

fn admin_url(addr: SocketAddr) -> String {
    format!("mysql://admin:{ADMIN_PW}@{addr}/?prefer_socket=false")
}

/// Column names and rows (as text) of an admin command.
async fn admin_query(conn: &mut Conn, sql: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut result = conn
        .query_iter(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let columns: Vec<String> = result
        .columns()
        .map(|cols| cols.iter().map(|c| c.name_str().into_owned()).collect())
        .unwrap_or_default();
    let rows: Vec<Row> = result.collect().await.expect("rows");
    let rows = rows
        .into_iter()
        .map(|r| {
            r.unwrap()
                .into_iter()
                .map(|v| match v {
                    Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .collect();
    (columns, rows)
}

/// The `columns` of `rule`'s row of `SHOW RULE STATS`.
async fn rule_stats(admin: &mut Conn, rule: &str, columns: &[&str]) -> Vec<String> {
    let (cols, stats) = admin_query(admin, "SHOW RULE STATS").await;
    let row = stats
        .iter()
        .find(|r| r[0] == rule)
        .unwrap_or_else(|| panic!("{rule}: {stats:?}"));
    columns
        .iter()
        .map(|name| {
            let i = cols.iter().position(|c| c == name);
            row[i.unwrap_or_else(|| panic!("{name}: {cols:?}"))].clone()
        })
        .collect()
}

/// One row of `SHOW REFUSALS` / `SHOW FALLBACKS`, by column name.
#[derive(Debug, Clone)]
struct Shape {
    rule: String,
    mode: Option<String>,
    /// The refusal's class (refusals only).
    class: Option<String>,
    reason: String,
    count: u64,
    first_seen: String,
    last_seen: String,
    fingerprint: String,
    example: String,
}

async fn shapes(admin: &mut Conn, command: &str) -> Vec<Shape> {
    let (cols, rows) = admin_query(admin, command).await;
    let refusals = command.ends_with("REFUSALS");
    let mut want = vec!["rule"];
    if refusals {
        want.extend(["mode", "class"]);
    }
    want.extend([
        "reason",
        "count",
        "first_seen",
        "last_seen",
        "fingerprint",
        "example",
    ]);
    assert_eq!(cols, want, "{command}");
    let at = |name: &str| cols.iter().position(|c| c == name).unwrap();
    let shapes: Vec<Shape> = rows
        .iter()
        .map(|r| Shape {
            rule: r[at("rule")].clone(),
            mode: refusals.then(|| r[at("mode")].clone()),
            class: refusals.then(|| r[at("class")].clone()),
            reason: r[at("reason")].clone(),
            count: r[at("count")].parse().expect("a count"),
            first_seen: r[at("first_seen")].clone(),
            last_seen: r[at("last_seen")].clone(),
            fingerprint: r[at("fingerprint")].clone(),
            example: r[at("example")].clone(),
        })
        .collect();
    for s in &shapes {
        // UTC `YYYY-MM-DD HH:MM:SS`, in order; a 16-digit hex fingerprint.
        for t in [&s.first_seen, &s.last_seen] {
            assert_eq!(t.len(), 19, "{s:?}");
            assert!(t.starts_with("20") && &t[10..11] == " ", "{s:?}");
        }
        assert!(s.first_seen <= s.last_seen, "{s:?}");
        assert_eq!(s.fingerprint.len(), 16, "{s:?}");
        assert!(
            s.fingerprint.bytes().all(|b| b.is_ascii_hexdigit()),
            "{s:?}"
        );
    }
    // Most frequent first.
    assert!(
        shapes.windows(2).all(|w| w[0].count >= w[1].count),
        "{shapes:?}"
    );
    shapes
}

/// The proxy's log lines holding every one of `parts`.
fn log_lines(env: &Env, parts: &[&str]) -> usize {
    env.proxy
        .log_text()
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

/// One metric series (labels included), 0 when absent.
fn metric(env: &Env, series: &str) -> f64 {
    let (status, body) = common::http_get(env.metrics_addr(), "/metrics");
    assert_eq!(status, 200, "{body}");
    sample(&body, series).unwrap_or(0.0)
}

/// The counter on `hits` and the rollup on `plays`, migrated, with the metrics and
/// admin ports.
fn counter_and_rollup(db: &str) -> Env {
    let rollup = Rule::rollup(ROLLUP, "plays", "plays_by_country_day", "created_at", "day")
        .dimensions(&["track_id", "country"])
        .measures(&["count(*)", "count(user_id)", "sum(user_id)"]);
    Env::builder(db)
        .schema(format!(
            "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0); \
             INSERT INTO hits VALUES ('home', 10), ('about', 3); {PLAYS}"
        ))
        .rule("hits.toml", counter_rule(COUNTER))
        .rule("plays.toml", rollup.toml())
        .migrate()
        .metrics()
        .admin(ADMIN_PW)
        .start()
}

/// The reason in a refusal's error message (`heatsink rule '<rule>': <reason>`).
fn reason_of(e: &mysql_async::ServerError, rule: &str) -> String {
    e.message
        .strip_prefix(&format!("heatsink rule '{rule}': "))
        .unwrap_or_else(|| panic!("{e:?}"))
        .to_string()
}

#[test]
fn refusals_and_fallbacks_by_statement_shape() {
    let db = "rf_shapes";
    let env = counter_and_rollup(db);
    run(LIMIT, async {
        let started = Instant::now();
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;

        // Refused: one shape three times (other values), two more shapes.
        let mut reasons = Vec::new();
        for (k, slug) in [(2, "secret-a"), (3, "secret-b"), (4, "secret-c")] {
            let sql = format!("UPDATE hits SET cnt = cnt * {k} WHERE slug = '{slug}'");
            reasons.push(reason_of(
                &assert_refused_by(&mut p, &sql, COUNTER).await,
                COUNTER,
            ));
        }
        assert!(reasons.iter().all(|r| *r == reasons[0]), "{reasons:?}");
        let delete = reason_of(
            &assert_refused_by(&mut p, "DELETE FROM hits WHERE cnt > 12345", COUNTER).await,
            COUNTER,
        );
        // Prepared: refused at COM_STMT_PREPARE, its `?` stay.
        match p.prep("UPDATE hits SET cnt = cnt * ? WHERE slug = ?").await {
            Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1105, "{e:?}"),
            other => panic!("expected a refusal, got {other:?}"),
        }

        // Fallbacks: answered from the log, as MariaDB answers them directly.
        let fallbacks = [
            "SELECT track_id, AVG(user_id) AS a FROM plays WHERE track_id > 1 GROUP BY track_id ORDER BY track_id",
            "SELECT track_id, AVG(user_id) AS a FROM plays WHERE track_id > 2 GROUP BY track_id ORDER BY track_id",
            "SELECT user_id, COUNT(*) AS n FROM plays GROUP BY user_id ORDER BY user_id",
        ];
        for sql in fallbacks {
            let proxied = run_text(&mut p, sql).await.unwrap();
            let direct = run_text(&mut d, sql).await.unwrap();
            assert_eq!(proxied, direct, "{sql}");
        }
        // A text read the rollup plans in two steps, whose bound the server reads as
        // an invalid date: the second step is not exact, the read goes to the log.
        let declined = "SELECT COUNT(*) AS n FROM plays WHERE created_at >= '2024-02-30'";
        let proxied = run_text(&mut p, declined).await.unwrap();
        let direct = run_text(&mut d, declined).await.unwrap();
        assert_eq!(proxied, direct, "{declined}");

        // SHOW REFUSALS: one row per shape, values masked.
        let refusals = shapes(&mut admin, "SHOW REFUSALS").await;
        assert_eq!(refusals.len(), 3, "{refusals:?}");
        let top = &refusals[0];
        assert_eq!(
            (top.rule.as_str(), top.mode.as_deref(), top.count),
            (COUNTER, Some("on"), 3)
        );
        assert_eq!(top.reason, reasons[0]);
        assert_eq!(top.example, "UPDATE hits SET cnt = cnt * ? WHERE slug = ?");
        // Each refusal is of a statement shape the counter cannot rewrite, and the
        // metric counts them by that class.
        assert!(
            refusals.iter().all(|s| s.class.as_deref() == Some("shape")),
            "{refusals:?}"
        );
        let refused: u64 = refusals.iter().map(|s| s.count).sum();
        assert_eq!(
            metric(&env, "heatsink_refusals_total{class=\"shape\"}"),
            refused as f64
        );
        assert_eq!(
            metric(&env, "heatsink_refusals_total{class=\"session\"}"),
            0.0
        );
        let del = refusals
            .iter()
            .find(|s| s.example.starts_with("DELETE"))
            .expect("the DELETE");
        assert_eq!((del.count, del.reason.as_str()), (1, delete.as_str()));
        assert_eq!(del.example, "DELETE FROM hits WHERE cnt > ?");
        // The prepared statement is a shape of its own (parameters, not literals),
        // though its example reads the same.
        let prepared = refusals
            .iter()
            .find(|s| s.example == top.example && s.fingerprint != top.fingerprint)
            .expect("the prepared statement");
        assert_eq!(prepared.count, 1);
        let all = format!("{refusals:?}");
        assert!(!all.contains("secret") && !all.contains("12345"), "{all}");

        // SHOW FALLBACKS.
        let fell = shapes(&mut admin, "SHOW FALLBACKS").await;
        assert_eq!(fell.len(), 3, "{fell:?}");
        assert_eq!((fell[0].rule.as_str(), fell[0].count), (ROLLUP, 2));
        assert_eq!(
            fell[0].example,
            "SELECT track_id, AVG(user_id) AS a FROM plays WHERE track_id > ? GROUP BY track_id ORDER BY track_id"
        );
        assert!(fell[0].reason.contains("cannot answer"), "{fell:?}");
        assert!(fell[1..].iter().all(|s| s.count == 1), "{fell:?}");
        let two_step = fell
            .iter()
            .find(|s| s.example == "SELECT COUNT(*) AS n FROM plays WHERE created_at >= ?")
            .expect("the declined two-step read");
        assert!(
            two_step.reason.contains("not exact in the one-step form"),
            "{two_step:?}"
        );

        // SHOW RULE STATS counts the same statements.
        let (cols, stats) = admin_query(&mut admin, "SHOW RULE STATS").await;
        let col = |name: &str| cols.iter().position(|c| c == name).unwrap();
        let row = |rule: &str| stats.iter().find(|r| r[0] == rule).unwrap().clone();
        assert_eq!(row(COUNTER)[col("rejected")], "5");
        assert_eq!(row(ROLLUP)[col("fallbacks")], "4");

        // One log line per shape, naming rule, reason and example; no value.
        for s in &refusals {
            assert_eq!(
                log_lines(&env, &[REFUSED_LINE, &s.fingerprint, &s.example, COUNTER]),
                1,
                "{s:?}\n{}",
                env.tail()
            );
        }
        assert_eq!(log_lines(&env, &[REFUSED_LINE, &reasons[0]]), 2);
        for s in &fell {
            assert_eq!(
                log_lines(&env, &[FALLBACK_LINE, &s.fingerprint, ROLLUP]),
                1,
                "{}",
                env.tail()
            );
        }
        let log = env.proxy.log_text();
        for value in ["secret", "12345", "2024-02-30"] {
            assert!(!log.contains(value), "{value}: {log}");
        }
        assert!(!format!("{fell:?}").contains("2024-02-30"), "{fell:?}");

        // /metrics: totals per table only.
        assert_eq!(
            metric(&env, "heatsink_shape_statements_total{table=\"refusals\"}"),
            5.0
        );
        assert_eq!(
            metric(&env, "heatsink_shape_statements_total{table=\"fallbacks\"}"),
            4.0
        );
        assert_eq!(metric(&env, "heatsink_shapes{table=\"refusals\"}"), 3.0);
        assert_eq!(metric(&env, "heatsink_shapes{table=\"fallbacks\"}"), 3.0);
        assert_eq!(
            metric(&env, "heatsink_shapes_evicted_total{table=\"refusals\"}"),
            0.0
        );
        let (_, body) = common::http_get(env.metrics_addr(), "/metrics");
        assert!(!body.contains(&top.fingerprint), "{body}");

        // Seen again: counted, not logged again.
        assert_refused_by(
            &mut p,
            "UPDATE hits SET cnt = cnt * 9 WHERE slug = 'home'",
            COUNTER,
        )
        .await;
        let again = shapes(&mut admin, "SHOW REFUSALS").await;
        assert_eq!(
            (again[0].count, &again[0].fingerprint),
            (4, &top.fingerprint)
        );
        assert_eq!(again[0].first_seen, top.first_seen);
        assert_eq!(log_lines(&env, &[REFUSED_LINE, &top.fingerprint]), 1);

        // RESET REFUSALS empties that table only.
        admin.query_drop("reset refusals;").await.unwrap();
        assert_eq!(admin.info(), "refusals: 3 shapes cleared");
        assert!(shapes(&mut admin, "SHOW REFUSALS").await.is_empty());
        assert_eq!(shapes(&mut admin, "SHOW FALLBACKS").await.len(), 3);
        assert_refused_by(
            &mut p,
            "UPDATE hits SET cnt = cnt * 5 WHERE slug = 'home'",
            COUNTER,
        )
        .await;
        let after = shapes(&mut admin, "SHOW REFUSALS").await;
        assert_eq!(after.len(), 1);
        assert_eq!(
            (after[0].count, &after[0].fingerprint),
            (1, &top.fingerprint)
        );
        assert_eq!(log_lines(&env, &[REFUSED_LINE, &top.fingerprint]), 1);
        admin.query_drop("RESET FALLBACKS").await.unwrap();
        assert_eq!(admin.info(), "fallbacks: 3 shapes cleared");
        assert!(shapes(&mut admin, "SHOW FALLBACKS").await.is_empty());

        // A flood of distinct shapes: at most 20 first-seen lines a minute in all
        // (6 were written above); the rest are held back and counted.
        for i in 0..25 {
            assert_refused_by(
                &mut p,
                &format!("UPDATE hits AS h{i} SET cnt = cnt * 2 WHERE slug = 'home'"),
                COUNTER,
            )
            .await;
        }
        assert_eq!(shapes(&mut admin, "SHOW REFUSALS").await.len(), 26);
        let written = log_lines(&env, &["for the first time"]);
        let held_back = metric(&env, "heatsink_shape_log_lines_held_back_total") as usize;
        assert_eq!(written + held_back, 31, "{}", env.tail());
        if started.elapsed() < Duration::from_secs(55) {
            assert_eq!((written, held_back), (20, 11), "{}", env.tail());
        }
        // Statements of other tables are in neither table.
        p.query_drop("SELECT 1").await.unwrap();
        assert_eq!(
            metric(&env, "heatsink_shape_statements_total{table=\"refusals\"}"),
            32.0
        );
    });
}

#[test]
fn shadow_refusals_and_eviction_at_a_small_maximum() {
    let db = "rf_shadow";
    create_counter_db(db, "", "('home', 10), ('about', 3)");
    let shadow = Rule::counter(COUNTER, "hits")
        .slots(4)
        .set("mode", "\"shadow\"");
    let env = Env::builder(db)
        .rule("hits.toml", shadow.toml())
        .metrics()
        .admin(ADMIN_PW)
        .arg("--shape-table-size")
        .arg("2")
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let a = "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'";
        let b = "DELETE FROM hits WHERE cnt > 1000000";
        let c = "UPDATE hits SET cnt = cnt + cnt WHERE slug = 'about'";
        // Shadow mode: the statements run unchanged, as they do directly.
        for sql in [a, b, a, c] {
            let proxied = run_text(&mut p, sql).await.unwrap();
            let direct = run_text(&mut d, sql).await.unwrap();
            assert_eq!(proxied, direct, "{sql}");
        }
        // Two shapes kept: `b`, the least recently seen, was evicted.
        let rows = shapes(&mut admin, "SHOW REFUSALS").await;
        let got: Vec<(&str, &str, u64)> = rows
            .iter()
            .map(|s| (s.example.as_str(), s.mode.as_deref().unwrap(), s.count))
            .collect();
        assert_eq!(
            got,
            [
                ("UPDATE hits SET cnt = cnt * ? WHERE slug = ?", "shadow", 2),
                (
                    "UPDATE hits SET cnt = cnt + cnt WHERE slug = ?",
                    "shadow",
                    1
                )
            ]
        );
        assert!(rows
            .iter()
            .all(|s| s.rule == COUNTER && !s.reason.is_empty()));
        assert_eq!(
            metric(&env, "heatsink_shapes_evicted_total{table=\"refusals\"}"),
            1.0
        );
        // `b` again: it comes back (counted afresh) and evicts `a`, now the least
        // recently seen.
        run_text(&mut p, b).await.unwrap();
        let rows = shapes(&mut admin, "SHOW REFUSALS").await;
        let got: Vec<(&str, u64)> = rows.iter().map(|s| (s.example.as_str(), s.count)).collect();
        assert_eq!(
            got,
            [
                ("DELETE FROM hits WHERE cnt > ?", 1),
                ("UPDATE hits SET cnt = cnt + cnt WHERE slug = ?", 1)
            ]
        );
        assert_eq!(
            metric(&env, "heatsink_shapes_evicted_total{table=\"refusals\"}"),
            2.0
        );
        assert_eq!(metric(&env, "heatsink_shapes{table=\"refusals\"}"), 2.0);
        // Three shapes, three lines: `b` was not logged again.
        assert_eq!(log_lines(&env, &[SHADOW_LINE]), 3, "{}", env.tail());
        assert_eq!(
            log_lines(&env, &[SHADOW_LINE, "DELETE FROM hits WHERE cnt > ?"]),
            1
        );
        assert_eq!(log_lines(&env, &[REFUSED_LINE]), 0);
        let (cols, stats) = admin_query(&mut admin, "SHOW RULE STATS").await;
        let col = cols.iter().position(|c| c == "shadow_rejects").unwrap();
        assert_eq!(stats[0][col], "5");
    });
}

/// The example is read as the session reads the statement: under its `sql_mode`
/// (`'x\'` is a whole string under NO_BACKSLASH_ESCAPES, so what follows is no
/// value to show), and not at all in a character set the lexer cannot read.
#[test]
fn examples_follow_the_sessions_sql_mode_and_character_set() {
    let db = "rf_modes";
    create_counter_db(db, "", "('home', 10), ('about', 3)");
    let env = Env::builder(db)
        .rule("hits.toml", counter_rule(COUNTER))
        .metrics()
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let mut p = env.proxied().await;
        p.query_drop("SET sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
            .await
            .unwrap();
        assert_refused_by(
            &mut p,
            "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'x\\' OR slug = 'secret-nbe'",
            COUNTER,
        )
        .await;
        let mut g = env.proxied().await;
        g.query_drop("SET NAMES gbk").await.unwrap();
        let gbk = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'secret-gbk'";
        let e = assert_refused_by(&mut g, gbk, COUNTER).await;
        assert!(e.message.contains("gbk"), "{e:?}");
        let rows = shapes(&mut admin, "SHOW REFUSALS").await;
        // The gbk connection's refusal is the session's character set's; the other
        // is the statement's shape.
        let mut classes: Vec<(&str, &str)> = rows
            .iter()
            .map(|s| (s.class.as_deref().unwrap_or(""), &s.example[..1]))
            .collect();
        classes.sort();
        assert_eq!(classes, [("session", "<"), ("shape", "U")], "{rows:?}");
        let mut examples: Vec<&str> = rows.iter().map(|s| s.example.as_str()).collect();
        examples.sort();
        assert_eq!(
            examples,
            [
                format!(
                    "<{} bytes in a character set heatsink cannot read>",
                    gbk.len()
                )
                .as_str(),
                "UPDATE hits SET cnt = cnt * ? WHERE slug = ? OR slug = ?",
            ]
        );
        let log = env.proxy.log_text();
        assert!(!format!("{rows:?}").contains("secret"), "{rows:?}");
        assert!(!log.contains("secret"), "{log}");
        assert_eq!(log_lines(&env, &[REFUSED_LINE]), 2, "{}", env.tail());
    });
}

/// The error of a prepared statement's execute, which must be a refusal by `rule`.
async fn assert_execute_refused(
    conn: &mut Conn,
    stmt: &mysql_async::Statement,
    params: mysql_async::Params,
    rule: &str,
) -> mysql_async::ServerError {
    match conn.exec_drop(stmt, params).await {
        Err(mysql_async::Error::Server(e)) => {
            assert_eq!((e.code, e.state.as_str()), (1105, "HY000"), "{e:?}");
            assert!(
                e.message.contains(&format!("heatsink rule '{rule}'")),
                "{e:?}"
            );
            e
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A counter upsert whose row MariaDB converts (here a key longer than the column, in
/// a non-strict `sql_mode`) is run, undone and run as sent: the client gets the
/// table's own warning, and the statement is listed in `SHOW FALLBACKS` under its
/// text and under its prepared text, counted as the rule's fallback.
#[test]
fn upserts_undone_for_a_converted_value_are_listed_as_fallbacks() {
    let db = "rf_converted";
    let env = counter_and_rollup(db);
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        p.query_drop("SET sql_mode = ''").await.unwrap();
        let long = "k".repeat(80);
        let text = format!(
            "INSERT INTO hits (slug, cnt) VALUES ('{long}', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1"
        );
        p.query_drop(&text).await.unwrap();
        assert_eq!((p.affected_rows(), p.get_warnings()), (1, 1));
        let prepared =
            "INSERT INTO hits (slug, cnt) VALUES (?, 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1";
        let stmt = p.prep(prepared).await.unwrap();
        p.exec_drop(&stmt, (long.as_str(),)).await.unwrap();
        assert_eq!((p.affected_rows(), p.get_warnings()), (2, 1));
        p.close(stmt).await.unwrap();
        // The table's row took both; no slot row. A key that fits is rewritten.
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots"),
            Some("0".into())
        );
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug LIKE 'kkk%'"),
            Some("2".into())
        );
        p.query_drop(
            "INSERT INTO hits (slug, cnt) VALUES ('k', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
        )
        .await
        .unwrap();
        assert_eq!(p.affected_rows(), 1);
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots"),
            Some("1".into())
        );

        assert!(shapes(&mut admin, "SHOW REFUSALS").await.is_empty());
        let fell = shapes(&mut admin, "SHOW FALLBACKS").await;
        let seen: Vec<(&str, Option<&str>, u64)> = fell
            .iter()
            .map(|r| (r.rule.as_str(), r.class.as_deref(), r.count))
            .collect();
        assert_eq!(
            seen,
            vec![(COUNTER, None, 1), (COUNTER, None, 1)],
            "{fell:?}"
        );
        assert!(
            fell.iter()
                .all(|r| r.reason.contains("converted or refused the inserted row")),
            "{fell:?}"
        );
        // One shape per protocol, the example with its values masked.
        assert!(
            fell.iter().all(|r| r.example
                == "INSERT INTO hits (slug, cnt) VALUES (?, ?) ON DUPLICATE KEY UPDATE cnt = cnt + ?"),
            "{fell:?}"
        );
        assert_ne!(fell[0].fingerprint, fell[1].fingerprint);
        assert_eq!(
            rule_stats(&mut admin, COUNTER, &["fallbacks", "rewritten"]).await,
            ["2", "1"]
        );
    });
}

/// An increment of a key without a row whose row the table refuses (here a CHECK)
/// runs as sent, text and prepared: MariaDB's answer (0 rows matched), no slot row,
/// and `SHOW FALLBACKS` lists both shapes under the increment's reason.
#[test]
fn increments_of_refused_keys_are_listed_as_fallbacks() {
    let db = "rf_refused_key";
    let env = counter_and_rollup(db);
    mariadb().exec(&format!(
        "ALTER TABLE {db}.hits ADD CONSTRAINT no_spam CHECK (slug <> 'spam')"
    ));
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        p.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'spam'")
            .await
            .unwrap();
        assert_eq!(
            (p.affected_rows(), p.info().to_string()),
            (0, "Rows matched: 0  Changed: 0  Warnings: 0".to_string())
        );
        let stmt = p
            .prep("UPDATE hits SET cnt = cnt + ? WHERE slug = ?")
            .await
            .unwrap();
        p.exec_drop(&stmt, (2, "spam")).await.unwrap();
        assert_eq!(p.affected_rows(), 0);
        p.exec_drop(&stmt, (2, "home")).await.unwrap();
        assert_eq!(p.affected_rows(), 1);
        p.close(stmt).await.unwrap();
        assert_eq!(
            env.backend_rows("SELECT DISTINCT slug FROM {db}.hits_slots"),
            [[Some("home".to_string())]]
        );
        assert!(shapes(&mut admin, "SHOW REFUSALS").await.is_empty());
        let fell = shapes(&mut admin, "SHOW FALLBACKS").await;
        let seen: Vec<(&str, u64)> = fell.iter().map(|r| (r.rule.as_str(), r.count)).collect();
        assert_eq!(seen, vec![(COUNTER, 1), (COUNTER, 1)], "{fell:?}");
        assert!(
            fell.iter()
                .all(|r| r.reason.contains("the table refused the row it creates")),
            "{fell:?}"
        );
        assert_eq!(
            rule_stats(&mut admin, COUNTER, &["fallbacks", "rewritten"]).await,
            ["2", "1"]
        );
    });
}

/// Executes of a prepared statement (binary protocol) refused at COM_STMT_EXECUTE
/// for a parameter value the rule's check does not take are listed in `SHOW
/// REFUSALS` under the prepared text; an execute whose value the check declines
/// runs the client's statement (as MariaDB answers it directly) and is listed in
/// `SHOW FALLBACKS`. Reasons, examples and log lines show no parameter value.
#[test]
fn refusals_and_fallbacks_decided_at_execute() {
    let db = "rf_execute";
    let env = counter_and_rollup(db);
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let update = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?";
        let stmt = p.prep(update).await.unwrap();
        // Rewritten: a value the checks take.
        p.exec_drop(&stmt, (1, "home")).await.unwrap();
        // A key longer than the column (twice, other values): one shape.
        let long_a = format!("secret-a{}", "x".repeat(70));
        let long_b = format!("secret-b{}", "y".repeat(90));
        let mut messages = Vec::new();
        for key in [&long_a, &long_b] {
            let e = assert_execute_refused(&mut p, &stmt, (1, key.as_str()).into(), COUNTER).await;
            messages.push(e.message);
        }
        // An increment out of the counter's range: its message names the value, its
        // reason does not.
        let big: i64 = 4_000_000_000_000_000_000;
        let e = assert_execute_refused(&mut p, &stmt, (big, "home").into(), COUNTER).await;
        assert!(e.message.contains(&big.to_string()), "{e:?}");
        p.close(stmt).await.unwrap();

        let refusals = shapes(&mut admin, "SHOW REFUSALS").await;
        assert_eq!(refusals.len(), 2, "{refusals:?}");
        let top = &refusals[0];
        assert_eq!(
            (
                top.rule.as_str(),
                top.mode.as_deref(),
                top.class.as_deref(),
                top.count
            ),
            (COUNTER, Some("on"), Some("value"), 2)
        );
        assert_eq!(top.example, update);
        assert_eq!(
            top.reason,
            "a string parameter longer than 64 bytes cannot be rewritten with MariaDB's meaning"
        );
        // The client's message is the rule's and the same reason.
        assert!(
            messages
                .iter()
                .all(|m| *m == format!("heatsink rule '{COUNTER}': {}", top.reason)),
            "{messages:?}"
        );
        let range = &refusals[1];
        assert_eq!((range.count, range.class.as_deref()), (1, Some("value")));
        assert_eq!(range.fingerprint, top.fingerprint);
        assert_eq!(
            range.reason,
            "a parameter value outside -999999999999999999..=999999999999999999 cannot be rewritten with MariaDB's meaning"
        );
        assert_eq!(
            metric(&env, "heatsink_refusals_total{class=\"value\"}"),
            3.0
        );
        // SHOW RULE STATS counts the three refused executes as the rule's rejections,
        // not as rewrites (the one rewritten execute is its only rewrite).
        assert_eq!(
            rule_stats(&mut admin, COUNTER, &["rejected", "rewritten"]).await,
            ["3", "1"]
        );

        // A rollup read whose date parameter the check declines (not a valid date):
        // the client's statement runs, as it does directly.
        let read = "SELECT COUNT(*) AS n FROM plays WHERE created_at >= ?";
        for value in ["2024-02-30", "2024-03-01 10:30:00", "2024-13-01"] {
            let proxied: Vec<i64> = p.exec(read, (value,)).await.unwrap();
            let direct: Vec<i64> = d.exec(read, (value,)).await.unwrap();
            assert_eq!(proxied, direct, "{value}");
        }
        let fell = shapes(&mut admin, "SHOW FALLBACKS").await;
        assert_eq!(fell.len(), 1, "{fell:?}");
        assert_eq!(
            (
                fell[0].rule.as_str(),
                fell[0].count,
                fell[0].example.as_str()
            ),
            (ROLLUP, 2, read)
        );
        assert!(
            fell[0].reason.contains("not a valid date and time"),
            "{fell:?}"
        );
        // Two fallbacks and one rewrite for the rollup's rule.
        assert_eq!(
            rule_stats(&mut admin, ROLLUP, &["fallbacks", "rewritten"]).await,
            ["2", "1"]
        );

        // The first sighting of each shape is logged once; no value anywhere.
        for s in &refusals {
            assert_eq!(
                log_lines(&env, &[REFUSED_LINE, &s.fingerprint, &s.reason]),
                1,
                "{s:?}\n{}",
                env.tail()
            );
        }
        assert_eq!(
            log_lines(&env, &[FALLBACK_LINE, &fell[0].fingerprint, ROLLUP]),
            1,
            "{}",
            env.tail()
        );
        let all = format!("{refusals:?}{fell:?}{}", env.proxy.log_text());
        for value in ["secret", &big.to_string(), "2024-02-30", "2024-13-01"] {
            assert!(!all.contains(value), "{value}: {all}");
        }
    });
}

/// Shadow mode: an execute the rule would refuse for its parameter value runs
/// unchanged (as directly) and is listed in `SHOW REFUSALS` as `shadow`, with the
/// shadow first-seen line; so is a bulk execute (which the rule refuses whole).
#[test]
fn shadow_refusals_decided_at_execute() {
    let db = "rf_shadow_execute";
    create_counter_db(db, "", "('home', 10), ('about', 3)");
    let shadow = Rule::counter(COUNTER, "hits")
        .slots(4)
        .set("mode", "\"shadow\"");
    let env = Env::builder(db)
        .rule("hits.toml", shadow.toml())
        .metrics()
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let update = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?";
        let long = format!("secret-{}", "z".repeat(80));
        let cases: [(i64, &str); 3] = [(1, "home"), (2, &long), (3, &long)];
        for (inc, key) in cases {
            for c in [&mut p, &mut d] {
                let stmt = c.prep(update).await.unwrap();
                let r = c.exec_drop(&stmt, (inc, key)).await;
                assert!(r.is_ok(), "{r:?}");
                assert_eq!(c.affected_rows(), u64::from(key == "home"));
                c.close(stmt).await.unwrap();
            }
        }
        let refusals = shapes(&mut admin, "SHOW REFUSALS").await;
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        let s = &refusals[0];
        assert_eq!(
            (
                s.mode.as_deref(),
                s.class.as_deref(),
                s.count,
                s.example.as_str()
            ),
            (Some("shadow"), Some("value"), 2, update)
        );
        assert_eq!(
            s.reason,
            "a string parameter longer than 64 bytes cannot be rewritten with MariaDB's meaning"
        );
        assert_eq!(
            log_lines(&env, &[SHADOW_LINE, &s.fingerprint]),
            1,
            "{}",
            env.tail()
        );
        assert_eq!(log_lines(&env, &[REFUSED_LINE]), 0);
        assert!(!env.proxy.log_text().contains("secret"));
        let (cols, stats) = admin_query(&mut admin, "SHOW RULE STATS").await;
        let col = cols.iter().position(|c| c == "shadow_rejects").unwrap();
        assert_eq!(stats[0][col], "2");

        // A bulk execute (COM_STMT_BULK_EXECUTE, raw packets) of the statement runs
        // unchanged, answered as the same packet directly, and is listed as the
        // rule would refuse it.
        let answers = shadow_bulk(&env, update);
        assert_eq!(answers[1][0].ok().map(|o| o.affected_rows), Some(2));
        assert_eq!(answers[0], answers[1], "shadow bulk execute");
        let refusals = shapes(&mut admin, "SHOW REFUSALS").await;
        let bulk = refusals
            .iter()
            .find(|s| s.reason.starts_with("bulk execution"))
            .unwrap_or_else(|| panic!("{refusals:?}"));
        assert_eq!(
            (
                bulk.mode.as_deref(),
                bulk.class.as_deref(),
                bulk.count,
                bulk.example.as_str()
            ),
            (Some("shadow"), Some("shape"), 1, update)
        );
        let (cols, stats) = admin_query(&mut admin, "SHOW RULE STATS").await;
        let col = cols.iter().position(|c| c == "shadow_rejects").unwrap();
        assert_eq!(stats[0][col], "3");
    });
}

/// `update` prepared and bulk executed (two rows) through the proxy of `env`, then
/// directly: the two answers.
fn shadow_bulk(env: &Env, update: &str) -> Vec<Vec<common::packets::Packet>> {
    use common::rawclient::{mariadb_caps, ConnectOpts, RawClient, RawParam};
    let opts = ConnectOpts::new(common::USER, common::PASSWORD)
        .db(&env.db)
        .mariadb_caps(mariadb_caps::STMT_BULK_OPERATIONS);
    let rows = vec![
        vec![RawParam::Int(5), RawParam::str("about")],
        vec![RawParam::Int(7), RawParam::str("home")],
    ];
    [env.proxy.addr(), common::mariadb().addr()]
        .into_iter()
        .map(|addr| {
            let mut c = RawClient::connect(addr, &opts).unwrap();
            let (id, _) = c.prepare(update).unwrap();
            let answer = c.bulk_execute(id, &rows).unwrap();
            c.close_stmt(id).unwrap();
            answer
        })
        .collect()
}

/// MariaDB's bulk execute (COM_STMT_BULK_EXECUTE, `mariadb_stmt_execute` with
/// array binding), sent as raw packets: of a statement on a plain table it is
/// relayed and answered as MariaDB answers the same packet directly, byte for
/// byte; of a statement the rule rewrites it is refused (ERR 1105, nothing
/// written; the same packet sent directly runs), listed in `SHOW REFUSALS` under
/// the prepared text (class `shape`, no parameter value) and counted in `SHOW
/// RULE STATS` as the rule's rejection, as a refused COM_STMT_EXECUTE is.
#[test]
fn bulk_executes_of_rewritten_statements_are_listed_as_refusals() {
    use common::rawclient::{mariadb_caps, ConnectOpts, RawClient, RawParam};
    let db = "rf_bulk";
    let env = Env::builder(db)
        .schema(
            "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0); \
             INSERT INTO hits VALUES ('home', 10), ('about', 3); \
             CREATE TABLE plain (id INT PRIMARY KEY, v INT NOT NULL); \
             INSERT INTO plain VALUES (1, 0), (2, 0), (3, 0);",
        )
        .rule("hits.toml", counter_rule(COUNTER))
        .migrate()
        .metrics()
        .admin(ADMIN_PW)
        .start();
    let opts = ConnectOpts::new(common::USER, common::PASSWORD)
        .db(db)
        .mariadb_caps(mariadb_caps::STMT_BULK_OPERATIONS);
    let mut p = RawClient::connect(env.proxy.addr(), &opts).unwrap();
    let mut d = RawClient::connect(common::mariadb().addr(), &opts).unwrap();
    let value = |sql: &str| env.backend_scalar(sql);

    // A plain table: the proxy relays the bulk execute, answered as directly.
    let plain = "UPDATE plain SET v = v + ? WHERE id = ?";
    let rows = vec![
        vec![RawParam::Int(1), RawParam::Int(1)],
        vec![RawParam::Int(2), RawParam::Int(3)],
        vec![RawParam::Int(4), RawParam::Int(9)],
    ];
    let mut answers = Vec::new();
    for c in [&mut p, &mut d] {
        let (id, _) = c.prepare(plain).unwrap();
        answers.push(c.bulk_execute(id, &rows).unwrap());
        c.close_stmt(id).unwrap();
    }
    assert!(answers[1][0].is_ok(), "{:?}", answers[1]);
    assert_eq!(answers[0], answers[1], "bulk execute on a plain table");
    assert_eq!(
        value(&format!("SELECT SUM(v) FROM {db}.plain")).as_deref(),
        Some("6")
    );

    // The rule's statement: refused through the proxy, nothing written.
    let update = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?";
    let rows = vec![
        vec![RawParam::Int(5), RawParam::str("secret-key")],
        vec![RawParam::Int(7), RawParam::str("home")],
    ];
    let (id, _) = p.prepare(update).unwrap();
    for _ in 0..2 {
        let answer = p.bulk_execute(id, &rows).unwrap();
        let err = answer[0].err().unwrap_or_else(|| panic!("{answer:?}"));
        assert_eq!(err.code, 1105, "{err:?}");
        assert_eq!(
            err.message,
            format!(
                "heatsink rule '{COUNTER}': bulk execution of a rewritten statement is not \
                 supported; execute it row by row"
            )
        );
    }
    // The statement still runs row by row.
    let answer = p
        .execute(id, &[RawParam::Int(1), RawParam::str("about")])
        .unwrap();
    assert!(answer[0].is_ok(), "{answer:?}");
    p.close_stmt(id).unwrap();
    assert_eq!(
        common::fixture::counter_value(db, "home"),
        Some(10),
        "a refused bulk wrote"
    );
    assert_eq!(common::fixture::counter_value(db, "about"), Some(4));
    // The same packet sent directly runs.
    let (id, _) = d.prepare(update).unwrap();
    let answer = d.bulk_execute(id, &rows).unwrap();
    assert_eq!(
        answer[0].ok().map(|o| o.affected_rows),
        Some(1),
        "{answer:?}"
    );
    d.close_stmt(id).unwrap();
    assert_eq!(common::fixture::counter_value(db, "home"), Some(17));

    run(LIMIT, async {
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let refusals = shapes(&mut admin, "SHOW REFUSALS").await;
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        let s = &refusals[0];
        assert_eq!(
            (
                s.rule.as_str(),
                s.mode.as_deref(),
                s.class.as_deref(),
                s.count,
                s.example.as_str()
            ),
            (COUNTER, Some("on"), Some("shape"), 2, update)
        );
        assert_eq!(
            s.reason,
            "bulk execution of a rewritten statement is not supported; execute it row by row"
        );
        assert_eq!(
            log_lines(&env, &[REFUSED_LINE, &s.fingerprint]),
            1,
            "{}",
            env.tail()
        );
        assert_eq!(
            rule_stats(&mut admin, COUNTER, &["rejected", "rewritten"]).await,
            ["2", "1"]
        );
        assert!(!env.proxy.log_text().contains("secret"));
    });
}
