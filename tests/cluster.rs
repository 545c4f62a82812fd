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

/// Connections per node in the load tests.
const PER_NODE: usize = 8;

/// Creates database `db` afresh on the cluster (DDL replicates to every node) with
/// `hits (slug, cnt)` holding `('home', 0)`.
fn counter_db(db: &str) {
    galera().any_synced().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db} CHARACTER SET utf8mb4; USE {db};
         CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         INSERT INTO hits VALUES ('home', 0);"
    ));
}

/// `heatsink migrate --apply` of `rules` against `node`'s database `db`.
fn migrate_on(node: &GaleraNode, rules: &std::path::Path, db: &str) {
    let (code, out, err) = Cli::new(["migrate", "--apply", "--rules"])
        .arg(rules)
        .arg("--backend-url")
        .arg(node.url(db))
        .run();
    assert_eq!(code, 0, "migrate failed:\n{out}\n{err}");
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
    let load = Arc::new(Load::default());
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for url in urls {
        for _ in 0..PER_NODE {
            let (url, sql, load) = (url.clone(), sql.to_string(), load.clone());
            tasks.push(tokio::spawn(async move {
                let mut conn = connect(&url).await;
                for _ in 0..per_conn {
                    if Instant::now() >= end {
                        break;
                    }
                    match conn.query_drop(sql.as_str()).await {
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
            400,
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
    hot_counter_through_every_node("cl_counter", false);
}

#[test]
fn hot_counter_with_group_commit_through_one_proxy_per_node_is_exact_without_errors() {
    hot_counter_through_every_node("cl_counter_merged", true);
}

#[test]
fn the_same_load_sent_directly_gets_certification_conflicts() {
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
