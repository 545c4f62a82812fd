//! The SQL of a rollup's triggers on the log, and the expressions they share with
//! the backfill (one definition, so both put a row in the same group).

use crate::rules::spec::{quote, TableName};

use super::schema::{counted, summed, CheckedRollup, NULL_BUCKET};

/// A write event on the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Insert,
    Update,
    Delete,
}

/// The three events, in the order their triggers are listed.
pub(crate) const EVENTS: [Event; 3] = [Event::Insert, Event::Update, Event::Delete];

impl Event {
    /// Suffix of the trigger's name.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Event::Insert => "_hs_ins",
            Event::Update => "_hs_upd",
            Event::Delete => "_hs_del",
        }
    }

    /// The event as SQL (`INSERT`).
    pub(crate) fn sql(self) -> &'static str {
        match self {
            Event::Insert => "INSERT",
            Event::Update => "UPDATE",
            Event::Delete => "DELETE",
        }
    }
}

/// `<row>.<col>`, or the bare column when `row` is empty (the backfill's query).
fn col(row: &str, name: &str) -> String {
    if row.is_empty() {
        quote(name)
    } else {
        format!("{row}.{}", quote(name))
    }
}

/// The group a row belongs to: each dimension (NULL as its zero value), the NULL
/// bitmask and the bucket start, as expressions over `row` (`NEW`, `OLD`, or `""`).
pub(crate) fn group_exprs(rule: &CheckedRollup, row: &str) -> Vec<String> {
    let mut out: Vec<String> = rule
        .dims
        .iter()
        .map(|d| {
            let value = format!("IFNULL({}, {})", col(row, &d.column.name), d.zero);
            if d.column.data_type == "year" {
                // As a number: the backfill's value must not reach the rollup as the
                // string `0`, which YEAR reads as 2000.
                format!("CAST({value} AS SIGNED)")
            } else {
                value
            }
        })
        .collect();
    let mut bits: Vec<String> = rule
        .dims
        .iter()
        .enumerate()
        .map(|(i, d)| format!("(({} IS NULL) << {i})", col(row, &d.column.name)))
        .collect();
    bits.push(format!("(({} IS NULL) << 31)", col(row, &rule.time)));
    out.push(format!("({})", bits.join(" | ")));
    out.push(bucket_expr(rule, &col(row, &rule.time)));
    out
}

/// The start of the bucket holding `time` (`NULL_BUCKET` when it is NULL). A
/// TIMESTAMP's bucket is of its UTC value, whatever the writer's time zone
/// (`UNIX_TIMESTAMP` of the stored instant); its zero value (non-strict modes) is
/// kept apart from every real instant in bucket `NULL_BUCKET` (without the NULL
/// bit), before every range's first bucket.
pub(crate) fn bucket_expr(rule: &CheckedRollup, time: &str) -> String {
    if rule.utc {
        let width = rule.spec.bucket.seconds();
        return format!(
            "CAST(IF(IFNULL(UNIX_TIMESTAMP({time}), 0) = 0, '{NULL_BUCKET}', \
             '1970-01-01 00:00:00' + INTERVAL (UNIX_TIMESTAMP({time}) DIV {width} * {width}) SECOND) AS DATETIME)"
        );
    }
    format!(
        "CAST(IFNULL(DATE_FORMAT({time}, '{}'), '{NULL_BUCKET}') AS DATETIME)",
        rule.spec.bucket.format()
    )
}

/// The rollup's column list for an upsert, in layout order.
pub(crate) fn insert_columns(rule: &CheckedRollup) -> String {
    let cols: Vec<String> = super::schema::layout(rule)
        .into_iter()
        .map(|(n, _)| quote(&n))
        .collect();
    cols.join(", ")
}

/// `ON DUPLICATE KEY UPDATE` adding every measure column.
pub(crate) fn on_duplicate(rule: &CheckedRollup) -> String {
    let adds: Vec<String> = super::schema::layout(rule)
        .into_iter()
        .skip(rule.dims.len() + 3)
        .map(|(n, _)| {
            let q = quote(&n);
            format!("{q} = {q} + VALUES({q})")
        })
        .collect();
    format!("ON DUPLICATE KEY UPDATE {}", adds.join(", "))
}

/// The upsert adding (`sign` "") or subtracting (`sign` "-") the row `row`.
fn upsert(rule: &CheckedRollup, row: &str, sign: &str) -> String {
    let mut values = group_exprs(rule, row);
    values.push(format!("CONNECTION_ID() % {}", rule.spec.slots));
    values.push(format!("{sign}1"));
    for c in counted(rule) {
        values.push(format!("{sign}({} IS NOT NULL)", col(row, c)));
    }
    for (c, scale) in summed(rule) {
        values.push(format!(
            "{sign}CAST(IFNULL({}, 0) AS DECIMAL(65,{scale}))",
            col(row, c)
        ));
    }
    format!(
        "INSERT INTO {} ({}) VALUES ({}) {}",
        rule.rollup.quoted(),
        insert_columns(rule),
        values.join(", "),
        on_duplicate(rule)
    )
}

/// The columns whose change moves a row's contribution.
fn read_columns(rule: &CheckedRollup) -> Vec<String> {
    let mut cols: Vec<String> = rule.dims.iter().map(|d| d.column.name.clone()).collect();
    cols.push(rule.time.clone());
    for c in counted(rule) {
        if !cols.iter().any(|x| x.eq_ignore_ascii_case(c)) {
            cols.push(c.to_string());
        }
    }
    cols
}

/// The trigger body (what follows `FOR EACH ROW`).
pub(crate) fn body(rule: &CheckedRollup, event: Event) -> String {
    match event {
        Event::Insert => upsert(rule, "NEW", ""),
        Event::Delete => upsert(rule, "OLD", "-"),
        Event::Update => {
            let same: Vec<String> = read_columns(rule)
                .iter()
                .map(|c| format!("{} <=> {}", col("OLD", c), col("NEW", c)))
                .collect();
            format!(
                "BEGIN IF NOT ({}) THEN {}; {}; END IF; END",
                same.join(" AND "),
                upsert(rule, "OLD", "-"),
                upsert(rule, "NEW", "")
            )
        }
    }
}

/// `CREATE TRIGGER … AFTER <event> ON <log> FOR EACH ROW <body>`.
pub(crate) fn create_sql(
    rule: &CheckedRollup,
    name: &TableName,
    event: Event,
    body: &str,
) -> String {
    format!(
        "CREATE TRIGGER {} AFTER {} ON {} FOR EACH ROW {body}",
        name.quoted(),
        event.sql(),
        rule.log.quoted()
    )
}
