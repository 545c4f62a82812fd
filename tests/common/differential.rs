//! Differential runs: the same seeded statements against a plain table directly on
//! MariaDB (the *reference*, in its own database, no rule) and against the ruled table
//! through heatsink, comparing every answer.
//!
//! A rule kind plugs in with a [`Kind`]: the logical schema, the rule file, the query
//! that shows the logical state, and a statement generator. The harness owns the rest:
//! two databases (`fz_<kind><n>_p` behind the proxy, `fz_<kind><n>_r` the reference), the
//! rule switched on with `heatsink migrate --apply`, a proxy, session-mode changes
//! (`SET NAMES`, `SET sql_mode`), the protocol of each statement (COM_QUERY, or
//! COM_STMT_PREPARE + COM_STMT_EXECUTE with some literals bound as parameters), and
//! the comparison.
//!
//! Both sides are driven by [`RawClient`], so what is compared is exactly what a client
//! receives: OK packets (affected rows, last_insert_id, info, warning count, the
//! IN_TRANS / AUTOCOMMIT / NO_BACKSLASH_ESCAPES status bits), ERR packets (code,
//! SQLSTATE, message with the database names replaced by `{db}`), prepare responses
//! (parameter and column counts and definitions), column definitions (name, org_name,
//! table, org_table, type, flags, decimals, charset, length) and rows byte for byte
//! (text or binary encoding; sorted first when the statement defines no order).
//!
//! A refusal by heatsink (ERR 1105 `heatsink rule '…'`) is accepted in place of the
//! reference's answer when it changed nothing: the statement is then not run on the
//! reference, and the logical state through heatsink must still equal the reference's.
//! The state (`Kind::state_query`, through heatsink and directly) is compared after
//! every write, every refusal and every [`STATE_EVERY`] statements.
//!
//! Statements come from a [`Gen`] seeded with the run's seed; the generator never
//! looks at answers, so a seed and a statement count replay a run exactly. Shapes
//! that hit a known open difference carry a tag from [`KNOWN_OPEN`], shapes that hit a
//! difference found here and not fixed yet one from [`FOUND`], shapes that hit a
//! documented limitation (rules/README.md) one from [`DOCUMENTED`]; tagged shapes are
//! generated only when their tag is switched on ([`Config::from_env`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Instant;

use super::cli::migrate_ok;
use super::fixture::fresh_db_with;
use super::packets::{parse_column_def, parse_err, parse_ok, read_lenenc, status};
use super::rawclient::{ConnectOpts, RawClient, RawParam};
use super::{mariadb, Proxy, PASSWORD, USER};

/// Known open differences (being fixed): generated only when switched on. A tag on
/// none of these lists (a difference that was fixed) is always generated.
pub const KNOWN_OPEN: &[&str] = &[];

/// Differences this fuzzer found that nobody is fixing yet: generated only when
/// switched on (`HEATSINK_FUZZ_FOUND=1`).
pub const FOUND: &[&str] = &[];

/// Documented limitations (rules/README.md, "Known differences"): generated only when
/// switched on; not expected to be fixed.
pub const DOCUMENTED: &[&str] = &[
    // An increment of a key the logical table does not have creates it.
    "doc_missing_key",
    // `cnt = cnt + 0` reports 1 changed row.
    "doc_zero_increment",
    // Expressions over a counter are typed from a BIGINT.
    "doc_counter_expr",
    // Increments beyond the column's range are accepted.
    "doc_int_range",
    // Table names match case-insensitively.
    "doc_table_case",
    // `cnt + 'x'` fails with 1366 instead of 1292.
    "doc_nonnumeric_delta",
    // An unsigned delta parameter on a negative counter: MariaDB computes the sum
    // unsigned and fails (1690); the slot upsert adds it.
    "found_unsigned_param",
    // A conversion error of a ring UPDATE says `at row N` counting the ring's rows.
    "found_ring_update_error",
    // An expression over the counter table's columns in a read (`MIN(slug)`) lacks
    // column flags such as NO_DEFAULT_VALUE.
    "found_read_metadata",
    // A multi-row ring insert replacing rows reports another row's last_insert_id.
    "doc_ring_multirow_id",
    // An absolute set reports the base row's Changed count.
    "doc_absolute_set",
];

/// A bounded run of `kind`: `rounds` rounds of `statements` statements (seeds `seed +
/// i * 1000`, fresh databases and sessions each; `HEATSINK_FUZZ_SEED`,
/// `HEATSINK_FUZZ_STATEMENTS` and `HEATSINK_FUZZ_ROUNDS` override), stopping at the
/// first round with a difference; panics with every difference found.
pub fn run_bounded(kind: &dyn Kind, seed: u64, statements: usize, rounds: u64) {
    run_bounded_on(kind, seed, statements, rounds, Target::Single);
}

/// [`run_bounded`] on `target`.
pub fn run_bounded_on(kind: &dyn Kind, seed: u64, statements: usize, rounds: u64, target: Target) {
    let base = Config::from_env(seed, statements);
    let rounds = std::env::var("HEATSINK_FUZZ_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(rounds);
    let diff = Differential::start_on(kind, target);
    let mut total = Report::default();
    for round in 0..rounds {
        let mut cfg = base.clone();
        cfg.seed = base.seed.wrapping_add(round * 1000);
        let report = diff.run(&cfg);
        eprintln!("{} seed {}: {}", kind.name(), cfg.seed, report.summary());
        let failed = !report.mismatches.is_empty();
        total.absorb(report);
        if failed {
            break;
        }
    }
    eprintln!(
        "{} total: {}\nrefusals:\n{}",
        kind.name(),
        total.summary(),
        total.refusal_summary()
    );
    assert!(
        total.mismatches.is_empty(),
        "{}: {} differences from the reference\n{}\n--- heatsink log (tail) ---\n{}",
        kind.name(),
        total.mismatches.len(),
        total.details(),
        super::client::tail(&diff.proxy.log_text(), 20)
    );
}

/// The logical state is compared at least this often (in statements).
pub const STATE_EVERY: usize = 20;

/// Stop a run after this many differences (later ones are mostly consequences).
pub const MAX_MISMATCHES: usize = 10;

// ---------------------------------------------------------------------------------------
// Pseudo-random numbers

/// SplitMix64: tiny, and stable forever, so a seed replays the same statements.
#[derive(Clone, Debug)]
pub struct Prng(u64);

impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// 0..n (0 for n = 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// lo..=hi.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % ((hi - lo) as u64 + 1)) as i64
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < percent as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

// ---------------------------------------------------------------------------------------
// Session modes

/// The client character sets the generator switches between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charset {
    Utf8mb4,
    Latin1,
    Gbk,
    Sjis,
}

impl Charset {
    pub const ALL: [Charset; 4] = [
        Charset::Utf8mb4,
        Charset::Latin1,
        Charset::Gbk,
        Charset::Sjis,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Charset::Utf8mb4 => "utf8mb4",
            Charset::Latin1 => "latin1",
            Charset::Gbk => "gbk",
            Charset::Sjis => "sjis",
        }
    }
}

/// What the meaning of a statement's bytes depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// `character_set_client`.
    pub charset: Charset,
    /// `sql_mode` as set (the server's default at first).
    pub sql_mode: String,
}

impl Session {
    pub fn no_backslash_escapes(&self) -> bool {
        self.sql_mode.contains("NO_BACKSLASH_ESCAPES")
    }

    pub fn ansi_quotes(&self) -> bool {
        self.sql_mode.contains("ANSI_QUOTES") || self.sql_mode.split(',').any(|m| m == "ANSI")
    }

    pub fn strict(&self) -> bool {
        self.sql_mode.contains("STRICT_")
    }
}

/// The sql_mode values the generator sets.
const SQL_MODES: &[&str] = &[
    "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION",
    "",
    "NO_ENGINE_SUBSTITUTION",
    "NO_BACKSLASH_ESCAPES",
    "STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES",
    "ANSI_QUOTES",
    "STRICT_TRANS_TABLES,ANSI_QUOTES",
    "ANSI",
    "ANSI_QUOTES,NO_BACKSLASH_ESCAPES",
];

// ---------------------------------------------------------------------------------------
// Statements

/// One piece of a generated statement.
#[derive(Clone, Debug)]
pub enum Piece {
    /// SQL text in the session's character set.
    Sql(Vec<u8>),
    /// The database name of the side (`fz_<kind><n>_p` or `fz_<kind><n>_r`).
    Db,
    /// A literal; with `param`, it may be sent as `?` in the binary protocol.
    Lit(Lit),
}

/// A literal: its SQL text, and the binary parameter with the same value, if any.
#[derive(Clone, Debug)]
pub struct Lit {
    pub text: Vec<u8>,
    pub param: Option<RawParam>,
}

impl Lit {
    pub fn plain(text: impl Into<Vec<u8>>) -> Lit {
        Lit {
            text: text.into(),
            param: None,
        }
    }
}

/// The protocol of a scripted statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// COM_QUERY.
    Text,
    /// COM_STMT_PREPARE + COM_STMT_EXECUTE.
    Binary,
}

/// How the rows of a result are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The statement defines the order: rows compared in order.
    Exact,
    /// No defined order: rows compared as sorted lists.
    Unordered,
}

/// A generated statement.
#[derive(Clone, Debug)]
pub struct Stmt {
    pub pieces: Vec<Piece>,
    /// May change the logical state (the state is compared afterwards).
    pub write: bool,
    pub order: Order,
    /// Tags of the [`KNOWN_OPEN`] / [`FOUND`] / [`DOCUMENTED`] shapes it contains.
    pub tags: Vec<&'static str>,
    /// Send it as COM_QUERY only.
    pub text_only: bool,
    /// A write that may fail on several rows, visited in the order the server's plan
    /// picks: when both sides fail, which row fails first, and so the error, may
    /// differ between two tables of the same rows whose statistics differ. Then any
    /// two errors match (the state check afterwards still compares the rows).
    pub first_error_by_plan: bool,
    /// Column flag bits not compared: bits MariaDB sets from the plan it picks
    /// (a temporary table for `GROUP BY`), for reads a rule answers with another plan
    /// by design.
    pub flags_mask: u16,
    /// Column flag bits not compared when a literal is sent as a parameter (bound
    /// to a prepared statement): for reads a rule forwards unchanged then, whose
    /// flags are each side's own server plan of its own table.
    pub param_flags_mask: u16,
}

impl Stmt {
    pub fn new() -> Stmt {
        Stmt {
            pieces: Vec::new(),
            write: false,
            order: Order::Unordered,
            tags: Vec::new(),
            text_only: false,
            first_error_by_plan: false,
            flags_mask: 0,
            param_flags_mask: 0,
        }
    }

    /// Appends SQL text.
    pub fn sql(&mut self, s: impl AsRef<[u8]>) -> &mut Stmt {
        if let Some(Piece::Sql(last)) = self.pieces.last_mut() {
            last.extend_from_slice(s.as_ref());
        } else {
            self.pieces.push(Piece::Sql(s.as_ref().to_vec()));
        }
        self
    }

    /// Appends the side's database name.
    pub fn db(&mut self) -> &mut Stmt {
        self.pieces.push(Piece::Db);
        self
    }

    pub fn lit(&mut self, l: Lit) -> &mut Stmt {
        self.pieces.push(Piece::Lit(l));
        self
    }

    /// The statement for one side: its bytes and the parameters of the literals sent
    /// as `?` (`as_param[i]` for the i-th literal that has a parameter form).
    pub fn render(&self, db: &str, as_param: &[bool]) -> (Vec<u8>, Vec<RawParam>) {
        let mut out = Vec::new();
        let mut params = Vec::new();
        let mut i = 0;
        for p in &self.pieces {
            match p {
                Piece::Sql(s) => out.extend_from_slice(s),
                Piece::Db => out.extend_from_slice(db.as_bytes()),
                Piece::Lit(l) => match &l.param {
                    Some(param) => {
                        if as_param.get(i).copied().unwrap_or(false) {
                            out.push(b'?');
                            params.push(param.clone());
                        } else {
                            out.extend_from_slice(&l.text);
                        }
                        i += 1;
                    }
                    None => out.extend_from_slice(&l.text),
                },
            }
        }
        (out, params)
    }

    /// A fixed statement: `{db}` stands for the side's database. Compared after it:
    /// the state; its rows in order when it has an ORDER BY.
    pub fn from_template(sql: &str) -> Stmt {
        let mut s = Stmt::new();
        for (i, part) in sql.split("{db}").enumerate() {
            if i > 0 {
                s.db();
            }
            s.sql(part);
        }
        s.write = true;
        if sql.to_ascii_uppercase().contains("ORDER BY") {
            s.order = Order::Exact;
        }
        s
    }

    fn param_slots(&self) -> usize {
        self.pieces
            .iter()
            .filter(|p| matches!(p, Piece::Lit(Lit { param: Some(_), .. })))
            .count()
    }
}

impl Default for Stmt {
    fn default() -> Self {
        Stmt::new()
    }
}

// ---------------------------------------------------------------------------------------
// The generator's toolbox

/// Randomness, the session mode, and the switched-on tags, with helpers for the
/// lexical variety every kind wants (case, whitespace, comments, quoting, literals).
pub struct Gen {
    pub rng: Prng,
    pub session: Session,
    enabled: BTreeSet<String>,
    /// Tags used by the statement being generated.
    used: Vec<&'static str>,
}

impl Gen {
    pub fn new(seed: u64, enabled: BTreeSet<String>) -> Gen {
        Gen {
            rng: Prng::new(seed),
            session: Session {
                charset: Charset::Utf8mb4,
                sql_mode: SQL_MODES[0].to_string(),
            },
            enabled,
            used: Vec::new(),
        }
    }

    pub fn chance(&mut self, percent: u32) -> bool {
        self.rng.chance(percent)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.rng.below(n)
    }

    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.range(lo, hi)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        self.rng.pick(items)
    }

    /// True when `tag` is switched on; the caller then generates the tagged shape
    /// and the tag is recorded on the statement.
    pub fn open(&mut self, tag: &'static str) -> bool {
        let listed = [KNOWN_OPEN, FOUND, DOCUMENTED]
            .iter()
            .any(|list| list.contains(&tag));
        if !listed || self.enabled.contains(tag) {
            self.used.push(tag);
            true
        } else {
            false
        }
    }

    /// [`Gen::open`] with a probability first (the tag is recorded only when used).
    pub fn maybe(&mut self, percent: u32, tag: &'static str) -> bool {
        self.chance(percent) && self.open(tag)
    }

    /// Whether `tag` was recorded since the last [`Gen::take_tags`].
    pub fn used(&self, tag: &str) -> bool {
        self.used.contains(&tag)
    }

    /// Takes the tags recorded since the last call.
    pub fn take_tags(&mut self) -> Vec<&'static str> {
        std::mem::take(&mut self.used)
    }

    /// A keyword in random case.
    pub fn kw(&mut self, k: &str) -> String {
        match self.below(6) {
            0 => k.to_lowercase(),
            1 => k
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        c.to_ascii_lowercase()
                    } else {
                        c.to_ascii_uppercase()
                    }
                })
                .collect(),
            _ => k.to_uppercase(),
        }
    }

    /// Whitespace between tokens: mostly one space, sometimes odd whitespace or a
    /// comment.
    pub fn ws(&mut self) -> String {
        match self.below(40) {
            0 => "  ".into(),
            1 => "\t".into(),
            2 => "\n".into(),
            3 => " \r\n ".into(),
            4 => " /* c */ ".into(),
            5 => "/**/".into(),
            6 => " -- c\n".into(),
            7 => " #c\n".into(),
            8 => " /*!*/ ".into(),
            _ => " ".into(),
        }
    }

    /// An identifier: bare, backquoted, or double-quoted under ANSI_QUOTES.
    pub fn ident(&mut self, name: &str) -> String {
        match self.below(8) {
            0 | 1 => format!("`{name}`"),
            2 if self.session.ansi_quotes() => format!("\"{name}\""),
            _ => name.to_string(),
        }
    }

    /// A column reference, sometimes qualified by `qualifier` (table or alias).
    pub fn column(&mut self, qualifier: &str, name: &str) -> String {
        if self.chance(12) {
            let q = self.ident(qualifier);
            let n = self.ident(name);
            format!("{q}.{n}")
        } else {
            self.ident(name)
        }
    }

    /// The table `name`, sometimes qualified by the side's database.
    pub fn table(&mut self, s: &mut Stmt, name: &str) {
        if self.chance(15) {
            let bq = self.chance(50);
            if bq {
                s.sql("`").db().sql("`.");
            } else {
                s.db().sql(".");
            }
        }
        let t = if self.chance(3) && self.open("doc_table_case") {
            name.to_uppercase()
        } else {
            name.to_string()
        };
        let t = self.ident(&t);
        s.sql(t);
    }

    /// A string literal with exactly the bytes `value` (in the session's character
    /// set), in one of the forms the session reads that way.
    pub fn string_lit(&mut self, value: &[u8]) -> Lit {
        let param = Some(RawParam::Bytes(value.to_vec()));
        let nbe = self.session.no_backslash_escapes();
        let has_quote = value.contains(&b'\'');
        let session = self.session.clone();
        let plain_quoted = |v: &[u8], q: u8| quote(v, q, &session);
        let text = match self.below(12) {
            // Doubled quotes (valid in every mode).
            0..=4 => plain_quoted(value, b'\''),
            // Backslash escapes of quotes (not under NO_BACKSLASH_ESCAPES).
            5 if !nbe && has_quote && !value.contains(&b'\\') => {
                let mut out = vec![b'\''];
                for &b in value {
                    if b == b'\'' {
                        out.push(b'\\');
                    }
                    out.push(b);
                }
                out.push(b'\'');
                out
            }
            // Double quotes (a string only without ANSI_QUOTES).
            6 if !self.session.ansi_quotes() => plain_quoted(value, b'"'),
            // Hexadecimal: the bytes themselves, read in the column's character set
            // (utf8mb4 in the kinds here), not the session's.
            7 if std::str::from_utf8(value).is_ok() || self.open("invalid_bytes") => {
                let mut out = b"X'".to_vec();
                for b in value {
                    out.extend_from_slice(format!("{b:02X}").as_bytes());
                }
                out.push(b'\'');
                out
            }
            // Adjacent strings.
            8 if value.len() >= 2 && value.is_ascii() => {
                let mid = value.len() / 2;
                let mut out = plain_quoted(&value[..mid], b'\'');
                out.push(b' ');
                out.extend_from_slice(&plain_quoted(&value[mid..], b'\''));
                out
            }
            // National string (utf8 on MariaDB): only for ASCII.
            9 if value.is_ascii() => {
                let mut out = b"N".to_vec();
                out.extend_from_slice(&plain_quoted(value, b'\''));
                out
            }
            // Introducer of the session's own character set.
            10 => {
                let mut out = format!("_{}", self.session.charset.name()).into_bytes();
                out.extend_from_slice(&plain_quoted(value, b'\''));
                out
            }
            // Escaped ordinary characters (`\h` reads as `h`).
            11 if !nbe && value.is_ascii() && !value.is_empty() && !value.contains(&b'\\') => {
                let mut out = vec![b'\''];
                for &b in value {
                    if b == b'\'' {
                        out.push(b'\'');
                    } else if b.is_ascii_alphabetic() && !b"bnrtZ".contains(&b) {
                        out.push(b'\\');
                    }
                    out.push(b);
                }
                out.push(b'\'');
                out
            }
            _ => plain_quoted(value, b'\''),
        };
        Lit { text, param }
    }

    /// An integer literal with value `v`, in a form that reads as that number in a
    /// numeric context.
    pub fn int_lit(&mut self, v: i64) -> Lit {
        let param = Some(match self.below(10) {
            0 | 1 => RawParam::Bytes(v.to_string().into_bytes()),
            2 => RawParam::Double(v as f64),
            3 if v >= 0 && self.open("found_unsigned_param") => RawParam::UInt(v as u64),
            _ => RawParam::Int(v),
        });
        let text = match self.below(14) {
            0 if v >= 0 => format!("+{v}"),
            1 => format!("'{v}'"),
            2 => format!("{v}.0"),
            3 => format!("{v}e0"),
            4 if v >= 0 && self.open("found_hex_literal") => format!("0x{v:X}"),
            5 if v == 1 => "TRUE".into(),
            6 if v > 0 => format!("({v})"),
            7 if v < 0 => format!("- {}", -v),
            8 if v > 0 && self.open("found_hex_literal") => format!("b'{v:b}'"),
            9 if v > 0 => format!("{v} /* n */"),
            _ => v.to_string(),
        };
        Lit {
            text: text.into_bytes(),
            param,
        }
    }
}

/// `value` between `q` quotes as the session reads it back: the quote doubled, a
/// backslash doubled unless NO_BACKSLASH_ESCAPES, multi-byte characters of gbk and
/// sjis copied whole (their second byte may be 0x5C, which is not an escape there).
pub fn quote(value: &[u8], q: u8, session: &Session) -> Vec<u8> {
    let nbe = session.no_backslash_escapes();
    let lead = |b: u8| match session.charset {
        Charset::Gbk => (0x81..=0xFE).contains(&b),
        Charset::Sjis => (0x81..=0x9F).contains(&b) || (0xE0..=0xFC).contains(&b),
        _ => false,
    };
    let mut out = vec![q];
    let mut i = 0;
    while i < value.len() {
        let b = value[i];
        if lead(b) && i + 1 < value.len() {
            out.extend_from_slice(&value[i..i + 2]);
            i += 2;
            continue;
        }
        if b == q {
            out.push(q);
        } else if b == b'\\' && !nbe {
            out.push(b'\\');
        }
        out.push(b);
        i += 1;
    }
    out.push(q);
    out
}

// ---------------------------------------------------------------------------------------
// Rule kinds

/// A rule kind under test. Only the statement generator is kind-specific logic; the
/// rest is data.
pub trait Kind {
    /// Short name, used in database names (`fz_<name><n>_p`, `fz_<name><n>_r`).
    fn name(&self) -> &'static str;
    /// Statements creating the logical tables (and tables to join with) with their
    /// first rows, run in both databases.
    fn schema(&self) -> String;
    /// The rule file (the table named without a database).
    fn rule_toml(&self) -> String;
    /// A query showing the whole logical state in a defined order.
    fn state_query(&self) -> String;
    /// Called after every write on the reference (directly on `ref_db`, as root), for
    /// rules whose logical meaning differs from a plain table on purpose (a ring
    /// keeps only the latest rows of each key).
    fn settle_reference(&self, _ref_db: &str) {}
    /// Queries of the rule's physical tables, shown (run directly on the proxied
    /// database) when the logical state differs; `{db}` is replaced.
    fn physical_queries(&self) -> Vec<String> {
        Vec::new()
    }
    /// The next statement.
    fn statement(&self, g: &mut Gen) -> Stmt;

    // Concurrent sessions ([`run_sessions_bounded`]). A kind that takes part gives
    // writes whose effects do not depend on the order of the sessions.

    /// The `k`-th write of session `session`, or `None`: the kind has no session
    /// writes. The statement is in `g.session`'s character set and sql_mode.
    fn session_write(&self, _g: &mut Gen, _session: usize, _k: usize) -> Option<Stmt> {
        None
    }
    /// Statements run in both databases (before `heatsink migrate --apply`) for the
    /// session runs only: foreign keys and triggers that read user variables, so that
    /// a leaked `foreign_key_checks` or user variable shows.
    fn session_schema(&self) -> String {
        String::new()
    }
    /// Whether the session runs merge writes (group commit): `false` when the
    /// session schema's triggers read the connection, so that every write runs alone
    /// (`rewrite::bound`).
    fn session_merges(&self) -> bool {
        true
    }
    /// The logical state after a session run, in a defined order, without what the
    /// order of concurrent sessions decides (AUTO_INCREMENT ids), `NOW()` values as
    /// their offset from UTC in hours.
    fn session_state_query(&self) -> String {
        self.state_query()
    }
    /// A `CREATE TEMPORARY TABLE` that shadows the ruled table by name, when a
    /// statement on the shadow means the same through heatsink as directly.
    fn shadow_table(&self) -> Option<String> {
        None
    }
}

// ---------------------------------------------------------------------------------------
// Configuration

/// What one run does.
#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    pub statements: usize,
    /// Switched-on tags.
    pub enabled: BTreeSet<String>,
    /// Print every statement and answer.
    pub verbose: bool,
}

impl Config {
    /// From the environment:
    /// - `HEATSINK_FUZZ_SEED` (default `seed`), `HEATSINK_FUZZ_STATEMENTS` (default
    ///   `statements`);
    /// - `HEATSINK_FUZZ_ALL=1` switches on every [`KNOWN_OPEN`] tag,
    ///   `HEATSINK_FUZZ_FOUND=1` every [`FOUND`] one, `HEATSINK_FUZZ_DOCUMENTED=1` every
    ///   [`DOCUMENTED`] one, `HEATSINK_FUZZ_TAGS`
    ///   (comma-separated) single tags;
    /// - `HEATSINK_FUZZ_VERBOSE=1` prints every statement.
    pub fn from_env(seed: u64, statements: usize) -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let on = |k: &str| var(k).is_some_and(|v| v != "0");
        let mut enabled = BTreeSet::new();
        if on("HEATSINK_FUZZ_ALL") {
            enabled.extend(KNOWN_OPEN.iter().map(|t| t.to_string()));
        }
        if on("HEATSINK_FUZZ_FOUND") {
            enabled.extend(FOUND.iter().map(|t| t.to_string()));
        }
        if on("HEATSINK_FUZZ_DOCUMENTED") {
            enabled.extend(DOCUMENTED.iter().map(|t| t.to_string()));
        }
        if let Some(tags) = var("HEATSINK_FUZZ_TAGS") {
            for t in tags.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                assert!(
                    KNOWN_OPEN.contains(&t) || FOUND.contains(&t) || DOCUMENTED.contains(&t),
                    "HEATSINK_FUZZ_TAGS: unknown tag {t:?}; known: {KNOWN_OPEN:?} {FOUND:?} {DOCUMENTED:?}"
                );
                enabled.insert(t.to_string());
            }
        }
        Config {
            seed: var("HEATSINK_FUZZ_SEED")
                .map(|s| parse_seed(&s))
                .unwrap_or(seed),
            statements: var("HEATSINK_FUZZ_STATEMENTS")
                .map(|s| s.parse().expect("HEATSINK_FUZZ_STATEMENTS: a number"))
                .unwrap_or(statements),
            enabled,
            verbose: on("HEATSINK_FUZZ_VERBOSE"),
        }
    }
}

fn parse_seed(s: &str) -> u64 {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("HEATSINK_FUZZ_SEED {s:?}: {e}"))
}

// ---------------------------------------------------------------------------------------
// Answers

/// One packet of an answer, reduced to what a client can observe.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Item {
    Ok {
        affected: u64,
        last_insert_id: u64,
        status: u16,
        warnings: u16,
        info: String,
    },
    Err {
        code: u16,
        sqlstate: String,
        message: String,
    },
    Eof {
        warnings: u16,
        status: u16,
    },
    PrepareOk {
        columns: u16,
        params: u16,
        warnings: u16,
    },
    ColumnCount(u64),
    Column {
        name: String,
        org_name: String,
        table: String,
        org_table: String,
        column_type: u8,
        flags: u16,
        decimals: u8,
        charset: u16,
        length: u32,
    },
    Row(Vec<u8>),
    /// A packet that could not be decoded where it stood.
    Raw(Vec<u8>),
    /// The connection failed (timeout, closed).
    Io(String),
}

/// Status bits a client can act on (the index-usage bits depend on the plan).
const STATUS_MASK: u16 = status::IN_TRANS
    | status::AUTOCOMMIT
    | status::NO_BACKSLASH_ESCAPES
    | status::MORE_RESULTS_EXISTS
    | status::IN_TRANS_READONLY;

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok_item(p: &[u8]) -> Option<Item> {
    parse_ok(p).map(|o| Item::Ok {
        affected: o.affected_rows,
        last_insert_id: o.last_insert_id,
        status: o.status & STATUS_MASK,
        warnings: o.warnings,
        info: o.info,
    })
}

fn column_item(p: &[u8]) -> Item {
    match parse_column_def(p) {
        Some(c) => Item::Column {
            name: lossy(&c.name),
            org_name: lossy(&c.org_name),
            table: lossy(&c.table),
            org_table: lossy(&c.org_table),
            column_type: c.column_type,
            flags: c.flags,
            decimals: c.decimals,
            charset: c.charset,
            length: c.length,
        },
        None => Item::Raw(p.to_vec()),
    }
}

/// Reduces the response to COM_QUERY / COM_STMT_EXECUTE (`deprecate_eof` negotiated).
pub fn items_of_results(packets: &[super::packets::Packet], deprecate_eof: bool) -> Vec<Item> {
    let mut out = Vec::new();
    let mut it = packets.iter().map(|p| p.payload.as_slice()).peekable();
    while let Some(p) = it.next() {
        match p.first() {
            Some(0x00) => out.push(ok_item(p).unwrap_or_else(|| Item::Raw(p.to_vec()))),
            Some(0xFF) => out.push(err_item(p)),
            _ => {
                let mut pos = 0;
                let Some(n) = read_lenenc(p, &mut pos) else {
                    out.push(Item::Raw(p.to_vec()));
                    continue;
                };
                out.push(Item::ColumnCount(n));
                for _ in 0..n {
                    match it.next() {
                        Some(c) => out.push(column_item(c)),
                        None => return out,
                    }
                }
                if !deprecate_eof {
                    if let Some(e) = it.next() {
                        out.push(eof_item(e));
                    }
                }
                for r in it.by_ref() {
                    if r.first() == Some(&0xFF) {
                        out.push(err_item(r));
                        break;
                    }
                    if r.first() == Some(&0xFE) && r.len() < 0xFF_FFFF {
                        out.push(if r.len() < 9 {
                            eof_item(r)
                        } else {
                            ok_item(r).unwrap_or_else(|| Item::Raw(r.to_vec()))
                        });
                        break;
                    }
                    out.push(Item::Row(r.to_vec()));
                }
            }
        }
    }
    out
}

/// Reduces a COM_STMT_PREPARE response.
pub fn items_of_prepare(packets: &[super::packets::Packet], deprecate_eof: bool) -> Vec<Item> {
    let mut out = Vec::new();
    let Some(first) = packets.first().map(|p| p.payload.as_slice()) else {
        return out;
    };
    if first.first() == Some(&0xFF) {
        out.push(err_item(first));
        return out;
    }
    if first.len() < 12 {
        out.push(Item::Raw(first.to_vec()));
        return out;
    }
    out.push(Item::PrepareOk {
        columns: u16::from_le_bytes([first[5], first[6]]),
        params: u16::from_le_bytes([first[7], first[8]]),
        warnings: u16::from_le_bytes([first[10], first[11]]),
    });
    for p in &packets[1..] {
        let p = p.payload.as_slice();
        if p.first() == Some(&0xFE) && p.len() < 9 && !deprecate_eof {
            out.push(eof_item(p));
        } else {
            out.push(column_item(p));
        }
    }
    out
}

fn err_item(p: &[u8]) -> Item {
    match parse_err(p) {
        Some(e) => Item::Err {
            code: e.code,
            sqlstate: e.sqlstate,
            message: e.message,
        },
        None => Item::Raw(p.to_vec()),
    }
}

fn eof_item(p: &[u8]) -> Item {
    match super::packets::parse_eof(p) {
        Some(e) => Item::Eof {
            warnings: e.warnings,
            status: e.status & STATUS_MASK,
        },
        None => Item::Raw(p.to_vec()),
    }
}

/// Replaces both databases' names in error messages with `{db}`.
fn normalize(items: &mut [Item], dbs: &[&str]) {
    for it in items {
        if let Item::Err { message, .. } = it {
            for db in dbs {
                *message = message.replace(db, "{db}");
            }
        }
    }
}

/// Sorts each result set's rows.
fn sort_rows(items: &mut [Item]) {
    let mut start = None;
    for i in 0..=items.len() {
        let is_row = matches!(items.get(i), Some(Item::Row(_)));
        match (is_row, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                items[s..i].sort();
                start = None;
            }
            _ => {}
        }
    }
}

/// The heatsink refusal, if `items` is one.
fn refusal(items: &[Item]) -> Option<&str> {
    match items {
        [Item::Err {
            code: 1105,
            message,
            ..
        }] if message.starts_with("heatsink rule '") => Some(message),
        _ => None,
    }
}

fn is_err(items: &[Item]) -> bool {
    matches!(items.first(), Some(Item::Err { .. }))
}

/// Printable bytes: ASCII as is, everything else as `\xNN`.
pub fn show_bytes(b: &[u8]) -> String {
    let mut s = String::new();
    for &c in b {
        match c {
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(c as char),
            _ => {
                let _ = write!(s, "\\x{c:02x}");
            }
        }
    }
    s
}

fn show_items(items: &[Item]) -> String {
    let mut s = String::new();
    for it in items {
        match it {
            Item::Row(r) => {
                let _ = writeln!(s, "      Row {}", show_bytes(r));
            }
            other => {
                let _ = writeln!(s, "      {other:?}");
            }
        }
    }
    s
}

// ---------------------------------------------------------------------------------------
// The harness

/// A difference found by a run.
#[derive(Clone, Debug)]
pub struct Mismatch {
    pub kind: &'static str,
    pub seed: u64,
    /// 0-based index of the statement in the run.
    pub index: usize,
    pub text: String,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub statements: usize,
    pub binary: usize,
    pub refused: usize,
    pub errors: usize,
    pub state_checks: usize,
    pub mismatches: Vec<Mismatch>,
    pub tags_used: BTreeSet<&'static str>,
    /// Refusal messages (literal values cut off) and how often each came.
    pub refusals: std::collections::BTreeMap<String, usize>,
    pub elapsed_ms: u128,
}

impl Report {
    /// A one-line summary.
    pub fn summary(&self) -> String {
        format!(
            "{} statements ({} binary), {} refused by heatsink, {} errors on both sides, {} state checks, {} mismatches, {} ms; tags used: {:?}",
            self.statements,
            self.binary,
            self.refused,
            self.errors,
            self.state_checks,
            self.mismatches.len(),
            self.elapsed_ms,
            self.tags_used
        )
    }

    /// The refusals, most frequent first.
    pub fn refusal_summary(&self) -> String {
        let mut v: Vec<(&String, &usize)> = self.refusals.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|(m, n)| format!("  {n:5}  {m}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Adds another run's counts.
    pub fn absorb(&mut self, other: Report) {
        self.statements += other.statements;
        self.binary += other.binary;
        self.refused += other.refused;
        self.errors += other.errors;
        self.state_checks += other.state_checks;
        self.mismatches.extend(other.mismatches);
        self.tags_used.extend(other.tags_used);
        for (m, n) in other.refusals {
            *self.refusals.entry(m).or_default() += n;
        }
        self.elapsed_ms += other.elapsed_ms;
    }

    /// Every mismatch in full.
    pub fn details(&self) -> String {
        self.mismatches
            .iter()
            .map(|m| {
                format!(
                    "--- {} seed {} statement #{} ---\n{}",
                    m.kind, m.seed, m.index, m.text
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Where a differential run's databases live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The test binary's MariaDB ([`mariadb()`]).
    Single,
    /// The 3-node Galera cluster ([`super::galera::galera()`]): the proxy gets every
    /// node (each of its connections lands on the node with the fewest), the
    /// reference is read and written on node 1.
    Galera,
}

/// One rule kind's databases and proxy.
pub struct Differential<'k> {
    kind: &'k dyn Kind,
    /// Where the databases live.
    target: Target,
    /// The database behind the proxy (ruled table).
    pub proxied_db: String,
    /// The reference database (plain table).
    pub reference_db: String,
    pub proxy: Proxy,
    /// The proxy's `--metrics` address.
    metrics: Option<std::net::SocketAddr>,
    _rules: tempfile::TempDir,
}

impl<'k> Differential<'k> {
    /// Creates both databases, switches the rule on in the proxied one with
    /// `heatsink migrate --apply`, and starts a proxy with the rule.
    pub fn start(kind: &'k dyn Kind) -> Differential<'k> {
        Self::start_on(kind, Target::Single)
    }

    /// [`Differential::start`] with the databases on `target`.
    pub fn start_on(kind: &'k dyn Kind, target: Target) -> Differential<'k> {
        // Tests of one binary run in parallel: each harness has its own databases.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let proxied_db = format!("fz_{}{n}_p", kind.name());
        let reference_db = format!("fz_{}{n}_r", kind.name());
        let rules = super::client::rules_dir(&format!("{}.toml", kind.name()), &kind.rule_toml());
        let builder = Proxy::builder().rules_dir(rules.path());
        let (builder, metrics) = builder.listen_arg("--metrics");
        let builder = match target {
            Target::Single => builder,
            Target::Galera => builder.backend(super::galera::galera().backend_list()),
        };
        let d = Differential {
            kind,
            target,
            proxied_db,
            reference_db,
            proxy: builder.start(),
            metrics: Some(metrics),
            _rules: rules,
        };
        d.reset();
        d
    }

    /// Recreates both databases from the schema (and the rule's tables).
    pub fn reset(&self) {
        self.reset_with("");
    }

    /// [`Differential::reset`] with `extra` statements after the schema (before
    /// migrate).
    fn reset_with(&self, extra: &str) {
        let schema = if extra.trim().is_empty() {
            self.kind.schema()
        } else {
            let schema = self.kind.schema();
            format!("{}; {extra}", schema.trim_end().trim_end_matches(';'))
        };
        if self.target == Target::Galera {
            let node = super::galera::galera().node(0);
            for db in [&self.proxied_db, &self.reference_db] {
                node.exec(&format!(
                    "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db} DEFAULT CHARACTER SET utf8mb4; \
                     USE {db}; {schema}"
                ));
            }
            let (code, out, err) = super::cli::Cli::new(["migrate", "--apply", "--rules"])
                .arg(self._rules.path())
                .arg("--backend-url")
                .arg(node.url(&self.proxied_db))
                .run();
            assert_eq!(code, 0, "migrate failed:\n{out}\n{err}");
            self.kind.settle_reference(&self.reference_db);
            return;
        }
        for db in [&self.proxied_db, &self.reference_db] {
            fresh_db_with(db, "DEFAULT CHARACTER SET utf8mb4", &schema);
        }
        migrate_ok(self._rules.path(), &self.proxied_db, true);
        self.kind.settle_reference(&self.reference_db);
    }

    fn connect(&self, proxied: bool) -> RawClient {
        let (addr, db) = if proxied {
            (self.proxy.addr(), &self.proxied_db)
        } else {
            match self.target {
                Target::Single => (mariadb().addr(), &self.reference_db),
                Target::Galera => (super::galera::galera().node(0).addr(), &self.reference_db),
            }
        };
        let opts = ConnectOpts::new(USER, PASSWORD)
            .db(db)
            .timeout(std::time::Duration::from_secs(15));
        RawClient::connect(addr, &opts).unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
    }

    /// The server's plans of a differing data statement on both databases, read
    /// directly (not through the proxy): whether the two tables, of the same rows but
    /// different histories, are read with different plans, which decide the first
    /// row an error names and the column flags a temporary table drops.
    fn plans(&self, psql: &[u8], rsql: &[u8]) -> String {
        let head: String = String::from_utf8_lossy(psql)
            .trim_start()
            .chars()
            .take(6)
            .collect::<String>()
            .to_ascii_uppercase();
        if !["SELECT", "UPDATE", "DELETE"].contains(&head.as_str()) {
            return String::new();
        }
        let mut proxied_direct = self.connect(false);
        let _ = proxied_direct.query(format!("USE `{}`", self.proxied_db).as_bytes());
        let mut reference = self.connect(false);
        let explain = |c: &mut RawClient, sql: &[u8]| {
            let mut q = b"EXPLAIN ".to_vec();
            q.extend_from_slice(sql);
            show_items(&query_items(c, &q))
        };
        format!(
            "  plans, read directly:\n    ruled table's database:\n{}    reference:\n{}",
            explain(&mut proxied_direct, psql),
            explain(&mut reference, rsql)
        )
    }

    /// Runs `cfg.statements` statements from `cfg.seed` on fresh databases.
    pub fn run(&self, cfg: &Config) -> Report {
        self.run_inner(cfg, None)
    }

    /// Runs fixed statements (`{db}` = the side's database) on fresh databases, each
    /// in the given protocol, with the same comparisons and a state check after each:
    /// for minimal reproductions of what a run found.
    pub fn run_script(&self, script: &[(&str, Protocol)]) -> Report {
        let steps: Vec<(&str, Protocol, Vec<RawParam>)> =
            script.iter().map(|(s, p)| (*s, *p, Vec::new())).collect();
        self.run_script_with_params(&steps)
    }

    /// [`Differential::run_script`] with the parameters of binary statements.
    pub fn run_script_with_params(&self, script: &[(&str, Protocol, Vec<RawParam>)]) -> Report {
        let cfg = Config {
            seed: 0,
            statements: script.len(),
            enabled: BTreeSet::new(),
            verbose: std::env::var("HEATSINK_FUZZ_VERBOSE").is_ok_and(|v| v == "1"),
        };
        self.run_inner(&cfg, Some(script))
    }

    fn run_inner(
        &self,
        cfg: &Config,
        script: Option<&[(&str, Protocol, Vec<RawParam>)]>,
    ) -> Report {
        self.reset();
        let started = Instant::now();
        let mut report = Report::default();
        let mut g = Gen::new(cfg.seed, cfg.enabled.clone());
        // The protocol and parameter choices have their own stream, so that the
        // statements of a seed do not depend on them.
        let mut wire = Prng::new(cfg.seed ^ 0x5EED_F00D);
        let mut p = self.connect(true);
        let mut r = self.connect(false);
        let mut po = self.connect(true);
        if self.target == Target::Galera {
            // The observer may be on another node than the writer: it reads after
            // every write the cluster committed.
            let _ = po.query("SET SESSION wsrep_sync_wait = 15");
        }
        let mut ro = self.connect(false);
        let dbs = [self.proxied_db.as_str(), self.reference_db.as_str()];
        let mut since_check = 0;
        let mut history: Vec<String> = Vec::new();

        for index in 0..cfg.statements {
            // Session modes change now and then, on both sides alike.
            if script.is_none() && g.chance(4) {
                let (sql, next) = session_change(&mut g);
                let pa = query_items(&mut p, sql.as_bytes());
                let ra = query_items(&mut r, sql.as_bytes());
                history.push(format!("#{index} (session) {sql}"));
                if pa != ra {
                    let what = format!("session statement answered differently: {sql}");
                    let msg = both_answers(&what, &pa, &ra);
                    self.mismatch(&mut report, cfg, index, &history, msg);
                }
                if !is_err(&pa) && !is_err(&ra) {
                    g.session = next;
                }
            }

            let step = script.and_then(|s| s.get(index));
            let (stmt, binary) = match step {
                Some((sql, protocol, _)) => {
                    (Stmt::from_template(sql), *protocol == Protocol::Binary)
                }
                None => {
                    let stmt = self.kind.statement(&mut g);
                    let binary = wire.chance(40) && !stmt.text_only;
                    (stmt, binary)
                }
            };
            let tags = g.take_tags();
            report.tags_used.extend(tags.iter().copied());
            // Literals become `?` only in the binary protocol.
            let as_param: Vec<bool> = (0..stmt.param_slots())
                .map(|_| wire.chance(50) && binary)
                .collect();
            let (psql, mut params) = stmt.render(&self.proxied_db, &as_param);
            if let Some((_, _, script_params)) = step {
                params.extend(script_params.iter().cloned());
            }
            let (rsql, _) = stmt.render(&self.reference_db, &as_param);
            let shown = format!(
                "[{}{}] {}{}{}",
                if binary { "binary" } else { "text" },
                session_label(&g.session),
                show_bytes(&stmt.render("{db}", &as_param).0),
                if params.is_empty() {
                    String::new()
                } else {
                    format!("  params {params:?}")
                },
                if tags.is_empty() {
                    String::new()
                } else {
                    format!("  tags {tags:?}")
                }
            );
            history.push(format!("#{index} {shown}"));
            if history.len() > 12 {
                history.remove(0);
            }
            report.statements += 1;
            if binary {
                report.binary += 1;
            }

            let mask = if params.is_empty() {
                stmt.flags_mask
            } else {
                stmt.flags_mask | stmt.param_flags_mask
            };
            let (mut pa, mut ra, refused) = if binary {
                self.exchange_binary(&mut p, &mut r, (&psql, &rsql), &params, mask)
            } else {
                let pa = query_items(&mut p, &psql);
                match refusal(&pa) {
                    Some(_) => (pa, Vec::new(), true),
                    None => {
                        let ra = query_items(&mut r, &rsql);
                        (pa, ra, false)
                    }
                }
            };
            normalize(&mut pa, &dbs);
            normalize(&mut ra, &dbs);
            mask_flags(&mut pa, mask);
            mask_flags(&mut ra, mask);
            if stmt.order == Order::Unordered {
                sort_rows(&mut pa);
                sort_rows(&mut ra);
            }
            if cfg.verbose {
                eprintln!("#{index} {shown}\n  heatsink:\n{}", show_items(&pa));
            }
            let io_failure = pa.iter().chain(ra.iter()).any(|i| matches!(i, Item::Io(_)));
            if refused {
                report.refused += 1;
                if let Some(Item::Err { message, .. }) = pa.first() {
                    let key: String = message.chars().take(90).collect();
                    *report.refusals.entry(key).or_default() += 1;
                }
            } else {
                if is_err(&pa) && is_err(&ra) {
                    report.errors += 1;
                }
                let plan_picked = stmt.first_error_by_plan && is_err(&pa) && is_err(&ra);
                if pa != ra && !plan_picked {
                    let mut msg = both_answers(&format!("statement: {shown}"), &pa, &ra);
                    if !binary {
                        msg.push_str(&self.plans(&psql, &rsql));
                    }
                    self.mismatch(&mut report, cfg, index, &history, msg);
                }
                if stmt.write && !is_err(&ra) {
                    self.kind.settle_reference(&self.reference_db);
                }
            }
            if io_failure {
                let log = super::client::tail(&self.proxy.log_text(), 20);
                let msg = format!("connection failed; heatsink log:\n{log}");
                self.mismatch(&mut report, cfg, index, &history, msg);
                break;
            }

            since_check += 1;
            if stmt.write || refused || since_check >= STATE_EVERY || index + 1 == cfg.statements {
                since_check = 0;
                report.state_checks += 1;
                let q = self.kind.state_query();
                let ps = query_items(&mut po, q.as_bytes());
                let rs = query_items(&mut ro, q.as_bytes());
                if ps != rs {
                    let mut physical = String::new();
                    for q in self.kind.physical_queries() {
                        let q = q.replace("{db}", &self.proxied_db);
                        let _ = writeln!(physical, "    {q}");
                        let rows = match self.target {
                            Target::Single => mariadb().query_strings(&q),
                            Target::Galera => super::galera::galera().node(0).query_strings(&q),
                        };
                        for row in rows {
                            let _ = writeln!(physical, "      {row:?}");
                        }
                    }
                    let msg = format!(
                        "logical state differs after: {shown}\n  heatsink answered:\n{}  state through heatsink:\n{}  reference state:\n{}  physical tables behind heatsink:\n{physical}",
                        show_items(&pa),
                        show_items(&ps),
                        show_items(&rs)
                    );
                    self.mismatch(&mut report, cfg, index, &history, msg);
                    // Later statements would only show the consequences.
                    break;
                }
            }
            if report.mismatches.len() >= MAX_MISMATCHES {
                break;
            }
        }
        report.elapsed_ms = started.elapsed().as_millis();
        report
    }

    /// Prepare, compare, execute, compare, close, on both sides.
    fn exchange_binary(
        &self,
        p: &mut RawClient,
        r: &mut RawClient,
        (psql, rsql): (&[u8], &[u8]),
        params: &[RawParam],
        flags_mask: u16,
    ) -> (Vec<Item>, Vec<Item>, bool) {
        let (pid, mut pprep) = prepare_items(p, psql);
        if refusal(&pprep).is_some() {
            return (pprep, Vec::new(), true);
        }
        let (rid, mut rprep) = prepare_items(r, rsql);
        mask_flags(&mut pprep, flags_mask);
        mask_flags(&mut rprep, flags_mask);
        if pprep != rprep || is_err(&pprep) {
            close(p, pid);
            close(r, rid);
            return (pprep, rprep, false);
        }
        let pexec = match p.execute(pid, params) {
            Ok(packets) => items_of_results(&packets, p.deprecate_eof()),
            Err(e) => vec![Item::Io(e.to_string())],
        };
        if refusal(&pexec).is_some() {
            close(p, pid);
            close(r, rid);
            return (pexec, Vec::new(), true);
        }
        let rexec = match r.execute(rid, params) {
            Ok(packets) => items_of_results(&packets, r.deprecate_eof()),
            Err(e) => vec![Item::Io(e.to_string())],
        };
        close(p, pid);
        close(r, rid);
        (pexec, rexec, false)
    }

    fn mismatch(
        &self,
        report: &mut Report,
        cfg: &Config,
        index: usize,
        history: &[String],
        what: String,
    ) {
        let text = format!(
            "{what}\n  replay: HEATSINK_FUZZ_SEED={} HEATSINK_FUZZ_STATEMENTS={} (tags {:?})\n  statements before it:\n    {}",
            cfg.seed,
            index + 1,
            cfg.enabled,
            history.join("\n    ")
        );
        report.mismatches.push(Mismatch {
            kind: self.kind.name(),
            seed: cfg.seed,
            index,
            text,
        });
    }
}

/// A difference report: `head`, then heatsink's answer and the reference's.
fn both_answers(head: &str, heatsink: &[Item], reference: &[Item]) -> String {
    format!(
        "{head}\n  heatsink:\n{}  reference:\n{}",
        show_items(heatsink),
        show_items(reference)
    )
}

/// Clears `mask` in every column definition's flags.
fn mask_flags(items: &mut [Item], mask: u16) {
    if mask == 0 {
        return;
    }
    for i in items {
        if let Item::Column { flags, .. } = i {
            *flags &= !mask;
        }
    }
}

fn query_items(c: &mut RawClient, sql: &[u8]) -> Vec<Item> {
    match c.query(sql) {
        Ok(packets) => items_of_results(&packets, c.deprecate_eof()),
        Err(e) => vec![Item::Io(e.to_string())],
    }
}

fn prepare_items(c: &mut RawClient, sql: &[u8]) -> (u32, Vec<Item>) {
    match c.prepare(sql) {
        Ok((id, packets)) => (id, items_of_prepare(&packets, c.deprecate_eof())),
        Err(e) => (0, vec![Item::Io(e.to_string())]),
    }
}

fn close(c: &mut RawClient, id: u32) {
    if id != 0 {
        let _ = c.close_stmt(id);
    }
}

fn session_label(s: &Session) -> String {
    format!(
        " {} sql_mode='{}'",
        s.charset.name(),
        if s.sql_mode == SQL_MODES[0] {
            "default"
        } else {
            &s.sql_mode
        }
    )
}

/// A statement changing the session's character set or sql_mode, and the session
/// after it.
fn session_change(g: &mut Gen) -> (String, Session) {
    let mut next = g.session.clone();
    let sql = if g.chance(50) {
        let cs = *g.pick(&Charset::ALL);
        next.charset = cs;
        let name = cs.name();
        match g.below(4) {
            0 => format!("SET CHARACTER SET {name}"),
            1 => format!("set names '{name}'"),
            2 => format!("SET character_set_client = {name}, character_set_connection = {name}, character_set_results = {name}"),
            _ => format!("SET NAMES {name}"),
        }
    } else {
        let mode = *g.pick(SQL_MODES);
        next.sql_mode = mode.to_string();
        match g.below(3) {
            0 => format!("SET SESSION sql_mode = '{mode}'"),
            1 => format!("SET @@sql_mode = '{mode}'"),
            _ => format!("SET sql_mode = '{mode}'"),
        }
    };
    (sql, next)
}

// ---------------------------------------------------------------------------------------
// Concurrent sessions with state prefixes

/// A bounded run of concurrent sessions of `kind` ([`Differential::run_sessions`]):
/// `rounds` rounds (seeds `seed + i * 1000`; `HEATSINK_FUZZ_SEED` and
/// `HEATSINK_FUZZ_ROUNDS` override) of `sessions` sessions with `writes` writes each
/// (`HEATSINK_FUZZ_WRITES` overrides), stopping at the first round with a difference;
/// panics with every difference found.
pub fn run_sessions_bounded(
    kind: &dyn Kind,
    seed: u64,
    sessions: usize,
    writes: usize,
    rounds: u64,
) {
    let base = Config::from_env(seed, writes);
    let writes = std::env::var("HEATSINK_FUZZ_WRITES")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(writes);
    let rounds = std::env::var("HEATSINK_FUZZ_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(rounds);
    let diff = Differential::start(kind);
    let mut total = Report::default();
    for round in 0..rounds {
        let mut cfg = base.clone();
        cfg.seed = base.seed.wrapping_add(round * 1000);
        let report = diff.run_sessions(&cfg, sessions, writes);
        eprintln!(
            "{} sessions seed {}: {}",
            kind.name(),
            cfg.seed,
            report.summary()
        );
        let failed = !report.mismatches.is_empty();
        total.absorb(report);
        if failed {
            break;
        }
    }
    let merged = super::sample(
        &super::http_get(diff.metrics_addr(), "/metrics").1,
        "heatsink_coalesced_writes_total",
    )
    .unwrap_or(0.0);
    eprintln!(
        "{} sessions total: {}; merged writes: {merged}",
        kind.name(),
        total.summary()
    );
    assert!(
        total.mismatches.is_empty(),
        "{}: {} differences from the same sessions sent directly\n{}\n--- heatsink log (tail) ---\n{}",
        kind.name(),
        total.mismatches.len(),
        total.details(),
        super::client::tail(&diff.proxy.log_text(), 20)
    );
    // One round alone (`HEATSINK_FUZZ_ROUNDS=1`, a quick sweep of seeds) may merge
    // nothing by timing: a rollup session round of about 200 statements merged 0 or 3
    // writes in two runs of one seed.
    assert!(
        !kind.session_merges() || rounds < 2 || merged > 0.0,
        "{}: no write was merged; group commit was not exercised",
        kind.name()
    );
}

/// One generated session: its state change (none for a pristine session) and its
/// writes.
#[derive(Clone, Debug)]
pub struct SessionScript {
    /// What the prefix changes (`pristine`, `time_zone`, `sql_mode`, …).
    pub class: &'static str,
    pub prefix: Vec<Vec<u8>>,
    pub writes: Vec<Stmt>,
    /// `auto_increment_increment` after the prefix: ids are compared modulo it.
    pub increment: u64,
}

/// The session state changes the generator draws from, by class, each in several
/// spellings: plain `SET`, `SET SESSION`, `SET @@session.`, a versioned comment,
/// `EXECUTE IMMEDIATE`, `SELECT … INTO`, `DO`, `:=` inside a `SELECT`.
pub const STATE_CLASSES: &[&str] = &[
    "time_zone",
    "sql_mode",
    "user_variable",
    "character_set",
    "foreign_key_checks",
    "auto_increment",
    "temporary_table",
];

/// A random state change of `class` for session `session`: its statements; updates
/// `g.session` (character set, sql_mode) and returns the session's
/// auto_increment_increment.
pub fn state_change(
    g: &mut Gen,
    class: &str,
    session: usize,
    shadow: Option<&str>,
) -> (Vec<String>, u64) {
    let mut increment = 1;
    let sql = match class {
        "time_zone" => {
            let tz = *g.pick(&["+10:00", "-03:30", "+05:45", "+01:00"]);
            match g.below(7) {
                0 => format!("SET time_zone = '{tz}'"),
                1 => format!("SET SESSION time_zone = '{tz}'"),
                2 => format!("SET @@session.time_zone = '{tz}'"),
                3 => format!("/*!40103 SET TIME_ZONE='{tz}' */"),
                4 => format!("EXECUTE IMMEDIATE 'SET time_zone = ''{tz}'''"),
                5 => format!("SET @@time_zone = '{tz}'"),
                _ => format!("SET @hs_tz = '{tz}', time_zone = @hs_tz"),
            }
        }
        "sql_mode" => {
            let mode = *g.pick(&[
                "",
                "NO_ENGINE_SUBSTITUTION",
                "ANSI_QUOTES",
                "STRICT_ALL_TABLES",
                "NO_BACKSLASH_ESCAPES",
            ]);
            g.session.sql_mode = mode.to_string();
            match g.below(6) {
                0 => format!("SET sql_mode = '{mode}'"),
                1 => format!("SET SESSION sql_mode = '{mode}'"),
                2 => format!("SET @@session.sql_mode = '{mode}'"),
                3 => format!("/*!40101 SET SQL_MODE='{mode}' */"),
                4 => format!("EXECUTE IMMEDIATE 'SET sql_mode = ''{mode}'''"),
                _ => format!("SET @old_mode = @@sql_mode, sql_mode = '{mode}'"),
            }
        }
        "user_variable" => {
            let v = format!("s{session}");
            match g.below(7) {
                0 => format!("SET @hs_tag = '{v}'"),
                1 => format!("SELECT @hs_tag := '{v}'"),
                2 => format!("DO @hs_tag := '{v}'"),
                3 => format!("SELECT '{v}' INTO @hs_tag"),
                4 => format!("EXECUTE IMMEDIATE 'SET @hs_tag = ''{v}'''"),
                5 => format!("/*!50000 SET @hs_tag = '{v}' */"),
                _ => format!("SELECT 1 AS one, @hs_tag := '{v}' AS tag FROM DUAL"),
            }
        }
        "character_set" => {
            g.session.charset = Charset::Latin1;
            match g.below(6) {
                0 => "SET NAMES latin1".to_string(),
                1 => "/*!40101 SET NAMES latin1 */".to_string(),
                2 => "SET SESSION character_set_client = latin1, character_set_connection = latin1"
                    .to_string(),
                3 => "SET @@session.character_set_client = latin1".to_string(),
                4 => "EXECUTE IMMEDIATE 'SET NAMES latin1'".to_string(),
                _ => "SET CHARACTER SET latin1".to_string(),
            }
        }
        "foreign_key_checks" => match g.below(5) {
            0 => "SET foreign_key_checks = 0".to_string(),
            1 => "SET SESSION FOREIGN_KEY_CHECKS = 0".to_string(),
            2 => "SET @@session.foreign_key_checks = OFF".to_string(),
            3 => "/*!40014 SET FOREIGN_KEY_CHECKS=0 */".to_string(),
            _ => "EXECUTE IMMEDIATE 'SET foreign_key_checks = 0'".to_string(),
        },
        "auto_increment" => {
            let inc = g.range(2, 9) as u64;
            let off = g.range(1, inc as i64) as u64;
            increment = inc;
            match g.below(5) {
                0 => format!("SET auto_increment_increment = {inc}, auto_increment_offset = {off}"),
                1 => format!(
                    "SET SESSION auto_increment_increment = {inc}, SESSION auto_increment_offset = {off}"
                ),
                2 => format!(
                    "SET @@session.auto_increment_increment = {inc}, @@session.auto_increment_offset = {off}"
                ),
                3 => format!(
                    "/*!40101 SET auto_increment_increment = {inc}, auto_increment_offset = {off} */"
                ),
                _ => format!(
                    "EXECUTE IMMEDIATE 'SET auto_increment_increment = {inc}, auto_increment_offset = {off}'"
                ),
            }
        }
        "temporary_table" => match (shadow, g.below(3)) {
            (Some(ddl), 0 | 1) => ddl.to_string(),
            (_, 0) => "CREATE TEMPORARY TABLE hs_scratch (a INT)".to_string(),
            (_, 1) => "/*!32311 CREATE TEMPORARY TABLE hs_scratch (a INT) */".to_string(),
            _ => "CREATE TEMPORARY TABLE IF NOT EXISTS hs_scratch AS SELECT 1 AS a".to_string(),
        },
        other => panic!("unknown state class {other}"),
    };
    (vec![sql], increment)
}

/// `text` in the session's character set (utf8mb4 or latin1; characters latin1 lacks
/// become `?`).
pub fn encode(g: &Gen, text: &str) -> Vec<u8> {
    match g.session.charset {
        Charset::Latin1 => text
            .chars()
            .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?'))
            .collect(),
        _ => text.as_bytes().to_vec(),
    }
}

/// One session's answers: the prefix's, then each write's.
type SessionAnswers = Vec<Vec<Item>>;

impl Differential<'_> {
    /// The proxy's `--metrics` address.
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        self.metrics
            .expect("differential proxy has a metrics endpoint")
    }

    /// The sessions of a seed: about half pristine, the others with one state change
    /// from the catalogue first; then `writes` writes each from
    /// [`Kind::session_write`]. Each session's statements come from its own generator
    /// (seeded by the run's seed and its index).
    pub fn session_scripts(
        &self,
        cfg: &Config,
        sessions: usize,
        writes: usize,
    ) -> Vec<SessionScript> {
        let shadow = self.kind.shadow_table();
        (0..sessions)
            .map(|i| {
                let mut g = Gen::new(
                    cfg.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    cfg.enabled.clone(),
                );
                let (class, prefix, increment) = if g.chance(50) {
                    ("pristine", Vec::new(), 1)
                } else {
                    let class = *g.pick(STATE_CLASSES);
                    let (sqls, inc) = state_change(&mut g, class, i, shadow.as_deref());
                    (
                        class,
                        sqls.into_iter().map(String::into_bytes).collect(),
                        inc,
                    )
                };
                let writes = (0..writes)
                    .map(|k| {
                        self.kind
                            .session_write(&mut g, i, k)
                            .unwrap_or_else(|| panic!("{} has no session writes", self.kind.name()))
                    })
                    .collect();
                SessionScript {
                    class,
                    prefix,
                    writes,
                    increment,
                }
            })
            .collect()
    }

    /// Runs the sessions of `cfg.seed` concurrently through heatsink and then the same
    /// sessions concurrently on the reference, on fresh databases with the kind's
    /// session schema; compares each session's answers (ids modulo the session's
    /// auto_increment_increment, since concurrent sessions take ids in another order
    /// each time) and then the logical state ([`Kind::session_state_query`]).
    pub fn run_sessions(&self, cfg: &Config, sessions: usize, writes: usize) -> Report {
        self.reset_with(&self.kind.session_schema());
        let started = Instant::now();
        let scripts = self.session_scripts(cfg, sessions, writes);
        let mut report = Report::default();
        let proxied = self.run_side(true, &scripts);
        let reference = self.run_side(false, &scripts);
        self.kind.settle_reference(&self.reference_db);
        let dbs = [self.proxied_db.as_str(), self.reference_db.as_str()];
        for (i, script) in scripts.iter().enumerate() {
            let mut p = proxied[i].clone();
            let mut r = reference[i].clone();
            let mut history = vec![format!("session {i} ({}):", script.class)];
            for sql in &script.prefix {
                history.push(format!("(state) {}", show_bytes(sql)));
            }
            for k in 0..p.len().max(r.len()) {
                report.statements += 1;
                let pa = p.get_mut(k).map(std::mem::take).unwrap_or_default();
                let ra = r.get_mut(k).map(std::mem::take).unwrap_or_default();
                let (mut pa, mut ra) = (pa, ra);
                normalize(&mut pa, &dbs);
                normalize(&mut ra, &dbs);
                sort_rows(&mut pa);
                sort_rows(&mut ra);
                let sql = if k < script.prefix.len() {
                    show_bytes(&script.prefix[k])
                } else {
                    let stmt = &script.writes[k - script.prefix.len()];
                    show_bytes(&stmt.render("{db}", &[]).0)
                };
                if is_err(&pa) && is_err(&ra) {
                    report.errors += 1;
                }
                if pa != ra {
                    let msg = both_answers(&format!("session {i} statement: {sql}"), &pa, &ra);
                    self.mismatch(&mut report, cfg, k, &history, msg);
                }
                history.push(sql);
            }
        }
        let q = self.kind.session_state_query();
        let mut po = self.connect(true);
        let mut ro = self.connect(false);
        let mut ps = query_items(&mut po, q.as_bytes());
        let mut rs = query_items(&mut ro, q.as_bytes());
        sort_rows(&mut ps);
        sort_rows(&mut rs);
        report.state_checks += 1;
        if ps != rs {
            let classes: Vec<String> = scripts
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    format!(
                        "{i}: {} {}",
                        s.class,
                        s.prefix
                            .iter()
                            .map(|p| show_bytes(p))
                            .collect::<Vec<_>>()
                            .join("; ")
                    )
                })
                .collect();
            let msg = format!(
                "logical state differs after the sessions ({})\n  only through heatsink:\n{}  only in the reference:\n{}",
                q,
                show_items(&multiset_minus(&ps, &rs)),
                show_items(&multiset_minus(&rs, &ps))
            );
            self.mismatch(&mut report, cfg, 0, &classes, msg);
        }
        report.elapsed_ms = started.elapsed().as_millis();
        report
    }

    /// Runs every script in its own session on one side, all at once (the prefixes
    /// first, then the writes of all sessions together). A session stops at its first
    /// broken answer.
    fn run_side(&self, proxied: bool, scripts: &[SessionScript]) -> Vec<SessionAnswers> {
        let db = if proxied {
            &self.proxied_db
        } else {
            &self.reference_db
        };
        let addr = if proxied {
            self.proxy.addr()
        } else {
            match self.target {
                Target::Single => mariadb().addr(),
                Target::Galera => super::galera::galera().node(0).addr(),
            }
        };
        let barrier = std::sync::Barrier::new(scripts.len());
        std::thread::scope(|scope| {
            let handles: Vec<_> = scripts
                .iter()
                .map(|script| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let opts = ConnectOpts::new(USER, PASSWORD)
                            .db(db)
                            .timeout(std::time::Duration::from_secs(15));
                        let mut out: SessionAnswers = Vec::new();
                        let mut conn = RawClient::connect(addr, &opts);
                        if let Err(e) = &conn {
                            // Still meet the others at the barrier, or they would wait
                            // for this session forever.
                            out.push(vec![Item::Io(format!("connect to {addr}: {e}"))]);
                        }
                        let mut alive = conn.is_ok();
                        for sql in &script.prefix {
                            let Ok(c) = conn.as_mut() else { break };
                            let a = query_items(c, sql);
                            alive = !a.iter().any(|i| matches!(i, Item::Io(_)));
                            out.push(a);
                            if !alive {
                                break;
                            }
                        }
                        barrier.wait();
                        for stmt in &script.writes {
                            if !alive {
                                break;
                            }
                            let Ok(c) = conn.as_mut() else { break };
                            let (sql, _) = stmt.render(db, &[]);
                            let mut a = query_items(c, &sql);
                            alive = !a.iter().any(|i| matches!(i, Item::Io(_)));
                            for it in &mut a {
                                if let Item::Ok { last_insert_id, .. } = it {
                                    *last_insert_id %= script.increment;
                                }
                            }
                            out.push(a);
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("session thread"))
                .collect()
        })
    }
}

/// The items of `a` left after taking away one equal item of `b` for each (`a` and
/// `b` compared as multisets).
pub fn multiset_minus<T: PartialEq + Clone>(a: &[T], b: &[T]) -> Vec<T> {
    let mut rest: Vec<&T> = b.iter().collect();
    let mut out = Vec::new();
    for it in a {
        match rest.iter().position(|r| *r == it) {
            Some(k) => {
                rest.swap_remove(k);
            }
            None => out.push(it.clone()),
        }
    }
    out
}
