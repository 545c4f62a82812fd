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
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result, Source};
use crate::explain::{Columns, Explained, Outcome, Planner};
use crate::kinds::{RuleSpec, SchemaError};
use crate::report::{OutputFormat, Severity};
pub use crate::rules::load::Problem;
use crate::rules::load::{read_files, static_problems, test_lines, LoadedFile};
use crate::rules::{rule_lines, TestCase};
use crate::schema::emit;

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
        crate::rules::load::loaded(std::path::PathBuf::from(name), text.to_string())
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
