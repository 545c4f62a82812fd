//! The digest row contract (docs/design.md, "Query digests"): one row type for what
//! `SHOW DIGESTS` and `GET /digests` print and what `heatsink advise` reads, and the
//! conversions into it from each source — the digest table's own rows, the admin
//! port's `SHOW DIGESTS` result, a JSON dump of it, and `performance_schema`'s
//! `events_statements_summary_by_digest`.
//!
//! Values are kept as the contract prints them (times as `YYYY-MM-DD HH:MM:SS` UTC,
//! the handling as its label, `hot_keys` as its JSON text): a row read back from
//! any source compares equal to the row that was printed.

use serde::{Deserialize, Deserializer, Serialize};

use super::{Handling, Row, CODES_SHOWN};

/// One row of `SHOW DIGESTS` (and of a `--digests` dump): a statement shape and what
/// its executions cost. Unknown keys are ignored; missing ones take their empty value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct DigestRow {
    /// 16 hex digits: FNV-1a 64 of `digest_text` (of performance_schema's digest,
    /// its first 16 digits).
    pub digest: String,
    /// The session's default database when the statement ran.
    pub schema_name: Option<String>,
    /// The client's user name (`None` where the source does not say).
    pub user: Option<String>,
    /// The fingerprint: literals as `?`, IN lists collapsed to `IN (...)`.
    pub digest_text: String,
    /// Executions.
    pub count_star: u64,
    /// `YYYY-MM-DD HH:MM:SS` UTC.
    pub first_seen: Option<String>,
    /// `YYYY-MM-DD HH:MM:SS` UTC.
    pub last_seen: Option<String>,
    /// Total latency, µs.
    pub sum_time_us: u64,
    /// Fastest execution, µs.
    pub min_time_us: u64,
    /// Slowest execution, µs.
    pub max_time_us: u64,
    /// 99th percentile latency, µs (the top of its histogram bucket, within min and
    /// max; performance_schema keeps none, so there the maximum).
    pub p99_time_us: u64,
    /// Rows of result sets.
    pub rows_sent: u64,
    /// Affected rows of OK packets.
    pub rows_affected: u64,
    /// Statements answered with ERR.
    pub errors: u64,
    /// `code:count` pairs, most frequent first (`1213:3,1205:1`), at most
    /// [`CODES_SHOWN`]; empty when none.
    pub error_codes: Option<String>,
    /// `passthrough`, `rewritten`, `fallback`, `refused` or `shadow` (the most
    /// frequent).
    pub handling: Option<String>,
    /// The rule that handled it (last), if any.
    pub rule: Option<String>,
    /// JSON text: the first `column = value` equality's heavy hitters (a dump may
    /// hold it as a JSON object, as `GET /digests` prints it, or as a string).
    #[serde(deserialize_with = "json_text")]
    pub hot_keys: Option<String>,
    /// COM_STMT_PREPAREs of the statement (its executes are in `count_star`; 0 when
    /// the source does not say).
    pub prepares: u64,
}

/// `hot_keys` of a dump: a JSON object (as `GET /digests` prints it) kept as its
/// text, a string as it is, null as none.
fn json_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s),
        other => Some(other.to_string()),
    })
}

/// Columns `SHOW DIGESTS` may be ordered by.
pub const ORDER_COLUMNS: &[&str] = &[
    "count_star",
    "first_seen",
    "last_seen",
    "sum_time_us",
    "min_time_us",
    "max_time_us",
    "p99_time_us",
    "rows_sent",
    "rows_affected",
    "errors",
    "prepares",
];

/// A value to order rows by: a count, or a time as printed (fixed width, so its
/// text orders as the time does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OrderValue<'a> {
    /// A count or a duration.
    Number(u64),
    /// A `YYYY-MM-DD HH:MM:SS` time.
    Time(Option<&'a str>),
}

impl DigestRow {
    /// The value of an [`ORDER_COLUMNS`] column.
    pub fn order_value(&self, column: &str) -> Option<OrderValue<'_>> {
        Some(OrderValue::Number(match column {
            "count_star" => self.count_star,
            "first_seen" => return Some(OrderValue::Time(self.first_seen.as_deref())),
            "last_seen" => return Some(OrderValue::Time(self.last_seen.as_deref())),
            "sum_time_us" => self.sum_time_us,
            "min_time_us" => self.min_time_us,
            "max_time_us" => self.max_time_us,
            "p99_time_us" => self.p99_time_us,
            "rows_sent" => self.rows_sent,
            "rows_affected" => self.rows_affected,
            "errors" => self.errors,
            "prepares" => self.prepares,
            _ => return None,
        }))
    }

    /// How many executions ended in error `code`.
    pub fn errors_with(&self, code: u32) -> u64 {
        self.error_codes
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .filter_map(|pair| pair.trim().split_once(':'))
            .filter(|(c, _)| c.trim().parse::<u32>().ok() == Some(code))
            .filter_map(|(_, n)| n.trim().parse::<u64>().ok())
            .sum()
    }

    /// The row as a JSON object with the contract's keys (`hot_keys` as an object).
    pub fn json(&self) -> String {
        let mut o = String::with_capacity(256 + self.digest_text.len());
        let s = |o: &mut String, k: &str, v: Option<&str>| {
            o.push('"');
            o.push_str(k);
            o.push_str("\":");
            match v {
                Some(v) => super::json_string(o, v),
                None => o.push_str("null"),
            }
        };
        o.push('{');
        s(&mut o, "digest", Some(&self.digest));
        o.push(',');
        s(&mut o, "schema_name", self.schema_name.as_deref());
        o.push(',');
        s(&mut o, "user", self.user.as_deref());
        o.push(',');
        s(&mut o, "digest_text", Some(&self.digest_text));
        let num = |o: &mut String, k: &str, v: u64| o.push_str(&format!(",\"{k}\":{v}"));
        num(&mut o, "count_star", self.count_star);
        o.push(',');
        s(&mut o, "first_seen", self.first_seen.as_deref());
        o.push(',');
        s(&mut o, "last_seen", self.last_seen.as_deref());
        num(&mut o, "sum_time_us", self.sum_time_us);
        num(&mut o, "min_time_us", self.min_time_us);
        num(&mut o, "max_time_us", self.max_time_us);
        num(&mut o, "p99_time_us", self.p99_time_us);
        num(&mut o, "rows_sent", self.rows_sent);
        num(&mut o, "rows_affected", self.rows_affected);
        num(&mut o, "errors", self.errors);
        o.push(',');
        s(&mut o, "error_codes", self.error_codes.as_deref());
        o.push(',');
        s(&mut o, "handling", self.handling.as_deref());
        o.push(',');
        s(&mut o, "rule", self.rule.as_deref());
        o.push_str(",\"hot_keys\":");
        match &self.hot_keys {
            Some(h) => o.push_str(h),
            None => o.push_str("null"),
        }
        num(&mut o, "prepares", self.prepares);
        o.push('}');
        o
    }

    // -----------------------------------------------------------------------------
    // Sources
    // -----------------------------------------------------------------------------

    /// A row of the digest table, as `SHOW DIGESTS` shows it.
    pub(super) fn from_table(r: &Row) -> DigestRow {
        let mut codes = r.codes.clone();
        codes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let error_codes = codes
            .iter()
            .take(CODES_SHOWN)
            .map(|(c, n)| format!("{c}:{n}"))
            .collect::<Vec<_>>()
            .join(",");
        let (mut best, mut most) = (Handling::Passthrough, 0);
        for h in Handling::ALL {
            if r.handling[h.index()] > most {
                (best, most) = (h, r.handling[h.index()]);
            }
        }
        DigestRow {
            digest: format!("{:016x}", r.digest),
            schema_name: r.schema.as_deref().map(str::to_string),
            user: Some(r.user.to_string()),
            digest_text: r.text.to_string(),
            count_star: r.count,
            first_seen: Some(crate::refusals::utc(r.first_seen)),
            last_seen: Some(crate::refusals::utc(r.last_seen)),
            sum_time_us: r.sum_us,
            min_time_us: if r.count == 0 { 0 } else { r.min_us },
            max_time_us: r.max_us,
            p99_time_us: r.p99(),
            rows_sent: r.rows_sent,
            rows_affected: r.rows_affected,
            errors: r.errors,
            error_codes: Some(error_codes),
            handling: Some(best.label().to_string()),
            rule: r.rule.as_deref().map(str::to_string),
            hot_keys: r.hot.as_ref().map(|h| h.json()),
            prepares: r.prepares,
        }
    }

    /// The rows of a dump: a JSON array of rows (`GET /digests`, or `SHOW DIGESTS`
    /// written out with `hot_keys` as a string).
    pub fn from_json_array(text: &str) -> serde_json::Result<Vec<DigestRow>> {
        serde_json::from_str(text)
    }

    /// A row of `SHOW DIGESTS` read from the admin port (columns by name).
    pub fn from_show_digests(r: &mysql_async::Row) -> DigestRow {
        let named = |col: &str| cell_named(r, col);
        let number = |col: &str| {
            named(col)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map_or(0, |v| v.max(0.0) as u64)
        };
        DigestRow {
            digest: named("digest").unwrap_or_default(),
            schema_name: named("schema_name"),
            user: named("user"),
            digest_text: named("digest_text").unwrap_or_default(),
            count_star: number("count_star"),
            first_seen: named("first_seen"),
            last_seen: named("last_seen"),
            sum_time_us: number("sum_time_us"),
            min_time_us: number("min_time_us"),
            max_time_us: number("max_time_us"),
            p99_time_us: number("p99_time_us"),
            rows_sent: number("rows_sent"),
            rows_affected: number("rows_affected"),
            errors: number("errors"),
            error_codes: named("error_codes"),
            handling: named("handling"),
            rule: named("rule"),
            hot_keys: named("hot_keys"),
            prepares: number("prepares"),
        }
    }

    /// A row of [`SUMMARY_BY_DIGEST`] (picoseconds made µs; MariaDB keeps no
    /// percentiles, so `p99_time_us` is the maximum; no user, handling passthrough,
    /// no prepares counted), and the rows it says the server examined.
    pub fn from_summary_by_digest(r: &mysql_async::Row) -> (DigestRow, u64) {
        let us = |i: usize| -> u64 {
            cell_text(r, i)
                .and_then(|v| v.parse::<u128>().ok())
                .map_or(0, |ps| (ps / 1_000_000) as u64)
        };
        let n = |i: usize| -> u64 { cell_text(r, i).and_then(|v| v.parse().ok()).unwrap_or(0) };
        let max = us(6);
        let row = DigestRow {
            digest: cell_text(r, 0)
                .unwrap_or_default()
                .chars()
                .take(16)
                .collect(),
            schema_name: cell_text(r, 1),
            user: None,
            digest_text: cell_text(r, 2).unwrap_or_default(),
            count_star: n(3),
            first_seen: cell_text(r, 11),
            last_seen: cell_text(r, 12),
            sum_time_us: us(4),
            min_time_us: us(5),
            max_time_us: max,
            p99_time_us: max,
            rows_sent: n(7),
            rows_affected: n(8),
            errors: n(10),
            error_codes: None,
            handling: Some(Handling::Passthrough.label().to_string()),
            rule: None,
            hot_keys: None,
            prepares: 0,
        };
        (row, n(9))
    }
}

/// The digest summary [`DigestRow::from_summary_by_digest`] reads (times as UTC
/// once the session's `time_zone` is `+00:00`).
pub const SUMMARY_BY_DIGEST: &str = "SELECT DIGEST, SCHEMA_NAME, DIGEST_TEXT, COUNT_STAR, \
        SUM_TIMER_WAIT, MIN_TIMER_WAIT, MAX_TIMER_WAIT, SUM_ROWS_SENT, SUM_ROWS_AFFECTED, \
        SUM_ROWS_EXAMINED, SUM_ERRORS, \
        DATE_FORMAT(FIRST_SEEN, '%Y-%m-%d %H:%i:%s'), \
        DATE_FORMAT(LAST_SEEN, '%Y-%m-%d %H:%i:%s') \
     FROM performance_schema.events_statements_summary_by_digest \
     WHERE DIGEST IS NOT NULL AND DIGEST_TEXT IS NOT NULL";

/// A cell as text, whatever type the protocol carried it as (NULL: `None`).
pub fn cell_text(row: &mysql_async::Row, i: usize) -> Option<String> {
    use mysql_async::Value;
    match row.as_ref(i)? {
        Value::NULL => None,
        Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Int(n) => Some(n.to_string()),
        Value::UInt(n) => Some(n.to_string()),
        Value::Float(f) => Some(f.to_string()),
        Value::Double(f) => Some(f.to_string()),
        other => Some(other.as_sql(true).trim_matches('\'').to_string()),
    }
}

/// The value of a named column, as text.
pub fn cell_named(row: &mysql_async::Row, col: &str) -> Option<String> {
    let i = row
        .columns_ref()
        .iter()
        .position(|c| c.name_str().eq_ignore_ascii_case(col))?;
    cell_text(row, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_row_reads_back_the_same() {
        let row = DigestRow {
            digest: "00000000000000ab".into(),
            schema_name: Some("db".into()),
            user: Some("u\"".into()),
            digest_text: "SELECT c FROM t WHERE id = ?".into(),
            count_star: 3,
            first_seen: Some("2026-11-27 18:00:00".into()),
            last_seen: Some("2026-11-27 18:00:05".into()),
            sum_time_us: 30,
            min_time_us: 5,
            max_time_us: 15,
            p99_time_us: 15,
            rows_sent: 3,
            rows_affected: 0,
            errors: 1,
            error_codes: Some("1213:1".into()),
            handling: Some("passthrough".into()),
            rule: None,
            hot_keys: Some(r#"{"column":"id","distinct":2,"top":[["7",2]]}"#.into()),
            prepares: 1,
        };
        // As GET /digests prints it: hot_keys an object.
        let dump = format!("[{}]", row.json());
        assert_eq!(
            DigestRow::from_json_array(&dump).unwrap(),
            vec![row.clone()]
        );
        // hot_keys as a string, keys missing or unknown.
        let v = serde_json::json!([{
            "digest": "00000000000000ab",
            "hot_keys": row.hot_keys,
            "extra": 1,
        }]);
        let read = DigestRow::from_json_array(&v.to_string()).unwrap();
        assert_eq!(read[0].hot_keys, row.hot_keys);
        assert_eq!((read[0].count_star, read[0].user.as_deref()), (0, None));
    }

    #[test]
    fn order_values() {
        let a = DigestRow {
            first_seen: Some("2026-11-27 09:59:59".into()),
            count_star: 9,
            ..DigestRow::default()
        };
        let b = DigestRow {
            first_seen: Some("2026-11-27 10:00:00".into()),
            count_star: 10,
            ..DigestRow::default()
        };
        for col in ORDER_COLUMNS {
            assert!(a.order_value(col).is_some(), "{col}");
        }
        assert!(a.order_value("first_seen") < b.order_value("first_seen"));
        assert!(a.order_value("count_star") < b.order_value("count_star"));
        assert_eq!(a.order_value("digest_text"), None);
    }
}
