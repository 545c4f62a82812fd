//! What the engine tells the connection about one statement: the [`Decision`]
//! (pass through, reject, rewrite, fall back, or learn something first), what a
//! rewrite runs and how its reply is built ([`Rewritten`], [`Reply`]), and the
//! checks a prepared statement's parameters must pass ([`ParamCheck`]).

use std::fmt;
use std::sync::Arc;

use super::charset::{Charset, Lexing};
use super::cluster::NodeShare;
use super::merge::Merger;
use super::refusal::{Refusal, RefusalClass};

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
    /// [`Engine::provide_metadata`](super::Engine::provide_metadata), and decide again.
    NeedMetadata(MetadataRequest),
    /// The statement names a ruled table, but the session's character set or
    /// `sql_mode` may have changed ([`StatementContext::lexing`] is `None`): run
    /// [`SESSION_STATE_QUERY`](super::SESSION_STATE_QUERY) on the client's own connection, record its answer
    /// ([`Lexing::from_server`](super::Lexing::from_server)) and decide again.
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
    /// [`Engine::provide_metadata`](super::Engine::provide_metadata).
    pub db: Option<String>,
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
    /// What kind of obstacle it is (see [`RefusalClass`]).
    pub class: RefusalClass,
    /// What is wrong, in words a DBA or developer can act on.
    pub reason: String,
}

impl Rejection {
    /// The rejection of a statement by `rule` for `refusal`.
    pub fn new(rule: Arc<str>, refusal: Refusal) -> Rejection {
        Rejection {
            rule,
            class: refusal.class(),
            reason: refusal.into_reason(),
        }
    }

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
    /// Rendered auxiliary texts of the plan (see [`Plan::aux`](super::Plan::aux)).
    pub aux: Vec<Vec<u8>>,
    /// Only for prepared statements: for each text of `aux`, where its `?`s are
    /// (byte offset) and which original parameter each takes. Empty for text
    /// statements.
    pub aux_holes: Vec<Vec<(usize, usize)>>,
    /// The kind's group-commit half: how concurrent autocommit executions of this
    /// rewrite for the same target merge into one write (see [`Plan::merge`](super::Plan::merge)).
    pub merge: Option<Arc<dyn Merger>>,
    /// Only for prepared statements: the checks each execute's parameters must pass
    /// (see [`Plan::param_checks`](super::Plan::param_checks)).
    pub param_checks: Vec<(usize, ParamCheck)>,
    /// Text statements only: the two-step form of the rewrite (see [`Prelude`](super::Prelude)).
    pub prelude: Option<Arc<RenderedPrelude>>,
    /// The reply's column flags follow the server's plan of the original statement
    /// (see [`Plan::plan_flags`](super::Plan::plan_flags)).
    pub probe: Option<Arc<Probe>>,
    /// Runs as sent when it fails (see [`Plan::as_sent_on_error`](super::Plan::as_sent_on_error)).
    pub as_sent_on_error: Option<&'static str>,
}

/// How a rewrite learns the plan the server picks for the original statement.
#[derive(Debug, Clone)]
pub struct Probe {
    /// `EXPLAIN FORMAT=JSON ` and the original statement (text statements; a
    /// prepared statement's is prepared from the client's text).
    pub explain: Vec<u8>,
    /// The original statement, run as sent when the plan does not tell.
    pub original: Vec<u8>,
    /// The reply's patch for a plan.
    pub flags: Arc<dyn PlanFlags>,
}

impl PartialEq for Probe {
    fn eq(&self, other: &Self) -> bool {
        self.explain == other.explain
            && self.original == other.original
            && *self.flags == *other.flags
    }
}

impl Eq for Probe {}

/// What `EXPLAIN FORMAT=JSON` is prefixed with to ask the server's plan.
pub const EXPLAIN_JSON: &[u8] = b"EXPLAIN FORMAT=JSON ";

impl Probe {
    /// The probe of the original statement `sql`.
    pub fn of(sql: &[u8], flags: Arc<dyn PlanFlags>) -> Probe {
        Probe {
            explain: [EXPLAIN_JSON, sql].concat(),
            original: sql.to_vec(),
            flags,
        }
    }
}

/// How a rule's reply depends on the server's plan of the original statement (see
/// [`Plan::plan_flags`](super::Plan::plan_flags)).
pub trait PlanFlags: Send + Sync + fmt::Debug {
    /// A name for logs and comparisons.
    fn name(&self) -> &'static str;

    /// The reply's patch for the plan `explain` describes (the document `EXPLAIN
    /// FORMAT=JSON` answers), or `None` when it does not tell.
    fn patch(&self, explain: &[u8]) -> Option<Arc<ColumnPatch>>;
}

impl PartialEq for dyn PlanFlags {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for dyn PlanFlags {}

/// A text with holes for a prelude's literals: (byte offset, literal index), in order.
pub type Holed = (Vec<u8>, Vec<(usize, u16)>);

/// A [`Prelude`](super::Prelude) rendered for one execution.
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
    /// (see [`Prelude::original_on_decline`](super::Prelude::original_on_decline)).
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
    /// let their statements run as sent ([`crate::rewrite::Rule::runs_unread`]).
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
        self.failure(ty, value, charset).map(|f| f.message())
    }

    /// Why the value fails the check, as [`ParamCheck::violation`], but without the
    /// value itself (SHOW REFUSALS and SHOW FALLBACKS group by it, and never show a
    /// value a client sent): "a parameter value outside -128..=127", not "the
    /// parameter value 200 is out of range".
    pub fn violation_reason(
        &self,
        ty: [u8; 2],
        value: Option<&[u8]>,
        charset: Option<Charset>,
    ) -> Option<String> {
        self.failure(ty, value, charset).map(|f| f.reason(self))
    }

    fn failure(
        &self,
        ty: [u8; 2],
        value: Option<&[u8]>,
        charset: Option<Charset>,
    ) -> Option<ParamFailure> {
        use crate::wire::resultset::types;
        let Some(v) = value else {
            return Some(ParamFailure::Null);
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
                    Some(y) => Some(ParamFailure::Year(y)),
                    None => Some(ParamFailure::NotDatetime(ty[0])),
                }
            }
            ParamCheck::String { max_bytes } => {
                if !is_string {
                    return Some(ParamFailure::NotString(ty[0]));
                }
                match (string(v), charset) {
                    (Some(s), Some(cs)) if s.len() <= max_bytes && cs.accepts(&s) => None,
                    (Some(s), Some(cs)) if s.len() <= max_bytes => {
                        Some(ParamFailure::IllFormed(cs.name))
                    }
                    (Some(_), None) => Some(ParamFailure::UnknownCharset),
                    _ => Some(ParamFailure::TooLong(max_bytes)),
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
                    Some(n) => Some(ParamFailure::OutOfRange(n)),
                    None => Some(ParamFailure::NotInteger(ty[0])),
                }
            }
        }
    }
}

/// How a parameter value failed its [`ParamCheck`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParamFailure {
    Null,
    /// A valid date of another year.
    Year(u16),
    /// Of this type, not a valid date and time.
    NotDatetime(u8),
    /// Of this type, not a string.
    NotString(u8),
    /// Not well-formed in this character set.
    IllFormed(&'static str),
    UnknownCharset,
    /// Longer than this many bytes.
    TooLong(usize),
    /// An integer out of the check's range.
    OutOfRange(i128),
    /// Of this type, not an integer.
    NotInteger(u8),
}

impl ParamFailure {
    /// The client's error message (may name the value).
    fn message(self) -> String {
        match self {
            ParamFailure::Year(y) => format!("a date parameter of the year {y}"),
            ParamFailure::OutOfRange(n) => format!("the parameter value {n} is out of range"),
            _ => self.described(),
        }
    }

    /// The same without the value.
    fn reason(self, check: &ParamCheck) -> String {
        match (self, *check) {
            (ParamFailure::Year(_), ParamCheck::Datetime { min_year, max_year }) => {
                format!("a date parameter outside the years {min_year}..={max_year}")
            }
            (ParamFailure::OutOfRange(_), ParamCheck::Integer { min, max }) => {
                format!("a parameter value outside {min}..={max}")
            }
            (ParamFailure::Year(_), _) => "a date parameter of another year".into(),
            (ParamFailure::OutOfRange(_), _) => "a parameter value out of range".into(),
            _ => self.described(),
        }
    }

    /// Failures that name no value.
    fn described(self) -> String {
        match self {
            ParamFailure::Null => "a NULL parameter".into(),
            ParamFailure::NotDatetime(t) => {
                format!("a parameter of type {t:#04x} that is not a valid date and time")
            }
            ParamFailure::NotString(t) => format!("a parameter of type {t:#04x} where a string key is compared (MariaDB would compare numerically)"),
            ParamFailure::IllFormed(cs) => {
                format!("a string parameter that is not well-formed in {cs}")
            }
            ParamFailure::UnknownCharset => "a string parameter in an unknown character set".into(),
            ParamFailure::TooLong(n) => format!("a string parameter longer than {n} bytes"),
            ParamFailure::NotInteger(t) => {
                format!("a parameter of type {t:#04x} that is not an integer")
            }
            ParamFailure::Year(y) => format!("a date parameter of the year {y}"),
            ParamFailure::OutOfRange(n) => format!("the parameter value {n} is out of range"),
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
    ///
    /// `probe` is an `INSERT IGNORE` of the statement's row, `key_probe` an `INSERT
    /// IGNORE` of its key alone (other columns at their defaults; `None` when the
    /// row is the key and the counters alone, which `probe` then is already). The relay reads
    /// each one's warnings and keeps the rewrite only when the row was inserted
    /// without a warning, or when both were skipped by the same duplicate-key
    /// warning (1062, the same message: the row with the statement's key exists and
    /// is the one the statement would update); `key_probe` runs only then and
    /// answers nothing. Otherwise (a value MariaDB converts, a foreign key, a
    /// duplicate on another unique key, …) the attempt is undone and the client's
    /// own statement runs as sent (`relay::splice`, [`UPSERT_DECLINED`](super::UPSERT_DECLINED)).
    InsertedOrUpdated {
        /// The statement whose affected rows tell whether the row was new.
        probe: usize,
        /// The key-only insert that tells whether the duplicate is the key's.
        key_probe: Option<usize>,
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

/// How a rule turns its [`Prelude`](super::Prelude) row into literals.
pub trait PreludeValues: Send + Sync + fmt::Debug {
    /// A name for logs and comparisons.
    fn name(&self) -> &'static str;

    /// The literal of each [`PlanContext::computed`](super::PlanContext::computed) index, from the row (cells,
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The reason SHOW REFUSALS shows names the check, never the value; the
    /// client's message may name it.
    #[test]
    fn violation_reasons_name_no_value() {
        use crate::wire::resultset::types;
        let int = ParamCheck::Integer {
            min: -128,
            max: 127,
        };
        let v = 1000i64.to_le_bytes();
        let ty = [types::LONGLONG, 0];
        assert_eq!(
            int.violation(ty, Some(&v), None).as_deref(),
            Some("the parameter value 1000 is out of range")
        );
        assert_eq!(
            int.violation_reason(ty, Some(&v), None).as_deref(),
            Some("a parameter value outside -128..=127")
        );
        let date = ParamCheck::Datetime {
            min_year: 1000,
            max_year: 9998,
        };
        let y = 999u16.to_le_bytes();
        let d = [4, y[0], y[1], 1, 1];
        assert_eq!(
            date.violation([types::DATE, 0], Some(&d), None).as_deref(),
            Some("a date parameter of the year 999")
        );
        assert_eq!(
            date.violation_reason([types::DATE, 0], Some(&d), None)
                .as_deref(),
            Some("a date parameter outside the years 1000..=9998")
        );
        // Failures that name no value read the same either way.
        let key = ParamCheck::String { max_bytes: 4 };
        for (c, ty, v) in [
            (key, [0xfe, 0], Some(&b"\x05homes"[..])),
            (key, [types::LONGLONG, 0], Some(&v[..])),
            (key, [0xfe, 0], None),
            (int, [0xfd, 0], Some(&b"\x031.5"[..])),
        ] {
            let message = c.violation(ty, v, None).expect("a violation");
            assert_eq!(c.violation_reason(ty, v, None), Some(message));
        }
        assert_eq!(
            int.violation_reason(ty, Some(&5i64.to_le_bytes()), None),
            None
        );
    }
}
