//! Timeline rules (pull, push, hybrid): the friends-timeline read through heatsink,
//! in its usual spellings and pages, text and prepared, compared with the same read
//! against the plain tables, on a heavy-tailed follow graph that changes between
//! reads and under concurrent writers (through heatsink and straight to the
//! database); the mailbox never holds an entry the timeline does not.

mod common;

use std::time::Duration;

use common::client::{run, run_exec, run_text, Outcome};
use common::differential::Prng;
use common::fixture::{Env, Rule};
use common::packets::FLAGS_BY_PLAN;
use mysql_async::prelude::Queryable;
use mysql_async::Value;

const SCHEMA: &str = "CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
     PRIMARY KEY (user_id, follower_id), KEY (follower_id)); \
     CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
     body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));";

/// Users in the graph.
const USERS: u64 = 2500;

/// A heavy-tailed graph: authors 1–4 are followed by most users, the rest at random
/// (readers follow 0 to ~80 authors, and every 97th about 1,000); messages mostly
/// by the popular authors.
fn data(g: &mut Prng) -> String {
    let mut follows = Vec::new();
    for reader in 1..=USERS {
        for star in 1..=4u64 {
            if g.next_u64() % 10 < 8 && star != reader {
                follows.push(format!("({reader}, {star})"));
            }
        }
        let n = match g.next_u64() % 10 {
            // A few readers follow nearly everyone.
            _ if reader % 97 == 0 => 1400,
            0 => 0,
            1..=7 => g.next_u64() % 20,
            _ => 20 + g.next_u64() % 60,
        };
        for _ in 0..n {
            let a = 5 + g.next_u64() % (USERS - 4);
            if a != reader {
                follows.push(format!("({reader}, {a})"));
            }
        }
    }
    let messages: Vec<String> = (0..6000)
        .map(|i| {
            let author = if g.next_u64().is_multiple_of(3) {
                1 + g.next_u64() % 4
            } else {
                1 + g.next_u64() % USERS
            };
            format!("({author}, 'm{i}')")
        })
        .collect();
    format!(
        "INSERT IGNORE INTO follower VALUES {}; INSERT INTO message (user_id, body) VALUES {};",
        follows.join(", "),
        messages.join(", ")
    )
}

fn masked(mut o: Outcome) -> Outcome {
    for c in &mut o.columns {
        c.flags =
            mysql_async::consts::ColumnFlags::from_bits_truncate(c.flags.bits() & !FLAGS_BY_PLAN);
    }
    o
}

/// The read shapes: (SQL with `{r}` for the reader and `{b}` for the keyset bound,
/// whether it has a bound).
const SHAPES: &[(&str, bool)] = &[
    ("SELECT message.* FROM message INNER JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = {r} ORDER BY message.id DESC LIMIT 20", false),
    ("SELECT * FROM message m, follower f WHERE m.user_id = f.follower_id AND f.user_id = {r} ORDER BY m.id DESC LIMIT 10 OFFSET 5", false),
    ("SELECT m.id, m.body AS text, f.follower_id FROM follower f JOIN message m ON f.follower_id = m.user_id WHERE {r} = f.user_id ORDER BY m.id DESC LIMIT 7", false),
    ("SELECT m.* FROM message AS m JOIN follower AS f ON m.user_id = f.follower_id WHERE f.user_id = {r} AND m.id < {b} ORDER BY m.id DESC LIMIT 15", true),
    ("SELECT * FROM message JOIN follower ON message.user_id = follower.follower_id WHERE follower.user_id = {r} ORDER BY message.id DESC LIMIT 3, 4", false),
    // The page's size and offset as parameters when prepared.
    ("SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id WHERE f.user_id = {r} AND m.id < {b} ORDER BY m.id DESC LIMIT {n}", true),
    ("SELECT * FROM message m, follower f WHERE m.user_id = f.follower_id AND f.user_id = {r} ORDER BY m.id DESC LIMIT {n} OFFSET {k}", false),
];

/// The rule in `mode` (push and hybrid with a small mailbox, so that pages beyond
/// it take pull's bound; hybrid with a fan-out limit the popular authors exceed).
fn rule(mode: &str) -> Rule {
    let r = Rule::timeline("friends").set("mode", format!("\"{mode}\""));
    match mode {
        "pull" => r,
        _ => r
            .set("mailbox", "\"mailbox\"")
            .set("mailbox_size", "40")
            .set("fanout_limit", "100"),
    }
}

/// Mailbox entries that are not on their reader's timeline: 0 in every state.
const MAILBOX_EXTRAS: &str = "SELECT COUNT(*) FROM {db}.mailbox b \
     LEFT JOIN {db}.message m ON m.id = b.hs_message AND m.user_id = b.hs_author \
     LEFT JOIN {db}.follower f ON f.user_id = b.hs_reader AND f.follower_id = b.hs_author \
     WHERE m.id IS NULL OR f.user_id IS NULL";

/// Every shape, text and prepared, for many readers (numbers and quoted strings),
/// walking keyset pages, under changing character sets and sql_modes, with posts,
/// follows, unfollows and deletes between reads: the same rows in the same
/// order and the same column definitions as the read against the plain tables.
#[test]
fn pull_timelines_match_the_plain_query() {
    timelines_match_the_plain_query("pull", 20_261_125);
}

#[test]
fn push_timelines_match_the_plain_query() {
    timelines_match_the_plain_query("push", 20_261_126);
}

#[test]
fn hybrid_timelines_match_the_plain_query() {
    timelines_match_the_plain_query("hybrid", 20_261_127);
}

fn timelines_match_the_plain_query(mode: &str, seed: u64) {
    let mut g = Prng::new(seed);
    let env = Env::builder(format!("timeline_diff_{mode}"))
        .schema(format!("{SCHEMA} {}", data(&mut g)))
        .rule("timeline.toml", rule(mode).toml())
        .migrate()
        .metrics()
        .start();
    if mode != "pull" {
        // migrate --apply filled every reader's mailbox from the existing tables.
        let entries = env.backend_scalar("SELECT COUNT(*) FROM {db}.mailbox");
        assert!(
            entries
                .as_deref()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
                > 1000,
            "{entries:?}"
        );
    }
    run(Duration::from_secs(300), async {
        let mut p = env.proxied().await;
        let mut d = env.direct().await;
        let mut reads = 0;
        for round in 0..120u64 {
            let reader = 1 + g.next_u64() % USERS;
            let (shape, bounded) = SHAPES[(round % SHAPES.len() as u64) as usize];
            let prepared = round % 2 == 1;
            let mut bound: Option<u64> = bounded.then_some(u64::MAX >> 33);
            // The session's reading of the statement changes now and then: character
            // sets and the sql_mode flags the lexer follows.
            if round % 8 == 0 {
                let mode = [
                    "SET NAMES latin1",
                    "SET sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES'",
                    "SET NAMES utf8mb4, sql_mode = 'PIPES_AS_CONCAT,STRICT_ALL_TABLES'",
                    "SET sql_mode = DEFAULT",
                ][(round / 8 % 4) as usize];
                p.query_drop(mode).await.expect("mode through heatsink");
                d.query_drop(mode).await.expect("mode direct");
            }
            for _page in 0..if bounded { 3 } else { 1 } {
                let (n, k) = (1 + round % 25, round % 7);
                let (a, b) = if prepared {
                    let mut marks: Vec<(usize, Value)> = [
                        ("{r}", Some(reader)),
                        ("{b}", bound),
                        ("{n}", Some(n)),
                        ("{k}", Some(k)),
                    ]
                    .into_iter()
                    .filter_map(|(m, v)| Some((shape.find(m)?, Value::from(v?))))
                    .collect();
                    marks.sort_by_key(|(at, _)| *at);
                    let params: Vec<Value> = marks.into_iter().map(|(_, v)| v).collect();
                    let sql = ["{r}", "{b}", "{n}", "{k}"]
                        .iter()
                        .fold(shape.to_string(), |s, m| s.replace(m, "?"));
                    (
                        run_exec(&mut p, &sql, params.clone()).await,
                        run_exec(&mut d, &sql, params).await,
                    )
                } else {
                    let sql = shape
                        // A quoted reader now and then: the column compares it
                        // as a number, as the rewrite's bound does.
                        .replace(
                            "{r}",
                            &if round % 3 == 0 {
                                format!("'{reader}'")
                            } else {
                                reader.to_string()
                            },
                        )
                        .replace("{b}", &bound.unwrap_or(0).to_string())
                        .replace("{n}", &n.to_string())
                        .replace("{k}", &k.to_string());
                    (run_text(&mut p, &sql).await, run_text(&mut d, &sql).await)
                };
                let (a, b) = (a.expect("through heatsink"), b.expect("direct"));
                assert_eq!(
                    masked(a.clone()),
                    masked(b),
                    "reader {reader}, {shape}, bound {bound:?}, prepared {prepared}"
                );
                reads += 1;
                // The next page: below the last id seen.
                bound = a.rows.last().and_then(|r| match &r[0] {
                    Value::Int(i) => Some(*i as u64),
                    Value::UInt(i) => Some(*i),
                    Value::Bytes(b) => String::from_utf8_lossy(b).parse().ok(),
                    _ => None,
                });
                if bound.is_none() {
                    break;
                }
            }
            // The graph and the messages change between reads.
            let author = 1 + g.next_u64() % USERS;
            let change = match round % 4 {
                0 => {
                    format!("INSERT INTO message (user_id, body) VALUES ({author}, 'new {round}')")
                }
                1 => format!("INSERT IGNORE INTO follower VALUES ({reader}, {author})"),
                2 => format!(
                    "DELETE FROM follower WHERE user_id = {reader} AND follower_id = {author}"
                ),
                _ if round % 8 == 3 => format!(
                    "UPDATE message SET user_id = {author} WHERE user_id = {} ORDER BY id DESC LIMIT 1",
                    1 + g.next_u64() % USERS
                ),
                _ => {
                    format!("DELETE FROM message WHERE user_id = {author} ORDER BY id DESC LIMIT 1")
                }
            };
            // Half of the writes bypass heatsink.
            let writer = if round % 5 < 2 { &mut d } else { &mut p };
            writer.query_drop(change).await.expect("write");
        }
        assert!(reads >= 120);
    });
    if mode != "pull" {
        assert_eq!(
            env.backend_scalar(MAILBOX_EXTRAS).as_deref(),
            Some("0"),
            "mailbox entries off their timeline"
        );
    }
    let m = env.metrics();
    let rewritten = m
        .get("heatsink_rule_statements_total{rule=\"friends\",outcome=\"rewritten\"}")
        .copied()
        .unwrap_or(0);
    assert!(
        rewritten >= 120,
        "timeline reads rewritten: {rewritten}\n{m:?}"
    );
    // Every shape is served, `LIMIT ?` and `OFFSET ?` included.
    assert_eq!(
        m.get("heatsink_rule_statements_total{rule=\"friends\",outcome=\"fallback\"}")
            .copied()
            .unwrap_or(0),
        0,
        "{m:?}"
    );
}

/// A timeline read the rule cannot bound (another condition on the messages) goes
/// to the tables unchanged and is counted as a fallback; `check --backend-url`
/// wants the (author, id) index.
#[test]
fn other_shapes_fall_back_and_check_wants_the_index() {
    let env = Env::builder("timeline_fallback")
        .schema(format!(
            "{SCHEMA} INSERT INTO follower VALUES (1, 2); INSERT INTO message (user_id, body) VALUES (2, 'a'), (2, 'b');"
        ))
        .rule("timeline.toml", rule("pull").toml())
        .metrics()
        .start();
    run(Duration::from_secs(60), async {
        let mut p = env.proxied().await;
        let sql = "SELECT m.* FROM message m JOIN follower f ON m.user_id = f.follower_id \
                   WHERE f.user_id = 1 AND m.body <> 'a' ORDER BY m.id DESC LIMIT 5";
        let rows: Vec<(u32, u32, String)> = p.query(sql).await.unwrap();
        assert_eq!(rows, vec![(2, 2, "b".to_string())]);
    });
    let m = env.metrics();
    assert_eq!(
        m.get("heatsink_rule_statements_total{rule=\"friends\",outcome=\"fallback\"}"),
        Some(&1),
        "{m:?}"
    );
    common::mariadb().query_strings(&format!(
        "ALTER TABLE {}.message DROP KEY user_id_id",
        env.db
    ));
    let (code, out, err) = common::cli::heatsink(&[
        "check",
        "--rules",
        env.rules_path().to_str().unwrap(),
        "--backend-url",
        &common::mariadb().url(&env.db),
    ]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("no index starting with (user_id, id)"),
        "{out}{err}"
    );
}

/// One random write of the concurrent test: posts (single and multi-row, `INSERT …
/// SELECT`), follows, unfollows, deletes, author changes; some in transactions
/// that roll back.
fn random_write(g: &mut Prng) -> Vec<String> {
    let user = |g: &mut Prng| 1 + g.next_u64() % USERS;
    let star = |g: &mut Prng| 1 + g.next_u64() % 4;
    let one = match g.next_u64() % 10 {
        0 | 1 => format!(
            "INSERT INTO message (user_id, body) VALUES ({}, 'c'), ({}, 'c')",
            star(g),
            user(g)
        ),
        2 => format!(
            "INSERT INTO message (user_id, body) SELECT user_id, 'copy' FROM message WHERE user_id = {} ORDER BY id DESC LIMIT 2",
            user(g)
        ),
        3 => format!("INSERT IGNORE INTO follower VALUES ({}, {})", user(g), user(g)),
        4 => format!("INSERT IGNORE INTO follower VALUES ({}, {})", user(g), star(g)),
        5 => format!(
            "DELETE FROM follower WHERE user_id = {} ORDER BY follower_id LIMIT 1",
            user(g)
        ),
        6 => format!(
            "DELETE FROM message WHERE user_id = {} ORDER BY id DESC LIMIT 1",
            user(g)
        ),
        7 => format!(
            "UPDATE message SET user_id = {} WHERE user_id = {} ORDER BY id DESC LIMIT 1",
            user(g),
            user(g)
        ),
        8 => format!(
            "UPDATE IGNORE follower SET follower_id = {} WHERE user_id = {} ORDER BY follower_id LIMIT 1",
            user(g),
            user(g)
        ),
        _ => format!("INSERT INTO message (user_id, body) VALUES ({}, 's')", user(g)),
    };
    if g.next_u64().is_multiple_of(6) {
        let end = if g.next_u64().is_multiple_of(2) {
            "ROLLBACK"
        } else {
            "COMMIT"
        };
        vec!["BEGIN".into(), one, end.into()]
    } else {
        vec![one]
    }
}

/// Concurrent writers, half through heatsink and half straight to the database:
/// at every moment a reader sees, the mailbox holds no entry off its reader's
/// timeline; afterwards (and after `maintain` trims the mailboxes) every reader's
/// timeline through heatsink, walked page by page, equals the plain query's.
#[test]
fn mailboxes_stay_exact_under_concurrent_writers() {
    for (i, mode) in ["push", "hybrid"].into_iter().enumerate() {
        let mut g = Prng::new(7_000 + i as u64);
        let env = Env::builder(format!("timeline_conc_{mode}"))
            .schema(format!("{SCHEMA} {}", data(&mut g)))
            .rule("timeline.toml", rule(mode).toml())
            .migrate()
            .start();
        run(Duration::from_secs(240), async {
            let deadline = std::time::Instant::now() + Duration::from_secs(6);
            let mut tasks = Vec::new();
            for w in 0..8u64 {
                let url = if w % 2 == 0 {
                    env.url()
                } else {
                    common::mariadb().url(&env.db)
                };
                tasks.push(tokio::spawn(async move {
                    let mut c = common::client::connect(&url).await;
                    let mut g = Prng::new(w + 1);
                    let mut n = 0u64;
                    while std::time::Instant::now() < deadline {
                        for sql in random_write(&mut g) {
                            // Deadlocks and lock waits are the server's answer to
                            // the race, with or without heatsink (1467: a deadlock
                            // met while waiting for the AUTO_INCREMENT lock).
                            if let Err(e) = c.query_drop(&sql).await {
                                let msg = e.to_string();
                                assert!(
                                    ["1213", "1205", "1467"].iter().any(|c| msg.contains(c)),
                                    "{sql}: {msg}"
                                );
                                let _ = c.query_drop("ROLLBACK").await;
                                break;
                            }
                        }
                        n += 1;
                    }
                    n
                }));
            }
            let mut d = env.direct().await;
            let extras = MAILBOX_EXTRAS.replace("{db}", &env.db);
            let mut checks = 0;
            while std::time::Instant::now() < deadline {
                let n: Option<u64> = d.query_first(&extras).await.expect("extras");
                assert_eq!(n, Some(0), "{mode}: mailbox entries off their timeline");
                checks += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let mut writes = 0;
            for t in tasks {
                writes += t.await.expect("writer");
            }
            assert!(
                writes > 100 && checks > 3,
                "{writes} writes, {checks} checks"
            );
        });
        assert_eq!(env.backend_scalar(MAILBOX_EXTRAS).as_deref(), Some("0"));
        let trim = |apply: &[&str]| {
            let (rules, url) = (env.rules_path(), common::mariadb().url(&env.db));
            let mut args = vec!["maintain", "--job", "trim", "--backend-url", &url];
            args.extend(["--rules", rules.to_str().unwrap()]);
            args.extend(apply);
            let (code, out, err) = common::cli::heatsink(&args);
            assert_eq!(code, 0, "{out}{err}");
            out
        };
        let out = trim(&[]);
        assert!(out.contains("dry run"), "{out}");
        let before = env.backend_scalar("SELECT COUNT(*) FROM {db}.mailbox");
        let out = trim(&["--apply"]);
        assert_ne!(
            before,
            env.backend_scalar("SELECT COUNT(*) FROM {db}.mailbox"),
            "{out}"
        );
        let most = env.backend_scalar(
            "SELECT MAX(n) FROM (SELECT COUNT(*) n FROM {db}.mailbox GROUP BY hs_reader) x",
        );
        assert!(
            most.as_deref()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
                <= 40,
            "{most:?}: {out}"
        );
        run(Duration::from_secs(240), async {
            let mut p = env.proxied().await;
            let mut d = env.direct().await;
            let shape =
                "SELECT m.* FROM message AS m JOIN follower AS f ON m.user_id = f.follower_id \
                         WHERE f.user_id = ? AND m.id < ? ORDER BY m.id DESC LIMIT 15";
            for reader in (1..=USERS).step_by(25) {
                let mut bound = u64::from(u32::MAX);
                for page in 0..4 {
                    let params = vec![Value::from(reader), Value::from(bound)];
                    let (a, b) = if page % 2 == 0 {
                        (
                            run_exec(&mut p, shape, params.clone()).await,
                            run_exec(&mut d, shape, params).await,
                        )
                    } else {
                        let sql = shape.replacen('?', &reader.to_string(), 1).replacen(
                            '?',
                            &bound.to_string(),
                            1,
                        );
                        (run_text(&mut p, &sql).await, run_text(&mut d, &sql).await)
                    };
                    let (a, b) = (a.expect("through heatsink"), b.expect("direct"));
                    assert_eq!(
                        masked(a.clone()),
                        masked(b),
                        "{mode}: reader {reader}, below {bound}"
                    );
                    match a.rows.last().map(|r| &r[0]) {
                        Some(Value::UInt(i)) => bound = *i,
                        Some(Value::Int(i)) => bound = *i as u64,
                        Some(Value::Bytes(b)) => {
                            bound = String::from_utf8_lossy(b).parse().unwrap_or(0)
                        }
                        _ => break,
                    }
                }
            }
        });
    }
}
