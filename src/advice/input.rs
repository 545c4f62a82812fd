//! Where a workload comes from: the admin port's `SHOW DIGESTS`, a JSON dump of it,
//! or the server's own `performance_schema` (so that `heatsink advise` works before
//! heatsink is deployed); and, with a database connection, the tables the
//! statements use and the server's evidence of contention.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Row};

use super::{sql, Column, DigestRow, HotKeys, Observed, ServerEvidence, TableInfo};
use crate::error::{Error, Result, Source};
use crate::schema::schema_err;

/// Samples kept per digest from `events_statements_history_long`.
const SAMPLES_PER_DIGEST: usize = 64;

/// Heavy hitters kept in a `hot_keys` built from samples (as `SHOW DIGESTS` does).
const TOP_KEYS: usize = 8;

use crate::digest::{cell_named as named, cell_text as text};

/// Reads a `--digests` dump: a JSON array of digest rows.
pub fn from_file(path: &Path) -> Result<Vec<DigestRow>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::with_cause(Source::Rules, format!("reading {}", path.display()), e))?;
    DigestRow::from_json_array(&text).map_err(|e| {
        Error::with_cause(
            Source::Rules,
            format!(
                "{}: not a JSON array of digest rows (the columns of SHOW DIGESTS)",
                path.display()
            ),
            e,
        )
    })
}

/// Runs `SHOW DIGESTS` on a proxy's admin port (`mysql://admin:PW@HOST:PORT`).
pub async fn from_admin(url: &str) -> Result<Vec<DigestRow>> {
    let opts = Opts::from_url(url)
        .map_err(|e| Error::with_cause(Source::Internal, "invalid --admin URL", e))?;
    let mut conn = Conn::new(OptsBuilder::from_opts(opts).prefer_socket(false))
        .await
        .map_err(|e| {
            Error::with_cause(
                Source::Backend,
                format!(
                    "connecting to the admin port {}",
                    crate::schema::redact(url)
                ),
                e,
            )
        })?;
    let rows: Vec<Row> = conn
        .query("SHOW DIGESTS")
        .await
        .map_err(|e| Error::with_cause(Source::Backend, "SHOW DIGESTS on the admin port", e))?;
    let _ = conn.disconnect().await;
    Ok(rows.iter().map(DigestRow::from_show_digests).collect())
}

/// Whether a statement is about the server's own bookkeeping (ours included).
fn bookkeeping(digest_text: &str) -> bool {
    let t = digest_text.trim_start().to_ascii_lowercase();
    ["performance_schema", "information_schema"]
        .iter()
        .any(|x| t.contains(x))
        || ["show", "set", "select @@", "analyze", "truncate"]
            .iter()
            .any(|x| t.starts_with(x))
}

/// Reads the statements from `performance_schema`: one row per digest from
/// `events_statements_summary_by_digest` (picoseconds made microseconds; MariaDB
/// keeps no percentiles, so `p99_time_us` is the maximum), and, when the
/// `events_statements_history_long` consumer is on, literal samples per digest,
/// from which `hot_keys` and `error_codes` are built as `SHOW DIGESTS` would (counts
/// scaled from the samples to the digest's executions).
pub async fn from_performance_schema(conn: &mut Conn) -> Result<Vec<Observed>> {
    let on: Option<String> = conn
        .query_first("SELECT @@performance_schema")
        .await
        .map_err(|e| schema_err("reading @@performance_schema".into(), e))?;
    if on.as_deref() != Some("1") {
        return Err(Error::new(
            Source::Backend,
            "performance_schema is off on the server (start it with --performance-schema=ON; \
             --performance-schema-consumer-events-statements-history-long=ON adds literal \
             samples)",
        ));
    }
    conn.query_drop("SET time_zone = '+00:00'")
        .await
        .map_err(|e| schema_err("setting the session time zone".into(), e))?;
    let rows: Vec<Row> = conn
        .query(crate::digest::SUMMARY_BY_DIGEST)
        .await
        .map_err(|e| {
            schema_err(
                "reading performance_schema.events_statements_summary_by_digest".into(),
                e,
            )
        })?;
    let mut out: Vec<Observed> = Vec::new();
    let mut by_digest: HashMap<(String, Option<String>), usize> = HashMap::new();
    for row in &rows {
        let digest_text = text(row, 2).unwrap_or_default();
        if bookkeeping(&digest_text) {
            continue;
        }
        let full = text(row, 0).unwrap_or_default();
        let (d, examined) = DigestRow::from_summary_by_digest(row);
        let schema_name = d.schema_name.clone();
        let mut o = Observed::new(d);
        o.rows_examined = Some(examined);
        by_digest.insert((full, schema_name), out.len());
        out.push(o);
    }
    let consumer: Option<String> = conn
        .query_first(
            "SELECT ENABLED FROM performance_schema.setup_consumers \
             WHERE NAME = 'events_statements_history_long'",
        )
        .await
        .map_err(|e| schema_err("reading performance_schema.setup_consumers".into(), e))?;
    if consumer.as_deref() == Some("YES") {
        let rows: Vec<Row> = conn
            .query(
                "SELECT DIGEST, CURRENT_SCHEMA, SQL_TEXT, MYSQL_ERRNO \
                 FROM performance_schema.events_statements_history_long \
                 WHERE DIGEST IS NOT NULL ORDER BY EVENT_ID DESC",
            )
            .await
            .map_err(|e| {
                schema_err(
                    "reading performance_schema.events_statements_history_long".into(),
                    e,
                )
            })?;
        let mut samples: HashMap<usize, Vec<(String, u32)>> = HashMap::new();
        for row in &rows {
            let key = (text(row, 0).unwrap_or_default(), text(row, 1));
            let Some(&i) = by_digest.get(&key) else {
                continue;
            };
            let errno = text(row, 3).and_then(|v| v.parse().ok()).unwrap_or(0);
            samples
                .entry(i)
                .or_default()
                .push((text(row, 2).unwrap_or_default(), errno));
        }
        for (i, s) in samples {
            apply_samples(&mut out[i], &s);
        }
    }
    Ok(out)
}

/// Fills `hot_keys`, `error_codes` and the samples of `o` from statements of its
/// shape as sent (`(sql, errno)`, newest first).
pub fn apply_samples(o: &mut Observed, samples: &[(String, u32)]) {
    if samples.is_empty() {
        return;
    }
    let scale = |c: u64, of: usize, to: u64| -> u64 {
        ((c as f64) * (to as f64) / (of.max(1) as f64)).round() as u64
    };
    let mut column: Option<String> = None;
    let mut keys: BTreeMap<String, u64> = BTreeMap::new();
    let mut with_key = 0usize;
    let mut codes: BTreeMap<u32, u64> = BTreeMap::new();
    let mut failed = 0usize;
    for (text, errno) in samples {
        if *errno != 0 {
            *codes.entry(*errno).or_default() += 1;
            failed += 1;
        }
        let Some(stmt) = crate::rewrite::parse_statements(text)
            .ok()
            .and_then(|mut v| v.pop())
        else {
            continue;
        };
        if let Some((col, lit)) = sql::first_equality_literal(&stmt) {
            if column.is_none() {
                column = Some(col.clone());
            }
            if column
                .as_deref()
                .is_some_and(|c| c.eq_ignore_ascii_case(&col))
            {
                *keys.entry(lit).or_default() += 1;
                with_key += 1;
            }
        }
    }
    let count = o.row.count_star;
    if let Some(column) = column.filter(|_| o.hot_keys.is_none()) {
        let mut top: Vec<(String, u64)> = keys.iter().map(|(k, v)| (k.clone(), *v)).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let distinct = top.len() as u64;
        top.truncate(TOP_KEYS);
        let hk = HotKeys {
            column,
            distinct,
            top: top
                .into_iter()
                .map(|(k, c)| (k, scale(c, with_key, count)))
                .collect(),
        };
        o.row.hot_keys = serde_json::to_string(&hk).ok();
        o.hot_keys = Some(hk);
    }
    if o.row.error_codes.is_none() && failed > 0 {
        let mut v: Vec<(u32, u64)> = codes.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(8);
        let total = o.row.errors.max(failed as u64);
        o.row.error_codes = Some(
            v.iter()
                .map(|(c, n)| format!("{c}:{}", scale(*n, failed, total).max(1)))
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    o.samples = samples
        .iter()
        .take(SAMPLES_PER_DIGEST)
        .map(|(s, _)| s.clone())
        .collect();
}

/// Reads the tables of databases `dbs` named in `names` (lower case), by lower-case
/// `db.table`.
pub async fn read_schema(
    conn: &mut Conn,
    dbs: &BTreeSet<String>,
    names: &BTreeSet<String>,
) -> Result<BTreeMap<String, TableInfo>> {
    let mut out: BTreeMap<String, TableInfo> = BTreeMap::new();
    let what = |t: &str| format!("reading information_schema.{t}");
    for db in dbs {
        let rows: Vec<Row> = conn
            .exec(
                "SELECT TABLE_NAME, COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = ? AND TABLE_TYPE = 'BASE TABLE'",
                (db,),
            )
            .await
            .map_err(|e| schema_err(what("TABLES"), e))?;
        for row in &rows {
            let name = text(row, 0).unwrap_or_default();
            if !names.contains(&name.to_ascii_lowercase()) {
                continue;
            }
            out.insert(
                format!("{db}.{name}").to_ascii_lowercase(),
                TableInfo {
                    db: db.clone(),
                    name,
                    rows: text(row, 1).and_then(|v| v.parse().ok()).unwrap_or(0),
                    columns: Vec::new(),
                    primary: None,
                    unique: Vec::new(),
                    indexes: Vec::new(),
                    triggers: Vec::new(),
                    foreign_keys: 0,
                    checks: 0,
                },
            );
        }
        let key = |t: &str| format!("{db}.{t}").to_ascii_lowercase();
        let rows: Vec<Row> = conn
            .exec(
                "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, EXTRA \
                 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? \
                 ORDER BY TABLE_NAME, ORDINAL_POSITION",
                (db,),
            )
            .await
            .map_err(|e| schema_err(what("COLUMNS"), e))?;
        for row in &rows {
            if let Some(t) = out.get_mut(&key(&text(row, 0).unwrap_or_default())) {
                t.columns.push(Column {
                    name: text(row, 1).unwrap_or_default(),
                    data_type: text(row, 2).unwrap_or_default().to_ascii_lowercase(),
                    column_type: text(row, 3).unwrap_or_default(),
                    nullable: text(row, 4).is_some_and(|v| v.eq_ignore_ascii_case("YES")),
                    extra: text(row, 5).unwrap_or_default().to_ascii_lowercase(),
                });
            }
        }
        let rows: Vec<Row> = conn
            .exec(
                "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SUB_PART \
                 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? \
                 ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
                (db,),
            )
            .await
            .map_err(|e| schema_err(what("STATISTICS"), e))?;
        // (table, index) → (unique, columns, whole columns)
        let mut ix: BTreeMap<(String, String), (bool, Vec<String>, bool)> = BTreeMap::new();
        for row in &rows {
            let e = ix
                .entry((
                    key(&text(row, 0).unwrap_or_default()),
                    text(row, 1).unwrap_or_default(),
                ))
                .or_insert((text(row, 2).as_deref() == Some("0"), Vec::new(), true));
            e.1.push(text(row, 3).unwrap_or_default());
            e.2 &= text(row, 4).is_none();
        }
        for ((t, index), (unique, cols, whole)) in ix {
            if let Some(t) = out.get_mut(&t) {
                if index == "PRIMARY" {
                    t.primary = Some(cols.clone());
                }
                if unique && whole {
                    t.unique.push((index, cols.clone()));
                }
                t.indexes.push(cols);
            }
        }
        let rows: Vec<Row> = conn
            .exec(
                "SELECT EVENT_OBJECT_TABLE, TRIGGER_NAME, \
                        CONCAT(ACTION_TIMING, ' ', EVENT_MANIPULATION) \
                 FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = ?",
                (db,),
            )
            .await
            .map_err(|e| schema_err(what("TRIGGERS"), e))?;
        for row in &rows {
            if let Some(t) = out.get_mut(&key(&text(row, 0).unwrap_or_default())) {
                t.triggers.push((
                    text(row, 1).unwrap_or_default(),
                    text(row, 2).unwrap_or_default(),
                ));
            }
        }
        let rows: Vec<Row> = conn
            .exec(
                "SELECT TABLE_NAME, REFERENCED_TABLE_NAME \
                 FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = ?",
                (db,),
            )
            .await
            .map_err(|e| schema_err(what("REFERENTIAL_CONSTRAINTS"), e))?;
        for row in &rows {
            for i in [0, 1] {
                if let Some(t) = out.get_mut(&key(&text(row, i).unwrap_or_default())) {
                    t.foreign_keys += 1;
                }
            }
        }
        let rows: Vec<Row> = conn
            .exec(
                "SELECT TABLE_NAME FROM information_schema.CHECK_CONSTRAINTS \
                 WHERE CONSTRAINT_SCHEMA = ?",
                (db,),
            )
            .await
            .map_err(|e| schema_err(what("CHECK_CONSTRAINTS"), e))?;
        for row in &rows {
            if let Some(t) = out.get_mut(&key(&text(row, 0).unwrap_or_default())) {
                t.checks += 1;
            }
        }
    }
    Ok(out)
}

/// The tables named in the latest deadlock of `SHOW ENGINE INNODB STATUS`
/// (`db.table`, lower case).
pub fn deadlock_tables(status: &str) -> Vec<String> {
    let Some(start) = status.find("LATEST DETECTED DEADLOCK") else {
        return Vec::new();
    };
    let section = &status[start..];
    let end = section.find("\nTRANSACTIONS\n").unwrap_or(section.len());
    let section = &section[..end];
    let mut out: Vec<String> = Vec::new();
    let mut rest = section;
    while let Some(i) = rest.find("table `") {
        rest = &rest[i + 7..];
        let Some(j) = rest.find('`') else { break };
        let db = &rest[..j];
        let tail = &rest[j + 1..];
        let Some(tail) = tail.strip_prefix(".`") else {
            continue;
        };
        let Some(k) = tail.find('`') else { break };
        let t = format!("{db}.{}", &tail[..k]).to_ascii_lowercase();
        if !out.contains(&t) {
            out.push(t);
        }
        rest = &tail[k..];
    }
    out
}

/// The server's evidence of contention: the latest deadlock's tables and the
/// `Innodb_row_lock_*` and `Innodb_deadlocks` counters.
pub async fn server_evidence(conn: &mut Conn) -> Result<ServerEvidence> {
    let mut ev = ServerEvidence::default();
    // Needs the PROCESS privilege; without it there is simply no deadlock evidence.
    if let Ok(rows) = conn.query::<Row, _>("SHOW ENGINE INNODB STATUS").await {
        if let Some(status) = rows.first().and_then(|r| named(r, "Status")) {
            ev.deadlock_tables = deadlock_tables(&status);
        }
    }
    let rows: Vec<Row> = conn
        .query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_deadlocks', \
             'Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_row_lock_current_waits')",
        )
        .await
        .map_err(|e| schema_err("reading the server's status counters".into(), e))?;
    for row in &rows {
        let v = text(row, 1).and_then(|v| v.parse::<u64>().ok());
        match text(row, 0)
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "innodb_deadlocks" => ev.deadlocks = v,
            "innodb_row_lock_waits" => ev.row_lock_waits = v,
            "innodb_row_lock_time" => ev.row_lock_time_ms = v,
            "innodb_row_lock_current_waits" => ev.row_lock_current_waits = v,
            _ => {}
        }
    }
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookkeeping_is_left_out() {
        assert!(bookkeeping(
            "SELECT @@`max_allowed_packet` , @@`wait_timeout` "
        ));
        assert!(bookkeeping("SET NAMES ?"));
        assert!(bookkeeping(
            "SELECT * FROM performance_schema . setup_consumers"
        ));
        assert!(!bookkeeping(
            "UPDATE `hits` SET `cnt` = `cnt` + ? WHERE `slug` = ? "
        ));
    }

    #[test]
    fn deadlock_tables_are_read_from_the_latest_deadlock() {
        let status = "=====\nLATEST DETECTED DEADLOCK\n------------------------\n\
            *** (1) TRANSACTION:\nRECORD LOCKS space id 5 page no 3 n bits 72 index PRIMARY of table `shop`.`hits` trx id 1\n\
            *** (2) TRANSACTION:\nRECORD LOCKS index PRIMARY of table `shop`.`Hits` trx id 2\n\
            ------------\nTRANSACTIONS\n------------\nlock of table `shop`.`other`\n";
        assert_eq!(deadlock_tables(status), ["shop.hits"]);
        assert!(deadlock_tables("no deadlock").is_empty());
    }

    #[test]
    fn samples_make_hot_keys_and_error_codes() {
        let mut o = Observed::new(DigestRow {
            digest_text: "UPDATE hits SET cnt = cnt + ? WHERE slug = ?".into(),
            count_star: 1000,
            errors: 20,
            ..DigestRow::default()
        });
        let mut samples = Vec::new();
        for i in 0..10 {
            let slug = if i < 8 {
                "home".to_string()
            } else {
                format!("p{i}")
            };
            let errno = if i == 0 { 1213 } else { 0 };
            samples.push((
                format!("UPDATE hits SET cnt = cnt + 1 WHERE slug = '{slug}'"),
                errno,
            ));
        }
        apply_samples(&mut o, &samples);
        let hk = o.hot_keys.unwrap();
        assert_eq!(hk.column, "slug");
        assert_eq!(hk.distinct, 3);
        assert_eq!(hk.top[0], ("home".to_string(), 800));
        assert_eq!(o.row.error_codes.as_deref(), Some("1213:20"));
        assert_eq!(o.row.errors_with(1213), 20);
    }
}
