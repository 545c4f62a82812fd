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
//! - `rule.rs`, the kind SDK: [`Rule`] has one implementation per rule kind, each
//!   in its own folder (`kinds/<kind>/`). A rule sees a parsed statement with a
//!   [`PlanContext`] and returns a [`Plan`] (what to run instead), or a
//!   [`Refusal`].
//! - `refusal.rs`: [`Refusal`], why a planner refuses a statement: a reason and its
//!   [`RefusalClass`], from a closed set a DBA can act on (`SHOW REFUSALS`).
//! - `decision.rs`: what the engine hands the connection for one statement
//!   ([`Decision`]: [`Rewritten`] with its [`Reply`], [`Rejection`], [`Fallback`],
//!   [`MetadataRequest`]), the [`StatementContext`] it decides in, and the
//!   [`ParamCheck`]s a prepared statement's values must pass at execute.
//! - `charset.rs`: how a session reads statements ([`Lexing`]: the client
//!   [`Charset`] and `sql_mode` flags), the [`SESSION_STATE_QUERY`] that learns it,
//!   [`may_change_lexing`], and the [`fingerprint`] of a statement for logs.
//! - `cluster.rs`: what a session learns of its Galera node ([`ClusterInfo`],
//!   [`NodeShare`]).
//! - `shape.rs`: helpers the kinds share to recognise statement shapes.
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
//! - Match the statement shapes you can rewrite faithfully; return `Err(refusal)` for
//!   any other shape that touches your table in a way that would read or write stale
//!   data, and `Ok(None)` for statements that are fine as they are. A [`Refusal`] is
//!   made with the constructor of its [`RefusalClass`] (`Refusal::shape("…")`,
//!   `Refusal::value(…)`, …): the class says what kind of obstacle it is, the text
//!   reaches the client.
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

pub mod bound;
mod cache;
mod charset;
mod cluster;
mod decision;
mod engine;
pub mod merge;
pub mod prefilter;
mod refusal;
mod rule;
pub mod shape;
pub mod sqltok;
#[cfg(test)]
pub(crate) mod testutil;

pub use crate::rules::spec::TableName;
pub use charset::{
    fingerprint, fingerprint_in, may_change_lexing, Charset, CharsetClass, Lexing,
    SESSION_STATE_QUERY, SESSION_STATE_QUERY_PLAIN,
};
pub use cluster::{ClusterInfo, NodeShare};
pub use decision::{
    Affected, ColumnPatch, Decision, Fallback, Holed, MetadataRequest, ParamCheck, PlanFlags,
    PreludeValues, Probe, Rejection, RenderedPrelude, Reply, Rewritten, StatementContext,
    EXPLAIN_JSON,
};
pub use engine::{parse_statements, Engine, EngineError, MAX_NESTING};
pub use merge::{MergeTable, Merger};
pub use refusal::{Refusal, RefusalClass};
pub use rule::{
    table_db, Literal, Plan, PlanContext, Prelude, Rule, INCREMENT_DECLINED, PLAN_UNTOLD,
    PRELUDE_DECLINED, UPSERT_DECLINED,
};
pub(crate) use rule::{Dynamic, SPELLING};
pub use sqltok::{LexMode, LiteralClass, LiteralKind, Slot};
