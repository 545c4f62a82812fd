//! The admin port (`--admin`): the proxy itself answers a few text commands over the
//! MySQL protocol, so any MySQL client can inspect and steer a running proxy.
//!
//! | command | answer |
//! |---|---|
//! | `SHOW RULES` | name, kind, table, mode, file of each rule in force |
//! | `SHOW RULE STATS` | per rule: matched, rewritten, rejected, errors, mean and max rewrite latency (µs) |
//! | `SHOW SESSIONS` | id, client, user, db, backend connection id, state, statements |
//! | `SHOW BACKENDS` | per backend node: address, state (up/down), what the last check found, connections now and since start, errors |
//! | `SHOW REFUSALS` | per refused statement shape, most frequent first: rule, mode (on/shadow), reason, count, first and last seen (UTC), fingerprint, example with literals as `?` ([`crate::refusals`]) |
//! | `SHOW FALLBACKS` | the same for statements forwarded unchanged as a rule's fallback (no mode) |
//! | `RESET REFUSALS`, `RESET FALLBACKS` | OK; the table is emptied (info: how many shapes) |
//! | `SHOW DIGESTS [ORDER BY col [ASC\|DESC]] [LIMIT n]` | query digests of all traffic, one row per digest, default database and user ([`crate::digest`]); default order `sum_time_us DESC` |
//! | `RESET DIGESTS` | OK; the digests are emptied (info: how many rows) |
//! | `RELOAD RULES` | OK, or the error (file:line) that kept the previous rules |
//! | `EXPLAIN REWRITE '<sql>'` | outcome, rule, and the rewritten statements or the reason |
//!
//! Commands are case-insensitive; a trailing `;` is ignored. `USE db` sets the
//! default database `EXPLAIN REWRITE` resolves unqualified table names against.
//! Anything else gets an error listing the commands. So that ordinary clients work,
//! the `SELECT @@var` queries and `SET …` statements that client libraries send on
//! connect are answered (`SET` is accepted and ignored).
//!
//! Authentication is `mysql_native_password` against `admin_user` /
//! `admin_password` from the configuration, with a fresh random scramble per
//! connection. An empty password is accepted only on a loopback address. A refused
//! login gets the server's own answer, ERR 1045 (28000) "Access denied for user
//! 'u'@'ip' (using password: YES)". Failed logins are throttled per client IP
//! ([`LoginThrottle`]): the n-th failure within [`THROTTLE_WINDOW`] is answered after
//! 25 ms × 2^(n−1) (at most 2 s, and at most half the handshake timeout); after
//! [`LOCKOUT_AFTER`] failures the address is refused outright, before the greeting,
//! with ERR 1129 until [`THROTTLE_WINDOW`] has passed since its last failure. A
//! successful login clears the address's record.
//!
//! This module also keeps the [`Registry`] of live client sessions that
//! `SHOW SESSIONS` lists.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use opensrv_mysql::{
    AsyncMysqlIntermediary, AsyncMysqlShim, Column, ColumnFlags, ColumnType, ErrorKind, InitWriter,
    OkResponse, ParamParser, QueryResultWriter, StatementMetaWriter,
};
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::error::{Error, Result, Source};
use crate::refusals::Kind;
use crate::relay::Shared;
use crate::reload::{Reloader, Trigger};
use crate::rewrite::{Decision, RefusalClass, StatementContext};

// ---------------------------------------------------------------------------------------
// Session registry

/// The live client sessions, for `SHOW SESSIONS`. Touched under a lock only when a
/// session starts or ends; a session updates its own entry with relaxed atomics.
#[derive(Debug, Default)]
pub struct Registry {
    /// Next session id (ids start at 1 and are never reused).
    next_id: AtomicU64,
    /// Sessions by id.
    live: Arc<Mutex<BTreeMap<u64, Arc<SessionInfo>>>>,
}

impl Registry {
    /// Adds a session; it is removed when the returned registration is dropped.
    pub fn register(&self, peer: crate::server::Peer) -> Registration {
        let id = self.next_id.fetch_add(1, Relaxed) + 1;
        let info = Arc::new(SessionInfo {
            id,
            peer,
            backend_id: AtomicU32::new(0),
            state: AtomicU8::new(STATE_HANDSHAKE),
            statements: AtomicU64::new(0),
            names: Mutex::new(Names::default()),
        });
        lock(&self.live).insert(id, Arc::clone(&info));
        Registration {
            info,
            live: Arc::clone(&self.live),
        }
    }

    /// The sessions open now, by id.
    pub fn snapshot(&self) -> Vec<Arc<SessionInfo>> {
        lock(&self.live).values().cloned().collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const STATE_HANDSHAKE: u8 = 0;
const STATE_IDLE: u8 = 1;
const STATE_BUSY: u8 = 2;

/// What the admin port shows of one client session.
#[derive(Debug)]
pub struct SessionInfo {
    /// The proxy's session id (not the backend's connection id).
    pub id: u64,
    /// The client's address.
    pub peer: crate::server::Peer,
    /// The backend connection id (what the client sees as CONNECTION_ID()).
    backend_id: AtomicU32,
    /// Handshake, idle (waiting for a command) or busy (running one).
    state: AtomicU8,
    /// COM_QUERY and COM_STMT_EXECUTE commands received.
    statements: AtomicU64,
    /// User and default database (change rarely; read by the admin port).
    names: Mutex<Names>,
}

#[derive(Debug, Default)]
struct Names {
    user: String,
    db: Option<String>,
}

impl SessionInfo {
    /// Records the backend connection id.
    pub fn set_backend_id(&self, id: u32) {
        self.backend_id.store(id, Relaxed);
    }

    /// Records the authenticated (or authenticating) user.
    pub fn set_user(&self, user: &str) {
        lock(&self.names).user = user.to_string();
    }

    /// Records the default database.
    pub fn set_db(&self, db: Option<&str>) {
        let mut n = lock(&self.names);
        if n.db.as_deref() != db {
            n.db = db.map(str::to_string);
        }
    }

    /// Marks the session as running a command (true) or waiting for one (false).
    #[inline]
    pub fn set_busy(&self, busy: bool) {
        self.state
            .store(if busy { STATE_BUSY } else { STATE_IDLE }, Relaxed);
    }

    /// Counts one statement.
    #[inline]
    pub fn count_statement(&self) {
        self.statements.fetch_add(1, Relaxed);
    }

    /// The backend connection id (0 before the greeting).
    pub fn backend_id(&self) -> u32 {
        self.backend_id.load(Relaxed)
    }

    /// `handshake`, `idle` or `busy`.
    pub fn state(&self) -> &'static str {
        match self.state.load(Relaxed) {
            STATE_HANDSHAKE => "handshake",
            STATE_BUSY => "busy",
            _ => "idle",
        }
    }

    /// Statements received so far.
    pub fn statements(&self) -> u64 {
        self.statements.load(Relaxed)
    }

    /// `(user, default database)`.
    pub fn names(&self) -> (String, Option<String>) {
        let n = lock(&self.names);
        (n.user.clone(), n.db.clone())
    }
}

/// A session's entry in the [`Registry`]; dropping it removes the entry, however the
/// session ends (including when its task is aborted).
#[derive(Debug)]
pub struct Registration {
    /// The entry.
    info: Arc<SessionInfo>,
    /// The registry's map, to remove the entry from.
    live: Arc<Mutex<BTreeMap<u64, Arc<SessionInfo>>>>,
}

impl std::ops::Deref for Registration {
    type Target = SessionInfo;
    fn deref(&self) -> &SessionInfo {
        &self.info
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.live).remove(&self.info.id);
    }
}

// ---------------------------------------------------------------------------------------
// Server

/// Binds the admin address and checks the credentials fit it: without a password
/// the admin port must listen on loopback only.
pub async fn bind(shared: &Shared) -> Result<Option<TcpListener>> {
    let Some(addr) = &shared.config.admin else {
        return Ok(None);
    };
    if shared.config.admin_password.0.is_empty() {
        // Checked before binding, so a refused configuration never listens.
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr.as_str())
            .await
            .map_err(|e| {
                Error::with_cause(
                    Source::Internal,
                    format!("resolving admin address {addr}"),
                    e,
                )
            })?
            .collect();
        if resolved.is_empty() || resolved.iter().any(|a| !a.ip().is_loopback()) {
            return Err(Error::new(
                Source::Internal,
                format!(
                    "invalid configuration: the admin port {addr} is not on a loopback address, so it needs an admin_password (--admin-password, HEATSINK_ADMIN_PASSWORD or admin_password in the config file)"
                ),
            ));
        }
        warn!(
            %addr,
            user = %shared.config.admin_user,
            "the admin port has no password (allowed on loopback only); set admin_password"
        );
    }
    crate::server::bind(addr).await.map(Some)
}

// ---------------------------------------------------------------------------------------
// Login throttling

/// Failures from one address within this window count together; an address locked
/// out stays so until this long after its last failure.
pub const THROTTLE_WINDOW: Duration = Duration::from_secs(300);
/// Failed logins (within [`THROTTLE_WINDOW`]) after which an address is locked out.
pub const LOCKOUT_AFTER: u32 = 6;
/// Delay before answering the first failed login; doubled for each further one.
const FIRST_DELAY: Duration = Duration::from_millis(25);
/// Longest delay before answering a failed login.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// Addresses tracked at most; beyond, the one with the oldest failure is forgotten.
const TRACKED_ADDRESSES: usize = 10_000;

/// Failed admin logins per client IP address.
#[derive(Debug, Default)]
pub struct LoginThrottle {
    /// Per address: failures in the current window, and when the last one was.
    by_ip: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl LoginThrottle {
    /// The time left of `ip`'s lockout, if it is locked out at `now`.
    pub fn locked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let map = lock(&self.by_ip);
        let &(count, last) = map.get(&ip)?;
        let left = THROTTLE_WINDOW.checked_sub(now.saturating_duration_since(last))?;
        (count >= LOCKOUT_AFTER && !left.is_zero()).then_some(left)
    }

    /// Records a failed login from `ip` at `now`; returns how long to wait before
    /// answering it.
    pub fn failed(&self, ip: IpAddr, now: Instant) -> Duration {
        let mut map = lock(&self.by_ip);
        if map.len() >= TRACKED_ADDRESSES && !map.contains_key(&ip) {
            map.retain(|_, (_, last)| now.saturating_duration_since(*last) < THROTTLE_WINDOW);
            if map.len() >= TRACKED_ADDRESSES {
                let oldest = map
                    .iter()
                    .min_by_key(|(_, (_, last))| *last)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    map.remove(&k);
                }
            }
        }
        let entry = map.entry(ip).or_insert((0, now));
        if now.saturating_duration_since(entry.1) >= THROTTLE_WINDOW {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        let doublings = entry.0.saturating_sub(1).min(16);
        FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
    }

    /// Forgets `ip`'s failures (it logged in).
    pub fn succeeded(&self, ip: IpAddr) {
        lock(&self.by_ip).remove(&ip);
    }
}

/// ER_HOST_IS_BLOCKED's code and SQLSTATE, for a locked-out address.
const HOST_BLOCKED: (u16, &[u8; 5]) = (1129, b"HY000");

fn blocked_message(ip: IpAddr, left: Duration) -> String {
    format!(
        "Host '{ip}' is blocked because of many failed admin logins; retry in {} s",
        left.as_secs().max(1)
    )
}

/// The admin connection's output. opensrv answers a refused login with its own
/// error (1698); when [`AdminShim::authenticate`] refuses, it leaves the server's
/// answer in `refusal`, and the next packet opensrv writes (its error) is replaced
/// by that one, with the same sequence id.
struct LoginErrors<W> {
    inner: W,
    /// The ERR payload to send instead of opensrv's next packet.
    refusal: Arc<Mutex<Option<Vec<u8>>>>,
    /// The framed replacement, and how much of it is written.
    out: Vec<u8>,
    written: usize,
    /// The replacement was made: whatever opensrv writes after it is dropped (the
    /// connection ends after a refused login).
    swallow: bool,
}

impl<W: AsyncWrite + Unpin> LoginErrors<W> {
    fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.out.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.out[self.written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for LoginErrors<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if !this.swallow {
            if let Some(payload) = lock(&this.refusal).take() {
                // The packet header (opensrv writes it first) carries the sequence id.
                let seq = buf.get(3).copied().unwrap_or(2);
                let mut framed = bytes::BytesMut::new();
                crate::wire::io::frame_into(&mut framed, seq, &payload);
                this.out = framed.to_vec();
                this.swallow = true;
            }
        }
        if this.swallow {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match this.poll_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match this.poll_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

/// Serves admin connections on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, reloader: Arc<Reloader>) {
    if let Ok(a) = listener.local_addr() {
        info!("admin port on {a}");
    }
    let throttle = Arc::new(LoginThrottle::default());
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Some(left) = throttle.locked(peer.ip(), Instant::now()) {
            // Refused before the greeting, as the server refuses a blocked host.
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut sock = sock;
                let msg = blocked_message(peer.ip(), left);
                let mut out = bytes::BytesMut::new();
                crate::wire::io::frame_into(
                    &mut out,
                    0,
                    &crate::wire::packets::err_of(HOST_BLOCKED, &msg),
                );
                let _ = sock.write_all(&out).await;
                let _ = sock.shutdown().await;
                debug!(%peer, "admin connection refused: locked out after failed logins");
            });
            continue;
        }
        let shim = AdminShim::new(shared.clone(), reloader.clone(), peer, throttle.clone());
        tokio::spawn(async move {
            if let Err(e) = run_connection(sock, shim).await {
                debug!(%peer, error = %e, "admin connection ended");
            }
        });
    }
}

async fn run_connection(sock: TcpStream, shim: AdminShim) -> std::io::Result<()> {
    let _ = sock.set_nodelay(true);
    let (r, w) = sock.into_split();
    let r = ClientCaps {
        inner: r,
        head: [0; 8],
        seen: 0,
        caps: Arc::clone(&shim.client_caps),
    };
    let w = LoginErrors {
        inner: w,
        refusal: Arc::clone(&shim.refusal),
        out: Vec::new(),
        written: 0,
        swallow: false,
    };
    let authenticated = Arc::clone(&shim.authenticated);
    let login_limit = shim.shared.config.handshake_timeout;
    let opts = opensrv_mysql::IntermediaryOptions::default();
    let run = AsyncMysqlIntermediary::run_with_options(shim, r, w, &opts);
    tokio::pin!(run);
    // A client gets the handshake timeout to log in, then the connection is closed.
    tokio::select! {
        done = &mut run => return done,
        _ = tokio::time::sleep(login_limit) => {}
    }
    if !authenticated.load(Relaxed) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "admin login timed out",
        ));
    }
    run.await
}

/// One admin connection.
struct AdminShim {
    shared: Arc<Shared>,
    reloader: Arc<Reloader>,
    /// Client address, for logs.
    peer: SocketAddr,
    /// This connection's random scramble.
    salt: [u8; 20],
    /// Set once the password checked out; every command requires it.
    authenticated: Arc<AtomicBool>,
    /// Default database for `EXPLAIN REWRITE` (`USE db`, or the handshake's).
    db: Option<String>,
    /// Failed logins per address, shared by all admin connections.
    throttle: Arc<LoginThrottle>,
    /// The answer to a refused login, for [`LoginErrors`] to send.
    refusal: Arc<Mutex<Option<Vec<u8>>>>,
    /// The capability flags of the client's first packet, once read ([`ClientCaps`]).
    client_caps: Arc<AtomicU32>,
}

impl AdminShim {
    fn new(
        shared: Arc<Shared>,
        reloader: Arc<Reloader>,
        peer: SocketAddr,
        throttle: Arc<LoginThrottle>,
    ) -> Self {
        let mut salt = [0u8; 20];
        for b in &mut salt {
            // Printable, never NUL or '$' (the protocol's terminators).
            *b = rand::random_range(0x21u8..=0x7e);
            if *b == b'$' {
                *b = b'%';
            }
        }
        AdminShim {
            shared,
            reloader,
            peer,
            salt,
            authenticated: Arc::new(AtomicBool::new(false)),
            db: None,
            throttle,
            refusal: Arc::new(Mutex::new(None)),
            client_caps: Arc::new(AtomicU32::new(0)),
        }
    }

    /// An OK packet carrying `info` for this client (see [`ok_with_info`]).
    fn ok(&self, info: &str) -> OkResponse {
        ok_with_info(info, self.client_caps.load(Relaxed))
    }
}

/// Constant-time byte comparison.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `response` proves knowledge of `password` for `salt` under
/// mysql_native_password (an empty password has an empty response).
pub fn native_password_ok(password: &str, salt: &[u8], response: &[u8]) -> bool {
    if password.is_empty() {
        return response.is_empty();
    }
    use mysql_common::auth::plugins::mysql_native_password::scramble_native;
    match scramble_native(salt, password.as_bytes()) {
        Some(expected) => same(&expected, response),
        None => false,
    }
}

/// CLIENT_SESSION_TRACK: the client reads an OK packet's info as a length-encoded
/// string (otherwise: the rest of the packet).
const CLIENT_SESSION_TRACK: u32 = 0x0080_0000;

/// An OK packet whose info text reaches the client whole. opensrv picks the info's
/// form from the flags the client sent, not from their intersection with the flags
/// it advertised (which lack CLIENT_SESSION_TRACK): to a client that sent the flag
/// (the `mariadb` CLI does) it writes a length-encoded string, which is what such a
/// client reads from a server that does not advertise the flag either (MariaDB's
/// own client library reads the info as length-encoded whenever the packet has
/// more bytes); to one that did not (mysql_async does not) it writes the raw text,
/// which such a client reads as length-encoded too, so the length goes in front
/// here. Framed text is kept under 128 bytes, so its length is one byte that is
/// also a valid one-byte UTF-8 character.
fn ok_with_info(info: &str, client_caps: u32) -> OkResponse {
    if client_caps & CLIENT_SESSION_TRACK != 0 {
        return OkResponse {
            info: info.to_string(),
            ..Default::default()
        };
    }
    let mut text = info.to_string();
    if text.len() > 127 {
        while text.len() > 124 {
            text.pop();
        }
        text.push_str("...");
    }
    let mut framed = String::with_capacity(text.len() + 1);
    framed.push(char::from(text.len() as u8));
    framed.push_str(&text);
    OkResponse {
        info: framed,
        ..Default::default()
    }
}

/// The admin connection's reading half, which notes the capability flags of the
/// client's first packet (bytes 4..8 of the stream: after the packet header, in the
/// SSL request and the handshake response alike) for [`ok_with_info`].
struct ClientCaps<R> {
    inner: R,
    /// The stream's first bytes, as they arrive.
    head: [u8; 8],
    /// How many of them have arrived.
    seen: usize,
    /// Where the flags go once all eight bytes are in.
    caps: Arc<AtomicU32>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ClientCaps<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.seen < self.head.len() {
            let this = &mut *self;
            let new = buf.filled().get(before..).unwrap_or_default();
            let take = new.len().min(this.head.len() - this.seen);
            this.head[this.seen..this.seen + take].copy_from_slice(&new[..take]);
            this.seen += take;
            if this.seen == this.head.len() {
                let [_, _, _, _, a, b, c, d] = this.head;
                this.caps.store(u32::from_le_bytes([a, b, c, d]), Relaxed);
            }
        }
        polled
    }
}

fn text_col(name: &str) -> Column {
    Column {
        table: String::new(),
        column: name.to_string(),
        coltype: ColumnType::MYSQL_TYPE_VAR_STRING,
        colflags: ColumnFlags::empty(),
    }
}

fn num_col(name: &str) -> Column {
    Column {
        table: String::new(),
        column: name.to_string(),
        coltype: ColumnType::MYSQL_TYPE_LONGLONG,
        colflags: ColumnFlags::UNSIGNED_FLAG | ColumnFlags::NOT_NULL_FLAG,
    }
}

/// A `YYYY-MM-DD HH:MM:SS` (UTC) column.
fn time_col(name: &str) -> Column {
    Column {
        table: String::new(),
        column: name.to_string(),
        coltype: ColumnType::MYSQL_TYPE_DATETIME,
        colflags: ColumnFlags::NOT_NULL_FLAG | ColumnFlags::BINARY_FLAG,
    }
}

/// The digests ordered by `order` (column, descending), ties by digest, at most
/// `limit`.
pub fn sorted_digests(
    digests: &crate::digest::Digests,
    order: &(String, bool),
    limit: Option<usize>,
) -> Vec<crate::digest::DigestRow> {
    let mut rows = digests.rows();
    let (col, desc) = order;
    rows.sort_by(|a, b| {
        let (x, y) = (a.order_value(col), b.order_value(col));
        let o = if *desc { y.cmp(&x) } else { x.cmp(&y) };
        o.then_with(|| a.digest.cmp(&b.digest))
            .then_with(|| a.user.cmp(&b.user))
            .then_with(|| a.schema_name.cmp(&b.schema_name))
    });
    if let Some(n) = limit {
        rows.truncate(n);
    }
    rows
}

/// One admin command, parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `SHOW RULES`
    ShowRules,
    /// `SHOW RULE STATS`
    ShowRuleStats,
    /// `SHOW SESSIONS`
    ShowSessions,
    /// `SHOW BACKENDS`
    ShowBackends,
    /// `SHOW REFUSALS` or `SHOW FALLBACKS`
    ShowShapes(crate::refusals::Kind),
    /// `RESET REFUSALS` or `RESET FALLBACKS`
    ResetShapes(crate::refusals::Kind),
    /// `SHOW DIGESTS [ORDER BY column [ASC|DESC]] [LIMIT n]`
    ShowDigests {
        /// The column ([`crate::digest::ORDER_COLUMNS`]) and whether descending.
        order: (String, bool),
        /// At most this many rows.
        limit: Option<usize>,
    },
    /// `RESET DIGESTS`
    ResetDigests,
    /// `RELOAD RULES`
    ReloadRules,
    /// `EXPLAIN REWRITE '<sql>'`
    ExplainRewrite(String),
    /// `SELECT @@a, @@b` (client libraries' connection probes)
    Variables(Vec<String>),
    /// `SET …` (client libraries' session setup): accepted, ignored.
    Set,
}

/// The commands, for error messages.
pub const COMMANDS: &str =
    "SHOW RULES, SHOW RULE STATS, SHOW SESSIONS, SHOW BACKENDS, SHOW REFUSALS, SHOW FALLBACKS, RESET REFUSALS, RESET FALLBACKS, SHOW DIGESTS [ORDER BY column [DESC]] [LIMIT n], RESET DIGESTS, RELOAD RULES, EXPLAIN REWRITE '<sql>'";

/// Parses one admin command. Err: the message for the client.
pub fn parse(query: &str) -> std::result::Result<Command, String> {
    let q = query.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = q.split_whitespace().collect();
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    let upper: Vec<&str> = upper.iter().map(String::as_str).collect();
    match upper.as_slice() {
        ["SHOW", "RULES"] => return Ok(Command::ShowRules),
        ["SHOW", "RULE", "STATS"] => return Ok(Command::ShowRuleStats),
        ["SHOW", "SESSIONS"] => return Ok(Command::ShowSessions),
        ["SHOW", "BACKENDS"] => return Ok(Command::ShowBackends),
        ["SHOW", "REFUSALS"] => return Ok(Command::ShowShapes(Kind::Refusal)),
        ["SHOW", "FALLBACKS"] => return Ok(Command::ShowShapes(Kind::Fallback)),
        ["RESET", "REFUSALS"] => return Ok(Command::ResetShapes(Kind::Refusal)),
        ["RESET", "FALLBACKS"] => return Ok(Command::ResetShapes(Kind::Fallback)),
        ["RELOAD", "RULES"] => return Ok(Command::ReloadRules),
        ["RESET", "DIGESTS"] => return Ok(Command::ResetDigests),
        ["SHOW", "DIGESTS", rest @ ..] => return show_digests(rest),
        ["SET", _, ..] => return Ok(Command::Set),
        ["EXPLAIN", "REWRITE", ..] => {
            // The argument starts after the second keyword.
            let after = q
                .find(|c: char| c.is_whitespace())
                .map(|i| q[i..].trim_start())
                .and_then(|rest| rest.find(|c: char| c.is_whitespace()).map(|i| &rest[i..]))
                .unwrap_or("")
                .trim();
            return unquote(after)
                .map(Command::ExplainRewrite)
                .ok_or_else(|| {
                    "usage: EXPLAIN REWRITE '<sql>' (one quoted statement; escape quotes inside as \\' or '')".to_string()
                });
        }
        ["SELECT", ..] if q[6..].trim_start().starts_with("@@") => {
            let vars: Option<Vec<String>> = q[6..]
                .split(',')
                .map(|v| {
                    let v = v.trim();
                    // `@@version_comment limit 1`: the first word is the variable.
                    let v = v.split_whitespace().next().unwrap_or("");
                    v.strip_prefix("@@").map(|name| {
                        let name = name
                            .strip_prefix("session.")
                            .or_else(|| name.strip_prefix("SESSION."))
                            .or_else(|| name.strip_prefix("global."))
                            .or_else(|| name.strip_prefix("GLOBAL."))
                            .unwrap_or(name);
                        name.to_ascii_lowercase()
                    })
                })
                .collect();
            if let Some(vars) = vars.filter(|v| !v.is_empty()) {
                return Ok(Command::Variables(vars));
            }
        }
        _ => {}
    }
    Err(format!(
        "unknown admin command; the admin port understands: {COMMANDS}"
    ))
}

/// The rest of `SHOW DIGESTS` (uppercased words): `[ORDER BY column [ASC|DESC]]
/// [LIMIT n]`.
fn show_digests(mut rest: &[&str]) -> std::result::Result<Command, String> {
    let usage = || {
        format!(
            "usage: SHOW DIGESTS [ORDER BY column [ASC|DESC]] [LIMIT n]; columns: {}",
            crate::digest::ORDER_COLUMNS.join(", ")
        )
    };
    let mut order = ("sum_time_us".to_string(), true);
    if let ["ORDER", "BY", col, tail @ ..] = rest {
        let col = col.to_ascii_lowercase();
        if !crate::digest::ORDER_COLUMNS.contains(&col.as_str()) {
            return Err(usage());
        }
        rest = tail;
        let desc = match rest.first() {
            Some(&"DESC") => {
                rest = &rest[1..];
                true
            }
            Some(&"ASC") => {
                rest = &rest[1..];
                false
            }
            _ => false,
        };
        order = (col, desc);
    }
    let limit = match rest {
        [] => None,
        ["LIMIT", n] => Some(n.parse::<usize>().map_err(|_| usage())?),
        _ => return Err(usage()),
    };
    Ok(Command::ShowDigests { order, limit })
}

/// The text of a single- or double-quoted SQL string literal that makes up all of
/// `s` (backslash escapes and doubled quotes understood).
fn unquote(s: &str) -> Option<String> {
    let mut chars = s.chars();
    let quote = chars.next().filter(|c| *c == '\'' || *c == '"')?;
    let mut out = String::new();
    let mut rest = chars.peekable();
    while let Some(c) = rest.next() {
        if c == '\\' {
            let e = rest.next()?;
            out.push(match e {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                other => other,
            });
        } else if c == quote {
            if rest.peek() == Some(&quote) {
                rest.next();
                out.push(quote);
            } else {
                // Closing quote: nothing may follow.
                return rest.all(char::is_whitespace).then_some(out);
            }
        } else {
            out.push(c);
        }
    }
    None
}

#[async_trait]
impl<W: AsyncWrite + Send + Unpin> AsyncMysqlShim<W> for AdminShim {
    type Error = std::io::Error;

    fn version(&self) -> String {
        format!("5.7.0-heatsink-{}-admin", env!("CARGO_PKG_VERSION"))
    }

    fn salt(&self) -> [u8; 20] {
        self.salt
    }

    async fn authenticate(
        &self,
        _auth_plugin: &str,
        username: &[u8],
        salt: &[u8],
        auth_data: &[u8],
    ) -> bool {
        let config = &self.shared.config;
        let user_ok = same(username, config.admin_user.as_bytes());
        // Some clients append a NUL to the scramble response.
        let data = match auth_data {
            [d @ .., 0] if d.len() == 20 => d,
            d => d,
        };
        let ok = user_ok && native_password_ok(&config.admin_password.0, salt, data);
        let ip = self.peer.ip();
        let now = Instant::now();
        if let Some(left) = self.throttle.locked(ip, now) {
            // Locked out while this connection was being greeted.
            *lock(&self.refusal) = Some(crate::wire::packets::err_of(
                HOST_BLOCKED,
                &blocked_message(ip, left),
            ));
            warn!(peer = %self.peer, "admin login refused: address locked out");
            return false;
        }
        if ok {
            self.throttle.succeeded(ip);
            self.authenticated.store(true, Relaxed);
            info!(peer = %self.peer, "admin login");
            return true;
        }
        let user = String::from_utf8_lossy(username);
        let delay = self
            .throttle
            .failed(ip, now)
            .min(config.handshake_timeout / 2);
        warn!(peer = %self.peer, %user, delay_ms = delay.as_millis() as u64, "admin login refused");
        tokio::time::sleep(delay).await;
        let msg = format!(
            "Access denied for user '{user}'@'{ip}' (using password: {})",
            if data.is_empty() { "NO" } else { "YES" }
        );
        *lock(&self.refusal) = Some(crate::wire::packets::err_payload(1045, b"28000", &msg));
        false
    }

    async fn on_prepare<'a>(
        &'a mut self,
        _query: &'a str,
        info: StatementMetaWriter<'a, W>,
    ) -> std::io::Result<()> {
        info.error(
            ErrorKind::ER_NOT_SUPPORTED_YET,
            b"the admin port does not support prepared statements; send commands as text".as_ref(),
        )
        .await
    }

    async fn on_execute<'a>(
        &'a mut self,
        _id: u32,
        _params: ParamParser<'a>,
        results: QueryResultWriter<'a, W>,
    ) -> std::io::Result<()> {
        results
            .error(
                ErrorKind::ER_NOT_SUPPORTED_YET,
                b"the admin port does not support prepared statements".as_ref(),
            )
            .await
    }

    async fn on_close<'a>(&'a mut self, _stmt: u32)
    where
        W: 'async_trait,
    {
    }

    async fn on_init<'a>(&'a mut self, db: &'a str, w: InitWriter<'a, W>) -> std::io::Result<()> {
        if !self.authenticated.load(Relaxed) {
            return w
                .error(
                    ErrorKind::ER_ACCESS_DENIED_ERROR,
                    b"not authenticated".as_ref(),
                )
                .await;
        }
        let db = db.trim().trim_matches('`');
        self.db = (!db.is_empty()).then(|| db.to_string());
        w.ok().await
    }

    async fn on_query<'a>(
        &'a mut self,
        query: &'a str,
        results: QueryResultWriter<'a, W>,
    ) -> std::io::Result<()> {
        if !self.authenticated.load(Relaxed) {
            return results
                .error(
                    ErrorKind::ER_ACCESS_DENIED_ERROR,
                    b"not authenticated".as_ref(),
                )
                .await;
        }
        let command = match parse(query) {
            Ok(c) => c,
            Err(msg) => {
                return results
                    .error(ErrorKind::ER_UNKNOWN_ERROR, msg.as_bytes())
                    .await
            }
        };
        debug!(peer = %self.peer, ?command, "admin command");
        match command {
            Command::ShowRules => self.show_rules(results).await,
            Command::ShowRuleStats => self.show_rule_stats(results).await,
            Command::ShowSessions => self.show_sessions(results).await,
            Command::ShowBackends => self.show_backends(results).await,
            Command::ShowShapes(kind) => self.show_shapes(kind, results).await,
            Command::ResetShapes(kind) => {
                let n = self.shared.shapes.table(kind).reset();
                info!(peer = %self.peer, table = kind.label(), shapes = n, "admin reset");
                results
                    .completed(self.ok(&format!("{}: {n} shapes cleared", kind.label())))
                    .await
            }
            Command::ShowDigests { order, limit } => {
                self.show_digests(&order, limit, results).await
            }
            Command::ResetDigests => {
                let n = self.shared.digests.reset();
                info!(peer = %self.peer, rows = n, "admin reset digests");
                results
                    .completed(self.ok(&format!("digests: {n} rows cleared")))
                    .await
            }
            Command::ReloadRules => match self.reloader.reload(Trigger::Admin).await {
                Ok(names) => {
                    let info = if names.is_empty() {
                        "rules reloaded: none (passthrough)".to_string()
                    } else {
                        format!("rules reloaded: {}", names.join(", "))
                    };
                    results.completed(self.ok(&info)).await
                }
                Err(e) => {
                    let msg = format!("reload failed, the previous rules stay in force: {e}");
                    results
                        .error(ErrorKind::ER_UNKNOWN_ERROR, msg.as_bytes())
                        .await
                }
            },
            Command::ExplainRewrite(sql) => self.explain(&sql, results).await,
            Command::Variables(vars) => self.variables(&vars, results).await,
            Command::Set => results.completed(OkResponse::default()).await,
        }
    }
}

impl AdminShim {
    async fn show_rules<W: AsyncWrite + Send + Unpin>(
        &self,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let cols = [
            text_col("name"),
            text_col("kind"),
            text_col("table"),
            text_col("mode"),
            text_col("file"),
        ];
        let catalog = self.reloader.catalog();
        let mut w = results.start(&cols).await?;
        for r in catalog.iter() {
            w.write_col(r.name.as_str())?;
            w.write_col(r.kind.as_str())?;
            w.write_col(r.tables.join(", "))?;
            w.write_col(r.mode.as_str())?;
            w.write_col(r.file.display().to_string())?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn show_rule_stats<W: AsyncWrite + Send + Unpin>(
        &self,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let cols = [
            text_col("rule"),
            num_col("matched"),
            num_col("rewritten"),
            num_col("rejected"),
            num_col("errors"),
            num_col("shadow_rewrites"),
            num_col("shadow_rejects"),
            num_col("fallbacks"),
            num_col("mean_latency_us"),
            num_col("max_latency_us"),
        ];
        let table = self.shared.rules.load_full();
        let mut w = results.start(&cols).await?;
        for (name, s) in table.iter() {
            w.write_col(name)?;
            w.write_col(s.matched())?;
            w.write_col(s.rewritten.load(Relaxed))?;
            w.write_col(s.rejected.load(Relaxed))?;
            w.write_col(s.errors.load(Relaxed))?;
            w.write_col(s.shadow_rewrites.load(Relaxed))?;
            w.write_col(s.shadow_rejects.load(Relaxed))?;
            w.write_col(s.fallbacks.load(Relaxed))?;
            w.write_col(s.mean_latency_us().round() as u64)?;
            w.write_col(s.max_latency_us().round() as u64)?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn show_shapes<W: AsyncWrite + Send + Unpin>(
        &self,
        kind: Kind,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let refusals = kind == Kind::Refusal;
        let mut cols = vec![text_col("rule")];
        if refusals {
            cols.extend([text_col("mode"), text_col("class")]);
        }
        cols.extend([
            text_col("reason"),
            num_col("count"),
            time_col("first_seen"),
            time_col("last_seen"),
            text_col("fingerprint"),
            text_col("example"),
        ]);
        let rows = self.shared.shapes.table(kind).rows();
        let mut w = results.start(&cols).await?;
        for r in rows {
            w.write_col(&*r.rule)?;
            if refusals {
                w.write_col(if r.shadow { "shadow" } else { "on" })?;
                w.write_col(r.class.map_or("", RefusalClass::label))?;
            }
            w.write_col(r.reason)?;
            w.write_col(r.count)?;
            w.write_col(crate::refusals::utc(r.first_seen))?;
            w.write_col(crate::refusals::utc(r.last_seen))?;
            w.write_col(format!("{:016x}", r.fingerprint))?;
            w.write_col(r.example)?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn show_digests<W: AsyncWrite + Send + Unpin>(
        &self,
        order: &(String, bool),
        limit: Option<usize>,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let cols = [
            text_col("digest"),
            text_col("schema_name"),
            text_col("user"),
            text_col("digest_text"),
            num_col("count_star"),
            time_col("first_seen"),
            time_col("last_seen"),
            num_col("sum_time_us"),
            num_col("min_time_us"),
            num_col("max_time_us"),
            num_col("p99_time_us"),
            num_col("rows_sent"),
            num_col("rows_affected"),
            num_col("errors"),
            text_col("error_codes"),
            text_col("handling"),
            text_col("rule"),
            text_col("hot_keys"),
            num_col("prepares"),
        ];
        let rows = sorted_digests(&self.shared.digests, order, limit);
        let mut w = results.start(&cols).await?;
        for r in rows {
            w.write_col(r.digest)?;
            w.write_col(r.schema_name)?;
            w.write_col(r.user)?;
            w.write_col(r.digest_text)?;
            w.write_col(r.count_star)?;
            w.write_col(r.first_seen)?;
            w.write_col(r.last_seen)?;
            w.write_col(r.sum_time_us)?;
            w.write_col(r.min_time_us)?;
            w.write_col(r.max_time_us)?;
            w.write_col(r.p99_time_us)?;
            w.write_col(r.rows_sent)?;
            w.write_col(r.rows_affected)?;
            w.write_col(r.errors)?;
            w.write_col(r.error_codes)?;
            w.write_col(r.handling)?;
            w.write_col(r.rule)?;
            w.write_col(r.hot_keys)?;
            w.write_col(r.prepares)?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn show_sessions<W: AsyncWrite + Send + Unpin>(
        &self,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let cols = [
            num_col("id"),
            text_col("client"),
            text_col("user"),
            text_col("db"),
            num_col("backend_id"),
            text_col("state"),
            num_col("statements"),
        ];
        let sessions = self.shared.sessions.snapshot();
        let mut w = results.start(&cols).await?;
        for s in sessions {
            let (user, db) = s.names();
            w.write_col(s.id)?;
            w.write_col(s.peer.to_string())?;
            w.write_col(user)?;
            w.write_col(db)?;
            w.write_col(s.backend_id())?;
            w.write_col(s.state())?;
            w.write_col(s.statements())?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn show_backends<W: AsyncWrite + Send + Unpin>(
        &self,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let cols = [
            text_col("backend"),
            text_col("state"),
            text_col("detail"),
            num_col("connections"),
            num_col("connections_total"),
            num_col("errors"),
        ];
        let mut w = results.start(&cols).await?;
        for n in self.shared.backends.views() {
            w.write_col(n.addr)?;
            w.write_col(if n.up { "up" } else { "down" })?;
            w.write_col(n.detail)?;
            w.write_col(n.connections)?;
            w.write_col(n.connections_total)?;
            w.write_col(n.errors)?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn explain<W: AsyncWrite + Send + Unpin>(
        &self,
        sql: &str,
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let engine = self.shared.engine.load_full();
        let ctx = StatementContext {
            prepared: false,
            in_transaction: false,
            current_db: self.db.as_deref(),
            lexing: Some(crate::rewrite::Lexing::STANDARD),
            share: None,
        };
        let (decision, shadow) = match engine.decide(sql.as_bytes(), &ctx) {
            Decision::Shadow(would) => (*would, true),
            d => (d, false),
        };
        let mut rows: Vec<[String; 3]> = match decision {
            Decision::Passthrough => vec![[
                "passthrough".into(),
                String::new(),
                "no rule applies; the statement is forwarded unchanged".into(),
            ]],
            Decision::Reject(r) => vec![["reject".into(), r.rule.to_string(), r.message()]],
            Decision::Fallback(f) => vec![[
                "fallback".into(),
                f.rule.to_string(),
                format!(
                    "the rule cannot answer this statement exactly: {}; it is forwarded unchanged",
                    f.reason
                ),
            ]],
            // Never: the admin port decides under fixed settings.
            Decision::Shadow(_) | Decision::NeedSessionState => Vec::new(),
            Decision::Rewrite(rw) => rw
                .statements
                .iter()
                .map(|s| {
                    [
                        "rewrite".into(),
                        rw.rule.to_string(),
                        String::from_utf8_lossy(s).into_owned(),
                    ]
                })
                .collect(),
            Decision::NeedMetadata(req) => {
                let rule = engine
                    .rules()
                    .get(req.rule)
                    .map(|r| r.name().to_string())
                    .unwrap_or_default();
                vec![[
                    "needs_metadata".into(),
                    rule,
                    "needs table metadata: run the statement once through the proxy first".into(),
                ]]
            }
        };
        if shadow {
            // Shadow mode: the statement is forwarded unchanged; show what the rule
            // would have done.
            for row in &mut rows {
                row[0] = format!("shadow_{}", row[0]);
            }
        }
        let cols = [text_col("outcome"), text_col("rule"), text_col("detail")];
        let mut w = results.start(&cols).await?;
        for [outcome, rule, detail] in rows {
            w.write_col(outcome)?;
            w.write_col(rule)?;
            w.write_col(detail)?;
            w.end_row().await?;
        }
        w.finish().await
    }

    async fn variables<W: AsyncWrite + Send + Unpin>(
        &self,
        vars: &[String],
        results: QueryResultWriter<'_, W>,
    ) -> std::io::Result<()> {
        let cols: Vec<Column> = vars
            .iter()
            .map(|v| Column {
                table: String::new(),
                column: format!("@@{v}"),
                coltype: ColumnType::MYSQL_TYPE_VAR_STRING,
                colflags: ColumnFlags::empty(),
            })
            .collect();
        let mut w = results.start(&cols).await?;
        for v in vars {
            let value: Option<String> = match v.as_str() {
                "version_comment" => Some("heatsink admin port".into()),
                "version" => Some(format!("heatsink {}", env!("CARGO_PKG_VERSION"))),
                "max_allowed_packet" => Some("67108864".into()),
                "wait_timeout" | "interactive_timeout" => Some("28800".into()),
                "autocommit" => Some("1".into()),
                "character_set_client" | "character_set_results" | "character_set_connection" => {
                    Some("utf8mb4".into())
                }
                _ => None,
            };
            w.write_col(value)?;
        }
        w.end_row().await?;
        w.finish().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse() {
        assert_eq!(parse("show rules"), Ok(Command::ShowRules));
        assert_eq!(parse("  Show   Rule\tStats ;"), Ok(Command::ShowRuleStats));
        assert_eq!(parse("SHOW SESSIONS"), Ok(Command::ShowSessions));
        assert_eq!(parse("show backends;"), Ok(Command::ShowBackends));
        assert_eq!(parse("reload rules;"), Ok(Command::ReloadRules));
        assert_eq!(
            parse("show refusals"),
            Ok(Command::ShowShapes(Kind::Refusal))
        );
        assert_eq!(
            parse("SHOW  Fallbacks;"),
            Ok(Command::ShowShapes(Kind::Fallback))
        );
        assert_eq!(
            parse("reset refusals"),
            Ok(Command::ResetShapes(Kind::Refusal))
        );
        assert_eq!(
            parse("RESET FALLBACKS ;"),
            Ok(Command::ResetShapes(Kind::Fallback))
        );
        assert!(parse("RESET RULES").is_err());
        assert_eq!(parse("reset digests;"), Ok(Command::ResetDigests));
        assert_eq!(
            parse("SHOW DIGESTS"),
            Ok(Command::ShowDigests {
                order: ("sum_time_us".into(), true),
                limit: None
            })
        );
        assert_eq!(
            parse("show digests order by COUNT_STAR desc limit 5"),
            Ok(Command::ShowDigests {
                order: ("count_star".into(), true),
                limit: Some(5)
            })
        );
        assert_eq!(
            parse("SHOW DIGESTS ORDER BY last_seen"),
            Ok(Command::ShowDigests {
                order: ("last_seen".into(), false),
                limit: None
            })
        );
        assert_eq!(
            parse("SHOW DIGESTS LIMIT 2"),
            Ok(Command::ShowDigests {
                order: ("sum_time_us".into(), true),
                limit: Some(2)
            })
        );
        assert!(parse("SHOW DIGESTS ORDER BY digest_text").is_err());
        assert!(parse("SHOW DIGESTS LIMIT x").is_err());
        assert_eq!(
            parse("explain rewrite 'UPDATE hits SET cnt = cnt + 1 WHERE slug = ''a'''"),
            Ok(Command::ExplainRewrite(
                "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'a'".into()
            ))
        );
        assert_eq!(
            parse(r#"EXPLAIN  REWRITE "SELECT 'it\'s'";"#),
            Ok(Command::ExplainRewrite("SELECT 'it's'".into()))
        );
        assert!(parse("EXPLAIN REWRITE 'unterminated").is_err());
        assert!(parse("EXPLAIN REWRITE 'a' 'b'").is_err());
        assert!(parse("EXPLAIN REWRITE").is_err());
        assert_eq!(
            parse("select @@version_comment limit 1"),
            Ok(Command::Variables(vec!["version_comment".into()]))
        );
        assert_eq!(
            parse("SELECT @@max_allowed_packet,@@session.wait_timeout"),
            Ok(Command::Variables(vec![
                "max_allowed_packet".into(),
                "wait_timeout".into()
            ]))
        );
        let e = parse("DROP TABLE x").unwrap_err();
        assert!(e.contains("SHOW RULES"), "{e}");
        assert!(parse("SELECT 1").is_err());
        assert_eq!(parse("SET NAMES utf8mb4"), Ok(Command::Set));
        assert!(parse("SET").is_err());
    }

    #[test]
    fn native_password() {
        let salt = b"abcdefghijklmnopqrst";
        use mysql_common::auth::plugins::mysql_native_password::scramble_native;
        let good = scramble_native(salt, b"pw").unwrap();
        assert!(native_password_ok("pw", salt, &good));
        assert!(!native_password_ok("pw", salt, &[]));
        assert!(!native_password_ok("other", salt, &good));
        assert!(native_password_ok("", salt, &[]));
        assert!(!native_password_ok("", salt, &good));
    }

    #[test]
    fn login_throttle() {
        let t = LoginThrottle::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..LOCKOUT_AFTER).map(|_| t.failed(ip, t0)).collect();
        assert_eq!(delays[0], FIRST_DELAY);
        assert_eq!(delays[1], FIRST_DELAY * 2);
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert!(delays.iter().all(|d| *d <= MAX_DELAY));
        // Locked out for the window after the last failure; others are not.
        assert_eq!(t.locked(ip, t0), Some(THROTTLE_WINDOW));
        assert!(t.locked(ip, t0 + THROTTLE_WINDOW / 2).is_some());
        assert_eq!(t.locked(ip, t0 + THROTTLE_WINDOW), None);
        assert_eq!(t.locked(other, t0), None);
        // After the window the count starts again.
        assert_eq!(t.failed(ip, t0 + THROTTLE_WINDOW), FIRST_DELAY);
        assert_eq!(t.locked(ip, t0 + THROTTLE_WINDOW), None);
        // One failure short of the lockout, then a success: cleared.
        for _ in 0..LOCKOUT_AFTER - 1 {
            t.failed(other, t0);
        }
        assert_eq!(t.locked(other, t0), None);
        t.succeeded(other);
        assert_eq!(t.failed(other, t0), FIRST_DELAY);
        // The delay is capped however many failures pile up.
        for _ in 0..100 {
            assert!(t.failed(ip, t0 + THROTTLE_WINDOW) <= MAX_DELAY);
        }
    }

    #[test]
    fn registry_removes_dropped_sessions() {
        let r = Registry::default();
        let a = r.register(crate::server::Peer::Tcp("127.0.0.1:1".parse().unwrap()));
        let b = r.register(crate::server::Peer::Unix);
        a.set_user("u");
        a.set_db(Some("d"));
        a.set_busy(true);
        a.count_statement();
        assert_eq!(r.snapshot().len(), 2);
        assert_eq!(a.state(), "busy");
        assert_eq!(b.state(), "handshake");
        assert_eq!(a.names(), ("u".into(), Some("d".into())));
        drop(a);
        let left = r.snapshot();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, 2);
    }
}
