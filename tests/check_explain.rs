//! `heatsink check` and `heatsink explain`, run as the binary against temporary rule
//! directories, and against a real MariaDB for the live-schema checks.

mod common;

use std::path::Path;

use common::cli::{heatsink, migrate, Cli};
use common::client::rules_dir_with as rules_dir;
use common::fixture::{fresh_db, Rule};
use common::mariadb;

/// Runs the binary with `args` and `stdin`; returns (exit code, stdout, stderr).
fn heatsink_in(args: &[&str], stdin: &str) -> (i32, String, String) {
    Cli::new(args).stdin(stdin).run()
}

fn path(d: &tempfile::TempDir) -> &str {
    d.path().to_str().unwrap()
}

fn file(d: &tempfile::TempDir, name: &str) -> String {
    d.path().join(name).display().to_string()
}

/// The counter rule `page_hits` on `hits` (key `slug`, counter `cnt`, 16 slots).
fn counter() -> Rule {
    Rule::counter("page_hits", "hits")
}

/// [`counter`] as TOML.
fn counter_toml() -> String {
    counter().toml()
}

fn check(d: &tempfile::TempDir) -> (i32, String, String) {
    heatsink(&["check", "--rules", path(d)])
}

#[test]
fn a_good_rule_set_passes() {
    let d = rules_dir(&[("counters.toml", &counter_toml())]);
    let (code, out, err) = check(&d);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.starts_with("ok: 1 rule file(s), 1 rule(s)"), "{out}");

    // The shipped examples pass too.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let (code, out, err) = heatsink(&["check", "--rules", shipped.to_str().unwrap()]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let d = rules_dir(&[(
        "broken.toml",
        "[[counter]]\nname = \"x\"\ntable = \"hits\"\ncolumns = [\"cnt\"\nslots = 3\n",
    )]);
    let (code, out, err) = check(&d);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    let want = format!("{}:5:1: ", file(&d, "broken.toml"));
    assert!(out.lines().any(|l| l.starts_with(&want)), "{out}");
    assert!(err.contains("check failed"), "{err}");
}

#[test]
fn unknown_keys_are_reported() {
    let d = rules_dir(&[(
        "c.toml",
        &counter_toml().replace("slots = 16", "slots = 16\nslotz = 4"),
    )]);
    let (code, out, _) = check(&d);
    assert_eq!(code, 1, "{out}");
    let want = format!("{}:7:1: unknown field `slotz`", file(&d, "c.toml"));
    assert!(out.lines().any(|l| l.starts_with(&want)), "{out}");
}

#[test]
fn impossible_values_name_the_rule() {
    let d = rules_dir(&[("c.toml", &counter_toml().replace("slots = 16", "slots = 0"))]);
    let (code, out, _) = check(&d);
    assert_eq!(code, 1, "{out}");
    let want = format!("{}:2: rule 'page_hits': slots must be", file(&d, "c.toml"));
    assert!(out.lines().any(|l| l.starts_with(&want)), "{out}");
}

#[test]
fn duplicate_names_and_shared_tables_name_both_files() {
    let other = counter_toml()
        .replace("\"hits\"", "\"views\"")
        .replace("hits_slots", "views_slots");
    let d = rules_dir(&[("a.toml", &counter_toml()), ("b.toml", &other)]);
    let (code, out, _) = check(&d);
    assert_eq!(code, 1, "{out}");
    let want = format!(
        "{}:2: rule 'page_hits': another rule has this name ({}:2)",
        file(&d, "b.toml"),
        file(&d, "a.toml")
    );
    assert!(out.lines().any(|l| l.starts_with(&want)), "{out}");

    let same_table = counter_toml()
        .replace("page_hits", "hits_again")
        .replace("hits_slots", "other_slots");
    let d = rules_dir(&[("a.toml", &counter_toml()), ("b.toml", &same_table)]);
    let (code, out, _) = check(&d);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("rule 'hits_again': table `hits` is also the table of rule 'page_hits'"),
        "{out}"
    );
}

#[test]
fn test_cases_report_pass_and_fail() {
    let text = format!(
        r#"{COUNTER}
[[test]]
sql = "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'x'"
expect = "rewrite"
rule = "page_hits"
contains = "hits_slots"

[[test]]
sql = "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'x'"
expect = "reject"
contains = "cannot be rewritten"

[[test]]
sql = "SELECT 1"
expect = "passthrough"

[[test]]
sql = "SELECT cnt FROM hits WHERE slug = 'x'"
expect = "passthrough"
"#,
        COUNTER = counter()
    );
    let d = rules_dir(&[("c.toml", &text)]);
    let (code, out, _) = check(&d);
    assert_eq!(code, 1, "{out}");
    let f = file(&d, "c.toml");
    for (line, sql, verdict) in [
        (9, "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'x'", "pass"),
        (15, "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'x'", "pass"),
        (20, "SELECT 1", "pass"),
        (
            24,
            "SELECT cnt FROM hits WHERE slug = 'x'",
            "FAIL: expected passthrough, got rewrite by rule 'page_hits'",
        ),
    ] {
        let want = format!("{f}:{line}: test `{sql}`: {verdict}");
        assert!(out.lines().any(|l| l.starts_with(&want)), "{want}\n{out}");
    }
    assert!(
        out.contains("planned without a database: column list assumed"),
        "{out}"
    );
    assert!(out.contains("4 test case(s): 3 passed, 1 failed"), "{out}");

    // JSON: the same verdicts, machine-readable.
    let (code, out, _) = heatsink(&["check", "--rules", path(&d), "--format", "json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    let tests = v["tests"].as_array().unwrap();
    let passes: Vec<bool> = tests.iter().map(|t| t["pass"].as_bool().unwrap()).collect();
    assert_eq!(passes, [true, true, true, false]);
    assert_eq!(tests[0]["got"]["outcome"], "rewrite");

    // A test naming an unknown rule is a problem of the file.
    let d = rules_dir(&[(
        "c.toml",
        &format!(
            "{COUNTER}\n[[test]]\nsql = \"SELECT 1\"\nexpect = \"passthrough\"\nrule = \"nope\"\n",
            COUNTER = counter()
        ),
    )]);
    let (code, out, _) = check(&d);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("names rule 'nope', which is not defined"),
        "{out}"
    );
}

const STATEMENTS: [&str; 4] = [
    "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'",
    "SELECT cnt FROM hits WHERE slug = 'home'",
    "UPDATE hits SET cnt = cnt * 2 WHERE slug = 'home'",
    "SELECT * FROM users WHERE id = 1",
];

#[test]
fn explain_human() {
    let d = rules_dir(&[("c.toml", &counter_toml())]);
    let mut args = vec!["explain", "--rules", path(&d), "--db", "shop"];
    args.extend(STATEMENTS);
    let (code, out, err) = heatsink(&args);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("planned without a database: column list assumed"),
        "{out}"
    );
    let blocks: Vec<&str> = out.split("\n\n").collect();
    let block = |sql: &str| {
        *blocks
            .iter()
            .find(|b| b.lines().any(|l| l == sql))
            .unwrap_or_else(|| panic!("no block for {sql}:\n{out}"))
    };
    let inc = block(STATEMENTS[0]);
    assert!(inc.contains("rewritten by rule 'page_hits' into:"), "{inc}");
    assert!(
        inc.contains("1. INSERT INTO `hits_slots` (`slug`, `slot`, `cnt`) VALUES ('home', "),
        "{inc}"
    );
    assert!(
        inc.contains("client sees: OK, 1 row affected (Rows matched: 1  Changed: 1  Warnings: 0)"),
        "{inc}"
    );
    assert!(inc.contains("transaction: one statement"), "{inc}");
    let read = block(STATEMENTS[1]);
    assert!(read.contains("SUM(`hs_s`.`cnt`)"), "{read}");
    assert!(
        read.contains("logical table's column definitions"),
        "{read}"
    );
    let rej = block(STATEMENTS[2]);
    assert!(
        rej.contains("rejected by rule 'page_hits': SET cnt = cnt * ? cannot be rewritten"),
        "{rej}"
    );
    assert!(
        rej.contains("client sees: ERROR 1105 (HY000): heatsink rule 'page_hits'"),
        "{rej}"
    );
    let pass = block(STATEMENTS[3]);
    assert!(pass.contains("passthrough: names no ruled table"), "{pass}");
}

#[test]
fn explain_json_from_stdin() {
    let d = rules_dir(&[("c.toml", &counter_toml())]);
    let input = format!("-- one statement per line\n{};\n", STATEMENTS.join("\n"));
    let (code, out, err) = heatsink_in(
        &["explain", "--rules", path(&d), "--format", "json"],
        &input,
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(v.len(), 4, "{out}");
    for (o, sql) in v.iter().zip(STATEMENTS) {
        assert_eq!(o["sql"], sql);
    }
    assert_eq!(v[0]["outcome"], "rewrite");
    assert_eq!(v[0]["rule"], "page_hits");
    assert_eq!(v[0]["statements"].as_array().unwrap().len(), 1);
    assert!(v[0]["statements"][0]
        .as_str()
        .unwrap()
        .starts_with("INSERT INTO `hits_slots`"));
    assert_eq!(v[0]["assumed_columns"], true);
    assert_eq!(v[1]["outcome"], "rewrite");
    assert_eq!(v[2]["outcome"], "reject");
    assert!(v[2]["reason"]
        .as_str()
        .unwrap()
        .contains("cannot be rewritten"));
    assert_eq!(v[3]["outcome"], "passthrough");
    assert_eq!(v[3]["rule"], serde_json::Value::Null);
}

#[test]
fn explain_refuses_a_broken_rule_set() {
    let d = rules_dir(&[("c.toml", "[[counter]\n")]);
    let (code, _, err) = heatsink(&["explain", "--rules", path(&d), "SELECT 1"]);
    assert_eq!(code, 1);
    assert!(err.contains("c.toml:1:"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Against MariaDB

#[test]
fn live_check_finds_a_missing_slot_table_and_passes_after_migrate() {
    let db = "hs_check_live";
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) NOT NULL PRIMARY KEY, cnt INT NOT NULL DEFAULT 0,
             title VARCHAR(20));",
    );
    let rules = format!(
        "{COUNTER}\n[[test]]\nsql = \"SELECT * FROM hits WHERE slug = 'x'\"\nexpect = \"rewrite\"\ncontains = \"`hs_h`.`title`\"\n",
        COUNTER = counter()
    );
    let d = rules_dir(&[("c.toml", &rules)]);
    let url = mariadb().url(db);
    let f = file(&d, "c.toml");

    let (code, out, err) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    let want = format!("{f}:2: rule 'page_hits': slot table `{db}`.`hits_slots` does not exist");
    assert!(out.lines().any(|l| l.starts_with(&want)), "{out}");
    assert!(out.contains("`hits_slots_hs_ai`"), "{out}");
    // The test case was planned with the table's real columns (`title` included).
    assert!(
        out.contains(": test `SELECT * FROM hits WHERE slug = 'x'`: pass"),
        "{out}"
    );
    assert!(!out.contains("column list assumed"), "{out}");

    let (code, out, err) = migrate(d.path(), db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (code, out, err) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("checked against the database"), "{out}");

    // A rule whose key is not a unique key of the table is refused with migrate's reason.
    let bad = counter().key(&["title"]).toml();
    let d = rules_dir(&[("c.toml", &bad)]);
    let (code, out, _) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("rule 'page_hits': key (`title`) is neither the primary key nor a unique key"),
        "{out}"
    );

    // explain with the backend reads the real columns.
    let d = rules_dir(&[("c.toml", &counter_toml())]);
    let (code, out, err) = heatsink(&[
        "explain",
        "--rules",
        path(&d),
        "--backend-url",
        &url,
        "--format",
        "json",
        "SELECT * FROM hits",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["outcome"], "rewrite");
    assert_eq!(v["assumed_columns"], false);
    assert!(
        v["statements"][0]
            .as_str()
            .unwrap()
            .contains("`hs_h`.`title`"),
        "{out}"
    );

    // In a database without the table, the rule's question for the columns fails and
    // the client would get that error.
    let (code, out, err) = heatsink(&[
        "explain",
        "--rules",
        path(&d),
        "--backend-url",
        &url,
        "--db",
        "hs_check_nope",
        "SELECT * FROM hits",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("rejected by rule 'page_hits'"), "{out}");
    assert!(out.contains("doesn't exist"), "{out}");
}

/// The ring rule `visits` on `visits_log` (5 rows per `uid`, coalesce on).
fn ring_toml() -> String {
    Rule::ring("visits", "visits_log")
        .key(&["uid"])
        .size(5)
        .ring_table("visits_ring")
        .seq_table("visits_seq")
        .coalesce(true)
        .toml()
}

/// Ring rules are checked against the live schema like counters: missing ring and
/// sequence tables and triggers are reported, a log with rows and an empty ring is
/// a warning, and after `heatsink migrate --apply` the check passes.
#[test]
fn live_check_of_a_ring_rule() {
    let db = "hs_check_ring";
    fresh_db(
        db,
        "CREATE TABLE visits_log (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL,
             visitor_uid INT NOT NULL, KEY (uid));
         INSERT INTO visits_log (uid, visitor_uid) VALUES (1, 2), (1, 3);",
    );
    let d = rules_dir(&[("r.toml", &ring_toml())]);
    let url = mariadb().url(db);
    let f = file(&d, "r.toml");

    let (code, out, err) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    for want in [
        format!("{f}:2: rule 'visits': ring table `{db}`.`visits_ring` does not exist"),
        format!("{f}:2: rule 'visits': sequence table `{db}`.`visits_seq` does not exist"),
        format!("{f}:2: rule 'visits': trigger `{db}`.`visits_ring_hs_seq`"),
        format!("{f}:2: rule 'visits': warning: trigger `{db}`.`visits_ring_hs_log`"),
        format!(
            "{f}:2: rule 'visits': warning: `{db}`.`visits_log` has rows but the ring is empty"
        ),
    ] {
        assert!(out.lines().any(|l| l.starts_with(&want)), "{want}\n{out}");
    }
    // MariaDB has RETURNING: no warning about coalesce.
    assert!(!out.contains("RETURNING"), "{out}");

    let (code, out, err) = migrate(d.path(), db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (code, out, err) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("warning:"), "{out}");

    // A unique key of the log other than its AUTO_INCREMENT key: the ring keeps
    // duplicates the log would refuse.
    mariadb().exec(&format!(
        "ALTER TABLE {db}.visits_log ADD UNIQUE KEY uv (uid, visitor_uid)"
    ));
    let (code, out, _) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 0, "{out}");
    let want = format!(
        "{f}:2: rule 'visits': warning: unique key `uv` (uid, visitor_uid) of `{db}`.`visits_log` is not enforced by the ring"
    );
    assert!(out.lines().any(|l| l.starts_with(&want)), "{want}\n{out}");

    // Without the numbering trigger inserts would fail: an error.
    mariadb().exec(&format!("DROP TRIGGER {db}.visits_ring_hs_seq"));
    let (code, out, _) = heatsink(&["check", "--rules", path(&d), "--backend-url", &url]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("would fail (1048)"), "{out}");
}

/// The rule reference's `[[test]]` example is a rule set whose cases all pass.
#[test]
fn reference_test_example_passes() {
    let reference =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/README.md"))
            .unwrap();
    let block = reference
        .split("```toml")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("[[test]]"))
        .expect("a [[test]] example in rules/README.md");
    let d = rules_dir(&[("example.toml", block)]);
    let (code, out, err) = check(&d);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("3 test case(s): 3 passed, 0 failed"), "{out}");
}
