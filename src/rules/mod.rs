//! Rule files: loading, validation, and turning them into a rewrite [`Engine`].
//!
//! `--rules` names a file or a directory of `*.toml` files (an empty directory is a
//! valid, empty rule set: pure passthrough). Every file is parsed and validated before
//! any of it is used; an error names the file, line and reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Source};

pub mod spec;
use crate::rewrite::Engine;

/// A rule-file problem, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The file the problem is in.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong, in words a DBA can act on.
    pub reason: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file.display(), l, self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
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

/// The line where the rule called `name` is defined (where its quoted name first
/// appears), for error messages.
fn rule_line(text: &str, name: &str) -> Option<usize> {
    text.find(&format!("\"{name}\""))
        .map(|at| line_of(text, at))
}

/// Parses one rule file's text; `file` names it in errors.
pub fn parse_file(
    text: &str,
    file: &Path,
) -> Result<Vec<Arc<dyn crate::rewrite::Rule>>, RuleError> {
    let err = |line: Option<usize>, reason: String| RuleError {
        file: file.to_path_buf(),
        line,
        reason,
    };
    let parsed: spec::RuleFile = toml::from_str(text).map_err(|e| {
        err(
            e.span().map(|s| line_of(text, s.start)),
            e.message().to_string(),
        )
    })?;
    let mut rules: Vec<Arc<dyn crate::rewrite::Rule>> = Vec::new();
    // A rule's line is looked up only for an error: finding it scans the text, and
    // doing that for every rule made loading quadratic in the number of rules.
    for c in &parsed.counter {
        let rule = crate::kinds::counter::CounterRule::new(c).map_err(|reason| {
            err(
                rule_line(text, &c.name),
                format!("counter '{}': {reason}", c.name),
            )
        })?;
        rules.push(Arc::new(rule));
    }
    for r in &parsed.ring {
        let rule = crate::kinds::ring::RingRule::new(r).map_err(|reason| {
            err(
                rule_line(text, &r.name),
                format!("ring '{}': {reason}", r.name),
            )
        })?;
        rules.push(Arc::new(rule));
    }
    Ok(rules)
}

/// Loads and validates every rule file under `path` and builds an engine.
pub fn load(path: &Path, cache_capacity: u64) -> Result<Engine, Error> {
    let mut rules = Vec::new();
    // Rule names seen so far, with where they were defined.
    let mut seen: Vec<(String, (PathBuf, Option<usize>))> = Vec::new();
    for file in rule_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("reading rule file {}", file.display()),
                e,
            )
        })?;
        let parsed = parse_file(&text, &file)
            .map_err(|e| Error::with_cause(Source::Rules, "invalid rule file", e))?;
        for rule in parsed {
            let line = rule_line(&text, rule.name());
            if let Some((other, other_line)) = seen
                .iter()
                .find(|(name, _)| name.as_str() == rule.name())
                .map(|(_, place)| place)
            {
                let reason = format!(
                    "rule name '{}' is already used at {}:{}",
                    rule.name(),
                    other.display(),
                    other_line.map_or_else(|| "?".to_string(), |l| l.to_string())
                );
                let e = RuleError {
                    file: file.clone(),
                    line,
                    reason,
                };
                return Err(Error::with_cause(Source::Rules, "invalid rule file", e));
            }
            seen.push((rule.name().to_string(), (file.clone(), line)));
            rules.push(rule);
        }
    }
    if rules.is_empty() {
        return Ok(Engine::empty());
    }
    Engine::new(rules, cache_capacity)
        .map_err(|e| Error::with_cause(Source::Rules, "building rule set", e))
}

/// The `[[counter]]` rules under `path`, in file order. Every file is first validated
/// exactly as `serve` would load it, so maintenance commands never act on a rule set
/// the proxy would refuse.
pub fn counter_specs(path: &Path) -> Result<Vec<spec::CounterSpec>, Error> {
    let mut specs = Vec::new();
    for file in rule_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("reading rule file {}", file.display()),
                e,
            )
        })?;
        parse_file(&text, &file)
            .map_err(|e| Error::with_cause(Source::Rules, "invalid rule file", e))?;
        let parsed: spec::RuleFile = toml::from_str(&text).map_err(|e| {
            Error::with_cause(
                Source::Rules,
                format!("invalid rule file {}", file.display()),
                e,
            )
        })?;
        specs.extend(parsed.counter);
    }
    Ok(specs)
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
