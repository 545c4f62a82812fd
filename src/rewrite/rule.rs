//! The kind SDK: what a rule kind implements ([`Rule`]) and what it may call while
//! planning ([`PlanContext`]), and what it answers with ([`Plan`], [`Prelude`]).

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use sqlparser::ast::{Expr, ObjectName, Statement, Value};

use super::decision::{ParamCheck, PlanFlags, PreludeValues, Reply};
use super::merge::Merger;
use super::refusal::Refusal;
use super::sqltok::{self, LiteralClass, LiteralKind, Slot};
use crate::rules::spec::TableName;

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
    /// How the client's answer is built (see [`Rewritten::reply`](super::Rewritten::reply)).
    pub reply: Reply,
    /// The statements must commit together (see [`Rewritten::atomic`](super::Rewritten::atomic)).
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
    /// The reply's column flags depend on the plan the server picks for the
    /// original statement, which only the server can tell: the connection asks it
    /// (`EXPLAIN FORMAT=JSON` of the client's statement, in the prelude's round trip
    /// when there is one, pipelined with the execute of a prepared statement) and
    /// patches the reply with the [`ColumnPatch`](super::ColumnPatch) this gives for
    /// that plan. When the server's answer does not tell (an error, a plan of
    /// another form), the client's statement runs as sent, counted as the rule's
    /// fallback. [`Plan::reply`] must be [`Reply::Patched`].
    pub plan_flags: Option<Arc<dyn PlanFlags>>,
    /// When a statement of the rewrite fails (other than by a lock conflict, which
    /// is retried, or an interruption), nothing of it is kept and the client's own
    /// statement runs as sent, counted as the rule's fallback for this reason: for
    /// rewrites that may do what the statement would not (an increment that creates
    /// its key's row), whose failure then says nothing about the statement. The
    /// statements must fail as a whole: one statement, or [`Plan::atomic`].
    pub as_sent_on_error: Option<&'static str>,
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

/// The reason shown (`SHOW FALLBACKS`) for an `INSERT … ON DUPLICATE KEY UPDATE`
/// whose rewrite was undone and that ran as sent because the table did not take its
/// row as a plain insert or a duplicate of its key (see
/// [`Affected::InsertedOrUpdated`](super::Affected::InsertedOrUpdated)).
pub const UPSERT_DECLINED: &str = "the table converted or refused the inserted row, or matched it on another unique key (a value MariaDB converts, a foreign key, a duplicate of another key), which the rewrite cannot answer as the statement would";

/// The reason shown (`SHOW FALLBACKS`) for a counter increment whose rewrite failed
/// and that ran as sent (see [`Plan::as_sent_on_error`]): most often the table
/// refused the row the increment of a key without one creates, where the UPDATE
/// matches no row and changes nothing.
pub const INCREMENT_DECLINED: &str = "the increment's rewrite failed (the table refused the row it creates for a key without one: a foreign key, a CHECK, a column without a default, another unique key, a trigger), which the UPDATE itself would not have done";

/// The reason shown (`SHOW FALLBACKS`) for a statement forwarded unchanged because
/// the server's plan of it did not tell its reply's column flags (see
/// [`Plan::plan_flags`]).
pub const PLAN_UNTOLD: &str =
    "the server's plan of this statement (EXPLAIN) did not tell its column flags";

impl PartialEq for Prelude {
    fn eq(&self, other: &Self) -> bool {
        self.query == other.query
            && *self.values == *other.values
            && self.statements == other.statements
            && self.original_on_decline == other.original_on_decline
    }
}

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
    /// - `Err(refusal)`: refuse the statement; its reason reaches the client, its
    ///   class `SHOW REFUSALS` and the refusal metric.
    ///
    /// In `stmt`, literals and parameters usually appear as markers: values of
    /// [`Value::Placeholder`] such as `?3`. Inspect them with [`PlanContext::slot`] and
    /// [`PlanContext::literal`], which also understand plain literals (a statement
    /// whose literals could not be marked arrives with them as parsed values).
    fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal>;

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
