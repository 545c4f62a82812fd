//! Unix sockets on both legs (`--listen-unix PATH`, `--backend unix:PATH`): a
//! sidecar's application and a backend on the same host skip the TCP stack. The
//! session is the same session: rewrites, merged writes (whose session-state set-up
//! runs over the socket) and plain statements answer as they do over TCP.

mod common;

use std::time::Duration;

use common::client::{connect, rules_dir, run};
use common::fixture::{fresh_db, migrate_apply, scalar, Rule};
use common::{mariadb, Proxy};
use mysql_async::prelude::*;
use mysql_async::{Conn, OptsBuilder};

const LIMIT: Duration = Duration::from_secs(90);
const DB: &str = "hs_unix";

/// Options for a client on the proxy's Unix socket, as the fixture's user.
fn socket_opts(path: &std::path::Path) -> OptsBuilder {
    let direct = mysql_async::Opts::from_url(&mariadb().url(DB)).expect("fixture url");
    OptsBuilder::default()
        .socket(Some(path.display().to_string()))
        .user(direct.user())
        .pass(direct.pass())
        .db_name(Some(DB))
}

/// Sixteen clients on the proxy's socket increment a ruled counter (the proxy reaches
/// MariaDB over its socket too): every increment counts once, merged writes happen,
/// and a read of other statements gives what the same statements give over TCP.
#[test]
fn sessions_over_unix_sockets_on_both_legs() {
    fresh_db(
        DB,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0); \
         INSERT INTO hits VALUES ('home', 0); \
         CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(20) CHARACTER SET utf8mb4)",
    );
    let toml = Rule::counter("hot", "hits").toml();
    migrate_apply(DB, &toml);
    let rules = rules_dir("rules.toml", &toml);
    let sockdir = tempfile::tempdir().expect("tempdir");
    let sock = sockdir.path().join("heatsink.sock");
    // A file left by a proxy that is gone is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).expect("stale socket"));
    let backend = format!("unix:{}", mariadb().dir().join("sock").display());
    let (builder, metrics) = Proxy::builder()
        .rules_dir(rules.path())
        .backend(&backend)
        .arg("--listen-unix")
        .arg(sock.as_os_str())
        .listen_arg("--metrics");
    let mut proxy = builder.start();
    let tcp_url = proxy.url(DB);
    let sock_for_clients = sock.clone();
    run(LIMIT, async move {
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let opts = socket_opts(&sock_for_clients);
            tasks.push(tokio::spawn(async move {
                let mut c = Conn::new(opts).await.expect("connect over the socket");
                for _ in 0..50 {
                    c.query_drop("UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'")
                        .await
                        .expect("increment");
                }
                c.disconnect().await.expect("disconnect");
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
        let mut over_socket = Conn::new(socket_opts(&sock_for_clients))
            .await
            .expect("connect");
        let total: Option<i64> = over_socket
            .query_first("SELECT cnt FROM hits WHERE slug = 'home'")
            .await
            .expect("read");
        assert_eq!(total, Some(800));
        // The same statements over the socket and over TCP answer alike.
        let mut over_tcp = connect(&tcp_url).await;
        for sql in [
            "INSERT INTO notes VALUES (1, 'é')",
            "SELECT id, body, HEX(body) FROM notes",
            "SELECT DATABASE(), @@character_set_client, @@sql_mode",
        ] {
            let a: Vec<mysql_async::Row> = over_socket.query(sql).await.expect(sql);
            let b = if sql.starts_with("INSERT") {
                over_tcp
                    .query_drop("DELETE FROM notes")
                    .await
                    .expect("reset");
                over_tcp.query::<mysql_async::Row, _>(sql).await.expect(sql)
            } else {
                over_tcp.query::<mysql_async::Row, _>(sql).await.expect(sql)
            };
            let cells = |rows: &[mysql_async::Row]| {
                rows.iter()
                    .map(|r| r.clone().unwrap())
                    .collect::<Vec<Vec<mysql_async::Value>>>()
            };
            assert_eq!(cells(&a), cells(&b), "{sql}");
        }
        // The server sees its own socket connection: a local user.
        let host: Option<String> = over_socket
            .query_first("SELECT SUBSTRING_INDEX(USER(), '@', -1)")
            .await
            .expect("user");
        assert_eq!(host.as_deref(), Some("localhost"));
        over_socket.disconnect().await.expect("disconnect");
        over_tcp.disconnect().await.expect("disconnect");
    });
    let m = common::metrics(metrics);
    assert!(
        m.get("heatsink_coalesced_writes_total")
            .copied()
            .unwrap_or(0)
            > 0,
        "increments over the socket were merged: {m:?}"
    );
    assert_eq!(
        scalar(&format!(
            "SELECT (SELECT cnt FROM {DB}.hits WHERE slug = 'home') + \
             (SELECT COALESCE(SUM(cnt), 0) FROM {DB}.hits_slots WHERE slug = 'home')"
        ))
        .as_deref(),
        Some("800")
    );
    // A graceful stop removes the socket file.
    assert!(sock.exists());
    let status = proxy.stop_graceful();
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "the socket file is removed at shutdown");
}

/// A path that is not a socket is never replaced: the proxy refuses to start and says
/// why.
#[test]
fn listen_unix_refuses_a_path_that_is_not_a_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("precious.txt");
    std::fs::write(&path, "data").expect("write");
    let (code, out, err) = common::cli::Cli::new(["serve", "--listen", "127.0.0.1:0"])
        .arg("--listen-unix")
        .arg(&path)
        .arg("--backend")
        .arg(mariadb().addr().to_string())
        .run();
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("is not a socket"), "{out}{err}");
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "data");
}
