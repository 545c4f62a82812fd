//! The `[[partition]]` rule-file section and its validation.
//!
//! ```toml
//! [[partition]]
//! name = "messages_by_day"
//! table = "Messages"
//! key = "UUID"                   # the column whose values carry their creation time
//! key_time = "unix"              # "unix", "unix_ms", "uuid_v7", "ulid", "snowflake"
//! key_pattern = "-([0-9]{10})-"  # optional regex; group 1 holds the time
//! snowflake_epoch_ms = 1288834974657   # only for "snowflake"
//! column = "Inserted"            # DATE or DATETIME column the table is partitioned by
//! period = "day"                 # or "hour" (a DATETIME column), "month"
//! retention_days = 30            # partitions wholly older than this many days are dropped
//! premake = 3                    # future partitions (periods) kept ready
//! tolerance_days = 1             # how far `column` may lie from the key's time
//! migrate_max_rows = 1000000     # larger tables: migrate prints an online schema change
//! ```

use serde::Deserialize;

use crate::rules::spec::{check_ident, Mode, TableName};

/// `[[partition]]`: lookups by a key that carries its creation time, pruned to the
/// partitions of that time; hourly, daily or monthly partitions rotated.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSpec {
    /// Unique rule name (metrics, logs, errors).
    pub name: String,
    /// The partitioned table (`table` or `db.table`).
    pub table: String,
    /// The column whose values carry their creation time.
    pub key: String,
    /// How the time is written in the key.
    pub key_time: KeyTime,
    /// A regular expression whose group 1 is the part of the key holding the time;
    /// without it the whole key is.
    #[serde(default)]
    pub key_pattern: Option<String>,
    /// The epoch of snowflake ids, in unix milliseconds.
    #[serde(default)]
    pub snowflake_epoch_ms: Option<u64>,
    /// The DATE or DATETIME column the table is partitioned by.
    pub column: String,
    /// Partition width.
    #[serde(default)]
    pub period: Period,
    /// Partitions wholly older than this many days (before `CURDATE()`) are dropped.
    pub retention_days: u32,
    /// Future partitions kept ready: periods after the current one.
    #[serde(default = "default_premake")]
    pub premake: u32,
    /// How many days `column` may lie from the key's date (for hourly partitions:
    /// `24 × tolerance_days` hours from the key's hour).
    #[serde(default = "default_tolerance")]
    pub tolerance_days: u32,
    /// `on` (default) or `shadow`.
    #[serde(default)]
    pub mode: Mode,
    /// Largest table `migrate --apply` partitions in place with an `ALTER TABLE`
    /// (which copies the table and blocks its writes meanwhile); a larger one gets
    /// the `pt-online-schema-change` command to run instead.
    #[serde(default = "default_migrate_max_rows")]
    pub migrate_max_rows: u64,
}

/// How a key carries its creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyTime {
    /// Decimal unix seconds.
    Unix,
    /// Decimal unix milliseconds.
    UnixMs,
    /// A UUID version 7 (its first 48 bits are unix milliseconds).
    UuidV7,
    /// A ULID (its first 10 Crockford base-32 characters are unix milliseconds).
    Ulid,
    /// A decimal snowflake id (bits 22 and up are milliseconds since an epoch).
    Snowflake,
}

/// Partition width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// One partition per day.
    #[default]
    Day,
    /// One partition per hour (a DATETIME column); lookups read the key's hour ±
    /// `24 × tolerance_days` hours.
    Hour,
    /// One partition per month; lookups read the key's date ± `tolerance_days`.
    Month,
}

fn default_premake() -> u32 {
    3
}

fn default_tolerance() -> u32 {
    1
}

/// `migrate_max_rows` when the rule does not say.
pub const DEFAULT_MIGRATE_MAX_ROWS: u64 = 1_000_000;

fn default_migrate_max_rows() -> u64 {
    DEFAULT_MIGRATE_MAX_ROWS
}

/// Largest `tolerance_days` accepted: a lookup reads `1 + 2 × tolerance` partitions.
pub const MAX_TOLERANCE_DAYS: u32 = 30;
/// Largest `premake` accepted.
pub const MAX_PREMAKE: u32 = 366;
/// Longest `key_pattern` accepted.
pub const MAX_PATTERN: usize = 200;
/// Most partitions a MariaDB table may have.
pub const MAX_PARTITIONS: u64 = 8192;

impl PartitionSpec {
    /// Checks the values that do not need the database; returns the reason on failure.
    pub fn validate(&self) -> Result<(), String> {
        check_ident(&self.name).map_err(|e| format!("name: {e}"))?;
        TableName::parse(&self.table).map_err(|e| format!("table: {e}"))?;
        check_ident(&self.key).map_err(|e| format!("key: {e}"))?;
        check_ident(&self.column).map_err(|e| format!("column: {e}"))?;
        if self.key.eq_ignore_ascii_case(&self.column) {
            return Err("key and column must be different columns".into());
        }
        if self.retention_days == 0 {
            return Err("retention_days must be at least 1".into());
        }
        if self.premake == 0 || self.premake > MAX_PREMAKE {
            return Err(format!(
                "premake must be between 1 and {MAX_PREMAKE}, not {}",
                self.premake
            ));
        }
        if self.tolerance_days > MAX_TOLERANCE_DAYS {
            return Err(format!(
                "tolerance_days must be at most {MAX_TOLERANCE_DAYS}, not {}",
                self.tolerance_days
            ));
        }
        if self.retention_days <= self.tolerance_days {
            return Err("retention_days must exceed tolerance_days".into());
        }
        let kept = self.period.kept(self.retention_days, self.premake);
        if kept > MAX_PARTITIONS {
            return Err(format!(
                "retention_days and premake keep {kept} {} partitions, more than a table may have ({MAX_PARTITIONS})",
                self.period.word()
            ));
        }
        match (self.key_time, self.snowflake_epoch_ms) {
            (KeyTime::Snowflake, None) => {
                return Err("snowflake_epoch_ms is required when key_time = \"snowflake\"".into())
            }
            (KeyTime::Snowflake, Some(e)) if e > 4_102_444_800_000 => {
                return Err(
                    "snowflake_epoch_ms must be a unix time in milliseconds before 2100".into(),
                )
            }
            (KeyTime::Snowflake, Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err("snowflake_epoch_ms is only for key_time = \"snowflake\"".into())
            }
        }
        if let Some(p) = &self.key_pattern {
            check_pattern(p).map_err(|e| format!("key_pattern: {e}"))?;
        }
        Ok(())
    }
}

/// A key pattern must be short, free of quotes and backslashes (it is written into
/// statements as a string literal, whose escaping depends on the session's
/// `sql_mode`: write `[0-9]` rather than `\d`), and hold a capturing group.
fn check_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_PATTERN {
        return Err(format!("must be 1 to {MAX_PATTERN} characters"));
    }
    if let Some(c) = p
        .chars()
        .find(|c| matches!(c, '\'' | '"' | '\\' | '`') || c.is_control())
    {
        return Err(format!(
            "may not contain {c:?} (write character classes such as [0-9] instead of escapes)"
        ));
    }
    let b = p.as_bytes();
    let groups = b
        .iter()
        .enumerate()
        .filter(|&(i, &c)| c == b'(' && b.get(i + 1) != Some(&b'?'))
        .count();
    if groups == 0 {
        return Err("needs a capturing group: group 1 is the part holding the time".into());
    }
    let depth = b.iter().try_fold(0i32, |d, &c| match c {
        b'(' => Some(d + 1),
        b')' if d == 0 => None,
        b')' => Some(d - 1),
        _ => Some(d),
    });
    if depth != Some(0) {
        return Err("has unbalanced parentheses".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<PartitionSpec, String> {
        let text = format!(
            "[[partition]]\nname = \"m\"\ntable = \"Messages\"\nkey = \"UUID\"\nkey_time = \"unix\"\n\
             column = \"Inserted\"\nretention_days = 30\n{extra}"
        );
        let mut v: Vec<PartitionSpec> =
            crate::kinds::entries(&text, "partition").map_err(|e| e.to_string())?;
        let s = v.remove(0);
        s.validate()?;
        Ok(s)
    }

    #[test]
    fn parses_with_defaults() {
        let s = spec("key_pattern = \"-([0-9]{10})-\"\n").unwrap();
        assert_eq!(s.period, Period::Day);
        assert_eq!(spec("period = \"hour\"\n").unwrap().period, Period::Hour);
        assert_eq!(spec("period = \"month\"\n").unwrap().period, Period::Month);
        assert_eq!((s.premake, s.tolerance_days), (3, 1));
        assert_eq!(s.migrate_max_rows, 1_000_000);
        assert_eq!(spec("migrate_max_rows = 0\n").unwrap().migrate_max_rows, 0);
        assert_eq!(s.key_time, KeyTime::Unix);
    }

    #[test]
    fn impossible_values_are_rejected() {
        for (extra, want) in [
            ("premake = 0\n", "premake"),
            ("tolerance_days = 31\n", "tolerance_days"),
            ("period = \"week\"\n", "week"),
            ("key_pattern = \"-(\\\\d{10})-\"\n", "key_pattern"),
            ("key_pattern = \"-[0-9]{10}-\"\n", "group"),
            ("key_pattern = \"-([0-9]{10}-\"\n", "unbalanced"),
            ("key_pattern = \"'\"\n", "key_pattern"),
            ("snowflake_epoch_ms = 5\n", "only for"),
            ("unknown = 1\n", "unknown"),
            ("retention_days = 1\n", "duplicate"),
        ] {
            let msg = spec(extra).unwrap_err();
            assert!(msg.contains(want), "{extra}: {msg}");
        }
        let msg = spec("").map(|mut s| {
            s.key_time = KeyTime::Snowflake;
            s.validate()
        });
        assert!(msg.unwrap().unwrap_err().contains("required"));
        let mut s = spec("").unwrap();
        s.column = "uuid".into();
        assert!(s.validate().unwrap_err().contains("different"));
        s.column = "Inserted".into();
        s.retention_days = 1;
        assert!(s.validate().unwrap_err().contains("exceed"));
        s.period = Period::Hour;
        s.retention_days = 400;
        assert!(
            s.validate().unwrap_err().contains("8192"),
            "{:?}",
            s.validate()
        );
    }
}
