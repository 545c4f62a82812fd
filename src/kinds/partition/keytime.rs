//! The SQL that reads a key's creation time on the server, in the session's time
//! zone, from the key as the statement wrote it (a literal or a parameter).
//!
//! Every expression is a constant expression of the key, so MariaDB folds it before
//! partition pruning (text statements, and prepared ones at execute). Traps measured
//! on MariaDB 10.11 (docs/design.md): `REGEXP_SUBSTR` of a non-matching key is `''`,
//! `FROM_UNIXTIME('')` is 1970-01-01, `FROM_UNIXTIME` beyond 2038-01-19 is NULL, and
//! `… OR x IS NULL` is not folded before pruning. So each key's readability is an
//! explicit condition, and an unreadable key (NULL included) widens the range to
//! every partition rather than to a wrong one. The conversions only ever see text
//! the condition has checked, so they raise no warnings.

use super::spec::KeyTime;

/// Largest unix second `FROM_UNIXTIME` answers on MariaDB 10.11.
const MAX_UNIX: u64 = 2_147_483_647;

/// Crockford's base-32 alphabet (ULID).
const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// How a rule reads the time out of a key.
#[derive(Debug, Clone)]
pub struct KeyTimeSql {
    /// The encoding.
    pub kind: KeyTime,
    /// Group 1 of this pattern holds the time (`None`: the whole key).
    pub pattern: Option<String>,
    /// Snowflake epoch, unix milliseconds.
    pub epoch_ms: u64,
    /// Hourly partitions: [`KeyTimeSql::range`] of a DATETIME column is the key's
    /// hour ± `24 × tolerance` hours rather than its date ± `tolerance` days.
    pub hourly: bool,
}

impl KeyTimeSql {
    /// The part of `key` (SQL text) holding the time: the key itself, or group 1 of
    /// the pattern's first match; `''` when the pattern does not match (the whole
    /// pattern is optional, so a key without a match is consumed by the final `.*`
    /// with group 1 unset).
    fn part(&self, key: &str) -> String {
        match &self.pattern {
            None => key.to_string(),
            Some(p) => format!(
                "REGEXP_REPLACE({key}, '(?s)^(?:.*?(?:{p}))?.*$', CONVERT(UNHEX('5C31') USING utf8mb4))"
            ),
        }
    }

    /// A condition true exactly when the time in `key` can be read (false or NULL
    /// otherwise), with seconds in `FROM_UNIXTIME`'s range.
    pub fn readable(&self, key: &str) -> String {
        let part = self.part(key);
        let shape = match self.kind {
            KeyTime::Unix => format!("{part} REGEXP '^[0-9]{{1,10}}$'"),
            KeyTime::UnixMs => format!("{part} REGEXP '^[0-9]{{1,13}}$'"),
            KeyTime::Snowflake => format!("{part} REGEXP '^[0-9]{{1,19}}$'"),
            KeyTime::UuidV7 => format!("{part} REGEXP '^[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-'"),
            KeyTime::Ulid => format!("{part} REGEXP '^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{{9}}'"),
        };
        format!("({shape} AND {} <= {MAX_UNIX})", self.seconds(key))
    }

    /// The key's creation time in unix seconds (integer); only meaningful where
    /// [`KeyTimeSql::readable`]. Decimal text is read with `CONV(part, 10, 10)`, which
    /// stops at the first other character and never warns: MariaDB evaluates
    /// constant parts of a DELETE's condition on their own, and a `CAST` of other
    /// text would warn (found by the differential test).
    pub fn seconds(&self, key: &str) -> String {
        let part = self.part(key);
        let number = format!("CAST(CONV({part}, 10, 10) AS UNSIGNED)");
        match self.kind {
            KeyTime::Unix => number,
            KeyTime::UnixMs => format!("{number} DIV 1000"),
            KeyTime::Snowflake => format!("(({number} >> 22) + {}) DIV 1000", self.epoch_ms),
            KeyTime::UuidV7 => format!(
                "CAST(CONV(CONCAT(SUBSTR({part}, 1, 8), SUBSTR({part}, 10, 4)), 16, 10) AS UNSIGNED) DIV 1000"
            ),
            KeyTime::Ulid => {
                let digits: Vec<String> = (1..=10u32)
                    .map(|i| {
                        format!(
                            "GREATEST(LOCATE(UPPER(SUBSTR({part}, {i}, 1)), '{CROCKFORD}') - 1, 0) * {}",
                            32u64.pow(10 - i)
                        )
                    })
                    .collect();
                format!("({}) DIV 1000", digits.join(" + "))
            }
        }
    }

    /// The key's creation date in the session's time zone.
    pub fn date(&self, key: &str) -> String {
        format!("DATE(FROM_UNIXTIME({}))", self.seconds(key))
    }

    /// The key's creation time (to the second) in the session's time zone.
    pub fn datetime(&self, key: &str) -> String {
        format!("FROM_UNIXTIME({})", self.seconds(key))
    }

    /// The start of the key's hour in the session's time zone (a DATETIME).
    pub fn hour(&self, key: &str) -> String {
        format!(
            "CAST(DATE_FORMAT({}, '%Y-%m-%d %H:00:00') AS DATETIME)",
            self.datetime(key)
        )
    }

    /// The condition that a row with key `key` and `col` may exist: `col` within the
    /// key's date ± `tolerance` days (for [`KeyTimeSql::hourly`] rules and a
    /// DATETIME column: within the key's hour ± `24 × tolerance` hours), or every
    /// value when the key's time cannot be read. `datetime`: `col` is a DATETIME
    /// (the last day's or hour's end is included).
    pub fn range(&self, key: &str, col: &str, tolerance: u32, datetime: bool) -> String {
        let ok = self.readable(key);
        if self.hourly && datetime {
            let h = self.hour(key);
            let hours = 24 * u64::from(tolerance);
            let last_micro = (hours + 1) * 3_600_000_000 - 1;
            return format!(
                "{col} BETWEEN IF({ok}, {h} - INTERVAL {hours} HOUR, '1000-01-01 00:00:00') AND IF({ok}, {h} + INTERVAL {last_micro} MICROSECOND, '9999-12-31 23:59:59.999999')"
            );
        }
        let d = self.date(key);
        let (hi, top) = if datetime {
            (
                format!("TIMESTAMP({d} + INTERVAL {tolerance} DAY, '23:59:59.999999')"),
                "'9999-12-31 23:59:59.999999'",
            )
        } else {
            (format!("{d} + INTERVAL {tolerance} DAY"), "'9999-12-31'")
        };
        format!(
            "{col} BETWEEN IF({ok}, {d} - INTERVAL {tolerance} DAY, '1000-01-01') AND IF({ok}, {hi}, {top})"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_reads_through_the_key_part() {
        for kind in [
            KeyTime::Unix,
            KeyTime::UnixMs,
            KeyTime::UuidV7,
            KeyTime::Ulid,
            KeyTime::Snowflake,
        ] {
            let k = KeyTimeSql {
                kind,
                pattern: Some("-([0-9]{10})-".into()),
                epoch_ms: 1,
                hourly: kind == KeyTime::Unix,
            };
            let r = k.range("?1", "`m`.`Inserted`", 1, true);
            crate::rewrite::parse_statements(&format!("SELECT 1 FROM t WHERE {r}"))
                .unwrap_or_else(|e| panic!("{kind:?}: {e}: {r}"));
            assert!(r.contains("(?:-([0-9]{10})-))?.*$'"), "{r}");
            assert_eq!(
                r.contains("INTERVAL 24 HOUR") && r.contains("INTERVAL 89999999999 MICROSECOND"),
                k.hourly,
                "{r}"
            );
        }
    }
}
