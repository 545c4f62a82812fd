//! Group commit of counter increments (`coalesce = true`) end to end: many clients
//! increment a few hot counters through the proxy against the real MariaDB, and every
//! counter must end up equal to the increments its clients were told succeeded —
//! with merging on, with negative deltas and several counter columns, next to
//! explicit transactions, when the proxy is killed mid-load, when merged writes fail,
//! for prepared increments, and for sessions that may not write at all.
//!
//! Every test has its own database (`coal_<name>`) and its own proxy (with
//! `--metrics`, to see that merging actually happened). `COAL_PROXY_LOG=debug` sets
//! the proxies' log level. Tests marked `#[ignore = "bug: …"]` pin known defects; run
//! them with `cargo test --test coalesce -- --ignored`.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cli::migrate_ok;
use common::client::{connect, rules_dir, run, run_text, tail};
use common::fixture::{
    counter_value, fresh_db, inc_sql, value_of, Env, EnvBuilder, Rule, MATCHED_1,
};
use common::{mariadb, metrics, Proxy};
use mysql_async::prelude::*;
use mysql_async::Conn;

// ---------------------------------------------------------------------------------------
// Fixture

/// Rule name used in every rule file here.
const RULE: &str = "page_hits";

/// Time limit of one statement sent by a load client.
const STATEMENT_LIMIT: Duration = Duration::from_secs(15);

/// The `hits` rule of most tests: key `slug`, counter `cnt`, 16 slots, group commit on.
fn hits_rule() -> String {
    Rule::counter(RULE, "hits").coalesce(true).toml()
}

/// The logical table `hits` (slot table and trigger are made separately).
const HITS_DDL: &str =
    "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0, note VARCHAR(20));";

/// Database `coal_<name>` with `hits`, its slot table and trigger made by `heatsink
/// migrate`, and a proxy with [`hits_rule`] and a metrics endpoint.
fn hits_env(name: &str) -> Env {
    env_builder(format!("coal_{name}"), &hits_rule())
        .schema(HITS_DDL)
        .migrate()
        .start()
}

/// As [`hits_env`], but the slot table's counter column is a TINYINT (written here,
/// not by migrate, which makes it BIGINT), so that the slot rows overflow.
fn tiny_slots_env(name: &str) -> Env {
    env_builder(format!("coal_{name}"), &hits_rule())
        .schema(format!(
            "{HITS_DDL}
             CREATE TABLE hits_slots (slug VARCHAR(64) NOT NULL, slot SMALLINT UNSIGNED NOT NULL,
                 cnt TINYINT NOT NULL DEFAULT 0, PRIMARY KEY (slug, slot));
             CREATE TRIGGER hits_slots_hs_ai AFTER INSERT ON hits_slots FOR EACH ROW
                 INSERT IGNORE INTO hits (slug) VALUES (NEW.slug);"
        ))
        .start()
}

/// An environment for database `db` whose proxy has the rule `toml` and a metrics
/// endpoint (`COAL_PROXY_LOG` sets the log level).
fn env_builder(db: String, toml: &str) -> EnvBuilder {
    Env::builder(db)
        .rule("counter.toml", toml)
        .metrics()
        .log_level_from("COAL_PROXY_LOG")
}

/// `heatsink_coalesced_writes_total` and `heatsink_coalesced_increments_total`.
fn coalesced(m: &HashMap<String, u64>) -> (u64, u64) {
    let get = |k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("{k} missing from /metrics: {m:?}"))
    };
    (
        get("heatsink_coalesced_writes_total"),
        get("heatsink_coalesced_increments_total"),
    )
}

// ---------------------------------------------------------------------------------------
// Load

/// What the load clients observed.
struct Tally {
    /// Acknowledged (OK received) sum per counter cell (key × column), in the order
    /// the test defines.
    acked: Vec<AtomicI64>,
    /// Statements answered with OK.
    oks: AtomicU64,
    /// OKs that carried warnings.
    warned: AtomicU64,
    /// Slowest statement, in milliseconds.
    max_ms: AtomicU64,
    /// Statements answered with an error (or a broken connection).
    failures: AtomicU64,
    /// Error codes of server errors seen (0: not a server error).
    codes: Mutex<HashMap<u16, u64>>,
    /// The first few failures, described.
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn new(cells: usize) -> Arc<Tally> {
        Arc::new(Tally {
            acked: (0..cells).map(|_| AtomicI64::new(0)).collect(),
            oks: AtomicU64::new(0),
            warned: AtomicU64::new(0),
            max_ms: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            codes: Mutex::new(HashMap::new()),
            errors: Mutex::new(Vec::new()),
        })
    }

    fn acked(&self, cell: usize) -> i64 {
        self.acked[cell].load(Ordering::SeqCst)
    }

    fn oks(&self) -> u64 {
        self.oks.load(Ordering::SeqCst)
    }

    fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    fn failure(&self, what: String, code: u16) {
        self.failures.fetch_add(1, Ordering::SeqCst);
        *self.codes.lock().unwrap().entry(code).or_default() += 1;
        let mut e = self.errors.lock().unwrap();
        if e.len() < 20 {
            e.push(what);
        }
    }

    fn codes(&self) -> HashMap<u16, u64> {
        self.codes.lock().unwrap().clone()
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Records an OK of `deltas` (cell, delta), checking the OK looks like the
    /// original UPDATE's.
    fn ok(&self, conn: &Conn, sql: &str, deltas: &[(usize, i64)]) {
        for (cell, d) in deltas {
            self.acked[*cell].fetch_add(*d, Ordering::SeqCst);
        }
        self.oks.fetch_add(1, Ordering::SeqCst);
        if conn.get_warnings() > 0 {
            self.warned.fetch_add(1, Ordering::SeqCst);
        }
        if conn.affected_rows() != 1 {
            self.failure(
                format!("{sql}: OK reported {} rows", conn.affected_rows()),
                0,
            );
        }
    }
}

/// Fails (with the proxy log) when a load client saw an error.
fn assert_no_client_errors(env: &Env, tally: &Tally) {
    let errors = tally.errors();
    if !errors.is_empty() {
        env.fail(&format!(
            "{} client errors ({} OKs):\n{}",
            tally.failures(),
            tally.oks(),
            errors.join("\n")
        ));
    }
}

/// `slug` must read `want` through the proxy on `p` (else: fail with the proxy log and
/// `detail`) and hold it physically (base + SUM(slots)).
async fn assert_counter(env: &Env, p: &mut Conn, slug: &str, want: Option<i64>, detail: &str) {
    let got = value_of(p, slug).await;
    if got != want {
        env.fail(&format!(
            "{slug}: read {got:?} through the proxy, acknowledged {want:?}{detail}"
        ));
    }
    assert_eq!(
        counter_value(&env.db, slug),
        want,
        "{slug}: base + SUM(slots)"
    );
}

/// Error code of a server error, 0 for anything else.
fn code_of(e: &mysql_async::Error) -> u16 {
    match e {
        mysql_async::Error::Server(s) => s.code,
        _ => 0,
    }
}

/// Sends one text statement with a time limit.
async fn query(conn: &mut Conn, sql: &str) -> Result<(), mysql_async::Error> {
    match tokio::time::timeout(STATEMENT_LIMIT, conn.query_drop(sql)).await {
        Ok(r) => r,
        Err(_) => panic!("statement took over {STATEMENT_LIMIT:?}: {sql}"),
    }
}

/// One increment chosen by a load client: the statement and the (cell, delta) it adds.
struct Increment {
    sql: String,
    deltas: Vec<(usize, i64)>,
}

/// Runs `clients` text-protocol clients until `deadline`, each sending the increments
/// `pick` chooses. Every OK is tallied; every error too (the client goes on).
async fn text_load(
    url: String,
    clients: usize,
    deadline: Instant,
    tally: Arc<Tally>,
    pick: fn() -> Increment,
) {
    let tasks: Vec<_> = (0..clients)
        .map(|w| {
            let url = url.clone();
            let tally = tally.clone();
            tokio::spawn(async move {
                let mut conn = match Conn::from_url(url.as_str()).await {
                    Ok(c) => c,
                    Err(e) => {
                        tally.failure(format!("client {w}: connect: {e}"), code_of(&e));
                        return;
                    }
                };
                while Instant::now() < deadline {
                    let inc = pick();
                    let started = Instant::now();
                    let r = query(&mut conn, &inc.sql).await;
                    tally
                        .max_ms
                        .fetch_max(started.elapsed().as_millis() as u64, Ordering::SeqCst);
                    match r {
                        Ok(()) => {
                            tally.ok(&conn, &inc.sql, &inc.deltas);
                            if conn.info() != MATCHED_1 && conn.get_warnings() == 0 {
                                tally.failure(format!("{}: OK info {:?}", inc.sql, conn.info()), 0);
                            }
                        }
                        Err(e) => {
                            tally.failure(format!("client {w}: {}: {e}", inc.sql), code_of(&e))
                        }
                    }
                }
                let _ = conn.disconnect().await;
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("load client panicked");
    }
}

// ---------------------------------------------------------------------------------------
// 1. Exact totals

const HOT: usize = 3;
const COLD: usize = 50;

fn key_name(i: usize) -> String {
    if i < HOT {
        format!("hot{i}")
    } else {
        format!("cold{}", i - HOT)
    }
}

/// 85 % on three hot keys, the rest on fifty cold ones; delta 1..=3.
fn hot_and_cold() -> Increment {
    let k = if rand::random_range(0..100) < 85 {
        rand::random_range(0..HOT)
    } else {
        HOT + rand::random_range(0..COLD)
    };
    let d = rand::random_range(1..=3i64);
    Increment {
        sql: inc_sql(&key_name(k), d),
        deltas: vec![(k, d)],
    }
}

#[test]
fn merged_increments_sum_exactly() {
    let env = hits_env("totals");
    // Hot keys and half the cold keys exist with a base value; the other cold keys
    // are created by their first increment (through the slot table's trigger).
    let mut rows: Vec<String> = (0..HOT)
        .map(|k| format!("('hot{k}', 1000, NULL)"))
        .collect();
    rows.extend((0..COLD / 2).map(|k| format!("('cold{k}', 7, NULL)")));
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES {}",
        env.db,
        rows.join(",")
    ));
    // Keys with a logical row before the load: the hot ones and the first cold half.
    let existing = |k: usize| k < HOT + COLD / 2;
    let base = |k: usize| -> i64 {
        match k {
            _ if k < HOT => 1000,
            _ if existing(k) => 7,
            _ => 0,
        }
    };
    run(Duration::from_secs(40), async {
        let tally = Tally::new(HOT + COLD);
        let deadline = Instant::now() + Duration::from_secs(5);
        text_load(env.url(), 64, deadline, tally.clone(), hot_and_cold).await;
        assert_no_client_errors(&env, &tally);
        assert!(tally.oks() > 1000, "only {} increments in 5 s", tally.oks());
        let mut p = connect(&env.url()).await;
        for k in 0..HOT + COLD {
            let slug = key_name(k);
            let acked = tally.acked(k);
            let want = (existing(k) || acked != 0).then(|| base(k) + acked);
            assert_counter(&env, &mut p, &slug, want, "").await;
        }
        p.disconnect().await.unwrap();
        let (writes, increments) = coalesced(&env.metrics());
        eprintln!(
            "coalesce totals: {} increments in 5 s, 64 clients; {writes} merged writes holding {increments} increments",
            tally.oks()
        );
        assert!(writes > 0, "no merged write happened");
        assert!(
            increments > writes,
            "merged writes ({writes}) hold no more increments ({increments}) than writes"
        );
    });
}

// ---------------------------------------------------------------------------------------
// 2. Negative deltas, two counter columns

/// Counter cells of `stats`: id 1 and 2, columns a and b.
fn stats_cell(id: usize, col: &str) -> usize {
    (id - 1) * 2 + usize::from(col == "b")
}

/// Increments of `stats` of several shapes; deltas of both signs.
fn stats_increment() -> Increment {
    let id = rand::random_range(1..=2usize);
    let d = rand::random_range(1..=3i64);
    let (set, deltas) = match rand::random_range(0..6) {
        0 => ("a = a - 2".to_string(), vec![("a", -2)]),
        1 => (format!("b = b + {d}"), vec![("b", d)]),
        2 => (
            format!("a = a + {d}, b = b - {d}"),
            vec![("a", d), ("b", -d)],
        ),
        3 => (
            "b = b - 1, a = a + 3".to_string(),
            vec![("b", -1), ("a", 3)],
        ),
        4 => (format!("a = a + -{d}"), vec![("a", -d)]),
        _ => (format!("b = {d} + b"), vec![("b", d)]),
    };
    Increment {
        sql: format!("UPDATE stats SET {set} WHERE id = {id}"),
        deltas: deltas
            .into_iter()
            .map(|(c, d)| (stats_cell(id, c), d))
            .collect(),
    }
}

#[test]
fn negative_deltas_and_two_columns_sum_exactly() {
    let rule = Rule::counter(RULE, "stats")
        .key(&["id"])
        .columns(&["a", "b"])
        .slot_table("stats_slots")
        .coalesce(true);
    let env = env_builder("coal_two".to_string(), &rule.toml())
        .schema(
            "CREATE TABLE stats (id INT PRIMARY KEY, a BIGINT NOT NULL DEFAULT 0,
                 b BIGINT NOT NULL DEFAULT 0, label VARCHAR(10));
             INSERT INTO stats VALUES (1, 100000, 200000, 'x'), (2, 0, 0, 'y');",
        )
        .migrate()
        .start();
    run(Duration::from_secs(40), async {
        let tally = Tally::new(4);
        let deadline = Instant::now() + Duration::from_secs(3);
        text_load(env.url(), 48, deadline, tally.clone(), stats_increment).await;
        assert_no_client_errors(&env, &tally);
        let mut p = connect(&env.url()).await;
        for (id, base) in [(1usize, (100000i64, 200000i64)), (2, (0, 0))] {
            let want = (
                base.0 + tally.acked(stats_cell(id, "a")),
                base.1 + tally.acked(stats_cell(id, "b")),
            );
            let got: Option<(i64, i64)> = p
                .query_first(format!("SELECT a, b FROM stats WHERE id = {id}"))
                .await
                .unwrap();
            if got != Some(want) {
                env.fail(&format!("id {id}: read {got:?}, acknowledged {want:?}"));
            }
            let physical = env.backend_rows(&format!(
                "SELECT s.a + COALESCE((SELECT SUM(a) FROM {{db}}.stats_slots WHERE id = s.id), 0),
                        s.b + COALESCE((SELECT SUM(b) FROM {{db}}.stats_slots WHERE id = s.id), 0)
                 FROM {{db}}.stats s WHERE s.id = {id}"
            ));
            assert_eq!(
                physical,
                vec![vec![Some(want.0.to_string()), Some(want.1.to_string())]],
                "id {id}: base + SUM(slots)"
            );
        }
        p.disconnect().await.unwrap();
        let (writes, increments) = coalesced(&env.metrics());
        eprintln!(
            "coalesce two columns: {} increments; {writes} merged writes holding {increments}",
            tally.oks()
        );
        assert!(writes > 0 && increments > writes, "no merging happened");
    });
}

// ---------------------------------------------------------------------------------------
// 3. Explicit transactions are never merged

/// Only `hot0`, delta 1..=3.
fn hot0() -> Increment {
    let d = rand::random_range(1..=3i64);
    Increment {
        sql: inc_sql("hot0", d),
        deltas: vec![(0, d)],
    }
}

#[test]
fn transactional_increments_are_never_merged() {
    let env = hits_env("txn");
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES ('hot0', 0, NULL)",
        env.db
    ));
    run(Duration::from_secs(40), async {
        let tally = Tally::new(1);
        let deadline = Instant::now() + Duration::from_secs(4);
        let load = tokio::spawn(text_load(env.url(), 32, deadline, tally.clone(), hot0));
        let mut t = connect(&env.url()).await;
        // Let the load build up batches first, so a transactional increment that were
        // (wrongly) merged would land in a pending batch written by another session.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut committed = 0i64;
        for (label, begin, end) in [
            ("BEGIN … ROLLBACK", "BEGIN", "ROLLBACK"),
            (
                "START TRANSACTION … ROLLBACK",
                "START TRANSACTION",
                "ROLLBACK",
            ),
            ("autocommit=0 … ROLLBACK", "SET autocommit = 0", "ROLLBACK"),
            ("BEGIN … COMMIT", "BEGIN", "COMMIT"),
        ] {
            query(&mut t, begin).await.unwrap();
            for _ in 0..5 {
                query(&mut t, &inc_sql("hot0", 1000))
                    .await
                    .unwrap_or_else(|e| {
                        env.fail(&format!("{label}: increment in a transaction: {e}"))
                    });
                assert_eq!(t.affected_rows(), 1, "{label}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Concurrent merged writes keep running meanwhile.
            tokio::time::sleep(Duration::from_millis(250)).await;
            query(&mut t, end).await.unwrap();
            if end == "COMMIT" {
                committed += 5000;
            }
            query(&mut t, "SET autocommit = 1").await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        load.await.unwrap();
        assert_no_client_errors(&env, &tally);
        let want = tally.acked(0) + committed;
        let detail = " (autocommit increments + committed transaction; a difference that is a \
             multiple of 1000 is a rolled-back increment that was written)";
        assert_counter(&env, &mut t, "hot0", Some(want), detail).await;
        t.disconnect().await.unwrap();
        let (writes, increments) = coalesced(&env.metrics());
        eprintln!(
            "coalesce transactions: {} autocommit increments (slowest {} ms); {writes} merged writes holding {increments}",
            tally.oks(),
            tally.max_ms.load(Ordering::SeqCst)
        );
        assert!(writes > 0, "the concurrent load was never merged");
    });
}

// ---------------------------------------------------------------------------------------
// 4. kill -9 of the proxy never loses an acknowledged increment

/// What one kill round's clients observed.
#[derive(Default)]
struct KillTally {
    /// Sum of acknowledged deltas.
    acked: AtomicI64,
    /// Sum of deltas sent but not acknowledged (each client stops at its first error).
    in_flight: AtomicI64,
    /// Clients that saw their connection fail.
    failed: AtomicU64,
    /// Acknowledged statements.
    oks: AtomicU64,
}

#[test]
fn kill9_never_loses_an_acknowledged_increment() {
    let db = "coal_kill".to_string();
    fresh_db(&db, HITS_DDL);
    mariadb().exec(&format!("INSERT INTO {db}.hits VALUES ('hot0', 0, NULL)"));
    let rules = rules_dir("counter.toml", &hits_rule());
    migrate_ok(rules.path(), &db, true);
    run(Duration::from_secs(60), async {
        for kill_after in [
            Duration::from_millis(500),
            Duration::from_millis(1000),
            Duration::from_millis(2000),
        ] {
            let before = counter_value(&db, "hot0").unwrap();
            let (mut proxy, metrics_addr) = Proxy::builder()
                .rules_dir(rules.path())
                .log_level_from("COAL_PROXY_LOG")
                .start_with_metrics();
            let url = proxy.url(&db);
            let tally = Arc::new(KillTally::default());
            let ready = Arc::new(tokio::sync::Barrier::new(65));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let url = url.clone();
                    let tally = tally.clone();
                    let ready = ready.clone();
                    tokio::spawn(async move {
                        let conn = Conn::from_url(url.as_str()).await;
                        ready.wait().await;
                        let mut conn = conn.expect("connect before the kill");
                        loop {
                            let d = rand::random_range(1..=3i64);
                            let sql = inc_sql("hot0", d);
                            match tokio::time::timeout(STATEMENT_LIMIT, conn.query_drop(&sql)).await
                            {
                                Ok(Ok(())) => {
                                    tally.acked.fetch_add(d, Ordering::SeqCst);
                                    tally.oks.fetch_add(1, Ordering::SeqCst);
                                }
                                Ok(Err(_)) => {
                                    tally.in_flight.fetch_add(d, Ordering::SeqCst);
                                    tally.failed.fetch_add(1, Ordering::SeqCst);
                                    return;
                                }
                                Err(_) => panic!("increment hung after the kill: {sql}"),
                            }
                        }
                    })
                })
                .collect();
            ready.wait().await;
            tokio::time::sleep(kill_after).await;
            let merged = coalesced(&metrics(metrics_addr));
            proxy.kill9();
            for t in tasks {
                t.await.expect("kill client panicked");
            }
            let acked = tally.acked.load(Ordering::SeqCst);
            let in_flight = tally.in_flight.load(Ordering::SeqCst);
            // Statements the backend was still running when the proxy died commit on
            // their own: wait until the database is quiet before reading.
            let stored = settle(&db, "hot0") - before;
            eprintln!(
                "coalesce kill -9 after {kill_after:?}: {} acknowledged (+{acked}), in flight +{in_flight}, stored +{stored}; merged before the kill: {merged:?}",
                tally.oks.load(Ordering::SeqCst)
            );
            assert_eq!(
                tally.failed.load(Ordering::SeqCst),
                64,
                "every client must see the kill"
            );
            assert!(acked > 0, "nothing acknowledged in {kill_after:?}");
            assert!(
                stored >= acked,
                "kill after {kill_after:?}: stored +{stored} < acknowledged +{acked}: an acknowledged increment was lost\n{}",
                tail(&proxy.log_text(), 20)
            );
            assert!(
                stored <= acked + in_flight,
                "kill after {kill_after:?}: stored +{stored} > acknowledged +{acked} + in flight +{in_flight}"
            );
            assert!(in_flight <= 64 * 3);
        }
    });
}

/// Reads base + SUM(slots) until two reads 200 ms apart agree (at most 5 s).
fn settle(db: &str, slug: &str) -> i64 {
    let mut last = counter_value(db, slug).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = counter_value(db, slug).unwrap();
        if now == last || Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

// ---------------------------------------------------------------------------------------
// 5. A failing merged write: each member runs alone, then as sent

#[test]
fn failing_merged_increments_run_alone_then_as_sent() {
    // TINYINT slot rows: 16 × 127 fits, so after ≈ 2000 the upserts fail with 1264
    // (out of range), merged ones included; each member of a failed merged write
    // then runs its own increment, which fits while its slot has room, and when it
    // does not, runs its UPDATE as sent on the BIGINT base row: the table's own
    // answer, which no client sees fail.
    let env = tiny_slots_env("overflow");
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES ('hot0', 50, NULL)",
        env.db
    ));
    run(Duration::from_secs(40), async {
        let tally = Tally::new(1);
        let deadline = Instant::now() + Duration::from_secs(3);
        text_load(env.url(), 64, deadline, tally.clone(), hot0).await;
        if tally.failures() > 0 {
            env.fail(&format!(
                "increments failed: {:?}\n{}",
                tally.codes(),
                tally.errors().join("\n")
            ));
        }
        let full = env.backend_scalar("SELECT COUNT(*) FROM {db}.hits_slots WHERE cnt >= 120");
        assert!(
            full.as_deref().is_some_and(|n| n != "0"),
            "the slot rows never filled ({} OKs)",
            tally.oks()
        );
        let base = env.backend_scalar("SELECT cnt FROM {db}.hits WHERE slug = 'hot0'");
        assert!(
            base.as_deref()
                .and_then(|b| b.parse::<i64>().ok())
                .is_some_and(|b| b > 50),
            "no increment ran as sent on the base row: {base:?}"
        );
        let want = 50 + tally.acked(0);
        let mut p = connect(&env.url()).await;
        let counts = format!(" ({} OKs, {} errors)", tally.oks(), tally.failures());
        assert_counter(&env, &mut p, "hot0", Some(want), &counts).await;
        let (writes, increments) = coalesced(&env.metrics());
        eprintln!(
            "coalesce overflow: {} OKs, {} errors; {writes} merged writes holding {increments}",
            tally.oks(),
            tally.failures()
        );
        assert!(writes > 0, "no merged write happened");
        // Smaller deltas still fit somewhere: the counter keeps working.
        let slots = env.backend_rows("SELECT MIN(cnt) FROM {db}.hits_slots WHERE slug = 'hot0'");
        eprintln!("coalesce overflow: smallest slot value {slots:?}");
        p.disconnect().await.unwrap();
    });
}

#[test]
fn merged_writes_to_a_missing_slot_table_fail_every_member() {
    let env = hits_env("missing");
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES ('hot0', 0, NULL)",
        env.db
    ));
    run(Duration::from_secs(40), async {
        let tally = Tally::new(1);
        let deadline = Instant::now() + Duration::from_secs(3);
        let load = tokio::spawn(text_load(env.url(), 64, deadline, tally.clone(), hot0));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let db = env.db.clone();
        mariadb()
            .exec_async(&format!(
                "RENAME TABLE {db}.hits_slots TO {db}.hits_slots_away"
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        mariadb()
            .exec_async(&format!(
                "RENAME TABLE {db}.hits_slots_away TO {db}.hits_slots"
            ))
            .await
            .unwrap();
        load.await.unwrap();
        let codes = tally.codes();
        if codes.keys().any(|c| *c != 1146) {
            env.fail(&format!(
                "errors other than 1146: {codes:?}\n{}",
                tally.errors().join("\n")
            ));
        }
        assert!(tally.failures() > 0, "the missing table was never noticed");
        let want = tally.acked(0);
        let mut p = connect(&env.url()).await;
        let counts = format!(" ({} OKs, {} errors)", tally.oks(), tally.failures());
        assert_counter(&env, &mut p, "hot0", Some(want), &counts).await;
        p.disconnect().await.unwrap();
        let (writes, increments) = coalesced(&env.metrics());
        eprintln!(
            "coalesce missing table: {} OKs, {} errors; {writes} merged writes holding {increments}",
            tally.oks(),
            tally.failures()
        );
        assert!(writes > 0, "no merged write happened");
    });
}

// ---------------------------------------------------------------------------------------
// 6. Prepared increments

/// Prepared increments (with `?` deltas, and with literal deltas) until `deadline`.
async fn prepared_load(url: String, clients: usize, deadline: Instant, tally: Arc<Tally>) {
    let tasks: Vec<_> = (0..clients)
        .map(|w| {
            let url = url.clone();
            let tally = tally.clone();
            tokio::spawn(async move {
                let mut conn = connect(&url).await;
                while Instant::now() < deadline {
                    let k = rand::random_range(0..2usize);
                    let d = rand::random_range(1..=3i64);
                    let slug = format!("hot{k}");
                    let (sql, r) = if w % 3 == 0 {
                        let sql = inc_sql(&slug, d);
                        let r = conn.exec_drop(sql.as_str(), ()).await;
                        (sql, r)
                    } else {
                        let sql = "UPDATE hits SET cnt = cnt + ? WHERE slug = ?".to_string();
                        let r = conn.exec_drop(sql.as_str(), (d, slug.as_str())).await;
                        (sql, r)
                    };
                    match r {
                        Ok(()) => tally.ok(&conn, &sql, &[(k, d)]),
                        Err(e) => tally.failure(format!("client {w}: {sql}: {e}"), code_of(&e)),
                    }
                }
                let _ = conn.disconnect().await;
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("prepared client panicked");
    }
}

/// Text increments of `hot0` and `hot1`.
fn hot01() -> Increment {
    let k = rand::random_range(0..2usize);
    let d = rand::random_range(1..=3i64);
    Increment {
        sql: inc_sql(&format!("hot{k}"), d),
        deltas: vec![(k, d)],
    }
}

#[test]
fn prepared_increments_are_exact_and_not_merged() {
    let env = hits_env("prepared");
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES ('hot0', 10, NULL), ('hot1', 20, NULL)",
        env.db
    ));
    run(Duration::from_secs(40), async {
        let tally = Tally::new(2);
        // Prepared only: nothing may be merged.
        let deadline = Instant::now() + Duration::from_secs(2);
        tokio::time::timeout(
            Duration::from_secs(20),
            prepared_load(env.url(), 32, deadline, tally.clone()),
        )
        .await
        .expect("prepared load hung");
        assert_eq!(
            coalesced(&env.metrics()),
            (0, 0),
            "prepared increments were merged"
        );
        let prepared_oks = tally.oks();
        assert!(
            prepared_oks > 100,
            "only {prepared_oks} prepared increments"
        );
        // Prepared and text side by side: the text ones merge, all add up.
        let deadline = Instant::now() + Duration::from_secs(2);
        let text = tokio::spawn(text_load(env.url(), 32, deadline, tally.clone(), hot01));
        tokio::time::timeout(
            Duration::from_secs(20),
            prepared_load(env.url(), 32, deadline, tally.clone()),
        )
        .await
        .expect("prepared load hung");
        text.await.unwrap();
        assert_no_client_errors(&env, &tally);
        let mut p = connect(&env.url()).await;
        for (k, base) in [(0usize, 10i64), (1, 20)] {
            let slug = format!("hot{k}");
            let want = base + tally.acked(k);
            assert_counter(&env, &mut p, &slug, Some(want), "").await;
        }
        p.disconnect().await.unwrap();
        let (writes, increments) = coalesced(&env.metrics());
        eprintln!(
            "coalesce prepared: {prepared_oks} prepared-only increments, {} in all; {writes} merged writes holding {increments}",
            tally.oks()
        );
    });
}

// ---------------------------------------------------------------------------------------
// 7. A merged write runs with the leader's rights and session settings

/// A client that may not write the slot table (read-only user, or a read-only
/// session) sends increments while others load the same counter. Without the proxy
/// each of its increments fails and each of theirs succeeds; merging must not change
/// either: its increments must never be written or acknowledged, theirs must never
/// fail because of its rights.
async fn forbidden_writer_case(env: &Env, forbidden_url: String, setup: &'static str) {
    let tally = Tally::new(1);
    let deadline = Instant::now() + Duration::from_secs(3);
    let load = tokio::spawn(text_load(env.url(), 48, deadline, tally.clone(), hot0));
    let mut f = connect(&forbidden_url).await;
    if !setup.is_empty() {
        query(&mut f, setup).await.unwrap();
    }
    let (mut refused, mut accepted) = (0u64, 0i64);
    let mut codes = Vec::new();
    while Instant::now() < deadline {
        match query(&mut f, &inc_sql("hot0", 1_000_000)).await {
            Ok(()) => accepted += 1,
            Err(e) => {
                refused += 1;
                if codes.len() < 3 {
                    codes.push(e.to_string());
                }
            }
        }
    }
    load.await.unwrap();
    let _ = f.disconnect().await;
    let want = tally.acked(0);
    let got = counter_value(&env.db, "hot0").unwrap_or(0);
    let (writes, increments) = coalesced(&env.metrics());
    let summary = format!(
        "{setup:?}: the forbidden client got {accepted} OKs and {refused} errors ({codes:?}); \
         the permitted clients got {} OKs and {} errors ({:?}), first: {:?}; \
         stored {got}, permitted clients acknowledged {want}; {writes} merged writes holding {increments}",
        tally.oks(),
        tally.failures(),
        tally.codes(),
        tally.errors().first()
    );
    eprintln!("coalesce forbidden writer: {summary}");
    assert!(refused > 0, "{summary}");
    assert_eq!(accepted, 0, "forbidden increments acknowledged: {summary}");
    assert_eq!(
        tally.failures(),
        0,
        "permitted increments failed: {summary}"
    );
    assert_eq!(got, want, "stored != acknowledged: {summary}");
}

#[test]
fn read_only_user_increments_are_never_merged_into_a_write() {
    let env = hits_env("rouser");
    let db = env.db.clone();
    mariadb().exec(&format!(
        "INSERT INTO {db}.hits VALUES ('hot0', 0, NULL);
         DROP USER IF EXISTS 'coal_ro'@'%';
         CREATE USER 'coal_ro'@'%' IDENTIFIED BY 'ro-pw';
         GRANT SELECT ON {db}.* TO 'coal_ro'@'%';"
    ));
    let ro_url = format!(
        "mysql://coal_ro:ro-pw@{}/{db}?prefer_socket=false",
        env.proxy.addr()
    );
    run(
        Duration::from_secs(40),
        forbidden_writer_case(&env, ro_url, ""),
    );
}

#[test]
fn read_only_session_increments_are_never_merged_into_a_write() {
    let env = hits_env("rosession");
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES ('hot0', 0, NULL)",
        env.db
    ));
    let url = env.url();
    run(
        Duration::from_secs(40),
        forbidden_writer_case(&env, url, "SET SESSION TRANSACTION READ ONLY"),
    );
}

/// Strict sessions (the default sql_mode) and non-strict sessions increment a
/// counter whose TINYINT slot rows overflow. An out-of-range slot upsert fails in a
/// strict session (the increment then runs as sent on the BIGINT base row, as the
/// table would take it) and is clamped (OK with a warning) in a non-strict one. A
/// strict session must never get an OK for a write the non-strict sessions'
/// settings clamped.
#[test]
fn strict_sessions_never_get_a_clamped_merged_write() {
    let env = tiny_slots_env("sqlmode");
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES ('hot0', 0, NULL)",
        env.db
    ));
    run(Duration::from_secs(40), async {
        let strict = Tally::new(1);
        let loose = Tally::new(1);
        let deadline = Instant::now() + Duration::from_secs(3);
        let load = tokio::spawn(text_load(env.url(), 48, deadline, strict.clone(), hot0));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let url = env.url();
            let loose = loose.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = connect(&url).await;
                query(&mut c, "SET SESSION sql_mode = ''").await.unwrap();
                while Instant::now() < deadline {
                    let inc = hot0();
                    match query(&mut c, &inc.sql).await {
                        Ok(()) => loose.ok(&c, &inc.sql, &inc.deltas),
                        Err(e) => loose.failure(e.to_string(), code_of(&e)),
                    }
                }
                let _ = c.disconnect().await;
            }));
        }
        load.await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let stored = counter_value(&env.db, "hot0").unwrap_or(0);
        let summary = format!(
            "strict sessions: {} OKs ({} with warnings), errors {:?}; non-strict: {} OKs ({} with warnings), errors {:?}; \
             stored {stored}, acknowledged {} + {}",
            strict.oks(),
            strict.warned.load(Ordering::SeqCst),
            strict.codes(),
            loose.oks(),
            loose.warned.load(Ordering::SeqCst),
            loose.codes(),
            strict.acked(0),
            loose.acked(0)
        );
        eprintln!("coalesce sql_mode: {summary}");
        assert!(
            loose.warned.load(Ordering::SeqCst) > 0,
            "never overflowed: {summary}"
        );
        assert_eq!(
            strict.warned.load(Ordering::SeqCst),
            0,
            "a strict session got an OK with a warning (its increment was clamped): {summary}"
        );
        assert!(
            strict.codes().is_empty(),
            "{summary}\n{:?}",
            strict.errors()
        );
        assert!(
            stored <= strict.acked(0) + loose.acked(0),
            "stored more than acknowledged: {summary}"
        );
    });
}

// ---------------------------------------------------------------------------------------
// 8. The per-core runtime

/// Names of the proxy's threads (the `comm` of each, as /proc/PID/task/*/stat gives it).
fn thread_names(pid: u32) -> Vec<String> {
    thread_policies(pid)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// The scheduling policy (`policy`, field 41 of /proc/PID/task/TID/stat) of each thread
/// of `pid`, by thread name.
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("read the proxy's tasks")
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(") ")?;
            let name = head.split_once(" (")?.1.to_string();
            // Fields after the name start at field 3 (the state).
            let policy = rest.split_whitespace().nth(41 - 3)?.parse().ok()?;
            Some((name, policy))
        })
        .collect()
}

const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// With `--sched-policy batch` every thread of the proxy (runtime workers, blocking
/// pool, per-core and control threads) runs under SCHED_BATCH; by default (`inherit`)
/// each keeps the policy the proxy was started with (SCHED_OTHER here). Statements are
/// answered either way.
#[test]
fn proxy_threads_take_the_scheduling_policy() {
    for (args, want) in [
        (vec![], SCHED_OTHER),
        (vec!["--sched-policy", "batch"], SCHED_BATCH),
        (
            vec!["--sched-policy", "batch", "--runtime", "per-core"],
            SCHED_BATCH,
        ),
    ] {
        let mut builder = Proxy::builder().no_rules();
        for a in &args {
            builder = builder.arg(*a);
        }
        let proxy = builder.start();
        run(Duration::from_secs(30), async {
            let mut c = connect(&proxy.url("")).await;
            let one: Option<i64> = c.query_first("SELECT 1").await.unwrap();
            assert_eq!(one, Some(1), "{args:?}");
            c.disconnect().await.unwrap();
        });
        let policies = thread_policies(proxy.pid().expect("proxy running"));
        assert!(policies.len() >= 3, "{args:?}: {policies:?}");
        for (name, policy) in &policies {
            assert_eq!(*policy, want, "thread {name} under {args:?}: {policies:?}");
        }
    }
}

/// `--runtime per-core` with two session threads: 64 clients increment hot and cold
/// counters (merged) while the rule file is rewritten and reloaded; every counter ends
/// equal to the increments acknowledged, a few statements answer as MariaDB answers them
/// directly, and SIGTERM drains and exits 0.
#[test]
fn per_core_runtime_merges_reloads_and_stops() {
    let mut env = env_builder("coal_per_core".into(), &hits_rule())
        .schema(HITS_DDL)
        .migrate()
        .arg("--runtime")
        .arg("per-core")
        .arg("--runtime-threads")
        .arg("2")
        .start();
    let names = thread_names(env.proxy.pid().expect("proxy running"));
    // (`comm` holds the first 15 bytes of a thread's name.)
    for want in ["heatsink-0", "heatsink-1", "heatsink-contro"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    let rows: Vec<String> = (0..HOT)
        .map(|k| format!("('hot{k}', 1000, NULL)"))
        .collect();
    mariadb().exec(&format!(
        "INSERT INTO {}.hits VALUES {}",
        env.db,
        rows.join(",")
    ));
    run(Duration::from_secs(90), async {
        let tally = Tally::new(HOT + COLD);
        let deadline = Instant::now() + Duration::from_secs(6);
        let load = tokio::spawn(text_load(
            env.url(),
            64,
            deadline,
            tally.clone(),
            hot_and_cold,
        ));
        // A reload while the load runs (the rule's text changes, its meaning does not).
        tokio::time::sleep(Duration::from_secs(2)).await;
        env.write_rule("counter.toml", &format!("{}# reloaded\n", hits_rule()));
        let reloaded = Instant::now() + Duration::from_secs(20);
        while !env.proxy.log_text().contains("rules reloaded") {
            assert!(Instant::now() < reloaded, "no reload; log:\n{}", env.tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        load.await.expect("load");
        assert_no_client_errors(&env, &tally);
        assert!(tally.oks() > 200, "only {} increments", tally.oks());
        let mut p = connect(&env.url()).await;
        for k in 0..HOT + COLD {
            let acked = tally.acked(k);
            let want = (k < HOT)
                .then_some(1000 + acked)
                .or((acked != 0).then_some(acked));
            assert_counter(&env, &mut p, &key_name(k), want, "per-core").await;
        }
        let (writes, increments) = coalesced(&env.metrics());
        assert!(
            writes > 0 && increments > writes,
            "{writes} merged writes of {increments}"
        );
        // Passthrough reads, an error and session state answer as MariaDB directly.
        let mut d = env.direct().await;
        for sql in [
            "SELECT slug, note FROM hits WHERE slug IN ('hot0', 'cold1') ORDER BY slug",
            "SELECT nope FROM hits",
            "SET @x = 5",
            "SELECT @x + 1, @@autocommit, DATABASE()",
        ] {
            let got = run_text(&mut p, sql).await.map_err(|e| e.to_string());
            let want = run_text(&mut d, sql).await.map_err(|e| e.to_string());
            assert_eq!(got, want, "{sql}");
        }
        p.disconnect().await.unwrap();
        d.disconnect().await.unwrap();
    });
    let status = env.proxy.stop_graceful();
    assert!(status.success(), "{status}; log:\n{}", env.tail());
    assert!(env.proxy.log_text().contains("stopped"), "{}", env.tail());
}
