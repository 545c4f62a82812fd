//! Statements MariaDB accepts but the parser cannot read (`LOAD DATA`, `SET STATEMENT
//! … FOR`, compound `INTERVAL` units, `SELECT … INTO`), and COM_STMT_SEND_LONG_DATA on
//! prepared statements of ruled tables.
//!
//! On rollup, partition and timeline tables each script runs directly against MariaDB
//! and through heatsink on the same freshly migrated database; every response packet
//! must be the same (rows, column definitions, OK packets, errors), and the rollups
//! must still equal a GROUP BY over the log. On counter and ring tables such statements
//! are refused with 1105 and change nothing.

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use common::fixture::{fresh_db, migrate_apply, utc_date, Rule};
use common::packets::{
    describe, read_lenenc, read_lenenc_str, text_rows, Packet, GROUPED_FLAGS_BY_PLAN,
};
use common::rawclient::{caps, types, ConnectOpts, RawClient, RawParam};
use common::{http_get, mariadb, sample, Proxy, PASSWORD, USER};

/// One client action.
#[derive(Clone, Debug)]
enum Act {
    /// COM_QUERY.
    Query(String),
    /// COM_QUERY of `LOAD DATA LOCAL INFILE`, answered with these bytes.
    Infile(String, Vec<u8>),
    /// COM_STMT_PREPARE, the statement id remembered under a name.
    Prepare(&'static str, String),
    /// COM_STMT_EXECUTE with types bound.
    Execute(&'static str, Vec<RawParam>),
    /// COM_STMT_EXECUTE relying on the types bound before.
    ExecuteUnbound(&'static str, Vec<RawParam>),
    /// COM_STMT_EXECUTE without parameters of a `LOAD DATA LOCAL INFILE`, answered
    /// with these bytes.
    ExecuteInfile(&'static str, Vec<u8>),
    /// COM_STMT_SEND_LONG_DATA (no response).
    LongData(&'static str, u16, Vec<u8>),
    /// COM_STMT_RESET.
    Reset(&'static str),
}

/// What the direct run must answer, so that a typo cannot shrink the test.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Ok,
    Err(u16),
}

#[derive(Clone, Debug)]
struct Step {
    act: Act,
    expect: Expect,
}

fn q(sql: impl Into<String>) -> Step {
    Step {
        act: Act::Query(sql.into()),
        expect: Expect::Ok,
    }
}

fn qerr(sql: impl Into<String>, code: u16) -> Step {
    Step {
        act: Act::Query(sql.into()),
        expect: Expect::Err(code),
    }
}

fn step(act: Act) -> Step {
    Step {
        act,
        expect: Expect::Ok,
    }
}

/// Runs `steps` on a new connection to `addr` in `db`; prepared statement ids in the
/// answers become their ordinal in the run.
fn run_script(addr: SocketAddr, db: &str, steps: &[Step]) -> Vec<Vec<Packet>> {
    let opts = ConnectOpts::new(USER, PASSWORD)
        .db(db)
        .caps(caps::DEFAULT)
        .deprecate_eof(true);
    let mut c = RawClient::connect(addr, &opts).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let mut out = Vec::new();
    for s in steps {
        let id = |name: &str| ids.get(name).copied().unwrap_or(0);
        let packets = match &s.act {
            Act::Query(sql) => c.query(sql),
            Act::Infile(sql, data) => {
                c.set_local_infile(data.clone());
                c.query(sql)
            }
            Act::Prepare(name, sql) => c.prepare(sql).map(|(sid, mut packets)| {
                ids.insert(name, sid);
                if let Some(first) = packets.first_mut().filter(|p| p.header() == 0) {
                    first.payload[1..5].copy_from_slice(&(ids.len() as u32).to_le_bytes());
                }
                packets
            }),
            Act::Execute(name, params) => c.execute(id(name), params),
            Act::ExecuteUnbound(name, params) => c.execute_with(id(name), params, false, 0),
            Act::ExecuteInfile(name, data) => {
                c.set_local_infile(data.clone());
                c.execute(id(name), &[])
            }
            Act::LongData(name, param, data) => c
                .send_long_data(id(name), *param, data)
                .map(|()| Vec::new()),
            Act::Reset(name) => c.reset_stmt(id(name)),
        }
        .unwrap_or_else(|e| panic!("{addr}: {:?}: {e}", s.act));
        out.push(packets);
    }
    out
}

/// Sets `db` up with `setup`, runs the script `steps(label)` directly (label `d`) and,
/// after setting it up again, through `proxy` (label `p`), and panics with every
/// difference. Returns the proxied run's answers.
fn same_as_direct(
    db: &str,
    setup: &dyn Fn(),
    steps: &dyn Fn(&str) -> Vec<Step>,
    proxy: &Proxy,
) -> Vec<Vec<Packet>> {
    setup();
    let direct_steps = steps("d");
    let direct = run_script(mariadb().addr(), db, &direct_steps);
    for (i, (s, packets)) in direct_steps.iter().zip(&direct).enumerate() {
        let last_err = packets.last().and_then(|p| p.err()).map(|e| e.code);
        match s.expect {
            Expect::Ok => assert!(
                packets.iter().all(|p| p.err().is_none()),
                "step {i} {:?}: direct MariaDB answered {packets:?}",
                s.act
            ),
            Expect::Err(code) => assert_eq!(
                last_err,
                Some(code),
                "step {i} {:?}: direct MariaDB answered {packets:?}",
                s.act
            ),
        }
    }
    setup();
    let proxied_steps = steps("p");
    let proxied = run_script(proxy.addr(), db, &proxied_steps);
    let mut report = String::new();
    for (i, (s, (a, b))) in proxied_steps
        .iter()
        .zip(direct.iter().zip(&proxied))
        .enumerate()
    {
        if masked(a) != masked(b) {
            let _ = writeln!(report, "step {i} {:?}:", s.act);
            for (name, side) in [("direct", a), ("heatsink", b)] {
                let _ = writeln!(report, "  {name}:");
                for p in side {
                    let _ = writeln!(report, "    {}", describe(&p.payload));
                }
            }
        }
    }
    if !report.is_empty() {
        panic!(
            "{db}: heatsink differs from direct MariaDB\n{report}\n--- proxy log ---\n{}",
            common::client::tail(&proxy.log_text(), 30)
        );
    }
    proxied
}

/// Status bits that follow the plan too: NO_GOOD_INDEX_USED, NO_INDEX_USED.
const STATUS_BY_PLAN: u16 = 0x0010 | 0x0020;

/// The packets with [`GROUPED_FLAGS_BY_PLAN`] cleared in column definitions and
/// [`STATUS_BY_PLAN`] in OK and EOF packets.
fn masked(packets: &[Packet]) -> Vec<Packet> {
    packets
        .iter()
        .map(|p| {
            let mut p = p.clone();
            let status_at = match p.payload.first() {
                Some(0xfe) if p.payload.len() < 9 => Some(3),
                Some(0x00 | 0xfe) => {
                    let mut pos = 1;
                    (read_lenenc(&p.payload, &mut pos).is_some()
                        && read_lenenc(&p.payload, &mut pos).is_some())
                    .then_some(pos)
                }
                _ => None,
            };
            if let Some(at) = status_at.filter(|&at| p.payload.len() >= at + 2) {
                let status =
                    u16::from_le_bytes([p.payload[at], p.payload[at + 1]]) & !STATUS_BY_PLAN;
                p.payload[at..at + 2].copy_from_slice(&status.to_le_bytes());
            }
            if p.payload.starts_with(b"\x03def") {
                let mut pos = 0;
                let strings = (0..6).all(|_| read_lenenc_str(&p.payload, &mut pos).is_some());
                // 0x0c, character set (2), length (4), type (1), then the flags.
                let at = pos + 8;
                if strings && p.payload.len() >= at + 2 {
                    let flags = u16::from_le_bytes([p.payload[at], p.payload[at + 1]])
                        & !GROUPED_FLAGS_BY_PLAN;
                    p.payload[at..at + 2].copy_from_slice(&flags.to_le_bytes());
                }
            }
            p
        })
        .collect()
}

/// A proxy with the rules of `toml` and a metrics port.
fn proxy_with(toml: &str) -> (Proxy, SocketAddr, tempfile::TempDir) {
    let rules = common::client::rules_dir("rules.toml", toml);
    let (proxy, metrics) = Proxy::builder()
        .rules_dir(rules.path())
        .start_with_metrics();
    (proxy, metrics, rules)
}

/// The rule's `outcome` count in the proxy's metrics.
fn outcome(metrics: SocketAddr, rule: &str, outcome: &str) -> f64 {
    let (_, body) = http_get(metrics, "/metrics");
    sample(
        &body,
        &format!("heatsink_rule_statements_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

/// A file the server may read with `LOAD DATA INFILE`, or `None` when it cannot
/// (a `secure_file_priv` elsewhere, or another user).
fn server_readable(dir: &Path, name: &str, data: &str) -> Option<String> {
    let file = dir.join(name);
    std::fs::write(&file, data).expect("write data file");
    let path = file.to_str()?.to_string();
    let readable = common::fixture::scalar(&format!("SELECT LOAD_FILE('{path}') IS NOT NULL"));
    (readable.as_deref() == Some("1")).then_some(path)
}

/// A directory the server may write `SELECT … INTO OUTFILE` files into.
fn out_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let _ = std::process::Command::new("chmod")
        .arg("777")
        .arg(dir.path())
        .status();
    dir
}

// ---------------------------------------------------------------------------------------
// Rollup

const PLAYS: &str = "CREATE TABLE plays (id BIGINT AUTO_INCREMENT PRIMARY KEY, created_at DATETIME DEFAULT NULL, \
     track_id INT DEFAULT NULL, user_id INT DEFAULT NULL, referer TEXT, country VARCHAR(255) DEFAULT NULL, \
     KEY (track_id), KEY (created_at)); \
     INSERT INTO plays (created_at, track_id, user_id, referer, country) VALUES \
     ('2024-05-01 10:15:00', 1, 10, 'a', 'US'), ('2024-05-01 10:45:00', 1, NULL, NULL, 'US'), \
     ('2024-05-01 11:00:00', 1, 11, 'b', NULL), ('2024-05-01 23:59:59', NULL, 12, NULL, 'DE'), \
     (NULL, 2, 13, 'c', 'DE'), ('2024-05-02 00:00:00', 2, 14, 'd', 'FR'), \
     ('2024-05-02 08:30:00', 3, -5, 'e', ''), ('2024-05-02 08:31:00', 0, 0, 'f', 'US');";

fn rollup_rules() -> String {
    let hourly = Rule::rollup(
        "plays_hourly",
        "plays",
        "plays_by_track_hour",
        "created_at",
        "hour",
    )
    .dimensions(&["track_id"]);
    let daily = Rule::rollup(
        "plays_daily",
        "plays",
        "plays_by_country_day",
        "created_at",
        "day",
    )
    .dimensions(&["track_id", "country"])
    .measures(&["count(*)", "count(user_id)", "sum(user_id)"]);
    format!("{}\n{}", hourly.toml(), daily.toml())
}

type Groups = Vec<Vec<Option<String>>>;

fn sorted(mut rows: Groups) -> Groups {
    rows.sort();
    rows
}

/// Both rollups equal a GROUP BY over the log.
#[track_caller]
fn assert_rollups_exact(db: &str) {
    let log = mariadb().query_strings(&format!(
        "SELECT CAST(track_id AS CHAR), DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00'), COUNT(*) \
         FROM {db}.plays GROUP BY track_id, DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00')"
    ));
    let rollup = mariadb().query_strings(&format!(
        "SELECT IF(hs_nulls & 1, NULL, CAST(track_id AS CHAR)), \
                IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d %H:%i:%s')), SUM(hs_rows) \
         FROM {db}.plays_by_track_hour GROUP BY track_id, hs_nulls, hs_bucket HAVING SUM(hs_rows) <> 0"
    ));
    assert_eq!(sorted(rollup), sorted(log), "hourly rollup");
    let log = mariadb().query_strings(&format!(
        "SELECT CAST(track_id AS CHAR), country, DATE_FORMAT(created_at, '%Y-%m-%d 00:00:00'), \
                COUNT(*), COUNT(user_id), CAST(IFNULL(SUM(user_id), 0) AS CHAR) \
         FROM {db}.plays GROUP BY track_id, country, DATE_FORMAT(created_at, '%Y-%m-%d 00:00:00')"
    ));
    let rollup = mariadb().query_strings(&format!(
        "SELECT IF(hs_nulls & 1, NULL, CAST(track_id AS CHAR)), IF(hs_nulls & 2, NULL, country), \
                IF(hs_nulls & (1 << 31), NULL, DATE_FORMAT(hs_bucket, '%Y-%m-%d %H:%i:%s')), \
                SUM(hs_rows), SUM(hs_count_user_id), CAST(SUM(hs_sum_user_id) AS CHAR) \
         FROM {db}.plays_by_country_day GROUP BY track_id, country, hs_nulls, hs_bucket \
         HAVING SUM(hs_rows) <> 0 OR SUM(hs_count_user_id) <> 0 OR SUM(hs_sum_user_id) <> 0"
    ));
    assert_eq!(sorted(rollup), sorted(log), "daily rollup");
}

const PLAYS_TSV: &str =
    "2024-05-04 12:00:00\t6\t30\tUS\n\\N\t6\t\\N\t\\N\n2024-05-04 12:30:00\t\\N\t31\tFR\n\
                         2024-05-01 10:20:00\t1\t32\tUS\n";

#[test]
fn rollup_logs_take_what_the_parser_cannot_read_as_mariadb_does() {
    let db = "gaps_rollup";
    let (proxy, metrics, _rules) = proxy_with(&rollup_rules());
    let files = tempfile::tempdir().expect("temp dir");
    let server_file = server_readable(files.path(), "plays.tsv", PLAYS_TSV);
    eprintln!(
        "LOAD DATA INFILE readable by the server: {}",
        server_file.is_some()
    );
    let outfiles = out_dir();
    let out = |label: &str, name: &str| {
        outfiles
            .path()
            .join(format!("{name}_{label}.txt"))
            .to_string_lossy()
            .into_owned()
    };
    let read =
        "SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at >= '2024-05-01 10:30:00' \
                AND created_at < NOW() GROUP BY track_id ORDER BY track_id";
    let steps = |label: &str| {
        let mut s = vec![
            step(Act::Infile(
                "LOAD DATA LOCAL INFILE 'plays.tsv' INTO TABLE plays (created_at, track_id, user_id, country)"
                    .into(),
                PLAYS_TSV.as_bytes().to_vec(),
            )),
            step(Act::Infile(
                "LOAD DATA LOCAL INFILE 'plays.tsv' IGNORE INTO TABLE plays FIELDS TERMINATED BY '\\t' \
                 (@t, track_id, user_id, country) SET created_at = @t + INTERVAL 1 DAY, referer = 'loaded'"
                    .into(),
                PLAYS_TSV.as_bytes().to_vec(),
            )),
        ];
        if let Some(path) = &server_file {
            s.push(q(format!(
                "LOAD DATA INFILE '{path}' REPLACE INTO TABLE plays (created_at, track_id, user_id, country)"
            )));
        }
        s.extend([
            q(read),
            q(format!("SET STATEMENT time_zone = '+10:00' FOR {read}")),
            q(format!(
                "SET STATEMENT time_zone = '-07:00', div_precision_increment = 2 FOR {read}"
            )),
            q(format!("SET STATEMENT max_statement_time = 100 FOR {read}")),
            q(format!("SET STATEMENT sql_mode = 'ANSI_QUOTES' FOR {read}")),
            q("SET STATEMENT time_zone = '+10:00' FOR SELECT COUNT(*) AS n FROM plays"),
            q("SET STATEMENT time_zone = '+02:00' FOR INSERT INTO plays (created_at, track_id, user_id, country) \
               VALUES ('2024-05-03 01:00:00', 4, 40, 'SE')"),
            q("SET STATEMENT sql_mode = '' FOR UPDATE plays SET track_id = 5 WHERE track_id = 4"),
            qerr("SET STATEMENT time_zone = 'Nowhere/Never' FOR SELECT COUNT(*) AS n FROM plays", 1298),
            q("SELECT COUNT(*) AS n FROM plays WHERE created_at >= '2024-05-01 12:00:00' - INTERVAL '1:30' HOUR_MINUTE"),
            q("SELECT track_id, COUNT(*) AS n FROM plays WHERE created_at BETWEEN '2024-05-02 00:00:00' - INTERVAL '1 2' DAY_HOUR \
               AND '2024-05-02 00:00:00' + INTERVAL '10:30' MINUTE_SECOND GROUP BY track_id ORDER BY track_id"),
            q("SELECT COUNT(*) AS n FROM plays WHERE created_at >= NOW() - INTERVAL '2000 0' DAY_HOUR"),
            q("SELECT COUNT(*), SUM(user_id) INTO @a, @b FROM plays WHERE track_id = 1"),
            q("SELECT COUNT(*), SUM(user_id) FROM plays WHERE track_id = 6 INTO @c, @d"),
            q("SELECT @a, @b, @c, @d"),
            qerr("SELECT COUNT(*) FROM plays INTO @e, @f", 1222),
            q(format!(
                "SELECT track_id, country FROM plays WHERE track_id IS NOT NULL ORDER BY id INTO OUTFILE '{}'",
                out(label, "outfile")
            )),
            q(format!(
                "SELECT COUNT(*) FROM plays INTO DUMPFILE '{}'",
                out(label, "dumpfile")
            )),
            step(Act::Prepare(
                "interval",
                "SELECT COUNT(*) AS n FROM plays WHERE created_at >= ? - INTERVAL '1:30' HOUR_MINUTE".into(),
            )),
            step(Act::Execute(
                "interval",
                vec![RawParam::str("2024-05-01 12:00:00")],
            )),
            step(Act::Prepare(
                "set_statement",
                "SET STATEMENT time_zone = '+10:00' FOR SELECT track_id, COUNT(*) AS n FROM plays \
                 WHERE created_at >= ? GROUP BY track_id ORDER BY track_id"
                    .into(),
            )),
            step(Act::Execute(
                "set_statement",
                vec![RawParam::str("2024-05-01 10:30:00")],
            )),
            step(Act::Prepare(
                "into",
                "SELECT COUNT(*), SUM(user_id) FROM plays WHERE track_id = ? INTO @g, @h".into(),
            )),
            step(Act::Execute("into", vec![RawParam::Int(6)])),
            q("SELECT @g, @h"),
            step(Act::Prepare(
                "load",
                "LOAD DATA LOCAL INFILE 'plays.tsv' INTO TABLE plays (created_at, track_id)".into(),
            )),
            step(Act::ExecuteInfile(
                "load",
                b"2024-05-05 10:00:00\t8\n2024-05-05 11:00:00\t9\n".to_vec(),
            )),
            q("SELECT id, created_at, track_id, user_id, referer, country FROM plays ORDER BY id"),
        ]);
        s
    };
    let fallbacks_before = outcome(metrics, "plays_hourly", "fallback");
    let rewritten = || {
        outcome(metrics, "plays_hourly", "rewritten") + outcome(metrics, "plays_daily", "rewritten")
    };
    let rewritten_before = rewritten();
    same_as_direct(
        db,
        &|| {
            fresh_db(db, PLAYS);
            migrate_apply(db, &rollup_rules());
        },
        &steps,
        &proxy,
    );
    assert_rollups_exact(db);
    for name in ["outfile", "dumpfile"] {
        let (d, p) = (out("d", name), out("p", name));
        let direct = std::fs::read(&d).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!(std::fs::read(&p).unwrap_or_default(), direct, "{name}");
    }
    // LOAD DATA, INTO and the SET STATEMENTs the rule cannot carry ran as sent, each
    // counted as a fallback of the rule asked first.
    let fallbacks = outcome(metrics, "plays_hourly", "fallback") - fallbacks_before;
    assert!(fallbacks >= 9.0, "fallbacks counted: {fallbacks}");
    // The reads, the SET STATEMENTs of time_zone and div_precision_increment (text
    // and prepared), the prefixed insert and the reads with compound interval units
    // (text, and prepared with a parameter as the bound) were rewritten.
    let rewrites = rewritten() - rewritten_before;
    eprintln!("fallbacks {fallbacks}, rewrites {rewrites}");
    assert!(rewrites >= 9.0, "rewrites counted: {rewrites}");
}

#[test]
fn long_data_of_prepared_log_inserts_is_the_servers() {
    let db = "gaps_long_data";
    let (proxy, metrics, _rules) = proxy_with(&rollup_rules());
    let insert = "INSERT INTO plays (created_at, track_id, user_id, country, referer) VALUES (?, ?, ?, ?, ?)";
    let blob = |v: Option<&str>| match v {
        // A parameter sent as long data has no value in the execute.
        None => RawParam::Typed {
            ty: types::BLOB,
            unsigned: false,
            value: Vec::new(),
        },
        Some(s) => RawParam::str(s),
    };
    let row = |t: &str, track: i64, referer: Option<&str>| {
        vec![
            RawParam::str(t),
            RawParam::Int(track),
            RawParam::Int(7),
            RawParam::str("US"),
            blob(referer),
        ]
    };
    let big = "x".repeat(60_000);
    let steps = |_: &str| {
        vec![
            step(Act::Prepare("ins", insert.into())),
            step(Act::Execute("ins", row("2024-05-03 10:00:00", 1, Some("inline")))),
            step(Act::LongData("ins", 4, b"long ".to_vec())),
            step(Act::LongData("ins", 4, b"data".to_vec())),
            step(Act::Execute("ins", row("2024-05-03 11:00:00", 2, None))),
            // Used once: the next execute sends its value again.
            step(Act::Execute("ins", row("2024-05-03 12:00:00", 3, Some("again")))),
            // Long data of a parameter the execute also sends: the long data wins.
            step(Act::LongData("ins", 3, b"SE".to_vec())),
            step(Act::Execute("ins", row("2024-05-03 12:30:00", 3, None))),
            // COM_STMT_RESET drops it.
            step(Act::LongData("ins", 4, b"dropped".to_vec())),
            step(Act::Reset("ins")),
            step(Act::Execute("ins", row("2024-05-03 13:00:00", 4, Some("after reset")))),
            // Types bound by an earlier execute only.
            step(Act::LongData("ins", 4, big.as_bytes().to_vec())),
            step(Act::ExecuteUnbound("ins", row("2024-05-04 09:00:00", 5, None))),
            q("SELECT id, created_at, track_id, user_id, country, LENGTH(referer), LEFT(referer, 12) FROM plays ORDER BY id"),
            q("SELECT track_id, COUNT(*) AS n FROM plays GROUP BY track_id ORDER BY track_id"),
        ]
    };
    let before = outcome(metrics, "plays_hourly", "fallback");
    let proxied = same_as_direct(
        db,
        &|| {
            fresh_db(db, PLAYS);
            migrate_apply(db, &rollup_rules());
        },
        &steps,
        &proxy,
    );
    let rows = text_rows(&proxied[13]);
    assert!(
        rows.iter().any(|r| r[6].as_deref() == Some("long data")),
        "{rows:?}"
    );
    assert_rollups_exact(db);
    assert_eq!(
        outcome(metrics, "plays_hourly", "fallback") - before,
        3.0,
        "each execute with long data ran the client's own statement"
    );
}

// ---------------------------------------------------------------------------------------
// Partition and timeline

fn partition_schema() -> &'static str {
    "CREATE TABLE Messages (ID BIGINT AUTO_INCREMENT PRIMARY KEY, UUID VARCHAR(40) NOT NULL, \
       Message JSON NOT NULL, Inserted DATE NOT NULL, UNIQUE KEY u (UUID));"
}

#[test]
fn partition_tables_take_what_the_parser_cannot_read_as_mariadb_does() {
    let db = "gaps_partition";
    let rule = Rule::partition("messages_by_day", "Messages").toml();
    let (proxy, _metrics, _rules) = proxy_with(&rule);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = now - now % 86_400 + 3_600;
    let day = utc_date(t);
    let key = |n: u32| format!("m{n}-{t}-x");
    let tsv = format!("{}\t{{\"n\": 1}}\t{day}\n{}\t{{}}\t{day}\n", key(1), key(2));
    let bad = format!("{}\t{{}}\t2001-01-01\n", key(3));
    let steps = |_: &str| {
        vec![
            step(Act::Infile(
                "LOAD DATA LOCAL INFILE 'm.tsv' INTO TABLE Messages (UUID, Message, Inserted)".into(),
                tsv.clone().into_bytes(),
            )),
            // The table's trigger refuses a row whose key and date disagree.
            Step {
                act: Act::Infile(
                    "LOAD DATA LOCAL INFILE 'm.tsv' INTO TABLE Messages (UUID, Message, Inserted)"
                        .into(),
                    bad.clone().into_bytes(),
                ),
                expect: Expect::Err(1105),
            },
            q(format!(
                "SET STATEMENT time_zone = '+10:00' FOR SELECT ID, Message FROM Messages WHERE UUID = '{}'",
                key(1)
            )),
            q(format!(
                "SET STATEMENT sql_mode = '' FOR SELECT ID, Message FROM Messages WHERE UUID = '{}'",
                key(2)
            )),
            q(format!(
                "SELECT COUNT(*) FROM Messages WHERE UUID = '{}' AND Inserted >= '{day}' - INTERVAL '1 12' DAY_HOUR",
                key(1)
            )),
            q(format!(
                "SELECT ID, Inserted INTO @id, @day FROM Messages WHERE UUID = '{}'",
                key(2)
            )),
            q(format!(
                "SELECT ID FROM Messages WHERE UUID = '{}' INTO @id2",
                key(1)
            )),
            q("SELECT @id, @day, @id2"),
            step(Act::Prepare(
                "lookup",
                "SET STATEMENT time_zone = '+10:00' FOR SELECT ID, Message FROM Messages WHERE UUID = ?".into(),
            )),
            step(Act::Execute("lookup", vec![RawParam::str(&key(1))])),
            step(Act::Prepare(
                "interval",
                "SELECT COUNT(*) AS n FROM Messages WHERE UUID = ? AND Inserted >= ? - INTERVAL '1 12' DAY_HOUR".into(),
            )),
            step(Act::Execute(
                "interval",
                vec![RawParam::str(&key(2)), RawParam::str(&day)],
            )),
            q("SELECT ID, UUID, Message, Inserted FROM Messages ORDER BY ID"),
        ]
    };
    same_as_direct(
        db,
        &|| {
            fresh_db(db, partition_schema());
            migrate_apply(db, &rule);
        },
        &steps,
        &proxy,
    );
}

const TIMELINE: &str = "CREATE TABLE follower (user_id INT UNSIGNED NOT NULL, follower_id INT UNSIGNED NOT NULL, \
     PRIMARY KEY (user_id, follower_id), KEY (follower_id)); \
     CREATE TABLE message (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, user_id INT UNSIGNED NOT NULL, \
     body VARCHAR(255) NOT NULL, KEY user_id_id (user_id, id));";

#[test]
fn timeline_tables_take_what_the_parser_cannot_read_as_mariadb_does() {
    let db = "gaps_timeline";
    let rule = Rule::timeline("friends").toml();
    let (proxy, _metrics, _rules) = proxy_with(&rule);
    let read = "SELECT m.id, m.user_id, m.body FROM message m JOIN follower f ON m.user_id = f.follower_id \
                WHERE f.user_id = 1 ORDER BY m.id DESC LIMIT 3";
    let steps = |_: &str| {
        vec![
            step(Act::Infile(
                "LOAD DATA LOCAL INFILE 'f.tsv' INTO TABLE follower".into(),
                b"1\t2\n1\t3\n2\t3\n".to_vec(),
            )),
            step(Act::Infile(
                "LOAD DATA LOCAL INFILE 'm.tsv' INTO TABLE message (user_id, body)".into(),
                b"2\thello\n3\tworld\n3\tagain\n4\tnobody follows\n2\tlast\n".to_vec(),
            )),
            q(read),
            q(format!("SET STATEMENT time_zone = '+10:00' FOR {read}")),
            q(format!("SET STATEMENT sql_mode = '' FOR {read}")),
            step(Act::Prepare(
                "read",
                format!(
                    "SET STATEMENT time_zone = '+10:00' FOR {}",
                    read.replace("f.user_id = 1", "f.user_id = ?")
                ),
            )),
            step(Act::Execute("read", vec![RawParam::Int(1)])),
            q("SELECT COUNT(*) FROM message WHERE user_id = 3 INTO @n"),
            q("SELECT @n"),
            q("SELECT id, user_id, body FROM message ORDER BY id"),
        ]
    };
    same_as_direct(
        db,
        &|| {
            fresh_db(db, TIMELINE);
            migrate_apply(db, &rule);
        },
        &steps,
        &proxy,
    );
}

// ---------------------------------------------------------------------------------------
// Counter and ring: refused, nothing changes

/// Every row of the tables, as root.
fn snapshot(db: &str, tables: &[&str]) -> Vec<Groups> {
    tables
        .iter()
        .map(|t| sorted(mariadb().query_strings(&format!("SELECT * FROM {db}.{t}"))))
        .collect()
}

/// The ERR code of the last packet, if it is an ERR.
fn err_code(packets: &[Packet]) -> Option<u16> {
    packets.last().and_then(|p| p.err()).map(|e| e.code)
}

#[test]
fn counter_and_ring_tables_refuse_what_they_cannot_read() {
    let db = "gaps_counter_ring";
    let counter = Rule::counter("page_hits", "hits").slots(4).toml();
    let ring = Rule::ring("visits", "profile_visits")
        .key(&["uid"])
        .size(5)
        .ring_table("profile_visits_ring")
        .seq_table("profile_visits_seq")
        .order_by("last_update")
        .toml();
    let rules = format!("{counter}\n{ring}");
    fresh_db(
        db,
        "CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0); \
         INSERT INTO hits VALUES ('home', 10), ('about', 3); \
         CREATE TABLE profile_visits (id INT AUTO_INCREMENT PRIMARY KEY, uid INT NOT NULL, \
           visitor_uid INT NOT NULL, last_update DATETIME(6) NOT NULL, KEY(uid));",
    );
    migrate_apply(db, &rules);
    let (proxy, metrics, _rules) = proxy_with(&rules);
    let opts = ConnectOpts::new(USER, PASSWORD)
        .db(db)
        .caps(caps::DEFAULT)
        .deprecate_eof(true);
    let mut c = RawClient::connect(proxy.addr(), &opts).expect("connect");
    // Some state in the slot and ring tables.
    for sql in [
        "UPDATE hits SET cnt = cnt + 5 WHERE slug = 'home'",
        "INSERT INTO profile_visits (uid, visitor_uid, last_update) VALUES (1, 2, '2024-05-01 10:00:00')",
        "INSERT INTO profile_visits (uid, visitor_uid, last_update) VALUES (1, 3, '2024-05-01 11:00:00')",
    ] {
        let r = c.query(sql).expect("query");
        assert_eq!(err_code(&r), None, "{sql}: {r:?}");
    }
    let tables = [
        "hits",
        "hits_slots",
        "profile_visits",
        "profile_visits_ring",
        "profile_visits_seq",
    ];
    let before = snapshot(db, &tables);
    let rejected_before =
        outcome(metrics, "page_hits", "rejected") + outcome(metrics, "visits", "rejected");
    let refused: Vec<(&str, Option<&[u8]>)> = vec![
        ("LOAD DATA LOCAL INFILE 'h.tsv' INTO TABLE hits", Some(b"home\t99\n")),
        ("LOAD DATA LOCAL INFILE 'h.tsv' REPLACE INTO TABLE hits (slug, cnt)", Some(b"home\t99\n")),
        (
            "LOAD DATA LOCAL INFILE 'v.tsv' INTO TABLE profile_visits (uid, visitor_uid, last_update)",
            Some(b"1\t9\t2024-05-02 00:00:00\n"),
        ),
        ("SELECT cnt FROM hits WHERE slug = 'home' INTO @c", None),
        ("SELECT slug, cnt FROM hits INTO OUTFILE '/nonexistent/hits.txt'", None),
        ("SELECT COUNT(*) FROM profile_visits WHERE uid = 1 INTO @v", None),
        ("SET STATEMENT sql_mode = '' FOR UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'", None),
        (
            "SET STATEMENT max_statement_time = 10 FOR UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'",
            None,
        ),
    ];
    for (sql, infile) in &refused {
        if let Some(data) = infile {
            c.set_local_infile(data.to_vec());
        }
        let r = c.query(sql).expect("query");
        let e = r.last().and_then(|p| p.err());
        assert!(
            e.as_ref()
                .is_some_and(|e| e.code == 1105 && e.message.contains("heatsink rule")),
            "{sql}: {r:?}"
        );
    }
    assert_eq!(
        snapshot(db, &tables),
        before,
        "a refused statement changed something"
    );
    let rejected = outcome(metrics, "page_hits", "rejected")
        + outcome(metrics, "visits", "rejected")
        - rejected_before;
    assert_eq!(rejected, refused.len() as f64);

    // Compound interval units are read: the same answers as with plain units.
    for (compound, plain) in [
        (
            "SELECT COUNT(*) AS n FROM profile_visits WHERE uid = 1 AND last_update >= '2024-05-01 12:00:00' - INTERVAL '1:30' HOUR_MINUTE",
            "SELECT COUNT(*) AS n FROM profile_visits WHERE uid = 1 AND last_update >= '2024-05-01 12:00:00' - INTERVAL 90 MINUTE",
        ),
        (
            "SELECT slug, cnt, '2024-05-01' + INTERVAL '1 2' DAY_HOUR AS t FROM hits ORDER BY slug",
            "SELECT slug, cnt, '2024-05-01' + INTERVAL 26 HOUR AS t FROM hits ORDER BY slug",
        ),
    ] {
        let a = c.query(compound).expect("query");
        let b = c.query(plain).expect("query");
        assert_eq!(err_code(&a), None, "{compound}: {a:?}");
        assert_eq!(a, b, "{compound}");
    }

    // Long data on a rewritten increment: refused at its execute, nothing runs, and
    // the next execute without it runs as usual.
    let (id, prep) = c
        .prepare("UPDATE hits SET cnt = cnt + ? WHERE slug = ?")
        .expect("prepare");
    assert!(prep[0].header() == 0, "{prep:?}");
    c.send_long_data(id, 1, b"home").expect("long data");
    let r = c
        .execute(
            id,
            &[
                RawParam::Int(1),
                RawParam::Typed {
                    ty: types::BLOB,
                    unsigned: false,
                    value: Vec::new(),
                },
            ],
        )
        .expect("execute");
    assert_eq!(err_code(&r), Some(1105), "{r:?}");
    assert_eq!(
        snapshot(db, &tables),
        before,
        "a refused execute changed something"
    );
    let r = c
        .execute(id, &[RawParam::Int(1), RawParam::str("home")])
        .expect("execute");
    assert_eq!(err_code(&r), None, "{r:?}");
    assert_eq!(
        common::fixture::counter_value(db, "home"),
        Some(16),
        "the increment after the refused one"
    );

    // The same for a rewritten ring insert.
    let before = snapshot(db, &tables);
    let (id, prep) = c
        .prepare("INSERT INTO profile_visits (uid, visitor_uid, last_update) VALUES (?, ?, ?)")
        .expect("prepare");
    assert!(prep[0].header() == 0, "{prep:?}");
    c.send_long_data(id, 2, b"2024-05-03 00:00:00")
        .expect("long data");
    let r = c
        .execute(
            id,
            &[
                RawParam::Int(1),
                RawParam::Int(5),
                RawParam::Typed {
                    ty: types::BLOB,
                    unsigned: false,
                    value: Vec::new(),
                },
            ],
        )
        .expect("execute");
    assert_eq!(err_code(&r), Some(1105), "{r:?}");
    assert_eq!(
        snapshot(db, &tables),
        before,
        "a refused execute changed something"
    );

    // `SELECT … INTO @v FROM t`, which the parser reads, keeps its targets.
    let r = c
        .query("SELECT cnt, slug INTO @c, @s FROM hits WHERE slug = 'home'")
        .expect("query");
    assert_eq!(err_code(&r), None, "{r:?}");
    assert_eq!(
        text_rows(&c.query("SELECT @c, @s").expect("query")),
        vec![vec![Some("16".to_string()), Some("home".to_string())]]
    );

    // A SET STATEMENT of a variable every rewrite is exact under keeps the rewrite.
    let r = c
        .query("SET STATEMENT lock_wait_timeout = 5 FOR UPDATE hits SET cnt = cnt + 2 WHERE slug = 'about'")
        .expect("query");
    let ok = r
        .last()
        .and_then(|p| p.ok())
        .unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!(ok.affected_rows, 1);
    assert_eq!(common::fixture::counter_value(db, "about"), Some(5));
    let r = c
        .query(
            "SET STATEMENT time_zone = '+00:00' FOR INSERT INTO profile_visits (uid, visitor_uid, last_update) \
             VALUES (1, 4, '2024-05-01 12:00:00')",
        )
        .expect("query");
    assert_eq!(err_code(&r), None, "{r:?}");
    let r = c
        .query("SET STATEMENT time_zone = '+10:00' FOR SELECT visitor_uid FROM profile_visits WHERE uid = 1 ORDER BY last_update")
        .expect("query");
    assert_eq!(
        text_rows(&r),
        vec![
            vec![Some("2".to_string())],
            vec![Some("3".to_string())],
            vec![Some("4".to_string())],
        ]
    );
    let r = c
        .query("SET STATEMENT time_zone = '+10:00' FOR SELECT slug, cnt FROM hits ORDER BY slug")
        .expect("query");
    assert_eq!(
        text_rows(&r),
        vec![
            vec![Some("about".to_string()), Some("5".to_string())],
            vec![Some("home".to_string()), Some("16".to_string())],
        ]
    );
}
