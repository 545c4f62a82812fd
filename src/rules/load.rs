//! Reading a rule set and validating it without a database: every file parsed and
//! validated as `serve` does, the checks across files (names, tables) and the
//! consistency of `[[test]]` cases. `heatsink check` reports what this finds;
//! `heatsink explain` and `serve`-like callers load a rule set through
//! [`load_rule_set`], which turns any error into one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result, Source};
use crate::kinds::RuleSpec;
use crate::report::Severity;
use crate::rewrite::Rule;
use crate::rules::spec::TableName;
use crate::rules::{rule_lines, Outcome, RuleFile};
use crate::wire::resultset::ColumnDef;

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

/// One rule file, read and parsed.
pub(crate) struct LoadedFile {
    /// Its path, as shown in messages.
    pub(crate) path: PathBuf,
    /// Its text.
    pub(crate) text: String,
    /// Its contents; `None` when it does not parse.
    pub(crate) parsed: Option<RuleFile>,
    /// Why it does not parse or a rule in it is invalid.
    pub(crate) error: Option<crate::rules::RuleError>,
    /// The rules `serve` would build from it (empty when it is invalid).
    pub(crate) rules: Vec<Arc<dyn Rule>>,
    /// It parses and every rule in it is valid on its own.
    pub(crate) valid: bool,
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
pub(crate) fn read_files(path: &Path) -> Result<Vec<LoadedFile>> {
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
pub(crate) fn loaded(path: PathBuf, text: String) -> LoadedFile {
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
pub(crate) fn test_lines(text: &str) -> Vec<usize> {
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
pub(crate) fn static_problems(files: &[LoadedFile]) -> Vec<Problem> {
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
