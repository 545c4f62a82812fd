//! Passthrough fidelity: the same scripted session runs directly against MariaDB and
//! through heatsink (empty rules directory); every response packet must be byte-identical.
//!
//! Each script runs twice per side: with CLIENT_DEPRECATE_EOF on and off. Before each
//! run the script's database is dropped and recreated, so both sides see the same
//! schema names, AUTO_INCREMENT values and statement ids. The greeting is compared
//! separately (connection id and scramble differ per connection; the proxy may clear a
//! few capability bits).
//!
//! Set `HEATSINK_FIDELITY_TARGET=direct` to compare MariaDB against itself (checks that
//! the scripts are deterministic, independently of the proxy), and
//! `HEATSINK_FIDELITY_DUMP=1` (with `--nocapture`) to print every direct response.

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use common::fixture::fresh_db;
use common::packets::{describe, hex_dump, Packet};
use common::rawclient::{caps, cmd, types, ConnectError, ConnectOpts, RawClient, RawParam};
use common::{mariadb, Proxy, PASSWORD, USER};

/// One client action of a script.
#[derive(Clone, Debug)]
enum Action {
    /// COM_QUERY.
    Query(&'static str),
    /// COM_QUERY for LOAD DATA LOCAL INFILE, answered with these bytes.
    Infile(&'static str, &'static [u8]),
    /// COM_STMT_PREPARE, the statement id remembered under a name.
    Prepare(&'static str, &'static str),
    /// COM_STMT_EXECUTE with types bound.
    Execute(&'static str, Vec<RawParam>),
    /// COM_STMT_EXECUTE with new-params-bound = 0 (types from the previous execute).
    ExecuteUnbound(&'static str, Vec<RawParam>),
    /// COM_STMT_EXECUTE opening a read-only cursor (flags = 1).
    ExecuteCursor(&'static str, Vec<RawParam>),
    /// COM_STMT_FETCH of this many rows.
    Fetch(&'static str, u32),
    /// COM_STMT_SEND_LONG_DATA (no response).
    LongData(&'static str, u16, &'static [u8]),
    /// COM_STMT_RESET.
    ResetStmt(&'static str),
    /// COM_STMT_CLOSE (no response).
    CloseStmt(&'static str),
    /// COM_PING.
    Ping,
    /// COM_INIT_DB.
    InitDb(&'static str),
    /// COM_FIELD_LIST.
    FieldList(&'static str, &'static str),
    /// COM_RESET_CONNECTION.
    ResetConnection,
    /// COM_CHANGE_USER (user, password, database).
    ChangeUser(&'static str, &'static str, Option<&'static str>),
    /// Any command payload.
    Raw(Vec<u8>),
}

/// What the direct run must show, so a typo in a script cannot silently shrink coverage.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// No ERR packet in the response.
    Success,
    /// The response ends with ERR carrying this code.
    Error(u16),
    /// Anything (commands without a response).
    Any,
}

#[derive(Clone, Debug)]
struct Step {
    action: Action,
    expect: Expect,
}

fn ok(action: Action) -> Step {
    Step {
        action,
        expect: Expect::Success,
    }
}

fn q(sql: &'static str) -> Step {
    ok(Action::Query(sql))
}

fn qerr(sql: &'static str, code: u16) -> Step {
    err(Action::Query(sql), code)
}

fn err(action: Action, code: u16) -> Step {
    Step {
        action,
        expect: Expect::Error(code),
    }
}

fn any(action: Action) -> Step {
    Step {
        action,
        expect: Expect::Any,
    }
}

fn prep(name: &'static str, sql: &'static str) -> Step {
    ok(Action::Prepare(name, sql))
}

fn exec(name: &'static str, params: Vec<RawParam>) -> Step {
    ok(Action::Execute(name, params))
}

/// Everything one run observed.
struct Transcript {
    handshake: Vec<Packet>,
    /// Per step: the response packets, or the I/O error that ended the run.
    steps: Vec<Result<Vec<Packet>, String>>,
}

/// Runs `steps` on a fresh connection to `addr` with database `db` (recreated first).
fn run_script(addr: SocketAddr, db: &str, opts: &ConnectOpts, steps: &[Step]) -> Transcript {
    fresh_db(db, "");
    let deprecate_eof = opts.caps & caps::DEPRECATE_EOF != 0;
    let mut c = RawClient::connect(addr, opts)
        .unwrap_or_else(|e| panic!("connect to {addr} (deprecate_eof={deprecate_eof}): {e}"));
    let mut stmts: HashMap<&str, u32> = HashMap::new();
    let mut out = Vec::new();
    for step in steps {
        let id = |name: &str| *stmts.get(name).unwrap_or(&0);
        let result = match &step.action {
            Action::Query(sql) => c.query(sql),
            Action::Infile(sql, data) => {
                c.set_local_infile(data.to_vec());
                c.query(sql)
            }
            Action::Prepare(name, sql) => c.prepare(sql).map(|(sid, packets)| {
                stmts.insert(name, sid);
                packets
            }),
            Action::Execute(name, params) => c.execute(id(name), params),
            Action::ExecuteUnbound(name, params) => c.execute_with(id(name), params, false, 0),
            Action::ExecuteCursor(name, params) => c.execute_with(id(name), params, true, 1),
            Action::Fetch(name, rows) => {
                let mut p = vec![cmd::STMT_FETCH];
                p.extend_from_slice(&id(name).to_le_bytes());
                p.extend_from_slice(&rows.to_le_bytes());
                c.command(&p)
            }
            Action::LongData(name, param, data) => c
                .send_long_data(id(name), *param, data)
                .map(|()| Vec::new()),
            Action::ResetStmt(name) => c.reset_stmt(id(name)),
            Action::CloseStmt(name) => c.close_stmt(id(name)).map(|()| Vec::new()),
            Action::Ping => c.ping(),
            Action::InitDb(db) => c.init_db(db),
            Action::FieldList(table, wild) => c.field_list(table, wild),
            Action::ResetConnection => c.reset_connection(),
            Action::ChangeUser(user, pw, db) => c.change_user(user, pw, *db),
            Action::Raw(bytes) => c.command(bytes),
        };
        match result {
            Ok(packets) => out.push(Ok(packets)),
            Err(e) => {
                out.push(Err(e.to_string()));
                break;
            }
        }
    }
    Transcript {
        handshake: c.handshake.clone(),
        steps: out,
    }
}

/// The side compared against MariaDB: the proxy, or MariaDB itself when
/// `HEATSINK_FIDELITY_TARGET=direct`.
enum Target {
    Proxy(Proxy),
    /// A proxy with a rule that merges writes (on a table the scripts never name):
    /// its sessions run with the server's session state tracking turned on for the
    /// proxy, which no client may see.
    /// (The rules directory lives as long as the proxy.)
    Tracking(Proxy, #[allow(dead_code)] tempfile::TempDir),
    Direct,
}

impl Target {
    fn start() -> Target {
        match std::env::var("HEATSINK_FIDELITY_TARGET").as_deref() {
            Ok("direct") => Target::Direct,
            _ => Target::Proxy(Proxy::start()),
        }
    }

    fn start_tracking() -> Target {
        let rules = tempfile::tempdir().expect("rules dir");
        std::fs::write(
            rules.path().join("counter.toml"),
            "[[counter]]\nname = \"merging\"\ntable = \"fid_unrelated_hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\"]\nslots = 4\nslot_table = \"fid_unrelated_slots\"\n",
        )
        .expect("rule file");
        let proxy = Proxy::builder().rules_dir(rules.path()).start();
        Target::Tracking(proxy, rules)
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Target::Proxy(p) | Target::Tracking(p, _) => p.addr(),
            Target::Direct => mariadb().addr(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Target::Proxy(_) => "proxy",
            Target::Tracking(..) => "proxy (merging rule, session state tracking on)",
            Target::Direct => "direct#2",
        }
    }

    fn log(&self) -> String {
        match self {
            Target::Proxy(p) | Target::Tracking(p, _) => p.log_text(),
            Target::Direct => String::new(),
        }
    }
}

/// Runs `steps` directly and through the target, with DEPRECATE_EOF on and off, and
/// panics with a readable report of every difference.
fn check_script(db: &str, steps: &[Step]) {
    check_script_with(db, steps, 0);
}

/// [`check_script`] with extra client capabilities (e.g. SESSION_TRACK).
fn check_script_with(db: &str, steps: &[Step], extra_caps: u32) {
    check_script_on(Target::start(), db, steps, extra_caps);
}

/// [`check_script_with`] against `target`.
fn check_script_on(target: Target, db: &str, steps: &[Step], extra_caps: u32) {
    let mut report = String::new();
    for deprecate_eof in [true, false] {
        let opts = ConnectOpts::new(USER, PASSWORD)
            .db(db)
            .caps(caps::DEFAULT | extra_caps)
            .deprecate_eof(deprecate_eof);
        let mut direct = run_script(mariadb().addr(), db, &opts, steps);
        check_expectations(&direct, steps, deprecate_eof);
        let mut other = run_script(target.addr(), db, &opts, steps);
        normalize(&mut direct, steps);
        normalize(&mut other, steps);
        if std::env::var_os("HEATSINK_FIDELITY_DUMP").is_some() {
            dump(db, deprecate_eof, &direct, steps);
        }
        diff_transcripts(
            &direct,
            &other,
            steps,
            deprecate_eof,
            target.name(),
            &mut report,
        );
    }
    if !report.is_empty() {
        panic!(
            "{db}: {} differs from direct MariaDB\n{report}\n--- {} log ---\n{}",
            target.name(),
            target.name(),
            target.log()
        );
    }
}

/// Replaces what legitimately differs between two runs of the same script:
/// - statement ids (MariaDB numbers prepared statements server-wide): in COM_STMT_PREPARE
///   OK packets and in "Unknown prepared statement handler (N)" messages they become the
///   statement's ordinal in the run;
/// - the scramble of an auth switch request (fresh per COM_CHANGE_USER).
fn normalize(t: &mut Transcript, steps: &[Step]) {
    let mut ids: Vec<u32> = Vec::new();
    for (step, result) in steps.iter().zip(t.steps.iter_mut()) {
        let Ok(packets) = result else { break };
        match step.action {
            Action::Prepare(..) => {
                if let Some(first) = packets.first_mut() {
                    if first.header() == 0x00 && first.payload.len() >= 9 {
                        let id = u32::from_le_bytes(first.payload[1..5].try_into().unwrap());
                        ids.push(id);
                        let ordinal = ids.len() as u32;
                        first.payload[1..5].copy_from_slice(&ordinal.to_le_bytes());
                    }
                }
            }
            Action::ChangeUser(..) => {
                for p in packets.iter_mut().filter(|p| p.header() == 0xFE) {
                    if let Some(nul) = p.payload.iter().position(|&b| b == 0) {
                        p.payload[nul + 1..].fill(0);
                    }
                }
            }
            _ => {}
        }
        for p in packets.iter_mut() {
            if p.err().map(|e| e.code) == Some(1243) {
                for (i, id) in ids.iter().enumerate() {
                    let needle = format!("({id})");
                    let replacement = format!("(stmt#{})", i + 1);
                    if let Some(pos) = find(&p.payload, needle.as_bytes()) {
                        p.payload
                            .splice(pos..pos + needle.len(), replacement.bytes());
                        break;
                    }
                }
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Prints the direct run's packets (set `HEATSINK_FIDELITY_DUMP=1`, run with
/// `--nocapture`).
fn dump(db: &str, deprecate_eof: bool, t: &Transcript, steps: &[Step]) {
    let mut out = format!("=== {db} deprecate_eof={deprecate_eof}\n");
    for (i, (step, result)) in steps.iter().zip(&t.steps).enumerate() {
        let _ = writeln!(out, "step {i}: {:?}", step.action);
        if let Ok(packets) = result {
            for p in packets {
                let _ = writeln!(out, "    {p:?}");
            }
        }
    }
    println!("{out}");
}

/// Validates the script itself against the direct run.
fn check_expectations(t: &Transcript, steps: &[Step], deprecate_eof: bool) {
    for (i, (step, result)) in steps.iter().zip(&t.steps).enumerate() {
        let packets = match result {
            Ok(p) => p,
            Err(e) => panic!("script step {i} {:?}: direct I/O error {e}", step.action),
        };
        let errs: Vec<_> = packets.iter().filter_map(|p| p.err()).collect();
        let fine = match step.expect {
            Expect::Any => true,
            Expect::Success => errs.is_empty(),
            Expect::Error(code) => {
                packets.last().and_then(|p| p.err()).map(|e| e.code) == Some(code)
            }
        };
        assert!(
            fine,
            "script step {i} {:?} (deprecate_eof={deprecate_eof}): expected {:?}, direct MariaDB \
             answered {packets:#?}",
            step.action, step.expect
        );
    }
    assert_eq!(
        t.steps.len(),
        steps.len(),
        "direct run stopped early (deprecate_eof={deprecate_eof})"
    );
}

fn diff_transcripts(
    a: &Transcript,
    b: &Transcript,
    steps: &[Step],
    deprecate_eof: bool,
    b_name: &str,
    report: &mut String,
) {
    let mode = if deprecate_eof {
        "DEPRECATE_EOF on"
    } else {
        "DEPRECATE_EOF off"
    };
    if let Some(d) = diff_packets(&a.handshake, &b.handshake, b_name) {
        let _ = writeln!(
            report,
            "[{mode}] handshake (after HandshakeResponse41):\n{d}"
        );
    }
    for (i, step) in steps.iter().enumerate() {
        let (ra, rb) = match (a.steps.get(i), b.steps.get(i)) {
            (Some(ra), Some(rb)) => (ra, rb),
            (Some(_), None) => {
                let _ = writeln!(report, "[{mode}] step {i}: {b_name} run ended before it");
                break;
            }
            _ => break,
        };
        let d = match (ra, rb) {
            (Ok(pa), Ok(pb)) => diff_packets(pa, pb, b_name),
            (Ok(pa), Err(e)) => Some(format!(
                "  direct: {} packets, last {:?}\n  {b_name}: I/O error: {e}\n",
                pa.len(),
                pa.last()
            )),
            (Err(e), _) => Some(format!("  direct: I/O error {e}\n")),
        };
        if let Some(d) = d {
            let _ = writeln!(report, "[{mode}] step {i}: {:?}\n{d}", step.action);
        }
    }
}

/// `None` if equal; else a description of the first differing packet (hex of both).
fn diff_packets(a: &[Packet], b: &[Packet], b_name: &str) -> Option<String> {
    if a == b {
        return None;
    }
    let mut s = format!(
        "  direct: {} packets, {b_name}: {} packets\n",
        a.len(),
        b.len()
    );
    let first = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap_or(0);
    let _ = writeln!(s, "  first difference at packet {first}:");
    for (name, side) in [("direct", a), (b_name, b)] {
        match side.get(first) {
            Some(p) => {
                let _ = writeln!(s, "  {name}: seq {} {}", p.seq, describe(&p.payload));
                for line in hex_dump(&p.payload).lines().take(16) {
                    let _ = writeln!(s, "      {line}");
                }
            }
            None => {
                let _ = writeln!(s, "  {name}: (no packet)");
            }
        }
    }
    Some(s)
}

// ---------------------------------------------------------------------------------------
// Greeting

/// Capability bits the proxy may clear in the greeting.
const CLEARABLE_CAPS: u32 = caps::COMPRESS | caps::SSL | caps::QUERY_ATTRIBUTES;

#[test]
fn greeting_is_relayed() {
    let target = Target::start();
    let opts = ConnectOpts::new(USER, PASSWORD);
    let direct = RawClient::connect(mariadb().addr(), &opts).expect("direct connect");
    let proxied = RawClient::connect(target.addr(), &opts).expect("proxied connect");
    let (d, p) = (&direct.greeting, &proxied.greeting);
    assert_eq!(
        d.normalized_without_caps(),
        p.normalized_without_caps(),
        "greeting differs beyond connection id, scramble and capabilities\ndirect:\n{}\n{}:\n{}",
        hex_dump(&d.raw),
        target.name(),
        hex_dump(&p.raw)
    );
    assert_eq!(
        p.capabilities & !d.capabilities,
        0,
        "proxy added capabilities"
    );
    let cleared = d.capabilities & !p.capabilities;
    assert_eq!(
        cleared & !CLEARABLE_CAPS,
        0,
        "proxy cleared capabilities it must relay: 0x{:08x}",
        cleared & !CLEARABLE_CAPS
    );
    assert_eq!(
        p.mariadb_capabilities & !d.mariadb_capabilities,
        0,
        "proxy added MariaDB extended capabilities"
    );
    assert_eq!(p.scramble.len(), 20, "scramble length");
    assert_ne!(p.connection_id, 0, "connection id");
    assert_eq!(direct.handshake, proxied.handshake, "auth OK packet");
}

// ---------------------------------------------------------------------------------------
// Column types, text and binary protocol

const CREATE_ALL_TYPES: &str = "CREATE TABLE all_types (
    id INT NOT NULL PRIMARY KEY,
    t_tiny TINYINT, t_tiny_u TINYINT UNSIGNED, t_bool BOOL,
    t_small SMALLINT, t_small_u SMALLINT UNSIGNED,
    t_medium MEDIUMINT, t_medium_u MEDIUMINT UNSIGNED,
    t_int INT, t_int_u INT UNSIGNED, t_int_zf INT(6) ZEROFILL,
    t_big BIGINT, t_big_u BIGINT UNSIGNED,
    t_dec DECIMAL(12,4), t_dec_u DECIMAL(5,0) UNSIGNED,
    t_float FLOAT, t_double DOUBLE,
    t_bit BIT(10), t_bit1 BIT(1),
    t_date DATE, t_datetime DATETIME, t_datetime6 DATETIME(6), t_time TIME, t_time2 TIME(2),
    t_ts TIMESTAMP NULL DEFAULT NULL, t_ts3 TIMESTAMP(3) NULL DEFAULT NULL, t_year YEAR,
    t_char_u CHAR(10) CHARACTER SET utf8mb4, t_varchar_u VARCHAR(64) CHARACTER SET utf8mb4,
    t_char_l CHAR(10) CHARACTER SET latin1, t_varchar_l VARCHAR(64) CHARACTER SET latin1,
    t_varchar_bin VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    t_binary BINARY(4), t_varbinary VARBINARY(16),
    t_tinyblob TINYBLOB, t_blob BLOB, t_mediumblob MEDIUMBLOB, t_longblob LONGBLOB,
    t_tinytext TINYTEXT, t_text TEXT, t_mediumtext MEDIUMTEXT, t_longtext LONGTEXT,
    t_enum ENUM('small','medium','large'), t_set SET('red','green','blue'),
    t_json JSON, t_inet6 INET6, t_uuid UUID, t_point POINT, t_geom GEOMETRY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

const INSERT_ALL_TYPES: &str = "INSERT INTO all_types VALUES
 (1, 42, 200, TRUE, -1234, 60000, -70000, 16000000, -2000000000, 4000000000, 42,
  -9000000000000000000, 18000000000000000000, 12345678.1234, 99999, 3.25, -2.5e-300,
  b'1010101010', b'1', '2024-02-29', '2024-02-29 13:14:15', '2024-02-29 13:14:15.123456',
  '13:14:15', '-12:34:56.78', '2024-02-29 13:14:15', '2024-02-29 13:14:15.125', 2024,
  'héllo', 'ünïcödé ✓ 😀', 'café', 'latin-1 text', 'CaseSens',
  X'00010203', X'DEADBEEF00', X'00FF', 'blob bytes', 'medium', 'long',
  'tiny text', 'text with ''quotes'' and \\\\ backslash', 'medium text', 'long text',
  'medium', 'red,blue', '{\"k\": [1, 2.5, \"s\", null, true]}', '2001:db8::1',
  '123e4567-e89b-12d3-a456-426614174000', ST_GeomFromText('POINT(1 2)'),
  ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)')),
 (2, -128, 0, FALSE, -32768, 0, -8388608, 0, -2147483648, 0, 0,
  -9223372036854775808, 0, -99999999.9999, 0, -3.4e38, -1.7976931348623157e308,
  b'0', b'0', '0000-00-00', '0000-00-00 00:00:00', '1000-01-01 00:00:00.000001',
  '-838:59:59', '-00:00:00.01', '1970-01-01 00:00:01', '1970-01-01 00:00:01.001', 1901,
  '', '', '', '', '', X'00000000', X'', X'', X'', X'', X'', '', '', '', '',
  'small', '', '[]', '::', '00000000-0000-0000-0000-000000000000', ST_GeomFromText('POINT(0 0)'),
  ST_GeomFromText('POINT(-1 -1)')),
 (3, 127, 255, 1, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 999999,
  9223372036854775807, 18446744073709551615, 99999999.9999, 99999, 3.4e38, 1.7976931348623157e308,
  b'1111111111', b'1', '9999-12-31', '9999-12-31 23:59:59', '9999-12-31 23:59:59.999999',
  '838:59:59', '838:59:58.99', '2038-01-19 03:14:07', '2038-01-19 03:14:07.999', 2155,
  'zzzzzzzzzz', REPEAT('x', 64), 'zzzzzzzzzz', REPEAT('y', 64), REPEAT('b', 16),
  X'FFFFFFFF', X'FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF', REPEAT('t', 255), REPEAT('b', 1000),
  REPEAT('m', 70000), REPEAT('l', 300000), REPEAT('u', 255), REPEAT('v', 1000),
  REPEAT('w', 70000), REPEAT('z', 300000), 'large', 'red,green,blue',
  '{\"nested\": {\"a\": {\"b\": [1, [2, [3]]]}}}', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
  'ffffffff-ffff-ffff-ffff-ffffffffffff', ST_GeomFromText('POINT(1e300 -1e-300)'),
  ST_GeomFromText('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))'))";

/// DATETIME binary value: length 7, year, month, day, hour, minute, second.
fn datetime_param(y: u16, mo: u8, d: u8, h: u8, mi: u8, s: u8) -> RawParam {
    let mut v = vec![7];
    v.extend_from_slice(&y.to_le_bytes());
    v.extend_from_slice(&[mo, d, h, mi, s]);
    RawParam::Typed {
        ty: types::DATETIME,
        unsigned: false,
        value: v,
    }
}

/// TIME binary value: length 8, negative flag, days, hours, minutes, seconds.
fn time_param(negative: bool, days: u32, h: u8, mi: u8, s: u8) -> RawParam {
    let mut v = vec![8, negative as u8];
    v.extend_from_slice(&days.to_le_bytes());
    v.extend_from_slice(&[h, mi, s]);
    RawParam::Typed {
        ty: types::TIME,
        unsigned: false,
        value: v,
    }
}

fn column_type_steps() -> Vec<Step> {
    use RawParam::*;
    vec![
        q("SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'"),
        q(CREATE_ALL_TYPES),
        q(INSERT_ALL_TYPES),
        q("INSERT INTO all_types (id) VALUES (4)"),
        q("SELECT * FROM all_types ORDER BY id"),
        q("SELECT id, t_date, t_time2, t_bit, t_json FROM all_types WHERE id IN (2, 4) ORDER BY id"),
        q("SELECT 1, -1.5, 'text', NULL, X'00FF', 1e300, CAST('2024-01-02' AS DATE), \
           CAST(-1 AS UNSIGNED), _latin1 X'636166E9', CAST(1.5 AS DECIMAL(10,3)), \
           TIME'-01:02:03.5', NOW() - NOW(), JSON_OBJECT('k', 1)"),
        q("SELECT t_int + t_small AS sum_col, CONCAT(t_char_u, t_char_l) AS cat, \
           COUNT(*) OVER () AS total FROM all_types ORDER BY id"),
        // ERR after the column definitions were sent.
        qerr(
            "SELECT t_int + t_big AS sum_col FROM all_types ORDER BY id",
            1690,
        ),
        prep("all", "SELECT * FROM all_types ORDER BY id"),
        exec("all", vec![]),
        exec("all", vec![]),
        prep("by_id", "SELECT * FROM all_types WHERE id = ?"),
        exec("by_id", vec![Int(1)]),
        exec("by_id", vec![Int(2)]),
        ok(Action::ExecuteUnbound("by_id", vec![Int(3)])),
        exec("by_id", vec![RawParam::str("4")]),
        exec("by_id", vec![Null]),
        prep(
            "by_text",
            "SELECT id, t_varchar_u, t_char_l FROM all_types WHERE t_varchar_u = ? OR t_char_l = ?",
        ),
        exec(
            "by_text",
            vec![RawParam::str("ünïcödé ✓ 😀"), RawParam::str("café")],
        ),
        prep("params", "SELECT ?, ?, ?, ?, ?, ?"),
        exec(
            "params",
            vec![
                Null,
                Int(-7),
                UInt(u64::MAX),
                Double(2.5),
                RawParam::str("s"),
                Bytes(vec![0, 1, 255]),
            ],
        ),
        ok(Action::ExecuteUnbound(
            "params",
            vec![
                Null,
                Int(i64::MIN),
                UInt(0),
                Double(-0.0),
                RawParam::str(""),
                Bytes(vec![]),
            ],
        )),
        prep(
            "temporal",
            "SELECT ? + INTERVAL 1 DAY, ?, TIMEDIFF(?, '00:00:01'), ? = t_datetime FROM all_types \
             WHERE id = 1",
        ),
        exec(
            "temporal",
            vec![
                datetime_param(2024, 2, 28, 23, 59, 59),
                time_param(true, 1, 2, 3, 4),
                time_param(false, 0, 0, 0, 0),
                datetime_param(2024, 2, 29, 13, 14, 15),
            ],
        ),
        prep("expr", "SELECT id, t_dec * 2, t_float, t_year, t_enum FROM all_types WHERE id > ?"),
        exec("expr", vec![Int(0)]),
        prep("none", "SELECT * FROM all_types WHERE 1 = 0"),
        exec("none", vec![]),
    ]
}

#[test]
fn column_types_text_and_binary() {
    check_script("fid_types", &column_type_steps());
}

// ---------------------------------------------------------------------------------------
// OK packets, warnings, status flags

fn ok_packet_steps() -> Vec<Step> {
    use RawParam::*;
    vec![
        q("SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'"),
        q(
            "CREATE TABLE ai (id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(5), \
           n INT NOT NULL DEFAULT 0, UNIQUE KEY (name))",
        ),
        q("INSERT INTO ai (name, n) VALUES ('a', 1), ('b', 2), ('c', 3)"),
        q("INSERT INTO ai (name, n) VALUES ('much too long', 4)"),
        q("SHOW WARNINGS"),
        q("SELECT @@warning_count, @@error_count"),
        q("UPDATE ai SET n = n + 10 WHERE id <= 2"),
        q("UPDATE ai SET n = n WHERE id = 1"),
        q("UPDATE ai SET n = 0 WHERE id > 100"),
        q("DELETE FROM ai WHERE name = 'c'"),
        q("INSERT INTO ai (name, n) VALUES ('a', 100) ON DUPLICATE KEY UPDATE n = VALUES(n)"),
        q("INSERT INTO ai (name, n) VALUES ('a', 100) ON DUPLICATE KEY UPDATE n = VALUES(n)"),
        q("REPLACE INTO ai (id, name, n) VALUES (1, 'z', 5)"),
        q("INSERT IGNORE INTO ai (id, name) VALUES (1, 'dup')"),
        q("SHOW WARNINGS"),
        q("SELECT LAST_INSERT_ID(), ROW_COUNT()"),
        q("INSERT INTO ai (name) VALUES ('x')"),
        q("SELECT LAST_INSERT_ID()"),
        q("INSERT INTO ai (name, n) VALUES ('li', LAST_INSERT_ID(77))"),
        q("INSERT INTO ai (id, name) VALUES (1000, 'big')"),
        q("INSERT INTO ai (name) VALUES ('next')"),
        q("BEGIN"),
        q("INSERT INTO ai (name) VALUES ('t1')"),
        q("SELECT COUNT(*) FROM ai"),
        q("COMMIT"),
        q("SET autocommit = 0"),
        q("SELECT @@autocommit"),
        q("INSERT INTO ai (name) VALUES ('t2')"),
        q("ROLLBACK"),
        q("SELECT COUNT(*) FROM ai WHERE name = 't2'"),
        q("SET autocommit = 1"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT 1"),
        q("COMMIT"),
        q("START TRANSACTION WITH CONSISTENT SNAPSHOT"),
        q("ROLLBACK"),
        ok(Action::Infile(
            "LOAD DATA LOCAL INFILE 'rows.csv' INTO TABLE ai FIELDS TERMINATED BY ',' (name, n)",
            b"l1,1\nl2,2\nl3-too-long,3\n",
        )),
        ok(Action::Infile(
            "LOAD DATA LOCAL INFILE 'empty.csv' INTO TABLE ai (name, n)",
            b"",
        )),
        prep("ins", "INSERT INTO ai (name, n) VALUES (?, ?)"),
        exec("ins", vec![RawParam::str("p1"), Int(1)]),
        ok(Action::ExecuteUnbound(
            "ins",
            vec![RawParam::str("p2"), Int(2)],
        )),
        exec("ins", vec![RawParam::str("p3-too-long"), Int(3)]),
        err(
            Action::Execute("ins", vec![RawParam::str("p4"), Null]),
            1048,
        ),
        prep("upd", "UPDATE ai SET n = n + ? WHERE id < ?"),
        exec("upd", vec![Int(1), Int(3)]),
        exec("upd", vec![Int(0), Int(3)]),
        prep("sel", "SELECT * FROM ai ORDER BY id"),
        exec("sel", vec![]),
        q("SELECT * FROM ai ORDER BY id"),
        q("CREATE TABLE ai_copy SELECT * FROM ai"),
        q("ALTER TABLE ai ADD COLUMN extra INT"),
        q("INSERT INTO ai_copy SELECT * FROM ai_copy WHERE id < 3 ON DUPLICATE KEY UPDATE n = 1"),
        q("TRUNCATE TABLE ai_copy"),
        q("DROP TABLE ai_copy"),
        q("DROP TABLE IF EXISTS no_such_table_here"),
        q("SHOW WARNINGS"),
    ]
}

#[test]
fn ok_packets_warnings_and_status_flags() {
    check_script("fid_ok", &ok_packet_steps());
}

// ---------------------------------------------------------------------------------------
// Errors

fn error_steps() -> Vec<Step> {
    use RawParam::*;
    vec![
        q("SET SESSION sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"),
        q("CREATE TABLE uniq (id INT PRIMARY KEY, v INT, CONSTRAINT v_positive CHECK (v > 0))"),
        q("INSERT INTO uniq VALUES (1, 1), (2, 2)"),
        qerr("INSERT INTO uniq VALUES (1, 5)", 1062),
        qerr("SELECT * FROM no_such_table", 1146),
        qerr("INSERT INTO uniq VALUES (3, -5)", 4025),
        qerr(
            "SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = 31001, MESSAGE_TEXT = 'custom failure'",
            31001,
        ),
        q("SIGNAL SQLSTATE '01000' SET MESSAGE_TEXT = 'only a warning'"),
        q("SHOW WARNINGS"),
        qerr("SELEC 1", 1064),
        qerr("SELECT no_col FROM uniq", 1054),
        qerr("INSERT INTO uniq VALUES (4, 1/0)", 1365),
        qerr("INSERT INTO uniq (id, v) VALUES (5, 'abc')", 1366),
        q("CREATE PROCEDURE fail_proc() BEGIN \
           SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'from a procedure'; END"),
        qerr("CALL fail_proc()", 31002),
        qerr("CALL no_such_proc()", 1305),
        // Error after a result set in a multi-statement query.
        qerr("SELECT 1; SELECT * FROM no_such_table; SELECT 3", 1146),
        // Error in the middle of the rows of a result set.
        qerr(
            "SELECT id, IF(id > 1, (SELECT 1 UNION SELECT 2), 0) AS x FROM uniq ORDER BY id",
            1242,
        ),
        err(Action::Prepare("bad", "SELEC ?"), 1064),
        err(Action::Prepare("bad2", "SELECT * FROM no_such_table WHERE id = ?"), 1146),
        prep("ins", "INSERT INTO uniq VALUES (?, ?)"),
        err(Action::Execute("ins", vec![Int(1), Int(1)]), 1062),
        err(Action::Execute("ins", vec![Int(6), Int(-1)]), 4025),
        err(Action::Execute("ins", vec![Null, Int(1)]), 1048),
        exec("ins", vec![Int(6), Int(6)]),
        err(Action::Raw(vec![cmd::STMT_EXECUTE, 99, 0, 0, 0, 0, 1, 0, 0, 0]), 1243),
        err(Action::ResetStmt("bad"), 1243),
        prep("call_fail", "CALL fail_proc()"),
        err(Action::Execute("call_fail", vec![]), 31002),
        q("SELECT * FROM uniq ORDER BY id"),
        q("SELECT 'still usable'"),
    ]
}

#[test]
fn errors_keep_code_state_and_message() {
    check_script("fid_errors", &error_steps());
}

// ---------------------------------------------------------------------------------------
// Multi-statements, multiple result sets, stored procedures

fn multi_result_steps() -> Vec<Step> {
    use RawParam::*;
    vec![
        q("CREATE TABLE m (id INT PRIMARY KEY, v VARCHAR(10))"),
        q("INSERT INTO m VALUES (1, 'one'), (2, 'two')"),
        q("SELECT 1 AS a; SELECT 'x' AS b, 2 AS c"),
        q(
            "INSERT INTO m VALUES (3, 'three'); SELECT * FROM m ORDER BY id; \
           UPDATE m SET v = 'THREE' WHERE id = 3; DELETE FROM m WHERE id = 99",
        ),
        q("SELECT * FROM m WHERE 1 = 0"),
        q("SELECT * FROM m WHERE 1 = 0; SELECT 5; SET @x = 1"),
        q("CREATE PROCEDURE two_sets() BEGIN \
           SELECT id, v FROM m ORDER BY id; SELECT 'two' AS label, 2.5 AS num; END"),
        q("CALL two_sets()"),
        q(
            "CREATE PROCEDURE with_out(IN a INT, OUT b INT, INOUT c VARCHAR(20)) BEGIN \
           SET b = a * 2; SET c = CONCAT(c, '!'); SELECT a AS echo; END",
        ),
        q("SET @c = 'hi'; CALL with_out(21, @b, @c); SELECT @b, @c"),
        q("CREATE PROCEDURE no_sets() BEGIN UPDATE m SET v = v WHERE id = 1; END"),
        q("CALL no_sets()"),
        q("CREATE PROCEDURE empty_set() BEGIN SELECT * FROM m WHERE id < 0; END"),
        q("CALL empty_set(); CALL two_sets()"),
        q("BEGIN NOT ATOMIC SELECT 1 AS first; SELECT 2 AS second; END"),
        prep("call_two", "CALL two_sets()"),
        exec("call_two", vec![]),
        exec("call_two", vec![]),
        prep("call_out", "CALL with_out(?, ?, ?)"),
        exec("call_out", vec![Int(5), Null, RawParam::str("x")]),
        prep("call_empty", "CALL empty_set()"),
        exec("call_empty", vec![]),
        prep("call_none", "CALL no_sets()"),
        exec("call_none", vec![]),
        q("SELECT v FROM m ORDER BY id"),
        // A procedure's open cursor sets CURSOR_EXISTS in the EOF packets of its
        // ordinary result sets (text and binary protocol, cursor asked for or not);
        // their rows follow. A real cursor on a plain SELECT still ends after the
        // metadata.
        q("CREATE PROCEDURE open_cursor() BEGIN DECLARE lv INT; \
           DECLARE c CURSOR FOR SELECT id FROM m; OPEN c; FETCH c INTO lv; \
           SELECT 4 AS four, lv; SELECT v FROM m ORDER BY id; CLOSE c; SELECT 5; END"),
        q("CALL open_cursor()"),
        q("CALL open_cursor(); SELECT 6"),
        prep("call_cursor", "CALL open_cursor()"),
        exec("call_cursor", vec![]),
        ok(Action::ExecuteCursor("call_cursor", vec![])),
        exec("call_cursor", vec![]),
        prep(
            "plain_cursor",
            "SELECT id, v FROM m WHERE id > ? ORDER BY id",
        ),
        ok(Action::ExecuteCursor("plain_cursor", vec![Int(1)])),
        ok(Action::Fetch("plain_cursor", 10)),
        q("CALL open_cursor()"),
    ]
}

#[test]
fn multi_statements_and_procedures() {
    check_script("fid_multi", &multi_result_steps());
}

// ---------------------------------------------------------------------------------------
// Session state: user variables, temporary tables, locks, session variables, transactions

fn session_steps() -> Vec<Step> {
    vec![
        q("SET @a = 5, @b = 'str', @c = NULL, @d = 1.25"),
        q("SELECT @a, @b, @c, @d, @a + 1, @undefined"),
        q("SET SESSION sql_mode = 'ANSI_QUOTES'"),
        q("SELECT @@session.sql_mode, @@sql_mode, 1 AS \"quoted\""),
        q("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"),
        q("SELECT @@session.sql_mode"),
        q("SET SESSION time_zone = '+03:00'"),
        q("SELECT @@session.time_zone, FROM_UNIXTIME(0)"),
        q("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
        q("SELECT @@session.tx_isolation, @@session.autocommit, @@session.max_allowed_packet"),
        q("SET SESSION group_concat_max_len = 8"),
        q("SELECT GROUP_CONCAT('abcdefghij')"),
        q("SHOW WARNINGS"),
        q("CREATE TEMPORARY TABLE tmp (x INT PRIMARY KEY, y VARCHAR(10))"),
        q("INSERT INTO tmp VALUES (1, 'a'), (2, 'b')"),
        q("SELECT * FROM tmp ORDER BY x"),
        q("CREATE TABLE t (id INT PRIMARY KEY, v INT)"),
        q("INSERT INTO t VALUES (1, 10)"),
        q("BEGIN"),
        q("UPDATE t SET v = 20 WHERE id = 1"),
        q("INSERT INTO t VALUES (2, 30)"),
        q("SELECT * FROM t ORDER BY id"),
        q("ROLLBACK"),
        q("SELECT * FROM t ORDER BY id"),
        q("SELECT GET_LOCK('heatsink_fidelity_lock', 5)"),
        q("SELECT IS_FREE_LOCK('heatsink_fidelity_lock')"),
        q("SELECT RELEASE_LOCK('heatsink_fidelity_lock')"),
        q("SELECT RELEASE_LOCK('heatsink_fidelity_lock')"),
        q("SET NAMES latin1"),
        q("SELECT 'é' AS e, CHARSET('x'), @@session.character_set_results"),
        q("SET NAMES utf8mb4 COLLATE utf8mb4_unicode_ci"),
        q("SELECT 'é' AS e, @@session.collation_connection"),
        q("SELECT DATABASE(), CURRENT_USER(), USER()"),
        q("DROP TEMPORARY TABLE tmp"),
        qerr("SELECT * FROM tmp", 1146),
    ]
}

#[test]
fn session_state_is_per_connection() {
    check_script("fid_session", &session_steps());
}

/// With CLIENT_SESSION_TRACK, OK packets carry session-state-change data after the info
/// string (and the SESSION_STATE_CHANGED status flag).
#[test]
fn session_tracking_capability() {
    let mut steps = vec![
        q("SET SESSION session_track_state_change = ON"),
        q("SET SESSION session_track_transaction_info = 'CHARACTERISTICS'"),
        q("SET SESSION session_track_system_variables = '*'"),
    ];
    steps.extend(session_steps());
    steps.extend([
        q("START TRANSACTION READ ONLY"),
        q("SELECT 1"),
        q("COMMIT"),
        ok(Action::InitDb("heatsink_test")),
        q("USE fid_track"),
    ]);
    check_script_with("fid_track", &steps, caps::SESSION_TRACK);
}

/// The proxy's own session state tracking (on whenever a rule merges writes) is
/// invisible: the same transcripts, byte for byte, for clients without the capability
/// and for clients with it — with the server's defaults and with their own tracking
/// settings.
#[test]
fn the_proxys_own_tracking_is_invisible() {
    let mut steps = session_steps();
    steps.extend(ok_packet_steps());
    steps.extend([
        q("/*!40103 SET TIME_ZONE='+10:00' */"),
        q("SET @@session.sql_mode = 'ANSI_QUOTES'"),
        q("SET @v := 1"),
        q("CREATE TEMPORARY TABLE fid_tmp (a INT)"),
        q("DROP TEMPORARY TABLE fid_tmp"),
        ok(Action::InitDb("heatsink_test")),
        q("USE fid_track_own"),
    ]);
    check_script_on(Target::start_tracking(), "fid_track_own", &steps, 0);
    check_script_on(
        Target::start_tracking(),
        "fid_track_own",
        &steps,
        caps::SESSION_TRACK,
    );
    let mut own = vec![
        q("SET SESSION session_track_state_change = ON"),
        q("SET SESSION session_track_system_variables = 'time_zone,sql_mode'"),
    ];
    own.extend(steps);
    check_script_on(
        Target::start_tracking(),
        "fid_track_own",
        &own,
        caps::SESSION_TRACK,
    );
}

// ---------------------------------------------------------------------------------------
// Other commands

fn command_steps() -> Vec<Step> {
    use RawParam::*;
    vec![
        ok(Action::Ping),
        q("CREATE TABLE c (id INT PRIMARY KEY, doc BLOB, note VARCHAR(20) DEFAULT 'n')"),
        ok(Action::FieldList("c", "")),
        ok(Action::FieldList("c", "no%")),
        err(Action::FieldList("missing", ""), 1146),
        ok(Action::InitDb("heatsink_test")),
        q("SELECT DATABASE()"),
        err(Action::InitDb("no_such_db_xyz"), 1049),
        ok(Action::InitDb("fid_commands")),
        prep("ins", "INSERT INTO c (id, doc) VALUES (?, ?)"),
        any(Action::LongData("ins", 1, b"first chunk;")),
        any(Action::LongData("ins", 1, b"second chunk")),
        exec(
            "ins",
            vec![
                Int(1),
                RawParam::Typed {
                    ty: types::BLOB,
                    unsigned: false,
                    value: vec![],
                },
            ],
        ),
        ok(Action::ResetStmt("ins")),
        exec("ins", vec![Int(2), RawParam::str("plain")]),
        q("SELECT id, doc FROM c ORDER BY id"),
        any(Action::CloseStmt("ins")),
        err(Action::Execute("ins", vec![Int(3), Null]), 1243),
        q("INSERT INTO c (id) VALUES (3), (4), (5)"),
        prep("cur", "SELECT id, note FROM c WHERE id > ? ORDER BY id"),
        ok(Action::ExecuteCursor("cur", vec![Int(0)])),
        ok(Action::Fetch("cur", 2)),
        ok(Action::Fetch("cur", 2)),
        ok(Action::Fetch("cur", 2)),
        ok(Action::ResetStmt("cur")),
        ok(Action::ExecuteCursor("cur", vec![Int(3)])),
        ok(Action::Fetch("cur", 100)),
        any(Action::CloseStmt("cur")),
        // COM_SET_OPTION: multi-statements off, then on.
        ok(Action::Raw(vec![cmd::SET_OPTION, 1, 0])),
        qerr("SELECT 1; SELECT 2", 1064),
        ok(Action::Raw(vec![cmd::SET_OPTION, 0, 0])),
        q("SELECT 1; SELECT 2"),
        q("SET @v = 1"),
        prep("kept", "SELECT ?"),
        ok(Action::ResetConnection),
        q("SELECT @v, DATABASE()"),
        err(Action::Execute("kept", vec![Int(1)]), 1243),
        q("SET @w = 2"),
        ok(Action::ChangeUser(USER, PASSWORD, Some("fid_commands"))),
        q("SELECT @w, CURRENT_USER(), DATABASE()"),
        err(Action::Raw(vec![0xEE]), 1047),
        ok(Action::Ping),
        err(Action::ChangeUser(USER, "wrong password", None), 1045),
    ]
}

#[test]
fn utility_commands() {
    check_script("fid_commands", &command_steps());
}

// ---------------------------------------------------------------------------------------
// Payloads of 16 MiB and more (split into several wire packets)

/// Turns a generated statement into the `&'static str` the scripts use (test-only leak).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn large_packet_steps() -> Vec<Step> {
    const MIB: usize = 1 << 20;
    let literal = "y".repeat(17 * MIB);
    vec![
        q("CREATE TABLE big (id INT PRIMARY KEY, b LONGBLOB)"),
        q(leak(format!(
            "INSERT INTO big VALUES (1, REPEAT('x', {}))",
            17 * MIB
        ))),
        // A command larger than one wire packet.
        q(leak(format!("INSERT INTO big VALUES (2, '{literal}')"))),
        q("SELECT id, LENGTH(b), MD5(b) FROM big ORDER BY id"),
        // Rows larger than one wire packet.
        q("SELECT b FROM big WHERE id = 1"),
        // Row payload of exactly 0xFFFFFF bytes (lenenc prefix 4 + 16777211): the server
        // must follow it with an empty packet.
        q("SELECT REPEAT('a', 16777211)"),
        q("SELECT REPEAT('a', 16777210)"),
        prep("get", "SELECT b FROM big WHERE id = ?"),
        exec("get", vec![RawParam::Int(2)]),
        prep("put", "INSERT INTO big VALUES (?, ?)"),
        exec(
            "put",
            vec![RawParam::Int(3), RawParam::Bytes(literal.into_bytes())],
        ),
        q("SELECT id, LENGTH(b) FROM big ORDER BY id"),
    ]
}

#[test]
fn large_packets() {
    check_script("fid_large", &large_packet_steps());
}

// ---------------------------------------------------------------------------------------
// Authentication outcomes

/// The packets a connection attempt produced, scrambles zeroed.
fn auth_outcome(addr: SocketAddr, opts: &ConnectOpts) -> (String, Vec<Packet>) {
    match RawClient::connect(addr, opts) {
        Ok(c) => ("ok".into(), c.handshake.clone()),
        Err(ConnectError::Rejected { packets, .. }) => ("rejected".into(), packets),
        Err(ConnectError::Unsupported {
            mut packets,
            plugin,
            ..
        }) => {
            for p in packets.iter_mut().filter(|p| p.header() == 0xFE) {
                if let Some(nul) = p.payload.iter().position(|&b| b == 0) {
                    p.payload[nul + 1..].fill(0);
                }
            }
            (format!("switch to {plugin}"), packets)
        }
        Err(ConnectError::Io(e)) => (format!("I/O error: {e}"), Vec::new()),
    }
}

#[test]
fn authentication_outcomes_are_relayed() {
    let target = Target::start();
    // (case, options, outcome expected from MariaDB itself)
    let cases = [
        ("good password", ConnectOpts::new(USER, PASSWORD), "ok"),
        ("wrong password", ConnectOpts::new(USER, "nope"), "rejected"),
        (
            "unknown user",
            ConnectOpts::new("nobody_here", "x"),
            "rejected",
        ),
        (
            "unknown database",
            ConnectOpts::new(USER, PASSWORD).db("no_such_db_at_all"),
            "rejected",
        ),
        (
            "ed25519 user (auth switch)",
            ConnectOpts::new(common::ED_USER, common::ED_PASSWORD),
            "switch to client_ed25519",
        ),
        (
            "no DEPRECATE_EOF, no PLUGIN_AUTH",
            ConnectOpts::new(USER, PASSWORD)
                .caps(caps::DEFAULT & !caps::PLUGIN_AUTH)
                .db(common::TEST_DB),
            "ok",
        ),
    ];
    let mut report = String::new();
    for (name, opts, expected) in &cases {
        let direct = auth_outcome(mariadb().addr(), opts);
        assert_eq!(&direct.0, expected, "{name}: direct MariaDB");
        let other = auth_outcome(target.addr(), opts);
        if direct != other {
            let _ = writeln!(
                report,
                "{name}: direct {} vs {} {}\n{}",
                direct.0,
                target.name(),
                other.0,
                diff_packets(&direct.1, &other.1, target.name()).unwrap_or_default()
            );
        }
    }
    assert!(
        report.is_empty(),
        "authentication differs\n{report}\n--- log ---\n{}",
        target.log()
    );
}
