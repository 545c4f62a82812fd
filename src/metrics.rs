//! The `--metrics` HTTP endpoint: `/metrics` (Prometheus text format), `/healthz`
//! (the process is serving) and `/readyz` (the backend accepts TCP connections).
//!
//! A deliberately tiny HTTP/1.1 responder on tokio: one request per connection,
//! GET only, no dependencies.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::error::{Error, Result, Source};
use crate::relay::Shared;

/// Renders every counter in Prometheus text exposition format.
pub fn render(shared: &Shared) -> String {
    let s = &shared.stats;
    let mut out = String::with_capacity(1024);
    let mut counter = |name: &str, help: &str, kind: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    counter(
        "heatsink_connections_total",
        "Client connections accepted.",
        "counter",
        s.connections_total.load(Relaxed),
    );
    counter(
        "heatsink_connections_active",
        "Client connections open now.",
        "gauge",
        s.connections_active.load(Relaxed),
    );
    counter(
        "heatsink_connections_refused_total",
        "Client connections refused by max_connections.",
        "counter",
        s.connections_refused.load(Relaxed),
    );
    counter(
        "heatsink_backend_connect_errors_total",
        "Backend connections that could not be opened.",
        "counter",
        s.backend_connect_errors.load(Relaxed),
    );
    counter(
        "heatsink_coalesced_writes_total",
        "Merged counter writes (group commit) holding more than one increment.",
        "counter",
        s.coalesced_writes.load(Relaxed),
    );
    counter(
        "heatsink_coalesced_increments_total",
        "Increments written as part of a merged write.",
        "counter",
        s.coalesced_increments.load(Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP heatsink_statements_total Statements by outcome.\n# TYPE heatsink_statements_total counter"
    );
    for (outcome, v) in [
        ("passthrough", s.passthrough.load(Relaxed)),
        ("rewritten", s.rewritten.load(Relaxed)),
        ("rejected", s.rejected.load(Relaxed)),
    ] {
        let _ = writeln!(
            out,
            "heatsink_statements_total{{outcome=\"{outcome}\"}} {v}"
        );
    }
    out
}

/// Serves the endpoint on `listener` forever.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    if let Ok(a) = listener.local_addr() {
        info!("metrics on http://{a}/metrics");
    }
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(sock, &shared).await {
                debug!(error = %e, "metrics request failed");
            }
        });
    }
}

async fn handle(mut sock: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut buf = vec![0u8; 2048];
    let mut n = 0;
    // Read the request head (bounded in size and time).
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while n < buf.len() {
            let m = sock.read(&mut buf[n..]).await?;
            if m == 0 {
                break;
            }
            n += m;
            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", render(shared)),
        ("GET", "/healthz") => ("200 OK", "ok\n".to_string()),
        ("GET", "/readyz") => {
            let backend = shared.config.backend.clone();
            match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(backend)).await {
                Ok(Ok(_)) => ("200 OK", "ready\n".to_string()),
                _ => (
                    "503 Service Unavailable",
                    "backend unreachable\n".to_string(),
                ),
            }
        }
        ("GET", _) => ("404 Not Found", "not found\n".to_string()),
        _ => ("405 Method Not Allowed", "GET only\n".to_string()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(resp.as_bytes()).await?;
    sock.shutdown().await
}

/// `heatsink health --url http://host:port/healthz`: exit 0 when the endpoint answers
/// 200 within two seconds (used by container health checks).
pub async fn probe(url: &str) -> Result<()> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/healthz"),
    };
    let fail = |m: String| Error::new(Source::Internal, m);
    let io = async {
        let mut s = TcpStream::connect(host).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .map_err(|_| fail(format!("{url}: timed out")))?
        .map_err(|e| Error::with_cause(Source::Internal, url.to_string(), e))?;
    let line = String::from_utf8_lossy(&resp);
    if line.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(fail(format!(
            "{url}: {}",
            line.lines().next().unwrap_or("no answer")
        )))
    }
}
