//! The accept loop: connection limit, one task per client, graceful shutdown.
//!
//! Shutdown (SIGINT/SIGTERM or the future passed to [`run`]): stop accepting, tell
//! every session through a watch channel, let in-flight statements finish (idle
//! sessions close at once), and give up after the drain timeout.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::error::{Error, Result, Source};
use crate::relay::{serve_client, Shared};
use crate::wire::io::frame_into;
use crate::wire::packets::{err_of, errors};

/// Binds the listen address.
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::with_cause(Source::Internal, format!("binding {addr}"), e))
}

/// Serves clients from `listener` until `shutdown` resolves, then drains.
pub async fn run(
    listener: TcpListener,
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
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: back off briefly.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                shared.stats.connections_total.fetch_add(1, Relaxed);
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    shared.stats.connections_refused.fetch_add(1, Relaxed);
                    tokio::spawn(refuse(socket, peer));
                    continue;
                };
                let shared = shared.clone();
                let stop = stop_rx.clone();
                sessions.spawn(async move {
                    shared.stats.connections_active.fetch_add(1, Relaxed);
                    serve_client(socket, peer, shared.clone(), stop).await;
                    shared.stats.connections_active.fetch_sub(1, Relaxed);
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
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

/// Answers a connection over the limit with "Too many connections", as MySQL does
/// (an ERR packet instead of the greeting).
async fn refuse(mut socket: TcpStream, peer: SocketAddr) {
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
