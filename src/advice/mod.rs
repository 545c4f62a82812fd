//! What `heatsink advise` knows about a workload, shared by its driver
//! ([`crate::advise`]) and the kinds' detectors (`src/kinds/<kind>/advise.rs`):
//! the observed statements (one row per digest, in the format of the admin port's
//! `SHOW DIGESTS`), the tables they use, the server's own evidence of contention,
//! and the proposals the detectors make.
//!
//! Nothing here names a rule kind.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlparser::ast::Statement;

pub mod input;
pub mod sql;

/// One row of `SHOW DIGESTS` (and of a `--digests` dump): the row contract, with
/// its conversions from each source ([`crate::digest::DigestRow`]).
pub use crate::digest::DigestRow;

/// The `hot_keys` column: the first `column = literal` equality of a statement's
/// WHERE, how many distinct literals it saw (an estimate), and the heavy hitters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HotKeys {
    /// The column compared.
    pub column: String,
    /// Distinct literals seen (an estimate).
    #[serde(default)]
    pub distinct: u64,
    /// The most frequent literals (strings without quotes) and their counts.
    #[serde(default)]
    pub top: Vec<(String, u64)>,
}

impl HotKeys {
    /// The share of `count` executions that used the most frequent literal.
    pub fn top_share(&self, count: u64) -> f64 {
        let top = self.top.first().map_or(0, |(_, n)| *n);
        if count == 0 {
            0.0
        } else {
            (top as f64 / count as f64).min(1.0)
        }
    }
}

/// One observed statement shape with what is known about it.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The digest row.
    pub row: DigestRow,
    /// `digest_text` parsed (`None`: the parser cannot read it).
    pub stmt: Option<Statement>,
    /// `hot_keys` parsed.
    pub hot_keys: Option<HotKeys>,
    /// Statements of this shape as sent, literals included (from
    /// `events_statements_history_long`), newest first.
    pub samples: Vec<String>,
    /// Rows the server examined for it in total, where performance_schema says.
    pub rows_examined: Option<u64>,
}

impl Observed {
    /// A statement from its digest row (parsing `digest_text` and `hot_keys`).
    pub fn new(row: DigestRow) -> Observed {
        let stmt = sql::parse_digest(&row.digest_text);
        let hot_keys = row
            .hot_keys
            .as_deref()
            .and_then(|h| serde_json::from_str::<HotKeys>(h).ok());
        Observed {
            row,
            stmt,
            hot_keys,
            samples: Vec::new(),
            rows_examined: None,
        }
    }

    /// The database its unqualified tables are in.
    pub fn schema(&self) -> Option<&str> {
        self.row.schema_name.as_deref().filter(|s| !s.is_empty())
    }

    /// Average rows sent per execution.
    pub fn rows_per_call(&self) -> f64 {
        if self.row.count_star == 0 {
            0.0
        } else {
            self.row.rows_sent as f64 / self.row.count_star as f64
        }
    }
}

/// One column of a table (`information_schema.COLUMNS`).
#[derive(Debug, Clone, Default)]
pub struct Column {
    /// Name as the server spells it.
    pub name: String,
    /// `DATA_TYPE`, lower case: `int`, `varchar`, …
    pub data_type: String,
    /// `COLUMN_TYPE`: `varchar(64)`, `int(10) unsigned`, …
    pub column_type: String,
    /// `IS_NULLABLE = 'YES'`.
    pub nullable: bool,
    /// `EXTRA`, lower case: `auto_increment`, …
    pub extra: String,
}

impl Column {
    /// `TINYINT` … `BIGINT`, signed or not.
    pub fn is_integer(&self) -> bool {
        crate::schema::integer_max(&self.data_type, false).is_some()
    }
}

/// One table, as the detectors see it (from `information_schema`).
#[derive(Debug, Clone)]
pub struct TableInfo {
    /// Its database.
    pub db: String,
    /// Its name as the server spells it.
    pub name: String,
    /// `TABLE_ROWS` (an estimate for InnoDB).
    pub rows: u64,
    /// Columns in order.
    pub columns: Vec<Column>,
    /// The primary key's columns.
    pub primary: Option<Vec<String>>,
    /// Unique keys (the primary key too) over whole columns: (name, columns).
    pub unique: Vec<(String, Vec<String>)>,
    /// Every index's columns, in order (unique or not).
    pub indexes: Vec<Vec<String>>,
    /// Triggers on it: (name, timing and event).
    pub triggers: Vec<(String, String)>,
    /// Foreign keys it has or that reference it: how many.
    pub foreign_keys: usize,
    /// CHECK constraints: how many.
    pub checks: usize,
}

impl TableInfo {
    /// The column called `name` (case-insensitively).
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// Whether `cols` are exactly the columns of the primary key or a unique key.
    pub fn is_unique(&self, cols: &[String]) -> bool {
        !cols.is_empty()
            && self
                .unique
                .iter()
                .any(|(_, k)| crate::schema::same_set(k, cols))
    }

    /// The `AUTO_INCREMENT` column.
    pub fn auto_increment(&self) -> Option<&Column> {
        self.columns
            .iter()
            .find(|c| c.extra.contains("auto_increment"))
    }

    /// Whether `col` is a DATE, DATETIME or TIMESTAMP column.
    pub fn is_temporal(&self, col: &str) -> bool {
        self.column(col)
            .is_some_and(|c| matches!(c.data_type.as_str(), "date" | "datetime" | "timestamp"))
    }

    /// Whether an index starts with `cols` (in that order).
    pub fn has_index_on(&self, cols: &[&str]) -> bool {
        self.indexes.iter().any(|ix| {
            ix.len() >= cols.len() && ix.iter().zip(cols).all(|(a, b)| a.eq_ignore_ascii_case(b))
        })
    }
}

/// What the server itself says about contention.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerEvidence {
    /// Tables named in `SHOW ENGINE INNODB STATUS`'s latest detected deadlock
    /// (`db.table`, lower case).
    pub deadlock_tables: Vec<String>,
    /// `Innodb_deadlocks`.
    pub deadlocks: Option<u64>,
    /// `Innodb_row_lock_waits`.
    pub row_lock_waits: Option<u64>,
    /// `Innodb_row_lock_time`, milliseconds.
    pub row_lock_time_ms: Option<u64>,
    /// `Innodb_row_lock_current_waits`.
    pub row_lock_current_waits: Option<u64>,
}

/// The thresholds the detectors apply (`docs/design.md`, "heatsink advise").
#[derive(Debug, Clone, Serialize)]
pub struct Thresholds {
    /// A table of at least this many rows is large (rollup, partition, timeline).
    pub large_rows: u64,
    /// A key is hot when its most frequent literal has at least this share of the
    /// statement's executions (counter).
    pub hot_share: f64,
    /// A proposal must answer at least this share of the load's executions or time.
    pub min_share: f64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            large_rows: 1_000_000,
            hot_share: 0.05,
            min_share: 0.01,
        }
    }
}

/// Everything the detectors get.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    /// The statement shapes, most time first.
    pub statements: Vec<Observed>,
    /// The tables they use, by lower-case `db.table` (empty without a database).
    pub tables: BTreeMap<String, TableInfo>,
    /// Whether the schema was read (`--backend-url`).
    pub schema_known: bool,
    /// The database of statements whose digest names none.
    pub default_db: Option<String>,
    /// The server's evidence (with `--backend-url`).
    pub server: ServerEvidence,
    /// The detectors' thresholds.
    pub thresholds: Thresholds,
}

impl Workload {
    /// A workload of these statements (sorted most time first), without a schema.
    pub fn new(mut statements: Vec<Observed>) -> Workload {
        statements.sort_by(|a, b| {
            b.row
                .sum_time_us
                .cmp(&a.row.sum_time_us)
                .then(b.row.count_star.cmp(&a.row.count_star))
        });
        Workload {
            statements,
            ..Workload::default()
        }
    }

    /// Executions of every statement.
    pub fn total_count(&self) -> u64 {
        self.statements.iter().map(|s| s.row.count_star).sum()
    }

    /// Time of every statement, microseconds.
    pub fn total_time_us(&self) -> u64 {
        self.statements.iter().map(|s| s.row.sum_time_us).sum()
    }

    /// The database a table named `table` (`t` or `db.t`) by statement `s` is in.
    pub fn db_of(&self, s: &Observed, table: &str) -> Option<String> {
        match table.split_once('.') {
            Some((db, _)) => Some(db.to_string()),
            None => s
                .schema()
                .map(str::to_string)
                .or_else(|| self.default_db.clone()),
        }
    }

    /// The table `table` as statement `s` names it.
    pub fn table(&self, s: &Observed, table: &str) -> Option<&TableInfo> {
        let db = self.db_of(s, table)?;
        let name = table.rsplit('.').next().unwrap_or(table);
        self.tables
            .get(&format!("{db}.{name}").to_ascii_lowercase())
    }

    /// Whether the table is large; `None` when the schema is unknown.
    pub fn is_large(&self, s: &Observed, table: &str) -> Option<bool> {
        if !self.schema_known {
            return None;
        }
        Some(
            self.table(s, table)
                .is_some_and(|t| t.rows >= self.thresholds.large_rows),
        )
    }

    /// The statements that name table `table` (as `s` names it: same database).
    pub fn on_table<'a>(
        &'a self,
        s: &'a Observed,
        table: &'a str,
    ) -> impl Iterator<Item = &'a Observed> + 'a {
        let db = self.db_of(s, table);
        let name = table.rsplit('.').next().unwrap_or(table);
        self.statements.iter().filter(move |o| {
            o.stmt.as_ref().is_some_and(|st| {
                sql::tables(st).iter().any(|t| {
                    let tn = t.rsplit('.').next().unwrap_or(t);
                    tn.eq_ignore_ascii_case(name) && self.db_of(o, t) == db
                })
            })
        })
    }

    /// Whether a deadlock the server reported involved the table.
    pub fn deadlocked(&self, s: &Observed, table: &str) -> bool {
        let Some(db) = self.db_of(s, table) else {
            return false;
        };
        let name = table.rsplit('.').next().unwrap_or(table);
        let want = format!("{db}.{name}").to_ascii_lowercase();
        self.server.deadlock_tables.contains(&want)
    }

    /// Executions and time of `digests`: (count, time µs, count share, time share).
    pub fn share(&self, digests: &[&Observed]) -> (u64, u64, f64, f64) {
        let count: u64 = digests.iter().map(|s| s.row.count_star).sum();
        let time: u64 = digests.iter().map(|s| s.row.sum_time_us).sum();
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        (
            count,
            time,
            ratio(count, self.total_count()),
            ratio(time, self.total_time_us()),
        )
    }

    /// Whether statements answering `digests` carry enough of the load to matter.
    pub fn matters(&self, digests: &[&Observed]) -> bool {
        let (_, _, c, t) = self.share(digests);
        c.max(t) >= self.thresholds.min_share
    }
}

/// One rule a detector proposes.
#[derive(Debug, Clone, Serialize)]
pub struct Proposal {
    /// The kind (`counter`, …).
    pub kind: &'static str,
    /// The rule's name.
    pub name: String,
    /// The logical table (`db.table` when known).
    pub table: String,
    /// What identifies the hot spot, by setting: `key`, `dimensions`, `key_time`, …
    pub settings: BTreeMap<String, serde_json::Value>,
    /// The rule as TOML, ready to save (a `[[kind]]` entry).
    pub toml: String,
    /// The digests it answers.
    pub digests: Vec<String>,
    /// Their executions.
    pub count: u64,
    /// Their time, microseconds.
    pub time_us: u64,
    /// Share of the load's executions.
    pub count_share: f64,
    /// Share of the load's time.
    pub time_share: f64,
    /// Why: what was observed.
    pub evidence: Vec<String>,
    /// What the rule is expected to do, citing the project's measurements.
    pub effect: String,
    /// The measured speed-up the estimate uses (× the statements' throughput or
    /// latency).
    pub speedup: f64,
    /// Estimated time saved, microseconds (`time_us × (1 − 1/speedup)`): the rank.
    pub benefit_us: u64,
    /// What `heatsink migrate` will create (from its dry run with `--backend-url`).
    pub migrate: Vec<String>,
    /// What the schema checks raise about it, and what a DBA should verify.
    pub caveats: Vec<String>,
}

impl Proposal {
    /// A proposal for `digests` of workload `w`, with the share and benefit filled in.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        w: &Workload,
        kind: &'static str,
        name: String,
        table: String,
        toml: String,
        digests: &[&Observed],
        speedup: f64,
        effect: String,
    ) -> Proposal {
        let (count, time_us, count_share, time_share) = w.share(digests);
        let benefit_us = if speedup > 1.0 {
            (time_us as f64 * (1.0 - 1.0 / speedup)) as u64
        } else {
            0
        };
        Proposal {
            kind,
            name,
            table,
            settings: BTreeMap::new(),
            toml,
            digests: digests.iter().map(|s| s.row.digest.clone()).collect(),
            count,
            time_us,
            count_share,
            time_share,
            evidence: Vec::new(),
            effect,
            speedup,
            benefit_us,
            migrate: Vec::new(),
            caveats: Vec::new(),
        }
    }

    /// Records a setting that identifies the hot spot.
    pub fn set(mut self, key: &str, value: impl Serialize) -> Proposal {
        if let Ok(v) = serde_json::to_value(value) {
            self.settings.insert(key.to_string(), v);
        }
        self
    }
}

/// A rule-file entry written line by line, values quoted as TOML.
#[derive(Debug, Default)]
pub struct Entry {
    text: String,
}

impl Entry {
    /// `[[section]]`.
    pub fn new(section: &str) -> Entry {
        Entry {
            text: format!("[[{section}]]\n"),
        }
    }

    /// `key = value`, with an optional trailing comment.
    pub fn kv(mut self, key: &str, value: impl Into<toml::Value>, comment: &str) -> Entry {
        let value: toml::Value = value.into();
        let line = format!("{key} = {value}");
        if comment.is_empty() {
            self.text.push_str(&line);
        } else {
            self.text.push_str(&format!("{line:<40} # {comment}"));
        }
        self.text.push('\n');
        self
    }

    /// `key = ["a", "b"]`.
    pub fn list(self, key: &str, values: &[String], comment: &str) -> Entry {
        let v = toml::Value::Array(values.iter().cloned().map(toml::Value::String).collect());
        self.kv(key, v, comment)
    }

    /// The entry's text.
    pub fn finish(self) -> String {
        self.text
    }
}

/// `base` made into a rule or table name: letters, digits and `_` only.
pub fn ident(base: &str) -> String {
    base.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `1234567` → `1.2 M`, for evidence lines.
pub fn human(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1} k", n as f64 / 1e3),
        _ => format!("{:.1} M", n as f64 / 1e6),
    }
}

/// `0.4213` → `42.1 %`.
pub fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// What one kind's detector found: its proposals and notes on hot spots it saw but
/// cannot propose a rule for.
#[derive(Debug, Clone, Default)]
pub struct Advice {
    /// Rules proposed.
    pub proposals: Vec<Proposal>,
    /// Hot spots seen but not proposed, and why.
    pub notes: Vec<String>,
}

impl Workload {
    /// A table as a rule names it: bare when it is in the default database,
    /// `db.table` otherwise; spelt as the server spells it when known.
    pub fn rule_table(&self, s: &Observed, table: &str) -> String {
        let spelt = self
            .table(s, table)
            .map_or_else(|| sql::last(table).to_string(), |t| t.name.clone());
        match self.db_of(s, table) {
            Some(db) if self.default_db.as_deref() != Some(db.as_str()) => {
                format!("{db}.{spelt}")
            }
            _ => spelt,
        }
    }

    /// Evidence lines every proposal starts with: the statements' share of the load.
    pub fn load_line(&self, digests: &[&Observed]) -> String {
        let (count, time, cs, ts) = self.share(digests);
        format!(
            "{} statement shape(s): {} executions ({} of all), {} ms ({} of all statement time)",
            digests.len(),
            human(count),
            pct(cs),
            time / 1000,
            pct(ts)
        )
    }

    /// `n rows` of a table, or that the size is unknown.
    pub fn size_line(&self, s: &Observed, table: &str) -> String {
        match self.table(s, table) {
            Some(t) => format!("table {} holds about {} rows", t.name, human(t.rows)),
            None => format!("size of table {table} unknown (no --backend-url)"),
        }
    }
}

/// `name` of a side table next to logical `table` (`db.t` → `db.t_suffix`).
pub fn side_table(table: &str, suffix: &str) -> String {
    format!("{table}_{suffix}")
}

/// Workloads for the detectors' unit tests.
#[cfg(test)]
pub mod testutil {
    use super::*;

    /// A digest row of `text` run `count` times for `time_us` in all, in database `db`.
    pub fn row(text: &str, count: u64, time_us: u64) -> DigestRow {
        DigestRow {
            digest: format!("{:016x}", text.len() as u64 * 7919 + count),
            schema_name: Some("db".into()),
            digest_text: text.into(),
            count_star: count,
            sum_time_us: time_us,
            ..DigestRow::default()
        }
    }

    /// `row` with a `hot_keys` of `column` and its top literals.
    pub fn hot(mut r: DigestRow, column: &str, distinct: u64, top: &[(&str, u64)]) -> DigestRow {
        let hk = HotKeys {
            column: column.into(),
            distinct,
            top: top.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        };
        r.hot_keys = serde_json::to_string(&hk).ok();
        r
    }

    /// A table of database `db`: columns as (name, data type[, "auto"]), unique keys.
    pub fn table(name: &str, rows: u64, cols: &[(&str, &str)], unique: &[&[&str]]) -> TableInfo {
        let columns = cols
            .iter()
            .map(|(n, t)| {
                let (t, extra) = match t.strip_suffix(" auto") {
                    Some(t) => (t, "auto_increment"),
                    None => (*t, ""),
                };
                Column {
                    name: n.to_string(),
                    data_type: t.into(),
                    column_type: t.into(),
                    nullable: false,
                    extra: extra.into(),
                }
            })
            .collect();
        let unique: Vec<(String, Vec<String>)> = unique
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let name = if i == 0 {
                    "PRIMARY".to_string()
                } else {
                    format!("k{i}")
                };
                (name, k.iter().map(|c| c.to_string()).collect())
            })
            .collect();
        TableInfo {
            db: "db".into(),
            name: name.into(),
            rows,
            columns,
            primary: unique.first().map(|(_, c)| c.clone()),
            indexes: unique.iter().map(|(_, c)| c.clone()).collect(),
            unique,
            triggers: Vec::new(),
            foreign_keys: 0,
            checks: 0,
        }
    }

    /// A workload of `rows` over `tables`, default database `db`, large from 10,000 rows.
    pub fn workload(rows: Vec<DigestRow>, tables: Vec<TableInfo>) -> Workload {
        let mut w = Workload::new(rows.into_iter().map(Observed::new).collect());
        w.schema_known = !tables.is_empty();
        w.default_db = Some("db".into());
        w.thresholds.large_rows = 10_000;
        for t in tables {
            w.tables
                .insert(format!("{}.{}", t.db, t.name).to_ascii_lowercase(), t);
        }
        w
    }
}
