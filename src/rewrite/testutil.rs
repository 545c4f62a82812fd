//! Helpers shared by the rule kinds' unit tests: column definitions, decisions, and
//! comparing rewrites as parsed statements (never as raw strings).

use sqlparser::ast::Statement;

use super::{parse_statements, Decision, Engine, Rewritten, StatementContext};
use crate::wire::resultset::ColumnDef;

/// A column definition of `shop.<table>` as the backend sends it.
pub fn col(table: &str, name: &str, t: u8, flags: u16) -> ColumnDef {
    ColumnDef {
        catalog: b"def".to_vec(),
        schema: b"shop".to_vec(),
        table: table.into(),
        org_table: table.into(),
        name: name.into(),
        org_name: name.into(),
        extended: None,
        charset: if t == 0xfd { 45 } else { 63 },
        // VARCHAR(64) in utf8mb4; INT(11).
        length: if t == 0xfd { 256 } else { 11 },
        column_type: t,
        flags,
        decimals: 0,
        fixed_len: 0x0c,
        tail: vec![0, 0],
    }
}

/// The engine's decision for a text statement in database `shop`.
pub fn decide(e: &Engine, sql: &str) -> Decision {
    decide_as(e, sql, false)
}

/// The engine's decision for a statement being prepared in database `shop`.
pub fn decide_prepared(e: &Engine, sql: &str) -> Decision {
    decide_as(e, sql, true)
}

fn decide_as(e: &Engine, sql: &str, prepared: bool) -> Decision {
    e.decide(
        sql.as_bytes(),
        &StatementContext {
            prepared,
            in_transaction: false,
            current_db: Some("shop"),
            lexing: Some(crate::rewrite::Lexing::STANDARD),
            share: None,
        },
    )
}

/// The rewrite of `sql`; panics on any other decision.
#[track_caller]
pub fn rewrite(e: &Engine, sql: &str) -> Rewritten {
    match decide(e, sql) {
        Decision::Rewrite(r) => r,
        other => panic!("{sql}: expected a rewrite, got {other:?}"),
    }
}

/// The rejection message for `sql`; panics on any other decision.
#[track_caller]
pub fn reject(e: &Engine, sql: &str) -> String {
    match decide(e, sql) {
        Decision::Reject(r) => r.message(),
        other => panic!("{sql}: expected a rejection, got {other:?}"),
    }
}

/// The rejection's class and message for `sql`; panics on any other decision.
#[track_caller]
pub fn refusal(e: &Engine, sql: &str) -> (crate::rewrite::RefusalClass, String) {
    match decide(e, sql) {
        Decision::Reject(r) => (r.class, r.message()),
        other => panic!("{sql}: expected a rejection, got {other:?}"),
    }
}

/// Parses every statement of `texts`.
#[track_caller]
pub fn parsed<S: AsRef<[u8]>>(texts: &[S]) -> Vec<Statement> {
    texts
        .iter()
        .flat_map(|s| parse_statements(std::str::from_utf8(s.as_ref()).unwrap()).unwrap())
        .collect()
}

/// The rewrite's statements equal `expected`, compared as parsed statements.
#[track_caller]
pub fn assert_sql(r: &Rewritten, expected: &[&str]) {
    assert_eq!(parsed(&r.statements), parsed(expected));
}

/// Asserts that each statement is a fallback of a rule (forwarded, counted).
pub fn assert_fallbacks(e: &Engine, sqls: &[&str]) {
    for sql in sqls {
        let d = decide(e, sql);
        assert!(matches!(d, Decision::Fallback(_)), "{sql}: {d:?}");
    }
}

/// Asserts that each statement passes through unchanged.
pub fn assert_passthrough(e: &Engine, sqls: &[&str]) {
    for sql in sqls {
        let d = decide(e, sql);
        assert!(matches!(d, Decision::Passthrough), "{sql}: {d:?}");
    }
}
