//! The counter rule end to end: statements through the proxy against the real MariaDB,
//! compared with a reference table (`hits_ref`, same schema, no rule) that receives the
//! same logical operations directly. Text protocol (mysql_async and PyMySQL), binary
//! protocol, transactions, rejections, query plans, concurrent writers, and a rule
//! switched on while another proxy still runs without it.
//!
//! Every test has its own database (`ctr_<name>`) and its own proxy. Tests marked
//! `#[ignore = "known limitation …"]` show known differences from the plain table; run them with
//! `cargo test --test counter -- --ignored`. `CTR_PROXY_LOG=debug` sets the proxies'
//! log level (failure messages include the log's tail).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cli::rule_pymysql;
use common::client::{assert_refused_by, connect, fill, run, run_exec, run_text, tail, Outcome};
use common::fixture::{fresh_db, inc_sql, migrate_apply, value_of, Env, Rule, MATCHED_1};
use common::{mariadb, Proxy};
use mysql_async::consts::ColumnType;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Row, ServerError, Value};

// ---------------------------------------------------------------------------------------
// Fixture

/// Rule name used in every rule file here.
const RULE: &str = "page_hits";

/// Keyed counter rule on `table` (`hits` or `<db>.hits`): key `slug`, counter `cnt`,
/// 16 slots in `hits_slots`.
fn hits_rule(table: &str) -> String {
    Rule::counter(RULE, table).toml()
}

/// The logical table, its reference twin, a table to join with (which has a *column*
/// named `hits`), and some rows.
const HITS_DDL: &str = "
    CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, note VARCHAR(20));
    CREATE TABLE hits_ref (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, note VARCHAR(20));
    CREATE TABLE pages (slug VARCHAR(64) PRIMARY KEY, title VARCHAR(100) NOT NULL,
        hits INT NOT NULL DEFAULT 0);
    INSERT INTO hits VALUES ('home', 10, 'front'), ('about', 3, NULL), ('blog', 7, 'b');
    INSERT INTO hits_ref SELECT * FROM hits;
    INSERT INTO pages VALUES ('home', 'Home', 1), ('blog', 'Blog', 2), ('contact', 'Contact', 3);";

/// Database `db` afresh with [`HITS_DDL`], and the slot table with its trigger made by
/// `heatsink migrate --apply`.
fn create_hits_db(db: &str) {
    fresh_db(db, HITS_DDL);
    migrate_apply(db, &hits_rule("hits"));
}

/// Database `ctr_<name>` with the hits tables (slot table made by `heatsink migrate`),
/// and a proxy whose rule names the table unqualified (`hits`) or qualified
/// (`ctr_<name>.hits`). `CTR_PROXY_LOG` sets the proxy's log level.
fn hits_env(name: &str, qualified: bool) -> Env {
    let db = format!("ctr_{name}");
    let table = if qualified {
        format!("{db}.hits")
    } else {
        "hits".to_string()
    };
    Env::builder(db)
        .schema(HITS_DDL)
        .rule("counter.toml", hits_rule(&table))
        .migrate()
        .log_level_from("CTR_PROXY_LOG")
        .start()
}

/// Physical state: logical table rows, slot rows, and the table definition.
fn snapshot(env: &Env) -> Vec<Vec<Vec<Option<String>>>> {
    vec![
        env.backend_rows("SELECT * FROM {db}.hits ORDER BY slug"),
        env.backend_rows("SELECT * FROM {db}.hits_slots ORDER BY slug, slot"),
        env.backend_rows("SHOW CREATE TABLE {db}.hits"),
    ]
}

// ---------------------------------------------------------------------------------------
// Capturing what a client sees

/// Runs `template` on the logical table through the proxy and on the reference table
/// directly; both must succeed and look the same. Returns the proxy's outcome, or a
/// description of the difference.
async fn compare_text(
    env: &Env,
    p: &mut Conn,
    d: &mut Conn,
    template: &str,
) -> Result<Outcome, String> {
    let ps = fill(template, "hits", &env.db);
    let ds = fill(template, "hits_ref", &env.db);
    let po = run_text(p, &ps)
        .await
        .map_err(|e| format!("through the proxy: {ps}\n  failed: {e}"))?;
    let dout = run_text(d, &ds)
        .await
        .map_err(|e| format!("reference: {ds}\n  failed: {e}"))?
        .renamed("hits_ref", "hits");
    if po != dout {
        return Err(format!(
            "differs from the reference: {ps}\n  proxy:     {po:?}\n  reference: {dout:?}"
        ));
    }
    Ok(po)
}

/// [`compare_text`] that panics on a difference.
async fn same_text(env: &Env, p: &mut Conn, d: &mut Conn, template: &str) -> Outcome {
    match compare_text(env, p, d, template).await {
        Ok(o) => o,
        Err(e) => panic!(
            "{e}\n--- proxy log ---\n{}",
            tail(&env.proxy.log_text(), 30)
        ),
    }
}

/// Like [`compare_text`] for a prepared statement executed with `params`.
async fn compare_exec(
    env: &Env,
    p: &mut Conn,
    d: &mut Conn,
    template: &str,
    params: Params,
) -> Result<Outcome, String> {
    let ps = fill(template, "hits", &env.db);
    let ds = fill(template, "hits_ref", &env.db);
    let po = run_exec(p, &ps, params.clone())
        .await
        .map_err(|e| format!("through the proxy (prepared): {ps} {params:?}\n  failed: {e}"))?;
    let dout = run_exec(d, &ds, params.clone())
        .await
        .map_err(|e| format!("reference (prepared): {ds}\n  failed: {e}"))?
        .renamed("hits_ref", "hits");
    if po != dout {
        return Err(format!(
            "prepared statement differs from the reference: {ps} {params:?}\n  proxy:     {po:?}\n  reference: {dout:?}"
        ));
    }
    Ok(po)
}

/// [`compare_exec`] that panics on a difference.
async fn same_exec(
    env: &Env,
    p: &mut Conn,
    d: &mut Conn,
    template: &str,
    params: impl Into<Params>,
) -> Outcome {
    match compare_exec(env, p, d, template, params.into()).await {
        Ok(o) => o,
        Err(e) => panic!(
            "{e}\n--- proxy log ---\n{}",
            tail(&env.proxy.log_text(), 30)
        ),
    }
}

/// What a client sees of a statement: its outcome, or its error code and SQLSTATE.
async fn outcome_or_error(conn: &mut Conn, sql: &str) -> Result<Outcome, (u16, String)> {
    match run_text(conn, sql).await {
        Ok(o) => Ok(o),
        Err(mysql_async::Error::Server(e)) => Err((e.code, e.state)),
        Err(e) => panic!("{sql}: {e}"),
    }
}

/// Like [`scenario_diffs`], but errors count as results: both sides must fail with
/// the same code and SQLSTATE, or succeed alike.
async fn scenario_diffs_with_errors(
    env: &Env,
    p: &mut Conn,
    d: &mut Conn,
    scenario: &[&str],
) -> Vec<String> {
    let mut diffs = Vec::new();
    for template in scenario {
        let ps = fill(template, "hits", &env.db);
        let ds = fill(template, "hits_ref", &env.db);
        let po = outcome_or_error(p, &ps).await;
        let dout = outcome_or_error(d, &ds)
            .await
            .map(|o| o.renamed("hits_ref", "hits"));
        if po != dout {
            diffs.push(format!(
                "differs from the reference: {ps}\n  proxy:     {po:?}\n  reference: {dout:?}"
            ));
        }
    }
    diffs
}

/// Runs every statement of a scenario, collecting the differences.
async fn scenario_diffs(env: &Env, p: &mut Conn, d: &mut Conn, scenario: &[&str]) -> Vec<String> {
    let mut diffs = Vec::new();
    for sql in scenario {
        if let Err(e) = compare_text(env, p, d, sql).await {
            diffs.push(e);
        }
    }
    diffs
}

/// Runs each template on `table` through the proxy and on `<table>_ref` directly; the
/// outcomes (with the reference renamed) must be equal.
async fn assert_same_as_ref(
    env: &Env,
    p: &mut Conn,
    d: &mut Conn,
    table: &str,
    templates: &[&str],
) {
    let reference = format!("{table}_ref");
    for sql in templates {
        let ps = fill(sql, table, &env.db);
        let ds = fill(sql, &reference, &env.db);
        let po = run_text(p, &ps)
            .await
            .unwrap_or_else(|e| panic!("{ps}: {e}\n{}", env.proxy.log_text()));
        let dout = run_text(d, &ds).await.unwrap().renamed(&reference, table);
        assert_eq!(po, dout, "{ps}");
    }
}

/// The statement must be refused by the rule: ERR 1105 / HY000 naming it.
async fn assert_rejected(conn: &mut Conn, sql: &str) -> ServerError {
    assert_refused_by(conn, sql, RULE).await
}

// ---------------------------------------------------------------------------------------
// 1. Text protocol

/// Statements run through the proxy on `hits` and directly on `hits_ref`. Each must
/// produce the same rows, column metadata, affected rows and info text.
const TEXT_SCENARIO: &[&str] = &[
    "SELECT * FROM {t} ORDER BY slug",
    "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home'",
    "UPDATE {t} SET cnt = 1 + cnt WHERE slug = 'home'",
    "UPDATE {t} SET cnt = cnt - 2 WHERE slug = 'about'",
    "UPDATE `{t}` SET `cnt` = `cnt` + 5 WHERE `slug` = 'blog'",
    "UPDATE {db}.{t} SET cnt = cnt + 4 WHERE slug = 'blog'",
    "UPDATE `{db}`.`{t}` SET cnt = cnt + 1 WHERE slug = 'blog'",
    "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home' LIMIT 1",
    "UPDATE {t} SET {t}.cnt = {t}.cnt + 2 WHERE {t}.slug = 'home'",
    "UPDATE {t} SET cnt = cnt + 1 WHERE 'about' = slug",
    "UPDATE {t} SET cnt=cnt+3 WHERE slug='about'",
    "update {t} set cnt = (cnt + 1) where (slug = \"home\")",
    "UPDATE {t} SET cnt = cnt + -1 WHERE slug = 'home'",
    "UPDATE {t} /* c */ SET cnt = cnt + 2 WHERE slug = 'home' -- trailing",
    "UPDATE {t} SET note = 'n1' WHERE slug = 'home'",
    "SELECT cnt FROM {t} WHERE slug = 'home'",
    "SELECT * FROM {t} ORDER BY slug",
    "SELECT * FROM {t} WHERE slug = 'about'",
    "SELECT slug, cnt FROM {t} ORDER BY cnt DESC, slug LIMIT 2",
    "SELECT h.slug, p.title FROM {t} h JOIN pages p ON p.slug = h.slug ORDER BY h.slug",
    "SELECT COUNT(*) FROM {t}",
    "SELECT COUNT(*) AS n FROM {t} WHERE cnt > 5",
    "SELECT h.cnt AS c FROM {t} h ORDER BY h.slug",
    "SELECT `cnt`, `note` FROM `{t}` WHERE `slug` = 'home'",
    "SELECT cnt FROM {db}.{t} WHERE slug = 'blog'",
    "SELECT slug FROM {t} WHERE cnt > 5 ORDER BY slug",
    "SELECT slug FROM pages WHERE slug IN (SELECT slug FROM {t} WHERE cnt >= 10) ORDER BY slug",
    "SELECT slug, hits FROM pages ORDER BY slug",
    // Absolute sets, deletes, upserts, inserts.
    "UPDATE {t} SET cnt = 0 WHERE slug = 'about'",
    "SELECT * FROM {t} ORDER BY slug",
    "UPDATE {t} SET cnt = 100, note = 'set' WHERE slug = 'blog'",
    "SELECT * FROM {t} ORDER BY slug",
    "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'blog'",
    "DELETE FROM {t} WHERE slug = 'blog'",
    "SELECT * FROM {t} ORDER BY slug",
    "INSERT INTO {t} (slug, cnt) VALUES ('x', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
    "INSERT INTO {t} (slug, cnt) VALUES ('y', 3) ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt)",
    "INSERT INTO {t} (slug, cnt, note) VALUES ('new', 5, 'fresh')",
    "UPDATE {t} SET cnt = cnt + 2 WHERE slug = 'new'",
    "SELECT * FROM {t} ORDER BY slug",
    "SELECT slug, cnt FROM {t} ORDER BY cnt DESC, slug LIMIT 3",
];

#[test]
fn text_protocol_matches_reference_table() {
    let env = hits_env("text", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let diffs = scenario_diffs(&env, &mut p, &mut d, TEXT_SCENARIO).await;
        assert!(
            diffs.is_empty(),
            "{} of {} statements differ:\n{}",
            diffs.len(),
            TEXT_SCENARIO.len(),
            diffs.join("\n")
        );
        let out = same_text(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home'",
        )
        .await;
        assert_eq!(out.affected_rows, 1);
        assert_eq!(out.info, MATCHED_1);
        // The increments went to slot rows, not to the logical row.
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'home'"),
            Some("10".into())
        );
        let slot_rows: i64 = env
            .backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug = 'home'")
            .unwrap()
            .parse()
            .unwrap();
        assert!(slot_rows >= 1, "no slot rows for 'home'");
        // Deleted counter: no slot rows left behind.
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug = 'blog'"),
            Some("0".into())
        );
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
}

/// The rule names the table with its database: qualified and unqualified references
/// in that database are rewritten; a table of the same name elsewhere is not.
#[test]
fn qualified_rule_applies_to_its_database_only() {
    let env = hits_env("qual", true);
    let other = "ctr_qual_other";
    create_hits_db(other);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        for sql in [
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home'",
            "UPDATE {db}.{t} SET cnt = cnt + 2 WHERE slug = 'home'",
            "SELECT * FROM {t} ORDER BY slug",
            "SELECT * FROM {db}.{t} ORDER BY slug",
        ] {
            same_text(&env, &mut p, &mut d, sql).await;
        }
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'home'"),
            Some("10".into())
        );
        // Another database's `hits`: plain passthrough, even shapes the rule refuses.
        p.query_drop(format!(
            "UPDATE {other}.hits SET cnt = cnt * 2 WHERE slug = 'home'"
        ))
        .await
        .expect("other database's hits is not ruled");
        p.query_drop(format!(
            "UPDATE {other}.hits SET cnt = cnt + 1 WHERE slug = 'home'"
        ))
        .await
        .unwrap();
        let v: Option<i64> = p
            .query_first(format!("SELECT cnt FROM {other}.hits WHERE slug = 'home'"))
            .await
            .unwrap();
        assert_eq!(v, Some(21));
        assert_eq!(
            mariadb().query_strings(&format!("SELECT COUNT(*) FROM {other}.hits_slots")),
            vec![vec![Some("0".to_string())]]
        );
        // From the other database as default, the ruled table by its full name.
        p.query_drop(format!("USE {other}")).await.unwrap();
        p.query_drop(format!(
            "UPDATE {}.hits SET cnt = cnt + 1 WHERE slug = 'home'",
            env.db
        ))
        .await
        .unwrap();
        let v: Option<i64> = p
            .query_first(format!(
                "SELECT cnt FROM {}.hits WHERE slug = 'home'",
                env.db
            ))
            .await
            .unwrap();
        assert_eq!(v, Some(14));
        let v: Option<i64> = p
            .query_first("SELECT cnt FROM hits WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(v, Some(21), "unqualified `hits` is the other database's");
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
}

/// A table with two counter columns, one of them unsigned BIGINT.
#[test]
fn two_counter_columns() {
    let rule = Rule::counter(RULE, "stats")
        .key(&["id"])
        .columns(&["views", "bytes"])
        .slots(8)
        .slot_table("stats_slots");
    let env = Env::builder("ctr_two")
        .schema(
            "CREATE TABLE stats (id INT PRIMARY KEY, views INT NOT NULL DEFAULT 0,
                 bytes BIGINT UNSIGNED NOT NULL DEFAULT 0, label VARCHAR(10));
             CREATE TABLE stats_ref LIKE stats;
             INSERT INTO stats VALUES (1, 5, 1000, 'a'), (2, 0, 0, 'b');
             INSERT INTO stats_ref SELECT * FROM stats;",
        )
        .rule("counter.toml", rule.toml())
        .migrate()
        .start();
    let db = env.db.as_str();
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let templates = [
            "UPDATE {t} SET views = views + 1, bytes = bytes + 512 WHERE id = 1",
            "UPDATE {t} SET bytes = bytes + 100, views = views + 2 WHERE id = 1",
            "UPDATE {t} SET views = views + 1 WHERE id = 2",
            "UPDATE {t} SET bytes = bytes - 50 WHERE id = 1",
            // Alone (in a transaction): no id, LAST_INSERT_ID() untouched.
            "BEGIN",
            "UPDATE {t} SET views = views + 5, bytes = bytes + 7 WHERE id = 1",
            "SELECT LAST_INSERT_ID()",
            "COMMIT",
            "SELECT * FROM {t} ORDER BY id",
            "SELECT views, bytes FROM {t} WHERE id = 1",
            "SELECT id FROM {t} WHERE bytes > 1000 ORDER BY id",
        ];
        assert_same_as_ref(&env, &mut p, &mut d, "stats", &templates).await;
        let stored =
            mariadb().query_strings(&format!("SELECT views, bytes FROM {db}.stats WHERE id = 1"));
        assert_eq!(
            stored,
            vec![vec![Some("5".to_string()), Some("1000".to_string())]]
        );
        // A set of one counter would clear the slot rows holding the other's
        // increments: refused; setting both is exact.
        let e = assert_refused_by(&mut p, "UPDATE stats SET views = 0 WHERE id = 1", RULE).await;
        assert!(e.message.contains("`bytes`"), "{}", e.message);
        let templates = [
            "UPDATE {t} SET views = 0, bytes = 9 WHERE id = 1",
            "UPDATE {t} SET views = views + 1, bytes = bytes + 1 WHERE id = 1",
            "SELECT * FROM {t} ORDER BY id",
        ];
        assert_same_as_ref(&env, &mut p, &mut d, "stats", &templates).await;
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
}

/// Runs `rule_pymysql.py` with `statements` and returns its stdout.
fn pymysql(port: u16, db: &str, table: &str, autocommit: bool, statements: &[&str]) -> String {
    rule_pymysql(
        port,
        db,
        table,
        autocommit,
        &["--show-table=hits"],
        statements,
    )
}

/// The same scenario with PyMySQL, in autocommit mode and with autocommit off (PyMySQL's
/// default; the script commits at the end).
#[test]
fn pymysql_matches_reference_table() {
    for autocommit in [true, false] {
        let name = if autocommit { "py_ac" } else { "py_noac" };
        let env = hits_env(name, false);
        let proxied = pymysql(env.proxy.port(), &env.db, "hits", autocommit, TEXT_SCENARIO);
        let direct = pymysql(
            mariadb().port(),
            &env.db,
            "hits_ref",
            autocommit,
            TEXT_SCENARIO,
        );
        for (p, d) in proxied.lines().zip(direct.lines()) {
            assert_eq!(
                p,
                d,
                "PyMySQL (autocommit={autocommit}) differs\n--- proxy log ---\n{}",
                env.proxy.log_text()
            );
        }
        assert_eq!(proxied.lines().count(), TEXT_SCENARIO.len());
        assert_eq!(direct.lines().count(), TEXT_SCENARIO.len());
        assert!(proxied.contains(MATCHED_1), "{proxied}");
        // The slot rows got the increments; committed at the end either way.
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'home'"),
            Some("10".into())
        );
    }
}

/// Database `ctr_<name>` and a proxy: each statement through the proxy on `hits` and
/// directly on `hits_ref` must succeed and look the same.
fn assert_same_outcomes(name: &str, statements: &[&str]) {
    let env = hits_env(name, false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        for sql in statements {
            same_text(&env, &mut p, &mut d, sql).await;
        }
    });
}

/// Warnings count of rewritten writes: the original statements raise none.
#[test]
fn rewritten_writes_report_no_extra_warnings() {
    assert_same_outcomes(
        "warn",
        &[
            // A new slot row fires the trigger, whose INSERT IGNORE meets the row.
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home'",
            "INSERT INTO {t} (slug, cnt) VALUES ('x', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "INSERT INTO {t} (slug, cnt) VALUES ('x', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "SHOW WARNINGS",
            "INSERT INTO {t} (slug, cnt) VALUES ('home', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "SHOW WARNINGS",
        ],
    );
}

/// An absolute set reports what the logical row would: changed when the logical
/// value changes, even though the stored base may already hold the new value.
#[test]
#[ignore = "known limitation (rules/README.md): absolute set reports the base row's Changed/affected rows, not the logical row's"]
fn absolute_set_reports_logical_changes() {
    assert_same_outcomes(
        "setrows",
        &[
            "UPDATE {t} SET cnt = cnt + 5 WHERE slug = 'home'",
            // Logical 15 → 10: the base already holds 10.
            "UPDATE {t} SET cnt = 10 WHERE slug = 'home'",
            "UPDATE {t} SET cnt = cnt + 5 WHERE slug = 'home'",
            // Logical 15 → 15: the base holds 10.
            "UPDATE {t} SET cnt = 15 WHERE slug = 'home'",
            "SELECT * FROM {t} ORDER BY slug",
        ],
    );
}

/// Reads whose computed columns involve a counter: types and lengths as computed
/// from the logical INT column.
#[test]
#[ignore = "known limitation (rules/README.md): expressions over a counter are typed from the rewrite's BIGINT (MAX/MIN/IFNULL give LONGLONG(21), cnt + 1 length 22, SUM/AVG/CONCAT longer) instead of the INT column's"]
fn expressions_over_counters_keep_metadata() {
    let env = hits_env("expr", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        same_text(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + 5 WHERE slug = 'home'",
        )
        .await;
        let mut failures = Vec::new();
        for sql in [
            "SELECT cnt + 1 AS n FROM {t} WHERE slug = 'home'",
            "SELECT SUM(cnt), MAX(cnt), MIN(cnt) FROM {t}",
            "SELECT AVG(cnt) FROM {t}",
            "SELECT CONCAT(slug, ':', cnt) FROM {t} ORDER BY slug",
            "SELECT IFNULL(cnt, 0) FROM {t} ORDER BY slug",
        ] {
            let ps = fill(sql, "hits", &env.db);
            let ds = fill(sql, "hits_ref", &env.db);
            let po = run_text(&mut p, &ps).await.unwrap();
            let dout = run_text(&mut d, &ds)
                .await
                .unwrap()
                .renamed("hits_ref", "hits");
            assert_eq!(po.rows, dout.rows, "values differ: {ps}");
            if po.columns != dout.columns {
                failures.push(format!(
                    "{ps}\n  proxy:     {:?}\n  reference: {:?}",
                    po.columns, dout.columns
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "column metadata differs:\n{}",
            failures.join("\n")
        );
    });
}

/// Reads that join the counter table with another table.
const JOIN_READS: &[&str] = &[
    "SELECT h.slug, h.cnt, p.title FROM {t} h JOIN pages p ON p.slug = h.slug ORDER BY h.slug",
    "SELECT h.cnt FROM {t} h JOIN pages p ON p.slug = h.slug WHERE h.slug = 'home'",
    "SELECT {t}.cnt FROM {t}, pages WHERE {t}.slug = pages.slug ORDER BY {t}.slug",
    "SELECT * FROM {t} JOIN pages USING (slug) ORDER BY slug",
    "SELECT p.slug, h.cnt FROM pages p LEFT JOIN {t} h ON h.slug = p.slug ORDER BY p.slug",
    "SELECT p.slug, h.cnt FROM {t} h RIGHT JOIN pages p ON h.slug = p.slug ORDER BY p.slug",
];

#[test]
fn join_reads_restore_counter_metadata() {
    let env = hits_env("join", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        same_text(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + 7 WHERE slug = 'home'",
        )
        .await;
        let diffs = scenario_diffs(&env, &mut p, &mut d, JOIN_READS).await;
        assert!(
            diffs.is_empty(),
            "{} of {} joins differ:\n{}",
            diffs.len(),
            JOIN_READS.len(),
            diffs.join("\n")
        );
    });
}

/// Runs a scenario (errors compared by code and SQLSTATE) and asserts no difference.
fn assert_scenario_with_errors(name: &str, scenario: &'static [&'static str]) {
    let env = hits_env(name, false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let diffs = scenario_diffs_with_errors(&env, &mut p, &mut d, scenario).await;
        assert!(diffs.is_empty(), "{}", diffs.join("\n"));
        // The binary protocol can still read every counter.
        let rows: Vec<Row> = p
            .exec("SELECT * FROM hits ORDER BY slug", ())
            .await
            .unwrap_or_else(|e| panic!("prepared read: {e}"));
        assert!(!rows.is_empty());
    });
}

/// Increments the table accepts or refuses alike through the proxy.
#[test]
fn unusual_increments_behave_like_the_table() {
    assert_scenario_with_errors(
        "unusual",
        &[
            "UPDATE {t} SET cnt = cnt - 20 WHERE slug = 'about'",
            "UPDATE {t} SET cnt = cnt + 1, cnt = cnt + 2 WHERE slug = 'home'",
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = NULL",
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home' LIMIT 0",
            "SELECT * FROM {t} ORDER BY slug",
            "UPDATE nosuch SET cnt = cnt + 1 WHERE slug = 'home'",
        ],
    );
}

/// Increments a slot row cannot hold exactly are refused and change nothing:
/// `+ NULL` sets the column to NULL (an error, or 0 in non-strict mode), and MariaDB
/// rounds `+ 1.5` or converts `+ '2'` against the whole value, not the delta.
#[test]
fn inexact_increments_are_refused() {
    let env = hits_env("inexact", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        for sql in [
            "UPDATE hits SET cnt = cnt + NULL WHERE slug = 'home'",
            "UPDATE hits SET cnt = cnt - 1.5 WHERE slug = 'home'",
            "UPDATE hits SET cnt = cnt + '2' WHERE slug = 'home'",
        ] {
            assert_rejected(&mut p, sql).await;
        }
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'home'"),
            Some("10".into())
        );
    });
}

/// Adding zero matches the row but changes nothing.
#[test]
#[ignore = "known limitation (rules/README.md): cnt = cnt + 0 reports 1 affected row and Changed: 1; the table reports 0 and Changed: 0"]
fn zero_increment_reports_no_change() {
    assert_scenario_with_errors(
        "zero",
        &["UPDATE {t} SET cnt = cnt + 0 WHERE slug = 'blog'"],
    );
}

/// An increment that takes the counter beyond its column's range fails on the
/// table (ER_WARN_DATA_OUT_OF_RANGE in strict mode).
#[test]
#[ignore = "known limitation (rules/README.md): increments beyond the INT range are accepted into slot rows; reads then show values the column cannot hold"]
fn out_of_range_increments_fail_like_the_table() {
    assert_scenario_with_errors(
        "range",
        &[
            "UPDATE {t} SET cnt = cnt + 2147483647 WHERE slug = 'home'",
            "UPDATE {t} SET cnt = cnt - 2147483647 WHERE slug = 'about'",
            "UPDATE {t} SET cnt = cnt - 2147483647 WHERE slug = 'about'",
            "SELECT * FROM {t} ORDER BY slug",
        ],
    );
}

/// Table names are case-sensitive on this server: `HITS` is not `hits`.
#[test]
#[ignore = "known limitation (rules/README.md): the rule matches table names case-insensitively; UPDATE HITS is rewritten onto hits_slots instead of failing with 1146"]
fn other_case_table_name_fails_like_the_table() {
    assert_scenario_with_errors(
        "case",
        &[
            "UPDATE HITS SET cnt = cnt + 1 WHERE slug = 'home'",
            "INSERT INTO HITS (slug, cnt) VALUES ('home', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "SELECT * FROM {t} ORDER BY slug",
        ],
    );
}

/// A non-numeric increment fails with the table's error code.
#[test]
#[ignore = "known limitation (rules/README.md): cnt + 'x' fails with 1366 (slot insert) instead of the table's 1292"]
fn non_numeric_increment_fails_with_the_table_error() {
    assert_scenario_with_errors(
        "nonnum",
        &["UPDATE {t} SET cnt = cnt + 'x' WHERE slug = 'home'"],
    );
}

// ---------------------------------------------------------------------------------------
// 2. Prepared statements

#[test]
fn prepared_statements_match_reference_table() {
    let env = hits_env("prep", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let inc = "UPDATE {t} SET cnt = cnt + ? WHERE slug = ?";
        for (delta, slug) in [(1i64, "home"), (2, "home"), (3, "about"), (-1, "home")] {
            let out = same_exec(&env, &mut p, &mut d, inc, (delta, slug)).await;
            assert_eq!(out.affected_rows, 1);
        }
        // Mixed literal and parameter, parameter order reversed relative to columns.
        same_exec(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = ? + cnt WHERE slug = ?",
            (4i64, "blog"),
        )
        .await;
        same_exec(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = ?",
            ("blog",),
        )
        .await;
        same_exec(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + ? WHERE slug = 'about'",
            (7i64,),
        )
        .await;
        // String-typed delta and int-typed key (types come from the client's binding).
        same_exec(&env, &mut p, &mut d, inc, ("2", "home")).await;
        let reads: &[(&str, Params)] = &[
            (
                "SELECT cnt FROM {t} WHERE slug = ?",
                Params::from(("home",)),
            ),
            ("SELECT * FROM {t} WHERE slug = ?", Params::from(("about",))),
            (
                "SELECT slug, cnt, note FROM {t} ORDER BY cnt DESC, slug LIMIT ?",
                Params::from((2i64,)),
            ),
            (
                "SELECT h.cnt AS c FROM {t} h WHERE h.slug = ?",
                Params::from(("blog",)),
            ),
            (
                "SELECT h.slug, p.title FROM {t} h JOIN pages p ON p.slug = h.slug WHERE h.cnt > ?",
                Params::from((0i64,)),
            ),
            (
                "SELECT COUNT(*) FROM {t} WHERE cnt > ?",
                Params::from((5i64,)),
            ),
            (
                "SELECT cnt FROM {t} WHERE slug = ?",
                Params::from(("missing",)),
            ),
            ("SELECT cnt, slug FROM {t} ORDER BY slug", Params::Empty),
        ];
        let mut diffs = Vec::new();
        for (sql, params) in reads {
            match compare_exec(&env, &mut p, &mut d, sql, params.clone()).await {
                Ok(out) => {
                    if sql.starts_with("SELECT cnt FROM") && out.rows.len() == 1 {
                        // Re-encoded from the rewrite's BIGINT to the logical INT.
                        assert_eq!(out.columns[0].column_type, ColumnType::MYSQL_TYPE_LONG);
                        assert!(matches!(out.rows[0][0], Value::Int(_)), "{out:?}");
                    }
                }
                Err(e) => diffs.push(e),
            }
        }
        assert!(
            diffs.is_empty(),
            "prepared reads differ:\n{}",
            diffs.join("\n")
        );
        // Text and binary protocol agree on values.
        let text: Vec<Row> = p.query("SELECT * FROM hits ORDER BY slug").await.unwrap();
        let bin: Vec<Row> = p
            .exec("SELECT * FROM hits ORDER BY slug", ())
            .await
            .unwrap();
        let as_tuples = |rows: Vec<Row>| -> Vec<(String, i64, Option<String>)> {
            rows.into_iter().map(mysql_async::from_row).collect()
        };
        assert_eq!(as_tuples(text), as_tuples(bin));
        // The same prepared statement executed many times (types omitted after the
        // first execute): the increments all land.
        let before = value_of(&mut p, "home").await.unwrap();
        let stmt = p
            .prep("UPDATE hits SET cnt = cnt + ? WHERE slug = ?")
            .await
            .unwrap();
        for _ in 0..20 {
            p.exec_drop(&stmt, (1i64, "home")).await.unwrap();
            assert_eq!(p.affected_rows(), 1);
        }
        p.close(stmt).await.unwrap();
        assert_eq!(value_of(&mut p, "home").await, Some(before + 20));
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
}

/// Prepared reads whose result types depend on the parameters' bound types: MariaDB
/// describes the columns again at execute time, and that is what the client must get.
#[test]
fn prepared_reads_keep_execute_time_types() {
    let env = hits_env("prepexpr", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        same_text(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + 4 WHERE slug = 'home'",
        )
        .await;
        let reads: &[(&str, Params)] = &[
            (
                "SELECT cnt + ? FROM {t} WHERE slug = ?",
                Params::from((1i64, "home")),
            ),
            (
                "SELECT ?, cnt FROM {t} WHERE slug = ?",
                Params::from((7i64, "home")),
            ),
            (
                "SELECT cnt * ? FROM {t} WHERE slug = ?",
                Params::from((2.5f64, "home")),
            ),
        ];
        let mut diffs = Vec::new();
        for (sql, params) in reads {
            if let Err(e) = compare_exec(&env, &mut p, &mut d, sql, params.clone()).await {
                diffs.push(e);
            }
        }
        assert!(
            diffs.is_empty(),
            "prepared reads differ:\n{}",
            diffs.join("\n")
        );
    });
}

/// Rewrites that need several statements work as prepared statements too: each
/// rewritten statement is prepared on the backend and an execute runs them in one
/// transaction. Results match the reference table, execute after execute.
#[test]
fn prepared_multi_statement_rewrites() {
    let env = hits_env("prepmulti", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        same_text(
            &env,
            &mut p,
            &mut d,
            "UPDATE {t} SET cnt = cnt + 4 WHERE slug = 'home'",
        )
        .await;
        let steps: &[(&str, Params)] = &[
            (
                "UPDATE {t} SET cnt = ? WHERE slug = ?",
                Params::from((7i64, "home")),
            ),
            (
                "UPDATE {t} SET cnt = ? WHERE slug = ?",
                Params::from((9i64, "home")),
            ),
            (
                "INSERT INTO {t} (slug, cnt) VALUES (?, 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
                Params::from(("home",)),
            ),
            (
                "INSERT INTO {t} (slug, cnt) VALUES (?, 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
                Params::from(("fresh",)),
            ),
            ("DELETE FROM {t} WHERE slug = ?", Params::from(("home",))),
            ("DELETE FROM {t} WHERE slug = ?", Params::from(("nothing",))),
        ];
        for (sql, params) in steps {
            if let Err(e) = compare_exec(&env, &mut p, &mut d, sql, params.clone()).await {
                panic!(
                    "{e}\n--- proxy log ---\n{}",
                    tail(&env.proxy.log_text(), 30)
                );
            }
        }
        assert_eq!(value_of(&mut p, "home").await, None);
        assert_eq!(value_of(&mut p, "fresh").await, Some(1));
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug = 'home'"),
            Some("0".into()),
            "slot rows left after a prepared DELETE"
        );
    });
}

// ---------------------------------------------------------------------------------------
// 3. Absolute sets, deletes, upserts, inserts

#[test]
fn sets_deletes_upserts_and_new_counters() {
    let env = hits_env("writes", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        for _ in 0..5 {
            p.query_drop(inc_sql("home", 1)).await.unwrap();
        }
        assert_eq!(value_of(&mut p, "home").await, Some(15));
        p.query_drop("UPDATE hits SET cnt = 0 WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 1);
        assert_eq!(value_of(&mut p, "home").await, Some(0));
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug = 'home'"),
            Some("0".into()),
            "slot rows left after an absolute set"
        );
        p.query_drop(inc_sql("home", 2)).await.unwrap();
        assert_eq!(value_of(&mut p, "home").await, Some(2));

        // DELETE removes the row and its slot rows.
        p.query_drop(inc_sql("about", 4)).await.unwrap();
        p.query_drop("DELETE FROM hits WHERE slug = 'about'")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 1);
        assert_eq!(value_of(&mut p, "about").await, None);
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug = 'about'"),
            Some("0".into())
        );
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits WHERE slug = 'about'"),
            Some("0".into())
        );
        // Deleting a missing row: 0 affected.
        p.query_drop("DELETE FROM hits WHERE slug = 'nothing'")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 0);

        // Upsert twice: 1 then 2 affected rows, value 2.
        let upsert =
            "INSERT INTO hits (slug, cnt) VALUES ('x', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1";
        p.query_drop(upsert).await.unwrap();
        assert_eq!(p.affected_rows(), 1);
        p.query_drop(upsert).await.unwrap();
        assert_eq!(p.affected_rows(), 2);
        assert_eq!(value_of(&mut p, "x").await, Some(2));

        // Plain insert of a new counter, then an increment.
        p.query_drop("INSERT INTO hits (slug, cnt, note) VALUES ('fresh', 7, 'n')")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 1);
        assert_eq!(value_of(&mut p, "fresh").await, Some(7));
        p.query_drop(inc_sql("fresh", 3)).await.unwrap();
        assert_eq!(value_of(&mut p, "fresh").await, Some(10));
        // A duplicate plain insert fails as it would on the table.
        match p
            .query_drop("INSERT INTO hits (slug, cnt) VALUES ('fresh', 1)")
            .await
        {
            Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1062, "{e:?}"),
            other => panic!("expected duplicate key, got {other:?}"),
        }

        // An increment of a key with no row creates it (the slot table's trigger).
        p.query_drop(inc_sql("brand-new", 3)).await.unwrap();
        assert_eq!(p.affected_rows(), 1);
        assert_eq!(p.info(), MATCHED_1);
        assert_eq!(value_of(&mut p, "brand-new").await, Some(3));
        let row: Option<(String, i64, Option<String>)> = p
            .query_first("SELECT * FROM hits WHERE slug = 'brand-new'")
            .await
            .unwrap();
        assert_eq!(row, Some(("brand-new".into(), 3, None)));
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'brand-new'"),
            Some("0".into()),
            "the created row holds base 0"
        );

        // Deleting everything clears every slot row.
        p.query_drop("DELETE FROM hits").await.unwrap();
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots"),
            Some("0".into())
        );
        let n: Option<i64> = p.query_first("SELECT COUNT(*) FROM hits").await.unwrap();
        assert_eq!(n, Some(0));
        p.disconnect().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// 4. Transactions

#[test]
fn transactions_commit_and_roll_back_rewrites() {
    let env = hits_env("txn", false);
    run(Duration::from_secs(30), async {
        let mut c = env.proxied().await;
        let mut other = env.proxied().await;
        c.query_drop(inc_sql("home", 1)).await.unwrap();
        let v0 = value_of(&mut c, "home").await.unwrap();
        let slots_before = env.backend_rows("SELECT * FROM {db}.hits_slots ORDER BY slug, slot");

        // BEGIN; 3 increments; ROLLBACK.
        c.query_drop("BEGIN").await.unwrap();
        for _ in 0..3 {
            c.query_drop(inc_sql("home", 1)).await.unwrap();
            assert_eq!(c.affected_rows(), 1);
        }
        assert_eq!(value_of(&mut c, "home").await, Some(v0 + 3), "own writes");
        assert_eq!(value_of(&mut other, "home").await, Some(v0), "uncommitted");
        c.query_drop("ROLLBACK").await.unwrap();
        assert_eq!(value_of(&mut c, "home").await, Some(v0));
        assert_eq!(
            env.backend_rows("SELECT * FROM {db}.hits_slots ORDER BY slug, slot"),
            slots_before
        );

        // BEGIN; increment; COMMIT.
        c.query_drop("START TRANSACTION").await.unwrap();
        c.query_drop(inc_sql("home", 5)).await.unwrap();
        assert_eq!(value_of(&mut other, "home").await, Some(v0));
        c.query_drop("COMMIT").await.unwrap();
        assert_eq!(value_of(&mut other, "home").await, Some(v0 + 5));

        // Multi-statement rewrites inside a transaction roll back too.
        c.query_drop("BEGIN").await.unwrap();
        c.query_drop("UPDATE hits SET cnt = 0 WHERE slug = 'home'")
            .await
            .unwrap();
        c.query_drop("DELETE FROM hits WHERE slug = 'about'")
            .await
            .unwrap();
        c.query_drop(
            "INSERT INTO hits (slug, cnt) VALUES ('t', 2) ON DUPLICATE KEY UPDATE cnt = cnt + 2",
        )
        .await
        .unwrap();
        assert_eq!(value_of(&mut c, "home").await, Some(0));
        assert_eq!(value_of(&mut c, "t").await, Some(2));
        assert_eq!(value_of(&mut other, "home").await, Some(v0 + 5));
        c.query_drop("ROLLBACK").await.unwrap();
        assert_eq!(value_of(&mut c, "home").await, Some(v0 + 5));
        assert_eq!(value_of(&mut c, "about").await, Some(3));
        assert_eq!(value_of(&mut c, "t").await, None);

        // autocommit=0: nothing is visible before COMMIT, even multi-statement rewrites
        // (which must not be wrapped in a transaction of their own).
        c.query_drop("SET autocommit = 0").await.unwrap();
        c.query_drop(inc_sql("home", 1)).await.unwrap();
        c.query_drop(inc_sql("home", 1)).await.unwrap();
        c.query_drop(
            "INSERT INTO hits (slug, cnt) VALUES ('u', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
        )
        .await
        .unwrap();
        c.query_drop("UPDATE hits SET cnt = 50 WHERE slug = 'blog'")
            .await
            .unwrap();
        assert_eq!(value_of(&mut other, "home").await, Some(v0 + 5));
        assert_eq!(value_of(&mut other, "u").await, None);
        assert_eq!(value_of(&mut other, "blog").await, Some(7));
        c.query_drop("COMMIT").await.unwrap();
        assert_eq!(value_of(&mut other, "home").await, Some(v0 + 7));
        assert_eq!(value_of(&mut other, "u").await, Some(1));
        assert_eq!(value_of(&mut other, "blog").await, Some(50));
        // …and ROLLBACK under autocommit=0 undoes a multi-statement rewrite.
        c.query_drop("UPDATE hits SET cnt = 99 WHERE slug = 'blog'")
            .await
            .unwrap();
        c.query_drop("ROLLBACK").await.unwrap();
        assert_eq!(value_of(&mut other, "blog").await, Some(50));
        c.query_drop("SET autocommit = 1").await.unwrap();
        c.query_drop(inc_sql("home", 1)).await.unwrap();
        assert_eq!(value_of(&mut other, "home").await, Some(v0 + 8));

        // A failing statement inside an atomic rewrite leaves nothing half done: an
        // over-long key fails (strict mode, 1406) in the upsert's statements.
        let long = "k".repeat(80);
        let r = c
            .query_drop(format!(
                "INSERT INTO hits (slug, cnt) VALUES ('{long}', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1"
            ))
            .await;
        match r {
            Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1406, "{e:?}"),
            other => panic!("an over-long key must fail with 1406: {other:?}"),
        }
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug LIKE 'kkkk%'"),
            Some("0".into())
        );
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits WHERE slug LIKE 'kkkk%'"),
            Some("0".into())
        );
        // The connection is usable and back in autocommit mode, outside a transaction.
        c.query_drop(inc_sql("home", 1)).await.unwrap();
        assert_eq!(value_of(&mut other, "home").await, Some(v0 + 9));
        c.disconnect().await.unwrap();
        other.disconnect().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// 5. Rejections

#[test]
fn unsupported_shapes_are_rejected_and_write_nothing() {
    let env = hits_env("reject", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        p.query_drop(inc_sql("home", 2)).await.unwrap();
        let before = snapshot(&env);
        for sql in [
            "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'",
            "UPDATE hits SET cnt = cnt + cnt WHERE slug = 'home'",
            "UPDATE hits SET cnt = cnt + 1 WHERE cnt > 5",
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' AND cnt > 5",
            "UPDATE hits SET cnt = 0 WHERE cnt > 5",
            "UPDATE hits SET cnt = cnt + 1 WHERE slug IN ('home', 'about')",
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' OR slug = 'about'",
            "UPDATE hits SET cnt = cnt + 1",
            "UPDATE hits SET cnt = cnt + 1, note = 'x' WHERE slug = 'home'",
            "UPDATE hits SET note = cnt WHERE slug = 'home'",
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' ORDER BY cnt",
            "UPDATE hits h JOIN pages p ON p.slug = h.slug SET h.cnt = h.cnt + 1",
            "UPDATE pages p JOIN hits h ON p.slug = h.slug SET p.title = 'x'",
            "UPDATE hits, pages SET hits.cnt = 1 WHERE hits.slug = pages.slug",
            "DELETE h FROM hits h JOIN pages p ON p.slug = h.slug",
            "DELETE FROM hits WHERE cnt > 5",
            "DELETE FROM hits WHERE note = 'front'",
            "TRUNCATE hits",
            "TRUNCATE TABLE hits",
            "ALTER TABLE hits ADD x INT",
            "DROP TABLE hits",
            "RENAME TABLE hits TO hits_old",
            "REPLACE INTO hits (slug, cnt) VALUES ('home', 1)",
            "REPLACE INTO hits VALUES ('zzz', 1, NULL)",
            "INSERT INTO hits (slug, cnt) VALUES ('home', 1) ON DUPLICATE KEY UPDATE cnt = 5",
            "INSERT INTO hits (slug, cnt) VALUES ('home', 2) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "INSERT INTO hits (slug, cnt) VALUES ('a', 1), ('b', 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "INSERT INTO hits (slug, cnt) SELECT CONCAT(slug, '2'), cnt FROM hits",
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'; SELECT 1",
        ] {
            assert_rejected(&mut p, sql).await;
            // The connection stays usable after each refusal.
            let one: Option<i64> = p.query_first("SELECT 1").await.unwrap();
            assert_eq!(one, Some(1));
        }
        assert_eq!(
            snapshot(&env),
            before,
            "a rejected statement wrote something"
        );
        assert_eq!(value_of(&mut p, "home").await, Some(12));

        // Statements on other tables are unaffected, including shapes refused on hits
        // and tables whose names contain `hits`.
        p.query_drop("UPDATE pages SET title = 'Start' WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 1);
        p.query_drop("UPDATE pages SET hits = hits * 2 WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 1);
        p.query_drop("UPDATE hits_ref SET cnt = cnt * 2 WHERE cnt > 5")
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 2);
        p.query_drop("TRUNCATE hits_ref").await.unwrap();
        p.query_drop("REPLACE INTO hits_ref VALUES ('r', 1, NULL)")
            .await
            .unwrap();
        p.query_drop("ALTER TABLE pages ADD extra INT")
            .await
            .unwrap();
        let title: Option<(String, i64)> = p
            .query_first("SELECT title, hits FROM pages WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(title, Some(("Start".into(), 2)));
        // Strings and comments mentioning hits are not table references.
        let s: Option<String> = p
            .query_first("SELECT 'UPDATE hits SET cnt = cnt * 2' /* hits */")
            .await
            .unwrap();
        assert_eq!(s.as_deref(), Some("UPDATE hits SET cnt = cnt * 2"));
        p.disconnect().await.unwrap();
    });
}

/// An upsert whose row MariaDB converts — an over-long or ill-formed value: a warning
/// in a non-strict `sql_mode`, an error in a strict one — runs as sent, so the client
/// gets the plain table's warnings or error and the rows end up as in the plain table.
/// The rewrite's `INSERT IGNORE` of the row would turn the strict error into a warning,
/// and its slot row would warn about the key a second time: the proxy sees the
/// probe's warnings, undoes the rewrite and runs the statement itself. Values that fit
/// still rewrite (slot rows), without warnings.
#[test]
fn upserts_whose_values_convert_run_as_sent() {
    let env = hits_env("convert", false);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let long_note = "a note longer than twenty characters";
        let mut scenario = Vec::new();
        for (mode, row) in [
            ("", "('KEY', 6, NULL)"),
            ("", "('home', 6, 'LONG')"),
            ("", "('new', 6, 'LONG')"),
            ("STRICT_ALL_TABLES", "('new2', 6, 'LONG')"),
            ("STRICT_ALL_TABLES", "('home', 6, 'LONG')"),
            ("STRICT_ALL_TABLES", "('KEY', 6, NULL)"),
        ] {
            let row = row
                .replace("LONG", long_note)
                .replace("KEY", &"k".repeat(80));
            scenario.push(format!("SET sql_mode = '{mode}'"));
            scenario.push(format!(
                "INSERT INTO {{t}} (slug, cnt, note) VALUES {row} ON DUPLICATE KEY UPDATE cnt = cnt + 6"
            ));
        }
        scenario.push("SET sql_mode = DEFAULT".to_string());
        scenario.push("SELECT * FROM {t} ORDER BY slug".to_string());
        let scenario: Vec<&str> = scenario.iter().map(String::as_str).collect();
        let diffs = scenario_diffs_with_errors(&env, &mut p, &mut d, &scenario).await;
        assert!(diffs.is_empty(), "{}", diffs.join("\n"));

        // The binary protocol: an ill-formed key parameter, on a new and on an
        // existing key.
        for c in [&mut p, &mut d] {
            c.query_drop("SET sql_mode = ''").await.unwrap();
        }
        for key in [b"tmp\xff\xfe".to_vec(), b"tmp\xff\xfe".to_vec()] {
            same_exec(
                &env,
                &mut p,
                &mut d,
                "INSERT INTO {t} (slug, cnt) VALUES (?, ?) ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt)",
                (key, 5),
            )
            .await;
        }
        same_text(&env, &mut p, &mut d, "SELECT * FROM {t} ORDER BY slug").await;
        let slot_rows = env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots");
        assert_eq!(slot_rows.as_deref(), Some("0"), "a slot row was kept");

        // Values that fit: rewritten (slot rows), 1 then 2 affected rows, no warning.
        for affected in [1, 2] {
            p.query_drop("INSERT INTO hits (slug, cnt, note) VALUES ('fits', 1, 'short') ON DUPLICATE KEY UPDATE cnt = cnt + 1")
                .await
                .unwrap();
            assert_eq!((p.affected_rows(), p.get_warnings()), (affected, 0));
        }
        assert_eq!(value_of(&mut p, "fits").await, Some(2));
        let slots = env.backend_scalar("SELECT SUM(cnt) FROM {db}.hits_slots WHERE slug = 'fits'");
        assert_eq!(slots.as_deref(), Some("2"), "not rewritten");
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// 6. Query plans

#[test]
fn point_read_uses_both_primary_keys() {
    let env = hits_env("explain", false);
    // Enough rows that a scan would be chosen only if no index applied.
    let mut values = Vec::new();
    for i in 0..300 {
        values.push(format!("('k{i}', {i}, NULL)"));
    }
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES {}; ANALYZE TABLE {}.hits",
        env.db,
        values.join(","),
        env.db
    ));
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        for i in 0..50 {
            p.query_drop(inc_sql(&format!("k{i}"), 1)).await.unwrap();
        }
        p.query_drop(inc_sql("home", 1)).await.unwrap();
        mariadb()
            .exec_async(&format!("ANALYZE TABLE {}.hits_slots", env.db))
            .await
            .unwrap();
        // MariaDB's older spellings explain the same rewritten statement.
        for head in ["EXPLAIN", "EXPLAIN PARTITIONS", "EXPLAIN EXTENDED"] {
            let rows: Vec<Row> = p
                .query(format!("{head} SELECT cnt FROM hits WHERE slug = 'home'"))
                .await
                .unwrap_or_else(|e| panic!("{head}: {e}\n{}", env.proxy.log_text()));
            let plan: Vec<BTreeMap<String, Option<String>>> = rows
                .iter()
                .map(|r| {
                    r.columns_ref()
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let v: Option<String> = r.get(i).and_then(|v: Value| match v {
                                Value::NULL => None,
                                Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                                other => Some(other.as_sql(true)),
                            });
                            (c.name_str().into_owned(), v)
                        })
                        .collect()
                })
                .collect();
            let text = format!("{plan:#?}");
            let get = |row: &BTreeMap<String, Option<String>>, k: &str| -> String {
                row.get(k).cloned().flatten().unwrap_or_default()
            };
            for row in &plan {
                let ty = get(row, "type");
                assert!(
                    ty != "ALL" && ty != "index",
                    "a scan in the plan of a point read:\n{text}"
                );
            }
            assert!(
                plan.iter()
                    .any(|r| get(r, "type") == "const" && get(r, "key") == "PRIMARY"),
                "logical table not read by PRIMARY (const):\n{text}"
            );
            assert!(
                plan.iter().any(|r| get(r, "type") == "ref"
                    && get(r, "key") == "PRIMARY"
                    && get(r, "table").contains("hs_s")),
                "slot table not read by PRIMARY (ref):\n{head}: {text}"
            );
        }
        // The point read through the proxy returns the right value.
        assert_eq!(value_of(&mut p, "home").await, Some(11));
        p.disconnect().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// 7. Concurrency

/// What concurrent workers observed.
#[derive(Default)]
struct Tally {
    /// Acknowledged increments per key index.
    acked: Vec<AtomicU64>,
    /// Statements that completed.
    ops: AtomicU64,
    /// Client-visible errors.
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn new(keys: usize) -> Arc<Tally> {
        Arc::new(Tally {
            acked: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        })
    }

    fn error(&self, what: String) {
        let mut e = self.errors.lock().unwrap();
        if e.len() < 20 {
            e.push(what);
        }
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}

/// One client until `deadline`: increments (text or prepared) of the hot keys, reads,
/// and occasional absolute sets of the key `reset` (which is never incremented).
async fn counter_worker(url: String, worker: usize, deadline: Instant, tally: Arc<Tally>) {
    let mut conn = match Conn::from_url(url.as_str()).await {
        Ok(c) => c,
        Err(e) => {
            tally.error(format!("worker {worker}: connect: {e}"));
            return;
        }
    };
    let prepared = worker % 2 == 1;
    let keys = tally.acked.len();
    let mut n = 0u64;
    while Instant::now() < deadline {
        let pick = rand::random_range(0..100);
        let (kind, r) = if pick < 85 {
            let k = rand::random_range(0..keys);
            let d = rand::random_range(1..=3u64);
            let slug = format!("hot{k}");
            let r = if prepared {
                conn.exec_drop(
                    "UPDATE hits SET cnt = cnt + ? WHERE slug = ?",
                    (d, slug.as_str()),
                )
                .await
            } else {
                conn.query_drop(inc_sql(&slug, d as i64)).await
            };
            if r.is_ok() {
                if conn.affected_rows() != 1 {
                    tally.error(format!(
                        "worker {worker}: increment reported {} rows",
                        conn.affected_rows()
                    ));
                }
                tally.acked[k].fetch_add(d, Ordering::Relaxed);
            }
            (
                if prepared {
                    "prepared increment"
                } else {
                    "increment"
                },
                r,
            )
        } else if pick < 97 {
            let k = rand::random_range(0..keys);
            let r = conn
                .exec_first::<i64, _, _>(
                    "SELECT cnt FROM hits WHERE slug = ?",
                    (format!("hot{k}"),),
                )
                .await
                .map(|v| {
                    if v.is_none() {
                        tally.error(format!("worker {worker}: hot{k} missing"));
                    }
                });
            ("read", r)
        } else {
            let r = conn
                .query_drop(format!(
                    "UPDATE hits SET cnt = {} WHERE slug = 'reset'",
                    rand::random_range(0..1000)
                ))
                .await;
            ("absolute set", r)
        };
        match r {
            Ok(()) => n += 1,
            Err(e) => tally.error(format!("worker {worker}: {kind}: {e}")),
        }
    }
    tally.ops.fetch_add(n, Ordering::Relaxed);
    let _ = conn.disconnect().await;
}

#[test]
fn concurrent_increments_sum_exactly() {
    let env = hits_env("conc", false);
    const KEYS: usize = 10;
    let mut rows: Vec<String> = (0..KEYS).map(|k| format!("('hot{k}', 0, NULL)")).collect();
    rows.push("('reset', 0, NULL)".into());
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES {}",
        env.db,
        rows.join(",")
    ));
    run(Duration::from_secs(40), async {
        let tally = Tally::new(KEYS);
        let deadline = Instant::now() + Duration::from_secs(5);
        let url = env.proxy.url(&env.db);
        let tasks: Vec<_> = (0..64)
            .map(|w| tokio::spawn(counter_worker(url.clone(), w, deadline, tally.clone())))
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let errors = tally.errors();
        assert!(
            errors.is_empty(),
            "client errors:\n{}\n{} lock-conflict retries logged\n--- proxy log (tail) ---\n{}",
            errors.join("\n"),
            env.proxy.log_text().matches("retrying").count(),
            tail(&env.proxy.log_text(), 10)
        );
        let ops = tally.ops.load(Ordering::Relaxed);
        assert!(ops > 500, "only {ops} statements in 5 s");
        let mut p = env.proxied().await;
        for k in 0..KEYS {
            let want = tally.acked[k].load(Ordering::Relaxed) as i64;
            assert_eq!(
                value_of(&mut p, &format!("hot{k}")).await,
                Some(want),
                "hot{k}: value != acknowledged increments"
            );
            let physical = env.backend_scalar(&format!(
                "SELECT h.cnt + COALESCE((SELECT SUM(s.cnt) FROM {{db}}.hits_slots s WHERE s.slug = h.slug), 0) FROM {{db}}.hits h WHERE h.slug = 'hot{k}'"
            ));
            assert_eq!(physical, Some(want.to_string()));
        }
        // The set key holds the last value set, and no slot rows.
        let reset = value_of(&mut p, "reset").await.unwrap();
        assert!((0..1000).contains(&reset), "reset = {reset}");
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'reset'"),
            Some(reset.to_string())
        );
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE slug = 'reset'"),
            Some("0".into())
        );
        eprintln!("concurrent counter: {ops} statements in 5 s, 64 clients");
        p.disconnect().await.unwrap();
    });
}

/// Increments and absolute sets of the same key from many clients. On a plain table
/// they serialise on the row lock; the rewrite must not turn that into errors.
#[test]
fn concurrent_sets_and_increments_of_one_key() {
    let env = hits_env("setinc", false);
    run(Duration::from_secs(30), async {
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let ops = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(3);
        let tasks: Vec<_> = (0..32)
            .map(|w| {
                let url = env.proxy.url(&env.db);
                let errors = errors.clone();
                let ops = ops.clone();
                tokio::spawn(async move {
                    let mut c = connect(&url).await;
                    while Instant::now() < deadline {
                        let (kind, r) = if rand::random_range(0..10) < 8 {
                            ("increment", c.query_drop(inc_sql("home", 1)).await)
                        } else {
                            let sql = format!(
                                "UPDATE hits SET cnt = {} WHERE slug = 'home'",
                                rand::random_range(0..1000)
                            );
                            ("absolute set", c.query_drop(sql).await)
                        };
                        match r {
                            Ok(()) => {
                                ops.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                let mut errs = errors.lock().unwrap();
                                if errs.len() < 10 {
                                    errs.push(format!("{w}: {kind}: {e}"));
                                }
                            }
                        }
                    }
                    let _ = c.disconnect().await;
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let errors = errors.lock().unwrap().clone();
        assert!(
            errors.is_empty(),
            "client errors ({} statements succeeded):\n{}",
            ops.load(Ordering::Relaxed),
            errors.join("\n")
        );
    });
}

#[test]
fn concurrent_global_counter() {
    let rule = Rule::counter(RULE, "total")
        .key(&[])
        .columns(&["n"])
        .slot_table("total_slots");
    let env = Env::builder("ctr_global")
        .schema(
            "CREATE TABLE total (id INT PRIMARY KEY, n BIGINT NOT NULL);
             CREATE TABLE total_ref LIKE total;
             INSERT INTO total VALUES (1, 100);
             INSERT INTO total_ref VALUES (1, 100);",
        )
        .rule("counter.toml", rule.toml())
        .migrate()
        .start();
    let db = env.db.as_str();
    run(Duration::from_secs(40), async {
        // Same shapes as a plain table first.
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let templates = [
            "UPDATE {t} SET n = n + 1",
            "SELECT * FROM {t}",
            "SELECT n FROM {t}",
            "SELECT t.n AS total FROM {t} t",
        ];
        assert_same_as_ref(&env, &mut p, &mut d, "total", &templates).await;
        // A WHERE on a keyless counter is refused, not forwarded to the base row.
        match p
            .query_drop("UPDATE total SET n = n + 1 WHERE id = 1")
            .await
        {
            Err(mysql_async::Error::Server(e)) => {
                assert_eq!(e.code, 1105, "{e:?}");
                assert!(
                    e.message.contains(&format!("heatsink rule '{RULE}'")),
                    "{e:?}"
                );
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        p.query_drop("UPDATE total SET n = 100").await.unwrap();
        assert_eq!(
            mariadb().query_strings(&format!("SELECT COUNT(*) FROM {db}.total_slots")),
            vec![vec![Some("0".to_string())]]
        );
        let acked = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let deadline = Instant::now() + Duration::from_secs(3);
        let tasks: Vec<_> = (0..64)
            .map(|w| {
                let url = env.url();
                let acked = acked.clone();
                let errors = errors.clone();
                tokio::spawn(async move {
                    let mut c = match Conn::from_url(url.as_str()).await {
                        Ok(c) => c,
                        Err(e) => {
                            errors.lock().unwrap().push(format!("{w}: connect: {e}"));
                            return;
                        }
                    };
                    while Instant::now() < deadline {
                        let r = if w % 2 == 0 {
                            c.query_drop("UPDATE total SET n = n + 1").await
                        } else {
                            c.exec_drop("UPDATE total SET n = n + ?", (1,)).await
                        };
                        match r {
                            Ok(()) => {
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                errors.lock().unwrap().push(format!("{w}: {e}"));
                            }
                        }
                    }
                    let _ = c.disconnect().await;
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let errors = errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "client errors: {errors:?}");
        let acked = acked.load(Ordering::Relaxed) as i64;
        assert!(acked > 100, "only {acked} increments");
        let n: Option<i64> = p.query_first("SELECT n FROM total").await.unwrap();
        assert_eq!(n, Some(100 + acked));
        let (id, n2): (i64, i64) = p
            .exec_first("SELECT * FROM total", ())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((id, n2), (1, 100 + acked));
        eprintln!("global counter: {acked} increments in 3 s, 64 clients");
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// 8. Switching the rule on while another proxy runs without it

#[test]
fn rule_on_and_off_proxies_share_one_database() {
    let env = hits_env("switch", false);
    let plain = Proxy::start();
    const KEYS: usize = 10;
    let rows: Vec<String> = (0..KEYS).map(|k| format!("('hot{k}', 0, NULL)")).collect();
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES {}",
        env.db,
        rows.join(",")
    ));
    run(Duration::from_secs(50), async {
        let on = Tally::new(KEYS);
        let off = Tally::new(KEYS);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tasks = Vec::new();
        for w in 0..64 {
            let (url, tally) = if w % 2 == 0 {
                (env.proxy.url(&env.db), on.clone())
            } else {
                (plain.url(&env.db), off.clone())
            };
            tasks.push(tokio::spawn(async move {
                let mut c = match Conn::from_url(url.as_str()).await {
                    Ok(c) => c,
                    Err(e) => {
                        tally.error(format!("{w}: connect: {e}"));
                        return;
                    }
                };
                while Instant::now() < deadline {
                    let k = rand::random_range(0..KEYS);
                    let d = rand::random_range(1..=3u64);
                    let r = if w % 4 < 2 {
                        c.query_drop(inc_sql(&format!("hot{k}"), d as i64)).await
                    } else {
                        c.exec_drop(
                            "UPDATE hits SET cnt = cnt + ? WHERE slug = ?",
                            (d, format!("hot{k}")),
                        )
                        .await
                    };
                    match r {
                        Ok(()) => {
                            tally.acked[k].fetch_add(d, Ordering::Relaxed);
                            tally.ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => tally.error(format!("{w}: {e}")),
                    }
                }
                let _ = c.disconnect().await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        for (name, t) in [("rule on", &on), ("rule off", &off)] {
            let errors = t.errors();
            assert!(errors.is_empty(), "{name}: client errors: {errors:?}");
            assert!(t.ops.load(Ordering::Relaxed) > 100, "{name}: too few");
        }
        let mut a = env.proxied().await;
        let mut b = connect(&plain.url(&env.db)).await;
        for k in 0..KEYS {
            let slug = format!("hot{k}");
            let on_k = on.acked[k].load(Ordering::Relaxed) as i64;
            let off_k = off.acked[k].load(Ordering::Relaxed) as i64;
            assert_eq!(
                value_of(&mut a, &slug).await,
                Some(on_k + off_k),
                "{slug}: read through the rule's proxy"
            );
            // The proxy without the rule sees only the base: the rule-off increments.
            let base: Option<i64> = b
                .exec_first("SELECT cnt FROM hits WHERE slug = ?", (slug.as_str(),))
                .await
                .unwrap();
            assert_eq!(base, Some(off_k), "{slug}: base");
        }
        eprintln!(
            "switch: {} increments with the rule, {} without, in 10 s",
            on.ops.load(Ordering::Relaxed),
            off.ops.load(Ordering::Relaxed)
        );
        a.disconnect().await.unwrap();
        b.disconnect().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------------
// Connection context

/// An unqualified rule serves several databases through one proxy: each database's
/// reads carry its own column metadata (schema name).
#[test]
fn one_proxy_serves_the_rule_in_two_databases() {
    let env = hits_env("twodb_a", false);
    let second = "ctr_twodb_b";
    create_hits_db(second);
    run(Duration::from_secs(30), async {
        let mut p = env.proxied().await;
        // Teach the rule the first database's table.
        p.query_drop(inc_sql("home", 1)).await.unwrap();
        p.disconnect().await.unwrap();
        let mut p2 = connect(&env.proxy.url(second)).await;
        let mut d2 = connect(&mariadb().url(second)).await;
        for sql in [
            "UPDATE {t} SET cnt = cnt + 1 WHERE slug = 'home'",
            "SELECT * FROM {t} ORDER BY slug",
            "SELECT cnt FROM {t} WHERE slug = 'home'",
        ] {
            let ps = fill(sql, "hits", second);
            let ds = fill(sql, "hits_ref", second);
            let po = run_text(&mut p2, &ps).await.unwrap();
            let dout = run_text(&mut d2, &ds)
                .await
                .unwrap()
                .renamed("hits_ref", "hits");
            assert_eq!(po, dout, "{ps} (database {second})");
        }
    });
}

/// A client without a default database names the table with its database.
#[test]
#[ignore = "known limitation (rules/README.md): a rule without a database needs a default database; without one the statement gets a clear 1105"]
fn no_default_database() {
    let env = hits_env("nodb", false);
    run(Duration::from_secs(30), async {
        let mut p = connect(&env.proxy.url("")).await;
        let db = env.db.clone();
        p.query_drop(format!(
            "UPDATE {db}.hits SET cnt = cnt + 1 WHERE slug = 'home'"
        ))
        .await
        .unwrap_or_else(|e| panic!("increment without a default database: {e}"));
        let v: Option<i64> = p
            .query_first(format!("SELECT cnt FROM {db}.hits WHERE slug = 'home'"))
            .await
            .unwrap();
        assert_eq!(v, Some(11));
        assert_eq!(
            env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'home'"),
            Some("10".into())
        );
    });
}
