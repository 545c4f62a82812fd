//! Timeline rules (pull): the friends-timeline read through heatsink, in its usual
//! spellings and pages, text and prepared, compared with the same read against the
//! plain tables, on a heavy-tailed follow graph that changes between reads.

mod common;

use std::time::Duration;

use common::client::{run, run_exec, run_text, Outcome};
use common::differential::Prng;
use common::fixture::{Env, Rule};
use mysql_async::prelude::Queryable;
use mysql_async::Value;

const SCHEMA: &str = "CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
     PRIMARY KEY (user_id, follower_id), KEY (follower_id)); \
     CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
     body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));";

/// Users in the graph.
const USERS: u64 = 400;

/// Column flags that follow MariaDB's plan (a join sorted through a temporary table
/// loses the key and AUTO_INCREMENT flags): either form is the log's answer.
const PLAN_FLAGS: u16 = 0x0002 | 0x0004 | 0x0008 | 0x0200 | 0x4000 | 0x8000;

/// A heavy-tailed graph: authors 1–4 are followed by most users, the rest at random
/// (readers follow 0 to ~80 authors); messages mostly by the popular authors.
fn data(g: &mut Prng) -> String {
    let mut follows = Vec::new();
    for reader in 1..=USERS {
        for star in 1..=4u64 {
            if g.next_u64() % 10 < 8 && star != reader {
                follows.push(format!("({reader}, {star})"));
            }
        }
        let n = match g.next_u64() % 10 {
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
            mysql_async::consts::ColumnFlags::from_bits_truncate(c.flags.bits() & !PLAN_FLAGS);
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
];

/// Every shape, text and prepared, for many readers (numbers and quoted strings),
/// walking keyset pages, under changing character sets and sql_modes, with posts,
/// follows, unfollows and deletes between reads: the same rows in the same
/// order and the same column definitions as the read against the plain tables.
#[test]
fn timelines_match_the_plain_query() {
    let mut g = Prng::new(20_261_125);
    let env = Env::builder("timeline_diff")
        .schema(format!("{SCHEMA} {}", data(&mut g)))
        .rule("timeline.toml", Rule::timeline("friends").toml())
        .metrics()
        .start();
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
                let (a, b) = if prepared {
                    let sql = shape.replace("{r}", "?").replace("{b}", "?");
                    let mut params = vec![Value::from(reader)];
                    if let Some(b) = bound {
                        params.push(Value::from(b));
                    }
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
                        .replace("{b}", &bound.unwrap_or(0).to_string());
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
                _ => {
                    format!("DELETE FROM message WHERE user_id = {author} ORDER BY id DESC LIMIT 1")
                }
            };
            p.query_drop(change).await.expect("write through heatsink");
        }
        assert!(reads >= 120);
    });
    let m = env.metrics();
    let rewritten = m
        .get("heatsink_rule_statements_total{rule=\"friends\",outcome=\"rewritten\"}")
        .copied()
        .unwrap_or(0);
    assert!(
        rewritten >= 120,
        "timeline reads rewritten: {rewritten}\n{m:?}"
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
        .rule("timeline.toml", Rule::timeline("friends").toml())
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
