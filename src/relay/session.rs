//! One client connection and its backend connection.
//!
//! Life of a session:
//! 1. connect to the backend (a failure is answered with an ERR packet carrying the
//!    client library's "Can't connect" message, code 1429 / SQLSTATE 08S01);
//! 2. relay the greeting (unsupported capability bits cleared) and the client's
//!    handshake response, then pump authentication packets both ways until the backend
//!    says OK or ERR — the backend authenticates, the proxy knows no passwords. Either
//!    leg may be upgraded to TLS on the way (an SSLRequest from the client, one from the
//!    proxy to the backend), each on its own;
//! 3. command loop: read a command, decide (passthrough / reject / rewrite), forward,
//!    and stream the response back, packet boundaries found by [`ResponseParser`].

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpStream, UnixStream};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::link::Link;
use super::prepared::{check_params, PreparedRewrite, ShadowPrepared};
use super::response::{ResponseKind, ResponseParser};
use super::shared::Shared;
use super::state::SessionState;
use crate::admin::Registration;
use crate::error::{Error, Result, Source};
use crate::refusals::Seen;
use crate::rewrite::{Decision, Engine, StatementContext};
use crate::server::Peer;
use crate::tls::{self, Stream, Tls};
use crate::wire::handshake::{
    patch_client_hello, patch_greeting, set_client_ssl, ClientHello, Greeting,
};
use crate::wire::io::{shift_seq, Framed, Logical, Packet, PacketIo};
use crate::wire::packets::{self, err_of, errors, Renames};
use crate::wire::{caps, cmd, status, MAX_PAYLOAD};

/// Serves one accepted client connection (TCP with TCP_NODELAY set, or a Unix socket)
/// to completion. Never panics on bad input: errors end the session and are logged
/// with their source.
pub async fn serve_client(
    client: Stream,
    peer: Peer,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    let mut client = PacketIo::new(client, Source::Client);
    let (backend, lease) = match connect_backend(&shared).await {
        Ok(b) => b,
        Err((addr, e)) => {
            shared.stats.backend_connect_errors.fetch_add(1, Relaxed);
            warn!(%peer, error = %e, "backend unreachable");
            let msg = format!(
                "Can't connect to MySQL server on '{}' ({})",
                addr,
                e.cause
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| e.context.clone())
            );
            let _ = client
                .write_packet(0, &err_of(errors::CANT_CONNECT, &msg))
                .await;
            client.shutdown().await;
            return;
        }
    };
    let info = shared.sessions.register(peer.clone());
    let mut s = Session {
        link: Link {
            client,
            backend: PacketIo::new(backend, Source::Backend),
            deprecate_eof: false,
            extended_metadata: false,
        },
        shared,
        info,
        answered_error: false,
        execute_not_rewritten: false,
        fell_back: None,
        declined: None,
        state: SessionState::new(false),
        peer,
        backend_id: 0,
        identity: Vec::new(),
        returning: false,
        pending_insert_id: None,
        rewrite_names: None,
        merged_warnings: None,
        prepared: HashMap::new(),
        changed_user: false,
        packet_limit: None,
        lease,
        digester: crate::digest::Digester::default(),
        outcome: Outcome::default(),
        user: String::new(),
        stmt_digests: HashMap::new(),
        param_value: Vec::new(),
        last_prepared: None,
        shadow_prepared: HashMap::new(),
    };
    let outcome = async {
        let hs = s.shared.config.handshake_timeout;
        match tokio::time::timeout(hs, s.handshake()).await {
            Err(_) => return Err(Error::client("handshake timed out")),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(false)) => return Ok(()), // authentication failed; client got the ERR
            Ok(Ok(true)) => {}
        }
        s.command_loop(shutdown).await
    }
    .await;
    match outcome {
        Ok(()) => debug!(peer = %s.peer, id = s.backend_id, "session closed"),
        Err(e) if e.is_disconnect() => {
            debug!(peer = %s.peer, id = s.backend_id, error = %e, "session ended")
        }
        Err(e) => warn!(peer = %s.peer, id = s.backend_id, error = %e, "session failed"),
    }
    s.link.backend.shutdown().await;
    s.link.client.shutdown().await;
}

/// Connects to the best backend node that accepts ([`crate::backends`]): a node that
/// refuses is marked down and the next one is tried. `Err` names the last address.
async fn connect_backend(
    shared: &Arc<Shared>,
) -> std::result::Result<(Stream, crate::backends::Lease), (String, Error)> {
    let backends = &shared.backends;
    let mut last = None;
    for index in backends.candidates() {
        let Some(addr) = backends.nodes().get(index).map(|n| n.addr.clone()) else {
            continue;
        };
        match connect_addr(&addr, shared.config.connect_timeout).await {
            Ok(s) => return Ok((s, backends.lease(index))),
            Err(e) => {
                let why = e
                    .cause
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| e.context.clone());
                backends.connect_failed(index, &why);
                warn!(backend = %addr, error = %e, "backend connection failed");
                last = Some((addr, e));
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        (
            shared.config.backend.clone(),
            Error::new(Source::Backend, "no backend address"),
        )
    }))
}

/// Connects to one backend address: `host:port` over TCP (TCP_NODELAY set), or
/// `unix:PATH` over a Unix socket ([`crate::backends::unix_path`]).
async fn connect_addr(addr: &str, limit: Duration) -> Result<Stream> {
    let fut = async {
        match crate::backends::unix_path(addr) {
            Some(path) => UnixStream::connect(path).await.map(Stream::Unix),
            None => TcpStream::connect(addr).await.map(|s| {
                let _ = s.set_nodelay(true);
                Stream::Plain(s)
            }),
        }
    };
    match tokio::time::timeout(limit, fut).await {
        Err(_) => Err(Error::with_cause(
            Source::Backend,
            "connecting",
            std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        )),
        Ok(Err(e)) => Err(Error::with_cause(Source::Backend, "connecting", e)),
        Ok(Ok(s)) => Ok(s),
    }
}

pub(super) struct Session {
    /// The client's and the backend's connections (packet I/O, framing).
    pub(super) link: Link,
    /// The node `backend` is connected to, counted in its connections while the
    /// session lives.
    pub(super) lease: crate::backends::Lease,
    /// Config, rules and counters.
    pub(super) shared: Arc<Shared>,
    /// This session's entry in the admin port's session list (removed on drop).
    pub(super) info: Registration,
    /// A backend response during the current rewrite was an error (per-rule `errors`).
    pub(super) answered_error: bool,
    /// The current execute of a prepared rewrite was refused or ran the client's own
    /// statement instead: counted as the rule's rejection or fallback, not as a
    /// rewrite.
    pub(super) execute_not_rewritten: bool,
    /// The current rewrite forwarded the original statement instead, for this
    /// reason (its prelude declined the literal form:
    /// [`crate::rewrite::Prelude::original_on_decline`]; the server's plan did not
    /// tell the column flags: [`crate::rewrite::Plan::plan_flags`]); counted as the
    /// rule's fallback, not as a rewrite.
    pub(super) fell_back: Option<&'static str>,
    /// The current rewrite ran and was undone without an answer, for this reason
    /// (`splice::Ran::Declined`: its probes did not show it exact): the session then
    /// runs the client's own statement, counted as the rule's fallback.
    pub(super) declined: Option<&'static str>,
    /// What the relay knows of the backend session's state (status flags, default
    /// database, character set and `sql_mode` for the lexer, Galera share, whether
    /// it may share merged writes): see [`SessionState`].
    pub(super) state: SessionState,
    /// Client address, for logs.
    pub(super) peer: Peer,
    /// Backend connection id, for logs (the client sees the same id).
    pub(super) backend_id: u32,
    /// Prepared statements that were rewritten, by statement id (the backend's id of
    /// the rewritten statement, which is also the id the client uses).
    pub(super) prepared: HashMap<u32, PreparedRewrite>,
    /// The authenticated user and the handshake character set: sessions may share a
    /// merged write (group commit) only if both are equal (with the state, see
    /// [`SessionState::merge_class`]).
    pub(super) identity: Vec<u8>,
    /// The backend is MariaDB ≥ 10.5, which has `INSERT … RETURNING` (merged writes
    /// learn each row's AUTO_INCREMENT id from it, see `relay::merge`).
    pub(super) returning: bool,
    /// The value the session's `LAST_INSERT_ID()` must have after a merged write
    /// that returned ids and ran on another connection (or a write run with
    /// `RETURNING`); set on the backend before the next statement that could read it.
    pub(super) pending_insert_id: Option<u64>,
    /// Once the session ran a rewritten statement: the rules' physical table names
    /// with the logical ones to show instead in the server's error messages and in
    /// SHOW WARNINGS / SHOW ERRORS (see `Engine::message_names`). Kept, because the
    /// server keeps a statement's warnings until a later statement that uses a table.
    pub(super) rewrite_names: Option<Arc<Renames>>,
    /// The SHOW WARNINGS rows of the previous statement when it was answered from a
    /// merged write (this session's backend did not run it, or ran everyone's
    /// rows); a SHOW WARNINGS / SHOW ERRORS right after shows these instead of the
    /// backend's. Any other command clears them.
    pub(super) merged_warnings: Option<Vec<Vec<u8>>>,
    /// COM_CHANGE_USER ran: the session's user is not the handshake's, and it never
    /// merges again.
    pub(super) changed_user: bool,
    /// The backend session's `max_allowed_packet`, once learned (see
    /// [`LEARN_PACKET_LIMIT_AT`]); unused when `max_client_packet` is configured.
    pub(super) packet_limit: Option<usize>,
    /// Fingerprints statements for the query digests (buffers reused).
    pub(super) digester: crate::digest::Digester,
    /// What the current client statement got, for its digest.
    pub(super) outcome: Outcome,
    /// The client's user name (the handshake's, or COM_CHANGE_USER's).
    pub(super) user: String,
    /// The digest of each prepared statement, by the client's statement id.
    pub(super) stmt_digests: HashMap<u32, StmtDigest>,
    /// The hot-key value of the current execute, as text (reused).
    pub(super) param_value: Vec<u8>,
    /// The client's id of the statement a rewritten COM_STMT_PREPARE just prepared.
    pub(super) last_prepared: Option<u32>,
    /// Prepared statements a rule in shadow mode would have rewritten with checks
    /// of their parameter values, by statement id (forwarded unchanged; their
    /// executes are checked to list what the rule would refuse).
    pub(super) shadow_prepared: HashMap<u32, ShadowPrepared>,
}

/// What a client statement got, as its digest counts it.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Rows of result sets relayed.
    pub(super) rows: u64,
    /// Affected rows of OK packets relayed.
    pub(super) affected: u64,
    /// The code of the ERR the client got.
    pub(super) err: Option<u16>,
    /// How heatsink handled the statement.
    pub(super) handling: crate::digest::Handling,
    /// The rule that handled it.
    pub(super) rule: Option<Arc<str>>,
    /// A COM_STMT_EXECUTE was refused or fell back at execute (its prepare's
    /// handling was a rewrite).
    pub(super) decided: Option<crate::digest::Handling>,
    /// The client was answered before the statement ran (a rule's metadata query
    /// failed): not counted.
    pub(super) skip: bool,
}

/// A prepared statement's digest, made when it was prepared.
#[derive(Debug)]
pub(super) struct StmtDigest {
    hash: u64,
    text: Arc<str>,
    handling: crate::digest::Handling,
    rule: Option<Arc<str>>,
    /// The hot-key column and the parameter that holds its value.
    hot: Option<(Arc<str>, usize)>,
    /// The statement's parameter count.
    params: usize,
    /// The parameter types last bound (two bytes each).
    types: Vec<u8>,
}

/// A command this large makes a session learn its backend's `max_allowed_packet`
/// (one `SELECT @@max_allowed_packet` on its own connection, once per session)
/// before reading more of it, unless `max_client_packet` is configured. Smaller
/// commands are forwarded without it: the server refuses them itself if they are
/// too large, and the proxy never holds more than this much of an unchecked one.
pub const LEARN_PACKET_LIMIT_AT: usize = 1 << 20;

/// Why a COM_STMT_BULK_EXECUTE (MariaDB's array binding) of a rewritten prepared
/// statement is refused: the plans run one execute's parameters at a time.
const BULK_REFUSED: &str =
    "bulk execution of a rewritten statement is not supported; execute it row by row";

/// How long a session refused for an oversized command keeps reading (and
/// discarding) what the client still sends, so that its ERR is not lost to a TCP
/// reset when the connection closes.
const DISCARD_AFTER_REFUSAL: Duration = Duration::from_secs(10);

/// The limit used when the backend does not say its `max_allowed_packet` (the
/// server's maximum: the server then refuses what is too large itself).
const PACKET_LIMIT_FALLBACK: usize = 1 << 30;

/// How a relayed response went.
pub(super) struct Relayed {
    pub(super) parser: ResponseParser,
}

impl Session {
    /// Relays the connection phase. Ok(true) when the backend accepted the client.
    ///
    /// With TLS, the packets of the two legs are numbered differently: a leg that was
    /// upgraded carried one more packet (its SSLRequest) before the handshake response,
    /// so sequence ids are shifted between the legs until authentication ends.
    async fn handshake(&mut self) -> Result<bool> {
        let mut greeting = self.link.backend.read_logical().await?;
        if greeting.first_byte() == Some(packets::ERR) {
            // The backend refused us before the handshake (e.g. too many connections,
            // host blocked): the client sees the backend's own error.
            self.link.client.write_all(&greeting.raw).await?;
            return Ok(false);
        }
        if greeting.raw.len() > MAX_PAYLOAD {
            return Err(Error::backend("greeting too large"));
        }
        let shared = Arc::clone(&self.shared);
        let tls = &shared.tls;
        let shared_addr = &self.lease.addr().to_string();
        // CLIENT_SSL towards the client says what the proxy offers, not the backend;
        // a client on a Unix socket is on this host, and is offered none.
        let local = self.link.client.io.is_unix();
        let (clear, set) = if tls.acceptor.is_some() && !local {
            (caps::UNSUPPORTED, caps::SSL)
        } else {
            (caps::UNSUPPORTED | caps::SSL, 0)
        };
        let info = patch_greeting(&mut greeting.raw[4..], clear, set)
            .map_err(|e| Error::with_cause(Source::Backend, "reading greeting", e))?;
        self.backend_id = info.connection_id;
        self.info.set_backend_id(info.connection_id);
        self.returning = crate::wire::handshake::has_returning(&info.server_version);
        let backend_tls = self.choose_backend_tls(tls, &info, shared_addr).await?;
        self.link.client.write_all(&greeting.raw).await?;

        let Some((mut hello, h, client_extra)) = self.client_hello(tls, &info).await? else {
            return Ok(false);
        };
        self.link.deprecate_eof = h.capabilities & caps::DEPRECATE_EOF != 0;
        self.link.extended_metadata =
            h.ext_capabilities & crate::wire::ext_caps::EXTENDED_METADATA != 0;
        self.state = SessionState::new(h.capabilities & caps::SESSION_TRACK != 0);
        if info.backend_capabilities & caps::SESSION_TRACK != 0 {
            // The proxy learns of every change of the backend session's state from
            // its OK packets; a client that did not ask for that is shown none of it
            // (`SessionState::tracked_ok`).
            self.state.tracking_capability = true;
            set_capability(&mut hello.raw[4..], caps::SESSION_TRACK);
        }
        self.set_current_db(h.database.clone());
        self.identity = h.user.as_bytes().to_vec();
        self.identity.push(0);
        self.identity
            .push(hello.raw.get(4 + 8).copied().unwrap_or(0));
        self.info.set_user(&h.user);
        self.user = h.user.clone();

        let mut backend_extra = 0u8;
        if let Some(b) = backend_tls {
            self.upgrade_backend(b, &hello, shared_addr).await?;
            backend_extra = 1;
        }
        debug!(
            peer = %self.peer,
            id = self.backend_id,
            user = %h.user,
            client_tls = ?self.link.client.io.describe(),
            backend_tls = ?self.link.backend.io.describe(),
            "handshake"
        );
        set_client_ssl(&mut hello.raw[4..], self.link.backend.io.is_tls());
        let delta = backend_extra.wrapping_sub(client_extra);
        shift_seq(&mut hello.raw, delta);
        self.link.backend.write_all(&hello.raw).await?;
        if !self.auth_exchange(delta).await? {
            return Ok(false);
        }
        self.start_tracking().await?;
        Ok(true)
    }

    /// Turns the server's session state tracking on for the proxy
    /// (`state::TRACKING_SETUP`), after authentication and after
    /// COM_RESET_CONNECTION, when a rule may merge writes (`Engine::merges`); a
    /// client that tracks
    /// state itself has its own settings read first so that it is shown only what
    /// they report. Without it, the session's writes never merge.
    async fn start_tracking(&mut self) -> Result<()> {
        if !self.state.tracking_capability || !self.shared.engine.load().merges() {
            self.state.tracking_stopped();
            return Ok(());
        }
        let client = if self.state.client_tracks() {
            let c = self
                .run_collect(super::state::CLIENT_TRACKING_QUERY)
                .await?;
            let rows = c.text_rows(self.link.deprecate_eof);
            c.packets
                .get(rows.start)
                .filter(|_| c.err().is_none() && rows.len() == 1)
                .and_then(|p| crate::wire::resultset::text_cells(&p.payload))
                .and_then(|cells| match cells[..] {
                    [Some(list), Some(on)] => {
                        Some((list.to_vec(), on == b"1" || on.eq_ignore_ascii_case(b"ON")))
                    }
                    _ => None,
                })
        } else {
            None
        };
        let setup = if self.state.client_tracks() {
            super::state::TRACKING_SETUP_KEEPING_VARIABLES
        } else {
            super::state::TRACKING_SETUP
        };
        let c = self.run_collect(setup).await?;
        if c.err().is_some() || (self.state.client_tracks() && client.is_none()) {
            warn!(peer = %self.peer, id = self.backend_id, "session state tracking could not be set up: this session's writes are not merged");
            self.state.tracking_stopped();
            return Ok(());
        }
        self.state
            .tracking_started(client.as_ref().map(|(l, on)| (l.as_slice(), *on)));
        Ok(())
    }

    /// The backend TLS to use: the configured one when the greeting offers TLS. With
    /// `backend_tls = required` and no offer, the client gets an ERR instead of a
    /// greeting. `backend` is the backend's address, for the message.
    async fn choose_backend_tls<'t>(
        &mut self,
        tls: &'t Tls,
        info: &Greeting,
        backend: &str,
    ) -> Result<Option<&'t tls::BackendTls>> {
        Ok(match &tls.backend {
            // A backend on a Unix socket is on this host: the socket is not upgraded.
            Some(_) if self.link.backend.io.is_unix() => None,
            Some(b) if info.backend_capabilities & caps::SSL != 0 => Some(b),
            Some(b) if b.required => {
                // Refused before the client says anything: an ERR instead of a greeting.
                let msg = format!(
                    "Unable to connect to foreign data source: the backend {} does not offer TLS (backend_tls = required)",
                    backend
                );
                let _ = self
                    .link
                    .client
                    .write_packet(0, &err_of(tls::ERR_BACKEND_TLS, &msg))
                    .await;
                return Err(Error::backend(
                    "backend does not offer TLS (backend_tls = required)",
                ));
            }
            Some(_) => {
                debug!(peer = %self.peer, id = self.backend_id, "backend does not offer TLS: plain (backend_tls = preferred)");
                None
            }
            None => None,
        })
    }

    /// Reads the client's handshake response, upgrading the client leg to TLS first
    /// when the client asks with an SSLRequest. Gives the response and how many
    /// packets the client leg counted before it that the backend leg did not, or
    /// `None` when a plain connection was refused (`tls_required`).
    async fn client_hello(
        &mut self,
        tls: &Tls,
        info: &Greeting,
    ) -> Result<Option<(Logical, ClientHello, u8)>> {
        let (mut hello, mut h) = self.read_client_hello(info).await?;
        // Packets the client leg counted before its handshake response that the
        // backend leg did not, and the reverse.
        let mut client_extra = 0u8;
        if h.ssl_request {
            let Some(acceptor) = &tls.acceptor else {
                self.refuse_handshake(hello.last_seq, "SSL was not offered by this proxy")
                    .await;
                return Err(Error::client(
                    "client requested TLS, which is not configured",
                ));
            };
            tls::accept(acceptor, &mut self.link.client).await?;
            (hello, h) = self.read_client_hello(info).await?;
            if h.ssl_request {
                self.refuse_handshake(hello.last_seq, "SSLRequest over TLS")
                    .await;
                return Err(Error::client("second SSLRequest"));
            }
            client_extra = 1;
        } else if tls.required && !self.link.client.io.is_unix() {
            // `tls_required` is about the network: as MariaDB's
            // `require_secure_transport`, it accepts a local Unix socket.
            let msg =
                "Connections using insecure transport are prohibited: this proxy requires TLS";
            let _ = self
                .link
                .client
                .write_packet(
                    hello.last_seq.wrapping_add(1),
                    &err_of(tls::ERR_INSECURE_TRANSPORT, msg),
                )
                .await;
            info!(peer = %self.peer, user = %h.user, "plain connection refused (tls_required)");
            return Ok(None);
        }
        Ok(Some((hello, h, client_extra)))
    }

    /// Upgrades the backend leg to TLS with the proxy's own SSLRequest. A failure is
    /// also reported to the client, as ERR. `backend` is the backend's address, for
    /// the message.
    async fn upgrade_backend(
        &mut self,
        b: &tls::BackendTls,
        hello: &Logical,
        backend: &str,
    ) -> Result<()> {
        // The proxy's own SSLRequest: the first 32 bytes of the client's response
        // (capabilities, max packet, charset) with CLIENT_SSL.
        let Some(head) = hello.raw.get(4..36) else {
            return Err(Error::client("handshake response too short"));
        };
        let mut request = head.to_vec();
        set_client_ssl(&mut request, true);
        self.link.backend.write_packet(1, &request).await?;
        if let Err(e) = tls::connect(b, &mut self.link.backend).await {
            let why = e
                .cause
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_else(|| e.context.clone());
            let msg = format!(
                "Unable to connect to foreign data source: TLS to the backend {} failed: {why}",
                backend
            );
            let _ = self
                .link
                .client
                .write_packet(
                    hello.last_seq.wrapping_add(1),
                    &err_of(tls::ERR_BACKEND_TLS, &msg),
                )
                .await;
            return Err(e);
        }
        Ok(())
    }

    /// Reads and patches the client's handshake response (or SSLRequest); a malformed
    /// one is answered with ERR 1043.
    async fn read_client_hello(&mut self, greeting: &Greeting) -> Result<(Logical, ClientHello)> {
        let Framed::Whole(mut hello) = self.link.client.read_logical_max(MAX_PAYLOAD).await? else {
            return Err(Error::client("handshake response too large"));
        };
        if hello.raw.len() > MAX_PAYLOAD {
            return Err(Error::client("handshake response too large"));
        }
        match patch_client_hello(
            &mut hello.raw[4..],
            greeting.capabilities,
            greeting.ext_capabilities,
        ) {
            Ok(h) => Ok((hello, h)),
            Err(e) => {
                self.refuse_handshake(hello.last_seq, &e.to_string()).await;
                Err(Error::with_cause(
                    Source::Client,
                    "reading handshake response",
                    e,
                ))
            }
        }
    }

    /// Answers a handshake response the proxy cannot accept with ERR 1043 ("Bad
    /// handshake: …"), best effort: the session ends either way.
    async fn refuse_handshake(&mut self, hello_seq: u8, why: &str) {
        let msg = format!("Bad handshake: {why}");
        let _ = self
            .link
            .client
            .write_packet(
                hello_seq.wrapping_add(1),
                &err_of(errors::BAD_HANDSHAKE, &msg),
            )
            .await;
    }

    /// Pumps authentication packets both ways until the backend sends OK or ERR.
    /// `delta` is added to the sequence ids of packets going to the backend (and taken
    /// from those coming back); see [`Session::handshake`].
    async fn auth_exchange(&mut self, delta: u8) -> Result<bool> {
        let back = 0u8.wrapping_sub(delta);
        loop {
            tokio::select! {
                p = self.link.backend.read_logical() => {
                    let mut p = p?;
                    shift_seq(&mut p.raw, back);
                    match p.first_byte() {
                        Some(packets::OK) => {
                            let payload = p.payload();
                            let status = packets::parse_ok(&payload).map(|o| o.status);
                            if let Some(st) = status {
                                self.state.set_status(st);
                            }
                            // The connection's initial state, as the client is to
                            // see it (the proxy negotiated tracking for itself).
                            let own = status
                                .filter(|st| st & packets::SESSION_STATE_CHANGED != 0)
                                .and_then(|_| self.state.tracked_ok(&payload, false));
                            match own {
                                Some(own) => {
                                    self.link.client.write_packet(p.last_seq.wrapping_add(back), &own).await?;
                                }
                                None => self.link.client.write_all(&p.raw).await?,
                            }
                            return Ok(true);
                        }
                        Some(packets::ERR) => {
                            self.link.client.write_all(&p.raw).await?;
                            return Ok(false);
                        }
                        _ => self.link.client.write_all(&p.raw).await?,
                    }
                }
                p = self.link.client.read_logical_max(MAX_PAYLOAD) => {
                    let Framed::Whole(mut p) = p? else {
                        return Err(Error::client("authentication packet too large"));
                    };
                    shift_seq(&mut p.raw, delta);
                    self.link.backend.write_all(&p.raw).await?;
                }
            }
        }
    }

    async fn command_loop(&mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        let idle = self.shared.config.idle_timeout;
        self.info.set_busy(false);
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            tokio::select! {
                biased;
                c = self.link.client.fill_to(4) => c?,
                _ = shutdown.changed() => return Ok(()),
                _ = sleep_or_forever(idle) => {
                    info!(peer = %self.peer, id = self.backend_id, "idle timeout");
                    return Ok(());
                }
            };
            // The rest of the command gets the idle timeout too.
            let command = if idle.is_zero() {
                self.read_command().await?
            } else {
                match tokio::time::timeout(idle, self.read_command()).await {
                    Ok(c) => c?,
                    Err(_) => {
                        info!(peer = %self.peer, id = self.backend_id, "idle timeout inside a command");
                        return Ok(());
                    }
                }
            };
            let Some(command) = command else {
                return Ok(());
            };
            self.info.set_busy(true);
            let more = self.command(command).await;
            self.info.set_busy(false);
            if !more? {
                return Ok(());
            }
        }
    }

    /// Reads the next command, refusing one that reaches the packet limit as the
    /// server does: ERR 1153 (SQLSTATE 08S01) in place of the rest, then the
    /// connection closes (`None`). The limit is checked before each physical packet's
    /// payload is read, so at most the limit is buffered.
    async fn read_command(&mut self) -> Result<Option<Logical>> {
        loop {
            let (limit, known) = match (self.shared.config.max_client_packet, self.packet_limit) {
                (Some(n), _) => (usize::try_from(n).unwrap_or(usize::MAX), true),
                (None, Some(n)) => (n, true),
                (None, None) => (LEARN_PACKET_LIMIT_AT, false),
            };
            match self.link.client.read_logical_max(limit).await? {
                Framed::Whole(c) => return Ok(Some(c)),
                Framed::TooLarge { .. } if !known => {
                    self.packet_limit = Some(self.learn_packet_limit().await?);
                }
                Framed::TooLarge { seq } => {
                    info!(
                        peer = %self.peer,
                        id = self.backend_id,
                        limit,
                        "client command reached max_allowed_packet: refused, closing"
                    );
                    let err = packets::err_payload(
                        1153,
                        b"08S01",
                        "Got a packet bigger than 'max_allowed_packet' bytes",
                    );
                    self.link.client.buf = bytes::BytesMut::new();
                    self.link
                        .client
                        .write_packet(seq.wrapping_add(1), &err)
                        .await?;
                    self.link.client.shutdown().await;
                    self.link.client.discard_input(DISCARD_AFTER_REFUSAL).await;
                    return Ok(None);
                }
            }
        }
    }

    /// Asks the backend session for its `max_allowed_packet` (fixed for the session:
    /// the server makes the session value read-only). Falls back to the server's
    /// maximum when the answer is not a number.
    async fn learn_packet_limit(&mut self) -> Result<usize> {
        let c = self.run_collect(b"SELECT @@max_allowed_packet").await?;
        let value = c
            .packets
            .get(c.text_rows(self.link.deprecate_eof).start)
            .filter(|_| c.err().is_none() && !c.text_rows(self.link.deprecate_eof).is_empty())
            .and_then(|p| crate::wire::resultset::text_cells(&p.payload))
            .and_then(|cells| cells.first().copied().flatten())
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok());
        match value {
            Some(n) => {
                debug!(peer = %self.peer, id = self.backend_id, max_allowed_packet = n, "learned the packet limit");
                Ok(n)
            }
            None => {
                warn!(peer = %self.peer, id = self.backend_id, "the backend did not report max_allowed_packet; the proxy refuses only commands of 1 GiB or more");
                Ok(PACKET_LIMIT_FALLBACK)
            }
        }
    }

    /// Handles one client command; Ok(false) ends the session.
    async fn command(&mut self, c: Logical) -> Result<bool> {
        let Some(code) = c.first_byte() else {
            return Err(Error::client("empty command packet"));
        };
        if code != cmd::QUERY && code != cmd::STMT_PREPARE {
            self.state.before_command();
        }
        // Commands that leave the server's diagnostics alone keep them.
        let merged_warnings = match code {
            cmd::PING | cmd::STMT_CLOSE | cmd::STMT_RESET | cmd::STMT_SEND_LONG_DATA => None,
            _ => self.merged_warnings.take(),
        };
        self.restore_pending_insert_id(code, &c).await?;
        let kind = match code {
            cmd::QUERY => return self.query(c, merged_warnings).await.map(|_| true),
            cmd::STMT_PREPARE => return self.prepare(c).await.map(|_| true),
            cmd::QUIT => {
                self.link.backend.write_all(&c.raw).await?;
                return Ok(false);
            }
            cmd::STMT_CLOSE => {
                if let Some(id) = statement_id(&c.payload()) {
                    self.stmt_digests.remove(&id);
                    self.shadow_prepared.remove(&id);
                    if self.close_rewrite(id).await? {
                        return Ok(true);
                    }
                }
                self.link.backend.write_all(&c.raw).await?;
                return Ok(true);
            }
            cmd::STMT_SEND_LONG_DATA => {
                if let Some(id) = statement_id(&c.payload()) {
                    if let Some(p) = self.prepared.get_mut(&id) {
                        // No response is allowed: buffered for the next execute.
                        p.long_data.add(&c.payload());
                        return Ok(true);
                    }
                }
                self.link.backend.write_all(&c.raw).await?;
                return Ok(true);
            }
            cmd::STMT_EXECUTE => return self.stmt_execute(&c).await.map(|_| true),
            cmd::STMT_RESET => {
                // Discards the statement's long data, as on the server.
                if let Some(p) =
                    statement_id(&c.payload()).and_then(|id| self.prepared.get_mut(&id))
                {
                    p.long_data = Default::default();
                }
                ResponseKind::Single
            }
            cmd::CHANGE_USER => return self.change_user(&c).await.map(|_| true),
            cmd::PROCESS_INFO => ResponseKind::Generic,
            cmd::STMT_BULK_EXECUTE => {
                if let Some(id) = statement_id(&c.payload()) {
                    if let Some(p) = self.prepared.get(&id) {
                        let msg = format!("heatsink rule '{}': {BULK_REFUSED}", p.rule);
                        self.execute_refused(id, BULK_REFUSED, crate::rewrite::RefusalClass::Shape);
                        self.link
                            .client
                            .write_packet(
                                c.last_seq.wrapping_add(1),
                                &err_of(errors::UNKNOWN, &msg),
                            )
                            .await?;
                        return Ok(true);
                    }
                    self.shadow_bulk(id);
                }
                ResponseKind::Generic
            }
            cmd::STMT_FETCH => ResponseKind::Fetch,
            cmd::FIELD_LIST => ResponseKind::FieldList,
            cmd::INIT_DB
            | cmd::PING
            | cmd::STATISTICS
            | cmd::RESET_CONNECTION
            | cmd::SET_OPTION
            | cmd::REFRESH
            | cmd::PROCESS_KILL
            | cmd::DEBUG
            | cmd::SHUTDOWN
            | cmd::CREATE_DB
            | cmd::DROP_DB => ResponseKind::Single,
            other => {
                // Replication and other streaming commands: the relay cannot follow
                // their framing, so the connection becomes a plain byte pipe.
                debug!(peer = %self.peer, command = other, "unmodelled command: switching to raw pipe");
                self.link.backend.write_all(&c.raw).await?;
                self.link.raw_pipe().await?;
                return Ok(false);
            }
        };
        self.forward(&c).await?;
        let r = self.relay_response(kind, 0, c.last_seq).await?;
        self.after_command(code, &c, r.parser.errored).await?;
        Ok(true)
    }

    /// Before a command: restores the LAST_INSERT_ID() a merged write left pending
    /// on the backend session, unless the command starts the session afresh, cannot
    /// read it, or restores it itself once its statement is known.
    async fn restore_pending_insert_id(&mut self, code: u8, c: &Logical) -> Result<()> {
        if self.pending_insert_id.is_none() {
            return Ok(());
        }
        match code {
            // Both start the session afresh.
            cmd::CHANGE_USER | cmd::RESET_CONNECTION => self.pending_insert_id = None,
            // Restored once the statement is known (a merged ring insert sets it
            // anew); the others cannot read it.
            cmd::QUERY | cmd::QUIT | cmd::PING => {}
            cmd::STMT_EXECUTE
                if statement_id(&c.payload())
                    .and_then(|id| self.prepared.get(&id))
                    .is_some_and(|p| p.merge.is_some()) => {}
            _ => self.restore_insert_id().await?,
        }
        Ok(())
    }

    /// COM_STMT_EXECUTE: runs the plan made at prepare time for a rewritten
    /// statement, else forwards the command and relays its response.
    async fn stmt_execute(&mut self, c: &Logical) -> Result<()> {
        self.info.count_statement();
        let started = Instant::now();
        let digesting = self.shared.digests.enabled();
        if digesting {
            self.outcome = Outcome::default();
        }
        let r = self.run_execute(c).await;
        if digesting {
            self.end_execute_digest(&c.payload(), started, r.is_err());
        }
        r
    }

    async fn run_execute(&mut self, c: &Logical) -> Result<()> {
        if let Some(id) = statement_id(&c.payload()) {
            if let Some(p) = self.prepared.get(&id) {
                // Executes the plan made at prepare time, whatever rule set is
                // in force now.
                let rule = p.rule.clone();
                let started = Instant::now();
                self.answered_error = false;
                self.execute_not_rewritten = false;
                self.declined = None;
                self.rewrite_names = self.shared.engine.load().message_names();
                let mut r = self.execute_rewrite(id, c).await;
                if let (Ok(()), Some(reason)) = (&r, self.declined.take()) {
                    // Declined in a path that ran it as text (`run_alone`).
                    self.execute_fell_back(id, reason);
                    r = self.execute_as_sent(id, c).await;
                }
                if !self.execute_not_rewritten {
                    self.record_rewrite(&rule, started, r.is_err());
                }
                r?;
                return Ok(());
            }
        }
        let started = Instant::now();
        if !self.shadow_prepared.is_empty() {
            self.shadow_execute(&c.payload());
        }
        if self.state.lexing_prepared {
            self.state.lexing = None;
        }
        self.forward(c).await?;
        self.relay_response(ResponseKind::execute(&c.payload()), 0, c.last_seq)
            .await?;
        self.shared.stats.backend_latency.observe(started.elapsed());
        Ok(())
    }

    /// Shadow mode: checks the parameter values of an execute of a statement the
    /// rule would have rewritten, and lists the execute in `SHOW REFUSALS` (or `SHOW
    /// FALLBACKS`, for a check that declines) when the rule would have refused it
    /// (or run it as sent). The execute itself is forwarded unchanged.
    fn shadow_execute(&mut self, payload: &[u8]) {
        let Some(id) = statement_id(payload) else {
            return;
        };
        let charset = self.state.lexing.map(|l| l.charset);
        let Some(p) = self.shadow_prepared.get_mut(&id) else {
            return;
        };
        let Some(v) = check_params(payload, p.params, &mut p.types, &p.checks, charset) else {
            return;
        };
        let table = self.shared.rules.load();
        let stats = table.get(&p.rule);
        let shapes = &self.shared.shapes;
        if v.declines && p.runs_unread {
            if let Some(r) = stats {
                r.fallbacks.fetch_add(1, Relaxed);
            }
            shapes.fell_back(&Seen {
                rule: &p.rule,
                reason: &v.reason,
                class: None,
                shadow: false,
                sql: &p.text,
                mode: p.mode,
            });
        } else {
            if let Some(r) = stats {
                r.shadow_rejects.fetch_add(1, Relaxed);
            }
            let reason = format!("{} cannot be rewritten with MariaDB's meaning", v.reason);
            debug!(peer = %self.peer, rule = %p.rule, reason = %reason, "shadow: the rule would reject this execute");
            shapes.refused(&Seen {
                rule: &p.rule,
                reason: &reason,
                class: Some(crate::rewrite::RefusalClass::Value),
                shadow: true,
                sql: &p.text,
                mode: p.mode,
            });
        }
    }

    /// Shadow mode: a COM_STMT_BULK_EXECUTE of a statement the rule would have
    /// rewritten is forwarded unchanged, and listed in `SHOW REFUSALS` as the rule
    /// would have refused it ([`BULK_REFUSED`]), under the prepared text.
    fn shadow_bulk(&mut self, id: u32) {
        let Some(p) = self.shadow_prepared.get(&id) else {
            return;
        };
        if let Some(r) = self.shared.rules.load().get(&p.rule) {
            r.shadow_rejects.fetch_add(1, Relaxed);
        }
        debug!(peer = %self.peer, rule = %p.rule, "shadow: the rule would reject this bulk execute");
        self.shared.shapes.refused(&Seen {
            rule: &p.rule,
            reason: BULK_REFUSED,
            class: Some(crate::rewrite::RefusalClass::Shape),
            shadow: true,
            sql: &p.text,
            mode: p.mode,
        });
    }

    /// An execute of the prepared rewrite `id` refused (ERR 1105) for `reason` (no
    /// value in it): listed in `SHOW REFUSALS` under the prepared text, counted in
    /// its digest as refused and in the rule's `rejected` (as a refused statement is).
    pub(super) fn execute_refused(
        &mut self,
        id: u32,
        reason: &str,
        class: crate::rewrite::RefusalClass,
    ) {
        let Some(p) = self.prepared.get(&id) else {
            return;
        };
        self.count_refused(&Seen {
            rule: &p.rule,
            reason,
            class: Some(class),
            shadow: false,
            sql: &p.text,
            mode: p.mode,
        });
        self.execute_not_rewritten = true;
        self.outcome.decided = Some(crate::digest::Handling::Refused);
    }

    /// A refusal decided while the statement ran (at execute): the rule's
    /// `rejected`, the global count, and `SHOW REFUSALS`.
    fn count_refused(&self, seen: &Seen<'_>) {
        self.shared.stats.rejected.fetch_add(1, Relaxed);
        if let Some(r) = self.shared.rules.load().get(seen.rule) {
            r.rejected.fetch_add(1, Relaxed);
        }
        debug!(peer = %self.peer, rule = %seen.rule, class = ?seen.class, reason = seen.reason, "statement refused while it ran");
        self.shared.shapes.refused(seen);
    }

    /// An execute of the prepared rewrite `id` that runs the client's own statement
    /// instead, for `reason`: listed in `SHOW FALLBACKS`, counted in its digest as a
    /// fallback.
    pub(super) fn execute_fell_back(&mut self, id: u32, reason: &str) {
        self.execute_not_rewritten = true;
        let Some(p) = self.prepared.get(&id) else {
            return;
        };
        self.shared.shapes.fell_back(&Seen {
            rule: &p.rule,
            reason,
            class: None,
            shadow: false,
            sql: &p.text,
            mode: p.mode,
        });
        self.outcome.decided = Some(crate::digest::Handling::Fallback);
    }

    /// COM_CHANGE_USER: forgets the session's state and relays the authentication.
    async fn change_user(&mut self, c: &Logical) -> Result<bool> {
        self.prepared.clear();
        self.state.lexing = None;
        self.state.lexing_prepared = false;
        // The new session takes the server's global value again.
        self.packet_limit = None;
        self.link.backend.write_all(&c.raw).await?;
        self.set_current_db(change_user_db(&c.payload()));
        // The new user's session has the server's tracking settings; its identity
        // is not the handshake's: it stays out of group commit.
        self.changed_user = true;
        self.state.tracking_stopped();
        self.stmt_digests.clear();
        self.shadow_prepared.clear();
        if let Some(user) = change_user_name(&c.payload()) {
            self.info.set_user(&user);
            self.user = user;
        }
        self.auth_exchange(0).await
    }

    /// After a relayed COM_RESET_CONNECTION or COM_INIT_DB (`errored`: the server
    /// answered ERR): the session state they reset or change.
    async fn after_command(&mut self, code: u8, c: &Logical, errored: bool) -> Result<()> {
        if code == cmd::RESET_CONNECTION {
            // Character set and sql_mode are the connection's defaults again.
            self.state.lexing = None;
            self.state.lexing_prepared = false;
        }
        if code == cmd::RESET_CONNECTION && !errored {
            self.prepared.clear();
            self.stmt_digests.clear();
            self.shadow_prepared.clear();
            self.packet_limit = None;
            // Everything but the database is the connection's default again, the
            // proxy's tracking settings too. After COM_CHANGE_USER the session's
            // identity is not the handshake's: it stays out of group commit.
            self.state.reset();
            if !self.changed_user {
                self.start_tracking().await?;
            }
        }
        if code == cmd::INIT_DB && !errored {
            self.set_current_db(Some(
                String::from_utf8_lossy(&c.payload()[1..]).into_owned(),
            ));
        }
        Ok(())
    }

    async fn forward(&mut self, c: &Logical) -> Result<()> {
        self.link.backend.write_all(&c.raw).await
    }

    pub(super) fn context<'a>(&'a self, prepared: bool) -> StatementContext<'a> {
        StatementContext {
            prepared,
            in_transaction: self.state.status & status::IN_TRANS != 0,
            current_db: self.state.current_db.as_deref(),
            lexing: self.state.lexing,
            share: self.state.node_share,
        }
    }

    /// Keeps the default database and the admin port's view of it in step.
    fn set_current_db(&mut self, db: Option<String>) {
        self.state.set_db(db);
        self.sync_db();
    }

    /// Shows the admin port a default database the server reported changed.
    pub(super) fn sync_db(&mut self) {
        if let Some(db) = self.state.take_db_change() {
            self.info.set_db(db);
        }
    }

    /// An OK-shaped packet from the backend as the client is to see it (session
    /// state information it did not ask for removed), learning what it reports.
    pub(super) fn client_packet(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        let ok_shaped = match payload.first() {
            Some(&packets::OK) => true,
            Some(&packets::EOF) => self.link.deprecate_eof && payload.len() > 5,
            _ => false,
        };
        let tracked = ok_shaped
            && packets::parse_ok(payload)
                .is_some_and(|o| o.status & packets::SESSION_STATE_CHANGED != 0);
        let own = tracked
            .then(|| self.state.tracked_ok(payload, true))
            .flatten();
        self.sync_db();
        own
    }

    /// Shadow mode: counts and logs what the rule would have done with a statement
    /// that is forwarded unchanged. The rewritten SQL holds literal values, so it is
    /// logged at debug level only.
    fn shadowed(&self, would: &Decision) {
        let table = self.shared.rules.load();
        match would {
            Decision::Rewrite(rw) => {
                if let Some(r) = table.get(&rw.rule) {
                    r.shadow_rewrites.fetch_add(1, Relaxed);
                }
                if tracing::enabled!(tracing::Level::DEBUG) {
                    debug!(
                        peer = %self.peer,
                        rule = %rw.rule,
                        rewritten = ?self.loggable(&rw.statements),
                        "shadow: the rule would rewrite this statement"
                    );
                }
            }
            Decision::Reject(rej) => {
                if let Some(r) = table.get(&rej.rule) {
                    r.shadow_rejects.fetch_add(1, Relaxed);
                }
                debug!(peer = %self.peer, rule = %rej.rule, class = %rej.class, reason = %rej.reason, "shadow: the rule would reject this statement");
            }
            _ => {}
        }
    }

    /// Shows a refused statement (also one a rule in shadow mode would refuse) in
    /// `SHOW REFUSALS`, a rule's fallback in `SHOW FALLBACKS`, by shape: read under
    /// the settings the decision was made under.
    fn record_shape(&self, d: &Decision, sql: &[u8]) {
        let mode = self.shape_mode();
        let shapes = &self.shared.shapes;
        let refused = |r: &crate::rewrite::Rejection, shadow| {
            shapes.refused(&Seen {
                rule: &r.rule,
                reason: &r.reason,
                class: Some(r.class),
                shadow,
                sql,
                mode,
            });
        };
        match d {
            Decision::Reject(r) => refused(r, false),
            Decision::Shadow(would) => {
                if let Decision::Reject(r) = &**would {
                    refused(r, true);
                }
            }
            Decision::Fallback(f) => shapes.fell_back(&Seen {
                rule: &f.rule,
                reason: &f.reason,
                class: None,
                shadow: false,
                sql,
                mode,
            }),
            _ => {}
        }
    }

    /// How [`Seen::sql`] is read: under the session's `sql_mode`, unless its
    /// character set is one the lexer cannot read.
    pub(super) fn shape_mode(&self) -> Option<crate::rewrite::LexMode> {
        let lexing = self.state.lexing.unwrap_or_default();
        (lexing.charset.class != crate::rewrite::CharsetClass::Refused).then_some(lexing.mode)
    }

    /// Rewritten statements as logs may show them: with their literal values only
    /// when `log_literals` is on, otherwise fingerprinted (literals as `?`).
    fn loggable(&self, statements: &[Vec<u8>]) -> Vec<String> {
        statements
            .iter()
            .map(|s| {
                if self.shared.config.log_literals {
                    String::from_utf8_lossy(s).into_owned()
                } else {
                    crate::rewrite::fingerprint_in(s, self.state.lexing.unwrap_or_default().mode)
                }
            })
            .collect()
    }

    /// Per-rule and global accounting of one rewritten statement.
    fn record_rewrite(&self, rule: &str, started: Instant, failed: bool) {
        let took = started.elapsed();
        self.shared.stats.rewrite_latency.observe(took);
        if let Some(r) = self.shared.rules.load().get(rule) {
            r.record_rewrite(took, failed || self.answered_error);
        }
    }

    /// What to do with the text of a COM_QUERY or COM_STMT_PREPARE: tracks whether
    /// the session leaves its default state, answers rules' metadata questions, and
    /// counts shadow decisions. `None`: the client has been answered already.
    async fn statement_decision(
        &mut self,
        engine: &Engine,
        c: &Logical,
        prepared: bool,
    ) -> Result<Option<Decision>> {
        let sql = c.payload();
        let sql = &sql[1..];
        // What the statement may do to the session that the server does not
        // report (user variables, locks, dynamic SQL, …), before it runs.
        self.state.before_statement(sql);
        let decision = if engine.has_rules() {
            self.decide(engine, sql, prepared, c.last_seq).await?
        } else {
            Some(Decision::Passthrough)
        };
        if let Some(d) = &decision {
            self.record_shape(d, sql);
        }
        // After the decision, which read the statement under the settings in force
        // before it (and may just have learned them): it runs under those, and may
        // change them for the statements after it.
        if prepared {
            if !self.state.lexing_prepared && crate::rewrite::may_change_lexing(sql) {
                self.state.lexing_prepared = true;
            }
        } else if self.state.lexing.is_some() && crate::rewrite::may_change_lexing(sql) {
            self.state.lexing = None;
        }
        match &decision {
            Some(Decision::Shadow(would)) => self.shadowed(would),
            Some(Decision::Fallback(f)) => {
                if let Some(r) = self.shared.rules.load().get(&f.rule) {
                    r.fallbacks.fetch_add(1, Relaxed);
                }
            }
            _ => {}
        }
        Ok(decision)
    }

    /// A COM_QUERY; `merged_warnings`: see [`Session::merged_warnings`].
    async fn query(&mut self, c: Logical, merged_warnings: Option<Vec<Vec<u8>>>) -> Result<()> {
        self.info.count_statement();
        let started = Instant::now();
        let digest = self.begin_digest(&c.payload()[1..]);
        let r = self.run_query(&c, merged_warnings, started).await;
        if let Some(hash) = digest {
            self.end_digest(&c.payload()[1..], hash, started, r.is_err());
        }
        r
    }

    /// Fingerprints a client statement for its digest (before it runs, under the
    /// settings it is read under); `None` when digests are off.
    fn begin_digest(&mut self, sql: &[u8]) -> Option<u64> {
        if !self.shared.digests.enabled() {
            return None;
        }
        self.outcome = Outcome::default();
        let mode = self.shape_mode();
        Some(self.digester.digest(sql, mode).hash)
    }

    /// Counts a finished COM_QUERY in its digest.
    fn end_digest(&mut self, sql: &[u8], hash: u64, started: Instant, failed: bool) {
        let at = Instant::now();
        if self.outcome.skip {
            return;
        }
        let hot = self.digester.hot(sql);
        let hot = hot
            .as_ref()
            .and_then(|h| Some((&*h.column, &**h.literal.as_ref()?)));
        let o = &self.outcome;
        let error = o.err.or(failed.then_some(errors::SERVER_LOST.0));
        let digester = &self.digester;
        self.shared.digests.record(
            &crate::digest::Sample {
                hash,
                schema: self.state.current_db.as_deref(),
                user: &self.user,
                took: at.saturating_duration_since(started),
                at,
                rows_sent: o.rows,
                rows_affected: o.affected,
                error,
                handling: o.handling,
                rule: o.rule.as_ref(),
                hot,
            },
            || digester.text(sql),
        );
    }

    /// Notes how the current statement is handled, for its digest.
    fn note_handling(&mut self, d: &Decision) {
        use crate::digest::Handling;
        let (h, rule) = match d {
            Decision::Rewrite(rw) => (Handling::Rewritten, Some(rw.rule.clone())),
            Decision::Reject(r) => (Handling::Refused, Some(r.rule.clone())),
            Decision::Fallback(f) => (Handling::Fallback, Some(f.rule.clone())),
            Decision::Shadow(would) => (
                Handling::Shadow,
                match &**would {
                    Decision::Rewrite(rw) => Some(rw.rule.clone()),
                    Decision::Reject(r) => Some(r.rule.clone()),
                    _ => None,
                },
            ),
            _ => (Handling::Passthrough, None),
        };
        self.outcome.handling = h;
        self.outcome.rule = rule;
    }

    async fn run_query(
        &mut self,
        c: &Logical,
        merged_warnings: Option<Vec<Vec<u8>>>,
        started: Instant,
    ) -> Result<()> {
        let engine = self.shared.engine.load_full();
        let Some(decision) = self.statement_decision(&engine, c, false).await? else {
            self.outcome.skip = true;
            return Ok(());
        };
        self.note_handling(&decision);
        match decision {
            Decision::Passthrough
            | Decision::Fallback(_)
            | Decision::NeedMetadata(_)
            | Decision::Shadow(_)
            | Decision::NeedSessionState => {
                self.shared.stats.passthrough.fetch_add(1, Relaxed);
                // Without rules nothing happened since `started`: save a clock read.
                let forwarded = if engine.has_rules() {
                    Instant::now()
                } else {
                    started
                };
                self.restore_insert_id().await?;
                if self.rewrite_names.is_some() || merged_warnings.is_some() {
                    if let Some(d) = diagnostics_statement(&c.payload()[1..]) {
                        // The warnings and errors of a rewritten statement, as they
                        // would have named the logical table; after a merged write,
                        // this session's own.
                        let r = self
                            .relay_diagnostics(c, d, merged_warnings.as_deref())
                            .await;
                        self.merged_warnings = merged_warnings;
                        return r;
                    }
                }
                self.forward(c).await?;
                let r = self
                    .relay_response(ResponseKind::Generic, 0, c.last_seq)
                    .await?;
                self.shared
                    .stats
                    .backend_latency
                    .observe(forwarded.elapsed());
                if !r.parser.errored {
                    if let Some(db) = use_statement_db(&c.payload()[1..]) {
                        self.set_current_db(Some(db));
                    }
                }
                Ok(())
            }
            Decision::Reject(rej) => self.reject(&rej, c.last_seq).await,
            Decision::Rewrite(rw) => {
                self.shared.stats.rewritten.fetch_add(1, Relaxed);
                if tracing::enabled!(tracing::Level::DEBUG) {
                    debug!(
                        peer = %self.peer,
                        rule = %rw.rule,
                        fingerprint = %crate::rewrite::fingerprint_in(
                            &c.payload()[1..],
                            self.state.lexing.unwrap_or_default().mode
                        ),
                        rewritten = ?self.loggable(&rw.statements),
                        "statement rewritten"
                    );
                }
                let rule = rw.rule.clone();
                self.answered_error = false;
                self.fell_back = None;
                self.declined = None;
                self.rewrite_names = engine.message_names();
                let mut r = self.run_rewrite(rw, c.last_seq).await;
                if let (Ok(()), Some(reason)) = (&r, self.declined.take()) {
                    r = self
                        .run_original(&c.payload()[1..], reason, c.last_seq)
                        .await;
                }
                if let Some(reason) = self.fell_back {
                    self.outcome.handling = crate::digest::Handling::Fallback;
                    if let Some(stats) = self.shared.rules.load().get(&rule) {
                        stats.fallbacks.fetch_add(1, Relaxed);
                    }
                    self.shared.shapes.fell_back(&Seen {
                        rule: &rule,
                        reason,
                        class: None,
                        shadow: false,
                        sql: &c.payload()[1..],
                        mode: self.shape_mode(),
                    });
                } else {
                    self.record_rewrite(&rule, started, r.is_err());
                }
                r
            }
        }
    }

    async fn prepare(&mut self, c: Logical) -> Result<()> {
        let engine = self.shared.engine.load_full();
        let digest = self.begin_digest(&c.payload()[1..]);
        if let Some(hash) = digest {
            // Counted in its digest's `prepares`, whatever its answer.
            let sql = &c.payload()[1..];
            let digester = &self.digester;
            self.shared.digests.record_prepare(
                hash,
                self.state.current_db.as_deref(),
                &self.user,
                Instant::now(),
                || digester.text(sql),
            );
        }
        let Some(decision) = self.statement_decision(&engine, &c, true).await? else {
            return Ok(());
        };
        self.note_handling(&decision);
        // A rule in shadow mode that would check the parameter values of each execute.
        let shadow_plan = match &decision {
            Decision::Shadow(would) => match &**would {
                Decision::Rewrite(rw) if !rw.param_checks.is_empty() => {
                    Some((rw.rule.clone(), rw.param_checks.clone()))
                }
                _ => None,
            },
            _ => None,
        };
        match decision {
            Decision::Passthrough
            | Decision::Fallback(_)
            | Decision::NeedMetadata(_)
            | Decision::Shadow(_)
            | Decision::NeedSessionState => {
                self.forward(&c).await?;
                let r = self
                    .relay_response(ResponseKind::Prepare, 0, c.last_seq)
                    .await?;
                if let (Some(hash), Some(ok)) = (digest, r.parser.prepare_ok) {
                    self.keep_stmt_digest(&c.payload()[1..], hash, ok.statement_id, ok.params);
                }
                if let (Some((rule, checks)), Some(ok)) = (shadow_plan, r.parser.prepare_ok) {
                    let shadow = ShadowPrepared {
                        runs_unread: engine.rule_runs_unread(&rule),
                        rule,
                        checks,
                        params: usize::from(ok.params),
                        types: None,
                        text: Arc::from(&c.payload()[1..]),
                        mode: self.shape_mode(),
                    };
                    self.shadow_prepared.insert(ok.statement_id, shadow);
                }
                Ok(())
            }
            Decision::Reject(rej) => self.reject(&rej, c.last_seq).await,
            Decision::Rewrite(rw) => {
                self.shared.stats.rewritten.fetch_add(1, Relaxed);
                self.last_prepared = None;
                let params = rw.param_map.as_ref().map_or(0, Vec::len);
                let r = self.prepare_rewrite(rw, &c).await;
                if let (Some(hash), Some(id)) = (digest, self.last_prepared.take()) {
                    let params = self.prepared.get(&id).map_or(params, |p| p.client_params);
                    self.keep_stmt_digest(&c.payload()[1..], hash, id, params as u16);
                }
                r
            }
        }
    }

    /// Keeps the digest of a statement just prepared (the digester still holds it)
    /// for its executes.
    fn keep_stmt_digest(&mut self, sql: &[u8], hash: u64, id: u32, params: u16) {
        let hot = self
            .digester
            .hot(sql)
            .and_then(|h| Some((Arc::from(&*h.column), h.param?)));
        let d = StmtDigest {
            hash,
            text: self.digester.text(sql).into(),
            handling: self.outcome.handling,
            rule: self.outcome.rule.clone(),
            hot,
            params: usize::from(params),
            types: Vec::new(),
        };
        self.stmt_digests.insert(id, d);
    }

    /// Counts a finished COM_STMT_EXECUTE in its prepared statement's digest.
    fn end_execute_digest(&mut self, payload: &[u8], started: Instant, failed: bool) {
        let at = Instant::now();
        let Some(d) = statement_id(payload).and_then(|id| self.stmt_digests.get_mut(&id)) else {
            return;
        };
        let value = &mut self.param_value;
        let hot = match &d.hot {
            Some((col, n))
                if crate::digest::execute_param(payload, d.params, &mut d.types, *n, value) =>
            {
                Some((&**col, value.as_slice()))
            }
            _ => None,
        };
        let o = &self.outcome;
        let error = o.err.or(failed.then_some(errors::SERVER_LOST.0));
        self.shared.digests.record(
            &crate::digest::Sample {
                hash: d.hash,
                schema: self.state.current_db.as_deref(),
                user: &self.user,
                took: at.saturating_duration_since(started),
                at,
                rows_sent: o.rows,
                rows_affected: o.affected,
                error,
                handling: o.decided.unwrap_or(d.handling),
                rule: d.rule.as_ref(),
                hot,
            },
            || d.text.to_string(),
        );
    }

    /// Answers a rejected statement with ERR 1105 naming the rule.
    pub(super) async fn reject(
        &mut self,
        rej: &crate::rewrite::Rejection,
        cmd_seq: u8,
    ) -> Result<()> {
        self.shared.stats.rejected.fetch_add(1, Relaxed);
        self.outcome.err = Some(errors::UNKNOWN.0);
        if let Some(r) = self.shared.rules.load().get(&rej.rule) {
            r.rejected.fetch_add(1, Relaxed);
        }
        debug!(peer = %self.peer, rule = %rej.rule, class = %rej.class, reason = %rej.reason, "statement rejected");
        self.link
            .client
            .write_packet(
                cmd_seq.wrapping_add(1),
                &err_of(errors::UNKNOWN, &rej.message()),
            )
            .await?;
        Ok(())
    }

    /// Streams one response from the backend to the client, forwarding complete
    /// packets in bulk straight out of the read buffer. `shift` is added to every
    /// sequence id (non-zero only when the command sent differs from the client's).
    /// If the backend fails before anything was forwarded, the client gets a 1158 ERR
    /// (sequence after `cmd_seq`) instead of a hang.
    pub(super) async fn relay_response(
        &mut self,
        kind: ResponseKind,
        shift: u8,
        cmd_seq: u8,
    ) -> Result<Relayed> {
        let mut parser = ResponseParser::new(kind, self.link.deprecate_eof);
        let mut sent_any = false;
        let res = self
            .link
            .relay(&mut parser, shift, &mut sent_any, &mut self.state)
            .await;
        self.sync_db();
        match res {
            Ok(()) => {
                if let Some(st) = parser.last_status {
                    self.state.set_status(st);
                }
                if parser.errored {
                    self.backend_error();
                }
                self.outcome.rows += parser.rows;
                self.outcome.affected += parser.affected;
                self.outcome.err = parser.err_code;
                Ok(Relayed { parser })
            }
            Err(e) => {
                if e.source == Source::Backend {
                    self.backend_error();
                }
                // A backend that closed the connection: the client's closes too, with
                // nothing sent, as when the server closes it directly (client
                // libraries then report 2013 and reconnect logic recognises it). A
                // backend that sent what the relay cannot follow: an ERR.
                if e.source == Source::Backend && !sent_any && !e.is_disconnect() {
                    let msg = "Lost connection to MySQL server during query";
                    let _ = self
                        .link
                        .client
                        .write_packet(cmd_seq.wrapping_add(1), &err_of(errors::SERVER_LOST, msg))
                        .await;
                }
                Err(e)
            }
        }
    }

    /// Reads one whole response without forwarding it (steps of a rewrite).
    pub(super) async fn collect_response(
        &mut self,
        kind: ResponseKind,
    ) -> Result<(ResponseParser, Vec<Packet>)> {
        let (parser, pkts) = self.link.collect(kind, &mut self.state).await?;
        self.sync_db();
        if let Some(st) = parser.last_status {
            self.state.set_status(st);
        }
        if parser.errored {
            self.backend_error();
        }
        Ok((parser, pkts))
    }

    /// Counts a backend error response (globally, and for the rewrite in progress).
    fn backend_error(&mut self) {
        self.shared.stats.backend_errors.fetch_add(1, Relaxed);
        self.answered_error = true;
    }
}

async fn sleep_or_forever(d: Duration) {
    if d.is_zero() {
        std::future::pending::<()>().await
    } else {
        tokio::time::sleep(d).await
    }
}

/// Sets a capability bit in a handshake response's payload.
fn set_capability(payload: &mut [u8], bit: u32) {
    if let Some(b) = payload.get_mut(0..4) {
        let c = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) | bit;
        b.copy_from_slice(&c.to_le_bytes());
    }
}

/// The statement id of a COM_STMT_* payload.
fn statement_id(payload: &[u8]) -> Option<u32> {
    let b = payload.get(1..5)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// `SHOW WARNINGS` or `SHOW ERRORS`, with its LIMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Diagnostics {
    /// SHOW ERRORS: only rows of level `Error`.
    pub errors_only: bool,
    /// LIMIT offset.
    pub offset: usize,
    /// LIMIT row count.
    pub limit: Option<usize>,
}

/// Whether a statement is `SHOW WARNINGS` or `SHOW ERRORS` (`LIMIT [offset,] n`).
fn diagnostics_statement(sql: &[u8]) -> Option<Diagnostics> {
    // Asked of every statement a session sends after a rewrite: reject early.
    let s = sql.trim_ascii_start();
    if s.len() < 4 || !s[..4].eq_ignore_ascii_case(b"show") || s.len() > 96 {
        return None;
    }
    let text = String::from_utf8_lossy(s).to_ascii_lowercase();
    let text = text.trim_end().trim_end_matches(';');
    let mut words = text.split_ascii_whitespace();
    if words.next() != Some("show") {
        return None;
    }
    let errors_only = match words.next() {
        Some("warnings") => false,
        Some("errors") => true,
        _ => return None,
    };
    let mut d = Diagnostics {
        errors_only,
        offset: 0,
        limit: None,
    };
    match words.next() {
        None => return Some(d),
        Some("limit") => {}
        Some(_) => return None,
    }
    let rest: String = words.collect();
    let numbers: Vec<usize> = rest
        .split(',')
        .map(|n| n.trim().parse().ok())
        .collect::<Option<_>>()?;
    match numbers[..] {
        [n] => d.limit = Some(n),
        [o, n] => (d.offset, d.limit) = (o, Some(n)),
        _ => return None,
    }
    Some(d)
}

/// The database named by a successful `USE db` statement, if this is one.
fn use_statement_db(sql: &[u8]) -> Option<String> {
    let s = sql.trim_ascii_start();
    if s.len() < 4 || !s[..3].eq_ignore_ascii_case(b"use") || !s[3].is_ascii_whitespace() {
        return None;
    }
    let name = s[4..].trim_ascii();
    let name = name.strip_suffix(b";").unwrap_or(name).trim_ascii();
    let name = match name {
        [b'`', inner @ .., b'`'] => String::from_utf8_lossy(inner).replace("``", "`"),
        _ => String::from_utf8_lossy(name).into_owned(),
    };
    (!name.is_empty()).then_some(name)
}

/// The user named in a COM_CHANGE_USER payload.
fn change_user_name(payload: &[u8]) -> Option<String> {
    let rest = payload.get(1..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// The database named in a COM_CHANGE_USER payload (user, auth data, database).
fn change_user_db(payload: &[u8]) -> Option<String> {
    let rest = payload.get(1..)?;
    let user_end = rest.iter().position(|&b| b == 0)?;
    let rest = &rest[user_end + 1..];
    let auth_len = *rest.first()? as usize;
    let rest = rest.get(1 + auth_len..)?;
    let db_end = rest.iter().position(|&b| b == 0)?;
    let db = &rest[..db_end];
    (!db.is_empty()).then(|| String::from_utf8_lossy(db).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_statements() {
        let d = |errors_only, offset, limit| {
            Some(Diagnostics {
                errors_only,
                offset,
                limit,
            })
        };
        for (sql, want) in [
            ("SHOW WARNINGS", d(false, 0, None)),
            ("show errors", d(true, 0, None)),
            (" SHOW  WARNINGS LIMIT 1;", d(false, 0, Some(1))),
            ("SHOW WARNINGS LIMIT 2, 3", d(false, 2, Some(3))),
            ("SHOW ERRORS limit 1,1", d(true, 1, Some(1))),
            ("SHOW WARNINGS;", d(false, 0, None)),
        ] {
            assert_eq!(diagnostics_statement(sql.as_bytes()), want, "{sql}");
        }
        for sql in [
            "SHOW COUNT(*) WARNINGS",
            "SHOW TABLES",
            "SELECT 1",
            "SHOW WARNINGSX",
            "SHOW WARNINGS LIMIT x",
        ] {
            assert_eq!(diagnostics_statement(sql.as_bytes()), None, "{sql}");
        }
    }

    #[test]
    fn use_statements() {
        assert_eq!(use_statement_db(b"  USE shop"), Some("shop".into()));
        assert_eq!(use_statement_db(b"use `my``db`;"), Some("my`db".into()));
        assert_eq!(use_statement_db(b"user_info"), None);
        assert_eq!(use_statement_db(b"SELECT 1"), None);
    }

    #[test]
    fn change_user_database() {
        let mut p = vec![cmd::CHANGE_USER];
        p.extend_from_slice(b"bob\0");
        p.push(3);
        p.extend_from_slice(&[1, 2, 3]);
        p.extend_from_slice(b"shop\0");
        p.extend_from_slice(&[45, 0]);
        assert_eq!(change_user_db(&p), Some("shop".into()));
        assert_eq!(change_user_db(&[cmd::CHANGE_USER]), None);
    }
}
