//! The rewrite hook: decides, per statement, whether to pass it through untouched,
//! reject it, or replace it by other statements.
//!
//! # Layout
//!
//! - [`Engine`] (`engine.rs`): an immutable snapshot of the rules plus its plan
//!   cache. The connection holds an `Arc<Engine>`; a reload builds a new one and swaps
//!   it in, so a cache never outlives the rules it was filled for.
//!   [`Engine::decide`] is the only call on the data path.
//! - `prefilter.rs`: aho-corasick over the raw bytes for the names of ruled tables.
//!   Most statements stop here and are forwarded untouched.
//! - `sqltok.rs`: a MySQL lexer over bytes. It confirms that a hit is an identifier
//!   (not text in a string or comment), builds the fingerprint (the cache key) and
//!   the marked text the parser sees.
//! - `cache.rs`: moka cache from fingerprint to a cached outcome; a rewrite is cached
//!   as a template into which the literals of each new statement are copied.
//! - [`Rule`]: one implementation per rule kind, each in its own folder
//!   (`kinds/<kind>/`). A rule sees a parsed statement and returns what to run
//!   instead, or a reason to refuse it.
//! - `merge.rs`: [`Merger`], the kind's half of group commit. A plan that may merge
//!   carries the kind's merger ([`Plan::merge`]) and the pieces it reads
//!   ([`Plan::aux`], rendered per execution like the statements); the engine and
//!   the connection layer never look inside the pieces.
//!
//! # How a plan is built (once per fingerprint)
//!
//! The statement is parsed in its *marked* form: every literal and `?` parameter is
//! replaced by a numbered marker `?1`, `?2`, … which sqlparser keeps verbatim as a
//! placeholder through parse → rule → print. A rule therefore never sees literal
//! values unless it asks for them ([`PlanContext::literal`]); it builds new
//! statements around the markers (moving, duplicating or dropping them). The printed
//! output is split on the markers into a template of static text, "original literal
//! #i", "original parameter #j" and proxy-chosen values. Rendering a template copies
//! the bytes of each literal from the statement being executed, so values are never
//! re-escaped or re-printed, and the same plan serves every statement with the same
//! fingerprint.
//!
//! When a literal sits where the parser does not accept a marker (`CAST(x AS
//! DECIMAL(10,2))`), the statement is parsed with only its parameters marked and the
//! outcome is cached under the exact text instead.
//!
//! # Safety rules
//!
//! A statement that names a ruled table (as an identifier) but cannot be parsed,
//! holds several statements, is not valid UTF-8 outside its literals, or has a shape
//! a rule refuses is rejected with a clear error; it is never forwarded to the stale
//! table. (Exception: administrative commands the parser does not know, such as
//! `CHECKSUM TABLE` or `OPTIMIZE TABLE`, are forwarded.) Statements that do not name
//! a ruled table are never parsed and never affected.
//!
//! Non-UTF-8 statements (latin1 clients) are fine as long as the non-UTF-8 bytes sit
//! in literals: the parser only sees markers, and the bytes are copied into the
//! rewrite verbatim.
//!
//! The lexer reads a statement under the session's character set and `sql_mode`
//! ([`StatementContext::lexing`], learned from the server through
//! [`Decision::NeedSessionState`]); under a character set it cannot read exactly,
//! every mention of a ruled table is refused, and a rewritten statement's string
//! literals must be well-formed in their character set. See `docs/design.md`, "The
//! lexer's contract".
//!
//! # Writing a rule kind
//!
//! - Match the statement shapes you can rewrite faithfully; return `Err(reason)` for
//!   any other shape that touches your table in a way that would read or write stale
//!   data, and `Ok(None)` for statements that are fine as they are.
//! - Check table references with [`PlanContext::names_table`] (it resolves the
//!   default database).
//! - Build the output either by editing a clone of the AST, or by formatting SQL
//!   text around the original expressions (`format!("… VALUES ({id}, {inc})")`:
//!   markers print as `?N`) and parsing it with [`parse_statements`].
//! - Read a literal's value only when the decision needs it ([`PlanContext::literal`]),
//!   since the plan is then cached per value. Parameters of prepared statements have
//!   no value at plan time ([`Slot::Param`]).
//! - Ask for proxy-chosen values with [`PlanContext::random_below`].
//! - To let concurrent autocommit executions merge into one write, implement
//!   [`Merger`] in `kinds/<kind>/merge.rs`, put the pieces it needs in
//!   [`Plan::aux`] and the merger in [`Plan::merge`].
//! - Strings the rule introduces itself are printed by sqlparser without backslash
//!   escaping: keep them free of quotes and backslashes.

mod cache;
mod engine;
pub mod merge;
pub mod prefilter;
pub mod shape;
pub mod sqltok;
#[cfg(test)]
pub(crate) mod testutil;

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use sqlparser::ast::{Expr, ObjectName, Statement, Value};

pub use crate::rules::spec::TableName;
pub use engine::{parse_statements, Engine, MAX_NESTING};
pub use merge::Merger;
pub use sqltok::{LexMode, LiteralClass, LiteralKind, Slot};

/// A statement's fingerprint: literals replaced by `?`, parameters by `?p`,
/// comments dropped, whitespace and reserved words normalised. Used in logs, where a
/// statement must not show literal values; text that cannot be lexed is summarised.
pub fn fingerprint(sql: &[u8]) -> String {
    fingerprint_in(sql, LexMode::default())
}

/// [`fingerprint`] of a statement read under `mode` (the session's `sql_mode`), so
/// that literal values stay hidden whatever its quotes and backslashes mean.
pub fn fingerprint_in(sql: &[u8], mode: LexMode) -> String {
    match sqltok::lex(sql, mode) {
        Ok(toks) => {
            let mut out = Vec::with_capacity(sql.len());
            sqltok::normalize(
                sql,
                &toks,
                sqltok::Mode::Fingerprint,
                &mut out,
                &mut Vec::new(),
            );
            String::from_utf8_lossy(&out).into_owned()
        }
        Err(_) => format!("<{} bytes that do not lex>", sql.len()),
    }
}

/// How MariaDB reads the bytes of a statement for a given client character set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CharsetClass {
    /// utf8mb4: string literals must be valid UTF-8.
    Utf8mb4,
    /// utf8mb3 (`utf8`): string literals must be valid UTF-8 without 4-byte sequences.
    Utf8mb3,
    /// ascii: string literals must be 7-bit.
    Ascii,
    /// latin1, binary: every byte is a character of its own, 0x00–0x7F are ASCII.
    AnyByte,
    /// Everything else: multi-byte character sets whose second bytes include 0x5C
    /// (`\`) and quotes (big5, gbk, gb18030, sjis, cp932), character sets whose
    /// invalid sequences or undefined code points the proxy does not check (the EUC
    /// ones, the other single-byte ones), and names the proxy does not know.
    Refused,
}

/// A client character set, as far as the lexer is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charset {
    /// MariaDB's name for it (`utf8mb4`, `gbk`, …; "an unknown character set" for a
    /// name the proxy does not know).
    pub name: &'static str,
    /// How statements in it are read and checked.
    pub class: CharsetClass,
}

/// Every character set MariaDB 10.11 knows, with its class.
const CHARSETS: &[(&str, CharsetClass)] = &[
    ("armscii8", CharsetClass::Refused),
    ("ascii", CharsetClass::Ascii),
    ("big5", CharsetClass::Refused),
    ("binary", CharsetClass::AnyByte),
    ("cp1250", CharsetClass::Refused),
    ("cp1251", CharsetClass::Refused),
    ("cp1256", CharsetClass::Refused),
    ("cp1257", CharsetClass::Refused),
    ("cp850", CharsetClass::Refused),
    ("cp852", CharsetClass::Refused),
    ("cp866", CharsetClass::Refused),
    ("cp932", CharsetClass::Refused),
    ("dec8", CharsetClass::Refused),
    ("eucjpms", CharsetClass::Refused),
    ("euckr", CharsetClass::Refused),
    ("gb18030", CharsetClass::Refused),
    ("gb2312", CharsetClass::Refused),
    ("gbk", CharsetClass::Refused),
    ("geostd8", CharsetClass::Refused),
    ("greek", CharsetClass::Refused),
    ("hebrew", CharsetClass::Refused),
    ("hp8", CharsetClass::Refused),
    ("keybcs2", CharsetClass::Refused),
    ("koi8r", CharsetClass::Refused),
    ("koi8u", CharsetClass::Refused),
    ("latin1", CharsetClass::AnyByte),
    ("latin2", CharsetClass::Refused),
    ("latin5", CharsetClass::Refused),
    ("latin7", CharsetClass::Refused),
    ("macce", CharsetClass::Refused),
    ("macroman", CharsetClass::Refused),
    ("sjis", CharsetClass::Refused),
    ("swe7", CharsetClass::Refused),
    ("tis620", CharsetClass::Refused),
    ("ucs2", CharsetClass::Refused),
    ("ujis", CharsetClass::Refused),
    ("utf16", CharsetClass::Refused),
    ("utf16le", CharsetClass::Refused),
    ("utf32", CharsetClass::Refused),
    ("utf8", CharsetClass::Utf8mb3),
    ("utf8mb3", CharsetClass::Utf8mb3),
    ("utf8mb4", CharsetClass::Utf8mb4),
];

impl Charset {
    /// utf8mb4, MariaDB's usual client character set.
    pub const UTF8MB4: Charset = Charset {
        name: "utf8mb4",
        class: CharsetClass::Utf8mb4,
    };

    /// The character set of this name (ASCII case-insensitive); an unknown name is
    /// [`CharsetClass::Refused`].
    pub fn from_name(name: &[u8]) -> Charset {
        CHARSETS
            .iter()
            .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
            .map_or(
                Charset {
                    name: "an unknown character set",
                    class: CharsetClass::Refused,
                },
                |&(name, class)| Charset { name, class },
            )
    }

    /// Whether the bytes of a string literal's content are well-formed in this
    /// character set (so that MariaDB stores them as they are, never as `?`). Bytes
    /// are checked as written, escapes included: a literal whose raw bytes are valid
    /// has a valid value (escapes only drop or replace ASCII bytes).
    pub fn accepts(self, bytes: &[u8]) -> bool {
        match self.class {
            CharsetClass::Utf8mb4 => std::str::from_utf8(bytes).is_ok(),
            CharsetClass::Utf8mb3 => {
                std::str::from_utf8(bytes).is_ok() && !bytes.iter().any(|&b| b >= 0xf0)
            }
            CharsetClass::Ascii => bytes.is_ascii(),
            CharsetClass::AnyByte => true,
            CharsetClass::Refused => false,
        }
    }
}

/// What MariaDB's reading of a statement depends on: the client character set and
/// the `sql_mode` flags of [`LexMode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lexing {
    /// `@@character_set_client`.
    pub charset: Charset,
    /// `NO_BACKSLASH_ESCAPES` and `ANSI_QUOTES` of `@@sql_mode`.
    pub mode: LexMode,
    /// A flag of `@@sql_mode` changes the meaning of statements in ways the rules do
    /// not model (its name, for the refusal): `ORACLE`, `MSSQL` (other grammars),
    /// `EMPTY_STRING_IS_NULL` (`''` is NULL), `HIGH_NOT_PRECEDENCE` (the parser's
    /// precedence of NOT), `SIMULTANEOUS_ASSIGNMENT` (the order of SET assignments).
    pub refused_mode: Option<&'static str>,
}

/// `sql_mode` flags under which statements on ruled tables are refused.
const REFUSED_MODES: &[&str] = &[
    "ORACLE",
    "MSSQL",
    "EMPTY_STRING_IS_NULL",
    "HIGH_NOT_PRECEDENCE",
    "SIMULTANEOUS_ASSIGNMENT",
];

impl Default for Lexing {
    fn default() -> Self {
        Lexing::STANDARD
    }
}

impl Lexing {
    /// utf8mb4 and MariaDB's default `sql_mode` flags.
    pub const STANDARD: Lexing = Lexing {
        charset: Charset::UTF8MB4,
        mode: LexMode {
            no_backslash_escapes: false,
            ansi_quotes: false,
        },
        refused_mode: None,
    };

    /// The settings from the answer to `SELECT @@character_set_client, @@sql_mode`.
    pub fn from_server(charset: &[u8], sql_mode: &[u8]) -> Lexing {
        let mut mode = LexMode::default();
        let mut refused_mode = None;
        for flag in sql_mode.split(|&b| b == b',') {
            let flag = flag.trim_ascii();
            if flag.eq_ignore_ascii_case(b"NO_BACKSLASH_ESCAPES") {
                mode.no_backslash_escapes = true;
            } else if flag.eq_ignore_ascii_case(b"ANSI_QUOTES") {
                mode.ansi_quotes = true;
            } else if let Some(m) = REFUSED_MODES
                .iter()
                .find(|m| m.as_bytes().eq_ignore_ascii_case(flag))
            {
                refused_mode = refused_mode.or(Some(*m));
            }
        }
        Lexing {
            charset: Charset::from_name(charset.trim_ascii()),
            mode,
            refused_mode,
        }
    }
}

/// The query whose answer [`Lexing::from_server`] reads (see
/// [`Decision::NeedSessionState`]); its third column is the backend node's place in a
/// Galera cluster ([`NodeShare::from_server`]; NULL on a server that is not a node).
pub const SESSION_STATE_QUERY: &str = "SELECT @@character_set_client, @@sql_mode, \
     (SELECT CONCAT(i.VARIABLE_VALUE, '/', n.VARIABLE_VALUE) \
     FROM information_schema.GLOBAL_STATUS AS i, information_schema.GLOBAL_STATUS AS n \
     WHERE i.VARIABLE_NAME = 'WSREP_LOCAL_INDEX' AND n.VARIABLE_NAME = 'WSREP_CLUSTER_SIZE')";

/// [`SESSION_STATE_QUERY`] for servers without `information_schema.GLOBAL_STATUS`
/// (MySQL 8 answers 1109 to it).
pub const SESSION_STATE_QUERY_PLAIN: &str = "SELECT @@character_set_client, @@sql_mode";

/// Which share of a rule's proxy-chosen values (a counter's slots) a session writes:
/// on a Galera cluster each node its own share, so that writes through different
/// nodes never touch the same slot row and never fail certification against each
/// other. Only a performance matter: any slot is correct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeShare {
    /// The backend node's `wsrep_local_index` (0-based).
    pub index: u32,
    /// `wsrep_cluster_size` when the session learned it.
    pub nodes: u32,
}

/// What a session learns of its backend node with the settings query: whether it is
/// a node of a running Galera cluster, and its share of proxy-chosen values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterInfo {
    /// A Galera provider runs on the node (`wsrep_cluster_size` ≥ 1). A server built
    /// with Galera support but without a provider reports the status variables with
    /// a cluster size of 0.
    pub galera: bool,
    /// The node's share, in a cluster of several nodes.
    pub share: Option<NodeShare>,
}

impl ClusterInfo {
    /// Reads the third column of [`SESSION_STATE_QUERY`] (`index/size`, NULL on a
    /// server without the status variables).
    pub fn from_server(cell: Option<&[u8]>) -> ClusterInfo {
        let size = cell
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|t| t.split_once('/'))
            .and_then(|(_, n)| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        ClusterInfo {
            galera: size >= 1,
            share: cell.and_then(NodeShare::from_server),
        }
    }
}

impl NodeShare {
    /// Reads `index/nodes` (the third column of [`SESSION_STATE_QUERY`]); `None` for a
    /// server that is not in a cluster of several nodes, or an index out of range (a
    /// node outside the primary component reports 2^64 − 1).
    pub fn from_server(cell: &[u8]) -> Option<NodeShare> {
        let text = std::str::from_utf8(cell).ok()?;
        let (i, n) = text.split_once('/')?;
        let index: u32 = i.trim().parse().ok()?;
        let nodes: u32 = n.trim().parse().ok()?;
        (nodes > 1 && index < nodes).then_some(NodeShare { index, nodes })
    }

    /// A value below `n`: uniform over this share's part of `0..n` (the
    /// `index`-th of `nodes` consecutive ranges), or over all of it without a share
    /// or when there are fewer values than nodes.
    pub fn pick_below(share: Option<NodeShare>, n: u32) -> u32 {
        let n = n.max(1);
        let (lo, hi) = match share {
            Some(s) if s.nodes <= n => {
                let (i, k, n64) = (u64::from(s.index), u64::from(s.nodes), u64::from(n));
                ((n64 * i / k) as u32, (n64 * (i + 1) / k) as u32)
            }
            _ => (0, n),
        };
        rand::random_range(lo..hi.max(lo + 1))
    }
}

/// Words of statements that may change the client character set or `sql_mode`
/// (`SET NAMES`, `SET CHARSET`, `SET CHARACTER SET`, `SET character_set_client`,
/// `SET collation_connection`, `SET sql_mode`, `SET STATEMENT … FOR`), or run
/// statements the proxy does not see (`CALL`, `EXECUTE`, `EXECUTE IMMEDIATE`).
const LEXING_WORDS: &[&str] = &[
    "names",
    "charset",
    "character",
    "collation",
    "sql_mode",
    "call",
    "execute",
];

/// Whether a statement (a COM_QUERY or COM_STMT_PREPARE text, possibly several
/// statements) may change what [`Lexing`] describes, so that the session must learn
/// it again before its next statement on a ruled table. Conservative:
///
/// - a statement starting with `CALL` or `EXECUTE` (they run statements the proxy
///   does not see): yes;
/// - one starting with `SET`, or text with a `;` that something follows (several
///   statements): yes if any of [`LEXING_WORDS`] appears as a word anywhere in the
///   bytes (strings and comments included, so no reading of the statement is
///   trusted; `character…` and `collation…` also as the start of a word);
/// - anything else: no.
///
/// Leading whitespace, comments and executable-comment openers (`/*!40101 SET …`)
/// are skipped. Cost on a statement that is neither: a look at its first word and a
/// search for `;`.
pub fn may_change_lexing(sql: &[u8]) -> bool {
    let first = first_word(sql);
    let is = |w: &[u8]| first.eq_ignore_ascii_case(w);
    if is(b"call") || is(b"execute") {
        return true;
    }
    // `contains` is a memchr; most statements hold no `;` at all.
    let several = || {
        sql.contains(&b';')
            && sql
                .iter()
                .position(|&b| b == b';')
                .is_some_and(|p| !sql[p + 1..].trim_ascii().is_empty())
    };
    (is(b"set") || several()) && names_lexing_word(sql)
}

/// The first word of a statement, after whitespace, comments and the openers of
/// executable comments; empty when it does not start with a word.
fn first_word(sql: &[u8]) -> &[u8] {
    let mut s = sql;
    loop {
        s = s.trim_ascii_start();
        if let Some(rest) = s.strip_prefix(b"/*!").or_else(|| s.strip_prefix(b"/*M!")) {
            s = &rest[rest.iter().take_while(|b| b.is_ascii_digit()).count()..];
        } else if let Some(rest) = s.strip_prefix(b"/*") {
            match rest.windows(2).position(|w| w == b"*/") {
                Some(end) => s = &rest[end + 2..],
                None => return &[],
            }
        } else if s.starts_with(b"#") || s.starts_with(b"--") {
            match s.iter().position(|&b| b == b'\n') {
                Some(end) => s = &s[end + 1..],
                None => return &[],
            }
        } else {
            let n = s.iter().take_while(|&&b| sqltok::is_ident_byte(b)).count();
            return &s[..n];
        }
    }
}

/// Whether one of [`LEXING_WORDS`] appears as a word in the bytes.
fn names_lexing_word(sql: &[u8]) -> bool {
    static WORDS: std::sync::LazyLock<Option<aho_corasick::AhoCorasick>> =
        std::sync::LazyLock::new(|| {
            aho_corasick::AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(LEXING_WORDS)
                .ok()
        });
    let Some(words) = WORDS.as_ref() else {
        return true;
    };
    words.find_iter(sql).any(|m| {
        let before = m
            .start()
            .checked_sub(1)
            .and_then(|i| sql.get(i))
            .is_some_and(|&b| sqltok::is_ident_byte(b));
        let prefix_ok = matches!(
            LEXING_WORDS[m.pattern().as_usize()],
            "character" | "collation"
        );
        let after = sql.get(m.end()).is_some_and(|&b| sqltok::is_ident_byte(b));
        !before && (prefix_ok || !after)
    })
}

/// What the connection knows about the statement it is about to forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatementContext<'a> {
    /// The statement comes from COM_STMT_PREPARE: its `?` are parameters whose
    /// values arrive later, and a rewrite must say where each one goes
    /// ([`Rewritten::param_map`]).
    pub prepared: bool,
    /// The client is inside an explicit transaction. Plans never depend on it (it is
    /// not part of the cache key); the connection uses it to decide whether a rewrite
    /// of several statements must be wrapped in its own transaction.
    pub in_transaction: bool,
    /// The connection's default database (`USE db`, COM_INIT_DB, handshake), used to
    /// resolve unqualified table names against rules that name a database.
    pub current_db: Option<&'a str>,
    /// The session's character set and `sql_mode` flags, or `None` when a statement
    /// may have changed them since they were last learned: a statement that names a
    /// ruled table then gets [`Decision::NeedSessionState`].
    pub lexing: Option<Lexing>,
    /// The backend node's share of proxy-chosen values ([`NodeShare`]).
    pub share: Option<NodeShare>,
}

impl Default for StatementContext<'_> {
    /// A text statement outside a transaction, no default database, utf8mb4 and the
    /// default `sql_mode` flags.
    fn default() -> Self {
        StatementContext {
            prepared: false,
            in_transaction: false,
            current_db: None,
            lexing: Some(Lexing::STANDARD),
            share: None,
        }
    }
}

/// The outcome for one statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Forward the original bytes untouched.
    Passthrough,
    /// Do not forward; answer the client with an error.
    Reject(Rejection),
    /// Run these statements instead of the original.
    Rewrite(Rewritten),
    /// Forward the original bytes untouched, counted as this rule's fallback: a
    /// statement the rule exists to answer but cannot answer exactly.
    Fallback(Fallback),
    /// The statement names the table of a rule in shadow mode: forward the original
    /// untouched, and count and log the decision the rule would have made (a
    /// `Rewrite` or a `Reject`).
    Shadow(Box<Decision>),
    /// A rule needs to learn something from the database before it can plan (for
    /// example the logical table's columns): run [`MetadataRequest::sql`] on the
    /// client's own connection, hand the column definitions to
    /// [`Engine::provide_metadata`], and decide again.
    NeedMetadata(MetadataRequest),
    /// The statement names a ruled table, but the session's character set or
    /// `sql_mode` may have changed ([`StatementContext::lexing`] is `None`): run
    /// [`SESSION_STATE_QUERY`] on the client's own connection, record its answer
    /// ([`Lexing::from_server`]) and decide again.
    NeedSessionState,
}

/// A one-time question a rule asks the database (see [`Decision::NeedMetadata`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataRequest {
    /// Index of the rule in the engine.
    pub rule: usize,
    /// The query whose result-set column definitions the rule wants.
    pub sql: String,
    /// The database the rule's table resolves to in this statement (its qualifier
    /// there, else the connection's default): hand it back with the answer to
    /// [`Engine::provide_metadata`].
    pub db: Option<String>,
}

/// The database `table` means in a statement: the rule's own, else the database the
/// statement qualified a table of that name with (`qualifiers`: (table, database)
/// pairs as written, in statement order), else the connection's default.
pub fn table_db<'a>(
    table: &'a TableName,
    qualifiers: &'a [(String, String)],
    current_db: Option<&'a str>,
) -> Option<&'a str> {
    if let Some(db) = &table.db {
        return Some(db);
    }
    qualifiers
        .iter()
        .find(|(t, _)| t.eq_ignore_ascii_case(&table.name))
        .map(|(_, db)| db.as_str())
        .or(current_db)
}

/// Why a statement is refused.
///
/// The connection answers with ERR 1105 / SQLSTATE HY000 and the text of
/// [`Rejection::message`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Name of the rule whose table the statement touches (for statements that
    /// cannot even be analysed: the first rule whose table it names).
    pub rule: Arc<str>,
    /// What is wrong, in words a DBA or developer can act on.
    pub reason: String,
}

impl Rejection {
    /// The error message sent to the client: `heatsink rule '{rule}': {reason}`.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "heatsink rule '{}': {}", self.rule, self.reason)
    }
}

/// Why a statement a rule exists to answer is forwarded unchanged (see
/// [`Decision::Fallback`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    /// Name of the rule that could not answer it exactly.
    pub rule: Arc<str>,
    /// Why, in words a DBA can act on (never quotes the statement's values).
    pub reason: Arc<str>,
}

/// The statements to run instead of the original one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewritten {
    /// Name of the rule that produced the rewrite (for logs and metrics).
    pub rule: Arc<str>,
    /// The statements, in the order they must run, as bytes in the connection's
    /// character set (literals are copied byte for byte from the original).
    pub statements: Vec<Vec<u8>>,
    /// Only for prepared statements: for each `?` of the rewritten statements, the
    /// index of the original parameter whose value it takes. The `?`s of all
    /// statements are listed in order, statement after statement; split by the
    /// parameter count each statement reports when it is prepared. An original
    /// parameter may appear several times or not at all. `None` for text statements.
    pub param_map: Option<Vec<usize>>,
    /// How the client's answer is built from the backend's responses.
    pub reply: Reply,
    /// The statements must commit together: outside a client transaction in
    /// autocommit mode the connection wraps them in BEGIN … COMMIT.
    pub atomic: bool,
    /// Rendered auxiliary texts of the plan (see [`Plan::aux`]).
    pub aux: Vec<Vec<u8>>,
    /// Only for prepared statements: for each text of `aux`, where its `?`s are
    /// (byte offset) and which original parameter each takes. Empty for text
    /// statements.
    pub aux_holes: Vec<Vec<(usize, usize)>>,
    /// The kind's group-commit half: how concurrent autocommit executions of this
    /// rewrite for the same target merge into one write (see [`Plan::merge`]).
    pub merge: Option<Arc<dyn Merger>>,
    /// Only for prepared statements: the checks each execute's parameters must pass
    /// (see [`Plan::param_checks`]).
    pub param_checks: Vec<(usize, ParamCheck)>,
    /// Text statements only: the two-step form of the rewrite (see [`Prelude`]).
    pub prelude: Option<Arc<RenderedPrelude>>,
}

/// A text with holes for a prelude's literals: (byte offset, literal index), in order.
pub type Holed = (Vec<u8>, Vec<(usize, u16)>);

/// A [`Prelude`] rendered for one execution.
#[derive(Debug, Clone)]
pub struct RenderedPrelude {
    /// The `SELECT` to run first.
    pub query: Vec<u8>,
    /// Its row's literals.
    pub values: Arc<dyn PreludeValues>,
    /// The statements to run then, with their holes.
    pub statements: Vec<Holed>,
    /// The original statement (its bytes as the client sent them), forwarded
    /// unchanged in place of the one-step form when the row declines the literals
    /// (see [`Prelude::original_on_decline`]).
    pub original: Option<Vec<u8>>,
}

impl PartialEq for RenderedPrelude {
    fn eq(&self, other: &Self) -> bool {
        self.query == other.query
            && *self.values == *other.values
            && self.statements == other.statements
            && self.original == other.original
    }
}

impl Eq for RenderedPrelude {}

impl RenderedPrelude {
    /// The statements with the row's literals in their holes, or `None` when the
    /// row does not allow them. `row`: the text row's cells (`None` for NULL),
    /// `types`: each column's MySQL type.
    pub fn statements_for(&self, row: &[Option<&[u8]>], types: &[u8]) -> Option<Vec<Vec<u8>>> {
        let values = self.values.literals(row, types)?;
        self.statements
            .iter()
            .map(|(text, holes)| {
                let mut out = Vec::with_capacity(text.len() + 32 * holes.len());
                let mut at = 0;
                for &(offset, i) in holes {
                    out.extend_from_slice(text.get(at..offset)?);
                    out.extend_from_slice(values.get(usize::from(i))?.as_bytes());
                    at = offset;
                }
                out.extend_from_slice(text.get(at..)?);
                Some(out)
            })
            .collect()
    }
}

/// What a prepared statement's parameter value must be for its rewrite to keep the
/// original statement's meaning; checked at every execute (the plan is made before
/// any value is known). An execute whose value fails gets ERR 1105 and runs nothing,
/// unless the check [declines](ParamCheck::declines): the client's statement then
/// runs as the server's own prepared statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamCheck {
    /// Any value but NULL.
    NotNull,
    /// A string (bound as a string type, not NULL) of at most this many bytes.
    String {
        /// Longest value in bytes (a lower bound on the column's characters).
        max_bytes: usize,
    },
    /// An integer in `min..=max` (bound as an integer type, or as a string of
    /// decimal digits), not NULL.
    Integer {
        /// Smallest value.
        min: i128,
        /// Largest value.
        max: i128,
    },
    /// A valid date and time of the years `min_year..=max_year`: bound as DATE,
    /// DATETIME or TIMESTAMP, or as a `'YYYY-MM-DD'` / `'YYYY-MM-DD HH:MM:SS[.f]'`
    /// string. It [declines](ParamCheck::declines): another value (NULL, a number,
    /// a zero or invalid date, another spelling) runs the client's statement as sent.
    Datetime {
        /// Earliest year.
        min_year: u16,
        /// Latest year.
        max_year: u16,
    },
}

impl ParamCheck {
    /// Whether a value that fails the check runs the client's statement as the
    /// server's own prepared statement (counted as the rule's fallback) rather than
    /// failing: for rewrites exact only for some values of a parameter whose other
    /// values the original statement answers as well as ever. Only for rules that
    /// let their statements run as sent ([`Rule::runs_unread`]).
    pub fn declines(&self) -> bool {
        matches!(self, ParamCheck::Datetime { .. })
    }

    /// Why the binary-protocol value `value` (`None`: NULL) of type `ty` (the two
    /// type bytes of COM_STMT_EXECUTE) fails the check, if it does.
    /// `charset`: the connection's character set, in which string values must be
    /// well-formed (else MariaDB compares them but stores `?`); `None`: unknown,
    /// which fails string checks.
    pub fn violation(
        &self,
        ty: [u8; 2],
        value: Option<&[u8]>,
        charset: Option<Charset>,
    ) -> Option<String> {
        use crate::wire::resultset::types;
        let Some(v) = value else {
            return Some("a NULL parameter".into());
        };
        let unsigned = ty[1] & 0x80 != 0;
        let string = |v: &[u8]| -> Option<Vec<u8>> {
            let (len, used) = crate::wire::packets::lenenc_int(v)?;
            v.get(used..used + usize::try_from(len).ok()?)
                .map(<[u8]>::to_vec)
        };
        let is_string = matches!(ty[0], 0x0f | 0xf9..=0xfe);
        match *self {
            ParamCheck::NotNull => None,
            ParamCheck::Datetime { min_year, max_year } => {
                let year = match ty[0] {
                    types::DATE | types::DATETIME | types::TIMESTAMP => binary_datetime_year(v),
                    _ if is_string => string(v).and_then(|s| text_datetime_year(&s)),
                    _ => None,
                };
                match year {
                    Some(y) if (min_year..=max_year).contains(&y) => None,
                    Some(y) => Some(format!("a date parameter of the year {y}")),
                    None => Some(format!(
                        "a parameter of type {:#04x} that is not a valid date and time",
                        ty[0]
                    )),
                }
            }
            ParamCheck::String { max_bytes } => {
                if !is_string {
                    return Some(format!("a parameter of type {:#04x} where a string key is compared (MariaDB would compare numerically)", ty[0]));
                }
                match (string(v), charset) {
                    (Some(s), Some(cs)) if s.len() <= max_bytes && cs.accepts(&s) => None,
                    (Some(s), Some(cs)) if s.len() <= max_bytes => Some(format!(
                        "a string parameter that is not well-formed in {}",
                        cs.name
                    )),
                    (Some(_), None) => {
                        Some("a string parameter in an unknown character set".into())
                    }
                    _ => Some(format!("a string parameter longer than {max_bytes} bytes")),
                }
            }
            ParamCheck::Integer { min, max } => {
                let n: Option<i128> = match ty[0] {
                    types::TINY => v.first().map(|&b| {
                        if unsigned {
                            i128::from(b)
                        } else {
                            i128::from(b as i8)
                        }
                    }),
                    types::SHORT => v.get(..2).map(|b| {
                        let x = [b[0], b[1]];
                        if unsigned {
                            i128::from(u16::from_le_bytes(x))
                        } else {
                            i128::from(i16::from_le_bytes(x))
                        }
                    }),
                    types::LONG | types::INT24 => v.get(..4).map(|b| {
                        let x = [b[0], b[1], b[2], b[3]];
                        if unsigned {
                            i128::from(u32::from_le_bytes(x))
                        } else {
                            i128::from(i32::from_le_bytes(x))
                        }
                    }),
                    types::LONGLONG => v.get(..8).map(|b| {
                        let mut x = [0u8; 8];
                        x.copy_from_slice(b);
                        if unsigned {
                            i128::from(u64::from_le_bytes(x))
                        } else {
                            i128::from(i64::from_le_bytes(x))
                        }
                    }),
                    _ if is_string => string(v).and_then(|s| {
                        let digits = s.strip_prefix(b"-").unwrap_or(&s);
                        if digits.is_empty()
                            || digits.len() > 30
                            || !digits.iter().all(u8::is_ascii_digit)
                        {
                            return None;
                        }
                        std::str::from_utf8(&s).ok()?.parse().ok()
                    }),
                    _ => None,
                };
                match n {
                    Some(n) if (min..=max).contains(&n) => None,
                    Some(n) => Some(format!("the parameter value {n} is out of range")),
                    None => Some(format!(
                        "a parameter of type {:#04x} that is not an integer",
                        ty[0]
                    )),
                }
            }
        }
    }
}

/// Days in month `m` (1–12) of year `y`, proleptic Gregorian.
fn month_days(y: u16, m: u8) -> u8 {
    match m {
        2 if y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400)) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The year of a binary-protocol DATE/DATETIME/TIMESTAMP value (length byte, year,
/// month, day[, hour, minute, second[, microseconds]]) holding a valid date and
/// time; `None` for the zero value (length 0) and anything invalid.
fn binary_datetime_year(v: &[u8]) -> Option<u16> {
    let (&len, rest) = v.split_first()?;
    let rest = rest.get(..usize::from(len))?;
    let (y, m, d) = match rest {
        [y0, y1, m, d, ..] if matches!(len, 4 | 7 | 11) => (u16::from_le_bytes([*y0, *y1]), *m, *d),
        _ => return None,
    };
    if let [_, _, _, _, h, mi, s, ..] = rest {
        if *h > 23 || *mi > 59 || *s > 59 {
            return None;
        }
    }
    if let [_, _, _, _, _, _, _, u0, u1, u2, u3] = rest {
        if u32::from_le_bytes([*u0, *u1, *u2, *u3]) > 999_999 {
            return None;
        }
    }
    ((1..=9999).contains(&y) && (1..=12).contains(&m) && d >= 1 && d <= month_days(y, m))
        .then_some(y)
}

/// The year of a `YYYY-MM-DD` or `YYYY-MM-DD HH:MM:SS[.f]` (one to six fractional
/// digits) text holding a valid date and time; `None` for anything else.
fn text_datetime_year(s: &[u8]) -> Option<u16> {
    let num = |b: &[u8]| -> Option<u16> {
        b.iter().try_fold(0u16, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u16::from(c - b'0'))
        })
    };
    let (date, time) = match s.len() {
        10 => (s, None),
        19.. => (s.get(..10)?, Some(s.get(10..)?)),
        _ => return None,
    };
    if date[4] != b'-' || date[7] != b'-' {
        return None;
    }
    let (y, m, d) = (num(&date[..4])?, num(&date[5..7])?, num(&date[8..10])?);
    let m = u8::try_from(m).ok()?;
    if !(1..=12).contains(&m) || d < 1 || d > u16::from(month_days(y, m)) || y < 1 {
        return None;
    }
    if let Some(t) = time {
        if t[0] != b' ' || t[3] != b':' || t[6] != b':' {
            return None;
        }
        let (h, mi, sec) = (num(&t[1..3])?, num(&t[4..6])?, num(&t[7..9])?);
        if h > 23 || mi > 59 || sec > 59 {
            return None;
        }
        match &t[9..] {
            [] => {}
            [b'.', f @ ..] if (1..=6).contains(&f.len()) && f.iter().all(u8::is_ascii_digit) => {}
            _ => return None,
        }
    }
    Some(y)
}

/// How the client's answer to a rewritten statement is built.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Reply {
    /// Relay the last statement's response unchanged.
    #[default]
    Last,
    /// Answer with the OK packet of statement `n` (0-based): the statement that does
    /// what the original did; the others only keep the physical tables consistent.
    OkOf(usize),
    /// Answer with an OK packet as the original statement would have: these affected
    /// rows and info text; status flags and warnings come from the backend.
    Ok {
        /// Affected rows to report.
        affected_rows: Affected,
        /// The info string (`Rows matched: 1  Changed: 1  Warnings: 0`), if the
        /// original statement sends one.
        info: Option<String>,
        /// The statement whose OK packet's last_insert_id to report (0 otherwise).
        last_insert_id: Option<usize>,
    },
    /// Relay the last statement's result set with the column definitions of
    /// rewritten columns replaced by the logical table's.
    Patched(Arc<ColumnPatch>),
}

/// Affected rows of a synthesised OK packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Affected {
    /// Always this many.
    Fixed(u64),
    /// `INSERT … ON DUPLICATE KEY UPDATE` semantics: 1 when statement `probe`
    /// inserted a row (reported 1 affected row), 2 when the row existed.
    InsertedOrUpdated {
        /// The statement whose affected rows tell whether the row was new.
        probe: usize,
    },
    /// The rows an `INSERT IGNORE … ON DUPLICATE KEY UPDATE` of `rows` rows wrote
    /// (inserted or updated; a row the server skipped, for a foreign key or a CHECK,
    /// counts nothing): from statement `probe`'s affected rows (1 per insert, 2 per
    /// update) less its duplicates (the updates, from its info).
    WrittenOf {
        /// The upsert.
        probe: usize,
        /// Its rows.
        rows: u64,
    },
}

/// Column definitions to restore in a rewritten read.
///
/// Columns read through a derived table arrive with the derived table's alias as
/// `org_table`, and a computed column (a counter summed over slot rows) also with an
/// empty schema and a computed type; the original statement would have returned the
/// logical column's definition. Columns are recognised by their `org_table` (one of
/// `tables`: the aliases the rewrite gave its derived tables) and `org_name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnPatch {
    /// Derived-table aliases the rewrite introduced (compared case-insensitively).
    pub tables: Vec<String>,
    /// Logical column definitions by lower-cased column name.
    pub columns: Vec<(String, crate::wire::resultset::ColumnDef)>,
    /// Restore the column flags too (but not nullability, which is the query's): the
    /// physical table declares keys and AUTO_INCREMENT differently from the logical one.
    pub flags_from_logical: bool,
    /// Physical tables read inside the derived tables: columns read through a
    /// temporary table (a join sorted by a column of a later table, GROUP BY, DISTINCT)
    /// arrive with one of these as `org_table`, and so do some read straight from it.
    pub materialized: Vec<String>,
    /// Lower-cased columns that carry key flags in the physical table (its primary key,
    /// an indexed AUTO_INCREMENT column). One of them arriving from a `materialized`
    /// table without any key or AUTO_INCREMENT flag shows that the server read through a
    /// temporary table; it then reports no key flags and no AUTO_INCREMENT for the
    /// logical table's columns either, so the arriving flags are kept.
    pub keyed: Vec<String>,
    /// Columns the rewrite computes itself (an aggregate answered from a summary
    /// table, a column read through it), by lower-cased name in the derived table:
    /// the definition replaces the arriving one, except the name the client gave and,
    /// for a text column, the character set and length (the session's
    /// `character_set_results`).
    pub computed: Vec<(String, crate::wire::resultset::ColumnDef)>,
    /// Flags to add to output columns by lower-cased name (as the client sees it),
    /// after the rest: a column the outer query computes, whose flags the original
    /// would have had from its own plan (a temporary table for `GROUP BY`).
    pub set_flags: Vec<(String, u16)>,
}

/// What a rule wants to run instead of a statement.
///
/// A struct rather than a bare list so that rule kinds can later describe more than
/// the statements (for example how to shape the reply) without changing [`Rule`].
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Plan {
    /// The statements to run, in order; at least one. Values come from the original
    /// statement through its markers (see [`PlanContext`]) or from
    /// [`PlanContext::random_below`]; the rule must not add `?` placeholders of its own.
    pub statements: Vec<Statement>,
    /// How the client's answer is built (see [`Rewritten::reply`]).
    pub reply: Reply,
    /// The statements must commit together (see [`Rewritten::atomic`]).
    pub atomic: bool,
    /// Texts rendered like the statements (markers replaced by the values of each
    /// execution) but not run: pieces only the kind's [`Plan::merge`] reads (what
    /// they are and in which order is the kind's business).
    pub aux: Vec<String>,
    /// The kind's group-commit half ([`Merger`], in `kinds/<kind>/merge.rs`): how
    /// the connection layer merges concurrent executions and answers each, from the
    /// pieces in `aux`. `None`: every execution runs its own statements.
    pub merge: Option<Arc<dyn Merger>>,
    /// For prepared statements: (client parameter index, check) for each parameter
    /// whose value decides whether the rewrite keeps the statement's meaning.
    pub param_checks: Vec<(usize, ParamCheck)>,
    /// The rule declines a statement it exists to answer (a read a rollup cannot
    /// answer exactly), for this reason: it is forwarded unchanged and counted as
    /// the rule's fallback, so a DBA sees which statements miss and why (`SHOW
    /// FALLBACKS`). `statements` is empty.
    pub fallback: Option<Arc<str>>,
    /// A cheaper form of `statements` that needs values only the server can
    /// compute (see [`Prelude`]); text protocol only.
    pub prelude: Option<Prelude>,
}

/// Two steps instead of one: a `SELECT` of constant expressions runs first, and
/// the rule's [`PreludeValues`] turns its row into literals that are written into the
/// statements that then run in place of [`Plan::statements`]. For reads whose
/// constant expressions (`NOW() - INTERVAL 7 DAY` and what follows from it) cost the
/// server more as expressions than as literals, or whose best shape depends on
/// their values.
///
/// When the query fails or warns, or the values decline the row, [`Plan::statements`]
/// run instead: both forms must mean the same. The query must not change anything;
/// nothing else runs between it and the statements on the connection, so the
/// session's time zone and clock settings are the same for both, and a statement
/// that reads `NOW()` later than the query did answers as the same statement
/// started at the query's moment would.
#[derive(Clone, Debug)]
pub struct Prelude {
    /// The `SELECT` computing the row.
    pub query: Vec<Statement>,
    /// The literals the row gives the statements' [`PlanContext::computed`] markers.
    pub values: Arc<dyn PreludeValues>,
    /// The statements to run with the literals.
    pub statements: Vec<Statement>,
    /// When the query fails or warns, or the values decline the row, the original
    /// statement is forwarded unchanged (counted as the rule's fallback) instead of
    /// [`Plan::statements`]: for rewrites whose one-step form is exact only for the
    /// values the prelude accepts.
    pub original_on_decline: bool,
}

/// The reason shown (`SHOW FALLBACKS`) for a statement forwarded unchanged because
/// its prelude declined the values (see [`Prelude::original_on_decline`]).
pub const PRELUDE_DECLINED: &str = "the values the server computed first for this statement (its bounds) are not exact in the one-step form";

impl PartialEq for Prelude {
    fn eq(&self, other: &Self) -> bool {
        self.query == other.query
            && *self.values == *other.values
            && self.statements == other.statements
            && self.original_on_decline == other.original_on_decline
    }
}

/// How a rule turns its [`Prelude`] row into literals.
pub trait PreludeValues: Send + Sync + fmt::Debug {
    /// A name for logs and comparisons.
    fn name(&self) -> &'static str;

    /// The literal of each [`PlanContext::computed`] index, from the row (cells,
    /// `None` for NULL, as text) and each column's MySQL type; `None` when the row
    /// does not allow the literal form.
    fn literals(&self, row: &[Option<&[u8]>], types: &[u8]) -> Option<Vec<String>>;
}

impl PartialEq for dyn PreludeValues {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for dyn PreludeValues {}

impl Plan {
    /// A [`Plan::fallback`]: forward the statement unchanged, counted, for `reason`
    /// (which must not quote the statement's values: one reason serves every
    /// statement of the shape).
    pub fn fallback(reason: &str) -> Plan {
        Plan {
            fallback: Some(Arc::from(reason)),
            ..Default::default()
        }
    }
}

impl From<Vec<Statement>> for Plan {
    fn from(statements: Vec<Statement>) -> Self {
        Plan {
            statements,
            ..Default::default()
        }
    }
}

/// One rule: a kind of rewrite configured for some tables.
///
/// Rules are pure: the outcome of [`Rule::plan`] may depend only on the statement, on
/// the [`PlanContext`] fields and on the literal values the rule reads through
/// [`PlanContext::literal`]. It is cached and reused for every statement with the
/// same fingerprint, current database, protocol and lexer mode.
pub trait Rule: Send + Sync {
    /// The rule's name, as written in the rules file; shown in errors.
    fn name(&self) -> &str;

    /// The tables this rule is about. Only statements that name one of them reach
    /// [`Rule::plan`].
    fn tables(&self) -> &[TableName];

    /// Decide what to do with a statement that names one of [`Rule::tables`].
    ///
    /// - `Ok(None)`: the statement is fine as it is (for example it reads the table in
    ///   a way that stays correct, or it only names a column of the same name).
    /// - `Ok(Some(plan))`: run `plan.statements` instead.
    /// - `Err(reason)`: refuse the statement; `reason` reaches the client.
    ///
    /// In `stmt`, literals and parameters usually appear as markers: values of
    /// [`Value::Placeholder`] such as `?3`. Inspect them with [`PlanContext::slot`] and
    /// [`PlanContext::literal`], which also understand plain literals (a statement
    /// whose literals could not be marked arrives with them as parsed values).
    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, String>;

    /// A query the rule needs answered (on the client's connection, whose default
    /// database is `current_db`) before it can plan, or `None` when it knows enough.
    /// Asked for every statement that names the rule's table, so keep it cheap.
    fn metadata_query(&self, _current_db: Option<&str>) -> Option<String> {
        None
    }

    /// In shadow mode the rule's decisions are only counted and logged; statements
    /// pass through unchanged.
    fn shadow(&self) -> bool {
        false
    }

    /// Whether [`Rule::plan`] may change `UPDATE` and `DELETE` statements. A rule
    /// that leaves them as they are (`false`: triggers keep its tables) lets the
    /// ones it cannot parse (`UPDATE IGNORE …`) pass through instead of refusing
    /// them.
    fn plans_updates(&self) -> bool {
        true
    }

    /// Whether a read or row write of this rule's tables that the parser cannot
    /// read (`LOAD DATA`, `SELECT … INTO OUTFILE`, a compound `INTERVAL` unit, …) may
    /// run as the client sent it, counted as the rule's fallback. True for rules
    /// whose tables the application names still hold all the data any statement
    /// touches and whose other tables the database keeps (triggers): running such
    /// a statement unchanged keeps MariaDB's exact meaning. False (the default):
    /// such statements are refused, since the rule cannot tell what they mean.
    fn runs_unread(&self) -> bool {
        false
    }

    /// Whether the rule's rewrites may merge concurrent executions into one write
    /// (group commit): sessions then run with the server's session state tracking
    /// on for the proxy (`relay::state`), which only such rules need.
    fn merges(&self) -> bool {
        false
    }

    /// Whether other rules may be about the same table, and in which order the
    /// engine asks them: `Some(rank)` for rules that share (lower ranks first — the
    /// smallest rollup of a log before larger ones; the first plan wins), `None`
    /// (default) for a rule that must be its table's only rule.
    fn sharing(&self) -> Option<u32> {
        None
    }

    /// Called once when the engine is built, with the other sharing rules about one
    /// of this rule's tables (only for rules whose [`Rule::sharing`] is `Some`), so
    /// that a rule can take part of an answer from another's tables (a day rollup
    /// the ragged edges of a range from an hour rollup). Plans made afterwards may
    /// use what it learnt; the engine is built before any plan.
    fn cooperate(&self, _sharing: &[Arc<dyn Rule>]) {}

    /// The rule as `Any`, for [`Rule::cooperate`] to recognise rules of its kind.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Physical tables the rule's rewrites run against, each with the logical table
    /// the application named, as (physical, logical) table names: the server's
    /// messages about a rewritten statement (``… for column `db`.`ring`.`c` …``) are
    /// shown with the logical name.
    fn physical_tables(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Receives the column definitions of [`Rule::metadata_query`]'s result.
    fn provide_metadata(
        &self,
        _current_db: Option<&str>,
        _columns: &[crate::wire::resultset::ColumnDef],
    ) {
    }
}

impl fmt::Debug for dyn Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name())
            .field("tables", &self.tables())
            .finish()
    }
}

/// A literal value of the original statement, as the client wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Literal<'a> {
    /// What kind of literal it is.
    pub kind: LiteralKind,
    /// Its source text, byte for byte: quotes, escapes and introducer included
    /// (`'it\'s'`, `_utf8mb4'x'`, `1.5e3`, `0x1F`).
    pub text: Cow<'a, [u8]>,
}

impl Literal<'_> {
    /// The value of a decimal integer literal (`42`), if it is one.
    pub fn as_i64(&self) -> Option<i64> {
        if self.kind != LiteralKind::Number {
            return None;
        }
        std::str::from_utf8(&self.text).ok()?.parse().ok()
    }
}

/// The dependency a plan takes on by reading a select item's spelling
/// ([`PlanContext::spelt_item`]), among the literal indices it read.
pub(crate) const SPELLING: usize = usize::MAX;

/// A value the proxy chooses each time a rewrite is rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dynamic {
    /// A uniformly random integer in `0..n` (`n` ≥ 1).
    RandomBelow(u32),
    /// Literal `i` of the plan's [`Prelude`] row; only in [`Prelude::statements`].
    Computed(u16),
}

/// What a rule may know while planning, and the functions to read values and to ask
/// for proxy-chosen values.
///
/// `in_transaction` is deliberately absent: plans are cached regardless of it.
pub struct PlanContext<'a> {
    /// The connection's default database, to resolve unqualified table names (use
    /// [`PlanContext::names_table`]). Part of the cache key.
    pub current_db: Option<&'a str>,
    /// The statement is being prepared (its `?` values come at execute time). Part
    /// of the cache key.
    pub prepared: bool,
    /// Marker `?k` stands for `slots[k - 1]`.
    slots: &'a [Slot],
    /// The original statement bytes, to read literal text.
    sql: &'a [u8],
    /// The original statement's literal tokens, in text order.
    literals: &'a [sqltok::Token],
    /// All of the original statement's tokens (see [`PlanContext::spelt_item`]).
    tokens: &'a [sqltok::Token],
    /// (table, database) of each db-qualified table name in the statement, as
    /// written; see [`PlanContext::table_db`].
    qualifiers: Vec<(String, String)>,
    /// Indices of the literals the rule read; the plan is then cached per value.
    reads: RefCell<Vec<usize>>,
    /// Proxy-chosen values requested by the rule; marker `?(slots.len() + 1 + d)` is
    /// `dynamics[d]`.
    dynamics: RefCell<Vec<Dynamic>>,
}

impl<'a> PlanContext<'a> {
    /// A context for one planning run (built by the engine, and by rule tests).
    pub(crate) fn new(
        current_db: Option<&'a str>,
        prepared: bool,
        slots: &'a [Slot],
        sql: &'a [u8],
        literals: &'a [sqltok::Token],
    ) -> Self {
        PlanContext {
            current_db,
            prepared,
            slots,
            sql,
            literals,
            tokens: &[],
            qualifiers: Vec::new(),
            reads: RefCell::new(Vec::new()),
            dynamics: RefCell::new(Vec::new()),
        }
    }

    /// All of the statement's tokens, for [`PlanContext::spelt_item`].
    pub(crate) fn with_tokens(mut self, tokens: &'a [sqltok::Token]) -> Self {
        self.tokens = tokens;
        self
    }

    /// Select item `i` as the client spelt it, which is how MariaDB names an
    /// unaliased item in the result (`COUNT( * )`, whitespace and case kept):
    /// `None` unless the statement is a plain `SELECT … FROM`, the item holds no
    /// comment (MariaDB leaves comments out of the name), only printable ASCII, and
    /// at most 64 bytes. Reading it makes the plan depend on the spelling of the
    /// whole select list: the outcome is then cached per spelling, as for
    /// [`PlanContext::literal`] per value.
    pub fn spelt_item(&self, i: usize) -> Option<String> {
        let items = sqltok::select_list(self.sql, self.tokens)?;
        let range = items.get(i)?;
        if range.len() > 64 || !sqltok::spelt_plainly(self.sql, self.tokens, range) {
            return None;
        }
        let text = std::str::from_utf8(&self.sql[range.clone()])
            .ok()?
            .to_string();
        let mut reads = self.reads.borrow_mut();
        if !reads.contains(&SPELLING) {
            reads.push(SPELLING);
        }
        Some(text)
    }

    /// The statement's db-qualified table names, (table, database) as written.
    pub(crate) fn with_qualifiers(mut self, qualifiers: Vec<(String, String)>) -> Self {
        self.qualifiers = qualifiers;
        self
    }

    /// The database whose `table` the statement means (see [`table_db`]): a rule
    /// learns and reads that database's columns of its table, so that
    /// `UPDATE app.hits …` needs no `USE app`.
    pub fn table_db<'s>(&'s self, table: &'s TableName) -> Option<&'s str> {
        table_db(table, &self.qualifiers, self.current_db)
    }

    /// The marker number in `expr`, if it is a marker placeholder (`?k`, k ≥ 1).
    fn marker(expr: &Expr) -> Option<usize> {
        match expr {
            Expr::Value(v) => match &v.value {
                Value::Placeholder(p) => p.strip_prefix('?')?.parse::<usize>().ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// Which original literal or parameter `expr` stands for, if it is a marker for
    /// one. Reading the slot does not make the plan depend on the literal's value.
    pub fn slot(&self, expr: &Expr) -> Option<Slot> {
        let k = Self::marker(expr)?;
        self.slots.get(k.checked_sub(1)?).copied()
    }

    /// The literal `expr` stands for: a marker for an original literal, or a plain
    /// literal value. `None` for parameters and anything else.
    ///
    /// Reading a marker's value makes the plan depend on it: the outcome is then
    /// cached per value of the literals read, so read only what the decision needs.
    pub fn literal(&self, expr: &Expr) -> Option<Literal<'a>> {
        if let Some(slot) = self.slot(expr) {
            let Slot::Literal(i) = slot else {
                return None;
            };
            let tok = self.literals.get(i)?;
            let sqltok::TokenKind::Literal(kind) = tok.kind else {
                return None;
            };
            let mut reads = self.reads.borrow_mut();
            if !reads.contains(&i) {
                reads.push(i);
            }
            return Some(Literal {
                kind,
                text: Cow::Borrowed(&self.sql[tok.start..tok.end]),
            });
        }
        let (kind, text) = match expr {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => (LiteralKind::Number, n.to_string()),
                Value::HexStringLiteral(_) => (LiteralKind::Hex, v.value.to_string()),
                Value::SingleQuotedString(_)
                | Value::DoubleQuotedString(_)
                | Value::NationalStringLiteral(_) => (LiteralKind::String, v.value.to_string()),
                _ => return None,
            },
            Expr::Prefixed { prefix, value } if prefix.value.starts_with('_') => {
                let inner = self.literal(value)?;
                (inner.kind, expr.to_string())
            }
            _ => return None,
        };
        Some(Literal {
            kind,
            text: Cow::Owned(text.into_bytes()),
        })
    }

    /// The class of the literal `expr` stands for (a marker for an original
    /// literal, or a plain literal value; also under a charset introducer). Unlike
    /// [`PlanContext::literal`] this does not make the plan depend on the value:
    /// classes are part of the cache key. `None` for parameters, `NULL`, `TRUE` and
    /// anything else.
    pub fn literal_class(&self, expr: &Expr) -> Option<LiteralClass> {
        if let Some(slot) = self.slot(expr) {
            let Slot::Literal(i) = slot else {
                return None;
            };
            let tok = self.literals.get(i)?;
            let sqltok::TokenKind::Literal(kind) = tok.kind else {
                return None;
            };
            return Some(LiteralClass::of(kind, &self.sql[tok.start..tok.end]));
        }
        match expr {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => Some(LiteralClass::of(LiteralKind::Number, n.as_bytes())),
                Value::HexStringLiteral(_) => Some(LiteralClass::Hex),
                Value::SingleQuotedString(_)
                | Value::DoubleQuotedString(_)
                | Value::NationalStringLiteral(_) => Some(LiteralClass::of(
                    LiteralKind::String,
                    v.value.to_string().as_bytes(),
                )),
                _ => None,
            },
            Expr::Prefixed { prefix, value } if prefix.value.starts_with('_') => {
                match self.literal_class(value)? {
                    LiteralClass::String { bytes } => Some(LiteralClass::String {
                        bytes: bytes.saturating_add(prefix.value.len().min(255) as u16 + 1),
                    }),
                    other => Some(other),
                }
            }
            _ => None,
        }
    }

    /// An expression that renders as a random integer in `0..n`, chosen by the proxy
    /// each time the rewrite is rendered (for a prepared statement: once, when it is
    /// prepared). `n` is clamped to at least 1. Use it to pick a slot row instead of
    /// `RAND()`, which is unsafe for statement-based replication.
    pub fn random_below(&self, n: u32) -> Expr {
        let mut d = self.dynamics.borrow_mut();
        d.push(Dynamic::RandomBelow(n.max(1)));
        let k = self.slots.len() + d.len();
        Expr::Value(Value::Placeholder(format!("?{k}")).into())
    }

    /// An expression that renders as literal `i` of the plan's [`Prelude`] row (see
    /// [`PreludeValues::literals`]). Only for [`Prelude::statements`].
    pub fn computed(&self, i: u16) -> Expr {
        let mut d = self.dynamics.borrow_mut();
        d.push(Dynamic::Computed(i));
        let k = self.slots.len() + d.len();
        Expr::Value(Value::Placeholder(format!("?{k}")).into())
    }

    /// Whether `name` (as written in the statement) refers to `table`: the last part
    /// matches the table name and the database (explicit, or the connection's
    /// default) matches when the rule names one. Names compare ASCII
    /// case-insensitively. An unqualified name with no default database counts as a
    /// match (the server rejects it anyway).
    pub fn names_table(&self, name: &ObjectName, table: &TableName) -> bool {
        let parts: Vec<&str> = name
            .0
            .iter()
            .filter_map(|p| p.as_ident().map(|i| i.value.as_str()))
            .collect();
        if parts.len() != name.0.len() {
            return false;
        }
        let (db, tbl) = match parts.as_slice() {
            [tbl] => (self.current_db, *tbl),
            [db, tbl] => (Some(*db), *tbl),
            _ => return false,
        };
        if !tbl.eq_ignore_ascii_case(&table.name) {
            return false;
        }
        match (&table.db, db) {
            (Some(want), Some(have)) => want.eq_ignore_ascii_case(have),
            _ => true,
        }
    }

    /// The literal indices read so far, and the dynamic values requested.
    pub(crate) fn finish(self) -> (Vec<usize>, Vec<Dynamic>) {
        let mut reads = self.reads.into_inner();
        reads.sort_unstable();
        (reads, self.dynamics.into_inner())
    }
}

/// Why an [`Engine`] could not be built from a set of rules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    /// A rule has an empty name.
    #[error("a rule has an empty name")]
    EmptyRuleName,
    /// Two rules share a name; errors and metrics would be ambiguous.
    #[error("two rules are named '{0}'")]
    DuplicateRule(String),
    /// A rule names no table, so it could never apply.
    #[error("rule '{0}' names no table")]
    NoTables(String),
    /// A rule names a table with an empty name.
    #[error("rule '{0}' names a table with an empty name")]
    EmptyTableName(String),
    /// Two rules claim the same table; which one applies would be ambiguous.
    #[error("rules '{first}' and '{second}' both name table '{table}'")]
    SharedTable {
        /// The rule listed first.
        first: String,
        /// The rule listed second.
        second: String,
        /// The table both name.
        table: String,
    },
    /// The table-name scanner could not be built.
    #[error("cannot build the table-name scanner: {0}")]
    Prefilter(String),
}

#[cfg(test)]
mod lexing_tests {
    use super::*;

    #[test]
    fn statements_that_may_change_lexing() {
        for sql in [
            &b"SET NAMES gbk"[..],
            b"set names 'sjis' collate sjis_bin",
            b"SET CHARSET gbk",
            b"SET CHARACTER SET gbk",
            b"SET character_set_client = gbk",
            b"SET @@session.character_set_client = gbk",
            b"SET collation_connection = gbk_bin",
            b"SET sql_mode = 'NO_BACKSLASH_ESCAPES'",
            b"SET @@SQL_MODE = CONCAT(@@sql_mode, ',ANSI_QUOTES')",
            b"SET STATEMENT sql_mode = '' FOR SELECT 1",
            b"/*!40101 SET NAMES utf8 */",
            b"SELECT 1; SET NAMES gbk",
            b"CALL p()",
            b"EXECUTE s",
            b"EXECUTE IMMEDIATE @q",
            b"SET autocommit = 1, NAMES gbk",
            b"  -- c\n/* c */ # c\n set names gbk",
            b"/*M!100100 SET sql_mode = '' */",
            b"call p",
            b"SELECT 1 ; /*! SET NAMES gbk */",
        ] {
            assert!(may_change_lexing(sql), "{}", String::from_utf8_lossy(sql));
        }
        for sql in [
            &b"UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'"[..],
            b"SET autocommit = 1",
            b"SELECT surnames, recall, callback FROM t",
            b"SELECT _names FROM t",
            b"SELECT names, charset FROM t;",
            b"UPDATE t SET names = 1 WHERE charset = 2",
            b"SELECT 'SET NAMES gbk'",
            b"",
        ] {
            assert!(!may_change_lexing(sql), "{}", String::from_utf8_lossy(sql));
        }
    }

    #[test]
    fn session_state_answers() {
        let l = Lexing::from_server(
            b"gbk",
            b"STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES,ansi_quotes",
        );
        assert_eq!(l.charset.name, "gbk");
        assert_eq!(l.charset.class, CharsetClass::Refused);
        assert!(l.mode.no_backslash_escapes && l.mode.ansi_quotes);
        assert_eq!(l.refused_mode, None);
        let l = Lexing::from_server(b"utf8mb3", b"");
        assert_eq!(l.charset.class, CharsetClass::Utf8mb3);
        assert_eq!(l.mode, LexMode::default());
        let l = Lexing::from_server(b"latin1", b"PIPES_AS_CONCAT,EMPTY_STRING_IS_NULL");
        assert_eq!(l.charset.class, CharsetClass::AnyByte);
        assert_eq!(l.refused_mode, Some("EMPTY_STRING_IS_NULL"));
        assert_eq!(
            Lexing::from_server(b"klingon", b"").charset.class,
            CharsetClass::Refused
        );
    }

    #[test]
    fn well_formed_literals() {
        let u4 = Charset::UTF8MB4;
        let u3 = Charset::from_name(b"utf8");
        let ascii = Charset::from_name(b"ascii");
        let latin1 = Charset::from_name(b"LATIN1");
        assert!(u4.accepts("'café 🎉'".as_bytes()));
        assert!(!u4.accepts(b"'\xff'"));
        assert!(!u4.accepts(b"'\xc3'"));
        assert!(u3.accepts("'café'".as_bytes()));
        assert!(!u3.accepts("'🎉'".as_bytes()));
        assert!(ascii.accepts(b"'abc'") && !ascii.accepts(b"'\xe9'"));
        assert!(latin1.accepts(b"'\xff\xfe'"));
        assert!(!Charset::from_name(b"gbk").accepts(b"'a'"));
    }
}

#[cfg(test)]
mod fingerprint_tests {
    use super::ParamCheck;

    #[test]
    fn parameter_checks() {
        use crate::wire::resultset::types;
        let utf8 = Some(super::Charset::UTF8MB4);
        let fails = |c: ParamCheck, t: u8, unsigned: bool, v: Option<&[u8]>| {
            c.violation([t, if unsigned { 0x80 } else { 0 }], v, utf8)
                .is_some()
        };
        let key = ParamCheck::String { max_bytes: 4 };
        assert!(!fails(key, 0xfe, false, Some(b"\x04home")));
        assert!(fails(key, 0xfe, false, Some(b"\x05homes")));
        assert!(fails(key, 0xfe, false, Some(b"\x03\xff\xfe\x41")));
        assert!(key.violation([0xfe, 0], Some(b"\x04home"), None).is_some());
        assert!(fails(
            key,
            types::LONGLONG,
            false,
            Some(&0i64.to_le_bytes())
        ));
        assert!(fails(key, types::DOUBLE, false, Some(&1f64.to_le_bytes())));
        assert!(fails(key, 0xfe, false, None));
        let int = ParamCheck::Integer {
            min: -128,
            max: 127,
        };
        assert!(!fails(
            int,
            types::LONGLONG,
            false,
            Some(&127i64.to_le_bytes())
        ));
        assert!(!fails(int, types::TINY, false, Some(&[0x80])));
        assert!(fails(int, types::TINY, true, Some(&[0x80])));
        assert!(fails(int, types::LONG, false, Some(&128i32.to_le_bytes())));
        assert!(!fails(int, 0xfd, false, Some(b"\x03-12")));
        assert!(fails(int, 0xfd, false, Some(b"\x031.5")));
        assert!(fails(int, 0xfd, false, Some(b"\x00")));
        assert!(fails(int, types::NEWDECIMAL, false, Some(b"\x011")));
        assert!(fails(int, types::LONGLONG, false, None));
        assert!(ParamCheck::NotNull
            .violation([0xfe, 0], Some(b"\x00"), None)
            .is_none());
        assert!(ParamCheck::NotNull
            .violation([0xfe, 0], None, None)
            .is_some());
    }

    #[test]
    fn datetime_checks_take_valid_dates_of_their_years() {
        use crate::wire::resultset::types;
        let check = ParamCheck::Datetime {
            min_year: 1000,
            max_year: 9998,
        };
        assert!(check.declines() && !ParamCheck::NotNull.declines());
        let ok = |ty: u8, v: &[u8]| check.violation([ty, 0], Some(v), None).is_none();
        let s = |text: &str| [&[text.len() as u8][..], text.as_bytes()].concat();
        for good in [
            "2024-05-02",
            "2024-05-02 10:30:00",
            "2024-02-29 23:59:59.999999",
            "1000-01-01 00:00:00.5",
            "9998-12-31",
        ] {
            assert!(ok(0xfd, &s(good)) && ok(0xfe, &s(good)), "{good}");
        }
        for bad in [
            "0000-00-00",
            "2024-00-10",
            "2023-02-29",
            "2024-04-31 00:00:00",
            "2024-05-02 24:00:00",
            "2024-05-02 10:30",
            " 2024-05-02",
            "2024-05-02T10:30:00",
            "2024-05-02 10:30:00.",
            "2024-05-02 10:30:00.1234567",
            "9999-12-31 23:59:59",
            "0999-12-31",
            "20240502",
            "",
        ] {
            assert!(!ok(0xfd, &s(bad)), "{bad}");
        }
        // DATETIME / DATE / TIMESTAMP binary values: length, year, month, day[, time[, µs]].
        let y = 2024u16.to_le_bytes();
        assert!(ok(types::DATETIME, &[7, y[0], y[1], 5, 2, 10, 30, 0]));
        assert!(ok(types::DATE, &[4, y[0], y[1], 2, 29]));
        assert!(ok(
            types::TIMESTAMP,
            &[11, y[0], y[1], 5, 2, 10, 30, 0, 0x3f, 0x42, 0x0f, 0]
        ));
        assert!(!ok(types::DATETIME, &[0]));
        assert!(!ok(types::DATETIME, &[4, y[0], y[1], 2, 30]));
        assert!(!ok(types::DATETIME, &[7, y[0], y[1], 5, 2, 10, 60, 0]));
        assert!(!ok(types::DATETIME, &[7, y[0], y[1], 5, 2]));
        assert!(!ok(types::DATETIME, &[5, y[0], y[1], 5, 2, 1]));
        assert!(!ok(types::LONGLONG, &20240502i64.to_le_bytes()));
        assert!(check.violation([0xfd, 0], None, None).is_some());
        let shifted = ParamCheck::Datetime {
            min_year: 1201,
            max_year: 9798,
        };
        assert!(shifted
            .violation([0xfd, 0], Some(&s("1200-12-31")), None)
            .is_some());
    }

    #[test]
    fn fingerprints_hide_literal_values() {
        let f = super::fingerprint(b"UPDATE hits SET cnt = cnt + 5 WHERE slug = 'secret' /* c */");
        assert!(!f.contains("secret") && !f.contains('5'), "{f}");
        assert!(f.contains("hits"), "{f}");
        assert_eq!(
            super::fingerprint(b"SELECT 'a"),
            "<9 bytes that do not lex>"
        );
        // Under NO_BACKSLASH_ESCAPES `'x\'` ends at the backslash.
        let nbe = super::LexMode {
            no_backslash_escapes: true,
            ansi_quotes: false,
        };
        let f = super::fingerprint_in(b"SET a = 'x\\', b = 'secret'", nbe);
        assert_eq!(f, "SET a = ? , b = ?");
        // Under ANSI_QUOTES a double-quoted name is no value.
        let ansi = super::LexMode {
            no_backslash_escapes: false,
            ansi_quotes: true,
        };
        assert_eq!(
            super::fingerprint_in(b"SELECT \"c\" FROM t", ansi),
            "SELECT `c` FROM t"
        );
    }
}

#[cfg(test)]
mod share_tests {
    use super::NodeShare;

    #[test]
    fn reads_index_and_cluster_size() {
        assert_eq!(
            NodeShare::from_server(b"1/3"),
            Some(NodeShare { index: 1, nodes: 3 })
        );
        // Not a cluster, a cluster of one, a node outside the primary component.
        assert_eq!(NodeShare::from_server(b""), None);
        assert_eq!(NodeShare::from_server(b"0/1"), None);
        assert_eq!(NodeShare::from_server(b"18446744073709551615/3"), None);
        assert_eq!(NodeShare::from_server(b"3/3"), None);
    }

    #[test]
    fn a_server_without_a_provider_is_not_a_node() {
        use super::ClusterInfo;
        // Debian's MariaDB without wsrep on: the status exists, the cluster is empty.
        let plain = ClusterInfo::from_server(Some(b"18446744073709551615/0"));
        assert_eq!(plain, ClusterInfo::default());
        assert_eq!(ClusterInfo::from_server(None), ClusterInfo::default());
        let single = ClusterInfo::from_server(Some(b"0/1"));
        assert!(single.galera && single.share.is_none());
        let three = ClusterInfo::from_server(Some(b"2/3"));
        assert!(three.galera);
        assert_eq!(three.share, Some(NodeShare { index: 2, nodes: 3 }));
    }

    #[test]
    fn each_node_picks_from_its_own_range_of_slots() {
        for nodes in 2..=5u32 {
            let mut seen = vec![None; 16];
            for index in 0..nodes {
                let share = Some(NodeShare { index, nodes });
                for _ in 0..400 {
                    let v = NodeShare::pick_below(share, 16) as usize;
                    assert!(v < 16);
                    assert!(
                        seen[v].is_none_or(|owner| owner == index),
                        "slot {v} picked by nodes {seen:?} and {index}"
                    );
                    seen[v] = Some(index);
                }
            }
            // Every slot belongs to some node.
            assert!(seen.iter().all(Option::is_some), "{nodes} nodes: {seen:?}");
        }
        // More nodes than slots, or no share: any slot.
        let many = Some(NodeShare { index: 7, nodes: 8 });
        assert!((0..100).all(|_| NodeShare::pick_below(many, 4) < 4));
        assert!((0..100).all(|_| NodeShare::pick_below(None, 4) < 4));
    }
}
