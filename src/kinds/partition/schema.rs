//! The partition rule's schema work: the table's partitioning (`migrate` prints the
//! DDL that partitions an existing table by hour, day or month, and runs it with `--apply` for tables up
//! to the rule's `migrate_max_rows` rows), the triggers that keep every row reachable by pruned
//! lookups, and what `check --backend-url` reports.
//!
//! ## The invariant and its triggers
//!
//! A pruned lookup reads only the partitions of the key's date ± `tolerance_days`
//! (hourly partitions: the key's hour ± `24 × tolerance_days` hours),
//! so a row whose partition column lies outside that range would be unreachable.
//! Two triggers, `<table>_hs_pins` (`BEFORE INSERT`) and `<table>_hs_pupd`
//! (`AFTER UPDATE`, when the key or the column changed), refuse such a row with
//! error 1105 (SQLSTATE HY000) naming the rule, whoever writes it (through heatsink
//! or not); the statement then writes nothing (InnoDB rolls back the statement an
//! `AFTER` trigger fails). The update trigger is not a `BEFORE UPDATE` one: on
//! MariaDB 10.11 a partitioned table with a `BEFORE UPDATE` trigger lost rows to
//! `UPDATE`s — after a prepared statement of the session was pruned to no
//! partition, every later `UPDATE` of the session matched no row (the same
//! statements without the trigger, or with an `AFTER UPDATE` one, matched;
//! `tests/partition.rs`). `migrate` replaces a `BEFORE UPDATE` trigger of that
//! name left by an earlier version. A key whose time cannot be read is
//! stored with any value (its lookups are not pruned); a NULL in the column with
//! such a key is left to the column's own constraint. Dates are taken in the
//! writer's session time zone, as lookups take them in theirs.

use std::io::Write;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use super::period::{keep_from, parse_stamp, Stamp, CATCH_ALL};
use super::spec::{PartitionSpec, Period};
use crate::error::{OrErr, Result, Source};
use crate::kinds::{Migration, SchemaError};
use crate::report::Severity;
use crate::rules::spec::{quote, TableName};
use crate::schema::{
    emit, existing_trigger, inspect_base_table, normalize, resolve_tables, run_sql, suffixed_name,
    text, Table,
};

/// How a table is partitioned by its partition column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The partitions with an upper bound: name and that (exclusive) bound, in
    /// order.
    pub bounded: Vec<(String, Stamp)>,
    /// The `MAXVALUE` partition's name, when there is one.
    pub catch_all: Option<String>,
}

/// The table's partitions when it is partitioned by `RANGE COLUMNS (column)`;
/// `None` when it is not partitioned. Another partitioning is an error.
pub async fn partitions(conn: &mut Conn, t: &TableName, column: &str) -> Result<Option<Layout>> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT PARTITION_NAME, PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_DESCRIPTION \
             FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             ORDER BY PARTITION_ORDINAL_POSITION",
            (t.db.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .or_err(Source::Backend, || {
            format!("reading the partitions of {}", t.quoted())
        })?;
    let mut layout = Layout {
        bounded: Vec::new(),
        catch_all: None,
    };
    for r in &rows {
        let Some(name) = text(r, 0) else {
            return Ok(None);
        };
        let method = text(r, 1).unwrap_or_default();
        let expr = text(r, 2).unwrap_or_default();
        let bare = expr.trim_matches('`');
        if !method.eq_ignore_ascii_case("RANGE COLUMNS") || !bare.eq_ignore_ascii_case(column) {
            return Err(crate::error::Error::new(
                Source::Backend,
                format!(
                    "{} is partitioned by {method} ({expr}), not by RANGE COLUMNS ({column})",
                    t.quoted()
                ),
            ));
        }
        let desc = text(r, 3).unwrap_or_default();
        if desc.eq_ignore_ascii_case("MAXVALUE") {
            layout.catch_all = Some(name);
        } else {
            let end = parse_stamp(&desc).ok_or_else(|| {
                crate::error::Error::new(
                    Source::Backend,
                    format!(
                        "partition {name} of {} ends at {desc}, not at a date or time",
                        t.quoted()
                    ),
                )
            })?;
            layout.bounded.push((name, end));
        }
    }
    Ok((!rows.is_empty()).then_some(layout))
}

/// The trigger statements of a rule on table `t`: (name, timing/event, CREATE).
pub fn triggers(spec: &PartitionSpec, t: &TableName) -> Vec<(TableName, &'static str, String)> {
    let kt = super::key_time_sql(spec);
    let key = |row: &str| format!("{row}.{}", quote(&spec.key));
    let col = |row: &str| format!("{row}.{}", quote(&spec.column));
    let within = if spec.period == Period::Hour {
        format!("{} hour(s) of the hour", 24 * spec.tolerance_days)
    } else {
        format!("{} day(s) of the date", spec.tolerance_days)
    };
    let msg = format!(
        "heatsink rule ''{}'': {} must lie within {within} the time in {} gives (in the session time zone), else lookups by {} would not find the row",
        spec.name, spec.column, spec.key, spec.key
    );
    let check = |row: &str| {
        format!(
            "IF NOT COALESCE({}, FALSE) AND ({} IS NOT NULL OR COALESCE({}, FALSE)) THEN SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1105, MESSAGE_TEXT = '{msg}'; END IF;",
            kt.range(&key(row), &col(row), spec.tolerance_days, true),
            col(row),
            kt.readable(&key(row))
        )
    };
    let name = |suffix: &str| TableName {
        db: t.db.clone(),
        name: suffixed_name(&t.name, suffix),
    };
    let ins = name("_hs_pins");
    let upd = name("_hs_pupd");
    vec![
        (
            ins.clone(),
            "BEFORE INSERT",
            format!(
                "CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW BEGIN {} END",
                ins.quoted(),
                t.quoted(),
                check("NEW")
            ),
        ),
        (
            upd.clone(),
            "AFTER UPDATE",
            format!(
                "CREATE TRIGGER {} AFTER UPDATE ON {} FOR EACH ROW BEGIN IF NOT ({} <=> {} AND {} <=> {}) THEN {} END IF; END",
                upd.quoted(),
                t.quoted(),
                key("NEW"),
                key("OLD"),
                col("NEW"),
                col("OLD"),
                check("NEW")
            ),
        ),
    ]
}

/// What `check`/`migrate` found for one rule.
pub struct PartitionMigration {
    /// The rule.
    spec: PartitionSpec,
    /// The table, with its database.
    table: TableName,
    /// Its description.
    desc: Table,
    /// Its partitioning, when partitioned.
    layout: Option<Layout>,
    /// Triggers to create (name, CREATE statement).
    create: Vec<(TableName, String)>,
    /// Triggers of an earlier version to drop before those are created (the
    /// `BEFORE UPDATE` one, see the module documentation).
    replace: Vec<TableName>,
    /// Notes for the DBA.
    notes: Vec<String>,
}

/// Checks a partition rule against the live database.
pub async fn check(
    conn: &mut Conn,
    spec: &PartitionSpec,
    default_db: Option<&str>,
) -> std::result::Result<PartitionMigration, SchemaError> {
    let refuse = SchemaError::Refused;
    let (table, _) = resolve_tables(&spec.table, &[], default_db)?;
    let desc = inspect_base_table(conn, &table).await?;
    let key = desc.column(&spec.key).ok_or_else(|| {
        refuse(format!(
            "key `{}` is not a column of {}",
            spec.key,
            table.quoted()
        ))
    })?;
    let keyed = key.data_type.contains("char")
        || key.data_type.contains("binary")
        || key.is_integer()
        || key.data_type.contains("text");
    if !keyed {
        return Err(refuse(format!(
            "key `{}` is {}; a partition rule needs a string or integer key",
            key.name, key.column_type
        )));
    }
    let col = desc.column(&spec.column).ok_or_else(|| {
        refuse(format!(
            "column `{}` is not a column of {}",
            spec.column,
            table.quoted()
        ))
    })?;
    if !matches!(col.data_type.as_str(), "date" | "datetime") {
        return Err(refuse(format!(
            "column `{}` is {}; a partition rule needs DATE or DATETIME",
            col.name, col.column_type
        )));
    }
    if spec.period == Period::Hour && col.data_type != "datetime" {
        return Err(refuse(format!(
            "column `{}` is {}; period = \"hour\" needs a DATETIME column",
            col.name, col.column_type
        )));
    }
    let layout = partitions(conn, &table, &spec.column)
        .await
        .map_err(|e| refuse(e.to_string()))?;
    let mut create = Vec::new();
    let mut replace = Vec::new();
    let mut notes = Vec::new();
    for (name, what, sql) in triggers(spec, &table) {
        match existing_trigger(conn, &name).await? {
            None => create.push((name, sql)),
            Some(t)
                if what == "AFTER UPDATE"
                    && t.table.eq_ignore_ascii_case(&table.name)
                    && t.timing.eq_ignore_ascii_case("BEFORE")
                    && t.event.eq_ignore_ascii_case("UPDATE") =>
            {
                replace.push(name.clone());
                create.push((name, sql));
            }
            Some(t) => {
                let fits = t.table.eq_ignore_ascii_case(&table.name)
                    && what.eq_ignore_ascii_case(&format!("{} {}", t.timing, t.event));
                if !fits {
                    return Err(refuse(format!(
                        "trigger {} exists but is not `{what} ON {}`",
                        name.quoted(),
                        table.quoted()
                    )));
                }
                let body = sql.split_once(" FOR EACH ROW ").map_or("", |(_, b)| b);
                if normalize(&t.body) != normalize(body) {
                    notes.push(format!(
                        "trigger {} exists with another body; left as it is (drop it and run migrate again to replace it)",
                        name.quoted()
                    ));
                }
            }
        }
    }
    Ok(PartitionMigration {
        spec: spec.clone(),
        table,
        desc,
        layout,
        create,
        replace,
        notes,
    })
}

impl PartitionMigration {
    /// Rows that break the invariant (their column outside the key's date ±
    /// tolerance, in this connection's time zone).
    async fn strays(&self, conn: &mut Conn) -> Result<u64> {
        let kt = super::key_time_sql(&self.spec);
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE NOT COALESCE({}, FALSE)",
            self.table.quoted(),
            kt.range(
                &quote(&self.spec.key),
                &quote(&self.spec.column),
                self.spec.tolerance_days,
                true
            )
        );
        let n: Option<u64> = conn.query_first(&sql).await.or_err(Source::Backend, || {
            format!("counting stray rows of {}", self.table.quoted())
        })?;
        Ok(n.unwrap_or(0))
    }

    /// The DDL that partitions the (unpartitioned) table by the rule's period,
    /// from its first period (for hours: at most `retention_days` back) to the
    /// current one + premake: every unique key extended with the column, and an
    /// invisible AUTO_INCREMENT primary key where the primary key is the key alone.
    async fn partitioning(&self, conn: &mut Conn) -> Result<(String, u64)> {
        let (first, now, rows): (Option<String>, Option<String>, Option<u64>) = conn
            .query_first(format!(
                "SELECT CAST(MIN({c}) AS CHAR), CAST(NOW() AS CHAR), COUNT(*) FROM {t}",
                c = quote(&self.spec.column),
                t = self.table.quoted()
            ))
            .await
            .or_err(Source::Backend, || {
                format!("reading {}", self.table.quoted())
            })?
            .unwrap_or((None, None, None));
        let period = self.spec.period;
        let now = now.as_deref().and_then(parse_stamp).unwrap_or(0);
        let mut first = first
            .as_deref()
            .and_then(parse_stamp)
            .unwrap_or(now)
            .min(now);
        if period == Period::Hour {
            // Hours older than the retention would be dropped at the next
            // rotation: the first partition holds them all.
            first = first.max(keep_from(&self.spec, now));
        }
        let mut alter = Vec::new();
        let col = &self.spec.column;
        let has_ai = self
            .desc
            .columns
            .iter()
            .any(|c| c.extra.contains("auto_increment"));
        for (name, cols) in &self.desc.unique {
            if cols.iter().any(|c| c.eq_ignore_ascii_case(col)) {
                continue;
            }
            let primary = name.eq_ignore_ascii_case("PRIMARY");
            let random_pk = primary
                && cols.len() == 1
                && cols[0].eq_ignore_ascii_case(&self.spec.key)
                && !has_ai;
            let mut extended: Vec<String> = cols.iter().map(|c| quote(c)).collect();
            extended.push(quote(col));
            if primary {
                alter.push("DROP PRIMARY KEY".to_string());
                if random_pk {
                    alter.push("ADD COLUMN `hs_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT INVISIBLE FIRST".into());
                    alter.push(format!("ADD PRIMARY KEY (`hs_id`, {})", quote(col)));
                    alter.push(format!(
                        "ADD UNIQUE KEY {} ({})",
                        quote(&format!("{}_key", self.spec.key)),
                        extended.join(", ")
                    ));
                } else {
                    alter.push(format!("ADD PRIMARY KEY ({})", extended.join(", ")));
                }
            } else {
                alter.push(format!("DROP INDEX {}", quote(name)));
                alter.push(format!(
                    "ADD UNIQUE KEY {} ({})",
                    quote(name),
                    extended.join(", ")
                ));
            }
        }
        let mut parts = period.partitions(first, period.add(now, i64::from(self.spec.premake)));
        parts.push(CATCH_ALL.to_string());
        let mut sql = format!("ALTER TABLE {}", self.table.quoted());
        if !alter.is_empty() {
            sql.push(' ');
            sql.push_str(&alter.join(", "));
        }
        sql.push_str(&format!(
            " PARTITION BY RANGE COLUMNS ({}) ({})",
            quote(col),
            parts.join(", ")
        ));
        Ok((sql, rows.unwrap_or(0)))
    }
}

#[async_trait(?Send)]
impl Migration for PartitionMigration {
    async fn problems(&self, conn: &mut Conn) -> Result<Vec<(Severity, String)>> {
        let mut out = Vec::new();
        match &self.layout {
            None => out.push((
                Severity::Error,
                format!(
                    "table {} is not partitioned by RANGE COLUMNS ({}); run heatsink migrate",
                    self.table.quoted(),
                    self.spec.column
                ),
            )),
            Some(l) if l.catch_all.is_none() => out.push((
                Severity::Warning,
                format!(
                    "table {} has no MAXVALUE partition: a row beyond its last partition fails with 1526 (heatsink maintain --job rotate --apply adds one)",
                    self.table.quoted()
                ),
            )),
            Some(_) => {}
        }
        if let Some(l) = &self.layout {
            let period = self.spec.period;
            // A partition whose bounds are not one period apart (the first has no
            // lower bound and is not counted).
            let other = l
                .bounded
                .windows(2)
                .filter(|w| period.floor(w[0].1) != w[0].1 || period.add(w[0].1, 1) != w[1].1)
                .count();
            if other > 0 {
                out.push((
                    Severity::Warning,
                    format!(
                        "{other} partitions of {} are not one {} wide (the rule's period): lookups read whole partitions, and rotation adds {}s after the last one",
                        self.table.quoted(),
                        period.word(),
                        period.word()
                    ),
                ));
            }
        }
        for (name, _) in &self.create {
            let what = if self.replace.contains(name) {
                "is a BEFORE UPDATE trigger, with which MariaDB 10.11 lets UPDATEs miss rows; run heatsink migrate to replace it"
            } else {
                "is missing"
            };
            out.push((Severity::Error, format!("trigger {} {what}", name.quoted())));
        }
        let strays = self.strays(conn).await?;
        if strays > 0 {
            out.push((
                Severity::Error,
                format!(
                    "{strays} rows of {} have {} outside the date of {} \u{b1} {} days: pruned lookups would not find them",
                    self.table.quoted(),
                    self.spec.column,
                    self.spec.key,
                    self.spec.tolerance_days
                ),
            ));
        }
        out.extend(self.notes.iter().map(|n| (Severity::Warning, n.clone())));
        Ok(out)
    }

    async fn run(&self, conn: &mut Conn, apply: bool, out: &mut dyn Write) -> Result<()> {
        emit(out, &format!("-- rule {} (partition)", self.spec.name))?;
        for n in &self.notes {
            emit(out, &format!("-- note: {n}"))?;
        }
        if self.layout.is_none() {
            let (sql, rows) = self.partitioning(conn).await?;
            let max = self.spec.migrate_max_rows;
            if rows > max {
                emit(out, &format!(
                    "-- {} holds {rows} rows (more than migrate_max_rows = {max}): not partitioned in place; run online:",
                    self.table.quoted()
                ))?;
                let alter = sql
                    .split_once(&format!("ALTER TABLE {} ", self.table.quoted()))
                    .map_or(sql.as_str(), |(_, a)| a);
                emit(
                    out,
                    &format!(
                        "-- pt-online-schema-change --alter \"{}\" --preserve-triggers D={},t={} --execute",
                        alter.replace('`', ""),
                        self.table.db.as_deref().unwrap_or_default(),
                        self.table.name
                    ),
                )?;
            } else {
                emit(out, &format!("{sql};"))?;
                if apply {
                    run_sql(conn, &self.spec.name, &sql).await?;
                }
            }
        } else {
            emit(
                out,
                &format!(
                    "-- {} is partitioned by RANGE COLUMNS ({})",
                    self.table.quoted(),
                    quote(&self.spec.column)
                ),
            )?;
        }
        for name in &self.replace {
            let sql = format!("DROP TRIGGER IF EXISTS {}", name.quoted());
            emit(
                out,
                &format!("-- {} is a BEFORE UPDATE trigger: replaced", name.quoted()),
            )?;
            emit(out, &format!("{sql};"))?;
            if apply {
                run_sql(conn, &self.spec.name, &sql).await?;
            }
        }
        for (_, sql) in &self.create {
            emit(out, &format!("{sql};"))?;
            if apply {
                run_sql(conn, &self.spec.name, sql).await?;
            }
        }
        Ok(())
    }
}
