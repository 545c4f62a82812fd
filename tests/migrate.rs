//! `heatsink migrate` and `heatsink compact` against a real MariaDB.
//!
//! Each test works in its own database, so the tests run in parallel with each other
//! and with other test binaries.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cli::{heatsink, migrate};
use common::client::rules_dir as rules_dir_of;
use common::fixture::{fresh_db, scalar, table_exists, Rule};
use common::mariadb;
use mysql_async::prelude::Queryable;

// ---------------------------------------------------------------------------------------
// Helpers

/// A rules directory holding `counters.toml` with `text`, and its path.
fn rules_dir(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = rules_dir_of("counters.toml", text);
    let path = dir.path().to_path_buf();
    (dir, path)
}

/// A counter rule with 16 slots, followed by an empty line (rules are concatenated).
fn counter_rule(
    name: &str,
    table: &str,
    key: &[&str],
    columns: &[&str],
    slot_table: &str,
) -> String {
    Rule::counter(name, table)
        .key(key)
        .columns(columns)
        .slot_table(slot_table)
        .toml()
        + "\n"
}

fn trigger_exists(db: &str, trigger: &str) -> bool {
    scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = '{db}' AND TRIGGER_NAME = '{trigger}'"
    ))
    .as_deref()
        == Some("1")
}

/// COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME of one column.
fn column_type(db: &str, table: &str, column: &str) -> Vec<Option<String>> {
    mariadb()
        .query_strings(&format!(
            "SELECT COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = '{table}' AND COLUMN_NAME = '{column}'"
        ))
        .remove(0)
}

/// `key → value` of a two-column result.
fn pairs(sql: &str) -> Vec<(String, i64)> {
    mariadb()
        .query_strings(sql)
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap(),
                r[1].clone().unwrap().parse::<i64>().unwrap(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// migrate

#[test]
fn migrate_prints_then_applies_then_is_a_no_op() {
    let db = "hs_mig_apply";
    // latin1 table default, utf8mb4_bin key column: the copy must carry the column's own
    // character set and collation.
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
             cnt INT UNSIGNED NOT NULL DEFAULT 0, views BIGINT NOT NULL DEFAULT 0,
             title VARCHAR(20), PRIMARY KEY (slug)) DEFAULT CHARSET=latin1;
         INSERT INTO hits VALUES ('home', 10, 1, 'Home');",
    );
    let (_d, rules) = rules_dir(&counter_rule(
        "page_hits",
        "hits",
        &["slug"],
        &["cnt", "views"],
        "hits_slots",
    ));
    let rules = rules.to_str().unwrap();

    // Without --apply: the DDL, nothing created.
    let (code, out, err) = migrate(Path::new(rules), db, false);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("-- rule page_hits"), "{out}");
    assert!(
        out.contains(&format!("CREATE TABLE IF NOT EXISTS `{db}`.`hits_slots`")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "CREATE TRIGGER IF NOT EXISTS `{db}`.`hits_slots_hs_ai` AFTER INSERT ON `{db}`.`hits_slots` FOR EACH ROW BEGIN "
        )) && out.contains(&format!(
            "INSERT INTO `{db}`.`hits` (`slug`, `cnt`, `views`) VALUES (NEW.`slug`, 0, 0); END;"
        )),
        "{out}"
    );
    assert!(!out.contains("-- applied"), "{out}");
    assert!(!table_exists(db, "hits_slots"));
    assert!(!trigger_exists(db, "hits_slots_hs_ai"));

    // --apply: created, and the output says so.
    let (code, out, err) = migrate(Path::new(rules), db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("-- applied: created slot table"), "{out}");
    assert!(out.contains("-- applied: created trigger"), "{out}");
    assert!(table_exists(db, "hits_slots"));
    assert!(trigger_exists(db, "hits_slots_hs_ai"));

    let show = mariadb().query_strings(&format!("SHOW CREATE TABLE {db}.hits_slots"));
    let ddl = show[0][1].clone().unwrap();
    assert!(ddl.contains("PRIMARY KEY (`slug`,`slot`)"), "{ddl}");
    assert!(
        ddl.contains("`slug` varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"),
        "{ddl}"
    );
    assert!(
        ddl.contains("`slot` smallint(5) unsigned NOT NULL"),
        "{ddl}"
    );
    assert!(ddl.contains("`cnt` bigint(20) NOT NULL DEFAULT 0"), "{ddl}");
    assert!(
        ddl.contains("`views` bigint(20) NOT NULL DEFAULT 0"),
        "{ddl}"
    );
    assert!(ddl.contains("ENGINE=InnoDB"), "{ddl}");
    assert!(ddl.contains("DEFAULT CHARSET=latin1"), "{ddl}");
    assert!(!ddl.contains("title"), "{ddl}");
    assert_eq!(
        column_type(db, "hits_slots", "slug"),
        column_type(db, "hits", "slug")
    );

    // The trigger creates the logical row of a new key, counters at 0.
    mariadb().exec(&format!(
        "INSERT INTO {db}.hits_slots (slug, slot, cnt) VALUES ('new', 3, 5)
         ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt);
         INSERT INTO {db}.hits_slots (slug, slot, cnt) VALUES ('home', 1, 2)"
    ));
    assert_eq!(
        mariadb().query_strings(&format!(
            "SELECT slug, cnt, views, title FROM {db}.hits ORDER BY slug"
        )),
        vec![
            vec![
                Some("home".into()),
                Some("10".into()),
                Some("1".into()),
                Some("Home".into())
            ],
            vec![Some("new".into()), Some("0".into()), Some("0".into()), None],
        ]
    );

    // Second --apply: nothing to do.
    let (code, out, err) = migrate(Path::new(rules), db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("CREATE"), "{out}");
    assert!(!out.contains("-- applied"), "{out}");
    assert!(out.contains("exists and matches"), "{out}");
}

#[test]
fn migrate_db_prefix_composite_key_and_global_counter() {
    let db = "hs_mig_prefix";
    fresh_db(
        db,
        "CREATE TABLE stats (id INT AUTO_INCREMENT PRIMARY KEY, tenant INT UNSIGNED NOT NULL,
             day DATE NOT NULL, n SMALLINT NOT NULL DEFAULT 0, UNIQUE KEY tday (day, tenant));
         CREATE TABLE total (n BIGINT NOT NULL DEFAULT 0);
         INSERT INTO total VALUES (0);",
    );
    let text = counter_rule(
        "per_day",
        &format!("{db}.stats"),
        &["tenant", "day"],
        &["n"],
        "stats_slots",
    ) + &counter_rule("global", &format!("{db}.total"), &[], &["n"], "total_slots");
    let (_d, rules) = rules_dir(&text);
    // The URL names no database: the rules' prefixes decide.
    let url = mariadb().url("");
    let (code, out, err) = heatsink(&[
        "migrate",
        "--rules",
        rules.to_str().unwrap(),
        "--backend-url",
        &url,
        "--apply",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("-- no trigger"), "{out}");
    let ddl = mariadb().query_strings(&format!("SHOW CREATE TABLE {db}.stats_slots"))[0][1]
        .clone()
        .unwrap();
    assert!(ddl.contains("PRIMARY KEY (`tenant`,`day`,`slot`)"), "{ddl}");
    assert!(ddl.contains("`tenant` int(10) unsigned NOT NULL"), "{ddl}");
    assert!(ddl.contains("`day` date NOT NULL"), "{ddl}");
    let ddl = mariadb().query_strings(&format!("SHOW CREATE TABLE {db}.total_slots"))[0][1]
        .clone()
        .unwrap();
    assert!(ddl.contains("PRIMARY KEY (`slot`)"), "{ddl}");
    assert!(trigger_exists(db, "stats_slots_hs_ai"));
    assert!(!trigger_exists(db, "total_slots_hs_ai"));
}

#[test]
fn migrate_refuses_rules_the_tables_do_not_fit() {
    let db = "hs_mig_refuse";
    fresh_db(
        db,
        "CREATE TABLE good (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         CREATE TABLE money (slug VARCHAR(64) PRIMARY KEY, cnt DECIMAL(10,2) NOT NULL DEFAULT 0);
         CREATE TABLE loose (id INT PRIMARY KEY, slug VARCHAR(64) NOT NULL,
             cnt INT NOT NULL DEFAULT 0, KEY (slug));
         CREATE TABLE odd (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         CREATE TABLE odd_slots (slug VARCHAR(32) NOT NULL, slot SMALLINT UNSIGNED NOT NULL,
             cnt BIGINT UNSIGNED NOT NULL DEFAULT 0, PRIMARY KEY (slug, slot));
         CREATE TABLE narrow (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         CREATE TABLE narrow_slots (slug VARCHAR(64) NOT NULL, slot SMALLINT UNSIGNED NOT NULL,
             cnt INT NOT NULL DEFAULT 0, PRIMARY KEY (slug, slot));",
    );
    let cases = [
        (
            counter_rule("missing", "nope", &["slug"], &["cnt"], "nope_slots"),
            "`hs_mig_refuse`.`nope` does not exist",
        ),
        (
            counter_rule("dec", "money", &["slug"], &["cnt"], "money_slots"),
            "counter column `cnt` of `hs_mig_refuse`.`money` is decimal(10,2), not an integer type",
        ),
        (
            counter_rule("loose", "loose", &["slug"], &["cnt"], "loose_slots"),
            "is neither the primary key nor a unique key",
        ),
        (
            counter_rule("nocol", "good", &["slug"], &["hits"], "good_slots"),
            "counter column `hits` is not a column",
        ),
        (
            counter_rule("odd", "odd", &["slug"], &["cnt"], "odd_slots"),
            "slot table `hs_mig_refuse`.`odd_slots` exists but does not match the rule",
        ),
        (
            // As wide as the counter, but a slot row sums deltas: only BIGINT holds them.
            counter_rule("narrow", "narrow", &["slug"], &["cnt"], "narrow_slots"),
            "counter column `cnt` is int(11), not BIGINT",
        ),
    ];
    for (rule, want) in &cases {
        // Each bad rule next to a good one: the good one is not applied either.
        let text = counter_rule("good", "good", &["slug"], &["cnt"], "good_slots") + rule;
        let (_d, rules) = rules_dir(&text);
        let (code, out, err) = migrate(&rules, db, true);
        assert_eq!(code, 1, "{want}: stdout:\n{out}\nstderr:\n{err}");
        assert!(err.contains(want), "want {want:?} in:\n{err}");
        assert!(err.contains("nothing was changed"), "{err}");
        assert!(!table_exists(db, "good_slots"), "{want}");
    }
    // The mismatch report names what differs.
    let (_d, rules) = rules_dir(&counter_rule(
        "odd",
        "odd",
        &["slug"],
        &["cnt"],
        "odd_slots",
    ));
    let (_, _, err) = migrate(&rules, db, false);
    assert!(err.contains("key column `slug` is varchar(32)"), "{err}");
    assert!(err.contains("not a signed integer"), "{err}");
}

// ---------------------------------------------------------------------------------------
// compact

#[test]
fn compact_folds_slots_into_the_base() {
    let db = "hs_compact_basic";
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(32) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0,
             b BIGINT NOT NULL DEFAULT 0);
         INSERT INTO hits VALUES ('a', 10, 0), ('b', 20, 5), ('c', 30, 0), ('d', 40, 0);
         CREATE TABLE pair (x INT NOT NULL, y VARCHAR(8) NOT NULL, n INT NOT NULL DEFAULT 0,
             PRIMARY KEY (x, y));",
    );
    let text = counter_rule("hits", "hits", &["slug"], &["cnt", "b"], "hits_slots")
        + &counter_rule("pair", "pair", &["x", "y"], &["n"], "pair_slots");
    let (_d, rules) = rules_dir(&text);
    let rules = rules.to_str().unwrap();
    let url = mariadb().url(db);
    let (code, out, err) = migrate(Path::new(rules), db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");

    mariadb().exec(&format!(
        "USE {db};
         INSERT INTO hits_slots (slug, slot, cnt, b) VALUES
             ('a', 0, 1, 0), ('a', 5, 2, 1), ('b', 1, -3, 0), ('c', 2, 7, 0), ('c', 3, 0, 0),
             ('orphan', 4, 9, 2), ('orphan', 7, 1, 0);
         DELETE FROM hits WHERE slug = 'orphan';
         INSERT INTO pair_slots (x, y, slot, n) VALUES
             (1, 'a', 0, 1), (1, 'a', 1, 1), (1, 'b', 0, 2), (2, 'a', 0, 3), (2, 'b', 3, 4),
             (3, 'a', 0, 5), (3, 'a', 9, 5);"
    ));
    // The trigger created the pair rows with n = 0; give one a base.
    mariadb().exec(&format!(
        "UPDATE {db}.pair SET n = 100 WHERE x = 2 AND y = 'b'"
    ));

    // --batch 2 pages through the keys.
    let (code, out, err) = heatsink(&[
        "compact",
        "--rules",
        rules,
        "--backend-url",
        &url,
        "--batch",
        "2",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("rule hits: 4 keys compacted, 7 slot rows removed"),
        "{out}"
    );
    assert!(
        out.contains("rule pair: 5 keys compacted, 7 slot rows removed"),
        "{out}"
    );

    assert_eq!(
        mariadb().query_strings(&format!("SELECT slug, cnt, b FROM {db}.hits ORDER BY slug")),
        [
            ("a", 13, 1),
            ("b", 17, 5),
            ("c", 37, 0),
            ("d", 40, 0),
            ("orphan", 10, 2)
        ]
        .iter()
        .map(|(s, c, b)| vec![
            Some(s.to_string()),
            Some(c.to_string()),
            Some(b.to_string())
        ])
        .collect::<Vec<_>>()
    );
    assert_eq!(
        pairs(&format!(
            "SELECT CONCAT(x, y), n FROM {db}.pair ORDER BY x, y"
        )),
        [("1a", 2), ("1b", 2), ("2a", 3), ("2b", 104), ("3a", 10)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.hits_slots")).as_deref(),
        Some("0")
    );
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.pair_slots")).as_deref(),
        Some("0")
    );

    // Nothing left: a second run is a no-op.
    let (code, out, _) = heatsink(&[
        "compact",
        "--rules",
        rules,
        "--backend-url",
        &url,
        "--rule",
        "hits",
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains("rule hits: 0 keys compacted, 0 slot rows removed"),
        "{out}"
    );
    assert!(!out.contains("rule pair"), "{out}");
}

/// Database `db` with a global counter `total` (base 5) under the rule `global`,
/// migrated, and its slot table holding `slot_rows` (`(slot, n), …`); the rules
/// directory and its path.
fn global_counter(db: &str, slot_rows: &str) -> (tempfile::TempDir, PathBuf) {
    fresh_db(
        db,
        "CREATE TABLE total (n BIGINT NOT NULL DEFAULT 0); INSERT INTO total VALUES (5);",
    );
    let (dir, rules) = rules_dir(&counter_rule("global", "total", &[], &["n"], "total_slots"));
    let (code, _, err) = migrate(&rules, db, true);
    assert_eq!(code, 0, "{err}");
    mariadb().exec(&format!(
        "INSERT INTO {db}.total_slots (slot, n) VALUES {slot_rows}"
    ));
    (dir, rules)
}

#[test]
fn compact_global_counter() {
    let db = "hs_compact_global";
    let (_d, rules) = global_counter(db, "(0, 3), (7, 4), (9, -1)");
    let rules = rules.to_str().unwrap();
    let url = mariadb().url(db);
    let (code, out, err) = heatsink(&["compact", "--rules", rules, "--backend-url", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("rule global: 1 keys compacted, 3 slot rows removed"),
        "{out}"
    );
    assert_eq!(
        scalar(&format!("SELECT n FROM {db}.total")).as_deref(),
        Some("11")
    );
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.total_slots")).as_deref(),
        Some("0")
    );
}

/// `heatsink maintain` without `--apply` is a dry run: it prints the compaction's
/// statements and what it would fold, and the slot rows and the base stay as they
/// were; `--apply` folds them, and `heatsink compact` (its alias) applies at once.
#[test]
fn maintain_is_a_dry_run_without_apply() {
    let db = "hs_maintain_dry";
    let (_d, rules) = global_counter(db, "(0, 3), (7, 4), (9, -1)");
    let rules = rules.to_str().unwrap();
    let url = mariadb().url(db);
    let slots = || scalar(&format!("SELECT COUNT(*) FROM {db}.total_slots"));
    let base = || scalar(&format!("SELECT n FROM {db}.total"));
    for args in [
        vec!["maintain", "--rules", rules, "--backend-url", &url],
        vec![
            "maintain",
            "--job",
            "compact",
            "--rules",
            rules,
            "--backend-url",
            &url,
        ],
    ] {
        let (code, out, err) = heatsink(&args);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("-- dry run"), "{out}");
        assert!(
            out.contains("rule global: dry run: 1 keys would be compacted, 3 slot rows removed"),
            "{out}"
        );
        assert!(
            out.contains("START TRANSACTION;")
                && out.contains("FROM `hs_maintain_dry`.`total_slots`")
                && out.contains("FOR UPDATE;")
                && out.contains("COMMIT;"),
            "{out}"
        );
        assert_eq!(slots().as_deref(), Some("3"));
        assert_eq!(base().as_deref(), Some("5"));
    }
    let (code, out, err) = heatsink(&[
        "maintain",
        "--rules",
        rules,
        "--backend-url",
        &url,
        "--apply",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("rule global: 1 keys compacted, 3 slot rows removed"),
        "{out}"
    );
    assert_eq!(slots().as_deref(), Some("0"));
    assert_eq!(base().as_deref(), Some("11"));
    // Nothing left: the dry run says so.
    let (code, out, _) = heatsink(&["maintain", "--rules", rules, "--backend-url", &url]);
    assert_eq!(code, 0);
    assert!(
        out.contains("dry run: 0 keys would be compacted, 0 slot rows removed"),
        "{out}"
    );
}

/// `heatsink maintain` runs every job of every rule under a lock named after the
/// job and the table: while another connection holds it (another proxy's sidecar, a
/// cron entry) the job is skipped, and it runs once the lock is free.
#[test]
fn maintain_skips_a_job_another_holds_then_runs_it() {
    let db = "hs_maintain_lock";
    let (_d, rules) = global_counter(db, "(0, 3), (7, 4)");
    let rules = rules.to_str().unwrap();
    let url = mariadb().url(db);
    let lock = format!("heatsink:compact:{db}.total");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let holder = rt.block_on(async {
        let mut c = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
        let got: Option<i64> = c
            .exec_first("SELECT GET_LOCK(?, 0)", (lock.clone(),))
            .await
            .unwrap();
        assert_eq!(got, Some(1));
        c
    });
    let maintain = [
        "maintain",
        "--rules",
        rules,
        "--backend-url",
        &url,
        "--apply",
    ];
    let (code, out, err) = heatsink(&maintain);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("rule global: compact is running elsewhere"),
        "{out}"
    );
    assert_eq!(
        scalar(&format!("SELECT n FROM {db}.total")).as_deref(),
        Some("5")
    );
    rt.block_on(async move { holder.disconnect().await.unwrap() });
    let (code, out, err) = heatsink(&maintain);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("rule global: 1 keys compacted, 2 slot rows removed"),
        "{out}"
    );
    assert_eq!(
        scalar(&format!("SELECT n FROM {db}.total")).as_deref(),
        Some("12")
    );
}

/// Writers increment slot rows (and, like a proxy without the rule, the base) while
/// compaction runs again and again; a reader checks that `base + SUM(slots)` never goes
/// backwards. At the end nothing is lost.
#[test]
fn compact_under_concurrent_increments_loses_nothing() {
    let db = "hs_compact_conc";
    const KEYS: usize = 12;
    const WRITERS: usize = 3;
    const PER_WRITER: usize = 1000;
    let mut ddl = String::from(
        "CREATE TABLE hits (slug VARCHAR(32) PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0);",
    );
    for k in 0..KEYS {
        ddl.push_str(&format!("INSERT INTO hits VALUES ('k{k}', 100);"));
    }
    fresh_db(db, &ddl);
    let (_d, rules) = rules_dir(&counter_rule(
        "hits",
        "hits",
        &["slug"],
        &["cnt"],
        "hits_slots",
    ));
    let rules = rules.to_str().unwrap().to_string();
    let url = mariadb().url(db);
    let (code, _, err) = migrate(Path::new(&rules), db, true);
    assert_eq!(code, 0, "{err}");
    // Some deltas before the first run, one of them for a key without a base row.
    mariadb().exec(&format!(
        "INSERT INTO {db}.hits_slots VALUES ('k0', 1, 5), ('k1', 2, 6), ('fresh', 0, 7)"
    ));
    let total_sql = format!(
        "SELECT CAST(SUM(h.cnt + COALESCE((SELECT SUM(s.cnt) FROM {db}.hits_slots s WHERE s.slug = h.slug), 0)) AS SIGNED) FROM {db}.hits h"
    );
    let before: i64 = scalar(&total_sql).unwrap().parse().unwrap();
    assert_eq!(before, (KEYS as i64) * 100 + 5 + 6 + 7);

    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let url = url.clone();
        writers.push(rt.spawn(async move {
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
            for i in 0..PER_WRITER {
                let key = format!("k{}", rand::random_range(0..KEYS));
                let sql = if (i + w) % 5 == 0 {
                    // A proxy that has the rule off increments the base.
                    format!("UPDATE hits SET cnt = cnt + 1 WHERE slug = '{key}'")
                } else {
                    let slot = rand::random_range(0..16);
                    format!(
                        "INSERT INTO hits_slots (slug, slot, cnt) VALUES ('{key}', {slot}, 1) \
                         ON DUPLICATE KEY UPDATE cnt = cnt + VALUES(cnt)"
                    )
                };
                loop {
                    match conn.query_drop(sql.as_str()).await {
                        Ok(()) => break,
                        Err(mysql_async::Error::Server(e)) if e.code == 1213 || e.code == 1205 => {
                            continue
                        }
                        Err(e) => panic!("{sql}: {e}"),
                    }
                }
            }
            conn.disconnect().await.unwrap();
        }));
    }
    let reader = {
        let url = url.clone();
        let stop = Arc::clone(&stop);
        let total_sql = total_sql.clone();
        rt.spawn(async move {
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
            let mut last = 0i64;
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                let v: Option<i64> = conn.query_first(total_sql.as_str()).await.unwrap();
                let v = v.unwrap();
                assert!(v >= last, "total went backwards: {last} then {v}");
                last = v;
                reads += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            conn.disconnect().await.unwrap();
            reads
        })
    };

    let mut runs = 0;
    let mut compacted_rows = 0u64;
    while !writers.iter().all(|w| w.is_finished()) || runs < 2 {
        let (code, out, err) = heatsink(&["compact", "--rules", &rules, "--backend-url", &url]);
        assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
        compacted_rows += out
            .split(", ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_default();
        runs += 1;
    }
    rt.block_on(async {
        for w in writers {
            w.await.unwrap();
        }
    });
    stop.store(true, Ordering::Relaxed);
    let reads = rt.block_on(reader).unwrap();
    assert!(reads > 0);
    assert!(
        compacted_rows > 0,
        "compaction never removed a row in {runs} runs"
    );

    let after: i64 = scalar(&total_sql).unwrap().parse().unwrap();
    assert_eq!(
        after,
        before + (WRITERS * PER_WRITER) as i64,
        "after {runs} compactions"
    );

    // A final run folds everything: the base alone holds the total.
    let (code, _, err) = heatsink(&["compact", "--rules", &rules, "--backend-url", &url]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.hits_slots")).as_deref(),
        Some("0")
    );
    assert_eq!(
        scalar(&format!("SELECT CAST(SUM(cnt) AS SIGNED) FROM {db}.hits")),
        Some(after.to_string())
    );
    assert_eq!(
        scalar(&format!("SELECT cnt FROM {db}.hits WHERE slug = 'fresh'")).as_deref(),
        Some("7")
    );
}

#[test]
fn migrate_replaces_an_earlier_trigger_and_refuses_a_foreign_one() {
    let db = "hs_mig_trigger";
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         CREATE TABLE hits_slots (slug VARCHAR(64) NOT NULL, slot SMALLINT UNSIGNED NOT NULL,
             cnt BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (slug, slot));
         CREATE TRIGGER hits_slots_hs_ai AFTER INSERT ON hits_slots FOR EACH ROW
             INSERT IGNORE INTO hits (slug) VALUES (NEW.slug);
         CREATE TABLE other (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0);
         CREATE TABLE other_slots (slug VARCHAR(64) NOT NULL, slot SMALLINT UNSIGNED NOT NULL,
             cnt BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (slug, slot));
         CREATE TRIGGER other_slots_hs_ai AFTER INSERT ON other_slots FOR EACH ROW
             SET @seen = NEW.slug;",
    );
    let (_d, rules) = rules_dir(&counter_rule(
        "hits",
        "hits",
        &["slug"],
        &["cnt"],
        "hits_slots",
    ));
    // The earlier form (an INSERT IGNORE, hand-written here) is replaced, once.
    let (code, out, err) = migrate(&rules, db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("-- note: trigger"), "{out}");
    assert!(out.contains("has an earlier body"), "{out}");
    assert!(
        out.contains(&format!(
            "CREATE OR REPLACE TRIGGER `{db}`.`hits_slots_hs_ai` AFTER INSERT ON `{db}`.`hits_slots`"
        )),
        "{out}"
    );
    assert!(out.contains("-- applied: replaced trigger"), "{out}");
    let (code, out, err) = migrate(&rules, db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("exists and matches the rule"), "{out}");
    assert!(!out.contains("CREATE"), "{out}");
    // A unique key that a new key's row can collide with needs the trigger's check
    // that a duplicate is the key's own: the trigger is replaced with that form.
    mariadb().exec(&format!(
        "ALTER TABLE {db}.hits ADD tag VARCHAR(8) NOT NULL DEFAULT 'x', ADD UNIQUE KEY u_tag (tag)"
    ));
    let (code, out, err) = migrate(&rules, db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("which takes any duplicate for the key's own"),
        "{out}"
    );
    assert!(out.contains("LOCK IN SHARE MODE"), "{out}");
    assert!(out.contains("-- applied: replaced trigger"), "{out}");
    // A hand-written trigger with a 1062 handler is left as it is, but one that never
    // checks whose duplicate it is, on a table that needs the check, is called out.
    mariadb().exec(&format!(
        "CREATE OR REPLACE TRIGGER {db}.hits_slots_hs_ai AFTER INSERT ON {db}.hits_slots
             FOR EACH ROW BEGIN DECLARE CONTINUE HANDLER FOR 1062 BEGIN END;
             INSERT INTO hits (slug) VALUES (NEW.slug); END"
    ));
    let (code, out, err) = migrate(&rules, db, true);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("left as it is; another unique key"), "{out}");
    assert!(!out.contains("CREATE"), "{out}");

    let (_d, rules) = rules_dir(&counter_rule(
        "other",
        "other",
        &["slug"],
        &["cnt"],
        "other_slots",
    ));
    let (code, out, err) = migrate(&rules, db, false);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("trigger `hs_mig_trigger`.`other_slots_hs_ai` exists but is not"),
        "{err}"
    );
}
