//! `SHOW DIGESTS` / `RESET DIGESTS` on the admin port and the digest summary on
//! `/metrics`, end to end against the real MariaDB: counts, latency, rows sent and
//! affected, error codes, handling per rule kind (passthrough, rewritten, refused),
//! hot keys on a skewed workload, prepared statements over the binary protocol,
//! eviction at a small table size, digests off — and the fingerprints' grouping
//! against MariaDB's own statement digests in `performance_schema`.
//!
//! This binary's MariaDB runs with `performance_schema` on
//! ([`common::mariadb_pfs`]); each test has its own database
//! (`dg_<name>`) and proxy.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::client::{assert_refused_by, connect, run, run_exec, run_text};
use common::fixture::{counter_rule, Env};
use common::sample;
use mysql_async::prelude::*;
use mysql_async::{Conn, Row, Value};

const LIMIT: Duration = Duration::from_secs(180);
const COUNTER: &str = "page_hits";
const ADMIN_PW: &str = "adm-pw";

/// The columns of `SHOW DIGESTS`, in order (the row contract).
const COLUMNS: [&str; 19] = [
    "digest",
    "schema_name",
    "user",
    "digest_text",
    "count_star",
    "first_seen",
    "last_seen",
    "sum_time_us",
    "min_time_us",
    "max_time_us",
    "p99_time_us",
    "rows_sent",
    "rows_affected",
    "errors",
    "error_codes",
    "handling",
    "rule",
    "hot_keys",
    "prepares",
];

fn admin_url(addr: SocketAddr) -> String {
    format!("mysql://admin:{ADMIN_PW}@{addr}/?prefer_socket=false")
}

/// One row of `SHOW DIGESTS`, by column name (NULL as `None`).
#[derive(Debug, Clone)]
struct Digest(HashMap<String, Option<String>>);

impl Digest {
    fn s(&self, col: &str) -> &str {
        self.0
            .get(col)
            .unwrap_or_else(|| panic!("no column {col}"))
            .as_deref()
            .unwrap_or("NULL")
    }

    fn n(&self, col: &str) -> u64 {
        self.s(col)
            .parse()
            .unwrap_or_else(|_| panic!("{col} of {self:?}"))
    }

    fn text(&self) -> &str {
        self.s("digest_text")
    }
}

async fn digests(admin: &mut Conn, command: &str) -> Vec<Digest> {
    let mut result = admin
        .query_iter(command)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    let cols: Vec<String> = result
        .columns()
        .map(|cols| cols.iter().map(|c| c.name_str().into_owned()).collect())
        .unwrap_or_default();
    assert_eq!(cols, COLUMNS, "{command}");
    let rows: Vec<Row> = result.collect().await.expect("rows");
    let rows: Vec<Digest> = rows
        .into_iter()
        .map(|r| {
            Digest(
                cols.iter()
                    .cloned()
                    .zip(r.unwrap().into_iter().map(|v| match v {
                        Value::NULL => None,
                        Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                        other => Some(other.as_sql(true)),
                    }))
                    .collect(),
            )
        })
        .collect();
    for d in &rows {
        assert_eq!(d.s("digest").len(), 16, "{d:?}");
        assert!(
            d.s("digest").bytes().all(|b| b.is_ascii_hexdigit()),
            "{d:?}"
        );
        for t in ["first_seen", "last_seen"] {
            assert_eq!(d.s(t).len(), 19, "{d:?}");
        }
        assert!(d.s("first_seen") <= d.s("last_seen"), "{d:?}");
        assert!(d.n("min_time_us") <= d.n("p99_time_us"), "{d:?}");
        assert!(d.n("p99_time_us") <= d.n("max_time_us"), "{d:?}");
        assert!(d.n("max_time_us") <= d.n("sum_time_us"), "{d:?}");
        assert!(
            ["passthrough", "rewritten", "fallback", "refused", "shadow"]
                .contains(&d.s("handling")),
            "{d:?}"
        );
    }
    rows
}

/// The row of `text` for the test user in `db`.
fn row<'a>(rows: &'a [Digest], db: &str, text: &str) -> &'a Digest {
    let found: Vec<&Digest> = rows
        .iter()
        .filter(|d| d.text() == text && d.s("schema_name") == db && d.s("user") == "hs")
        .collect();
    assert_eq!(found.len(), 1, "{text}: {rows:#?}");
    found[0]
}

fn metric(env: &Env, series: &str) -> f64 {
    let (status, body) = common::http_get(env.metrics_addr(), "/metrics");
    assert_eq!(status, 200, "{body}");
    sample(&body, series).unwrap_or(0.0)
}

/// The `"top"` pairs of a hot_keys JSON, parsed by hand: `[["v",n],…]`.
fn hot_top(json: &str) -> Vec<(String, u64)> {
    let top = json.split("\"top\":[").nth(1).expect("top");
    top.trim_end_matches("]}")
        .split("],[")
        .map(|p| {
            let p = p.trim_matches(|c| c == '[' || c == ']');
            let (v, n) = p.rsplit_once(',').expect("a pair");
            (v.trim_matches('"').to_string(), n.parse().expect("a count"))
        })
        .collect()
}

fn hot_distinct(json: &str) -> u64 {
    json.split("\"distinct\":")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .expect("distinct")
}

#[test]
fn digests_of_all_traffic() {
    common::mariadb_pfs();
    let db = "dg_traffic";
    let env = Env::builder(db)
        .schema(
            "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0); \
             INSERT INTO hits VALUES ('home', 10), ('about', 3); \
             CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(32) NOT NULL); \
             INSERT INTO items SELECT seq, CONCAT('item', seq) FROM seq_1_to_100;",
        )
        .rule("hits.toml", counter_rule(COUNTER))
        .migrate()
        .metrics()
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;

        // Text protocol point reads: 5 rows, each compared with MariaDB's answer.
        for id in [3, 9, 27, 81, 500] {
            let sql = format!("SELECT name FROM items WHERE id = {id}");
            let proxied = run_text(&mut p, &sql).await.unwrap();
            assert_eq!(proxied, run_text(&mut d, &sql).await.unwrap(), "{sql}");
        }
        // Binary protocol: the same digest (MariaDB's digest of a prepared
        // statement is its text with `?`), 3 more executes, 2 more rows.
        for id in [1i64, 2, 1000] {
            let sql = "SELECT name FROM items WHERE id = ?";
            let proxied = run_exec(&mut p, sql, (id,)).await.unwrap();
            assert_eq!(proxied, run_exec(&mut d, sql, (id,)).await.unwrap());
        }
        // Writes: rows affected, then a duplicate key (1062) and a missing table (1146).
        let mut affected = 0;
        for sql in [
            "UPDATE items SET name = 'x' WHERE id <= 3",
            "UPDATE items SET name = 'y' WHERE id <= 2",
        ] {
            let proxied = run_text(&mut p, sql).await.unwrap();
            affected += proxied.affected_rows;
        }
        assert_eq!(affected, 5);
        for (sql, code) in [
            ("INSERT INTO items VALUES (1, 'dup')", 1062),
            ("SELECT * FROM no_such_table", 1146),
        ] {
            for conn in [&mut p, &mut d] {
                match conn.query_drop(sql).await {
                    Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, code, "{sql}"),
                    other => panic!("{sql}: {other:?}"),
                }
            }
        }
        // A ruled table: rewritten (counter increments), refused.
        for _ in 0..2 {
            let sql = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'";
            let proxied = run_text(&mut p, sql).await.unwrap();
            assert_eq!(proxied.affected_rows, 1);
        }
        assert_refused_by(
            &mut p,
            "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'",
            COUNTER,
        )
        .await;

        let rows = digests(&mut admin, "SHOW DIGESTS").await;
        let read = row(&rows, db, "SELECT name FROM items WHERE id = ?");
        assert_eq!(read.n("count_star"), 8, "{read:?}");
        // The client prepared it once (its statement cache) for its three executes.
        assert_eq!(read.n("prepares"), 1, "{read:?}");
        assert_eq!(read.n("rows_sent"), 6, "{read:?}");
        assert_eq!((read.n("errors"), read.s("error_codes")), (0, ""));
        assert_eq!(
            (read.s("handling"), read.s("rule")),
            ("passthrough", "NULL")
        );
        assert!(read.n("sum_time_us") > 0, "{read:?}");
        let hot = read.s("hot_keys");
        assert!(hot.starts_with("{\"column\":\"id\",\"distinct\":"), "{hot}");
        let top = hot_top(hot);
        assert_eq!(top.len(), 8, "{hot}");
        assert!(top.iter().all(|(_, n)| *n == 1), "{hot}");
        for v in ["3", "500", "1", "1000"] {
            assert!(top.iter().any(|(t, _)| t == v), "{v}: {hot}");
        }

        let upd = row(&rows, db, "UPDATE items SET name = ? WHERE id <= ?");
        assert_eq!((upd.n("count_star"), upd.n("rows_affected")), (2, 5));
        assert_eq!(upd.n("prepares"), 0);
        assert_eq!((upd.n("rows_sent"), upd.s("hot_keys")), (0, "NULL"));
        let dup = row(&rows, db, "INSERT INTO items VALUES (...)");
        assert_eq!((dup.n("errors"), dup.s("error_codes")), (1, "1062:1"));
        let missing = row(&rows, db, "SELECT * FROM no_such_table");
        assert_eq!(
            (missing.n("errors"), missing.s("error_codes")),
            (1, "1146:1")
        );

        let inc = row(&rows, db, "UPDATE hits SET cnt = cnt + ? WHERE slug = ?");
        assert_eq!((inc.s("handling"), inc.s("rule")), ("rewritten", COUNTER));
        assert_eq!((inc.n("count_star"), inc.n("rows_affected")), (2, 2));
        assert!(inc.s("hot_keys").contains("[\"home\",2]"), "{inc:?}");
        let refused = row(&rows, db, "UPDATE hits SET cnt = cnt * ? WHERE slug = ?");
        assert_eq!(
            (refused.s("handling"), refused.s("rule")),
            ("refused", COUNTER)
        );
        assert_eq!(refused.s("error_codes"), "1105:1");

        // ORDER BY and LIMIT.
        let by_count = digests(&mut admin, "SHOW DIGESTS ORDER BY count_star DESC LIMIT 2").await;
        assert_eq!(by_count.len(), 2);
        assert!(by_count[0].n("count_star") >= by_count[1].n("count_star"));
        let all = digests(&mut admin, "SHOW DIGESTS ORDER BY count_star").await;
        assert!(all
            .windows(2)
            .all(|w| w[0].n("count_star") <= w[1].n("count_star")));
        assert_eq!(
            all.last().unwrap().n("count_star"),
            by_count[0].n("count_star")
        );
        for col in ["sum_time_us", "p99_time_us", "errors", "last_seen"] {
            let r = digests(
                &mut admin,
                &format!("SHOW DIGESTS ORDER BY {col} DESC LIMIT 3"),
            )
            .await;
            assert!(r.len() <= 3);
            assert!(r
                .windows(2)
                .all(|w| w[0].s(col) >= w[1].s(col) || col != "last_seen"));
        }

        // /metrics: totals by handling, rows, no digest text in labels.
        assert!(
            metric(
                &env,
                "heatsink_digest_statements_total{handling=\"rewritten\"}"
            ) >= 2.0
        );
        assert!(
            metric(
                &env,
                "heatsink_digest_statements_total{handling=\"refused\"}"
            ) >= 1.0
        );
        assert!(metric(&env, "heatsink_digests") >= 7.0);
        assert!(metric(&env, "heatsink_digest_top_count{rank=\"1\"}") >= 1.0);
        // /digests: the JSON dump with the same keys.
        let (status, body) = common::http_get(env.metrics_addr(), "/digests");
        assert_eq!(status, 200);
        assert!(body.trim_start().starts_with('['), "{body}");
        for col in COLUMNS {
            assert!(body.contains(&format!("\"{col}\":")), "{col}: {body}");
        }

        // RESET DIGESTS.
        admin.query_drop("RESET DIGESTS").await.unwrap();
        assert!(digests(&mut admin, "SHOW DIGESTS").await.is_empty());
        p.query_drop("SELECT name FROM items WHERE id = 7")
            .await
            .unwrap();
        let rows = digests(&mut admin, "SHOW DIGESTS").await;
        assert_eq!(
            row(&rows, db, "SELECT name FROM items WHERE id = ?").n("count_star"),
            1
        );
    });
}

/// COM_STMT_PREPARE is counted in its digest's `prepares` (refused prepares too);
/// executes refused at COM_STMT_EXECUTE count as refused; a COM_QUERY of several
/// statements is one digest (docs/design.md, "Query digests").
#[test]
fn prepares_executes_refused_at_execute_and_multi_statement_queries() {
    let db = "dg_prepares";
    let env = Env::builder(db)
        .schema(
            "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0); \
             INSERT INTO hits VALUES ('home', 10), ('about', 3); \
             CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(32) NOT NULL); \
             INSERT INTO items SELECT seq, CONCAT('item', seq) FROM seq_1_to_100;",
        )
        .rule("hits.toml", counter_rule(COUNTER))
        .migrate()
        .metrics()
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let read = "SELECT name FROM items WHERE id = ?";
        // Prepared three times, once executed each; and once for four executes.
        for id in [1i64, 2, 3] {
            for c in [&mut p, &mut d] {
                let stmt = c.prep(read).await.unwrap();
                let name: Option<String> = c.exec_first(&stmt, (id,)).await.unwrap();
                assert_eq!(name, Some(format!("item{id}")));
                c.close(stmt).await.unwrap();
            }
        }
        let other = "SELECT id FROM items WHERE name = ?";
        let stmt = p.prep(other).await.unwrap();
        for k in 0..4 {
            let _: Vec<i64> = p.exec(&stmt, (format!("item{k}"),)).await.unwrap();
        }
        p.close(stmt).await.unwrap();
        // A counter's increment: rewritten once, refused twice at execute (a key
        // longer than the column).
        let inc = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?";
        let stmt = p.prep(inc).await.unwrap();
        p.exec_drop(&stmt, (1, "home")).await.unwrap();
        for _ in 0..2 {
            match p.exec_drop(&stmt, (1, "k".repeat(80))).await {
                Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1105, "{e:?}"),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        p.close(stmt).await.unwrap();
        // A prepare the counter refuses: a prepare, no execute.
        assert!(p
            .prep("UPDATE hits SET cnt = cnt * ? WHERE slug = ?")
            .await
            .is_err());
        // Several statements in one COM_QUERY: one digest, as the proxy sees one
        // client statement; the results are MariaDB's.
        let multi = "SELECT name FROM items WHERE id = 5; UPDATE items SET name = 'z' WHERE id = 6";
        for c in [&mut p, &mut d] {
            let mut r = c.query_iter(multi).await.unwrap();
            let names: Vec<String> = r.collect().await.unwrap();
            assert_eq!(names, ["item5"]);
            r.drop_result().await.unwrap();
            let name: Option<String> = c
                .query_first("SELECT name AS changed FROM items WHERE id = 6")
                .await
                .unwrap();
            assert_eq!(name.as_deref(), Some("z"));
        }

        let rows = digests(&mut admin, "SHOW DIGESTS").await;
        let r = row(&rows, db, read);
        assert_eq!(
            (r.n("prepares"), r.n("count_star"), r.n("rows_sent")),
            (3, 3, 3)
        );
        let o = row(&rows, db, other);
        assert_eq!((o.n("prepares"), o.n("count_star")), (1, 4));
        let i = row(&rows, db, inc);
        assert_eq!((i.n("prepares"), i.n("count_star")), (1, 3), "{i:?}");
        assert_eq!(
            (i.s("handling"), i.s("rule"), i.s("error_codes")),
            ("refused", COUNTER, "1105:2")
        );
        let refused = row(&rows, db, "UPDATE hits SET cnt = cnt * ? WHERE slug = ?");
        assert_eq!((refused.n("prepares"), refused.n("count_star")), (1, 0));
        let m = row(
            &rows,
            db,
            "SELECT name FROM items WHERE id = ? ; UPDATE items SET name = ? WHERE id = ?",
        );
        assert_eq!((m.n("count_star"), m.n("prepares")), (1, 0), "{m:?}");
        assert_eq!((m.n("rows_sent"), m.n("rows_affected")), (1, 1), "{m:?}");

        let by = digests(&mut admin, "SHOW DIGESTS ORDER BY prepares DESC LIMIT 1").await;
        assert_eq!(by[0].text(), read);
        let (status, body) = common::http_get(env.metrics_addr(), "/digests");
        assert_eq!(status, 200);
        assert!(body.contains("\"prepares\":3}"), "{body}");
    });
}

#[test]
fn hot_keys_of_a_skewed_workload() {
    common::mariadb_pfs();
    let db = "dg_hot";
    let env = Env::builder(db)
        .schema(
            "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(32) NOT NULL); \
             INSERT INTO items SELECT seq, CONCAT('item', seq) FROM seq_1_to_200;",
        )
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        // 1000 reads: key 42 for 40 % of them, the rest spread over 150 keys; half
        // over the text protocol, half prepared.
        let mut hot = 0;
        for i in 0..1000u64 {
            let id = if i % 5 < 2 {
                hot += 1;
                42
            } else {
                (i * 7919) % 150 + 50
            };
            if i % 2 == 0 {
                p.query_drop(format!("SELECT name FROM items WHERE id = {id}"))
                    .await
                    .unwrap();
            } else {
                p.exec_drop("SELECT name FROM items WHERE id = ?", (id,))
                    .await
                    .unwrap();
            }
        }
        let rows = digests(&mut admin, "SHOW DIGESTS").await;
        let read = row(&rows, db, "SELECT name FROM items WHERE id = ?");
        assert_eq!((read.n("count_star"), read.n("rows_sent")), (1000, 1000));
        let json = read.s("hot_keys");
        let top = hot_top(json);
        assert!(top.len() <= 8, "{json}");
        assert_eq!(top[0].0, "42", "{json}");
        // Space-Saving overestimates by at most the smallest counter.
        assert!(
            top[0].1 >= hot && top[0].1 <= hot + 1000 / 12,
            "{hot}: {json}"
        );
        let distinct = hot_distinct(json);
        assert!((100..=220).contains(&distinct), "{distinct}: {json}");
    });
}

#[test]
fn a_small_table_evicts_and_zero_turns_digests_off() {
    common::mariadb_pfs();
    let db = "dg_small";
    let env = Env::builder(db)
        .schema("CREATE TABLE t (id INT PRIMARY KEY);")
        .arg("--digest-table-size")
        .arg("3")
        .metrics()
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        for i in 0..20 {
            p.query_drop(format!("SELECT id AS c{i} FROM t"))
                .await
                .unwrap();
        }
        let rows = digests(&mut admin, "SHOW DIGESTS").await;
        assert_eq!(rows.len(), 3, "{rows:#?}");
        // The most recent statement is kept.
        row(&rows, db, "SELECT id AS c19 FROM t");
        assert!(metric(&env, "heatsink_digests_evicted_total") >= 17.0);
        assert_eq!(metric(&env, "heatsink_digests_capacity"), 3.0);
    });
    let off = Env::builder("dg_off")
        .schema("CREATE TABLE t (id INT PRIMARY KEY);")
        .arg("--digest-table-size")
        .arg("0")
        .admin(ADMIN_PW)
        .start();
    run(LIMIT, async {
        let mut p = off.proxied().await;
        let mut admin = connect(&admin_url(off.admin_addr())).await;
        p.query_drop("SELECT * FROM t").await.unwrap();
        assert!(digests(&mut admin, "SHOW DIGESTS").await.is_empty());
    });
}

/// Statements whose grouping heatsink's digest shares with MariaDB's: each one's
/// heatsink digest and MariaDB's `performance_schema` digest are compared, pairwise
/// (same heatsink digest iff same MariaDB digest), and their texts' shapes.
const CORPUS: &[&str] = &[
    "SELECT * FROM t WHERE id = 1",
    "select * from t where id=2",
    "SELECT * FROM t WHERE id = 'x'",
    "SELECT * FROM t WHERE id = NULL",
    "SELECT * FROM t WHERE id = -1",
    "SELECT * FROM t WHERE id = - 7",
    "SELECT * FROM t WHERE id IN (1,2,3)",
    "SELECT * FROM t WHERE id IN (4, 5)",
    "SELECT * FROM t WHERE id IN (-1, -2, 'z')",
    "SELECT * FROM t WHERE id IN (1)",
    "SELECT * FROM t WHERE id IN (-9)",
    "SELECT /* a comment */ * FROM t WHERE id = 3 -- trailing\n",
    "SELECT * FROM t WHERE id = 4 # hash comment",
    "SELECT /*+ MAX_EXECUTION_TIME(1000) */ * FROM t WHERE id = 5",
    "SELECT * FROM `t` WHERE `a` = 6",
    "SELECT * FROM t WHERE a = 8",
    "SELECT b FROM t WHERE b = 'it''s'",
    "SELECT b FROM t WHERE b = 'a\\'b\\\\c'",
    "SELECT b FROM t WHERE b = \"dq\"",
    "SELECT b FROM t WHERE b IS NULL",
    "SELECT b FROM t WHERE b IS NOT NULL",
    "SELECT a - 1 FROM t",
    "SELECT a-2 FROM t",
    "SELECT -a FROM t",
    "SELECT 1",
    "SELECT +1",
    "SELECT -1.5e3",
    "SELECT 1, 2, 3",
    "SELECT 1, 'a', NULL, 0x1F, .5, b'101'",
    "SELECT NULL, TRUE, FALSE",
    "SELECT 1 + -1",
    "SELECT (1)",
    "SELECT (1, 2) = (3, 4)",
    "INSERT INTO t VALUES (10, 2, 'x', 1.5)",
    "INSERT INTO t VALUES (11, -2, 'y', -2.5), (12, 3, 'z', 2.5)",
    "INSERT INTO t VALUES (13, 2, 'x', 1.5), (14, 3, 'y', 2.5), (15, 4, 'w', 3.5)",
    "INSERT INTO t (id) VALUES (16)",
    "INSERT INTO t (id) VALUES (17), (18)",
    "INSERT INTO t (id, a) VALUES (19, 2) ON DUPLICATE KEY UPDATE a = a + 1",
    "UPDATE t SET a = a + 1, b = NULL WHERE id = 5",
    "DELETE FROM t WHERE id IN (100, 101) AND b = 'z'",
    "SELECT * FROM t WHERE (id, a) IN ((1, 2), (3, 4))",
    "SELECT COUNT(*) FROM t WHERE a IN (SELECT a FROM t WHERE id IN (1, 2))",
    "SELECT * FROM t WHERE id BETWEEN 1 AND 2 ORDER BY 1 DESC LIMIT 10",
    "SELECT * FROM t LIMIT 10, 5",
    "SELECT CASE WHEN a = 1 THEN 'x' ELSE 'y' END FROM t",
    "SELECT NOT 1, NOT -1",
    "SELECT * FROM t WHERE c <> -2.5e-3 AND c != 1",
    "SELECT * FROM t t1 JOIN t t2 ON t1.id = t2.a WHERE t1.id = 5",
    "SELECT @v, @@version",
    "SELECT /*!50000 1, */ 2",
    "SELECT _utf8mb4'x', N'y'",
    "SELECT x'1F'",
];

/// Pairs of statements where heatsink's grouping is known to differ from MariaDB's
/// (see docs/design.md), with whether heatsink groups them: adjacent strings
/// MariaDB keeps apart (heatsink reads one literal), words MariaDB treats as
/// keywords in any case that heatsink keeps as written (a function's name), and a
/// column whose name is a MariaDB keyword (`id` is `ID`, `` `id` `` a name).
const KNOWN_DIFFERENT: &[(&str, &str, bool)] = &[
    ("SELECT 'a' 'b'", "SELECT 'a'", true),
    ("SELECT count(*) FROM t", "SELECT COUNT(*) FROM t", false),
    (
        "SELECT * FROM t WHERE id = 1",
        "SELECT * FROM `t` WHERE `id` = 1",
        true,
    ),
];

/// A digest text's shape for comparison: backticks and spaces gone, uppercase.
fn shape(text: &str) -> String {
    text.replace(['`', ' '], "").to_uppercase()
}

#[test]
fn fingerprints_group_as_mariadb_digests() {
    common::mariadb_pfs();
    let db = "dg_corpus";
    let env = Env::builder(db)
        .schema("CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(20), c DOUBLE);")
        .admin(ADMIN_PW)
        .start();
    let server = common::mariadb();
    server.exec(
        "UPDATE performance_schema.setup_consumers SET ENABLED = 'YES' \
         WHERE NAME IN ('events_statements_current', 'events_statements_history')",
    );
    run(LIMIT, async {
        let mut p = env.proxied().await;
        let id = p.id();
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        let mut root = connect(&server.admin_url("")).await;
        let mut seen = Vec::new();
        let all: Vec<&str> = CORPUS
            .iter()
            .copied()
            .chain(KNOWN_DIFFERENT.iter().flat_map(|(a, b, _)| [*a, *b]))
            .collect();
        for sql in &all {
            admin.query_drop("RESET DIGESTS").await.unwrap();
            // Errors (duplicate keys on a second run) still have digests.
            let _ = p.query_drop(*sql).await;
            // The session records a statement's digest just after it has sent the
            // answer: wait for it.
            let mut rows = Vec::new();
            for _ in 0..200 {
                rows = digests(&mut admin, "SHOW DIGESTS").await;
                if rows.iter().any(|d| d.s("schema_name") == db) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let ours: Vec<&Digest> = rows.iter().filter(|d| d.s("schema_name") == db).collect();
            assert_eq!(ours.len(), 1, "{sql}: {rows:#?}");
            // The server records a statement's event when it is done with it, which
            // may be just after the client has its answer: wait for this one.
            let mut found = None;
            for _ in 0..200 {
                let theirs: Vec<(String, String, String)> = root
                    .query(format!(
                        "SELECT h.DIGEST, h.DIGEST_TEXT, h.SQL_TEXT \
                         FROM performance_schema.events_statements_history h \
                         JOIN performance_schema.threads t USING (THREAD_ID) \
                         WHERE t.PROCESSLIST_ID = {id} ORDER BY h.EVENT_ID DESC LIMIT 1"
                    ))
                    .await
                    .unwrap();
                if let Some((d, t, text)) = theirs.into_iter().next() {
                    // (Its text as the server keeps it: trailing space and newline go.)
                    let squash = |s: &str| s.split_whitespace().collect::<String>();
                    if !text.is_empty() && squash(sql).starts_with(&squash(&text)) {
                        found = Some((d, t));
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let (maria_digest, maria_text) =
                found.unwrap_or_else(|| panic!("no performance_schema event for {sql:?}"));
            seen.push((
                *sql,
                ours[0].s("digest").to_string(),
                ours[0].text().to_string(),
                maria_digest,
                maria_text,
            ));
        }
        // Shapes: the same once spelling differences are set aside (MariaDB quotes
        // identifiers and spaces every token; it writes some words its own way).
        let corpus = &seen[..CORPUS.len()];
        for (sql, _, ours, _, theirs) in corpus {
            let theirs = theirs.trim().replace("SQL_TSI_", "");
            assert_eq!(shape(ours), shape(&theirs), "{sql}");
        }
        // Grouping: pairwise, same heatsink digest iff same MariaDB digest.
        let mut groups = 0;
        let mut wrong = Vec::new();
        for (i, a) in corpus.iter().enumerate() {
            for b in &corpus[i + 1..] {
                let ours = a.1 == b.1;
                let theirs = a.3 == b.3;
                if ours != theirs {
                    wrong.push(format!("{a:?}\n{b:?}"));
                }
                groups += usize::from(ours);
            }
        }
        assert!(
            wrong.is_empty(),
            "grouped differently:\n{}",
            wrong.join("\n\n")
        );
        assert!(
            groups >= 10,
            "the corpus has statements that group: {groups}"
        );
        // The known differences are still differences (or the docs are stale).
        let known = &seen[CORPUS.len()..];
        for (pair, (_, _, grouped)) in known.chunks(2).zip(KNOWN_DIFFERENT) {
            assert_eq!(pair[0].1 == pair[1].1, *grouped, "heatsink: {pair:?}");
            assert_eq!(pair[0].3 == pair[1].3, !*grouped, "MariaDB: {pair:?}");
        }
    });
}
