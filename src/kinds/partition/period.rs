//! Partition periods (`period = "hour"`, `"day"`, `"month"`): where each period
//! starts, what its partition is called and the bound it is declared with.
//!
//! Times here are wall-clock times as the server writes them in a `DATETIME` (no
//! time zone): [`Stamp`]s, seconds since 1970-01-01 00:00:00 of that calendar.
//! Partition bounds, `NOW()` and the partition column are all such times, so the
//! arithmetic never meets a time zone.

use super::spec::{PartitionSpec, Period};
pub use crate::kinds::calendar::{civil, Day};

/// A wall-clock time: seconds since 1970-01-01 00:00:00 (proleptic Gregorian).
pub type Stamp = i64;

/// Seconds of a day.
pub const DAY_SECS: i64 = 86_400;

/// Seconds of an hour.
pub const HOUR_SECS: i64 = 3_600;

/// A `YYYY-MM-DD` or `YYYY-MM-DD HH:MM:SS[.ffffff]` text (quotes allowed around it,
/// as `information_schema.PARTITIONS` writes bounds) as a [`Stamp`]; the fraction
/// is ignored.
pub fn parse_stamp(s: &str) -> Option<Stamp> {
    let s = s.trim().trim_matches('\'');
    let day = parse_day(s)?;
    let rest = s.get(10..).unwrap_or("");
    let secs = if rest.trim().is_empty() {
        0
    } else {
        let t = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('T'))?;
        let mut it = t.get(..8)?.split(':');
        let h: i64 = it.next()?.parse().ok()?;
        let m: i64 = it.next()?.parse().ok()?;
        let sec: i64 = it.next()?.parse().ok()?;
        if !(0..24).contains(&h) || !(0..60).contains(&m) || !(0..60).contains(&sec) {
            return None;
        }
        h * HOUR_SECS + m * 60 + sec
    };
    Some(day * DAY_SECS + secs)
}

/// `YYYY-MM-DD` at midnight, else `YYYY-MM-DD HH:MM:SS`.
pub fn stamp_sql(t: Stamp) -> String {
    let (y, m, d) = civil(t.div_euclid(DAY_SECS));
    let s = t.rem_euclid(DAY_SECS);
    if s == 0 {
        format!("{y:04}-{m:02}-{d:02}")
    } else {
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
            s / HOUR_SECS,
            s % HOUR_SECS / 60,
            s % 60
        )
    }
}

/// The first day of the month `months` months after the month of day `z`.
fn month_start(z: Day, months: i64) -> Day {
    let (y, m, _) = civil(z);
    let index = y * 12 + (m - 1) + months;
    let (y, m) = (index.div_euclid(12), index.rem_euclid(12) + 1);
    parse_day(&format!("{y:04}-{m:02}-01")).unwrap_or(z)
}

impl Period {
    /// The rule-file word (`"hour"`).
    pub fn word(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The start of the period holding `t`.
    pub fn floor(self, t: Stamp) -> Stamp {
        match self {
            Period::Hour => t - t.rem_euclid(HOUR_SECS),
            Period::Day => t - t.rem_euclid(DAY_SECS),
            Period::Month => month_start(t.div_euclid(DAY_SECS), 0) * DAY_SECS,
        }
    }

    /// The start of the period `n` periods after the one holding `t` (before it
    /// for a negative `n`).
    pub fn add(self, t: Stamp, n: i64) -> Stamp {
        let start = self.floor(t);
        match self {
            Period::Hour => start + n * HOUR_SECS,
            Period::Day => start + n * DAY_SECS,
            Period::Month => month_start(start.div_euclid(DAY_SECS), n) * DAY_SECS,
        }
    }

    /// The name of the partition of the period starting at `start`: `pYYYYMMDDHH`,
    /// `pYYYYMMDD` or `pYYYYMM`.
    pub fn name(self, start: Stamp) -> String {
        let (y, m, d) = civil(start.div_euclid(DAY_SECS));
        match self {
            Period::Hour => format!(
                "p{y:04}{m:02}{d:02}{:02}",
                start.rem_euclid(DAY_SECS) / HOUR_SECS
            ),
            Period::Day => format!("p{y:04}{m:02}{d:02}"),
            Period::Month => format!("p{y:04}{m:02}"),
        }
    }

    /// The bound a partition ending at `end` is declared with: `'YYYY-MM-DD'`, or
    /// `'YYYY-MM-DD HH:00:00'` for hours.
    pub fn bound_sql(self, end: Stamp) -> String {
        match self {
            Period::Hour => {
                let (y, m, d) = civil(end.div_euclid(DAY_SECS));
                format!(
                    "'{y:04}-{m:02}-{d:02} {:02}:00:00'",
                    end.rem_euclid(DAY_SECS) / HOUR_SECS
                )
            }
            Period::Day | Period::Month => format!("'{}'", stamp_sql(end)),
        }
    }

    /// `PARTITION <name> VALUES LESS THAN (<bound>)` for each period from the one
    /// holding `from` to the one holding `to`.
    pub fn partitions(self, from: Stamp, to: Stamp) -> Vec<String> {
        let mut out = Vec::new();
        let mut start = self.floor(from);
        let last = self.floor(to);
        while start <= last {
            let end = self.add(start, 1);
            out.push(format!(
                "PARTITION {} VALUES LESS THAN ({})",
                self.name(start),
                self.bound_sql(end)
            ));
            start = end;
        }
        out
    }

    /// The partitions a rule keeps at most: `retention_days` back and `premake`
    /// periods ahead of the current one, with the catch-all.
    pub fn kept(self, retention_days: u32, premake: u32) -> u64 {
        let back = match self {
            Period::Hour => u64::from(retention_days) * 24,
            Period::Day => u64::from(retention_days),
            Period::Month => u64::from(retention_days).div_ceil(28),
        };
        back + u64::from(premake) + 2
    }
}

/// Days since 1970-01-01 of a `YYYY-MM-DD` date.
pub fn parse_day(s: &str) -> Option<Day> {
    let s = s.trim().trim_matches('\'');
    let mut it = s.get(..10)?.split('-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: i64 = it.next()?.parse().ok()?;
    let d: i64 = it.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    Some(crate::kinds::calendar::days_from_civil(y, m, d))
}

/// `YYYY-MM-DD`.
pub fn day_sql(z: Day) -> String {
    let (y, m, d) = civil(z);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The catch-all partition's definition.
pub const CATCH_ALL: &str = "PARTITION pmax VALUES LESS THAN (MAXVALUE)";

/// The first time a rule keeps at `now`: `retention_days` days before the current
/// hour (hourly partitions) or day.
pub fn keep_from(spec: &PartitionSpec, now: Stamp) -> Stamp {
    let unit = if spec.period == Period::Hour {
        HOUR_SECS
    } else {
        DAY_SECS
    };
    now - now.rem_euclid(unit) - i64::from(spec.retention_days) * DAY_SECS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_start_name_and_bound_their_partitions() {
        let t = parse_stamp("2024-12-31 23:45:10.5").unwrap();
        assert_eq!(stamp_sql(t), "2024-12-31 23:45:10");
        assert_eq!(
            parse_stamp("'2025-01-01'"),
            parse_stamp("2025-01-01 00:00:00")
        );
        assert_eq!(
            Period::Hour.partitions(t, t + HOUR_SECS),
            [
                "PARTITION p2024123123 VALUES LESS THAN ('2025-01-01 00:00:00')",
                "PARTITION p2025010100 VALUES LESS THAN ('2025-01-01 01:00:00')"
            ]
        );
        assert_eq!(
            Period::Day.partitions(t, t),
            ["PARTITION p20241231 VALUES LESS THAN ('2025-01-01')"]
        );
        assert_eq!(
            Period::Month.partitions(t, Period::Month.add(t, 2)),
            [
                "PARTITION p202412 VALUES LESS THAN ('2025-01-01')",
                "PARTITION p202501 VALUES LESS THAN ('2025-02-01')",
                "PARTITION p202502 VALUES LESS THAN ('2025-03-01')"
            ]
        );
        assert_eq!(stamp_sql(Period::Month.add(t, -12)), "2023-12-01");
        assert_eq!(Period::Hour.kept(30, 3), 725);
        assert!(parse_stamp("2025-01-01 24:00:00").is_none());
    }
}
