//! Parameter values written as SQL literals (`heatsink::wire::literal`) are read by
//! MariaDB exactly as the binary parameters they stand for.
//!
//! A merged ring write carries each prepared execute's parameters as literals: for
//! every value the renderer accepts, a prepared insert of the parameter and a text
//! insert of its literal must store the same value in every column type, with the
//! same warnings, or fail with the same error, in strict and in non-strict mode and
//! in two time zones.
//! Directly against MariaDB; no proxy involved.

mod common;

use common::packets::{parse_err, parse_ok, parse_text_row, Packet};
use common::rawclient::{types, ConnectOpts, RawClient, RawParam};
use common::{mariadb, PASSWORD, TEST_DB, USER};
use heatsink::wire::literal::sql_literal;

/// Columns of every kind a temporal or numeric parameter may be stored into.
const COLUMNS: &[(&str, &str)] = &[
    ("dt6", "DATETIME(6)"),
    ("dt0", "DATETIME"),
    ("ts3", "TIMESTAMP(3) NULL"),
    ("d", "DATE"),
    ("tm6", "TIME(6)"),
    ("tm0", "TIME"),
    ("vc", "VARCHAR(40)"),
    ("bi", "BIGINT"),
    ("dec6", "DECIMAL(26,6)"),
    ("dbl", "DOUBLE"),
    ("yr", "YEAR"),
];

fn date_time(ty: u8, len: u8, ymd: (u16, u8, u8), hms: (u8, u8, u8), micro: u32) -> RawParam {
    let y = ymd.0.to_le_bytes();
    let mut v = vec![len, y[0], y[1], ymd.1, ymd.2, hms.0, hms.1, hms.2];
    v.extend_from_slice(&micro.to_le_bytes());
    v.truncate(1 + usize::from(len));
    RawParam::Typed {
        ty,
        unsigned: false,
        value: v,
    }
}

fn time(negative: bool, days: u32, hms: (u8, u8, u8), micro: Option<u32>) -> RawParam {
    let mut v = vec![if micro.is_some() { 12 } else { 8 }, u8::from(negative)];
    v.extend_from_slice(&days.to_le_bytes());
    v.extend_from_slice(&[hms.0, hms.1, hms.2]);
    if let Some(us) = micro {
        v.extend_from_slice(&us.to_le_bytes());
    }
    RawParam::Typed {
        ty: types::TIME,
        unsigned: false,
        value: v,
    }
}

/// The values under test, temporal ones first; each must have a literal.
fn values() -> Vec<RawParam> {
    use types::{DATE, DATETIME};
    vec![
        date_time(DATETIME, 11, (2024, 2, 29), (23, 59, 58), 999_999),
        date_time(DATETIME, 11, (2024, 2, 29), (23, 59, 58), 500_000),
        date_time(DATETIME, 11, (1999, 12, 31), (0, 0, 1), 1),
        date_time(DATETIME, 7, (2026, 11, 21), (9, 5, 0), 0),
        date_time(DATETIME, 4, (2026, 1, 2), (0, 0, 0), 0),
        date_time(DATETIME, 11, (1, 1, 1), (0, 0, 0), 0),
        date_time(DATETIME, 7, (9999, 12, 31), (23, 59, 59), 0),
        date_time(DATETIME, 11, (1970, 1, 1), (0, 0, 0), 123_456),
        date_time(DATE, 4, (2026, 11, 21), (0, 0, 0), 0),
        date_time(DATE, 11, (2000, 2, 29), (13, 14, 15), 161_718),
        time(false, 0, (1, 2, 3), None),
        time(true, 0, (1, 2, 3), Some(400)),
        time(false, 3, (4, 5, 6), Some(999_999)),
        time(true, 34, (21, 59, 59), None),
        time(false, 0, (0, 0, 0), None),
        RawParam::Typed {
            ty: types::TIME,
            unsigned: false,
            value: vec![0],
        },
        // The types rendered before temporal ones, for good measure.
        RawParam::Int(-20_261_121),
        RawParam::UInt(20_261_121_090_500),
        RawParam::Double(2.5e-3),
        RawParam::str("2026-11-21 09:05:00.5"),
        RawParam::str("12:30"),
        RawParam::Typed {
            ty: types::NEWDECIMAL,
            unsigned: false,
            value: b"\x0f20261121.123456".to_vec(),
        },
    ]
}

/// The type and value bytes as the server receives them in COM_STMT_EXECUTE.
fn wire(p: &RawParam) -> ([u8; 2], Vec<u8>) {
    match p {
        RawParam::Int(v) => ([types::LONGLONG, 0], v.to_le_bytes().to_vec()),
        RawParam::UInt(v) => ([types::LONGLONG, 0x80], v.to_le_bytes().to_vec()),
        RawParam::Double(v) => ([types::DOUBLE, 0], v.to_le_bytes().to_vec()),
        RawParam::Bytes(b) => {
            let mut v = vec![u8::try_from(b.len()).expect("short string")];
            v.extend_from_slice(b);
            ([types::STRING, 0], v)
        }
        RawParam::Typed {
            ty,
            unsigned,
            value,
        } => ([*ty, if *unsigned { 0x80 } else { 0 }], value.clone()),
        RawParam::Null => ([types::NULL, 0], Vec::new()),
    }
}

/// What a statement answered: its error code, or its warnings.
fn outcome(c: &mut RawClient, packets: &[Packet]) -> String {
    let last = packets.last().map(|p| p.payload.as_slice()).unwrap_or(&[]);
    if let Some(e) = parse_err(last) {
        return format!("ERROR {}", e.code);
    }
    let ok = parse_ok(last).expect("OK or ERR");
    format!(
        "OK affected={} warnings={:?}",
        ok.affected_rows,
        rows(c, "SHOW WARNINGS")
    )
}

/// A text query's rows, cells as strings (NULL as "NULL").
fn rows(c: &mut RawClient, sql: &str) -> Vec<Vec<String>> {
    let packets = c.query(sql).expect("query");
    let Some(n) = packets.first().and_then(|p| p.payload.first()).copied() else {
        return Vec::new();
    };
    if parse_err(&packets[0].payload).is_some() {
        panic!("{sql}: {:?}", parse_err(&packets[0].payload));
    }
    let mut at = 1 + usize::from(n);
    if !c.deprecate_eof() {
        at += 1;
    }
    packets[at..packets.len() - 1]
        .iter()
        .map(|p| {
            parse_text_row(&p.payload)
                .expect("text row")
                .into_iter()
                .map(|cell| {
                    cell.map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_else(|| "NULL".into())
                })
                .collect()
        })
        .collect()
}

/// MariaDB makes a MYSQL_TYPE_TIMESTAMP parameter outside the TIMESTAMP range of the
/// session's time zone NULL, without a warning: such parameters get no literal.
#[test]
fn timestamp_parameters_have_no_literal() {
    for (ymd, hms) in [((2026, 3, 29), (2, 30, 0)), ((2040, 1, 19), (3, 14, 8))] {
        let (ty, bytes) = wire(&date_time(types::TIMESTAMP, 7, ymd, hms, 0));
        assert_eq!(sql_literal(ty, Some(&bytes), "utf8mb4"), None);
    }
}

#[test]
fn literals_store_what_their_parameters_store() {
    let db = mariadb();
    db.exec(&format!(
        "CREATE DATABASE IF NOT EXISTS {TEST_DB}; USE {TEST_DB};
         DROP TABLE IF EXISTS literal_params;
         CREATE TABLE literal_params (k INT PRIMARY KEY, {}) ENGINE=InnoDB;",
        COLUMNS
            .iter()
            .map(|(n, t)| format!("{n} {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let opts = ConnectOpts::new(USER, PASSWORD).db(TEST_DB);
    let mut c = RawClient::connect(db.addr(), &opts).expect("connect");
    let mut compared = 0;
    let mut differences = Vec::new();
    for mode in ["STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO", ""] {
        c.query(format!("SET sql_mode = '{mode}'"))
            .expect("sql_mode");
        for value in values() {
            let (ty, bytes) = wire(&value);
            let literal = sql_literal(ty, Some(&bytes), "utf8mb4")
                .unwrap_or_else(|| panic!("no literal for {value:?}"));
            for (col, _) in COLUMNS {
                c.query("DELETE FROM literal_params").expect("delete");
                let (id, prep) = c
                    .prepare(format!(
                        "INSERT INTO literal_params (k, {col}) VALUES (1, ?)"
                    ))
                    .expect("prepare");
                assert!(parse_err(&prep[0].payload).is_none(), "{prep:?}");
                let executed = c
                    .execute(id, std::slice::from_ref(&value))
                    .expect("execute");
                let by_param = outcome(&mut c, &executed);
                c.close_stmt(id).expect("close");
                let sql = format!("INSERT INTO literal_params (k, {col}) VALUES (2, {literal})");
                let text = c.query(&sql).expect("text insert");
                let by_literal = outcome(&mut c, &text);
                let stored = |c: &mut RawClient, k: i32| {
                    rows(
                        c,
                        &format!("SELECT {col} FROM literal_params WHERE k = {k}"),
                    )
                };
                let (p, l) = (stored(&mut c, 1), stored(&mut c, 2));
                compared += 1;
                if (&by_param, &p) != (&by_literal, &l) {
                    differences.push(format!(
                        "mode '{mode}', {col} <- {value:?} as {literal}:\n  parameter: {by_param} {p:?}\n  literal:   {by_literal} {l:?}"
                    ));
                }
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {compared} differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
}
