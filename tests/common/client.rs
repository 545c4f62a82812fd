//! What the rule tests share for driving clients: an async body with a time limit,
//! mysql_async connections, one-file rules directories, and capturing everything a
//! client sees of a statement (for comparisons with a reference table).

use std::future::Future;
use std::time::Duration;

use mysql_async::consts::{ColumnFlags, ColumnType};
use mysql_async::prelude::*;
use mysql_async::{Column, Conn, Params, QueryResult, Row, ServerError, Value};

/// Runs an async test body on a two-thread runtime; panics when it takes longer than
/// `limit`.
pub fn run<F: Future<Output = ()>>(limit: Duration, f: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(async {
            tokio::time::timeout(limit, f)
                .await
                .unwrap_or_else(|_| panic!("test timed out after {limit:?}"))
        })
}

/// A mysql_async connection to `url`; panics after 10 s or on an error.
pub async fn connect(url: &str) -> Conn {
    tokio::time::timeout(Duration::from_secs(10), Conn::from_url(url))
        .await
        .unwrap_or_else(|_| panic!("connect {url}: timed out"))
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// Runs `sql`, which the rule `rule` must refuse: ERR 1105 / HY000 naming the rule.
/// Returns the error.
pub async fn assert_refused_by(conn: &mut Conn, sql: &str, rule: &str) -> ServerError {
    match conn.query_drop(sql).await {
        Err(mysql_async::Error::Server(e)) => {
            assert_eq!(e.code, 1105, "{sql}: {e:?}");
            assert_eq!(e.state, "HY000", "{sql}: {e:?}");
            assert!(
                e.message.contains(&format!("heatsink rule '{rule}'")),
                "{sql}: {e:?}"
            );
            e
        }
        other => panic!("{sql}: expected a rejection, got {other:?}"),
    }
}

/// A statement template filled in: `{t}` → `table`, `{db}` → `db`.
pub fn fill(template: &str, table: &str, db: &str) -> String {
    template.replace("{t}", table).replace("{db}", db)
}

/// The last `lines` lines of `s` (proxy logs in failure messages).
pub fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A temporary rules directory holding one file, `file`, with `toml`.
pub fn rules_dir(file: &str, toml: &str) -> tempfile::TempDir {
    rules_dir_with(&[(file, toml)])
}

/// A temporary rules directory holding `files` (name, text).
pub fn rules_dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("heatsink-rules-")
        .tempdir()
        .expect("rules tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write rules");
    }
    dir
}

/// One column definition as the client sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub schema: String,
    pub table: String,
    pub org_table: String,
    pub name: String,
    pub org_name: String,
    pub column_type: ColumnType,
    pub flags: ColumnFlags,
    pub length: u32,
    pub decimals: u8,
    pub charset: u16,
}

impl Meta {
    pub fn of(c: &Column) -> Meta {
        Meta {
            schema: c.schema_str().into_owned(),
            table: c.table_str().into_owned(),
            org_table: c.org_table_str().into_owned(),
            name: c.name_str().into_owned(),
            org_name: c.org_name_str().into_owned(),
            column_type: c.column_type(),
            flags: c.flags(),
            length: c.column_length(),
            decimals: c.decimals(),
            charset: c.character_set(),
        }
    }
}

/// Everything a client sees of one statement's success.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub columns: Vec<Meta>,
    pub rows: Vec<Vec<Value>>,
    pub affected_rows: u64,
    pub info: String,
    pub warnings: u16,
    pub last_insert_id: Option<u64>,
}

impl Outcome {
    /// The reference table `from` shown as the logical table `to` in the column
    /// definitions.
    pub fn renamed(mut self, from: &str, to: &str) -> Outcome {
        for c in &mut self.columns {
            for t in [&mut c.table, &mut c.org_table] {
                if t == from {
                    *t = to.into();
                }
            }
        }
        self
    }
}

/// Runs `sql` as a text statement (COM_QUERY) and captures what the client sees.
pub async fn run_text(conn: &mut Conn, sql: &str) -> Result<Outcome, mysql_async::Error> {
    let (columns, rows) = capture(conn.query_iter(sql).await?).await?;
    Ok(outcome(conn, columns, rows))
}

/// Prepares and executes `sql` with `params` (binary protocol) and captures what the
/// client sees.
pub async fn run_exec(
    conn: &mut Conn,
    sql: &str,
    params: impl Into<Params>,
) -> Result<Outcome, mysql_async::Error> {
    let (columns, rows) = capture(conn.exec_iter(sql, params).await?).await?;
    Ok(outcome(conn, columns, rows))
}

/// The column definitions and rows of a result.
async fn capture<P: Protocol>(
    r: QueryResult<'_, '_, P>,
) -> Result<(Vec<Meta>, Vec<Row>), mysql_async::Error> {
    let columns = r
        .columns()
        .map(|c| c.iter().map(Meta::of).collect())
        .unwrap_or_default();
    let rows: Vec<Row> = r.collect_and_drop().await?;
    Ok((columns, rows))
}

fn outcome(conn: &Conn, columns: Vec<Meta>, rows: Vec<Row>) -> Outcome {
    Outcome {
        columns,
        rows: rows.into_iter().map(Row::unwrap).collect(),
        affected_rows: conn.affected_rows(),
        info: conn.info().into_owned(),
        warnings: conn.get_warnings(),
        last_insert_id: conn.last_insert_id(),
    }
}
