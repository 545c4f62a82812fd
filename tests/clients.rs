//! Real client programs through the proxy, compared with the same programs talking to
//! MariaDB directly: the `mariadb` command-line client, mysql_async, Python's PyMySQL,
//! and a sysbench OLTP run.
//!
//! Each comparison recreates its database before each side runs, so AUTO_INCREMENT
//! values, statement ids and table contents are the same for both.

mod common;

use std::process::Command;
use std::time::Duration;

use common::cli::{mariadb_client, run_limited, Ran as Output};
use common::fixture::fresh_db;
use common::{mariadb, tests_dir, Proxy, PASSWORD, USER};

// ---------------------------------------------------------------------------------------
// Helpers

/// Runs the `mariadb` command-line client against `port` (TCP) with database `db`.
fn mariadb_cli(port: u16, db: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let all: Vec<&str> = args.iter().copied().chain([db]).collect();
    mariadb_client(port, USER, PASSWORD, &all, stdin)
}

/// Runs the same client invocation directly and through the proxy (database recreated
/// before each) and asserts identical output; returns the direct output.
fn cli_same_both_ways(
    proxy: &Proxy,
    db: &str,
    args: &[&str],
    stdin: Option<&str>,
    normalize: fn(&str) -> String,
) -> Output {
    fresh_db(db, "");
    let mut direct = mariadb_cli(mariadb().port(), db, args, stdin);
    fresh_db(db, "");
    let mut proxied = mariadb_cli(proxy.port(), db, args, stdin);
    for o in [&mut direct, &mut proxied] {
        o.stdout = normalize(&o.stdout);
        o.stderr = normalize(&o.stderr);
    }
    if direct != proxied {
        panic!(
            "mariadb {args:?} differs\n--- direct (exit {:?}) ---\n{}\n{}\n--- proxy (exit {:?}) ---\n{}\n{}\n--- proxy log ---\n{}",
            direct.code,
            direct.stdout,
            direct.stderr,
            proxied.code,
            proxied.stdout,
            proxied.stderr,
            proxy.log_text()
        );
    }
    direct
}

fn unchanged(s: &str) -> String {
    s.to_string()
}

/// Replaces the client's elapsed-time notes (`(0.001 sec)`), which verbose output
/// prints after every statement and which differ from run to run.
fn without_timings(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find(" (") {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        match tail.find(" sec)") {
            Some(end)
                if tail[2..end].chars().all(|c| {
                    c.is_ascii_digit() || c == '.' || c == ' ' || c.is_ascii_alphabetic()
                }) && end < 40 =>
            {
                out.push_str(" (<time>)");
                rest = &tail[end + 5..];
            }
            _ => {
                out.push_str(" (");
                rest = &tail[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------
// mariadb command-line client

const TYPES_SQL: &str = r#"
CREATE TABLE t (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  d DECIMAL(10,3), f DOUBLE, fl FLOAT(7,2), s VARCHAR(20) CHARACTER SET utf8mb4,
  b VARBINARY(8), bl BLOB, dt DATETIME(3), ts TIMESTAMP NULL, da DATE, tm TIME,
  j LONGTEXT, e ENUM('a','b'), st SET('x','y'), bits BIT(5), y YEAR, n BIGINT NULL,
  u TINYINT UNSIGNED ZEROFILL
);
INSERT INTO t VALUES
  (NULL, 12.345, 1.5e10, 3.25, 'héllo wörld', 0x00FF, 'blob', '2024-02-29 12:34:56.789',
   '2024-03-01 00:00:01', '2024-02-29', '-838:59:59', '{"a":[1,2]}', 'b', 'x,y', b'10101',
   2024, NULL, 7),
  (NULL, -0.001, -0.0, -1, '', '', '', '1000-01-01 00:00:00', NULL, '0000-00-00',
   '00:00:00', 'null', 'a', '', 0, 1901, -9223372036854775808, 255);
SELECT * FROM t ORDER BY id;
SELECT 1 AS one, 'x' AS str, NULL AS nul, 3.14 AS dec_lit, 2e0 AS dbl,
       CAST('2020-01-01' AS DATE) AS d, _latin1 X'636166E9' AS l1, x'00ff' AS hex;
SELECT s, COUNT(*) AS c, SUM(d), MAX(dt) FROM t GROUP BY s WITH ROLLUP;
INSERT IGNORE INTO t (id, d) VALUES (10, 'abc'), (1, 2);
SHOW WARNINGS;
SELECT 1/0, CAST('9x' AS SIGNED);
SHOW WARNINGS;
SHOW COLUMNS FROM t LIKE 'd%';
SELECT COUNT(*) FROM t;
SELECT no_such_col FROM t;
"#;

#[test]
fn mariadb_cli_column_type_info_matches_direct() {
    let proxy = Proxy::start();
    let out = cli_same_both_ways(
        &proxy,
        "cli_types",
        &["--table", "--column-type-info", "-e", TYPES_SQL],
        None,
        unchanged,
    );
    // The script really produced metadata, warnings and the error (which ends the run).
    assert!(out.stdout.contains("Field   1:  `id`"), "{}", out.stdout);
    assert!(
        out.stdout.contains("Type:       NEWDECIMAL"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("Truncated incorrect"), "{}", out.stdout);
    assert!(out.stderr.contains("ERROR 1054 (42S22)"), "{}", out.stderr);
    assert_eq!(out.code, Some(1));

    // Table and vertical output with verbose status lines ("Query OK, 2 rows affected",
    // "Records: .. Duplicates: .. Warnings: ..", "Rows matched: .."), elapsed time aside.
    let out = cli_same_both_ways(
        &proxy,
        "cli_types",
        &[
            "--table",
            "-vvv",
            "--show-warnings",
            "-e",
            "CREATE TABLE v (id INT PRIMARY KEY, s VARCHAR(3));
             INSERT IGNORE INTO v VALUES (1, 'a'), (2, 'bbbb');
             UPDATE v SET s = 'a' WHERE id < 10;
             SELECT * FROM v\\G
             BEGIN; DELETE FROM v; ROLLBACK;
             SELECT COUNT(*) FROM v;",
        ],
        None,
        without_timings,
    );
    assert!(
        out.stdout.contains("Rows matched: 2  Changed: 1"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("Records: 2  Duplicates: 0  Warnings: 1"),
        "{}",
        out.stdout
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn mariadb_cli_load_data_local_infile() {
    let proxy = Proxy::start();
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small.csv");
    std::fs::write(
        &small,
        "1,alpha,1.5\n2,beta,x\n3,\"gamma, quoted\",3\n4,delta\n",
    )
    .unwrap();
    // Larger than one packet of file data (the client sends it in chunks).
    let big = dir.path().join("big.csv");
    let mut text = String::new();
    for i in 0..60_000 {
        text.push_str(&format!(
            "{i},row-{i}-{},{}.25\n",
            "z".repeat(i % 40),
            i % 1000
        ));
    }
    std::fs::write(&big, &text).unwrap();
    let missing = dir.path().join("missing.csv");
    let sql = format!(
        "CREATE TABLE l (id INT PRIMARY KEY, name VARCHAR(40), amount DECIMAL(8,2));
         LOAD DATA LOCAL INFILE '{small}' INTO TABLE l FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"';
         SHOW WARNINGS;
         SELECT * FROM l ORDER BY id;
         LOAD DATA LOCAL INFILE '{small}' IGNORE INTO TABLE l FIELDS TERMINATED BY ',';
         CREATE TABLE lb LIKE l;
         LOAD DATA LOCAL INFILE '{big}' INTO TABLE lb FIELDS TERMINATED BY ',';
         SELECT COUNT(*), SUM(amount), SUM(LENGTH(name)), MD5(GROUP_CONCAT(name ORDER BY id)) FROM lb;
         LOAD DATA LOCAL INFILE '{missing}' INTO TABLE l;",
        small = small.display(),
        big = big.display(),
        missing = missing.display()
    );
    let out = cli_same_both_ways(
        &proxy,
        "cli_infile",
        &["--local-infile=1", "--force", "-vvv", "-e", &sql],
        None,
        without_timings,
    );
    assert!(
        out.stdout
            .contains("Records: 4  Deleted: 0  Skipped: 0  Warnings: 2"),
        "{out:?}"
    );
    assert!(out.stdout.contains("60000"), "{out:?}");
    // A missing local file is a client-side error that ends the batch even with
    // --force; the proxy must leave the session in step for that exchange too.
    assert!(
        out.stderr.contains("ERROR 2 (HY000)") && out.stderr.contains("missing.csv"),
        "{out:?}"
    );
}

/// MariaDB's extended capabilities (the last 4 reserved bytes of the greeting) change
/// what clients see: with MARIADB_CLIENT_EXTENDED_METADATA a JSON column is reported as
/// `BLOB (format=json)` and INET6/UUID columns carry their type name; with
/// MARIADB_CLIENT_STMT_BULK_OPERATIONS mysql_async's `exec_batch` is one
/// COM_STMT_BULK_EXECUTE whose OK packet counts every row. The proxy clears all of these
/// bits in the greeting, so both differ from a direct connection.
#[test]
fn mariadb_extended_capabilities_are_relayed() {
    let proxy = Proxy::start();
    let out = cli_same_both_ways(
        &proxy,
        "cli_ext",
        &[
            "--table",
            "--column-type-info",
            "-e",
            "CREATE TABLE x (j JSON, ip INET6, u UUID);
             INSERT INTO x VALUES ('{\"a\": 1}', '::1', '123e4567-e89b-12d3-a456-426655440000');
             SELECT * FROM x;",
        ],
        None,
        unchanged,
    );
    assert!(out.stdout.contains("format=json"), "{out:?}");

    let batch = |url: String| {
        fresh_db("cli_ext", "");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                use mysql_async::prelude::*;
                let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                conn.query_drop("CREATE TABLE b (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
                    .await
                    .unwrap();
                conn.exec_batch("INSERT INTO b (v) VALUES (?)", vec![(1,), (2,), (3,)])
                    .await
                    .unwrap();
                let r = (
                    conn.affected_rows(),
                    conn.last_insert_id(),
                    conn.info().into_owned(),
                );
                conn.disconnect().await.unwrap();
                r
            })
    };
    let direct = batch(mariadb().url("cli_ext"));
    let proxied = batch(proxy.url("cli_ext"));
    assert_eq!(
        direct, proxied,
        "exec_batch OK packet (affected, last id, info)"
    );
}

const STDIN_BATCH: &str = r#"
CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(10), bal DECIMAL(10,2));
INSERT INTO acct VALUES (1, 'ann', 100), (2, 'bob', 50); INSERT INTO acct VALUES (3, 'cy', 0);
DELIMITER //
CREATE PROCEDURE report(IN min_bal DECIMAL(10,2))
BEGIN
  SELECT id, owner FROM acct WHERE bal >= min_bal ORDER BY id;
  SELECT SUM(bal) AS total FROM acct;
  UPDATE acct SET bal = bal + 1 WHERE bal >= min_bal;
END//
DELIMITER ;
CALL report(50);
BEGIN;
UPDATE acct SET bal = bal - 500 WHERE id = 1;
SELECT @@in_transaction, bal FROM acct WHERE id = 1;
ROLLBACK;
SELECT id, bal FROM acct ORDER BY id;
SET @x := 5; SELECT @x * 2 AS twice;
SELECT * FROM acct WHERE id = 1\G
USE heatsink_test
SELECT DATABASE();
SELECT 'a\tb' AS tab, 'line1\nline2' AS nl, NULL AS n;
SELECT * FROM no_such_table;
SELECT 'not reached';
"#;

#[test]
fn mariadb_cli_batch_from_stdin() {
    let proxy = Proxy::start();
    let out = cli_same_both_ways(&proxy, "cli_batch", &[], Some(STDIN_BATCH), unchanged);
    assert!(out.stdout.contains("twice\n10"), "{}", out.stdout);
    assert!(out.stdout.contains("total\n150.00"), "{}", out.stdout);
    assert!(!out.stdout.contains("not reached"), "{}", out.stdout);
    assert!(out.stderr.contains("ERROR 1146"), "{}", out.stderr);
    assert_eq!(out.code, Some(1));
    // The same batch with table output and --force.
    let out = cli_same_both_ways(
        &proxy,
        "cli_batch",
        &["--table", "--force", "--column-type-info"],
        Some(STDIN_BATCH),
        unchanged,
    );
    assert!(out.stdout.contains("not reached"), "{}", out.stdout);
}

// ---------------------------------------------------------------------------------------
// mysql_async

/// A transcript of one mysql_async session: every result, OK-packet field and error,
/// rendered as text.
async fn mysql_async_session(url: String) -> Vec<String> {
    use mysql_async::prelude::*;
    use mysql_async::{Params, Row, TxOpts, Value};

    fn rows_text(rows: &[Row]) -> String {
        let mut s = String::new();
        for r in rows {
            for c in r.columns_ref() {
                s.push_str(&format!(
                    "[{} {}.{} {:?} {:?} len={} dec={} cs={}] ",
                    c.name_str(),
                    c.table_str(),
                    c.org_name_str(),
                    c.column_type(),
                    c.flags(),
                    c.column_length(),
                    c.decimals(),
                    c.character_set()
                ));
            }
            s.push_str(&format!("{:?}\n", r.clone().unwrap()));
        }
        s
    }
    fn ok_fields(conn: &mysql_async::Conn) -> String {
        format!(
            "affected={} last_id={:?} info={:?} warnings={}",
            conn.affected_rows(),
            conn.last_insert_id(),
            conn.info(),
            conn.get_warnings()
        )
    }

    let mut t = Vec::new();
    let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
    t.push(format!("server {:?}", conn.server_version()));
    conn.query_drop(
        "CREATE TABLE items (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(20) UNIQUE,
           price DECIMAL(8,2), qty INT, seen DATETIME(6), span TIME(3), raw VARBINARY(16),
           ratio DOUBLE)",
    )
    .await
    .unwrap();
    t.push(format!("create: {}", ok_fields(&conn)));

    // Text protocol.
    conn.query_drop("INSERT INTO items (name, price, qty) VALUES ('a', 1.50, 3), ('b', 2, NULL)")
        .await
        .unwrap();
    t.push(format!("insert text: {}", ok_fields(&conn)));
    let rows: Vec<Row> = conn
        .query(
            "SELECT *, 1 AS one, -2.5 AS neg, 'str' AS s, NULL AS nul,
                    CAST('2024-01-02 03:04:05.678' AS DATETIME(3)) AS dt,
                    CAST('-12:34:56' AS TIME) AS tm, X'00FF' AS bin, 1e300 AS big
             FROM items ORDER BY id",
        )
        .await
        .unwrap();
    t.push(format!("select text:\n{}", rows_text(&rows)));

    // Binary protocol with parameters of several types.
    let params = Params::Positional(vec![
        Value::Int(-42),
        Value::UInt(u64::MAX),
        Value::Double(0.1),
        Value::Float(1.5),
        Value::Bytes("héllo".as_bytes().to_vec()),
        Value::Bytes(vec![0, 1, 2, 255]),
        Value::NULL,
        Value::Date(2024, 2, 29, 23, 59, 58, 123_456),
        Value::Date(2024, 2, 29, 0, 0, 0, 0),
        Value::Time(true, 1, 2, 3, 4, 5),
        Value::Time(false, 0, 0, 0, 0, 0),
    ]);
    let rows: Vec<Row> = conn
        .exec("SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?", params)
        .await
        .unwrap();
    t.push(format!("select params:\n{}", rows_text(&rows)));
    conn.exec_drop(
        "INSERT INTO items (name, price, qty, seen, span, raw, ratio) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            "c",
            "3.25",
            7,
            Value::Date(2023, 12, 31, 23, 59, 59, 999_999),
            Value::Time(true, 0, 1, 2, 3, 4000),
            vec![9u8, 8, 7],
            2.5f64,
        ),
    )
    .await
    .unwrap();
    t.push(format!("insert binary: {}", ok_fields(&conn)));
    conn.exec_batch(
        "INSERT INTO items (name, qty) VALUES (?, ?)",
        vec![("d", 1), ("e", 2), ("f", 3)],
    )
    .await
    .unwrap();
    // (Not compared: the OK fields after exec_batch depend on whether the server offers
    // MariaDB's bulk operations; see `mariadb_extended_capabilities_are_relayed`.)
    let rows: Vec<Row> = conn
        .exec("SELECT * FROM items WHERE id >= ? ORDER BY id", (2,))
        .await
        .unwrap();
    t.push(format!("select binary:\n{}", rows_text(&rows)));

    // OK-packet details.
    conn.query_drop("UPDATE items SET qty = qty WHERE qty IS NOT NULL")
        .await
        .unwrap();
    t.push(format!("noop update: {}", ok_fields(&conn)));
    conn.exec_drop("UPDATE items SET qty = qty + ? WHERE id <= ?", (1, 3))
        .await
        .unwrap();
    t.push(format!("update: {}", ok_fields(&conn)));
    conn.query_drop("INSERT IGNORE INTO items (id, name) VALUES (1, 'dup'), (100, 'zz')")
        .await
        .unwrap();
    t.push(format!("insert ignore: {}", ok_fields(&conn)));
    let warnings: Vec<Row> = conn.query("SHOW WARNINGS").await.unwrap();
    t.push(format!("warnings:\n{}", rows_text(&warnings)));
    conn.query_drop("INSERT INTO items (name) VALUES ('g') ON DUPLICATE KEY UPDATE qty = 0")
        .await
        .unwrap();
    t.push(format!("upsert insert: {}", ok_fields(&conn)));
    conn.query_drop("INSERT INTO items (name) VALUES ('g') ON DUPLICATE KEY UPDATE qty = 9")
        .await
        .unwrap();
    t.push(format!("upsert update: {}", ok_fields(&conn)));
    let id: Option<u64> = conn.query_first("SELECT LAST_INSERT_ID()").await.unwrap();
    t.push(format!("LAST_INSERT_ID() = {id:?}"));

    // Transactions.
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop("INSERT INTO items (name) VALUES (?)", ("rolled back",))
        .await
        .unwrap();
    let inside: Option<i64> = tx.query_first("SELECT COUNT(*) FROM items").await.unwrap();
    t.push(format!(
        "in tx: count={inside:?} last_id={:?}",
        tx.last_insert_id()
    ));
    tx.rollback().await.unwrap();
    let after: Option<i64> = conn
        .query_first("SELECT COUNT(*) FROM items")
        .await
        .unwrap();
    t.push(format!("after rollback: count={after:?}"));
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.query_drop("DELETE FROM items WHERE name = 'zz'")
        .await
        .unwrap();
    t.push(format!("delete in tx: affected={}", tx.affected_rows()));
    tx.commit().await.unwrap();
    let after: Option<i64> = conn
        .query_first("SELECT COUNT(*) FROM items")
        .await
        .unwrap();
    t.push(format!("after commit: count={after:?}"));

    // Errors keep code, state and message.
    for sql in [
        "SELECT * FROM no_such_table",
        "INSERT INTO items (id, name) VALUES (1, 'dup')",
        "SELEC 1",
        "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'custom', MYSQL_ERRNO = 3100",
    ] {
        let e = conn.query_drop(sql).await.unwrap_err();
        t.push(format!("error {sql}: {e:?}"));
    }
    let e = conn
        .exec_drop("SELECT ? FROM nope", (1,))
        .await
        .unwrap_err();
    t.push(format!("prepare error: {e:?}"));
    // The session is intact after errors.
    let one: Option<i32> = conn.exec_first("SELECT ? + 1", (0,)).await.unwrap();
    t.push(format!("after errors: {one:?}"));

    // Multi-result text query.
    let mut result = conn
        .query_iter("SELECT 1 AS a; SELECT 2 AS b, 3 AS c; DO 0")
        .await
        .unwrap();
    while !result.is_empty() {
        let rows: Vec<Row> = result.collect().await.unwrap();
        t.push(format!("multi:\n{}", rows_text(&rows)));
    }
    drop(result);
    conn.reset().await.unwrap();
    let v: Option<Option<i32>> = conn.query_first("SELECT @nothing").await.unwrap();
    t.push(format!("after reset: {v:?}"));
    conn.disconnect().await.unwrap();
    t
}

#[test]
fn mysql_async_results_match_direct() {
    let proxy = Proxy::start();
    let db = "cli_async";
    let run = |url: String| {
        fresh_db(db, "");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                tokio::time::timeout(Duration::from_secs(30), mysql_async_session(url))
                    .await
                    .expect("mysql_async session timed out")
            })
    };
    let direct = run(mariadb().url(db));
    let proxied = run(proxy.url(db));
    assert!(
        direct
            .iter()
            .any(|l| l.contains("Records: 2  Duplicates: 1  Warnings: 1")),
        "{direct:#?}"
    );
    for (i, (d, p)) in direct.iter().zip(&proxied).enumerate() {
        assert_eq!(
            d,
            p,
            "step {i} differs\n--- proxy log ---\n{}",
            proxy.log_text()
        );
    }
    assert_eq!(direct.len(), proxied.len());
}

// ---------------------------------------------------------------------------------------
// Stored procedures with an open cursor

/// A procedure that returns result sets while a cursor of its own is open. MariaDB sets
/// CURSOR_EXISTS in both EOF packets of those ordinary result sets (text and binary
/// protocol alike) and their rows follow; once heatsink took that for an opened cursor,
/// ended the response after the metadata and the client waited forever.
const CURSOR_PROC_DDL: &str = "
CREATE TABLE t3 (a INT);
INSERT INTO t3 VALUES (1), (2);
CREATE PROCEDURE pd() BEGIN DECLARE lv INT; DECLARE c CURSOR FOR SELECT a FROM t3;
  OPEN c; SELECT 4; CLOSE c; END;
CREATE PROCEDURE pd2() BEGIN DECLARE lv INT; DECLARE c CURSOR FOR SELECT a FROM t3;
  OPEN c; FETCH c INTO lv; SELECT 4 AS four, lv; SELECT a FROM t3 ORDER BY a; CLOSE c;
  SELECT 5 AS after_close; END";

#[test]
fn procedure_with_an_open_cursor_mariadb_cli() {
    let proxy = Proxy::start();
    let db = "cli_cursor_proc";
    for args in [
        &["-e", "CALL pd()"][..],
        &["-e", "CALL pd2()"][..],
        &[
            "--column-type-info",
            "-e",
            "CALL pd2(); CALL pd(); SELECT 6",
        ][..],
    ] {
        fresh_db(db, CURSOR_PROC_DDL);
        let direct = mariadb_cli(mariadb().port(), db, args, None);
        fresh_db(db, CURSOR_PROC_DDL);
        let proxied = mariadb_cli(proxy.port(), db, args, None);
        assert_eq!(direct.code, Some(0), "{args:?}: {}", direct.stderr);
        assert!(direct.stdout.contains('4'), "{args:?}: {}", direct.stdout);
        assert_eq!(
            direct,
            proxied,
            "mariadb {args:?}\n--- proxy log ---\n{}",
            proxy.log_text()
        );
    }
}

/// Every result set of `CALL pd2()` and `CALL pd()`, over the text protocol and as a
/// prepared statement, and a statement after them.
async fn cursor_proc_session(url: String) -> Vec<String> {
    use mysql_async::prelude::*;
    use mysql_async::Row;

    async fn all_sets<'a>(
        mut r: mysql_async::QueryResult<'a, 'static, impl mysql_async::prelude::Protocol>,
    ) -> Vec<String> {
        let mut sets = Vec::new();
        while !r.is_empty() {
            let rows: Vec<Row> = r.collect().await.unwrap();
            let rows: Vec<Vec<mysql_async::Value>> = rows.into_iter().map(Row::unwrap).collect();
            sets.push(format!("{rows:?}"));
        }
        sets
    }

    let mut t = Vec::new();
    let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
    for call in ["CALL pd2()", "CALL pd()"] {
        let text = all_sets(conn.query_iter(call).await.unwrap()).await;
        t.push(format!("text {call}: {text:?}"));
        let stmt = conn.prep(call).await.unwrap();
        for round in 0..2 {
            let binary = all_sets(conn.exec_iter(&stmt, ()).await.unwrap()).await;
            t.push(format!("binary {call} #{round}: {binary:?}"));
        }
    }
    let after: Option<i32> = conn.query_first("SELECT 6").await.unwrap();
    t.push(format!("after: {after:?}"));
    conn.disconnect().await.unwrap();
    t
}

#[test]
fn procedure_with_an_open_cursor_mysql_async() {
    let proxy = Proxy::start();
    let db = "cli_cursor_async";
    let run = |url: String| {
        fresh_db(db, CURSOR_PROC_DDL);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                tokio::time::timeout(Duration::from_secs(20), cursor_proc_session(url))
                    .await
                    .expect("mysql_async session timed out")
            })
    };
    let direct = run(mariadb().url(db));
    assert!(
        direct
            .iter()
            .any(|l| l.contains("after_close") || l.contains("Int(5)")),
        "{direct:#?}"
    );
    let proxied = run(proxy.url(db));
    assert_eq!(direct, proxied, "--- proxy log ---\n{}", proxy.log_text());
}

// ---------------------------------------------------------------------------------------
// Python PyMySQL

fn pymysql_transcript(port: u16, db: &str) -> Output {
    let script = tests_dir().join("python").join("pymysql_transcript.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .arg("--host=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(format!("--user={USER}"))
        .arg(format!("--password={PASSWORD}"))
        .arg(format!("--db={db}"));
    run_limited(&mut cmd, None, Duration::from_secs(60))
}

#[test]
fn pymysql_transcript_matches_direct() {
    let proxy = Proxy::start();
    let db = "cli_pymysql";
    fresh_db(db, "");
    let direct = pymysql_transcript(mariadb().port(), db);
    assert_eq!(
        direct.code,
        Some(0),
        "direct run failed:\n{}",
        direct.stderr
    );
    assert!(direct.stdout.contains("\"step\""), "{}", direct.stdout);
    fresh_db(db, "");
    let proxied = pymysql_transcript(proxy.port(), db);
    assert_eq!(
        proxied.code,
        Some(0),
        "proxy run failed:\n{}\n--- proxy log ---\n{}",
        proxied.stderr,
        proxy.log_text()
    );
    if direct.stdout != proxied.stdout {
        let d: Vec<&str> = direct.stdout.lines().collect();
        let p: Vec<&str> = proxied.stdout.lines().collect();
        let first = d
            .iter()
            .zip(&p)
            .position(|(a, b)| a != b)
            .unwrap_or(d.len().min(p.len()));
        let from = first.saturating_sub(5);
        panic!(
            "PyMySQL transcripts differ at line {first}\n--- direct ---\n{}\n--- proxy ---\n{}",
            d[from..(first + 5).min(d.len())].join("\n"),
            p[from..(first + 5).min(p.len())].join("\n")
        );
    }
}

// ---------------------------------------------------------------------------------------
// sysbench

/// The number after `label` in sysbench's report (e.g. "ignored errors:").
fn sysbench_count(report: &str, label: &str) -> Option<u64> {
    report.lines().find_map(|l| {
        let l = l.trim().to_ascii_lowercase();
        l.strip_prefix(label)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    })
}

#[test]
fn sysbench_oltp_read_write_through_the_proxy() {
    let proxy = Proxy::start();
    let db = "cli_sysbench";
    fresh_db(db, "");
    let sysbench = |step: &str, limit: Duration| -> Output {
        let mut cmd = Command::new("sysbench");
        cmd.arg("oltp_read_write")
            .arg("--db-driver=mysql")
            .arg("--mysql-host=127.0.0.1")
            .arg(format!("--mysql-port={}", proxy.port()))
            .arg(format!("--mysql-user={USER}"))
            .arg(format!("--mysql-password={PASSWORD}"))
            .arg(format!("--mysql-db={db}"))
            .arg("--tables=2")
            .arg("--table-size=1000")
            .arg("--threads=4")
            .arg("--time=5")
            // The default "special" distribution concentrates writes on a few hot rows
            // and deadlocks (1213, ignored and counted) 7-10 times in 5 s even directly
            // against MariaDB; uniform keys make "0 ignored errors" a meaningful check.
            .arg("--rand-type=uniform")
            .arg(step);
        let out = run_limited(&mut cmd, None, limit);
        assert_eq!(
            out.code,
            Some(0),
            "sysbench {step} failed\nstdout:\n{}\nstderr:\n{}\n--- proxy log ---\n{}",
            out.stdout,
            out.stderr,
            proxy.log_text()
        );
        out
    };
    sysbench("prepare", Duration::from_secs(60));
    let run = sysbench("run", Duration::from_secs(40));
    let report = &run.stdout;
    assert_eq!(
        sysbench_count(report, "ignored errors:"),
        Some(0),
        "{report}"
    );
    assert_eq!(sysbench_count(report, "reconnects:"), Some(0), "{report}");
    let transactions = sysbench_count(report, "transactions:").unwrap_or(0);
    assert!(transactions > 0, "{report}");
    sysbench("cleanup", Duration::from_secs(30));
    let left = mariadb().query_strings(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}'"
    ));
    assert_eq!(left[0][0].as_deref(), Some("0"));
    mariadb().exec(&format!("DROP DATABASE {db}"));
}
