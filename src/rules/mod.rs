//! Rule files: loading, validation, and turning them into a rewrite [`Engine`].
//!
//! `--rules` names a file or a directory of `*.toml` files (an empty directory is a
//! valid, empty rule set: pure passthrough). Every file is parsed and validated before
//! any of it is used; an error names the file, line and reason.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, OrErr, Source};
use crate::kinds::{kind, RuleSpec, KINDS};
use crate::rewrite::{Engine, Rule};

pub mod load;
pub mod spec;

/// A rule-file problem, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The file the problem is in.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The rule the problem is in, as (kind, name), when it is one rule's.
    pub rule: Option<(&'static str, String)>,
    /// What is wrong, in words a DBA can act on.
    pub reason: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some((kind, name)) = &self.rule {
            write!(f, ": {kind} '{name}'")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for RuleError {}

/// Lists the rule files under `path` (a file, or a directory's `*.toml`, sorted).
pub fn rule_files(path: &Path) -> Result<Vec<PathBuf>, Error> {
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::with_cause(Source::Rules, format!("rules path {}", path.display()), e)
    })?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let entries = std::fs::read_dir(path).map_err(|e| {
        Error::with_cause(
            Source::Rules,
            format!("reading rules directory {}", path.display()),
            e,
        )
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("reading rules directory {}", path.display()),
                e,
            )
        })?;
        let p = entry.path();
        if p.extension().is_some_and(|x| x == "toml") && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// 1-based line of byte offset `at` in `text`.
pub fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// 1-based line and column of byte offset `at` in `text`.
pub fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let line = line_of(text, at);
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let col = text.get(start..at).map_or(1, |s| s.chars().count() + 1);
    (line, col)
}

/// Lines of the `name = "…"` keys in a file's text, by the name written there (the
/// first line for a name written more than once): where each rule is, for messages.
/// One pass over the text, so that locating every rule stays linear in the number of
/// rules.
pub fn rule_lines(text: &str) -> HashMap<&str, usize> {
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

/// One rule file, read: its rules (not yet validated) and its test cases.
#[derive(Debug, Default)]
pub struct RuleFile {
    /// The rules, kind by kind in [`KINDS`] order, in file order within a kind.
    pub specs: Vec<Arc<dyn RuleSpec>>,
    /// `[[test]]` sections: statements `heatsink check` runs through the rules.
    pub tests: Vec<TestCase>,
}

/// Reads one rule file's text: syntax, known sections, each section's keys. `file`
/// names it in errors.
pub fn read_text(text: &str, file: &Path) -> Result<RuleFile, RuleError> {
    let err = |at: Option<usize>, reason: String| {
        let (line, column) = match at.map(|at| line_col(text, at)) {
            Some((l, c)) => (Some(l), Some(c)),
            None => (None, None),
        };
        RuleError {
            file: file.to_path_buf(),
            line,
            column,
            rule: None,
            reason,
        }
    };
    let toml_err =
        |e: toml::de::Error| err(e.span().map(|s| s.start), e.message().trim().to_string());
    let top: toml::Table = toml::from_str(text).map_err(toml_err)?;
    let mut out = RuleFile::default();
    for key in top.keys() {
        if key != TESTS && kind(key).is_none() {
            let expected: Vec<String> = KINDS
                .iter()
                .map(|k| format!("`{}`", k.section()))
                .chain(std::iter::once(format!("`{TESTS}`")))
                .collect();
            return Err(err(
                section_at(text, key),
                format!(
                    "unknown field `{key}`, expected one of {}",
                    expected.join(", ")
                ),
            ));
        }
    }
    for k in KINDS.iter().filter(|k| top.contains_key(k.section())) {
        out.specs.extend(k.parse(text).map_err(toml_err)?);
    }
    if top.contains_key(TESTS) {
        out.tests = crate::kinds::entries(text, TESTS).map_err(toml_err)?;
    }
    Ok(out)
}

/// The rule-file section holding `heatsink check`'s test cases.
const TESTS: &str = "test";

/// Byte offset of the top-level `[[key]]`, `[key]` or `key =` in `text`.
fn section_at(text: &str, key: &str) -> Option<usize> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let code = line.trim_start();
        let name = code.trim_start_matches('[').trim_start();
        if name.starts_with(key) && name[key.len()..].trim_start().starts_with([']', '=', '.']) {
            return Some(at + line.len() - code.len());
        }
        at += line.len();
    }
    None
}

/// Reads one rule file's text and validates every rule in it, building the
/// planners `serve` uses; `file` names it in errors.
pub fn parse_file(text: &str, file: &Path) -> Result<Vec<Arc<dyn Rule>>, RuleError> {
    let read = read_text(text, file)?;
    validate(&read.specs, text, file)
}

/// Validates `specs` (read from `text`) and builds their planners. A rule's line is
/// looked up only for an error.
pub fn validate(
    specs: &[Arc<dyn RuleSpec>],
    text: &str,
    file: &Path,
) -> Result<Vec<Arc<dyn Rule>>, RuleError> {
    specs
        .iter()
        .map(|s| {
            s.rule().map_err(|reason| RuleError {
                file: file.to_path_buf(),
                line: rule_lines(text).get(s.name()).copied(),
                column: None,
                rule: Some((s.kind(), s.name().to_string())),
                reason,
            })
        })
        .collect()
}

/// Reads a rule file.
fn read_file(file: &Path) -> Result<String, Error> {
    std::fs::read_to_string(file).or_err(Source::Rules, || {
        format!("reading rule file {}", file.display())
    })
}

/// Loads and validates every rule file under `path` and builds an engine.
pub fn load(path: &Path, cache_capacity: u64) -> Result<Engine, Error> {
    let mut rules = Vec::new();
    // Rule names seen so far, with where they were defined.
    let mut seen: HashMap<String, (PathBuf, Option<usize>)> = HashMap::new();
    for file in rule_files(path)? {
        let text = read_file(&file)?;
        let parsed = parse_file(&text, &file).or_err(Source::Rules, || "invalid rule file")?;
        let lines = rule_lines(&text);
        for rule in parsed {
            let line = lines.get(rule.name()).copied();
            if let Some((other, other_line)) = seen.get(rule.name()) {
                let reason = format!(
                    "rule name '{}' is already used at {}:{}",
                    rule.name(),
                    other.display(),
                    other_line.map_or_else(|| "?".to_string(), |l| l.to_string())
                );
                let e = RuleError {
                    file: file.clone(),
                    line,
                    column: None,
                    rule: None,
                    reason,
                };
                return Err(Error::with_cause(Source::Rules, "invalid rule file", e));
            }
            seen.insert(rule.name().to_string(), (file.clone(), line));
            rules.push(rule);
        }
    }
    if rules.is_empty() {
        return Ok(Engine::empty());
    }
    Engine::new(rules, cache_capacity).or_err(Source::Rules, || "building rule set")
}

/// Every rule under `path`, in file order, kind by kind within a file. Every file is
/// first validated exactly as `serve` would load it, so maintenance commands never
/// act on a rule set the proxy would refuse.
pub fn specs(path: &Path) -> Result<Vec<Arc<dyn RuleSpec>>, Error> {
    let mut specs = Vec::new();
    for file in rule_files(path)? {
        let text = read_file(&file)?;
        let read = read_text(&text, &file).or_err(Source::Rules, || "invalid rule file")?;
        validate(&read.specs, &text, &file).or_err(Source::Rules, || "invalid rule file")?;
        specs.extend(read.specs);
    }
    Ok(specs)
}

/// The rules named `only` (an error when there is none), or every rule.
pub fn select(
    specs: Vec<Arc<dyn RuleSpec>>,
    only: Option<&str>,
) -> Result<Vec<Arc<dyn RuleSpec>>, Error> {
    let Some(name) = only else {
        return Ok(specs);
    };
    let picked: Vec<_> = specs.into_iter().filter(|s| s.name() == name).collect();
    if picked.is_empty() {
        return Err(Error::new(Source::Rules, format!("no rule named '{name}'")));
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_dir_is_passthrough() {
        let d = tempfile::tempdir().unwrap();
        let e = load(d.path(), 10).unwrap();
        assert!(!e.has_rules());
    }

    #[test]
    fn syntax_errors_carry_file_and_line() {
        let e = parse_file("\n\n[[counter]\nname = 1\n", Path::new("r.toml")).unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.to_string().starts_with("r.toml:3:"), "{e}");
    }

    /// The shipped examples and every TOML block of the rule reference parse.
    #[test]
    fn shipped_examples_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
        let files = rule_files(&dir).unwrap();
        assert!(!files.is_empty());
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let rules = parse_file(&text, &f).unwrap_or_else(|e| panic!("{e}"));
            assert!(!rules.is_empty(), "{} defines no rule", f.display());
        }
        let reference = std::fs::read_to_string(dir.join("README.md")).unwrap();
        let mut blocks = 0;
        for block in reference.split("```toml").skip(1) {
            let toml = block.split("```").next().unwrap();
            parse_file(toml, Path::new("rules/README.md"))
                .unwrap_or_else(|e| panic!("{e}\n{toml}"));
            blocks += 1;
        }
        assert!(blocks > 0);
    }

    #[test]
    fn duplicate_names_across_files_name_both_places() {
        let d = tempfile::tempdir().unwrap();
        let rule = "[[counter]]\nname = \"hits\"\ntable = \"t1\"\ncolumns = [\"c\"]\nslots = 2\nslot_table = \"s1\"\n";
        std::fs::write(d.path().join("a.toml"), rule).unwrap();
        let other = format!("\n\n{}", rule.replace("t1", "t2").replace("s1", "s2"));
        std::fs::write(d.path().join("b.toml"), other).unwrap();
        let e = load(d.path(), 10).unwrap_err().to_string();
        assert!(e.contains("b.toml:4"), "{e}");
        assert!(e.contains("a.toml:2"), "{e}");
    }

    #[test]
    fn missing_path_is_an_error() {
        assert!(load(Path::new("/nonexistent/heatsink-rules"), 10).is_err());
    }
}

/// What the proxy does with a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Run other statements instead.
    Rewrite,
    /// Forward it unchanged.
    Passthrough,
    /// Refuse it with ERR 1105.
    Reject,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outcome::Rewrite => "rewrite",
            Outcome::Passthrough => "passthrough",
            Outcome::Reject => "reject",
        })
    }
}

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
