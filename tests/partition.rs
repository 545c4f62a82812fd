//! Partition rules: lookups by key through heatsink read only the partitions of the
//! key's date ± the tolerance (`EXPLAIN` shows it, text and prepared); inserts that
//! would be unreachable are refused, inserts without the partition column get it
//! from the key; `check` counts rows that break the invariant; `migrate` partitions
//! an existing table; the `rotate` job keeps partitions ahead and drops expired ones
//! without stalling the application. (Results equal to the unruled table's:
//! `tests/fuzz_partition.rs`.)

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cli::{heatsink, migrate_ok};
use common::client::{connect, rules_dir, run};
use common::fixture::{fresh_db, scalar, utc_date, utc_time, Env, Rule};
use common::mariadb;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// 2024-11-20 00:00:00 UTC.
const DAY0: i64 = 1_732_060_800;

/// A key carrying unix time `t` between dashes.
fn key(tag: u32, t: i64) -> String {
    format!("{tag:010x}-{t}-{:010x}", t.rem_euclid(0xff_ffff))
}

/// `Messages` partitioned by day from 2024-11-18 to 2024-12-03, plus `pmax`.
fn messages_ddl(rows: &str) -> String {
    let parts: Vec<String> = (-2..14)
        .map(|d| {
            let t = DAY0 + d * 86_400;
            format!(
                "PARTITION p{} VALUES LESS THAN ('{}')",
                utc_date(t).replace('-', ""),
                utc_date(t + 86_400)
            )
        })
        .collect();
    partitioned_messages("DATE", &parts, rows)
}

/// `Messages` with an `Inserted` column of type `column_type`, partitioned by
/// `parts` and `pmax`, holding `rows` (none when empty).
fn partitioned_messages(column_type: &str, parts: &[String], rows: &str) -> String {
    let mut ddl = format!(
        "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT, UUID VARCHAR(40) NOT NULL, \
           Message JSON NOT NULL, Inserted {column_type} NOT NULL, \
           PRIMARY KEY (ID, Inserted), UNIQUE KEY (UUID, Inserted)) \
           PARTITION BY RANGE COLUMNS (Inserted) ({}, PARTITION pmax VALUES LESS THAN (MAXVALUE));",
        parts.join(", ")
    );
    if !rows.is_empty() {
        ddl.push_str(&format!(
            " INSERT INTO Messages (UUID, Message, Inserted) VALUES {rows};"
        ));
    }
    ddl
}

fn rule() -> String {
    Rule::partition("messages_by_day", "Messages").toml()
}

/// The partitions an `EXPLAIN FORMAT=JSON` answer reads.
fn partitions_read(explain: &str) -> usize {
    fn walk(v: &serde_json::Value, n: &mut usize) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("partitions", serde_json::Value::Array(a)) => *n += a.len(),
                        _ => walk(x, n),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, n)),
            _ => {}
        }
    }
    let v: serde_json::Value = serde_json::from_str(explain).expect("EXPLAIN answers JSON");
    let mut n = 0;
    walk(&v, &mut n);
    n
}

async fn explain_text(conn: &mut Conn, sql: &str) -> usize {
    let s: String = conn
        .query_first(format!("EXPLAIN FORMAT=JSON {sql}"))
        .await
        .unwrap()
        .unwrap();
    partitions_read(&s)
}

async fn explain_prepared(conn: &mut Conn, sql: &str, k: &str) -> usize {
    let s: String = conn
        .exec_first(format!("EXPLAIN FORMAT=JSON {sql}"), (k,))
        .await
        .unwrap()
        .unwrap();
    partitions_read(&s)
}

#[test]
fn lookups_read_only_the_keys_partitions() {
    let near_midnight = DAY0 + 3 * 86_400 - 600; // 2024-11-22 23:50 UTC
    let k1 = key(1, near_midnight);
    let k2 = key(2, DAY0 + 8 * 86_400 + 3600);
    let rows = format!(
        "('{k1}', '{{}}', '{}'), ('{k2}', '{{}}', '{}'), ('no-time-here', '{{}}', '2024-11-25')",
        utc_date(near_midnight),
        utc_date(DAY0 + 8 * 86_400)
    );
    let env = migrated("part_explain", messages_ddl(&rows), rule());
    run(Duration::from_secs(60), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let all = 17;
        let by_key = |k: &str| format!("SELECT Message FROM Messages WHERE UUID = '{k}'");
        for tz in ["'+00:00'", "'+05:30'", "'-08:00'"] {
            p.query_drop(format!("SET time_zone = {tz}")).await.unwrap();
            assert_eq!(explain_text(&mut d, &by_key(&k1)).await, all);
            let n = explain_text(&mut p, &by_key(&k1)).await;
            assert!((1..=3).contains(&n), "{tz}: {n} partitions read");
            let n =
                explain_prepared(&mut p, "SELECT Message FROM Messages WHERE UUID = ?", &k1).await;
            assert!((1..=3).contains(&n), "{tz} prepared: {n} partitions read");
            let found: Vec<String> = p.query(by_key(&k1)).await.unwrap();
            assert_eq!(found.len(), 1, "{tz}");
            let found: Vec<String> = p
                .exec(
                    "SELECT Message FROM Messages WHERE UUID = ?",
                    (k1.as_str(),),
                )
                .await
                .unwrap();
            assert_eq!(found.len(), 1, "{tz} prepared");
        }
        // Two keys of different days: both ranges.
        let n = explain_text(
            &mut p,
            &format!("SELECT ID FROM Messages WHERE UUID IN ('{k1}', '{k2}')"),
        )
        .await;
        assert!((2..=6).contains(&n), "IN: {n}");
        // A key whose time cannot be read: every partition, and the row is found.
        assert_eq!(explain_text(&mut p, &by_key("no-time-here")).await, all);
        let found: Vec<String> = p.query(by_key("no-time-here")).await.unwrap();
        assert_eq!(found.len(), 1);
        // Updates and deletes by key are pruned too, and change what they would.
        p.query_drop(format!(
            "UPDATE Messages SET Message = '[1]' WHERE UUID = '{k2}'"
        ))
        .await
        .unwrap();
        assert_eq!(p.affected_rows(), 1);
        p.query_drop(format!("DELETE FROM Messages WHERE UUID = '{k2}'"))
            .await
            .unwrap();
        assert_eq!(p.affected_rows(), 1);
    });
}

#[test]
fn inserts_that_would_be_unreachable_are_refused_and_the_column_is_filled() {
    let env = migrated("part_insert", messages_ddl(""), rule());
    run(Duration::from_secs(60), async {
        let mut p = env.proxied().await;
        let t = DAY0 + 2 * 86_400 - 1800; // 2024-11-21 23:30 UTC
        let bad = format!(
            "INSERT INTO Messages (UUID, Message, Inserted) VALUES ('{}', '{{}}', '2024-11-25')",
            key(1, t)
        );
        let e = common::client::assert_refused_by(&mut p, &bad, "messages_by_day").await;
        assert!(
            e.message.contains("Inserted must lie within 1 day(s)"),
            "{e:?}"
        );
        // Also straight to the database: the trigger refuses it.
        let mut d = env.direct().await;
        let e = d.query_drop(&bad).await.unwrap_err();
        assert!(
            e.to_string().contains("heatsink rule 'messages_by_day'"),
            "{e}"
        );
        assert_eq!(
            env.backend_scalar("SELECT COUNT(*) FROM {db}.Messages")
                .as_deref(),
            Some("0")
        );
        // Omitted: the key's date in the session's time zone.
        for (i, (tz, want)) in [("'+00:00'", "2024-11-21"), ("'+05:30'", "2024-11-22")]
            .into_iter()
            .enumerate()
        {
            p.query_drop(format!("SET time_zone = {tz}")).await.unwrap();
            let k = key(10 + i as u32, t);
            p.query_drop(format!(
                "INSERT INTO Messages (UUID, Message) VALUES ('{k}', '{{}}')"
            ))
            .await
            .unwrap();
            assert_eq!(p.affected_rows(), 1);
            assert!(p.last_insert_id().is_some());
            let got = env.backend_scalar(&format!(
                "SELECT CAST(Inserted AS CHAR) FROM {{db}}.Messages WHERE UUID = '{k}'"
            ));
            assert_eq!(got.as_deref(), Some(want), "{tz}");
        }
        // Prepared, the same.
        p.query_drop("SET time_zone = '+05:30'").await.unwrap();
        let k = key(20, t);
        p.exec_drop(
            "INSERT INTO Messages (UUID, Message) VALUES (?, ?)",
            (k.as_str(), "{}"),
        )
        .await
        .unwrap();
        let got = env.backend_scalar(&format!(
            "SELECT CAST(Inserted AS CHAR) FROM {{db}}.Messages WHERE UUID = '{k}'"
        ));
        assert_eq!(got.as_deref(), Some("2024-11-22"), "prepared");
        // A key without a time and no column: what the table answers (no default).
        let e = p
            .query_drop("INSERT INTO Messages (UUID, Message) VALUES ('plain', '{}')")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("cannot be null"), "{e}");
    });
}

#[test]
fn check_counts_stray_rows_and_migrate_partitions_a_table() {
    let db = "part_migrate";
    let t = DAY0 + 86_400 * 2 + 7200;
    fresh_db(
        db,
        &format!(
            "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(40) NOT NULL, \
               Message JSON NOT NULL, Inserted DATE NOT NULL, UNIQUE KEY u (UUID));
             INSERT INTO Messages (UUID, Message, Inserted) VALUES
               ('{}', '{{}}', '{}'), ('{}', '{{}}', '2024-12-01'), ('{}', '{{}}', '2024-11-10'), ('odd', '{{}}', '2024-11-23');
             CREATE TABLE Links (UUID VARCHAR(40) NOT NULL PRIMARY KEY, Inserted DATE NOT NULL);",
            key(1, t),
            utc_date(t),
            key(2, t),
            key(3, t)
        ),
    );
    let rules = rules_dir("p.toml", &rule());
    let url = mariadb().url(db);
    let dir = rules.path().to_str().unwrap();
    let (code, out, err) = heatsink(&["check", "--rules", dir, "--backend-url", &url]);
    assert_ne!(code, 0, "{out}{err}");
    let all = format!("{out}{err}");
    assert!(all.contains("not partitioned"), "{all}");
    assert!(all.contains("2 rows"), "{all}");
    assert!(all.contains("is missing"), "{all}");
    let printed = migrate_ok(rules.path(), db, false);
    assert!(
        printed.contains("ADD PRIMARY KEY (`ID`, `Inserted`)")
            && printed.contains("ADD UNIQUE KEY `u` (`UUID`, `Inserted`)")
            && printed.contains("PARTITION BY RANGE COLUMNS (`Inserted`) (PARTITION p20241110 VALUES LESS THAN ('2024-11-11')")
            && printed.contains("PARTITION pmax VALUES LESS THAN (MAXVALUE)"),
        "{printed}"
    );
    migrate_ok(rules.path(), db, true);
    let parts = scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'Messages'"
    ));
    assert!(parts.unwrap().parse::<u32>().unwrap() > 300);
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.Messages")).as_deref(),
        Some("4")
    );
    let (_, out, err) = heatsink(&["check", "--rules", dir, "--backend-url", &url]);
    let all = format!("{out}{err}");
    assert!(
        all.contains("2 rows") && !all.contains("not partitioned") && !all.contains("is missing"),
        "{all}"
    );
    mariadb().exec(&format!(
        "DELETE FROM {db}.Messages WHERE UUID IN ('{}', '{}')",
        key(2, t),
        key(3, t)
    ));
    let (code, out, err) = heatsink(&["check", "--rules", dir, "--backend-url", &url]);
    assert_eq!(code, 0, "{out}{err}");
    // A random key as the primary key: an invisible AUTO_INCREMENT key clusters rows.
    let links = rules_dir("p.toml", &Rule::partition("links", "Links").toml());
    let printed = migrate_ok(links.path(), db, false);
    assert!(
        printed
            .contains("ADD COLUMN `hs_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT INVISIBLE FIRST")
            && printed.contains("ADD PRIMARY KEY (`hs_id`, `Inserted`)")
            && printed.contains("ADD UNIQUE KEY `UUID_key` (`UUID`, `Inserted`)"),
        "{printed}"
    );
}

/// 2025-01-01 00:00:00 UTC: day 0 of the rotation tests.
const ROT0: i64 = 1_735_689_600;

/// `Messages` with one day partition (2025-01-01) and the catch-all.
fn rotation_ddl() -> String {
    partitioned_messages(
        "DATE",
        &["PARTITION p20250101 VALUES LESS THAN ('2025-01-02')".into()],
        "",
    )
}

fn spec() -> heatsink::kinds::partition::PartitionSpec {
    heatsink::kinds::entries::<heatsink::kinds::partition::PartitionSpec>(&rule(), "partition")
        .unwrap()
        .remove(0)
}

/// Runs the rotate job once on `conn` (whose session clock the caller set).
async fn rotate(conn: &mut Conn, db: &str) -> heatsink::kinds::JobReport {
    let mut out = Vec::new();
    let mut ctx = heatsink::kinds::JobContext {
        conn,
        default_db: Some(db),
        batch: 1000,
        out: &mut out,
        apply: true,
        jobs: Default::default(),
    };
    heatsink::kinds::partition::rotate::run(&spec(), &mut ctx)
        .await
        .unwrap()
}

fn partition_count(db: &str) -> usize {
    scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'Messages'"
    ))
    .unwrap()
    .parse()
    .unwrap()
}

/// A proxied session in UTC whose clock reads unix time `t`.
async fn at(conn: &mut Conn, t: i64) {
    conn.query_drop(format!("SET time_zone = '+00:00', timestamp = {t}"))
        .await
        .unwrap();
}

#[test]
fn rotation_over_forty_days_under_load() {
    let env = migrated("part_rotate", rotation_ddl(), rule());
    let db = env.db.clone();
    run(Duration::from_secs(600), async {
        let mut rot = env.direct().await;
        let mut apps = Vec::new();
        for _ in 0..16 {
            apps.push(env.proxied().await);
        }
        // (key, day) of every row inserted.
        let inserted: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut rng = common::differential::Prng::new(5);
        for day in 0..40i64 {
            at(&mut rot, ROT0 + day * 86_400 + 30).await;
            let report = rotate(&mut rot, &db).await;
            assert!(report.failed.is_empty(), "day {day}: {report:?}");
            let n = partition_count(&db);
            assert!(n <= 30 + 3 + 2, "day {day}: {n} partitions");
            let mut tasks = Vec::new();
            for (i, mut conn) in apps.drain(..).enumerate() {
                let seeds: Vec<u64> = (0..10).map(|_| rng.next_u64()).collect();
                let inserted = inserted.clone();
                let errors = errors.clone();
                tasks.push(tokio::spawn(async move {
                    for (j, s) in seeds.into_iter().enumerate() {
                        let t = ROT0 + day * 86_400 + (s % 86_400) as i64;
                        at(&mut conn, t).await;
                        if j % 2 == 0 {
                            let k = key((day * 1000 + i as i64 * 10 + j as i64) as u32, t);
                            let sql = if j % 4 == 0 {
                                format!("INSERT INTO Messages (UUID, Message, Inserted) VALUES ('{k}', '{{}}', CURDATE())")
                            } else {
                                format!("INSERT INTO Messages (UUID, Message) VALUES ('{k}', '{{}}')")
                            };
                            match conn.query_drop(&sql).await {
                                Ok(()) => inserted.lock().unwrap().push((k, day)),
                                Err(e) => errors.lock().unwrap().push(format!("{sql}: {e}")),
                            }
                        } else {
                            let pick = {
                                let rows = inserted.lock().unwrap();
                                let live: Vec<&(String, i64)> =
                                    rows.iter().filter(|(_, d)| *d >= day - 29).collect();
                                (!live.is_empty()).then(|| live[(s as usize) % live.len()].clone())
                            };
                            let Some((k, d)) = pick else { continue };
                            let sql = if s % 2 == 0 {
                                conn.exec::<u64, _, _>("SELECT ID FROM Messages WHERE UUID = ?", (k.as_str(),)).await
                            } else {
                                conn.query::<u64, _>(format!("SELECT ID FROM Messages WHERE UUID = '{k}'")).await
                            };
                            match sql {
                                Ok(rows) if rows.len() == 1 => {}
                                Ok(rows) => errors.lock().unwrap().push(format!(
                                    "day {day}: key of day {d} found {} times",
                                    rows.len()
                                )),
                                Err(e) => errors.lock().unwrap().push(format!("lookup: {e}")),
                            }
                        }
                    }
                    conn
                }));
            }
            for t in tasks {
                apps.push(t.await.unwrap());
            }
            let errs = errors.lock().unwrap();
            assert!(
                errs.is_empty(),
                "day {day}: {:?}",
                &errs[..errs.len().min(5)]
            );
        }
        // No lost row: every row of the kept days is there, and reachable.
        let today = 39;
        let kept: Vec<(String, i64)> = inserted
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, d)| *d >= today - 30)
            .cloned()
            .collect();
        let stored: usize = env
            .backend_scalar(&format!(
                "SELECT COUNT(*) FROM {{db}}.Messages WHERE Inserted >= '{}'",
                utc_date(ROT0 + (today - 30) * 86_400)
            ))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(stored, kept.len());
        // A row far beyond the last partition lands in the catch-all (no 1526) and
        // is found.
        let conn = &mut apps[0];
        let t = ROT0 + 90 * 86_400;
        let k = key(999_999, t);
        conn.query_drop(format!(
            "INSERT INTO Messages (UUID, Message, Inserted) VALUES ('{k}', '{{}}', '{}')",
            utc_date(t)
        ))
        .await
        .unwrap();
        let found: Vec<u64> = conn
            .query(format!("SELECT ID FROM Messages WHERE UUID = '{k}'"))
            .await
            .unwrap();
        assert_eq!(found.len(), 1);
        // The catch-all now holds a row: the next rotation does not split it and says why.
        at(&mut rot, ROT0 + 40 * 86_400 + 30).await;
        let report = rotate(&mut rot, &db).await;
        assert!(
            report.failed.iter().any(|f| f.contains("holds rows")),
            "{report:?}"
        );
        for c in apps {
            let _ = c.disconnect().await;
        }
        let _ = rot.disconnect().await;
    });
}

#[test]
fn rotation_ddl_never_stalls_the_application() {
    let hold = std::env::var("HEATSINK_PARTITION_HOLD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30u64);
    let env = migrated("part_stall", rotation_ddl(), rule());
    let db = env.db.clone();
    run(Duration::from_secs(300), async {
        // A transaction that has the table open for `hold` seconds.
        let mut holder = env.direct().await;
        holder.query_drop("START TRANSACTION").await.unwrap();
        let _: Vec<u64> = holder.query("SELECT COUNT(*) FROM Messages").await.unwrap();
        let started = Instant::now();
        let worst = Arc::new(Mutex::new(Duration::ZERO));
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut tasks = Vec::new();
        for i in 0..8u32 {
            let mut conn = env.proxied().await;
            let worst = worst.clone();
            let errors = errors.clone();
            tasks.push(tokio::spawn(async move {
                let mut j = 0u32;
                while started.elapsed() < Duration::from_secs(hold) {
                    let t = ROT0 + 3600 + i64::from(j % 80_000);
                    at(&mut conn, t).await;
                    let k = key(i * 1_000_000 + j, t);
                    let begin = Instant::now();
                    let r = if j.is_multiple_of(2) {
                        conn.query_drop(format!(
                            "INSERT INTO Messages (UUID, Message) VALUES ('{k}', '{{}}')"
                        ))
                        .await
                    } else {
                        conn.query_drop(format!(
                            "SELECT ID FROM Messages WHERE UUID = '{}'",
                            key(i * 1_000_000 + j - 1, t - 1)
                        ))
                        .await
                    };
                    let took = begin.elapsed();
                    let mut w = worst.lock().unwrap();
                    *w = (*w).max(took);
                    drop(w);
                    if let Err(e) = r {
                        errors.lock().unwrap().push(e.to_string());
                    }
                    j += 1;
                }
                let _ = conn.disconnect().await;
            }));
        }
        // Forty days later: partitions to add and to drop, while the table is held.
        let mut rot = connect(&mariadb().url(&db)).await;
        at(&mut rot, ROT0 + 40 * 86_400).await;
        let blocked = rotate(&mut rot, &db).await;
        for t in tasks {
            t.await.unwrap();
        }
        holder.query_drop("COMMIT").await.unwrap();
        let worst = *worst.lock().unwrap();
        let errs = errors.lock().unwrap().clone();
        assert!(errs.is_empty(), "{errs:?}");
        assert!(
            worst < Duration::from_secs(2),
            "a statement waited {worst:?} behind rotation DDL ({blocked:?})"
        );
        // Once the transaction ends, the rotation goes through.
        let done = rotate(&mut rot, &db).await;
        assert!(done.failed.is_empty(), "{done:?}");
        assert!(partition_count(&db) <= 35);
        eprintln!(
            "held {hold} s: worst statement {worst:?}; rotation while held: {}; after: {}",
            if blocked.failed.is_empty() {
                "done".to_string()
            } else {
                blocked.failed.join("; ")
            },
            done.summary
        );
        let _ = rot.disconnect().await;
    });
}

/// Crockford base-32 of the low 50 bits of `v`, 10 characters (a ULID's time).
fn crockford(mut v: u64) -> String {
    const A: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut out = [b'0'; 10];
    for c in out.iter_mut().rev() {
        *c = A[(v % 32) as usize];
        v /= 32;
    }
    String::from_utf8(out.to_vec()).unwrap()
}

#[test]
fn every_key_encoding_prunes() {
    // 2024-11-24 00:00:00.123 UTC: a key of the first moment of its day.
    let ms: u64 = 1_732_406_400_123;
    let epoch: u64 = 1_288_834_974_657;
    let hex = format!("{ms:012x}");
    let cases: Vec<(&str, &str, String, &str)> = vec![
        ("unix_ms", "VARCHAR(40)", ms.to_string(), ""),
        (
            "uuid_v7",
            "CHAR(36)",
            format!("{}-{}-7abc-8def-0123456789ab", &hex[..8], &hex[8..]),
            "",
        ),
        (
            "ulid",
            "CHAR(26)",
            format!("{}ABCDEFGHJKMNPQRS", crockford(ms)).to_lowercase(),
            "",
        ),
        (
            "snowflake",
            "BIGINT UNSIGNED",
            (((ms - epoch) << 22) | 12_345).to_string(),
            "snowflake_epoch_ms = 1288834974657\n",
        ),
        (
            "unix",
            "VARCHAR(40)",
            format!("x-{}-y", ms / 1000),
            "key_pattern = \"-([0-9]{10})-\"\n",
        ),
    ];
    for (kind, ty, k, extra) in cases {
        let db = format!("part_enc_{kind}");
        let ddl = messages_ddl("")
            .replace("UUID VARCHAR(40)", &format!("K {ty}"))
            .replace("UNIQUE KEY (UUID,", "UNIQUE KEY (K,");
        let literal = if ty.starts_with("BIGINT") {
            k.clone()
        } else {
            format!("'{k}'")
        };
        let toml = format!(
            "[[partition]]\nname = \"by_{kind}\"\ntable = \"Messages\"\nkey = \"K\"\nkey_time = \"{kind}\"\n\
             column = \"Inserted\"\nretention_days = 30\n{extra}"
        );
        let schema = format!(
            "{ddl} INSERT INTO Messages (K, Message, Inserted) VALUES ({literal}, '{{}}', '2024-11-24');"
        );
        let env = migrated(&db, schema, toml);
        run(Duration::from_secs(60), async {
            let mut p = env.proxied().await;
            p.query_drop("SET time_zone = '+00:00'").await.unwrap();
            let sql = format!("SELECT Message FROM Messages WHERE K = {literal}");
            let n = explain_text(&mut p, &sql).await;
            assert!((1..=3).contains(&n), "{kind}: {n} partitions");
            let found: Vec<String> = p.query(&sql).await.unwrap();
            assert_eq!(found.len(), 1, "{kind}");
            // The insert check reads the same time: a day off by two is refused.
            let e = p
                .query_drop(format!(
                    "INSERT INTO Messages (K, Message, Inserted) VALUES ({literal}, '{{}}', '2024-11-27')"
                ))
                .await
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("heatsink rule 'by_{kind}'")),
                "{kind}: {e}"
            );
        });
    }
}

/// The partitions of `db`.Messages, in order.
fn partition_names(db: &str) -> Vec<String> {
    mariadb()
        .query_strings(&format!(
            "SELECT PARTITION_NAME FROM information_schema.PARTITIONS \
             WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'Messages' ORDER BY PARTITION_ORDINAL_POSITION"
        ))
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect()
}

/// `heatsink maintain` without `--apply` prints the rotation's DDL and changes no
/// partition; with `--apply` it runs it.
#[test]
fn maintain_prints_the_rotation_and_applies_it_only_with_apply() {
    let db = "part_dry";
    fresh_db(db, &rotation_ddl());
    let rules = rules_dir("p.toml", &rule());
    migrate_ok(rules.path(), db, true);
    let url = mariadb().url(db);
    let dir = rules.path().to_str().unwrap();
    let before = partition_names(db);
    assert_eq!(before, ["p20250101", "pmax"]);
    // The server's clock is today: the 30 kept days, today and 3 days ahead to add
    // (3 a statement), 2025-01-01 expired.
    let last = scalar("SELECT CAST(CURDATE() + INTERVAL 3 DAY AS CHAR)").unwrap();
    let last = format!("p{}", last.replace('-', ""));
    for args in [
        vec!["maintain", "--rules", dir, "--backend-url", &url],
        vec![
            "maintain",
            "--job",
            "rotate",
            "--rules",
            dir,
            "--backend-url",
            &url,
        ],
    ] {
        let (code, out, err) = heatsink(&args);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("-- dry run"), "{out}");
        assert!(
            out.contains(
                "ALTER TABLE `part_dry`.`Messages` REORGANIZE PARTITION `pmax` INTO (PARTITION "
            ) && out.contains(&format!("PARTITION {last} VALUES LESS THAN"))
                && out.contains("ALTER TABLE `part_dry`.`Messages` DROP PARTITION `p20250101`;")
                && out.matches("REORGANIZE PARTITION").count() == 12
                && out.contains(
                    "rule messages_by_day: dry run: 34 partitions would be added, 1 dropped"
                ),
            "{out}"
        );
        assert_eq!(partition_names(db), before);
    }
    let (code, out, err) =
        heatsink(&["maintain", "--rules", dir, "--backend-url", &url, "--apply"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("34 partitions added, 1 dropped"), "{out}");
    let after = partition_names(db);
    assert_eq!(after.len(), 35, "{after:?}");
    assert_eq!(after[33], last);
    assert!(!after.contains(&"p20250101".to_string()));
    // Nothing left to do: the dry run prints no statement.
    let (code, out, _) = heatsink(&["maintain", "--rules", dir, "--backend-url", &url]);
    assert_eq!(code, 0);
    assert!(!out.contains("ALTER TABLE"), "{out}");
    assert!(
        out.contains("dry run: 0 partitions would be added, 0 dropped"),
        "{out}"
    );
}

/// `heatsink serve --maintain-url` runs the rotation itself, every interval; two
/// proxies share the work through the job's named lock.
#[test]
fn serve_rotates_partitions_periodically() {
    let db = "part_serve";
    fresh_db(db, &rotation_ddl());
    let rules = rules_dir("p.toml", &rule());
    migrate_ok(rules.path(), db, true);
    let start = |_: u8| {
        common::Proxy::builder()
            .rules_dir(rules.path())
            .arg("--maintain-url")
            .arg(mariadb().url(db))
            .arg("--maintain-interval")
            .arg("1")
            .start()
    };
    let proxies = [start(0), start(1)];
    // The server's clock is today: a partition for each day up to today + 3.
    let want = scalar("SELECT CAST(CURDATE() + INTERVAL 4 DAY AS CHAR)").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = scalar(&format!(
            "SELECT MAX(PARTITION_DESCRIPTION) FROM information_schema.PARTITIONS \
             WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'Messages' AND PARTITION_DESCRIPTION <> 'MAXVALUE'"
        ));
        // Days up to today + 3 added, and the long expired day dropped.
        if last.as_deref().map(|d| d.trim_matches('\'')) == Some(want.as_str())
            && partition_count(db) <= 30 + 3 + 2
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no rotation within 30 s (last bound {last:?}, want {want})\n{}\n{}",
            proxies[0].log_text(),
            proxies[1].log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs = format!("{}{}", proxies[0].log_text(), proxies[1].log_text());
    assert!(logs.contains("partitions added"), "{logs}");
}

/// The partition rule `name` on `Messages` with `period` and these settings
/// replaced (`retention_days`, `premake`, …).
fn period_rule(name: &str, period: &str, settings: &[(&str, &str)]) -> String {
    let mut text = Rule::partition(name, "Messages")
        .toml()
        .replace("period = \"day\"", &format!("period = \"{period}\""));
    for (k, v) in settings {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{k} = ")))
            .map(str::to_string);
        if let Some(line) = line {
            text = text.replace(&line, &format!("{k} = {v}"));
        }
    }
    text
}

/// A partition spec parsed from `toml`.
fn spec_of(toml: &str) -> heatsink::kinds::partition::PartitionSpec {
    heatsink::kinds::entries::<heatsink::kinds::partition::PartitionSpec>(toml, "partition")
        .unwrap()
        .remove(0)
}

/// Runs the rotate job of `spec` once on `conn`.
async fn rotate_spec(
    conn: &mut Conn,
    db: &str,
    spec: &heatsink::kinds::partition::PartitionSpec,
) -> heatsink::kinds::JobReport {
    let mut out = Vec::new();
    let mut ctx = heatsink::kinds::JobContext {
        conn,
        default_db: Some(db),
        batch: 1000,
        out: &mut out,
        apply: true,
        jobs: Default::default(),
    };
    heatsink::kinds::partition::rotate::run(spec, &mut ctx)
        .await
        .unwrap()
}

/// `Messages` with a DATETIME column partitioned by hour over 2024-11-20 …
/// 2024-11-23 (96 hours), plus `pmax`.
fn hourly_ddl(rows: &str) -> String {
    let parts: Vec<String> = (0..96)
        .map(|h| {
            let t = DAY0 + h * 3600;
            format!(
                "PARTITION p{}{:02} VALUES LESS THAN ('{}')",
                utc_date(t).replace('-', ""),
                h % 24,
                utc_time(t + 3600)
            )
        })
        .collect();
    partitioned_messages("DATETIME", &parts, rows)
}

/// `Messages` partitioned by month from 2024-06 to 2025-05, plus `pmax`.
fn monthly_ddl(rows: &str) -> String {
    let parts: Vec<String> = (0..12)
        .map(|i| {
            let (y, m) = (2024 + (5 + i) / 12, (5 + i) % 12 + 1);
            let (ny, nm) = (2024 + (6 + i) / 12, (6 + i) % 12 + 1);
            format!("PARTITION p{y}{m:02} VALUES LESS THAN ('{ny}-{nm:02}-01')")
        })
        .collect();
    partitioned_messages("DATE", &parts, rows)
}

/// Every lookup of `keys` through the proxy answers what the table answers
/// directly (text and prepared, in several time zones), reading at most `most`
/// partitions where the table read directly reads `all`.
async fn lookups_match(env: &Env, keys: &[String], most: usize, all: usize) {
    let mut p = env.proxied().await;
    let mut d = env.direct().await;
    let by_key = |k: &str| {
        format!("SELECT ID, Message, CAST(Inserted AS CHAR) FROM Messages WHERE UUID = '{k}'")
    };
    for tz in ["'+00:00'", "'+05:30'", "'-08:00'"] {
        for c in [&mut p, &mut d] {
            c.query_drop(format!("SET time_zone = {tz}")).await.unwrap();
        }
        for k in keys {
            let want: Vec<(u64, String, String)> = d.query(by_key(k)).await.unwrap();
            assert_eq!(want.len(), 1, "{tz} {k}");
            let got: Vec<(u64, String, String)> = p.query(by_key(k)).await.unwrap();
            assert_eq!(got, want, "{tz} {k}");
            let got: Vec<(u64, String, String)> = p
                .exec(
                    "SELECT ID, Message, CAST(Inserted AS CHAR) FROM Messages WHERE UUID = ?",
                    (k.as_str(),),
                )
                .await
                .unwrap();
            assert_eq!(got, want, "{tz} {k} prepared");
            assert_eq!(explain_text(&mut d, &by_key(k)).await, all, "{tz} {k}");
            if k.contains('-') && k != "no-time-here" {
                let n = explain_text(&mut p, &by_key(k)).await;
                assert!((1..=most).contains(&n), "{tz} {k}: {n} partitions read");
                let n = explain_prepared(&mut p, "SELECT Message FROM Messages WHERE UUID = ?", k)
                    .await;
                assert!(
                    (1..=most).contains(&n),
                    "{tz} {k} prepared: {n} partitions read"
                );
                let sql = format!("EXPLAIN PARTITIONS {}", by_key(k));
                assert_eq!(explain_partitions(&mut d, &sql, None).await, all);
                let n = explain_partitions(&mut p, &sql, None).await;
                assert!((1..=most).contains(&n), "{tz} {k} EXPLAIN PARTITIONS: {n}");
            }
        }
        let list: Vec<String> = keys.iter().map(|k| format!("'{k}'")).collect();
        let sql = format!(
            "SELECT ID FROM Messages WHERE UUID IN ({}) ORDER BY ID",
            list.join(", ")
        );
        let want: Vec<u64> = d.query(&sql).await.unwrap();
        let got: Vec<u64> = p.query(&sql).await.unwrap();
        assert_eq!(got, want, "{tz} IN");
    }
}

/// Hourly partitions: a lookup reads the key's hour ± 24 hours (at most 49 of 97
/// partitions) and answers what the table answers; an insert more than a day from
/// the key's hour is refused, one without the column gets the key's time.
#[test]
fn hourly_lookups_read_the_keys_hours() {
    let t1 = DAY0 + 86_400 + 5 * 3600 + 600; // 2024-11-21 05:10 UTC
    let t2 = DAY0 + 3 * 86_400 - 30; // 2024-11-22 23:59:30 UTC
    let (k1, k2) = (key(1, t1), key(2, t2));
    let rows = format!(
        "('{k1}', '{{}}', '{}'), ('{k2}', '{{}}', '{}'), ('no-time-here', '{{}}', '2024-11-21 12:00:00')",
        utc_time(t1),
        utc_time(t2)
    );
    let env = migrated(
        "part_hourly",
        hourly_ddl(&rows),
        period_rule("messages_by_hour", "hour", &[]),
    );
    run(Duration::from_secs(120), async {
        lookups_match(
            &env,
            &[k1.clone(), k2.clone(), "no-time-here".into()],
            49,
            97,
        )
        .await;
        let mut p = env.proxied().await;
        p.query_drop("SET time_zone = '+00:00'").await.unwrap();
        // 25 hours after the key's hour: refused, naming the hours.
        let bad = format!(
            "INSERT INTO Messages (UUID, Message, Inserted) VALUES ('{}', '{{}}', '{}')",
            key(3, t1),
            utc_time(t1 + 25 * 3600)
        );
        let e = common::client::assert_refused_by(&mut p, &bad, "messages_by_hour").await;
        assert!(e.message.contains("within 24 hour(s) of the hour"), "{e:?}");
        let k = key(4, t1);
        p.query_drop(format!(
            "INSERT INTO Messages (UUID, Message) VALUES ('{k}', '{{}}')"
        ))
        .await
        .unwrap();
        let got = env.backend_scalar(&format!(
            "SELECT CAST(Inserted AS CHAR) FROM {{db}}.Messages WHERE UUID = '{k}'"
        ));
        assert_eq!(got, Some(utc_time(t1)));
        let n = explain_text(
            &mut p,
            &format!("SELECT Message FROM Messages WHERE UUID = '{k}'"),
        )
        .await;
        assert!((1..=49).contains(&n), "{n}");
    });
}

/// Monthly partitions: a lookup reads the months of the key's date ± a day (one,
/// or two at a month's edge, of 13) and answers what the table answers.
#[test]
fn monthly_lookups_read_the_keys_months() {
    let t1 = DAY0 + 11 * 86_400 - 600; // 2024-11-30 23:50 UTC
    let t2 = 1_723_723_200; // 2024-08-15 12:00 UTC
    let (k1, k2) = (key(1, t1), key(2, t2));
    let rows = format!(
        "('{k1}', '{{}}', '{}'), ('{k2}', '{{}}', '{}'), ('no-time-here', '{{}}', '2025-02-11')",
        utc_date(t1),
        utc_date(t2)
    );
    let env = Env::builder("part_monthly")
        .schema(monthly_ddl(&rows))
        .rule(
            "p.toml",
            period_rule("messages_by_month", "month", &[("retention_days", "400")]),
        )
        .migrate()
        .start();
    run(Duration::from_secs(120), async {
        lookups_match(
            &env,
            &[k1.clone(), k2.clone(), "no-time-here".into()],
            2,
            13,
        )
        .await;
        let mut p = env.proxied().await;
        p.query_drop("SET time_zone = '+00:00'").await.unwrap();
        let n = explain_text(
            &mut p,
            &format!("SELECT Message FROM Messages WHERE UUID = '{k2}'"),
        )
        .await;
        assert_eq!(n, 1, "mid-month");
    });
}

/// The rotate job of hourly and monthly rules: partitions `premake` periods ahead,
/// those wholly older than `retention_days` days dropped, named by their period.
#[test]
fn hourly_and_monthly_rotation() {
    let hourly = spec_of(&period_rule(
        "by_hour",
        "hour",
        &[("retention_days", "2"), ("premake", "3")],
    ));
    let monthly = spec_of(&period_rule(
        "by_month",
        "month",
        &[("retention_days", "60"), ("premake", "2")],
    ));
    let names = |db: &str| partition_names(db);
    let hour_db = "part_rot_hour";
    fresh_db(
        hour_db,
        &partitioned_messages(
            "DATETIME",
            &["PARTITION p2025010100 VALUES LESS THAN ('2025-01-01 01:00:00')".into()],
            "",
        ),
    );
    let month_db = "part_rot_month";
    fresh_db(
        month_db,
        &partitioned_messages(
            "DATE",
            &["PARTITION p202501 VALUES LESS THAN ('2025-02-01')".into()],
            "",
        ),
    );
    run(Duration::from_secs(120), async {
        let mut c = connect(&mariadb().url(hour_db)).await;
        // 2025-01-01 10:00:30: hours up to 13:00 added, none expired.
        at(&mut c, ROT0 + 10 * 3600 + 30).await;
        let r = rotate_spec(&mut c, hour_db, &hourly).await;
        assert!(r.failed.is_empty(), "{r:?}");
        let want: Vec<String> = (0..14)
            .map(|h| format!("p20250101{h:02}"))
            .chain(["pmax".to_string()])
            .collect();
        assert_eq!(names(hour_db), want, "{}", r.summary);
        let bound = scalar(&format!(
            "SELECT PARTITION_DESCRIPTION FROM information_schema.PARTITIONS \
             WHERE TABLE_SCHEMA = '{hour_db}' AND PARTITION_NAME = 'p2025010113'"
        ));
        assert_eq!(bound.as_deref(), Some("'2025-01-01 14:00:00'"));
        // 2025-01-03 11:10: kept from 2025-01-01 11:00; hours up to 01-03 14:00.
        at(&mut c, ROT0 + 2 * 86_400 + 11 * 3600 + 600).await;
        let r = rotate_spec(&mut c, hour_db, &hourly).await;
        assert!(r.failed.is_empty(), "{r:?}");
        let got = names(hour_db);
        assert_eq!(got.len(), 3 + 49 + 1, "{got:?}");
        assert_eq!(got[0], "p2025010111");
        assert_eq!(got[got.len() - 2], "p2025010314");
        let _ = c.disconnect().await;

        let mut c = connect(&mariadb().url(month_db)).await;
        at(&mut c, ROT0 + 14 * 86_400 + 8 * 3600).await; // 2025-01-15 08:00
        let r = rotate_spec(&mut c, month_db, &monthly).await;
        assert!(r.failed.is_empty(), "{r:?}");
        assert_eq!(names(month_db), ["p202501", "p202502", "p202503", "pmax"]);
        // 2025-05-20: kept from 2025-03-21, months up to July.
        at(&mut c, ROT0 + 139 * 86_400 + 8 * 3600).await;
        let r = rotate_spec(&mut c, month_db, &monthly).await;
        assert!(r.failed.is_empty(), "{r:?}");
        assert_eq!(
            names(month_db),
            ["p202503", "p202504", "p202505", "p202506", "p202507", "pmax"],
            "{}",
            r.summary
        );
        let _ = c.disconnect().await;
    });
}

/// `migrate` partitions a table by hour (from its first hour, to the current one +
/// premake) or by month, and refuses an hourly rule on a DATE column.
#[test]
fn migrate_partitions_by_hour_and_by_month() {
    let db = "part_mig_periods";
    fresh_db(
        db,
        "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(40) NOT NULL, \
           Message JSON NOT NULL, Inserted DATETIME NOT NULL, UNIQUE KEY u (UUID));
         INSERT INTO Messages (UUID, Message, Inserted) VALUES ('a', '{}', NOW() - INTERVAL 5 HOUR);",
    );
    let first = scalar(&format!(
        "SELECT DATE_FORMAT(MIN(Inserted), 'p%Y%m%d%H') FROM {db}.Messages"
    ))
    .unwrap();
    let hourly = rules_dir("p.toml", &period_rule("by_hour", "hour", &[]));
    let printed = migrate_ok(hourly.path(), db, false);
    assert!(
        printed.contains(&format!(
            "PARTITION BY RANGE COLUMNS (`Inserted`) (PARTITION {first} VALUES LESS THAN ('"
        )),
        "{printed}"
    );
    migrate_ok(hourly.path(), db, true);
    let n = partition_count(db);
    // Five hours back, the current one, three ahead, the catch-all (one more if
    // the hour turned in between).
    assert!((10..=11).contains(&n), "{n} partitions");
    // A rule by day on the hourly table: check says the partitions are not days.
    let daily = rules_dir("p.toml", &period_rule("by_hour", "day", &[]));
    let url = mariadb().url(db);
    let (_, out, err) = heatsink(&[
        "check",
        "--rules",
        daily.path().to_str().unwrap(),
        "--backend-url",
        &url,
    ]);
    assert!(
        format!("{out}{err}")
            .contains("partitions of `part_mig_periods`.`Messages` are not one day wide"),
        "{out}{err}"
    );
    let (code, out, err) = heatsink(&[
        "check",
        "--rules",
        hourly.path().to_str().unwrap(),
        "--backend-url",
        &url,
    ]);
    assert_eq!(code, 0, "{out}{err}");

    let monthly = rules_dir("p.toml", &period_rule("by_month", "month", &[]));
    let db = "part_mig_month";
    fresh_db(
        db,
        "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(40) NOT NULL, \
           Message JSON NOT NULL, Inserted DATE NOT NULL, UNIQUE KEY u (UUID));
         INSERT INTO Messages (UUID, Message, Inserted) VALUES ('a', '{}', CURDATE() - INTERVAL 2 MONTH);",
    );
    let first = scalar(&format!(
        "SELECT CONCAT(DATE_FORMAT(MIN(Inserted), 'p%Y%m'), ' VALUES LESS THAN (''', \
                DATE_FORMAT(MIN(Inserted) + INTERVAL 1 MONTH, '%Y-%m-01'), ''')') FROM {db}.Messages"
    ))
    .unwrap();
    let printed = migrate_ok(monthly.path(), db, false);
    assert!(
        printed.contains(&format!("(PARTITION {first}, ")),
        "{printed}"
    );
    migrate_ok(monthly.path(), db, true);
    // Two months back, the current one, three ahead, the catch-all.
    assert_eq!(partition_count(db), 7);
    // An hourly rule needs a DATETIME column.
    let (code, out, err) = common::cli::migrate(hourly.path(), db, false);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("needs a DATETIME column"), "{err}");
}

/// Above the rule's `migrate_max_rows`, `migrate --apply` does not alter the table:
/// it prints the `pt-online-schema-change` command instead (and still creates the
/// triggers); at or below it the table is partitioned in place.
#[test]
fn migrate_prints_an_online_change_above_migrate_max_rows() {
    let db = "part_mig_max";
    let ddl = "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(40) NOT NULL, \
           Message JSON NOT NULL, Inserted DATE NOT NULL, UNIQUE KEY u (UUID));
         INSERT INTO Messages (UUID, Message, Inserted) VALUES
           ('a', '{}', CURDATE()), ('b', '{}', CURDATE()), ('c', '{}', CURDATE()), ('d', '{}', CURDATE());";
    fresh_db(db, ddl);
    let small = rules_dir(
        "p.toml",
        &format!(
            "{}migrate_max_rows = 3\n",
            Rule::partition("m", "Messages").toml()
        ),
    );
    for apply in [false, true] {
        let printed = migrate_ok(small.path(), db, apply);
        assert!(
            printed.contains("holds 4 rows (more than migrate_max_rows = 3)")
                && printed.contains("-- pt-online-schema-change --alter \"DROP PRIMARY KEY, ADD PRIMARY KEY (ID, Inserted)")
                && printed.contains("--preserve-triggers D=part_mig_max,t=Messages --execute")
                && !printed.contains("\nALTER TABLE"),
            "{printed}"
        );
        assert_eq!(partition_count(db), 1, "apply {apply}: not partitioned");
    }
    // The triggers were created all the same.
    let triggers = scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = '{db}'"
    ));
    assert_eq!(triggers.as_deref(), Some("2"));
    let enough = rules_dir(
        "p.toml",
        &format!(
            "{}migrate_max_rows = 4\n",
            Rule::partition("m", "Messages").toml()
        ),
    );
    let printed = migrate_ok(enough.path(), db, true);
    assert!(!printed.contains("pt-online-schema-change"), "{printed}");
    assert!(partition_count(db) > 3);
    assert_eq!(
        scalar(&format!("SELECT COUNT(*) FROM {db}.Messages")).as_deref(),
        Some("4")
    );
}

/// The partitions an `EXPLAIN PARTITIONS` answer lists (its `partitions` column,
/// every row).
async fn explain_partitions(conn: &mut Conn, sql: &str, param: Option<&str>) -> usize {
    let rows: Vec<mysql_async::Row> = match param {
        None => conn.query(sql).await.unwrap(),
        Some(k) => conn.exec(sql, (k,)).await.unwrap(),
    };
    rows.iter()
        .map(|r| {
            let i = r
                .columns_ref()
                .iter()
                .position(|c| c.name_str() == "partitions")
                .expect("a partitions column");
            match r.as_ref(i) {
                Some(mysql_async::Value::Bytes(b)) => String::from_utf8_lossy(b).split(',').count(),
                _ => 0,
            }
        })
        .sum()
}

/// `EXPLAIN PARTITIONS` and `EXPLAIN EXTENDED` through heatsink explain the
/// pruned statement (at most `1 + 2 × tolerance_days` partitions, text and
/// prepared); sent directly, they show every partition.
#[test]
fn explain_partitions_through_heatsink_shows_the_pruned_set() {
    let t = DAY0 + 4 * 86_400 + 3600;
    let (k, rows) = one_message(t);
    let env = migrated("part_explain_p", messages_ddl(&rows), rule());
    run(Duration::from_secs(60), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        for c in [&mut p, &mut d] {
            c.query_drop("SET time_zone = '+00:00'").await.unwrap();
        }
        let lookup = format!("SELECT Message FROM Messages WHERE UUID = '{k}'");
        for head in [
            "EXPLAIN PARTITIONS",
            "explain partitions",
            "DESCRIBE PARTITIONS",
        ] {
            let sql = format!("{head} {lookup}");
            assert_eq!(explain_partitions(&mut d, &sql, None).await, 17, "{sql}");
            let n = explain_partitions(&mut p, &sql, None).await;
            assert!((1..=3).contains(&n), "{sql}: {n} partitions");
        }
        let prepared = "EXPLAIN PARTITIONS SELECT Message FROM Messages WHERE UUID = ?";
        assert_eq!(explain_partitions(&mut d, prepared, Some(&k)).await, 17);
        let n = explain_partitions(&mut p, prepared, Some(&k)).await;
        assert!((1..=3).contains(&n), "prepared: {n} partitions");
        // EXTENDED: the note with the query as optimized shows the added range.
        let sql = format!("EXPLAIN EXTENDED {lookup}");
        for (c, pruned) in [(&mut p, true), (&mut d, false)] {
            let plan: Vec<mysql_async::Row> = c.query(&sql).await.unwrap();
            assert_eq!(plan.len(), 1);
            let notes: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").await.unwrap();
            let note = notes
                .iter()
                .find(|(_, code, _)| *code == 1003)
                .map(|(_, _, m)| m.clone())
                .unwrap_or_default();
            assert_eq!(note.contains("`Inserted`"), pruned, "{note}");
        }
        // The statement itself still answers the same.
        let got: Vec<String> = p.query(&lookup).await.unwrap();
        assert_eq!(got.len(), 1);
    });
}

/// The update trigger is an `AFTER UPDATE` one: with a `BEFORE UPDATE` trigger on
/// the partitioned table, MariaDB 10.11 let every `UPDATE` of a session match no
/// row once a prepared statement of that session had been pruned to no partition
/// (found by `tests/fuzz_partition.rs`). `migrate` replaces such a trigger left by
/// an earlier version, and `check` reports it.
#[test]
fn updates_after_a_statement_pruned_to_no_partition_find_their_rows() {
    let t = DAY0 + 7 * 86_400 + 3600;
    let (k, rows) = one_message(t);
    let env = migrated("part_upd_trigger", messages_ddl(&rows), rule());
    let db = env.db.clone();
    let timing = |db: &str| {
        scalar(&format!(
            "SELECT ACTION_TIMING FROM information_schema.TRIGGERS \
             WHERE TRIGGER_SCHEMA = '{db}' AND TRIGGER_NAME = 'Messages_hs_pupd'"
        ))
    };
    assert_eq!(timing(&db).as_deref(), Some("AFTER"));
    let empty = "SELECT COUNT(*) FROM Messages WHERE Inserted BETWEEN '2024-11-23' AND '2024-11-24' AND Inserted >= ?";
    run(Duration::from_secs(60), async {
        for proxied in [true, false] {
            let mut c = if proxied {
                env.proxied().await
            } else {
                env.direct().await
            };
            // Moving the row away from its key's date is refused. (Checked first:
            // after a statement pruned to no partition, MariaDB 10.11 lets an
            // UPDATE that sets the partition column match no row, with or without
            // any trigger, also on other connections.)
            let e = c
                .query_drop(format!(
                    "UPDATE Messages SET Inserted = '2024-12-01' WHERE UUID = '{k}'"
                ))
                .await
                .unwrap_err();
            assert!(e.to_string().contains("heatsink rule"), "{e}");
        }
        for proxied in [true, false] {
            let mut c = if proxied {
                env.proxied().await
            } else {
                env.direct().await
            };
            for i in 0..3 {
                let n: Vec<u64> = c.exec(empty, ("2024-11-25",)).await.unwrap();
                assert_eq!(n, [0]);
                c.query_drop(format!(
                    "UPDATE Messages SET Message = '[{i}, {proxied}]' WHERE UUID = '{k}'"
                ))
                .await
                .unwrap();
                assert_eq!(c.affected_rows(), 1, "proxied {proxied}, update {i}");
            }
        }
    });
    assert_eq!(
        env.backend_scalar(&format!(
            "SELECT CAST(Inserted AS CHAR) FROM {{db}}.Messages WHERE UUID = '{k}'"
        )),
        Some(utc_date(t))
    );
    // A BEFORE UPDATE trigger of an earlier version: check reports it, migrate
    // replaces it.
    let spec = spec();
    let table = heatsink::rules::spec::TableName {
        db: Some(db.clone()),
        name: "Messages".into(),
    };
    let (_, _, create) = heatsink::kinds::partition::schema::triggers(&spec, &table).remove(1);
    mariadb().exec(&format!(
        "DROP TRIGGER {db}.Messages_hs_pupd; {}",
        create.replace("AFTER UPDATE", "BEFORE UPDATE")
    ));
    assert_eq!(timing(&db).as_deref(), Some("BEFORE"));
    let rules = rules_dir("p.toml", &rule());
    let url = mariadb().url(&db);
    let dir = rules.path().to_str().unwrap();
    let (code, out, err) = heatsink(&["check", "--rules", dir, "--backend-url", &url]);
    assert_ne!(code, 0);
    assert!(
        format!("{out}{err}").contains("is a BEFORE UPDATE trigger"),
        "{out}{err}"
    );
    let printed = migrate_ok(rules.path(), &db, true);
    assert!(
        printed.contains(&format!(
            "DROP TRIGGER IF EXISTS `{db}`.`Messages_hs_pupd`;"
        )),
        "{printed}"
    );
    assert_eq!(timing(&db).as_deref(), Some("AFTER"));
    let (code, out, err) = heatsink(&["check", "--rules", dir, "--backend-url", &url]);
    assert_eq!(code, 0, "{out}{err}");
}

/// The environment of one test: database `db` made by `ddl`, the partition rule
/// `toml` migrated, the proxy started.
fn migrated(db: &str, ddl: impl Into<String>, toml: impl Into<String>) -> Env {
    Env::builder(db)
        .schema(ddl)
        .rule("p.toml", toml)
        .migrate()
        .start()
}

/// A key made at unix time `t` and the `Messages` row holding it.
fn one_message(t: i64) -> (String, String) {
    let k = key(1, t);
    let rows = format!("('{k}', '{{}}', '{}')", utc_date(t));
    (k, rows)
}
