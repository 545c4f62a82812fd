//! The `[[rollup]]` rule-file section and its validation.
//!
//! ```toml
//! [[rollup]]
//! name = "plays_by_country_day"
//! table = "plays"                         # the log ("db.table" allowed)
//! rollup_table = "plays_by_country_day"   # physical table heatsink maintains
//! time = "created_at"                     # DATETIME column of the log
//! bucket = "day"                          # "hour" or "day"
//! dimensions = ["track_id", "country"]    # grouping columns kept in the rollup
//! measures = ["count(*)"]                 # optional; also "count(col)", "sum(col)"
//! slots = 8                               # optional: rows per group and bucket
//! exact_flags = true                      # optional: ask the server's plan for column flags
//! ```

use serde::Deserialize;

use crate::rules::spec::{check_ident, default_coalesce, Mode, TableName};

/// `[[rollup]]`: aggregate reads over a log answered from a rollup table.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RollupSpec {
    /// Unique rule name (metrics, logs, errors).
    pub name: String,
    /// The log the application appends to and aggregates (`table` or `db.table`).
    pub table: String,
    /// The physical table heatsink keeps current.
    pub rollup_table: String,
    /// The log's time column.
    pub time: String,
    /// Bucket width.
    pub bucket: Bucket,
    /// Grouping columns kept in the rollup (at most [`MAX_DIMENSIONS`]).
    #[serde(default)]
    pub dimensions: Vec<String>,
    /// Aggregates kept per group and bucket; `count(*)` is always kept.
    #[serde(default = "default_measures")]
    pub measures: Vec<String>,
    /// Rows per group and bucket the triggers spread writes over, so that a hot
    /// group (one viral track's current hour) does not serialize writers.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// Concurrent autocommit inserts into the log may be merged into one
    /// multi-row insert (group commit; default on).
    #[serde(default = "default_coalesce")]
    pub coalesce: bool,
    /// Column flags of grouped reads whose plan the shape does not settle (a
    /// grouped column that leads an index while a time range or another indexed
    /// filter competes) are the server's own: `EXPLAIN` of the read is asked with
    /// it (default on). Off: they are predicted from the shape, and may differ.
    #[serde(default = "default_exact_flags")]
    pub exact_flags: bool,
    /// `on` (default) or `shadow`.
    #[serde(default)]
    pub mode: Mode,
}

/// Bucket width of a rollup.
/// (Ordered from finer to coarser.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bucket {
    /// Hours of the time column's value.
    Hour,
    /// Days of the time column's value.
    Day,
}

impl Bucket {
    /// The bucket's unit in SQL `INTERVAL` syntax.
    pub fn unit(self) -> &'static str {
        match self {
            Bucket::Hour => "HOUR",
            Bucket::Day => "DAY",
        }
    }

    /// The bucket's width in seconds (buckets of UTC, for TIMESTAMP logs).
    pub fn seconds(self) -> u32 {
        match self {
            Bucket::Hour => 3600,
            Bucket::Day => 86_400,
        }
    }

    /// `DATE_FORMAT` pattern of a bucket's start.
    pub fn format(self) -> &'static str {
        match self {
            Bucket::Hour => "%Y-%m-%d %H:00:00",
            Bucket::Day => "%Y-%m-%d 00:00:00",
        }
    }
}

/// One aggregate a rollup keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// `count(*)`.
    Rows,
    /// `count(col)`: rows where `col` is not NULL.
    Count(String),
    /// `sum(col)`.
    Sum(String),
}

impl Measure {
    /// Parses `count(*)`, `count(col)` or `sum(col)` (case-insensitive, spaces
    /// allowed around the parts).
    pub fn parse(text: &str) -> Result<Measure, String> {
        let t = text.trim();
        let bad = || format!("measure `{text}` is not count(*), count(<column>) or sum(<column>)");
        let open = t.find('(').ok_or_else(bad)?;
        let inner = t[open + 1..].strip_suffix(')').ok_or_else(bad)?.trim();
        let func = t[..open].trim().to_ascii_lowercase();
        match (func.as_str(), inner) {
            ("count", "*") => Ok(Measure::Rows),
            ("count", col) => check_ident(col).map(|_| Measure::Count(col.to_string())),
            ("sum", col) => check_ident(col).map(|_| Measure::Sum(col.to_string())),
            _ => Err(bad()),
        }
    }

    /// The column the measure reads, if any.
    pub fn column(&self) -> Option<&str> {
        match self {
            Measure::Rows => None,
            Measure::Count(c) | Measure::Sum(c) => Some(c),
        }
    }
}

fn default_measures() -> Vec<String> {
    vec!["count(*)".to_string()]
}

fn default_exact_flags() -> bool {
    true
}

fn default_slots() -> u32 {
    8
}

/// Most dimensions a rollup may keep (they and the bucket form its primary key).
pub const MAX_DIMENSIONS: usize = 8;

/// Largest `slots` accepted.
pub const MAX_SLOTS: u32 = 256;

/// The prefix of the column names the rollup table and the rewritten reads use
/// themselves (`hs_nulls`, `hs_bucket`, `hs_count_<col>`, `hs_t`, …); dimensions,
/// measured columns and the time column may not start with it.
pub const RESERVED_PREFIX: &str = "hs_";

impl RollupSpec {
    /// The measures, parsed; `count(*)` first, always present, each once.
    pub fn parsed_measures(&self) -> Result<Vec<Measure>, String> {
        let mut out = vec![Measure::Rows];
        for m in &self.measures {
            let m = Measure::parse(m)?;
            if !out.contains(&m) {
                out.push(m);
            }
        }
        Ok(out)
    }

    /// Checks the values that do not need the database; returns the reason on failure.
    pub fn validate(&self) -> Result<(), String> {
        check_ident(&self.name).map_err(|e| format!("name: {e}"))?;
        let table = TableName::parse(&self.table).map_err(|e| format!("table: {e}"))?;
        let rollup =
            TableName::parse(&self.rollup_table).map_err(|e| format!("rollup_table: {e}"))?;
        if table.name.eq_ignore_ascii_case(&rollup.name) && table.db == rollup.db {
            return Err("rollup_table must differ from table".into());
        }
        check_ident(&self.time).map_err(|e| format!("time: {e}"))?;
        if self.dimensions.len() > MAX_DIMENSIONS {
            return Err(format!(
                "dimensions: at most {MAX_DIMENSIONS}, not {}",
                self.dimensions.len()
            ));
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err(format!(
                "slots must be between 1 and {MAX_SLOTS}, not {}",
                self.slots
            ));
        }
        let measures = self.parsed_measures()?;
        let mut seen: Vec<String> = Vec::new();
        for d in &self.dimensions {
            check_ident(d).map_err(|e| format!("dimensions: {e}"))?;
            let lc = d.to_ascii_lowercase();
            if seen.contains(&lc) {
                return Err(format!("dimension `{d}` appears twice"));
            }
            if eq(d, &self.time) {
                return Err(format!(
                    "dimension `{d}` is the time column; the bucket already groups by it"
                ));
            }
            seen.push(lc);
        }
        for c in self
            .dimensions
            .iter()
            .map(String::as_str)
            .chain(measures.iter().filter_map(Measure::column))
            .chain(std::iter::once(self.time.as_str()))
        {
            if c.to_ascii_lowercase().starts_with(RESERVED_PREFIX) {
                return Err(format!(
                    "column `{c}` starts with `{RESERVED_PREFIX}`, which names the rollup table uses itself"
                ));
            }
        }
        Ok(())
    }
}

/// ASCII case-insensitive identifier comparison.
fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<Vec<RollupSpec>, toml::de::Error> {
        crate::kinds::entries(
            &format!(
                "[[rollup]]\nname = \"p\"\ntable = \"plays\"\nrollup_table = \"plays_by_day\"\ntime = \"created_at\"\nbucket = \"day\"\ndimensions = [\"track_id\", \"country\"]\n{extra}"
            ),
            "rollup",
        )
    }

    #[test]
    fn parses_with_defaults() {
        let r = spec("").unwrap().remove(0);
        r.validate().unwrap();
        assert_eq!(r.bucket, Bucket::Day);
        assert_eq!(r.parsed_measures().unwrap(), vec![Measure::Rows]);
        assert_eq!(r.slots, 8);
    }

    #[test]
    fn measures_parse() {
        assert_eq!(Measure::parse(" COUNT( * ) "), Ok(Measure::Rows));
        assert_eq!(
            Measure::parse("sum(duration)"),
            Ok(Measure::Sum("duration".into()))
        );
        assert_eq!(
            Measure::parse("Count(user_id)"),
            Ok(Measure::Count("user_id".into()))
        );
        for bad in ["avg(x)", "count", "sum()", "sum(a b)", "count(*"] {
            assert!(Measure::parse(bad).is_err(), "{bad}");
        }
        let r = spec("measures = [\"sum(ms)\", \"count(*)\", \"sum(ms)\"]\n")
            .unwrap()
            .remove(0);
        assert_eq!(
            r.parsed_measures().unwrap(),
            vec![Measure::Rows, Measure::Sum("ms".into())]
        );
    }

    #[test]
    fn impossible_values_are_rejected() {
        for (extra, want) in [("slots = 0\n", "slots"), ("unknown = 1\n", "unknown")] {
            let msg = match spec(extra) {
                Err(e) => e.to_string(),
                Ok(mut v) => v.remove(0).validate().unwrap_err(),
            };
            assert!(msg.contains(want), "{extra}: {msg}");
        }
        let week = crate::kinds::entries::<RollupSpec>(
            "[[rollup]]\nname = \"p\"\ntable = \"t\"\nrollup_table = \"r\"\ntime = \"t\"\nbucket = \"week\"\n",
            "rollup",
        );
        assert!(week.unwrap_err().to_string().contains("week"));
        let mut r = spec("").unwrap().remove(0);
        r.dimensions.push("track_id".into());
        assert!(r.validate().unwrap_err().contains("twice"));
        let mut r = spec("").unwrap().remove(0);
        r.dimensions.push("created_at".into());
        assert!(r.validate().unwrap_err().contains("time column"));
        let mut r = spec("").unwrap().remove(0);
        r.rollup_table = "plays".into();
        assert!(r.validate().is_err());
        let mut r = spec("").unwrap().remove(0);
        r.dimensions.push("hs_bucket".into());
        assert!(r.validate().unwrap_err().contains("uses itself"));
        let mut r = spec("").unwrap().remove(0);
        r.dimensions.push("HS_T".into());
        assert!(r.validate().unwrap_err().contains("uses itself"));
    }
}
