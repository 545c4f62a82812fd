//! Group commit must be invisible: a merged write runs one session's statement on
//! another session's backend connection, so a session may join one only while nothing
//! in its state (variables however they were set, user variables a trigger reads,
//! temporary tables, table and global read locks, character set) can change what its
//! statement does. Every test here runs the same concurrent sessions twice, once through
//! heatsink (a counter, a ring and a rollup log, group commit at its default) and once
//! straight to MariaDB on plain twin tables, and compares every answer and the stored
//! rows. Half of the sessions change their state first, in the spellings applications
//! and dump tools use (versioned comments, `EXECUTE IMMEDIATE`, `SELECT … INTO`, `DO`,
//! assignments inside a `SELECT`); the other half stay pristine and must keep merging.
//!
//! Every statement has a time limit (the raw client's socket timeout) and a session
//! stops at its first broken answer, so a hang fails a test instead of stalling it.
//! `SS_PROXY_LOG=debug` sets the proxies' log level.

mod common;

use std::collections::HashMap;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::differential::{items_of_results, show_bytes, Item};
use common::fixture::{fresh_db, Env, Rule};
use common::rawclient::{ConnectOpts, RawClient};
use common::{mariadb, PASSWORD, USER};

// ---------------------------------------------------------------------------------------
// Fixture

/// The tests run one at a time: each puts 16 sessions on two cores, and the lock tests
/// block writes on the whole server while they run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Concurrent sessions per side.
const SESSIONS: usize = 16;

/// Time limit of one statement of a load session.
const STATEMENT_LIMIT: Duration = Duration::from_secs(8);

/// The tables, the same on both sides: a rollup log (`plays`, with a foreign key to
/// `tracks`), a ring log (`visits`), a counter table (`hits`), and `free`, which no
/// rule and no test's lock touches.
const SCHEMA: &str = "CREATE TABLE tracks (id INT PRIMARY KEY);
     INSERT INTO tracks VALUES (1), (2), (3);
     CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME DEFAULT NULL,
         track_id INT DEFAULT NULL, user_id INT DEFAULT NULL, note VARCHAR(8) DEFAULT NULL,
         label VARCHAR(16) DEFAULT NULL, who VARCHAR(32) DEFAULT NULL,
         KEY (track_id), KEY (created_at), FOREIGN KEY (track_id) REFERENCES tracks (id))
         DEFAULT CHARSET=utf8mb4;
     CREATE TABLE visits (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL,
         visitor_uid INT NOT NULL, last_update DATETIME(6) NOT NULL, KEY (uid));
     CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt BIGINT NOT NULL DEFAULT 0)
         DEFAULT CHARSET=utf8mb4;
     INSERT INTO hits VALUES ('home', 0), ('café', 0);
     CREATE TABLE free (a INT);";

/// Rows a session inserts into the ring at most (below the ring's size, so that the
/// ring keeps every row and equals the plain log).
const RING_SIZE: usize = 10;

/// A rollup on `plays`, a ring on `visits`, a counter on `hits`; `coalesce` left at its
/// default.
fn rules() -> String {
    let rollup = Rule::rollup(
        "plays_hourly",
        "plays",
        "plays_by_track_hour",
        "created_at",
        "hour",
    )
    .dimensions(&["track_id"]);
    let ring = Rule::ring("visits", "visits")
        .key(&["uid"])
        .size(RING_SIZE)
        .ring_table("visits_ring")
        .seq_table("visits_seq")
        .order_by("last_update");
    let counter = Rule::counter("hits", "hits");
    format!("{}\n{}\n{}", rollup.toml(), ring.toml(), counter.toml())
}

/// Which side a session talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Through heatsink, on the ruled tables.
    Proxied,
    /// Straight to MariaDB, on plain tables.
    Direct,
}

/// One test's two databases: `ss_<name>` behind a proxy with [`rules`], and
/// `ss_<name>_d` with the same tables and no rule.
struct Sides {
    env: Env,
    direct_db: String,
}

impl Sides {
    /// Both databases with [`SCHEMA`], then `extra_ddl` (triggers) in both.
    fn start(name: &str, extra_ddl: &str) -> Sides {
        let env = Env::builder(format!("ss_{name}"))
            .schema(SCHEMA)
            .rule("rules.toml", rules())
            .migrate()
            .metrics()
            .log_level_from("SS_PROXY_LOG")
            .start();
        let direct_db = format!("ss_{name}_d");
        fresh_db(&direct_db, SCHEMA);
        if !extra_ddl.trim().is_empty() {
            for db in [env.db.as_str(), direct_db.as_str()] {
                mariadb().exec(&format!("USE {db}; {extra_ddl}"));
            }
        }
        Sides { env, direct_db }
    }

    fn db(&self, side: Side) -> &str {
        match side {
            Side::Proxied => &self.env.db,
            Side::Direct => &self.direct_db,
        }
    }

    /// A raw client in the side's database; every read and write is bounded by `limit`.
    fn connect(&self, side: Side, limit: Duration) -> Result<RawClient, String> {
        let addr = match side {
            Side::Proxied => self.env.proxy.addr(),
            Side::Direct => mariadb().addr(),
        };
        let opts = ConnectOpts::new(USER, PASSWORD)
            .db(self.db(side))
            .timeout(limit);
        RawClient::connect(addr, &opts).map_err(|e| format!("connect to {addr}: {e:?}"))
    }

    /// The rows the sessions stored, each query in a defined order: the rollup log, the
    /// ring's rows (the ring table behind heatsink, the plain log directly) and the
    /// counters (base plus slots behind heatsink). Times are kept as their offset from
    /// UTC in hours, which is what a session's time zone changes.
    fn stored(&self, side: Side) -> Vec<(String, Vec<Vec<Option<String>>>)> {
        let db = self.db(side);
        let ring = match side {
            Side::Proxied => "visits_ring",
            Side::Direct => "visits",
        };
        let counters = match side {
            Side::Proxied => format!(
                "SELECT h.slug, h.cnt + COALESCE((SELECT SUM(s.cnt) FROM {db}.hits_slots s \
                 WHERE s.slug = h.slug), 0) FROM {db}.hits h ORDER BY 1"
            ),
            Side::Direct => format!("SELECT slug, cnt FROM {db}.hits ORDER BY 1"),
        };
        [
            format!(
                "SELECT user_id, track_id, note, HEX(label), who, \
                 ROUND(TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), created_at) / 3600) \
                 FROM {db}.plays ORDER BY 1, 2, 3, 4, 5, 6"
            ),
            format!(
                "SELECT uid, visitor_uid, ROUND(TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), last_update) / 3600) \
                 FROM {db}.{ring} ORDER BY 1, 2, 3"
            ),
            counters,
        ]
        .into_iter()
        .map(|q| {
            let rows = mariadb().query_strings(&q);
            (q.replace(db, "{db}"), rows)
        })
        .collect()
    }

    /// The proxy's `/metrics` samples (labelled ones keyed with their labels).
    fn metrics(&self) -> HashMap<String, u64> {
        self.env.metrics()
    }
}

/// `heatsink_coalesced_writes_total`.
fn coalesced_writes(m: &HashMap<String, u64>) -> u64 {
    m.get("heatsink_coalesced_writes_total")
        .copied()
        .unwrap_or_else(|| panic!("heatsink_coalesced_writes_total missing: {m:?}"))
}

/// Writes that ran alone for one of `reasons` (`heatsink_merge_alone_total{reason=…}`).
fn alone(m: &HashMap<String, u64>, reasons: &[&str]) -> u64 {
    reasons
        .iter()
        .map(|r| {
            m.get(&format!("heatsink_merge_alone_total{{reason=\"{r}\"}}"))
                .copied()
                .unwrap_or(0)
        })
        .sum()
}

/// Asserts that some writes ran alone for one of `reasons`.
fn assert_alone(s: &Sides, reasons: &[&str]) {
    let m = s.metrics();
    let mut series: Vec<String> = m
        .iter()
        .filter(|(k, _)| k.starts_with("heatsink_merge_alone_total"))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    series.sort();
    if alone(&m, reasons) == 0 {
        s.env.fail(&format!(
            "no write counted as run alone for {reasons:?}; heatsink_merge_alone_total series: {series:?}"
        ));
    }
}

// ---------------------------------------------------------------------------------------
// Sessions

/// What a client saw of one statement (last_insert_id left out: concurrent inserts
/// take ids in a different order on each side).
type Answer = Vec<Item>;

fn ask(c: &mut RawClient, sql: &[u8]) -> Answer {
    let mut items = match c.query(sql) {
        Ok(p) => items_of_results(&p, c.deprecate_eof()),
        Err(e) => vec![Item::Io(format!("{:?}: {e}", e.kind()))],
    };
    for i in &mut items {
        if let Item::Ok { last_insert_id, .. } = i {
            *last_insert_id = 0;
        }
    }
    items
}

fn broken(a: &Answer) -> bool {
    a.iter().any(|i| matches!(i, Item::Io(_)))
}

fn err_code(a: &Answer) -> Option<u16> {
    match a.first() {
        Some(Item::Err { code, .. }) => Some(*code),
        _ => None,
    }
}

fn ok_warnings(a: &Answer) -> Option<u16> {
    match a.first() {
        Some(Item::Ok { warnings, .. }) => Some(*warnings),
        _ => None,
    }
}

/// One session's statements: `prefix` (its state change) runs before the sessions wait
/// for each other, `writes` then run concurrently with the other sessions', `suffix`
/// last.
#[derive(Clone, Debug, Default)]
struct Script {
    prefix: Vec<Vec<u8>>,
    writes: Vec<Vec<u8>>,
    suffix: Vec<Vec<u8>>,
}

/// One statement of a session and its answer.
type Step = (Vec<u8>, Answer);

/// Runs every script in its own session on `side`, all at once; returns each session's
/// statements and answers. A session stops at its first broken answer (timeout).
fn run_sessions(s: &Sides, side: Side, scripts: &[Script]) -> Vec<Vec<Step>> {
    let barrier = Barrier::new(scripts.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = scripts
            .iter()
            .map(|script| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut steps: Vec<Step> = Vec::new();
                    let mut conn = match s.connect(side, STATEMENT_LIMIT) {
                        Ok(c) => Some(c),
                        Err(e) => {
                            steps.push((b"(connect)".to_vec(), vec![Item::Io(e)]));
                            None
                        }
                    };
                    let mut run = |conn: &mut Option<RawClient>, sqls: &[Vec<u8>]| {
                        for sql in sqls {
                            let Some(c) = conn.as_mut() else { return };
                            let a = ask(c, sql);
                            let stop = broken(&a);
                            steps.push((sql.clone(), a));
                            if stop {
                                *conn = None;
                            }
                        }
                    };
                    run(&mut conn, &script.prefix);
                    barrier.wait();
                    run(&mut conn, &script.writes);
                    run(&mut conn, &script.suffix);
                    steps
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("session thread"))
            .collect()
    })
}

/// What the sessions of one side saw and stored.
struct Observed {
    sessions: Vec<Vec<Step>>,
    stored: Vec<(String, Vec<Vec<Option<String>>>)>,
}

/// Runs `scripts` directly, then through heatsink, and fails on any difference in an
/// answer or the stored rows. Returns what heatsink's sessions saw.
fn differential(s: &Sides, scripts: &[Script]) -> Observed {
    let run = |side| {
        let sessions = run_sessions(s, side, scripts);
        Observed {
            sessions,
            stored: s.stored(side),
        }
    };
    let direct = run(Side::Direct);
    let proxied = run(Side::Proxied);
    let diffs = differences(&proxied, &direct, (&s.direct_db, &s.env.db));
    if !diffs.is_empty() {
        let shown = diffs.len().min(12);
        s.env.fail(&format!(
            "{} differences from the same sessions sent directly (first {shown}):\n{}\n\
             merged writes: {}",
            diffs.len(),
            diffs[..shown].join("\n"),
            coalesced_writes(&s.metrics())
        ));
    }
    proxied
}

/// Where the answers differ; `(direct, proxied)`: the two databases' names, which an
/// error message may hold (a foreign key's), compared as one.
fn differences(proxied: &Observed, direct: &Observed, dbs: (&str, &str)) -> Vec<String> {
    let same_db = |a: String| a.replace(&format!("`{}`", dbs.0), &format!("`{}`", dbs.1));
    let mut out = Vec::new();
    for (i, (p, d)) in proxied.sessions.iter().zip(&direct.sessions).enumerate() {
        for j in 0..p.len().max(d.len()) {
            let (ps, pa) = p
                .get(j)
                .map(|(s, a)| (show_bytes(s), format!("{a:?}")))
                .unwrap_or_default();
            let (ds, da) = d
                .get(j)
                .map(|(s, a)| (show_bytes(s), same_db(format!("{a:?}"))))
                .unwrap_or_default();
            if ps != ds || pa != da {
                let sql = if ps.is_empty() { &ds } else { &ps };
                out.push(format!(
                    "session {i} statement {j} `{sql}`:\n    heatsink: {pa}\n    directly: {da}"
                ));
            }
        }
    }
    for ((q, p), (_, d)) in proxied.stored.iter().zip(&direct.stored) {
        if p != d {
            let only_p: Vec<_> = common::differential::multiset_minus(p, d);
            let only_d: Vec<_> = common::differential::multiset_minus(d, p);
            out.push(format!(
                "stored rows differ: {q}\n    only through heatsink ({}): {:?}\n    only directly ({}): {:?}",
                only_p.len(),
                &only_p[..only_p.len().min(8)],
                only_d.len(),
                &only_d[..only_d.len().min(8)]
            ));
        }
    }
    out
}

fn sql(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// The `k`-th log insert of session `i` (its time is `NOW()`, its user `i`).
fn play(i: usize, k: usize) -> Vec<u8> {
    sql(&format!(
        "INSERT INTO plays (created_at, track_id, user_id) VALUES (NOW(), {}, {i})",
        1 + k % 3
    ))
}

/// The `k`-th ring insert of session `i` (its own key `i`, time `NOW(6)`).
fn visit(i: usize, k: usize) -> Vec<u8> {
    sql(&format!(
        "INSERT INTO visits (uid, visitor_uid, last_update) VALUES ({i}, {k}, NOW(6))"
    ))
}

/// Sessions `0..SESSIONS/2` run `prefix(i)` first; every session runs `writes(i)`.
fn half_changed(
    prefix: impl Fn(usize) -> Vec<Vec<u8>>,
    writes: impl Fn(usize) -> Vec<Vec<u8>>,
) -> Vec<Script> {
    (0..SESSIONS)
        .map(|i| Script {
            prefix: if i < SESSIONS / 2 {
                prefix(i)
            } else {
                Vec::new()
            },
            writes: writes(i),
            suffix: Vec::new(),
        })
        .collect()
}

/// Eight log inserts and eight ring inserts, interleaved.
fn plays_and_visits(i: usize) -> Vec<Vec<u8>> {
    (0..8).flat_map(|k| [play(i, k), visit(i, k)]).collect()
}

/// Ten log inserts.
fn plays_only(i: usize) -> Vec<Vec<u8>> {
    (0..10).map(|k| play(i, k)).collect()
}

// ---------------------------------------------------------------------------------------
// Session state leaking into other sessions' rows

/// Half of the sessions run `change`, which sets the time zone to +10:00; every
/// session stores `NOW()` into the rollup log and the ring.
fn time_zone_scenario(name: &str, change: &str) -> Sides {
    let _serial = serial();
    let s = Sides::start(name, "");
    let scripts = half_changed(|_| vec![sql(change)], plays_and_visits);
    let seen = differential(&s, &scripts);
    // The scenario means what it says: the changed sessions are 10 hours ahead.
    let plays = &seen.stored[0].1;
    assert!(
        plays
            .iter()
            .any(|r| r[0].as_deref() == Some("0") && r[5].as_deref() == Some("10")),
        "{plays:?}"
    );
    s
}

#[test]
fn time_zone_in_a_versioned_comment_stays_in_its_session() {
    let s = time_zone_scenario("tz_comment", "/*!40103 SET TIME_ZONE='+10:00' */");
    // A plain SET of a system variable, whatever its spelling, is reported with its
    // value: such sessions still merge, with sessions of the same time zone only.
    let m = s.metrics();
    assert!(coalesced_writes(&m) > 0, "{m:?}");
    assert_eq!(alone(&m, &["session_state", "untracked"]), 0, "{m:?}");
}

#[test]
fn time_zone_set_by_execute_immediate_stays_in_its_session() {
    let s = time_zone_scenario("tz_execute", "EXECUTE IMMEDIATE 'SET TIME_ZONE=''+10:00'''");
    assert_alone(&s, &["dynamic_sql"]);
}

#[test]
fn time_zone_set_with_session_scope_stays_in_its_session() {
    time_zone_scenario("tz_session", "SET @@session.time_zone = '+10:00'");
}

/// Strict sessions insert too-long values next to non-strict ones (sql_mode set in a
/// versioned comment): each strict insert fails with 1406, each non-strict one stores
/// the value cut with one warning, as directly.
#[test]
fn non_strict_sql_mode_in_a_versioned_comment_stays_in_its_session() {
    let _serial = serial();
    let s = Sides::start("sql_mode", "");
    let writes = |i: usize| -> Vec<Vec<u8>> {
        (0..8)
            .flat_map(|k| {
                let note = if k % 2 == 0 {
                    format!("too-long-note-{k}")
                } else {
                    format!("ok{k}")
                };
                let visitor = if k % 4 == 1 { 99_999_999_999 } else { k as i64 };
                [
                    sql(&format!(
                        "INSERT INTO plays (created_at, track_id, user_id, note) \
                         VALUES ('2024-03-01 10:00:00', 1, {i}, '{note}')"
                    )),
                    sql(&format!(
                        "INSERT INTO visits (uid, visitor_uid, last_update) \
                         VALUES ({i}, {visitor}, '2024-03-01 10:00:0{k}')"
                    )),
                ]
            })
            .collect()
    };
    let scripts = half_changed(|_| vec![sql("/*!40101 SET SQL_MODE='' */")], writes);
    let seen = differential(&s, &scripts);
    for (i, steps) in seen.sessions.iter().enumerate() {
        let strict = i >= SESSIONS / 2;
        for (stmt, a) in steps {
            let text = String::from_utf8_lossy(stmt);
            if !text.contains("too-long") {
                continue;
            }
            if strict {
                assert_eq!(err_code(a), Some(1406), "session {i}: {text}: {a:?}");
            } else {
                assert_eq!(ok_warnings(a), Some(1), "session {i}: {text}: {a:?}");
            }
        }
    }
}

/// A trigger on the log stores `@who`, set by half of the sessions with `set(i)`: every
/// row carries its own session's value (NULL for the others).
fn user_variable_scenario(name: &str, set: impl Fn(usize) -> String) -> Sides {
    let _serial = serial();
    let s = Sides::start(
        name,
        "CREATE TRIGGER plays_who BEFORE INSERT ON plays FOR EACH ROW SET NEW.who = @who",
    );
    let scripts = half_changed(|i| vec![sql(&set(i))], plays_only);
    let seen = differential(&s, &scripts);
    for row in &seen.stored[0].1 {
        let user: usize = row[0].as_deref().unwrap().parse().unwrap();
        let want = (user < SESSIONS / 2).then(|| format!("sess{user}"));
        assert_eq!(row[4], want, "row of session {user}: {row:?}");
    }
    s
}

#[test]
fn user_variable_assigned_in_a_select_stays_in_its_session() {
    let s = user_variable_scenario("who_select", |i| format!("SELECT @who := 'sess{i}'"));
    assert_alone(&s, &["user_variable"]);
}

#[test]
fn user_variable_assigned_by_do_stays_in_its_session() {
    user_variable_scenario("who_do", |i| format!("DO @who := 'sess{i}'"));
}

#[test]
fn user_variable_set_by_select_into_stays_in_its_session() {
    user_variable_scenario("who_into", |i| format!("SELECT 'sess{i}' INTO @who"));
}

#[test]
fn user_variable_set_by_execute_immediate_stays_in_its_session() {
    user_variable_scenario("who_execute", |i| {
        format!("EXECUTE IMMEDIATE 'SET @who = ''sess{i}'''")
    });
}

/// A trigger that signals when `@block` is 1: exactly the sessions that set it get
/// 1644 on every insert, the others' inserts succeed.
#[test]
fn user_variable_read_by_a_signalling_trigger_stays_in_its_session() {
    let _serial = serial();
    let s = Sides::start(
        "block",
        "CREATE TRIGGER plays_block BEFORE INSERT ON plays FOR EACH ROW \
         BEGIN IF @block = 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'blocked'; END IF; END",
    );
    let scripts = half_changed(|_| vec![sql("SELECT @block := 1")], plays_only);
    let seen = differential(&s, &scripts);
    for (i, steps) in seen.sessions.iter().enumerate() {
        for (stmt, a) in steps.iter().filter(|(st, _)| st.starts_with(b"INSERT")) {
            let want = if i < SESSIONS / 2 { Some(1644) } else { None };
            assert_eq!(
                err_code(a),
                want,
                "session {i}: {}: {a:?}",
                show_bytes(stmt)
            );
        }
    }
}

/// A trigger of the application's that records the writing connection
/// (`CONNECTION_ID()`) for each log row: every session finds its own inserts under
/// its own connection id, as directly.
#[test]
fn trigger_reading_the_connection_id_sees_its_own_session() {
    let _serial = serial();
    let s = Sides::start(
        "connid",
        "CREATE TABLE audit (user_id INT, conn BIGINT);
         CREATE TRIGGER plays_audit AFTER INSERT ON plays FOR EACH ROW \
         INSERT INTO audit VALUES (NEW.user_id, CONNECTION_ID())",
    );
    differential(&s, &audited_scripts());
    assert_alone(&s, &["connection_bound"]);
}

/// Every session inserts into the log, then counts the audit rows of its own user
/// recorded under its own connection id.
fn audited_scripts() -> Vec<Script> {
    let mut scripts = half_changed(|_| Vec::new(), plays_only);
    for (i, script) in scripts.iter_mut().enumerate() {
        script.suffix.push(sql(&format!(
            "SELECT COUNT(*) FROM audit WHERE user_id = {i} AND conn = CONNECTION_ID()"
        )));
    }
    scripts
}

/// The same through a table the trigger writes: the audit table's column default
/// is `CONNECTION_ID()`.
#[test]
fn connection_default_of_a_table_a_trigger_writes_sees_its_own_session() {
    let _serial = serial();
    let s = Sides::start(
        "conndef",
        "CREATE TABLE audit (user_id INT, conn BIGINT DEFAULT (CONNECTION_ID()));
         CREATE TRIGGER plays_audit AFTER INSERT ON plays FOR EACH ROW \
         INSERT INTO audit (user_id) VALUES (NEW.user_id)",
    );
    differential(&s, &audited_scripts());
    assert_alone(&s, &["connection_bound"]);
}

/// A trigger created while heatsink serves is seen once the table's verdict is
/// older than `rewrite::bound::VERDICT_TTL` (5 s): the sessions after it find their
/// own connection ids.
#[test]
fn trigger_created_while_serving_is_seen_within_the_verdict_lifetime() {
    let _serial = serial();
    let s = Sides::start("connlate", "CREATE TABLE audit (user_id INT, conn BIGINT)");
    differential(&s, &half_changed(|_| Vec::new(), plays_only));
    assert!(coalesced_writes(&s.metrics()) > 0);
    for side in [Side::Proxied, Side::Direct] {
        mariadb().exec(&format!(
            "USE {}; DELETE FROM plays; CREATE TRIGGER plays_audit AFTER INSERT ON plays \
             FOR EACH ROW INSERT INTO audit VALUES (NEW.user_id, CONNECTION_ID())",
            s.db(side)
        ));
    }
    std::thread::sleep(Duration::from_millis(5_500));
    differential(&s, &audited_scripts());
    assert_alone(&s, &["connection_bound"]);
}

/// A trigger that reads only its row and the clock (a per-track tally) leaves the
/// log's inserts merging, with the same rows and tallies as directly.
#[test]
fn trigger_reading_only_its_row_keeps_merging() {
    let _serial = serial();
    let s = Sides::start(
        "tally",
        "CREATE TABLE tally (track_id INT PRIMARY KEY, n INT NOT NULL, at DATETIME);
         CREATE TRIGGER plays_tally AFTER INSERT ON plays FOR EACH ROW \
         INSERT INTO tally VALUES (NEW.track_id, 1, NOW()) \
         ON DUPLICATE KEY UPDATE n = n + 1, at = GREATEST(at, VALUES(at))",
    );
    differential(&s, &half_changed(|_| Vec::new(), plays_only));
    let tally = |side| {
        mariadb().query_strings(&format!(
            "SELECT track_id, n FROM {}.tally ORDER BY track_id",
            s.db(side)
        ))
    };
    assert_eq!(tally(Side::Proxied), tally(Side::Direct));
    let m = s.metrics();
    assert!(coalesced_writes(&m) > 0, "{m:?}");
    assert_eq!(alone(&m, &["connection_bound"]), 0, "{m:?}");
}

/// `ROW_COUNT()` right after an insert that merged reads what it reads directly:
/// the insert's own row count.
#[test]
#[ignore = "known limitation (rules/README.md, rollup): ROW_COUNT() after a merged insert reads -1 on the writing session and 0 on the others"]
fn row_count_after_a_merged_insert_is_its_own() {
    let _serial = serial();
    let s = Sides::start("rowcount", "");
    let writes = |i: usize| -> Vec<Vec<u8>> {
        (0..8)
            .flat_map(|k| [play(i, k), sql("SELECT ROW_COUNT()")])
            .collect()
    };
    differential(&s, &half_changed(|_| Vec::new(), writes));
    assert!(coalesced_writes(&s.metrics()) > 0);
}

/// `SET NAMES latin1` in a versioned comment: the session's non-ASCII literals are
/// latin1 bytes, in a log value and in a counter key.
#[test]
fn character_set_in_a_versioned_comment_stays_in_its_session() {
    let _serial = serial();
    let s = Sides::start("names", "");
    let writes = |i: usize| -> Vec<Vec<u8>> {
        let cafe: &[u8] = if i < SESSIONS / 2 {
            b"caf\xe9"
        } else {
            "café".as_bytes()
        };
        (0..8)
            .flat_map(|k| {
                let mut play = format!(
                    "INSERT INTO plays (created_at, track_id, user_id, label) \
                     VALUES ('2024-03-01 10:00:00', {}, {i}, '",
                    1 + k % 3
                )
                .into_bytes();
                play.extend_from_slice(cafe);
                play.extend_from_slice(b"')");
                let mut inc = b"UPDATE hits SET cnt = cnt + 1 WHERE slug = '".to_vec();
                inc.extend_from_slice(if k % 2 == 0 { cafe } else { b"home" });
                inc.push(b'\'');
                [play, inc]
            })
            .collect()
    };
    let scripts = half_changed(|_| vec![sql("/*!40101 SET NAMES latin1 */")], writes);
    differential(&s, &scripts);
}

/// `foreign_key_checks` off in a versioned comment (as dump files start): those
/// sessions store rows of a track that does not exist, the others get 1452.
#[test]
fn foreign_key_checks_in_a_versioned_comment_stay_in_their_session() {
    let _serial = serial();
    let s = Sides::start("fk", "");
    let writes = |i: usize| -> Vec<Vec<u8>> {
        (0..10)
            .map(|k| {
                let track = if k % 2 == 0 { 99 } else { 1 };
                sql(&format!(
                    "INSERT INTO plays (created_at, track_id, user_id) \
                     VALUES ('2024-03-01 10:00:00', {track}, {i})"
                ))
            })
            .collect()
    };
    let scripts = half_changed(
        |_| vec![sql("/*!40014 SET FOREIGN_KEY_CHECKS=0 */")],
        writes,
    );
    let seen = differential(&s, &scripts);
    for (i, steps) in seen.sessions.iter().enumerate().skip(SESSIONS / 2) {
        for (stmt, a) in steps.iter().filter(|(st, _)| st.ends_with(b"99, 0)")) {
            assert_eq!(err_code(a), Some(1452), "session {i}: {}", show_bytes(stmt));
        }
    }
}

/// A temporary table named like the log: the sessions that made one insert into it,
/// and read their own rows back from it.
#[test]
fn temporary_table_shadowing_the_log_stays_in_its_session() {
    let _serial = serial();
    let s = Sides::start("temp", "");
    let mut scripts = half_changed(
        |_| {
            vec![sql(
                "CREATE TEMPORARY TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 created_at DATETIME, track_id INT, user_id INT)",
            )]
        },
        plays_only,
    );
    for script in scripts.iter_mut().take(SESSIONS / 2) {
        script
            .suffix
            .push(sql("SELECT id, user_id FROM plays ORDER BY id"));
    }
    differential(&s, &scripts);
    assert_alone(&s, &["temporary_table"]);
}

// ---------------------------------------------------------------------------------------
// Pristine sessions keep merging

/// 24 sessions that changed nothing insert into the log and the ring and increment
/// counters: the answers and rows equal the direct run's, and writes were merged.
#[test]
fn pristine_sessions_merge_and_match() {
    let _serial = serial();
    let s = Sides::start("pristine", "");
    let scripts: Vec<Script> = (0..24)
        .map(|i| Script {
            prefix: Vec::new(),
            writes: (0..8)
                .flat_map(|k| {
                    [
                        play(i, k),
                        visit(i, k),
                        sql(&format!(
                            "UPDATE hits SET cnt = cnt + {} WHERE slug = 'home'",
                            1 + k % 3
                        )),
                    ]
                })
                .collect(),
            suffix: Vec::new(),
        })
        .collect();
    differential(&s, &scripts);
    let m = s.metrics();
    let merged = coalesced_writes(&m);
    if merged == 0 {
        s.env
            .fail("24 pristine sessions: heatsink_coalesced_writes_total is 0");
    }
    eprintln!("pristine: {merged} merged writes");
}

// ---------------------------------------------------------------------------------------
// Locks: nothing waits forever

/// Kills, on drop, every connection still in the database (a leaked lock must not
/// block the tests that follow).
struct KillLeftovers(String);

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        let ids = mariadb().query_strings(&format!(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '{}' AND ID <> CONNECTION_ID()",
            self.0
        ));
        let opts = ConnectOpts::new(USER, PASSWORD).timeout(Duration::from_secs(5));
        let Ok(mut c) = RawClient::connect(mariadb().addr(), &opts) else {
            return;
        };
        for id in ids
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
        {
            // A connection may have ended meanwhile (1094): nothing to do.
            ask(&mut c, format!("KILL {id}").as_bytes());
        }
    }
}

/// How the lock holder ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// `UNLOCK TABLES`.
    Unlock,
    /// Its client goes away (socket closed, no COM_QUIT).
    Disconnect,
}

/// What one side of a lock scenario saw.
#[derive(Debug)]
struct LockRun {
    /// The holder's statements, answers and how long each took.
    holder: Vec<(String, Answer, Duration)>,
    /// The waiting sessions' answers.
    waiters: Vec<Vec<Step>>,
    /// After the holder left: `check` run on a new direct connection, and its time.
    after: Option<(Answer, Duration)>,
    /// Rows in `plays` at the end.
    plays: Option<String>,
}

/// Session A runs `lock`; eight sessions (lock_wait_timeout 5 s, as A's) insert into
/// the log and wait; A inserts three rows, then ends as `end`. With `End::Disconnect`, `check`
/// runs on a direct connection of its own (lock_wait_timeout 8 s) right after.
fn lock_scenario(s: &Sides, side: Side, lock: &str, end: End, check: &str) -> LockRun {
    let mut a = s
        .connect(side, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut holder = Vec::new();
    let mut step = |a: &mut RawClient, q: &str| {
        let t = Instant::now();
        let answer = ask(a, q.as_bytes());
        let ok = !broken(&answer);
        holder.push((q.to_string(), answer, t.elapsed()));
        ok
    };
    // The same setting as the waiting sessions': a session pristine but for it may
    // share their merged writes.
    step(&mut a, "SET SESSION lock_wait_timeout = 5");
    step(&mut a, lock);
    let waiters = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|j| {
                scope.spawn(move || {
                    let mut steps = Vec::new();
                    let mut c = match s.connect(side, Duration::from_secs(12)) {
                        Ok(c) => c,
                        Err(e) => return vec![(b"(connect)".to_vec(), vec![Item::Io(e)])],
                    };
                    for q in [
                        sql("SET SESSION lock_wait_timeout = 5"),
                        sql(&format!(
                            "INSERT INTO plays (created_at, track_id, user_id) \
                             VALUES ('2024-03-01 10:00:00', 1, {})",
                            100 + j
                        )),
                    ] {
                        let answer = ask(&mut c, &q);
                        let stop = broken(&answer);
                        steps.push((q, answer));
                        if stop {
                            break;
                        }
                    }
                    steps
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        let mut alive = true;
        for k in 0..3 {
            if alive {
                alive = step(
                    &mut a,
                    &format!(
                        "INSERT INTO plays (created_at, track_id, user_id) \
                         VALUES ('2024-03-01 11:00:00', 2, {k})"
                    ),
                );
            }
        }
        match end {
            End::Unlock => {
                if alive {
                    step(&mut a, "UNLOCK TABLES");
                }
            }
            End::Disconnect => {
                let _ = a.stream().shutdown(std::net::Shutdown::Both);
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("waiting session"))
            .collect::<Vec<_>>()
    });
    drop(a);
    let after = (end == End::Disconnect).then(|| {
        let opts = ConnectOpts::new(USER, PASSWORD)
            .db(s.db(side))
            .timeout(Duration::from_secs(10));
        let mut c = RawClient::connect(mariadb().addr(), &opts).expect("direct connection");
        ask(&mut c, b"SET SESSION lock_wait_timeout = 8");
        let t = Instant::now();
        let answer = ask(&mut c, check.as_bytes());
        (answer, t.elapsed())
    });
    LockRun {
        holder,
        waiters,
        after,
        plays: None,
    }
}

/// Runs the lock scenario directly, then through heatsink; both must see the same
/// answers, the holder's statements must answer at once, and after a disconnect the
/// check must not wait for a lock.
fn lock_test(name: &str, lock: &str, end: End, check: &str) -> Sides {
    let _serial = serial();
    let s = Sides::start(name, "");
    let _cleanup = KillLeftovers(s.env.db.clone());
    let count = |side: Side, run: &mut LockRun| {
        run.plays = mariadb()
            .query_strings(&format!("SELECT COUNT(*) FROM {}.plays", s.db(side)))
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten());
    };
    let mut direct = lock_scenario(&s, Side::Direct, lock, end, check);
    count(Side::Direct, &mut direct);
    let mut proxied = lock_scenario(&s, Side::Proxied, lock, end, check);
    let proxied_after = proxied.after.clone();
    // Leftover locks through heatsink would make the count below wait.
    drop(KillLeftovers(s.env.db.clone()));
    count(Side::Proxied, &mut proxied);

    let mut problems = Vec::new();
    for (q, a, took) in &proxied.holder {
        if *took > Duration::from_secs(3) || broken(a) {
            problems.push(format!("holder `{q}` took {took:?}: {a:?}"));
        }
    }
    if let Some((a, took)) = &proxied_after {
        if *took > Duration::from_secs(5) || broken(a) || err_code(a).is_some() {
            problems.push(format!(
                "after the holder left, a direct `{check}` took {took:?}: {a:?}"
            ));
        }
    }
    let strip = |r: &LockRun| {
        (
            r.holder
                .iter()
                .map(|(q, a, _)| (q.clone(), a.clone()))
                .collect::<Vec<_>>(),
            r.waiters.clone(),
            r.after.as_ref().map(|(a, _)| a.clone()),
            r.plays.clone(),
        )
    };
    if strip(&proxied) != strip(&direct) {
        problems.push(format!(
            "answers differ from the same sessions sent directly:\n  heatsink: {:?}\n  directly: {:?}",
            strip(&proxied),
            strip(&direct)
        ));
    }
    if !problems.is_empty() {
        s.env.fail(&problems.join("\n"));
    }
    s
}

/// `LOCK TABLES plays WRITE`; others wait for the lock; the holder's own inserts
/// answer at once, and the others' succeed after `UNLOCK TABLES`.
#[test]
fn lock_tables_holder_is_answered_at_once() {
    let s = lock_test(
        "lock_tables",
        "LOCK TABLES plays WRITE",
        End::Unlock,
        "SELECT COUNT(*) FROM plays",
    );
    assert_alone(&s, &["table_lock"]);
}

/// The holder of `LOCK TABLES plays WRITE` inserts, then its client goes away: its
/// backend connection keeps no lock, so a direct `SELECT COUNT(*) FROM plays` answers
/// at once, and the waiting sessions' inserts succeed.
#[test]
fn lock_tables_holder_that_disconnects_leaves_no_lock() {
    lock_test(
        "lock_gone",
        "LOCK TABLES plays WRITE",
        End::Disconnect,
        "SELECT COUNT(*) FROM plays",
    );
}

/// `FLUSH TABLES WITH READ LOCK`: the holder's inserts fail with 1223 at once, and
/// once its client has gone a direct write elsewhere on the server does not wait.
#[test]
fn global_read_lock_holder_gets_1223_at_once() {
    lock_test(
        "read_lock",
        "FLUSH TABLES WITH READ LOCK",
        End::Disconnect,
        "INSERT INTO free VALUES (1)",
    );
}
