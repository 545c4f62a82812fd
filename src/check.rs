//! `heatsink check`: validates a rule set before it is deployed, and runs the
//! `[[test]]` cases of its files.
//!
//! 1. Every file on its own: TOML syntax (file:line:column), unknown keys, impossible
//!    values — the same parsing and validation `serve` does ([`crate::rules::parse_file`]).
//! 2. The files together: duplicate rule names (naming both places), two rules on one
//!    table, a rule's physical table that is another rule's table, test cases that name
//!    an unknown rule.
//! 3. With `--backend-url`, the live schema, using the checks `heatsink migrate` makes
//!    ([`crate::migrate::check_rule`] for counters): tables exist, the key is the
//!    primary or a unique key, column types line up, the trigger is in place.
//! 4. The `[[test]]` cases, through the proxy's own engine ([`crate::explain::Planner`]).
//!
//! Every problem is one line, `file:line: rule 'name': reason`; the exit code is 1 when
//! there is a problem or a failing test case.
//!
//! # Adding a rule kind
//!
//! [`Spec`] lists the rule kinds. A new kind adds a variant and its arms: its name and
//! tables, the column list assumed when planning without a database
//! ([`assumed_columns`]), and its live-schema check.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cli::OutputFormat;
use crate::error::{Error, Result, Source};
use crate::explain::{Columns, Explained, Outcome, Planner};
use crate::migrate::{emit, TriggerPlan};
use crate::rewrite::Rule;
use crate::rules::spec::{CounterSpec, RingSpec, RuleFile, TableName};
use crate::wire::resultset::{types, ColumnDef};

/// A `[[test]]` case of a rule file: a statement and what the rules must do with it.
///
/// ```toml
/// [[test]]
/// sql = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'x'"
/// expect = "rewrite"        # or "passthrough" or "reject"
/// rule = "page_hits"        # optional: the rule expected to act
/// contains = "hits_slots"   # optional: in a rewritten statement, or in the reason
/// ```
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    /// The statement, as the application sends it.
    pub sql: String,
    /// What must happen to it.
    pub expect: Outcome,
    /// The rule expected to rewrite or refuse it (for a passthrough: the rule whose
    /// table it names).
    #[serde(default)]
    pub rule: Option<String>,
    /// A text that one of the rewritten statements, or the rejection reason, contains.
    #[serde(default)]
    pub contains: Option<String>,
    /// The connection's default database for this case (default: `--db`, else the
    /// database of `--backend-url`).
    #[serde(default)]
    pub db: Option<String>,
}

/// What `heatsink check` was asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions<'a> {
    /// Rule file or directory of rule files.
    pub rules: &'a Path,
    /// `mysql://…` of the database the rules apply to, for the live-schema checks.
    pub backend_url: Option<&'a str>,
    /// The default database for tables and test cases that name none.
    pub db: Option<&'a str>,
    /// Human-readable lines or one JSON document.
    pub format: OutputFormat,
}

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The rule set must not be deployed as it is.
    Error,
    /// Worth a look; does not fail the check.
    Warning,
}

/// One finding, located as precisely as known.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    /// The rule file.
    pub file: Option<String>,
    /// 1-based line.
    pub line: Option<usize>,
    /// 1-based column (syntax errors).
    pub column: Option<usize>,
    /// The rule concerned.
    pub rule: Option<String>,
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong, in words a DBA can act on.
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}:")?;
            if let Some(l) = self.line {
                write!(f, "{l}:")?;
                if let Some(c) = self.column {
                    write!(f, "{c}:")?;
                }
            }
            f.write_str(" ")?;
        }
        if let Some(r) = &self.rule {
            write!(f, "rule '{r}': ")?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.reason)
    }
}

/// The result of one test case.
#[derive(Clone, Debug, Serialize)]
pub struct TestResult {
    /// The rule file.
    pub file: String,
    /// Line of its `[[test]]` header.
    pub line: Option<usize>,
    /// The case as written.
    pub case: TestCase,
    /// Whether it passed.
    pub pass: bool,
    /// Why it failed.
    pub failure: Option<String>,
    /// What the proxy would do.
    pub got: Explained,
}

impl std::fmt::Display for TestResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:", self.file)?;
        if let Some(l) = self.line {
            write!(f, "{l}:")?;
        }
        write!(f, " test `{}`: ", self.case.sql)?;
        match &self.failure {
            None => f.write_str("pass"),
            Some(why) => write!(f, "FAIL: {why}"),
        }
    }
}

/// Everything `heatsink check` found (also its JSON output).
#[derive(Debug, Serialize)]
pub struct Report {
    /// No errors and no failing test case.
    pub ok: bool,
    /// Rule files read.
    pub files: usize,
    /// Rules defined.
    pub rules: usize,
    /// The live schema was checked.
    pub live: bool,
    /// Errors and warnings.
    pub problems: Vec<Problem>,
    /// Test case results, in file order.
    pub tests: Vec<TestResult>,
    /// Test cases were planned with assumed column lists.
    pub assumed_columns: bool,
    /// Why test cases were not run, if they were not.
    pub tests_skipped: Option<String>,
}

/// One rule as written, whatever its kind.
#[derive(Debug, Clone, Copy)]
pub enum Spec<'a> {
    /// `[[counter]]`.
    Counter(&'a CounterSpec),
    /// `[[ring]]`.
    Ring(&'a RingSpec),
}

impl<'a> Spec<'a> {
    /// Every rule of a file, kind by kind, in file order within a kind.
    pub fn all(file: &'a RuleFile) -> Vec<Spec<'a>> {
        file.counter
            .iter()
            .map(Spec::Counter)
            .chain(file.ring.iter().map(Spec::Ring))
            .collect()
    }

    /// The rule's name.
    pub fn name(&self) -> &'a str {
        match self {
            Spec::Counter(c) => &c.name,
            Spec::Ring(r) => &r.name,
        }
    }

    /// The section name: `counter`, `ring`.
    pub fn kind(&self) -> &'static str {
        match self {
            Spec::Counter(_) => "counter",
            Spec::Ring(_) => "ring",
        }
    }

    /// The logical table, as written.
    fn table(&self) -> &'a str {
        match self {
            Spec::Counter(c) => &c.table,
            Spec::Ring(r) => &r.table,
        }
    }

    /// The physical tables the rule writes besides the logical one, as written.
    fn physical(&self) -> Vec<String> {
        match self {
            Spec::Counter(c) => vec![c.slot_table.clone()],
            Spec::Ring(r) => vec![r.ring_table.clone(), r.seq_table_name()],
        }
    }
}

/// The column list a rule plans with when there is no database to ask: only what
/// the rule itself names, with plausible types. Enough to show how statements are
/// rewritten; a `SELECT *` then lists just these columns.
///
/// - counter: key columns as `VARCHAR(255)`, counter columns as `BIGINT NOT NULL`;
/// - ring: key columns as `VARCHAR(255)`, the `order_by` column as `DATETIME(6)`.
pub fn assumed_columns(spec: &Spec<'_>) -> Vec<ColumnDef> {
    let Ok(table) = TableName::parse(spec.table()) else {
        return Vec::new();
    };
    let col = |name: &str, kind: Assumed| assumed_column(&table.name, name, kind);
    match spec {
        Spec::Counter(c) => c
            .key
            .iter()
            .map(|k| col(k, Assumed::Key))
            .chain(c.columns.iter().map(|n| col(n, Assumed::Counter)))
            .collect(),
        Spec::Ring(r) => r
            .key
            .iter()
            .map(|k| col(k, Assumed::Key))
            .chain(r.order_by.iter().map(|n| col(n, Assumed::Time)))
            .collect(),
    }
}

/// Column shapes [`assumed_columns`] uses.
#[derive(Clone, Copy)]
enum Assumed {
    /// `VARCHAR(255) NOT NULL`, utf8mb4, part of the primary key.
    Key,
    /// `BIGINT NOT NULL`.
    Counter,
    /// `DATETIME(6)`.
    Time,
}

/// `MYSQL_TYPE_VAR_STRING`, the type byte of a VARCHAR column in a result set.
const VAR_STRING: u8 = 0xfd;
/// Column flags: NOT NULL, PRIMARY KEY, numeric.
const NOT_NULL_FLAG: u16 = 0x0001;
const PRI_KEY_FLAG: u16 = 0x0002;
const NUM_FLAG: u16 = 0x8000;
/// Collation ids: utf8mb4_general_ci, binary.
const UTF8MB4: u16 = 45;
const BINARY: u16 = 63;

fn assumed_column(table: &str, name: &str, kind: Assumed) -> ColumnDef {
    let (column_type, charset, length, flags, decimals) = match kind {
        Assumed::Key => (
            VAR_STRING,
            UTF8MB4,
            255 * 4,
            NOT_NULL_FLAG | PRI_KEY_FLAG,
            0,
        ),
        Assumed::Counter => (types::LONGLONG, BINARY, 20, NOT_NULL_FLAG | NUM_FLAG, 0),
        Assumed::Time => (types::DATETIME, BINARY, 26, 0, 6),
    };
    ColumnDef {
        catalog: b"def".to_vec(),
        schema: Vec::new(),
        table: table.as_bytes().to_vec(),
        org_table: table.as_bytes().to_vec(),
        name: name.as_bytes().to_vec(),
        org_name: name.as_bytes().to_vec(),
        extended: None,
        charset,
        length,
        column_type,
        flags,
        decimals,
        fixed_len: 0x0c,
        tail: vec![0, 0],
    }
}

/// One rule file, read and parsed.
struct LoadedFile {
    /// Its path, as shown in messages.
    path: PathBuf,
    /// Its text.
    text: String,
    /// Its contents; `None` when it does not parse.
    parsed: Option<RuleFile>,
    /// The rules `serve` would build from it (empty when it is invalid).
    rules: Vec<Arc<dyn Rule>>,
    /// It parses and every rule in it is valid on its own.
    valid: bool,
}

/// A rule set loaded the way `serve` loads it, with the assumed column lists.
pub(crate) struct RuleSet {
    /// The rules, in file order.
    pub rules: Vec<Arc<dyn Rule>>,
    /// [`assumed_columns`] of every rule, by rule name.
    pub assumed: HashMap<String, Vec<ColumnDef>>,
}

/// Loads the rule set under `path`; any problem is an error (as for `serve`).
pub(crate) fn load_rule_set(path: &Path) -> Result<RuleSet> {
    let files = read_files(path)?;
    let problems: Vec<Problem> = static_problems(&files)
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect();
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(Error::new(
            Source::Rules,
            format!("invalid rule set:\n  {}", lines.join("\n  ")),
        ));
    }
    let mut set = RuleSet {
        rules: Vec::new(),
        assumed: HashMap::new(),
    };
    for f in files {
        if let Some(parsed) = &f.parsed {
            for s in Spec::all(parsed) {
                set.assumed
                    .insert(s.name().to_string(), assumed_columns(&s));
            }
        }
        set.rules.extend(f.rules);
    }
    Ok(set)
}

/// Reads and parses every rule file under `path`.
fn read_files(path: &Path) -> Result<Vec<LoadedFile>> {
    let mut out = Vec::new();
    for file in crate::rules::rule_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("reading rule file {}", file.display()),
                e,
            )
        })?;
        out.push(loaded(file, text));
    }
    Ok(out)
}

/// Parses one file's text.
fn loaded(path: PathBuf, text: String) -> LoadedFile {
    let parsed = toml::from_str::<RuleFile>(&text).ok();
    let (rules, valid) = match (&parsed, crate::rules::parse_file(&text, &path)) {
        (Some(_), Ok(rules)) => (rules, true),
        _ => (Vec::new(), false),
    };
    LoadedFile {
        path,
        text,
        parsed,
        rules,
        valid,
    }
}

/// 1-based line and column of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let line = crate::rules::line_of(text, at);
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let col = text.get(start..at).map_or(1, |s| s.chars().count() + 1);
    (line, col)
}

/// Lines of the `name = "…"` keys in a file's text, by the name written there (the
/// first line for a name written more than once). One pass over the text, so that
/// locating every rule stays linear in the number of rules.
fn rule_lines(text: &str) -> HashMap<&str, usize> {
    let mut out = HashMap::new();
    for (i, l) in text.lines().enumerate() {
        let Some(rest) = l.trim_start().strip_prefix("name") else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        let value = value.trim_start();
        let Some(quote) = value.chars().next().filter(|c| *c == '"' || *c == '\'') else {
            continue;
        };
        let inner = &value[1..];
        if let Some(end) = inner.find(quote) {
            out.entry(&inner[..end]).or_insert(i + 1);
        }
    }
    out
}

/// Lines of the `[[test]]` headers, in order.
fn test_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.split('#').next().unwrap_or_default();
            code.chars()
                .filter(|c| !c.is_whitespace())
                .collect::<String>()
                == "[[test]]"
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// Whether two rule tables can be the same table (a table without a database is
/// that table in any database).
fn overlaps(a: &TableName, b: &TableName) -> bool {
    a.name.eq_ignore_ascii_case(&b.name)
        && match (&a.db, &b.db) {
            (Some(x), Some(y)) => x.eq_ignore_ascii_case(y),
            _ => true,
        }
}

/// A rule met by [`static_problems`], for the checks across rules.
struct Seen {
    /// Rule name.
    name: String,
    /// `file:line` where it is defined.
    at: String,
    /// Its logical table.
    table: TableName,
    /// Its physical tables.
    physical: Vec<TableName>,
}

/// The problems found without a database.
fn static_problems(files: &[LoadedFile]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut seen: Vec<Seen> = Vec::new();
    // Indices into `seen` by rule name and by lower-cased table name (logical and
    // physical), so that the checks across rules stay near-linear.
    let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
    let mut by_table: HashMap<String, Vec<usize>> = HashMap::new();
    for f in files {
        let file = f.path.display().to_string();
        let problem = |line, column, rule: Option<&str>, reason: String| Problem {
            file: Some(file.clone()),
            line,
            column,
            rule: rule.map(str::to_string),
            severity: Severity::Error,
            reason,
        };
        let parsed = match toml::from_str::<RuleFile>(&f.text) {
            Ok(p) => p,
            Err(e) => {
                let (line, col) = match e.span() {
                    Some(s) => {
                        let (l, c) = line_col(&f.text, s.start);
                        (Some(l), Some(c))
                    }
                    None => (None, None),
                };
                problems.push(problem(line, col, None, e.message().trim().to_string()));
                continue;
            }
        };
        let specs = Spec::all(&parsed);
        let rule_line = rule_lines(&f.text);
        if let Err(e) = crate::rules::parse_file(&f.text, &f.path) {
            // The loader names the rule as `<kind> '<name>': …`.
            let owner = specs.iter().find(|s| {
                e.reason
                    .starts_with(&format!("{} '{}': ", s.kind(), s.name()))
            });
            match owner {
                Some(s) => {
                    let reason = e.reason[s.kind().len() + s.name().len() + 5..].to_string();
                    problems.push(problem(
                        e.line.or_else(|| rule_line.get(s.name()).copied()),
                        None,
                        Some(s.name()),
                        reason,
                    ));
                }
                None => problems.push(problem(e.line, None, None, e.reason.clone())),
            }
            continue;
        }
        for s in &specs {
            let line = rule_line.get(s.name()).copied();
            let Ok(logical) = TableName::parse(s.table()) else {
                continue;
            };
            let physical: Vec<TableName> = s
                .physical()
                .iter()
                .filter_map(|t| TableName::parse(t).ok())
                .collect();
            // Only rules with the same name or a table of the same name can clash.
            let mut candidates: Vec<usize> = by_name.get(s.name()).cloned().unwrap_or_default();
            for t in std::iter::once(&logical).chain(&physical) {
                if let Some(v) = by_table.get(&t.name.to_ascii_lowercase()) {
                    candidates.extend(v);
                }
            }
            candidates.sort_unstable();
            candidates.dedup();
            for o in candidates.iter().map(|&i| &seen[i]) {
                let (other, at) = (&o.name, &o.at);
                if other == s.name() {
                    problems.push(problem(
                        line,
                        None,
                        Some(s.name()),
                        format!("another rule has this name ({at}); rule names must be unique"),
                    ));
                    continue;
                }
                if overlaps(&logical, &o.table) {
                    problems.push(problem(
                        line,
                        None,
                        Some(s.name()),
                        format!(
                            "table `{logical}` is also the table of rule '{other}' ({at}); one table can have one rule"
                        ),
                    ));
                }
                for p in &physical {
                    if overlaps(p, &o.table) || o.physical.iter().any(|x| overlaps(p, x)) {
                        problems.push(problem(
                            line,
                            None,
                            Some(s.name()),
                            format!("table `{p}` is also used by rule '{other}' ({at})"),
                        ));
                    }
                }
                if o.physical.iter().any(|x| overlaps(&logical, x)) {
                    problems.push(problem(
                        line,
                        None,
                        Some(s.name()),
                        format!("table `{logical}` is a physical table of rule '{other}' ({at})"),
                    ));
                }
            }
            let index = seen.len();
            by_name.entry(s.name().to_string()).or_default().push(index);
            for t in std::iter::once(&logical).chain(&physical) {
                by_table
                    .entry(t.name.to_ascii_lowercase())
                    .or_default()
                    .push(index);
            }
            seen.push(Seen {
                name: s.name().to_string(),
                at: match line {
                    Some(l) => format!("{file}:{l}"),
                    None => file.clone(),
                },
                table: logical,
                physical,
            });
        }
    }
    // Test cases: known rules, consistent expectations.
    for f in files {
        let Some(parsed) = &f.parsed else { continue };
        let lines = test_lines(&f.text);
        for (i, t) in parsed.test.iter().enumerate() {
            let mut bad = |reason: String| {
                problems.push(Problem {
                    file: Some(f.path.display().to_string()),
                    line: lines.get(i).copied(),
                    column: None,
                    rule: None,
                    severity: Severity::Error,
                    reason: format!("test `{}`: {reason}", t.sql),
                })
            };
            if t.sql.trim().is_empty() {
                bad("sql is empty".into());
            }
            if let Some(r) = &t.rule {
                if !by_name.contains_key(r) {
                    bad(format!("names rule '{r}', which is not defined"));
                }
            }
            if t.contains.is_some() && t.expect == Outcome::Passthrough {
                bad("`contains` applies to expect = \"rewrite\" or \"reject\"".into());
            }
        }
    }
    problems
}

/// The live-schema findings for one rule: `(is_error, reason)`.
async fn live_problems(
    conn: &mut mysql_async::Conn,
    spec: &Spec<'_>,
    default_db: Option<&str>,
) -> Result<Vec<(Severity, String)>> {
    match spec {
        Spec::Counter(c) => {
            let checked = match crate::migrate::check_rule(conn, c, default_db).await {
                Ok(checked) => checked,
                Err(e) => return refusal(e, &format!("counter '{}': ", c.name)),
            };
            let mut out = Vec::new();
            if checked.create_table.is_some() {
                out.push((
                    Severity::Error,
                    format!(
                        "slot table {} does not exist (`heatsink migrate` creates it)",
                        checked.slot.quoted()
                    ),
                ));
            }
            if let TriggerPlan::Create(_) = checked.trigger {
                let trigger = TableName {
                    db: checked.slot.db.clone(),
                    name: checked.trigger_name.clone(),
                };
                out.push((
                    Severity::Error,
                    format!(
                        "trigger {} on {} does not exist, so increments of a new key would not create its row (`heatsink migrate` creates it)",
                        trigger.quoted(),
                        checked.slot.quoted()
                    ),
                ));
            }
            out.extend(checked.notes.into_iter().map(|n| (Severity::Warning, n)));
            Ok(out)
        }
        Spec::Ring(r) => {
            let checked = match crate::migrate::check_ring(conn, r, default_db).await {
                Ok(checked) => checked,
                Err(e) => return refusal(e, &format!("ring '{}': ", r.name)),
            };
            let mut out = Vec::new();
            let missing = "does not exist (`heatsink migrate` creates it)";
            if checked.create_ring.is_some() {
                out.push((
                    Severity::Error,
                    format!("ring table {} {missing}", checked.ring.quoted()),
                ));
            }
            if checked.create_seq.is_some() {
                out.push((
                    Severity::Error,
                    format!("sequence table {} {missing}", checked.seq.quoted()),
                ));
            }
            if let TriggerPlan::Create(_) = checked.seq_trigger {
                out.push((
                    Severity::Error,
                    format!(
                        "trigger {} on {} is missing or differs from the rule's, so inserts would fail (1048) or be numbered wrongly (`heatsink migrate` creates it)",
                        checked.seq_trigger_name.quoted(),
                        checked.ring.quoted()
                    ),
                ));
            }
            if let TriggerPlan::Create(_) = checked.trigger {
                out.push((
                    Severity::Warning,
                    format!(
                        "trigger {} on {} is missing or differs, so rows appended to the log by writers that bypass heatsink would not reach the ring (`heatsink migrate` creates it)",
                        checked.trigger_name.quoted(),
                        checked.logical.quoted()
                    ),
                ));
            }
            if checked.backfill_due {
                out.push((
                    Severity::Warning,
                    format!(
                        "{} has rows but the ring is empty: reads would show nothing until `heatsink migrate --apply` backfills it",
                        checked.logical.quoted()
                    ),
                ));
            }
            if r.coalesce && checked.auto_inc.is_some() && !has_returning(conn).await? {
                out.push((
                    Severity::Warning,
                    "coalesce = true, but this server has no INSERT … RETURNING (MariaDB ≥ 10.5): inserts into a log with an AUTO_INCREMENT column will not be merged".to_string(),
                ));
            }
            for (name, cols) in &checked.unenforced_unique {
                out.push((
                    Severity::Warning,
                    format!(
                        "unique key `{name}` ({}) of {} is not enforced by the ring: an insert that the log would refuse as a duplicate (1062) is kept",
                        cols.join(", "),
                        checked.logical.quoted()
                    ),
                ));
            }
            // migrate's notes describe what it would do (backfill, ids), not problems.
            Ok(out)
        }
    }
}

/// A refusal of `migrate`'s checks as a problem of the rule (its context without the
/// `kind 'name': ` prefix); other errors (the backend failed) are passed on.
fn refusal(e: Error, prefix: &str) -> Result<Vec<(Severity, String)>> {
    if e.source != Source::Rules {
        return Err(e);
    }
    let reason = e.context.strip_prefix(prefix).unwrap_or(&e.context);
    Ok(vec![(Severity::Error, reason.to_string())])
}

/// Whether the server has `INSERT … RETURNING` (MariaDB ≥ 10.5).
async fn has_returning(conn: &mut mysql_async::Conn) -> Result<bool> {
    use mysql_async::prelude::Queryable;
    let version: Option<String> = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| Error::with_cause(Source::Backend, "reading the server version", e))?;
    Ok(version.is_some_and(|v| crate::wire::handshake::has_returning(&v)))
}

/// Judges one test case against what the proxy would do.
fn judge(case: &TestCase, got: &Explained) -> Option<String> {
    let detail = || match got.outcome {
        Outcome::Rewrite => format!(
            "rewrite by rule '{}': {}",
            got.rule.as_deref().unwrap_or_default(),
            got.statements.join("; ")
        ),
        Outcome::Reject => format!(
            "reject by rule '{}': {}",
            got.rule.as_deref().unwrap_or_default(),
            got.reason.as_deref().unwrap_or_default()
        ),
        Outcome::Passthrough => {
            format!("passthrough: {}", got.reason.as_deref().unwrap_or_default())
        }
    };
    if got.outcome != case.expect {
        return Some(format!("expected {}, got {}", case.expect, detail()));
    }
    if let Some(want) = &case.rule {
        if got.rule.as_deref() != Some(want.as_str()) {
            return Some(format!("expected rule '{want}' to act, got {}", detail()));
        }
    }
    if let Some(text) = &case.contains {
        let found = match got.outcome {
            Outcome::Rewrite => got.statements.iter().any(|s| s.contains(text.as_str())),
            Outcome::Reject => got
                .reason
                .as_deref()
                .is_some_and(|r| r.contains(text.as_str())),
            Outcome::Passthrough => false,
        };
        if !found {
            return Some(format!("expected to contain `{text}`, got {}", detail()));
        }
    }
    None
}

/// Checks the rule set of `opts` and prints the report.
pub async fn run(opts: &CheckOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let report = check(opts).await?;
    match opts.format {
        OutputFormat::Json => {
            let json = serde_json::to_string_pretty(&report)
                .map_err(|e| Error::with_cause(Source::Internal, "writing JSON", e))?;
            emit(out, &json)?;
        }
        OutputFormat::Human => print_human(&report, out)?,
    }
    if report.ok {
        return Ok(());
    }
    let errors = report
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .count();
    let failed = report.tests.iter().filter(|t| !t.pass).count();
    Err(Error::new(
        Source::Rules,
        format!("check failed: {errors} problem(s), {failed} failing test case(s)"),
    ))
}

fn print_human(report: &Report, out: &mut dyn Write) -> Result<()> {
    for p in &report.problems {
        emit(out, &p.to_string())?;
    }
    if !report.tests.is_empty() && report.assumed_columns {
        emit(
            out,
            "note: test cases planned without a database: column list assumed (pass --backend-url for the tables' real columns)",
        )?;
    }
    for t in &report.tests {
        emit(out, &t.to_string())?;
    }
    if let Some(why) = &report.tests_skipped {
        emit(out, &format!("test cases not run: {why}"))?;
    }
    let errors = report
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .count();
    let warnings = report.problems.len() - errors;
    let passed = report.tests.iter().filter(|t| t.pass).count();
    emit(
        out,
        &format!(
            "{}: {} rule file(s), {} rule(s){}: {errors} problem(s), {warnings} warning(s); {} test case(s): {passed} passed, {} failed",
            if report.ok { "ok" } else { "FAILED" },
            report.files,
            report.rules,
            if report.live { ", checked against the database" } else { "" },
            report.tests.len(),
            report.tests.len() - passed,
        ),
    )
}

/// Runs every check; backend failures other than schema findings are errors.
pub async fn check(opts: &CheckOptions<'_>) -> Result<Report> {
    let files = read_files(opts.rules)?;
    let mut problems = static_problems(&files);
    let static_ok = problems.iter().all(|p| p.severity != Severity::Error);
    let rules: usize = files
        .iter()
        .filter_map(|f| f.parsed.as_ref())
        .map(|p| Spec::all(p).len())
        .sum();
    let mut report = Report {
        ok: false,
        files: files.len(),
        rules,
        live: false,
        problems: Vec::new(),
        tests: Vec::new(),
        assumed_columns: false,
        tests_skipped: None,
    };

    let url_db = match opts.backend_url {
        Some(url) => crate::migrate::default_db(url)?,
        None => None,
    };
    let default_db = opts.db.map(str::to_string).or(url_db);
    let mut conn = None;
    if let Some(url) = opts.backend_url {
        let mut c = crate::migrate::connect(url).await?;
        report.live = true;
        for f in &files {
            let Some(parsed) = f.parsed.as_ref().filter(|_| f.valid) else {
                continue; // invalid file: already reported
            };
            let rule_line = rule_lines(&f.text);
            for s in Spec::all(parsed) {
                for (severity, reason) in live_problems(&mut c, &s, default_db.as_deref()).await? {
                    problems.push(Problem {
                        file: Some(f.path.display().to_string()),
                        line: rule_line.get(s.name()).copied(),
                        column: None,
                        rule: Some(s.name().to_string()),
                        severity,
                        reason,
                    });
                }
            }
        }
        conn = Some(c);
    }

    let cases: usize = files
        .iter()
        .filter_map(|f| f.parsed.as_ref())
        .map(|p| p.test.len())
        .sum();
    if cases > 0 && !static_ok {
        report.tests_skipped = Some("fix the problems above first".into());
    } else if cases > 0 {
        let mut assumed = HashMap::new();
        let mut all_rules = Vec::new();
        for f in &files {
            if let Some(parsed) = &f.parsed {
                for s in Spec::all(parsed) {
                    assumed.insert(s.name().to_string(), assumed_columns(&s));
                }
            }
            all_rules.extend(f.rules.iter().cloned());
        }
        let without_db = all_rules
            .iter()
            .any(|r| r.tables().iter().any(|t| t.db.is_none()));
        let columns = match conn.take() {
            Some(c) => Columns::Backend(c),
            None => Columns::Assumed(assumed),
        };
        match Planner::new(all_rules, columns) {
            Err(e) => problems.push(Problem {
                file: None,
                line: None,
                column: None,
                rule: None,
                severity: Severity::Error,
                reason: format!("the rule set cannot be built: {e}"),
            }),
            Ok(mut planner) => {
                report.assumed_columns = planner.assumes_columns();
                let (db, _) = crate::explain::planning_db(
                    opts.db,
                    opts.backend_url,
                    planner.assumes_columns(),
                    without_db,
                )?;
                for f in &files {
                    let Some(parsed) = &f.parsed else { continue };
                    let lines = test_lines(&f.text);
                    for (i, case) in parsed.test.iter().enumerate() {
                        let case_db = case.db.as_deref().or(db.as_deref());
                        let sql = case.sql.trim().trim_end_matches(';').trim_end();
                        let got = planner.explain(sql, case_db).await;
                        let failure = judge(case, &got);
                        report.tests.push(TestResult {
                            file: f.path.display().to_string(),
                            line: lines.get(i).copied(),
                            case: case.clone(),
                            pass: failure.is_none(),
                            failure,
                            got,
                        });
                    }
                }
                conn = planner.into_conn();
            }
        }
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
    report.ok = problems.iter().all(|p| p.severity != Severity::Error)
        && report.tests.iter().all(|t| t.pass);
    report.problems = problems;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(name: &str, text: &str) -> LoadedFile {
        super::loaded(PathBuf::from(name), text.to_string())
    }

    const RULE: &str = "[[counter]]\nname = \"h\"\ntable = \"hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\"]\nslots = 4\nslot_table = \"hits_slots\"\n";

    #[test]
    fn syntax_errors_have_line_and_column() {
        let p = static_problems(&[loaded("a.toml", "\n[[counter]]\nname = = 1\n")]);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].line, p[0].column), (Some(3), Some(8)), "{}", p[0]);
        assert!(p[0].to_string().starts_with("a.toml:3:8: "), "{}", p[0]);
    }

    #[test]
    fn duplicates_and_overlaps_name_both_places() {
        let other = RULE.replace("hits_slots", "other_slots");
        let p = static_problems(&[loaded("a.toml", RULE), loaded("b.toml", &other)]);
        let text: Vec<String> = p.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .any(|t| t.starts_with("b.toml:2: rule 'h': another rule has this name (a.toml:2)")),
            "{text:?}"
        );
        let renamed = other.replace("\"h\"", "\"g\"");
        let p = static_problems(&[loaded("a.toml", RULE), loaded("b.toml", &renamed)]);
        assert!(p[0].reason.contains("also the table of rule 'h'"), "{p:?}");
        let slot_clash = RULE
            .replace("\"h\"", "\"g\"")
            .replace("\"hits\"", "\"views\"");
        let p = static_problems(&[loaded("a.toml", RULE), loaded("b.toml", &slot_clash)]);
        assert!(p[0].reason.contains("hits_slots"), "{p:?}");
    }

    #[test]
    fn clashes_are_found_among_many_rules() {
        // 2,000 rules in one file; the clashes are far apart, and table names
        // compare case-insensitively (the checks look rules up by name and table).
        let mut text = String::new();
        for i in 0..2000 {
            let (name, table, slots) = match i {
                1500 => ("r1500".to_string(), "T3".to_string(), "s1500".to_string()),
                1700 => ("r1700".to_string(), "t1700".to_string(), "t10".to_string()),
                1900 => ("r5".to_string(), "t1900".to_string(), "s1900".to_string()),
                _ => (format!("r{i}"), format!("t{i}"), format!("s{i}")),
            };
            text.push_str(&format!(
                "[[counter]]\nname = \"{name}\"\ntable = \"{table}\"\ncolumns = [\"c\"]\nslots = 4\nslot_table = \"{slots}\"\n\n"
            ));
        }
        let p = static_problems(&[loaded("many.toml", &text)]);
        let got: Vec<String> = p.iter().map(ToString::to_string).collect();
        let line = |i: usize| 7 * i + 2;
        assert_eq!(
            got,
            [
                format!("many.toml:{}: rule 'r1500': table `T3` is also the table of rule 'r3' (many.toml:{}); one table can have one rule", line(1500), line(3)),
                format!("many.toml:{}: rule 'r1700': table `t10` is also used by rule 'r10' (many.toml:{})", line(1700), line(10)),
                // A rule is located by the first `name = …` line with its name.
                format!("many.toml:{}: rule 'r5': another rule has this name (many.toml:{}); rule names must be unique", line(5), line(5)),
            ],
        );
        // The index of `name = …` lines agrees with a plain search.
        let lines =
            rule_lines("[[ring]]\n  name='a b' # x\nname = \"c\"\nnamex = \"d\"\nname = \"c\"\n");
        assert_eq!(lines.get("a b"), Some(&2));
        assert_eq!(lines.get("c"), Some(&3));
        assert_eq!(lines.get("d"), None);
    }

    #[test]
    fn invalid_values_name_the_rule() {
        let p = static_problems(&[loaded("a.toml", &RULE.replace("slots = 4", "slots = 0"))]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].rule.as_deref(), Some("h"));
        assert!(p[0].reason.starts_with("slots must be"), "{}", p[0]);
    }

    #[test]
    fn test_cases_are_validated() {
        let text = format!(
            "{RULE}\n[[test]]\nsql = \"SELECT 1\"\nexpect = \"passthrough\"\nrule = \"nope\"\n"
        );
        let p = static_problems(&[loaded("a.toml", &text)]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].line, Some(9));
        assert!(p[0].reason.contains("'nope'"));
        assert_eq!(
            test_lines("[[test]]\n [[ test ]] # x\n[[tests]]\n"),
            vec![1, 2]
        );
    }

    #[test]
    fn assumed_counter_columns() {
        let f: RuleFile = toml::from_str(RULE).unwrap();
        let cols = assumed_columns(&Spec::all(&f)[0]);
        assert_eq!(cols.len(), 2);
        assert_eq!(cols[0].org_name, b"slug");
        assert_eq!(cols[1].column_type, types::LONGLONG);
    }
}
