//! `heatsink advise` for partitions: lookups by a key whose values carry their
//! creation time, on a large table. The encoding is read from the literals observed
//! (the `hot_keys` heavy hitters, the samples): UUIDv7, ULID, snowflake, unix
//! seconds or milliseconds, or unix seconds between separators inside the key (a
//! `key_pattern`). UUIDv1 keys carry their time too, but the partition kind cannot
//! read it: they get a note. Deletes by age on the table name the partitioning
//! column and the retention.

use std::collections::BTreeMap;

use sqlparser::ast::{Expr, Statement};

use crate::advice::{sql, Advice, Entry, Observed, Proposal, Workload};

/// Times a key may carry: 2010-01-01 to a year from now (unix seconds).
const EARLIEST: u64 = 1_262_304_000;

/// Twitter's snowflake epoch (the kind's default), unix milliseconds.
const SNOWFLAKE_EPOCH_MS: u64 = 1_288_834_974_657;

/// Share of the observed literals that must decode the same way.
const AGREEING: f64 = 0.9;

/// How a key carries its time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Encoding {
    /// `key_time = "uuid_v7"`.
    UuidV7,
    /// A UUIDv1: time-carrying, but not a `key_time` the kind reads.
    UuidV1,
    /// `key_time = "ulid"`.
    Ulid,
    /// `key_time = "snowflake"`.
    Snowflake,
    /// `key_time = "unix_ms"`.
    UnixMs,
    /// `key_time = "unix"`, with a `key_pattern` when the seconds are inside the key.
    Unix(Option<String>),
}

impl Encoding {
    /// The rule's `key_time`.
    fn key_time(&self) -> Option<&'static str> {
        match self {
            Encoding::UuidV7 => Some("uuid_v7"),
            Encoding::UuidV1 => None,
            Encoding::Ulid => Some("ulid"),
            Encoding::Snowflake => Some("snowflake"),
            Encoding::UnixMs => Some("unix_ms"),
            Encoding::Unix(_) => Some("unix"),
        }
    }
}

fn plausible(secs: u64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (EARLIEST..=now + 366 * 86_400).contains(&secs)
}

/// The separator characters a `key_pattern` may name around the seconds.
fn separator(c: char) -> bool {
    matches!(c, '-' | '_' | ':' | '.' | '/' | '|')
}

/// How `key` carries a plausible time, if it does.
pub fn classify(key: &str) -> Option<Encoding> {
    let k = key.trim();
    let hex = |s: &str| s.chars().all(|c| c.is_ascii_hexdigit());
    let parts: Vec<&str> = k.split('-').collect();
    if parts.len() == 5
        && [8, 4, 4, 4, 12]
            .iter()
            .zip(&parts)
            .all(|(n, p)| p.len() == *n && hex(p))
    {
        let version = parts[2].chars().next()?;
        if version == '7' {
            let ms = u64::from_str_radix(&format!("{}{}", parts[0], parts[1]), 16).ok()?;
            return plausible(ms / 1000).then_some(Encoding::UuidV7);
        }
        if version == '1' {
            // 100 ns intervals since 1582-10-15: time_hi (12 bits), time_mid, time_low.
            let t = u64::from_str_radix(&format!("{}{}{}", &parts[2][1..], parts[1], parts[0]), 16)
                .ok()?;
            let secs = (t / 10_000_000).checked_sub(12_219_292_800)?;
            return plausible(secs).then_some(Encoding::UuidV1);
        }
        return None;
    }
    if k.len() == 26 {
        const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
        let mut ms: u64 = 0;
        let mut ok = true;
        for c in k[..10].chars() {
            match CROCKFORD.find(c.to_ascii_uppercase()) {
                Some(v) => ms = ms.saturating_mul(32).saturating_add(v as u64),
                None => ok = false,
            }
        }
        let rest_ok = k[10..]
            .chars()
            .all(|c| CROCKFORD.contains(c.to_ascii_uppercase()));
        if ok && rest_ok && plausible(ms / 1000) {
            return Some(Encoding::Ulid);
        }
    }
    if !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()) {
        let v: u64 = k.parse().ok()?;
        return match k.len() {
            10 => plausible(v).then_some(Encoding::Unix(None)),
            13 => plausible(v / 1000).then_some(Encoding::UnixMs),
            15..=19 => {
                plausible(((v >> 22) + SNOWFLAKE_EPOCH_MS) / 1000).then_some(Encoding::Snowflake)
            }
            _ => None,
        };
    }
    // Ten digits between separators (or at one end, next to a separator).
    let chars: Vec<char> = k.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        if i - start != 10 {
            continue;
        }
        let before = start.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i).copied();
        let delimited = |c: Option<char>| c.is_none_or(separator);
        if !(delimited(before) && delimited(after)) || (before.is_none() && after.is_none()) {
            continue;
        }
        let secs: u64 = chars[start..i].iter().collect::<String>().parse().ok()?;
        if !plausible(secs) {
            continue;
        }
        let esc = |c: char| {
            if c == '-' || c == '_' || c == ':' || c == '/' {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        };
        let pattern = match (before, after) {
            (Some(b), Some(a)) => format!("{}([0-9]{{10}}){}", esc(b), esc(a)),
            (None, Some(a)) => format!("^([0-9]{{10}}){}", esc(a)),
            (Some(b), None) => format!("{}([0-9]{{10}})$", esc(b)),
            (None, None) => continue,
        };
        return Some(Encoding::Unix(Some(pattern)));
    }
    None
}

/// The encoding most of `keys` share (at least [`AGREEING`] of them).
pub fn agreed(keys: &[String]) -> Option<Encoding> {
    if keys.is_empty() {
        return None;
    }
    let mut votes: BTreeMap<Encoding, usize> = BTreeMap::new();
    for k in keys {
        if let Some(e) = classify(k) {
            *votes.entry(e).or_default() += 1;
        }
    }
    let (e, n) = votes.into_iter().max_by_key(|(_, n)| *n)?;
    (n as f64 >= AGREEING * keys.len() as f64).then_some(e)
}

/// A lookup by one column of one table: (table, column), if `s` is one.
fn lookup(s: &Observed) -> Option<(String, String)> {
    let stmt = s.stmt.as_ref()?;
    let (from, selection) = match stmt {
        Statement::Query(q) => {
            let sel = sql::select_of(q)?;
            (sel.from.clone(), sel.selection.as_ref()?)
        }
        Statement::Update(u) => (vec![u.table.clone()], u.selection.as_ref()?),
        Statement::Delete(d) => match &d.from {
            sqlparser::ast::FromTable::WithFromKeyword(f)
            | sqlparser::ast::FromTable::WithoutKeyword(f) => (f.clone(), d.selection.as_ref()?),
        },
        _ => return None,
    };
    if from.len() != 1 || !from[0].joins.is_empty() || sql::has_derived(&from) {
        return None;
    }
    let (table, _) = sql::from_tables(&from).pop()?;
    let first = sql::conjuncts(selection).into_iter().next()?;
    let ((_, col), _) = sql::equality(first)?;
    Some((table, col))
}

/// A delete by age of `table`: the column compared and the days kept, when the
/// samples say (`INTERVAL n DAY`).
fn delete_by_age(s: &Observed, w: &Workload, table: &str) -> Option<(String, Option<u64>)> {
    let Some(Statement::Delete(d)) = &s.stmt else {
        return None;
    };
    let from = match &d.from {
        sqlparser::ast::FromTable::WithFromKeyword(f)
        | sqlparser::ast::FromTable::WithoutKeyword(f) => f,
    };
    let (t, _) = sql::from_tables(from).pop()?;
    if !sql::last(&t).eq_ignore_ascii_case(sql::last(table)) {
        return None;
    }
    let conj = sql::conjuncts(d.selection.as_ref()?);
    if conj.len() != 1 {
        return None;
    }
    let (_, col) = sql::range_column(conj[0])?;
    if w.table(s, table).is_some_and(|t| !t.is_temporal(&col)) {
        return None;
    }
    let days = s.samples.iter().find_map(|text| {
        let stmt = crate::rewrite::parse_statements(text).ok()?.pop()?;
        let mut found = None;
        let _ = sqlparser::ast::visit_expressions(&stmt, |e| {
            if let Expr::Interval(i) = e {
                let unit = i
                    .leading_field
                    .as_ref()
                    .map(|f| f.to_string().to_ascii_uppercase());
                if unit.as_deref() == Some("DAY") {
                    found = sql::integer(&i.value);
                }
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        found
    });
    Some((col, days))
}

/// Finds lookups by time-carrying keys.
pub fn advise(w: &Workload) -> Advice {
    let mut out = Advice::default();
    // db.table.column → (lookups, key column, table as written)
    let mut groups: BTreeMap<String, (Vec<&Observed>, String, String)> = BTreeMap::new();
    for s in &w.statements {
        let Some((table, col)) = lookup(s) else {
            continue;
        };
        let id = format!(
            "{}.{}.{col}",
            w.db_of(s, &table).unwrap_or_default(),
            sql::last(&table)
        )
        .to_ascii_lowercase();
        groups
            .entry(id)
            .or_insert_with(|| (Vec::new(), col.clone(), table.clone()))
            .0
            .push(s);
    }
    for (_, (lookups, key, table)) in groups {
        let first = lookups[0];
        let info = w.table(first, &table);
        if info
            .and_then(|t| t.auto_increment())
            .is_some_and(|c| c.name.eq_ignore_ascii_case(&key))
        {
            continue; // an auto-increment id carries no time
        }
        let mut keys: Vec<String> = Vec::new();
        for s in &lookups {
            if let Some(hk) = s
                .hot_keys
                .as_ref()
                .filter(|h| h.column.eq_ignore_ascii_case(&key))
            {
                keys.extend(hk.top.iter().map(|(k, _)| k.clone()));
            }
            for text in &s.samples {
                if let Some((c, lit)) = crate::rewrite::parse_statements(text)
                    .ok()
                    .and_then(|mut v| v.pop())
                    .and_then(|st| sql::first_equality_literal(&st))
                {
                    if c.eq_ignore_ascii_case(&key) {
                        keys.push(lit);
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        let Some(encoding) = agreed(&keys) else {
            continue;
        };
        let deletes: Vec<(&Observed, String, Option<u64>)> = w
            .on_table(first, &table)
            .filter_map(|s| delete_by_age(s, w, &table).map(|(c, d)| (s, c, d)))
            .collect();
        let mut answered = lookups.clone();
        answered.extend(deletes.iter().map(|(s, _, _)| *s));
        if !w.matters(&answered) {
            continue;
        }
        let Some(key_time) = encoding.key_time() else {
            out.notes.push(format!(
                "partition: {table} is looked up by {key}, whose values are UUIDv1 (time-carrying, but the partition kind reads UUIDv7, ULID, snowflake and unix times only): no rule proposed"
            ));
            continue;
        };
        let mut caveats = Vec::new();
        match w.is_large(first, &table) {
            Some(false) => continue,
            Some(true) => {}
            None => caveats.push(format!(
                "the size of {table} is unknown (no --backend-url): partitioning pays off on large tables only"
            )),
        }
        // The partitioning column: the deletes' by age, else the table's first
        // NOT NULL DATE/DATETIME column.
        let column = deletes.first().map(|(_, c, _)| c.clone()).or_else(|| {
            info.and_then(|t| {
                t.columns
                    .iter()
                    .find(|c| !c.nullable && matches!(c.data_type.as_str(), "date" | "datetime"))
                    .map(|c| c.name.clone())
            })
        });
        let Some(column) = column else {
            out.notes.push(format!(
                "partition: {table} is looked up by time-carrying keys ({key}), but it has no DATE or DATETIME column to partition by: no rule proposed"
            ));
            continue;
        };
        let retention = deletes.iter().find_map(|(_, _, d)| *d);
        if retention.is_none() {
            caveats.push(
                "retention_days = 30 is a placeholder: no delete by age with a literal interval was observed"
                    .to_string(),
            );
        }
        let retention = retention.unwrap_or(30);
        let logical = w.rule_table(first, &table);
        let name = format!("{}_by_day", crate::advice::ident(sql::last(&logical)));
        let mut e = Entry::new("partition")
            .kv("name", name.clone(), "")
            .kv("table", logical.clone(), "")
            .kv(
                "key",
                key.clone(),
                "looked up by it; its values carry their time",
            )
            .kv("key_time", key_time, "read from the observed keys");
        if let Encoding::Unix(Some(p)) = &encoding {
            e = e.kv("key_pattern", p.clone(), "group 1 holds the unix seconds");
        }
        let toml = e
            .kv("column", column.clone(), "partitioned by this column")
            .kv("period", "day", "")
            .kv("retention_days", retention as i64, "older days are dropped")
            .finish();
        let effect = "bench/results/partition.md (30M rows in 93 day partitions): lookups by key \
            3.30 × direct at 16 connections (p99 5.7 ms instead of 22.7 ms, 3 partitions \
            read instead of 93); expiring a day by dropping its partition took 1/469 of the \
            DELETE's time"
            .to_string();
        let mut p = Proposal::new(
            w,
            "partition",
            name,
            logical.clone(),
            toml,
            &answered,
            3.3,
            effect,
        )
        .set("key", &key)
        .set("key_time", key_time)
        .set("column", &column);
        if let Encoding::Unix(Some(pat)) = &encoding {
            p = p.set("key_pattern", pat);
        }
        p.evidence = vec![
            w.load_line(&answered),
            w.size_line(first, &table),
            format!(
                "{} distinct observed value(s) of {key}, e.g. '{}': {key_time} times",
                keys.len(),
                keys.first().cloned().unwrap_or_default()
            ),
        ];
        if !deletes.is_empty() {
            p.evidence.push(format!(
                "{} delete(s) by age on {column} ({} executions)",
                deletes.len(),
                deletes
                    .iter()
                    .map(|(s, _, _)| s.row.count_star)
                    .sum::<u64>()
            ));
        }
        let examined: u64 = lookups.iter().filter_map(|s| s.rows_examined).sum();
        let calls: u64 = lookups.iter().map(|s| s.row.count_star).sum();
        if examined > 0 && calls > 0 {
            p.evidence.push(format!(
                "the lookups examined {} rows per call on average",
                examined / calls
            ));
        }
        p.caveats = caveats;
        p.migrate = vec![
            format!("ALTER TABLE {logical} … PARTITION BY RANGE on {column}, one partition per day (the primary and unique keys extended by {column})"),
            format!("triggers on {logical} that refuse rows whose {key} and {column} disagree"),
            "then `heatsink maintain --job rotate --apply` hourly (cron): premakes days, drops expired ones".to_string(),
        ];
        out.proposals.push(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advice::testutil::{hot, row, table, workload};

    #[test]
    fn encodings_are_recognised() {
        assert_eq!(
            classify("0190b6a2-3f1c-7d2e-8a4b-9c0d1e2f3a4b"),
            Some(Encoding::UuidV7)
        );
        assert_eq!(classify("01J2XQ5Z8K3M4N5P6Q7R8S9T0V"), Some(Encoding::Ulid));
        assert_eq!(classify("1732406400"), Some(Encoding::Unix(None)));
        assert_eq!(classify("1732406400123"), Some(Encoding::UnixMs));
        assert_eq!(classify("1541815603606036480"), Some(Encoding::Snowflake));
        assert_eq!(
            classify("3f9c0a51d2-1732406400-7be1c4d09a"),
            Some(Encoding::Unix(Some("-([0-9]{10})-".into())))
        );
        assert_eq!(
            classify("1732406400_abc"),
            Some(Encoding::Unix(Some("^([0-9]{10})_".into())))
        );
        // UUIDv1 of 2024-11-24.
        assert_eq!(
            classify("c232ab00-aa3b-11ef-8000-0800200c9a66"),
            Some(Encoding::UuidV1)
        );
        for plain in [
            "42",
            "123456",
            "9999999999",
            "ab-cd",
            "550e8400-e29b-41d4-a716-446655440000",
        ] {
            assert_eq!(classify(plain), None, "{plain}");
        }
    }

    fn messages() -> crate::advice::TableInfo {
        table(
            "messages",
            100_000,
            &[
                ("id", "bigint auto"),
                ("uuid", "varchar"),
                ("body", "text"),
                ("inserted", "datetime"),
            ],
            &[&["id"], &["uuid"]],
        )
    }

    #[test]
    fn time_carrying_lookups_make_a_partition() {
        let keys = [
            ("a1-1732406400-ff", 3),
            ("b2-1732406401-ee", 2),
            ("c3-1732406500-dd", 1),
        ];
        let mut w = workload(
            vec![
                hot(
                    row("SELECT body FROM messages WHERE uuid = ?", 1000, 500_000),
                    "uuid",
                    900,
                    &keys,
                ),
                row(
                    "DELETE FROM messages WHERE inserted < NOW() - INTERVAL ? DAY",
                    2,
                    400_000,
                ),
            ],
            vec![messages()],
        );
        w.statements[1].samples =
            vec!["DELETE FROM messages WHERE inserted < NOW() - INTERVAL 14 DAY".into()];
        let a = advise(&w);
        assert_eq!(a.proposals.len(), 1, "{a:?}");
        let p = &a.proposals[0];
        assert_eq!(p.settings["key_time"], serde_json::json!("unix"));
        assert_eq!(
            p.settings["key_pattern"],
            serde_json::json!("-([0-9]{10})-")
        );
        assert_eq!(p.settings["column"], serde_json::json!("inserted"));
        assert!(p.toml.contains("retention_days = 14"), "{}", p.toml);
        assert_eq!(p.digests.len(), 2);
    }

    #[test]
    fn lookups_by_an_id_are_not_partitions() {
        let w = workload(
            vec![
                hot(
                    row("SELECT body FROM messages WHERE id = ?", 1000, 500_000),
                    "id",
                    900,
                    &[("12345", 3)],
                ),
                hot(
                    row("SELECT body FROM messages WHERE uuid = ?", 1000, 500_000),
                    "uuid",
                    900,
                    &[("550e8400-e29b-41d4-a716-446655440000", 2)],
                ),
            ],
            vec![messages()],
        );
        assert!(advise(&w).proposals.is_empty());
    }
}
