//! `heatsink migrate --revert RULE`: a rule taken back out, per kind, under traffic.
//!
//! Each test migrates a rule, sends traffic through the proxy (and the same
//! statements to a plain reference table directly on MariaDB), removes the rule from
//! the proxy's rule files and reloads it (`RELOAD RULES`, confirmed by `SHOW RULES`),
//! sends more traffic, runs the revert and compares the logical table with the
//! reference: counter totals exact, a ring's log holding the newest N rows per key,
//! the side objects of rollups and timelines gone, a partitioned table's triggers
//! gone and its partitioning kept. One test runs increments through two proxies
//! while the rule leaves both and the revert runs; others check that a dry run
//! changes nothing, that a second revert finds nothing to do, and that `check`
//! refuses a rule set that dropped a rule whose side tables still hold data.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cli::{heatsink, Cli};
use common::client::{connect, run};
use common::fixture::{scalar, table_exists, Env, Rule};
use common::{mariadb, Proxy};
use mysql_async::prelude::*;
use mysql_async::Conn;

const ADMIN_PW: &str = "adm-pw";
const LIMIT: Duration = Duration::from_secs(240);

/// `heatsink migrate --revert RULE --rules DIR --backend-url …/db [--apply] [args]`.
fn revert(rules: &Path, db: &str, rule: &str, apply: bool, args: &[&str]) -> (i32, String, String) {
    let mut cli = Cli::new(["migrate", "--revert", rule, "--rules"])
        .arg(rules)
        .arg("--backend-url")
        .arg(mariadb().url(db));
    for a in args {
        cli = cli.arg(a);
    }
    if apply {
        cli = cli.arg("--apply");
    }
    cli.run()
}

/// [`revert`] that must succeed; returns stdout.
fn revert_ok(rules: &Path, db: &str, rule: &str, apply: bool) -> String {
    let (code, out, err) = revert(rules, db, rule, apply, &["--observe", "0.5"]);
    assert_eq!(code, 0, "revert failed:\n{out}\n{err}");
    out
}

/// `heatsink check --rules DIR --backend-url …/db`: (exit code, stdout + stderr).
fn check(rules: &Path, db: &str) -> (i32, String) {
    let url = mariadb().url(db);
    let dir = rules.to_str().expect("utf-8 path");
    let (code, out, err) = heatsink(&["check", "--rules", dir, "--backend-url", &url]);
    (code, format!("{out}{err}"))
}

fn admin_url(addr: SocketAddr) -> String {
    format!("mysql://admin:{ADMIN_PW}@{addr}/?prefer_socket=false")
}

/// The names `SHOW RULES` lists on the admin port at `addr`.
async fn shown_rules(addr: SocketAddr) -> Vec<String> {
    let mut admin = connect(&admin_url(addr)).await;
    let rows: Vec<mysql_async::Row> = admin.query("SHOW RULES").await.expect("SHOW RULES");
    let _ = admin.disconnect().await;
    rows.into_iter()
        .map(|r| r.get::<String, usize>(0).unwrap_or_default())
        .collect()
}

/// `RELOAD RULES` on the admin port at `addr`, then waits until `SHOW RULES` no
/// longer lists `rule`.
async fn reload_without(addr: SocketAddr, rule: &str) {
    let mut admin = connect(&admin_url(addr)).await;
    admin
        .query_drop("RELOAD RULES")
        .await
        .expect("RELOAD RULES");
    let _ = admin.disconnect().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while shown_rules(addr).await.iter().any(|r| r == rule) {
        assert!(
            Instant::now() < deadline,
            "{rule} still shown after the reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Rows of a query run as root directly on MariaDB, as text.
fn rows(sql: &str) -> Vec<Vec<Option<String>>> {
    mariadb().query_strings(sql)
}

fn count(sql: &str) -> u64 {
    scalar(sql).and_then(|v| v.parse().ok()).unwrap_or_default()
}

/// The triggers of database `db`.
fn triggers(db: &str) -> Vec<String> {
    rows(&format!(
        "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = '{db}' ORDER BY 1"
    ))
    .into_iter()
    .map(|r| r[0].clone().unwrap_or_default())
    .collect()
}

/// Sends `sql` through the proxy and directly to the reference (the statement with
/// `hits` named `hits_ref`, or the given reference statement).
async fn both(proxied: &mut Conn, direct: &mut Conn, sql: &str, reference: &str) {
    proxied
        .query_drop(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql} through the proxy: {e}"));
    direct
        .query_drop(reference)
        .await
        .unwrap_or_else(|e| panic!("{reference} directly: {e}"));
}

const HITS: &str = "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0, \
     views BIGINT NOT NULL DEFAULT 0); \
     CREATE TABLE hits_ref LIKE hits; \
     INSERT INTO hits VALUES ('home', 10, 1), ('about', 0, 0), ('blog', -5, 7), ('new1', 0, 0), \
       ('new2', 3, 3); \
     INSERT INTO hits_ref SELECT * FROM hits;";

fn counter_rule() -> String {
    Rule::counter("page_hits", "hits")
        .columns(&["cnt", "views"])
        .slots(8)
        .toml()
}

/// Increments, absolute sets, new keys and deletes through the proxy and on the
/// reference, by a seeded walk.
async fn counter_traffic(proxied: &mut Conn, direct: &mut Conn, seed: u64, n: usize) {
    traffic(proxied, direct, seed, n, false).await
}

/// Increments only: what stays exact while a rule leaves the proxies without
/// draining first.
async fn increments(proxied: &mut Conn, direct: &mut Conn, seed: u64, n: usize) {
    traffic(proxied, direct, seed, n, true).await
}

async fn traffic(
    proxied: &mut Conn,
    direct: &mut Conn,
    seed: u64,
    n: usize,
    only_increments: bool,
) {
    let slugs = ["home", "about", "blog", "new1", "new2"];
    let mut x = seed;
    for _ in 0..n {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let slug = slugs[(x >> 33) as usize % slugs.len()];
        let d = ((x >> 40) % 9) as i64 - 3;
        let step = if d < 0 {
            format!("- {}", -d)
        } else {
            format!("+ {d}")
        };
        let up = d.abs() + 1;
        let pick = if only_increments { 19 } else { (x >> 50) % 20 };
        let upsert = format!(
            "INSERT INTO hits (slug, cnt, views) VALUES ('{slug}', {up}, 1) \
             ON DUPLICATE KEY UPDATE cnt = cnt + {up}, views = views + 1"
        );
        // Every key keeps a row (the rule creates the row of an incremented key that
        // has none, which MariaDB would not): a delete is followed by an insert.
        let statements = match pick {
            0 => vec![format!(
                "UPDATE hits SET cnt = {d}, views = 0 WHERE slug = '{slug}'"
            )],
            1 => vec![format!("DELETE FROM hits WHERE slug = '{slug}'"), upsert],
            2..=4 => vec![upsert],
            _ => vec![format!(
                "UPDATE hits SET cnt = cnt {step}, views = views + 1 WHERE slug = '{slug}'"
            )],
        };
        for sql in statements {
            let reference = sql.replace("hits", "hits_ref");
            both(proxied, direct, &sql, &reference).await;
        }
    }
}

fn hits_rows(table: &str, db: &str) -> Vec<Vec<Option<String>>> {
    rows(&format!(
        "SELECT slug, cnt, views FROM {db}.{table} ORDER BY slug"
    ))
}

/// The logical table as the proxy shows it equals the reference.
async fn assert_same_through_proxy(env: &Env) {
    let mut c = env.proxied().await;
    let through: Vec<(String, i64, i64)> = c
        .query("SELECT slug, cnt, views FROM hits ORDER BY slug")
        .await
        .expect("read through the proxy");
    let mut d = env.direct().await;
    let reference: Vec<(String, i64, i64)> = d
        .query("SELECT slug, cnt, views FROM hits_ref ORDER BY slug")
        .await
        .expect("read the reference");
    assert_eq!(through, reference);
}

#[test]
fn counter_revert_folds_every_slot_exactly_and_a_dry_run_changes_nothing() {
    run(LIMIT, async {
        let env = Env::builder("revert_counter")
            .schema(HITS)
            .rule("hits.toml", counter_rule())
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        counter_traffic(&mut p, &mut d, 7, 400).await;
        assert_same_through_proxy(&env).await;
        let slots = count(&format!("SELECT COUNT(*) FROM {db}.hits_slots"));
        assert!(slots > 0, "the traffic left no slot rows");
        // The rule leaves the proxy; until the revert, reads through it show the base
        // values only, and writes go to the logical table.
        env.remove_rule("hits.toml");
        reload_without(env.admin_addr(), "page_hits").await;
        drop(p);
        let mut p = env.proxied().await;
        increments(&mut p, &mut d, 11, 200).await;

        // A dry run says what it would do and changes nothing.
        let before = (hits_rows("hits", &db), hits_rows("hits_slots", &db));
        let printed = revert_ok(env.rules_path(), &db, "page_hits", false);
        assert!(printed.contains("dry run"), "{printed}");
        assert!(printed.contains("are folded into"), "{printed}");
        assert!(printed.contains("RENAME TABLE"), "{printed}");
        assert_eq!(
            before,
            (hits_rows("hits", &db), hits_rows("hits_slots", &db))
        );

        let applied = revert_ok(env.rules_path(), &db, "page_hits", true);
        assert!(applied.contains("-- applied: folded"), "{applied}");
        assert_eq!(
            hits_rows("hits", &db),
            hits_rows("hits_ref", &db),
            "{applied}"
        );
        assert!(!table_exists(&db, "hits_slots"));
        assert!(!table_exists(&db, "hits_slots_hs_revert"));
        assert_eq!(triggers(&db), Vec::<String>::new());
        assert_same_through_proxy(&env).await;

        // Idempotent: a second run finds nothing to fold and changes nothing.
        let again = revert_ok(env.rules_path(), &db, "page_hits", true);
        assert!(again.contains("nothing to fold"), "{again}");
        assert_eq!(hits_rows("hits", &db), hits_rows("hits_ref", &db));
        // And the proxy keeps working on the plain table.
        counter_traffic(&mut p, &mut d, 13, 100).await;
        assert_same_through_proxy(&env).await;
    });
}

#[test]
fn a_draining_counter_folds_online_and_every_statement_stays_exact() {
    run(LIMIT, async {
        let env = Env::builder("revert_drain")
            .schema(HITS)
            .rule("hits.toml", counter_rule())
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        counter_traffic(&mut p, &mut d, 5, 300).await;
        assert!(count(&format!("SELECT COUNT(*) FROM {db}.hits_slots")) > 0);
        // Step 1: the rule drains on the proxy; sets, deletes and inserts stay exact.
        env.write_rule("hits.toml", &format!("{}drain = true\n", counter_rule()));
        let mut admin = connect(&admin_url(env.admin_addr())).await;
        admin
            .query_drop("RELOAD RULES")
            .await
            .expect("RELOAD RULES");
        let shown: Vec<mysql_async::Row> = admin.query("SHOW RULES").await.expect("SHOW RULES");
        let mode = shown[0]
            .columns_ref()
            .iter()
            .position(|c| c.name_str() == "mode")
            .expect("a mode column");
        assert_eq!(
            shown[0].get::<String, usize>(mode).as_deref(),
            Some("drain")
        );
        drop(admin);
        counter_traffic(&mut p, &mut d, 6, 200).await;
        assert_same_through_proxy(&env).await;
        // Step 2: the revert folds online, the rule still in force; nothing dropped.
        let folded = revert_ok(env.rules_path(), &db, "page_hits", true);
        assert!(folded.contains("drains"), "{folded}");
        assert_eq!(
            count(&format!("SELECT COUNT(*) FROM {db}.hits_slots")),
            0,
            "{folded}"
        );
        assert!(table_exists(&db, "hits_slots"));
        assert_eq!(hits_rows("hits", &db), hits_rows("hits_ref", &db));
        counter_traffic(&mut p, &mut d, 8, 200).await;
        assert_same_through_proxy(&env).await;
        assert_eq!(count(&format!("SELECT COUNT(*) FROM {db}.hits_slots")), 0);
        // Step 3: the rule leaves; everything still exact, then the revert drops.
        env.remove_rule("hits.toml");
        reload_without(env.admin_addr(), "page_hits").await;
        counter_traffic(&mut p, &mut d, 9, 200).await;
        let dropped = revert_ok(env.rules_path(), &db, "page_hits", true);
        assert!(!table_exists(&db, "hits_slots"), "{dropped}");
        assert_eq!(
            hits_rows("hits", &db),
            hits_rows("hits_ref", &db),
            "{dropped}"
        );
        assert_same_through_proxy(&env).await;
    });
}

#[test]
fn counter_revert_is_refused_while_the_rule_is_in_the_rule_files_or_slots_change() {
    run(LIMIT, async {
        let env = Env::builder("revert_refusals")
            .schema(HITS)
            .rule("hits.toml", counter_rule())
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        // Still in the proxy's rule files.
        let (code, out, err) = revert(env.rules_path(), &db, "page_hits", true, &[]);
        assert_ne!(code, 0, "{out}");
        assert!(err.contains("is still in"), "{err}");
        assert!(table_exists(&db, "hits_slots"));

        // Not in the rule files, but a proxy still runs it: its increments change the
        // slot table while the revert watches it.
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            let url = env.url();
            tokio::spawn(async move {
                let mut c = connect(&url).await;
                while !stop.load(Ordering::Relaxed) {
                    c.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
                        .await
                        .expect("increment");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rules = elsewhere.path().to_path_buf();
        let db2 = db.clone();
        let (code, out, err) = tokio::task::spawn_blocking(move || {
            revert(&rules, &db2, "page_hits", true, &["--observe", "1"])
        })
        .await
        .expect("revert");
        stop.store(true, Ordering::Relaxed);
        writer.await.expect("writer");
        assert_ne!(code, 0, "{out}");
        assert!(err.contains("changed while it was watched"), "{err}");
        assert!(err.contains("still runs rule 'page_hits'"), "{err}");
        assert!(table_exists(&db, "hits_slots"));

        // A rule nobody recorded.
        let (code, _, err) = revert(elsewhere.path(), &db, "no_such_rule", false, &[]);
        assert_ne!(code, 0);
        assert!(err.contains("is not recorded"), "{err}");
    });
}

#[test]
fn check_refuses_a_rule_set_without_a_rule_whose_side_table_holds_data() {
    run(LIMIT, async {
        let env = Env::builder("revert_check")
            .schema(HITS)
            .rule("hits.toml", counter_rule())
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        counter_traffic(&mut p, &mut d, 3, 100).await;
        let (code, out) = check(env.rules_path(), &db);
        assert_eq!(code, 0, "{out}");

        env.remove_rule("hits.toml");
        let (code, out) = check(env.rules_path(), &db);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("`revert_check`.`hits_slots`"), "{out}");
        assert!(out.contains("heatsink migrate --revert page_hits"), "{out}");

        reload_without(env.admin_addr(), "page_hits").await;
        revert_ok(env.rules_path(), &db, "page_hits", true);
        let (code, out) = check(env.rules_path(), &db);
        assert_eq!(code, 0, "{out}");
        assert!(!out.contains("page_hits"), "{out}");
        assert_eq!(hits_rows("hits", &db), hits_rows("hits_ref", &db));
    });
}

#[test]
fn counter_revert_under_load_through_two_proxies_loses_and_doubles_nothing() {
    run(LIMIT, async {
        let env = Env::builder("revert_load")
            .schema(
                "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0); \
                 INSERT INTO hits VALUES ('a', 0), ('b', 0), ('c', 0);",
            )
            .rule(
                "hits.toml",
                Rule::counter("load_hits", "hits").slots(8).toml(),
            )
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        let (second, second_admin) = {
            let (b, addr) = Proxy::builder()
                .rules_dir(env.rules_path())
                .listen_arg("--admin");
            (b.env("HEATSINK_ADMIN_PASSWORD", ADMIN_PW).start(), addr)
        };
        let urls = [env.url(), second.url(&db)];
        let acked = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for i in 0..16 {
            let (url, acked, failed, stop) = (
                urls[i % 2].clone(),
                acked.clone(),
                failed.clone(),
                stop.clone(),
            );
            workers.push(tokio::spawn(async move {
                let mut c = connect(&url).await;
                let slug = ["a", "b", "c"][i % 3];
                let sql = format!("UPDATE hits SET cnt = cnt + 1 WHERE slug = '{slug}'");
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    match c.query_drop(&sql).await {
                        Ok(()) => acked.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before_reload = acked.load(Ordering::Relaxed);
        assert!(before_reload > 0, "no increment went through");
        // The rule leaves both proxies while the increments go on, then the revert
        // runs under the same load.
        env.remove_rule("hits.toml");
        reload_without(env.admin_addr(), "load_hits").await;
        reload_without(second_admin, "load_hits").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rules = env.rules_path().to_path_buf();
        let db2 = db.clone();
        let (code, out, err) = tokio::task::spawn_blocking(move || {
            revert(
                &rules,
                &db2,
                "load_hits",
                true,
                &["--observe", "1", "--batch", "2"],
            )
        })
        .await
        .expect("revert");
        assert_eq!(code, 0, "{out}\n{err}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await.expect("worker");
        }
        let total = count(&format!("SELECT SUM(cnt) FROM {db}.hits"));
        let acked = acked.load(Ordering::Relaxed);
        eprintln!(
            "two proxies: {acked} increments acknowledged ({before_reload} before the reloads), total {total}"
        );
        assert_eq!(failed.load(Ordering::Relaxed), 0, "{out}");
        assert_eq!(total, acked, "{out}");
        assert!(out.contains("-- applied: folded"), "{out}");
        assert!(acked > before_reload, "no increment during the revert");
        assert!(!table_exists(&db, "hits_slots"));
        drop(second);
    });
}

const VISITS: &str =
    "CREATE TABLE visits (id INT AUTO_INCREMENT PRIMARY KEY, profile_id INT NULL, \
     visitor INT NOT NULL, KEY (profile_id)); \
     CREATE TABLE visits_ref LIKE visits;";

/// The newest `n` visitors of each key of the reference (by id: its rows went in
/// in the order the test sent them), as the ring keeps them.
fn newest(db: &str, n: usize) -> Vec<Vec<Option<String>>> {
    rows(&format!(
        "SELECT profile_id, visitor FROM (SELECT profile_id, visitor, ROW_NUMBER() OVER \
         (PARTITION BY profile_id ORDER BY id DESC) AS rn FROM {db}.visits_ref) v \
         WHERE rn <= {n} OR profile_id IS NULL ORDER BY profile_id, visitor"
    ))
}

#[test]
fn ring_revert_leaves_the_newest_rows_of_each_key_in_the_log() {
    run(LIMIT, async {
        const SIZE: usize = 5;
        let db = "revert_ring";
        common::fixture::fresh_db(db, VISITS);
        // History from before the rule: more than SIZE rows for some keys, and rows
        // without a key.
        let mut history = Vec::new();
        for i in 0..40 {
            let key = if i % 13 == 0 {
                "NULL".to_string()
            } else {
                (i % 4).to_string()
            };
            history.push(format!("({key}, {i})"));
        }
        mariadb().exec(&format!(
            "INSERT INTO {db}.visits (profile_id, visitor) VALUES {v}; \
             INSERT INTO {db}.visits_ref (profile_id, visitor) VALUES {v};",
            v = history.join(", ")
        ));
        let env = Env::builder(db)
            .rule(
                "ring.toml",
                Rule::ring("recent", "visits")
                    .key(&["profile_id"])
                    .size(SIZE)
                    .ring_table("visits_ring")
                    .order_by("id")
                    .toml(),
            )
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut visitor = 1000;
        let mut insert = |key: u32| {
            visitor += 1;
            (
                format!("INSERT INTO visits (profile_id, visitor) VALUES ({key}, {visitor})"),
                format!("INSERT INTO visits_ref (profile_id, visitor) VALUES ({key}, {visitor})"),
            )
        };
        for i in 0..60u32 {
            let (sql, reference) = insert(i % 6);
            both(&mut p, &mut d, &sql, &reference).await;
        }
        // A whole key deleted through the rule, and a row appended to the log
        // directly (the log's trigger mirrors it into the ring).
        both(
            &mut p,
            &mut d,
            "DELETE FROM visits WHERE profile_id = 2",
            "DELETE FROM visits_ref WHERE profile_id = 2",
        )
        .await;
        let (sql, reference) = insert(3);
        let mut d2 = env.direct().await;
        both(&mut d2, &mut d, &sql, &reference).await;
        // The rule leaves the proxy; its inserts now go to the log, and the log's
        // trigger keeps the ring in step.
        env.remove_rule("ring.toml");
        reload_without(env.admin_addr(), "recent").await;
        drop(p);
        let mut p = env.proxied().await;
        for i in 0..20u32 {
            let (sql, reference) = insert(i % 7);
            both(&mut p, &mut d, &sql, &reference).await;
        }
        let log_before = rows(&format!("SELECT * FROM {db}.visits ORDER BY id"));
        let ring_before = rows(&format!("SELECT * FROM {db}.visits_ring ORDER BY id"));
        let printed = revert_ok(env.rules_path(), db, "recent", false);
        assert_eq!(
            log_before,
            rows(&format!("SELECT * FROM {db}.visits ORDER BY id"))
        );
        assert_eq!(
            ring_before,
            rows(&format!("SELECT * FROM {db}.visits_ring ORDER BY id"))
        );
        assert_eq!(triggers(db).len(), 2, "a dry run dropped a trigger");
        assert!(
            printed.contains("holds for each key exactly what the ring"),
            "{printed}"
        );
        assert!(printed.contains("newest 5 rows"), "{printed}");
        let applied = revert_ok(env.rules_path(), db, "recent", true);
        let got = rows(&format!(
            "SELECT profile_id, visitor FROM {db}.visits ORDER BY profile_id, visitor"
        ));
        assert_eq!(got, newest(db, SIZE), "{applied}");
        assert!(!table_exists(db, "visits_ring"));
        assert!(!table_exists(db, "visits_ring_seq"));
        assert_eq!(triggers(db), Vec::<String>::new());
        // Ids keep increasing: a new row gets an id above every id handed out.
        let max_seen = count(&format!(
            "SELECT GREATEST((SELECT MAX(id) FROM {db}.visits), 0)"
        ));
        p.query_drop("INSERT INTO visits (profile_id, visitor) VALUES (1, 1)")
            .await
            .expect("insert after the revert");
        assert!(p.last_insert_id().unwrap_or_default() > max_seen);
        // A second run copies nothing again.
        let again = revert_ok(env.rules_path(), db, "recent", true);
        assert!(
            again.contains("only dropping") || again.contains("is gone"),
            "{again}"
        );
        assert_eq!(
            count(&format!("SELECT COUNT(*) FROM {db}.visits")),
            got.len() as u64 + 1
        );
    });
}

const PLAYS: &str = "CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME NULL, \
     track_id INT NULL, country VARCHAR(16) NULL, KEY (track_id)); \
     CREATE TABLE plays_ref LIKE plays; \
     INSERT INTO plays (created_at, track_id, country) VALUES ('2024-05-01 10:00:00', 1, 'de'), \
       ('2024-05-01 11:30:00', 2, 'fr'), (NULL, 1, NULL); \
     INSERT INTO plays_ref SELECT * FROM plays; \
     CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
       PRIMARY KEY (user_id, follower_id), KEY (follower_id)); \
     CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
       body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id)); \
     INSERT INTO follower VALUES (1, 2), (1, 3), (2, 3); \
     INSERT INTO message (user_id, body) VALUES (2, 'a'), (3, 'b'), (3, 'c');";

#[test]
fn rollup_and_timeline_reverts_drop_their_triggers_and_side_tables() {
    run(LIMIT, async {
        let rollup = Rule::rollup("plays_daily", "plays", "plays_by_day", "created_at", "day")
            .dimensions(&["track_id", "country"])
            .toml();
        let timeline = Rule::timeline("friends")
            .set("mode", "\"push\"")
            .set("mailbox", "\"mailbox\"")
            .set("mailbox_size", "10")
            .toml();
        let env = Env::builder("revert_side")
            .schema(PLAYS)
            .rule("rollup.toml", rollup)
            .rule("timeline.toml", timeline)
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        assert!(table_exists(&db, "plays_by_day") && table_exists(&db, "mailbox"));
        assert_eq!(triggers(&db).len(), 3 + 6, "{:?}", triggers(&db));
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        for i in 0..30 {
            let sql = format!(
                "INSERT INTO plays (created_at, track_id, country) VALUES ('2024-05-0{} 0{}:00:00', {}, 'de')",
                1 + i % 3,
                i % 10,
                i % 4
            );
            both(&mut p, &mut d, &sql, &sql.replace("plays", "plays_ref")).await;
        }
        p.query_drop("INSERT INTO message (user_id, body) VALUES (2, 'd')")
            .await
            .expect("post");
        let read = "SELECT track_id, COUNT(*) FROM plays GROUP BY track_id ORDER BY track_id";
        let before: Vec<(Option<i64>, i64)> = p.query(read).await.expect("rollup read");

        env.remove_rule("rollup.toml");
        env.remove_rule("timeline.toml");
        reload_without(env.admin_addr(), "plays_daily").await;
        reload_without(env.admin_addr(), "friends").await;
        for name in ["plays_daily", "friends"] {
            let printed = revert_ok(env.rules_path(), &db, name, false);
            assert!(printed.contains("DROP TRIGGER IF EXISTS"), "{printed}");
            assert!(printed.contains("DROP TABLE IF EXISTS"), "{printed}");
        }
        assert_eq!(triggers(&db).len(), 9, "a dry run dropped something");
        for name in ["plays_daily", "friends"] {
            revert_ok(env.rules_path(), &db, name, true);
        }
        assert!(!table_exists(&db, "plays_by_day"));
        assert!(!table_exists(&db, "mailbox"));
        assert_eq!(triggers(&db), Vec::<String>::new());
        // The logs are what the application wrote, and read the same.
        assert_eq!(
            rows(&format!("SELECT * FROM {db}.plays ORDER BY id")),
            rows(&format!("SELECT * FROM {db}.plays_ref ORDER BY id"))
        );
        let after: Vec<(Option<i64>, i64)> = p.query(read).await.expect("plain read");
        assert_eq!(before, after);
        // Writes keep working without the triggers.
        p.query_drop("INSERT INTO plays (created_at, track_id) VALUES (NOW(), 9)")
            .await
            .expect("insert after the revert");
        p.query_drop("DELETE FROM message WHERE body = 'd'")
            .await
            .expect("delete after the revert");
        let again = revert_ok(env.rules_path(), &db, "friends", true);
        assert!(
            again.contains("none of its triggers and side tables is left"),
            "{again}"
        );
    });
}

#[test]
fn partition_revert_drops_its_triggers_and_keeps_the_partitioning() {
    run(LIMIT, async {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        let today = common::fixture::utc_date(now);
        let env = Env::builder("revert_partition")
            .schema(format!(
                "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT, UUID VARCHAR(40) NOT NULL, \
                   Message JSON NOT NULL, Inserted DATE NOT NULL, \
                   PRIMARY KEY (ID, Inserted), UNIQUE KEY (UUID, Inserted)) \
                   PARTITION BY RANGE COLUMNS (Inserted) (PARTITION p0 VALUES LESS THAN ('{today}'), \
                   PARTITION pmax VALUES LESS THAN (MAXVALUE));"
            ))
            .rule("p.toml", Rule::partition("messages_by_day", "Messages").toml())
            .migrate()
            .admin(ADMIN_PW)
            .start();
        let db = env.db.clone();
        let parts = |db: &str| {
            rows(&format!(
                "SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS \
                 WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'Messages' ORDER BY PARTITION_ORDINAL_POSITION"
            ))
        };
        assert_eq!(triggers(&db).len(), 2, "{:?}", triggers(&db));
        let mut p = env.proxied().await;
        p.query_drop(format!(
            "INSERT INTO Messages (UUID, Message, Inserted) VALUES ('m-{now}-1', '{{}}', '{today}')"
        ))
        .await
        .expect("insert");
        let layout = parts(&db);
        assert!(layout.len() >= 2, "{layout:?}");
        env.remove_rule("p.toml");
        reload_without(env.admin_addr(), "messages_by_day").await;
        revert_ok(env.rules_path(), &db, "messages_by_day", true);
        assert_eq!(triggers(&db), Vec::<String>::new());
        assert_eq!(parts(&db), layout);
        // Without the triggers a row off its key's date is stored (the rule refused it).
        p.query_drop(format!(
            "INSERT INTO Messages (UUID, Message, Inserted) VALUES ('m-{now}-2', '{{}}', '2001-01-01')"
        ))
        .await
        .expect("insert without the rule");
        assert_eq!(count(&format!("SELECT COUNT(*) FROM {db}.Messages")), 2);
    });
}
