//! Whether a merged write may run one session's rows on another session's connection
//! as far as the written table goes: its triggers and column defaults run on the
//! connection that writes, and some of what they may read belongs to the connection,
//! not to the statement — `CONNECTION_ID()`, `LAST_INSERT_ID()`, user variables, a
//! named lock. Run on the leader's connection, an audit trigger would record the
//! leader's connection id for every member's row.
//!
//! Group commit asks this once per written table and [`VERDICT_TTL`]
//! (`relay::merge`): the session about to merge reads the table's triggers and
//! column defaults from `information_schema` on its own connection ([`Learn`]),
//! follows every table a trigger body names (triggers fire triggers), asks the
//! server whether each function a body calls is its own (a stored or loadable
//! function's body is not read), and scans each text conservatively ([`scan`]). A
//! table is [`Verdict::Free`] only when nothing found can read the connection;
//! anything heatsink cannot read (a stored function, a procedure, more than
//! [`MAX_ROUNDS`] levels of triggers, triggers its user cannot see) makes it
//! [`Verdict::Bound`], and its writes run alone on their own connections.
//!
//! heatsink's own triggers (names ending in one of [`OWN_TRIGGER_SUFFIXES`], a
//! suffix reserved for them) pick a slot by `CONNECTION_ID()` on purpose: any slot
//! is right. They are not scanned for hazards, but the tables they write are
//! followed.

use std::collections::BTreeSet;
use std::time::Duration;

use super::sqltok::{self, LexMode, Token, TokenKind};

/// How long a verdict stands before the next merging session reads the table again:
/// a trigger created while heatsink serves is seen within this time (or at once
/// after a rule reload).
pub const VERDICT_TTL: Duration = Duration::from_secs(5);

/// Levels of tables followed (the written table, the tables its triggers name, …).
pub const MAX_ROUNDS: usize = 4;

/// Candidate names looked up in one round at most.
const MAX_NAMES: usize = 64;

/// Suffixes of the triggers heatsink creates (`kinds/<kind>/schema.rs`).
pub const OWN_TRIGGER_SUFFIXES: [&str; 13] = [
    "_hs_ai",
    "_hs_log",
    "_hs_seq",
    "_hs_ins",
    "_hs_upd",
    "_hs_del",
    "_hs_bf_ins",
    "_hs_bf_upd",
    "_hs_bf_del",
    "_hs_msg",
    "_hs_fol",
    "_hs_pins",
    "_hs_pupd",
];

/// Functions whose value belongs to the connection that runs them.
const CONNECTION_FUNCTIONS: [&str; 12] = [
    "CONNECTION_ID",
    "LAST_INSERT_ID",
    "ROW_COUNT",
    "FOUND_ROWS",
    "GET_LOCK",
    "RELEASE_LOCK",
    "RELEASE_ALL_LOCKS",
    "IS_FREE_LOCK",
    "IS_USED_LOCK",
    "LASTVAL",
    "WSREP_LAST_SEEN_GTID",
    "WSREP_LAST_WRITTEN_GTID",
];

/// Words that are never table names worth looking up (keeps the queries short).
const NOT_TABLES: [&str; 40] = [
    "INSERT",
    "INTO",
    "VALUES",
    "VALUE",
    "SELECT",
    "FROM",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "NULL",
    "SET",
    "UPDATE",
    "DELETE",
    "REPLACE",
    "BEGIN",
    "END",
    "IF",
    "THEN",
    "ELSE",
    "ELSEIF",
    "DECLARE",
    "INT",
    "IS",
    "ON",
    "DUPLICATE",
    "KEY",
    "AS",
    "CASE",
    "WHEN",
    "IN",
    "EXISTS",
    "NEW",
    "OLD",
    "FOR",
    "EACH",
    "ROW",
    "IGNORE",
    "DEFAULT",
    "LIMIT",
];

/// What group commit may do with writes into a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing the write runs besides its rows reads the connection.
    Free,
    /// Something may (the reason names it), or heatsink could not tell.
    Bound(String),
}

/// What one text (a trigger body, a column default) may do, read conservatively.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Why the text may read the connection, if it may.
    pub hazard: Option<String>,
    /// Names in its INSERT, UPDATE, REPLACE and DELETE statements that may be the
    /// tables they write: (qualifier, name).
    pub names: Vec<(Option<String>, String)>,
    /// Names it calls as functions: (qualifier, name).
    pub calls: Vec<(Option<String>, String)>,
}

/// The text of a word or quoted identifier token.
fn word(text: &[u8], t: &Token) -> Option<String> {
    let raw = &text[t.start..t.end];
    let s = match t.kind {
        TokenKind::Word => std::str::from_utf8(raw).ok()?.to_string(),
        TokenKind::QuotedIdent => {
            let inner = raw.get(1..raw.len().checked_sub(1)?)?;
            std::str::from_utf8(inner).ok()?.replace("``", "`")
        }
        _ => return None,
    };
    Some(s)
}

fn is_punct(text: &[u8], t: Option<&Token>, p: &[u8]) -> bool {
    t.is_some_and(|t| t.kind == TokenKind::Punct && &text[t.start..t.end] == p)
}

/// Scans a trigger body or a column default (as `information_schema` prints it,
/// read under `mode`) for what may read the connection: a variable (`@v`, `@@v`), a
/// function of [`CONNECTION_FUNCTIONS`], `PREVIOUS VALUE FOR`, `CALL`, `TEMPORARY`,
/// or a statement-level `SET` of anything but `NEW.column` or a declared local
/// variable. Also lists the names that may be tables and the names called as
/// functions, for the caller to follow. Text that does not lex is a hazard.
pub fn scan(text: &[u8], mode: LexMode) -> Scan {
    let mut out = Scan::default();
    let tokens = match sqltok::lex(text, mode) {
        Ok(t) => t,
        Err(e) => {
            out.hazard = Some(format!("it cannot be read ({e})"));
            return out;
        }
    };
    let words: Vec<Option<String>> = tokens.iter().map(|t| word(text, t)).collect();
    let upper = |i: usize| {
        words
            .get(i)
            .and_then(|w| w.as_ref())
            .filter(|_| tokens[i].kind == TokenKind::Word)
            .map(|w| w.to_ascii_uppercase())
    };
    // Declared local variables (`DECLARE a, b INT`), which a `SET` may assign.
    let mut locals: BTreeSet<String> = BTreeSet::new();
    for i in 0..tokens.len() {
        if upper(i).as_deref() == Some("DECLARE") {
            let mut j = i + 1;
            while let Some(w) = words.get(j).and_then(|w| w.as_ref()) {
                locals.insert(w.to_ascii_uppercase());
                if is_punct(text, tokens.get(j + 1), b",") {
                    j += 2;
                } else {
                    break;
                }
            }
        }
    }
    let hazard = |out: &mut Scan, why: String| {
        if out.hazard.is_none() {
            out.hazard = Some(why);
        }
    };
    // Inside an INSERT/UPDATE/REPLACE since the statement began, whose SET assigns
    // columns of the table written, or a SIGNAL, whose SET assigns its condition's
    // items: not variables.
    let mut in_dml = false;
    // Inside an INSERT/UPDATE/REPLACE/DELETE: the names that may be tables it writes
    // (only writes fire triggers and fill defaults) are listed.
    let mut writes = false;
    for (i, t) in tokens.iter().enumerate() {
        if t.kind == TokenKind::Variable {
            hazard(
                &mut out,
                format!(
                    "it reads or sets {}",
                    String::from_utf8_lossy(&text[t.start..t.end])
                ),
            );
            continue;
        }
        if is_punct(text, Some(t), b";") {
            in_dml = false;
            writes = false;
            continue;
        }
        let Some(w) = words[i].as_ref() else {
            continue;
        };
        let up = upper(i);
        match up.as_deref() {
            Some("BEGIN" | "THEN" | "ELSE" | "DO" | "LOOP" | "REPEAT") => {
                in_dml = false;
                writes = false;
            }
            Some("INSERT" | "UPDATE" | "REPLACE") => {
                in_dml = true;
                writes = true;
            }
            Some("DELETE") => writes = true,
            Some("SIGNAL" | "RESIGNAL") => in_dml = true,
            Some("CALL") => hazard(&mut out, "it calls a stored procedure".into()),
            Some("TEMPORARY") => hazard(&mut out, "it uses a temporary table".into()),
            Some("PREVIOUS") => hazard(&mut out, "it reads PREVIOUS VALUE FOR".into()),
            Some("SET") if !in_dml => {
                if let Some(why) = set_targets(text, &tokens, &words, i, &locals) {
                    hazard(&mut out, why);
                }
            }
            _ => {}
        }
        if let Some(u) = up.as_deref() {
            if CONNECTION_FUNCTIONS.contains(&u) {
                hazard(&mut out, format!("it calls {u}()"));
            }
        }
        // NEW.x, OLD.x: the row's columns.
        let after_dot = i > 0 && is_punct(text, tokens.get(i - 1), b".");
        let qualifier = (after_dot && i > 1).then(|| words[i - 2].clone()).flatten();
        if qualifier
            .as_deref()
            .is_some_and(|q| q.eq_ignore_ascii_case("NEW") || q.eq_ignore_ascii_case("OLD"))
        {
            continue;
        }
        if is_punct(text, tokens.get(i + 1), b".") {
            // The qualifier of the next name.
            continue;
        }
        // `INSERT INTO t (a, b)`: a table and its column list, not a call.
        let before = if qualifier.is_some() {
            i.checked_sub(3)
        } else {
            i.checked_sub(1)
        };
        let after_table_word = before.and_then(upper).is_some_and(|u| {
            matches!(
                u.as_str(),
                "INTO" | "INSERT" | "REPLACE" | "IGNORE" | "TABLE" | "FROM" | "JOIN" | "UPDATE"
            )
        });
        let name = (qualifier, w.clone());
        if is_punct(text, tokens.get(i + 1), b"(") && !after_table_word {
            out.calls.push(name);
        } else if writes && !up.as_deref().is_some_and(|u| NOT_TABLES.contains(&u)) {
            out.names.push(name);
        }
    }
    out
}

/// Why the targets of the statement-level `SET` at token `at` may be the
/// connection's (anything but `NEW.column` or a declared local), or `None`.
fn set_targets(
    text: &[u8],
    tokens: &[Token],
    words: &[Option<String>],
    at: usize,
    locals: &BTreeSet<String>,
) -> Option<String> {
    let mut depth = 0usize;
    let mut expect_target = true;
    let mut i = at + 1;
    while i < tokens.len() {
        let t = &tokens[i];
        if expect_target {
            let w = words[i].as_ref().map(|w| w.to_ascii_uppercase());
            let ok = match w.as_deref() {
                Some("NEW") => is_punct(text, tokens.get(i + 1), b"."),
                Some(name) => locals.contains(name) && !is_punct(text, tokens.get(i + 1), b"."),
                None => false,
            };
            if !ok {
                return Some(format!(
                    "it sets {}",
                    String::from_utf8_lossy(&text[t.start..t.end])
                ));
            }
            expect_target = false;
        } else if t.kind == TokenKind::Punct {
            match &text[t.start..t.end] {
                b"(" => depth += 1,
                b")" => depth = depth.saturating_sub(1),
                b"," if depth == 0 => expect_target = true,
                b";" => return None,
                _ => {}
            }
        } else if depth == 0
            && words[i]
                .as_deref()
                .is_some_and(|w| w.eq_ignore_ascii_case("END"))
        {
            return None;
        }
        i += 1;
    }
    None
}

/// `sql_mode` text as the lexer's mode.
pub fn lex_mode(sql_mode: &str) -> LexMode {
    let has = |f: &str| {
        sql_mode
            .split(',')
            .any(|m| m.trim().eq_ignore_ascii_case(f))
    };
    LexMode {
        no_backslash_escapes: has("NO_BACKSLASH_ESCAPES"),
        ansi_quotes: has("ANSI_QUOTES") || has("ANSI"),
    }
}

/// Whether a trigger of this name is one of heatsink's own.
pub fn is_own_trigger(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    OWN_TRIGGER_SUFFIXES.iter().any(|s| lower.ends_with(s))
}

/// One row of a [`Learn`] round's answer, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A trigger on `table` named `name` with this body, stored under `sql_mode`;
    /// `None`: the connection's user may not read it (MariaDB shows the body only
    /// with the TRIGGER privilege on the table).
    Trigger {
        db: String,
        table: String,
        name: String,
        body: Option<Vec<u8>>,
        sql_mode: String,
    },
    /// A column default that is not a plain literal.
    Default {
        db: String,
        table: String,
        column: String,
        expr: Vec<u8>,
    },
    /// A name the server lists as a native function or a keyword
    /// (`information_schema.SQL_FUNCTIONS`, `KEYWORDS`): an unqualified call of it
    /// is the server's own function, never a stored one.
    Builtin { name: String },
}

/// The learning of one written table's verdict: a few rounds of one query each.
#[derive(Debug)]
pub struct Learn {
    /// Tables looked up so far (lower-cased db, table).
    seen: BTreeSet<(String, String)>,
    /// Tables to look up in the next round.
    tables: Vec<(String, String)>,
    /// Unqualified function names (upper-cased) to look up in the next round.
    calls: BTreeSet<String>,
    /// Those asked in the round in flight, and those known to be the server's own.
    asking: BTreeSet<String>,
    builtins: BTreeSet<String>,
    rounds: usize,
    /// The written table, and whether heatsink's own trigger must be on it (which
    /// tells that the connection's user can see the table's triggers).
    target: (String, String),
    expects_own_trigger: bool,
    saw_own_trigger: bool,
    verdict: Option<Verdict>,
}

impl Learn {
    /// The learning for writes into `db`.`table`.
    pub fn new(db: &str, table: &str, expects_own_trigger: bool) -> Learn {
        Learn {
            seen: BTreeSet::new(),
            tables: vec![(db.to_string(), table.to_string())],
            calls: BTreeSet::new(),
            asking: BTreeSet::new(),
            builtins: BTreeSet::new(),
            rounds: 0,
            target: (db.to_ascii_lowercase(), table.to_ascii_lowercase()),
            expects_own_trigger,
            saw_own_trigger: false,
            verdict: None,
        }
    }

    /// The verdict, once known.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.verdict.as_ref()
    }

    /// The next round's query, or `None` when the verdict is known. Every name is
    /// sent as hex of its UTF-8 bytes and every text comes back as hex, so that the
    /// connection's character sets do not matter. Columns: kind (`T`, `D`, `B`),
    /// then hex of db, table, name, text, and the trigger's `sql_mode`.
    pub fn query(&mut self) -> Option<String> {
        if self.verdict.is_some() {
            return None;
        }
        let tables: Vec<(String, String)> = std::mem::take(&mut self.tables)
            .into_iter()
            .filter(|(db, t)| {
                self.seen
                    .insert((db.to_ascii_lowercase(), t.to_ascii_lowercase()))
            })
            .collect();
        let calls: Vec<String> = std::mem::take(&mut self.calls)
            .into_iter()
            .filter(|c| !self.builtins.contains(c))
            .collect();
        if tables.is_empty() && calls.is_empty() {
            self.finish();
            return None;
        }
        if self.rounds >= MAX_ROUNDS {
            self.bind(format!(
                "its triggers fire triggers more than {MAX_ROUNDS} tables deep"
            ));
            return None;
        }
        if tables.len() + calls.len() > MAX_NAMES {
            self.bind("its triggers name more tables and functions than heatsink follows".into());
            return None;
        }
        self.rounds += 1;
        let mut parts = Vec::new();
        for (db, t) in &tables {
            let (db, t) = (hex_str(db), hex_str(t));
            parts.push(format!(
                "SELECT 'T', HEX(EVENT_OBJECT_SCHEMA), HEX(EVENT_OBJECT_TABLE), HEX(TRIGGER_NAME), \
                 HEX(ACTION_STATEMENT), SQL_MODE FROM information_schema.TRIGGERS \
                 WHERE EVENT_OBJECT_SCHEMA = {db} AND EVENT_OBJECT_TABLE = {t}"
            ));
            parts.push(format!(
                "SELECT 'D', HEX(TABLE_SCHEMA), HEX(TABLE_NAME), HEX(COLUMN_NAME), \
                 HEX(COLUMN_DEFAULT), '' FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = {db} AND TABLE_NAME = {t} AND COLUMN_DEFAULT IS NOT NULL"
            ));
        }
        for f in &calls {
            let f = hex_str(f);
            parts.push(format!(
                "SELECT 'B', '', '', HEX(UPPER(FUNCTION)), '', '' \
                 FROM information_schema.SQL_FUNCTIONS WHERE FUNCTION = {f}"
            ));
            parts.push(format!(
                "SELECT 'B', '', '', HEX(UPPER(WORD)), '', '' \
                 FROM information_schema.KEYWORDS WHERE WORD = {f}"
            ));
        }
        self.asking = calls.into_iter().collect();
        Some(parts.join(" UNION ALL "))
    }

    /// Takes one round's rows (`None`: a row heatsink could not decode, or the
    /// query failed).
    pub fn take(&mut self, rows: impl IntoIterator<Item = Option<Found>>) {
        for row in rows {
            match row {
                None => self.bind("its triggers or defaults could not be read".into()),
                Some(f) => self.take_one(f),
            }
        }
        let asked = std::mem::take(&mut self.asking);
        if let Some(f) = asked.iter().find(|f| !self.builtins.contains(*f)) {
            self.bind(format!(
                "a trigger calls {f}(), a stored or loadable function whose body heatsink does not read"
            ));
        }
    }

    fn take_one(&mut self, f: Found) {
        match f {
            Found::Trigger {
                db,
                table,
                name,
                body,
                sql_mode,
            } => {
                let own = is_own_trigger(&name);
                if own && (db.to_ascii_lowercase(), table.to_ascii_lowercase()) == self.target {
                    self.saw_own_trigger = true;
                }
                let Some(body) = body else {
                    // heatsink's own triggers write heatsink's tables; another's
                    // body must be read.
                    if !own {
                        self.bind(format!(
                            "trigger `{db}`.`{name}` on `{table}` cannot be read by the connection's user (no TRIGGER privilege)"
                        ));
                    }
                    return;
                };
                let s = scan(&body, lex_mode(&sql_mode));
                if !own {
                    if let Some(why) = s.hazard {
                        return self.bind(format!("trigger `{db}`.`{name}` on `{table}`: {why}"));
                    }
                }
                self.follow(&db, &name, s);
            }
            Found::Default {
                db,
                table,
                column,
                expr,
            } => {
                let s = scan(&expr, LexMode::default());
                if let Some(why) = s.hazard {
                    self.bind(format!("the default of `{db}`.`{table}`.`{column}`: {why}"));
                }
            }
            Found::Builtin { name } => {
                self.builtins.insert(name.to_ascii_uppercase());
            }
        }
    }

    /// Queues the names trigger `name` of database `db` mentions.
    fn follow(&mut self, db: &str, name: &str, s: Scan) {
        for (q, n) in s.names {
            self.tables.push((q.unwrap_or_else(|| db.to_string()), n));
        }
        for (q, n) in s.calls {
            match q {
                Some(q) => self.bind(format!(
                    "trigger `{db}`.`{name}` calls `{q}`.`{n}`, a stored function whose body heatsink does not read"
                )),
                None => {
                    self.calls.insert(n.to_ascii_uppercase());
                }
            }
        }
    }

    fn bind(&mut self, why: String) {
        if self.verdict.is_none() {
            self.verdict = Some(Verdict::Bound(why));
        }
    }

    fn finish(&mut self) {
        if self.verdict.is_some() {
            return;
        }
        self.verdict = Some(if self.expects_own_trigger && !self.saw_own_trigger {
            Verdict::Bound(
                "the connection's user cannot see the table's triggers (no TRIGGER privilege)"
                    .into(),
            )
        } else {
            Verdict::Free
        });
    }
}

/// `_utf8mb4 X'…'` of a name's UTF-8 bytes: a constant `information_schema` looks
/// up by key (measured with EXPLAIN: "Scanned 0 databases"; `CONVERT(X'…' USING
/// utf8mb4)` scans every database, opening every table's definition).
fn hex_str(s: &str) -> String {
    let mut out = String::with_capacity(2 * s.len() + 16);
    out.push_str("_utf8mb4 X'");
    for b in s.bytes() {
        out.push_str(&format!("{b:02X}"));
    }
    out.push('\'');
    out
}

/// Decodes the hex the [`Learn::query`] columns carry.
pub fn unhex(h: &[u8]) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    h.chunks(2)
        .map(|p| {
            let s = std::str::from_utf8(p).ok()?;
            u8::from_str_radix(s, 16).ok()
        })
        .collect()
}

/// One row of a [`Learn::query`] answer (its six text cells) as a [`Found`].
pub fn found(cells: &[Option<&[u8]>]) -> Option<Found> {
    let text = |i: usize| -> Option<Vec<u8>> { unhex(cells.get(i).copied().flatten()?) };
    let string = |i: usize| -> Option<String> { String::from_utf8(text(i)?).ok() };
    match cells.first().copied().flatten()? {
        b"T" => Some(Found::Trigger {
            db: string(1)?,
            table: string(2)?,
            name: string(3)?,
            body: match cells.get(4).copied().flatten() {
                None => None,
                Some(h) => Some(unhex(h)?),
            },
            sql_mode: String::from_utf8(cells.get(5).copied().flatten()?.to_vec()).ok()?,
        }),
        b"D" => Some(Found::Default {
            db: string(1)?,
            table: string(2)?,
            column: string(3)?,
            expr: text(4)?,
        }),
        b"B" => Some(Found::Builtin { name: string(3)? }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hazard(text: &str) -> Option<String> {
        scan(text.as_bytes(), LexMode::default()).hazard
    }

    #[test]
    fn connection_reads_are_hazards() {
        for t in [
            "INSERT INTO audit VALUES (NEW.user_id, CONNECTION_ID())",
            "SET NEW.note = LAST_INSERT_ID()",
            "BEGIN IF @block = 1 THEN SIGNAL SQLSTATE '45000'; END IF; END",
            "SET NEW.who = @@pseudo_thread_id",
            "BEGIN DO GET_LOCK('x', 1); END",
            "CALL log_it(NEW.id)",
            "BEGIN SET time_zone = '+00:00'; END",
            "BEGIN SET NEW.a = 1, sql_mode = ''; END",
            "SET NEW.a = PREVIOUS VALUE FOR s",
            "BEGIN CREATE TEMPORARY TABLE t (a INT); END",
            "SET NEW.a = row_count ()",
            "/*!50000 SET NEW.a = connection_id() */",
            "connection_id()",
            "@`x`",
            "@@pseudo_thread_id",
        ] {
            assert!(hazard(t).is_some(), "{t}");
        }
    }

    #[test]
    fn statement_values_are_not_hazards() {
        for t in [
            "SET NEW.created = NOW()",
            "INSERT INTO audit (id, at) VALUES (NEW.id, NOW(6))",
            "BEGIN DECLARE n, m INT DEFAULT 0; SET n = NEW.a + 1, m = n; SET NEW.b = n; END",
            "UPDATE stats SET cnt = cnt + 1 WHERE track = NEW.track_id",
            "INSERT INTO stats (track, cnt) VALUES (NEW.track_id, 1) ON DUPLICATE KEY UPDATE cnt = cnt + 1",
            "BEGIN IF NEW.a < 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'negative'; END IF; END",
            "SET NEW.note = '@CONNECTION_ID()'",
            "SET NEW.note = CONCAT(USER(), ' ', DATABASE())",
            "current_timestamp()",
            "'x'",
        ] {
            assert_eq!(hazard(t), None, "{t}");
        }
    }

    #[test]
    fn names_and_calls_are_listed() {
        let s = scan(
            b"BEGIN INSERT INTO audit VALUES (NEW.a, f(NEW.b)); UPDATE other.t SET x = g.h(1); END",
            LexMode::default(),
        );
        assert!(s.names.contains(&(None, "audit".into())));
        assert!(s.names.contains(&(Some("other".into()), "t".into())));
        assert!(s.calls.contains(&(None, "f".into())));
        assert!(s.calls.contains(&(Some("g".into()), "h".into())));
        assert!(!s.names.iter().any(|(_, n)| n == "a" || n == "b"));
        let s = scan(
            b"BEGIN IF (SELECT COUNT(*) FROM quota) > 0 THEN SET NEW.a = 1; END IF; END",
            LexMode::default(),
        );
        assert!(
            s.names.is_empty(),
            "a table only read is not followed: {s:?}"
        );
        let s = scan(
            b"INSERT INTO app.r (k, n) VALUES (NEW.k, 1) ON DUPLICATE KEY UPDATE n = n + VALUES(n)",
            LexMode::default(),
        );
        assert!(s.names.contains(&(Some("app".into()), "r".into())), "{s:?}");
        assert!(!s.calls.iter().any(|(_, n)| n == "r"), "{s:?}");
    }

    #[test]
    fn own_triggers_are_recognised_by_suffix() {
        assert!(is_own_trigger("plays_by_track_hour_hs_ins"));
        assert!(is_own_trigger("VISITS_RING_HS_SEQ"));
        assert!(!is_own_trigger("plays_audit"));
        for s in [
            crate::kinds::counter::schema::TRIGGER_SUFFIX,
            crate::kinds::ring::schema::RING_TRIGGER_SUFFIX,
            crate::kinds::ring::schema::SEQ_TRIGGER_SUFFIX,
        ] {
            assert!(OWN_TRIGGER_SUFFIXES.contains(&s), "{s}");
        }
    }

    fn trigger(table: &str, name: &str, body: &str) -> Option<Found> {
        Some(Found::Trigger {
            db: "app".into(),
            table: table.into(),
            name: name.into(),
            body: Some(body.as_bytes().to_vec()),
            sql_mode: "STRICT_TRANS_TABLES".into(),
        })
    }

    #[test]
    fn learning_follows_written_tables() {
        let mut l = Learn::new("app", "plays", true);
        let q = l.query().expect("first round");
        assert!(q.contains("information_schema.TRIGGERS"));
        l.take([
            trigger(
                "plays",
                "r_hs_ins",
                "UPDATE r SET n = n + 1 WHERE s = CONNECTION_ID() % 8",
            ),
            trigger("plays", "plays_audit", "INSERT INTO audit VALUES (NEW.id)"),
        ]);
        assert_eq!(l.verdict(), None);
        let q = l.query().expect("second round");
        assert!(q.contains(&hex_str("audit")), "{q}");
        l.take([trigger(
            "audit",
            "audit_who",
            "SET NEW.who = CONNECTION_ID()",
        )]);
        match l.verdict() {
            Some(Verdict::Bound(why)) => assert!(why.contains("audit_who"), "{why}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn learning_ends_free_when_nothing_reads_the_connection() {
        let mut l = Learn::new("app", "plays", true);
        l.query();
        l.take([trigger("plays", "r_hs_ins", "UPDATE r SET n = n + 1")]);
        while l.query().is_some() {
            l.take([]);
        }
        assert_eq!(l.verdict(), Some(&Verdict::Free));
    }

    #[test]
    fn unreadable_bodies_bind_unless_heatsink_wrote_them() {
        let unread = |name: &str| {
            Some(Found::Trigger {
                db: "app".into(),
                table: "plays".into(),
                name: name.into(),
                body: None,
                sql_mode: String::new(),
            })
        };
        let mut l = Learn::new("app", "plays", true);
        l.query();
        l.take([unread("r_hs_ins")]);
        assert!(l.query().is_none());
        assert_eq!(l.verdict(), Some(&Verdict::Free));
        let mut l = Learn::new("app", "plays", true);
        l.query();
        l.take([unread("r_hs_ins"), unread("plays_audit")]);
        assert!(
            matches!(l.verdict(), Some(Verdict::Bound(why)) if why.contains("TRIGGER privilege"))
        );
    }

    #[test]
    fn unseen_own_trigger_means_unverified() {
        let mut l = Learn::new("app", "plays", true);
        l.query();
        l.take([]);
        assert!(l.query().is_none());
        assert!(matches!(l.verdict(), Some(Verdict::Bound(_))));
        let mut l = Learn::new("app", "slots", false);
        l.query();
        l.take([]);
        assert!(l.query().is_none());
        assert_eq!(l.verdict(), Some(&Verdict::Free));
    }

    #[test]
    fn stored_routines_and_defaults_bind() {
        let mut l = Learn::new("app", "plays", false);
        l.query();
        l.take([Some(Found::Default {
            db: "app".into(),
            table: "plays".into(),
            column: "who".into(),
            expr: b"connection_id()".to_vec(),
        })]);
        assert!(matches!(l.verdict(), Some(Verdict::Bound(_))));
        // A call the server does not list as its own is a stored function.
        let mut l = Learn::new("app", "plays", false);
        l.query();
        l.take([trigger("plays", "t", "SET NEW.a = f(NEW.b), NEW.c = NOW()")]);
        let q = l.query().expect("function round");
        assert!(q.contains("SQL_FUNCTIONS"));
        l.take([Some(Found::Builtin { name: "NOW".into() })]);
        assert!(matches!(l.verdict(), Some(Verdict::Bound(why)) if why.contains("F()")));
        // Builtins only: free.
        let mut l = Learn::new("app", "plays", false);
        l.query();
        l.take([trigger(
            "plays",
            "t",
            "SET NEW.c = IF(NEW.a > 0, NOW(), NULL)",
        )]);
        l.query().expect("function round");
        l.take([
            Some(Found::Builtin { name: "NOW".into() }),
            Some(Found::Builtin { name: "IF".into() }),
        ]);
        assert!(l.query().is_none());
        assert_eq!(l.verdict(), Some(&Verdict::Free));
        // A qualified call always names a stored function.
        let mut l = Learn::new("app", "plays", false);
        l.query();
        l.take([trigger("plays", "t", "SET NEW.a = app.f(NEW.b)")]);
        assert!(matches!(l.verdict(), Some(Verdict::Bound(_))));
    }

    #[test]
    fn rows_decode_from_hex() {
        let cells: Vec<Option<&[u8]>> = vec![
            Some(b"T"),
            Some(b"617070"),
            Some(b"74"),
            Some(b"78"),
            Some(b"53455420"),
            Some(b"ANSI"),
        ];
        assert_eq!(
            found(&cells),
            Some(Found::Trigger {
                db: "app".into(),
                table: "t".into(),
                name: "x".into(),
                body: Some(b"SET ".to_vec()),
                sql_mode: "ANSI".into(),
            })
        );
        assert_eq!(unhex(b"4"), None);
        assert!(lex_mode("ANSI,NO_BACKSLASH_ESCAPES").ansi_quotes);
    }
}
