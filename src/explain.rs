//! `heatsink explain`: what the proxy would do with a statement, without running it.
//!
//! For each statement it prints the rule that acts on it (or why none does), the
//! statements the proxy would run instead, with the statement's own literal values,
//! what the client then sees, whether the rewrite runs in a transaction of its own,
//! or why the statement would be refused. The decision comes from the same
//! [`Engine`] the proxy uses, built from the same rule files.
//!
//! Some rules need the logical table's columns before they can plan (the counter rule
//! reads them from the database on first use). With `--backend-url` they are read
//! from the database exactly as the proxy reads them; without it each rule kind
//! supplies an assumed column list (see [`crate::kinds::RuleSpec::assumed_columns`]) and the
//! output says so.
//!
//! [`Planner`] is shared with `heatsink check`, which runs the `[[test]]` cases of the
//! rule files through it.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use serde::Serialize;

use crate::error::{Error, Result, Source};
use crate::report::OutputFormat;
use crate::rewrite::{
    Affected, Decision, Engine, EngineError, Plan, PlanContext, Reply, Rule, StatementContext,
    TableName,
};
use crate::schema::emit;
use crate::wire::resultset::ColumnDef;

/// The default database assumed when planning without a database and without `--db`
/// (rules whose table names no database need one).
pub const ASSUMED_DB: &str = "app";

/// What `heatsink explain` was asked to do.
#[derive(Debug, Clone)]
pub struct ExplainOptions<'a> {
    /// Rule file or directory of rule files.
    pub rules: &'a Path,
    /// `mysql://…` to read the tables' columns from; `None` plans with assumed columns.
    pub backend_url: Option<&'a str>,
    /// The connection's default database (`USE db`); default: the URL's database.
    pub db: Option<&'a str>,
    /// Human-readable text or one JSON object per statement.
    pub format: OutputFormat,
    /// The statements; empty: read them from the input, one per line.
    pub sql: &'a [String],
}

pub use crate::rules::Outcome;

/// The explanation of one statement (also the JSON object printed for it).
#[derive(Clone, Debug, Serialize)]
pub struct Explained {
    /// The statement as given.
    pub sql: String,
    /// What the proxy does with it.
    pub outcome: Outcome,
    /// The rule that rewrites or refuses it; for a passthrough, the rule whose table
    /// it names (which leaves it unchanged), if any.
    pub rule: Option<String>,
    /// The statements run instead, in order, with the statement's literal values.
    pub statements: Vec<String>,
    /// Why it is refused, or why it passes through.
    pub reason: Option<String>,
    /// What the client sees.
    pub reply: Option<String>,
    /// How the rewrite relates to transactions.
    pub transaction: Option<String>,
    /// The default database it was planned for.
    pub db: Option<String>,
    /// The acting rule planned with an assumed column list, not the table's own.
    pub assumed_columns: bool,
    /// Text protocol: the query run first, and the statements run then with its
    /// values as literals (`<value i>`), in place of `statements` (which run when
    /// the values do not allow it). See `rewrite::Prelude`.
    pub prelude: Option<(String, Vec<String>)>,
}

impl Explained {
    fn new(sql: &str, db: Option<&str>, outcome: Outcome) -> Self {
        Explained {
            sql: sql.to_string(),
            outcome,
            rule: None,
            statements: Vec::new(),
            reason: None,
            reply: None,
            transaction: None,
            db: db.map(str::to_string),
            assumed_columns: false,
            prelude: None,
        }
    }

    /// The human-readable form, several lines, indented under the statement.
    pub fn human(&self) -> String {
        let mut s = format!("{}\n", self.sql);
        let rule = self.rule.as_deref().unwrap_or("?");
        match self.outcome {
            Outcome::Passthrough => {
                s.push_str(&format!(
                    "  passthrough: {}\n",
                    self.reason.as_deref().unwrap_or("forwarded unchanged")
                ));
            }
            Outcome::Reject => {
                s.push_str(&format!(
                    "  rejected by rule '{rule}': {}\n",
                    self.reason.as_deref().unwrap_or_default()
                ));
            }
            Outcome::Rewrite => {
                if let Some((query, then)) = &self.prelude {
                    s.push_str(&format!(
                        "  rewritten by rule '{rule}' in two steps (text protocol): first\n    {query}\n  then, with its values as literals:\n"
                    ));
                    for (i, st) in then.iter().enumerate() {
                        s.push_str(&format!("    {}. {st}\n", i + 1));
                    }
                    s.push_str("  or, when its values do not allow it (and for prepared statements), in one step into:\n");
                } else {
                    s.push_str(&format!("  rewritten by rule '{rule}' into:\n"));
                }
                for (i, st) in self.statements.iter().enumerate() {
                    s.push_str(&format!("    {}. {st}\n", i + 1));
                }
            }
        }
        if let Some(r) = &self.reply {
            s.push_str(&format!("  client sees: {r}\n"));
        }
        if let Some(t) = &self.transaction {
            s.push_str(&format!("  transaction: {t}\n"));
        }
        if self.assumed_columns {
            s.push_str("  (planned without a database: column list assumed)\n");
        }
        s
    }
}

/// Where rules that ask for a table's columns get them.
pub(crate) enum Columns {
    /// Column lists assumed from the rule files, by rule name (schema left empty).
    Assumed(HashMap<String, Vec<ColumnDef>>),
    /// Read from the database, as the proxy does.
    Backend(Conn),
}

/// Decides statements with the proxy's engine and describes the outcome.
pub(crate) struct Planner {
    /// The engine the proxy would build from these rules.
    engine: Engine,
    /// An engine over [`Probe`] copies of the rules: tells which rule's table a
    /// statement names, which the real engine does not report for a passthrough.
    probe: Engine,
    /// Answers to the rules' metadata questions.
    columns: Columns,
}

impl Planner {
    /// A planner over `rules` (in the order the proxy would consult them).
    pub(crate) fn new(
        rules: Vec<Arc<dyn Rule>>,
        columns: Columns,
    ) -> std::result::Result<Self, EngineError> {
        let probes: Vec<Arc<dyn Rule>> = rules
            .iter()
            .map(|r| {
                Arc::new(Probe {
                    name: r.name().to_string(),
                    tables: r.tables().to_vec(),
                    sharing: r.sharing(),
                }) as Arc<dyn Rule>
            })
            .collect();
        Ok(Planner {
            engine: Engine::new(rules, 1000)?,
            probe: Engine::new(probes, 0)?,
            columns,
        })
    }

    /// Whether column lists are assumed rather than read from the database.
    pub(crate) fn assumes_columns(&self) -> bool {
        matches!(self.columns, Columns::Assumed(_))
    }

    /// The connection to the database, if there is one.
    pub(crate) fn into_conn(self) -> Option<Conn> {
        match self.columns {
            Columns::Backend(c) => Some(c),
            Columns::Assumed(_) => None,
        }
    }

    /// What the proxy does with `sql`, sent as a text statement outside a
    /// transaction on a connection whose default database is `db`.
    pub(crate) async fn explain(&mut self, sql: &str, db: Option<&str>) -> Explained {
        let ctx = StatementContext {
            prepared: false,
            in_transaction: false,
            current_db: db,
            lexing: Some(crate::rewrite::Lexing::STANDARD),
            share: None,
        };
        let mut asked: Vec<usize> = Vec::new();
        let decision = loop {
            let d = self.engine.decide(sql.as_bytes(), &ctx);
            let Decision::NeedMetadata(req) = d else {
                break d;
            };
            let name = self
                .engine
                .rules()
                .get(req.rule)
                .map(|r| r.name().to_string())
                .unwrap_or_default();
            if asked.contains(&req.rule) {
                let mut e = Explained::new(sql, db, Outcome::Reject);
                e.rule = Some(name);
                e.reason = Some("a rule could not learn the table's columns".into());
                return e;
            }
            asked.push(req.rule);
            let cols = match &mut self.columns {
                Columns::Assumed(map) => {
                    let mut cols = map.get(&name).cloned().unwrap_or_default();
                    for c in &mut cols {
                        c.schema = req.db.as_deref().unwrap_or_default().as_bytes().to_vec();
                    }
                    cols
                }
                Columns::Backend(conn) => match fetch_columns(conn, &req.sql).await {
                    Ok(c) => c,
                    Err(e) => {
                        let mut x = Explained::new(sql, db, Outcome::Reject);
                        x.rule = Some(name);
                        x.reason = Some(format!(
                            "the rule asks the database for the table's columns (`{}`), which fails: {e}; the client gets that error",
                            req.sql
                        ));
                        return x;
                    }
                },
            };
            match &self.columns {
                Columns::Assumed(_) => {
                    self.engine
                        .provide_metadata(req.rule, req.db.as_deref(), &cols)
                }
                Columns::Backend(_) => {
                    self.engine
                        .provide_server_metadata(req.rule, req.db.as_deref(), &cols)
                }
            }
        };
        let assumed = self.assumes_columns();
        let (decision, shadow) = match decision {
            Decision::Shadow(would) => (*would, true),
            d => (d, false),
        };
        let mut e = self.explain_decision(sql, db, decision, assumed, &ctx);
        if shadow {
            e.reply = Some(format!(
                "shadow mode: the statement is forwarded unchanged; the rule would answer: {}",
                e.reply.as_deref().unwrap_or("")
            ));
        }
        e
    }

    fn explain_decision(
        &self,
        sql: &str,
        db: Option<&str>,
        decision: Decision,
        assumed: bool,
        ctx: &StatementContext<'_>,
    ) -> Explained {
        match decision {
            Decision::Fallback(f) => {
                let mut e = Explained::new(sql, db, Outcome::Passthrough);
                e.reason = Some(format!(
                    "rule '{}' cannot answer this statement exactly: {}; it is forwarded unchanged and counted as the rule's fallback",
                    f.rule, f.reason
                ));
                e.rule = Some(f.rule.to_string());
                e.reply = Some("the backend's own response".into());
                e.assumed_columns = assumed;
                e
            }
            Decision::Rewrite(rw) => {
                let mut e = Explained::new(sql, db, Outcome::Rewrite);
                e.rule = Some(rw.rule.to_string());
                e.statements = rw
                    .statements
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect();
                e.prelude = rw.prelude.as_ref().map(|p| {
                    let then = p
                        .statements
                        .iter()
                        .map(|(text, holes)| {
                            let mut out = String::new();
                            let mut at = 0;
                            for &(offset, i) in holes {
                                out.push_str(&String::from_utf8_lossy(&text[at..offset]));
                                out.push_str(&format!("<value {}>", i + 1));
                                at = offset;
                            }
                            out.push_str(&String::from_utf8_lossy(&text[at..]));
                            out
                        })
                        .collect();
                    (String::from_utf8_lossy(&p.query).into_owned(), then)
                });
                let mut reply = reply_text(&rw.reply, rw.statements.len());
                if let Some(probe) = &rw.probe {
                    reply.push_str(&format!(
                        "; the column flags follow the server's plan of the statement, asked first: {}",
                        String::from_utf8_lossy(&probe.explain)
                    ));
                }
                e.reply = Some(reply);
                let mut t = if rw.atomic && rw.statements.len() > 1 {
                    "the statements run in a transaction of their own (BEGIN … COMMIT) in autocommit mode; inside the client's transaction when one is open".to_string()
                } else if rw.statements.len() > 1 {
                    "the statements run one after the other, inside the client's transaction when one is open".to_string()
                } else {
                    "one statement, inside the client's transaction when one is open".to_string()
                };
                if let Some(merging) = rw.merge.as_ref().and_then(|m| m.explain()) {
                    t.push_str("; ");
                    t.push_str(merging);
                }
                e.transaction = Some(t);
                e.assumed_columns = assumed;
                e
            }
            Decision::Reject(rej) => {
                let mut e = Explained::new(sql, db, Outcome::Reject);
                e.reply = Some(format!("ERROR 1105 (HY000): {}", rej.message()));
                e.rule = Some(rej.rule.to_string());
                e.reason = Some(rej.reason);
                e.assumed_columns = assumed;
                e
            }
            Decision::Passthrough
            | Decision::NeedMetadata(_)
            | Decision::Shadow(_)
            | Decision::NeedSessionState => {
                let mut e = Explained::new(sql, db, Outcome::Passthrough);
                match self.probe.decide(sql.as_bytes(), ctx) {
                    Decision::NeedMetadata(req) => {
                        let name = self
                            .probe
                            .rules()
                            .get(req.rule)
                            .map(|r| r.name().to_string())
                            .unwrap_or_default();
                        e.reason = Some(format!(
                            "names the table of rule '{name}', which leaves this statement unchanged"
                        ));
                        e.rule = Some(name);
                        e.assumed_columns = assumed;
                    }
                    _ => e.reason = Some("names no ruled table".into()),
                }
                e.reply = Some("the backend's own response".into());
                e
            }
        }
    }
}

/// A stand-in for a rule with its name and tables that always asks for metadata, so
/// the engine reports the first rule whose table a statement names.
struct Probe {
    /// The real rule's name.
    name: String,
    /// The real rule's tables.
    tables: Vec<TableName>,
    /// The real rule's [`Rule::sharing`].
    sharing: Option<u32>,
}

impl Rule for Probe {
    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableName] {
        &self.tables
    }

    fn plan(
        &self,
        _stmt: &sqlparser::ast::Statement,
        _ctx: &PlanContext<'_>,
    ) -> std::result::Result<Option<Plan>, crate::rewrite::Refusal> {
        Ok(None)
    }

    fn metadata_query(&self, _current_db: Option<&str>) -> Option<String> {
        Some(String::new())
    }

    fn sharing(&self) -> Option<u32> {
        self.sharing
    }
}

/// What the client sees for a rewrite.
fn reply_text(reply: &Reply, statements: usize) -> String {
    let rows = |n: u64| {
        if n == 1 {
            "1 row affected".to_string()
        } else {
            format!("{n} rows affected")
        }
    };
    match reply {
        Reply::Ok {
            affected_rows,
            info,
            ..
        } => {
            let mut s = match affected_rows {
                Affected::Fixed(n) => format!("OK, {}", rows(*n)),
                Affected::WrittenOf { rows: n, .. } => {
                    format!("OK, the rows of {} the server wrote (a row it skips counts nothing)", rows(*n))
                }
                Affected::InsertedOrUpdated { .. } => {
                    "OK, 1 row affected when the row is new, 2 when it existed (as the original statement reports); when the first statement warns about anything but the key's duplicate (a value MariaDB converts, a foreign key, a CHECK, another unique key), all is undone and the statement runs as sent".to_string()
                }
            };
            if let Some(info) = info {
                s.push_str(&format!(" ({info})"));
            }
            s
        }
        Reply::OkOf(n) if statements > 1 => {
            format!(
                "the OK of statement {} (affected rows as the original statement)",
                n + 1
            )
        }
        Reply::OkOf(_) | Reply::Last => {
            if statements > 1 {
                "the response of the last statement".to_string()
            } else {
                "the statement's own response".to_string()
            }
        }
        Reply::Patched(_) => {
            "the rows of the rewritten read, with the logical table's column definitions"
                .to_string()
        }
    }
}

/// Runs a rule's metadata query and returns its column definitions.
async fn fetch_columns(
    conn: &mut Conn,
    sql: &str,
) -> std::result::Result<Vec<ColumnDef>, mysql_async::Error> {
    let result = conn.query_iter(sql).await?;
    let cols: Vec<ColumnDef> = result
        .columns()
        .map(|cols| cols.iter().map(column_def).collect())
        .unwrap_or_default();
    result.drop_result().await?;
    Ok(cols)
}

/// A mysql_async column as the proxy's column definition.
fn column_def(c: &mysql_async::Column) -> ColumnDef {
    ColumnDef {
        catalog: b"def".to_vec(),
        schema: c.schema_ref().to_vec(),
        table: c.table_ref().to_vec(),
        org_table: c.org_table_ref().to_vec(),
        name: c.name_ref().to_vec(),
        org_name: c.org_name_ref().to_vec(),
        extended: None,
        charset: c.character_set(),
        length: c.column_length(),
        column_type: c.column_type() as u8,
        flags: c.flags().bits(),
        decimals: c.decimals(),
        fixed_len: 0x0c,
        tail: vec![0, 0],
    }
}

/// The statements to explain: the arguments, or the input's non-empty lines (lines
/// starting with `--` or `#` are comments). A trailing `;` is dropped, as the `mysql`
/// client drops it.
fn statements(args: &[String], input: &mut dyn BufRead) -> Result<Vec<String>> {
    let clean = |s: &str| s.trim().trim_end_matches(';').trim_end().to_string();
    if !args.is_empty() {
        return Ok(args.iter().map(|s| clean(s)).collect());
    }
    let mut out = Vec::new();
    for line in input.lines() {
        let line =
            line.map_err(|e| Error::with_cause(Source::Internal, "reading statements", e))?;
        let t = line.trim();
        if t.is_empty() || t.starts_with("--") || t.starts_with('#') {
            continue;
        }
        out.push(clean(t));
    }
    Ok(out)
}

/// The default database to plan with, and a note about how it was chosen.
pub(crate) fn planning_db(
    explicit: Option<&str>,
    url: Option<&str>,
    offline: bool,
    rules_without_db: bool,
) -> Result<(Option<String>, Option<String>)> {
    if let Some(db) = explicit {
        return Ok((Some(db.to_string()), None));
    }
    if let Some(url) = url {
        return Ok(match crate::schema::default_db(url)? {
            Some(db) => (Some(db), None),
            None if rules_without_db => (
                None,
                Some("no default database (none in --backend-url, no --db): rules whose table names no database refuse statements, as the proxy would".into()),
            ),
            None => (None, None),
        });
    }
    if offline && rules_without_db {
        return Ok((
            Some(ASSUMED_DB.to_string()),
            Some(format!(
                "no --db given: planned as if the connection's default database were `{ASSUMED_DB}`"
            )),
        ));
    }
    Ok((None, None))
}

/// Builds a planner for the rule set under `rules`: with a connection to `url`, or
/// with assumed column lists. Fails like `serve` on a rule set it would refuse.
pub(crate) async fn planner(rules: &Path, url: Option<&str>) -> Result<(Planner, bool)> {
    let set = crate::rules::load::load_rule_set(rules)?;
    let without_db = set
        .rules
        .iter()
        .any(|r| r.tables().iter().any(|t| t.db.is_none()));
    let columns = match url {
        Some(url) => Columns::Backend(crate::schema::connect(url).await?),
        None => Columns::Assumed(set.assumed),
    };
    let planner = Planner::new(set.rules, columns)
        .map_err(|e| Error::with_cause(Source::Rules, "building rule set", e))?;
    Ok((planner, without_db))
}

/// Explains every statement of `opts` (or of `input`) and prints the result.
pub async fn run(
    opts: &ExplainOptions<'_>,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<()> {
    let (mut planner, without_db) = planner(opts.rules, opts.backend_url).await?;
    let (db, db_note) = planning_db(
        opts.db,
        opts.backend_url,
        planner.assumes_columns(),
        without_db,
    )?;
    let human = opts.format == OutputFormat::Human;
    if human {
        if planner.assumes_columns() {
            emit(out, "note: planned without a database: column list assumed (key columns as VARCHAR, counters as BIGINT, …); pass --backend-url for the tables' real columns")?;
        }
        if let Some(n) = &db_note {
            emit(out, &format!("note: {n}"))?;
        }
    }
    let sqls = statements(opts.sql, input)?;
    for sql in &sqls {
        let e = planner.explain(sql, db.as_deref()).await;
        if human {
            emit(out, &e.human())?;
        } else {
            let line = serde_json::to_string(&e)
                .map_err(|e| Error::with_cause(Source::Internal, "writing JSON", e))?;
            emit(out, &line)?;
        }
    }
    if let Some(conn) = planner.into_conn() {
        let _ = conn.disconnect().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_from_lines() {
        let mut input: &[u8] = b"-- comment\nSELECT 1;\n\n  # another\nSELECT 2\n";
        assert_eq!(
            statements(&[], &mut input).unwrap(),
            vec!["SELECT 1".to_string(), "SELECT 2".to_string()]
        );
        let mut none: &[u8] = b"";
        assert_eq!(
            statements(&["SELECT 3 ; ".into()], &mut none).unwrap(),
            vec!["SELECT 3".to_string()]
        );
    }

    #[test]
    fn replies_read_like_the_client_sees_them() {
        let r = Reply::Ok {
            affected_rows: Affected::Fixed(1),
            info: Some("Rows matched: 1  Changed: 1  Warnings: 0".into()),
            last_insert_id: None,
        };
        assert_eq!(
            reply_text(&r, 1),
            "OK, 1 row affected (Rows matched: 1  Changed: 1  Warnings: 0)"
        );
        assert!(reply_text(&Reply::OkOf(0), 2).contains("statement 1"));
    }

    #[test]
    fn planning_db_choice() {
        assert_eq!(
            planning_db(Some("x"), None, true, true)
                .unwrap()
                .0
                .as_deref(),
            Some("x")
        );
        assert_eq!(
            planning_db(None, None, true, true).unwrap().0.as_deref(),
            Some(ASSUMED_DB)
        );
        assert_eq!(planning_db(None, None, true, false).unwrap().0, None);
    }
}
