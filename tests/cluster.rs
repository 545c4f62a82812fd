//! heatsink in front of a 3-node Galera cluster (tests/common/galera.rs starts it on
//! loopback ports): hot counters written through every node stay exact, and no client
//! sees a certification conflict from a statement heatsink runs on its own, while the
//! same load sent to the nodes directly does.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cli::Cli;
use common::client::{connect, rules_dir, run};
use common::fixture::Rule;
use common::galera::{galera, GaleraNode};
use common::Proxy;
use mysql_async::prelude::Queryable;

/// Serialises the tests: they share one cluster, and one of them kills a node.
static CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cluster_lock() -> std::sync::MutexGuard<'static, ()> {
    CLUSTER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Connections per node in the load tests (66 in all).
const PER_NODE: usize = 22;

/// Creates database `db` afresh on the cluster (DDL replicates to every node) with
/// `hits (slug, cnt)` holding `('home', 0)`.
fn counter_db(db: &str) {
    galera().any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db} CHARACTER SET utf8mb4; USE {db};
         CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         INSERT INTO hits VALUES ('home', 0);"
    ));
}

/// `heatsink migrate --apply` of `rules` against `node`'s database `db`; its output.
fn migrate_on(node: &GaleraNode, rules: &std::path::Path, db: &str) -> String {
    let (code, out, err) = Cli::new(["migrate", "--apply", "--rules"])
        .arg(rules)
        .arg("--backend-url")
        .arg(node.url(db))
        .run();
    assert_eq!(code, 0, "migrate failed:\n{out}\n{err}");
    out
}

/// One proxy per node, each with the rules in `rules`.
fn proxy_per_node(rules: &std::path::Path) -> Vec<Proxy> {
    galera()
        .nodes()
        .iter()
        .map(|n| {
            Proxy::builder()
                .backend(n.addr())
                .rules_dir(rules)
                .log_level_from("CLUSTER_PROXY_LOG")
                .start()
        })
        .collect()
}

/// The outcome of a load: statements acknowledged, errors by code.
#[derive(Default)]
struct Load {
    ok: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

/// `PER_NODE` connections to each of `urls` run `sql` until `duration` has passed
/// (at most `per_conn` times each). Returns what they saw.
async fn hammer(urls: &[String], sql: &str, duration: Duration, per_conn: u64) -> Arc<Load> {
    let sql = sql.to_string();
    hammer_with(urls, duration, per_conn, move |_| sql.clone()).await
}

/// [`hammer`] with a statement made per execution from a number unique to it.
async fn hammer_with(
    urls: &[String],
    duration: Duration,
    per_conn: u64,
    sql: impl Fn(u64) -> String + Send + Sync + Clone + 'static,
) -> Arc<Load> {
    let load = Arc::new(Load::default());
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for url in urls {
        for _ in 0..PER_NODE {
            let (url, sql, load) = (url.clone(), sql.clone(), load.clone());
            let first = tasks.len() as u64 * 1_000_000;
            tasks.push(tokio::spawn(async move {
                let mut conn = connect(&url).await;
                for i in 0..per_conn {
                    if Instant::now() >= end {
                        break;
                    }
                    match conn.query_drop(sql(first + i).as_str()).await {
                        Ok(()) => {
                            load.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => load.errors.lock().unwrap().push(e.to_string()),
                    }
                }
                let _ = conn.disconnect().await;
            }));
        }
    }
    for t in tasks {
        t.await.expect("load task");
    }
    load
}

/// The counter's value, read on `node` once it applied every write.
fn counter_total(node: &GaleraNode, db: &str) -> i64 {
    let rows = node.query_strings(&format!(
        "SELECT h.cnt + COALESCE((SELECT SUM(s.cnt) FROM {db}.hits_slots s WHERE s.slug = h.slug), 0) \
         FROM {db}.hits h WHERE h.slug = 'home'"
    ));
    rows[0][0]
        .as_deref()
        .expect("a value")
        .parse()
        .expect("a number")
}

fn hot_counter_through_every_node(db: &str, coalesce: bool) {
    let cluster = galera();
    counter_db(db);
    let rules = rules_dir(
        "counter.toml",
        &Rule::counter("page_hits", "hits").coalesce(coalesce).toml(),
    );
    migrate_on(cluster.node(0), rules.path(), db);
    let proxies = proxy_per_node(rules.path());
    let urls: Vec<String> = proxies.iter().map(|p| p.url(db)).collect();
    run(Duration::from_secs(120), async {
        let load = hammer(
            &urls,
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'",
            Duration::from_secs(4),
            200,
        )
        .await;
        let errors = load.errors.lock().unwrap().clone();
        let ok = load.ok.load(Ordering::Relaxed);
        assert!(
            errors.is_empty(),
            "{} of {} increments failed through heatsink, first: {:?}",
            errors.len(),
            ok as usize + errors.len(),
            errors.first()
        );
        assert!(ok > 0, "no increment ran");
        // Every node agrees on the exact total, read directly and through its proxy.
        for (node, url) in cluster.nodes().iter().zip(&urls) {
            assert_eq!(
                counter_total(node, db),
                ok as i64,
                "node {}",
                node.index() + 1
            );
            let mut conn = connect(url).await;
            conn.query_drop("SET SESSION wsrep_sync_wait = 15")
                .await
                .expect("sync wait");
            let v: Option<i64> = conn
                .query_first("SELECT cnt FROM hits WHERE slug = 'home'")
                .await
                .expect("read through the proxy");
            assert_eq!(
                v,
                Some(ok as i64),
                "through the proxy of node {}",
                node.index() + 1
            );
        }
        eprintln!("{db}: {ok} increments through 3 nodes, 0 errors");
    });
    drop(proxies);
}

#[test]
fn hot_counter_through_one_proxy_per_node_is_exact_without_errors() {
    let _serial = cluster_lock();
    hot_counter_through_every_node("cl_counter", false);
}

#[test]
fn hot_counter_with_group_commit_through_one_proxy_per_node_is_exact_without_errors() {
    let _serial = cluster_lock();
    hot_counter_through_every_node("cl_counter_merged", true);
}

#[test]
fn the_same_load_sent_directly_gets_certification_conflicts() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_direct";
    counter_db(db);
    let urls: Vec<String> = cluster.nodes().iter().map(|n| n.url(db)).collect();
    run(Duration::from_secs(120), async {
        let load = hammer(
            &urls,
            "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'",
            Duration::from_secs(3),
            400,
        )
        .await;
        let errors = load.errors.lock().unwrap().clone();
        let ok = load.ok.load(Ordering::Relaxed);
        assert!(
            errors.iter().any(|e| e.contains("1213")),
            "no certification conflict in {ok} direct increments: {:?}",
            errors.first()
        );
        eprintln!(
            "direct: {ok} increments, {} errors (certification conflicts)",
            errors.len()
        );
    });
}

/// `SHOW BACKENDS` on the admin port: (address, state, detail, connections).
async fn show_backends(admin: std::net::SocketAddr) -> Vec<(String, String, String, u64)> {
    let mut a = connect(&format!("mysql://admin@{admin}/?prefer_socket=false")).await;
    let rows: Vec<(String, String, String, u64, u64, u64)> =
        a.query("SHOW BACKENDS").await.expect("SHOW BACKENDS");
    let _ = a.disconnect().await;
    rows.into_iter()
        .map(|(addr, state, detail, conns, _, _)| (addr, state, detail, conns))
        .collect()
}

/// The node (1-based, from `wsrep_node_name`) a connection landed on.
async fn node_of(conn: &mut mysql_async::Conn) -> usize {
    let name: String = conn
        .query_first("SELECT @@wsrep_node_name")
        .await
        .expect("node name")
        .expect("a row");
    name.trim_start_matches("node").parse().expect("nodeN")
}

#[test]
fn one_proxy_in_front_of_the_cluster_survives_kill_9_of_a_node() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_failover";
    counter_db(db);
    let rules = rules_dir("counter.toml", &Rule::counter("page_hits", "hits").toml());
    migrate_on(cluster.node(0), rules.path(), db);
    let (builder, metrics) = Proxy::builder()
        .backend(cluster.backend_list())
        .rules_dir(rules.path())
        .arg("--health-user")
        .arg("root")
        .arg("--health-interval-ms")
        .arg("200")
        .log_level_from("CLUSTER_PROXY_LOG")
        .listen_arg("--metrics");
    let (proxy, admin) = builder.start_with_admin();
    let url = proxy.url(db);
    const CONNS: usize = 64;
    let victim = 2; // 1-based node number
    run(Duration::from_secs(240), async {
        let backends = show_backends(admin).await;
        assert_eq!(backends.len(), 3, "{backends:?}");
        for b in &backends {
            assert_eq!(b.1, "up", "{backends:?}");
            assert!(b.2.contains("Synced"), "{backends:?}");
        }
        // Least connections: 64 connections spread evenly over the nodes.
        let mut conns = Vec::new();
        let mut per_node = [0usize; 3];
        for _ in 0..CONNS {
            let mut c = connect(&url).await;
            per_node[node_of(&mut c).await - 1] += 1;
            conns.push(c);
        }
        assert!(per_node.iter().all(|&n| n >= CONNS / 3), "{per_node:?}");
        let backends = show_backends(admin).await;
        assert_eq!(
            backends.iter().map(|b| b.3).sum::<u64>(),
            CONNS as u64,
            "{backends:?}"
        );

        // Load on every connection; node 2 is killed with SIGKILL after 1.5 s.
        let acked = Arc::new(AtomicU64::new(0));
        let unknown = Arc::new(AtomicU64::new(0));
        let reconnect_ms = Arc::new(std::sync::Mutex::new(Vec::new()));
        let other_errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let end = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for mut conn in conns {
            let mut on = node_of(&mut conn).await;
            let (url, acked, unknown, reconnect_ms, other_errors) = (
                url.clone(),
                acked.clone(),
                unknown.clone(),
                reconnect_ms.clone(),
                other_errors.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    match conn
                        .query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
                        .await
                    {
                        Ok(()) => {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            // The node died under this session: the increment's outcome
                            // is unknown; the client reconnects.
                            // Only sessions of that node see an error: the connection
                            // lost (2013 or closed), or a merged write of their node
                            // whose outcome is unknown (1158).
                            let text = e.to_string();
                            let lost = text.contains("2013")
                                || text.contains("1158")
                                || matches!(e, mysql_async::Error::Io(_));
                            if !lost || on != victim {
                                other_errors
                                    .lock()
                                    .unwrap()
                                    .push(format!("node {on}: {text}"));
                            }
                            unknown.fetch_add(1, Ordering::Relaxed);
                            let started = Instant::now();
                            conn = loop {
                                match mysql_async::Conn::from_url(url.as_str()).await {
                                    Ok(mut c) => {
                                        on = node_of(&mut c).await;
                                        assert_ne!(on, victim, "reconnected to the dead node");
                                        break c;
                                    }
                                    Err(e) => {
                                        assert!(
                                            started.elapsed() < Duration::from_secs(5),
                                            "no reconnect within 5 s: {e}"
                                        );
                                        tokio::time::sleep(Duration::from_millis(10)).await;
                                    }
                                }
                            };
                            reconnect_ms
                                .lock()
                                .unwrap()
                                .push(started.elapsed().as_millis() as u64);
                        }
                    }
                }
                let _ = conn.disconnect().await;
            }));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let victim_node = cluster.node(victim - 1);
        tokio::task::spawn_blocking(move || galera().node(victim - 1).kill9())
            .await
            .expect("kill");
        for t in tasks {
            t.await.expect("load task");
        }
        let acked = acked.load(Ordering::Relaxed);
        let unknown = unknown.load(Ordering::Relaxed);
        let reconnects = reconnect_ms.lock().unwrap().clone();
        let other = other_errors.lock().unwrap().clone();
        assert!(other.is_empty(), "errors other than a lost node: {other:?}");
        assert!(
            !reconnects.is_empty(),
            "no session saw node {victim} die ({acked} increments)"
        );
        let slowest = reconnects.iter().copied().max().unwrap_or(0);
        assert!(
            slowest < 1000,
            "a reconnect took {slowest} ms: {reconnects:?}"
        );
        // The dead node is down in SHOW BACKENDS and /readyz still answers ready.
        let backends = show_backends(admin).await;
        assert_eq!(backends[victim - 1].1, "down", "{backends:?}");
        let (status, body) = common::http_get(metrics, "/readyz");
        assert_eq!(status, 200, "{body}");
        let victim_addr = cluster.node(victim - 1).addr().to_string();
        assert!(body.contains(&format!("{victim_addr} down")), "{body}");
        let (_, text) = common::http_get(metrics, "/metrics");
        assert!(
            text.contains(&format!(
                "heatsink_backend_up{{backend=\"{victim_addr}\"}} 0"
            )),
            "{text}"
        );
        let other = cluster.node(0).addr().to_string();
        assert!(
            text.contains(&format!("heatsink_backend_up{{backend=\"{other}\"}} 1")),
            "{text}"
        );

        // The node rejoins; every acknowledged increment is there, on every node.
        tokio::task::spawn_blocking(move || galera().node(victim - 1).restart())
            .await
            .expect("restart");
        for node in cluster.nodes() {
            let total = counter_total(node, db) as u64;
            assert!(
                total >= acked && total <= acked + unknown,
                "node {}: total {total}, acknowledged {acked}, unknown {unknown}",
                node.index() + 1
            );
        }
        // Once the checker sees it Synced, it takes new connections again.
        let deadline = Instant::now() + Duration::from_secs(10);
        while show_backends(admin).await[victim - 1].1 != "up" {
            assert!(Instant::now() < deadline, "node {victim} not up again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut seen = Vec::new();
        let mut open = Vec::new();
        for _ in 0..3 {
            let mut c = connect(&url).await;
            seen.push(node_of(&mut c).await);
            open.push(c);
        }
        assert!(
            seen.contains(&victim),
            "the rejoined node got no connection: {seen:?}"
        );
        for c in open {
            let _ = c.disconnect().await;
        }
        eprintln!(
            "failover: {acked} acknowledged, {unknown} lost with node {victim}, \
             reconnects {} (slowest {slowest} ms), node pid {}",
            reconnects.len(),
            victim_node.pid()
        );
    });
    drop(proxy);
}

/// On a Galera node `GET_LOCK` holds only on that node: `heatsink maintain` takes a
/// lease row in `heatsink_locks` instead, which a run through another node sees.
#[test]
fn maintenance_lock_holds_across_nodes() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_lock";
    counter_db(db);
    let rules = rules_dir("counter.toml", &Rule::counter("page_hits", "hits").toml());
    migrate_on(cluster.node(0), rules.path(), db);
    let maintain = |node: usize| {
        Cli::new(["maintain", "--apply", "--job", "compact", "--rules"])
            .arg(rules.path())
            .arg("--backend-url")
            .arg(cluster.node(node).url(db))
            .run()
    };
    // A first run creates the lease table, runs, and leaves no lease behind.
    let (code, out, err) = maintain(0);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("rule page_hits:"), "{out}");
    let lock = format!("heatsink:compact:{db}.hits");
    let leases = |node: usize| {
        cluster.node(node).query_strings(&format!(
            "SELECT owner FROM {db}.heatsink_locks WHERE name = '{lock}'"
        ))
    };
    assert!(leases(1).is_empty());
    // A run holding the lease through node 1: runs through nodes 2 and 3 skip.
    cluster.node(0).exec(&format!(
        "INSERT INTO {db}.heatsink_locks VALUES ('{lock}', 'another run', NOW(6) + INTERVAL 1 HOUR)"
    ));
    for node in [1, 2] {
        let (code, out, err) = maintain(node);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains("is running elsewhere"),
            "node {}: {out}",
            node + 1
        );
    }
    // A lease that lapsed (its run died) is taken over.
    cluster.node(2).exec(&format!(
        "UPDATE {db}.heatsink_locks SET expires = NOW(6) - INTERVAL 1 SECOND WHERE name = '{lock}'"
    ));
    let (code, out, err) = maintain(1);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("is running elsewhere"), "{out}");
    assert!(leases(0).is_empty(), "the lease is released");
}

/// `heatsink check --backend-url` on a Galera node warns about what Galera does not
/// support: a ruled table that is not InnoDB, the LOCK TABLES of a ring's backfill.
#[test]
fn check_warns_about_what_galera_does_not_support() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_check";
    cluster.any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}; USE {db};
         CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0) ENGINE=MyISAM;
         CREATE TABLE profile_visits_log (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL,
           visitor_uid INT NOT NULL, last_update DATETIME(6) NOT NULL, KEY(uid));"
    ));
    let counter = Rule::counter("page_hits", "hits").toml();
    let ring = ring_rule(true);
    let rules = common::client::rules_dir_with(&[
        ("counter.toml", counter.as_str()),
        ("ring.toml", ring.as_str()),
    ]);
    let (_code, out, err) = Cli::new(["check", "--rules"])
        .arg(rules.path())
        .arg("--backend-url")
        .arg(cluster.node(1).url(db))
        .run();
    assert!(
        out.contains("Galera: table cl_check.hits is MyISAM, not InnoDB"),
        "{out}\n{err}"
    );
    assert!(
        out.contains(
            "rule 'profile_visits': warning: Galera: `heatsink migrate --apply` backfills"
        ),
        "{out}\n{err}"
    );
}

/// The ring of these tests: the latest 5 visits per `uid`.
fn ring_rule(coalesce: bool) -> String {
    Rule::ring("profile_visits", "profile_visits_log")
        .key(&["uid"])
        .size(5)
        .ring_table("profile_visits_ring")
        .seq_table("profile_visits_seq")
        .order_by("last_update")
        .coalesce(coalesce)
        .toml()
}

/// Inserts into a ring through one proxy per node, 66 connections on 4 hot keys: no
/// client error, each key's sequence is single-run across the nodes (its counter is
/// the number of acknowledged inserts, the ring holds the 5 latest numbers), and
/// every node holds the same ring.
fn ring_through_every_node(db: &str, coalesce: bool) {
    let cluster = galera();
    cluster.any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}; USE {db};
         CREATE TABLE profile_visits_log (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL,
           visitor_uid INT NOT NULL, last_update DATETIME(6) NOT NULL, KEY(uid));"
    ));
    let rules = rules_dir("ring.toml", &ring_rule(coalesce));
    let out = migrate_on(cluster.node(0), rules.path(), db);
    assert!(
        out.contains("this is a Galera node; the backfill below runs under LOCK TABLES"),
        "{out}"
    );
    let proxies = proxy_per_node(rules.path());
    let urls: Vec<String> = proxies.iter().map(|p| p.url(db)).collect();
    run(Duration::from_secs(120), async {
        let load = hammer_with(&urls, Duration::from_secs(4), 100, |n| {
            format!(
                "INSERT INTO profile_visits_log (uid, visitor_uid, last_update) \
                 VALUES ({}, {}, NOW(6))",
                n % 4,
                n % 1_000_000_000
            )
        })
        .await;
        let errors = load.errors.lock().unwrap().clone();
        let ok = load.ok.load(Ordering::Relaxed);
        assert!(
            errors.is_empty(),
            "{} of {} ring inserts failed through heatsink, first: {:?}",
            errors.len(),
            ok as usize + errors.len(),
            errors.first()
        );
        let mut states = Vec::new();
        for node in cluster.nodes() {
            let seqs = node.query_strings(&format!(
                "SELECT CAST(SUM(seq) AS CHAR) FROM {db}.profile_visits_seq"
            ));
            assert_eq!(
                seqs[0][0].as_deref(),
                Some(ok.to_string().as_str()),
                "node {}: the keys' sequences add up to the acknowledged inserts",
                node.index() + 1
            );
            let ring = node.query_strings(&format!(
                "SELECT r.uid, COUNT(*), MIN(r.seq), MAX(r.seq), s.seq \
                 FROM {db}.profile_visits_ring r JOIN {db}.profile_visits_seq s ON s.uid = r.uid \
                 GROUP BY r.uid, s.seq ORDER BY r.uid"
            ));
            for row in &ring {
                let n = |i: usize| -> i64 { row[i].as_deref().unwrap_or("0").parse().unwrap() };
                assert_eq!(n(1), 5, "node {}: {row:?}", node.index() + 1);
                assert_eq!(n(3), n(4), "the newest row is the last number: {row:?}");
                assert_eq!(n(2), n(4) - 4, "the 5 latest numbers: {row:?}");
            }
            let rows = node.query_strings(&format!(
                "SELECT uid, seq, visitor_uid FROM {db}.profile_visits_ring ORDER BY uid, seq"
            ));
            states.push(rows);
        }
        assert!(states.windows(2).all(|w| w[0] == w[1]), "nodes differ");
        eprintln!("{db}: {ok} ring inserts through 3 nodes, 0 errors");
    });
    drop(proxies);
}

#[test]
fn ring_through_one_proxy_per_node_stays_exact() {
    let _serial = cluster_lock();
    ring_through_every_node("cl_ring", false);
}

#[test]
fn ring_with_group_commit_through_one_proxy_per_node_stays_exact() {
    let _serial = cluster_lock();
    ring_through_every_node("cl_ring_merged", true);
}

/// Inserts into a log with a rollup (triggers keep it in the writing transaction)
/// through one proxy per node, 66 connections on 3 hot tracks: the rollup stays
/// equal to a GROUP BY over the log on every node, and the rewritten read through
/// each proxy answers what the log does. Returns the number of client errors (the
/// inserts are the client's own statements, forwarded unchanged).
#[test]
fn rollup_through_one_proxy_per_node_stays_exact() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_rollup";
    cluster.any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}; USE {db};
         CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME DEFAULT NULL,
           track_id INT DEFAULT NULL, user_id INT DEFAULT NULL, country VARCHAR(255) DEFAULT NULL,
           KEY (track_id), KEY (created_at));"
    ));
    let rule = Rule::rollup(
        "plays_hourly",
        "plays",
        "plays_by_track_hour",
        "created_at",
        "hour",
    )
    .dimensions(&["track_id"])
    .set("slots", "6");
    let rules = rules_dir("rollup.toml", &rule.toml());
    migrate_on(cluster.node(0), rules.path(), db);
    let proxies = proxy_per_node(rules.path());
    let urls: Vec<String> = proxies.iter().map(|p| p.url(db)).collect();
    run(Duration::from_secs(120), async {
        let load = hammer_with(&urls, Duration::from_secs(4), 100, |n| {
            format!(
                "INSERT INTO plays (created_at, track_id, user_id, country) \
                 VALUES ('2024-03-01 10:00:00' + INTERVAL {} MINUTE, {}, {}, 'DE')",
                n % 120,
                n % 3,
                n % 1000
            )
        })
        .await;
        let errors = load.errors.lock().unwrap().clone();
        let ok = load.ok.load(Ordering::Relaxed);
        let read = "SELECT track_id, COUNT(*) AS plays FROM plays \
                    WHERE created_at >= '2024-03-01 00:00:00' AND created_at < '2024-03-02 00:00:00' \
                    GROUP BY track_id ORDER BY track_id";
        for (node, url) in cluster.nodes().iter().zip(&urls) {
            let log = node.query_strings(&format!(
                "SELECT CAST(track_id AS CHAR), DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00'), COUNT(*) \
                 FROM {db}.plays GROUP BY 1, 2 ORDER BY 1, 2"
            ));
            let rollup = node.query_strings(&format!(
                "SELECT CAST(track_id AS CHAR), DATE_FORMAT(hs_bucket, '%Y-%m-%d %H:%i:%s'), SUM(hs_rows) \
                 FROM {db}.plays_by_track_hour GROUP BY 1, 2 HAVING SUM(hs_rows) <> 0 ORDER BY 1, 2"
            ));
            assert_eq!(log, rollup, "node {}", node.index() + 1);
            let total: u64 = log
                .iter()
                .map(|r| r[2].as_deref().unwrap_or("0").parse::<u64>().unwrap())
                .sum();
            assert_eq!(total, ok, "node {}: acknowledged inserts", node.index() + 1);
            let mut conn = connect(url).await;
            conn.query_drop("SET SESSION wsrep_sync_wait = 15")
                .await
                .expect("sync");
            let through: Vec<(i64, i64)> = conn.query(read).await.expect("rollup read");
            let direct: Vec<(i64, i64)> = {
                let mut d = connect(&node.url(db)).await;
                d.query_drop("SET SESSION wsrep_sync_wait = 15")
                    .await
                    .expect("sync");
                d.query(read).await.expect("log read")
            };
            assert_eq!(through, direct, "node {}", node.index() + 1);
        }
        eprintln!(
            "{db}: {ok} log inserts through 3 nodes, {} errors, first: {:?}",
            errors.len(),
            errors.first()
        );
        assert!(
            errors.is_empty(),
            "{} inserts failed: {:?}",
            errors.len(),
            errors.first()
        );
    });
    drop(proxies);
}

/// `--backend-policy first` (single-primary use): every connection goes to the first
/// healthy node of the list; when it dies, new connections go to the next one at
/// once; when it is back and Synced, new connections go to it again.
#[test]
fn first_policy_fails_over_and_back() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_first";
    counter_db(db);
    let rules = rules_dir("counter.toml", &Rule::counter("page_hits", "hits").toml());
    migrate_on(cluster.node(0), rules.path(), db);
    let primary = 3; // 1-based: the node the test kills (not the bootstrap node)
                     // The list starts with the primary.
    let mut list: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.addr().to_string())
        .collect();
    list.swap(0, primary - 1);
    let next = 2; // list[1]: node 2
    let (proxy, admin2) = Proxy::builder()
        .backend(list.join(","))
        .rules_dir(rules.path())
        .arg("--backend-policy")
        .arg("first")
        .arg("--health-user")
        .arg("root")
        .arg("--health-interval-ms")
        .arg("200")
        .start_with_admin();
    let url2 = proxy.url(db);
    run(Duration::from_secs(180), async {
        let mut conns = Vec::new();
        for _ in 0..6 {
            let mut c = connect(&url2).await;
            assert_eq!(node_of(&mut c).await, primary);
            c.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
                .await
                .expect("increment");
            conns.push(c);
        }
        tokio::task::spawn_blocking(move || galera().node(primary - 1).kill9())
            .await
            .expect("kill");
        // The sessions of the dead primary get an error; new connections go to the
        // next node of the list at once.
        for mut c in conns {
            assert!(c
                .query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
                .await
                .is_err());
        }
        let started = Instant::now();
        let mut c = connect(&url2).await;
        assert_eq!(node_of(&mut c).await, next);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        c.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
            .await
            .expect("increment on the next node");
        drop(c);
        tokio::task::spawn_blocking(move || galera().node(primary - 1).restart())
            .await
            .expect("restart");
        let deadline = Instant::now() + Duration::from_secs(10);
        while show_backends(admin2).await[0].1 != "up" {
            assert!(Instant::now() < deadline, "primary not up again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut c = connect(&url2).await;
        assert_eq!(node_of(&mut c).await, primary, "back to the first node");
        assert_eq!(counter_total(cluster.node(primary - 1), db), 7);
    });
    drop(proxy);
}

/// A node that is not Synced (here desynced by hand, as a donor is) takes no new
/// connections; once Synced again, it does.
#[test]
fn a_desynced_node_takes_no_new_connections() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_desync";
    counter_db(db);
    let (proxy, admin) = Proxy::builder()
        .backend(cluster.backend_list())
        .arg("--health-user")
        .arg("root")
        .arg("--health-interval-ms")
        .arg("100")
        .start_with_admin();
    let url = proxy.url(db);
    let desynced = 3; // 1-based
    run(Duration::from_secs(60), async {
        cluster
            .node(desynced - 1)
            .exec("SET GLOBAL wsrep_desync = ON");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let b = show_backends(admin).await;
            if b[desynced - 1].1 == "down" {
                assert!(b[desynced - 1].2.contains("Desynced"), "{b:?}");
                break;
            }
            assert!(Instant::now() < deadline, "still up: {b:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut open = Vec::new();
        for _ in 0..6 {
            let mut c = connect(&url).await;
            assert_ne!(node_of(&mut c).await, desynced);
            open.push(c);
        }
        cluster
            .node(desynced - 1)
            .exec("SET GLOBAL wsrep_desync = OFF");
        let deadline = Instant::now() + Duration::from_secs(10);
        while show_backends(admin).await[desynced - 1].1 != "up" {
            assert!(Instant::now() < deadline, "node {desynced} not up again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Least connections: the node without any gets the next one.
        let mut c = connect(&url).await;
        assert_eq!(node_of(&mut c).await, desynced);
        for c in open {
            let _ = c.disconnect().await;
        }
    });
    drop(proxy);
}

/// `YYYY-MM-DD` of day `d` after the epoch.
fn epoch_day(d: i64) -> String {
    heatsink::kinds::partition::period::day_sql(d)
}

/// The partition and timeline kinds through one heatsink per node: keyed inserts
/// through every node get their partition column from the key, lookups by key
/// through every node answer as the table does on that node, one `heatsink
/// maintain` per node rotates the partitions once (the cluster-wide lease), and
/// pulled timelines through every node equal the plain query.
#[test]
fn partition_and_timeline_through_one_proxy_per_node() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_part";
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let today = now.div_euclid(86_400);
    let parts: Vec<String> = (-2..=1)
        .map(|d| {
            format!(
                "PARTITION p{} VALUES LESS THAN ('{}')",
                epoch_day(today + d).replace('-', ""),
                epoch_day(today + d + 1)
            )
        })
        .collect();
    cluster.any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db} CHARACTER SET utf8mb4; USE {db};
         CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT, UUID VARCHAR(40) NOT NULL,
           Message JSON NOT NULL, Inserted DATE NOT NULL,
           PRIMARY KEY (ID, Inserted), UNIQUE KEY (UUID, Inserted))
           PARTITION BY RANGE COLUMNS (Inserted) ({}, PARTITION pmax VALUES LESS THAN (MAXVALUE));
         CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL,
           PRIMARY KEY (user_id, follower_id), KEY (follower_id));
         CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL,
           body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));
         INSERT INTO follower SELECT 1 + seq DIV 10, 1 + (seq * 7) % 50 FROM seq_0_to_499;",
        parts.join(", ")
    ));
    let rules = format!(
        "{}\n{}",
        Rule::partition("messages_by_day", "Messages").toml(),
        Rule::timeline("friends").toml()
    );
    let rules = rules_dir("rules.toml", &rules);
    migrate_on(cluster.node(0), rules.path(), db);
    let proxies = proxy_per_node(rules.path());
    let urls: Vec<String> = proxies.iter().map(|p| p.url(db)).collect();
    let key = |n: usize| format!("{n:010x}-{}-{:010x}", now - (n as i64 % 3) * 3_600, n);
    run(Duration::from_secs(120), async {
        // Keyed inserts and posts through every node.
        for (i, url) in urls.iter().enumerate() {
            let mut c = connect(url).await;
            c.query_drop("SET time_zone = '+00:00'").await.expect("tz");
            for n in (i * 40)..(i * 40 + 40) {
                c.query_drop(format!(
                    "INSERT INTO Messages (UUID, Message) VALUES ('{}', '{{\"n\": {n}}}')",
                    key(n)
                ))
                .await
                .expect("keyed insert");
                c.query_drop(format!(
                    "INSERT INTO message (user_id, body) VALUES ({}, 'post {n}')",
                    1 + n % 50
                ))
                .await
                .expect("post");
            }
        }
        for (node, url) in cluster.nodes().iter().zip(&urls) {
            let mut through = connect(url).await;
            let mut direct = connect(&node.url(db)).await;
            for c in [&mut through, &mut direct] {
                c.query_drop("SET SESSION wsrep_sync_wait = 15, time_zone = '+00:00'")
                    .await
                    .expect("sync");
            }
            for n in (0..120).step_by(7) {
                let sql = format!(
                    "SELECT ID, Message, Inserted FROM Messages WHERE UUID = '{}'",
                    key(n)
                );
                let a: Vec<(i64, String, String)> = through.query(&sql).await.expect("lookup");
                let b: Vec<(i64, String, String)> = direct.query(&sql).await.expect("lookup");
                assert_eq!(a, b, "node {}: {sql}", node.index() + 1);
                assert_eq!(a.len(), 1, "node {}: {sql}", node.index() + 1);
            }
            for reader in [1, 7, 23, 50] {
                let sql = format!(
                    "SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id \
                     WHERE follower.user_id = {reader} ORDER BY message.id DESC LIMIT 10"
                );
                let a: Vec<(u32, u32, String)> = through.query(&sql).await.expect("timeline");
                let b: Vec<(u32, u32, String)> = direct.query(&sql).await.expect("timeline");
                assert_eq!(a, b, "node {}: reader {reader}", node.index() + 1);
            }
        }
    });
    // Rotation from every node at once: the partitions premade once, none twice.
    let handles: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|node| {
            let url = node.url(db);
            let dir = rules.path().to_path_buf();
            std::thread::spawn(move || {
                Cli::new(["maintain", "--apply", "--rules"])
                    .arg(dir)
                    .arg("--backend-url")
                    .arg(url)
                    .run()
            })
        })
        .collect();
    for h in handles {
        let (code, out, err) = h.join().expect("maintain thread");
        assert_eq!(code, 0, "maintain:\n{out}\n{err}");
    }
    let names = cluster.node(1).query_strings(&format!(
        "SELECT PARTITION_NAME FROM information_schema.PARTITIONS \
         WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'Messages' ORDER BY PARTITION_ORDINAL_POSITION"
    ));
    let names: Vec<String> = names.into_iter().filter_map(|r| r[0].clone()).collect();
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(unique, names, "partitions: {names:?}");
    let future = format!("p{}", epoch_day(today + 3).replace('-', ""));
    assert!(names.contains(&future), "premade {future}: {names:?}");
    let rows = cluster
        .node(2)
        .query_strings(&format!("SELECT COUNT(*) FROM {db}.Messages"));
    assert_eq!(rows[0][0].as_deref(), Some("120"));
}

/// A rollup backfill through node 1, killed half way (writes through the same
/// node while it runs, through node 2 between the runs), continues at the next
/// `migrate --apply` and ends exact on every node, its delta triggers and table
/// gone everywhere.
#[test]
fn a_rollup_backfill_killed_on_a_node_continues_exact_on_every_node() {
    let _serial = cluster_lock();
    let cluster = galera();
    let db = "cl_backfill";
    let rows: Vec<String> = (0..1500)
        .map(|i| {
            format!(
                "('2024-05-0{} 10:00:00', {}, {})",
                1 + i % 7,
                i % 13,
                i % 101
            )
        })
        .collect();
    cluster.any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}; USE {db};
         CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME NULL,
           track_id INT NULL, user_id INT NULL);
         INSERT INTO plays (created_at, track_id, user_id) VALUES {};",
        rows.join(", ")
    ));
    let rule = Rule::rollup(
        "plays_daily",
        "plays",
        "plays_by_track_day",
        "created_at",
        "day",
    )
    .dimensions(&["track_id"])
    .measures(&["count(*)", "sum(user_id)"]);
    let rules = rules_dir("rollup.toml", &rule.toml());
    let node = cluster.node(0);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_heatsink"))
        .args([
            "migrate",
            "--apply",
            "--chunk",
            "20",
            "--max-rows-per-second",
            "300",
        ])
        .arg("--rules")
        .arg(rules.path())
        .arg("--backend-url")
        .arg(node.url(db))
        .env_remove("HEATSINK_BACKEND_URL")
        .env_remove("HEATSINK_RULES")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn migrate");
    let done = |n: &GaleraNode| -> Option<(String, u64)> {
        let exists = n.query_strings(&format!(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME = 'heatsink_jobs'"
        ));
        if exists.is_empty() {
            return None;
        }
        let rows = n.query_strings(&format!(
            "SELECT state, CAST(rows_done AS CHAR) FROM {db}.heatsink_jobs WHERE rule = 'plays_daily'"
        ));
        let r = rows.into_iter().next()?;
        Some((r[0].clone()?, r[1].as_deref()?.parse().ok()?))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut round = 0u64;
    loop {
        if done(node).is_some_and(|(s, n)| s == "running" && n >= 300) {
            break;
        }
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("migrate ended ({status}) before it was half way");
        }
        assert!(Instant::now() < deadline, "the backfill made no progress");
        if done(node).is_some_and(|(s, _)| s == "running") {
            round += 1;
            node.exec(&format!(
                "USE {db}; UPDATE plays SET user_id = user_id + 1000, track_id = 99 WHERE id = {}; \
                 DELETE FROM plays WHERE id = {}; \
                 INSERT INTO plays (created_at, track_id, user_id) VALUES ('2024-05-02 11:00:00', 3, {round})",
                1 + round * 37 % 1500,
                2 + round * 53 % 1500
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    let (state, before) = done(node).expect("a job row");
    assert_eq!(state, "running");
    cluster.node(1).exec(&format!(
        "USE {db}; UPDATE plays SET user_id = 5 WHERE id IN (7, 800, 1450); \
         DELETE FROM plays WHERE id IN (8, 1200); \
         INSERT INTO plays (created_at, track_id, user_id) VALUES ('2024-05-03 11:00:00', 4, 4)"
    ));
    let out = migrate_on(node, rules.path(), db);
    assert!(out.contains("continuing at"), "{out}");
    assert!(out.contains(&format!("({before} log rows done)")), "{out}");
    let (state, total) = done(node).expect("a job row");
    assert_eq!(state, "done");
    assert!(total <= 1500, "{total}");
    for n in cluster.nodes() {
        let log = n.query_strings(&format!(
            "SELECT CAST(track_id AS CHAR), DATE_FORMAT(created_at, '%Y-%m-%d'), COUNT(*), \
             CAST(IFNULL(SUM(user_id), 0) AS CHAR) FROM {db}.plays GROUP BY 1, 2 ORDER BY 1, 2"
        ));
        let rollup = n.query_strings(&format!(
            "SELECT CAST(track_id AS CHAR), DATE_FORMAT(hs_bucket, '%Y-%m-%d'), \
             CAST(SUM(hs_rows) AS CHAR), CAST(CAST(SUM(hs_sum_user_id) AS SIGNED) AS CHAR) \
             FROM {db}.plays_by_track_day GROUP BY 1, 2 HAVING SUM(hs_rows) <> 0 ORDER BY 1, 2"
        ));
        assert_eq!(log, rollup, "node {}", n.index() + 1);
        let left = n.query_strings(&format!(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME LIKE '%backfill_delta' UNION ALL SELECT TRIGGER_NAME \
             FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = '{db}' AND TRIGGER_NAME LIKE '%hs\\_bf\\_%'"
        ));
        assert!(left.is_empty(), "node {}: {left:?}", n.index() + 1);
    }
}
