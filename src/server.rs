//! The accept loop: connection limit, one task per client, graceful shutdown. Clients
//! come over TCP, and over a Unix socket when one is configured (`listen_unix`: a
//! sidecar's application on the same host skips the TCP stack).
//!
//! Threads ([`RuntimeMode`], the one place that chooses them): `shared` runs every
//! session on one multi-threaded tokio runtime (work stealing moves a session between
//! its threads), with one accept loop. `per-core` runs N threads, each a single-threaded
//! runtime with an accept loop of its own: its own TCP listener bound with
//! `SO_REUSEPORT` to the same address (the kernel spreads new connections over them),
//! and its own handle on the one Unix listener (whichever thread is awake takes the
//! connection). A session, its backend connection and its replies stay on the thread
//! that accepted it. Everything else (the admin port, `/metrics`, reloads, health
//! checks) runs on a control thread; the state sessions share (rules, plan cache,
//! group-commit queues, digests, metrics) is the same in both modes.
//!
//! Shutdown (SIGINT/SIGTERM or the future passed to [`run`]): stop accepting, tell
//! every session through a watch channel, let in-flight statements finish (idle
//! sessions close at once), and give up after the drain timeout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::config::{Config, RuntimeMode, SchedPolicy};
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

/// The threads that run sessions: `runtime_threads`, or one per available core.
pub fn threads(config: &Config) -> usize {
    config.runtime_threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// The runtime `serve` runs on. Shared: the multi-threaded runtime that runs every
/// session. Per-core: the control runtime (one worker thread: admin port, metrics,
/// reloads, health checks); [`run`] starts the session threads.
///
/// First the calling thread takes `sched_policy`; every thread started after it (the
/// runtimes' workers, the blocking pool, per-core threads) inherits it.
pub fn runtime(config: &Config) -> Result<tokio::runtime::Runtime> {
    set_sched_policy(config.sched_policy);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    match config.runtime {
        RuntimeMode::Shared => {
            builder.thread_name("heatsink");
            if let Some(n) = config.runtime_threads {
                builder.worker_threads(n);
            }
        }
        RuntimeMode::PerCore => {
            builder.thread_name("heatsink-control").worker_threads(1);
        }
    }
    builder
        .enable_all()
        .thread_stack_size(crate::WORKER_STACK_BYTES)
        .build()
        .map_err(|e| Error::with_cause(Source::Internal, "starting runtime", e))
}

/// Sets the calling thread's scheduling policy (Linux: `sched_setscheduler` acts on
/// the calling thread, and threads it creates afterwards inherit the policy; elsewhere
/// nothing changes).
///
/// What `batch` is for: a relay is woken by every packet a client or the server sends,
/// and under `SCHED_OTHER` the woken proxy thread preempts the sender, which then runs
/// again only to block waiting for its answer: two context switches where one
/// suffices. Under `SCHED_BATCH` the woken thread waits until the sender blocks (or
/// its slice ends), which is also why it is not the default: next to CPU-bound work it
/// waits out that work's slice. Measured in docs/design.md ("Cost per client
/// statement"). Where the call is refused (a seccomp profile), a warning says so and
/// the threads keep their policy.
pub fn set_sched_policy(policy: SchedPolicy) {
    match policy {
        SchedPolicy::Inherit => {}
        #[cfg(not(target_os = "linux"))]
        SchedPolicy::Batch => {}
        #[cfg(target_os = "linux")]
        SchedPolicy::Batch => {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param for the call's duration; pid 0 is
            // the calling thread.
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
            if rc != 0 {
                // Only a cost, never a meaning: serve on under the policy it has.
                warn!(
                    error = %std::io::Error::last_os_error(),
                    "could not set the threads' scheduling policy to SCHED_BATCH; they keep the one heatsink was started with (--sched-policy inherit says so without trying)"
                );
            }
        }
    }
}

/// The client listeners, bound before the proxy says it listens: one TCP listener per
/// accept loop, and the Unix socket when configured.
pub struct Listeners {
    tcp: Vec<std::net::TcpListener>,
    unix: Option<(std::os::unix::net::UnixListener, PathBuf)>,
}

impl Listeners {
    /// Binds `listen` (per-core: once per thread, `SO_REUSEPORT`) and `listen_unix`.
    pub async fn bind(config: &Config) -> Result<Listeners> {
        let tcp = match config.runtime {
            RuntimeMode::Shared => {
                let l = bind(&config.listen).await?;
                vec![l.into_std().map_err(|e| {
                    Error::with_cause(Source::Internal, format!("binding {}", config.listen), e)
                })?]
            }
            RuntimeMode::PerCore => bind_reuseport(&config.listen, threads(config)).await?,
        };
        let unix = match &config.listen_unix {
            Some(path) => {
                let l = bind_unix(path).await?.into_std().map_err(|e| {
                    Error::with_cause(Source::Internal, format!("binding {}", path.display()), e)
                })?;
                Some((l, path.clone()))
            }
            None => None,
        };
        Ok(Listeners { tcp, unix })
    }

    /// The TCP address clients connect to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        let err = |e| Error::with_cause(Source::Internal, "reading listen address", e);
        match self.tcp.first() {
            Some(l) => l.local_addr().map_err(err),
            None => Err(Error::new(Source::Internal, "no listener bound")),
        }
    }
}

/// `count` listeners on `addr`, all bound with `SO_REUSEPORT` to the address the
/// first one got (so a port 0 is chosen once).
async fn bind_reuseport(addr: &str, count: usize) -> Result<Vec<std::net::TcpListener>> {
    let err = |e| Error::with_cause(Source::Internal, format!("binding {addr}"), e);
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await.map_err(err)? {
        let first = match reuseport_listener(a) {
            Ok(l) => l,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let bound = first.local_addr().map_err(err)?;
        let mut all = vec![first];
        for _ in 1..count {
            all.push(reuseport_listener(bound).map_err(err)?);
        }
        return Ok(all);
    }
    Err(err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to bind")
    })))
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
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

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The next client of an optional Unix listener (pending forever without one).
async fn accept_unix(listener: Option<&UnixListener>) -> std::io::Result<Stream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        None => std::future::pending().await,
    }
}

/// Serves clients from `listeners` until `shutdown` resolves, then drains: on this
/// runtime (shared), or on one thread per TCP listener (per-core).
pub async fn run(
    listeners: Listeners,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let limit = Arc::new(Semaphore::new(shared.config.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let Listeners { tcp, unix } = listeners;
    let path = unix.as_ref().map(|(_, p)| p.clone());
    let unix = unix.map(|(l, _)| l);
    let stop = async {
        shutdown.await;
        // No new client finds the socket file; the listeners close as their loops stop.
        if let Some(p) = &path {
            let _ = std::fs::remove_file(p);
        }
        let _ = stop_tx.send(true);
    };
    match shared.config.runtime {
        RuntimeMode::Shared => {
            let (tcp, unix) = tokio_listeners(tcp.into_iter().next(), unix.as_ref())?;
            let accept = accept_loop(tcp, unix, shared, limit, stop_rx);
            tokio::join!(stop, accept);
        }
        RuntimeMode::PerCore => {
            let mut threads = Vec::new();
            for (i, tcp) in tcp.into_iter().enumerate() {
                let started = accept_thread(i, tcp, unix.as_ref(), &shared, &limit, &stop_rx);
                match started {
                    Ok(done) => threads.push(done),
                    Err(e) => {
                        let _ = stop_tx.send(true);
                        for done in threads {
                            let _ = done.await;
                        }
                        return Err(e);
                    }
                }
            }
            drop(unix);
            stop.await;
            for done in threads {
                // An error here is a thread that ended without saying so (a panic).
                let _ = done.await;
            }
        }
    }
    info!("stopped");
    Ok(())
}

/// The tokio listeners of one accept loop, registered with the current runtime.
fn tokio_listeners(
    tcp: Option<std::net::TcpListener>,
    unix: Option<&std::os::unix::net::UnixListener>,
) -> Result<(TcpListener, Option<UnixListener>)> {
    let err = |e| Error::with_cause(Source::Internal, "registering a listener", e);
    let tcp = tcp.ok_or_else(|| Error::new(Source::Internal, "no listener bound"))?;
    let tcp = TcpListener::from_std(tcp).map_err(err)?;
    let unix = match unix {
        Some(l) => Some(
            l.try_clone()
                .and_then(|l| {
                    l.set_nonblocking(true)?;
                    UnixListener::from_std(l)
                })
                .map_err(err)?,
        ),
        None => None,
    };
    Ok((tcp, unix))
}

/// Starts session thread `i` (per-core): a single-threaded runtime running an accept
/// loop on `tcp` and on a handle of `unix`. The receiver resolves when it has drained.
fn accept_thread(
    i: usize,
    tcp: std::net::TcpListener,
    unix: Option<&std::os::unix::net::UnixListener>,
    shared: &Arc<Shared>,
    limit: &Arc<Semaphore>,
    stop: &watch::Receiver<bool>,
) -> Result<oneshot::Receiver<()>> {
    let err = |e| Error::with_cause(Source::Internal, "starting a session thread", e);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(err)?;
    let (tcp, unix) = {
        let _entered = rt.enter();
        tokio_listeners(Some(tcp), unix)?
    };
    let accept = accept_loop(tcp, unix, shared.clone(), limit.clone(), stop.clone());
    let (done_tx, done_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("heatsink-{i}"))
        .stack_size(crate::WORKER_STACK_BYTES)
        .spawn(move || {
            rt.block_on(accept);
            let _ = done_tx.send(());
        })
        .map_err(err)?;
    Ok(done_rx)
}

/// Accepts clients from `listener` (and `unix`, when given) until `stop` turns
/// true, then drains the sessions it started.
async fn accept_loop(
    listener: TcpListener,
    unix: Option<UnixListener>,
    shared: Arc<Shared>,
    limit: Arc<Semaphore>,
    stop_rx: watch::Receiver<bool>,
) {
    let mut sessions = JoinSet::new();
    let mut stop = stop_rx.clone();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
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
    drop(unix);
    let open = sessions.len();
    info!(open, "shutting down: draining sessions");
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
