//! How MariaDB reads a statement's bytes on a session: the client character set
//! ([`Charset`], [`CharsetClass`]) and the `sql_mode` flags that change the lexing
//! ([`Lexing`]), the query that learns them ([`SESSION_STATE_QUERY`]), which
//! statements may change them ([`may_change_lexing`]), and the fingerprint of a
//! statement read under them (for logs).

use super::sqltok::{self, LexMode};

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
/// [`Decision::NeedSessionState`](super::Decision::NeedSessionState)); its third column is the backend node's place in a
/// Galera cluster ([`NodeShare::from_server`](super::NodeShare::from_server); NULL on a server that is not a node).
pub const SESSION_STATE_QUERY: &str = "SELECT @@character_set_client, @@sql_mode, \
     (SELECT CONCAT(i.VARIABLE_VALUE, '/', n.VARIABLE_VALUE) \
     FROM information_schema.GLOBAL_STATUS AS i, information_schema.GLOBAL_STATUS AS n \
     WHERE i.VARIABLE_NAME = 'WSREP_LOCAL_INDEX' AND n.VARIABLE_NAME = 'WSREP_CLUSTER_SIZE')";

/// [`SESSION_STATE_QUERY`] for servers without `information_schema.GLOBAL_STATUS`
/// (MySQL 8 answers 1109 to it).
pub const SESSION_STATE_QUERY_PLAIN: &str = "SELECT @@character_set_client, @@sql_mode";

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

#[cfg(test)]
mod tests {
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
