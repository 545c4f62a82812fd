//! `heatsink check`: validates a rule set before it is deployed, and runs the
//! `[[test]]` cases of its files.
//!
//! 1. Every file on its own: TOML syntax (file:line:column), unknown keys, impossible
//!    values — the same parsing and validation `serve` does ([`crate::rules::parse_file`]).
//! 2. The files together: duplicate rule names (naming both places), two rules on one
//!    table, a rule's physical table that is another rule's table, test cases that name
//!    an unknown rule.
//! 3. With `--backend-url`, the live schema, using the checks `heatsink migrate` makes
//!    (each kind's [`crate::kinds::RuleSpec::schema`]): tables exist, the key is the
//!    primary or a unique key, column types line up, the triggers are in place.
//! 4. The `[[test]]` cases, through the proxy's own engine ([`crate::explain::Planner`]).
//!
//! Every problem is one line, `file:line: rule 'name': reason`; the exit code is 1 when
//! there is a problem or a failing test case.
//!
//! Nothing here names a rule kind: rules are [`RuleSpec`]s read through the
//! [`crate::kinds`] registry.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result, Source};
use crate::explain::{Columns, Explained, Outcome, Planner};
use crate::kinds::{RuleSpec, SchemaError};
use crate::report::{OutputFormat, Severity};
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::rules::{rule_lines, RuleFile, TestCase};
use crate::schema::emit;
use crate::wire::resultset::ColumnDef;

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

/// One rule file, read and parsed.
struct LoadedFile {
    /// Its path, as shown in messages.
    path: PathBuf,
    /// Its text.
    text: String,
    /// Its contents; `None` when it does not parse.
    parsed: Option<RuleFile>,
    /// Why it does not parse or a rule in it is invalid.
    error: Option<crate::rules::RuleError>,
    /// The rules `serve` would build from it (empty when it is invalid).
    rules: Vec<Arc<dyn Rule>>,
    /// It parses and every rule in it is valid on its own.
    valid: bool,
}

/// A rule set loaded the way `serve` loads it, with the assumed column lists.
pub(crate) struct RuleSet {
    /// The rules, in file order.
    pub rules: Vec<Arc<dyn Rule>>,
    /// [`RuleSpec::assumed_columns`] of every rule, by rule name.
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
            for s in &parsed.specs {
                set.assumed
                    .insert(s.name().to_string(), s.assumed_columns());
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

/// Parses and validates one file's text.
fn loaded(path: PathBuf, text: String) -> LoadedFile {
    let read = crate::rules::read_text(&text, &path);
    let validated = read
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|r| crate::rules::validate(&r.specs, &text, &path));
    let (parsed, error) = match read {
        Ok(r) => (Some(r), validated.as_ref().err().cloned()),
        Err(e) => (None, Some(e)),
    };
    let rules = validated.unwrap_or_default();
    LoadedFile {
        path,
        text,
        valid: error.is_none(),
        parsed,
        error,
        rules,
    }
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
    /// Its kind, when rules of that kind may share a logical table.
    shares: Option<&'static str>,
}

/// The rules met so far, indexed by name and by lower-cased table name (logical and
/// physical), so that the checks across rules stay near-linear.
#[derive(Default)]
struct Rules {
    seen: Vec<Seen>,
    by_name: HashMap<String, Vec<usize>>,
    by_table: HashMap<String, Vec<usize>>,
}

impl Rules {
    /// The reasons `spec` (at `at`) clashes with a rule met before, then records it.
    fn add(&mut self, spec: &dyn RuleSpec, at: String) -> Vec<String> {
        let Ok(logical) = TableName::parse(spec.table()) else {
            return Vec::new();
        };
        let physical: Vec<TableName> = spec
            .physical_tables()
            .iter()
            .filter_map(|t| TableName::parse(t).ok())
            .collect();
        let name = spec.name();
        let shares = spec.shares_table().then(|| spec.kind());
        let tables = || std::iter::once(&logical).chain(&physical);
        // Only rules with the same name or a table of the same name can clash.
        let mut candidates: Vec<usize> = self.by_name.get(name).cloned().unwrap_or_default();
        for t in tables() {
            if let Some(v) = self.by_table.get(&t.name.to_ascii_lowercase()) {
                candidates.extend(v);
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        let mut reasons = Vec::new();
        for o in candidates.iter().map(|&i| &self.seen[i]) {
            clashes((name, shares), &logical, &physical, o, &mut reasons);
        }
        let index = self.seen.len();
        self.by_name
            .entry(name.to_string())
            .or_default()
            .push(index);
        for t in tables() {
            self.by_table
                .entry(t.name.to_ascii_lowercase())
                .or_default()
                .push(index);
        }
        self.seen.push(Seen {
            name: name.to_string(),
            at,
            table: logical,
            physical,
            shares,
        });
        reasons
    }
}

/// How rule `name` on `logical` (writing `physical`) clashes with rule `o`. Rules of
/// a kind whose rules share tables may have the same logical table.
fn clashes(
    (name, shares): (&str, Option<&'static str>),
    logical: &TableName,
    physical: &[TableName],
    o: &Seen,
    reasons: &mut Vec<String>,
) {
    let (other, at) = (&o.name, &o.at);
    if other == name {
        reasons.push(format!(
            "another rule has this name ({at}); rule names must be unique"
        ));
        return;
    }
    let shared = shares.is_some() && shares == o.shares;
    if overlaps(logical, &o.table) && !shared {
        reasons.push(format!(
            "table `{logical}` is also the table of rule '{other}' ({at}); one table can have one rule"
        ));
    }
    for p in physical {
        if overlaps(p, &o.table) || o.physical.iter().any(|x| overlaps(p, x)) {
            reasons.push(format!("table `{p}` is also used by rule '{other}' ({at})"));
        }
    }
    if o.physical.iter().any(|x| overlaps(logical, x)) {
        reasons.push(format!(
            "table `{logical}` is a physical table of rule '{other}' ({at})"
        ));
    }
}

/// The problems found without a database.
fn static_problems(files: &[LoadedFile]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut rules = Rules::default();
    for f in files {
        let file = f.path.display().to_string();
        if let Some(e) = &f.error {
            let line = e.line.or_else(|| {
                let (_, name) = e.rule.as_ref()?;
                rule_lines(&f.text).get(name.as_str()).copied()
            });
            problems.push(Problem {
                file: Some(file.clone()),
                line,
                column: e.column,
                rule: e.rule.as_ref().map(|(_, name)| name.clone()),
                severity: Severity::Error,
                reason: e.reason.clone(),
            });
            continue;
        }
        let Some(parsed) = &f.parsed else { continue };
        let rule_line = rule_lines(&f.text);
        for s in &parsed.specs {
            let line = rule_line.get(s.name()).copied();
            let at = match line {
                Some(l) => format!("{file}:{l}"),
                None => file.clone(),
            };
            for reason in rules.add(s.as_ref(), at) {
                problems.push(Problem {
                    file: Some(file.clone()),
                    line,
                    column: None,
                    rule: Some(s.name().to_string()),
                    severity: Severity::Error,
                    reason,
                });
            }
        }
    }
    for f in files {
        test_case_problems(f, &rules.by_name, &mut problems);
    }
    problems
}

/// Test cases: known rules, consistent expectations.
fn test_case_problems(
    f: &LoadedFile,
    rules: &HashMap<String, Vec<usize>>,
    problems: &mut Vec<Problem>,
) {
    let Some(parsed) = &f.parsed else { return };
    let lines = test_lines(&f.text);
    for (i, t) in parsed.tests.iter().enumerate() {
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
            if !rules.contains_key(r) {
                bad(format!("names rule '{r}', which is not defined"));
            }
        }
        if t.contains.is_some() && t.expect == Outcome::Passthrough {
            bad("`contains` applies to expect = \"rewrite\" or \"reject\"".into());
        }
    }
}

/// The live-schema findings for one rule: `(severity, reason)`.
async fn live_problems(
    conn: &mut mysql_async::Conn,
    spec: &dyn RuleSpec,
    default_db: Option<&str>,
) -> Result<Vec<(Severity, String)>> {
    match spec.schema(conn, default_db).await {
        Ok(migration) => migration.problems(conn).await,
        Err(SchemaError::Refused(reason)) => Ok(vec![(Severity::Error, reason)]),
        Err(SchemaError::Failed(e)) => Err(e),
    }
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
        .map(|p| p.specs.len())
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

    let mut conn = None;
    if let Some(url) = opts.backend_url {
        conn = Some(check_live(url, opts.db, &files, &mut problems).await?);
        report.live = true;
    }

    let cases: usize = files
        .iter()
        .filter_map(|f| f.parsed.as_ref())
        .map(|p| p.tests.len())
        .sum();
    if cases > 0 && !static_ok {
        report.tests_skipped = Some("fix the problems above first".into());
    } else if cases > 0 {
        conn = run_test_cases(opts, &files, conn.take(), &mut report, &mut problems).await?;
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
    report.ok = problems.iter().all(|p| p.severity != Severity::Error)
        && report.tests.iter().all(|t| t.pass);
    report.problems = problems;
    Ok(report)
}

/// Connects to `url` and checks every rule of the valid files against the live
/// schema (tables that name no database are in `db`, else the URL's), adding what
/// it finds to `problems`. Returns the connection for the test cases.
async fn check_live(
    url: &str,
    db: Option<&str>,
    files: &[LoadedFile],
    problems: &mut Vec<Problem>,
) -> Result<mysql_async::Conn> {
    let url_db = crate::schema::default_db(url)?;
    let default_db = db.map(str::to_string).or(url_db);
    let mut c = crate::schema::connect(url).await?;
    let galera = crate::schema::on_galera(&mut c).await?;
    for f in files {
        let Some(parsed) = f.parsed.as_ref().filter(|_| f.valid) else {
            continue; // invalid file: already reported
        };
        let rule_line = rule_lines(&f.text);
        for s in &parsed.specs {
            let mut found = live_problems(&mut c, s.as_ref(), default_db.as_deref()).await?;
            let grants = crate::schema::rule_missing_grants(
                &mut c,
                s.table(),
                &s.client_tables(),
                default_db.as_deref(),
            )
            .await?;
            found.extend(grants.iter().map(|g| (Severity::Error, g.describe())));
            if galera {
                found.extend(galera_problems(&mut c, s.as_ref(), default_db.as_deref()).await?);
            }
            for (severity, reason) in found {
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
    let names: Vec<&str> = files
        .iter()
        .filter_map(|f| f.parsed.as_ref())
        .flat_map(|p| p.specs.iter().map(|s| s.name()))
        .collect();
    problems.extend(removed_rule_problems(&mut c, &names, default_db.as_deref()).await?);
    Ok(c)
}

/// Rules `migrate --apply` recorded ([`crate::registry`]) in database `db` (every
/// database the user sees, without one) that are no longer among
/// `names` but whose objects are still in the database: a side table that holds
/// rows is an error (it may hold data the logical table lacks: counter increments,
/// the newest log rows, until `migrate --revert` brings them back); an empty side
/// table or a leftover trigger is a warning.
async fn removed_rule_problems(
    c: &mut mysql_async::Conn,
    names: &[&str],
    db: Option<&str>,
) -> Result<Vec<Problem>> {
    let mut out = Vec::new();
    for reg in crate::registry::all(c, db).await? {
        if names.contains(&reg.name.as_str()) {
            continue;
        }
        let problem = |severity, reason| Problem {
            file: None,
            line: None,
            column: None,
            rule: Some(reg.name.clone()),
            severity,
            reason,
        };
        let revert = format!(
            "run `heatsink migrate --revert {}` once every proxy has reloaded without it",
            reg.name
        );
        let leftovers = match reg.rule().and_then(|s| {
            s.leftovers(Some(&reg.db))
                .map_err(|r| crate::error::Error::new(Source::Rules, r))
        }) {
            Ok(l) => l,
            Err(e) => {
                out.push(problem(
                    Severity::Warning,
                    format!("no longer in the rule files, and its record cannot be read: {e}"),
                ));
                continue;
            }
        };
        for t in &leftovers.tables {
            if crate::schema::inspect_table(c, t).await?.is_none() {
                continue;
            }
            if crate::schema::table_has_rows(c, t).await? {
                out.push(problem(
                    Severity::Error,
                    format!(
                        "{} '{}' is no longer in the rule files, but its table {} still exists \
                         and holds data that the logical table {} may lack: {revert}",
                        reg.kind,
                        reg.name,
                        t.quoted(),
                        reg.logical_table
                    ),
                ));
            } else {
                out.push(problem(
                    Severity::Warning,
                    format!(
                        "{} '{}' is no longer in the rule files, but its (empty) table {} is \
                         left: {revert}",
                        reg.kind,
                        reg.name,
                        t.quoted()
                    ),
                ));
            }
        }
        for t in &leftovers.triggers {
            if crate::schema::existing_trigger(c, t).await?.is_some() {
                out.push(problem(
                    Severity::Warning,
                    format!(
                        "{} '{}' is no longer in the rule files, but its trigger {} is still \
                         in place: {revert}",
                        reg.kind,
                        reg.name,
                        t.quoted()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// What Galera does not support about a rule's table: a table that is not InnoDB
/// is not replicated (writes to it stay on one node), a table without a primary
/// key is replicated slowly and unsafely; `LOCK TABLES` (used by the backfill of
/// `migrate --apply` for rings and rollups) is not replicated either.
async fn galera_problems(
    c: &mut mysql_async::Conn,
    spec: &dyn RuleSpec,
    default_db: Option<&str>,
) -> Result<Vec<(Severity, String)>> {
    use mysql_async::prelude::Queryable;
    let (db, table) = match spec.table().split_once('.') {
        Some((d, t)) => (d.to_string(), t.to_string()),
        None => (
            default_db.unwrap_or_default().to_string(),
            spec.table().to_string(),
        ),
    };
    let mut found = Vec::new();
    let row: Option<(Option<String>, i64)> = c
        .exec_first(
            "SELECT t.ENGINE, (SELECT COUNT(*) FROM information_schema.TABLE_CONSTRAINTS k \
             WHERE k.TABLE_SCHEMA = t.TABLE_SCHEMA AND k.TABLE_NAME = t.TABLE_NAME \
             AND k.CONSTRAINT_TYPE = 'PRIMARY KEY') \
             FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?",
            (&db, &table),
        )
        .await
        .map_err(|e| {
            crate::error::Error::with_cause(Source::Backend, "reading the table's engine", e)
        })?;
    if let Some((engine, pk)) = row {
        let engine = engine.unwrap_or_default();
        if !engine.eq_ignore_ascii_case("InnoDB") {
            found.push((
                Severity::Warning,
                format!(
                    "Galera: table {db}.{table} is {engine}, not InnoDB: Galera replicates only \
                     InnoDB tables, so its rows would differ between nodes"
                ),
            ));
        }
        if pk == 0 {
            found.push((
                Severity::Warning,
                format!(
                    "Galera: table {db}.{table} has no primary key: Galera replicates such \
                     tables slowly and may apply rows in a different order on each node; add one"
                ),
            ));
        }
    }
    if spec.backfills_under_lock() {
        found.push((
            Severity::Warning,
            "Galera: `heatsink migrate --apply` backfills this rule under LOCK TABLES, which \
             holds only on the node it runs on: stop writes to the table on every node (or \
             send them all through that node) while migrate runs"
                .to_string(),
        ));
    }
    Ok(found)
}

/// Runs every file's test cases through a planner over all the rules (column lists
/// read through `conn`, else assumed from the rules) and records the results in
/// `report`; a rule set that cannot be built is a problem. Returns the connection
/// again, if there is one still.
async fn run_test_cases(
    opts: &CheckOptions<'_>,
    files: &[LoadedFile],
    conn: Option<mysql_async::Conn>,
    report: &mut Report,
    problems: &mut Vec<Problem>,
) -> Result<Option<mysql_async::Conn>> {
    let mut assumed = HashMap::new();
    let mut all_rules = Vec::new();
    for f in files {
        if let Some(parsed) = &f.parsed {
            for s in &parsed.specs {
                assumed.insert(s.name().to_string(), s.assumed_columns());
            }
        }
        all_rules.extend(f.rules.iter().cloned());
    }
    let without_db = all_rules
        .iter()
        .any(|r| r.tables().iter().any(|t| t.db.is_none()));
    let columns = match conn {
        Some(c) => Columns::Backend(c),
        None => Columns::Assumed(assumed),
    };
    let mut planner = match Planner::new(all_rules, columns) {
        Ok(planner) => planner,
        Err(e) => {
            problems.push(Problem {
                file: None,
                line: None,
                column: None,
                rule: None,
                severity: Severity::Error,
                reason: format!("the rule set cannot be built: {e}"),
            });
            return Ok(None);
        }
    };
    report.assumed_columns = planner.assumes_columns();
    let (db, _) = crate::explain::planning_db(
        opts.db,
        opts.backend_url,
        planner.assumes_columns(),
        without_db,
    )?;
    for f in files {
        let Some(parsed) = &f.parsed else { continue };
        let lines = test_lines(&f.text);
        for (i, case) in parsed.tests.iter().enumerate() {
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
    Ok(planner.into_conn())
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
        let f = crate::rules::read_text(RULE, Path::new("a.toml")).unwrap();
        let cols = f.specs[0].assumed_columns();
        assert_eq!(cols.len(), 2);
        assert_eq!(cols[0].org_name, b"slug");
        assert_eq!(cols[1].column_type, crate::wire::resultset::types::LONGLONG);
    }
}
