//! What the relay knows of its backend session's state, and the one question group
//! commit asks of it: may this session's statement run on another session's backend
//! connection ([`SessionState::merge_class`])?
//!
//! The server is the source of truth. Every backend connection negotiates
//! CLIENT_SESSION_TRACK, and a session that may take part in group commit runs
//! with `session_track_state_change = ON` and `session_track_system_variables =
//! '*'` (set by the proxy after authentication, [`TRACKING_SETUP`]). Then every OK
//! packet after a statement that changed session state says so, and names each
//! system variable changed with its new value, however the statement was spelt (a
//! versioned comment, `EXECUTE IMMEDIATE`, a stored function). What MariaDB 10.11
//! reports, measured statement by statement, is in docs/design.md ("Group commit and
//! session state"); where it reports nothing (user variables assigned by `:=`,
//! `SELECT … INTO`, `DO`; `FLUSH TABLES WITH READ LOCK`; `BACKUP STAGE`), the
//! statement's text is read conservatively ([`Hazards::scan`]).
//!
//! A session is in one of three conditions:
//! - *tracked and clean*: every state change since the connection started (or was
//!   reset) was a plain `SET` of system variables, whose new values the server
//!   reported; the values are kept, and sessions with equal values (and user,
//!   database, backend node) are equivalent for a merged write;
//! - *alone* for a reason ([`AloneReason`]): anything else happened — a change the
//!   server reported for another statement, a user variable, a table lock, dynamic
//!   SQL, a temporary table, a change of the tracking settings. Its writes run on its
//!   own connection until COM_RESET_CONNECTION starts the session afresh;
//! - outside a transaction in autocommit mode or not (the status flags of the last
//!   response): only the first may merge.
//!
//! What the client negotiated stays what it sees ([`ClientView`]): the tracking
//! information the proxy turned on for itself is stripped from OK packets for a
//! client that did not ask for CLIENT_SESSION_TRACK, and filtered down to what the
//! client's own settings would have reported for one that did.

use std::collections::BTreeMap;

use crate::rewrite::{Lexing, NodeShare};
use crate::wire::packets::SESSION_STATE_CHANGED;
use crate::wire::status;
use crate::wire::track::{self, Entry, TrackedOk};

/// Turns the server's tracking on for the proxy (after authentication and after
/// COM_RESET_CONNECTION, which resets it), for a client that does not track session
/// state itself.
pub const TRACKING_SETUP: &[u8] =
    b"SET SESSION session_track_system_variables = '*', session_track_state_change = ON";

/// The same for a client that negotiated CLIENT_SESSION_TRACK: its list of system
/// variables stays as it is, because the server orders a packet's variables by the
/// list in force (measured: `SET NAMES` reports `character_set_connection` first
/// under the default list and `character_set_client` first under `'*'`), and the
/// client must get the server's own packets. The proxy then learns the values of
/// the client's variables only, so any other change ends merging for the session.
pub const TRACKING_SETUP_KEEPING_VARIABLES: &[u8] = b"SET SESSION session_track_state_change = ON";

/// What a client that negotiated CLIENT_SESSION_TRACK had set before the proxy's
/// [`TRACKING_SETUP`], so that it is shown only what it asked for.
pub const CLIENT_TRACKING_QUERY: &[u8] =
    b"SELECT @@session.session_track_system_variables, @@session.session_track_state_change";

/// System variables the proxy itself sets with `SET STATEMENT … FOR` on merged
/// writes. The server reports them (the temporary value, and sometimes the restored
/// one with a later statement); they are left out of the session's values and of
/// what a client is shown. A session's own value of them only bounds how long a
/// statement waits, which a merged write bounds itself.
const PROXY_VARIABLES: [&[u8]; 3] = [
    b"lock_wait_timeout",
    b"innodb_lock_wait_timeout",
    b"wsrep_retry_autocommit",
];

/// Variables whose reported value does not stay the session's value: the server
/// consumes or resets them silently (`insert_id` is used up by the next insert),
/// or they are read by the statement after them. A session that sets one runs
/// alone.
const ONE_SHOT_VARIABLES: [&[u8]; 5] = [
    b"insert_id",
    b"last_insert_id",
    b"identity",
    b"rand_seed1",
    b"rand_seed2",
];

/// Why a write that could have merged ran alone (the `reason` label of
/// `heatsink_merge_alone_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AloneReason {
    /// Inside a transaction, or autocommit off.
    Transaction,
    /// The server reported a state change that is not a plain `SET` of system
    /// variables (a stored routine's, `SET @v`, `SET ROLE`, `SET STATEMENT`, …).
    SessionState,
    /// The session's statements use user variables.
    UserVariable,
    /// `LOCK TABLES`, `FLUSH …`, `BACKUP …`.
    TableLock,
    /// `CALL`, `EXECUTE`, `PREPARE`: statements the proxy does not see.
    DynamicSql,
    /// A temporary table (one may shadow a ruled table by name).
    TemporaryTable,
    /// The server does not track this session for the proxy (no merging rule when it
    /// started, tracking settings changed by the client, COM_CHANGE_USER).
    Untracked,
    /// A merged write could not get a lock within its bound; its members ran alone.
    LockTimeout,
    /// A merged write failed; its members ran alone so that only a statement that
    /// fails on its own gets an error.
    WriteFailed,
    /// The written table's triggers or column defaults may read the connection
    /// (`CONNECTION_ID()`, a user variable, …), or could not be read
    /// (`rewrite::bound`).
    ConnectionBound,
    /// The table's verdict had expired and another session was reading it again.
    TableRecheck,
}

impl AloneReason {
    /// Every reason, in metric order.
    pub const ALL: [AloneReason; 11] = [
        AloneReason::Transaction,
        AloneReason::SessionState,
        AloneReason::UserVariable,
        AloneReason::TableLock,
        AloneReason::DynamicSql,
        AloneReason::TemporaryTable,
        AloneReason::Untracked,
        AloneReason::LockTimeout,
        AloneReason::WriteFailed,
        AloneReason::ConnectionBound,
        AloneReason::TableRecheck,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            AloneReason::Transaction => "transaction",
            AloneReason::SessionState => "session_state",
            AloneReason::UserVariable => "user_variable",
            AloneReason::TableLock => "table_lock",
            AloneReason::DynamicSql => "dynamic_sql",
            AloneReason::TemporaryTable => "temporary_table",
            AloneReason::Untracked => "untracked",
            AloneReason::LockTimeout => "lock_timeout",
            AloneReason::WriteFailed => "write_failed",
            AloneReason::ConnectionBound => "connection_bound",
            AloneReason::TableRecheck => "table_recheck",
        }
    }

    /// Index into [`AloneReason::ALL`].
    pub fn index(self) -> usize {
        AloneReason::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or(0)
    }
}

/// What a statement's text may do to its session that the server does not report,
/// read conservatively: a word in a comment counts, and with a backslash anywhere in
/// the statement (whose meaning inside a string depends on `sql_mode`) strings
/// count too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hazards(u16);

impl Hazards {
    /// `@name` (not `@@`): a user variable, read or assigned.
    pub const USER_VARIABLE: u16 = 1;
    /// `LOCK TABLE(S)`, `FLUSH`, `BACKUP`, `XA …` (a prepared XA transaction keeps
    /// its row locks outside any transaction of the session).
    pub const TABLE_LOCK: u16 = 1 << 1;
    /// `CALL`, `EXECUTE`, `PREPARE`.
    pub const DYNAMIC_SQL: u16 = 1 << 2;
    /// `TEMPORARY`.
    pub const TEMPORARY_TABLE: u16 = 1 << 3;
    /// A `session_track…` name: the tracking settings may change.
    pub const TRACKING: u16 = 1 << 4;
    /// The statement is a `SET` (also inside a leading versioned comment).
    pub const SET: u16 = 1 << 5;
    /// A `SET` that is not a plain assignment of system variables the server
    /// reports: `SET STATEMENT`, `ROLE`, `DEFAULT ROLE`, `PASSWORD`, `TRANSACTION`,
    /// or a `@@name` without a scope.
    pub const SET_OTHER: u16 = 1 << 6;
    /// Not a statement text (COM_STMT_EXECUTE, COM_INIT_DB, …).
    pub const NOT_TEXT: u16 = 1 << 7;
    /// A statement of the proxy's own whose only state change is its `SET
    /// STATEMENT` of [`PROXY_VARIABLES`].
    pub const PROXY: u16 = 1 << 8;

    /// True when `flag` is set.
    pub fn has(self, flag: u16) -> bool {
        self.0 & flag != 0
    }

    /// A command that is not a statement text.
    pub fn not_text() -> Hazards {
        Hazards(Self::NOT_TEXT)
    }

    /// A plain `SET` of system variables, whose reported values are the session's.
    pub fn plain_set(self) -> bool {
        self.has(Self::SET) && !self.has(Self::SET_OTHER) && !self.has(Self::USER_VARIABLE)
    }

    /// Why a session that ran this statement can no longer merge, if it cannot.
    pub fn alone_reason(self) -> Option<AloneReason> {
        [
            (Self::TRACKING, AloneReason::Untracked),
            (Self::TABLE_LOCK, AloneReason::TableLock),
            (Self::DYNAMIC_SQL, AloneReason::DynamicSql),
            (Self::TEMPORARY_TABLE, AloneReason::TemporaryTable),
            (Self::USER_VARIABLE, AloneReason::UserVariable),
            (Self::SET_OTHER, AloneReason::SessionState),
        ]
        .into_iter()
        .find(|(flag, _)| self.has(*flag))
        .map(|(_, r)| r)
    }

    /// Reads a statement's text. Linear, no allocation; never recurses.
    pub fn scan(sql: &[u8]) -> Hazards {
        let mut h = 0u16;
        // A backslash makes the end of a string depend on sql_mode: then strings
        // are read as code (conservative).
        let strings = !sql.contains(&b'\\');
        let mut i = 0;
        let n = sql.len();
        // Words of the statement so far that are not inside strings or comments:
        // the first two decide whether it is a SET; `prev` is the last one.
        let mut words = 0usize;
        let mut first_is_set = false;
        let mut prev: &[u8] = b"";
        while i < n {
            let b = sql[i];
            match b {
                b'\'' | b'"' | b'`' if strings => {
                    i += 1;
                    while i < n {
                        if sql[i] == b {
                            if sql.get(i + 1) == Some(&b) {
                                i += 2;
                                continue;
                            }
                            break;
                        }
                        i += 1;
                    }
                    i += 1;
                }
                b'#' => i = skip_line(sql, i),
                b'-' if sql.get(i + 1) == Some(&b'-')
                    && sql
                        .get(i + 2)
                        .is_none_or(|c| c.is_ascii_whitespace() || *c < 0x20) =>
                {
                    i = skip_line(sql, i)
                }
                b'/' if sql.get(i + 1) == Some(&b'*') => {
                    let body = i + 2;
                    let executable = sql.get(body) == Some(&b'!')
                        || (sql.get(body) == Some(&b'M') && sql.get(body + 1) == Some(&b'!'));
                    if executable {
                        // Its text runs: read on, past the marker and version digits.
                        i = body + if sql[body] == b'M' { 2 } else { 1 };
                        while i < n && sql[i].is_ascii_digit() {
                            i += 1;
                        }
                    } else {
                        i = match sql[body.min(n)..].windows(2).position(|w| w == b"*/") {
                            Some(end) => body + end + 2,
                            None => n,
                        };
                    }
                }
                b'@' => {
                    if sql.get(i + 1) == Some(&b'@') {
                        // A system variable. MariaDB 10.11 does not report a `SET
                        // @@name = …` without a scope (measured: `SET @@time_zone`,
                        // `SET @@sql_mode` answer a plain OK), so a SET that names one
                        // is not taken as plain.
                        let name = &sql[i + 2..];
                        let scoped = [&b"session."[..], b"local.", b"global."].iter().any(|p| {
                            name.len() >= p.len() && name[..p.len()].eq_ignore_ascii_case(p)
                        });
                        if first_is_set && !scoped {
                            h |= Self::SET_OTHER;
                        }
                        i += 2;
                        while i < n && (is_word(sql[i]) || sql[i] == b'.') {
                            i += 1;
                        }
                    } else {
                        h |= Self::USER_VARIABLE;
                        i += 1;
                    }
                }
                _ if is_word(b) && !b.is_ascii_digit() => {
                    let start = i;
                    while i < n && is_word(sql[i]) {
                        i += 1;
                    }
                    let w = &sql[start..i];
                    let is = |k: &[u8]| w.eq_ignore_ascii_case(k);
                    if is(b"lock") {
                        // LOCK TABLE(S) …; not `… LOCK IN SHARE MODE`.
                        let next = next_word(sql, i);
                        if next.eq_ignore_ascii_case(b"table")
                            || next.eq_ignore_ascii_case(b"tables")
                        {
                            h |= Self::TABLE_LOCK;
                        }
                    } else if is(b"flush") || is(b"backup") || (words == 0 && is(b"xa")) {
                        h |= Self::TABLE_LOCK;
                    } else if is(b"call") || is(b"execute") || is(b"prepare") {
                        h |= Self::DYNAMIC_SQL;
                    } else if is(b"temporary") {
                        h |= Self::TEMPORARY_TABLE;
                    } else if w.len() >= 13 && w[..13].eq_ignore_ascii_case(b"session_track") {
                        h |= Self::TRACKING;
                    }
                    if words == 0 {
                        first_is_set = is(b"set");
                    } else if words == 1 && first_is_set {
                        let other: [&[u8]; 5] = [
                            b"statement",
                            b"role",
                            b"default",
                            b"password",
                            b"transaction",
                        ];
                        if other.iter().any(|k| is(k)) {
                            h |= Self::SET_OTHER;
                        }
                        // `SET SESSION TRANSACTION …`, `SET GLOBAL TRANSACTION …`.
                        if (is(b"session") || is(b"global") || is(b"local"))
                            && next_word(sql, i).eq_ignore_ascii_case(b"transaction")
                        {
                            h |= Self::SET_OTHER;
                        }
                    }
                    words += 1;
                    prev = w;
                }
                _ => i += 1,
            }
        }
        let _ = prev;
        if first_is_set {
            h |= Self::SET;
        }
        Hazards(h)
    }
}

/// The variable a `SET` assigns when it assigns exactly one system variable:
/// `SET [SESSION | LOCAL] name = …` or `SET @@session.name = …` / `@@local.`, also in
/// a leading versioned comment, with no comma outside parentheses and strings after
/// it. Lowercase; `None` for anything else (a backslash anywhere included).
fn single_set_target(sql: &[u8]) -> Option<Vec<u8>> {
    if sql.contains(&b'\\') {
        return None;
    }
    let mut i = 0;
    let n = sql.len();
    // Leading white space, comments and a versioned comment's marker.
    loop {
        while i < n && sql[i].is_ascii_whitespace() {
            i += 1;
        }
        if sql[i..].starts_with(b"/*!") {
            i += 3;
            while i < n && sql[i].is_ascii_digit() {
                i += 1;
            }
        } else if sql[i..].starts_with(b"/*") {
            let end = sql[i + 2..].windows(2).position(|w| w == b"*/")?;
            i += 2 + end + 2;
        } else {
            break;
        }
    }
    let word = next_word(sql, i);
    if !word.eq_ignore_ascii_case(b"set") {
        return None;
    }
    i = word.as_ptr() as usize - sql.as_ptr() as usize + word.len();
    let mut name = next_word(sql, i);
    if name.eq_ignore_ascii_case(b"session") || name.eq_ignore_ascii_case(b"local") {
        i = name.as_ptr() as usize - sql.as_ptr() as usize + name.len();
        name = next_word(sql, i);
    } else if name.is_empty() {
        // `@@session.name` / `@@local.name`.
        while i < n && sql[i].is_ascii_whitespace() {
            i += 1;
        }
        let rest = sql.get(i..)?;
        let scope = [&b"@@session."[..], b"@@local."]
            .into_iter()
            .find(|p| rest.len() >= p.len() && rest[..p.len()].eq_ignore_ascii_case(p))?;
        i += scope.len();
        name = next_word(sql, i);
    }
    if name.first().is_none_or(u8::is_ascii_digit) {
        return None;
    }
    i = name.as_ptr() as usize - sql.as_ptr() as usize + name.len();
    while i < n && sql[i].is_ascii_whitespace() {
        i += 1;
    }
    if sql[i..].starts_with(b":=") {
        i += 2;
    } else if sql.get(i) == Some(&b'=') {
        i += 1;
    } else {
        return None;
    }
    // No second assignment: no comma outside parentheses and strings.
    let mut depth = 0usize;
    while i < n {
        match sql[i] {
            q @ (b'\'' | b'"' | b'`') => {
                i += 1;
                while i < n && sql[i] != q {
                    i += 1;
                }
            }
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => return None,
            _ => {}
        }
        i += 1;
    }
    Some(name.to_ascii_lowercase())
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

fn skip_line(sql: &[u8], i: usize) -> usize {
    match sql[i..].iter().position(|&c| c == b'\n') {
        Some(end) => i + end + 1,
        None => sql.len(),
    }
}

/// The word after position `i`, past white space (empty if none).
fn next_word(sql: &[u8], mut i: usize) -> &[u8] {
    while i < sql.len() && sql[i].is_ascii_whitespace() {
        i += 1;
    }
    let start = i;
    while i < sql.len() && is_word(sql[i]) {
        i += 1;
    }
    &sql[start..i]
}

/// Which system variables a client that asked for tracking reports.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Variables {
    All,
    Names(Vec<Vec<u8>>),
}

impl Variables {
    fn parse(list: &[u8]) -> Variables {
        if list.split(|&b| b == b',').any(|n| n.trim_ascii() == b"*") {
            return Variables::All;
        }
        Variables::Names(
            list.split(|&b| b == b',')
                .map(|n| n.trim_ascii().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect(),
        )
    }

    fn contains(&self, name: &[u8]) -> bool {
        match self {
            Variables::All => true,
            Variables::Names(list) => list.iter().any(|n| n.eq_ignore_ascii_case(name)),
        }
    }
}

/// What the client sees of the server's tracking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientView {
    /// The client negotiated CLIENT_SESSION_TRACK.
    tracks: bool,
    /// The proxy's [`TRACKING_SETUP`] is in force and the client's own settings are
    /// known: tracking information is filtered down to what they report. Otherwise
    /// a tracking client gets the server's as it is.
    filter: bool,
    /// The client's `session_track_state_change`.
    state_change: bool,
    /// The client's `session_track_system_variables`.
    variables: Variables,
}

impl ClientView {
    /// Whether the client is shown `e`.
    fn shows(&self, e: &Entry<'_>) -> bool {
        if !self.tracks {
            return false;
        }
        if !self.filter {
            return true;
        }
        match e.kind {
            track::STATE_CHANGE => self.state_change,
            track::SYSTEM_VARIABLES => e.variable().is_some_and(|(name, _)| {
                self.variables.contains(name) && !is_one_of(name, &PROXY_VARIABLES)
            }),
            _ => true,
        }
    }
}

fn is_one_of(name: &[u8], list: &[&[u8]]) -> bool {
    list.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The backend session's state as the relay knows it; see the module docs.
#[derive(Debug)]
pub struct SessionState {
    /// Server status flags of the last response (IN_TRANS, AUTOCOMMIT, …), without
    /// SERVER_SESSION_STATE_CHANGED.
    pub status: u16,
    /// The default database (for unqualified ruled table names and the merge key).
    pub current_db: Option<String>,
    /// The default database changed since [`SessionState::take_db_change`] was last
    /// asked (the admin port's view follows it).
    db_changed: bool,
    /// The client character set and `sql_mode` flags the backend reads statements
    /// under, as last learned from it; `None` until learned and after any statement
    /// that may have changed them (see `rewrite::may_change_lexing`).
    pub lexing: Option<Lexing>,
    /// The client prepared a statement that may change the character set or
    /// `sql_mode`: every COM_STMT_EXECUTE of a statement the proxy did not rewrite
    /// then forgets `lexing`.
    pub lexing_prepared: bool,
    /// The backend node's share of a counter's slots on a Galera cluster.
    pub node_share: Option<NodeShare>,
    /// The backend is a Galera node.
    pub galera: bool,
    /// The backend connection negotiated CLIENT_SESSION_TRACK (its OK packets may
    /// carry tracking information, which the client may not expect).
    pub tracking_capability: bool,
    /// The client's view of tracking.
    client: ClientView,
    /// Why this session's writes run alone until it is reset, if they do.
    alone: Option<AloneReason>,
    /// System variables changed by plain `SET`s, as the server reported them (name →
    /// value; `autocommit` and the proxy's own variables left out).
    variables: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `variables`, encoded: part of the merge key.
    digest: Vec<u8>,
    /// The hazards of the command in flight.
    current: Hazards,
    /// The one system variable the command in flight assigns, when it is a `SET` of
    /// exactly one (lowercase name); asked only while the server reports the
    /// client's own list of variables (`all_variables` false).
    current_target: Option<Vec<u8>>,
    /// The server reports every system variable (`session_track_system_variables =
    /// '*'`); otherwise only the client's own list, and a change the proxy cannot
    /// attribute ends merging.
    all_variables: bool,
}

impl SessionState {
    /// A new session's state: untracked until [`SessionState::tracking_started`].
    /// `client_tracks`: the client negotiated CLIENT_SESSION_TRACK.
    pub fn new(client_tracks: bool) -> Self {
        SessionState {
            status: 0,
            current_db: None,
            db_changed: false,
            lexing: None,
            lexing_prepared: false,
            node_share: None,
            galera: false,
            tracking_capability: false,
            client: ClientView {
                tracks: client_tracks,
                filter: false,
                state_change: false,
                variables: Variables::All,
            },
            alone: Some(AloneReason::Untracked),
            variables: BTreeMap::new(),
            digest: Vec::new(),
            current: Hazards::default(),
            current_target: None,
            all_variables: true,
        }
    }

    /// The client negotiated CLIENT_SESSION_TRACK.
    pub fn client_tracks(&self) -> bool {
        self.client.tracks
    }

    /// Keeps the status flags of a response.
    pub fn set_status(&mut self, status: u16) {
        self.status = status & !SESSION_STATE_CHANGED;
    }

    /// Sets the default database.
    pub fn set_db(&mut self, db: Option<String>) {
        self.db_changed |= db != self.current_db;
        self.current_db = db;
    }

    /// The new default database, once, after a statement changed it.
    pub fn take_db_change(&mut self) -> Option<Option<&str>> {
        std::mem::take(&mut self.db_changed).then_some(self.current_db.as_deref())
    }

    /// The proxy's tracking is in force from now on (after [`TRACKING_SETUP`] on a
    /// new or reset session), with the client's own settings `client` (`None` when
    /// the client does not track, or they could not be read: then it is shown the
    /// server's information unfiltered). The session starts clean.
    pub fn tracking_started(&mut self, client: Option<(&[u8], bool)>) {
        self.alone = None;
        self.variables.clear();
        self.digest.clear();
        self.client.filter = self.client.tracks && client.is_some();
        self.all_variables = true;
        if let Some((variables, state_change)) = client {
            self.client.variables = Variables::parse(variables);
            self.client.state_change = state_change;
            // The client's list stays in force (TRACKING_SETUP_KEEPING_VARIABLES).
            self.all_variables = self.client.variables == Variables::All;
        }
    }

    /// Before a statement the proxy runs on its own whose only change of session
    /// state is its own `SET STATEMENT` (a merged write): a state change reported
    /// for it is that.
    pub fn before_proxy_statement(&mut self) {
        self.current = Hazards(Hazards::NOT_TEXT | Hazards::PROXY);
        self.current_target = None;
    }

    /// The proxy's tracking is not in force (no merging rule, the setup failed,
    /// COM_CHANGE_USER reset it): the session does not merge, and a tracking client
    /// is shown the server's information as it is.
    pub fn tracking_stopped(&mut self) {
        self.client.filter = false;
        self.leave(AloneReason::Untracked);
    }

    /// COM_RESET_CONNECTION succeeded: everything but the database is the
    /// connection's default again (the proxy's tracking too, until set up again).
    pub fn reset(&mut self) {
        self.lexing = None;
        self.lexing_prepared = false;
        self.variables.clear();
        self.digest.clear();
        self.client.filter = false;
        self.alone = Some(AloneReason::Untracked);
    }

    /// From now on this session's writes run alone (until a reset).
    pub fn leave(&mut self, reason: AloneReason) {
        if self.alone.is_none() {
            tracing::debug!(reason = reason.label(), "session leaves group commit");
            self.alone = Some(reason);
        }
    }

    /// Before a statement text runs (COM_QUERY, COM_STMT_PREPARE): what it may do.
    pub fn before_statement(&mut self, sql: &[u8]) {
        if self.alone.is_some() && !self.client.filter {
            // Nothing the text could say changes this session until it is reset:
            // it runs alone already, and its client sees the server's tracking as
            // it is (also every session of a proxy without a merging rule).
            self.current = Hazards::default();
            self.current_target = None;
            return;
        }
        let h = Hazards::scan(sql);
        self.current = h;
        self.current_target = (!self.all_variables && h.plain_set())
            .then(|| single_set_target(sql))
            .flatten();
        if let Some(r) = h.alone_reason() {
            if r == AloneReason::Untracked {
                // The client may change its tracking settings: show it the server's
                // information as it is from now on.
                self.client.filter = false;
            }
            self.leave(r);
        }
    }

    /// Before a command that is not a statement text.
    pub fn before_command(&mut self) {
        self.current = Hazards::not_text();
        self.current_target = None;
    }

    /// Whether this session's statement may join a merged write, and with whom:
    /// `Ok(class)` — sessions of equal class (and user, database and node, which
    /// the caller adds) are equivalent; `Err(reason)` — it runs alone.
    pub fn merge_class(&self) -> Result<&[u8], AloneReason> {
        if self.status & status::IN_TRANS != 0 || self.status & status::AUTOCOMMIT == 0 {
            return Err(AloneReason::Transaction);
        }
        match self.alone {
            Some(r) => Err(r),
            None => Ok(&self.digest),
        }
    }

    /// The connection's character set may differ from the handshake's (prepared
    /// string parameters are then not written as literals).
    pub fn charset_changed(&self) -> bool {
        self.alone.is_some()
            || self
                .variables
                .keys()
                .any(|k| k.starts_with(b"character_set_") || k.starts_with(b"collation_"))
    }

    /// An OK packet with SERVER_SESSION_STATE_CHANGED from the backend: learns what
    /// it reports (when `observe`: not for the proxy's own setup, nor the
    /// authentication's OK, whose entries are the connection's defaults) and returns
    /// the packet the client is to see instead, or `None` to forward it as it is.
    pub fn tracked_ok(&mut self, payload: &[u8], observe: bool) -> Option<Vec<u8>> {
        if !self.tracking_capability {
            return None;
        }
        let Some(ok) = TrackedOk::parse(payload) else {
            // Not understood: the session cannot be shown equivalent.
            self.leave(AloneReason::SessionState);
            return None;
        };
        if observe {
            self.observe(&ok.entries);
        }
        if ok.entries.iter().all(|e| self.client.shows(e)) && self.client.tracks {
            return None;
        }
        let client = &self.client;
        Some(ok.rebuild(|e| client.shows(e)))
    }

    /// Learns the entries of one OK packet.
    fn observe(&mut self, entries: &[Entry<'_>]) {
        let mut explained = false;
        let mut state_change = false;
        let mut changed = false;
        for e in entries {
            match e.kind {
                track::STATE_CHANGE => state_change = true,
                track::SCHEMA => {
                    explained = true;
                    if let Some(db) = e.schema() {
                        let db = (!db.is_empty()).then(|| String::from_utf8_lossy(db).into_owned());
                        self.set_db(db);
                    }
                }
                track::SYSTEM_VARIABLES => {
                    explained = true;
                    let Some((name, value)) = e.variable() else {
                        self.leave(AloneReason::SessionState);
                        continue;
                    };
                    let name = name.to_ascii_lowercase();
                    if is_one_of(&name, &PROXY_VARIABLES) || name == b"autocommit" {
                        continue;
                    }
                    if name.starts_with(b"session_track") {
                        self.client.filter = false;
                        self.leave(AloneReason::Untracked);
                    } else if is_one_of(&name, &ONE_SHOT_VARIABLES)
                        || !self.current.plain_set()
                        || (!self.all_variables
                            && self.current_target.as_deref() != Some(&name[..]))
                    {
                        // Without every variable reported, only a SET of this one
                        // variable alone is known to have changed nothing else.
                        self.leave(AloneReason::SessionState);
                    } else {
                        self.variables.insert(name, value.to_vec());
                        changed = true;
                    }
                }
                _ => {}
            }
        }
        if state_change && !explained && !self.current.has(Hazards::PROXY) {
            // A user variable (`SET @v`), a temporary table, a prepared statement,
            // `SET ROLE`, a variable outside the list the server reports: the server
            // does not say which.
            self.leave(AloneReason::SessionState);
        }
        if changed {
            self.digest.clear();
            for (k, v) in &self.variables {
                for part in [k, v] {
                    self.digest
                        .extend_from_slice(&(part.len() as u32).to_le_bytes());
                    self.digest.extend_from_slice(part);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(sql: &str) -> Option<AloneReason> {
        Hazards::scan(sql.as_bytes()).alone_reason()
    }

    #[test]
    fn statements_the_server_does_not_report_are_read() {
        use AloneReason::*;
        for (sql, want) in [
            ("SELECT @who := 'sess1'", Some(UserVariable)),
            ("DO @v := 1", Some(UserVariable)),
            ("SELECT 5 INTO @d", Some(UserVariable)),
            ("select a into @`x y` from t", Some(UserVariable)),
            ("/*!40101 SET @old = @@sql_mode */", Some(UserVariable)),
            ("LOCK TABLES plays WRITE", Some(TableLock)),
            ("lock table plays read", Some(TableLock)),
            ("/*!40000 LOCK TABLES t WRITE */", Some(TableLock)),
            ("FLUSH TABLES WITH READ LOCK", Some(TableLock)),
            ("BACKUP STAGE START", Some(TableLock)),
            ("BACKUP LOCK t", Some(TableLock)),
            ("XA START 'x'", Some(TableLock)),
            ("CALL p()", Some(DynamicSql)),
            (
                "EXECUTE IMMEDIATE 'SET TIME_ZONE=''+10:00'''",
                Some(DynamicSql),
            ),
            ("PREPARE s FROM 'select 1'", Some(DynamicSql)),
            ("CREATE TEMPORARY TABLE plays (a INT)", Some(TemporaryTable)),
            ("SET session_track_state_change = OFF", Some(Untracked)),
            (
                "SET STATEMENT time_zone = '+01:00' FOR SELECT NOW()",
                Some(SessionState),
            ),
            ("SET ROLE r", Some(SessionState)),
            ("SET DEFAULT ROLE r", Some(SessionState)),
            (
                "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                Some(SessionState),
            ),
            ("SET SESSION TRANSACTION READ ONLY", Some(SessionState)),
            ("SET PASSWORD = PASSWORD('x')", Some(SessionState)),
            // Not reported by MariaDB 10.11 without a scope.
            ("SET @@time_zone = '+10:00'", Some(SessionState)),
            ("SET @@sql_mode = ''", Some(SessionState)),
            // A backslash: strings are read as code.
            ("SELECT 'a\\' @x'", Some(UserVariable)),
            // A quote in a line comment opens no string.
            ("SELECT 1 -- it's\n, @x", Some(UserVariable)),
        ] {
            assert_eq!(reason(sql), want, "{sql}");
        }
        for sql in [
            "SELECT 1",
            "INSERT INTO log (email) VALUES ('a@b.example')",
            "INSERT INTO log (note) VALUES ('call me, lock tables, flush')",
            "SELECT @@session.time_zone, @@sql_mode",
            "SET @@session.time_zone = '+10:00'",
            "SET @@LOCAL.time_zone = '+10:00'",
            "/*!40103 SET TIME_ZONE='+10:00' */",
            "SET NAMES utf8mb4 COLLATE utf8mb4_bin",
            "SELECT * FROM t WHERE id = 1 LOCK IN SHARE MODE",
            "SELECT * FROM t FOR UPDATE",
            "/* call lock tables @x */ SELECT 1",
            "SELECT `@x` FROM t",
            "UPDATE t SET executed = 1",
        ] {
            assert_eq!(reason(sql), None, "{sql}");
        }
        assert!(Hazards::scan(b"/*!40101 SET SQL_MODE='' */").plain_set());
        assert!(Hazards::scan(b"  set autocommit=1").plain_set());
        assert!(!Hazards::scan(b"SELECT 1").plain_set());
        assert!(!Hazards::scan(b"SET @a = 1").plain_set());
    }

    fn ok_with(entries: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, data) in entries {
            list.push(*kind);
            list.push(data.len() as u8);
            list.extend_from_slice(data);
        }
        let mut p = vec![0, 0, 0, 0x02, 0x40, 0, 0, 0];
        p.push(list.len() as u8);
        p.extend_from_slice(&list);
        p
    }

    fn var(name: &str, value: &str) -> (u8, Vec<u8>) {
        let mut d = vec![name.len() as u8];
        d.extend_from_slice(name.as_bytes());
        d.push(value.len() as u8);
        d.extend_from_slice(value.as_bytes());
        (track::SYSTEM_VARIABLES, d)
    }

    fn state() -> (u8, Vec<u8>) {
        (track::STATE_CHANGE, vec![1, b'1'])
    }

    fn tracked(client_tracks: bool) -> SessionState {
        let mut s = SessionState::new(client_tracks);
        s.tracking_capability = true;
        s.set_status(status::AUTOCOMMIT);
        s.tracking_started(client_tracks.then_some((&b"autocommit,time_zone"[..], false)));
        s
    }

    #[test]
    fn plain_sets_keep_the_session_mergeable_with_equal_ones() {
        let mut a = tracked(false);
        let mut b = tracked(true);
        assert_eq!(a.merge_class(), Ok(&[][..]));
        for s in [&mut a, &mut b] {
            s.before_statement(b"/*!40103 SET TIME_ZONE='+10:00' */");
            let shown = s.tracked_ok(&ok_with(&[var("time_zone", "+10:00"), state()]), true);
            assert!(shown.is_some());
        }
        assert!(!a.merge_class().unwrap().is_empty());
        // The tracking client keeps its own list: a SET of one of its variables
        // alone is known all the same.
        assert_eq!(a.merge_class(), b.merge_class());
        // The tracking client is shown its own list's variable, not the state entry.
        let mut c = tracked(true);
        c.before_statement(b"SET time_zone = '+10:00'");
        let shown = c
            .tracked_ok(&ok_with(&[var("time_zone", "+10:00"), state()]), true)
            .unwrap();
        assert_eq!(shown, ok_with(&[var("time_zone", "+10:00")]));
        // A non-tracking client sees no tracking at all.
        let mut d = tracked(false);
        d.before_statement(b"SET time_zone = '+10:00'");
        let shown = d
            .tracked_ok(&ok_with(&[var("time_zone", "+10:00"), state()]), true)
            .unwrap();
        assert_eq!(shown, vec![0, 0, 0, 0x02, 0, 0, 0]);
        // autocommit alone (PyMySQL's SET AUTOCOMMIT = 1) changes no class.
        let mut e = tracked(false);
        e.before_statement(b"SET AUTOCOMMIT = 1");
        e.tracked_ok(&ok_with(&[var("autocommit", "ON"), state()]), true);
        assert_eq!(e.merge_class(), Ok(&[][..]));
    }

    #[test]
    fn changes_the_server_reports_for_other_statements_end_merging() {
        // A stored function that sets the time zone, called from a SELECT.
        let mut s = tracked(false);
        s.before_statement(b"SELECT f()");
        s.tracked_ok(&ok_with(&[var("time_zone", "+03:00"), state()]), true);
        assert_eq!(s.merge_class(), Err(AloneReason::SessionState));
        // SET @v: a state change with nothing to explain it.
        let mut s = tracked(false);
        s.before_statement(b"SELECT g()");
        s.tracked_ok(&ok_with(&[state()]), true);
        assert_eq!(s.merge_class(), Err(AloneReason::SessionState));
        // insert_id is used up silently by the next insert.
        let mut s = tracked(false);
        s.before_statement(b"SET insert_id = 5");
        s.tracked_ok(&ok_with(&[var("insert_id", "5"), state()]), true);
        assert_eq!(s.merge_class(), Err(AloneReason::SessionState));
        // The proxy's own SET STATEMENT variables are not the session's.
        let mut s = tracked(false);
        s.before_proxy_statement();
        s.tracked_ok(&ok_with(&[var("lock_wait_timeout", "2"), state()]), true);
        assert_eq!(s.merge_class(), Ok(&[][..]));
        // With the client's own list in force the server reports only the state
        // change of a merged write's SET STATEMENT.
        let mut s = tracked(true);
        s.before_proxy_statement();
        s.tracked_ok(&ok_with(&[state()]), true);
        assert_eq!(s.merge_class(), Ok(&[][..]));
        s.before_command();
        s.tracked_ok(&ok_with(&[state()]), true);
        assert_eq!(s.merge_class(), Err(AloneReason::SessionState));
        // A tracking client's own list in force: a SET of one listed variable is
        // known; a SET of several is not, even if only a listed one is reported.
        let mut s = tracked(true);
        s.before_statement(b"SET SESSION time_zone = '+10:00'");
        s.tracked_ok(&ok_with(&[var("time_zone", "+10:00"), state()]), true);
        assert!(s.merge_class().is_ok_and(|c| !c.is_empty()));
        s.before_statement(b"SET time_zone = '+01:00', sql_mode = ''");
        s.tracked_ok(&ok_with(&[var("time_zone", "+01:00"), state()]), true);
        assert_eq!(s.merge_class(), Err(AloneReason::SessionState));
        // A transaction.
        let mut s = tracked(false);
        s.set_status(status::AUTOCOMMIT | status::IN_TRANS);
        assert_eq!(s.merge_class(), Err(AloneReason::Transaction));
        // A reset starts afresh once tracking is set up again.
        let mut s = tracked(false);
        s.before_statement(b"LOCK TABLES t WRITE");
        assert_eq!(s.merge_class(), Err(AloneReason::TableLock));
        s.reset();
        assert_eq!(s.merge_class(), Err(AloneReason::Untracked));
        s.tracking_started(None);
        assert_eq!(s.merge_class(), Ok(&[][..]));
    }

    #[test]
    fn single_assignments() {
        for (sql, want) in [
            ("SET time_zone = '+10:00'", Some("time_zone")),
            ("set SESSION Time_Zone='+10:00'", Some("time_zone")),
            (
                "SET @@session.sql_mode := CONCAT(@@sql_mode, ',STRICT')",
                Some("sql_mode"),
            ),
            ("/*!40103 SET TIME_ZONE='+00:00' */", Some("time_zone")),
            ("SET time_zone = '+1', sql_mode = ''", None),
            ("SET NAMES utf8mb4", None),
            ("SET @@time_zone = 'x'", None),
            ("SET a = 'x\\', b = 1", None),
            ("SELECT 1", None),
        ] {
            assert_eq!(
                single_set_target(sql.as_bytes()).as_deref(),
                want.map(str::as_bytes),
                "{sql}"
            );
        }
    }

    #[test]
    fn schema_changes_are_learned() {
        let mut s = tracked(false);
        s.before_command();
        let mut d = vec![4u8];
        d.extend_from_slice(b"shop");
        s.tracked_ok(&ok_with(&[(track::SCHEMA, d), state()]), true);
        assert_eq!(s.current_db.as_deref(), Some("shop"));
        assert_eq!(s.take_db_change(), Some(Some("shop")));
        assert_eq!(s.take_db_change(), None);
        assert!(s.merge_class().is_ok());
    }
}
