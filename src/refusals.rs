//! What the admin port's `SHOW REFUSALS` and `SHOW FALLBACKS` list: the statements
//! a rule refused (ERR 1105; in shadow mode, would have refused) or forwarded
//! unchanged as its fallback, grouped by statement shape.
//!
//! A shape is the plan cache's fingerprint of the statement (literals as `?`,
//! comments dropped, whitespace and keywords normalised; [`sqltok::normalize`])
//! read under the session's `sql_mode`, together with the rule, its mode (on or
//! shadow) and the reason (for a refusal, with its [`RefusalClass`]). Per shape a [`ShapeTable`] keeps the count, when it was
//! first and last seen (UTC), and one example: the first statement of the shape as
//! the client wrote it, with every literal replaced by `?` and comments dropped, so
//! no value a client sent is kept or shown.
//!
//! Each table holds at most `shape_table_size` shapes; a new shape beyond that evicts
//! the least recently seen one (counted, `heatsink_shapes_evicted_total`). Only
//! refused and fallback statements reach a table. The work (lexing, masking) is done
//! before its lock is taken; the lock is held for a map update and never across an
//! await.
//!
//! The first time a shape is seen, one `info` line names the rule, the reason and the
//! example ([`LogLimiter`]): never more than one line per shape (a shape evicted or
//! reset and seen again is not logged again, unless [`LOGGED_MEMORY`] other shapes
//! were logged since), and at most [`LOG_LINES_PER_MINUTE`] such lines per minute in
//! all, so a flood of distinct shapes cannot flood the log. A line the cap held back
//! is tried again the next time its shape is seen; the next line says how many were
//! held back.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::info;

use crate::rewrite::sqltok::{self, LexMode, Token, TokenKind};
use crate::rewrite::RefusalClass;

/// Shapes kept per table by default.
pub const DEFAULT_SHAPES: usize = 1000;
/// Largest `shape_table_size`.
pub const MAX_SHAPES: usize = 1_000_000;
/// Bytes of an example kept (longer ones are cut at a character boundary and end
/// with `…`).
pub const MAX_EXAMPLE: usize = 1024;
/// Bytes of a reason kept.
pub const MAX_REASON: usize = 1024;
/// First-seen log lines written per minute at most, for both tables together.
pub const LOG_LINES_PER_MINUTE: u32 = 20;
/// How many logged shapes are remembered so that none is logged twice.
pub const LOGGED_MEMORY: usize = 65_536;

/// Which table: refused statements, or statements a rule let through unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Answered with ERR 1105 (or, in shadow mode, would have been).
    Refusal,
    /// Forwarded unchanged because the rule could not answer it exactly.
    Fallback,
}

impl Kind {
    /// `refusals` or `fallbacks` (metric labels, commands).
    pub fn label(self) -> &'static str {
        match self {
            Kind::Refusal => "refusals",
            Kind::Fallback => "fallbacks",
        }
    }
}

/// One refused or fallback statement, as the session saw it.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    /// The rule.
    pub rule: &'a Arc<str>,
    /// Why (the refusal's reason, or the fallback's).
    pub reason: &'a str,
    /// The refusal's class (`None` for a fallback).
    pub class: Option<RefusalClass>,
    /// The rule runs in shadow mode: the statement was forwarded unchanged.
    pub shadow: bool,
    /// The statement as the client sent it, in the connection's character set.
    pub sql: &'a [u8],
    /// How the session's `sql_mode` reads its quotes and backslashes; `None` when
    /// the connection's character set is one the lexer cannot read (a byte 0x5C or
    /// a quote may be part of a character): the statement then shows only its size.
    pub mode: Option<LexMode>,
}

/// A statement's shape, computed outside any lock.
struct Shape {
    /// The statement's fingerprint (the plan cache's form).
    fingerprint: Vec<u8>,
    /// Its tokens, for the example (`None`: the statement does not lex).
    tokens: Option<Vec<Token>>,
}

/// Fingerprint of every statement that does not lex: one shape.
const UNLEXED: &[u8] = b"<a statement that does not lex>";
/// Fingerprint of every statement in a character set the lexer cannot read.
const UNREADABLE: &[u8] = b"<a statement in a character set heatsink cannot read>";

impl Shape {
    fn of(sql: &[u8], mode: Option<LexMode>) -> Shape {
        let Some(mode) = mode else {
            return Shape {
                fingerprint: UNREADABLE.to_vec(),
                tokens: None,
            };
        };
        match sqltok::lex(sql, mode) {
            Ok(toks) => {
                let mut fingerprint = Vec::with_capacity(sql.len());
                sqltok::normalize(
                    sql,
                    &toks,
                    sqltok::Mode::Fingerprint,
                    &mut fingerprint,
                    &mut Vec::new(),
                );
                Shape {
                    fingerprint,
                    tokens: Some(toks),
                }
            }
            Err(_) => Shape {
                fingerprint: UNLEXED.to_vec(),
                tokens: None,
            },
        }
    }

    /// The short id shown for the fingerprint (stable for one build).
    fn id(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.fingerprint.hash(&mut h);
        h.finish()
    }

    /// The table key: kind, mode, rule, reason and fingerprint, in 128 bits.
    fn key(&self, kind: Kind, seen: &Seen<'_>) -> u128 {
        let half = |salt: u8| {
            let mut h = DefaultHasher::new();
            let class = seen.class.map(RefusalClass::label);
            (
                salt,
                kind as u8,
                seen.shadow,
                &**seen.rule,
                class,
                seen.reason,
            )
                .hash(&mut h);
            self.fingerprint.hash(&mut h);
            h.finish()
        };
        (u128::from(half(0)) << 64) | u128::from(half(1))
    }

    fn example(&self, sql: &[u8]) -> String {
        match &self.tokens {
            Some(toks) => masked(sql, toks, MAX_EXAMPLE),
            None if self.fingerprint == UNREADABLE => format!(
                "<{} bytes in a character set heatsink cannot read>",
                sql.len()
            ),
            None => format!("<{} bytes that do not lex>", sql.len()),
        }
    }
}

/// The statement as written, with every literal as `?`, comments and runs of
/// whitespace as one space, cut after about `max` bytes (at a character boundary,
/// ending with `…`). Parameters stay `?`.
pub fn masked(sql: &[u8], toks: &[Token], max: usize) -> String {
    let mut out = Vec::with_capacity(sql.len().min(max + 8));
    let mut prev_end = None;
    let mut cut = false;
    for t in toks {
        if out.len() > max {
            cut = true;
            break;
        }
        if prev_end.is_some_and(|e| e < t.start) {
            out.push(b' ');
        }
        match t.kind {
            TokenKind::Literal(_) => out.push(b'?'),
            _ => out.extend_from_slice(&sql[t.start..t.end]),
        }
        prev_end = Some(t.end);
    }
    let mut text = String::from_utf8_lossy(&out).into_owned();
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        cut = true;
    }
    if cut {
        text.push('…');
    }
    text
}

/// `s` cut to at most `max` bytes at a character boundary.
fn clipped(s: &str, max: usize) -> Box<str> {
    if s.len() <= max {
        return s.into();
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}…", &s[..at]).into()
}

/// One shape of a table.
#[derive(Debug)]
struct Entry {
    rule: Arc<str>,
    class: Option<RefusalClass>,
    reason: Box<str>,
    shadow: bool,
    fingerprint: u64,
    example: Box<str>,
    count: u64,
    first_seen: u64,
    last_seen: u64,
    /// Position in [`Inner::order`].
    seq: u64,
    /// Its first-seen line was written (or had been, before an eviction).
    logged: bool,
}

/// One row of `SHOW REFUSALS` / `SHOW FALLBACKS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The rule.
    pub rule: Arc<str>,
    /// What kind of obstacle the refusal is (`None` in `SHOW FALLBACKS`).
    pub class: Option<RefusalClass>,
    /// Why the statements were refused or fell back.
    pub reason: String,
    /// The rule ran in shadow mode (refusals only: the statements were forwarded).
    pub shadow: bool,
    /// Statements of the shape since it entered the table.
    pub count: u64,
    /// First seen, seconds since the Unix epoch.
    pub first_seen: u64,
    /// Last seen, seconds since the Unix epoch.
    pub last_seen: u64,
    /// The fingerprint's id (16 hex digits in the admin port and the log).
    pub fingerprint: u64,
    /// The first statement of the shape, literals masked.
    pub example: String,
}

#[derive(Debug, Default)]
struct Inner {
    shapes: HashMap<u128, Entry>,
    /// Keys by the sequence number of their last sighting: the first is the least
    /// recently seen.
    order: BTreeMap<u64, u128>,
    next_seq: u64,
}

impl Inner {
    /// Counts one more statement of a known shape.
    fn bump(&mut self, key: u128, now: u64) -> Option<&mut Entry> {
        let seq = self.next_seq;
        let e = self.shapes.get_mut(&key)?;
        self.next_seq += 1;
        self.order.remove(&e.seq);
        self.order.insert(seq, key);
        e.seq = seq;
        e.count += 1;
        e.last_seen = e.last_seen.max(now);
        Some(e)
    }
}

/// The shapes of one kind, bounded (see the module documentation).
#[derive(Debug)]
pub struct ShapeTable {
    kind: Kind,
    max: usize,
    inner: Mutex<Inner>,
    /// Shapes evicted to make room since start.
    evicted: AtomicU64,
    /// Statements recorded since start.
    recorded: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A first-seen line to write once the locks are released.
struct Line {
    kind: Kind,
    rule: Arc<str>,
    class: Option<RefusalClass>,
    reason: Box<str>,
    shadow: bool,
    fingerprint: u64,
    example: Box<str>,
    held_back: u64,
}

impl Line {
    fn of(kind: Kind, e: &Entry, held_back: u64) -> Line {
        Line {
            kind,
            rule: e.rule.clone(),
            class: e.class,
            reason: e.reason.clone(),
            shadow: e.shadow,
            fingerprint: e.fingerprint,
            example: e.example.clone(),
            held_back,
        }
    }

    fn write(&self) {
        let fingerprint = format!("{:016x}", self.fingerprint);
        let (rule, reason, example) = (&*self.rule, &*self.reason, &*self.example);
        let class = self.class.map_or("", RefusalClass::label);
        let held_back = self.held_back;
        match (self.kind, self.shadow) {
            (Kind::Refusal, false) => info!(
                rule,
                class,
                reason,
                example,
                fingerprint,
                held_back,
                "statement shape refused for the first time (SHOW REFUSALS)"
            ),
            (Kind::Refusal, true) => info!(
                rule,
                class,
                reason,
                example,
                fingerprint,
                held_back,
                "shadow: statement shape the rule would refuse, seen for the first time (SHOW REFUSALS)"
            ),
            (Kind::Fallback, _) => info!(
                rule,
                reason,
                example,
                fingerprint,
                held_back,
                "statement shape fell back for the first time (SHOW FALLBACKS)"
            ),
        }
    }
}

impl ShapeTable {
    /// A table of at most `max` shapes (zero: nothing is kept).
    pub fn new(kind: Kind, max: usize) -> ShapeTable {
        ShapeTable {
            kind,
            max,
            inner: Mutex::default(),
            evicted: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        }
    }

    /// Counts one statement (and writes its shape's first-seen line if `log` lets it).
    pub fn record(&self, seen: &Seen<'_>, log: &LogLimiter) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Some(line) = self.record_at(seen, log, now, Instant::now()) {
            line.write();
        }
    }

    /// [`ShapeTable::record`] at a given time; the line to write, if any.
    fn record_at(
        &self,
        seen: &Seen<'_>,
        log: &LogLimiter,
        now: u64,
        clock: Instant,
    ) -> Option<Line> {
        if self.max == 0 {
            return None;
        }
        self.recorded.fetch_add(1, Relaxed);
        let shape = Shape::of(seen.sql, seen.mode);
        let key = shape.key(self.kind, seen);
        let kind = self.kind;
        let first_line = |e: &mut Entry| -> Option<Line> {
            if e.logged {
                return None;
            }
            match log.admit(key, clock) {
                Admit::Already => {
                    e.logged = true;
                    None
                }
                Admit::Yes { held_back } => {
                    e.logged = true;
                    Some(Line::of(kind, e, held_back))
                }
                Admit::HeldBack => None,
            }
        };
        if let Some(e) = lock(&self.inner).bump(key, now) {
            return first_line(e);
        }
        // A new shape: its example is made outside the lock.
        let mut entry = Entry {
            rule: seen.rule.clone(),
            class: seen.class,
            reason: clipped(seen.reason, MAX_REASON),
            shadow: seen.shadow,
            fingerprint: shape.id(),
            example: shape.example(seen.sql).into(),
            count: 1,
            first_seen: now,
            last_seen: now,
            seq: 0,
            logged: false,
        };
        let mut g = lock(&self.inner);
        if let Some(e) = g.bump(key, now) {
            // Another session added it meanwhile.
            return first_line(e);
        }
        while g.shapes.len() >= self.max {
            let Some((_, old)) = g.order.pop_first() else {
                break;
            };
            g.shapes.remove(&old);
            self.evicted.fetch_add(1, Relaxed);
        }
        entry.seq = g.next_seq;
        g.next_seq += 1;
        let line = first_line(&mut entry);
        g.order.insert(entry.seq, key);
        g.shapes.insert(key, entry);
        line
    }

    /// Every shape, most frequent first (then most recently seen first).
    pub fn rows(&self) -> Vec<Row> {
        let mut rows: Vec<(u64, Row)> = lock(&self.inner)
            .shapes
            .values()
            .map(|e| {
                (
                    e.seq,
                    Row {
                        rule: e.rule.clone(),
                        class: e.class,
                        reason: e.reason.to_string(),
                        shadow: e.shadow,
                        count: e.count,
                        first_seen: e.first_seen,
                        last_seen: e.last_seen,
                        fingerprint: e.fingerprint,
                        example: e.example.to_string(),
                    },
                )
            })
            .collect();
        rows.sort_by(|(sa, a), (sb, b)| b.count.cmp(&a.count).then(sb.cmp(sa)));
        rows.into_iter().map(|(_, r)| r).collect()
    }

    /// Forgets every shape; the number forgotten. (Shapes already logged are not
    /// logged again.)
    pub fn reset(&self) -> usize {
        let mut g = lock(&self.inner);
        let n = g.shapes.len();
        g.shapes.clear();
        g.order.clear();
        n
    }

    /// Shapes held now.
    pub fn len(&self) -> usize {
        lock(&self.inner).shapes.len()
    }

    /// True when no shape is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most shapes held.
    pub fn capacity(&self) -> usize {
        self.max
    }

    /// Shapes evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }

    /// Statements recorded since start.
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Relaxed)
    }

    /// Which table this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }
}

/// What [`LogLimiter::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// The shape was logged before: no line.
    Already,
    /// Write the line; `held_back` lines were held back by the cap since the last.
    Yes { held_back: u64 },
    /// The minute's lines are spent: no line now.
    HeldBack,
}

#[derive(Debug, Default)]
struct LimiterInner {
    window_start: Option<Instant>,
    in_window: u32,
    held_back: u64,
    logged: HashSet<u128>,
    order: VecDeque<u128>,
}

/// The first-seen lines' limits: one line per shape, at most `per_minute` lines a
/// minute. Shared by both tables.
#[derive(Debug)]
pub struct LogLimiter {
    per_minute: u32,
    inner: Mutex<LimiterInner>,
    /// Lines held back by the cap since start.
    held_back: AtomicU64,
}

impl LogLimiter {
    /// At most `per_minute` lines a minute.
    pub fn new(per_minute: u32) -> LogLimiter {
        LogLimiter {
            per_minute,
            inner: Mutex::default(),
            held_back: AtomicU64::new(0),
        }
    }

    /// Lines held back by the per-minute cap since start.
    pub fn held_back(&self) -> u64 {
        self.held_back.load(Relaxed)
    }

    fn admit(&self, key: u128, now: Instant) -> Admit {
        let mut g = lock(&self.inner);
        if g.logged.contains(&key) {
            return Admit::Already;
        }
        let expired = g
            .window_start
            .is_none_or(|s| now.saturating_duration_since(s) >= Duration::from_secs(60));
        if expired {
            g.window_start = Some(now);
            g.in_window = 0;
        }
        if g.in_window >= self.per_minute {
            g.held_back += 1;
            self.held_back.fetch_add(1, Relaxed);
            return Admit::HeldBack;
        }
        g.in_window += 1;
        if g.order.len() >= LOGGED_MEMORY {
            if let Some(old) = g.order.pop_front() {
                g.logged.remove(&old);
            }
        }
        g.logged.insert(key);
        g.order.push_back(key);
        Admit::Yes {
            held_back: std::mem::take(&mut g.held_back),
        }
    }
}

/// Both tables and their log limiter (one per server, in [`crate::relay::Shared`]).
#[derive(Debug)]
pub struct Shapes {
    /// Refused statements (`SHOW REFUSALS`), shadow mode's included.
    pub refusals: ShapeTable,
    /// Statements forwarded as a rule's fallback (`SHOW FALLBACKS`).
    pub fallbacks: ShapeTable,
    /// The first-seen lines' limits.
    pub log: LogLimiter,
    /// Refused statements (shadow mode's included) since start, by class
    /// ([`RefusalClass::index`]): `heatsink_refusals_total`.
    by_class: [AtomicU64; RefusalClass::ALL.len()],
}

impl Default for Shapes {
    fn default() -> Self {
        Shapes::new(DEFAULT_SHAPES)
    }
}

impl Shapes {
    /// Tables of at most `max` shapes each.
    pub fn new(max: usize) -> Shapes {
        Shapes {
            refusals: ShapeTable::new(Kind::Refusal, max),
            fallbacks: ShapeTable::new(Kind::Fallback, max),
            log: LogLimiter::new(LOG_LINES_PER_MINUTE),
            by_class: Default::default(),
        }
    }

    /// Records a refused statement (or, `seen.shadow`, one a rule would refuse).
    pub fn refused(&self, seen: &Seen<'_>) {
        if let Some(c) = seen.class {
            self.by_class[c.index()].fetch_add(1, Relaxed);
        }
        self.refusals.record(seen, &self.log);
    }

    /// Refused statements (shadow mode's included) since start, per class in the
    /// order of [`RefusalClass::ALL`].
    pub fn refused_by_class(&self) -> [(RefusalClass, u64); RefusalClass::ALL.len()] {
        RefusalClass::ALL.map(|c| (c, self.by_class[c.index()].load(Relaxed)))
    }

    /// Records a statement forwarded as a rule's fallback.
    pub fn fell_back(&self, seen: &Seen<'_>) {
        self.fallbacks.record(seen, &self.log);
    }

    /// The table of `kind`.
    pub fn table(&self, kind: Kind) -> &ShapeTable {
        match kind {
            Kind::Refusal => &self.refusals,
            Kind::Fallback => &self.fallbacks,
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of seconds since the Unix epoch.
pub fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let (y, m, d) = crate::kinds::calendar::civil(days);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    fn seen<'a>(rule: &'a Arc<str>, reason: &'a str, sql: &'a str) -> Seen<'a> {
        Seen {
            rule,
            reason,
            class: Some(RefusalClass::Shape),
            shadow: false,
            sql: sql.as_bytes(),
            mode: Some(LexMode::default()),
        }
    }

    fn example(sql: &str, mode: LexMode) -> String {
        Shape::of(sql.as_bytes(), Some(mode)).example(sql.as_bytes())
    }

    #[test]
    fn refusals_keep_their_class_and_are_counted_by_it() {
        let shapes = Shapes::new(10);
        let r = rule("r");
        let sql = "UPDATE t SET x = 1 WHERE k = 'p'";
        shapes.refused(&seen(&r, "why", sql));
        shapes.refused(&Seen {
            class: Some(RefusalClass::Session),
            ..seen(&r, "the connection's character set is gbk", sql)
        });
        shapes.fell_back(&Seen {
            class: None,
            ..seen(&r, "cannot answer", "SELECT 1")
        });
        let mut classes: Vec<Option<RefusalClass>> =
            shapes.refusals.rows().iter().map(|r| r.class).collect();
        classes.sort();
        assert_eq!(
            classes,
            [Some(RefusalClass::Shape), Some(RefusalClass::Session)]
        );
        assert_eq!(shapes.fallbacks.rows()[0].class, None);
        let counted: Vec<(&str, u64)> = shapes
            .refused_by_class()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(c, n)| (c.label(), *n))
            .collect();
        assert_eq!(counted, [("shape", 1), ("session", 1)]);
    }

    #[test]
    fn examples_mask_every_literal() {
        let d = LexMode::default();
        assert_eq!(
            example(
                "UPDATE hits  SET cnt = cnt * 2, note = 'secret', n = -1.5e3, h = 0xFF, b = b'101', s = _utf8mb4'x' 'y' WHERE slug = \"home\" AND id = ?",
                d
            ),
            "UPDATE hits SET cnt = cnt * ?, note = ?, n = -?, h = ?, b = ?, s = ? WHERE slug = ? AND id = ?"
        );
        // Comments go (they may hold anything); the case of the text stays.
        assert_eq!(
            example("select /* user 'bob' */ x -- pw 42\nfrom t # 7\n", d),
            "select x from t"
        );
        // Executable comments run: their content is a statement's, masked.
        assert_eq!(example("SELECT /*!50000 'v', */ 1", d), "SELECT ?, ?");
        // Under NO_BACKSLASH_ESCAPES `'x\'` ends at the backslash: the rest is a
        // second literal, not text.
        let nbe = LexMode {
            no_backslash_escapes: true,
            ansi_quotes: false,
        };
        assert_eq!(example("SELECT 'x\\', 'secret'", nbe), "SELECT ?, ?");
        assert!(!example("SELECT 'x\\', 'secret'", d).contains("secret"));
        // Under ANSI_QUOTES a double-quoted word is a name, not a value.
        let ansi = LexMode {
            no_backslash_escapes: false,
            ansi_quotes: true,
        };
        assert_eq!(example("SELECT \"c\" FROM t", ansi), "SELECT \"c\" FROM t");
        assert_eq!(example("SELECT \"c\" FROM t", d), "SELECT ? FROM t");
        // A statement that does not lex shows only its size, as does one in a
        // character set the lexer cannot read (gbk: 0x5C may end a character).
        assert_eq!(example("SELECT 'open", d), "<12 bytes that do not lex>");
        let gbk = b"SELECT '\x95\\', 'secret'";
        let s = Shape::of(gbk, None);
        assert_eq!(
            s.example(gbk),
            "<21 bytes in a character set heatsink cannot read>"
        );
        assert_eq!(s.id(), Shape::of(b"SELECT 1", None).id());
    }

    #[test]
    fn examples_are_cut_at_a_character_boundary() {
        let long = format!("SELECT {} FROM t", "é".repeat(2000));
        let e = example(&long, LexMode::default());
        assert!(e.len() <= MAX_EXAMPLE + '…'.len_utf8(), "{}", e.len());
        assert!(e.ends_with('…'), "{e}");
        assert!(e.starts_with("SELECT éé"), "{e}");
        let many = format!("SELECT {}1", "1, ".repeat(2000));
        let e = example(&many, LexMode::default());
        assert!(e.ends_with('…') && !e.contains('1'), "{e}");
        assert_eq!(clipped("abc", 3).as_ref(), "abc");
        assert_eq!(clipped("aé", 2).as_ref(), "a…");
    }

    #[test]
    fn shapes_count_by_fingerprint_rule_mode_and_reason() {
        let t = ShapeTable::new(Kind::Refusal, 10);
        let log = LogLimiter::new(100);
        let (a, b) = (rule("a"), rule("b"));
        let clock = Instant::now();
        let rec = |s: &Seen<'_>, now| t.record_at(s, &log, now, clock).is_some();
        // Values, spacing, comments and keyword case do not make a new shape.
        assert!(rec(
            &seen(&a, "why", "UPDATE t SET x = 1 WHERE k = 'p'"),
            100
        ));
        assert!(!rec(
            &seen(&a, "why", "update t  SET x = 22 /* c */ WHERE k = 'q'"),
            105
        ));
        // Another rule, reason, mode or shape does.
        assert!(rec(
            &seen(&b, "why", "UPDATE t SET x = 1 WHERE k = 'p'"),
            106
        ));
        assert!(rec(
            &seen(&a, "other", "UPDATE t SET x = 1 WHERE k = 'p'"),
            107
        ));
        let shadow = Seen {
            shadow: true,
            ..seen(&a, "why", "UPDATE t SET x = 1 WHERE k = 'p'")
        };
        assert!(rec(&shadow, 108));
        assert!(!rec(&shadow, 109));
        assert!(rec(
            &seen(&a, "why", "UPDATE t SET x = x * 1 WHERE k = 'p'"),
            110
        ));
        let rows = t.rows();
        assert_eq!(rows.len(), 5);
        // Most frequent first; among equals the most recently seen.
        assert_eq!(
            (rows[0].count, rows[0].shadow, rows[0].last_seen),
            (2, true, 109)
        );
        assert_eq!(
            (rows[1].count, rows[1].first_seen, rows[1].last_seen),
            (2, 100, 105)
        );
        assert_eq!(rows[1].example, "UPDATE t SET x = ? WHERE k = ?");
        assert_eq!(rows[1].reason, "why");
        assert_eq!(&*rows[1].rule, "a");
        assert_eq!(rows[2].last_seen, 110);
        // One fingerprint id per statement shape, whatever the rule.
        assert_eq!(
            rows.iter()
                .filter(|r| r.fingerprint == rows[1].fingerprint)
                .count(),
            4
        );
        assert_eq!(t.recorded(), 7);
        assert_eq!(t.reset(), 5);
        assert!(t.is_empty());
        // After a reset a shape counts afresh, but is not logged again.
        assert!(!rec(
            &seen(&a, "why", "UPDATE t SET x = 3 WHERE k = 'r'"),
            120
        ));
        assert_eq!(t.rows()[0].count, 1);
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_seen_shape() {
        let t = ShapeTable::new(Kind::Fallback, 3);
        let log = LogLimiter::new(100);
        let r = rule("r");
        let clock = Instant::now();
        let sql = |i: usize| format!("SELECT c{i} FROM t WHERE k = {i}");
        for i in 0..3 {
            t.record_at(&seen(&r, "why", &sql(i)), &log, i as u64, clock);
        }
        // 0 is seen again: 1 is now the least recently seen.
        t.record_at(&seen(&r, "why", &sql(0)), &log, 3, clock);
        t.record_at(&seen(&r, "why", &sql(3)), &log, 4, clock);
        let mut kept: Vec<String> = t.rows().into_iter().map(|r| r.example).collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                "SELECT c0 FROM t WHERE k = ?",
                "SELECT c2 FROM t WHERE k = ?",
                "SELECT c3 FROM t WHERE k = ?"
            ]
        );
        assert_eq!((t.evicted(), t.len(), t.capacity()), (1, 3, 3));
        // Many more: never more than three.
        for i in 10..100 {
            t.record_at(&seen(&r, "why", &sql(i)), &log, i as u64, clock);
        }
        assert_eq!((t.evicted(), t.len()), (91, 3));
        // Zero keeps nothing.
        let off = ShapeTable::new(Kind::Refusal, 0);
        assert!(off
            .record_at(&seen(&r, "why", &sql(1)), &log, 1, clock)
            .is_none());
        assert_eq!((off.len(), off.recorded()), (0, 0));
    }

    #[test]
    fn first_seen_lines_are_capped_per_minute_and_once_per_shape() {
        let t = ShapeTable::new(Kind::Refusal, 100);
        let log = LogLimiter::new(3);
        let r = rule("r");
        let start = Instant::now();
        let sql = |i: usize| format!("SELECT c{i} FROM t");
        let lines = |from: usize, to: usize, at: Instant| {
            (from..to)
                .filter_map(|i| t.record_at(&seen(&r, "why", &sql(i)), &log, 0, at))
                .collect::<Vec<_>>()
        };
        let first = lines(0, 10, start);
        assert_eq!(first.len(), 3);
        assert_eq!(log.held_back(), 7);
        // Within the minute, nothing more; a shape seen again is not logged twice.
        assert!(lines(0, 10, start + Duration::from_secs(59)).is_empty());
        // A minute later: the shapes held back get their line when seen again, the
        // first one saying how many were held back.
        let next = lines(0, 10, start + Duration::from_secs(60));
        assert_eq!(next.len(), 3);
        assert_eq!(next[0].held_back, 14);
        assert_eq!(next[1].held_back, 0);
        assert_eq!(next[0].example.as_ref(), "SELECT c3 FROM t");
        let later = lines(0, 10, start + Duration::from_secs(600));
        assert_eq!(later.len(), 3);
        assert_eq!(later[0].example.as_ref(), "SELECT c6 FROM t");
        let last = lines(0, 10, start + Duration::from_secs(6000));
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].example.as_ref(), "SELECT c9 FROM t");
        assert!(lines(0, 10, start + Duration::from_secs(60000)).is_empty());
    }

    #[test]
    fn concurrent_sessions_count_every_statement() {
        let shapes = Arc::new(Shapes::new(50));
        let threads: Vec<_> = (0..8)
            .map(|n| {
                let shapes = shapes.clone();
                std::thread::spawn(move || {
                    let r = rule("r");
                    for i in 0..1000 {
                        let sql = format!("SELECT c{} FROM t WHERE k = {n}", i % 20);
                        shapes.refused(&seen(&r, "why", &sql));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let rows = shapes.refusals.rows();
        assert_eq!(rows.len(), 20);
        assert!(rows.iter().all(|r| r.count == 400), "{rows:?}");
        assert_eq!(shapes.refusals.recorded(), 8000);
        assert_eq!(shapes.fallbacks.recorded(), 0);
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_709_251_199), "2024-02-29 23:59:59");
        assert_eq!(utc(1_798_761_600), "2027-01-01 00:00:00");
    }
}
