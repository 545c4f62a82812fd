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
//! - [`Rule`]: one implementation per rule kind, each in its own file. A rule sees a
//!   parsed statement and returns what to run instead, or a reason to refuse it.
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
//! - Strings the rule introduces itself are printed by sqlparser without backslash
//!   escaping: keep them free of quotes and backslashes.

mod cache;
pub mod counter;
mod engine;
pub mod prefilter;
pub mod ring;
pub mod shape;
pub mod sqltok;
#[cfg(test)]
mod testutil;

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use sqlparser::ast::{Expr, ObjectName, Statement, Value};

pub use engine::{parse_statements, Engine};
pub use sqltok::{LiteralKind, Slot};

/// A statement's fingerprint: literals replaced by `?`, parameters by `?p`,
/// comments dropped, whitespace and reserved words normalised. Used in logs, where a
/// statement must not show literal values; text that cannot be lexed is summarised.
pub fn fingerprint(sql: &[u8]) -> String {
    match sqltok::lex(sql) {
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

/// What the connection knows about the statement it is about to forward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// The statement names the table of a rule in shadow mode: forward the original
    /// untouched, and count and log the decision the rule would have made (a
    /// `Rewrite` or a `Reject`).
    Shadow(Box<Decision>),
    /// A rule needs to learn something from the database before it can plan (for
    /// example the logical table's columns): run [`MetadataRequest::sql`] on the
    /// client's own connection, hand the column definitions to
    /// [`Engine::provide_metadata`], and decide again.
    NeedMetadata(MetadataRequest),
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
    /// Whether and how concurrent autocommit executions of this rewrite for the same
    /// target may be merged into one write (see [`Plan::merge`]).
    pub merge: Merge,
}

/// How concurrent autocommit executions of a rewrite may be merged into one write by
/// the connection layer's group commit (`relay::coalesce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Merge {
    /// Never: every execution runs its own statements.
    #[default]
    No,
    /// A counter increment; `aux` holds `[prefix, key values, suffix, slot,
    /// delta…]`: merged increments become one upsert of the summed deltas.
    Increment,
    /// A ring insert; `aux` holds `[prefix, VALUES tuples, suffix, key values of
    /// the first row, row count, AUTO_INCREMENT column (quoted) or empty]`: merged
    /// inserts become one multi-row upsert, `prefix` + tuples ordered by key +
    /// `suffix`. (Ring inserts that do not merge carry the same `aux`.)
    RingInsert,
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
}

/// A table a rule is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    /// The database, or `None` for a table of this name in any database.
    pub db: Option<Arc<str>>,
    /// The table name (unqualified). Matched ASCII case-insensitively.
    pub name: Arc<str>,
}

impl TableName {
    /// A table name, optionally qualified by its database.
    pub fn new(db: Option<&str>, name: &str) -> Self {
        TableName {
            db: db.map(Arc::from),
            name: Arc::from(name),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.db {
            Some(db) => write!(f, "{db}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
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
    /// execution) but not run: pieces a rule kind's executor reassembles, such as
    /// the parts of a mergeable increment.
    pub aux: Vec<String>,
    /// Executions may be merged by the connection layer's group commit; `aux` then
    /// holds the pieces [`Merge`] describes.
    pub merge: Merge,
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
/// same fingerprint, current database and protocol.
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

/// A value the proxy chooses each time a rewrite is rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dynamic {
    /// A uniformly random integer in `0..n` (`n` ≥ 1).
    RandomBelow(u32),
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
            qualifiers: Vec::new(),
            reads: RefCell::new(Vec::new()),
            dynamics: RefCell::new(Vec::new()),
        }
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
mod fingerprint_tests {
    #[test]
    fn fingerprints_hide_literal_values() {
        let f = super::fingerprint(b"UPDATE hits SET cnt = cnt + 5 WHERE slug = 'secret' /* c */");
        assert!(!f.contains("secret") && !f.contains('5'), "{f}");
        assert!(f.contains("hits"), "{f}");
        assert_eq!(
            super::fingerprint(b"SELECT 'a"),
            "<9 bytes that do not lex>"
        );
    }
}
