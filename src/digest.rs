//! Query digests of all traffic: what the admin port's `SHOW DIGESTS` lists.
//!
//! Every client statement (COM_QUERY, and COM_STMT_EXECUTE under its prepared
//! text) is counted under its *digest*: the statement's fingerprint (literals as
//! `?`, value lists collapsed, comments dropped, whitespace normalised, keywords
//! uppercase, identifiers as written), read under the session's character set and
//! `sql_mode` with the project's own lexer ([`crate::rewrite::sqltok`]). Rows are
//! kept per (digest, default database, user) with the columns of the row contract
//! (docs/design.md, "Query digests"): executions, first and last seen, latency
//! (sum, min, max and a p99 from a fixed histogram of half-power-of-two buckets),
//! rows sent and affected, errors by code, how heatsink handled the statement and
//! by which rule, and for statements whose WHERE has a `column = literal` equality
//! the heavy hitters of its values ([`HotKeys`]).
//!
//! The fingerprint follows MariaDB's own statement digest closely enough that two
//! statements share a heatsink digest when they share MariaDB's `DIGEST` in
//! `performance_schema` (tests/digests.rs checks a corpus): values fold the way the
//! server's digest reduces them (`?, ...`, `(...)`, `(?) /* , ... */`, a sign folded
//! into a number only after a token that starts an expression). Known differences
//! are listed in docs/design.md.
//!
//! Cost, per statement: one lexer pass into a buffer the session reuses, one pass
//! over its tokens that folds values on a small stack (also reused), and a 64-bit
//! FNV-1a hash of the digest text streamed from that stack — the text itself is
//! built only when a new row enters the table. The table is sharded by key; a
//! statement takes one shard's lock for a map update (never across an await).
//! Each shard holds at most its share of `digest_table_size` rows; a new row in a
//! full shard evicts the least recently seen one (exactly below
//! [`EXACT_EVICTION_UP_TO`] rows a shard, else the oldest of a sample).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::rewrite::sqltok::{self, LexMode, LiteralKind, Token, TokenKind};

mod row;
pub use row::{cell_named, cell_text, DigestRow, OrderValue, ORDER_COLUMNS, SUMMARY_BY_DIGEST};

/// Rows kept by default.
pub const DEFAULT_DIGESTS: usize = 2000;
/// Largest `digest_table_size`.
pub const MAX_DIGESTS: usize = 1_000_000;
/// Bytes of digest text kept (the hash covers all of it).
pub const MAX_TEXT: usize = 1024;
/// Heavy hitters tracked per row.
pub const HOT_TRACKED: usize = 12;
/// Heavy hitters shown per row.
pub const HOT_SHOWN: usize = 8;
/// Bytes of a hot key's text kept.
pub const HOT_TEXT: usize = 32;
/// Error codes tracked per row (the rarest is replaced by a new one).
pub const CODES_TRACKED: usize = 16;
/// Error codes shown per row.
pub const CODES_SHOWN: usize = 8;
/// Shards of the table, at most.
const SHARDS: usize = 16;
/// A table is split into shards of at least this many rows.
const ROWS_PER_SHARD_AT_LEAST: usize = 128;
/// Below this many rows a shard, eviction finds the least recently seen row exactly.
pub const EXACT_EVICTION_UP_TO: usize = 256;
/// Rows compared when evicting from a larger shard.
const EVICTION_SAMPLE: usize = 16;
/// Latency histogram buckets: 0 µs, then two per power of two (the upper one from
/// 1.5 × 2^k).
const BUCKETS: usize = 64;
/// HyperLogLog registers of the distinct-value estimate.
const HLL_REGISTERS: usize = 64;

/// How heatsink handled a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Handling {
    /// Forwarded unchanged (no rule names it).
    #[default]
    Passthrough,
    /// Replaced by a rule.
    Rewritten,
    /// Forwarded unchanged as a rule's fallback.
    Fallback,
    /// Answered with a rule's refusal.
    Refused,
    /// Forwarded unchanged; a rule in shadow mode would have rewritten or refused it.
    Shadow,
}

impl Handling {
    /// Every handling, in index order.
    pub const ALL: [Handling; 5] = [
        Handling::Passthrough,
        Handling::Rewritten,
        Handling::Fallback,
        Handling::Refused,
        Handling::Shadow,
    ];

    /// The name shown in `SHOW DIGESTS` and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Handling::Passthrough => "passthrough",
            Handling::Rewritten => "rewritten",
            Handling::Fallback => "fallback",
            Handling::Refused => "refused",
            Handling::Shadow => "shadow",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

// ---------------------------------------------------------------------------------
// Fingerprints
// ---------------------------------------------------------------------------------

/// 64-bit FNV-1a, streamed.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }

    #[inline]
    fn bytes(&mut self, bs: &[u8]) {
        for &b in bs {
            self.byte(b);
        }
    }
}

/// Where rendered digest text goes: the hash, or the text itself.
trait Sink {
    fn put(&mut self, b: &[u8]);
    fn put_upper(&mut self, b: &[u8]);
}

impl Sink for Fnv {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.bytes(b);
    }

    #[inline]
    fn put_upper(&mut self, b: &[u8]) {
        for &c in b {
            self.byte(c.to_ascii_uppercase());
        }
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }

    fn put_upper(&mut self, b: &[u8]) {
        self.extend(b.iter().map(u8::to_ascii_uppercase));
    }
}

/// One token of a digest, after folding values (spans index the statement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DTok {
    /// `?`: a literal, a parameter or NULL.
    Value,
    /// `?, ...`: values separated by commas.
    ValueList,
    /// `(?)`
    RowSingle,
    /// `(?) /* , ... */`
    RowSingleList,
    /// `(...)`
    RowMulti,
    /// `(...) /* , ... */`
    RowMultiList,
    /// A keyword, shown uppercase.
    Keyword(u32, u32),
    /// An identifier (bare or quoted), shown by name.
    Ident(u32, u32),
    /// A quoted identifier whose name needs its backticks.
    Quoted(u32, u32),
    /// A `@@system` variable or an operator, as written.
    Text(u32, u32),
    /// Fixed text MariaDB's digest shows for tokens it does not fold.
    Fixed(&'static str),
}

/// Words that start an expression in MariaDB's grammar: a sign after them is a
/// unary one, folded into the number that follows (`SELECT -1` is `SELECT ?`, but
/// `a = -1` stays `a = - ?`, as in the server's digest).
const START_EXPR_WORDS: &[&[u8]] = &[
    b"AND",
    b"AT",
    b"BETWEEN",
    b"CASE",
    b"DEFAULT",
    b"DIV",
    b"ELSEIF",
    b"ENDS",
    b"EVERY",
    b"IF",
    b"INTERVAL",
    b"LIKE",
    b"MOD",
    b"NOT",
    b"OR",
    b"REGEXP",
    b"RETURN",
    b"SELECT",
    b"STARTS",
    b"UNTIL",
    b"WHEN",
    b"WHILE",
    b"XOR",
];
/// Operators after which a sign is unary.
const START_EXPR_PUNCT: &[&[u8]] = &[
    b"(", b",", b"|", b"&", b"<<", b">>", b"+", b"-", b"*", b"/", b"%", b"^", b"||", b"&&",
];
/// Words uppercased in the digest text beyond the lexer's structural keywords:
/// common statement keywords (MariaDB shows every keyword uppercase).
const MORE_KEYWORDS: &[&[u8]] = &[
    b"ALTER",
    b"ANALYZE",
    b"BEGIN",
    b"BOTH",
    b"CALL",
    b"CHECK",
    b"COLUMN",
    b"COMMIT",
    b"CONSTRAINT",
    b"CREATE",
    b"DATABASE",
    b"DEFAULT",
    b"DELAYED",
    b"DESCRIBE",
    b"DROP",
    b"DUPLICATE",
    b"ELSEIF",
    b"END",
    b"EXPLAIN",
    b"FALSE",
    b"FORCE",
    b"FOREIGN",
    b"FULLTEXT",
    b"GRANT",
    b"HIGH_PRIORITY",
    b"IF",
    b"INDEX",
    b"INTERVAL",
    b"LEADING",
    b"LIMIT",
    b"LOCK",
    b"LOW_PRIORITY",
    b"MOD",
    b"NATURAL",
    b"OFFSET",
    b"OPTIMIZE",
    b"PRIMARY",
    b"PROCEDURE",
    b"QUICK",
    b"REFERENCES",
    b"RENAME",
    b"RETURNING",
    b"REVOKE",
    b"ROLLBACK",
    b"SAVEPOINT",
    b"SCHEMA",
    b"SHARE",
    b"SHOW",
    b"SQL_BIG_RESULT",
    b"SQL_CALC_FOUND_ROWS",
    b"SQL_NO_CACHE",
    b"SQL_SMALL_RESULT",
    b"START",
    b"TABLE",
    b"TEMPORARY",
    b"TO",
    b"TRAILING",
    b"TRANSACTION",
    b"TRIGGER",
    b"TRUE",
    b"TRUNCATE",
    b"UNIQUE",
    b"UNLOCK",
    b"USE",
    b"VIEW",
    b"WITH",
    b"WORK",
];

fn in_list(list: &[&[u8]], w: &[u8]) -> bool {
    list.iter().any(|k| k.eq_ignore_ascii_case(w))
}

/// A word packed for a [`WordSet`]: its first 32 bytes uppercase, left-aligned, so
/// that packed words order as the words do.
const fn pack_word(w: &[u8]) -> (u128, u128) {
    let mut hi = 0u128;
    let mut lo = 0u128;
    let mut i = 0;
    while i < w.len() && i < 32 {
        let b = w[i].to_ascii_uppercase() as u128;
        if i < 16 {
            hi |= b << (8 * (15 - i));
        } else {
            lo |= b << (8 * (31 - i));
        }
        i += 1;
    }
    (hi, lo)
}

/// A set of words of at most 32 bytes (alphabetical, uppercase), matched without
/// regard to case: a binary search over packed words, not a scan of the list (this
/// runs for every word of every statement digested).
struct WordSet<const N: usize>([(u128, u128); N]);

impl<const N: usize> WordSet<N> {
    const fn new(words: &[&[u8]; N]) -> WordSet<N> {
        let mut keys = [(0u128, 0u128); N];
        let mut i = 0;
        while i < N {
            keys[i] = pack_word(words[i]);
            i += 1;
        }
        WordSet(keys)
    }

    #[inline]
    fn contains(&self, w: &[u8]) -> bool {
        (1..=32).contains(&w.len()) && self.0.binary_search(&pack_word(w)).is_ok()
    }
}

/// [`START_EXPR_WORDS`], packed.
static START_EXPR_SET: WordSet<{ START_EXPR_WORDS.len() }> = WordSet::new(&{
    let mut a: [&[u8]; START_EXPR_WORDS.len()] = [b""; START_EXPR_WORDS.len()];
    let mut i = 0;
    while i < a.len() {
        a[i] = START_EXPR_WORDS[i];
        i += 1;
    }
    a
});
/// [`MORE_KEYWORDS`], packed.
static MORE_KEYWORD_SET: WordSet<{ MORE_KEYWORDS.len() }> = WordSet::new(&{
    let mut a: [&[u8]; MORE_KEYWORDS.len()] = [b""; MORE_KEYWORDS.len()];
    let mut i = 0;
    while i < a.len() {
        a[i] = MORE_KEYWORDS[i];
        i += 1;
    }
    a
});

/// A keyword MariaDB's digest uppercases that the lexer does not know as one.
#[inline]
fn more_keyword(w: &[u8]) -> bool {
    MORE_KEYWORD_SET.contains(w)
}

/// Where a `column = value` equality of the WHERE clause lies (token indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HotSpot {
    /// The column's token.
    column: usize,
    /// The value's token: a literal, or a parameter.
    value: usize,
    /// The value is the prepared statement's parameter number `n` (0-based).
    param: Option<usize>,
}

/// What [`Digester::digest`] found out about a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// FNV-1a 64 of the digest text.
    pub hash: u64,
    /// The statement did not lex (or its character set cannot be read): the digest
    /// is a fixed one for all such statements.
    pub unread: bool,
}

/// Digest text of statements that do not lex.
const UNLEXED: &str = "<a statement that does not lex>";
/// Digest text of statements in a character set the lexer cannot read.
const UNREADABLE: &str = "<a statement in a character set heatsink cannot read>";

/// A session's fingerprinting state: its buffers are reused from statement to
/// statement, so fingerprinting allocates nothing once they have grown.
#[derive(Debug, Default)]
pub struct Digester {
    toks: Vec<Token>,
    stack: Vec<DTok>,
    hot: Option<HotSpot>,
    unread: Option<&'static str>,
}

impl Digester {
    /// Fingerprints `sql` read under `mode` (`None`: a character set the lexer cannot
    /// read). The text and hot key of the same statement can then be had from
    /// [`Digester::text`] and [`Digester::hot_value`].
    pub fn digest(&mut self, sql: &[u8], mode: Option<LexMode>) -> Fingerprint {
        self.stack.clear();
        self.hot = None;
        self.unread = None;
        let unread = match mode {
            None => Some(UNREADABLE),
            Some(mode) => match sqltok::lex_into(sql, mode, &mut self.toks) {
                Ok(()) => None,
                Err(_) => Some(UNLEXED),
            },
        };
        if let Some(text) = unread {
            self.toks.clear();
            self.unread = Some(text);
            let mut h = Fnv::new();
            h.bytes(text.as_bytes());
            return Fingerprint {
                hash: h.0,
                unread: true,
            };
        }
        self.fold(sql);
        let mut h = Fnv::new();
        self.render(sql, &mut h);
        Fingerprint {
            hash: h.0,
            unread: false,
        }
    }

    /// The digest text of the statement last fingerprinted (at most [`MAX_TEXT`]
    /// bytes, cut at a character boundary with `…`).
    pub fn text(&self, sql: &[u8]) -> String {
        if let Some(t) = self.unread {
            return t.to_string();
        }
        let mut out = Vec::with_capacity(sql.len().min(MAX_TEXT + 8));
        self.render(sql, &mut out);
        clip(String::from_utf8_lossy(&out).into_owned(), MAX_TEXT)
    }

    /// The statement's first `column = value` equality in its WHERE clause: the
    /// column, and the literal's display text or the prepared statement's parameter
    /// that holds the value.
    pub fn hot<'s>(&self, sql: &'s [u8]) -> Option<Hot<'s>> {
        let h = self.hot?;
        let col = self.toks.get(h.column)?;
        let column = match sqltok::ident_name(sql, col)? {
            Cow::Borrowed(b) => String::from_utf8_lossy(b),
            Cow::Owned(v) => Cow::Owned(String::from_utf8_lossy(&v).into_owned()),
        };
        let literal = match h.param {
            Some(_) => None,
            None => Some(literal_display(sql, self.toks.get(h.value)?)),
        };
        Some(Hot {
            column,
            literal,
            param: h.param,
        })
    }

    /// Folds the tokens into [`DTok`]s on the stack, as MariaDB's digest reduces
    /// them, and finds the first equality of the WHERE clause.
    fn fold(&mut self, sql: &[u8]) {
        let toks = &self.toks;
        let n = toks.len();
        let text = |t: &Token| &sql[t.start..t.end];
        let span = |t: &Token| (t.start as u32, t.end as u32);
        let mut where_seen = false;
        let mut params = 0usize;
        let mut hot = None;
        let mut i = 0;
        while i < n {
            let t = toks[i];
            let bytes = text(&t);
            let after_dot =
                i > 0 && toks[i - 1].kind == TokenKind::Punct && text(&toks[i - 1]) == b".";
            match t.kind {
                TokenKind::Literal(kind) => {
                    let b = &sql[t.start..t.end];
                    // MariaDB's digest shows an introducer on its own and does not
                    // fold `x'…'` literals.
                    if b.first() == Some(&b'_') {
                        self.stack.push(DTok::Fixed("(_charset)"));
                    }
                    let hex_string = kind == LiteralKind::Hex && {
                        let body = strip_introducer(b);
                        matches!(body.first(), Some(b'x' | b'X')) && body.get(1) == Some(&b'\'')
                    };
                    if hex_string {
                        self.stack.push(DTok::Fixed("(unknown)"));
                    } else {
                        let numeric = kind != LiteralKind::String;
                        push_value(&mut self.stack, sql, numeric);
                    }
                }
                TokenKind::Param => {
                    params += 1;
                    push_value(&mut self.stack, sql, false);
                }
                TokenKind::Word
                    if bytes.eq_ignore_ascii_case(b"NULL")
                        && !after_dot
                        && !matches!(self.stack.last(), Some(DTok::Keyword(s, e))
                            if in_list(&[&b"IS"[..], &b"NOT"[..]], &sql[*s as usize..*e as usize])) =>
                {
                    push_value(&mut self.stack, sql, false);
                }
                TokenKind::Word => {
                    // Keywords also before `(` (`IN (…)`, `VALUES (…)`, `IF(…)`): MariaDB's
                    // digest shows every keyword uppercase, function or not.
                    let keyword = !after_dot && (sqltok::is_keyword(bytes) || more_keyword(bytes));
                    let (s, e) = span(&t);
                    if keyword {
                        if bytes.eq_ignore_ascii_case(b"WHERE") {
                            where_seen = true;
                        }
                        self.stack.push(DTok::Keyword(s, e));
                    } else {
                        self.stack.push(DTok::Ident(s, e));
                    }
                }
                TokenKind::QuotedIdent => {
                    let name = sqltok::ident_name(sql, &t).unwrap_or_default();
                    let (s, e) = span(&t);
                    if needs_quotes(&name) {
                        self.stack.push(DTok::Quoted(s, e));
                    } else {
                        self.stack.push(DTok::Ident(s, e));
                    }
                }
                TokenKind::Variable => {
                    let (s, e) = span(&t);
                    if bytes.starts_with(b"@@") {
                        self.stack.push(DTok::Text(s, e));
                    } else {
                        // MariaDB's digest reads `@name` as `@` and a value.
                        self.stack.push(DTok::Fixed("@"));
                        push_value(&mut self.stack, sql, false);
                    }
                }
                TokenKind::Punct => {
                    if bytes == b")" {
                        close_paren(&mut self.stack, sql);
                    } else if bytes == b";" && toks[i + 1..].iter().all(|x| text(x) == b";") {
                        // A trailing `;` is not part of the digest.
                    } else {
                        let (s, e) = span(&t);
                        self.stack.push(DTok::Text(s, e));
                    }
                    if bytes == b"=" && where_seen && hot.is_none() && i > 0 {
                        let col = toks[i - 1];
                        let value = toks.get(i + 1).copied();
                        let after = toks.get(i + 2);
                        let ends = after.is_none_or(|a| {
                            a.kind != TokenKind::Punct || matches!(text(a), b")" | b";" | b",")
                        });
                        let column_ok = matches!(col.kind, TokenKind::QuotedIdent)
                            || (col.kind == TokenKind::Word && !sqltok::is_keyword(text(&col)));
                        if let Some(v) = value {
                            let value_ok =
                                matches!(v.kind, TokenKind::Literal(_) | TokenKind::Param);
                            if column_ok && value_ok && ends {
                                hot = Some(HotSpot {
                                    column: i - 1,
                                    value: i + 1,
                                    param: (v.kind == TokenKind::Param).then_some(params),
                                });
                            }
                        }
                    }
                }
                TokenKind::Marker(_) => {
                    let (s, e) = span(&t);
                    self.stack.push(DTok::Text(s, e));
                }
            }
            i += 1;
        }
        self.hot = hot;
    }

    /// Streams the digest text of the folded stack into `out`.
    fn render<S: Sink>(&self, sql: &[u8], out: &mut S) {
        let mut prev: Option<DTok> = None;
        for &d in &self.stack {
            if let Some(p) = prev {
                if space_between(sql, p, d) {
                    out.put(b" ");
                }
            }
            match d {
                DTok::Value => out.put(b"?"),
                DTok::ValueList => out.put(b"?, ..."),
                DTok::RowSingle => out.put(b"(?)"),
                DTok::RowSingleList => out.put(b"(?) /* , ... */"),
                DTok::RowMulti => out.put(b"(...)"),
                DTok::RowMultiList => out.put(b"(...) /* , ... */"),
                DTok::Keyword(s, e) => out.put_upper(&sql[s as usize..e as usize]),
                DTok::Ident(s, e) => {
                    let t = &sql[s as usize..e as usize];
                    match t.first() {
                        Some(b'`' | b'"') => out.put(&t[1..t.len().saturating_sub(1)]),
                        _ => out.put(t),
                    }
                }
                DTok::Quoted(s, e) => {
                    let t = &sql[s as usize..e as usize];
                    let inner = &t[1..t.len().saturating_sub(1)];
                    out.put(b"`");
                    if t.first() == Some(&b'`') {
                        out.put(inner);
                    } else {
                        // ANSI_QUOTES: `"a""b"` is the name a"b, written `a"b`.
                        let q = b'"';
                        let mut j = 0;
                        while j < inner.len() {
                            if inner[j] == b'`' {
                                out.put(b"``");
                            } else {
                                out.put(&inner[j..j + 1]);
                            }
                            if inner[j] == q && inner.get(j + 1) == Some(&q) {
                                j += 1;
                            }
                            j += 1;
                        }
                    }
                    out.put(b"`");
                }
                DTok::Text(s, e) => {
                    let t = &sql[s as usize..e as usize];
                    if t == b"<>" {
                        // MariaDB's digest spells it `!=`.
                        out.put(b"!=");
                    } else if t.len() > 2
                        && t.starts_with(b"@@")
                        && in_list(&[&b"SESSION"[..], b"GLOBAL", b"LOCAL"], &t[2..])
                    {
                        out.put_upper(t);
                    } else {
                        out.put(t);
                    }
                }
                DTok::Fixed(t) => out.put(t.as_bytes()),
            }
            prev = Some(d);
        }
    }
}

/// Whether digest text puts a space between two tokens: none before `,` `)` `.`,
/// after `(` `.` `@`, nor between a name and the `(` of its call.
fn space_between(sql: &[u8], a: DTok, b: DTok) -> bool {
    let punct = |d: DTok| match d {
        DTok::Text(s, e) => Some(&sql[s as usize..e as usize]),
        DTok::Fixed(t) => Some(t.as_bytes()),
        _ => None,
    };
    if let Some(p) = punct(b) {
        if matches!(p, b"," | b")" | b".") {
            return false;
        }
        if p == b"(" && matches!(a, DTok::Ident(..) | DTok::Quoted(..)) {
            return false;
        }
    }
    if matches!(
        b,
        DTok::RowSingle | DTok::RowMulti | DTok::RowSingleList | DTok::RowMultiList
    ) && matches!(a, DTok::Ident(..) | DTok::Quoted(..))
    {
        return false;
    }
    if let Some(p) = punct(a) {
        if matches!(p, b"(" | b"." | b"@") {
            return false;
        }
    }
    true
}

/// A name that cannot be shown bare: empty, not all identifier bytes, all digits,
/// or a keyword.
fn needs_quotes(name: &[u8]) -> bool {
    name.is_empty()
        || !name.iter().all(|&b| sqltok::is_ident_byte(b))
        || name.iter().all(u8::is_ascii_digit)
        || sqltok::is_keyword(name)
        || more_keyword(name)
        || name.eq_ignore_ascii_case(b"NULL")
}

fn is_punct(sql: &[u8], d: Option<&DTok>, p: &[u8]) -> bool {
    matches!(d, Some(DTok::Text(s, e)) if sql[*s as usize..*e as usize] == *p)
}

fn starts_expr(sql: &[u8], d: Option<&DTok>) -> bool {
    match d {
        Some(DTok::Text(s, e)) => in_list(START_EXPR_PUNCT, &sql[*s as usize..*e as usize]),
        Some(DTok::Keyword(s, e)) => START_EXPR_SET.contains(&sql[*s as usize..*e as usize]),
        _ => false,
    }
}

/// Pushes a value, folding a unary sign before a number and a list of values.
fn push_value(stack: &mut Vec<DTok>, sql: &[u8], numeric: bool) {
    if numeric {
        while stack.len() >= 2
            && (is_punct(sql, stack.last(), b"-") || is_punct(sql, stack.last(), b"+"))
            && starts_expr(sql, stack.get(stack.len() - 2))
        {
            stack.pop();
        }
    }
    let n = stack.len();
    if n >= 2
        && is_punct(sql, stack.get(n - 1), b",")
        && matches!(stack[n - 2], DTok::Value | DTok::ValueList)
    {
        stack.truncate(n - 2);
        stack.push(DTok::ValueList);
    } else {
        stack.push(DTok::Value);
    }
}

/// Pushes a `)`, folding `( ? )` and `( ?, ... )` into rows, and lists of rows.
fn close_paren(stack: &mut Vec<DTok>, sql: &[u8]) {
    let n = stack.len();
    let opened = n >= 2 && is_punct(sql, stack.get(n - 2), b"(");
    let row = match stack.last() {
        Some(DTok::Value) if opened => Some((DTok::RowSingle, DTok::RowSingleList)),
        Some(DTok::ValueList) if opened => Some((DTok::RowMulti, DTok::RowMultiList)),
        _ => None,
    };
    let Some((one, list)) = row else {
        stack.push(DTok::Fixed(")"));
        return;
    };
    stack.truncate(n - 2);
    let m = stack.len();
    if m >= 2
        && is_punct(sql, stack.get(m - 1), b",")
        && (stack[m - 2] == one || stack[m - 2] == list)
    {
        stack.truncate(m - 2);
        stack.push(list);
    } else {
        stack.push(one);
    }
}

fn strip_introducer(b: &[u8]) -> &[u8] {
    if b.first() != Some(&b'_') {
        return b;
    }
    let end = b
        .iter()
        .position(|&c| !sqltok::is_ident_byte(c))
        .unwrap_or(b.len());
    b[end..].trim_ascii_start()
}

/// A literal as shown among hot keys: a string without its quotes (doubled quotes
/// and backslash escapes undone; of adjacent strings, the first), anything else as
/// written.
fn literal_display<'s>(sql: &'s [u8], t: &Token) -> Cow<'s, [u8]> {
    let b = strip_introducer(&sql[t.start..t.end]);
    if t.kind != TokenKind::Literal(LiteralKind::String) {
        return Cow::Borrowed(b);
    }
    let b = match b.first() {
        Some(b'n' | b'N') => &b[1..],
        _ => b,
    };
    let Some(&q) = b.first() else {
        return Cow::Borrowed(b);
    };
    let body = &b[1..];
    let plain_end = body.iter().position(|&c| c == q || c == b'\\');
    if let Some(e) = plain_end {
        if body[e] == q && body.get(e + 1) != Some(&q) {
            return Cow::Borrowed(&body[..e]);
        }
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 1;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' && i + 1 < b.len() {
            out.push(b[i + 1]);
            i += 2;
        } else if c == q {
            if b.get(i + 1) == Some(&q) {
                out.push(q);
                i += 2;
            } else {
                break;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    Cow::Owned(out)
}

/// `s` cut to at most `max` bytes at a character boundary, `…` marking the cut.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
    s
}

// ---------------------------------------------------------------------------------
// Hot keys
// ---------------------------------------------------------------------------------

/// A statement's hot-key equality ([`Digester::hot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hot<'s> {
    /// The column's name.
    pub column: Cow<'s, str>,
    /// The literal's display text (strings without quotes).
    pub literal: Option<Cow<'s, [u8]>>,
    /// The prepared statement's parameter holding the value (0-based).
    pub param: Option<usize>,
}

/// One heavy hitter: a value's hash, count and (start of its) text.
#[derive(Clone, Copy, Debug)]
struct Hitter {
    hash: u64,
    count: u64,
    /// What `count` may overstate: the count of the value it replaced.
    over: u64,
    len: u8,
    cut: bool,
    text: [u8; HOT_TEXT],
}

/// The heavy hitters among the values of one row's hot-key column: a Space-Saving
/// sketch of [`HOT_TRACKED`] counters, and a HyperLogLog estimate of the distinct
/// values. A counter may overstate its value's count by the count of the value it
/// replaced; the JSON shows the guaranteed part (`count - over`), so a value shown
/// with a large share has at least that share, however many cold values went by.
#[derive(Clone, Debug)]
pub struct HotKeys {
    column: Box<str>,
    top: Vec<Hitter>,
    hll: [u8; HLL_REGISTERS],
}

impl HotKeys {
    fn new(column: &str) -> HotKeys {
        HotKeys {
            column: column.into(),
            top: Vec::with_capacity(HOT_TRACKED),
            hll: [0; HLL_REGISTERS],
        }
    }

    /// Counts one value.
    fn add(&mut self, value: &[u8]) {
        let mut h = Fnv::new();
        h.bytes(value);
        // FNV's low bits mix poorly for short inputs: finish with a multiply-xorshift.
        let hash = mix(h.0);
        let reg = (hash >> 58) as usize % HLL_REGISTERS;
        let rank = ((hash << 6) | (1 << 5)).leading_zeros() as u8 + 1;
        if self.hll[reg] < rank {
            self.hll[reg] = rank;
        }
        if let Some(e) = self.top.iter_mut().find(|e| e.hash == hash) {
            e.count += 1;
            return;
        }
        let mut e = Hitter {
            hash,
            count: 1,
            over: 0,
            len: 0,
            cut: value.len() > HOT_TEXT,
            text: [0; HOT_TEXT],
        };
        let mut n = value.len().min(HOT_TEXT);
        if e.cut {
            // At a character boundary (of UTF-8; other character sets show as is).
            while n > 0 && (value[n] & 0xC0) == 0x80 {
                n -= 1;
            }
        }
        e.text[..n].copy_from_slice(&value[..n]);
        e.len = n as u8;
        if self.top.len() < HOT_TRACKED {
            self.top.push(e);
        } else if let Some(min) = self.top.iter_mut().min_by_key(|e| e.count) {
            e.count = min.count + 1;
            e.over = min.count;
            *min = e;
        }
    }

    /// The distinct values seen, estimated.
    pub fn distinct(&self) -> u64 {
        let m = HLL_REGISTERS as f64;
        let sum: f64 = self.hll.iter().map(|&r| 2f64.powi(-i32::from(r))).sum();
        let zeros = self.hll.iter().filter(|&&r| r == 0).count();
        let alpha = 0.709;
        let raw = alpha * m * m / sum;
        let est = if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        };
        let exact_floor = self.top.len() as u64;
        (est.round() as u64).max(exact_floor)
    }

    /// The row's `hot_keys` JSON.
    pub fn json(&self) -> String {
        let mut top = self.top.clone();
        top.sort_by_key(|e| std::cmp::Reverse(e.count - e.over));
        top.truncate(HOT_SHOWN);
        let mut out = String::with_capacity(64 + 24 * top.len());
        out.push_str("{\"column\":");
        json_string(&mut out, &self.column);
        out.push_str(&format!(",\"distinct\":{},\"top\":[", self.distinct()));
        for (i, e) in top.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let mut text = String::from_utf8_lossy(&e.text[..usize::from(e.len)]).into_owned();
            if e.cut {
                text.push('…');
            }
            out.push('[');
            json_string(&mut out, &text);
            out.push_str(&format!(",{}]", e.count - e.over));
        }
        out.push_str("]}");
        out
    }
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Appends `s` as a JSON string.
pub fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------

/// One finished statement, as the session saw it.
#[derive(Debug)]
pub struct Sample<'a> {
    /// The statement's fingerprint hash.
    pub hash: u64,
    /// The session's default database.
    pub schema: Option<&'a str>,
    /// The client's user.
    pub user: &'a str,
    /// Client statement in to last response packet out.
    pub took: Duration,
    /// When it ended.
    pub at: Instant,
    /// Rows of result sets sent.
    pub rows_sent: u64,
    /// Affected rows of OK packets.
    pub rows_affected: u64,
    /// The ERR's code, if the statement was answered with one.
    pub error: Option<u16>,
    /// How heatsink handled it.
    pub handling: Handling,
    /// The rule that handled it.
    pub rule: Option<&'a Arc<str>>,
    /// The hot-key column and value, if any.
    pub hot: Option<(&'a str, &'a [u8])>,
}

#[derive(Debug)]
struct Row {
    key: u128,
    digest: u64,
    schema: Option<Box<str>>,
    user: Box<str>,
    text: Box<str>,
    count: u64,
    first_seen: u64,
    last_seen: u64,
    tick: u64,
    sum_us: u64,
    min_us: u64,
    max_us: u64,
    hist: [u32; BUCKETS],
    rows_sent: u64,
    rows_affected: u64,
    errors: u64,
    codes: Vec<(u16, u64)>,
    handling: [u64; 5],
    rule: Option<Arc<str>>,
    hot: Option<Box<HotKeys>>,
    prepares: u64,
}

/// The bucket of a latency in µs: 0 for 0, then two per power of two.
fn bucket(us: u64) -> usize {
    if us == 0 {
        return 0;
    }
    let lz = 63 - us.leading_zeros() as usize;
    let half = if lz == 0 {
        0
    } else {
        ((us >> (lz - 1)) & 1) as usize
    };
    (1 + 2 * lz + half).min(BUCKETS - 1)
}

/// The largest latency in µs a bucket holds.
fn bucket_top(b: usize) -> u64 {
    if b == 0 {
        return 0;
    }
    if b >= BUCKETS - 1 {
        // The last bucket takes everything longer.
        return u64::MAX;
    }
    let lz = (b - 1) / 2;
    let half = (b - 1) % 2;
    let base = 1u64 << lz.min(62);
    if half == 0 {
        (base + base / 2).saturating_sub(1).max(base)
    } else {
        (base * 2).saturating_sub(1)
    }
}

impl Row {
    fn add(&mut self, s: &Sample<'_>, now: u64, tick: u64) {
        let us = u64::try_from(s.took.as_micros()).unwrap_or(u64::MAX);
        self.count += 1;
        self.last_seen = self.last_seen.max(now);
        self.tick = tick;
        self.sum_us = self.sum_us.saturating_add(us);
        self.min_us = self.min_us.min(us);
        self.max_us = self.max_us.max(us);
        let b = bucket(us);
        self.hist[b] = self.hist[b].saturating_add(1);
        self.rows_sent += s.rows_sent;
        self.rows_affected += s.rows_affected;
        if let Some(code) = s.error {
            self.errors += 1;
            if let Some(c) = self.codes.iter_mut().find(|c| c.0 == code) {
                c.1 += 1;
            } else if self.codes.len() < CODES_TRACKED {
                self.codes.push((code, 1));
            } else if let Some(min) = self.codes.iter_mut().min_by_key(|c| c.1) {
                *min = (code, min.1 + 1);
            }
        }
        self.handling[s.handling.index()] += 1;
        if let Some(r) = s.rule {
            if self.rule.as_deref() != Some(&**r) {
                self.rule = Some(r.clone());
            }
        }
        if let Some((column, value)) = s.hot {
            let hot = self
                .hot
                .get_or_insert_with(|| Box::new(HotKeys::new(column)));
            hot.add(value);
        }
    }

    fn p99(&self) -> u64 {
        let total: u64 = self.hist.iter().map(|&c| u64::from(c)).sum();
        if total == 0 {
            return 0;
        }
        let want = total - total / 100;
        let mut seen = 0u64;
        for (b, &c) in self.hist.iter().enumerate() {
            seen += u64::from(c);
            if seen >= want {
                return bucket_top(b).clamp(self.min_us, self.max_us);
            }
        }
        self.max_us
    }
}

/// Every row as the JSON array `heatsink advise --digests FILE` reads.
pub fn json_array(rows: &[DigestRow]) -> String {
    let mut out = String::from("[");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push_str(",\n");
        } else {
            out.push('\n');
        }
        out.push_str(&r.json());
    }
    out.push_str("\n]\n");
    out
}

/// Keys are already hashes: the map uses them as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = (v as u64) ^ ((v >> 64) as u64).rotate_left(17);
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<u128, usize, BuildHasherDefault<KeyHasher>>,
    rows: Vec<Row>,
    tick: u64,
    rng: u64,
    /// Statements recorded in this shard since start, by handling (counted under
    /// the lock the statement takes anyway: no counter shared by every session).
    by_handling: [u64; 5],
}

impl Shard {
    /// The row to evict: the least recently seen (exactly, or of a sample).
    fn victim(&mut self) -> Option<usize> {
        let n = self.rows.len();
        if n == 0 {
            return None;
        }
        if n <= EXACT_EVICTION_UP_TO {
            return (0..n).min_by_key(|&i| self.rows[i].tick);
        }
        let mut best = None;
        for _ in 0..EVICTION_SAMPLE {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let i = (self.rng % n as u64) as usize;
            if best.is_none_or(|b: usize| self.rows[i].tick < self.rows[b].tick) {
                best = Some(i);
            }
        }
        best
    }

    fn remove(&mut self, i: usize) {
        let key = self.rows[i].key;
        self.map.remove(&key);
        self.rows.swap_remove(i);
        if let Some(moved) = self.rows.get(i) {
            self.map.insert(moved.key, i);
        }
    }
}

/// The digest table (one per server, in [`crate::relay::Shared`]).
pub struct Digests {
    max: usize,
    shards: Box<[(Mutex<Shard>, usize)]>,
    evicted: AtomicU64,
    /// The wall clock at `base`, to date statements from their `Instant`.
    base: (Instant, u64),
}

impl std::fmt::Debug for Digests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digests")
            .field("max", &self.max)
            .field("rows", &self.len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key of a row: the digest and a hash of the schema and user.
fn row_key(hash: u64, schema: Option<&str>, user: &str) -> u128 {
    let mut h = Fnv::new();
    match schema {
        Some(s) => {
            h.byte(1);
            h.bytes(s.as_bytes());
        }
        None => h.byte(0),
    }
    h.byte(0);
    h.bytes(user.as_bytes());
    (u128::from(hash) << 64) | u128::from(mix(h.0))
}

impl Digests {
    /// A table of at most `max` rows (zero: digests off).
    pub fn new(max: usize) -> Digests {
        // Small tables are one shard (eviction exactly least recently seen overall);
        // larger ones up to SHARDS, each with its share of the rows.
        let n = (max / ROWS_PER_SHARD_AT_LEAST).clamp(1, SHARDS);
        let shards = (0..n)
            .map(|i| {
                let cap = max / n + usize::from(i < max % n);
                let shard = Shard {
                    rng: 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1),
                    ..Shard::default()
                };
                (Mutex::new(shard), cap)
            })
            .collect();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Digests {
            max,
            shards,
            evicted: AtomicU64::new(0),
            base: (Instant::now(), wall),
        }
    }

    /// Digests are kept (`digest_table_size` is not zero).
    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    /// Counts one statement; `text` makes its digest text when the row is new.
    pub fn record(&self, s: &Sample<'_>, text: impl FnOnce() -> String) {
        if self.max == 0 {
            return;
        }
        let now = self.base.1 + s.at.saturating_duration_since(self.base.0).as_secs();
        self.with_row(
            (s.hash, s.schema, s.user),
            now,
            Some(s.handling),
            text,
            |row, tick| row.add(s, now, tick),
        );
    }

    /// Counts one COM_STMT_PREPARE of the statement of digest `hash` (its executes
    /// are counted by [`Digests::record`]); `text` makes its digest text when the
    /// row is new.
    pub fn record_prepare(
        &self,
        hash: u64,
        schema: Option<&str>,
        user: &str,
        at: Instant,
        text: impl FnOnce() -> String,
    ) {
        if self.max == 0 {
            return;
        }
        let now = self.base.1 + at.saturating_duration_since(self.base.0).as_secs();
        self.with_row((hash, schema, user), now, None, text, |row, tick| {
            row.prepares += 1;
            row.last_seen = row.last_seen.max(now);
            row.tick = tick;
        });
    }

    /// Applies `update` to the row of (`hash`, `schema`, `user`), made (with `text`)
    /// if it is new, under its shard's lock; counts a statement of `handling`.
    fn with_row(
        &self,
        (hash, schema, user): (u64, Option<&str>, &str),
        now: u64,
        handling: Option<Handling>,
        text: impl FnOnce() -> String,
        update: impl FnOnce(&mut Row, u64),
    ) {
        let key = row_key(hash, schema, user);
        let spread = mix((key as u64) ^ ((key >> 64) as u64));
        let (m, cap) = &self.shards[(spread % self.shards.len() as u64) as usize];
        let mut g = lock(m);
        if let Some(h) = handling {
            g.by_handling[h.index()] += 1;
        }
        g.tick += 1;
        let tick = g.tick;
        if let Some(&i) = g.map.get(&key) {
            if let Some(row) = g.rows.get_mut(i) {
                update(row, tick);
            }
            return;
        }
        while g.rows.len() >= *cap {
            let Some(v) = g.victim() else { break };
            g.remove(v);
            self.evicted.fetch_add(1, Relaxed);
        }
        let mut row = Row {
            key,
            digest: hash,
            schema: schema.map(Into::into),
            user: user.into(),
            text: text().into(),
            count: 0,
            first_seen: now,
            last_seen: now,
            tick,
            sum_us: 0,
            min_us: u64::MAX,
            max_us: 0,
            hist: [0; BUCKETS],
            rows_sent: 0,
            rows_affected: 0,
            errors: 0,
            codes: Vec::new(),
            handling: [0; 5],
            rule: None,
            hot: None,
            prepares: 0,
        };
        update(&mut row, tick);
        let i = g.rows.len();
        g.rows.push(row);
        g.map.insert(key, i);
    }

    /// Every row (unordered).
    pub fn rows(&self) -> Vec<DigestRow> {
        let mut out = Vec::with_capacity(self.len());
        for (m, _) in self.shards.iter() {
            out.extend(lock(m).rows.iter().map(DigestRow::from_table));
        }
        out
    }

    /// Forgets every row; the number forgotten.
    pub fn reset(&self) -> usize {
        let mut n = 0;
        for (m, _) in self.shards.iter() {
            let mut g = lock(m);
            n += g.rows.len();
            g.rows.clear();
            g.map.clear();
        }
        n
    }

    /// Rows held now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|(m, _)| lock(m).rows.len()).sum()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most rows held.
    pub fn capacity(&self) -> usize {
        self.max
    }

    /// Rows evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }

    /// Statements recorded since start, by handling.
    pub fn recorded(&self, h: Handling) -> u64 {
        self.shards
            .iter()
            .map(|(m, _)| lock(m).by_handling[h.index()])
            .sum()
    }
}

// ---------------------------------------------------------------------------------
// Prepared statements' parameters
// ---------------------------------------------------------------------------------

/// Writes into `out` (cleared first) the text of parameter `want` (0-based) of a
/// COM_STMT_EXECUTE `payload` (command byte first) for a statement of `params`
/// parameters, with `types` the parameter types last bound (updated when the
/// execute binds new ones). False (and `out` empty) when the value is NULL, sent
/// as long data, or of a type not shown.
pub fn execute_param(
    payload: &[u8],
    params: usize,
    types: &mut Vec<u8>,
    want: usize,
    out: &mut Vec<u8>,
) -> bool {
    out.clear();
    let shown = execute_param_into(payload, params, types, want, out).is_some();
    if !shown {
        out.clear();
    }
    shown
}

fn execute_param_into(
    payload: &[u8],
    params: usize,
    types: &mut Vec<u8>,
    want: usize,
    out: &mut Vec<u8>,
) -> Option<()> {
    use std::io::Write;
    if want >= params {
        return None;
    }
    let nulls_at = 10;
    let nulls_len = params.div_ceil(8);
    let bound = *payload.get(nulls_at + nulls_len)?;
    let mut at = nulls_at + nulls_len + 1;
    if bound == 1 {
        let t = payload.get(at..at + 2 * params)?;
        types.clear();
        types.extend_from_slice(t);
        at += 2 * params;
    }
    if types.len() != 2 * params {
        return None;
    }
    let nulls = payload.get(nulls_at..nulls_at + nulls_len)?;
    let is_null = |k: usize| nulls[k / 8] & (1 << (k % 8)) != 0;
    for k in 0..=want {
        if is_null(k) {
            if k == want {
                return None;
            }
            continue;
        }
        let ty = types[2 * k];
        let unsigned = types[2 * k + 1] & 0x80 != 0;
        let fixed = match ty {
            1 => Some(1),      // TINY
            2 | 13 => Some(2), // SHORT, YEAR
            3 | 9 => Some(4),  // LONG, INT24
            4 => Some(4),      // FLOAT
            8 => Some(8),      // LONGLONG
            5 => Some(8),      // DOUBLE
            _ => None,
        };
        let (len, skip) = match fixed {
            Some(n) => (n, 0),
            None => match ty {
                7 | 10 | 11 | 12 => (usize::from(*payload.get(at)?), 1),
                _ => {
                    let (n, used) = crate::wire::packets::lenenc_int(payload.get(at..)?)?;
                    (usize::try_from(n).ok()?, used)
                }
            },
        };
        let v = payload.get(at + skip..at + skip + len)?;
        if k == want {
            // Written into `out` (a buffer the session reuses): no allocation once
            // it has grown.
            return match ty {
                1 | 2 | 3 | 8 | 9 | 13 => {
                    let mut x = [0u8; 8];
                    x[..v.len()].copy_from_slice(v);
                    let u = u64::from_le_bytes(x);
                    if unsigned {
                        write!(out, "{u}").ok()
                    } else {
                        let bits = 64 - 8 * v.len() as u32;
                        write!(out, "{}", ((u << bits) as i64) >> bits).ok()
                    }
                }
                4 => write!(out, "{}", f32::from_le_bytes(v.try_into().ok()?)).ok(),
                5 => write!(out, "{}", f64::from_le_bytes(v.try_into().ok()?)).ok(),
                7 | 10 | 11 | 12 => None,
                _ => {
                    out.extend_from_slice(v);
                    Some(())
                }
            };
        }
        at += skip + len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(sql: &str) -> (u64, String) {
        let mut d = Digester::default();
        let f = d.digest(sql.as_bytes(), Some(LexMode::default()));
        let text = d.text(sql.as_bytes());
        let mut h = Fnv::new();
        h.bytes(text.as_bytes());
        assert_eq!(h.0, f.hash, "the hash is of the text: {text}");
        (f.hash, text)
    }

    fn text(sql: &str) -> String {
        fp(sql).1
    }

    #[test]
    fn digest_texts() {
        for (sql, want) in [
            ("select * from t where id=2", "SELECT * FROM t WHERE id = ?"),
            (
                "SELECT * FROM `t` WHERE `id` = 'x' -- c\n",
                "SELECT * FROM t WHERE id = ?",
            ),
            (
                "SELECT * FROM t WHERE id IN (1,2,3)",
                "SELECT * FROM t WHERE id IN (...)",
            ),
            (
                "SELECT * FROM t WHERE id IN (1)",
                "SELECT * FROM t WHERE id IN (?)",
            ),
            (
                "SELECT * FROM t WHERE id = -1",
                "SELECT * FROM t WHERE id = - ?",
            ),
            ("SELECT -1, +2", "SELECT ?, ..."),
            ("SELECT 1 + -1", "SELECT ? + ?"),
            ("SELECT a-1 FROM t", "SELECT a - ? FROM t"),
            ("SELECT NULL, TRUE", "SELECT ?, TRUE"),
            (
                "SELECT * FROM t WHERE b IS NULL",
                "SELECT * FROM t WHERE b IS NULL",
            ),
            (
                "INSERT INTO t VALUES (1,2),(3,4)",
                "INSERT INTO t VALUES (...) /* , ... */",
            ),
            (
                "INSERT INTO t (id) VALUES (1),(2)",
                "INSERT INTO t(id) VALUES (?) /* , ... */",
            ),
            (
                "SELECT /*+ BKA(t) */ COUNT(*) FROM t;",
                "SELECT COUNT(*) FROM t",
            ),
            ("SELECT concat('a', 'b')", "SELECT concat(...)"),
            ("SELECT @x := 1, @@version", "SELECT @? := ?, @@version"),
            (
                "SELECT x'1F', _utf8mb4'x'",
                "SELECT (unknown), (_charset) ?",
            ),
            (
                "SELECT * FROM d.t WHERE d.t.id = ?",
                "SELECT * FROM d.t WHERE d.t.id = ?",
            ),
            (
                "SELECT `a b`, `select` FROM t",
                "SELECT `a b`, `select` FROM t",
            ),
            (
                "SELECT * FROM t LIMIT 10, 5",
                "SELECT * FROM t LIMIT ?, ...",
            ),
        ] {
            assert_eq!(text(sql), want, "{sql}");
        }
        assert_eq!(fp("SELECT 'it''s'").0, fp("select \"x\"").0);
        assert_ne!(fp("SELECT * FROM t").0, fp("SELECT * FROM T").0);
        let mut d = Digester::default();
        let f = d.digest(b"SELECT 'open", Some(LexMode::default()));
        assert!(f.unread);
        assert_eq!(d.text(b"SELECT 'open"), UNLEXED);
        assert!(d.digest(b"SELECT 1", None).unread);
    }

    #[test]
    fn hot_spots() {
        let hot = |sql: &str| {
            let mut d = Digester::default();
            d.digest(sql.as_bytes(), Some(LexMode::default()));
            d.hot(sql.as_bytes()).map(|h| {
                (
                    h.column.into_owned(),
                    h.literal
                        .map(|l| String::from_utf8(l.into_owned()).unwrap()),
                    h.param,
                )
            })
        };
        let lit = |c: &str, v: &str| Some((c.to_string(), Some(v.to_string()), None));
        assert_eq!(
            hot("SELECT c FROM t WHERE id = 42 AND k = 7"),
            lit("id", "42")
        );
        assert_eq!(
            hot("UPDATE t SET a = 1 WHERE `slug` = 'it''s' LIMIT 1"),
            lit("slug", "it's")
        );
        assert_eq!(
            hot("SELECT 1 FROM t WHERE s = \"a\\\"b\""),
            lit("s", "a\"b")
        );
        assert_eq!(hot("SELECT 1 FROM t WHERE s = 'plain'"), lit("s", "plain"));
        assert_eq!(
            hot("SELECT c FROM t WHERE a > 1 AND t.k = ? AND id = 3"),
            Some(("k".into(), None, Some(0)))
        );
        assert_eq!(
            hot("SELECT ? FROM t WHERE a = ?"),
            Some(("a".into(), None, Some(1)))
        );
        assert_eq!(hot("SELECT c FROM t WHERE id = 1 + 2"), None);
        assert_eq!(hot("UPDATE t SET a = 1"), None);
    }

    #[test]
    fn buckets_cover_latencies() {
        for us in [0u64, 1, 2, 3, 5, 100, 1000, 123_456, u64::MAX / 4] {
            let b = bucket(us);
            assert!(bucket_top(b) >= us, "{us} in {b} (top {})", bucket_top(b));
            if b > 1 {
                assert!(bucket_top(b - 1) < us, "{us}");
            }
        }
    }

    fn sample<'a>(hash: u64, user: &'a str, took_us: u64) -> Sample<'a> {
        Sample {
            hash,
            schema: Some("db"),
            user,
            took: Duration::from_micros(took_us),
            at: Instant::now(),
            rows_sent: 1,
            rows_affected: 0,
            error: None,
            handling: Handling::Passthrough,
            rule: None,
            hot: None,
        }
    }

    #[test]
    fn rows_aggregate_and_evict() {
        let t = Digests::new(3);
        for i in 0..100u64 {
            t.record(&sample(1, "u", i + 1), || "one".into());
        }
        let e = Sample {
            error: Some(1062),
            ..sample(2, "u", 10)
        };
        t.record(&e, || "two".into());
        t.record(&sample(2, "v", 10), || "two".into());
        let rows = t.rows();
        assert_eq!(rows.len(), 3);
        let one = rows.iter().find(|r| r.digest_text == "one").unwrap();
        assert_eq!(
            (
                one.count_star,
                one.min_time_us,
                one.max_time_us,
                one.sum_time_us
            ),
            (100, 1, 100, 5050)
        );
        assert!((99..=127).contains(&one.p99_time_us), "{}", one.p99_time_us);
        assert_eq!(one.rows_sent, 100);
        let two = rows
            .iter()
            .find(|r| r.digest_text == "two" && r.user.as_deref() == Some("u"))
            .unwrap();
        assert_eq!(
            (two.errors, two.error_codes.as_deref()),
            (1, Some("1062:1"))
        );
        // A fourth row evicts the least recently seen (digest 1).
        t.record(&sample(3, "u", 1), || "three".into());
        assert_eq!((t.len(), t.evicted()), (3, 1));
        assert!(t.rows().iter().all(|r| r.digest_text != "one"));
        assert_eq!(t.reset(), 3);
        assert!(t.is_empty());
        let off = Digests::new(0);
        off.record(&sample(1, "u", 1), || "x".into());
        assert_eq!(off.len(), 0);
    }

    #[test]
    fn word_sets_match_their_lists() {
        for list in [MORE_KEYWORDS, START_EXPR_WORDS] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "sorted");
            assert!(list.iter().all(|w| w.len() <= 32));
        }
        for w in MORE_KEYWORDS {
            assert!(more_keyword(w) && more_keyword(&w.to_ascii_lowercase()));
        }
        for w in START_EXPR_WORDS {
            assert!(START_EXPR_SET.contains(&w.to_ascii_lowercase()));
        }
        for w in [
            &b"SQL_CALC_FOUND_ROW"[..],
            b"sql_calc_found_rows_",
            b"",
            b"A",
            b"id",
            b"ALTERS",
        ] {
            assert!(!more_keyword(w), "{}", String::from_utf8_lossy(w));
        }
        assert!(!START_EXPR_SET.contains(b"ANDX") && !START_EXPR_SET.contains(b"A"));
    }

    #[test]
    fn prepares_count_in_their_row() {
        let t = Digests::new(10);
        let at = Instant::now();
        // A prepare makes the row (no execute yet), executes count in the same row.
        t.record_prepare(1, Some("db"), "u", at, || "one".into());
        t.record_prepare(1, Some("db"), "u", at, || unreachable!());
        let rows = t.rows();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].prepares, rows[0].count_star, rows[0].min_time_us),
            (2, 0, 0)
        );
        assert_eq!(rows[0].p99_time_us, 0);
        t.record(&sample(1, "u", 5), || unreachable!());
        let rows = t.rows();
        assert_eq!((rows[0].prepares, rows[0].count_star), (2, 1));
        assert!(
            rows[0].json().ends_with(",\"prepares\":2}"),
            "{}",
            rows[0].json()
        );
        assert_eq!(
            rows[0].order_value("prepares"),
            Some(crate::digest::OrderValue::Number(2))
        );
        // Counted per (digest, schema, user); nothing when digests are off.
        t.record_prepare(1, Some("db"), "v", at, || "one".into());
        assert_eq!(t.len(), 2);
        let off = Digests::new(0);
        off.record_prepare(1, None, "u", at, || "x".into());
        assert!(off.is_empty());
    }

    #[test]
    fn hot_keys_find_the_heavy_hitter() {
        let mut h = HotKeys::new("id");
        for i in 0..10_000u32 {
            let v = if i % 2 == 0 {
                "42".to_string()
            } else {
                (i % 1000).to_string()
            };
            h.add(v.as_bytes());
        }
        let json = h.json();
        assert!(
            json.starts_with("{\"column\":\"id\",\"distinct\":"),
            "{json}"
        );
        assert!(json.contains("\"top\":[[\"42\","), "{json}");
        let d = h.distinct();
        assert!((400..=800).contains(&d), "distinct {d}");
        let top = h.top.iter().max_by_key(|e| e.count).unwrap();
        assert!((5000..=5900).contains(&top.count), "{}", top.count);
    }

    #[test]
    fn execute_params() {
        let param = |p: &[u8], n: usize, types: &mut Vec<u8>, want: usize| {
            let mut out = vec![b'x'];
            let shown = execute_param(p, n, types, want, &mut out);
            assert!(shown || out.is_empty());
            shown.then_some(out)
        };
        // Two parameters: a LONGLONG 42 and a string "ab".
        let mut p = vec![0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0b00, 1, 8, 0, 253, 0];
        p.extend_from_slice(&42i64.to_le_bytes());
        p.extend_from_slice(&[2, b'a', b'b']);
        let mut types = Vec::new();
        assert_eq!(param(&p, 2, &mut types, 0), Some(b"42".to_vec()));
        assert_eq!(param(&p, 2, &mut types, 1), Some(b"ab".to_vec()));
        // Not rebound: the types of the last bind.
        let mut q = vec![0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0b01, 0];
        q.extend_from_slice(&[1, b'z']);
        assert_eq!(param(&q, 2, &mut types, 0), None);
        assert_eq!(param(&q, 2, &mut types, 1), Some(b"z".to_vec()));
        let mut r = vec![0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 8, 0];
        r.push(0xFF);
        r.extend_from_slice(&7i64.to_le_bytes());
        assert_eq!(param(&r, 2, &mut types, 0), Some(b"-1".to_vec()));
        assert_eq!(param(&r, 2, &mut types, 1), Some(b"7".to_vec()));
    }

    #[test]
    fn json_rows() {
        let t = Digests::new(10);
        let r: Arc<str> = Arc::from("hits");
        let s = Sample {
            rule: Some(&r),
            handling: Handling::Rewritten,
            hot: Some(("id", b"7")),
            ..sample(9, "u\"", 5)
        };
        t.record(&s, || "SELECT \"x\"".into());
        let j = t.rows()[0].json();
        assert!(j.contains("\"user\":\"u\\\"\""), "{j}");
        assert!(j.contains("\"digest_text\":\"SELECT \\\"x\\\"\""), "{j}");
        assert!(
            j.contains("\"handling\":\"rewritten\",\"rule\":\"hits\""),
            "{j}"
        );
        assert!(
            j.contains("\"hot_keys\":{\"column\":\"id\",\"distinct\":1,\"top\":[[\"7\",1]]}"),
            "{j}"
        );
        assert!(j.contains(&format!("\"digest\":\"{:016x}\"", 9)), "{j}");
    }
}
