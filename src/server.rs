//! The accept loop: connection limit, one task per client, graceful shutdown. Clients
//! come over TCP, and over a Unix socket when one is configured (`listen_unix`: a
//! sidecar's application on the same host skips the TCP stack).
//!
//! Shutdown (SIGINT/SIGTERM or the future passed to [`run`]): stop accepting, tell
//! every session through a watch channel, let in-flight statements finish (idle
//! sessions close at once), and give up after the drain timeout.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::error::{Error, Result, Source};
use crate::relay::{serve_client, Shared};
use crate::tls::Stream;
use crate::wire::io::frame_into;
use crate::wire::packets::{err_of, errors};

/// Binds the listen address.
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::with_cause(Source::Internal, format!("binding {addr}"), e))
}

/// Where a client connected from, for logs and the admin port's session list.
#[derive(Debug, Clone)]
pub enum Peer {
    /// A TCP client's address.
    Tcp(SocketAddr),
    /// A client on the Unix socket (on this host).
    Unix,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Tcp(a) => a.fmt(f),
            Peer::Unix => f.write_str("unix socket"),
        }
    }
}

/// Binds the Unix socket clients may connect to. A file left at `path` by a proxy
/// that is gone is replaced; a socket another process still answers on is not.
pub async fn bind_unix(path: &std::path::Path) -> Result<UnixListener> {
    let shown = path.display();
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(Error::new(
                Source::Internal,
                format!("binding {shown}: another process listens on this socket"),
            ));
        }
        let is_socket = {
            use std::os::unix::fs::FileTypeExt;
            std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
        };
        if !is_socket {
            return Err(Error::new(
                Source::Internal,
                format!("binding {shown}: the path exists and is not a socket"),
            ));
        }
        std::fs::remove_file(path).map_err(|e| {
            Error::with_cause(
                Source::Internal,
                format!("removing stale socket {shown}"),
                e,
            )
        })?;
    }
    UnixListener::bind(path)
        .map_err(|e| Error::with_cause(Source::Internal, format!("binding {shown}"), e))
}

/// The next client of an optional Unix listener (pending forever without one).
async fn accept_unix(listener: Option<&UnixListener>) -> std::io::Result<Stream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        None => std::future::pending().await,
    }
}

/// Serves clients from `listener` (and `unix`, when given) until `shutdown`
/// resolves, then drains.
pub async fn run(
    listener: TcpListener,
    unix: Option<UnixListener>,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let limit = Arc::new(Semaphore::new(shared.config.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sessions = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok((socket, peer)) => {
                        let _ = socket.set_nodelay(true);
                        (Stream::Plain(socket), Peer::Tcp(peer))
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off briefly.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                start(&mut sessions, &limit, &shared, &stop_rx, socket, peer);
            }
            accepted = accept_unix(unix.as_ref()) => {
                match accepted {
                    Ok(socket) => start(&mut sessions, &limit, &shared, &stop_rx, socket, Peer::Unix),
                    Err(e) => {
                        warn!(error = %e, "accept failed (unix socket)");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }
    drop(listener);
    if let Some(path) = unix
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()))
    {
        drop(unix);
        let _ = std::fs::remove_file(path);
    }
    let open = sessions.len();
    info!(open, "shutting down: draining sessions");
    let _ = stop_tx.send(true);
    let drain = shared.config.drain_timeout;
    let drained = tokio::time::timeout(drain, async {
        while sessions.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            left = sessions.len(),
            "drain timeout: closing remaining sessions"
        );
        sessions.shutdown().await;
    }
    info!("stopped");
    Ok(())
}

/// Starts a session for an accepted client, or refuses it when the connection limit
/// is reached.
fn start(
    sessions: &mut JoinSet<()>,
    limit: &Arc<Semaphore>,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
    socket: Stream,
    peer: Peer,
) {
    shared.stats.connections_total.fetch_add(1, Relaxed);
    let Ok(permit) = limit.clone().try_acquire_owned() else {
        shared.stats.connections_refused.fetch_add(1, Relaxed);
        tokio::spawn(refuse(socket, peer));
        return;
    };
    let shared = shared.clone();
    let stop = stop.clone();
    sessions.spawn(async move {
        shared.stats.connections_active.fetch_add(1, Relaxed);
        serve_client(socket, peer, shared.clone(), stop).await;
        shared.stats.connections_active.fetch_sub(1, Relaxed);
        drop(permit);
    });
}

/// Answers a connection over the limit with "Too many connections", as MySQL does
/// (an ERR packet instead of the greeting).
async fn refuse(mut socket: Stream, peer: Peer) {
    use tokio::io::AsyncWriteExt;
    warn!(%peer, "connection refused: too many connections");
    let mut out = bytes::BytesMut::new();
    frame_into(
        &mut out,
        0,
        &err_of(errors::TOO_MANY_CONNECTIONS, "Too many connections"),
    );
    let _ = socket.write_all(&out).await;
    let _ = socket.shutdown().await;
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    info!("shutdown signal received");
}
