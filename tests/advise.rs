//! `heatsink advise` end to end: one workload with a hot spot of every kind mixed
//! with decoys (cold random-key increments, aggregates over a small table, plain
//! inserts, lookups by an auto-increment id) run against a MariaDB with
//! performance_schema on; advise reads it from there and from a `SHOW DIGESTS`
//! dump the test builds from the same statements, proposes exactly one rule per hot
//! spot and none for the decoys, and what it proposes passes `migrate --apply` and
//! `check --backend-url`.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use serde_json::{json, Value};

use common::cli::Cli;
use common::client::{assert_refused_by, connect, run};
use common::{mariadb_pfs, Proxy};

const DB: &str = "advise_mix";
/// The database of the test through a proxy's admin port.
const DB_PROXY: &str = "advise_proxied";
/// Both tests read the one server's performance_schema: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Tables of at least this many rows are large for the test (`--large-rows`).
const LARGE: &str = "20000";

/// Seconds since the epoch the Messages keys count back from.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The `Messages` key of row `seq` (unix seconds between dashes).
fn message_key(base: u64, seq: u64) -> String {
    format!("{seq:08X}-{}-{:08X}", base - seq * 40, seq * 7)
}

fn schema(base: u64) -> String {
    format!(
        "CREATE TABLE hits (id INT AUTO_INCREMENT PRIMARY KEY, slug VARCHAR(64) NOT NULL UNIQUE, cnt INT NOT NULL DEFAULT 0);
         INSERT INTO hits (slug) SELECT CONCAT('p', seq) FROM seq_1_to_50;
         INSERT INTO hits (slug) VALUES ('home');
         CREATE TABLE scores (id INT PRIMARY KEY, points INT NOT NULL DEFAULT 0);
         INSERT INTO scores (id) SELECT seq FROM seq_1_to_2000;
         CREATE TABLE visits (id BIGINT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, visitor INT NOT NULL, at DATETIME(6) NOT NULL, KEY (uid, id));
         INSERT INTO visits (uid, visitor, at) SELECT 1 + seq % 50, seq, NOW(6) FROM seq_1_to_500;
         CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, track_id INT NOT NULL, country CHAR(2) NOT NULL, created_at DATETIME NOT NULL, KEY (track_id), KEY (created_at));
         INSERT INTO plays (track_id, country, created_at) SELECT seq % 500, ELT(1 + seq % 5, 'de', 'fr', 'us', 'jp', 'br'), NOW() - INTERVAL (seq % 43200) MINUTE FROM seq_1_to_60000;
         CREATE TABLE recent (id INT AUTO_INCREMENT PRIMARY KEY, grp INT NOT NULL, created_at DATETIME NOT NULL);
         INSERT INTO recent (grp, created_at) SELECT seq % 5, NOW() - INTERVAL seq HOUR FROM seq_1_to_50;
         CREATE TABLE Messages (id BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(64) NOT NULL, Message VARCHAR(200) NOT NULL, Inserted DATE NOT NULL, UNIQUE KEY (UUID));
         INSERT INTO Messages (UUID, Message, Inserted) SELECT CONCAT(LPAD(HEX(seq), 8, '0'), '-', {base} - seq * 40, '-', LPAD(HEX(seq * 7), 8, '0')), CONCAT('m', seq), DATE(FROM_UNIXTIME({base} - seq * 40)) FROM seq_1_to_60000;
         CREATE TABLE orders (id INT AUTO_INCREMENT PRIMARY KEY, customer INT NOT NULL, total INT NOT NULL);
         INSERT INTO orders (customer, total) SELECT seq % 700, seq % 90 FROM seq_1_to_60000;
         CREATE TABLE message (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id INT NOT NULL, body VARCHAR(100) NOT NULL, KEY (user_id, id));
         INSERT INTO message (user_id, body) SELECT seq % 1000, CONCAT('b', seq) FROM seq_1_to_60000;
         CREATE TABLE follower (user_id INT NOT NULL, follower_id INT NOT NULL, PRIMARY KEY (user_id, follower_id));
         INSERT IGNORE INTO follower SELECT s1.seq, (s1.seq * 7 + s2.seq * 13) % 1000 FROM seq_1_to_1000 s1, seq_1_to_20 s2;
         CREATE TABLE audit (id INT AUTO_INCREMENT PRIMARY KEY, what VARCHAR(64) NOT NULL);
         ANALYZE TABLE hits, scores, visits, plays, recent, Messages, orders, message, follower, audit;"
    )
}

/// One statement of the workload: its shape as `SHOW DIGESTS` writes it, the text
/// sent, and its first `column = literal` (for `hot_keys`).
struct Stmt {
    digest: &'static str,
    sql: String,
    key: Option<(&'static str, String)>,
}

fn stmt(digest: &'static str, sql: String, key: Option<(&'static str, String)>) -> Stmt {
    Stmt { digest, sql, key }
}

/// The mixed workload, shuffled deterministically.
fn workload(base: u64) -> Vec<Stmt> {
    let mut r = Lcg(42);
    let mut v = Vec::new();
    for _ in 0..400 {
        let slug = if r.below(100) < 85 {
            "home".to_string()
        } else {
            format!("p{}", 1 + r.below(50))
        };
        v.push(stmt(
            "UPDATE hits SET cnt = cnt + ? WHERE slug = ?",
            format!("UPDATE hits SET cnt = cnt + 1 WHERE slug = '{slug}'"),
            Some(("slug", slug)),
        ));
        let id = 1 + r.below(2000);
        v.push(stmt(
            "UPDATE scores SET points = points + ? WHERE id = ?",
            format!("UPDATE scores SET points = points + 1 WHERE id = {id}"),
            Some(("id", id.to_string())),
        ));
    }
    for i in 0..300 {
        let uid = 1 + r.below(50);
        v.push(stmt(
            "INSERT INTO visits (uid, visitor, at) VALUES (?, ?, NOW(6))",
            format!(
                "INSERT INTO visits (uid, visitor, at) VALUES ({uid}, {}, NOW(6))",
                r.below(100_000)
            ),
            None,
        ));
        if i % 5 == 0 {
            v.push(stmt(
                "SELECT visitor, at FROM visits WHERE uid = ? ORDER BY id DESC LIMIT ?",
                format!(
                    "SELECT visitor, at FROM visits WHERE uid = {uid} ORDER BY id DESC LIMIT 5"
                ),
                Some(("uid", uid.to_string())),
            ));
        }
        if i % 8 == 0 {
            v.push(stmt(
                "DELETE l FROM visits l JOIN (SELECT uid, id FROM visits WHERE uid = ? ORDER BY id DESC LIMIT ? OFFSET ?) t ON l.uid = t.uid AND l.id < t.id",
                format!("DELETE l FROM visits l JOIN (SELECT uid, id FROM visits WHERE uid = {uid} ORDER BY id DESC LIMIT 1 OFFSET 4) t ON l.uid = t.uid AND l.id < t.id"),
                None,
            ));
        }
    }
    for i in 0..100 {
        let track = if r.below(10) < 8 { 7 } else { r.below(500) };
        v.push(stmt(
            "INSERT INTO plays (track_id, country, created_at) VALUES (?, ?, NOW())",
            format!(
                "INSERT INTO plays (track_id, country, created_at) VALUES ({track}, 'de', NOW())"
            ),
            None,
        ));
        if i % 2 == 0 {
            v.push(stmt(
                "SELECT track_id, country, COUNT(*) AS total FROM plays WHERE track_id = ? AND created_at BETWEEN NOW() - INTERVAL ? DAY AND NOW() GROUP BY track_id, country",
                format!("SELECT track_id, country, COUNT(*) AS total FROM plays WHERE track_id = {track} AND created_at BETWEEN NOW() - INTERVAL 7 DAY AND NOW() GROUP BY track_id, country"),
                Some(("track_id", track.to_string())),
            ));
        }
        v.push(stmt(
            "SELECT grp, COUNT(*) FROM recent WHERE created_at >= NOW() - INTERVAL ? DAY GROUP BY grp",
            "SELECT grp, COUNT(*) FROM recent WHERE created_at >= NOW() - INTERVAL 1 DAY GROUP BY grp".to_string(),
            None,
        ));
    }
    for i in 0..200 {
        let key = message_key(base, 1 + r.below(60_000));
        v.push(stmt(
            "SELECT Message FROM Messages WHERE UUID = ?",
            format!("SELECT Message FROM Messages WHERE UUID = '{key}'"),
            Some(("UUID", key)),
        ));
        let id = 1 + r.below(60_000);
        v.push(stmt(
            "SELECT customer, total FROM orders WHERE id = ?",
            format!("SELECT customer, total FROM orders WHERE id = {id}"),
            Some(("id", id.to_string())),
        ));
        v.push(stmt(
            "INSERT INTO audit (what) VALUES (?)",
            format!("INSERT INTO audit (what) VALUES ('x{i}')"),
            None,
        ));
        if i % 5 == 0 {
            let u = 1 + r.below(1000);
            v.push(stmt(
                "SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = ? ORDER BY message.id DESC LIMIT ?",
                format!("SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = {u} ORDER BY message.id DESC LIMIT 20"),
                Some(("user_id", u.to_string())),
            ));
        }
    }
    for _ in 0..2 {
        v.push(stmt(
            "DELETE FROM Messages WHERE Inserted < CURDATE() - INTERVAL ? DAY",
            "DELETE FROM Messages WHERE Inserted < CURDATE() - INTERVAL 30 DAY".to_string(),
            None,
        ));
    }
    // Shuffle.
    for i in (1..v.len()).rev() {
        let j = r.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// What running one statement cost.
#[derive(Default)]
struct Cost {
    count: u64,
    time_us: u64,
    min_us: u64,
    max_us: u64,
    rows_sent: u64,
    rows_affected: u64,
    keys: BTreeMap<String, u64>,
    key_column: Option<&'static str>,
}

/// Runs the workload on `url`; returns the digest rows a proxy's `SHOW DIGESTS`
/// would show for it.
async fn run_workload(url: &str, stmts: &[Stmt]) -> Value {
    let mut conn = connect(url).await;
    let mut costs: BTreeMap<&'static str, Cost> = BTreeMap::new();
    for s in stmts {
        let start = Instant::now();
        let rows: Vec<mysql_async::Row> = conn
            .query(s.sql.as_str())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", s.sql));
        let us = start.elapsed().as_micros() as u64;
        let c = costs.entry(s.digest).or_default();
        c.count += 1;
        c.time_us += us;
        c.min_us = if c.count == 1 { us } else { c.min_us.min(us) };
        c.max_us = c.max_us.max(us);
        c.rows_sent += rows.len() as u64;
        c.rows_affected += conn.affected_rows();
        if let Some((col, lit)) = &s.key {
            c.key_column = Some(col);
            *c.keys.entry(lit.clone()).or_default() += 1;
        }
    }
    conn.disconnect().await.unwrap();
    let rows: Vec<Value> = costs
        .iter()
        .enumerate()
        .map(|(i, (text, c))| {
            let hot_keys = c.key_column.map(|col| {
                let mut top: Vec<(&String, &u64)> = c.keys.iter().collect();
                top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                top.truncate(8);
                json!({"column": col, "distinct": c.keys.len(), "top": top}).to_string()
            });
            json!({
                "digest": format!("{:016x}", 0xad00 + i),
                "schema_name": DB,
                "user": "hs",
                "digest_text": text,
                "count_star": c.count,
                "first_seen": "2026-11-27 12:00:00",
                "last_seen": "2026-11-27 12:05:00",
                "sum_time_us": c.time_us,
                "min_time_us": c.min_us,
                "max_time_us": c.max_us,
                "p99_time_us": c.max_us,
                "rows_sent": c.rows_sent,
                "rows_affected": c.rows_affected,
                "errors": 0,
                "error_codes": "",
                "handling": "passthrough",
                "rule": null,
                "hot_keys": hot_keys,
            })
        })
        .collect();
    Value::Array(rows)
}

/// The proposals of an advise JSON report: (kind, table) → proposal.
fn proposals(report: &str) -> BTreeMap<(String, String), Value> {
    let v: Value = serde_json::from_str(report).unwrap_or_else(|e| panic!("{e}: {report}"));
    v["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                (
                    p["kind"].as_str().unwrap().to_string(),
                    p["table"].as_str().unwrap().to_string(),
                ),
                p.clone(),
            )
        })
        .collect()
}

/// Exactly one rule per hot spot, with the right settings, and none for a decoy.
fn assert_hot_spots(report: &str, with_samples: bool) {
    let got = proposals(report);
    let found: Vec<&(String, String)> = got.keys().collect();
    let want = [
        ("counter", "hits"),
        ("partition", "Messages"),
        ("ring", "visits"),
        ("rollup", "plays"),
        ("timeline", "message"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(k, t)| (k.to_string(), t.to_string()))
        .collect();
    assert_eq!(found, want.iter().collect::<Vec<_>>(), "report:\n{report}");
    let s = |k: &str, t: &str| got[&(k.to_string(), t.to_string())]["settings"].clone();
    assert_eq!(s("counter", "hits")["key"], json!(["slug"]));
    assert_eq!(s("counter", "hits")["columns"], json!(["cnt"]));
    assert_eq!(s("ring", "visits")["key"], json!(["uid"]));
    assert_eq!(s("ring", "visits")["size"], json!(5));
    assert_eq!(
        s("rollup", "plays")["dimensions"],
        json!(["track_id", "country"])
    );
    assert_eq!(s("rollup", "plays")["time"], json!("created_at"));
    assert_eq!(s("partition", "Messages")["key"], json!("UUID"));
    assert_eq!(s("partition", "Messages")["key_time"], json!("unix"));
    assert_eq!(
        s("partition", "Messages")["key_pattern"],
        json!("-([0-9]{10})-")
    );
    assert_eq!(s("partition", "Messages")["column"], json!("Inserted"));
    assert_eq!(s("timeline", "message")["follows"], json!("follower"));
    assert_eq!(s("timeline", "message")["follow_reader"], json!("user_id"));
    assert_eq!(
        s("timeline", "message")["follow_author"],
        json!("follower_id")
    );
    assert_eq!(s("timeline", "message")["message_author"], json!("user_id"));
    // The rule refuses the application's purges; the proposal says to stop them.
    let ring = &got[&("ring".to_string(), "visits".to_string())];
    assert!(
        ring["caveats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("purges are refused")),
        "{ring}"
    );
    let partition = &got[&("partition".to_string(), "Messages".to_string())];
    let toml = partition["toml"].as_str().unwrap();
    if with_samples {
        // The retention comes from the deletes by age as sent.
        assert!(toml.contains("retention_days = 30"), "{toml}");
    }
    for p in got.values() {
        assert!(
            p["effect"].as_str().unwrap().contains("bench/results/"),
            "{p}"
        );
        assert!(!p["digests"].as_array().unwrap().is_empty(), "{p}");
        assert!(p["count"].as_u64().unwrap() > 0, "{p}");
        assert!(!p["migrate"].as_array().unwrap().is_empty(), "{p}");
    }
}

fn advise(args: &[&str]) -> String {
    let (code, out, err) = Cli::new(["advise"]).args_from(args).run();
    assert_eq!(
        code, 0,
        "advise {args:?} failed:\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

trait Args {
    fn args_from(self, args: &[&str]) -> Cli;
}

impl Args for Cli {
    fn args_from(mut self, args: &[&str]) -> Cli {
        for a in args {
            self = self.arg(a);
        }
        self
    }
}

#[test]
fn advise_finds_one_rule_per_hot_spot_and_none_for_the_decoys() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = mariadb_pfs();
    let base = now_secs();
    server.exec(&format!(
        "DROP DATABASE IF EXISTS {DB}; CREATE DATABASE {DB}; USE {DB}; {}",
        schema(base)
    ));
    server.exec(
        "TRUNCATE TABLE performance_schema.events_statements_summary_by_digest;
         TRUNCATE TABLE performance_schema.events_statements_history_long;",
    );
    let url = server.url(DB);
    let stmts = workload(base);
    let mut dump = Value::Null;
    run(Duration::from_secs(300), async {
        dump = run_workload(&url, &stmts).await;
    });

    if std::env::var_os("ADVISE_DEBUG").is_some() {
        for r in server.query_strings(
            "SELECT NAME, ENABLED FROM performance_schema.setup_consumers UNION ALL SELECT 'history', COUNT(*) FROM performance_schema.events_statements_history_long",
        ) {
            eprintln!("{r:?}");
        }
    }
    // From performance_schema (literal samples from the statement history).
    let pfs = advise(&[
        "--from-performance-schema",
        "--backend-url",
        &url,
        "--large-rows",
        LARGE,
        "--format",
        "json",
    ]);
    assert_hot_spots(&pfs, true);
    let v: Value = serde_json::from_str(&pfs).unwrap();
    assert!(v["live"].as_bool().unwrap());

    // From a SHOW DIGESTS dump of the same workload.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("digests.json");
    std::fs::write(&file, serde_json::to_string_pretty(&dump).unwrap()).unwrap();
    let file = file.to_str().unwrap().to_string();
    let from_dump = advise(&[
        "--digests",
        &file,
        "--backend-url",
        &url,
        "--large-rows",
        LARGE,
        "--format",
        "json",
    ]);
    assert_hot_spots(&from_dump, false);

    // The same rows as `GET /digests` prints them: `hot_keys` a JSON object.
    let mut objects = dump.clone();
    for row in objects.as_array_mut().unwrap() {
        if let Some(h) = row["hot_keys"].as_str() {
            row["hot_keys"] = serde_json::from_str(h).unwrap();
        }
    }
    let file2 = dir.path().join("digests-objects.json");
    std::fs::write(&file2, serde_json::to_string_pretty(&objects).unwrap()).unwrap();
    let from_objects = advise(&[
        "--digests",
        file2.to_str().unwrap(),
        "--backend-url",
        &url,
        "--large-rows",
        LARGE,
        "--format",
        "json",
    ]);
    assert_hot_spots(&from_objects, false);

    // The text report ranks them and names the evidence.
    let text = advise(&[
        "--digests",
        &file,
        "--backend-url",
        &url,
        "--large-rows",
        LARGE,
    ]);
    assert!(text.contains("5 rule(s) proposed"), "{text}");
    assert!(text.contains("evidence: hot key slug = 'home'"), "{text}");

    // The rule file: migrate --apply creates what it needs, then check passes.
    let rules = advise(&[
        "--from-performance-schema",
        "--backend-url",
        &url,
        "--large-rows",
        LARGE,
        "--format",
        "toml",
    ]);
    let rules_dir = tempfile::tempdir().unwrap();
    std::fs::write(rules_dir.path().join("advised.toml"), &rules).unwrap();
    let rd = rules_dir.path().to_str().unwrap().to_string();
    let (code, out, err) = Cli::new(["check", "--rules", &rd]).run();
    assert_eq!(code, 0, "check without a database:\n{rules}\n{out}\n{err}");
    let (code, out, err) =
        Cli::new(["migrate", "--rules", &rd, "--backend-url", &url, "--apply"]).run();
    assert_eq!(code, 0, "migrate --apply:\n{rules}\n{out}\n{err}");
    let (code, out, err) = Cli::new(["check", "--rules", &rd, "--backend-url", &url]).run();
    assert_eq!(code, 0, "check --backend-url:\n{rules}\n{out}\n{err}");

    // Through a proxy with those rules: the purge is refused as the ring's caveat
    // says, while the ring keeps each key's newest 5 by itself.
    let proxy = Proxy::builder()
        .backend(server.addr())
        .rules_dir(rules_dir.path())
        .start();
    let proxied = proxy.url(DB);
    run(Duration::from_secs(60), async {
        let mut conn = connect(&proxied).await;
        for v in 0..8 {
            conn.query_drop(format!(
                "INSERT INTO visits (uid, visitor, at) VALUES (3, {v}, NOW(6))"
            ))
            .await
            .unwrap();
        }
        assert_refused_by(
            &mut conn,
            "DELETE l FROM visits l JOIN (SELECT uid, id FROM visits WHERE uid = 3 ORDER BY id DESC LIMIT 1 OFFSET 4) t ON l.uid = t.uid AND l.id < t.id",
            "visits_latest",
        )
        .await;
        let kept: Vec<i64> = conn
            .query("SELECT visitor FROM visits WHERE uid = 3 ORDER BY id DESC")
            .await
            .unwrap();
        assert_eq!(kept, vec![7, 6, 5, 4, 3]);
        conn.disconnect().await.unwrap();
    });
}

/// The same workload sent through a proxy without rules: `advise --admin` reads the
/// proxy's own `SHOW DIGESTS` and proposes the same five rules.
#[test]
fn advise_reads_a_running_proxys_digests() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = mariadb_pfs();
    let base = now_secs();
    server.exec(&format!(
        "DROP DATABASE IF EXISTS {DB_PROXY}; CREATE DATABASE {DB_PROXY}; USE {DB_PROXY}; {}",
        schema(base)
    ));
    const PW: &str = "advise-admin-pw";
    let (proxy, admin) = Proxy::builder()
        .backend(server.addr())
        .no_rules()
        .env("HEATSINK_ADMIN_PASSWORD", PW)
        .start_with_admin();
    let stmts = workload(base);
    let proxied = proxy.url(DB_PROXY);
    run(Duration::from_secs(300), async {
        run_workload(&proxied, &stmts).await;
    });
    let admin_url = format!("mysql://admin:{PW}@{admin}");
    let url = server.url(DB_PROXY);
    let report = advise(&[
        "--admin",
        &admin_url,
        "--backend-url",
        &url,
        "--large-rows",
        LARGE,
        "--format",
        "json",
    ]);
    assert_hot_spots(&report, false);
    server.exec(&format!("DROP DATABASE {DB_PROXY}"));
}

#[test]
fn a_workload_source_is_required() {
    let (code, _, err) = Cli::new(["advise", "--format", "json"]).run();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--admin") || err.contains("required"), "{err}");
    let (code, _, err) = Cli::new(["advise", "--from-performance-schema"]).run();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--backend-url"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"not\": \"an array\"}").unwrap();
    let (code, _, err) = Cli::new(["advise", "--digests"]).arg(&bad).run();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not a JSON array of digest rows"), "{err}");
}
