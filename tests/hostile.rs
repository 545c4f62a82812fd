//! A hostile client against the rewrite path, end to end: statements nested far
//! deeper than any application writes, cursor executes of rewritten reads, and a
//! rewritten binary read that fails half way. Each must leave the proxy running and
//! the connection in step (the next command gets its own answer).
//!
//! Every test has its own database (`hostile_<name>`) and proxy with the counter rule
//! on `hits(slug, cnt)`.

mod common;

use std::time::Duration;

use common::client::{connect, run, run_text};
use common::fixture::{counter_rule, counter_value, create_counter_db, Env};
use common::packets::{parse_err, text_rows, Packet};
use common::rawclient::{ConnectOpts, RawClient, RawParam};
use common::{mariadb, PASSWORD, USER};
use mysql_async::prelude::*;
use mysql_async::Conn;

const RULE: &str = "page_hits";
const ADMIN_PW: &str = "admin-pw";

/// Database `hostile_<name>` with the counter fixture and its reference twin
/// `hits_ref`, and a proxy with the counter rule and an admin port.
fn start_env(name: &str) -> Env {
    let db = format!("hostile_{name}");
    create_counter_db(&db, "", "('a', 1), ('home', 10), ('z', 26)");
    mariadb().exec(&format!(
        "USE {db}; CREATE TABLE hits_ref LIKE hits; INSERT INTO hits_ref SELECT * FROM hits;"
    ));
    Env::builder(db)
        .rule("counter.toml", counter_rule(RULE))
        .admin(ADMIN_PW)
        .start()
}

/// A raw client through `env`'s proxy, in its database.
fn raw(env: &Env) -> RawClient {
    RawClient::connect(
        env.proxy.addr(),
        &ConnectOpts::new(USER, PASSWORD)
            .db(&env.db)
            .timeout(Duration::from_secs(20)),
    )
    .expect("raw connect")
}

/// A counter's logical value, read directly.
fn cnt(env: &Env, slug: &str) -> i64 {
    counter_value(&env.db, slug).expect("a row")
}

/// `head`, then `op` `n` times, then `tail` (and a `)` per `(` in `op`).
fn repeated(head: &str, op: &str, n: usize, tail: &str) -> String {
    let mut s = String::with_capacity(head.len() + op.len() * n + tail.len() + n);
    s.push_str(head);
    for _ in 0..n {
        s.push_str(op);
    }
    s.push_str(tail);
    if op.contains('(') {
        s.push_str(&")".repeat(n));
    }
    s
}

/// The shapes of deep statements a hostile client sends.
fn deep_statements(n: usize) -> Vec<String> {
    const SHAPES: [(&str, &str, &str); 7] = [
        ("SELECT cnt FROM hits WHERE slug = 'home'", " AND 1=1", ""),
        ("SELECT cnt FROM hits WHERE slug = 'home'", " OR 1", ""),
        (
            "UPDATE hits SET cnt = cnt + 1",
            " + 1",
            " WHERE slug = 'home'",
        ),
        ("SELECT cnt FROM hits WHERE slug = ", "(", "'home'"),
        ("SELECT cnt FROM hits WHERE slug = ", "CONCAT(", "'home'"),
        ("SELECT cnt FROM hits WHERE slug IN ", "(SELECT ", "'home'"),
        ("SELECT cnt FROM hits", " UNION SELECT 1", ""),
    ];
    SHAPES
        .iter()
        .map(|(head, op, tail)| repeated(head, op, n, tail))
        .collect()
}

#[test]
fn deep_statements_are_refused_and_the_proxy_lives() {
    let env = start_env("deep");
    run(Duration::from_secs(240), async {
        let mut c = env.proxied().await;
        for sql in deep_statements(100_000) {
            let head = &sql[..60];
            let e = c
                .query_drop(&sql)
                .await
                .expect_err(&format!("{head}…: must be refused"));
            let msg = e.to_string();
            assert!(
                msg.contains("1105") || msg.contains("1064"),
                "{head}…: {msg}"
            );
            // Prepared: refused at COM_STMT_PREPARE.
            let e = c.prep(&sql).await.expect_err("prepare must be refused");
            assert!(e.to_string().contains("1105") || e.to_string().contains("1064"));
            // The connection is in step.
            let one: Option<i64> = c.query_first("SELECT 1").await.unwrap();
            assert_eq!(one, Some(1));
        }
        assert_eq!(cnt(&env, "home"), 10, "no refused statement may write");

        // The admin port's EXPLAIN REWRITE of the same texts answers too.
        let mut admin = connect(&format!(
            "mysql://admin:{ADMIN_PW}@{}/{}?prefer_socket=false",
            env.admin_addr(),
            env.db
        ))
        .await;
        for sql in deep_statements(100_000) {
            let q = format!("EXPLAIN REWRITE '{}'", sql.replace('\'', "''"));
            let rows: Vec<mysql_async::Row> = admin.query(&q).await.expect("explain rewrite");
            let text: String = rows
                .iter()
                .flat_map(|r| (0..r.len()).filter_map(|i| r.get::<Option<String>, _>(i).flatten()))
                .collect::<Vec<_>>()
                .join(" ");
            assert!(
                text.contains("deep") || text.contains("parse") || text.contains("reject"),
                "{text:.200}"
            );
        }

        // Statements just under the bound are still rewritten exactly.
        let near = heatsink::rewrite::MAX_NESTING / 2 - 10;
        let read = repeated(
            "SELECT cnt FROM hits WHERE slug = 'home'",
            " AND 1=1",
            near,
            "",
        );
        let got: Option<i64> = c.query_first(&read).await.expect("read at the bound");
        assert_eq!(got, Some(10));
        let sum = repeated("SELECT cnt", " + 1", near, " FROM hits WHERE slug = 'home'");
        let got: Option<i64> = c.query_first(&sum).await.expect("expression at the bound");
        assert_eq!(got, Some(10 + near as i64));
        // An increment whose delta is an expression is refused, not run.
        let inc = repeated(
            "UPDATE hits SET cnt = cnt + 1",
            " + 1",
            near,
            " WHERE slug = 'home'",
        );
        let e = c.query_drop(&inc).await.expect_err("not an increment");
        assert!(e.to_string().contains("1105"), "{e}");
        assert_eq!(cnt(&env, "home"), 10);
    });
    assert!(
        env.proxy.log_text().matches("panicked").count() == 0,
        "{}",
        env.proxy.log_text()
    );
}

/// A cursor execute (CURSOR_TYPE_READ_ONLY, as Connector/J sends with
/// `useCursorFetch=true`) of a rewritten read gets the whole result at once.
#[test]
fn cursor_executes_of_rewritten_reads_answer() {
    let env = start_env("cursor");
    let mut raw = raw(&env);
    raw.query("UPDATE hits SET cnt = cnt + 5 WHERE slug = 'home'")
        .unwrap();
    let (id, _) = raw
        .prepare("SELECT slug, cnt FROM hits WHERE slug = ?")
        .unwrap();
    for flags in [1u8, 2, 4, 0] {
        let packets = raw
            .execute_with(id, &[RawParam::str("home")], true, flags)
            .unwrap_or_else(|e| panic!("cursor flags {flags}: {e}"));
        assert!(
            packets.iter().all(|p| !p.is_err()),
            "flags {flags}: {packets:?}"
        );
        // Binary rows: header 0x00, null bitmap, then the values; the slug is a
        // length-prefixed string and the INT a 4-byte little-endian value.
        let rows: Vec<&Packet> = packets
            .iter()
            .filter(|p| p.payload.len() > 7 && p.payload[0] == 0)
            .collect();
        assert_eq!(rows.len(), 1, "flags {flags}: {packets:?}");
        let row = &rows[0].payload;
        assert_eq!(&row[2..7], b"\x04home");
        assert_eq!(&row[7..11], &15i32.to_le_bytes());
    }
    // A fetch on a statement without a cursor gets the server's own error, and the
    // connection stays in step.
    let mut fetch = vec![0x1c];
    fetch.extend_from_slice(&id.to_le_bytes());
    fetch.extend_from_slice(&10u32.to_le_bytes());
    let answer = raw.command(&fetch).unwrap();
    assert!(answer.iter().any(|p| p.is_err()), "{answer:?}");
    let after = raw.query("SELECT 'after'").unwrap();
    assert_eq!(text_rows(&after), vec![vec![Some("after".to_string())]]);
}

/// A rewritten binary read whose value does not fit the column ends with an error,
/// and the rest of the backend's rows are not relayed as the next answer.
#[test]
fn a_failed_rewritten_read_leaves_the_connection_in_step() {
    let env = start_env("desync");
    mariadb().exec(&format!(
        "USE {0}; UPDATE hits SET cnt = 2147483647 WHERE slug = 'home';
         INSERT INTO hits_slots VALUES ('home', 0, 10);",
        env.db
    ));
    let mut raw = raw(&env);
    let (id, _) = raw
        .prepare("SELECT slug, cnt FROM hits ORDER BY slug")
        .unwrap();
    for _ in 0..3 {
        let packets = raw.execute(id, &[]).unwrap();
        let err = packets
            .last()
            .and_then(|p| parse_err(&p.payload))
            .unwrap_or_else(|| panic!("expected an error: {packets:?}"));
        assert_eq!(err.code, 1105, "{err:?}");
        let after = raw.query("SELECT 'after'").unwrap();
        assert_eq!(
            text_rows(&after),
            vec![vec![Some("after".to_string())]],
            "{after:?}"
        );
    }
    // The text protocol carries the value as digits: no error there.
    let rows = raw
        .query("SELECT slug, cnt FROM hits ORDER BY slug")
        .unwrap();
    assert_eq!(text_rows(&rows).len(), 3);
}

/// The logical table as the proxy shows it and the reference table, as text rows.
async fn both_tables(proxied: &mut Conn, direct: &mut Conn) -> (Vec<String>, Vec<String>) {
    let rows = |rows: Vec<(String, i64)>| {
        rows.into_iter()
            .map(|(s, c)| format!("{s}={c}"))
            .collect::<Vec<_>>()
    };
    let p: Vec<(String, i64)> = proxied
        .query("SELECT slug, cnt FROM hits ORDER BY slug")
        .await
        .unwrap();
    let d: Vec<(String, i64)> = direct
        .query("SELECT slug, cnt FROM hits_ref ORDER BY slug")
        .await
        .unwrap();
    (rows(p), rows(d))
}

/// Increments whose meaning the slot upsert cannot keep are refused and change
/// nothing; the others answer exactly what the plain table answers.
#[test]
fn increments_keep_mariadb_meaning_or_are_refused() {
    let env = start_env("exact");
    run(Duration::from_secs(120), async {
        for mode in ["STRICT_TRANS_TABLES", ""] {
            let mut p = env.proxied().await;
            let mut d = connect(&mariadb().url(&env.db)).await;
            for c in [&mut p, &mut d] {
                c.query_drop(format!("SET SESSION sql_mode = '{mode}'"))
                    .await
                    .unwrap();
            }
            // Same answer as the plain table.
            for sql in [
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' LIMIT 0",
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = NULL",
                "UPDATE hits SET cnt = cnt + 1, cnt = cnt + 1 WHERE slug = 'home'",
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' LIMIT 1",
            ] {
                let got = run_text(&mut p, sql).await.unwrap();
                let want = run_text(&mut d, &sql.replace("hits", "hits_ref"))
                    .await
                    .unwrap();
                assert_eq!(
                    (got.affected_rows, &got.info, got.warnings),
                    (want.affected_rows, &want.info, want.warnings),
                    "[{mode}] {sql}"
                );
                let (a, b) = both_tables(&mut p, &mut d).await;
                assert_eq!(a, b, "[{mode}] {sql}");
            }
            // Refused, and nothing changes (MariaDB would compare numerically and
            // touch other rows, convert the key, or answer a syntax error).
            for sql in [
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 0",
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 1e0",
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = TRUE",
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home' RETURNING cnt",
                "UPDATE hits SET cnt = cnt + NULL WHERE slug = 'home'",
                "UPDATE hits SET cnt = cnt + 1.5 WHERE slug = 'home'",
            ] {
                let before = both_tables(&mut p, &mut d).await.0;
                let e = p.query_drop(sql).await.expect_err(sql);
                assert!(e.to_string().contains("1105"), "[{mode}] {sql}: {e}");
                assert_eq!(
                    both_tables(&mut p, &mut d).await.0,
                    before,
                    "[{mode}] {sql}"
                );
            }
        }
    });
}

/// A prepared increment is planned before any value is known: each execute's
/// values must be what a literal must be (an integer delta, a string key), or the
/// execute is refused and changes nothing.
#[test]
fn prepared_increments_check_each_execute() {
    let env = start_env("params");
    let mut raw = raw(&env);
    let (id, _) = raw
        .prepare("UPDATE hits SET cnt = cnt + ? WHERE slug = ?")
        .unwrap();
    let home = || RawParam::str("home");
    let refused: Vec<Vec<RawParam>> = vec![
        vec![RawParam::Int(1), RawParam::Int(0)],
        vec![RawParam::Int(1), RawParam::Double(0.0)],
        vec![RawParam::Null, home()],
        vec![RawParam::Double(1.5), home()],
        vec![RawParam::str("1.5"), home()],
        vec![RawParam::Int(1), RawParam::Null],
        vec![RawParam::Int(1), RawParam::str(&"x".repeat(300))],
    ];
    for params in &refused {
        let packets = raw.execute(id, params).unwrap();
        let err = packets
            .first()
            .and_then(|p| parse_err(&p.payload))
            .unwrap_or_else(|| panic!("{params:?}: expected 1105, got {packets:?}"));
        assert_eq!(err.code, 1105, "{params:?}: {err}");
        assert_eq!(cnt(&env, "home"), 10, "{params:?}");
    }
    for (params, total) in [
        (vec![RawParam::Int(1), home()], 11),
        (vec![RawParam::str("2"), home()], 13),
        (vec![RawParam::Int(-3), home()], 10),
    ] {
        let packets = raw.execute(id, &params).unwrap();
        assert!(packets[0].is_ok(), "{params:?}: {packets:?}");
        assert_eq!(cnt(&env, "home"), total, "{params:?}");
    }
    // No key '0' appeared, no other row changed.
    assert_eq!(cnt(&env, "a"), 1);
    let keys = mariadb().query_strings(&format!("SELECT COUNT(*) FROM {}.hits", env.db));
    assert_eq!(keys[0][0].as_deref(), Some("3"));
}
