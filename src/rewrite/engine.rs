//! The engine: rules + scanner + plan cache, and the per-statement decision.

use crate::wire::packets::Renames;
use std::borrow::Cow;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sqlparser::ast::Statement;
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::{Parser, ParserError, ParserOptions};

use super::cache::{self, Cached, KeyKind, PlanCache, Template};
use super::prefilter::Prefilter;
use super::sqltok::{self, Mode, Slot, Token, TokenKind};
use super::{
    CharsetClass, Decision, Dynamic, Fallback, Lexing, Plan, PlanContext, Refusal, Rejection, Rule,
    StatementContext,
};

/// Parse SQL text the way the engine does: MySQL dialect, literals kept as written
/// (no unescaping), so printing a statement reproduces its literals. Rules can use
/// it to build their output from SQL text (format marker expressions into the text;
/// they print as `?N` and parse back as the same markers).
pub fn parse_statements(text: &str) -> Result<Vec<Statement>, ParserError> {
    Parser::new(&MySqlDialect {})
        .with_options(ParserOptions::new().with_unescape(false))
        .try_with_sql(text)?
        .parse_statements()
}

/// The deepest expression nesting ([`sqltok::nesting_bound`]) of a statement the
/// engine parses. The parser, the AST visitors, the printer and the drop of the tree
/// recurse along it; at this bound they use about half of the worker threads' stack
/// in a debug build ([`crate::WORKER_STACK_BYTES`]; measured by the counter rule's
/// `deep_statements_fit_a_worker_stack`), a fraction of it in a release build.
pub const MAX_NESTING: usize = 500;

/// All tables of one (lowercased) name that rules are about.
#[derive(Debug)]
struct Pattern {
    /// The unqualified name, lowercase.
    name: Box<[u8]>,
    /// `(rule index, database the rule requires)` for each rule table of this name.
    tables: Vec<(usize, Option<Arc<str>>)>,
}

/// An immutable snapshot of the rules, with its own plan cache.
///
/// Cheap to share (`Arc<Engine>`); [`Engine::decide`] takes `&self` and is safe to
/// call from any number of connections at once. To change rules, build a new engine
/// and swap it in: the old cache goes away with the old rules.
pub struct Engine {
    /// The rules, in the order given (the order in which they are consulted).
    rules: Vec<Arc<dyn Rule>>,
    /// Each rule's name, shared into every [`Rejection`] and [`super::Rewritten`].
    names: Vec<Arc<str>>,
    /// Scanner over the table names; `None` when there are no rules.
    prefilter: Option<Prefilter>,
    /// Per scanner pattern id: which rules name a table of that name.
    patterns: Vec<Pattern>,
    /// Outcomes by fingerprint (or exact text, or fingerprint + literal values).
    cache: PlanCache,
    /// Number of statements parsed (plan cache misses), for metrics and tests.
    parses: AtomicU64,
    /// See [`Engine::message_names`].
    message_names: Option<Arc<Renames>>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("rules", &self.names)
            .field("cache", &self.cache)
            .field("parses", &self.parses.load(Ordering::Relaxed))
            .finish()
    }
}

/// A statement that names a ruled table, with what the lexer found in it.
struct Named<'s, 'c> {
    /// The statement bytes.
    sql: &'s [u8],
    /// Its tokens.
    tokens: Vec<Token>,
    /// Its literal tokens, in order (literal #i of the templates).
    literals: Vec<Token>,
    /// Indices of the rules whose tables it names, ascending.
    rules: Vec<usize>,
    /// The first ruled table name found, as written (for error messages).
    table: String,
    /// The character set and `sql_mode` flags it was read under.
    lexing: Lexing,
    /// (table, database) of each db-qualified ruled table name, as written.
    qualifiers: Vec<(String, String)>,
    /// The connection's context.
    ctx: &'c StatementContext<'c>,
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

impl Engine {
    /// An engine without rules: everything passes through.
    pub fn empty() -> Self {
        Engine {
            rules: Vec::new(),
            names: Vec::new(),
            prefilter: None,
            patterns: Vec::new(),
            cache: PlanCache::new(0),
            parses: AtomicU64::new(0),
            message_names: None,
        }
    }

    /// Build an engine over `rules`, caching about `cache_capacity` plans (a plan
    /// weighs one unit per started KiB of key and template; most weigh 1).
    ///
    /// Rule names must be non-empty and unique; every rule must name at least one
    /// table; two rules may not name the same table (a rule without a database
    /// overlaps every database).
    pub fn new(rules: Vec<Arc<dyn Rule>>, cache_capacity: u64) -> Result<Self, EngineError> {
        if rules.is_empty() {
            return Ok(Engine::empty());
        }
        let mut names: Vec<Arc<str>> = Vec::with_capacity(rules.len());
        // Lookups by name, so that building stays linear in the number of rules.
        let mut unique: std::collections::HashSet<&str> =
            std::collections::HashSet::with_capacity(rules.len());
        for r in &rules {
            let name = r.name();
            if name.is_empty() {
                return Err(EngineError::EmptyRuleName);
            }
            if !unique.insert(name) {
                return Err(EngineError::DuplicateRule(name.to_string()));
            }
            names.push(Arc::from(name));
        }
        let mut patterns: Vec<Pattern> = Vec::new();
        let mut pattern_of: std::collections::HashMap<Box<[u8]>, usize> =
            std::collections::HashMap::new();
        for (ri, r) in rules.iter().enumerate() {
            if r.tables().is_empty() {
                return Err(EngineError::NoTables(names[ri].to_string()));
            }
            for t in r.tables() {
                if t.name.is_empty() {
                    return Err(EngineError::EmptyTableName(names[ri].to_string()));
                }
                let lower: Box<[u8]> = t.name.to_ascii_lowercase().into_bytes().into();
                let pi = match pattern_of.get(&lower) {
                    Some(&pi) => pi,
                    None => {
                        pattern_of.insert(lower.clone(), patterns.len());
                        patterns.push(Pattern {
                            name: lower,
                            tables: Vec::new(),
                        });
                        patterns.len() - 1
                    }
                };
                let p = &mut patterns[pi];
                for (other, db) in &p.tables {
                    let overlap = match (db, &t.db) {
                        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
                        _ => true,
                    };
                    let shared = r.sharing().is_some() && rules[*other].sharing().is_some();
                    if *other != ri && overlap && !shared {
                        return Err(EngineError::SharedTable {
                            first: names[*other].to_string(),
                            second: names[ri].to_string(),
                            table: t.to_string(),
                        });
                    }
                }
                p.tables.push((ri, t.db.as_deref().map(Arc::from)));
            }
        }
        introduce_sharing_rules(&rules, &patterns);
        let prefilter = Prefilter::new(patterns.iter().map(|p| &p.name))
            .map_err(|e| EngineError::Prefilter(e.to_string()))?;
        let message_names: Vec<(Vec<u8>, Vec<u8>)> = rules
            .iter()
            .flat_map(|r| r.physical_tables())
            .flat_map(|(physical, logical)| message_renames(&physical, &logical))
            .collect();
        Ok(Engine {
            rules,
            names,
            prefilter: Some(prefilter),
            patterns,
            cache: PlanCache::new(cache_capacity),
            parses: AtomicU64::new(0),
            message_names: (!message_names.is_empty()).then(|| Arc::from(message_names)),
        })
    }

    /// Names to replace in the server's messages about rewritten statements (errors,
    /// SHOW WARNINGS): the rules' physical tables by their logical ones. `None` when
    /// no rule has any.
    pub fn message_names(&self) -> Option<Arc<Renames>> {
        self.message_names.clone()
    }

    /// Whether any rule is loaded (if not, every statement passes through).
    pub fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Whether a rule in force may merge concurrent writes (group commit); shadow
    /// rules rewrite nothing.
    pub fn merges(&self) -> bool {
        self.rules.iter().any(|r| r.merges() && !r.shadow())
    }

    /// Hands a rule the answer to its [`Rule::metadata_query`]. Plans made so far
    /// did not need it (the rule was never asked to plan without it), so the cache
    /// stays valid.
    pub fn provide_metadata(
        &self,
        rule: usize,
        current_db: Option<&str>,
        columns: &[crate::wire::resultset::ColumnDef],
    ) {
        if let Some(r) = self.rules.get(rule) {
            r.provide_metadata(current_db, columns);
        }
    }

    /// [`Engine::provide_metadata`] with the server's answer to the rule's query:
    /// the other rules sharing a table that ask the same query get it too (one round
    /// trip for all the rollups of a log, not one each).
    pub fn provide_server_metadata(
        &self,
        rule: usize,
        current_db: Option<&str>,
        columns: &[crate::wire::resultset::ColumnDef],
    ) {
        let Some(r) = self.rules.get(rule) else {
            return;
        };
        if r.sharing().is_some() {
            if let Some(query) = r.metadata_query(current_db) {
                for other in self.rules.iter().filter(|o| o.sharing().is_some()) {
                    if other.metadata_query(current_db).as_deref() == Some(query.as_str()) {
                        other.provide_metadata(current_db, columns);
                    }
                }
                return;
            }
        }
        r.provide_metadata(current_db, columns);
    }

    /// The rules, in the order they are consulted.
    pub fn rules(&self) -> &[Arc<dyn Rule>] {
        &self.rules
    }

    /// How many times a statement was parsed to build a plan (plan cache misses).
    pub fn parses(&self) -> u64 {
        self.parses.load(Ordering::Relaxed)
    }

    /// Decide what to do with one statement (the data-path call).
    ///
    /// `sql` is the statement as the client sent it (COM_QUERY / COM_STMT_PREPARE
    /// payload), in the connection's character set.
    #[inline]
    pub fn decide(&self, sql: &[u8], ctx: &StatementContext<'_>) -> Decision {
        let Some(prefilter) = &self.prefilter else {
            return Decision::Passthrough;
        };
        let hits = prefilter.scan(sql);
        if hits.is_empty() {
            return Decision::Passthrough;
        }
        let d = self.decide_named(sql, ctx, &hits);
        match &d {
            Decision::Rewrite(crate::rewrite::Rewritten { rule, .. })
            | Decision::Reject(Rejection { rule, .. })
                if self.is_shadow(rule) =>
            {
                Decision::Shadow(Box::new(d))
            }
            _ => d,
        }
    }

    /// Whether the rule of this name lets statements it cannot read run as sent
    /// ([`Rule::runs_unread`]).
    pub fn rule_runs_unread(&self, rule: &str) -> bool {
        self.names
            .iter()
            .zip(&self.rules)
            .any(|(n, r)| &**n == rule && r.runs_unread())
    }

    /// Whether the rule of this name runs in shadow mode.
    fn is_shadow(&self, rule: &str) -> bool {
        self.names
            .iter()
            .zip(&self.rules)
            .any(|(n, r)| &**n == rule && r.shadow())
    }

    /// The part of [`Engine::decide`] for statements the scanner flagged.
    #[inline(never)]
    fn decide_named(&self, sql: &[u8], ctx: &StatementContext<'_>, hits: &[usize]) -> Decision {
        let Some(lexing) = ctx.lexing else {
            return Decision::NeedSessionState;
        };
        let reject_mention = |what: Refusal| {
            let (rule, _) = &self.patterns[hits[0]].tables[0];
            let table = String::from_utf8_lossy(&self.patterns[hits[0]].name);
            Decision::Reject(Rejection::new(
                self.names[*rule].clone(),
                what.map_reason(|w| format!("the statement mentions table '{table}' but {w}")),
            ))
        };
        if lexing.charset.class == CharsetClass::Refused {
            // Where strings end is not known in this character set (a byte 0x5C or a
            // quote may be the second byte of a character), so neither is whether the
            // name is an identifier: every mention is refused.
            return reject_mention(Refusal::session(format!(
                "the connection's character set is {}, in which heatsink cannot read statements exactly; use utf8mb4, utf8mb3, latin1, ascii or binary",
                lexing.charset.name
            )));
        }
        let tokens = match sqltok::lex(sql, lexing.mode) {
            Ok(t) => t,
            Err(e) => return reject_mention(Refusal::unreadable(format!("cannot be read ({e})"))),
        };
        if let Some(split) = split_units(sql, &tokens) {
            // `INTERVAL x HOUR_MINUTE`, whose unit the parser does not read: planned
            // as `INTERVAL x HOUR TO MINUTE`, which the rewrite prints back joined.
            let tokens = match sqltok::lex(&split, lexing.mode) {
                Ok(t) => t,
                Err(e) => {
                    return reject_mention(Refusal::unreadable(format!("cannot be read ({e})")))
                }
            };
            let d = self.decide_tokens(&split, tokens, ctx, hits, lexing);
            return join_units(d, sql, lexing.mode);
        }
        self.decide_tokens(sql, tokens, ctx, hits, lexing)
    }

    /// The part of [`Engine::decide_named`] after the statement was lexed.
    fn decide_tokens(
        &self,
        sql: &[u8],
        tokens: Vec<Token>,
        ctx: &StatementContext<'_>,
        hits: &[usize],
        lexing: Lexing,
    ) -> Decision {
        let reject_mention = |what: Refusal| {
            let (rule, _) = &self.patterns[hits[0]].tables[0];
            let table = String::from_utf8_lossy(&self.patterns[hits[0]].name);
            Decision::Reject(Rejection::new(
                self.names[*rule].clone(),
                what.map_reason(|w| format!("the statement mentions table '{table}' but {w}")),
            ))
        };
        if let Some(for_at) = set_statement_for(sql, &tokens) {
            return self.decide_set_statement(sql, &tokens, for_at, ctx, hits, lexing);
        }
        if let Some(word) = explain_modifier(sql, &tokens) {
            // `EXPLAIN PARTITIONS | EXTENDED <statement>`, which the parser does not
            // read: planned without the word, which goes back into the rewrite.
            let mut bare = Vec::with_capacity(sql.len());
            bare.extend_from_slice(&sql[..word.start]);
            bare.extend_from_slice(&sql[word.end..]);
            let tokens = match sqltok::lex(&bare, lexing.mode) {
                Ok(t) => t,
                Err(e) => {
                    return reject_mention(Refusal::unreadable(format!("cannot be read ({e})")))
                }
            };
            let d = self.decide_lexed(&bare, tokens, ctx, hits, lexing);
            return with_explain_modifier(d, &sql[word.start..word.end]);
        }
        self.decide_lexed(sql, tokens, ctx, hits, lexing)
    }

    /// `SET STATEMENT <variable> = <value>, … FOR <statement>` (`for_at`: the index
    /// of the `FOR` token). The inner statement is decided as if sent alone; its
    /// rewrite keeps the prefix on every statement it runs when each variable is one
    /// a rewrite is exact under ([`PREFIXABLE`]: the rewrite must already be exact
    /// under any session value of it). Otherwise a statement the rules' tables
    /// answer as sent runs as sent (the rule's fallback), and others are refused.
    fn decide_set_statement(
        &self,
        sql: &[u8],
        tokens: &[Token],
        for_at: usize,
        ctx: &StatementContext<'_>,
        hits: &[usize],
        lexing: Lexing,
    ) -> Decision {
        let inner_start = tokens[for_at + 1].start;
        let inner = &sql[inner_start..];
        let prefix_end = tokens[for_at].end;
        let variables = set_statement_variables(sql, &tokens[2..for_at]);
        let rejection = |rule: usize, why: Refusal| {
            let table = String::from_utf8_lossy(&self.patterns[hits[0]].name);
            Decision::Reject(Rejection::new(
                self.names[rule].clone(),
                why.map_reason(|w| format!("the statement mentions table '{table}' but {w}")),
            ))
        };
        let first_rule = self.patterns[hits[0]].tables[0].0;
        let reads_alike = variables.as_ref().is_some_and(|v| {
            !v.iter()
                .any(|name| LEXING_VARIABLES.contains(&name.as_str()))
        });
        let inner_tokens = match sqltok::lex(inner, lexing.mode) {
            Ok(t) if reads_alike => t,
            Ok(t) => {
                // The statement may be read differently under the prefix's settings:
                // only rules that answer anything as sent let it run.
                let mut rules: Vec<usize> = hits
                    .iter()
                    .flat_map(|&h| self.patterns[h].tables.iter().map(|(r, _)| *r))
                    .collect();
                rules.sort_unstable();
                rules.dedup();
                if self.runs_unread(inner, &t, &rules) {
                    return Decision::Fallback(Fallback {
                        rule: self.names[first_rule].clone(),
                        reason: Arc::from(SET_STATEMENT_AS_SENT),
                    });
                }
                return rejection(
                    first_rule,
                    Refusal::session("its SET STATEMENT prefix sets a variable that changes how heatsink reads the statement (sql_mode), so the rule cannot be applied safely"),
                );
            }
            Err(e) => {
                return rejection(
                    first_rule,
                    Refusal::unreadable(format!("cannot be read ({e})")),
                )
            }
        };
        let Some((rules, _, _)) = self.named_rules(inner, &inner_tokens, hits, ctx.current_db)
        else {
            return Decision::Passthrough;
        };
        let d = self.decide_lexed(inner, inner_tokens.clone(), ctx, hits, lexing);
        let Decision::Rewrite(rw) = d else {
            return d;
        };
        let params = tokens[2..for_at].iter().any(|t| t.kind == TokenKind::Param);
        let why_not = match &variables {
            _ if params => Some(Refusal::parameter(
                "its SET STATEMENT prefix has a parameter",
            )),
            Some(v) => v
                .iter()
                .find(|name| !PREFIXABLE.contains(&name.as_str()))
                .map(|name| {
                    Refusal::session(format!(
                        "SET STATEMENT {name} may change what the rewritten statements mean"
                    ))
                }),
            None => Some(Refusal::unreadable(
                "its SET STATEMENT prefix cannot be read",
            )),
        }
        .or_else(|| {
            rw.merge
                .as_ref()
                .is_some_and(|m| m.returning_alone(&rw.aux).is_some())
                .then(|| {
                    Refusal::shape(
                        "its rewrite needs the write's own RETURNING, which SET STATEMENT cannot carry",
                    )
                })
        });
        match why_not {
            None => Decision::Rewrite(with_prefix(rw, &sql[..prefix_end], sql)),
            Some(_) if self.runs_unread(inner, &inner_tokens, &rules) => {
                Decision::Fallback(Fallback {
                    rule: rw.rule,
                    reason: Arc::from(SET_STATEMENT_AS_SENT),
                })
            }
            Some(why) => {
                let table = String::from_utf8_lossy(&self.patterns[hits[0]].name);
                Decision::Reject(Rejection::new(
                    rw.rule,
                    why.map_reason(|w| format!("the statement names table '{table}' but {w}")),
                ))
            }
        }
    }

    /// The part of [`Engine::decide_named`] after the statement was lexed.
    fn decide_lexed(
        &self,
        sql: &[u8],
        tokens: Vec<Token>,
        ctx: &StatementContext<'_>,
        hits: &[usize],
        lexing: Lexing,
    ) -> Decision {
        let Some((rules, table, qualifiers)) = self.named_rules(sql, &tokens, hits, ctx.current_db)
        else {
            return Decision::Passthrough;
        };
        if let Some(d) = self.refuse_named(sql, &tokens, lexing, ctx.prepared, &rules, &table) {
            return d;
        }
        for &ri in &rules {
            let db = self.rules[ri]
                .tables()
                .first()
                .and_then(|t| crate::rewrite::table_db(t, &qualifiers, ctx.current_db));
            if let Some(sql) = self.rules[ri].metadata_query(db) {
                return Decision::NeedMetadata(crate::rewrite::MetadataRequest {
                    rule: ri,
                    sql,
                    db: db.map(str::to_string),
                });
            }
        }
        let literals: Vec<Token> = tokens
            .iter()
            .filter(|t| matches!(t.kind, TokenKind::Literal(_)))
            .copied()
            .collect();
        let st = Named {
            sql,
            tokens,
            literals,
            rules,
            table,
            lexing,
            qualifiers,
            ctx,
        };

        let outcome = self.cached_outcome(&st);
        self.decision(&outcome, &st)
    }

    /// The refusal (or passthrough) of a statement that names a ruled table before
    /// any rule plans it: a refused `sql_mode`, `?` in a text statement, a modifier
    /// the parser would misread, or nesting too deep. `rule` is the first named rule
    /// and `table` the first named table.
    fn refuse_named(
        &self,
        sql: &[u8],
        tokens: &[Token],
        lexing: Lexing,
        prepared: bool,
        rules: &[usize],
        table: &str,
    ) -> Option<Decision> {
        let rule = rules.first().copied().unwrap_or_default();
        if let Some(flag) = lexing.refused_mode {
            return Some(Decision::Reject(Rejection::new(
                self.names[rule].clone(),
                Refusal::session(format!(
                    "the statement names table '{table}' but the session's sql_mode has {flag}, under which heatsink cannot keep the statement's meaning"
                )),
            )));
        }
        if !prepared && tokens.iter().any(|t| t.kind == TokenKind::Param) {
            // `?` is a syntax error in a text statement: the server answers it, and
            // the rewrite must not turn it into something else.
            return Some(Decision::Passthrough);
        }
        if let Some(what) = misread_modifier(sql, tokens) {
            if !rules.iter().any(|&r| self.rules[r].plans_updates()) {
                // No rule would change it: the server reads it as written.
                return Some(Decision::Passthrough);
            }
            return Some(Decision::Reject(Rejection::new(
                self.names[rule].clone(),
                Refusal::unreadable(format!(
                    "the statement names table '{table}' but `{what}` cannot be rewritten (the parser would read the modifier as the table)"
                )),
            )));
        }
        let depth = sqltok::nesting_bound(sql, tokens);
        if depth > MAX_NESTING {
            return Some(Decision::Reject(Rejection::new(
                self.names[rule].clone(),
                Refusal::unreadable(format!(
                    "the statement names table '{table}' but nests up to {depth} operators or parentheses deep; rules read statements up to {MAX_NESTING} deep"
                )),
            )));
        }
        None
    }

    /// The cached outcome for a named statement, planned and cached on a miss: looked
    /// up by fingerprint, then by the literals the plan depends on or by the exact
    /// text when the fingerprint's entry says so.
    fn cached_outcome(&self, st: &Named<'_, '_>) -> Arc<Cached> {
        let mut key = Vec::with_capacity(st.sql.len() + 16);
        cache::key_header(
            &mut key,
            KeyKind::Fingerprint,
            st.ctx.prepared,
            st.lexing.mode,
            st.ctx.current_db,
        );
        sqltok::normalize(
            st.sql,
            &st.tokens,
            Mode::Fingerprint,
            &mut key,
            &mut Vec::new(),
        );
        sqltok::class_signature(st.sql, &st.tokens, &mut key);

        match self.cache.get(&key) {
            None => self.plan_marked(st, key, None),
            Some(found) => match &*found {
                Cached::DependsOn(deps) => {
                    let dk = cache::depends_key(&key, st.sql, &st.literals, &st.tokens, deps);
                    match self.cache.get(&dk) {
                        Some(o) => o,
                        None => self.plan_marked(st, key, Some(deps)),
                    }
                }
                Cached::ExactText => {
                    let ek = exact_key(st);
                    match self.cache.get(&ek) {
                        Some(o) => o,
                        None => self.plan_exact(st, ek),
                    }
                }
                _ => found,
            },
        }
    }

    /// The rules whose tables the statement names as identifiers (bare, backticked,
    /// or double-quoted as under ANSI_QUOTES), honouring database qualifiers, and the
    /// first such name. `None` if there are none (the hits were in strings,
    /// comments, or other databases).
    fn named_rules(
        &self,
        sql: &[u8],
        tokens: &[Token],
        hits: &[usize],
        current_db: Option<&str>,
    ) -> Option<(Vec<usize>, String, Qualifiers)> {
        let mut rules = Vec::new();
        let mut first: Option<String> = None;
        let mut qualifiers: Vec<(String, String)> = Vec::new();
        for (idx, t) in tokens.iter().enumerate() {
            let Some(name) =
                sqltok::ident_name(sql, t).or_else(|| sqltok::double_quoted_name(sql, t))
            else {
                continue;
            };
            for &h in hits {
                let p = &self.patterns[h];
                if !name.eq_ignore_ascii_case(&p.name) {
                    continue;
                }
                let qualifier: Option<Cow<'_, [u8]>> = match idx.checked_sub(2) {
                    Some(q) if &sql[tokens[idx - 1].start..tokens[idx - 1].end] == b"." => {
                        sqltok::ident_name(sql, &tokens[q])
                    }
                    _ => None,
                };
                if let Some(q) = &qualifiers_of(&qualifier, &name) {
                    if !qualifiers.contains(q) {
                        qualifiers.push(q.clone());
                    }
                }
                for (rule, db) in &p.tables {
                    if let Some(db) = db {
                        let effective = qualifier.as_deref().or(current_db.map(str::as_bytes));
                        if effective.is_some_and(|e| !e.eq_ignore_ascii_case(db.as_bytes())) {
                            continue;
                        }
                    }
                    if let Err(pos) = rules.binary_search(rule) {
                        rules.insert(pos, *rule);
                    }
                    if first.is_none() {
                        first = Some(String::from_utf8_lossy(&name).into_owned());
                    }
                }
            }
        }
        Some((rules, first?, qualifiers))
    }

    /// Plan with every literal and parameter marked; cache under the fingerprint
    /// (or per literal values when the rule read some). `known` is the dependency
    /// list found in the cache, if the lookup went through one.
    fn plan_marked(
        &self,
        st: &Named<'_, '_>,
        fp_key: Vec<u8>,
        known: Option<&[usize]>,
    ) -> Arc<Cached> {
        let mut text = Vec::with_capacity(st.sql.len() + 16);
        let mut slots = Vec::new();
        sqltok::normalize(st.sql, &st.tokens, Mode::MarkAll, &mut text, &mut slots);
        let text = match String::from_utf8(text) {
            Ok(t) => t,
            Err(_) => {
                let out = Arc::new(self.reject_named(
                    st,
                    Refusal::unreadable("is not valid UTF-8 outside its string literals, so the rule cannot be applied safely"),
                ));
                self.cache.insert(fp_key, out.clone());
                return out;
            }
        };
        self.parses.fetch_add(1, Ordering::Relaxed);
        let stmt = match parse_statements(&text) {
            Ok(mut stmts) if stmts.len() == 1 && round_trips(&stmts[0], &slots) => stmts.remove(0),
            Ok(stmts) if stmts.len() > 1 => {
                let out = Arc::new(self.reject_several(st, stmts.len()));
                self.cache.insert(fp_key, out.clone());
                return out;
            }
            // A literal where a marker does not parse, or the parser does not keep
            // every marker: plan this exact text with its literals in place.
            _ => {
                self.cache.insert(fp_key, Arc::new(Cached::ExactText));
                return self.plan_exact(st, exact_key(st));
            }
        };
        let pctx = PlanContext::new(
            st.ctx.current_db,
            st.ctx.prepared,
            &slots,
            st.sql,
            &st.literals,
        )
        .with_tokens(&st.tokens)
        .with_qualifiers(st.qualifiers.clone());
        let result = self.run_rules(&stmt, &pctx, &st.rules);
        let (reads, dynamics) = pctx.finish();
        let out = Arc::new(self.outcome(result, &slots, &dynamics));
        match known {
            None if reads.is_empty() => self.cache.insert(fp_key, out.clone()),
            None => {
                let dk = cache::depends_key(&fp_key, st.sql, &st.literals, &st.tokens, &reads);
                self.cache
                    .insert(fp_key, Arc::new(Cached::DependsOn(reads.into())));
                self.cache.insert(dk, out.clone());
            }
            Some(deps) => {
                // Cache only if the values this plan depends on are all in the key.
                if reads.iter().all(|r| deps.contains(r)) {
                    let dk = cache::depends_key(&fp_key, st.sql, &st.literals, &st.tokens, deps);
                    self.cache.insert(dk, out.clone());
                }
            }
        }
        out
    }

    /// Plan the exact text (literals in place, parameters marked); cache under the
    /// exact text.
    fn plan_exact(&self, st: &Named<'_, '_>, key: Vec<u8>) -> Arc<Cached> {
        let out = Arc::new(self.plan_exact_outcome(st));
        self.cache.insert(key, out.clone());
        out
    }

    fn plan_exact_outcome(&self, st: &Named<'_, '_>) -> Cached {
        if st.lexing.mode.no_backslash_escapes
            && st.literals.iter().any(|t| {
                t.kind == TokenKind::Literal(sqltok::LiteralKind::String)
                    && st.sql[t.start..t.end].contains(&b'\\')
            })
        {
            // The parser would read the backslash as an escape.
            return self.reject_named(
                st,
                Refusal::session("has a string with a backslash where it cannot be set aside, which heatsink cannot read exactly under NO_BACKSLASH_ESCAPES"),
            );
        }
        let mut text = Vec::with_capacity(st.sql.len() + 16);
        let mut slots = Vec::new();
        sqltok::normalize(st.sql, &st.tokens, Mode::MarkParams, &mut text, &mut slots);
        let Ok(text) = String::from_utf8(text) else {
            return self.reject_named(
                st,
                Refusal::unreadable("is not valid UTF-8 and has a literal where it cannot be set aside, so the rule cannot be applied safely"),
            );
        };
        self.parses.fetch_add(1, Ordering::Relaxed);
        let mut stmts = match parse_statements(&text) {
            Ok(s) => s,
            Err(_) if self.is_maintenance(st) => return Cached::Passthrough,
            Err(_) if self.runs_unread(st.sql, &st.tokens, &st.rules) => {
                // A read or row write the rules' tables answer exactly as sent.
                return Cached::Fallback(Fallback {
                    rule: self.names[st.rules[0]].clone(),
                    reason: Arc::from(UNREAD_AS_SENT),
                });
            }
            Err(e) => {
                return self
                    .reject_named(st, Refusal::unreadable(format!("cannot be parsed ({e})")));
            }
        };
        match stmts.len() {
            0 => return Cached::Passthrough,
            1 => {}
            n => return self.reject_several(st, n),
        }
        let stmt = stmts.remove(0);
        let params_kept = round_trips(&stmt, &slots);
        let pctx = PlanContext::new(
            st.ctx.current_db,
            st.ctx.prepared,
            &slots,
            st.sql,
            &st.literals,
        )
        .with_tokens(&st.tokens)
        .with_qualifiers(st.qualifiers.clone());
        let result = self.run_rules(&stmt, &pctx, &st.rules);
        let (_, dynamics) = pctx.finish();
        match self.outcome(result, &slots, &dynamics) {
            Cached::Rewrite { rule, .. } if !params_kept => Cached::Reject(Rejection::new(
                rule,
                Refusal::parameter("the statement's parameters do not survive parsing, so it cannot be rewritten safely"),
            )),
            other => other,
        }
    }

    /// Whether a statement the planner cannot read may run as sent: every rule whose
    /// table it names allows it ([`Rule::runs_unread`]) and it is a read or a row
    /// write (`SELECT`, `WITH`, `INSERT`, `REPLACE`, `UPDATE`, `DELETE`, `LOAD`,
    /// `VALUES`, or a parenthesised query), never DDL, whose effects on the rules'
    /// own tables no trigger follows.
    fn runs_unread(&self, sql: &[u8], tokens: &[Token], rules: &[usize]) -> bool {
        const WORDS: &[&[u8]] = &[
            b"SELECT", b"WITH", b"INSERT", b"REPLACE", b"UPDATE", b"DELETE", b"LOAD", b"VALUES",
        ];
        let reads_or_writes_rows = tokens.first().is_some_and(|t| match t.kind {
            TokenKind::Word => WORDS
                .iter()
                .any(|w| w.eq_ignore_ascii_case(&sql[t.start..t.end])),
            TokenKind::Punct => &sql[t.start..t.end] == b"(",
            _ => false,
        });
        reads_or_writes_rows
            && !rules.is_empty()
            && rules.iter().all(|&r| self.rules[r].runs_unread())
    }

    /// Whether the statement is one of the administrative commands that neither read
    /// nor change rows (`CHECKSUM TABLE`, `OPTIMIZE TABLE`, `SHOW …`, …). Those the
    /// parser does not know are forwarded rather than refused.
    fn is_maintenance(&self, st: &Named<'_, '_>) -> bool {
        const WORDS: &[&[u8]] = &[
            b"CHECK",
            b"CHECKSUM",
            b"DESC",
            b"DESCRIBE",
            b"HELP",
            b"OPTIMIZE",
            b"REPAIR",
            b"SHOW",
        ];
        st.tokens.first().is_some_and(|t| {
            t.kind == TokenKind::Word
                && WORDS
                    .iter()
                    .any(|w| w.eq_ignore_ascii_case(&st.sql[t.start..t.end]))
        })
    }

    /// Ask every rule whose table the statement names. A refusal wins; two rules
    /// that both want to rewrite the statement are refused too.
    fn run_rules(
        &self,
        stmt: &Statement,
        pctx: &PlanContext<'_>,
        rules: &[usize],
    ) -> Result<Option<(usize, Plan)>, Rejection> {
        let mut found: Option<(usize, Plan)> = None;
        // Rules that share a table are asked in their rank order.
        let mut order = rules.to_vec();
        order.sort_by_key(|&ri| self.rules[ri].sharing().unwrap_or(0));
        for ri in order {
            let rule = &self.rules[ri];
            let planned =
                catch_unwind(AssertUnwindSafe(|| rule.plan(stmt, pctx))).unwrap_or_else(|_| {
                    Err(Refusal::internal(
                        "internal error: the rule failed while planning",
                    ))
                });
            match planned {
                Err(refusal) => return Err(Rejection::new(self.names[ri].clone(), refusal)),
                Ok(None) => {}
                Ok(Some(plan)) => {
                    if let Some((first, earlier)) = &found {
                        // A fallback gives way to a plan that answers.
                        if plan.fallback.is_some() {
                            continue;
                        }
                        if earlier.fallback.is_some() {
                            found = Some((ri, plan));
                            continue;
                        }
                        if rule.sharing().is_some() && self.rules[*first].sharing().is_some() {
                            continue; // an earlier (smaller) rule of the table answers
                        }
                        return Err(Rejection::new(
                            self.names[*first].clone(),
                            Refusal::shape(format!(
                                "the statement is also rewritten by rule '{}'; one statement cannot be rewritten by several rules",
                                self.names[ri]
                            )),
                        ));
                    }
                    found = Some((ri, plan));
                }
            }
        }
        Ok(found)
    }

    /// Turn what the rules said into a cacheable outcome.
    fn outcome(
        &self,
        result: Result<Option<(usize, Plan)>, Rejection>,
        slots: &[Slot],
        dynamics: &[Dynamic],
    ) -> Cached {
        let (ri, plan) = match result {
            Err(mut r) => {
                // Reasons may quote parts of the marked statement; a cached rejection
                // serves every statement of this shape, so show markers as `?`.
                r.reason = unmark(&r.reason);
                return Cached::Reject(r);
            }
            Ok(None) => return Cached::Passthrough,
            Ok(Some(found)) => found,
        };
        let rule = self.names[ri].clone();
        if let Some(reason) = plan.fallback {
            return Cached::Fallback(crate::rewrite::Fallback { rule, reason });
        }
        if plan.statements.is_empty() {
            return Cached::Reject(Rejection::new(
                rule,
                Refusal::internal("internal error: the rewrite has no statement"),
            ));
        }
        if plan.as_sent_on_error.is_some() && plan.statements.len() > 1 && !plan.atomic {
            // A statement that failed half way would leave the others' work behind
            // the client's statement run as sent.
            return Cached::Reject(Rejection::new(
                rule,
                Refusal::internal(
                    "internal error: a rewrite that runs as sent when it fails must fail as a whole",
                ),
            ));
        }
        let printed: Vec<String> = plan.statements.iter().map(ToString::to_string).collect();
        match Template::build(&printed, slots, dynamics) {
            Ok(mut template) => {
                let aux = match Template::build(&plan.aux, slots, dynamics) {
                    Ok(t) => t.statements,
                    Err(e) => {
                        return Cached::Reject(Rejection::new(
                            rule,
                            Refusal::internal(format!("internal error: {e}")),
                        ))
                    }
                };
                template.aux = aux;
                if let Some(p) = &plan.prelude {
                    let print = |v: &[Statement]| -> Vec<String> {
                        v.iter().map(ToString::to_string).collect()
                    };
                    let built = Template::build(&print(&p.query), slots, dynamics).and_then(|q| {
                        let then = Template::build(&print(&p.statements), slots, dynamics)?;
                        match q.statements.as_slice() {
                            [one] if !then.statements.is_empty() => Ok(cache::PreludeTemplate {
                                query: one.clone(),
                                values: p.values.clone(),
                                statements: then.statements,
                                original_on_decline: p.original_on_decline,
                            }),
                            _ => Err(Refusal::internal(
                                "the prelude is not one query and its statements",
                            )),
                        }
                    });
                    match built {
                        Ok(p) => template.prelude = Some(Box::new(p)),
                        Err(e) => {
                            return Cached::Reject(Rejection::new(
                                rule,
                                Refusal::internal(format!("internal error: {e}")),
                            ))
                        }
                    }
                }
                template.reply = plan.reply;
                template.plan_flags = plan.plan_flags;
                template.as_sent_on_error = plan.as_sent_on_error;
                template.atomic = plan.atomic;
                template.merge = plan.merge;
                template.param_checks = plan.param_checks;
                Cached::Rewrite { rule, template }
            }
            Err(e) => Cached::Reject(Rejection::new(
                rule,
                Refusal::internal(format!("internal error: {e}")),
            )),
        }
    }

    /// A cached outcome applied to this statement.
    fn decision(&self, outcome: &Cached, st: &Named<'_, '_>) -> Decision {
        match outcome {
            Cached::Passthrough => Decision::Passthrough,
            Cached::Fallback(f) => Decision::Fallback(f.clone()),
            Cached::Reject(r) => Decision::Reject(r.clone()),
            Cached::Rewrite { rule, template } => {
                if let Some(reason) = invalid_string(st) {
                    return Decision::Reject(Rejection::new(rule.clone(), Refusal::value(reason)));
                }
                match template.render(rule, st.sql, &st.literals, st.ctx.prepared, st.ctx.share) {
                    Ok(r) => Decision::Rewrite(r),
                    Err(e) => Decision::Reject(Rejection::new(
                        rule.clone(),
                        Refusal::internal(format!("internal error: {e}")),
                    )),
                }
            }
            Cached::DependsOn(_) | Cached::ExactText => self.decision_internal(st),
        }
    }

    /// Never expected: a lookup entry where an outcome should be.
    #[cold]
    fn decision_internal(&self, st: &Named<'_, '_>) -> Decision {
        match self.reject_named(
            st,
            Refusal::internal("cannot be planned (internal error: inconsistent plan cache)"),
        ) {
            Cached::Reject(r) => Decision::Reject(r),
            _ => Decision::Passthrough,
        }
    }

    /// A rejection naming the first rule and table the statement names.
    fn reject_named(&self, st: &Named<'_, '_>, what: Refusal) -> Cached {
        Cached::Reject(Rejection::new(
            self.names[st.rules[0]].clone(),
            what.map_reason(|w| format!("the statement names table '{}' but {w}", st.table)),
        ))
    }

    fn reject_several(&self, st: &Named<'_, '_>, n: usize) -> Cached {
        self.reject_named(
            st,
            Refusal::unreadable(format!(
                "holds {n} statements; send statements that touch it one at a time"
            )),
        )
    }
}

/// MariaDB's compound interval units, which the parser does not read, with the
/// standard `<first> TO <last>` form it reads in their place.
const COMPOUND_UNITS: &[(&str, &str, &str)] = &[
    ("SECOND_MICROSECOND", "SECOND", "MICROSECOND"),
    ("MINUTE_MICROSECOND", "MINUTE", "MICROSECOND"),
    ("MINUTE_SECOND", "MINUTE", "SECOND"),
    ("HOUR_MICROSECOND", "HOUR", "MICROSECOND"),
    ("HOUR_SECOND", "HOUR", "SECOND"),
    ("HOUR_MINUTE", "HOUR", "MINUTE"),
    ("DAY_MICROSECOND", "DAY", "MICROSECOND"),
    ("DAY_SECOND", "DAY", "SECOND"),
    ("DAY_MINUTE", "DAY", "MINUTE"),
    ("DAY_HOUR", "DAY", "HOUR"),
    ("YEAR_MONTH", "YEAR", "MONTH"),
];

/// Interval units the parser reads.
const SIMPLE_UNITS: &[&str] = &[
    "MICROSECOND",
    "SECOND",
    "MINUTE",
    "HOUR",
    "DAY",
    "WEEK",
    "MONTH",
    "QUARTER",
    "YEAR",
];

/// The statement with each compound unit of an `INTERVAL` (`HOUR_MINUTE`: the first
/// unit word after `INTERVAL` at its parenthesis depth) written `HOUR TO MINUTE`, or
/// `None` when it has none, or has a `TO` of its own (which MariaDB never reads in an
/// interval, and which the way back must not mistake for one of these).
fn split_units(sql: &[u8], tokens: &[Token]) -> Option<Vec<u8>> {
    let text = |t: &Token| &sql[t.start..t.end];
    let is = |t: &Token, w: &str| {
        t.kind == TokenKind::Word && w.as_bytes().eq_ignore_ascii_case(text(t))
    };
    // Every compound unit has an underscore: most words are passed over at that test
    // (this runs for every statement on a ruled table).
    if !tokens.iter().any(|t| {
        t.kind == TokenKind::Word
            && text(t).contains(&b'_')
            && COMPOUND_UNITS
                .iter()
                .any(|(c, _, _)| c.as_bytes().eq_ignore_ascii_case(text(t)))
    }) || tokens.iter().any(|t| is(t, "TO"))
    {
        return None;
    }
    let mut depth = 0usize;
    // Depths of `INTERVAL`s still waiting for their unit.
    let mut open: Vec<usize> = Vec::new();
    let mut splits: Vec<(usize, &str, &str)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        match t.kind {
            TokenKind::Punct if text(t) == b"(" => depth += 1,
            TokenKind::Punct if text(t) == b")" => {
                depth = depth.saturating_sub(1);
                while open.last().is_some_and(|&d| d > depth) {
                    open.pop();
                }
            }
            TokenKind::Word if is(t, "INTERVAL") => open.push(depth),
            TokenKind::Word if open.last() == Some(&depth) => {
                let after_dot = i > 0 && text(&tokens[i - 1]) == b".";
                if after_dot {
                    continue;
                }
                if let Some(&(_, first, last)) = COMPOUND_UNITS
                    .iter()
                    .find(|(c, _, _)| c.as_bytes().eq_ignore_ascii_case(text(t)))
                {
                    splits.push((i, first, last));
                    open.pop();
                } else if SIMPLE_UNITS.iter().any(|u| is(t, u)) {
                    open.pop();
                }
            }
            _ => {}
        }
    }
    if splits.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(sql.len() + 4 * splits.len());
    let mut at = 0;
    for (i, first, last) in splits {
        let t = &tokens[i];
        out.extend_from_slice(&sql[at..t.start]);
        out.extend_from_slice(first.as_bytes());
        out.extend_from_slice(b" TO ");
        out.extend_from_slice(last.as_bytes());
        at = t.end;
    }
    out.extend_from_slice(&sql[at..]);
    Some(out)
}

/// `text` with every `<first> TO <last>` of [`COMPOUND_UNITS`] joined back into the
/// compound unit, and a map of its byte offsets: `(offset in text, bytes removed
/// before it)` at each join. `None` if the text cannot be lexed.
fn join_text(text: &[u8], mode: sqltok::LexMode) -> Option<(Vec<u8>, Shifts)> {
    let tokens = sqltok::lex(text, mode).ok()?;
    let word = |t: &Token| (t.kind == TokenKind::Word).then(|| &text[t.start..t.end]);
    let mut out = Vec::with_capacity(text.len());
    let mut shifts = Vec::new();
    let (mut at, mut removed, mut i) = (0, 0, 0);
    while i + 2 < tokens.len() {
        let (a, to, b) = (&tokens[i], &tokens[i + 1], &tokens[i + 2]);
        let joined = match (word(a), word(to), word(b)) {
            (Some(x), Some(w), Some(y)) if w.eq_ignore_ascii_case(b"TO") => COMPOUND_UNITS
                .iter()
                .find(|(_, f, l)| {
                    f.as_bytes().eq_ignore_ascii_case(x) && l.as_bytes().eq_ignore_ascii_case(y)
                })
                .map(|(c, _, _)| *c),
            _ => None,
        };
        let Some(unit) = joined else {
            i += 1;
            continue;
        };
        out.extend_from_slice(&text[at..a.start]);
        out.extend_from_slice(unit.as_bytes());
        removed += (b.end - a.start).saturating_sub(unit.len());
        shifts.push((b.end, removed));
        at = b.end;
        i += 3;
    }
    out.extend_from_slice(&text[at..]);
    Some((out, shifts))
}

/// Where [`join_text`] shortened a text: (offset in the text, bytes removed up to it).
type Shifts = Vec<(usize, usize)>;

/// An offset of a text given to [`join_text`], in its output.
fn joined_offset(offset: usize, shifts: &[(usize, usize)]) -> usize {
    let removed = shifts
        .iter()
        .take_while(|(end, _)| *end <= offset)
        .last()
        .map_or(0, |(_, r)| *r);
    offset.saturating_sub(removed)
}

/// The decision for a statement planned with its compound units split
/// ([`split_units`]): a rewrite's texts get the units back (their holes moved), and a
/// prelude declining its literals forwards `original`. Other decisions stand (a
/// fallback forwards the client's own bytes).
fn join_units(d: Decision, original: &[u8], mode: sqltok::LexMode) -> Decision {
    let Decision::Rewrite(mut rw) = d else {
        return d;
    };
    let internal = |rule: Arc<str>| {
        Decision::Reject(Rejection::new(
            rule,
            Refusal::internal("internal error: a rewritten statement cannot be read back"),
        ))
    };
    let mut statements = Vec::with_capacity(rw.statements.len());
    for s in &rw.statements {
        let Some((joined, _)) = join_text(s, mode) else {
            return internal(rw.rule);
        };
        statements.push(joined);
    }
    rw.statements = statements;
    for (text, holes) in rw.aux.iter_mut().zip(rw.aux_holes.iter_mut()) {
        let Some((joined, shifts)) = join_text(text, mode) else {
            return internal(rw.rule);
        };
        *text = joined;
        for h in holes.iter_mut() {
            h.0 = joined_offset(h.0, &shifts);
        }
    }
    if rw.aux_holes.is_empty() {
        for text in rw.aux.iter_mut() {
            let Some((joined, _)) = join_text(text, mode) else {
                return internal(rw.rule);
            };
            *text = joined;
        }
    }
    if let Some(p) = rw.prelude.take() {
        let mut p = (*p).clone();
        let Some((query, _)) = join_text(&p.query, mode) else {
            return internal(rw.rule);
        };
        p.query = query;
        for (text, holes) in p.statements.iter_mut() {
            let Some((joined, shifts)) = join_text(text, mode) else {
                return internal(rw.rule);
            };
            *text = joined;
            for h in holes.iter_mut() {
                h.0 = joined_offset(h.0, &shifts);
            }
        }
        if p.original.is_some() {
            p.original = Some(original.to_vec());
        }
        rw.prelude = Some(Arc::new(p));
    }
    if let Some(p) = rw.probe.take() {
        rw.probe = Some(Arc::new(crate::rewrite::Probe::of(
            original,
            p.flags.clone(),
        )));
    }
    Decision::Rewrite(rw)
}

/// Variables whose statement-scoped value (`SET STATEMENT v = … FOR`) may be given to
/// each statement of a rewrite: the rewrites are exact under any session value of
/// them, and they do not change how a statement is read or what the proxy knows of
/// the session.
const PREFIXABLE: &[&str] = &[
    "time_zone",
    "timestamp",
    "div_precision_increment",
    "lock_wait_timeout",
    "innodb_lock_wait_timeout",
    "optimizer_switch",
    "join_buffer_size",
    "sort_buffer_size",
    "tmp_table_size",
    "max_heap_table_size",
];

/// Variables that change how the statement after `SET STATEMENT … FOR` is read.
const LEXING_VARIABLES: &[&str] = &["sql_mode"];

/// The index of the `FOR` of `SET STATEMENT <assignments> FOR <statement>` (the
/// first `FOR` outside parentheses; MariaDB reserves the word), if the statement is
/// one and has a statement after it.
fn set_statement_for(sql: &[u8], tokens: &[Token]) -> Option<usize> {
    let word = |t: &Token, w: &[u8]| {
        t.kind == TokenKind::Word && w.eq_ignore_ascii_case(&sql[t.start..t.end])
    };
    if !(word(tokens.first()?, b"SET") && word(tokens.get(1)?, b"STATEMENT")) {
        return None;
    }
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(2) {
        match t.kind {
            TokenKind::Punct if &sql[t.start..t.end] == b"(" => depth += 1,
            TokenKind::Punct if &sql[t.start..t.end] == b")" => depth = depth.saturating_sub(1),
            TokenKind::Word if depth == 0 && word(t, b"FOR") => {
                return (i + 1 < tokens.len()).then_some(i);
            }
            _ => {}
        }
    }
    None
}

/// The variable names (lowercase) a `SET STATEMENT` prefix assigns (`tokens`: those
/// between `STATEMENT` and `FOR`), or `None` when an assignment does not start with
/// `name =`.
fn set_statement_variables(sql: &[u8], tokens: &[Token]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut at_start = true;
    for (i, t) in tokens.iter().enumerate() {
        let text = &sql[t.start..t.end];
        if at_start {
            let assigns = tokens
                .get(i + 1)
                .is_some_and(|n| n.kind == TokenKind::Punct && &sql[n.start..n.end] == b"=");
            if t.kind != TokenKind::Word || !assigns {
                return None;
            }
            names.push(String::from_utf8_lossy(text).to_ascii_lowercase());
            at_start = false;
            continue;
        }
        match (t.kind, text) {
            (TokenKind::Punct, b"(") => depth += 1,
            (TokenKind::Punct, b")") => depth = depth.saturating_sub(1),
            (TokenKind::Punct, b",") if depth == 0 => at_start = true,
            _ => {}
        }
    }
    (!names.is_empty() && !at_start).then_some(names)
}

/// A rewrite of the statement after `SET STATEMENT … FOR` with the prefix (`prefix`:
/// the statement up to and including `FOR`) on every statement it runs, the prelude's
/// query included; `original` is the whole statement, forwarded when a prelude
/// declines. It runs alone: a merged write would lose the prefix.
fn with_prefix(
    mut rw: crate::rewrite::Rewritten,
    prefix: &[u8],
    original: &[u8],
) -> crate::rewrite::Rewritten {
    let join = |text: &[u8]| {
        let mut out = Vec::with_capacity(prefix.len() + 1 + text.len());
        out.extend_from_slice(prefix);
        out.push(b' ');
        out.extend_from_slice(text);
        out
    };
    let shift = prefix.len() + 1;
    rw.statements = rw.statements.iter().map(|s| join(s)).collect();
    if let Some(p) = rw.prelude.take() {
        let mut p = (*p).clone();
        p.query = join(&p.query);
        p.statements = p
            .statements
            .iter()
            .map(|(text, holes)| {
                (
                    join(text),
                    holes.iter().map(|&(at, i)| (at + shift, i)).collect(),
                )
            })
            .collect();
        if p.original.is_some() {
            p.original = Some(original.to_vec());
        }
        rw.prelude = Some(Arc::new(p));
    }
    if let Some(p) = rw.probe.take() {
        // `SET STATEMENT … FOR EXPLAIN …`: the plan under the statement's settings.
        rw.probe = Some(Arc::new(crate::rewrite::Probe {
            explain: join(&p.explain),
            original: original.to_vec(),
            flags: p.flags.clone(),
        }));
    }
    rw.merge = None;
    rw.aux.clear();
    rw.aux_holes.clear();
    rw
}

/// The `PARTITIONS` or `EXTENDED` word of `EXPLAIN PARTITIONS <statement>` /
/// `EXPLAIN EXTENDED <statement>` (also after `DESCRIBE` or `DESC`), which
/// sqlparser does not read; MariaDB shows the same plan with or without it.
fn explain_modifier(sql: &[u8], tokens: &[Token]) -> Option<Token> {
    let word = |t: &Token, words: &[&[u8]]| {
        t.kind == TokenKind::Word
            && words
                .iter()
                .any(|w| w.eq_ignore_ascii_case(&sql[t.start..t.end]))
    };
    let (first, second) = (tokens.first()?, tokens.get(1)?);
    (word(first, &[b"EXPLAIN", b"DESCRIBE", b"DESC"])
        && word(second, &[b"PARTITIONS", b"EXTENDED"])
        && tokens.len() > 2)
        .then_some(*second)
}

/// The decision for `EXPLAIN <modifier> <statement>`, from the one made for
/// `EXPLAIN <statement>`: the modifier goes back after the leading `EXPLAIN` of
/// each rewritten statement that has one. A rewrite without an `EXPLAIN` would
/// not explain what was asked, so it is refused.
fn with_explain_modifier(d: Decision, modifier: &[u8]) -> Decision {
    let Decision::Rewrite(mut r) = d else {
        return d;
    };
    let mut found = false;
    for stmt in &mut r.statements {
        let lead = stmt.iter().take_while(|b| b.is_ascii_whitespace()).count();
        let len = stmt[lead..]
            .iter()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        let head = &stmt[lead..lead + len];
        if [&b"EXPLAIN"[..], b"DESCRIBE", b"DESC"]
            .iter()
            .any(|w| w.eq_ignore_ascii_case(head))
        {
            let at = lead + len;
            let mut word = Vec::with_capacity(modifier.len() + 1);
            word.push(b' ');
            word.extend_from_slice(modifier);
            stmt.splice(at..at, word);
            found = true;
        }
    }
    if found {
        Decision::Rewrite(r)
    } else {
        Decision::Reject(Rejection::new(
            r.rule,
            Refusal::shape(format!(
                "the rewrite of the statement has no EXPLAIN to show {}",
                String::from_utf8_lossy(modifier).to_ascii_uppercase()
            )),
        ))
    }
}

/// Why one of the statement's string literals would not keep its bytes, if one would
/// not: its bytes are not well-formed in its character set (the connection's, its
/// introducer's, or utf8mb3 for `N'…'`), so MariaDB would store `?` for them or fail,
/// and distinct values would collide in a rewrite. Checked only on statements about
/// to be rewritten.
fn invalid_string(st: &Named<'_, '_>) -> Option<String> {
    for (i, t) in st.literals.iter().enumerate() {
        let text = &st.sql[t.start..t.end];
        if t.kind == TokenKind::Literal(sqltok::LiteralKind::Hex) && text.first() == Some(&b'_') {
            // `_utf8mb4 X'…'`, `_utf8mb4 0x…`: the bytes the digits stand for.
            let end = text
                .iter()
                .position(|&b| !sqltok::is_ident_byte(b))
                .unwrap_or(text.len());
            let charset = super::Charset::from_name(&text[1..end]);
            if !charset.accepts(&hex_bytes(&text[end..])) {
                return Some(format!(
                    "hex literal #{} of the statement on table '{}' is not well-formed {}, so MariaDB would not store it as written",
                    i + 1,
                    st.table,
                    charset.name
                ));
            }
            continue;
        }
        if t.kind != TokenKind::Literal(sqltok::LiteralKind::String) {
            continue;
        }
        let (charset, body) = match text.first() {
            Some(b'_') => {
                let end = text
                    .iter()
                    .position(|&b| !sqltok::is_ident_byte(b))
                    .unwrap_or(text.len());
                (super::Charset::from_name(&text[1..end]), &text[end..])
            }
            Some(b'N' | b'n') => (super::Charset::from_name(b"utf8mb3"), &text[1..]),
            _ => (st.lexing.charset, text),
        };
        if !charset.accepts(body) {
            return Some(format!(
                "string literal #{} of the statement on table '{}' is not well-formed {}, so MariaDB would not store it as written",
                i + 1,
                st.table,
                charset.name
            ));
        }
    }
    None
}

/// The bytes of a hex literal's digits (`X'4142'`, `0x4142`, `0x142` = `0x0142`),
/// whatever precedes them.
fn hex_bytes(text: &[u8]) -> Vec<u8> {
    let body = match text.iter().position(|&b| b == b'\'') {
        Some(q) => &text[q + 1..],
        None => text
            .iter()
            .position(|&b| b == b'x' || b == b'X')
            .map_or(text, |x| &text[x + 1..]),
    };
    let digits: Vec<u8> = body
        .iter()
        .take_while(|b| b.is_ascii_hexdigit())
        .map(|&b| match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        })
        .collect();
    let pad = digits.len() % 2;
    let mut out = Vec::with_capacity(digits.len() / 2 + 1);
    let mut hi: Option<u8> = (pad == 1).then_some(0);
    for d in digits {
        match hi.take() {
            Some(h) => out.push(h << 4 | d),
            None => hi = Some(d),
        }
    }
    out
}

/// The exact-text key of a statement.
fn exact_key(st: &Named<'_, '_>) -> Vec<u8> {
    let mut key = Vec::with_capacity(st.sql.len() + 16);
    cache::key_header(
        &mut key,
        KeyKind::Exact,
        st.ctx.prepared,
        st.lexing.mode,
        st.ctx.current_db,
    );
    key.extend_from_slice(st.sql);
    key
}

/// `UPDATE LOW_PRIORITY t`, `UPDATE IGNORE t`, `DELETE QUICK FROM t` …: sqlparser
/// reads the modifier as the table name and the table as its alias, so a rule would
/// not see its table written. Returns the verb and modifier.
fn misread_modifier(sql: &[u8], tokens: &[Token]) -> Option<String> {
    let word = |i: usize| {
        tokens
            .get(i)
            .filter(|t| t.kind == TokenKind::Word)
            .map(|t| &sql[t.start..t.end])
    };
    let verb = word(0)?;
    let modifiers: &[&[u8]] = if verb.eq_ignore_ascii_case(b"UPDATE") {
        &[b"LOW_PRIORITY", b"IGNORE"]
    } else if verb.eq_ignore_ascii_case(b"DELETE") {
        &[b"LOW_PRIORITY", b"QUICK", b"IGNORE"]
    } else {
        return None;
    };
    let next = word(1)?;
    modifiers
        .iter()
        .any(|m| m.eq_ignore_ascii_case(next))
        .then(|| {
            format!(
                "{} {}",
                verb.to_ascii_uppercase().escape_ascii(),
                next.to_ascii_uppercase().escape_ascii()
            )
        })
}

/// Whether printing `stmt` shows every marker of `slots` exactly once (the parser
/// kept every value where it was) and no bare `?`.
fn round_trips(stmt: &Statement, slots: &[Slot]) -> bool {
    let printed = stmt.to_string();
    let Ok(toks) = sqltok::lex_markers(printed.as_bytes()) else {
        return false;
    };
    let mut seen = vec![0u32; slots.len()];
    for t in &toks {
        match t.kind {
            TokenKind::Marker(k) => match (k as usize).checked_sub(1).and_then(|i| seen.get_mut(i))
            {
                Some(c) => *c += 1,
                None => return false,
            },
            TokenKind::Param => return false,
            _ => {}
        }
    }
    seen.iter().all(|&c| c == 1)
}

/// Replaces value markers (`?12`) in a text by `?`.
fn unmark(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '?' {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
        }
    }
    out
}

/// (table, database) pairs of the db-qualified table names of a statement.
type Qualifiers = Vec<(String, String)>;

/// A (table, database) pair for a table name written with a database qualifier.
fn qualifiers_of(qualifier: &Option<Cow<'_, [u8]>>, name: &[u8]) -> Option<(String, String)> {
    let db = qualifier.as_deref()?;
    Some((
        String::from_utf8_lossy(name).into_owned(),
        String::from_utf8_lossy(db).into_owned(),
    ))
}

/// Hands every sharing rule ([`Rule::sharing`]) the other sharing rules of the
/// tables it names ([`Rule::cooperate`]).
fn introduce_sharing_rules(rules: &[Arc<dyn Rule>], patterns: &[Pattern]) {
    let mut others: Vec<Vec<usize>> = vec![Vec::new(); rules.len()];
    for p in patterns {
        let sharing: Vec<usize> = p
            .tables
            .iter()
            .map(|(ri, _)| *ri)
            .filter(|&ri| rules[ri].sharing().is_some())
            .collect();
        for &ri in &sharing {
            for &other in &sharing {
                if other != ri && !others[ri].contains(&other) {
                    others[ri].push(other);
                }
            }
        }
    }
    for (ri, list) in others.iter().enumerate() {
        if !list.is_empty() {
            let list: Vec<Arc<dyn Rule>> = list.iter().map(|&o| Arc::clone(&rules[o])).collect();
            rules[ri].cooperate(&list);
        }
    }
}

/// The reason of a fallback for a statement the parser cannot read, run as sent
/// ([`Rule::runs_unread`]).
const UNREAD_AS_SENT: &str =
    "the parser cannot read this statement; the rule's tables answer it as sent";

/// The reason of a fallback for a `SET STATEMENT … FOR` whose prefix the rewrite
/// cannot carry, run as sent.
const SET_STATEMENT_AS_SENT: &str =
    "its SET STATEMENT variables change how the rewrite would run; the rule's tables answer it as sent";

/// How the server names a physical table in its messages, and the same with the
/// logical name: `` `db`.`table` `` (also as `` `db`.`table`.`column` ``: 1142,
/// 4025, conversion errors), `` in table 'table' `` (1143), and a foreign key the
/// ring copied from the log, `` CONSTRAINT `ring__fk` `` (1452), and a column-level
/// CHECK, `` CONSTRAINT `table.column` `` (4025).
fn message_renames(physical: &str, logical: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    // The server quotes identifiers in messages with backticks, or with double quotes
    // under ANSI_QUOTES.
    let mut out = Vec::with_capacity(7);
    for q in ['`', '"'] {
        out.push((
            format!("CONSTRAINT {q}{physical}.").into_bytes(),
            format!("CONSTRAINT {q}{logical}.").into_bytes(),
        ));
        out.push((
            format!("{q}.{q}{physical}{q}").into_bytes(),
            format!("{q}.{q}{logical}{q}").into_bytes(),
        ));
        out.push((
            format!("CONSTRAINT {q}{physical}__").into_bytes(),
            format!("CONSTRAINT {q}").into_bytes(),
        ));
    }
    out.push((
        format!("in table '{physical}'").into_bytes(),
        format!("in table '{logical}'").into_bytes(),
    ));
    out
}

#[cfg(test)]
mod rename_tests {
    use super::message_renames;
    use crate::wire::packets::renamed;

    #[test]
    fn messages_name_the_logical_table() {
        let names: Vec<(Vec<u8>, Vec<u8>)> = message_renames("ev_ring", "ev");
        for (server, shown) in [
            (
                "INSERT command denied to user 'u'@'localhost' for table `d`.`ev_ring`",
                "INSERT command denied to user 'u'@'localhost' for table `d`.`ev`",
            ),
            (
                "SELECT command denied to user 'u'@'localhost' for column 'seq' in table 'ev_ring'",
                "SELECT command denied to user 'u'@'localhost' for column 'seq' in table 'ev'",
            ),
            (
                "CONSTRAINT `ev_ring.n` failed for `d`.`ev_ring`",
                "CONSTRAINT `ev.n` failed for `d`.`ev`",
            ),
            (
                "Cannot add or update a child row: a foreign key constraint fails (`d`.`ev_ring`, CONSTRAINT `ev_ring__fk` FOREIGN KEY (`uid`) REFERENCES `users` (`id`))",
                "Cannot add or update a child row: a foreign key constraint fails (`d`.`ev`, CONSTRAINT `fk` FOREIGN KEY (`uid`) REFERENCES `users` (`id`))",
            ),
            (
                "Incorrect integer value: 'x' for column `d`.`ev_ring`.`n` at row 1",
                "Incorrect integer value: 'x' for column `d`.`ev`.`n` at row 1",
            ),
            // Under ANSI_QUOTES.
            (
                "Cannot add or update a child row: a foreign key constraint fails (\"d\".\"ev_ring\", CONSTRAINT \"ev_ring__fk\" FOREIGN KEY (\"uid\") REFERENCES \"users\" (\"id\"))",
                "Cannot add or update a child row: a foreign key constraint fails (\"d\".\"ev\", CONSTRAINT \"fk\" FOREIGN KEY (\"uid\") REFERENCES \"users\" (\"id\"))",
            ),
            (
                "CONSTRAINT \"ev_ring.n\" failed for \"d\".\"ev_ring\"",
                "CONSTRAINT \"ev.n\" failed for \"d\".\"ev\"",
            ),
        ] {
            let got = renamed(server.as_bytes(), &names).unwrap_or_else(|| server.into());
            assert_eq!(String::from_utf8_lossy(&got), shown);
        }
        // Another table whose name starts alike is left alone.
        assert!(renamed(b"for table `d`.`ev_ring2`", &names).is_none());
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;
    use std::sync::atomic::AtomicUsize;

    use sqlparser::ast::{
        visit_relations, visit_relations_mut, BinaryOperator, Expr, Ident, ObjectNamePart,
        TableFactor,
    };

    use super::*;
    use crate::rewrite::{RefusalClass, Rewritten, TableName};

    /// Test-only rule: reads of its table go to `<table>_shadow`; writes are refused.
    struct Shadow {
        name: String,
        tables: Vec<TableName>,
        calls: AtomicUsize,
    }

    impl Shadow {
        fn new(name: &str, db: Option<&str>, table: &str) -> Arc<Self> {
            Arc::new(Shadow {
                name: name.into(),
                tables: vec![TableName::new(db, table)],
                calls: AtomicUsize::new(0),
            })
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Rule for Shadow {
        fn name(&self) -> &str {
            &self.name
        }
        fn tables(&self) -> &[TableName] {
            &self.tables
        }
        fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let table = &self.tables[0];
            let named = visit_relations(stmt, |n| {
                if ctx.names_table(n, table) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .is_break();
            if !named {
                return Ok(None);
            }
            if !matches!(stmt, Statement::Query(_)) {
                return Err(Refusal::shape(format!(
                    "writes to {table} are not supported"
                )));
            }
            let mut out = stmt.clone();
            let _ = visit_relations_mut(&mut out, |n| {
                if ctx.names_table(n, table) {
                    if let Some(ObjectNamePart::Identifier(last)) = n.0.last_mut() {
                        last.value = format!("{}_shadow", last.value);
                    }
                }
                ControlFlow::<()>::Continue(())
            });
            Ok(Some(vec![out].into()))
        }
    }

    /// Test-only rule: `UPDATE c SET n = n + <inc> WHERE id = <x>` becomes an upsert
    /// into one of four slot rows; the increment must be a positive integer.
    struct Counter {
        tables: Vec<TableName>,
        calls: AtomicUsize,
    }

    impl Counter {
        fn new() -> Arc<Self> {
            Arc::new(Counter {
                tables: vec![TableName::new(None, "c")],
                calls: AtomicUsize::new(0),
            })
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Rule for Counter {
        fn name(&self) -> &str {
            "counter"
        }
        fn tables(&self) -> &[TableName] {
            &self.tables
        }
        fn plan(&self, stmt: &Statement, ctx: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let Statement::Update(u) = stmt else {
                return Ok(None);
            };
            let shape =
                || Refusal::shape("only `SET n = n + <increment> WHERE id = <value>` is supported");
            let TableFactor::Table { name, .. } = &u.table.relation else {
                return Err(shape());
            };
            if !ctx.names_table(name, &self.tables[0]) || !u.table.joins.is_empty() {
                return Err(shape());
            }
            let [a] = u.assignments.as_slice() else {
                return Err(shape());
            };
            let Expr::BinaryOp {
                op: BinaryOperator::Plus,
                right: inc,
                ..
            } = &a.value
            else {
                return Err(shape());
            };
            if !matches!(ctx.slot(inc), Some(Slot::Param(_))) {
                let ok = ctx
                    .literal(inc)
                    .and_then(|l| l.as_i64())
                    .is_some_and(|v| v > 0);
                if !ok {
                    return Err(Refusal::value("the increment must be a positive integer"));
                }
            }
            let Some(Expr::BinaryOp {
                op: BinaryOperator::Eq,
                right: id,
                ..
            }) = &u.selection
            else {
                return Err(shape());
            };
            let slot = ctx.random_below(4);
            let sql = format!(
                "INSERT INTO c_slots (id, slot, n) VALUES ({id}, {slot}, {inc}) \
                 ON DUPLICATE KEY UPDATE n = n + {inc}"
            );
            let stmts = parse_statements(&sql).map_err(|e| Refusal::internal(e.to_string()))?;
            Ok(Some(stmts.into()))
        }
    }

    /// How [`Broken`] misbehaves.
    #[derive(Clone, Copy)]
    enum Breaks {
        /// It panics.
        Panics,
        /// Its plan holds a `?` of its own.
        BareParam,
        /// Its plan runs as sent on error but could fail half way.
        LooseAsSent,
    }

    /// Test-only rule that misbehaves in a configurable way.
    struct Broken {
        tables: Vec<TableName>,
        breaks: Breaks,
    }

    impl Rule for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn tables(&self) -> &[TableName] {
            &self.tables
        }
        fn plan(&self, _: &Statement, _: &PlanContext<'_>) -> Result<Option<Plan>, Refusal> {
            match self.breaks {
                Breaks::Panics => panic!("rule bug"),
                Breaks::BareParam => {
                    let stmts = parse_statements("SELECT ?")
                        .map_err(|e| Refusal::internal(e.to_string()))?;
                    Ok(Some(stmts.into()))
                }
                Breaks::LooseAsSent => {
                    let stmts = parse_statements("UPDATE t SET a = 1; UPDATE t SET a = 2")
                        .map_err(|e| Refusal::internal(e.to_string()))?;
                    Ok(Some(Plan {
                        statements: stmts,
                        as_sent_on_error: Some("because"),
                        ..Default::default()
                    }))
                }
            }
        }
    }

    fn engine(rules: Vec<Arc<dyn Rule>>) -> Engine {
        Engine::new(rules, 1000).unwrap()
    }

    const TEXT: StatementContext<'static> = StatementContext {
        prepared: false,
        in_transaction: false,
        current_db: None,
        lexing: Some(Lexing::STANDARD),
        share: None,
    };

    const PREPARED: StatementContext<'static> = StatementContext {
        prepared: true,
        in_transaction: false,
        current_db: None,
        lexing: Some(Lexing::STANDARD),
        share: None,
    };

    fn ast(sql: &str) -> Vec<Statement> {
        parse_statements(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Bytes as latin1 text (every byte one char), so any statement can be parsed.
    fn latin1(b: &[u8]) -> String {
        b.iter().map(|&c| c as char).collect()
    }

    #[track_caller]
    fn rewritten(d: Decision) -> Rewritten {
        match d {
            Decision::Rewrite(r) => r,
            other => panic!("expected a rewrite, got {other:?}"),
        }
    }

    #[track_caller]
    fn rejected(d: Decision) -> Rejection {
        match d {
            Decision::Reject(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    /// Compare rewritten statements with the expected SQL as parsed ASTs.
    #[track_caller]
    fn assert_statements(r: &Rewritten, expected: &[&str]) {
        let actual: Vec<Statement> = r.statements.iter().flat_map(|s| ast(&latin1(s))).collect();
        let expected: Vec<Statement> = expected.iter().flat_map(|s| ast(s)).collect();
        assert_eq!(actual, expected);
    }

    #[test]
    fn engine_is_shareable() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Engine>();
        shareable::<Decision>();
    }

    #[test]
    fn no_rules_is_passthrough() {
        let e = Engine::empty();
        assert!(!e.has_rules());
        assert_eq!(
            e.decide(b"UPDATE t SET a = 1", &TEXT),
            Decision::Passthrough
        );
        let e = Engine::new(Vec::new(), 10).unwrap();
        assert!(!e.has_rules());
        assert_eq!(e.decide(b"SELECT 1", &TEXT), Decision::Passthrough);
    }

    #[test]
    fn unrelated_statements_are_not_parsed() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = engine(vec![shadow.clone()]);
        assert!(e.has_rules());
        for sql in [
            &b"SELECT * FROM t_x"[..],
            b"SELECT * FROM xt",
            b"SELECT 't' FROM u",
            b"SELECT 1 FROM u -- t",
            b"SELECT 1 FROM u /* t */",
            b"SELECT @t, @@t",
            b"SELECT 'it''s t', \"t\\\"\" FROM u",
            b"garbage that does not parse",
        ] {
            assert_eq!(
                e.decide(sql, &TEXT),
                Decision::Passthrough,
                "{}",
                latin1(sql)
            );
        }
        assert_eq!(e.parses(), 0);
        assert_eq!(shadow.calls(), 0);
    }

    #[test]
    fn cache_hit_renders_new_literals_without_replanning() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = engine(vec![shadow.clone()]);
        let r = rewritten(e.decide(b"SELECT a FROM t WHERE id = 5 AND s = 'x'", &TEXT));
        assert_eq!(&*r.rule, "shadow");
        assert_eq!(r.param_map, None);
        assert_statements(&r, &["SELECT a FROM t_shadow WHERE id = 5 AND s = 'x'"]);
        assert_eq!((shadow.calls(), e.parses()), (1, 1));

        // Same shape: other literals, other keyword case, other spacing, comments.
        let r = rewritten(e.decide(
            b"select a  from t /* hi */ where id=42.5e3 AND s = _utf8mb4'it\\'s'",
            &TEXT,
        ));
        assert_statements(
            &r,
            &["SELECT a FROM t_shadow WHERE id = 42.5e3 AND s = _utf8mb4'it\\'s'"],
        );
        // The literal bytes are copied verbatim (sqlparser cannot even parse this one).
        let r = rewritten(e.decide(
            b"SELECT a FROM t WHERE id = 1 AND s = _latin1'it''s' \n 'x'",
            &TEXT,
        ));
        assert!(r.statements[0].ends_with(b" = _latin1'it''s' \n 'x'"));
        let r = rewritten(e.decide(b"SELECT a FROM t WHERE id = 0x1F AND s = \"q\"", &TEXT));
        assert_statements(
            &r,
            &["SELECT a FROM t_shadow WHERE id = 0x1F AND s = \"q\""],
        );

        // Latin1 bytes inside a literal are fine: they are never parsed.
        let latin1 = StatementContext {
            lexing: Some(Lexing {
                charset: super::super::Charset::from_name(b"latin1"),
                ..Lexing::STANDARD
            }),
            ..TEXT
        };
        let r = rewritten(e.decide(b"SELECT a FROM t WHERE id = 1 AND s = 'caf\xe9'", &latin1));
        assert!(r.statements[0].ends_with(b"'caf\xe9'"));
        assert_statements(
            &r,
            &["SELECT a FROM t_shadow WHERE id = 1 AND s = 'caf\u{e9}'"],
        );

        // Literals of the same classes (kind, integer digits, string length) reuse
        // the plan: the classes are part of the cache key, so rules may check them.
        let planned = (shadow.calls(), e.parses());
        let r = rewritten(e.decide(
            b"select a from t where id = 17.5e3 and s = _utf8mb4'at\\'s'",
            &TEXT,
        ));
        assert!(r.statements[0].ends_with(b" = _utf8mb4'at\\'s'"));
        rewritten(e.decide(b"SELECT a FROM t WHERE id = 6 AND s = 'y'", &TEXT));
        assert_eq!((shadow.calls(), e.parses()), planned);

        // A different shape is planned once.
        let r = rewritten(e.decide(b"SELECT a FROM `t` JOIN db.t AS u ON u.k = t.k", &TEXT));
        assert_statements(
            &r,
            &["SELECT a FROM `t_shadow` JOIN db.t_shadow AS u ON u.k = t.k"],
        );
        assert_eq!((shadow.calls(), e.parses()), (planned.0 + 1, planned.1 + 1));
    }

    #[test]
    fn executable_comments_count() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        let r = rewritten(e.decide(
            b"SELECT a /*!50000 , b */ FROM /*M!100100 t */ WHERE id = 1",
            &TEXT,
        ));
        assert_statements(&r, &["SELECT a, b FROM t_shadow WHERE id = 1"]);
    }

    #[test]
    fn prepared_statements_map_parameters() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = engine(vec![shadow.clone()]);
        let r = rewritten(e.decide(
            b"SELECT a FROM t WHERE id = ? AND b = 'x' AND c = ?",
            &PREPARED,
        ));
        assert_statements(
            &r,
            &["SELECT a FROM t_shadow WHERE id = ? AND b = 'x' AND c = ?"],
        );
        assert_eq!(r.param_map, Some(vec![0, 1]));
        // The same text over the text protocol is a different cache entry.
        assert_eq!(shadow.calls(), 1);
        let r = rewritten(e.decide(b"SELECT a FROM t WHERE id = 1", &PREPARED));
        assert_eq!(r.param_map, Some(vec![]));

        // A rule may reorder and repeat parameters.
        let counter = Counter::new();
        let e = engine(vec![counter.clone()]);
        let r = rewritten(e.decide(b"UPDATE c SET n = n + ? WHERE id = ?", &PREPARED));
        assert_eq!(r.param_map, Some(vec![1, 0, 0]));
        let text = latin1(&r.statements[0]);
        assert!(
            (0..4).any(|s| ast(&text)
                == ast(&format!(
                    "INSERT INTO c_slots (id, slot, n) VALUES (?, {s}, ?) ON DUPLICATE KEY UPDATE n = n + ?"
                ))),
            "{text}"
        );
    }

    #[test]
    fn plans_that_read_literals_are_cached_per_value() {
        let counter = Counter::new();
        let e = engine(vec![counter.clone()]);
        let expect = |r: &Rewritten, id: &str, inc: &str| {
            let text = latin1(&r.statements[0]);
            assert!(
                (0..4).any(|s| ast(&text)
                    == ast(&format!(
                        "INSERT INTO c_slots (id, slot, n) VALUES ({id}, {s}, {inc}) \
                         ON DUPLICATE KEY UPDATE n = n + {inc}"
                    ))),
                "{text}"
            );
        };
        let r = rewritten(e.decide(b"UPDATE c SET n = n + 1 WHERE id = 7", &TEXT));
        expect(&r, "7", "1");
        assert_eq!(counter.calls(), 1);
        // Only the increment was read: a new id of the same class reuses the plan.
        let r = rewritten(e.decide(b"UPDATE c SET n = n + 1 WHERE id = 9", &TEXT));
        expect(&r, "9", "1");
        assert_eq!(counter.calls(), 1);
        let r = rewritten(e.decide(b"UPDATE c SET n = n + 2 WHERE id = 8", &TEXT));
        expect(&r, "8", "2");
        assert_eq!(counter.calls(), 2);
        let rej = rejected(e.decide(b"UPDATE c SET n = n + 0 WHERE id = 8", &TEXT));
        assert_eq!(
            rej.message(),
            "heatsink rule 'counter': the increment must be a positive integer"
        );
        assert_eq!(counter.calls(), 3);
        rejected(e.decide(b"UPDATE c SET n = n + 0 WHERE id = 9", &TEXT));
        rewritten(e.decide(b"UPDATE c SET n = n + 2 WHERE id = 9", &TEXT));
        assert_eq!(counter.calls(), 3);

        // The proxy picks the slot each time.
        let slots: std::collections::HashSet<Vec<u8>> = (0..64)
            .map(|_| {
                rewritten(e.decide(b"UPDATE c SET n = n + 1 WHERE id = 7", &TEXT)).statements[0]
                    .clone()
            })
            .collect();
        assert!(slots.len() > 1);
        assert_eq!(counter.calls(), 3);
    }

    #[test]
    fn literal_where_a_marker_does_not_parse_falls_back_to_exact_text() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = engine(vec![shadow.clone()]);
        let sql = b"SELECT CAST(a AS DECIMAL(10, 2)) FROM t WHERE id = 5";
        let r = rewritten(e.decide(sql, &TEXT));
        assert_statements(
            &r,
            &["SELECT CAST(a AS DECIMAL(10,2)) FROM t_shadow WHERE id = 5"],
        );
        assert_eq!((shadow.calls(), e.parses()), (1, 2));
        // Same text: cached.
        rewritten(e.decide(sql, &TEXT));
        assert_eq!((shadow.calls(), e.parses()), (1, 2));
        // Same shape, other literal: the shape is known to need the exact text.
        let r = rewritten(e.decide(
            b"SELECT CAST(a AS DECIMAL(10, 2)) FROM t WHERE id = 6",
            &TEXT,
        ));
        assert_statements(
            &r,
            &["SELECT CAST(a AS DECIMAL(10,2)) FROM t_shadow WHERE id = 6"],
        );
        assert_eq!((shadow.calls(), e.parses()), (2, 3));
        // Parameters are still mapped.
        let r = rewritten(e.decide(b"SELECT CAST(a AS CHAR(10)) FROM t WHERE id = ?", &PREPARED));
        assert_statements(
            &r,
            &["SELECT CAST(a AS CHAR(10)) FROM t_shadow WHERE id = ?"],
        );
        assert_eq!(r.param_map, Some(vec![0]));
    }

    #[test]
    fn rejections() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = engine(vec![shadow.clone()]);
        // The rule refuses.
        let rej = rejected(e.decide(b"UPDATE t SET a = 1", &TEXT));
        assert_eq!(
            rej.message(),
            "heatsink rule 'shadow': writes to t are not supported"
        );
        assert_eq!(rej.class, RefusalClass::Shape);
        // Several statements.
        let rej = rejected(e.decide(b"SELECT a FROM t; DELETE FROM u", &TEXT));
        assert!(rej.reason.contains("holds 2 statements"), "{}", rej.reason);
        assert_eq!(rej.class, RefusalClass::Unreadable);
        assert_eq!(
            e.decide(b"SELECT 1; SELECT 2", &TEXT),
            Decision::Passthrough
        );
        // Does not parse.
        let rej = rejected(e.decide(b"SELECT a FROM t LOCK IN SHARE MODE", &TEXT));
        assert!(
            rej.reason
                .starts_with("the statement names table 't' but cannot be parsed"),
            "{}",
            rej.reason
        );
        assert_eq!(rej.class, RefusalClass::Unreadable);
        // Administrative commands the parser does not know are forwarded.
        assert_eq!(e.decide(b"CHECKSUM TABLE t", &TEXT), Decision::Passthrough);
        assert_eq!(e.decide(b"optimize table t", &TEXT), Decision::Passthrough);
        rejected(e.decide(b"HANDLER t OPEN", &TEXT));
        // Cannot be lexed.
        let rej = rejected(e.decide(b"SELECT a FROM t WHERE s = 'abc", &TEXT));
        assert!(rej.reason.contains("unterminated string"), "{}", rej.reason);
        // Not UTF-8 outside literals.
        let rej = rejected(e.decide(b"SELECT caf\xe9 FROM t", &TEXT));
        assert!(rej.reason.contains("not valid UTF-8"), "{}", rej.reason);
        // Not UTF-8 and a literal that must stay in place.
        let rej = rejected(e.decide(b"SELECT CAST(a AS CHAR(3)) FROM t WHERE s = '\xe9'", &TEXT));
        assert!(rej.reason.contains("not valid UTF-8"), "{}", rej.reason);
        // A double-quoted name (ANSI_QUOTES) is not waved through.
        assert_ne!(
            e.decide(b"UPDATE \"t\" SET a = 1", &TEXT),
            Decision::Passthrough
        );
        // The same column name in another table is fine, and cached.
        let calls = shadow.calls();
        assert_eq!(
            e.decide(b"SELECT t FROM u WHERE v = 1", &TEXT),
            Decision::Passthrough
        );
        assert_eq!(
            e.decide(b"SELECT t FROM u WHERE v = 2", &TEXT),
            Decision::Passthrough
        );
        assert_eq!(shadow.calls(), calls + 1);
    }

    #[test]
    fn several_rules() {
        let e = engine(vec![
            Shadow::new("a", None, "t"),
            Shadow::new("b", None, "u"),
            Counter::new(),
        ]);
        let rej = rejected(e.decide(b"SELECT * FROM t JOIN u", &TEXT));
        assert_eq!(
            rej.message(),
            "heatsink rule 'a': the statement is also rewritten by rule 'b'; one statement cannot be rewritten by several rules"
        );
        // One rewrites, the other is not concerned.
        let r = rewritten(e.decide(b"SELECT * FROM t WHERE x IN (SELECT c FROM v)", &TEXT));
        assert_statements(&r, &["SELECT * FROM t_shadow WHERE x IN (SELECT c FROM v)"]);
        // One refuses.
        let rej = rejected(e.decide(b"UPDATE c SET n = n * 2 WHERE id = 1", &TEXT));
        assert_eq!(&*rej.rule, "counter");
    }

    #[test]
    fn database_qualifiers() {
        let shadow = Shadow::new("shadow", Some("app"), "t");
        let e = engine(vec![shadow.clone()]);
        let db = |d: &'static str| StatementContext {
            current_db: Some(d),
            ..TEXT
        };
        rewritten(e.decide(b"SELECT a FROM t", &db("app")));
        rewritten(e.decide(b"SELECT a FROM t", &db("APP")));
        assert_eq!(
            e.decide(b"SELECT a FROM t", &db("other")),
            Decision::Passthrough
        );
        let r = rewritten(e.decide(b"SELECT a FROM app.t", &db("other")));
        assert_statements(&r, &["SELECT a FROM app.t_shadow"]);
        rewritten(e.decide(b"SELECT a FROM `app`.`t`", &db("other")));
        assert_eq!(
            e.decide(b"SELECT a FROM other.t", &db("app")),
            Decision::Passthrough
        );
        // Never parsed: the qualifier rules the statement out before.
        assert_eq!(
            e.decide(b"SELECT a FROM other.t WHERE x = (", &db("app")),
            Decision::Passthrough
        );
        // No default database: an unqualified name may be the table.
        rewritten(e.decide(b"SELECT a FROM t", &TEXT));
    }

    #[test]
    fn misbehaving_rules_are_contained() {
        let tables = vec![TableName::new(None, "t")];
        let e = engine(vec![Arc::new(Broken {
            tables: tables.clone(),
            breaks: Breaks::Panics,
        })]);
        let rej = rejected(e.decide(b"SELECT a FROM t", &TEXT));
        assert!(rej.reason.contains("internal error"), "{}", rej.reason);
        assert_eq!(rej.class, RefusalClass::Internal);
        assert_eq!(e.decide(b"SELECT a FROM u", &TEXT), Decision::Passthrough);
        let e = engine(vec![Arc::new(Broken {
            tables: tables.clone(),
            breaks: Breaks::BareParam,
        })]);
        let rej = rejected(e.decide(b"SELECT a FROM t", &TEXT));
        assert!(rej.reason.contains("`?` parameter"), "{}", rej.reason);
        let e = engine(vec![Arc::new(Broken {
            tables,
            breaks: Breaks::LooseAsSent,
        })]);
        let rej = rejected(e.decide(b"UPDATE t SET a = 0", &TEXT));
        assert!(
            rej.reason.contains("must fail as a whole"),
            "{}",
            rej.reason
        );
    }

    #[test]
    fn invalid_rule_sets() {
        let err = |rules: Vec<Arc<dyn Rule>>| Engine::new(rules, 10).unwrap_err();
        assert_eq!(
            err(vec![
                Shadow::new("a", None, "t"),
                Shadow::new("a", None, "u")
            ]),
            EngineError::DuplicateRule("a".into())
        );
        assert_eq!(
            err(vec![Shadow::new("", None, "t")]),
            EngineError::EmptyRuleName
        );
        assert_eq!(
            err(vec![Shadow::new("a", None, "")]),
            EngineError::EmptyTableName("a".into())
        );
        assert!(matches!(
            err(vec![
                Shadow::new("a", Some("x"), "T"),
                Shadow::new("b", None, "t")
            ]),
            EngineError::SharedTable { .. }
        ));
        // Same name in two databases is fine.
        Engine::new(
            vec![
                Shadow::new("a", Some("x"), "t"),
                Shadow::new("b", Some("y"), "t"),
            ],
            10,
        )
        .unwrap();
    }

    #[test]
    fn huge_statements_are_planned_every_time() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = engine(vec![shadow.clone()]);
        let mut sql = b"SELECT a FROM t WHERE b IN (1".to_vec();
        for i in 0..20_000 {
            sql.extend_from_slice(format!(", {i}").as_bytes());
        }
        sql.push(b')');
        rewritten(e.decide(&sql, &TEXT));
        rewritten(e.decide(&sql, &TEXT));
        assert_eq!(shadow.calls(), 2);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let shadow = Shadow::new("shadow", None, "t");
        let e = Engine::new(vec![shadow.clone()], 0).unwrap();
        rewritten(e.decide(b"SELECT a FROM t", &TEXT));
        rewritten(e.decide(b"SELECT a FROM t", &TEXT));
        assert_eq!(shadow.calls(), 2);
    }

    /// A micro benchmark, not a test:
    /// `cargo test --release --lib decide_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn decide_speed() {
        let e = engine(vec![Shadow::new("shadow", None, "hits")]);
        let n = 200_000u32;
        for (what, sql) in [
            (
                "miss",
                &b"SELECT id, name FROM users WHERE id = 42 LIMIT 1"[..],
            ),
            (
                "cached rewrite",
                b"SELECT id, name FROM hits WHERE id = 42 LIMIT 1",
            ),
        ] {
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(e.decide(std::hint::black_box(sql), &TEXT));
            }
            println!("{what}: {:?} per statement", t.elapsed() / n);
        }
        let _ = Ident::new("unused");
    }

    fn ctx_with(
        charset: &[u8],
        no_backslash_escapes: bool,
        ansi_quotes: bool,
    ) -> StatementContext<'static> {
        StatementContext {
            lexing: Some(Lexing {
                charset: super::super::Charset::from_name(charset),
                mode: sqltok::LexMode {
                    no_backslash_escapes,
                    ansi_quotes,
                },
                refused_mode: None,
            }),
            ..TEXT
        }
    }

    /// A rendered statement as canonical text (fingerprint) read under `mode`.
    fn canonical(sql: &[u8], mode: sqltok::LexMode) -> String {
        let toks = sqltok::lex(sql, mode).unwrap();
        let mut out = Vec::new();
        sqltok::normalize(sql, &toks, Mode::Fingerprint, &mut out, &mut Vec::new());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn unknown_session_state_is_asked_for_only_on_a_ruled_table() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        let unknown = StatementContext {
            lexing: None,
            ..TEXT
        };
        assert_eq!(
            e.decide(b"SELECT a FROM u", &unknown),
            Decision::Passthrough
        );
        assert_eq!(
            e.decide(b"SELECT a FROM t", &unknown),
            Decision::NeedSessionState
        );
        assert_eq!(e.parses(), 0);
    }

    #[test]
    fn refused_charsets_refuse_every_mention() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        // The gbk injection of issue 9: 0xbf 0x5c is one character, so the string ends
        // at the quote after it.
        let sql = b"SELECT a FROM t WHERE s = '\xbf\\' UNION SELECT 1 -- '";
        for cs in [
            "gbk", "sjis", "big5", "cp932", "gb18030", "koi8r", "nonesuch",
        ] {
            let r = rejected(e.decide(sql, &ctx_with(cs.as_bytes(), false, false)));
            assert!(r.reason.contains("character set"), "{cs}: {}", r.reason);
            assert_eq!(r.class, RefusalClass::Session);
            // Even a mention the default reading would call a string.
            rejected(e.decide(b"SELECT 't' FROM u", &ctx_with(cs.as_bytes(), false, false)));
        }
        assert!(rejected(e.decide(sql, &ctx_with(b"gbk", false, false)))
            .reason
            .contains("gbk"));
        // Other tables are not affected.
        assert_eq!(
            e.decide(b"SELECT a FROM u", &ctx_with(b"gbk", false, false)),
            Decision::Passthrough
        );
        assert_eq!(e.parses(), 0);
        // utf8mb3, latin1, ascii and binary are read.
        for cs in ["utf8mb3", "utf8", "latin1", "ascii", "binary"] {
            rewritten(e.decide(
                b"SELECT a FROM t WHERE s = 'x'",
                &ctx_with(cs.as_bytes(), false, false),
            ));
        }
    }

    #[test]
    fn no_backslash_escapes_changes_where_literals_end() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        let sql = b"SELECT a FROM t WHERE s = 'x\\' AND id = 1 -- '";
        let std_mode = sqltok::LexMode::default();
        let nbe = sqltok::LexMode {
            no_backslash_escapes: true,
            ansi_quotes: false,
        };
        let r = rewritten(e.decide(sql, &TEXT));
        assert_eq!(
            canonical(&r.statements[0], std_mode),
            "SELECT a FROM t_shadow WHERE s = ?"
        );
        // Same bytes, other mode: a plan of its own, with `AND id = 1` as SQL.
        let r = rewritten(e.decide(sql, &ctx_with(b"utf8mb4", true, false)));
        assert_eq!(
            canonical(&r.statements[0], nbe),
            "SELECT a FROM t_shadow WHERE s = ? AND id = ?"
        );
        assert_eq!(e.parses(), 2);
        // Where a literal must be parsed in place, a backslash in a string is refused.
        let r = rejected(e.decide(
            b"SELECT CAST(a AS DECIMAL(10,2)) FROM t WHERE s = 'x\\'",
            &ctx_with(b"utf8mb4", true, false),
        ));
        assert!(r.reason.contains("NO_BACKSLASH_ESCAPES"), "{}", r.reason);
    }

    #[test]
    fn ansi_quotes_name_tables_with_double_quotes() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        let ansi = ctx_with(b"utf8mb4", false, true);
        let r = rewritten(e.decide(br#"SELECT "a" FROM "t" WHERE s = 'x'"#, &ansi));
        assert_statements(&r, &["SELECT `a` FROM `t_shadow` WHERE s = 'x'"]);
        // The default mode reads `"t"` as a string: not the table.
        assert_eq!(
            e.decide(br#"SELECT "t" FROM u"#, &TEXT),
            Decision::Passthrough
        );
    }

    #[test]
    fn invalid_strings_are_refused_before_a_rewrite() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        let utf8 = ctx_with(b"utf8mb4", false, false);
        let utf8mb3 = ctx_with(b"utf8mb3", false, false);
        for sql in [
            &b"SELECT a FROM t WHERE s = '\xff'"[..],
            b"SELECT a FROM t WHERE s = 'ok' OR s = '\xc3'",
            b"SELECT a FROM t WHERE s = _utf8mb4'\xe9'",
        ] {
            let r = rejected(e.decide(sql, &utf8));
            assert!(r.reason.contains("not well-formed"), "{}", r.reason);
            assert_eq!(r.class, RefusalClass::Value);
        }
        // 4-byte characters are not utf8mb3 (nor are they in N'…').
        rewritten(e.decide("SELECT a FROM t WHERE s = '🎉'".as_bytes(), &utf8));
        rejected(e.decide("SELECT a FROM t WHERE s = '🎉'".as_bytes(), &utf8mb3));
        rejected(e.decide("SELECT a FROM t WHERE s = N'🎉'".as_bytes(), &utf8));
        // An introducer that accepts every byte, or a latin1 connection.
        rewritten(e.decide(b"SELECT a FROM t WHERE s = _latin1'\xe9'", &utf8));
        rewritten(e.decide(b"SELECT a FROM t WHERE s = _binary'\xff'", &utf8));
        rewritten(e.decide(
            b"SELECT a FROM t WHERE s = '\xff'",
            &ctx_with(b"latin1", false, false),
        ));
        // Hex literals with an introducer are strings of that character set.
        rejected(e.decide(b"SELECT a FROM t WHERE s = _utf8mb4 X'FF'", &utf8));
        rejected(e.decide(b"SELECT a FROM t WHERE s = _utf8mb4 0xc3", &utf8));
        rejected(e.decide(b"SELECT a FROM t WHERE s = _utf8mb3 0xF09F9880", &utf8));
        rewritten(e.decide(b"SELECT a FROM t WHERE s = _utf8mb4 x'C3A9'", &utf8));
        rewritten(e.decide(b"SELECT a FROM t WHERE s = _utf8mb4 0x041", &utf8));
        rewritten(e.decide(b"SELECT a FROM t WHERE s = _latin1 0xFF", &utf8));
        assert_eq!(hex_bytes(b"_x X'0aFf'"), vec![0x0a, 0xff]);
        assert_eq!(hex_bytes(b"0x142"), vec![0x01, 0x42]);
        // An ascii connection takes 7-bit strings only.
        rejected(e.decide(
            b"SELECT a FROM t WHERE s = '\xe9'",
            &ctx_with(b"ascii", false, false),
        ));
        // A statement that is forwarded unchanged is not checked.
        assert_eq!(
            e.decide(b"SELECT '\xff' FROM u", &utf8),
            Decision::Passthrough
        );
    }

    #[test]
    fn refused_sql_modes() {
        let e = engine(vec![Shadow::new("shadow", None, "t")]);
        let ctx = StatementContext {
            lexing: Some(Lexing::from_server(
                b"utf8mb4",
                b"STRICT_TRANS_TABLES,EMPTY_STRING_IS_NULL",
            )),
            ..TEXT
        };
        let r = rejected(e.decide(b"SELECT a FROM t WHERE s = ''", &ctx));
        assert!(r.reason.contains("EMPTY_STRING_IS_NULL"), "{}", r.reason);
        assert_eq!(r.class, RefusalClass::Session);
        assert_eq!(e.decide(b"SELECT 't' FROM u", &ctx), Decision::Passthrough);
    }

    #[test]
    fn compound_units_are_split_for_the_parser_and_joined_back() {
        let split = |sql: &str| {
            let tokens = sqltok::lex(sql.as_bytes(), sqltok::LexMode::default()).unwrap();
            split_units(sql.as_bytes(), &tokens).map(|s| latin1(&s))
        };
        assert_eq!(
            split("SELECT day_hour FROM t WHERE x.hour_minute = 1 AND c > NOW() - INTERVAL 2 DAY_HOUR").as_deref(),
            Some("SELECT day_hour FROM t WHERE x.hour_minute = 1 AND c > NOW() - INTERVAL 2 DAY TO HOUR")
        );
        assert_eq!(
            split("SELECT DATE_ADD(c, INTERVAL (1 + 1) minute_second), c + INTERVAL '1-2' YEAR_MONTH FROM t").as_deref(),
            Some("SELECT DATE_ADD(c, INTERVAL (1 + 1) MINUTE TO SECOND), c + INTERVAL '1-2' YEAR TO MONTH FROM t")
        );
        // A plain unit ends the interval; a `TO` of the statement's own stops it all;
        // EXTRACT's units are not an interval's.
        assert_eq!(
            split("SELECT c + INTERVAL 1 HOUR, hour_minute FROM t"),
            None
        );
        assert_eq!(
            split("SELECT c + INTERVAL '1:30' HOUR_MINUTE FROM t WHERE a = 'TO' OR `to` = 1"),
            Some(
                "SELECT c + INTERVAL '1:30' HOUR TO MINUTE FROM t WHERE a = 'TO' OR `to` = 1"
                    .into()
            )
        );
        assert_eq!(split("SELECT c + INTERVAL '1:30' HOUR_MINUTE FROM t WHERE a = 1 AND b IN (SELECT x FROM y) AND TO_DAYS(c) > 1"), Some("SELECT c + INTERVAL '1:30' HOUR TO MINUTE FROM t WHERE a = 1 AND b IN (SELECT x FROM y) AND TO_DAYS(c) > 1".into()));
        assert_eq!(split("SELECT EXTRACT(DAY_HOUR FROM c) FROM t"), None);
        // The way back joins words only, and moves offsets after each join.
        let (joined, shifts) = join_text(
            b"SELECT c + INTERVAL ? HOUR TO MINUTE, 'HOUR TO MINUTE', x FROM t WHERE d < ",
            sqltok::LexMode::default(),
        )
        .unwrap();
        assert_eq!(
            latin1(&joined),
            "SELECT c + INTERVAL ? HOUR_MINUTE, 'HOUR TO MINUTE', x FROM t WHERE d < "
        );
        assert_eq!(joined_offset(20, &shifts), 20);
        assert_eq!(joined_offset(70, &shifts), 67);
    }
}
