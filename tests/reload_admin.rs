//! Hot reload and the admin port, end to end against the real MariaDB.
//!
//! Each test has its own database (`ra_<name>`), rules directory and proxy (with
//! `--admin` and `--metrics`). Rule changes are observed through the admin port and
//! `/metrics`; rewrites are checked on the physical tables directly.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cli::Cli;
use common::client::{connect, run};
use common::fixture::{counter_rule, create_counter_db, Env};
use common::{free_port, http_get, mariadb, sample, Proxy};

/// Time limit of each async test body.
const LIMIT: Duration = Duration::from_secs(120);
use mysql_async::prelude::*;
use mysql_async::{Conn, Row, Value};

const RULE: &str = "page_hits";
const ADMIN_PW: &str = "adm-pw";

/// Database `ra_<name>` with the counter fixture (slot table made by `heatsink
/// migrate`), a rules directory holding `files`, and a proxy with an admin port
/// (password [`ADMIN_PW`]) and a metrics endpoint.
fn start_env(name: &str, files: &[(&str, &str)]) -> Env {
    let db = format!("ra_{name}");
    create_counter_db(&db, "", "('home', 10), ('about', 3)");
    let mut builder = Env::builder(db).metrics().admin(ADMIN_PW);
    for (file, text) in files {
        builder = builder.rule(file, *text);
    }
    builder.start()
}

/// What these tests read of an [`Env`].
trait ReloadEnv {
    /// A connection to the admin port as `admin`.
    async fn admin(&self) -> Conn;
    /// Sum of the slot rows of `slug` (what rewritten increments add to).
    fn slot_sum(&self, slug: &str) -> i64;
    /// The logical row's own value (what passthrough increments add to).
    fn base(&self, slug: &str) -> i64;
    /// One number read directly on MariaDB.
    fn scalar(&self, sql: &str) -> i64;
    /// The value of one metric series (labels included), 0 when absent.
    fn metric(&self, series: &str) -> f64;
    /// Waits until the admin port lists exactly `names`.
    async fn wait_rules(&self, names: &[&str]);
    /// Waits until a metric series reaches `at_least`.
    async fn wait_metric(&self, series: &str, at_least: f64);
}

impl ReloadEnv for Env {
    async fn admin(&self) -> Conn {
        connect(&admin_url(self.admin_addr(), "admin", ADMIN_PW, "")).await
    }

    fn slot_sum(&self, slug: &str) -> i64 {
        self.scalar(&format!(
            "SELECT COALESCE(SUM(cnt), 0) FROM {}.hits_slots WHERE slug = '{slug}'",
            self.db
        ))
    }

    fn base(&self, slug: &str) -> i64 {
        self.scalar(&format!(
            "SELECT cnt FROM {}.hits WHERE slug = '{slug}'",
            self.db
        ))
    }

    fn scalar(&self, sql: &str) -> i64 {
        self.backend_scalar(sql)
            .expect("a value")
            .parse()
            .expect("a number")
    }

    fn metric(&self, series: &str) -> f64 {
        metric(&scrape(self.metrics_addr()), series)
    }

    async fn wait_rules(&self, names: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut admin = self.admin().await;
        loop {
            let (_, rows) = admin_query(&mut admin, "SHOW RULES")
                .await
                .expect("SHOW RULES");
            let now: Vec<String> = rows.iter().map(|r| cell(&r[0])).collect();
            if now == names {
                return;
            }
            pause_before(self, deadline, || {
                format!("rules are {now:?}, expected {names:?}")
            })
            .await;
        }
    }

    async fn wait_metric(&self, series: &str, at_least: f64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let v = self.metric(series);
            if v >= at_least {
                return;
            }
            pause_before(self, deadline, || {
                format!("{series} = {v}, expected >= {at_least}")
            })
            .await;
        }
    }
}

/// Waits 100 ms before the next poll; fails with `what` and the proxy's log once
/// `deadline` has passed.
async fn pause_before(env: &Env, deadline: Instant, what: impl FnOnce() -> String) {
    assert!(
        Instant::now() < deadline,
        "{}; log:\n{}",
        what(),
        env.proxy.log_text()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn admin_url(addr: SocketAddr, user: &str, password: &str, db: &str) -> String {
    format!("mysql://{user}:{password}@{addr}/{db}?prefer_socket=false")
}

fn cell(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

/// Column names and rows (as text) of an admin command.
async fn admin_query(
    conn: &mut Conn,
    sql: &str,
) -> Result<(Vec<String>, Vec<Vec<Option<String>>>), mysql_async::Error> {
    let mut result = conn.query_iter(sql).await?;
    let columns: Vec<String> = result
        .columns()
        .map(|cols| cols.iter().map(|c| c.name_str().into_owned()).collect())
        .unwrap_or_default();
    let rows: Vec<Row> = result.collect().await?;
    let rows = rows
        .into_iter()
        .map(|r| {
            r.unwrap()
                .into_iter()
                .map(|v| match v {
                    Value::NULL => None,
                    Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    Value::Int(i) => Some(i.to_string()),
                    Value::UInt(u) => Some(u.to_string()),
                    other => Some(format!("{other:?}")),
                })
                .collect()
        })
        .collect();
    Ok((columns, rows))
}

/// The `/metrics` body.
fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of one series (exact name with labels), 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
}

const INC: &str = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'";
const OK_SERIES: &str = "heatsink_rule_reloads_total{result=\"ok\"}";
const ERR_SERIES: &str = "heatsink_rule_reloads_total{result=\"error\"}";

#[test]
fn rules_reload_on_file_change_sighup_and_admin_command() {
    let env = start_env("triggers", &[]);
    run(LIMIT, async {
        let mut admin = env.admin().await;
        let (_, rows) = admin_query(&mut admin, "SHOW RULES").await.unwrap();
        assert!(rows.is_empty(), "{rows:?}");
        let mut c = env.proxied().await;
        // No rules: the increment lands on the logical row.
        c.query_drop(INC).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (11, 0));

        // File watch.
        env.write_rule("hits.toml", &counter_rule(RULE));
        env.wait_rules(&[RULE]).await;
        assert_eq!(env.metric(OK_SERIES), 1.0);
        c.query_drop(INC).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (11, 1));
        let log = env.proxy.log_text();
        assert!(
            log.lines().any(|l| l.contains("rules reloaded")
                && l.contains("file change")
                && l.contains(RULE)),
            "{log}"
        );

        // SIGHUP reloads even without a change.
        env.sighup();
        env.wait_metric(OK_SERIES, 2.0).await;
        assert!(env
            .proxy
            .log_text()
            .lines()
            .any(|l| l.contains("rules reloaded") && l.contains("SIGHUP")));
        c.query_drop(INC).await.unwrap();
        assert_eq!(env.slot_sum("home"), 2);

        // RELOAD RULES answers OK with the rule names.
        admin.query_drop("reload rules").await.unwrap();
        assert_eq!(admin.info(), format!("rules reloaded: {RULE}"));
        assert_eq!(env.metric(OK_SERIES), 3.0);
        // The same info reaches the mariadb CLI whole (it sends CLIENT_SESSION_TRACK,
        // mysql_async does not; the info's framing differs).
        let out = std::process::Command::new("mariadb")
            .args(["--protocol=tcp", "-h127.0.0.1", "-uadmin", "-vvv"])
            .arg(format!("-P{}", env.admin_addr().port()))
            .arg(format!("-p{ADMIN_PW}"))
            .args(["-e", "RELOAD RULES"])
            .output()
            .expect("run mariadb");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(
            text.lines().any(|l| l == format!("rules reloaded: {RULE}")),
            "{text}"
        );
        assert_eq!(env.metric(OK_SERIES), 4.0);

        // Removing the file switches the rule off again.
        env.remove_rule("hits.toml");
        env.wait_rules(&[]).await;
        c.query_drop(INC).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (12, 2));
        assert_eq!(env.metric(ERR_SERIES), 0.0);
    });
}

#[test]
fn a_broken_rule_file_keeps_the_previous_rules() {
    let env = start_env("broken", &[("hits.toml", &counter_rule(RULE))]);
    run(LIMIT, async {
        let mut c = env.proxied().await;
        c.query_drop(INC).await.unwrap();
        assert_eq!(env.slot_sum("home"), 1);

        // A syntax error on line 3 of a new file.
        env.write_rule(
            "broken.toml",
            "[[counter]]\nname = \"other\"\ntable = = \"x\"\n",
        );
        env.wait_metric(ERR_SERIES, 1.0).await;
        env.wait_rules(&[RULE]).await;
        // Traffic keeps flowing on the previous rules.
        c.query_drop(INC).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (10, 2));
        let log = env.proxy.log_text();
        assert!(log.contains("broken.toml:3"), "{log}");
        assert!(log.contains("previous rules stay in force"), "{log}");

        // The watcher reported this content once; RELOAD RULES reports it again.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(env.metric(ERR_SERIES), 1.0);
        let mut admin = env.admin().await;
        let e = admin.query_drop("RELOAD RULES").await.unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("broken.toml:3"), "{msg}");
        assert!(msg.contains("previous rules stay in force"), "{msg}");
        assert_eq!(env.metric(ERR_SERIES), 2.0);
        assert_eq!(env.metric(OK_SERIES), 0.0);

        // A semantic error (validation, not syntax) is refused the same way.
        env.write_rule(
            "broken.toml",
            &counter_rule(RULE).replace("slots = 4", "slots = 0"),
        );
        env.wait_metric(ERR_SERIES, 3.0).await;
        c.query_drop(INC).await.unwrap();
        assert_eq!(env.slot_sum("home"), 3);

        // Fixing the file loads it.
        env.write_rule(
            "broken.toml",
            &counter_rule("other").replace("hits", "visits"),
        );
        env.wait_rules(&["other", RULE]).await; // files in name order
        assert_eq!(env.metric(OK_SERIES), 1.0);
        c.query_drop(INC).await.unwrap();
        assert_eq!(env.slot_sum("home"), 4);
    });
}

#[test]
fn prepared_statements_keep_the_plan_they_were_prepared_with() {
    let env = start_env("prepared", &[("hits.toml", &counter_rule(RULE))]);
    run(LIMIT, async {
        let sql = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?";
        let mut old = env.proxied().await;
        let stmt = old.prep(sql).await.unwrap();
        old.exec_drop(&stmt, (1, "home")).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (10, 1));

        // The rule goes away.
        env.remove_rule("hits.toml");
        let mut admin = env.admin().await;
        admin.query_drop("RELOAD RULES").await.unwrap();
        let (_, rows) = admin_query(&mut admin, "SHOW RULES").await.unwrap();
        assert!(rows.is_empty());

        // Prepared under the old rules: still rewritten.
        old.exec_drop(&stmt, (1, "home")).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (10, 2));
        // Prepared now: passes through.
        let mut new = env.proxied().await;
        let fresh = new.prep(sql).await.unwrap();
        new.exec_drop(&fresh, (1, "home")).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (11, 2));
        // Text statements follow the new rules at once, on old connections too.
        old.query_drop(INC).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (12, 2));

        // The rule comes back: the statement prepared without it keeps passing
        // through (still exact for a counter: reads add the base row and the slots).
        env.write_rule("hits.toml", &counter_rule(RULE));
        admin.query_drop("RELOAD RULES").await.unwrap();
        new.exec_drop(&fresh, (1, "home")).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (13, 2));
        let total: i64 = new
            .query_first("SELECT cnt FROM hits WHERE slug = 'home'")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(total, 15);
        // Re-preparing picks up the rule.
        let mut again = env.proxied().await;
        let stmt = again.prep(sql).await.unwrap();
        again.exec_drop(&stmt, (1, "home")).await.unwrap();
        assert_eq!((env.base("home"), env.slot_sum("home")), (13, 3));
        // The rule's counters started afresh when it came back: the read and the
        // re-prepared execute.
        let (_, stats) = admin_query(&mut admin, "SHOW RULE STATS").await.unwrap();
        assert_eq!(stats.len(), 1);
        assert_eq!(cell(&stats[0][2]), "2", "{stats:?}");
    });
}

#[test]
fn admin_port_commands() {
    let env = start_env("admin", &[("hits.toml", &counter_rule(RULE))]);
    run(LIMIT, async {
        // Credentials.
        for (user, pw) in [("admin", "wrong"), ("admin", ""), ("root", ADMIN_PW)] {
            let r = Conn::from_url(admin_url(env.admin_addr(), user, pw, "")).await;
            assert!(r.is_err(), "{user}/{pw} was let in");
        }
        assert!(env.proxy.log_text().contains("admin login refused"));
        assert!(!env.proxy.log_text().contains(ADMIN_PW));
        let mut admin = env.admin().await;

        // SHOW RULES.
        let (cols, rows) = admin_query(&mut admin, "show rules;").await.unwrap();
        assert_eq!(cols, ["name", "kind", "table", "mode", "file"]);
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows[0][..4].iter().map(cell).collect::<Vec<_>>(),
            [RULE, "counter", "hits", "on"]
        );
        assert!(cell(&rows[0][4]).ends_with("hits.toml"));

        // Traffic: one rewrite, one rejection, one passthrough.
        let mut c = env.proxied().await;
        c.query_drop(INC).await.unwrap();
        let e = c
            .query_drop("UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'")
            .await
            .unwrap_err();
        assert!(e.to_string().contains(RULE), "{e}");
        c.query_drop("SELECT 1").await.unwrap();

        // SHOW RULE STATS.
        let (cols, rows) = admin_query(&mut admin, "SHOW RULE STATS").await.unwrap();
        assert_eq!(
            cols,
            [
                "rule",
                "matched",
                "rewritten",
                "rejected",
                "errors",
                "shadow_rewrites",
                "shadow_rejects",
                "fallbacks",
                "mean_latency_us",
                "max_latency_us"
            ]
        );
        assert_eq!(rows.len(), 1);
        let r: Vec<String> = rows[0].iter().map(cell).collect();
        assert_eq!(r[..8], [RULE, "2", "1", "1", "0", "0", "0", "0"]);
        let (mean, max): (u64, u64) = (r[8].parse().unwrap(), r[9].parse().unwrap());
        assert!(mean > 0 && max >= mean, "{r:?}");

        // SHOW SESSIONS lists the client (not the admin connection).
        let backend_id: u32 = c
            .query_first("SELECT CONNECTION_ID()")
            .await
            .unwrap()
            .unwrap();
        // A session turns idle just after it has sent its answer: wait for that.
        let mut listing = admin_query(&mut admin, "SHOW SESSIONS").await.unwrap();
        for _ in 0..200 {
            let idle = listing
                .1
                .iter()
                .any(|r| cell(&r[4]) == backend_id.to_string() && cell(&r[5]) == "idle");
            if idle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            listing = admin_query(&mut admin, "SHOW SESSIONS").await.unwrap();
        }
        let (cols, rows) = listing;
        assert_eq!(
            cols,
            [
                "id",
                "client",
                "user",
                "db",
                "backend_id",
                "state",
                "statements"
            ]
        );
        let me = rows
            .iter()
            .find(|r| cell(&r[4]) == backend_id.to_string())
            .unwrap_or_else(|| panic!("session {backend_id} not in {rows:?}"));
        assert_eq!(cell(&me[2]), common::USER);
        assert_eq!(cell(&me[3]), env.db);
        assert_eq!(cell(&me[5]), "idle");
        assert!(cell(&me[1]).starts_with("127.0.0.1:"));
        assert!(cell(&me[6]).parse::<u64>().unwrap() >= 4, "{me:?}");
        c.query_drop("USE mysql").await.unwrap();
        let mut db = String::new();
        for _ in 0..200 {
            let (_, rows) = admin_query(&mut admin, "SHOW SESSIONS").await.unwrap();
            let me = rows
                .iter()
                .find(|r| cell(&r[4]) == backend_id.to_string())
                .unwrap();
            db = cell(&me[3]);
            if db == "mysql" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(db, "mysql");
        drop(c);

        // EXPLAIN REWRITE resolves unqualified names against the admin connection's
        // database: rewrite, rejection, passthrough.
        admin.query_drop(format!("USE {}", env.db)).await.unwrap();
        let (cols, rows) = admin_query(
            &mut admin,
            "EXPLAIN REWRITE 'UPDATE hits SET cnt = cnt + 5 WHERE slug = ''home'''",
        )
        .await
        .unwrap();
        assert_eq!(cols, ["outcome", "rule", "detail"]);
        assert!(!rows.is_empty());
        assert_eq!(cell(&rows[0][0]), "rewrite", "{rows:?}");
        assert_eq!(cell(&rows[0][1]), RULE);
        let text: String = rows
            .iter()
            .map(|r| cell(&r[2]))
            .collect::<Vec<_>>()
            .join(";");
        assert!(
            text.contains("hits_slots") && text.contains("'home'"),
            "{text}"
        );
        let (_, rows) = admin_query(
            &mut admin,
            "explain rewrite \"UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'\"",
        )
        .await
        .unwrap();
        assert_eq!(cell(&rows[0][0]), "reject");
        assert!(cell(&rows[0][2]).contains(RULE));
        let (_, rows) = admin_query(&mut admin, "EXPLAIN REWRITE 'SELECT 1'")
            .await
            .unwrap();
        assert_eq!(cell(&rows[0][0]), "passthrough");
        // A read of the counter needs the table's columns first: the proxy has them
        // now (the client's statements above fetched them), or says what to do.
        let (_, rows) = admin_query(
            &mut admin,
            "EXPLAIN REWRITE 'SELECT cnt FROM hits WHERE slug = ''home'''",
        )
        .await
        .unwrap();
        let outcome = cell(&rows[0][0]);
        assert!(
            outcome == "rewrite"
                || (outcome == "needs_metadata"
                    && cell(&rows[0][2]).contains("run the statement once")),
            "{rows:?}"
        );

        // Anything else is a clear error.
        for bad in [
            "SELECT 1",
            "DROP TABLE hits",
            "EXPLAIN REWRITE 'x",
            "SHOW RULEZ",
        ] {
            let e = admin.query_drop(bad).await.unwrap_err().to_string();
            assert!(
                e.contains("SHOW RULES") || e.contains("EXPLAIN REWRITE"),
                "{bad}: {e}"
            );
        }
        assert!(admin.prep("SHOW RULES").await.is_err());
        // The connection is still usable after errors.
        let (_, rows) = admin_query(&mut admin, "SHOW RULES").await.unwrap();
        assert_eq!(rows.len(), 1);

        // The same counters on /metrics.
        let m = scrape(env.metrics_addr());
        let series = |outcome: &str| {
            format!("heatsink_rule_statements_total{{rule=\"{RULE}\",outcome=\"{outcome}\"}}")
        };
        assert_eq!(metric(&m, &series("rewritten")), 1.0, "{m}");
        assert_eq!(metric(&m, &series("rejected")), 1.0, "{m}");
        assert_eq!(metric(&m, &series("error")), 0.0, "{m}");
        assert_eq!(
            metric(&m, "heatsink_rewrite_duration_seconds_count"),
            1.0,
            "{m}"
        );
        assert!(
            metric(&m, "heatsink_backend_duration_seconds_count") >= 1.0,
            "{m}"
        );
        assert!(metric(&m, "heatsink_backend_errors_total") >= 0.0);
        assert_eq!(metric(&m, "heatsink_rules_loaded"), 1.0);
        assert!(
            m.contains("heatsink_rewrite_duration_seconds_bucket{le=\"+Inf\"} 1"),
            "{m}"
        );
    });
}

#[test]
fn backend_errors_count_for_the_rule_and_the_backend() {
    let env = start_env("errors", &[("hits.toml", &counter_rule(RULE))]);
    run(LIMIT, async {
        let mut c = env.proxied().await;
        c.query_drop(INC).await.unwrap();
        // The slot table disappears: the rewrite fails at the backend.
        mariadb().exec(&format!("DROP TABLE {}.hits_slots", env.db));
        let e = c.query_drop(INC).await.unwrap_err();
        assert!(e.to_string().contains("hits_slots"), "{e}");
        c.query_drop("SELECT * FROM no_such_table")
            .await
            .unwrap_err();
        let mut admin = env.admin().await;
        let (_, rows) = admin_query(&mut admin, "SHOW RULE STATS").await.unwrap();
        let r: Vec<String> = rows[0].iter().map(cell).collect();
        assert_eq!(r[..5], [RULE, "2", "2", "0", "1"], "{r:?}");
        assert!(env.metric("heatsink_backend_errors_total") >= 2.0);
    });
}

#[test]
fn admin_password_is_required_off_loopback() {
    let rules = tempfile::tempdir().unwrap();
    let (code, _, err) = Cli::new(["serve", "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--backend")
        .arg(mariadb().addr().to_string())
        .arg("--rules")
        .arg(rules.path())
        .arg("--admin")
        .arg(format!("0.0.0.0:{}", free_port()))
        .env_remove("HEATSINK_ADMIN_PASSWORD")
        .run();
    assert_ne!(code, 0);
    assert!(err.contains("admin_password"), "{err}");
    assert!(!err.contains("listening on"), "{err}");
}

#[test]
fn empty_admin_password_is_allowed_on_loopback_with_a_warning() {
    let (proxy, admin) = Proxy::builder()
        .arg("--admin-user")
        .arg("ops")
        .start_with_admin();
    run(LIMIT, async {
        let mut conn = connect(&admin_url(admin, "ops", "", "")).await;
        let (_, rows) = admin_query(&mut conn, "SHOW RULES").await.unwrap();
        assert!(rows.is_empty());
        assert!(Conn::from_url(admin_url(admin, "admin", "", ""))
            .await
            .is_err());
    });
    assert!(
        proxy.log_text().contains("no password"),
        "{}",
        proxy.log_text()
    );
}
