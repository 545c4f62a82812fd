//! A MySQL lexer over raw statement bytes.
//!
//! Statements arrive in the connection's character set (often latin1), so this lexer
//! works on bytes and never assumes UTF-8. It knows just enough of MySQL's lexical
//! rules to tell identifiers from strings, comments and literals:
//!
//! - strings `'…'` and `"…"` with backslash escapes and doubled quotes; adjacent
//!   strings (`'a' 'b'`, which MySQL concatenates) form one literal;
//! - identifiers: bare words and `` `…` `` (doubled backticks);
//! - comments `-- ` (dash dash *whitespace*), `#`, `/* … */`; executable comments
//!   `/*! … */` and `/*M! … */` hold SQL that runs, so their content is lexed as tokens;
//! - numbers (integer, decimal, exponent), hex and bit literals (`0x1F`, `x'1F'`,
//!   `0b101`, `b'101'`), national strings (`N'…'`) and charset introducers
//!   (`_utf8mb4'…'`, `_binary 0x…`), each as one literal token;
//! - `?` parameters, `@user` and `@@system` variables, operators.
//!
//! From the tokens it builds the *fingerprint* (the plan cache key: literals replaced
//! by `?`, comments dropped, whitespace normalised, structural keywords uppercased)
//! and the *marked text* the parser sees when a plan is built (literals and parameters
//! replaced by numbered `?N` markers, see [`normalize`]).
//!
//! The two `sql_mode` flags that change what the bytes mean are a [`LexMode`]:
//! `NO_BACKSLASH_ESCAPES` (a backslash is an ordinary character in strings) and
//! `ANSI_QUOTES` (`"…"` is an identifier, not a string). The lexer assumes a
//! connection character set in which bytes 0x00–0x7F are always ASCII characters
//! (never part of a multi-byte character); the engine refuses to rewrite under any
//! other (big5, gbk, gb18030, sjis, cp932), see `docs/design.md`, "The lexer's
//! contract".

/// The newest version in `/*!NNNNN … */` whose content every supported server runs
/// (MySQL 5.7; MariaDB 10.x reads 5-digit versions the same way).
const MYSQL_FLOOR: u32 = 50700;
/// The same for MariaDB's `/*M!NNNNNN … */`: MariaDB 10.5.
const MARIADB_FLOOR: u32 = 100500;

/// What a token is; the lexer never needs more detail than this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// An unquoted word: keyword, identifier or function name.
    Word,
    /// A backtick-quoted identifier; the span includes the backticks.
    QuotedIdent,
    /// A literal value. The span covers everything that makes up the value: an
    /// introducer or `N` prefix, the quotes, and adjacent strings MySQL concatenates.
    Literal(LiteralKind),
    /// A `?` parameter of a prepared statement.
    Param,
    /// A user or system variable: `@v`, `@'v'`, `@@v` (a following `.x` is separate).
    Variable,
    /// An operator or punctuation (multi-byte operators such as `<=>` are one token).
    Punct,
    /// `?N`: a numbered marker. Only produced by [`lex_markers`], which reads the
    /// printed output of the parser where markers stand for literals and parameters.
    Marker(u32),
}

/// The kind of a literal; rules can use it to tell `1` from `'1'`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LiteralKind {
    /// A string, possibly with an introducer (`_utf8mb4'…'`) or `N` prefix.
    String,
    /// A decimal number: `12`, `1.5`, `.5`, `1e-3` (a sign is a separate operator).
    Number,
    /// A hex literal: `0x1F`, `x'1F'`, possibly with an introducer.
    Hex,
    /// A bit literal: `0b101`, `b'101'`, possibly with an introducer.
    Bit,
}

/// One token and where it lies in the statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// What the token is.
    pub kind: TokenKind,
    /// Byte offset of the first byte.
    pub start: usize,
    /// Byte offset one past the last byte.
    pub end: usize,
}

/// Why a statement could not be lexed (an unterminated string, identifier or comment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LexError {
    /// Byte offset where the unterminated construct starts.
    pub offset: usize,
    /// What was left open.
    pub what: &'static str,
}

impl std::fmt::Display for LexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.what, self.offset)
    }
}

impl std::error::Error for LexError {}

/// The `sql_mode` flags that change how statement bytes are read. The default is
/// MariaDB's default: backslash escapes on, `"…"` a string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LexMode {
    /// `NO_BACKSLASH_ESCAPES`: a backslash in a string is an ordinary character, so
    /// `'x\'` is a complete string.
    pub no_backslash_escapes: bool,
    /// `ANSI_QUOTES`: `"…"` quotes an identifier (doubled `""` inside), never a string.
    pub ansi_quotes: bool,
}

impl LexMode {
    /// The mode's two flags as one byte, for cache keys.
    pub fn bits(self) -> u8 {
        u8::from(self.no_backslash_escapes) | (u8::from(self.ansi_quotes) << 1)
    }
}

/// Lex a statement as the client sent it, read under `mode`.
pub fn lex(sql: &[u8], mode: LexMode) -> Result<Vec<Token>, LexError> {
    Lexer::new(sql, false, mode).run()
}

/// [`lex`] into `buf` (cleared first), reusing its allocation: the query digests
/// lex every statement and keep one buffer per session. On error `buf` is empty.
pub fn lex_into(sql: &[u8], mode: LexMode, buf: &mut Vec<Token>) -> Result<(), LexError> {
    let mut toks = std::mem::take(buf);
    toks.clear();
    let mut lexer = Lexer::new_in(sql, false, mode, toks);
    let r = lexer.run_in_place();
    *buf = std::mem::take(&mut lexer.toks);
    if r.is_err() {
        buf.clear();
    }
    r
}

/// Lex text printed by the parser, where `?N` is a [`TokenKind::Marker`]. The parser
/// prints in the default mode (backslash escapes, backticked identifiers).
pub fn lex_markers(sql: &[u8]) -> Result<Vec<Token>, LexError> {
    Lexer::new(sql, true, LexMode::default()).run()
}

/// Whether a byte can be part of an unquoted identifier. Bytes of multi-byte and
/// 8-bit characters count: MySQL allows them in identifiers.
#[inline]
pub fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

#[inline]
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Character sets that can introduce a literal (`_latin1'…'`), lowercase, without `_`.
const CHARSETS: &[&[u8]] = &[
    b"armscii8",
    b"ascii",
    b"big5",
    b"binary",
    b"cp1250",
    b"cp1251",
    b"cp1256",
    b"cp1257",
    b"cp850",
    b"cp852",
    b"cp866",
    b"cp932",
    b"dec8",
    b"eucjpms",
    b"euckr",
    b"gb18030",
    b"gb2312",
    b"gbk",
    b"geostd8",
    b"greek",
    b"hebrew",
    b"hp8",
    b"keybcs2",
    b"koi8r",
    b"koi8u",
    b"latin1",
    b"latin2",
    b"latin5",
    b"latin7",
    b"macce",
    b"macroman",
    b"sjis",
    b"swe7",
    b"tis620",
    b"ucs2",
    b"ujis",
    b"utf16",
    b"utf16le",
    b"utf32",
    b"utf8",
    b"utf8mb3",
    b"utf8mb4",
];

fn is_charset(word: &[u8]) -> bool {
    CHARSETS.iter().any(|c| c.eq_ignore_ascii_case(word))
}

struct Lexer<'a> {
    /// The statement bytes.
    s: &'a [u8],
    /// Lex `?N` as a marker (printed parser output) instead of `?` followed by a number.
    markers: bool,
    /// A backslash escapes the next byte in strings (no `NO_BACKSLASH_ESCAPES`).
    backslash: bool,
    /// `"…"` is an identifier (`ANSI_QUOTES`).
    ansi_quotes: bool,
    /// Tokens so far.
    toks: Vec<Token>,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a [u8], markers: bool, mode: LexMode) -> Self {
        Self::new_in(s, markers, mode, Vec::with_capacity(s.len() / 4 + 4))
    }

    fn new_in(s: &'a [u8], markers: bool, mode: LexMode, toks: Vec<Token>) -> Self {
        Lexer {
            s,
            markers,
            backslash: !mode.no_backslash_escapes,
            ansi_quotes: mode.ansi_quotes,
            toks,
        }
    }

    /// Whether `q` opens a string (rather than an identifier) in this mode.
    #[inline]
    fn is_string_quote(&self, q: u8) -> bool {
        q == b'\'' || (q == b'"' && !self.ansi_quotes)
    }

    #[inline]
    fn at(&self, i: usize) -> u8 {
        self.s.get(i).copied().unwrap_or(0)
    }

    fn push(&mut self, kind: TokenKind, start: usize, end: usize) {
        self.toks.push(Token { kind, start, end });
    }

    fn run(mut self) -> Result<Vec<Token>, LexError> {
        self.run_in_place()?;
        Ok(self.toks)
    }

    /// Lexes the whole statement into `self.toks`.
    fn run_in_place(&mut self) -> Result<(), LexError> {
        let n = self.s.len();
        let mut i = 0;
        // Start of the executable comment we are inside, if any.
        let mut exec: Option<usize> = None;
        while i < n {
            let c = self.s[i];
            if is_space(c) {
                i += 1;
                continue;
            }
            if let Some(j) = self.skip_comment(i)? {
                i = j;
                continue;
            }
            match c {
                b'/' if self.at(i + 1) == b'*' => {
                    // Executable comment (a plain comment was skipped above).
                    if exec.is_some() {
                        return Err(LexError {
                            offset: i,
                            what: "nested executable comment",
                        });
                    }
                    exec = Some(i);
                    let mut j = i + 3;
                    let mariadb = self.at(i + 2) == b'M';
                    if mariadb {
                        j += 1;
                    }
                    // Optional version number (5 or 6 digits): the content runs only
                    // on servers at least that new. Versions every supported server
                    // has reached are read as SQL; for newer ones it depends on the
                    // server, which the lexer does not know.
                    let v = j;
                    while j < n && j - v < 6 && self.s[j].is_ascii_digit() {
                        j += 1;
                    }
                    let version: u32 = std::str::from_utf8(&self.s[v..j])
                        .ok()
                        .and_then(|d| d.parse().ok())
                        .unwrap_or(0);
                    if version > if mariadb { MARIADB_FLOOR } else { MYSQL_FLOOR } {
                        return Err(LexError {
                            offset: i,
                            what: "executable comment for a newer server version (whether it runs depends on the server)",
                        });
                    }
                    i = j;
                }
                b'*' if exec.is_some() && self.at(i + 1) == b'/' => {
                    exec = None;
                    i += 2;
                }
                q @ (b'\'' | b'"') if self.is_string_quote(q) => {
                    let end = self.string_run(i)?;
                    self.push(TokenKind::Literal(LiteralKind::String), i, end);
                    i = end;
                }
                q @ (b'`' | b'"') => {
                    let end = self.quoted(i, q, false, "unterminated quoted identifier")?;
                    self.push(TokenKind::QuotedIdent, i, end);
                    i = end;
                }
                b'?' => {
                    let mut j = i + 1;
                    if self.markers {
                        while j < n && self.s[j].is_ascii_digit() {
                            j += 1;
                        }
                    }
                    if j > i + 1 {
                        let num = std::str::from_utf8(&self.s[i + 1..j])
                            .ok()
                            .and_then(|d| d.parse::<u32>().ok())
                            .ok_or(LexError {
                                offset: i,
                                what: "marker number out of range",
                            })?;
                        self.push(TokenKind::Marker(num), i, j);
                    } else {
                        self.push(TokenKind::Param, i, j);
                    }
                    i = j;
                }
                b'@' => i = self.variable(i)?,
                b'0'..=b'9' => i = self.number_or_word(i),
                b'.' if self.at(i + 1).is_ascii_digit()
                    && !(i > 0 && (is_ident_byte(self.s[i - 1]) || self.s[i - 1] == b'`')) =>
                {
                    i = self.number_or_word(i);
                }
                c if is_ident_byte(c) => i = self.word(i)?,
                _ => {
                    let len = punct_len(&self.s[i..]);
                    self.push(TokenKind::Punct, i, i + len);
                    i += len;
                }
            }
        }
        if let Some(offset) = exec {
            return Err(LexError {
                offset,
                what: "unterminated executable comment",
            });
        }
        Ok(())
    }

    /// If a comment (not an executable one) starts at `i`, return the offset after it.
    fn skip_comment(&self, i: usize) -> Result<Option<usize>, LexError> {
        let n = self.s.len();
        let c = self.at(i);
        let line = |from: usize| {
            self.s[from..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(n, |p| from + p + 1)
        };
        if c == b'#' {
            return Ok(Some(line(i)));
        }
        if c == b'-' && self.at(i + 1) == b'-' && (i + 2 >= n || self.s[i + 2] <= b' ') {
            return Ok(Some(line(i)));
        }
        if c == b'/' && self.at(i + 1) == b'*' {
            let next = self.at(i + 2);
            if next == b'!' || (next == b'M' && self.at(i + 3) == b'!') {
                return Ok(None);
            }
            let body = i + 2;
            return match self.s[body..].windows(2).position(|w| w == b"*/") {
                Some(p) => Ok(Some(body + p + 2)),
                None => Err(LexError {
                    offset: i,
                    what: "unterminated comment",
                }),
            };
        }
        Ok(None)
    }

    /// Offset of the next byte that is not whitespace or a plain comment.
    fn skip_trivia(&self, mut i: usize) -> Result<usize, LexError> {
        loop {
            if i < self.s.len() && is_space(self.s[i]) {
                i += 1;
            } else if let Some(j) = self.skip_comment(i)? {
                i = j;
            } else {
                return Ok(i);
            }
        }
    }

    /// End of a quoted run starting at `start` (which holds the opening quote).
    fn quoted(
        &self,
        start: usize,
        q: u8,
        backslash: bool,
        what: &'static str,
    ) -> Result<usize, LexError> {
        let n = self.s.len();
        let mut i = start + 1;
        while i < n {
            let c = self.s[i];
            if backslash && c == b'\\' {
                i += 2;
            } else if c == q {
                if self.at(i + 1) == q {
                    i += 2;
                } else {
                    return Ok(i + 1);
                }
            } else {
                i += 1;
            }
        }
        Err(LexError {
            offset: start,
            what,
        })
    }

    /// A string at `start` plus any adjacent strings MySQL concatenates with it.
    fn string_run(&self, start: usize) -> Result<usize, LexError> {
        let q = self.s[start];
        let mut end = self.quoted(start, q, self.backslash, "unterminated string")?;
        loop {
            let j = self.skip_trivia(end)?;
            match self.at(j) {
                q @ (b'\'' | b'"') if j < self.s.len() && self.is_string_quote(q) => {
                    end = self.quoted(j, q, self.backslash, "unterminated string")?;
                }
                _ => return Ok(end),
            }
        }
    }

    /// `@name`, `@'name'`, `@@name`; a lone `@` is punctuation.
    fn variable(&mut self, start: usize) -> Result<usize, LexError> {
        let mut i = start + 1;
        if self.at(i) == b'@' {
            i += 1;
        }
        let end = match self.at(i) {
            q @ (b'\'' | b'"' | b'`') if i < self.s.len() => self.quoted(
                i,
                q,
                self.backslash && self.is_string_quote(q),
                "unterminated variable name",
            )?,
            _ => {
                let mut j = i;
                while j < self.s.len() && is_ident_byte(self.s[j]) {
                    j += 1;
                }
                j
            }
        };
        if end == start + 1 {
            self.push(TokenKind::Punct, start, end);
        } else {
            self.push(TokenKind::Variable, start, end);
        }
        Ok(end)
    }

    /// A number (or hex/bit literal) at `start`; digits followed by identifier bytes
    /// form an identifier instead (`1abc`, `0xZZ`).
    fn number_or_word(&mut self, start: usize) -> usize {
        let s = self.s;
        let n = s.len();
        let ident_end = |mut j: usize| {
            while j < n && is_ident_byte(s[j]) {
                j += 1;
            }
            j
        };
        // 0x… / 0b…
        if s[start] == b'0' && matches!(self.at(start + 1), b'x' | b'X' | b'b' | b'B') {
            let hex = matches!(s[start + 1], b'x' | b'X');
            let mut j = start + 2;
            while j < n
                && (if hex {
                    s[j].is_ascii_hexdigit()
                } else {
                    matches!(s[j], b'0' | b'1')
                })
            {
                j += 1;
            }
            if j > start + 2 && !(j < n && is_ident_byte(s[j])) {
                let kind = if hex {
                    LiteralKind::Hex
                } else {
                    LiteralKind::Bit
                };
                self.push(TokenKind::Literal(kind), start, j);
                return j;
            }
            let end = ident_end(start);
            self.push(TokenKind::Word, start, end);
            return end;
        }
        let mut j = start;
        while j < n && s[j].is_ascii_digit() {
            j += 1;
        }
        let mut dot = false;
        if self.at(j) == b'.' {
            dot = true;
            j += 1;
            while j < n && s[j].is_ascii_digit() {
                j += 1;
            }
        }
        if matches!(self.at(j), b'e' | b'E') {
            let mut k = j + 1;
            if matches!(self.at(k), b'+' | b'-') {
                k += 1;
            }
            if self.at(k).is_ascii_digit() {
                while k < n && s[k].is_ascii_digit() {
                    k += 1;
                }
                j = k;
            }
        }
        if !dot && j < n && is_ident_byte(s[j]) {
            let end = ident_end(start);
            self.push(TokenKind::Word, start, end);
            return end;
        }
        self.push(TokenKind::Literal(LiteralKind::Number), start, j);
        j
    }

    /// A word at `start`, or a literal that starts like one: `x'…'`, `b'…'`, `N'…'`,
    /// `_charset'…'`.
    fn word(&mut self, start: usize) -> Result<usize, LexError> {
        let s = self.s;
        let mut end = start;
        while end < s.len() && is_ident_byte(s[end]) {
            end += 1;
        }
        let w = &s[start..end];
        if w.len() == 1 && self.at(end) == b'\'' {
            let kind = match w[0] {
                b'x' | b'X' => Some(LiteralKind::Hex),
                b'b' | b'B' => Some(LiteralKind::Bit),
                _ => None,
            };
            if let Some(kind) = kind {
                let e = self.quoted(end, b'\'', false, "unterminated hex or bit literal")?;
                self.push(TokenKind::Literal(kind), start, e);
                return Ok(e);
            }
            if matches!(w[0], b'n' | b'N') {
                let e = self.string_run(end)?;
                self.push(TokenKind::Literal(LiteralKind::String), start, e);
                return Ok(e);
            }
        }
        if w.len() > 1 && w[0] == b'_' && is_charset(&w[1..]) {
            let j = self.skip_trivia(end)?;
            let c0 = self.at(j);
            let c1 = self.at(j + 1);
            if j < s.len() {
                if self.is_string_quote(c0) {
                    let e = self.string_run(j)?;
                    self.push(TokenKind::Literal(LiteralKind::String), start, e);
                    return Ok(e);
                }
                let prefixed = matches!(c0, b'x' | b'X' | b'b' | b'B') && c1 == b'\'';
                let zero = c0 == b'0' && matches!(c1, b'x' | b'X' | b'b' | b'B');
                if prefixed || zero {
                    let before = self.toks.len();
                    let e = if prefixed {
                        self.word(j)?
                    } else {
                        self.number_or_word(j)
                    };
                    if let Some(t) = self.toks.get_mut(before) {
                        if matches!(
                            t.kind,
                            TokenKind::Literal(LiteralKind::Hex | LiteralKind::Bit)
                        ) {
                            t.start = start;
                            return Ok(e);
                        }
                    }
                    // Not a literal after all: keep the introducer as a word before it.
                    self.toks.insert(
                        before,
                        Token {
                            kind: TokenKind::Word,
                            start,
                            end,
                        },
                    );
                    return Ok(e);
                }
            }
        }
        self.push(TokenKind::Word, start, end);
        Ok(end)
    }
}

/// Length of the operator or punctuation at the start of `s` (non-empty).
fn punct_len(s: &[u8]) -> usize {
    const THREE: &[&[u8]] = &[b"<=>", b"->>"];
    const TWO: &[&[u8]] = &[
        b"<=", b">=", b"<>", b"!=", b"<<", b">>", b":=", b"||", b"&&", b"->",
    ];
    if THREE.iter().any(|p| s.starts_with(p)) {
        3
    } else if TWO.iter().any(|p| s.starts_with(p)) {
        2
    } else {
        1
    }
}

/// Reserved words whose case the parser never reproduces (it prints its own
/// spelling), so uppercasing them in the fingerprint cannot change a plan. A word is
/// only treated as a keyword when it is not followed by `(` (`left(…)`, `replace(…)`
/// are functions, printed as written) and not preceded by `.` (`t.select` is a
/// column).
const KEYWORDS: &[&[u8]] = &[
    b"ALL",
    b"AND",
    b"AS",
    b"ASC",
    b"BETWEEN",
    b"BY",
    b"CASE",
    b"CROSS",
    b"DELETE",
    b"DESC",
    b"DISTINCT",
    b"DIV",
    b"ELSE",
    b"EXISTS",
    b"FOR",
    b"FROM",
    b"GROUP",
    b"HAVING",
    b"IGNORE",
    b"IN",
    b"INNER",
    b"INSERT",
    b"INTO",
    b"IS",
    b"JOIN",
    b"KEY",
    b"LEFT",
    b"LIKE",
    b"LIMIT",
    b"NOT",
    b"NULL",
    b"ON",
    b"OR",
    b"ORDER",
    b"OUTER",
    b"REGEXP",
    b"REPLACE",
    b"RIGHT",
    b"SELECT",
    b"SET",
    b"STRAIGHT_JOIN",
    b"THEN",
    b"UNION",
    b"UPDATE",
    b"USING",
    b"VALUES",
    b"WHEN",
    b"WHERE",
    b"XOR",
];

/// A word of up to 16 bytes as a number that sorts like the word (big-endian, zero
/// padded), so keyword lookup is a binary search over integers.
const fn pack(w: &[u8]) -> u128 {
    let mut v = 0u128;
    let mut i = 0;
    while i < w.len() && i < 16 {
        v |= (w[i].to_ascii_uppercase() as u128) << (8 * (15 - i));
        i += 1;
    }
    v
}

/// [`KEYWORDS`], packed.
static KEYWORD_KEYS: [u128; KEYWORDS.len()] = {
    let mut a = [0u128; KEYWORDS.len()];
    let mut i = 0;
    while i < KEYWORDS.len() {
        a[i] = pack(KEYWORDS[i]);
        i += 1;
    }
    a
};

/// Whether `w` is one of the structural keywords the fingerprint uppercases (any case).
pub fn is_keyword(w: &[u8]) -> bool {
    (2..=13).contains(&w.len()) && KEYWORD_KEYS.binary_search(&pack(w)).is_ok()
}

/// What one `?N` marker of a marked text stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The statement's literal number `i` (0-based, in text order).
    Literal(usize),
    /// The statement's parameter number `j` (0-based, in text order).
    Param(usize),
}

/// How [`normalize`] renders literals and parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The cache key: literals as `?`, parameters as `?p`.
    Fingerprint,
    /// Parser input: literals and parameters as numbered markers `?1`, `?2`, ….
    MarkAll,
    /// Parser input when a literal sits where a marker does not parse: literals
    /// verbatim, parameters as markers.
    MarkParams,
}

/// Tokens joined by single spaces, comments dropped (executable-comment content
/// kept), structural keywords uppercased, literals and parameters rendered as `mode`
/// says. Appends to `out`; pushes one [`Slot`] per marker to `slots` (marker `?k`
/// is `slots[k - 1]`).
pub fn normalize(sql: &[u8], toks: &[Token], mode: Mode, out: &mut Vec<u8>, slots: &mut Vec<Slot>) {
    let mut lits = 0;
    let mut params = 0;
    for (idx, t) in toks.iter().enumerate() {
        if idx > 0 {
            out.push(b' ');
        }
        let text = &sql[t.start..t.end];
        match t.kind {
            TokenKind::Literal(_) => {
                match mode {
                    Mode::Fingerprint => out.push(b'?'),
                    Mode::MarkAll => {
                        slots.push(Slot::Literal(lits));
                        push_marker(out, slots.len());
                    }
                    Mode::MarkParams => out.extend_from_slice(text),
                }
                lits += 1;
            }
            TokenKind::Param => {
                match mode {
                    Mode::Fingerprint => out.extend_from_slice(b"?p"),
                    Mode::MarkAll | Mode::MarkParams => {
                        slots.push(Slot::Param(params));
                        push_marker(out, slots.len());
                    }
                }
                params += 1;
            }
            TokenKind::Word
                if is_keyword(text)
                    && !toks.get(idx + 1).is_some_and(|n| is_punct(sql, n, b"("))
                    && !idx
                        .checked_sub(1)
                        .is_some_and(|p| is_punct(sql, &toks[p], b".")) =>
            {
                out.extend(text.iter().map(u8::to_ascii_uppercase));
            }
            // An ANSI_QUOTES identifier, as the parser reads identifiers: backticked.
            TokenKind::QuotedIdent if text.first() == Some(&b'"') => {
                out.push(b'`');
                for &b in unquote(text, b'"').iter() {
                    if b == b'`' {
                        out.push(b'`');
                    }
                    out.push(b);
                }
                out.push(b'`');
            }
            _ => out.extend_from_slice(text),
        }
    }
}

fn is_punct(sql: &[u8], t: &Token, p: &[u8]) -> bool {
    t.kind == TokenKind::Punct && sql[t.start..t.end] == *p
}

fn push_marker(out: &mut Vec<u8>, k: usize) {
    out.push(b'?');
    let mut buf = [0u8; 20];
    let mut n = k;
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// The name an identifier token stands for: a bare word as is, a quoted one (`` `…` ``,
/// or `"…"` under `ANSI_QUOTES`) without its quotes and with doubled quotes undoubled.
/// `None` for other tokens.
pub fn ident_name<'s>(sql: &'s [u8], t: &Token) -> Option<std::borrow::Cow<'s, [u8]>> {
    let text = &sql[t.start..t.end];
    match t.kind {
        TokenKind::Word => Some(std::borrow::Cow::Borrowed(text)),
        TokenKind::QuotedIdent => Some(unquote(text, text.first().copied().unwrap_or(b'`'))),
        _ => None,
    }
}

/// The content of a plain double-quoted string (no introducer, no concatenation), as
/// a name: under `ANSI_QUOTES` such a string is an identifier.
pub fn double_quoted_name<'s>(sql: &'s [u8], t: &Token) -> Option<std::borrow::Cow<'s, [u8]>> {
    let text = &sql[t.start..t.end];
    if t.kind != TokenKind::Literal(LiteralKind::String) || text.first() != Some(&b'"') {
        return None;
    }
    let inner = &text[1..text.len().saturating_sub(1)];
    if inner.contains(&b'\\') || inner.contains(&b'"') {
        return None;
    }
    Some(std::borrow::Cow::Borrowed(inner))
}

fn unquote(text: &[u8], q: u8) -> std::borrow::Cow<'_, [u8]> {
    let inner = &text[1..text.len().saturating_sub(1)];
    if !inner.contains(&q) {
        return std::borrow::Cow::Borrowed(inner);
    }
    let mut v = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        v.push(inner[i]);
        if inner[i] == q && inner.get(i + 1) == Some(&q) {
            i += 1;
        }
        i += 1;
    }
    std::borrow::Cow::Owned(v)
}

/// What a literal is, finely enough for a rule to check it against a column's type
/// without reading its value. The engine makes every literal's class part of the
/// plan cache key ([`class_signature`]), so a plan may depend on classes freely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LiteralClass {
    /// A quoted string, with or without introducer or `N` prefix. `bytes`: the
    /// length of its source text, quotes and all (capped at 65535), an upper bound on
    /// its length in characters plus two.
    String { bytes: u16 },
    /// A decimal integer: digits only. `digits` counts them without leading zeros
    /// (capped at 255), enough to tell which integer types surely hold it.
    Integer { digits: u8 },
    /// A number with a decimal point or an exponent (`1.5`, `1e0`).
    Decimal,
    /// A hex literal (`0x1F`, `x'1F'`).
    Hex,
    /// A bit literal (`0b101`, `b'101'`).
    Bit,
}

impl LiteralClass {
    /// The class of a literal of `kind` whose source text is `text`.
    pub fn of(kind: LiteralKind, text: &[u8]) -> LiteralClass {
        match kind {
            LiteralKind::String => LiteralClass::String {
                bytes: text.len().min(usize::from(u16::MAX)) as u16,
            },
            LiteralKind::Hex => LiteralClass::Hex,
            LiteralKind::Bit => LiteralClass::Bit,
            LiteralKind::Number if text.iter().all(u8::is_ascii_digit) => {
                let significant = text.iter().skip_while(|&&b| b == b'0').count();
                LiteralClass::Integer {
                    digits: significant.min(255) as u8,
                }
            }
            LiteralKind::Number => LiteralClass::Decimal,
        }
    }

    /// A few bytes for the cache key.
    fn key_bytes(self, out: &mut Vec<u8>) {
        match self {
            LiteralClass::String { bytes } => {
                out.push(b's');
                out.extend_from_slice(&bytes.to_le_bytes());
            }
            LiteralClass::Integer { digits } => {
                out.push(b'i');
                out.push(digits);
            }
            LiteralClass::Decimal => out.push(b'd'),
            LiteralClass::Hex => out.push(b'x'),
            LiteralClass::Bit => out.push(b'b'),
        }
    }
}

/// Appends the class of every literal of the statement, in text order: with the
/// fingerprint (where every literal is `?`) it makes the plan cache key.
pub fn class_signature(sql: &[u8], toks: &[Token], out: &mut Vec<u8>) {
    out.push(0);
    for t in toks {
        if let TokenKind::Literal(kind) = t.kind {
            LiteralClass::of(kind, &sql[t.start..t.end]).key_bytes(out);
        }
    }
}

/// An upper bound on how deep the parsed statement's expression tree can be, read
/// from the tokens alone: within one parenthesis level, every operator (symbol or
/// keyword such as `AND`, `OR`, `LIKE`, `UNION`) since the last comma may nest the
/// expression one level deeper (sqlparser builds `a AND b AND c` left-deep), and
/// every open parenthesis adds a level. The parser, its visitors, its printer and
/// the drop of its tree all recurse along that depth, so the engine refuses a
/// statement past a bound before parsing it. Lists (`IN (…)`, multi-row `VALUES`,
/// select lists) are separated by commas and do not add up.
pub fn nesting_bound(sql: &[u8], toks: &[Token]) -> usize {
    // Operator counts of the open parenthesis levels; `open` is their sum.
    let mut levels: Vec<usize> = vec![0];
    let mut open = 0usize;
    let mut max = 0usize;
    for t in toks {
        let text = &sql[t.start..t.end];
        match t.kind {
            TokenKind::Punct => match text {
                b"(" => levels.push(0),
                b")" => {
                    if levels.len() > 1 {
                        open -= levels.pop().unwrap_or(0);
                    }
                }
                b"," | b";" => {
                    if let Some(last) = levels.last_mut() {
                        open -= *last;
                        *last = 0;
                    }
                }
                b"." => {}
                _ => {
                    if let Some(last) = levels.last_mut() {
                        *last += 1;
                        open += 1;
                    }
                }
            },
            TokenKind::Word if is_operator_word(text) => {
                if let Some(last) = levels.last_mut() {
                    *last += 1;
                    open += 1;
                }
            }
            _ => {}
        }
        max = max.max(open + levels.len());
    }
    max
}

/// Keywords that combine expressions (or queries) into a deeper tree.
fn is_operator_word(w: &[u8]) -> bool {
    const OPS: &[&[u8]] = &[
        b"AND",
        b"OR",
        b"XOR",
        b"NOT",
        b"IS",
        b"LIKE",
        b"BETWEEN",
        b"IN",
        b"REGEXP",
        b"RLIKE",
        b"DIV",
        b"MOD",
        b"CASE",
        b"SOUNDS",
        b"ESCAPE",
        b"COLLATE",
        b"BINARY",
        b"INTERVAL",
        b"EXISTS",
        b"ANY",
        b"ALL",
        b"SOME",
        b"UNION",
        b"INTERSECT",
        b"EXCEPT",
        b"MINUS",
    ];
    w.len() <= 9 && OPS.iter().any(|o| o.eq_ignore_ascii_case(w))
}

/// The byte ranges of the items of a `SELECT` statement's select list, each from its
/// first token's start to its last token's end, as the client spelt it: the items at
/// nesting depth zero between the leading `SELECT` (and its `ALL`/`DISTINCT`
/// modifiers) and the `FROM` at depth zero. `None` when the statement does not start
/// with `SELECT`, has no `FROM` at depth zero, or an item is empty. MariaDB names an
/// unaliased select item by exactly this text (a comment inside an item is not part
/// of the name, see [`spelt_plainly`]).
pub fn select_list(sql: &[u8], toks: &[Token]) -> Option<Vec<std::ops::Range<usize>>> {
    let word = |t: &Token, w: &[u8]| {
        t.kind == TokenKind::Word && sql[t.start..t.end].eq_ignore_ascii_case(w)
    };
    let first = toks.first()?;
    if !word(first, b"SELECT") {
        return None;
    }
    let mut at = 1;
    while toks
        .get(at)
        .is_some_and(|t| word(t, b"ALL") || word(t, b"DISTINCT"))
    {
        at += 1;
    }
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut item_start: Option<usize> = None;
    let mut item_end = 0usize;
    for t in &toks[at..] {
        if depth == 0 && (word(t, b"FROM") || is_punct(sql, t, b",")) {
            items.push(item_start.take()?..item_end);
            if word(t, b"FROM") {
                return Some(items);
            }
            continue;
        }
        if is_punct(sql, t, b"(") {
            depth += 1;
        } else if is_punct(sql, t, b")") {
            depth = depth.checked_sub(1)?;
        }
        item_start.get_or_insert(t.start);
        item_end = t.end;
    }
    None
}

/// Whether `range` of `sql` holds only whole tokens of `toks` separated by
/// whitespace (no comment: MariaDB leaves comments out of an item's name) and
/// printable ASCII: text that names a column the same in every character set.
pub fn spelt_plainly(sql: &[u8], toks: &[Token], range: &std::ops::Range<usize>) -> bool {
    let Some(text) = sql.get(range.clone()) else {
        return false;
    };
    if !text
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) || is_space(b))
    {
        return false;
    }
    let mut at = range.start;
    for t in toks
        .iter()
        .filter(|t| t.start >= range.start && t.end <= range.end)
    {
        if !sql[at..t.start].iter().all(|&b| is_space(b)) {
            return false;
        }
        at = t.end;
    }
    at == range.end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_list_items_as_spelt() {
        let sql = b"SELECT DISTINCT track_id, count( *\n ), SUM(IF(a, 1, 2))  , x AS y FROM plays WHERE a = (SELECT 1, 2)";
        let toks = lex(sql, LexMode::default()).unwrap();
        let items: Vec<&[u8]> = select_list(sql, &toks)
            .unwrap()
            .into_iter()
            .map(|r| &sql[r])
            .collect();
        assert_eq!(
            items,
            [
                &b"track_id"[..],
                b"count( *\n )",
                b"SUM(IF(a, 1, 2))",
                b"x AS y"
            ]
        );
        let toks_of = |s: &[u8]| lex(s, LexMode::default()).unwrap();
        for bad in [
            &b"UPDATE t SET a = 1"[..],
            b"SELECT 1",
            b"SELECT , a FROM t",
            b"SELECT (a FROM t",
        ] {
            assert_eq!(
                select_list(bad, &toks_of(bad)),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn plain_spelling_has_no_comment_and_only_ascii() {
        for (sql, plain) in [
            (&b"SELECT COUNT( * ) FROM t"[..], true),
            (b"SELECT COUNT(/*x*/*) FROM t", false),
            (b"SELECT COUNT(/*!*/*) FROM t", false),
            (b"SELECT SUM(\xc3\xa9) FROM t", false),
        ] {
            let toks = lex(sql, LexMode::default()).unwrap();
            let items = select_list(sql, &toks).unwrap();
            assert_eq!(
                spelt_plainly(sql, &toks, &items[0]),
                plain,
                "{}",
                String::from_utf8_lossy(sql)
            );
        }
    }

    fn kinds(sql: &str) -> Vec<(TokenKind, String)> {
        let b = sql.as_bytes();
        lex(b, LexMode::default())
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t.kind,
                    String::from_utf8_lossy(&b[t.start..t.end]).into_owned(),
                )
            })
            .collect()
    }

    fn bound(sql: &str) -> usize {
        nesting_bound(
            sql.as_bytes(),
            &lex(sql.as_bytes(), LexMode::default()).unwrap(),
        )
    }

    #[test]
    fn nesting_bound_counts_chains_not_lists() {
        let chain = |op: &str, n: usize| {
            let mut s = String::from("SELECT cnt FROM hits WHERE slug = 'a'");
            for _ in 0..n {
                s.push_str(op);
            }
            s
        };
        let base = bound(&chain("", 0));
        assert!(base < 10, "{base}");
        for op in [" AND 1=1", " OR 1", " + 1", " || 1", " AND NOT 1"] {
            let b = bound(&chain(op, 1000));
            assert!(b >= 1000 && b <= base + 3000, "{op}: {b}");
        }
        // Parentheses nest; commas separate siblings.
        let parens = format!("SELECT {}1{}", "(".repeat(500), ")".repeat(500));
        assert!(bound(&parens) > 500);
        let list: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
        let in_list = format!("SELECT cnt FROM hits WHERE slug IN ({})", list.join(", "));
        assert!(bound(&in_list) < 10);
        let rows: Vec<String> = (0..5000).map(|i| format!("('k{i}', {i} + 1)")).collect();
        let values = format!("INSERT INTO hits (slug, cnt) VALUES {}", rows.join(", "));
        assert!(bound(&values) < 10);
        // Closed parentheses give their depth back.
        let flat = format!("SELECT {}", vec!["((1 + 2))"; 2000].join(", "));
        assert!(bound(&flat) < 10);
    }

    fn fp(sql: &[u8]) -> String {
        let toks = lex(sql, LexMode::default()).unwrap();
        let mut out = Vec::new();
        normalize(sql, &toks, Mode::Fingerprint, &mut out, &mut Vec::new());
        String::from_utf8(out).unwrap()
    }

    const S: TokenKind = TokenKind::Literal(LiteralKind::String);
    const N: TokenKind = TokenKind::Literal(LiteralKind::Number);
    const H: TokenKind = TokenKind::Literal(LiteralKind::Hex);
    const B: TokenKind = TokenKind::Literal(LiteralKind::Bit);
    const W: TokenKind = TokenKind::Word;

    #[test]
    fn strings_with_escapes_and_doubled_quotes() {
        assert_eq!(
            kinds(r#"'a\'b', "c\"d", 'e''f', "g""h", '\\'"#)
                .into_iter()
                .filter(|(k, _)| *k == S)
                .map(|(_, t)| t)
                .collect::<Vec<_>>(),
            vec![r"'a\'b'", r#""c\"d""#, "'e''f'", r#""g""h""#, r"'\\'"]
        );
        // Adjacent strings are one literal (MySQL concatenates them), even across a comment.
        assert_eq!(
            kinds(r#"x = 'a' 'b' /* c */ "d", 'e'"#),
            vec![
                (W, "x".into()),
                (TokenKind::Punct, "=".into()),
                (S, r#"'a' 'b' /* c */ "d""#.into()),
                (TokenKind::Punct, ",".into()),
                (S, "'e'".into()),
            ]
        );
        assert_eq!(
            lex(b"SELECT 'abc", LexMode::default()).unwrap_err().what,
            "unterminated string"
        );
        assert_eq!(
            lex(br"SELECT 'abc\'", LexMode::default())
                .unwrap_err()
                .offset,
            7
        );
    }

    #[test]
    fn quoted_identifiers() {
        assert_eq!(
            kinds("SELECT `a``b` FROM `hits`"),
            vec![
                (W, "SELECT".into()),
                (TokenKind::QuotedIdent, "`a``b`".into()),
                (W, "FROM".into()),
                (TokenKind::QuotedIdent, "`hits`".into()),
            ]
        );
        let sql = b"`a``b`";
        let t = lex(sql, LexMode::default()).unwrap()[0];
        assert_eq!(&*ident_name(sql, &t).unwrap(), b"a`b");
    }

    #[test]
    fn comments_are_dropped() {
        assert_eq!(
            kinds("SELECT 1 -- hits\n, 2 # hits\n, 3 /* hits */ , 4--5"),
            vec![
                (W, "SELECT".into()),
                (N, "1".into()),
                (TokenKind::Punct, ",".into()),
                (N, "2".into()),
                (TokenKind::Punct, ",".into()),
                (N, "3".into()),
                (TokenKind::Punct, ",".into()),
                (N, "4".into()),
                (TokenKind::Punct, "-".into()),
                (TokenKind::Punct, "-".into()),
                (N, "5".into()),
            ]
        );
        assert_eq!(
            kinds("SELECT 1 --"),
            vec![(W, "SELECT".into()), (N, "1".into())]
        );
        assert_eq!(
            kinds("SELECT 1 --\thits"),
            vec![(W, "SELECT".into()), (N, "1".into())]
        );
        assert_eq!(
            lex(b"SELECT 1 /* x", LexMode::default()).unwrap_err().what,
            "unterminated comment"
        );
    }

    #[test]
    fn executable_comments_for_newer_servers_are_not_read() {
        for sql in [
            "UPDATE hits SET cnt = 50 WHERE slug = 'home' /*!999999 AND 1 = 0 */",
            "SELECT /*!80000 1, */ 2",
            "SELECT /*M!110000 1, */ 2",
        ] {
            let e = lex(sql.as_bytes(), LexMode::default()).unwrap_err();
            assert!(e.what.contains("newer server"), "{sql}");
        }
        assert!(lex(
            b"SELECT /*!50700 1, */ /*M!100500 2, */ 3",
            LexMode::default()
        )
        .is_ok());
    }

    #[test]
    fn executable_comments_are_lexed() {
        assert_eq!(
            kinds("SELECT /*!50000 SQL_NO_CACHE */ a FROM /*M!100100 hits */ t /*!hits2*/"),
            vec![
                (W, "SELECT".into()),
                (W, "SQL_NO_CACHE".into()),
                (W, "a".into()),
                (W, "FROM".into()),
                (W, "hits".into()),
                (W, "t".into()),
                (W, "hits2".into()),
            ]
        );
        // A plain comment inside an executable one is still a comment.
        assert_eq!(
            kinds("/*! SELECT /* no */ 1 */"),
            vec![(W, "SELECT".into()), (N, "1".into())]
        );
        assert_eq!(
            lex(b"/*!50000 SELECT 1", LexMode::default())
                .unwrap_err()
                .what,
            "unterminated executable comment"
        );
        // The fingerprint keeps the content, without the wrapper.
        assert_eq!(
            fp(b"UPDATE /*!50000 hits */ SET a=1"),
            "UPDATE hits SET a = ?"
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(
            kinds("1 1.5 .5 1e5 1.5E-3 2e+2 0x1F X'1f' x'' 0b101 b'01' B'1'"),
            vec![
                (N, "1".into()),
                (N, "1.5".into()),
                (N, ".5".into()),
                (N, "1e5".into()),
                (N, "1.5E-3".into()),
                (N, "2e+2".into()),
                (H, "0x1F".into()),
                (H, "X'1f'".into()),
                (H, "x''".into()),
                (B, "0b101".into()),
                (B, "b'01'".into()),
                (B, "B'1'".into()),
            ]
        );
        // Digits followed by identifier bytes are an identifier.
        assert_eq!(
            kinds("SELECT 1abc, 0xZZ, 0x, 1e FROM t"),
            vec![
                (W, "SELECT".into()),
                (W, "1abc".into()),
                (TokenKind::Punct, ",".into()),
                (W, "0xZZ".into()),
                (TokenKind::Punct, ",".into()),
                (W, "0x".into()),
                (TokenKind::Punct, ",".into()),
                (W, "1e".into()),
                (W, "FROM".into()),
                (W, "t".into()),
            ]
        );
        // A sign is an operator; `t.5` is not a number.
        assert_eq!(
            kinds("-1 t.5"),
            vec![
                (TokenKind::Punct, "-".into()),
                (N, "1".into()),
                (W, "t".into()),
                (TokenKind::Punct, ".".into()),
                (N, "5".into()),
            ]
        );
    }

    #[test]
    fn introducers_and_national_strings() {
        assert_eq!(
            kinds("_utf8mb4'a' _latin1 'b' 'c' N'd' n'e' _binary 0x41 _BINARY x'42' _id"),
            vec![
                (S, "_utf8mb4'a'".into()),
                (S, "_latin1 'b' 'c'".into()),
                (S, "N'd'".into()),
                (S, "n'e'".into()),
                (H, "_binary 0x41".into()),
                (H, "_BINARY x'42'".into()),
                (W, "_id".into()),
            ]
        );
        // Not a charset: a word followed by a string.
        assert_eq!(
            kinds("_foo 'x'"),
            vec![(W, "_foo".into()), (S, "'x'".into())]
        );
        // A charset name followed by something that is not a literal.
        assert_eq!(
            kinds("_utf8 0xZZ"),
            vec![(W, "_utf8".into()), (W, "0xZZ".into())]
        );
    }

    #[test]
    fn latin1_bytes() {
        // 'café' in latin1, and an identifier with a latin1 byte.
        let sql = b"INSERT INTO hits VALUES ('caf\xe9', 'a\\'\xff'), (t\xe9st)";
        let toks = lex(sql, LexMode::default()).unwrap();
        let lits: Vec<&[u8]> = toks
            .iter()
            .filter(|t| t.kind == S)
            .map(|t| &sql[t.start..t.end])
            .collect();
        assert_eq!(lits, vec![&b"'caf\xe9'"[..], &b"'a\\'\xff'"[..]]);
        assert!(toks
            .iter()
            .any(|t| t.kind == W && &sql[t.start..t.end] == b"t\xe9st"));
    }

    #[test]
    fn params_variables_operators() {
        assert_eq!(
            kinds("@a @'b c' @@global.x ?<=>? a->>'$.x' b:=@ @`q`"),
            vec![
                (TokenKind::Variable, "@a".into()),
                (TokenKind::Variable, "@'b c'".into()),
                (TokenKind::Variable, "@@global".into()),
                (TokenKind::Punct, ".".into()),
                (W, "x".into()),
                (TokenKind::Param, "?".into()),
                (TokenKind::Punct, "<=>".into()),
                (TokenKind::Param, "?".into()),
                (W, "a".into()),
                (TokenKind::Punct, "->>".into()),
                (S, "'$.x'".into()),
                (W, "b".into()),
                (TokenKind::Punct, ":=".into()),
                (TokenKind::Punct, "@".into()),
                (TokenKind::Variable, "@`q`".into()),
            ]
        );
        // Markers only in marker mode.
        let toks = lex_markers(b"a = ?12 AND b = ?").unwrap();
        assert_eq!(toks[2].kind, TokenKind::Marker(12));
        assert_eq!(toks[6].kind, TokenKind::Param);
        assert_eq!(lex(b"?12", LexMode::default()).unwrap().len(), 2);
    }

    #[test]
    fn keyword_list_is_sorted() {
        assert!(KEYWORDS.windows(2).all(|w| w[0] < w[1]));
        assert!(KEYWORD_KEYS.windows(2).all(|w| w[0] < w[1]));
        assert!(KEYWORDS.iter().all(|k| k.len() <= 13));
        assert!(is_keyword(b"select") && is_keyword(b"STRAIGHT_JOIN") && !is_keyword(b"sel"));
    }

    #[test]
    fn fingerprint() {
        assert_eq!(
            fp(b"select a,  b from hits where id=5 and s='x\\'y' -- c\n LIMIT 10"),
            "SELECT a , b FROM hits WHERE id = ? AND s = ? LIMIT ?"
        );
        assert_eq!(
            fp(b"SELECT a FROM hits WHERE id = ? AND b IN (1, 'two', x'03')"),
            "SELECT a FROM hits WHERE id = ?p AND b IN ( ? , ? , ? )"
        );
        // Function names, qualified reserved words and identifiers keep their case.
        assert_eq!(
            fp(b"select Left(a, 1), t.select, count(*) from T left join u on 1"),
            "SELECT Left ( a , ? ) , t . select , count ( * ) FROM T LEFT JOIN u ON ?"
        );
        // Literal and parameter positions are distinguished.
        assert_ne!(fp(b"a = ? AND b = 1"), fp(b"a = 1 AND b = ?"));
    }

    #[test]
    fn marked_text() {
        let sql = b"UPDATE hits SET c = c + 1 WHERE id = ? AND s = _utf8mb4'x'";
        let toks = lex(sql, LexMode::default()).unwrap();
        let mut out = Vec::new();
        let mut slots = Vec::new();
        normalize(sql, &toks, Mode::MarkAll, &mut out, &mut slots);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "UPDATE hits SET c = c + ?1 WHERE id = ?2 AND s = ?3"
        );
        assert_eq!(
            slots,
            vec![Slot::Literal(0), Slot::Param(0), Slot::Literal(1)]
        );
        let mut out = Vec::new();
        let mut slots = Vec::new();
        normalize(sql, &toks, Mode::MarkParams, &mut out, &mut slots);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "UPDATE hits SET c = c + 1 WHERE id = ?1 AND s = _utf8mb4'x'"
        );
        assert_eq!(slots, vec![Slot::Param(0)]);
    }

    fn kinds_in(sql: &[u8], mode: LexMode) -> Vec<(TokenKind, Vec<u8>)> {
        lex(sql, mode)
            .unwrap()
            .iter()
            .map(|t| (t.kind, sql[t.start..t.end].to_vec()))
            .collect()
    }

    const NBE: LexMode = LexMode {
        no_backslash_escapes: true,
        ansi_quotes: false,
    };
    const ANSI: LexMode = LexMode {
        no_backslash_escapes: false,
        ansi_quotes: true,
    };

    #[test]
    fn no_backslash_escapes_ends_strings_at_a_backslash_quote() {
        // The injection of issue 9: with backslash escapes the literal swallows the
        // rest; without them it ends after `x\` and the rest is SQL.
        let sql =
            b"UPDATE hits SET cnt = cnt + 1 WHERE slug = 'x\\', 0, 1), (0x686f6d65, 3, 1000) -- '";
        let std_lits: Vec<_> = kinds_in(sql, LexMode::default())
            .into_iter()
            .filter(|(k, _)| *k == S)
            .collect();
        assert_eq!(std_lits.len(), 1);
        assert!(std_lits[0].1.ends_with(b"-- '"));
        let nbe = kinds_in(sql, NBE);
        assert!(nbe.contains(&(S, b"'x\\'".to_vec())), "{nbe:?}");
        assert!(nbe.contains(&(N, b"1000".to_vec())), "{nbe:?}");
        // Doubled quotes still escape a quote; a backslash is kept as it is.
        assert_eq!(
            kinds_in(br"'a''b\' 'c\'", NBE),
            vec![(S, br"'a''b\' 'c\'".to_vec())]
        );
        assert_eq!(kinds_in(br#""x\""#, NBE), vec![(S, br#""x\""#.to_vec())]);
        // Under the default mode the same text is unterminated.
        assert!(lex(br"SELECT 'x\'", LexMode::default()).is_err());
        assert!(lex(br"SELECT 'x\'", NBE).is_ok());
        // Variable names quoted as strings follow the same rule.
        assert_eq!(
            kinds_in(br"@'a\' = 1", NBE)[0],
            (TokenKind::Variable, br"@'a\'".to_vec())
        );
    }

    #[test]
    fn ansi_quotes_make_double_quotes_identifiers() {
        assert_eq!(
            kinds_in(br#"SELECT "a""b" FROM "hits" WHERE x = 'y' "z""#, ANSI),
            vec![
                (W, b"SELECT".to_vec()),
                (TokenKind::QuotedIdent, br#""a""b""#.to_vec()),
                (W, b"FROM".to_vec()),
                (TokenKind::QuotedIdent, br#""hits""#.to_vec()),
                (W, b"WHERE".to_vec()),
                (W, b"x".to_vec()),
                (TokenKind::Punct, b"=".to_vec()),
                // Not concatenated: `"z"` is an identifier.
                (S, b"'y'".to_vec()),
                (TokenKind::QuotedIdent, br#""z""#.to_vec()),
            ]
        );
        // A backslash does not escape inside a quoted identifier.
        assert_eq!(
            kinds_in(br#""a\" 'b'"#, ANSI),
            vec![
                (TokenKind::QuotedIdent, br#""a\""#.to_vec()),
                (S, b"'b'".to_vec())
            ]
        );
        // `_utf8mb4"x"` is no introduced string under ANSI_QUOTES.
        assert_eq!(kinds_in(br#"_utf8mb4"x""#, ANSI)[0].0, W);
        // The name is undoubled, and the parser sees it backticked.
        let sql = br#"UPDATE "h`i""ts" SET "c" = 1"#;
        let toks = lex(sql, ANSI).unwrap();
        assert_eq!(&*ident_name(sql, &toks[1]).unwrap(), b"h`i\"ts");
        let mut out = Vec::new();
        normalize(sql, &toks, Mode::MarkAll, &mut out, &mut Vec::new());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "UPDATE `h``i\"ts` SET `c` = ?1"
        );
    }

    #[test]
    fn lex_modes_have_distinct_bits() {
        let all = [
            LexMode::default(),
            NBE,
            ANSI,
            LexMode {
                no_backslash_escapes: true,
                ansi_quotes: true,
            },
        ];
        let mut bits: Vec<u8> = all.iter().map(|m| m.bits()).collect();
        bits.dedup();
        assert_eq!(bits.len(), 4);
    }
}
