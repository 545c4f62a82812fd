//! Defaults a newcomer meets first: `serve` without `--rules` applies no rules (even in
//! a checkout whose `rules/` holds the examples) and says so; `--version` and the
//! `heatsink_build_info` metric name the build.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::cli::{heatsink, Cli};
use common::client::{connect, run};
use common::fixture::{fresh_db, scalar, table_exists};
use common::{http_get, sample, Proxy};
use mysql_async::prelude::*;

const LIMIT: Duration = Duration::from_secs(60);
const DB: &str = "hs_defaults";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commit the build knew (`build.rs`), as the binary reports it.
fn commit_label() -> &'static str {
    match env!("HEATSINK_GIT_COMMIT") {
        "" => "unknown",
        c => c,
    }
}

/// Started in the repository (whose `rules/counters.toml` rules the table `hits`)
/// without `--rules`, the proxy loads no rules: statements on `hits` reach the table
/// as sent, shapes the example rule would refuse included; the start line, `/metrics`
/// and the admin port say there are no rules.
#[test]
fn serve_without_rules_is_a_pure_passthrough() {
    // What the example rules would do with the statements below, so that this test
    // fails if the proxy picked them up.
    let refused = "UPDATE hits SET cnt = cnt * 2 + 1 WHERE slug = 'home'";
    let (code, out, err) = Cli::new(["explain", "--rules"])
        .arg(repo().join("rules"))
        .arg(refused)
        .run();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("page_hits"),
        "the example counter rule acts on hits: {out}"
    );

    fresh_db(
        DB,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0, \
         note VARCHAR(20)); INSERT INTO hits (slug, cnt) VALUES ('home', 0)",
    );
    let (builder, metrics) = Proxy::builder()
        .no_rules()
        .current_dir(repo())
        .listen_arg("--metrics");
    let (proxy, admin) = builder.start_with_admin();
    run(LIMIT, async {
        let mut c = connect(&proxy.url(DB)).await;
        c.query_drop(refused).await.unwrap();
        assert_eq!(c.affected_rows(), 1);
        c.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(c.affected_rows(), 1);
        let cnt: Option<i64> = c
            .query_first("SELECT cnt FROM hits WHERE slug = 'home'")
            .await
            .unwrap();
        assert_eq!(cnt, Some(2));

        let mut a = connect(&format!("mysql://admin:@{admin}/?prefer_socket=false")).await;
        let rules: Vec<mysql_async::Row> = a.query("SHOW RULES").await.unwrap();
        assert!(rules.is_empty(), "SHOW RULES: {} rows", rules.len());
        let e = a.query_drop("RELOAD RULES").await.unwrap_err();
        assert!(e.to_string().contains("without --rules"), "{e}");
    });
    // The base row holds the writes; no slot table was involved.
    assert_eq!(
        scalar(&format!("SELECT cnt FROM {DB}.hits WHERE slug = 'home'")).as_deref(),
        Some("2")
    );
    assert!(!table_exists(DB, "hits_slots"));

    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert_eq!(sample(&body, "heatsink_rules_loaded"), Some(0.0), "{body}");
    assert_eq!(
        sample(&body, "heatsink_rule_reloads_total{result=\"error\"}"),
        Some(0.0),
        "asking for a reload without a rules path is not a failed reload: {body}"
    );

    let log = proxy.log_text();
    let start = log
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap_or_else(|| panic!("no start line:\n{log}"));
    assert!(start.contains("pure passthrough"), "{start}");
    assert!(start.contains("rules=none"), "{start}");
    assert!(start.contains("rules_loaded=false"), "{start}");
}

/// `--rules` given: the start line names the path and no passthrough notice.
#[test]
fn serve_with_rules_names_them_at_start() {
    let proxy = Proxy::start();
    let log = proxy.log_text();
    let start = log
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap_or_else(|| panic!("no start line:\n{log}"));
    assert!(!start.contains("pure passthrough"), "{start}");
    assert!(!start.contains("rules=none"), "{start}");
    assert!(
        start.contains(&format!("commit={:?}", commit_label())),
        "{start}"
    );
}

/// `maintain_url` runs the rules' jobs: without rules it is refused at start.
#[test]
fn maintain_url_needs_rules() {
    let (code, out, err) = Cli::new(["serve", "--listen", "127.0.0.1:1", "--maintain-url"])
        .arg("mysql://u:p@127.0.0.1:1/db")
        .env_remove("HEATSINK_RULES")
        .run();
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("maintain_url"), "{err}");
    assert!(err.contains("--rules"), "{err}");
}

/// `heatsink --version` and `-V`: the package version and, when the build knew it, the
/// commit's first 12 digits.
#[test]
fn version_flags() {
    let commit = env!("HEATSINK_GIT_COMMIT");
    let expected = if commit.is_empty() {
        format!("heatsink {}\n", env!("CARGO_PKG_VERSION"))
    } else {
        format!(
            "heatsink {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            &commit[..12]
        )
    };
    for flag in ["--version", "-V"] {
        let (code, out, err) = heatsink(&[flag]);
        assert_eq!(code, 0, "{flag}: {err}");
        assert_eq!(out, expected, "{flag}");
    }
    // Built in a git checkout without an override, the commit is known.
    if repo().join(".git").exists() && std::env::var_os("HEATSINK_GIT_COMMIT").is_none() {
        assert_eq!(commit.len(), 40, "commit read from .git: {commit:?}");
        assert!(commit.bytes().all(|b| b.is_ascii_hexdigit()), "{commit}");
    }
}

/// `/metrics` starts with `heatsink_build_info{version,commit} 1`.
#[test]
fn build_info_metric() {
    let (_proxy, addr) = Proxy::builder().start_with_metrics();
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("# TYPE heatsink_build_info gauge\n"),
        "{body}"
    );
    let series = format!(
        "heatsink_build_info{{version=\"{}\",commit=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        commit_label()
    );
    assert_eq!(sample(&body, &series), Some(1.0), "{series} in:\n{body}");
}
