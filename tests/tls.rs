//! TLS on both legs: the proxy terminates TLS from clients (`--tls-cert/--tls-key`) and
//! speaks TLS to the backend (`--backend-tls`), each leg on its own, against a MariaDB
//! that has TLS on. Clients: the `mariadb` CLI, PyMySQL, mysql_async (plain), and a raw
//! client that sends its TLS ClientHello in the same segment as its SSLRequest.

mod common;

use std::io::Read;
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::cli::{mariadb_client, run_limited, Ran as Out};
use common::rawclient::Greeting;
use common::{mariadb_tls, MariaDb, Proxy, TestCerts, ED_PASSWORD, ED_USER, PASSWORD, USER};
use mysql_async::prelude::Queryable;

const CLIENT_SSL: u32 = 1 << 11;
/// A user the backend only accepts over TLS.
const SSL_USER: &str = "hs_tls_only";
const SSL_PASSWORD: &str = "tls-pw";

fn server() -> &'static MariaDb {
    let db = mariadb_tls();
    static USERS: std::sync::Once = std::sync::Once::new();
    USERS.call_once(|| {
        db.exec(&format!(
            "CREATE USER IF NOT EXISTS '{SSL_USER}'@'%' IDENTIFIED BY '{SSL_PASSWORD}' REQUIRE SSL;
             GRANT SELECT ON *.* TO '{SSL_USER}'@'%';"
        ))
    });
    db
}

fn certs() -> &'static TestCerts {
    server().certs().expect("TLS server has certificates")
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A proxy in front of the TLS server with extra flags.
fn proxy(args: &[String]) -> Proxy {
    let mut b = Proxy::builder().backend(server().addr());
    for a in args {
        b = b.arg(a);
    }
    b.start()
}

fn client_tls_args() -> Vec<String> {
    let c = certs();
    vec![
        "--tls-cert".into(),
        path(&c.cert),
        "--tls-key".into(),
        path(&c.key),
    ]
}

fn backend_tls_args(mode: &str, ca: &Path) -> Vec<String> {
    vec![
        "--backend-tls".into(),
        mode.into(),
        "--backend-tls-ca".into(),
        path(ca),
    ]
}

fn concat(parts: &[Vec<String>]) -> Vec<String> {
    parts.concat()
}

/// Runs a command, failing the test if it takes longer than `limit` (a hang).
fn run(cmd: &mut Command, limit: Duration) -> Out {
    run_limited(cmd, None, limit)
}

/// The `mariadb` CLI as `user` against `port`, batch mode, running `sql`.
fn cli(port: u16, user: &str, password: &str, args: &[&str], sql: &str) -> Out {
    let batch = ["--connect-timeout=10", "--batch", "--skip-column-names"];
    let all: Vec<&str> = batch
        .iter()
        .chain(args)
        .copied()
        .chain(["-e", sql])
        .collect();
    mariadb_client(port, user, password, &all, None)
}

const STATUS_SQL: &str =
    "SHOW SESSION STATUS LIKE 'Ssl_cipher'; SELECT CONCAT('user=', CURRENT_USER());\nstatus";

/// The backend's view (`Ssl_cipher` of the session) and the client's own view (the
/// CLI's `status`: "Cipher in use is …" or "Not in use").
struct TlsView {
    backend_cipher: String,
    client_cipher: Option<String>,
}

fn tls_view(out: &Out) -> TlsView {
    assert_eq!(out.code, Some(0), "{out:?}");
    let backend_cipher = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Ssl_cipher"))
        .unwrap_or_else(|| panic!("no Ssl_cipher row: {out:?}"))
        .trim()
        .to_string();
    let ssl_line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("SSL:"))
        .unwrap_or_else(|| panic!("no SSL: line in status: {out:?}"));
    let client_cipher = ssl_line
        .split("Cipher in use is ")
        .nth(1)
        .map(|s| s.trim().to_string());
    TlsView {
        backend_cipher,
        client_cipher,
    }
}

fn raw_greeting(addr: std::net::SocketAddr) -> Greeting {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).unwrap();
    let len = head[0] as usize | (head[1] as usize) << 8 | (head[2] as usize) << 16;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).unwrap();
    Greeting::parse(&payload).expect("a greeting")
}

async fn plain_conn(
    addr: std::net::SocketAddr,
    user: &str,
    pw: &str,
) -> mysql_async::Result<mysql_async::Conn> {
    let url = format!("mysql://{user}:{pw}@{addr}/?prefer_socket=false");
    tokio::time::timeout(
        Duration::from_secs(15),
        mysql_async::Conn::from_url(url.as_str()),
    )
    .await
    .expect("connecting must not hang")
}

fn server_error(e: mysql_async::Error) -> (u16, String) {
    match e {
        mysql_async::Error::Server(s) => (s.code, s.message),
        other => panic!("expected a server error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------

#[test]
fn mariadb_cli_with_tls_on_both_legs() {
    let c = certs();
    let p = proxy(&concat(&[
        client_tls_args(),
        backend_tls_args("required", &c.ca),
    ]));
    // Verifying the proxy's certificate against the CA.
    let ca = format!("--ssl-ca={}", path(&c.ca));
    let out = cli(
        p.port(),
        USER,
        PASSWORD,
        &[&ca, "--ssl-verify-server-cert"],
        STATUS_SQL,
    );
    let v = tls_view(&out);
    assert!(!v.backend_cipher.is_empty(), "backend sees no TLS: {out:?}");
    assert!(v.client_cipher.is_some(), "client sees no TLS: {out:?}");
    assert!(out.stdout.contains(&format!("user={USER}@%")), "{out:?}");
    // Without verification.
    let out = cli(
        p.port(),
        USER,
        PASSWORD,
        &["--ssl", "--skip-ssl-verify-server-cert"],
        STATUS_SQL,
    );
    let v = tls_view(&out);
    assert!(
        !v.backend_cipher.is_empty() && v.client_cipher.is_some(),
        "{out:?}"
    );
    // ed25519 (an auth switch round trip) over TLS on both legs.
    let out = cli(p.port(), ED_USER, ED_PASSWORD, &["--ssl"], STATUS_SQL);
    assert!(!tls_view(&out).backend_cipher.is_empty(), "{out:?}");
    // A client that trusts another CA refuses the proxy's certificate.
    let wrong = format!("--ssl-ca={}", path(&c.other_ca));
    let out = cli(
        p.port(),
        USER,
        PASSWORD,
        &[&wrong, "--ssl-verify-server-cert"],
        "SELECT 1",
    );
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("2026"), "{out:?}");
    // A session with some real work over TLS: a result set larger than one TLS record.
    let out = cli(
        p.port(),
        USER,
        PASSWORD,
        &["--ssl", "--database=heatsink_test"],
        "SELECT COUNT(*), SUM(LENGTH(x)) FROM (SELECT REPEAT('x', 100000) AS x FROM seq_1_to_50) t; SELECT LENGTH(REPEAT('y', 300000))",
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("50\t5000000"), "{out:?}");
    assert!(out.stdout.contains("300000"), "{out:?}");
}

#[test]
fn each_leg_is_upgraded_on_its_own() {
    let c = certs();
    // TLS from the client only: the backend sees a plain connection.
    let p = proxy(&client_tls_args());
    let out = cli(p.port(), USER, PASSWORD, &["--ssl"], STATUS_SQL);
    let v = tls_view(&out);
    assert!(v.client_cipher.is_some(), "{out:?}");
    assert_eq!(v.backend_cipher, "", "{out:?}");
    let out = cli(p.port(), ED_USER, ED_PASSWORD, &["--ssl"], STATUS_SQL);
    assert!(tls_view(&out).client_cipher.is_some(), "{out:?}");
    drop(p);

    // TLS to the backend only: plain clients, encrypted backend connection.
    let p = proxy(&backend_tls_args("preferred", &c.ca));
    let g = raw_greeting(p.addr());
    assert_eq!(
        g.capabilities & CLIENT_SSL,
        0,
        "proxy without a certificate offers TLS"
    );
    let out = cli(p.port(), ED_USER, ED_PASSWORD, &[], STATUS_SQL);
    let v = tls_view(&out);
    assert!(v.client_cipher.is_none(), "{out:?}");
    assert!(!v.backend_cipher.is_empty(), "{out:?}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut conn = plain_conn(p.addr(), USER, PASSWORD).await.unwrap();
        let row: Option<(String, String)> = conn
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_version'")
            .await
            .unwrap();
        let version = row.unwrap().1;
        assert!(version.starts_with("TLSv1."), "{version}");
        // COM_CHANGE_USER after a shifted handshake: sequence ids are no longer shifted.
        conn.change_user(
            mysql_async::ChangeUserOpts::default()
                .with_user(Some(USER.to_string()))
                .with_pass(Some(PASSWORD.to_string())),
        )
        .await
        .unwrap();
        let one: Option<u32> = conn.query_first("SELECT 1").await.unwrap();
        assert_eq!(one, Some(1));
        conn.disconnect().await.unwrap();
    });
}

#[test]
fn without_a_certificate_tls_is_not_offered() {
    let p = proxy(&[]);
    let g = raw_greeting(p.addr());
    assert_eq!(g.capabilities & CLIENT_SSL, 0);
    // The backend itself offers TLS.
    assert_ne!(raw_greeting(server().addr()).capabilities & CLIENT_SSL, 0);
    // The CLI's default (--ssl without verification) falls back to plain text.
    let out = cli(p.port(), USER, PASSWORD, &["--ssl"], STATUS_SQL);
    let v = tls_view(&out);
    assert!(v.client_cipher.is_none(), "{out:?}");
    // Insisting on a verified TLS connection fails cleanly, with the client's error.
    let ca = format!("--ssl-ca={}", path(&certs().ca));
    let out = cli(
        p.port(),
        USER,
        PASSWORD,
        &[&ca, "--ssl-verify-server-cert"],
        "SELECT 1",
    );
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("ERROR 2026"), "{out:?}");
}

#[test]
fn pymysql_with_a_verified_tls_connection() {
    let c = certs();
    let p = proxy(&concat(&[
        client_tls_args(),
        backend_tls_args("required", &c.ca),
    ]));
    let script = r#"
import sys, pymysql
conn = pymysql.connect(host="127.0.0.1", port=int(sys.argv[1]), user=sys.argv[2],
                       password=sys.argv[3], ssl={"ca": sys.argv[4]}, connect_timeout=10)
cur = conn.cursor()
cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
print("backend", cur.fetchone()[1])
print("client", conn._sock.version())
cur.execute("SELECT %s, %s", ("it's", 42))
print("row", cur.fetchone())
conn.close()
"#;
    for (user, pw) in [(USER, PASSWORD), (SSL_USER, SSL_PASSWORD)] {
        let out = run(
            Command::new("python3")
                .arg("-c")
                .arg(script)
                .arg(p.port().to_string())
                .arg(user)
                .arg(pw)
                .arg(path(&c.ca)),
            Duration::from_secs(30),
        );
        assert_eq!(out.code, Some(0), "{out:?}");
        let backend = out.stdout.lines().find_map(|l| l.strip_prefix("backend "));
        assert!(backend.is_some_and(|b| !b.trim().is_empty()), "{out:?}");
        assert!(out.stdout.contains("client TLSv1."), "{out:?}");
        assert!(out.stdout.contains("row (\"it's\", 42)"), "{out:?}");
    }
}

#[test]
fn require_ssl_users_need_backend_tls() {
    let c = certs();
    let p = proxy(&concat(&[
        client_tls_args(),
        backend_tls_args("required", &c.ca),
    ]));
    let out = cli(p.port(), SSL_USER, SSL_PASSWORD, &["--ssl"], STATUS_SQL);
    let v = tls_view(&out);
    assert!(
        !v.backend_cipher.is_empty() && v.client_cipher.is_some(),
        "{out:?}"
    );
    drop(p);
    // Client TLS alone: the backend sees a plain connection and refuses the user itself.
    let p = proxy(&client_tls_args());
    let out = cli(p.port(), SSL_USER, SSL_PASSWORD, &["--ssl"], "SELECT 1");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("ERROR 1045"), "{out:?}");
    assert!(out.stderr.contains(SSL_USER), "{out:?}");
}

#[test]
fn tls_required_refuses_plain_clients() {
    let mut args = client_tls_args();
    args.push("--tls-required".into());
    let p = proxy(&args);
    let out = cli(p.port(), USER, PASSWORD, &["--skip-ssl"], "SELECT 1");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("ERROR 3159"), "{out:?}");
    assert!(out.stderr.contains("insecure transport"), "{out:?}");
    let out = cli(p.port(), USER, PASSWORD, &["--ssl"], STATUS_SQL);
    assert!(tls_view(&out).client_cipher.is_some(), "{out:?}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (code, msg) = server_error(
        rt.block_on(plain_conn(p.addr(), USER, PASSWORD))
            .map(|_| ())
            .unwrap_err(),
    );
    assert_eq!(code, 3159, "{msg}");
    assert!(msg.contains("TLS"), "{msg}");
    assert!(p.log_text().contains("tls_required"), "{}", p.log_text());
}

#[test]
fn backend_verification_failure_is_a_mysql_error() {
    let c = certs();
    let p = proxy(&backend_tls_args("required", &c.other_ca));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (code, msg) = server_error(
        rt.block_on(plain_conn(p.addr(), USER, PASSWORD))
            .map(|_| ())
            .unwrap_err(),
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(code, 1429, "{msg}");
    assert!(msg.contains("certificate"), "{msg}");
    // The CLI gets the same error.
    let out = cli(p.port(), USER, PASSWORD, &["--ssl"], "SELECT 1");
    assert!(out.stderr.contains("ERROR 1429"), "{out:?}");
    assert!(out.stderr.contains("UnknownIssuer"), "{out:?}");
    drop(p);

    // The backend's name must match its certificate.
    let mut args = backend_tls_args("required", &c.ca);
    args.extend(["--backend-tls-server-name".into(), "db.example".into()]);
    let p = proxy(&args);
    let (code, msg) = server_error(
        rt.block_on(plain_conn(p.addr(), USER, PASSWORD))
            .map(|_| ())
            .unwrap_err(),
    );
    assert_eq!(code, 1429, "{msg}");
    drop(p);

    // --backend-tls-insecure skips verification (and says so in the log).
    let p = proxy(&[
        "--backend-tls".into(),
        "required".into(),
        "--backend-tls-insecure".into(),
    ]);
    rt.block_on(async {
        let mut conn = plain_conn(p.addr(), USER, PASSWORD).await.unwrap();
        let v: Option<(String, String)> = conn
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .await
            .unwrap();
        assert!(!v.unwrap().1.is_empty());
        conn.disconnect().await.unwrap();
    });
    assert!(p.log_text().contains("NOT verified"), "{}", p.log_text());
}

/// A backend that only sends a greeting without CLIENT_SSL, then waits for the
/// connection to close (the thread is left running for the rest of the test binary).
fn fake_plain_backend() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || greet_and_wait(s));
        }
    });
    addr
}

fn greet_and_wait(mut s: std::net::TcpStream) {
    use std::io::Write;
    {
        let mut g = vec![10u8];
        g.extend_from_slice(b"10.11.0-fake\0");
        g.extend_from_slice(&7u32.to_le_bytes());
        g.extend_from_slice(b"abcdefgh\0");
        g.extend_from_slice(&((1u16 << 9) | (1 << 15)).to_le_bytes());
        g.push(45);
        g.extend_from_slice(&2u16.to_le_bytes());
        g.extend_from_slice(&((1u16 << 3) | 1).to_le_bytes());
        g.push(21);
        g.extend_from_slice(&[0; 10]);
        g.extend_from_slice(b"ijklmnopqrst\0mysql_native_password\0");
        let mut p = vec![g.len() as u8, 0, 0, 0];
        p.extend_from_slice(&g);
        let _ = s.write_all(&p);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
}

#[test]
fn backend_without_tls_when_required_is_a_mysql_error() {
    let addr = fake_plain_backend();
    let p = Proxy::builder()
        .backend(addr)
        .arg("--backend-tls")
        .arg("required")
        .arg("--backend-tls-insecure")
        .start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (code, msg) = server_error(
        rt.block_on(plain_conn(p.addr(), USER, PASSWORD))
            .map(|_| ())
            .unwrap_err(),
    );
    assert_eq!(code, 1429, "{msg}");
    assert!(msg.contains("does not offer TLS"), "{msg}");
    // libmariadb flags an ERR before the greeting ("authenticity … cannot be verified")
    // but shows the proxy's code and message.
    let out = cli(p.port(), USER, PASSWORD, &[], "SELECT 1");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("1429 - Unable to connect"), "{out:?}");
    assert!(out.stderr.contains("does not offer TLS"), "{out:?}");
}

/// Sends `prefix` in front of the first write: the SSLRequest and the TLS ClientHello
/// then reach the proxy in one segment.
struct Prefixed {
    inner: tokio::net::TcpStream,
    prefix: Option<Vec<u8>>,
    /// Prefix plus the first write, while being sent; and the first write's length.
    pending: Option<(Vec<u8>, usize)>,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(mut all) = self.prefix.take() {
            all.extend_from_slice(buf);
            self.pending = Some((all, buf.len()));
        }
        let this = &mut *self;
        if let Some((all, claimed)) = &mut this.pending {
            while !all.is_empty() {
                match Pin::new(&mut this.inner).poll_write(cx, all) {
                    Poll::Ready(Ok(n)) => {
                        all.drain(..n);
                    }
                    other => return other,
                }
            }
            let n = *claimed;
            this.pending = None;
            return Poll::Ready(Ok(n));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn read_packet<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> (u8, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.unwrap();
    let len = head[0] as usize | (head[1] as usize) << 8 | (head[2] as usize) << 16;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    (head[3], payload)
}

fn frame(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    v.push(seq);
    v.extend_from_slice(payload);
    v
}

#[test]
fn client_hello_in_the_same_segment_as_the_ssl_request() {
    use tokio::io::AsyncWriteExt;
    use tokio_rustls::rustls;
    let c = certs();
    let p = proxy(&concat(&[
        client_tls_args(),
        backend_tls_args("required", &c.ca),
    ]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tcp = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
        let (seq, payload) = read_packet(&mut tcp).await;
        assert_eq!(seq, 0);
        let g = Greeting::parse(&payload).unwrap();
        assert_ne!(g.capabilities & CLIENT_SSL, 0);
        let caps: u32 = 1 | (1 << 9) | CLIENT_SSL | (1 << 13) | (1 << 15) | (1 << 19);
        let mut head = caps.to_le_bytes().to_vec();
        head.extend_from_slice(&(16u32 << 20).to_le_bytes());
        head.push(45);
        head.extend_from_slice(&[0; 23]);
        let stream = Prefixed {
            inner: tcp,
            prefix: Some(frame(1, &head)),
            pending: None,
        };
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&c.ca).unwrap();
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .expect("TLS handshake with the proxy");
        let auth = mysql_common::auth::plugins::mysql_native_password::scramble_native(
            &g.scramble,
            PASSWORD.as_bytes(),
        )
        .unwrap();
        let mut hello = head.clone();
        hello.extend_from_slice(USER.as_bytes());
        hello.push(0);
        hello.push(auth.len() as u8);
        hello.extend_from_slice(&auth);
        hello.extend_from_slice(b"mysql_native_password\0");
        tls.write_all(&frame(2, &hello)).await.unwrap();
        let (seq, ok) = read_packet(&mut tls).await;
        assert_eq!((seq, ok[0]), (3, 0x00), "{ok:?}");
        let mut query = vec![0x03];
        query.extend_from_slice(b"SELECT 6*7");
        tls.write_all(&frame(0, &query)).await.unwrap();
        let mut found = false;
        for _ in 0..5 {
            let (_, p) = read_packet(&mut tls).await;
            if p == b"\x0242" {
                found = true;
                break;
            }
        }
        assert!(found, "no row 42");
    });
}

#[test]
fn configuration_errors_are_clear() {
    let c = certs();
    let serve = |args: &[&str]| {
        run(
            Command::new(env!("CARGO_BIN_EXE_heatsink"))
                .arg("serve")
                .arg("--listen")
                .arg("127.0.0.1:0")
                .args(args),
            Duration::from_secs(20),
        )
    };
    let cert = path(&c.cert);
    let out = serve(&["--tls-cert", &cert]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("tls_cert and tls_key must be given together"),
        "{out:?}"
    );
    let out = serve(&[
        "--tls-cert",
        "/nonexistent/cert.pem",
        "--tls-key",
        "/nonexistent/key.pem",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("/nonexistent/cert.pem"), "{out:?}");
    // A key that does not belong to the certificate.
    let other_key = path(&c.other_ca.with_file_name("other-ca-key.pem"));
    let out = serve(&["--tls-cert", &cert, "--tls-key", &other_key]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("TLS"), "{out:?}");
    // The key file given as the certificate: no certificate in it.
    let key = path(&c.key);
    let out = serve(&["--tls-cert", &key, "--tls-key", &key]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("no PEM certificate"), "{out:?}");
    let out = serve(&["--backend-tls", "required"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("backend_tls_ca"), "{out:?}");
    let out = serve(&["--tls-required"]);
    assert_eq!(out.code, Some(1), "{out:?}");
}
