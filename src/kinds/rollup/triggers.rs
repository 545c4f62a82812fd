//! The SQL of a rollup's triggers on the log, and the expressions they share with
//! the backfill (one definition, so both put a row in the same group).

use crate::rules::spec::{quote, TableName};

use super::checked::{counted, summed, CheckedRollup, NULL_BUCKET};

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

    /// Suffix of the name of the delta trigger a backfill keeps while unfinished.
    pub(crate) fn delta_suffix(self) -> &'static str {
        match self {
            Event::Insert => "_hs_bf_ins",
            Event::Update => "_hs_bf_upd",
            Event::Delete => "_hs_bf_del",
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
    let cols: Vec<String> = super::checked::layout(rule)
        .into_iter()
        .map(|(n, _)| quote(&n))
        .collect();
    cols.join(", ")
}

/// `ON DUPLICATE KEY UPDATE` adding every measure column.
pub(crate) fn on_duplicate(rule: &CheckedRollup) -> String {
    let adds: Vec<String> = super::checked::layout(rule)
        .into_iter()
        .skip(rule.dims.len() + 3)
        .map(|(n, _)| {
            let q = quote(&n);
            format!("{q} = {q} + VALUES({q})")
        })
        .collect();
    format!("ON DUPLICATE KEY UPDATE {}", adds.join(", "))
}

/// The slot a session's trigger writes: `CONNECTION_ID() % slots`. On a Galera node
/// (`galera`), within the node's share of the slots, so that writes through
/// different nodes never update the same rollup row (they would fail certification):
/// Galera gives each node its own `auto_increment_offset` (its index + 1) and sets
/// `auto_increment_increment` to the cluster size, so slot ≡ offset − 1 modulo the
/// cluster size. On one server (increment 1, offset 1) it is the same as above.
fn slot_expr(slots: u32, galera: bool) -> String {
    if galera {
        format!(
            "((@@auto_increment_offset - 1) + @@auto_increment_increment * \
             (CONNECTION_ID() % GREATEST(1, {slots} DIV @@auto_increment_increment))) % {slots}"
        )
    } else {
        format!("CONNECTION_ID() % {slots}")
    }
}

/// The measures of row `row` (`hs_rows`, the `hs_count_<col>`, the `hs_sum_<col>`),
/// added (`sign` "") or subtracted (`sign` "-").
fn measure_values(rule: &CheckedRollup, row: &str, sign: &str) -> Vec<String> {
    let mut values = vec![format!("{sign}1")];
    for c in counted(rule) {
        values.push(format!("{sign}({} IS NOT NULL)", col(row, c)));
    }
    for (c, scale) in summed(rule) {
        values.push(format!(
            "{sign}CAST(IFNULL({}, 0) AS DECIMAL(65,{scale}))",
            col(row, c)
        ));
    }
    values
}

/// The upsert adding (`sign` "") or subtracting (`sign` "-") the row `row`.
fn upsert(rule: &CheckedRollup, row: &str, sign: &str, galera: bool) -> String {
    let mut values = group_exprs(rule, row);
    values.push(slot_expr(rule.spec.slots, galera));
    values.extend(measure_values(rule, row, sign));
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

/// The columns of the backfill's delta table a delta trigger fills, in order: the
/// log row's key, the group (as in the rollup), the measures.
pub(crate) fn delta_columns(rule: &CheckedRollup) -> Vec<String> {
    let mut cols = vec![DELTA_PK.to_string()];
    cols.extend(
        super::checked::layout(rule)
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n != "hs_slot"),
    );
    cols
}

/// The column of the delta table holding the log row's primary key.
pub(crate) const DELTA_PK: &str = "hs_pk";

/// The append to the delta table of row `row`'s contribution, added (`sign` "") or
/// subtracted (`sign` "-"), when its key is at most `end`.
fn delta_append(rule: &CheckedRollup, row: &str, sign: &str, end: &str) -> String {
    let pk = col(row, rule.pk.as_deref().unwrap_or_default());
    let mut values = vec![pk.clone()];
    values.extend(group_exprs(rule, row));
    values.extend(measure_values(rule, row, sign));
    let cols: Vec<String> = delta_columns(rule).iter().map(|c| quote(c)).collect();
    format!(
        "IF {pk} <= {end} THEN INSERT INTO {} ({}) VALUES ({}); END IF",
        rule.delta.quoted(),
        cols.join(", "),
        values.join(", ")
    )
}

/// The body of the delta trigger of `event` while a backfill covering the log's keys
/// up to `end` is unfinished: the same change the rollup's trigger makes, appended
/// to the delta table with the row's key, for rows with a key of at most `end`. An
/// update that changes the key moves the row's contribution from one key to
/// another, so it is recorded even when no column the rollup reads changed.
pub(crate) fn delta_body(rule: &CheckedRollup, event: Event, end: &str) -> String {
    match event {
        Event::Insert => format!("BEGIN {}; END", delta_append(rule, "NEW", "", end)),
        Event::Delete => format!("BEGIN {}; END", delta_append(rule, "OLD", "-", end)),
        Event::Update => {
            let pk = rule.pk.as_deref().unwrap_or_default();
            let mut same = vec![format!("{} <=> {}", col("OLD", pk), col("NEW", pk))];
            same.extend(
                read_columns(rule)
                    .iter()
                    .map(|c| format!("{} <=> {}", col("OLD", c), col("NEW", c))),
            );
            format!(
                "BEGIN IF NOT ({}) THEN {}; {}; END IF; END",
                same.join(" AND "),
                delta_append(rule, "OLD", "-", end),
                delta_append(rule, "NEW", "", end)
            )
        }
    }
}

/// The trigger body (what follows `FOR EACH ROW`); `galera`: made on a Galera node
/// (see [`slot_expr`]).
pub(crate) fn body(rule: &CheckedRollup, event: Event, galera: bool) -> String {
    match event {
        Event::Insert => upsert(rule, "NEW", "", galera),
        Event::Delete => upsert(rule, "OLD", "-", galera),
        Event::Update => {
            let same: Vec<String> = read_columns(rule)
                .iter()
                .map(|c| format!("{} <=> {}", col("OLD", c), col("NEW", c)))
                .collect();
            format!(
                "BEGIN IF NOT ({}) THEN {}; {}; END IF; END",
                same.join(" AND "),
                upsert(rule, "OLD", "-", galera),
                upsert(rule, "NEW", "", galera)
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

#[cfg(test)]
mod slot_tests {
    use super::slot_expr;

    #[test]
    fn one_server_keeps_the_connection_id_slot() {
        // Triggers installed before Galera support read the same: migrate finds them
        // fitting.
        assert_eq!(slot_expr(8, false), "CONNECTION_ID() % 8");
        let g = slot_expr(6, true);
        assert!(
            g.contains("@@auto_increment_offset") && g.ends_with("% 6"),
            "{g}"
        );
    }
}
